//! Ollama's chat API: `POST /api/chat/ollama`, and Ollama's own paths under
//! `/ollama` (`/ollama/api/chat`, `tags`, `show`, `version`) so the official
//! clients work by changing only their host. Requests are translated into
//! the OpenAI request type and validated by the same code.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use chrono::{SecondsFormat, Utc};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use skillhost_actors::request::{RoundStats, Surface};
use skillhost_actors::{ChatFinish, ModelStatus, Usage};
use skillhost_engine::{ModelInfo, ToolCall};

use crate::http::body::read_json;
use crate::http::chat::{guarded, model_info};
use crate::http::error::{ApiError, ErrorStyle, PlainError};
use crate::http::openai::{
    ChatCompletionRequest, Spelling, Stop, WireContent, WireFunctionCall, WireImageUrl, WireJsonSchema, WireMessage,
    WirePart, WireResponseFormat, WireTool, WireToolCall, WireToolChoice,
};
use crate::http::ops::model_id;
use crate::http::stream::{begin_translated, collect, event_stream, Begun, Encoder, Ending, Finish, LoadNews};
use crate::http::AppState;

/// The Ollama API version we answer `/api/version` with: the one whose
/// request and response shapes these routes follow.
pub const OLLAMA_API_VERSION: &str = "0.12.0";
/// Ollama names models `name:tag`; ours has one tag.
const TAG: &str = ":latest";

#[derive(Debug, Deserialize)]
pub struct OllamaChatRequest {
    model: Option<String>,
    messages: Vec<OllamaMessage>,
    tools: Option<Vec<WireTool>>,
    /// `"json"` or a JSON schema.
    format: Option<Value>,
    options: Option<OllamaOptions>,
    /// Ollama streams unless told otherwise.
    stream: Option<bool>,
    #[serde(default)]
    skills: Vec<String>,
    skills_discovery: Option<bool>,
    multi_agent: Option<bool>,
    /// The operator's MCP servers this request may use (default: all).
    mcp_servers: Option<Vec<String>>,
    /// Not Ollama's: OpenAI's `tool_choice`, for clients that must have a call.
    tool_choice: Option<WireToolChoice>,
}

