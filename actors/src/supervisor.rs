//! The supervisor: owns the model actors (one per loaded model), loads a
//! model when a request names it, unloads idle ones to make room, restarts
//! one whose engine died, and spawns one linked `LoopActor` per chat
//! request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use skillhost_engine::{EngineStats, LoadProgress, ModelInfo};
use tokio::sync::{mpsc, watch};

use crate::artifacts::{ArtifactStore, ArtifactStoreActor, Artifacts};
use crate::chat_loop::agents::AgentStats;
use crate::chat_loop::{LoopActor, LoopArgs, LoopMsg, LoopSettings};
use crate::conversations::Conversations;
use crate::model::catalog::{self, Catalog, Resident, Room};
use crate::model::{ModelActor, ModelBackend, ModelMsg, ModelSource};
use crate::request::{ChatError, ChatEvent, ChatRequest};
use crate::sandbox::ExecRuntime;
use crate::skills::actor::{SkillRegistryActor, SkillsArgs, SkillsMsg};
use crate::skills::{SkillsConfig, Snapshot};

/// How long the supervisor waits for the model actor to answer.
const MODEL_CALL_TIMEOUT_MS: u64 = 5_000;
/// Engine restarts allowed within [`RESTART_WINDOW`] before the supervisor
/// gives up and reports the model as failed: a model that crashes on every
/// load must not spin forever.
pub const MAX_RESTARTS: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// How often the supervisor looks for models idle past
/// `--model-idle-unload` and for requests that waited too long for theirs.
pub const MODEL_TICK: Duration = Duration::from_secs(1);

/// Whether a model is ready to serve; published for `/health` and `/metrics`.
#[derive(Debug, Clone)]
pub enum ModelStatus {
    /// Configured, not in memory: the first request that names it loads it.
    Unloaded,
    Loading,
    Ready {
        info: Arc<ModelInfo>,
        stats: Arc<EngineStats>,
    },
    Failed(String),
}

/// Every configured model's status, the default one first; published for
/// the HTTP layer's listings.
#[derive(Debug, Clone)]
pub struct ModelsView {
    pub models: Vec<ModelView>,
}

#[derive(Debug, Clone)]
pub struct ModelView {
    pub name: String,
    /// Other names requests may use for it.
    pub aliases: Vec<String>,
    pub status: ModelStatus,
    /// Weights plus KV cache once loaded; the files' size before.
    pub bytes: u64,
    /// Turns running on it now.
    pub running: usize,
    /// While it loads: how far, read live (the view is published only when
    /// a status changes).
    pub progress: LoadProgress,
}

impl ModelsView {
    /// The default model's status.
    pub fn default_status(&self) -> ModelStatus {
        self.models.first().map(|m| m.status.clone()).unwrap_or(ModelStatus::Loading)
    }

    /// The model a request's `model` field finds, as the supervisor finds
    /// it (the default for none; a name, an alias, with or without
    /// `.gguf`, or a loaded model's own id); `None` for an unknown name.
    pub fn find(&self, asked: Option<&str>) -> Option<&ModelView> {
        let asked = asked.unwrap_or_default();
        if asked.is_empty() {
            return self.models.first();
        }
        let bare = asked.strip_suffix(".gguf").unwrap_or(asked);
        let named = |model: &ModelView, name: &str| model.name == name || model.aliases.iter().any(|a| a == name);
        self.models.iter().find(|model| named(model, asked) || named(model, bare)).or_else(|| {
            self.models.iter().find(
                |model| matches!(&model.status, ModelStatus::Ready { info, .. } if info.id == asked || info.id == bare),
            )
        })
    }
}

/// What is published before the supervisor starts: the default model
/// loading, the others unloaded.
pub fn initial_view(models: &Catalog) -> ModelsView {
    let models = models
        .names()
        .into_iter()
        .enumerate()
        .map(|(index, name)| {
            let entry = models.entries().iter().find(|e| e.name == name);
            ModelView {
                name: name.to_string(),
                aliases: entry.map(|e| e.source.aliases().to_vec()).unwrap_or_default(),
                status: if index == 0 { ModelStatus::Loading } else { ModelStatus::Unloaded },
                bytes: entry.map_or(0, |e| e.bytes),
                running: 0,
                progress: LoadProgress::default(),
            }
        })
        .collect();
    ModelsView { models }
}

