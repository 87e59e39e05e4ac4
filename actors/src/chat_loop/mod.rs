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
mod settings;
mod setup;
mod state;

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use skillhost_engine::{ChatMessage, EngineError, GenerationEvent, Role, Timings};
use tokio::sync::mpsc;

use crate::artifacts::Artifacts;
use crate::conversations::Conversations;
use crate::model::ModelBackend;
use crate::request::{ChatError, ChatEvent, ChatFinish, ChatRequest, Surface, Usage};
use crate::sandbox::ExecRuntime;
use crate::skills::outcomes::SkillOutcomes;
use crate::skills::Snapshot;
use crate::task::AbortOnDrop;
use crate::tools::agents::AgentOp;
use crate::tools::allowed::Allowed;
use crate::tools::router::Answered;
use crate::tools::workspace_actor;
use agents::{AgentStats, ChildSeat};
use round::{chat_error, finish, finish_round, start_round, start_tools, tools_answered, Next};
pub use settings::{
    LoopSettings, MultiAgent, DEFAULT_CODE_ROUNDS, DEFAULT_MAX_ROUNDS, DEFAULT_TURN_TIMEOUT, MAX_ROUNDS, MIN_ROUNDS,
};
pub use state::LoopState;
use state::{PendingCalls, Progress, Prompt, SkillUse, Tasks, Workbench, WorkspaceRef};

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
    /// The operator's MCP servers, when any are configured.
    pub mcp: Option<Arc<crate::tools::mcp::hub::McpHub>>,
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
                // The round's relay has forwarded its last event: no round
                // generates until the next one starts its own.
                state.tasks.relay = None;
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
                // A round cut while it generated counts its prompt (known
                // since its submit) and the tokens it wrote so far (counted
                // by the engine as it samples them).
                if state.tasks.relay.take().is_some() {
                    state.progress.usage.prompt_tokens += state.progress.n_prompt;
                    state.progress.usage.completion_tokens +=
                        state.progress.generated.load(std::sync::atomic::Ordering::Relaxed);
                }
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
                // The Responses API says why in the response itself
                // (`incomplete_details`), so its answer stays the model's.
                if state.request.surface != Surface::Responses || state.seat.is_some() {
                    let mut started = true;
                    state.emit_content(note, &mut started);
                }
                state.progress.cut = true;
                finish(state, ChatFinish::TimedOut, Timings::default()).await;
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
