//! `SkillRegistryActor`: owns the registry snapshot and every change to it.
//!
//! Readers never message the actor: they borrow the current snapshot from a
//! watch channel, so a listing never waits for a scan. Rescans, installs and
//! deletes are messages, handled one at a time, each doing its filesystem
//! work on a blocking thread and then swapping in a new snapshot.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use super::install::{install_archive, InstallError, InstallOptions, ZipLimits};
use super::registry::{changes, scan_under, Changes, Root, Snapshot};
use super::scan::Policies;
use super::skill::{Origin, Skill};
use super::versions;

/// How long file changes must settle before `--skills-watch` rescans.
pub const WATCH_DEBOUNCE: Duration = Duration::from_millis(500);

/// How the registry is set up.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Previous versions an installed skill keeps (`--skills-keep-versions`).
    pub keep_versions: usize,
    /// What the scan's findings stop, by source (`--skills-install-policy`).
    pub policy: Policies,
    /// The hosts installs by URL may fetch from (`--skills-install-domains`).
    pub install_domains: super::fetch::Domains,
    /// The skills `/.well-known/agent-skills/` lists (`--skills-publish`).
    pub publish: super::discovery::Publish,
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
    /// The change cannot apply to the skill as it is (HTTP 409).
    #[error("{0}")]
    Conflict(String),
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
    /// `name`, when set, is the skill the archive must hold (a new version).
    Install {
        archive: std::fs::File,
        overwrite: bool,
        name: Option<String>,
        reply: RpcReplyPort<Result<String, SkillsError>>,
    },
    /// Sent by the HTTP layer to remove an installed skill.
    Delete { id: String, reply: RpcReplyPort<Result<(), SkillsError>> },
    /// Sent by the HTTP layer to make an earlier version live again: the one
    /// named, else the newest before the live one. Answers the version.
    Rollback { id: String, version: Option<u32>, reply: RpcReplyPort<Result<u32, SkillsError>> },
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
    /// Every skill folder a published snapshot held, by canonical path: a
    /// turn keeps the snapshot it started with, so a folder is in use while
    /// its skill is alive.
    held: HashMap<PathBuf, Weak<Skill>>,
    /// Version folders that left the history, removed once no turn holds them.
    retired: Vec<PathBuf>,
}

impl SkillsState {
    /// Scans on a blocking thread, publishes, and reports what changed.
    async fn rescan(&mut self) -> Changes {
        let roots = self.config.roots.clone();
        let policy = self.config.policy.roots;
        let mut after = match tokio::task::spawn_blocking(move || scan_under(&roots, policy)).await {
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
        // An unchanged skill keeps its object, so the turns that hold it and
        // the registry agree on when its folder stops being read.
        for (id, skill) in after.skills.iter_mut() {
            if let Some(old) = before.get(id).filter(|old| ***old == **skill) {
                *skill = Arc::clone(old);
            }
        }
        self.held.retain(|_, skill| skill.strong_count() > 0);
        for skill in after.skills.values() {
            self.held.insert(skill.root.clone(), Arc::downgrade(skill));
        }
        let _ = self.snapshot.send(Arc::new(after));
        self.sweep().await;
        diff
    }

    /// Takes version folders out of the history: each goes once no turn
    /// holds its skill.
    fn retire(&mut self, folders: Vec<PathBuf>) {
        for folder in folders {
            // Skills are held by their canonical folder.
            self.retired.push(std::fs::canonicalize(&folder).unwrap_or(folder));
        }
    }

    /// Removes the retired folders nothing reads any more.
    async fn sweep(&mut self) {
        let held = &self.held;
        let (free, busy): (Vec<PathBuf>, Vec<PathBuf>) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(|folder| held.get(folder).is_none_or(|skill| skill.strong_count() == 0));
        self.retired = busy;
        if free.is_empty() {
            return;
        }
        let work = move || {
            for folder in free {
                if let Err(err) = std::fs::remove_dir_all(&folder) {
                    tracing::warn!(folder = %folder.display(), error = %err, "a retired skill version was not removed");
                }
                // The skill's own folder of versions goes with its last one
                // (`remove_dir` leaves a folder that still holds any).
                if let Some(versions) = folder.parent() {
                    let _ = std::fs::remove_dir(versions);
                }
            }
        };
        let _ = tokio::task::spawn_blocking(work).await;
    }
}

/// Tidies the install folder before the first scan, when no turn can read
/// it: links and version folders an interrupted install left, and skill
/// folders put there by hand, which become their skill's version 1.
fn tidy(install_dir: &Path) {
    for link in versions::stray_links(install_dir) {
        let _ = std::fs::remove_file(link);
    }
    for folder in versions::leftovers(install_dir) {
        let _ = std::fs::remove_dir_all(folder);
    }
    for name in versions::adoptable(install_dir) {
        if let Err(err) = versions::adopt(install_dir, &name) {
            tracing::warn!(skill = %name, error = %err, "an installed skill folder was not taken into versions");
        }
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
        if let Some(dir) = args.config.install_dir.clone() {
            let _ = tokio::task::spawn_blocking(move || tidy(&dir)).await;
        }
        let mut state = SkillsState {
            config: args.config,
            snapshot: args.snapshot,
            _watcher: watcher,
            _poller: poller,
            held: HashMap::new(),
            retired: Vec::new(),
        };
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
            SkillsMsg::Install { archive, overwrite, name, reply } => {
                let result = install(state, archive, overwrite, name).await.map(|installed| {
                    state.retire(installed.retired);
                    installed.name
                });
                if result.is_ok() {
                    state.rescan().await;
                }
                let _ = reply.send(result);
            }
            SkillsMsg::Delete { id, reply } => {
                let result = delete(state, &id).await.map(|retired| state.retire(retired));
                if result.is_ok() {
                    state.rescan().await;
                }
                let _ = reply.send(result);
            }
            SkillsMsg::Rollback { id, version, reply } => {
                let result = rollback(state, &id, version).await;
                if result.is_ok() {
                    state.rescan().await;
                }
                let _ = reply.send(result);
            }
        }
        Ok(())
    }
}