pub struct Supervisor;

pub struct SupervisorArgs {
    pub models: Catalog,
    /// How every request's loop runs.
    pub loop_settings: LoopSettings,
    /// Process execution, when offered.
    pub exec: Option<Arc<ExecRuntime>>,
    /// The store of produced files, when commands may run; the supervisor
    /// starts its actor.
    pub artifacts: Option<ArtifactStore>,
    pub conversations: Arc<Conversations>,
    pub status: watch::Sender<Arc<ModelsView>>,
    /// The skills registry's setup and the channel its snapshots go out on;
    /// `None` with `--no-skills`.
    pub skills: Option<(SkillsConfig, Arc<watch::Sender<Arc<Snapshot>>>)>,
    /// Counters of the agents requests start.
    pub agent_stats: Arc<AgentStats>,
    pub skill_outcomes: Arc<crate::skills::outcomes::SkillOutcomes>,
    /// The operator's MCP servers, when any are configured.
    pub mcp: Option<Arc<crate::tools::mcp::hub::McpHub>>,
}

pub enum SupervisorMsg {
    /// Sent to itself at start and after an engine died: (re)load a model.
    LoadModel(usize),
    /// Sent by the loading task when the model actor is up (or could not
    /// start): loading runs outside this mailbox, which stays free for
    /// chats, skills routes and token counts.
    ModelLoaded(usize, Result<(ActorRef<ModelMsg>, Arc<dyn ModelBackend>), String>),
    /// Sent by the HTTP layer for each chat request: spawn its loop actor on
    /// its model (loading that first), which reports on `events`.
    StartChat {
        request: Box<ChatRequest>,
        events: mpsc::UnboundedSender<ChatEvent>,
        reply: RpcReplyPort<Result<ActorRef<LoopMsg>, ChatError>>,
    },
    /// Sent by the HTTP layer before it changes the skills registry: the
    /// registry actor, when skills are on.
    SkillsActor(RpcReplyPort<Option<ActorRef<SkillsMsg>>>),
    /// Sent by the server handle once at start: the artifact store's actor.
    Artifacts(RpcReplyPort<Option<Artifacts>>),
    /// Sent by the HTTP layer for a model's facts or to count a prompt's
    /// tokens: the named model (the default for `None`), loaded first.
    Backend { model: Option<String>, reply: RpcReplyPort<Result<Arc<dyn ModelBackend>, ChatError>> },
    /// Sent by the admin route: load the named model now (a model whose
    /// last load failed is tried again), answering once it is ready.
    Load { model: String, reply: RpcReplyPort<Result<Arc<dyn ModelBackend>, ChatError>> },
    /// Sent by the admin route: unload the named model now, unless turns
    /// are running on it (or it is loading).
    Unload { model: String, reply: RpcReplyPort<Result<(), ChatError>> },
    /// Sent by a timer every [`MODEL_TICK`]: unload idle models, give up
    /// on waits past their deadline.
    Tick,
    /// Sent by tests to make the default model's engine thread panic.
    InjectEnginePanic,
}

/// One configured model's place in the supervisor.
struct Slot {
    source: ModelSource,
    name: String,
    phase: Phase,
    /// Weights plus KV cache once it was loaded; its files' size before.
    bytes: u64,
    /// Loop actors running on it now.
    running: usize,
    last_used: Instant,
    /// When recent restarts happened, to cap restart loops.
    restarts: Vec<Instant>,
    /// Requests waiting for it to load.
    waiting: Vec<Waiter>,
    /// How far its current load has come (a fresh one for each load).
    progress: LoadProgress,
}

enum Phase {
    Unloaded,
    Loading,
    Ready { actor: ActorRef<ModelMsg>, backend: Arc<dyn ModelBackend> },
    Failed(String),
}

/// A request that needs a model that is not loaded yet.
struct Waiter {
    deadline: Instant,
    wants: Wants,
}

enum Wants {
    Chat {
        request: Box<ChatRequest>,
        events: mpsc::UnboundedSender<ChatEvent>,
        reply: RpcReplyPort<Result<ActorRef<LoopMsg>, ChatError>>,
    },
    Backend(RpcReplyPort<Result<Arc<dyn ModelBackend>, ChatError>>),
}

