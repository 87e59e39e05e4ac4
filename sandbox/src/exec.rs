//! `skillhost-sandbox sandbox-exec`: the one place that enters the OS sandbox.
//!
//! It runs in a fresh process started by the server (or by
//! `run-sandboxed`), dispatched from `main` before any thread exists,
//! because birdcage refuses a multi-threaded caller and rewrites its caller's
//! environment. In order: load the profile, move into the working folder,
//! set the environment, set resource limits, drop to the unprivileged user,
//! and then either enter birdcage (namespaces, a tmpfs root holding only the
//! allowed paths, seccomp, no network unless allowed) or, when the operator
//! chose to run unconfined, exec the command directly.

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use birdcage::{Birdcage, Exception, Sandbox};

use crate::args::{HelperArgs, HelperArgsError};
use crate::private_net::PrivateNetError;
use crate::profile::{Limits, Profile, ProfileError};

/// A command's OOM priority, the highest: when memory runs out the kernel
/// kills commands before anything else, the server above all.
pub const COMMAND_OOM_SCORE_ADJ: i32 = 1000;

/// Exit status when the sandbox itself fails (the command never ran).
pub const SANDBOX_FAILURE: u8 = 125;

/// Devices every command may use: `/dev/null` read-write (bash background
/// jobs redirect to it), zero and randomness read-only.
const DEVICES_READ_WRITE: [&str; 1] = ["/dev/null"];
const DEVICES_READ: [&str; 2] = ["/dev/zero", "/dev/urandom"];
/// The environment a command sees; the server passes these values in.
pub const PASSED_ENVIRONMENT: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];
/// What the helper sets itself, pointing into the working folder.
const OWN_ENVIRONMENT: [&str; 6] = ["HOME", "PWD", "TMPDIR", "TEMP", "TMP", "PYTHONDONTWRITEBYTECODE"];

/// Why the helper stopped before the command ran. `main` prints it and
/// exits with [`SANDBOX_FAILURE`], which the launcher reports as a command
/// that did not run; nothing of the command's was started.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The profile named cannot be used.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// A step of setting the command up failed on this host.
    #[error("{step}: {source}")]
    Step { step: String, source: std::io::Error },
    /// The command line asks for what the helper never does: a command as
    /// root, a start folder that is not one name, no command at all.
    #[error("{0}")]
    Refused(String),
    /// birdcage could not take an exception or start the sandbox.
    #[error("{step}: {reason}")]
    Sandbox { step: &'static str, reason: String },
    /// The installer's own network could not be made or handed over.
    #[error(transparent)]
    PrivateNetwork(#[from] PrivateNetError),
    /// A warm helper's command line on stdin could not be read.
    #[error("the command line on stdin: {0}")]
    Framed(#[from] HelperArgsError),
}

/// The error of a failed step, as `map_err` takes it.
fn failed<E: Into<std::io::Error>>(step: impl Into<String>) -> impl FnOnce(E) -> HelperError {
    let step = step.into();
    move |err| HelperError::Step { step, source: err.into() }
}

/// Runs the command; returns the exit status to leave with.
pub fn run(args: HelperArgs) -> Result<u8, HelperError> {
    join(&args.cgroups)?;
    run_joined(args)
}

/// A helper started before its command: joins `groups` at once, then
/// waits for its command line on stdin (framed, up to EOF) and runs it.
///
/// Joining a control group is the slow part of starting a command on most
/// hosts (moving a process takes a lock that waits for an RCU grace
/// period); done here it is over before the command is even known.
pub fn run_warm(groups: Vec<PathBuf>) -> Result<u8, HelperError> {
    join(&groups)?;
    let mut framed = Vec::new();
    // One byte past the limit tells a line at the limit from a longer one.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::io::stdin().lock(), crate::args::MAX_FRAMED_BYTES as u64 + 1),
        &mut framed,
    )
    .map_err(failed("cannot read the command line"))?;
    let args = HelperArgs::parse(crate::args::unframe(&framed)?)?;
    // The groups were the server's to choose when this helper started; a
    // line that names others or a descriptor (never inherited by a warm
    // helper) is not one the launcher wrote.
    if !args.cgroups.is_empty() || args.proxy_channel.is_some() {
        return Err(HelperError::Refused("a warm helper takes no --cgroup or --proxy-channel on stdin".into()));
    }
    // The command's stdin is empty, as a cold helper's is.
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(failed("cannot open /dev/null"))?;
    // SAFETY: dup2 onto descriptor 0 of this single-threaded process;
    // `null` stays open until it returns.
    if unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 0) } != 0 {
        return Err(failed("cannot empty stdin")(std::io::Error::last_os_error()));
    }
    drop(null);
    run_joined(args)
}

