//! `LoopActor`: runs one chat request as rounds of generate → tools.
//!
//! Each round renders the conversation for the loaded model, streams the
//! model's text to the client (tool-call markup never leaves the server),
//! and reads the calls at the end. Calls to the skill tools are answered in
//! process and the loop generates again; a call to one of the caller's own
//! tools ends the loop and goes back to the caller, unexecuted.

pub mod output;
mod reasoning;

use std::collections::HashSet;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use skillhost_engine::{
    ChatMessage, Conversation, EngineError, FinishReason, GenerateRequest, GenerationEvent, Role, Timings, ToolCall,
    ToolChoice, ToolDef,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::model::ModelBackend;
use crate::request::{
    ChatError, ChatEvent, ChatFinish, ChatRequest, RoundStats, SkillStep, ToolPhase, ToolProgress, Usage,
};
use crate::sandbox::tools::{run_script, shell, ShellMemory};
use crate::sandbox::ExecRuntime;
use crate::skills::prompt::{self, PromptOptions};
use crate::skills::tools::{self, ToolContext};
use crate::skills::Snapshot;
use crate::workspace::{self, files, Workspace};
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

/// Server-wide loop settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoopSettings {
    pub max_rounds: u32,
    /// Advertise unselected skills unless a request says otherwise.
    pub discovery: bool,
    pub inline_selected_bodies: bool,
    pub allow_exec: bool,
    /// Temperature for code turns whose request left it at the default.
    pub code_temperature: Option<f32>,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings {
            max_rounds: DEFAULT_MAX_ROUNDS,
            discovery: true,
            inline_selected_bodies: false,
            allow_exec: false,
            code_temperature: None,
        }
    }
}

pub struct LoopActor;

/// A task aborted when its handle is dropped: a killed loop must not leave
/// its relay (and so its engine sequence) running.
pub struct AbortOnDrop(JoinHandle<()>);

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
    /// Process execution and artifacts, when the server offers them.
    pub exec: Option<Arc<ExecRuntime>>,
    pub events: mpsc::UnboundedSender<ChatEvent>,
}

pub enum LoopMsg {
    /// Sent to itself on start and after each round of tool answers.
    Run,
    /// Forwarded from the engine's event channel by the round's relay task.
    Generated(GenerationEvent),
    /// Sent by the relay task when the engine's channel closed without a finish.
    EngineGone,
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
    exec: Option<Arc<ExecRuntime>>,
    /// The request's private folder; deleted when the loop stops, whatever
    /// ended it (answer, error, rejection, client disconnect).
    /// Shared with the conversation's store when the request belongs to one.
    workspace: Option<Arc<Workspace>>,
    /// The code tools are declared.
    code_tools: bool,
    shell_memory: ShellMemory,
    /// Artifacts of this request are stored under this id.
    run_id: String,
}

impl LoopState {
    /// Sends an event to the HTTP handler. False when the client is gone.
    fn emit(&self, event: ChatEvent) -> bool {
        self.events.send(event).is_ok()
    }

    /// Sends the request's last event. The workspace goes first, so a
    /// client that has its answer never finds the folder still there.
    fn end(&mut self, event: ChatEvent) {
        drop(self.workspace.take());
        self.emit(event);
    }

