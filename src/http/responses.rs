//! OpenAI's Responses API, `POST /v1/responses`, for Codex and the `openai`
//! SDK's `client.responses`: input items are translated into the chat
//! request the rest of the server takes (one validator), and the answer
//! comes back as output items, or as the typed event stream through the
//! one stream core. Recent responses are kept in a bounded store so a
//! follow-up can name its predecessor with `previous_response_id`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use rand::distr::{Alphanumeric, SampleString};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use skillhost_actors::request::Surface;
use skillhost_actors::{ChatFinish, Usage};
use skillhost_engine::{schema_limits, Timings, ToolCall};

use crate::http::chat::guarded;
use crate::http::error::{ApiError, OpenAiError};
use crate::http::openai::{
    is_valid_tool_name, ChatCompletionRequest, Spelling, WireContent, WireFunction, WireFunctionCall, WireJsonSchema,
    WireMessage, WireNamed, WireResponseFormat, WireTool, WireToolCall, WireToolChoice, MAX_TOOL_NAME_LEN,
};
use crate::http::stream::{begin, collect, event_stream, sse_response, Begun, Encoder, Finish};
use crate::http::AppState;

/// Responses kept for `previous_response_id`; the oldest goes first.
pub const MAX_STORED_RESPONSES: usize = 256;

/// Recent responses, as the input items a follow-up continues from.
#[derive(Debug, Default)]
pub struct Store {
    entries: Mutex<VecDeque<(String, Vec<Value>)>>,
}

impl Store {
    fn get(&self, id: &str) -> Option<Vec<Value>> {
        let entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.iter().find(|(key, _)| key == id).map(|(_, items)| items.clone())
    }

    fn put(&self, id: String, items: Vec<Value>) {
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if entries.len() >= MAX_STORED_RESPONSES {
            entries.pop_front();
        }
        entries.push_back((id, items));
    }
}

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_output_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    text: Option<Map<String, Value>>,
    #[serde(default)]
    stream: bool,
    store: Option<bool>,
    previous_response_id: Option<String>,
    /// Accepted: a thinking model's block comes back as a reasoning item.
    #[allow(dead_code)]
    reasoning: Option<Map<String, Value>>,
    metadata: Option<Map<String, Value>>,
    #[allow(dead_code)]
    user: Option<String>,
    #[serde(default)]
    skills: Vec<String>,
    skills_discovery: Option<bool>,
    multi_agent: Option<bool>,
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The text of a message's content: a string, or input/output text parts.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (n, part) in parts.iter().enumerate() {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or_default())
                    }
                    Some(kind) => {
                        return Err(ApiError::bad_param(
                            &format!("{at}.content[{n}]"),
                            format!("'{at}.content[{n}]' is '{kind}'; this server's model reads text only"),
                        ))
                    }
                    None => {
                        return Err(ApiError::bad_param(&format!("{at}.content[{n}]"), "a content part needs a 'type'"))
                    }
                }
            }
            Ok(text)
        }
        other => Err(ApiError::bad_param(
            &format!("{at}.content"),
            format!("'{at}.content' must be a string or a list of text parts, got {other}"),
        )),
    }
}

fn text_message(role: &str, text: String) -> WireMessage {
    WireMessage {
        role: role.into(),
        content: Some(WireContent::Text(text)),
        tool_calls: None,
        tool_call_id: None,
        name: None,
        raw: None,
    }
}

