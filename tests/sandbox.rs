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

use skillhost_actors::sandbox::helper_args::{self, HelperArgs};

const BINARY: &str = env!("CARGO_BIN_EXE_skillhost");
const HELPER: &str = env!("CARGO_BIN_EXE_skillhost-sandbox");

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
        // A new name each run: runs may be leased different uids, and one may
        // not overwrite another's file.
        Attempt {
            what: "write into the workspace",
            bash: "echo x > made-$RANDOM$RANDOM.txt".into(),
            python: "import os; open(f'made-{os.urandom(8).hex()}.txt', 'w').write('x')".into(),
            allowed: true,
        },
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
    let made = std::fs::read_dir(&setup.workspace).unwrap().flatten();
    assert_eq!(made.filter(|e| e.file_name().to_string_lossy().starts_with("made-")).count(), 4);
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
    for uid in [Some(0), None] {
        let args = HelperArgs {
            profile_dir: profiles.clone(),
            profile: "code-exec".into(),
            workspace: setup.workspace.clone(),
            uid,
            command: vec!["/usr/bin/true".into()],
            ..HelperArgs::default()
        };
        let output = Command::new(HELPER).arg(helper_args::SUBCOMMAND).args(args.render()).output().unwrap();
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

/// When memory runs out the kernel picks a command, never the server first.
#[test]
fn a_command_is_the_first_the_kernel_kills() {
    let setup = setup();
    for profile in ["code-exec", "skills-run"] {
        let (code, stdout, stderr) = sandboxed(&setup, profile, &["/bin/cat", "/proc/self/oom_score_adj"]);
        assert_eq!((code, stdout.trim()), (0, "1000"), "{profile}: {stderr}");
    }
}

#[test]
fn doctor_reports_everything_confined() {
    let output = Command::new(BINARY).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Everything is confined."), "{text}");
}

/// The helper as the tools start it, and, as root, a leased uid for the
/// command, as a server's would have.
fn launcher_and_lease(
) -> (skillhost_actors::sandbox::launch::Launcher, Option<skillhost_actors::workspace::uids::UidLease>) {
    let launcher = skillhost_actors::sandbox::launch::Launcher::new(
        HELPER.into(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-profiles"),
        None,
    );
    let lease = unsafe_is_root().then(|| {
        let pool =
            skillhost_actors::workspace::uids::UidPool::new(skillhost_actors::workspace::uids::DEFAULT_UID_RANGE);
        pool.unwrap().lease().unwrap()
    });
    (launcher, lease)
}

/// What a program in the installer's network sees, printed one fact a line.
const NETWORK_PROBE: &str = r#"
import socket, sys, urllib.request
api, origin = int(sys.argv[1]), int(sys.argv[2])
try:
    socket.create_connection(("127.0.0.1", api), 2).close()
    print("api: reached")
except OSError:
    print("api: unreachable")
names = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:])
print("interfaces:", ",".join(names))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
print("through the proxy:", opener.open(f"http://127.0.0.1:{origin}/hello", timeout=10).read().decode())
try:
    opener.open(f"http://api.invalid:{api}/health", timeout=10)
except urllib.error.HTTPError as err:
    print("other hosts:", err.code)
"#;

/// The installer's network (`--proxy-channel`): only a loopback interface,
/// where the install proxy listens; the server's port on the host's
/// loopback is not there, and the proxy forwards only to its hosts.
#[tokio::test(flavor = "multi_thread")]
async fn the_installers_network_reaches_its_proxy_and_nothing_else() {
    use skillhost_actors::sandbox::egress::Egress;
    use skillhost_actors::sandbox::launch::Run;
    let setup = setup();
    // Stands for the server's own port: nothing may connect to it.
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    api.set_nonblocking(true).unwrap();
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin_port = origin.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in origin.incoming().flatten() {
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
        }
    });
    let egress = Egress::new(vec!["127.0.0.1".into()]);
    let (launcher, lease) = launcher_and_lease();
    let api_port = api.local_addr().unwrap().port().to_string();
    let command: Vec<String> =
        ["/usr/bin/python3", "-c", NETWORK_PROBE, &api_port, &origin_port.to_string()].map(String::from).into();
    for unconfined in [false, true] {
        let run = Run {
            profile: "code-exec",
            workspace: &setup.workspace,
            owner: lease.as_ref().map(|l| (l.uid(), l.uid())),
            skill: None,
            network: false,
            unconfined,
            command: &command,
            env: &[],
            read: &[],
            start_in: None,
            proxy: Some(&egress),
            timeout: Duration::from_secs(60),
        };
        let ran = launcher.run(&run).await.unwrap();
        assert_eq!(ran.exit_code, Some(0), "unconfined={unconfined}: {ran:?}");
        assert_eq!(
            ran.stdout, "api: unreachable\ninterfaces: lo\nthrough the proxy: hello\nother hosts: 403\n",
            "unconfined={unconfined}: {}",
            ran.stderr
        );
        assert!(api.accept().is_err(), "nothing connected to the server's port");
    }
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!((egress.stats().forwarded.load(Relaxed), egress.stats().refused.load(Relaxed)), (2, 2));
}

