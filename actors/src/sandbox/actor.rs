//! `SandboxActor`: runs one request's commands through the sandbox helper
//! and reports each result back when it ends.
//!
//! One lives per request, linked to its `LoopActor`. A command runs in a task
//! of its own, so the actor's mailbox stays open while it runs; when the
//! request ends (answered, failed or the client gone) the actor dies with
//! the loop, its state is dropped, and dropping a running task kills the
//! command's whole process group.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::launch::{LaunchError, Ran, Run, SandboxMode};
use super::ExecSettings;
use crate::task::AbortOnDrop;

/// Why a command runs; it decides the profile, the network and whether the
/// operator's choice to run unconfined applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A `shell` call.
    Shell,
    /// A skill's bundled script (`skills_run`).
    Script,
    /// The parse of a file the model just wrote.
    SyntaxCheck,
    /// A look the host takes at the model's environment (the public names
    /// of a module the code imported): confined and offline like a command.
    Probe,
    /// A package install the host built from the model's request: confined
    /// like a command (so the installer writes only the workspace), with no
    /// network but a namespace of its own whose one way out is the install
    /// proxy ([`Job::proxy`]).
    Install,
}

impl Purpose {
    /// Whether a run of this kind gets the network.
    pub fn network(self, settings: &ExecSettings) -> bool {
        match self {
            Purpose::Shell => settings.shell_network,
            Purpose::Script => settings.skills_network,
            // The installer reaches the proxy through a network of its own.
            Purpose::SyntaxCheck | Purpose::Probe | Purpose::Install => false,
        }
    }
}

/// One command to run.
#[derive(Debug, Clone)]
pub struct Job {
    pub purpose: Purpose,
    /// The folder it runs in, read-write: a workspace the server made.
    pub workspace: PathBuf,
    /// The workspace's own uid and gid, when the server is root.
    pub owner: Option<(u32, u32)>,
    /// A skill folder it may read.
    pub skill: Option<PathBuf>,
    pub command: Vec<String>,
    /// Variables on top of the workspace's own environment (for an
    /// install, instead of it).
    pub env: Vec<(String, String)>,
    /// A folder directly inside the workspace to start in.
    pub start_in: Option<String>,
    /// The install proxy, for a run in a network of its own.
    pub proxy: Option<super::egress::Egress>,
    pub timeout: Duration,
}

/// A command that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub ran: Ran,
    /// The "Not confined on this host:" line, when something was not.
    pub gaps: Option<String>,
    /// The command could use the network (so a network error is real).
    pub network: bool,
}

pub struct SandboxActor;

pub enum SandboxMsg {
    /// Sent by a workspace actor answering a tool call: run one command. The
    /// reply is the result, or the sentence saying why it did not run.
    Run { job: Job, reply: RpcReplyPort<Result<Finished, NotRun>> },
    /// Sent by a command's own task when it ended: forget its handle.
    Ended(u64),
    /// Sent by a workspace actor before a call: how commands run here (the
    /// interpreters, the installer), so the tools build the right command.
    Settings(RpcReplyPort<Arc<ExecSettings>>),
}

pub struct SandboxState {
    settings: Arc<ExecSettings>,
    /// Commands still running, by number; dropping one kills its group.
    running: HashMap<u64, AbortOnDrop>,
    /// The process group of each running command, to kill at once on stop
    /// (an aborted task drops its guard only when the runtime next polls it).
    groups: Arc<Mutex<HashMap<u64, i32>>>,
    /// The next command's number.
    next: u64,
}

/// Why a command did not run. Each is a failed call, never the request's
/// end: the model reads [`NotRun::sentence`] and the turn goes on.
#[derive(Debug, thiserror::Error)]
pub enum NotRun {
    /// `--skills-sandbox required` on a host that cannot confine commands.
    #[error("this server only runs commands inside its sandbox, and this host cannot provide one ({reason})")]
    Unconfinable { reason: String },
    /// The helper could not be started or watched.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The request's sandbox actor is gone: the request is ending.
    #[error("the request's sandbox is gone")]
    Gone,
}

impl NotRun {
    /// The sentence the model reads; `what` is what did not run ("command",
    /// "script").
    pub fn sentence(&self, what: &str) -> String {
        format!("The {what} did not run: {self}.")
    }
}

/// Whether a run may go ahead, and unconfined or not: `Ok((unconfined,
/// gaps))`, or why it may not.
pub fn confinement(settings: &ExecSettings, purpose: Purpose) -> Result<(bool, Option<String>), NotRun> {
    let by_choice = match purpose {
        Purpose::Shell | Purpose::SyntaxCheck | Purpose::Probe => settings.shell_unconfined,
        // The installer runs as root would otherwise; it stays confined.
        Purpose::Script | Purpose::Install => false,
    };
    if by_choice {
        return Ok((
            true,
            Some("Not confined on this host: everything; the operator runs these commands unconfined.".into()),
        ));
    }
    match (&settings.unavailable, settings.mode) {
        (None, SandboxMode::Required | SandboxMode::Preferred) => Ok((false, settings.gaps_for(purpose))),
        (_, SandboxMode::Off) => {
            Ok((true, Some("Not confined on this host: everything; the sandbox is switched off.".into())))
        }
        (Some(reason), SandboxMode::Required) => Err(NotRun::Unconfinable { reason: reason.clone() }),
        (Some(reason), SandboxMode::Preferred) => {
            Ok((true, Some(format!("Not confined on this host: everything; the sandbox is unavailable ({reason})."))))
        }
    }
}