/// Input items as chat messages; consecutive function calls become one
/// assistant turn.
fn messages_from_items(items: &[Value]) -> Result<Vec<WireMessage>, ApiError> {
    let mut messages: Vec<WireMessage> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let at = format!("input[{index}]");
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                let role = match role {
                    "user" | "assistant" | "system" => role,
                    "developer" => "system",
                    other => {
                        return Err(ApiError::bad_param(
                            &format!("{at}.role"),
                            format!("'{at}.role' must be user, assistant, system or developer, got {other:?}"),
                        ))
                    }
                };
                let text = content_text(item.get("content").unwrap_or(&Value::Null), &at)?;
                messages.push(text_message(role, text));
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (
                    item.get("call_id").and_then(Value::as_str),
                    item.get("name").and_then(Value::as_str),
                ) else {
                    return Err(ApiError::bad_param(&at, format!("'{at}' (function_call) needs a 'call_id' and a 'name'")));
                };
                // A namespace's function is known to the model by its qualified name.
                let name = match item.get("namespace").and_then(Value::as_str) {
                    Some(namespace) => qualified(namespace, name),
                    None => name.to_string(),
                };
                let call = WireToolCall {
                    id: Some(call_id.to_string()),
                    kind: Some("function".into()),
                    function: WireFunctionCall { name, arguments: item.get("arguments").cloned() },
                };
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" && last.tool_calls.is_some() => {
                        last.tool_calls.get_or_insert_with(Vec::new).push(call);
                    }
                    _ => messages.push(WireMessage {
                        role: "assistant".into(),
                        content: None,
                        tool_calls: Some(vec![call]),
                        tool_call_id: None,
                        name: None,
                        raw: None,
                    }),
                }
            }
            "function_call_output" => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(ApiError::bad_param(&at, format!("'{at}' (function_call_output) needs a 'call_id'")));
                };
                let output = match item.get("output") {
                    Some(Value::String(text)) => text.clone(),
                    Some(other @ Value::Array(_)) => content_text(other, &at)?,
                    _ => String::new(),
                };
                messages.push(WireMessage {
                    role: "tool".into(),
                    content: Some(WireContent::Text(output)),
                    tool_calls: None,
                    tool_call_id: Some(call_id.to_string()),
                    name: None,
                    raw: None,
                });
            }
            // Reasoning from earlier turns is not replayed to the model.
            "reasoning" => {}
            other => {
                return Err(ApiError::bad_param(
                    &format!("{at}.type"),
                    format!("'{at}.type' is '{other}', which this server does not take; send messages, function_call and function_call_output items"),
                ))
            }
        }
    }
    Ok(messages)
}

/// The request's input as items, a plain string being one user message.
fn input_items(input: Option<Value>) -> Result<Vec<Value>, ApiError> {
    match input {
        None => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![json!({"type": "message", "role": "user", "content": text})]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => {
            Err(ApiError::bad_param("input", format!("'input' must be a string or a list of items, got {other}")))
        }
    }
}

/// The functions of tool namespaces by the name the model sees them under
/// (`namespace__function`), with the namespace and function they came from.
type Namespaced = HashMap<String, (String, String)>;

const NAMESPACE_SEPARATOR: &str = "__";

fn qualified(namespace: &str, name: &str) -> String {
    format!("{namespace}{NAMESPACE_SEPARATOR}{name}")
}

/// One function tool, from `tools[…]` or a namespace's `tools[…]` (`at`).
/// Its name and parameters are checked here, as the validator would check
/// them, because namespaces move tools in the flattened list: an error
/// names the path the client sent.
fn function_tool(tool: &Value, at: &str, name: String) -> Result<WireTool, ApiError> {
    if !is_valid_tool_name(&name) {
        return Err(ApiError::bad_param(
            &format!("{at}.name"),
            format!("{at}.name '{name}' must be 1 to {MAX_TOOL_NAME_LEN} letters, digits, '_' or '-'"),
        ));
    }
    let parameters = tool.get("parameters").cloned();
    if let Some(schema) = &parameters {
        let field = format!("{at}.parameters");
        if !schema.is_object() && !schema.is_null() {
            return Err(ApiError::bad_param(&field, format!("{field} must be a JSON Schema object")));
        }
        schema_limits::check(schema).map_err(|why| ApiError::bad_param(&field, format!("{field} {why}")))?;
    }
    Ok(WireTool {
        kind: "function".into(),
        function: WireFunction {
            name,
            description: tool.get("description").and_then(Value::as_str).map(str::to_string),
            parameters,
        },
    })
}

