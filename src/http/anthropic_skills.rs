//! Anthropic's Skills API (beta) over the registry, on the same
//! `/v1/skills` paths as OpenAI's: a request that carries an
//! `anthropic-version` or `anthropic-beta` header is answered in
//! Anthropic's shapes, so the official SDK's `client.beta.skills` works
//! unchanged: create (a folder's files, or one ZIP), list (`next_page`
//! tokens, `source` filter), retrieve, delete, and versions with their
//! content.
//!
//! How our model maps onto Anthropic's:
//! - a skill's id is its name, and so is its `display_name`: a create that
//!   sends another `display_name` than the SKILL.md's `name` is refused;
//! - version ids are this server's version numbers (`"1"`, `"2"`, …), and
//!   `latest_version_id` is the version that runs (after a rollback, not
//!   the newest); skills from the operator's folders have no versions and
//!   say `latest`;
//! - skills installed through an API are `custom`; skills from the
//!   operator's folders are shared and read-only, as Anthropic's own are,
//!   and list as `anthropic`;
//! - one version cannot be deleted alone (a 400 says why), and deleting a
//!   skill removes every version at once.

use std::collections::BTreeMap;

use actix_web::{guard, web, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use skillhost_actors::skills::versions::{History, Version};
use skillhost_actors::skills::{Origin, Skill};
use skillhost_actors::SkillsHandle;

use crate::http::error::{AnthropicError, ApiError};
use crate::http::openai_skills::{
    find_version, install_upload, newest, one_version_alone, version_description, version_zip, Upload,
};
use crate::http::skills::{lookup, registry, timestamp};
use crate::http::AppState;

/// Most items one page of a list holds (`limit`), as Anthropic documents.
pub const MAX_PAGE_ITEMS: usize = 1000;
const DEFAULT_PAGE_ITEMS: usize = 20;

/// The route guard: the request speaks Anthropic's dialect. Every
/// Anthropic SDK request carries `anthropic-version`; a hand-written one
/// may carry only the beta header.
pub fn dialect() -> impl guard::Guard {
    guard::fn_guard(|ctx| {
        let headers = ctx.head().headers();
        headers.contains_key("anthropic-version") || headers.contains_key("anthropic-beta")
    })
}

/// Where a skill comes from, in Anthropic's words.
fn source(skill: &Skill) -> &'static str {
    match skill.origin {
        Origin::Installed | Origin::Request => "custom",
        Origin::Discovered => "anthropic",
    }
}

/// A skill in Anthropic's shape.
fn skill_json(skills: &SkillsHandle, skill: &Skill) -> Value {
    let history = match skill.origin {
        Origin::Installed => skills.versions(skill.id()).unwrap_or_default(),
        Origin::Discovered | Origin::Request => History::default(),
    };
    let modified = skill.modified.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let installed = history.versions.iter().map(|v| v.installed_at);
    json!({
        "id": skill.id(),
        "type": "skill",
        "display_name": skill.id(),
        "source": {"type": source(skill)},
        "latest_version_id": history.current.map_or_else(|| "latest".to_string(), |v| v.to_string()),
        "created_at": timestamp(installed.clone().min().unwrap_or(modified)),
        "updated_at": timestamp(installed.max().unwrap_or(modified)),
    })
}

/// One version in Anthropic's shape; its description is read from that
/// version's own SKILL.md.
fn version_json(skills: &SkillsHandle, id: &str, version: &Version) -> Value {
    let description = version_description(id, skills.version_folder(id, version.version).ok());
    json!({
        "id": version.version.to_string(),
        "type": "skill_version",
        "skill_id": id,
        "name": id,
        "version": version.version.to_string(),
        "description": description,
        "created_at": timestamp(version.installed_at),
    })
}

/// `limit`, `page` and `source` of a list request (`beta` is the SDK's
/// marker of a beta route).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    limit: Option<usize>,
    page: Option<String>,
    source: Option<String>,
    #[serde(rename = "beta")]
    _beta: Option<String>,
}

fn page_query(request: &HttpRequest) -> Result<PageQuery, ApiError> {
    let query = web::Query::<PageQuery>::from_query(request.query_string())
        .map_err(|err| ApiError::bad_request(format!("the query is not understood: {err}")))?
        .into_inner();
    if let Some(limit) = query.limit.filter(|limit| !(1..=MAX_PAGE_ITEMS).contains(limit)) {
        return Err(ApiError::bad_param("limit", format!("limit must be between 1 and {MAX_PAGE_ITEMS}, got {limit}")));
    }
    Ok(query)
}

