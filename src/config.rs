//! Command line and configuration files: flags, `SKILLHOST_*` variables and
//! `--config` YAML files merge into one validated [`ServeConfig`].
//!
//! Precedence, highest first: command-line flags, environment variables,
//! config files (later files override earlier ones), built-in defaults.
//! Config-file keys are the flag names.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;
use skillhost_actors::chat_loop::{
    LoopSettings, DEFAULT_CODE_ROUNDS, DEFAULT_MAX_ROUNDS, DEFAULT_TURN_TIMEOUT, MAX_ROUNDS, MIN_ROUNDS,
};
use skillhost_actors::sandbox::uids::{UidRange, DEFAULT_UID_RANGE};
use skillhost_actors::skills::roots::registry_roots;
use skillhost_actors::skills::SkillsConfig;
use skillhost_actors::workspace::DEFAULT_WORKSPACE_MAX_BYTES;
use skillhost_engine::EngineConfig;

pub const DEFAULT_HOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
pub const DEFAULT_PORT: u16 = 5000;
/// Sequences decoded together by default.
pub const DEFAULT_PARALLEL: u32 = 4;
/// Most slots `--parallel` accepts.
pub const MAX_PARALLEL: u32 = 64;
/// Smallest context `--ctx-size` accepts, in tokens.
pub const MIN_CTX_SIZE: u32 = 256;

#[derive(Debug, Parser)]
#[command(name = "skillhost", version, about = "A self-hosted agent server for local GGUF models.")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the OpenAI-compatible API for a model.
    Serve(ServeArgs),
    /// Print the skills registry (what is registered, where from, warnings
    /// and errors) and exit, without loading a model.
    ListSkills(ListSkillsArgs),
    /// Run one command in the OS sandbox exactly as the tools would, and exit with its status.
    RunSandboxed(crate::sandbox_cli::RunSandboxedArgs),
    /// Print what this host's sandbox confines and what it does not.
    Doctor(crate::sandbox_cli::DoctorArgs),
    /// Apply a patch read from stdin, as the model's apply_patch tool does; exit 0 only when it applied.
    ApplyPatch(crate::patch_cli::ApplyPatchArgs),
    /// Internal: run one command in the OS sandbox (started by the server).
    #[command(hide = true)]
    SandboxExec(crate::sandbox_exec::SandboxExecArgs),
}

/// Skills flags, shared by `serve` and `list-skills`.
#[derive(Debug, Default, Args)]
pub struct SkillArgs {
    /// Directory of skills to scan; repeatable; replaces the default roots
    /// [default: every .agents/skills from here up to the Git repository root]
    #[arg(long = "skills-dir", env = "SKILLHOST_SKILLS_DIR", value_delimiter = ':')]
    pub skills_dir: Vec<PathBuf>,
    /// Where uploaded skills are installed; always scanned first
    /// [default: a skills directory next to the binary, created if missing]
    #[arg(long = "skills-install-dir", env = "SKILLHOST_SKILLS_INSTALL_DIR")]
    pub skills_install_dir: Option<PathBuf>,
    /// Turn skills off entirely
    #[arg(long = "no-skills", env = "SKILLHOST_NO_SKILLS")]
    pub no_skills: bool,
    /// Rescan the skills roots when their files change (500 ms debounce)
    #[arg(long = "skills-watch", env = "SKILLHOST_SKILLS_WATCH")]
    pub skills_watch: bool,
}

