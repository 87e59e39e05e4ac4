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
mod round;
mod setup;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use skillhost_engine::{ChatMessage, EngineError, GenerationEvent, Role, Timings, ToolCall, ToolDef};
use tokio::sync::mpsc;

use crate::artifacts::Artifacts;
use crate::conversations::Conversations;
use crate::model::ModelBackend;
use crate::request::{ChatError, ChatEvent, ChatFinish, ChatRequest, ContextParts, RoundStats, Usage};
use crate::sandbox::actor::SandboxMsg;
use crate::sandbox::ExecRuntime;
use crate::skills::outcomes::{Outcome, SkillOutcomes, TurnSkills};
use crate::skills::Snapshot;
use crate::task::AbortOnDrop;
use crate::tools::agents::AgentOp;
use crate::tools::allowed::Allowed;
use crate::tools::router::Answered;
use crate::tools::skills::ToolContext;
use crate::tools::workspace_actor::{self as workspace_actor, WorkspaceMsg};
use agents::{AgentLimits, AgentStats, Agents, ChildSeat};
use output::RoundOutput;
use round::{chat_error, finish, finish_round, start_round, start_tools, tools_answered, Next};

/// Rounds per turn unless the operator says otherwise.
pub const DEFAULT_MAX_ROUNDS: u32 = 8;
/// Rounds per turn with code execution: one fix is a write, a run, a read
/// of the traceback and a patch.
pub const DEFAULT_CODE_ROUNDS: u32 = 24;
/// The range `--skills-max-rounds` accepts.
pub const MIN_ROUNDS: u32 = 1;
pub const MAX_ROUNDS: u32 = 64;
/// How long a turn may run unless the operator says otherwise: long enough
/// for 24 rounds with a minute-long command in each, short enough that a
/// looping model does not hold a slot for good.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(30 * 60);

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
    settings: LoopSettings,
    /// `/root`, or a child's path such as `/root/1`.
    agent_id: String,
    /// Set for a child: what it was given, and its place among the open agents.
    seat: Option<ChildSeat>,
    /// Its children, when delegation is on.
    agents: Option<Agents>,
    /// What the model is shown.
    prompt: Prompt,
    /// Where the turn stands.
    progress: Progress,
    /// What answers our tool calls.
    bench: Workbench,
    /// What runs on the loop's behalf.
    tasks: Tasks,
    /// The registry this request saw, and how its skills fared.
    skills: SkillUse,
}

/// The conversation as the model sees it, and what it offers.
struct Prompt {
    /// The request's messages with the skills block applied.
    base_messages: Vec<ChatMessage>,
    /// Assistant and tool turns the loop added.
    history: Vec<ChatMessage>,
    /// Every tool the model is offered: the caller's and ours.
    tools: Vec<ToolDef>,
    caller_tools: HashSet<String>,
    /// The conversation's key (its opening messages), so an upstream fleet
    /// sends every round to the upstream that caches its prefix.
    affinity: Option<u64>,
    /// Bytes of the skills block at the front of the first message.
    skills_block_bytes: usize,
    /// The current round's prompt by part, and what was let go to fit it.
    round_parts: ContextParts,
    round_demoted: Vec<String>,
}

/// Where the turn stands: its round, what it generated and spent, and how
/// it ended.
struct Progress {
    /// The current round's output.
    output: RoundOutput,
    /// 1-based.
    round: u32,
    /// The extra round after the budget ran out: tools off, answer now.
    final_round: bool,
    /// Some content has reached the client already.
    content_sent: bool,
    usage: Usage,
    rounds: Vec<RoundStats>,
    n_prompt: usize,
    /// A bound cut the turn short (its rounds or its time).
    cut: bool,
    /// The turn ended with an answer (not an error): a child then stays.
    ended_ok: bool,
    /// A child that reported and waits for a follow-up.
    idle: bool,
    /// A child's follow-ups that came while it worked.
    inputs: Vec<String>,
}

