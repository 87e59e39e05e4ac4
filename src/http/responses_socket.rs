//! The WebSocket mode of `/v1/responses`: one connection, many turns. The
//! client sends `{"type": "response.create", ...}` with the fields of a
//! `POST /v1/responses` body; the server answers with the same events a
//! stream has, each a text message of its JSON, then waits for the next.
//!
//! A turn continues another with `previous_response_id`. The socket keeps
//! the last response it answered in memory (as OpenAI's WebSocket mode
//! does), so continuing that one needs no store and works with `store:
//! false`; an older one is read from the store. `generate: false` is a
//! warm-up: a response with no output that later turns chain from.
//!
//! Turns on one socket run one at a time, each holding an admission place
//! while it runs; a `response.create` sent meanwhile is refused with an
//! `error` event, and the running turn goes on. Pings are answered during a
//! turn too (clients close a socket whose pings go unanswered), and a
//! client that closes the socket stops its turn.

use actix_web::{web, HttpRequest, HttpResponse};
use actix_ws::{AggregatedMessage, CloseCode, CloseReason};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::http::body::MAX_JSON_BODY_BYTES;
use crate::http::error::ApiError;
use crate::http::responses::{socket_turn, Remembered, SocketTurn};
use crate::http::AppState;

/// `GET /v1/responses` with `Upgrade: websocket`.
pub async fn socket(
    state: web::Data<AppState>,
    request: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let (response, session, messages) = actix_ws::handle(&request, body)?;
    // A client event is a request body: the same bound as over HTTP,
    // whether it comes in one frame or in several (actix-ws would stop at
    // 64 KiB a frame, which a long conversation's input passes).
    let messages = messages
        .max_frame_size(MAX_JSON_BODY_BYTES)
        .aggregate_continuations()
        .max_continuation_size(MAX_JSON_BODY_BYTES);
    let connection = Connection { state, request, session, last: None };
    actix_web::rt::spawn(connection.serve(messages));
    Ok(response)
}

/// One socket: its session and what it remembers.
struct Connection {
    state: web::Data<AppState>,
    request: HttpRequest,
    session: actix_ws::Session,
    /// The last response this socket answered, for the next turn.
    last: Option<Remembered>,
}

/// What the client did while the socket waited.
enum Heard {
    /// A client event to answer.
    Event(Vec<u8>),
    /// A ping, answered; nothing else to do.
    Nothing,
    /// The client closed the socket or broke the protocol.
    Gone,
}

impl Connection {
    async fn serve(mut self, mut messages: actix_ws::AggregatedMessageStream) {
        loop {
            let heard = self.hear(messages.next().await).await;
            let open = match heard {
                Heard::Event(event) => self.turn(&event, &mut messages).await,
                Heard::Nothing => true,
                Heard::Gone => false,
            };
            if !open {
                break;
            }
        }
        let _ = self.session.close(None).await;
    }

    /// Reads one message: pings are answered here, and a message past the
    /// size bound is said before the socket closes.
    async fn hear(&mut self, message: Option<Result<AggregatedMessage, actix_ws::ProtocolError>>) -> Heard {
        match message {
            Some(Ok(AggregatedMessage::Text(text))) => Heard::Event(text.as_bytes().to_vec()),
            Some(Ok(AggregatedMessage::Binary(bytes))) => Heard::Event(bytes.to_vec()),
            Some(Ok(AggregatedMessage::Ping(bytes))) => {
                if self.session.pong(&bytes).await.is_err() {
                    return Heard::Gone;
                }
                Heard::Nothing
            }
            Some(Ok(AggregatedMessage::Pong(_))) => Heard::Nothing,
            Some(Ok(AggregatedMessage::Close(_))) | None => Heard::Gone,
            Some(Err(err)) => {
                // A frame past the bound is `Overflow`; a message of many
                // frames past it is an I/O error that says so.
                let too_large =
                    matches!(err, actix_ws::ProtocolError::Overflow) || err.to_string().contains("continuation size");
                if too_large {
                    let err = ApiError::PayloadTooLarge(format!(
                        "a client event may be at most {MAX_JSON_BODY_BYTES} bytes, as a request body may"
                    ));
                    let _ = self.session.text(error_event(&err)).await;
                    let reason = CloseReason { code: CloseCode::Size, description: Some(err.to_string()) };
                    let _ = self.session.clone().close(Some(reason)).await;
                } else {
                    tracing::debug!("a Responses socket broke the WebSocket protocol: {err}");
                }
                Heard::Gone
            }
        }
    }

