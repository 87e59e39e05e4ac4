//! What goes over the wire to an upstream and what comes back: the request
//! body for each dialect, and the reader of its event stream.

use std::io::BufRead;
use std::time::Instant;

use serde_json::{json, Map, Value};

use crate::chat::{ChatMessage, ChatPayload, ResponseFormat, Role, ToolCall, ToolChoice};
use crate::protocol::{FinishReason, GenerateRequest, Timings};
use crate::sampling::CompiledGrammar;

/// The longest line of an upstream's event stream accepted; a longer one
/// ends the request (an upstream is input we did not write).
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;
/// The most an upstream may send for one answer, every line counted: its
/// token budget bounds a well-behaved one far below this.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Most tool calls one chat-mode answer may carry.
pub const MAX_STREAMED_CALLS: usize = 64;

/// How an upstream is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// llama-server's own `/completion`: raw text, `cache_prompt`, GBNF
    /// with lazy triggers, and `timings` with `cache_n`.
    LlamaServer,
    /// OpenAI's `/v1/completions` (vLLM, SGLang, TGI): raw text.
    OpenAiCompletions,
    /// OpenAI's `/v1/chat/completions`: messages and tool declarations.
    OpenAiChat,
}

impl Dialect {
    pub fn path(self) -> &'static str {
        match self {
            Dialect::LlamaServer => "/completion",
            Dialect::OpenAiCompletions => "/v1/completions",
            Dialect::OpenAiChat => "/v1/chat/completions",
        }
    }

    /// The path whose `200` says the upstream can serve.
    pub fn health_path(self) -> &'static str {
        match self {
            Dialect::LlamaServer => "/health",
            Dialect::OpenAiCompletions | Dialect::OpenAiChat => "/v1/models",
        }
    }
}

/// The body of one generation request.
pub fn body(
    dialect: Dialect,
    request: &GenerateRequest,
    grammar: Option<&CompiledGrammar>,
    model: Option<&str>,
    strip_bos: Option<&str>,
) -> Value {
    let sampling = &request.sampling;
    let mut body = Map::new();
    let mut put = |key: &str, value: Value| {
        body.insert(key.into(), value);
    };
    let prompt = match strip_bos {
        Some(bos) if !bos.is_empty() => request.prompt.strip_prefix(bos).unwrap_or(&request.prompt),
        _ => &request.prompt,
    };
    put("stream", json!(true));
    put("temperature", json!(sampling.temperature.max(0.0)));
    put("top_p", json!(sampling.top_p));
    put("presence_penalty", json!(sampling.presence_penalty));
    put("frequency_penalty", json!(sampling.frequency_penalty));
    if let Some(seed) = sampling.seed {
        put("seed", json!(seed));
    }
    if !request.stops.is_empty() {
        put("stop", json!(request.stops));
    }
    if let Some(model) = model {
        put("model", json!(model));
    }
    match dialect {
        Dialect::LlamaServer => {
            put("prompt", json!(prompt));
            put("cache_prompt", json!(true));
            // Token ids are not read: leaving them out shortens every event.
            put("return_tokens", json!(false));
            put("n_predict", json!(request.max_tokens.map_or(-1, i64::from)));
            put("top_k", json!(sampling.top_k));
            put("min_p", json!(sampling.min_p));
            put("repeat_penalty", json!(sampling.repeat_penalty));
            put("ignore_eos", json!(sampling.ignore_eos));
            if let Some(grammar) = grammar {
                llama_grammar(&mut put, grammar);
            }
        }
        Dialect::OpenAiCompletions => {
            put("prompt", json!(prompt));
            put("stream_options", json!({"include_usage": true}));
            if let Some(max) = request.max_tokens {
                put("max_tokens", json!(max));
            }
            // vLLM's extensions; others ignore them. The prompt is rendered
            // whole, specials included, so none are added.
            put("top_k", json!(sampling.top_k));
            put("min_p", json!(sampling.min_p));
            put("repetition_penalty", json!(sampling.repeat_penalty));
            put("add_special_tokens", json!(false));
            if let Some(grammar) = grammar {
                // llama.cpp's servers read their own fields here too, lazy
                // triggers included; others ignore them.
                llama_grammar(&mut put, grammar);
                // vLLM applies `guided_grammar` from the first token: only a
                // grammar that holds from the first token may go there, or
                // every answer would be forced into a tool call.
                if grammar.trigger.is_none() {
                    put("guided_grammar", json!(crate::grammar::rooted(grammar)));
                }
            }
        }
        Dialect::OpenAiChat => {
            let chat = request.chat.as_deref().cloned().unwrap_or_default();
            put("messages", Value::Array(chat.messages.iter().map(message).collect()));
            put("stream_options", json!({"include_usage": true}));
            if let Some(max) = request.max_tokens {
                put("max_tokens", json!(max));
            }
            add_tools(&mut body, &chat);
        }
    }
    Value::Object(body)
}