/// The request's tools as function tools: its own function tools first,
/// then the functions of tool namespaces under qualified names.
fn function_tools(tools: Vec<Value>) -> Result<(Vec<WireTool>, Namespaced), ApiError> {
    let mut functions = Vec::new();
    let mut from_namespaces = Vec::new();
    let mut namespaced = Namespaced::new();
    for (n, tool) in tools.iter().enumerate() {
        let at = format!("tools[{n}]");
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or_default();
        let name = tool.get("name").and_then(Value::as_str);
        match kind {
            "function" => {
                let name = name.ok_or_else(|| ApiError::bad_param(&format!("{at}.name"), format!("'{at}' needs a 'name'")))?;
                functions.push(function_tool(tool, &at, name.to_string())?);
            }
            "namespace" => {
                let Some(namespace) = name else {
                    return Err(ApiError::bad_param(&format!("{at}.name"), format!("'{at}' (namespace) needs a 'name'")));
                };
                let Some(members) = tool.get("tools").and_then(Value::as_array) else {
                    return Err(ApiError::bad_param(&format!("{at}.tools"), format!("'{at}' (namespace) needs a list of 'tools'")));
                };
                for (m, member) in members.iter().enumerate() {
                    let at = format!("{at}.tools[{m}]");
                    let member_kind = member.get("type").and_then(Value::as_str).unwrap_or_default();
                    if member_kind != "function" {
                        return Err(ApiError::bad_param(
                            &at,
                            format!("'{at}' is a '{member_kind}' tool; a namespace here may hold function tools only"),
                        ));
                    }
                    let Some(function) = member.get("name").and_then(Value::as_str) else {
                        return Err(ApiError::bad_param(&format!("{at}.name"), format!("'{at}' needs a 'name'")));
                    };
                    let name = qualified(namespace, function);
                    if !is_valid_tool_name(&name) {
                        return Err(ApiError::bad_param(
                            &format!("{at}.name"),
                            format!("'{namespace}' and '{function}' make the tool name '{name}', which must be 1 to {MAX_TOOL_NAME_LEN} letters, digits, '_' or '-'"),
                        ));
                    }
                    from_namespaces.push(function_tool(member, &at, name.clone())?);
                    namespaced.insert(name, (namespace.to_string(), function.to_string()));
                }
            }
            // Codex sends it by default; its settings turn it off.
            "web_search" => {
                return Err(ApiError::bad_param(
                    &at,
                    format!("'{at}' is the built-in tool 'web_search', which this server does not run; declare a function tool instead (in Codex: web_search = \"disabled\")"),
                ))
            }
            other => {
                return Err(ApiError::bad_param(
                    &at,
                    format!("'{at}' is the built-in tool '{other}', which this server does not run; declare a function tool instead"),
                ))
            }
        }
    }
    functions.extend(from_namespaces);
    Ok((functions, namespaced))
}

/// The Responses request as the chat request, the items it continues, and
/// the functions that came from tool namespaces.
fn translate(
    request: ResponsesRequest,
    store: &Store,
) -> Result<(ChatCompletionRequest, Vec<Value>, Namespaced), ApiError> {
    if let Some(owner) = request.previous_response_id.as_deref().and_then(skillhost_actors::replica::elsewhere) {
        let id = request.previous_response_id.as_deref().unwrap_or_default();
        return Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&format!("response {id}"), owner)));
    }
    let mut items = match &request.previous_response_id {
        Some(id) => store.get(id).ok_or_else(|| {
            ApiError::bad_param(
                "previous_response_id",
                format!("no stored response has the id '{id}' (this server keeps the last {MAX_STORED_RESPONSES}, in memory)"),
            )
        })?,
        None => Vec::new(),
    };
    items.extend(input_items(request.input)?);
    if items.is_empty() {
        return Err(ApiError::bad_param("input", "'input' is empty; send a string or at least one item"));
    }
    let mut messages = Vec::new();
    if let Some(instructions) = request.instructions.filter(|text| !text.is_empty()) {
        messages.push(text_message("system", instructions));
    }
    messages.extend(messages_from_items(&items)?);
    let (tools, namespaced) = match request.tools {
        None => (None, Namespaced::new()),
        Some(tools) => {
            let (tools, namespaced) = function_tools(tools)?;
            (Some(tools), namespaced)
        }
    };
    let tool_choice = match request.tool_choice {
        None => None,
        Some(Value::String(mode)) => Some(WireToolChoice::Mode(mode)),
        Some(Value::Object(choice)) => match choice.get("name").and_then(Value::as_str) {
            Some(name) => Some(WireToolChoice::Function {
                kind: "function".into(),
                function: WireNamed { name: name.to_string() },
            }),
            None => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "'tool_choice' as an object names a function: {\"type\": \"function\", \"name\": …}",
                ))
            }
        },
        Some(other) => return Err(ApiError::bad_param("tool_choice", format!("'tool_choice' is invalid: {other}"))),
    };
    let response_format = match request.text.as_ref().and_then(|text| text.get("format")) {
        None => None,
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") | None => None,
            Some("json_object") => Some(WireResponseFormat { kind: "json_object".into(), json_schema: None }),
            Some("json_schema") => Some(WireResponseFormat {
                kind: "json_schema".into(),
                json_schema: Some(WireJsonSchema { schema: format.get("schema").cloned() }),
            }),
            Some(other) => {
                return Err(ApiError::bad_param(
                    "text.format.type",
                    format!("'text.format.type' must be text, json_object or json_schema, got '{other}'"),
                ))
            }
        },
    };
    let wire = ChatCompletionRequest {
        model: request.model,
        messages,
        stream: request.stream,
        temperature: request.temperature,
        top_p: request.top_p,
        max_tokens: request.max_output_tokens,
        tools,
        tool_choice,
        parallel_tool_calls: request.parallel_tool_calls,
        response_format,
        skills: request.skills,
        skills_discovery: request.skills_discovery,
        multi_agent: request.multi_agent,
        ..ChatCompletionRequest::default()
    };
    Ok((wire, items, namespaced))
}

