//! Property tests for the two parsers of hostile input: the path guard and
//! the ZIP installer. `make test` runs the default number of cases;
//! `make fuzz` runs many more (PROPTEST_CASES).

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use skillhost_actors::path_guard::{check_lexical, open_file};
use skillhost_actors::skills::install::{install_archive, InstallOptions};
use skillhost_actors::skills::Snapshot;

/// A skill with links in and out, next to a secret.
fn skill_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let skill = dir.path().join("skill");
    std::fs::create_dir_all(skill.join("a/b")).unwrap();
    std::fs::write(skill.join("SKILL.md"), "---\nname: skill\ndescription: x\n---\n").unwrap();
    std::fs::write(skill.join("a/b/c.md"), "c").unwrap();
    std::fs::write(dir.path().join("secret"), "secret").unwrap();
    std::os::unix::fs::symlink("../secret", skill.join("out")).unwrap();
    std::os::unix::fs::symlink(dir.path(), skill.join("a/up")).unwrap();
    std::os::unix::fs::symlink("b", skill.join("a/in")).unwrap();
    (dir, skill)
}

/// Paths built from the characters that matter to the guard.
fn hostile_path() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "a", "b", "c.md", "SKILL.md", "out", "up", "in", "secret", "..", ".", "/", "//", "\\", "~", "C:", " ", ".",
        "\0", "\u{1b}", "é", "%2e", "skill",
    ]);
    prop::collection::vec(pieces, 0..8).prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn lexical_check_never_admits_a_climb(path in hostile_path()) {
        if let Ok(segments) = check_lexical(&path) {
            for segment in segments {
                prop_assert!(segment != ".." && segment != "." && !segment.is_empty());
                prop_assert!(!segment.contains('/') && !segment.contains('\\') && !segment.contains('\0'));
                prop_assert!(!segment.ends_with('.') && !segment.ends_with(' '));
            }
            prop_assert!(!path.starts_with('/') && !path.starts_with('~'));
        }
    }

    #[test]
    fn opened_files_are_always_inside_the_skill(path in hostile_path()) {
        let (_dir, skill) = skill_dir();
        let root = skill.canonicalize().unwrap();
        if let Ok(opened) = open_file(&skill, &path) {
            // Where the kernel says the open descriptor points.
            let target = std::fs::read_link(format!("/proc/self/fd/{}", opened.file.as_raw_fd())).unwrap();
            prop_assert!(target.starts_with(&root), "{path:?} opened {}", target.display());
        }
    }

    #[test]
    fn random_bytes_never_install_or_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let dir = tempfile::tempdir().unwrap();
        let result = install_archive(std::io::Cursor::new(&bytes), dir.path(), &Snapshot::default(), overwrite());
        prop_assert!(result.is_err());
        prop_assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn mutated_archives_install_inside_or_not_at_all(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut archive = valid_archive();
        for (index, value) in flips {
            let at = index.index(archive.len());
            archive[at] = value;
        }
        let dir = tempfile::tempdir().unwrap();
        let install = dir.path().join("installed");
        std::fs::create_dir_all(&install).unwrap();
        if install_archive(std::io::Cursor::new(&archive), &install, &Snapshot::default(), overwrite()).is_ok() {
            prop_assert!(everything_under(dir.path()).iter().all(|p| p.starts_with(&install)));
        } else {
            prop_assert_eq!(std::fs::read_dir(&install).unwrap().count(), 0);
        }
    }
}

fn valid_archive() -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    for (name, text) in
        [("pdf/SKILL.md", "---\nname: pdf\ndescription: PDFs.\n---\nBody\n"), ("pdf/refs/a.md", "# A\n")]
    {
        writer.start_file(name, options).unwrap();
        writer.write_all(text.as_bytes()).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

fn everything_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out.into_iter().filter(|p| p != &dir.join("installed")).collect()
}

fn overwrite() -> InstallOptions {
    InstallOptions { overwrite: true, ..InstallOptions::default() }
}
