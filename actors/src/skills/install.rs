//! Installing a skill from an uploaded ZIP archive.
//!
//! An entry name is attacker-controlled text, so no extraction helper is
//! trusted with it: every name goes through the path guard, the same check
//! that confines the model's reads, so extraction and reading agree on one
//! definition of "inside the skill". Sizes are counted on the decompressed
//! stream, never taken from the archive's headers, which a crafted upload
//! simply lies about. The skill is extracted into a temporary folder,
//! validated, and only then renamed into place, so a failed install leaves
//! nothing behind and never touches an installed skill.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::registry::{skip_set, Snapshot};
use super::scan::{archive_mode_findings, summarize, Finding, Policy, Rules};
use super::skill::{load_skill, Origin};
use crate::path_guard;

/// Largest decompressed size of one entry.
pub const MAX_ENTRY_BYTES: u64 = 64 * 1024 * 1024;
/// Largest decompressed size of a whole archive.
pub const MAX_ARCHIVE_BYTES: u64 = 256 * 1024 * 1024;
/// Most entries in one archive.
pub const MAX_ENTRIES: usize = 4096;
/// Highest decompressed-to-compressed ratio of an entry before it counts as
/// a decompression bomb.
pub const MAX_COMPRESSION_RATIO: u64 = 200;
/// Entries smaller than this are exempt from the ratio check: a few
/// kilobytes of repetitive text legitimately compress better than 200×, and
/// a bomb needs size to do harm.
pub const RATIO_CHECK_MIN_BYTES: u64 = 1024 * 1024;

/// The guards, as one value so tests can exercise them at smaller sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZipLimits {
    pub max_entry_bytes: u64,
    pub max_archive_bytes: u64,
    pub max_entries: usize,
    pub max_ratio: u64,
}

impl Default for ZipLimits {
    fn default() -> Self {
        ZipLimits {
            max_entry_bytes: MAX_ENTRY_BYTES,
            max_archive_bytes: MAX_ARCHIVE_BYTES,
            max_entries: MAX_ENTRIES,
            max_ratio: MAX_COMPRESSION_RATIO,
        }
    }
}

/// Why an install failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// The archive is malformed, hostile, or holds no single valid skill (HTTP 400).
    #[error("{0}")]
    Rejected(String),
    /// A skill of that name exists and may not be replaced (HTTP 409).
    #[error("{0}")]
    Conflict(String),
    /// The install directory could not be written (HTTP 500).
    #[error("{0}")]
    Io(String),
    /// The scan found what the install policy refuses (HTTP 422); the
    /// findings travel with the refusal so the uploader sees each one.
    #[error("{message}")]
    Unsafe { message: String, findings: Vec<Finding> },
}

fn rejected(message: impl Into<String>) -> InstallError {
    InstallError::Rejected(message.into())
}

/// One file to extract: where it goes inside the skill, and its entry index.
struct Planned {
    index: usize,
    relative: String,
    mode: Option<u32>,
}

/// Names an archive tool adds that are never part of a skill.
fn is_junk(name: &str) -> bool {
    name.split('/').any(|segment| segment == "__MACOSX" || segment == ".DS_Store" || segment.starts_with("._"))
}

/// The entry count the archive's end-of-central-directory record declares
/// (its ZIP64 record when the count does not fit 16 bits). Reads only the
/// archive's tail and, for ZIP64, the record its locator points at.
fn listed_entries<R: Read + Seek>(archive: &mut R) -> Option<u64> {
    const EOCD: [u8; 4] = [0x50, 0x4b, 0x05, 0x06];
    const ZIP64_LOCATOR: [u8; 4] = [0x50, 0x4b, 0x06, 0x07];
    const ZIP64_EOCD: [u8; 4] = [0x50, 0x4b, 0x06, 0x06];
    let len = archive.seek(SeekFrom::End(0)).ok()?;
    // The record is 22 bytes plus a comment of at most 65535 bytes, and a
    // ZIP64 locator of 20 bytes sits right before it.
    let tail_len = len.min(22 + 65535 + 20);
    archive.seek(SeekFrom::Start(len - tail_len)).ok()?;
    let mut tail = vec![0u8; tail_len as usize];
    archive.read_exact(&mut tail).ok()?;
    let at = (0..tail.len().saturating_sub(21)).rev().find(|&i| tail[i..i + 4] == EOCD)?;
    let count = u16::from_le_bytes([tail[at + 10], tail[at + 11]]);
    if count != u16::MAX {
        return Some(u64::from(count));
    }
    let locator = tail.get(at.checked_sub(20)?..at)?;
    if locator[..4] != ZIP64_LOCATOR {
        return None;
    }
    let offset = u64::from_le_bytes(locator[8..16].try_into().ok()?);
    archive.seek(SeekFrom::Start(offset)).ok()?;
    let mut record = [0u8; 40];
    archive.read_exact(&mut record).ok()?;
    if record[..4] != ZIP64_EOCD {
        return None;
    }
    Some(u64::from_le_bytes(record[32..40].try_into().ok()?))
}