/// One page of `items` (in ascending order of their keys). The token of the
/// next page is the key of this page's last item.
fn page(query: &PageQuery, items: Vec<(String, Value)>) -> Result<Value, ApiError> {
    let start = match query.page.as_deref().filter(|token| !token.is_empty()) {
        Some(token) => items.iter().position(|(key, _)| key == token).map(|at| at + 1).ok_or_else(|| {
            ApiError::bad_param(
                "page",
                format!("'{token}' is not a page token of this list; send a next_page you were given"),
            )
        })?,
        None => 0,
    };
    let rest = &items[start.min(items.len())..];
    let limit = query.limit.unwrap_or(DEFAULT_PAGE_ITEMS);
    let shown = &rest[..limit.min(rest.len())];
    let more = rest.len() > shown.len();
    Ok(json!({
        "data": shown.iter().map(|(_, value)| value.clone()).collect::<Vec<_>>(),
        "has_more": more,
        "next_page": shown.last().filter(|_| more).map(|(key, _)| key.clone()),
    }))
}

/// `GET /v1/skills`: every registered skill, by id; `source` keeps only
/// `custom` or only `anthropic` ones.
pub async fn list(state: web::Data<AppState>, request: HttpRequest) -> Result<HttpResponse, AnthropicError> {
    let query = page_query(&request)?;
    let wanted = match query.source.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(kept @ ("custom" | "anthropic")) => Some(kept),
        Some(other) => {
            return Err(
                ApiError::bad_param("source", format!("source must be 'custom' or 'anthropic', got '{other}'")).into()
            )
        }
    };
    let items = match state.server.skills() {
        Some(skills) => skills
            .snapshot()
            .skills
            .values()
            .filter(|skill| wanted.is_none_or(|wanted| source(skill) == wanted))
            .map(|skill| (skill.id().to_string(), skill_json(skills, skill)))
            .collect(),
        None => Vec::new(),
    };
    Ok(HttpResponse::Ok().json(page(&query, items)?))
}

/// `GET /v1/skills/{id}`
pub async fn retrieve(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, AnthropicError> {
    let skills = registry(&state)?;
    let skill = lookup(&skills.snapshot(), &id)?;
    Ok(HttpResponse::Ok().json(skill_json(skills, &skill)))
}

/// `POST /v1/skills`: a new skill. A `display_name` must be the SKILL.md's
/// `name`, since that is the skill's only name here.
pub async fn create(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AnthropicError> {
    let skills = registry(&state)?;
    let display_name =
        |fields: &BTreeMap<String, String>| Ok(fields.get("display_name").filter(|n| !n.is_empty()).cloned());
    let id = install_upload(skills, &request, payload, Upload::Skill, &["display_name"], display_name).await?;
    let skill = lookup(&skills.snapshot(), &id)?;
    Ok(HttpResponse::Ok().json(skill_json(skills, &skill)))
}

/// `DELETE /v1/skills/{id}`: the skill with every version.
pub async fn delete(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, AnthropicError> {
    registry(&state)?.delete(&id).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Ok().json(json!({"id": id.into_inner(), "type": "skill_deleted"})))
}

/// `GET /v1/skills/{id}/versions`, oldest first.
pub async fn versions(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, AnthropicError> {
    let query = page_query(&request)?;
    if query.source.is_some() {
        return Err(ApiError::bad_param("source", "'source' filters skills, not versions").into());
    }
    let skills = registry(&state)?;
    let mut history = skills.versions(&id).map_err(ApiError::from)?.versions;
    history.sort_by_key(|v| v.version);
    let items = history.iter().map(|v| (v.version.to_string(), version_json(skills, &id, v))).collect();
    Ok(HttpResponse::Ok().json(page(&query, items)?))
}

/// `POST /v1/skills/{id}/versions`: a new version, which is the one that
/// runs from now on.
pub async fn create_version(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
    id: web::Path<String>,
) -> Result<HttpResponse, AnthropicError> {
    let skills = registry(&state)?;
    install_upload(skills, &request, payload, Upload::VersionOf(&id), &[], |_| Ok(None)).await?;
    Ok(HttpResponse::Ok().json(version_json(skills, &id, &newest(skills, &id)?)))
}

/// `GET /v1/skills/{id}/versions/{version}`
pub async fn retrieve_version(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, AnthropicError> {
    let (id, version) = params.into_inner();
    let skills = registry(&state)?;
    let found = find_version(skills, &id, &version)?;
    Ok(HttpResponse::Ok().json(version_json(skills, &id, &found)))
}

/// `DELETE /v1/skills/{id}/versions/{version}`: not offered; says why.
pub async fn delete_version(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, AnthropicError> {
    let (id, version) = params.into_inner();
    find_version(registry(&state)?, &id, &version)?;
    Err(one_version_alone(&id).into())
}

/// `GET /v1/skills/{id}/versions/{version}/content`: that version's files
/// as a ZIP.
pub async fn version_content(
    state: web::Data<AppState>,
    params: web::Path<(String, String)>,
) -> Result<HttpResponse, AnthropicError> {
    let (id, version) = params.into_inner();
    Ok(version_zip(&state, &id, &version).await?)
}
