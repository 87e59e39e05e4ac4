//! `LoopActor`: runs one chat request as rounds of generate → tools.
//!
//! Each round renders the conversation for the loaded model, streams the
//! model's text to the client (tool-call markup never leaves the server),
//! and reads the calls at the end. Calls to the skill tools are answered in
//! process and the loop generates again; a call to one of the caller's own
//! tools ends the loop and goes back to the caller, unexecuted.

pub mod agents;
pub mod budget;
pub mod output;
mod reasoning;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use skillhost_engine::{
    at_idle_priority, ChatMessage, Conversation, EngineError, FinishReason, GenerateRequest, GenerationEvent,
    PreparedPrompt, Role, Timings, ToolCall, ToolChoice, ToolDef, LARGE_PROMPT_BYTES,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::artifacts::Artifacts;
use crate::model::ModelBackend;
use crate::request::{
    ChatError, ChatEvent, ChatFinish, ChatRequest, RoundStats, SkillStep, ToolPhase, ToolProgress, Usage,
};
use crate::sandbox::actor::{SandboxActor, SandboxMsg};
use crate::sandbox::ExecRuntime;
use crate::skills::outcomes::{Outcome, SkillEvent, SkillOutcomes, TurnSkills};
use crate::skills::prompt::{self, PromptOptions};
use crate::skills::Snapshot;
use crate::tools::agents::AgentOp;
use crate::tools::allowed::Allowed;
use crate::tools::skills::{self as skill_tools, ToolContext};
use crate::tools::{self, Answer, CodeCall, Tool, ToolError};
use crate::workspace::actor::{self as workspace_actor, ArtifactsFor, WorkspaceActor, WorkspaceMsg};
use crate::workspace::conversations::{Conversations, RECLAIM_IDLE_AFTER};
use crate::workspace::Workspace;
use agents::{AgentLimits, AgentStats, AgentTree, Agents, ChildSeat};
use budget::ContextParts;
use output::RoundOutput;

/// Rounds per turn unless the operator says otherwise.
pub const DEFAULT_MAX_ROUNDS: u32 = 8;
/// Rounds per turn with code execution: one fix is a write, a run, a read
/// of the traceback and a patch.
pub const DEFAULT_CODE_ROUNDS: u32 = 24;
/// The range `--skills-max-rounds` accepts.
pub const MIN_ROUNDS: u32 = 1;
pub const MAX_ROUNDS: u32 = 64;
/// Skill tool calls answered per round; a model emitting more is
/// malfunctioning, and answering them all would fill the context.
pub const MAX_SKILL_CALLS_PER_ROUND: usize = 8;
/// Who makes the calls in a request without sub-agents.
pub const ROOT_AGENT: &str = "/root";
/// How long a turn may run unless the operator says otherwise: long enough
/// for 24 rounds with a minute-long command in each, short enough that a
/// looping model does not hold a slot for good.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long the end of a request waits for its workspace to be deleted.
const WORKSPACE_STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Server-wide loop settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoopSettings {
    pub max_rounds: u32,
    /// Advertise unselected skills unless a request says otherwise.
    pub discovery: bool,
    pub inline_selected_bodies: bool,
    pub allow_exec: bool,
    /// Temperature for requests that left it unset (clients such as Codex
    /// cannot send one).
    pub temperature: Option<f32>,
    /// The turn's token budget when the request sets none.
    pub max_tokens: Option<u32>,
    /// Temperature for code turns whose request left it at the default.
    pub code_temperature: Option<f32>,
    /// How long one turn may run, all rounds and tools together; then it
    /// ends with what it has.
    pub turn_timeout: Duration,
    /// When the model may delegate to child agents (`--multi-agent`).
    pub multi_agent: MultiAgent,
    /// Children may write and run, not only read (`--agents-allow-write`).
    pub agents_allow_write: bool,
    pub agent_limits: AgentLimits,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings {
            max_rounds: DEFAULT_MAX_ROUNDS,
            discovery: true,
            inline_selected_bodies: false,
            allow_exec: false,
            temperature: None,
            max_tokens: None,
            code_temperature: None,
            turn_timeout: DEFAULT_TURN_TIMEOUT,
            multi_agent: MultiAgent::Auto,
            agents_allow_write: false,
            agent_limits: AgentLimits::default(),
        }
    }
}

/// When requests may delegate to child agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiAgent {
    /// On requests that offer the model other tools (the caller's, skills
    /// or code tools), or that ask for it (`"multi_agent": true`). A plain
    /// question is not made to carry five tool declarations it never uses.
    Auto,
    /// On every request of a model that can call tools.
    Always,
    Off,
}

pub struct LoopActor;

/// A task aborted when its handle is dropped: a killed loop must not leave
/// its relay (and so its engine sequence) or its tool calls running.
pub struct AbortOnDrop(JoinHandle<()>);

