//! The single security boundary for skill files.
//!
//! Every path the model names, every file listed inside a skill and every
//! entry of an uploaded archive goes through this module before it touches
//! the filesystem. It closes three escapes, because closing only the obvious
//! one would make it worthless:
//!
//! 1. Lexical: `..`, absolute paths, `~`, UNC and drive-qualified paths,
//!    backslashes, NUL and control characters, and segments ending in `.` or
//!    a space (Windows strips those, so `run.py.` and `run.py` would name one
//!    file yet compare as two). Refused before the disk is touched, and never
//!    rewritten: a model must learn that it may not look there, not that the
//!    file is missing.
//! 2. Canonical: the joined path stays under the skill root.
//! 3. Symbolic: every existing component is resolved and re-checked, since a
//!    link on an intermediate directory (`references -> /etc`) redirects
//!    everything beneath it. On Linux the file is then opened with
//!    `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the root as a
//!    second, kernel-enforced layer, and only regular files with a single
//!    link are served (a hard link could name a file outside the skill).
//!
//! Paths compare component by component with ordinal (byte) equality, the
//! case rule of Linux filesystems.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// Why a path was refused. The message is one sentence a model can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Refused on its spelling alone.
    #[error("the path '{path}' is not allowed: {reason}")]
    NotAllowed { path: String, reason: &'static str },
    /// It resolves outside the skill through a symbolic link.
    #[error("the path '{path}' is not allowed: it leads outside the skill through a symbolic link")]
    Escapes { path: String },
    /// It goes through a chain of links that never ends.
    #[error("the path '{path}' is not allowed: it goes through a symbolic link loop")]
    Loop { path: String },
    /// Nothing is there.
    #[error("'{path}' does not exist in this skill")]
    NotFound { path: String },
    /// Something is there, but not a regular file.
    #[error("'{path}' is {what}, not a regular file")]
    NotAFile { path: String, what: &'static str },
    /// A regular file with more than one name.
    #[error("the path '{path}' is not allowed: it is a hard link, which could point at a file outside the skill")]
    HardLinked { path: String },
    /// The filesystem failed.
    #[error("'{path}' cannot be read: {error}")]
    Io { path: String, error: String },
}

/// A file opened through the guard.
#[derive(Debug)]
pub struct OpenedFile {
    pub file: File,
    pub len: u64,
    /// The path relative to the skill root, `/`-separated.
    pub relative: String,
}

/// Checks a requested path's spelling and returns its segments. `.` segments
/// and empty segments (`a//b`) are dropped; everything else is kept as is.
pub fn check_lexical(requested: &str) -> Result<Vec<&str>, PathError> {
    let refuse = |reason| Err(PathError::NotAllowed { path: requested.to_string(), reason });
    if requested.chars().any(|c| c == '\0' || c.is_control()) {
        return refuse("it contains a NUL or control character");
    }
    if requested.contains('\\') {
        return refuse("it contains a backslash; use '/' between folders");
    }
    if requested.starts_with('/') {
        return refuse("it is absolute; give a path relative to the skill folder");
    }
    if requested.starts_with('~') {
        return refuse("it starts with '~'; give a path relative to the skill folder");
    }
    let bytes = requested.as_bytes();
    if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        return refuse("it is a drive-qualified path; give a path relative to the skill folder");
    }
    let mut segments = Vec::new();
    for segment in requested.split('/') {
        match segment {
            "" | "." => continue,
            ".." => return refuse("it climbs out of the skill folder with '..'"),
            s if s.ends_with('.') || s.ends_with(' ') => {
                return refuse("a folder or file name in it ends with '.' or a space")
            }
            s => segments.push(s),
        }
    }
    if segments.is_empty() {
        return refuse("it names no file");
    }
    Ok(segments)
}

