//! Embeddings: OpenAI's `POST /v1/embeddings` and Ollama's
//! `POST /ollama/api/embed`, answered by a model configured with
//! `embedding: true`. The engine batches inputs across requests; here
//! the body is checked and the vectors put in each API's shape.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use skillhost_engine::{EmbedInput, Embedded, EngineError};

use crate::http::body::read_json;
use crate::http::chat::guarded;
use crate::http::error::{ApiError, OpenAiError, PlainError};
use crate::http::AppState;

/// Inputs one request may carry, as OpenAI's API allows.
pub const MAX_EMBED_INPUTS: usize = 2048;

#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    model: Option<String>,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<u64>,
    /// OpenAI's end-user id: accepted and not used.
    #[allow(dead_code)]
    user: Option<String>,
}

/// How OpenAI's client asked for the vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Float,
    /// Little-endian 32-bit floats, base64: the `openai` Python client's
    /// default, a quarter of the JSON.
    Base64,
}

/// `POST /v1/embeddings`
pub async fn openai(
    state: web::Data<AppState>,
    http: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let request: EmbeddingsRequest = read_json(&http, payload).await?;
    Ok(guarded(&state, "embeddings", answer_openai(&state, request)).await?)
}

async fn answer_openai(state: &AppState, request: EmbeddingsRequest) -> Result<HttpResponse, ApiError> {
    let inputs = openai_inputs(&request.input)?;
    let encoding = match request.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::bad_param(
                "encoding_format",
                format!("encoding_format '{other}' is not one of float, base64"),
            ))
        }
    };
    let backend = state.server.model(request.model.as_deref().filter(|name| !name.is_empty())).await?;
    let info = backend.info();
    if let Some(asked) = request.dimensions {
        if asked != u64::from(info.n_embd) || !info.embedding {
            return Err(ApiError::bad_param(
                "dimensions",
                format!(
                    "the model '{}' returns vectors of {} dimensions and cannot shorten them; leave dimensions out",
                    info.id, info.n_embd
                ),
            ));
        }
    }
    let Embedded { vectors, prompt_tokens } =
        backend.embed(inputs, false).await.map_err(|err| embed_error(err, &info.id))?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = match encoding {
                Encoding::Float => json!(vector),
                Encoding::Base64 => json!(base64_floats(vector)),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": data,
        "model": info.id,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })))
}

/// OpenAI's four shapes of `input`: a string, strings, token ids, or
/// lists of token ids.
fn openai_inputs(input: &Value) -> Result<Vec<EmbedInput>, ApiError> {
    let bad = |message: String| ApiError::bad_param("input", message);
    let items = match input {
        Value::String(_) => return Ok(vec![text_input(input, None)?]),
        Value::Array(items) => items,
        _ => return Err(bad("input must be a string, an array of strings, or token ids".into())),
    };
    check_count(items.len())?;
    if items.iter().all(Value::is_number) {
        return Ok(vec![EmbedInput::Tokens(token_ids(items, None)?)]);
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::String(_) => text_input(item, Some(index)),
            Value::Array(ids) if !ids.is_empty() => Ok(EmbedInput::Tokens(token_ids(ids, Some(index))?)),
            Value::Array(_) => Err(bad(format!("input[{index}] is an empty list of token ids"))),
            _ => Err(bad(format!(
                "input[{index}] must be a string or a list of token ids, like every other item of the array"
            ))),
        })
        .collect()
}

fn check_count(n: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::bad_param("input", "input is an empty array; send at least one input"));
    }
    if n > MAX_EMBED_INPUTS {
        return Err(ApiError::bad_param(
            "input",
            format!("input holds {n} items; one request takes at most {MAX_EMBED_INPUTS}"),
        ));
    }
    Ok(())
}

/// A text input; an empty one embeds nothing and is refused, as OpenAI does.
fn text_input(item: &Value, index: Option<usize>) -> Result<EmbedInput, ApiError> {
    let at = index.map_or_else(|| "input".to_string(), |index| format!("input[{index}]"));
    match item.as_str() {
        Some("") => Err(ApiError::bad_param("input", format!("{at} is an empty string; there is nothing to embed"))),
        Some(text) => Ok(EmbedInput::Text(text.to_string())),
        None => Err(ApiError::bad_param("input", format!("{at} must be a string"))),
    }
}

fn token_ids(items: &[Value], index: Option<usize>) -> Result<Vec<u32>, ApiError> {
    let at = index.map_or_else(|| "input".to_string(), |index| format!("input[{index}]"));
    items
        .iter()
        .map(|item| {
            item.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
                ApiError::bad_param("input", format!("{at} holds {item}, which is not a token id (a whole number ≥ 0)"))
            })
        })
        .collect()
}

