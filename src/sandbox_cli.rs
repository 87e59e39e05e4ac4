//! Operator commands for the sandbox: `skillhost run-sandboxed` runs one
//! command exactly as the tools would, and `skillhost doctor` prints what
//! this host confines.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use clap::Args;
use skillhost_actors::sandbox::cgroups::{Cgroups, GroupLimits};
use skillhost_actors::sandbox::doctor::{self, Check};
use skillhost_actors::sandbox::launch::{Launcher, Run};
use skillhost_actors::sandbox::profile::Profile;
use skillhost_actors::workspace::uids::{UidError, UidPool, UidRange, DEFAULT_UID_RANGE};
use skillhost_actors::workspace::{Workspace, WorkspaceOptions, DEFAULT_WORKSPACE_MAX_BYTES};

/// The shipped profiles, built into the binary so an installed server does
/// not depend on the source tree; `--sandbox-profiles` overrides them.
pub const SHIPPED_PROFILES: [(&str, &str); 3] = [
    ("code-exec", include_str!("../sandbox-profiles/code-exec.yaml")),
    ("skills-run", include_str!("../sandbox-profiles/skills-run.yaml")),
    ("mcp", include_str!("../sandbox-profiles/mcp.yaml")),
];

/// Writes the shipped profiles into a new private folder (a random name,
/// mode 0700): a folder another local user could have made first, or
/// written into, would let them choose the sandbox's policy.
pub fn shipped_profile_dir() -> Result<OwnedDir, SandboxSetupError> {
    let dir =
        OwnedDir::make(&std::env::temp_dir(), "skillhost-profiles-", 0o700).map_err(SandboxSetupError::Profiles)?;
    for (name, text) in SHIPPED_PROFILES {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.path.join(format!("{name}.yaml")))
            .and_then(|mut file| std::io::Write::write_all(&mut file, text.as_bytes()))
            .map_err(SandboxSetupError::Profiles)?;
    }
    Ok(dir)
}

/// Why the sandbox helper cannot be set up: nothing can run confined, so
/// the command asking for it (`serve` with code execution, `doctor`,
/// `run-sandboxed`) stops.
#[derive(Debug, thiserror::Error)]
pub enum SandboxSetupError {
    /// The helper binary is not beside this one.
    #[error("cannot find the sandbox helper {}: {source}; it is installed beside the skillhost binary", path.display())]
    Binary { path: PathBuf, source: std::io::Error },
    #[error("cannot write the sandbox profiles: {0}")]
    Profiles(std::io::Error),
}

/// A folder this process made for its own use, removed when dropped.
/// It holds a lock file for as long as the process lives, so a process
/// that died without removing it (`kill -9`, a crash, a power cut) leaves a
/// folder the next one can tell is nobody's: see [`sweep_stale`].
#[derive(Debug)]
pub struct OwnedDir {
    pub path: PathBuf,
    _lock: Option<std::fs::File>,
}

/// The lock file inside every [`OwnedDir`].
const OWNER_LOCK: &str = ".owner.lock";

impl OwnedDir {
    /// A new folder `prefix<random>` in `parent` with `mode`, locked by this
    /// process. The folders of dead processes with the same prefix go first.
    pub fn make(parent: &Path, prefix: &str, mode: u32) -> std::io::Result<OwnedDir> {
        sweep_stale(parent, prefix);
        let path = tempfile::Builder::new()
            .prefix(prefix)
            .permissions(std::fs::Permissions::from_mode(mode))
            .tempdir_in(parent)?
            .keep();
        let lock = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path.join(OWNER_LOCK))?
        };
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
        Ok(OwnedDir { path, _lock: Some(lock) })
    }
}

impl Drop for OwnedDir {
    /// Workspaces may be tmpfs mounts; a mount left behind (an actor that
    /// did not get to delete its folder) would outlive the process, so any
    /// mount beneath the folder is detached before the folder is removed.
    fn drop(&mut self) {
        remove_with_mounts(&self.path);
    }
}

