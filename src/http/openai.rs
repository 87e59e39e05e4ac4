//! OpenAI chat-completions wire types, their validation into a
//! [`ChatRequest`], and the response shapes.

use serde::Deserialize;
use serde_json::{json, Value};
use skillhost_actors::request::Surface;
use skillhost_actors::skills::inline::InlineSpec;
use skillhost_actors::tools::mcp::McpSelection;
use skillhost_actors::{ChatFinish, ChatRequest, Usage};
use skillhost_engine::schema_limits;
use skillhost_engine::{ChatMessage, ResponseFormat, Role, SamplingParams, Timings, ToolCall, ToolChoice, ToolDef};

use crate::http::attachments::{decode_data, no_urls, Pending, Source};
use crate::http::error::ApiError;

/// Most stop sequences one request may give.
pub const MAX_STOP_SEQUENCES: usize = 16;
/// Most tools one request may declare (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Longest tool name (OpenAI's limit).
pub const MAX_TOOL_NAME_LEN: usize = 64;

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<i64>,
    /// llama-server's extension: generate until `max_tokens` regardless of end tokens.
    #[serde(default)]
    pub ignore_eos: bool,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub stop: Option<Stop>,
    pub tools: Option<Vec<WireTool>>,
    pub tool_choice: Option<WireToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<WireResponseFormat>,
    pub n: Option<u32>,
    pub logprobs: Option<bool>,
    /// Skills selected for this request, by name.
    #[serde(default)]
    pub skills: Vec<String>,
    /// Skills this request brings for itself alone, each a name and its
    /// files' text by path (`SKILL.md` among them).
    #[serde(default)]
    pub skills_inline: Vec<WireInlineSkill>,
    /// Whether unselected skills are advertised (default: the server's setting).
    pub skills_discovery: Option<bool>,
    /// `false` turns delegation to child agents off for this request.
    pub multi_agent: Option<bool>,
    /// The operator's MCP servers this request may use (default: all).
    pub mcp_servers: Option<Vec<String>>,
    /// Per server, the only tools it may use (from a Responses `mcp` tool's
    /// `allowed_tools`); never read from the wire.
    #[serde(skip)]
    pub mcp_allowed_tools: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of strings")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<WireContent>,
    pub tool_calls: Option<Vec<WireToolCall>>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant turn's text exactly as the model generated it, calls'
    /// markup included ([`RAW_FIELD`]): resent, it renders to the same
    /// prompt bytes the server's KV cache holds.
    #[serde(default, rename = "skillhost_raw")]
    pub raw: Option<String>,
}

