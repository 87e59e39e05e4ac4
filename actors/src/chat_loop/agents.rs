//! Multiple agents: a loop's children and the coordination calls about them.
//!
//! A child is a `LoopActor` of its own, spawned linked to its parent's loop,
//! so it stops when the parent stops, and its crash reaches the parent as a
//! supervision event, never as the parent's crash. Its events come to the
//! parent through a relay task (`LoopMsg::ChildEvent`): its steps go on to
//! the client labelled with its id, its text becomes its report. The
//! parent's tool task asks the parent actor for each coordination call
//! (`LoopMsg::Agents`), and a wait is a reply port kept until a report
//! arrives, so the parent's mailbox stays free while a child works. After a
//! report the child stays, idle, with its conversation, for `send_input`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorRef, RpcReplyPort};
use skillhost_engine::{ChatMessage, Role, Timings, ToolChoice};
use tokio::sync::mpsc;

use super::{LoopActor, LoopArgs, LoopMsg, LoopState, MultiAgent};
use crate::request::AGENT_MARK;
use crate::request::{AgentPhase, AgentUpdate, ChatError, ChatEvent, ChatFinish, ChatRequest};
use crate::task::AbortOnDrop;
use crate::tools::agents::AgentOp;
use crate::tools::workspace_actor::WorkspaceMsg;
use crate::tools::Tool;

/// Children one request may start, counted over its whole tree: each is a
/// generation of its own on the engine.
pub const MAX_AGENTS_PER_REQUEST: usize = 8;
/// How deep children may nest: `/root/1` is depth 1, `/root/1/2` depth 2,
/// and an agent at this depth cannot start one of its own.
pub const MAX_AGENT_DEPTH: usize = 2;
/// Children of one request open at once (working or idle with their
/// conversation), over its whole tree: each may hold an engine slot.
pub const MAX_OPEN_AGENTS: usize = 4;
/// Rounds one child task may take; then it answers with what it has.
pub const MAX_AGENT_ROUNDS: u32 = 8;
/// Tokens one child task may generate (they also count toward the turn's
/// budget, `max_tokens`).
pub const MAX_AGENT_TOKENS: u32 = 2048;
/// How long one child task may run; then it reports what it has.
pub const AGENT_WALL_TIME: Duration = Duration::from_secs(300);
/// Follow-ups queued for a working child; more are refused.
pub const MAX_QUEUED_INPUTS: usize = 8;
/// Bytes of a report the parent reads; the rest is cut with a note.
pub const MAX_REPORT_BYTES: usize = 16 * 1024;
/// Characters of a task or step shown in the activity line.
const DETAIL_CHARS: usize = 120;

/// The bounds on a request's children, the constants above unless a test
/// or the operator sets others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentLimits {
    pub per_request: usize,
    pub depth: usize,
    pub open: usize,
    pub rounds: u32,
    pub tokens: u32,
    pub wall_time: Duration,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            per_request: MAX_AGENTS_PER_REQUEST,
            depth: MAX_AGENT_DEPTH,
            open: MAX_OPEN_AGENTS,
            rounds: MAX_AGENT_ROUNDS,
            tokens: MAX_AGENT_TOKENS,
            wall_time: AGENT_WALL_TIME,
        }
    }
}

/// Server-wide counters for `/metrics`.
#[derive(Debug, Default)]
pub struct AgentStats {
    pub spawned: AtomicU64,
    /// Reports (one per finished task).
    pub finished: AtomicU64,
    /// Closed by their parent, or stopped with it while working.
    pub stopped: AtomicU64,
    /// Ended with an error or a crash.
    pub failed: AtomicU64,
    /// Child loops alive right now.
    pub open: AtomicUsize,
}

/// What a request's agents share: its bounds and their counts.
pub struct AgentTree {
    pub limits: AgentLimits,
    /// Children may use the tools that write and run (`--agents-allow-write`).
    pub allow_write: bool,
    pub stats: Arc<AgentStats>,
    spawned: AtomicUsize,
    open: AtomicUsize,
}

impl AgentTree {
    pub fn new(limits: AgentLimits, allow_write: bool, stats: Arc<AgentStats>) -> Arc<AgentTree> {
        Arc::new(AgentTree { limits, allow_write, stats, spawned: AtomicUsize::new(0), open: AtomicUsize::new(0) })
    }
}

