//! Starting `skillhost-sandbox` for one command and collecting what it
//! printed, within a deadline.
//!
//! The helper starts with a cleared environment plus an allow-list, an
//! explicit working folder, stdin closed, and its own process group, so that
//! a timeout or a cancelled request kills everything the command started.
//!
//! A command's start is on the model's path, so the launcher keeps
//! [`WARM_HELPERS`] helpers started ahead of their commands, each already
//! in a control group of its own (`sandbox-warm`): a command takes one and
//! sends it its command line over stdin, and what remains to wait for is
//! the sandbox itself. Runs with the installer's proxy, which hand the
//! helper a descriptor at its start, start a helper of their own.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::cgroups::{Cgroups, CommandGroup};
use super::egress::Egress;
use super::helper_args::{self, HelperArgs};
use std::sync::Arc;

/// Why the helper could not be started or watched: the command did not run
/// (or its end was not seen), which the model is told in one sentence.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The command's control group could not be made (the host's cgroups
    /// are gone, or the memory reserved for commands is taken).
    #[error("cannot create the command's control group: {0}")]
    ControlGroup(std::io::Error),
    /// The socket pair the installer's listener comes back on.
    #[error("cannot make the installer's channel: {0}")]
    Channel(std::io::Error),
    /// The helper binary could not be started.
    #[error("cannot start the sandbox helper: {0}")]
    Spawn(std::io::Error),
    /// The helper started without the pipe asked for.
    #[error("the helper has no {0}")]
    NoPipe(&'static str),
    #[error("cannot wait for the command: {0}")]
    Wait(std::io::Error),
    /// The task reading the output ended without its output.
    #[error("cannot read the output: {0}")]
    Output(tokio::task::JoinError),
}

/// Bytes of stdout and of stderr kept per command.
pub const OUTPUT_CAP_BYTES: usize = 32 * 1024;
/// Environment variables passed from the server to a command.
const PASSED: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];
/// The PATH a command gets when the server has none worth passing.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Whether commands must be confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// Confined, or refused when this host cannot confine (the default).
    #[default]
    Required,
    /// Confined when possible, else run unconfined and say so.
    Preferred,
    /// Never confined.
    Off,
}

/// Helpers a launcher keeps started ahead of their commands. Two cover a
/// turn's tool calls one after another (the next is ready while one runs)
/// and hold two idle processes and their control groups, nothing else.
pub const WARM_HELPERS: usize = 2;

/// How to reach the helper.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The `skillhost-sandbox` binary.
    pub helper: PathBuf,
    pub profile_dir: PathBuf,
    /// Dropped before `cgroups`: the groups of its helpers go first.
    warm: Arc<WarmHelpers>,
    /// A control group per command, where the host allows them.
    cgroups: Option<Arc<Cgroups>>,
}

/// Helpers waiting for a command line, and how many are being started.
#[derive(Debug, Default)]
struct WarmHelpers {
    state: std::sync::Mutex<Warm>,
}

#[derive(Debug, Default)]
struct Warm {
    ready: Vec<WarmHelper>,
    starting: usize,
}

/// One helper in `sandbox-warm`, in its control group, waiting on stdin.
/// Dropped unused, it is killed and reaped and its group removed.
#[derive(Debug)]
struct WarmHelper {
    child: Option<std::process::Child>,
    group: Option<CommandGroup>,
}

impl Drop for WarmHelper {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill with a negative pid signals the group it leads.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

/// One command to run.
#[derive(Debug, Clone)]
pub struct Run<'a> {
    pub profile: &'a str,
    pub workspace: &'a Path,
    /// The uid and gid the command runs as when the server is root: the
    /// workspace's own, so no two live workspaces share one.
    pub owner: Option<(u32, u32)>,
    pub skill: Option<&'a Path>,
    pub network: bool,
    pub unconfined: bool,
    pub command: &'a [String],
    /// Variables set for the command on top of the helper's own.
    pub env: &'a [(String, String)],
    /// Files of the server's the command may read (the CA snapshot).
    pub read: &'a [PathBuf],
    /// A folder directly inside the workspace to start in instead of its
    /// top (the installer's, which the model's commands never see).
    pub start_in: Option<&'a str>,
    /// A network of the command's own whose one way out is this proxy
    /// ([`super::private_net`]); the host's network is not granted with it.
    pub proxy: Option<&'a Egress>,
    pub timeout: Duration,
}

