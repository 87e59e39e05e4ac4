//! `shell(command, timeout_ms)`: a bash command line in the workspace,
//! through the request's sandbox actor. It recovers from the mistakes the
//! host can recognize instead of only reporting them, and keeps the working
//! folder and exports from one command to the next.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

use super::{args, install, Answer, CodeContext, ToolError};
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
    let mut description = description;
    if actor::confinement(settings, Purpose::Shell).is_ok() {
        match settings.install.as_deref().filter(|i| i.allowed) {
            Some(install) if !install.packages.is_empty() => description.push_str(&format!(
                " The host itself performs `pip install NAME` and `npm install NAME` in a command line (wheels only, no package scripts) before the rest runs, for these packages: {}.",
                install.packages.join(", ")
            )),
            Some(_) => description.push_str(
                " The host itself performs `pip install NAME` and `npm install NAME` in a command line (wheels only, no package scripts) before the rest runs.",
            ),
            None => description.push_str(" Packages cannot be installed here: use what is installed."),
        }
        if let Some(line) = settings.interpreters.host_line() {
            description.push(' ');
            description.push_str(&line);
        }
    }
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
/// last command's working folder and exports, make `python` and `python3`
/// the host's chosen Python (the one `.py` scripts and installs use), run,
/// then save the state for the next command.
fn wrap(command: &str, python: Option<&Path>) -> String {
    let python = python.map_or("/usr/bin/python3".to_string(), |p| p.display().to_string());
    format!(
        "mkdir -p \"$HOME/.skillhost/bin\" && ln -sf '{python}' \"$HOME/.skillhost/bin/python\" 2>/dev/null && ln -sf '{python}' \"$HOME/.skillhost/bin/python3\" 2>/dev/null\n\
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

/// Variables the shell's saved exports never pass to a skill script: the
/// helper sets them for each run itself.
const NOT_PASSED: [&str; 8] = ["HOME", "PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "TEMP", "TMP"];
/// Most exports a skill script takes from the shell's state.
pub const MAX_PASSED_EXPORTS: usize = 256;

/// The variables a saved state exports (`declare -x NAME="value"` lines,
/// as `export -p` writes them), for a skill script run in the same folder.
/// The state is what a command left, so each name is checked and each value
/// read only as text.
pub fn exports(state: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in state.lines() {
        let Some(rest) = line.strip_prefix("declare -x ") else { continue };
        let Some((name, quoted)) = rest.split_once('=') else { continue };
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let Some(inner) = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')) else { continue };
        if !valid || NOT_PASSED.contains(&name) {
            continue;
        }
        let mut value = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('\\', Some(next @ ('"' | '\\' | '$' | '`'))) => {
                    value.push(next);
                    chars.next();
                }
                _ => value.push(c),
            }
        }
        out.push((name.to_string(), value));
        if out.len() == MAX_PASSED_EXPORTS {
            break;
        }
    }
    out
}

/// What the shell has exported in this workspace, read through the handle.
pub async fn saved_exports(context: &CodeContext<'_>) -> Vec<(String, String)> {
    let state = context.workspace.with_handle(|dir| dir.read(SHELL_STATE, SHELL_STATE_MAX_BYTES).ok()).await.flatten();
    state.map(|bytes| exports(&String::from_utf8_lossy(&bytes))).unwrap_or_default()
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

/// `shell(command, timeout_ms)`: installs the line asks for first (when the
/// host performs installs), then the rest of the line; a missing import is
/// installed and the same line run again, within the call's deadline.
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
    let deadline = Instant::now() + timeout;
    let settings = context.settings.clone();
    let installer = settings.as_ref().and_then(|s| Installer::new(s));
    let mut installed: Vec<String> = Vec::new();
    let mut line = Some(command.clone());
    if let Some(settings) = &settings {
        let install = settings.install.as_deref();
        let rules = install::Rules {
            allowed: installer.is_some(),
            network: settings.shell_network,
            packages: install.map_or(&[], |i| i.packages.as_slice()),
        };
        let cwd = context.shell.cwd.clone().unwrap_or_default();
        match install::read_line(&command, &rules, &cwd) {
            install::Plan::Run => {}
            install::Plan::Refused(why) => {
                return Ok(Answer {
                    text: format!("$ {command}\n[not run] {why}"),
                    ok: false,
                    detail: Some(command),
                    ..Answer::default()
                })
            }
            install::Plan::Install { requests, rest } => {
                // Installs are read only when allowed, so this is never None.
                let Some(installer) = &installer else { return Err(ToolError::Model(install::not_enabled())) };
                for request in requests {
                    match installer.perform(context, sandbox, request, deadline).await? {
                        Ok(summary) => installed.push(summary),
                        Err(failure) => {
                            let text = format!("$ {command}\n{}{failure}", lines(&installed));
                            return Ok(Answer { text, ok: false, detail: Some(command), ..Answer::default() });
                        }
                    }
                }
                line = rest;
            }
        }
    }
    let Some(line) = line else {
        // The line was installs and nothing else.
        let text = format!("$ {command}\n{}[exit status 0]", lines(&installed));
        context.shell.last_failure = None;
        return Ok(Answer { text, ok: true, detail: Some(command), ..Answer::default() });
    };
    // The state this line starts from, put back before running it again.
    let start_state =
        context.workspace.with_handle(|dir| dir.read(SHELL_STATE, SHELL_STATE_MAX_BYTES).ok()).await.flatten();
    let mut missing_installed: Vec<String> = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        let finished = actor::run(sandbox, shell_job(context, &line, left))
            .await
            .map_err(|not_run| ToolError::Model(not_run.sentence("command")))?;
        let failed = !matches!(finished.ran.exit_code, Some(0)) && !finished.ran.timed_out;
        let output = format!("{}{}", finished.ran.stdout, finished.ran.stderr);
        let missing = match (&installer, failed) {
            (Some(_), true) => install::missing_package(&output),
            _ => None,
        };
        let Some((ecosystem, module, package)) = missing else {
            return Ok(finish(context, &command, &installed, finished, timeout).await);
        };
        let settings = settings.as_deref().and_then(|s| s.install.as_deref());
        let request = install::Request::new(ecosystem, vec![package.clone()]);
        let time_left = Instant::now() + Duration::from_secs(2) < deadline;
        let refusal = auto_install_refusal(&module, &package, &missing_installed, time_left).or_else(|| {
            install::check_allowed(&request, settings.map_or(&[], |s| s.packages.as_slice()))
                .err()
                .map(|why| format!("[{module} is missing, and the host did not install it: {why}]"))
        });
        if let Some(refusal) = refusal {
            installed.push(refusal);
            return Ok(finish(context, &command, &installed, finished, timeout).await);
        }
        // Missing packages are looked for only with an installer.
        let Some(installer) = &installer else { return Err(ToolError::Model(install::not_enabled())) };
        match installer.perform(context, sandbox, request, deadline).await? {
            Ok(summary) => {
                installed.push(format!(
                    "[{module} was missing, so the host installed {package} ({summary}) and ran the command again]"
                ));
                missing_installed.push(package);
            }
            Err(failure) => {
                installed.push(format!("[{module} was missing, and the host's install of {package} failed: the command's own output follows]\n{failure}"));
                return Ok(finish(context, &command, &installed, finished, timeout).await);
            }
        }
        // The same line again, from where it started.
        let state = start_state.clone();
        context
            .workspace
            .with_handle(move |dir| match state {
                Some(bytes) => dir.stage(SHELL_STATE, &bytes).and_then(|staged| dir.commit(staged, true)),
                None => dir.remove_file(SHELL_STATE).or(Ok(())),
            })
            .await;
    }
}

