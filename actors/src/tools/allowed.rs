//! A loaded skill's `allowed-tools`: once the model has read a skill that
//! declares the list, the tools outside it are refused for the rest of the
//! turn, with a sentence naming what is allowed.
//!
//! Skills are written for Claude Code, whose tool names differ from ours,
//! so the entries are read as Claude Code spells them (`Read`, `Bash(git:*)`)
//! as well as by our own names and the caller's. A pattern in parentheses
//! narrows the shell as it does there: under `Bash(git:*)` every command of a
//! line must start with `git` (`cd` aside), `Bash(git diff:*)` with `git
//! diff`, and `Bash(make test)` must be exactly that; a line whose commands
//! cannot be read word by word (`$(…)`, backticks, a subshell, an expansion)
//! is refused. The skill tools that read (`skills_list`, `skills_read`) stay
//! allowed: following a skill means reading its files.
//!
//! An MCP server's tools are named as the model sees them
//! (`mcp__SERVER__TOOL`), and `mcp__SERVER` or `mcp__SERVER__*` allows all
//! of one server's tools, as in Claude Code.
//!
//! With several restricting skills loaded, only what every one of them
//! allows stays allowed: loading a skill never widens the list. A child
//! agent starts with its parent's restrictions (`ChildSeat::allowed`).

use std::collections::BTreeSet;

/// Always allowed, whatever a loaded skill lists.
const ALWAYS: [&str; 2] = ["skills_list", "skills_read"];

/// The tools one `allowed-tools` entry names.
fn names(entry: &str) -> Vec<String> {
    let base = entry.split('(').next().unwrap_or_default().trim();
    let ours: &[&str] = match base.to_ascii_lowercase().as_str() {
        // Running a skill's scripts is running commands.
        "bash" | "shell" => &["shell", "skills_run"],
        "read" | "read_file" | "glob" | "grep" | "ls" => &["read_file"],
        "write" | "write_file" => &["write_file"],
        "edit" | "multiedit" | "apply_patch" | "edit_file" | "str_replace" => &["apply_patch", "edit_file"],
        "task" | "agent" => &["spawn_agent", "send_input", "wait_agent", "close_agent", "list_agents"],
        _ => &[],
    };
    if ours.is_empty() {
        vec![base.to_string()]
    } else {
        ours.iter().map(|name| name.to_string()).collect()
    }
}

/// Whether one skill's named tools allow `tool`: by its name, or for an
/// MCP tool by a whole-server entry.
fn names_allow(named: &BTreeSet<String>, tool: &str) -> bool {
    named.contains(tool)
        || named.iter().any(|entry| {
            let server = entry.strip_suffix("__*").unwrap_or(entry);
            // `mcp__SERVER` alone; `mcp__SERVER__TOOL` is a tool, matched above.
            server.strip_prefix("mcp__").is_some_and(|name| !name.is_empty() && !name.contains("__"))
                && tool.strip_prefix(server).is_some_and(|rest| rest.len() > 2 && rest.starts_with("__"))
        })
}

/// One shell pattern: the words a command starts with (`git:*`), or all of
/// its words (`make test`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    words: Vec<String>,
    prefix: bool,
}

impl Pattern {
    fn parse(text: &str) -> Pattern {
        let text = text.trim();
        let (body, prefix) = match text.strip_suffix(":*").or_else(|| text.strip_suffix(" *")) {
            Some(body) => (body, true),
            None if text == "*" => ("", true),
            None => (text, false),
        };
        Pattern { words: body.split_whitespace().map(str::to_string).collect(), prefix }
    }

    fn matches(&self, command: &[String]) -> bool {
        match self.prefix {
            true => command.len() >= self.words.len() && command[..self.words.len()] == self.words[..],
            false => command == self.words.as_slice(),
        }
    }
}

/// What one skill's list allows of the shell: `None` when it does not
/// allow the shell, `Some([])` for the whole shell, else its patterns.
fn shell_of(entries: &[String]) -> Option<Vec<Pattern>> {
    let mut patterns = Vec::new();
    let mut any = false;
    for entry in entries {
        let (base, rest) = entry.split_once('(').unwrap_or((entry.as_str(), ""));
        if !matches!(base.trim().to_ascii_lowercase().as_str(), "bash" | "shell") {
            continue;
        }
        any = true;
        match rest.strip_suffix(')') {
            Some(pattern) if !pattern.trim().is_empty() && pattern.trim() != "*" => {
                patterns.push(Pattern::parse(pattern))
            }
            // A plain `Bash` opens the whole shell.
            _ => return Some(Vec::new()),
        }
    }
    any.then_some(patterns)
}