    /// Answers one client event; `false` once the socket is gone.
    async fn turn(&mut self, event: &[u8], messages: &mut actix_ws::AggregatedMessageStream) -> bool {
        let started = match self.start(event).await {
            Ok(started) => started,
            Err(err) => {
                // A turn that fails leaves nothing to continue, as OpenAI's
                // socket forgets its response then.
                self.last = None;
                return self.session.text(error_event(&err)).await.is_ok();
            }
        };
        let (_permit, turn) = started;
        let mut so_far = Some(turn.so_far);
        let mut events = turn.events;
        loop {
            tokio::select! {
                frame = events.next() => {
                    let Some(Ok(frame)) = frame else { return true };
                    let text = String::from_utf8_lossy(&frame);
                    // Each SSE frame is an `event:` line and a `data:` line;
                    // comments (keep-alives) have no place on a socket.
                    let Some(data) = text.lines().find_map(|line| line.strip_prefix("data: ")) else { continue };
                    self.remember(data, &mut so_far);
                    if self.session.text(data.to_string()).await.is_err() {
                        return false;
                    }
                }
                message = messages.next() => match self.hear(message).await {
                    Heard::Event(_) => {
                        let busy = ApiError::Conflict(
                            "a response is running on this socket; send the next response.create after its last event"
                                .into(),
                        );
                        if self.session.text(error_event(&busy)).await.is_err() {
                            return false;
                        }
                    }
                    Heard::Nothing => {}
                    // Dropping the events cancels the turn.
                    Heard::Gone => return false,
                },
            }
        }
    }

    /// Keeps the response a final event carries, with its chain, for the
    /// next turn; a failed one leaves nothing.
    fn remember(&mut self, data: &str, so_far: &mut Option<Remembered>) {
        // The encoder writes compact JSON: only a last event has one of
        // these, and only those are parsed again.
        let ends = [
            r#""type":"response.completed""#,
            r#""type":"response.incomplete""#,
            r#""type":"response.failed""#,
            r#""type":"error""#,
        ];
        if !ends.iter().any(|kind| data.contains(kind)) {
            return;
        }
        let Ok(event) = serde_json::from_str::<Value>(data) else { return };
        match event["type"].as_str() {
            Some("response.completed" | "response.incomplete") => {
                if let Some(mut kept) = so_far.take() {
                    if let Some(output) = event["response"]["output"].as_array() {
                        kept.items.extend(output.iter().cloned());
                    }
                    self.last = Some(kept);
                }
            }
            Some("response.failed" | "error") => {
                so_far.take();
                self.last = None;
            }
            _ => {}
        }
    }

    async fn start(&self, event: &[u8]) -> Result<(crate::http::access::Permit, SocketTurn), ApiError> {
        let mut body: Value = crate::http::body::parse_json(event)?;
        let Some(fields) = body.as_object_mut() else {
            return Err(ApiError::bad_request("a client event must be a JSON object"));
        };
        let kind = fields.remove("type");
        if kind.as_ref().and_then(Value::as_str) != Some("response.create") {
            return Err(ApiError::bad_param(
                "type",
                format!("a client event's 'type' must be 'response.create', got {}", kind.unwrap_or(Value::Null)),
            ));
        }
        // The socket streams every turn: `stream` says nothing here.
        fields.remove("stream");
        let generate = match fields.remove("generate") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(generate)) => generate,
            Some(other) => {
                return Err(ApiError::bad_param("generate", format!("'generate' must be a boolean, got {other}")))
            }
        };
        let wire = crate::http::body::parse_json(body.to_string().as_bytes())?;
        let permit = self.state.admission.admit()?;
        let turn = socket_turn(&self.state, &self.request, wire, self.last.as_ref(), generate).await?;
        Ok((permit, turn))
    }
}

/// The `error` event for a client event that was refused: the fields of
/// the Responses stream's `error` event that the SDKs read, and the HTTP
/// status and error object OpenAI's socket adds for raw clients.
fn error_event(err: &ApiError) -> String {
    let param = match err {
        ApiError::BadRequest { param, .. } => param.clone(),
        _ => None,
    };
    let code = err.code().unwrap_or(err.kind());
    json!({
        "type": "error",
        "code": code,
        "message": err.to_string(),
        "param": param,
        "sequence_number": 0,
        "status": err.status().as_u16(),
        "error": {"type": err.openai_type(), "code": code, "message": err.to_string(), "param": param},
    })
    .to_string()
}
