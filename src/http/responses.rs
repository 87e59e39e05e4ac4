//! OpenAI's Responses API: `POST /v1/responses`, for Codex, the Agents
//! SDK and the `openai` SDK's `client.responses`, and the stored
//! responses behind it (`GET`/`DELETE /v1/responses/{id}`, `GET
//! /v1/responses/{id}/input_items`). Input items are translated into the
//! chat request the rest of the server takes (one validator), and the
//! answer comes back as output items, or as the typed event stream through
//! the one stream core. With `store` (the default) the response and its
//! items go to the state folder's store, where `previous_response_id` and
//! `item_reference` items find them, after a restart too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use rand::distr::{Alphanumeric, SampleString};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use skillhost_actors::request::Surface;
use skillhost_actors::store::conversations;
use skillhost_actors::store::responses::{self as stored, Appended, ResponseRecord};
use skillhost_actors::store::unix_now;
use skillhost_actors::{ChatFinish, Usage};
use skillhost_engine::{schema_limits, Timings, ToolCall};

use crate::http::access::Caller;
use crate::http::body::read_json;
use crate::http::chat::{guarded, model_info};
use crate::http::error::{ApiError, OpenAiError};
use crate::http::openai::{
    is_valid_tool_name, ChatCompletionRequest, Spelling, WireContent, WireFile, WireFunction, WireFunctionCall,
    WireImageUrl, WireJsonSchema, WireMessage, WireNamed, WirePart, WireResponseFormat, WireTool, WireToolCall,
    WireToolChoice, MAX_TOOL_NAME_LEN,
};
use crate::http::stream::{begin_translated, collect, event_stream, sse_response, Begun, Encoder, Ending, Finish};
use crate::http::AppState;

/// Most input items one page of `GET /v1/responses/{id}/input_items`
/// holds, and how many it holds when the request names no `limit`.
pub const MAX_ITEMS_PAGE: usize = 100;
pub const DEFAULT_ITEMS_PAGE: usize = 20;

/// The body of `POST /v1/responses`: every field OpenAI defines is named
/// (and Codex's `client_metadata`), so one this server does not know is a
/// 400 that names it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_output_tokens: Option<u32>,
    max_tool_calls: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    top_logprobs: Option<u32>,
    text: Option<Map<String, Value>>,
    #[serde(default)]
    stream: bool,
    /// `include_obfuscation` pads deltas against length side channels on
    /// OpenAI's network; a local server has none to hide.
    #[allow(dead_code)]
    stream_options: Option<Map<String, Value>>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    background: Option<bool>,
    conversation: Option<Value>,
    prompt: Option<Value>,
    /// What to add to the output; what this server has to give (reasoning
    /// text) is always there.
    #[allow(dead_code)]
    include: Option<Vec<String>>,
    truncation: Option<String>,
    /// Accepted: a thinking model's block comes back as a reasoning item.
    reasoning: Option<Map<String, Value>>,
    metadata: Option<Map<String, Value>>,
    user: Option<String>,
    safety_identifier: Option<String>,
    prompt_cache_key: Option<String>,
    /// Every prompt prefix is cached here as long as memory allows.
    #[allow(dead_code)]
    prompt_cache_retention: Option<String>,
    /// Accepted: this server has one tier, reported as `default`.
    #[allow(dead_code)]
    service_tier: Option<String>,
    /// Codex's own field (its session and turn ids, for OpenAI's logs),
    /// sent on every request; nothing here reads it.
    #[allow(dead_code)]
    client_metadata: Option<Map<String, Value>>,
    #[serde(default)]
    skills: Vec<String>,
    skills_discovery: Option<bool>,
    multi_agent: Option<bool>,
    /// The operator's MCP servers this request may use (default: all).
    mcp_servers: Option<Vec<String>>,
}

impl ResponsesRequest {
    /// The fields this server reads but cannot honour, each a 400 that
    /// says so, rather than an answer that ignored them.
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let unsupported = |field: &str, why: &str| Err(ApiError::bad_param(field, format!("'{field}' {why}")));
        if self.background == Some(true) && self.store == Some(false) {
            return unsupported("background", "needs 'store': a background response is read back by its id");
        }
        if self.conversation.is_some() && self.previous_response_id.is_some() {
            return unsupported(
                "conversation",
                "and 'previous_response_id' cannot both be set: a turn continues a conversation or a response",
            );
        }
        if self.prompt.is_some() {
            return unsupported("prompt", "names a prompt template stored at OpenAI; send 'instructions' and 'input'");
        }
        if self.max_tool_calls.is_some() {
            return unsupported(
                "max_tool_calls",
                "is not supported; --skills-max-rounds bounds the server's tool rounds",
            );
        }
        if self.top_logprobs.is_some_and(|n| n > 0) {
            return unsupported("top_logprobs", "must be 0: this server does not return log probabilities");
        }
        match self.truncation.as_deref() {
            None | Some("disabled" | "auto") => {}
            Some(other) => return unsupported("truncation", &format!("must be auto or disabled, got '{other}'")),
        }
        Ok(())
    }
}

impl ResponsesRequest {
    /// The id `conversation` names: a string, or `{"id": …}`.
    fn conversation_id(&self) -> Result<Option<String>, ApiError> {
        let bad = |got: &Value| {
            ApiError::bad_param("conversation", format!("'conversation' must be an id or {{\"id\": …}}, got {got}"))
        };
        match &self.conversation {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(id)) => Ok(Some(id.clone())),
            Some(Value::Object(fields)) => match fields.get("id") {
                Some(Value::String(id)) if fields.len() == 1 => Ok(Some(id.clone())),
                _ => Err(bad(self.conversation.as_ref().unwrap_or(&Value::Null))),
            },
            Some(other) => Err(bad(other)),
        }
    }
}

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
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
                            format!(
                                "'{at}.content[{n}]' is '{kind}'; only a user message's content carries files here"
                            ),
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