/// What the skills loaded so far in a turn allow.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allowed {
    /// The loaded skills that restrict, in the order they were loaded, with
    /// their lists as written.
    skills: Vec<(String, Vec<String>)>,
    /// Each of those skills' tool names, in the same order.
    named: Vec<BTreeSet<String>>,
    /// The tool names every one of those lists allows.
    permitted: BTreeSet<String>,
    /// For each loaded skill that narrows the shell by pattern, its
    /// patterns: a command must match one pattern of each.
    shell: Vec<Vec<Pattern>>,
}

impl Allowed {
    /// Takes in a skill the model loaded; one without `allowed-tools`
    /// changes nothing, and one that does narrows what is allowed.
    pub fn load(&mut self, skill: &str, entries: &[String]) {
        if entries.is_empty() || self.skills.iter().any(|(id, _)| id == skill) {
            return;
        }
        let named: BTreeSet<String> = entries.iter().flat_map(|entry| names(entry)).collect();
        self.permitted = match self.skills.is_empty() {
            true => named.clone(),
            false => self.permitted.intersection(&named).cloned().collect(),
        };
        self.named.push(named);
        if let Some(patterns) = shell_of(entries).filter(|p| !p.is_empty()) {
            self.shell.push(patterns);
        }
        self.skills.push((skill.to_string(), entries.to_vec()));
    }

    /// Takes in a loaded skill by id, with the list its SKILL.md declares.
    pub fn load_from(&mut self, snapshot: Option<&crate::skills::Snapshot>, skill: &str) {
        if let Some(found) = snapshot.and_then(|s| s.get(skill)) {
            self.load(skill, &found.manifest.allowed_tools);
        }
    }

    /// The loaded skills whose lists name `tool` (or its MCP server): the
    /// skills a call to it is counted for.
    pub fn naming<'a>(&'a self, tool: &'a str) -> impl Iterator<Item = &'a String> {
        self.skills.iter().zip(&self.named).filter(move |(_, named)| names_allow(named, tool)).map(|((id, _), _)| id)
    }

    /// Whether any loaded skill restricts the tools.
    pub fn restricts(&self) -> bool {
        !self.skills.is_empty()
    }

    fn lists(&self) -> String {
        let from: Vec<String> =
            self.skills.iter().map(|(id, entries)| format!("'{id}' ({})", entries.join(" "))).collect();
        from.join(", ")
    }

