//! The artifact store: files a request's commands produced, copied out of
//! its workspace (which is deleted with the request) into a bounded store
//! keyed by run id, for download.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::skills::path_guard;

/// Files kept per run.
pub const MAX_RUN_FILES: usize = 64;
/// Largest file kept.
pub const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Bytes kept across all runs; the oldest runs go first.
pub const MAX_TOTAL_BYTES: u64 = 512 * 1024 * 1024;
/// How long a run's files are kept.
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// The store's bounds; the constants above unless a test shrinks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactLimits {
    pub run_files: usize,
    pub file_bytes: u64,
    pub total_bytes: u64,
    pub age: Duration,
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        ArtifactLimits {
            run_files: MAX_RUN_FILES,
            file_bytes: MAX_FILE_BYTES,
            total_bytes: MAX_TOTAL_BYTES,
            age: MAX_AGE,
        }
    }
}

/// Folders of a workspace that hold the server's own bookkeeping.
const PRIVATE: [&str; 2] = [".skillhost", ".tmp"];

/// One stored file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Relative to the workspace, `/`-separated.
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug)]
struct RunFiles {
    id: String,
    created: Instant,
    files: Vec<Artifact>,
}

#[derive(Debug)]
struct Inner {
    base: PathBuf,
    limits: ArtifactLimits,
    runs: VecDeque<RunFiles>,
}

impl Inner {
    fn total(&self) -> u64 {
        self.runs.iter().flat_map(|r| &r.files).map(|f| f.bytes).sum()
    }

    /// Drops runs past their age, then the oldest while over the byte budget.
    fn evict(&mut self, incoming: u64) {
        while let Some(oldest) = self.runs.front() {
            let expired = oldest.created.elapsed() > self.limits.age;
            if !expired && self.total() + incoming <= self.limits.total_bytes {
                break;
            }
            if let Some(run) = self.runs.pop_front() {
                let _ = std::fs::remove_dir_all(self.base.join(&run.id));
            }
        }
    }
}

/// Shared by the loops (which store) and the HTTP routes (which serve).
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    inner: Arc<Mutex<Inner>>,
}

impl ArtifactStore {
    pub fn new(base: &Path) -> std::io::Result<ArtifactStore> {
        Self::with_limits(base, ArtifactLimits::default())
    }

    pub fn with_limits(base: &Path, limits: ArtifactLimits) -> std::io::Result<ArtifactStore> {
        std::fs::create_dir_all(base)?;
        let inner = Inner { base: base.to_path_buf(), limits, runs: VecDeque::new() };
        Ok(ArtifactStore { inner: Arc::new(Mutex::new(inner)) })
    }

    /// Copies the files under `workspace` changed since `since` into the
    /// run's store and returns them. Blocking: call off the async threads.
    pub fn collect(&self, run_id: &str, workspace: &Path, since: SystemTime) -> Vec<Artifact> {
        let mut changed = Vec::new();
        walk(workspace, workspace, since, &mut changed);
        changed.sort();
        let Ok(mut inner) = self.inner.lock() else { return Vec::new() };
        let incoming: u64 = changed.iter().map(|(_, bytes)| *bytes).sum();
        inner.evict(incoming);
        let base = inner.base.join(run_id);
        let index = match inner.runs.iter().position(|r| r.id == run_id) {
            Some(index) => index,
            None => {
                inner.runs.push_back(RunFiles { id: run_id.to_string(), created: Instant::now(), files: Vec::new() });
                inner.runs.len() - 1
            }
        };
        let limits = inner.limits;
        let mut stored = Vec::new();
        for (path, bytes) in changed {
            let run = &mut inner.runs[index];
            let known = run.files.iter().any(|f| f.path == path);
            if bytes > limits.file_bytes || (!known && run.files.len() >= limits.run_files) {
                continue;
            }
            let target = base.join(&path);
            let copied = target.parent().map(std::fs::create_dir_all).unwrap_or(Ok(())).and_then(|_| {
                // Read through the guard: a link the command planted never
                // makes the server copy a file from outside the workspace.
                let mut opened = path_guard::open_file(workspace, &path).map_err(std::io::Error::other)?;
                let mut out = std::fs::File::create(&target)?;
                std::io::copy(&mut opened.file, &mut out)
            });
            if copied.is_err() {
                continue;
            }
            run.files.retain(|f| f.path != path);
            run.files.push(Artifact { path: path.clone(), bytes });
            stored.push(Artifact { path, bytes });
        }
        stored
    }

    /// The files of a run.
    pub fn list(&self, run_id: &str) -> Option<Vec<Artifact>> {
        let inner = self.inner.lock().ok()?;
        inner.runs.iter().find(|r| r.id == run_id).map(|r| r.files.clone())
    }