fn remove_with_mounts(folder: &Path) {
    for mount in mounts_beneath(folder) {
        let _ = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir_all(folder);
}

/// Removes the folders `prefix*` in `parent` that a dead process of ours
/// left: each is a real folder (not a link) owned by this user, with an
/// [`OWNER_LOCK`] nobody holds. A live server's folder is locked and stays;
/// a folder without the lock file (another program's, or one being made
/// this instant) is never touched. Returns how many went.
pub fn sweep_stale(parent: &Path, prefix: &str) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(parent) else { return 0 };
    let me = rustix::process::geteuid().as_raw();
    let mut swept = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let named = entry.file_name().to_str().is_some_and(|name| name.starts_with(prefix));
        // `symlink_metadata`: a link named like ours is not followed.
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_dir() && meta.uid() == me);
        if !named || !ours {
            continue;
        }
        let lock = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path.join(OWNER_LOCK))
        };
        let Ok(lock) = lock else { continue };
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        tracing::info!(folder = %path.display(), "removing a folder a stopped skillhost left behind");
        remove_with_mounts(&path);
        swept += 1;
    }
    swept
}

/// Mount points at or under `folder`, from this process's mount table.
fn mounts_beneath(folder: &Path) -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    table
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(PathBuf::from)
        .filter(|mount| mount.starts_with(folder))
        .collect()
}

/// The server's own folder under `parent`: a random name (`skillhost-…`),
/// made with `mkdir` so an existing one is never reused, mode 0711 so the
/// sandbox uids can pass through to their workspaces but list nothing.
/// What a server killed before it could clean up left there goes first.
pub fn own_folder(parent: &Path) -> std::io::Result<(PathBuf, OwnedDir)> {
    std::fs::create_dir_all(parent)?;
    let parent = parent.canonicalize()?;
    let dir = OwnedDir::make(&parent, "skillhost-", 0o711)?;
    Ok((dir.path.clone(), dir))
}

/// The helper binary's name; it sits beside the server's.
pub const HELPER_BINARY: &str = "skillhost-sandbox";

/// The helper beside this binary. Without a profile folder, the shipped
/// profiles are written to one that lives as long as the returned guard.
pub fn launcher(profile_dir: Option<PathBuf>) -> Result<(Launcher, Option<OwnedDir>), SandboxSetupError> {
    let helper = helper_path()?;
    let (profile_dir, owned) = match profile_dir {
        Some(dir) => (dir, None),
        None => {
            let dir = shipped_profile_dir()?;
            (dir.path.clone(), Some(dir))
        }
    };
    Ok((Launcher::new(helper, profile_dir, None), owned))
}

/// Where the helper is: beside this binary (the path the operator
/// installed, never one a command could shape), checked to be a file.
pub fn helper_path() -> Result<PathBuf, SandboxSetupError> {
    let exe =
        std::env::current_exe().map_err(|source| SandboxSetupError::Binary { path: HELPER_BINARY.into(), source })?;
    let helper = exe.with_file_name(HELPER_BINARY);
    match std::fs::metadata(&helper) {
        Ok(meta) if meta.is_file() => Ok(helper),
        Ok(_) => Err(SandboxSetupError::Binary { path: helper, source: std::io::Error::other("not a file") }),
        Err(source) => Err(SandboxSetupError::Binary { path: helper, source }),
    }
}

/// What this host gives commands beyond what the probes check.
#[derive(Debug)]
pub struct HostSetup {
    pub workspaces: WorkspaceOptions,
    pub cgroups: Option<Arc<Cgroups>>,
    /// Each of the above as a promise kept or not, for the log and the doctor.
    pub facts: Vec<Check>,
}

impl HostSetup {
    /// A uid the probes and the reachability check run as.
    pub fn probe_owner(&self) -> Option<(u32, u32)> {
        self.workspaces.uids.as_ref().map(|pool| (pool.range().first, pool.range().first))
    }
}

