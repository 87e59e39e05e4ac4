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
    runs: VecDeque<RunFiles>,
}

impl Inner {
    fn total(&self) -> u64 {
        self.runs.iter().flat_map(|r| &r.files).map(|f| f.bytes).sum()
    }

    /// Drops runs past their age, then the oldest while over the byte budget.
    fn evict(&mut self, incoming: u64) {
        while let Some(oldest) = self.runs.front() {
            let expired = oldest.created.elapsed() > MAX_AGE;
            if !expired && self.total() + incoming <= MAX_TOTAL_BYTES {
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
        std::fs::create_dir_all(base)?;
        Ok(ArtifactStore { inner: Arc::new(Mutex::new(Inner { base: base.to_path_buf(), runs: VecDeque::new() })) })
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
        let mut stored = Vec::new();
        for (path, bytes) in changed {
            let run = &mut inner.runs[index];
            let known = run.files.iter().any(|f| f.path == path);
            if bytes > MAX_FILE_BYTES || (!known && run.files.len() >= MAX_RUN_FILES) {
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
