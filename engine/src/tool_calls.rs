//! Reading tool calls out of generated text, one parser per model family.
//!
//! Every parser is total: whatever the model wrote, it returns the content,
//! the calls it could read, and a diagnostic for anything that looked like a
//! call but was not one. Malformed call markup is dropped from the content
//! and reported instead: a client must never receive half a tool call.

use serde_json::Value;

/// The tool-call syntaxes we read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFamily {
    /// Hermes and Qwen:
    /// `<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`
    Hermes,
    /// Llama 3.x: the whole reply is `{"name": "get_weather", "parameters": {"city": "Paris"}}`,
    /// optionally after `<|python_tag|>`, several calls separated by `;`.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]`,
    /// or the newer `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`.
    Mistral,
    /// Any model without a known syntax: the Hermes tags our generic prompt asks
    /// for, or a bare JSON reply `{"name": "get_weather", "arguments": {"city": "Paris"}}`
    /// (also `{"tool_call": {...}}` and `{"tool_calls": [...]}`) naming a declared tool.
    Generic,
}

/// A call as the model wrote it, before it gets an id.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The id the model gave, if any.
    pub id: Option<String>,
    pub name: String,
    /// Compact JSON text of the arguments object.
    pub arguments: String,
}

/// The result of reading one reply.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedOutput {
    pub content: String,
    pub calls: Vec<ParsedCall>,
    /// Why something that looked like a call was not read as one.
    pub diagnostics: Vec<String>,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";

/// Reads tool calls in one syntax. Implementations are total: any text in,
/// content plus calls plus diagnostics out, never a panic.
pub trait ToolCallParser: Sync {
    /// Where a call starts or may start in a partial reply: the bytes before
    /// it are certainly content.
    fn call_start(&self, text: &str) -> usize;

    /// Reads the calls in a complete reply. `declared` are the tool names the
    /// request offered.
    fn parse(&self, text: &str, declared: &[&str]) -> ParsedOutput;

    /// The call a reply was cut short in (by `max_tokens` or the end of the
    /// context): its name, and the arguments as far as they were written
    /// (usually not valid JSON), with the byte where the call's markup
    /// starts. `None` when the reply does not end inside a call, or the
    /// call's name is not a declared tool written whole.
    fn cut_call(&self, text: &str, declared: &[&str]) -> Option<CutCall>;

    /// How many leading bytes of a partial reply can be streamed as content
    /// now. Trailing whitespace is held too: `parse` drops it when a call
    /// follows, and the streamed text must equal the parsed content.
    fn content_prefix_len(&self, text: &str) -> usize {
        let safe = self.call_start(text);
        text[..safe].trim_end().len()
    }
}

/// A call the reply ended inside; see [`ToolCallParser::cut_call`].
#[derive(Debug, Clone, PartialEq)]
pub struct CutCall {
    pub call: ParsedCall,
    /// Where the call's markup starts: the text before it is the reply's
    /// content and complete calls.
    pub start: usize,
}

/// `<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`
pub struct HermesParser;

/// `{"name": "get_weather", "parameters": {"city": "Paris"}}`, optionally after
/// `<|python_tag|>`, several separated by `;`.
pub struct Llama3Parser;

/// `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]` or
/// `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`.
pub struct MistralParser;

/// The Hermes tags, else a bare JSON reply naming a declared tool:
/// `{"name": "get_weather", "arguments": {"city": "Paris"}}`, `{"tool_call": {...}}`
/// or `{"tool_calls": [...]}`.
pub struct GenericParser;

impl ToolCallParser for HermesParser {
    fn call_start(&self, text: &str) -> usize {
        marker_safe_len(text, HERMES_OPEN)
    }
    fn parse(&self, text: &str, _declared: &[&str]) -> ParsedOutput {
        parse_hermes(text)
    }
    fn cut_call(&self, text: &str, declared: &[&str]) -> Option<CutCall> {
        cut_hermes(text, declared)
    }
}

impl ToolCallParser for Llama3Parser {
    fn call_start(&self, text: &str) -> usize {
        // A bare JSON call is the whole reply, so a reply that starts like
        // one is held back until it ends.
        if starts_like_bare_call(text) {
            0
        } else {
            text.len()
        }
    }
    fn parse(&self, text: &str, declared: &[&str]) -> ParsedOutput {
        parse_bare_json(text, declared, true)
    }
    fn cut_call(&self, text: &str, declared: &[&str]) -> Option<CutCall> {
        cut_bare_json(text, declared, true)
    }
}

