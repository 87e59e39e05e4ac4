//! Command line and configuration files: flags, `SKILLHOST_*` variables and
//! `--config` YAML files merge into one validated [`ServeConfig`].
//!
//! Precedence, highest first: command-line flags, environment variables,
//! config files (later files override earlier ones), built-in defaults.
//! Config-file keys are the flag names.

#[cfg(test)]
mod docs;
pub mod models;
pub mod sources;

use skillhost_actors::tools::mcp::config::McpServerConfig;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::builder::BoolishValueParser;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum, ValueHint};
use serde::Deserialize;
use skillhost_actors::attachments::{DEFAULT_MAX_ATTACHMENT_BYTES, MAX_CONVERSATION_ATTACHMENT_BYTES};
use skillhost_actors::chat_loop::{
    LoopSettings, MultiAgent, DEFAULT_CODE_ROUNDS, DEFAULT_MAX_ROUNDS, DEFAULT_TURN_TIMEOUT, MAX_ROUNDS, MIN_ROUNDS,
};
use skillhost_actors::skills::discovery::Publish;
use skillhost_actors::skills::fetch::Domains;
use skillhost_actors::skills::roots::registry_roots;
use skillhost_actors::skills::scan::{Policies, Policy};
use skillhost_actors::skills::{versions, SkillsConfig};
use skillhost_actors::store::{Retention, DEFAULT_MAX_AGE, DEFAULT_MAX_BYTES, MIN_MAX_BYTES};
use skillhost_actors::workspace::uids::{UidRange, DEFAULT_UID_RANGE};
use skillhost_actors::workspace::DEFAULT_WORKSPACE_MAX_BYTES;
use skillhost_engine::{EngineConfig, FlashAttn, RemoteConfig, Routing, UpstreamConfig, UpstreamMode};

pub const DEFAULT_HOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
pub const DEFAULT_PORT: u16 = 5000;
/// Sequences decoded together by default.
pub const DEFAULT_PARALLEL: u32 = 4;
/// Most slots `--parallel` accepts.
pub const MAX_PARALLEL: u32 = 64;
/// Most `--max-detached-turns` takes.
pub const MAX_DETACHED_TURNS: u32 = 1024;
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
    #[command(
        after_help = "Every switch has a --no-… form (for --no-skills, --skills) that turns off what a config file or variable turned on. Precedence: flag > SKILLHOST_* variable > later --config file > earlier file > default; see --print-config."
    )]
    Serve(Box<ServeArgs>),
    /// Chat with a model in this terminal: the same loop, flags and config file as serve, without HTTP.
    #[command(
        after_help = "Without a prompt or --input, and with a terminal on stdin, it is a conversation: /skills, /skill NAME, /system TEXT, /reset and /exit, Ctrl-C stops the answer being written. With a prompt or --input FILE it runs one turn and prints only the answer on stdout; skill and tool steps go to stderr, and the exit status is non-zero when the turn fails."
    )]
    Chat(Box<ChatArgs>),
    /// Print the skills registry (what is registered, where from, warnings
    /// and errors) and exit, without loading a model.
    ListSkills(ListSkillsArgs),
    /// Run one command in the OS sandbox exactly as the tools would, and exit with its status.
    RunSandboxed(crate::sandbox_cli::RunSandboxedArgs),
    /// Print what this host's sandbox confines and what it does not.
    Doctor(crate::sandbox_cli::DoctorArgs),
    /// Apply a patch read from stdin, as the model's apply_patch tool does; exit 0 only when it applied.
    ApplyPatch(crate::patch_cli::ApplyPatchArgs),
    /// The operator's MCP servers.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Installed skills, managed from the command line.
    #[command(subcommand)]
    Skills(SkillsCommand),
}

/// `skillhost skills ...`.
#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// Install into the install folder, without a running server: a ZIP archive by URL, checked against --sha256 before it is unpacked, or every skill another server publishes (its base URL: /.well-known/agent-skills/index.json, every entry's digest checked). Fetches only from --skills-install-domains, and uploads' install policy applies.
    #[command(
        after_help = "A running server sees the new skills on its next rescan (POST /api/skills/rescan, or --skills-watch). Versions an install retires stay on disk until the server next starts, since a running turn may be reading them."
    )]
    Add(Box<SkillsAddArgs>),
}

/// Flags of `skillhost skills add`.
#[derive(Debug, Default, Args)]
pub struct SkillsAddArgs {
    #[command(flatten)]
    pub skills: SkillArgs,
    /// YAML config file whose keys are the flag names; repeatable, later files win
    #[arg(long = "config", env = "SKILLHOST_CONFIG", value_delimiter = ',')]
    pub config: Vec<PathBuf>,
    /// The archive's SHA-256 digest (64 hex digits, optionally after sha256:); required for an archive URL
    #[arg(long)]
    pub sha256: Option<String>,
    /// Replace an installed skill of the same name (the old version stays in its history)
    #[arg(long)]
    pub overwrite: bool,
    /// A ZIP archive's URL (with --sha256), or the base URL of a server that publishes skills
    // An `Option` only for the settings' second parse, which leaves
    // positional arguments out; the command line requires it.
    #[arg(required = true)]
    pub url: Option<String>,
}

/// `skillhost mcp ...`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Start every configured MCP server as serve would (confined, with the same flags and config file; no model is needed), print its tools, resources and prompts, or why it did not start, and exit; non-zero when one failed.
    List(Box<McpListArgs>),
}

/// Flags of `skillhost mcp list`: serve's, so the same config file works.
#[derive(Debug, Args)]
pub struct McpListArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Print JSON (the shape of GET /api/mcp) instead of text
    #[arg(long)]
    pub json: bool,
}

/// The command line's definition: the derived one, with a `--no-…`
/// negation for every switch of `serve` and `list-skills`.
pub fn command() -> clap::Command {
    Cli::command()
        .mut_subcommand("serve", sources::with_negations)
        .mut_subcommand("chat", sources::with_negations)
        .mut_subcommand("list-skills", sources::with_negations)
        .mut_subcommand("mcp", |mcp| mcp.mut_subcommand("list", sources::with_negations))
        .mut_subcommand("skills", |skills| skills.mut_subcommand("add", sources::with_negations))
}

/// A subcommand's settings after merging every layer, and the merged
/// layers themselves (for `--print-config`).
pub fn layered<T: FromArgMatches>(
    root: &clap::Command,
    matches: &ArgMatches,
    name: &str,
) -> Result<(T, sources::Merged), ConfigError> {
    // A nested subcommand is named by its path: `mcp list`.
    let mut command = root;
    let mut given = matches;
    for word in name.split(' ') {
        let (Some(inner), Some(inner_given)) = (command.find_subcommand(word), given.subcommand_matches(word)) else {
            return Err(ConfigError(format!("no subcommand {name}")));
        };
        (command, given) = (inner, inner_given);
    }
    let merged = sources::merge(command, given)?;
    let parsed = sources::parse(command, &merged)?;
    let args = T::from_arg_matches(&parsed).map_err(|err| ConfigError(err.to_string()))?;
    Ok((args, merged))
}

// The headings `serve --help` groups its flags under; the flag tables in
// docs/configuration.md follow them.
const LISTENING: &str = "Listening and keys";
const MODEL: &str = "Model and engine";
const UPSTREAMS: &str = "Upstreams and replicas";
const SKILLS: &str = "Skills";
const LOOP: &str = "The loop and agents";
const CODE: &str = "Code execution";
const INSTALLS: &str = "Installs";
const SANDBOX: &str = "Sandbox";
const CONFIG: &str = "Config and logging";
const STATE: &str = "State";
const MCP: &str = "MCP servers";

/// Skills flags, shared by `serve` and `list-skills`.
#[derive(Debug, Default, Args)]
pub struct SkillArgs {
    /// Directory of skills to scan; repeatable; replaces the default roots
    /// [default: every .agents/skills from here up to the Git repository root]
    #[arg(long = "skills-dir", env = "SKILLHOST_SKILLS_DIR", value_delimiter = ':', value_hint = ValueHint::DirPath, help_heading = SKILLS)]
    pub skills_dir: Vec<PathBuf>,
    /// Where uploaded skills are installed; always scanned first
    /// [default: skills/ in the state folder (--state-dir of serve); made on the first upload]
    #[arg(long = "skills-install-dir", env = "SKILLHOST_SKILLS_INSTALL_DIR", value_hint = ValueHint::DirPath, help_heading = SKILLS)]
    pub skills_install_dir: Option<PathBuf>,
    /// Turn skills off entirely
    #[arg(long = "no-skills", env = "SKILLHOST_NO_SKILLS", help_heading = SKILLS)]
    pub no_skills: bool,
    /// Rescan the skills roots when their files change (500 ms debounce)
    #[arg(long = "skills-watch", env = "SKILLHOST_SKILLS_WATCH", help_heading = SKILLS)]
    pub skills_watch: bool,
    /// Also rescan every this many seconds, for roots on NFS or other shared storage whose changes file events do not report [default: off]
    #[arg(long = "skills-poll", env = "SKILLHOST_SKILLS_POLL", help_heading = SKILLS)]
    pub skills_poll: Option<u64>,
    /// Previous versions each installed skill keeps, for GET /api/skills/{id}/versions and rollback (0 to 100) [default: 5]
    #[arg(long = "skills-keep-versions", env = "SKILLHOST_SKILLS_KEEP_VERSIONS", help_heading = SKILLS)]
    pub skills_keep_versions: Option<usize>,
    /// What the static scan's findings stop: warn loads a skill and shows its findings; strict refuses one with a finding at high or above [default: warn for the --skills-dir roots, strict for uploads and installs by URL]
    #[arg(long = "skills-install-policy", env = "SKILLHOST_SKILLS_INSTALL_POLICY", value_enum, help_heading = SKILLS)]
    pub skills_install_policy: Option<InstallPolicy>,
    /// Hosts that installs by URL (POST /api/skills/install, skillhost skills add) may fetch from, and redirects may lead to: names like github.com, *.example.com for every name under it, or IP addresses; comma-separated [default: none, so installs by URL are off]
    #[arg(long = "skills-install-domains", env = "SKILLHOST_SKILLS_INSTALL_DOMAINS", value_delimiter = ',', help_heading = SKILLS)]
    pub skills_install_domains: Vec<String>,
    /// Skills to list at /.well-known/agent-skills/index.json, each with a ZIP archive and its digest, for other servers to install: names, or all; comma-separated [default: none; the index answers 404]
    #[arg(long = "skills-publish", env = "SKILLHOST_SKILLS_PUBLISH", value_delimiter = ',', help_heading = SKILLS)]
    pub skills_publish: Vec<String>,
}

/// `--skills-install-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstallPolicy {
    Warn,
    Strict,
}

