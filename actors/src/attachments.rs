//! Files a user attached to a message: their limits, the type their
//! content shows, the name each gets under `attachments/`, and the line the
//! prompt carries for each.
//!
//! An attachment is untrusted input twice over: its name is the sender's
//! (`../../etc/passwd`, a NUL, a terminal escape) and its content may be
//! anything (a ZIP bomb called `notes.txt`, a PDF with a script in it).
//! So the name is rebuilt from safe characters and checked by the path
//! guard as one plain component, the type comes from the content's own
//! signature and never from the name, and the content is only ever stored
//! and handed to the model or its sandboxed commands as bytes: the server
//! process unpacks, renders and runs none of it (a PDF's text, when there
//! are no sandboxed commands to read it, comes from a confined child).
//!
//! The prompt's line for an attachment is a pure function of its name, type
//! and size, and names are given in message order, so a conversation sent
//! again renders the same bytes and its KV prefix survives.

use std::collections::HashSet;

use bytes::Bytes;

/// The folder, in a workspace, that attachments are written to.
pub const ATTACHMENTS_DIR: &str = "attachments";
/// `--max-attachment-bytes` by default: the largest one file may be.
pub const DEFAULT_MAX_ATTACHMENT_BYTES: u64 = 32 * 1024 * 1024;
/// Most files one message may carry.
pub const MAX_ATTACHMENTS_PER_MESSAGE: usize = 20;
/// Most bytes of attachments one conversation (all of a request's
/// messages) may carry: what a turn holds in memory and writes to its
/// folder.
pub const MAX_CONVERSATION_ATTACHMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Most files one conversation may carry: each is a line of every prompt
/// and a file written to its folder, and empty files cost no bytes.
pub const MAX_CONVERSATION_ATTACHMENTS: usize = 100;
/// A text attachment up to this size is also written into the prompt, so
/// the model reads it without a tool call.
pub const MAX_INLINE_TEXT_BYTES: usize = 8 * 1024;
/// Longest name an attachment keeps, in characters (its extension kept).
pub const MAX_NAME_CHARS: usize = 100;

/// One attached file, checked and named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The message (index in the request's messages) it came with.
    pub message: usize,
    /// Its name under [`ATTACHMENTS_DIR`], unique in the request.
    pub name: String,
    /// What its content is (see [`media_type`]).
    pub media_type: String,
    pub content: Bytes,
    /// Its text when it is not text itself (a PDF's, read by a confined
    /// process at the edge), for a `read_file` with no working folder.
    pub extracted: Option<String>,
}

impl Attachment {
    /// Its path relative to the working folder.
    pub fn path(&self) -> String {
        format!("{ATTACHMENTS_DIR}/{}", self.name)
    }

    pub fn is_image(&self) -> bool {
        self.media_type.starts_with("image/")
    }

    /// Its content as text, when it is text.
    pub fn text(&self) -> Option<&str> {
        is_text(&self.media_type).then(|| std::str::from_utf8(&self.content).ok()).flatten()
    }

    /// What `read_file` shows of it: its text, or the text read from it.
    pub fn readable(&self) -> Option<&str> {
        self.text().or(self.extracted.as_deref())
    }

    /// The prompt's line for it (and, for a small text file, its text).
    pub fn note(&self) -> String {
        let about = format!("{} ({}, {} bytes)", self.path(), self.media_type, self.content.len());
        if self.is_image() {
            return format!(
                "[Attached image: {about}. This model cannot see images; the file is there for tools to work with.]"
            );
        }
        match self.text() {
            Some(text) if text.len() <= MAX_INLINE_TEXT_BYTES => {
                format!("[Attached file: {about}. Its text:]\n{text}\n[End of {}]", self.path())
            }
            _ => format!("[Attached file: {about}. Read it with the file tools.]"),
        }
    }
}

/// Writes each attachment to `attachments/NAME` in a working folder,
/// read-only (mode 0444), through the folder's handle (staged, then renamed
/// into place without replacing). An entry already at the name is left as
/// it is, never followed: a conversation's folder keeps its attachments
/// from turn to turn, and what a command put there is its own copy (the
/// original stays in the store). Returns how many were written.
pub fn write_into(dir: &crate::workspace::DirHandle, attachments: &[Attachment]) -> usize {
    let mut written = 0;
    for attachment in attachments {
        let path = attachment.path();
        if !matches!(dir.kind(&path), Ok(None)) {
            continue;
        }
        let put = dir
            .stage_with_mode(&path, &mut &attachment.content[..], 0o444)
            .and_then(|staged| dir.commit(staged, false));
        match put {
            Ok(()) => written += 1,
            Err(err) => tracing::warn!(%path, "an attachment was not written to the working folder: {err}"),
        }
    }
    written
}

/// Whether a type (as [`media_type`] gives it) is text a model can read.
pub fn is_text(media_type: &str) -> bool {
    media_type.starts_with("text/")
}