impl Waiter {
    fn fail(self, err: ChatError) {
        match self.wants {
            Wants::Chat { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Wants::Backend(reply) => {
                let _ = reply.send(Err(err));
            }
        }
    }

    fn gone(&self) -> bool {
        match &self.wants {
            Wants::Chat { reply, .. } => reply.is_closed(),
            Wants::Backend(reply) => reply.is_closed(),
        }
    }
}

pub struct SupervisorState {
    slots: Vec<Slot>,
    limits: catalog::ModelLimits,
    /// The model each running loop actor uses, by the actor's id.
    loops: HashMap<ActorId, usize>,
    loop_settings: LoopSettings,
    exec: Option<Arc<ExecRuntime>>,
    /// The artifact store's actor, a linked child.
    artifacts: Option<Artifacts>,
    conversations: Arc<Conversations>,
    /// Published model status.
    status: watch::Sender<Arc<ModelsView>>,
    /// The skills registry's setup, kept to restart it.
    skills: Option<(SkillsConfig, Arc<watch::Sender<Arc<Snapshot>>>)>,
    /// The running registry actor.
    skills_actor: Option<ActorRef<SkillsMsg>>,
    agent_stats: Arc<AgentStats>,
    skill_outcomes: Arc<crate::skills::outcomes::SkillOutcomes>,
    mcp: Option<Arc<crate::tools::mcp::hub::McpHub>>,
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    /// Starts the skills registry (its first scan finishes before the
    /// server answers), then asks itself to load the default model; the
    /// others load when a request names them.
    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let default = args.models.default_name().to_string();
        let mut entries: Vec<_> = args.models.entries().to_vec();
        // The default model first: the view lists it first, and slot 0 is
        // what a request naming no model gets.
        entries.sort_by_key(|entry| entry.name != default);
        let now = Instant::now();
        let slots = entries
            .into_iter()
            .map(|entry| Slot {
                source: entry.source,
                name: entry.name,
                phase: Phase::Unloaded,
                bytes: entry.bytes,
                running: 0,
                last_used: now,
                restarts: Vec::new(),
                waiting: Vec::new(),
                progress: LoadProgress::default(),
            })
            .collect();
        let mut state = SupervisorState {
            slots,
            limits: args.models.limits,
            loops: HashMap::new(),
            loop_settings: args.loop_settings,
            exec: args.exec,
            artifacts: None,
            conversations: args.conversations,
            status: args.status,
            skills: args.skills,
            skills_actor: None,
            agent_stats: args.agent_stats,
            skill_outcomes: args.skill_outcomes,
            mcp: args.mcp,
        };
        start_skills(myself.get_cell(), &mut state).await?;
        if let Some(store) = args.artifacts {
            let (actor, _) = Actor::spawn_linked(None, ArtifactStoreActor, store, myself.get_cell()).await?;
            state.artifacts = Some(Artifacts(actor));
        }
        myself.cast(SupervisorMsg::LoadModel(0))?;
        myself.send_interval(MODEL_TICK, || SupervisorMsg::Tick);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::LoadModel(index) => load_model(&myself, state, index),
            SupervisorMsg::ModelLoaded(index, result) => {
                model_loaded(&myself, state, index, result);
                serve_waiters(&myself, state).await;
            }
            SupervisorMsg::StartChat { request, events, reply } => {
                let index = match resolve(state, request.model.as_deref()) {
                    Ok(index) => index,
                    Err(err) => {
                        let _ = reply.send(Err(err));
                        return Ok(());
                    }
                };
                let waiter = Waiter { deadline: wait_deadline(state), wants: Wants::Chat { request, events, reply } };
                state.slots[index].waiting.push(waiter);
                want(&myself, state, index);
                serve_waiters(&myself, state).await;
            }
            SupervisorMsg::Backend { model, reply } => {
                let index = match resolve(state, model.as_deref()) {
                    Ok(index) => index,
                    Err(err) => {
                        let _ = reply.send(Err(err));
                        return Ok(());
                    }
                };
                let waiter = Waiter { deadline: wait_deadline(state), wants: Wants::Backend(reply) };
                state.slots[index].waiting.push(waiter);
                want(&myself, state, index);
                serve_waiters(&myself, state).await;
            }
            SupervisorMsg::Load { model, reply } => {
                let index = match resolve(state, Some(&model)) {
                    Ok(index) => index,
                    Err(err) => {
                        let _ = reply.send(Err(err));
                        return Ok(());
                    }
                };
                if matches!(state.slots[index].phase, Phase::Failed(_)) {
                    state.slots[index].phase = Phase::Unloaded;
                    state.slots[index].restarts.clear();
                }
                let waiter = Waiter { deadline: wait_deadline(state), wants: Wants::Backend(reply) };
                state.slots[index].waiting.push(waiter);
                want(&myself, state, index);
                serve_waiters(&myself, state).await;
            }
            SupervisorMsg::Unload { model, reply } => {
                let result = resolve(state, Some(&model)).and_then(|index| unload_asked(state, index));
                publish(state);
                let _ = reply.send(result);
            }
            SupervisorMsg::Tick => {
                let now = Instant::now();
                let expired: Vec<usize> = {
                    let resident = residents(state);
                    let names = catalog::idle_expired(&resident, &state.limits, now);
                    names.iter().filter_map(|name| state.slots.iter().position(|s| s.name == *name)).collect()
                };
                for index in expired {
                    unload(state, index, "idle past --model-idle-unload");
                }
                for slot in &mut state.slots {
                    let (late, kept): (Vec<_>, Vec<_>) =
                        std::mem::take(&mut slot.waiting).into_iter().partition(|w| w.deadline <= now || w.gone());
                    slot.waiting = kept;
                    for waiter in late {
                        waiter.fail(ChatError::Unavailable(format!(
                            "the model '{}' did not become ready within --turn-timeout",
                            slot.name
                        )));
                    }
                }
                publish(state);
            }
            SupervisorMsg::SkillsActor(reply) => {
                let _ = reply.send(state.skills_actor.clone());
            }
            SupervisorMsg::Artifacts(reply) => {
                let _ = reply.send(state.artifacts.clone());
            }
            SupervisorMsg::InjectEnginePanic => {
                if let Phase::Ready { actor, .. } = &state.slots[0].phase {
                    let _ = actor.cast(ModelMsg::InjectPanic);
                }
            }
        }
        Ok(())
    }

    /// Overridden because ractor's default stops the supervisor when any child
    /// exits; here a finished request is routine and a dead engine is restarted.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let model_of = |state: &SupervisorState, cell: &ActorCell| {
            state
                .slots
                .iter()
                .position(|slot| matches!(&slot.phase, Phase::Ready { actor, .. } if actor.get_id() == cell.get_id()))
        };
        let is_skills = |cell: &ActorCell| state.skills_actor.as_ref().is_some_and(|m| m.get_id() == cell.get_id());
        match event {
            SupervisionEvent::ActorFailed(cell, err) if is_skills(&cell) => {
                tracing::error!(error = %err, "the skills registry failed; restarting it");
                state.skills_actor = None;
                if let Err(err) = start_skills(myself.get_cell(), state).await {
                    tracing::error!(error = %err, "the skills registry could not be restarted");
                }
            }
            SupervisionEvent::ActorFailed(cell, err) if model_of(state, &cell).is_some() => {
                let index = model_of(state, &cell).unwrap_or_default();
                tracing::error!(model = %state.slots[index].name, error = %err, "the model engine died; restarting it");
                engine_lost(&myself, state, index);
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) if model_of(state, &cell).is_some() => {
                let index = model_of(state, &cell).unwrap_or_default();
                tracing::error!(model = %state.slots[index].name, ?reason, "the model actor stopped; restarting it");
                engine_lost(&myself, state, index);
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                // One request's failure is reported to its client by the
                // closed event channel; the server goes on.
                tracing::error!(actor = %cell.get_id(), error = %err, "a chat request failed");
                loop_ended(&myself, state, &cell).await;
            }
            SupervisionEvent::ActorTerminated(cell, ..) => loop_ended(&myself, state, &cell).await,
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {}
        }
        Ok(())
    }
}

