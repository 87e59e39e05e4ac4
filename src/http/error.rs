//! The one place HTTP errors become status codes and bodies.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;
use skillhost_actors::skills::fetch::FetchError;
use skillhost_actors::skills::install::InstallError;
use skillhost_actors::skills::SkillsError;
use skillhost_actors::ChatError;

/// Every error an HTTP handler can return.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something impossible (400);
    /// `code` is OpenAI's machine-readable name for the case, where it has
    /// one a client acts on (`previous_response_not_found`).
    #[error("{message}")]
    BadRequest { message: String, param: Option<String>, code: Option<&'static str> },
    /// The named model, route or object does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The model named in the request is not the loaded one (404).
    #[error("{0}")]
    ModelNotFound(String),
    /// The object exists but this change is not allowed (403).
    #[error("{0}")]
    Forbidden(String),
    /// The change conflicts with what exists (409).
    #[error("{0}")]
    Conflict(String),
    /// The route exists but not with this method (405).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The body is larger than the limit (413).
    #[error("{0}")]
    PayloadTooLarge(String),
    /// No model is ready (503).
    #[error("{0}")]
    Unavailable(String),
    /// No key, or a key that is not valid here (401).
    #[error("{0}")]
    Unauthorized(String),
    /// A JSON route called with another body type (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Every admission place is taken (503 with `Retry-After`).
    #[error("{0}")]
    Overloaded(String),
    /// The request is well formed but what it carries is refused on its
    /// content: a skill the scan found unsafe under the strict install
    /// policy (422). `details` rides in the body beside the message.
    #[error("{message}")]
    Refused { message: String, code: &'static str, details: serde_json::Value },
    /// Another server this one fetched from failed or was out of reach (502).
    #[error("{0}")]
    BadGateway(String),
    /// Something failed on our side (500).
    #[error("{0}")]
    Internal(String),
}

/// How an error body is shaped: OpenAI's under `/v1`, Anthropic's on
/// `/v1/messages`, a plain string elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorStyle {
    OpenAi,
    Anthropic,
    Plain,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest { message: message.into(), param: None, code: None }
    }

    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest { message: message.into(), param: Some(param.to_string()), code: None }
    }

    /// The same error under OpenAI's code for its case.
    pub fn with_code(self, code: &'static str) -> Self {
        match self {
            ApiError::BadRequest { message, param, .. } => ApiError::BadRequest { message, param, code: Some(code) },
            other => other,
        }
    }

    /// OpenAI's `type` for this error.
    pub fn openai_type(&self) -> &'static str {
        match self {
            ApiError::Unavailable(_) => "unavailable_error",
            ApiError::Overloaded(_) | ApiError::BadGateway(_) | ApiError::Internal(_) => "server_error",
            ApiError::BadRequest { .. }
            | ApiError::NotFound(_)
            | ApiError::ModelNotFound(_)
            | ApiError::MethodNotAllowed(_)
            | ApiError::Forbidden(_)
            | ApiError::Conflict(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::Unauthorized(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::Refused { .. } => "invalid_request_error",
        }
    }

    /// OpenAI's code for this error, where there is one.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::BadRequest { code, .. } => *code,
            ApiError::NotFound(_) => Some("not_found"),
            ApiError::ModelNotFound(_) => Some("model_not_found"),
            ApiError::MethodNotAllowed(_) => Some("method_not_allowed"),
            ApiError::Forbidden(_) => Some("forbidden"),
            ApiError::Conflict(_) => Some("conflict"),
            ApiError::PayloadTooLarge(_) => Some("payload_too_large"),
            ApiError::Unavailable(_) => Some("model_not_ready"),
            // OpenAI's own answer to a bad key.
            ApiError::Unauthorized(_) => Some("invalid_api_key"),
            ApiError::UnsupportedMediaType(_) => Some("unsupported_media_type"),
            ApiError::Overloaded(_) => Some("overloaded"),
            ApiError::Refused { code, .. } => Some(code),
            ApiError::BadGateway(_) => Some("bad_gateway"),
            ApiError::Internal(_) => None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) | ApiError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unavailable(_) | ApiError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The label used in the `errors_total` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::NotFound(_) => "not_found",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Conflict(_) => "conflict",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Overloaded(_) => "overloaded",
            ApiError::Refused { .. } => "refused",
            ApiError::BadGateway(_) => "bad_gateway",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The JSON body in the given style.
    pub fn body(&self, style: ErrorStyle) -> serde_json::Value {
        let mut body = self.bare_body(style);
        if let ApiError::Refused { details: serde_json::Value::Object(details), .. } = self {
            // Beside the message in each style: where a client reads the
            // error's fields.
            let target = match style {
                ErrorStyle::Plain => Some(&mut body),
                ErrorStyle::OpenAi | ErrorStyle::Anthropic => body.get_mut("error"),
            };
            if let Some(serde_json::Value::Object(target)) = target {
                target.extend(details.clone());
            }
        }
        body
    }

    fn bare_body(&self, style: ErrorStyle) -> serde_json::Value {
        match style {
            ErrorStyle::Plain => json!({"error": self.to_string()}),
            ErrorStyle::Anthropic => {
                // Anthropic's error types, by status.
                let kind = match self.status().as_u16() {
                    400 | 405 | 415 | 422 => "invalid_request_error",
                    401 => "authentication_error",
                    403 => "permission_error",
                    404 => "not_found_error",
                    413 => "request_too_large",
                    503 => "overloaded_error",
                    _ => "api_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": self.to_string()}})
            }
            ErrorStyle::OpenAi => {
                let kind = self.openai_type();
                let code = self.code();
                let param = match self {
                    ApiError::BadRequest { param, .. } => param.clone(),
                    ApiError::NotFound(_)
                    | ApiError::ModelNotFound(_)
                    | ApiError::MethodNotAllowed(_)
                    | ApiError::Forbidden(_)
                    | ApiError::Conflict(_)
                    | ApiError::PayloadTooLarge(_)
                    | ApiError::Unavailable(_)
                    | ApiError::Unauthorized(_)
                    | ApiError::UnsupportedMediaType(_)
                    | ApiError::Overloaded(_)
                    | ApiError::Refused { .. }
                    | ApiError::BadGateway(_)
                    | ApiError::Internal(_) => None,
                };
                json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
            }
        }
    }

    pub fn response(&self, style: ErrorStyle) -> HttpResponse {
        let mut builder = HttpResponse::build(self.status());
        match self {
            ApiError::Unavailable(_) => {
                builder.insert_header(("Retry-After", "1"));
            }
            ApiError::Overloaded(_) => {
                builder.insert_header(("Retry-After", crate::http::access::RETRY_AFTER_SECONDS.to_string()));
            }
            ApiError::Unauthorized(_) => {
                builder.insert_header(("WWW-Authenticate", "Bearer"));
            }
            _ => {}
        }
        builder.json(self.body(style))
    }
}