/// Whether `written` decompressed bytes from `compressed` bytes exceed the
/// ratio, for entries large enough to matter.
pub fn looks_like_bomb(written: u64, compressed: u64, max_ratio: u64) -> bool {
    written >= RATIO_CHECK_MIN_BYTES && written > compressed.max(1).saturating_mul(max_ratio)
}

/// A skill that went in: its name, its new version, and the folders of the
/// versions that left its history (removed once no turn reads them).
#[derive(Debug)]
pub struct Installed {
    pub name: String,
    pub version: u32,
    pub retired: Vec<PathBuf>,
}

/// `sha256:<hex>` of everything `reader` holds, from its start.
fn digest_of<R: Read + Seek>(reader: &mut R) -> Result<String, InstallError> {
    use sha2::Digest;
    let io = |err: std::io::Error| InstallError::Io(format!("cannot read the upload: {err}"));
    reader.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(reader, &mut hasher).map_err(io)?;
    reader.seek(SeekFrom::Start(0)).map_err(io)?;
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

/// How one install goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOptions {
    /// Replace a skill of the same name (its old version stays in the history).
    pub overwrite: bool,
    /// The name the archive's skill must have: set when the install is a
    /// new version of that skill, so an archive naming another skill can
    /// never replace it.
    pub name: Option<String>,
    pub limits: ZipLimits,
    /// Previous versions kept (`--skills-keep-versions`).
    pub keep: usize,
    /// What the scan's findings may stop.
    pub policy: Policy,
}

impl Default for InstallOptions {
    fn default() -> Self {
        InstallOptions {
            overwrite: false,
            name: None,
            limits: ZipLimits::default(),
            keep: super::versions::DEFAULT_KEEP_VERSIONS,
            policy: Policy::Strict,
        }
    }
}

