//! The artifact store: files a request's commands produced, copied out of
//! its workspace (which is deleted with the request) into a bounded store
//! keyed by run id, for download. `ArtifactStoreActor` owns it; loops send
//! it the files a tool call changed and the HTTP routes ask it for them.
//!
//! The store's folder is the server's own, but everything copied into it
//! came from a workspace, so it too is reached only through a [`DirHandle`]:
//! names are checked before anything is created, files are staged and
//! renamed into place, and old runs are removed by descriptor.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::workspace::handle::{DirHandle, Found};
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

/// Folders of a workspace that hold the server's and the helper's own
/// bookkeeping, the packages the host installed there, and the user's
/// attachments (kept in the store already); never collected as artifacts
/// or into a conversation's kept files (a produced file is something the
/// model made).
pub const PRIVATE: [&str; 5] = [
    ".skillhost",
    ".tmp",
    crate::sandbox::PYTHON_USER_BASE,
    crate::sandbox::NODE_MODULES,
    crate::attachments::ATTACHMENTS_DIR,
];

pub use crate::request::Artifact;

#[derive(Debug)]
struct RunFiles {
    id: String,
    created: Instant,
    files: Vec<Artifact>,
}

/// The store itself: plain, synchronous, owned by the actor.
#[derive(Debug)]
pub struct ArtifactStore {
    base: DirHandle,
    limits: ArtifactLimits,
    runs: VecDeque<RunFiles>,
}

/// Whether a run id is one the server made (`run-` and letters or digits,
/// then the replica's tag when it has one): it names a folder of the
/// store, so nothing else may. Neither part can hold `/` or `.`.
fn valid_run_id(run_id: &str) -> bool {
    let Some(rest) = run_id.strip_prefix("run-") else { return false };
    let (random, replica) = match rest.split_once(crate::replica::TAG) {
        Some((random, replica)) => (random, Some(replica)),
        None => (rest, None),
    };
    run_id.len() <= 64
        && !random.is_empty()
        && random.chars().all(|c| c.is_ascii_alphanumeric())
        && replica.is_none_or(|r| crate::replica::check(r).is_ok())
}

impl ArtifactStore {
    /// A store in `base`, a folder the server made for it.
    pub fn new(base: &Path, limits: ArtifactLimits) -> std::io::Result<ArtifactStore> {
        Ok(ArtifactStore { base: DirHandle::open(base)?, limits, runs: VecDeque::new() })
    }

    fn total(&self) -> u64 {
        self.runs.iter().flat_map(|r| &r.files).map(|f| f.bytes).sum()
    }

    /// Drops runs past their age, then the oldest while over the byte
    /// budget; never `keep`, the run being stored.
    fn evict(&mut self, incoming: u64, keep: &str) {
        let age = self.limits.age;
        let expired: Vec<String> =
            self.runs.iter().filter(|r| r.id != keep && r.created.elapsed() > age).map(|r| r.id.clone()).collect();
        for id in expired {
            self.drop_run(&id);
        }
        while self.total() + incoming > self.limits.total_bytes {
            let Some(oldest) = self.runs.iter().find(|r| r.id != keep).map(|r| r.id.clone()) else { break };
            self.drop_run(&oldest);
        }
    }

    fn drop_run(&mut self, id: &str) {
        self.runs.retain(|r| r.id != id);
        let _ = self.base.remove_tree(id);
    }

