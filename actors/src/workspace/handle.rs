//! The one door into a folder that sandboxed commands can write: a directory
//! descriptor opened once, with every path resolved beneath it one component
//! at a time and no link ever followed.
//!
//! Everything a command leaves in its workspace is hostile input to the
//! server, which usually runs as root. A path joined onto the workspace and
//! handed to `std::fs` follows whatever the command planted there (a link
//! named like the file the server is about to write, a folder swapped for a
//! link to `/etc`), so nothing in the server does that. Instead:
//!
//! - a requested path first passes the skills path guard's spelling check
//!   (no `..`, no absolute paths, no backslashes or control characters);
//! - each folder on the way is opened with `O_DIRECTORY | O_NOFOLLOW` from
//!   the descriptor of the one before it, so a link anywhere on the way is an
//!   error, never a redirection, and a folder swapped while the server works
//!   keeps the server in the folder it had already opened;
//! - the last component is only ever touched through `*at` calls on its
//!   folder's descriptor: opened with `O_NOFOLLOW | O_NONBLOCK` (a FIFO
//!   cannot hang the open) and checked with `fstat` to be a regular file,
//!   created under a random staging name with `O_EXCL`, put in place with
//!   `renameat`, removed with `unlinkat`.
//!
//! A link inside the workspace is refused exactly as the skill path guard
//! refuses a link that leaves a skill: with a sentence the model can act on.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::time::SystemTime;

use rand::distr::{Alphanumeric, SampleString};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::path_guard;

/// Most entries [`DirHandle::changed_files`] looks at, so a command that made
/// a million empty files cannot make the server walk them all.
pub const MAX_WALK_ENTRIES: usize = 10_000;
/// Deepest folder nesting [`DirHandle::changed_files`] descends into.
pub const MAX_WALK_DEPTH: usize = 32;
/// How a staged file's name begins; never a name the model may ask for.
const STAGING_PREFIX: &str = ".skillhost-staged-";

/// Why a path could not be used. The message is one sentence for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// Refused on its spelling alone.
    #[error("the path '{path}' is not allowed: {reason}")]
    NotAllowed { path: String, reason: &'static str },
    /// A symbolic link is on the way or at the end.
    #[error(
        "'{path}' goes through a symbolic link ('{link}'); the file tools do not follow links in the working folder"
    )]
    Link { path: String, link: String },
    /// Nothing is there.
    #[error("'{path}' does not exist in the working folder")]
    NotFound { path: String },
    /// Something is there, but not what the tool needs.
    #[error("'{path}' is {what}, not a regular file")]
    NotAFile { path: String, what: &'static str },
    /// A folder on the way is a file.
    #[error("'{path}' cannot be used: '{segment}' on the way is not a folder")]
    NotAFolder { path: String, segment: String },
    /// A regular file with more than one name: writing the other name's
    /// content or reading it through this one would cross what the path says.
    #[error("'{path}' is a hard link (one file with several names); the file tools refuse such files")]
    HardLinked { path: String },
    /// Larger than the tool loads into the server.
    #[error("'{path}' is {bytes} bytes, more than the {cap} bytes this tool loads; work on it with shell commands (head, sed, split) instead")]
    TooLarge { path: String, bytes: u64, cap: u64 },
    /// Already there, for a call that only creates.
    #[error("'{path}' already exists")]
    Exists { path: String },
    /// The filesystem refused.
    #[error("'{path}' cannot be used: {error}")]
    Io { path: String, error: String },
}

/// What is at a path, looked at without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File { bytes: u64 },
    Folder,
    Link,
    Other,
}

/// A file the walk found changed, opened and checked.
#[derive(Debug)]
pub struct Found {
    /// Relative to the handle's folder, `/`-separated.
    pub path: String,
    pub bytes: u64,
    pub file: File,
}

/// A directory descriptor every path is resolved beneath.
#[derive(Debug)]
pub struct DirHandle {
    root: OwnedFd,
}

