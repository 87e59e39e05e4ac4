//! `apply_patch`: the one way the model changes existing files.
//!
//! The envelope is the one Codex popularized:
//!
//! ```text
//! *** Begin Patch
//! *** Add File: notes/todo.md
//! +first line
//! *** Update File: src/app.py
//! *** Move to: src/main.py
//! @@ def main():
//!      print("hello")
//! -    return 1
//! +    return 0
//! *** Delete File: old.txt
//! *** End Patch
//! ```
//!
//! Unlike Codex, a patch is atomic across files: every change is computed in
//! memory first and nothing is written unless every hunk applies. When a
//! hunk does not match, the result shows the file's real lines near the best
//! candidate, numbered, because a model that guessed the context can only fix
//! its guess by seeing what is there.

use std::collections::BTreeMap;

use super::handle::{DirHandle, FsError, Kind};
use super::FILE_TOOL_MAX_BYTES;
use crate::path_guard;

/// Lines of real file content shown around a failed match.
const MISS_CONTEXT_LINES: usize = 6;

/// One file operation of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileChange {
    Add { path: String, content: String },
    Delete { path: String },
    Update { path: String, move_to: Option<String>, chunks: Vec<Chunk> },
}

/// One line of a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchLine {
    Context(String),
    Remove(String),
    Add(String),
}

/// One `@@` section of an update.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunk {
    /// Text after `@@`: a line to find before matching the chunk.
    pub anchor: Option<String>,
    pub lines: Vec<PatchLine>,
    /// `*** End of File`: the old lines must end the file.
    pub end_of_file: bool,
}

impl Chunk {
    /// The lines expected in the file: context and removed lines.
    pub fn old(&self) -> Vec<String> {
        self.lines
            .iter()
            .filter_map(|line| match line {
                PatchLine::Context(text) | PatchLine::Remove(text) => Some(text.clone()),
                PatchLine::Add(_) => None,
            })
            .collect()
    }

    /// The replacement for `matched` (the file's real lines where the old
    /// lines matched): context lines keep the file's own bytes, so a loose
    /// match never rewrites lines the patch did not mean to change.
    fn replacement(&self, matched: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        let mut index = 0;
        for line in &self.lines {
            match line {
                PatchLine::Context(_) => {
                    out.push(matched[index].clone());
                    index += 1;
                }
                PatchLine::Remove(_) => index += 1,
                PatchLine::Add(text) => out.push(text.clone()),
            }
        }
        out
    }
}

/// Why a patch was not applied; one paragraph the model can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PatchError(pub String);

fn error(message: impl Into<String>) -> PatchError {
    PatchError(message.into())
}

/// Parses the envelope. Markers may carry surrounding whitespace.
pub fn parse(text: &str) -> Result<Vec<FileChange>, PatchError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut start = 0;
    while start < lines.len() && lines[start].trim().is_empty() {
        start += 1;
    }
    if lines.get(start).map(|l| l.trim()) != Some("*** Begin Patch") {
        return Err(error("The patch must start with a line '*** Begin Patch'."));
    }
    let end = lines
        .iter()
        .rposition(|l| l.trim() == "*** End Patch")
        .ok_or_else(|| error("The patch must end with a line '*** End Patch'."))?;
    if end <= start {
        return Err(error("The patch must end with a line '*** End Patch'."));
    }
    let body = &lines[start + 1..end];
    let mut changes = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let line = body[i].trim();
        if line.is_empty() {
            i += 1;
            continue;
        }
        if let Some(path) = line.strip_prefix("*** Add File:") {
            let path = path.trim().to_string();
            i += 1;
            let mut content = String::new();
            while i < body.len() && !is_file_header(body[i]) {
                match body[i].strip_prefix('+') {
                    Some(added) => {
                        content.push_str(added);
                        content.push('\n');
                    }
                    None if body[i].trim().is_empty() => content.push('\n'),
                    None => {
                        return Err(error(format!(
                            "In '*** Add File: {path}', every line must start with '+'; found: {}",
                            body[i]
                        )))
                    }
                }
                i += 1;
            }
            changes.push(FileChange::Add { path, content });
        } else if let Some(path) = line.strip_prefix("*** Delete File:") {
            changes.push(FileChange::Delete { path: path.trim().to_string() });
            i += 1;
        } else if let Some(path) = line.strip_prefix("*** Update File:") {
            let path = path.trim().to_string();
            i += 1;
            let mut move_to = None;
            if let Some(target) = body.get(i).and_then(|l| l.trim().strip_prefix("*** Move to:")) {
                move_to = Some(target.trim().to_string());
                i += 1;
            }
            let (chunks, next) = parse_chunks(body, i, &path)?;
            i = next;
            if chunks.is_empty() && move_to.is_none() {
                return Err(error(format!("'*** Update File: {path}' has no changes.")));
            }
            changes.push(FileChange::Update { path, move_to, chunks });
        } else {
            return Err(error(format!(
                "Unexpected line in the patch: '{line}'. Each file starts with '*** Add File:', '*** Update File:' or '*** Delete File:'."
            )));
        }
    }
    if changes.is_empty() {
        return Err(error("The patch is empty: it changes no file."));
    }
    Ok(changes)
}

