//! The gate every request passes before its handler runs (and before its
//! body is read): the Host check against DNS rebinding, browser origins
//! and preflights, keys, the JSON content type, and admission.
//!
//! Order matters: a request a browser should never have sent is refused
//! before anything about keys is said, and a request without the right key
//! never takes an admission place.

use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method};
use actix_web::middleware::Next;
use actix_web::web::{self, Bytes};
use actix_web::HttpResponse;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{read_key_file, AccessConfig, KeyError};
use crate::http::error::{ApiError, ErrorStyle};
use crate::http::AppState;

/// Seconds a refused client is told to wait before trying again.
pub const RETRY_AFTER_SECONDS: u32 = 2;

/// How long a browser may cache an answered preflight.
const PREFLIGHT_MAX_AGE_SECONDS: u32 = 600;

/// What a route needs from the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Health, the Web UI's page and assets, and who-am-I.
    Open,
    /// `/metrics`: open unless `--metrics-key` is set.
    Metrics,
    /// Chat, models, reading skills, artifacts, conversations.
    User,
    /// What changes the server: installing, deleting, rescanning skills.
    Admin,
}

/// Which routes need what. Unknown routes need a user key, so a server with
/// keys says nothing about its routes to a caller without one.
pub fn need(method: &Method, path: &str) -> Need {
    let get = *method == Method::GET || *method == Method::HEAD;
    match path {
        "/health" | "/" | "/favicon.ico" | "/api/whoami" if get => Need::Open,
        _ if get && path.starts_with("/assets/") => Need::Open,
        // What the operator publishes (`--skills-publish`) is for other
        // servers, which hold no key of ours; the routes answer 404 unless
        // publishing is on.
        _ if get && path.starts_with("/.well-known/agent-skills/") => Need::Open,
        "/metrics" => Need::Metrics,
        "/api/skills" | "/api/skills/rescan" if *method == Method::POST => Need::Admin,
        _ if *method == Method::DELETE && path.starts_with("/api/skills/") => Need::Admin,
        // Rollback; every other skills route that changes something.
        _ if *method == Method::POST && path.starts_with("/api/skills/") => Need::Admin,
        _ if *method == Method::POST && path.starts_with("/api/models/") => Need::Admin,
        // OpenAI's Skills API: creating, changing and deleting skills.
        _ if !get && (path == "/v1/skills" || path.starts_with("/v1/skills/")) => Need::Admin,
        _ => Need::User,
    }
}

/// Routes that start generation: each holds an admission place until its
/// response (streamed or not) is finished. Every surface that starts a turn
/// is here, so none waits unbounded behind the others' queue.
fn starts_work(method: &Method, path: &str) -> bool {
    *method == Method::POST
        && matches!(
            path,
            "/v1/chat/completions"
                | "/chat/completions"
                | "/v1/responses"
                | "/v1/responses/compact"
                | "/v1/messages"
                | "/api/chat"
                | "/api/chat/ollama"
                | "/ollama/api/chat"
                | "/v1/embeddings"
                | "/embeddings"
                | "/ollama/api/embed"
        )
}

/// What an admin route does, as its refusal names it.
fn admin_action(path: &str) -> &'static str {
    if path.starts_with("/api/models/") {
        "loading and unloading models"
    } else {
        "changing skills"
    }
}

/// Routes whose body is JSON. Requiring `application/json` means a page on
/// another origin cannot reach them without a preflight (a plain form or a
/// `no-cors` fetch can only send form or text types).
fn takes_json(method: &Method, path: &str) -> bool {
    starts_work(method, path)
        || (*method == Method::POST && matches!(path, "/ollama/api/show" | "/v1/messages/count_tokens" | "/v1/responses/input_tokens"))
        // An MCP client sends JSON-RPC as JSON; a form on another site must
        // not reach the skills through a keyless loopback server.
        || (*method == Method::POST && path == "/mcp")
        // Creating a conversation, adding items, changing its metadata.
        || (*method == Method::POST && path.starts_with("/v1/conversations"))
        // A rollback: a form on another site must not roll a skill back
        // through a keyless loopback server.
        || (*method == Method::POST && path.starts_with("/api/skills/") && path.ends_with("/rollback"))
        // An install by URL: a form on another site must not make the
        // server fetch and install through a keyless loopback server.
        || (*method == Method::POST && path == "/api/skills/install")
        // Setting a skill's default version.
        || (*method == Method::POST && path.starts_with("/v1/skills/") && path.matches('/').count() == 3)
}