/// Spawns the skills registry when skills are on.
async fn start_skills(supervisor: ActorCell, state: &mut SupervisorState) -> Result<(), ActorProcessingErr> {
    let Some((config, snapshot)) = state.skills.clone() else {
        return Ok(());
    };
    let (actor, _) = Actor::spawn_linked(None, SkillRegistryActor, SkillsArgs { config, snapshot }, supervisor).await?;
    state.skills_actor = Some(actor);
    Ok(())
}

/// A loop actor ended: its model may go idle, and a request waiting for
/// room may now fit.
async fn loop_ended(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, cell: &ActorCell) {
    let Some(index) = state.loops.remove(&cell.get_id()) else { return };
    let slot = &mut state.slots[index];
    slot.running = slot.running.saturating_sub(1);
    slot.last_used = Instant::now();
    if state.slots.iter().any(|slot| !slot.waiting.is_empty()) {
        for index in 0..state.slots.len() {
            if !state.slots[index].waiting.is_empty() {
                want(myself, state, index);
            }
        }
        serve_waiters(myself, state).await;
    }
    publish(state);
}

/// The slot a request's `model` names: a configured name or alias (with
/// or without `.gguf`), or the id a loaded model reports for itself (an upstream's or
/// a provided model's); 404 in every surface's shape otherwise.
fn resolve(state: &SupervisorState, asked: Option<&str>) -> Result<usize, ChatError> {
    let asked = asked.unwrap_or_default();
    if asked.is_empty() {
        return Ok(0);
    }
    let bare = asked.strip_suffix(".gguf").unwrap_or(asked);
    let loaded_id = |slot: &Slot| match &slot.phase {
        Phase::Ready { backend, .. } => Some(backend.info().id.clone()),
        _ => None,
    };
    let named = |slot: &Slot, name: &str| slot.name == name || slot.source.aliases().iter().any(|alias| alias == name);
    if let Some(index) = state.slots.iter().position(|slot| named(slot, asked) || named(slot, bare)) {
        return Ok(index);
    }
    if let Some(index) = state.slots.iter().position(|slot| loaded_id(slot).is_some_and(|id| id == asked || id == bare))
    {
        return Ok(index);
    }
    let names: Vec<String> =
        state.slots.iter().map(|slot| loaded_id(slot).unwrap_or_else(|| slot.name.clone())).collect();
    Err(ChatError::ModelNotFound(if names.len() == 1 {
        format!("the model '{asked}' is not served here; this server serves '{}'", names[0])
    } else {
        format!("the model '{asked}' is not served here; the models are: {}", names.join(", "))
    }))
}

