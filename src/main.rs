//! skillhost: a self-hosted agent server for local GGUF models.
//!
//! Code map:
//! - `main` (here): parses the command line and dispatches subcommands before
//!   any runtime or thread exists, then starts the actors and the HTTP server.
//! - [`config`]: flags, environment and config files into a `ServeConfig`.
//! - [`list_skills`]: `skillhost list-skills`, the registry for operators.
//! - [`patch_cli`]: `skillhost apply-patch`, the patch tool outside a chat.
//! - [`skills_cli`]: `skillhost skills add`, installs by URL and digest.
//! - [`pdf_text`]: `skillhost pdf-text`, the confined child that reads an
//!   attached PDF's text, and the server's side that starts it.
//! - [`http`]: routes, wire formats (OpenAI), SSE, errors, metrics.
//! - [`sched`]: keeps the server's own threads from preempting decoding.
//! - [`setup`]: the wiring `serve`, `chat` and the route tests share.
//!
//! The actors live in `skillhost-actors`, the model in `skillhost-engine`.

mod chat_cli;
mod client_prompts;
mod config;
mod http;
mod list_skills;
mod mcp_cli;
mod patch_cli;
mod pdf_text;
mod sandbox_cli;
mod sched;
mod setup;
mod skills_cli;
mod terminal;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{App, HttpServer};
use clap::FromArgMatches;
use skillhost_actors::ModelStatus;
use tracing_subscriber::EnvFilter;

use config::{
    ChatArgs, Cli, Command, ListSkillsArgs, LogFormat, McpCommand, McpListArgs, ServeArgs, ServeConfig, SkillsAddArgs,
    SkillsCommand,
};
use std::sync::Arc;

/// Prints a command's report and exits 0 only when it says all went well;
/// an error that kept it from running exits with `on_error`.
#[allow(clippy::print_stderr, clippy::print_stdout)]
fn report<E: std::fmt::Display>(result: Result<(String, bool), E>, on_error: ExitCode) -> ExitCode {
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
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The confined PDF reader (started by the server, never by hand), before
    // anything else: it drops root and limits itself before reading input.
    if raw.get(1).is_some_and(|a| a == pdf_text::SUBCOMMAND) {
        return match pdf_text::run() {
            Ok(()) => ExitCode::SUCCESS,
            Err(failed) => {
                eprintln!("{}", failed.why);
                ExitCode::from(failed.code)
            }
        };
    }
    let definition = config::command();
    let matches = definition.clone().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    match cli.command {
        Command::RunSandboxed(args) => run_sandboxed(args),
        Command::Doctor(args) => report(sandbox_cli::doctor(args), ExitCode::FAILURE),
        Command::ApplyPatch(args) => report(patch_cli::run(&args, std::io::stdin().lock()), ExitCode::from(2)),
        Command::ListSkills(_) => print_skills(
            config::layered::<ListSkillsArgs>(&definition, &matches, "list-skills").and_then(|(a, _)| a.resolve()),
        ),
        Command::Skills(SkillsCommand::Add(given)) => report(
            config::layered::<SkillsAddArgs>(&definition, &matches, "skills add")
                .map_err(|err| err.to_string())
                // What a config file cannot set: the URL itself.
                .and_then(|(args, _)| skills_cli::add(SkillsAddArgs { url: given.url, ..args })),
            ExitCode::from(2),
        ),
        Command::Mcp(McpCommand::List(_)) => match config::layered::<McpListArgs>(&definition, &matches, "mcp list") {
            Ok((args, _)) => mcp_list(args),
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::from(2)
            }
        },
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
            ExitCode::from(skillhost_sandbox::exec::SANDBOX_FAILURE)
        }
    }
}

/// `mcp list`: every configured server started, listed and stopped; exit
/// 1 when one did not come up.
#[allow(clippy::print_stderr, clippy::print_stdout)]
fn mcp_list(args: McpListArgs) -> ExitCode {
    let config = match args.serve.resolve_without_model() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    init_logging_at(config.log_format, CHAT_LOG_FILTER);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let reports = match runtime.block_on(mcp_cli::reports(&config)) {
        Ok(reports) => reports,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let text = match args.json {
        true => serde_json::json!({ "servers": reports }).to_string() + "\n",
        false => mcp_cli::render(&reports),
    };
    // Names, descriptions and errors come from the servers: no control
    // sequence of theirs reaches a terminal.
    match std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        true => print!("{}", terminal::printable(&text)),
        false => print!("{text}"),
    }
    match reports.iter().all(|report| report.state == "up") {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
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
/// [`skillhost_sandbox::exec::COMMAND_OOM_SCORE_ADJ`], so when memory runs out the
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

/// Applies `--state-max-age` every hour (the byte limit is kept at each write).
fn sweep_hourly(store: skillhost_actors::store::Store) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
        every.tick().await;
        loop {
            every.tick().await;
            if let Err(err) = store.sweep().await {
                tracing::error!("the hourly store sweep failed: {err}");
            }
        }
    });
}

/// The replica's header and cookie on every answer.
fn replica_headers(replica: Option<&str>) -> actix_web::middleware::DefaultHeaders {
    use skillhost_actors::replica;
    let Some(id) = replica else { return actix_web::middleware::DefaultHeaders::new() };
    actix_web::middleware::DefaultHeaders::new()
        .add((replica::HEADER, id.to_string()))
        .add(("set-cookie", format!("{}={id}; Path=/; SameSite=Lax; HttpOnly", replica::COOKIE)))
}

async fn serve(config: ServeConfig) -> Result<(), setup::StartupError> {
    if let Some(id) = &config.replica_id {
        skillhost_actors::replica::set(id);
    }
    setup::log_capabilities(&config);
    // Before the model: a store that cannot be opened stops start-up at once.
    let store = skillhost_actors::store::Store::open(&config.state_dir, config.retention)?;
    tracing::info!("state: {}", store.path().display());
    let cut = http::files::sweep_spool(&config.state_dir);
    if cut > 0 {
        tracing::info!(cut, "uploads a stopped server left unfinished were removed");
    }
    sweep_hourly(store.clone());
    // Dropped last, after the server has stopped: the workspaces, artifacts
    // and profile copy this process made go with it.
    let (server, _own_folders) = setup::start_server(&config).await?;
    let access = Arc::new(http::access::Access::new(config.access.clone(), config.host));
    reload_on_hangup(access.clone(), server.clone());
    let options = setup::AppOptions {
        access: access.clone(),
        admission: http::access::Admission::new(config.engine.n_parallel as usize, config.max_queued as usize),
        keep_alive: http::webui::KEEP_ALIVE,
        started_at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        store,
        max_detached_turns: config.max_detached_turns as usize,
        max_attachment_bytes: config.max_attachment_bytes,
        pdf_reader: std::env::current_exe().ok(),
        hosted: config.hosted.clone(),
        client_prompts: config.client_prompts.clone(),
    };
    let state = setup::app_state(server.clone(), options)?;
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
    .map_err(|source| setup::StartupError::Listen { host: config.host, port: config.port, source })?;
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
    let result = running.await.map_err(setup::StartupError::Http);
    let failed = matches!(server.status(), ModelStatus::Failed(_));
    // Conversations' workspaces are not under the supervisor (they outlive
    // requests): stop them so their folders (and tmpfs mounts) go now.
    server.conversations().close_all(CONVERSATION_CLOSE_WAIT).await;
    server.shutdown();
    result?;
    if failed {
        return Err(setup::StartupError::ModelFailed);
    }
    Ok(())
}