/// Whether a request delegates: the server allows it (`mode`), the request
/// did not turn it off, and the model can call tools and have its calls
/// read. Under `Auto` the request must offer other tools (`tools_offered`:
/// the caller's, skills or code tools) or ask for delegation itself: the
/// five declarations cost a plain question hundreds of prompt tokens and
/// nudge a small model toward calling tools. Two requests are left alone
/// because their answer must be the caller's: a JSON `response_format` (its
/// grammar and the lazy call grammar cannot both hold, so the answer would
/// not be held to JSON), and a `tool_choice` that forces one of the
/// caller's own tools.
pub fn delegates(mode: MultiAgent, request: &ChatRequest, tools_offered: bool, capable: bool) -> bool {
    let caller_forced = match &request.tool_choice {
        ToolChoice::Required => !request.tools.is_empty(),
        ToolChoice::Named(name) => request.tools.iter().any(|t| &t.name == name),
        ToolChoice::None | ToolChoice::Auto => false,
    };
    let allowed = match mode {
        MultiAgent::Off => false,
        MultiAgent::Always => true,
        MultiAgent::Auto => tools_offered || request.multi_agent == Some(true),
    };
    allowed
        && capable
        && request.multi_agent != Some(false)
        && request.response_format == skillhost_engine::ResponseFormat::Text
        && !caller_forced
}

/// Takes one of `max` places on `counter`; false when all are taken.
fn reserve(counter: &AtomicUsize, max: usize) -> bool {
    counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1)).is_ok()
}

/// A child's place among the open agents, given back when the child's
/// state is dropped: however it ends, a kill by its stopping parent too.
pub struct OpenSeat(Arc<AgentTree>);

impl Drop for OpenSeat {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.stats.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What makes a loop a child: its id, depth and the tools it was given.
pub struct ChildSeat {
    pub id: String,
    pub depth: usize,
    pub tree: Arc<AgentTree>,
    /// Our tools it may use, by name (the coordination tools aside).
    pub tools: Vec<String>,
    /// The parent's skill restrictions when it spawned this child, which
    /// the child starts under (`allowed-tools` binds the whole turn).
    pub allowed: crate::tools::allowed::Allowed,
    /// The parent's workspace, which a child reads (and with
    /// `--agents-allow-write` writes) through the same actor and handle.
    pub workspace: Option<ActorRef<WorkspaceMsg>>,
    pub seat: OpenSeat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChildState {
    Working,
    Idle,
    Failed,
    Closed,
}

struct Child {
    id: String,
    role: Option<String>,
    actor: ActorRef<LoopMsg>,
    state: ChildState,
    /// Rounds of its current task so far.
    rounds: u32,
    /// Its current task's text.
    text: String,
    /// The last thing it did or said, for `list_agents`.
    last_line: String,
    /// A report the parent has not read.
    report: Option<String>,
    queued: usize,
    _relay: AbortOnDrop,
}

/// A `wait_agent` call waiting for a report.
struct Waiter {
    ids: Vec<String>,
    reply: RpcReplyPort<String>,
}

/// A loop's children and its coordination state; `None` in the loop when
/// delegation is off for the request.
pub struct Agents {
    pub tree: Arc<AgentTree>,
    /// 0 for the request's own model.
    pub depth: usize,
    children: Vec<Child>,
    waiters: Vec<Waiter>,
    /// This round started while a report was unread: its content is held.
    pub holding: bool,
    pub held: String,
    /// A final answer was withheld; the reports are being collected, and
    /// the round's timings wait for the answer that follows.
    pub collecting: Option<Timings>,
}

impl Agents {
    pub fn new(tree: Arc<AgentTree>, depth: usize) -> Agents {
        Agents {
            tree,
            depth,
            children: Vec::new(),
            waiters: Vec::new(),
            holding: false,
            held: String::new(),
            collecting: None,
        }
    }

    /// Whether a child works or has a report the parent has not read.
    pub fn unread(&self) -> bool {
        self.children.iter().any(|c| c.state == ChildState::Working || c.report.is_some())
    }

    fn working(&self) -> bool {
        self.children.iter().any(|c| c.state == ChildState::Working)
    }

