//! What this host confines: a few probe commands through the helper, each
//! checking one promise. The startup log and `skillhost doctor` print it, and
//! every command result names the gaps.

use std::path::Path;
use std::time::Duration;

use super::launch::{Launcher, Run};

/// One promise and whether this host keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub what: &'static str,
    pub kept: bool,
    pub detail: String,
}

/// The probes: (promise, command, whether success means the promise holds).
const PROBES: [(&str, &str, bool); 7] = [
    ("commands start inside the sandbox", "true", true),
    ("commands do not run as root", "test \"$(id -u)\" != 0", true),
    ("/etc/shadow is unreadable", "cat /etc/shadow", false),
    ("the server user's home is out of reach", "ls /root", false),
    ("/proc/sys is read-only", "echo x > /proc/sys/kernel/hostname", false),
    ("the network is off", "exec 3<>/dev/tcp/127.0.0.1/1", false),
    // `ls` holds 0-2 and the folder it lists; a fifth entry is a leak.
    ("no descriptor but 0-2 reaches a command", "test \"$(ls /proc/self/fd | wc -l)\" -le 4", true),
];

/// Runs every probe in `scratch` (a folder `owner` may write).
pub async fn checks(launcher: &Launcher, scratch: &Path, owner: Option<(u32, u32)>) -> Vec<Check> {
    let mut out = Vec::new();
    for (what, script, success_keeps) in PROBES {
        let command = ["/bin/bash".to_string(), "-c".to_string(), script.to_string()];
        let run = Run {
            profile: "code-exec",
            workspace: scratch,
            owner,
            skill: None,
            network: false,
            unconfined: false,
            command: &command,
            env: &[],
            read: &[],
            start_in: None,
            proxy: None,
            timeout: Duration::from_secs(30),
        };
        let check = match launcher.run(&run).await {
            Ok(ran) => {
                let succeeded = ran.exit_code == Some(0);
                Check {
                    what,
                    kept: succeeded == success_keeps,
                    detail: ran.stderr.lines().last().unwrap_or_default().to_string(),
                }
            }
            Err(err) => Check { what, kept: false, detail: err.to_string() },
        };
        out.push(check);
    }
    // Without a sandbox nothing else holds.
    if out.first().is_some_and(|c| !c.kept) {
        for check in out.iter_mut().skip(1) {
            check.kept = false;
        }
    }
    out
}

/// The gaps, as the line each command result ends with; `None` when none.
pub fn gaps_line(checks: &[Check]) -> Option<String> {
    let gaps: Vec<&str> = checks.iter().filter(|c| !c.kept).map(|c| c.what).collect();
    (!gaps.is_empty()).then(|| format!("Not confined on this host: {}.", gaps.join("; ")))
}