/// The error shape of the surface a path belongs to.
pub fn style_for(path: &str) -> ErrorStyle {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        ErrorStyle::Anthropic
    } else if path.starts_with("/v1/") || path == "/chat/completions" || path == "/models" {
        ErrorStyle::OpenAi
    } else {
        ErrorStyle::Plain
    }
}

/// Who a request is, for what it may hold (its Web UI conversations): a
/// valid key it sent, by a prefix of the key's digest, else its address.
/// An unknown key counts as none, so varying it makes no new caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    /// The caller of a request the gate did not see (tests that mount the
    /// routes alone).
    pub fn of(request: &actix_web::HttpRequest) -> String {
        use actix_web::HttpMessage;
        request.extensions().get::<Caller>().map_or_else(|| "local".to_string(), |caller| caller.0.clone())
    }
}

/// Who the caller is, by the key it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    None,
    User,
    Admin,
}

/// The keys in force: given on the command line, plus those read from key
/// files (read again on SIGHUP). Only digests are kept.
#[derive(Debug, Default)]
struct KeySet {
    user: Vec<[u8; 32]>,
    admin: Vec<[u8; 32]>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Whether `candidate` is one of `keys`: every stored digest is compared in
/// constant time, so timing says nothing about which or how close.
fn holds(keys: &[[u8; 32]], candidate: &[u8; 32]) -> bool {
    let mut found = subtle::Choice::from(0);
    for key in keys {
        found |= key.ct_eq(candidate);
    }
    found.into()
}

/// Keys, origins and hosts, as configured; shared by every worker.
#[derive(Debug)]
pub struct Access {
    config: AccessConfig,
    keys: RwLock<KeySet>,
    metrics_key: Option<[u8; 32]>,
    /// Whether the server listens on loopback only (then the Host header
    /// must name loopback, against DNS rebinding).
    loopback: bool,
}

/// Why the key files could not be read again: the keys in force stay as
/// they were (and at start-up, where the files were checked just before,
/// the error is logged).
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {source}")]
pub struct ReloadError {
    flag: &'static str,
    source: KeyError,
}

impl Default for Access {
    /// No keys, loopback: what a server started without flags allows.
    fn default() -> Self {
        Access::new(AccessConfig::default(), IpAddr::from([127, 0, 0, 1]))
    }
}

impl Access {
    /// Key files were checked when the configuration was read; one that
    /// has become unreadable since leaves its keys out (and is logged).
    pub fn new(config: AccessConfig, host: IpAddr) -> Self {
        let metrics_key = config.metrics_key.as_deref().map(digest);
        let access = Access { keys: RwLock::new(KeySet::default()), metrics_key, loopback: host.is_loopback(), config };
        if let Err(err) = access.reload() {
            tracing::error!("{err}");
        }
        access
    }