/// Flags of `skillhost list-skills`.
#[derive(Debug, Default, Args)]
pub struct ListSkillsArgs {
    #[command(flatten)]
    pub skills: SkillArgs,
    /// YAML config file whose keys are the flag names; repeatable, later files win
    #[arg(long = "config", env = "SKILLHOST_CONFIG", value_delimiter = ',')]
    pub config: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `skillhost serve`. Every flag is optional here so that a config
/// file can supply it; defaults are applied after merging.
#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1]
    #[arg(long, env = "SKILLHOST_HOST")]
    pub host: Option<IpAddr>,
    /// Port to listen on; 0 picks a free port and logs it [default: 5000]
    #[arg(long, env = "SKILLHOST_PORT")]
    pub port: Option<u16>,
    /// Path to the GGUF model file (required, here or in a config file)
    #[arg(long, short = 'm', env = "SKILLHOST_MODEL")]
    pub model: Option<PathBuf>,
    /// Requests decoded together, each in its own KV slot [default: 4]
    #[arg(long, short = 'n', env = "SKILLHOST_PARALLEL")]
    pub parallel: Option<u32>,
    /// Context size in tokens, shared by all slots [default: the model's training context, at most 8192]
    #[arg(long, short = 'c', env = "SKILLHOST_CTX_SIZE")]
    pub ctx_size: Option<u32>,
    /// CPU threads for decoding [default: all cores]
    #[arg(long, short = 't', env = "SKILLHOST_THREADS")]
    pub threads: Option<u32>,
    /// YAML config file whose keys are these flag names; repeatable, later files win
    #[arg(long = "config", env = "SKILLHOST_CONFIG", value_delimiter = ',')]
    pub config: Vec<PathBuf>,
    /// Log format [default: text]
    #[arg(long, value_enum, env = "SKILLHOST_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    #[command(flatten)]
    pub skills: SkillArgs,
    /// Print the skills registry and exit, without loading a model
    #[arg(long = "list-skills")]
    pub list_skills: bool,
    /// Do not advertise unselected skills; a request reaches only what it selects
    #[arg(long = "skills-no-discovery", env = "SKILLHOST_SKILLS_NO_DISCOVERY")]
    pub skills_no_discovery: bool,
    /// Tool rounds per turn, 1 to 64 [default: 8]
    #[arg(long = "skills-max-rounds", env = "SKILLHOST_SKILLS_MAX_ROUNDS")]
    pub skills_max_rounds: Option<u32>,
    /// Seconds one turn may run, all rounds and tools together; then it ends with what it has [default: 1800]
    #[arg(long = "turn-timeout", env = "SKILLHOST_TURN_TIMEOUT")]
    pub turn_timeout: Option<u64>,
    /// Offer skills_run (running a skill's bundled scripts)
    #[arg(long = "skills-allow-exec", env = "SKILLHOST_SKILLS_ALLOW_EXEC")]
    pub skills_allow_exec: bool,
    /// Put selected skills' instructions in the prompt instead of letting the model load them
    #[arg(long = "inline-selected-bodies", env = "SKILLHOST_INLINE_SELECTED_BODIES")]
    pub inline_selected_bodies: bool,
    /// Offer the code tools: read_file, write_file, apply_patch and a sandboxed shell
    #[arg(long = "code-exec", env = "SKILLHOST_CODE_EXEC")]
    pub code_exec: bool,
    /// Let shell commands use the network
    #[arg(long = "code-exec-allow-network", env = "SKILLHOST_CODE_EXEC_ALLOW_NETWORK")]
    pub code_exec_allow_network: bool,
    /// Run shell commands without the sandbox (never on a server untrusted users reach)
    #[arg(long = "code-exec-unconfined", env = "SKILLHOST_CODE_EXEC_UNCONFINED")]
    pub code_exec_unconfined: bool,
    /// Temperature for code turns whose request leaves it at the default
    #[arg(long = "code-exec-temperature", env = "SKILLHOST_CODE_EXEC_TEMPERATURE")]
    pub code_exec_temperature: Option<f32>,
    /// Let skill scripts (skills_run) use the network
    #[arg(long = "skills-allow-network", env = "SKILLHOST_SKILLS_ALLOW_NETWORK")]
    pub skills_allow_network: bool,
    /// Whether commands must be sandboxed: required (sandboxed or refused), preferred or off [default: required]
    #[arg(long = "skills-sandbox", value_enum, env = "SKILLHOST_SKILLS_SANDBOX")]
    pub skills_sandbox: Option<SandboxModeArg>,
    /// Uids given out one per live workspace when the server is root, as FIRST-LAST [default: 1879048192-1879113727]
    #[arg(long = "sandbox-uid-range", env = "SKILLHOST_SANDBOX_UID_RANGE")]
    pub sandbox_uid_range: Option<UidRange>,
    /// Largest a workspace may grow, in bytes (a size-capped tmpfs when the server is root) [default: 1073741824]
    #[arg(long = "workspace-max-bytes", env = "SKILLHOST_WORKSPACE_MAX_BYTES")]
    pub workspace_max_bytes: Option<u64>,
    /// Folder of sandbox profiles [default: the profiles built into skillhost]
    #[arg(long = "sandbox-profiles", env = "SKILLHOST_SANDBOX_PROFILES")]
    pub sandbox_profiles: Option<PathBuf>,
    /// Where request workspaces and artifacts live [default: the system temp folder]
    #[arg(long = "workspace-dir", env = "SKILLHOST_WORKSPACE_DIR")]
    pub workspace_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxModeArg {
    Required,
    Preferred,
    Off,
}

/// How commands run, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecConfig {
    pub code_exec: bool,
    pub code_network: bool,
    pub code_unconfined: bool,
    pub skills_network: bool,
    pub mode: SandboxModeArg,
    pub uid_range: UidRange,
    pub sandbox_profiles: Option<PathBuf>,
    pub workspace_dir: PathBuf,
    pub workspace_max_bytes: u64,
}

