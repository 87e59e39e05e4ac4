//! Skills management routes in the Web UI's shapes: listings, one skill,
//! its files, rescan, upload, install by URL, versions, rollback and
//! delete. OpenAI's `/v1/skills` is `openai_skills`.

use std::io::Read;

use actix_multipart::Multipart;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::StreamExt;
use serde_json::{json, Value};
use skillhost_actors::path_guard;
use skillhost_actors::skills::fetch;
use skillhost_actors::skills::install::MAX_ARCHIVE_BYTES;
use skillhost_actors::skills::outcomes::{Counts, Outcome};
use skillhost_actors::skills::{Changes, FileKind, Finding, Origin, Severity, Skill, Snapshot};
use skillhost_actors::SkillsHandle;
use tokio::io::AsyncWriteExt;

use crate::http::error::{ApiError, PlainError};
use crate::http::AppState;

/// Largest upload accepted: an archive is never bigger than what it holds,
/// plus room for ZIP headers and the multipart envelope.
pub const MAX_UPLOAD_BYTES: usize = MAX_ARCHIVE_BYTES as usize + 1024 * 1024;

/// Uploads streaming or installing at once; more wait up to [`UPLOAD_WAIT`].
pub const MAX_CONCURRENT_UPLOADS: usize = 2;

/// How long an upload waits for a place before it is refused.
const UPLOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Form fields other than the archive are a word (`overwrite=true`); only
/// this much of one is kept.
const MAX_FORM_FIELD_BYTES: usize = 64;

static UPLOADS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_CONCURRENT_UPLOADS);

fn origin_name(origin: Origin) -> &'static str {
    match origin {
        Origin::Discovered => "discovered",
        Origin::Installed => "installed",
        Origin::Request => "request",
    }
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Script => "script",
        FileKind::Reference => "reference",
        FileKind::Asset => "asset",
        FileKind::Other => "other",
    }
}

/// A skill as clients see it.
pub fn skill_json(skill: &Skill, with_instructions: bool) -> Value {
    let manifest = &skill.manifest;
    let mut object = json!({
        "id": skill.id(),
        "object": "skill",
        "name": manifest.name,
        "description": manifest.description,
        "license": manifest.license,
        "compatibility": manifest.compatibility,
        "metadata": manifest.metadata.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
        "allowed_tools": manifest.allowed_tools,
        // `disable-model-invocation`: never offered to the model unselected.
        "explicit_only": manifest.disable_model_invocation,
        "user_invocable": manifest.user_invocable,
        "argument_hint": manifest.argument_hint,
        "model": manifest.model,
        "extra": manifest.extra.iter().cloned().collect::<serde_json::Map<_, _>>(),
        "files": skill.files.iter().map(|f| json!({"path": f.path, "bytes": f.bytes, "kind": kind_name(f.kind), "text": f.text})).collect::<Vec<_>>(),
        "bytes": skill.bytes,
        "origin": origin_name(skill.origin),
        "warnings": skill.warnings,
        "findings": findings_json(&skill.findings),
        "risk": skill.risk().map(Severity::as_str),
        "modified": DateTime::<Utc>::from(skill.modified).to_rfc3339_opts(SecondsFormat::Secs, true),
    });
    if with_instructions {
        object["instructions"] = json!(manifest.body);
    }
    object
}

/// The scan's findings, as every route shows them.
pub fn findings_json(findings: &[Finding]) -> Value {
    Value::Array(
        findings
            .iter()
            .map(|f| {
                json!({
                    "rule": f.rule,
                    "severity": f.severity.as_str(),
                    "file": f.file,
                    "line": f.line,
                    "message": f.message,
                    "excerpt": f.excerpt,
                })
            })
            .collect(),
    )
}

/// A skill's outcomes by surface, and their totals: how often it was
/// advertised, read and run, and how the turns that used it ended.
fn outcomes_json(state: &AppState, id: &str) -> Value {
    let mut total = Counts::default();
    let mut by_surface = serde_json::Map::new();
    let counts_json = |counts: &Counts| {
        let mut object = json!({
            "advertised": counts.advertised,
            "read": counts.read,
            "run": counts.run,
            "mcp_calls": counts.mcp_calls,
        });
        for outcome in Outcome::ALL {
            object[outcome.as_str()] = json!(counts.outcome(outcome));
        }
        object
    };
    for (surface, counts) in state.server.skill_outcomes().of(id) {
        total.advertised += counts.advertised;
        total.read += counts.read;
        total.run += counts.run;
        total.mcp_calls += counts.mcp_calls;
        for (sum, value) in total.outcomes.iter_mut().zip(counts.outcomes) {
            *sum += value;
        }
        by_surface.insert(surface.as_str().to_string(), counts_json(&counts));
    }
    let mut object = counts_json(&total);
    object["by_surface"] = Value::Object(by_surface);
    object
}

