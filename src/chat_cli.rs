//! `skillhost chat`: the agent loop in this process, in a terminal.
//!
//! The same server `serve` starts (one flag set, one config loader, one
//! loop), driven without HTTP. The answer streams to stdout and nothing
//! else goes there; skill and tool steps, the loading indicator and errors
//! go to stderr, one line each. Ctrl-C stops the answer being written and
//! keeps the conversation. With a prompt or `--input` it runs one turn, so
//! it composes in shell pipelines; otherwise it is a conversation with
//! `/`-commands, and its workspace (with `--code-exec`) lives until it exits.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use skillhost_actors::request::{AgentPhase, Surface, ToolPhase};
use skillhost_actors::{ChatEvent, ChatFinish, ChatRequest, ModelStatus, Server};
use skillhost_engine::{ChatMessage, Role};
use tokio::sync::mpsc;

use crate::config::ServeConfig;

/// The most a `--input` file or stdin may hold: a message, not a corpus.
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;
/// Silence after which stderr shows what the model is doing.
const INDICATOR_AFTER: Duration = Duration::from_millis(800);
/// How often the indicator's seconds move.
const INDICATOR_TICK: Duration = Duration::from_millis(250);
/// How long leaving waits for a conversation's workspace to go.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// The one caller of the chat CLI's conversations.
const CLI_CALLER: &str = "cli";
/// Exit status of a turn stopped with Ctrl-C (128 + SIGINT, as shells say).
const INTERRUPTED: u8 = 130;

/// What the command line says about the conversation itself.
pub struct Options {
    pub system: Option<String>,
    pub interactive: bool,
    pub input: Option<PathBuf>,
    pub prompt: String,
}

/// Runs the command; the exit status says how it went.
#[allow(clippy::print_stderr)]
pub fn run(config: ServeConfig, options: Options) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(chat(config, options))
}

/// The one message of a one-shot run, when there is one.
fn one_shot_message(options: &Options) -> Result<Option<String>, String> {
    let text = match &options.input {
        Some(path) if path.as_os_str() == "-" => read_bounded(std::io::stdin().lock(), "stdin")?,
        Some(path) => {
            let file = std::fs::File::open(path).map_err(|err| format!("--input {}: {err}", path.display()))?;
            read_bounded(file, &path.display().to_string())?
        }
        None if !options.prompt.trim().is_empty() => options.prompt.clone(),
        None => return Ok(None),
    };
    if text.trim().is_empty() {
        return Err("the message is empty".into());
    }
    Ok(Some(text))
}

fn read_bounded(reader: impl Read, what: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_INPUT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("cannot read {what}: {err}"))?;
    if bytes.len() > MAX_INPUT_BYTES {
        return Err(format!("{what} holds more than {MAX_INPUT_BYTES} bytes; a message must be smaller"));
    }
    String::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8 text"))
}