#[derive(Debug, Deserialize)]
struct OllamaMessage {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    images: Option<Vec<Value>>,
    #[serde(default)]
    tool_calls: Option<Vec<OllamaToolCall>>,
    /// On a tool result: the tool it answers.
    #[serde(default)]
    tool_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OllamaToolCall {
    function: OllamaFunction,
}

#[derive(Debug, Deserialize)]
struct OllamaFunction {
    name: String,
    /// An object, as Ollama sends it.
    #[serde(default)]
    arguments: Option<Value>,
}

/// The options we honour; others (num_ctx, num_gpu, …) are ignored, as
/// they describe how Ollama loads a model, which the operator decides here.
#[derive(Debug, Default, Deserialize)]
struct OllamaOptions {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    /// -1 (no limit) and -2 (fill the context) mean no limit.
    num_predict: Option<i64>,
    seed: Option<i64>,
    stop: Option<Vec<String>>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
}

fn model_name(info: &ModelInfo) -> String {
    format!("{}{TAG}", info.id)
}

/// Ollama keeps sampling settings, the token budget and stop strings under
/// `options`, and the answer's schema in `format`.
const SPELLING: Spelling = Spelling {
    sampling: "options.",
    max_tokens: "options.num_predict",
    stop: "options.stop",
    answer_schema: "format",
    surface: Surface::Ollama,
    ..Spelling::OPENAI
};

/// Ollama's request, as the OpenAI request the rest of the server takes.
fn translate(request: OllamaChatRequest) -> Result<ChatCompletionRequest, ApiError> {
    let options = request.options.unwrap_or_default();
    let max_tokens = match options.num_predict {
        None => None,
        Some(n) if n < 0 => None,
        Some(n) => Some(u32::try_from(n).map_err(|_| {
            ApiError::bad_param("options.num_predict", format!("'options.num_predict' is too large: {n}"))
        })?),
    };
    let response_format = match request.format {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "json" => {
            Some(WireResponseFormat { kind: "json_object".into(), json_schema: None })
        }
        Some(Value::String(s)) if s.is_empty() => None,
        Some(schema @ Value::Object(_)) => Some(WireResponseFormat {
            kind: "json_schema".into(),
            json_schema: Some(WireJsonSchema { schema: Some(schema) }),
        }),
        Some(other) => {
            return Err(ApiError::bad_param(
                "format",
                format!("'format' must be \"json\" or a JSON schema, got {other}"),
            ))
        }
    };
    // Ollama's calls carry no ids; results name the tool instead. Give each
    // call an id and hand it to the first result naming that tool.
    let mut pending: Vec<(String, String)> = Vec::new();
    let mut messages = Vec::with_capacity(request.messages.len());
    for (index, message) in request.messages.into_iter().enumerate() {
        // Ollama's `images` are base64 strings; each becomes an image part
        // (a file with a note: this server's models cannot see them).
        let mut images = Vec::new();
        for (n, image) in message.images.unwrap_or_default().into_iter().enumerate() {
            let at = format!("messages[{index}].images[{n}]");
            let Value::String(data) = image else {
                return Err(ApiError::bad_param(&at, format!("'{at}' must be a base64 string")));
            };
            let url = if data.starts_with("data:") { data } else { format!("data:;base64,{data}") };
            images.push(WirePart {
                kind: "image_url".into(),
                image_url: Some(WireImageUrl { url, detail: None }),
                at: Some(at),
                ..WirePart::default()
            });
        }
        let tool_calls = message.tool_calls.map(|calls| {
            calls
                .into_iter()
                .enumerate()
                .map(|(n, call)| {
                    let id = format!("call_{index}_{n}");
                    pending.push((id.clone(), call.function.name.clone()));
                    WireToolCall {
                        id: Some(id),
                        kind: Some("function".into()),
                        function: WireFunctionCall { name: call.function.name, arguments: call.function.arguments },
                    }
                })
                .collect()
        });
        let tool_call_id = (message.role == "tool").then(|| {
            let position = match &message.tool_name {
                Some(name) => pending.iter().position(|(_, n)| n == name),
                None => (!pending.is_empty()).then_some(0),
            };
            match position {
                Some(position) => pending.remove(position).0,
                None => format!("call_{index}"),
            }
        });
        let content = if images.is_empty() {
            message.content.map(WireContent::Text)
        } else {
            let text = WirePart { kind: "text".into(), text: message.content, ..WirePart::default() };
            Some(WireContent::Parts(std::iter::once(text).chain(images).collect()))
        };
        messages.push(WireMessage {
            role: message.role,
            content,
            tool_calls,
            tool_call_id,
            name: message.tool_name,
            raw: None,
        });
    }
    let wire = ChatCompletionRequest {
        // Ollama streams unless told otherwise.
        stream: request.stream.unwrap_or(true),
        model: request.model.map(|m| m.strip_suffix(TAG).map(str::to_string).unwrap_or(m)),
        messages,
        tools: request.tools,
        response_format,
        temperature: options.temperature,
        top_p: options.top_p,
        top_k: options.top_k,
        min_p: options.min_p,
        max_tokens,
        seed: options.seed,
        stop: options.stop.map(Stop::Many),
        repeat_penalty: options.repeat_penalty,
        presence_penalty: options.presence_penalty,
        frequency_penalty: options.frequency_penalty,
        skills: request.skills,
        skills_discovery: request.skills_discovery,
        multi_agent: request.multi_agent,
        mcp_servers: request.mcp_servers,
        tool_choice: request.tool_choice,
        ..ChatCompletionRequest::default()
    };
    Ok(wire)
}

/// `POST /api/chat/ollama` and `POST /ollama/api/chat`
pub async fn chat(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, PlainError> {
    let started = Instant::now();
    Ok(guarded(&state, "ollama", serve(&state, &request, payload, started)).await?)
}

async fn serve(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    payload: web::Payload,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let wire = translate(read_json(request, payload).await?)?;
    let (asked, stream) = (wire.model.clone(), wire.stream);
    let (app, request) = (state.clone(), request.clone());
    let work = async move { respond(&app, &request, wire, started).await };
    crate::http::stream::after_load::<OllamaEncoder>(state, asked.as_deref(), stream, work).await
}

async fn respond(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    wire: ChatCompletionRequest,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let Begun { chat, peer, info, stream, .. } = begin_translated(state, request, &SPELLING, wire).await?;
    let reply = Reply { model: model_name(&info), started };
    if stream {
        let lines = event_stream(state.clone(), chat, peer, started, OllamaEncoder { reply });
        return Ok(OllamaEncoder::response(lines));
    }
    let done = collect(state, chat, peer, started).await?;
    let mut message = json!({"role": "assistant", "content": done.text});
    if !done.reasoning.is_empty() {
        message["thinking"] = Value::String(done.reasoning);
    }
    if !done.calls.is_empty() {
        message["tool_calls"] = tool_calls_json(&done.calls);
    }
    Ok(HttpResponse::Ok().json(reply.done(message, done.finish, &done.usage, &done.rounds)))
}

/// What every line of one reply shares.
struct Reply {
    model: String,
    started: Instant,
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Nanos, true)
}

fn nanos(ms: f64) -> u64 {
    (ms * 1_000_000.0).max(0.0) as u64
}

/// Ollama's calls: arguments as an object.
fn tool_calls_json(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|call| {
                // A call cut short by the budget keeps the part written whole.
                let arguments = skillhost_engine::arguments_object(&call.arguments);
                json!({"function": {"name": call.name, "arguments": arguments}})
            })
            .collect(),
    )
}

