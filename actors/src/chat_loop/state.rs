//! What one loop holds, in five named parts: the prompt the model is shown,
//! the turn's progress, the workbench that answers our calls, the tasks
//! that run for the loop, and the skills it used.

use std::collections::HashSet;
use std::sync::Arc;

use ractor::ActorRef;
use skillhost_engine::{ChatMessage, Timings, ToolCall, ToolDef};
use tokio::sync::mpsc;

use super::agents::{Agents, ChildSeat};
use super::output::RoundOutput;
use super::settings::LoopSettings;
use crate::artifacts::Artifacts;
use crate::conversations::Conversations;
use crate::model::ModelBackend;
use crate::request::{ChatEvent, ChatFinish, ChatRequest, ContextParts, RoundStats, Usage};
use crate::sandbox::actor::SandboxMsg;
use crate::sandbox::ExecRuntime;
use crate::skills::outcomes::{Outcome, SkillOutcomes, TurnSkills};
use crate::skills::Snapshot;
use crate::task::AbortOnDrop;
use crate::tools::allowed::Allowed;
use crate::tools::router::Answered;
use crate::tools::skills::ToolContext;
use crate::tools::workspace_actor::{self as workspace_actor, WorkspaceMsg};

/// A request's workspace, as the loop holds it.
pub(super) struct WorkspaceRef {
    pub(super) actor: ActorRef<WorkspaceMsg>,
    /// The request's own (deleted when it ends), not a conversation's.
    pub(super) own: bool,
}

/// Our calls of a round, being answered, and the caller's calls that
/// end the turn once they are.
pub(super) struct PendingCalls {
    pub(super) ours: Vec<ToolCall>,
    pub(super) caller: Vec<ToolCall>,
    pub(super) timings: Timings,
    /// How the request ends when the caller's calls go back: `Length` when
    /// the last of them was cut short by the token budget.
    pub(super) finish: ChatFinish,
}

pub struct LoopState {
    pub(super) request: ChatRequest,
    pub(super) backend: Arc<dyn ModelBackend>,
    /// Where the HTTP handler reads this request's events.
    pub(super) events: mpsc::UnboundedSender<ChatEvent>,
    pub(super) settings: LoopSettings,
    /// `/root`, or a child's path such as `/root/1`.
    pub(super) agent_id: String,
    /// Set for a child: what it was given, and its place among the open agents.
    pub(super) seat: Option<ChildSeat>,
    /// Its children, when delegation is on.
    pub(super) agents: Option<Agents>,
    /// What the model is shown.
    pub(super) prompt: Prompt,
    /// Where the turn stands.
    pub(super) progress: Progress,
    /// What answers our tool calls.
    pub(super) bench: Workbench,
    /// What runs on the loop's behalf.
    pub(super) tasks: Tasks,
    /// The registry this request saw, and how its skills fared.
    pub(super) skills: SkillUse,
}

/// The conversation as the model sees it, and what it offers.
pub(super) struct Prompt {
    /// The request's messages with the skills block applied.
    pub(super) base_messages: Vec<ChatMessage>,
    /// Assistant and tool turns the loop added.
    pub(super) history: Vec<ChatMessage>,
    /// Every tool the model is offered: the caller's and ours.
    pub(super) tools: Vec<ToolDef>,
    pub(super) caller_tools: HashSet<String>,
    /// The conversation's key (its opening messages), so an upstream fleet
    /// sends every round to the upstream that caches its prefix.
    pub(super) affinity: Option<u64>,
    /// Bytes of the skills block at the front of the first message.
    pub(super) skills_block_bytes: usize,
    /// The current round's prompt by part, and what was let go to fit it.
    pub(super) round_parts: ContextParts,
    pub(super) round_demoted: Vec<String>,
}

