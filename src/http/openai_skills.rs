//! OpenAI's Skills API over the registry, so the official SDK's
//! `client.skills` works unchanged: create (one ZIP or a folder's files),
//! list, retrieve, set the default version, delete, versions and content.
//!
//! Our model differs in three places, each answered with a 400 that says
//! so rather than silently: a skill's id is its name; a new version always
//! becomes the default (`default=false` is refused); and one version cannot
//! be deleted alone (versions past `--skills-keep-versions` leave by
//! themselves). Skills found in the operator's folders are listed with no
//! versions (`default_version` and `latest_version` are null) and cannot be
//! changed here.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use actix_multipart::Multipart;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use serde_json::{json, Value};
use skillhost_actors::skills::discovery::pack;
use skillhost_actors::skills::manifest::parse_manifest;
use skillhost_actors::skills::registry::skip_set;
use skillhost_actors::skills::skill::load_skill;
use skillhost_actors::skills::versions::{History, Version};
use skillhost_actors::skills::{Origin, Skill};
use skillhost_actors::{path_guard, SkillsHandle};
use tokio::io::AsyncWriteExt;

use crate::http::error::{ApiError, OpenAiError};
use crate::http::skills::{lookup, next_chunk, registry, skill_json, too_large, upload_place, MAX_UPLOAD_BYTES};
use crate::http::AppState;

/// Most items one page of a list holds (`limit`), and how many when unsaid.
pub const MAX_PAGE_ITEMS: usize = 100;
const DEFAULT_PAGE_ITEMS: usize = 20;

/// A skill in OpenAI's shape, with everything `/api/skills` says beside it.
pub fn openai_skill_json(skills: &SkillsHandle, skill: &Skill, with_instructions: bool) -> Value {
    let mut object = skill_json(skill, with_instructions);
    let history = match skill.origin {
        Origin::Installed => skills.versions(skill.id()).unwrap_or_default(),
        Origin::Discovered | Origin::Request => History::default(),
    };
    let modified = skill.modified.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    object["created_at"] = json!(history.versions.iter().map(|v| v.installed_at).min().unwrap_or(modified));
    object["default_version"] = json!(history.current.map(|v| v.to_string()));
    object["latest_version"] = json!(history.versions.iter().map(|v| v.version).max().map(|v| v.to_string()));
    object
}

/// `after`, `limit` and `order` of a list request.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    after: Option<String>,
    limit: Option<usize>,
    order: Option<String>,
}

/// One page of `items` (ids in ascending order), as OpenAI's cursor lists.
fn page(request: &HttpRequest, mut items: Vec<(String, Value)>) -> Result<Value, ApiError> {
    let query = web::Query::<PageQuery>::from_query(request.query_string())
        .map_err(|err| ApiError::bad_request(format!("the query is not understood: {err}")))?
        .into_inner();
    let limit = query.limit.unwrap_or(DEFAULT_PAGE_ITEMS);
    if !(1..=MAX_PAGE_ITEMS).contains(&limit) {
        return Err(ApiError::bad_param("limit", format!("limit must be between 1 and {MAX_PAGE_ITEMS}, got {limit}")));
    }
    match query.order.as_deref() {
        None | Some("asc") => {}
        Some("desc") => items.reverse(),
        Some(other) => {
            return Err(ApiError::bad_param("order", format!("order must be 'asc' or 'desc', got '{other}'")))
        }
    }
    let start = match &query.after {
        Some(after) => items
            .iter()
            .position(|(id, _)| id == after)
            .map(|at| at + 1)
            .ok_or_else(|| ApiError::bad_param("after", format!("'{after}' is not an id in this list")))?,
        None => 0,
    };
    let rest = &items[start.min(items.len())..];
    let shown: Vec<&(String, Value)> = rest.iter().take(limit).collect();
    Ok(json!({
        "object": "list",
        "data": shown.iter().map(|(_, value)| value.clone()).collect::<Vec<_>>(),
        "first_id": shown.first().map(|(id, _)| id.clone()),
        "last_id": shown.last().map(|(id, _)| id.clone()),
        "has_more": rest.len() > shown.len(),
    }))
}

/// `GET /v1/skills`: every registered skill, by id.
pub async fn list(state: web::Data<AppState>, request: HttpRequest) -> Result<HttpResponse, OpenAiError> {
    let items = match state.server.skills() {
        Some(skills) => skills
            .snapshot()
            .skills
            .values()
            .map(|s| (s.id().to_string(), openai_skill_json(skills, s, false)))
            .collect(),
        None => Vec::new(),
    };
    Ok(HttpResponse::Ok().json(page(&request, items)?))
}