/// How long a request may wait for its model to load: its turn's bound.
fn wait_deadline(state: &SupervisorState) -> Instant {
    Instant::now() + state.loop_settings.turn_timeout
}

fn residents(state: &SupervisorState) -> Vec<Resident<'_>> {
    state
        .slots
        .iter()
        .filter(|slot| matches!(slot.phase, Phase::Ready { .. } | Phase::Loading))
        .map(|slot| Resident {
            name: &slot.name,
            bytes: slot.bytes,
            // A model being loaded is not a candidate: its requests wait on it.
            running: slot.running + usize::from(matches!(slot.phase, Phase::Loading)),
            last_used: slot.last_used,
        })
        .collect()
}

/// A request needs model `index`: load it if it is not loaded or loading,
/// unloading idle models first to make room; when only models with running
/// turns stand in the way it waits (a loop's end calls this again).
fn want(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, index: usize) {
    match state.slots[index].phase {
        Phase::Unloaded => {}
        Phase::Loading | Phase::Ready { .. } | Phase::Failed(_) => return,
    }
    let evict: Vec<usize> = {
        let resident = residents(state);
        match catalog::make_room(&resident, state.slots[index].bytes, &state.limits) {
            Room::Wait => {
                tracing::info!(model = %state.slots[index].name, "waiting for a loaded model's turns to end to make room");
                return;
            }
            Room::Evict(names) => {
                names.iter().filter_map(|name| state.slots.iter().position(|s| s.name == *name)).collect()
            }
        }
    };
    for other in evict {
        unload(state, other, "to make room for another model");
    }
    load_model(myself, state, index);
}

/// Unloads an idle model: its actor stops and the engine thread ends once
/// the last handle to it is dropped. Its slot remembers nothing but its
/// size, so the next request that names it loads it again.
fn unload(state: &mut SupervisorState, index: usize, why: &str) {
    let slot = &mut state.slots[index];
    if let Phase::Ready { actor, .. } = std::mem::replace(&mut slot.phase, Phase::Unloaded) {
        tracing::info!(model = %slot.name, why, "unloading the model");
        actor.stop(None);
    }
}