/// The extension field of an assistant message that holds its raw text.
pub const RAW_FIELD: &str = "skillhost_raw";

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of content parts")]
pub enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct WirePart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `image_url` parts: `{"url": "data:image/png;base64,…"}`.
    pub image_url: Option<WireImageUrl>,
    /// `file` parts: `{"file_id": …}` or `{"filename": …, "file_data": …}`.
    pub file: Option<WireFile>,
    /// Where the part is in the surface's own request (`input[2].content[1]`),
    /// for errors; the chat request's path when unset.
    #[serde(skip)]
    pub at: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct WireImageUrl {
    pub url: String,
    /// How closely a vision model should look; this server has none.
    #[allow(dead_code)]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireFile {
    pub file_id: Option<String>,
    pub file_data: Option<String>,
    pub filename: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireToolCall {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: WireFunctionCall,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireFunctionCall {
    pub name: String,
    /// A JSON text per OpenAI; an object is accepted too.
    #[serde(default)]
    pub arguments: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: WireFunction,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}"
)]
pub enum WireToolChoice {
    Mode(String),
    Function {
        #[serde(rename = "type")]
        kind: String,
        function: WireNamed,
    },
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireNamed {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<WireJsonSchema>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireJsonSchema {
    pub schema: Option<Value>,
}

/// Checks a number against an inclusive range, naming the field.
fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    name: &str,
    value: Option<T>,
    min: T,
    max: T,
) -> Result<Option<T>, ApiError> {
    match value {
        Some(v) if !(v >= min && v <= max) => {
            Err(ApiError::bad_param(name, format!("'{name}' must be between {min} and {max}, got {v}")))
        }
        other => Ok(other),
    }
}

fn role(index: usize, role: &str) -> Result<Role, ApiError> {
    match role {
        "system" => Ok(Role::System),
        "developer" => Ok(Role::Developer),
        "user" => Ok(Role::User),
        "assistant" => Ok(Role::Assistant),
        "tool" => Ok(Role::Tool),
        other => Err(ApiError::bad_param(
            &format!("messages[{index}].role"),
            format!("messages[{index}].role must be one of system, developer, user, assistant, tool; got '{other}'"),
        )),
    }
}

/// A message's text and the files it carries.
fn content(index: usize, content: Option<WireContent>) -> Result<(String, Vec<Pending>), ApiError> {
    match content {
        None => Ok((String::new(), Vec::new())),
        Some(WireContent::Text(text)) => Ok((text, Vec::new())),
        Some(WireContent::Parts(parts)) => {
            let mut text = String::new();
            let mut files = Vec::new();
            for (part_index, part) in parts.into_iter().enumerate() {
                let at = part.at.clone().unwrap_or_else(|| format!("messages[{index}].content[{part_index}]"));
                match part.kind.as_str() {
                    "text" => match part.text {
                        Some(part_text) => text.push_str(&part_text),
                        None => {
                            return Err(ApiError::bad_param(
                                &format!("{at}.text"),
                                format!("{at} is a text part without 'text'"),
                            ))
                        }
                    },
                    "image_url" => {
                        let field = format!("{at}.image_url");
                        let Some(image) = part.image_url else {
                            return Err(ApiError::bad_param(
                                &field,
                                format!("{at} is an image part without 'image_url'"),
                            ));
                        };
                        if !image.url.starts_with("data:") {
                            return Err(no_urls(&field));
                        }
                        let source = Source::Data(decode_data(&image.url, &field)?);
                        files.push(Pending { message: index, at: field, filename: None, source });
                    }
                    "file" => {
                        let field = format!("{at}.file");
                        let Some(file) = part.file else {
                            return Err(ApiError::bad_param(&field, format!("{at} is a file part without 'file'")));
                        };
                        let source = match (file.file_id, file.file_data) {
                            (Some(id), None) => Source::Stored(id),
                            (None, Some(data)) => Source::Data(decode_data(&data, &format!("{field}.file_data"))?),
                            _ => {
                                return Err(ApiError::bad_param(
                                    &field,
                                    format!(
                                        "{field} needs one of 'file_id' (a file uploaded to /v1/files) or 'file_data'"
                                    ),
                                ))
                            }
                        };
                        files.push(Pending { message: index, at: field, filename: file.filename, source });
                    }
                    kind => {
                        return Err(ApiError::bad_param(
                            &format!("{at}.type"),
                            format!("{at} has type '{kind}'; this server accepts text, image_url and file parts"),
                        ))
                    }
                }
            }
            Ok((text, files))
        }
    }
}

fn tool_call(index: usize, call_index: usize, call: WireToolCall) -> Result<ToolCall, ApiError> {
    let at = format!("messages[{index}].tool_calls[{call_index}]");
    if let Some(kind) = call.kind.as_deref() {
        if kind != "function" {
            return Err(ApiError::bad_param(
                &format!("{at}.type"),
                format!("{at}.type must be 'function', got '{kind}'"),
            ));
        }
    }
    let arguments = match call.function.arguments {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(text)) => text,
        Some(value @ Value::Object(_)) => value.to_string(),
        Some(_) => {
            return Err(ApiError::bad_param(
                &format!("{at}.function.arguments"),
                format!("{at}.function.arguments must be a JSON string (or an object)"),
            ))
        }
    };
    Ok(ToolCall { id: call.id.unwrap_or_default(), name: call.function.name, arguments })
}

pub fn is_valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME_LEN
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The request after validation, plus what the HTTP layer itself needs.
#[derive(Debug)]
pub struct ValidatedChat {
    pub request: ChatRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// The files the messages carry, read and named by
    /// [`crate::http::attachments::attach`] before the turn starts.
    pub attachments: Vec<Pending>,
    /// The skills the request brings, written and scanned before the turn
    /// starts ([`crate::http::chat::bring_skills`]).
    pub inline_skills: Vec<InlineSpec>,
}

/// How a surface spells the request fields the validator names in its
/// errors. Every surface's request is translated into this one type and
/// validated once; with its spelling, an error names the field the client
/// actually sent.
#[derive(Debug, Clone, Copy)]
pub struct Spelling {
    /// Before each sampling setting (`temperature`, `top_p`, …): Ollama
    /// keeps them under `options.`.
    pub sampling: &'static str,
    pub max_tokens: &'static str,
    pub stop: &'static str,
    /// Between `tools[n].` and a tool's `name` and parameters.
    pub tool: &'static str,
    pub tool_parameters: &'static str,
    /// Where a JSON schema for the answer goes.
    pub answer_schema: &'static str,
    /// The surface itself, which the request carries on.
    pub surface: Surface,
}

