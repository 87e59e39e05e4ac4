//! Chat templates: the GGUF's own Jinja template rendered with minijinja, or a
//! built-in format when the model ships none.
//!
//! The environment mirrors what Hugging Face's `apply_chat_template` gives a
//! template (trim_blocks, lstrip_blocks, Python string methods, `tojson` with
//! Python's separators, `raise_exception`, `strftime_now`), because that is the
//! renderer template authors test against.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::ser::Formatter;

const TEMPLATE_NAME: &str = "chat";

/// Where a template came from; logged at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSource {
    /// `tokenizer.chat_template` from the GGUF.
    Gguf,
    /// Our built-in format for a known architecture (the model has no template).
    BuiltIn(&'static str),
    /// A neutral `User:`/`Assistant:` transcript for an unknown base model.
    Plain,
    /// None here: an upstream in chat mode renders its own prompts.
    Upstream,
}

impl std::fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateSource::Gguf => f.write_str("the model's own chat template"),
            TemplateSource::BuiltIn(name) => write!(f, "the built-in '{name}' format (the model has no chat template)"),
            TemplateSource::Plain => f.write_str("the plain User/Assistant format (the model has no chat template)"),
            TemplateSource::Upstream => f.write_str("the upstream's own chat template (chat mode)"),
        }
    }
}

/// Most steps (minijinja's fuel: about one per instruction) one render may
/// take. A template can loop for ever, and one may come from an upstream
/// server; real templates over thousands of messages take far fewer.
pub const MAX_TEMPLATE_STEPS: u64 = 20_000_000;

/// A failure to compile or render a template.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(String);

impl From<Error> for TemplateError {
    fn from(err: Error) -> Self {
        if err.kind() == ErrorKind::OutOfFuel {
            return TemplateError(format!(
                "the chat template did not finish within {MAX_TEMPLATE_STEPS} steps, so it was stopped (a template that loops without end cannot be used)"
            ));
        }
        // The template's own `raise_exception` message is what a caller needs;
        // minijinja's wrapper text adds nothing for them.
        if err.kind() == ErrorKind::InvalidOperation {
            if let Some(detail) = err.detail() {
                return TemplateError(detail.to_string());
            }
        }
        TemplateError(err.to_string())
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: TemplateSource,
    /// The raw template text, for capability detection.
    text: String,
    bos_token: String,
    eos_token: String,
    /// Stop strings the format needs beyond the model's end-of-generation tokens.
    extra_stops: Vec<String>,
}

/// The names [`ChatTemplate::named`] knows.
pub const BUILT_IN_FORMATS: [&str; 3] = ["chatml", "gemma", "plain"];

/// Built-in formats for architectures whose base models often ship without a
/// template: the turn markers their instruction-tuned siblings were trained on.
const GEMMA_FORMAT: &str = "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m.role == 'assistant' else 'user' %}<start_of_turn>{{ role }}\n{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
const CHATML_FORMAT: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const PLAIN_FORMAT: &str = "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n{% elif m.role == 'user' %}User: {{ m.content }}\n{% elif m.role == 'assistant' %}Assistant: {{ m.content }}\n{% else %}Tool result: {{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}";

impl ChatTemplate {
    /// Picks the template for a model: its own, else a built-in format for its
    /// architecture, else the plain format.
    pub fn for_model(
        gguf_template: Option<&str>,
        architecture: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, TemplateError> {
        let (source, text, extra_stops): (TemplateSource, &str, Vec<String>) = match gguf_template {
            Some(text) if !text.trim().is_empty() => (TemplateSource::Gguf, text, Vec::new()),
            _ if architecture.starts_with("gemma") => {
                (TemplateSource::BuiltIn("gemma"), GEMMA_FORMAT, vec!["<end_of_turn>".into()])
            }
            _ if architecture.starts_with("qwen") => {
                (TemplateSource::BuiltIn("chatml"), CHATML_FORMAT, vec!["<|im_end|>".into()])
            }
            _ => (TemplateSource::Plain, PLAIN_FORMAT, vec!["\nUser:".into()]),
        };
        Self::compile(source, text.to_string(), bos_token, eos_token, extra_stops)
    }

    /// A built-in format by name (`chatml`, `gemma` or `plain`), for an
    /// upstream whose template is not known here.
    pub fn named(name: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let architecture = match name {
            "chatml" => "qwen",
            "gemma" => "gemma",
            "plain" => "",
            other => {
                return Err(TemplateError(format!(
                    "there is no built-in format named '{other}' (known: {})",
                    BUILT_IN_FORMATS.join(", ")
                )))
            }
        };
        Self::for_model(None, architecture, bos_token, eos_token)
    }

    /// The placeholder of a format that renders nothing itself.
    pub(crate) fn upstream() -> Result<Self, TemplateError> {
        let mut template = Self::for_model(None, "", "", "")?;
        template.source = TemplateSource::Upstream;
        template.extra_stops.clear();
        Ok(template)
    }

    fn compile(
        source: TemplateSource,
        text: String,
        bos_token: &str,
        eos_token: &str,
        extra_stops: Vec<String>,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(MAX_TEMPLATE_STEPS));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, text.clone())?;
        Ok(ChatTemplate {
            env,
            source,
            text,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            extra_stops,
        })
    }