impl ToolCallParser for MistralParser {
    fn call_start(&self, text: &str) -> usize {
        marker_safe_len(text, MISTRAL_CALLS)
    }
    fn parse(&self, text: &str, _declared: &[&str]) -> ParsedOutput {
        parse_mistral(text)
    }
    fn cut_call(&self, text: &str, declared: &[&str]) -> Option<CutCall> {
        cut_mistral(text, declared)
    }
}

impl ToolCallParser for GenericParser {
    fn call_start(&self, text: &str) -> usize {
        if starts_like_bare_call(text) {
            0
        } else {
            marker_safe_len(text, HERMES_OPEN)
        }
    }
    fn parse(&self, text: &str, declared: &[&str]) -> ParsedOutput {
        let tagged = parse_hermes(text);
        if !tagged.calls.is_empty() || !tagged.diagnostics.is_empty() {
            return tagged;
        }
        parse_bare_json(text, declared, false)
    }
    fn cut_call(&self, text: &str, declared: &[&str]) -> Option<CutCall> {
        if text.contains(HERMES_OPEN) {
            cut_hermes(text, declared)
        } else {
            cut_bare_json(text, declared, false)
        }
    }
}

fn starts_like_bare_call(text: &str) -> bool {
    let trimmed = text.trim_start();
    trimmed.is_empty() || trimmed.starts_with('{') || trimmed.starts_with(PYTHON_TAG) || PYTHON_TAG.starts_with(trimmed)
}

impl ToolFamily {
    /// The parser for this family's syntax.
    pub fn parser(self) -> &'static dyn ToolCallParser {
        match self {
            ToolFamily::Hermes => &HermesParser,
            ToolFamily::Llama3 => &Llama3Parser,
            ToolFamily::Mistral => &MistralParser,
            ToolFamily::Generic => &GenericParser,
        }
    }

    /// The key that holds the arguments in this family's call object.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFamily::Llama3 => "parameters",
            ToolFamily::Hermes | ToolFamily::Mistral | ToolFamily::Generic => "arguments",
        }
    }

    /// The text that opens a call, for families that mark calls.
    pub fn call_marker(self) -> Option<&'static str> {
        match self {
            ToolFamily::Hermes | ToolFamily::Generic => Some(HERMES_OPEN),
            ToolFamily::Mistral => Some(MISTRAL_CALLS),
            ToolFamily::Llama3 => None,
        }
    }
}

/// Length of the prefix of `text` before `marker` or before a trailing partial `marker`.
fn marker_safe_len(text: &str, marker: &str) -> usize {
    if let Some(at) = text.find(marker) {
        return at;
    }
    for len in (1..marker.len()).rev() {
        if text.len() >= len && text.is_char_boundary(text.len() - len) && marker.starts_with(&text[text.len() - len..])
        {
            return text.len() - len;
        }
    }
    text.len()
}

/// Parses the first JSON value at the start of `text` (after whitespace) and
/// returns it with the number of bytes it used.
fn leading_json(text: &str) -> Option<(Value, usize)> {
    let start = text.len() - text.trim_start().len();
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    match stream.next() {
        Some(Ok(value)) => Some((value, start + stream.byte_offset())),
        _ => None,
    }
}

/// Turns a call object into a call: `{"name": ..., "arguments"|"parameters": ...}`.
fn call_from_object(value: &Value) -> Result<ParsedCall, String> {
    let object = value.as_object().ok_or("the call is not a JSON object")?;
    let name = match object.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_string(),
        Some(_) => return Err("the call's \"name\" is not a non-empty string".into()),
        None => return Err("the call has no \"name\"".into()),
    };
    let arguments = object.get("arguments").or_else(|| object.get("parameters"));
    let arguments = match arguments {
        None | Some(Value::Null) => Value::Object(Default::default()),
        // Some models write the arguments as a JSON string; read it.
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(value @ Value::Object(_)) => value,
            _ => return Err(format!("the arguments of '{name}' are a string, not a JSON object")),
        },
        Some(value @ Value::Object(_)) => value.clone(),
        Some(_) => return Err(format!("the arguments of '{name}' are not a JSON object")),
    };
    let id = object.get("id").and_then(Value::as_str).filter(|id| !id.is_empty()).map(str::to_string);
    Ok(ParsedCall { id, name, arguments: arguments.to_string() })
}