impl Reply {
    fn line(&self, message: Value) -> Value {
        json!({"model": self.model, "created_at": now(), "message": message, "done": false})
    }

    /// The last object: Ollama's counts and durations (nanoseconds).
    fn done(&self, message: Value, finish: ChatFinish, usage: &Usage, rounds: &[RoundStats]) -> Value {
        let total = nanos(self.started.elapsed().as_secs_f64() * 1000.0);
        let prompt: u64 = rounds.iter().map(|r| nanos(r.time_to_first_token_ms)).sum();
        json!({
            "model": self.model,
            "created_at": now(),
            "message": message,
            "done": true,
            "done_reason": if finish.cut_short() { "length" } else { "stop" },
            "total_duration": total,
            "load_duration": 0,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": prompt,
            "eval_count": usage.completion_tokens,
            "eval_duration": total.saturating_sub(prompt),
        })
    }
}

fn line_bytes(value: &Value) -> Bytes {
    Bytes::from(format!("{value}\n"))
}

/// Ollama's stream: one JSON object per line, the last with `done: true`.
struct OllamaEncoder {
    reply: Reply,
}

impl Encoder for OllamaEncoder {
    fn content(&mut self, text: &str) -> Vec<Bytes> {
        vec![line_bytes(&self.reply.line(json!({"role": "assistant", "content": text})))]
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        vec![line_bytes(&self.reply.line(json!({"role": "assistant", "content": "", "thinking": text})))]
    }

    fn tool_calls(&mut self, calls: &[ToolCall]) -> Vec<Bytes> {
        let message = json!({"role": "assistant", "content": "", "tool_calls": tool_calls_json(calls)});
        vec![line_bytes(&self.reply.line(message))]
    }

    fn finished(&mut self, end: Finish<'_>) -> Ending {
        let message = json!({"role": "assistant", "content": ""});
        vec![line_bytes(&self.reply.done(message, end.finish, end.usage, end.rounds))].into()
    }

    fn error_frame(err: &ApiError) -> Bytes {
        line_bytes(&err.body(ErrorStyle::Plain))
    }

    /// NDJSON has no comments: a line with an empty message, as Ollama's
    /// own streams carry between parts, with the load's news beside it
    /// (Ollama's clients ignore fields they do not know).
    fn load_frame(news: &LoadNews<'_>) -> Bytes {
        line_bytes(&json!({
            "model": news.model,
            "created_at": now(),
            "message": {"role": "assistant", "content": ""},
            "done": false,
            "loading": news.json(),
        }))
    }

    fn response(lines: impl Stream<Item = Result<Bytes, actix_web::Error>> + 'static) -> HttpResponse {
        HttpResponse::Ok().content_type("application/x-ndjson").streaming(lines)
    }
}

fn details(info: &ModelInfo) -> Value {
    let quantization = info.id.rsplit(['.', '-']).next().unwrap_or_default().to_string();
    json!({
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture],
        "parameter_size": parameter_size(info.n_params),
        "quantization_level": quantization,
    })
}

fn parameter_size(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{}M", n / 1_000_000),
        n => format!("{n}"),
    }
}

/// `GET /ollama/api/tags`: every configured model, loaded or not.
pub async fn tags(state: web::Data<AppState>) -> Result<HttpResponse, PlainError> {
    let modified = chrono::DateTime::<Utc>::from_timestamp(state.started_at as i64, 0).unwrap_or_default();
    let models: Vec<Value> = state
        .server
        .models()
        .models
        .iter()
        .map(|model| {
            let name = format!("{}{TAG}", model_id(model));
            let details = match &model.status {
                ModelStatus::Ready { info, .. } => details(info),
                _ => json!({"format": "gguf"}),
            };
            json!({
                "name": name,
                "model": name,
                "modified_at": modified.to_rfc3339_opts(SecondsFormat::Secs, true),
                "size": model.bytes,
                "digest": "",
                "details": details,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"models": models})))
}

