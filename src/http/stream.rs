//! One stream core for every surface: the loop's events in, a surface's
//! encoder out. The core owns what all streams share: the pending frames,
//! waiting for the next event while watching for a client that left, the
//! keep-alive, the metrics (time to first output, skill steps, finished
//! requests, errors) and the panic guard. An encoder only turns events into
//! its wire format's frames.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use actix_web::web;
use bytes::Bytes;
use futures_util::stream::{self, Stream};
use futures_util::StreamExt;
use skillhost_actors::request::{AgentUpdate, RoundStats, SkillStep, ToolProgress};
use skillhost_actors::{ChatEvent, ChatFinish, ChatStream, Usage};
use skillhost_engine::{Timings, ToolCall};

use crate::http::body::read_json;
use crate::http::chat::{model_info, start};
use crate::http::error::ApiError;
use crate::http::openai::{ChatCompletionRequest, Spelling, WireNamed, WireToolChoice};
use crate::http::peer::PeerWatch;
use crate::http::AppState;

/// A request that started: its events, the client watch, the model, and
/// what the surface asked for.
pub struct Begun {
    pub chat: ChatStream,
    pub peer: PeerWatch,
    pub info: std::sync::Arc<skillhost_engine::ModelInfo>,
    pub stream: bool,
    pub include_usage: bool,
}

/// The start every surface shares: read the body as the surface's request
/// type, translate it into the OpenAI request (one validator for all),
/// validate it against the loaded model, naming fields as the surface
/// spells them, and start it.
pub async fn begin<R: serde::de::DeserializeOwned + Send + 'static>(
    state: &web::Data<AppState>,
    request: &actix_web::HttpRequest,
    payload: web::Payload,
    spelling: &Spelling,
    translate: impl FnOnce(R) -> Result<ChatCompletionRequest, ApiError>,
) -> Result<Begun, ApiError> {
    let wire: R = read_json(request, payload).await?;
    begin_translated(state, request, spelling, translate(wire)?).await
}

/// [`begin`] after the surface translated its request itself (a surface
/// whose translation reads the store).
pub async fn begin_translated(
    state: &web::Data<AppState>,
    request: &actix_web::HttpRequest,
    spelling: &Spelling,
    mut translated: ChatCompletionRequest,
) -> Result<Begun, ApiError> {
    let info = model_info(state, translated.model.as_deref()).await?;
    // The name as the model calls itself, so validation and the loop's
    // routing see one spelling.
    translated.model = Some(info.id.clone());
    apply_tool_choice_header(request, &mut translated)?;
    let validated = translated.validate_as(&info.id, spelling)?;
    let mut chat_request = validated.request;
    let owner = crate::http::access::Caller::of(request);
    crate::http::attachments::attach(state, &owner, &mut chat_request, validated.attachments).await?;
    let (chat, peer) = start(state, request, chat_request).await?;
    Ok(Begun { chat, peer, info, stream: validated.stream, include_usage: validated.include_usage })
}

/// A request header that sets `tool_choice` for the first round after a
/// user message, for clients whose own requests cannot (Codex, Claude
/// Code): `none`, `auto`, `required` or a function's name. Their settings
/// can add a header to every request they send.
pub const TOOL_CHOICE_HEADER: &str = "x-skillhost-tool-choice";

/// Sets the request's `tool_choice` from [`TOOL_CHOICE_HEADER`], on every
/// chat route, when the turn is at its first round.
pub fn apply_tool_choice_header(
    request: &actix_web::HttpRequest,
    chat: &mut ChatCompletionRequest,
) -> Result<(), ApiError> {
    if let Some(choice) = header_tool_choice(request)? {
        // Only a turn's first round: a later request carries the results of
        // the calls the header asked for, and forcing again would loop.
        let latest = chat.messages.iter().rev().find(|message| message.role != "system");
        if latest.is_some_and(|message| message.role == "user") {
            chat.tool_choice = Some(choice);
        }
    }
    Ok(())
}

fn header_tool_choice(request: &actix_web::HttpRequest) -> Result<Option<WireToolChoice>, ApiError> {
    let Some(value) = request.headers().get(TOOL_CHOICE_HEADER) else { return Ok(None) };
    let value = value.to_str().map(str::trim).unwrap_or_default();
    if value.is_empty() {
        return Err(ApiError::bad_param(
            TOOL_CHOICE_HEADER,
            format!("the {TOOL_CHOICE_HEADER} header must be none, auto, required or a tool's name"),
        ));
    }
    Ok(Some(match value {
        "none" | "auto" | "required" => WireToolChoice::Mode(value.to_string()),
        name => WireToolChoice::Function { kind: "function".into(), function: WireNamed { name: name.to_string() } },
    }))
}

/// How the request finished, as every encoder's last frame needs it.
pub struct Finish<'a> {
    pub finish: ChatFinish,
    pub usage: &'a Usage,
    pub timings: &'a Timings,
    pub rounds: &'a [RoundStats],
}