/// A message's content as the chat request's: a string, or its parts, with
/// `input_file` and `input_image` parts as file and image parts.
fn content_parts(content: &Value, at: &str) -> Result<WireContent, ApiError> {
    let Value::Array(parts) = content else { return content_text(content, at).map(WireContent::Text) };
    let carries_files = parts.iter().any(|part| matches!(part["type"].as_str(), Some("input_file" | "input_image")));
    if !carries_files {
        return content_text(content, at).map(WireContent::Text);
    }
    let mut wire = Vec::with_capacity(parts.len());
    for (n, part) in parts.iter().enumerate() {
        let here = format!("{at}.content[{n}]");
        let text = |field: &str| part.get(field).and_then(Value::as_str).map(str::to_string);
        let converted = match part["type"].as_str() {
            Some("input_text" | "output_text" | "text") => {
                WirePart { kind: "text".into(), text: Some(text("text").unwrap_or_default()), ..WirePart::default() }
            }
            Some("input_file") => {
                if text("file_url").is_some() {
                    return Err(crate::http::attachments::no_urls(&format!("{here}.file_url")));
                }
                let file =
                    WireFile { file_id: text("file_id"), file_data: text("file_data"), filename: text("filename") };
                WirePart { kind: "file".into(), file: Some(file), ..WirePart::default() }
            }
            Some("input_image") => match (text("image_url"), text("file_id")) {
                (Some(url), None) => WirePart {
                    kind: "image_url".into(),
                    image_url: Some(WireImageUrl { url, detail: None }),
                    ..WirePart::default()
                },
                (None, Some(id)) => WirePart {
                    kind: "file".into(),
                    file: Some(WireFile { file_id: Some(id), ..WireFile::default() }),
                    ..WirePart::default()
                },
                _ => {
                    return Err(ApiError::bad_param(
                        &here,
                        format!("'{here}' (input_image) needs one of 'image_url' (a data: URL) or 'file_id'"),
                    ))
                }
            },
            Some(kind) => {
                return Err(ApiError::bad_param(
                    &here,
                    format!("'{here}' is '{kind}'; this server takes input_text, input_file and input_image parts"),
                ))
            }
            None => return Err(ApiError::bad_param(&here, "a content part needs a 'type'")),
        };
        wire.push(WirePart { at: Some(here), ..converted });
    }
    Ok(WireContent::Parts(wire))
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
pub(crate) fn messages_from_items(items: &[Value], field: &str) -> Result<Vec<WireMessage>, ApiError> {
    let mut messages: Vec<WireMessage> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let at = format!("{field}[{index}]");
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
                let content = content_parts(item.get("content").unwrap_or(&Value::Null), &at)?;
                messages.push(WireMessage { content: Some(content), ..text_message(role, String::new()) });
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
            // The summary `POST /v1/responses/compact` made of earlier turns,
            // in the assistant's words, where those turns were.
            "compaction" => {
                let summary = crate::http::compact::summary_of(item, &at)?;
                messages.push(text_message("assistant", summary));
            }
            other => {
                return Err(ApiError::bad_param(
                    &format!("{at}.type"),
                    format!("'{at}.type' is '{other}', which this server does not take; send messages, function_call, function_call_output and compaction items"),
                ))
            }
        }
    }
    Ok(messages)
}

