//! Forgiving readers of a tool call's arguments. A declaration is a hint the
//! model does not always follow, so the readers accept what models actually
//! send: the object as a JSON string, numbers as text, common aliases.

use serde_json::{Map, Value};
use skillhost_engine::ToolCall;

/// A call's arguments as an object, whatever shape they came in.
pub fn arguments(call: &ToolCall) -> Map<String, Value> {
    let mut value: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
    // Some parsers hand over the object as a JSON string.
    if let Value::String(text) = &value {
        value = serde_json::from_str(text).unwrap_or(Value::Null);
    }
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The first of `keys` present, as text, untrimmed.
pub fn text(args: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|key| match args.get(*key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

/// The first of `keys` present, as trimmed text.
pub fn trimmed(args: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    text(args, keys).map(|s| s.trim().to_string())
}

/// A whole number sent as a number or as text.
pub fn number(args: &Map<String, Value>, key: &str) -> Option<u64> {
    match args.get(key) {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The path a file tool names, under any of the names models use for it.
pub fn path(args: &Map<String, Value>) -> Option<String> {
    trimmed(args, &["path", "file", "file_path"]).filter(|p| !p.is_empty())
}

/// Upper-cases the first letter and ends with a full stop: a library's
/// error message as the sentence a model reads.
pub fn sentence(text: &str) -> String {
    let mut chars = text.chars();
    let first = chars.next().map(|c| c.to_uppercase().collect::<String>()).unwrap_or_default();
    let rest = chars.as_str();
    if rest.ends_with('.') {
        format!("{first}{rest}")
    } else {
        format!("{first}{rest}.")
    }
}

/// Upper-cases the first letter, for an error message that starts a sentence.
pub fn sentence_start(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    }
}