/// A new file written under a random name next to where it goes, waiting to
/// be renamed into place by [`DirHandle::commit`].
#[derive(Debug)]
pub struct Staged {
    folder: OwnedFd,
    temp: String,
    leaf: String,
    path: String,
}

impl Drop for Staged {
    /// A staged file that was never committed is removed; after a commit the
    /// name is gone and this is a harmless `ENOENT`.
    fn drop(&mut self) {
        let _ = rustix::fs::unlinkat(&self.folder, self.temp.as_str(), AtFlags::empty());
    }
}

fn is_link_error(errno: Errno) -> bool {
    errno == Errno::LOOP || errno == Errno::MLINK
}

fn kind_of(file_type: FileType, bytes: u64) -> Kind {
    match file_type {
        FileType::RegularFile => Kind::File { bytes },
        FileType::Directory => Kind::Folder,
        FileType::Symlink => Kind::Link,
        _ => Kind::Other,
    }
}

fn describe(kind: Kind) -> &'static str {
    match kind {
        Kind::Folder => "a folder",
        Kind::Link => "a symbolic link",
        Kind::File { .. } => "a file",
        Kind::Other => "a special file (a pipe, socket or device)",
    }
}

impl DirHandle {
    /// Opens the folder itself. The path is the server's own (a folder it
    /// created or was configured with), never one a command could shape; a
    /// link in its last component is still refused.
    pub fn open(path: &Path) -> std::io::Result<DirHandle> {
        let root = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(DirHandle { root })
    }

    /// A second handle on the same folder (for another thread).
    pub fn try_clone(&self) -> std::io::Result<DirHandle> {
        Ok(DirHandle { root: self.root.try_clone()? })
    }

    /// The folder's descriptor, for `fchown` and `fstat` of the folder itself.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Checks the spelling and splits a path into its folders and its leaf.
    fn split(requested: &str) -> Result<(Vec<String>, String), FsError> {
        let segments = path_guard::check_lexical(requested).map_err(|err| match err {
            path_guard::PathError::NotAllowed { reason, .. } => {
                FsError::NotAllowed { path: requested.to_string(), reason }
            }
            other => FsError::Io { path: requested.to_string(), error: other.to_string() },
        })?;
        let mut segments: Vec<String> = segments.into_iter().map(str::to_string).collect();
        let leaf = segments.pop().unwrap_or_default();
        Ok((segments, leaf))
    }