fn parse_hermes(text: &str) -> ParsedOutput {
    if !text.contains(HERMES_OPEN) {
        // Plain text stays exactly as written.
        return ParsedOutput { content: text.to_string(), ..Default::default() };
    }
    let mut out = ParsedOutput::default();
    let mut rest = text;
    while let Some(open) = rest.find(HERMES_OPEN) {
        out.content.push_str(&rest[..open]);
        let after_open = &rest[open + HERMES_OPEN.len()..];
        let (body, next, closed) = match after_open.find(HERMES_CLOSE) {
            Some(close) => (&after_open[..close], &after_open[close + HERMES_CLOSE.len()..], true),
            None => (after_open, "", false),
        };
        let parsed = leading_json(body).ok_or_else(|| "the text inside <tool_call> is not valid JSON".to_string());
        match parsed.and_then(|(value, used)| {
            if !body[used..].trim().is_empty() {
                return Err("there is text after the JSON inside <tool_call>".into());
            }
            call_from_object(&value)
        }) {
            Ok(call) => {
                if !closed {
                    out.diagnostics.push(format!("the call to '{}' has no closing </tool_call>", call.name));
                }
                out.calls.push(call);
            }
            // Markup that does not parse is dropped from the content (and
            // reported): a client must never receive half a tool call.
            Err(why) => out.diagnostics.push(why),
        }
        rest = next;
    }
    out.content.push_str(rest);
    out.content.truncate(out.content.trim_end().len());
    out
}

fn parse_bare_json(text: &str, declared: &[&str], allow_python_tag: bool) -> ParsedOutput {
    let not_a_call = || ParsedOutput { content: text.to_string(), ..Default::default() };
    let mut body = text.trim();
    if allow_python_tag {
        body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim_start();
    }
    if !body.starts_with('{') {
        return not_a_call();
    }
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.trim().is_empty() {
        let Some((value, used)) = leading_json(rest) else {
            return not_a_call();
        };
        let objects: Vec<&Value> = match (value.get("tool_calls"), value.get("tool_call")) {
            (Some(Value::Array(items)), _) => items.iter().collect(),
            (_, Some(inner)) => vec![inner],
            _ => vec![&value],
        };
        for object in objects {
            match call_from_object(object) {
                Ok(call) if declared.contains(&call.name.as_str()) => calls.push(call),
                // JSON that is not a call of a declared tool is an ordinary answer.
                Ok(_) | Err(_) => return not_a_call(),
            }
        }
        rest = rest[used..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest);
    }
    ParsedOutput { content: String::new(), calls, diagnostics: Vec::new() }
}

fn parse_mistral(text: &str) -> ParsedOutput {
    let Some(at) = text.find(MISTRAL_CALLS) else {
        return ParsedOutput { content: text.to_string(), ..Default::default() };
    };
    let mut out = ParsedOutput { content: text[..at].trim_end().to_string(), ..Default::default() };
    let mut rest = &text[at..];
    while let Some(stripped) = rest.strip_prefix(MISTRAL_CALLS) {
        let stripped = stripped.trim_start();
        let result = if stripped.starts_with('[') {
            // [TOOL_CALLS][{"name": ..., "arguments": ...}, ...]
            match leading_json(stripped) {
                Some((Value::Array(items), used)) => {
                    items.iter().map(call_from_object).collect::<Result<Vec<_>, _>>().map(|calls| (calls, used))
                }
                _ => Err("the text after [TOOL_CALLS] is not a JSON array of calls".to_string()),
            }
        } else {
            // [TOOL_CALLS]name[ARGS]{...}
            match stripped.find(MISTRAL_ARGS) {
                Some(args_at) => {
                    let name = stripped[..args_at].trim();
                    let after = &stripped[args_at + MISTRAL_ARGS.len()..];
                    match leading_json(after) {
                        Some((arguments, used)) if !name.is_empty() => {
                            let object = serde_json::json!({"name": name, "arguments": arguments});
                            call_from_object(&object).map(|call| (vec![call], args_at + MISTRAL_ARGS.len() + used))
                        }
                        _ => Err(format!("the arguments after [ARGS] for '{name}' are not valid JSON")),
                    }
                }
                None => Err("[TOOL_CALLS] is not followed by a call".to_string()),
            }
        };
        match result {
            Ok((calls, used)) => {
                out.calls.extend(calls);
                rest = stripped[used..].trim_start();
            }
            Err(why) => {
                out.diagnostics.push(why);
                return out;
            }
        }
    }
    if !rest.trim().is_empty() {
        if !out.content.is_empty() {
            out.content.push('\n');
        }
        out.content.push_str(rest.trim());
    }
    out
}