/// Resolves `segments` under `root` (canonical), following links only while
/// they stay inside. Returns the canonical target, or where it would be
/// created when `for_create` and the tail does not exist yet.
fn resolve(root: &Path, requested: &str, segments: &[&str], for_create: bool) -> Result<PathBuf, PathError> {
    let escapes = || PathError::Escapes { path: requested.to_string() };
    let mut current = root.to_path_buf();
    for (index, segment) in segments.iter().enumerate() {
        let next = current.join(segment);
        let metadata = match std::fs::symlink_metadata(&next) {
            Ok(metadata) => metadata,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                if for_create {
                    // The rest does not exist: it will be created under a
                    // directory already proven to be inside.
                    return Ok(segments[index..].iter().fold(current, |path, s| path.join(s)));
                }
                return Err(PathError::NotFound { path: requested.to_string() });
            }
            Err(err) => return Err(PathError::Io { path: requested.to_string(), error: err.to_string() }),
        };
        if !metadata.file_type().is_symlink() {
            current = next;
            continue;
        }
        match std::fs::canonicalize(&next) {
            Ok(target) if target.starts_with(root) => current = target,
            Ok(_) => return Err(escapes()),
            Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
                return Err(PathError::Loop { path: requested.to_string() })
            }
            // A dangling link: where would it point?
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                let target = std::fs::read_link(&next).map_err(|_| escapes())?;
                let lexical = lexically_inside(root, &current, &target);
                // Creating through a dangling link would create its target,
                // wherever that is; reading one finds nothing.
                return Err(match (lexical, for_create) {
                    (true, false) => PathError::NotFound { path: requested.to_string() },
                    (true, true) | (false, _) => escapes(),
                });
            }
            Err(err) => return Err(PathError::Io { path: requested.to_string(), error: err.to_string() }),
        }
    }
    Ok(current)
}

