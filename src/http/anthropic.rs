//! Anthropic's Messages API, `POST /v1/messages`, for Claude Code and the
//! `anthropic` SDK: the request is translated into the OpenAI request the
//! rest of the server takes (one validator), and the answer comes back as
//! content blocks, or as Anthropic's typed stream events through the one
//! stream core.
//!
//! A model name that is one of this server's picks that model; any other
//! gets the default model, never a 404: Anthropic clients name Claude
//! models (Claude Code even picks a smaller one for side tasks), and
//! llama-server answers them all too.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use rand::distr::{Alphanumeric, SampleString};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use skillhost_actors::request::Surface;
use skillhost_actors::{ChatFinish, Usage};
use skillhost_engine::{Timings, ToolCall};

use crate::client_prompts::{ClientPrompts, Rule};
use crate::http::body::read_json;
use crate::http::chat::{guarded, model_info, served_name};
use crate::http::error::{AnthropicError, ApiError, ErrorStyle};
use crate::http::openai::{
    ChatCompletionRequest, Spelling, Stop, WireContent, WireFile, WireFunction, WireFunctionCall, WireMessage,
    WireNamed, WirePart, WireTool, WireToolCall, WireToolChoice,
};
use crate::http::stream::{begin_translated, collect, event_stream, sse_response, Begun, Encoder, Ending, Finish};
use crate::http::AppState;

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// Accepted and not checked (see the module comment).
    #[allow(dead_code)]
    model: Option<String>,
    /// Required, as Anthropic requires it.
    max_tokens: Option<u32>,
    messages: Vec<AnthropicMessage>,
    system: Option<TextOrBlocks>,
    tools: Option<Vec<AnthropicTool>>,
    tool_choice: Option<AnthropicToolChoice>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    #[serde(default)]
    stream: bool,
    /// Accepted: a thinking model's reasoning comes back as `thinking` blocks.
    #[allow(dead_code)]
    thinking: Option<Map<String, Value>>,
    #[allow(dead_code)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    skills: Vec<String>,
    skills_discovery: Option<bool>,
    multi_agent: Option<bool>,
    /// The operator's MCP servers this request may use (default: all).
    mcp_servers: Option<Vec<String>>,
    /// Anthropic's container: its `skills` select skills for this request.
    container: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct AnthropicMessage {
    role: String,
    content: TextOrBlocks,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of content blocks")]
enum TextOrBlocks {
    Text(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
struct AnthropicTool {
    /// Absent (or `custom`) for a client's own tool; Anthropic's server
    /// tools (web search, code execution, …) carry a versioned type.
    #[serde(rename = "type")]
    kind: Option<String>,
    name: String,
    description: Option<String>,
    input_schema: Option<Value>,
    cache_control: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "an object such as {\"type\": \"auto\"}")]
struct AnthropicToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    disable_parallel_tool_use: Option<bool>,
}

fn message_id() -> String {
    format!("msg_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// An `image` or `document` block as the chat request's file part: its
/// `source` inline (`base64`, or a document's `text`) or a stored file
/// (`file`); a `url` source is refused, as this server fetches nothing.
fn attached(block: &Value, at: &str) -> Result<WirePart, ApiError> {
    let source = &block["source"];
    let field = |name: &str| source.get(name).and_then(Value::as_str).map(str::to_string);
    let file = match source["type"].as_str() {
        Some("base64") => {
            let data = field("data").ok_or_else(|| {
                ApiError::bad_param(&format!("{at}.source.data"), format!("'{at}.source' (base64) needs 'data'"))
            })?;
            WireFile { file_data: Some(data), ..WireFile::default() }
        }
        Some("text") if block["type"] == "document" => {
            let data = field("data").unwrap_or_default();
            WireFile { file_data: Some(format!("data:text/plain,{data}")), ..WireFile::default() }
        }
        Some("file") => WireFile { file_id: field("file_id"), ..WireFile::default() },
        Some("url") => return Err(crate::http::attachments::no_urls(&format!("{at}.source.url"))),
        other => {
            return Err(ApiError::bad_param(
                &format!("{at}.source.type"),
                format!(
                    "'{at}.source.type' is {}; this server takes base64, text (documents) and file sources",
                    other.map_or_else(|| "missing".to_string(), |kind| format!("'{kind}'"))
                ),
            ))
        }
    };
    let filename = block.get("title").and_then(Value::as_str).map(str::to_string);
    Ok(WirePart {
        kind: "file".into(),
        file: Some(WireFile { filename, ..file }),
        at: Some(format!("{at}.source")),
        ..WirePart::default()
    })
}

/// The text of a `tool_result`'s content: a string or text blocks.
fn result_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (n, block) in blocks.iter().enumerate() {
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
                    Some(kind) => {
                        return Err(ApiError::bad_param(
                            &format!("{at}.content[{n}]"),
                            format!(
                                "a tool result's '{kind}' block is not supported; this server's model reads text only"
                            ),
                        ))
                    }
                    None => return Err(ApiError::bad_param(&format!("{at}.content[{n}]"), "a block needs a 'type'")),
                }
            }
            Ok(text)
        }
        Some(other) => Err(ApiError::bad_param(
            &format!("{at}.content"),
            format!("'{at}.content' must be a string or a list of text blocks, got {other}"),
        )),
    }
}

