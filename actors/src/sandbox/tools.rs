//! The tools that run processes: `shell` (code execution) and the execution
//! half of `skills_run`. Both go through the sandbox helper; both recover
//! from the mistakes the host can recognize instead of reporting them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::launch::{Launcher, Ran, Run, SandboxMode};

/// A shell command's deadline when the model gives none.
pub const SHELL_DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// The longest deadline a model may ask for.
pub const SHELL_MAX_TIMEOUT_MS: u64 = 600_000;
/// A skill script's deadline.
pub const SKILLS_RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// Programs whose exit status 1 is an answer ("no match", "differs",
/// "false"), not a failure.
const BENIGN_EXIT_ONE: [&str; 8] = ["grep", "egrep", "fgrep", "rg", "diff", "cmp", "test", "["];

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

/// What a process tool did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    pub text: String,
    pub ok: bool,
}

/// Remembers the last failing command of a workspace, to count repeats.
#[derive(Debug, Default)]
pub struct ShellMemory {
    last_failure: Option<(String, String, u32)>,
}

impl ShellMemory {
    /// Starts the count again, after the files changed.
    pub fn forget(&mut self) {
        self.last_failure = None;
    }
}

/// Whether a run may go ahead, and unconfined or not.
fn confinement(settings: &ExecSettings, unconfined_by_choice: bool) -> Result<(bool, Option<String>), String> {
    if unconfined_by_choice {
        return Ok((
            true,
            Some("Not confined on this host: everything; the operator runs these commands unconfined.".into()),
        ));
    }
    match (&settings.unavailable, settings.mode) {
        (None, SandboxMode::Required | SandboxMode::Preferred) => Ok((false, settings.gaps.clone())),
        (_, SandboxMode::Off) => Ok((true, Some("Not confined on this host: everything; the sandbox is switched off.".into()))),
        (Some(reason), SandboxMode::Required) => Err(format!(
            "The command did not run: this server only runs commands inside its sandbox, and this host cannot provide one ({reason})."
        )),
        (Some(reason), SandboxMode::Preferred) => {
            Ok((true, Some(format!("Not confined on this host: everything; the sandbox is unavailable ({reason})."))))
        }
    }
}

/// The first program a shell command runs, skipping `VAR=value` prefixes.
fn first_program(command: &str) -> &str {
    command
        .split_whitespace()
        .find(|word| !word.contains('=') || word.starts_with('='))
        .map(|word| word.rsplit('/').next().unwrap_or(word))
        .unwrap_or_default()
}

/// Whether exit status 1 of `command` means an answer, not a failure.
fn benign_exit_one(command: &str) -> bool {
    let program = first_program(command);
    BENIGN_EXIT_ONE.contains(&program) || command.trim_start().starts_with("git diff --quiet")
}

/// Rewrites absolute paths inside `root` relative to `cwd`, so output stays
/// short and a model never splices host paths together.
pub fn relative_paths(text: &str, root: &Path, cwd: &Path) -> String {
    let root_text = root.display().to_string();
    if root_text.len() < 2 || !text.contains(&root_text) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&root_text) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | ':' | ',' | ')' | '(' | ';'))
            .unwrap_or(tail.len());
        let absolute = Path::new(&tail[..end]);
        out.push_str(&relative_to(absolute, cwd));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn relative_to(path: &Path, base: &Path) -> String {
    let path: Vec<_> = path.components().collect();
    let base: Vec<_> = base.components().collect();
    let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_string(), base.len() - common).collect();
    parts.extend(path[common..].iter().map(|c| c.as_os_str().to_string_lossy().into_owned()));
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

/// The script that runs one shell command: restore the last command's
/// working folder and exports, provide `python`, run, then save the state.
fn wrap(command: &str) -> String {
    format!(
        "mkdir -p \"$HOME/.skillhost/bin\" && ln -sf /usr/bin/python3 \"$HOME/.skillhost/bin/python\" 2>/dev/null\n\
         export PATH=\"$HOME/.skillhost/bin:$PATH\"\n\
         [ -f \"$HOME/.skillhost/state.sh\" ] && . \"$HOME/.skillhost/state.sh\"\n\
         {{\n{command}\n}}\n\
         __skillhost_status=$?\n\
         {{ export -p; printf 'cd %q\\n' \"$PWD\"; }} > \"$HOME/.skillhost/state.sh\" 2>/dev/null\n\
         exit $__skillhost_status\n"
    )
}

