//! `WorkspaceActor`: owns one workspace and answers every tool call made in
//! it, one at a time.
//!
//! A request's own workspace lives in an actor linked to its `LoopActor`
//! and dies with it; a Web UI conversation's lives as long as the
//! conversation, unlinked, and serves each of its requests in turn. A call
//! is handled from start to end (file work, commands, the artifact copy)
//! before the next message is taken: that is what keeps two requests of one
//! conversation from ever working in the folder at once. The folder is
//! deleted when the actor's state is dropped, whether it stopped or was
//! killed.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::artifacts::{Artifacts, PRIVATE};
use crate::attachments::Attachment;
use crate::sandbox::actor::SandboxMsg;
use crate::tools::shell::ShellMemory;
use crate::tools::{self, Answer, CodeCall, CodeContext, ToolError};
use crate::workspace::Workspace;

pub struct WorkspaceActor;

/// How long the end of a request waits for a workspace actor (and its
/// folder) to go.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the files a call produced are kept.
#[derive(Debug, Clone)]
pub struct ArtifactsFor {
    pub store: Artifacts,
    pub run_id: String,
}

pub enum WorkspaceMsg {
    /// Sent by a request's tool runner: answer one call in this folder,
    /// running commands on the request's `sandbox` and copying what changed
    /// into `artifacts`.
    Answer {
        call: CodeCall,
        sandbox: Option<ActorRef<SandboxMsg>>,
        artifacts: Option<ArtifactsFor>,
        reply: RpcReplyPort<Result<Answer, ToolError>>,
    },
    /// Copies the folder's regular files out, within `max_bytes` (a
    /// conversation keeps them in the store at the end of each turn);
    /// `None` once the folder is gone.
    Snapshot { max_bytes: u64, reply: RpcReplyPort<Option<crate::workspace::snapshot::Snapshot>> },
    /// Sent by a request's loop as it starts: writes the user's
    /// attachments under `attachments/` (see
    /// [`crate::attachments::write_into`]); replies how many were written.
    PutAttachments { attachments: Arc<Vec<Attachment>>, reply: RpcReplyPort<usize> },
}

pub struct WorkspaceState {
    /// The folder; deleted in `post_stop` (a stop) or when this state is
    /// dropped (a kill).
    workspace: Option<Workspace>,
    /// The shell's working folder and last failure in this folder.
    shell: ShellMemory,
}

impl Actor for WorkspaceActor {
    type Msg = WorkspaceMsg;
    type State = WorkspaceState;
    type Arguments = Workspace;

    async fn pre_start(
        &self,
        _myself: ActorRef<WorkspaceMsg>,
        workspace: Workspace,
    ) -> Result<WorkspaceState, ActorProcessingErr> {
        Ok(WorkspaceState { workspace: Some(workspace), shell: ShellMemory::default() })
    }

    /// Deletes the folder before the actor counts as stopped, so whoever
    /// waits for the stop (the end of a request, a closed conversation)
    /// knows the folder is gone. ractor hands a stopped actor's state to its
    /// supervisor, which may drop it much later.
    async fn post_stop(
        &self,
        _myself: ActorRef<WorkspaceMsg>,
        state: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(workspace) = state.workspace.take() {
            let _ = tokio::task::spawn_blocking(move || drop(workspace)).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<WorkspaceMsg>,
        msg: WorkspaceMsg,
        state: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkspaceMsg::Answer { call, sandbox, artifacts, reply } => {
                let result = match state.workspace.as_ref() {
                    Some(workspace) => {
                        answer(workspace, &mut state.shell, call, sandbox.as_ref(), artifacts.as_ref()).await
                    }
                    None => Err(ToolError::workspace_gone()),
                };
                let _ = reply.send(result);
            }
            WorkspaceMsg::Snapshot { max_bytes, reply } => {
                let taken = match state.workspace.as_ref() {
                    Some(workspace) => {
                        // The server's bookkeeping, the packages the host
                        // installed and the attachments (files of the store
                        // already) are not the conversation's work: left
                        // out, as they are from artifacts.
                        let skip = PRIVATE;
                        workspace.with_handle(move |dir| crate::workspace::snapshot::take(dir, max_bytes, &skip)).await
                    }
                    None => None,
                };
                let _ = reply.send(taken);
            }
            WorkspaceMsg::PutAttachments { attachments, reply } => {
                let written = match state.workspace.as_ref() {
                    Some(workspace) => workspace
                        .with_handle(move |dir| crate::attachments::write_into(dir, &attachments))
                        .await
                        .unwrap_or(0),
                    None => 0,
                };
                let _ = reply.send(written);
            }
        }
        Ok(())
    }
}

