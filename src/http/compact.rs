//! `POST /v1/responses/compact`: a long conversation made short. The
//! model summarizes everything but the user's own messages (its answers,
//! its calls and their results), and the answer is the user's messages,
//! verbatim, followed by one `compaction` item that carries the summary.
//! A later request sends those items back as its input (before its new
//! message), and the summary stands where the compacted turns were, as
//! an assistant message.
//!
//! `encrypted_content` is opaque to clients, as OpenAI defines it, but not
//! secret: it is the summary, encoded. Nothing in it is trusted more than
//! an assistant message a client could send itself, which is how it is
//! rendered, so a forged one gains nothing.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::http::access::Caller;
use crate::http::body::read_json;
use crate::http::chat::{guarded, model_info};
use crate::http::error::{ApiError, OpenAiError};
use crate::http::openai::{ChatCompletionRequest, WireContent, WireMessage};
use crate::http::responses::{input_items, messages_from_items, new_id, resolve, usage_json, SPELLING};
use crate::http::stream::{begin_translated, collect};
use crate::http::AppState;

/// Most tokens the summary may take.
pub const COMPACT_MAX_TOKENS: u32 = 1024;
/// What marks a compaction this server made, before the encoded summary.
const MARK: &str = "skillhost-compaction-v1.";
/// Longest `encrypted_content` read back: a summary of the longest one
/// this server writes, with room for a newer one's.
pub const MAX_COMPACTION_BYTES: usize = 64 * 1024;

/// What the model is asked to do with the transcript.
const INSTRUCTIONS: &str = "You condense a conversation so that it can go on without its full text. \
Write a summary, in the assistant's voice, of what was asked, what was done (each tool call and what it returned), \
what was decided and what is still open. Keep names, numbers, file paths and commands exactly. \
Leave out greetings and anything already settled that later turns do not need. Answer with the summary only.";

/// The body of `POST /v1/responses/compact`, as OpenAI defines it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactRequest {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    previous_response_id: Option<String>,
    prompt_cache_key: Option<String>,
    prompt_cache_retention: Option<String>,
    prompt_cache_options: Option<Value>,
    service_tier: Option<String>,
    image: Option<Value>,
}

/// The summary a compaction item carries; a 400 naming the item when it is
/// not one this server made.
pub fn summary_of(item: &Value, at: &str) -> Result<String, ApiError> {
    let field = format!("{at}.encrypted_content");
    let refused = |why: &str| ApiError::bad_param(&field, format!("'{field}' {why}"));
    let Some(content) = item.get("encrypted_content").and_then(Value::as_str) else {
        return Err(refused("is missing: a compaction item carries what POST /v1/responses/compact made"));
    };
    if content.len() > MAX_COMPACTION_BYTES {
        return Err(refused(&format!("is longer than {MAX_COMPACTION_BYTES} bytes")));
    }
    let decoded = content
        .strip_prefix(MARK)
        .and_then(|encoded| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok());
    decoded.ok_or_else(|| refused("is not a compaction this server made (another provider's cannot be read here)"))
}

