//! `LoopActor`: runs one chat request as rounds of generate → tools.
//!
//! Each round renders the conversation for the loaded model, streams the
//! model's text to the client (tool-call markup never leaves the server),
//! and reads the calls at the end. Calls to the skill tools are answered in
//! process and the loop generates again; a call to one of the caller's own
//! tools ends the loop and goes back to the caller, unexecuted.

pub mod output;

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
use crate::request::{ChatError, ChatEvent, ChatFinish, ChatRequest, RoundStats, SkillStep, Usage};
use crate::skills::prompt::{self, PromptOptions};
use crate::skills::tools::{self, ToolContext};
use crate::skills::Snapshot;
use output::RoundOutput;

/// Rounds per turn unless the operator says otherwise.
pub const DEFAULT_MAX_ROUNDS: u32 = 8;
/// The range `--skills-max-rounds` accepts.
pub const MIN_ROUNDS: u32 = 1;
pub const MAX_ROUNDS: u32 = 64;
/// Skill tool calls answered per round; a model emitting more is
/// malfunctioning, and answering them all would fill the context.
pub const MAX_SKILL_CALLS_PER_ROUND: usize = 8;
/// Who makes the calls in a request without sub-agents.
pub const ROOT_AGENT: &str = "/root";

/// Server-wide loop settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopSettings {
    pub max_rounds: u32,
    /// Advertise unselected skills unless a request says otherwise.
    pub discovery: bool,
    pub inline_selected_bodies: bool,
    pub allow_exec: bool,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings {
            max_rounds: DEFAULT_MAX_ROUNDS,
            discovery: true,
            inline_selected_bodies: false,
            allow_exec: false,
        }
    }
}

pub struct LoopActor;

pub struct LoopArgs {
    pub request: ChatRequest,
    pub backend: Arc<dyn ModelBackend>,
    /// The registry at the time the request arrived; `None` with skills off.
    pub skills: Option<Arc<Snapshot>>,
    pub settings: LoopSettings,
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
    /// Relays engine events into this actor's mailbox; aborting it drops the
    /// engine receiver, which cancels the sequence.
    relay: Option<JoinHandle<()>>,
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
}

impl LoopState {
    /// Sends an event to the HTTP handler. False when the client is gone.
    fn emit(&self, event: ChatEvent) -> bool {
        self.events.send(event).is_ok()
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
    let LoopArgs { request, backend, skills, settings, events } = args;
    let capabilities = backend.info().format.capabilities().clone();
    let caller_tools: HashSet<String> = request.tools.iter().map(|t| t.name.clone()).collect();
    let mut tools = request.tools.clone();
    let mut skill_tools = None;
    let mut base_messages = request.messages.clone();
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
            skill_tools = Some(ToolContext { snapshot, reachable: block.reachable, allow_exec: settings.allow_exec });
        }
    }
    LoopState {
        request,
        backend,
        events,
        relay: None,
        output: RoundOutput::new(None, Vec::new()),
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
        if let Some(relay) = state.relay.take() {
            relay.abort();
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
                    state.emit(ChatEvent::Failed(err));
                    myself.stop(None);
                }
            }
            LoopMsg::Generated(GenerationEvent::Text(text)) => {
                let content = state.output.push(&text);
                let mut started = state.output.content_started();
                let alive = state.emit_content(content, &mut started);
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
                state.emit(ChatEvent::Failed(chat_error(err)));
                myself.stop(None);
            }
            LoopMsg::EngineGone => {
                state.emit(ChatEvent::Failed(chat_error(EngineError::Stopped)));
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
    if state.final_round || state.tools.is_empty() {
        return ToolChoice::None;
    }
    let first = state.round == 1;
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
    let submitted = state.backend.submit(generate).await.map_err(chat_error)?;
    state.n_prompt = submitted.n_prompt;
    let offered = tools.iter().map(|t| t.name.clone()).collect();
    state.output = RoundOutput::new(prepared.tool_family, offered);
    if state.round == 1 && !state.emit(ChatEvent::Accepted) {
        myself.stop(Some("client disconnected".into()));
        return Ok(());
    }
    let mut events = submitted.events;
    let relay_to = myself.clone();
    state.relay = Some(tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let last = matches!(event, GenerationEvent::Finished { .. } | GenerationEvent::Failed(_));
            if relay_to.cast(LoopMsg::Generated(event)).is_err() || last {
                return;
            }
        }
        let _ = relay_to.cast(LoopMsg::EngineGone);
    }));
    Ok(())
}

/// Ends a round. Returns true when another round should run.
async fn finish_round(state: &mut LoopState, reason: FinishReason, timings: Timings) -> bool {
    let end = state.output.finish();
    for diagnostic in &end.diagnostics {
        tracing::info!(%diagnostic, round = state.round, "the model's tool call was not read");
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
        state.emit(ChatEvent::Finished { finish, usage: state.usage, timings, rounds });
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

    let (caller_calls, ours): (Vec<ToolCall>, Vec<ToolCall>) =
        end.calls.into_iter().partition(|call| state.caller_tools.contains(&call.name) || state.skill_tools.is_none());
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

/// Answers our calls (at most [`MAX_SKILL_CALLS_PER_ROUND`]) off the actor's
/// thread and reports each as a step.
async fn answer_calls(state: &LoopState, calls: &[ToolCall]) -> Vec<String> {
    let Some(context) = state.skill_tools.clone() else {
        return Vec::new();
    };
    let batch: Vec<ToolCall> = calls.to_vec();
    let offered: Vec<String> = state.tools.iter().map(|t| t.name.clone()).collect();
    let answered = tokio::task::spawn_blocking(move || {
        batch
            .iter()
            .enumerate()
            .map(|(index, call)| {
                if index >= MAX_SKILL_CALLS_PER_ROUND {
                    return tools::Outcome {
                        text: format!(
                            "Not run: only {MAX_SKILL_CALLS_PER_ROUND} skill tool calls are answered per round. Ask again in your next turn if you still need it."
                        ),
                        ok: false,
                        skill: None,
                        detail: None,
                    };
                }
                if !tools::is_skill_tool(&call.name) {
                    return tools::Outcome {
                        text: format!("There is no tool called '{}'. The tools you have are: {}.", call.name, offered.join(", ")),
                        ok: false,
                        skill: None,
                        detail: None,
                    };
                }
                tools::execute(&context, call)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    let mut texts = Vec::with_capacity(answered.len());
    for (call, outcome) in calls.iter().zip(answered) {
        tracing::info!(tool = %call.name, skill = ?outcome.skill, detail = ?outcome.detail, ok = outcome.ok, round = state.round, "skill tool answered");
        state.emit(ChatEvent::SkillStep(SkillStep {
            agent_id: ROOT_AGENT.into(),
            tool: call.name.clone(),
            skill: outcome.skill,
            detail: outcome.detail,
            ok: outcome.ok,
            round: state.round,
        }));
        texts.push(outcome.text);
    }
    texts
}
