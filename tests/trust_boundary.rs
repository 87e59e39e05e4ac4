//! The trust boundary, tried as an attacker would: a sandboxed command (the
//! real helper and sandbox, through `shell`) plants a link, a FIFO or a huge
//! file at a name the server later touches, and then a file tool, the shell
//! or the artifact copy runs. Each row must leave the host file untouched
//! (bytes, owner and mode), answer the model with a sentence, and leave the
//! workspace serving the next call.

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde_json::{json, Value};
use skillhost_actors::tools::workspace_actor::{self, ArtifactsFor};
use skillhost_actors::tools::{CodeCall, Tool};

mod common;

use common::{harness, state};

/// A host file and folder that no command may reach, with what they were.
struct Host {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    file: PathBuf,
    before: (Vec<u8>, u32, u32, u32),
}

fn host() -> Host {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("target.txt");
    std::fs::write(&file, "host secret\n").unwrap();
    let before = state(&file);
    Host { dir: dir.path().to_path_buf(), _dir: dir, file, before }
}

impl Host {
    fn untouched(&self, what: &str) {
        assert_eq!(state(&self.file), self.before, "{what}: the host file changed");
        let names: Vec<_> = std::fs::read_dir(&self.dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, ["target.txt"], "{what}: something was created in the host folder");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_command_plants_steers_the_server() {
    let harness = harness(Default::default()).await;
    let host = host();
    let t = host.file.display().to_string();
    let d = host.dir.display().to_string();
    let patch = |body: &str| json!({"input": format!("*** Begin Patch\n{body}*** End Patch\n")});
    // (what, what the command plants, the tool call, a part of the answer)
    let rows: Vec<(&str, String, Tool, Value, &str)> = vec![
        (
            "write through a link",
            format!("ln -s {t} notes.txt"),
            Tool::WriteFile,
            json!({"path": "notes.txt", "content": "x"}),
            "symbolic link",
        ),
        (
            "overwrite through a link",
            format!("ln -s {t} notes.txt"),
            Tool::WriteFile,
            json!({"path": "notes.txt", "content": "x", "overwrite": true}),
            "symbolic link",
        ),
        (
            "read through a link",
            format!("ln -s {t} notes.txt"),
            Tool::ReadFile,
            json!({"path": "notes.txt"}),
            "symbolic link",
        ),
        (
            "edit through a link",
            format!("ln -s {t} notes.txt"),
            Tool::EditFile,
            json!({"path": "notes.txt", "old_str": "host", "new_str": "mine"}),
            "symbolic link",
        ),
        (
            "patch through a link",
            format!("ln -s {t} notes.txt"),
            Tool::ApplyPatch,
            patch("*** Update File: notes.txt\n-host secret\n+mine\n"),
            "symbolic link",
        ),
        (
            "add over a link",
            format!("ln -s {t} x.py"),
            Tool::ApplyPatch,
            patch("*** Add File: x.py\n+print(1)\n"),
            "symbolic link",
        ),
        (
            "delete a link",
            format!("ln -s {t} notes.txt"),
            Tool::ApplyPatch,
            patch("*** Delete File: notes.txt\n"),
            "symbolic link",
        ),
        (
            "move onto a link",
            format!("echo a > a.txt; ln -s {t} b.txt"),
            Tool::ApplyPatch,
            patch("*** Update File: a.txt\n*** Move to: b.txt\n-a\n+b\n"),
            "symbolic link",
        ),
        (
            "a folder in the path is a link (write)",
            format!("ln -s {d} sub"),
            Tool::WriteFile,
            json!({"path": "sub/new.txt", "content": "x"}),
            "symbolic link ('sub')",
        ),
        (
            "a folder in the path is a link (patch)",
            format!("ln -s {d} sub"),
            Tool::ApplyPatch,
            patch("*** Add File: sub/new.py\n+print(1)\n"),
            "symbolic link",
        ),
        (
            "a folder in the path is a link (read)",
            format!("ln -s {d} sub"),
            Tool::ReadFile,
            json!({"path": "sub/target.txt"}),
            "symbolic link",
        ),
        ("a FIFO read", "mkfifo pipe".into(), Tool::ReadFile, json!({"path": "pipe"}), "a special file"),
        (
            "a FIFO patched",
            "mkfifo pipe".into(),
            Tool::ApplyPatch,
            patch("*** Update File: pipe\n-a\n+b\n"),
            "a special file",
        ),
        (
            "a FIFO overwritten",
            "mkfifo pipe".into(),
            Tool::WriteFile,
            json!({"path": "pipe", "content": "x", "overwrite": true}),
            "Wrote 1 bytes",
        ),
        (
            "/dev/zero behind a link",
            "ln -s /dev/zero zero".into(),
            Tool::ReadFile,
            json!({"path": "zero"}),
            "symbolic link",
        ),
        (
            "a hard link",
            "echo r > real.txt; ln real.txt twin.txt".into(),
            Tool::ReadFile,
            json!({"path": "twin.txt"}),
            "hard link",
        ),
        (
            ".tmp is a link to a host file",
            format!("rm -rf .tmp; ln -s {t} .tmp"),
            Tool::Shell,
            json!({"command": "true"}),
            "[exit status 0]",
        ),
        (
            ".tmp is a link to a host folder",
            format!("rm -rf .tmp; ln -s {d} .tmp"),
            Tool::Shell,
            json!({"command": "echo x > \"$TMPDIR/f\"; true"}),
            "[exit status 0]",
        ),
        (
            "the shell state is a link",
            format!("mkdir -p .skillhost; rm -f .skillhost/state.sh; ln -s {t} .skillhost/state.sh"),
            Tool::Shell,
            json!({"command": "pwd"}),
            "[exit status 0]",
        ),
        (
            "the shell state is /dev/zero",
            "mkdir -p .skillhost; rm -f .skillhost/state.sh; ln -s /dev/zero .skillhost/state.sh".into(),
            Tool::Shell,
            json!({"command": "pwd"}),
            "[exit status 0]",
        ),
    ];
    for (what, plant, tool, args, expected) in rows {
        let (workspace, _) = harness.workspace().await;
        let planted = harness.shell(&workspace, &plant, 10_000).await;
        assert!(planted.contains("[exit status 0]"), "{what}: planting failed: {planted}");
        let text = harness.text(&workspace, tool, args).await;
        assert!(text.contains(expected), "{what}: {text:?} does not contain {expected:?}");
        host.untouched(what);
        // The folder still serves the next call.
        let alive = harness.text(&workspace, Tool::WriteFile, json!({"path": "alive.txt", "content": "ok"})).await;
        assert!(alive.starts_with("Wrote 2 bytes"), "{what}: {alive}");
        let shell = harness.shell(&workspace, "cat alive.txt", 10_000).await;
        assert!(shell.contains("ok\n[exit status 0]"), "{what}: {shell}");
        workspace.stop_and_wait(None, None).await.unwrap();
        host.untouched(what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_at_the_shell_state_costs_the_command_not_the_server() {
    let harness = harness(Default::default()).await;
    let (workspace, _) = harness.workspace().await;
    // The wrapper saves the state into the FIFO and blocks: the command is
    // killed at its deadline; the server never opens the FIFO for reading
    // (it would block) and the file tools go on.
    let planted = harness
        .shell(&workspace, "mkdir -p .skillhost; rm -f .skillhost/state.sh; mkfifo .skillhost/state.sh", 2_000)
        .await;
    assert!(planted.contains("[killed after 2 s"), "{planted}");
    let text = harness.text(&workspace, Tool::ReadFile, json!({"path": ".skillhost/state.sh"})).await;
    assert!(text.contains("a special file"), "{text}");
    let alive = harness.text(&workspace, Tool::WriteFile, json!({"path": "alive.txt", "content": "ok"})).await;
    assert!(alive.starts_with("Wrote 2 bytes"), "{alive}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_skip_links_and_names_the_guard_refuses() {
    let harness = harness(Default::default()).await;
    let host = host();
    let (workspace, _) = harness.workspace().await;
    let command =
        format!("ln -s {} report.txt; printf x > 'a\\b'; mkfifo pipe; echo r > real.txt", host.file.display());
    let call = CodeCall::Tool { tool: Tool::Shell, args: json!({"command": command}).as_object().unwrap().clone() };
    let target = ArtifactsFor { store: harness.artifacts.clone(), run_id: "run-artifacts".into() };
    let answer = workspace_actor::call(&workspace, call, Some(harness.sandbox.clone()), Some(target)).await.unwrap();
    let produced: Vec<&str> = answer.produced.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(produced, ["real.txt"], "{}", answer.text);
    let stored: Vec<_> = std::fs::read_dir(harness.artifacts_dir.join("run-artifacts"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(stored, ["real.txt"]);
    host.untouched("artifacts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_mb_file_costs_the_server_no_more_than_the_cap() {
    let harness = harness(Default::default()).await;
    let (workspace, _) = harness.workspace().await;
    let made = harness.shell(&workspace, "head -c 524288000 /dev/zero | tr '\\0' '\\n' > big.txt", 120_000).await;
    assert!(made.contains("[exit status 0]"), "{made}");
    let before = common::memory("VmHWM");
    let read = harness.text(&workspace, Tool::ReadFile, json!({"path": "big.txt", "limit": 3})).await;
    assert!(read.starts_with("[read_file: 'big.txt', lines 1-3 of a 524288000-byte file]"), "{read}");
    let patched = harness
        .text(
            &workspace,
            Tool::ApplyPatch,
            json!({"input": "*** Begin Patch\n*** Update File: big.txt\n@@\n-\n+x\n*** End Patch\n"}),
        )
        .await;
    assert!(patched.contains("524288000 bytes, more than the 8388608 bytes apply_patch loads"), "{patched}");
    let edited =
        harness.text(&workspace, Tool::EditFile, json!({"path": "big.txt", "old_str": "\n", "new_str": "x"})).await;
    assert!(edited.contains("more than the 8388608 bytes"), "{edited}");
    let grown = common::memory("VmHWM").saturating_sub(before);
    // Two caps of slack for buffers and allocator rounding; loading the
    // file would have cost 500 MB.
    assert!(grown < 2 * skillhost_actors::tools::FILE_TOOL_MAX_BYTES, "the peak grew by {grown} bytes");
}
