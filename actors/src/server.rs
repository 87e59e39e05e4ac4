//! `Server`: what the HTTP layer holds to reach the actors.

use ractor::{Actor, ActorRef};
use skillhost_engine::EngineConfig;
use tokio::sync::{mpsc, watch};

use std::sync::Arc;
use std::time::Duration;

use crate::artifacts::{ArtifactStore, Artifacts};
use crate::chat_loop::agents::{self, AgentStats};
use crate::chat_loop::{LoopMsg, LoopSettings, MultiAgent};
use crate::conversations::Conversations;
use crate::model::{Catalog, ModelBackend, ModelSource};
use crate::request::{ChatError, ChatEvent, ChatRequest};
use crate::sandbox::ExecRuntime;
use crate::skills::actor::SkillsMsg;
use crate::skills::install::InstallError;
use crate::skills::outcomes::SkillOutcomes;
use crate::skills::{Changes, SkillsConfig, SkillsError, Snapshot};
use crate::supervisor::{ModelStatus, ModelsView, Supervisor, SupervisorArgs, SupervisorMsg};
use crate::tools::mcp::config::McpServerConfig;
use crate::tools::mcp::hub::{HubSettings, McpHub};

/// How long a rescan may take before the caller gives up waiting.
const RESCAN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an install may take: a 256 MB archive on a slow disk.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// How long starting a request may wait for the supervisor beyond the wait
/// for its model (which the supervisor bounds by `--turn-timeout`): it
/// spawns each request's loop actor (and with it a workspace) in its
/// mailbox.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A cheap, clonable handle to the running actor system.
#[derive(Clone)]
pub struct Server {
    supervisor: ActorRef<SupervisorMsg>,
    status: watch::Receiver<Arc<ModelsView>>,
    /// How long a request may wait for its model, then to start.
    start_timeout: Duration,
    skills: Option<SkillsHandle>,
    exec: Option<Arc<ExecRuntime>>,
    /// The store of produced files, when commands may run.
    artifacts: Option<Artifacts>,
    /// Web UI conversations: ids issued here, and their workspaces.
    conversations: Arc<Conversations>,
    /// `skills_run` is offered (`--skills-allow-exec` with a way to run).
    allows_scripts: bool,
    /// `POST /mcp` offers `skills_run` too (`--mcp-serve-scripts`).
    serves_scripts: bool,
    agent_stats: Arc<AgentStats>,
    skill_outcomes: Arc<SkillOutcomes>,
    /// When requests may delegate to child agents (`--multi-agent`).
    multi_agent: MultiAgent,
    /// The operator's MCP servers, when any are configured.
    mcp: Option<Arc<McpHub>>,
}

/// What the server is started with.
#[derive(Debug)]
pub struct ServerConfig {
    /// The models it serves; the default one loads at start.
    pub models: Catalog,
    /// `None` turns skills off (`--no-skills`).
    pub skills: Option<SkillsConfig>,
    pub loop_settings: LoopSettings,
    /// Process execution; `None` when nothing may run.
    pub exec: Option<Arc<ExecRuntime>>,
    /// Where produced files are kept; with `exec`.
    pub artifacts: Option<ArtifactStore>,
    /// The operator's MCP servers (`--mcp-config`, `mcp-servers:`).
    pub mcp_servers: Vec<McpServerConfig>,
    /// How long one MCP tool call may run.
    pub mcp_call_timeout: Duration,
    /// `POST /mcp` offers `skills_run` (`--mcp-serve-scripts`).
    pub mcp_serve_scripts: bool,
}

impl ServerConfig {
    /// A server for a model file, with default loop settings.
    pub fn new(engine: EngineConfig, skills: Option<SkillsConfig>) -> Self {
        ServerConfig {
            models: Catalog::single(ModelSource::Load(engine)),
            skills,
            loop_settings: LoopSettings::default(),
            exec: None,
            artifacts: None,
            mcp_servers: Vec::new(),
            mcp_call_timeout: crate::tools::mcp::hub::DEFAULT_CALL_TIMEOUT,
            mcp_serve_scripts: false,
        }
    }
}

