//! `SkillRegistryActor`: owns the registry snapshot and every change to it.
//!
//! Readers never message the actor: they borrow the current snapshot from a
//! watch channel, so a listing never waits for a scan. Rescans, installs and
//! deletes are messages, handled one at a time, each doing its filesystem
//! work on a blocking thread and then swapping in a new snapshot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use super::install::{install_archive, InstallError, ZipLimits};
use super::registry::{changes, scan, Changes, Root, Snapshot};
use super::skill::Origin;

/// How long file changes must settle before `--skills-watch` rescans.
pub const WATCH_DEBOUNCE: Duration = Duration::from_millis(500);

/// How the registry is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillsConfig {
    /// In precedence order; the install directory, when there is one, first.
    pub roots: Vec<Root>,
    /// Where uploads go; `None` when uploads are not possible.
    pub install_dir: Option<PathBuf>,
    /// Rescan when files under the roots change.
    pub watch: bool,
    /// Also rescan this often: file events do not report changes another
    /// machine makes on shared storage (NFS).
    pub poll: Option<std::time::Duration>,
    /// Skills selected for every request that names none (`--skill`).
    pub selected: Vec<String>,
}

/// Why a registry change failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkillsError {
    /// No such skill (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The skill exists but this change is not allowed (HTTP 403).
    #[error("{0}")]
    Forbidden(String),
    /// The upload was refused or conflicts with an existing skill.
    #[error("{0}")]
    Install(#[from] InstallError),
    /// The registry actor is gone (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
}

pub struct SkillRegistryActor;

pub struct SkillsArgs {
    pub config: SkillsConfig,
    pub snapshot: Arc<watch::Sender<Arc<Snapshot>>>,
}

pub enum SkillsMsg {
    /// Sent by the HTTP layer (with a reply) and by the file watcher (without).
    Rescan(Option<RpcReplyPort<Changes>>),
    /// Sent by the HTTP layer with an uploaded archive.
    /// The archive is a file the upload was streamed into (never held in memory).
    Install { archive: std::fs::File, overwrite: bool, reply: RpcReplyPort<Result<String, SkillsError>> },
    /// Sent by the HTTP layer to remove an installed skill.
    Delete { id: String, reply: RpcReplyPort<Result<(), SkillsError>> },
}

pub struct SkillsState {
    config: SkillsConfig,
    /// Publishes each new snapshot to readers; shared with the supervisor so
    /// a restarted registry keeps publishing to the same readers.
    snapshot: Arc<watch::Sender<Arc<Snapshot>>>,
    /// Keeps the file watcher alive while `--skills-watch` is on.
    _watcher: Option<notify_debouncer_mini::Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>>,
    /// The `--skills-poll` timer; aborted with the actor.
    _poller: Option<crate::task::AbortOnDrop>,
}

impl SkillsState {
    /// Scans on a blocking thread, publishes, and reports what changed.
    async fn rescan(&self) -> Changes {
        let roots = self.config.roots.clone();
        let after = match tokio::task::spawn_blocking(move || scan(&roots)).await {
            Ok(snapshot) => snapshot,
            Err(err) => {
                tracing::error!(error = %err, "the skills scan failed");
                return Changes::default();
            }
        };
        let before = self.snapshot.borrow().clone();
        let diff = changes(&before, &after);
        if diff != Changes::default() {
            tracing::info!(added = ?diff.added, removed = ?diff.removed, changed = ?diff.changed, "skills rescanned");
        }
        let _ = self.snapshot.send(Arc::new(after));
        diff
    }
}

impl Actor for SkillRegistryActor {
    type Msg = SkillsMsg;
    type State = SkillsState;
    type Arguments = SkillsArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SkillsMsg>,
        args: SkillsArgs,
    ) -> Result<SkillsState, ActorProcessingErr> {
        let watcher = if args.config.watch { Some(start_watcher(&args.config.roots, myself.clone())?) } else { None };
        let poller = args.config.poll.map(|every| {
            crate::task::AbortOnDrop::new(tokio::spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    if myself.cast(SkillsMsg::Rescan(None)).is_err() {
                        return;
                    }
                }
            }))
        });
        let state = SkillsState { config: args.config, snapshot: args.snapshot, _watcher: watcher, _poller: poller };
        state.rescan().await;
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<SkillsMsg>,
        msg: SkillsMsg,
        state: &mut SkillsState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SkillsMsg::Rescan(reply) => {
                let diff = state.rescan().await;
                if let Some(reply) = reply {
                    let _ = reply.send(diff);
                }
            }
            SkillsMsg::Install { archive, overwrite, reply } => {
                let result = install(state, archive, overwrite).await;
                if result.is_ok() {
                    state.rescan().await;
                }
                let _ = reply.send(result);
            }
            SkillsMsg::Delete { id, reply } => {
                let result = delete(state, &id).await;
                if result.is_ok() {
                    state.rescan().await;
                }
                let _ = reply.send(result);
            }
        }
        Ok(())
    }
}

async fn install(state: &SkillsState, archive: std::fs::File, overwrite: bool) -> Result<String, SkillsError> {
    let Some(install_dir) = state.config.install_dir.clone() else {
        return Err(SkillsError::Forbidden("this server has no skills install folder, so uploads are off".into()));
    };
    let current = state.snapshot.borrow().clone();
    let work = move || install_archive(archive, &install_dir, overwrite, &current, ZipLimits::default());
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => Ok(result?),
        Err(err) => Err(SkillsError::Install(InstallError::Io(format!("the install failed: {err}")))),
    }
}

async fn delete(state: &SkillsState, id: &str) -> Result<(), SkillsError> {
    let current = state.snapshot.borrow().clone();
    let Some(skill) = current.get(id) else {
        return Err(SkillsError::NotFound(format!("no skill named '{id}' is registered")));
    };
    if skill.origin == Origin::Discovered {
        return Err(SkillsError::Forbidden(format!(
            "the skill '{id}' was discovered in {}, not uploaded; remove it from disk instead",
            skill.root.display()
        )));
    }
    let root = skill.root.clone();
    let work = move || std::fs::remove_dir_all(&root);
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(SkillsError::Install(InstallError::Io(format!("cannot remove '{id}': {err}")))),
        Err(err) => Err(SkillsError::Install(InstallError::Io(format!("cannot remove '{id}': {err}")))),
    }
}

/// Watches every root and casts a rescan once changes settle.
fn start_watcher(
    roots: &[Root],
    actor: ActorRef<SkillsMsg>,
) -> Result<notify_debouncer_mini::Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>, ActorProcessingErr> {
    use notify_debouncer_mini::notify::RecursiveMode;
    let mut debouncer = notify_debouncer_mini::new_debouncer(
        WATCH_DEBOUNCE,
        move |result: notify_debouncer_mini::DebounceEventResult| {
            // The staging folders of uploads come and go; the install itself
            // rescans when it is done.
            let relevant = match &result {
                Ok(events) => events
                    .iter()
                    .any(|e| !e.path.components().any(|c| c.as_os_str().to_string_lossy().starts_with(".upload-"))),
                Err(_) => true,
            };
            if relevant {
                let _ = actor.cast(SkillsMsg::Rescan(None));
            }
        },
    )?;
    for root in roots {
        if root.path.is_dir() {
            debouncer.watcher().watch(&root.path, RecursiveMode::Recursive)?;
        }
    }
    Ok(debouncer)
}
