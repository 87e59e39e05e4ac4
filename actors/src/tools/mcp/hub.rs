//! The server's MCP connections: one slot per configured server, started
//! on first use, restarted with back-off after it dies, its tool catalog
//! refreshed between turns when it says its list changed.
//!
//! A stdio server runs through the sandbox helper like a command, with the
//! `mcp` profile: a folder of its own (its HOME, the only place it may
//! write), a uid of its own from the range when the server is root, a
//! control group of its own, and no network unless its entry grants it.
//! `--skills-sandbox required` refuses to start one the host cannot
//! confine. An HTTP server is reached at its configured URL only: the
//! client follows no redirect and reads no proxy from the environment.
//!
//! Whatever a server does, the model gets a sentence: a server that cannot
//! start, dies, stalls or floods is a failed tool call, never a failed
//! request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ReadResourceRequestParams};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Map, Value};

use super::config::{McpServerConfig, Transport};
use super::lines::{CappedLines, MAX_MESSAGE_BYTES};
use super::{result, Catalog, McpSelection, TurnMcp};
use crate::sandbox::launch::{Run, SandboxMode, Service, ServiceFolders};
use crate::sandbox::ExecRuntime;
use crate::tools::Answer;
use crate::workspace::Workspace;

/// How long one call may run unless the operator says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server has to start and answer the handshake and its first
/// listing (npx fetching a package takes a while).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The first wait before restarting a server that died; it doubles with
/// each failure in a row, up to [`MAX_RESTART_BACKOFF`].
pub const FIRST_RESTART_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(60);
/// The last bytes of a stdio server's stderr kept to say why it failed.
const STDERR_TAIL_BYTES: usize = 2048;
/// (server, tool, outcome) rows counted for `/metrics`.
const MAX_COUNTED: usize = 4096;

/// How a call ended, as `/metrics` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// The tool answered.
    Ok,
    /// The tool answered that it failed (`isError`).
    Error,
    /// The server could not be reached, or died during the call.
    Failed,
    /// No answer within the call's time.
    Timeout,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Failed => "failed",
            Outcome::Timeout => "timeout",
        }
    }
}

/// The hub's settings, from the operator's flags.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// How stdio servers are confined; `None` where this server starts no
    /// processes (they are then refused).
    pub exec: Option<Arc<ExecRuntime>>,
    pub call_timeout: Duration,
    pub start_timeout: Duration,
}

/// Receives a server's notifications: a changed tool list marks the
/// catalog stale, read again when the next turn starts.
#[derive(Clone)]
struct Listener {
    stale: Arc<AtomicBool>,
}

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.stale.store(true, Ordering::Relaxed);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("skillhost", env!("CARGO_PKG_VERSION")))
    }
}

/// A running connection.
struct Live {
    service: RunningService<RoleClient, Listener>,
    /// A stdio server's process and its folder (gone with the process).
    process: Option<(Service, Workspace)>,
    stderr: Arc<Mutex<String>>,
    /// Its stdout sent a message past [`MAX_MESSAGE_BYTES`].
    flooded: Arc<AtomicBool>,
    /// Restarts in a row before this one came up.
    failures: u32,
}

impl Live {
    /// Whether the connection is over: closed, flooded, or its process
    /// exited.
    fn gone(&mut self) -> bool {
        self.service.is_closed()
            || self.service.peer().is_transport_closed()
            || self.flooded.load(Ordering::Relaxed)
            || self.process.as_mut().is_some_and(|(service, _)| matches!(service.child.try_wait(), Ok(Some(_))))
    }

    /// Why it is gone, in words.
    fn why_gone(&mut self) -> String {
        if self.flooded.load(Ordering::Relaxed) {
            return format!("it sent a message longer than {} MiB", MAX_MESSAGE_BYTES >> 20);
        }
        let status = self.process.as_mut().and_then(|(service, _)| service.child.try_wait().ok().flatten());
        let oom = self.process.as_ref().is_some_and(|(service, _)| service.out_of_memory());
        let tail = stderr_tail(&self.stderr);
        let mut why = match status {
            _ if oom => "it ran out of memory".to_string(),
            Some(status) => format!("it exited ({status})"),
            None => "the connection closed".to_string(),
        };
        if !tail.is_empty() {
            why.push_str(&format!("; its last words: {tail}"));
        }
        why
    }