impl AbortOnDrop {
    pub fn new(task: JoinHandle<()>) -> AbortOnDrop {
        AbortOnDrop(task)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub struct LoopArgs {
    pub request: ChatRequest,
    pub backend: Arc<dyn ModelBackend>,
    /// The registry at the time the request arrived; `None` with skills off.
    pub skills: Option<Arc<Snapshot>>,
    pub settings: LoopSettings,
    /// Process execution, when the server offers it.
    pub exec: Option<Arc<ExecRuntime>>,
    /// Where produced files are kept, when commands may run.
    pub artifacts: Option<Artifacts>,
    /// The server's conversations, whose workspaces outlive one request.
    pub conversations: Arc<Conversations>,
    pub events: mpsc::UnboundedSender<ChatEvent>,
    /// The server's agent counters.
    pub agent_stats: Arc<AgentStats>,
    /// The server's per-skill counts.
    pub skill_outcomes: Arc<SkillOutcomes>,
    /// Set for a child agent, `None` for a request's own loop.
    pub seat: Option<ChildSeat>,
}

pub enum LoopMsg {
    /// Sent to itself on start and after each round of tool answers.
    Run,
    /// Forwarded from the engine's event channel by the round's relay task.
    Generated(GenerationEvent),
    /// Sent by the relay task when the engine's channel closed without a finish.
    EngineGone,
    /// Sent by the round's tool task: the answers to our calls, in order,
    /// the calls answered so far that a repeat may point back to, the
    /// skills they read or ran, and what the skills loaded so far allow.
    ToolsAnswered(Vec<String>, Vec<Answered>, Vec<String>, Allowed),
    /// Sent by the turn's timer when the turn's time budget is spent.
    TurnTimedOut,
    /// Sent by the round's tool task when a call could not be answered and
    /// the request cannot go on.
    ToolsFailed(ChatError),
    /// A coordination call from the round's tool task.
    Agents(AgentOp, RpcReplyPort<String>),
    /// An event of child `n` (1-based), from its relay task.
    ChildEvent(usize, ChatEvent),
    /// A follow-up from the parent (a child's `send_input`).
    Input(String),
    /// Ends the request with the last round's timings (a withheld answer
    /// that no report changed).
    Finish(Timings),
}

/// A call answered in an earlier round, which an identical later call
/// points back to instead of running again (until something is written).
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    name: String,
    arguments: serde_json::Map<String, serde_json::Value>,
    round: u32,
}

/// A request's workspace, as the loop holds it.
struct WorkspaceRef {
    actor: ActorRef<WorkspaceMsg>,
    /// The request's own (deleted when it ends), not a conversation's.
    own: bool,
}

/// Our calls of a round, being answered, and the caller's calls that
/// end the turn once they are.
struct PendingCalls {
    ours: Vec<ToolCall>,
    caller: Vec<ToolCall>,
    timings: Timings,
    /// How the request ends when the caller's calls go back: `Length` when
    /// the last of them was cut short by the token budget.
    finish: ChatFinish,
}

pub struct LoopState {
    request: ChatRequest,
    backend: Arc<dyn ModelBackend>,
    /// Where the HTTP handler reads this request's events.
    events: mpsc::UnboundedSender<ChatEvent>,
    /// Relays engine events into this actor's mailbox; aborting it (also by
    /// dropping it) drops the engine receiver, which cancels the sequence.
    relay: Option<AbortOnDrop>,
    /// The current round's output.
    output: RoundOutput,
    /// The request's messages with the skills block applied.
    base_messages: Vec<ChatMessage>,
    /// Assistant and tool turns the loop added.
    history: Vec<ChatMessage>,
    /// Every tool the model is offered: the caller's and ours.
    tools: Vec<ToolDef>,
    caller_tools: HashSet<String>,
    /// What the skill tools can reach; `None` when they are not offered.
    skill_tools: Option<ToolContext>,
    settings: LoopSettings,
    /// 1-based.
    round: u32,
    /// The extra round after the budget ran out: tools off, answer now.
    final_round: bool,
    /// Some content has reached the client already.
    content_sent: bool,
    usage: Usage,
    rounds: Vec<RoundStats>,
    n_prompt: usize,
    /// The conversation's key (its opening messages), so an upstream fleet
    /// sends every round to the upstream that caches its prefix.
    affinity: Option<u64>,
    exec: Option<Arc<ExecRuntime>>,
    /// The workspace actor the code tools work through: the request's own
    /// (a linked child, deleted when the loop stops, whatever ended it) or
    /// its conversation's.
    workspace: Option<WorkspaceRef>,
    /// Runs this request's commands; a linked child, so a stopped loop
    /// kills whatever is still running.
    sandbox: Option<ActorRef<SandboxMsg>>,
    artifacts: Option<Artifacts>,
    /// The code tools are declared.
    code_tools: bool,
    /// Artifacts of this request are stored under this id.
    run_id: String,
    /// The calls being answered, while the tool task runs.
    pending: Option<PendingCalls>,
    /// The task answering this round's calls; the mailbox stays free while
    /// it runs, and dropping it (the loop stopped) abandons it.
    tools_task: Option<AbortOnDrop>,
    /// Read-only calls answered since the last call that wrote anything.
    answered: Vec<Answered>,
    /// Ends the turn at its time budget; dropped with the loop.
    _timer: Option<AbortOnDrop>,
    /// `/root`, or a child's path such as `/root/1`.
    agent_id: String,
    /// Set for a child: what it was given, and its place among the open agents.
    seat: Option<ChildSeat>,
    /// Its children, when delegation is on.
    agents: Option<Agents>,
    /// A child's follow-ups that came while it worked.
    inputs: Vec<String>,
    /// A child that reported and waits for a follow-up.
    idle: bool,
    /// The turn ended with an answer (not an error): a child then stays.
    ended_ok: bool,
    /// The registry this request saw, which children see too.
    snapshot: Option<Arc<Snapshot>>,
    conversations: Arc<Conversations>,
    /// The server's per-skill counts.
    skill_outcomes: Arc<SkillOutcomes>,
    /// Skills this turn (or child task) read or ran: how it ends is counted
    /// for each.
    used_skills: TurnSkills,
    /// What the skills loaded this turn allow (`allowed-tools`).
    allowed: Allowed,
    /// A bound cut the turn short (its rounds or its time).
    cut: bool,
    /// Bytes of the skills block at the front of the first message.
    skills_block_bytes: usize,
    /// The current round's prompt by part, and what was let go to fit it.
    round_parts: ContextParts,
    round_demoted: Vec<String>,
}

impl LoopState {
    /// What a bound cut short, in the notes that say so: a request's turn,
    /// or a child agent's task.
    fn task_word(&self) -> &'static str {
        if self.seat.is_some() {
            "agent's task"
        } else {
            "turn"
        }
    }

    /// Sends an event to the HTTP handler. False when the client is gone.
    fn emit(&self, event: ChatEvent) -> bool {
        self.events.send(event).is_ok()
    }

    /// Sends the request's last event. The request's own workspace goes
    /// first, so a client that has its answer never finds the folder there.
    async fn end(&mut self, event: ChatEvent) {
        let outcome = match &event {
            ChatEvent::Failed(_) => Some(Outcome::Error),
            ChatEvent::Finished { finish: ChatFinish::ToolCalls, .. } => Some(Outcome::ToolCall),
            ChatEvent::Finished { finish: ChatFinish::Length, .. } => Some(Outcome::Budget),
            ChatEvent::Finished { .. } if self.cut => Some(Outcome::Budget),
            ChatEvent::Finished { .. } => Some(Outcome::Answer),
            _ => None,
        };
        if let Some(outcome) = outcome {
            self.used_skills.end(outcome);
        }
        if self.workspace.as_ref().is_some_and(|w| w.own) {
            if let Some(workspace) = self.workspace.take() {
                let _ = workspace.actor.stop_and_wait(None, Some(WORKSPACE_STOP_TIMEOUT)).await;
            }
        }
        self.emit(event);
    }

    /// Sends content, separating rounds with a blank line.
    fn emit_content(&mut self, text: String, round_started: &mut bool) -> bool {
        if text.is_empty() {
            return true;
        }
        // A round that began with a report unread is held until it ends.
        if let Some(agents) = self.agents.as_mut().filter(|a| a.holding) {
            agents.held.push_str(&text);
            return true;
        }
        let text = if !*round_started && self.content_sent { format!("\n\n{text}") } else { text };
        *round_started = true;
        self.content_sent = true;
        self.emit(ChatEvent::Content(text))
    }
}

fn chat_error(err: EngineError) -> ChatError {
    match err {
        EngineError::PromptTooLong { .. } | EngineError::EmptyPrompt | EngineError::InvalidGrammar(_) => {
            ChatError::BadRequest(err.to_string())
        }
        EngineError::Stopped | EngineError::Load { .. } | EngineError::Upstream(_) => {
            ChatError::Unavailable(err.to_string())
        }
        EngineError::UpstreamRefused(_) => ChatError::BadRequest(err.to_string()),
        EngineError::Decode(_) => ChatError::Engine(err.to_string()),
    }
}