    /// Copies the files a tool call changed into the run's store and
    /// returns those kept. Files past the per-file size or the per-run
    /// count are passed over before anything is created, and do not count
    /// toward the byte budget.
    pub fn store(&mut self, run_id: &str, files: Vec<Found>) -> Vec<Artifact> {
        if !valid_run_id(run_id) {
            return Vec::new();
        }
        let limits = self.limits;
        let known: Vec<String> = self.list(run_id).unwrap_or_default().into_iter().map(|f| f.path).collect();
        let mut count = known.len();
        let mut accepted = Vec::new();
        for found in files {
            let is_new = !known.contains(&found.path);
            if found.bytes > limits.file_bytes || (is_new && count >= limits.run_files) {
                continue;
            }
            count += usize::from(is_new);
            accepted.push(found);
        }
        if accepted.is_empty() {
            return Vec::new();
        }
        let incoming: u64 = accepted.iter().map(|f| f.bytes).sum();
        self.evict(incoming, run_id);
        if !self.runs.iter().any(|r| r.id == run_id) {
            match self.base.make_folder(run_id) {
                Ok(()) | Err(crate::workspace::FsError::Exists { .. }) => {}
                Err(_) => return Vec::new(),
            }
            self.runs.push_back(RunFiles { id: run_id.to_string(), created: Instant::now(), files: Vec::new() });
        }
        let mut stored = Vec::new();
        for found in accepted {
            let target = format!("{run_id}/{}", found.path);
            // At most the size the walk saw, so the budget holds even for
            // a file that grows while it is copied.
            let mut source = found.file.take(found.bytes);
            let Ok(staged) = self.base.stage_from(&target, &mut source) else { continue };
            if self.base.commit(staged, true).is_err() {
                continue;
            }
            let artifact = Artifact { path: found.path, bytes: found.bytes };
            if let Some(run) = self.runs.iter_mut().find(|r| r.id == run_id) {
                run.files.retain(|f| f.path != artifact.path);
                run.files.push(artifact.clone());
            }
            stored.push(artifact);
        }
        stored
    }

    /// The files of a run.
    pub fn list(&self, run_id: &str) -> Option<Vec<Artifact>> {
        self.runs.iter().find(|r| r.id == run_id).map(|r| r.files.clone())
    }

    /// Opens one stored file: (file, length).
    pub fn open(&self, run_id: &str, path: &str) -> Result<(File, u64), ArtifactError> {
        let known =
            self.runs.iter().find(|r| r.id == run_id).ok_or_else(|| ArtifactError::NoRun(run_id.to_string()))?;
        if !known.files.iter().any(|f| f.path == path) {
            return Err(ArtifactError::NoFile { run_id: run_id.to_string(), path: path.to_string() });
        }
        self.base.open_file(&format!("{run_id}/{path}")).map_err(|err| ArtifactError::Unreadable(err.to_string()))
    }
}

/// Why a download finds no file. Each is a 404 for the client, which may
/// ask again later for a store that was unavailable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    /// The run is unknown or its files were let go.
    #[error("no run '{0}' has stored files")]
    NoRun(String),
    #[error("run '{run_id}' has no file '{path}'")]
    NoFile { run_id: String, path: String },
    /// The stored copy cannot be opened (the store refuses the path).
    #[error("{0}")]
    Unreadable(String),
    /// The store's actor or lock is gone.
    #[error("the artifact store is unavailable")]
    Unavailable,
}

pub struct ArtifactStoreActor;

pub enum ArtifactMsg {
    /// Sent by a workspace actor after a tool call changed files: copy them
    /// into the run's store; the reply is what was kept.
    Store { run_id: String, files: Vec<Found>, reply: RpcReplyPort<Vec<Artifact>> },
    /// Sent by the HTTP routes: the files of a run.
    List { run_id: String, reply: RpcReplyPort<Option<Vec<Artifact>>> },
    /// Sent by the HTTP routes: one file, opened for download.
    Open { run_id: String, path: String, reply: RpcReplyPort<Result<(File, u64), ArtifactError>> },
}

pub struct ArtifactState {
    /// Shared with the blocking task that copies files, one at a time.
    store: Arc<Mutex<ArtifactStore>>,
}

impl Actor for ArtifactStoreActor {
    type Msg = ArtifactMsg;
    type State = ArtifactState;
    type Arguments = ArtifactStore;