/// Whether a link target, taken relative to `base`, stays under `root` on
/// its spelling alone.
fn lexically_inside(root: &Path, base: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return target.starts_with(root) && !target.components().any(|c| c == Component::ParentDir);
    }
    let mut path = base.to_path_buf();
    for component in target.components() {
        match component {
            Component::ParentDir => {
                if !path.pop() || !path.starts_with(root) {
                    return false;
                }
            }
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    path.starts_with(root)
}

/// The canonical form of a skill root.
pub fn canonical_root(root: &Path) -> Result<PathBuf, PathError> {
    std::fs::canonicalize(root)
        .map_err(|err| PathError::Io { path: root.display().to_string(), error: err.to_string() })
}

/// Opens a file inside a skill for reading, through every check.
pub fn open_file(root: &Path, requested: &str) -> Result<OpenedFile, PathError> {
    let segments = check_lexical(requested)?;
    let root = canonical_root(root)?;
    let resolved = resolve(&root, requested, &segments, false)?;
    let relative = segments.join("/");
    let file = open_beneath(&root, &relative, &resolved, requested)?;
    let metadata =
        file.metadata().map_err(|err| PathError::Io { path: requested.to_string(), error: err.to_string() })?;
    let file_type = metadata.file_type();
    if !file_type.is_file() {
        let what = if file_type.is_dir() { "a folder" } else { "a special file (a pipe, socket or device)" };
        return Err(PathError::NotAFile { path: requested.to_string(), what });
    }
    if std::os::unix::fs::MetadataExt::nlink(&metadata) > 1 {
        return Err(PathError::HardLinked { path: requested.to_string() });
    }
    Ok(OpenedFile { file, len: metadata.len(), relative })
}

/// Where a new file at `requested` would be created inside `root`, after
/// every check; nothing on the way may be a link leading out.
pub fn path_for_create(root: &Path, requested: &str) -> Result<PathBuf, PathError> {
    let segments = check_lexical(requested)?;
    let root = canonical_root(root)?;
    resolve(&root, requested, &segments, true)
}

/// Opens `relative` beneath `root` with the kernel refusing any resolution
/// that leaves it. Non-blocking, so a FIFO cannot hang the open.
fn open_beneath(root: &Path, relative: &str, resolved: &Path, requested: &str) -> Result<File, PathError> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;

    let io_error = |err: io::Error| PathError::Io { path: requested.to_string(), error: err.to_string() };
    let root_c = CString::new(root.as_os_str().as_bytes()).map_err(|_| PathError::NotAllowed {
        path: requested.to_string(),
        reason: "it contains a NUL or control character",
    })?;
    let relative_c = CString::new(relative).map_err(|_| PathError::NotAllowed {
        path: requested.to_string(),
        reason: "it contains a NUL or control character",
    })?;
    // SAFETY: a plain open of a NUL-terminated path; the result is checked.
    let root_fd = unsafe { libc::open(root_c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if root_fd < 0 {
        return Err(io_error(io::Error::last_os_error()));
    }
    // SAFETY: `root_fd` was just returned by open and is owned here alone.
    let root_fd = unsafe { OwnedFd::from_raw_fd(root_fd) };
    // SAFETY: `open_how` is plain data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads `how` (sized as passed) and the NUL-terminated
    // path; the returned descriptor is checked before use.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            std::os::fd::AsRawFd::as_raw_fd(&root_fd),
            relative_c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
        return Ok(unsafe { File::from_raw_fd(fd as i32) });
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EXDEV) => Err(PathError::Escapes { path: requested.to_string() }),
        Some(libc::ELOOP) => Err(PathError::Loop { path: requested.to_string() }),
        Some(libc::ENOENT) => Err(PathError::NotFound { path: requested.to_string() }),
        // Kernels before 5.6 lack openat2; the checks above already walked
        // every component, so open the resolved path without following a
        // final link.
        Some(libc::ENOSYS) => std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(resolved)
            .map_err(io_error),
        _ => Err(io_error(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let skill = dir.path().join("skill");
        std::fs::create_dir_all(skill.join("references")).unwrap();
        std::fs::write(skill.join("SKILL.md"), "---\nname: skill\ndescription: x\n---\n").unwrap();
        std::fs::write(skill.join("references/forms.md"), "forms").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
        std::fs::create_dir_all(dir.path().join("other")).unwrap();
        std::fs::write(dir.path().join("other/SKILL.md"), "other").unwrap();
        (dir, skill)
    }

    fn refused(root: &Path, path: &str) -> String {
        match open_file(root, path) {
            Ok(opened) => panic!("'{path}' was served as {}", opened.relative),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn lexical_refusals() {
        let (_dir, skill) = setup();
        let cases = [
            ("../secret.txt", "the path '../secret.txt' is not allowed: it climbs out of the skill folder with '..'"),
            ("references/../../secret.txt", "it climbs out of the skill folder with '..'"),
            ("references/..", "it climbs out of the skill folder with '..'"),
            ("/etc/passwd", "it is absolute; give a path relative to the skill folder"),
            ("~/.ssh/id_rsa", "it starts with '~'"),
            ("~", "it starts with '~'"),
            ("\\\\server\\share\\x", "it contains a backslash"),
            ("references\\forms.md", "it contains a backslash"),
            ("C:\\Windows\\win.ini", "it contains a backslash"),
            ("C:/Windows/win.ini", "it is a drive-qualified path"),
            ("c:secret", "it is a drive-qualified path"),
            ("references/forms.md\0.txt", "it contains a NUL or control character"),
            ("references/\u{1b}[31m.md", "it contains a NUL or control character"),
            ("run.py.", "ends with '.' or a space"),
            ("references /forms.md", "ends with '.' or a space"),
            ("references/forms.md ", "ends with '.' or a space"),
            ("...", "ends with '.' or a space"),
            ("", "it names no file"),
            ("./", "it names no file"),
        ];
        for (path, expected) in cases {
            let message = refused(&skill, path);
            assert!(message.contains(expected), "{path:?}: {message:?} does not contain {expected:?}");
        }
    }

    #[test]
    fn ordinary_paths_are_served() {
        let (_dir, skill) = setup();
        for path in ["references/forms.md", "./references/forms.md", "references//forms.md", "SKILL.md"] {
            let opened = open_file(&skill, path).unwrap();
            assert!(opened.len > 0, "{path}");
        }
        assert_eq!(open_file(&skill, "./references/forms.md").unwrap().relative, "references/forms.md");
        // Case is exact, as on the filesystem.
        assert_eq!(refused(&skill, "References/forms.md"), "'References/forms.md' does not exist in this skill");
        assert_eq!(refused(&skill, "nope.md"), "'nope.md' does not exist in this skill");
    }

    #[test]
    fn symlinks_hard_links_and_special_files() {
        let (dir, skill) = setup();
        let outside = dir.path();
        // A leaf link out, an intermediate directory link out, a chain that
        // ends outside, a loop, dangling links, and links that stay inside.
        symlink(outside.join("secret.txt"), skill.join("leaf-out")).unwrap();
        symlink("/etc", skill.join("etc")).unwrap();
        symlink(outside.join("other"), skill.join("references/other")).unwrap();
        symlink("chain-2", skill.join("chain-1")).unwrap();
        symlink("../secret.txt", skill.join("chain-2")).unwrap();
        symlink("loop-b", skill.join("loop-a")).unwrap();
        symlink("loop-a", skill.join("loop-b")).unwrap();
        symlink(outside.join("created-by-link.txt"), skill.join("dangling-out")).unwrap();
        symlink("references/missing.md", skill.join("dangling-in")).unwrap();
        symlink("references/forms.md", skill.join("inside-link.md")).unwrap();
        symlink("references", skill.join("refs")).unwrap();
        std::fs::hard_link(outside.join("secret.txt"), skill.join("hard.txt")).unwrap();
        let fifo = std::ffi::CString::new(skill.join("pipe").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);

        let escape =
            |p: &str| format!("the path '{p}' is not allowed: it leads outside the skill through a symbolic link");
        let cases = [
            ("leaf-out", escape("leaf-out")),
            ("etc/passwd", escape("etc/passwd")),
            ("references/other/SKILL.md", escape("references/other/SKILL.md")),
            ("chain-1", escape("chain-1")),
            ("loop-a", "the path 'loop-a' is not allowed: it goes through a symbolic link loop".to_string()),
            ("dangling-out", escape("dangling-out")),
            ("dangling-in", "'dangling-in' does not exist in this skill".to_string()),
            (
                "hard.txt",
                "the path 'hard.txt' is not allowed: it is a hard link, which could point at a file outside the skill"
                    .to_string(),
            ),
            ("pipe", "'pipe' is a special file (a pipe, socket or device), not a regular file".to_string()),
            ("references", "'references' is a folder, not a regular file".to_string()),
        ];
        for (path, expected) in cases {
            assert_eq!(refused(&skill, path), expected, "{path}");
        }
        assert_eq!(open_file(&skill, "inside-link.md").unwrap().len, 5);
        assert_eq!(open_file(&skill, "refs/forms.md").unwrap().len, 5);

        // Creating through links: refused when the link leads out or dangles.
        assert_eq!(
            path_for_create(&skill, "dangling-out").unwrap_err(),
            PathError::Escapes { path: "dangling-out".into() }
        );
        assert_eq!(
            path_for_create(&skill, "etc/new.txt").unwrap_err(),
            PathError::Escapes { path: "etc/new.txt".into() }
        );
        assert!(path_for_create(&skill, "new/deeper/file.txt").unwrap().starts_with(canonical_root(&skill).unwrap()));
        assert!(!outside.join("created-by-link.txt").exists());
    }

    #[test]
    fn one_skill_cannot_reach_another() {
        let (dir, skill) = setup();
        let message = refused(&skill, "../other/SKILL.md");
        assert!(message.contains("climbs out"), "{message}");
        assert!(open_file(&dir.path().join("other"), "SKILL.md").is_ok());
    }
}