    /// Reads the key files again (on SIGHUP). On an error the keys in force
    /// stay as they were.
    pub fn reload(&self) -> Result<(), ReloadError> {
        let read = |keys: &[String], file: &Option<PathBuf>, flag: &'static str| {
            let mut all: Vec<[u8; 32]> = keys.iter().map(|k| digest(k)).collect();
            if let Some(path) = file {
                let keys = read_key_file(path).map_err(|source| ReloadError { flag, source })?;
                all.extend(keys.iter().map(|k| digest(k)));
            }
            Ok::<_, ReloadError>(all)
        };
        let user = read(&self.config.api_keys, &self.config.api_key_file, "--api-key-file")?;
        let admin = read(&self.config.admin_keys, &self.config.admin_key_file, "--admin-key-file")?;
        let (n_user, n_admin) = (user.len(), admin.len());
        match self.keys.write() {
            Ok(mut keys) => *keys = KeySet { user, admin },
            Err(poisoned) => *poisoned.into_inner() = KeySet { user, admin },
        }
        tracing::info!(user_keys = n_user, admin_keys = n_admin, "keys loaded");
        Ok(())
    }

    /// Whether chat and model routes need a key.
    pub fn user_keys_required(&self) -> bool {
        self.config.user_keys_configured()
    }

    fn admin_keys_configured(&self) -> bool {
        !self.config.admin_keys.is_empty() || self.config.admin_key_file.is_some()
    }

    /// The caller's role by the key it sent. With no keys configured at
    /// all, everyone is an admin (the loopback default).
    pub fn role(&self, request: &ServiceRequest) -> Role {
        let Some(sent) = sent_key(request) else { return self.anonymous() };
        let sent = digest(sent);
        let keys = match self.keys.read() {
            Ok(keys) => keys,
            Err(poisoned) => poisoned.into_inner(),
        };
        if holds(&keys.admin, &sent) {
            Role::Admin
        } else if holds(&keys.user, &sent) {
            Role::User
        } else {
            // A key this server does not know counts as none: clients like
            // `openai` always send one, even to a server without keys.
            self.anonymous()
        }
    }

    /// The request's [`Caller`].
    pub fn caller(&self, request: &ServiceRequest) -> Caller {
        if let Some(sent) = sent_key(request).map(digest) {
            let keys = match self.keys.read() {
                Ok(keys) => keys,
                Err(poisoned) => poisoned.into_inner(),
            };
            if holds(&keys.admin, &sent) || holds(&keys.user, &sent) {
                let short: String = sent[..8].iter().map(|b| format!("{b:02x}")).collect();
                return Caller(format!("key:{short}"));
            }
        }
        Caller(format!("addr:{}", request.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default()))
    }

    /// The role of a caller without a valid key: anyone may do what needs
    /// no key (everything, when no key is configured at all).
    fn anonymous(&self) -> Role {
        if self.user_keys_required() {
            Role::None
        } else if self.admin_keys_configured() {
            Role::User
        } else {
            Role::Admin
        }
    }

    /// Refuses the request unless its key allows `need`.
    fn check_key(&self, request: &ServiceRequest, need: Need) -> Result<(), ApiError> {
        let role = self.role(request);
        let missing = sent_key(request).is_none();
        let refuse = |what: &str| {
            ApiError::Unauthorized(if missing {
                format!("{what} needs a key: send Authorization: Bearer KEY (or x-api-key: KEY)")
            } else {
                format!("the key sent is not valid for {what}")
            })
        };
        match need {
            Need::Open => Ok(()),
            Need::Metrics => match &self.metrics_key {
                None => Ok(()),
                Some(key) => match sent_key(request) {
                    Some(sent) if holds(std::slice::from_ref(key), &digest(sent)) => Ok(()),
                    _ => Err(refuse("/metrics")),
                },
            },
            Need::User => {
                if !self.user_keys_required() || role >= Role::User {
                    Ok(())
                } else {
                    Err(refuse("this route"))
                }
            }
            Need::Admin => {
                let what = admin_action(request.path());
                if role == Role::Admin {
                    Ok(())
                } else if !self.admin_keys_configured() {
                    Err(ApiError::Forbidden(format!(
                        "{what} needs an admin key, and this server has none: start it with --admin-key (or --admin-key-file)"
                    )))
                } else if role == Role::User && self.user_keys_required() {
                    // Only a real user key makes a caller a user when user keys exist.
                    Err(ApiError::Forbidden(format!("{what} needs an admin key; the key sent is a user key")))
                } else {
                    Err(refuse(what))
                }
            }
        }
    }