    /// Whether this loop may start children (so declares the tools).
    pub fn may_spawn(&self) -> bool {
        self.depth < self.tree.limits.depth
    }

    fn find(&self, id: &str) -> Option<usize> {
        self.children.iter().position(|c| c.id == id)
    }

    fn ids(&self) -> String {
        let ids: Vec<&str> = self.children.iter().map(|c| c.id.as_str()).collect();
        if ids.is_empty() {
            "you have started none".into()
        } else {
            format!("yours are {}", ids.join(", "))
        }
    }

    /// Takes the unread reports of `ids` (every child when empty).
    fn take_reports(&mut self, ids: &[String]) -> Vec<(String, String)> {
        self.children
            .iter_mut()
            .filter(|c| ids.is_empty() || ids.contains(&c.id))
            .filter_map(|c| c.report.take().map(|r| (c.id.clone(), r)))
            .collect()
    }

    /// Answers every wait that has a report now.
    fn answer_waiters(&mut self) {
        let waiters = std::mem::take(&mut self.waiters);
        for waiter in waiters {
            if waiter.reply.is_closed() {
                continue;
            }
            let ready = self
                .children
                .iter()
                .any(|c| (waiter.ids.is_empty() || waiter.ids.contains(&c.id)) && c.report.is_some());
            if ready {
                let reports = self.take_reports(&waiter.ids);
                let _ = waiter.reply.send(self.reports_text(&reports, &waiter.ids));
            } else {
                self.waiters.push(waiter);
            }
        }
    }

    /// The reports read, then where the other awaited agents stand.
    fn reports_text(&self, reports: &[(String, String)], ids: &[String]) -> String {
        let mut text = String::new();
        for (id, report) in reports {
            text.push_str(&format!("## Report of {id}\n{report}\n\n"));
        }
        let others: Vec<String> = self
            .children
            .iter()
            .filter(|c| (ids.is_empty() || ids.contains(&c.id)) && c.state == ChildState::Working)
            .map(|c| format!("{} (round {})", c.id, c.rounds.max(1)))
            .collect();
        if !others.is_empty() {
            text.push_str(&format!("Still working: {}.", others.join(", ")));
        }
        text.trim_end().to_string()
    }

