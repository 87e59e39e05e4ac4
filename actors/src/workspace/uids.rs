//! One uid per live workspace, from a range no account uses.
//!
//! When the server runs as root, every workspace is owned by a uid of its
//! own and every command in it runs as that uid. Two requests running at
//! once then cannot read, write or signal each other's files or processes
//! even where the sandbox is off, and the per-user process limit becomes a
//! per-request limit: one request's sleeping children cannot use up another
//! request's share.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The default range: 65,536 uids from 0x70000000, above every range that
/// distributions, systemd and container tools hand out to accounts.
pub const DEFAULT_UID_RANGE: UidRange = UidRange { first: 0x7000_0000, last: 0x7000_ffff };

/// A closed range of uids (each also used as its gid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Why a uid range is refused, or its lock folder cannot be used. The
/// server does not start with it: a bad range is a bad flag, and a lock
/// folder another user could write would let them take uids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UidError {
    #[error("'{0}' is not a range like 100000-165535")]
    NotARange(String),
    #[error("'{part}' in '{range}' is not a uid (0 to 4294967294)")]
    NotAUid { part: String, range: String },
    #[error("the range must not include uid 0 (root)")]
    HoldsRoot,
    #[error("4294967295 is not a valid uid")]
    Invalid,
    #[error("'{0}' ends before it starts")]
    Backwards(String),
    /// The lock folder cannot be made or read.
    #[error("{what}{}: {reason}", path.display())]
    LockFolder { what: &'static str, path: PathBuf, reason: String },
    /// The lock folder is not the server user's alone.
    #[error("{} must be a folder of this user's alone (mode 0700)", .0.display())]
    LockFolderShared(PathBuf),
}

impl std::str::FromStr for UidRange {
    type Err = UidError;

    /// `FIRST-LAST`, both above 0, FIRST ≤ LAST.
    fn from_str(text: &str) -> Result<UidRange, UidError> {
        let (first, last) = text.split_once('-').ok_or_else(|| UidError::NotARange(text.to_string()))?;
        let number = |part: &str| {
            part.trim()
                .parse::<u32>()
                .map_err(|_| UidError::NotAUid { part: part.to_string(), range: text.to_string() })
        };
        let range = UidRange { first: number(first)?, last: number(last)? };
        if range.first == 0 {
            return Err(UidError::HoldsRoot);
        }
        if range.last == u32::MAX {
            return Err(UidError::Invalid);
        }
        if range.first > range.last {
            return Err(UidError::Backwards(text.to_string()));
        }
        Ok(range)
    }
}

impl UidRange {
    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }

    /// Accounts of this host whose uid or gid falls in the range, as
    /// `name (uid)`, from `/etc/passwd` and `/etc/group`.
    pub fn accounts_inside(&self) -> Vec<String> {
        let mut found = Vec::new();
        for file in ["/etc/passwd", "/etc/group"] {
            let Ok(text) = std::fs::read_to_string(file) else { continue };
            for line in text.lines() {
                let mut fields = line.split(':');
                let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next()) else { continue };
                if id.parse::<u32>().is_ok_and(|id| self.contains(id)) {
                    found.push(format!("{name} ({id}) in {file}"));
                }
            }
        }
        found
    }
}

/// Where leases are recorded host-wide: one lock file per uid, held
/// (`flock`) as long as a workspace has it. Two servers on one host (or two
/// test harnesses in one process) then never hand out the same uid, and a
/// crashed server's locks go with it.
pub const LOCK_DIR: &str = "/run/skillhost/uids";

/// The uids handed out, shared by everything that makes workspaces.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
    in_use: Mutex<BTreeSet<u32>>,
    locks: PathBuf,
}

/// A uid held by one workspace; returned to the pool when dropped, after
/// every process still running as it has been killed (a command started
/// unconfined can leave one), so the next holder inherits nothing.
#[derive(Debug)]
pub struct UidLease {
    pool: Arc<UidPool>,
    uid: u32,
    /// The locked file; closing it releases the uid host-wide.
    _lock: File,
}

impl UidLease {
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        kill_processes_of(self.uid);
        self.pool.in_use.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.uid);
    }
}

