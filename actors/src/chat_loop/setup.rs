//! Setting a loop up from its request: the workspace (the request's own
//! or its conversation's), the sandbox actor, the tools on offer (the
//! caller's, code tools, skill tools, the coordination tools), the skills
//! block and the temperatures. It runs on the loop's first message, not in
//! `pre_start`, so whoever spawns a loop never waits on a workspace.

use std::collections::HashSet;
use std::sync::Arc;

use ractor::{Actor, ActorRef};

use super::agents::{self, AgentTree, Agents};
use super::output::{self, RoundOutput};
use super::{LoopArgs, LoopMsg, LoopState, Progress, Prompt, SkillUse, Tasks, Workbench, WorkspaceRef};
use crate::conversations::{Conversations, RECLAIM_IDLE_AFTER};
use crate::request::{ContextParts, Usage, ROOT_AGENT};
use crate::sandbox::actor::SandboxActor;
use crate::sandbox::ExecRuntime;
use crate::skills::outcomes::{SkillEvent, TurnSkills};
use crate::skills::prompt::{self, PromptOptions};
use crate::tools::allowed::Allowed;
use crate::tools::skills::{self as skill_tools, ToolContext};
use crate::tools::workspace_actor::WorkspaceActor;
use crate::tools::{self};
use crate::workspace::Workspace;

/// Opens the request's workspace actor: its conversation's (made on the
/// conversation's first request) or one of its own, linked to the loop.
async fn open_workspace(
    myself: &ActorRef<LoopMsg>,
    exec: &ExecRuntime,
    conversations: &Conversations,
    conversation: Option<&str>,
    restore: Option<Arc<Vec<crate::workspace::snapshot::SavedFile>>>,
) -> Result<WorkspaceRef, String> {
    if let Some(id) = conversation {
        if let Some(actor) = conversations.workspace(id) {
            return Ok(WorkspaceRef { actor, own: false });
        }
    }
    let base = exec.workspace_base.clone();
    let options = exec.workspaces.clone();
    if let (Some(budget), Some(bytes)) = (&options.budget, options.size_cap) {
        // Under pressure, conversations idle the longest give their folders
        // back first; when none is idle the new folder is refused.
        let idle_before = std::time::Instant::now().checked_sub(RECLAIM_IDLE_AFTER);
        while !budget.fits(bytes) {
            let Some(idle_before) = idle_before else { break };
            if !conversations.close_least_recent_idle(idle_before, conversation).await {
                break;
            }
        }
    }
    let workspace = tokio::task::spawn_blocking(move || Workspace::create(&base, &options))
        .await
        .map_err(|err| err.to_string())?
        .map_err(|err| err.to_string())?;
    // A conversation that continues after its folder went gets its kept
    // files back, through the new folder's handle.
    if let Some(files) = restore.filter(|files| !files.is_empty()) {
        let count = files.len();
        let written = workspace.with_handle(move |dir| crate::workspace::snapshot::restore(dir, &files)).await;
        tracing::info!(
            kept = count,
            restored = written.unwrap_or(0),
            "a conversation's files are back in its new workspace"
        );
    }
    match conversation {
        Some(id) => {
            // Not linked: the conversation's folder outlives this request.
            let (actor, _) = Actor::spawn(None, WorkspaceActor, workspace).await.map_err(|err| err.to_string())?;
            match conversations.attach(id, actor.clone()) {
                Some(kept) => {
                    if kept.get_id() != actor.get_id() {
                        actor.stop(None);
                    }
                    Ok(WorkspaceRef { actor: kept, own: false })
                }
                // The conversation was closed meanwhile (its client may
                // have left): this request keeps the folder to itself, and
                // it goes with the loop like any request's own.
                None => {
                    actor.get_cell().link(myself.get_cell());
                    Ok(WorkspaceRef { actor, own: true })
                }
            }
        }
        None => {
            let (actor, _) = Actor::spawn_linked(None, WorkspaceActor, workspace, myself.get_cell())
                .await
                .map_err(|err| err.to_string())?;
            Ok(WorkspaceRef { actor, own: true })
        }
    }
}