impl Default for ExecConfig {
    /// Code execution off; skill scripts, when allowed, run in the required
    /// sandbox, one uid per workspace, with workspaces under the system temp
    /// directory.
    fn default() -> Self {
        ExecConfig {
            code_exec: false,
            code_network: false,
            code_unconfined: false,
            skills_network: false,
            mode: SandboxModeArg::Required,
            uid_range: DEFAULT_UID_RANGE,
            sandbox_profiles: None,
            workspace_dir: std::env::temp_dir(),
            workspace_max_bytes: DEFAULT_WORKSPACE_MAX_BYTES,
        }
    }
}

/// One config file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    host: Option<IpAddr>,
    port: Option<u16>,
    model: Option<PathBuf>,
    parallel: Option<u32>,
    ctx_size: Option<u32>,
    threads: Option<u32>,
    log_format: Option<LogFormat>,
    skills_dir: Option<Vec<PathBuf>>,
    skills_install_dir: Option<PathBuf>,
    no_skills: Option<bool>,
    skills_watch: Option<bool>,
    skills_no_discovery: Option<bool>,
    skills_max_rounds: Option<u32>,
    turn_timeout: Option<u64>,
    skills_allow_exec: Option<bool>,
    inline_selected_bodies: Option<bool>,
    code_exec: Option<bool>,
    code_exec_allow_network: Option<bool>,
    code_exec_unconfined: Option<bool>,
    code_exec_temperature: Option<f32>,
    skills_allow_network: Option<bool>,
    skills_sandbox: Option<SandboxModeArg>,
    sandbox_uid_range: Option<String>,
    sandbox_profiles: Option<PathBuf>,
    workspace_dir: Option<PathBuf>,
    workspace_max_bytes: Option<u64>,
}

/// The validated configuration of `skillhost serve`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub host: IpAddr,
    pub port: u16,
    pub log_format: LogFormat,
    pub engine: EngineConfig,
    /// `None` with `--no-skills`.
    pub skills: Option<SkillsConfig>,
    pub loop_settings: LoopSettings,
    pub exec: ExecConfig,
}

/// The smallest workspace size cap: a workspace must hold a few files.
pub const MIN_WORKSPACE_BYTES: u64 = 1024 * 1024;