/// The request's input as items, a plain string being one user message.
pub(crate) fn input_items(input: Option<Value>) -> Result<Vec<Value>, ApiError> {
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

/// The response header naming the hosted tools a request declared that
/// were left out.
pub const DROPPED_HEADER: &str = "x-skillhost-dropped-tools";

/// What a request's tools may name besides functions: the operator's MCP
/// servers (a `mcp` tool) and the hosted tools mapped to an MCP tool.
#[derive(Default)]
pub(crate) struct ToolSources {
    pub(crate) mcp: Option<std::sync::Arc<skillhost_actors::tools::mcp::hub::McpHub>>,
    pub(crate) hosted: std::sync::Arc<skillhost_actors::tools::mcp::hosted::HostedTools>,
    /// The registry, for the versions a `shell` tool's skills name.
    pub(crate) skills: Option<skillhost_actors::SkillsHandle>,
}

impl ToolSources {
    pub(crate) fn of(state: &AppState) -> ToolSources {
        ToolSources {
            mcp: state.server.mcp().cloned(),
            hosted: std::sync::Arc::clone(&state.hosted),
            skills: state.server.skills().cloned(),
        }
    }
}

/// What the request's tools asked of the server beyond functions.
#[derive(Debug, Default)]
pub(crate) struct ToolExtras {
    /// Hosted tools left out of the prompt (named in a header).
    pub(crate) dropped: Vec<String>,
    /// The MCP servers and tools the request's `mcp` tools and mapped
    /// hosted tools chose; `None` when it named none.
    pub(crate) mcp: Option<skillhost_actors::tools::mcp::McpSelection>,
    /// The skills a `shell` tool's environment selects or brings.
    pub(crate) skills: crate::http::hosted_skills::Selected,
}

/// A Responses `mcp` tool for one of the operator's servers: its label must
/// be configured, and a `server_url` must be the one configured for it (the
/// server never connects where a request says).
fn mcp_tool(tool: &Value, at: &str, sources: &ToolSources, extras: &mut ToolExtras) -> Result<(), ApiError> {
    let label = tool.get("server_label").and_then(Value::as_str).unwrap_or_default();
    let configured = sources.mcp.as_ref().map(|hub| hub.names()).unwrap_or_default();
    if !configured.iter().any(|name| name == label) {
        let known = if configured.is_empty() { "none are configured".to_string() } else { configured.join(", ") };
        return Err(ApiError::bad_param(
            &format!("{at}.server_label"),
            format!("'{at}.server_label' must name one of this server's MCP servers ({known}), not '{label}'"),
        ));
    }
    if let Some(url) = tool.get("server_url").filter(|url| !url.is_null()) {
        let own = sources.mcp.as_ref().and_then(|hub| hub.url_of(label));
        if url.as_str() != own.as_deref() {
            return Err(ApiError::bad_param(
                &format!("{at}.server_url"),
                format!("'{at}.server_url' is not the URL configured for '{label}'; this server connects only to the MCP servers its operator configured (leave server_url out)"),
            ));
        }
    }
    let selection = extras.mcp.get_or_insert_with(|| skillhost_actors::tools::mcp::McpSelection {
        servers: Some(Vec::new()),
        ..Default::default()
    });
    selection.servers.get_or_insert_with(Vec::new).push(label.to_string());
    let allowed = match tool.get("allowed_tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(names)) => Some(names.clone()),
        Some(Value::Object(filter)) => filter.get("tool_names").and_then(Value::as_array).cloned(),
        Some(_) => None,
    };
    if let Some(names) = allowed {
        let names: Option<Vec<String>> = names.iter().map(|n| n.as_str().map(str::to_string)).collect();
        let Some(names) = names else {
            return Err(ApiError::bad_param(
                &format!("{at}.allowed_tools"),
                format!("'{at}.allowed_tools' must list tool names"),
            ));
        };
        selection.allowed_tools.insert(label.to_string(), names);
    }
    Ok(())
}

/// The request's tools as function tools: its own function tools first,
/// then the functions of tool namespaces under qualified names.
#[cfg(test)]
fn function_tools(tools: Vec<Value>) -> Result<(Vec<WireTool>, Namespaced), ApiError> {
    function_tools_with(tools, &ToolSources::default()).map(|(functions, namespaced, _)| (functions, namespaced))
}

/// [`function_tools`], reading `mcp` tools and hosted tools against what
/// the operator configured.
fn function_tools_with(
    tools: Vec<Value>,
    sources: &ToolSources,
) -> Result<(Vec<WireTool>, Namespaced, ToolExtras), ApiError> {
    let mut extras = ToolExtras::default();
    let mut functions = Vec::new();
    let mut from_namespaces = Vec::new();
    let mut namespaced = Namespaced::new();
    for (n, tool) in tools.iter().enumerate() {
        let at = format!("tools[{n}]");
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or_default();
        let name = tool.get("name").and_then(Value::as_str);
        match kind {
            "function" => {
                let name =
                    name.ok_or_else(|| ApiError::bad_param(&format!("{at}.name"), format!("'{at}' needs a 'name'")))?;
                functions.push(function_tool(tool, &at, name.to_string())?);
            }
            "namespace" => {
                let Some(namespace) = name else {
                    return Err(ApiError::bad_param(
                        &format!("{at}.name"),
                        format!("'{at}' (namespace) needs a 'name'"),
                    ));
                };
                let Some(members) = tool.get("tools").and_then(Value::as_array) else {
                    return Err(ApiError::bad_param(
                        &format!("{at}.tools"),
                        format!("'{at}' (namespace) needs a list of 'tools'"),
                    ));
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
            "mcp" => mcp_tool(tool, &at, sources, &mut extras)?,
            // OpenAI's hosted shell (a container environment): commands run
            // in this server's own sandbox, so the tool only says which
            // skills the turn has. A shell the client runs itself (no
            // environment, or `local`) is a hosted tool like any other.
            "shell" if crate::http::hosted_skills::is_container(tool) => {
                crate::http::hosted_skills::shell_environment(tool, &at, sources.skills.as_ref(), &mut extras.skills)?
            }
            // A hosted tool (Codex sends web_search by default): the MCP
            // tool the operator mapped it to, or left out and named, or
            // refused under --strict-hosted-tools.
            other => match sources.hosted.resolve(other) {
                skillhost_actors::tools::mcp::hosted::Hosted::Mapped { server, tool } => {
                    if let Some(selection) = extras.mcp.as_mut() {
                        selection.servers.get_or_insert_with(Vec::new).push(server.clone());
                        if let Some(allowed) = selection.allowed_tools.get_mut(&server) {
                            allowed.push(tool);
                        }
                    }
                }
                skillhost_actors::tools::mcp::hosted::Hosted::Dropped => {
                    tracing::info!(tool = %other, "a hosted tool the request declared is left out: no MCP tool is mapped to it (--hosted-tool)");
                    extras.dropped.push(other.to_string());
                }
                skillhost_actors::tools::mcp::hosted::Hosted::Refused => {
                    let hint = if other == "web_search" { " (in Codex: web_search = \"disabled\")" } else { "" };
                    return Err(ApiError::bad_param(
                        &at,
                        format!("'{at}' is the built-in tool '{other}', which this server does not run; declare a function tool instead{hint}, or have the operator map it to an MCP tool with --hosted-tool {other}=mcp__SERVER__TOOL"),
                    ));
                }
            },
        }
    }
    functions.extend(from_namespaces);
    Ok((functions, namespaced, extras))
}

/// An input item as it is stored: with an `id` (made here when the client
/// sent none, as OpenAI does) and a message's text as a list of parts.
pub(crate) fn stored_item(mut item: Value) -> Value {
    let Some(fields) = item.as_object_mut() else { return item };
    let kind = fields.get("type").and_then(Value::as_str).unwrap_or("message").to_string();
    if kind == "message" {
        fields.insert("type".into(), json!("message"));
        let role = fields.get("role").and_then(Value::as_str).unwrap_or_default();
        let part = if role == "assistant" { "output_text" } else { "input_text" };
        if let Some(Value::String(text)) = fields.get("content") {
            let parts = json!([{"type": part, "text": text}]);
            fields.insert("content".into(), parts);
        }
        fields.entry("status").or_insert(json!("completed"));
    }
    if !fields.get("id").is_some_and(Value::is_string) {
        let prefix = match kind.as_str() {
            "function_call" => "fc",
            "function_call_output" => "fco",
            "reasoning" => "rs",
            "compaction" => "cmp",
            _ => "msg",
        };
        fields.insert("id".into(), json!(new_id(prefix)));
    }
    item
}

/// What a request continues from, read from the store: the items of its
/// `previous_response_id` chain, and its input with every `item_reference`
/// replaced by the caller's stored item of that id.
pub(crate) async fn resolve(
    state: &AppState,
    owner: &str,
    previous: Option<&str>,
    conversation: Option<&str>,
    input: Vec<Value>,
) -> Result<(Vec<Value>, Vec<Value>), ApiError> {
    // Another replica's response or conversation is in that replica's store.
    if let Some(id) = previous {
        owned_id(id)?;
    }
    if let Some(id) = conversation {
        owned_id(id)?;
    }
    let references: Vec<(usize, String)> = input
        .iter()
        .enumerate()
        .filter(|(_, item)| item.get("type").and_then(Value::as_str) == Some("item_reference"))
        .map(|(n, item)| (n, item.get("id").and_then(Value::as_str).unwrap_or_default().to_string()))
        .collect();
    if previous.is_none() && conversation.is_none() && references.is_empty() {
        return Ok((Vec::new(), input.into_iter().map(stored_item).collect()));
    }
    let (owner, previous_id, conversation_id) =
        (owner.to_string(), previous.map(str::to_string), conversation.map(str::to_string));
    let wanted: Vec<String> = references.iter().map(|(_, id)| id.clone()).collect();
    let (context, found) = state
        .store
        .run(move |conn| {
            let context = match (&previous_id, &conversation_id) {
                (Some(id), _) => stored::context(conn, &owner, id)?,
                (None, Some(id)) => conversations::items(conn, &owner, id)?,
                (None, None) => Some(Vec::new()),
            };
            let mut found = Vec::new();
            for id in &wanted {
                found.push(stored::item(conn, &owner, id)?);
            }
            Ok((context, found))
        })
        .await
        .map_err(store_failed)?;
    let Some(context) = context else {
        if let Some(id) = conversation {
            return Err(no_conversation(id));
        }
        return Err(previous_not_found(previous.unwrap_or_default()));
    };
    let mut input = input;
    for ((n, id), item) in references.into_iter().zip(found) {
        let Some(item) = item else {
            let at = format!("input[{n}]");
            let message = if id.is_empty() {
                format!("'{at}' (item_reference) needs an 'id'")
            } else {
                format!("'{at}' refers to the item '{id}', which no stored response of yours holds")
            };
            return Err(ApiError::bad_param(&at, message));
        };
        input[n] = item;
    }
    Ok((context, input.into_iter().map(stored_item).collect()))
}

/// A `previous_response_id` that names nothing this caller can continue,
/// under the code OpenAI's clients look for to start the chain again.
pub(crate) fn previous_not_found(id: &str) -> ApiError {
    ApiError::bad_param(
        "previous_response_id",
        format!("no stored response has the id '{id}' (it was never stored, was deleted, or expired)"),
    )
    .with_code("previous_response_not_found")
}

pub(crate) fn no_conversation(id: &str) -> ApiError {
    ApiError::NotFound(format!("no conversation has the id '{id}' (it was never made, was deleted, or expired)"))
}

/// The store failed under a request: a server fault, said plainly.
pub(crate) fn store_failed(err: skillhost_actors::store::StoreError) -> ApiError {
    tracing::error!("the store failed: {err}");
    ApiError::Internal(format!("the server's store failed: {err}"))
}

/// The Responses request as the chat request, and the functions that came
/// from tool namespaces; `context` is what it continues, `input` its own
/// items (both resolved, see [`resolve`]).
fn translate(
    request: ResponsesRequest,
    context: &[Value],
    input: &[Value],
    sources: &ToolSources,
) -> Result<(ChatCompletionRequest, Namespaced, ToolExtras), ApiError> {
    if context.is_empty() && input.is_empty() {
        return Err(ApiError::bad_param("input", "'input' is empty; send a string or at least one item"));
    }
    let items: Vec<Value> = context.iter().chain(input).cloned().collect();
    let mut messages = Vec::new();
    if let Some(instructions) = request.instructions.filter(|text| !text.is_empty()) {
        messages.push(text_message("system", instructions));
    }
    messages.extend(messages_from_items(&items, "input")?);
    let (tools, namespaced, extras) = match request.tools {
        None => (None, Namespaced::new(), ToolExtras::default()),
        Some(tools) => {
            let (tools, namespaced, extras) = function_tools_with(tools, sources)?;
            (Some(tools), namespaced, extras)
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
        // As sent, echoed as sent (f64); the engine samples in f32.
        temperature: request.temperature.map(|t| t as f32),
        top_p: request.top_p.map(|p| p as f32),
        presence_penalty: request.presence_penalty.map(|p| p as f32),
        frequency_penalty: request.frequency_penalty.map(|p| p as f32),
        max_tokens: request.max_output_tokens,
        tools,
        tool_choice,
        parallel_tool_calls: request.parallel_tool_calls,
        response_format,
        skills: request.skills.into_iter().chain(extras.skills.skills.iter().cloned()).collect(),
        skills_inline: extras.skills.inline.clone(),
        skills_discovery: request.skills_discovery,
        multi_agent: request.multi_agent,
        mcp_servers: request.mcp_servers,
        ..ChatCompletionRequest::default()
    };
    let mut wire = wire;
    if let Some(selection) = &extras.mcp {
        // The request's `mcp` tools choose the servers (with any its own
        // mcp_servers named), and may narrow their tools.
        let mut servers = wire.mcp_servers.take().unwrap_or_default();
        servers.extend(selection.servers.iter().flatten().cloned());
        servers.sort();
        servers.dedup();
        wire.mcp_servers = Some(servers);
        wire.mcp_allowed_tools = selection.allowed_tools.clone();
    }
    Ok((wire, namespaced, extras))
}

/// The Responses API's budget is `max_output_tokens`, its function tools
/// carry `name` and `parameters` directly, and the answer's schema is
/// `text.format.schema`.
pub(crate) const SPELLING: Spelling = Spelling {
    max_tokens: "max_output_tokens",
    tool: "",
    answer_schema: "text.format.schema",
    surface: Surface::Responses,
    ..Spelling::OPENAI
};

pub(crate) fn usage_json(usage: &Usage, timings: &Timings) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": timings.cache_n},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}

/// What the response object repeats of its request, as the Open
/// Responses specification lists it: what the request set, else what
/// this server used.
#[derive(Debug, Clone)]
struct Echo {
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    presence_penalty: f64,
    frequency_penalty: f64,
    top_logprobs: u32,
    reasoning: Value,
    text: Value,
    tools: Value,
    tool_choice: Value,
    truncation: String,
    service_tier: String,
    safety_identifier: Option<String>,
    prompt_cache_key: Option<String>,
    user: Option<String>,
    metadata: Value,
    parallel_tool_calls: bool,
    background: bool,
}

impl Echo {
    fn of(request: &ResponsesRequest) -> Echo {
        let reasoning = request.reasoning.as_ref();
        let setting = |name: &str| reasoning.and_then(|r| r.get(name)).cloned().unwrap_or(Value::Null);
        Echo {
            instructions: request.instructions.clone(),
            max_output_tokens: request.max_output_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            presence_penalty: request.presence_penalty.unwrap_or(0.0),
            frequency_penalty: request.frequency_penalty.unwrap_or(0.0),
            top_logprobs: request.top_logprobs.unwrap_or(0),
            reasoning: json!({"effort": setting("effort"), "summary": setting("summary")}),
            text: match &request.text {
                Some(text) if text.contains_key("format") => Value::Object(text.clone()),
                Some(text) => {
                    let mut text = text.clone();
                    text.insert("format".into(), json!({"type": "text"}));
                    Value::Object(text)
                }
                None => json!({"format": {"type": "text"}}),
            },
            tools: Value::Array(request.tools.clone().unwrap_or_default()),
            tool_choice: request.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            truncation: request.truncation.clone().unwrap_or_else(|| "disabled".into()),
            // One tier here; the name OpenAI reports for its standard one.
            service_tier: "default".into(),
            safety_identifier: request.safety_identifier.clone(),
            prompt_cache_key: request.prompt_cache_key.clone(),
            user: request.user.clone(),
            metadata: request.metadata.clone().map_or_else(|| json!({}), Value::Object),
            parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
            background: request.background.unwrap_or(false),
        }
    }
}

/// How a response ended, for its object.
#[derive(Debug, Clone, Copy)]
struct End<'a> {
    finish: ChatFinish,
    usage: &'a Usage,
    timings: &'a Timings,
}

/// What every form of one response shares, and its output items so far.
#[derive(Debug, Clone)]
struct Draft {
    id: String,
    /// The caller it is stored for.
    owner: String,
    created_at: u64,
    model: String,
    /// The request's own input items, as stored.
    input: Vec<Value>,
    store: bool,
    previous_response_id: Option<String>,
    /// The conversation the turn continues and adds its items to.
    conversation: Option<String>,
    echo: Echo,
    namespaced: Namespaced,
    output: Vec<Value>,
    /// Hosted tools the request declared that were left out.
    dropped: Vec<String>,
}

impl Draft {
    /// The response object: `in_progress` before `end`, then `completed`,
    /// or `incomplete` when the token budget ran out.
    fn response(&self, end: Option<End<'_>>) -> Value {
        let incomplete = end.and_then(|end| incomplete_reason(end.finish)).map(|reason| json!({"reason": reason}));
        let status = match (end, &incomplete) {
            (None, _) => "in_progress",
            (Some(_), Some(_)) => "incomplete",
            (Some(_), None) => "completed",
        };
        let echo = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": end.map(|_| unix_now()),
            "status": status,
            "background": echo.background,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": echo.instructions,
            "max_output_tokens": echo.max_output_tokens,
            "max_tool_calls": null,
            "model": self.model,
            "output": self.output,
            "parallel_tool_calls": echo.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "conversation": self.conversation.as_ref().map(|id| json!({"id": id})),
            "reasoning": echo.reasoning,
            "store": self.store,
            "temperature": echo.temperature,
            "top_p": echo.top_p,
            "presence_penalty": echo.presence_penalty,
            "frequency_penalty": echo.frequency_penalty,
            "top_logprobs": echo.top_logprobs,
            "text": echo.text,
            "tool_choice": echo.tool_choice,
            "tools": echo.tools,
            "truncation": echo.truncation,
            "service_tier": echo.service_tier,
            "safety_identifier": echo.safety_identifier,
            "prompt_cache_key": echo.prompt_cache_key,
            "user": echo.user,
            "metadata": echo.metadata,
            "usage": end.map(|end| usage_json(end.usage, end.timings)),
        })
    }

    /// Adds a collected turn's output items and returns the finished object.
    fn finish(&mut self, done: &crate::http::stream::Collected) -> Value {
        if !done.reasoning.is_empty() {
            self.output.push(reasoning_item(&done.reasoning));
        }
        if !done.text.is_empty() || done.calls.is_empty() {
            self.output.push(message_item(&done.text, done.finish));
        }
        let calls: Vec<Value> = done.calls.iter().map(|call| call_item(call, &self.namespaced, done.finish)).collect();
        self.output.extend(calls);
        self.response(Some(End { finish: done.finish, usage: &done.usage, timings: &done.timings }))
    }

    /// Stores `response` (when the request asked for it) and, once it has
    /// ended, adds the turn's items to its conversation; returns it. A
    /// failed write is logged and the answer says `store: false`, since a
    /// follow-up could not find it.
    async fn keep(self, app: &AppState, mut response: Value) -> Value {
        let ended = response["status"] != "in_progress";
        let appended = self.conversation.filter(|_| ended).map(|conversation| Appended {
            owner: self.owner.clone(),
            conversation,
            items: self.input.iter().chain(&self.output).cloned().collect(),
        });
        if !self.store && appended.is_none() {
            return response;
        }
        let record = self.store.then(|| {
            // The output is stored as items; the object keeps its place.
            let mut body = response.clone();
            body["output"] = json!([]);
            ResponseRecord {
                id: self.id,
                owner: self.owner,
                previous_id: self.previous_response_id,
                created_at: self.created_at,
                status: response["status"].as_str().unwrap_or_default().to_string(),
                body,
                input: self.input,
                output: self.output,
            }
        });
        match app.store.put_turn(record, appended).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!("a turn ended after its conversation was deleted; its items were not added"),
            Err(err) => {
                tracing::error!("a response was not stored: {err}");
                response["store"] = json!(false);
            }
        }
        response
    }
}