/// What answers our calls: the workspace, the sandbox, the skill tools'
/// reach, and what earlier calls settled.
struct Workbench {
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
    conversations: Arc<Conversations>,
    /// Read-only calls answered since the last call that wrote anything.
    answered: Vec<Answered>,
    /// What the skills loaded this turn allow (`allowed-tools`).
    allowed: Allowed,
    /// What the skill tools can reach; `None` when they are not offered.
    skill_tools: Option<ToolContext>,
}

/// Tasks that run for the loop; each is dropped (and so aborted) with it.
struct Tasks {
    /// Relays engine events into this actor's mailbox; aborting it (also by
    /// dropping it) drops the engine receiver, which cancels the sequence.
    relay: Option<AbortOnDrop>,
    /// The calls being answered, while the tool task runs.
    pending: Option<PendingCalls>,
    /// The task answering this round's calls; the mailbox stays free while
    /// it runs, and dropping it (the loop stopped) abandons it.
    tools_task: Option<AbortOnDrop>,
    /// Ends the turn at its time budget.
    timer: Option<AbortOnDrop>,
}

/// The registry this request saw (children see it too), and the counts of
/// how the skills it used fared.
struct SkillUse {
    snapshot: Option<Arc<Snapshot>>,
    /// The server's per-skill counts.
    skill_outcomes: Arc<SkillOutcomes>,
    /// Skills this turn (or child task) read or ran: how it ends is counted
    /// for each.
    used_skills: TurnSkills,
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
            ChatEvent::Finished { .. } if self.progress.cut => Some(Outcome::Budget),
            ChatEvent::Finished { .. } => Some(Outcome::Answer),
            _ => None,
        };
        if let Some(outcome) = outcome {
            self.skills.used_skills.end(outcome);
        }
        if self.bench.workspace.as_ref().is_some_and(|w| w.own) {
            if let Some(workspace) = self.bench.workspace.take() {
                let _ = workspace.actor.stop_and_wait(None, Some(workspace_actor::STOP_TIMEOUT)).await;
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
        let text = if !*round_started && self.progress.content_sent { format!("\n\n{text}") } else { text };
        *round_started = true;
        self.progress.content_sent = true;
        self.emit(ChatEvent::Content(text))
    }
}

/// A loop before and after its setup, which runs on its first message.
pub enum LoopPhase {
    /// Spawned: the request, not yet set up.
    Starting(Option<Box<LoopArgs>>),
    Running(Box<LoopState>),
}

impl Actor for LoopActor {
    type Msg = LoopMsg;
    type State = LoopPhase;
    type Arguments = LoopArgs;

    /// Only queues the first `Run`: the setup (a workspace to open, a
    /// sandbox actor to start) runs there, so a spawner never waits on it.
    /// `Run` is the first message the loop reads: nobody else holds its
    /// address before this returns.
    async fn pre_start(&self, myself: ActorRef<LoopMsg>, args: LoopArgs) -> Result<LoopPhase, ActorProcessingErr> {
        myself.cast(LoopMsg::Run)?;
        Ok(LoopPhase::Starting(Some(Box::new(args))))
    }

