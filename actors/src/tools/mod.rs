//! Our tools: the closed set of tools the server answers itself, one file
//! each with its declaration, its argument reader and its answer.
//!
//! A call becomes a [`Tool`] by name (or it is not ours), and every answer
//! is either an [`Answer`] for the model or a [`ToolError`]: `Model` errors
//! are sentences the model reads as the tool result, `Fatal` errors end the
//! request. The code tools reach a workspace only through its handle (on
//! the workspace's own thread) and run processes only through the request's
//! `SandboxActor`; nothing here touches a path with `std::fs`.

pub mod agents;
pub mod allowed;
pub mod apply_patch;
pub mod args;
pub mod diagnosis;
pub mod edit_file;
pub mod install;
pub mod mcp;
pub mod read_file;
pub mod recovery;
pub mod router;
pub mod shell;
pub mod skills;
pub mod skills_list;
pub mod skills_read;
pub mod skills_run;
pub mod syntax;
pub mod workspace_actor;
pub mod write_file;

use ractor::ActorRef;
use serde_json::{Map, Value};
use skillhost_engine::ToolDef;

use crate::request::Artifact;
use crate::sandbox::actor::SandboxMsg;
use crate::workspace::{FsError, Workspace};
use skills_run::ScriptCall;

pub use crate::workspace::FILE_TOOL_MAX_BYTES;

/// Every tool the server answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    SkillsList,
    SkillsRead,
    SkillsRun,
    ReadFile,
    WriteFile,
    ApplyPatch,
    /// `edit_file` and `str_replace`: answered for models that still call
    /// them, never declared.
    EditFile,
    Shell,
    SpawnAgent,
    SendInput,
    WaitAgent,
    CloseAgent,
    ListAgents,
}

impl Tool {
    /// The tool a call names, aliases included; `None` for any other name.
    pub fn from_name(name: &str) -> Option<Tool> {
        Some(match name {
            "skills_list" => Tool::SkillsList,
            "skills_read" => Tool::SkillsRead,
            "skills_run" => Tool::SkillsRun,
            "read_file" => Tool::ReadFile,
            "write_file" => Tool::WriteFile,
            "apply_patch" => Tool::ApplyPatch,
            "edit_file" | "str_replace" => Tool::EditFile,
            "shell" => Tool::Shell,
            "spawn_agent" => Tool::SpawnAgent,
            "send_input" => Tool::SendInput,
            "wait_agent" | "wait" => Tool::WaitAgent,
            "close_agent" => Tool::CloseAgent,
            "list_agents" => Tool::ListAgents,
            _ => return None,
        })
    }

    /// The declared name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::SkillsList => "skills_list",
            Tool::SkillsRead => "skills_read",
            Tool::SkillsRun => "skills_run",
            Tool::ReadFile => "read_file",
            Tool::WriteFile => "write_file",
            Tool::ApplyPatch => "apply_patch",
            Tool::EditFile => "edit_file",
            Tool::Shell => "shell",
            Tool::SpawnAgent => "spawn_agent",
            Tool::SendInput => "send_input",
            Tool::WaitAgent => "wait_agent",
            Tool::CloseAgent => "close_agent",
            Tool::ListAgents => "list_agents",
        }
    }

    /// One of the code tools (`--code-exec`).
    pub fn is_code(self) -> bool {
        match self {
            Tool::ReadFile | Tool::WriteFile | Tool::ApplyPatch | Tool::EditFile | Tool::Shell => true,
            Tool::SkillsList | Tool::SkillsRead | Tool::SkillsRun => false,
            Tool::SpawnAgent | Tool::SendInput | Tool::WaitAgent | Tool::CloseAgent | Tool::ListAgents => false,
        }
    }

    /// One of the coordination tools (multiple agents).
    pub fn is_agent(self) -> bool {
        matches!(self, Tool::SpawnAgent | Tool::SendInput | Tool::WaitAgent | Tool::CloseAgent | Tool::ListAgents)
    }

    /// Whether an agent started by another may use it without
    /// `--agents-allow-write`: it reads and runs nothing.
    pub fn read_only(self) -> bool {
        matches!(self, Tool::SkillsList | Tool::SkillsRead | Tool::ReadFile) || self.is_agent()
    }

    /// Whether the call changes the workspace (and so may produce artifacts).
    pub fn writes(self) -> bool {
        match self {
            Tool::WriteFile | Tool::ApplyPatch | Tool::EditFile | Tool::Shell | Tool::SkillsRun => true,
            Tool::ReadFile | Tool::SkillsList | Tool::SkillsRead => false,
            Tool::SpawnAgent | Tool::SendInput | Tool::WaitAgent | Tool::CloseAgent | Tool::ListAgents => false,
        }
    }
}

/// The answer to one call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    /// What the model reads as the tool result.
    pub text: String,
    pub ok: bool,
    /// The skill the call was about, when it named one.
    pub skill: Option<String>,
    /// What the call was about (a path), for progress reports.
    pub detail: Option<String>,
    /// Files the call wrote, relative to the workspace.
    pub written: Vec<String>,
    /// Files of the workspace stored as artifacts after the call.
    pub produced: Vec<Artifact>,
}

