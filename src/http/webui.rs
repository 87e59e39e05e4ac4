//! The Web UI: its page and assets (embedded in the binary), `GET
//! /api/models`, `POST /api/chat` (an SSE stream of content, `skill_step`
//! and `tool_progress` frames ending with a `done` frame, each with an
//! `id:`), and its conversations: listed, read, their turns' events
//! re-read, stopped and deleted. The host owns each turn (see
//! [`crate::http::webui_turns`]).

use std::time::{Duration, Instant};

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use skillhost_actors::request::{AgentPhase, AgentUpdate, SkillStep, Surface, ToolPhase, ToolProgress};

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use skillhost_actors::store::{unix_now, webui as webui_store};
use skillhost_actors::ModelStatus;

use crate::http::body::{content_length, parse_json, read_limited, MAX_JSON_BODY_BYTES};
use crate::http::chat::{guarded, model_info, start};
use crate::http::error::{ApiError, ErrorStyle, PlainError};
use crate::http::openai::{
    finish_reason, rounds_json, timings_json, tool_calls_json, usage_json, ChatCompletionRequest, Spelling,
    WireMessage, WireToolChoice,
};
use crate::http::peer::PeerWatch;
use crate::http::stream::{apply_tool_choice_header, event_stream, sse_response, Encoder, Ending, Finish, LoadNews};
use crate::http::webui_turns::{self, Answer, Stopped};
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

/// `GET /api/models`: the models (the default first; the page's picker
/// offers them all) and what the UI may offer. It waits for the default
/// model, whose facts the page starts from.
pub async fn models(state: web::Data<AppState>) -> Result<HttpResponse, PlainError> {
    model_info(&state, None).await?;
    let code_exec = state.server.exec().is_some_and(|e| e.code_exec);
    let skills = state.server.skills().map(|skills| {
        json!({
            "enabled": true,
            "installable": skills.installable,
            "allowScripts": state.server.allows_scripts(),
            "count": skills.snapshot().skills.len(),
        })
    });
    let view = state.server.models();
    let data: Vec<_> = view
        .models
        .iter()
        .map(|model| match &model.status {
            ModelStatus::Ready { info, .. } => json!({
                "id": info.id,
                "object": "model",
                "loaded": true,
                "context_length": info.n_ctx,
                "architecture": info.architecture,
                "capabilities": {"tools": info.format.capabilities().tools, "codeExec": code_exec},
            }),
            status => json!({
                "id": model.name,
                "object": "model",
                "loaded": false,
                "status": crate::http::ops::status_word(status),
            }),
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": data,
        "skills": skills,
    })))
}

/// The page spells the token budget in camelCase.
const SPELLING: Spelling = Spelling { max_tokens: "maxTokens", surface: Surface::WebUi, ..Spelling::OPENAI };

/// The body of `POST /api/chat`.
#[derive(Debug, Deserialize)]
pub struct WebChatRequest {
    /// The model the page's picker chose; the default when absent.
    model: Option<String>,
    messages: Vec<WireMessage>,
    #[serde(default)]
    skills: Vec<String>,
    skills_discovery: Option<bool>,
    /// `multiAgent` or `multi_agent`: `false` turns delegation off.
    #[serde(alias = "multiAgent")]
    multi_agent: Option<bool>,
    /// `mcpServers` or `mcp_servers`: the MCP servers this turn may use.
    #[serde(alias = "mcpServers")]
    mcp_servers: Option<Vec<String>>,
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
    let body = read_limited(payload, content_length(request), MAX_JSON_BODY_BYTES).await?;
    let web_request: WebChatRequest = parse_json(&body)?;
    // The messages as the page sent them, for the history the store keeps.
    let kept: KeptMessages = serde_json::from_slice(&body).map_err(|err| ApiError::bad_request(err.to_string()))?;
    let asked = web_request.model.clone();
    let (app, request) = (state.clone(), request.clone());
    let work = async move { open_turn(&app, &request, web_request, kept, started).await };
    crate::http::stream::after_load::<WebEncoder>(state, asked.as_deref(), true, work).await
}

