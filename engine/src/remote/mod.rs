//! Upstream engines: generation sent to other inference servers
//! (llama-server, vLLM, SGLang, TGI, Ollama, OpenAI) instead of a model
//! loaded here. [`Remote`] is the handle, shaped like [`crate::Engine`]:
//! the loop, skills and tools in front are the same.
//!
//! In `completion` mode the prompt is rendered here, with the same chat
//! template as the local engine, and sent as raw text, so every round's
//! prompt continues the last one byte for byte and the upstream's prefix
//! cache is hit; tool calls are parsed here and grammars are sent along.
//! In `chat` mode the messages and tool declarations are sent instead, and
//! calls come back as data.
//!
//! Each request runs on a thread of its own (blocking HTTP with `ureq`):
//! it takes a place on an upstream, streams the answer into the request's
//! event channel, and retries on another upstream when one fails before
//! the first token. A health thread probes every upstream.

pub(crate) mod fleet;
pub(crate) mod wire;

use std::io::BufReader;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::error::EngineError;
use crate::format::ChatFormat;
use crate::protocol::{EngineStats, GenerateRequest, GenerationEvent, ModelInfo, Submitted, DEFAULT_MAX_CTX};
use crate::sampling::CompiledGrammar;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;
pub use fleet::{affinity_key, UpstreamStats, BACKPRESSURE_WAIT, DEFAULT_RETRY_AFTER, MAX_RETRY_AFTER};
use fleet::{Fleet, Lease, Tried};
pub use wire::{Dialect, MAX_ANSWER_BYTES, MAX_EVENT_BYTES, MAX_STREAMED_CALLS};
use wire::{Step, StreamReader};

/// How long connecting to an upstream may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest an upstream may be silent in the middle of a request: a
/// long prefill on a CPU upstream sends nothing for a while, but not this long.
pub const READ_TIMEOUT: Duration = Duration::from_secs(600);
/// How often each upstream's health is checked.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// How long one health check may take.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long start-up waits for an upstream to answer (one may still be
/// loading its model).
pub const START_TIMEOUT: Duration = Duration::from_secs(180);
/// The largest error body read from an upstream, for its message.
const ERROR_BODY_BYTES: u64 = 64 * 1024;
/// The largest `/props` or `/v1/models` answer read.
const PROBE_BODY_BYTES: u64 = 4 * 1024 * 1024;

/// How an upstream is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamMode {
    /// Raw prompts rendered here.
    #[default]
    Completion,
    /// Messages and tools, rendered by the upstream.
    Chat,
}

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpstreamConfig {
    /// Its base URL, without the API path (`http://10.0.0.5:8080`).
    pub url: String,
    pub mode: UpstreamMode,
    /// Sent as `Authorization: Bearer`.
    pub api_key: Option<String>,
    /// The `model` field its requests carry, for servers that serve several.
    pub model: Option<String>,
    /// Its share of conversations relative to the others (at least 1).
    pub weight: u32,
    /// Requests it runs at once at most; more wait or go elsewhere.
    pub max_concurrent: Option<u32>,
    /// Speak only the OpenAI API to it, even when it is a llama-server
    /// (whose `/props` still gives the template).
    pub openai_api: bool,
}

/// How a request's upstream is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// A conversation goes to its home upstream (rendezvous hashing of its
    /// opening), where its prefix is cached.
    #[default]
    Affinity,
    /// Each request to the next upstream in turn, as a plain load balancer
    /// does (for upstreams behind their own cache-aware router).
    RoundRobin,
}

/// A fleet of upstreams in place of a model file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RemoteConfig {
    pub upstreams: Vec<UpstreamConfig>,
    pub routing: Routing,
    /// A GGUF whose chat template (and vocabulary, for counting tokens) is
    /// used; only its metadata and vocabulary are read, never its weights.
    pub template_from: Option<PathBuf>,
    /// A built-in format by name, when no template is known.
    pub template_format: Option<String>,
    /// The context per request; `None` takes the upstreams' (the smallest).
    pub n_ctx: Option<u32>,
    /// The name requests use for it (a `models:` entry's); `None` takes the
    /// upstream's model, or `--template-from`'s.
    pub name: Option<String>,
    /// Other names requests may use for it.
    pub aliases: Vec<String>,
}