/// An operator's unload: a model with running turns or still loading is
/// left alone (409), since unloading would end turns a client waits on;
/// an unloaded model stays so, and a failed one forgets its failure.
fn unload_asked(state: &mut SupervisorState, index: usize) -> Result<(), ChatError> {
    let slot = &mut state.slots[index];
    match slot.phase {
        Phase::Ready { .. } if slot.running > 0 => Err(ChatError::Conflict(format!(
            "the model '{}' has {} running turn(s); unload it once they end",
            slot.name, slot.running
        ))),
        Phase::Loading => {
            Err(ChatError::Conflict(format!("the model '{}' is loading; unload it once it is ready", slot.name)))
        }
        Phase::Ready { .. } => {
            unload(state, index, "asked by an admin");
            Ok(())
        }
        Phase::Failed(_) => {
            slot.phase = Phase::Unloaded;
            slot.restarts.clear();
            Ok(())
        }
        Phase::Unloaded => Ok(()),
    }
}

/// Answers every waiter whose model is ready (or failed).
async fn serve_waiters(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    for index in 0..state.slots.len() {
        let slot = &state.slots[index];
        let ready = match &slot.phase {
            Phase::Ready { backend, .. } => Ok(Arc::clone(backend)),
            Phase::Failed(reason) => Err(format!("the model '{}' is not available: {reason}", slot.name)),
            Phase::Unloaded | Phase::Loading => continue,
        };
        for waiter in std::mem::take(&mut state.slots[index].waiting) {
            if waiter.gone() {
                continue;
            }
            let backend = match &ready {
                Ok(backend) => Arc::clone(backend),
                Err(reason) => {
                    waiter.fail(ChatError::Unavailable(reason.clone()));
                    continue;
                }
            };
            state.slots[index].last_used = Instant::now();
            match waiter.wants {
                Wants::Backend(reply) => {
                    let _ = reply.send(Ok(backend));
                }
                Wants::Chat { request, events, reply } => {
                    let result = start_chat(myself.get_cell(), state, *request, events, backend).await;
                    if let Ok(actor) = &result {
                        state.loops.insert(actor.get_id(), index);
                        state.slots[index].running += 1;
                    }
                    let _ = reply.send(result);
                }
            }
        }
    }
    publish(state);
}

/// Publishes every model's status.
fn publish(state: &SupervisorState) {
    let models = state
        .slots
        .iter()
        .map(|slot| ModelView {
            name: slot.name.clone(),
            aliases: slot.source.aliases().to_vec(),
            status: match &slot.phase {
                Phase::Unloaded => ModelStatus::Unloaded,
                Phase::Loading => ModelStatus::Loading,
                Phase::Ready { backend, .. } => {
                    ModelStatus::Ready { info: Arc::clone(backend.info()), stats: Arc::clone(backend.stats()) }
                }
                Phase::Failed(reason) => ModelStatus::Failed(reason.clone()),
            },
            bytes: slot.bytes,
            running: slot.running,
            progress: slot.progress.clone(),
        })
        .collect();
    let _ = state.status.send(Arc::new(ModelsView { models }));
}

fn engine_lost(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, index: usize) {
    let slot = &mut state.slots[index];
    slot.phase = Phase::Unloaded;
    let now = Instant::now();
    slot.restarts.retain(|at| now.duration_since(*at) < RESTART_WINDOW);
    if slot.restarts.len() >= MAX_RESTARTS {
        let message = format!(
            "the model engine died {MAX_RESTARTS} times within {}s; not restarting it",
            RESTART_WINDOW.as_secs()
        );
        tracing::error!(model = %slot.name, "{message}");
        slot.phase = Phase::Failed(message);
        publish(state);
        return;
    }
    slot.restarts.push(now);
    let _ = myself.cast(SupervisorMsg::LoadModel(index));
    publish(state);
}

