//! A conversation's files, copied out of its workspace to be kept (at the
//! end of each turn) and copied into a new workspace when the
//! conversation continues after its folder went (a restart, an idle
//! conversation pushed out).
//!
//! Everything in a workspace is untrusted: a command wrote it. Both ways
//! go through the workspace's [`DirHandle`] on its own thread (as the
//! workspace's uid, when the server is root), never by a path:
//! - out: only regular files with a single name, found by descriptor
//!   without following links (the walk of [`DirHandle::changed_files`]),
//!   each read through the descriptor the walk opened, all of them within
//!   a byte budget and [`MAX_SAVED_FILES`];
//! - in: each path through the path guard (a stored name could be
//!   anything: the store is a file on disk), written by staging and
//!   renaming without replacing, so a name already there is never
//!   overwritten and a link is never followed.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;

use super::handle::{DirHandle, FsError};

/// Most files a conversation keeps.
pub const MAX_SAVED_FILES: usize = 1_000;

/// A regular file of a workspace, by its path inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedFile {
    pub path: String,
    pub executable: bool,
    pub content: Vec<u8>,
}

/// What [`take`] copied out, and how many files it left out (past the
/// budget or the file count, or unreadable).
#[derive(Debug, Default)]
pub struct Snapshot {
    pub files: Vec<SavedFile>,
    pub left_out: usize,
}

/// Copies the workspace's regular files out, in path order, within
/// `max_bytes` in all, but for the top-level folders `skip` names.
pub fn take(dir: &DirHandle, max_bytes: u64, skip: &[&str]) -> Snapshot {
    let mut snapshot = Snapshot::default();
    let mut left = max_bytes;
    for found in dir.changed_files(std::time::UNIX_EPOCH, skip) {
        if snapshot.files.len() >= MAX_SAVED_FILES || found.bytes > left {
            snapshot.left_out += 1;
            continue;
        }
        let executable = found.file.metadata().is_ok_and(|meta| meta.permissions().mode() & 0o111 != 0);
        let mut content = Vec::with_capacity(found.bytes as usize);
        // Read through the walk's descriptor, capped: a file that grew
        // since the walk looked is cut at what the budget allows.
        match (&found.file).take(left).read_to_end(&mut content) {
            Ok(_) => {
                left -= content.len() as u64;
                snapshot.files.push(SavedFile { path: found.path, executable, content });
            }
            Err(_) => snapshot.left_out += 1,
        }
    }
    snapshot
}

/// Writes `files` into the workspace (a new one, empty); returns how many
/// it wrote. A path the guard refuses, or one already there, is skipped
/// with a warning: the rest still come back.
pub fn restore(dir: &DirHandle, files: &[SavedFile]) -> usize {
    let mut written = 0;
    for file in files.iter().take(MAX_SAVED_FILES) {
        match put(dir, file) {
            Ok(()) => written += 1,
            Err(err) => tracing::warn!(path = %file.path, "a kept file was not restored: {err}"),
        }
    }
    written
}

fn put(dir: &DirHandle, file: &SavedFile) -> Result<(), FsError> {
    let staged =
        dir.stage_with_mode(&file.path, &mut &file.content[..], if file.executable { 0o755 } else { 0o644 })?;
    dir.commit(staged, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> (tempfile::TempDir, DirHandle) {
        let dir = tempfile::tempdir().unwrap();
        let handle = DirHandle::open(dir.path()).unwrap();
        (dir, handle)
    }

    #[test]
    fn regular_files_go_out_and_come_back_with_their_mode() {
        let (dir, handle) = handle();
        std::fs::create_dir_all(dir.path().join("out/deep")).unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"kept").unwrap();
        std::fs::write(dir.path().join("out/deep/run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
        std::fs::set_permissions(dir.path().join("out/deep/run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let snapshot = take(&handle, 1 << 20, &[]);
        assert_eq!(snapshot.left_out, 0);
        let paths: Vec<&str> = snapshot.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["notes.txt", "out/deep/run.sh"]);
        assert!(snapshot.files[1].executable && !snapshot.files[0].executable);

        let (again, fresh) = self::handle();
        assert_eq!(restore(&fresh, &snapshot.files), 2);
        assert_eq!(std::fs::read(again.path().join("notes.txt")).unwrap(), b"kept");
        let mode = std::fs::metadata(again.path().join("out/deep/run.sh")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
    }

    #[test]
    fn links_pipes_and_hard_links_never_go_out() {
        let (dir, handle) = handle();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"the host's").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("folder-link")).unwrap();
        std::fs::write(dir.path().join("plain"), b"ok").unwrap();
        std::fs::hard_link(dir.path().join("plain"), dir.path().join("second-name")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("pipe"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        std::fs::write(dir.path().join("single"), b"alone").unwrap();
        let snapshot = take(&handle, 1 << 20, &[]);
        let paths: Vec<&str> = snapshot.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["single"], "only a regular file with one name goes out");
    }

    #[test]
    fn the_byte_budget_at_and_past_its_limit() {
        let (dir, handle) = handle();
        std::fs::write(dir.path().join("a"), vec![b'a'; 10]).unwrap();
        std::fs::write(dir.path().join("b"), vec![b'b'; 10]).unwrap();
        let at = take(&handle, 20, &[]);
        assert_eq!((at.files.len(), at.left_out), (2, 0));
        let past = take(&handle, 19, &[]);
        assert_eq!((past.files.len(), past.left_out), (1, 1));
    }

    #[test]
    fn hostile_stored_names_are_refused_and_nothing_is_overwritten() {
        let (dir, handle) = handle();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("there"), b"first").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("escape")).unwrap();
        let file = |path: &str| SavedFile { path: path.into(), executable: false, content: b"evil".to_vec() };
        let files = [
            file("../up.txt"),
            file("/etc/owned"),
            file("escape/through-link.txt"),
            file("there"),
            file("a\0b"),
            file("fine/ok.txt"),
        ];
        assert_eq!(restore(&handle, &files), 1);
        assert_eq!(std::fs::read(dir.path().join("there")).unwrap(), b"first");
        assert_eq!(std::fs::read(dir.path().join("fine/ok.txt")).unwrap(), b"evil");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing was written through the link");
        assert!(!dir.path().parent().unwrap().join("up.txt").exists());
    }
}