/// Where the previous command left the shell, from the saved state.
fn saved_cwd(root: &Path) -> PathBuf {
    std::fs::read_to_string(root.join(".skillhost/state.sh"))
        .ok()
        .and_then(|state| {
            state.lines().rev().find_map(|l| l.strip_prefix("cd ").map(|p| p.trim_matches('\'').to_string()))
        })
        .map(PathBuf::from)
        .filter(|p| p.starts_with(root))
        .unwrap_or_else(|| root.to_path_buf())
}

fn format_run(header: &str, ran: &Ran, root: &Path, cwd: &Path, timeout: Duration) -> String {
    let mut text = format!("{header}\n");
    let stdout = relative_paths(&ran.stdout, root, cwd);
    let stderr = relative_paths(&ran.stderr, root, cwd);
    if !stdout.is_empty() {
        text.push_str(&stdout);
        if !stdout.ends_with('\n') {
            text.push('\n');
        }
    }
    if !stderr.is_empty() {
        text.push_str("[stderr]\n");
        text.push_str(&stderr);
        if !stderr.ends_with('\n') {
            text.push('\n');
        }
    }
    if ran.truncated {
        text.push_str("[output cut at 32 KB per stream]\n");
    }
    if ran.timed_out {
        text.push_str(&format!(
            "[killed after {} s: the command did not finish in time; make it faster or pass a larger timeout_ms (at most {SHELL_MAX_TIMEOUT_MS})]\n",
            timeout.as_secs()
        ));
    }
    text
}

/// `shell(command, timeout_ms)`.
pub async fn shell(
    settings: &ExecSettings,
    root: &Path,
    memory: &mut ShellMemory,
    command: &str,
    timeout_ms: Option<u64>,
) -> ExecOutcome {
    if command.trim().is_empty() {
        return ExecOutcome { text: "Say which command to run: shell(command=\"…\").".into(), ok: false };
    }
    let (unconfined, gaps) = match confinement(settings, settings.shell_unconfined) {
        Ok(decision) => decision,
        Err(refusal) => return ExecOutcome { text: refusal, ok: false },
    };
    let timeout =
        Duration::from_millis(timeout_ms.unwrap_or(SHELL_DEFAULT_TIMEOUT_MS).clamp(1000, SHELL_MAX_TIMEOUT_MS));
    let cwd = saved_cwd(root);
    let script = ["/bin/bash".to_string(), "-c".to_string(), wrap(command)];
    let run = Run {
        profile: "code-exec",
        workspace: root,
        skill: None,
        network: settings.shell_network,
        unconfined,
        command: &script,
        timeout,
    };
    let ran = match settings.launcher.run(&run).await {
        Ok(ran) => ran,
        Err(err) => return ExecOutcome { text: format!("The command did not run: {err}."), ok: false },
    };
    let mut text = format_run(&format!("$ {command}"), &ran, root, &cwd, timeout);
    let ok = match ran.exit_code {
        Some(0) => {
            text.push_str("[exit status 0]\n");
            memory.last_failure = None;
            true
        }
        Some(1) if benign_exit_one(command) => {
            text.push_str(&format!(
                "[exit status 1: {} found nothing or the inputs differ; that is an answer, not an error]\n",
                first_program(command)
            ));
            true
        }
        Some(code) => {
            text.push_str(&format!("[exit status {code}]\n"));
            false
        }
        None => false,
    };
    if !ok {
        let output = format!("{}{}", ran.stdout, ran.stderr);
        let count = match &memory.last_failure {
            Some((last_command, last_output, count)) if last_command == command && *last_output == output => count + 1,
            _ => 1,
        };
        memory.last_failure = Some((command.to_string(), output, count));
        if count > 1 {
            text.push_str(&format!(
                "This exact command has now failed the same way {count} times; change the command or the files before running it again.\n"
            ));
        }
    }
    if let Some(gaps) = gaps {
        text.push_str(&gaps);
        text.push('\n');
    }
    ExecOutcome { text: text.trim_end().to_string(), ok }
}