    /// Opens the folder holding `requested`'s last component, one component
    /// at a time without following links; with `create`, missing folders are
    /// made (mode 0755) on the way.
    fn folder_of(&self, requested: &str, create: bool) -> Result<(OwnedFd, String), FsError> {
        let (folders, leaf) = Self::split(requested)?;
        let mut current = self.root.try_clone().map_err(|err| io(requested, err))?;
        let mut walked = String::new();
        for segment in folders {
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(&segment);
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let opened = match rustix::fs::openat(&current, segment.as_str(), flags, Mode::empty()) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&current, segment.as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(errno) => return Err(io(requested, errno.into())),
                    }
                    rustix::fs::openat(&current, segment.as_str(), flags, Mode::empty())
                }
                other => other,
            };
            current = match opened {
                Ok(fd) => fd,
                Err(errno) => return Err(self.explain(requested, &current, &segment, &walked, errno)),
            };
        }
        Ok((current, leaf))
    }

    /// Turns a failed open of `segment` (inside `folder`) into the sentence
    /// that says what is really there.
    fn explain(&self, requested: &str, folder: &OwnedFd, segment: &str, walked: &str, errno: Errno) -> FsError {
        let found = rustix::fs::statat(folder, segment, AtFlags::SYMLINK_NOFOLLOW);
        match found.map(|stat| FileType::from_raw_mode(stat.st_mode)) {
            Ok(FileType::Symlink) => FsError::Link { path: requested.to_string(), link: walked.to_string() },
            Ok(FileType::Directory) => io(requested, errno.into()),
            Ok(_) if errno == Errno::NOTDIR => {
                FsError::NotAFolder { path: requested.to_string(), segment: walked.to_string() }
            }
            Err(Errno::NOENT) => FsError::NotFound { path: requested.to_string() },
            _ if is_link_error(errno) => FsError::Link { path: requested.to_string(), link: walked.to_string() },
            _ => io(requested, errno.into()),
        }
    }

    /// What is at `requested`, without following a link; `None` when
    /// nothing is (a missing folder on the way included).
    pub fn kind(&self, requested: &str) -> Result<Option<Kind>, FsError> {
        let (folder, leaf) = match self.folder_of(requested, false) {
            Ok(found) => found,
            Err(FsError::NotFound { .. }) => return Ok(None),
            Err(err) => return Err(err),
        };
        match rustix::fs::statat(&folder, leaf.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(kind_of(FileType::from_raw_mode(stat.st_mode), stat.st_size as u64))),
            Err(Errno::NOENT) => Ok(None),
            Err(errno) => Err(io(requested, errno.into())),
        }
    }

    /// Opens a regular file for reading: no link, no FIFO or device, one name.
    pub fn open_file(&self, requested: &str) -> Result<(File, u64), FsError> {
        let (folder, leaf) = self.folder_of(requested, false)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&folder, leaf.as_str(), flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(errno) => return Err(self.explain(requested, &folder, &leaf, requested, errno)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(|errno| io(requested, errno.into()))?;
        let kind = kind_of(FileType::from_raw_mode(stat.st_mode), stat.st_size as u64);
        let Kind::File { bytes } = kind else {
            return Err(FsError::NotAFile { path: requested.to_string(), what: describe(kind) });
        };
        if stat.st_nlink > 1 {
            return Err(FsError::HardLinked { path: requested.to_string() });
        }
        Ok((File::from(fd), bytes))
    }

    /// Reads a whole regular file of at most `cap` bytes. Bytes beyond the
    /// cap are never read, even from a file that grows while it is read.
    pub fn read(&self, requested: &str, cap: u64) -> Result<Vec<u8>, FsError> {
        let (file, bytes) = self.open_file(requested)?;
        if bytes > cap {
            return Err(FsError::TooLarge { path: requested.to_string(), bytes, cap });
        }
        let mut out = Vec::with_capacity(bytes as usize);
        file.take(cap + 1).read_to_end(&mut out).map_err(|err| io(requested, err))?;
        if out.len() as u64 > cap {
            return Err(FsError::TooLarge { path: requested.to_string(), bytes: out.len() as u64, cap });
        }
        Ok(out)
    }

    /// Writes `content` to a new file under a random name in the folder
    /// `requested` belongs in (made as needed), ready to be renamed into
    /// place. Nothing at `requested` itself is touched yet.
    pub fn stage(&self, requested: &str, content: &[u8]) -> Result<Staged, FsError> {
        self.stage_from(requested, &mut &content[..])
    }

    /// [`DirHandle::stage`], with the content copied from a reader.
    pub fn stage_from(&self, requested: &str, source: &mut dyn Read) -> Result<Staged, FsError> {
        self.stage_with_mode(requested, source, 0o644)
    }

    /// [`DirHandle::stage_from`] with the file's mode (set on the new
    /// file's own descriptor, before anyone else could see its name).
    pub fn stage_with_mode(&self, requested: &str, source: &mut dyn Read, mode: u32) -> Result<Staged, FsError> {
        let (folder, leaf) = self.folder_of(requested, true)?;
        let temp = format!("{STAGING_PREFIX}{}", Alphanumeric.sample_string(&mut rand::rng(), 16));
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&folder, temp.as_str(), flags, Mode::from_raw_mode(0o644))
            .map_err(|errno| io(requested, errno.into()))?;
        let staged = Staged { folder, temp, leaf, path: requested.to_string() };
        // The umask may have taken bits from the mode `openat` was given.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o777)).map_err(|errno| io(requested, errno.into()))?;
        let mut file = File::from(fd);
        std::io::copy(source, &mut file).map_err(|err| io(requested, err))?;
        Ok(staged)
    }

    /// Puts a staged file in place. With `replace` false an existing entry
    /// is an error and stays as it was; with `replace` true a file (or a
    /// link, which is replaced, never followed) at the name is replaced.
    pub fn commit(&self, staged: Staged, replace: bool) -> Result<(), FsError> {
        let flags = if replace { RenameFlags::empty() } else { RenameFlags::NOREPLACE };
        match rustix::fs::renameat_with(
            &staged.folder,
            staged.temp.as_str(),
            &staged.folder,
            staged.leaf.as_str(),
            flags,
        ) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => Err(FsError::Exists { path: staged.path.clone() }),
            Err(Errno::ISDIR) | Err(Errno::NOTEMPTY) => {
                Err(FsError::NotAFile { path: staged.path.clone(), what: "a folder" })
            }
            Err(errno) => Err(io(&staged.path, errno.into())),
        }
    }

    /// Removes a regular file; a folder or a link at the name is refused.
    pub fn remove_file(&self, requested: &str) -> Result<(), FsError> {
        let (folder, leaf) = self.folder_of(requested, false)?;
        let stat = rustix::fs::statat(&folder, leaf.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|errno| self.explain(requested, &folder, &leaf, requested, errno))?;
        match kind_of(FileType::from_raw_mode(stat.st_mode), stat.st_size as u64) {
            Kind::File { .. } => {}
            Kind::Link => return Err(FsError::Link { path: requested.to_string(), link: requested.to_string() }),
            other => return Err(FsError::NotAFile { path: requested.to_string(), what: describe(other) }),
        }
        rustix::fs::unlinkat(&folder, leaf.as_str(), AtFlags::empty()).map_err(|errno| io(requested, errno.into()))
    }

    /// Makes a new folder (mode 0700) for `requested`; an existing entry
    /// there is an error.
    pub fn make_folder(&self, requested: &str) -> Result<(), FsError> {
        let (folder, leaf) = self.folder_of(requested, true)?;
        match rustix::fs::mkdirat(&folder, leaf.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => Err(FsError::Exists { path: requested.to_string() }),
            Err(errno) => Err(io(requested, errno.into())),
        }
    }

    /// Removes `requested` and, for a folder, everything beneath it, by
    /// descriptor: a link inside is removed, never followed.
    pub fn remove_tree(&self, requested: &str) -> Result<(), FsError> {
        let (folder, leaf) = self.folder_of(requested, false)?;
        remove_entry(&folder, std::ffi::OsStr::new(&leaf), 0).map_err(|errno| io(requested, errno.into()))
    }

    /// The entries of the folder `requested` (a folder on the way or at
    /// the end that is a link is refused), each with what it is, looked at
    /// without following links; at most [`MAX_WALK_ENTRIES`], sorted.
    pub fn list(&self, requested: &str) -> Result<Vec<(String, Kind)>, FsError> {
        let (parent, leaf) = self.folder_of(requested, false)?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let folder = rustix::fs::openat(&parent, leaf.as_str(), flags, Mode::empty())
            .map_err(|errno| self.explain(requested, &parent, &leaf, requested, errno))?;
        let mut entries = Vec::new();
        let reader = rustix::fs::Dir::read_from(&folder).map_err(|errno| io(requested, errno.into()))?;
        for entry in reader.filter_map(Result::ok).take(MAX_WALK_ENTRIES + 2) {
            let Ok(name) = entry.file_name().to_str() else { continue };
            if name == "." || name == ".." {
                continue;
            }
            let Ok(stat) = rustix::fs::statat(&folder, name, AtFlags::SYMLINK_NOFOLLOW) else { continue };
            entries.push((name.to_string(), kind_of(FileType::from_raw_mode(stat.st_mode), stat.st_size as u64)));
        }
        entries.truncate(MAX_WALK_ENTRIES);
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(entries)
    }

    /// Moves `from` to `to`, making folders on the way to `to` and
    /// replacing what is there (a folder with everything in it; a link is
    /// replaced, never followed). Both must be on one filesystem.
    pub fn move_replacing(&self, from: &str, to: &str) -> Result<(), FsError> {
        let (source, source_leaf) = self.folder_of(from, false)?;
        let (target, target_leaf) = self.folder_of(to, true)?;
        remove_entry(&target, std::ffi::OsStr::new(&target_leaf), 0).map_err(|errno| io(to, errno.into()))?;
        rustix::fs::renameat_with(&source, source_leaf.as_str(), &target, target_leaf.as_str(), RenameFlags::NOREPLACE)
            .map_err(|errno| io(to, errno.into()))
    }

    /// Removes everything inside the folder, keeping the folder itself.
    pub fn clear(&self) -> Result<(), FsError> {
        clear_folder(&self.root, 0).map_err(|errno| io(".", errno.into()))
    }

    /// The regular files modified at or after `since`, opened for reading,
    /// with names the path guard accepts; `skip` names top-level folders the
    /// walk leaves out. Folders are entered by descriptor without following
    /// links; other entries (links, FIFOs, devices, files with several names)
    /// are passed over. Bounded by [`MAX_WALK_ENTRIES`] and [`MAX_WALK_DEPTH`].
    pub fn changed_files(&self, since: SystemTime, skip: &[&str]) -> Vec<Found> {
        let mut found = Vec::new();
        let mut budget = MAX_WALK_ENTRIES;
        let Ok(root) = self.root.try_clone() else { return found };
        walk(root, "", 0, since, skip, &mut budget, &mut found);
        found.sort_by(|a, b| a.path.cmp(&b.path));
        found
    }
}