    pub fn source(&self) -> &TemplateSource {
        &self.source
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn extra_stops(&self) -> &[String] {
        &self.extra_stops
    }

    /// Renders messages (and tool declarations, when given) in the shape
    /// Hugging Face templates expect.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let template = self.env.get_template(TEMPLATE_NAME)?;
        let context = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map(Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        Ok(template.render(context)?)
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: templates use it to print today's date.
fn strftime_now(format: String) -> Result<String, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("invalid strftime format '{format}'")))?;
    Ok(out)
}

/// `tojson` as Python's `json.dumps` writes it (`", "` and `": "` separators,
/// `ensure_ascii`, `indent`, `sort_keys`), which is what templates were
/// written against; minijinja's own filter escapes for HTML instead.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // Accepted for compatibility; Python's separators are the only ones we write.
    let _separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut json = serde_json::to_value(value)
        .map_err(|err| Error::new(ErrorKind::InvalidOperation, format!("cannot serialize to JSON: {err}")))?;
    if sort_keys.unwrap_or(false) {
        json = sorted(json);
    }
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let text = python_json(&json, indent, ensure_ascii.unwrap_or(false));
    Ok(Value::from_safe_string(text))
}

fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// Serializes like Python's `json.dumps(value, indent=indent, ensure_ascii=...)`.
pub fn python_json(value: &serde_json::Value, indent: Option<usize>, ensure_ascii: bool) -> String {
    let mut out = Vec::new();
    let formatter = PythonFormatter { indent, depth: 0, has_value: false };
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    // Serializing a `serde_json::Value` into memory cannot fail.
    let _ = serde::Serialize::serialize(value, &mut serializer);
    let text = String::from_utf8_lossy(&out).into_owned();
    if !ensure_ascii {
        return text;
    }
    // Non-ASCII characters only occur inside strings, so escaping them in the
    // finished text is exact.
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                escaped.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    escaped
}

/// serde_json formatter with Python's separators.
struct PythonFormatter {
    indent: Option<usize>,
    depth: usize,
    has_value: bool,
}

impl PythonFormatter {
    fn newline<W: ?Sized + std::io::Write>(&self, writer: &mut W) -> std::io::Result<()> {
        if let Some(width) = self.indent {
            writer.write_all(b"\n")?;
            writer.write_all(" ".repeat(width * self.depth).as_bytes())?;
        }
        Ok(())
    }

    fn open<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(bracket)
    }

    fn close<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline(writer)?;
        }
        self.has_value = true;
        writer.write_all(bracket)
    }

    fn item<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            writer.write_all(if self.indent.is_some() { b"," } else { b", " })?;
        }
        self.newline(writer)
    }
}

