//! OpenAI's Files API: `POST /v1/files` (multipart, streamed to disk),
//! `GET /v1/files`, `GET`/`DELETE /v1/files/{id}` and `GET
//! /v1/files/{id}/content`. A file belongs to the caller that uploaded it;
//! a chat message names it by id (`file_id`) to attach it.
//!
//! An upload is spooled to a private file in the state folder as it
//! arrives, counted against `--max-attachment-bytes` and typed by its
//! content on the way, then copied into the store in one transaction. A
//! cut-off upload, one past the limit or one the store refuses leaves
//! nothing: the spooled file goes with the handler, and the store's row and
//! blob are one commit.

use actix_multipart::Multipart;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use rand::distr::{Alphanumeric, SampleString};
use serde_json::{json, Value};
use skillhost_actors::attachments::{self, Sniffer};
use skillhost_actors::store::files::{self, FileMeta, Order};
use skillhost_actors::store::{unix_now, Connection, StoreError};
use tokio::io::AsyncWriteExt;

use crate::http::access::Caller;
use crate::http::error::{ApiError, OpenAiError};
use crate::http::responses::{refuse_unknown_query, store_failed};
use crate::http::AppState;

/// The purposes OpenAI's Files API takes; any is kept as sent.
pub const PURPOSES: [&str; 6] = ["assistants", "batch", "fine-tune", "vision", "user_data", "evals"];
/// Uploads streaming at once; more wait up to [`UPLOAD_WAIT`], then are
/// refused.
pub const MAX_CONCURRENT_FILE_UPLOADS: usize = 4;
const UPLOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Most files one page of `GET /v1/files` lists, and how many it lists
/// when the request names no `limit` (OpenAI's own bounds).
pub const MAX_FILES_PAGE: usize = 10_000;
/// The form fields besides the file, read and bounded.
const MAX_FORM_FIELD_BYTES: usize = 64;
/// Room the multipart envelope may take beside the file.
const ENVELOPE_BYTES: u64 = 64 * 1024;
/// The state folder's subfolder uploads are spooled in.
pub const SPOOL_DIR: &str = "uploads";
/// The longest expiry an upload may ask for (OpenAI's: 30 days).
pub const MAX_EXPIRES_AFTER_SECS: u64 = 30 * 24 * 3600;
/// The shortest (OpenAI's: an hour).
pub const MIN_EXPIRES_AFTER_SECS: u64 = 3600;

static UPLOADS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_CONCURRENT_FILE_UPLOADS);

/// The API's file object.
pub fn file_object(file: &FileMeta) -> Value {
    json!({
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": file.created_at,
        "expires_at": file.expires_at,
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": null,
    })
}

fn no_file(id: &str) -> ApiError {
    ApiError::NotFound(format!("no file of yours has the id '{id}' (it was never uploaded, was deleted, or expired)"))
}

/// A file id, unless another replica issued it (its store has the file).
fn file_id(id: &str) -> Result<&str, ApiError> {
    match skillhost_actors::replica::elsewhere(id) {
        Some(replica) => {
            Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&format!("file {id}"), replica)))
        }
        None => Ok(id),
    }
}

/// The folder uploads are spooled in: beside the store, made private on
/// first use. What a killed server left there is removed at the next start.
fn spool_folder(state: &AppState) -> Result<std::path::PathBuf, ApiError> {
    let dir = state.store.path().parent().map(|dir| dir.join(SPOOL_DIR)).unwrap_or_else(|| SPOOL_DIR.into());
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => Ok(dir),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(dir),
        Err(err) => Err(ApiError::Internal(format!("cannot make the upload folder {}: {err}", dir.display()))),
    }
}