/// `GET /v1/skills/{id}`
pub async fn retrieve(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, OpenAiError> {
    let skills = registry(&state)?;
    let skill = lookup(&skills.snapshot(), &id)?;
    Ok(HttpResponse::Ok().json(openai_skill_json(skills, &skill, true)))
}

/// What a create carried: its files as one staged ZIP, and the text
/// fields the route accepts besides them.
struct Created {
    archive: tempfile::NamedTempFile,
    fields: BTreeMap<String, String>,
}

/// The longest text field a create takes (`default`, `display_name`);
/// a longer one is refused rather than cut.
pub const MAX_FIELD_BYTES: usize = 1024;

/// Reads the multipart body of a create: `files` holding one ZIP, or
/// `files[]` (or `files`) holding a folder's files, each named by its path
/// in the skill. Either way the result is one staged ZIP, which installs
/// through the same guards as an upload. Text fields other than `fields`
/// are refused by name.
async fn read_files(
    skills: &SkillsHandle,
    request: &HttpRequest,
    payload: web::Payload,
    fields: &[&str],
) -> Result<Created, ApiError> {
    if crate::http::body::content_length(request).is_some_and(|n| n > MAX_UPLOAD_BYTES) {
        return Err(too_large());
    }
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !content_type.starts_with("multipart/form-data") {
        return Err(ApiError::bad_param(
            "files",
            "send the skill as multipart/form-data: one ZIP in 'files', or its files in 'files[]', each named by its path",
        ));
    }
    let staged = skills.upload_file().map_err(ApiError::from)?;
    let io = |err: std::io::Error| ApiError::Internal(format!("cannot stage the upload: {err}"));
    let mut multipart = Multipart::new(request.headers(), payload);
    let mut received = 0usize;
    let mut zip_given = false;
    let mut folder: Option<zip::ZipWriter<std::fs::File>> = None;
    let mut texts = BTreeMap::new();
    while let Some(field) = multipart.next().await {
        let mut field =
            field.map_err(|err| ApiError::bad_request(format!("the upload is not valid multipart data: {err}")))?;
        let name = field.name().unwrap_or_default().to_string();
        match name.as_str() {
            "files" | "files[]" => {
                let filename =
                    field.content_disposition().and_then(|d| d.get_filename()).map(str::to_string).ok_or_else(
                        || ApiError::bad_param("files", "each part of 'files' needs a filename: its path in the skill"),
                    )?;
                let is_zip = filename.to_ascii_lowercase().ends_with(".zip")
                    || field.content_type().is_some_and(|m| m.essence_str() == "application/zip");
                if zip_given || (is_zip && folder.is_some()) {
                    return Err(ApiError::bad_param(
                        "files",
                        "send either one ZIP or the skill's files, not both and not two ZIPs",
                    ));
                }
                if is_zip {
                    zip_given = true;
                    let mut file = tokio::fs::File::from_std(staged.reopen().map_err(io)?);
                    while let Some(chunk) = next_chunk(&mut field, &mut received).await? {
                        file.write_all(&chunk).await.map_err(io)?;
                    }
                    file.flush().await.map_err(io)?;
                } else {
                    let writer = match &mut folder {
                        Some(writer) => writer,
                        None => folder.insert(zip::ZipWriter::new(staged.reopen().map_err(io)?)),
                    };
                    // The path is checked where every archive's paths are:
                    // by the install's guards, when the ZIP is read.
                    let options = zip::write::SimpleFileOptions::default().unix_permissions(0o644);
                    writer
                        .start_file(filename.as_str(), options)
                        .map_err(|err| ApiError::bad_param("files", format!("'{filename}' cannot be added: {err}")))?;
                    while let Some(chunk) = next_chunk(&mut field, &mut received).await? {
                        writer.write_all(&chunk).map_err(io)?;
                    }
                }
            }
            known if fields.contains(&known) => {
                let mut value = Vec::new();
                while let Some(chunk) = next_chunk(&mut field, &mut received).await? {
                    value.extend_from_slice(&chunk);
                    if value.len() > MAX_FIELD_BYTES {
                        return Err(ApiError::bad_param(
                            &name,
                            format!("'{name}' is longer than the limit of {MAX_FIELD_BYTES} bytes"),
                        ));
                    }
                }
                texts.insert(name, String::from_utf8_lossy(&value).trim().to_string());
            }
            other => {
                return Err(ApiError::bad_param(
                    other,
                    format!("'{other}' is not a field of this route; send the skill in 'files'"),
                ))
            }
        }
    }
    if let Some(writer) = folder {
        writer.finish().map_err(|err| ApiError::Internal(format!("cannot stage the upload: {err}")))?;
    } else if !zip_given {
        return Err(ApiError::bad_param("files", "the upload has no 'files': send one ZIP or the skill's files"));
    }
    Ok(Created { archive: staged, fields: texts })
}

fn installable(skills: &SkillsHandle) -> Result<(), ApiError> {
    if skills.installable {
        Ok(())
    } else {
        Err(ApiError::Forbidden("this server has no skills install folder, so uploads are off".into()))
    }
}

/// What an upload makes: a new skill, or a new version of the skill `id`.
#[derive(Clone, Copy)]
pub(crate) enum Upload<'a> {
    Skill,
    VersionOf(&'a str),
}

/// Stages a create's files and installs them through the upload's guards,
/// scan and policy, one upload at a time. `check` judges the text
/// `fields` before anything installs, and may name the skill a new
/// skill's archive must hold. Returns the installed skill's id.
pub(crate) async fn install_upload(
    skills: &SkillsHandle,
    request: &HttpRequest,
    payload: web::Payload,
    upload: Upload<'_>,
    fields: &[&str],
    check: impl FnOnce(&BTreeMap<String, String>) -> Result<Option<String>, ApiError>,
) -> Result<String, ApiError> {
    installable(skills)?;
    if let Upload::VersionOf(id) = upload {
        skills.versions(id).map_err(ApiError::from)?;
    }
    let _place = upload_place().await?;
    let created = read_files(skills, request, payload, fields).await?;
    let named = check(&created.fields)?;
    let file = created.archive.reopen().map_err(|err| ApiError::Internal(format!("cannot read the upload: {err}")))?;
    let (overwrite, name) = match upload {
        Upload::Skill => (false, named),
        Upload::VersionOf(id) => (true, Some(id.to_string())),
    };
    skills.install_as(file, overwrite, name).await.map_err(ApiError::from)
}

/// The version of `id` installed last.
pub(crate) fn newest(skills: &SkillsHandle, id: &str) -> Result<Version, ApiError> {
    let history = skills.versions(id).map_err(ApiError::from)?;
    history.versions.into_iter().next().ok_or_else(|| ApiError::Internal("the new version was not recorded".into()))
}

/// `POST /v1/skills`: a new skill; a name already registered is a 409
/// (a new version of it goes to `POST /v1/skills/{id}/versions`).
pub async fn create(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    let skills = registry(&state)?;
    let id = install_upload(skills, &request, payload, Upload::Skill, &[], |_| Ok(None)).await?;
    let skill = lookup(&skills.snapshot(), &id)?;
    Ok(HttpResponse::Ok().json(openai_skill_json(skills, &skill, false)))
}

/// The body of `POST /v1/skills/{id}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Update {
    default_version: String,
}

