//! The skill tools the server answers itself: `skills_list`, `skills_read`
//! and, when the operator allows it, `skills_run`.
//!
//! Readers are forgiving about how models spell a call (aliases, strings for
//! numbers, a skill-prefixed path) and a failed call never errors: the model
//! gets one sentence that names its next move.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use serde_json::{json, Value};
use skillhost_engine::{ToolCall, ToolDef};

use super::path_guard::{self, PathError};
use super::prompt::{file_index, trim_description};
use super::registry::Snapshot;
use super::skill::{FileKind, Skill};

/// Bytes one `skills_read` call returns at most.
pub const READ_PAGE_BYTES: u64 = 48 * 1024;

pub const SKILLS_LIST: &str = "skills_list";
pub const SKILLS_READ: &str = "skills_read";
pub const SKILLS_RUN: &str = "skills_run";

/// Whether a tool name is one of ours.
pub fn is_skill_tool(name: &str) -> bool {
    matches!(name, SKILLS_LIST | SKILLS_READ | SKILLS_RUN)
}

/// The tool declarations offered to the model. Parameters are flat scalars:
/// several chat formats cannot render anything richer. The `skill`
/// parameter lists the reachable skills as an enum, which also lets a
/// grammar keep a small model from inventing a name.
pub fn declarations(allow_exec: bool, reachable: &BTreeSet<String>) -> Vec<ToolDef> {
    let skill =
        json!({"type": "string", "description": "The skill's name.", "enum": reachable.iter().collect::<Vec<_>>()});
    let mut tools = vec![
        ToolDef {
            name: SKILLS_LIST.into(),
            description: "List every skill you can use, with its description and its files.".into(),
            parameters: json!({"type": "object", "properties": {}, "required": []}),
        },
        ToolDef {
            name: SKILLS_READ.into(),
            description: "Read a file of a skill. path=\"SKILL.md\" (the default) loads the skill's instructions; other paths are relative to the skill's folder. Long files come in pages: pass the offset the previous page gives.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "skill": skill,
                    "path": {"type": "string", "description": "A file inside the skill; SKILL.md when omitted."},
                    "offset": {"type": "integer", "description": "Byte offset to start reading from; 0 when omitted."}
                },
                "required": ["skill"]
            }),
        },
    ];
    if allow_exec {
        tools.push(ToolDef {
            name: SKILLS_RUN.into(),
            description: "Run a script bundled with a skill, sandboxed, and return its output.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "skill": skill,
                    "path": {"type": "string", "description": "The script inside the skill, e.g. scripts/run.py."},
                    "args": {"type": "string", "description": "Arguments for the script, as a JSON array of strings."}
                },
                "required": ["skill", "path"]
            }),
        });
    }
    tools
}

/// What a request's skill tools can see.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub snapshot: Arc<Snapshot>,
    pub reachable: BTreeSet<String>,
    pub allow_exec: bool,
}

/// The answer to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What the model reads as the tool result.
    pub text: String,
    pub ok: bool,
    /// The skill the call was about, when it named one.
    pub skill: Option<String>,
    /// What inside the skill (a path), for progress reports.
    pub detail: Option<String>,
}

impl Outcome {
    fn failed(text: impl Into<String>, skill: Option<&str>, detail: Option<&str>) -> Self {
        Outcome { text: text.into(), ok: false, skill: skill.map(str::to_string), detail: detail.map(str::to_string) }
    }
}

/// The call's arguments as an object, whatever shape they came in.
fn arguments(call: &ToolCall) -> serde_json::Map<String, Value> {
    let mut value: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
    // Some parsers hand over the object as a JSON string.
    if let Value::String(text) = &value {
        value = serde_json::from_str(text).unwrap_or(Value::Null);
    }
    match value {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// The first of `keys` present, as text.
fn text_arg(args: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|key| match args.get(*key) {
        Some(Value::String(s)) => Some(s.trim().to_string()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

/// `offset` as a number, whether sent as one or as text.
fn offset_arg(args: &serde_json::Map<String, Value>) -> Result<u64, String> {
    match args.get("offset") {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| format!("offset must be a whole number of bytes, not {n}")),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(0),
        Some(Value::String(s)) => {
            s.trim().parse().map_err(|_| format!("offset must be a whole number of bytes, not '{s}'"))
        }
        Some(other) => Err(format!("offset must be a whole number of bytes, not {other}")),
    }
}

/// Script arguments: an array, a JSON array inside a string, or one string.
pub fn script_args(args: &serde_json::Map<String, Value>) -> Result<Vec<String>, String> {
    let value = args.get("args").or_else(|| args.get("arguments"));
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            Ok(items.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string)).collect())
        }
        Some(Value::String(text)) if text.trim_start().starts_with('[') => serde_json::from_str::<Vec<String>>(text)
            .map_err(|_| {
                "args looks like a JSON array but is not one of strings; send [\"--flag\", \"value\"]".to_string()
            }),
        Some(Value::String(text)) if text.is_empty() => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![text.clone()]),
        Some(other) => Ok(vec![other.to_string()]),
    }
}

