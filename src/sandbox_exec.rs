//! `skillhost sandbox-exec`: the one place that enters the OS sandbox.
//!
//! It runs in a fresh process started by the server (or by
//! `run-sandboxed`), dispatched from `main` before any thread exists,
//! because birdcage refuses a multi-threaded caller and rewrites its caller's
//! environment. In order: load the profile, move into the working folder,
//! set the environment, set resource limits, drop to the unprivileged user,
//! and then either enter birdcage (namespaces, a tmpfs root holding only the
//! allowed paths, seccomp, no network unless allowed) or, when the operator
//! chose to run unconfined, exec the command directly.

use std::ffi::{CString, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use birdcage::{Birdcage, Exception, Sandbox};
use clap::Args;
use skillhost_actors::sandbox::profile::{Limits, Profile};

/// Exit status when the sandbox itself fails (the command never ran).
pub const SANDBOX_FAILURE: u8 = 125;

/// Devices every command may use: `/dev/null` read-write (bash background
/// jobs redirect to it), zero and randomness read-only.
const DEVICES_READ_WRITE: [&str; 1] = ["/dev/null"];
const DEVICES_READ: [&str; 2] = ["/dev/zero", "/dev/urandom"];
/// The environment a command sees; the server passes these values in.
pub const PASSED_ENVIRONMENT: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];

#[derive(Debug, Args)]
pub struct SandboxExecArgs {
    /// Folder holding the profiles
    #[arg(long)]
    pub profile_dir: PathBuf,
    /// Profile name (a file <name>.yaml in the profile folder)
    #[arg(long)]
    pub profile: String,
    /// The working folder, read-write; HOME, PWD and TMPDIR point into it
    #[arg(long)]
    pub workspace: PathBuf,
    /// A skill folder the command may read
    #[arg(long)]
    pub skill: Option<PathBuf>,
    /// Let the command use the network
    #[arg(long)]
    pub allow_network: bool,
    /// Run without the sandbox (the operator's explicit choice)
    #[arg(long)]
    pub unconfined: bool,
    /// User to run as when started as root
    #[arg(long, default_value = "nobody")]
    pub user: String,
    /// The command and its arguments
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Runs the command; returns the exit status to leave with.
pub fn run(args: SandboxExecArgs) -> Result<u8, String> {
    let profile = Profile::load(&args.profile_dir, &args.profile)?;
    let workspace = args
        .workspace
        .canonicalize()
        .map_err(|err| format!("the working folder {} cannot be used: {err}", args.workspace.display()))?;
    std::env::set_current_dir(&workspace).map_err(|err| format!("cannot enter {}: {err}", workspace.display()))?;
    let temp = workspace.join(".tmp");
    let _ = std::fs::create_dir_all(&temp);
    prepare_environment(&workspace, &temp);
    set_limits(&profile.limits)?;
    drop_privileges(&args.user, &[&workspace, &temp])?;

    let (program, arguments) = args.command.split_first().ok_or("no command was given")?;
    if args.unconfined {
        let err = std::process::Command::new(program).args(arguments).exec();
        return Err(format!("cannot run {}: {err}", program.to_string_lossy()));
    }
    let mut sandbox = Birdcage::new();
    let mut allow = |exception: Exception| -> Result<(), String> {
        sandbox.add_exception(exception).map(|_| ()).map_err(|err| format!("cannot set up the sandbox: {err}"))
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
    for name in PASSED_ENVIRONMENT.iter().chain(&["HOME", "PWD", "TMPDIR", "PYTHONDONTWRITEBYTECODE"]) {
        allow(Exception::Environment(name.to_string()))?;
    }
    if args.allow_network {
        allow(Exception::Networking)?;
    }
    let mut command = birdcage::process::Command::new(program);
    command.args(arguments);
    let mut child = sandbox.spawn(command).map_err(|err| format!("cannot start the sandbox: {err}"))?;
    let status = child.wait().map_err(|err| format!("cannot wait for the command: {err}"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(signal)) => (128 + signal).clamp(0, 255) as u8,
        (None, None) => SANDBOX_FAILURE,
    })
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
    std::env::set_var("TMPDIR", temp);
    // Python keys its cached bytecode on the source's mtime in whole seconds
    // and its size, so a same-size edit within a second of the last run
    // would execute the old code. Writing no cache also keeps __pycache__
    // out of the workspace and its artifacts.
    std::env::set_var("PYTHONDONTWRITEBYTECODE", "1");
}

fn set_limits(limits: &Limits) -> Result<(), String> {
    let mb = 1024 * 1024;
    let set = |resource, value: u64, what: &str| {
        let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(format!("cannot limit {what}: {}", std::io::Error::last_os_error()));
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

/// Started as root, become `user` (and hand it the working folders); never
/// run a command as root.
fn drop_privileges(user: &str, owned: &[&Path]) -> Result<(), String> {
    // SAFETY: plain getters.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let name = CString::new(user).map_err(|_| format!("the sandbox user '{user}' is not a valid name"))?;
    // SAFETY: getpwnam returns a pointer into static storage or null; the
    // process is single-threaded, so nothing else uses that storage.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return Err(format!("the sandbox user '{user}' does not exist on this host"));
    }
    // SAFETY: `entry` is non-null and points at a valid passwd record.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    if uid == 0 {
        return Err(format!("the sandbox user '{user}' is root; commands never run as root"));
    }
    for path in owned {
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| "a working folder path holds a NUL".to_string())?;
        // SAFETY: chown on a NUL-terminated path.
        if unsafe { libc::chown(c_path.as_ptr(), uid, gid) } != 0 {
            return Err(format!(
                "cannot hand {} to the sandbox user: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
    }
    // SAFETY: standard privilege drop: supplementary groups, then gid, then uid.
    let dropped =
        unsafe { libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(gid) == 0 && libc::setuid(uid) == 0 };
    // SAFETY: plain getters.
    if !dropped || unsafe { libc::getuid() == 0 || libc::geteuid() == 0 } {
        return Err(format!("cannot become the sandbox user '{user}': {}", std::io::Error::last_os_error()));
    }
    // Changing credentials made the process non-dumpable, which leaves its
    // /proc/self files owned by root; birdcage must write its own uid_map
    // there to build the user namespace. Core dumps stay off (RLIMIT_CORE).
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) } != 0 {
        return Err(format!("cannot prepare the sandbox user: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