impl From<SkillsError> for ApiError {
    fn from(err: SkillsError) -> Self {
        match err {
            SkillsError::NotFound(message) => ApiError::NotFound(message),
            SkillsError::Forbidden(message) => ApiError::Forbidden(message),
            SkillsError::Install(InstallError::Rejected(message)) => ApiError::bad_request(message),
            SkillsError::Install(InstallError::Conflict(message)) => ApiError::Conflict(message),
            SkillsError::Install(InstallError::Io(message)) => ApiError::Internal(message),
            SkillsError::Install(InstallError::Unsafe { message, findings }) => ApiError::Refused {
                message,
                code: "skill_refused",
                details: serde_json::json!({"findings": crate::http::skills::findings_json(&findings)}),
            },
            SkillsError::Conflict(message) => ApiError::Conflict(message),
            SkillsError::Unavailable(message) => ApiError::Unavailable(message),
        }
    }
}

impl From<FetchError> for ApiError {
    fn from(err: FetchError) -> Self {
        match &err {
            FetchError::NotAllowed(_) => ApiError::Forbidden(err.to_string()),
            FetchError::Invalid(_) => ApiError::bad_request(err.to_string()),
            FetchError::DigestMismatch { expected, actual, .. } => ApiError::Refused {
                message: err.to_string(),
                code: "digest_mismatch",
                details: serde_json::json!({"expected": format!("sha256:{expected}"), "actual": format!("sha256:{actual}")}),
            },
            FetchError::TooLarge(_) => ApiError::Refused {
                message: err.to_string(),
                code: "archive_too_large",
                details: serde_json::json!({}),
            },
            FetchError::Remote(_) => ApiError::BadGateway(err.to_string()),
            FetchError::Io(_) => ApiError::Internal(err.to_string()),
        }
    }
}

impl From<ChatError> for ApiError {
    fn from(err: ChatError) -> Self {
        match err {
            ChatError::BadRequest(message) => ApiError::bad_request(message),
            ChatError::Unavailable(message) => ApiError::Unavailable(message),
            ChatError::ModelNotFound(message) => ApiError::ModelNotFound(message),
            ChatError::Engine(message) => ApiError::Internal(message),
            ChatError::Conflict(message) => ApiError::Conflict(message),
        }
    }
}

/// A handler error that answers in one surface's shape.
macro_rules! surface_error {
    ($(#[$doc:meta])* $name:ident, $style:expr) => {
        $(#[$doc])*
        #[derive(Debug, thiserror::Error)]
        #[error("{0}")]
        pub struct $name(pub ApiError);

        impl From<ApiError> for $name {
            fn from(err: ApiError) -> Self {
                $name(err)
            }
        }

        impl ResponseError for $name {
            fn status_code(&self) -> StatusCode {
                self.0.status()
            }
            fn error_response(&self) -> HttpResponse {
                self.0.response($style)
            }
        }
    };
}

surface_error!(
    /// An error on an OpenAI route.
    OpenAiError,
    ErrorStyle::OpenAi
);
surface_error!(
    /// An error on a route outside `/v1`: `{"error": "…"}`.
    PlainError,
    ErrorStyle::Plain
);
surface_error!(
    /// An error on Anthropic's Messages route.
    AnthropicError,
    ErrorStyle::Anthropic
);