/// Removes the spooled uploads a killed server left behind. Called at
/// start-up, once this server holds the state folder's lock (no other
/// server spools there). The folder is the server's own; an entry is
/// unlinked, never followed.
pub fn sweep_spool(state_dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(state_dir.join(SPOOL_DIR)) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let is_spooled = entry.file_name().to_string_lossy().starts_with(".upload-");
        if is_spooled
            && entry.file_type().is_ok_and(|kind| !kind.is_dir())
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// A form field's value, bounded.
async fn small_field(field: &mut actix_multipart::Field) -> Result<String, ApiError> {
    let mut value = Vec::new();
    while let Some(chunk) = field.next().await {
        let chunk = chunk.map_err(|err| ApiError::bad_request(format!("the upload could not be read: {err}")))?;
        if value.len() + chunk.len() > MAX_FORM_FIELD_BYTES {
            let name = field.name().unwrap_or_default().to_string();
            return Err(ApiError::bad_param(&name, format!("'{name}' is longer than {MAX_FORM_FIELD_BYTES} bytes")));
        }
        value.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&value).trim().to_string())
}

/// The uploaded file, spooled.
struct Spooled {
    file: tempfile::NamedTempFile,
    bytes: u64,
    filename: Option<String>,
    media_type: String,
}

/// `POST /v1/files`: multipart with the content in `file` and its
/// `purpose`; `expires_after[anchor]` (`created_at`) and
/// `expires_after[seconds]` set when it goes by itself.
pub async fn upload(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let limit = state.max_attachment_bytes;
    if crate::http::body::content_length(&request).is_some_and(|n| n as u64 > limit + ENVELOPE_BYTES) {
        return Err(too_large(limit).into());
    }
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !content_type.starts_with("multipart/form-data") {
        return Err(ApiError::bad_request(
            "send the file as multipart/form-data, with the content in a field named 'file' and its 'purpose'",
        )
        .into());
    }
    let _place = match tokio::time::timeout(UPLOAD_WAIT, UPLOADS.acquire()).await {
        Ok(Ok(place)) => place,
        _ => {
            return Err(ApiError::Overloaded(format!(
                "{MAX_CONCURRENT_FILE_UPLOADS} uploads are already in progress; retry shortly"
            ))
            .into())
        }
    };
    let spool = spool_folder(&state)?;
    let mut multipart = Multipart::new(request.headers(), payload);
    let (mut spooled, mut purpose, mut anchor, mut seconds) = (None, None, None, None);
    while let Some(field) = multipart.next().await {
        let mut field =
            field.map_err(|err| ApiError::bad_request(format!("the upload is not valid multipart data: {err}")))?;
        let name = field.name().unwrap_or_default().to_string();
        match name.as_str() {
            "file" if spooled.is_none() => spooled = Some(spool_file(&mut field, &spool, limit).await?),
            "file" => return Err(ApiError::bad_param("file", "the upload has more than one 'file'").into()),
            "purpose" => purpose = Some(small_field(&mut field).await?),
            "expires_after[anchor]" => anchor = Some(small_field(&mut field).await?),
            "expires_after[seconds]" => seconds = Some(small_field(&mut field).await?),
            other => {
                return Err(ApiError::bad_param(
                    other,
                    format!("the upload has a field '{other}'; this server takes file, purpose and expires_after"),
                )
                .into())
            }
        }
    }
    let spooled = spooled.ok_or_else(|| ApiError::bad_param("file", "the upload has no field named 'file'"))?;
    let purpose = purpose.ok_or_else(|| ApiError::bad_param("purpose", "the upload needs a 'purpose'"))?;
    if !PURPOSES.contains(&purpose.as_str()) {
        return Err(ApiError::bad_param(
            "purpose",
            format!("'purpose' must be one of {}, got '{purpose}'", PURPOSES.join(", ")),
        )
        .into());
    }
    let created_at = unix_now();
    let expires_at = expiry(anchor.as_deref(), seconds.as_deref(), created_at)?;
    // Kept beside the rest of the store's limit: a file larger than all of
    // it could never be kept.
    if spooled.bytes > state.store.retention().max_bytes {
        return Err(ApiError::PayloadTooLarge(format!(
            "the file is {} bytes, more than the whole store may hold (--state-max-bytes {})",
            spooled.bytes,
            state.store.retention().max_bytes
        ))
        .into());
    }
    let mut taken = std::collections::HashSet::new();
    let filename = attachments::safe_name(spooled.filename.as_deref(), &spooled.media_type, 1, &mut taken);
    let meta = FileMeta {
        // Stored here only: the id names this replica (`--replica-id`).
        id: skillhost_actors::replica::stamp(format!("file-{}", Alphanumeric.sample_string(&mut rand::rng(), 24))),
        filename,
        purpose,
        media_type: spooled.media_type,
        bytes: spooled.bytes,
        created_at,
        expires_at,
    };
    let (owner, stored, retention) = (Caller::of(&request), meta.clone(), state.store.retention());
    let spooled_file = spooled.file;
    state
        .store
        .run(move |conn| {
            let mut content = spooled_file
                .reopen()
                .map_err(|err| StoreError::Worker(format!("the spooled upload cannot be read: {err}")))?;
            files::put(conn, &owner, &stored, &mut content)?;
            // The new file may push the oldest records out.
            skillhost_actors::store::retain(conn, retention, unix_now())?;
            drop(spooled_file);
            Ok(())
        })
        .await
        .map_err(store_failed)?;
    Ok(HttpResponse::Ok().json(file_object(&meta)))
}

