//! Artifact downloads: files a request's commands produced.

use actix_web::body::SizedStream;
use actix_web::http::header::{self, ContentDisposition, DispositionParam, DispositionType};
use actix_web::{web, HttpResponse};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::http::error::{ApiError, PlainError};
use crate::http::AppState;

fn store(state: &AppState) -> Result<&skillhost_actors::artifacts::Artifacts, ApiError> {
    state
        .server
        .artifacts()
        .ok_or_else(|| ApiError::NotFound("this server runs no code, so it keeps no artifacts".into()))
}

/// What a path segment of an artifact link must not hold as it is: a `?`
/// or `#` in a file name would end the path and point the link elsewhere,
/// a `%` would read as an escape, a `+` is kept encoded by the router.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'+')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// Bytes of a download read at a time: a file is streamed, never loaded.
const DOWNLOAD_CHUNK_BYTES: usize = 64 * 1024;

/// The URL a file of a run is downloaded from, each segment encoded.
pub fn artifact_url(run_id: &str, path: &str) -> String {
    let segments: Vec<String> = path.split('/').map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect();
    format!("/api/code/artifacts/{}/{}", utf8_percent_encode(run_id, SEGMENT), segments.join("/"))
}

/// Another replica's run: its files are there, not here.
fn on_this_replica(run_id: &str) -> Result<(), ApiError> {
    match skillhost_actors::replica::elsewhere(run_id) {
        Some(owner) => {
            Err(ApiError::Conflict(skillhost_actors::replica::wrong_replica(&format!("run {run_id}"), owner)))
        }
        None => Ok(()),
    }
}

/// `GET /api/code/artifacts/{runId}`
pub async fn list(state: web::Data<AppState>, run_id: web::Path<String>) -> Result<HttpResponse, PlainError> {
    on_this_replica(&run_id)?;
    let files = store(&state)?
        .list(&run_id)
        .await
        .ok_or_else(|| ApiError::NotFound(format!("no run '{run_id}' has stored files (they are kept for an hour)")))?;
    let files: Vec<_> = files
        .iter()
        .map(|f| json!({"path": f.path, "bytes": f.bytes, "url": artifact_url(&run_id, &f.path)}))
        .collect();
    Ok(HttpResponse::Ok().json(json!({"run_id": run_id.as_str(), "files": files})))
}

/// `GET /api/code/artifacts/{runId}/{path}`: always an attachment.
pub async fn download(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, PlainError> {
    let (run_id, path) = params.into_inner();
    on_this_replica(&run_id)?;
    let store = store(&state)?.clone();
    let name = path.rsplit('/').next().unwrap_or("file").to_string();
    let (file, len) = store.open(&run_id, &path).await.map_err(|err| ApiError::NotFound(err.to_string()))?;
    // Streamed a chunk at a time, so a download holds one chunk of memory
    // however large the file and however many are in flight.
    let reader = tokio::fs::File::from_std(file).take(len);
    let chunks = futures_util::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut chunk = vec![0u8; DOWNLOAD_CHUNK_BYTES];
        match reader.read(&mut chunk).await {
            Ok(0) => None,
            Ok(n) => {
                chunk.truncate(n);
                Some((Ok(web::Bytes::from(chunk)), Some(reader)))
            }
            Err(err) => Some((Err(err), None)),
        }
    });
    // An ASCII fallback and the exact UTF-8 name (RFC 6266), so no name
    // can make the header invalid.
    let ascii: String = name
        .chars()
        .map(|c| if (c.is_ascii_graphic() && c != '"' && c != '\\') || c == ' ' { c } else { '_' })
        .collect();
    let disposition = ContentDisposition {
        disposition: DispositionType::Attachment,
        parameters: vec![
            DispositionParam::Filename(ascii),
            DispositionParam::FilenameExt(header::ExtendedValue {
                charset: header::Charset::Ext("UTF-8".into()),
                language_tag: None,
                value: name.into_bytes(),
            }),
        ],
    };
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        // Produced files are untrusted: download them, never render them.
        .insert_header((header::CONTENT_DISPOSITION, disposition))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(SizedStream::new(len, chunks)))
}