#[allow(clippy::print_stderr)]
async fn chat(mut config: ServeConfig, options: Options) -> ExitCode {
    let message = match one_shot_message(&options) {
        Ok(message) => message,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    // The session owns its selection (`/skill` changes it), so the server
    // applies none of its own.
    let selected = config.skills.as_mut().map(|s| std::mem::take(&mut s.selected)).unwrap_or_default();
    let (server, _own_folders) = match crate::setup::start_server(&config).await {
        Ok(started) => started,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut terminal = Terminal::new();
    let mut session = Session::new(server.clone(), options.system.clone(), selected);
    let code = 'run: {
        if let Err(err) = session.check_selection() {
            eprintln!("error: {err}");
            break 'run ExitCode::from(2);
        }
        if let Err(err) = wait_for_model(&server, &config, &mut terminal).await {
            terminal.error(&err);
            break 'run ExitCode::FAILURE;
        }
        let interrupts = interrupts();
        let interactive = options.interactive || (message.is_none() && std::io::stdin().is_terminal());
        match (message, interactive) {
            (Some(text), false) => one_shot(&mut session, &mut terminal, interrupts, text).await,
            (first, _) => repl(&mut session, &mut terminal, interrupts, first).await,
        }
    };
    session.close().await;
    server.shutdown();
    code
}

/// Ctrl-C, as a stream of events: while it is listened for, it stops the
/// turn instead of the process.
fn interrupts() -> mpsc::UnboundedReceiver<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for the model, with a line on stderr that counts the seconds.
async fn wait_for_model(server: &Server, config: &ServeConfig, terminal: &mut Terminal) -> Result<(), String> {
    let started = Instant::now();
    let what = match &config.remote {
        Some(_) => "connecting to the upstreams".to_string(),
        None => format!(
            "loading {}",
            config.engine.model_path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ),
    };
    let mut tick = tokio::time::interval(INDICATOR_TICK);
    let waiting = server.wait_until_loaded();
    tokio::pin!(waiting);
    let status = loop {
        tokio::select! {
            status = &mut waiting => break status,
            _ = tick.tick() => terminal.indicator(&what, started),
        }
    };
    terminal.clear_indicator();
    match status {
        ModelStatus::Ready { .. } => Ok(()),
        ModelStatus::Failed(reason) => Err(format!("the model did not load: {reason}")),
        ModelStatus::Loading | ModelStatus::Unloaded => Err("the model is still loading".into()),
    }
}

/// One turn, only the answer on stdout.
async fn one_shot(
    session: &mut Session,
    terminal: &mut Terminal,
    mut interrupts: mpsc::UnboundedReceiver<()>,
    text: String,
) -> ExitCode {
    match session.turn(terminal, &mut interrupts, text).await {
        TurnEnd::Answered => ExitCode::SUCCESS,
        TurnEnd::Interrupted => ExitCode::from(INTERRUPTED),
        TurnEnd::Failed => ExitCode::FAILURE,
    }
}

/// The conversation: lines from stdin, turns and `/`-commands.
async fn repl(
    session: &mut Session,
    terminal: &mut Terminal,
    mut interrupts: mpsc::UnboundedReceiver<()>,
    first: Option<String>,
) -> ExitCode {
    terminal.note("Type a message, or /skills, /skill NAME, /system TEXT, /reset, /exit. Ctrl-C stops an answer.");
    let mut lines = stdin_lines();
    if let Some(text) = first {
        session.turn(terminal, &mut interrupts, text).await;
    }
    loop {
        terminal.prompt();
        let line = tokio::select! {
            line = lines.recv() => line,
            Some(()) = interrupts.recv() => {
                terminal.note("(Ctrl-C stops an answer; /exit or Ctrl-D leaves)");
                continue;
            }
        };
        let Some(line) = line else {
            // Ctrl-D: the end of input.
            terminal.end_prompt();
            return ExitCode::SUCCESS;
        };
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        match line.trim().strip_prefix('/') {
            Some(command) => {
                if session.command(terminal, command).await == Flow::Exit {
                    return ExitCode::SUCCESS;
                }
            }
            None => {
                session.turn(terminal, &mut interrupts, line.to_string()).await;
            }
        }
    }
}

/// Lines from stdin, read on a thread of their own (a terminal read does
/// not end for a signal); the channel closes at the end of input.
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut handle = stdin.lock();
        loop {
            let mut line = String::new();
            match handle.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

#[derive(Debug, PartialEq, Eq)]
enum TurnEnd {
    Answered,
    Interrupted,
    Failed,
}

/// The conversation as the loop is sent it, turn after turn.
struct Session {
    server: Server,
    system: Option<String>,
    selected: Vec<String>,
    messages: Vec<ChatMessage>,
    /// Keeps the workspace (with `--code-exec`) from turn to turn.
    conversation: String,
}

impl Session {
    fn new(server: Server, system: Option<String>, selected: Vec<String>) -> Session {
        let conversation = server.conversations().resume_or_start(None, CLI_CALLER);
        Session { server, system, selected, messages: Vec::new(), conversation }
    }

    /// `--skill` names only registered skills.
    fn check_selection(&self) -> Result<(), String> {
        if self.selected.is_empty() {
            return Ok(());
        }
        let Some(skills) = self.server.skills() else {
            return Err("--skill selects a skill, but skills are off (--no-skills)".into());
        };
        let snapshot = skills.snapshot();
        let unknown: Vec<&str> =
            self.selected.iter().map(String::as_str).filter(|id| snapshot.get(id).is_none()).collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let ids = snapshot.ids();
        let available = if ids.is_empty() { "none are registered".to_string() } else { ids.join(", ") };
        Err(format!("--skill {}: no such skill is registered; available: {available}", unknown.join(", ")))
    }

    /// A fresh conversation: the skills block and the system text lead the
    /// prompt, so changing either starts over, and so does `/reset`.
    async fn reset(&mut self) {
        self.messages.clear();
        self.server.conversations().close_and_wait(&self.conversation, CLOSE_WAIT).await;
        self.conversation = self.server.conversations().resume_or_start(None, CLI_CALLER);
    }

    async fn close(&mut self) {
        self.server.conversations().close_and_wait(&self.conversation, CLOSE_WAIT).await;
    }

    fn request(&self) -> ChatRequest {
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = self.system.as_ref().filter(|s| !s.trim().is_empty()) {
            messages.push(ChatMessage::new(Role::System, system.clone()));
        }
        messages.extend(self.messages.iter().cloned());
        ChatRequest {
            messages,
            skills: self.selected.clone(),
            parallel_tool_calls: true,
            conversation: Some(self.conversation.clone()),
            surface: Surface::Cli,
            ..ChatRequest::default()
        }
    }

    /// Runs one turn: the answer to stdout as it comes, steps to stderr.
    async fn turn(
        &mut self,
        terminal: &mut Terminal,
        interrupts: &mut mpsc::UnboundedReceiver<()>,
        text: String,
    ) -> TurnEnd {
        // Ctrl-C pressed while no turn ran is not meant for this one.
        while interrupts.try_recv().is_ok() {}
        self.messages.push(ChatMessage::new(Role::User, text));
        let mut chat = match self.server.chat(self.request()).await {
            Ok(chat) => chat,
            Err(err) => {
                self.messages.pop();
                terminal.error(&err.to_string());
                return TurnEnd::Failed;
            }
        };
        let mut answer = String::new();
        let mut tick = tokio::time::interval(INDICATOR_TICK);
        let mut quiet_since = Instant::now();
        let mut doing = "reading the prompt";
        let end = loop {
            let event = tokio::select! {
                event = chat.events.recv() => event,
                Some(()) = interrupts.recv() => break TurnEnd::Interrupted,
                _ = tick.tick() => {
                    if quiet_since.elapsed() >= INDICATOR_AFTER {
                        terminal.indicator(doing, quiet_since);
                    }
                    continue;
                }
            };
            let Some(event) = event else {
                terminal.error("the turn ended without an answer");
                break TurnEnd::Failed;
            };
            quiet_since = Instant::now();
            match event {
                ChatEvent::Accepted | ChatEvent::ServerTurns { .. } => {}
                ChatEvent::Content(delta) => {
                    terminal.content(&delta);
                    answer.push_str(&delta);
                    doing = "writing";
                }
                ChatEvent::Reasoning(_) => doing = "thinking",
                ChatEvent::SkillStep(step) => {
                    let mut line = format!("{} {}", step.tool, step.skill.unwrap_or_default());
                    if let Some(detail) = step.detail {
                        line.push(' ');
                        line.push_str(&detail);
                    }
                    if !step.ok {
                        line.push_str(" (refused)");
                    }
                    terminal.step(&step.agent_id, line.trim_end());
                    doing = "reading the result";
                }
                ChatEvent::ToolProgress(progress) => {
                    let line = match progress.phase {
                        ToolPhase::Writing => Some(format!("{} {}", progress.tool, progress.detail)),
                        ToolPhase::Running => Some(format!("{}: {}", progress.tool, progress.detail)),
                        ToolPhase::Finished if !progress.files.is_empty() => Some(format!(
                            "produced {}",
                            progress
                                .files
                                .iter()
                                .map(|f| format!("{} ({} bytes)", f.path, f.bytes))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                        ToolPhase::Finished => None,
                    };
                    if let Some(line) = line {
                        terminal.step(&progress.agent_id, &line);
                    }
                    doing = if progress.phase == ToolPhase::Running { "running" } else { "reading the result" };
                }
                ChatEvent::Agent(update) => {
                    let phase = match update.phase {
                        AgentPhase::Spawned => "started",
                        AgentPhase::Working => "working",
                        AgentPhase::Reported => "reported",
                        AgentPhase::Failed => "failed",
                        AgentPhase::Closed => "closed",
                    };
                    terminal.step(&update.agent_id, &format!("{phase}: {}", update.detail));
                }
                ChatEvent::ToolCalls(calls) => {
                    // No caller tools are declared here; a call that still
                    // comes back is the model's mistake, shown as such.
                    let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
                    terminal.note(&format!("(the model called tools this chat does not have: {})", names.join(", ")));
                }
                ChatEvent::Finished { finish, .. } => {
                    if finish == ChatFinish::Length {
                        terminal.note("(the answer stopped at the token budget)");
                    }
                    break TurnEnd::Answered;
                }
                ChatEvent::Failed(err) => {
                    terminal.error(&err.to_string());
                    break TurnEnd::Failed;
                }
            }
        };
        // Dropping the stream stops the loop (and its command) at once.
        drop(chat);
        terminal.end_answer();
        match end {
            TurnEnd::Failed if answer.is_empty() => {
                self.messages.pop();
            }
            _ => {
                if end == TurnEnd::Interrupted {
                    terminal.note("[stopped]");
                }
                self.messages.push(ChatMessage::new(Role::Assistant, answer));
            }
        }
        end
    }

    /// A `/`-command.
    async fn command(&mut self, terminal: &mut Terminal, command: &str) -> Flow {
        let (name, rest) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
        let rest = rest.trim();
        match name {
            "exit" | "quit" => return Flow::Exit,
            "reset" => {
                self.reset().await;
                terminal.note("(a new conversation)");
            }
            "system" => {
                self.system = (!rest.is_empty()).then(|| rest.to_string());
                self.reset().await;
                terminal.note(if rest.is_empty() {
                    "(no system message; a new conversation)"
                } else {
                    "(system message set; a new conversation)"
                });
            }
            "skills" => terminal.out(&self.skills_listing()),
            "skill" => match self.toggle(rest) {
                Ok(note) => {
                    self.reset().await;
                    terminal.note(&format!("({note}; a new conversation)"));
                }
                Err(err) => terminal.note(&err),
            },
            "help" => terminal.out(
                "/skills          list the skills, [x] for those selected\n/skill NAME      select a skill, or unselect it (starts a new conversation)\n/system TEXT     set the system message (starts a new conversation)\n/reset           start a new conversation\n/exit            leave (also Ctrl-D)\n",
            ),
            _ => terminal.note(&format!(
                "unknown command /{name}; the commands are /skills, /skill NAME, /system TEXT, /reset, /exit and /help"
            )),
        }
        Flow::Continue
    }

    fn skills_listing(&self) -> String {
        let Some(skills) = self.server.skills() else {
            return "Skills are off (--no-skills).\n".into();
        };
        let snapshot = skills.snapshot();
        if snapshot.skills.is_empty() {
            return "No skills are registered.\n".into();
        }
        let mut out = String::new();
        for skill in snapshot.skills.values() {
            let manifest = &skill.manifest;
            let mark = if self.selected.iter().any(|id| id == skill.id()) { "[x]" } else { "[ ]" };
            let notes = manifest.governance_notes();
            let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
            let description: String = manifest.description.chars().take(100).collect();
            out.push_str(&format!("{mark} {}{notes}: {description}\n", skill.id()));
        }
        out
    }

    /// `/skill NAME`: selects a skill, or unselects one that is selected.
    fn toggle(&mut self, name: &str) -> Result<String, String> {
        if name.is_empty() {
            return Err("say which skill: /skill NAME (/skills lists them)".into());
        }
        let skills = self.server.skills().ok_or("skills are off (--no-skills)")?;
        let snapshot = skills.snapshot();
        let Some(skill) = snapshot.get(name) else {
            let ids = snapshot.ids();
            return Err(format!("no skill called '{name}'; the skills are: {}", ids.join(", ")));
        };
        if let Some(at) = self.selected.iter().position(|id| id == name) {
            self.selected.remove(at);
            return Ok(format!("'{name}' unselected"));
        }
        if !skill.manifest.user_invocable {
            return Err(format!("'{name}' is not offered for selection (its SKILL.md says user-invocable: false)"));
        }
        self.selected.push(name.to_string());
        self.selected.sort();
        Ok(format!("'{name}' selected"))
    }
}

/// The terminal: the answer on stdout, everything else on stderr, and the
/// indicator only where stderr is a terminal.
struct Terminal {
    stdout_tty: bool,
    stderr_tty: bool,
    /// The answer on stdout does not end with a newline.
    mid_line: bool,
    /// The indicator is on stderr's current line.
    indicating: bool,
    /// A prompt (`> `) is on stderr's current line.
    prompting: bool,
}

impl Terminal {
    fn new() -> Terminal {
        Terminal {
            stdout_tty: std::io::stdout().is_terminal(),
            stderr_tty: std::io::stderr().is_terminal(),
            mid_line: false,
            indicating: false,
            prompting: false,
        }
    }

    fn clear_indicator(&mut self) {
        if self.indicating {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.indicating = false;
        }
    }

    /// A line on stderr starts on a line of its own.
    fn fresh_line(&mut self) {
        self.clear_indicator();
        if self.mid_line && self.stdout_tty && self.stderr_tty {
            let mut stdout = std::io::stdout();
            let _ = writeln!(stdout);
            let _ = stdout.flush();
            self.mid_line = false;
        }
    }

    fn indicator(&mut self, what: &str, since: Instant) {
        if !self.stderr_tty {
            return;
        }
        if self.mid_line && self.stdout_tty {
            // The answer's line is the indicator's too; it waits.
            return;
        }
        let what = crate::terminal::printable(what);
        let _ = write!(std::io::stderr(), "\r\x1b[2K… {what} ({}s)", since.elapsed().as_secs());
        let _ = std::io::stderr().flush();
        self.indicating = true;
    }

    /// `text` as it may be sent to stdout (`tty`: whether stdout is a
    /// terminal, where model output must not carry control sequences).
    fn shown(text: &str, tty: bool) -> std::borrow::Cow<'_, str> {
        match tty {
            true => crate::terminal::printable(text),
            false => std::borrow::Cow::Borrowed(text),
        }
    }

    fn content(&mut self, text: &str) {
        self.clear_indicator();
        let mut stdout = std::io::stdout();
        let _ = stdout.write_all(Self::shown(text, self.stdout_tty).as_bytes());
        let _ = stdout.flush();
        if !text.is_empty() {
            self.mid_line = !text.ends_with('\n');
        }
    }

    fn end_answer(&mut self) {
        self.clear_indicator();
        if self.mid_line {
            let mut stdout = std::io::stdout();
            let _ = writeln!(stdout);
            let _ = stdout.flush();
            self.mid_line = false;
        }
    }

    /// A step, as the Web UI's activity line shows it.
    fn step(&mut self, agent: &str, line: &str) {
        self.fresh_line();
        let who = if agent == skillhost_actors::request::ROOT_AGENT { String::new() } else { format!("{agent} ") };
        let _ = writeln!(std::io::stderr(), "· {who}{}", Self::shown(line, self.stderr_tty));
    }

    fn note(&mut self, text: &str) {
        self.fresh_line();
        let _ = writeln!(std::io::stderr(), "{}", Self::shown(text, self.stderr_tty));
    }

    fn error(&mut self, text: &str) {
        self.fresh_line();
        let _ = writeln!(std::io::stderr(), "error: {}", Self::shown(text, self.stderr_tty));
    }

    /// REPL output the user asked for (a listing): stdout, like an answer.
    fn out(&mut self, text: &str) {
        self.fresh_line();
        let mut stdout = std::io::stdout();
        let _ = stdout.write_all(Self::shown(text, self.stdout_tty).as_bytes());
        let _ = stdout.flush();
    }

    fn prompt(&mut self) {
        self.clear_indicator();
        let _ = write!(std::io::stderr(), "> ");
        let _ = std::io::stderr().flush();
        self.prompting = true;
    }

    fn end_prompt(&mut self) {
        if self.prompting {
            let _ = writeln!(std::io::stderr());
            self.prompting = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_is_bounded_at_its_limit() {
        let at = "a".repeat(MAX_INPUT_BYTES);
        assert_eq!(read_bounded(at.as_bytes(), "x").map(|t| t.len()), Ok(MAX_INPUT_BYTES));
        let over = "a".repeat(MAX_INPUT_BYTES + 1);
        assert_eq!(
            read_bounded(over.as_bytes(), "x"),
            Err(format!("x holds more than {MAX_INPUT_BYTES} bytes; a message must be smaller"))
        );
        assert_eq!(read_bounded(&[0xff, 0xfe][..], "x"), Err("x is not UTF-8 text".into()));
    }

    #[test]
    fn an_empty_message_is_refused() {
        let options = Options { system: None, interactive: false, input: None, prompt: "   ".into() };
        assert_eq!(one_shot_message(&options), Ok(None));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.txt");
        std::fs::write(&path, "\n").unwrap();
        let options = Options { system: None, interactive: false, input: Some(path), prompt: String::new() };
        assert_eq!(one_shot_message(&options), Err("the message is empty".into()));
    }
}
