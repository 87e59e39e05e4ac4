//! `POST /v1/chat/completions`: streaming (SSE) and non-streaming.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::stream::{self, Stream};
use futures_util::{FutureExt, StreamExt};
use rand::distr::{Alphanumeric, SampleString};
use serde_json::{json, Value};
use skillhost_actors::{ChatEvent, ChatFinish, ChatStream, ModelStatus, Usage};
use skillhost_engine::{Timings, ToolCall};
use std::panic::AssertUnwindSafe;

use crate::http::body::read_json;
use crate::http::error::{ApiError, ErrorStyle, OpenAiError};
use crate::http::openai::{
    finish_reason, rounds_json, timings_json, tool_calls_json, usage_json, ChatCompletionRequest,
};
use crate::http::peer::PeerWatch;
use crate::http::AppState;

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn completion_id() -> String {
    format!("chatcmpl-{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// Refuses selected skills that are not registered, naming those that are;
/// drops repeats.
pub fn check_skills(state: &AppState, request: &mut skillhost_actors::ChatRequest) -> Result<(), ApiError> {
    if request.skills.is_empty() {
        return Ok(());
    }
    let Some(skills) = state.server.skills() else {
        return Err(ApiError::bad_param(
            "skills",
            "this server has skills turned off (--no-skills); remove 'skills' from the request",
        ));
    };
    let snapshot = skills.snapshot();
    let unknown: Vec<&str> =
        request.skills.iter().map(String::as_str).filter(|id| snapshot.get(id).is_none()).collect();
    if !unknown.is_empty() {
        let ids = snapshot.ids();
        let available = if ids.is_empty() {
            "none are installed".to_string()
        } else {
            format!("available skills: {}", ids.join(", "))
        };
        return Err(ApiError::bad_param("skills", format!("unknown skill '{}'; {available}", unknown.join("', '"))));
    }
    request.skills.sort();
    request.skills.dedup();
    Ok(())
}

/// The loaded model's id, or 503 while none is ready.
pub fn ready_model(state: &AppState) -> Result<std::sync::Arc<skillhost_engine::ModelInfo>, ApiError> {
    match state.server.status() {
        ModelStatus::Ready { info, .. } => Ok(info),
        ModelStatus::Loading => Err(ApiError::Unavailable("the model is loading; try again shortly".into())),
        ModelStatus::Failed(reason) => Err(ApiError::Unavailable(format!("the model is not available: {reason}"))),
    }
}

/// Runs one chat handler: counts the request under `api`, turns a panic
/// into a 500 for that request (instead of taking down the worker thread
/// and its connections), and counts the error it ends with.
pub async fn guarded(
    state: &AppState,
    api: &str,
    work: impl std::future::Future<Output = Result<HttpResponse, ApiError>>,
) -> Result<HttpResponse, ApiError> {
    state.metrics.requests.with_label_values(&[api]).inc();
    let result = AssertUnwindSafe(work).catch_unwind().await.unwrap_or_else(|_| {
        tracing::error!(api, "a chat request panicked");
        Err(ApiError::Internal("the request failed unexpectedly; the server log has the details".into()))
    });
    if let Err(err) = &result {
        state.metrics.errors.with_label_values(&[err.kind()]).inc();
    }
    result
}

/// Checks the selected skills, starts the request, and waits for its first
/// event, which says whether the engine took the prompt: a bad prompt is a
/// 400 before any stream starts.
pub async fn start(
    state: &AppState,
    request: &HttpRequest,
    mut chat_request: skillhost_actors::ChatRequest,
) -> Result<(ChatStream, PeerWatch), ApiError> {
    check_skills(state, &mut chat_request)?;
    let mut chat = state.server.chat(chat_request).await?;
    let mut peer = PeerWatch::new(request);
    match peer.next_event(&mut chat).await {
        Some(ChatEvent::Accepted) => Ok((chat, peer)),
        Some(ChatEvent::Failed(err)) => Err(err.into()),
        Some(_) | None => Err(ApiError::Internal("the request ended before it started".into())),
    }
}

pub async fn chat_completions(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let started = Instant::now();
    Ok(guarded(&state, "openai", serve(&state, &request, payload, started)).await?)
}

async fn serve(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    payload: web::Payload,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let wire: ChatCompletionRequest = read_json(request, payload).await?;
    let info = ready_model(state)?;
    let validated = wire.validate(&info.id)?;
    let (chat, peer) = start(state, request, validated.request).await?;
    let meta = ResponseMeta { id: completion_id(), created: unix_now(), model: info.id.clone(), started };
    if validated.stream {
        let body = sse_stream(state.clone(), chat, peer, meta, validated.include_usage);
        Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .insert_header(("X-Accel-Buffering", "no"))
            .streaming(body))
    } else {
        collect(state, chat, peer, meta).await
    }
}

/// Fields shared by every chunk of one response.
struct ResponseMeta {
    id: String,
    created: u64,
    model: String,
    started: Instant,
}

impl ResponseMeta {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    }
}

