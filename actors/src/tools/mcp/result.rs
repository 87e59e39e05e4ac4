//! What the model reads of an MCP tool's result or a resource: the text of
//! its content blocks, a line for what it cannot read (an image, audio, a
//! binary resource), cut at [`MAX_RESULT_BYTES`] with a note. A server's
//! output is untrusted: it is only ever text for the model.

use serde_json::Value;

/// Bytes of one result the model reads; the rest is cut with a note, as a
/// command's output is.
pub const MAX_RESULT_BYTES: usize = 32 * 1024;

/// The text of a list of MCP content blocks (`CallToolResult.content`, or
/// a resource's `contents`), as JSON.
fn blocks(items: &[Value], out: &mut Vec<String>) {
    for item in items {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or_default();
        let mime = item.get("mimeType").and_then(Value::as_str).unwrap_or("unknown type");
        let size = |field: &str| item.get(field).and_then(Value::as_str).map_or(0, |data| data.len() / 4 * 3);
        match kind {
            "text" => out.push(item.get("text").and_then(Value::as_str).unwrap_or_default().to_string()),
            "image" | "audio" => {
                out.push(format!("[{kind} ({mime}, about {} bytes) not shown: you cannot see it]", size("data")))
            }
            "resource" => {
                if let Some(resource) = item.get("resource") {
                    blocks(std::slice::from_ref(resource), out);
                }
            }
            "resource_link" => {
                let uri = item.get("uri").and_then(Value::as_str).unwrap_or_default();
                out.push(format!("[resource {uri}: read it with mcp_read_resource]"));
            }
            // A resource's contents: text or a blob, with no type field.
            _ => {
                if let Some(text) = item.get("text").and_then(Value::as_str) {
                    out.push(text.to_string());
                } else if item.get("blob").is_some() {
                    let uri = item.get("uri").and_then(Value::as_str).unwrap_or_default();
                    out.push(format!("[binary resource {uri} ({mime}, about {} bytes) not shown]", size("blob")));
                } else {
                    out.push(format!(
                        "[a content block of type '{}' not shown]",
                        kind.chars().take(40).collect::<String>()
                    ));
                }
            }
        }
    }
}

/// A tool result (a `CallToolResult` as JSON): its text, and whether the
/// tool reported an error.
pub fn tool_result(result: &Value) -> (String, bool) {
    let mut parts = Vec::new();
    if let Some(items) = result.get("content").and_then(Value::as_array) {
        blocks(items, &mut parts);
    }
    // Structured content alone (no text blocks) is shown as its JSON.
    if parts.is_empty() {
        if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
            parts.push(structured.to_string());
        }
    }
    let failed = result.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let text = if parts.is_empty() { "(the tool returned nothing)".to_string() } else { parts.join("\n") };
    (cut(text), !failed)
}

/// A resource read (a `ReadResourceResult` as JSON).
pub fn resource(result: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(items) = result.get("contents").and_then(Value::as_array) {
        blocks(items, &mut parts);
    }
    if parts.is_empty() {
        return "(the resource is empty)".into();
    }
    cut(parts.join("\n"))
}

/// `text` within [`MAX_RESULT_BYTES`], on a character boundary, with a note
/// saying how much was left out.
pub fn cut(text: String) -> String {
    if text.len() <= MAX_RESULT_BYTES {
        return text;
    }
    let mut end = MAX_RESULT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[cut: the result was {} bytes; only the first {end} are shown]", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_blocks_join_and_other_blocks_are_named() {
        let result = json!({"content": [
            {"type": "text", "text": "Echo: hi"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://1", "text": "inside"}},
            {"type": "resource_link", "uri": "test://2", "name": "two"},
        ]});
        let (text, ok) = tool_result(&result);
        assert!(ok);
        assert_eq!(
            text,
            "Echo: hi\n[image (image/png, about 3 bytes) not shown: you cannot see it]\ninside\n[resource test://2: read it with mcp_read_resource]"
        );
        let (text, ok) = tool_result(&json!({"content": [{"type": "text", "text": "no"}], "isError": true}));
        assert_eq!((text.as_str(), ok), ("no", false));
        let (text, _) = tool_result(&json!({"content": [], "structuredContent": {"a": 1}}));
        assert_eq!(text, r#"{"a":1}"#);
    }

    #[test]
    fn a_result_is_cut_at_its_limit_and_one_past() {
        let at = "a".repeat(MAX_RESULT_BYTES);
        assert_eq!(cut(at.clone()), at);
        let past = cut("é".repeat(MAX_RESULT_BYTES / 2 + 1));
        assert!(
            past.ends_with(&format!(
                "[cut: the result was {} bytes; only the first {MAX_RESULT_BYTES} are shown]",
                MAX_RESULT_BYTES + 2
            )),
            "{}",
            &past[past.len() - 100..]
        );
    }
}