    /// Sends content, separating rounds with a blank line.
    fn emit_content(&mut self, text: String, round_started: &mut bool) -> bool {
        if text.is_empty() {
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
        EngineError::Stopped | EngineError::Load { .. } => ChatError::Unavailable(err.to_string()),
        EngineError::Decode(_) => ChatError::Engine(err.to_string()),
    }
}

/// Builds what the loop needs from the request, the registry and the model.
fn prepare_state(args: LoopArgs) -> LoopState {
    let LoopArgs { mut request, backend, skills, settings, exec, events } = args;
    let capabilities = backend.info().format.capabilities().clone();
    let caller_tools: HashSet<String> = request.tools.iter().map(|t| t.name.clone()).collect();
    let mut tools = request.tools.clone();
    let mut skill_tools = None;
    let mut base_messages = request.messages.clone();
    let mut extra_prompt = None;
    // A workspace for the code tools, shared by all rounds of the request.
    // Skill scripts without code tools get a scratch folder per call instead.
    let workspace = exec.as_ref().filter(|e| e.code_exec).and_then(|e| {
        let create = || Workspace::create(&e.workspace_base, e.owner);
        let opened = match &request.conversation {
            Some(id) => e.conversations.open(id, create),
            None => create().map(Arc::new),
        };
        opened
            .map_err(
                |err| tracing::error!(error = %err, "cannot create a request workspace; code tools are off for it"),
            )
            .ok()
    });
    let code_tools = capabilities.tools && workspace.is_some() && exec.as_ref().is_some_and(|e| e.code_exec);
    if code_tools {
        // The operator's code temperature replaces only a temperature the
        // request left at the default; an explicit client value wins.
        if let (Some(temperature), false) = (settings.code_temperature, request.temperature_set) {
            request.sampling.temperature = temperature;
        }
        for declaration in workspace::declarations() {
            if caller_tools.contains(&declaration.name) {
                tracing::warn!(tool = %declaration.name, "the caller declares a tool named like a code tool; the caller's wins");
                continue;
            }
            tools.push(declaration);
        }
        extra_prompt = Some(workspace::CODE_PROMPT.to_string());
    }
    if let Some(snapshot) = skills {
        let options = PromptOptions {
            discovery: request.skills_discovery.unwrap_or(settings.discovery),
            inline_selected_bodies: settings.inline_selected_bodies,
            allow_exec: settings.allow_exec,
            context_tokens: Some(backend.info().n_ctx),
            tools: capabilities.tools,
        };
        let block = prompt::plan(&request.skills, &snapshot, &options);
        base_messages = prompt::apply(&request.messages, &block);
        if capabilities.tools && !block.reachable.is_empty() {
            for declaration in tools::declarations(settings.allow_exec, &block.reachable) {
                // The caller's own tool of the same name wins: it has an
                // implementation and an expectation we must not shadow.
                if caller_tools.contains(&declaration.name) {
                    tracing::warn!(tool = %declaration.name, "the caller declares a tool named like a skill tool; the caller's wins");
                    continue;
                }
                tools.push(declaration);
            }
            skill_tools = Some(ToolContext {
                snapshot,
                reachable: block.reachable,
                allow_exec: settings.allow_exec && exec.is_some(),
            });
        }
    }
    if let Some(text) = extra_prompt {
        let block = prompt::Block { text, ..prompt::Block::default() };
        base_messages = prompt::apply_after(&base_messages, &block);
    }
    LoopState {
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
        exec,
        workspace,
        code_tools,
        shell_memory: ShellMemory::default(),
        run_id: format!("run-{}", output::new_call_id().trim_start_matches("call_")),
    }
}

impl Actor for LoopActor {
    type Msg = LoopMsg;
    type State = LoopState;
    type Arguments = LoopArgs;

    async fn pre_start(&self, myself: ActorRef<LoopMsg>, args: LoopArgs) -> Result<LoopState, ActorProcessingErr> {
        myself.cast(LoopMsg::Run)?;
        Ok(prepare_state(args))
    }