/// Runs a request to the end and answers with one JSON object.
async fn collect(
    state: &web::Data<AppState>,
    mut chat: ChatStream,
    mut peer: PeerWatch,
    meta: ResponseMeta,
) -> Result<HttpResponse, ApiError> {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut first = true;
    let mut artifacts: Vec<Value> = Vec::new();
    while let Some(event) = peer.next_event(&mut chat).await {
        if first && matches!(event, ChatEvent::Content(_) | ChatEvent::Reasoning(_)) {
            first = false;
            state.metrics.time_to_first_token.observe(meta.started.elapsed().as_secs_f64());
        }
        match event {
            ChatEvent::Accepted => {}
            ChatEvent::Content(text) => content.push_str(&text),
            // llama-server's field for a thinking model's reasoning.
            ChatEvent::Reasoning(text) => reasoning.push_str(&text),
            ChatEvent::ToolCalls(new_calls) => calls.extend(new_calls),
            ChatEvent::SkillStep(step) => state.metrics.skill_step(&step),
            ChatEvent::ToolProgress(progress) => {
                for file in progress.files {
                    let url = crate::http::artifacts::artifact_url(&progress.run_id, &file.path);
                    artifacts.retain(|a| a["url"] != url.as_str());
                    artifacts.push(json!({"path": file.path, "bytes": file.bytes, "url": url}));
                }
            }
            ChatEvent::Finished { finish, usage, timings, rounds } => {
                state.metrics.finished(usage.prompt_tokens, &timings);
                let mut message = json!({"role": "assistant", "content": content});
                if !reasoning.is_empty() {
                    message["reasoning_content"] = Value::String(std::mem::take(&mut reasoning));
                }
                if !calls.is_empty() {
                    if content.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = tool_calls_json(&calls);
                }
                let mut body = json!({
                    "id": meta.id,
                    "object": "chat.completion",
                    "created": meta.created,
                    "model": meta.model,
                    "system_fingerprint": null,
                    "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(finish)}],
                    "usage": usage_json(&usage, &timings),
                    "timings": timings_json(&timings),
                    "rounds": rounds_json(&rounds),
                });
                // Only runs that produced files carry the field.
                if !artifacts.is_empty() {
                    body["artifacts"] = Value::Array(artifacts);
                }
                return Ok(HttpResponse::Ok().json(body));
            }
            ChatEvent::Failed(err) => return Err(err.into()),
        }
    }
    Err(ApiError::Internal("the request ended without an answer".into()))
}

/// What the SSE stream still has to send.
struct SseState {
    app: web::Data<AppState>,
    /// Held so that dropping the response (a client disconnect) stops the request.
    chat: ChatStream,
    peer: PeerWatch,
    meta: ResponseMeta,
    include_usage: bool,
    /// Frames ready to send, in order.
    pending: std::collections::VecDeque<Bytes>,
    first_output: bool,
    done: bool,
}

