//! The supervisor: owns the model actor, restarts it when the engine dies,
//! and spawns one linked `LoopActor` per chat request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use skillhost_engine::{EngineStats, ModelInfo};
use tokio::sync::{mpsc, watch};

use crate::artifacts::{ArtifactStore, ArtifactStoreActor, Artifacts};
use crate::chat_loop::agents::AgentStats;
use crate::chat_loop::{LoopActor, LoopArgs, LoopMsg, LoopSettings};
use crate::conversations::Conversations;
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

/// Whether a model is ready to serve; published for `/health` and `/metrics`.
#[derive(Debug, Clone)]
pub enum ModelStatus {
    Loading,
    Ready { info: Arc<ModelInfo>, stats: Arc<EngineStats> },
    Failed(String),
}

pub struct Supervisor;

pub struct SupervisorArgs {
    pub engine: ModelSource,
    /// How every request's loop runs.
    pub loop_settings: LoopSettings,
    /// Process execution, when offered.
    pub exec: Option<Arc<ExecRuntime>>,
    /// The store of produced files, when commands may run; the supervisor
    /// starts its actor.
    pub artifacts: Option<ArtifactStore>,
    pub conversations: Arc<Conversations>,
    pub status: watch::Sender<ModelStatus>,
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
    /// Sent to itself at start and after the engine died: (re)load the model.
    LoadModel,
    /// Sent by the loading task when the model actor is up (or could not
    /// start): loading runs outside this mailbox, which stays free for
    /// chats (refused while loading), skills routes and token counts.
    ModelLoaded(Result<(ActorRef<ModelMsg>, Arc<dyn ModelBackend>), String>),
    /// Sent by the HTTP layer for each chat request: spawn its loop actor,
    /// which reports on `events`.
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
    /// Sent by the HTTP layer to count a prompt's tokens: the loaded model.
    Backend(RpcReplyPort<Option<Arc<dyn ModelBackend>>>),
    /// Sent by tests to make the engine thread panic.
    #[cfg(feature = "fault-injection")]
    InjectEnginePanic,
}