/// Answers one call to a skill tool.
pub fn execute(context: &ToolContext, call: &ToolCall) -> Outcome {
    match call.name.as_str() {
        SKILLS_LIST => list(context),
        SKILLS_READ => read(context, &arguments(call)),
        SKILLS_RUN => match prepare_run(context, call) {
            // Execution happens in the loop, which owns the sandbox.
            Ok(_) => Outcome::failed("skills_run is answered by the request loop.", None, None),
            Err(outcome) => outcome,
        },
        other => Outcome::failed(format!("There is no skill tool called '{other}'."), None, None),
    }
}

fn available(context: &ToolContext) -> String {
    if context.reachable.is_empty() {
        "No skills are available in this conversation.".to_string()
    } else {
        format!("Available skills: {}.", context.reachable.iter().cloned().collect::<Vec<_>>().join(", "))
    }
}

/// The skill a call names, if this request can reach it.
fn named_skill<'a>(context: &'a ToolContext, args: &serde_json::Map<String, Value>) -> Result<&'a Arc<Skill>, Outcome> {
    let Some(name) = text_arg(args, &["skill", "name", "skill_name"]).filter(|s| !s.is_empty()) else {
        return Err(Outcome::failed(
            format!("Say which skill, e.g. skills_read(skill=\"…\"). {}", available(context)),
            None,
            None,
        ));
    };
    match context.snapshot.get(&name) {
        Some(skill) if context.reachable.contains(&name) => Ok(skill),
        // An unreachable skill reads exactly like a missing one: its name is
        // not something this request may learn.
        _ => Err(Outcome::failed(
            format!("No skill called '{name}' is available. {}", available(context)),
            Some(&name),
            None,
        )),
    }
}

fn list(context: &ToolContext) -> Outcome {
    if context.reachable.is_empty() {
        return Outcome::failed(available(context), None, None);
    }
    let mut text = String::new();
    for id in &context.reachable {
        let Some(skill) = context.snapshot.get(id) else { continue };
        text.push_str(&format!("## {id}\n{}\n", trim_description(&skill.manifest.description)));
        if let Some(requires) = &skill.manifest.compatibility {
            text.push_str(&format!("requires: {requires}\n"));
        }
        if skill.files.is_empty() {
            text.push_str("files: only SKILL.md\n");
        } else {
            text.push_str("files:\n");
            text.push_str(&file_index(skill));
        }
        text.push('\n');
    }
    Outcome { text: text.trim_end().to_string(), ok: true, skill: None, detail: None }
}