fn version_number(id: &str, text: &str) -> Result<u32, ApiError> {
    text.trim().parse::<u32>().map_err(|_| {
        ApiError::bad_param(
            "version",
            format!("'{text}' is not a version of '{id}': versions here are numbers (1, 2, …)"),
        )
    })
}

/// `POST /v1/skills/{id}`: makes `default_version` the live one.
pub async fn update(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let body: Update = crate::http::body::read_json(&request, payload).await?;
    let skills = registry(&state)?;
    let version = version_number(&id, &body.default_version)?;
    skills.rollback(&id, Some(version)).await.map_err(ApiError::from)?;
    let skill = lookup(&skills.snapshot(), &id)?;
    Ok(HttpResponse::Ok().json(openai_skill_json(skills, &skill, false)))
}

/// `DELETE /v1/skills/{id}`
pub async fn delete(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, OpenAiError> {
    registry(&state)?.delete(&id).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Ok().json(json!({"id": id.into_inner(), "object": "skill.deleted", "deleted": true})))
}

/// The description in one version's own SKILL.md, read through the guard.
pub(crate) fn version_description(id: &str, folder: Option<PathBuf>) -> String {
    folder
        .and_then(|folder| path_guard::open_file(&folder, "SKILL.md").ok())
        .and_then(|opened| std::io::read_to_string(opened.file).ok())
        .and_then(|text| parse_manifest(&text, Some(id)).ok())
        .map(|manifest| manifest.description)
        .unwrap_or_default()
}

/// One version in OpenAI's shape.
fn version_json(id: &str, folder: Option<PathBuf>, version: &Version) -> Value {
    let description = version_description(id, folder);
    json!({
        "id": format!("{id}@{}", version.version),
        "object": "skill.version",
        "skill_id": id,
        "version": version.version.to_string(),
        "name": id,
        "description": description,
        "created_at": version.installed_at,
    })
}

