//! Workspaces: the private folders code tools and commands work in, the
//! one handle the server reaches into them with, and the actor that owns one.

pub mod apply_patch;
pub mod handle;
pub mod snapshot;
pub mod uids;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::distr::{Alphanumeric, SampleString};

use crate::workspace::uids::{UidLease, UidPool};
pub use handle::{DirHandle, FsError};

/// Most bytes of one file the file tools load into the server: `apply_patch`
/// and `edit_file` refuse a larger file with a sentence, and `read_file`
/// reads no further into one. A 500 MB file of newlines costs no more.
pub const FILE_TOOL_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// Largest a workspace may grow when no other size is configured.
pub const DEFAULT_WORKSPACE_MAX_BYTES: u64 = 1024 * 1024 * 1024;

/// How workspaces are made.
#[derive(Debug, Clone, Default)]
pub struct WorkspaceOptions {
    /// A uid per workspace, when the server runs as root.
    pub uids: Option<Arc<UidPool>>,
    /// Mount each workspace as a tmpfs of `max_bytes`, so a command that
    /// fills it gets "no space left" and the host's disk stays untouched.
    /// Decided at start-up: only root can mount.
    pub size_cap: Option<u64>,
    /// What the size-capped workspaces may hold together
    /// (`--sandbox-memory`); each reserves its whole cap while it lives.
    pub budget: Option<Arc<MemoryBudget>>,
}

/// A server-wide bound on what live workspaces hold in memory.
///
/// A tmpfs workspace's pages are memory the kernel cannot take back by
/// killing a process: filled, dozens of them would leave the OOM killer
/// only the server to kill. Each workspace reserves its whole size cap for
/// its life, so together they never pass the budget; commands are bounded
/// one by one (their control group) and are the kernel's first choice
/// (`oom_score_adj` 1000).
#[derive(Debug)]
pub struct MemoryBudget {
    total: u64,
    held: std::sync::atomic::AtomicU64,
}

/// Bytes reserved from a [`MemoryBudget`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Half of this host's memory (`MemTotal`), the budget when none is given:
/// the rest is the model's, the server's and the commands'. 4 GiB where
/// `/proc/meminfo` cannot be read.
pub fn default_sandbox_memory() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    });
    total_kib.map_or(4 * 1024 * 1024 * 1024, |kib| kib * 1024 / 2)
}

impl MemoryBudget {
    pub fn new(total: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget { total, held: std::sync::atomic::AtomicU64::new(0) })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn held(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether `bytes` more would fit now.
    pub fn fits(&self, bytes: u64) -> bool {
        self.held().saturating_add(bytes) <= self.total
    }

    /// `bytes` of the budget, or `None` when they do not fit.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        use std::sync::atomic::Ordering::SeqCst;
        self.held
            .fetch_update(SeqCst, SeqCst, |held| held.checked_add(bytes).filter(|after| *after <= self.total))
            .ok()?;
        Some(Reservation { budget: Arc::clone(self), bytes })
    }

    /// The sentence for a workspace that does not fit.
    pub fn full(&self) -> String {
        format!(
            "the server's sandbox memory is full: live workspaces and running commands hold {} of the {} bytes --sandbox-memory allows; try again when a conversation closes",
            self.held(),
            self.total
        )
    }
}

/// A private folder for one request or conversation, deleted when dropped.
///
/// The server reaches inside it only through `handle` (see
/// [`handle`]); file tools run on a thread of the workspace's own whose
/// filesystem uid and gid are the workspace's, so even a mistake there
/// reaches nothing the sandboxed commands could not.
#[derive(Debug)]
pub struct Workspace {
    /// Made by the server under its own folder; never shaped by a command.
    path: PathBuf,
    worker: worker::Worker,
    /// A tmpfs is mounted on `path`.
    mounted: bool,
    /// The uid the folder and its commands belong to.
    lease: Option<UidLease>,
    /// Its share of the sandbox memory, given back after the folder goes
    /// (declared last: fields drop in order, and `Drop` unmounts first).
    _reserved: Option<Reservation>,
}

