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
use futures_util::{FutureExt, StreamExt};
use skillhost_actors::request::{AgentUpdate, RoundStats, SkillStep, ToolProgress};
use skillhost_actors::ModelStatus;
use skillhost_actors::{ChatEvent, ChatFinish, ChatStream, Usage};
use skillhost_engine::{Timings, ToolCall};

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

/// The start every surface shares, once the surface has read its request
/// and translated it into the OpenAI request (one validator for all):
/// validate it against the loaded model, naming fields as the surface
/// spells them, and start it.
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
    crate::http::chat::bring_skills(state, &mut chat_request, validated.inline_skills).await?;
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
    /// A frame saying the request's model is still loading: an SSE comment,
    /// which every SSE client skips and a person reading the stream sees.
    fn load_frame(news: &LoadNews<'_>) -> Bytes
    where
        Self: Sized,
    {
        Bytes::from(format!(": {}\n\n", news.sentence()))
    }
    /// The response that carries this surface's frames.
    fn response(body: impl Stream<Item = Result<Bytes, actix_web::Error>> + 'static) -> actix_web::HttpResponse
    where
        Self: Sized,
    {
        sse_response(body)
    }
}

/// How often a streamed request that waits for its model hears how the
/// load goes; the first frame goes as soon as the request is read.
pub const LOAD_NEWS_EVERY: Duration = Duration::from_secs(1);

/// What a streamed request waiting for its model is told.
pub struct LoadNews<'a> {
    pub model: &'a str,
    /// How far the weights are read, 0 to 1 (an upstream says nothing, so 0).
    pub fraction: f32,
    /// Since the request was read.
    pub waited: Duration,
}

impl LoadNews<'_> {
    /// `loading model 'gemma' 45% (3 s)`, for people reading a stream.
    pub fn sentence(&self) -> String {
        let percent = match self.fraction {
            f if f > 0.0 => format!(" {}%", (f * 100.0).floor() as u32),
            _ => String::new(),
        };
        format!("loading model '{}'{percent} ({} s)", self.model, self.waited.as_secs())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "progress": progress_json(self.fraction),
            "waited_ms": self.waited.as_millis() as u64,
        })
    }
}

/// A load's progress as the listings and frames show it: 0 to 1, in
/// thousandths.
pub fn progress_json(fraction: f32) -> serde_json::Value {
    serde_json::json!((f64::from(fraction) * 1000.0).round() / 1000.0)
}

/// Serves a chat request whose model may have to load first. Streamed to a
/// model that is not in memory, the response starts at once and says how
/// the load goes every [`LOAD_NEWS_EVERY`] in the surface's own frames
/// (clients and proxies would otherwise see nothing for as long as a load
/// takes), then carries what `work` answers; an error `work` finds after
/// that (a field the loaded model refuses, a load that failed) is the
/// stream's error frame, as any error after a stream started is. Anything
/// else is `work`, answered as always.
pub async fn after_load<E: Encoder>(
    state: &web::Data<AppState>,
    asked: Option<&str>,
    stream: bool,
    work: impl std::future::Future<Output = Result<actix_web::HttpResponse, ApiError>> + 'static,
) -> Result<actix_web::HttpResponse, ApiError> {
    let loading = stream.then(|| loading(state, asked)).flatten();
    let Some((model, progress)) = loading else { return work.await };
    Ok(E::response(load_then(state.clone(), model, progress, work, E::load_frame, E::error_frame)))
}

/// The model `asked` finds when it is not in memory and a request would
/// load it: its name and its load's progress.
fn loading(state: &AppState, asked: Option<&str>) -> Option<(String, skillhost_engine::LoadProgress)> {
    let models = state.server.models();
    let model = models.find(asked.filter(|name| !name.is_empty()))?;
    matches!(model.status, ModelStatus::Loading | ModelStatus::Unloaded)
        .then(|| (model.name.clone(), model.progress.clone()))
}

/// Load frames until `work` answers, then its body (or its error's frame).
fn load_then(
    app: web::Data<AppState>,
    model: String,
    progress: skillhost_engine::LoadProgress,
    work: impl std::future::Future<Output = Result<actix_web::HttpResponse, ApiError>> + 'static,
    load_frame: fn(&LoadNews<'_>) -> Bytes,
    error_frame: fn(&ApiError) -> Bytes,
) -> impl Stream<Item = Result<Bytes, actix_web::Error>> {
    enum Phase {
        Waiting(
            futures_util::future::LocalBoxFuture<'static, Result<actix_web::HttpResponse, ApiError>>,
            tokio::time::Interval,
        ),
        Body(actix_web::body::BoxBody),
        Done,
    }
    let started = Instant::now();
    // A panic in `work` ends this stream with an error frame, as in `event_stream`.
    let work = AssertUnwindSafe(work)
        .catch_unwind()
        .map(|answer| {
            answer.unwrap_or_else(|_| {
                tracing::error!("a streamed request panicked while its model loaded");
                Err(ApiError::Internal("the request failed unexpectedly; the server log has the details".into()))
            })
        })
        .boxed_local();
    // The first frame goes before anything is awaited (an interval's first
    // tick may wait for the timer's next millisecond, and a load that fails
    // at once would beat it); the rest every `LOAD_NEWS_EVERY`.
    let first = LoadNews { model: &model, fraction: progress.get(), waited: Duration::ZERO };
    let first = load_frame(&first);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + LOAD_NEWS_EVERY, LOAD_NEWS_EVERY);
    // A client that reads slowly gets the latest news, not a burst of old ones.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let rest = stream::unfold(Phase::Waiting(work, ticks), move |mut phase| {
        let (app, model, progress) = (app.clone(), model.clone(), progress.clone());
        async move {
            loop {
                match phase {
                    Phase::Waiting(mut work, mut ticks) => tokio::select! {
                        biased;
                        answer = &mut work => match answer {
                            Ok(response) => phase = Phase::Body(response.into_body()),
                            Err(err) => {
                                app.metrics.errors.with_label_values(&[err.kind()]).inc();
                                return Some((Ok(error_frame(&err)), Phase::Done));
                            }
                        },
                        _ = ticks.tick() => {
                            let news = LoadNews { model: &model, fraction: progress.get(), waited: started.elapsed() };
                            return Some((Ok(load_frame(&news)), Phase::Waiting(work, ticks)));
                        }
                    },
                    Phase::Body(mut body) => {
                        use actix_web::body::MessageBody;
                        let next =
                            futures_util::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_next(cx)).await;
                        return next.map(|chunk| {
                            (
                                chunk.map_err(|err| actix_web::error::ErrorInternalServerError(err.to_string())),
                                Phase::Body(body),
                            )
                        });
                    }
                    Phase::Done => return None,
                }
            }
        }
    });
    stream::once(async move { Ok(first) }).chain(rest)
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