    /// Opens one stored file, through the path guard.
    pub fn open(&self, run_id: &str, path: &str) -> Result<path_guard::OpenedFile, String> {
        let base = {
            let inner = self.inner.lock().map_err(|_| "the artifact store is unavailable".to_string())?;
            if !inner.runs.iter().any(|r| r.id == run_id) {
                return Err(format!("no run '{run_id}' has stored files"));
            }
            inner.base.join(run_id)
        };
        path_guard::open_file(&base, path).map_err(|err| err.to_string())
    }
}

fn walk(root: &Path, dir: &Path, since: SystemTime, out: &mut Vec<(String, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(relative) = path.strip_prefix(root) else { continue };
        let relative = relative.to_string_lossy().replace('\\', "/");
        if PRIVATE.iter().any(|p| relative == *p || relative.starts_with(&format!("{p}/"))) {
            continue;
        }
        let Ok(metadata) = entry.metadata() else { continue };
        if metadata.is_dir() {
            walk(root, &path, since, out);
        } else if metadata.is_file() && metadata.modified().is_ok_and(|m| m >= since) {
            out.push((relative, metadata.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: ArtifactLimits =
        ArtifactLimits { run_files: 3, file_bytes: 10, total_bytes: 25, age: Duration::from_secs(3600) };

    fn write(dir: &Path, name: &str, bytes: usize) {
        std::fs::write(dir.join(name), "x".repeat(bytes)).unwrap();
    }

    fn paths(files: &[Artifact]) -> Vec<&str> {
        files.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn the_defaults_are_the_named_limits() {
        let limits = ArtifactLimits::default();
        assert_eq!(
            (limits.run_files, limits.file_bytes, limits.total_bytes, limits.age),
            (MAX_RUN_FILES, MAX_FILE_BYTES, MAX_TOTAL_BYTES, MAX_AGE)
        );
    }

    #[test]
    fn file_size_and_file_count_at_and_past_the_limit() {
        let base = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let store = ArtifactStore::with_limits(base.path(), SMALL).unwrap();
        let since = SystemTime::now() - Duration::from_secs(5);
        write(work.path(), "at.txt", 10);
        write(work.path(), "past.txt", 11);
        assert_eq!(paths(&store.collect("r1", work.path(), since)), ["at.txt"]);

        let work = tempfile::tempdir().unwrap();
        for name in ["a", "b", "c", "d"] {
            write(work.path(), name, 1);
        }
        // Three files fit a run; the fourth is left out, but a stored file
        // changed again is still replaced.
        assert_eq!(paths(&store.collect("r2", work.path(), since)), ["a", "b", "c"]);
        write(work.path(), "a", 2);
        let again = store.collect("r2", work.path(), since);
        assert!(paths(&again).contains(&"a") && !paths(&again).contains(&"d"));
        assert_eq!(store.list("r2").unwrap().iter().find(|f| f.path == "a").unwrap().bytes, 2);
    }

    #[test]
    fn the_oldest_runs_go_when_the_total_passes_the_limit_or_they_expire() {
        let base = tempfile::tempdir().unwrap();
        let store = ArtifactStore::with_limits(base.path(), SMALL).unwrap();
        let since = SystemTime::now() - Duration::from_secs(5);
        for (run, bytes) in [("r1", 10), ("r2", 10), ("r3", 5)] {
            let work = tempfile::tempdir().unwrap();
            write(work.path(), "f", bytes);
            store.collect(run, work.path(), since);
        }
        // 25 bytes: exactly the limit, everything kept.
        assert!(store.list("r1").is_some() && store.list("r3").is_some());
        let work = tempfile::tempdir().unwrap();
        write(work.path(), "f", 1);
        store.collect("r4", work.path(), since);
        // One byte past: the oldest run goes, files and folder.
        assert!(store.list("r1").is_none());
        assert!(!base.path().join("r1").exists());
        assert!(store.list("r2").is_some() && store.list("r4").is_some());

        let aged = ArtifactStore::with_limits(base.path(), ArtifactLimits { age: Duration::ZERO, ..SMALL }).unwrap();
        aged.collect("old", work.path(), since);
        aged.collect("new", work.path(), since);
        assert!(aged.list("old").is_none(), "an expired run is dropped at the next store");
    }

    #[test]
    fn private_folders_and_links_out_are_not_collected() {
        let base = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(base.path()).unwrap();
        std::fs::create_dir_all(work.path().join(".tmp")).unwrap();
        write(&work.path().join(".tmp"), "scratch", 3);
        write(work.path(), "kept.txt", 3);
        std::os::unix::fs::symlink("/etc/passwd", work.path().join("passwd")).unwrap();
        let since = SystemTime::now() - Duration::from_secs(5);
        assert_eq!(paths(&store.collect("r", work.path(), since)), ["kept.txt"]);
        assert!(store.open("r", "../r/kept.txt").is_err());
        assert!(store.open("nope", "kept.txt").is_err());
    }
}