/// Why a response is `incomplete`: the token budget (`max_output_tokens`,
/// OpenAI's word) or the turn's time (`turn_timeout`, this server's, as
/// `--turn-timeout` names it); `None` when nothing cut it.
fn incomplete_reason(finish: ChatFinish) -> Option<&'static str> {
    match finish {
        ChatFinish::Length => Some("max_output_tokens"),
        ChatFinish::TimedOut => Some("turn_timeout"),
        ChatFinish::Stop | ChatFinish::ToolCalls => None,
    }
}

/// The answer's message item; `incomplete` when a bound cut it.
fn message_item(text: &str, finish: ChatFinish) -> Value {
    let status = if finish.cut_short() { "incomplete" } else { "completed" };
    json!({
        "type": "message",
        "id": new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

/// A `function_call` item; `incomplete` when the budget ran out (the last
/// call's arguments may be cut short).
fn call_item(call: &ToolCall, namespaced: &Namespaced, finish: ChatFinish) -> Value {
    let status = if finish.cut_short() { "incomplete" } else { "completed" };
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
    let wire: ResponsesRequest = read_json(request, payload).await?;
    let (asked, stream) = (wire.model.clone(), wire.stream);
    let (app, request) = (state.clone(), request.clone());
    let work = async move { respond(&app, &request, wire, started).await };
    crate::http::stream::after_load::<ResponsesEncoder>(state, asked.as_deref(), stream, work).await
}

async fn respond(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    wire: ResponsesRequest,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let (chat, peer, draft, stream) = open_turn(state, request, wire).await?;
    let dropped = draft.dropped.join(", ");
    let mut response = if draft.echo.background {
        run_in_background(state, chat, draft, started, stream).await?
    } else if stream {
        let encoder = ResponsesEncoder::new(state, draft, None);
        sse_response(event_stream(state.clone(), chat, peer, started, encoder))
    } else {
        let done = collect(state, chat, peer, started).await?;
        let mut draft = draft;
        let response = draft.finish(&done);
        HttpResponse::Ok().json(draft.keep(state, response).await)
    };
    if !dropped.is_empty() {
        if let Ok(value) = actix_web::http::header::HeaderValue::from_str(&dropped) {
            response.headers_mut().insert(actix_web::http::header::HeaderName::from_static(DROPPED_HEADER), value);
        }
    }
    Ok(response)
}

/// A Responses turn, started: its events, the client watch, the response
/// it builds, and whether the request asked for a stream.
type Opened = (skillhost_actors::ChatStream, crate::http::peer::PeerWatch, Draft, bool);

/// A checked Responses request: the chat request it becomes, the response
/// it builds, and the items it continues (its chain or conversation).
struct Prepared {
    chat: ChatCompletionRequest,
    draft: Draft,
    context: Vec<Value>,
}

/// Checks a request and reads what it continues: from `last` when it
/// continues the response a socket remembers, else from the store.
async fn prepare(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    mut wire: ResponsesRequest,
    last: Option<&Remembered>,
) -> Result<Prepared, ApiError> {
    let info = model_info(state, wire.model.as_deref()).await?;
    wire.refuse_unsupported()?;
    let owner = Caller::of(request);
    let mut given = input_items(wire.input.take())?;
    let conversation = wire.conversation_id()?;
    let previous_response_id = wire.previous_response_id.clone();
    let mut previous = previous_response_id.as_deref();
    let mut context = Vec::new();
    if let Some(last) = last.filter(|last| previous == Some(last.id.as_str())) {
        context = last.items.clone();
        previous = None;
        last.fill_references(&mut given);
    }
    let (stored, input) = resolve(state, &owner, previous, conversation.as_deref(), given).await?;
    context.extend(stored);
    let echo = Echo::of(&wire);
    let store = wire.store.unwrap_or(true);
    let (chat, namespaced, extras) = translate(wire, &context, &input, &ToolSources::of(state))?;
    let draft = Draft {
        // Stored here only: the id names this replica (`--replica-id`).
        id: skillhost_actors::replica::stamp(new_id("resp")),
        owner,
        created_at: unix_now(),
        model: info.id.clone(),
        input,
        store,
        previous_response_id,
        conversation,
        echo,
        namespaced,
        output: Vec::new(),
        dropped: extras.dropped,
    };
    Ok(Prepared { chat, draft, context })
}

/// Checks a request, reads what it continues from the store, and starts it.
async fn open_turn(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    wire: ResponsesRequest,
) -> Result<Opened, ApiError> {
    let Prepared { chat, draft, .. } = prepare(state, request, wire, None).await?;
    let Begun { chat, peer, stream, .. } = begin_translated(state, request, &SPELLING, chat).await?;
    Ok((chat, peer, draft, stream))
}

/// What a WebSocket keeps of the last response it answered, so that the
/// next `response.create` continues it without the store (and with
/// `store: false`): its id and every item of its chain, its output last.
/// Only the latest is kept, as OpenAI's WebSocket mode keeps it; a turn
/// that fails forgets it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Remembered {
    pub(crate) id: String,
    pub(crate) items: Vec<Value>,
}

impl Remembered {
    /// Replaces each `item_reference` to one of these items by the item.
    fn fill_references(&self, input: &mut [Value]) {
        for item in input.iter_mut().filter(|item| item["type"] == "item_reference") {
            if let Some(found) = self.items.iter().find(|kept| kept.get("id").is_some() && kept["id"] == item["id"]) {
                *item = found.clone();
            }
        }
    }
}

/// Frames of a turn over a socket.
pub(crate) type SocketFrames = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, actix_web::Error>>>>;

/// One `response.create` over a WebSocket: the same events a stream has,
/// and what the socket remembers once they end (its output still to add).
pub(crate) struct SocketTurn {
    pub(crate) events: SocketFrames,
    pub(crate) so_far: Remembered,
}

/// Starts one turn over a WebSocket. With `generate: false` it is a
/// warm-up: checked, stored and remembered as a response with no output,
/// and nothing is generated; a later turn continues from its id.
pub(crate) async fn socket_turn(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    wire: ResponsesRequest,
    last: Option<&Remembered>,
    generate: bool,
) -> Result<SocketTurn, ApiError> {
    let started = Instant::now();
    if wire.background == Some(true) {
        return Err(ApiError::bad_param(
            "background",
            "'background' is not taken over a WebSocket; send it to POST /v1/responses",
        ));
    }
    let Prepared { chat, draft, mut context } = prepare(state, request, wire, last).await?;
    context.extend(draft.input.iter().cloned());
    let so_far = Remembered { id: draft.id.clone(), items: context };
    let mut encoder = ResponsesEncoder::new(state, draft, None);
    let events: SocketFrames = if generate {
        let Begun { chat, peer, .. } = begin_translated(state, request, &SPELLING, chat).await?;
        Box::pin(event_stream(state.clone(), chat, peer, started, encoder))
    } else {
        chat.validate_as(&encoder.draft.model, &SPELLING)?;
        let mut frames = encoder.opening();
        let (usage, timings) = (Usage::default(), Timings::default());
        let end = Finish { finish: ChatFinish::Stop, usage: &usage, timings: &timings, rounds: &[] };
        match encoder.finished(end) {
            Ending::Now(last) => frames.extend(last),
            Ending::After(last) => frames.extend(last.await),
        }
        Box::pin(futures_util::stream::iter(frames.into_iter().map(Ok)))
    };
    Ok(SocketTurn { events, so_far })
}

/// A `background` request: stored as `in_progress` and answered at once
/// (with `stream`, by its events); the turn runs on with no client
/// attached, its events kept in a relay that `GET /v1/responses/{id}
/// ?stream=true` reads again, and its end (or a cancel, or a newer
/// detached turn past the cap) writes its last status.
async fn run_in_background(
    state: &web::Data<AppState>,
    chat: skillhost_actors::ChatStream,
    draft: Draft,
    started: Instant,
    stream: bool,
) -> Result<HttpResponse, ApiError> {
    let accepted = draft.clone().keep(state, draft.response(None)).await;
    if accepted["store"] == false {
        // Not stored, it could never be read back: dropping the stream
        // cancels the turn.
        return Err(ApiError::Internal("the server's store failed; the background response was not started".into()));
    }
    let (stop, registration) = futures_util::future::AbortHandle::new_pair();
    let app = state.clone();
    let id = draft.id.clone();
    let pushed: crate::http::background::Pushed = Box::new(move |why| {
        actix_web::rt::spawn(async move {
            mark(&app, &id, "cancelled", Some(json!({"code": "cancelled", "message": why}))).await;
        });
    });
    state.background.admit(&draft.id, &draft.owner, stop, pushed);
    let relay = crate::http::relay::Relay::new(0, None);
    state.response_streams.keep(&draft.id, &draft.owner, relay.clone());
    let reader = stream.then(|| relay.subscribe(0, state.keep_alive));
    let failure = Arc::new(Mutex::new(None));
    let id = draft.id.clone();
    let encoder = ResponsesEncoder::new(state, draft, Some(failure.clone()));
    let frames = event_stream(state.clone(), chat, crate::http::peer::PeerWatch::detached(), started, encoder);
    let app = state.clone();
    let pumped = relay.clone();
    let pump = async move {
        futures_util::pin_mut!(frames);
        while let Some(Ok(frame)) = frames.next().await {
            // Readers make their own keep-alive comments.
            if !frame.starts_with(b":") {
                pumped.push(frame);
            }
        }
    };
    let turn = async move {
        let outcome = futures_util::future::Abortable::new(pump, registration).await;
        relay.end();
        let failed = failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        // A cancel (or the cap) that came first wrote the status instead; a
        // finished turn took itself out before it stored its response.
        if outcome.is_ok() && app.background.finish(&id) {
            let error = failed
                .unwrap_or_else(|| json!({"code": "server_error", "message": "the response ended without an answer"}));
            tracing::warn!(response = %id, "a background response failed: {}", error["message"]);
            mark(&app, &id, "failed", Some(error)).await;
        }
    };
    actix_web::rt::spawn(turn);
    match reader {
        Some(reader) => Ok(sse_response(reader)),
        None => Ok(HttpResponse::Ok().json(accepted)),
    }
}

/// Writes a stored response's status; a failure is logged (the status a
/// client polls then stays what it was).
async fn mark(state: &AppState, id: &str, status: &'static str, error: Option<Value>) {
    let id = id.to_string();
    let written =
        state.store.run(move |conn| stored::set_status(conn, &id, status, error.as_ref(), Some(unix_now()))).await;
    if let Err(err) = written {
        tracing::error!("a response's status was not stored: {err}");
    }
}

/// The Responses API's codes for a failed response.
fn failed_code(err: &ApiError) -> &'static str {
    match err {
        ApiError::BadRequest { .. } => "invalid_prompt",
        ApiError::Overloaded(_) | ApiError::Unavailable(_) => "rate_limit_exceeded",
        _ => "server_error",
    }
}

/// The body of `POST /v1/responses/input_tokens`: the fields that shape
/// the prompt, as OpenAI defines them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputTokensRequest {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    previous_response_id: Option<String>,
    conversation: Option<Value>,
    reasoning: Option<Map<String, Value>>,
    text: Option<Map<String, Value>>,
    truncation: Option<String>,
}

