//! One control group per command, where the host lets the server make them.
//!
//! Resource limits set with `setrlimit` are per process, so a command that
//! forks escapes them: 100 children of 4 GB each are 400 GB. A control group
//! bounds the command and everything it starts together (memory, process
//! count), gives it a CPU weight below the server's so the model keeps
//! decoding while it spins, and lets the server kill every process in it at
//! the end, wherever they went.
//!
//! cgroup v2 (one unified tree) is used when the server's own group has the
//! memory and pids controllers; the v1 controllers (separate `memory`,
//! `pids` and `cpu` trees) otherwise, where they are mounted writable. The
//! server makes `skillhost-<random>` under its own group in each tree, and
//! one `cmd-<random>` group under that per command; the helper joins it as
//! root before it drops privileges, so the command cannot leave it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::distr::{Alphanumeric, SampleString};

use crate::workspace::{MemoryBudget, Reservation};
use std::sync::Arc;

/// CPU weight of a command relative to the server's threads (v2 weights
/// run 1 to 10000, 100 by default; v1 shares default to 1024).
const COMMAND_CPU_WEIGHT_V2: u32 = 10;
const COMMAND_CPU_SHARES_V1: u32 = 100;
/// How often a kill sweep repeats while processes remain in a group.
const KILL_SWEEPS: usize = 50;

/// What each command's group allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLimits {
    pub memory_bytes: u64,
    pub processes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// The folder all command groups go under, in the unified tree.
    V2 { parent: PathBuf },
    /// The folders command groups go under, one per v1 controller tree
    /// (memory and pids required, cpu when present).
    V1 { parents: Vec<PathBuf> },
}

/// Makes command groups. Dropped, it removes its own folders.
#[derive(Debug)]
pub struct Cgroups {
    layout: Layout,
    limits: GroupLimits,
    /// The server's sandbox memory: each command reserves its group's
    /// memory limit from it while it runs, lowered to what is left.
    budget: Option<Arc<MemoryBudget>>,
}

/// The least memory a command is started with; with less left in the
/// sandbox memory it is refused instead.
pub const MIN_COMMAND_MEMORY: u64 = 64 * 1024 * 1024;

/// One command's group; killed and removed when dropped.
#[derive(Debug)]
pub struct CommandGroup {
    dirs: Vec<PathBuf>,
    v2: bool,
    /// Its share of the sandbox memory, given back after the group goes.
    _reserved: Option<Reservation>,
}

/// Where each controller of this process's groups lives: (controllers, path
/// inside the tree), from `/proc/self/cgroup`.
fn own_groups() -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers.to_string(), path.to_string()))
        })
        .collect()
}

/// Mount points of cgroup trees: (filesystem type, super options, mount point).
fn cgroup_mounts() -> Vec<(String, String, PathBuf)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let mut right = right.split_whitespace();
            let fs_type = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or_default();
            fs_type
                .starts_with("cgroup")
                .then(|| (fs_type.to_string(), options.to_string(), PathBuf::from(mount_point)))
        })
        .collect()
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
}

fn random_name(prefix: &str) -> String {
    format!("{prefix}{}", Alphanumeric.sample_string(&mut rand::rng(), 12).to_ascii_lowercase())
}