/// Opens the request's workspace actor: its conversation's (made on the
/// conversation's first request) or one of its own, linked to the loop.
async fn open_workspace(
    myself: &ActorRef<LoopMsg>,
    exec: &ExecRuntime,
    conversations: &Conversations,
    conversation: Option<&str>,
) -> Result<WorkspaceRef, String> {
    if let Some(id) = conversation {
        if let Some(actor) = conversations.workspace(id) {
            return Ok(WorkspaceRef { actor, own: false });
        }
    }
    let base = exec.workspace_base.clone();
    let options = exec.workspaces.clone();
    if let (Some(budget), Some(bytes)) = (&options.budget, options.size_cap) {
        // Under pressure, conversations idle the longest give their folders
        // back first; when none is idle the new folder is refused.
        let idle_before = std::time::Instant::now().checked_sub(RECLAIM_IDLE_AFTER);
        while !budget.fits(bytes) {
            let Some(idle_before) = idle_before else { break };
            if !conversations.close_least_recent_idle(idle_before, conversation).await {
                break;
            }
        }
    }
    let workspace = tokio::task::spawn_blocking(move || Workspace::create(&base, &options))
        .await
        .map_err(|err| err.to_string())?
        .map_err(|err| err.to_string())?;
    match conversation {
        Some(id) => {
            // Not linked: the conversation's folder outlives this request.
            let (actor, _) = Actor::spawn(None, WorkspaceActor, workspace).await.map_err(|err| err.to_string())?;
            match conversations.attach(id, actor.clone()) {
                Some(kept) => {
                    if kept.get_id() != actor.get_id() {
                        actor.stop(None);
                    }
                    Ok(WorkspaceRef { actor: kept, own: false })
                }
                // The conversation was closed meanwhile (its client may
                // have left): this request keeps the folder to itself, and
                // it goes with the loop like any request's own.
                None => {
                    actor.get_cell().link(myself.get_cell());
                    Ok(WorkspaceRef { actor, own: true })
                }
            }
        }
        None => {
            let (actor, _) = Actor::spawn_linked(None, WorkspaceActor, workspace, myself.get_cell())
                .await
                .map_err(|err| err.to_string())?;
            Ok(WorkspaceRef { actor, own: true })
        }
    }
}

/// Builds what the loop needs from the request, the registry and the model.
async fn prepare_state(myself: &ActorRef<LoopMsg>, args: LoopArgs) -> LoopState {
    let LoopArgs {
        mut request,
        backend,
        skills,
        settings,
        exec,
        artifacts,
        conversations,
        events,
        agent_stats,
        skill_outcomes,
        seat,
    } = args;
    let capabilities = backend.info().format.capabilities().clone();
    // A child may use only the tools its parent gave it.
    let given = |name: &str| seat.as_ref().is_none_or(|seat| seat.tools.iter().any(|t| t == name));
    let caller_tools: HashSet<String> = request.tools.iter().map(|t| t.name.clone()).collect();
    let mut tools = request.tools.clone();
    let mut skill_tools = None;
    let mut base_messages = request.messages.clone();
    let mut extra_prompt = None;
    // Skills whose instructions the prompt carries from the start.
    let mut inlined = Vec::new();
    let mut skills_block_bytes = 0;
    // A workspace for the code tools, shared by all rounds of the request.
    // Skill scripts without code tools get a scratch folder per call instead.
    let mut workspace = None;
    if let Some(seat) = &seat {
        // A child works in its parent's folder, through the same actor.
        workspace = seat.workspace.clone().map(|actor| WorkspaceRef { actor, own: false });
    } else if let Some(e) = exec.as_ref().filter(|e| e.code_exec && capabilities.tools) {
        match open_workspace(myself, e, &conversations, request.conversation.as_deref()).await {
            Ok(opened) => workspace = Some(opened),
            Err(err) => {
                tracing::error!(error = %err, "cannot create a request workspace; code tools are off for it");
                // The model is told why, so the answer can say it.
                extra_prompt = Some(format!(
                    "Code execution is not available for this request: {err}. Answer without running code, and say so if the task needed it."
                ));
            }
        }
    }
    let mut sandbox = None;
    if let Some(e) = &exec {
        match Actor::spawn_linked(None, SandboxActor, Arc::clone(&e.settings), myself.get_cell()).await {
            Ok((actor, _)) => sandbox = Some(actor),
            Err(err) => {
                tracing::error!(error = %err, "cannot start the request's sandbox actor; commands are off for it")
            }
        }
    }
    let code_tools = workspace.is_some();
    // The operator's temperatures replace only one the request left unset;
    // an explicit client value wins.
    if let (Some(temperature), false) = (settings.temperature, request.temperature_set) {
        request.sampling.temperature = temperature;
    }
    request.max_tokens = request.max_tokens.or(settings.max_tokens);
    if let Some(e) = exec.as_ref().filter(|_| code_tools) {
        if let (Some(temperature), false) = (settings.code_temperature, request.temperature_set) {
            request.sampling.temperature = temperature;
        }
        for declaration in tools::code_declarations(&e.settings).into_iter().filter(|d| given(&d.name)) {
            if caller_tools.contains(&declaration.name) {
                tracing::warn!(tool = %declaration.name, "the caller declares a tool named like a code tool; the caller's wins");
                continue;
            }
            tools.push(declaration);
        }
        extra_prompt = Some(tools::CODE_PROMPT.to_string());
    }
    if let Some(snapshot) = skills.clone() {
        // A caller that brings a tool named like one of ours (its own
        // skills_read) must not be told to call ours, nor have its calls
        // answered by us: its request gets its selected skills inlined, no
        // catalog and none of our skill tools, as a family without tools does.
        let clash = skill_tools::NAMES.iter().find(|name| caller_tools.contains(**name));
        if let Some(name) = clash {
            tracing::warn!(tool = %name, "the caller declares a tool named like a skill tool; its selected skills are inlined, and no catalog or skill tools of ours are offered");
        }
        let options = PromptOptions {
            discovery: request.skills_discovery.unwrap_or(settings.discovery),
            inline_selected_bodies: settings.inline_selected_bodies,
            allow_exec: settings.allow_exec,
            context_tokens: Some(backend.info().n_ctx),
            tools: capabilities.tools && clash.is_none(),
        };
        let block = prompt::plan(&request.skills, &snapshot, &options);
        base_messages = prompt::apply(&request.messages, &block);
        skills_block_bytes = block.text.len();
        skill_outcomes.event(&block.advertised, request.surface, SkillEvent::Advertised);
        skill_outcomes.event(&block.inlined, request.surface, SkillEvent::Read);
        inlined.clone_from(&block.inlined);
        if options.tools && !block.reachable.is_empty() {
            tools.extend(
                skill_tools::declarations(settings.allow_exec, &block.reachable).into_iter().filter(|d| given(&d.name)),
            );
            skill_tools = Some(ToolContext {
                snapshot: Arc::clone(&snapshot),
                reachable: block.reachable,
                allow_exec: settings.allow_exec && exec.is_some(),
            });
        }
    }
    if let Some(text) = extra_prompt {
        let block = prompt::Block { text, ..prompt::Block::default() };
        base_messages = prompt::apply_after(&base_messages, &block);
    }
    let affinity = skillhost_engine::remote::affinity_key(&base_messages);
    // Delegation: on unless the server or the request turned it off, for a
    // model whose tool calls can be read back, and not where the answer
    // must be the caller's (see `agents::delegates`).
    // The five tools are one protocol: a caller that brings one of them (an
    // agent harness with sub-agents of its own) gets none of ours, so the
    // model never mixes its spawn with our wait.
    let clash = tools::agents::NAMES.iter().find(|name| caller_tools.contains(**name));
    if let Some(name) = clash {
        tracing::warn!(tool = ?name, "the caller declares a coordination tool of its own; ours are not offered");
    }
    let delegating =
        clash.is_none() && agents::delegates(settings.multi_agent, &request, !tools.is_empty(), capabilities.tools);
    let agents = delegating.then(|| match &seat {
        Some(seat) => Agents::new(Arc::clone(&seat.tree), seat.depth),
        None => Agents::new(AgentTree::new(settings.agent_limits, settings.agents_allow_write, agent_stats), 0),
    });
    if let Some(agents) = agents.as_ref().filter(|a| a.may_spawn()) {
        let share_tools = !agents::grantable(&tools, &caller_tools, agents.tree.allow_write).is_empty();
        let share_skills = skill_tools.as_ref().is_some_and(|c| !c.reachable.is_empty());
        tools.extend(tools::agents::declarations(share_skills, share_tools));
    }
    let agent_id = seat.as_ref().map_or_else(|| ROOT_AGENT.to_string(), |seat| seat.id.clone());
    let used_skills = TurnSkills::new(Arc::clone(&skill_outcomes), request.surface);
    let mut state = LoopState {
        request,
        backend,
        events,
        relay: None,
        output: RoundOutput::new(None, Vec::new(), false),
        base_messages,
        history: Vec::new(),
        tools,
        caller_tools,
        skill_tools,
        settings,
        round: 1,
        final_round: false,
        content_sent: false,
        usage: Usage::default(),
        rounds: Vec::new(),
        n_prompt: 0,
        affinity,
        exec,
        workspace,
        sandbox,
        artifacts,
        code_tools,
        run_id: crate::replica::stamp(format!("run-{}", output::new_call_id().trim_start_matches("call_"))),
        pending: None,
        tools_task: None,
        answered: Vec::new(),
        _timer: None,
        agent_id,
        seat,
        agents,
        inputs: Vec::new(),
        idle: false,
        ended_ok: false,
        snapshot: skills,
        conversations,
        skill_outcomes,
        used_skills,
        allowed: Allowed::default(),
        cut: false,
        skills_block_bytes,
        round_parts: ContextParts::default(),
        round_demoted: Vec::new(),
    };
    // A child starts under the skills its parent had loaded when it spawned it.
    state.allowed = state.seat.as_ref().map(|seat| seat.allowed.clone()).unwrap_or_default();
    // An inlined skill is loaded from the first round.
    for skill in inlined {
        state.allowed.load_from(state.snapshot.as_deref(), &skill);
        state.used_skills.insert(skill);
    }
    state
}