/// Joins each control group, as root, before the drop: the command cannot
/// leave them.
fn join(groups: &[PathBuf]) -> Result<(), HelperError> {
    for group in groups {
        std::fs::write(group.join("cgroup.procs"), std::process::id().to_string())
            .map_err(failed(format!("cannot join the control group {}", group.display())))?;
    }
    Ok(())
}

fn run_joined(args: HelperArgs) -> Result<u8, HelperError> {
    let profile = Profile::load(&args.profile_dir, &args.profile)?;
    // The path comes from the server (a folder it made) or the operator;
    // it is opened once, without following a link at its end, and every
    // later step uses the descriptor.
    let workspace = args
        .workspace
        .canonicalize()
        .map_err(failed(format!("the working folder {} cannot be used", args.workspace.display())))?;
    let folder = rustix::fs::open(
        &workspace,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(failed(format!("the working folder {} cannot be opened", workspace.display())))?;
    let owner = sandbox_owner(args.uid, args.gid)?;
    if let Some((uid, gid)) = owner {
        // Only the folder itself, by descriptor: never a path inside it,
        // where a command could have left a link to a host file.
        rustix::fs::fchown(&folder, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
            .map_err(failed(format!("cannot hand {} to the sandbox user", workspace.display())))?;
    }
    rustix::process::fchdir(&folder).map_err(failed(format!("cannot enter {}", workspace.display())))?;
    drop(folder);
    let temp = workspace.join(".tmp");
    prepare_environment(&workspace, &temp);
    for (name, value) in &args.env {
        std::env::set_var(name, value);
    }
    set_limits(&profile.limits)?;
    // Raising one's own score needs no privilege; children inherit it.
    std::fs::write("/proc/self/oom_score_adj", COMMAND_OOM_SCORE_ADJ.to_string())
        .map_err(failed("cannot set the command's OOM priority"))?;
    if let Some(fd) = args.proxy_channel {
        // Before the drop: as root the namespace needs no user namespace.
        // SAFETY: the server passed this descriptor for this alone.
        let channel = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
        crate::private_net::make_and_hand_over(channel)?;
    }
    if let Some((uid, gid)) = owner {
        drop_privileges(uid, gid)?;
    }
    // Made as the sandbox user, so whatever is already at that name (a
    // link a command left) reaches nothing that user could not.
    let _ = std::fs::DirBuilder::new().mode(0o700).create(".tmp");
    if let Some(name) = &args.start_in {
        enter_folder(name, &workspace)?;
    }
    if let Some(cwd) = &args.cwd {
        // After the drop: the sandbox user must be able to reach it.
        std::env::set_current_dir(cwd).map_err(failed(format!("cannot start in {}", cwd.display())))?;
        std::env::set_var("PWD", cwd);
    }
    // No descriptor of this process but 0-2 may reach the command.
    close_inherited_descriptors();

    let (program, arguments) =
        args.command.split_first().ok_or_else(|| HelperError::Refused("no command was given".into()))?;
    if args.unconfined {
        return run_unconfined(program, arguments);
    }
    let mut sandbox = Birdcage::new();
    let mut allow = |exception: Exception| -> Result<(), HelperError> {
        sandbox
            .add_exception(exception)
            .map(|_| ())
            .map_err(|err| HelperError::Sandbox { step: "cannot set up the sandbox", reason: err.to_string() })
    };
    // Paths that do not exist on this host are skipped: the profile is
    // shared across distributions.
    for path in profile.read.iter().filter(|p| p.exists()) {
        allow(Exception::Read(path.clone()))?;
    }
    for path in profile.execute.iter().filter(|p| p.exists()) {
        allow(Exception::ExecuteAndRead(path.clone()))?;
    }
    for device in DEVICES_READ_WRITE {
        allow(Exception::WriteAndRead(PathBuf::from(device)))?;
    }
    for device in DEVICES_READ {
        allow(Exception::Read(PathBuf::from(device)))?;
    }
    allow(Exception::WriteAndRead(workspace.clone()))?;
    if let Some(skill) = &args.skill {
        allow(Exception::Read(skill.clone()))?;
    }
    // The operator's code for a service: readable and runnable (Python's
    // and node's native modules are mapped executable), never writable.
    if let Some(cwd) = &args.cwd {
        allow(Exception::ExecuteAndRead(cwd.clone()))?;
    }
    for path in &args.execute {
        allow(Exception::ExecuteAndRead(path.clone()))?;
    }
    for path in &args.read {
        allow(Exception::Read(path.clone()))?;
    }
    for name in PASSED_ENVIRONMENT.iter().chain(&OWN_ENVIRONMENT) {
        allow(Exception::Environment(name.to_string()))?;
    }
    for (name, _) in &args.env {
        allow(Exception::Environment(name.clone()))?;
    }
    // With a network of its own, the command keeps it: birdcage would
    // otherwise replace it with an empty one.
    if args.allow_network || args.proxy_channel.is_some() {
        allow(Exception::Networking)?;
    }
    // The command starts with descriptors 0 to 2 alone: everything this
    // helper inherited was marked close-on-exec when it started
    // ([`close_inherited_descriptors`]), and birdcage (patched, see
    // sandbox/vendor/birdcage/VENDORED.md) opens its own pipes so.
    let mut command = birdcage::process::Command::new(program);
    command.args(arguments);
    let mut child = sandbox
        .spawn(command)
        .map_err(|err| HelperError::Sandbox { step: "cannot start the sandbox", reason: err.to_string() })?;
    let status = child.wait().map_err(failed("cannot wait for the command"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(signal)) => (128 + signal).clamp(0, 255) as u8,
        (None, None) => SANDBOX_FAILURE,
    })
}

/// Runs the command without the sandbox, but as the first process of a pid
/// namespace of its own where the host allows one: when it ends, or when
/// the server kills its process group, the kernel kills everything it
/// started, a `setsid` child that left the group included. Where no pid
/// namespace can be made (no user namespaces and not root) the command is
/// run in place, and only its process group (and control group, where
/// there is one) bounds it.
fn run_unconfined(program: &OsString, arguments: &[OsString]) -> Result<u8, HelperError> {
    // Where none can be made the command runs in place, silently: its
    // result already says it was not confined, and a line in every output
    // would only distract the model.
    if enter_pid_namespace().is_err() {
        let err = std::process::Command::new(program).args(arguments).exec();
        return Err(failed(format!("cannot run {}", program.to_string_lossy()))(err));
    }
    // The first child is the namespace's init: the command itself.
    let mut child = std::process::Command::new(program)
        .args(arguments)
        .spawn()
        .map_err(failed(format!("cannot run {}", program.to_string_lossy())))?;
    let status = child.wait().map_err(failed("cannot wait for the command"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(signal)) => (128 + signal).clamp(0, 255) as u8,
        (None, None) => SANDBOX_FAILURE,
    })
}