/// A handle to the fleet; cheap to clone.
#[derive(Clone)]
pub struct Remote {
    fleet: Arc<Fleet>,
    agent: ureq::Agent,
    info: Arc<ModelInfo>,
    stats: Arc<EngineStats>,
    /// The vocabulary of `--template-from`, for counting tokens here.
    tokenizer: Option<Arc<Tokenizer>>,
    bos: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("model", &self.info.id).field("upstreams", &self.fleet.upstreams.len()).finish()
    }
}

/// What a probe learned from one upstream.
#[derive(Debug, Default)]
struct Probe {
    /// llama-server's `/props`: its template and tokens.
    template: Option<String>,
    bos: String,
    eos: String,
    n_ctx: Option<u32>,
    model: Option<String>,
}

impl Remote {
    /// Probes the upstreams until one answers and the chat format is known,
    /// then starts the health thread. Blocking.
    pub fn start(config: RemoteConfig) -> Result<Remote, EngineError> {
        let names = config.upstreams.iter().map(|u| u.url.as_str()).collect::<Vec<_>>().join(", ");
        let fail = |reason: String| EngineError::Load { path: names.clone(), reason };
        if config.upstreams.is_empty() {
            return Err(fail("no upstream is configured".into()));
        }
        let agent = agent(Some(READ_TIMEOUT));
        let probe_agent = agent_for_probes();
        let fleet = Arc::new(Fleet::new(config.upstreams.clone(), config.routing));
        let local = match &config.template_from {
            Some(path) => Some(crate::load::vocabulary(path)?),
            None => None,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        let needs_template = fleet.upstreams.iter().any(|u| u.mode() == UpstreamMode::Completion)
            && local.is_none()
            && config.template_format.is_none();
        let mut learned = Probe::default();
        let mut errors: Vec<String>;
        loop {
            errors = Vec::new();
            for (index, upstream) in fleet.upstreams.iter().enumerate() {
                match probe(&probe_agent, upstream) {
                    Ok(found) => {
                        fleet.set_up(index, true, "");
                        if learned.template.is_none() && found.template.is_some() {
                            learned.template = found.template;
                            learned.bos = found.bos;
                            learned.eos = found.eos;
                        }
                        learned.n_ctx = match (learned.n_ctx, found.n_ctx) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        learned.model = learned.model.or(found.model);
                    }
                    Err(err) => errors.push(format!("{} ({err})", upstream.config.url)),
                }
            }
            let any_up = fleet.upstreams.iter().any(|u| u.is_up());
            if any_up && (!needs_template || learned.template.is_some()) {
                break;
            }
            if Instant::now() >= deadline {
                let reason = if any_up {
                    "completion mode needs the model's chat template, and no upstream serves llama-server's /props: pass --template-from MODEL.gguf or --template-format NAME".to_string()
                } else {
                    format!("no upstream answered within {} s: {}", START_TIMEOUT.as_secs(), errors.join(", "))
                };
                return Err(fail(reason));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        for err in &errors {
            tracing::warn!(upstream = %err, "an upstream is not up yet; it is used once its health check passes");
        }
        let all_chat = fleet.upstreams.iter().all(|u| u.mode() == UpstreamMode::Chat);
        let any_chat = fleet.upstreams.iter().any(|u| u.mode() == UpstreamMode::Chat);
        let (local_info, tokenizer) = match local {
            Some((info, tokenizer)) => (Some(info), Some(tokenizer)),
            None => (None, None),
        };
        let (bos, eos) = match &local_info {
            Some(info) => (info.format.template().bos_token().to_string(), String::new()),
            None => (learned.bos.clone(), learned.eos.clone()),
        };
        let fallback_id = fleet
            .upstreams
            .iter()
            .find_map(|u| u.config.model.clone())
            .or(learned.model.clone())
            .unwrap_or_else(|| "upstream".into());
        let (id, architecture, n_ctx_train, n_params, size_bytes, local_format) = match local_info {
            Some(ModelInfo { id, architecture, n_ctx_train, n_params, size_bytes, format, .. }) => {
                (id, architecture, n_ctx_train, n_params, size_bytes, Some(format))
            }
            None => (fallback_id, String::new(), 0, 0, 0, None),
        };
        let id = config.name.clone().unwrap_or(id);
        let format = if all_chat {
            ChatFormat::upstream_chat()
        } else {
            let format = match (local_format, &config.template_format, &learned.template) {
                (Some(format), _, _) => Ok(format),
                (None, Some(name), _) => ChatTemplate::named(name, &bos, &eos).map(ChatFormat::new),
                (None, None, Some(text)) => ChatTemplate::for_model(Some(text), "", &bos, &eos).map(ChatFormat::new),
                (None, None, None) => ChatTemplate::for_model(None, "", &bos, &eos).map(ChatFormat::new),
            };
            format.map(|f| if any_chat { f.passing_conversation() } else { f })
        }
        .map_err(|err| fail(format!("its chat template does not compile: {err}")))?;
        let n_ctx = config.n_ctx.or(learned.n_ctx).unwrap_or(DEFAULT_MAX_CTX);
        let n_parallel = fleet.upstreams.iter().map(|u| u.config.max_concurrent.unwrap_or(1)).sum();
        let info = ModelInfo {
            id,
            path: PathBuf::from(&names),
            architecture,
            n_ctx,
            n_ctx_train,
            n_parallel,
            n_params,
            size_bytes,
            kv_bytes: 0,
            format,
            embedding: false,
            n_embd: 0,
        };
        let stats = Arc::new(EngineStats {
            upstreams: fleet.upstreams.iter().map(|u| Arc::clone(&u.stats)).collect(),
            ..EngineStats::default()
        });
        spawn_health_checks(Arc::downgrade(&fleet), probe_agent);
        tracing::info!(
            upstreams = %names,
            template = %info.format.capabilities().template,
            n_ctx,
            "generation goes to upstream servers"
        );
        Ok(Remote { fleet, agent, info: Arc::new(info), stats, tokenizer, bos })
    }

    pub fn info(&self) -> &Arc<ModelInfo> {
        &self.info
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    /// Sends a request to an upstream. Returns once one accepted it (its
    /// answer's headers arrived), so a prompt past its context comes back
    /// here as [`EngineError::PromptTooLong`], as with the local engine.
    pub async fn submit(&self, request: GenerateRequest) -> Result<Submitted, EngineError> {
        if request.prompt.is_empty() && request.chat.is_none() {
            return Err(EngineError::EmptyPrompt);
        }
        let grammar = match &request.grammar {
            Some(spec) => Some(crate::engine::convert_grammar(spec.clone()).await?),
            None => None,
        };
        let (events, receiver) = mpsc::unbounded_channel();
        let (accepted, accepted_rx) = oneshot::channel();
        let job = Job {
            fleet: Arc::clone(&self.fleet),
            agent: self.agent.clone(),
            request,
            grammar,
            bos: self.bos.clone(),
            events,
            accepted: Some(accepted),
        };
        std::thread::Builder::new()
            .name("upstream".into())
            .spawn(move || job.run())
            .map_err(|err| EngineError::Upstream(format!("cannot start the upstream request: {err}")))?;
        accepted_rx.await.map_err(|_| EngineError::Stopped)??;
        Ok(Submitted { events: receiver, n_prompt: 0, generated: Default::default() })
    }

    /// Tokens in `text`: counted with `--template-from`'s vocabulary, else
    /// by a llama-server upstream's `/tokenize`, else estimated at four
    /// bytes a token.
    pub async fn count_tokens(&self, text: String) -> Result<usize, EngineError> {
        if let Some(tokenizer) = &self.tokenizer {
            let tokenizer = Arc::clone(tokenizer);
            return tokio::task::spawn_blocking(move || tokenizer.prompt(&text).len())
                .await
                .map_err(|_| EngineError::Stopped);
        }
        let fleet = Arc::clone(&self.fleet);
        let agent = self.agent.clone();
        tokio::task::spawn_blocking(move || {
            let estimate = text.len().div_ceil(4);
            let Some(upstream) =
                fleet.upstreams.iter().find(|u| u.is_up() && u.dialect.get() == Some(&Dialect::LlamaServer))
            else {
                return estimate;
            };
            let body = json!({"content": text, "add_special": true, "parse_special": true});
            post_json(&agent, upstream, "/tokenize", &body)
                .ok()
                .and_then(|v| v.get("tokens").and_then(Value::as_array).map(Vec::len))
                .unwrap_or(estimate)
        })
        .await
        .map_err(|_| EngineError::Stopped)
    }
}

/// One request's run across upstreams.
struct Job {
    fleet: Arc<Fleet>,
    agent: ureq::Agent,
    request: GenerateRequest,
    grammar: Option<CompiledGrammar>,
    bos: String,
    events: mpsc::UnboundedSender<GenerationEvent>,
    /// Answered once an upstream accepts the request (or none can).
    accepted: Option<oneshot::Sender<Result<(), EngineError>>>,
}

/// How one attempt on one upstream ended.
enum Attempt {
    /// Finished, or the client left.
    Over,
    /// Failed before anything reached the client: try another upstream.
    Retry,
    /// Paused by the upstream: try again (it or another).
    Paused,
}

impl Job {
    fn run(mut self) {
        // Relaying wakes this thread once a token; as batch work it keeps
        // its share of CPU but does not preempt the decoding threads of an
        // upstream on the same machine (as the server's other threads).
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        let mut tried = Tried::new();
        loop {
            let gone = || self.events.is_closed();
            let lease = match self.fleet.acquire(self.request.affinity, &tried, &gone) {
                Ok(lease) => lease,
                Err(err) => return self.fail(err),
            };
            match self.attempt(&lease) {
                Attempt::Over => return,
                Attempt::Paused => {}
                Attempt::Retry => {
                    lease.upstream().stats.retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tried.failed.push(lease.index);
                }
            }
        }
    }

    /// Ends the request with `err`: at submit when nothing was accepted yet.
    fn fail(&mut self, err: EngineError) {
        match self.accepted.take() {
            Some(accepted) => {
                let _ = accepted.send(Err(err));
            }
            None => {
                let _ = self.events.send(GenerationEvent::Failed(err));
            }
        }
    }

    fn attempt(&mut self, lease: &Lease) -> Attempt {
        use std::sync::atomic::Ordering::Relaxed;
        let upstream = lease.upstream();
        let url = &upstream.config.url;
        let Some(&dialect) = upstream.dialect.get() else {
            // Not probed yet (it was down at start-up): the health thread
            // learns its dialect before it is marked up, so this is rare.
            return Attempt::Retry;
        };
        let dialect = match (dialect, upstream.mode()) {
            (_, UpstreamMode::Chat) => Dialect::OpenAiChat,
            (Dialect::LlamaServer, UpstreamMode::Completion) if upstream.config.openai_api => {
                Dialect::OpenAiCompletions
            }
            (d, UpstreamMode::Completion) => d,
        };
        // `add_special_tokens: false` tells an OpenAI-dialect server not to
        // add BOS; llama-server's own dialect must be given the prompt without.
        let strip = (dialect == Dialect::LlamaServer && *upstream.adds_bos.get().unwrap_or(&false))
            .then_some(self.bos.as_str());
        let body = wire::body(dialect, &self.request, self.grammar.as_ref(), upstream.config.model.as_deref(), strip);
        tracing::trace!(upstream = %url, path = dialect.path(), %body, "upstream request");
        let started = Instant::now();
        let response = match post(&self.agent, upstream, dialect.path()).send(body.to_string()) {
            Ok(response) => response,
            Err(err) => {
                upstream.stats.errors.fetch_add(1, Relaxed);
                self.fleet.set_up(lease.index, false, &format!("the request failed: {err}"));
                return Attempt::Retry;
            }
        };
        let status = response.status().as_u16();
        if status == 429 || status == 503 {
            let pause = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(DEFAULT_RETRY_AFTER, Duration::from_secs);
            self.fleet.pause(lease.index, pause);
            return Attempt::Paused;
        }
        if status != 200 {
            let message = error_message(response);
            upstream.stats.errors.fetch_add(1, Relaxed);
            if (400..500).contains(&status) {
                let err =
                    too_long(&message).unwrap_or_else(|| EngineError::UpstreamRefused(format!("{url}: {message}")));
                self.fail(err);
                return Attempt::Over;
            }
            self.fleet.set_up(lease.index, false, &format!("it answered {status}: {message}"));
            return Attempt::Retry;
        }
        if let Some(accepted) = self.accepted.take() {
            if accepted.send(Ok(())).is_err() {
                return Attempt::Over;
            }
        }
        let mut reader = BufReader::new(response.into_body().into_reader());
        let mut stream = StreamReader::new(dialect, started);
        let mut line = Vec::new();
        let mut sent_any = false;
        loop {
            let step = match stream.next(&mut reader, &mut line) {
                Ok(Some(step)) => step,
                Ok(None) => return self.broken(lease, "it closed the stream before the answer ended".into(), sent_any),
                Err(err) => return self.broken(lease, err.to_string(), sent_any),
            };
            match step {
                Step::Nothing => {}
                Step::Text(text) if text.is_empty() => {}
                Step::Text(text) => {
                    if !sent_any {
                        sent_any = true;
                        let us = started.elapsed().as_micros() as u64;
                        upstream.stats.first_token_us.fetch_add(us, Relaxed);
                        upstream.stats.first_tokens.fetch_add(1, Relaxed);
                    }
                    if self.events.send(GenerationEvent::Text(text)).is_err() {
                        // The client left: dropping the response closes the
                        // connection, and the upstream stops generating.
                        return Attempt::Over;
                    }
                }
                Step::Done { reason, calls, timings } => {
                    if !calls.is_empty() {
                        let _ = self.events.send(GenerationEvent::ToolCalls(calls));
                    }
                    let _ = self.events.send(GenerationEvent::Finished { reason, timings });
                    return Attempt::Over;
                }
            }
        }
    }

    /// The stream broke: before any text, the request goes to another
    /// upstream; after some, it ends with an error (the client has part of
    /// an answer no other upstream can continue). Either way the upstream
    /// is marked down until its health check passes.
    fn broken(&mut self, lease: &Lease, reason: String, sent_any: bool) -> Attempt {
        let upstream = lease.upstream();
        upstream.stats.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.fleet.set_up(lease.index, false, &reason);
        if !sent_any {
            return Attempt::Retry;
        }
        let message = format!("the upstream {} failed in the middle of the answer: {reason}", upstream.config.url);
        let _ = self.events.send(GenerationEvent::Failed(EngineError::Upstream(message)));
        Attempt::Over
    }
}

/// llama-server's `exceed_context_size_error`, as the local engine's error.
fn too_long(message: &str) -> Option<EngineError> {
    let body: Value = serde_json::from_str(message).ok()?;
    let error = body.get("error")?;
    if error.get("type").and_then(Value::as_str) != Some("exceed_context_size_error") {
        return None;
    }
    let n = |key: &str| error.get(key).and_then(Value::as_u64).map(|n| n as usize);
    Some(EngineError::PromptTooLong { n_prompt: n("n_prompt_tokens")?, n_ctx: n("n_ctx")? })
}

/// The body of an error answer, bounded.
fn error_message(response: ureq::http::Response<ureq::Body>) -> String {
    let status = response.status();
    let text = response.into_body().with_config().limit(ERROR_BODY_BYTES).read_to_string().unwrap_or_default();
    if text.trim().is_empty() {
        return status.to_string();
    }
    text.trim().to_string()
}

fn agent(read_timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(read_timeout)
        .build()
        .into()
}

fn agent_for_probes() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(HEALTH_TIMEOUT)).build().into()
}

/// A call to `upstream` with its key, when it has one.
fn with_key<B>(call: ureq::RequestBuilder<B>, upstream: &fleet::Upstream) -> ureq::RequestBuilder<B> {
    match &upstream.config.api_key {
        Some(key) => call.header("authorization", format!("Bearer {key}")),
        None => call,
    }
}

/// A JSON `POST` to `path` of `upstream`.
fn post(
    agent: &ureq::Agent,
    upstream: &fleet::Upstream,
    path: &str,
) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
    with_key(agent.post(format!("{}{path}", upstream.config.url)), upstream).header("content-type", "application/json")
}

/// Why an upstream's answer to a probe or a health check is not usable: the
/// upstream is marked down with this reason, and a start-up with none up
/// names it.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// No answer: refused, timed out, or cut off.
    #[error("{0}")]
    Transport(ureq::Error),
    #[error("it answered {0}")]
    Status(ureq::http::StatusCode),
    #[error("its answer is not JSON ({0})")]
    NotJson(serde_json::Error),
    /// Neither llama-server's `/props` nor OpenAI's `/v1/models` answered.
    #[error("/props: {props}; /v1/models: {models}")]
    Neither { props: Box<ProbeError>, models: Box<ProbeError> },
    /// `/props` answered, but not as llama-server, and `/v1/models` failed.
    #[error("/v1/models: {0}")]
    Models(Box<ProbeError>),
}