/// Starts a checked `POST /api/chat` once its model is loaded.
async fn open_turn(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    web_request: WebChatRequest,
    kept: KeptMessages,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let info = model_info(state, web_request.model.as_deref()).await?;
    // The server issues conversation ids; one it did not issue (or has
    // deleted) starts a new conversation instead of naming someone's folder.
    let given = conversation_id(web_request.conversation_id)?;
    // Another replica's conversation: its workspace is there, not here.
    if let Some(owner) = given.as_deref().and_then(skillhost_actors::replica::elsewhere) {
        let what = format!("conversation {}", given.as_deref().unwrap_or_default());
        return Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&what, owner)));
    }
    let caller = crate::http::access::Caller::of(request);
    let stored = match &given {
        Some(id) => stored_conversation(state, &caller, id).await?,
        None => None,
    };
    let conversation = state.server.conversations().reopen_or_start(given.as_deref(), &caller, stored.is_some());
    let stored = stored.filter(|_| given.as_deref() == Some(conversation.as_str()));
    let mut wire = ChatCompletionRequest {
        model: Some(info.id.clone()),
        messages: web_request.messages,
        skills: web_request.skills,
        skills_discovery: web_request.skills_discovery,
        multi_agent: web_request.multi_agent,
        mcp_servers: web_request.mcp_servers,
        max_tokens: web_request.max_tokens,
        temperature: web_request.temperature,
        tool_choice: web_request.tool_choice,
        ..ChatCompletionRequest::default()
    };
    apply_tool_choice_header(request, &mut wire)?;
    let mut validated = wire.validate_as(&info.id, &SPELLING)?;
    validated.request.conversation = Some(conversation.clone());
    let pending = std::mem::take(&mut validated.attachments);
    let used_files = crate::http::attachments::attach(state, &caller, &mut validated.request, pending).await?;
    if stored.is_some() {
        validated.request.restore = files_to_restore(state, &caller, &conversation).await;
    }
    let last_event = stored.as_ref().map_or(0, |stored| stored.last_event);
    let Some((turn, registration)) = state.webui_turns.begin(&state.background, &conversation, &caller, last_event)
    else {
        return Err(ApiError::Conflict(format!(
            "conversation {conversation} has a turn running; wait for it to end or stop it (DELETE /api/conversations/{conversation}/turn)"
        )));
    };
    let history = json!({
        "messages": kept.messages,
        "skills": validated.request.skills,
        "skills_discovery": web_request.skills_discovery,
        "model": info.id,
    });
    let title = stored.as_ref().map_or_else(|| title_of(&kept.messages), |stored| stored.title.clone());
    let saved = {
        let (owner, id, history, title) = (caller.clone(), conversation.clone(), history.clone(), title.clone());
        state
            .store
            .run(move |conn| {
                let begun = webui_store::begin_turn(conn, &owner, &id, &title, &history, unix_now())?;
                // The files its messages name belong to it from now on,
                // and go when it goes.
                if begun {
                    skillhost_actors::store::files::adopt(conn, &owner, &id, &used_files)?;
                }
                Ok(begun)
            })
            .await
    };
    match saved {
        Ok(true) => {}
        Ok(false) => {
            state.webui_turns.remove(&conversation, Stopped::Deleted);
            return Err(ApiError::NotFound(format!("there is no conversation '{conversation}'")));
        }
        Err(err) => {
            tracing::error!("a Web UI conversation was not stored: {err}");
            state.webui_turns.remove(&conversation, Stopped::Deleted);
            return Err(ApiError::Internal("the server's store failed; the turn was not started".into()));
        }
    }
    let (chat, _peer) = match start(state, request, validated.request).await {
        Ok(started) => started,
        Err(err) => {
            state.webui_turns.remove(&conversation, Stopped::Deleted);
            let (owner, id) = (caller.clone(), conversation.clone());
            let message = json!({"role": "assistant", "content": "", "error": err.to_string()});
            save_end(state.clone(), owner, id, history, message, 0).await;
            return Err(err);
        }
    };
    // The page's reader, counted before the first frame so the turn never
    // looks alone while it starts.
    let reader = turn.relay.subscribe(0, state.keep_alive);
    turn.relay.push(frame(&json!({"conversationId": conversation, "title": title})));
    let answer = Arc::new(Mutex::new(Answer::default()));
    let encoder = WebEncoder {
        app: state.clone(),
        owner: caller.clone(),
        conversation: conversation.clone(),
        history: history.clone(),
        relay: turn.relay.clone(),
        answer: answer.clone(),
    };
    let frames = event_stream(state.clone(), chat, PeerWatch::detached(), started, encoder);
    let (app, background) = (state.clone(), state.background.clone());
    let last = turn.relay.clone();
    let write_end = move |message: Value| -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let last_event = last.last_id() + 1;
            save_end(app, caller, conversation, history, message, last_event).await;
        })
    };
    actix_web::rt::spawn(webui_turns::run(turn, frames, registration, answer, background, write_end));
    Ok(sse_response(reader))
}