/// `GET /v1/skills/{id}/versions`
pub async fn versions(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let skills = registry(&state)?;
    let history = skills.versions(&id).map_err(ApiError::from)?;
    let mut items: Vec<(String, Value)> = history
        .versions
        .iter()
        .map(|v| (v.version.to_string(), version_json(&id, skills.version_folder(&id, v.version).ok(), v)))
        .collect();
    items.sort_by_key(|(version, _)| version.parse::<u32>().unwrap_or(0));
    Ok(HttpResponse::Ok().json(page(&request, items)?))
}

/// `POST /v1/skills/{id}/versions`: a new version, which becomes the default.
pub async fn create_version(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let skills = registry(&state)?;
    let default = |fields: &BTreeMap<String, String>| {
        match fields.get("default").map(String::as_str) {
        None | Some("true" | "1") => Ok(None),
        Some(_) => Err(ApiError::bad_param(
            "default",
            "a new version always becomes the default here; send default=true or leave it out, then POST /v1/skills/{id} with an earlier default_version to go back",
        )),
    }
    };
    install_upload(skills, &request, payload, Upload::VersionOf(&id), &["default"], default).await?;
    let newest = newest(skills, &id)?;
    Ok(HttpResponse::Ok().json(version_json(&id, skills.version_folder(&id, newest.version).ok(), &newest)))
}

/// The recorded version `version` of `id`.
pub(crate) fn find_version(skills: &SkillsHandle, id: &str, version: &str) -> Result<Version, ApiError> {
    let number = version_number(id, version)?;
    let history = skills.versions(id).map_err(ApiError::from)?;
    history
        .versions
        .into_iter()
        .find(|v| v.version == number)
        .ok_or_else(|| ApiError::NotFound(format!("the skill '{id}' has no version {number}")))
}

/// `GET /v1/skills/{id}/versions/{version}`
pub async fn retrieve_version(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, OpenAiError> {
    let (id, version) = params.into_inner();
    let skills = registry(&state)?;
    let found = find_version(skills, &id, &version)?;
    Ok(HttpResponse::Ok().json(version_json(&id, skills.version_folder(&id, found.version).ok(), &found)))
}

/// `DELETE /v1/skills/{id}/versions/{version}`: not offered; says why.
pub async fn delete_version(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, OpenAiError> {
    let (id, version) = params.into_inner();
    find_version(registry(&state)?, &id, &version)?;
    Err(one_version_alone(&id).into())
}

/// Why one version of `id` cannot be deleted.
pub(crate) fn one_version_alone(id: &str) -> ApiError {
    ApiError::bad_request(format!(
        "one version cannot be deleted alone here: versions past --skills-keep-versions leave by themselves, and DELETE /v1/skills/{id} removes the skill with every version"
    ))
}

/// A skill folder as a ZIP download.
async fn zip_response(skill: Arc<Skill>) -> Result<HttpResponse, ApiError> {
    let name = skill.id().to_string();
    let zip = web::block(move || pack(&skill))
        .await
        .map_err(|err| ApiError::Internal(format!("the archive could not be packed: {err}")))?
        .map_err(ApiError::Internal)?;
    Ok(HttpResponse::Ok()
        .content_type("application/zip")
        .insert_header((header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}.zip\"")))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(zip))
}

/// `GET /v1/skills/{id}/content`: the default version's files as a ZIP.
pub async fn content(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, OpenAiError> {
    let skill = lookup(&registry(&state)?.snapshot(), &id)?;
    Ok(zip_response(skill).await?)
}

/// `GET /v1/skills/{id}/versions/{version}/content`
pub async fn version_content(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, OpenAiError> {
    let (id, version) = params.into_inner();
    Ok(version_zip(&state, &id, &version).await?)
}

/// The files of version `version` of `id` as a ZIP download.
pub(crate) async fn version_zip(state: &AppState, id: &str, version: &str) -> Result<HttpResponse, ApiError> {
    let skills = registry(state)?;
    let found = find_version(skills, id, version)?;
    let folder = skills.version_folder(id, found.version).map_err(ApiError::from)?;
    let skill = web::block(move || load_skill(&folder, Origin::Installed, &skip_set()))
        .await
        .map_err(|err| ApiError::Internal(format!("the version could not be read: {err}")))?
        .map_err(|err| ApiError::Internal(format!("the version could not be read: {err}")))?;
    zip_response(Arc::new(skill)).await
}