impl UidPool {
    /// A pool over `range`, with its lock files in [`LOCK_DIR`]. The folder
    /// must be root's alone: anyone who could write there could hold a
    /// uid's lock, or swap a lock file for a link.
    pub fn new(range: UidRange) -> Result<Arc<UidPool>, UidError> {
        Self::with_lock_dir(range, Path::new(LOCK_DIR))
    }

    pub fn with_lock_dir(range: UidRange, locks: &Path) -> Result<Arc<UidPool>, UidError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let failed = |what: &'static str| {
            move |err: std::io::Error| UidError::LockFolder { what, path: locks.to_path_buf(), reason: err.to_string() }
        };
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(locks).map_err(failed("cannot create "))?;
        let meta = std::fs::symlink_metadata(locks).map_err(failed(""))?;
        // SAFETY: plain getter.
        let me = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(UidError::LockFolderShared(locks.to_path_buf()));
        }
        Ok(Arc::new(UidPool { range, in_use: Mutex::new(BTreeSet::new()), locks: locks.to_path_buf() }))
    }

    /// Takes `uid`'s lock file without waiting; `None` when another holder
    /// has it.
    fn lock(&self, uid: u32) -> Option<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.locks.join(uid.to_string()))
            .ok()?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
        Some(file)
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// The lowest uid free on this host, or `None` when every uid of the
    /// range is held.
    pub fn lease(self: &Arc<Self>) -> Option<UidLease> {
        let mut in_use = self.in_use.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for uid in self.range.first..=self.range.last {
            if in_use.contains(&uid) {
                continue;
            }
            if let Some(lock) = self.lock(uid) {
                // A uid just taken over from a holder that died may still
                // have processes; they go before the new holder starts.
                kill_processes_of(uid);
                in_use.insert(uid);
                return Some(UidLease { pool: Arc::clone(self), uid, _lock: lock });
            }
        }
        None
    }

    /// How many uids are held now.
    pub fn held(&self) -> usize {
        self.in_use.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }
}

/// Kills every process whose real or effective uid is `uid`, as read from
/// `/proc` (the kernel's own account, nothing a command can forge).
pub fn kill_processes_of(uid: u32) {
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let owned = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .is_some_and(|ids| ids.split_whitespace().take(2).any(|id| id.parse::<u32>() == Ok(uid)));
        if owned {
            // SAFETY: kill with a pid read from /proc and a constant signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_what_is_not_one() {
        assert_eq!("10-20".parse(), Ok(UidRange { first: 10, last: 20 }));
        assert_eq!("5-5".parse::<UidRange>().map(|r| r.contains(5)), Ok(true));
        let refusals = [
            ("0-10", UidError::HoldsRoot),
            ("20-10", UidError::Backwards("20-10".into())),
            ("x-1", UidError::NotAUid { part: "x".into(), range: "x-1".into() }),
            ("10", UidError::NotARange("10".into())),
            ("1-4294967295", UidError::Invalid),
        ];
        for (bad, expected) in refusals {
            assert_eq!(bad.parse::<UidRange>(), Err(expected), "{bad}");
        }
        assert_eq!(
            UidError::NotAUid { part: "x".into(), range: "x-1".into() }.to_string(),
            "'x' in 'x-1' is not a uid (0 to 4294967294)"
        );
        assert_eq!(DEFAULT_UID_RANGE.to_string().parse(), Ok(DEFAULT_UID_RANGE));
    }

    #[test]
    fn the_pool_hands_out_each_uid_once_and_takes_it_back() {
        use std::os::unix::fs::PermissionsExt;
        let locks = tempfile::Builder::new().permissions(std::fs::Permissions::from_mode(0o700)).tempdir().unwrap();
        let range = UidRange { first: 4_000_000_000, last: 4_000_000_001 };
        let pool = UidPool::with_lock_dir(range, locks.path()).unwrap();
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        assert_ne!(a.uid(), b.uid());
        assert!(pool.lease().is_none(), "two uids, two leases");
        // A second pool on the same host sees the same leases.
        let other = UidPool::with_lock_dir(range, locks.path()).unwrap();
        assert!(other.lease().is_none(), "another pool took a held uid");
        let freed = a.uid();
        drop(a);
        assert_eq!(other.lease().map(|l| l.uid()), Some(freed));
    }

    #[test]
    fn the_default_range_holds_no_account_here() {
        assert_eq!(DEFAULT_UID_RANGE.accounts_inside(), Vec::<String>::new());
    }
}