impl Spelling {
    pub const OPENAI: Spelling = Spelling {
        sampling: "",
        max_tokens: "max_tokens",
        stop: "stop",
        tool: "function.",
        tool_parameters: "parameters",
        answer_schema: "response_format.json_schema.schema",
        surface: Surface::OpenAi,
    };

    fn sampling(&self, name: &str) -> String {
        format!("{}{name}", self.sampling)
    }

    fn tool_field(&self, index: usize, field: &str) -> String {
        format!("tools[{index}].{}{field}", self.tool)
    }
}

/// One entry of `skills_inline`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireInlineSkill {
    pub name: String,
    pub files: std::collections::BTreeMap<String, String>,
}

impl ChatCompletionRequest {
    /// Checks everything that can be checked without the model and builds
    /// the internal request. `model_id` is the loaded model's id.
    pub fn validate(self, model_id: &str) -> Result<ValidatedChat, ApiError> {
        self.validate_as(model_id, &Spelling::OPENAI)
    }

    /// [`validate`](Self::validate), naming fields as `spelling` does.
    pub fn validate_as(self, model_id: &str, spelling: &Spelling) -> Result<ValidatedChat, ApiError> {
        if let Some(model) = self.model.as_deref() {
            let matches = model.is_empty() || model == model_id || model.strip_suffix(".gguf") == Some(model_id);
            if !matches {
                return Err(ApiError::ModelNotFound(format!(
                    "the model '{model}' is not served here; this server serves '{model_id}'"
                )));
            }
        }
        if self.messages.is_empty() {
            return Err(ApiError::bad_param("messages", "'messages' must contain at least one message"));
        }
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_param("n", "'n' must be 1; this server returns one choice per request"));
        }
        if self.logprobs == Some(true) {
            return Err(ApiError::bad_param("logprobs", "'logprobs' is not supported by this server"));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        let mut attachments = Vec::new();
        for (index, wire) in self.messages.into_iter().enumerate() {
            let role = role(index, &wire.role)?;
            let (text, files) = content(index, wire.content)?;
            if !files.is_empty() && role != Role::User {
                return Err(ApiError::bad_param(
                    &format!("messages[{index}].content"),
                    format!("messages[{index}] carries a file, but only user messages can"),
                ));
            }
            attachments.extend(files);
            let mut message = ChatMessage::new(role, text);
            if let Some(calls) = wire.tool_calls {
                if role != Role::Assistant {
                    return Err(ApiError::bad_param(
                        &format!("messages[{index}].tool_calls"),
                        format!("messages[{index}] has tool_calls but only assistant messages can"),
                    ));
                }
                message.tool_calls = calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, call)| tool_call(index, i, call))
                    .collect::<Result<_, _>>()?;
            }
            if role == Role::Tool {
                match wire.tool_call_id {
                    Some(id) if !id.is_empty() => message.tool_call_id = Some(id),
                    _ => {
                        return Err(ApiError::bad_param(
                            &format!("messages[{index}].tool_call_id"),
                            format!("messages[{index}] has role 'tool' but no 'tool_call_id'"),
                        ))
                    }
                }
            }
            message.name = wire.name;
            if let Some(raw) = wire.raw {
                if role != Role::Assistant {
                    return Err(ApiError::bad_param(
                        &format!("messages[{index}].{RAW_FIELD}"),
                        format!("messages[{index}] has {RAW_FIELD} but only assistant messages can"),
                    ));
                }
                // It is what the prompt repeats for this turn; the content and
                // calls beside it are what a client shows.
                message.raw = Some(raw);
            }
            messages.push(message);
        }

        let named = |field: &str| spelling.sampling(field);
        let temperature = check_range(&named("temperature"), self.temperature, 0.0, 2.0)?;
        let top_p = check_range(&named("top_p"), self.top_p, 0.0, 1.0)?;
        let min_p = check_range(&named("min_p"), self.min_p, 0.0, 1.0)?;
        let presence_penalty = check_range(&named("presence_penalty"), self.presence_penalty, -2.0, 2.0)?;
        let frequency_penalty = check_range(&named("frequency_penalty"), self.frequency_penalty, -2.0, 2.0)?;
        let repeat_penalty = check_range(&named("repeat_penalty"), self.repeat_penalty, 0.0, 10.0)?;
        let top_k = check_range(&named("top_k"), self.top_k, 0, i32::MAX)?;
        let defaults = SamplingParams::default();
        let sampling = SamplingParams {
            temperature: temperature.unwrap_or(defaults.temperature),
            top_k: top_k.unwrap_or(defaults.top_k),
            top_p: top_p.unwrap_or(defaults.top_p),
            min_p: min_p.unwrap_or(defaults.min_p),
            presence_penalty: presence_penalty.unwrap_or(defaults.presence_penalty),
            frequency_penalty: frequency_penalty.unwrap_or(defaults.frequency_penalty),
            repeat_penalty: repeat_penalty.unwrap_or(defaults.repeat_penalty),
            // Seeds are 32-bit in llama.cpp; larger values are folded in.
            seed: self.seed.map(|s| (s as u64 & 0xffff_ffff) as u32),
            ignore_eos: self.ignore_eos,
        };
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if max_tokens == Some(0) {
            let name = if self.max_completion_tokens.is_some() { "max_completion_tokens" } else { spelling.max_tokens };
            return Err(ApiError::bad_param(name, format!("'{name}' must be at least 1")));
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(many)) => many,
        };
        if stop.len() > MAX_STOP_SEQUENCES {
            let field = spelling.stop;
            return Err(ApiError::bad_param(
                field,
                format!("'{field}' has {} sequences; at most {MAX_STOP_SEQUENCES} are allowed", stop.len()),
            ));
        }

        let mut tools = Vec::new();
        for (index, tool) in self.tools.unwrap_or_default().into_iter().enumerate() {
            if tool.kind != "function" {
                return Err(ApiError::bad_param(
                    &format!("tools[{index}].type"),
                    format!("tools[{index}].type must be 'function', got '{}'", tool.kind),
                ));
            }
            let name = tool.function.name;
            if !is_valid_tool_name(&name) {
                let field = spelling.tool_field(index, "name");
                return Err(ApiError::bad_param(
                    &field,
                    format!("{field} '{name}' must be 1 to {MAX_TOOL_NAME_LEN} letters, digits, '_' or '-'"),
                ));
            }
            if tools.iter().any(|t: &ToolDef| t.name == name) {
                return Err(ApiError::bad_param("tools", format!("the tool '{name}' is declared twice")));
            }
            let field = spelling.tool_field(index, spelling.tool_parameters);
            let parameters = match tool.function.parameters {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(schema @ Value::Object(_)) => schema,
                Some(_) => return Err(ApiError::bad_param(&field, format!("{field} must be a JSON Schema object"))),
            };
            schema_limits::check(&parameters).map_err(|why| ApiError::bad_param(&field, format!("{field} {why}")))?;
            tools.push(ToolDef { name, description: tool.function.description.unwrap_or_default(), parameters });
        }
        if tools.len() > MAX_TOOLS {
            return Err(ApiError::bad_param(
                "tools",
                format!("'tools' has {} entries; at most {MAX_TOOLS} are allowed", tools.len()),
            ));
        }
        let tool_choice = match self.tool_choice {
            None => ToolChoice::Auto,
            Some(WireToolChoice::Mode(mode)) => match mode.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::bad_param(
                        "tool_choice",
                        format!("'tool_choice' must be 'none', 'auto', 'required' or a function object, got '{other}'"),
                    ))
                }
            },
            Some(WireToolChoice::Function { kind, function }) => {
                if kind != "function" {
                    return Err(ApiError::bad_param(
                        "tool_choice.type",
                        format!("tool_choice.type must be 'function', got '{kind}'"),
                    ));
                }
                ToolChoice::Named(function.name)
            }
        };
        let response_format = match self.response_format {
            None => ResponseFormat::Text,
            Some(format) => match format.kind.as_str() {
                "text" => ResponseFormat::Text,
                "json_object" => ResponseFormat::JsonObject,
                "json_schema" => match format.json_schema.and_then(|s| s.schema) {
                    Some(schema @ Value::Object(_)) => {
                        let field = spelling.answer_schema;
                        schema_limits::check(&schema)
                            .map_err(|why| ApiError::bad_param(field, format!("{field} {why}")))?;
                        ResponseFormat::JsonSchema(schema)
                    }
                    Some(_) => {
                        let field = spelling.answer_schema;
                        return Err(ApiError::bad_param(field, format!("{field} must be a JSON Schema object")));
                    }
                    None => {
                        return Err(ApiError::bad_param(
                            "response_format.json_schema",
                            "response_format of type 'json_schema' needs json_schema.schema",
                        ))
                    }
                },
                other => {
                    return Err(ApiError::bad_param(
                        "response_format.type",
                        format!("response_format.type must be 'text', 'json_object' or 'json_schema', got '{other}'"),
                    ))
                }
            },
        };
        Ok(ValidatedChat {
            request: ChatRequest {
                model: self.model.filter(|model| !model.is_empty()),
                messages,
                tools,
                tool_choice,
                parallel_tool_calls: self.parallel_tool_calls.unwrap_or(true),
                response_format,
                sampling,
                max_tokens,
                stop,
                skills: self.skills,
                skills_discovery: self.skills_discovery,
                multi_agent: self.multi_agent,
                temperature_set: temperature.is_some(),
                conversation: None,
                restore: None,
                surface: spelling.surface,
                attachments: Vec::new(),
                mcp: McpSelection { servers: self.mcp_servers, allowed_tools: self.mcp_allowed_tools },
                brought: None,
            },
            inline_skills: self
                .skills_inline
                .into_iter()
                .map(|skill| InlineSpec { name: skill.name, files: skill.files })
                .collect(),
            stream: self.stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            attachments,
        })
    }
}