    /// DNS rebinding: a page on an attacker's name that resolves to
    /// 127.0.0.1 reaches a loopback server with that name in `Host`. A
    /// loopback server answers only to loopback names (and those allowed).
    fn check_host(&self, request: &ServiceRequest) -> Result<(), ApiError> {
        if !self.loopback {
            return Ok(());
        }
        let Some(host) = request.headers().get(header::HOST) else { return Ok(()) };
        let host = host.to_str().unwrap_or("").to_ascii_lowercase();
        let name = host_name(&host);
        if is_loopback_name(name) || self.config.allowed_hosts.iter().any(|allowed| allowed == name) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "the Host header {host:?} is not a loopback name; a server on a loopback address answers only to localhost and loopback addresses (add names with --allowed-hosts)"
            )))
        }
    }

    /// The request's `Origin` when it is another site's that is allowed.
    fn allowed_origin(&self, origin: &str) -> bool {
        self.config.allowed_origins.iter().any(|allowed| allowed == origin)
    }

    /// Browsers name the page that sent a request in `Origin` (and
    /// `Sec-Fetch-Site`); a request that changes state or starts work is
    /// refused when that page is not this server's own or allowed.
    ///
    /// A WebSocket handshake is a GET, but the socket it opens runs turns,
    /// and a browser lets any page open a socket to any host, with no
    /// preflight and no CORS on what comes back: a GET that asks for any
    /// upgrade is judged as a POST is.
    fn check_origin(&self, request: &ServiceRequest) -> Result<(), ApiError> {
        let method = request.method();
        let upgrade = request.headers().contains_key(header::UPGRADE);
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) && !upgrade {
            return Ok(());
        }
        match origin_of(request) {
            Some(origin) if same_origin(request, &origin) || self.allowed_origin(&origin) => Ok(()),
            Some(origin) => Err(ApiError::Forbidden(format!(
                "requests from the page at {origin:?} are not accepted: it is not this server's own origin (allow it with --allowed-origins)"
            ))),
            None if header_is(request, "sec-fetch-site", "cross-site") => Err(ApiError::Forbidden(
                "cross-site requests from a browser are not accepted (allow an origin with --allowed-origins)".into(),
            )),
            None => Ok(()),
        }
    }
}

/// The key a request carries: `Authorization: Bearer KEY`, else `x-api-key`.
fn sent_key(request: &ServiceRequest) -> Option<&str> {
    let headers = request.headers();
    if let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let (scheme, key) = value.trim().split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then_some(key.trim()).filter(|k| !k.is_empty());
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim).filter(|k| !k.is_empty())
}

fn header_is(request: &ServiceRequest, name: &str, value: &str) -> bool {
    request.headers().get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case(value))
}

fn origin_of(request: &ServiceRequest) -> Option<String> {
    let origin = request.headers().get(header::ORIGIN)?;
    Some(origin.to_str().unwrap_or("invalid").trim().to_ascii_lowercase())
}

/// Whether `origin` is this server as the browser reached it. skillhost
/// serves plain HTTP, so its own origin is `http://` and the Host header.
fn same_origin(request: &ServiceRequest, origin: &str) -> bool {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_ascii_lowercase);
    host.is_some_and(|host| origin == format!("http://{host}"))
}

/// The name part of a Host header: without the port, IPv6 brackets kept off.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(name, _)| name)
}