/// Installs the skill in `archive` into `install_dir` as its newest
/// version (see `versions`). `current` is the registry as it is now, for
/// conflicts. The skill is scanned in its staging folder, so one the policy
/// refuses never reaches the install folder.
pub fn install_archive<R: Read + Seek>(
    mut archive: R,
    install_dir: &Path,
    current: &Snapshot,
    options: InstallOptions,
) -> Result<Installed, InstallError> {
    let InstallOptions { overwrite, name: expected, limits, keep, policy } = options;
    let digest = digest_of(&mut archive)?;
    // The ZIP reader keys entries by name, so a repeated name would silently
    // hide all but one copy; the central directory's own count tells.
    let listed = listed_entries(&mut archive);
    archive.seek(SeekFrom::Start(0)).map_err(|err| InstallError::Io(format!("cannot read the upload: {err}")))?;
    let mut zip = zip::ZipArchive::new(archive)
        .map_err(|err| rejected(format!("the upload is not a readable ZIP archive: {err}")))?;
    if let Some(listed) = listed {
        if listed != zip.len() as u64 {
            return Err(rejected(format!(
                "the archive lists {listed} entries but only {} distinct names: it repeats a name",
                zip.len()
            )));
        }
    }
    if zip.len() > limits.max_entries {
        return Err(rejected(format!(
            "the archive has {} entries; at most {} are accepted",
            zip.len(),
            limits.max_entries
        )));
    }
    let mut names = HashSet::new();
    let mut files: Vec<(usize, String, Option<u32>)> = Vec::new();

    for index in 0..zip.len() {
        let entry = zip.by_index_raw(index).map_err(|err| rejected(format!("entry {index} cannot be read: {err}")))?;
        let raw = entry.name_raw().to_vec();
        let name = String::from_utf8(raw).map_err(|_| rejected(format!("entry {index}'s name is not UTF-8 text")))?;
        if is_junk(&name) {
            continue;
        }
        if entry.encrypted() {
            return Err(rejected(format!("'{name}' is encrypted; encrypted archives are not accepted")));
        }
        let mode = entry.unix_mode();
        let file_type = mode.map(|m| m & 0o170000).unwrap_or(0);
        if entry.is_symlink() || file_type == 0o120000 {
            return Err(rejected(format!("'{name}' is a symbolic link; links are not accepted in a skill archive")));
        }
        let is_dir = entry.is_dir();
        if !matches!(file_type, 0 | 0o100000 | 0o040000) {
            return Err(rejected(format!("'{name}' is not a regular file or folder")));
        }
        let trimmed = name.trim_end_matches('/');
        let segments = path_guard::check_lexical(trimmed).map_err(|err| rejected(err.to_string()))?;
        let normalized = segments.join("/");
        if !names.insert(normalized.clone()) {
            return Err(rejected(format!("the archive holds '{normalized}' twice")));
        }
        if !is_dir {
            files.push((index, normalized, mode));
        }
    }
    let planned = plan_layout(files)?;

    let staging = tempfile::Builder::new().prefix(".upload-").tempdir_in(install_dir).map_err(|err| {
        InstallError::Io(format!("cannot create a staging folder in {}: {err}", install_dir.display()))
    })?;
    let skill_root = staging.path().join("skill");
    std::fs::create_dir(&skill_root).map_err(|err| InstallError::Io(format!("cannot stage the upload: {err}")))?;
    extract(&mut zip, &planned, &skill_root, limits)?;

    let skill = load_skill(&skill_root, Origin::Installed, &skip_set())
        .map_err(|err| rejected(format!("the archive's skill does not load: {err}")))?;
    let name = skill.id().to_string();
    if let Some(expected) = expected.filter(|expected| *expected != name) {
        return Err(rejected(format!(
            "the archive holds the skill '{name}', not '{expected}'; a skill's name is the name in its SKILL.md, and a new version keeps it"
        )));
    }
    let mut findings = skill.findings.clone();
    // Modes as the archive declares them: extraction drops setuid, so the
    // scan of the extracted folder cannot see that one was asked for.
    let declared: Vec<(String, u32)> =
        planned.iter().filter_map(|file| file.mode.map(|mode| (file.relative.clone(), mode))).collect();
    findings.extend(archive_mode_findings(&declared, Rules::built_in()));
    let refusals = policy.refusals(&findings);
    if !refusals.is_empty() {
        return Err(InstallError::Unsafe {
            message: format!("the skill '{name}' is refused by the strict install policy: {}", summarize(&refusals)),
            findings,
        });
    }
    let target = install_dir.join(&name);
    let existing = match current.get(&name) {
        Some(existing) if existing.origin == Origin::Discovered => {
            return Err(InstallError::Conflict(format!(
                "a skill named '{name}' is already provided by {}; an upload cannot replace it",
                existing.root.display()
            )))
        }
        Some(existing) => Some(existing.root.clone()),
        // A folder (or link) of that name that did not load is still in the way.
        None => std::fs::symlink_metadata(&target).is_ok().then(|| target.clone()),
    };
    if existing.is_some() && !overwrite {
        return Err(InstallError::Conflict(format!(
            "a skill named '{name}' is already installed; send overwrite=true to replace it"
        )));
    }
    // The new version goes in beside the old ones and the live link swaps
    // in one step; the previous version stays in the history.
    let (version, retired) = super::versions::place(install_dir, &name, &skill_root, digest, skill.bytes, keep)
        .map_err(|err| InstallError::Io(format!("cannot put '{name}' in place: {err}")))?;
    // `staging` is removed when it drops.
    Ok(Installed { name, version, retired })
}

