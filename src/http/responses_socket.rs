//! The WebSocket mode of `/v1/responses`: one connection, many turns. The
//! client sends `{"type": "response.create", ...}` with the fields of a
//! `POST /v1/responses` body; the server answers with the same events a
//! stream has, each a text message of its JSON, then waits for the next.
//! A turn continues another with `previous_response_id`, as over HTTP.
//! Turns on one socket run one at a time, each holding an admission place
//! while it runs; a client that closes the socket stops its turn.

use actix_web::{web, HttpRequest, HttpResponse};
use actix_ws::Message;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::http::error::ApiError;
use crate::http::AppState;

/// `GET /v1/responses` with `Upgrade: websocket`.
pub async fn socket(
    state: web::Data<AppState>,
    request: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let (response, mut session, mut messages) = actix_ws::handle(&request, body)?;
    actix_web::rt::spawn(async move {
        while let Some(Ok(message)) = messages.next().await {
            let open = match message {
                Message::Text(text) => turn(&state, &request, &mut session, text.as_bytes()).await,
                Message::Binary(bytes) => turn(&state, &request, &mut session, &bytes).await,
                Message::Ping(bytes) => session.pong(&bytes).await.is_ok(),
                Message::Close(_) => false,
                _ => true,
            };
            if !open {
                break;
            }
        }
        let _ = session.close(None).await;
    });
    Ok(response)
}

/// The `error` event for a client event that was refused.
fn error_event(err: &ApiError) -> String {
    json!({"type": "error", "code": err.kind(), "message": err.to_string(), "param": null, "sequence_number": 0})
        .to_string()
}

/// Answers one client event; `false` once the socket is gone.
async fn turn(
    state: &web::Data<AppState>,
    request: &HttpRequest,
    session: &mut actix_ws::Session,
    event: &[u8],
) -> bool {
    let events = match start(state, request, event).await {
        Ok(events) => events,
        Err(err) => return session.text(error_event(&err)).await.is_ok(),
    };
    let (_permit, events) = events;
    futures_util::pin_mut!(events);
    while let Some(frame) = events.next().await {
        let Ok(frame) = frame else { break };
        let text = String::from_utf8_lossy(&frame);
        // Each SSE frame is an `event:` line and a `data:` line; comments
        // (keep-alives) have no place on a socket.
        if let Some(data) = text.lines().find_map(|line| line.strip_prefix("data: ")) {
            if session.text(data.to_string()).await.is_err() {
                return false;
            }
        }
    }
    true
}

type Started = (
    crate::http::access::Permit,
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, actix_web::Error>>>>,
);

async fn start(state: &web::Data<AppState>, request: &HttpRequest, event: &[u8]) -> Result<Started, ApiError> {
    let mut body: Value = crate::http::body::parse_json(event)?;
    let kind = body.as_object_mut().and_then(|fields| fields.remove("type"));
    if kind.as_ref().and_then(Value::as_str) != Some("response.create") {
        return Err(ApiError::bad_param(
            "type",
            format!("a client event's 'type' must be 'response.create', got {}", kind.unwrap_or(Value::Null)),
        ));
    }
    // The socket streams every turn: `stream` says nothing here.
    if let Some(fields) = body.as_object_mut() {
        fields.remove("stream");
    }
    let wire = crate::http::body::parse_json(body.to_string().as_bytes())?;
    let permit = state.admission.admit()?;
    let events = crate::http::responses::socket_turn(state, request, wire).await?;
    Ok((permit, Box::pin(events)))
}
