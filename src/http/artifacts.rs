//! Artifact downloads: files a request's commands produced.

use std::io::Read;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::http::error::{ApiError, PlainError};
use crate::http::AppState;

fn store(state: &AppState) -> Result<&skillhost_actors::artifacts::Artifacts, ApiError> {
    state
        .server
        .artifacts()
        .ok_or_else(|| ApiError::NotFound("this server runs no code, so it keeps no artifacts".into()))
}

/// The URL a file of a run is downloaded from.
pub fn artifact_url(run_id: &str, path: &str) -> String {
    format!("/api/code/artifacts/{run_id}/{path}")
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
    let file_name = path.rsplit('/').next().unwrap_or("file").replace(['"', '\\'], "");
    let (file, len) = store.open(&run_id, &path).await.map_err(ApiError::NotFound)?;
    let bytes = web::block(move || -> Result<Vec<u8>, String> {
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(len).read_to_end(&mut bytes).map_err(|err| err.to_string())?;
        Ok(bytes)
    })
    .await
    .map_err(|err| ApiError::Internal(err.to_string()))?
    .map_err(ApiError::NotFound)?;
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        // Produced files are untrusted: download them, never render them.
        .insert_header((header::CONTENT_DISPOSITION, format!("attachment; filename=\"{file_name}\"")))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(bytes))
}