/// The Responses API's budget is `max_output_tokens`, its function tools
/// carry `name` and `parameters` directly, and the answer's schema is
/// `text.format.schema`.
const SPELLING: Spelling = Spelling {
    max_tokens: "max_output_tokens",
    tool: "",
    answer_schema: "text.format.schema",
    surface: Surface::Responses,
    ..Spelling::OPENAI
};

fn usage_json(usage: &Usage, timings: &Timings) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": timings.cache_n},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}

/// What every form of one response shares, and its output items so far.
struct Draft {
    app: web::Data<AppState>,
    id: String,
    created_at: u64,
    model: String,
    /// The items the request continued (stored with the output).
    items: Vec<Value>,
    store: bool,
    previous_response_id: Option<String>,
    metadata: Value,
    parallel_tool_calls: bool,
    namespaced: Namespaced,
    output: Vec<Value>,
}

impl Draft {
    fn response(&self, status: &str, end: Option<(ChatFinish, &Usage, &Timings)>) -> Value {
        let incomplete =
            end.filter(|(finish, _, _)| *finish == ChatFinish::Length).map(|_| json!({"reason": "max_output_tokens"}));
        let status = if incomplete.is_some() { "incomplete" } else { status };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": self.output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "store": self.store,
            "metadata": self.metadata,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "usage": end.map(|(_, usage, timings)| usage_json(usage, timings)),
        })
    }

    /// Keeps the finished response for `previous_response_id`.
    fn keep(&self) {
        if self.store {
            let mut items = self.items.clone();
            items.extend(self.output.iter().filter(|item| item["type"] != "reasoning").cloned());
            self.app.responses.put(self.id.clone(), items);
        }
    }
}