/// Decides what this host gives: a uid per workspace (root only), a
/// control group per command, a size cap per workspace (root and a
/// mountable tmpfs).
/// `sandbox_memory`: what size-capped workspaces may hold together
/// (`--sandbox-memory`; half of this host's memory when `None`).
pub fn host_setup(
    profile_dir: &Path,
    range: UidRange,
    max_bytes: u64,
    sandbox_memory: Option<u64>,
    workspace_base: &Path,
) -> HostSetup {
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let mut facts = Vec::new();
    let uids = match root {
        true => UidPool::new(range).map_err(|err| err.to_string()),
        false => Err("the server does not run as root, so every command runs as its user".to_string()),
    };
    facts.push(Check {
        what: "each live workspace has a uid of its own",
        kept: uids.is_ok(),
        detail: match &uids {
            Ok(_) => format!("uids {range}"),
            Err(why) => why.clone(),
        },
    });
    let uids = uids.ok();
    let limits = Profile::load(profile_dir, "code-exec").map(|p| p.limits).ok();
    let cgroups =
        match limits.map(|l| GroupLimits { memory_bytes: l.address_space_mb * 1024 * 1024, processes: l.processes }) {
            Some(limits) => Cgroups::detect(limits).map_err(|err| err.to_string()),
            None => Err("the code-exec profile does not load".to_string()),
        };
    facts.push(Check {
        what: "each command runs in a control group of its own (memory, processes, CPU weight)",
        kept: cgroups.is_ok(),
        detail: match &cgroups {
            Ok(groups) => {
                let limits = groups.limits();
                format!(
                    "{}; {} MB, {} processes",
                    groups.describe(),
                    limits.memory_bytes / (1024 * 1024),
                    limits.processes
                )
            }
            Err(why) => format!("{why}; per-process limits only"),
        },
    });
    let capped = match root {
        true => skillhost_actors::workspace::can_cap_size(workspace_base).map_err(|err| err.to_string()),
        false => Err("the server does not run as root".to_string()),
    };
    let budget = sandbox_memory.unwrap_or_else(skillhost_actors::workspace::default_sandbox_memory);
    // One budget for both: live tmpfs workspaces and running commands.
    let memory = skillhost_actors::workspace::MemoryBudget::new(budget);
    facts.push(Check {
        what: "each workspace has a size cap",
        kept: capped.is_ok(),
        detail: match &capped {
            Ok(()) => format!(
                "a tmpfs of {max_bytes} bytes; with running commands at most {budget} bytes together (--sandbox-memory), so {} at once",
                budget / max_bytes
            ),
            Err(why) => format!("{why}; only the per-file limit applies"),
        },
    });
    HostSetup {
        workspaces: WorkspaceOptions {
            uids,
            size_cap: capped.is_ok().then_some(max_bytes),
            budget: capped.is_ok().then(|| Arc::clone(&memory)),
        },
        cgroups: cgroups.ok().map(|groups| Arc::new(groups.with_budget(memory))),
        facts,
    }
}