impl Actor for LoopActor {
    type Msg = LoopMsg;
    type State = LoopState;
    type Arguments = LoopArgs;

    async fn pre_start(&self, myself: ActorRef<LoopMsg>, args: LoopArgs) -> Result<LoopState, ActorProcessingErr> {
        myself.cast(LoopMsg::Run)?;
        let mut state = prepare_state(&myself, args).await;
        start_timer(&myself, &mut state);
        Ok(state)
    }

    async fn post_stop(&self, _myself: ActorRef<LoopMsg>, state: &mut LoopState) -> Result<(), ActorProcessingErr> {
        state.relay = None;
        state.tools_task = None;
        Ok(())
    }

    /// Overridden because ractor's default stops the loop when any child
    /// exits, and a scratch folder's actor ends with every `skills_run`
    /// call. A child that fails (a bug in a tool) fails only the call it
    /// was answering, which its caller already sees as a closed reply; a
    /// child agent that crashes or stops is a report, never this loop's end.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<LoopMsg>,
        event: SupervisionEvent,
        state: &mut LoopState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => match agents::child_of(state, &cell) {
                Some(child) => agents::fail(&myself, state, child, format!("The agent crashed: {err}.")),
                None => {
                    tracing::error!(actor = %cell.get_id(), error = %err, "a request's workspace or sandbox actor failed")
                }
            },
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(child) = agents::child_of(state, &cell) {
                    agents::fail(&myself, state, child, "The agent stopped before it reported.".into());
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<LoopMsg>,
        msg: LoopMsg,
        state: &mut LoopState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LoopMsg::Run => {
                if let Err(err) = start_round(&myself, state).await {
                    state.end(ChatEvent::Failed(err)).await;
                    myself.stop(None);
                }
            }
            LoopMsg::Generated(GenerationEvent::Text(text)) => {
                let split = state.output.push(&text);
                let mut alive = split.reasoning.is_empty() || state.emit(ChatEvent::Reasoning(split.reasoning));
                let mut started = state.output.content_started();
                alive &= state.emit_content(split.content, &mut started);
                state.output.set_content_started(started);
                if !alive {
                    myself.stop(Some("client disconnected".into()));
                }
            }
            LoopMsg::Generated(GenerationEvent::ToolCalls(calls)) => state.output.push_calls(calls),
            LoopMsg::Generated(GenerationEvent::Finished { reason, timings }) => {
                match finish_round(state, reason, timings).await {
                    Next::Tools => start_tools(&myself, state),
                    Next::Again => {
                        let _ = myself.cast(LoopMsg::Run);
                    }
                    Next::Collect => agents::collect_if_ready(&myself, state),
                    Next::Done => conclude(&myself, state),
                }
            }
            LoopMsg::Generated(GenerationEvent::Failed(err)) => {
                state.end(ChatEvent::Failed(chat_error(err))).await;
                myself.stop(None);
            }
            LoopMsg::EngineGone => {
                state.end(ChatEvent::Failed(chat_error(EngineError::Stopped))).await;
                myself.stop(None);
            }
            LoopMsg::ToolsAnswered(answers, answered, used, allowed) => {
                state.tools_task = None;
                state.answered = answered;
                state.allowed = allowed;
                used.into_iter().for_each(|skill| state.used_skills.insert(skill));
                if tools_answered(state, answers).await {
                    let _ = myself.cast(LoopMsg::Run);
                } else {
                    conclude(&myself, state);
                }
            }
            LoopMsg::ToolsFailed(err) => {
                state.tools_task = None;
                state.end(ChatEvent::Failed(err)).await;
                myself.stop(None);
            }
            LoopMsg::TurnTimedOut => {
                // Whatever runs stops here: the round's generation (its
                // relay) and any tool call (its task, and with it the wait
                // for a command the sandbox actor then kills when the loop
                // stops).
                state.relay = None;
                state.tools_task = None;
                state.pending = None;
                // Stopping the sandbox actor kills a running command at once
                // (in its post_stop), so the workspace actor's call returns
                // and its folder can go.
                if let Some(sandbox) = state.sandbox.take() {
                    let _ = sandbox.stop_and_wait(None, Some(WORKSPACE_STOP_TIMEOUT)).await;
                }
                let separator = if state.content_sent { "\n\n" } else { "" };
                let seconds = state.settings.turn_timeout.as_secs();
                let what = state.task_word();
                let note = format!(
                    "{separator}[This answer was cut short: the {what} used its whole time budget of {seconds} s.]"
                );
                if let Some(agents) = state.agents.as_mut() {
                    agents.holding = false;
                    agents.collecting = None;
                }
                let mut started = true;
                state.emit_content(note, &mut started);
                state.cut = true;
                finish(state, ChatFinish::Length, Timings::default()).await;
                conclude(&myself, state);
            }
            LoopMsg::Agents(op, reply) => agents::handle_op(&myself, state, op, reply).await,
            LoopMsg::ChildEvent(child, event) => agents::on_child_event(&myself, state, child, event),
            LoopMsg::Input(text) => {
                if state.idle {
                    // A follow-up to a child that reported: a new task in
                    // the same conversation, with fresh bounds.
                    state.idle = false;
                    state.ended_ok = false;
                    state.history.push(ChatMessage::new(Role::User, text));
                    state.round = 1;
                    state.final_round = false;
                    state.content_sent = false;
                    state.usage = Usage::default();
                    state.answered.clear();
                    state.allowed = state.seat.as_ref().map(|seat| seat.allowed.clone()).unwrap_or_default();
                    state.cut = false;
                    start_timer(&myself, state);
                    let _ = myself.cast(LoopMsg::Run);
                } else if state.inputs.len() < agents::MAX_QUEUED_INPUTS {
                    state.inputs.push(text);
                }
            }
            LoopMsg::Finish(timings) => {
                finish(state, ChatFinish::Stop, timings).await;
                conclude(&myself, state);
            }
        }
        Ok(())
    }
}