fn message_item(text: &str) -> Value {
    json!({
        "type": "message",
        "id": new_id("msg"),
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

/// A `function_call` item; `incomplete` when the budget ran out (the last
/// call's arguments may be cut short).
fn call_item(call: &ToolCall, namespaced: &Namespaced, finish: ChatFinish) -> Value {
    let status = if finish == ChatFinish::Length { "incomplete" } else { "completed" };
    let mut item = json!({
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    });
    if let Some((namespace, function)) = namespaced.get(&call.name) {
        item["name"] = Value::String(function.clone());
        item["namespace"] = Value::String(namespace.clone());
    }
    item
}

fn reasoning_item(text: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": new_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    })
}

/// `POST /v1/responses`
pub async fn responses(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let started = Instant::now();
    Ok(guarded(&state, "responses", serve(&state, &request, payload, started)).await?)
}

async fn serve(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    payload: web::Payload,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let mut kept = None;
    let app = state.clone();
    let Begun { chat, peer, info, stream, .. } = begin(state, request, payload, &SPELLING, |wire: ResponsesRequest| {
        let store = wire.store.unwrap_or(true);
        let previous = wire.previous_response_id.clone();
        let metadata = wire.metadata.clone().map_or_else(|| json!({}), Value::Object);
        let parallel = wire.parallel_tool_calls.unwrap_or(true);
        let (chat, items, namespaced) = translate(wire, &app.responses)?;
        kept = Some((store, previous, metadata, parallel, items, namespaced));
        Ok(chat)
    })
    .await?;
    let Some((store, previous_response_id, metadata, parallel_tool_calls, items, namespaced)) = kept else {
        return Err(ApiError::Internal("the request was not read".into()));
    };
    let mut draft = Draft {
        app: state.clone(),
        // Stored here only: the id names this replica (`--replica-id`).
        id: skillhost_actors::replica::stamp(new_id("resp")),
        created_at: unix_now(),
        model: info.id.clone(),
        items,
        store,
        previous_response_id,
        metadata,
        parallel_tool_calls,
        namespaced,
        output: Vec::new(),
    };
    if stream {
        let encoder = ResponsesEncoder { draft, sequence: 0, open: None, calls: Vec::new() };
        return Ok(sse_response(event_stream(state.clone(), chat, peer, started, encoder)));
    }
    let done = collect(state, chat, peer, started).await?;
    if !done.reasoning.is_empty() {
        draft.output.push(reasoning_item(&done.reasoning));
    }
    if !done.text.is_empty() || done.calls.is_empty() {
        draft.output.push(message_item(&done.text));
    }
    draft.output.extend(done.calls.iter().map(|call| call_item(call, &draft.namespaced, done.finish)));
    draft.keep();
    Ok(HttpResponse::Ok().json(draft.response("completed", Some((done.finish, &done.usage, &done.timings)))))
}

/// The open output item on the stream: a message or a reasoning item.
#[derive(Debug, Clone, PartialEq)]
enum Open {
    Message { id: String, text: String },
    Reasoning { id: String, text: String },
}

/// The typed events: `response.created`, `response.in_progress`, per item
/// `response.output_item.added`, its parts and deltas, `…done` events, and
/// `response.completed` (`response.incomplete` when the budget ran out);
/// every event carries `sequence_number`.
struct ResponsesEncoder {
    draft: Draft,
    sequence: u64,
    open: Option<Open>,
    /// The caller's calls, sent with the end: whether they are complete
    /// depends on how the request finished, which comes right after them.
    calls: Vec<ToolCall>,
}

impl ResponsesEncoder {
    fn event(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = Value::String(kind.into());
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
    }

    /// Ends the open item, adding it to the output.
    fn close(&mut self, frames: &mut Vec<Bytes>) {
        let index = self.draft.output.len();
        match self.open.take() {
            None => {}
            Some(Open::Message { id, text }) => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                frames.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                ));
                frames.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                ));
                let mut item = message_item(&text);
                item["id"] = Value::String(id);
                frames.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
                self.draft.output.push(item);
            }
            Some(Open::Reasoning { id, text }) => {
                let mut item = reasoning_item(&text);
                item["id"] = Value::String(id);
                frames.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
                self.draft.output.push(item);
            }
        }
    }
}

impl ResponsesEncoder {
    /// The held calls' items, each added, its arguments and done.
    fn send_calls(&mut self, frames: &mut Vec<Bytes>, finish: ChatFinish) {
        for call in std::mem::take(&mut self.calls) {
            let index = self.draft.output.len();
            let item = call_item(&call, &self.draft.namespaced, finish);
            let id = item["id"].clone();
            let mut added = item.clone();
            added["arguments"] = Value::String(String::new());
            added["status"] = Value::String("in_progress".into());
            frames.push(self.event("response.output_item.added", json!({"output_index": index, "item": added})));
            frames.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": call.arguments}),
            ));
            frames.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": call.arguments}),
            ));
            frames.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
            self.draft.output.push(item);
        }
    }
}

impl Encoder for ResponsesEncoder {
    fn opening(&mut self) -> Vec<Bytes> {
        let response = self.draft.response("in_progress", None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn content(&mut self, delta: &str) -> Vec<Bytes> {
        let mut frames = Vec::new();
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close(&mut frames);
            let id = new_id("msg");
            let index = self.draft.output.len();
            let item =
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
            frames.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            frames.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ));
            self.open = Some(Open::Message { id, text: String::new() });
        }
        let index = self.draft.output.len();
        let Some(Open::Message { id, text }) = &mut self.open else { return frames };
        text.push_str(delta);
        let id = id.clone();
        frames.push(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
        frames
    }

    fn reasoning(&mut self, delta: &str) -> Vec<Bytes> {
        let mut frames = Vec::new();
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(&mut frames);
            let id = new_id("rs");
            let index = self.draft.output.len();
            let item = json!({"type": "reasoning", "id": id, "summary": []});
            frames.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
            self.open = Some(Open::Reasoning { id, text: String::new() });
        }
        let index = self.draft.output.len();
        let Some(Open::Reasoning { id, text }) = &mut self.open else { return frames };
        text.push_str(delta);
        let id = id.clone();
        frames.push(self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
        frames
    }

    fn tool_calls(&mut self, calls: &[ToolCall]) -> Vec<Bytes> {
        self.calls.extend_from_slice(calls);
        Vec::new()
    }

