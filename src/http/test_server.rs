//! `TestServer`: the one way the route tests build a server. It starts the
//! actor system on a scripted model (or the real one) with the skills, loop
//! settings, sandbox and keys a test names, and wraps it in the state that
//! `serve` builds, through [`setup::app_state`]; the tests then drive the
//! app that [`crate::http::configure`] builds, in process.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use skillhost_actors::artifacts::{ArtifactLimits, ArtifactStore};
use skillhost_actors::chat_loop::LoopSettings;
use skillhost_actors::model::scripted::{ScriptedBackend, ScriptedOutput};
use skillhost_actors::model::{Catalog, ModelSource};
use skillhost_actors::sandbox::interpreters::Interpreters;
use skillhost_actors::sandbox::launch::Launcher;
use skillhost_actors::sandbox::{ExecRuntime, ExecSettings};
use skillhost_actors::skills::versions::DEFAULT_KEEP_VERSIONS;
use skillhost_actors::skills::{Origin, Root, SkillsConfig};
use skillhost_actors::store::Store;
use skillhost_actors::tools::mcp::config::McpServerConfig;
use skillhost_actors::workspace::uids::{UidPool, DEFAULT_UID_RANGE};
use skillhost_actors::workspace::WorkspaceOptions;
use skillhost_actors::{ModelStatus, Server, ServerConfig};
use skillhost_engine::EngineConfig;

use crate::config::AccessConfig;
use crate::http::access::{Access, Admission};
use crate::http::AppState;
use crate::setup::{self, AppOptions, StartupError};

/// The chat template of the scripted model: ChatML, whose tool calls the
/// `llama` family's parser reads.
pub(crate) const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The scripted model's context, in tokens.
const SCRIPTED_CTX: u32 = 8192;

/// The small default model that `make model` fetches.
pub(crate) fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run `make model`", path.display());
    path
}

/// The real `skillhost` binary, which cargo builds next to the test
/// binaries: the sandbox helper.
pub(crate) fn helper() -> PathBuf {
    let binary = helper_path();
    assert!(binary.exists(), "{} is missing: cargo builds it for the integration tests", binary.display());
    binary
}

fn helper_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("the target folder").join("skillhost-sandbox")
}

/// The store in `dir`, once the server a test stopped on it has let go: a
/// turn's last write (the Web UI saves its end after the last frame) may
/// still hold it for a moment. Bounded; a store still locked after that
/// fails as `serve` would.
pub(crate) async fn open_when_free(dir: &Path) -> Result<Store, skillhost_actors::store::StoreError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match Store::open(dir, Default::default()) {
            Err(skillhost_actors::store::StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            opened => return opened,
        }
    }
}

/// The skills the scenario folders use (`tests/scenarios/skills`).
pub(crate) fn scenario_skills_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/skills")
}

/// Skills from the given roots, none selected, no watching.
pub(crate) fn skills_config(roots: Vec<Root>, install_dir: Option<PathBuf>, selected: Vec<String>) -> SkillsConfig {
    SkillsConfig {
        roots,
        install_dir,
        watch: false,
        poll: None,
        selected,
        keep_versions: DEFAULT_KEEP_VERSIONS,
        policy: Default::default(),
        ..Default::default()
    }
}

/// Skills from the install folder alone, which uploads go to.
pub(crate) fn install_only(install: &Path) -> SkillsConfig {
    let roots = vec![Root { path: install.to_path_buf(), origin: Origin::Installed }];
    skills_config(roots, Some(install.to_path_buf()), Vec::new())
}