/// The vector as OpenAI's base64 encoding: its little-endian 32-bit
/// floats, one after another.
fn base64_floats(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// What the engine's refusal means to an embeddings client.
fn embed_error(err: EngineError, model: &str) -> ApiError {
    match err {
        EngineError::PromptTooLong { n_prompt, n_ctx } => ApiError::bad_param(
            "input",
            format!(
                "an input is {n_prompt} tokens long; the model '{model}' embeds at most {n_ctx} tokens per input (ctx-size on its models entry sets it)"
            ),
        ),
        EngineError::EmptyPrompt => ApiError::bad_param("input", "an input tokenized to nothing"),
        EngineError::BadInput(message) | EngineError::InvalidGrammar(message) => ApiError::bad_request(message),
        EngineError::UpstreamRefused(_) => ApiError::bad_request(err.to_string()),
        EngineError::Stopped | EngineError::Load { .. } | EngineError::Upstream(_) => {
            ApiError::Unavailable(err.to_string())
        }
        EngineError::Decode(_) => ApiError::Internal(err.to_string()),
    }
}

#[derive(Debug, Deserialize)]
pub struct OllamaEmbedRequest {
    model: Option<String>,
    input: Value,
    /// Cut an input longer than the context instead of refusing it.
    truncate: Option<bool>,
    dimensions: Option<u64>,
    /// Ollama's sampling options and residency: nothing here to apply.
    #[allow(dead_code)]
    options: Option<Value>,
    #[allow(dead_code)]
    keep_alive: Option<Value>,
}

/// `POST /ollama/api/embed`
pub async fn ollama(
    state: web::Data<AppState>,
    http: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, PlainError> {
    let request: OllamaEmbedRequest = read_json(&http, payload).await?;
    Ok(guarded(&state, "ollama_embed", answer_ollama(&state, request)).await?)
}

async fn answer_ollama(state: &AppState, request: OllamaEmbedRequest) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let inputs = match &request.input {
        Value::String(_) => vec![text_input(&request.input, None)?],
        Value::Array(items) => {
            check_count(items.len())?;
            items.iter().enumerate().map(|(index, item)| text_input(item, Some(index))).collect::<Result<_, _>>()?
        }
        _ => return Err(ApiError::bad_param("input", "input must be a string or an array of strings")),
    };
    let asked = request.model.as_deref().map(|name| name.strip_suffix(":latest").unwrap_or(name));
    let backend = state.server.model(asked.filter(|name| !name.is_empty())).await?;
    let loaded = started.elapsed();
    let info = backend.info();
    if request.dimensions.is_some_and(|asked| asked != u64::from(info.n_embd) || !info.embedding) {
        return Err(ApiError::bad_param(
            "dimensions",
            format!("the model '{}' returns vectors of {} dimensions and cannot shorten them", info.id, info.n_embd),
        ));
    }
    let Embedded { vectors, prompt_tokens } =
        backend.embed(inputs, request.truncate.unwrap_or(true)).await.map_err(|err| embed_error(err, &info.id))?;
    Ok(HttpResponse::Ok().json(json!({
        "model": info.id,
        "embeddings": vectors,
        "total_duration": started.elapsed().as_nanos() as u64,
        "load_duration": loaded.as_nanos() as u64,
        "prompt_eval_count": prompt_tokens,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_openai_input_shape_reads_and_a_bad_one_says_which_item() {
        assert_eq!(openai_inputs(&json!("hi")).unwrap(), [EmbedInput::Text("hi".into())]);
        assert_eq!(
            openai_inputs(&json!(["a", [1, 2]])).unwrap(),
            [EmbedInput::Text("a".into()), EmbedInput::Tokens(vec![1, 2])]
        );
        assert_eq!(openai_inputs(&json!([5, 6])).unwrap(), [EmbedInput::Tokens(vec![5, 6])]);
        let message = |input: Value| openai_inputs(&input).unwrap_err().to_string();
        assert!(message(json!([])).contains("empty array"));
        assert!(message(json!("")).contains("input is an empty string"));
        assert!(message(json!(["a", ""])).contains("input[1] is an empty string"));
        assert!(message(json!(["a", 3.5])).contains("input[1] must be a string or a list of token ids"));
        assert!(message(json!([[1, -2]])).contains("input[0] holds -2, which is not a token id"));
        assert!(message(json!([[]])).contains("input[0] is an empty list"));
        assert!(message(json!({"text": "a"})).contains("input must be a string"));
    }

    #[test]
    fn a_request_takes_max_embed_inputs_and_not_one_more() {
        let at = Value::Array(vec![json!("x"); MAX_EMBED_INPUTS]);
        assert_eq!(openai_inputs(&at).unwrap().len(), MAX_EMBED_INPUTS);
        let past = Value::Array(vec![json!("x"); MAX_EMBED_INPUTS + 1]);
        let err = openai_inputs(&past).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "input holds {} items; one request takes at most {MAX_EMBED_INPUTS}",
                MAX_EMBED_INPUTS + 1
            )),
            "{err}"
        );
    }

    #[test]
    fn base64_is_the_little_endian_floats() {
        let encoded = base64_floats(&[1.0, -0.5]);
        let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat());
    }
}