/// Reading and changing the skills registry.
#[derive(Clone)]
pub struct SkillsHandle {
    supervisor: ActorRef<SupervisorMsg>,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    /// Whether uploads have somewhere to go.
    pub installable: bool,
    install_dir: Option<std::path::PathBuf>,
    /// Selected for every request that names none (`--skill`).
    pub selected: Vec<String>,
    /// What the scan's findings stop; a request's own skills are judged as
    /// uploads are.
    policy: crate::skills::scan::Policies,
    /// The hosts installs by URL may fetch from (`--skills-install-domains`).
    pub install_domains: crate::skills::fetch::Domains,
    /// The skills `/.well-known/agent-skills/` lists (`--skills-publish`).
    pub publish: crate::skills::discovery::Publish,
    /// Their archives, packed once per loaded skill.
    pub packs: Arc<crate::skills::discovery::Packs>,
}

impl SkillsHandle {
    /// The registry as it is now; never waits for a scan.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }

    async fn actor(&self) -> Result<ActorRef<SkillsMsg>, SkillsError> {
        match ractor::call_t!(self.supervisor, SupervisorMsg::SkillsActor, 5_000) {
            Ok(Some(actor)) => Ok(actor),
            Ok(None) | Err(_) => Err(SkillsError::Unavailable("the skills registry is not running".into())),
        }
    }

    /// Scans the roots again and reports what changed.
    pub async fn rescan(&self) -> Result<Changes, SkillsError> {
        let actor = self.actor().await?;
        actor
            .call(|reply| SkillsMsg::Rescan(Some(reply)), Some(RESCAN_TIMEOUT))
            .await
            .ok()
            .and_then(|result| result.success_or(()).ok())
            .ok_or_else(|| SkillsError::Unavailable("the rescan did not finish".into()))
    }