/// Flags of `skillhost chat`: every flag of `serve`, and the conversation's.
#[derive(Debug, Default, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// The system message the conversation starts with
    #[arg(long, env = "SKILLHOST_SYSTEM")]
    pub system: Option<String>,
    /// Talk turn by turn even when a prompt or --input is given (the default without them when stdin is a terminal)
    #[arg(short = 'i', long = "interactive")]
    pub interactive: bool,
    /// Run one turn with this file's text as the message ('-' reads stdin) and print only the answer
    #[arg(long, value_hint = ValueHint::FilePath)]
    pub input: Option<PathBuf>,
    /// Run one turn with this message and print only the answer
    #[arg(trailing_var_arg = true)]
    pub prompt: Vec<String>,
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
    #[arg(long, env = "SKILLHOST_HOST", help_heading = LISTENING)]
    pub host: Option<IpAddr>,
    /// Port to listen on; 0 picks a free port and logs it [default: 5000]
    #[arg(long, env = "SKILLHOST_PORT", help_heading = LISTENING)]
    pub port: Option<u16>,
    /// A GGUF model file, as PATH or NAME=PATH (requests name it in their model field; a bare path is named after its file); repeatable, the first is the default (required unless --models-dir or --upstream is given)
    #[arg(long, short = 'm', env = "SKILLHOST_MODEL", value_hint = ValueHint::FilePath, help_heading = MODEL)]
    pub model: Vec<String>,
    /// A model with its own settings, as the JSON of a config file's `models:` entry: {"name", "path", "ctx-size", "parallel", "gpu-layers", "threads", "aliases", "embedding", "pooling"}; repeatable
    #[arg(long, env = "SKILLHOST_MODEL_ENTRY", help_heading = MODEL)]
    pub model_entry: Vec<String>,
    /// A folder whose .gguf files are all offered as models, each named after its file (a split model by its first part)
    #[arg(long, env = "SKILLHOST_MODELS_DIR", value_hint = ValueHint::DirPath, help_heading = MODEL)]
    pub models_dir: Option<PathBuf>,
    /// The model that answers requests naming none, and that loads at start [default: the first --model, else the first in --models-dir]
    #[arg(long, env = "SKILLHOST_DEFAULT_MODEL", help_heading = MODEL)]
    pub default_model: Option<String>,
    /// Models kept in memory at once; loading one more first unloads the least recently used idle one [default: no limit but --models-memory]
    #[arg(long, env = "SKILLHOST_MAX_LOADED_MODELS", help_heading = MODEL)]
    pub max_loaded_models: Option<usize>,
    /// Memory the loaded models may take, weights plus KV cache, in bytes or with a suffix (8G, 512M); past it the least recently used idle model is unloaded first [default: 75% of the host's memory]
    #[arg(long, env = "SKILLHOST_MODELS_MEMORY", help_heading = MODEL)]
    pub models_memory: Option<String>,
    /// Unload a model nobody used for this many seconds (the next request that names it loads it again) [default: never]
    #[arg(long, env = "SKILLHOST_MODEL_IDLE_UNLOAD", help_heading = MODEL)]
    pub model_idle_unload: Option<u64>,
    /// An inference server to send generation to instead of loading a model: URL[,mode=completion|chat][,weight=N][,max-concurrent=N][,model=NAME][,key-env=VAR][,api=auto|openai]; repeatable
    #[arg(long, env = "SKILLHOST_UPSTREAM", help_heading = UPSTREAMS)]
    pub upstream: Vec<String>,
    /// With --upstream: a GGUF whose chat template and vocabulary render and count prompts (its weights are not read) [default: the template from llama-server's /props]
    #[arg(long, env = "SKILLHOST_TEMPLATE_FROM", value_hint = ValueHint::FilePath, help_heading = UPSTREAMS)]
    pub template_from: Option<PathBuf>,
    /// With --upstream: how a request's upstream is chosen: affinity (a conversation stays on the upstream that caches its prefix) or round-robin [default: affinity]
    #[arg(long, value_enum, env = "SKILLHOST_UPSTREAM_ROUTING", help_heading = UPSTREAMS)]
    pub upstream_routing: Option<RoutingArg>,
    /// This replica's name when several run behind a load balancer: stamped into conversation and response ids, and sent as the skillhost_replica cookie to route by [default: none]
    #[arg(long, env = "SKILLHOST_REPLICA_ID", help_heading = UPSTREAMS)]
    pub replica_id: Option<String>,
    /// With --upstream: a built-in prompt format (chatml, gemma or plain) when no template is known
    #[arg(long, env = "SKILLHOST_TEMPLATE_FORMAT", help_heading = UPSTREAMS)]
    pub template_format: Option<String>,
    /// Requests decoded together, each in its own KV slot [default: 4]
    #[arg(long, short = 'n', env = "SKILLHOST_PARALLEL", help_heading = MODEL)]
    pub parallel: Option<u32>,
    /// Context size in tokens, shared by all slots [default: the model's training context, at most 8192]
    #[arg(long, short = 'c', env = "SKILLHOST_CTX_SIZE", help_heading = MODEL)]
    pub ctx_size: Option<u32>,
    /// CPU threads for decoding [default: all cores]
    #[arg(long, short = 't', env = "SKILLHOST_THREADS", help_heading = MODEL)]
    pub threads: Option<u32>,
    /// Model layers to offload to the GPU in a GPU build (`make run GPU=cuda`), as llama-server's --n-gpu-layers [default: all of them]
    #[arg(long, env = "SKILLHOST_GPU_LAYERS", help_heading = MODEL)]
    pub gpu_layers: Option<u32>,
    /// Folder where the prefix every request shares (system text and skills block) is saved, so it is not prefilled again after a restart [default: off]
    #[arg(long, env = "SKILLHOST_PREFIX_CACHE", value_hint = ValueHint::DirPath, help_heading = MODEL)]
    pub prefix_cache: Option<PathBuf>,
    /// Draft tokens from each sequence's own context (prompt lookup) and check them in the batch: faster where a turn repeats text it holds (a rewritten file, a patch, a quoted result), with the same greedy output; `--spec-lookup=false` turns it off [default: on in a CPU build; off in a GPU build, whose kernels are not checked to keep drafted output exact]
    #[arg(long = "spec-lookup", env = "SKILLHOST_SPEC_LOOKUP", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = BoolishValueParser::new(), help_heading = MODEL)]
    pub spec_lookup: Option<bool>,
    /// llama.cpp's flash attention (auto, on, off or prefill), as llama-server's -fa; prefill runs the fused kernel for prefill and the unfused ones for decoding, faster at both for a lone stream on the CPU, slower with many (see docs/deployment.md) [default: auto, llama.cpp's choice: on where the device supports it]
    #[arg(long = "flash-attn", env = "SKILLHOST_FLASH_ATTN", help_heading = MODEL)]
    pub flash_attn: Option<FlashAttnArg>,
    /// Temperature for requests that set none, 0 to 2, as llama-server's --temp [default: 0.8]
    #[arg(long, env = "SKILLHOST_TEMPERATURE", help_heading = MODEL)]
    pub temperature: Option<f32>,
    /// Most tokens a turn generates when its request sets no budget, as llama-server's --n-predict [default: until the context is full]
    #[arg(long, env = "SKILLHOST_MAX_TOKENS", help_heading = MODEL)]
    pub max_tokens: Option<u32>,
    /// YAML config file whose keys are these flag names; repeatable, later files win
    #[arg(long = "config", env = "SKILLHOST_CONFIG", value_delimiter = ',', help_heading = CONFIG)]
    pub config: Vec<PathBuf>,
    /// Log format [default: text]
    #[arg(long, value_enum, env = "SKILLHOST_LOG_FORMAT", help_heading = CONFIG)]
    pub log_format: Option<LogFormat>,
    #[command(flatten)]
    pub skills: SkillArgs,
    /// Print the skills registry and exit, without loading a model
    #[arg(long = "list-skills", help_heading = SKILLS)]
    pub list_skills: bool,
    /// Print the effective settings, each with where it came from, and exit without loading a model
    #[arg(long = "print-config", help_heading = CONFIG)]
    pub print_config: bool,
    /// A key clients must send (Authorization: Bearer KEY or x-api-key); repeatable
    #[arg(long = "api-key", env = "SKILLHOST_API_KEY", value_delimiter = ',', help_heading = LISTENING)]
    pub api_key: Vec<String>,
    /// File of client keys, one a line; re-read on SIGHUP
    #[arg(long = "api-key-file", env = "SKILLHOST_API_KEY_FILE", value_hint = ValueHint::FilePath, help_heading = LISTENING)]
    pub api_key_file: Option<PathBuf>,
    /// A key for what changes the server (uploading, deleting and rescanning skills); repeatable
    #[arg(long = "admin-key", env = "SKILLHOST_ADMIN_KEY", value_delimiter = ',', help_heading = LISTENING)]
    pub admin_key: Vec<String>,
    /// File of admin keys, one a line; re-read on SIGHUP
    #[arg(long = "admin-key-file", env = "SKILLHOST_ADMIN_KEY_FILE", value_hint = ValueHint::FilePath, help_heading = LISTENING)]
    pub admin_key_file: Option<PathBuf>,
    /// A key /metrics requires [default: /metrics is open]
    #[arg(long = "metrics-key", env = "SKILLHOST_METRICS_KEY", help_heading = LISTENING)]
    pub metrics_key: Option<String>,
    /// Listen on a non-loopback address with no key (anyone who reaches the port may use the server)
    #[arg(long = "insecure-no-auth", env = "SKILLHOST_INSECURE_NO_AUTH", help_heading = LISTENING)]
    pub insecure_no_auth: bool,
    /// Browser origins (scheme://host:port) besides the server's own that may call the API; repeatable
    #[arg(long = "allowed-origins", env = "SKILLHOST_ALLOWED_ORIGINS", value_delimiter = ',', help_heading = LISTENING)]
    pub allowed_origins: Vec<String>,
    /// Host names besides loopback ones accepted in the Host header of a loopback-bound server; repeatable
    #[arg(long = "allowed-hosts", env = "SKILLHOST_ALLOWED_HOSTS", value_delimiter = ',', help_heading = LISTENING)]
    pub allowed_hosts: Vec<String>,
    /// Requests waiting for a slot beyond those decoding; past it, 503 with Retry-After [default: 4 x --parallel]
    #[arg(long = "max-queued", env = "SKILLHOST_MAX_QUEUED", help_heading = LISTENING)]
    pub max_queued: Option<u32>,
    /// Do not advertise unselected skills; a request reaches only what it selects
    #[arg(long = "skills-no-discovery", env = "SKILLHOST_SKILLS_NO_DISCOVERY", help_heading = SKILLS)]
    pub skills_no_discovery: bool,
    /// A skill selected for every request that selects none; repeatable (checked against the registry at start-up)
    #[arg(long = "skill", env = "SKILLHOST_SKILL", value_delimiter = ',', help_heading = SKILLS)]
    pub skill: Vec<String>,
    /// Tool rounds per turn, 1 to 64 [default: 8]
    #[arg(long = "skills-max-rounds", env = "SKILLHOST_SKILLS_MAX_ROUNDS", help_heading = LOOP)]
    pub skills_max_rounds: Option<u32>,
    /// Seconds one turn may run, all rounds and tools together; then it ends with what it has [default: 1800]
    #[arg(long = "turn-timeout", env = "SKILLHOST_TURN_TIMEOUT", help_heading = LOOP)]
    pub turn_timeout: Option<u64>,
    /// Turns that may run at once with no client attached (Responses API `background: true`, Web UI turns whose page left); one more stops the oldest [default: --parallel]
    #[arg(long = "max-detached-turns", env = "SKILLHOST_MAX_DETACHED_TURNS", help_heading = LOOP)]
    pub max_detached_turns: Option<u32>,
    /// When the model is offered the coordination tools (spawn_agent and the rest): auto, on requests that offer it other tools; always; off [default: auto]
    #[arg(long = "multi-agent", env = "SKILLHOST_MULTI_AGENT", help_heading = LOOP)]
    pub multi_agent: Option<MultiAgentArg>,
    /// Child agents may use the parent's tools that write and run, in the parent's workspace; without it they only read
    #[arg(long = "agents-allow-write", env = "SKILLHOST_AGENTS_ALLOW_WRITE", help_heading = LOOP)]
    pub agents_allow_write: bool,
    /// Offer skills_run (running a skill's bundled scripts)
    #[arg(long = "skills-allow-exec", env = "SKILLHOST_SKILLS_ALLOW_EXEC", help_heading = SKILLS)]
    pub skills_allow_exec: bool,
    /// Put selected skills' instructions in the prompt instead of letting the model load them
    #[arg(long = "inline-selected-bodies", env = "SKILLHOST_INLINE_SELECTED_BODIES", help_heading = SKILLS)]
    pub inline_selected_bodies: bool,
    /// Offer the code tools: read_file, write_file, apply_patch and a sandboxed shell
    #[arg(long = "code-exec", env = "SKILLHOST_CODE_EXEC", help_heading = CODE)]
    pub code_exec: bool,
    /// Let shell commands use the network
    #[arg(long = "code-exec-allow-network", env = "SKILLHOST_CODE_EXEC_ALLOW_NETWORK", help_heading = CODE)]
    pub code_exec_allow_network: bool,
    /// Let the host perform the pip and npm installs a shell command asks for (wheels only, no package scripts, into the workspace)
    #[arg(long = "code-exec-allow-install", env = "SKILLHOST_CODE_EXEC_ALLOW_INSTALL", help_heading = INSTALLS)]
    pub code_exec_allow_install: bool,
    /// The only packages the host installs, comma-separated [default: any name that passes the checks]
    #[arg(long = "code-exec-packages", env = "SKILLHOST_CODE_EXEC_PACKAGES", value_delimiter = ',', help_heading = INSTALLS)]
    pub code_exec_packages: Vec<String>,
    /// The Python package index the host's installer uses [default: https://pypi.org/simple]
    #[arg(long = "code-exec-install-index", env = "SKILLHOST_CODE_EXEC_INSTALL_INDEX", help_heading = INSTALLS)]
    pub code_exec_install_index: Option<String>,
    /// The npm registry the host's installer uses [default: https://registry.npmjs.org/]
    #[arg(long = "code-exec-npm-registry", env = "SKILLHOST_CODE_EXEC_NPM_REGISTRY", help_heading = INSTALLS)]
    pub code_exec_npm_registry: Option<String>,
    /// The only hosts the installer may reach, comma-separated [default: pypi.org, files.pythonhosted.org, registry.npmjs.org and the hosts of the index and registry]
    #[arg(long = "code-exec-install-domains", env = "SKILLHOST_CODE_EXEC_INSTALL_DOMAINS", value_delimiter = ',', help_heading = INSTALLS)]
    pub code_exec_install_domains: Vec<String>,
    /// The program that runs scripts of an extension, as EXT=PATH, or EXT= to remove one (repeatable) [default: .py the newest python3.N, .js/.mjs/.cjs node, .sh/.bash bash]
    #[arg(long = "interpreter", env = "SKILLHOST_INTERPRETER", value_delimiter = ',', help_heading = CODE)]
    pub interpreter: Vec<String>,
    /// A CA bundle whose certificates commands granted the network (and the installer) trust, at most 16 MiB (repeatable)
    #[arg(long = "ca-bundle", env = "SKILLHOST_CA_BUNDLE", value_delimiter = ',', value_hint = ValueHint::FilePath, help_heading = CODE)]
    pub ca_bundle: Vec<PathBuf>,
    /// Run shell commands without the sandbox (never on a server untrusted users reach)
    #[arg(long = "code-exec-unconfined", env = "SKILLHOST_CODE_EXEC_UNCONFINED", help_heading = CODE)]
    pub code_exec_unconfined: bool,
    /// Temperature for code turns whose request leaves it at the default
    #[arg(long = "code-exec-temperature", env = "SKILLHOST_CODE_EXEC_TEMPERATURE", help_heading = CODE)]
    pub code_exec_temperature: Option<f32>,
    /// Let skill scripts (skills_run) use the network
    #[arg(long = "skills-allow-network", env = "SKILLHOST_SKILLS_ALLOW_NETWORK", help_heading = SKILLS)]
    pub skills_allow_network: bool,
    /// Whether commands must be sandboxed: required (sandboxed or refused), preferred or off [default: required]
    #[arg(long = "skills-sandbox", value_enum, env = "SKILLHOST_SKILLS_SANDBOX", help_heading = SANDBOX)]
    pub skills_sandbox: Option<SandboxModeArg>,
    /// Uids given out one per live workspace when the server is root, as FIRST-LAST [default: 1879048192-1879113727]
    #[arg(long = "sandbox-uid-range", env = "SKILLHOST_SANDBOX_UID_RANGE", help_heading = SANDBOX)]
    pub sandbox_uid_range: Option<UidRange>,
    /// Largest a workspace may grow, in bytes (a size-capped tmpfs when the server is root) [default: 1073741824]
    #[arg(long = "workspace-max-bytes", env = "SKILLHOST_WORKSPACE_MAX_BYTES", help_heading = SANDBOX)]
    pub workspace_max_bytes: Option<u64>,
    /// What size-capped workspaces may hold together, in bytes; a new one past it is refused [default: half of this host's memory]
    #[arg(long = "sandbox-memory", env = "SKILLHOST_SANDBOX_MEMORY", help_heading = SANDBOX)]
    pub sandbox_memory: Option<u64>,
    /// Folder of sandbox profiles [default: the profiles built into skillhost]
    #[arg(long = "sandbox-profiles", env = "SKILLHOST_SANDBOX_PROFILES", value_hint = ValueHint::DirPath, help_heading = SANDBOX)]
    pub sandbox_profiles: Option<PathBuf>,
    /// Where request workspaces and artifacts live [default: the system temp folder]
    #[arg(long = "workspace-dir", env = "SKILLHOST_WORKSPACE_DIR", value_hint = ValueHint::DirPath, help_heading = SANDBOX)]
    pub workspace_dir: Option<PathBuf>,
    /// Where stored responses and conversations live (the Web UI's with their files), and installed skills unless --skills-install-dir names a folder [default: /var/lib/skillhost as root, else $XDG_DATA_HOME/skillhost]
    #[arg(long = "state-dir", env = "SKILLHOST_STATE_DIR", value_hint = ValueHint::DirPath, help_heading = STATE)]
    pub state_dir: Option<PathBuf>,
    /// Stored responses untouched this many seconds are deleted [default: 2592000, 30 days]
    #[arg(long = "state-max-age", env = "SKILLHOST_STATE_MAX_AGE", help_heading = STATE)]
    pub state_max_age: Option<u64>,
    /// What the store may hold, in bytes; past it the oldest records go [default: 1073741824]
    #[arg(long = "state-max-bytes", env = "SKILLHOST_STATE_MAX_BYTES", help_heading = STATE)]
    pub state_max_bytes: Option<u64>,
    /// Largest file a message may carry or /v1/files may take, in bytes, at most 67108864 [default: 33554432]
    #[arg(long = "max-attachment-bytes", env = "SKILLHOST_MAX_ATTACHMENT_BYTES", help_heading = STATE)]
    pub max_attachment_bytes: Option<u64>,
    /// A file of MCP servers whose tools the model may call, in the {"mcpServers": {...}} form Claude Code, Cursor and llama-server read; repeatable
    #[arg(long = "mcp-config", env = "SKILLHOST_MCP_CONFIG", value_delimiter = ',', value_hint = ValueHint::FilePath, help_heading = MCP)]
    pub mcp_config: Vec<PathBuf>,
    /// MCP servers as the JSON of an mcpServers map (a config file's `mcp-servers:` key)
    #[arg(long = "mcp-servers", env = "SKILLHOST_MCP_SERVERS", help_heading = MCP)]
    pub mcp_servers: Option<String>,
    /// A hosted tool a client may declare (OpenAI's web_search, file_search, ...) answered by an MCP tool, as KIND=mcp__SERVER__TOOL; repeatable. Unmapped ones are left out of the prompt and named in the x-skillhost-dropped-tools header
    #[arg(long = "hosted-tool", env = "SKILLHOST_HOSTED_TOOL", value_delimiter = ',', help_heading = MCP)]
    pub hosted_tool: Vec<String>,
    /// Refuse a request that declares an unmapped hosted tool with a 400, instead of leaving the tool out
    #[arg(long = "strict-hosted-tools", env = "SKILLHOST_STRICT_HOSTED_TOOLS", help_heading = MCP)]
    pub strict_hosted_tools: bool,
    /// Offer skills_run to clients of POST /mcp: a client names a skill's script and it runs in the sandbox, as the model's call would (needs --skills-allow-exec)
    #[arg(long = "mcp-serve-scripts", env = "SKILLHOST_MCP_SERVE_SCRIPTS", help_heading = MCP)]
    pub mcp_serve_scripts: bool,
    /// Named rewrites of text a known client changes between requests or sessions at the front of its prompt (Claude Code's billing line), so its prompts keep hitting the KV cache: `all`, `none`, or a comma-separated list of rules (see docs/clients-and-agents.md) [default: all]
    #[arg(long = "normalize-client-prompts", env = "SKILLHOST_NORMALIZE_CLIENT_PROMPTS", help_heading = LISTENING)]
    pub normalize_client_prompts: Option<String>,
    /// Seconds one MCP tool call may run [default: 60]
    #[arg(long = "mcp-call-timeout", env = "SKILLHOST_MCP_CALL_TIMEOUT", help_heading = MCP)]
    pub mcp_call_timeout: Option<u64>,
}

