//! `skills_read(skill, path, offset)`: a file of a skill, in pages of at
//! most [`READ_PAGE_BYTES`] that end on character boundaries, through the
//! skills path guard.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

use super::skills::{failed, named_skill, skill_parameter, text_arg, ToolContext};
use super::Answer;
use crate::path_guard::{self, PathError};
use crate::skills::prompt::file_index;
use crate::skills::skill::{FileKind, Skill};

/// Bytes one `skills_read` call returns at most.
pub const READ_PAGE_BYTES: u64 = 48 * 1024;

pub fn declaration(reachable: &BTreeSet<String>) -> ToolDef {
    ToolDef {
        name: "skills_read".into(),
        description: "Read a file of a skill. path=\"SKILL.md\" (the default) loads the skill's instructions; other paths are relative to the skill's folder. Long files come in pages: pass the offset the previous page gives.".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "skill": skill_parameter(reachable),
                "path": {"type": "string", "description": "A file inside the skill; SKILL.md when omitted."},
                "offset": {"type": "integer", "description": "Byte offset to start reading from; 0 when omitted."}
            },
            "required": ["skill"]
        }),
    }
}

/// `offset` as a number, whether sent as one or as text.
fn offset_arg(args: &Map<String, Value>) -> Result<u64, String> {
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

pub fn run(context: &ToolContext, args: &Map<String, Value>) -> Answer {
    let skill = match named_skill(context, args) {
        Ok(skill) => skill,
        Err(outcome) => return *outcome,
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
        Err(why) => return failed(format!("{why}."), Some(id), Some(&path)),
    };
    let opened = match path_guard::open_file(&skill.root, &path) {
        Ok(opened) => opened,
        Err(err @ PathError::NotFound { .. }) => {
            return failed(
                format!("{} '{id}'. Call skills_list to see its files.", super::args::sentence_start(&err.to_string())),
                Some(id),
                Some(&path),
            )
        }
        Err(err) => {
            return failed(format!("{}.", super::args::sentence_start(&err.to_string())), Some(id), Some(&path))
        }
    };
    let relative = opened.relative.clone();
    let is_text = relative == "SKILL.md" || skill.files.iter().any(|f| f.path == relative && f.text);
    if !is_text {
        let kind = skill.files.iter().find(|f| f.path == relative).map_or(FileKind::Other, |f| f.kind);
        let hint = if kind == FileKind::Script && context.allow_exec { " Run it with skills_run instead." } else { "" };
        return failed(
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
        return failed(
            format!("Offset {offset} is past the end of '{relative}' in skill '{id}', which has {total} bytes."),
            Some(id),
            Some(&relative),
        );
    }
    let mut file = opened.file;
    let mut bytes = Vec::new();
    let read = file.seek(SeekFrom::Start(offset)).and_then(|_| file.take(READ_PAGE_BYTES).read_to_end(&mut bytes));
    if let Err(err) = read {
        return failed(format!("'{relative}' in skill '{id}' cannot be read: {err}."), Some(id), Some(&relative));
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
    Answer { text, ok: true, skill: Some(id.to_string()), detail: Some(relative), ..Answer::default() }
}

/// The block appended to a complete SKILL.md read when `skills_run` is
/// offered and the skill ships a script: portable skills often show another
/// agent's install path, which a sandbox cannot find.
fn execution_guidance(skill: &Skill) -> Option<String> {
    let script = skill
        .files
        .iter()
        .find(|f| f.kind == FileKind::Script && f.text && super::skills_run::interpreter(&f.path).is_some())?;
    Some(format!(
        "\n[skillhost execution guidance; not part of SKILL.md]\nRun this skill's scripts with skills_run, which finds the skill's folder itself; ignore install paths written for other agents. For example: skills_run(skill=\"{}\", path=\"{}\", args=[\"…\"])",
        skill.id(),
        script.path
    ))
}