/// The last frames of a finished request: at once, or after work they
/// report on (the Responses API says a response is stored only once the
/// store's commit returned).
pub enum Ending {
    Now(Vec<Bytes>),
    After(futures_util::future::BoxFuture<'static, Vec<Bytes>>),
}

impl From<Vec<Bytes>> for Ending {
    fn from(frames: Vec<Bytes>) -> Self {
        Ending::Now(frames)
    }
}

/// A surface's wire format. Each method returns the frames to send, in order.
pub trait Encoder: Send + 'static {
    /// Frames sent before any event.
    fn opening(&mut self) -> Vec<Bytes> {
        Vec::new()
    }
    fn content(&mut self, text: &str) -> Vec<Bytes>;
    fn reasoning(&mut self, text: &str) -> Vec<Bytes>;
    fn tool_calls(&mut self, calls: &[ToolCall]) -> Vec<Bytes>;
    /// A skill tool the loop answered (most surfaces send nothing).
    fn skill_step(&mut self, _step: &SkillStep) -> Vec<Bytes> {
        Vec::new()
    }
    /// A code tool's progress (most surfaces send nothing).
    fn tool_progress(&mut self, _progress: &ToolProgress) -> Vec<Bytes> {
        Vec::new()
    }
    /// A child agent's news (most surfaces send nothing).
    fn agent(&mut self, _update: &AgentUpdate) -> Vec<Bytes> {
        Vec::new()
    }
    /// The last frames of a request that finished.
    fn finished(&mut self, finish: Finish<'_>) -> Ending;
    /// The frame that ends a stream with an error (also after a panic,
    /// when the encoder itself is gone).
    fn error_frame(err: &ApiError) -> Bytes
    where
        Self: Sized;
    /// The last frames of a request that failed after its stream started.
    fn failed(&mut self, err: &ApiError) -> Vec<Bytes>
    where
        Self: Sized,
    {
        vec![Self::error_frame(err)]
    }
    /// A frame sent after this long without one, for surfaces whose
    /// clients or proxies drop quiet connections.
    fn keep_alive(&self) -> Option<(Duration, Bytes)> {
        None
    }
    /// The last frame of a finished request was handed to the connection.
    fn delivered(&mut self) {}
}

struct Core<E: Encoder> {
    app: web::Data<AppState>,
    /// Held so that dropping the response (a client disconnect) stops the request.
    chat: ChatStream,
    peer: PeerWatch,
    started: Instant,
    encoder: E,
    pending: VecDeque<Bytes>,
    /// The last frames, once the work they report on is done.
    ending: Option<futures_util::future::BoxFuture<'static, Vec<Bytes>>>,
    first_output: bool,
    /// No more events will be read; what is pending still goes out.
    done: bool,
    /// The request finished normally (not with an error).
    finished: bool,
}

impl<E: Encoder> Core<E> {
    fn output_started(&mut self) {
        if self.first_output {
            self.first_output = false;
            self.app.metrics.time_to_first_token.observe(self.started.elapsed().as_secs_f64());
        }
    }

    fn on_event(&mut self, event: ChatEvent) {
        let frames = match event {
            // Only a non-streamed answer carries them (see `collect`).
            ChatEvent::Accepted | ChatEvent::ServerTurns { .. } => Vec::new(),
            ChatEvent::Content(text) => {
                self.output_started();
                self.encoder.content(&text)
            }
            ChatEvent::Reasoning(text) => {
                self.output_started();
                self.encoder.reasoning(&text)
            }
            ChatEvent::ToolCalls(calls) => {
                self.output_started();
                self.encoder.tool_calls(&calls)
            }
            ChatEvent::SkillStep(step) => {
                self.app.metrics.skill_step(&step);
                self.encoder.skill_step(&step)
            }
            ChatEvent::ToolProgress(progress) => self.encoder.tool_progress(&progress),
            ChatEvent::Agent(update) => self.encoder.agent(&update),
            ChatEvent::Finished { finish, usage, timings, rounds } => {
                self.app.metrics.finished(usage.prompt_tokens, &timings);
                self.done = true;
                self.finished = true;
                match self.encoder.finished(Finish { finish, usage: &usage, timings: &timings, rounds: &rounds }) {
                    Ending::Now(frames) => frames,
                    Ending::After(later) => {
                        self.ending = Some(later);
                        Vec::new()
                    }
                }
            }
            ChatEvent::Failed(err) => {
                self.fail(&err.into());
                return;
            }
        };
        self.pending.extend(frames);
    }

