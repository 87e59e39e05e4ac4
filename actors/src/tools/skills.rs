//! What a request's skill tools can reach, and what `skills_list`,
//! `skills_read` and `skills_run` share: the declarations, the `skill`
//! argument and its refusals.
//!
//! Readers are forgiving about how models spell a call (aliases, strings for
//! numbers, a skill-prefixed path) and a failed call never errors: the model
//! gets one sentence that names its next move.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

use skillhost_engine::ToolCall;

use super::{args, skills_list, skills_read, skills_run, Answer, Tool};
use crate::skills::registry::Snapshot;
use crate::skills::skill::Skill;

/// What a request's skill tools can see.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub snapshot: Arc<Snapshot>,
    pub reachable: BTreeSet<String>,
    pub allow_exec: bool,
}

/// A refusal about a skill (and a path in it), for the model.
pub fn failed(text: impl Into<String>, skill: Option<&str>, detail: Option<&str>) -> Answer {
    Answer {
        text: text.into(),
        ok: false,
        skill: skill.map(str::to_string),
        detail: detail.map(str::to_string),
        ..Answer::default()
    }
}

/// The `skill` parameter: the reachable skills as an enum, which also lets
/// a grammar keep a small model from inventing a name.
pub fn skill_parameter(reachable: &BTreeSet<String>) -> Value {
    json!({"type": "string", "description": "The skill's name.", "enum": reachable.iter().collect::<Vec<_>>()})
}

/// The skill tools' names: a caller that declares one of them gets none
/// of ours (see the loop's `prepare_state`).
pub const NAMES: [&str; 3] = ["skills_list", "skills_read", "skills_run"];

/// The skill tools offered to the model. Parameters are flat scalars:
/// several chat formats cannot render anything richer.
pub fn declarations(allow_exec: bool, reachable: &BTreeSet<String>) -> Vec<ToolDef> {
    let mut tools = vec![super::skills_list::declaration(), super::skills_read::declaration(reachable)];
    if allow_exec {
        tools.push(super::skills_run::declaration(reachable));
    }
    tools
}

/// The first of `keys` present, as text.
pub(super) fn text_arg(args: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|key| match args.get(*key) {
        Some(Value::String(s)) => Some(s.trim().to_string()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

pub(super) fn available(context: &ToolContext) -> String {
    if context.reachable.is_empty() {
        "No skills are available in this conversation.".to_string()
    } else {
        format!("Available skills: {}.", context.reachable.iter().cloned().collect::<Vec<_>>().join(", "))
    }
}

/// The skill a call names, if this request can reach it.
pub(super) fn named_skill<'a>(
    context: &'a ToolContext,
    args: &Map<String, Value>,
) -> Result<&'a Arc<Skill>, Box<Answer>> {
    let Some(name) = text_arg(args, &["skill", "name", "skill_name"]).filter(|s| !s.is_empty()) else {
        return Err(Box::new(failed(
            format!("Say which skill, e.g. skills_read(skill=\"…\"). {}", available(context)),
            None,
            None,
        )));
    };
    match context.snapshot.get(&name) {
        Some(skill) if context.reachable.contains(&name) => Ok(skill),
        // An unreachable skill reads exactly like a missing one: its name is
        // not something this request may learn.
        _ => Err(Box::new(failed(
            format!("No skill called '{name}' is available. {}", available(context)),
            Some(&name),
            None,
        ))),
    }
}

/// Answers `skills_list` and `skills_read`, and checks a `skills_run` call
/// (running it needs a workspace, which the request loop provides).
pub fn answer(context: &ToolContext, tool: Tool, call: &ToolCall) -> Answer {
    match tool {
        Tool::SkillsList => skills_list::run(context),
        Tool::SkillsRead => skills_read::run(context, &args::arguments(call)),
        Tool::SkillsRun => match skills_run::prepare(context, call) {
            Ok(_) => failed("skills_run is answered by the request loop.", None, None),
            Err(refusal) => *refusal,
        },
        other => failed(format!("{} is not a skill tool.", other.name()), None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skills::registry::scan;
    use crate::tools::skills_read::READ_PAGE_BYTES;
    use crate::tools::skills_run::script_args;

    const SKILLS_LIST: &str = "skills_list";
    const SKILLS_READ: &str = "skills_read";
    const SKILLS_RUN: &str = "skills_run";

    fn execute(context: &ToolContext, call: &ToolCall) -> Answer {
        answer(context, Tool::from_name(&call.name).unwrap(), call)
    }
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