/// The type `content` shows: its signature (PNG, PDF, ZIP, ...), else
/// `text/plain` when it is UTF-8 without control characters, else
/// `application/octet-stream`. Never a name.
pub fn media_type(content: &[u8]) -> String {
    let mut sniffer = Sniffer::default();
    sniffer.feed(content);
    sniffer.media_type()
}

/// Bytes of the start a signature is looked for in.
const SIGNATURE_BYTES: usize = 8192;

/// [`media_type`] over a content that arrives in pieces (an upload), in
/// constant memory.
#[derive(Debug, Default)]
pub struct Sniffer {
    head: Vec<u8>,
    /// The last bytes of a piece that end inside a character.
    carry: Vec<u8>,
    /// Something not UTF-8, or a control character, was seen.
    binary: bool,
}

impl Sniffer {
    pub fn feed(&mut self, piece: &[u8]) {
        if self.head.len() < SIGNATURE_BYTES {
            let room = SIGNATURE_BYTES - self.head.len();
            self.head.extend_from_slice(&piece[..piece.len().min(room)]);
        }
        if self.binary {
            return;
        }
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(piece);
        let valid = match std::str::from_utf8(&bytes) {
            Ok(text) => text,
            // A character cut at the end of the piece waits for the next.
            Err(err) if err.error_len().is_none() => {
                let (text, rest) = bytes.split_at(err.valid_up_to());
                self.carry = rest.to_vec();
                std::str::from_utf8(text).unwrap_or_default()
            }
            Err(_) => {
                self.binary = true;
                return;
            }
        };
        let control = |c: char| c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\u{c}');
        self.binary = valid.chars().any(control);
    }

    pub fn media_type(self) -> String {
        if let Some(kind) = infer::get(&self.head) {
            return kind.mime_type().to_string();
        }
        if self.binary || !self.carry.is_empty() {
            return "application/octet-stream".into();
        }
        "text/plain".into()
    }
}

/// The usual extension of a type, for a file sent without a name.
fn extension_of(media_type: &str) -> &'static str {
    match media_type {
        "application/pdf" => "pdf",
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "application/zip" => "zip",
        "text/plain" => "txt",
        _ => "bin",
    }
}

