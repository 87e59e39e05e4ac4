//! Operations routes: `/health`, `/metrics`, `/v1/models`, and the fallbacks
//! for unknown routes and methods.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;
use skillhost_actors::ModelStatus;

use crate::http::chat::ready_model;
use crate::http::error::{ApiError, ErrorStyle, OpenAiError};
use crate::http::AppState;

/// `GET /health`: 200 once the model serves, 503 while it loads or after it failed.
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    match state.server.status() {
        ModelStatus::Ready { .. } => HttpResponse::Ok().json(json!({"status": "ok"})),
        ModelStatus::Loading => ApiError::Unavailable("the model is loading".into()).response(ErrorStyle::Plain),
        ModelStatus::Failed(reason) => {
            ApiError::Unavailable(format!("the model failed to load: {reason}")).response(ErrorStyle::Plain)
        }
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let server = &state.server;
    let text =
        state.metrics.render(&server.status(), state.admission.in_flight(), server.conversations().len(), server);
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(text)
}

/// `GET /v1/models`: the loaded model with its context length.
pub async fn models(state: web::Data<AppState>) -> Result<HttpResponse, OpenAiError> {
    let info = ready_model(&state)?;
    let created_at = chrono::DateTime::<chrono::Utc>::from_timestamp(state.started_at as i64, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    // OpenAI's list, with the fields Anthropic's SDK reads as well.
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "has_more": false,
        "first_id": info.id,
        "last_id": info.id,
        "data": [{
            "id": info.id,
            "object": "model",
            "type": "model",
            "display_name": info.id,
            "created_at": created_at,
            "created": state.started_at,
            "owned_by": "skillhost",
            "context_length": info.n_ctx,
            "meta": {
                "n_ctx": info.n_ctx,
                "n_ctx_train": info.n_ctx_train,
                "n_params": info.n_params,
                "size": info.size_bytes,
                "architecture": info.architecture,
                "parallel": info.n_parallel,
            },
        }],
    })))
}

/// The error shape of the path as the router and the gate read it.
fn style_for(request: &HttpRequest) -> ErrorStyle {
    crate::http::access::style_for(request.match_info().as_str())
}

/// Any route that does not exist.
pub async fn not_found(request: HttpRequest) -> HttpResponse {
    let err = ApiError::NotFound(format!("there is no route {} {}", request.method(), request.path()));
    err.response(style_for(&request))
}

/// A known route called with the wrong method.
pub async fn method_not_allowed(request: HttpRequest) -> HttpResponse {
    let err = ApiError::MethodNotAllowed(format!("{} does not accept {}", request.path(), request.method()));
    err.response(style_for(&request))
}
