//! `POST /v1/chat/completions`: streaming (SSE) and non-streaming.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::FutureExt;
use rand::distr::{Alphanumeric, SampleString};
use serde_json::{json, Value};
use skillhost_actors::skills::inline::{InlineError, InlineSpec};
use skillhost_actors::{ChatEvent, ChatStream, ModelStatus};
use skillhost_engine::ToolCall;
use std::panic::AssertUnwindSafe;

use crate::http::body::read_json;
use crate::http::error::{ApiError, ErrorStyle, OpenAiError};
use crate::http::openai::{
    finish_reason, rounds_json, server_messages_json, timings_json, tool_calls_json, usage_json, ChatCompletionRequest,
    Spelling, RAW_FIELD,
};
use crate::http::peer::PeerWatch;
use crate::http::stream::{
    self, begin_translated, event_stream, sse_response, Begun, Collected, Encoder, Ending, Finish,
};
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

/// Writes, loads and scans the skills a request brings (`skills_inline`)
/// and hands them to its turn, which alone sees them.
pub async fn bring_skills(
    state: &AppState,
    request: &mut skillhost_actors::ChatRequest,
    specs: Vec<InlineSpec>,
) -> Result<(), ApiError> {
    if specs.is_empty() {
        return Ok(());
    }
    let Some(skills) = state.server.skills() else {
        return Err(ApiError::bad_param(
            "skills_inline",
            "this server has skills turned off (--no-skills); remove 'skills_inline' from the request",
        ));
    };
    let brought = skills.bring(specs).await.map_err(|err| match err {
        InlineError::Rejected(message) => ApiError::bad_param("skills_inline", format!("skills_inline: {message}")),
        InlineError::Unsafe { message, findings } => ApiError::Refused {
            message: format!("skills_inline: {message}"),
            code: "skill_refused",
            details: serde_json::json!({"findings": crate::http::skills::findings_json(&findings)}),
        },
        InlineError::Io(message) => ApiError::Internal(message),
    })?;
    request.brought = Some(brought);
    Ok(())
}

/// The facts of the model a request names (the default for `None` or an
/// empty name), loaded first: a request for a model that is not loaded
/// waits for it. A name this server does not offer is a 404 that lists
/// the ones it does; one that cannot be made ready is a 503.
pub async fn model_info(
    state: &AppState,
    asked: Option<&str>,
) -> Result<std::sync::Arc<skillhost_engine::ModelInfo>, ApiError> {
    let backend = state.server.model(asked.filter(|name| !name.is_empty())).await?;
    Ok(std::sync::Arc::clone(backend.info()))
}

/// `asked` when it names one of this server's models, else `None` (the
/// default): for the surfaces whose clients name models of their own
/// (Anthropic's clients name Claude models).
pub fn served_name(state: &AppState, asked: Option<&str>) -> Option<String> {
    let asked = asked?;
    let bare = asked.strip_suffix(".gguf").unwrap_or(asked);
    state.server.models().models.iter().find(|model| {
        let id = match &model.status {
            ModelStatus::Ready { info, .. } => Some(info.id.as_str()),
            _ => None,
        };
        model.name == bare || id == Some(bare) || model.aliases.iter().any(|alias| alias == bare)
    })?;
    Some(bare.to_string())
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
    let (asked, stream) = (wire.model.clone(), wire.stream);
    let (app, request) = (state.clone(), request.clone());
    let work = async move { respond(&app, &request, wire, started).await };
    stream::after_load::<OpenAiEncoder>(state, asked.as_deref(), stream, work).await
}

async fn respond(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    wire: ChatCompletionRequest,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let Begun { chat, peer, info, stream, include_usage } =
        begin_translated(state, request, &Spelling::OPENAI, wire).await?;
    let meta = ResponseMeta { id: completion_id(), created: unix_now(), model: info.id.clone(), started };
    if stream {
        let started = meta.started;
        let encoder = OpenAiEncoder { meta, include_usage };
        Ok(sse_response(event_stream(state.clone(), chat, peer, started, encoder)))
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
    chat: ChatStream,
    peer: PeerWatch,
    meta: ResponseMeta,
) -> Result<HttpResponse, ApiError> {
    let Collected { text, reasoning, calls, finish, usage, timings, rounds, artifacts, server_turns } =
        stream::collect(state, chat, peer, meta.started).await?;
    let mut message = json!({"role": "assistant", "content": text});
    // llama-server's field for a thinking model's reasoning.
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    if !calls.is_empty() {
        if message["content"] == "" {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = tool_calls_json(&calls);
    }
    // A turn that called our tools before the caller's: the rounds the
    // client never saw, to resend before this message (README, "Replaying
    // the server's calls"), and this message's text as generated.
    let replay = server_turns.filter(|(turns, _)| !turns.is_empty() && !calls.is_empty());
    if let Some((_, raw)) = &replay {
        message[RAW_FIELD] = json!(raw);
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
    if let Some((turns, _)) = &replay {
        body["skillhost_messages"] = server_messages_json(turns);
    }
    Ok(HttpResponse::Ok().json(body))
}

fn frame(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// OpenAI's chunks: a role chunk first, deltas, a last chunk with the
/// finish reason (and llama-server's `timings`), the usage chunk when asked
/// for, and `[DONE]`. Skill steps and tool progress never travel here.
struct OpenAiEncoder {
    meta: ResponseMeta,
    include_usage: bool,
}

impl Encoder for OpenAiEncoder {
    fn opening(&mut self) -> Vec<Bytes> {
        vec![frame(&self.meta.chunk(json!({"role": "assistant", "content": ""}), None))]
    }

    fn content(&mut self, text: &str) -> Vec<Bytes> {
        vec![frame(&self.meta.chunk(json!({"content": text}), None))]
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        vec![frame(&self.meta.chunk(json!({"reasoning_content": text}), None))]
    }

    fn tool_calls(&mut self, calls: &[ToolCall]) -> Vec<Bytes> {
        calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                let delta = json!({"tool_calls": [{
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }]});
                frame(&self.meta.chunk(delta, None))
            })
            .collect()
    }

    fn finished(&mut self, end: Finish<'_>) -> Ending {
        let mut last = self.meta.chunk(json!({}), Some(finish_reason(end.finish)));
        last["timings"] = timings_json(end.timings);
        let mut frames = vec![frame(&last)];
        if self.include_usage {
            let mut usage_chunk = self.meta.chunk(json!({}), None);
            usage_chunk["choices"] = json!([]);
            usage_chunk["usage"] = usage_json(end.usage, end.timings);
            frames.push(frame(&usage_chunk));
        }
        frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
        frames.into()
    }

    fn error_frame(err: &ApiError) -> Bytes {
        frame(&err.body(ErrorStyle::OpenAi))
    }
}
