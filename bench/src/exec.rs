//! Code execution costs: a sandboxed `true` against a plain `true`, both
//! started from this process the way the server starts them, and
//! `apply_patch` on a 10,000-line file with 50 hunks against reading and
//! writing the same file.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use skillhost_actors::sandbox::cgroups::{Cgroups, GroupLimits};
use skillhost_actors::sandbox::launch::{Launcher, Run};
use skillhost_actors::workspace::uids::{UidPool, DEFAULT_UID_RANGE};
use skillhost_actors::workspace::{apply_patch, DirHandle, Workspace, WorkspaceOptions};

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
    let helper = std::fs::canonicalize("target/release/skillhost-sandbox").expect("the sandbox helper");
    let profile_dir = std::fs::canonicalize("sandbox-profiles").expect("sandbox-profiles");
    let plain_launcher = Launcher::new(helper.clone(), profile_dir.clone(), None);
    // What the server adds when the host allows it: a control group per command.
    let limits = GroupLimits { memory_bytes: 4096 * 1024 * 1024, processes: 128 };
    let cgroups = match Cgroups::detect(limits) {
        Ok(groups) => Some(Arc::new(groups)),
        Err(why) => {
            println!("  (no control groups on this host: {why})");
            None
        }
    };
    let grouped_launcher = Launcher::new(helper.clone(), profile_dir, cgroups.clone());
    let base = tempfile::tempdir().expect("tempdir");
    set_mode(base.path(), 0o711);
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let options = WorkspaceOptions {
        uids: root.then(|| UidPool::new(DEFAULT_UID_RANGE).expect("the uid lock folder")),
        size_cap: None,
        budget: None,
    };
    let workspace = Workspace::create(base.path(), &options).expect("workspace");
    let command = ["/usr/bin/true".to_string()];
    let run = Run {
        profile: "code-exec",
        workspace: workspace.path(),
        owner: workspace.owner(),
        skill: None,
        network: false,
        unconfined: false,
        command: &command,
        env: &[],
        read: &[],
        start_in: None,
        proxy: None,
        timeout: Duration::from_secs(10),
    };
    let start = |mut command: Command| {
        let started = Instant::now();
        let status = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).output().expect("spawn");
        let took = ms(started);
        assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
        took
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let through = |launcher: &Launcher| {
        let started = Instant::now();
        let ran = runtime.block_on(launcher.run(&run)).expect("the helper runs");
        let took = ms(started);
        assert_eq!(ran.exit_code, Some(0), "{}", ran.stderr);
        took
    };
    let through_server = || through(&grouped_launcher);
    // One of each first, unmeasured (page cache, first namespace setup);
    // then they alternate so drift hits both alike.
    start(plain_launcher.command(&run));
    through_server();
    start(Command::new("/usr/bin/true"));
    let (mut sandboxed, mut served, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    let mut ungrouped = Vec::new();
    for _ in 0..STARTS {
        sandboxed.push(start(plain_launcher.command(&run)));
        served.push(through_server());
        ungrouped.push(through(&plain_launcher));
        plain.push(start(Command::new("/usr/bin/true")));
    }
    if let Some(cgroups) = &cgroups {
        let (mut made, mut removed) = (Vec::new(), Vec::new());
        for _ in 0..STARTS {
            let started = Instant::now();
            let group = cgroups.create().expect("a group");
            made.push(ms(started));
            let started = Instant::now();
            drop(group);
            removed.push(ms(started));
        }
        println!("  a control group alone: made in {:.2} ms, removed in {:.2} ms", median(made), median(removed));
    }
    let (sandboxed, served, plain) = (median(sandboxed), median(served), median(plain));
    println!(
        "  `true`, median of {STARTS}: sandboxed {sandboxed:.2} ms, plain {plain:.2} ms, ratio {:.1}×",
        sandboxed / plain
    );
    println!(
        "  `true` as the server runs it (own uid{}, output pipes): {served:.2} ms, ratio {:.1}× plain",
        if cgroups.is_some() { ", own control group" } else { "" },
        served / plain
    );
    let ungrouped = median(ungrouped);
    println!(
        "  the same without a control group: {ungrouped:.2} ms ({:.1}× plain); the group costs {:.2} ms",
        ungrouped / plain,
        served - ungrouped
    );
    drop(workspace);

    let dir = tempfile::tempdir().expect("tempdir");
    let (original, patch) = patch_case();
    let file = dir.path().join("big.txt");
    let (mut patching, mut copying) = (Vec::new(), Vec::new());
    for _ in 0..PATCH_RUNS {
        std::fs::write(&file, &original).expect("write");
        let started = Instant::now();
        let handle = DirHandle::open(dir.path()).expect("the folder opens");
        let applied = apply_patch::apply(&handle, &patch).expect("the patch applies");
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
