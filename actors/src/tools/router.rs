//! The tool router: the one place that decides where a call of ours goes
//! (a skill tool, a code tool through the workspace actor, a script, or
//! the coordination desk) and what a call that cannot run is told: a
//! repeat, a call past the round's cap, one a loaded skill does not allow,
//! or a tool that is not there. The loop hands it a round's calls and gets
//! the answers back; it runs as a task of its own, so the loop's mailbox
//! stays open while a command runs.

use std::sync::Arc;

use ractor::{ActorCell, ActorRef};
use serde_json::{Map, Value};
use skillhost_engine::ToolCall;
use tokio::sync::mpsc;

use crate::request::{ChatError, ChatEvent, SkillStep, Surface, ToolPhase, ToolProgress};
use crate::sandbox::actor::SandboxMsg;
use crate::sandbox::ExecRuntime;
use crate::skills::outcomes::{SkillEvent, SkillOutcomes};
use crate::tools::agents::AgentDesk;
use crate::tools::allowed::Allowed;
use crate::tools::skills::{self as skill_tools, ToolContext};
use crate::tools::workspace_actor::{self as workspace_actor, ArtifactsFor, WorkspaceMsg};
use crate::tools::{self, Answer, CodeCall, Tool, ToolError};

/// Skill tool calls answered per round; a model emitting more is
/// malfunctioning, and answering them all would fill the context.
pub const MAX_SKILL_CALLS_PER_ROUND: usize = 8;

/// A call answered in an earlier round, which an identical later call
/// points back to instead of running again (until something is written).
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    name: String,
    arguments: Map<String, Value>,
    round: u32,
}

/// Everything answering one round's calls needs, owned, for its task.
pub struct ToolRunner {
    pub events: mpsc::UnboundedSender<ChatEvent>,
    /// Names of every tool offered this request.
    pub offered: Vec<String>,
    pub code_tools: bool,
    /// What `read_file` reads when there is no working folder.
    pub attachments: Arc<Vec<crate::attachments::Attachment>>,
    pub skill_tools: Option<ToolContext>,
    pub workspace: Option<ActorRef<WorkspaceMsg>>,
    pub sandbox: Option<ActorRef<SandboxMsg>>,
    pub artifacts: Option<ArtifactsFor>,
    pub exec: Option<Arc<ExecRuntime>>,
    /// The loop, which scratch folders are linked to.
    pub parent: ActorCell,
    pub round: u32,
    pub run_id: String,
    /// The loop, which answers the coordination calls; `None` when
    /// delegation is off.
    pub agents: Option<AgentDesk>,
    pub agent_id: String,
    /// For a child agent: the tools its parent gave it.
    pub given: Option<Vec<String>>,
    /// Children may write and run (`--agents-allow-write`).
    pub allow_write: bool,
    /// The server's per-skill counts, and the surface they are counted under.
    pub outcomes: Arc<SkillOutcomes>,
    pub surface: Surface,
    /// The MCP tools offered this turn.
    pub mcp: Option<crate::tools::mcp::TurnMcp>,
}

impl ToolRunner {
    fn emit(&self, event: ChatEvent) {
        let _ = self.events.send(event);
    }

    fn progress(&self, phase: ToolPhase, tool: &str, detail: &str, files: Vec<crate::request::Artifact>) {
        let detail: String = detail.chars().take(120).collect();
        self.emit(ChatEvent::ToolProgress(ToolProgress {
            agent_id: self.agent_id.clone(),
            phase,
            tool: tool.to_string(),
            detail,
            run_id: self.run_id.clone(),
            files,
            round: self.round,
        }));
    }