fn is_file_header(line: &str) -> bool {
    let line = line.trim();
    line.starts_with("*** Add File:") || line.starts_with("*** Delete File:") || line.starts_with("*** Update File:")
}

fn parse_chunks(body: &[&str], mut i: usize, path: &str) -> Result<(Vec<Chunk>, usize), PatchError> {
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut current: Option<Chunk> = None;
    while i < body.len() && !is_file_header(body[i]) {
        let raw = body[i];
        let trimmed = raw.trim();
        if trimmed == "*** End of File" {
            match current.as_mut() {
                Some(chunk) => chunk.end_of_file = true,
                None => return Err(error(format!("'*** End of File' in '{path}' must follow the lines it anchors."))),
            }
            i += 1;
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("@@") {
            if let Some(chunk) = current.take() {
                chunks.push(chunk);
            }
            let anchor = rest.trim();
            current = Some(Chunk { anchor: (!anchor.is_empty()).then(|| anchor.to_string()), ..Chunk::default() });
            i += 1;
            continue;
        }
        let chunk = current.get_or_insert_with(Chunk::default);
        match raw.chars().next() {
            Some('+') => chunk.lines.push(PatchLine::Add(raw[1..].to_string())),
            Some('-') => chunk.lines.push(PatchLine::Remove(raw[1..].to_string())),
            Some(' ') => chunk.lines.push(PatchLine::Context(raw[1..].to_string())),
            // An empty line is an empty context line.
            None => chunk.lines.push(PatchLine::Context(String::new())),
            Some(_) => {
                return Err(error(format!(
                    "Invalid line in the changes to '{path}': '{raw}'. Lines start with ' ' (context), '-' (remove) or '+' (add), and sections with '@@'."
                )))
            }
        }
        i += 1;
    }
    if let Some(chunk) = current {
        chunks.push(chunk);
    }
    Ok((chunks, i))
}

/// Replaces typographic punctuation with its ASCII form, so a patch written
/// with straight quotes matches a file with curly ones and the reverse.
fn normalize_punctuation(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' => '\'',
            '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' => '"',
            '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}' | '\u{2015}' | '\u{2212}' => '-',
            '\u{00A0}' | '\u{2002}' | '\u{2003}' | '\u{2009}' | '\u{202F}' => ' ',
            other => other,
        })
        .collect::<String>()
        .trim()
        .to_string()
}