/// A safe, unique name for an attachment the sender called `given`: the
/// last component of what it sent, with anything but letters, digits and
/// `.-_ ` turned into `_`, no leading dots, at most [`MAX_NAME_CHARS`];
/// `attachment-N.EXT` when nothing is left; `-2`, `-3`, … before the
/// extension when `taken` already has it. The result is always one plain
/// component that the path guard accepts.
pub fn safe_name(given: Option<&str>, media_type: &str, ordinal: usize, taken: &mut HashSet<String>) -> String {
    let last = given.unwrap_or_default().rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String =
        last.chars().map(|c| if c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ') { c } else { '_' }).collect();
    let cleaned = cleaned.trim_start_matches(['.', ' ']).trim_end_matches(['.', ' ']);
    let base = if cleaned.is_empty() || cleaned.chars().all(|c| c == '_') {
        format!("attachment-{ordinal}.{}", extension_of(media_type))
    } else {
        shorten(cleaned)
    };
    let (stem, extension) = match base.rfind('.') {
        Some(at) if at > 0 => (&base[..at], &base[at..]),
        _ => (base.as_str(), ""),
    };
    let mut name = base.clone();
    let mut n = 2;
    while taken.contains(&name) || crate::path_guard::check_lexical(&name).map_or(true, |parts| parts.len() != 1) {
        name = format!("{stem}-{n}{extension}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// `name` cut to [`MAX_NAME_CHARS`] characters, keeping a short extension.
fn shorten(name: &str) -> String {
    if name.chars().count() <= MAX_NAME_CHARS {
        return name.to_string();
    }
    let extension = name.rfind('.').map(|at| &name[at..]).filter(|ext| ext.chars().count() <= 10).unwrap_or("");
    let keep = MAX_NAME_CHARS - extension.chars().count();
    let stem: String = name.chars().take(keep).collect();
    format!("{}{extension}", stem.trim_end_matches(['.', ' ']))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn named(given: &[Option<&str>]) -> Vec<String> {
        let mut taken = HashSet::new();
        given.iter().enumerate().map(|(n, name)| safe_name(*name, "text/plain", n + 1, &mut taken)).collect()
    }

    #[test]
    fn hostile_names_become_one_plain_component() {
        let names = named(&[
            Some("../../etc/passwd"),
            Some("/etc/shadow"),
            Some("..\\..\\boot.ini"),
            Some("a\0b.txt"),
            Some("\u{1b}[31mred.txt"),
            Some(".."),
            Some("..."),
            Some(".bashrc"),
            Some("report.pdf."),
            Some(""),
            None,
            Some("notes.txt"),
            Some("notes.txt"),
            Some("dir/notes.txt"),
        ]);
        assert_eq!(
            names,
            [
                "passwd",
                "shadow",
                "boot.ini",
                "a_b.txt",
                "__31mred.txt",
                "attachment-6.txt",
                "attachment-7.txt",
                "bashrc",
                "report.pdf",
                "attachment-10.txt",
                "attachment-11.txt",
                "notes.txt",
                "notes-2.txt",
                "notes-3.txt",
            ]
        );
        for name in names {
            assert_eq!(crate::path_guard::check_lexical(&name).unwrap().len(), 1, "{name}");
        }
    }

    #[test]
    fn a_long_name_keeps_its_extension_within_the_limit() {
        let long = format!("{}.pdf", "x".repeat(300));
        let name = &named(&[Some(&long)])[0];
        assert_eq!(name.chars().count(), MAX_NAME_CHARS);
        assert!(name.ends_with(".pdf"));
        let at_limit = format!("{}.txt", "y".repeat(MAX_NAME_CHARS - 4));
        assert_eq!(named(&[Some(&at_limit)])[0], at_limit);
    }

    #[test]
    fn the_type_comes_from_the_content_not_the_name() {
        assert_eq!(media_type(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj"), "application/pdf");
        assert_eq!(media_type(b"PK\x03\x04\x14\x00\x00\x00\x08\x00"), "application/zip");
        assert_eq!(media_type(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), "image/png");
        assert_eq!(media_type(b"Dear team,\nthe totals are in.\n"), "text/plain");
        assert_eq!(media_type(b"{\"total\": 3}"), "text/plain");
        assert_eq!(media_type(b"text\0with a NUL"), "application/octet-stream");
        assert_eq!(media_type(&[0xff, 0xfe, 0x00, 0x41]), "application/octet-stream");
    }

    fn attachment(media_type: &str, content: &[u8]) -> Attachment {
        Attachment {
            message: 0,
            name: "f".into(),
            media_type: media_type.into(),
            content: Bytes::copy_from_slice(content),
            extracted: None,
        }
    }

    // A command may leave anything in its folder before the next turn: a
    // link where an attachment goes, or the folder itself a link.
    #[test]
    fn writing_attachments_follows_no_link_a_command_planted() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let folder = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let dir = crate::workspace::DirHandle::open(folder.path()).unwrap();
        let files = vec![
            Attachment { name: "a.txt".into(), ..attachment("text/plain", b"first") },
            Attachment { name: "b.txt".into(), ..attachment("text/plain", b"second") },
        ];
        std::fs::create_dir(folder.path().join(ATTACHMENTS_DIR)).unwrap();
        symlink(outside.path().join("a.txt"), folder.path().join("attachments/a.txt")).unwrap();
        assert_eq!(write_into(&dir, &files), 1, "only b.txt: a link stands at a.txt");
        assert!(!outside.path().join("a.txt").exists(), "the link was not followed");
        let written = folder.path().join("attachments/b.txt");
        assert_eq!(std::fs::read(&written).unwrap(), b"second");
        assert_eq!(std::fs::metadata(&written).unwrap().permissions().mode() & 0o777, 0o444);
        // Written again (the next turn), what is there stays.
        assert_eq!(write_into(&dir, &files), 0);

        let folder = tempfile::tempdir().unwrap();
        let dir = crate::workspace::DirHandle::open(folder.path()).unwrap();
        symlink(outside.path(), folder.path().join(ATTACHMENTS_DIR)).unwrap();
        assert_eq!(write_into(&dir, &files), 0);
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing went through the linked folder");
    }

    #[test]
    fn a_content_in_pieces_has_the_type_it_has_whole() {
        let text = "Grüße aus Köln: 3 € per line.\n".repeat(500);
        let mut zip = b"PK\x03\x04\x14\x00\x00\x00\x08\x00".to_vec();
        zip.extend(text.as_bytes());
        for content in [text.as_bytes(), &zip[..], b"ok\x00no", "é".as_bytes(), &"é".as_bytes()[..1]] {
            // Pieces of 3 bytes cut every multi-byte character somewhere.
            let mut sniffer = Sniffer::default();
            content.chunks(3).for_each(|piece| sniffer.feed(piece));
            assert_eq!(sniffer.media_type(), media_type(content), "{content:?}");
        }
        assert_eq!(media_type(text.as_bytes()), "text/plain");
        assert_eq!(media_type(&"é".as_bytes()[..1]), "application/octet-stream");
    }

    #[test]
    fn small_text_is_inlined_up_to_the_limit_and_no_further() {
        let at_limit = "a".repeat(MAX_INLINE_TEXT_BYTES);
        let note = attachment("text/plain", at_limit.as_bytes()).note();
        assert!(note.contains(&at_limit), "inlined at the limit");
        let past = "a".repeat(MAX_INLINE_TEXT_BYTES + 1);
        let note = attachment("text/plain", past.as_bytes()).note();
        assert_eq!(
            note,
            format!("[Attached file: attachments/f (text/plain, {} bytes). Read it with the file tools.]", past.len())
        );
        let image = attachment("image/png", b"\x89PNG").note();
        assert!(image.starts_with("[Attached image: attachments/f (image/png, 4 bytes). This model cannot see images"));
    }
}