fn too_large(limit: u64) -> ApiError {
    ApiError::PayloadTooLarge(format!("the file is larger than the limit of {limit} bytes (--max-attachment-bytes)"))
}

/// Streams the `file` field to a private file in `spool`, counting and
/// typing it as it comes.
async fn spool_file(
    field: &mut actix_multipart::Field,
    spool: &std::path::Path,
    limit: u64,
) -> Result<Spooled, ApiError> {
    let filename = field.content_disposition().and_then(|d| d.get_filename()).map(str::to_string);
    let staged = tempfile::Builder::new()
        .prefix(".upload-")
        .tempfile_in(spool)
        .map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?;
    let mut file = tokio::fs::File::from_std(
        staged.reopen().map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?,
    );
    let (mut bytes, mut sniffer) = (0u64, Sniffer::default());
    while let Some(chunk) = field.next().await {
        let chunk = chunk.map_err(|err| ApiError::bad_request(format!("the upload could not be read: {err}")))?;
        bytes += chunk.len() as u64;
        if bytes > limit {
            return Err(too_large(limit));
        }
        sniffer.feed(&chunk);
        file.write_all(&chunk).await.map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?;
    }
    file.flush().await.map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?;
    Ok(Spooled { file: staged, bytes, filename, media_type: sniffer.media_type() })
}

/// When a file uploaded at `created_at` goes, from `expires_after`.
fn expiry(anchor: Option<&str>, seconds: Option<&str>, created_at: u64) -> Result<Option<u64>, ApiError> {
    let (anchor, seconds) = match (anchor, seconds) {
        (None, None) => return Ok(None),
        (Some(anchor), Some(seconds)) => (anchor, seconds),
        _ => {
            return Err(ApiError::bad_param(
                "expires_after",
                "'expires_after' needs both its 'anchor' (created_at) and its 'seconds'",
            ))
        }
    };
    if anchor != "created_at" {
        return Err(ApiError::bad_param(
            "expires_after[anchor]",
            format!("'expires_after[anchor]' must be created_at, got '{anchor}'"),
        ));
    }
    match seconds.parse::<u64>() {
        Ok(n) if (MIN_EXPIRES_AFTER_SECS..=MAX_EXPIRES_AFTER_SECS).contains(&n) => Ok(Some(created_at + n)),
        _ => Err(ApiError::bad_param(
            "expires_after[seconds]",
            format!(
                "'expires_after[seconds]' must be a whole number from {MIN_EXPIRES_AFTER_SECS} to {MAX_EXPIRES_AFTER_SECS}, got '{seconds}'"
            ),
        )),
    }
}

