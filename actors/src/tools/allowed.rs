//! A loaded skill's `allowed-tools`: once the model has read a skill that
//! declares the list, the tools outside it are refused for the rest of the
//! turn, with a sentence naming what is allowed.
//!
//! Skills are written for Claude Code, whose tool names differ from ours,
//! so the entries are read as Claude Code spells them (`Read`, `Bash(git:*)`)
//! as well as by our own names and the caller's. A pattern in parentheses
//! narrows a tool in Claude Code; here it is advisory: `Bash(git:*)` allows
//! the shell, not only git. The skill tools that read (`skills_list`,
//! `skills_read`) stay allowed: following a skill means reading its files.
//! With several restricting skills loaded, what any of them allows is
//! allowed.

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

/// What the skills loaded so far in a turn allow.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allowed {
    /// The loaded skills that restrict, in the order they were loaded, with
    /// their lists as written.
    skills: Vec<(String, Vec<String>)>,
    /// The tool names those lists allow.
    permitted: BTreeSet<String>,
}

impl Allowed {
    /// Takes in a skill the model loaded; one without `allowed-tools`
    /// changes nothing.
    pub fn load(&mut self, skill: &str, entries: &[String]) {
        if entries.is_empty() || self.skills.iter().any(|(id, _)| id == skill) {
            return;
        }
        self.permitted.extend(entries.iter().flat_map(|entry| names(entry)));
        self.skills.push((skill.to_string(), entries.to_vec()));
    }

    /// Takes in a loaded skill by id, with the list its SKILL.md declares.
    pub fn load_from(&mut self, snapshot: Option<&crate::skills::Snapshot>, skill: &str) {
        if let Some(found) = snapshot.and_then(|s| s.get(skill)) {
            self.load(skill, &found.manifest.allowed_tools);
        }
    }

    /// Whether any loaded skill restricts the tools.
    pub fn restricts(&self) -> bool {
        !self.skills.is_empty()
    }

    /// The sentence refusing a call to `tool`, when it is outside what the
    /// loaded skills allow.
    pub fn refusal(&self, tool: &str) -> Option<String> {
        if !self.restricts() || ALWAYS.contains(&tool) || self.permitted.contains(tool) {
            return None;
        }
        let from: Vec<String> =
            self.skills.iter().map(|(id, entries)| format!("'{id}' ({})", entries.join(" "))).collect();
        let mut open: Vec<&str> = ALWAYS.to_vec();
        open.extend(self.permitted.iter().map(String::as_str));
        Some(format!(
            "{tool} is not allowed for the rest of this turn: the skill you loaded limits its tools (allowed-tools of {}). The tools you may use now are: {}. Use one of them, or answer with what you have.",
            from.join(", "),
            open.join(", ")
        ))
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
        assert_eq!(allowed.refusal("shell"), None);
        allowed.load("notes", &[]);
        assert!(!allowed.restricts());
        assert_eq!(allowed.refusal("write_file"), None);
    }

    #[test]
    fn claude_code_names_map_to_ours_and_patterns_are_advisory() {
        let mut allowed = Allowed::default();
        allowed.load("pdf", &list(&["Read", "Bash(pdftotext:*)", "get_weather"]));
        for open in ["read_file", "shell", "skills_run", "skills_read", "skills_list", "get_weather"] {
            assert_eq!(allowed.refusal(open), None, "{open}");
        }
        let refused = allowed.refusal("write_file").unwrap();
        assert_eq!(
            refused,
            "write_file is not allowed for the rest of this turn: the skill you loaded limits its tools (allowed-tools of 'pdf' (Read Bash(pdftotext:*) get_weather)). The tools you may use now are: skills_list, skills_read, get_weather, read_file, shell, skills_run. Use one of them, or answer with what you have."
        );
        assert!(allowed.refusal("spawn_agent").is_some());
        assert!(allowed.refusal("apply_patch").is_some());
    }

    #[test]
    fn several_skills_allow_what_any_of_them_allows() {
        let mut allowed = Allowed::default();
        allowed.load("a", &list(&["Read"]));
        allowed.load("b", &list(&["Edit", "Task"]));
        // Loading one twice adds nothing.
        allowed.load("a", &list(&["Read"]));
        for open in ["read_file", "apply_patch", "edit_file", "spawn_agent", "wait_agent"] {
            assert_eq!(allowed.refusal(open), None, "{open}");
        }
        let refused = allowed.refusal("shell").unwrap();
        assert!(refused.contains("'a' (Read), 'b' (Edit Task)"), "{refused}");
    }
}
