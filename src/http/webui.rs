//! The Web UI: its page and assets (embedded in the binary), `GET
//! /api/models`, and `POST /api/chat`, an SSE stream of content,
//! `skill_step` and `tool_progress` frames ending with a `done` frame.

use std::time::{Duration, Instant};

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use skillhost_actors::request::{AgentPhase, AgentUpdate, SkillStep, Surface, ToolPhase, ToolProgress};

use crate::http::body::read_json;
use crate::http::chat::{guarded, ready_model, start};
use crate::http::error::{ApiError, ErrorStyle, PlainError};
use crate::http::openai::{
    finish_reason, rounds_json, timings_json, tool_calls_json, usage_json, ChatCompletionRequest, Spelling,
    WireMessage, WireToolChoice,
};
use crate::http::stream::{apply_tool_choice_header, event_stream, sse_response, Encoder, Ending, Finish};
use crate::http::AppState;

/// A comment frame goes out after this long without any other, so proxies
/// and browsers keep a slow turn's connection open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Longest conversation id a client may send back: an issued id is 34
/// characters, plus `__` and a replica id of up to 32.
pub const MAX_CONVERSATION_ID_LEN: usize = 128;

/// The page's files: path, content type, body.
const ASSETS: [(&str, &str, &str); 4] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../web/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../web/app.js")),
    ("markdown.js", "text/javascript; charset=utf-8", include_str!("../web/markdown.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../web/style.css")),
];

/// Everything the page loads comes from this server; no script is inline.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(name: &str) -> HttpResponse {
    match ASSETS.iter().find(|(file, _, _)| *file == name) {
        Some((_, content_type, body)) => HttpResponse::Ok()
            .content_type(*content_type)
            .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .insert_header((header::REFERRER_POLICY, "no-referrer"))
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .body(*body),
        None => ApiError::NotFound(format!("there is no asset '{name}'")).response(ErrorStyle::Plain),
    }
}

/// `GET /`
pub async fn index() -> HttpResponse {
    asset("index.html")
}

/// `GET /favicon.ico`: browsers ask for it unprompted; the page has none.
pub async fn favicon() -> HttpResponse {
    HttpResponse::NoContent().finish()
}

/// `GET /assets/{name}`
pub async fn assets(name: web::Path<String>) -> HttpResponse {
    asset(&name)
}

/// `GET /api/models`: the loaded model and what the UI may offer.
pub async fn models(state: web::Data<AppState>) -> Result<HttpResponse, PlainError> {
    let info = ready_model(&state)?;
    let code_exec = state.server.exec().is_some_and(|e| e.code_exec);
    let skills = state.server.skills().map(|skills| {
        json!({
            "enabled": true,
            "installable": skills.installable,
            "allowScripts": state.server.allows_scripts(),
            "count": skills.snapshot().skills.len(),
        })
    });
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [{
            "id": info.id,
            "object": "model",
            "context_length": info.n_ctx,
            "architecture": info.architecture,
            "capabilities": {"tools": info.format.capabilities().tools, "codeExec": code_exec},
        }],
        "skills": skills,
    })))
}

/// The page spells the token budget in camelCase.
const SPELLING: Spelling = Spelling { max_tokens: "maxTokens", surface: Surface::WebUi, ..Spelling::OPENAI };

/// The body of `POST /api/chat`.
#[derive(Debug, Deserialize)]
pub struct WebChatRequest {
    messages: Vec<WireMessage>,
    #[serde(default)]
    skills: Vec<String>,
    skills_discovery: Option<bool>,
    /// `multiAgent` or `multi_agent`: `false` turns delegation off.
    #[serde(alias = "multiAgent")]
    multi_agent: Option<bool>,
    #[serde(rename = "maxTokens")]
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    #[serde(rename = "conversationId")]
    conversation_id: Option<String>,
    /// Not sent by the page; lets a test or script hold the first round to a tool.
    tool_choice: Option<WireToolChoice>,
}