fn read(context: &ToolContext, args: &serde_json::Map<String, Value>) -> Outcome {
    let skill = match named_skill(context, args) {
        Ok(skill) => skill,
        Err(outcome) => return outcome,
    };
    let id = skill.id();
    let mut path = text_arg(args, &["path", "file", "resource", "script"]).unwrap_or_default();
    if path.is_empty() {
        path = "SKILL.md".into();
    }
    // Models often spell a path relative to the skills folder ("pdf/api.md");
    // that names "api.md" inside skill "pdf" unless such a folder exists.
    if let Some(inner) = path.strip_prefix(&format!("{id}/")) {
        if path_guard::open_file(&skill.root, &path).is_err() {
            path = inner.to_string();
        }
    }
    // A path that differs from one indexed file only in letter case
    // ("skill.md") means that file; an ambiguous one is left to fail.
    if !skill.files.iter().any(|f| f.path == path) && !path.eq_ignore_ascii_case("SKILL.md") {
        let mut same = skill.files.iter().filter(|f| f.path.eq_ignore_ascii_case(&path));
        if let (Some(only), None) = (same.next(), same.next()) {
            path = only.path.clone();
        }
    } else if path.eq_ignore_ascii_case("SKILL.md") {
        path = "SKILL.md".into();
    }
    let offset = match offset_arg(args) {
        Ok(offset) => offset,
        Err(why) => return Outcome::failed(format!("{why}."), Some(id), Some(&path)),
    };
    let opened = match path_guard::open_file(&skill.root, &path) {
        Ok(opened) => opened,
        Err(err @ PathError::NotFound { .. }) => {
            return Outcome::failed(
                format!("{} '{id}'. Call skills_list to see its files.", capitalized(&err.to_string())),
                Some(id),
                Some(&path),
            )
        }
        Err(err) => return Outcome::failed(format!("{}.", capitalized(&err.to_string())), Some(id), Some(&path)),
    };
    let relative = opened.relative.clone();
    let is_text = relative == "SKILL.md" || skill.files.iter().any(|f| f.path == relative && f.text);
    if !is_text {
        let kind = skill.files.iter().find(|f| f.path == relative).map_or(FileKind::Other, |f| f.kind);
        let hint = if kind == FileKind::Script && context.allow_exec { " Run it with skills_run instead." } else { "" };
        return Outcome::failed(
            format!(
                "'{relative}' in skill '{id}' is a binary file ({} bytes); skills_read only returns text.{hint}",
                opened.len
            ),
            Some(id),
            Some(&relative),
        );
    }
    let total = opened.len;
    if offset > total || (offset == total && total > 0) {
        return Outcome::failed(
            format!("Offset {offset} is past the end of '{relative}' in skill '{id}', which has {total} bytes."),
            Some(id),
            Some(&relative),
        );
    }
    let mut file = opened.file;
    let mut bytes = Vec::new();
    let read = file.seek(SeekFrom::Start(offset)).and_then(|_| file.take(READ_PAGE_BYTES).read_to_end(&mut bytes));
    if let Err(err) = read {
        return Outcome::failed(
            format!("'{relative}' in skill '{id}' cannot be read: {err}."),
            Some(id),
            Some(&relative),
        );
    }
    // A page ends on a character boundary; the next one starts there.
    let mut end = bytes.len();
    if offset + (end as u64) < total {
        while end > 0 && std::str::from_utf8(&bytes[..end]).is_err() {
            end -= 1;
        }
        if end == 0 {
            end = bytes.len();
        }
    }
    let page = String::from_utf8_lossy(&bytes[..end]);
    let next = offset + end as u64;
    let mut text = format!(
        "[skills_read: skill \"{id}\", file \"{relative}\", bytes {offset}-{} of {total}]\n",
        next.saturating_sub(1)
    );
    text.push_str(&page);
    // Footers start on their own line; the page itself is left as it is.
    let new_line = if text.ends_with('\n') { "" } else { "\n" };
    if next < total {
        text.push_str(&format!(
            "{new_line}[Truncated. Continue with skills_read(skill=\"{id}\", path=\"{relative}\", offset={next}).]"
        ));
    } else if relative == "SKILL.md" && !skill.files.is_empty() {
        text.push_str(&format!(
            "{new_line}[Files in skill \"{id}\"; read them with skills_read(skill=\"{id}\", path=\"…\"):\n"
        ));
        text.push_str(&file_index(skill));
        text.push(']');
        if context.allow_exec {
            if let Some(guidance) = execution_guidance(skill) {
                text.push_str(&guidance);
            }
        }
    }
    // Not trimmed: the page is the file's bytes, trailing whitespace included.
    Outcome { text, ok: true, skill: Some(id.to_string()), detail: Some(relative) }
}

/// A `skills_run` call that passed every check, ready to execute.
#[derive(Debug, Clone)]
pub struct ScriptCall {
    pub skill: Arc<Skill>,
    /// The script, relative to the skill folder.
    pub path: String,
    pub args: Vec<String>,
}