/// The messages of a `POST /api/chat` body, kept as sent.
#[derive(Deserialize)]
struct KeptMessages {
    messages: Vec<Value>,
}

/// Longest title a conversation takes from its first message, in characters.
pub const MAX_TITLE_CHARS: usize = 80;
/// Most conversations `GET /api/conversations` lists, the most recent first.
pub const MAX_LISTED: usize = 100;

/// A new conversation's title: the first line of its first user message
/// (its text parts, else the name of its first file), cut at
/// [`MAX_TITLE_CHARS`].
fn title_of(messages: &[Value]) -> String {
    let content = messages.iter().find(|m| m["role"] == "user").map(|m| &m["content"]);
    let first = match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let text: String = parts.iter().filter_map(|part| part["text"].as_str()).collect();
            let file = parts.iter().find_map(|part| part["file"]["filename"].as_str());
            if text.trim().is_empty() {
                file.unwrap_or_default().to_string()
            } else {
                text
            }
        }
        _ => String::new(),
    };
    let line = first.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or("New chat");
    let mut title: String = line.chars().take(MAX_TITLE_CHARS).collect();
    if line.chars().count() > MAX_TITLE_CHARS {
        title.pop();
        title.push('…');
    }
    title
}

/// The caller's stored conversation `id`, if any.
async fn stored_conversation(
    state: &AppState,
    caller: &str,
    id: &str,
) -> Result<Option<webui_store::WebConversation>, ApiError> {
    let (owner, id) = (caller.to_string(), id.to_string());
    state.store.run(move |conn| webui_store::get(conn, &owner, &id)).await.map_err(|err| {
        tracing::error!("the store could not be read: {err}");
        ApiError::Internal("the server's store could not be read".into())
    })
}

/// The most bytes of files a conversation keeps: its workspace's size cap
/// (`--workspace-max-bytes`), and at most an eighth of the store's
/// (`--state-max-bytes`), so one conversation cannot push out the rest.
fn kept_files_budget(state: &AppState) -> Option<u64> {
    let exec = state.server.exec()?;
    let workspace = exec.workspaces.size_cap.unwrap_or(skillhost_actors::workspace::DEFAULT_WORKSPACE_MAX_BYTES);
    Some(workspace.min(state.store.retention().max_bytes / 8))
}

/// Writes the end of a turn: the messages it was sent and its answer, and
/// the files its workspace holds now (copied out through the workspace's
/// handle), in one transaction.
async fn save_end(
    app: web::Data<AppState>,
    owner: String,
    id: String,
    history: Value,
    message: Value,
    last_event: u64,
) {
    let mut body = history;
    if let Some(messages) = body["messages"].as_array_mut() {
        messages.push(message);
    }
    let files = match kept_files_budget(&app) {
        Some(budget) => app.server.conversations().snapshot(&id, budget).await,
        None => None,
    };
    if let Some(snapshot) = files.as_ref().filter(|snapshot| snapshot.left_out > 0) {
        tracing::warn!(conversation = %id, left_out = snapshot.left_out, "files past the kept budget were not kept");
    }
    let written = app
        .store
        .run(move |conn| {
            let files = files.as_ref().map(|snapshot| snapshot.files.as_slice());
            webui_store::end_turn(conn, &owner, &id, &body, last_event, files, unix_now())
        })
        .await;
    if let Err(err) = written {
        tracing::error!("the end of a Web UI turn was not stored: {err}");
    }
}

/// The files kept for a conversation that has no folder now (it went with
/// a restart, or the conversation was pushed out), for its next request
/// to write into the folder it makes.
async fn files_to_restore(state: &AppState, caller: &str, id: &str) -> Option<Arc<Vec<webui_store::SavedFile>>> {
    kept_files_budget(state)?;
    if state.server.conversations().workspace(id).is_some() {
        return None;
    }
    let (owner, id) = (caller.to_string(), id.to_string());
    match state.store.run(move |conn| webui_store::files(conn, &owner, &id)).await {
        Ok(files) if !files.is_empty() => Some(Arc::new(files)),
        Ok(_) => None,
        Err(err) => {
            tracing::error!("a conversation's kept files could not be read: {err}");
            None
        }
    }
}

/// The conversation id in a route's path, checked as a sent one is.
fn path_id(id: &str) -> Result<String, ApiError> {
    conversation_id(Some(id.to_string())).map(Option::unwrap_or_default)
}