/// Checks the spelling of a conversation id the page sent back; whether
/// the server knows it is the conversations store's to say.
fn conversation_id(given: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(id) = given else { return Ok(None) };
    let valid = !id.is_empty()
        && id.len() <= MAX_CONVERSATION_ID_LEN
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(ApiError::bad_param(
            "conversationId",
            format!(
                "'conversationId' must be 1 to {MAX_CONVERSATION_ID_LEN} letters, digits, '-' or '_'; leave it out to start a new conversation"
            ),
        ));
    }
    Ok(Some(id))
}

/// `POST /api/chat`
pub async fn chat(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, PlainError> {
    let started = Instant::now();
    Ok(guarded(&state, "webui", start_chat(&state, &request, payload, started)).await?)
}

async fn start_chat(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    payload: web::Payload,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let web_request: WebChatRequest = read_json(request, payload).await?;
    let info = ready_model(state)?;
    // The server issues conversation ids; one it did not issue (or has
    // closed) starts a new conversation instead of naming someone's folder.
    let given = conversation_id(web_request.conversation_id)?;
    // Another replica's conversation: its workspace is there, not here.
    if let Some(owner) = given.as_deref().and_then(skillhost_actors::replica::elsewhere) {
        let what = format!("conversation {}", given.as_deref().unwrap_or_default());
        return Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&what, owner)));
    }
    let caller = crate::http::access::Caller::of(request);
    let conversation = state.server.conversations().resume_or_start(given.as_deref(), &caller);
    let new_conversation = given.as_deref() != Some(conversation.as_str());
    let mut wire = ChatCompletionRequest {
        messages: web_request.messages,
        skills: web_request.skills,
        skills_discovery: web_request.skills_discovery,
        multi_agent: web_request.multi_agent,
        max_tokens: web_request.max_tokens,
        temperature: web_request.temperature,
        tool_choice: web_request.tool_choice,
        ..ChatCompletionRequest::default()
    };
    apply_tool_choice_header(request, &mut wire)?;
    let mut validated = wire.validate_as(&info.id, &SPELLING)?;
    validated.request.conversation = Some(conversation.clone());
    let (chat, peer) = start(state, request, validated.request).await?;
    let encoder = WebEncoder {
        app: state.clone(),
        conversation,
        new_conversation,
        id_delivered: false,
        keep_alive: state.keep_alive,
    };
    Ok(sse_response(event_stream(state.clone(), chat, peer, started, encoder)))
}

/// How long closing a conversation waits for its folder to go; a command
/// still running there finishes its call first.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `DELETE /api/conversations/{id}`: the conversation's workspace goes, after
/// the call it is answering, if any.
pub async fn close_conversation(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, PlainError> {
    if let Some(owner) = skillhost_actors::replica::elsewhere(&id) {
        let what = format!("conversation {id}");
        return Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&what, owner)).into());
    }
    // Another caller's conversation is not there for this one to close.
    let conversations = state.server.conversations();
    let mine = conversations.belongs_to(&id, &crate::http::access::Caller::of(&request));
    let closed = mine && conversations.close_and_wait(&id, CLOSE_WAIT).await;
    Ok(HttpResponse::Ok().json(json!({"closed": closed})))
}

/// The Web UI's frames: `content`, `reasoning`, `skill_step`,
/// `tool_progress` and `tool_calls` objects, and a `done` frame that names
/// the conversation; comment frames keep a quiet connection open.
struct WebEncoder {
    app: web::Data<AppState>,
    conversation: String,
    /// This turn started the conversation: until its final frame (which
    /// names the id) reaches the client, nobody else knows the id.
    new_conversation: bool,
    id_delivered: bool,
    keep_alive: Duration,
}

impl Drop for WebEncoder {
    /// A client that left before learning a new conversation's id can never
    /// continue it: its workspace goes now, not after the idle limit.
    fn drop(&mut self) {
        if self.new_conversation && !self.id_delivered {
            self.app.server.conversations().close(&self.conversation);
        }
    }
}