fn io(requested: &str, err: std::io::Error) -> FsError {
    FsError::Io { path: requested.to_string(), error: err.to_string() }
}

/// Removes `name` inside `folder`: a folder after its contents, anything
/// else (links included) as the entry itself.
fn remove_entry(folder: &OwnedFd, name: &std::ffi::OsStr, depth: usize) -> Result<(), Errno> {
    match rustix::fs::unlinkat(folder, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {}
        Err(errno) => return Err(errno),
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let inner = rustix::fs::openat(folder, name, flags, Mode::empty())?;
    clear_folder(&inner, depth + 1)?;
    drop(inner);
    match rustix::fs::unlinkat(folder, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(errno) => Err(errno),
    }
}

/// Removes everything inside `folder`. Depth is bounded only by what the
/// filesystem allows; each level holds one descriptor.
fn clear_folder(folder: &OwnedFd, depth: usize) -> Result<(), Errno> {
    // A command can nest folders far deeper than any real project; past
    // this depth the server gives up rather than run out of descriptors.
    const MAX_REMOVE_DEPTH: usize = 512;
    if depth > MAX_REMOVE_DEPTH {
        return Err(Errno::NAMETOOLONG);
    }
    // Read every name first: removing while reading may skip entries.
    let names: Vec<Vec<u8>> = rustix::fs::Dir::read_from(folder)?
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_bytes().to_vec())
        .filter(|name| name.as_slice() != b"." && name.as_slice() != b"..")
        .collect();
    for name in names {
        let name = OsString::from_vec(name);
        remove_entry(folder, &name, depth)?;
    }
    Ok(())
}

