//! `shell(command, timeout_ms)`: a bash command line in the workspace,
//! through the request's sandbox actor. It recovers from the mistakes the
//! host can recognize instead of only reporting them, and keeps the working
//! folder and exports from one command to the next.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

use super::{args, Answer, CodeContext, ToolError};
use crate::sandbox::actor::{self, Finished, Job, Purpose};
use crate::sandbox::launch::OUTPUT_CAP_BYTES;
use crate::sandbox::ExecSettings;

/// A shell command's deadline when the model gives none.
pub const SHELL_DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// The longest deadline a model may ask for.
pub const SHELL_MAX_TIMEOUT_MS: u64 = 600_000;
/// Largest saved shell state the server reads back after a command.
pub const SHELL_STATE_MAX_BYTES: u64 = 64 * 1024;
/// Where the wrapper saves the working folder and exports, inside the
/// workspace; read back through the handle, never by path.
const SHELL_STATE: &str = ".skillhost/state.sh";
/// Programs whose exit status 1 is an answer ("no match", "differs",
/// "false"), not a failure.
const BENIGN_EXIT_ONE: [&str; 8] = ["grep", "egrep", "fgrep", "rg", "diff", "cmp", "test", "["];

/// The declaration, saying what a command gets on this host as it runs now:
/// confined or not, offline or networked (a model that believes it is
/// offline when it is not, or the reverse, plans the wrong steps).
pub fn declaration(settings: &ExecSettings) -> ToolDef {
    let network = if settings.shell_network { "with the host's network" } else { "offline" };
    let description = match actor::confinement(settings, Purpose::Shell) {
        Ok((false, _)) => format!(
            "Run a bash command in the working folder, sandboxed and {network}. Returns its output and exit status."
        ),
        Ok((true, _)) => format!(
            "Run a bash command in the working folder, not sandboxed (with the server's own access to this machine) and {network}. Returns its output and exit status."
        ),
        Err(_) => "Run a bash command in the working folder. This host cannot sandbox commands and the server runs none unsandboxed, so every call is refused: do without it.".to_string(),
    };
    ToolDef {
        name: "shell".into(),
        description,
        parameters: json!({"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line."},
            "timeout_ms": {"type": "integer", "description": "Deadline in milliseconds (default 60000)."}
        }, "required": ["command"]}),
    }
}

/// What the server remembers of a workspace's shell between commands.
#[derive(Debug, Default)]
pub struct ShellMemory {
    /// Where the last command left the shell, relative to the workspace.
    cwd: Option<String>,
    /// The last failing command, its output and how often it failed so.
    last_failure: Option<(String, String, u32)>,
    /// A saved state was read back after the last command.
    had_state: bool,
}

