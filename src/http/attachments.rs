//! Files attached to a chat message, on every surface: the wire's file and
//! image parts become [`Pending`] attachments while the request is
//! validated (inline data decoded, a `file_id` kept), and [`attach`] then
//! reads the stored ones, checks the limits, names each one and adds its
//! line to its message, before the turn starts. Without code execution, a
//! PDF's text is read then too, by a confined child (`crate::pdf_text`),
//! for the `read_file` that reads attachments from memory.

use std::collections::HashSet;

use base64::Engine;
use bytes::Bytes;
use skillhost_actors::attachments::{
    self, Attachment, MAX_ATTACHMENTS_PER_MESSAGE, MAX_CONVERSATION_ATTACHMENTS, MAX_CONVERSATION_ATTACHMENT_BYTES,
};
use skillhost_actors::store::files;
use skillhost_actors::ChatRequest;

use crate::http::error::ApiError;
use crate::http::AppState;

/// Where an attachment's bytes are.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Sent inline (base64, or text), already decoded.
    Data(Bytes),
    /// A file of the caller's in the store (`/v1/files`).
    Stored(String),
}

/// An attachment as the wire sent it, not yet read or named.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The message it came with.
    pub message: usize,
    /// Where the wire put it, for error messages (`messages[2].content[1]`).
    pub at: String,
    /// The name the sender gave, if any.
    pub filename: Option<String>,
    pub source: Source,
}

/// The bytes of a `data:` URL (`data:TYPE;base64,DATA`, or without
/// `;base64` percent-free text), or of bare base64; `field` names the
/// field in the error.
pub fn decode_data(value: &str, field: &str) -> Result<Bytes, ApiError> {
    let bad = |why: &str| ApiError::bad_param(field, format!("'{field}' {why}"));
    let (base64, data) = match value.strip_prefix("data:") {
        Some(rest) => {
            let (header, data) =
                rest.split_once(',').ok_or_else(|| bad("is a data: URL without a ',' before its data"))?;
            (header.ends_with(";base64"), data)
        }
        None => (true, value),
    };
    if !base64 {
        return Ok(Bytes::copy_from_slice(data.as_bytes()));
    }
    // Some clients wrap base64 at 76 columns.
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map(Bytes::from)
        .map_err(|err| bad(&format!("is not valid base64: {err}")))
}

/// The refusal of an attachment given by URL: this server fetches nothing.
pub fn no_urls(field: &str) -> ApiError {
    ApiError::bad_param(
        field,
        format!(
            "'{field}' is a URL; this server fetches nothing from the network: send the file inline (a data: URL or base64) or upload it to /v1/files and name its id"
        ),
    )
}

/// Reads, checks and names `pending` (in message order) and adds each
/// one's line to its message. `owner` is the caller whose stored files a
/// `file_id` may name. Returns the ids of the stored files used.
pub async fn attach(
    state: &AppState,
    owner: &str,
    request: &mut ChatRequest,
    pending: Vec<Pending>,
) -> Result<Vec<String>, ApiError> {
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    // Pending files come in message order: each message's are one run.
    for run in pending.chunk_by(|a, b| a.message == b.message) {
        let (message, count) = (run[0].message, run.len());
        if count > MAX_ATTACHMENTS_PER_MESSAGE {
            return Err(ApiError::bad_param(
                &format!("messages[{message}].content"),
                format!("messages[{message}] carries {count} files; a message may carry at most {MAX_ATTACHMENTS_PER_MESSAGE}"),
            ));
        }
    }
    if pending.len() > MAX_CONVERSATION_ATTACHMENTS {
        return Err(ApiError::bad_param(
            "messages",
            format!(
                "the conversation carries {} files; one may carry at most {MAX_CONVERSATION_ATTACHMENTS}: start a new conversation",
                pending.len()
            ),
        ));
    }
    let stored: Vec<String> = pending
        .iter()
        .filter_map(|p| match &p.source {
            Source::Stored(id) => Some(id.clone()),
            Source::Data(_) => None,
        })
        .collect();
    let found = if stored.is_empty() {
        Vec::new()
    } else {
        let (owner, ids) = (owner.to_string(), stored.clone());
        state
            .store
            .run(move |conn| ids.iter().map(|id| files::read(conn, &owner, id)).collect::<Result<Vec<_>, _>>())
            .await
            .map_err(crate::http::responses::store_failed)?
    };
    let mut found = found.into_iter();
    let code_exec = state.server.exec().is_some_and(|exec| exec.code_exec);
    let (mut taken, mut total, mut named) = (HashSet::new(), 0u64, Vec::with_capacity(pending.len()));
    for (ordinal, part) in pending.into_iter().enumerate() {
        let (content, filename) = match part.source {
            Source::Data(content) => (content, part.filename),
            Source::Stored(id) => match found.next().flatten() {
                Some((meta, content)) => (Bytes::from(content), part.filename.or(Some(meta.filename))),
                None => {
                    return Err(ApiError::bad_param(
                        &part.at,
                        format!("'{}' names the file '{id}', which no file of yours has (it was never uploaded here, was deleted, or expired)", part.at),
                    ))
                }
            },
        };
        let bytes = content.len() as u64;
        if bytes > state.max_attachment_bytes {
            return Err(ApiError::PayloadTooLarge(format!(
                "'{}' is {bytes} bytes; an attachment may be at most {} bytes (--max-attachment-bytes)",
                part.at, state.max_attachment_bytes
            )));
        }
        total += bytes;
        if total > MAX_CONVERSATION_ATTACHMENT_BYTES {
            return Err(ApiError::PayloadTooLarge(format!(
                "the conversation's attachments come to more than {MAX_CONVERSATION_ATTACHMENT_BYTES} bytes, at '{}'; start a new conversation or attach less",
                part.at
            )));
        }
        let media_type = attachments::media_type(&content);
        let name = attachments::safe_name(filename.as_deref(), &media_type, ordinal + 1, &mut taken);
        let extracted = match (&state.pdf_reader, media_type.as_str()) {
            // With code execution the model's own commands read it.
            (Some(reader), "application/pdf") if !code_exec => match crate::pdf_text::read(reader, &content).await {
                Ok(text) => Some(text),
                Err(err) => {
                    tracing::info!(attachment = %name, "an attached PDF's text was not read: {err}");
                    None
                }
            },
            _ => None,
        };
        named.push(Attachment { message: part.message, name, media_type, content, extracted });
    }
    for attachment in &named {
        let Some(message) = request.messages.get_mut(attachment.message) else { continue };
        if !message.content.is_empty() {
            message.content.push_str("\n\n");
        }
        message.content.push_str(&attachment.note());
    }
    request.attachments = named;
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_and_bare_base64_decode_and_bad_ones_say_why() {
        let decoded = |value: &str| decode_data(value, "file_data").map(|b| b.to_vec());
        assert_eq!(decoded("data:text/plain;base64,aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decoded("aGVs\nbG8=").unwrap(), b"hello");
        assert_eq!(decoded("data:text/plain,hello").unwrap(), b"hello");
        let err = decoded("data:text/plain;base64").unwrap_err().to_string();
        assert_eq!(err, "'file_data' is a data: URL without a ',' before its data");
        let err = decoded("not base64!").unwrap_err().to_string();
        assert!(err.starts_with("'file_data' is not valid base64"), "{err}");
    }
}
