//! Running model-written commands and skill scripts confined by the OS.
//!
//! The server never enters the sandbox itself (birdcage needs a
//! single-threaded caller and rewrites its caller's environment): it starts
//! `skillhost sandbox-exec`, which sets everything up in a fresh process
//! before any thread exists.

pub mod actor;
pub mod cgroups;
pub mod doctor;
pub mod launch;
pub mod profile;
pub mod uids;

use std::path::PathBuf;

use actor::Purpose;
use launch::{Launcher, SandboxMode};

/// How commands run on this server.
#[derive(Debug, Clone)]
pub struct ExecSettings {
    pub launcher: Launcher,
    pub mode: SandboxMode,
    /// Why this host cannot confine commands, when it cannot.
    pub unavailable: Option<String>,
    /// The operator chose to run shell commands unconfined.
    pub shell_unconfined: bool,
    pub shell_network: bool,
    pub skills_network: bool,
    /// The "Not confined on this host:" line, when something is not.
    pub gaps: Option<String>,
}

/// What a command granted the network can reach that a confined one should
/// not; named in its results, since nothing isolates that network here.
pub const HOST_NETWORK_GAP: &str =
    "the network (the command shares the host's, with its loopback services and link-local addresses)";

impl ExecSettings {
    /// The "Not confined on this host:" line for one kind of command: the
    /// host's gaps, plus the host network when this kind was granted it.
    pub fn gaps_for(&self, purpose: Purpose) -> Option<String> {
        let network = match purpose {
            Purpose::Shell => self.shell_network,
            Purpose::Script => self.skills_network,
            Purpose::SyntaxCheck => false,
        };
        match (&self.gaps, network) {
            (gaps, false) => gaps.clone(),
            (None, true) => Some(format!("Not confined on this host: {HOST_NETWORK_GAP}.")),
            (Some(gaps), true) => Some(format!("{}; {HOST_NETWORK_GAP}.", gaps.trim_end_matches('.'))),
        }
    }
}

/// Everything a request needs to run processes and keep what they produce.
#[derive(Debug)]
pub struct ExecRuntime {
    pub settings: std::sync::Arc<ExecSettings>,
    /// Where request workspaces are created.
    pub workspace_base: PathBuf,
    /// How workspaces are made: their uids, their size cap.
    pub workspaces: crate::workspace::WorkspaceOptions,
    /// The code tools (`--code-exec`) are offered.
    pub code_exec: bool,
}