fn encode(summary: &str) -> String {
    format!("{MARK}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(summary.as_bytes()))
}

/// The transcript the model summarizes: one paragraph per message, each
/// headed by who said it.
fn transcript(messages: &[WireMessage]) -> String {
    let mut text = String::new();
    for message in messages {
        let said = match &message.content {
            Some(WireContent::Text(body)) => body.clone(),
            _ => String::new(),
        };
        let calls: Vec<String> = message
            .tool_calls
            .iter()
            .flatten()
            .map(|call| {
                let arguments = call.function.arguments.as_ref().map(Value::to_string).unwrap_or_default();
                format!("called {} with {arguments}", call.function.name)
            })
            .collect();
        let who = match message.role.as_str() {
            "tool" => "tool result",
            role => role,
        };
        let body = [said, calls.join("\n")].into_iter().filter(|part| !part.is_empty()).collect::<Vec<_>>().join("\n");
        text.push_str(&format!("[{who}]\n{body}\n\n"));
    }
    text
}

/// `POST /v1/responses/compact`
pub async fn compact(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let started = Instant::now();
    Ok(guarded(&state, "responses", run(&state, &request, payload, started)).await?)
}

async fn run(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    payload: web::Payload,
    started: Instant,
) -> Result<HttpResponse, ApiError> {
    let asked: CompactRequest = read_json(request, payload).await?;
    if asked.image.is_some() {
        return Err(ApiError::bad_param(
            "image",
            "'image' sets how images are compacted, and this server takes no images",
        ));
    }
    // Accepted as OpenAI's clients send them; they shape nothing here.
    let _ = (&asked.prompt_cache_key, &asked.prompt_cache_retention, &asked.prompt_cache_options, &asked.service_tier);
    model_info(state, asked.model.as_deref()).await?;
    let owner = Caller::of(request);
    let given = input_items(asked.input)?;
    let (context, input) = resolve(state, &owner, asked.previous_response_id.as_deref(), None, given).await?;
    let items: Vec<Value> = context.into_iter().chain(input).collect();
    let messages = messages_from_items(&items, "input")?;
    let kept: Vec<Value> = items
        .iter()
        .filter(|item| {
            item.get("type").and_then(Value::as_str).unwrap_or("message") == "message" && item["role"] == "user"
        })
        .cloned()
        .collect();
    let mut ask = format!("{}\n\nThe conversation:\n\n{}", INSTRUCTIONS, transcript(&messages));
    if let Some(instructions) = &asked.instructions {
        ask = format!("The conversation's own instructions were:\n{instructions}\n\n{ask}");
    }
    let wire = ChatCompletionRequest {
        messages: vec![WireMessage {
            role: "user".into(),
            content: Some(WireContent::Text(ask)),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            raw: None,
        }],
        model: asked.model,
        max_tokens: Some(COMPACT_MAX_TOKENS),
        temperature: Some(0.0),
        // A summary is the model's own text: no skills, no tools, no agents.
        skills_discovery: Some(false),
        multi_agent: Some(false),
        ..ChatCompletionRequest::default()
    };
    let begun = begin_translated(state, request, &SPELLING, wire).await?;
    let done = collect(state, begun.chat, begun.peer, started).await?;
    let summary = done.text.trim().to_string();
    let mut output: Vec<Value> = kept.into_iter().map(crate::http::responses::stored_item).collect();
    output.push(json!({"type": "compaction", "id": new_id("cmp"), "encrypted_content": encode(&summary)}));
    Ok(HttpResponse::Ok().json(json!({
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": skillhost_actors::store::unix_now(),
        "output": output,
        "usage": usage_json(&done.usage, &done.timings),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_round_trips_and_anything_else_is_refused() {
        let item = json!({"type": "compaction", "encrypted_content": encode("We chose Rome. é")});
        assert_eq!(summary_of(&item, "input[1]").unwrap(), "We chose Rome. é");
        for bad in [
            json!({}),
            json!({"encrypted_content": "gAAAA-from-elsewhere"}),
            json!({"encrypted_content": format!("{MARK}%%%")}),
        ] {
            let err = summary_of(&bad, "input[1]").unwrap_err().to_string();
            assert!(err.contains("'input[1].encrypted_content'"), "{err}");
        }
        let at = json!({"encrypted_content": format!("{MARK}{}", "A".repeat(MAX_COMPACTION_BYTES - MARK.len()))});
        assert!(summary_of(&at, "x").is_ok());
        let past = json!({"encrypted_content": format!("{MARK}{}", "A".repeat(MAX_COMPACTION_BYTES - MARK.len() + 1))});
        assert!(summary_of(&past, "x").unwrap_err().to_string().contains("longer than"));
    }
}