pub struct SupervisorState {
    engine: ModelSource,
    loop_settings: LoopSettings,
    exec: Option<Arc<ExecRuntime>>,
    /// The artifact store's actor, a linked child.
    artifacts: Option<Artifacts>,
    conversations: Arc<Conversations>,
    /// Published model status.
    status: watch::Sender<ModelStatus>,
    /// The running model actor, when a model is loaded.
    model: Option<ActorRef<ModelMsg>>,
    /// A loading task is running.
    loading: bool,
    /// When recent restarts happened, to cap restart loops.
    restarts: Vec<Instant>,
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
    /// server answers), then asks itself to load the model.
    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            engine: args.engine,
            loop_settings: args.loop_settings,
            exec: args.exec,
            artifacts: None,
            conversations: args.conversations,
            status: args.status,
            model: None,
            loading: false,
            restarts: Vec::new(),
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
        myself.cast(SupervisorMsg::LoadModel)?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::LoadModel => load_model(&myself, state),
            SupervisorMsg::ModelLoaded(result) => model_loaded(&myself, state, result),
            SupervisorMsg::StartChat { request, events, reply } => {
                let result = start_chat(myself.get_cell(), state, *request, events).await;
                let _ = reply.send(result);
            }
            SupervisorMsg::SkillsActor(reply) => {
                let _ = reply.send(state.skills_actor.clone());
            }
            SupervisorMsg::Artifacts(reply) => {
                let _ = reply.send(state.artifacts.clone());
            }
            SupervisorMsg::Backend(reply) => {
                let backend = match &state.model {
                    Some(model) => ractor::call_t!(model, ModelMsg::GetEngine, MODEL_CALL_TIMEOUT_MS).ok(),
                    None => None,
                };
                let _ = reply.send(backend);
            }
            #[cfg(feature = "fault-injection")]
            SupervisorMsg::InjectEnginePanic => {
                if let Some(model) = &state.model {
                    let _ = model.cast(ModelMsg::InjectPanic);
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
        let is_model = |cell: &ActorCell| state.model.as_ref().is_some_and(|m| m.get_id() == cell.get_id());
        let is_skills = |cell: &ActorCell| state.skills_actor.as_ref().is_some_and(|m| m.get_id() == cell.get_id());
        match event {
            SupervisionEvent::ActorFailed(cell, err) if is_skills(&cell) => {
                tracing::error!(error = %err, "the skills registry failed; restarting it");
                state.skills_actor = None;
                if let Err(err) = start_skills(myself.get_cell(), state).await {
                    tracing::error!(error = %err, "the skills registry could not be restarted");
                }
            }
            SupervisionEvent::ActorFailed(cell, err) if is_model(&cell) => {
                tracing::error!(error = %err, "the model engine died; restarting it");
                engine_lost(&myself, state);
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) if is_model(&cell) => {
                tracing::error!(?reason, "the model actor stopped; restarting it");
                engine_lost(&myself, state);
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                // One request's failure is reported to its client by the
                // closed event channel; the server goes on.
                tracing::error!(actor = %cell.get_id(), error = %err, "a chat request failed");
            }
            SupervisionEvent::ActorTerminated(..)
            | SupervisionEvent::ActorStarted(_)
            | SupervisionEvent::ProcessGroupChanged(_) => {}
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

fn engine_lost(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    state.model = None;
    let now = Instant::now();
    state.restarts.retain(|at| now.duration_since(*at) < RESTART_WINDOW);
    if state.restarts.len() >= MAX_RESTARTS {
        let message = format!(
            "the model engine died {MAX_RESTARTS} times within {}s; not restarting it",
            RESTART_WINDOW.as_secs()
        );
        tracing::error!("{message}");
        let _ = state.status.send(ModelStatus::Failed(message));
        return;
    }
    state.restarts.push(now);
    let _ = state.status.send(ModelStatus::Loading);
    let _ = myself.cast(SupervisorMsg::LoadModel);
}

/// Starts loading the model in a task of its own (a GGUF takes seconds to
/// minutes, and upstreams may take minutes to answer); the task reports
/// with [`SupervisorMsg::ModelLoaded`].
fn load_model(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    if state.loading {
        return;
    }
    state.loading = true;
    let _ = state.status.send(ModelStatus::Loading);
    let path = state.engine.describe();
    tracing::info!(model = %path, "loading the model");
    let source = state.engine.clone();
    let myself = myself.clone();
    tokio::spawn(async move {
        let result = match Actor::spawn_linked(None, ModelActor, source, myself.get_cell()).await {
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
        let _ = myself.cast(SupervisorMsg::ModelLoaded(result));
    });
}

fn model_loaded(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    result: Result<(ActorRef<ModelMsg>, Arc<dyn ModelBackend>), String>,
) {
    state.loading = false;
    match result {
        // It died between answering and this message: its failure reached
        // the supervisor before it was known as the model, so restart here.
        Ok((model, _)) if model.get_status() != ractor::ActorStatus::Running => {
            tracing::error!("the model engine died as it started; restarting it");
            engine_lost(myself, state);
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
            let _ = state.status.send(ModelStatus::Ready { info, stats: Arc::clone(backend.stats()) });
            state.model = Some(model);
        }
        Err(message) => {
            let _ = state.status.send(ModelStatus::Failed(message));
        }
    }
}

async fn start_chat(
    supervisor: ActorCell,
    state: &mut SupervisorState,
    request: ChatRequest,
    events: mpsc::UnboundedSender<ChatEvent>,
) -> Result<ActorRef<LoopMsg>, ChatError> {
    let unavailable = |status: &ModelStatus| match status {
        ModelStatus::Failed(reason) => ChatError::Unavailable(format!("the model is not available: {reason}")),
        ModelStatus::Loading | ModelStatus::Ready { .. } => {
            ChatError::Unavailable("the model is loading; try again shortly".into())
        }
    };
    let Some(model) = &state.model else {
        return Err(unavailable(&state.status.borrow()));
    };
    let backend = ractor::call_t!(model, ModelMsg::GetEngine, MODEL_CALL_TIMEOUT_MS)
        .map_err(|_| unavailable(&state.status.borrow()))?;
    let skills = state.skills.as_ref().map(|(_, snapshot)| snapshot.borrow().clone());
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