/// Ends the turn at its time budget from now.
fn start_timer(myself: &ActorRef<LoopMsg>, state: &mut LoopState) {
    let (timer, budget) = (myself.clone(), state.settings.turn_timeout);
    state._timer = Some(AbortOnDrop::new(tokio::spawn(async move {
        tokio::time::sleep(budget).await;
        let _ = timer.cast(LoopMsg::TurnTimedOut);
    })));
}

/// After the last event: a request's loop stops; a child that answered
/// stays, idle, with its conversation, for its parent's follow-ups.
fn conclude(myself: &ActorRef<LoopMsg>, state: &mut LoopState) {
    if state.seat.is_some() && state.ended_ok {
        state.idle = true;
        state._timer = None;
        state.relay = None;
    } else {
        myself.stop(None);
    }
}

/// The tool choice for the current round. A forced choice that only our
/// tools can satisfy applies to the first round; one aimed at the caller's
/// tools holds until the caller gets its call.
fn round_choice(state: &LoopState) -> ToolChoice {
    let first = state.round == 1;
    if state.final_round {
        return ToolChoice::None;
    }
    if state.tools.is_empty() {
        // Forcing a call when no tool exists is the caller's mistake: passed
        // on, the format refuses it and the client gets a 400 naming it.
        return match &state.request.tool_choice {
            choice @ (ToolChoice::Required | ToolChoice::Named(_)) if first => choice.clone(),
            _ => ToolChoice::None,
        };
    }
    match &state.request.tool_choice {
        ToolChoice::None if state.skill_tools.is_some() || state.agents.is_some() => ToolChoice::Auto,
        ToolChoice::None => ToolChoice::None,
        ToolChoice::Auto => ToolChoice::Auto,
        ToolChoice::Required if first || !state.caller_tools.is_empty() => ToolChoice::Required,
        ToolChoice::Required => ToolChoice::Auto,
        ToolChoice::Named(name) if state.caller_tools.contains(name) || first => ToolChoice::Named(name.clone()),
        ToolChoice::Named(_) => ToolChoice::Auto,
    }
}

/// Renders the prompt, submits it, and starts relaying engine events.
async fn start_round(myself: &ActorRef<LoopMsg>, state: &mut LoopState) -> Result<(), ChatError> {
    // A child's follow-ups that came while it worked are read now.
    for input in std::mem::take(&mut state.inputs) {
        state.history.push(ChatMessage::new(Role::User, input));
    }
    if let Some(agents) = state.agents.as_mut() {
        agents.holding = agents.unread();
        agents.held.clear();
    }
    let choice = round_choice(state);
    // With `tool_choice: none` from the caller, only our tools stay visible.
    let tools: Vec<ToolDef> = match (&state.request.tool_choice, &choice) {
        (_, ToolChoice::None) => Vec::new(),
        (ToolChoice::None, _) => {
            state.tools.iter().filter(|t| !state.caller_tools.contains(&t.name)).cloned().collect()
        }
        _ => state.tools.clone(),
    };
    // The context budget: past the high-water mark, the loop lets go of one
    // thing at a time (see `budget`) and renders again.
    let n_ctx = state.backend.info().n_ctx as usize;
    state.round_demoted.clear();
    let prepared = loop {
        let prepared = render(state, &choice, &tools).await?;
        let estimate = prepared.text.len().div_ceil(prompt::BYTES_PER_TOKEN);
        let count = if budget::worth_counting(estimate, n_ctx) {
            state.backend.count_tokens(prepared.text.clone()).await.unwrap_or(estimate)
        } else {
            estimate
        };
        if budget::fits(count, n_ctx) {
            break prepared;
        }
        match budget::demote_one(&mut state.base_messages, &mut state.history, state.snapshot.as_deref()) {
            Some(note) => {
                tracing::info!(agent = %state.agent_id, round = state.round, tokens = count, n_ctx, note = ?note, "context budget: let go of one part");
                state.round_demoted.push(note);
                // A result let go is no longer "above" for a repeated call.
                state.answered.clear();
            }
            // Nothing left to let go: the prompt goes as it is, and the
            // engine refuses it only when it does not fit at all.
            None => break prepared,
        }
    };
    state.round_parts = budget::account(&state.base_messages, &state.history, &tools, state.skills_block_bytes);
    let mut stops = state.request.stop.clone();
    stops.extend(prepared.stops);
    let generate = GenerateRequest {
        prompt: prepared.text,
        sampling: state.request.sampling.clone(),
        // The budget is the turn's, across every round, as OpenAI's API
        // counts it: each round gets what the earlier ones left.
        max_tokens: remaining_budget(state).map(|left| left.max(1)),
        stops,
        grammar: prepared.grammar,
        affinity: state.affinity,
        chat: prepared.chat,
    };
    let thinking = reasoning::prompt_opens_thinking(&generate.prompt);
    let submitted = match state.backend.submit(generate).await {
        Ok(submitted) => submitted,
        // The last tool results pushed the conversation past the context:
        // the model is told so, in their place, instead of the turn failing.
        Err(EngineError::PromptTooLong { n_prompt, n_ctx }) if shrink_last_results(state, n_prompt, n_ctx) => {
            return Box::pin(start_round(myself, state)).await;
        }
        // Counted by estimate, the prompt looked smaller than it is: the
        // budget lets go of more before the turn gives up.
        Err(EngineError::PromptTooLong { .. })
            if budget::demote_one(&mut state.base_messages, &mut state.history, state.snapshot.as_deref()).is_some() =>
        {
            state.answered.clear();
            return Box::pin(start_round(myself, state)).await;
        }
        Err(err @ EngineError::PromptTooLong { .. }) => {
            return Err(ChatError::BadRequest(format!(
                "{err}, with old tool results, idle skill instructions and earlier turns already left out; send a shorter message or start a new conversation"
            )))
        }
        Err(err) => return Err(chat_error(err)),
    };
    state.n_prompt = submitted.n_prompt;
    let offered = tools.iter().map(|t| t.name.clone()).collect();
    state.output = RoundOutput::new(prepared.tool_family, offered, thinking);
    if state.round == 1 && !state.emit(ChatEvent::Accepted) {
        myself.stop(Some("client disconnected".into()));
        return Ok(());
    }
    let mut events = submitted.events;
    let relay_to = myself.clone();
    state.relay = Some(AbortOnDrop(tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let last = matches!(event, GenerationEvent::Finished { .. } | GenerationEvent::Failed(_));
            if relay_to.cast(LoopMsg::Generated(event)).is_err() || last {
                return;
            }
        }
        let _ = relay_to.cast(LoopMsg::EngineGone);
    })));
    Ok(())
}

/// Renders the round's prompt for the model. Rendering megabytes of
/// conversation takes CPU the decoding streams need: a large one is
/// rendered on a blocking thread at idle priority.
async fn render(state: &LoopState, choice: &ToolChoice, tools: &[ToolDef]) -> Result<PreparedPrompt, ChatError> {
    let mut messages = state.base_messages.clone();
    messages.extend(state.history.iter().cloned());
    let info = Arc::clone(state.backend.info());
    let (tools, choice) = (tools.to_vec(), choice.clone());
    let parallel_tool_calls = state.request.parallel_tool_calls;
    let response_format = state.request.response_format.clone();
    let render = move || {
        let conversation = Conversation {
            messages: &messages,
            tools: &tools,
            tool_choice: &choice,
            parallel_tool_calls,
            response_format: &response_format,
        };
        info.format.prepare(&conversation)
    };
    let size: usize = state.base_messages.iter().chain(state.history.iter()).map(|m| m.content.len()).sum();
    let rendered = if size > LARGE_PROMPT_BYTES {
        tokio::task::spawn_blocking(move || at_idle_priority(render))
            .await
            .map_err(|_| ChatError::Engine("rendering the prompt failed".into()))?
    } else {
        render()
    };
    rendered.map_err(|err| ChatError::BadRequest(err.to_string()))
}