/// `--multi-agent`: when requests may delegate to child agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MultiAgentArg {
    /// On requests that offer the model other tools (the caller's, skills
    /// or code tools): a plain question pays nothing for delegation.
    Auto,
    /// On every request of a model that can call tools.
    Always,
    Off,
}

/// Whether drafting is on when `--spec-lookup` is not given: on the CPU,
/// where every flash-attention policy computes a drafted step's positions
/// as it computes each alone (see `skillhost_engine::flash_attention`), so
/// greedy output is unchanged. A GPU's kernels are not checked for that.
fn drafts_by_default() -> bool {
    !skillhost_engine::GPU_BUILD
}

/// `--flash-attn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlashAttnArg {
    Auto,
    On,
    Off,
    Prefill,
}

impl From<FlashAttnArg> for FlashAttn {
    fn from(arg: FlashAttnArg) -> Self {
        match arg {
            FlashAttnArg::Auto => FlashAttn::Auto,
            FlashAttnArg::On => FlashAttn::On,
            FlashAttnArg::Off => FlashAttn::Off,
            FlashAttnArg::Prefill => FlashAttn::Prefill,
        }
    }
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
    /// Host-run installs, when allowed.
    pub install: Option<InstallConfig>,
    /// `--interpreter` entries, applied to what the host has.
    pub interpreters: Vec<String>,
    /// `--ca-bundle` files.
    pub ca_bundles: Vec<PathBuf>,
    pub code_unconfined: bool,
    pub skills_network: bool,
    pub mode: SandboxModeArg,
    pub uid_range: UidRange,
    pub sandbox_profiles: Option<PathBuf>,
    pub workspace_dir: PathBuf,
    pub workspace_max_bytes: u64,
    /// `--sandbox-memory`; `None` for half of the host's memory.
    pub sandbox_memory: Option<u64>,
}

impl Default for ExecConfig {
    /// Code execution off; skill scripts, when allowed, run in the required
    /// sandbox, one uid per workspace, with workspaces under the system temp
    /// directory.
    fn default() -> Self {
        ExecConfig {
            code_exec: false,
            code_network: false,
            install: None,
            interpreters: Vec::new(),
            ca_bundles: Vec::new(),
            code_unconfined: false,
            skills_network: false,
            mode: SandboxModeArg::Required,
            uid_range: DEFAULT_UID_RANGE,
            sandbox_profiles: None,
            workspace_dir: std::env::temp_dir(),
            workspace_max_bytes: DEFAULT_WORKSPACE_MAX_BYTES,
            sandbox_memory: None,
        }
    }
}

/// How the host installs packages for the model, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallConfig {
    pub packages: Vec<String>,
    pub python_index: String,
    pub npm_registry: String,
    /// The hosts the install proxy lets the installer reach.
    pub domains: Vec<String>,
}

/// The host of an http(s) URL, lowercase; an error sentence naming `flag`.
fn url_host(url: &str, flag: &str) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| ConfigError(format!("{flag} must be an http:// or https:// URL, got '{url}'")))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(ConfigError(format!(
            "{flag} must not carry credentials: the URL reaches the installer's command line"
        )));
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    if host.is_empty() {
        return Err(ConfigError(format!("{flag} names no host: '{url}'")));
    }
    Ok(host.to_ascii_lowercase())
}

impl InstallConfig {
    /// Checks the index, the registry and the hosts, and fills in the
    /// defaults: the index's and registry's own hosts are always reachable
    /// when no list is given, and must be on a list that is.
    fn new(
        packages: &[String],
        index: Option<&str>,
        registry: Option<&str>,
        domains: &[String],
    ) -> Result<InstallConfig, ConfigError> {
        use skillhost_actors::tools::install::{
            npm_spec, python_spec, DEFAULT_INSTALL_DOMAINS, DEFAULT_NPM_REGISTRY, DEFAULT_PYTHON_INDEX,
        };
        let python_index = index.unwrap_or(DEFAULT_PYTHON_INDEX).to_string();
        let npm_registry = registry.unwrap_or(DEFAULT_NPM_REGISTRY).to_string();
        let index_host = url_host(&python_index, "--code-exec-install-index")?;
        let registry_host = url_host(&npm_registry, "--code-exec-npm-registry")?;
        let mut hosts: Vec<String> = domains
            .iter()
            .map(|d| d.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|d| !d.is_empty())
            .collect();
        for host in &hosts {
            if host.contains(['/', ':', '@', ' ']) && !host.starts_with('[') {
                return Err(ConfigError(format!("--code-exec-install-domains takes host names, got '{host}'")));
            }
        }
        if hosts.is_empty() {
            hosts = DEFAULT_INSTALL_DOMAINS.iter().map(|d| d.to_string()).collect();
            hosts.extend([index_host, registry_host]);
        } else {
            for (host, flag) in
                [(&index_host, "--code-exec-install-index"), (&registry_host, "--code-exec-npm-registry")]
            {
                if !hosts.contains(host) {
                    return Err(ConfigError(format!(
                        "{flag} is on {host}, which is not one of --code-exec-install-domains ({}); add it, or the installer could never reach it",
                        hosts.join(", ")
                    )));
                }
            }
        }
        hosts.sort();
        hosts.dedup();
        for name in packages {
            if python_spec(name).is_err() && npm_spec(name).is_err() {
                return Err(ConfigError(format!("--code-exec-packages: '{name}' is not a package name")));
            }
        }
        Ok(InstallConfig { packages: packages.to_vec(), python_index, npm_registry, domains: hosts })
    }
}

/// The validated configuration of `skillhost serve`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub host: IpAddr,
    pub port: u16,
    pub log_format: LogFormat,
    /// The default model's settings.
    pub engine: EngineConfig,
    /// Every model's settings, the default first (empty with `--upstream`).
    pub models: Vec<ModelConfig>,
    /// `--max-loaded-models`, `--models-memory`, `--model-idle-unload`.
    pub model_limits: skillhost_actors::model::ModelLimits,
    /// Upstream servers in place of `engine`'s model, with `--upstream`.
    pub remote: Option<RemoteConfig>,
    /// `--replica-id`.
    pub replica_id: Option<String>,
    /// `None` with `--no-skills`.
    pub skills: Option<SkillsConfig>,
    pub loop_settings: LoopSettings,
    pub exec: ExecConfig,
    pub access: AccessConfig,
    /// Requests that may wait for a slot; more are refused with a 503.
    pub max_queued: u32,
    /// `--max-detached-turns`.
    pub max_detached_turns: u32,
    /// `--state-dir`: the store's folder.
    pub state_dir: PathBuf,
    /// `--state-max-age` and `--state-max-bytes`.
    pub retention: Retention,
    /// `--max-attachment-bytes`.
    pub max_attachment_bytes: u64,
    /// `--mcp-config` and `mcp-servers:`, merged.
    pub mcp_servers: Vec<McpServerConfig>,
    /// `--mcp-call-timeout`.
    pub mcp_call_timeout: std::time::Duration,
    /// `--hosted-tool` and `--strict-hosted-tools`.
    pub hosted: skillhost_actors::tools::mcp::hosted::HostedTools,
    /// `--mcp-serve-scripts`: `POST /mcp` offers `skills_run`.
    pub mcp_serve_scripts: bool,
    /// `--normalize-client-prompts`.
    pub client_prompts: crate::client_prompts::ClientPrompts,
}

/// One configured model: a GGUF loaded here, or upstream servers that run
/// it (a `models:` entry with `upstream:`).
#[derive(Debug, Clone, PartialEq)]
pub enum ModelConfig {
    Local(EngineConfig),
    Upstream(RemoteConfig),
}

impl ModelConfig {
    pub fn name(&self) -> Option<&str> {
        match self {
            ModelConfig::Local(engine) => engine.name.as_deref(),
            ModelConfig::Upstream(remote) => remote.name.as_deref(),
        }
    }

    /// The settings of a model loaded here.
    pub fn local(&self) -> Option<&EngineConfig> {
        match self {
            ModelConfig::Local(engine) => Some(engine),
            ModelConfig::Upstream(_) => None,
        }
    }
}

/// The range of `--skills-poll`: a rescan reads every SKILL.md, so more
/// often than each second is waste; less often than daily is no polling.
pub const MIN_SKILLS_POLL_SECS: u64 = 1;
pub const MAX_SKILLS_POLL_SECS: u64 = 86_400;

/// Most upstreams one server sends to.
pub const MAX_UPSTREAMS: usize = 64;
/// The largest `weight=` of an upstream.
pub const MAX_UPSTREAM_WEIGHT: u32 = 1000;

/// `--upstream-routing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoutingArg {
    Affinity,
    RoundRobin,
}

/// Reads one `--upstream` value: `URL[,option=value]...`.
pub fn parse_upstream(spec: &str) -> Result<UpstreamConfig, ConfigError> {
    let bad = |detail: String| ConfigError(format!("--upstream {spec}: {detail}"));
    let mut parts = spec.split(',').map(str::trim);
    let url = parts.next().unwrap_or_default().trim_end_matches('/');
    let host = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return Err(bad("the URL must start with http:// or https://".into()));
    };
    // Credentials in a URL would show in --print-config and in logs.
    if host.split('/').next().is_some_and(|authority| authority.contains('@')) {
        return Err(ConfigError(
            "--upstream: the URL carries a user name or password; put the upstream's key in a variable and name it with key-env=VAR".into(),
        ));
    }
    // A base URL given with its API root (`…/v1`, as OpenAI clients take
    // it) means the server's root: our paths add `/v1` themselves.
    let url = url.strip_suffix("/v1").unwrap_or(url).to_string();
    let mut config = UpstreamConfig { url, weight: 1, ..UpstreamConfig::default() };
    for part in parts.filter(|p| !p.is_empty()) {
        let Some((key, value)) = part.split_once('=') else {
            return Err(bad(format!("'{part}' is not option=value")));
        };
        let number =
            |value: &str| value.parse::<u32>().map_err(|_| bad(format!("{key} must be a whole number, got '{value}'")));
        match key {
            "mode" => {
                config.mode = match value {
                    "completion" => UpstreamMode::Completion,
                    "chat" => UpstreamMode::Chat,
                    other => return Err(bad(format!("mode must be completion or chat, got '{other}'"))),
                }
            }
            "weight" => {
                let weight = number(value)?;
                if !(1..=MAX_UPSTREAM_WEIGHT).contains(&weight) {
                    return Err(bad(format!("weight must be between 1 and {MAX_UPSTREAM_WEIGHT}, got {weight}")));
                }
                config.weight = weight;
            }
            "max-concurrent" => {
                let n = number(value)?;
                if n == 0 {
                    return Err(bad("max-concurrent must be at least 1".into()));
                }
                config.max_concurrent = Some(n);
            }
            "model" if !value.is_empty() => config.model = Some(value.to_string()),
            "api" => {
                config.openai_api = match value {
                    "auto" => false,
                    "openai" => true,
                    other => return Err(bad(format!("api must be auto or openai, got '{other}'"))),
                }
            }
            "key-env" => {
                // Keys stay out of flags and files that --print-config shows.
                let key = std::env::var(value)
                    .map_err(|_| bad(format!("the variable {value} named by key-env is not set")))?;
                config.api_key = Some(key);
            }
            other => {
                return Err(bad(format!(
                    "unknown option '{other}' (the options are mode, weight, max-concurrent, model, key-env and api)"
                )))
            }
        }
    }
    Ok(config)
}