    async fn post_stop(&self, _myself: ActorRef<LoopMsg>, phase: &mut LoopPhase) -> Result<(), ActorProcessingErr> {
        if let LoopPhase::Running(state) = phase {
            state.tasks.relay = None;
            state.tasks.tools_task = None;
        }
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
        phase: &mut LoopPhase,
    ) -> Result<(), ActorProcessingErr> {
        let LoopPhase::Running(state) = phase else { return Ok(()) };
        let state = state.as_mut();
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
        phase: &mut LoopPhase,
    ) -> Result<(), ActorProcessingErr> {
        if let LoopPhase::Starting(args) = phase {
            let Some(args) = args.take() else { return Ok(()) };
            let mut state = setup::prepare_state(&myself, *args).await;
            start_timer(&myself, &mut state);
            *phase = LoopPhase::Running(Box::new(state));
        }
        let LoopPhase::Running(state) = phase else { return Ok(()) };
        let state = state.as_mut();
        match msg {
            LoopMsg::Run => {
                if let Err(err) = start_round(&myself, state).await {
                    state.end(ChatEvent::Failed(err)).await;
                    myself.stop(None);
                }
            }
            LoopMsg::Generated(GenerationEvent::Text(text)) => {
                let split = state.progress.output.push(&text);
                let mut alive = split.reasoning.is_empty() || state.emit(ChatEvent::Reasoning(split.reasoning));
                let mut started = state.progress.output.content_started();
                alive &= state.emit_content(split.content, &mut started);
                state.progress.output.set_content_started(started);
                if !alive {
                    myself.stop(Some("client disconnected".into()));
                }
            }
            LoopMsg::Generated(GenerationEvent::ToolCalls(calls)) => state.progress.output.push_calls(calls),
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
                state.tasks.tools_task = None;
                state.bench.answered = answered;
                state.bench.allowed = allowed;
                used.into_iter().for_each(|skill| state.skills.used_skills.insert(skill));
                if tools_answered(state, answers).await {
                    let _ = myself.cast(LoopMsg::Run);
                } else {
                    conclude(&myself, state);
                }
            }
            LoopMsg::ToolsFailed(err) => {
                state.tasks.tools_task = None;
                state.end(ChatEvent::Failed(err)).await;
                myself.stop(None);
            }
            LoopMsg::TurnTimedOut => {
                // Whatever runs stops here: the round's generation (its
                // relay) and any tool call (its task, and with it the wait
                // for a command the sandbox actor then kills when the loop
                // stops).
                state.tasks.relay = None;
                state.tasks.tools_task = None;
                state.tasks.pending = None;
                // Stopping the sandbox actor kills a running command at once
                // (in its post_stop), so the workspace actor's call returns
                // and its folder can go.
                if let Some(sandbox) = state.bench.sandbox.take() {
                    let _ = sandbox.stop_and_wait(None, Some(workspace_actor::STOP_TIMEOUT)).await;
                }
                let separator = if state.progress.content_sent { "\n\n" } else { "" };
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
                state.progress.cut = true;
                finish(state, ChatFinish::Length, Timings::default()).await;
                conclude(&myself, state);
            }
            LoopMsg::Agents(op, reply) => agents::handle_op(&myself, state, op, reply).await,
            LoopMsg::ChildEvent(child, event) => agents::on_child_event(&myself, state, child, event),
            LoopMsg::Input(text) => {
                if state.progress.idle {
                    // A follow-up to a child that reported: a new task in
                    // the same conversation, with fresh bounds.
                    state.progress.idle = false;
                    state.progress.ended_ok = false;
                    state.prompt.history.push(ChatMessage::new(Role::User, text));
                    state.progress.round = 1;
                    state.progress.final_round = false;
                    state.progress.content_sent = false;
                    state.progress.usage = Usage::default();
                    state.bench.answered.clear();
                    state.bench.allowed = state.seat.as_ref().map(|seat| seat.allowed.clone()).unwrap_or_default();
                    state.progress.cut = false;
                    start_timer(&myself, state);
                    let _ = myself.cast(LoopMsg::Run);
                } else if state.progress.inputs.len() < agents::MAX_QUEUED_INPUTS {
                    state.progress.inputs.push(text);
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
    state.tasks.timer = Some(AbortOnDrop::new(tokio::spawn(async move {
        tokio::time::sleep(budget).await;
        let _ = timer.cast(LoopMsg::TurnTimedOut);
    })));
}

/// After the last event: a request's loop stops; a child that answered
/// stays, idle, with its conversation, for its parent's follow-ups.
fn conclude(myself: &ActorRef<LoopMsg>, state: &mut LoopState) {
    if state.seat.is_some() && state.progress.ended_ok {
        state.progress.idle = true;
        state.tasks.timer = None;
        state.tasks.relay = None;
    } else {
        myself.stop(None);
    }
}