/// A skill as the `/api` routes show it: with its outcomes, and whether
/// the operator selected it for every request (`--skill`).
fn api_skill_json(state: &AppState, skills: &SkillsHandle, skill: &Skill, with_instructions: bool) -> Value {
    let mut object = skill_json(skill, with_instructions);
    object["outcomes"] = outcomes_json(state, skill.id());
    object["selected_by_default"] = json!(skills.selected.iter().any(|id| id == skill.id()));
    object
}

fn errors_json(snapshot: &Snapshot) -> Value {
    Value::Array(
        snapshot.errors.iter().map(|e| json!({"path": e.path.display().to_string(), "message": e.message})).collect(),
    )
}

fn changes_json(changes: &Changes) -> Value {
    json!({"added": changes.added, "removed": changes.removed, "changed": changes.changed})
}

/// The registry, or a 403 when skills are off.
pub(crate) fn registry(state: &AppState) -> Result<&SkillsHandle, ApiError> {
    state
        .server
        .skills()
        .ok_or_else(|| ApiError::Forbidden("skills are turned off on this server (--no-skills)".into()))
}

pub(crate) fn lookup(snapshot: &Snapshot, id: &str) -> Result<std::sync::Arc<Skill>, ApiError> {
    snapshot.get(id).cloned().ok_or_else(|| {
        let ids = snapshot.ids();
        let available =
            if ids.is_empty() { "none are installed".to_string() } else { format!("available: {}", ids.join(", ")) };
        ApiError::NotFound(format!("no skill named '{id}' is registered; {available}"))
    })
}

/// `GET /api/skills`
pub async fn api_list(state: web::Data<AppState>) -> HttpResponse {
    match state.server.skills() {
        Some(skills) => {
            let snapshot = skills.snapshot();
            HttpResponse::Ok().json(json!({
                "enabled": true,
                "installable": skills.installable,
                "skills": snapshot.skills.values().map(|s| api_skill_json(&state, skills, s, false)).collect::<Vec<_>>(),
                "errors": errors_json(&snapshot),
            }))
        }
        None => HttpResponse::Ok().json(json!({"enabled": false, "installable": false, "skills": [], "errors": []})),
    }
}