/// Replaces the tool results of the last round with a note saying they did
/// not fit; false when there is nothing left to shrink (the turn then fails
/// as any prompt past the context does).
fn shrink_last_results(state: &mut LoopState, n_prompt: usize, n_ctx: usize) -> bool {
    let results = state.history.iter().rev().take_while(|m| m.role == Role::Tool).count();
    let start = state.history.len() - results;
    let mut shrunk = false;
    for message in &mut state.history[start..] {
        if message.content.starts_with(TOO_LONG_NOTE) {
            continue;
        }
        message.content = format!(
            "{TOO_LONG_NOTE} The result was {} bytes; with it the conversation came to {n_prompt} tokens, and the context holds {n_ctx}. Answer with what you have, or ask for a smaller part.",
            message.content.len()
        );
        shrunk = true;
    }
    if shrunk {
        tracing::warn!(
            n_prompt,
            n_ctx,
            round = state.round,
            "tool results did not fit the context; replaced with a note"
        );
    }
    shrunk
}

/// How a tool result that did not fit the context begins.
pub(crate) const TOO_LONG_NOTE: &str = "[Result left out: too long for the context.]";

/// Generated tokens the turn may still spend; `None` without a budget.
fn remaining_budget(state: &LoopState) -> Option<u32> {
    let spent = u32::try_from(state.usage.completion_tokens).unwrap_or(u32::MAX);
    state.request.max_tokens.map(|budget| budget.saturating_sub(spent))
}

/// What follows a finished round.
enum Next {
    /// Answer our calls first (`state.pending` holds them).
    Tools,
    /// Generate again (a child read a follow-up).
    Again,
    /// A final answer was withheld: collect the agents' reports first.
    Collect,
    /// The request is over.
    Done,
}

/// Ends a round: reports it, and decides what comes next.
async fn finish_round(state: &mut LoopState, reason: FinishReason, timings: Timings) -> Next {
    let end = state.output.finish(reason == FinishReason::Length);
    for diagnostic in &end.diagnostics {
        // Debug formatting escapes newlines: model text cannot forge a log line.
        tracing::info!(?diagnostic, round = state.round, "the model's tool call was not read");
    }
    if !end.reasoning_delta.is_empty() {
        state.emit(ChatEvent::Reasoning(end.reasoning_delta));
    }
    let mut started = state.output.content_started();
    state.emit_content(end.content_delta, &mut started);
    if state.n_prompt == 0 {
        // An upstream tells the prompt's length only at the end.
        state.n_prompt = timings.cache_n + timings.prompt_n;
    }
    state.usage.prompt_tokens += state.n_prompt;
    state.usage.completion_tokens += timings.predicted_n;
    state.rounds.push(RoundStats {
        agent_id: state.agent_id.clone(),
        prompt_tokens: state.n_prompt,
        cached_tokens: timings.cache_n,
        copied_tokens: timings.copied_n,
        generated_tokens: timings.predicted_n,
        time_to_first_token_ms: timings.prompt_ms,
        context: state.round_parts.scaled_to(state.n_prompt),
        demoted: std::mem::take(&mut state.round_demoted),
    });
    let parts = state.round_parts.scaled_to(state.n_prompt);
    tracing::info!(
        agent = %state.agent_id,
        round = state.round,
        prompt = state.n_prompt,
        cached = timings.cache_n,
        system = parts.system,
        skills = parts.skills,
        tools = parts.tools,
        skill_bodies = parts.skill_bodies,
        tool_results = parts.tool_results,
        history = parts.history,
        "round finished"
    );

    if state.final_round {
        flush_held(state);
        let separator = if state.content_sent { "\n\n" } else { "" };
        let rounds = state.settings.max_rounds;
        let what = state.task_word();
        let note = format!("{separator}[This answer was cut short: the {what} used all {rounds} tool rounds.]");
        // The separator is explicit: the note belongs after this round's text.
        started = true;
        state.emit_content(note, &mut started);
        state.cut = true;
        finish(state, ChatFinish::Stop, timings).await;
        return Next::Done;
    }

    let answers_ours = state.skill_tools.is_some() || state.code_tools || state.agents.is_some();
    // A caller's tool that a loaded skill's allowed-tools leaves out is
    // refused here, like one of ours, instead of going back to the caller.
    let for_caller = |call: &ToolCall| {
        !answers_ours
            || (state.caller_tools.contains(&call.name) && state.allowed.refusal(&call.name, &call.arguments).is_none())
    };
    let (mut caller, ours): (Vec<ToolCall>, Vec<ToolCall>) = end.calls.into_iter().partition(for_caller);
    // A call to the caller's tool cut short by the budget goes back as it
    // is, arguments so far, with a finish that says it was cut (as OpenAI
    // returns it; LangChain shows it as an invalid call). One to our own
    // tools cannot run, and the turn has no budget left to redo it.
    let mut finish_calls = ChatFinish::ToolCalls;
    if let Some(cut) = end.cut {
        if for_caller(&cut) {
            caller.push(cut);
            finish_calls = ChatFinish::Length;
        } else {
            tracing::info!(tool = %cut.name, round = state.round, "the budget ran out inside a call to our tool");
        }
    }
    if ours.is_empty() && caller.is_empty() {
        if !state.inputs.is_empty() {
            // A child's follow-up came while it answered: it answers that too.
            push_answer_turn(state, Vec::new());
            next_round(state);
            return Next::Again;
        }
        if reason == FinishReason::Stop {
            if let Some(agents) = state.agents.as_mut().filter(|a| a.holding) {
                // An answer written before the reports were read is
                // withheld: they are collected and the model answers again.
                agents.collecting = Some(timings);
                push_answer_turn(state, Vec::new());
                return Next::Collect;
            }
        }
        flush_held(state);
        let finish_reason = match reason {
            FinishReason::Stop => ChatFinish::Stop,
            FinishReason::Length => ChatFinish::Length,
        };
        finish(state, finish_reason, timings).await;
        return Next::Done;
    }
    flush_held(state);
    state.pending = Some(PendingCalls { ours, caller, timings, finish: finish_calls });
    Next::Tools
}

/// Sends the content a held round kept back.
fn flush_held(state: &mut LoopState) {
    let Some(agents) = state.agents.as_mut().filter(|a| a.holding) else { return };
    agents.holding = false;
    let held = std::mem::take(&mut agents.held);
    let mut started = false;
    state.emit_content(held, &mut started);
}

/// Adds the round's assistant turn to the history. The content is what an
/// upstream in chat mode is sent back; the raw text, calls' markup
/// included, is what a prompt rendered here repeats.
fn push_answer_turn(state: &mut LoopState, calls: Vec<ToolCall>) {
    let mut turn = ChatMessage::new(Role::Assistant, state.output.content().to_string());
    turn.raw = Some(state.output.raw().to_string());
    turn.tool_calls = calls;
    state.history.push(turn);
}