#[derive(Debug, Args)]
pub struct RunSandboxedArgs {
    /// Profile: code-exec or skills-run
    #[arg(long)]
    pub profile: String,
    /// The working folder (read-write)
    #[arg(long)]
    pub workspace: PathBuf,
    /// A skill folder the command may read
    #[arg(long)]
    pub skill: Option<PathBuf>,
    /// Let the command use the network
    #[arg(long)]
    pub allow_network: bool,
    /// Folder of sandbox profiles [default: the profiles built into skillhost]
    #[arg(long = "sandbox-profiles")]
    pub sandbox_profiles: Option<PathBuf>,
    /// Uids given out one per live workspace; the command runs as a free one
    #[arg(long = "sandbox-uid-range", default_value_t = DEFAULT_UID_RANGE)]
    pub sandbox_uid_range: UidRange,
    /// The command and its arguments
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Runs the command with the terminal attached; returns its exit status.
/// Why `run-sandboxed` or `doctor` stopped before its command or checks
/// ran; `main` prints it after `error:`.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(transparent)]
    Setup(#[from] SandboxSetupError),
    #[error(transparent)]
    Uids(#[from] UidError),
    /// Every uid of the range is leased by running servers' workspaces.
    #[error("every uid of {0} is in use")]
    UidsInUse(UidRange),
    #[error("cannot create a scratch folder: {0}")]
    Scratch(std::io::Error),
    #[error("cannot start the sandbox helper: {0}")]
    Helper(std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

pub fn run_sandboxed(args: RunSandboxedArgs) -> Result<u8, OperatorError> {
    let (launcher, _profiles) = launcher(args.sandbox_profiles)?;
    let command: Vec<String> = args.command.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    // Leased like a server's workspace, so the command never shares a uid
    // with a running server's request (or its processes' fate).
    let lease = match root {
        true => Some(
            UidPool::new(args.sandbox_uid_range)?.lease().ok_or(OperatorError::UidsInUse(args.sandbox_uid_range))?,
        ),
        false => None,
    };
    // The environment a tool's command gets in that folder.
    let interpreters = skillhost_actors::sandbox::interpreters::Interpreters::detect();
    let env = skillhost_actors::sandbox::workspace_environment(&args.workspace, interpreters.python());
    let run = Run {
        profile: &args.profile,
        workspace: &args.workspace,
        owner: lease.as_ref().map(|l| (l.uid(), l.uid())),
        skill: args.skill.as_deref(),
        network: args.allow_network,
        unconfined: false,
        command: &command,
        env: &env,
        read: &[],
        start_in: None,
        proxy: None,
        timeout: Duration::MAX,
    };
    let status = launcher.command(&run).status().map_err(OperatorError::Helper)?;
    Ok(status.code().unwrap_or(1).clamp(0, 255) as u8)
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Folder of sandbox profiles [default: the profiles built into skillhost]
    #[arg(long = "sandbox-profiles")]
    pub sandbox_profiles: Option<PathBuf>,
    /// Uids given out one per live workspace, as FIRST-LAST
    #[arg(long = "sandbox-uid-range", default_value_t = DEFAULT_UID_RANGE)]
    pub sandbox_uid_range: UidRange,
    /// Largest a workspace may grow, in bytes
    #[arg(long = "workspace-max-bytes", default_value_t = DEFAULT_WORKSPACE_MAX_BYTES)]
    pub workspace_max_bytes: u64,
}

/// Prints one line per promise; returns whether every promise holds.
pub fn doctor(args: DoctorArgs) -> Result<(String, bool), OperatorError> {
    let (launcher, _profiles) = launcher(args.sandbox_profiles)?;
    let (base, _base_guard) = own_folder(&std::env::temp_dir()).map_err(OperatorError::Scratch)?;
    let setup = host_setup(&launcher.profile_dir, args.sandbox_uid_range, args.workspace_max_bytes, None, &base);
    let launcher = launcher.with_cgroups(setup.cgroups.clone());
    let scratch = Workspace::create(&base, &setup.workspaces).map_err(OperatorError::Scratch)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(OperatorError::Runtime)?;
    let mut checks = runtime.block_on(doctor::checks(&launcher, scratch.path(), scratch.owner()));
    drop(scratch);
    checks.extend(setup.facts);
    let mut text = String::from("Sandbox on this host:\n");
    for check in &checks {
        let mark = if check.kept { "yes" } else { "NO " };
        text.push_str(&format!("  {mark}  {}", check.what));
        if !check.detail.is_empty() {
            text.push_str(&format!("  ({})", check.detail));
        }
        text.push('\n');
    }
    text.push_str(&format!(
        "  note  a command granted the network shares this host's ({HOST_NETWORK_NOTE}); with --skills-sandbox required the grant is refused\n"
    ));
    text.push_str("  note  layers: user, mount, PID and network namespaces and a seccomp filter (birdcage); Landlock is not used\n");
    text.push_str(&match doctor::gaps_line(&checks) {
        Some(line) => line,
        None => "Everything is confined.".into(),
    });
    text.push('\n');
    Ok((text, checks.iter().all(|c| c.kept)))
}

/// What sharing the host's network means, for the doctor's note.
const HOST_NETWORK_NOTE: &str =
    "its loopback services, this server's API included, and its link-local addresses are reachable";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_folders_of_dead_processes_are_swept() {
        let parent = tempfile::tempdir().unwrap();
        let live = OwnedDir::make(parent.path(), "skillhost-", 0o711).unwrap();
        // A dead server's folder: the lock file is there, nobody holds it.
        let dead = parent.path().join("skillhost-dead");
        std::fs::create_dir_all(dead.join("workspaces/ws-1")).unwrap();
        std::fs::write(dead.join(OWNER_LOCK), b"").unwrap();
        std::fs::write(dead.join("workspaces/ws-1/left.txt"), b"x").unwrap();
        // Not ours to judge: no lock file, another prefix, and a link
        // named like ours pointing at a folder with a free lock.
        let unlocked = parent.path().join("skillhost-making");
        std::fs::create_dir(&unlocked).unwrap();
        let other = parent.path().join("another-dead");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(OWNER_LOCK), b"").unwrap();
        let target = tempfile::tempdir().unwrap();
        std::fs::write(target.path().join(OWNER_LOCK), b"").unwrap();
        std::fs::write(target.path().join("keep.txt"), b"kept").unwrap();
        std::os::unix::fs::symlink(target.path(), parent.path().join("skillhost-link")).unwrap();

        assert_eq!(sweep_stale(parent.path(), "skillhost-"), 1);
        assert!(!dead.exists(), "the dead server's folder went");
        assert!(live.path.exists(), "a live server's folder stays");
        assert!(unlocked.exists() && other.exists());
        assert!(target.path().join("keep.txt").exists(), "a link is never followed");
        // A new folder sweeps as it is made; the live one still stays.
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(OWNER_LOCK), b"").unwrap();
        let next = OwnedDir::make(parent.path(), "skillhost-", 0o711).unwrap();
        assert!(!dead.exists() && live.path.exists() && next.path.exists());
        let gone = live.path.clone();
        drop(live);
        assert!(!gone.exists());
    }
}