/// Most `cache_control` breakpoints one request may set, as Anthropic's API.
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

/// Where a request's `cache_control` breakpoints are. This server's KV
/// cache keeps every prompt token it decodes for the next request that
/// starts the same way, marked or not; the marks decide only how usage
/// splits the fresh tokens: those up to the last mark were written to the
/// cache (`cache_creation_input_tokens`), those after it are
/// `input_tokens`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct CacheMarks {
    count: usize,
    /// How many of the translated messages come up to and with the last
    /// mark (the system message counts for marks on the system prompt or
    /// tools); `None` without marks.
    through: Option<usize>,
}

impl CacheMarks {
    /// Reads one block's `cache_control`: absent, or `{"type":
    /// "ephemeral"}` with an optional `ttl` of "5m" or "1h".
    fn read(&mut self, cache_control: Option<&Value>, at: &str) -> Result<bool, ApiError> {
        let Some(mark) = cache_control.filter(|mark| !mark.is_null()) else { return Ok(false) };
        let at = format!("{at}.cache_control");
        if mark.get("type").and_then(Value::as_str) != Some("ephemeral") {
            return Err(ApiError::bad_param(
                &at,
                format!("'{at}' must be {{\"type\": \"ephemeral\"}} (with an optional \"ttl\" of \"5m\" or \"1h\"), got {mark}"),
            ));
        }
        match mark.get("ttl") {
            None | Some(Value::Null) => {}
            Some(Value::String(ttl)) if ttl == "5m" || ttl == "1h" => {}
            Some(other) => {
                return Err(ApiError::bad_param(
                    &format!("{at}.ttl"),
                    format!("'{at}.ttl' must be \"5m\" or \"1h\", got {other}"),
                ))
            }
        }
        self.count += 1;
        if self.count > MAX_CACHE_BREAKPOINTS {
            return Err(ApiError::bad_param(
                &at,
                format!(
                    "a request may set at most {MAX_CACHE_BREAKPOINTS} cache_control breakpoints; '{at}' is one more"
                ),
            ));
        }
        Ok(true)
    }

    /// Marks the prompt as cached up to and with the first `messages`
    /// translated messages.
    fn through(&mut self, messages: usize) {
        self.through = Some(self.through.map_or(messages, |before| before.max(messages)));
    }
}

/// Anthropic's tools carry `name` and `input_schema` directly; its stop
/// strings are `stop_sequences`.
const SPELLING: Spelling = Spelling {
    stop: "stop_sequences",
    tool: "",
    tool_parameters: "input_schema",
    surface: Surface::Anthropic,
    ..Spelling::OPENAI
};