/// llama-server's grammar fields.
fn llama_grammar(put: &mut impl FnMut(&str, Value), grammar: &CompiledGrammar) {
    put("grammar", json!(crate::grammar::rooted(grammar)));
    if let Some(trigger) = &grammar.trigger {
        // Type 1 is a word; a word that is one special token must also be
        // preserved, or llama-server refuses it.
        put("grammar_lazy", json!(true));
        put("grammar_triggers", json!([{"type": 1, "value": trigger}]));
        put("preserved_tokens", json!([trigger]));
    }
}

fn add_tools(body: &mut Map<String, Value>, chat: &ChatPayload) {
    if !chat.tools.is_empty() {
        // A named choice goes out as `required` with only that tool on
        // offer: the same constraint, and servers that take only the string
        // forms (llama-server) apply it too.
        let named = match &chat.tool_choice {
            ToolChoice::Named(name) => Some(name.as_str()),
            _ => None,
        };
        let tools: Vec<Value> = chat
            .tools
            .iter()
            .filter(|t| named.is_none_or(|name| t.name == name))
            .map(|t| {
                json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        body.insert("parallel_tool_calls".into(), json!(chat.parallel_tool_calls));
        let choice = match &chat.tool_choice {
            ToolChoice::None => json!("none"),
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(_) => json!("required"),
        };
        body.insert("tool_choice".into(), choice);
    }
    match &chat.response_format {
        ResponseFormat::Text => {}
        ResponseFormat::JsonObject => {
            body.insert("response_format".into(), json!({"type": "json_object"}));
        }
        ResponseFormat::JsonSchema(schema) => {
            body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}),
            );
        }
    }
}

/// One message in OpenAI's shape; the model's raw text is ours only.
fn message(m: &ChatMessage) -> Value {
    let role = match m.role {
        Role::System | Role::Developer => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut out = json!({"role": role, "content": m.content});
    if !m.tool_calls.is_empty() {
        if m.content.is_empty() {
            out["content"] = Value::Null;
        }
        out["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    if let Some(id) = &m.tool_call_id {
        out["tool_call_id"] = json!(id);
    }
    out
}

/// What one event of the stream meant.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Text to pass on (may be empty).
    Text(String),
    /// The answer is complete.
    Done { reason: FinishReason, calls: Vec<ToolCall>, timings: Timings },
    /// Nothing to pass on (keep-alive, a usage-only chunk).
    Nothing,
}

/// Why an upstream's stream was given up. The upstream is marked down with
/// it; the request is retried on another upstream before its first token,
/// and fails with it after.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("reading its stream failed ({0})")]
    Read(String),
    #[error("it sent an event longer than {MAX_EVENT_BYTES} bytes")]
    EventTooLong,
    #[error("it sent more than {MAX_ANSWER_BYTES} bytes for one answer")]
    AnswerTooLong,
    #[error("it sent an event that is not UTF-8")]
    NotUtf8,
    #[error("it sent an event that is not JSON ({0})")]
    NotJson(String),
    /// The upstream's own error event.
    #[error("it reported an error: {0}")]
    Reported(String),
    #[error("it sent more than {MAX_STREAMED_CALLS} tool calls in one answer")]
    TooManyCalls,
}