fn walk(
    folder: OwnedFd,
    prefix: &str,
    depth: usize,
    since: SystemTime,
    skip: &[&str],
    budget: &mut usize,
    found: &mut Vec<Found>,
) {
    if depth > MAX_WALK_DEPTH {
        return;
    }
    let Ok(entries) = rustix::fs::Dir::read_from(&folder) else { return };
    for entry in entries {
        let Ok(entry) = entry else { break };
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let name = OsString::from_vec(entry.file_name().to_bytes().to_vec());
        let Some(name) = name.to_str().map(str::to_string) else { continue };
        if name == "." || name == ".." || name.starts_with(STAGING_PREFIX) {
            continue;
        }
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        // A name the guard refuses (a backslash, a control character, a
        // trailing dot) is passed over before anything is opened or created.
        if path_guard::check_lexical(&path).is_err() || (depth == 0 && skip.contains(&name.as_str())) {
            continue;
        }
        let Ok(stat) = rustix::fs::statat(&folder, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                if let Ok(inner) = rustix::fs::openat(&folder, name.as_str(), flags, Mode::empty()) {
                    walk(inner, &path, depth + 1, since, skip, budget, found);
                }
            }
            FileType::RegularFile => {
                let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
                let Ok(fd) = rustix::fs::openat(&folder, name.as_str(), flags, Mode::empty()) else { continue };
                // Checked again on the descriptor: the entry may have been
                // swapped between the look and the open.
                let Ok(stat) = rustix::fs::fstat(&fd) else { continue };
                let modified =
                    SystemTime::UNIX_EPOCH + std::time::Duration::new(stat.st_mtime as u64, stat.st_mtime_nsec as u32);
                if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
                    || stat.st_nlink > 1
                    || modified < since
                {
                    continue;
                }
                found.push(Found { path, bytes: stat.st_size as u64, file: File::from(fd) });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn handle() -> (tempfile::TempDir, DirHandle) {
        let dir = tempfile::tempdir().unwrap();
        let handle = DirHandle::open(dir.path()).unwrap();
        (dir, handle)
    }

    #[test]
    fn reads_and_writes_stay_beneath_and_never_follow_links() {
        let (dir, handle) = handle();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "secret").unwrap();
        symlink(outside.path().join("secret"), dir.path().join("leaf")).unwrap();
        symlink(outside.path(), dir.path().join("folder")).unwrap();
        assert!(matches!(handle.read("leaf", 100), Err(FsError::Link { .. })));
        assert!(matches!(handle.read("folder/secret", 100), Err(FsError::Link { .. })));
        assert!(matches!(handle.stage("folder/new", b"x"), Err(FsError::Link { .. })));
        // A link at the name is replaced by a commit, never written through.
        let staged = handle.stage("leaf", b"mine").unwrap();
        handle.commit(staged, true).unwrap();
        assert_eq!(std::fs::read_to_string(outside.path().join("secret")).unwrap(), "secret");
        assert_eq!(std::fs::read_to_string(dir.path().join("leaf")).unwrap(), "mine");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_folder_swapped_for_a_link_mid_write_keeps_the_write_where_it_began() {
        let (dir, handle) = handle();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let staged = handle.stage("sub/file.txt", b"data").unwrap();
        // Between staging and the rename, the folder becomes a link out.
        std::fs::rename(dir.path().join("sub"), dir.path().join("moved")).unwrap();
        symlink(outside.path(), dir.path().join("sub")).unwrap();
        handle.commit(staged, false).unwrap();
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(dir.path().join("moved/file.txt")).unwrap(), "data");
        // Any later call sees the link and refuses it.
        assert!(matches!(handle.stage("sub/other.txt", b"x"), Err(FsError::Link { .. })));
        assert!(matches!(handle.remove_tree("sub/file.txt"), Err(FsError::Link { .. })));
    }

    #[test]
    fn removal_by_descriptor_takes_links_not_their_targets() {
        let (dir, handle) = handle();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep.txt"), "keep").unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        symlink(outside.path(), dir.path().join("a/b/out")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), "x").unwrap();
        handle.clear().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(outside.path().join("keep.txt")).unwrap(), "keep");
    }

    #[test]
    fn moving_replaces_what_is_there_and_never_follows_a_link() {
        let (dir, handle) = handle();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep.txt"), "keep").unwrap();
        std::fs::create_dir_all(dir.path().join("stage/node_modules/pkg")).unwrap();
        std::fs::write(dir.path().join("stage/node_modules/pkg/index.js"), "new").unwrap();
        std::fs::create_dir_all(dir.path().join("node_modules/pkg")).unwrap();
        std::fs::write(dir.path().join("node_modules/pkg/old.js"), "old").unwrap();
        symlink(outside.path(), dir.path().join("stage/node_modules/out")).unwrap();
        let listed = handle.list("stage/node_modules").unwrap();
        assert_eq!(listed, [("out".to_string(), Kind::Link), ("pkg".to_string(), Kind::Folder)]);
        // An older copy is replaced whole.
        handle.move_replacing("stage/node_modules/pkg", "node_modules/pkg").unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("node_modules/pkg/index.js")).unwrap(), "new");
        assert!(!dir.path().join("node_modules/pkg/old.js").exists());
        // A link at the destination is removed, not followed; a link on the
        // way there is refused.
        symlink(outside.path(), dir.path().join("node_modules/target")).unwrap();
        handle.move_replacing("stage/node_modules/out", "node_modules/target").unwrap();
        assert_eq!(std::fs::read_to_string(outside.path().join("keep.txt")).unwrap(), "keep");
        symlink(outside.path(), dir.path().join("linked")).unwrap();
        std::fs::write(dir.path().join("stage/f"), "x").unwrap();
        assert!(matches!(handle.move_replacing("stage/f", "linked/f"), Err(FsError::Link { .. })));
        assert!(matches!(handle.list("linked"), Err(FsError::Link { .. })));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    }

    #[test]
    fn create_only_refuses_an_existing_name_and_leaves_no_staging_file() {
        let (dir, handle) = handle();
        std::fs::write(dir.path().join("a"), "old").unwrap();
        let staged = handle.stage("a", b"new").unwrap();
        assert!(matches!(handle.commit(staged, false), Err(FsError::Exists { .. })));
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let staged = handle.stage("deep/er/b", b"new").unwrap();
        handle.commit(staged, false).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("deep/er/b")).unwrap(), "new");
    }

    #[test]
    fn size_cap_at_and_past() {
        let (dir, handle) = handle();
        std::fs::write(dir.path().join("f"), "12345").unwrap();
        assert_eq!(handle.read("f", 5).unwrap(), b"12345");
        assert!(matches!(handle.read("f", 4), Err(FsError::TooLarge { bytes: 5, cap: 4, .. })));
    }

    #[test]
    fn fifos_and_hard_links_are_not_files() {
        let (dir, handle) = handle();
        let fifo = std::ffi::CString::new(dir.path().join("pipe").into_os_string().into_vec()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert!(matches!(handle.read("pipe", 100), Err(FsError::NotAFile { .. })));
        std::fs::write(dir.path().join("one"), "x").unwrap();
        std::fs::hard_link(dir.path().join("one"), dir.path().join("two")).unwrap();
        assert!(matches!(handle.read("two", 100), Err(FsError::HardLinked { .. })));
        assert!(matches!(handle.remove_file("pipe"), Err(FsError::NotAFile { .. })));
    }

    #[test]
    fn the_walk_passes_over_links_special_files_and_refused_names() {
        let (dir, handle) = handle();
        std::fs::create_dir_all(dir.path().join("sub/.tmp")).unwrap();
        std::fs::create_dir_all(dir.path().join(".tmp")).unwrap();
        std::fs::write(dir.path().join("sub/kept.txt"), "k").unwrap();
        std::fs::write(dir.path().join("sub/.tmp/inner.txt"), "i").unwrap();
        std::fs::write(dir.path().join(".tmp/skipped.txt"), "s").unwrap();
        std::fs::write(dir.path().join("back\\slash"), "b").unwrap();
        symlink("/etc/passwd", dir.path().join("passwd")).unwrap();
        symlink("/etc", dir.path().join("etc")).unwrap();
        let since = SystemTime::now() - std::time::Duration::from_secs(5);
        let found: Vec<String> = handle.changed_files(since, &[".tmp"]).into_iter().map(|f| f.path).collect();
        assert_eq!(found, ["sub/.tmp/inner.txt", "sub/kept.txt"]);
    }
}
