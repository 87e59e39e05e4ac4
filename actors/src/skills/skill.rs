//! One loaded skill: its manifest, its files and where it came from.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::GlobSet;

use super::manifest::{parse_manifest, Manifest, ManifestError};
use super::scan::{scan_skill, FileToScan, Finding, Rules, Severity};
use crate::path_guard;

/// Largest SKILL.md that is parsed.
pub const MAX_SKILL_MD_BYTES: u64 = 4 * 1024 * 1024;
/// Most files one skill directory may hold.
pub const MAX_SKILL_FILES: usize = 4096;
/// Most bytes one skill directory may hold.
pub const MAX_SKILL_BYTES: u64 = 256 * 1024 * 1024;
/// Bytes read from the start of a file to tell text from binary.
const TEXT_SNIFF_BYTES: usize = 8192;

/// How a skill reached the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Found by scanning a root the operator configured.
    Discovered,
    /// Uploaded at runtime into the install directory; can be deleted.
    Installed,
    /// Brought by one request (`skills_inline`); never in the registry,
    /// and gone with the request.
    Request,
}

/// What a bundled file is for, by the Agent Skills conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Script,
    Reference,
    Asset,
    Other,
}

/// A file inside a skill (SKILL.md itself is not listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    /// Relative to the skill root, `/`-separated.
    pub path: String,
    pub bytes: u64,
    pub kind: FileKind,
    /// Whether it reads as UTF-8 text.
    pub text: bool,
}

/// A loaded skill.
#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    pub manifest: Manifest,
    /// The skill directory, canonical.
    pub root: PathBuf,
    pub files: Vec<SkillFile>,
    /// All bytes, SKILL.md included.
    pub bytes: u64,
    pub origin: Origin,
    /// The newest modification time of any file.
    pub modified: SystemTime,
    /// Manifest warnings plus any about the directory.
    pub warnings: Vec<String>,
    /// What the static scan found (`scan`).
    pub findings: Vec<Finding>,
}

impl Skill {
    /// The most severe finding's severity, if any.
    pub fn risk(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.severity).max()
    }
}

impl Skill {
    /// The id clients use: the skill's name.
    pub fn id(&self) -> &str {
        &self.manifest.name
    }
}

/// Classifies a file by its folder and type.
pub fn classify(path: &str) -> FileKind {
    let first = path.split('/').next().unwrap_or_default();
    let extension = path.rsplit_once('.').map(|(_, ext)| ext.to_ascii_lowercase()).unwrap_or_default();
    const SCRIPTS: [&str; 14] =
        ["py", "sh", "bash", "zsh", "js", "mjs", "cjs", "ts", "rb", "pl", "php", "lua", "ps1", "bat"];
    const MARKDOWN: [&str; 3] = ["md", "markdown", "mdx"];
    const BINARY: [&str; 24] = [
        "png", "jpg", "jpeg", "gif", "webp", "ico", "bmp", "pdf", "ttf", "otf", "woff", "woff2", "zip", "gz", "tgz",
        "tar", "mp3", "mp4", "wav", "ogg", "docx", "xlsx", "pptx", "bin",
    ];
    let under = |dirs: &[&str]| path.contains('/') && dirs.contains(&first);
    if under(&["scripts"]) || SCRIPTS.contains(&extension.as_str()) {
        FileKind::Script
    } else if under(&["references", "reference"]) || MARKDOWN.contains(&extension.as_str()) {
        FileKind::Reference
    } else if under(&["assets"]) || BINARY.contains(&extension.as_str()) {
        FileKind::Asset
    } else {
        FileKind::Other
    }
}

/// The bytes of every file under `dir`, links not followed (a folder being
/// adopted into versions, whose skill may not load).
pub fn folder_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => folder_bytes(&entry.path()),
            Ok(t) if t.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// Whether bytes look like text: valid UTF-8 (a character cut at the end is
/// fine) and no NUL.
fn looks_like_text(bytes: &[u8]) -> bool {
    if bytes.contains(&0) {
        return false;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(err) => err.error_len().is_none(),
    }
}

/// Why a skill does not load: the registry lists it among its errors while
/// the others load, and an upload is refused with this sentence.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// Its folder or its SKILL.md is refused by the path guard.
    #[error(transparent)]
    Path(#[from] path_guard::PathError),
    #[error("SKILL.md is {0} bytes; the limit is {MAX_SKILL_MD_BYTES} bytes (4 MB)")]
    ManifestTooLarge(u64),
    /// It grew past the limit while it was read.
    #[error("SKILL.md is larger than the limit of {MAX_SKILL_MD_BYTES} bytes (4 MB)")]
    ManifestGrew,
    #[error("SKILL.md cannot be read: {0}")]
    Unreadable(std::io::Error),
    #[error("SKILL.md is not valid UTF-8 text")]
    NotUtf8,
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{} cannot be listed: {source}", dir.display())]
    Unlistable { dir: PathBuf, source: std::io::Error },
    #[error("the skill holds more than {MAX_SKILL_FILES} files")]
    TooManyFiles,
    #[error("the skill's files total more than {MAX_SKILL_BYTES} bytes (256 MB)")]
    TooLarge,
}