/// `GET /ollama/api/ps`: the models in memory now.
pub async fn ps(state: web::Data<AppState>) -> Result<HttpResponse, PlainError> {
    let models: Vec<Value> = state
        .server
        .models()
        .models
        .iter()
        .filter_map(|model| match &model.status {
            ModelStatus::Ready { info, .. } => Some(json!({
                "name": model_name(info),
                "model": model_name(info),
                "size": model.bytes,
                "digest": "",
                "details": details(info),
                // Ollama's field for when it unloads the model; ours is
                // --model-idle-unload after the last use, not a fixed time.
                "expires_at": null,
                "size_vram": 0,
                "context_length": info.n_ctx,
            })),
            _ => None,
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"models": models})))
}

#[derive(Debug, Deserialize)]
pub struct ShowRequest {
    model: Option<String>,
    /// The older spelling.
    name: Option<String>,
}

/// `POST /ollama/api/show`
pub async fn show(
    state: web::Data<AppState>,
    http: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, PlainError> {
    let request: ShowRequest = read_json(&http, payload).await?;
    let asked = request.model.or(request.name).unwrap_or_default();
    if asked.is_empty() {
        return Err(ApiError::bad_param("model", "'model' names the model to show").into());
    }
    let bare = asked.strip_suffix(TAG).unwrap_or(&asked);
    let info = model_info(&state, Some(bare)).await?;
    let mut capabilities = if info.embedding { vec!["embedding"] } else { vec!["completion"] };
    if info.format.capabilities().tools && !info.embedding {
        capabilities.push("tools");
    }
    Ok(HttpResponse::Ok().json(json!({
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details(&info),
        "model_info": {
            "general.architecture": info.architecture,
            "general.parameter_count": info.n_params,
            format!("{}.context_length", info.architecture): info.n_ctx_train,
        },
        "capabilities": capabilities,
        "modified_at": chrono::DateTime::<Utc>::from_timestamp(state.started_at as i64, 0)
            .unwrap_or_default()
            .to_rfc3339_opts(SecondsFormat::Secs, true),
    })))
}

/// `GET /ollama/api/version`
pub async fn version() -> HttpResponse {
    HttpResponse::Ok().json(json!({"version": OLLAMA_API_VERSION}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translated(body: Value) -> Result<(ChatCompletionRequest, bool), ApiError> {
        translate(serde_json::from_value(body).unwrap()).map(|wire| {
            let stream = wire.stream;
            (wire, stream)
        })
    }

    #[test]
    fn tool_results_get_the_ids_of_the_calls_they_answer() {
        let (wire, stream) = translated(json!({
            "model": "smol:latest",
            "messages": [
                {"role": "user", "content": "weather in Paris and the time?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
                    {"function": {"name": "time", "arguments": {}}}
                ]},
                {"role": "tool", "tool_name": "time", "content": "noon"},
                {"role": "tool", "tool_name": "weather", "content": "sunny"}
            ],
            "options": {"num_predict": -1, "temperature": 0.5, "stop": ["x"]}
        }))
        .unwrap();
        assert!(stream, "Ollama streams by default");
        assert_eq!(wire.model.as_deref(), Some("smol"));
        assert_eq!(wire.max_tokens, None);
        assert_eq!(wire.temperature, Some(0.5));
        assert_eq!(wire.messages[2].tool_call_id.as_deref(), Some("call_1_1"));
        assert_eq!(wire.messages[3].tool_call_id.as_deref(), Some("call_1_0"));
        let validated = wire.validate("smol").unwrap();
        assert_eq!(validated.request.messages[1].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let cases = [
            (json!({"messages": [], "format": 3}), "'format' must be"),
            (
                json!({"messages": [{"role": "user", "content": "x", "images": [7]}]}),
                "'messages[0].images[0]' must be a base64 string",
            ),
        ];
        for (body, message) in cases {
            let err = translated(body).unwrap_err();
            assert!(err.to_string().contains(message), "{err}");
        }
        let (wire, stream) = translated(json!({"messages": [], "format": "json", "stream": false})).unwrap();
        assert!(!stream);
        assert_eq!(wire.response_format.unwrap().kind, "json_object");
    }
}