/// Where the turn stands: its round, what it generated and spent, and how
/// it ended.
pub(super) struct Progress {
    /// The current round's output.
    pub(super) output: RoundOutput,
    /// 1-based.
    pub(super) round: u32,
    /// The extra round after the budget ran out: tools off, answer now.
    pub(super) final_round: bool,
    /// Some content has reached the client already.
    pub(super) content_sent: bool,
    pub(super) usage: Usage,
    pub(super) rounds: Vec<RoundStats>,
    pub(super) n_prompt: usize,
    /// The running round's tokens so far, as the engine counts them; what
    /// a turn cut by its time counts for a round that never ended.
    pub(super) generated: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// A bound cut the turn short (its rounds or its time).
    pub(super) cut: bool,
    /// The turn ended with an answer (not an error): a child then stays.
    pub(super) ended_ok: bool,
    /// A child that reported and waits for a follow-up.
    pub(super) idle: bool,
    /// A child's follow-ups that came while it worked.
    pub(super) inputs: Vec<String>,
}

/// What answers our calls: the workspace, the sandbox, the skill tools'
/// reach, and what earlier calls settled.
pub(super) struct Workbench {
    /// The MCP tools this turn offers, and the hub that answers them.
    pub(super) mcp: Option<crate::tools::mcp::TurnMcp>,
    pub(super) exec: Option<Arc<ExecRuntime>>,
    /// The workspace actor the code tools work through: the request's own
    /// (a linked child, deleted when the loop stops, whatever ended it) or
    /// its conversation's.
    pub(super) workspace: Option<WorkspaceRef>,
    /// Runs this request's commands; a linked child, so a stopped loop
    /// kills whatever is still running.
    pub(super) sandbox: Option<ActorRef<SandboxMsg>>,
    pub(super) artifacts: Option<Artifacts>,
    /// The code tools are declared.
    pub(super) code_tools: bool,
    /// The request's attachments, which `read_file` reads from memory
    /// when there is no working folder; empty when it is not offered so.
    pub(super) attachments: Arc<Vec<crate::attachments::Attachment>>,
    /// Artifacts of this request are stored under this id.
    pub(super) run_id: String,
    pub(super) conversations: Arc<Conversations>,
    /// Read-only calls answered since the last call that wrote anything.
    pub(super) answered: Vec<Answered>,
    /// What the skills loaded this turn allow (`allowed-tools`).
    pub(super) allowed: Allowed,
    /// What the skill tools can reach; `None` when they are not offered.
    pub(super) skill_tools: Option<ToolContext>,
}

/// Tasks that run for the loop; each is dropped (and so aborted) with it.
pub(super) struct Tasks {
    /// Relays engine events into this actor's mailbox; aborting it (also by
    /// dropping it) drops the engine receiver, which cancels the sequence.
    pub(super) relay: Option<AbortOnDrop>,
    /// The calls being answered, while the tool task runs.
    pub(super) pending: Option<PendingCalls>,
    /// The task answering this round's calls; the mailbox stays free while
    /// it runs, and dropping it (the loop stopped) abandons it.
    pub(super) tools_task: Option<AbortOnDrop>,
    /// Ends the turn at its time budget.
    pub(super) timer: Option<AbortOnDrop>,
}

/// The registry this request saw (children see it too), and the counts of
/// how the skills it used fared.
pub(super) struct SkillUse {
    pub(super) snapshot: Option<Arc<Snapshot>>,
    /// The server's per-skill counts.
    pub(super) skill_outcomes: Arc<SkillOutcomes>,
    /// Skills this turn (or child task) read or ran: how it ends is counted
    /// for each.
    pub(super) used_skills: TurnSkills,
}

impl LoopState {
    /// What a bound cut short, in the notes that say so: a request's turn,
    /// or a child agent's task.
    pub(super) fn task_word(&self) -> &'static str {
        if self.seat.is_some() {
            "agent's task"
        } else {
            "turn"
        }
    }

    /// Sends an event to the HTTP handler. False when the client is gone.
    pub(super) fn emit(&self, event: ChatEvent) -> bool {
        self.events.send(event).is_ok()
    }

    /// Sends the request's last event. The request's own workspace goes
    /// first, so a client that has its answer never finds the folder there.
    pub(super) async fn end(&mut self, event: ChatEvent) {
        let outcome = match &event {
            ChatEvent::Failed(_) => Some(Outcome::Error),
            ChatEvent::Finished { finish: ChatFinish::ToolCalls, .. } => Some(Outcome::ToolCall),
            ChatEvent::Finished { finish, .. } if finish.cut_short() => Some(Outcome::Budget),
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
    pub(super) fn emit_content(&mut self, text: String, round_started: &mut bool) -> bool {
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