/// `POST /v1/responses/input_tokens`: the tokens the request's prompt
/// would take (its context from `previous_response_id` or `conversation`
/// included), as `/v1/responses` then reports them in `input_tokens`; the
/// server's own skills block and code tools are not counted.
pub async fn input_tokens(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let asked: InputTokensRequest = read_json(&request, payload).await?;
    let mut wire = ResponsesRequest {
        model: asked.model,
        input: asked.input,
        instructions: asked.instructions,
        tools: asked.tools,
        tool_choice: asked.tool_choice,
        parallel_tool_calls: asked.parallel_tool_calls,
        previous_response_id: asked.previous_response_id,
        conversation: asked.conversation,
        reasoning: asked.reasoning,
        text: asked.text,
        truncation: asked.truncation,
        ..ResponsesRequest::default()
    };
    let info = model_info(&state, wire.model.as_deref()).await?;
    wire.refuse_unsupported()?;
    let owner = Caller::of(&request);
    let given = input_items(wire.input.take())?;
    let conversation = wire.conversation_id()?;
    let (context, input) =
        resolve(&state, &owner, wire.previous_response_id.as_deref(), conversation.as_deref(), given).await?;
    let (chat, _, _) = translate(wire, &context, &input, &ToolSources::of(&state))?;
    let validated = chat.validate_as(&info.id, &SPELLING)?;
    // Attachments' lines are part of the prompt the count is for.
    let mut counted = validated.request;
    crate::http::attachments::attach(&state, &owner, &mut counted, validated.attachments).await?;
    let input_tokens = state.server.count_tokens(&counted).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Ok().json(json!({"object": "response.input_tokens", "input_tokens": input_tokens})))
}

