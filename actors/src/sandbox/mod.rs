//! Running model-written commands and skill scripts confined by the OS.
//!
//! The server never enters the sandbox itself (birdcage needs a
//! single-threaded caller and rewrites its caller's environment): it starts
//! `skillhost sandbox-exec`, which sets everything up in a fresh process
//! before any thread exists.

pub mod actor;
pub mod ca;
pub mod cgroups;
pub mod doctor;
pub mod egress;
pub mod installs;
pub mod interpreters;
pub mod launch;
pub mod private_net;

/// The helper's command line and the profiles, shared with the helper binary.
pub use skillhost_sandbox::{args as helper_args, profile};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use actor::Purpose;
use interpreters::{Interpreters, Python};
use launch::{Launcher, SandboxMode, DEFAULT_PATH};

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
    /// Which program runs a script, and the shell's `python`.
    pub interpreters: Arc<Interpreters>,
    /// The host's proxy settings without credentials, for commands granted
    /// the network.
    pub proxy_env: Vec<(String, String)>,
    /// Installs the host performs for the model (`--code-exec-allow-install`).
    pub install: Option<Arc<installs::InstallSettings>>,
    /// The CA snapshot networked runs read (`--ca-bundle`), a file of the
    /// server's own.
    pub ca_bundle: Option<PathBuf>,
}

/// Where a workspace keeps what the host installed into it: Python's user
/// base (`pip install --user`) and npm's `node_modules`.
pub const PYTHON_USER_BASE: &str = ".local";
pub const NODE_MODULES: &str = "node_modules";

/// The variables every command in `root` gets on top of the helper's own
/// (HOME, PWD and the temp folders point into the workspace already): the
/// workspace's programs first on PATH, and its packages where Python and
/// Node look, so what an earlier call installed is found by the next one,
/// by a skill's script and by the shell alike.
pub fn workspace_environment(root: &Path, python: Option<&Python>) -> Vec<(String, String)> {
    let inside = |relative: &str| root.join(relative).display().to_string();
    let host_path = std::env::var("PATH").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| DEFAULT_PATH.into());
    let mut env = vec![
        ("PATH".to_string(), format!("{}:{}:{host_path}", inside(".local/bin"), inside("node_modules/.bin"))),
        ("PYTHONUSERBASE".to_string(), inside(PYTHON_USER_BASE)),
        ("NODE_PATH".to_string(), inside(NODE_MODULES)),
    ];
    if let Some(python) = python {
        env.push(("PYTHONPATH".to_string(), inside(&format!(".local/lib/python{}/site-packages", python.version))));
    }
    env
}

/// The host's proxy variables a networked command may see: only those
/// without credentials, since nothing a command prints is private.
pub fn proxy_environment(host: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    const NAMES: [&str; 8] =
        ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"];
    let mut kept: Vec<(String, String)> = host
        .into_iter()
        .filter(|(name, value)| NAMES.contains(&name.as_str()) && !value.is_empty() && !has_credentials(value))
        .collect();
    kept.sort();
    kept
}

/// Whether a proxy URL carries a user name or password (`user:secret@host`).
fn has_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.contains('@')
}

/// What a command granted the network can reach that a confined one should
/// not; named in its results, since nothing isolates that network here.
pub const HOST_NETWORK_GAP: &str =
    "the network (the command shares the host's, with its loopback services and link-local addresses)";

impl ExecSettings {
    /// Commands confined (required) and offline, nothing else granted: the
    /// defaults, which `main` and the tests then change.
    pub fn confined(launcher: Launcher, interpreters: Interpreters) -> ExecSettings {
        ExecSettings {
            launcher,
            mode: SandboxMode::Required,
            unavailable: None,
            shell_unconfined: false,
            shell_network: false,
            skills_network: false,
            gaps: None,
            interpreters: Arc::new(interpreters),
            proxy_env: Vec::new(),
            install: None,
            ca_bundle: None,
        }
    }

    /// The "Not confined on this host:" line for one kind of command: the
    /// host's gaps, plus the host network when this kind was granted it.
    pub fn gaps_for(&self, purpose: Purpose) -> Option<String> {
        match (&self.gaps, purpose.network(self)) {
            (gaps, false) => gaps.clone(),
            (None, true) => Some(format!("Not confined on this host: {HOST_NETWORK_GAP}.")),
            (Some(gaps), true) => Some(format!("{}; {HOST_NETWORK_GAP}.", gaps.trim_end_matches('.'))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxies_with_credentials_never_reach_a_command() {
        let host = [
            ("HTTPS_PROXY", "http://proxy.corp:3128"),
            ("http_proxy", "http://user:secret@proxy.corp:3128"),
            ("ALL_PROXY", "socks5://me@socks.corp"),
            ("NO_PROXY", "localhost,.corp"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("HTTP_PROXY", ""),
        ]
        .map(|(n, v)| (n.to_string(), v.to_string()));
        let kept = proxy_environment(host);
        assert_eq!(
            kept,
            [("HTTPS_PROXY", "http://proxy.corp:3128"), ("NO_PROXY", "localhost,.corp")]
                .map(|(n, v)| (n.to_string(), v.to_string()))
        );
        assert!(!has_credentials("http://proxy/path@x"), "an @ past the host is not a credential");
    }

    #[test]
    fn the_workspace_comes_first_on_path_and_holds_the_packages() {
        let python = Python { path: "/usr/bin/python3.11".into(), version: "3.11".into() };
        let env: std::collections::BTreeMap<_, _> =
            workspace_environment(Path::new("/w"), Some(&python)).into_iter().collect();
        assert!(env["PATH"].starts_with("/w/.local/bin:/w/node_modules/.bin:"), "{}", env["PATH"]);
        assert_eq!(env["PYTHONUSERBASE"], "/w/.local");
        assert_eq!(env["PYTHONPATH"], "/w/.local/lib/python3.11/site-packages");
        assert_eq!(env["NODE_PATH"], "/w/node_modules");
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