    async fn stop(self) {
        let Live { service, process, .. } = self;
        let _ = service.cancel().await;
        if let Some((service, workspace)) = process {
            service.stop().await;
            drop(workspace);
        }
    }
}

fn stderr_tail(tail: &Mutex<String>) -> String {
    let text = tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .rev()
        .take(300)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

enum Conn {
    /// Not started yet.
    Idle,
    Up(Box<Live>),
    /// Died or failed to start; the next try waits until `retry_at`.
    Down {
        retry_at: Instant,
        failures: u32,
        why: String,
    },
}

struct Slot {
    config: McpServerConfig,
    conn: tokio::sync::Mutex<Conn>,
    catalog: Mutex<Option<Arc<Catalog>>>,
    stale: Arc<AtomicBool>,
}

/// What the operator sees of one server (`GET /api/mcp`, `skillhost mcp list`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerReport {
    pub name: String,
    pub transport: &'static str,
    pub target: String,
    /// `idle` (not started), `up` or `down`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub tools: Vec<String>,
    pub skipped_tools: Vec<SkippedTool>,
    pub resources: Vec<Value>,
    pub prompts: Vec<Value>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SkippedTool {
    pub name: String,
    pub reason: String,
}

/// The innermost cause of an error ("Connection refused (os error 111)"):
/// the transport's own wrappers name its Rust types, which tell an operator
/// nothing.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

/// Every configured server.
pub struct McpHub {
    slots: Vec<Slot>,
    settings: HubSettings,
    counts: Mutex<BTreeMap<(String, String, Outcome), u64>>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub").field("servers", &self.names()).finish()
    }
}

fn backoff(failures: u32) -> Duration {
    FIRST_RESTART_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(16)).min(MAX_RESTART_BACKOFF)
}

impl McpHub {
    pub fn new(servers: Vec<McpServerConfig>, settings: HubSettings) -> McpHub {
        // reqwest is built without a TLS provider of its own; ring is the
        // one already in the tree. Installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let slots = servers
            .into_iter()
            .map(|config| Slot {
                config,
                conn: tokio::sync::Mutex::new(Conn::Idle),
                catalog: Mutex::new(None),
                stale: Arc::new(AtomicBool::new(false)),
            })
            .collect();
        McpHub { slots, settings, counts: Mutex::new(BTreeMap::new()) }
    }

