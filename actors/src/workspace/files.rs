//! The file tools: `read_file`, `write_file`, `apply_patch` (and the
//! `edit_file`/`str_replace` aliases models still reach for). Every path goes
//! through the skills path guard, rooted at the workspace.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use super::apply_patch;
use crate::skills::path_guard::{self, PathError};

/// Lines `read_file` returns when no limit is given.
pub const READ_DEFAULT_LINES: usize = 400;
/// Most lines one `read_file` call returns.
pub const READ_MAX_LINES: usize = 2000;
/// Most bytes one `read_file` call returns.
pub const READ_MAX_BYTES: usize = 48 * 1024;

/// What a file tool did: the text for the model and the files it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOutcome {
    pub text: String,
    pub ok: bool,
    pub written: Vec<String>,
}

fn failed(text: impl Into<String>) -> FileOutcome {
    FileOutcome { text: text.into(), ok: false, written: Vec::new() }
}

fn text_arg(args: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| match args.get(*k) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

fn number_arg(args: &serde_json::Map<String, Value>, key: &str) -> Option<usize> {
    match args.get(key) {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as usize),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
}

fn sentence(err: PathError) -> String {
    let text = err.to_string();
    let mut chars = text.chars();
    let first = chars.next().map(|c| c.to_uppercase().collect::<String>()).unwrap_or_default();
    format!("{first}{}.", chars.as_str()).replace("in this skill", "in the workspace")
}

/// `read_file(path, offset, limit)`: numbered lines, 1-based offset.
pub fn read_file(root: &Path, args: &serde_json::Map<String, Value>) -> FileOutcome {
    let Some(path) = text_arg(args, &["path", "file", "file_path"]) else {
        return failed("Say which file to read: read_file(path=\"…\").");
    };
    let mut opened = match path_guard::open_file(root, &path) {
        Ok(opened) => opened,
        Err(err) => return failed(sentence(err)),
    };
    let mut bytes = Vec::new();
    if let Err(err) = opened.file.read_to_end(&mut bytes) {
        return failed(format!("'{path}' cannot be read: {err}."));
    }
    if bytes.contains(&0) {
        return failed(format!("'{path}' is a binary file ({} bytes); read_file shows text.", bytes.len()));
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let offset = number_arg(args, "offset").unwrap_or(1).max(1);
    let limit = number_arg(args, "limit").unwrap_or(READ_DEFAULT_LINES).clamp(1, READ_MAX_LINES);
    if lines.is_empty() {
        return FileOutcome { text: format!("[read_file: '{path}' is empty]"), ok: true, written: Vec::new() };
    }
    if offset > lines.len() {
        return failed(format!("'{path}' has {} lines; offset {offset} is past its end.", lines.len()));
    }
    let mut out = String::new();
    let mut last = offset - 1;
    for (index, line) in lines.iter().enumerate().skip(offset - 1).take(limit) {
        let numbered = format!("{:>6}\t{line}\n", index + 1);
        if out.len() + numbered.len() > READ_MAX_BYTES {
            break;
        }
        out.push_str(&numbered);
        last = index + 1;
    }
    let mut result = format!("[read_file: '{path}', lines {offset}-{last} of {}]\n{out}", lines.len());
    if last < lines.len() {
        result.push_str(&format!("[More lines follow: read_file(path=\"{path}\", offset={})]", last + 1));
    }
    FileOutcome { text: result, ok: true, written: Vec::new() }
}

/// `write_file(path, content)`: creates a new file only.
pub fn write_file(root: &Path, args: &serde_json::Map<String, Value>) -> FileOutcome {
    let Some(path) = text_arg(args, &["path", "file", "file_path"]) else {
        return failed("Say which file to create: write_file(path=\"…\", content=\"…\").");
    };
    let content = text_arg(args, &["content", "text", "contents"]).unwrap_or_default();
    // Accepted for compatibility with an older declaration of this tool.
    let overwrite = matches!(args.get("overwrite"), Some(Value::Bool(true)));
    let target = match path_guard::path_for_create(root, &path) {
        Ok(target) => target,
        Err(err) => return failed(sentence(err)),
    };
    if target.exists() && !overwrite {
        return failed(format!(
            "'{path}' already exists; write_file only creates new files. Change it with apply_patch (an '*** Update File: {path}' section)."
        ));
    }
    if target.is_dir() {
        return failed(format!("'{path}' is a folder."));
    }
    if let Some(parent) = target.parent() {
        if let Err(err) = std::fs::create_dir_all(parent) {
            return failed(format!("Cannot create the folders for '{path}': {err}."));
        }
    }
    if let Err(err) = std::fs::write(&target, content.as_bytes()) {
        return failed(format!("Cannot write '{path}': {err}."));
    }
    FileOutcome {
        text: format!(
            "Wrote {} bytes to '{path}'. The file now holds exactly what you wrote; there is no need to read it back.",
            content.len()
        ),
        ok: true,
        written: vec![path],
    }
}

/// `apply_patch(input)`.
pub fn apply_patch(root: &Path, args: &serde_json::Map<String, Value>) -> FileOutcome {
    let Some(patch) = text_arg(args, &["input", "patch", "diff"]) else {
        return failed("Send the patch in 'input', from '*** Begin Patch' to '*** End Patch'.");
    };
    match apply_patch::apply(root, &patch) {
        Ok(applied) => {
            let mut text = applied.report;
            for path in &applied.written {
                if let Some(check) = super::syntax::check(&root.join(path)) {
                    text.push_str(&format!("Syntax check of {path}: {check}\n"));
                }
            }
            FileOutcome { text: text.trim_end().to_string(), ok: true, written: applied.written }
        }
        Err(err) => failed(err.to_string()),
    }
}

/// `edit_file` / `str_replace(path, old_str, new_str)`: one exact, unique
/// replacement, applied through the same atomic machinery.
pub fn edit_file(root: &Path, args: &serde_json::Map<String, Value>) -> FileOutcome {
    let (Some(path), Some(old), Some(new)) = (
        text_arg(args, &["path", "file", "file_path"]),
        text_arg(args, &["old_str", "old_string", "old_text"]),
        text_arg(args, &["new_str", "new_string", "new_text"]),
    ) else {
        return failed("edit_file needs path, old_str and new_str; prefer apply_patch.");
    };
    let mut opened = match path_guard::open_file(root, &path) {
        Ok(opened) => opened,
        Err(err) => return failed(sentence(err)),
    };
    let mut text = String::new();
    if opened.file.read_to_string(&mut text).is_err() {
        return failed(format!("'{path}' is not UTF-8 text."));
    }
    match text.matches(old.as_str()).count() {
        0 => {
            return failed(format!(
                "The text to replace is not in '{path}'. Read the file and send its exact lines, or use apply_patch."
            ))
        }
        1 => {}
        n => {
            return failed(format!(
                "The text to replace occurs {n} times in '{path}'; include more surrounding lines so it is unique."
            ))
        }
    }
    let updated = text.replacen(old.as_str(), new.as_str(), 1);
    let target = root.join(&path);
    if let Err(err) = std::fs::write(&target, updated) {
        return failed(format!("Cannot write '{path}': {err}."));
    }
    let mut message =
        format!("Replaced the text in '{path}'. The file now holds the change; there is no need to read it back.");
    if let Some(check) = super::syntax::check(&target) {
        message.push_str(&format!("\nSyntax check of {path}: {check}"));
    }
    FileOutcome { text: message, ok: true, written: vec![path] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(root: &Path, args: Value) -> String {
        read_file(root, args.as_object().unwrap()).text
    }

    #[test]
    fn line_limit_at_and_past() {
        let dir = tempfile::tempdir().unwrap();
        let lines = |n: usize| (1..=n).map(|i| format!("{i}\n")).collect::<String>();
        std::fs::write(dir.path().join("at.txt"), lines(READ_MAX_LINES)).unwrap();
        std::fs::write(dir.path().join("past.txt"), lines(READ_MAX_LINES + 1)).unwrap();
        let at = read(dir.path(), json!({"path": "at.txt", "limit": 100_000}));
        assert!(
            at.starts_with(&format!("[read_file: 'at.txt', lines 1-{READ_MAX_LINES} of {READ_MAX_LINES}]")),
            "{at}"
        );
        assert!(!at.contains("More lines follow"));
        let past = read(dir.path(), json!({"path": "past.txt", "limit": 100_000}));
        assert!(
            past.starts_with(&format!("[read_file: 'past.txt', lines 1-{READ_MAX_LINES} of {}]", READ_MAX_LINES + 1))
        );
        assert!(past.ends_with(&format!("offset={})]", READ_MAX_LINES + 1)), "{}", &past[past.len() - 80..]);
    }

    #[test]
    fn byte_limit_at_and_past() {
        // A numbered line costs its text plus 8 bytes ("{:>6}\t" and "\n").
        let long = "a".repeat(100);
        let full_lines = READ_MAX_BYTES / (long.len() + 8);
        let room = READ_MAX_BYTES - full_lines * (long.len() + 8);
        let dir = tempfile::tempdir().unwrap();
        for (name, last_len) in [("at.txt", room - 8), ("past.txt", room - 7)] {
            let mut text: String = (0..full_lines).map(|_| format!("{long}\n")).collect();
            text.push_str(&format!("{}\nafter\n", "b".repeat(last_len)));
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let at = read(dir.path(), json!({"path": "at.txt", "limit": 2000}));
        assert!(at.contains(&format!("lines 1-{}", full_lines + 1)), "{}", &at[..60]);
        let past = read(dir.path(), json!({"path": "past.txt", "limit": 2000}));
        assert!(past.contains(&format!("lines 1-{} ", full_lines)), "{}", &past[..60]);
        assert!(past.contains(&format!("offset={})]", full_lines + 1)));
    }
}