/// `GET /v1/files`: the caller's files, newest first unless `order=asc`,
/// of one `purpose` when given, a page after `after`.
pub async fn list(state: web::Data<AppState>, request: HttpRequest) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &["purpose", "limit", "order", "after"])?;
    let query = web::Query::<std::collections::HashMap<String, String>>::from_query(request.query_string())
        .map_err(|err| ApiError::bad_request(format!("the query is not valid: {err}")))?
        .into_inner();
    let limit = match query.get("limit") {
        None => MAX_FILES_PAGE,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_FILES_PAGE).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_param(
                    "limit",
                    format!("'limit' must be a whole number from 1 to {MAX_FILES_PAGE}, got '{text}'"),
                )
                .into())
            }
        },
    };
    let order = match query.get("order").map(String::as_str) {
        None | Some("desc") => Order::Newest,
        Some("asc") => Order::Oldest,
        Some(other) => {
            return Err(ApiError::bad_param("order", format!("'order' must be asc or desc, got '{other}'")).into())
        }
    };
    let (owner, purpose, after) = (Caller::of(&request), query.get("purpose").cloned(), query.get("after").cloned());
    let (page, more) = state
        .store
        .run(move |conn| files::list(conn, &owner, purpose.as_deref(), after.as_deref(), limit, order))
        .await
        .map_err(store_failed)?;
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": page.iter().map(file_object).collect::<Vec<_>>(),
        "first_id": page.first().map(|f| f.id.clone()),
        "last_id": page.last().map(|f| f.id.clone()),
        "has_more": more,
    })))
}

/// Runs `work` in the store on the file a route names, for the route's
/// caller; `None` from it is the 404. Returns the id with what it found.
async fn on_file<T: Send + 'static>(
    state: &AppState,
    request: &HttpRequest,
    id: &str,
    work: impl FnOnce(&Connection, &str, &str) -> Result<Option<T>, StoreError> + Send + 'static,
) -> Result<(String, T), ApiError> {
    refuse_unknown_query(request, &[])?;
    let (owner, id) = (Caller::of(request), file_id(id)?.to_string());
    let wanted = id.clone();
    let found = state.store.run(move |conn| work(conn, &owner, &wanted)).await.map_err(store_failed)?;
    match found {
        Some(found) => Ok((id, found)),
        None => Err(no_file(&id)),
    }
}

/// `GET /v1/files/{id}`
pub async fn retrieve(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let (_, file) = on_file(&state, &request, &id, files::get).await?;
    Ok(HttpResponse::Ok().json(file_object(&file)))
}

/// `DELETE /v1/files/{id}`
pub async fn delete(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let (id, ()) =
        on_file(&state, &request, &id, |conn, owner, id| Ok(files::delete(conn, owner, id)?.then_some(()))).await?;
    Ok(HttpResponse::Ok().json(json!({"id": id, "object": "file", "deleted": true})))
}

/// `GET /v1/files/{id}/content`: the bytes as uploaded, always as a
/// download (never rendered here: a file is whatever its uploader made).
pub async fn content(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let (_, (file, bytes)) = on_file(&state, &request, &id, files::read).await?;
    let disposition = header::ContentDisposition {
        disposition: header::DispositionType::Attachment,
        parameters: vec![header::DispositionParam::Filename(file.filename.clone())],
    };
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header((header::CONTENT_DISPOSITION, disposition))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_is_created_at_plus_seconds_within_openais_bounds() {
        assert_eq!(expiry(None, None, 100).unwrap(), None);
        let at = |seconds: u64| expiry(Some("created_at"), Some(&seconds.to_string()), 100);
        assert_eq!(at(MIN_EXPIRES_AFTER_SECS).unwrap(), Some(100 + MIN_EXPIRES_AFTER_SECS));
        assert_eq!(at(MAX_EXPIRES_AFTER_SECS).unwrap(), Some(100 + MAX_EXPIRES_AFTER_SECS));
        assert!(at(MIN_EXPIRES_AFTER_SECS - 1).is_err());
        assert!(at(MAX_EXPIRES_AFTER_SECS + 1).is_err());
        assert!(expiry(Some("last_active_at"), Some("3600"), 100).is_err());
        assert!(expiry(None, Some("3600"), 100).is_err());
    }
}
