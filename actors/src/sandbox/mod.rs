//! Running model-written commands and skill scripts confined by the OS.
//!
//! The server never enters the sandbox itself (birdcage needs a
//! single-threaded caller and rewrites its caller's environment): it starts
//! `skillhost sandbox-exec`, which sets everything up in a fresh process
//! before any thread exists.

pub mod doctor;
pub mod launch;
pub mod profile;
pub mod tools;

use std::path::PathBuf;

use crate::artifacts::ArtifactStore;

/// Everything a request needs to run processes and keep what they produce.
#[derive(Debug)]
pub struct ExecRuntime {
    pub settings: tools::ExecSettings,
    /// Where request workspaces are created.
    pub workspace_base: PathBuf,
    /// The sandbox user's uid and gid when the server runs as root.
    pub owner: Option<(u32, u32)>,
    pub artifacts: ArtifactStore,
    /// The code tools (`--code-exec`) are offered.
    pub code_exec: bool,
    /// Workspaces of Web UI conversations, kept between requests.
    pub conversations: crate::workspace::conversations::Conversations,
}