impl Actor for SandboxActor {
    type Msg = SandboxMsg;
    type State = SandboxState;
    type Arguments = Arc<ExecSettings>;

    async fn pre_start(
        &self,
        _myself: ActorRef<SandboxMsg>,
        settings: Arc<ExecSettings>,
    ) -> Result<SandboxState, ActorProcessingErr> {
        Ok(SandboxState { settings, running: HashMap::new(), groups: Arc::default(), next: 0 })
    }

    /// Kills whatever still runs. ractor hands a stopped actor's state to its
    /// supervisor, which may drop it much later, so the commands go here.
    async fn post_stop(
        &self,
        _myself: ActorRef<SandboxMsg>,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        state.running.clear();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SandboxMsg>,
        msg: SandboxMsg,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SandboxMsg::Run { job, reply } => {
                let (unconfined, gaps) = match confinement(&state.settings, job.purpose) {
                    Ok(decision) => decision,
                    Err(refusal) => {
                        let _ = reply.send(Err(refusal));
                        return Ok(());
                    }
                };
                let number = state.next;
                state.next += 1;
                let settings = Arc::clone(&state.settings);
                let groups = Arc::clone(&state.groups);
                let network = job.purpose.network(&settings);
                let task = tokio::spawn(async move {
                    let record = |pgid| {
                        if let Ok(mut groups) = groups.lock() {
                            groups.insert(number, pgid);
                        }
                    };
                    let result =
                        run_job(&settings, &job, unconfined, record).await.map(|ran| Finished { ran, gaps, network });
                    if let Ok(mut groups) = groups.lock() {
                        groups.remove(&number);
                    }
                    let _ = reply.send(result);
                    let _ = myself.cast(SandboxMsg::Ended(number));
                });
                state.running.insert(number, AbortOnDrop::new(task));
            }
            SandboxMsg::Ended(number) => {
                // The task has finished; removing its handle aborts nothing.
                state.running.remove(&number);
            }
            SandboxMsg::Settings(reply) => {
                let _ = reply.send(Arc::clone(&state.settings));
            }
        }
        Ok(())
    }
}

async fn run_job(
    settings: &ExecSettings,
    job: &Job,
    unconfined: bool,
    started: impl FnOnce(i32),
) -> Result<Ran, NotRun> {
    let profile = match job.purpose {
        Purpose::Shell | Purpose::SyntaxCheck | Purpose::Probe | Purpose::Install => "code-exec",
        Purpose::Script => "skills-run",
    };
    let network = job.purpose.network(settings);
    // A skill script granted a network the shell lacks gets none of the
    // workspace's package folders: a `.pth` file or `usercustomize.py` the
    // model left in `.local` would otherwise run with that network. (Its
    // hostile test is in src/http/code_tests.rs.)
    let isolated = job.purpose == Purpose::Script && network && !settings.shell_network;
    let mut env = match (isolated, job.purpose) {
        // HOME is the workspace, so Python's default user site is its
        // `.local` too: switched off.
        (true, _) => vec![("PYTHONNOUSERSITE".to_string(), "1".to_string())],
        // The installer gets only what the host sets for it: the workspace's
        // variables name folders the model writes (PYTHONPATH, NODE_PATH),
        // which the installer must not import from.
        (false, Purpose::Install) => Vec::new(),
        (false, _) => super::workspace_environment(&job.workspace, settings.interpreters.python()),
    };
    if network {
        env.extend(settings.proxy_env.iter().cloned());
    }
    env.extend(job.env.iter().cloned());
    // The CA snapshot, for what may reach the network: read-only, at the
    // server's own path.
    let read: Vec<PathBuf> = match (&settings.ca_bundle, network || job.proxy.is_some()) {
        (Some(snapshot), true) => {
            let value = snapshot.display().to_string();
            env.extend(super::ca::CA_VARIABLES.iter().map(|name| (name.to_string(), value.clone())));
            vec![snapshot.clone()]
        }
        _ => Vec::new(),
    };
    let run = Run {
        profile,
        workspace: &job.workspace,
        owner: job.owner,
        skill: job.skill.as_deref(),
        network,
        unconfined,
        command: &job.command,
        env: &env,
        read: &read,
        start_in: job.start_in.as_deref(),
        proxy: job.proxy.as_ref(),
        timeout: job.timeout,
    };
    Ok(settings.launcher.run_with(&run, started).await?)
}

/// How commands run on a request's sandbox actor; `None` when it is gone.
pub async fn settings(sandbox: &ActorRef<SandboxMsg>) -> Option<Arc<ExecSettings>> {
    match sandbox.call(SandboxMsg::Settings, Some(Duration::from_secs(10))).await {
        Ok(ractor::rpc::CallResult::Success(settings)) => Some(settings),
        Ok(_) | Err(_) => None,
    }
}

/// Runs a job on a request's sandbox actor and waits for its end.
pub async fn run(sandbox: &ActorRef<SandboxMsg>, job: Job) -> Result<Finished, NotRun> {
    // The reply comes when the command ends, which the launcher bounds by
    // the job's own deadline; the slack covers start-up and clean-up.
    let wait = job.timeout + Duration::from_secs(30);
    match sandbox.call(|reply| SandboxMsg::Run { job, reply }, Some(wait)).await {
        Ok(ractor::rpc::CallResult::Success(result)) => result,
        Ok(_) | Err(_) => Err(NotRun::Gone),
    }
}