/// The smallest workspace size cap: a workspace must hold a few files.
pub const MIN_WORKSPACE_BYTES: u64 = 1024 * 1024;

/// A configuration that cannot be used; the message names the flag or key.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl SkillArgs {
    /// The registry setup, or `None` when skills are off. Every explicit root
    /// must exist; the install directory is made on the first upload.
    /// `state_dir` is the state folder uploads go under by default.
    fn resolve(&self, state_dir: &Path) -> Result<Option<SkillsConfig>, ConfigError> {
        if self.no_skills {
            return Ok(None);
        }
        for root in &self.skills_dir {
            if !root.is_dir() {
                return Err(ConfigError(format!("--skills-dir: the directory {} does not exist", root.display())));
            }
        }
        let install_dir = match self.skills_install_dir.clone() {
            Some(dir) => dir,
            None => state_dir.join(INSTALL_SUBDIR),
        };
        let cwd =
            std::env::current_dir().map_err(|err| ConfigError(format!("cannot read the working directory: {err}")))?;
        let roots = registry_roots(Some(&install_dir), &self.skills_dir, &cwd);
        let poll = match self.skills_poll {
            None => None,
            Some(seconds) if (MIN_SKILLS_POLL_SECS..=MAX_SKILLS_POLL_SECS).contains(&seconds) => {
                Some(std::time::Duration::from_secs(seconds))
            }
            Some(seconds) => {
                return Err(ConfigError(format!(
                    "--skills-poll must be between {MIN_SKILLS_POLL_SECS} and {MAX_SKILLS_POLL_SECS} seconds, got {seconds}"
                )))
            }
        };
        let keep_versions = self.skills_keep_versions.unwrap_or(versions::DEFAULT_KEEP_VERSIONS);
        if keep_versions > versions::MAX_KEEP_VERSIONS {
            return Err(ConfigError(format!(
                "--skills-keep-versions must be between 0 and {}, got {keep_versions}",
                versions::MAX_KEEP_VERSIONS
            )));
        }
        Ok(Some(SkillsConfig {
            roots,
            install_dir: Some(install_dir),
            watch: self.skills_watch,
            poll,
            selected: Vec::new(),
            keep_versions,
            policy: match self.skills_install_policy {
                None => Policies::default(),
                Some(InstallPolicy::Warn) => Policies::all(Policy::Warn),
                Some(InstallPolicy::Strict) => Policies::all(Policy::Strict),
            },
            install_domains: Domains::parse(&self.skills_install_domains)
                .map_err(|err| ConfigError(format!("--skills-install-domains: {err}")))?,
            publish: Publish::from_names(&self.skills_publish),
        }))
    }
}

/// The state folder when none is named: state belongs in the system's
/// state folder (root) or the user's data folder, never next to a binary
/// that may sit in a build tree.
pub fn default_state_dir() -> Result<PathBuf, ConfigError> {
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from(SYSTEM_STATE_DIR));
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")))
        .ok_or_else(|| ConfigError("neither XDG_DATA_HOME nor HOME is set; pass --state-dir".into()))?;
    Ok(data.join("skillhost"))
}

/// The state folder of a server running as root.
pub const SYSTEM_STATE_DIR: &str = "/var/lib/skillhost";
/// Where uploads go inside the state folder.
pub const INSTALL_SUBDIR: &str = "skills";

impl SkillsAddArgs {
    /// The registry setup the install goes into.
    pub fn resolve_skills(&self) -> Result<Option<SkillsConfig>, ConfigError> {
        self.skills.resolve(&default_state_dir()?)
    }
}

impl ListSkillsArgs {
    /// The registry setup `list-skills` prints.
    pub fn resolve(self) -> Result<Option<SkillsConfig>, ConfigError> {
        self.skills.resolve(&default_state_dir()?)
    }
}

impl ServeArgs {
    /// `--state-dir`, or the default.
    fn state_dir(&self) -> Result<PathBuf, ConfigError> {
        match &self.state_dir {
            Some(dir) => Ok(dir.clone()),
            None => default_state_dir(),
        }
    }

    /// With `--list-skills`, only the skills part matters.
    pub fn resolve_list_skills(&self) -> Result<Option<SkillsConfig>, ConfigError> {
        self.skills.resolve(&self.state_dir()?)
    }

    /// Validates the merged settings (see [`sources`]). Nothing is loaded
    /// yet, so a bad value fails before the model is read.
    pub fn resolve(self) -> Result<ServeConfig, ConfigError> {
        self.resolve_with(true)
    }

    /// The settings for a command that loads no model (`mcp list`): every
    /// check of `resolve`, but a missing model is no error.
    pub fn resolve_without_model(self) -> Result<ServeConfig, ConfigError> {
        self.resolve_with(false)
    }

