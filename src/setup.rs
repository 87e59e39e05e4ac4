//! The wiring that `serve`, `chat` and the route tests share: process
//! execution set up from the settings (the server's folder, the helper,
//! uids, control groups, a trial run of the sandbox), the actor system
//! started on it, and the HTTP layer's state around the server. Each
//! caller adds only what is its own: `serve` listens, `chat` talks to a
//! terminal, the tests drive the app in process.

use skillhost_actors::tools::mcp::config::Transport as McpTransport;
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use std::path::{Path, PathBuf};

use skillhost_actors::artifacts::{ArtifactLimits, ArtifactStore};
use skillhost_actors::model::{Catalog, ModelEntry, ModelSource};
use skillhost_actors::sandbox::ca::CaError;
use skillhost_actors::sandbox::egress::Egress;
use skillhost_actors::sandbox::interpreters::{InterpreterError, Interpreters, SEARCH_PATH};
use skillhost_actors::sandbox::launch::SandboxMode;
use skillhost_actors::sandbox::{ca, doctor};
use skillhost_actors::sandbox::{ExecRuntime, ExecSettings};
use skillhost_actors::store::Store;
use skillhost_actors::tools::install::InstallSettings;
use skillhost_actors::workspace::uids::UidRange;
use skillhost_actors::workspace::Workspace;
use skillhost_actors::{Server, ServerConfig, StartError};

use crate::config::{InstallConfig, ModelConfig, SandboxModeArg, ServeConfig};
use crate::http::{self, access, AppState};
use crate::sandbox_cli::{self, SandboxSetupError};