/// Loads the skill in `dir`. `skip` names folders never indexed.
pub fn load_skill(dir: &Path, origin: Origin, skip: &GlobSet) -> Result<Skill, SkillError> {
    let root = path_guard::canonical_root(dir)?;
    let opened = path_guard::open_file(&root, "SKILL.md")?;
    if opened.len > MAX_SKILL_MD_BYTES {
        return Err(SkillError::ManifestTooLarge(opened.len));
    }
    let mut raw = Vec::new();
    opened.file.take(MAX_SKILL_MD_BYTES + 1).read_to_end(&mut raw).map_err(SkillError::Unreadable)?;
    if raw.len() as u64 > MAX_SKILL_MD_BYTES {
        return Err(SkillError::ManifestGrew);
    }
    let text = String::from_utf8(raw).map_err(|_| SkillError::NotUtf8)?;
    let dir_name = root.file_name().map(|n| n.to_string_lossy().into_owned());
    let manifest = parse_manifest(&text, dir_name.as_deref())?;
    let mut warnings = manifest.warnings.clone();
    let mut listing = Listing {
        files: Vec::new(),
        bytes: text.len() as u64,
        modified: modified(&root.join("SKILL.md")),
        warnings: Vec::new(),
    };
    list_files(&root, &root, skip, &mut listing)?;
    warnings.append(&mut listing.warnings);
    listing.files.sort_by(|a, b| a.path.cmp(&b.path));
    let to_scan: Vec<FileToScan<'_>> = listing.files.iter().map(FileToScan::from).collect();
    let findings = scan_skill(&root, &text, &to_scan, Rules::built_in());
    Ok(Skill {
        manifest,
        root,
        files: listing.files,
        bytes: listing.bytes,
        origin,
        modified: listing.modified,
        warnings,
        findings,
    })
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH)
}

struct Listing {
    files: Vec<SkillFile>,
    bytes: u64,
    modified: SystemTime,
    warnings: Vec<String>,
}

/// Indexes every file under `dir` through the path guard; links are served
/// only while they stay inside, and linked folders are not followed (they
/// would list files twice or loop).
fn list_files(root: &Path, dir: &Path, skip: &GlobSet, listing: &mut Listing) -> Result<(), SkillError> {
    let entries = std::fs::read_dir(dir).map_err(|source| SkillError::Unlistable { dir: dir.to_path_buf(), source })?;
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let Ok(relative) = path.strip_prefix(root) else { continue };
        let relative = relative.to_string_lossy().replace('\\', "/");
        if skip.is_match(entry.file_name()) {
            continue;
        }
        let Ok(file_type) = entry.file_type() else { continue };
        if file_type.is_dir() {
            list_files(root, &path, skip, listing)?;
            continue;
        }
        if relative == "SKILL.md" {
            continue;
        }
        if file_type.is_symlink() && std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            listing.warnings.push(format!("'{relative}' is a link to a folder and is not indexed"));
            continue;
        }
        let opened = match path_guard::open_file(root, &relative) {
            Ok(opened) => opened,
            Err(err) => {
                listing.warnings.push(format!("{err}; it is not served"));
                continue;
            }
        };
        if listing.files.len() >= MAX_SKILL_FILES {
            return Err(SkillError::TooManyFiles);
        }
        listing.bytes += opened.len;
        if listing.bytes > MAX_SKILL_BYTES {
            return Err(SkillError::TooLarge);
        }
        let mut head = Vec::with_capacity(TEXT_SNIFF_BYTES);
        let text = opened.file.take(TEXT_SNIFF_BYTES as u64).read_to_end(&mut head).is_ok() && looks_like_text(&head);
        listing.modified = listing.modified.max(modified(&path));
        listing.files.push(SkillFile {
            kind: classify(&opened.relative),
            path: opened.relative,
            bytes: opened.len,
            text,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let cases = [
            ("scripts/run.txt", FileKind::Script),
            ("tools/convert.py", FileKind::Script),
            ("build.sh", FileKind::Script),
            ("references/forms.md", FileKind::Reference),
            ("reference/api.txt", FileKind::Reference),
            ("examples/guide.md", FileKind::Reference),
            ("README.md", FileKind::Reference),
            ("assets/template.txt", FileKind::Asset),
            ("logo.png", FileKind::Asset),
            ("data/table.csv", FileKind::Other),
            ("LICENSE.txt", FileKind::Other),
            ("scripts", FileKind::Other),
        ];
        for (path, kind) in cases {
            assert_eq!(classify(path), kind, "{path}");
        }
    }

    #[test]
    fn text_sniffing() {
        assert!(looks_like_text(b"hello"));
        assert!(looks_like_text("é".as_bytes()));
        assert!(looks_like_text(&"é".as_bytes()[..1]));
        assert!(!looks_like_text(b"PNG\0\x01"));
        assert!(!looks_like_text(b"\xff\xfe"));
    }
}