    async fn post_stop(&self, _myself: ActorRef<LoopMsg>, state: &mut LoopState) -> Result<(), ActorProcessingErr> {
        state.relay = None;
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
                    state.end(ChatEvent::Failed(err));
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
            LoopMsg::Generated(GenerationEvent::Finished { reason, timings }) => {
                if finish_round(state, reason, timings).await {
                    let _ = myself.cast(LoopMsg::Run);
                } else {
                    myself.stop(None);
                }
            }
            LoopMsg::Generated(GenerationEvent::Failed(err)) => {
                state.end(ChatEvent::Failed(chat_error(err)));
                myself.stop(None);
            }
            LoopMsg::EngineGone => {
                state.end(ChatEvent::Failed(chat_error(EngineError::Stopped)));
                myself.stop(None);
            }
        }
        Ok(())
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
        ToolChoice::None if state.skill_tools.is_some() => ToolChoice::Auto,
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
    let mut messages = state.base_messages.clone();
    messages.extend(state.history.iter().cloned());
    let choice = round_choice(state);
    // With `tool_choice: none` from the caller, only our tools stay visible.
    let tools: Vec<ToolDef> = match (&state.request.tool_choice, &choice) {
        (_, ToolChoice::None) => Vec::new(),
        (ToolChoice::None, _) => {
            state.tools.iter().filter(|t| !state.caller_tools.contains(&t.name)).cloned().collect()
        }
        _ => state.tools.clone(),
    };
    let conversation = Conversation {
        messages: &messages,
        tools: &tools,
        tool_choice: &choice,
        parallel_tool_calls: state.request.parallel_tool_calls,
        response_format: &state.request.response_format,
    };
    let info = Arc::clone(state.backend.info());
    let prepared = info.format.prepare(&conversation).map_err(|err| ChatError::BadRequest(err.to_string()))?;
    let mut stops = state.request.stop.clone();
    stops.extend(prepared.stops);
    let generate = GenerateRequest {
        prompt: prepared.text,
        sampling: state.request.sampling.clone(),
        max_tokens: state.request.max_tokens,
        stops,
        grammar: prepared.grammar,
    };
    let thinking = reasoning::prompt_opens_thinking(&generate.prompt);
    let submitted = match state.backend.submit(generate).await {
        Ok(submitted) => submitted,
        // The last tool results pushed the conversation past the context:
        // the model is told so, in their place, instead of the turn failing.
        Err(EngineError::PromptTooLong { n_prompt, n_ctx }) if shrink_last_results(state, n_prompt, n_ctx) => {
            return Box::pin(start_round(myself, state)).await;
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
const TOO_LONG_NOTE: &str = "[Result left out: too long for the context.]";

/// Ends a round. Returns true when another round should run.
async fn finish_round(state: &mut LoopState, reason: FinishReason, timings: Timings) -> bool {
    let end = state.output.finish();
    for diagnostic in &end.diagnostics {
        tracing::info!(%diagnostic, round = state.round, "the model's tool call was not read");
    }
    if !end.reasoning_delta.is_empty() {
        state.emit(ChatEvent::Reasoning(end.reasoning_delta));
    }
    let mut started = state.output.content_started();
    state.emit_content(end.content_delta, &mut started);
    state.usage.prompt_tokens += state.n_prompt;
    state.usage.completion_tokens += timings.predicted_n;
    state.rounds.push(RoundStats {
        prompt_tokens: state.n_prompt,
        cached_tokens: timings.cache_n,
        generated_tokens: timings.predicted_n,
        time_to_first_token_ms: timings.prompt_ms,
    });
    tracing::debug!(round = state.round, prompt = state.n_prompt, cached = timings.cache_n, "round finished");

    let finish = |state: &mut LoopState, finish: ChatFinish| {
        let rounds = std::mem::take(&mut state.rounds);
        state.end(ChatEvent::Finished { finish, usage: state.usage, timings, rounds });
    };
    if state.final_round {
        let separator = if state.content_sent { "\n\n" } else { "" };
        let rounds = state.settings.max_rounds;
        let note = format!("{separator}[This answer was cut short: the turn used all {rounds} tool rounds.]");
        // The separator is explicit: the note belongs after this round's text.
        started = true;
        state.emit_content(note, &mut started);
        finish(state, ChatFinish::Stop);
        return false;
    }

    let answers_ours = state.skill_tools.is_some() || state.code_tools;
    let (caller_calls, ours): (Vec<ToolCall>, Vec<ToolCall>) =
        end.calls.into_iter().partition(|call| state.caller_tools.contains(&call.name) || !answers_ours);
    if ours.is_empty() && caller_calls.is_empty() {
        let finish_reason = match reason {
            FinishReason::Stop => ChatFinish::Stop,
            FinishReason::Length => ChatFinish::Length,
        };
        finish(state, finish_reason);
        return false;
    }

    let answers = answer_calls(state, &ours).await;
    if !caller_calls.is_empty() {
        // The caller's tools run on the caller's side: the loop ends here.
        state.emit(ChatEvent::ToolCalls(caller_calls));
        finish(state, ChatFinish::ToolCalls);
        return false;
    }

    let mut turn = ChatMessage::new(Role::Assistant, String::new());
    turn.raw = Some(state.output.raw().to_string());
    turn.tool_calls = ours.clone();
    state.history.push(turn);
    for (call, text) in ours.iter().zip(answers) {
        let mut result = ChatMessage::new(Role::Tool, text);
        result.tool_call_id = Some(call.id.clone());
        result.name = Some(call.name.clone());
        state.history.push(result);
    }
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
    true
}

/// Answers our calls (at most [`MAX_SKILL_CALLS_PER_ROUND`] per round) and
/// reports each one; filesystem work runs on blocking threads.
/// Whether two calls' arguments are the same JSON (or the same text when
/// either is not JSON).
fn same_arguments(a: &str, b: &str) -> bool {
    match (serde_json::from_str::<serde_json::Value>(a), serde_json::from_str::<serde_json::Value>(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.trim() == b.trim(),
    }
}

async fn answer_calls(state: &mut LoopState, calls: &[ToolCall]) -> Vec<String> {
    let offered: Vec<String> = state.tools.iter().map(|t| t.name.clone()).collect();
    let mut texts = Vec::with_capacity(calls.len());
    for (index, call) in calls.iter().enumerate() {
        // Small models often repeat a call word for word in one turn. Running
        // it again would repeat a side effect, and repeating a file read can
        // overflow the context on its own.
        let repeat_of = calls[..index]
            .iter()
            .position(|earlier| earlier.name == call.name && same_arguments(&earlier.arguments, &call.arguments));
        let outcome = if index >= MAX_SKILL_CALLS_PER_ROUND {
            tools::Outcome {
                text: format!(
                    "Not run: only {MAX_SKILL_CALLS_PER_ROUND} tool calls are answered per round. Ask again in your next turn if you still need it."
                ),
                ok: false,
                skill: None,
                detail: None,
            }
        } else if let Some(earlier) = repeat_of {
            tools::Outcome {
                text: format!(
                    "Not run again: this call is identical to call {} of this turn; its result above applies.",
                    earlier + 1
                ),
                ok: true,
                skill: None,
                detail: None,
            }
        } else if state.code_tools && workspace::is_code_tool(&call.name) {
            answer_code_call(state, call).await
        } else if call.name == tools::SKILLS_RUN && state.skill_tools.is_some() {
            answer_script_call(state, call).await
        } else if tools::is_skill_tool(&call.name) && state.skill_tools.is_some() {
            let context = state.skill_tools.clone();
            let call = call.clone();
            tokio::task::spawn_blocking(move || context.map(|c| tools::execute(&c, &call)))
                .await
                .ok()
                .flatten()
                .unwrap_or_else(|| tools::Outcome {
                    text: "The tool failed unexpectedly.".into(),
                    ok: false,
                    skill: None,
                    detail: None,
                })
        } else {
            tools::Outcome {
                text: format!(
                    "There is no tool called '{}'. The tools you have are: {}.",
                    call.name,
                    offered.join(", ")
                ),
                ok: false,
                skill: None,
                detail: None,
            }
        };
        tracing::info!(tool = %call.name, skill = ?outcome.skill, detail = ?outcome.detail, ok = outcome.ok, round = state.round, "tool answered");
        if tools::is_skill_tool(&call.name) && repeat_of.is_none() {
            state.emit(ChatEvent::SkillStep(SkillStep {
                agent_id: ROOT_AGENT.into(),
                tool: call.name.clone(),
                skill: outcome.skill,
                detail: outcome.detail,
                ok: outcome.ok,
                round: state.round,
            }));
        }
        texts.push(outcome.text);
    }
    texts
}

fn call_arguments(call: &ToolCall) -> serde_json::Map<String, serde_json::Value> {
    let mut value: serde_json::Value = serde_json::from_str(&call.arguments).unwrap_or_default();
    if let serde_json::Value::String(text) = &value {
        value = serde_json::from_str(text).unwrap_or_default();
    }
    value.as_object().cloned().unwrap_or_default()
}

fn progress(state: &LoopState, phase: ToolPhase, tool: &str, detail: &str, files: Vec<crate::artifacts::Artifact>) {
    let detail: String = detail.chars().take(120).collect();
    state.emit(ChatEvent::ToolProgress(ToolProgress {
        phase,
        tool: tool.to_string(),
        detail,
        run_id: state.run_id.clone(),
        files,
        round: state.round,
    }));
}

/// Copies what changed in the workspace since `since` into the artifacts.
async fn collect_artifacts(
    state: &LoopState,
    root: &std::path::Path,
    since: std::time::SystemTime,
) -> Vec<crate::artifacts::Artifact> {
    let Some(exec) = &state.exec else { return Vec::new() };
    let store = exec.artifacts.clone();
    let run_id = state.run_id.clone();
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || store.collect(&run_id, &root, since)).await.unwrap_or_default()
}

async fn answer_code_call(state: &mut LoopState, call: &ToolCall) -> tools::Outcome {
    let Some(root) = state.workspace.as_ref().map(|w| w.root().to_path_buf()) else {
        return tools::Outcome {
            text: "There is no working folder for this request.".into(),
            ok: false,
            skill: None,
            detail: None,
        };
    };
    let args = call_arguments(call);
    let since = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    let name = call.name.as_str();
    let (text, ok) = if name == workspace::SHELL {
        let Some(exec) = state.exec.clone() else {
            return tools::Outcome {
                text: "Commands cannot run on this server.".into(),
                ok: false,
                skill: None,
                detail: None,
            };
        };
        let command = args.get("command").and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let timeout =
            args.get("timeout_ms").and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())));
        progress(state, ToolPhase::Running, name, &command, Vec::new());
        let outcome = shell(&exec.settings, &root, &mut state.shell_memory, &command, timeout).await;
        (outcome.text, outcome.ok)
    } else {
        let path = args.get("path").and_then(|v| v.as_str()).unwrap_or_default().to_string();
        if name != workspace::READ_FILE {
            progress(state, ToolPhase::Writing, name, &path, Vec::new());
        }
        let tool = name.to_string();
        let work_root = root.clone();
        let outcome = tokio::task::spawn_blocking(move || match tool.as_str() {
            workspace::READ_FILE => files::read_file(&work_root, &args),
            workspace::WRITE_FILE => files::write_file(&work_root, &args),
            workspace::APPLY_PATCH => files::apply_patch(&work_root, &args),
            _ => files::edit_file(&work_root, &args),
        })
        .await
        .unwrap_or_else(|_| files::FileOutcome {
            text: "The tool failed unexpectedly.".into(),
            ok: false,
            written: Vec::new(),
        });
        if let Some(workspace) = &state.workspace {
            for written in &outcome.written {
                workspace.hand_over(&root.join(written));
            }
        }
        if !outcome.written.is_empty() {
            // The files changed, so a rerun of the failing command is a new try.
            state.shell_memory.forget();
        }
        if name == workspace::READ_FILE {
            return tools::Outcome { text: outcome.text, ok: outcome.ok, skill: None, detail: None };
        }
        (outcome.text, outcome.ok)
    };
    let produced = collect_artifacts(state, &root, since).await;
    progress(state, ToolPhase::Finished, name, "", produced);
    tools::Outcome { text, ok, skill: None, detail: None }
}

async fn answer_script_call(state: &mut LoopState, call: &ToolCall) -> tools::Outcome {
    let Some(context) = state.skill_tools.clone() else {
        return tools::Outcome { text: "No skills are available.".into(), ok: false, skill: None, detail: None };
    };
    let script = match tools::prepare_run(&context, call) {
        Ok(script) => script,
        Err(outcome) => return outcome,
    };
    let refused = |text: &str| tools::Outcome { text: text.into(), ok: false, skill: None, detail: None };
    let Some(exec) = state.exec.clone() else { return refused("Scripts cannot run on this server.") };
    // With code tools the script works in the request's workspace, so the
    // model can use what it writes; otherwise in a scratch folder that is
    // deleted (on drop) when this call ends.
    let scratch = match &state.workspace {
        Some(_) => None,
        None => match Workspace::create(&exec.workspace_base, exec.owner) {
            Ok(scratch) => Some(Arc::new(scratch)),
            Err(err) => {
                tracing::error!(error = %err, "cannot create a scratch folder for a skill script");
                return refused("The script did not run: the server cannot create a working folder for it.");
            }
        },
    };
    let Some(root) = scratch.as_ref().or(state.workspace.as_ref()).map(|w| w.root().to_path_buf()) else {
        return refused("Scripts cannot run on this server.");
    };
    let since = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    progress(state, ToolPhase::Running, tools::SKILLS_RUN, &script.path, Vec::new());
    let ran = run_script(&exec.settings, &script.skill.root, &script.path, &script.args, &root).await;
    let produced = collect_artifacts(state, &root, since).await;
    drop(scratch);
    progress(state, ToolPhase::Finished, tools::SKILLS_RUN, &script.path, produced);
    tools::Outcome { text: ran.text, ok: ran.ok, skill: Some(script.skill.id().to_string()), detail: Some(script.path) }
}
