//! `edit_file` / `str_replace(path, old_str, new_str)`: one exact, unique
//! replacement. Never declared (apply_patch is the way to change files), but
//! answered for models that still call it.

use serde_json::{Map, Value};

use super::{args, Answer, ToolError, FILE_TOOL_MAX_BYTES};
use crate::workspace::DirHandle;

pub fn run(dir: &DirHandle, arguments: &Map<String, Value>) -> Result<Answer, ToolError> {
    let (Some(path), Some(old), Some(new)) = (
        args::path(arguments),
        args::text(arguments, &["old_str", "old_string", "old_text"]),
        args::text(arguments, &["new_str", "new_string", "new_text"]),
    ) else {
        return Err(ToolError::Model("edit_file needs path, old_str and new_str; prefer apply_patch.".into()));
    };
    let bytes = dir.read(&path, FILE_TOOL_MAX_BYTES)?;
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(ToolError::Model(format!("'{path}' is not UTF-8 text.")));
    };
    match text.matches(old.as_str()).count() {
        0 => {
            return Err(ToolError::Model(format!(
                "The text to replace is not in '{path}'. Read the file and send its exact lines, or use apply_patch."
            )))
        }
        1 => {}
        n => {
            return Err(ToolError::Model(format!(
                "The text to replace occurs {n} times in '{path}'; include more surrounding lines so it is unique."
            )))
        }
    }
    let updated = text.replacen(old.as_str(), new.as_str(), 1);
    let staged = dir.stage(&path, updated.as_bytes())?;
    dir.commit(staged, true)?;
    Ok(Answer {
        text: format!(
            "Replaced the text in '{path}'. The file now holds the change; there is no need to read it back."
        ),
        ok: true,
        detail: Some(path.clone()),
        written: vec![path],
        ..Answer::default()
    })
}
