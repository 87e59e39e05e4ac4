//! apply_patch scenarios: each folder under `tests/apply_patch/` holds
//! `input/` (the files before), `patch.txt`, `expected/` (the files after)
//! and, for a patch that must fail, `expected_error.txt` (a part of the
//! message); a failed patch must leave `input/` exactly as it was.

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use skillhost_actors::workspace::apply_patch;
use skillhost_actors::workspace::DirHandle;

fn apply(dir: &Path, patch: &str) -> Result<apply_patch::Applied, apply_patch::PatchError> {
    apply_patch::apply(&DirHandle::open(dir).unwrap(), patch)
}

/// Every file under `dir`, relative path → content.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(relative, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    for (relative, content) in tree(from) {
        let target = to.join(&relative);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, content).unwrap();
    }
}

#[test]
fn scenarios() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/apply_patch");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().flatten().map(|e| e.path()).collect();
    cases.sort();
    assert!(cases.len() >= 20, "apply_patch scenarios are missing");
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let work = tempfile::tempdir().unwrap();
        copy_tree(&case.join("input"), work.path());
        let patch = std::fs::read_to_string(case.join("patch.txt")).unwrap();
        let result = apply(work.path(), &patch);
        match std::fs::read_to_string(case.join("expected_error.txt")) {
            Ok(expected) => {
                let err = match result {
                    Ok(applied) => panic!("{name}: applied, but should fail: {}", applied.report),
                    Err(err) => err.to_string(),
                };
                assert!(err.contains(expected.trim()), "{name}: {err:?} does not contain {expected:?}");
            }
            Err(_) => {
                if let Err(err) = result {
                    panic!("{name}: {err}");
                }
            }
        }
        pretty_assertions::assert_eq!(tree(work.path()), tree(&case.join("expected")), "{name}");
    }
}

#[test]
fn reports_say_what_changed_and_where_else_it_matched() {
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("a.txt"), "x\nx\nx\n").unwrap();
    let applied =
        apply(work.path(), "*** Begin Patch\n*** Update File: a.txt\n-x\n+y\n*** Add File: b.md\n+hi\n*** End Patch\n")
            .unwrap();
    assert_eq!(
        applied.report,
        "Applied the patch:\n  updated a.txt\n    chunk 1 also matched at line(s) 2, 3; it was applied at the first match\n  added b.md\nThe files now hold these changes; there is no need to read them back.\n"
    );
    assert_eq!(applied.written, vec!["a.txt".to_string(), "b.md".to_string()]);
    let err =
        apply(work.path(), "*** Begin Patch\n*** Update File: a.txt\n-z\n+w\n*** End Patch\n").unwrap_err().to_string();
    assert!(err.contains("The file's real lines nearest to them:\n     1\ty\n     2\tx\n     3\tx\n"), "{err}");
}

#[test]
fn file_size_cap_at_and_one_past() {
    use skillhost_actors::tools::FILE_TOOL_MAX_BYTES;
    let work = tempfile::tempdir().unwrap();
    // A file of exactly the cap: one line "x" and padding lines of spaces.
    let mut text = String::from("x\n");
    while text.len() < FILE_TOOL_MAX_BYTES as usize {
        let room = FILE_TOOL_MAX_BYTES as usize - text.len();
        let line = " ".repeat(room.min(1000) - 1);
        text.push_str(&line);
        text.push('\n');
    }
    assert_eq!(text.len() as u64, FILE_TOOL_MAX_BYTES);
    std::fs::write(work.path().join("at.txt"), &text).unwrap();
    std::fs::write(work.path().join("past.txt"), format!("{text} ")).unwrap();
    let patch = |name: &str| format!("*** Begin Patch\n*** Update File: {name}\n-x\n+y\n*** End Patch\n");
    apply(work.path(), &patch("at.txt")).unwrap();
    assert!(std::fs::read_to_string(work.path().join("at.txt")).unwrap().starts_with("y\n"));
    let err = apply(work.path(), &patch("past.txt")).unwrap_err().to_string();
    assert!(
        err.contains(&format!("is {} bytes, more than the {FILE_TOOL_MAX_BYTES} bytes", FILE_TOOL_MAX_BYTES + 1)),
        "{err}"
    );
}