fn is_loopback_name(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Requests running or waiting, bounded by `--parallel + --max-queued`.
#[derive(Debug)]
pub struct Admission {
    in_flight: Arc<AtomicUsize>,
    /// `None`: unbounded (tests that do not exercise admission).
    limit: Option<usize>,
    /// The flag whose value sets the bound, for the refusal's sentence.
    parallel: usize,
}

impl Default for Admission {
    fn default() -> Self {
        Admission { in_flight: Arc::new(AtomicUsize::new(0)), limit: None, parallel: 0 }
    }
}

impl Admission {
    pub fn new(parallel: usize, max_queued: usize) -> Self {
        Admission { in_flight: Arc::new(AtomicUsize::new(0)), limit: Some(parallel + max_queued), parallel }
    }

    /// A place, or the refusal.
    pub(crate) fn admit(&self) -> Result<Permit, ApiError> {
        let taken = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let permit = Permit(self.in_flight.clone());
        match self.limit {
            Some(limit) if taken >= limit => {
                drop(permit);
                Err(ApiError::Overloaded(format!(
                    "the server is at capacity: {limit} requests are running or waiting ({} decoding, {} queued; see --max-queued); retry after {RETRY_AFTER_SECONDS} seconds",
                    self.parallel,
                    limit - self.parallel
                )))
            }
            _ => Ok(permit),
        }
    }

    /// Requests running or waiting now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// One admission place; given back when the response is finished.
#[derive(Debug)]
pub struct Permit(Arc<AtomicUsize>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds an admission place until it is finished or
/// dropped (a streaming client that goes away drops it).
struct Held {
    body: BoxBody,
    _permit: Permit,
}

impl MessageBody for Held {
    type Error = <BoxBody as MessageBody>::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

/// The middleware (see the module comment for the order).
pub async fn gate(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(state) = request.app_data::<web::Data<AppState>>().cloned() else {
        return Ok(next.call(request).await?.map_into_boxed_body());
    };
    let access = &state.access;
    // The path the router will match, never the raw one: actix decodes
    // percent-encoded characters (all but `%`, `/` and `+`) before it
    // routes, so `/api/skill%73` runs `/api/skills`. Judged by the raw
    // spelling, that request would pass as an unknown route.
    let path = request.match_info().as_str().to_string();
    let method = request.method().clone();
    let style = style_for(&path);
    let refuse = |request: ServiceRequest, err: ApiError| {
        state.metrics.refused.with_label_values(&[err.kind()]).inc();
        Ok(request.into_response(err.response(style)).map_into_boxed_body())
    };
    if let Err(err) = access.check_host(&request) {
        return refuse(request, err);
    }
    let origin = origin_of(&request);
    let cross_allowed =
        origin.as_deref().filter(|o| !same_origin(&request, o) && access.allowed_origin(o)).map(str::to_string);
    if method == Method::OPTIONS {
        return match &cross_allowed {
            Some(origin) => Ok(request.into_response(preflight(origin)).map_into_boxed_body()),
            None => refuse(
                request,
                ApiError::Forbidden(
                    "preflight requests are answered only for origins allowed with --allowed-origins".into(),
                ),
            ),
        };
    }
    if let Err(err) = access.check_origin(&request) {
        return refuse(request, err);
    }
    if let Err(err) = access.check_key(&request, need(&method, &path)) {
        return refuse(request, err);
    }
    {
        use actix_web::HttpMessage;
        let caller = access.caller(&request);
        request.extensions_mut().insert(caller);
    }
    if takes_json(&method, &path) && !is_json(&request) {
        return refuse(
            request,
            ApiError::UnsupportedMediaType("this route takes a JSON body: send Content-Type: application/json".into()),
        );
    }
    let permit = if starts_work(&method, &path) {
        match state.admission.admit() {
            Ok(permit) => Some(permit),
            Err(err) => return refuse(request, err),
        }
    } else {
        None
    };
    let mut response = next.call(request).await?;
    if let Some(origin) = cross_allowed {
        let headers = response.headers_mut();
        if let Ok(value) = header::HeaderValue::from_str(&origin) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        }
        headers.append(header::VARY, header::HeaderValue::from_static("Origin"));
    }
    Ok(match permit {
        Some(permit) => response.map_body(|_, body| BoxBody::new(Held { body: body.boxed(), _permit: permit })),
        None => response.map_into_boxed_body(),
    })
}

fn is_json(request: &ServiceRequest) -> bool {
    let Some(value) = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The answer to an allowed origin's preflight.
fn preflight(origin: &str) -> HttpResponse {
    HttpResponse::NoContent()
        .insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin))
        .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, "GET, POST, DELETE, OPTIONS"))
        .insert_header((header::ACCESS_CONTROL_ALLOW_HEADERS, "authorization, content-type, x-api-key"))
        .insert_header((header::ACCESS_CONTROL_MAX_AGE, PREFLIGHT_MAX_AGE_SECONDS.to_string()))
        .insert_header((header::VARY, "Origin"))
        .finish()
}