    fn finished(&mut self, end: Finish<'_>) -> Vec<Bytes> {
        let mut frames = Vec::new();
        self.close(&mut frames);
        self.send_calls(&mut frames, end.finish);
        self.draft.keep();
        // A response cut by its budget ends with `response.incomplete`
        // (`status: "incomplete"` and the reason), as OpenAI ends it; the
        // SDK's stream helper and Codex end a turn on either event.
        let response = self.draft.response("completed", Some((end.finish, end.usage, end.timings)));
        let kind = if end.finish == ChatFinish::Length { "response.incomplete" } else { "response.completed" };
        frames.push(self.event(kind, json!({"response": response})));
        frames
    }

    fn error_frame(err: &ApiError) -> Bytes {
        let data = json!({"type": "error", "code": err.kind(), "message": err.to_string(), "param": null, "sequence_number": 0});
        Bytes::from(format!("event: error\ndata: {data}\n\n"))
    }

    /// `error`, then `response.failed` with the items so far: clients end
    /// a turn on `response.completed`, `response.incomplete` or
    /// `response.failed`.
    fn failed(&mut self, err: &ApiError) -> Vec<Bytes> {
        let mut frames = Vec::new();
        self.close(&mut frames);
        frames.push(self.event("error", json!({"code": err.kind(), "message": err.to_string(), "param": null})));
        let mut response = self.draft.response("failed", None);
        // The Responses API's codes for a failed response.
        let code = match err {
            ApiError::BadRequest { .. } => "invalid_prompt",
            ApiError::Overloaded(_) | ApiError::Unavailable(_) => "rate_limit_exceeded",
            _ => "server_error",
        };
        response["error"] = json!({"code": code, "message": err.to_string()});
        frames.push(self.event("response.failed", json!({"response": response})));
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_last_responses_and_drops_the_oldest() {
        let store = Store::default();
        for n in 0..MAX_STORED_RESPONSES {
            store.put(format!("resp_{n}"), vec![json!({"n": n})]);
        }
        // At the limit, the first is still there.
        assert_eq!(store.get("resp_0"), Some(vec![json!({"n": 0})]));
        // One past it, the oldest goes and the newest stays.
        store.put("resp_last".into(), Vec::new());
        assert_eq!(store.get("resp_0"), None);
        assert!(store.get("resp_1").is_some() && store.get("resp_last").is_some());
    }

    #[test]
    fn a_namespaced_name_may_be_as_long_as_a_tool_name_and_no_longer() {
        let namespace = |name: String| {
            vec![json!({"type": "namespace", "name": name, "tools": [{"type": "function", "name": "lookup"}]})]
        };
        // "__lookup" is 8 characters.
        let longest = "n".repeat(MAX_TOOL_NAME_LEN - 8);
        let (tools, namespaced) = function_tools(namespace(longest.clone())).unwrap();
        assert_eq!(tools[0].function.name.len(), MAX_TOOL_NAME_LEN);
        assert_eq!(namespaced[&tools[0].function.name], (longest, "lookup".to_string()));
        let err = function_tools(namespace("n".repeat(MAX_TOOL_NAME_LEN - 7))).unwrap_err();
        assert!(err.to_string().contains("must be 1 to 64"), "{err}");
    }

    #[test]
    fn a_namespace_moves_no_error_off_the_path_the_client_sent() {
        let tools = vec![
            json!({"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "lookup"}]}),
            json!({"type": "function", "name": "weather"}),
        ];
        let (tools, _) = function_tools(tools).unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.function.name.as_str()).collect();
        assert_eq!(names, ["weather", "crm__lookup"]);
        // `weather` is the second tool sent, wherever the flattening put it.
        let bad = vec![
            json!({"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "lookup"}]}),
            json!({"type": "function", "name": "weather", "parameters": []}),
        ];
        let err = function_tools(bad).unwrap_err().to_string();
        assert!(err.contains("tools[1].parameters must be a JSON Schema object"), "{err}");
        let bad = vec![
            json!({"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "lookup"}]}),
            json!({"type": "function", "name": "a b"}),
        ];
        let err = function_tools(bad).unwrap_err().to_string();
        assert!(err.contains("tools[1].name 'a b'"), "{err}");
    }

    #[test]
    fn items_become_chat_messages() {
        let items = vec![
            json!({"role": "developer", "content": "Be brief."}),
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}),
            json!({"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"}),
            json!({"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"}),
            json!({"type": "reasoning", "summary": []}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "sunny"}),
        ];
        let messages = messages_from_items(&items).unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(messages[2].tool_calls.as_ref().map(Vec::len), Some(2));
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("c1"));
    }
}