    async fn pre_start(
        &self,
        _myself: ActorRef<ArtifactMsg>,
        store: ArtifactStore,
    ) -> Result<ArtifactState, ActorProcessingErr> {
        Ok(ArtifactState { store: Arc::new(Mutex::new(store)) })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ArtifactMsg>,
        msg: ArtifactMsg,
        state: &mut ArtifactState,
    ) -> Result<(), ActorProcessingErr> {
        let store = Arc::clone(&state.store);
        match msg {
            ArtifactMsg::Store { run_id, files, reply } => {
                // Copying is disk work: off the async threads, awaited here so
                // stores stay one at a time.
                let kept = tokio::task::spawn_blocking(move || {
                    store.lock().map(|mut store| store.store(&run_id, files)).unwrap_or_default()
                })
                .await
                .unwrap_or_default();
                let _ = reply.send(kept);
            }
            ArtifactMsg::List { run_id, reply } => {
                let _ = reply.send(store.lock().ok().and_then(|store| store.list(&run_id)));
            }
            ArtifactMsg::Open { run_id, path, reply } => {
                let opened = tokio::task::spawn_blocking(move || {
                    store.lock().map_err(|_| ArtifactError::Unavailable)?.open(&run_id, &path)
                })
                .await
                .unwrap_or(Err(ArtifactError::Unavailable));
                let _ = reply.send(opened);
            }
        }
        Ok(())
    }
}

/// How long a caller waits for the store.
const STORE_TIMEOUT: Duration = Duration::from_secs(120);

/// A handle on the store actor.
#[derive(Debug, Clone)]
pub struct Artifacts(pub ActorRef<ArtifactMsg>);

impl Artifacts {
    pub async fn store(&self, run_id: &str, files: Vec<Found>) -> Vec<Artifact> {
        let run_id = run_id.to_string();
        match self.0.call(|reply| ArtifactMsg::Store { run_id, files, reply }, Some(STORE_TIMEOUT)).await {
            Ok(ractor::rpc::CallResult::Success(kept)) => kept,
            _ => Vec::new(),
        }
    }

    pub async fn list(&self, run_id: &str) -> Option<Vec<Artifact>> {
        let run_id = run_id.to_string();
        match self.0.call(|reply| ArtifactMsg::List { run_id, reply }, Some(STORE_TIMEOUT)).await {
            Ok(ractor::rpc::CallResult::Success(files)) => files,
            _ => None,
        }
    }