/// Checks a `skills_run` call: the skill is reachable, the script is a
/// regular file inside it, and the arguments are readable.
pub fn prepare_run(context: &ToolContext, call: &ToolCall) -> Result<ScriptCall, Outcome> {
    let args = arguments(call);
    if !context.allow_exec {
        return Err(Outcome::failed(
            "skills_run is not enabled on this server; read the script with skills_read instead.",
            None,
            None,
        ));
    }
    let skill = named_skill(context, &args)?;
    let mut path = text_arg(&args, &["path", "script", "file"]).unwrap_or_default();
    if path.is_empty() {
        return Err(Outcome::failed(
            format!("Say which script to run, e.g. skills_run(skill=\"{}\", path=\"scripts/…\").", skill.id()),
            Some(skill.id()),
            None,
        ));
    }
    if let Some(inner) = path.strip_prefix(&format!("{}/", skill.id())) {
        if path_guard::open_file(&skill.root, &path).is_err() {
            path = inner.to_string();
        }
    }
    if let Err(err) = path_guard::open_file(&skill.root, &path) {
        return Err(Outcome::failed(format!("{}.", capitalized(&err.to_string())), Some(skill.id()), Some(&path)));
    }
    let script_args =
        script_args(&args).map_err(|why| Outcome::failed(format!("{why}."), Some(skill.id()), Some(&path)))?;
    Ok(ScriptCall { skill: Arc::clone(skill), path, args: script_args })
}

