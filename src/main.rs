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

mod config;
mod http;
mod list_skills;
mod patch_cli;
mod sandbox_cli;
mod sandbox_exec;
mod sched;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{web, App, HttpServer};
use clap::Parser;
use skillhost_actors::model::ModelSource;
use skillhost_actors::{ModelStatus, Server, ServerConfig};
use tracing_subscriber::EnvFilter;

use config::{Cli, Command, LogFormat, SandboxModeArg, ServeConfig};
use skillhost_actors::artifacts::ArtifactStore;
use skillhost_actors::sandbox::doctor;
use skillhost_actors::sandbox::launch::SandboxMode;
use skillhost_actors::sandbox::tools::ExecSettings;
use skillhost_actors::sandbox::ExecRuntime;

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

/// Log filter when `RUST_LOG` is not set: llama.cpp's own load-time chatter
/// (a hundred lines of tensor and buffer details) only shows when asked for.
const DEFAULT_LOG_FILTER: &str = "info,llama-cpp-2=warn";

#[allow(clippy::print_stderr, clippy::print_stdout)]
fn main() -> ExitCode {
    let cli = Cli::parse();
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
        Command::RunSandboxed(args) => match sandbox_cli::run_sandboxed(args) {
            Ok(code) => ExitCode::from(code),
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::from(sandbox_exec::SANDBOX_FAILURE)
            }
        },
        Command::Doctor(args) => report(sandbox_cli::doctor(args), ExitCode::FAILURE),
        Command::ApplyPatch(args) => report(patch_cli::run(&args, std::io::stdin().lock()), ExitCode::from(2)),
        Command::ListSkills(args) => match args.resolve() {
            Ok(skills) => {
                print!("{}", list_skills::render(skills.as_ref()));
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::from(2)
            }
        },
        Command::Serve(args) if args.list_skills => match args.resolve_list_skills() {
            Ok(skills) => {
                print!("{}", list_skills::render(skills.as_ref()));
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::from(2)
            }
        },
        Command::Serve(args) => {
            let config = match args.resolve() {
                Ok(config) => config,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::from(2);
                }
            };
            init_logging(config.log_format);
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
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Sets up process execution when code execution or skill scripts are on:
/// the helper, a trial run that decides what this host confines (logged,
/// and named in every command result), workspaces and artifacts.
/// The folders it made for itself come back as guards that remove them when
/// the server exits.
async fn exec_runtime(
    config: &ServeConfig,
) -> Result<(Option<std::sync::Arc<ExecRuntime>>, Vec<sandbox_cli::OwnedDir>), String> {
    let exec = &config.exec;
    if !exec.code_exec && !config.loop_settings.allow_exec {
        return Ok((None, Vec::new()));
    }
    let (launcher, profiles) = sandbox_cli::launcher(exec.sandbox_profiles.clone(), &exec.sandbox_user)?;
    let base = exec.workspace_dir.join(format!("skillhost-{}", std::process::id()));
    let workspace_base = base.join("workspaces");
    std::fs::create_dir_all(&workspace_base)
        .map_err(|err| format!("--workspace-dir: cannot create {}: {err}", workspace_base.display()))?;
    let owned: Vec<sandbox_cli::OwnedDir> =
        profiles.into_iter().chain(std::iter::once(sandbox_cli::OwnedDir(base.clone()))).collect();
    let artifacts = ArtifactStore::new(&base.join("artifacts"))
        .map_err(|err| format!("cannot create the artifact store: {err}"))?;
    let owner = skillhost_actors::workspace::sandbox_owner(&exec.sandbox_user);
    if let Some(blocked) =
        owner.and_then(|owner| skillhost_actors::workspace::unreachable_ancestor(&workspace_base, owner))
    {
        return Err(format!(
            "--workspace-dir: the sandbox user '{}' cannot reach {} because {} is closed to it; choose a folder it can pass through (the default is the system temp folder)",
            exec.sandbox_user,
            workspace_base.display(),
            blocked.display()
        ));
    }
    let scratch = skillhost_actors::workspace::Workspace::create(&workspace_base, owner)
        .map_err(|err| format!("cannot create a scratch workspace: {err}"))?;
    let checks = doctor::checks(&launcher, scratch.root()).await;
    let unavailable = checks.first().filter(|c| !c.kept).map(|c| c.detail.clone());
    for check in &checks {
        if check.kept {
            tracing::info!("sandbox: {}", check.what);
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
    let settings = ExecSettings {
        launcher,
        mode,
        unavailable,
        shell_unconfined: exec.code_unconfined,
        shell_network: exec.code_network,
        skills_network: exec.skills_network,
        gaps: doctor::gaps_line(&checks),
    };
    let runtime = std::sync::Arc::new(ExecRuntime {
        settings,
        workspace_base,
        owner,
        artifacts,
        code_exec: exec.code_exec,
        conversations: Default::default(),
    });
    Ok((Some(runtime), owned))
}

async fn serve(config: ServeConfig) -> Result<(), String> {
    // Dropped last, after the server has stopped: the workspaces, artifacts
    // and profile copy this process made go with it.
    let (exec, _own_folders) = exec_runtime(&config).await?;
    let server = Server::start(ServerConfig {
        model: ModelSource::Load(config.engine.clone()),
        skills: config.skills.clone(),
        loop_settings: config.loop_settings,
        exec,
    })
    .await?;
    if let Some(skills) = server.skills() {
        let snapshot = skills.snapshot();
        tracing::info!(skills = snapshot.skills.len(), errors = snapshot.errors.len(), "skills registry loaded");
        for error in &snapshot.errors {
            tracing::warn!(path = %error.path.display(), "a skill did not load: {}", error.message);
        }
    }
    let metrics = http::metrics::Metrics::new().map_err(|err| format!("cannot set up metrics: {err}"))?;
    let state = web::Data::new(http::AppState {
        server: server.clone(),
        metrics,
        started_at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        keep_alive: http::webui::KEEP_ALIVE,
    });
    // Listen first so /health answers 503 while the model loads.
    let http_server = HttpServer::new(move || {
        // The app factory runs once on each worker thread as it starts.
        sched::mark_as_batch_work();
        App::new().app_data(state.clone()).configure(http::configure)
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
    server.shutdown();
    result?;
    if failed {
        return Err("exiting because the model could not be loaded".into());
    }
    Ok(())
}