    /// A file to stream an upload into: in the install folder (made on the
    /// first upload), so a large archive lands on the same disk as the
    /// skill it becomes and never in memory; its `.upload-` name keeps the
    /// watcher from reacting to it. Deleted when dropped.
    pub fn upload_file(&self) -> Result<tempfile::NamedTempFile, SkillsError> {
        let Some(dir) = &self.install_dir else {
            return Err(SkillsError::Forbidden("this server has no skills install folder, so uploads are off".into()));
        };
        let io = |err: std::io::Error| {
            SkillsError::Install(InstallError::Io(format!("cannot stage the upload in {}: {err}", dir.display())))
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        tempfile::Builder::new().prefix(".upload-").suffix(".zip").tempfile_in(dir).map_err(io)
    }

    /// Installs an uploaded archive; returns the skill's id.
    pub async fn install(&self, archive: std::fs::File, overwrite: bool) -> Result<String, SkillsError> {
        self.install_as(archive, overwrite, None).await
    }

    /// Installs an uploaded archive that must hold the skill `name` when
    /// one is given (a new version of it); returns the skill's id.
    pub async fn install_as(
        &self,
        archive: std::fs::File,
        overwrite: bool,
        name: Option<String>,
    ) -> Result<String, SkillsError> {
        let actor = self.actor().await?;
        actor
            .call(|reply| SkillsMsg::Install { archive, overwrite, name, reply }, Some(INSTALL_TIMEOUT))
            .await
            .ok()
            .and_then(|result| result.success_or(()).ok())
            .unwrap_or_else(|| Err(SkillsError::Unavailable("the install did not finish".into())))
    }

    /// Writes, loads and scans the skills a request brings, in a private
    /// folder that goes when the returned value drops. A name the registry
    /// holds is refused: a request may add skills, never replace one.
    pub async fn bring(
        &self,
        specs: Vec<crate::skills::inline::InlineSpec>,
    ) -> Result<Arc<crate::skills::inline::InlineSkills>, crate::skills::inline::InlineError> {
        use crate::skills::inline::{materialize, InlineError};
        let snapshot = self.snapshot();
        let policy = self.policy.installs;
        let work = move || {
            materialize(&specs, &std::env::temp_dir(), policy, &|name| snapshot.get(name).is_some()).map(Arc::new)
        };
        tokio::task::spawn_blocking(work)
            .await
            .unwrap_or_else(|err| Err(InlineError::Io(format!("the request's skills were not written: {err}"))))
    }

    /// An installed skill's versions, the newest first (read from the
    /// install folder; the registry is not asked).
    pub fn versions(&self, id: &str) -> Result<crate::skills::versions::History, SkillsError> {
        let snapshot = self.snapshot();
        let Some(skill) = snapshot.get(id) else {
            return Err(SkillsError::NotFound(format!("no skill named '{id}' is registered")));
        };
        match (&self.install_dir, skill.origin) {
            (Some(dir), crate::skills::Origin::Installed) => Ok(crate::skills::versions::history(dir, id)),
            _ => Err(SkillsError::NotFound(format!(
                "the skill '{id}' was discovered in {}, not installed; only installed skills have versions",
                skill.root.display()
            ))),
        }
    }

    /// The folder of one recorded version of an installed skill.
    pub fn version_folder(&self, id: &str, version: u32) -> Result<std::path::PathBuf, SkillsError> {
        let history = self.versions(id)?;
        match (&self.install_dir, history.versions.iter().any(|v| v.version == version)) {
            (Some(dir), true) => Ok(crate::skills::versions::folder(dir, id, version)),
            _ => Err(SkillsError::NotFound(format!("the skill '{id}' has no version {version}"))),
        }
    }

    /// Makes an earlier version of an installed skill live: `version`, else
    /// the newest before the live one. Answers the version now live.
    pub async fn rollback(&self, id: &str, version: Option<u32>) -> Result<u32, SkillsError> {
        let actor = self.actor().await?;
        let id = id.to_string();
        actor
            .call(|reply| SkillsMsg::Rollback { id, version, reply }, Some(RESCAN_TIMEOUT))
            .await
            .ok()
            .and_then(|result| result.success_or(()).ok())
            .unwrap_or_else(|| Err(SkillsError::Unavailable("the rollback did not finish".into())))
    }

    /// Removes an installed skill.
    pub async fn delete(&self, id: &str) -> Result<(), SkillsError> {
        let actor = self.actor().await?;
        let id = id.to_string();
        actor
            .call(|reply| SkillsMsg::Delete { id, reply }, Some(RESCAN_TIMEOUT))
            .await
            .ok()
            .and_then(|result| result.success_or(()).ok())
            .unwrap_or_else(|| Err(SkillsError::Unavailable("the delete did not finish".into())))
    }
}

/// A running chat request. Dropping it stops the request's actor, which
/// cancels its generation: this is how a client disconnect propagates.
pub struct ChatStream {
    pub events: mpsc::UnboundedReceiver<ChatEvent>,
    actor: ActorRef<LoopMsg>,
}

impl Drop for ChatStream {
    /// Killed, not stopped: a stop would wait for a running tool call (a
    /// shell command can take minutes). Killing drops the loop's state, which
    /// kills its command's process group, aborts its engine relay and deletes
    /// its workspace.
    fn drop(&mut self) {
        self.actor.kill();
    }
}

/// Why the actor system did not start. The caller does not serve: `serve`
/// and `chat` exit, naming the cause.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start the supervisor: {0}")]
    Supervisor(ractor::SpawnErr),
    /// The supervisor started but does not answer.
    #[error("cannot reach the supervisor: {0}")]
    Unreachable(String),
    /// The operator's `--skill` selection names skills the registry lacks:
    /// a typo, refused rather than silently selecting less.
    #[error("--skill {}: no such skill is registered; available: {}", unknown.join(", "), available_ids(available))]
    UnknownSkills { unknown: Vec<String>, available: Vec<String> },
}

