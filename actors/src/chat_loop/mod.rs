//! `LoopActor`: runs one chat request. It renders the prompt for the loaded
//! model, submits it to the engine, turns generated text into content deltas
//! and tool calls, and reports to the HTTP handler through a channel.
//!
//! A request is rounds of generate → tools; with only the caller's own tools
//! there is one round, whose calls are returned to the caller unexecuted.

pub mod output;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use skillhost_engine::{Conversation, Engine, EngineError, FinishReason, GenerateRequest, GenerationEvent, Timings};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::request::{ChatError, ChatEvent, ChatFinish, ChatRequest, Usage};
use output::RoundOutput;

pub struct LoopActor;

pub struct LoopArgs {
    pub request: ChatRequest,
    pub engine: Engine,
    pub events: mpsc::UnboundedSender<ChatEvent>,
}

pub enum LoopMsg {
    /// Sent to itself on start: render the prompt and start the first round.
    Run,
    /// Forwarded from the engine's event channel by the round's relay task.
    Generated(GenerationEvent),
    /// Sent by the relay task when the engine's channel closed without a finish.
    EngineGone,
}

pub struct LoopState {
    /// The request being served.
    request: ChatRequest,
    /// Channel to the engine thread.
    engine: Engine,
    /// Where the HTTP handler reads this request's events.
    events: mpsc::UnboundedSender<ChatEvent>,
    /// Relays engine events into this actor's mailbox; aborting it drops the
    /// engine receiver, which cancels the sequence.
    relay: Option<JoinHandle<()>>,
    /// The current round's output.
    output: RoundOutput,
    /// Prompt tokens of the current round.
    n_prompt: usize,
}

impl LoopState {
    /// Sends an event to the HTTP handler. False when the client is gone.
    fn emit(&self, event: ChatEvent) -> bool {
        self.events.send(event).is_ok()
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

impl Actor for LoopActor {
    type Msg = LoopMsg;
    type State = LoopState;
    type Arguments = LoopArgs;

    async fn pre_start(&self, myself: ActorRef<LoopMsg>, args: LoopArgs) -> Result<LoopState, ActorProcessingErr> {
        myself.cast(LoopMsg::Run)?;
        Ok(LoopState {
            request: args.request,
            engine: args.engine,
            events: args.events,
            relay: None,
            output: RoundOutput::new(None, Vec::new()),
            n_prompt: 0,
        })
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
                if !content.is_empty() && !state.emit(ChatEvent::Content(content)) {
                    myself.stop(Some("client disconnected".into()));
                }
            }
            LoopMsg::Generated(GenerationEvent::Finished { reason, timings }) => {
                finish_round(state, reason, timings);
                myself.stop(None);
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

/// Renders the prompt, submits it, and starts relaying engine events.
async fn start_round(myself: &ActorRef<LoopMsg>, state: &mut LoopState) -> Result<(), ChatError> {
    let request = &state.request;
    let info = state.engine.info();
    let conversation = Conversation {
        messages: &request.messages,
        tools: &request.tools,
        tool_choice: &request.tool_choice,
        parallel_tool_calls: request.parallel_tool_calls,
        response_format: &request.response_format,
    };
    let prepared = info.format.prepare(&conversation).map_err(|err| ChatError::BadRequest(err.to_string()))?;
    let mut stops = request.stop.clone();
    stops.extend(prepared.stops);
    let generate = GenerateRequest {
        prompt: prepared.text,
        sampling: request.sampling.clone(),
        max_tokens: request.max_tokens,
        stops,
        grammar: prepared.grammar,
    };
    let submitted = state.engine.submit(generate).await.map_err(chat_error)?;
    state.n_prompt = submitted.n_prompt;
    let declared = request.tools.iter().map(|t| t.name.clone()).collect();
    state.output = RoundOutput::new(prepared.tool_family, declared);
    if !state.emit(ChatEvent::Accepted) {
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

/// Reads the round's calls and reports the end of the request.
fn finish_round(state: &mut LoopState, reason: FinishReason, timings: Timings) {
    let end = state.output.finish();
    for diagnostic in &end.diagnostics {
        tracing::info!(%diagnostic, "the model's tool call was not read");
    }
    if !end.content_delta.is_empty() {
        state.emit(ChatEvent::Content(end.content_delta));
    }
    let finish = if !end.calls.is_empty() {
        state.emit(ChatEvent::ToolCalls(end.calls));
        ChatFinish::ToolCalls
    } else {
        match reason {
            FinishReason::Stop => ChatFinish::Stop,
            FinishReason::Length => ChatFinish::Length,
        }
    };
    let usage = Usage { prompt_tokens: state.n_prompt, completion_tokens: timings.predicted_n };
    state.emit(ChatEvent::Finished { finish, usage, timings });
}