fn frame(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Turns the request's events into `data:` frames ending with `[DONE]`.
fn sse_stream(
    app: web::Data<AppState>,
    chat: ChatStream,
    peer: PeerWatch,
    meta: ResponseMeta,
    include_usage: bool,
) -> impl Stream<Item = Result<Bytes, actix_web::Error>> {
    let mut pending = std::collections::VecDeque::new();
    pending.push_back(frame(&meta.chunk(json!({"role": "assistant", "content": ""}), None)));
    let state = SseState { app, chat, peer, meta, include_usage, pending, first_output: true, done: false };
    let frames = stream::unfold(state, |mut state| async move {
        loop {
            if let Some(bytes) = state.pending.pop_front() {
                return Some((Ok(bytes), state));
            }
            if state.done {
                return None;
            }
            match state.peer.next_event(&mut state.chat).await {
                Some(event) => state.on_event(event),
                // The client left: ending the body drops the request.
                None if state.peer.is_closed() => return None,
                None => {
                    let err = ApiError::Internal("the request ended without an answer".into());
                    state.fail(&err);
                }
            }
        }
    });
    // As in the handler: a panic ends this stream with an error event, not the worker.
    AssertUnwindSafe(frames).catch_unwind().map(|frame| match frame {
        Ok(frame) => frame,
        Err(_) => {
            tracing::error!("a streamed chat request panicked");
            let err = ApiError::Internal("the request failed unexpectedly; the server log has the details".into());
            Ok(self::frame(&err.body(ErrorStyle::OpenAi)))
        }
    })
}

impl SseState {
    fn output_started(&mut self) {
        if self.first_output {
            self.first_output = false;
            self.app.metrics.time_to_first_token.observe(self.meta.started.elapsed().as_secs_f64());
        }
    }

    fn on_event(&mut self, event: ChatEvent) {
        match event {
            ChatEvent::Accepted => {}
            ChatEvent::Content(text) => {
                self.output_started();
                self.pending.push_back(frame(&self.meta.chunk(json!({"content": text}), None)));
            }
            ChatEvent::Reasoning(text) => {
                self.output_started();
                self.pending.push_back(frame(&self.meta.chunk(json!({"reasoning_content": text}), None)));
            }
            ChatEvent::ToolCalls(calls) => {
                self.output_started();
                for (index, call) in calls.iter().enumerate() {
                    let delta = json!({"tool_calls": [{
                        "index": index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }]});
                    self.pending.push_back(frame(&self.meta.chunk(delta, None)));
                }
            }
            // Only standard chunks travel on the OpenAI stream.
            ChatEvent::SkillStep(step) => self.app.metrics.skill_step(&step),
            ChatEvent::ToolProgress(_) => {}
            ChatEvent::Finished { finish, usage, timings, rounds: _ } => self.finish(finish, usage, timings),
            ChatEvent::Failed(err) => self.fail(&err.into()),
        }
    }

    fn finish(&mut self, finish: ChatFinish, usage: Usage, timings: Timings) {
        self.app.metrics.finished(usage.prompt_tokens, &timings);
        let mut last = self.meta.chunk(json!({}), Some(finish_reason(finish)));
        last["timings"] = timings_json(&timings);
        self.pending.push_back(frame(&last));
        if self.include_usage {
            let mut usage_chunk = self.meta.chunk(json!({}), None);
            usage_chunk["choices"] = json!([]);
            usage_chunk["usage"] = usage_json(&usage, &timings);
            self.pending.push_back(frame(&usage_chunk));
        }
        self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.done = true;
    }

    /// Errors after the stream started are a final `data:` event.
    fn fail(&mut self, err: &ApiError) {
        self.app.metrics.errors.with_label_values(&[err.kind()]).inc();
        self.pending.push_back(frame(&err.body(ErrorStyle::OpenAi)));
        self.done = true;
    }
}