/// Why commands get no control groups of their own on this host: the
/// server runs on with per-process limits only, and says so (the doctor,
/// the start-up log, every command's note of what was not confined).
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("the server does not run as root")]
    NotRoot,
    /// No cgroup2 file system, or the server's group is not in one.
    #[error("not mounted")]
    NotMounted,
    /// cgroup v2 without a controller commands need.
    #[error("the {0} controller is not available to the server's group")]
    NoController(&'static str),
    /// cgroup v1 without a controller commands need.
    #[error("the {0} controller is not mounted")]
    NotMountedFor(&'static str),
    /// A step of making the groups failed.
    #[error("{step} {}: {source}", path.display())]
    Step { step: &'static str, path: PathBuf, source: std::io::Error },
    /// Neither tree can be used; why not, for each.
    #[error("cgroup v2: {v2}; cgroup v1: {v1}")]
    Neither { v2: Box<CgroupError>, v1: Box<CgroupError> },
}

fn failed(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError {
    let path = path.to_path_buf();
    move |source| CgroupError::Step { step, path, source }
}

impl Cgroups {
    /// Sets up command groups under this process's own, or says why not.
    pub fn detect(limits: GroupLimits) -> Result<Cgroups, CgroupError> {
        // SAFETY: plain getter.
        if unsafe { libc::geteuid() } != 0 {
            return Err(CgroupError::NotRoot);
        }
        let groups = own_groups();
        let mounts = cgroup_mounts();
        let v2 = match Self::setup_v2(&groups, &mounts) {
            Ok(parent) => return Ok(Cgroups { layout: Layout::V2 { parent }, limits, budget: None }),
            Err(why) => why,
        };
        match Self::setup_v1(&groups, &mounts) {
            Ok(parents) => Ok(Cgroups { layout: Layout::V1 { parents }, limits, budget: None }),
            Err(v1) => Err(CgroupError::Neither { v2: Box::new(v2), v1: Box::new(v1) }),
        }
    }

    fn setup_v2(groups: &[(String, String)], mounts: &[(String, String, PathBuf)]) -> Result<PathBuf, CgroupError> {
        let path = groups.iter().find(|(controllers, _)| controllers.is_empty()).map(|(_, p)| p.clone());
        let mount = mounts.iter().find(|(fs, _, _)| fs == "cgroup2").map(|(_, _, m)| m.clone());
        let (Some(path), Some(mount)) = (path, mount) else { return Err(CgroupError::NotMounted) };
        let own = mount.join(path.trim_start_matches('/'));
        let controllers = std::fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
        for needed in ["memory", "pids"] {
            if !controllers.split_whitespace().any(|c| c == needed) {
                return Err(CgroupError::NoController(needed));
            }
        }
        let cpu = controllers.split_whitespace().any(|c| c == "cpu");
        // A group with processes cannot hand controllers to children, so the
        // server moves itself into a leaf of its own group first.
        let leaf = own.join(random_name("skillhost-server-"));
        std::fs::create_dir(&leaf).map_err(failed("cannot create", &leaf))?;
        write(&leaf.join("cgroup.procs"), &std::process::id().to_string())
            .map_err(failed("cannot move the server into", &leaf))?;
        let enable = if cpu { "+memory +pids +cpu" } else { "+memory +pids" };
        write(&own.join("cgroup.subtree_control"), enable).map_err(failed("cannot enable controllers in", &own))?;
        let parent = own.join(random_name("skillhost-"));
        std::fs::create_dir(&parent).map_err(failed("cannot create", &parent))?;
        write(&parent.join("cgroup.subtree_control"), enable)
            .map_err(failed("cannot enable controllers in", &parent))?;
        Ok(parent)
    }

    fn setup_v1(
        groups: &[(String, String)],
        mounts: &[(String, String, PathBuf)],
    ) -> Result<Vec<PathBuf>, CgroupError> {
        let mut parents = Vec::new();
        let name = random_name("skillhost-");
        for (controller, required) in [("memory", true), ("pids", true), ("cpu", false)] {
            let has = |list: &str| list.split(',').any(|c| c == controller);
            let path = groups.iter().find(|(controllers, _)| has(controllers)).map(|(_, p)| p.clone());
            let mount =
                mounts.iter().find(|(fs, options, _)| fs == "cgroup" && has(options)).map(|(_, _, m)| m.clone());
            let (Some(path), Some(mount)) = (path, mount) else {
                if required {
                    return Err(CgroupError::NotMountedFor(controller));
                }
                continue;
            };
            let parent = mount.join(path.trim_start_matches('/')).join(&name);
            if let Err(err) = std::fs::create_dir(&parent) {
                for made in &parents {
                    let _ = std::fs::remove_dir(made);
                }
                if required {
                    return Err(failed("cannot create", &parent)(err));
                }
                continue;
            }
            parents.push(parent);
        }
        Ok(parents)
    }

    /// Which tree is in use, for the doctor.
    pub fn describe(&self) -> String {
        match &self.layout {
            Layout::V2 { parent } => format!("cgroup v2 under {}", parent.display()),
            Layout::V1 { parents } => format!(
                "cgroup v1 ({})",
                parents.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    pub fn limits(&self) -> GroupLimits {
        self.limits
    }

    /// The same groups, with commands' memory counted against `budget`.
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Cgroups {
        self.budget = Some(budget);
        self
    }

    /// A new group for one command, with its limits written: its memory
    /// limit is the profile's, or what is left of the sandbox memory when
    /// that is less (refused under [`MIN_COMMAND_MEMORY`]).
    pub fn create(&self) -> std::io::Result<CommandGroup> {
        let mut group = self.prepare()?;
        self.reserve(&mut group)?;
        Ok(group)
    }

    /// A new group with every limit written, its memory limit the
    /// profile's, but none of the sandbox memory reserved yet: made ahead
    /// of its command, it holds nothing until [`Cgroups::reserve`].
    pub fn prepare(&self) -> std::io::Result<CommandGroup> {
        let name = random_name("cmd-");
        let memory = self.limits.memory_bytes.to_string();
        let pids = self.limits.processes.to_string();
        match &self.layout {
            Layout::V2 { parent } => {
                let dir = parent.join(&name);
                std::fs::create_dir(&dir)?;
                let group = CommandGroup { dirs: vec![dir.clone()], v2: true, _reserved: None };
                write(&dir.join("memory.max"), &memory)?;
                // Swap would let a command past its memory limit; the
                // file is absent where swap accounting is off.
                let _ = write(&dir.join("memory.swap.max"), "0");
                write(&dir.join("pids.max"), &pids)?;
                let _ = write(&dir.join("cpu.weight"), &COMMAND_CPU_WEIGHT_V2.to_string());
                Ok(group)
            }
            Layout::V1 { parents } => {
                let mut group = CommandGroup { dirs: Vec::new(), v2: false, _reserved: None };
                for parent in parents {
                    let dir = parent.join(&name);
                    std::fs::create_dir(&dir)?;
                    group.dirs.push(dir.clone());
                    if dir.join("memory.limit_in_bytes").exists() {
                        write(&dir.join("memory.limit_in_bytes"), &memory)?;
                        let _ = write(&dir.join("memory.memsw.limit_in_bytes"), &memory);
                    }
                    if dir.join("pids.max").exists() {
                        write(&dir.join("pids.max"), &pids)?;
                    }
                    if dir.join("cpu.shares").exists() {
                        let _ = write(&dir.join("cpu.shares"), &COMMAND_CPU_SHARES_V1.to_string());
                    }
                }
                Ok(group)
            }
        }
    }

    /// Reserves the group's memory from the sandbox memory as its command
    /// starts, lowering its limit to what is left when that is less; an
    /// error when less than [`MIN_COMMAND_MEMORY`] is left.
    pub fn reserve(&self, group: &mut CommandGroup) -> std::io::Result<()> {
        let Some(budget) = &self.budget else { return Ok(()) };
        let limit = self.limits.memory_bytes.min(budget.total().saturating_sub(budget.held()));
        let reserved = (limit >= MIN_COMMAND_MEMORY).then(|| budget.reserve(limit)).flatten();
        group._reserved = Some(reserved.ok_or_else(|| std::io::Error::other(budget.full()))?);
        if limit < self.limits.memory_bytes {
            // v1 keeps memsw at or above the plain limit: lower that first.
            for dir in &group.dirs {
                for file in ["memory.max", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"] {
                    let path = dir.join(file);
                    if path.exists() {
                        let written = write(&path, &limit.to_string());
                        if file != "memory.memsw.limit_in_bytes" {
                            written?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let parents = match &self.layout {
            Layout::V2 { parent } => vec![parent.clone()],
            Layout::V1 { parents } => parents.clone(),
        };
        for parent in parents {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

impl CommandGroup {
    /// The folders whose `cgroup.procs` the helper joins.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Pids still in the group.
    fn members(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs
            .iter()
            .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
            .flat_map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<i32>>())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills every process in the group, wherever it went.
    pub fn kill_all(&self) {
        if self.v2 {
            if let Some(dir) = self.dirs.first() {
                if write(&dir.join("cgroup.kill"), "1").is_ok() {
                    return;
                }
            }
        }
        for _ in 0..KILL_SWEEPS {
            let members = self.members();
            if members.is_empty() {
                return;
            }
            for pid in members {
                // SAFETY: kill with a pid the kernel listed in our own group.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Whether the kernel killed a process of the group for passing its
    /// memory limit (the `oom_kill` count of v2's `memory.events` or v1's
    /// `memory.oom_control`), to name it in the command's result.
    pub fn hit_memory_limit(&self) -> bool {
        self.dirs.iter().any(|dir| {
            ["memory.events", "memory.oom_control"].iter().any(|file| {
                std::fs::read_to_string(dir.join(file)).is_ok_and(|text| {
                    text.lines().any(|l| l.strip_prefix("oom_kill ").is_some_and(|n| n.trim() != "0"))
                })
            })
        })
    }
}

impl Drop for CommandGroup {
    fn drop(&mut self) {
        self.kill_all();
        for dir in &self.dirs {
            // A group's folder can only go once its last process has been
            // reaped; the kill above makes that a matter of milliseconds.
            for _ in 0..KILL_SWEEPS {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}