async fn install(
    state: &SkillsState,
    archive: std::fs::File,
    overwrite: bool,
    name: Option<String>,
) -> Result<super::install::Installed, SkillsError> {
    let Some(install_dir) = state.config.install_dir.clone() else {
        return Err(SkillsError::Forbidden("this server has no skills install folder, so uploads are off".into()));
    };
    let current = state.snapshot.borrow().clone();
    let options = InstallOptions {
        overwrite,
        name,
        limits: ZipLimits::default(),
        keep: state.config.keep_versions,
        policy: state.config.policy.installs,
    };
    let work = move || install_archive(archive, &install_dir, &current, options);
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => Ok(result?),
        Err(err) => Err(SkillsError::Install(InstallError::Io(format!("the install failed: {err}")))),
    }
}

/// The installed skill `id` and the install folder, or why a change to it
/// is refused (`what` names the change).
fn installed(state: &SkillsState, id: &str, what: &str) -> Result<PathBuf, SkillsError> {
    let current = state.snapshot.borrow().clone();
    let Some(skill) = current.get(id) else {
        return Err(SkillsError::NotFound(format!("no skill named '{id}' is registered")));
    };
    if skill.origin == Origin::Discovered {
        return Err(SkillsError::Forbidden(format!(
            "the skill '{id}' was discovered in {}, not uploaded; {what}",
            skill.root.display()
        )));
    }
    state.config.install_dir.clone().ok_or_else(|| SkillsError::Forbidden("this server has no install folder".into()))
}

/// Deletes an installed skill; returns its version folders, which go once
/// no turn reads them.
async fn delete(state: &SkillsState, id: &str) -> Result<Vec<PathBuf>, SkillsError> {
    let install_dir = installed(state, id, "remove it from disk instead")?;
    let name = id.to_string();
    let work = move || versions::retire(&install_dir, &name);
    let failed = |err: String| SkillsError::Install(InstallError::Io(format!("cannot remove '{id}': {err}")));
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(retired)) => Ok(retired),
        Ok(Err(err)) => Err(failed(err.to_string())),
        Err(err) => Err(failed(err.to_string())),
    }
}

/// Makes `version` of an installed skill live again, or the newest before
/// the live one.
async fn rollback(state: &SkillsState, id: &str, version: Option<u32>) -> Result<u32, SkillsError> {
    let install_dir = installed(state, id, "it has no versions here")?;
    let history = versions::history(&install_dir, id);
    let known = || history.versions.iter().map(|v| v.version.to_string()).collect::<Vec<_>>().join(", ");
    let target = match version {
        Some(asked) if history.versions.iter().any(|v| v.version == asked) => asked,
        Some(asked) => {
            return Err(SkillsError::NotFound(format!(
                "the skill '{id}' has no version {asked}; its versions: {}",
                known()
            )))
        }
        None => {
            let live = history.current.unwrap_or(u32::MAX);
            let earlier = history.versions.iter().map(|v| v.version).filter(|v| *v < live).max();
            earlier.ok_or_else(|| {
                SkillsError::Conflict(format!(
                    "the skill '{id}' has no version before {live} to roll back to; its versions: {}",
                    known()
                ))
            })?
        }
    };
    let name = id.to_string();
    let work = move || versions::point(&install_dir, &name, target);
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(())) => Ok(target),
        Ok(Err(err)) => Err(SkillsError::Install(InstallError::Io(format!("cannot roll '{id}' back: {err}")))),
        Err(err) => Err(SkillsError::Install(InstallError::Io(format!("cannot roll '{id}' back: {err}")))),
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
            // The staging folders of uploads, new links and versions come and
            // go; the install itself rescans when it is done.
            let ours = |name: &str| {
                name.starts_with(".upload-") || name.starts_with(".link-") || name == versions::VERSIONS_DIR
            };
            let relevant = match &result {
                Ok(events) => {
                    events.iter().any(|e| !e.path.components().any(|c| ours(&c.as_os_str().to_string_lossy())))
                }
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