    pub async fn open(&self, run_id: &str, path: &str) -> Result<(File, u64), ArtifactError> {
        let (run_id, path) = (run_id.to_string(), path.to_string());
        match self.0.call(|reply| ArtifactMsg::Open { run_id, path, reply }, Some(STORE_TIMEOUT)).await {
            Ok(ractor::rpc::CallResult::Success(opened)) => opened,
            _ => Err(ArtifactError::Unavailable),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    const SMALL: ArtifactLimits =
        ArtifactLimits { run_files: 3, file_bytes: 10, total_bytes: 25, age: Duration::from_secs(3600) };

    fn write(dir: &Path, name: &str, bytes: usize) {
        std::fs::write(dir.join(name), "x".repeat(bytes)).unwrap();
    }

    fn paths(files: &[Artifact]) -> Vec<&str> {
        files.iter().map(|f| f.path.as_str()).collect()
    }

    fn changed(work: &Path) -> Vec<Found> {
        let since = SystemTime::now() - Duration::from_secs(5);
        DirHandle::open(work).unwrap().changed_files(since, &PRIVATE)
    }

    #[test]
    fn run_ids_are_the_servers_own_shape_with_or_without_a_replica() {
        for good in ["run-abc123", "run-abc__r1", "run-abc__eu-west-1"] {
            assert!(valid_run_id(good), "{good}");
        }
        for bad in
            ["run-", "run-a/b", "run-..", "run-abc__", "run-abc__r_1", "run-abc__../x", "other-abc", "run-a.b__r1"]
        {
            assert!(!valid_run_id(bad), "{bad}");
        }
        // The longest a run id may be, and one past it.
        let longest = format!("run-{}", "a".repeat(60));
        assert!(valid_run_id(&longest));
        assert!(!valid_run_id(&format!("{longest}a")));
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
        let mut store = ArtifactStore::new(base.path(), SMALL).unwrap();
        write(work.path(), "at.txt", 10);
        write(work.path(), "past.txt", 11);
        assert_eq!(paths(&store.store("run-1", changed(work.path()))), ["at.txt"]);
        assert_eq!(paths(&store.store("run-3__eu-1", changed(work.path()))), ["at.txt"], "a replica's run");

        let work = tempfile::tempdir().unwrap();
        for name in ["a", "b", "c", "d"] {
            write(work.path(), name, 1);
        }
        // Three files fit a run; the fourth is left out, but a stored file
        // changed again is still replaced.
        assert_eq!(paths(&store.store("run-2", changed(work.path()))), ["a", "b", "c"]);
        write(work.path(), "a", 2);
        let again = store.store("run-2", changed(work.path()));
        assert!(paths(&again).contains(&"a") && !paths(&again).contains(&"d"));
        assert_eq!(store.list("run-2").unwrap().iter().find(|f| f.path == "a").unwrap().bytes, 2);
    }

    #[test]
    fn the_oldest_runs_go_when_the_total_passes_the_limit_or_they_expire() {
        let base = tempfile::tempdir().unwrap();
        let mut store = ArtifactStore::new(base.path(), SMALL).unwrap();
        for (run, bytes) in [("run-1", 10), ("run-2", 10), ("run-3", 5)] {
            let work = tempfile::tempdir().unwrap();
            write(work.path(), "f", bytes);
            store.store(run, changed(work.path()));
        }
        // 25 bytes: exactly the limit, everything kept.
        assert!(store.list("run-1").is_some() && store.list("run-3").is_some());
        let work = tempfile::tempdir().unwrap();
        write(work.path(), "f", 1);
        store.store("run-4", changed(work.path()));
        // One byte past: the oldest run goes, files and folder.
        assert!(store.list("run-1").is_none());
        assert!(!base.path().join("run-1").exists());
        assert!(store.list("run-2").is_some() && store.list("run-4").is_some());

        let aged = tempfile::tempdir().unwrap();
        let mut aged = ArtifactStore::new(aged.path(), ArtifactLimits { age: Duration::ZERO, ..SMALL }).unwrap();
        aged.store("run-old", changed(work.path()));
        aged.store("run-new", changed(work.path()));
        assert!(aged.list("run-old").is_none(), "an expired run is dropped at the next store");
    }

    #[test]
    fn a_skipped_file_does_not_count_toward_the_budget() {
        let base = tempfile::tempdir().unwrap();
        let mut store = ArtifactStore::new(base.path(), SMALL).unwrap();
        let work = tempfile::tempdir().unwrap();
        write(work.path(), "f", 10);
        store.store("run-1", changed(work.path()));
        let work = tempfile::tempdir().unwrap();
        write(work.path(), "g", 10);
        store.store("run-2", changed(work.path()));
        // 20 of 25 bytes stored. A 100-byte file is skipped (too large), so
        // storing it with a 5-byte one evicts nothing.
        let work = tempfile::tempdir().unwrap();
        write(work.path(), "huge", 100);
        write(work.path(), "small", 5);
        assert_eq!(paths(&store.store("run-3", changed(work.path()))), ["small"]);
        assert!(store.list("run-1").is_some(), "a skipped file evicted a run");
    }

    #[test]
    fn private_folders_links_and_refused_names_are_not_collected() {
        let base = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let mut store = ArtifactStore::new(base.path(), ArtifactLimits::default()).unwrap();
        std::fs::create_dir_all(work.path().join(".tmp")).unwrap();
        write(&work.path().join(".tmp"), "scratch", 3);
        write(work.path(), "kept.txt", 3);
        write(work.path(), "a\\b", 3);
        std::os::unix::fs::symlink("/etc/passwd", work.path().join("passwd")).unwrap();
        assert_eq!(paths(&store.store("run-1", changed(work.path()))), ["kept.txt"]);
        assert_eq!(std::fs::read_dir(base.path().join("run-1")).unwrap().count(), 1);
        assert!(store.open("run-1", "../run-1/kept.txt").is_err());
        assert_eq!(store.open("run-9", "kept.txt").map(|_| ()), Err(ArtifactError::NoRun("run-9".into())));
        assert!(store.store("../escape", changed(work.path())).is_empty());
    }
}