    fn list(&self) -> String {
        if self.children.is_empty() {
            return "You have started no agents.".into();
        }
        let mut text = String::new();
        for child in &self.children {
            let state = match (child.state, child.report.is_some()) {
                (ChildState::Working, _) => "working",
                (ChildState::Idle, true) => "reported (unread)",
                (ChildState::Idle, false) => "reported (read)",
                (ChildState::Failed, true) => "failed (unread)",
                (ChildState::Failed, false) => "failed",
                (ChildState::Closed, _) => "closed",
            };
            let role = child.role.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
            text.push_str(&format!("- {}{role}: {state}, {} rounds", child.id, child.rounds));
            if !child.last_line.is_empty() {
                text.push_str(&format!("; last: {}", child.last_line));
            }
            text.push('\n');
        }
        text.trim_end().to_string()
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        // Children still working when their parent ends stop with it.
        let working = self.children.iter().filter(|c| c.state == ChildState::Working).count();
        self.tree.stats.stopped.fetch_add(working as u64, Ordering::Relaxed);
    }
}

fn shorten(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or_default();
    let mut short: String = line.chars().take(DETAIL_CHARS).collect();
    if short.len() < line.len() {
        short.push('…');
    }
    short
}

/// A report as the parent reads it: the child's text, bounded.
fn report(text: &str, finish: ChatFinish) -> String {
    let mut text = text.trim().to_string();
    if text.is_empty() {
        text = "(The agent answered with no text.)".into();
    }
    if text.len() > MAX_REPORT_BYTES {
        let mut cut = MAX_REPORT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text = format!("{}\n[Report cut at {MAX_REPORT_BYTES} of its {} bytes.]", &text[..cut], text.len());
    }
    if finish == ChatFinish::Length {
        text.push_str("\n[The agent reached its token budget; this is what it had.]");
    }
    text
}

/// Answers one coordination operation inside the loop's actor. A wait with
/// nothing to read yet keeps its reply port for the first report.
pub(super) async fn handle_op(
    myself: &ActorRef<LoopMsg>,
    state: &mut LoopState,
    op: AgentOp,
    reply: RpcReplyPort<String>,
) {
    let text = match op {
        AgentOp::Spawn { message, role, skills, tools } => spawn(myself, state, message, role, skills, tools).await,
        AgentOp::Send { id, message } => send(state, &id, message),
        AgentOp::Wait { ids } => match wait(state, ids) {
            Ok(text) => text,
            Err(ids) => {
                if let Some(agents) = state.agents.as_mut() {
                    agents.waiters.push(Waiter { ids, reply });
                }
                return;
            }
        },
        AgentOp::Status { ids, waited, note } => status(state, &ids, waited, note),
        AgentOp::Close { id } => close(state, &id),
        AgentOp::List => state.agents.as_ref().map(Agents::list).unwrap_or_default(),
    };
    let _ = reply.send(text);
}

/// The tools of ours a child may be given: the parent's own, less the
/// ones that write or run unless the operator allows them.
pub(super) fn grantable(
    tools: &[skillhost_engine::ToolDef],
    caller_tools: &std::collections::HashSet<String>,
    allow_write: bool,
) -> Vec<String> {
    tools
        .iter()
        .filter(|t| !caller_tools.contains(&t.name))
        .filter_map(|t| Tool::from_name(&t.name))
        .filter(|t| !t.is_agent() && (allow_write || t.read_only()))
        .map(|t| t.name().to_string())
        .collect()
}

async fn spawn(
    myself: &ActorRef<LoopMsg>,
    state: &mut LoopState,
    message: String,
    role: Option<String>,
    skills: Option<Vec<String>>,
    tools: Option<Vec<String>>,
) -> String {
    let Some(agents) = state.agents.as_ref() else { return "Agents are off for this request.".into() };
    let tree = Arc::clone(&agents.tree);
    let limits = tree.limits;
    let depth = agents.depth + 1;
    if depth > limits.depth {
        return format!(
            "You cannot start agents: you are an agent at depth {}, the deepest allowed. Do the task with your own tools, or report back and let the agent that started you delegate it.",
            agents.depth
        );
    }
    let reachable: BTreeSet<String> = state.bench.skill_tools.as_ref().map(|c| c.reachable.clone()).unwrap_or_default();
    let (child_skills, discovery) = match skills {
        None => (state.request.skills.clone(), state.request.skills_discovery),
        Some(named) => {
            if let Some(unknown) = named.iter().find(|s| !reachable.contains(*s)) {
                let yours: Vec<&str> = reachable.iter().map(String::as_str).collect();
                return format!(
                    "The agent cannot be given the skill {unknown:?}: you can only share skills you have ({}).",
                    if yours.is_empty() { "none".into() } else { yours.join(", ") }
                );
            }
            (named, Some(false))
        }
    };
    let allowed = grantable(&state.prompt.tools, &state.prompt.caller_tools, tree.allow_write);
    let child_tools = match tools {
        None => allowed.clone(),
        Some(named) => {
            for name in &named {
                if allowed.contains(name) {
                    continue;
                }
                let ours = Tool::from_name(name).is_some_and(|t| !t.is_agent())
                    && state.prompt.tools.iter().any(|t| &t.name == name);
                return if ours && !tree.allow_write {
                    format!("The agent cannot be given {name}: agents only read on this server (the operator can allow more with --agents-allow-write). Give it read-only tools: {}.", allowed.join(", "))
                } else {
                    format!(
                        "The agent cannot be given {name}; the tools you can give are: {}.",
                        if allowed.is_empty() { "none".into() } else { allowed.join(", ") }
                    )
                };
            }
            named
        }
    };
    if !reserve(&tree.spawned, limits.per_request) {
        return format!(
            "No more agents: this request has started {}, the most it may. Do the rest yourself, or reuse an agent with send_input.",
            limits.per_request
        );
    }
    if !reserve(&tree.open, limits.open) {
        tree.spawned.fetch_sub(1, Ordering::SeqCst);
        return format!(
            "No more agents at once: {} are open, the limit. Wait for one with wait_agent and close it with close_agent, then start this one.",
            limits.open
        );
    }
    tree.stats.open.fetch_add(1, Ordering::SeqCst);
    let seat = OpenSeat(Arc::clone(&tree));
    let Some(agents) = state.agents.as_ref() else { return String::new() };
    let index = agents.children.len() + 1;
    let id = format!("{}/{index}", state.agent_id);
    // The child's prompt opens as the parent's does (the caller's system
    // text, the same skills block), so its KV prefix is copied, not
    // decoded; what differs (its id) comes at the end.
    let mut messages: Vec<ChatMessage> =
        state.request.messages.iter().take_while(|m| m.role == Role::System).cloned().collect();
    let role_text = role.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
    messages.push(ChatMessage::new(
        Role::User,
        format!(
            "{message}\n\n{AGENT_MARK}{id}{role_text}, started by {} for this task. It sees only your final answer: make it your report.]",
            state.agent_id
        ),
    ));
    let budget = super::round::remaining_budget(state).map_or(limits.tokens, |left| left.min(limits.tokens));
    let request = ChatRequest {
        model: state.request.model.clone(),
        messages,
        tool_choice: ToolChoice::Auto,
        parallel_tool_calls: state.request.parallel_tool_calls,
        sampling: state.request.sampling.clone(),
        max_tokens: Some(budget.max(1)),
        skills: child_skills,
        skills_discovery: discovery,
        temperature_set: true,
        multi_agent: Some(true),
        ..ChatRequest::default()
    };
    let settings = super::LoopSettings {
        max_rounds: state.settings.max_rounds.min(limits.rounds),
        turn_timeout: limits.wall_time.min(state.settings.turn_timeout),
        ..state.settings
    };
    let (events, mut child_events) = mpsc::unbounded_channel();
    let args = LoopArgs {
        request,
        backend: Arc::clone(&state.backend),
        skills: state.skills.snapshot.clone(),
        settings,
        exec: state.bench.exec.clone(),
        artifacts: state.bench.artifacts.clone(),
        conversations: Arc::clone(&state.bench.conversations),
        events,
        agent_stats: Arc::clone(&tree.stats),
        skill_outcomes: Arc::clone(&state.skills.skill_outcomes),
        seat: Some(ChildSeat {
            id: id.clone(),
            depth,
            tree: Arc::clone(&tree),
            tools: child_tools,
            allowed: state.bench.allowed.clone(),
            workspace: state.bench.workspace.as_ref().map(|w| w.actor.clone()),
            seat,
        }),
        mcp: state.bench.mcp.as_ref().map(|turn| std::sync::Arc::clone(&turn.hub)),
    };
    let actor = match Actor::spawn_linked(None, LoopActor, args, myself.get_cell()).await {
        Ok((actor, _)) => actor,
        Err(err) => {
            tracing::error!(error = %err, agent = %id, "cannot start an agent");
            tree.spawned.fetch_sub(1, Ordering::SeqCst);
            return "The agent did not start; do the task yourself.".into();
        }
    };
    tree.stats.spawned.fetch_add(1, Ordering::Relaxed);
    let relay_to = myself.clone();
    let relay = AbortOnDrop::new(tokio::spawn(async move {
        while let Some(event) = child_events.recv().await {
            if relay_to.cast(LoopMsg::ChildEvent(index, event)).is_err() {
                return;
            }
        }
    }));
    tracing::info!(agent = %id, role = ?role, "agent started");
    state.emit(ChatEvent::Agent(AgentUpdate {
        agent_id: id.clone(),
        phase: AgentPhase::Spawned,
        detail: shorten(&message),
        rounds: 0,
    }));
    let Some(agents) = state.agents.as_mut() else { return String::new() };
    agents.children.push(Child {
        id: id.clone(),
        role,
        actor,
        state: ChildState::Working,
        rounds: 0,
        text: String::new(),
        last_line: String::new(),
        report: None,
        queued: 0,
        _relay: relay,
    });
    format!("Started agent {id}. It works on its own while you go on; read its report with wait_agent(ids=[\"{id}\"]).")
}

fn send(state: &mut LoopState, id: &str, message: String) -> String {
    let Some(agents) = state.agents.as_mut() else { return String::new() };
    let Some(index) = agents.find(id) else {
        return format!("There is no agent {id} among yours: {}.", agents.ids());
    };
    let child = &mut agents.children[index];
    match child.state {
        ChildState::Failed | ChildState::Closed => {
            format!("{id} has ended and reads nothing more; start a new agent with spawn_agent.")
        }
        ChildState::Working if child.queued >= MAX_QUEUED_INPUTS => {
            format!("{id} has {MAX_QUEUED_INPUTS} messages waiting already; wait for its report before sending more.")
        }
        ChildState::Working => {
            child.queued += 1;
            let _ = child.actor.cast(LoopMsg::Input(message));
            format!("Queued for {id}; it reads it after its current step.")
        }
        ChildState::Idle => {
            child.state = ChildState::Working;
            child.text.clear();
            child.rounds = 0;
            let _ = child.actor.cast(LoopMsg::Input(message.clone()));
            let update = AgentUpdate {
                agent_id: id.to_string(),
                phase: AgentPhase::Working,
                detail: shorten(&message),
                rounds: 0,
            };
            state.emit(ChatEvent::Agent(update));
            format!("Sent to {id}, which works on it now; read its report with wait_agent.")
        }
    }
}

/// A wait answered at once (`Ok`), or the ids to wait for (`Err`).
fn wait(state: &mut LoopState, ids: Vec<String>) -> Result<String, Vec<String>> {
    let Some(agents) = state.agents.as_mut() else { return Ok(String::new()) };
    if agents.children.is_empty() {
        return Ok("You have no agents to wait for; start one with spawn_agent.".into());
    }
    if let Some(unknown) = ids.iter().find(|id| agents.find(id).is_none()) {
        return Ok(format!("There is no agent {unknown} among yours: {}.", agents.ids()));
    }
    let targets: Vec<&Child> = agents.children.iter().filter(|c| ids.is_empty() || ids.contains(&c.id)).collect();
    if targets.iter().any(|c| c.report.is_some()) {
        let reports = agents.take_reports(&ids);
        return Ok(agents.reports_text(&reports, &ids));
    }
    if !targets.iter().any(|c| c.state == ChildState::Working) {
        return Ok("Every one of those agents has reported already, and you have read each report above.".into());
    }
    Err(ids)
}

fn status(state: &LoopState, ids: &[String], waited: Duration, note: Option<String>) -> String {
    let Some(agents) = state.agents.as_ref() else { return String::new() };
    let working: Vec<String> = agents
        .children
        .iter()
        .filter(|c| (ids.is_empty() || ids.contains(&c.id)) && c.state == ChildState::Working)
        .map(|c| match c.last_line.as_str() {
            "" => format!("{} (round {})", c.id, c.rounds.max(1)),
            last => format!("{} (round {}: {last})", c.id, c.rounds.max(1)),
        })
        .collect();
    let mut text = format!(
        "No report came within {} s. Still working: {}. Wait again, or go on and wait later.",
        waited.as_secs(),
        if working.is_empty() { "none".into() } else { working.join(", ") }
    );
    if let Some(note) = note {
        text.push_str(&format!("\n{note}"));
    }
    text
}

fn close(state: &mut LoopState, id: &str) -> String {
    let Some(agents) = state.agents.as_mut() else { return String::new() };
    let Some(index) = agents.find(id) else {
        return format!("There is no agent {id} among yours: {}.", agents.ids());
    };
    let child = &mut agents.children[index];
    if child.state == ChildState::Closed {
        return format!("{id} is closed already.");
    }
    child.actor.stop(Some("closed by its parent".into()));
    child.state = ChildState::Closed;
    child.report = None;
    agents.tree.stats.stopped.fetch_add(1, Ordering::Relaxed);
    agents.answer_waiters();
    state.emit(ChatEvent::Agent(AgentUpdate {
        agent_id: id.to_string(),
        phase: AgentPhase::Closed,
        detail: String::new(),
        rounds: 0,
    }));
    format!("Closed {id}.")
}

/// Takes in an event of child `index` (1-based): its steps go on to the
/// client, its text is kept, its end becomes its report.
pub(super) fn on_child_event(myself: &ActorRef<LoopMsg>, state: &mut LoopState, index: usize, event: ChatEvent) {
    let Some(agents) = state.agents.as_mut() else { return };
    let Some(child) = agents.children.get_mut(index - 1) else { return };
    if child.state == ChildState::Closed {
        return;
    }
    match event {
        ChatEvent::Accepted | ChatEvent::Reasoning(_) | ChatEvent::ToolCalls(_) | ChatEvent::ServerTurns { .. } => {}
        ChatEvent::Content(text) => {
            child.text.push_str(&text);
            if let Some(line) = child.text.lines().rev().find(|l| !l.trim().is_empty()) {
                child.last_line = shorten(line);
            }
        }
        ChatEvent::SkillStep(step) => {
            child.rounds = child.rounds.max(step.round);
            child.last_line =
                format!("{} {}", step.tool, step.detail.clone().or(step.skill.clone()).unwrap_or_default());
            state.emit(ChatEvent::SkillStep(step));
        }
        ChatEvent::ToolProgress(progress) => {
            child.rounds = child.rounds.max(progress.round);
            if !progress.detail.is_empty() {
                child.last_line = format!("{} {}", progress.tool, progress.detail);
            }
            state.emit(ChatEvent::ToolProgress(progress));
        }
        // A grandchild's news, passed up to the client.
        ChatEvent::Agent(update) => {
            state.emit(ChatEvent::Agent(update));
        }
        ChatEvent::Finished { finish, usage, timings: _, rounds } => {
            child.rounds = rounds.len() as u32;
            child.report = Some(report(&child.text, finish));
            child.state = ChildState::Idle;
            child.queued = 0;
            let update = AgentUpdate {
                agent_id: child.id.clone(),
                phase: AgentPhase::Reported,
                detail: shorten(&child.text),
                rounds: child.rounds,
            };
            tracing::info!(agent = %child.id, rounds = child.rounds, tokens = usage.completion_tokens, "agent reported");
            agents.tree.stats.finished.fetch_add(1, Ordering::Relaxed);
            // The children's work is the request's: their tokens count
            // toward its budget and its usage.
            state.progress.usage.prompt_tokens += usage.prompt_tokens;
            state.progress.usage.completion_tokens += usage.completion_tokens;
            state.progress.rounds.extend(rounds);
            state.emit(ChatEvent::Agent(update));
            reported(myself, state);
        }
        ChatEvent::Failed(err) => {
            let why = match err {
                ChatError::BadRequest(m)
                | ChatError::Unavailable(m)
                | ChatError::ModelNotFound(m)
                | ChatError::Engine(m)
                | ChatError::Conflict(m) => m,
            };
            fail(myself, state, index, format!("The agent failed: {why}."));
        }
    }
}

/// A child ended without a report (an error, a crash, or it stopped).
pub(super) fn fail(myself: &ActorRef<LoopMsg>, state: &mut LoopState, index: usize, why: String) {
    let Some(agents) = state.agents.as_mut() else { return };
    let Some(child) = agents.children.get_mut(index - 1) else { return };
    if !matches!(child.state, ChildState::Working | ChildState::Idle) {
        return;
    }
    let was_working = child.state == ChildState::Working;
    child.state = ChildState::Failed;
    // An idle child's unread report stays; a working one's becomes why it ended.
    if was_working {
        child.report = Some(match child.text.trim() {
            "" => why.clone(),
            text => format!("{why} What it had written:\n{}", report(text, ChatFinish::Stop)),
        });
    }
    tracing::warn!(agent = %child.id, reason = ?why, "agent ended without a report");
    agents.tree.stats.failed.fetch_add(1, Ordering::Relaxed);
    let update = AgentUpdate {
        agent_id: child.id.clone(),
        phase: AgentPhase::Failed,
        detail: shorten(&why),
        rounds: child.rounds,
    };
    state.emit(ChatEvent::Agent(update));
    reported(myself, state);
}

/// The child (1-based index) whose loop is `cell`.
pub(super) fn child_of(state: &LoopState, cell: &ActorCell) -> Option<usize> {
    let agents = state.agents.as_ref()?;
    agents.children.iter().position(|c| c.actor.get_id() == cell.get_id()).map(|i| i + 1)
}

/// A report came in: waits get their answer, and a withheld answer is
/// asked again once every child has reported.
fn reported(myself: &ActorRef<LoopMsg>, state: &mut LoopState) {
    if let Some(agents) = state.agents.as_mut() {
        agents.answer_waiters();
    }
    collect_if_ready(myself, state);
}

/// With a final answer withheld, and no child still working: the unread
/// reports go into the conversation and the model answers again.
pub(super) fn collect_if_ready(myself: &ActorRef<LoopMsg>, state: &mut LoopState) {
    let Some(agents) = state.agents.as_mut() else { return };
    if agents.collecting.is_none() || agents.working() {
        return;
    }
    let timings = agents.collecting.take().unwrap_or_default();
    let reports = agents.take_reports(&[]);
    if reports.is_empty() {
        // Nothing arrived that the answer missed: it goes out as it was.
        let held = std::mem::take(&mut agents.held);
        agents.holding = false;
        let mut started = false;
        state.emit_content(held, &mut started);
        let _ = myself.cast(LoopMsg::Finish(timings));
        return;
    }
    agents.held.clear();
    agents.holding = false;
    let mut text = String::from(
        "Reports from the agents you started came in after you answered. Read them and answer again; the user has not seen your earlier answer.\n\n",
    );
    text.push_str(&agents.reports_text(&reports, &[]));
    tracing::info!(
        reports = reports.len(),
        round = state.progress.round,
        "a final answer was withheld for agents' reports"
    );
    state.prompt.history.push(ChatMessage::new(Role::User, text));
    super::round::next_round(state);
    let _ = myself.cast(LoopMsg::Run);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delegation_leaves_alone_answers_that_must_be_the_callers() {
        use MultiAgent::{Always, Auto, Off};
        let weather = skillhost_engine::ToolDef {
            name: "weather".into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        };
        let plain = ChatRequest::default();
        assert!(delegates(Auto, &plain, true, true), "other tools offered");
        assert!(!delegates(Auto, &plain, false, true), "a plain question");
        let asked = ChatRequest { multi_agent: Some(true), ..plain.clone() };
        assert!(delegates(Auto, &asked, false, true), "a plain question that asks for it");
        assert!(delegates(Always, &plain, false, true), "--multi-agent always");
        assert!(!delegates(Off, &asked, true, true), "--multi-agent off");
        assert!(!delegates(Always, &plain, true, false), "a model that cannot call tools");
        assert!(!delegates(Always, &ChatRequest { multi_agent: Some(false), ..plain.clone() }, true, true));
        let json = ChatRequest { response_format: skillhost_engine::ResponseFormat::JsonObject, ..plain.clone() };
        assert!(!delegates(Always, &json, true, true), "a JSON answer");
        let with_tools = ChatRequest { tools: vec![weather], ..plain.clone() };
        assert!(delegates(Auto, &with_tools, true, true), "the caller's tools, offered");
        let required = ChatRequest { tool_choice: ToolChoice::Required, ..with_tools.clone() };
        assert!(!delegates(Auto, &required, true, true), "a call to the caller's tools, forced");
        let named = ChatRequest { tool_choice: ToolChoice::Named("weather".into()), ..with_tools.clone() };
        assert!(!delegates(Auto, &named, true, true));
        let spawn = ChatRequest { tool_choice: ToolChoice::Named("spawn_agent".into()), ..with_tools };
        assert!(delegates(Auto, &spawn, true, true), "forcing spawn_agent itself");
    }

    #[test]
    fn places_are_taken_up_to_the_limit_and_not_one_past_it() {
        let counter = AtomicUsize::new(0);
        for _ in 0..MAX_OPEN_AGENTS {
            assert!(reserve(&counter, MAX_OPEN_AGENTS));
        }
        assert!(!reserve(&counter, MAX_OPEN_AGENTS));
        assert_eq!(counter.load(Ordering::SeqCst), MAX_OPEN_AGENTS);
    }

    #[test]
    fn a_report_is_kept_at_the_limit_and_cut_one_past_it() {
        let at = "a".repeat(MAX_REPORT_BYTES);
        assert_eq!(report(&at, ChatFinish::Stop), at);
        let past = report(&"a".repeat(MAX_REPORT_BYTES + 1), ChatFinish::Stop);
        assert!(past.ends_with(&format!("[Report cut at {MAX_REPORT_BYTES} of its {} bytes.]", MAX_REPORT_BYTES + 1)));
        assert!(report("x", ChatFinish::Length).contains("token budget"));
    }
}
