//! The operator's MCP servers as the operator sees them: `GET /api/mcp`
//! lists each with its state, its tools (and those left out, with why),
//! its resources and its prompts. `?start=true` starts idle servers first,
//! as `skillhost mcp list` does.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use crate::http::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    start: bool,
}

/// `GET /api/mcp`.
pub async fn api_list(state: web::Data<AppState>, query: web::Query<ListQuery>) -> HttpResponse {
    let servers = match state.server.mcp() {
        Some(hub) => hub.report(query.start).await,
        None => Vec::new(),
    };
    HttpResponse::Ok().json(json!({ "servers": servers }))
}