/// `GET /api/whoami`: whether keys are needed and what the key sent allows,
/// so the Web UI can ask for one and show admin actions only to admins.
pub async fn whoami(request: actix_web::HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let service_request = ServiceRequest::from_request(request);
    let role = match state.access.role(&service_request) {
        Role::None => serde_json::Value::Null,
        Role::User => "user".into(),
        Role::Admin => "admin".into(),
    };
    HttpResponse::Ok().json(serde_json::json!({
        "keys_required": state.access.user_keys_required(),
        "admin_keys": state.access.admin_keys_configured(),
        "role": role,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_loopback() {
        for (host, name) in
            [("localhost:5000", "localhost"), ("[::1]:80", "::1"), ("127.0.0.1", "127.0.0.1"), ("a.b", "a.b")]
        {
            assert_eq!(host_name(host), name);
        }
        for name in ["localhost", "app.localhost", "127.0.0.1", "127.1.2.3", "::1"] {
            assert!(is_loopback_name(name), "{name}");
        }
        for name in ["evil.example", "localhost.evil.example", "10.0.0.1", "0.0.0.0", ""] {
            assert!(!is_loopback_name(name), "{name}");
        }
    }

    #[test]
    fn routes_by_need() {
        assert_eq!(need(&Method::GET, "/health"), Need::Open);
        assert_eq!(need(&Method::POST, "/health"), Need::User);
        assert_eq!(need(&Method::GET, "/assets/app.js"), Need::Open);
        assert_eq!(need(&Method::GET, "/metrics"), Need::Metrics);
        assert_eq!(need(&Method::POST, "/api/skills"), Need::Admin);
        assert_eq!(need(&Method::GET, "/api/skills"), Need::User);
        assert_eq!(need(&Method::DELETE, "/api/skills/pdf"), Need::Admin);
        assert_eq!(need(&Method::POST, "/api/skills/rescan"), Need::Admin);
        assert_eq!(need(&Method::POST, "/api/skills/pdf/rollback"), Need::Admin);
        assert_eq!(need(&Method::GET, "/api/skills/pdf/versions"), Need::User);
        assert_eq!(need(&Method::POST, "/api/skills/install"), Need::Admin);
        assert_eq!(need(&Method::POST, "/v1/skills"), Need::Admin);
        assert_eq!(need(&Method::DELETE, "/v1/skills/pdf/versions/2"), Need::Admin);
        assert_eq!(need(&Method::GET, "/v1/skills/pdf/versions"), Need::User);
        assert_eq!(need(&Method::GET, "/.well-known/agent-skills/index.json"), Need::Open);
        assert_eq!(need(&Method::POST, "/.well-known/agent-skills/index.json"), Need::User);
        assert_eq!(need(&Method::DELETE, "/api/conversations/c-1"), Need::User);
        assert_eq!(need(&Method::GET, "/no/such/route"), Need::User);
    }

    #[test]
    fn digests_compare_whole() {
        let keys = [digest("alpha"), digest("beta")];
        assert!(holds(&keys, &digest("beta")));
        assert!(!holds(&keys, &digest("bet")));
        assert!(!holds(&keys, &digest("betaa")));
        assert!(!holds(&[], &digest("")));
    }
}