/// The last `<tool_call>` when it is neither closed nor a whole call.
fn cut_hermes(text: &str, declared: &[&str]) -> Option<CutCall> {
    let open = text.rfind(HERMES_OPEN)?;
    let body = &text[open + HERMES_OPEN.len()..];
    if body.contains(HERMES_CLOSE) || leading_json(body).is_some() {
        return None;
    }
    let call = partial_call(body, declared)?;
    Some(CutCall { call, start: open })
}

/// A bare JSON reply whose last call is cut: the calls before it parse,
/// separated by `;`.
fn cut_bare_json(text: &str, declared: &[&str], allow_python_tag: bool) -> Option<CutCall> {
    let mut body = text.trim_start();
    if allow_python_tag {
        body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim_start();
    }
    let mut rest = body;
    let mut whole = 0;
    while let Some((_, used)) = leading_json(rest) {
        let after = rest[used..].trim_start();
        rest = after.strip_prefix(';').unwrap_or(after).trim_start();
        whole += 1;
    }
    if rest.trim().is_empty() {
        return None;
    }
    let call = partial_call(rest, declared)?;
    // The whole reply is calls: what comes before the cut one (the tag and
    // whole calls) holds no content, and without whole calls it is nothing.
    let start = if whole == 0 { 0 } else { text.len() - rest.len() };
    Some(CutCall { call, start })
}

/// `[TOOL_CALLS][{...}, {...` or `[TOOL_CALLS]name[ARGS]{...`, cut.
fn cut_mistral(text: &str, declared: &[&str]) -> Option<CutCall> {
    let at = text.rfind(MISTRAL_CALLS)?;
    let after = &text[at + MISTRAL_CALLS.len()..];
    let trimmed = after.trim_start();
    if let Some(mut rest) = trimmed.strip_prefix('[') {
        if leading_json(trimmed).is_some() {
            return None;
        }
        loop {
            rest = rest.trim_start();
            match leading_json(rest) {
                Some((_, used)) => {
                    rest = rest[used..].trim_start();
                    rest = rest.strip_prefix(',')?;
                }
                None => break,
            }
        }
        let call = partial_call(rest, declared)?;
        return Some(CutCall { call, start: at });
    }
    let args_at = trimmed.find(MISTRAL_ARGS)?;
    let name = trimmed[..args_at].trim();
    let arguments = trimmed[args_at + MISTRAL_ARGS.len()..].trim();
    if !declared.contains(&name) || leading_json(arguments).is_some() {
        return None;
    }
    let call = ParsedCall { id: None, name: name.to_string(), arguments: arguments.to_string() };
    Some(CutCall { call, start: at })
}

/// A call object cut short: `{"name": "get_weather", "arguments": {"ci`.
/// Its name must be whole and declared; the arguments are the text after
/// their key, as far as it goes.
fn partial_call(body: &str, declared: &[&str]) -> Option<ParsedCall> {
    let mut rest = body.trim_start().strip_prefix('{')?;
    let mut name = None;
    let mut id = None;
    loop {
        rest = rest.trim_start();
        let Some((key, used)) = leading_json(rest) else {
            // Cut inside a key: the name, if whole, is all there is.
            if rest.starts_with('"') || rest.is_empty() {
                break;
            }
            return None;
        };
        let key = key.as_str()?.to_string();
        rest = rest[used..].trim_start().strip_prefix(':')?.trim_start();
        if key == "arguments" || key == "parameters" {
            let name: String = name?;
            return Some(ParsedCall { id, name, arguments: rest.trim_end().to_string() });
        }
        let Some((value, used)) = leading_json(rest) else {
            // Cut inside the name or another member: the name, if whole, is
            // all there is.
            break;
        };
        match key.as_str() {
            "name" => name = value.as_str().filter(|n| declared.contains(n)).map(str::to_string),
            "id" => id = value.as_str().map(str::to_string),
            _ => {}
        }
        rest = rest[used..].trim_start();
        rest = match rest.strip_prefix(',') {
            Some(more) => more,
            // `}` would be a whole call; anything else is not a call.
            None if rest.is_empty() => break,
            None => return None,
        };
    }
    Some(ParsedCall { id, name: name?, arguments: String::new() })
}

