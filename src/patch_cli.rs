//! `skillhost apply-patch`: the model's `apply_patch` tool for operators and
//! scripts. The patch comes on stdin, the tool's exact result text goes to
//! stdout, and the exit status is 0 only when the patch applied. It works
//! through the same handle as the tool, so a link in the folder is refused,
//! never followed. The syntax check the tool adds runs only in the sandbox
//! of a server, so it is not part of this command's report.

use std::io::Read;
use std::path::PathBuf;

use clap::Args;
use serde_json::Value;
use skillhost_actors::tools::{self, ToolError};
use skillhost_actors::workspace::DirHandle;

/// Largest patch read from stdin; a patch is text a model wrote, so 16 MiB
/// is far beyond any real one and keeps a runaway pipe from filling memory.
pub const MAX_PATCH_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Debug, Args)]
pub struct ApplyPatchArgs {
    /// Folder the patch's paths are relative to (default: the current one)
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
}

/// Applies the patch on stdin under `--dir`; returns the result text and
/// whether it applied.
pub fn run(args: &ApplyPatchArgs, input: impl Read) -> Result<(String, bool), String> {
    let dir = DirHandle::open(&args.dir).map_err(|err| format!("--dir {}: {err}", args.dir.display()))?;
    let mut patch = String::new();
    let read = input
        .take(MAX_PATCH_BYTES + 1)
        .read_to_string(&mut patch)
        .map_err(|err| format!("cannot read the patch from stdin: {err}"))?;
    if read as u64 > MAX_PATCH_BYTES {
        return Err(format!("the patch is larger than {MAX_PATCH_BYTES} bytes"));
    }
    let mut arguments = serde_json::Map::new();
    arguments.insert("input".to_string(), Value::String(patch));
    match tools::apply_patch::run(&dir, &arguments) {
        Ok(answer) => Ok((answer.text, answer.ok)),
        Err(ToolError::Model(text) | ToolError::Fatal(text)) => Ok((text, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_and_reports_like_the_tool() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
        let args = ApplyPatchArgs { dir: dir.path().to_path_buf() };
        let patch = "*** Begin Patch\n*** Update File: a.txt\n one\n-two\n+three\n*** End Patch\n";
        let (text, ok) = run(&args, patch.as_bytes()).unwrap();
        assert!(ok, "{text}");
        assert!(text.contains("updated a.txt"), "{text}");
        assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), "one\nthree\n");

        let (text, ok) =
            run(&args, "*** Begin Patch\n*** Delete File: missing.txt\n*** End Patch\n".as_bytes()).unwrap();
        assert!(!ok);
        assert!(text.contains("missing.txt"), "{text}");
    }

    #[test]
    fn patch_size_limit_at_and_past() {
        let dir = tempfile::tempdir().unwrap();
        let args = ApplyPatchArgs { dir: dir.path().to_path_buf() };
        let at = vec![b' '; MAX_PATCH_BYTES as usize];
        let (_, ok) = run(&args, at.as_slice()).unwrap();
        assert!(!ok, "whitespace is not a patch, but it is read");
        let past = vec![b' '; MAX_PATCH_BYTES as usize + 1];
        assert!(run(&args, past.as_slice()).unwrap_err().contains("larger than"));
    }

    #[test]
    fn missing_dir_is_an_error() {
        let args = ApplyPatchArgs { dir: PathBuf::from("/nonexistent/skillhost") };
        assert!(run(&args, "".as_bytes()).unwrap_err().contains("--dir"));
    }
}
