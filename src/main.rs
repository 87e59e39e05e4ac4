//! skillhost: a self-hosted agent server for local GGUF models.
//!
//! Code map:
//! - `main` (here): parses the command line and dispatches subcommands before
//!   any runtime or thread exists, then starts the actors and the HTTP server.
//! - [`config`]: flags, environment and config files into a `ServeConfig`.
//! - [`list_skills`]: `skillhost list-skills`, the registry for operators.
//! - [`patch_cli`]: `skillhost apply-patch`, the patch tool outside a chat.
//! - [`http`]: routes, wire formats (OpenAI), SSE, errors, metrics.
//! - [`sched`]: keeps the server's own threads from preempting decoding.
//!
//! The actors live in `skillhost-actors`, the model in `skillhost-engine`.

mod chat_cli;
mod config;
mod http;
mod list_skills;
mod patch_cli;
mod sandbox_cli;
mod sandbox_exec;
mod sched;
mod terminal;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{web, App, HttpServer};
use clap::FromArgMatches;
use skillhost_actors::model::ModelSource;
use skillhost_actors::{ModelStatus, Server, ServerConfig};
use tracing_subscriber::EnvFilter;

use config::{
    ChatArgs, Cli, Command, InstallConfig, ListSkillsArgs, LogFormat, SandboxModeArg, ServeArgs, ServeConfig,
};
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;

use skillhost_actors::artifacts::{ArtifactLimits, ArtifactStore};
use skillhost_actors::sandbox::egress::Egress;
use skillhost_actors::sandbox::interpreters::{Interpreters, SEARCH_PATH};
use skillhost_actors::sandbox::launch::SandboxMode;
use skillhost_actors::sandbox::{ca, doctor};
use skillhost_actors::sandbox::{ExecRuntime, ExecSettings};
use skillhost_actors::tools::install::InstallSettings;
use skillhost_actors::workspace::Workspace;

/// Prints a command's report and exits 0 only when it says all went well;
/// an error that kept it from running exits with `on_error`.
#[allow(clippy::print_stderr, clippy::print_stdout)]
fn report(result: Result<(String, bool), String>, on_error: ExitCode) -> ExitCode {
    match result {
        Ok((text, ok)) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("error: {err}");
            on_error
        }
    }
}

/// How long shutting down waits for a conversation's running call.
const CONVERSATION_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Log filter when `RUST_LOG` is not set: llama.cpp's own load-time chatter
/// (a hundred lines of tensor and buffer details) only shows when asked for.
const DEFAULT_LOG_FILTER: &str = "info,llama-cpp-2=warn";

#[allow(clippy::print_stderr, clippy::print_stdout)]
fn main() -> ExitCode {
    // Inside the sandbox, before anything else (not even argument parsing):
    // the trampoline that closes inherited descriptors and becomes the command.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if raw.get(1).is_some_and(|a| a == sandbox_exec::CLOSE_FDS_COMMAND) && raw.get(2).is_some_and(|a| a == "--") {
        eprintln!("sandbox: {}", sandbox_exec::close_fds_and_exec(&raw[3..]));
        return ExitCode::from(sandbox_exec::SANDBOX_FAILURE);
    }
    let definition = config::command();
    let matches = definition.clone().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    match cli.command {
        // First, before anything could start a thread: birdcage needs a
        // single-threaded process.
        Command::SandboxExec(args) => match sandbox_exec::run(args) {
            Ok(code) => ExitCode::from(code),
            Err(err) => {
                eprintln!("sandbox: {err}");
                ExitCode::from(sandbox_exec::SANDBOX_FAILURE)
            }
        },
        Command::RunSandboxed(args) => run_sandboxed(args),
        Command::Doctor(args) => report(sandbox_cli::doctor(args), ExitCode::FAILURE),
        Command::ApplyPatch(args) => report(patch_cli::run(&args, std::io::stdin().lock()), ExitCode::from(2)),
        Command::ListSkills(_) => print_skills(
            config::layered::<ListSkillsArgs>(&definition, &matches, "list-skills").and_then(|(a, _)| a.resolve()),
        ),
        Command::Serve(given) => {
            let (args, merged) = match config::layered::<ServeArgs>(&definition, &matches, "serve") {
                Ok(layered) => layered,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::from(2);
                }
            };
            if given.print_config {
                if let Some(serve) = definition.find_subcommand("serve") {
                    print!("{}", merged.render(serve));
                }
                // Like `nginx -T`: the settings are also checked.
                return match args.resolve() {
                    Ok(_) => ExitCode::SUCCESS,
                    Err(err) => {
                        eprintln!("error: {err}");
                        ExitCode::from(2)
                    }
                };
            }
            if given.list_skills {
                return print_skills(args.resolve_list_skills());
            }
            serve_command(args)
        }
        Command::Chat(given) => {
            let (args, _) = match config::layered::<ChatArgs>(&definition, &matches, "chat") {
                Ok(layered) => layered,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::from(2);
                }
            };
            // What a config file cannot set: the message itself.
            let options = chat_cli::Options {
                system: args.system,
                interactive: args.interactive,
                input: given.input.clone(),
                prompt: given.prompt.join(" "),
            };
            let config = match args.serve.resolve() {
                Ok(config) => config,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::from(2);
                }
            };
            init_logging_at(config.log_format, CHAT_LOG_FILTER);
            chat_cli::run(config, options)
        }
    }
}

