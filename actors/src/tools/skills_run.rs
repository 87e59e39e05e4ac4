//! `skills_run(skill, path, args)`: a skill's bundled script, checked here
//! (the skill is reachable, the script a regular file inside it, the
//! arguments readable) and then run in a workspace by the sandbox, with the
//! interpreter chosen by extension and no shell parsing the arguments.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use skillhost_engine::{ToolCall, ToolDef};

use std::time::Duration;

use super::shell::format_run;
use super::skills::{failed, named_skill, skill_parameter, text_arg, ToolContext};
use super::workspace_actor;
use super::{args, Answer, CodeCall, CodeContext, ToolError};
use crate::path_guard;
use crate::sandbox::actor::{self, Job, Purpose, SandboxActor};
use crate::sandbox::ExecRuntime;
use crate::skills::skill::Skill;
use ractor::Actor;

/// A skill script's deadline.
pub const SKILLS_RUN_TIMEOUT: Duration = Duration::from_secs(60);

pub fn declaration(reachable: &BTreeSet<String>) -> ToolDef {
    ToolDef {
        name: "skills_run".into(),
        description: "Run a script bundled with a skill, sandboxed, and return its output.".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "skill": skill_parameter(reachable),
                "path": {"type": "string", "description": "The script inside the skill, e.g. scripts/run.py."},
                "args": {"type": "string", "description": "Arguments for the script, as a JSON array of strings."}
            },
            "required": ["skill", "path"]
        }),
    }
}

/// Script arguments: an array, a JSON array inside a string, or one string.
pub fn script_args(args: &Map<String, Value>) -> Result<Vec<String>, String> {
    let value = args.get("args").or_else(|| args.get("arguments"));
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            Ok(items.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string)).collect())
        }
        Some(Value::String(text)) if text.trim_start().starts_with('[') => serde_json::from_str::<Vec<String>>(text)
            .map_err(|_| {
                "args looks like a JSON array but is not one of strings; send [\"--flag\", \"value\"]".to_string()
            }),
        Some(Value::String(text)) if text.is_empty() => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![text.clone()]),
        Some(other) => Ok(vec![other.to_string()]),
    }
}

/// A `skills_run` call that passed every check, ready to execute.
#[derive(Debug, Clone)]
pub struct ScriptCall {
    pub skill: Arc<Skill>,
    /// The script, relative to the skill folder.
    pub path: String,
    pub args: Vec<String>,
}

/// Checks a `skills_run` call: the skill is reachable, the script is a
/// regular file inside it, and the arguments are readable.
pub fn prepare(context: &ToolContext, call: &ToolCall) -> Result<ScriptCall, Box<Answer>> {
    let args = args::arguments(call);
    if !context.allow_exec {
        return Err(Box::new(failed(
            "skills_run is not enabled on this server; read the script with skills_read instead.",
            None,
            None,
        )));
    }
    let skill = named_skill(context, &args)?;
    let mut path = text_arg(&args, &["path", "script", "file"]).unwrap_or_default();
    if path.is_empty() {
        return Err(Box::new(failed(
            format!("Say which script to run, e.g. skills_run(skill=\"{}\", path=\"scripts/…\").", skill.id()),
            Some(skill.id()),
            None,
        )));
    }
    if let Some(inner) = path.strip_prefix(&format!("{}/", skill.id())) {
        if path_guard::open_file(&skill.root, &path).is_err() {
            path = inner.to_string();
        }
    }
    if let Err(err) = path_guard::open_file(&skill.root, &path) {
        return Err(Box::new(failed(
            format!("{}.", super::args::sentence_start(&err.to_string())),
            Some(skill.id()),
            Some(&path),
        )));
    }
    let script_args = script_args(&args).map_err(|why| failed(format!("{why}."), Some(skill.id()), Some(&path)))?;
    Ok(ScriptCall { skill: Arc::clone(skill), path, args: script_args })
}

/// The interpreter a script would get from the default table, chosen by
/// its extension and never by its first line (the running server's table
/// is `ExecSettings::interpreters`).
pub fn interpreter(script: &str) -> Option<&'static str> {
    match script.rsplit_once('.').map(|(_, ext)| ext.to_ascii_lowercase())?.as_str() {
        "py" => Some("/usr/bin/python3"),
        "js" | "mjs" => Some("/usr/bin/node"),
        "sh" | "bash" => Some("/bin/bash"),
        _ => None,
    }
}