/// Why a missing package is not installed for this run of the line: it
/// was installed already and is still missing, the call has had its
/// [`install::MAX_AUTO_INSTALLS`], or its deadline is too near.
fn auto_install_refusal(module: &str, package: &str, installed: &[String], time_left: bool) -> Option<String> {
    if installed.iter().any(|p| p == package) {
        Some(format!("[{module} is still missing after the host installed {package}: the import name may belong to another package; look it up rather than guessing again]"))
    } else if installed.len() >= install::MAX_AUTO_INSTALLS {
        Some(format!(
            "[{module} is missing too; the host installs at most {} missing packages in one call: install the rest by name]",
            install::MAX_AUTO_INSTALLS
        ))
    } else if !time_left {
        Some(format!("[{module} is missing; no time was left in this call to install it: install it by name]"))
    } else {
        None
    }
}

/// Install notes, one per line.
fn lines(notes: &[String]) -> String {
    notes.iter().map(|n| format!("{n}\n")).collect()
}

fn shell_job(context: &CodeContext<'_>, line: &str, timeout: Duration) -> Job {
    let python = context.settings.as_deref().and_then(|s| s.interpreters.python()).map(|p| p.path.clone());
    Job {
        purpose: Purpose::Shell,
        workspace: context.workspace.path().to_path_buf(),
        owner: context.workspace.owner(),
        skill: None,
        command: vec!["/bin/bash".into(), "-c".into(), wrap(line, python.as_deref())],
        env: Vec::new(),
        start_in: None,
        proxy: None,
        timeout,
    }
}