/// A service's host folders, from the operator's entry for it (an MCP
/// server's `cwd` and `read`): its installed code, which it may read and
/// run (a native module is mapped executable) but never write.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceFolders<'a> {
    /// A folder to start in.
    pub cwd: Option<&'a Path>,
    pub execute: &'a [PathBuf],
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ran {
    /// `None` when it was killed at the deadline.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Output past [`OUTPUT_CAP_BYTES`] was dropped.
    pub truncated: bool,
    pub timed_out: bool,
    /// The command's control group ran out of memory.
    pub out_of_memory: bool,
}

/// Kills a whole process group when dropped (a cancelled request drops it).
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // SAFETY: kill with a negative pid signals the group we created.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
}

async fn read_capped(mut stream: impl tokio::io::AsyncRead + Unpin) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    let mut truncated = false;
    // Keep reading past the cap so a chatty command never blocks on a full pipe.
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let room = OUTPUT_CAP_BYTES.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..n.min(room)]);
        truncated |= n > room;
    }
    (kept, truncated)
}

impl Launcher {
    /// A launcher starting `helper`, without control groups.
    pub fn new(helper: PathBuf, profile_dir: PathBuf, cgroups: Option<Arc<Cgroups>>) -> Launcher {
        Launcher { helper, profile_dir, warm: Arc::default(), cgroups }
    }

    /// The same launcher with `cgroups`; helpers started warm before are let go.
    pub fn with_cgroups(self, cgroups: Option<Arc<Cgroups>>) -> Launcher {
        Launcher::new(self.helper, self.profile_dir, cgroups)
    }

    pub fn cgroups(&self) -> Option<&Arc<Cgroups>> {
        self.cgroups.as_ref()
    }