impl ShellMemory {
    /// Starts the repeat count again, after the files changed.
    pub fn forget_failure(&mut self) {
        self.last_failure = None;
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

/// The script that runs one shell command inside the sandbox: restore the
/// last command's working folder and exports, provide `python`, run, then
/// save the state for the next command.
fn wrap(command: &str) -> String {
    format!(
        "mkdir -p \"$HOME/.skillhost/bin\" && ln -sf /usr/bin/python3 \"$HOME/.skillhost/bin/python\" 2>/dev/null\n\
         export PATH=\"$HOME/.skillhost/bin:$PATH\"\n\
         [ -f \"$HOME/{SHELL_STATE}\" ] && . \"$HOME/{SHELL_STATE}\"\n\
         {{\n{command}\n}}\n\
         __skillhost_status=$?\n\
         {{ export -p; printf 'cd %q\\n' \"$PWD\"; }} 2>/dev/null > \"$HOME/{SHELL_STATE}\"\n\
         exit $__skillhost_status\n"
    )
}

/// The working folder a saved state names, relative to the workspace, when
/// it lies inside it. The state is what a command left: only its last `cd`
/// line is read, and only as a name.
fn cwd_from_state(state: &str, root: &Path) -> Option<String> {
    let line = state.lines().rev().find_map(|l| l.strip_prefix("cd "))?;
    let path = Path::new(line.trim().trim_matches('\''));
    let relative = path.strip_prefix(root).ok()?;
    Some(relative.to_string_lossy().into_owned())
}

/// The note a result carries when the shell's state moved: where the next
/// command starts (`before` and `after` are relative to the workspace, `""`
/// its top), or that the state was lost and the next one starts afresh.
fn state_note(before: &str, had_state: bool, state_read: bool, after: Option<&str>) -> Option<String> {
    let shown = |cwd: &str| if cwd.is_empty() { "the top of the working folder".to_string() } else { cwd.to_string() };
    match (state_read, after) {
        (false, _) if had_state => Some(
            "The shell's state was reset: this command left none to carry over, so the next one starts at the top of the working folder without the variables exported before.".into(),
        ),
        (false, _) => None,
        (true, None) => Some(
            "Working directory is now the top of the working folder: the command ended outside it, where the next one cannot start."
                .into(),
        ),
        (true, Some(after)) if after != before => Some(format!("Working directory is now {}.", shown(after))),
        (true, Some(_)) => None,
    }
}

pub(super) fn format_run(header: &str, finished: &Finished, root: &Path, cwd: &Path, timeout: Duration) -> String {
    let ran = &finished.ran;
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
        text.push_str(&format!("[output cut at {} KB per stream]\n", OUTPUT_CAP_BYTES / 1024));
    }
    if ran.out_of_memory {
        text.push_str("[killed: the command and its children went past their memory limit]\n");
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
pub async fn run(context: &mut CodeContext<'_>, arguments: &Map<String, Value>) -> Result<Answer, ToolError> {
    let command = args::text(arguments, &["command", "cmd"]).unwrap_or_default();
    if command.trim().is_empty() {
        return Err(ToolError::Model("Say which command to run: shell(command=\"…\").".into()));
    }
    let Some(sandbox) = context.sandbox else {
        return Err(ToolError::Model("Commands cannot run on this server.".into()));
    };
    let timeout = Duration::from_millis(
        args::number(arguments, "timeout_ms").unwrap_or(SHELL_DEFAULT_TIMEOUT_MS).clamp(1000, SHELL_MAX_TIMEOUT_MS),
    );
    let root = context.workspace.path().to_path_buf();
    let cwd = match &context.shell.cwd {
        Some(relative) if !relative.is_empty() => root.join(relative),
        _ => root.clone(),
    };
    let job = Job {
        purpose: Purpose::Shell,
        workspace: root.clone(),
        owner: context.workspace.owner(),
        skill: None,
        command: vec!["/bin/bash".into(), "-c".into(), wrap(&command)],
        timeout,
    };
    let finished = actor::run(sandbox, job).await.map_err(ToolError::Model)?;
    // Read back through the handle on the workspace's thread: a link, a
    // FIFO or a huge file at the state's name is refused, not followed.
    let state = context
        .workspace
        .with_handle(|dir| dir.read(SHELL_STATE, SHELL_STATE_MAX_BYTES).ok())
        .await
        .flatten()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
    let before = context.shell.cwd.clone().unwrap_or_default();
    let after = state.as_deref().and_then(|state| cwd_from_state(state, &root));
    let note = state_note(&before, context.shell.had_state, state.is_some(), after.as_deref());
    context.shell.had_state = state.is_some();
    context.shell.cwd = after;
    let ran = &finished.ran;
    let mut text = format_run(&format!("$ {command}"), &finished, &root, &cwd, timeout);
    let ok = match ran.exit_code {
        Some(0) => {
            text.push_str("[exit status 0]\n");
            context.shell.last_failure = None;
            true
        }
        Some(1) if benign_exit_one(&command) => {
            text.push_str(&format!(
                "[exit status 1: {} found nothing or the inputs differ; that is an answer, not an error]\n",
                first_program(&command)
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
        let count = match &context.shell.last_failure {
            Some((last_command, last_output, count)) if *last_command == command && *last_output == output => count + 1,
            _ => 1,
        };
        // A failure the sandbox caused is named as such, so the model does
        // not "fix" correct code.
        if let Some(note) = super::diagnosis::environment_note(&output, finished.network, &root) {
            text.push_str(&note);
            text.push('\n');
        }
        context.shell.last_failure = Some((command.clone(), output, count));
        if count > 1 {
            text.push_str(&format!(
                "This exact command has now failed the same way {count} times; change the command or the files before running it again.\n"
            ));
        }
    }
    if let Some(note) = note {
        text.push_str(&note);
        text.push('\n');
    }
    if let Some(gaps) = &finished.gaps {
        text.push_str(gaps);
        text.push('\n');
    }
    Ok(Answer { text: text.trim_end().to_string(), ok, detail: Some(command), ..Answer::default() })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sandbox::launch::{Launcher, SandboxMode};

    /// Settings of a host that confines commands, offline.
    pub(crate) fn settings() -> ExecSettings {
        ExecSettings {
            launcher: Launcher { helper: "skillhost".into(), profile_dir: "profiles".into(), cgroups: None },
            mode: SandboxMode::Required,
            unavailable: None,
            shell_unconfined: false,
            shell_network: false,
            skills_network: false,
            gaps: None,
        }
    }

    #[test]
    fn a_moved_or_lost_state_is_said_once() {
        assert_eq!(state_note("", false, true, Some("")), None, "the first command, staying at the top");
        assert_eq!(state_note("", true, true, Some("sub")).unwrap(), "Working directory is now sub.");
        assert_eq!(state_note("sub", true, true, Some("sub")), None, "no move, no note");
        assert_eq!(
            state_note("sub", true, true, Some("")).unwrap(),
            "Working directory is now the top of the working folder."
        );
        assert!(state_note("sub", true, true, None).unwrap().contains("the command ended outside it"));
        assert!(state_note("sub", true, false, None).unwrap().starts_with("The shell's state was reset"));
        assert_eq!(state_note("", false, false, None), None, "nothing was carried, so nothing was lost");
    }

    #[test]
    fn the_declaration_says_what_a_command_gets_under_each_setting() {
        let says = |settings: ExecSettings| declaration(&settings).description;
        assert!(says(settings()).contains("sandboxed and offline"));
        let networked = ExecSettings { shell_network: true, ..settings() };
        assert!(says(networked).contains("sandboxed and with the host's network"));
        let unconfined = ExecSettings { shell_unconfined: true, ..settings() };
        assert!(says(unconfined).contains("not sandboxed (with the server's own access to this machine) and offline"));
        let off = ExecSettings { mode: SandboxMode::Off, shell_network: true, ..settings() };
        assert!(says(off)
            .contains("not sandboxed (with the server's own access to this machine) and with the host's network"));
        let missing = || ExecSettings { unavailable: Some("no user namespaces".into()), ..settings() };
        assert!(says(missing()).contains("every call is refused"));
        let preferred = ExecSettings { mode: SandboxMode::Preferred, ..missing() };
        assert!(says(preferred).contains("not sandboxed"));
    }

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
    fn the_working_folder_is_read_from_the_state_only_inside_the_workspace() {
        let root = Path::new("/srv/ws-abc");
        assert_eq!(cwd_from_state("export A=1\ncd /srv/ws-abc/src\n", root), Some("src".into()));
        assert_eq!(cwd_from_state("cd /etc\n", root), None);
        assert_eq!(cwd_from_state("no cd here", root), None);
    }
}