/// Builds what the loop needs from the request, the registry and the model.
pub(super) async fn prepare_state(myself: &ActorRef<LoopMsg>, args: LoopArgs) -> LoopState {
    let LoopArgs {
        mut request,
        backend,
        skills,
        settings,
        exec,
        artifacts,
        conversations,
        events,
        agent_stats,
        skill_outcomes,
        seat,
        mcp,
    } = args;
    let capabilities = backend.info().format.capabilities().clone();
    // A child may use only the tools its parent gave it.
    let given = |name: &str| seat.as_ref().is_none_or(|seat| seat.tools.iter().any(|t| t == name));
    let caller_tools: HashSet<String> = request.tools.iter().map(|t| t.name.clone()).collect();
    let mut tools = request.tools.clone();
    let mut skill_tools = None;
    let mut base_messages = request.messages.clone();
    let mut extra_prompt = None;
    // Skills whose instructions the prompt carries from the start.
    let mut inlined = Vec::new();
    let mut skills_block_bytes = 0;
    // A workspace for the code tools, shared by all rounds of the request.
    // Skill scripts without code tools get a scratch folder per call instead.
    let mut workspace = None;
    if let Some(seat) = &seat {
        // A child works in its parent's folder, through the same actor.
        workspace = seat.workspace.clone().map(|actor| WorkspaceRef { actor, own: false });
    } else if let Some(e) = exec.as_ref().filter(|e| e.code_exec && capabilities.tools) {
        match open_workspace(myself, e, &conversations, request.conversation.as_deref(), request.restore.clone()).await
        {
            Ok(opened) => workspace = Some(opened),
            Err(err) => {
                tracing::error!(error = %err, "cannot create a request workspace; code tools are off for it");
                // The model is told why, so the answer can say it.
                extra_prompt = Some(format!(
                    "Code execution is not available for this request: {err}. Answer without running code, and say so if the task needed it."
                ));
            }
        }
    }
    let mut sandbox = None;
    if let Some(e) = &exec {
        match Actor::spawn_linked(None, SandboxActor, Arc::clone(&e.settings), myself.get_cell()).await {
            Ok((actor, _)) => sandbox = Some(actor),
            Err(err) => {
                tracing::error!(error = %err, "cannot start the request's sandbox actor; commands are off for it")
            }
        }
    }
    let code_tools = workspace.is_some();
    // The user's attachments: in the working folder when there is one,
    // else read from memory by a `read_file` that reaches nothing else.
    let mut attachments = Arc::new(Vec::new());
    if !request.attachments.is_empty() {
        match &workspace {
            Some(opened) => {
                let files = Arc::new(request.attachments.clone());
                let written = crate::tools::workspace_actor::put_attachments(&opened.actor, files).await;
                tracing::debug!(written, "attachments written to the working folder");
            }
            None if capabilities.tools && given("read_file") && !caller_tools.contains("read_file") => {
                attachments = Arc::new(request.attachments.clone());
                tools.push(tools::read_file::attachments_declaration());
            }
            None => {}
        }
    }
    // The operator's temperatures replace only one the request left unset;
    // an explicit client value wins.
    if let (Some(temperature), false) = (settings.temperature, request.temperature_set) {
        request.sampling.temperature = temperature;
    }
    request.max_tokens = request.max_tokens.or(settings.max_tokens);
    if let Some(e) = exec.as_ref().filter(|_| code_tools) {
        if let (Some(temperature), false) = (settings.code_temperature, request.temperature_set) {
            request.sampling.temperature = temperature;
        }
        for declaration in tools::code_declarations(&e.settings).into_iter().filter(|d| given(&d.name)) {
            if caller_tools.contains(&declaration.name) {
                tracing::warn!(tool = %declaration.name, "the caller declares a tool named like a code tool; the caller's wins");
                continue;
            }
            tools.push(declaration);
        }
        extra_prompt = Some(tools::CODE_PROMPT.to_string());
    }
    if let Some(snapshot) = skills.clone() {
        // A caller that brings a tool named like one of ours (its own
        // skills_read) must not be told to call ours, nor have its calls
        // answered by us: its request gets its selected skills inlined, no
        // catalog and none of our skill tools, as a family without tools does.
        let clash = skill_tools::NAMES.iter().find(|name| caller_tools.contains(**name));
        if let Some(name) = clash {
            tracing::warn!(tool = %name, "the caller declares a tool named like a skill tool; its selected skills are inlined, and no catalog or skill tools of ours are offered");
        }
        let options = PromptOptions {
            discovery: request.skills_discovery.unwrap_or(settings.discovery),
            inline_selected_bodies: settings.inline_selected_bodies,
            allow_exec: settings.allow_exec,
            context_tokens: Some(backend.info().n_ctx),
            tools: capabilities.tools && clash.is_none(),
        };
        let block = prompt::plan(&request.skills, &snapshot, &options);
        base_messages = prompt::apply(&request.messages, &block);
        skills_block_bytes = block.text.len();
        skill_outcomes.event(&block.advertised, request.surface, SkillEvent::Advertised);
        skill_outcomes.event(&block.inlined, request.surface, SkillEvent::Read);
        inlined.clone_from(&block.inlined);
        if options.tools && !block.reachable.is_empty() {
            tools.extend(
                skill_tools::declarations(settings.allow_exec, &block.reachable).into_iter().filter(|d| given(&d.name)),
            );
            skill_tools = Some(ToolContext {
                snapshot: Arc::clone(&snapshot),
                reachable: block.reachable,
                allow_exec: settings.allow_exec && exec.is_some(),
            });
        }
    }
    // The operator's MCP servers: their tools as the turn starts, so the
    // prompt stays the same for every round of it.
    let mut turn_mcp = None;
    if let Some(hub) = mcp.filter(|_| capabilities.tools) {
        let mut turn = hub.for_turn(&request.mcp).await;
        turn.declarations.retain(|declaration| {
            let clash = caller_tools.contains(&declaration.name);
            if clash {
                tracing::warn!(tool = %declaration.name, "the caller declares a tool named like an MCP tool; the caller's wins");
            }
            !clash && given(&declaration.name)
        });
        turn.tools.retain(|name, _| turn.declarations.iter().any(|d| &d.name == name));
        tools.extend(turn.declarations.iter().cloned());
        if !turn.declarations.is_empty() {
            turn_mcp = Some(turn);
        }
    }
    if let Some(text) = extra_prompt {
        let block = prompt::Block { text, ..prompt::Block::default() };
        base_messages = prompt::apply_after(&base_messages, &block);
    }
    let affinity = skillhost_engine::remote::affinity_key(&base_messages);
    // Delegation: on unless the server or the request turned it off, for a
    // model whose tool calls can be read back, and not where the answer
    // must be the caller's (see `agents::delegates`).
    // The five tools are one protocol: a caller that brings one of them (an
    // agent harness with sub-agents of its own) gets none of ours, so the
    // model never mixes its spawn with our wait.
    let clash = tools::agents::NAMES.iter().find(|name| caller_tools.contains(**name));
    if let Some(name) = clash {
        tracing::warn!(tool = ?name, "the caller declares a coordination tool of its own; ours are not offered");
    }
    let delegating =
        clash.is_none() && agents::delegates(settings.multi_agent, &request, !tools.is_empty(), capabilities.tools);
    let agents = delegating.then(|| match &seat {
        Some(seat) => Agents::new(Arc::clone(&seat.tree), seat.depth),
        None => Agents::new(AgentTree::new(settings.agent_limits, settings.agents_allow_write, agent_stats), 0),
    });
    if let Some(agents) = agents.as_ref().filter(|a| a.may_spawn()) {
        let share_tools = !agents::grantable(&tools, &caller_tools, agents.tree.allow_write).is_empty();
        let share_skills = skill_tools.as_ref().is_some_and(|c| !c.reachable.is_empty());
        tools.extend(tools::agents::declarations(share_skills, share_tools));
    }
    let agent_id = seat.as_ref().map_or_else(|| ROOT_AGENT.to_string(), |seat| seat.id.clone());
    let used_skills = TurnSkills::new(Arc::clone(&skill_outcomes), request.surface);
    let mut state = LoopState {
        request,
        backend,
        events,
        settings,
        agent_id,
        seat,
        agents,
        prompt: Prompt {
            base_messages,
            history: Vec::new(),
            tools,
            caller_tools,
            affinity,
            skills_block_bytes,
            round_parts: ContextParts::default(),
            round_demoted: Vec::new(),
        },
        progress: Progress {
            output: RoundOutput::new(None, Vec::new(), false),
            round: 1,
            final_round: false,
            content_sent: false,
            usage: Usage::default(),
            rounds: Vec::new(),
            n_prompt: 0,
            generated: Default::default(),
            cut: false,
            ended_ok: false,
            idle: false,
            inputs: Vec::new(),
        },
        bench: Workbench {
            mcp: turn_mcp,
            exec,
            workspace,
            sandbox,
            artifacts,
            code_tools,
            attachments,
            run_id: crate::replica::stamp(format!("run-{}", output::new_call_id().trim_start_matches("call_"))),
            conversations,
            answered: Vec::new(),
            allowed: Allowed::default(),
            skill_tools,
        },
        tasks: Tasks { relay: None, pending: None, tools_task: None, timer: None },
        skills: SkillUse { snapshot: skills, skill_outcomes, used_skills },
    };
    // A child starts under the skills its parent had loaded when it spawned it.
    state.bench.allowed = state.seat.as_ref().map(|seat| seat.allowed.clone()).unwrap_or_default();
    // An inlined skill is loaded from the first round.
    for skill in inlined {
        state.bench.allowed.load_from(state.skills.snapshot.as_deref(), &skill);
        state.skills.used_skills.insert(skill);
    }
    state
}