    /// Helpers started ahead and waiting for a command.
    pub fn warm_ready(&self) -> usize {
        self.warm.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).ready.len()
    }

    /// The helper's command line, environment and working folder for one
    /// command; `run-sandboxed` uses the same so operators see exactly what
    /// the tools do.
    pub fn command(&self, run: &Run<'_>) -> std::process::Command {
        self.command_in(run, None, None, ServiceFolders::default())
    }

    /// `channel`: the helper's end of the pair the installer's listener
    /// comes back on, for a run with a proxy.
    fn command_in(
        &self,
        run: &Run<'_>,
        group: Option<&CommandGroup>,
        channel: Option<std::os::fd::RawFd>,
        folders: ServiceFolders<'_>,
    ) -> std::process::Command {
        self.spawn_command_in(&self.helper_args(run, group, channel, folders), channel)
    }

    /// What the helper is told about `run`.
    fn helper_args(
        &self,
        run: &Run<'_>,
        group: Option<&CommandGroup>,
        channel: Option<std::os::fd::RawFd>,
        folders: ServiceFolders<'_>,
    ) -> HelperArgs {
        HelperArgs {
            profile_dir: self.profile_dir.clone(),
            profile: run.profile.to_string(),
            workspace: run.workspace.to_path_buf(),
            skill: run.skill.map(Path::to_path_buf),
            read: run.read.to_vec(),
            allow_network: run.network,
            unconfined: run.unconfined,
            start_in: run.start_in.map(str::to_string),
            cwd: folders.cwd.map(Path::to_path_buf),
            execute: folders.execute.to_vec(),
            proxy_channel: channel,
            uid: run.owner.map(|(uid, _)| uid),
            gid: run.owner.map(|(_, gid)| gid),
            cgroups: group.map(|group| group.dirs().to_vec()).unwrap_or_default(),
            env: run.env.to_vec(),
            command: run.command.iter().map(OsString::from).collect(),
        }
    }

    fn spawn_command_in(&self, args: &HelperArgs, channel: Option<std::os::fd::RawFd>) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut command = self.bare_command();
        command.arg(helper_args::SUBCOMMAND).args(args.render());
        if let Some(fd) = channel {
            // SAFETY: between fork and exec only fcntl runs, which is
            // async-signal-safe. The descriptor is made inheritable in the
            // child alone: marking it in the server would let any other
            // command started meanwhile inherit it too.
            unsafe {
                command.pre_exec(move || {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        command
    }

    /// The helper with no arguments yet: its environment, working folder,
    /// process group and stdin, the same for every command.
    fn bare_command(&self) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(&self.helper);
        // Nothing of the server's environment reaches a command but these.
        command.env_clear();
        for name in PASSED {
            if let Ok(value) = std::env::var(name) {
                command.env(name, value);
            }
        }
        if std::env::var_os("PATH").is_none() {
            command.env("PATH", DEFAULT_PATH);
        }
        // The helper enters the workspace itself, through a descriptor opened
        // without following links; it starts from a folder nothing can shape.
        command.current_dir("/").process_group(0).stdin(Stdio::null());
        command
    }

    /// Runs one command through the helper.
    pub async fn run(&self, run: &Run<'_>) -> Result<Ran, LaunchError> {
        self.run_with(run, |_| {}).await
    }

    /// [`Launcher::run`], telling `started` the process group id as soon as
    /// the helper runs, so an owner can kill the group at once if it must.
    pub async fn run_with(&self, run: &Run<'_>, started: impl FnOnce(i32)) -> Result<Ran, LaunchError> {
        let began = std::time::Instant::now();
        // A run with the installer's proxy hands its helper a descriptor at
        // the start, which a helper started earlier cannot have.
        let warm = match run.proxy {
            None => self.take_warm(run).await?,
            Some(_) => None,
        };
        let (result, group) = match warm {
            Some((helper, group)) => {
                let result = self.collect(run, began, helper, None, started).await;
                (result, group)
            }
            None => {
                let group = match &self.cgroups {
                    Some(cgroups) => Some(cgroups.create().map_err(LaunchError::ControlGroup)?),
                    None => None,
                };
                let result = self.run_cold(run, began, group.as_ref(), started).await;
                (result, group)
            }
        };
        let out_of_memory = group.as_ref().is_some_and(CommandGroup::hit_memory_limit);
        // Removing the group kills what is left in it and waits for the
        // kernel to reap it: a short blocking wait, off the async threads.
        if let Some(group) = group {
            let _ = tokio::task::spawn_blocking(move || drop(group)).await;
        }
        // Once the command is over, not while it runs: on a small host the
        // next helper's start would take CPU from this command.
        self.refill();
        result.map(|ran| Ran { out_of_memory, ..ran })
    }

    /// A warm helper given `run`'s command line, with its group, or `None`
    /// when none is ready (or the one taken had died): then the caller
    /// starts one itself.
    async fn take_warm(&self, run: &Run<'_>) -> Result<Option<(Started, Option<CommandGroup>)>, LaunchError> {
        let taken = self.warm.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).ready.pop();
        let Some(mut warm) = taken else { return Ok(None) };
        if let (Some(cgroups), Some(group)) = (&self.cgroups, warm.group.as_mut()) {
            cgroups.reserve(group).map_err(LaunchError::ControlGroup)?;
        }
        // The child stays in `warm` until its command line is written: if
        // this future is dropped mid-write, `warm`'s drop kills and reaps it.
        let Some(stdin) = warm.child.as_mut().and_then(|child| child.stdin.take()) else { return Ok(None) };
        let framed = helper_args::frame(&self.helper_args(run, None, None, ServiceFolders::default()).render());
        let sent = match tokio::process::ChildStdin::from_std(stdin) {
            Ok(mut stdin) => {
                use tokio::io::AsyncWriteExt;
                // Closing stdin ends the command line.
                stdin.write_all(&framed).await.and(stdin.shutdown().await)
            }
            Err(err) => Err(err),
        };
        // It died waiting (a failed join says why in its own output, which
        // nobody reads now): let it go and start one afresh.
        if sent.is_err() {
            return Ok(None);
        }
        let Some(mut child) = warm.child.take() else { return Ok(None) };
        let pid = child.id() as i32;
        let stdout = child.stdout.take().map(tokio::process::ChildStdout::from_std);
        let stderr = child.stderr.take().map(tokio::process::ChildStderr::from_std);
        let (Some(Ok(stdout)), Some(Ok(stderr))) = (stdout, stderr) else {
            warm.child = Some(child);
            return Err(LaunchError::NoPipe("stdout or stderr"));
        };
        // The kernel reaps it for a thread that waits; the group guard
        // kills it at the deadline, which ends that wait.
        let waiter = tokio::task::spawn_blocking(move || child.wait());
        let helper = Started {
            pid,
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            exit: Exit::Thread { waiter, status: None },
        };
        Ok(Some((helper, warm.group.take())))
    }

    /// Starts helpers in the background until [`WARM_HELPERS`] are ready
    /// or starting.
    fn refill(&self) {
        let wanted = {
            let mut state = self.warm.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let wanted = WARM_HELPERS.saturating_sub(state.ready.len() + state.starting);
            state.starting += wanted;
            wanted
        };
        if wanted == 0 {
            return;
        }
        let launcher = self.clone();
        tokio::task::spawn_blocking(move || {
            for _ in 0..wanted {
                let started = launcher.start_warm();
                let mut state = launcher.warm.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                state.starting -= 1;
                match started {
                    Ok(helper) => state.ready.push(helper),
                    // The next command starts its own helper and reports
                    // what fails there.
                    Err(err) => tracing::debug!(error = %err, "cannot start a helper ahead of its command"),
                }
            }
        });
    }

    /// One helper in `sandbox-warm`, joining a new control group of its own.
    fn start_warm(&self) -> Result<WarmHelper, LaunchError> {
        let group = match &self.cgroups {
            Some(cgroups) => Some(cgroups.prepare().map_err(LaunchError::ControlGroup)?),
            None => None,
        };
        let mut command = self.bare_command();
        command.arg(helper_args::WARM_SUBCOMMAND);
        for dir in group.iter().flat_map(CommandGroup::dirs) {
            command.arg("--cgroup").arg(dir);
        }
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = command.spawn().map_err(LaunchError::Spawn)?;
        Ok(WarmHelper { child: Some(child), group })
    }

    /// Starts a helper for `run` now, with everything on its command line.
    async fn run_cold(
        &self,
        run: &Run<'_>,
        began: std::time::Instant,
        group: Option<&CommandGroup>,
        started: impl FnOnce(i32),
    ) -> Result<Ran, LaunchError> {
        use std::os::fd::AsRawFd;
        let pair = match run.proxy {
            Some(_) => Some(std::os::unix::net::UnixStream::pair().map_err(LaunchError::Channel)?),
            None => None,
        };
        let channel = pair.as_ref().map(|(_, theirs)| theirs.as_raw_fd());
        let mut command =
            tokio::process::Command::from(self.command_in(run, group, channel, ServiceFolders::default()));
        command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let spawned = command.spawn();
        // The helper has its own copy now; with ours closed, a helper that
        // fails before sending the listener ends the wait below at once.
        let ours = pair.map(|(ours, _theirs)| ours);
        let mut child = spawned.map_err(LaunchError::Spawn)?;
        let pid = child.id().map(|id| id as i32).ok_or(LaunchError::NoPipe("process id"))?;
        let stdout = child.stdout.take().ok_or(LaunchError::NoPipe("stdout"))?;
        let stderr = child.stderr.take().ok_or(LaunchError::NoPipe("stderr"))?;
        let helper = Started { pid, stdout: Box::new(stdout), stderr: Box::new(stderr), exit: Exit::Child(child) };
        self.collect(run, began, helper, ours, started).await
    }

    /// Reads a started helper's output and waits for it until `run`'s
    /// deadline (counted from `began`); then its process group dies.
    async fn collect(
        &self,
        run: &Run<'_>,
        began: std::time::Instant,
        helper: Started,
        proxy_channel: Option<std::os::unix::net::UnixStream>,
        started: impl FnOnce(i32),
    ) -> Result<Ran, LaunchError> {
        let Started { pid, stdout, stderr, mut exit } = helper;
        let guard = GroupGuard(Some(pid));
        started(pid);
        let outputs = tokio::spawn(async move { tokio::join!(read_capped(stdout), read_capped(stderr)) });
        // The proxy serves the installer's listener until the run ends (the
        // handle drops with this function). Without one the installer finds
        // nothing to connect to, and the helper's own error says why.
        let mut serving = None;
        if let (Some(egress), Some(ours)) = (run.proxy, proxy_channel) {
            if let Ok(Ok(listener)) = tokio::time::timeout(run.timeout, super::private_net::receive(ours)).await {
                serving = egress.serve(listener).ok();
            }
        }
        let left = run.timeout.saturating_sub(began.elapsed());
        let (exit_code, timed_out) = match tokio::time::timeout(left, exit.wait()).await {
            Ok(Ok(status)) => (
                status.code().or_else(|| std::os::unix::process::ExitStatusExt::signal(&status).map(|s| 128 + s)),
                false,
            ),
            Ok(Err(err)) => return Err(LaunchError::Wait(err)),
            Err(_) => (None, true),
        };
        // The group dies either way: a background child must not outlive its call.
        drop(guard);
        drop(serving);
        let _ = exit.wait().await;
        let ((stdout, out_cut), (stderr, err_cut)) = outputs.await.map_err(LaunchError::Output)?;
        Ok(Ran {
            exit_code,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            truncated: out_cut || err_cut,
            timed_out,
            out_of_memory: false,
        })
    }
}