/// Unconfined (the operator's choice, or no sandbox on the host), a command
/// still cannot leave a process behind: `setsid` takes a child out of the
/// process group, but not out of the command's own pid namespace.
#[tokio::test(flavor = "multi_thread")]
async fn an_unconfined_commands_setsid_child_dies_with_it() {
    use skillhost_actors::sandbox::launch::Run;
    let setup = setup();
    let (launcher, lease) = launcher_and_lease();
    // A sleep no other test starts, out of the group and off the pipes.
    let line = "setsid sleep 9876 </dev/null >/dev/null 2>&1 & echo started";
    let command: Vec<String> = ["/bin/bash", "-c", line].map(String::from).into();
    let run = Run {
        profile: "code-exec",
        workspace: &setup.workspace,
        owner: lease.as_ref().map(|l| (l.uid(), l.uid())),
        skill: None,
        network: false,
        unconfined: true,
        command: &command,
        env: &[],
        read: &[],
        start_in: None,
        proxy: None,
        timeout: Duration::from_secs(60),
    };
    let ran = launcher.run(&run).await.unwrap();
    assert_eq!((ran.exit_code, ran.stdout.as_str()), (Some(0), "started\n"), "{}", ran.stderr);
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.trim() == "sleep 9876")
        .collect();
    assert!(survivors.is_empty(), "the setsid child outlived its command: {survivors:?}");
}