/// The arguments of a call as a JSON object: parsed, or for a call cut
/// short, the part that was written whole, closed (`{"city": "Par` is
/// `{"city": "Par"}`, `{"a": 1, "b` is `{"a": 1}`); `{}` when nothing of
/// it can be read.
pub fn arguments_object(text: &str) -> Value {
    if let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(text) {
        return value;
    }
    let closed = close_partial(text);
    closed
        .into_iter()
        .find_map(|candidate| match serde_json::from_str::<Value>(&candidate) {
            Ok(value @ Value::Object(_)) => Some(value),
            _ => None,
        })
        .unwrap_or_else(|| Value::Object(Default::default()))
}

/// Ways to close a JSON text cut short, best first: as it is (a string
/// value closed), then cut back to the last point where every member or
/// element before it was whole.
fn close_partial(text: &str) -> Vec<String> {
    /// One open container: its closer, and for an object whether a key
    /// comes next (a string there is a key, not a value).
    #[derive(Clone, Copy)]
    struct Open {
        closer: char,
        expect_key: bool,
    }
    let closers = |stack: &[Open]| stack.iter().rev().map(|o| o.closer).collect::<String>();
    let mut stack: Vec<Open> = Vec::new();
    let mut safe: Option<(usize, String)> = None;
    let (mut in_string, mut escaped, mut string_is_key, mut string_start) = (false, false, false, 0);
    for (at, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    in_string = false;
                    if !string_is_key {
                        safe = Some((at + 1, closers(&stack)));
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                string_start = at;
                string_is_key = stack.last().is_some_and(|o| o.closer == '}' && o.expect_key);
            }
            '{' | '[' => {
                stack.push(Open { closer: if c == '{' { '}' } else { ']' }, expect_key: c == '{' });
                safe = Some((at + 1, closers(&stack)));
            }
            '}' | ']' => {
                stack.pop();
                safe = Some((at + 1, closers(&stack)));
            }
            ':' => {
                if let Some(open) = stack.last_mut() {
                    open.expect_key = false;
                }
            }
            ',' => {
                safe = Some((at, closers(&stack)));
                if let Some(open) = stack.last_mut() {
                    open.expect_key = open.closer == '}';
                }
            }
            _ => {}
        }
    }
    let mut candidates = Vec::new();
    if in_string && !string_is_key {
        // Drop an escape cut in half (`\` or `\u00`) before closing.
        let body = &text[string_start..];
        let cut = body.rfind('\\').filter(|&i| {
            let escape = &body[i..];
            let backslashes = body[..i].chars().rev().take_while(|&c| c == '\\').count();
            backslashes % 2 == 0 && (escape == "\\" || (escape.starts_with("\\u") && escape.len() < 6))
        });
        let kept = &text[..string_start + cut.unwrap_or(body.len())];
        candidates.push(format!("{kept}\"{}", closers(&stack)));
    } else if !in_string {
        candidates.push(format!("{}{}", text.trim_end(), closers(&stack)));
    }
    if let Some((at, closing)) = safe {
        candidates.push(format!("{}{closing}", &text[..at]));
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall { id: None, name: name.into(), arguments: arguments.into() }
    }

    /// Reply text -> (content, calls, number of diagnostics).
    type Case<'a> = (&'a str, (&'a str, Vec<ParsedCall>, usize));

    fn check(family: ToolFamily, text: &str, expected: (&str, Vec<ParsedCall>, usize)) {
        let out = family.parser().parse(text, &["get_weather", "lookup"]);
        let (content, calls, n_diagnostics) = expected;
        assert_eq!(
            (out.content.as_str(), out.calls, out.diagnostics.len()),
            (content, calls, n_diagnostics),
            "{family:?} on {text:?}: {:?}",
            out.diagnostics
        );
    }

    #[test]
    fn hermes_cases() {
        let weather = || call("get_weather", r#"{"city":"Paris"}"#);
        let cases: Vec<Case> = vec![
            ("Just text.", ("Just text.", vec![], 0)),
            (
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                ("", vec![weather()], 0),
            ),
            (
                "Let me check.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\
                 <tool_call>{\"name\": \"lookup\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>",
                ("Let me check.", vec![weather(), call("lookup", r#"{"q":1}"#)], 0),
            ),
            // Truncated before the closing tag: the call is read, with a note.
            ("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", ("", vec![weather()], 1)),
            // Broken markup is reported, never passed on as content.
            ("<tool_call>{\"name\": \"get_weather\", \"arg</tool_call>", ("", vec![], 1)),
            ("Text <tool_call>{\"name\": \"get_weather\", \"arg", ("Text", vec![], 1)),
            // Missing name.
            ("<tool_call>{\"arguments\": {}}</tool_call>", ("", vec![], 1)),
            // Arguments that are not an object.
            ("<tool_call>{\"name\": \"lookup\", \"arguments\": [1]}</tool_call>", ("", vec![], 1)),
            // No arguments at all means an empty object.
            ("<tool_call>{\"name\": \"lookup\"}</tool_call>", ("", vec![call("lookup", "{}")], 0)),
            ("<tool_call>", ("", vec![], 1)),
        ];
        for (text, expected) in cases {
            check(ToolFamily::Hermes, text, expected);
        }
    }

    #[test]
    fn llama3_cases() {
        let cases: Vec<Case> = vec![
            (
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                ("", vec![call("get_weather", r#"{"city":"Paris"}"#)], 0),
            ),
            (
                "<|python_tag|>{\"name\": \"lookup\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
                ("", vec![call("lookup", "{}"), call("get_weather", r#"{"city":"Rome"}"#)], 0),
            ),
            // JSON that is not a call of a declared tool is an answer.
            ("{\"name\": \"Paris\", \"population\": 2}", ("{\"name\": \"Paris\", \"population\": 2}", vec![], 0)),
            ("{\"name\": \"get_weather\", \"parameters\": {", ("{\"name\": \"get_weather\", \"parameters\": {", vec![], 0)),
            ("The capital is Paris.", ("The capital is Paris.", vec![], 0)),
        ];
        for (text, expected) in cases {
            check(ToolFamily::Llama3, text, expected);
        }
    }

    #[test]
    fn mistral_cases() {
        let cases: Vec<Case> = vec![
            (
                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]",
                ("", vec![ParsedCall { id: Some("abc123def".into()), ..call("get_weather", r#"{"city":"Paris"}"#) }], 0),
            ),
            (
                "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]lookup[ARGS]{}",
                ("", vec![call("get_weather", r#"{"city":"Paris"}"#), call("lookup", "{}")], 0),
            ),
            ("Sure. [TOOL_CALLS][{\"name\": 3}]", ("Sure.", vec![], 1)),
            ("[TOOL_CALLS]get_weather[ARGS]{oops", ("", vec![], 1)),
            ("[TOOL_CALLS]", ("", vec![], 1)),
            ("No calls here.", ("No calls here.", vec![], 0)),
        ];
        for (text, expected) in cases {
            check(ToolFamily::Mistral, text, expected);
        }
    }

    #[test]
    fn generic_cases() {
        let cases: Vec<Case> = vec![
            (
                "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>",
                ("", vec![call("lookup", r#"{"q":"x"}"#)], 0),
            ),
            ("{\"tool_call\": {\"name\": \"lookup\", \"arguments\": {}}}", ("", vec![call("lookup", "{}")], 0)),
            ("{\"tool_calls\": [{\"name\": \"lookup\", \"arguments\": {}}]}", ("", vec![call("lookup", "{}")], 0)),
            ("{\"answer\": 42}", ("{\"answer\": 42}", vec![], 0)),
            ("Paris.", ("Paris.", vec![], 0)),
        ];
        for (text, expected) in cases {
            check(ToolFamily::Generic, text, expected);
        }
    }

    #[test]
    fn a_cut_call_keeps_its_name_and_the_arguments_so_far() {
        let declared = ["get_weather", "lookup"];
        let cut = |family: ToolFamily, text: &str| {
            family.parser().cut_call(text, &declared).map(|c| (c.call.name, c.call.arguments, c.start))
        };
        let named = |name: &str, arguments: &str, start: usize| Some((name.to_string(), arguments.to_string(), start));
        let cases = [
            (ToolFamily::Hermes, "Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa", named("get_weather", "{\"city\": \"Pa", 6)),
            (ToolFamily::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"argu", named("get_weather", "", 0)),
            // A name cut in half, or not declared, is not a call.
            (ToolFamily::Hermes, "<tool_call>\n{\"name\": \"get_wea", None),
            (ToolFamily::Hermes, "<tool_call>\n{\"name\": \"delete_all\", \"arguments\": {", None),
            // Whole calls and plain text were not cut.
            (ToolFamily::Hermes, "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {}}\n</tool_call>", None),
            (ToolFamily::Hermes, "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {}}", None),
            (ToolFamily::Hermes, "The weather in Pa", None),
            (ToolFamily::Generic, "{\"name\": \"lookup\", \"arguments\": {\"q\": [1, ", named("lookup", "{\"q\": [1,", 0)),
            (ToolFamily::Llama3, "<|python_tag|>{\"name\": \"lookup\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"ci", named("get_weather", "{\"ci", 52)),
            (ToolFamily::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": ", named("get_weather", "{\"city\":", 0)),
            (ToolFamily::Mistral, "[TOOL_CALLS][{\"name\": \"lookup\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\"", named("get_weather", "{\"city\"", 0)),
            (ToolFamily::Mistral, "Ok [TOOL_CALLS]get_weather[ARGS]{\"city\": \"R", named("get_weather", "{\"city\": \"R", 3)),
            (ToolFamily::Mistral, "[TOOL_CALLS][{\"name\": \"lookup\", \"arguments\": {}}]", None),
        ];
        for (family, text, expected) in cases {
            assert_eq!(cut(family, text), expected, "{family:?} on {text:?}");
        }
    }

    #[test]
    fn cut_arguments_close_to_the_whole_part() {
        let cases = [
            ("{\"city\": \"Paris\"}", json!({"city": "Paris"})),
            ("{\"city\": \"Pa", json!({"city": "Pa"})),
            ("{\"a\": 1, \"b", json!({"a": 1})),
            ("{\"a\": 1, \"b\": ", json!({"a": 1})),
            ("{\"a\": 12", json!({"a": 12})),
            ("{\"a\": tr", json!({})),
            ("{\"a\": [1, {\"b\": \"x", json!({"a": [1, {"b": "x"}]})),
            ("{\"a\": \"line\\", json!({"a": "line"})),
            ("{\"a\": \"caf\\u00", json!({"a": "caf"})),
            ("{\"a\": \"x\\\\", json!({"a": "x\\"})),
            ("{\"a\": {\"b\": 1}, ", json!({"a": {"b": 1}})),
            ("", json!({})),
            ("not json", json!({})),
            ("[1, 2]", json!({})),
        ];
        for (text, expected) in cases {
            assert_eq!(arguments_object(text), expected, "{text:?}");
        }
    }

    #[test]
    fn content_prefix_holds_back_possible_calls() {
        let cases = [
            (ToolFamily::Hermes, "Hello <tool", 5),
            (ToolFamily::Hermes, "Hello <tool_call>{", 5),
            (ToolFamily::Hermes, "Hello\n", 5),
            (ToolFamily::Hermes, "Hello", 5),
            (ToolFamily::Mistral, "Hi [TOOL_", 2),
            (ToolFamily::Llama3, "  {\"name\"", 0),
            (ToolFamily::Llama3, "<|python", 0),
            (ToolFamily::Llama3, "Paris", 5),
            (ToolFamily::Generic, "Paris <tool_c", 5),
            (ToolFamily::Generic, "{", 0),
        ];
        for (family, text, expected) in cases {
            assert_eq!(family.parser().content_prefix_len(text), expected, "{family:?} {text:?}");
        }
    }
}