    /// The configured servers' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.slots.iter().map(|slot| slot.config.name.clone()).collect()
    }

    /// The URL of an HTTP server; `None` for a stdio one or an unknown name.
    pub fn url_of(&self, name: &str) -> Option<String> {
        match &self.slot(name)?.config.transport {
            Transport::Http { url, .. } => Some(url.clone()),
            Transport::Stdio { .. } => None,
        }
    }

    fn slot(&self, name: &str) -> Option<&Slot> {
        self.slots.iter().find(|slot| slot.config.name == name)
    }

    /// The calls counted so far: (server, tool, outcome) and how many.
    pub fn counts(&self) -> Vec<(String, String, Outcome, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        counts.iter().map(|((server, tool, outcome), n)| (server.clone(), tool.clone(), *outcome, *n)).collect()
    }

    fn count(&self, server: &str, tool: &str, outcome: Outcome) {
        let mut counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (server.to_string(), tool.to_string(), outcome);
        if let Some(n) = counts.get_mut(&key) {
            *n += 1;
        } else if counts.len() < MAX_COUNTED {
            counts.insert(key, 1);
        }
    }

    /// The tools a turn offers: the catalog of each selected server,
    /// started or listed again first where needed (a server whose list
    /// changed is listed again here, between turns). A server that cannot
    /// start offers what it offered last, or nothing.
    pub async fn for_turn(self: &Arc<Self>, selection: &McpSelection) -> TurnMcp {
        let selected: Vec<&Slot> = self.slots.iter().filter(|slot| selection.includes(&slot.config.name)).collect();
        let catalogs = futures_util::future::join_all(selected.iter().map(|slot| self.catalog(slot))).await;
        let mut turn = TurnMcp {
            hub: Arc::clone(self),
            tools: BTreeMap::new(),
            resource_servers: Vec::new(),
            declarations: Vec::new(),
        };
        for (slot, catalog) in selected.into_iter().zip(catalogs) {
            let Some(catalog) = catalog else { continue };
            let server = &slot.config.name;
            for tool in catalog.tools.iter().filter(|tool| selection.allows(server, &tool.name)) {
                turn.tools.insert(tool.declaration.name.clone(), (server.clone(), tool.name.clone()));
                turn.declarations.push(tool.declaration.clone());
            }
            if catalog.resources {
                turn.resource_servers.push(server.clone());
            }
        }
        if !turn.resource_servers.is_empty() {
            turn.declarations.push(super::read_resource_declaration(&turn.resource_servers));
        }
        turn
    }

    /// One server's catalog, listed now when it was never listed or went
    /// stale.
    async fn catalog(&self, slot: &Slot) -> Option<Arc<Catalog>> {
        let known = slot.catalog.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if known.is_some() && !slot.stale.load(Ordering::Relaxed) {
            return known;
        }
        let peer = match self.peer(slot).await {
            Ok(peer) => peer,
            Err(why) => {
                tracing::warn!(server = %slot.config.name, reason = %why, "an MCP server is not available for this turn");
                return known;
            }
        };
        slot.stale.store(false, Ordering::Relaxed);
        match tokio::time::timeout(self.settings.start_timeout, self.list(slot, &peer)).await {
            Ok(Ok(catalog)) => {
                let catalog = Arc::new(catalog);
                *slot.catalog.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::clone(&catalog));
                Some(catalog)
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(why)) => why,
                    _ => "it did not list its tools in time".into(),
                };
                tracing::warn!(server = %slot.config.name, reason = %why, "cannot list an MCP server's tools");
                known
            }
        }
    }

    async fn list(&self, slot: &Slot, peer: &Peer<RoleClient>) -> Result<Catalog, String> {
        let tools = peer.list_all_tools().await.map_err(|err| err.to_string())?;
        let tools: Vec<Value> = tools.iter().filter_map(|tool| serde_json::to_value(tool).ok()).collect();
        let mut catalog = Catalog::from_tools(&slot.config.name, &tools);
        let capabilities =
            peer.peer_info().and_then(|info| serde_json::to_value(&info.capabilities).ok()).unwrap_or(Value::Null);
        catalog.resources = capabilities.get("resources").is_some_and(|v| !v.is_null());
        catalog.prompts = capabilities.get("prompts").is_some_and(|v| !v.is_null());
        tracing::info!(
            server = %slot.config.name,
            tools = catalog.tools.len(),
            skipped = catalog.skipped.len(),
            resources = catalog.resources,
            "MCP server listed"
        );
        Ok(catalog)
    }

    /// A connection to `slot`'s server: the running one, or a new one when
    /// none runs and the back-off allows it.
    async fn peer(&self, slot: &Slot) -> Result<Peer<RoleClient>, String> {
        let mut conn = slot.conn.lock().await;
        let mut failures = 0;
        if let Conn::Up(live) = &mut *conn {
            if !live.gone() {
                return Ok(live.service.peer().clone());
            }
            take_down(&slot.config.name, &mut conn).await;
        }
        if let Conn::Down { retry_at, failures: before, why } = &*conn {
            let now = Instant::now();
            if now < *retry_at {
                let wait = retry_at.duration_since(now).as_secs_f64().ceil() as u64;
                return Err(format!("{why}; it is started again in {wait} s"));
            }
            failures = *before;
        }
        match self.start(slot, failures).await {
            Ok(live) => {
                let peer = live.service.peer().clone();
                *conn = Conn::Up(Box::new(live));
                Ok(peer)
            }
            Err(why) => {
                let failures = failures + 1;
                tracing::warn!(server = %slot.config.name, reason = %why, failures, "an MCP server did not start");
                *conn = Conn::Down { retry_at: Instant::now() + backoff(failures), failures, why: why.clone() };
                Err(why)
            }
        }
    }

    async fn start(&self, slot: &Slot, failures: u32) -> Result<Live, String> {
        let listener = Listener { stale: Arc::clone(&slot.stale) };
        let stderr = Arc::new(Mutex::new(String::new()));
        let flooded = Arc::new(AtomicBool::new(false));
        let timeout = self.settings.start_timeout;
        match &slot.config.transport {
            Transport::Stdio { command, args, env, cwd, network, read } => {
                let exec = self
                    .settings
                    .exec
                    .as_ref()
                    .ok_or_else(|| "this server runs no processes, so it starts no stdio MCP server".to_string())?;
                let settings = &exec.settings;
                let unconfined = match (settings.mode, &settings.unavailable) {
                    (SandboxMode::Off, _) => true,
                    (SandboxMode::Preferred, unavailable) => unavailable.is_some(),
                    (SandboxMode::Required, Some(why)) => {
                        return Err(format!(
                            "it cannot be confined on this host ({why}), and --skills-sandbox is required"
                        ))
                    }
                    (SandboxMode::Required, None) => false,
                };
                let base = exec.workspace_base.clone();
                let options = exec.workspaces.clone();
                let workspace = tokio::task::spawn_blocking(move || Workspace::create(&base, &options))
                    .await
                    .map_err(|err| err.to_string())?
                    .map_err(|err| format!("cannot make its folder: {err}"))?;
                // What the operator listed is its code: read and run, never written.
                let folders = ServiceFolders { cwd: cwd.as_deref(), execute: read };
                let line: Vec<String> = std::iter::once(command.clone()).chain(args.iter().cloned()).collect();
                let run = Run {
                    profile: "mcp",
                    workspace: workspace.path(),
                    owner: workspace.owner(),
                    skill: None,
                    network: *network,
                    unconfined,
                    command: &line,
                    env,
                    read: &[],
                    start_in: None,
                    proxy: None,
                    timeout,
                };
                let mut service = settings.launcher.spawn_service(&run, folders).map_err(|err| err.to_string())?;
                let (Some(stdin), Some(stdout), Some(err_pipe)) =
                    (service.child.stdin.take(), service.child.stdout.take(), service.child.stderr.take())
                else {
                    service.stop().await;
                    return Err("its pipes did not open".into());
                };
                tokio::spawn(keep_tail(slot.config.name.clone(), err_pipe, Arc::clone(&stderr)));
                let reader = CappedLines::new(stdout, MAX_MESSAGE_BYTES, Arc::clone(&flooded));
                match tokio::time::timeout(timeout, listener.serve((reader, stdin))).await {
                    Ok(Ok(running)) => {
                        Ok(Live { service: running, process: Some((service, workspace)), stderr, flooded, failures })
                    }
                    outcome => {
                        let mut why = match outcome {
                            Ok(Err(err)) => format!("its handshake failed ({err})"),
                            _ => format!("it did not answer the handshake within {} s", timeout.as_secs()),
                        };
                        // Its exit status and words say more than the handshake.
                        let _ = tokio::time::timeout(Duration::from_millis(200), service.child.wait()).await;
                        if let Ok(Some(status)) = service.child.try_wait() {
                            why = format!("it exited ({status})");
                        }
                        let tail = stderr_tail(&stderr);
                        if !tail.is_empty() {
                            why.push_str(&format!("; its last words: {tail}"));
                        }
                        service.stop().await;
                        Err(why)
                    }
                }
            }
            Transport::Http { url, headers } => {
                use rmcp::transport::streamable_http_client::{
                    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
                };
                let mut map = reqwest::header::HeaderMap::new();
                for (name, value) in headers {
                    if let (Ok(name), Ok(value)) = (
                        reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                        reqwest::header::HeaderValue::from_str(value),
                    ) {
                        map.insert(name, value);
                    }
                }
                // No redirects: a server may not send us (and its headers,
                // keys included) anywhere but the configured URL.
                let client = reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .default_headers(map)
                    .connect_timeout(timeout)
                    .build()
                    .map_err(|err| format!("cannot build its HTTP client: {err}"))?;
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.max_json_response_size = MAX_MESSAGE_BYTES;
                config.max_sse_event_size = MAX_MESSAGE_BYTES;
                let transport = StreamableHttpClientTransport::with_client(client, config);
                match tokio::time::timeout(timeout, listener.serve(transport)).await {
                    Ok(Ok(running)) => Ok(Live { service: running, process: None, stderr, flooded, failures }),
                    Ok(Err(err)) => {
                        // rmcp keeps the transport's error beside, not under, its own.
                        let why = match &err {
                            rmcp::service::ClientInitializeError::TransportError { error, .. } => {
                                type HttpError =
                                    rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>;
                                let inner: &(dyn std::error::Error + 'static) = &*error.error;
                                let client = match inner.downcast_ref::<HttpError>() {
                                    Some(HttpError::Client(client)) => Some(client),
                                    _ => None,
                                };
                                match client {
                                    Some(client) => root_cause(client),
                                    None => root_cause(inner),
                                }
                            }
                            other => root_cause(other),
                        };
                        Err(format!("its handshake at {url} failed: {why}"))
                    }
                    Err(_) => Err(format!("{url} did not answer the handshake within {} s", timeout.as_secs())),
                }
            }
        }
    }

    /// Calls `tool` of `server` with `arguments`, within the call timeout
    /// and `deadline` (the turn's); the answer is the model's sentence
    /// whatever happens.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        deadline: Option<Instant>,
    ) -> Answer {
        let Some(slot) = self.slot(server) else {
            return Answer::failed(format!("There is no MCP server called {server}."));
        };
        let peer = match self.peer(slot).await {
            Ok(peer) => peer,
            Err(why) => {
                self.count(server, tool, Outcome::Failed);
                return Answer::failed(format!("The MCP server {server} is not available: {why}."));
            }
        };
        let limit = self.limit(deadline);
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let (outcome, answer) = match tokio::time::timeout(limit, peer.call_tool(params)).await {
            Err(_) => (
                Outcome::Timeout,
                Answer::failed(format!(
                    "The MCP tool {tool} of {server} did not answer within {} s; it was abandoned.",
                    limit.as_secs()
                )),
            ),
            Ok(Err(err)) => {
                let why = self.failure(slot, &err).await;
                (Outcome::Failed, Answer::failed(format!("The MCP tool {tool} of {server} failed: {why}.")))
            }
            Ok(Ok(result)) => {
                let json = serde_json::to_value(&result).unwrap_or(Value::Null);
                let (text, ok) = result::tool_result(&json);
                self.reset_failures(slot).await;
                (if ok { Outcome::Ok } else { Outcome::Error }, Answer { text, ok, ..Answer::default() })
            }
        };
        self.count(server, tool, outcome);
        answer
    }

    /// `mcp_read_resource`.
    pub async fn read_resource(&self, server: &str, uri: &str, deadline: Option<Instant>) -> Answer {
        let Some(slot) = self.slot(server) else {
            return Answer::failed(format!("There is no MCP server called {server}."));
        };
        let peer = match self.peer(slot).await {
            Ok(peer) => peer,
            Err(why) => return Answer::failed(format!("The MCP server {server} is not available: {why}.")),
        };
        let limit = self.limit(deadline);
        match tokio::time::timeout(limit, peer.read_resource(ReadResourceRequestParams::new(uri.to_string()))).await {
            Err(_) => Answer::failed(format!("{server} did not return {uri} within {} s.", limit.as_secs())),
            Ok(Err(err)) => {
                let why = self.failure(slot, &err).await;
                Answer::failed(format!("{server} could not return {uri}: {why}."))
            }
            Ok(Ok(read)) => Answer::done(result::resource(&serde_json::to_value(&read).unwrap_or(Value::Null))),
        }
    }

    fn limit(&self, deadline: Option<Instant>) -> Duration {
        let left = deadline.map_or(self.settings.call_timeout, |d| d.saturating_duration_since(Instant::now()));
        self.settings.call_timeout.min(left)
    }

    /// Words for a failed request: the server's own error, or why its
    /// connection is gone.
    async fn failure(&self, slot: &Slot, err: &rmcp::ServiceError) -> String {
        use rmcp::ServiceError;
        match err {
            ServiceError::McpError(data) => return data.message.chars().take(500).collect(),
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {}
            other => return other.to_string(),
        }
        let mut conn = slot.conn.lock().await;
        if let Conn::Up(live) = &mut *conn {
            // A process that closed its pipes is exiting: its status says
            // more than the closed pipe, so wait a moment for it.
            if let Some((service, _)) = live.process.as_mut() {
                let _ = tokio::time::timeout(Duration::from_millis(500), service.child.wait()).await;
            }
        }
        match take_down(&slot.config.name, &mut conn).await {
            Some((why, wait)) => format!("{why}; it is started again in {} s", wait.as_secs_f64().ceil() as u64),
            None => err.to_string(),
        }
    }

    async fn reset_failures(&self, slot: &Slot) {
        if let Conn::Up(live) = &mut *slot.conn.lock().await {
            live.failures = 0;
        }
    }

    /// Every server as the operator sees it; `start` starts idle ones
    /// first (so their tools, resources and prompts are known).
    pub async fn report(&self, start: bool) -> Vec<ServerReport> {
        let mut reports = Vec::new();
        for slot in &self.slots {
            let catalog = if start { self.catalog(slot).await } else { None };
            let catalog = catalog.or_else(|| slot.catalog.lock().unwrap_or_else(|p| p.into_inner()).clone());
            let (state, error, peer) = {
                let conn = slot.conn.lock().await;
                match &*conn {
                    Conn::Idle => ("idle", None, None),
                    Conn::Up(live) if !live.service.is_closed() => ("up", None, Some(live.service.peer().clone())),
                    Conn::Up(_) => ("down", Some("the connection closed".to_string()), None),
                    Conn::Down { why, .. } => ("down", Some(why.clone()), None),
                }
            };
            let mut report = ServerReport {
                name: slot.config.name.clone(),
                transport: match slot.config.transport {
                    Transport::Stdio { .. } => "stdio",
                    Transport::Http { .. } => "http",
                },
                target: slot.config.target(),
                state,
                error,
                tools: Vec::new(),
                skipped_tools: Vec::new(),
                resources: Vec::new(),
                prompts: Vec::new(),
            };
            if let Some(catalog) = &catalog {
                report.tools = catalog.tools.iter().map(|t| t.declaration.name.clone()).collect();
                report.skipped_tools = catalog
                    .skipped
                    .iter()
                    .map(|(name, reason)| SkippedTool { name: name.clone(), reason: reason.clone() })
                    .collect();
                if let Some(peer) = peer {
                    let limit = self.settings.call_timeout;
                    if catalog.resources {
                        if let Ok(Ok(found)) = tokio::time::timeout(limit, peer.list_all_resources()).await {
                            report.resources = found.iter().filter_map(|r| serde_json::to_value(r).ok()).collect();
                        }
                    }
                    if catalog.prompts {
                        if let Ok(Ok(found)) = tokio::time::timeout(limit, peer.list_all_prompts()).await {
                            report.prompts = found.iter().filter_map(|p| serde_json::to_value(p).ok()).collect();
                        }
                    }
                }
            }
            reports.push(report);
        }
        reports
    }

    /// Stops every server (the server is shutting down).
    pub async fn shutdown(&self) {
        for slot in &self.slots {
            let mut conn = slot.conn.lock().await;
            if let Conn::Up(live) = std::mem::replace(&mut *conn, Conn::Idle) {
                live.stop().await;
            }
        }
    }
}