fn available_ids(ids: &[String]) -> String {
    match ids.is_empty() {
        true => "none are registered".to_string(),
        false => ids.join(", "),
    }
}

impl Server {
    /// Starts the supervisor: the skills registry is scanned before this
    /// returns; the model loads in the background.
    pub async fn start(config: ServerConfig) -> Result<Server, StartError> {
        let initial = crate::supervisor::initial_view(&config.models);
        let (status_tx, status) = watch::channel(Arc::new(initial));
        let start_timeout = config.loop_settings.turn_timeout + START_TIMEOUT;
        let install_dir = config.skills.as_ref().and_then(|s| s.install_dir.clone());
        let installable = install_dir.is_some();
        let selected = config.skills.as_ref().map(|s| s.selected.clone()).unwrap_or_default();
        let policy = config.skills.as_ref().map(|s| s.policy).unwrap_or_default();
        let install_domains = config.skills.as_ref().map(|s| s.install_domains.clone()).unwrap_or_default();
        let publish = config.skills.as_ref().map(|s| s.publish.clone()).unwrap_or_default();
        let allows_scripts = config.loop_settings.allow_exec && config.exec.is_some();
        let serves_scripts = allows_scripts && config.mcp_serve_scripts;
        let (skills_args, snapshot) = match config.skills {
            Some(skills) => {
                let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
                (Some((skills, Arc::new(tx))), Some(rx))
            }
            None => (None, None),
        };
        let conversations = Arc::new(Conversations::default());
        let agent_stats = Arc::new(AgentStats::default());
        let skill_outcomes = Arc::new(SkillOutcomes::default());
        let multi_agent = config.loop_settings.multi_agent;
        let mcp = (!config.mcp_servers.is_empty()).then(|| {
            let settings = HubSettings {
                exec: config.exec.clone(),
                call_timeout: config.mcp_call_timeout,
                start_timeout: crate::tools::mcp::hub::START_TIMEOUT,
            };
            Arc::new(McpHub::new(config.mcp_servers, settings))
        });
        let args = SupervisorArgs {
            models: config.models,
            loop_settings: config.loop_settings,
            exec: config.exec.clone(),
            artifacts: config.artifacts,
            conversations: Arc::clone(&conversations),
            status: status_tx,
            skills: skills_args,
            agent_stats: Arc::clone(&agent_stats),
            skill_outcomes: Arc::clone(&skill_outcomes),
            mcp: mcp.clone(),
        };
        let (supervisor, _) = Actor::spawn(None, Supervisor, args).await.map_err(StartError::Supervisor)?;
        let artifacts = ractor::call_t!(supervisor, SupervisorMsg::Artifacts, 5_000)
            .map_err(|err| StartError::Unreachable(err.to_string()))?;
        let skills = snapshot.map(|snapshot| SkillsHandle {
            supervisor: supervisor.clone(),
            snapshot,
            installable,
            install_dir: install_dir.clone(),
            selected,
            policy,
            install_domains,
            publish,
            packs: Arc::default(),
        });
        // A default selection naming nothing registered is the operator's
        // typo: refused at start-up rather than silently selecting less.
        if let Some(skills) = &skills {
            let snapshot = skills.snapshot();
            let unknown: Vec<&str> =
                skills.selected.iter().map(String::as_str).filter(|id| snapshot.get(id).is_none()).collect();
            if !unknown.is_empty() {
                supervisor.stop(None);
                let unknown = unknown.into_iter().map(str::to_string).collect();
                let available = snapshot.ids().into_iter().map(str::to_string).collect();
                return Err(StartError::UnknownSkills { unknown, available });
            }
        }
        Ok(Server {
            supervisor,
            status,
            start_timeout,
            skills,
            exec: config.exec,
            artifacts,
            conversations,
            allows_scripts,
            serves_scripts,
            agent_stats,
            skill_outcomes,
            multi_agent,
            mcp,
        })
    }