pub fn finish_reason(finish: ChatFinish) -> &'static str {
    match finish {
        ChatFinish::Stop => "stop",
        ChatFinish::Length | ChatFinish::TimedOut => "length",
        ChatFinish::ToolCalls => "tool_calls",
    }
}

pub fn usage_json(usage: &Usage, timings: &Timings) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": timings.cache_n},
    })
}

/// llama-server's `timings` object.
pub fn timings_json(timings: &Timings) -> Value {
    json!({
        "cache_n": timings.cache_n,
        "copied_n": timings.copied_n,
        "prompt_n": timings.prompt_n,
        "prompt_ms": timings.prompt_ms,
        "prompt_per_second": timings.prompt_per_second(),
        "predicted_n": timings.predicted_n,
        "predicted_ms": timings.predicted_ms,
        "predicted_per_second": timings.predicted_per_second(),
        "draft_n": timings.draft_n,
        "draft_n_accepted": timings.draft_n_accepted,
    })
}

pub fn tool_calls_json(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

/// The turns of our own calls, as OpenAI messages a client can resend:
/// assistant turns with their calls (and raw text), then the results.
pub fn server_messages_json(turns: &[ChatMessage]) -> Value {
    Value::Array(
        turns
            .iter()
            .map(|m| match m.role {
                Role::Tool => json!({
                    "role": "tool",
                    "tool_call_id": m.tool_call_id,
                    "name": m.name,
                    "content": m.content,
                }),
                _ => {
                    let mut object = json!({"role": m.role.template_name(), "content": m.content});
                    if !m.tool_calls.is_empty() {
                        object["tool_calls"] = tool_calls_json(&m.tool_calls);
                    }
                    if let Some(raw) = &m.raw {
                        object[RAW_FIELD] = json!(raw);
                    }
                    object
                }
            })
            .collect(),
    )
}

/// The rounds a request took, for the non-streaming response.
pub fn rounds_json(rounds: &[skillhost_actors::request::RoundStats]) -> Value {
    Value::Array(
        rounds
            .iter()
            .map(|r| {
                json!({
                    "agent_id": r.agent_id,
                    "prompt_tokens": r.prompt_tokens,
                    "cached_tokens": r.cached_tokens,
                    "copied_tokens": r.copied_tokens,
                    "generated_tokens": r.generated_tokens,
                    "time_to_first_token_ms": r.time_to_first_token_ms,
                    "context": {
                        "system": r.context.system,
                        "skills": r.context.skills,
                        "tools": r.context.tools,
                        "skill_bodies": r.context.skill_bodies,
                        "tool_results": r.context.tool_results,
                        "history": r.context.history,
                    },
                    "demoted": r.demoted,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::parse_json;

    fn validate(body: Value) -> Result<ValidatedChat, String> {
        let request: ChatCompletionRequest = parse_json(body.to_string().as_bytes()).map_err(|e| e.to_string())?;
        request.validate("smol").map_err(|e| e.to_string())
    }

    fn user() -> Value {
        json!([{"role": "user", "content": "hi"}])
    }

    #[test]
    fn rejections_say_what_is_wrong() {
        let stops: Vec<String> = (0..=MAX_STOP_SEQUENCES).map(|i| i.to_string()).collect();
        let tools: Vec<Value> =
            (0..=MAX_TOOLS).map(|i| json!({"type": "function", "function": {"name": format!("t{i}")}})).collect();
        let cases = [
            (json!({"messages": []}), "'messages' must contain at least one message"),
            (
                json!({"model": "gpt-4", "messages": user()}),
                "the model 'gpt-4' is not served here; this server serves 'smol'",
            ),
            (json!({"messages": [{"role": "robot", "content": "x"}]}), "messages[0].role must be one of"),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages[0] has role 'tool' but no 'tool_call_id'",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content[0] is an image part without 'image_url'",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}),
                "'messages[0].content[0].image_url' is a URL; this server fetches nothing from the network",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}),
                "messages[0].content[0].file needs one of 'file_id' (a file uploaded to /v1/files) or 'file_data'",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_data": "%%%"}}]}]}),
                "'messages[0].content[0].file.file_data' is not valid base64",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}]}),
                "messages[0] carries a file, but only user messages can",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}),
                "has type 'input_audio'; this server accepts text, image_url and file parts",
            ),
            (json!({"messages": user(), "temperature": 2.5}), "'temperature' must be between 0 and 2, got 2.5"),
            (json!({"messages": user(), "top_p": -0.1}), "'top_p' must be between 0 and 1, got -0.1"),
            (json!({"messages": user(), "max_tokens": 0}), "'max_tokens' must be at least 1"),
            (json!({"messages": user(), "n": 2}), "'n' must be 1"),
            (json!({"messages": user(), "stop": stops}), "'stop' has 17 sequences; at most 16 are allowed"),
            (json!({"messages": user(), "tools": tools}), "'tools' has 129 entries; at most 128 are allowed"),
            (
                json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "must be 1 to 64 letters",
            ),
            (
                json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}),
                "the tool 'a' is declared twice",
            ),
            (
                json!({"messages": user(), "tool_choice": "sometimes"}),
                "'tool_choice' must be 'none', 'auto', 'required'",
            ),
            (json!({"messages": user(), "response_format": {"type": "json_schema"}}), "needs json_schema.schema"),
            (json!({"messages": user(), "response_format": {"type": "yaml"}}), "response_format.type must be"),
            (json!({"messages": "hi"}), "'messages' is invalid: invalid type: string"),
        ];
        for (body, expected) in cases {
            match validate(body.clone()) {
                Ok(_) => panic!("accepted {body}"),
                Err(message) => {
                    assert!(message.contains(expected), "{message:?} does not contain {expected:?} for {body}")
                }
            }
        }
    }

    #[test]
    fn limits_are_accepted_at_the_limit() {
        let stops: Vec<String> = (0..MAX_STOP_SEQUENCES).map(|i| i.to_string()).collect();
        let tools: Vec<Value> =
            (0..MAX_TOOLS).map(|i| json!({"type": "function", "function": {"name": format!("t{i}")}})).collect();
        let long_name = "a".repeat(MAX_TOOL_NAME_LEN);
        let too_long = "a".repeat(MAX_TOOL_NAME_LEN + 1);
        assert!(validate(json!({"messages": user(), "stop": stops, "tools": tools})).is_ok());
        assert!(validate(
            json!({"messages": user(), "tools": [{"type": "function", "function": {"name": long_name}}]})
        )
        .is_ok());
        assert!(validate(json!({"messages": user(), "tools": [{"type": "function", "function": {"name": too_long}}]}))
            .is_err());
    }

    #[test]
    fn accepts_openai_shapes() {
        let body = json!({
            "model": "smol.gguf",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_completion_tokens": 5,
            "stop": "x",
            "tool_choice": {"type": "function", "function": {"name": "w"}},
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
            "user": "ignored-unknown-field"
        });
        let validated = match validate(body) {
            Ok(v) => v,
            Err(err) => panic!("{err}"),
        };
        assert!(validated.stream && validated.include_usage);
        assert_eq!(validated.request.messages[0].content, "Be brief.");
        assert_eq!(validated.request.messages[2].tool_calls[0].name, "w");
        assert_eq!(validated.request.tool_choice, ToolChoice::Named("w".into()));
        assert_eq!(validated.request.max_tokens, Some(5));
        assert_eq!(validated.request.stop, vec!["x".to_string()]);
    }
}
