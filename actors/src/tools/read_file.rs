//! `read_file(path, offset, limit)`: a file of the working folder with line
//! numbers. It reads only as far as what it shows, and never past
//! [`FILE_TOOL_MAX_BYTES`] of a file. Without a working folder it reads
//! the request's attachments, from memory.

use std::io::{BufRead, BufReader, Read};

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

use super::{args, Answer, ToolError, FILE_TOOL_MAX_BYTES};
use crate::attachments::{Attachment, ATTACHMENTS_DIR};
use crate::workspace::DirHandle;

/// Lines `read_file` returns when no limit is given.
pub const READ_DEFAULT_LINES: usize = 400;
/// Most lines one `read_file` call returns.
pub const READ_MAX_LINES: usize = 2000;
/// Most bytes one `read_file` call returns.
pub const READ_MAX_BYTES: usize = 48 * 1024;

pub fn declaration() -> ToolDef {
    declared("Show a file of the working folder with line numbers.", "File path, relative to the working folder.")
}

fn declared(description: &str, path: &str) -> ToolDef {
    ToolDef {
        name: "read_file".into(),
        description: description.into(),
        parameters: json!({"type": "object", "properties": {
            "path": {"type": "string", "description": path},
            "offset": {"type": "integer", "description": "First line to show (1-based)."},
            "limit": {"type": "integer", "description": "How many lines to show."}
        }, "required": ["path"]}),
    }
}

/// Reads one line into `line`, keeping at most `keep` bytes of it; returns
/// the bytes consumed (0 at the end of the file).
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>, keep: usize) -> std::io::Result<usize> {
    line.clear();
    let mut consumed = 0;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(consumed);
        }
        let (chunk, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (&buffer[..=at], true),
            None => (buffer, false),
        };
        let room = keep.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = chunk.len();
        reader.consume(used);
        consumed += used;
        if done {
            return Ok(consumed);
        }
    }
}

pub fn run(dir: &DirHandle, arguments: &Map<String, Value>) -> Result<Answer, ToolError> {
    let Some(path) = args::path(arguments) else {
        return Err(ToolError::Model("Say which file to read: read_file(path=\"…\").".into()));
    };
    let (file, bytes) = dir.open_file(&path)?;
    show(&path, file, bytes, arguments)
}

/// The declaration when the only files are the user's attachments (no
/// working folder: `--code-exec` is off).
pub fn attachments_declaration() -> ToolDef {
    declared(
        "Show a file the user attached (attachments/NAME) with line numbers.",
        "The attachment's path, as its message names it.",
    )
}

/// `read_file` over the request's attachments alone, read from memory:
/// nothing on disk is named, so no path the model writes reaches a folder.
pub fn run_attachments(attachments: &[Attachment], arguments: &Map<String, Value>) -> Result<Answer, ToolError> {
    let Some(path) = args::path(arguments) else {
        return Err(ToolError::Model("Say which attachment to read: read_file(path=\"attachments/…\").".into()));
    };
    let wanted = path.trim_start_matches("./");
    let wanted = wanted.strip_prefix(&format!("{ATTACHMENTS_DIR}/")).unwrap_or(wanted);
    let Some(attachment) = attachments.iter().find(|a| a.name == wanted) else {
        let names: Vec<String> = attachments.iter().map(Attachment::path).collect();
        return Err(ToolError::Model(format!(
            "There is no attachment '{path}'. The attachments are: {}.",
            names.join(", ")
        )));
    };
    let Some(text) = attachment.readable() else {
        return Err(ToolError::Model(format!(
            "'{}' is {} ({} bytes), not text, and its text could not be read: read_file shows text.",
            attachment.path(),
            attachment.media_type,
            attachment.content.len()
        )));
    };
    show(&attachment.path(), text.as_bytes(), text.len() as u64, arguments)
}

