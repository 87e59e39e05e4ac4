//! The harness the trust-boundary and isolation tests share: the real
//! helper and sandbox behind a `SandboxActor`, workspaces behind
//! `WorkspaceActor`s, and an artifact store, as a server sets them up.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ractor::{Actor, ActorRef};
use serde_json::{json, Value};
use skillhost_actors::artifacts::{ArtifactLimits, ArtifactStore, ArtifactStoreActor, Artifacts};
use skillhost_actors::sandbox::actor::{SandboxActor, SandboxMsg};
use skillhost_actors::sandbox::cgroups::Cgroups;
use skillhost_actors::sandbox::launch::{Launcher, SandboxMode};
use skillhost_actors::sandbox::ExecSettings;
use skillhost_actors::tools::workspace_actor::{self, ArtifactsFor, WorkspaceActor, WorkspaceMsg};
use skillhost_actors::tools::{Answer, CodeCall, Tool, ToolError};
use skillhost_actors::workspace::uids::{UidPool, DEFAULT_UID_RANGE};
use skillhost_actors::workspace::{Workspace, WorkspaceOptions};

pub const BINARY: &str = env!("CARGO_BIN_EXE_skillhost");
/// The sandbox helper the server starts for each command.
pub const HELPER: &str = env!("CARGO_BIN_EXE_skillhost-sandbox");

/// What a harness differs in.
#[derive(Default)]
pub struct Setup {
    pub cgroups: Option<Arc<Cgroups>>,
    pub size_cap: Option<u64>,
    pub mode: Option<SandboxMode>,
}

pub struct Harness {
    _base: tempfile::TempDir,
    pub base: PathBuf,
    pub options: WorkspaceOptions,
    pub sandbox: ActorRef<SandboxMsg>,
    pub artifacts: Artifacts,
    pub artifacts_dir: PathBuf,
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

pub async fn harness(setup: Setup) -> Harness {
    assert!(is_root(), "these tests need root, as CI runs them: only a root server runs commands as other uids");
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let launcher = Launcher::new(
        PathBuf::from(HELPER),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-profiles"),
        setup.cgroups,
    );
    let settings = Arc::new(ExecSettings {
        mode: setup.mode.unwrap_or(SandboxMode::Required),
        ..ExecSettings::confined(launcher, skillhost_actors::sandbox::interpreters::Interpreters::detect())
    });
    let (sandbox, _) = Actor::spawn(None, SandboxActor, settings).await.unwrap();
    let artifacts_dir = base.path().join("artifacts");
    std::fs::create_dir(&artifacts_dir).unwrap();
    let store = ArtifactStore::new(&artifacts_dir, ArtifactLimits::default()).unwrap();
    let (store, _) = Actor::spawn(None, ArtifactStoreActor, store).await.unwrap();
    let options = WorkspaceOptions {
        uids: Some(UidPool::new(DEFAULT_UID_RANGE).unwrap()),
        size_cap: setup.size_cap,
        budget: None,
    };
    Harness {
        base: base.path().to_path_buf(),
        _base: base,
        options,
        sandbox,
        artifacts: Artifacts(store),
        artifacts_dir,
    }
}

impl Harness {
    /// A new workspace behind its actor, and its path.
    pub async fn workspace(&self) -> (ActorRef<WorkspaceMsg>, PathBuf) {
        let workspace = Workspace::create(&self.base, &self.options).unwrap();
        let path = workspace.path().to_path_buf();
        (Actor::spawn(None, WorkspaceActor, workspace).await.unwrap().0, path)
    }

    pub async fn call(&self, workspace: &ActorRef<WorkspaceMsg>, tool: Tool, args: Value) -> Result<Answer, ToolError> {
        let call = CodeCall::Tool { tool, args: args.as_object().unwrap().clone() };
        let target = ArtifactsFor { store: self.artifacts.clone(), run_id: "run-trust".into() };
        workspace_actor::call(workspace, call, Some(self.sandbox.clone()), Some(target)).await
    }

    /// The text the model reads, success or not.
    pub async fn text(&self, workspace: &ActorRef<WorkspaceMsg>, tool: Tool, args: Value) -> String {
        match self.call(workspace, tool, args).await {
            Ok(answer) => answer.text,
            Err(ToolError::Model(text)) => text,
            Err(ToolError::Fatal(text)) => panic!("a planted file ended the request: {text}"),
        }
    }

    pub async fn shell(&self, workspace: &ActorRef<WorkspaceMsg>, command: &str, timeout_ms: u64) -> String {
        self.text(workspace, Tool::Shell, json!({"command": command, "timeout_ms": timeout_ms})).await
    }
}

/// A file's bytes, owner, group and mode.
pub fn state(file: &Path) -> (Vec<u8>, u32, u32, u32) {
    let meta = std::fs::symlink_metadata(file).unwrap();
    (std::fs::read(file).unwrap(), meta.uid(), meta.gid(), meta.mode())
}

/// A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in bytes.
pub fn memory(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}