    /// The sentence refusing a call to `tool` with `arguments` (its JSON
    /// text), when it is outside what the loaded skills allow.
    pub fn refusal(&self, tool: &str, arguments: &str) -> Option<String> {
        if !self.restricts() || ALWAYS.contains(&tool) {
            return None;
        }
        if !self.named.iter().all(|named| names_allow(named, tool)) {
            let mut open: Vec<&str> = ALWAYS.to_vec();
            open.extend(self.permitted.iter().map(String::as_str));
            return Some(format!(
                "{tool} is not allowed for the rest of this turn: the skills loaded in it limit the tools (allowed-tools of {}), and only what every one of them allows stays open. The tools you may use now are: {}. Use one of them, or answer with what you have.",
                self.lists(),
                open.join(", ")
            ));
        }
        if tool != "shell" || self.shell.is_empty() {
            return None;
        }
        let line = serde_json::from_str::<serde_json::Value>(arguments)
            .ok()
            .and_then(|args| args.get("command").and_then(|c| c.as_str()).map(str::to_string))
            .unwrap_or_default();
        let fits = |command: &Vec<String>| {
            command.first().is_some_and(|w| w == "cd")
                || self.shell.iter().all(|list| list.iter().any(|p| p.matches(command)))
        };
        match crate::tools::install::simple_commands(&line) {
            Some(commands) if !commands.is_empty() && commands.iter().all(fits) => None,
            _ => {
                let shown: Vec<String> = self
                    .shell
                    .iter()
                    .flatten()
                    .map(|p| if p.prefix { format!("{} …", p.words.join(" ")) } else { p.words.join(" ") })
                    .collect();
                Some(format!(
                    "This command was not run: the skills loaded in this turn allow only some shell commands (allowed-tools of {}), and every command on the line must be one of them: {}. Plain words only, no $(…), backticks or subshells. Run one of those, or answer with what you have.",
                    self.lists(),
                    shown.join("; ")
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn nothing_is_refused_until_a_restricting_skill_is_loaded() {
        let mut allowed = Allowed::default();
        assert_eq!(allowed.refusal("shell", "{}"), None);
        allowed.load("notes", &[]);
        assert!(!allowed.restricts());
        assert_eq!(allowed.refusal("write_file", "{}"), None);
    }

    #[test]
    fn claude_code_names_map_to_ours_and_a_pattern_binds_the_shell() {
        let mut allowed = Allowed::default();
        allowed.load("pdf", &list(&["Read", "Bash(pdftotext:*)", "get_weather"]));
        let pdf = r#"{"command": "pdftotext in.pdf - | head"}"#;
        for open in ["read_file", "skills_run", "skills_read", "skills_list", "get_weather"] {
            assert_eq!(allowed.refusal(open, "{}"), None, "{open}");
        }
        let refused = allowed.refusal("write_file", "{}").unwrap();
        assert_eq!(
            refused,
            "write_file is not allowed for the rest of this turn: the skills loaded in it limit the tools (allowed-tools of 'pdf' (Read Bash(pdftotext:*) get_weather)), and only what every one of them allows stays open. The tools you may use now are: skills_list, skills_read, get_weather, read_file, shell, skills_run. Use one of them, or answer with what you have."
        );
        assert!(allowed.refusal("spawn_agent", "{}").is_some());
        assert!(allowed.refusal("apply_patch", "{}").is_some());
        // The pattern binds every command of the line (`cd` aside): `head`
        // is not pdftotext.
        assert!(allowed
            .refusal("shell", pdf)
            .unwrap()
            .contains("every command on the line must be one of them: pdftotext …"));
        assert_eq!(allowed.refusal("shell", r#"{"command": "cd docs && pdftotext a.pdf out.txt"}"#), None);
    }

    #[test]
    fn shell_patterns_bind_each_command_and_refuse_what_cannot_be_read() {
        let mut allowed = Allowed::default();
        allowed.load("git", &list(&["Bash(git diff:*)", "Bash(make test)"]));
        let shell = |line: &str| allowed.refusal("shell", &serde_json::json!({"command": line}).to_string());
        for open in ["git diff", "git diff --stat HEAD~1", "make test", "git diff > out.txt && make test"] {
            assert_eq!(shell(open), None, "{open}");
        }
        for refused in [
            "git status",
            "make test-all",
            "make",
            "git diff; rm -rf .",
            "git diff $(rm -rf .)",
            "git diff `id`",
            "(git diff)",
            "git diff | sh",
            "",
        ] {
            assert!(shell(refused).is_some_and(|s| s.starts_with("This command was not run")), "{refused}");
        }
        // A plain `Bash` (or `Bash(*)`) opens the whole shell.
        let mut open = Allowed::default();
        open.load("any", &list(&["Bash", "Read"]));
        assert_eq!(open.refusal("shell", r#"{"command": "rm -rf . && echo $(id)"}"#), None);
        let mut star = Allowed::default();
        star.load("any", &list(&["Bash(*)"]));
        assert_eq!(star.refusal("shell", r#"{"command": "anything at all"}"#), None);
    }

    #[test]
    fn a_second_skill_narrows_what_the_first_allowed_never_widens_it() {
        let mut allowed = Allowed::default();
        allowed.load("a", &list(&["Read", "Edit", "Bash(git:*)"]));
        allowed.load("b", &list(&["Edit", "Task", "Bash(git log:*)"]));
        // Loading one again, or one with no list, changes nothing.
        allowed.load("a", &list(&["Read"]));
        allowed.load("c", &[]);
        for open in ["apply_patch", "edit_file"] {
            assert_eq!(allowed.refusal(open, "{}"), None, "{open}");
        }
        for refused in ["read_file", "spawn_agent", "wait_agent"] {
            let sentence = allowed.refusal(refused, "{}").unwrap_or_else(|| panic!("{refused}"));
            assert!(sentence.contains("'a' (Read Edit Bash(git:*)), 'b' (Edit Task Bash(git log:*))"), "{sentence}");
        }
        // The shell: each skill's patterns must hold.
        let shell = |line: &str| allowed.refusal("shell", &serde_json::json!({"command": line}).to_string());
        assert_eq!(shell("git log -3"), None);
        assert!(shell("git status").is_some());
    }

    #[test]
    fn mcp_tools_are_allowed_by_name_or_by_their_whole_server() {
        let mut allowed = Allowed::default();
        allowed.load("times", &list(&["mcp__time", "mcp__everything__echo", "mcp__files__*"]));
        for open in ["mcp__time__get_current_time", "mcp__everything__echo", "mcp__files__read_text_file"] {
            assert_eq!(allowed.refusal(open, "{}"), None, "{open}");
        }
        // A server's name is not a prefix of another's, nor a tool of its own.
        for refused in ["mcp__timer__now", "mcp__everything__add", "mcp__time__", "shell"] {
            assert!(allowed.refusal(refused, "{}").is_some(), "{refused}");
        }
        // A second skill narrows the servers too, and calls are counted for
        // the skills whose lists name them.
        allowed.load("echo", &list(&["mcp__everything__echo", "mcp__time__get_current_time"]));
        assert!(allowed.refusal("mcp__files__read_text_file", "{}").is_some());
        assert_eq!(allowed.refusal("mcp__time__get_current_time", "{}"), None);
        assert_eq!(allowed.naming("mcp__time__get_current_time").collect::<Vec<_>>(), ["times", "echo"]);
        assert_eq!(allowed.naming("mcp__files__read_text_file").collect::<Vec<_>>(), ["times"]);
    }
}
