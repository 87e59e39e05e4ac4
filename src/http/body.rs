//! Reading JSON request bodies with a size limit and messages that name the
//! offending field.

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;

/// Largest JSON request body accepted. A prompt that fills even a 128k-token
/// context is well under 1 MiB of text; the rest is headroom for JSON escaping
/// and tool schemas.
pub const MAX_JSON_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Reads the whole body, refusing it as soon as it passes `limit` bytes.
pub async fn read_limited(
    mut payload: web::Payload,
    declared_len: Option<usize>,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let too_large = || ApiError::PayloadTooLarge(format!("the request body is larger than the limit of {limit} bytes"));
    if declared_len.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|err| ApiError::bad_request(format!("the request body could not be read: {err}")))?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The declared body length, when the client sent one.
pub fn content_length(request: &HttpRequest) -> Option<usize> {
    request.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Reads a JSON body of at most [`MAX_JSON_BODY_BYTES`] and parses it. A
/// body of megabytes is parsed on a blocking thread at idle priority, so
/// its parse does not take CPU from decoding streams.
pub async fn read_json<T: DeserializeOwned + Send + 'static>(
    request: &HttpRequest,
    payload: web::Payload,
) -> Result<T, ApiError> {
    let body = read_limited(payload, content_length(request), MAX_JSON_BODY_BYTES).await?;
    if body.len() <= skillhost_engine::LARGE_PROMPT_BYTES {
        return parse_json(&body);
    }
    tokio::task::spawn_blocking(move || skillhost_engine::at_idle_priority(|| parse_json(&body)))
        .await
        .map_err(|_| ApiError::Internal("parsing the request body failed".into()))?
}

/// Parses JSON; the error names the field path, what was wrong, and where.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(ApiError::bad_request("the request body is empty; send a JSON object")),
        // serde would call an array "a struct with N elements"; say it plainly.
        Some(b'[') => return Err(ApiError::bad_request("the request body is a JSON array; send a JSON object")),
        Some(_) => {}
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = if inner.is_syntax() || inner.is_eof() {
            format!("the request body is not valid JSON: {inner}")
        } else if path == "." {
            format!("the request body is not a valid request: {inner}")
        } else {
            format!("'{path}' is invalid: {inner}")
        };
        let param = (path != ".").then_some(path);
        ApiError::BadRequest { message, param, code: None }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Sample {
        messages: Vec<Message>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Message {
        role: String,
    }

    fn message(body: &str) -> String {
        match parse_json::<Sample>(body.as_bytes()) {
            Ok(v) => panic!("accepted {v:?}"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(message(""), "the request body is empty; send a JSON object");
        assert_eq!(
            message("{\"messages\": ["),
            "the request body is not valid JSON: EOF while parsing a list at line 1 column 14"
        );
        assert_eq!(
            message("{\"messages\": [{\"role\": 5}]}"),
            "'messages[0].role' is invalid: invalid type: integer `5`, expected a string at line 1 column 24"
        );
        assert_eq!(message("[]"), "the request body is a JSON array; send a JSON object");
        assert_eq!(
            message("\"hi\""),
            "the request body is not a valid request: invalid type: string \"hi\", expected struct Sample at line 1 column 4"
        );
    }
}