/// Decides the archive's shape: a bare `SKILL.md` at the root, or one folder
/// holding `SKILL.md`. Returns each file's path inside the skill.
fn plan_layout(files: Vec<(usize, String, Option<u32>)>) -> Result<Vec<Planned>, InstallError> {
    if files.is_empty() {
        return Err(rejected("the archive is empty"));
    }
    if files.iter().any(|(_, name, _)| name == "SKILL.md") {
        return Ok(files.into_iter().map(|(index, relative, mode)| Planned { index, relative, mode }).collect());
    }
    let mut skill_dirs: Vec<&str> = files
        .iter()
        .filter_map(|(_, name, _)| name.strip_suffix("/SKILL.md"))
        .filter(|dir| !dir.contains('/'))
        .collect();
    skill_dirs.sort_unstable();
    let dir = match skill_dirs.as_slice() {
        [] => return Err(rejected("the archive holds no SKILL.md, at its root or in one folder")),
        [one] => one.to_string(),
        several => {
            return Err(rejected(format!(
                "the archive holds {} skills ({}); upload one skill per archive",
                several.len(),
                several.join(", ")
            )))
        }
    };
    let prefix = format!("{dir}/");
    let mut planned = Vec::with_capacity(files.len());
    for (index, name, mode) in files {
        match name.strip_prefix(&prefix) {
            Some(relative) => planned.push(Planned { index, relative: relative.to_string(), mode }),
            None => {
                return Err(rejected(format!(
                    "'{name}' lies outside the skill folder '{dir}/'; the archive must hold one skill"
                )))
            }
        }
    }
    Ok(planned)
}

/// Writes every planned file under `root`, counting decompressed bytes.
fn extract<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    planned: &[Planned],
    root: &Path,
    limits: ZipLimits,
) -> Result<(), InstallError> {
    let mut total: u64 = 0;
    let mut buffer = vec![0u8; 64 * 1024];
    for file in planned {
        let target: PathBuf =
            path_guard::path_for_create(root, &file.relative).map_err(|err| rejected(err.to_string()))?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|err| InstallError::Io(format!("cannot stage '{}': {err}", file.relative)))?;
        }
        let mut entry =
            zip.by_index(file.index).map_err(|err| rejected(format!("'{}' cannot be read: {err}", file.relative)))?;
        let compressed = entry.compressed_size();
        let mut output = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .map_err(|err| InstallError::Io(format!("cannot stage '{}': {err}", file.relative)))?;
        let mut written: u64 = 0;
        // Never more than one byte past the limit is decompressed.
        let mut limited = (&mut entry).take(limits.max_entry_bytes + 1);
        loop {
            let n = limited
                .read(&mut buffer)
                .map_err(|err| rejected(format!("'{}' cannot be decompressed: {err}", file.relative)))?;
            if n == 0 {
                break;
            }
            written += n as u64;
            total += n as u64;
            if written > limits.max_entry_bytes {
                return Err(rejected(format!(
                    "'{}' decompresses to more than {} bytes, the limit for one file",
                    file.relative, limits.max_entry_bytes
                )));
            }
            if total > limits.max_archive_bytes {
                return Err(rejected(format!(
                    "the archive decompresses to more than {} bytes, the limit for one skill",
                    limits.max_archive_bytes
                )));
            }
            if looks_like_bomb(written, compressed, limits.max_ratio) {
                return Err(rejected(format!(
                    "'{}' expands more than {}× when decompressed; it looks like a decompression bomb",
                    file.relative, limits.max_ratio
                )));
            }
            output
                .write_all(&buffer[..n])
                .map_err(|err| InstallError::Io(format!("cannot stage '{}': {err}", file.relative)))?;
        }
        // Keep the owner's execute bit; drop setuid, setgid, sticky and
        // group/other write.
        let mode = file.mode.map_or(0o644, |m| (m & 0o755) | 0o600);
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(|err| InstallError::Io(format!("cannot stage '{}': {err}", file.relative)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_limit() {
        let compressed = 2 * RATIO_CHECK_MIN_BYTES / MAX_COMPRESSION_RATIO;
        let at_limit = compressed * MAX_COMPRESSION_RATIO;
        assert!(!looks_like_bomb(at_limit, compressed, MAX_COMPRESSION_RATIO));
        assert!(looks_like_bomb(at_limit + 1, compressed, MAX_COMPRESSION_RATIO));
        // Small entries are exempt however well they compress.
        assert!(!looks_like_bomb(RATIO_CHECK_MIN_BYTES - 1, 1, MAX_COMPRESSION_RATIO));
    }

    #[test]
    fn junk_names() {
        for junk in ["__MACOSX/pdf/._SKILL.md", "pdf/.DS_Store", "._x", "pdf/__MACOSX/a"] {
            assert!(is_junk(junk), "{junk}");
        }
        for real in ["pdf/SKILL.md", "pdf/scripts/run.py", "pdf/.hidden"] {
            assert!(!is_junk(real), "{real}");
        }
    }
}
