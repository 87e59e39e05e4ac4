//! Operations routes: `/health`, `/metrics`, `/v1/models`, and the fallbacks
//! for unknown routes and methods.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;
use skillhost_actors::{ModelStatus, ModelView};

use crate::http::error::{ApiError, ErrorStyle, OpenAiError, PlainError};
use crate::http::AppState;

/// `GET /health`: 200 once the model serves, 503 while it loads or after it failed.
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    match state.server.status() {
        ModelStatus::Ready { .. } => HttpResponse::Ok().json(json!({"status": "ok"})),
        // Unloaded after --model-idle-unload: the next request loads it.
        ModelStatus::Unloaded => HttpResponse::Ok().json(json!({"status": "ok"})),
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

/// `GET /v1/models`: every configured model, the default first; a loaded
/// one with its context length and facts. Listing never loads a model.
pub async fn models(state: web::Data<AppState>) -> Result<HttpResponse, OpenAiError> {
    let created_at = chrono::DateTime::<chrono::Utc>::from_timestamp(state.started_at as i64, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let view = state.server.models();
    let data: Vec<_> = view
        .models
        .iter()
        .map(|model| {
            let id = model_id(model);
            // OpenAI's entry, with the fields Anthropic's SDK reads as well.
            let mut entry = json!({
                "id": id,
                "object": "model",
                "type": "model",
                "display_name": id,
                "created_at": created_at,
                "created": state.started_at,
                "owned_by": "skillhost",
                "loaded": matches!(model.status, ModelStatus::Ready { .. }),
                "status": status_word(&model.status),
                "size": model.bytes,
            });
            // How far a load has read the weights, 0 to 1, live.
            if matches!(model.status, ModelStatus::Loading) {
                entry["progress"] = crate::http::stream::progress_json(model.progress.get());
            }
            if let ModelStatus::Ready { info, .. } = &model.status {
                entry["context_length"] = json!(info.n_ctx);
                entry["meta"] = json!({
                    "n_ctx": info.n_ctx,
                    "n_ctx_train": info.n_ctx_train,
                    "n_params": info.n_params,
                    "size": info.size_bytes,
                    "kv_size": info.kv_bytes,
                    "architecture": info.architecture,
                    "parallel": info.n_parallel,
                    "embedding": info.embedding,
                    "n_embd": info.n_embd,
                });
            }
            entry
        })
        .collect();
    let first = data.first().map(|m| m["id"].clone()).unwrap_or_default();
    let last = data.last().map(|m| m["id"].clone()).unwrap_or_default();
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "has_more": false,
        "first_id": first,
        "last_id": last,
        "data": data,
    })))
}

/// A model's name as requests use it: the id it reports once loaded (an
/// upstream's model), the configured name before.
pub fn model_id(model: &ModelView) -> String {
    match &model.status {
        ModelStatus::Ready { info, .. } => info.id.clone(),
        _ => model.name.clone(),
    }
}

/// One word for a model's state, as the listings show it.
pub fn status_word(status: &ModelStatus) -> &'static str {
    match status {
        ModelStatus::Unloaded => "unloaded",
        ModelStatus::Loading => "loading",
        ModelStatus::Ready { .. } => "loaded",
        ModelStatus::Failed(_) => "failed",
    }
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

/// `POST /api/models/{name}/load` (admin): loads the model now, making room
/// by the same rule as a request would, and answers once it is ready.
pub async fn load_model(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, PlainError> {
    let backend = state.server.load_model(&name).await.map_err(ApiError::from)?;
    let info = backend.info();
    Ok(HttpResponse::Ok().json(json!({"model": info.id, "loaded": true, "status": "ready"})))
}

/// `POST /api/models/{name}/unload` (admin): unloads the model now; a
/// model with running turns is a 409. Unloading one that is not loaded
/// changes nothing.
pub async fn unload_model(state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, PlainError> {
    state.server.unload_model(&name).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Ok().json(json!({"model": name.into_inner(), "loaded": false, "status": "unloaded"})))
}