/// Runs a skill's script in the workspace: the interpreter exec'd directly
/// (no shell parses the arguments), the skill folder read-only.
pub async fn run(context: &mut CodeContext<'_>, script: &ScriptCall) -> Result<Answer, ToolError> {
    let path = &script.path;
    // The operator's table (`--interpreter`), as found at start-up.
    let table = context.settings.as_deref().map(|s| &*s.interpreters);
    let program = match table {
        Some(table) => table.for_script(path).map(|p| p.display().to_string()),
        None => interpreter(path).map(str::to_string),
    };
    let Some(program) = program else {
        let runs = table
            .map_or_else(|| ".py (python3), .js and .mjs (node), .sh and .bash (bash)".to_string(), |t| t.describe());
        return Err(ToolError::Model(format!("'{path}' is not a script skills_run can run; it runs {runs}.")));
    };
    let Some(sandbox) = context.sandbox else {
        return Err(ToolError::Model("Scripts cannot run on this server.".into()));
    };
    let skill_root = &script.skill.root;
    let mut command = vec![program.to_string(), skill_root.join(path).display().to_string()];
    command.extend(script.args.iter().cloned());
    let root = context.workspace.path().to_path_buf();
    // In a code workspace the script sees what the shell exported, unless
    // it has a network the shell lacks (see `Purpose::Script` in the
    // sandbox actor: nothing the model set up offline runs networked).
    let networked_beyond_shell = context.settings.as_deref().is_some_and(|s| s.skills_network && !s.shell_network);
    let env = if networked_beyond_shell { Vec::new() } else { super::shell::saved_exports(context).await };
    let job = Job {
        purpose: Purpose::Script,
        workspace: root.clone(),
        owner: context.workspace.owner(),
        skill: Some(skill_root.clone()),
        command,
        env,
        start_in: None,
        proxy: None,
        timeout: SKILLS_RUN_TIMEOUT,
    };
    let finished = actor::run(sandbox, job).await.map_err(|not_run| ToolError::Model(not_run.sentence("script")))?;
    let mut header = format!("[skills_run: {path}");
    for arg in &script.args {
        header.push(' ');
        header.push_str(&quoted(arg));
    }
    header.push(']');
    let mut text = format_run(&header, &finished, &root, &root, SKILLS_RUN_TIMEOUT);
    let ok = finished.ran.exit_code == Some(0);
    if let Some(code) = finished.ran.exit_code {
        text.push_str(&format!("[exit status {code}]\n"));
    }
    // A failure the sandbox caused is named, as for the shell.
    let output = format!("{}{}", finished.ran.stdout, finished.ran.stderr);
    if let Some(note) = super::diagnosis::environment_note(&output, finished.network, &root).filter(|_| !ok) {
        text.push_str(&note);
        text.push('\n');
    }
    if let Some(gaps) = &finished.gaps {
        text.push_str(gaps);
        text.push('\n');
    }
    Ok(Answer {
        text: text.trim_end().to_string(),
        ok,
        skill: Some(script.skill.id().to_string()),
        detail: Some(path.clone()),
        ..Answer::default()
    })
}

/// Runs one `skills_run` call for a caller outside any request (an MCP
/// client of `POST /mcp`): checked as the model's call is, then run in a
/// scratch folder and by a sandbox actor of its own, both gone when this
/// returns. `context` must allow scripts.
pub async fn run_detached(exec: &ExecRuntime, context: &ToolContext, call: &ToolCall) -> Answer {
    let script = match prepare(context, call) {
        Ok(script) => script,
        Err(refusal) => return *refusal,
    };
    let skill = script.skill.id().to_string();
    let not_run = |why: String| failed(format!("The script did not run: {why}."), Some(&skill), Some(&script.path));
    let workspace = match workspace_actor::scratch(exec, None).await {
        Ok(workspace) => workspace,
        Err(why) => return not_run(why),
    };
    let sandbox = match Actor::spawn(None, SandboxActor, Arc::clone(&exec.settings)).await {
        Ok((sandbox, _)) => sandbox,
        Err(_) => {
            let _ = workspace.stop_and_wait(None, Some(workspace_actor::STOP_TIMEOUT)).await;
            return not_run("the sandbox did not start".into());
        }
    };
    let result = workspace_actor::call(&workspace, CodeCall::Script(script.clone()), Some(sandbox.clone()), None).await;
    // The sandbox first, so nothing still runs in the folder being deleted.
    let _ = sandbox.stop_and_wait(None, Some(workspace_actor::STOP_TIMEOUT)).await;
    let _ = workspace.stop_and_wait(None, Some(workspace_actor::STOP_TIMEOUT)).await;
    match result {
        Ok(answer) => answer,
        Err(ToolError::Model(text) | ToolError::Fatal(text)) => not_run(text.trim_end_matches('.').to_string()),
    }
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
