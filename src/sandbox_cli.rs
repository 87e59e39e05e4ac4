//! Operator commands for the sandbox: `skillhost run-sandboxed` runs one
//! command exactly as the tools would, and `skillhost doctor` prints what
//! this host confines.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use skillhost_actors::sandbox::doctor;
use skillhost_actors::sandbox::launch::{Launcher, Run};

/// The shipped profiles, built into the binary so an installed server does
/// not depend on the source tree; `--sandbox-profiles` overrides them.
pub const SHIPPED_PROFILES: [(&str, &str); 2] = [
    ("code-exec", include_str!("../sandbox-profiles/code-exec.yaml")),
    ("skills-run", include_str!("../sandbox-profiles/skills-run.yaml")),
];

/// Writes the shipped profiles into a private folder the helper can read.
pub fn shipped_profile_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("skillhost-profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|err| format!("cannot write the sandbox profiles: {err}"))?;
    for (name, text) in SHIPPED_PROFILES {
        std::fs::write(dir.join(format!("{name}.yaml")), text)
            .map_err(|err| format!("cannot write the sandbox profiles: {err}"))?;
    }
    Ok(dir)
}

/// A folder this process made for its own use, removed when dropped.
#[derive(Debug)]
pub struct OwnedDir(pub PathBuf);

impl Drop for OwnedDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The helper is this very binary. Without a profile folder, the shipped
/// profiles are written to one that lives as long as the returned guard.
pub fn launcher(profile_dir: Option<PathBuf>, user: &str) -> Result<(Launcher, Option<OwnedDir>), String> {
    let helper = std::env::current_exe().map_err(|err| format!("cannot find the skillhost binary: {err}"))?;
    let (profile_dir, owned) = match profile_dir {
        Some(dir) => (dir, None),
        None => {
            let dir = shipped_profile_dir()?;
            (dir.clone(), Some(OwnedDir(dir)))
        }
    };
    Ok((Launcher { helper, profile_dir, user: user.to_string() }, owned))
}

#[derive(Debug, Args)]
pub struct RunSandboxedArgs {
    /// Profile: code-exec or skills-run
    #[arg(long)]
    pub profile: String,
    /// The working folder (read-write)
    #[arg(long)]
    pub workspace: PathBuf,
    /// A skill folder the command may read
    #[arg(long)]
    pub skill: Option<PathBuf>,
    /// Let the command use the network
    #[arg(long)]
    pub allow_network: bool,
    /// Folder of sandbox profiles [default: the profiles built into skillhost]
    #[arg(long = "sandbox-profiles")]
    pub sandbox_profiles: Option<PathBuf>,
    /// User commands run as when started as root [default: nobody]
    #[arg(long = "sandbox-user", default_value = "nobody")]
    pub sandbox_user: String,
    /// The command and its arguments
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Runs the command with the terminal attached; returns its exit status.
pub fn run_sandboxed(args: RunSandboxedArgs) -> Result<u8, String> {
    let (launcher, _profiles) = launcher(args.sandbox_profiles, &args.sandbox_user)?;
    let command: Vec<String> = args.command.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let run = Run {
        profile: &args.profile,
        workspace: &args.workspace,
        skill: args.skill.as_deref(),
        network: args.allow_network,
        unconfined: false,
        command: &command,
        timeout: Duration::MAX,
    };
    let status = launcher.command(&run).status().map_err(|err| format!("cannot start the sandbox helper: {err}"))?;
    Ok(status.code().unwrap_or(1).clamp(0, 255) as u8)
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Folder of sandbox profiles [default: the profiles built into skillhost]
    #[arg(long = "sandbox-profiles")]
    pub sandbox_profiles: Option<PathBuf>,
    /// User commands run as when started as root [default: nobody]
    #[arg(long = "sandbox-user", default_value = "nobody")]
    pub sandbox_user: String,
}

/// Prints one line per promise; returns whether every promise holds.
pub fn doctor(args: DoctorArgs) -> Result<(String, bool), String> {
    let (launcher, _profiles) = launcher(args.sandbox_profiles, &args.sandbox_user)?;
    let scratch = tempfile::tempdir().map_err(|err| format!("cannot create a scratch folder: {err}"))?;
    open_to_sandbox_user(scratch.path());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|err| err.to_string())?;
    let checks = runtime.block_on(doctor::checks(&launcher, scratch.path()));
    let mut text = String::from("Sandbox on this host:\n");
    for check in &checks {
        let mark = if check.kept { "yes" } else { "NO " };
        text.push_str(&format!("  {mark}  {}", check.what));
        if !check.kept && !check.detail.is_empty() {
            text.push_str(&format!("  ({})", check.detail));
        }
        text.push('\n');
    }
    text.push_str(&match doctor::gaps_line(&checks) {
        Some(line) => line,
        None => "Everything is confined.".into(),
    });
    text.push('\n');
    Ok((text, checks.iter().all(|c| c.kept)))
}

/// The sandbox user must be able to enter a scratch folder created by root.
pub fn open_to_sandbox_user(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777));
}