/// A helper running a command: its process (the leader of its own group),
/// its output pipes and how its end is seen.
struct Started {
    pid: i32,
    stdout: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    stderr: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    exit: Exit,
}

enum Exit {
    /// Started by this run: tokio reaps it.
    Child(tokio::process::Child),
    /// Started ahead (in another runtime, perhaps): a blocking thread waits.
    Thread {
        waiter: tokio::task::JoinHandle<std::io::Result<std::process::ExitStatus>>,
        status: Option<std::process::ExitStatus>,
    },
}

impl Exit {
    /// Its exit status; safe to call again, and to drop unfinished.
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Exit::Child(child) => child.wait().await,
            Exit::Thread { status: Some(status), .. } => Ok(*status),
            Exit::Thread { waiter, status } => {
                let ended = waiter.await.map_err(std::io::Error::other)??;
                *status = Some(ended);
                Ok(ended)
            }
        }
    }
}

/// A long-lived program started through the helper (an MCP server): its
/// pipes stay open for the owner to talk over, and dropping it kills its
/// whole process group and removes its control group.
#[derive(Debug)]
pub struct Service {
    pub child: tokio::process::Child,
    group: Option<CommandGroup>,
    guard: GroupGuard,
}

impl std::fmt::Debug for GroupGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupGuard({:?})", self.0)
    }
}