impl Workspace {
    /// Creates a workspace under `base` (a folder of the server's own):
    /// a new name (`mkdir` fails rather than reuse one), mode 0700, owned
    /// by a fresh uid when the server is root.
    pub fn create(base: &Path, options: &WorkspaceOptions) -> std::io::Result<Workspace> {
        use std::os::unix::fs::DirBuilderExt;
        let lease = match &options.uids {
            Some(pool) => Some(pool.lease().ok_or_else(|| {
                std::io::Error::other(format!("every uid of the sandbox range {} is in use", pool.range()))
            })?),
            None => None,
        };
        let owner = lease.as_ref().map(|l| (l.uid(), l.uid()));
        let reserved = match (&options.budget, options.size_cap) {
            (Some(budget), Some(bytes)) => {
                Some(budget.reserve(bytes).ok_or_else(|| std::io::Error::other(budget.full()))?)
            }
            _ => None,
        };
        let path = base.join(format!("ws-{}", Alphanumeric.sample_string(&mut rand::rng(), 16)));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let mut workspace =
            Workspace { path, worker: worker::Worker::stopped(), mounted: false, lease, _reserved: reserved };
        if let Some(bytes) = options.size_cap {
            mount_tmpfs(&workspace.path, bytes, owner)?;
            workspace.mounted = true;
        }
        let handle = DirHandle::open(&workspace.path)?;
        if let Some((uid, gid)) = owner {
            rustix::fs::fchown(
                handle.fd(),
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )?;
        }
        workspace.worker = worker::Worker::start(handle, owner)?;
        Ok(workspace)
    }