/// Anthropic's request as the OpenAI request the rest of the server takes,
/// with the rules of `--normalize-client-prompts` that rewrote it.
fn translate(
    request: MessagesRequest,
    rules: &ClientPrompts,
    skills: Option<&skillhost_actors::SkillsHandle>,
) -> Result<Translated, ApiError> {
    let container = match request.container.as_ref().filter(|c| !c.is_null()) {
        Some(container) => crate::http::hosted_skills::container(container, skills)?,
        None => Default::default(),
    };
    let max_tokens = request
        .max_tokens
        .ok_or_else(|| ApiError::bad_param("max_tokens", "'max_tokens' is required (the most tokens to generate)"))?;
    let mut messages = Vec::new();
    let mut applied = Vec::new();
    let mut marks = CacheMarks::default();
    // Tools come first in Anthropic's order: a mark on one covers them all
    // and the system prompt, which the model's template renders together.
    let mut marked_front = false;
    for (n, tool) in request.tools.iter().flatten().enumerate() {
        marked_front |= marks.read(tool.cache_control.as_ref(), &format!("tools[{n}]"))?;
    }
    match request.system {
        None => {}
        Some(TextOrBlocks::Text(text)) => messages.push(text_message("system", text)),
        Some(TextOrBlocks::Blocks(mut blocks)) => {
            for (n, block) in blocks.iter().enumerate() {
                marked_front |= marks.read(block.get("cache_control"), &format!("system[{n}]"))?;
            }
            blocks.retain(|block| match rules.drops_system_block(block) {
                Some(rule) => {
                    applied.push(rule);
                    false
                }
                None => true,
            });
            let text = result_text(Some(&Value::Array(blocks)), "system")?;
            messages.push(text_message("system", text));
        }
    }
    if marked_front {
        marks.through(messages.len());
    }
    if request.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "'messages' must contain at least one message"));
    }
    for (index, message) in request.messages.into_iter().enumerate() {
        let at = format!("messages[{index}]");
        if !matches!(message.role.as_str(), "user" | "assistant" | "system") {
            return Err(ApiError::bad_param(
                &format!("{at}.role"),
                format!("'{at}.role' must be \"user\", \"assistant\" or \"system\", got \"{}\"", message.role),
            ));
        }
        // Claude Code sends its environment as a system message after the
        // first user turn; it stays where it was sent, so the prompt's
        // prefix stays the same from one request to the next.
        if message.role == "system" {
            let text = match message.content {
                TextOrBlocks::Text(text) => text,
                TextOrBlocks::Blocks(blocks) => {
                    let mut marked = false;
                    for (n, block) in blocks.iter().enumerate() {
                        marked |= marks.read(block.get("cache_control"), &format!("{at}.content[{n}]"))?;
                    }
                    let text = result_text(Some(&Value::Array(blocks)), &at)?;
                    if marked {
                        marks.through(messages.len() + 1);
                    }
                    text
                }
            };
            messages.push(text_message("system", text));
            continue;
        }
        let blocks = match message.content {
            TextOrBlocks::Text(text) => {
                messages.push(text_message(&message.role, text));
                continue;
            }
            TextOrBlocks::Blocks(blocks) => blocks,
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        let mut files = Vec::new();
        let mut marked = false;
        for (n, block) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{n}]");
            marked |= marks.read(block.get("cache_control"), &at)?;
            let field = |name: &str| block.get(name);
            match block.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(field("text").and_then(Value::as_str).unwrap_or_default()),
                Some("tool_use") if message.role == "assistant" => {
                    let (Some(id), Some(name)) =
                        (field("id").and_then(Value::as_str), field("name").and_then(Value::as_str))
                    else {
                        return Err(ApiError::bad_param(&at, format!("'{at}' (tool_use) needs an 'id' and a 'name'")));
                    };
                    calls.push(WireToolCall {
                        id: Some(id.to_string()),
                        kind: Some("function".into()),
                        function: WireFunctionCall {
                            name: name.to_string(),
                            arguments: Some(field("input").cloned().unwrap_or_else(|| json!({}))),
                        },
                    });
                }
                Some("tool_result") if message.role == "user" => {
                    let Some(id) = field("tool_use_id").and_then(Value::as_str) else {
                        return Err(ApiError::bad_param(&at, format!("'{at}' (tool_result) needs a 'tool_use_id'")));
                    };
                    let mut content = result_text(field("content"), &at)?;
                    if field("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    results.push(WireMessage {
                        role: "tool".into(),
                        content: Some(WireContent::Text(content)),
                        tool_calls: None,
                        tool_call_id: Some(id.to_string()),
                        name: None,
                        raw: None,
                    });
                }
                // Reasoning from earlier turns is not replayed to the model.
                Some("thinking" | "redacted_thinking") if message.role == "assistant" => {}
                Some("image" | "document") if message.role == "user" => files.push(attached(block, &at)?),
                Some(kind) => {
                    return Err(ApiError::bad_param(
                        &at,
                        format!("'{at}' is a '{kind}' block, which a {} message cannot hold here", message.role),
                    ))
                }
                None => return Err(ApiError::bad_param(&at, format!("'{at}' needs a 'type'"))),
            }
        }
        // Tool results answer the assistant turn before them, so they come
        // first; any text of the same user turn follows them.
        messages.extend(results);
        if !files.is_empty() {
            let mut parts = vec![WirePart { kind: "text".into(), text: Some(text), ..WirePart::default() }];
            parts.extend(files);
            messages
                .push(WireMessage { content: Some(WireContent::Parts(parts)), ..text_message("user", String::new()) });
        } else if !text.is_empty() || !calls.is_empty() {
            messages.push(WireMessage {
                role: message.role,
                content: Some(WireContent::Text(text)),
                tool_calls: (!calls.is_empty()).then_some(calls),
                tool_call_id: None,
                name: None,
                raw: None,
            });
        }
        if marked {
            marks.through(messages.len());
        }
    }
    let tools = match request.tools {
        None => None,
        Some(tools) => Some(
            tools
                .into_iter()
                .enumerate()
                .map(|(n, tool)| match tool.kind.as_deref() {
                    None | Some("custom") => Ok(WireTool {
                        kind: "function".into(),
                        function: WireFunction {
                            name: tool.name,
                            description: tool.description,
                            parameters: tool.input_schema,
                        },
                    }),
                    Some(kind) => Err(ApiError::bad_param(
                        &format!("tools[{n}]"),
                        format!("'tools[{n}]' is Anthropic's server tool '{kind}', which this server does not run; declare your own tool with an input_schema instead"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let mut parallel_tool_calls = None;
    let tool_choice = match request.tool_choice {
        None => None,
        Some(choice) => {
            if choice.disable_parallel_tool_use == Some(true) {
                parallel_tool_calls = Some(false);
            }
            Some(match (choice.kind.as_str(), choice.name) {
                ("auto", _) => WireToolChoice::Mode("auto".into()),
                ("any", _) => WireToolChoice::Mode("required".into()),
                ("none", _) => WireToolChoice::Mode("none".into()),
                ("tool", Some(name)) => {
                    WireToolChoice::Function { kind: "function".into(), function: WireNamed { name } }
                }
                ("tool", None) => {
                    return Err(ApiError::bad_param("tool_choice", "'tool_choice' of type \"tool\" needs a 'name'"))
                }
                (other, _) => {
                    return Err(ApiError::bad_param(
                        "tool_choice.type",
                        format!("'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", got \"{other}\""),
                    ))
                }
            })
        }
    };
    let wire = ChatCompletionRequest {
        messages,
        max_tokens: Some(max_tokens),
        stop: request.stop_sequences.map(Stop::Many),
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        tools,
        tool_choice,
        parallel_tool_calls,
        skills: request.skills.into_iter().chain(container.skills).collect(),
        skills_inline: container.inline,
        skills_discovery: request.skills_discovery,
        multi_agent: request.multi_agent,
        mcp_servers: request.mcp_servers,
        stream: request.stream,
        ..ChatCompletionRequest::default()
    };
    Ok(Translated { chat: wire, applied, marks })
}

/// A translated request, with what `--normalize-client-prompts` removed and
/// where its cache breakpoints are.
struct Translated {
    chat: ChatCompletionRequest,
    applied: Vec<Rule>,
    marks: CacheMarks,
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

fn stop_reason(finish: ChatFinish) -> &'static str {
    match finish {
        ChatFinish::Stop => "end_turn",
        ChatFinish::Length | ChatFinish::TimedOut => "max_tokens",
        ChatFinish::ToolCalls => "tool_use",
    }
}

/// Anthropic counts prompt tokens in three parts that add up to the whole:
/// read from the cache, written to it (the fresh tokens up to the last
/// cache breakpoint), and the rest (`input_tokens`). `after_mark` is the
/// prompt's tokens after its last breakpoint, `None` without one.
fn usage_json(usage: &Usage, timings: &Timings, after_mark: Option<usize>) -> Value {
    let fresh = usage.prompt_tokens.saturating_sub(timings.cache_n);
    let input = after_mark.map_or(fresh, |after| after.min(fresh));
    json!({
        "input_tokens": input,
        "cache_read_input_tokens": timings.cache_n,
        "cache_creation_input_tokens": fresh - input,
        "output_tokens": usage.completion_tokens,
    })
}

fn tool_use_json(call: &ToolCall) -> Value {
    // A call cut short by the budget keeps the part of its input written whole.
    let input = skillhost_engine::arguments_object(&call.arguments);
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
}

/// `POST /v1/messages`
pub async fn messages(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AnthropicError> {
    let started = Instant::now();
    Ok(guarded(&state, "anthropic", serve(&state, &request, payload, started)).await?)
}

async fn serve(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    payload: web::Payload,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let wire: MessagesRequest = read_json(request, payload).await?;
    let asked = served_name(state, wire.model.as_deref());
    let stream = wire.stream;
    let (app, request, named) = (state.clone(), request.clone(), asked.clone());
    let work = async move { respond(&app, &request, wire, named, started).await };
    crate::http::stream::after_load::<AnthropicEncoder>(state, asked.as_deref(), stream, work).await
}

async fn respond(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    wire: MessagesRequest,
    asked: Option<String>,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let info = model_info(state, asked.as_deref()).await?;
    let Translated { mut chat, applied, marks } = translate(wire, &state.client_prompts, state.server.skills())?;
    chat.model = asked;
    state.metrics.client_prompt_rewrites(&applied);
    let after_mark = tokens_after_mark(state, &chat, marks, &info.id).await;
    let Begun { chat, peer, info, stream, .. } = begin_translated(state, request, &SPELLING, chat).await?;
    let id = message_id();
    if stream {
        let encoder = AnthropicEncoder { id, model: info.id.clone(), open: None, index: 0, after_mark };
        return Ok(sse_response(event_stream(state.clone(), chat, peer, started, encoder)));
    }
    let done = collect(state, chat, peer, started).await?;
    let mut content = Vec::new();
    if !done.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": done.reasoning, "signature": ""}));
    }
    if !done.text.is_empty() {
        content.push(json!({"type": "text", "text": done.text}));
    }
    content.extend(done.calls.iter().map(tool_use_json));
    Ok(HttpResponse::Ok().json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": info.id,
        "content": content,
        "stop_reason": stop_reason(done.finish),
        "stop_sequence": null,
        "usage": usage_json(&done.usage, &done.timings, after_mark),
    })))
}

/// The prompt's tokens after its last cache breakpoint (`None` without
/// one): none when the mark is on the last message, as Claude Code sets
/// it; else the difference between the prompt and the prompt cut after the
/// marked message, counted by the model's tokenizer. Where that cut cannot
/// be rendered (a template that refuses the partial conversation), the
/// mark is not used and usage reads as without one.
async fn tokens_after_mark(
    state: &AppState,
    chat: &ChatCompletionRequest,
    marks: CacheMarks,
    model: &str,
) -> Option<usize> {
    let through = marks.through?;
    if through >= chat.messages.len() {
        return Some(0);
    }
    let cut = ChatCompletionRequest { messages: chat.messages[..through].to_vec(), ..chat.clone() };
    let count = |request: ChatCompletionRequest| async move {
        let validated = request.validate(model).ok()?;
        state.server.count_tokens(&validated.request).await.ok()
    };
    let (whole, before) = (count(chat.clone()).await?, count(cut).await?);
    Some(whole.saturating_sub(before))
}

/// `POST /v1/messages/count_tokens`: the request's messages, system and
/// tools as a prompt in the model's chat format, in tokens.
pub async fn count_tokens(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AnthropicError> {
    let mut wire: MessagesRequest = read_json(&request, payload).await?;
    // Counting needs no output budget.
    wire.max_tokens.get_or_insert(1);
    wire.stream = false;
    let asked = served_name(&state, wire.model.as_deref());
    let info = model_info(&state, asked.as_deref()).await?;
    let mut chat = translate(wire, &state.client_prompts, state.server.skills())?.chat;
    chat.model = Some(info.id.clone());
    let validated = chat.validate(&info.id)?;
    let input_tokens = state.server.count_tokens(&validated.request).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Ok().json(json!({"input_tokens": input_tokens})))
}

/// The kind of content block open on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// Anthropic's typed events: `message_start`, then content blocks
/// (`content_block_start`, deltas, `content_block_stop`), `message_delta`
/// with the stop reason and usage, and `message_stop`; `ping` keeps a
/// quiet connection open.
struct AnthropicEncoder {
    id: String,
    model: String,
    open: Option<Block>,
    /// Index of the next block.
    index: usize,
    /// The prompt's tokens after its last cache breakpoint.
    after_mark: Option<usize>,
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

impl AnthropicEncoder {
    /// Closes the open block, if any.
    fn close(&mut self, frames: &mut Vec<Bytes>) {
        if self.open.take().is_some() {
            frames.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": self.index})));
            self.index += 1;
        }
    }

    /// A delta for a block of `kind`, opening one when another is open.
    fn delta(&mut self, kind: Block, text: &str) -> Vec<Bytes> {
        let mut frames = Vec::new();
        if self.open != Some(kind) {
            self.close(&mut frames);
            let block = match kind {
                Block::Text => json!({"type": "text", "text": ""}),
                Block::Thinking => json!({"type": "thinking", "thinking": ""}),
            };
            frames.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.index, "content_block": block}),
            ));
            self.open = Some(kind);
        }
        let delta = match kind {
            Block::Text => json!({"type": "text_delta", "text": text}),
            Block::Thinking => json!({"type": "thinking_delta", "thinking": text}),
        };
        frames.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        ));
        frames
    }
}

