//! The skills block at the front of the prompt: what the model is told about
//! the skills a request can reach.
//!
//! [`plan`] is a pure function of the sorted selection, the registry and the
//! options, so the same conversation renders to the same leading bytes on
//! every round and every turn, and the KV prefix survives. Nothing
//! environment-derived goes in: no timestamps, no absolute paths, no count of
//! registered skills. [`apply`] merges the block into the leading
//! system message (or adds one), never a second system message: several chat
//! formats drop or reject one.

use std::collections::BTreeSet;

use skillhost_engine::{ChatMessage, Role};

use super::registry::Snapshot;
use super::skill::Skill;

/// Sizes are estimated at four bytes per token; the estimate only decides
/// what to include, it is never shown as a count.
pub const BYTES_PER_TOKEN: usize = 4;
/// The metadata block may use this share of the context, in percent …
pub const METADATA_BLOCK_PERCENT: usize = 2;
/// … but at least this many tokens …
pub const METADATA_BLOCK_MIN_TOKENS: usize = 1024;
/// … and at most this many.
pub const METADATA_BLOCK_MAX_TOKENS: usize = 10_000;
/// Its size when the context length is unknown.
pub const METADATA_BLOCK_UNKNOWN_TOKENS: usize = 2000;
/// With inlined bodies the block may use a quarter of the context, clamped.
pub const INLINE_BLOCK_MIN_TOKENS: usize = 1024;
pub const INLINE_BLOCK_MAX_TOKENS: usize = 48_000;
pub const INLINE_BLOCK_UNKNOWN_TOKENS: usize = 16_000;
/// One inlined body is at most three quarters of the block, and never less than this.
pub const INLINE_BODY_MIN_TOKENS: usize = 512;
/// Descriptions are cut at a word boundary past this many characters (the
/// specification's own ceiling, so a conformant skill is never cut).
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Most skills advertised in the discovery catalog.
pub const MAX_CATALOG_ENTRIES: usize = 96;
/// Most file paths listed for one skill.
pub const MAX_FILE_INDEX: usize = 40;

/// How the block is built for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PromptOptions {
    /// Advertise unselected skills.
    pub discovery: bool,
    /// Put selected bodies in the prompt instead of deferring them.
    pub inline_selected_bodies: bool,
    /// `skills_run` is offered.
    pub allow_exec: bool,
    /// The model's context length, when known.
    pub context_tokens: Option<u32>,
    /// The model can be offered tools and its calls can be read.
    pub tools: bool,
}

/// The planned block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Block {
    pub text: String,
    /// Skills whose bodies are in the text.
    pub inlined: Vec<String>,
    /// Skills whose inlined body was cut.
    pub truncated: Vec<String>,
    /// Skills the request can reach through the tools.
    pub reachable: BTreeSet<String>,
    /// Skills the text names: the selected ones and those the catalog lists.
    pub advertised: Vec<String>,
}

fn clamp_tokens(
    context: Option<u32>,
    divide: impl Fn(usize) -> usize,
    min: usize,
    max: usize,
    unknown: usize,
) -> usize {
    match context {
        Some(n) => divide(n as usize).clamp(min, max),
        None => unknown,
    }
}

/// Bytes the metadata block may use.
pub fn metadata_budget(context: Option<u32>) -> usize {
    BYTES_PER_TOKEN
        * clamp_tokens(
            context,
            |n| n * METADATA_BLOCK_PERCENT / 100,
            METADATA_BLOCK_MIN_TOKENS,
            METADATA_BLOCK_MAX_TOKENS,
            METADATA_BLOCK_UNKNOWN_TOKENS,
        )
}

/// Bytes the whole block may use when bodies are inlined.
pub fn inline_budget(context: Option<u32>) -> usize {
    BYTES_PER_TOKEN
        * clamp_tokens(
            context,
            |n| n / 4,
            INLINE_BLOCK_MIN_TOKENS,
            INLINE_BLOCK_MAX_TOKENS,
            INLINE_BLOCK_UNKNOWN_TOKENS,
        )
}

/// Bytes one inlined body may use.
pub fn inline_body_cap(context: Option<u32>) -> usize {
    (inline_budget(context) * 3 / 4).max(INLINE_BODY_MIN_TOKENS * BYTES_PER_TOKEN)
}

/// A description on one line, cut at a word boundary past the limit.
pub fn trim_description(text: &str) -> String {
    if text.chars().count() <= MAX_DESCRIPTION_CHARS {
        return text.to_string();
    }
    let cut: String = text.chars().take(MAX_DESCRIPTION_CHARS).collect();
    let at_word = cut.rfind(char::is_whitespace).map_or(cut.as_str(), |i| &cut[..i]);
    format!("{}...", at_word.trim_end())
}