/// `POST /v1/responses/{id}/cancel`: stops a running background response
/// (`cancelled`); a finished one is answered as it is.
pub async fn cancel(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &[])?;
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    if state.background.cancel(&owner, &id) {
        mark(&state, &id, "cancelled", None).await;
    }
    match stored_response(&state, owner, &id).await? {
        Some(response) if response["background"] == true => Ok(HttpResponse::Ok().json(response)),
        Some(_) => Err(ApiError::bad_request(format!(
            "the response '{id}' was not created with 'background': only a background response can be cancelled"
        ))
        .into()),
        None => Err(no_response(&id).into()),
    }
}

/// `owner`'s stored response `id`, with its output.
async fn stored_response(state: &AppState, owner: String, id: &str) -> Result<Option<Value>, ApiError> {
    let id = id.to_string();
    state.store.run(move |conn| stored::get(conn, &owner, &id)).await.map_err(store_failed)
}

/// `id` as a path names it, refused when another replica made it.
pub(crate) fn owned_id(id: &str) -> Result<&str, ApiError> {
    match skillhost_actors::replica::elsewhere(id) {
        Some(replica) => {
            Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&format!("response {id}"), replica)))
        }
        None => Ok(id),
    }
}

fn no_response(id: &str) -> ApiError {
    ApiError::NotFound(format!("no stored response has the id '{id}'"))
}