/// A command taken by a helper started ahead of it (`sandbox-warm`) runs
/// exactly as one started for it: its own uid, its own control group, no
/// descriptor but 0-2, an empty stdin, and the helper's start is off the
/// command's path.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_on_a_warm_helper_is_confined_as_a_cold_one() {
    use skillhost_actors::sandbox::cgroups::{Cgroups, GroupLimits};
    use skillhost_actors::sandbox::launch::{Run, WARM_HELPERS};
    let setup = setup();
    let (launcher, lease) = launcher_and_lease();
    let limits = GroupLimits { memory_bytes: 512 * 1024 * 1024, processes: 64 };
    let cgroups = unsafe_is_root().then(|| std::sync::Arc::new(Cgroups::detect(limits).unwrap()));
    let launcher = launcher.with_cgroups(cgroups.clone());
    let line = "id -u; grep -c cmd- /proc/self/cgroup; ls /proc/self/fd | wc -l; head -c 1 | wc -c";
    let command: Vec<String> = ["/bin/bash", "-c", line].map(String::from).into();
    let run = Run {
        profile: "code-exec",
        workspace: &setup.workspace,
        owner: lease.as_ref().map(|l| (l.uid(), l.uid())),
        skill: None,
        network: false,
        unconfined: false,
        command: &command,
        env: &[],
        read: &[],
        start_in: None,
        proxy: None,
        timeout: Duration::from_secs(30),
    };
    let mut outputs = Vec::new();
    for round in 0..3 {
        // The first round starts its own helper; later ones find one ready.
        assert_eq!(launcher.warm_ready(), if round == 0 { 0 } else { WARM_HELPERS }, "round {round}");
        let ran = launcher.run(&run).await.unwrap();
        assert_eq!(ran.exit_code, Some(0), "{ran:?}");
        outputs.push(ran.stdout);
        for _ in 0..200 {
            if launcher.warm_ready() == WARM_HELPERS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let uid = lease.as_ref().map_or_else(|| unsafe { libc::geteuid() }.to_string(), |l| l.uid().to_string());
    // v1 lists a line per controller tree the group is in, v2 one line.
    let groups = cgroups.as_ref().map_or(0, |_| outputs[0].lines().nth(1).unwrap().parse::<usize>().unwrap());
    assert!(cgroups.is_none() || groups >= 1, "{outputs:?}");
    for output in &outputs {
        assert_eq!(output, &format!("{uid}\n{groups}\n4\n0\n"), "{outputs:?}");
    }
}

/// A descriptor the server holds without close-on-exec (a C library's
/// file, say) reaches neither the helper's command nor an unconfined one:
/// the helper marks what it inherited close-on-exec as it starts, and
/// birdcage (patched) opens its own pipes so; no trampoline is left to
/// close them.
#[tokio::test(flavor = "multi_thread")]
async fn a_descriptor_the_server_leaks_reaches_no_command() {
    use skillhost_actors::sandbox::launch::Run;
    let setup = setup();
    let (launcher, lease) = launcher_and_lease();
    let secret = setup.workspace.join("held-by-the-server.txt");
    std::fs::write(&secret, "server state\n").unwrap();
    let path = std::ffi::CString::new(secret.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: open with a valid C string; the descriptor is closed below.
    let leaked = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
    assert!(leaked > 2, "{}", std::io::Error::last_os_error());
    // The glob lists the folder through a descriptor of its own, gone
    // by the time readlink runs: hence `|| true`.
    let line = "ls /proc/self/fd | wc -l; for fd in /proc/self/fd/*; do readlink $fd || true; done";
    let command: Vec<String> = ["/bin/bash", "-c", line].map(String::from).into();
    for unconfined in [false, true] {
        let run = Run {
            profile: "code-exec",
            workspace: &setup.workspace,
            owner: lease.as_ref().map(|l| (l.uid(), l.uid())),
            skill: None,
            network: false,
            unconfined,
            command: &command,
            env: &[],
            read: &[],
            start_in: None,
            proxy: None,
            timeout: Duration::from_secs(30),
        };
        let ran = launcher.run(&run).await.unwrap();
        assert_eq!(ran.exit_code, Some(0), "{ran:?}");
        // 0, 1, 2 and ls's own listing of the folder.
        assert_eq!(ran.stdout.lines().next(), Some("4"), "unconfined {unconfined}: {}", ran.stdout);
        assert!(!ran.stdout.contains("held-by-the-server"), "unconfined {unconfined}: {}", ran.stdout);
    }
    // SAFETY: the descriptor opened above.
    unsafe { libc::close(leaked) };
}

/// A warm helper reads the launcher's framed line and nothing else: a line
/// cut short, one naming control groups or a descriptor, is refused before
/// anything runs.
#[test]
fn a_warm_helper_refuses_a_line_it_cannot_take() {
    use std::io::Write;
    let setup = setup();
    let base = HelperArgs {
        profile_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-profiles"),
        profile: "code-exec".into(),
        workspace: setup.workspace.clone(),
        uid: unsafe_is_root().then_some(1879048190),
        command: vec!["/usr/bin/echo".into(), "ran".into()],
        ..HelperArgs::default()
    };
    let framed = helper_args::frame(&base.render());
    let with_group = HelperArgs { cgroups: vec!["/sys/fs/cgroup".into()], ..base.clone() };
    let with_channel = HelperArgs { proxy_channel: Some(3), ..base.clone() };
    let cases: Vec<(Vec<u8>, Option<i32>, &str)> = vec![
        (framed.clone(), Some(0), ""),
        (framed[..framed.len() - 1].to_vec(), Some(125), "stops inside an argument"),
        (helper_args::frame(&with_group.render()), Some(125), "takes no --cgroup or --proxy-channel"),
        (helper_args::frame(&with_channel.render()), Some(125), "takes no --cgroup or --proxy-channel"),
        (Vec::new(), Some(125), "no command after '--'"),
    ];
    for (line, code, says) in cases {
        let mut child = Command::new(HELPER)
            .arg(helper_args::WARM_SUBCOMMAND)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&line).unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), code, "{says}: {stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        if code == Some(0) {
            assert_eq!(String::from_utf8_lossy(&output.stdout), "ran\n");
        }
    }
}