/// Moves to the next round; past the last one, the model is told to answer.
fn next_round(state: &mut LoopState) {
    if state.round >= state.settings.max_rounds {
        state.history.push(ChatMessage::new(
            Role::User,
            format!(
                "You have used all {} tool rounds for this turn. Answer now using what you have already read, and say which part you could not check.",
                state.settings.max_rounds
            ),
        ));
        state.final_round = true;
    }
    state.round += 1;
}

/// Sends the request's final event.
async fn finish(state: &mut LoopState, finish: ChatFinish, timings: Timings) {
    let rounds = std::mem::take(&mut state.rounds);
    let usage = state.usage;
    state.ended_ok = true;
    state.end(ChatEvent::Finished { finish, usage, timings, rounds }).await;
}

/// Starts answering the pending calls in a task of their own, so the
/// mailbox stays open (a command can run for minutes).
fn start_tools(myself: &ActorRef<LoopMsg>, state: &mut LoopState) {
    let Some(pending) = &state.pending else { return };
    let runner = ToolRunner {
        events: state.events.clone(),
        offered: state.tools.iter().map(|t| t.name.clone()).collect(),
        code_tools: state.code_tools,
        skill_tools: state.skill_tools.clone(),
        workspace: state.workspace.as_ref().map(|w| w.actor.clone()),
        sandbox: state.sandbox.clone(),
        artifacts: state.artifacts.clone().map(|store| ArtifactsFor { store, run_id: state.run_id.clone() }),
        exec: state.exec.clone(),
        parent: myself.get_cell(),
        round: state.round,
        run_id: state.run_id.clone(),
        me: myself.clone(),
        agent_id: state.agent_id.clone(),
        given: state.seat.as_ref().map(|seat| seat.tools.clone()),
        allow_write: state.agents.as_ref().is_some_and(|a| a.tree.allow_write),
        agents_on: state.agents.is_some(),
        outcomes: Arc::clone(&state.skill_outcomes),
        surface: state.request.surface,
    };
    let calls = pending.ours.clone();
    let mut answered = state.answered.clone();
    let mut allowed = state.allowed.clone();
    let reply_to = myself.clone();
    state.tools_task = Some(AbortOnDrop::new(tokio::spawn(async move {
        let message = match runner.answer_all(&calls, &mut answered, &mut allowed).await {
            Ok((answers, used)) => LoopMsg::ToolsAnswered(answers, answered, used, allowed),
            Err(err) => LoopMsg::ToolsFailed(err),
        };
        let _ = reply_to.cast(message);
    })));
}

/// Takes the answers to a round's calls into the history. Returns true when
/// another round should run.
async fn tools_answered(state: &mut LoopState, answers: Vec<String>) -> bool {
    let Some(PendingCalls { ours, caller, timings, finish: finish_calls }) = state.pending.take() else { return false };
    if !caller.is_empty() {
        // The caller's tools run on the caller's side: the loop ends here.
        if state.seat.is_none() {
            let raw = state.output.raw().to_string();
            state.emit(ChatEvent::ServerTurns { turns: state.history.clone(), raw });
        }
        state.emit(ChatEvent::ToolCalls(caller));
        finish(state, finish_calls, timings).await;
        return false;
    }
    push_answer_turn(state, ours.clone());
    for (call, text) in ours.iter().zip(answers) {
        let mut result = ChatMessage::new(Role::Tool, text);
        result.tool_call_id = Some(call.id.clone());
        result.name = Some(call.name.clone());
        state.history.push(result);
    }
    // The turn's token budget is spent: the calls the model made were
    // answered (their effects, a written file, happen as asked), but no
    // round follows to read the answers.
    if remaining_budget(state) == Some(0) {
        finish(state, ChatFinish::Length, timings).await;
        return false;
    }
    next_round(state);
    true
}

/// Everything answering one round's calls needs, owned, for its task.
struct ToolRunner {
    events: mpsc::UnboundedSender<ChatEvent>,
    /// Names of every tool offered this request.
    offered: Vec<String>,
    code_tools: bool,
    skill_tools: Option<ToolContext>,
    workspace: Option<ActorRef<WorkspaceMsg>>,
    sandbox: Option<ActorRef<SandboxMsg>>,
    artifacts: Option<ArtifactsFor>,
    exec: Option<Arc<ExecRuntime>>,
    /// The loop, which scratch folders are linked to.
    parent: ActorCell,
    round: u32,
    run_id: String,
    /// The loop, which answers the coordination calls.
    me: ActorRef<LoopMsg>,
    agent_id: String,
    /// For a child agent: the tools its parent gave it.
    given: Option<Vec<String>>,
    /// Children may write and run (`--agents-allow-write`).
    allow_write: bool,
    /// The coordination tools are answered (delegation is on).
    agents_on: bool,
    /// The server's per-skill counts, and the surface they are counted under.
    outcomes: Arc<SkillOutcomes>,
    surface: crate::request::Surface,
}

impl ToolRunner {
    fn emit(&self, event: ChatEvent) {
        let _ = self.events.send(event);
    }

    fn progress(&self, phase: ToolPhase, tool: &str, detail: &str, files: Vec<crate::artifacts::Artifact>) {
        let detail: String = detail.chars().take(120).collect();
        self.emit(ChatEvent::ToolProgress(ToolProgress {
            agent_id: self.agent_id.clone(),
            phase,
            tool: tool.to_string(),
            detail,
            run_id: self.run_id.clone(),
            files,
            round: self.round,
        }));
    }