/// The result of the line's last run: its output, status and the notes on
/// what the sandbox caused, repeats and the shell's state; `timeout` is the
/// call's, which a killed command is said to have run into.
async fn finish(
    context: &mut CodeContext<'_>,
    command: &str,
    installed: &[String],
    finished: Finished,
    timeout: Duration,
) -> Answer {
    let root = context.workspace.path().to_path_buf();
    let cwd = match &context.shell.cwd {
        Some(relative) if !relative.is_empty() => root.join(relative),
        _ => root.clone(),
    };
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
    let mut text = format_run(format!("$ {command}\n{}", lines(installed)).trim_end(), &finished, &root, &cwd, timeout);
    let ok = match ran.exit_code {
        Some(0) => {
            text.push_str("[exit status 0]\n");
            context.shell.last_failure = None;
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
        let count = match &context.shell.last_failure {
            Some((last_command, last_output, count)) if last_command == command && *last_output == output => count + 1,
            _ => 1,
        };
        // A failure the sandbox caused is named as such, so the model does
        // not "fix" correct code; otherwise the code's own failure gets the
        // facts the next edit needs.
        match super::diagnosis::environment_note(&output, finished.network, &root) {
            Some(note) => {
                text.push_str(&note);
                text.push('\n');
            }
            None => {
                for note in code_notes(context, &output, &root, &cwd).await {
                    text.push_str(&note);
                    text.push('\n');
                }
            }
        }
        context.shell.last_failure = Some((command.to_string(), output, count));
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
    Answer { text: text.trim_end().to_string(), ok, detail: Some(command.to_string()), ..Answer::default() }
}

/// What a failure of the model's own code gets: the real public names of a
/// module it guessed a name of (read by a probe in the sandbox), and the
/// numbered lines of the workspace file it failed in.
async fn code_notes(context: &CodeContext<'_>, output: &str, root: &Path, cwd: &Path) -> Vec<String> {
    use super::recovery;
    let mut notes = Vec::new();
    if let Some(wrong) = recovery::wrong_name(output) {
        if let Some(names) = probe_names(context, &wrong.module).await {
            notes.push(recovery::did_you_mean(&wrong, &names));
        }
    }
    if let Some(location) = recovery::failing_location(output, root, cwd) {
        let path = location.path.clone();
        // Through the handle: the path came out of the command's output, so
        // a link or special file there is refused, not followed.
        let text = context
            .workspace
            .with_handle(move |dir| dir.read(&path, recovery::SNIPPET_FILE_MAX_BYTES).ok())
            .await
            .flatten()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
        if let Some(lines) = text.as_deref().and_then(|text| recovery::snippet(text, location.line)) {
            notes.push(format!(
                "[{}, around line {}:]\n{lines}Fix it with the smallest exact edit (apply_patch, with these lines as its context) rather than rewriting the file.",
                location.path, location.line
            ));
        }
    }
    notes
}

/// How long the probe that lists a module's names may run.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The public names of `module` as the workspace's Python imports it, read
/// by a probe in the sandbox; `None` when it cannot be imported there.
async fn probe_names(context: &CodeContext<'_>, module: &str) -> Option<Vec<String>> {
    let sandbox = context.sandbox?;
    let python = context.settings.as_deref()?.interpreters.python()?.path.display().to_string();
    let job = Job {
        purpose: Purpose::Probe,
        workspace: context.workspace.path().to_path_buf(),
        owner: context.workspace.owner(),
        skill: None,
        command: vec![python, "-c".into(), super::recovery::PROBE_SCRIPT.into(), module.to_string()],
        env: Vec::new(),
        start_in: None,
        proxy: None,
        timeout: PROBE_TIMEOUT,
    };
    let finished = actor::run(sandbox, job).await.ok()?;
    if finished.ran.exit_code != Some(0) {
        return None;
    }
    let names: Vec<String> = finished
        .ran
        .stdout
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// The host's installer for one workspace: what it runs, with what.
pub(super) struct Installer {
    settings: std::sync::Arc<install::InstallSettings>,
    python: Option<std::path::PathBuf>,
}

impl Installer {
    /// `None` when installs are off on this server.
    pub(super) fn new(settings: &ExecSettings) -> Option<Installer> {
        let install = settings.install.as_ref().filter(|i| i.allowed)?;
        Some(Installer {
            settings: std::sync::Arc::clone(install),
            python: settings.interpreters.python().map(|p| p.path.clone()),
        })
    }

    /// Performs one install: requirements files read through the handle
    /// and checked, then the installer run confined in the workspace.
    /// `Ok(Ok(summary))` when it installed, `Ok(Err(text))` when it did not.
    pub(super) async fn perform(
        &self,
        context: &CodeContext<'_>,
        sandbox: &ractor::ActorRef<crate::sandbox::actor::SandboxMsg>,
        mut request: install::Request,
        deadline: Instant,
    ) -> Result<Result<String, String>, ToolError> {
        for name in std::mem::take(&mut request.requirements) {
            let relative = match requirements_path(&request.cwd, &name, context.workspace.path()) {
                Some(relative) => relative,
                None => {
                    return Ok(Err(format!(
                        "[not run] The requirements file {name} is outside the working folder; the host reads only files inside it."
                    )))
                }
            };
            let shown = relative.clone();
            let read = context
                .workspace
                .with_handle(move |dir| dir.read(&relative, install::MAX_REQUIREMENTS_BYTES))
                .await
                .ok_or_else(ToolError::workspace_gone)?;
            let text = match read {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(err) => return Ok(Err(format!("[not run] {}", args::sentence(&err.to_string())))),
            };
            match install::read_requirements(&shown, &text) {
                Ok(specs) => request.specs.extend(specs),
                Err(why) => return Ok(Err(format!("[not run] {why}"))),
            }
        }
        if let Err(why) = install::check_allowed(&request, &self.settings.packages) {
            return Ok(Err(format!("[not run] {why}")));
        }
        let work = context.workspace.path();
        let program = match request.ecosystem {
            install::Ecosystem::Python => self.python.clone(),
            install::Ecosystem::Node => self.settings.npm.clone(),
        };
        let Some(program) = program else {
            return Ok(Err(format!(
                "[not run] This host has no {} for the installer to run.",
                match request.ecosystem {
                    install::Ecosystem::Python => "Python",
                    install::Ecosystem::Node => "npm",
                }
            )));
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left < Duration::from_secs(1) {
            return Ok(
                Err("[not run] No time was left in this call for the install: pass a larger timeout_ms.".into()),
            );
        }
        // A fresh folder for the installer to start in and stage into,
        // made through the handle and removed after, whatever happened.
        let stage = install::stage_name();
        let made = {
            let stage = stage.clone();
            context
                .workspace
                .with_handle(move |dir| dir.make_folder(&stage))
                .await
                .ok_or_else(ToolError::workspace_gone)?
        };
        if let Err(err) = made {
            return Ok(Err(format!(
                "[not run] The host could not prepare the install: {}",
                args::sentence(&err.to_string())
            )));
        }
        let job = Job {
            purpose: Purpose::Install,
            workspace: work.to_path_buf(),
            owner: context.workspace.owner(),
            skill: None,
            command: install::argv(&request, &self.settings, &program, work, &stage),
            env: install::environment(&self.settings, work, &stage),
            start_in: Some(stage.clone()),
            proxy: self.settings.proxy.clone(),
            timeout: left,
        };
        let finished = actor::run(sandbox, job).await;
        let ok = finished.as_ref().is_ok_and(|f| f.ran.exit_code == Some(0));
        let node = request.ecosystem == install::Ecosystem::Node;
        let placed = {
            let stage = stage.clone();
            context
                .workspace
                .with_handle(move |dir| {
                    let placed = if ok && node { place_node_modules(dir, &stage) } else { Ok(()) };
                    let _ = dir.remove_tree(&stage);
                    placed
                })
                .await
                .ok_or_else(ToolError::workspace_gone)?
        };
        let finished = finished.map_err(|not_run| ToolError::Model(not_run.sentence("command")))?;
        if let Err(err) = placed {
            return Ok(Err(format!(
                "[the host's install of {} ran, but its packages could not be put in node_modules, so nothing after it on the line ran] {}",
                request.specs.join(" "),
                args::sentence(&err.to_string())
            )));
        }
        let output = format!("{}{}", finished.ran.stdout, finished.ran.stderr);
        let output = relative_paths(&output, work, work);
        if finished.ran.exit_code == Some(0) {
            let summary = install::summary(request.ecosystem, &output);
            Ok(Ok(format!(
                "[the host ran {} install {}: {summary}]",
                request.ecosystem.tool(),
                request.specs.join(" ")
            )))
        } else if finished.ran.timed_out {
            Ok(Err(format!(
                "[the host's install of {} did not finish before the call's deadline, so nothing after it ran: pass a larger timeout_ms]",
                request.specs.join(" ")
            )))
        } else {
            Ok(Err(install::failure(request.ecosystem, &request.specs, &output)))
        }
    }
}

/// Moves what npm installed into the stage's `node_modules` into the
/// workspace's, entry by entry through the handle (scoped packages one
/// level down, and the `.bin` links), replacing an older copy of each.
fn place_node_modules(
    dir: &crate::workspace::handle::DirHandle,
    stage: &str,
) -> Result<(), crate::workspace::handle::FsError> {
    use crate::sandbox::NODE_MODULES;
    use crate::workspace::handle::Kind;
    let staged = format!("{stage}/{NODE_MODULES}");
    for (name, kind) in dir.list(&staged)? {
        // npm's record of the stage's tree, not a package.
        if name == ".package-lock.json" {
            continue;
        }
        if kind == Kind::Folder && (name == ".bin" || name.starts_with('@')) {
            for (inner, _) in dir.list(&format!("{staged}/{name}"))? {
                dir.move_replacing(&format!("{staged}/{name}/{inner}"), &format!("{NODE_MODULES}/{name}/{inner}"))?;
            }
            continue;
        }
        dir.move_replacing(&format!("{staged}/{name}"), &format!("{NODE_MODULES}/{name}"))?;
    }
    Ok(())
}

/// A requirements file's path relative to the workspace: `name` as the
/// line named it from `cwd`; an absolute path counts only inside `root`.
fn requirements_path(cwd: &str, name: &str, root: &Path) -> Option<String> {
    super::recovery::inside(name, root, &root.join(cwd))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sandbox::launch::{Launcher, SandboxMode};

    /// Settings of a host that confines commands, offline.
    pub(crate) fn settings() -> ExecSettings {
        ExecSettings::confined(Launcher::new("skillhost-sandbox".into(), "profiles".into(), None), Default::default())
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
        assert!(says(settings()).contains("Packages cannot be installed here"));
        let allowed = |packages: Vec<String>| ExecSettings {
            install: Some(std::sync::Arc::new(install::InstallSettings {
                allowed: true,
                packages,
                ..Default::default()
            })),
            ..settings()
        };
        assert!(says(allowed(Vec::new())).contains("The host itself performs `pip install NAME`"));
        assert!(says(allowed(vec!["PyYAML".into()])).contains("for these packages: PyYAML."));
        assert!(!says(missing()).contains("pip install"), "a refused shell promises nothing");
    }

    #[test]
    fn a_scripts_environment_takes_the_shells_exports_as_text() {
        let state = "declare -x A=\"1\"\ndeclare -x HOME=\"/elsewhere\"\ndeclare -x Q=\"say \\\"hi\\\" \\$X \\\\ done\"\ndeclare -x EMPTY\ndeclare -x 9BAD=\"x\"\ncd /w\n";
        assert_eq!(
            exports(state),
            [("A".to_string(), "1".to_string()), ("Q".to_string(), "say \"hi\" $X \\ done".to_string())]
        );
        let many: String = (0..MAX_PASSED_EXPORTS + 1).map(|n| format!("declare -x V{n}=\"x\"\n")).collect();
        assert_eq!(exports(&many).len(), MAX_PASSED_EXPORTS);
        let exact: String = (0..MAX_PASSED_EXPORTS).map(|n| format!("declare -x V{n}=\"x\"\n")).collect();
        assert_eq!(exports(&exact).len(), MAX_PASSED_EXPORTS);
    }

    #[test]
    fn missing_packages_are_installed_up_to_the_limit_per_call() {
        let installed = |n: usize| (0..n).map(|i| format!("p{i}")).collect::<Vec<_>>();
        let at = installed(install::MAX_AUTO_INSTALLS - 1);
        assert_eq!(auto_install_refusal("m", "new", &at, true), None, "the fifth is installed");
        let past = installed(install::MAX_AUTO_INSTALLS);
        assert!(auto_install_refusal("m", "new", &past, true).unwrap().contains("at most 5 missing packages"));
        assert!(auto_install_refusal("m", "p0", &at, true).unwrap().contains("still missing after"));
        assert!(auto_install_refusal("m", "new", &[], false).unwrap().contains("no time was left"));
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
