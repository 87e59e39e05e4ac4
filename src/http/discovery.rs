//! `/.well-known/agent-skills/`: the skills this server publishes
//! (`--skills-publish`), as the discovery draft's index and one ZIP archive
//! per skill. Open to every caller, like any published file: the operator
//! chose what is listed, and nothing else is reachable here.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use skillhost_actors::skills::discovery::{entry, Index, Packed, SCHEMA};
use skillhost_actors::skills::{Origin, Skill};
use skillhost_actors::SkillsHandle;

use crate::http::error::{ApiError, PlainError};
use crate::http::AppState;

/// The registry, when it publishes anything; a 404 otherwise, so a server
/// that publishes nothing looks like one without the route.
fn publishing(state: &AppState) -> Result<&SkillsHandle, ApiError> {
    state
        .server
        .skills()
        .filter(|skills| skills.publish.is_on())
        .ok_or_else(|| ApiError::NotFound("this server publishes no skills (--skills-publish)".into()))
}

/// Whether `skill` is listed: named by `--skills-publish`, and the
/// registry's own (a request's skills never reach the registry anyway).
fn published(skills: &SkillsHandle, skill: &Skill) -> bool {
    skills.publish.includes(skill.id()) && skill.origin != Origin::Request
}

async fn pack(skills: &SkillsHandle, skill: Arc<Skill>) -> Result<Arc<Packed>, ApiError> {
    let packs = Arc::clone(&skills.packs);
    web::block(move || packs.get(&skill))
        .await
        .map_err(|err| ApiError::Internal(format!("the archive could not be packed: {err}")))?
        .map_err(ApiError::Internal)
}

/// `GET /.well-known/agent-skills/index.json`
pub async fn index(state: web::Data<AppState>) -> Result<HttpResponse, PlainError> {
    let skills = publishing(&state)?;
    let snapshot = skills.snapshot();
    let mut entries = Vec::new();
    for skill in snapshot.skills.values().filter(|s| published(skills, s)) {
        let packed = pack(skills, Arc::clone(skill)).await?;
        entries.push(entry(skill, &packed));
    }
    let index = Index { schema: Some(SCHEMA.to_string()), skills: entries };
    // A reader compares digests; it must not be handed a stale list.
    Ok(HttpResponse::Ok().insert_header((header::CACHE_CONTROL, "no-cache")).json(index))
}

/// `GET /.well-known/agent-skills/{name}.zip`
pub async fn archive(state: web::Data<AppState>, file: web::Path<String>) -> Result<HttpResponse, PlainError> {
    let skills = publishing(&state)?;
    let not_listed = || ApiError::NotFound(format!("'{file}' is not an archive this server publishes"));
    let name = file.strip_suffix(".zip").ok_or_else(not_listed)?;
    let snapshot = skills.snapshot();
    let skill = snapshot.get(name).filter(|s| published(skills, s)).cloned().ok_or_else(not_listed)?;
    let packed = pack(skills, skill).await?;
    Ok(HttpResponse::Ok()
        .content_type("application/zip")
        .insert_header((header::ETAG, format!("\"{}\"", packed.digest)))
        .insert_header((header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}.zip\"")))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(packed.zip.clone()))
}