async fn answer(
    workspace: &Workspace,
    shell: &mut ShellMemory,
    call: CodeCall,
    sandbox: Option<&ActorRef<SandboxMsg>>,
    artifacts: Option<&ArtifactsFor>,
) -> Result<Answer, ToolError> {
    let writes = match &call {
        CodeCall::Tool { tool, .. } => tool.writes(),
        CodeCall::Script(_) => true,
    };
    // A second of slack: file times have coarse granularity on some
    // filesystems, and a file written just before counts as produced.
    let since = SystemTime::now() - Duration::from_secs(1);
    let settings = match sandbox {
        Some(sandbox) => crate::sandbox::actor::settings(sandbox).await,
        None => None,
    };
    let mut context = CodeContext { workspace, shell, sandbox, settings };
    let mut answer = tools::answer_code(&mut context, call).await?;
    if let (true, Some(target)) = (writes, artifacts) {
        let changed = workspace.with_handle(move |dir| dir.changed_files(since, &PRIVATE)).await.unwrap_or_default();
        if !changed.is_empty() {
            answer.produced = target.store.store(&target.run_id, changed).await;
        }
    }
    Ok(answer)
}

/// Writes `attachments` into a workspace actor's folder, after whatever
/// it is doing; 0 when the folder is gone.
pub async fn put_attachments(workspace: &ActorRef<WorkspaceMsg>, attachments: Arc<Vec<Attachment>>) -> usize {
    match workspace.call(|reply| WorkspaceMsg::PutAttachments { attachments, reply }, None).await {
        Ok(ractor::rpc::CallResult::Success(written)) => written,
        Ok(_) | Err(_) => 0,
    }
}

/// Sends one call to a workspace actor and waits for its answer, however
/// long calls queued before it take.
pub async fn call(
    workspace: &ActorRef<WorkspaceMsg>,
    call: CodeCall,
    sandbox: Option<ActorRef<SandboxMsg>>,
    artifacts: Option<ArtifactsFor>,
) -> Result<Answer, ToolError> {
    match workspace.call(|reply| WorkspaceMsg::Answer { call, sandbox, artifacts, reply }, None).await {
        Ok(ractor::rpc::CallResult::Success(result)) => result,
        Ok(_) | Err(_) => Err(ToolError::workspace_gone()),
    }
}

/// A scratch folder for one call that has no workspace of its own (a skill
/// script run outside code execution, or for an MCP client): created under
/// `exec`'s base with its options, owned by a workspace actor linked to
/// `parent` when given. Stopping the actor deletes the folder.
pub async fn scratch(
    exec: &crate::sandbox::ExecRuntime,
    parent: Option<ractor::ActorCell>,
) -> Result<ActorRef<WorkspaceMsg>, String> {
    let base = exec.workspace_base.clone();
    let options = exec.workspaces.clone();
    let folder = match tokio::task::spawn_blocking(move || Workspace::create(&base, &options)).await {
        Ok(Ok(folder)) => folder,
        // The cause names host paths: logged, not told.
        Ok(Err(err)) => {
            tracing::error!(error = %err, "cannot create a scratch folder");
            return Err("the server cannot create a working folder for it".into());
        }
        Err(_) => return Err("the server cannot create a working folder for it".into()),
    };
    let spawned = match parent {
        Some(parent) => Actor::spawn_linked(None, WorkspaceActor, folder, parent).await,
        None => Actor::spawn(None, WorkspaceActor, folder).await,
    };
    spawned.map(|(actor, _)| actor).map_err(|_| "its working folder did not open".to_string())
}