impl Service {
    /// Whether its control group ran out of memory.
    pub fn out_of_memory(&self) -> bool {
        self.group.as_ref().is_some_and(CommandGroup::hit_memory_limit)
    }

    /// Kills it and waits for the kernel to reap its group, off the async
    /// threads.
    pub async fn stop(mut self) {
        drop(std::mem::replace(&mut self.guard, GroupGuard(None)));
        let _ = self.child.kill().await;
        if let Some(group) = self.group.take() {
            let _ = tokio::task::spawn_blocking(move || drop(group)).await;
        }
    }
}

impl Launcher {
    /// Starts `run` through the helper with its stdin, stdout and stderr
    /// piped to the caller, in a control group of its own; `run.timeout`
    /// does not apply (the owner decides when it stops).
    pub fn spawn_service(&self, run: &Run<'_>, folders: ServiceFolders<'_>) -> Result<Service, LaunchError> {
        let group = match &self.cgroups {
            Some(cgroups) => Some(cgroups.create().map_err(LaunchError::ControlGroup)?),
            None => None,
        };
        let mut command = tokio::process::Command::from(self.command_in(run, group.as_ref(), None, folders));
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let child = command.spawn().map_err(LaunchError::Spawn)?;
        let guard = GroupGuard(child.id().map(|id| id as i32));
        Ok(Service { child, group, guard })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_cap_at_and_past() {
        let at = vec![b'a'; OUTPUT_CAP_BYTES];
        assert_eq!(read_capped(at.as_slice()).await, (at.clone(), false));
        let past = vec![b'a'; OUTPUT_CAP_BYTES + 1];
        let (kept, truncated) = read_capped(past.as_slice()).await;
        assert_eq!((kept.len(), truncated), (OUTPUT_CAP_BYTES, true));
    }
}