/// Which skills a request can reach: its selection, plus, when discovery is
/// on, every registered skill the model may invoke on its own (one marked
/// `disable-model-invocation` is reachable only when selected).
pub fn reachable(selection: &[String], snapshot: &Snapshot, discovery: bool) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = selection.iter().filter(|id| snapshot.get(id).is_some()).cloned().collect();
    if discovery {
        out.extend(snapshot.skills.values().filter(|s| model_invocable(s)).map(|s| s.id().to_string()));
    }
    out
}

/// Whether the model may come upon a skill by itself, unselected.
pub fn model_invocable(skill: &Skill) -> bool {
    !skill.manifest.disable_model_invocation
}

const PREAMBLE: &str = "Before choosing a tool, settle what the user is asking for. Use a skill the user names, or one whose description matches the request. If information or a choice you need is missing, ask one focused question and wait for the answer before doing anything that depends on it. When the user answers or confirms, resume the task that was waiting.";

const WHAT_A_SKILL_IS: &str = "A skill is a folder of instructions, often with scripts and reference files, for one kind of task. When a skill covers the task at hand, its instructions take precedence over your usual approach; a skill being listed does not make it relevant to every request.";

fn how_to_use(allow_exec: bool) -> String {
    let mut rules = vec![
        "Use a skill the user asks for by name (also written $name) or one whose description matches the task. Do not call the skill tools just to start a turn.",
        "Read a skill's whole SKILL.md before acting on it.",
        "Paths in a skill are relative to that skill's folder, never host paths; install paths written for other agents are only examples.",
    ];
    if allow_exec {
        rules.push("Run a bundled script with skills_run instead of copying it, and prefer a shipped script to retyping its logic.");
    }
    rules.push("Do not load a reference file the task does not call for.");
    rules.push("When a file comes back truncated, continue from the offset the result gives.");
    let mut text = String::from("### How to use a skill\n");
    for rule in rules {
        text.push_str("- ");
        text.push_str(rule);
        text.push('\n');
    }
    text
}

fn read_call(skill: &str) -> String {
    format!("skills_read(skill=\"{skill}\", path=\"SKILL.md\")")
}

/// The index of a skill's files, at most [`MAX_FILE_INDEX`] paths.
pub fn file_index(skill: &Skill) -> String {
    let mut text = String::new();
    for file in skill.files.iter().take(MAX_FILE_INDEX) {
        text.push_str(&format!("- {} ({} bytes)\n", file.path, file.bytes));
    }
    if skill.files.len() > MAX_FILE_INDEX {
        text.push_str(&format!("({} more; call skills_list)\n", skill.files.len() - MAX_FILE_INDEX));
    }
    text
}

/// Plans the block for a request. `selection` may come in any order and
/// with repeats; unknown ids are ignored (the HTTP layer refuses them).
pub fn plan(selection: &[String], snapshot: &Snapshot, options: &PromptOptions) -> Block {
    // Ordinal order, whatever order the request listed them in.
    let selected: BTreeSet<&str> =
        selection.iter().map(String::as_str).filter(|id| snapshot.get(id).is_some()).collect();
    let discovery = options.discovery && options.tools;
    let mut block = Block { reachable: reachable(selection, snapshot, discovery), ..Block::default() };
    if !options.tools {
        block.reachable.clear();
    }
    let inline = options.inline_selected_bodies || !options.tools;
    let others: Vec<&Skill> = snapshot
        .skills
        .values()
        .map(|s| s.as_ref())
        .filter(|s| discovery && model_invocable(s) && !selected.contains(s.id()))
        .collect();
    if selected.is_empty() && others.is_empty() {
        return block;
    }

    let mut text = String::new();
    if options.tools {
        text.push_str(PREAMBLE);
        text.push_str("\n\n");
    }
    text.push_str("## Agent skills\n");
    text.push_str(WHAT_A_SKILL_IS);
    text.push_str("\n\n");

    block.advertised.extend(selected.iter().map(|id| id.to_string()));
    if !selected.is_empty() {
        text.push_str("### Skills selected for this conversation\n");
        if inline {
            inline_bodies(&mut text, &mut block, &selected, snapshot, options);
        } else {
            for id in &selected {
                let Some(skill) = snapshot.get(id) else { continue };
                let tokens = skill.manifest.body.len().div_ceil(BYTES_PER_TOKEN);
                text.push_str(&format!(
                    "- {}: {} (about {} tokens of instructions; load them with {})\n",
                    id,
                    trim_description(&skill.manifest.description),
                    tokens,
                    read_call(id)
                ));
            }
        }
        end_section(&mut text);
    }

    if !others.is_empty() {
        let budget = metadata_budget(options.context_tokens);
        let footer = how_to_use(options.allow_exec);
        let mut catalog = String::from(
            "### Other available skills\nIf one of these fits the task better, load it with skills_read.\n",
        );
        let summary = |n: usize| {
            format!("({n} further skills are installed but not listed here; call skills_list to see them.)\n")
        };
        // Room for the summary line and the blank lines between sections.
        let reserve = summary(others.len()).len() + 2;
        let mut listed = 0;
        for skill in &others {
            let line = format!("- {}: {}\n", skill.id(), trim_description(&skill.manifest.description));
            let fits = text.len() + catalog.len() + line.len() + footer.len() + reserve <= budget;
            if listed >= MAX_CATALOG_ENTRIES || !fits {
                break;
            }
            catalog.push_str(&line);
            block.advertised.push(skill.id().to_string());
            listed += 1;
        }
        if listed < others.len() {
            catalog.push_str(&summary(others.len() - listed));
        }
        text.push_str(&catalog);
        end_section(&mut text);
    }

    if options.tools {
        text.push_str(&how_to_use(options.allow_exec));
    }
    block.text = text.trim_end().to_string();
    block
}