    fn resolve_with(self, needs_model: bool) -> Result<ServeConfig, ConfigError> {
        let state_dir = self.state_dir()?;
        let retention = Retention {
            max_age: match self.state_max_age {
                Some(0) => return Err(ConfigError("--state-max-age must be at least 1 second".into())),
                Some(seconds) => std::time::Duration::from_secs(seconds),
                None => DEFAULT_MAX_AGE,
            },
            max_bytes: match self.state_max_bytes {
                Some(bytes) if bytes < MIN_MAX_BYTES => {
                    return Err(ConfigError(format!(
                        "--state-max-bytes must be at least {MIN_MAX_BYTES} (1 MiB), got {bytes}"
                    )))
                }
                Some(bytes) => bytes,
                None => DEFAULT_MAX_BYTES,
            },
        };
        let mut skills = self.skills.resolve(&state_dir)?;
        match skills.as_mut() {
            Some(skills) => {
                skills.selected = self.skill.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
                skills.selected.sort();
                skills.selected.dedup();
            }
            None if !self.skill.is_empty() => {
                return Err(ConfigError("--skill selects a skill, but skills are off (--no-skills)".into()))
            }
            None => {}
        }
        let remote = self.resolve_upstreams()?;
        if let Some(id) = &self.replica_id {
            skillhost_actors::replica::check(id).map_err(|err| ConfigError(err.to_string()))?;
        }
        let mut specs: Vec<models::EntrySpec> =
            self.model.iter().map(|spec| models::EntrySpec::from_spec(spec)).collect();
        for json in &self.model_entry {
            specs.push(models::EntrySpec::parse(json)?);
        }
        if let Some(dir) = &self.models_dir {
            specs.extend(models::scan_dir(dir)?.into_iter().map(|(name, path)| models::EntrySpec {
                name: Some(name),
                path: Some(path),
                ..Default::default()
            }));
        }
        if remote.is_some() && !specs.is_empty() {
            return Err(ConfigError(
                "--model and --upstream exclude each other: with upstreams no model is loaded here (give its GGUF as --template-from to render prompts with its template; to serve both, list the upstream as a `models:` entry with `upstream:`)".into(),
            ));
        }
        if remote.is_none() && specs.is_empty() && needs_model {
            return Err(ConfigError(
                "no model given: pass --model PATH, --models-dir DIR or --upstream URL (or set 'model', 'models' or 'upstreams' in a --config file)".into(),
            ));
        }
        if specs.len() > models::MAX_MODELS {
            return Err(ConfigError(format!(
                "{} models are configured; one server offers at most {}",
                specs.len(),
                models::MAX_MODELS
            )));
        }
        for path in specs.iter().filter_map(|spec| spec.path.as_ref()) {
            if !path.is_file() {
                return Err(ConfigError(format!(
                    "--model: the model file {} does not exist (run `make model` for the default model)",
                    path.display()
                )));
            }
        }
        let mut model_names: Vec<String> = Vec::new();
        // Names and aliases together: a request's model field finds one model.
        let mut taken: Vec<&str> = Vec::new();
        for spec in &specs {
            // An entry has a name or a path (`EntrySpec::parse`).
            let name = match (&spec.name, &spec.path) {
                (Some(name), _) => name.clone(),
                (None, path) => skillhost_engine::file_model_name(path.as_deref().unwrap_or(Path::new(""))),
            };
            if model_names.contains(&name) {
                return Err(ConfigError(format!(
                    "two models are called '{name}'; give each its own name (--model NAME=PATH)"
                )));
            }
            model_names.push(name);
        }
        for (spec, name) in specs.iter().zip(&model_names) {
            for alias in &spec.aliases {
                if taken.contains(&alias.as_str()) || model_names.contains(alias) {
                    return Err(ConfigError(format!(
                        "the alias '{alias}' of '{name}' is already the name or alias of a model; a name finds one model"
                    )));
                }
                taken.push(alias);
            }
        }
        // The default answers chat, so it is never an embedding model
        // unless every model is one.
        let default_index = match &self.default_model {
            Some(asked) => {
                let index = model_names.iter().position(|name| name == asked).ok_or_else(|| {
                    ConfigError(format!(
                        "--default-model '{asked}' is not one of the configured models: {}",
                        if model_names.is_empty() { "none are configured".to_string() } else { model_names.join(", ") }
                    ))
                })?;
                if specs[index].embedding {
                    return Err(ConfigError(format!(
                        "--default-model '{asked}' is an embedding model; the default answers chat requests that name no model"
                    )));
                }
                index
            }
            None => specs.iter().position(|spec| !spec.embedding).unwrap_or(0),
        };
        let model_limits =
            models::limits(self.max_loaded_models, self.models_memory.as_deref(), self.model_idle_unload)?;
        let model = specs.get(default_index).and_then(|spec| spec.path.clone()).unwrap_or_default();
        let parallel = self.parallel.unwrap_or(DEFAULT_PARALLEL);
        if !(1..=MAX_PARALLEL).contains(&parallel) {
            return Err(ConfigError(format!("--parallel must be between 1 and {MAX_PARALLEL}, got {parallel}")));
        }
        let ctx_size = self.ctx_size;
        if let Some(n) = ctx_size {
            if n < MIN_CTX_SIZE {
                return Err(ConfigError(format!("--ctx-size must be at least {MIN_CTX_SIZE} tokens, got {n}")));
            }
        }
        let threads = self.threads;
        if threads == Some(0) {
            return Err(ConfigError("--threads must be at least 1".into()));
        }
        let code_exec = self.code_exec;
        let default_rounds = if code_exec { DEFAULT_CODE_ROUNDS } else { DEFAULT_MAX_ROUNDS };
        let max_rounds = self.skills_max_rounds.unwrap_or(default_rounds);
        if !(MIN_ROUNDS..=MAX_ROUNDS).contains(&max_rounds) {
            return Err(ConfigError(format!(
                "--skills-max-rounds must be between {MIN_ROUNDS} and {MAX_ROUNDS}, got {max_rounds}"
            )));
        }
        let loop_settings = LoopSettings {
            max_rounds,
            discovery: !(self.skills_no_discovery),
            inline_selected_bodies: self.inline_selected_bodies,
            allow_exec: self.skills_allow_exec,
            temperature: self.temperature,
            max_tokens: match self.max_tokens {
                Some(0) => return Err(ConfigError("--max-tokens must be at least 1".into())),
                other => other,
            },
            code_temperature: self.code_exec_temperature,
            turn_timeout: match self.turn_timeout {
                Some(0) => return Err(ConfigError("--turn-timeout must be at least 1 second".into())),
                Some(seconds) => std::time::Duration::from_secs(seconds),
                None => DEFAULT_TURN_TIMEOUT,
            },
            multi_agent: match self.multi_agent.unwrap_or(MultiAgentArg::Auto) {
                MultiAgentArg::Auto => MultiAgent::Auto,
                MultiAgentArg::Always => MultiAgent::Always,
                MultiAgentArg::Off => MultiAgent::Off,
            },
            agents_allow_write: self.agents_allow_write,
            agent_limits: Default::default(),
        };
        for (flag, value) in
            [("--temperature", loop_settings.temperature), ("--code-exec-temperature", loop_settings.code_temperature)]
        {
            if let Some(t) = value.filter(|t| !(0.0..=2.0).contains(t)) {
                return Err(ConfigError(format!("{flag} must be between 0 and 2, got {t}")));
            }
        }
        if let Some(dir) = &self.sandbox_profiles.clone() {
            if !dir.is_dir() {
                return Err(ConfigError(format!("--sandbox-profiles: the directory {} does not exist", dir.display())));
            }
        }
        let uid_range = self.sandbox_uid_range.unwrap_or(DEFAULT_UID_RANGE);
        let inside = uid_range.accounts_inside();
        if !inside.is_empty() {
            return Err(ConfigError(format!(
                "--sandbox-uid-range {uid_range} holds accounts of this host ({}); sandboxed commands would share their files. Choose a range no account uses",
                inside.join(", ")
            )));
        }
        let workspace_max_bytes = self.workspace_max_bytes.unwrap_or(DEFAULT_WORKSPACE_MAX_BYTES);
        if workspace_max_bytes < MIN_WORKSPACE_BYTES {
            return Err(ConfigError(format!(
                "--workspace-max-bytes must be at least {MIN_WORKSPACE_BYTES} (1 MiB), got {workspace_max_bytes}"
            )));
        }
        if let Some(budget) = self.sandbox_memory.filter(|b| *b < workspace_max_bytes) {
            return Err(ConfigError(format!(
                "--sandbox-memory {budget} cannot hold one workspace of {workspace_max_bytes} bytes (--workspace-max-bytes): give at least that"
            )));
        }
        let install = match self.code_exec_allow_install {
            true if !code_exec => {
                return Err(ConfigError(
                    "--code-exec-allow-install needs --code-exec: installs are read out of shell commands".into(),
                ))
            }
            true => Some(InstallConfig::new(
                &self.code_exec_packages,
                self.code_exec_install_index.as_deref(),
                self.code_exec_npm_registry.as_deref(),
                &self.code_exec_install_domains,
            )?),
            false => None,
        };
        let exec = ExecConfig {
            code_exec,
            code_network: self.code_exec_allow_network,
            install,
            interpreters: self.interpreter.clone(),
            ca_bundles: self.ca_bundle.clone(),
            code_unconfined: self.code_exec_unconfined,
            skills_network: self.skills_allow_network,
            mode: self.skills_sandbox.unwrap_or(SandboxModeArg::Required),
            uid_range,
            sandbox_profiles: self.sandbox_profiles.clone(),
            workspace_dir: self.workspace_dir.clone().unwrap_or_else(std::env::temp_dir),
            workspace_max_bytes,
            sandbox_memory: self.sandbox_memory,
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
        let host = self.host.unwrap_or(DEFAULT_HOST);
        let access = AccessConfig {
            api_keys: checked_keys(&self.api_key, "--api-key")?,
            api_key_file: self.api_key_file.clone(),
            admin_keys: checked_keys(&self.admin_key, "--admin-key")?,
            admin_key_file: self.admin_key_file.clone(),
            metrics_key: match &self.metrics_key {
                Some(key) => checked_keys(std::slice::from_ref(key), "--metrics-key")?.pop(),
                None => None,
            },
            insecure_no_auth: self.insecure_no_auth,
            allowed_origins: self.allowed_origins.iter().map(|o| checked_origin(o)).collect::<Result<_, _>>()?,
            allowed_hosts: self.allowed_hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
        };
        // Key files must be readable now; they are read again on SIGHUP.
        for (path, flag) in [(&access.api_key_file, "--api-key-file"), (&access.admin_key_file, "--admin-key-file")] {
            if let Some(path) = path {
                read_key_file(path).map_err(|err| ConfigError(format!("{flag}: {err}")))?;
            }
        }
        // Anyone who can reach a non-loopback address could chat, run code
        // and upload skills: that takes a key or an explicit opt-out.
        if !host.is_loopback() && !access.user_keys_configured() && !access.insecure_no_auth {
            return Err(ConfigError(format!(
                "--host {host} is not a loopback address and no key is set: anyone who reaches the port could use this server. Pass --api-key KEY (or --api-key-file FILE), or --insecure-no-auth to serve without keys anyway"
            )));
        }
        let max_queued = self.max_queued.unwrap_or(parallel.saturating_mul(QUEUE_FACTOR));
        let max_attachment_bytes = self.max_attachment_bytes.unwrap_or(DEFAULT_MAX_ATTACHMENT_BYTES);
        // One file must fit in what a conversation may carry.
        if !(1..=MAX_CONVERSATION_ATTACHMENT_BYTES).contains(&max_attachment_bytes) {
            return Err(ConfigError(format!(
                "--max-attachment-bytes must be between 1 and {MAX_CONVERSATION_ATTACHMENT_BYTES}, got {max_attachment_bytes}"
            )));
        }
        let mcp_servers = self.resolve_mcp()?;
        let mcp_call_timeout = match self.mcp_call_timeout {
            Some(0) => return Err(ConfigError("--mcp-call-timeout must be at least 1 second".into())),
            Some(seconds) => std::time::Duration::from_secs(seconds),
            None => skillhost_actors::tools::mcp::hub::DEFAULT_CALL_TIMEOUT,
        };
        // Serving scripts is a second grant on top of the model's: the
        // operator who gives it has given the first.
        if self.mcp_serve_scripts && !self.skills_allow_exec {
            return Err(ConfigError(
                "--mcp-serve-scripts offers skills_run to MCP clients, which needs --skills-allow-exec as well".into(),
            ));
        }
        let names: Vec<String> = mcp_servers.iter().map(|server| server.name.clone()).collect();
        let hosted = skillhost_actors::tools::mcp::hosted::HostedTools::parse(
            &self.hosted_tool,
            self.strict_hosted_tools,
            &names,
        )
        .map_err(ConfigError)?;
        let client_prompts = match &self.normalize_client_prompts {
            Some(spec) => {
                crate::client_prompts::ClientPrompts::parse(spec).map_err(|err| ConfigError(err.to_string()))?
            }
            None => Default::default(),
        };
        let max_detached_turns = self.max_detached_turns.unwrap_or(parallel);
        if !(1..=MAX_DETACHED_TURNS).contains(&max_detached_turns) {
            return Err(ConfigError(format!(
                "--max-detached-turns must be between 1 and {MAX_DETACHED_TURNS}, got {max_detached_turns}"
            )));
        }
        let engine = EngineConfig {
            model_path: model,
            name: model_names.get(default_index).cloned(),
            n_ctx: ctx_size,
            n_parallel: parallel,
            n_threads: threads,
            gpu_layers: self.gpu_layers,
            prefix_cache: self.prefix_cache,
            spec_lookup: self.spec_lookup.unwrap_or_else(drafts_by_default),
            flash_attn: self.flash_attn.map_or_else(FlashAttn::default, FlashAttn::from),
            ..EngineConfig::default()
        };
        // Every model, the default first, each with the server-wide
        // settings but those its entry sets.
        let mut order: Vec<usize> = (0..specs.len()).collect();
        order.sort_by_key(|index| *index != default_index);
        let models = order
            .into_iter()
            .map(|index| match specs[index].upstream {
                Some(_) => model_upstream(&specs[index], &model_names[index]).map(ModelConfig::Upstream),
                None => model_engine(&specs[index], &model_names[index], &engine).map(ModelConfig::Local),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let engine = models.first().and_then(ModelConfig::local).cloned().unwrap_or(engine);
        Ok(ServeConfig {
            host,
            port: self.port.unwrap_or(DEFAULT_PORT),
            log_format: self.log_format.unwrap_or(LogFormat::Text),
            engine,
            models,
            model_limits,
            remote,
            replica_id: self.replica_id.clone(),
            skills,
            loop_settings,
            exec,
            access,
            max_queued,
            max_detached_turns,
            state_dir,
            retention,
            max_attachment_bytes,
            mcp_servers,
            mcp_call_timeout,
            hosted,
            mcp_serve_scripts: self.mcp_serve_scripts,
            client_prompts,
        })
    }

    /// Every `--mcp-config` file and the `mcp-servers` map, each entry
    /// checked (a fault names its file and server), `${VARIABLE}`s read
    /// from this process's environment.
    fn resolve_mcp(&self) -> Result<Vec<McpServerConfig>, ConfigError> {
        use skillhost_actors::tools::mcp::config;
        let variable = |name: &str| std::env::var(name).ok();
        let mut sources = Vec::new();
        for path in &self.mcp_config {
            let text = std::fs::read_to_string(path)
                .map_err(|err| ConfigError(format!("--mcp-config: cannot read {}: {err}", path.display())))?;
            let source = format!("--mcp-config {}", path.display());
            sources.push(config::parse_file(&text, &source, &variable).map_err(|err| ConfigError(err.to_string()))?);
        }
        if let Some(json) = &self.mcp_servers {
            let value: serde_json::Value = serde_json::from_str(json)
                .map_err(|err| ConfigError(format!("mcp-servers is not a map of servers: {err}")))?;
            sources.push(
                config::parse_servers(&value, "mcp-servers", &variable).map_err(|err| ConfigError(err.to_string()))?,
            );
        }
        config::merge(sources).map_err(ConfigError)
    }

    fn resolve_upstreams(&self) -> Result<Option<RemoteConfig>, ConfigError> {
        if self.upstream.is_empty() {
            for (set, flag) in [
                (self.template_from.is_some(), "--template-from"),
                (self.template_format.is_some(), "--template-format"),
            ] {
                if set {
                    return Err(ConfigError(format!("{flag} applies only with --upstream")));
                }
            }
            return Ok(None);
        }
        if self.upstream.len() > MAX_UPSTREAMS {
            return Err(ConfigError(format!("at most {MAX_UPSTREAMS} upstreams, got {}", self.upstream.len())));
        }
        let upstreams = self.upstream.iter().map(|spec| parse_upstream(spec)).collect::<Result<Vec<_>, _>>()?;
        if let Some(path) = &self.template_from {
            if !path.is_file() {
                return Err(ConfigError(format!("--template-from: the file {} does not exist", path.display())));
            }
        }
        if let Some(name) = &self.template_format {
            if !skillhost_engine::template::BUILT_IN_FORMATS.contains(&name.as_str()) {
                return Err(ConfigError(format!(
                    "--template-format must be one of {}, got '{name}'",
                    skillhost_engine::template::BUILT_IN_FORMATS.join(", ")
                )));
            }
        }
        Ok(Some(RemoteConfig {
            upstreams,
            routing: match self.upstream_routing {
                None | Some(RoutingArg::Affinity) => Routing::Affinity,
                Some(RoutingArg::RoundRobin) => Routing::RoundRobin,
            },
            template_from: self.template_from.clone(),
            template_format: self.template_format.clone(),
            n_ctx: self.ctx_size,
            name: None,
            aliases: Vec::new(),
        }))
    }
}

/// The default `--max-queued` is this many times `--parallel`.
pub const QUEUE_FACTOR: u32 = 4;

/// Who may call what, as configured (the keys in files are read by the
/// HTTP layer, at start-up and on SIGHUP).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AccessConfig {
    pub api_keys: Vec<String>,
    pub api_key_file: Option<PathBuf>,
    pub admin_keys: Vec<String>,
    pub admin_key_file: Option<PathBuf>,
    pub metrics_key: Option<String>,
    pub insecure_no_auth: bool,
    /// Origins as `scheme://host[:port]`, lower case.
    pub allowed_origins: Vec<String>,
    pub allowed_hosts: Vec<String>,
}

impl AccessConfig {
    /// Whether clients need a key for chat and model routes.
    pub fn user_keys_configured(&self) -> bool {
        !self.api_keys.is_empty() || self.api_key_file.is_some()
    }
}

/// Keys travel in a header: printable ASCII without spaces, not empty.
fn checked_keys(keys: &[String], flag: &str) -> Result<Vec<String>, ConfigError> {
    keys.iter()
        .map(|key| check_key(key).map(str::to_string).map_err(|err| ConfigError(format!("{flag}: {err}"))))
        .collect()
}

/// Why a key or a key file is refused: at start-up the server does not
/// start; on SIGHUP the keys in force stay as they were.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("a key is empty")]
    Empty,
    #[error("a key may hold only printable ASCII characters without spaces (it is sent in a header)")]
    NotPrintable,
    #[error("cannot read {}: {source}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    /// A line of a key file holds a key that is refused.
    #[error("{} line {line}: {key}", path.display())]
    Line { path: PathBuf, line: usize, key: Box<KeyError> },
    /// A key file with no key would lock every client out (or, for admin
    /// keys, mean nothing).
    #[error("{} holds no key", .0.display())]
    NoKey(PathBuf),
}

fn check_key(key: &str) -> Result<&str, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyError::NotPrintable);
    }
    Ok(key)
}

/// Reads a key file: one key a line; blank lines and lines starting with
/// `#` are skipped. A file with no key is an error (it would lock every
/// client out, or, for admin keys, mean nothing).
pub fn read_key_file(path: &Path) -> Result<Vec<String>, KeyError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| KeyError::Unreadable { path: path.to_path_buf(), source })?;
    let mut keys = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let refused = |key| KeyError::Line { path: path.to_path_buf(), line: number + 1, key: Box::new(key) };
        keys.push(check_key(line).map_err(refused)?.to_string());
    }
    if keys.is_empty() {
        return Err(KeyError::NoKey(path.to_path_buf()));
    }
    Ok(keys)
}

/// An origin as browsers send it: `scheme://host[:port]`, no path.
fn checked_origin(origin: &str) -> Result<String, ConfigError> {
    let lower = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let well_formed = lower
        .split_once("://")
        .is_some_and(|(scheme, rest)| matches!(scheme, "http" | "https") && !rest.is_empty() && !rest.contains('/'));
    if !well_formed {
        return Err(ConfigError(format!(
            "--allowed-origins: {origin:?} is not an origin; write scheme://host[:port], as in http://localhost:3000"
        )));
    }
    Ok(lower)
}

/// One model's engine settings: `base` (the server-wide flags) with what
/// its entry sets, each checked as its flag is.
fn model_engine(spec: &models::EntrySpec, name: &str, base: &EngineConfig) -> Result<EngineConfig, ConfigError> {
    let bad = |what: String| ConfigError(format!("models entry '{name}': {what}"));
    if let Some(n) = spec.ctx_size.filter(|n| *n < MIN_CTX_SIZE) {
        return Err(bad(format!("ctx-size must be at least {MIN_CTX_SIZE} tokens, got {n}")));
    }
    if let Some(n) = spec.parallel.filter(|n| !(1..=MAX_PARALLEL).contains(n)) {
        return Err(bad(format!("parallel must be between 1 and {MAX_PARALLEL}, got {n}")));
    }
    if spec.threads == Some(0) {
        return Err(bad("threads must be at least 1".into()));
    }
    Ok(EngineConfig {
        model_path: spec.path.clone().unwrap_or_default(),
        name: Some(name.to_string()),
        aliases: spec.aliases.clone(),
        n_ctx: spec.ctx_size.or(base.n_ctx),
        n_parallel: spec.parallel.unwrap_or(base.n_parallel),
        n_threads: spec.threads.or(base.n_threads),
        gpu_layers: spec.gpu_layers.or(base.gpu_layers),
        embedding: spec.embedding,
        pooling: spec.pooling.map_or(skillhost_engine::Pooling::Declared, Into::into),
        ..base.clone()
    })
}