    /// Answers our calls in order, at most [`MAX_SKILL_CALLS_PER_ROUND`],
    /// and reports each one. A call repeated word for word is answered once.
    /// A call outside what a loaded skill allows is refused (`allowed`
    /// takes in a skill loaded by an earlier call of the round). Returns
    /// the answers and the skills the calls read or ran.
    pub async fn answer_all(
        &self,
        calls: &[ToolCall],
        answered: &mut Vec<Answered>,
        allowed: &mut Allowed,
    ) -> Result<(Vec<String>, Vec<String>), ChatError> {
        let mut texts = Vec::with_capacity(calls.len());
        let mut uses = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let arguments = tools::args::arguments(call);
            let earlier_round = answered
                .iter()
                .find(|a| a.name == call.name && a.arguments == arguments && a.round < self.round)
                .map(|a| a.round);
            // Small models often repeat a call word for word in one turn.
            // Running it again would repeat a side effect, and repeating a
            // file read can overflow the context on its own.
            let repeat_of = calls[..index]
                .iter()
                .position(|earlier| earlier.name == call.name && same_arguments(&earlier.arguments, &call.arguments));
            let tool = Tool::from_name(&call.name);
            let answer = if index >= MAX_SKILL_CALLS_PER_ROUND {
                Answer::failed(format!(
                    "Not run: only {MAX_SKILL_CALLS_PER_ROUND} tool calls are answered per round. Ask again in your next turn if you still need it."
                ))
            } else if let Some(earlier) = repeat_of {
                Answer::done(format!(
                    "Not run again: this call is identical to call {} of this turn; its result above applies.",
                    earlier + 1
                ))
            } else if let Some(refusal) = allowed.refusal(&call.name, &call.arguments) {
                Answer::failed(refusal)
            } else if let Some(round) = earlier_round {
                Answer::done(format!(
                    "Not run again: this call is identical to one already answered in round {round}, and nothing has changed since; its result above applies. Answer with what you have, or make a different call."
                ))
            } else {
                // An MCP call the loaded skills named counts for them.
                if tool.is_none() && self.mcp.as_ref().is_some_and(|mcp| mcp.tools.contains_key(&call.name)) {
                    self.outcomes.event(allowed.naming(&call.name), self.surface, SkillEvent::McpCall);
                }
                match self.answer(tool, call).await {
                    Ok(answer) => answer,
                    Err(ToolError::Model(text)) => Answer::failed(text),
                    Err(ToolError::Fatal(message)) => return Err(ChatError::Engine(message)),
                }
            };
            // A call that may have changed something (a write, a command)
            // makes every earlier answer stale; a read is remembered.
            if tool.is_none_or(|tool| tool.writes() || tool.is_agent()) {
                answered.clear();
            } else if index < MAX_SKILL_CALLS_PER_ROUND && repeat_of.is_none() && earlier_round.is_none() {
                answered.push(Answered { name: call.name.clone(), arguments, round: self.round });
            }
            tracing::info!(tool = ?call.name, skill = ?answer.skill, detail = ?answer.detail, ok = answer.ok, round = self.round, "tool answered");
            if let (Some(skill), Some(Tool::SkillsRead | Tool::SkillsRun)) = (answer.skill.clone(), tool) {
                let loaded =
                    tool == Some(Tool::SkillsRead) && answer.ok && answer.detail.as_deref() == Some("SKILL.md");
                let ran = tool == Some(Tool::SkillsRun) && answer.detail.is_some();
                if loaded || ran {
                    let event = if loaded { SkillEvent::Read } else { SkillEvent::Run };
                    self.outcomes.event([&skill], self.surface, event);
                    if loaded {
                        allowed.load_from(self.skill_tools.as_ref().map(|c| c.snapshot.as_ref()), &skill);
                    }
                    uses.push(skill);
                }
            }
            let is_skill_tool = matches!(tool, Some(Tool::SkillsList | Tool::SkillsRead | Tool::SkillsRun));
            if is_skill_tool && repeat_of.is_none() && index < MAX_SKILL_CALLS_PER_ROUND {
                self.emit(ChatEvent::SkillStep(SkillStep {
                    agent_id: self.agent_id.clone(),
                    tool: call.name.clone(),
                    skill: answer.skill.clone(),
                    detail: answer.detail.clone(),
                    ok: answer.ok,
                    round: self.round,
                }));
            }
            texts.push(answer.text);
        }
        Ok((texts, uses))
    }

    /// Answers one call to a tool of ours.
    async fn answer(&self, tool: Option<Tool>, call: &ToolCall) -> Result<Answer, ToolError> {
        let no_such_tool = || {
            ToolError::Model(format!(
                "There is no tool called '{}'. The tools you have are: {}.",
                call.name,
                self.offered.join(", ")
            ))
        };
        let Some(tool) = tool else {
            return match &self.mcp {
                Some(mcp) if mcp.tools.contains_key(&call.name) || call.name == tools::mcp::READ_RESOURCE => {
                    self.call_mcp(mcp, call).await
                }
                _ => Err(no_such_tool()),
            };
        };
        if let Some(given) = self.given.as_ref().filter(|_| !tool.is_agent()) {
            if !given.iter().any(|name| name == tool.name()) {
                return Err(ToolError::Model(if tool.read_only() || self.allow_write {
                    format!("{} was not given to you. The tools you have are: {}.", call.name, self.offered.join(", "))
                } else {
                    format!(
                        "{} is not open to you: an agent started by another agent only reads here (skills_list, skills_read, read_file). Say in your report what should change, and the agent that started you can do it.",
                        call.name
                    )
                }));
            }
        }
        match tool {
            Tool::SpawnAgent | Tool::SendInput | Tool::WaitAgent | Tool::CloseAgent | Tool::ListAgents => {
                let Some(desk) = &self.agents else { return Err(no_such_tool()) };
                desk.call(tool, &self.agent_id, call).await
            }
            Tool::ReadFile if !self.code_tools && !self.attachments.is_empty() => {
                tools::read_file::run_attachments(&self.attachments, &tools::args::arguments(call))
            }
            Tool::ReadFile | Tool::WriteFile | Tool::ApplyPatch | Tool::EditFile | Tool::Shell => {
                let Some(workspace) = self.workspace.as_ref().filter(|_| self.code_tools) else {
                    return Err(no_such_tool());
                };
                let args = tools::args::arguments(call);
                let detail = match tool {
                    Tool::Shell => tools::args::text(&args, &["command", "cmd"]).unwrap_or_default(),
                    _ => tools::args::path(&args).unwrap_or_default(),
                };
                match tool {
                    Tool::ReadFile => {}
                    Tool::Shell => self.progress(ToolPhase::Running, &call.name, &detail, Vec::new()),
                    _ => self.progress(ToolPhase::Writing, &call.name, &detail, Vec::new()),
                }
                let result = workspace_actor::call(
                    workspace,
                    CodeCall::Tool { tool, args },
                    self.sandbox.clone(),
                    self.artifacts.clone(),
                )
                .await;
                if tool != Tool::ReadFile {
                    let produced = result.as_ref().map(|a| a.produced.clone()).unwrap_or_default();
                    self.progress(ToolPhase::Finished, &call.name, "", produced);
                }
                result
            }
            Tool::SkillsRun => self.run_script(call).await,
            Tool::SkillsList | Tool::SkillsRead => {
                let Some(context) = self.skill_tools.clone() else { return Err(no_such_tool()) };
                let call = call.clone();
                tokio::task::spawn_blocking(move || skill_tools::answer(&context, tool, &call))
                    .await
                    .map_err(|_| ToolError::Model("The tool failed unexpectedly.".into()))
            }
        }
    }

    /// A call to an MCP server's tool, or `mcp_read_resource`: reported
    /// as tool progress, answered by the hub (a server's failure is the
    /// model's sentence).
    async fn call_mcp(&self, mcp: &tools::mcp::TurnMcp, call: &ToolCall) -> Result<Answer, ToolError> {
        let arguments = tools::mcp::call_arguments(&call.arguments).map_err(ToolError::Model)?;
        if call.name == tools::mcp::READ_RESOURCE {
            let text = |key: &str| arguments.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
            let (server, uri) = (text("server"), text("uri"));
            if !mcp.resource_servers.contains(&server) {
                return Err(ToolError::Model(format!("server must be one of: {}.", mcp.resource_servers.join(", "))));
            }
            if uri.is_empty() {
                return Err(ToolError::Model("uri is missing: name the resource to read.".into()));
            }
            self.progress(ToolPhase::Running, &call.name, &uri, Vec::new());
            let answer = mcp.hub.read_resource(&server, &uri, None).await;
            self.progress(ToolPhase::Finished, &call.name, &uri, Vec::new());
            return Ok(Answer { detail: Some(uri), ..answer });
        }
        let Some((server, tool)) = mcp.tools.get(&call.name) else {
            return Err(ToolError::Model(format!("There is no tool called '{}'.", call.name)));
        };
        self.progress(ToolPhase::Running, &call.name, server, Vec::new());
        let answer = mcp.hub.call(server, tool, arguments, None).await;
        self.progress(ToolPhase::Finished, &call.name, server, Vec::new());
        Ok(answer)
    }

    /// `skills_run`: in the request's workspace with the code tools on, so
    /// the model can use what the script writes; otherwise in a scratch
    /// folder of its own, deleted when the call ends.
    async fn run_script(&self, call: &ToolCall) -> Result<Answer, ToolError> {
        let Some(context) = self.skill_tools.clone() else {
            return Err(ToolError::Model(format!(
                "There is no tool called '{}'. The tools you have are: {}.",
                call.name,
                self.offered.join(", ")
            )));
        };
        let script = match tools::skills_run::prepare(&context, call) {
            Ok(script) => script,
            Err(refusal) => return Ok(*refusal),
        };
        let Some(exec) = &self.exec else {
            return Err(ToolError::Model("Scripts cannot run on this server.".into()));
        };
        let (workspace, scratch) = match &self.workspace {
            Some(workspace) => (workspace.clone(), false),
            None => match workspace_actor::scratch(exec, Some(self.parent.clone())).await {
                Ok(actor) => (actor, true),
                Err(why) => return Err(ToolError::Model(format!("The script did not run: {why}."))),
            },
        };
        self.progress(ToolPhase::Running, &call.name, &script.path, Vec::new());
        let skill = script.skill.id().to_string();
        let path = script.path.clone();
        let result =
            workspace_actor::call(&workspace, CodeCall::Script(script), self.sandbox.clone(), self.artifacts.clone())
                .await;
        if scratch {
            let _ = workspace.stop_and_wait(None, Some(workspace_actor::STOP_TIMEOUT)).await;
        }
        let produced = result.as_ref().map(|a| a.produced.clone()).unwrap_or_default();
        self.progress(ToolPhase::Finished, &call.name, &path, produced);
        result.map(|answer| Answer { skill: Some(skill), detail: Some(path), ..answer }).map_err(|err| match err {
            // A scratch folder belongs to this call alone; losing it is the
            // call's failure, not the request's.
            ToolError::Fatal(message) if scratch => ToolError::Model(format!("The script did not run: {message}.")),
            other => other,
        })
    }
}

/// Whether two calls' arguments are the same JSON (or the same text when
/// either is not JSON).
pub fn same_arguments(a: &str, b: &str) -> bool {
    match (serde_json::from_str::<Value>(a), serde_json::from_str::<Value>(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.trim() == b.trim(),
    }
}