/// The block appended to a complete SKILL.md read when `skills_run` is
/// offered and the skill ships a script: portable skills often show another
/// agent's install path, which a sandbox cannot find.
fn execution_guidance(skill: &Skill) -> Option<String> {
    let script = skill
        .files
        .iter()
        .find(|f| f.kind == FileKind::Script && f.text && crate::tools::shell::interpreter(&f.path).is_some())?;
    Some(format!(
        "\n[skillhost execution guidance; not part of SKILL.md]\nRun this skill's scripts with skills_run, which finds the skill's folder itself; ignore install paths written for other agents. For example: skills_run(skill=\"{}\", path=\"{}\", args=[\"…\"])",
        skill.id(),
        script.path
    ))
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skills::registry::scan;
    use crate::skills::{Origin, Root};

    fn context(dir: &std::path::Path) -> ToolContext {
        let skill = dir.join("pdf");
        std::fs::create_dir_all(skill.join("references")).unwrap();
        std::fs::write(skill.join("SKILL.md"), "---\nname: pdf\ndescription: PDFs.\n---\nBody\n").unwrap();
        std::fs::write(skill.join("references/api.md"), "API").unwrap();
        std::fs::write(skill.join("logo.png"), [0u8, 1, 2]).unwrap();
        let other = dir.join("secret-skill");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("SKILL.md"), "---\nname: secret-skill\ndescription: Hidden.\n---\n").unwrap();
        let snapshot = Arc::new(scan(&[Root { path: dir.to_path_buf(), origin: Origin::Discovered }]));
        ToolContext { snapshot, reachable: ["pdf".to_string()].into(), allow_exec: false }
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { id: "c".into(), name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn forgiving_readers_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let cases: Vec<(&str, &str, bool, &str)> = vec![
            (SKILLS_READ, r#"{"skill": "pdf"}"#, true, "[skills_read: skill \"pdf\", file \"SKILL.md\", bytes 0-"),
            (SKILLS_READ, r#"{"skill": "pdf", "path": ""}"#, true, "file \"SKILL.md\""),
            (
                SKILLS_READ,
                r#"{"skill": "pdf", "file": "references/api.md"}"#,
                true,
                "file \"references/api.md\", bytes 0-2 of 3]\nAPI",
            ),
            (SKILLS_READ, r#"{"skill": "pdf", "resource": "pdf/references/api.md"}"#, true, "API"),
            (SKILLS_READ, r#"{"skill": "pdf", "path": "skill.md"}"#, true, "file \"SKILL.md\""),
            (SKILLS_READ, r#"{"skill": "pdf", "path": "References/API.md"}"#, true, "file \"references/api.md\""),
            (SKILLS_READ, r#""{\"skill\": \"pdf\", \"path\": \"references/api.md\"}""#, true, "API"),
            (
                SKILLS_READ,
                r#"{"skill": "pdf", "path": "references/api.md", "offset": "1"}"#,
                true,
                "bytes 1-2 of 3]\nPI",
            ),
            (
                SKILLS_READ,
                r#"{"skill": "pdf", "path": "references/api.md", "offset": 3}"#,
                false,
                "Offset 3 is past the end",
            ),
            (
                SKILLS_READ,
                r#"{"skill": "pdf", "path": "references/api.md", "offset": "x"}"#,
                false,
                "offset must be a whole number",
            ),
            (SKILLS_READ, r#"{"skill": "pdfs"}"#, false, "No skill called 'pdfs' is available. Available skills: pdf."),
            (
                SKILLS_READ,
                r#"{"skill": "secret-skill"}"#,
                false,
                "No skill called 'secret-skill' is available. Available skills: pdf.",
            ),
            (SKILLS_READ, r#"{}"#, false, "Say which skill"),
            (
                SKILLS_READ,
                r#"{"skill": "pdf", "path": "../secret-skill/SKILL.md"}"#,
                false,
                "is not allowed: it climbs out of the skill folder",
            ),
            (
                SKILLS_READ,
                r#"{"skill": "pdf", "path": "nope.md"}"#,
                false,
                "'nope.md' does not exist in this skill 'pdf'. Call skills_list",
            ),
            (SKILLS_READ, r#"{"skill": "pdf", "path": "logo.png"}"#, false, "is a binary file (3 bytes)"),
            (SKILLS_LIST, "{}", true, "## pdf\nPDFs.\nfiles:\n- logo.png (3 bytes)\n- references/api.md (3 bytes)"),
            (SKILLS_RUN, r#"{"skill": "pdf", "path": "x.py"}"#, false, "skills_run is not enabled on this server"),
        ];
        for (tool, arguments, ok, expected) in cases {
            let outcome = execute(&ctx, &call(tool, arguments));
            assert_eq!(outcome.ok, ok, "{tool} {arguments}: {}", outcome.text);
            assert!(
                outcome.text.contains(expected),
                "{tool} {arguments}: {:?} does not contain {expected:?}",
                outcome.text
            );
        }
        // A complete SKILL.md read ends with the skill's file index.
        assert!(execute(&ctx, &call(SKILLS_READ, r#"{"skill": "pdf"}"#))
            .text
            .contains("- references/api.md (3 bytes)"));
    }

    #[test]
    fn script_arguments_in_every_shape() {
        let parse = |v: serde_json::Value| script_args(v.as_object().unwrap());
        assert_eq!(parse(json!({"args": ["a", "b c", ""]})), Ok(vec!["a".into(), "b c".into(), "".into()]));
        assert_eq!(parse(json!({"args": "[\"--x\", \"1\"]"})), Ok(vec!["--x".into(), "1".into()]));
        assert_eq!(parse(json!({"arguments": "one; rm -rf /"})), Ok(vec!["one; rm -rf /".into()]));
        assert_eq!(parse(json!({"args": [1, true]})), Ok(vec!["1".into(), "true".into()]));
        assert_eq!(parse(json!({})), Ok(vec![]));
        assert!(parse(json!({"args": "[1, 2"})).unwrap_err().contains("not one of strings"));
    }

    #[test]
    fn pages_end_on_character_boundaries_and_say_how_to_continue() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        // 'é' is two bytes: a page boundary would split one.
        let text = "é".repeat(READ_PAGE_BYTES as usize);
        std::fs::write(dir.path().join("pdf/references/long.md"), &text).unwrap();
        let ctx = ToolContext {
            snapshot: Arc::new(scan(&[Root { path: dir.path().to_path_buf(), origin: Origin::Discovered }])),
            ..ctx
        };
        let first = execute(&ctx, &call(SKILLS_READ, r#"{"skill": "pdf", "path": "references/long.md"}"#));
        assert!(
            first.text.ends_with(
                "[Truncated. Continue with skills_read(skill=\"pdf\", path=\"references/long.md\", offset=49152).]"
            ),
            "{}",
            &first.text[first.text.len() - 120..]
        );
        let mut offset = 0u64;
        let mut total = String::new();
        loop {
            let page = execute(
                &ctx,
                &call(SKILLS_READ, &format!(r#"{{"skill": "pdf", "path": "references/long.md", "offset": {offset}}}"#)),
            );
            assert!(page.ok, "{}", page.text);
            let body = page.text.split_once('\n').unwrap().1;
            match body.rsplit_once(
                "\n[Truncated. Continue with skills_read(skill=\"pdf\", path=\"references/long.md\", offset=",
            ) {
                Some((content, next)) => {
                    total.push_str(content);
                    offset = next.trim_end_matches(").]").parse().unwrap();
                }
                None => {
                    total.push_str(body);
                    break;
                }
            }
        }
        assert_eq!(total, text);
    }
}