/// A configuration that cannot be used; the message names the flag or key.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Reads config files in order; later files override earlier ones key by
/// key, and a later `skills-dir` replaces an earlier one whole. Relative
/// paths in a file are relative to that file.
fn merge_files(paths: &[PathBuf]) -> Result<RawConfig, ConfigError> {
    let mut file = RawConfig::default();
    for path in paths {
        let raw = read_config(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        file = RawConfig {
            host: raw.host.or(file.host),
            port: raw.port.or(file.port),
            model: raw.model.map(|m| base.join(m)).or(file.model),
            parallel: raw.parallel.or(file.parallel),
            ctx_size: raw.ctx_size.or(file.ctx_size),
            threads: raw.threads.or(file.threads),
            log_format: raw.log_format.or(file.log_format),
            skills_dir: raw.skills_dir.map(|dirs| dirs.into_iter().map(|d| base.join(d)).collect()).or(file.skills_dir),
            skills_install_dir: raw.skills_install_dir.map(|d| base.join(d)).or(file.skills_install_dir),
            no_skills: raw.no_skills.or(file.no_skills),
            skills_watch: raw.skills_watch.or(file.skills_watch),
            skills_no_discovery: raw.skills_no_discovery.or(file.skills_no_discovery),
            skills_max_rounds: raw.skills_max_rounds.or(file.skills_max_rounds),
            turn_timeout: raw.turn_timeout.or(file.turn_timeout),
            skills_allow_exec: raw.skills_allow_exec.or(file.skills_allow_exec),
            inline_selected_bodies: raw.inline_selected_bodies.or(file.inline_selected_bodies),
            code_exec: raw.code_exec.or(file.code_exec),
            code_exec_allow_network: raw.code_exec_allow_network.or(file.code_exec_allow_network),
            code_exec_unconfined: raw.code_exec_unconfined.or(file.code_exec_unconfined),
            code_exec_temperature: raw.code_exec_temperature.or(file.code_exec_temperature),
            skills_allow_network: raw.skills_allow_network.or(file.skills_allow_network),
            skills_sandbox: raw.skills_sandbox.or(file.skills_sandbox),
            sandbox_uid_range: raw.sandbox_uid_range.or(file.sandbox_uid_range),
            sandbox_profiles: raw.sandbox_profiles.map(|d| base.join(d)).or(file.sandbox_profiles),
            workspace_dir: raw.workspace_dir.map(|d| base.join(d)).or(file.workspace_dir),
            workspace_max_bytes: raw.workspace_max_bytes.or(file.workspace_max_bytes),
        };
    }
    Ok(file)
}

impl SkillArgs {
    /// The registry setup, or `None` when skills are off. Every explicit root
    /// must exist; the install directory is created if missing.
    fn resolve(&self, file: &RawConfig) -> Result<Option<SkillsConfig>, ConfigError> {
        if self.no_skills || file.no_skills.unwrap_or(false) {
            return Ok(None);
        }
        // Command-line roots replace the config files' roots.
        let explicit = if self.skills_dir.is_empty() {
            file.skills_dir.clone().unwrap_or_default()
        } else {
            self.skills_dir.clone()
        };
        for root in &explicit {
            if !root.is_dir() {
                return Err(ConfigError(format!("--skills-dir: the directory {} does not exist", root.display())));
            }
        }
        let install_dir = match self.skills_install_dir.clone().or_else(|| file.skills_install_dir.clone()) {
            Some(dir) => dir,
            None => {
                std::env::current_exe().ok().and_then(|exe| exe.parent().map(|dir| dir.join("skills"))).ok_or_else(
                    || ConfigError("cannot tell where the skillhost binary is; pass --skills-install-dir".into()),
                )?
            }
        };
        std::fs::create_dir_all(&install_dir).map_err(|err| {
            ConfigError(format!("--skills-install-dir: cannot create {}: {err}", install_dir.display()))
        })?;
        let cwd =
            std::env::current_dir().map_err(|err| ConfigError(format!("cannot read the working directory: {err}")))?;
        let roots = registry_roots(Some(&install_dir), &explicit, &cwd);
        Ok(Some(SkillsConfig {
            roots,
            install_dir: Some(install_dir),
            watch: self.skills_watch || file.skills_watch.unwrap_or(false),
        }))
    }
}

impl ListSkillsArgs {
    /// The registry setup `list-skills` prints.
    pub fn resolve(self) -> Result<Option<SkillsConfig>, ConfigError> {
        let file = merge_files(&self.config)?;
        self.skills.resolve(&file)
    }
}

impl ServeArgs {
    /// With `--list-skills`, only the skills part matters.
    pub fn resolve_list_skills(&self) -> Result<Option<SkillsConfig>, ConfigError> {
        let file = merge_files(&self.config)?;
        self.skills.resolve(&file)
    }

    /// Merges config files under the flags and validates the result. Nothing
    /// is loaded yet, so a bad value fails before the model is read.
    pub fn resolve(self) -> Result<ServeConfig, ConfigError> {
        let file = merge_files(&self.config)?;
        let skills = self.skills.resolve(&file)?;
        let model = self.model.or(file.model).ok_or_else(|| {
            ConfigError("no model given: pass --model PATH (or set 'model' in a --config file)".into())
        })?;
        if !model.is_file() {
            return Err(ConfigError(format!(
                "--model: the model file {} does not exist (run `make model` for the default model)",
                model.display()
            )));
        }
        let parallel = self.parallel.or(file.parallel).unwrap_or(DEFAULT_PARALLEL);
        if !(1..=MAX_PARALLEL).contains(&parallel) {
            return Err(ConfigError(format!("--parallel must be between 1 and {MAX_PARALLEL}, got {parallel}")));
        }
        let ctx_size = self.ctx_size.or(file.ctx_size);
        if let Some(n) = ctx_size {
            if n < MIN_CTX_SIZE {
                return Err(ConfigError(format!("--ctx-size must be at least {MIN_CTX_SIZE} tokens, got {n}")));
            }
        }
        let threads = self.threads.or(file.threads);
        if threads == Some(0) {
            return Err(ConfigError("--threads must be at least 1".into()));
        }
        let code_exec = self.code_exec || file.code_exec.unwrap_or(false);
        let default_rounds = if code_exec { DEFAULT_CODE_ROUNDS } else { DEFAULT_MAX_ROUNDS };
        let max_rounds = self.skills_max_rounds.or(file.skills_max_rounds).unwrap_or(default_rounds);
        if !(MIN_ROUNDS..=MAX_ROUNDS).contains(&max_rounds) {
            return Err(ConfigError(format!(
                "--skills-max-rounds must be between {MIN_ROUNDS} and {MAX_ROUNDS}, got {max_rounds}"
            )));
        }
        let loop_settings = LoopSettings {
            max_rounds,
            discovery: !(self.skills_no_discovery || file.skills_no_discovery.unwrap_or(false)),
            inline_selected_bodies: self.inline_selected_bodies || file.inline_selected_bodies.unwrap_or(false),
            allow_exec: self.skills_allow_exec || file.skills_allow_exec.unwrap_or(false),
            code_temperature: self.code_exec_temperature.or(file.code_exec_temperature),
            turn_timeout: match self.turn_timeout.or(file.turn_timeout) {
                Some(0) => return Err(ConfigError("--turn-timeout must be at least 1 second".into())),
                Some(seconds) => std::time::Duration::from_secs(seconds),
                None => DEFAULT_TURN_TIMEOUT,
            },
        };
        if let Some(t) = loop_settings.code_temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ConfigError(format!("--code-exec-temperature must be between 0 and 2, got {t}")));
            }
        }
        if let Some(dir) = &self.sandbox_profiles.clone().or(file.sandbox_profiles.clone()) {
            if !dir.is_dir() {
                return Err(ConfigError(format!("--sandbox-profiles: the directory {} does not exist", dir.display())));
            }
        }
        let uid_range = match (&self.sandbox_uid_range, &file.sandbox_uid_range) {
            (Some(range), _) => *range,
            (None, Some(text)) => {
                text.parse().map_err(|err| ConfigError(format!("sandbox-uid-range in the config file: {err}")))?
            }
            (None, None) => DEFAULT_UID_RANGE,
        };
        let inside = uid_range.accounts_inside();
        if !inside.is_empty() {
            return Err(ConfigError(format!(
                "--sandbox-uid-range {uid_range} holds accounts of this host ({}); sandboxed commands would share their files. Choose a range no account uses",
                inside.join(", ")
            )));
        }
        let workspace_max_bytes =
            self.workspace_max_bytes.or(file.workspace_max_bytes).unwrap_or(DEFAULT_WORKSPACE_MAX_BYTES);
        if workspace_max_bytes < MIN_WORKSPACE_BYTES {
            return Err(ConfigError(format!(
                "--workspace-max-bytes must be at least {MIN_WORKSPACE_BYTES} (1 MiB), got {workspace_max_bytes}"
            )));
        }
        let exec = ExecConfig {
            code_exec,
            code_network: self.code_exec_allow_network || file.code_exec_allow_network.unwrap_or(false),
            code_unconfined: self.code_exec_unconfined || file.code_exec_unconfined.unwrap_or(false),
            skills_network: self.skills_allow_network || file.skills_allow_network.unwrap_or(false),
            mode: self.skills_sandbox.or(file.skills_sandbox).unwrap_or(SandboxModeArg::Required),
            uid_range,
            sandbox_profiles: self.sandbox_profiles.clone().or(file.sandbox_profiles.clone()),
            workspace_dir: self.workspace_dir.clone().or(file.workspace_dir.clone()).unwrap_or_else(std::env::temp_dir),
            workspace_max_bytes,
        };
        // A command granted the network shares the host's: it could reach
        // this server's own API, other services on loopback and the
        // link-local addresses where cloud metadata lives. skillhost has no
        // isolated network to give it, so in required mode the grant is
        // refused rather than quietly weakened.
        if exec.mode == SandboxModeArg::Required {
            for (granted, flag) in
                [(exec.code_network, "--code-exec-allow-network"), (exec.skills_network, "--skills-allow-network")]
            {
                if granted {
                    return Err(ConfigError(format!(
                        "{flag} cannot be granted with --skills-sandbox required: a command with network would share this host's, reaching its loopback services (this server's API included) and link-local addresses, and skillhost has no isolated network for commands. Use --skills-sandbox preferred to grant it anyway (each result then names the gap)"
                    )));
                }
            }
        }
        Ok(ServeConfig {
            host: self.host.or(file.host).unwrap_or(DEFAULT_HOST),
            port: self.port.or(file.port).unwrap_or(DEFAULT_PORT),
            log_format: self.log_format.or(file.log_format).unwrap_or(LogFormat::Text),
            engine: EngineConfig { model_path: model, n_ctx: ctx_size, n_parallel: parallel, n_threads: threads },
            skills,
            loop_settings,
            exec,
        })
    }
}