/// `GET /api/skills/{id}`
pub async fn api_get(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, PlainError> {
    let skills = registry(&state)?;
    let skill = lookup(&skills.snapshot(), &id)?;
    Ok(HttpResponse::Ok().json(api_skill_json(&state, skills, &skill, true)))
}

/// `GET /api/skills/{id}/files/{path}`: one file, through the path guard.
pub async fn api_file(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, PlainError> {
    let (id, path) = params.into_inner();
    let skill = lookup(&registry(&state)?.snapshot(), &id)?;
    let root = skill.root.clone();
    let requested = path.clone();
    let read = web::block(move || -> Result<(Vec<u8>, String), path_guard::PathError> {
        let opened = path_guard::open_file(&root, &requested)?;
        let mut bytes = Vec::with_capacity(opened.len as usize);
        let relative = opened.relative.clone();
        opened
            .file
            .take(opened.len)
            .read_to_end(&mut bytes)
            .map_err(|err| path_guard::PathError::Io { path: requested.clone(), error: err.to_string() })?;
        Ok((bytes, relative))
    })
    .await
    .map_err(|err| ApiError::Internal(format!("the file could not be read: {err}")))?;
    let (bytes, relative) = read.map_err(|err| match err {
        path_guard::PathError::NotFound { .. } => ApiError::NotFound(format!("{err} '{id}'")),
        path_guard::PathError::Io { .. } => ApiError::Internal(err.to_string()),
        other => ApiError::Forbidden(other.to_string()),
    })?;
    let text = relative == "SKILL.md" || skill.files.iter().any(|f| f.path == relative && f.text);
    let mut response = HttpResponse::Ok();
    // Skill files are untrusted: never let a browser guess a type and run it.
    response.insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"));
    if text {
        response.content_type("text/plain; charset=utf-8");
    } else {
        let file_name = relative.rsplit('/').next().unwrap_or("file").replace('"', "");
        response
            .content_type("application/octet-stream")
            .insert_header((header::CONTENT_DISPOSITION, format!("attachment; filename=\"{file_name}\"")));
    }
    Ok(response.body(bytes))
}

/// `POST /api/skills/rescan`
pub async fn api_rescan(state: web::Data<AppState>) -> Result<HttpResponse, PlainError> {
    let skills = registry(&state)?;
    let changes = skills.rescan().await.map_err(ApiError::from)?;
    let snapshot = skills.snapshot();
    Ok(HttpResponse::Ok().json(json!({
        "skills": snapshot.skills.values().map(|s| skill_json(s, false)).collect::<Vec<_>>(),
        "errors": errors_json(&snapshot),
        "changes": changes_json(&changes),
    })))
}

/// `POST /api/skills`: multipart with the archive in `file` and an optional
/// `overwrite` field (or `?overwrite=true`).
pub async fn api_install(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, PlainError> {
    let skills = registry(&state)?;
    if !skills.installable {
        return Err(ApiError::Forbidden("this server has no skills install folder, so uploads are off".into()).into());
    }
    let query = web::Query::<std::collections::HashMap<String, String>>::from_query(request.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let mut overwrite = query.get("overwrite").is_some_and(|v| is_true(v));
    let declared = crate::http::body::content_length(&request);
    if declared.is_some_and(|n| n > MAX_UPLOAD_BYTES) {
        return Err(too_large().into());
    }
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !content_type.starts_with("multipart/form-data") {
        return Err(ApiError::bad_request(
            "send the archive as multipart/form-data with the ZIP in a field named 'file'",
        )
        .into());
    }
    // Each upload holds a place while it streams and installs.
    let _place = upload_place().await?;
    let mut multipart = Multipart::new(request.headers(), payload);
    // The archive streams to a file chunk by chunk: a 250 MB upload costs
    // the server one chunk of memory, not 250 MB.
    let mut archive: Option<tempfile::NamedTempFile> = None;
    let mut received = 0usize;
    while let Some(field) = multipart.next().await {
        let mut field =
            field.map_err(|err| ApiError::bad_request(format!("the upload is not valid multipart data: {err}")))?;
        let name = field.name().unwrap_or_default().to_string();
        match name.as_str() {
            "file" => {
                let staged = skills.upload_file().map_err(ApiError::from)?;
                let mut file = tokio::fs::File::from_std(
                    staged.reopen().map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?,
                );
                while let Some(chunk) = next_chunk(&mut field, &mut received).await? {
                    file.write_all(&chunk)
                        .await
                        .map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?;
                }
                file.flush().await.map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?;
                archive = Some(staged);
            }
            other => {
                // Small form fields only: anything else is read and bounded, not kept.
                let mut value = Vec::new();
                while let Some(chunk) = next_chunk(&mut field, &mut received).await? {
                    if value.len() < MAX_FORM_FIELD_BYTES {
                        value.extend_from_slice(&chunk[..chunk.len().min(MAX_FORM_FIELD_BYTES - value.len())]);
                    }
                }
                if other == "overwrite" {
                    overwrite = is_true(&String::from_utf8_lossy(&value));
                }
            }
        }
    }
    let archive =
        archive.ok_or_else(|| ApiError::bad_request("the upload has no field named 'file' holding the ZIP archive"))?;
    let file = archive.reopen().map_err(|err| ApiError::Internal(format!("cannot read the staged upload: {err}")))?;
    // `archive` (the staged file) is removed when this handler returns.
    let id = skills.install(file, overwrite).await.map_err(ApiError::from)?;
    let snapshot = skills.snapshot();
    let skill = lookup(&snapshot, &id)?;
    Ok(HttpResponse::Created().json(skill_json(&skill, false)))
}

/// The body of `POST /api/skills/install`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct InstallByUrl {
    /// An archive on a host `--skills-install-domains` allows.
    url: String,
    /// Its digest: 64 hex digits, with or without `sha256:`.
    sha256: String,
    #[serde(default)]
    overwrite: bool,
}

/// `POST /api/skills/install` (admin): fetches a ZIP archive by URL, checks
/// its digest before anything is unpacked, then installs it as an upload
/// (the same ZIP guards, scan and install policy).
pub async fn api_install_url(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, PlainError> {
    let body: InstallByUrl = crate::http::body::read_json(&request, payload).await?;
    let skills = registry(&state)?;
    if !skills.installable {
        return Err(ApiError::Forbidden("this server has no skills install folder, so installs are off".into()).into());
    }
    let sha256 = fetch::parse_sha256(&body.sha256).map_err(|err| ApiError::bad_param("sha256", err.to_string()))?;
    let _place = upload_place().await?;
    let staged = skills.upload_file().map_err(ApiError::from)?;
    let reopen = || staged.reopen().map_err(|err| ApiError::Internal(format!("cannot stage the download: {err}")));
    let mut file = tokio::fs::File::from_std(reopen()?);
    let fetched = fetch::fetch_verified(&body.url, &sha256, &skills.install_domains, MAX_ARCHIVE_BYTES, &mut file)
        .await
        .map_err(ApiError::from)?;
    drop(file);
    // `staged` (the download) is removed when this handler returns.
    let id = skills.install(reopen()?, body.overwrite).await.map_err(ApiError::from)?;
    let skill = lookup(&skills.snapshot(), &id)?;
    let mut object = skill_json(&skill, false);
    object["source"] =
        json!({"url": fetched.url.as_str(), "digest": format!("sha256:{}", fetched.sha256), "bytes": fetched.bytes});
    Ok(HttpResponse::Created().json(object))
}

/// A place among the [`MAX_CONCURRENT_UPLOADS`] installs streaming at once;
/// past the cap one waits a while, then is refused.
pub(crate) async fn upload_place() -> Result<tokio::sync::SemaphorePermit<'static>, ApiError> {
    match tokio::time::timeout(UPLOAD_WAIT, UPLOADS.acquire()).await {
        Ok(Ok(place)) => Ok(place),
        _ => Err(ApiError::Overloaded(format!(
            "{MAX_CONCURRENT_UPLOADS} uploads are already in progress; retry shortly"
        ))),
    }
}

/// The next chunk of a form field, counting every byte of the upload
/// against [`MAX_UPLOAD_BYTES`].
pub(crate) async fn next_chunk(
    field: &mut actix_multipart::Field,
    received: &mut usize,
) -> Result<Option<web::Bytes>, ApiError> {
    let Some(chunk) = field.next().await else { return Ok(None) };
    let chunk = chunk.map_err(|err| ApiError::bad_request(format!("the upload could not be read: {err}")))?;
    *received += chunk.len();
    if *received > MAX_UPLOAD_BYTES {
        return Err(too_large());
    }
    Ok(Some(chunk))
}

pub(crate) fn too_large() -> ApiError {
    ApiError::PayloadTooLarge(format!("the upload is larger than the limit of {MAX_UPLOAD_BYTES} bytes"))
}

fn is_true(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on")
}

/// `GET /api/skills/{id}/versions`: an installed skill's versions, the
/// newest first, and which one is live.
pub async fn api_versions(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, PlainError> {
    let history = registry(&state)?.versions(&id).map_err(ApiError::from)?;
    let versions: Vec<Value> = history
        .versions
        .iter()
        .map(|v| {
            json!({
                "version": v.version,
                "digest": v.digest,
                "installed_at": timestamp(v.installed_at),
                "bytes": v.bytes,
                "current": Some(v.version) == history.current,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"id": id.into_inner(), "current": history.current, "versions": versions})))
}

/// The body of `POST /api/skills/{id}/rollback`: `{}` for the version
/// before the live one, or the version to go back to.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackRequest {
    version: Option<u32>,
}

/// `POST /api/skills/{id}/rollback` (admin): makes an earlier version live.
/// Turns already running keep the version they started with.
pub async fn api_rollback(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
    id: web::Path<String>,
) -> Result<HttpResponse, PlainError> {
    let body: RollbackRequest = crate::http::body::read_json(&request, payload).await?;
    let version = registry(&state)?.rollback(&id, body.version).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Ok().json(json!({"id": id.into_inner(), "current": version})))
}

pub(crate) fn timestamp(unix: u64) -> String {
    DateTime::<Utc>::from_timestamp(unix as i64, 0).unwrap_or_default().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `DELETE /api/skills/{id}`
pub async fn api_delete(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, PlainError> {
    let skills = registry(&state)?;
    skills.delete(&id).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Ok().json(json!({"removed": true})))
}