/// Ends a connection that is over: its process is stopped and the slot
/// waits out its back-off. Returns why, and the wait; `None` when the slot
/// held no connection.
async fn take_down(server: &str, conn: &mut Conn) -> Option<(String, Duration)> {
    let Conn::Up(mut live) = std::mem::replace(conn, Conn::Idle) else { return None };
    let why = live.why_gone();
    let failures = live.failures + 1;
    tracing::warn!(server = %server, reason = %why, failures, "an MCP server stopped");
    live.stop().await;
    let wait = backoff(failures);
    *conn = Conn::Down { retry_at: Instant::now() + wait, failures, why: why.clone() };
    Some((why, wait))
}

/// Keeps the last [`STDERR_TAIL_BYTES`] a server wrote to stderr, and logs
/// each line at debug.
async fn keep_tail(server: String, stderr: tokio::process::ChildStderr, tail: Arc<Mutex<String>>) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        // A bounded read: a line without an end is taken in pieces.
        match tokio::io::AsyncReadExt::take(&mut lines, STDERR_TAIL_BYTES as u64).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        tracing::debug!(server = %server, line = %text.trim_end(), "MCP server stderr");
        let mut kept = tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        kept.push_str(&text);
        if kept.len() > STDERR_TAIL_BYTES {
            let mut cut = kept.len() - STDERR_TAIL_BYTES;
            while !kept.is_char_boundary(cut) {
                cut += 1;
            }
            kept.drain(..cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_back_off_doubles_up_to_its_cap() {
        assert_eq!(backoff(1), FIRST_RESTART_BACKOFF);
        assert_eq!(backoff(2), FIRST_RESTART_BACKOFF * 2);
        assert_eq!(backoff(3), FIRST_RESTART_BACKOFF * 4);
        assert_eq!(backoff(40), MAX_RESTART_BACKOFF);
    }
}
