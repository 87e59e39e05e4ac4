//! Code execution costs: a sandboxed `true` against a plain `true`, both
//! started from this process the way the server starts them, and
//! `apply_patch` on a 10,000-line file with 50 hunks against reading and
//! writing the same file.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skillhost_actors::sandbox::launch::{Launcher, Run};
use skillhost_actors::workspace::{apply_patch, sandbox_owner, Workspace};

/// Starts of each kind; the median is reported.
const STARTS: usize = 21;
const PATCH_LINES: usize = 10_000;
const PATCH_HUNKS: usize = 50;
/// Repetitions of the patch measurement.
const PATCH_RUNS: usize = 11;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

pub fn run() {
    let status = Command::new("cargo").args(["build", "--release", "-p", "skillhost"]).status().expect("cargo");
    assert!(status.success(), "building the server failed");
    let launcher = Launcher {
        // Absolute: the helper starts in the workspace.
        helper: std::fs::canonicalize("target/release/skillhost").expect("the server binary"),
        profile_dir: std::fs::canonicalize("sandbox-profiles").expect("sandbox-profiles"),
        user: "nobody".into(),
    };
    let base = tempfile::tempdir().expect("tempdir");
    set_mode(base.path(), 0o755);
    let workspace = Workspace::create(base.path(), sandbox_owner("nobody")).expect("workspace");
    let command = ["/usr/bin/true".to_string()];
    let run = Run {
        profile: "code-exec",
        workspace: workspace.root(),
        skill: None,
        network: false,
        unconfined: false,
        command: &command,
        timeout: Duration::from_secs(10),
    };
    let start = |mut command: Command| {
        let started = Instant::now();
        let status = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).output().expect("spawn");
        let took = ms(started);
        assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
        took
    };
    // One of each first, unmeasured (page cache, first namespace setup);
    // then they alternate so drift hits both alike.
    start(launcher.command(&run));
    start(Command::new("/usr/bin/true"));
    let (mut sandboxed, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..STARTS {
        sandboxed.push(start(launcher.command(&run)));
        plain.push(start(Command::new("/usr/bin/true")));
    }
    let (sandboxed, plain) = (median(sandboxed), median(plain));
    println!(
        "  `true`, median of {STARTS}: sandboxed {sandboxed:.2} ms, plain {plain:.2} ms, ratio {:.1}×",
        sandboxed / plain
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let (original, patch) = patch_case();
    let file = dir.path().join("big.txt");
    let (mut patching, mut copying) = (Vec::new(), Vec::new());
    for _ in 0..PATCH_RUNS {
        std::fs::write(&file, &original).expect("write");
        let started = Instant::now();
        let applied = apply_patch::apply(dir.path(), &patch).expect("the patch applies");
        patching.push(ms(started));
        assert_eq!(applied.written, vec!["big.txt".to_string()]);
        // The floor: the same file read and written once.
        let started = Instant::now();
        let text = std::fs::read_to_string(&file).expect("read");
        std::fs::write(dir.path().join("copy.txt"), text).expect("write");
        copying.push(ms(started));
    }
    let (patching, copying) = (median(patching), median(copying));
    println!(
        "  apply_patch, {PATCH_LINES} lines, {PATCH_HUNKS} hunks, median of {PATCH_RUNS}: {patching:.2} ms \
         (reading and writing the file: {copying:.2} ms, ratio {:.1}×)",
        patching / copying
    );
}

/// A 10,000-line file and a patch changing one line in each of 50 evenly
/// spaced places, with three lines of context on each side.
fn patch_case() -> (String, String) {
    let lines: Vec<String> = (0..PATCH_LINES).map(|i| format!("line {i}: value = {}", i * 7 % 1000)).collect();
    let mut patch = String::from("*** Begin Patch\n*** Update File: big.txt\n");
    let step = PATCH_LINES / PATCH_HUNKS;
    for hunk in 0..PATCH_HUNKS {
        let at = hunk * step + step / 2;
        patch.push_str("@@\n");
        for line in &lines[at - 3..at] {
            patch.push_str(&format!(" {line}\n"));
        }
        patch.push_str(&format!("-{}\n+{} // changed\n", lines[at], lines[at]));
        for line in &lines[at + 1..at + 4] {
            patch.push_str(&format!(" {line}\n"));
        }
    }
    patch.push_str("*** End Patch\n");
    (lines.join("\n") + "\n", patch)
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
