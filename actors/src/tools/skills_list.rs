//! `skills_list()`: every skill the request can use, with its description,
//! requirements and files.

use serde_json::json;
use skillhost_engine::ToolDef;

use super::skills::{available, failed, ToolContext};
use super::Answer;
use crate::skills::prompt::{file_index, trim_description};

pub fn declaration() -> ToolDef {
    ToolDef {
        name: "skills_list".into(),
        description: "List every skill you can use, with its description and its files.".into(),
        parameters: json!({"type": "object", "properties": {}, "required": []}),
    }
}

pub fn run(context: &ToolContext) -> Answer {
    if context.reachable.is_empty() {
        return failed(available(context), None, None);
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
    Answer { text: text.trim_end().to_string(), ok: true, skill: None, detail: None, ..Answer::default() }
}
