//! `write_file(path, content)`: creates a new file. Existing files change
//! through `apply_patch`; the legacy `overwrite: true` is still accepted.

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

use super::{args, Answer, ToolError};
use crate::workspace::{DirHandle, FsError};

pub fn declaration() -> ToolDef {
    ToolDef {
        name: "write_file".into(),
        description: "Create a new file. It refuses a path that exists: change existing files with apply_patch.".into(),
        parameters: json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "File path, relative to the working folder."},
            "content": {"type": "string", "description": "The whole content of the new file."}
        }, "required": ["path", "content"]}),
    }
}

pub fn run(dir: &DirHandle, arguments: &Map<String, Value>) -> Result<Answer, ToolError> {
    let Some(path) = args::path(arguments) else {
        return Err(ToolError::Model("Say which file to create: write_file(path=\"…\", content=\"…\").".into()));
    };
    let content = args::text(arguments, &["content", "text", "contents"]).unwrap_or_default();
    // Accepted for compatibility with an older declaration of this tool.
    let overwrite = matches!(arguments.get("overwrite"), Some(Value::Bool(true)));
    let exists = || {
        ToolError::Model(format!(
            "'{path}' already exists; write_file only creates new files. Change it with apply_patch (an '*** Update File: {path}' section)."
        ))
    };
    match dir.kind(&path)? {
        Some(crate::workspace::handle::Kind::Folder) => return Err(ToolError::Model(format!("'{path}' is a folder."))),
        Some(crate::workspace::handle::Kind::Link) => {
            return Err(FsError::Link { path: path.clone(), link: path.clone() }.into())
        }
        Some(_) if !overwrite => return Err(exists()),
        Some(_) | None => {}
    }
    // Staged under a random name and renamed into place: nothing that
    // appears at the name meanwhile (a link, a FIFO) is ever written through.
    let staged = dir.stage(&path, content.as_bytes())?;
    match dir.commit(staged, overwrite) {
        Ok(()) => {}
        Err(FsError::Exists { .. }) => return Err(exists()),
        Err(err) => return Err(err.into()),
    }
    Ok(Answer {
        text: format!(
            "Wrote {} bytes to '{path}'. The file now holds exactly what you wrote; there is no need to read it back.",
            content.len()
        ),
        ok: true,
        detail: Some(path.clone()),
        written: vec![path],
        ..Answer::default()
    })
}