/// An upstream entry's fleet: its servers checked as `--upstream` values
/// are, its template as `--template-from` and `--template-format` are.
fn model_upstream(spec: &models::EntrySpec, name: &str) -> Result<RemoteConfig, ConfigError> {
    let bad = |what: String| ConfigError(format!("models entry '{name}': {what}"));
    if let Some(n) = spec.ctx_size.filter(|n| *n < MIN_CTX_SIZE) {
        return Err(bad(format!("ctx-size must be at least {MIN_CTX_SIZE} tokens, got {n}")));
    }
    let servers = spec.upstream.as_ref().map(models::OneOrMany::to_vec).unwrap_or_default();
    if servers.is_empty() {
        return Err(bad("`upstream` lists no server".into()));
    }
    if servers.len() > MAX_UPSTREAMS {
        return Err(bad(format!("at most {MAX_UPSTREAMS} upstreams, got {}", servers.len())));
    }
    let upstreams = servers
        .iter()
        .map(|server| parse_upstream(server).map_err(|err| bad(err.0.trim_start_matches("--").to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = spec.template_from.as_ref().filter(|path| !path.is_file()) {
        return Err(bad(format!("template-from: the file {} does not exist", path.display())));
    }
    if let Some(format) = spec.template_format.as_ref() {
        if !skillhost_engine::template::BUILT_IN_FORMATS.contains(&format.as_str()) {
            return Err(bad(format!(
                "template-format must be one of {}, got '{format}'",
                skillhost_engine::template::BUILT_IN_FORMATS.join(", ")
            )));
        }
    }
    Ok(RemoteConfig {
        upstreams,
        routing: Routing::Affinity,
        template_from: spec.template_from.clone(),
        template_format: spec.template_format.clone(),
        n_ctx: spec.ctx_size,
        name: Some(name.to_string()),
        aliases: spec.aliases.clone(),
    })
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

    /// The whole path a command line takes: clap, the layers, validation.
    fn from_args(args: &[&str]) -> Result<ServeConfig, ConfigError> {
        let definition = command();
        let mut argv = vec!["skillhost", "serve"];
        argv.extend_from_slice(args);
        let matches = definition.clone().try_get_matches_from(argv).map_err(|err| ConfigError(err.to_string()))?;
        let (args, _) = layered::<ServeArgs>(&definition, &matches, "serve")?;
        args.resolve()
    }

    fn list_skills(args: &[String]) -> Result<Option<SkillsConfig>, ConfigError> {
        let definition = command();
        let mut argv = vec!["skillhost".to_string(), "list-skills".to_string()];
        argv.extend_from_slice(args);
        let matches = definition.clone().try_get_matches_from(argv).map_err(|err| ConfigError(err.to_string()))?;
        let (args, _) = layered::<ListSkillsArgs>(&definition, &matches, "list-skills")?;
        args.resolve()
    }

    fn dir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(d) => d,
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn models_come_from_flags_a_folder_and_the_file_and_the_default_leads() {
        let dir = dir();
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        let a = write(dir.path(), "a.gguf", "");
        write(&folder, "c.gguf", "");
        write(&folder, "d-00001-of-00002.gguf", "");
        write(&folder, "d-00002-of-00002.gguf", "");
        let a = a.to_string_lossy();
        let named = format!("big={a}");
        let names = |config: &ServeConfig| {
            config.models.iter().map(|m| m.name().unwrap_or_default().to_string()).collect::<Vec<_>>()
        };
        let folder_arg = folder.to_string_lossy();
        let base = ["--no-skills", "--model", &a, "--model", &named, "--models-dir", &folder_arg];
        let config = from_args(&base).unwrap();
        assert_eq!(names(&config), ["a", "big", "c", "d"]);
        assert_eq!(config.engine.name.as_deref(), Some("a"));
        assert!(local(&config, 3).model_path.ends_with("d-00001-of-00002.gguf"));
        let config = from_args(
            &[
                &base[..],
                &[
                    "--default-model",
                    "c",
                    "--max-loaded-models",
                    "2",
                    "--models-memory",
                    "4G",
                    "--model-idle-unload",
                    "60",
                ],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(names(&config), ["c", "a", "big", "d"]);
        assert_eq!(config.engine.model_path, folder.join("c.gguf"));
        assert_eq!((config.model_limits.max_loaded, config.model_limits.memory_bytes), (2, 4 << 30));
        assert_eq!(config.model_limits.idle_unload, Some(std::time::Duration::from_secs(60)));

        let refused = |extra: &[&str]| from_args(&[&["--no-skills", "--model", &a][..], extra].concat()).unwrap_err().0;
        assert!(refused(&["--model", &a]).contains("two models are called 'a'"));
        assert!(
            refused(&["--default-model", "b"]).contains("--default-model 'b' is not one of the configured models: a")
        );
        assert!(refused(&["--max-loaded-models", "0"]).contains("at least 1"));
        assert!(refused(&["--models-memory", "lots"]).contains("--models-memory: 'lots' is not a size"));
        assert!(refused(&["--model", "x=/no/such.gguf"]).contains("/no/such.gguf does not exist"));

        // At most MAX_MODELS, and one past it is refused.
        let many = dir.path().join("many");
        std::fs::create_dir(&many).unwrap();
        for n in 0..models::MAX_MODELS {
            write(&many, &format!("m{n}.gguf"), "");
        }
        let many_arg = many.to_string_lossy().into_owned();
        assert_eq!(from_args(&["--no-skills", "--models-dir", &many_arg]).unwrap().models.len(), models::MAX_MODELS);
        write(&many, "one-more.gguf", "");
        let err = from_args(&["--no-skills", "--models-dir", &many_arg]).unwrap_err().0;
        assert!(err.contains("257 models are configured; one server offers at most 256"), "{err}");

        // The file: `model` as NAME=PATH and `models` as mappings, paths
        // relative to the file's folder.
        let file = write(
            dir.path(),
            "models.yaml",
            "model: small=a.gguf\nmodels:\n  - name: other\n    path: folder/c.gguf\n  - a.gguf\nno-skills: true\n",
        );
        let config = from_args(&["--config", &file.to_string_lossy()]).unwrap();
        assert_eq!(names(&config), ["small", "other", "a"]);
        assert_eq!(local(&config, 1).model_path, dir.path().join("folder/c.gguf"));
        let refused_file = |text: &str| {
            let bad = write(dir.path(), "bad.yaml", text);
            from_args(&["--config", &bad.to_string_lossy()]).unwrap_err().0
        };
        let entry = "models:\n  - name: x\n    path: a.gguf\n";
        let err = refused_file(&format!("{entry}    ctx-size: 4\n"));
        assert!(err.contains("models entry 'x': ctx-size must be at least 256 tokens, got 4"), "{err}");
        let err = refused_file(&format!("{entry}    flavour: sweet\n"));
        assert!(err.contains("unknown field `flavour`"), "{err}");
        let err = refused_file(&format!("{entry}    pooling: mean\n"));
        assert!(err.contains("pooling applies to an embedding model"), "{err}");
        let err = refused_file(&format!("{entry}    embedding: true\n    pooling: max\n"));
        assert!(err.contains("unknown variant `max`"), "{err}");
        let err = refused_file(&format!("{entry}    parallel: {}\n", MAX_PARALLEL + 1));
        assert!(err.contains("parallel must be between 1 and 64, got 65"), "{err}");
        let err = refused_file(&format!("{entry}    aliases: [a b]\n"));
        assert!(err.contains("the alias 'a b' is not a model name"), "{err}");
        let err = refused_file(&format!("{entry}    aliases: [y]\n  - name: y\n    path: a.gguf\n"));
        assert!(err.contains("the alias 'y' of 'x' is already the name or alias of a model"), "{err}");
        let err = refused_file(&format!("{entry}    embedding: true\ndefault-model: x\n"));
        assert!(err.contains("--default-model 'x' is an embedding model"), "{err}");
    }

    #[test]
    fn a_models_entry_sets_its_own_settings_over_the_server_wide_ones() {
        let dir = dir();
        write(dir.path(), "a.gguf", "");
        let file = write(
            dir.path(),
            "models.yaml",
            "ctx-size: 4096\nparallel: 2\nmodels:\n  - name: embed\n    path: a.gguf\n    embedding: true\n    pooling: cls\n    ctx-size: 512\n    threads: 1\n  - name: chat\n    path: a.gguf\n    parallel: 8\n    gpu-layers: 0\n    aliases: [small, fast]\nno-skills: true\n",
        );
        let config = from_args(&["--config", &file.to_string_lossy()]).unwrap();
        // The default is the first model that chats, not the embedding one.
        let (chat, embed) = (local(&config, 0), local(&config, 1));
        assert_eq!(config.models.len(), 2);
        assert_eq!(chat.name.as_deref(), Some("chat"));
        assert_eq!(config.engine, *chat);
        assert_eq!((chat.n_ctx, chat.n_parallel, chat.gpu_layers, chat.embedding), (Some(4096), 8, Some(0), false));
        assert_eq!(chat.aliases, ["small", "fast"]);
        assert_eq!((embed.n_ctx, embed.n_parallel, embed.n_threads), (Some(512), 2, Some(1)));
        assert_eq!((embed.embedding, embed.pooling), (true, skillhost_engine::Pooling::Cls));
        // The same entry as a flag.
        let path = dir.path().join("a.gguf");
        let json = format!(r#"{{"name":"e","path":"{}","embedding":true,"ctx-size":300}}"#, path.display());
        let config = from_args(&["--no-skills", "--model", &path.to_string_lossy(), "--model-entry", &json]).unwrap();
        assert_eq!(local(&config, 1).n_ctx, Some(300));
        assert!(local(&config, 1).embedding);
    }

    /// The `index`th model, which is loaded here.
    fn local(config: &ServeConfig, index: usize) -> &EngineConfig {
        config.models[index].local().unwrap_or_else(|| panic!("model {index} is an upstream: {:?}", config.models))
    }

    #[test]
    fn an_upstream_entry_sits_beside_local_models_under_its_own_name() {
        let dir = dir();
        write(dir.path(), "a.gguf", "");
        write(dir.path(), "t.gguf", "");
        let file = write(
            dir.path(),
            "models.yaml",
            "models:
  - name: small
    path: a.gguf
  - name: big
    upstream: http://127.0.0.1:8000,model=qwen
    template-from: t.gguf
    ctx-size: 8192
    aliases: [large]
  - name: pair
    upstream:
      - url: http://127.0.0.1:8001
        mode: chat
      - http://127.0.0.1:8002
    template-format: chatml
no-skills: true
",
        );
        let config = from_args(&["--config", &file.to_string_lossy()]).unwrap();
        assert_eq!(config.engine.name.as_deref(), Some("small"));
        let ModelConfig::Upstream(big) = &config.models[1] else { panic!("{:?}", config.models) };
        assert_eq!((big.name.as_deref(), big.aliases.as_slice()), (Some("big"), &["large".to_string()][..]));
        assert_eq!(big.upstreams.len(), 1);
        assert_eq!(big.upstreams[0].model.as_deref(), Some("qwen"));
        assert_eq!(big.template_from, Some(dir.path().join("t.gguf")));
        assert_eq!(big.n_ctx, Some(8192));
        let ModelConfig::Upstream(pair) = &config.models[2] else { panic!("{:?}", config.models) };
        assert_eq!(pair.upstreams.len(), 2);
        assert_eq!(pair.upstreams[0].mode, UpstreamMode::Chat);
        assert_eq!(pair.template_format.as_deref(), Some("chatml"));
        // At the fleet's limit, and one past it.
        let servers =
            |n: usize| (0..n).map(|i| format!("\"http://127.0.0.1:{}\"", 9000 + i)).collect::<Vec<_>>().join(",");
        let entry = |servers: String| format!(r#"{{"name":"wide","upstream":[{servers}]}}"#);
        let config = from_args(&["--no-skills", "--model-entry", &entry(servers(MAX_UPSTREAMS))]).unwrap();
        assert_eq!(config.models.len(), 1);
        let err = from_args(&["--no-skills", "--model-entry", &entry(servers(MAX_UPSTREAMS + 1))]).unwrap_err().0;
        assert_eq!(err, format!("models entry 'wide': at most {MAX_UPSTREAMS} upstreams, got {}", MAX_UPSTREAMS + 1));

        let refused = |json: &str| from_args(&["--no-skills", "--model-entry", json]).unwrap_err().0;
        let a = dir.path().join("a.gguf");
        let a = a.display();
        assert!(refused(&format!(r#"{{"name":"x","path":"{a}","upstream":"http://127.0.0.1:1"}}"#))
            .contains("give `path` (a GGUF loaded here) or `upstream` (a server that runs the model), not both"));
        assert!(refused(r#"{"name":"x"}"#).contains("give `path` (a GGUF loaded here) or `upstream`"));
        assert!(refused(r#"{"upstream":"http://127.0.0.1:1"}"#).contains("an upstream entry needs a `name`"));
        assert_eq!(
            refused(r#"{"name":"x","upstream":"http://127.0.0.1:1","parallel":2}"#),
            "models entry 'x': `parallel` applies to a model loaded here, and this one runs upstream"
        );
        assert_eq!(
            refused(r#"{"name":"x","upstream":"http://127.0.0.1:1","embedding":true}"#),
            "models entry 'x': `embedding` applies to a model loaded here, and this one runs upstream"
        );
        assert_eq!(
            refused(&format!(r#"{{"name":"x","path":"{a}","template-from":"{a}"}}"#)),
            "models entry 'x': `template-from` applies to an upstream entry; a model loaded here renders prompts with its own GGUF's template"
        );
        assert_eq!(
            refused(r#"{"name":"x","upstream":"ftp://a"}"#),
            "models entry 'x': upstream ftp://a: the URL must start with http:// or https://"
        );
        assert_eq!(refused(r#"{"name":"x","upstream":[]}"#), "models entry 'x': `upstream` lists no server");
        assert!(refused(r#"{"name":"x","upstream":"http://127.0.0.1:1","template-from":"/nowhere.gguf"}"#)
            .contains("models entry 'x': template-from: the file /nowhere.gguf does not exist"));
        assert!(refused(r#"{"name":"x","upstream":"http://127.0.0.1:1","template-format":"fancy"}"#)
            .contains("models entry 'x': template-format must be one of"));
    }

    #[test]
    fn flags_win_over_files_and_later_files_win() {
        let dir = dir();
        write(dir.path(), "m.gguf", "");
        let a = write(dir.path(), "a.yaml", "model: m.gguf\nport: 6000\nparallel: 2\ncode-exec-unconfined: true\n");
        let b = write(dir.path(), "b.yaml", "port: 7000\nctx-size: 1024\n");
        let config = from_args(&[
            "--config",
            &a.to_string_lossy(),
            "--config",
            &b.to_string_lossy(),
            "--parallel",
            "3",
            "--no-skills",
            "--no-code-exec-unconfined",
        ])
        .unwrap();
        assert_eq!(
            config,
            ServeConfig {
                host: IpAddr::from([127, 0, 0, 1]),
                port: 7000,
                log_format: LogFormat::Text,
                engine: EngineConfig {
                    model_path: dir.path().join("m.gguf"),
                    name: Some("m".into()),
                    n_ctx: Some(1024),
                    n_parallel: 3,
                    n_threads: None,
                    spec_lookup: !skillhost_engine::GPU_BUILD,
                    ..Default::default()
                },
                models: vec![ModelConfig::Local(EngineConfig {
                    model_path: dir.path().join("m.gguf"),
                    name: Some("m".into()),
                    n_ctx: Some(1024),
                    n_parallel: 3,
                    spec_lookup: !skillhost_engine::GPU_BUILD,
                    ..Default::default()
                })],
                model_limits: models::limits(None, None, None).unwrap(),
                remote: None,
                replica_id: None,
                skills: None,
                loop_settings: LoopSettings::default(),
                exec: ExecConfig::default(),
                access: AccessConfig::default(),
                max_queued: 3 * QUEUE_FACTOR,
                max_detached_turns: 3,
                state_dir: default_state_dir().unwrap(),
                retention: Retention::default(),
                max_attachment_bytes: DEFAULT_MAX_ATTACHMENT_BYTES,
                mcp_servers: Vec::new(),
                mcp_call_timeout: skillhost_actors::tools::mcp::hub::DEFAULT_CALL_TIMEOUT,
                hosted: Default::default(),
                mcp_serve_scripts: false,
                client_prompts: Default::default(),
            }
        );
    }

    #[test]
    fn network_grants_are_refused_in_required_mode_and_named() {
        let dir = dir();
        write(dir.path(), "m.gguf", "");
        let model = vec![dir.path().join("m.gguf").to_string_lossy().into_owned()];
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
                model: vec![dir.path().join("m.gguf").to_string_lossy().into_owned()],
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
        // The sandbox memory holds one workspace at least: at that, and one
        // byte short of it.
        let budget = |bytes: u64| {
            ServeArgs {
                model: vec![dir.path().join("m.gguf").to_string_lossy().into_owned()],
                workspace_max_bytes: Some(MIN_WORKSPACE_BYTES),
                sandbox_memory: Some(bytes),
                skills: SkillArgs { no_skills: true, ..SkillArgs::default() },
                ..ServeArgs::default()
            }
            .resolve()
        };
        assert_eq!(budget(MIN_WORKSPACE_BYTES).unwrap().exec.sandbox_memory, Some(MIN_WORKSPACE_BYTES));
        let err = budget(MIN_WORKSPACE_BYTES - 1).unwrap_err().to_string();
        assert!(err.contains("cannot hold one workspace"), "{err}");
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
        let args = |cli: Vec<PathBuf>, files: Vec<PathBuf>| {
            let mut argv = vec!["--skills-install-dir".to_string(), install.to_string_lossy().into_owned()];
            for root in cli {
                argv.extend(["--skills-dir".to_string(), root.to_string_lossy().into_owned()]);
            }
            for file in files {
                argv.extend(["--config".to_string(), file.to_string_lossy().into_owned()]);
            }
            list_skills(&argv)
        };
        // The last file's roots replace earlier files'; the install dir comes first and is created.
        let config = args(vec![], vec![a.clone(), b.clone()]).unwrap().unwrap();
        assert_eq!((config.roots, config.watch), (discovered(&["three"]), true));
        // The install folder is made by the first upload, not at start-up.
        assert!(!install.exists());
        // Command-line roots replace every file's.
        let config = args(vec![dir.path().join("cli")], vec![a.clone()]).unwrap().unwrap();
        assert_eq!(config.roots, discovered(&["cli"]));
        // A root that does not exist names the flag.
        let err = args(vec![dir.path().join("missing")], vec![]).unwrap_err();
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
        assert_eq!(args(vec![], vec![off]).unwrap(), None);
    }

    #[test]
    fn flash_attention_is_llama_cpps_choice_and_drafting_is_on_on_the_cpu_with_any_policy() {
        let dir = dir();
        let model = write(dir.path(), "m.gguf", "");
        let model = model.to_string_lossy();
        let engine = |extra: &[&str]| {
            from_args(&[&["--model", &model, "--no-skills"], extra].concat())
                .map(|config| (config.engine.flash_attn, config.engine.spec_lookup))
        };
        let flash = |extra: &[&str]| engine(extra).map(|(flash_attn, _)| flash_attn);
        let drafting = |extra: &[&str]| engine(extra).map(|(_, spec_lookup)| spec_lookup);
        let cpu = !skillhost_engine::GPU_BUILD;
        assert_eq!(flash(&[]).unwrap(), FlashAttn::Auto);
        assert_eq!(flash(&["--flash-attn", "prefill"]).unwrap(), FlashAttn::Prefill);
        assert_eq!(flash(&["--flash-attn", "off"]).unwrap(), FlashAttn::Off);
        assert_eq!(flash(&["--flash-attn", "on"]).unwrap(), FlashAttn::On);
        let file = write(dir.path(), "f.yaml", "flash-attn: off\n");
        assert_eq!(flash(&["--config", &file.to_string_lossy()]).unwrap(), FlashAttn::Off);
        let err = flash(&["--flash-attn", "fast"]).unwrap_err().0;
        assert!(err.contains("fast") && err.contains("auto"), "{err}");

        // Drafting is on by default in a CPU build, whatever the policy;
        // a GPU build leaves it off.
        for policy in [
            &[][..],
            &["--flash-attn", "auto"],
            &["--flash-attn", "on"],
            &["--flash-attn", "off"],
            &["--flash-attn", "prefill"],
        ] {
            assert_eq!(drafting(policy).unwrap(), cpu, "{policy:?}");
        }
        // Named, it is what it says, from a flag or a file, with any policy.
        assert!(drafting(&["--spec-lookup"]).unwrap());
        assert!(drafting(&["--spec-lookup=true", "--flash-attn", "auto"]).unwrap());
        assert!(!drafting(&["--spec-lookup=false", "--flash-attn", "prefill"]).unwrap());
        assert!(!drafting(&["--spec-lookup=off", "--flash-attn", "off"]).unwrap());
        assert!(!drafting(&["--spec-lookup=false"]).unwrap());
        let off = write(dir.path(), "s.yaml", "flash-attn: prefill\nspec-lookup: false\n");
        assert!(!drafting(&["--config", &off.to_string_lossy()]).unwrap());
        assert!(drafting(&["--config", &off.to_string_lossy(), "--spec-lookup"]).unwrap());
        let err = drafting(&["--spec-lookup=maybe"]).unwrap_err().0;
        assert!(err.contains("maybe"), "{err}");
        for (name, policy) in
            [("auto", FlashAttn::Auto), ("on", FlashAttn::On), ("off", FlashAttn::Off), ("prefill", FlashAttn::Prefill)]
        {
            assert_eq!(engine(&["--spec-lookup", "--flash-attn", name]).unwrap(), (policy, true), "{name}");
        }
    }

    #[test]
    fn upstreams_from_flags_and_files_with_each_option_at_its_limits() {
        let dir = dir();
        std::env::set_var("SKILLHOST_TEST_UPSTREAM_KEY", "sk-test");
        let file = write(
            dir.path(),
            "u.yaml",
            "upstreams:\n  - http://10.0.0.1:8080/\n  - url: https://api.example.com/v1\n    mode: chat\n    weight: 1000\n    max-concurrent: 1\n    model: m\n    key-env: SKILLHOST_TEST_UPSTREAM_KEY\n    api: openai\nskills-poll: 86400\nno-skills: false\n",
        );
        let config = from_args(&["--config", &file.to_string_lossy(), "--ctx-size", "4096"]).unwrap();
        let remote = config.remote.unwrap();
        assert_eq!(
            remote.upstreams,
            vec![
                UpstreamConfig { url: "http://10.0.0.1:8080".into(), weight: 1, ..UpstreamConfig::default() },
                UpstreamConfig {
                    url: "https://api.example.com".into(),
                    mode: UpstreamMode::Chat,
                    api_key: Some("sk-test".into()),
                    model: Some("m".into()),
                    weight: MAX_UPSTREAM_WEIGHT,
                    max_concurrent: Some(1),
                    openai_api: true,
                }
            ]
        );
        assert_eq!(remote.n_ctx, Some(4096));
        assert_eq!(config.skills.and_then(|s| s.poll), Some(std::time::Duration::from_secs(MAX_SKILLS_POLL_SECS)));

        let refused = |args: &[&str]| from_args(args).err().map(|e| e.0).unwrap_or_default();
        let past_weight = format!("http://a,weight={}", MAX_UPSTREAM_WEIGHT + 1);
        assert_eq!(
            refused(&["--upstream", &past_weight]),
            format!("--upstream {past_weight}: weight must be between 1 and {MAX_UPSTREAM_WEIGHT}, got 1001")
        );
        assert_eq!(
            refused(&["--upstream", "http://a,weight=0"]),
            "--upstream http://a,weight=0: weight must be between 1 and 1000, got 0"
        );
        assert_eq!(
            refused(&["--upstream", "http://a,max-concurrent=0"]),
            "--upstream http://a,max-concurrent=0: max-concurrent must be at least 1"
        );
        assert_eq!(
            refused(&["--upstream", "ftp://a"]),
            "--upstream ftp://a: the URL must start with http:// or https://"
        );
        assert_eq!(
            refused(&["--upstream", "http://a,mode=raw"]),
            "--upstream http://a,mode=raw: mode must be completion or chat, got 'raw'"
        );
        assert!(refused(&["--upstream", "http://a,key-env=SKILLHOST_TEST_UNSET_VARIABLE"]).contains("is not set"));
        assert!(refused(&["--upstream", "http://a,colour=red"]).contains("unknown option 'colour'"));
        assert_eq!(
            refused(&["--upstream", "http://a,api=grpc"]),
            "--upstream http://a,api=grpc: api must be auto or openai, got 'grpc'"
        );
        let model = write(dir.path(), "m.gguf", "");
        assert!(
            refused(&["--upstream", "http://a", "--model", &model.to_string_lossy()]).contains("exclude each other")
        );
        assert_eq!(
            refused(&["--template-format", "chatml", "--model", &model.to_string_lossy()]),
            "--template-format applies only with --upstream"
        );
        assert!(refused(&["--upstream", "http://a", "--template-format", "alpaca"])
            .starts_with("--template-format must be one of chatml, gemma, plain"));
        let many: Vec<String> =
            (0..=MAX_UPSTREAMS).flat_map(|i| ["--upstream".to_string(), format!("http://a{i}")]).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(refused(&many), format!("at most {MAX_UPSTREAMS} upstreams, got {}", MAX_UPSTREAMS + 1));
        assert!(from_args(&many[2..]).is_ok(), "{MAX_UPSTREAMS} upstreams are allowed");
        assert_eq!(
            refused(&["--upstream", "http://a", "--skills-poll", "0"]),
            "--skills-poll must be between 1 and 86400 seconds, got 0"
        );
        assert_eq!(
            refused(&["--upstream", "http://a", "--skills-poll", "86401"]),
            "--skills-poll must be between 1 and 86400 seconds, got 86401"
        );
        // Versions kept: at the limit, and one past it.
        let keep = |n: usize| from_args(&["--upstream", "http://a", "--skills-keep-versions", &n.to_string()]);
        let kept = keep(versions::MAX_KEEP_VERSIONS).unwrap();
        assert_eq!(kept.skills.map(|s| s.keep_versions), Some(versions::MAX_KEEP_VERSIONS));
        assert_eq!(
            keep(versions::MAX_KEEP_VERSIONS + 1).unwrap_err().0,
            "--skills-keep-versions must be between 0 and 100, got 101"
        );
        assert_eq!(keep(0).unwrap().skills.map(|s| s.keep_versions), Some(0));
        // The install policy: per source by default, one for all when named.
        let policy = |extra: &[&str]| {
            let args = [&["--upstream", "http://a"], extra].concat();
            from_args(&args).unwrap().skills.map(|s| s.policy)
        };
        assert_eq!(policy(&[]), Some(Policies { roots: Policy::Warn, installs: Policy::Strict }));
        assert_eq!(policy(&["--skills-install-policy", "warn"]), Some(Policies::all(Policy::Warn)));
        assert_eq!(policy(&["--skills-install-policy", "strict"]), Some(Policies::all(Policy::Strict)));
        assert!(refused(&["--upstream", "http://a", "--skills-install-policy", "lenient"]).contains("lenient"));
        let bad_file = write(dir.path(), "bad.yaml", "upstreams:\n  - mode: chat\n");
        assert_eq!(refused(&["--config", &bad_file.to_string_lossy()]).contains("every entry needs a url"), true);
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
                ServeArgs { model: vec![missing.to_string_lossy().into_owned()], skills: off(), ..Default::default() },
                "--model: the model file",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    parallel: Some(0),
                    skills: off(),
                    ..Default::default()
                },
                "--parallel must be between 1 and 64, got 0",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    parallel: Some(MAX_PARALLEL + 1),
                    skills: off(),
                    ..Default::default()
                },
                "--parallel must be between 1 and 64, got 65",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    ctx_size: Some(MIN_CTX_SIZE - 1),
                    skills: off(),
                    ..Default::default()
                },
                "--ctx-size must be at least 256 tokens, got 255",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    threads: Some(0),
                    skills: off(),
                    ..Default::default()
                },
                "--threads must be at least 1",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    skills_max_rounds: Some(0),
                    skills: off(),
                    ..Default::default()
                },
                "--skills-max-rounds must be between 1 and 64, got 0",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    skills_max_rounds: Some(65),
                    skills: off(),
                    ..Default::default()
                },
                "--skills-max-rounds must be between 1 and 64, got 65",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    max_tokens: Some(0),
                    skills: off(),
                    ..Default::default()
                },
                "--max-tokens must be at least 1",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    temperature: Some(2.01),
                    skills: off(),
                    ..Default::default()
                },
                "--temperature must be between 0 and 2, got 2.01",
            ),
            (
                ServeArgs {
                    model: vec![model.to_string_lossy().into_owned()],
                    temperature: Some(-0.01),
                    skills: off(),
                    ..Default::default()
                },
                "--temperature must be between 0 and 2, got -0.01",
            ),
        ];
        let err = from_args(&["--no-skills", "--config", &unknown.to_string_lossy()]).unwrap_err().0;
        assert!(err.contains("unknown key `modle`"), "{err}");
        for (args, expected) in cases {
            let err = match args.resolve() {
                Ok(c) => panic!("accepted {c:?}"),
                Err(err) => err.0,
            };
            assert!(err.contains(expected), "{err:?} does not contain {expected:?}");
        }
        // The limits themselves are accepted.
        let ok = ServeArgs {
            model: vec![model.to_string_lossy().into_owned()],
            parallel: Some(MAX_PARALLEL),
            ctx_size: Some(MIN_CTX_SIZE),
            skills_max_rounds: Some(MAX_ROUNDS),
            temperature: Some(2.0),
            max_tokens: Some(1),
            skills: off(),
            ..Default::default()
        };
        assert!(ok.resolve().is_ok());
        let greedy = ServeArgs {
            model: vec![model.to_string_lossy().into_owned()],
            temperature: Some(0.0),
            skills: off(),
            ..Default::default()
        };
        assert_eq!(greedy.resolve().unwrap().loop_settings.temperature, Some(0.0));
    }

    #[test]
    fn installs_need_code_exec_and_an_index_the_installer_can_reach() {
        let dir = dir();
        let model = write(dir.path(), "m.gguf", "");
        let model = model.to_string_lossy();
        let base = ["--no-skills", "--model", &model];
        let with = |extra: &[&str]| from_args(&[&base[..], extra].concat());
        assert_eq!(with(&[]).unwrap().exec.install, None, "off by default");
        let err = with(&["--code-exec-allow-install"]).unwrap_err().0;
        assert!(err.contains("needs --code-exec"), "{err}");
        let install = with(&["--code-exec", "--code-exec-allow-install"]).unwrap().exec.install.unwrap();
        assert_eq!(install.python_index, "https://pypi.org/simple");
        assert_eq!(install.domains, ["files.pythonhosted.org", "pypi.org", "registry.npmjs.org"]);
        // A local index: its host joins the defaults when no list is given,
        // and must be on a list that is.
        let local =
            ["--code-exec", "--code-exec-allow-install", "--code-exec-install-index", "http://127.0.0.1:8080/simple"];
        assert!(with(&local).unwrap().exec.install.unwrap().domains.contains(&"127.0.0.1".to_string()));
        let err = with(&[&local[..], &["--code-exec-install-domains", "pypi.org,registry.npmjs.org"]].concat())
            .unwrap_err()
            .0;
        assert!(err.contains("--code-exec-install-index is on 127.0.0.1, which is not one of"), "{err}");
        let listed = with(
            &[
                &local[..],
                &[
                    "--code-exec-install-domains",
                    "127.0.0.1,registry.npmjs.org",
                    "--code-exec-packages",
                    "PyYAML,left-pad",
                ],
            ]
            .concat(),
        );
        let listed = listed.unwrap().exec.install.unwrap();
        assert_eq!(
            (listed.domains, listed.packages),
            (vec!["127.0.0.1".to_string(), "registry.npmjs.org".into()], vec!["PyYAML".to_string(), "left-pad".into()])
        );
        for (extra, why) in [
            (["--code-exec-install-index", "ftp://mirror/simple"], "must be an http:// or https:// URL"),
            (["--code-exec-install-index", "https://user:secret@mirror/simple"], "must not carry credentials"),
            (["--code-exec-npm-registry", "https:///"], "names no host"),
            (["--code-exec-install-domains", "https://pypi.org"], "takes host names"),
            (["--code-exec-packages", "../evil"], "is not a package name"),
        ] {
            let err = with(&[&["--code-exec", "--code-exec-allow-install"][..], &extra].concat()).unwrap_err().0;
            assert!(err.contains(why), "{extra:?}: {err}");
        }
    }

    #[test]
    fn a_non_loopback_address_needs_a_key_or_the_opt_out() {
        let dir = dir();
        let model = write(dir.path(), "m.gguf", "");
        let model = model.to_string_lossy();
        let base = ["--no-skills", "--model", &model];
        let with = |extra: &[&str]| from_args(&[&base[..], extra].concat());
        let err = with(&["--host", "0.0.0.0"]).unwrap_err().0;
        assert!(err.contains("--api-key") && err.contains("--insecure-no-auth"), "{err}");
        // An admin key alone leaves chat open: still refused.
        assert!(with(&["--host", "0.0.0.0", "--admin-key", "adm"]).is_err());
        assert!(with(&["--host", "0.0.0.0", "--api-key", "k1"]).is_ok());
        assert!(with(&["--host", "0.0.0.0", "--insecure-no-auth"]).is_ok());
        assert!(with(&["--host", "::1"]).is_ok());
        let keys = write(dir.path(), "keys", "# clients\n\nk2\n  k3  \n");
        let config = with(&["--host", "0.0.0.0", "--api-key-file", &keys.to_string_lossy()]).unwrap();
        assert_eq!(read_key_file(config.access.api_key_file.as_deref().unwrap()).unwrap(), ["k2", "k3"]);
        // Keys travel in headers; a file with none would lock everyone out.
        let empty = write(dir.path(), "empty", "# nothing\n");
        let err = with(&["--api-key-file", &empty.to_string_lossy()]).unwrap_err().0;
        assert!(err.starts_with("--api-key-file:") && err.contains("holds no key"), "{err}");
        let spaced = write(dir.path(), "spaced", "a key\n");
        let err = with(&["--admin-key-file", &spaced.to_string_lossy()]).unwrap_err().0;
        assert!(err.contains("line 1") && err.contains("printable ASCII"), "{err}");
        assert!(with(&["--api-key", ""]).is_err());
        assert!(with(&["--metrics-key", "m k"]).unwrap_err().0.starts_with("--metrics-key:"));
        // Origins are checked and kept in the form browsers send.
        let config = with(&["--allowed-origins", "HTTP://LocalHost:3000/,https://ui.example"]).unwrap();
        assert_eq!(config.access.allowed_origins, ["http://localhost:3000", "https://ui.example"]);
        let err = with(&["--allowed-origins", "localhost:3000"]).unwrap_err().0;
        assert!(err.contains("scheme://host[:port]"), "{err}");
        // The queue follows --parallel unless set.
        assert_eq!(with(&["--parallel", "2"]).unwrap().max_queued, 2 * QUEUE_FACTOR);
        assert_eq!(with(&["--max-queued", "0"]).unwrap().max_queued, 0);
    }

    #[test]
    fn the_default_upload_folder_is_state_not_the_binary_folder() {
        let dir = default_state_dir().unwrap().join(INSTALL_SUBDIR);
        if rustix::process::geteuid().is_root() {
            assert_eq!(dir, PathBuf::from("/var/lib/skillhost/skills"));
        } else {
            assert!(dir.ends_with("skillhost/skills") && dir.is_absolute(), "{}", dir.display());
        }
        let exe = std::env::current_exe().unwrap();
        assert!(!dir.starts_with(exe.parent().unwrap()));
    }

    #[test]
    fn mcp_servers_come_from_files_and_the_yaml_key_and_a_bad_entry_stops_start_up() {
        let dir = dir();
        let model = write(dir.path(), "m.gguf", "");
        let model = model.to_string_lossy();
        let json = write(
            dir.path(),
            "mcp.json",
            r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}}}"#,
        );
        let yaml = write(
            dir.path(),
            "skillhost.yaml",
            "mcp-servers:\n  search:\n    url: http://127.0.0.1:9/mcp\nmcp-call-timeout: 5\n",
        );
        let config = from_args(&[
            "--model",
            &model,
            "--config",
            &yaml.to_string_lossy(),
            "--mcp-config",
            &json.to_string_lossy(),
        ])
        .unwrap();
        let names: Vec<&str> = config.mcp_servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["time", "search"]);
        assert_eq!(config.mcp_call_timeout.as_secs(), 5);
        let bad = write(dir.path(), "bad.json", r#"{"mcpServers": {"x": {"command": "a", "url": "http://b"}}}"#);
        let err = from_args(&["--model", &model, "--mcp-config", &bad.to_string_lossy()]).unwrap_err().0;
        assert!(err.contains("bad.json: MCP server 'x': has both command and url"), "{err}");
        let twice = from_args(&[
            "--model",
            &model,
            "--mcp-config",
            &json.to_string_lossy(),
            "--mcp-config",
            &json.to_string_lossy(),
        ]);
        assert!(twice.unwrap_err().0.contains("'time' is configured twice"));
        assert!(from_args(&["--model", &model, "--mcp-call-timeout", "0"]).is_err());
        // Serving scripts to MCP clients needs the model's grant first.
        let alone = from_args(&["--model", &model, "--mcp-serve-scripts"]).unwrap_err().0;
        assert!(alone.contains("needs --skills-allow-exec"), "{alone}");
        let both = from_args(&["--model", &model, "--mcp-serve-scripts", "--skills-allow-exec"]).unwrap();
        assert!(both.mcp_serve_scripts);
    }

    #[test]
    fn uploads_go_beside_the_store_in_the_state_folder() {
        let dir = dir();
        let model = write(dir.path(), "m.gguf", "");
        let model = model.to_string_lossy();
        let with = |extra: &[&str]| from_args(&[&["--model", &*model][..], extra].concat());
        let state = dir.path().join("state");
        let argv = ["--state-dir", state.to_str().unwrap()];
        let config = with(&argv).unwrap();
        assert_eq!(config.state_dir, state);
        assert_eq!(config.skills.unwrap().install_dir, Some(state.join("skills")));
        // A folder named for uploads wins.
        let installed = dir.path().join("installed");
        let argv = ["--state-dir", state.to_str().unwrap(), "--skills-install-dir", installed.to_str().unwrap()];
        assert_eq!(with(&argv).unwrap().skills.unwrap().install_dir, Some(installed));
        // The byte limit at its floor and one below it; the age at 1 s and 0.
        let floor = MIN_MAX_BYTES.to_string();
        assert_eq!(with(&["--state-max-bytes", &floor]).unwrap().retention.max_bytes, MIN_MAX_BYTES);
        let below = (MIN_MAX_BYTES - 1).to_string();
        assert!(with(&["--state-max-bytes", &below]).unwrap_err().0.contains("at least 1048576"));
        assert_eq!(with(&["--state-max-age", "1"]).unwrap().retention.max_age.as_secs(), 1);
        assert!(with(&["--state-max-age", "0"]).is_err());
        assert_eq!(with(&[]).unwrap().retention, Retention::default());
        // Background turns: --parallel by default, 1 to the most.
        assert_eq!(with(&["--parallel", "3"]).unwrap().max_detached_turns, 3);
        let most = MAX_DETACHED_TURNS.to_string();
        assert_eq!(with(&["--max-detached-turns", &most]).unwrap().max_detached_turns, MAX_DETACHED_TURNS);
        let past = (MAX_DETACHED_TURNS + 1).to_string();
        assert!(with(&["--max-detached-turns", &past]).unwrap_err().0.contains("between 1 and 1024"));
        assert!(with(&["--max-detached-turns", "0"]).is_err());
        let most = MAX_CONVERSATION_ATTACHMENT_BYTES.to_string();
        assert_eq!(
            with(&["--max-attachment-bytes", &most]).unwrap().max_attachment_bytes,
            MAX_CONVERSATION_ATTACHMENT_BYTES
        );
        let past = (MAX_CONVERSATION_ATTACHMENT_BYTES + 1).to_string();
        assert!(with(&["--max-attachment-bytes", &past]).unwrap_err().0.contains("must be between 1 and 67108864"));
        assert!(with(&["--max-attachment-bytes", "0"]).is_err());
        assert_eq!(with(&[]).unwrap().max_attachment_bytes, DEFAULT_MAX_ATTACHMENT_BYTES);
    }

    #[test]
    fn every_switch_has_a_negation_and_files_reject_wrong_shapes() {
        let definition = command();
        let serve = definition.find_subcommand("serve").unwrap();
        let longs: Vec<&str> = serve.get_arguments().filter_map(|a| a.get_long()).collect();
        for (switch, negation) in [
            ("code-exec", "no-code-exec"),
            ("no-skills", "skills"),
            ("skills-no-discovery", "skills-discovery"),
            ("insecure-no-auth", "insecure-auth"),
        ] {
            assert!(longs.contains(&switch) && longs.contains(&negation), "{switch} / {negation}");
        }
        let dir = dir();
        for (text, expected) in [
            ("code-exec: yes\n", "`code-exec` is a switch"),
            ("port: [1, 2]\n", "`port` takes one value"),
            ("port: {a: 1}\n", "`port` must be a single value"),
            ("print-config: true\n", "unknown key `print-config`"),
            ("- a\n", "not a valid config"),
        ] {
            let file = write(dir.path(), "c.yaml", text);
            let err = from_args(&["--config", &file.to_string_lossy()]).unwrap_err().0;
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }
}
