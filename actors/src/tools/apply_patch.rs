//! `apply_patch(input)`: the one way the model changes existing files. The
//! envelope, matching and all-or-nothing commit live in
//! [`crate::workspace::apply_patch`]; this is the tool around them.

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

use super::{args, Answer, ToolError};
use crate::workspace::{apply_patch, DirHandle};

pub fn declaration() -> ToolDef {
    ToolDef {
        name: "apply_patch".into(),
        description: "Change, add, move or delete files with a patch: '*** Begin Patch', then sections '*** Update File: path' (with '@@' anchors and ' ', '-', '+' lines), '*** Add File: path' ('+' lines), '*** Delete File: path', then '*** End Patch'. All or nothing.".into(),
        parameters: json!({"type": "object", "properties": {
            "input": {"type": "string", "description": "The whole patch, from '*** Begin Patch' to '*** End Patch'."}
        }, "required": ["input"]}),
    }
}

pub fn run(dir: &DirHandle, arguments: &Map<String, Value>) -> Result<Answer, ToolError> {
    let Some(patch) = args::text(arguments, &["input", "patch", "diff"]) else {
        return Err(ToolError::Model("Send the patch in 'input', from '*** Begin Patch' to '*** End Patch'.".into()));
    };
    let applied = apply_patch::apply(dir, &patch).map_err(|err| ToolError::Model(err.to_string()))?;
    Ok(Answer {
        text: applied.report.trim_end().to_string(),
        ok: true,
        detail: applied.written.first().cloned(),
        written: applied.written,
        ..Answer::default()
    })
}