fn read_config(path: &Path) -> Result<RawConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| ConfigError(format!("--config: cannot read {}: {err}", path.display())))?;
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    serde_yaml::from_str(&text)
        .map_err(|err| ConfigError(format!("--config: {} is not a valid config: {err}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::io::Write;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        let mut file = match std::fs::File::create(&path) {
            Ok(f) => f,
            Err(err) => panic!("{err}"),
        };
        let _ = file.write_all(text.as_bytes());
        path
    }

    fn dir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(d) => d,
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn flags_win_over_files_and_later_files_win() {
        let dir = dir();
        write(dir.path(), "m.gguf", "");
        let a = write(dir.path(), "a.yaml", "model: m.gguf\nport: 6000\nparallel: 2\n");
        let b = write(dir.path(), "b.yaml", "port: 7000\nctx-size: 1024\n");
        let no_skills = SkillArgs { no_skills: true, ..SkillArgs::default() };
        let args = ServeArgs { config: vec![a, b], parallel: Some(3), skills: no_skills, ..ServeArgs::default() };
        let config = match args.resolve() {
            Ok(c) => c,
            Err(err) => panic!("{err}"),
        };
        assert_eq!(
            config,
            ServeConfig {
                host: IpAddr::from([127, 0, 0, 1]),
                port: 7000,
                log_format: LogFormat::Text,
                engine: EngineConfig {
                    model_path: dir.path().join("m.gguf"),
                    n_ctx: Some(1024),
                    n_parallel: 3,
                    n_threads: None,
                },
                skills: None,
                loop_settings: LoopSettings::default(),
                exec: ExecConfig::default(),
            }
        );
    }

    #[test]
    fn network_grants_are_refused_in_required_mode_and_named() {
        let dir = dir();
        write(dir.path(), "m.gguf", "");
        let model = Some(dir.path().join("m.gguf"));
        let skills = || SkillArgs { no_skills: true, ..SkillArgs::default() };
        for (code, script, flag) in
            [(true, false, "--code-exec-allow-network"), (false, true, "--skills-allow-network")]
        {
            let args = ServeArgs {
                model: model.clone(),
                code_exec: true,
                code_exec_allow_network: code,
                skills_allow_network: script,
                skills: skills(),
                ..ServeArgs::default()
            };
            let err = args.resolve().unwrap_err().to_string();
            assert!(err.starts_with(flag) && err.contains("loopback") && err.contains("preferred"), "{err}");
            // Chosen with preferred mode, the grant stands (and each result
            // names the gap).
            let args = ServeArgs {
                model: model.clone(),
                code_exec: true,
                code_exec_allow_network: code,
                skills_allow_network: script,
                skills_sandbox: Some(SandboxModeArg::Preferred),
                skills: skills(),
                ..ServeArgs::default()
            };
            assert!(args.resolve().is_ok());
        }
    }

    #[test]
    fn workspace_size_cap_at_and_below_the_minimum_and_uid_ranges_holding_accounts() {
        let dir = dir();
        write(dir.path(), "m.gguf", "");
        let resolve = |bytes: u64, range: Option<&str>| {
            ServeArgs {
                model: Some(dir.path().join("m.gguf")),
                workspace_max_bytes: Some(bytes),
                sandbox_uid_range: range.map(|r| r.parse().unwrap()),
                skills: SkillArgs { no_skills: true, ..SkillArgs::default() },
                ..ServeArgs::default()
            }
            .resolve()
        };
        assert_eq!(resolve(MIN_WORKSPACE_BYTES, None).unwrap().exec.workspace_max_bytes, MIN_WORKSPACE_BYTES);
        let err = resolve(MIN_WORKSPACE_BYTES - 1, None).unwrap_err().to_string();
        assert!(err.starts_with("--workspace-max-bytes must be at least"), "{err}");
        // Every host has an account with a uid of 1 to 100 (daemon, bin...).
        let err = resolve(MIN_WORKSPACE_BYTES, Some("1-100")).unwrap_err().to_string();
        assert!(err.starts_with("--sandbox-uid-range 1-100 holds accounts of this host"), "{err}");
    }

    #[test]
    fn skills_roots_precedence() {
        use skillhost_actors::skills::{Origin, Root};
        let dir = dir();
        for sub in ["one", "two", "three", "cli"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let a = write(
            dir.path(),
            "a.yaml",
            "skills-dir: [one, two]
",
        );
        let b = write(
            dir.path(),
            "b.yaml",
            "skills-dir: [three]
skills-watch: true
",
        );
        let install = dir.path().join("uploads");
        let discovered = |names: &[&str]| -> Vec<Root> {
            let mut roots = vec![Root { path: install.clone(), origin: Origin::Installed }];
            roots.extend(names.iter().map(|n| Root { path: dir.path().join(n), origin: Origin::Discovered }));
            roots
        };
        let args = |cli: Vec<PathBuf>, files: Vec<PathBuf>| ListSkillsArgs {
            skills: SkillArgs { skills_dir: cli, skills_install_dir: Some(install.clone()), ..SkillArgs::default() },
            config: files,
        };
        // The last file's roots replace earlier files'; the install dir comes first and is created.
        let config = args(vec![], vec![a.clone(), b.clone()]).resolve().unwrap().unwrap();
        assert_eq!((config.roots, config.watch), (discovered(&["three"]), true));
        assert!(install.is_dir());
        // Command-line roots replace every file's.
        let config = args(vec![dir.path().join("cli")], vec![a.clone()]).resolve().unwrap().unwrap();
        assert_eq!(config.roots, discovered(&["cli"]));
        // A root that does not exist names the flag.
        let err = args(vec![dir.path().join("missing")], vec![]).resolve().unwrap_err();
        assert_eq!(
            err.0,
            format!("--skills-dir: the directory {} does not exist", dir.path().join("missing").display())
        );
        // Off is off, from a file too.
        let off = write(
            dir.path(),
            "off.yaml",
            "no-skills: true
",
        );
        assert_eq!(args(vec![], vec![off]).resolve().unwrap(), None);
    }

    #[test]
    fn bad_configs_name_the_flag() {
        let dir = dir();
        let model = write(dir.path(), "m.gguf", "");
        let unknown = write(dir.path(), "u.yaml", "modle: x\n");
        let missing = dir.path().join("nope.gguf");
        let off = || SkillArgs { no_skills: true, ..SkillArgs::default() };
        let cases: Vec<(ServeArgs, &str)> = vec![
            (ServeArgs { skills: off(), ..Default::default() }, "no model given"),
            (
                ServeArgs { model: Some(missing.clone()), skills: off(), ..Default::default() },
                "--model: the model file",
            ),
            (
                ServeArgs { model: Some(model.clone()), parallel: Some(0), skills: off(), ..Default::default() },
                "--parallel must be between 1 and 64, got 0",
            ),
            (
                ServeArgs {
                    model: Some(model.clone()),
                    parallel: Some(MAX_PARALLEL + 1),
                    skills: off(),
                    ..Default::default()
                },
                "--parallel must be between 1 and 64, got 65",
            ),
            (
                ServeArgs {
                    model: Some(model.clone()),
                    ctx_size: Some(MIN_CTX_SIZE - 1),
                    skills: off(),
                    ..Default::default()
                },
                "--ctx-size must be at least 256 tokens, got 255",
            ),
            (
                ServeArgs { model: Some(model.clone()), threads: Some(0), skills: off(), ..Default::default() },
                "--threads must be at least 1",
            ),
            (
                ServeArgs {
                    model: Some(model.clone()),
                    skills_max_rounds: Some(0),
                    skills: off(),
                    ..Default::default()
                },
                "--skills-max-rounds must be between 1 and 64, got 0",
            ),
            (
                ServeArgs {
                    model: Some(model.clone()),
                    skills_max_rounds: Some(65),
                    skills: off(),
                    ..Default::default()
                },
                "--skills-max-rounds must be between 1 and 64, got 65",
            ),
            (
                ServeArgs { model: Some(model.clone()), config: vec![unknown], skills: off(), ..Default::default() },
                "unknown field `modle`",
            ),
        ];
        for (args, expected) in cases {
            let err = match args.resolve() {
                Ok(c) => panic!("accepted {c:?}"),
                Err(err) => err.0,
            };
            assert!(err.contains(expected), "{err:?} does not contain {expected:?}");
        }
        // The limits themselves are accepted.
        let ok = ServeArgs {
            model: Some(model),
            parallel: Some(MAX_PARALLEL),
            ctx_size: Some(MIN_CTX_SIZE),
            skills_max_rounds: Some(MAX_ROUNDS),
            skills: off(),
            ..Default::default()
        };
        assert!(ok.resolve().is_ok());
    }
}