/// Why `serve` or `chat` did not start, or `serve` stopped. Each is one
/// line on stderr and exit status 1; no request was served (or, for the
/// last two, none is served any more).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// A folder or file the server makes for itself could not be made.
    #[error("{what} {}: {source}", path.display())]
    Create { what: &'static str, path: PathBuf, source: std::io::Error },
    /// The sandbox uids cannot pass through a folder above the workspaces.
    #[error(
        "--workspace-dir: sandboxed commands (uids {uids}) cannot reach {} because {} is closed to them; choose a folder they can pass through (the default is the system temp folder)",
        base.display(),
        blocked.display()
    )]
    Unreachable { uids: UidRange, base: PathBuf, blocked: PathBuf },
    #[error("cannot create the artifact store: {0}")]
    ArtifactStore(std::io::Error),
    /// The trial workspace the sandbox checks run in.
    #[error("cannot create a scratch workspace: {0}")]
    Scratch(std::io::Error),
    #[error(transparent)]
    Sandbox(#[from] SandboxSetupError),
    #[error(transparent)]
    Interpreter(#[from] InterpreterError),
    #[error(transparent)]
    Ca(#[from] CaError),
    /// The actor system refused the settings (a `--skill` nobody registered).
    #[error(transparent)]
    Actors(#[from] StartError),
    /// The configured models do not make a catalog (a duplicate name).
    #[error("{0}")]
    Models(#[from] skillhost_actors::model::catalog::CatalogError),
    #[error("cannot set up metrics: {0}")]
    Metrics(prometheus::Error),
    /// `--state-dir`'s store cannot be opened (damaged, newer, in use).
    #[error("--state-dir: {0}")]
    Store(#[from] skillhost_actors::store::StoreError),
    #[error("cannot listen on {host}:{port}: {source}")]
    Listen { host: std::net::IpAddr, port: u16, source: std::io::Error },
    #[error("the HTTP server failed: {0}")]
    Http(std::io::Error),
    /// The model failed to load at start-up, which is fatal as a bad flag is.
    #[error("exiting because the model could not be loaded")]
    ModelFailed,
}

/// The error of a failed step that makes `path`, as `map_err` takes it.
fn failed(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StartupError {
    let path = path.to_path_buf();
    move |source| StartupError::Create { what, path, source }
}

/// The models `config` offers: the `--upstream` fleet as one model, or
/// every entry by its name, a GGUF sized by its files until it is first
/// loaded and an upstream entry as taking no memory here.
fn catalog(config: &ServeConfig) -> Result<Catalog, StartupError> {
    if let Some(remote) = &config.remote {
        return Ok(Catalog::single(ModelSource::Remote(remote.clone())));
    }
    if let [ModelConfig::Local(_)] | [] = config.models.as_slice() {
        let mut catalog = Catalog::single(ModelSource::Load(config.engine.clone()));
        catalog.limits = config.model_limits;
        return Ok(catalog);
    }
    let entries = config
        .models
        .iter()
        .map(|model| match model {
            ModelConfig::Local(engine) => ModelEntry {
                name: engine.name.clone().unwrap_or_else(|| skillhost_engine::file_model_name(&engine.model_path)),
                bytes: model_file_bytes(&engine.model_path),
                source: ModelSource::Load(engine.clone()),
            },
            ModelConfig::Upstream(remote) => ModelEntry {
                name: model.name().unwrap_or_default().to_string(),
                bytes: 0,
                source: ModelSource::Remote(remote.clone()),
            },
        })
        .collect();
    Ok(Catalog::new(entries, None, config.model_limits)?)
}

/// A model's size on disk: its file, or every part of a split model
/// (`name-00001-of-00003.gguf` and its siblings).
fn model_file_bytes(path: &std::path::Path) -> u64 {
    let size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    match name.rsplit_once("-00001-of-") {
        Some((base, rest)) => {
            let total: u32 = rest.trim_end_matches(".gguf").parse().unwrap_or(1);
            (1..=total).map(|part| size(&path.with_file_name(format!("{base}-{part:05}-of-{rest}")))).sum()
        }
        None => size(path),
    }
}

/// The folders a running server made for itself, removed when dropped.
pub type OwnFolders = Vec<sandbox_cli::OwnedDir>;

/// Starts the actor system for `config`, as `serve` and `chat` both run it:
/// process execution set up, the skills registry scanned, the model loading.
/// The folders come back to be dropped after the server has stopped.
pub async fn start_server(config: &ServeConfig) -> Result<(Server, OwnFolders), StartupError> {
    let (exec, artifacts, own_folders) = exec_runtime(config).await?;
    let server = Server::start(ServerConfig {
        models: catalog(config)?,
        skills: config.skills.clone(),
        loop_settings: config.loop_settings,
        exec,
        artifacts,
        mcp_servers: config.mcp_servers.clone(),
        mcp_call_timeout: config.mcp_call_timeout,
        mcp_serve_scripts: config.mcp_serve_scripts,
    })
    .await?;
    if let Some(skills) = server.skills() {
        let snapshot = skills.snapshot();
        tracing::info!(skills = snapshot.skills.len(), errors = snapshot.errors.len(), "skills registry loaded");
        for error in &snapshot.errors {
            tracing::warn!(path = ?error.path, message = ?error.message, "a skill did not load");
        }
    }
    Ok((server, own_folders))
}

/// What process execution needs from start-up: the runtime shared by
/// requests, the artifact store for the supervisor, and the folders this
/// process made for itself (removed when the returned guards drop).
pub(crate) type ExecSetup = (Option<Arc<ExecRuntime>>, Option<ArtifactStore>, Vec<sandbox_cli::OwnedDir>);

/// Sets up process execution when code execution or skill scripts are on:
/// the server's own folder, the helper, per-workspace uids, control groups,
/// workspace size caps, and a trial run that decides what this host
/// confines (logged, and named in every command result).
pub(crate) async fn exec_runtime(config: &ServeConfig) -> Result<ExecSetup, StartupError> {
    let exec = &config.exec;
    // A stdio MCP server runs through the same helper as a command.
    let stdio_mcp = config.mcp_servers.iter().any(|server| matches!(server.transport, McpTransport::Stdio { .. }));
    if !exec.code_exec && !config.loop_settings.allow_exec && !stdio_mcp {
        return Ok((None, None, Vec::new()));
    }
    let (launcher, profiles) = sandbox_cli::launcher(exec.sandbox_profiles.clone())?;
    let (base, own_folder) = sandbox_cli::own_folder(&exec.workspace_dir)
        .map_err(failed("--workspace-dir: cannot create the server's folder in", &exec.workspace_dir))?;
    let owned: Vec<sandbox_cli::OwnedDir> = profiles.into_iter().chain(std::iter::once(own_folder)).collect();
    let workspace_base = base.join("workspaces");
    let artifacts_base = base.join("artifacts");
    // Workspaces: traversable by every sandbox uid, listable by none.
    // Artifacts: the server's alone.
    for (folder, mode) in [(&workspace_base, 0o711), (&artifacts_base, 0o700)] {
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(folder)
            .map_err(failed("--workspace-dir: cannot create", folder))?;
    }
    let artifacts =
        ArtifactStore::new(&artifacts_base, ArtifactLimits::default()).map_err(StartupError::ArtifactStore)?;
    let setup = sandbox_cli::host_setup(
        &launcher.profile_dir,
        exec.uid_range,
        exec.workspace_max_bytes,
        exec.sandbox_memory,
        &workspace_base,
    );
    if let Some(owner) = setup.probe_owner() {
        if let Some(blocked) = skillhost_actors::workspace::unreachable_ancestor(&workspace_base, owner) {
            return Err(StartupError::Unreachable { uids: exec.uid_range, base: workspace_base, blocked });
        }
    }
    let launcher = launcher.with_cgroups(setup.cgroups.clone());
    let scratch = Workspace::create(&workspace_base, &setup.workspaces).map_err(StartupError::Scratch)?;
    let mut checks = doctor::checks(&launcher, scratch.path(), scratch.owner()).await;
    drop(scratch);
    checks.extend(setup.facts.clone());
    let unavailable = checks.first().filter(|c| !c.kept).map(|c| c.detail.clone());
    for check in &checks {
        if check.kept {
            tracing::info!("sandbox: {}{}", check.what, detail_suffix(&check.detail));
        } else {
            tracing::warn!("sandbox: NOT {} ({})", check.what, check.detail);
        }
    }
    let mode = match exec.mode {
        SandboxModeArg::Required => SandboxMode::Required,
        SandboxModeArg::Preferred => SandboxMode::Preferred,
        SandboxModeArg::Off => SandboxMode::Off,
    };
    if unavailable.is_some() && mode == SandboxMode::Required {
        tracing::warn!("this host cannot confine commands; with --skills-sandbox required, shell and skills_run will refuse to run");
    }
    let interpreters = Interpreters::detect().with_overrides(&exec.interpreters)?;
    match interpreters.python() {
        Some(python) => {
            tracing::info!("interpreters: python is {} ({})", python.path.display(), interpreters.describe())
        }
        None => tracing::warn!("interpreters: no python3 found in {}", SEARCH_PATH.join(":")),
    }
    let install = exec.install.as_ref().map(|install| Arc::new(install_settings(install, &interpreters)));
    // The operator's CA bundles, checked now: a bad one stops start-up.
    let ca_bundle = match exec.ca_bundles.is_empty() {
        true => None,
        false => {
            let certificates = ca::read_bundles(&exec.ca_bundles)?;
            let snapshot = base.join("ca-bundle.pem");
            ca::write_snapshot(&snapshot, &certificates)
                .map_err(failed("--ca-bundle: cannot write the snapshot", &snapshot))?;
            tracing::info!(
                certificates = certificates.len(),
                "CA bundles: networked commands and the installer trust them"
            );
            if !exec.code_network && !exec.skills_network && exec.install.is_none() {
                tracing::warn!("--ca-bundle has no effect: nothing is granted the network");
            }
            Some(snapshot)
        }
    };
    let settings = ExecSettings {
        launcher,
        mode,
        unavailable,
        shell_unconfined: exec.code_unconfined,
        shell_network: exec.code_network,
        skills_network: exec.skills_network,
        gaps: doctor::gaps_line(&checks),
        interpreters: Arc::new(interpreters),
        proxy_env: skillhost_actors::sandbox::proxy_environment(std::env::vars()),
        install,
        ca_bundle,
    };
    let runtime = Arc::new(ExecRuntime {
        settings: Arc::new(settings),
        workspace_base,
        workspaces: setup.workspaces,
        code_exec: exec.code_exec,
    });
    Ok((Some(runtime), Some(artifacts), owned))
}

/// The install proxy's policy, and in the log what the installer may do.
fn install_settings(install: &InstallConfig, interpreters: &Interpreters) -> InstallSettings {
    let egress = Egress::new(install.domains.clone());
    let npm = SEARCH_PATH.iter().map(|dir| std::path::Path::new(dir).join("npm")).find(|p| p.is_file());
    tracing::info!(
        index = install.python_index,
        registry = install.npm_registry,
        "capability: the host installs packages for shell commands (--code-exec-allow-install), reaching only {}",
        install.domains.join(", ")
    );
    if interpreters.python().is_none() {
        tracing::warn!("--code-exec-allow-install: no python3 here, so pip installs will be refused");
    }
    if npm.is_none() {
        tracing::warn!(
            "--code-exec-allow-install: no npm in {}, so npm installs will be refused",
            SEARCH_PATH.join(":")
        );
    }
    InstallSettings {
        allowed: true,
        packages: install.packages.clone(),
        python_index: install.python_index.clone(),
        npm_registry: install.npm_registry.clone(),
        proxy: Some(egress),
        npm,
    }
}

/// One line per capability this deployment grants, so an operator reading
/// the log sees what it allows.
pub fn log_capabilities(config: &ServeConfig) {
    let exec = &config.exec;
    let on = |b: bool| if b { "on" } else { "off" };
    tracing::info!("capability: code execution (--code-exec) {}", on(exec.code_exec));
    tracing::info!("capability: skill scripts (--skills-allow-exec) {}", on(config.loop_settings.allow_exec));
    if exec.code_unconfined {
        tracing::warn!("capability: shell commands run WITHOUT the sandbox (--code-exec-unconfined)");
    }
    if exec.code_network {
        tracing::warn!("capability: shell commands may use the host's network (--code-exec-allow-network)");
        if exec.install.is_some() {
            tracing::warn!("capability: with --code-exec-allow-network, --code-exec-packages and --code-exec-install-domains bound only the host's installer, not what commands can fetch themselves");
        }
    }
    if exec.skills_network {
        tracing::warn!("capability: skill scripts may use the host's network (--skills-allow-network)");
    }
    tracing::info!("capability: sandbox mode {:?}", exec.mode);
    let access = &config.access;
    match (access.user_keys_configured(), config.host.is_loopback()) {
        (true, _) => tracing::info!(
            "capability: keys on (chat and model routes need a key; admin routes {})",
            if access.admin_keys.is_empty() && access.admin_key_file.is_none() {
                "are refused: no --admin-key"
            } else {
                "need an admin key"
            }
        ),
        (false, true) => tracing::info!("capability: keys off (bound to a loopback address)"),
        (false, false) => {
            tracing::warn!("capability: keys OFF on a non-loopback address (--insecure-no-auth): anyone who reaches the port may use this server")
        }
    }
    tracing::info!(
        "capability: /metrics {}",
        if access.metrics_key.is_some() { "needs --metrics-key" } else { "open" }
    );
    if !access.allowed_origins.is_empty() {
        tracing::info!("capability: browser pages from {} may call the API", access.allowed_origins.join(", "));
    }
    let rules = config.client_prompts.names();
    if rules.is_empty() {
        tracing::info!("capability: client prompts as sent (--normalize-client-prompts none)");
    } else {
        tracing::info!(
            "capability: client prompts rewritten by rule (--normalize-client-prompts): {}",
            rules.join(", ")
        );
    }
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

/// What the HTTP layer keeps beside the server.
pub struct AppOptions {
    /// Keys, origins and hosts.
    pub access: Arc<access::Access>,
    /// Requests running or waiting, bounded by `--max-queued`.
    pub admission: access::Admission,
    /// Silence after which the Web UI stream sends a comment frame.
    pub keep_alive: Duration,
    /// Unix time the server started, reported as the model's `created`.
    pub started_at: u64,
    /// The state folder's store.
    pub store: Store,
    /// `--max-detached-turns`.
    pub max_detached_turns: usize,
    /// `--max-attachment-bytes`.
    pub max_attachment_bytes: u64,
    /// The binary that reads an attached PDF's text (`skillhost pdf-text`).
    pub pdf_reader: Option<std::path::PathBuf>,
    /// `--hosted-tool` and `--strict-hosted-tools`.
    pub hosted: skillhost_actors::tools::mcp::hosted::HostedTools,
    /// `--normalize-client-prompts`.
    pub client_prompts: crate::client_prompts::ClientPrompts,
}

/// The state every handler shares, around a started server.
pub fn app_state(server: Server, options: AppOptions) -> Result<web::Data<AppState>, StartupError> {
    let metrics = http::metrics::Metrics::new().map_err(StartupError::Metrics)?;
    Ok(web::Data::new(AppState {
        server,
        metrics,
        started_at: options.started_at,
        keep_alive: options.keep_alive,
        access: options.access,
        admission: options.admission,
        store: options.store,
        max_attachment_bytes: options.max_attachment_bytes,
        pdf_reader: options.pdf_reader,
        background: Arc::new(http::background::Background::new(options.max_detached_turns)),
        webui_turns: http::webui_turns::Turns::default(),
        hosted: Arc::new(options.hosted),
        client_prompts: options.client_prompts,
        response_streams: http::background::Streams::default(),
    }))
}