impl Answer {
    pub fn done(text: impl Into<String>) -> Answer {
        Answer { text: text.into(), ok: true, ..Answer::default() }
    }

    pub fn failed(text: impl Into<String>) -> Answer {
        Answer { text: text.into(), ok: false, ..Answer::default() }
    }
}

/// Why a call has no [`Answer`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The call could not be done as asked. The sentence goes back to the
    /// model as the tool result and the request goes on.
    #[error("{0}")]
    Model(String),
    /// Something the request cannot go on without is gone (its workspace
    /// was deleted under it): the request ends with this message.
    #[error("{0}")]
    Fatal(String),
}

impl From<FsError> for ToolError {
    fn from(err: FsError) -> ToolError {
        ToolError::Model(args::sentence(&err.to_string()))
    }
}

impl ToolError {
    /// The workspace's thread is gone: it is being deleted.
    pub fn workspace_gone() -> ToolError {
        ToolError::Fatal("the request's working folder was closed while a tool was using it".into())
    }
}

/// What a code tool works with.
pub struct CodeContext<'a> {
    pub workspace: &'a Workspace,
    /// The shell's memory of this workspace (working folder, last failure).
    pub shell: &'a mut shell::ShellMemory,
    /// The request's sandbox actor; `None` where nothing may run.
    pub sandbox: Option<&'a ActorRef<SandboxMsg>>,
    /// How commands run there: interpreters, the installer.
    pub settings: Option<std::sync::Arc<crate::sandbox::ExecSettings>>,
}

/// A call for a workspace: a code tool with its arguments, or a skill
/// script to run there.
#[derive(Debug, Clone)]
pub enum CodeCall {
    Tool { tool: Tool, args: Map<String, Value> },
    Script(ScriptCall),
}

/// Answers one call in a workspace.
pub async fn answer_code(context: &mut CodeContext<'_>, call: CodeCall) -> Result<Answer, ToolError> {
    let (tool, args) = match call {
        CodeCall::Script(script) => return skills_run::run(context, &script).await,
        CodeCall::Tool { tool, args } => (tool, args),
    };
    let written = match tool {
        Tool::ReadFile => {
            return context
                .workspace
                .with_handle(move |dir| read_file::run(dir, &args))
                .await
                .unwrap_or_else(|| Err(ToolError::workspace_gone()))
        }
        Tool::Shell => return shell::run(context, &args).await,
        Tool::WriteFile => context.workspace.with_handle(move |dir| write_file::run(dir, &args)).await,
        Tool::ApplyPatch => context.workspace.with_handle(move |dir| apply_patch::run(dir, &args)).await,
        Tool::EditFile => context.workspace.with_handle(move |dir| edit_file::run(dir, &args)).await,
        Tool::SkillsList
        | Tool::SkillsRead
        | Tool::SkillsRun
        | Tool::SpawnAgent
        | Tool::SendInput
        | Tool::WaitAgent
        | Tool::CloseAgent
        | Tool::ListAgents => {
            return Err(ToolError::Model(format!("{} is not a tool of the working folder.", tool.name())))
        }
    };
    let mut answer = written.unwrap_or_else(|| Err(ToolError::workspace_gone()))?;
    // The files changed, so a rerun of the failing command is a new try.
    context.shell.forget_failure();
    for path in answer.written.clone() {
        if let Some(verdict) = syntax::check(context, &path).await {
            answer.text.push_str(&format!("\nSyntax check of {path}: {verdict}"));
        }
    }
    Ok(answer)
}

/// The fixed part of the prompt when the code tools are declared: it
/// depends on nothing but that, so the prompt prefix stays stable.
pub const CODE_PROMPT: &str = "## Working with files\nYou have a private working folder for this request. Create a new file with write_file. Change an existing file, even by one line, with apply_patch: read the lines first, then send the smallest patch whose context matches them exactly. Run commands with shell; the folder and exported variables carry over between commands. When a tool says a file now holds what you wrote, do not read it back.";

/// The code tools' declarations, in a fixed order; the shell's says what
/// commands get under `settings`.
pub fn code_declarations(settings: &crate::sandbox::ExecSettings) -> Vec<ToolDef> {
    vec![read_file::declaration(), write_file::declaration(), apply_patch::declaration(), shell::declaration(settings)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases_map_to_their_tool() {
        for tool in [
            Tool::SkillsList,
            Tool::SkillsRead,
            Tool::SkillsRun,
            Tool::ReadFile,
            Tool::WriteFile,
            Tool::ApplyPatch,
            Tool::EditFile,
            Tool::Shell,
            Tool::SpawnAgent,
            Tool::SendInput,
            Tool::WaitAgent,
            Tool::CloseAgent,
            Tool::ListAgents,
        ] {
            assert_eq!(Tool::from_name(tool.name()), Some(tool));
        }
        assert_eq!(Tool::from_name("str_replace"), Some(Tool::EditFile));
        assert_eq!(Tool::from_name("get_weather"), None);
        let declared: Vec<String> = code_declarations(&shell::tests::settings()).into_iter().map(|d| d.name).collect();
        assert_eq!(declared, ["read_file", "write_file", "apply_patch", "shell"]);
    }
}