/// Starts loading a model in a task of its own (a GGUF takes seconds to
/// minutes, and upstreams may take minutes to answer); the task reports
/// with [`SupervisorMsg::ModelLoaded`].
fn load_model(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, index: usize) {
    let slot = &mut state.slots[index];
    if !matches!(slot.phase, Phase::Unloaded) {
        return;
    }
    slot.phase = Phase::Loading;
    slot.progress = LoadProgress::default();
    let progress = slot.progress.clone();
    let path = slot.source.describe();
    tracing::info!(model = %slot.name, path = %path, "loading the model");
    let source = slot.source.clone();
    let myself = myself.clone();
    publish(state);
    tokio::spawn(async move {
        let result = match Actor::spawn_linked(None, ModelActor, (source, progress), myself.get_cell()).await {
            Ok((model, _)) => match ractor::call_t!(model, ModelMsg::GetEngine, MODEL_CALL_TIMEOUT_MS) {
                Ok(backend) => Ok((model, backend)),
                Err(err) => {
                    model.stop(None);
                    Err(format!("the model actor did not answer: {err}"))
                }
            },
            Err(err) => Err(format!("{err}")),
        };
        if let Err(err) = &result {
            tracing::error!(model = %path, error = %err, "the model failed to load");
        }
        let _ = myself.cast(SupervisorMsg::ModelLoaded(index, result));
    });
}

fn model_loaded(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    index: usize,
    result: Result<(ActorRef<ModelMsg>, Arc<dyn ModelBackend>), String>,
) {
    match result {
        // It died between answering and this message: its failure reached
        // the supervisor before it was known as the model, so restart here.
        Ok((model, _)) if model.get_status() != ractor::ActorStatus::Running => {
            tracing::error!(model = %state.slots[index].name, "the model engine died as it started; restarting it");
            engine_lost(myself, state, index);
        }
        Ok((model, backend)) => {
            let info = Arc::clone(backend.info());
            tracing::info!(
                model = %info.id,
                n_ctx = info.n_ctx,
                parallel = info.n_parallel,
                template = %info.format.capabilities().template,
                tool_calls = ?info.format.capabilities().tool_family,
                "model ready"
            );
            let slot = &mut state.slots[index];
            // An upstream's weights are elsewhere: its `size_bytes` is the
            // `--template-from` file's, of which only the vocabulary is read.
            let here = !matches!(slot.source, ModelSource::Remote(_));
            if here && info.size_bytes + info.kv_bytes > 0 {
                slot.bytes = info.size_bytes + info.kv_bytes;
            }
            slot.last_used = Instant::now();
            slot.phase = Phase::Ready { actor: model, backend };
        }
        Err(message) => {
            state.slots[index].phase = Phase::Failed(message);
        }
    }
    publish(state);
}

async fn start_chat(
    supervisor: ActorCell,
    state: &SupervisorState,
    request: ChatRequest,
    events: mpsc::UnboundedSender<ChatEvent>,
    backend: Arc<dyn ModelBackend>,
) -> Result<ActorRef<LoopMsg>, ChatError> {
    if backend.info().embedding {
        return Err(ChatError::BadRequest(format!(
            "the model '{}' is loaded for embeddings only; send chat to a model configured without `embedding: true`",
            backend.info().id
        )));
    }
    let mut request = request;
    let mut skills = state.skills.as_ref().map(|(_, snapshot)| snapshot.borrow().clone());
    if let (Some(brought), Some(registry)) = (request.brought.clone(), skills.as_ref()) {
        // This turn alone sees the request's own skills, selected, beside
        // the registry's; the registry itself never holds them.
        let mut with_brought = registry.skills.clone();
        for skill in &brought.skills {
            with_brought.insert(skill.id().to_string(), Arc::clone(skill));
            request.skills.push(skill.id().to_string());
        }
        request.skills.sort();
        request.skills.dedup();
        skills = Some(Arc::new(Snapshot { skills: with_brought, errors: registry.errors.clone() }));
    }
    let args = LoopArgs {
        request,
        backend,
        skills,
        settings: state.loop_settings,
        exec: state.exec.clone(),
        artifacts: state.artifacts.clone(),
        conversations: Arc::clone(&state.conversations),
        events,
        agent_stats: Arc::clone(&state.agent_stats),
        skill_outcomes: Arc::clone(&state.skill_outcomes),
        seat: None,
        mcp: state.mcp.clone(),
    };
    let (actor, _) = Actor::spawn_linked(None, LoopActor, args, supervisor)
        .await
        .map_err(|err| ChatError::Engine(format!("cannot start the request: {err}")))?;
    Ok(actor)
}