impl Formatter for PythonFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        self.item(writer, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _writer: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        self.item(writer, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _writer: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// SmolLM2-135M-Instruct's template, as embedded in its GGUF.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn render(template: &ChatTemplate, messages: serde_json::Value) -> String {
        match template.render(&messages, None, true) {
            Ok(text) => text,
            Err(err) => panic!("render failed: {err}"),
        }
    }

    fn compile(text: &str) -> ChatTemplate {
        match ChatTemplate::for_model(Some(text), "llama", "<s>", "</s>") {
            Ok(t) => t,
            Err(err) => panic!("compile failed: {err}"),
        }
    }

    #[test]
    fn renders_the_default_model_template() {
        let template = compile(SMOLLM2);
        assert_eq!(
            render(&template, json!([{"role": "user", "content": "Hi"}])),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(template.source(), &TemplateSource::Gguf);
    }

    #[test]
    fn a_template_that_never_ends_is_stopped_and_a_long_conversation_is_not() {
        let endless = compile("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
        let err = endless.render(&json!([{"role": "user", "content": "Hi"}]), None, true).unwrap_err().to_string();
        assert!(err.contains(&format!("did not finish within {MAX_TEMPLATE_STEPS} steps")), "{err}");
        // Thousands of messages with tools, in the default model's template
        // and the built-in formats, stay far inside the limit.
        let messages: Vec<serde_json::Value> = (0..4000)
            .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message {i}")}))
            .collect();
        let tools = json!([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]);
        for template in [
            compile(SMOLLM2),
            ChatTemplate::named("chatml", "", "").unwrap(),
            ChatTemplate::named("gemma", "<bos>", "<eos>").unwrap(),
        ] {
            let text = template.render(&json!(messages), Some(&tools), true).unwrap();
            assert!(text.contains("message 3999"));
        }
    }

    #[test]
    fn python_methods_tojson_and_exceptions() {
        let template = compile(
            "{% if messages[0].content.startswith('x') %}{{ raise_exception('must not start with x') }}{% endif %}\
             {{ messages[0].content.strip().upper() }}|{{ messages[0].args | tojson }}|{{ {'é': 1} | tojson(ensure_ascii=True) }}",
        );
        assert_eq!(
            render(&template, json!([{"role": "user", "content": "  hi ", "args": {"b": [1, 2], "a": "<x>"}}])),
            "HI|{\"b\": [1, 2], \"a\": \"<x>\"}|{\"\\u00e9\": 1}"
        );
        let err = template.render(&json!([{"role": "user", "content": "xy"}]), None, true);
        assert_eq!(err.map_err(|e| e.to_string()), Err("must not start with x".to_string()));
    }

    #[test]
    fn tojson_indent_matches_python() {
        let value = json!({"a": [1, {"b": null}], "c": {}});
        assert_eq!(
            python_json(&value, Some(2), false),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {}\n}"
        );
        assert_eq!(python_json(&value, None, false), "{\"a\": [1, {\"b\": null}], \"c\": {}}");
    }

    #[test]
    fn models_without_a_template_get_a_fallback() {
        let gemma = match ChatTemplate::for_model(None, "gemma3", "<bos>", "<eos>") {
            Ok(t) => t,
            Err(err) => panic!("{err}"),
        };
        assert_eq!(gemma.source(), &TemplateSource::BuiltIn("gemma"));
        assert_eq!(
            render(&gemma, json!([{"role": "user", "content": "Hi"}])),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        let plain = match ChatTemplate::for_model(Some("  "), "mamba", "", "") {
            Ok(t) => t,
            Err(err) => panic!("{err}"),
        };
        assert_eq!(plain.source(), &TemplateSource::Plain);
        assert_eq!(render(&plain, json!([{"role": "user", "content": "Hi"}])), "User: Hi\nAssistant:");
    }
}