    /// The operator's MCP servers, when any are configured.
    pub fn mcp(&self) -> Option<&Arc<McpHub>> {
        self.mcp.as_ref()
    }

    /// Process execution and artifacts, when offered.
    pub fn exec(&self) -> Option<&Arc<ExecRuntime>> {
        self.exec.as_ref()
    }

    /// The store of produced files, when commands may run.
    pub fn artifacts(&self) -> Option<&Artifacts> {
        self.artifacts.as_ref()
    }

    /// Web UI conversations.
    pub fn conversations(&self) -> &Conversations {
        &self.conversations
    }

    /// Counters of the agents requests started, for `/metrics`.
    pub fn agent_stats(&self) -> &AgentStats {
        &self.agent_stats
    }

    /// Each skill's counts: advertised, read, run, and how its turns ended.
    pub fn skill_outcomes(&self) -> &SkillOutcomes {
        &self.skill_outcomes
    }

    /// Whether the model may run skill scripts.
    pub fn allows_scripts(&self) -> bool {
        self.allows_scripts
    }

    /// How `POST /mcp` runs a client's `skills_run` call, when it offers it.
    pub fn script_runner(&self) -> Option<&Arc<ExecRuntime>> {
        self.exec.as_ref().filter(|_| self.serves_scripts)
    }

    /// The skills registry, when skills are on.
    pub fn skills(&self) -> Option<&SkillsHandle> {
        self.skills.as_ref()
    }

    /// The default model's status.
    pub fn status(&self) -> ModelStatus {
        self.status.borrow().default_status()
    }

    /// Every configured model's status, the default one first.
    pub fn models(&self) -> Arc<ModelsView> {
        self.status.borrow().clone()
    }

    /// The model a request names (the default for `None`), loaded first:
    /// a request for a model that is not loaded waits for it, bounded by
    /// `--turn-timeout`. An unknown name is [`ChatError::ModelNotFound`].
    pub async fn model(&self, name: Option<&str>) -> Result<Arc<dyn ModelBackend>, ChatError> {
        let model = name.map(str::to_string);
        match self.supervisor.call(|reply| SupervisorMsg::Backend { model, reply }, Some(self.start_timeout)).await {
            Ok(ractor::rpc::CallResult::Success(result)) => result,
            Ok(_) => Err(ChatError::Unavailable("the model did not become ready in time".into())),
            Err(err) => Err(ChatError::Unavailable(format!("the server is not accepting requests: {err}"))),
        }
    }

    /// Loads the named model now (an operator's request), trying again one
    /// whose last load failed; answers once it is ready.
    pub async fn load_model(&self, name: &str) -> Result<Arc<dyn ModelBackend>, ChatError> {
        let model = name.to_string();
        match self.supervisor.call(|reply| SupervisorMsg::Load { model, reply }, Some(self.start_timeout)).await {
            Ok(ractor::rpc::CallResult::Success(result)) => result,
            Ok(_) => Err(ChatError::Unavailable("the model did not become ready in time".into())),
            Err(err) => Err(ChatError::Unavailable(format!("the server is not accepting requests: {err}"))),
        }
    }

    /// Unloads the named model now, unless turns are running on it.
    pub async fn unload_model(&self, name: &str) -> Result<(), ChatError> {
        let model = name.to_string();
        match self.supervisor.call(|reply| SupervisorMsg::Unload { model, reply }, Some(self.start_timeout)).await {
            Ok(ractor::rpc::CallResult::Success(result)) => result,
            Ok(_) => Err(ChatError::Unavailable("the server did not answer in time".into())),
            Err(err) => Err(ChatError::Unavailable(format!("the server is not accepting requests: {err}"))),
        }
    }