/// The lines `arguments` ask for of a file of `bytes` bytes read from
/// `file`, numbered, within the tool's limits.
fn show(path: &str, file: impl Read, bytes: u64, arguments: &Map<String, Value>) -> Result<Answer, ToolError> {
    let offset = args::number(arguments, "offset").unwrap_or(1).max(1) as usize;
    let limit =
        (args::number(arguments, "limit").unwrap_or(READ_DEFAULT_LINES as u64) as usize).clamp(1, READ_MAX_LINES);
    let mut reader = BufReader::with_capacity(64 * 1024, file.take(FILE_TOOL_MAX_BYTES));
    let mut line = Vec::new();
    let mut out = String::new();
    let mut number = 0usize;
    let mut last = offset - 1;
    // A file within the cap is counted to its end, so the header can say
    // how many lines it has; a larger one is read only as far as shown.
    let counted = bytes <= FILE_TOOL_MAX_BYTES;
    let mut at_end = false;
    loop {
        let consumed = read_line(&mut reader, &mut line, READ_MAX_BYTES)
            .map_err(|err| ToolError::Model(format!("'{path}' cannot be read: {err}.")))?;
        if consumed == 0 {
            at_end = true;
            break;
        }
        number += 1;
        if number < offset {
            continue;
        }
        if number >= offset + limit {
            number -= 1;
            break;
        }
        if line.contains(&0) {
            return Err(ToolError::Model(format!("'{path}' is a binary file ({bytes} bytes); read_file shows text.")));
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.strip_suffix('\n').unwrap_or(&text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        let mut numbered = format!("{number:>6}\t{text}\n");
        if out.len() + numbered.len() > READ_MAX_BYTES {
            if !out.is_empty() {
                number -= 1;
                break;
            }
            // One line longer than a whole page: show its start.
            let mut cut = READ_MAX_BYTES.saturating_sub(64);
            while !numbered.is_char_boundary(cut) {
                cut -= 1;
            }
            numbered.truncate(cut);
            numbered.push_str(" [… line cut]\n");
        }
        out.push_str(&numbered);
        last = number;
    }
    if counted && !at_end {
        // The line that stopped the loop was read but not counted.
        number += 1;
        while read_line(&mut reader, &mut line, 0).unwrap_or(0) > 0 {
            number += 1;
        }
    }
    let complete = counted;
    if number == 0 {
        return Ok(Answer::done(format!("[read_file: '{path}' is empty]")));
    }
    if offset > number {
        return Err(ToolError::Model(if complete {
            format!("'{path}' has {number} lines; offset {offset} is past its end.")
        } else {
            format!(
                "read_file reads the first {FILE_TOOL_MAX_BYTES} bytes of a file, and line {offset} of '{path}' ({bytes} bytes) lies beyond them; use shell (sed -n '{offset},{}p' {path}).",
                offset + limit - 1
            )
        }));
    }
    let total = if complete { format!("of {number}") } else { format!("of a {bytes}-byte file") };
    let mut text = format!("[read_file: '{path}', lines {offset}-{last} {total}]\n{out}");
    if !complete || last < number {
        text.push_str(&format!("[More lines follow: read_file(path=\"{path}\", offset={})]", last + 1));
    }
    Ok(Answer::done(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(root: &std::path::Path, args: Value) -> String {
        let dir = DirHandle::open(root).unwrap();
        match run(&dir, args.as_object().unwrap()) {
            Ok(answer) => answer.text,
            Err(err) => err.to_string(),
        }
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
            "{}",
            &at[..80]
        );
        assert!(!at.contains("More lines follow"));
        let past = read(dir.path(), json!({"path": "past.txt", "limit": 100_000}));
        assert!(
            past.starts_with(&format!("[read_file: 'past.txt', lines 1-{READ_MAX_LINES} of {}]", READ_MAX_LINES + 1)),
            "{}",
            &past[..80]
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

    #[test]
    fn without_a_folder_it_reads_attachments_and_nothing_else() {
        let attachment = |name: &str, media_type: &str, content: &[u8]| Attachment {
            message: 0,
            name: name.into(),
            media_type: media_type.into(),
            content: bytes::Bytes::copy_from_slice(content),
            extracted: None,
        };
        let attachments = vec![
            attachment("notes.txt", "text/plain", b"first\nsecond\n"),
            attachment("report.pdf", "application/pdf", b"%PDF-1.7"),
        ];
        let read = |args: Value| match run_attachments(&attachments, args.as_object().unwrap()) {
            Ok(answer) => answer.text,
            Err(err) => err.to_string(),
        };
        let shown = "[read_file: 'attachments/notes.txt', lines 2-2 of 2]\n     2\tsecond\n";
        for path in ["attachments/notes.txt", "notes.txt", "./attachments/notes.txt"] {
            assert_eq!(read(json!({"path": path, "offset": 2})), shown, "{path}");
        }
        assert_eq!(
            read(json!({"path": "../../etc/passwd"})),
            "There is no attachment '../../etc/passwd'. The attachments are: attachments/notes.txt, attachments/report.pdf."
        );
        assert!(read(json!({"path": "attachments/report.pdf"}))
            .starts_with("'attachments/report.pdf' is application/pdf (8 bytes), not text"));
        // A PDF's text, read at the edge, is what it shows.
        let read_pdf = Attachment { extracted: Some("Total: 42\n".into()), ..attachments[1].clone() };
        let answer = run_attachments(&[read_pdf], json!({"path": "attachments/report.pdf"}).as_object().unwrap());
        assert_eq!(answer.unwrap().text, "[read_file: 'attachments/report.pdf', lines 1-1 of 1]\n     1\tTotal: 42\n");
    }

    #[test]
    fn a_file_past_the_cap_is_read_only_as_far_as_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("big.txt")).unwrap();
        // Sparse: 9 MB that read as NULs past the first lines; only the
        // first lines are ever read, so the NULs are never seen.
        use std::io::Write;
        (&file).write_all(b"one\ntwo\n").unwrap();
        file.set_len(FILE_TOOL_MAX_BYTES + 1024 * 1024).unwrap();
        let shown = read(dir.path(), json!({"path": "big.txt", "limit": 2}));
        assert!(
            shown.starts_with("[read_file: 'big.txt', lines 1-2 of a 9437184-byte file]\n     1\tone\n     2\ttwo\n"),
            "{shown}"
        );
        assert!(shown.ends_with("offset=3)]"), "{shown}");
    }
}