/// The interpreter for a script, chosen by its extension and never by its
/// first line.
pub fn interpreter(script: &str) -> Option<&'static str> {
    match script.rsplit_once('.').map(|(_, ext)| ext.to_ascii_lowercase())?.as_str() {
        "py" => Some("/usr/bin/python3"),
        "js" | "mjs" => Some("/usr/bin/node"),
        "sh" | "bash" => Some("/bin/bash"),
        _ => None,
    }
}

/// Runs a skill's script: the interpreter exec'd directly (no shell parses
/// the arguments), the skill folder read-only, in `cwd`.
pub async fn run_script(
    settings: &ExecSettings,
    skill_root: &Path,
    script: &str,
    args: &[String],
    cwd: &Path,
) -> ExecOutcome {
    let Some(program) = interpreter(script) else {
        return ExecOutcome {
            text: format!("'{script}' is not a script skills_run can run; it runs .py (python3), .js and .mjs (node), .sh and .bash (bash)."),
            ok: false,
        };
    };
    let (unconfined, gaps) = match confinement(settings, false) {
        Ok(decision) => decision,
        Err(refusal) => return ExecOutcome { text: refusal, ok: false },
    };
    let mut command = vec![program.to_string(), skill_root.join(script).display().to_string()];
    command.extend(args.iter().cloned());
    let run = Run {
        profile: "skills-run",
        workspace: cwd,
        skill: Some(skill_root),
        network: settings.skills_network,
        unconfined,
        command: &command,
        timeout: SKILLS_RUN_TIMEOUT,
    };
    let ran = match settings.launcher.run(&run).await {
        Ok(ran) => ran,
        Err(err) => return ExecOutcome { text: format!("The script did not run: {err}."), ok: false },
    };
    let mut header = format!("[skills_run: {script}");
    for arg in args {
        header.push(' ');
        header.push_str(&quoted(arg));
    }
    header.push(']');
    let mut text = format_run(&header, &ran, cwd, cwd, SKILLS_RUN_TIMEOUT);
    let ok = ran.exit_code == Some(0);
    if let Some(code) = ran.exit_code {
        text.push_str(&format!("[exit status {code}]\n"));
    }
    if let Some(gaps) = gaps {
        text.push_str(&gaps);
        text.push('\n');
    }
    ExecOutcome { text: text.trim_end().to_string(), ok }
}

/// An argument as a shell would need it written, so the header shows where
/// each one starts and ends (nothing parses it: the script got it as is).
fn quoted(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benign_exit_codes() {
        for command in [
            "grep foo file",
            "LANG=C grep -q x y",
            "diff a b",
            "test -f x",
            "[ -f x ]",
            "/usr/bin/cmp a b",
            "git diff --quiet",
        ] {
            assert!(benign_exit_one(command), "{command}");
        }
        for command in ["python3 x.py", "cat x", "make", "git status"] {
            assert!(!benign_exit_one(command), "{command}");
        }
    }

    #[test]
    fn paths_become_relative_to_where_the_command_ran() {
        let root = Path::new("/srv/ws-abc");
        let cwd = Path::new("/srv/ws-abc/src");
        let text = "File \"/srv/ws-abc/src/app.py\", line 3\nsee /srv/ws-abc/tests/t.py: and /srv/ws-abc\n";
        assert_eq!(relative_paths(text, root, cwd), "File \"app.py\", line 3\nsee ../tests/t.py: and ..\n");
        assert_eq!(relative_paths("/other/path", root, cwd), "/other/path");
    }

    #[test]
    fn header_arguments_show_their_bounds() {
        assert_eq!(quoted("--flag"), "--flag");
        assert_eq!(quoted("a b"), "'a b'");
        assert_eq!(quoted(""), "''");
        assert_eq!(quoted("it's"), "'it'\\''s'");
    }

    #[test]
    fn interpreters_by_extension() {
        assert_eq!(interpreter("scripts/a.py"), Some("/usr/bin/python3"));
        assert_eq!(interpreter("x.MJS"), Some("/usr/bin/node"));
        assert_eq!(interpreter("run.bash"), Some("/bin/bash"));
        assert_eq!(interpreter("Makefile"), None);
        assert_eq!(interpreter("tool.rb"), None);
    }
}