    /// Answers our calls in order, at most [`MAX_SKILL_CALLS_PER_ROUND`],
    /// and reports each one. A call repeated word for word is answered once.
    /// A call outside what a loaded skill allows is refused (`allowed`
    /// takes in a skill loaded by an earlier call of the round). Returns
    /// the answers and the skills the calls read or ran.
    async fn answer_all(
        &self,
        calls: &[ToolCall],
        answered: &mut Vec<Answered>,
        allowed: &mut Allowed,
    ) -> Result<(Vec<String>, Vec<String>), ChatError> {
        let mut texts = Vec::with_capacity(calls.len());
        let mut uses = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let arguments = tools::args::arguments(call);
            let earlier_round = answered
                .iter()
                .find(|a| a.name == call.name && a.arguments == arguments && a.round < self.round)
                .map(|a| a.round);
            // Small models often repeat a call word for word in one turn.
            // Running it again would repeat a side effect, and repeating a
            // file read can overflow the context on its own.
            let repeat_of = calls[..index].iter().position(|earlier| {
                earlier.name == call.name && output::same_arguments(&earlier.arguments, &call.arguments)
            });
            let tool = Tool::from_name(&call.name);
            let answer = if index >= MAX_SKILL_CALLS_PER_ROUND {
                Answer::failed(format!(
                    "Not run: only {MAX_SKILL_CALLS_PER_ROUND} tool calls are answered per round. Ask again in your next turn if you still need it."
                ))
            } else if let Some(earlier) = repeat_of {
                Answer::done(format!(
                    "Not run again: this call is identical to call {} of this turn; its result above applies.",
                    earlier + 1
                ))
            } else if let Some(refusal) = allowed.refusal(&call.name, &call.arguments) {
                Answer::failed(refusal)
            } else if let Some(round) = earlier_round {
                Answer::done(format!(
                    "Not run again: this call is identical to one already answered in round {round}, and nothing has changed since; its result above applies. Answer with what you have, or make a different call."
                ))
            } else {
                match self.answer(tool, call).await {
                    Ok(answer) => answer,
                    Err(ToolError::Model(text)) => Answer::failed(text),
                    Err(ToolError::Fatal(message)) => return Err(ChatError::Engine(message)),
                }
            };
            // A call that may have changed something (a write, a command)
            // makes every earlier answer stale; a read is remembered.
            if tool.is_none_or(|tool| tool.writes() || tool.is_agent()) {
                answered.clear();
            } else if index < MAX_SKILL_CALLS_PER_ROUND && repeat_of.is_none() && earlier_round.is_none() {
                answered.push(Answered { name: call.name.clone(), arguments, round: self.round });
            }
            tracing::info!(tool = ?call.name, skill = ?answer.skill, detail = ?answer.detail, ok = answer.ok, round = self.round, "tool answered");
            if let (Some(skill), Some(Tool::SkillsRead | Tool::SkillsRun)) = (answer.skill.clone(), tool) {
                let loaded =
                    tool == Some(Tool::SkillsRead) && answer.ok && answer.detail.as_deref() == Some("SKILL.md");
                let ran = tool == Some(Tool::SkillsRun) && answer.detail.is_some();
                if loaded || ran {
                    let event = if loaded { SkillEvent::Read } else { SkillEvent::Run };
                    self.outcomes.event([&skill], self.surface, event);
                    if loaded {
                        allowed.load_from(self.skill_tools.as_ref().map(|c| c.snapshot.as_ref()), &skill);
                    }
                    uses.push(skill);
                }
            }
            let is_skill_tool = matches!(tool, Some(Tool::SkillsList | Tool::SkillsRead | Tool::SkillsRun));
            if is_skill_tool && repeat_of.is_none() && index < MAX_SKILL_CALLS_PER_ROUND {
                self.emit(ChatEvent::SkillStep(SkillStep {
                    agent_id: self.agent_id.clone(),
                    tool: call.name.clone(),
                    skill: answer.skill.clone(),
                    detail: answer.detail.clone(),
                    ok: answer.ok,
                    round: self.round,
                }));
            }
            texts.push(answer.text);
        }
        Ok((texts, uses))
    }

    /// Answers one call to a tool of ours.
    async fn answer(&self, tool: Option<Tool>, call: &ToolCall) -> Result<Answer, ToolError> {
        let no_such_tool = || {
            ToolError::Model(format!(
                "There is no tool called '{}'. The tools you have are: {}.",
                call.name,
                self.offered.join(", ")
            ))
        };
        let Some(tool) = tool else { return Err(no_such_tool()) };
        if let Some(given) = self.given.as_ref().filter(|_| !tool.is_agent()) {
            if !given.iter().any(|name| name == tool.name()) {
                return Err(ToolError::Model(if tool.read_only() || self.allow_write {
                    format!("{} was not given to you. The tools you have are: {}.", call.name, self.offered.join(", "))
                } else {
                    format!(
                        "{} is not open to you: an agent started by another agent only reads here (skills_list, skills_read, read_file). Say in your report what should change, and the agent that started you can do it.",
                        call.name
                    )
                }));
            }
        }
        match tool {
            Tool::SpawnAgent | Tool::SendInput | Tool::WaitAgent | Tool::CloseAgent | Tool::ListAgents => {
                if !self.agents_on {
                    return Err(no_such_tool());
                }
                agents::call_tool(&self.me, tool, &self.agent_id, call).await
            }
            Tool::ReadFile | Tool::WriteFile | Tool::ApplyPatch | Tool::EditFile | Tool::Shell => {
                let Some(workspace) = self.workspace.as_ref().filter(|_| self.code_tools) else {
                    return Err(no_such_tool());
                };
                let args = tools::args::arguments(call);
                let detail = match tool {
                    Tool::Shell => tools::args::text(&args, &["command", "cmd"]).unwrap_or_default(),
                    _ => tools::args::path(&args).unwrap_or_default(),
                };
                match tool {
                    Tool::ReadFile => {}
                    Tool::Shell => self.progress(ToolPhase::Running, &call.name, &detail, Vec::new()),
                    _ => self.progress(ToolPhase::Writing, &call.name, &detail, Vec::new()),
                }
                let result = workspace_actor::call(
                    workspace,
                    CodeCall::Tool { tool, args },
                    self.sandbox.clone(),
                    self.artifacts.clone(),
                )
                .await;
                if tool != Tool::ReadFile {
                    let produced = result.as_ref().map(|a| a.produced.clone()).unwrap_or_default();
                    self.progress(ToolPhase::Finished, &call.name, "", produced);
                }
                result
            }
            Tool::SkillsRun => self.run_script(call).await,
            Tool::SkillsList | Tool::SkillsRead => {
                let Some(context) = self.skill_tools.clone() else { return Err(no_such_tool()) };
                let call = call.clone();
                tokio::task::spawn_blocking(move || skill_tools::answer(&context, tool, &call))
                    .await
                    .map_err(|_| ToolError::Model("The tool failed unexpectedly.".into()))
            }
        }
    }

    /// `skills_run`: in the request's workspace with the code tools on, so
    /// the model can use what the script writes; otherwise in a scratch
    /// folder of its own, deleted when the call ends.
    async fn run_script(&self, call: &ToolCall) -> Result<Answer, ToolError> {
        let Some(context) = self.skill_tools.clone() else {
            return Err(ToolError::Model(format!(
                "There is no tool called '{}'. The tools you have are: {}.",
                call.name,
                self.offered.join(", ")
            )));
        };
        let script = match tools::skills_run::prepare(&context, call) {
            Ok(script) => script,
            Err(refusal) => return Ok(*refusal),
        };
        let Some(exec) = &self.exec else {
            return Err(ToolError::Model("Scripts cannot run on this server.".into()));
        };
        let (workspace, scratch) = match &self.workspace {
            Some(workspace) => (workspace.clone(), false),
            None => {
                let base = exec.workspace_base.clone();
                let options = exec.workspaces.clone();
                let created = tokio::task::spawn_blocking(move || Workspace::create(&base, &options)).await;
                let Ok(Ok(folder)) = created else {
                    tracing::error!("cannot create a scratch folder for a skill script");
                    return Err(ToolError::Model(
                        "The script did not run: the server cannot create a working folder for it.".into(),
                    ));
                };
                let spawned = Actor::spawn_linked(None, WorkspaceActor, folder, self.parent.clone()).await;
                let Ok((actor, _)) = spawned else {
                    return Err(ToolError::Model("The script did not run: its working folder did not open.".into()));
                };
                (actor, true)
            }
        };
        self.progress(ToolPhase::Running, &call.name, &script.path, Vec::new());
        let skill = script.skill.id().to_string();
        let path = script.path.clone();
        let result =
            workspace_actor::call(&workspace, CodeCall::Script(script), self.sandbox.clone(), self.artifacts.clone())
                .await;
        if scratch {
            let _ = workspace.stop_and_wait(None, Some(WORKSPACE_STOP_TIMEOUT)).await;
        }
        let produced = result.as_ref().map(|a| a.produced.clone()).unwrap_or_default();
        self.progress(ToolPhase::Finished, &call.name, &path, produced);
        result.map(|answer| Answer { skill: Some(skill), detail: Some(path), ..answer }).map_err(|err| match err {
            // A scratch folder belongs to this call alone; losing it is the
            // call's failure, not the request's.
            ToolError::Fatal(message) if scratch => ToolError::Model(format!("The script did not run: {message}.")),
            other => other,
        })
    }
}