/// Reads one dialect's event stream, one event at a time.
pub struct StreamReader {
    dialect: Dialect,
    started: Instant,
    first_text: Option<Instant>,
    finish: Option<FinishReason>,
    calls: Vec<PartialCall>,
    usage: Option<Value>,
    timings: Option<Value>,
    chunks: usize,
    /// Bytes read so far, against [`MAX_ANSWER_BYTES`].
    received: usize,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl StreamReader {
    pub fn new(dialect: Dialect, started: Instant) -> Self {
        StreamReader {
            dialect,
            started,
            first_text: None,
            finish: None,
            calls: Vec::new(),
            usage: None,
            timings: None,
            chunks: 0,
            received: 0,
        }
    }

    /// Reads the next event from `reader`; `Ok(None)` at the stream's end.
    pub fn next<R: BufRead>(&mut self, reader: &mut R, line: &mut Vec<u8>) -> Result<Option<Step>, StreamError> {
        loop {
            line.clear();
            let n = std::io::Read::take(&mut *reader, MAX_EVENT_BYTES as u64 + 1)
                .read_until(b'\n', line)
                .map_err(|err| StreamError::Read(err.to_string()))?;
            if n == 0 {
                // OpenAI streams end with `[DONE]`, but an end after the
                // finish reason loses nothing.
                return Ok(self.finish.is_some().then(|| self.done()));
            }
            if line.len() > MAX_EVENT_BYTES {
                return Err(StreamError::EventTooLong);
            }
            self.received += n;
            if self.received > MAX_ANSWER_BYTES {
                return Err(StreamError::AnswerTooLong);
            }
            let text = std::str::from_utf8(line).map_err(|_| StreamError::NotUtf8)?;
            let text = text.trim_end_matches(['\r', '\n']);
            if let Some(error) = text.strip_prefix("error:") {
                return Err(StreamError::Reported(error.trim().to_string()));
            }
            let Some(data) = text.strip_prefix("data:") else { continue };
            let data = data.trim_start();
            if data == "[DONE]" {
                return Ok(Some(self.done()));
            }
            let event: Value = serde_json::from_str(data).map_err(|err| StreamError::NotJson(err.to_string()))?;
            if let Some(error) = event.get("error") {
                let message =
                    error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), String::from);
                return Err(StreamError::Reported(message));
            }
            return self.event(&event).map(Some);
        }
    }

    fn event(&mut self, event: &Value) -> Result<Step, StreamError> {
        self.chunks += 1;
        if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        if let Some(timings) = event.get("timings").filter(|t| t.is_object()) {
            self.timings = Some(timings.clone());
        }
        match self.dialect {
            Dialect::LlamaServer => {
                let text = event.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
                self.saw_text(&text);
                if event.get("stop").and_then(Value::as_bool) == Some(true) {
                    self.finish = Some(match event.get("stop_type").and_then(Value::as_str) {
                        Some("limit") => FinishReason::Length,
                        _ => FinishReason::Stop,
                    });
                    let evaluated = event.get("tokens_evaluated").and_then(Value::as_u64);
                    let mut done = self.done();
                    if let (Step::Done { timings, .. }, Some(n)) = (&mut done, evaluated) {
                        if timings.cache_n + timings.prompt_n == 0 {
                            timings.prompt_n = n as usize;
                        }
                    }
                    if !text.is_empty() {
                        // Rare, but the last chunk may carry text: pass it
                        // on first, then finish at the stream's end.
                        return Ok(Step::Text(text));
                    }
                    return Ok(done);
                }
                Ok(Step::Text(text))
            }
            Dialect::OpenAiCompletions | Dialect::OpenAiChat => {
                let Some(choice) = event.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
                    return Ok(Step::Nothing);
                };
                if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                    self.finish = Some(if reason == "length" { FinishReason::Length } else { FinishReason::Stop });
                }
                let text = if self.dialect == Dialect::OpenAiCompletions {
                    choice.get("text").and_then(Value::as_str).unwrap_or_default().to_string()
                } else {
                    let delta = choice.get("delta").cloned().unwrap_or(Value::Null);
                    self.read_calls(&delta)?;
                    delta.get("content").and_then(Value::as_str).unwrap_or_default().to_string()
                };
                self.saw_text(&text);
                Ok(Step::Text(text))
            }
        }
    }

    fn saw_text(&mut self, text: &str) {
        if !text.is_empty() && self.first_text.is_none() {
            self.first_text = Some(Instant::now());
        }
    }

    /// Chat mode: tool calls arrive as pieces keyed by their index.
    fn read_calls(&mut self, delta: &Value) -> Result<(), StreamError> {
        let Some(pieces) = delta.get("tool_calls").and_then(Value::as_array) else { return Ok(()) };
        if self.first_text.is_none() {
            self.first_text = Some(Instant::now());
        }
        for piece in pieces {
            let index = piece.get("index").and_then(Value::as_u64).unwrap_or(self.calls.len() as u64) as usize;
            if index >= MAX_STREAMED_CALLS {
                return Err(StreamError::TooManyCalls);
            }
            while self.calls.len() <= index {
                self.calls.push(PartialCall::default());
            }
            let call = &mut self.calls[index];
            if let Some(id) = piece.get("id").and_then(Value::as_str) {
                call.id = id.to_string();
            }
            let function = piece.get("function");
            if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) {
                call.name.push_str(name);
            }
            if let Some(arguments) = function.and_then(|f| f.get("arguments")) {
                match arguments {
                    Value::String(text) => call.arguments.push_str(text),
                    other => call.arguments.push_str(&other.to_string()),
                }
            }
        }
        Ok(())
    }

    /// The answer's end: its reason, calls and timings (the upstream's own
    /// when it sends them, llama-server's `timings`; else measured here
    /// with its token counts).
    fn done(&mut self) -> Step {
        let reason = self.finish.unwrap_or(FinishReason::Stop);
        let calls = std::mem::take(&mut self.calls)
            .into_iter()
            .filter(|c| !c.name.is_empty())
            .map(|c| ToolCall { id: c.id, name: c.name, arguments: c.arguments })
            .collect();
        let now = Instant::now();
        let first = self.first_text.unwrap_or(now);
        let mut timings = Timings {
            prompt_ms: first.duration_since(self.started).as_secs_f64() * 1000.0,
            predicted_ms: now.duration_since(first).as_secs_f64() * 1000.0,
            ..Timings::default()
        };
        let count = |v: &Value, key: &str| v.get(key).and_then(Value::as_u64).map(|n| n as usize);
        if let Some(usage) = &self.usage {
            let prompt = count(usage, "prompt_tokens").unwrap_or_default();
            let cached = usage.get("prompt_tokens_details").and_then(|d| count(d, "cached_tokens")).unwrap_or_default();
            timings.cache_n = cached.min(prompt);
            timings.prompt_n = prompt - timings.cache_n;
            timings.predicted_n = count(usage, "completion_tokens").unwrap_or(self.chunks);
        }
        if let Some(upstream) = &self.timings {
            let ms = |key: &str| upstream.get(key).and_then(Value::as_f64);
            timings.cache_n = count(upstream, "cache_n").unwrap_or(timings.cache_n);
            timings.prompt_n = count(upstream, "prompt_n").unwrap_or(timings.prompt_n);
            timings.predicted_n = count(upstream, "predicted_n").unwrap_or(timings.predicted_n);
            timings.prompt_ms = ms("prompt_ms").unwrap_or(timings.prompt_ms);
            timings.predicted_ms = ms("predicted_ms").unwrap_or(timings.predicted_ms);
        }
        Step::Done { reason, calls, timings }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn read_all(dialect: Dialect, stream: &str) -> Result<Vec<Step>, StreamError> {
        let mut reader = StreamReader::new(dialect, Instant::now());
        let mut input = stream.as_bytes();
        let mut line = Vec::new();
        let mut steps = Vec::new();
        while let Some(step) = reader.next(&mut input, &mut line)? {
            let done = matches!(step, Step::Done { .. });
            steps.push(step);
            if done {
                break;
            }
        }
        Ok(steps)
    }

    #[test]
    fn llama_server_stream_with_timings() {
        let stream = "data: {\"content\":\"Hi\",\"stop\":false}\n\ndata: {\"content\":\"\",\"stop\":true,\"stop_type\":\"limit\",\"timings\":{\"cache_n\":7,\"prompt_n\":3,\"prompt_ms\":1.5,\"predicted_n\":1,\"predicted_ms\":2.0}}\n\n";
        let steps = read_all(Dialect::LlamaServer, stream);
        assert_eq!(
            steps,
            Ok(vec![
                Step::Text("Hi".into()),
                Step::Done {
                    reason: FinishReason::Length,
                    calls: vec![],
                    timings: Timings {
                        cache_n: 7,
                        prompt_n: 3,
                        prompt_ms: 1.5,
                        predicted_n: 1,
                        predicted_ms: 2.0,
                        ..Timings::default()
                    }
                }
            ])
        );
    }

    #[test]
    fn chat_stream_assembles_calls_and_reads_cached_usage() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"skills_read\",\"arguments\":\"{\\\"na\"}}]}}]}\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"me\\\":\\\"x\\\"}\"}}]}}]}\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":6}}}\n",
            "data: [DONE]\n"
        );
        let steps = read_all(Dialect::OpenAiChat, stream).unwrap_or_default();
        let Some(Step::Done { reason, calls, timings }) = steps.last() else { panic!("{steps:?}") };
        assert_eq!(*reason, FinishReason::Stop);
        assert_eq!(
            calls,
            &vec![ToolCall { id: "c1".into(), name: "skills_read".into(), arguments: "{\"name\":\"x\"}".into() }]
        );
        assert_eq!((timings.cache_n, timings.prompt_n, timings.predicted_n), (6, 4, 4));
    }

    #[test]
    fn garbage_and_errors_end_the_stream_with_a_reason() {
        assert_eq!(
            read_all(Dialect::LlamaServer, "data: {not json\n").map_err(|e| matches!(e, StreamError::NotJson(_))),
            Err(true)
        );
        assert_eq!(
            read_all(Dialect::LlamaServer, "data: {\"error\":{\"message\":\"boom\"}}\n"),
            Err(StreamError::Reported("boom".into()))
        );
        let long = format!("data: \"{}\"\n", "x".repeat(MAX_EVENT_BYTES));
        assert_eq!(read_all(Dialect::LlamaServer, &long), Err(StreamError::EventTooLong));
        // At the limit (the line, newline included) it is read.
        let at_limit = format!("data: \"{}\"\n", "x".repeat(MAX_EVENT_BYTES - 9));
        assert_eq!(at_limit.len(), MAX_EVENT_BYTES);
        assert!(read_all(Dialect::LlamaServer, &at_limit).is_ok());
        // A stream cut before its end reads as no end at all.
        assert_eq!(
            read_all(Dialect::LlamaServer, "data: {\"content\":\"a\",\"stop\":false}\n"),
            Ok(vec![Step::Text("a".into())])
        );
    }

    #[test]
    fn an_answer_is_read_up_to_its_size_limit() {
        // Comment lines count as much as events do.
        let end = "data: {\"content\":\"a\",\"stop\":true}\n";
        let padded = |total: usize| {
            let mut stream = String::with_capacity(total);
            while total - stream.len() - end.len() > MAX_EVENT_BYTES {
                stream.push_str(&format!(":{}\n", "x".repeat(MAX_EVENT_BYTES - 2)));
            }
            let rest = total - stream.len() - end.len();
            stream.push_str(&format!(":{}\n", "x".repeat(rest - 2)));
            stream.push_str(end);
            assert_eq!(stream.len(), total);
            stream
        };
        let at = read_all(Dialect::LlamaServer, &padded(MAX_ANSWER_BYTES)).unwrap();
        assert_eq!(at.first(), Some(&Step::Text("a".into())));
        assert_eq!(read_all(Dialect::LlamaServer, &padded(MAX_ANSWER_BYTES + 1)), Err(StreamError::AnswerTooLong));
    }

    #[test]
    fn calls_past_the_limit_are_refused() {
        let at = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"tool_calls\":[{{\"index\":{},\"function\":{{\"name\":\"f\"}}}}]}}}}]}}\n",
            MAX_STREAMED_CALLS - 1
        );
        assert!(read_all(Dialect::OpenAiChat, &at).is_ok());
        let past =
            at.replace(&format!("\"index\":{}", MAX_STREAMED_CALLS - 1), &format!("\"index\":{MAX_STREAMED_CALLS}"));
        assert_eq!(read_all(Dialect::OpenAiChat, &past).map(|_| ()), Err(StreamError::TooManyCalls));
    }

    #[test]
    fn a_named_choice_is_sent_as_required_with_only_that_tool() {
        let tool = |name: &str| crate::chat::ToolDef {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        };
        let chat = ChatPayload {
            messages: vec![ChatMessage::new(Role::User, "hi")],
            tools: vec![tool("a"), tool("b")],
            tool_choice: ToolChoice::Named("b".into()),
            ..ChatPayload::default()
        };
        let request = GenerateRequest { chat: Some(std::sync::Arc::new(chat)), ..GenerateRequest::default() };
        let body = body(Dialect::OpenAiChat, &request, None, Some("m"), None);
        assert_eq!(body["tool_choice"], "required");
        assert_eq!(body["tools"].as_array().map(|t| t.len()), Some(1));
        assert_eq!(body["tools"][0]["function"]["name"], "b");
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(body["model"], "m");
    }

    #[test]
    fn llama_body_strips_a_rendered_bos_and_roots_a_lazy_grammar() {
        let request = GenerateRequest { prompt: "<bos>hi".into(), max_tokens: Some(5), ..GenerateRequest::default() };
        let grammar = CompiledGrammar {
            gbnf: "root ::= \"x\"\nskillhost-values ::= \"<tool_call>\" root\n".into(),
            root: "skillhost-values".into(),
            trigger: Some("<tool_call>".into()),
        };
        let body = body(Dialect::LlamaServer, &request, Some(&grammar), None, Some("<bos>"));
        assert_eq!(body["prompt"], "hi");
        assert_eq!(body["n_predict"], 5);
        assert_eq!(body["cache_prompt"], true);
        assert_eq!(body["grammar"], "skillhost-value ::= \"x\"\nroot ::= \"<tool_call>\" skillhost-value\n");
        assert_eq!(body["grammar_triggers"], json!([{"type": 1, "value": "<tool_call>"}]));
        // To an OpenAI-dialect server, a lazy grammar never goes as vLLM's
        // guided_grammar (which would hold from the first token).
        let openai = super::body(Dialect::OpenAiCompletions, &request, Some(&grammar), None, None);
        assert_eq!(openai["grammar_lazy"], true);
        assert!(openai.get("guided_grammar").is_none());
        assert_eq!(openai["add_special_tokens"], false);
        let forced = CompiledGrammar { trigger: None, ..grammar };
        let openai = super::body(Dialect::OpenAiCompletions, &request, Some(&forced), None, None);
        assert_eq!(openai["guided_grammar"], openai["grammar"]);
    }
}