impl Encoder for WebEncoder {
    fn content(&mut self, text: &str) -> Vec<Bytes> {
        vec![frame(&json!({"content": text}))]
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        vec![frame(&json!({"reasoning": text}))]
    }

    fn tool_calls(&mut self, calls: &[skillhost_engine::ToolCall]) -> Vec<Bytes> {
        vec![frame(&json!({"tool_calls": tool_calls_json(calls)}))]
    }

    fn skill_step(&mut self, step: &SkillStep) -> Vec<Bytes> {
        vec![frame(&skill_step_json(step))]
    }

    fn tool_progress(&mut self, progress: &ToolProgress) -> Vec<Bytes> {
        vec![frame(&tool_progress_json(progress))]
    }

    fn agent(&mut self, update: &AgentUpdate) -> Vec<Bytes> {
        vec![frame(&agent_json(update))]
    }

    fn finished(&mut self, end: Finish<'_>) -> Ending {
        vec![frame(&json!({
            "done": true,
            "finish_reason": finish_reason(end.finish),
            "usage": usage_json(end.usage, end.timings),
            "timings": timings_json(end.timings),
            "rounds": rounds_json(end.rounds),
            "conversationId": self.conversation,
        }))]
        .into()
    }

    fn error_frame(err: &ApiError) -> Bytes {
        frame(&err.body(ErrorStyle::Plain))
    }

    fn keep_alive(&self) -> Option<(Duration, Bytes)> {
        Some((self.keep_alive, Bytes::from_static(b": keep-alive\n\n")))
    }

    fn delivered(&mut self) {
        self.id_delivered = true;
    }
}

fn frame(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

pub fn skill_step_json(step: &SkillStep) -> Value {
    json!({
        "skill_step": step.tool,
        "agent_id": step.agent_id,
        "skill": step.skill,
        "detail": step.detail,
        "ok": step.ok,
        "round": step.round,
    })
}

pub fn agent_json(update: &AgentUpdate) -> Value {
    let phase = match update.phase {
        AgentPhase::Spawned => "spawned",
        AgentPhase::Working => "working",
        AgentPhase::Reported => "reported",
        AgentPhase::Failed => "failed",
        AgentPhase::Closed => "closed",
    };
    json!({"agent": {
        "agent_id": update.agent_id,
        "phase": phase,
        "detail": update.detail,
        "rounds": update.rounds,
    }})
}

pub fn tool_progress_json(progress: &ToolProgress) -> Value {
    let phase = match progress.phase {
        ToolPhase::Writing => "writing",
        ToolPhase::Running => "running",
        ToolPhase::Finished => "finished",
    };
    let files: Vec<Value> = progress
        .files
        .iter()
        .map(|file| {
            let url = crate::http::artifacts::artifact_url(&progress.run_id, &file.path);
            json!({"path": file.path, "bytes": file.bytes, "url": url})
        })
        .collect();
    json!({"tool_progress": {
        "agent_id": progress.agent_id,
        "phase": phase,
        "tool": progress.tool,
        "detail": progress.detail,
        "round": progress.round,
        "files": files,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_ids_at_and_past_the_longest() {
        let longest = "c".repeat(MAX_CONVERSATION_ID_LEN);
        assert_eq!(conversation_id(Some(longest.clone())).ok().flatten(), Some(longest));
        assert!(conversation_id(Some("c".repeat(MAX_CONVERSATION_ID_LEN + 1))).is_err());
        // An issued id with the longest replica tag fits.
        let issued = format!("c-{:032x}__{}", u128::MAX, "r".repeat(skillhost_actors::replica::MAX_REPLICA_ID_LEN));
        assert!(issued.len() <= MAX_CONVERSATION_ID_LEN);
        assert!(conversation_id(Some("c.1".into())).is_err());
    }
}