/// `list-skills` and `serve --list-skills`: the registry, or why not.
#[allow(clippy::print_stderr, clippy::print_stdout)]
fn print_skills(skills: Result<Option<skillhost_actors::skills::SkillsConfig>, config::ConfigError>) -> ExitCode {
    match skills {
        Ok(skills) => {
            let text = list_skills::render(skills.as_ref());
            // Skill descriptions are untrusted: no control sequence of
            // theirs reaches a terminal.
            match std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                true => print!("{}", terminal::printable(&text)),
                false => print!("{text}"),
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

#[allow(clippy::print_stderr)]
fn run_sandboxed(args: sandbox_cli::RunSandboxedArgs) -> ExitCode {
    match sandbox_cli::run_sandboxed(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(sandbox_exec::SANDBOX_FAILURE)
        }
    }
}

#[allow(clippy::print_stderr)]
fn serve_command(args: ServeArgs) -> ExitCode {
    let config = match args.resolve() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_format);
    protect_from_oom_killer();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(sched::mark_as_batch_work)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// The server's own OOM priority. Commands raise theirs to
/// [`sandbox_exec::COMMAND_OOM_SCORE_ADJ`], so when memory runs out the
/// kernel kills a command before the server; lowering it needs root (or
/// CAP_SYS_RESOURCE), and without it the server keeps the default.
pub const SERVER_OOM_SCORE_ADJ: i32 = -500;

fn protect_from_oom_killer() {
    match std::fs::write("/proc/self/oom_score_adj", SERVER_OOM_SCORE_ADJ.to_string()) {
        Ok(()) => tracing::info!(
            oom_score_adj = SERVER_OOM_SCORE_ADJ,
            "the kernel kills commands before this server when memory runs out"
        ),
        Err(err) => {
            tracing::info!(error = %err, "cannot lower this server's OOM priority (it needs root); commands still go first")
        }
    }
}

fn init_logging(format: LogFormat) {
    init_logging_at(format, DEFAULT_LOG_FILTER);
}

/// The chat CLI logs only warnings unless `RUST_LOG` says otherwise: the
/// terminal is the conversation's.
const CHAT_LOG_FILTER: &str = "warn";

fn init_logging_at(format: LogFormat, default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// What process execution needs from start-up: the runtime shared by
/// requests, the artifact store for the supervisor, and the folders this
/// process made for itself (removed when the returned guards drop).
type ExecSetup = (Option<Arc<ExecRuntime>>, Option<ArtifactStore>, Vec<sandbox_cli::OwnedDir>);

/// Sets up process execution when code execution or skill scripts are on:
/// the server's own folder, the helper, per-workspace uids, control groups,
/// workspace size caps, and a trial run that decides what this host
/// confines (logged, and named in every command result).
async fn exec_runtime(config: &ServeConfig) -> Result<ExecSetup, String> {
    let exec = &config.exec;
    if !exec.code_exec && !config.loop_settings.allow_exec {
        return Ok((None, None, Vec::new()));
    }
    let (mut launcher, profiles) = sandbox_cli::launcher(exec.sandbox_profiles.clone())?;
    let (base, own_folder) = sandbox_cli::own_folder(&exec.workspace_dir).map_err(|err| {
        format!("--workspace-dir: cannot create the server's folder in {}: {err}", exec.workspace_dir.display())
    })?;
    let owned: Vec<sandbox_cli::OwnedDir> = profiles.into_iter().chain(std::iter::once(own_folder)).collect();
    let workspace_base = base.join("workspaces");
    let artifacts_base = base.join("artifacts");
    // Workspaces: traversable by every sandbox uid, listable by none.
    // Artifacts: the server's alone.
    for (folder, mode) in [(&workspace_base, 0o711), (&artifacts_base, 0o700)] {
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(folder)
            .map_err(|err| format!("--workspace-dir: cannot create {}: {err}", folder.display()))?;
    }
    let artifacts = ArtifactStore::new(&artifacts_base, ArtifactLimits::default())
        .map_err(|err| format!("cannot create the artifact store: {err}"))?;
    let setup = sandbox_cli::host_setup(
        &launcher.profile_dir,
        exec.uid_range,
        exec.workspace_max_bytes,
        exec.sandbox_memory,
        &workspace_base,
    );
    if let Some(owner) = setup.probe_owner() {
        if let Some(blocked) = skillhost_actors::workspace::unreachable_ancestor(&workspace_base, owner) {
            return Err(format!(
                "--workspace-dir: sandboxed commands (uids {}) cannot reach {} because {} is closed to them; choose a folder they can pass through (the default is the system temp folder)",
                exec.uid_range,
                workspace_base.display(),
                blocked.display()
            ));
        }
    }
    launcher.cgroups = setup.cgroups.clone();
    let scratch = Workspace::create(&workspace_base, &setup.workspaces)
        .map_err(|err| format!("cannot create a scratch workspace: {err}"))?;
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
    let interpreters = Interpreters::detect().with_overrides(&exec.interpreters).map_err(|err| err.to_string())?;
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
                .map_err(|err| format!("--ca-bundle: cannot write the snapshot {}: {err}", snapshot.display()))?;
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

/// SIGHUP (what `systemctl reload` sends): re-read the key files and
/// rescan the skills roots, without dropping a connection.
fn reload_on_hangup(access: Arc<http::access::Access>, server: skillhost_actors::Server) {
    let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; key files and skills are read only at start-up");
        return;
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: reading key files and rescanning skills");
            if let Err(err) = access.reload() {
                tracing::error!("the keys in force are unchanged: {err}");
            }
            if let Some(skills) = server.skills() {
                if let Err(err) = skills.rescan().await {
                    tracing::error!("the skills rescan failed: {err}");
                }
            }
        }
    });
}

/// One line per capability this deployment grants, so an operator reading
/// the log sees what it allows.
fn log_capabilities(config: &ServeConfig) {
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
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

/// The replica's header and cookie on every answer.
fn replica_headers(replica: Option<&str>) -> actix_web::middleware::DefaultHeaders {
    use skillhost_actors::replica;
    let Some(id) = replica else { return actix_web::middleware::DefaultHeaders::new() };
    actix_web::middleware::DefaultHeaders::new()
        .add((replica::HEADER, id.to_string()))
        .add(("set-cookie", format!("{}={id}; Path=/; SameSite=Lax; HttpOnly", replica::COOKIE)))
}

/// The folders a running server made for itself, removed when dropped.
pub type OwnFolders = Vec<sandbox_cli::OwnedDir>;

/// Starts the actor system for `config`, as `serve` and `chat` both run it:
/// process execution set up, the skills registry scanned, the model loading.
/// The folders come back to be dropped after the server has stopped.
pub async fn start_server(config: &ServeConfig) -> Result<(Server, OwnFolders), String> {
    let (exec, artifacts, own_folders) = exec_runtime(config).await?;
    let server = Server::start(ServerConfig {
        model: match &config.remote {
            Some(remote) => ModelSource::Remote(remote.clone()),
            None => ModelSource::Load(config.engine.clone()),
        },
        skills: config.skills.clone(),
        loop_settings: config.loop_settings,
        exec,
        artifacts,
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

async fn serve(config: ServeConfig) -> Result<(), String> {
    if let Some(id) = &config.replica_id {
        skillhost_actors::replica::set(id);
    }
    log_capabilities(&config);
    // Dropped last, after the server has stopped: the workspaces, artifacts
    // and profile copy this process made go with it.
    let (server, _own_folders) = start_server(&config).await?;
    let access = Arc::new(http::access::Access::new(config.access.clone(), config.host));
    reload_on_hangup(access.clone(), server.clone());
    let metrics = http::metrics::Metrics::new().map_err(|err| format!("cannot set up metrics: {err}"))?;
    let state = web::Data::new(http::AppState {
        server: server.clone(),
        metrics,
        started_at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        keep_alive: http::webui::KEEP_ALIVE,
        access: access.clone(),
        admission: http::access::Admission::new(config.engine.n_parallel as usize, config.max_queued as usize),
        responses: Default::default(),
    });
    // Listen first so /health answers 503 while the model loads.
    let http_server = HttpServer::new(move || {
        // The app factory runs once on each worker thread as it starts.
        sched::mark_as_batch_work();
        // Each answer names the replica, so a load balancer can keep a
        // client's conversation on the replica that holds its workspace.
        let replica = replica_headers(config.replica_id.as_deref());
        App::new()
            .wrap(actix_web::middleware::Condition::new(config.replica_id.is_some(), replica))
            .app_data(state.clone())
            .configure(http::configure)
    })
    .on_connect(http::peer::on_connect)
    .bind((config.host, config.port))
    .map_err(|err| format!("cannot listen on {}:{}: {err}", config.host, config.port))?;
    for address in http_server.addrs() {
        tracing::info!("listening on http://{address}");
    }
    let running = http_server.run();
    let handle = running.handle();
    let watcher = server.clone();
    tokio::spawn(async move {
        // A model that cannot load at start-up is fatal, as a bad flag is.
        if let ModelStatus::Failed(reason) = watcher.wait_until_loaded().await {
            tracing::error!("the model failed to load: {reason}");
            handle.stop(false).await;
        }
    });
    let result = running.await.map_err(|err| format!("the HTTP server failed: {err}"));
    let failed = matches!(server.status(), ModelStatus::Failed(_));
    // Conversations' workspaces are not under the supervisor (they outlive
    // requests): stop them so their folders (and tmpfs mounts) go now.
    server.conversations().close_all(CONVERSATION_CLOSE_WAIT).await;
    server.shutdown();
    result?;
    if failed {
        return Err("exiting because the model could not be loaded".into());
    }
    Ok(())
}
