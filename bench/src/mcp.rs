//! MCP stdio servers: the reference server-everything (from npm, in
//! tests/mcp-servers) started by the hub as the server starts it, confined
//! by the sandbox helper (the `mcp` profile) against the same server with
//! `--skills-sandbox off` (the helper without the sandbox). Two figures: a
//! call of its `echo` tool after start, and its cold start (spawn,
//! handshake, first listing). The two kinds alternate, so drift in the
//! machine's speed hits both alike.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use skillhost_actors::sandbox::interpreters::Interpreters;
use skillhost_actors::sandbox::launch::{Launcher, SandboxMode};
use skillhost_actors::sandbox::{ExecRuntime, ExecSettings};
use skillhost_actors::tools::mcp::config::parse_servers;
use skillhost_actors::tools::mcp::hub::{HubSettings, McpHub, DEFAULT_CALL_TIMEOUT, START_TIMEOUT};
use skillhost_actors::tools::mcp::McpSelection;
use skillhost_actors::workspace::uids::{UidPool, DEFAULT_UID_RANGE};
use skillhost_actors::workspace::WorkspaceOptions;

/// Cold starts of each kind, and calls per started server.
const STARTS: usize = 5;
const CALLS: usize = 200;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// One hub over server-everything, confined or not.
fn hub(mode: SandboxMode, servers: &std::path::Path, base: &std::path::Path) -> Arc<McpHub> {
    let helper = std::fs::canonicalize("target/release/skillhost-sandbox").expect("the sandbox helper");
    let profile_dir = std::fs::canonicalize("sandbox-profiles").expect("sandbox-profiles");
    let launcher = Launcher::new(helper, profile_dir, None);
    let mut settings = ExecSettings::confined(launcher, Interpreters::detect());
    settings.mode = mode;
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let workspaces = WorkspaceOptions {
        uids: root.then(|| UidPool::new(DEFAULT_UID_RANGE).expect("the uid lock folder")),
        size_cap: None,
        budget: None,
    };
    let exec =
        ExecRuntime { settings: Arc::new(settings), workspace_base: base.to_path_buf(), workspaces, code_exec: false };
    let everything = servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let config = json!({"everything": {"command": "node", "args": [everything, "stdio"], "read": [servers]}});
    let servers = parse_servers(&config, "bench", &|_| None).expect("the bench's server");
    let settings =
        HubSettings { exec: Some(Arc::new(exec)), call_timeout: DEFAULT_CALL_TIMEOUT, start_timeout: START_TIMEOUT };
    Arc::new(McpHub::new(servers, settings))
}

pub fn run() {
    let status = Command::new("cargo").args(["build", "--release", "-p", "skillhost"]).status().expect("cargo");
    assert!(status.success(), "building the server failed");
    let source = PathBuf::from("tests/mcp-servers/node_modules");
    assert!(source.exists(), "{} is missing: run `make mcp-deps`", source.display());
    // Where a sandbox uid can read it (the checkout may be under /root).
    let servers = tempfile::tempdir().expect("tempdir");
    let base = tempfile::tempdir().expect("tempdir");
    for dir in [servers.path(), base.path()] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("mode");
    }
    let copied = Command::new("cp").arg("-r").arg(&source).arg(servers.path()).status().expect("cp");
    assert!(copied.success());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let kinds = [("confined", SandboxMode::Required), ("--skills-sandbox off", SandboxMode::Off)];
    let (mut starts, mut calls): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (vec![Vec::new(); 2], vec![Vec::new(); 2]);
    runtime.block_on(async {
        for _ in 0..STARTS {
            for (k, (_, mode)) in kinds.iter().enumerate() {
                let hub = hub(*mode, servers.path(), base.path());
                let started = Instant::now();
                let turn = hub.for_turn(&McpSelection::default()).await;
                starts[k].push(ms(started));
                assert!(turn.tools.contains_key("mcp__everything__echo"), "server-everything did not start");
                for n in 0..CALLS {
                    let arguments = json!({"message": format!("call {n}")}).as_object().cloned().expect("object");
                    let started = Instant::now();
                    let answer = hub.call("everything", "echo", arguments, None).await;
                    calls[k].push(ms(started));
                    assert!(answer.ok, "{}", answer.text);
                }
                hub.shutdown().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let (confined, open) = (median(calls[0].clone()), median(calls[1].clone()));
    println!(
        "  a call of server-everything's echo      {confined:>6.2} ms confined, {open:.2} ms with {}: {:+.2} ms a call (median of {})",
        kinds[1].0,
        confined - open,
        calls[0].len()
    );
    let (confined, open) = (median(starts[0].clone()), median(starts[1].clone()));
    println!(
        "  its cold start (spawn, handshake, list) {confined:>6.0} ms confined, {open:.0} ms with {}: {:.2}x (median of {STARTS})",
        kinds[1].0,
        confined / open
    );
}