    /// Waits until the default model is ready or failed to load.
    pub async fn wait_until_loaded(&self) -> ModelStatus {
        let mut status = self.status.clone();
        loop {
            let current = status.borrow_and_update().default_status();
            if !matches!(current, ModelStatus::Loading | ModelStatus::Unloaded) {
                return current;
            }
            if status.changed().await.is_err() {
                return current;
            }
        }
    }

    /// A request names only configured MCP servers: a typo is refused
    /// rather than silently offering less, and a request never makes the
    /// server connect anywhere the operator did not configure.
    fn check_mcp(&self, selection: &crate::tools::mcp::McpSelection) -> Result<(), ChatError> {
        let configured = self.mcp.as_ref().map(|hub| hub.names()).unwrap_or_default();
        let named = selection.servers.iter().flatten().chain(selection.allowed_tools.keys());
        if let Some(unknown) = named.into_iter().find(|name| !configured.contains(name)) {
            let known = if configured.is_empty() { "none are configured".to_string() } else { configured.join(", ") };
            return Err(ChatError::BadRequest(format!(
                "mcp_servers: there is no MCP server called '{unknown}' on this server; the configured ones: {known}"
            )));
        }
        Ok(())
    }

    /// Starts a chat request.
    pub async fn chat(&self, mut request: ChatRequest) -> Result<ChatStream, ChatError> {
        self.check_mcp(&request.mcp)?;
        if let Some(skills) = self.skills.as_ref().filter(|_| request.skills.is_empty()) {
            // The operator's selection; one removed by a rescan since start-up
            // is dropped (the prompt never names a skill that is not there).
            let snapshot = skills.snapshot();
            request.skills = skills.selected.iter().filter(|id| snapshot.get(id).is_some()).cloned().collect();
        }
        let (events_tx, events) = mpsc::unbounded_channel();
        let result = self
            .supervisor
            .call(
                |reply| SupervisorMsg::StartChat { request: Box::new(request), events: events_tx, reply },
                Some(self.start_timeout),
            )
            .await;
        match result {
            Ok(ractor::rpc::CallResult::Success(Ok(actor))) => Ok(ChatStream { events, actor }),
            Ok(ractor::rpc::CallResult::Success(Err(err))) => Err(err),
            Ok(_) => Err(ChatError::Unavailable("the model did not become ready in time".into())),
            Err(err) => Err(ChatError::Unavailable(format!("the server is not accepting requests: {err}"))),
        }
    }

    /// Tokens the request's own messages and tools make as a prompt, in
    /// the model's chat format (Anthropic's `count_tokens`). The skills
    /// block the loop adds is not counted: it is the server's, not the
    /// client's.
    pub async fn count_tokens(&self, request: &ChatRequest) -> Result<usize, ChatError> {
        let backend = self.model(request.model.as_deref()).await?;
        // The coordination tools are declared on the requests that delegate
        // (none of them when the caller brings one of its own).
        let mut tools = request.tools.clone();
        let clash = request.tools.iter().any(|t| crate::tools::agents::NAMES.contains(&t.name.as_str()));
        let capable = backend.info().format.capabilities().tools;
        if !clash && agents::delegates(self.multi_agent, request, !request.tools.is_empty(), capable) {
            tools.extend(crate::tools::agents::declarations(false, false));
        }
        let conversation = skillhost_engine::Conversation {
            messages: &request.messages,
            tools: &tools,
            tool_choice: &request.tool_choice,
            parallel_tool_calls: request.parallel_tool_calls,
            response_format: &request.response_format,
        };
        let prepared =
            backend.info().format.prepare(&conversation).map_err(|err| ChatError::BadRequest(err.to_string()))?;
        backend.count_tokens(prepared.text).await.map_err(|err| ChatError::Engine(err.to_string()))
    }

    /// Makes the engine thread panic (for tests of recovery).
    pub fn inject_engine_panic(&self) {
        let _ = self.supervisor.cast(SupervisorMsg::InjectEnginePanic);
    }

    /// Stops the actor system.
    pub fn shutdown(&self) {
        self.supervisor.stop(None);
    }
}