/// A multipart body holding `archive` in the field `file`, as the Web UI
/// sends a skill upload, and its content type.
pub(crate) fn multipart_body(archive: &[u8]) -> (String, Vec<u8>) {
    let boundary = "skillhostuploadboundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"skill.zip\"\r\nContent-Type: application/zip\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(archive);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// A multipart body with the given parts, each (field, filename, bytes);
/// an empty filename makes a text field.
pub(crate) fn multipart(parts: &[(&str, &str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "skillhostpartsboundary";
    let mut body = Vec::new();
    for (field, filename, bytes) in parts {
        let filename = if filename.is_empty() { String::new() } else { format!("; filename=\"{filename}\"") };
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"{filename}\r\n\r\n").as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// A skill upload of `archive` to `uri` (`/api/skills`, with
/// `?overwrite=true` to replace).
pub(crate) fn upload_request(uri: &str, archive: &[u8]) -> actix_http::Request {
    let (content_type, body) = multipart_body(archive);
    actix_web::test::TestRequest::post()
        .uri(uri)
        .insert_header(("content-type", content_type))
        .set_payload(body)
        .to_request()
}

enum Model {
    Scripted(Arc<ScriptedBackend>),
    Real(EngineConfig),
    /// Several models under one server; the first scripted one is
    /// `Running::backend`.
    Catalog(Catalog, Option<Arc<ScriptedBackend>>),
}

/// The real sandbox, as the code tests run it.
struct Exec {
    /// Offer the code tools (otherwise only skill scripts run).
    code_exec: bool,
    settings: ExecSettings,
    workspaces: WorkspaceOptions,
}

/// A server for one test, built step by step.
pub(crate) struct TestServer {
    model: Model,
    skills: Option<SkillsConfig>,
    loop_settings: LoopSettings,
    exec: Option<Exec>,
    access: Option<(AccessConfig, IpAddr)>,
    admission: Admission,
    keep_alive: Duration,
    state: Option<PathBuf>,
    max_detached_turns: usize,
    max_attachment_bytes: u64,
    mcp: Vec<McpServerConfig>,
    mcp_call_timeout: Duration,
    mcp_serve_scripts: bool,
    hosted: skillhost_actors::tools::mcp::hosted::HostedTools,
    client_prompts: crate::client_prompts::ClientPrompts,
}

/// A started test server.
pub(crate) struct Running {
    pub(crate) state: web::Data<AppState>,
    /// The scripted model, to read the prompts it was given.
    pub(crate) backend: Option<Arc<ScriptedBackend>>,
    /// The folder of workspaces and artifacts, with the sandbox.
    pub(crate) base: Option<tempfile::TempDir>,
}

impl TestServer {
    /// On the scripted model, which writes `outputs` in order (each for the
    /// agent it names).
    pub(crate) fn scripted<O: Into<ScriptedOutput>>(outputs: impl IntoIterator<Item = O>) -> Self {
        let outputs = outputs.into_iter().map(Into::into).collect();
        let backend = ScriptedBackend::for_agents(Some(CHATML), "llama", SCRIPTED_CTX, outputs)
            .expect("the scripted model's template");
        Self::on(Arc::new(backend))
    }

    /// On a scripted model the test made itself.
    pub(crate) fn on(backend: Arc<ScriptedBackend>) -> Self {
        Self::with_model(Model::Scripted(backend))
    }

    /// On the real default model, with a context of `n_ctx` tokens over
    /// `n_parallel` slots.
    pub(crate) fn real_model(n_ctx: u32, n_parallel: u32) -> Self {
        let engine = EngineConfig {
            model_path: model_path(),
            n_ctx: Some(n_ctx),
            n_parallel,
            n_threads: None,
            ..Default::default()
        };
        Self::with_model(Model::Real(engine))
    }

    /// On several models; `backend` is the scripted one whose prompts the
    /// test reads, if any.
    pub(crate) fn models(catalog: Catalog, backend: Option<Arc<ScriptedBackend>>) -> Self {
        Self::with_model(Model::Catalog(catalog, backend))
    }

    fn with_model(model: Model) -> Self {
        TestServer {
            model,
            skills: None,
            loop_settings: LoopSettings::default(),
            exec: None,
            access: None,
            admission: Admission::default(),
            keep_alive: crate::http::webui::KEEP_ALIVE,
            state: None,
            max_detached_turns: 4,
            max_attachment_bytes: skillhost_actors::attachments::DEFAULT_MAX_ATTACHMENT_BYTES,
            mcp: Vec::new(),
            mcp_call_timeout: skillhost_actors::tools::mcp::hub::DEFAULT_CALL_TIMEOUT,
            mcp_serve_scripts: false,
            hosted: Default::default(),
            client_prompts: Default::default(),
        }
    }

    /// `--normalize-client-prompts`.
    pub(crate) fn client_prompts(mut self, rules: crate::client_prompts::ClientPrompts) -> Self {
        self.client_prompts = rules;
        self
    }

    /// `--hosted-tool` and `--strict-hosted-tools`.
    pub(crate) fn hosted(mut self, hosted: skillhost_actors::tools::mcp::hosted::HostedTools) -> Self {
        self.hosted = hosted;
        self
    }

    /// MCP servers (stdio ones need [`TestServer::sandbox`]), and how long
    /// one call may run.
    pub(crate) fn mcp(mut self, servers: Vec<McpServerConfig>, call_timeout: Duration) -> Self {
        self.mcp = servers;
        self.mcp_call_timeout = call_timeout;
        self
    }

    /// `--mcp-serve-scripts`: `POST /mcp` offers `skills_run`.
    pub(crate) fn mcp_serve_scripts(mut self) -> Self {
        self.mcp_serve_scripts = true;
        self
    }

    /// The skills registry, as given.
    pub(crate) fn skills(mut self, skills: SkillsConfig) -> Self {
        self.skills = Some(skills);
        self
    }

    /// The skills under one folder, found as discovered skills are.
    pub(crate) fn skills_root(self, path: &Path) -> Self {
        let root = Root { path: path.to_path_buf(), origin: Origin::Discovered };
        self.skills(skills_config(vec![root], None, Vec::new()))
    }

    /// The skills of the scenario folders.
    pub(crate) fn scenario_skills(self) -> Self {
        self.skills_root(&scenario_skills_root())
    }

    pub(crate) fn settings(mut self, loop_settings: LoopSettings) -> Self {
        self.loop_settings = loop_settings;
        self
    }

    /// The real sandbox and the code tools.
    pub(crate) fn code_exec(self) -> Self {
        self.sandbox(true)
    }

    /// The real sandbox; `code_exec` offers the code tools, otherwise only
    /// skill scripts run in it.
    /// Commands run confined, with the profiles of this checkout, and with
    /// a uid of their own per workspace when the tests run as root.
    pub(crate) fn sandbox(mut self, code_exec: bool) -> Self {
        let profiles = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sandbox-profiles");
        let launcher = Launcher::new(helper(), profiles, None);
        // SAFETY: plain getter.
        let root = unsafe { libc::geteuid() } == 0;
        let workspaces = WorkspaceOptions {
            uids: root.then(|| UidPool::new(DEFAULT_UID_RANGE).expect("the uid lock folder")),
            size_cap: None,
            budget: None,
        };
        let settings = ExecSettings::confined(launcher, Interpreters::detect());
        self.exec = Some(Exec { code_exec, settings, workspaces });
        self
    }

    /// Changes how commands run (the installer, the network grants); after
    /// [`TestServer::sandbox`].
    pub(crate) fn exec_settings(mut self, tweak: impl FnOnce(&mut ExecSettings)) -> Self {
        let exec = self.exec.as_mut().expect("exec_settings after sandbox or code_exec");
        tweak(&mut exec.settings);
        self
    }

    /// Changes how workspaces are made; after [`TestServer::sandbox`].
    pub(crate) fn workspaces(mut self, shape: impl FnOnce(&mut WorkspaceOptions)) -> Self {
        let exec = self.exec.as_mut().expect("workspaces after sandbox or code_exec");
        shape(&mut exec.workspaces);
        self
    }

    /// Keys, origins and hosts, for a server bound to `host`.
    pub(crate) fn keys(mut self, access: AccessConfig, host: IpAddr) -> Self {
        self.access = Some((access, host));
        self
    }

    pub(crate) fn admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Keeps state in `dir` (a server started on it again finds it), in
    /// place of a folder of its own.
    pub(crate) fn state_dir(mut self, dir: &Path) -> Self {
        self.state = Some(dir.to_path_buf());
        self
    }

    /// Background turns that may run at once (`--max-detached-turns`).
    pub(crate) fn max_attachment_bytes(mut self, cap: u64) -> Self {
        self.max_attachment_bytes = cap;
        self
    }

    pub(crate) fn max_detached_turns(mut self, cap: usize) -> Self {
        self.max_detached_turns = cap;
        self
    }

    pub(crate) fn keep_alive(mut self, keep_alive: Duration) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    /// Starts the actors, waits for the model, and builds the app state.
    /// A server that refuses its settings is an error; a model that does
    /// not load fails the test.
    pub(crate) async fn start(self) -> Result<Running, StartupError> {
        // First, as `serve` opens it: a store it cannot open starts nothing.
        let store = match &self.state {
            Some(dir) => open_when_free(dir).await?,
            None => Store::temporary()?,
        };
        let (models, backend) = match self.model {
            Model::Scripted(backend) => (Catalog::single(ModelSource::Provided(backend.clone())), Some(backend)),
            Model::Real(engine) => (Catalog::single(ModelSource::Load(engine)), None),
            Model::Catalog(catalog, backend) => (catalog, backend),
        };
        let (exec, artifacts, base) = match self.exec {
            Some(exec) => {
                let (runtime, artifacts, base) = sandbox(exec);
                (Some(Arc::new(runtime)), Some(artifacts), Some(base))
            }
            None => (None, None, None),
        };
        let config = ServerConfig {
            models,
            skills: self.skills,
            loop_settings: self.loop_settings,
            exec,
            artifacts,
            mcp_servers: self.mcp,
            mcp_call_timeout: self.mcp_call_timeout,
            mcp_serve_scripts: self.mcp_serve_scripts,
        };
        let server = Server::start(config).await?;
        assert!(matches!(server.wait_until_loaded().await, ModelStatus::Ready { .. }), "the model did not load");
        let (access, host) = self.access.unwrap_or_else(|| (AccessConfig::default(), IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let options = AppOptions {
            access: Arc::new(Access::new(access, host)),
            admission: self.admission,
            keep_alive: self.keep_alive,
            started_at: 0,
            store,
            max_detached_turns: self.max_detached_turns,
            max_attachment_bytes: self.max_attachment_bytes,
            // The real binary reads PDFs, as in a server; route tests that
            // run without it built (`make check`) read none.
            pdf_reader: Some(helper_path()).filter(|path| path.exists()),
            hosted: self.hosted,
            client_prompts: self.client_prompts,
        };
        let state = setup::app_state(server, options)?;
        Ok(Running { state, backend, base })
    }
}

/// The runtime of `exec`, over a new folder of workspaces and artifacts.
fn sandbox(exec: Exec) -> (ExecRuntime, ArtifactStore, tempfile::TempDir) {
    let base = tempfile::tempdir().expect("a temporary folder");
    // Sandbox uids pass through it to their workspaces.
    std::fs::set_permissions(base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("the temporary folder's mode");
    let runtime = ExecRuntime {
        settings: Arc::new(exec.settings),
        workspace_base: base.path().join("workspaces"),
        workspaces: exec.workspaces,
        code_exec: exec.code_exec,
    };
    std::fs::create_dir_all(base.path().join("workspaces")).expect("the workspaces folder");
    std::fs::create_dir_all(base.path().join("artifacts")).expect("the artifacts folder");
    let artifacts =
        ArtifactStore::new(&base.path().join("artifacts"), ArtifactLimits::default()).expect("the artifact store");
    (runtime, artifacts, base)
}

/// The frames of a Web UI turn's SSE body, in order, without the opening
/// one: checks that each frame carries the next `id:` and that the first
/// names the conversation (keep-alive comments are skipped).
pub(crate) fn web_frames(body: &[u8]) -> Vec<serde_json::Value> {
    let text = std::str::from_utf8(body).expect("an SSE body is text");
    assert!(text.ends_with("\n\n"), "{text}");
    let mut ids = Vec::new();
    let mut frames = Vec::new();
    for chunk in text.split("\n\n").filter(|chunk| !chunk.is_empty() && !chunk.starts_with(':')) {
        let mut lines = chunk.lines();
        let id: u64 = lines
            .next()
            .and_then(|l| l.strip_prefix("id: "))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a frame without its id: {chunk}"));
        ids.push(id);
        let data = lines.next().and_then(|l| l.strip_prefix("data: ")).unwrap_or_else(|| panic!("{chunk}"));
        frames.push(serde_json::from_str::<serde_json::Value>(data).unwrap());
    }
    assert!(ids.windows(2).all(|pair| pair[1] == pair[0] + 1), "ids follow one another: {ids:?}");
    let opening = frames.remove(0);
    assert!(opening["conversationId"].as_str().is_some_and(|id| id.starts_with("c-")), "{opening}");
    frames
}