fn get_json(agent: &ureq::Agent, upstream: &fleet::Upstream, path: &str) -> Result<Value, ProbeError> {
    let response = with_key(agent.get(format!("{}{path}", upstream.config.url)), upstream)
        .call()
        .map_err(ProbeError::Transport)?;
    read_json(response)
}

fn post_json(agent: &ureq::Agent, upstream: &fleet::Upstream, path: &str, body: &Value) -> Result<Value, ProbeError> {
    let response = post(agent, upstream, path).send(body.to_string()).map_err(ProbeError::Transport)?;
    read_json(response)
}

fn read_json(response: ureq::http::Response<ureq::Body>) -> Result<Value, ProbeError> {
    let status = response.status();
    if status != 200 {
        return Err(ProbeError::Status(status));
    }
    let text =
        response.into_body().with_config().limit(PROBE_BODY_BYTES).read_to_string().map_err(ProbeError::Transport)?;
    serde_json::from_str(&text).map_err(ProbeError::NotJson)
}

/// Learns how to talk to an upstream: llama-server answers `/props` (its
/// template, tokens and context); anything else OpenAI-compatible answers
/// `/v1/models`.
fn probe(agent: &ureq::Agent, upstream: &fleet::Upstream) -> Result<Probe, ProbeError> {
    let props = get_json(agent, upstream, "/props");
    if let Ok(props) = &props {
        if props.get("chat_template").is_some() || props.get("default_generation_settings").is_some() {
            let text = |key: &str| props.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
            let n_ctx = props
                .pointer("/default_generation_settings/n_ctx")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok());
            let model = props.get("model_alias").and_then(Value::as_str).map(model_name);
            // llama-server adds BOS itself when the model wants one, even
            // before a rendered BOS: an empty prompt tokenizes to it alone.
            let adds_bos = post_json(agent, upstream, "/tokenize", &json!({"content": "", "add_special": true}))
                .ok()
                .and_then(|v| v.get("tokens").and_then(Value::as_array).map(|t| !t.is_empty()))
                .unwrap_or(false);
            let _ = upstream.adds_bos.set(adds_bos);
            let _ = upstream.dialect.set(Dialect::LlamaServer);
            let template = Some(text("chat_template"));
            return Ok(Probe { template, bos: text("bos_token"), eos: text("eos_token"), n_ctx, model });
        }
    }
    let models = get_json(agent, upstream, "/v1/models").map_err(|err| match props {
        Err(props) => ProbeError::Neither { props: Box::new(props), models: Box::new(err) },
        Ok(_) => ProbeError::Models(Box::new(err)),
    })?;
    let _ = upstream.dialect.set(match upstream.mode() {
        UpstreamMode::Completion => Dialect::OpenAiCompletions,
        UpstreamMode::Chat => Dialect::OpenAiChat,
    });
    let model = models.pointer("/data/0/id").and_then(Value::as_str).map(String::from);
    Ok(Probe { model, ..Probe::default() })
}