/// Ends a section with exactly one blank line.
fn end_section(text: &mut String) {
    text.truncate(text.trim_end().len());
    text.push_str("\n\n");
}

/// Writes the selected bodies, within the inline budget.
fn inline_bodies(
    text: &mut String,
    block: &mut Block,
    selected: &BTreeSet<&str>,
    snapshot: &Snapshot,
    options: &PromptOptions,
) {
    let mut remaining = inline_budget(options.context_tokens);
    let cap = inline_body_cap(options.context_tokens);
    for id in selected {
        let Some(skill) = snapshot.get(id) else { continue };
        let body = skill.manifest.body.trim_end();
        text.push_str(&format!("#### {id}\n{}\n\n", trim_description(&skill.manifest.description)));
        let allowed = cap.min(remaining);
        if body.len() <= allowed {
            text.push_str(body);
            text.push('\n');
            remaining -= body.len();
        } else {
            let mut cut = allowed;
            while cut > 0 && !body.is_char_boundary(cut) {
                cut -= 1;
            }
            text.push_str(&body[..cut]);
            let follow_up = if options.tools {
                format!(" Continue with skills_read(skill=\"{id}\", path=\"SKILL.md\", offset={cut}).")
            } else {
                String::new()
            };
            text.push_str(&format!(
                "\n[The instructions of '{id}' are cut here: they are {} bytes and only the first {cut} fit in the prompt.{follow_up}]\n",
                body.len()
            ));
            remaining -= cut;
            block.truncated.push(id.to_string());
        }
        if options.tools && !skill.files.is_empty() {
            text.push_str(&format!("Files in '{id}' (read them with skills_read):\n"));
            text.push_str(&file_index(skill));
        }
        text.push('\n');
        block.inlined.push(id.to_string());
    }
}

/// Puts the block at the front of the leading system or developer message,
/// or adds a leading system message when there is none.
pub fn apply(messages: &[ChatMessage], block: &Block) -> Vec<ChatMessage> {
    let mut out = messages.to_vec();
    if block.text.is_empty() {
        return out;
    }
    match out.first_mut() {
        Some(first) if matches!(first.role, Role::System | Role::Developer) => {
            first.content = if first.content.is_empty() {
                block.text.clone()
            } else {
                format!("{}\n\n{}", block.text, first.content)
            };
        }
        _ => out.insert(0, ChatMessage::new(Role::System, block.text.clone())),
    }
    out
}

/// Like [`apply`], but puts the block after the leading system message's
/// own text (for fixed tool guidance that follows the skills block).
pub fn apply_after(messages: &[ChatMessage], block: &Block) -> Vec<ChatMessage> {
    let mut out = messages.to_vec();
    match out.first_mut() {
        Some(first) if matches!(first.role, Role::System | Role::Developer) => {
            first.content = if first.content.is_empty() {
                block.text.clone()
            } else {
                format!("{}\n\n{}", first.content, block.text)
            };
        }
        _ => out.insert(0, ChatMessage::new(Role::System, block.text.clone())),
    }
    out
}