impl Encoder for AnthropicEncoder {
    fn opening(&mut self) -> Vec<Bytes> {
        let message = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        });
        vec![
            event("message_start", &json!({"type": "message_start", "message": message})),
            event("ping", &json!({"type": "ping"})),
        ]
    }

    fn content(&mut self, text: &str) -> Vec<Bytes> {
        self.delta(Block::Text, text)
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        self.delta(Block::Thinking, text)
    }

    fn tool_calls(&mut self, calls: &[ToolCall]) -> Vec<Bytes> {
        let mut frames = Vec::new();
        self.close(&mut frames);
        for call in calls {
            let start = json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
            frames.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.index, "content_block": start}),
            ));
            let delta = json!({"type": "input_json_delta", "partial_json": call.arguments});
            frames.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
            ));
            frames.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": self.index})));
            self.index += 1;
        }
        frames
    }

    fn finished(&mut self, end: Finish<'_>) -> Ending {
        let mut frames = Vec::new();
        self.close(&mut frames);
        frames.push(event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(end.finish), "stop_sequence": null},
                "usage": usage_json(end.usage, end.timings, self.after_mark),
            }),
        ));
        frames.push(event("message_stop", &json!({"type": "message_stop"})));
        frames.into()
    }

    fn error_frame(err: &ApiError) -> Bytes {
        event("error", &err.body(ErrorStyle::Anthropic))
    }

    fn keep_alive(&self) -> Option<(std::time::Duration, Bytes)> {
        Some((crate::http::webui::KEEP_ALIVE, event("ping", &json!({"type": "ping"}))))
    }
}