/// Where `needle` occurs in `lines` at or after `from`, trying ever looser
/// comparisons; all start lines of the first comparison that matches.
fn find(lines: &[String], needle: &[String], from: usize, at_end: bool) -> Vec<usize> {
    type Compare = fn(&str, &str) -> bool;
    let passes: [Compare; 4] = [
        |a, b| a == b,
        |a, b| a.trim_end() == b.trim_end(),
        |a, b| a.trim() == b.trim(),
        |a, b| normalize_punctuation(a) == normalize_punctuation(b),
    ];
    if needle.is_empty() {
        return vec![if at_end { lines.len() } else { from }];
    }
    if needle.len() > lines.len() {
        return Vec::new();
    }
    for compare in passes {
        let candidates: Vec<usize> =
            if at_end { vec![lines.len() - needle.len()] } else { (from..=lines.len() - needle.len()).collect() };
        let found: Vec<usize> = candidates
            .into_iter()
            .filter(|&start| start >= from && needle.iter().enumerate().all(|(k, n)| compare(&lines[start + k], n)))
            .collect();
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

/// The real lines around where a chunk was probably meant to go, numbered.
fn show_near(lines: &[String], expected: &[String]) -> String {
    let first = expected.iter().find(|l| !l.trim().is_empty()).cloned().unwrap_or_default();
    let best = lines
        .iter()
        .enumerate()
        .max_by_key(|(_, line)| common_words(line, &first))
        .map(|(index, _)| index)
        .unwrap_or(0);
    let start = best.saturating_sub(MISS_CONTEXT_LINES / 2);
    let end = (start + MISS_CONTEXT_LINES).min(lines.len());
    lines[start..end].iter().enumerate().map(|(k, line)| format!("{:>6}\t{line}\n", start + k + 1)).collect()
}

fn common_words(a: &str, b: &str) -> usize {
    let words: std::collections::HashSet<&str> = b.split_whitespace().collect();
    a.split_whitespace().filter(|w| words.contains(w)).count()
}

/// Whether context lines look copied from `nl`, `cat -n` or `grep -n` output.
fn has_line_number_prefixes(expected: &[String]) -> bool {
    let numbered = |line: &String| {
        let trimmed = line.trim_start();
        let digits = trimmed.chars().take_while(char::is_ascii_digit).count();
        digits > 0 && matches!(trimmed[digits..].chars().next(), Some('\t') | Some(':') | Some('|'))
    };
    let lines: Vec<&String> = expected.iter().filter(|l| !l.trim().is_empty()).collect();
    !lines.is_empty() && lines.iter().all(|l| numbered(l))
}

/// The result of updating one file's text.
struct Updated {
    text: String,
    /// Other places chunks also matched, 1-based lines, for the report.
    ambiguous: Vec<(usize, Vec<usize>)>,
}

fn apply_chunks(path: &str, original: &str, chunks: &[Chunk]) -> Result<Updated, PatchError> {
    let mut lines: Vec<String> = original.lines().map(str::to_string).collect();
    let mut cursor = 0;
    let mut ambiguous = Vec::new();
    for (index, chunk) in chunks.iter().enumerate() {
        let number = index + 1;
        if let Some(anchor) = &chunk.anchor {
            let found = find(&lines, std::slice::from_ref(anchor), cursor, false);
            match found.first() {
                Some(&at) => cursor = at + 1,
                None => {
                    return Err(error(format!(
                        "apply_patch changed nothing: in '{path}', the '@@ {anchor}' line of chunk {number} is not in the file.\nLines of '{path}' nearest to it:\n{}",
                        show_near(&lines, std::slice::from_ref(anchor))
                    )))
                }
            }
        }
        let old = chunk.old();
        // A pure addition goes right after its anchor, or at the end.
        let at_end = chunk.end_of_file || (old.is_empty() && chunk.anchor.is_none());
        let found = find(&lines, &old, cursor, at_end);
        let Some(&at) = found.first() else {
            let mut message = format!(
                "apply_patch changed nothing: chunk {number} of '{path}' does not match the file. The lines it expects:\n{}\nThe file's real lines nearest to them:\n{}",
                old.iter().map(|l| format!("\t{l}\n")).collect::<String>(),
                show_near(&lines, &old)
            );
            if has_line_number_prefixes(&old) {
                message.push_str("The expected lines start with line numbers, as copied from `nl`, `cat -n` or `grep -n` output; those numbers are not in the file. Copy the lines without them.\n");
            }
            return Err(error(message));
        };
        if found.len() > 1 && !chunk.end_of_file {
            ambiguous.push((number, found[1..].iter().map(|l| l + 1).collect()));
        }
        let replacement = chunk.replacement(&lines[at..at + old.len()]);
        cursor = at + replacement.len();
        lines.splice(at..at + old.len(), replacement);
    }
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    Ok(Updated { text, ambiguous })
}

/// What applying a patch did, for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub report: String,
    /// Paths written (added, updated or moved to), for syntax checks and artifacts.
    pub written: Vec<String>,
}

enum Planned {
    Write { path: String, text: String },
    Remove { path: String },
}

/// Applies a patch to the files beneath `dir`, all or nothing. Every path
/// goes through the handle: a link anywhere is refused, never followed.
pub fn apply(dir: &DirHandle, patch: &str) -> Result<Applied, PatchError> {
    let changes = parse(patch)?;
    let refused = |err: FsError| error(format!("apply_patch changed nothing: {err}."));
    // The normalized spelling (`a//b/./c` is `a/b/c`), so two spellings of
    // one file are one key.
    let key = |path: &str| -> Result<String, PatchError> {
        path_guard::check_lexical(path)
            .map(|segments| segments.join("/"))
            .map_err(|err| error(format!("apply_patch changed nothing: {err}.")))
    };
    let on_disk = |path: &str| -> Result<bool, PatchError> {
        match dir.kind(path).map_err(refused)? {
            None => Ok(false),
            Some(Kind::File { .. }) => Ok(true),
            Some(Kind::Link) => Err(refused(FsError::Link { path: path.to_string(), link: path.to_string() })),
            Some(Kind::Folder) => Err(error(format!("apply_patch changed nothing: '{path}' is a folder."))),
            Some(Kind::Other) => Err(refused(FsError::NotAFile {
                path: path.to_string(),
                what: "a special file (a pipe, socket or device)",
            })),
        }
    };
    let read = |path: &str| -> Result<String, PatchError> {
        let bytes = dir.read(path, FILE_TOOL_MAX_BYTES).map_err(|err| match err {
            FsError::NotFound { .. } => error(format!(
                "apply_patch changed nothing: '{path}' does not exist. Create it with '*** Add File: {path}'."
            )),
            FsError::TooLarge { bytes, cap, .. } => error(format!(
                "apply_patch changed nothing: '{path}' is {bytes} bytes, more than the {cap} bytes apply_patch loads. Change it with shell commands (sed, a script) instead."
            )),
            other => refused(other),
        })?;
        String::from_utf8(bytes).map_err(|_| error(format!("apply_patch changed nothing: '{path}' is not UTF-8 text.")))
    };
    // The state of every touched path after the patch, computed in memory.
    let mut state: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut plan: Vec<Planned> = Vec::new();
    let mut report = String::from("Applied the patch:\n");
    let mut written = Vec::new();
    let exists = |state: &BTreeMap<String, Option<String>>, target: &str| -> Result<bool, PatchError> {
        match state.get(target) {
            Some(content) => Ok(content.is_some()),
            None => on_disk(target),
        }
    };
    for change in &changes {
        match change {
            FileChange::Add { path, content } => {
                let target = key(path)?;
                if exists(&state, &target)? {
                    return Err(error(format!(
                        "apply_patch changed nothing: '{path}' already exists. Change it with '*** Update File: {path}'."
                    )));
                }
                state.insert(target.clone(), Some(content.clone()));
                plan.push(Planned::Write { path: target, text: content.clone() });
                report.push_str(&format!("  added {path}\n"));
                written.push(path.clone());
            }
            FileChange::Delete { path } => {
                let target = key(path)?;
                if !exists(&state, &target)? {
                    return Err(error(format!(
                        "apply_patch changed nothing: '{path}' does not exist, so it cannot be deleted."
                    )));
                }
                state.insert(target.clone(), None);
                plan.push(Planned::Remove { path: target });
                report.push_str(&format!("  deleted {path}\n"));
            }
            FileChange::Update { path, move_to, chunks } => {
                let target = key(path)?;
                let original = match state.get(&target) {
                    Some(Some(text)) => text.clone(),
                    Some(None) => {
                        return Err(error(format!(
                            "apply_patch changed nothing: '{path}' was deleted earlier in this patch."
                        )))
                    }
                    None => read(&target)?,
                };
                let updated = apply_chunks(path, &original, chunks)?;
                let destination = match move_to {
                    Some(to) => {
                        let moved = key(to)?;
                        if moved != target && exists(&state, &moved)? {
                            return Err(error(format!(
                                "apply_patch changed nothing: '{path}' cannot move to '{to}', which already exists."
                            )));
                        }
                        state.insert(target.clone(), None);
                        plan.push(Planned::Remove { path: target.clone() });
                        moved
                    }
                    None => target.clone(),
                };
                state.insert(destination.clone(), Some(updated.text.clone()));
                plan.push(Planned::Write { path: destination, text: updated.text });
                match move_to {
                    Some(to) => {
                        report.push_str(&format!("  moved {path} to {to}\n"));
                        written.push(to.clone());
                    }
                    None => {
                        report.push_str(&format!("  updated {path}\n"));
                        written.push(path.clone());
                    }
                }
                for (chunk, others) in updated.ambiguous {
                    let lines: Vec<String> = others.iter().map(usize::to_string).collect();
                    report.push_str(&format!(
                        "    chunk {chunk} also matched at line(s) {}; it was applied at the first match\n",
                        lines.join(", ")
                    ));
                }
            }
        }
    }
    commit(dir, plan)?;
    report.push_str("The files now hold these changes; there is no need to read them back.\n");
    Ok(Applied { report, written })
}

/// Writes the planned changes. Every new content is staged under a random
/// name beside its target first; only when all are staged are removals and
/// renames done, so a failure while writing leaves the originals. A staged
/// file that is not committed removes itself.
fn commit(dir: &DirHandle, plan: Vec<Planned>) -> Result<(), PatchError> {
    let io = |err: FsError| error(format!("apply_patch changed nothing: the workspace could not be written ({err})."));
    let mut staged = Vec::new();
    let mut targets = Vec::new();
    for step in &plan {
        if let Planned::Write { path, text } = step {
            staged.push(dir.stage(path, text.as_bytes()).map_err(io)?);
            targets.push(path.clone());
        }
    }
    // Removals first (a move frees its source), then the renames.
    for step in &plan {
        if let Planned::Remove { path } = step {
            if !targets.contains(path) {
                match dir.remove_file(path) {
                    Ok(()) | Err(FsError::NotFound { .. }) => {}
                    Err(err) => return Err(io(err)),
                }
            }
        }
    }
    for file in staged {
        dir.commit(file, true).map_err(io)?;
    }
    Ok(())
}