    /// Errors after the stream started are its last frame.
    fn fail(&mut self, err: &ApiError) {
        self.app.metrics.errors.with_label_values(&[err.kind()]).inc();
        let frames = self.encoder.failed(err);
        self.pending.extend(frames);
        self.done = true;
    }
}

/// The response body of a streamed request: `encoder`'s frames for the
/// events of `chat`, until the request ends or the client leaves.
pub fn event_stream<E: Encoder>(
    app: web::Data<AppState>,
    chat: ChatStream,
    peer: PeerWatch,
    started: Instant,
    mut encoder: E,
) -> impl Stream<Item = Result<Bytes, actix_web::Error>> {
    let pending = encoder.opening().into();
    let core = Core {
        app,
        chat,
        peer,
        started,
        encoder,
        pending,
        ending: None,
        first_output: true,
        done: false,
        finished: false,
    };
    let frames = stream::unfold(core, |mut core| async move {
        loop {
            if let Some(ending) = core.ending.take() {
                let frames = ending.await;
                core.pending.extend(frames);
            }
            if let Some(bytes) = core.pending.pop_front() {
                if core.finished && core.pending.is_empty() {
                    core.encoder.delivered();
                }
                return Some((Ok(bytes), core));
            }
            if core.done {
                return None;
            }
            let next = match core.encoder.keep_alive() {
                Some((quiet, frame)) => match tokio::time::timeout(quiet, core.peer.next_event(&mut core.chat)).await {
                    Ok(next) => next,
                    Err(_) => return Some((Ok(frame), core)),
                },
                None => core.peer.next_event(&mut core.chat).await,
            };
            match next {
                Some(event) => core.on_event(event),
                // The client left: ending the body drops the request.
                None if core.peer.is_closed() => return None,
                None => core.fail(&ApiError::Internal("the request ended without an answer".into())),
            }
        }
    });
    // A panic ends this stream with an error frame, not the worker thread.
    AssertUnwindSafe(frames).catch_unwind().map(|frame| match frame {
        Ok(frame) => frame,
        Err(_) => {
            tracing::error!("a streamed request panicked");
            let err = ApiError::Internal("the request failed unexpectedly; the server log has the details".into());
            Ok(E::error_frame(&err))
        }
    })
}

/// The response that carries a streamed request's frames as SSE.
pub fn sse_response(body: impl Stream<Item = Result<Bytes, actix_web::Error>> + 'static) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body)
}

/// A request run to its end, for surfaces that answer with one object.
pub struct Collected {
    pub text: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
    pub finish: ChatFinish,
    pub usage: Usage,
    pub timings: Timings,
    pub rounds: Vec<RoundStats>,
    /// Files code runs left, as `{path, bytes, url}`, the latest of each.
    pub artifacts: Vec<serde_json::Value>,
    /// With a caller's calls: the turn's rounds of our calls, and the text
    /// the calls were generated as (see `ChatEvent::ServerTurns`).
    pub server_turns: Option<(Vec<skillhost_engine::ChatMessage>, String)>,
}

/// Runs a request to its end, keeping the same metrics a stream keeps.
pub async fn collect(
    app: &AppState,
    mut chat: ChatStream,
    mut peer: PeerWatch,
    started: Instant,
) -> Result<Collected, ApiError> {
    let (mut text, mut reasoning, mut calls, mut artifacts) = (String::new(), String::new(), Vec::new(), Vec::new());
    let mut server_turns = None;
    let mut first_output = true;
    while let Some(event) = peer.next_event(&mut chat).await {
        let output = matches!(event, ChatEvent::Content(_) | ChatEvent::Reasoning(_) | ChatEvent::ToolCalls(_));
        if output && std::mem::take(&mut first_output) {
            app.metrics.time_to_first_token.observe(started.elapsed().as_secs_f64());
        }
        match event {
            ChatEvent::Accepted | ChatEvent::Agent(_) => {}
            ChatEvent::ToolProgress(progress) => {
                for file in progress.files {
                    let url = crate::http::artifacts::artifact_url(&progress.run_id, &file.path);
                    artifacts.retain(|known: &serde_json::Value| known["url"] != url.as_str());
                    artifacts.push(serde_json::json!({"path": file.path, "bytes": file.bytes, "url": url}));
                }
            }
            ChatEvent::Content(delta) => text.push_str(&delta),
            ChatEvent::Reasoning(delta) => reasoning.push_str(&delta),
            ChatEvent::SkillStep(step) => app.metrics.skill_step(&step),
            ChatEvent::ToolCalls(made) => calls.extend(made),
            ChatEvent::ServerTurns { turns, raw } => server_turns = Some((turns, raw)),
            ChatEvent::Finished { finish, usage, timings, rounds } => {
                app.metrics.finished(usage.prompt_tokens, &timings);
                return Ok(Collected {
                    text,
                    reasoning,
                    calls,
                    finish,
                    usage,
                    timings,
                    rounds,
                    artifacts,
                    server_turns,
                });
            }
            ChatEvent::Failed(err) => return Err(err.into()),
        }
    }
    Err(ApiError::Internal("the request ended without an answer".into()))
}