/// Makes the next child of this process the first of a new pid namespace
/// (with a user namespace mapping this process's ids to themselves when it
/// is not root). The process must be single-threaded.
fn enter_pid_namespace() -> std::io::Result<()> {
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: unshare with constant flags changes only this process.
    if uid == 0 && unsafe { libc::unshare(libc::CLONE_NEWPID) } == 0 {
        return Ok(());
    }
    // SAFETY: as above.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let write = |file: &str, text: String| std::fs::write(format!("/proc/self/{file}"), text);
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("setgroups", "deny".into())?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// Marks every descriptor above 2 close-on-exec, with `close_range` (Linux
/// 5.11+) or one by one where it is missing. The helper does this first of
/// all: what the server's process held without the flag (a library's file,
/// a socket) must not reach a command.
pub fn close_inherited_descriptors() {
    // SAFETY: close_range with constant arguments changes only flags of
    // this process's own descriptors.
    let marked = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if marked == 0 {
        return;
    }
    let open: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|entries| entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    for fd in open.into_iter().filter(|fd| *fd > 2) {
        // SAFETY: setting FD_CLOEXEC on a descriptor number; a stale one
        // (the directory listing's own) fails harmlessly.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// Moves into `name`, one folder directly inside the working folder
/// (already the current one), opened without following a link.
fn enter_folder(name: &str, workspace: &Path) -> Result<(), HelperError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(HelperError::Refused(format!("--start-in takes one folder name, not '{name}'")));
    }
    let flags = rustix::fs::OFlags::RDONLY
        | rustix::fs::OFlags::DIRECTORY
        | rustix::fs::OFlags::NOFOLLOW
        | rustix::fs::OFlags::CLOEXEC;
    let folder = rustix::fs::openat(rustix::fs::CWD, name, flags, rustix::fs::Mode::empty())
        .map_err(failed(format!("cannot open the start folder {name}")))?;
    rustix::process::fchdir(&folder).map_err(failed(format!("cannot enter the start folder {name}")))?;
    std::env::set_var("PWD", workspace.join(name));
    Ok(())
}

/// Started as root, the uid and gid commands run as: given by the server
/// (the workspace's own), never 0. `None` when not started as root.
fn sandbox_owner(uid: Option<u32>, gid: Option<u32>) -> Result<Option<(u32, u32)>, HelperError> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let Some(uid) = uid else {
        return Err(HelperError::Refused("started as root without --uid; commands never run as root".into()));
    };
    let gid = gid.unwrap_or(uid);
    if uid == 0 || gid == 0 {
        return Err(HelperError::Refused("the sandbox user is root; commands never run as root".into()));
    }
    Ok(Some((uid, gid)))
}