/// `GET /api/conversations`: the caller's conversations, the most recent
/// first, without their messages.
pub async fn list_conversations(state: web::Data<AppState>, request: HttpRequest) -> Result<HttpResponse, PlainError> {
    let owner = crate::http::access::Caller::of(&request);
    let listed = state.store.run(move |conn| webui_store::list(conn, &owner, MAX_LISTED)).await.map_err(|err| {
        tracing::error!("the store could not be read: {err}");
        ApiError::Internal("the server's store could not be read".into())
    })?;
    let caller = crate::http::access::Caller::of(&request);
    let data: Vec<Value> = listed
        .iter()
        .map(|conversation| {
            let mut summary = conversation.summary();
            summary["running"] = json!(state.webui_turns.get(&conversation.id, &caller).is_some_and(|t| t.running()));
            summary
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"object": "list", "data": data})))
}

/// `GET /api/conversations/{id}`: a conversation's messages, skills and model,
/// whether a turn runs, and the id of its last frame.
pub async fn get_conversation(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, PlainError> {
    let id = path_id(&id)?;
    let caller = crate::http::access::Caller::of(&request);
    let Some(stored) = stored_conversation(&state, &caller, &id).await? else {
        return Err(ApiError::NotFound(format!("there is no conversation '{id}'")).into());
    };
    let turn = state.webui_turns.get(&id, &caller);
    let last_event = turn.as_ref().map_or(stored.last_event, |turn| turn.relay.last_id().max(stored.last_event));
    let mut body = stored.summary();
    body["running"] = json!(turn.as_ref().is_some_and(|turn| turn.running()));
    body["last_event_id"] = json!(last_event);
    body["messages"] = stored.body["messages"].clone();
    body["skills"] = stored.body["skills"].clone();
    body["skills_discovery"] = stored.body["skills_discovery"].clone();
    // The model its last turn ran on, for the page's picker (absent in a
    // conversation stored before models were remembered).
    body["model"] = stored.body["model"].clone();
    Ok(HttpResponse::Ok().json(body))
}

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    after: Option<String>,
}

/// `GET /api/conversations/{id}/events`: the running turn's frames (or
/// the last turn's, since the server started) from the one after
/// `Last-Event-ID` or `?after=N`, then live until it ends.
pub async fn conversation_events(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, PlainError> {
    let id = path_id(&id)?;
    let after = crate::http::relay::after(&request, query.after.as_deref())
        .map_err(|message| ApiError::bad_param("after", message))?;
    let caller = crate::http::access::Caller::of(&request);
    let Some(turn) = state.webui_turns.get(&id, &caller) else {
        let known = stored_conversation(&state, &caller, &id).await?.is_some();
        return Err(ApiError::NotFound(if known {
            format!("conversation {id} has had no turn since the server started; its messages are at GET /api/conversations/{id}")
        } else {
            format!("there is no conversation '{id}'")
        })
        .into());
    };
    Ok(sse_response(turn.relay.subscribe(after, state.keep_alive)))
}

/// `DELETE /api/conversations/{id}/turn`: Stop. The running turn ends now,
/// what it said so far kept with a note.
pub async fn stop_turn(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, PlainError> {
    let id = path_id(&id)?;
    let caller = crate::http::access::Caller::of(&request);
    let stopped = state.webui_turns.get(&id, &caller).is_some_and(|turn| turn.stop(Stopped::ByUser));
    Ok(HttpResponse::Ok().json(json!({"stopped": stopped})))
}

/// How long closing a conversation waits for its folder to go; a command
/// still running there finishes its call first.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `DELETE /api/conversations/{id}`: the conversation goes: its running
/// turn stops, its history and files leave the store, and its workspace
/// goes after the call it is answering, if any.
pub async fn close_conversation(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, PlainError> {
    if let Some(owner) = skillhost_actors::replica::elsewhere(&id) {
        let what = format!("conversation {id}");
        return Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&what, owner)).into());
    }
    let id = path_id(&id)?;
    // Another caller's conversation is not there for this one to close.
    let caller = crate::http::access::Caller::of(&request);
    if state.webui_turns.get(&id, &caller).is_some() {
        state.webui_turns.remove(&id, Stopped::Deleted);
    }
    let (owner, key) = (caller.clone(), id.clone());
    let deleted = state.store.run(move |conn| webui_store::delete(conn, &owner, &key)).await.unwrap_or_else(|err| {
        tracing::error!("a Web UI conversation was not deleted from the store: {err}");
        false
    });
    let conversations = state.server.conversations();
    let mine = conversations.belongs_to(&id, &caller);
    let closed = mine && conversations.close_and_wait(&id, CLOSE_WAIT).await;
    Ok(HttpResponse::Ok().json(json!({"closed": closed || deleted})))
}