    /// The folder's path, for the sandbox helper (which opens it itself).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid and gid commands in this folder run as, when the server is root.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.lease.as_ref().map(|l| (l.uid(), l.uid()))
    }

    /// Runs `job` on the workspace's own thread with its handle; `None`
    /// when that thread is gone (the workspace is being deleted).
    pub async fn with_handle<T: Send + 'static>(
        &self,
        job: impl FnOnce(&DirHandle) -> T + Send + 'static,
    ) -> Option<T> {
        self.worker.run(job).await
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        self.worker.stop();
        // Processes still running as the workspace's uid go first, so
        // nothing writes while the folder is removed.
        if let Some(lease) = &self.lease {
            crate::workspace::uids::kill_processes_of(lease.uid());
        }
        if self.mounted {
            // The whole tmpfs goes with the mount; MNT_DETACH so a process
            // still inside cannot keep it (or the server) waiting.
            let _ = rustix::mount::unmount(&self.path, rustix::mount::UnmountFlags::DETACH);
        } else if let Ok(handle) = DirHandle::open(&self.path) {
            // Emptied through the handle, as root: a folder the command
            // made read-only still goes, and a link inside is removed, not
            // followed.
            let _ = handle.clear();
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Mounts a tmpfs of `bytes` on `path`, owned by `owner`, without
/// set-uid programs or device files.
fn mount_tmpfs(path: &Path, bytes: u64, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let mut data = format!("size={bytes},mode=0700");
    if let Some((uid, gid)) = owner {
        data.push_str(&format!(",uid={uid},gid={gid}"));
    }
    let data = std::ffi::CString::new(data).map_err(std::io::Error::other)?;
    rustix::mount::mount(
        "tmpfs",
        path,
        "tmpfs",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        data.as_c_str(),
    )
    .map_err(|err| std::io::Error::other(format!("cannot mount the workspace's size-capped tmpfs: {err}")))
}

/// Whether this server can give workspaces a size cap: it can mount a
/// tmpfs (root, and a mount namespace that allows it). Tried once at start.
pub fn can_cap_size(base: &Path) -> std::io::Result<()> {
    let probe = tempfile::Builder::new().prefix("probe-").tempdir_in(base)?;
    mount_tmpfs(probe.path(), 1024 * 1024, None)?;
    let _ = rustix::mount::unmount(probe.path(), rustix::mount::UnmountFlags::DETACH);
    Ok(())
}

mod worker {
    //! The workspace's own thread: file tools run here with the filesystem
    //! uid and gid set to the workspace's, so the kernel checks every open,
    //! create and rename as it would for a sandboxed command.

    use std::sync::mpsc;
    use std::thread::JoinHandle;

    use super::DirHandle;

    type Job = Box<dyn FnOnce(&DirHandle) + Send>;

    #[derive(Debug)]
    pub struct Worker {
        jobs: Option<mpsc::Sender<Job>>,
        thread: Option<JoinHandle<()>>,
    }

    impl Worker {
        /// A worker that runs nothing (before start, after stop).
        pub fn stopped() -> Worker {
            Worker { jobs: None, thread: None }
        }

        pub fn start(handle: DirHandle, owner: Option<(u32, u32)>) -> std::io::Result<Worker> {
            let (jobs, inbox) = mpsc::channel::<Job>();
            let (ready_tx, ready) = mpsc::channel::<std::io::Result<()>>();
            let thread = std::thread::Builder::new().name("workspace".into()).spawn(move || {
                if let Some((uid, gid)) = owner {
                    if let Err(why) = become_owner(uid, gid) {
                        let _ = ready_tx.send(Err(why));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(()));
                while let Ok(job) = inbox.recv() {
                    job(&handle);
                }
            })?;
            match ready.recv() {
                Ok(Ok(())) => Ok(Worker { jobs: Some(jobs), thread: Some(thread) }),
                Ok(Err(why)) => Err(why),
                Err(_) => Err(std::io::Error::other("the workspace thread did not start")),
            }
        }

        pub async fn run<T: Send + 'static>(&self, job: impl FnOnce(&DirHandle) -> T + Send + 'static) -> Option<T> {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let job: Job = Box::new(move |handle| {
                let _ = tx.send(job(handle));
            });
            self.jobs.as_ref()?.send(job).ok()?;
            rx.await.ok()
        }

        /// Ends the thread after the job it is running.
        pub fn stop(&mut self) {
            self.jobs = None;
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    /// Sets this thread's filesystem ids (and no supplementary groups).
    /// Only this thread changes: the raw calls are per thread on Linux, and
    /// nothing else ever runs here.
    fn become_owner(uid: u32, gid: u32) -> std::io::Result<()> {
        rustix::thread::set_thread_groups(&[]).map_err(|err| {
            std::io::Error::new(err.kind(), format!("cannot clear the workspace thread's groups: {err}"))
        })?;
        // SAFETY: setfsgid/setfsuid take plain integers and change only
        // this thread's filesystem credentials; they return the previous
        // value, so a second call shows whether the first one took.
        let (gid_now, uid_now) = unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
            (libc::setfsgid(gid) as u32, libc::setfsuid(uid) as u32)
        };
        if (uid_now, gid_now) != (uid, gid) {
            return Err(std::io::Error::other(format!("cannot take the workspace's filesystem ids {uid}:{gid}")));
        }
        Ok(())
    }
}

/// The first folder on the way to `path` that the sandbox user cannot pass
/// through. Commands run as that user and their workspace is mounted by its
/// path, so a private folder anywhere above it (a root-only home or
/// `/tmp/pytest-of-root`) stops every command; start-up names it instead.
pub fn unreachable_ancestor(path: &Path, (uid, gid): (u32, u32)) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    for dir in path.ancestors() {
        let Ok(meta) = std::fs::metadata(dir) else { return Some(dir.to_path_buf()) };
        let mode = meta.mode();
        let search = if meta.uid() == uid {
            mode & 0o100
        } else if meta.gid() == gid {
            mode & 0o010
        } else {
            mode & 0o001
        };
        if search == 0 {
            return Some(dir.to_path_buf());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_memory_holds_its_total_and_not_a_byte_more() {
        let budget = MemoryBudget::new(3 * 1024);
        let held: Vec<Reservation> = (0..3).map(|_| budget.reserve(1024).unwrap()).collect();
        assert_eq!(budget.held(), 3 * 1024);
        assert!(budget.reserve(1).is_none(), "one byte past the total");
        assert!(budget.full().starts_with("the server's sandbox memory is full"));
        drop(held);
        assert_eq!(budget.held(), 0);
        // A workspace past the budget is refused with that sentence; the one
        // that fits is made, and gives its share back when it goes.
        let base = tempfile::tempdir().unwrap();
        let tight = MemoryBudget::new(1024);
        let _taken = tight.reserve(1).unwrap();
        let options = WorkspaceOptions { size_cap: Some(1024), budget: Some(Arc::clone(&tight)), ..Default::default() };
        let err = Workspace::create(base.path(), &options).unwrap_err().to_string();
        assert!(err.starts_with("the server's sandbox memory is full"), "{err}");
        assert_eq!(tight.held(), 1);
    }
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_folder_above_the_workspace_is_named() {
        let base = tempfile::tempdir().unwrap();
        let private = base.path().join("private");
        let inner = private.join("work");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Some other user: not the owner and not in the group.
        let other = (u32::MAX - 7, u32::MAX - 7);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(unreachable_ancestor(&inner, other), Some(private.clone()));
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(unreachable_ancestor(&inner, other), None);
    }
}