/// The names in a query string, each once.
fn query_names(request: &HttpRequest) -> Vec<String> {
    let mut names: Vec<String> = request
        .query_string()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split('=').next().unwrap_or_default().trim_end_matches("%5B%5D").trim_end_matches("[]").to_string()
        })
        .collect();
    names.dedup();
    names
}

/// Refuses a query parameter outside `known`, naming it.
pub(crate) fn refuse_unknown_query(request: &HttpRequest, known: &[&str]) -> Result<(), ApiError> {
    match query_names(request).into_iter().find(|name| !known.contains(&name.as_str())) {
        Some(name) => Err(ApiError::bad_param(
            &name,
            format!("the query parameter '{name}' is not one this route takes ({})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The query of the stored-response routes.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct StoredQuery {
    stream: Option<bool>,
    starting_after: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
    order: Option<String>,
}

pub(crate) fn stored_query(request: &HttpRequest, known: &[&str]) -> Result<StoredQuery, ApiError> {
    refuse_unknown_query(request, known)?;
    // `include[]` repeats; it says what to add, and everything is there.
    let pairs: Vec<(String, String)> = web::Query::<Vec<(String, String)>>::from_query(request.query_string())
        .map_err(|err| ApiError::bad_request(format!("the query string is invalid: {err}")))?
        .into_inner()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("include"))
        .collect();
    let mut query = StoredQuery::default();
    for (name, value) in pairs {
        let bad = |what: &str| ApiError::bad_param(&name, format!("'{name}' must be {what}, got '{value}'"));
        match name.as_str() {
            "stream" => query.stream = Some(value.parse().map_err(|_| bad("true or false"))?),
            "after" => query.after = Some(value.clone()),
            "limit" => query.limit = Some(value.parse().map_err(|_| bad("a whole number"))?),
            "order" => query.order = Some(value.clone()),
            "starting_after" => query.starting_after = Some(value.clone()),
            _ => {}
        }
    }
    Ok(query)
}

/// `GET /v1/responses/{id}`
pub async fn retrieve(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let query = stored_query(&request, &["include", "stream", "starting_after", "include_obfuscation"])?;
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    if query.stream == Some(true) {
        // Event `n` (its `sequence_number`) is the relay's frame `n + 1`.
        let after = match &query.starting_after {
            Some(n) => n.parse::<u64>().map(|n| n + 1).map_err(|_| {
                ApiError::bad_param(
                    "starting_after",
                    format!("'starting_after' must be an event's sequence_number, got '{n}'"),
                )
            })?,
            None => 0,
        };
        return match state.response_streams.get(&id, &owner) {
            Some(relay) => Ok(sse_response(relay.subscribe(after, state.keep_alive))),
            None if stored_response(&state, owner, &id).await?.is_some() => Err(ApiError::bad_param(
                "stream",
                format!(
                    "the events of '{id}' are not kept: only a background response's are, until the server restarts; retrieve the response without 'stream'"
                ),
            )
            .into()),
            None => Err(no_response(&id).into()),
        };
    }
    match stored_response(&state, owner, &id).await? {
        Some(response) => Ok(HttpResponse::Ok().json(response)),
        None => Err(no_response(&id).into()),
    }
}

/// `DELETE /v1/responses/{id}`: the response and its items.
pub async fn delete(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &[])?;
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    // A running background response stops with the record it writes to.
    state.background.cancel(&owner, &id);
    state.response_streams.forget(&id, &owner);
    let deleted = state.store.run({
        let id = id.clone();
        move |conn| stored::delete(conn, &owner, &id)
    });
    if deleted.await.map_err(store_failed)? {
        Ok(HttpResponse::Ok().json(json!({"id": id, "object": "response", "deleted": true})))
    } else {
        Err(no_response(&id).into())
    }
}

/// `GET /v1/responses/{id}/input_items`: the request's own items, a page
/// at a time (`after` an item id, `limit`, `order` asc or desc, newest
/// first by default).
pub async fn input_items_list(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let page = Page::asked(&stored_query(&request, &["after", "limit", "order", "include"])?)?;
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    let found = state.store.run({
        let id = id.clone();
        move |conn| stored::input_items(conn, &owner, &id)
    });
    let Some(items) = found.await.map_err(store_failed)? else { return Err(no_response(&id).into()) };
    Ok(HttpResponse::Ok().json(page.of(items, &format!("an input item of {id}"))?))
}

/// A page of a list of items, as a list route's query asks for it.
pub(crate) struct Page {
    after: Option<String>,
    limit: usize,
    newest_first: bool,
}

impl Page {
    /// `limit` (1 to [`MAX_ITEMS_PAGE`], default [`DEFAULT_ITEMS_PAGE`]),
    /// `order` (`desc`, the default, or `asc`) and `after` (an item id).
    pub(crate) fn asked(query: &StoredQuery) -> Result<Page, ApiError> {
        let limit = query.limit.unwrap_or(DEFAULT_ITEMS_PAGE);
        if !(1..=MAX_ITEMS_PAGE).contains(&limit) {
            return Err(ApiError::bad_param(
                "limit",
                format!("'limit' must be between 1 and {MAX_ITEMS_PAGE}, got {limit}"),
            ));
        }
        let newest_first = match query.order.as_deref() {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(other) => {
                return Err(ApiError::bad_param("order", format!("'order' must be asc or desc, got '{other}'")))
            }
        };
        Ok(Page { after: query.after.clone(), limit, newest_first })
    }

    /// The page of `items` (oldest first) as the list object; `what` says
    /// what `after` should have named, for the error when it names nothing.
    pub(crate) fn of(&self, mut items: Vec<Value>, what: &str) -> Result<Value, ApiError> {
        if self.newest_first {
            items.reverse();
        }
        let item_id = |item: &Value| item.get("id").and_then(Value::as_str).map(str::to_string);
        let from = match &self.after {
            None => 0,
            Some(after) => match items.iter().position(|item| item_id(item).as_deref() == Some(after)) {
                Some(at) => at + 1,
                None => {
                    return Err(ApiError::bad_param(
                        "after",
                        format!("'after' names the item '{after}', which is not {what}"),
                    ))
                }
            },
        };
        let has_more = items.len() > from + self.limit;
        let page: Vec<Value> = items.into_iter().skip(from).take(self.limit).collect();
        Ok(json!({
            "object": "list",
            "data": page,
            "first_id": page.first().and_then(item_id),
            "last_id": page.last().and_then(item_id),
            "has_more": has_more,
        }))
    }
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
    app: web::Data<AppState>,
    draft: Draft,
    sequence: u64,
    open: Option<Open>,
    /// The caller's calls, sent with the end: whether they are complete
    /// depends on how the request finished, which comes right after them.
    calls: Vec<ToolCall>,
    /// A background response's: where a failure's error goes, for the
    /// task that writes its status.
    failure: Option<Arc<Mutex<Option<Value>>>>,
}

/// One typed event as an SSE frame.
fn event_frame(kind: &str, mut data: Value, sequence: u64) -> Bytes {
    data["type"] = Value::String(kind.into());
    data["sequence_number"] = json!(sequence);
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

impl ResponsesEncoder {
    fn new(state: &web::Data<AppState>, draft: Draft, failure: Option<Arc<Mutex<Option<Value>>>>) -> Self {
        ResponsesEncoder { app: state.clone(), draft, sequence: 0, open: None, calls: Vec::new(), failure }
    }

    fn event(&mut self, kind: &str, data: Value) -> Bytes {
        let frame = event_frame(kind, data, self.sequence);
        self.sequence += 1;
        frame
    }

    /// Ends the open item, adding it to the output; `finish` says whether
    /// the budget cut it.
    fn close(&mut self, frames: &mut Vec<Bytes>, finish: ChatFinish) {
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
                let mut item = message_item(&text, finish);
                item["id"] = Value::String(id);
                frames.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
                self.draft.output.push(item);
            }
            Some(Open::Reasoning { id, text }) => {
                frames.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                ));
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
        let response = self.draft.response(None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn content(&mut self, delta: &str) -> Vec<Bytes> {
        let mut frames = Vec::new();
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close(&mut frames, ChatFinish::Stop);
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
            self.close(&mut frames, ChatFinish::Stop);
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

    fn finished(&mut self, end: Finish<'_>) -> Ending {
        let mut frames = Vec::new();
        self.close(&mut frames, end.finish);
        self.send_calls(&mut frames, end.finish);
        // A response cut by its budget ends with `response.incomplete`
        // (`status: "incomplete"` and the reason), as OpenAI ends it; the
        // SDK's stream helper and Codex end a turn on either event.
        let response = self.draft.response(Some(End { finish: end.finish, usage: end.usage, timings: end.timings }));
        let kind = if end.finish.cut_short() { "response.incomplete" } else { "response.completed" };
        let sequence = self.sequence;
        self.sequence += 1;
        let (app, draft) = (self.app.clone(), self.draft.clone());
        let background = self.failure.is_some();
        // The last event says `store: true` only once the commit returned.
        Ending::After(Box::pin(async move {
            // A background turn cancelled meanwhile stays cancelled.
            if background && !app.background.finish(&draft.id) {
                return frames;
            }
            let response = draft.keep(&app, response).await;
            frames.push(event_frame(kind, json!({"response": response}), sequence));
            frames
        }))
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
        self.close(&mut frames, ChatFinish::Length);
        frames.push(self.event("error", json!({"code": err.kind(), "message": err.to_string(), "param": null})));
        let mut response = self.draft.response(None);
        response["status"] = json!("failed");
        response["error"] = json!({"code": failed_code(err), "message": err.to_string()});
        if let Some(failure) = &self.failure {
            *failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(response["error"].clone());
        }
        frames.push(self.event("response.failed", json!({"response": response})));
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let messages = messages_from_items(&items, "input").unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(messages[2].tool_calls.as_ref().map(Vec::len), Some(2));
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("c1"));
    }
}