/// A served model's name from its path (`models/x.gguf` → `x`).
fn model_name(alias: &str) -> String {
    let base = alias.rsplit('/').next().unwrap_or(alias);
    base.strip_suffix(".gguf").unwrap_or(base).to_string()
}

/// Checks every upstream every [`HEALTH_INTERVAL`] until the fleet is gone.
fn spawn_health_checks(fleet: Weak<Fleet>, agent: ureq::Agent) {
    let spawned = std::thread::Builder::new().name("upstream-health".into()).spawn(move || loop {
        std::thread::sleep(HEALTH_INTERVAL);
        let Some(fleet) = fleet.upgrade() else { return };
        // All at once: one upstream that hangs until the timeout must not
        // delay the others' checks.
        std::thread::scope(|scope| {
            for (index, upstream) in fleet.upstreams.iter().enumerate() {
                let (fleet, agent) = (&fleet, &agent);
                scope.spawn(move || {
                    let result = match upstream.dialect.get() {
                        None => probe(agent, upstream).map(|_| ()),
                        Some(dialect) => get_json(agent, upstream, dialect.health_path()).map(|_| ()),
                    };
                    match result {
                        Ok(()) => fleet.set_up(index, true, ""),
                        Err(err) => fleet.set_up(index, false, &format!("its health check failed: {err}")),
                    }
                });
            }
        });
    });
    if let Err(err) = spawned {
        tracing::error!("cannot start the upstream health checks: {err}");
    }
}