/// Keeps only the passed variables and points HOME, PWD and TMPDIR into the
/// working folder. The process is single-threaded, so changing its own
/// environment is sound.
fn prepare_environment(workspace: &Path, temp: &Path) {
    let keep: Vec<(String, String)> =
        PASSED_ENVIRONMENT.iter().filter_map(|name| std::env::var(name).ok().map(|v| (name.to_string(), v))).collect();
    for (name, _) in std::env::vars_os().collect::<Vec<_>>() {
        std::env::remove_var(name);
    }
    for (name, value) in keep {
        std::env::set_var(name, value);
    }
    std::env::set_var("HOME", workspace);
    std::env::set_var("PWD", workspace);
    // Programs differ in which of the three they read.
    for name in ["TMPDIR", "TEMP", "TMP"] {
        std::env::set_var(name, temp);
    }
    // Python keys its cached bytecode on the source's mtime in whole seconds
    // and its size, so a same-size edit within a second of the last run
    // would execute the old code. Writing no cache also keeps __pycache__
    // out of the workspace and its artifacts.
    std::env::set_var("PYTHONDONTWRITEBYTECODE", "1");
}

fn set_limits(limits: &Limits) -> Result<(), HelperError> {
    let mb = 1024 * 1024;
    let set = |resource, value: u64, what: &str| {
        let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(failed(format!("cannot limit {what}"))(std::io::Error::last_os_error()));
        }
        Ok(())
    };
    set(libc::RLIMIT_CPU, limits.cpu_seconds, "CPU time")?;
    set(libc::RLIMIT_AS, limits.address_space_mb * mb, "memory")?;
    set(libc::RLIMIT_NPROC, limits.processes, "processes")?;
    set(libc::RLIMIT_FSIZE, limits.file_size_mb * mb, "file size")?;
    // No core dumps of model-written programs in the working folder.
    set(libc::RLIMIT_CORE, 0, "core dumps")
}

/// Becomes `uid`/`gid` with no supplementary groups; never runs a command
/// as root.
fn drop_privileges(uid: u32, gid: u32) -> Result<(), HelperError> {
    // SAFETY: standard privilege drop: supplementary groups, then gid, then uid.
    let dropped =
        unsafe { libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(gid) == 0 && libc::setuid(uid) == 0 };
    // SAFETY: plain getters.
    if !dropped || unsafe { libc::getuid() == 0 || libc::geteuid() == 0 } {
        return Err(failed(format!("cannot become uid {uid}"))(std::io::Error::last_os_error()));
    }
    // Changing credentials made the process non-dumpable, which leaves its
    // /proc/self files owned by root; birdcage must write its own uid_map
    // there to build the user namespace. Core dumps stay off (RLIMIT_CORE).
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) } != 0 {
        return Err(failed("cannot prepare the sandbox user")(std::io::Error::last_os_error()));
    }
    Ok(())
}