/// The Web UI's frames: an opening one naming the conversation, then
/// `content`, `reasoning`, `skill_step`, `tool_progress` and `tool_calls`
/// objects, and a `done` frame, sent once the turn's history is stored.
struct WebEncoder {
    app: web::Data<AppState>,
    owner: String,
    conversation: String,
    /// The messages the turn was sent, and its settings.
    history: Value,
    relay: Arc<crate::http::relay::Relay>,
    answer: Arc<Mutex<Answer>>,
}

impl WebEncoder {
    fn answer(&self) -> std::sync::MutexGuard<'_, Answer> {
        self.answer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Encoder for WebEncoder {
    fn content(&mut self, text: &str) -> Vec<Bytes> {
        self.answer().content.push_str(text);
        vec![frame(&json!({"content": text}))]
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        self.answer().reasoning.push_str(text);
        vec![frame(&json!({"reasoning": text}))]
    }

    fn tool_calls(&mut self, calls: &[skillhost_engine::ToolCall]) -> Vec<Bytes> {
        vec![frame(&json!({"tool_calls": tool_calls_json(calls)}))]
    }

    fn skill_step(&mut self, step: &SkillStep) -> Vec<Bytes> {
        vec![frame(&skill_step_json(step))]
    }

    fn tool_progress(&mut self, progress: &ToolProgress) -> Vec<Bytes> {
        let json = tool_progress_json(progress);
        if let Some(files) = json["tool_progress"]["files"].as_array() {
            let mut answer = self.answer();
            for file in files {
                answer.artifacts.retain(|known| known["url"] != file["url"]);
                answer.artifacts.push(file.clone());
            }
        }
        vec![frame(&json)]
    }

    fn agent(&mut self, update: &AgentUpdate) -> Vec<Bytes> {
        vec![frame(&agent_json(update))]
    }

    fn finished(&mut self, end: Finish<'_>) -> Ending {
        let done = json!({
            "done": true,
            "finish_reason": finish_reason(end.finish),
            "usage": usage_json(end.usage, end.timings),
            "timings": timings_json(end.timings),
            "rounds": rounds_json(end.rounds),
            "conversationId": self.conversation,
        });
        let message = {
            let mut answer = self.answer();
            answer.done = Some(done.clone());
            answer.stored = true;
            answer.message(None)
        };
        let (app, owner, id, history) =
            (self.app.clone(), self.owner.clone(), self.conversation.clone(), self.history.clone());
        // The final frame's id: every frame before it is in the relay.
        let last_event = self.relay.last_id() + 1;
        Ending::After(Box::pin(async move {
            save_end(app, owner, id, history, message, last_event).await;
            vec![frame(&done)]
        }))
    }

    fn error_frame(err: &ApiError) -> Bytes {
        frame(&err.body(ErrorStyle::Plain))
    }

    /// The page shows it where it shows a turn's activity. It carries no
    /// id: it comes before the turn's relay exists, and nothing reads it again.
    fn load_frame(news: &LoadNews<'_>) -> Bytes {
        frame(&json!({"loading": news.json()}))
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Bytes> {
        self.answer().error = Some(err.to_string());
        vec![Self::error_frame(err)]
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

    #[test]
    fn a_title_is_the_first_line_of_text_or_the_first_files_name() {
        let user = |content: Value| vec![json!({"role": "user", "content": content})];
        assert_eq!(title_of(&user(json!("Plan a trip\nto Rome"))), "Plan a trip");
        let parts = json!([{"type": "text", "text": "Sum it up"}, {"type": "file", "file": {"file_id": "f", "filename": "a.pdf"}}]);
        assert_eq!(title_of(&user(parts)), "Sum it up");
        let only_file = json!([{"type": "file", "file": {"file_id": "f", "filename": "statement.pdf"}}]);
        assert_eq!(title_of(&user(only_file)), "statement.pdf");
        assert_eq!(title_of(&user(json!([]))), "New chat");
        let long = "x".repeat(MAX_TITLE_CHARS + 1);
        assert_eq!(title_of(&user(json!(long))).chars().count(), MAX_TITLE_CHARS);
    }
}
