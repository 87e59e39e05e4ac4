//! The sandbox against hostile scripts: a shell command (code-exec profile)
//! and a skill script (skills-run profile), each in bash and in Python, try
//! to escape, and each attempt must end as the table says. Runs the real
//! binary through `skillhost run-sandboxed`, the same helper the tools use.

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BINARY: &str = env!("CARGO_BIN_EXE_skillhost");

struct Setup {
    _dir: tempfile::TempDir,
    workspace: std::path::PathBuf,
    skill: std::path::PathBuf,
    other_skill: std::path::PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let workspace = dir.path().join("work");
    let skill = dir.path().join("skills/mine");
    let other_skill = dir.path().join("skills/other");
    for folder in [&workspace, &skill, &other_skill] {
        std::fs::create_dir_all(folder).unwrap();
    }
    std::fs::set_permissions(&workspace, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(other_skill.join("SKILL.md"), "secret of another skill").unwrap();
    Setup { _dir: dir, workspace, skill, other_skill }
}

/// Runs `program args` sandboxed; returns (exit code, stdout, stderr).
fn sandboxed(setup: &Setup, profile: &str, program: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(BINARY);
    command.args(["run-sandboxed", "--profile", profile, "--workspace"]).arg(&setup.workspace);
    if profile == "skills-run" {
        command.arg("--skill").arg(&setup.skill);
    }
    command.arg("--").args(program).env("SKILLHOST_TEST_SECRET", "hunter2");
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// One hostile attempt, written for bash and for Python; `allowed` says
/// whether it must succeed.
struct Attempt {
    what: &'static str,
    bash: String,
    python: String,
    allowed: bool,
}

fn attempts(setup: &Setup, port: u16) -> Vec<Attempt> {
    let other = setup.other_skill.join("SKILL.md").display().to_string();
    let mine = setup.skill.join("planted.txt").display().to_string();
    let py_read = |path: &str| format!("open('{path}').read()");
    let py_write = |path: &str| format!("open('{path}', 'w').write('x')");
    vec![
        Attempt { what: "read /etc/passwd", bash: "cat /etc/passwd >/dev/null".into(), python: py_read("/etc/passwd"), allowed: true },
        Attempt { what: "read /etc/shadow", bash: "cat /etc/shadow".into(), python: py_read("/etc/shadow"), allowed: false },
        Attempt { what: "read root's home", bash: "ls /root/".into(), python: "import os; os.listdir('/root')".into(), allowed: false },
        Attempt { what: "read another skill", bash: format!("cat {other}"), python: py_read(&other), allowed: false },
        Attempt { what: "write into its own skill", bash: format!("echo x > {mine}"), python: py_write(&mine), allowed: false },
        Attempt { what: "write into the workspace", bash: "echo x > made.txt".into(), python: py_write("made-by-python.txt"), allowed: true },
        Attempt {
            what: "write /proc/sys/kernel/hostname",
            bash: "echo evil > /proc/sys/kernel/hostname".into(),
            python: py_write("/proc/sys/kernel/hostname"),
            allowed: false,
        },
        Attempt {
            what: "connect to a listener on 127.0.0.1",
            bash: format!("exec 3<>/dev/tcp/127.0.0.1/{port}"),
            python: format!("import socket; socket.create_connection(('127.0.0.1', {port}), 2)"),
            allowed: false,
        },
        Attempt {
            what: "find the server's secret in the environment",
            bash: "env | grep -q hunter2 || grep -q hunter2 /proc/1/environ".into(),
            python: "import os,sys; sys.exit(0 if 'hunter2' in str(os.environ) or 'hunter2' in open('/proc/1/environ').read() else 1)".into(),
            allowed: false,
        },
    ]
}

#[test]
fn hostile_scripts_end_as_the_table_says() {
    let setup = setup();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    for profile in ["code-exec", "skills-run"] {
        for attempt in attempts(&setup, port) {
            for (language, program) in [
                ("bash", vec!["/bin/bash", "-c", attempt.bash.as_str()]),
                ("python", vec!["/usr/bin/python3", "-c", attempt.python.as_str()]),
            ] {
                let (code, _, stderr) = sandboxed(&setup, profile, &program);
                assert_eq!(
                    code == 0,
                    attempt.allowed,
                    "{profile}/{language}: '{}' exited {code}: {stderr}",
                    attempt.what
                );
            }
        }
    }
    assert!(!setup.skill.join("planted.txt").exists());
    assert!(setup.workspace.join("made.txt").exists());
    assert!(std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim() != "evil");
    drop(listener);
}

#[test]
fn tmp_is_private_and_background_children_die_with_the_call() {
    let setup = setup();
    let marker = format!("skillhost-sandbox-{}", std::process::id());
    let (code, _, stderr) = sandboxed(
        &setup,
        "code-exec",
        &["/bin/bash", "-c", &format!("echo x > /tmp/{marker} && test -f /tmp/{marker}")],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !Path::new(&format!("/tmp/{marker}")).exists(),
        "a file written to /tmp inside the sandbox is visible on the host"
    );

    // An odd duration, so `pgrep` finds this child and no other sleep on the
    // machine.
    let (code, stdout, _) = sandboxed(&setup, "code-exec", &["/bin/bash", "-c", "sleep 299.37 & echo $!"]);
    assert_eq!(code, 0);
    assert!(!stdout.trim().is_empty());
    // The namespace's teardown is asynchronous: wait (up to 10 s on a
    // loaded machine) for the child to be gone, not a fixed moment.
    let mut survivors = Vec::new();
    for _ in 0..100 {
        survivors = Command::new("pgrep").args(["-x", "-f", "sleep 299.37"]).output().unwrap().stdout;
        if survivors.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(survivors.is_empty(), "a background child outlived its call");
}

#[test]
fn commands_never_run_as_root() {
    let setup = setup();
    let (code, stdout, _) = sandboxed(&setup, "code-exec", &["/usr/bin/id", "-u"]);
    assert_eq!(code, 0);
    assert_ne!(stdout.trim(), "0");
    // The helper refuses uid 0, and a root helper given no uid at all.
    let profiles = Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-profiles");
    for uid in [Some("0"), None] {
        let mut command = Command::new(BINARY);
        command.arg("sandbox-exec").arg("--profile-dir").arg(&profiles).args(["--profile", "code-exec"]);
        command.arg("--workspace").arg(&setup.workspace);
        if let Some(uid) = uid {
            command.args(["--uid", uid]);
        }
        let output = command.args(["--", "/usr/bin/true"]).output().unwrap();
        if unsafe_is_root() {
            assert_eq!(output.status.code(), Some(125), "{uid:?}");
            assert!(String::from_utf8_lossy(&output.stderr).contains("commands never run as root"), "{uid:?}");
        }
    }
    // A uid range holding root is refused before anything runs.
    let output = Command::new(BINARY)
        .args(["run-sandboxed", "--profile", "code-exec", "--sandbox-uid-range", "0-10", "--workspace"])
        .arg(&setup.workspace)
        .args(["--", "/usr/bin/true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("must not include uid 0"));
}

fn unsafe_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

#[test]
fn doctor_reports_everything_confined() {
    let output = Command::new(BINARY).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Everything is confined."), "{text}");
}
