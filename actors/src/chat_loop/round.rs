//! The round policy: what one round offers and forces, how its prompt is
//! rendered to fit the context and submitted, how its output ends (an
//! answer, our calls, the caller's calls, a cut), and what the next round
//! starts from. The actor (`mod.rs`) calls these on its messages; the tool
//! calls themselves go to the router (`tools::router`).

use std::collections::HashSet;
use std::sync::Arc;

use ractor::ActorRef;
use skillhost_engine::{
    at_idle_priority, ChatMessage, Conversation, EngineError, FinishReason, GenerateRequest, GenerationEvent,
    PreparedPrompt, Role, Timings, ToolCall, ToolChoice, ToolDef, LARGE_PROMPT_BYTES,
};

use super::output::RoundOutput;
use super::{budget, reasoning, LoopMsg, LoopState, PendingCalls};
use crate::request::{ChatError, ChatEvent, ChatFinish, RoundStats};
use crate::skills::prompt;
use crate::task::AbortOnDrop;
use crate::tools::agents::AgentDesk;
use crate::tools::router::ToolRunner;
use crate::tools::workspace_actor::ArtifactsFor;

pub(super) fn chat_error(err: EngineError) -> ChatError {
    match err {
        EngineError::PromptTooLong { .. }
        | EngineError::EmptyPrompt
        | EngineError::InvalidGrammar(_)
        | EngineError::BadInput(_) => ChatError::BadRequest(err.to_string()),
        EngineError::Stopped | EngineError::Load { .. } | EngineError::Upstream(_) => {
            ChatError::Unavailable(err.to_string())
        }
        EngineError::UpstreamRefused(_) => ChatError::BadRequest(err.to_string()),
        EngineError::Decode(_) => ChatError::Engine(err.to_string()),
    }
}

/// The tool choice for the current round (see [`choose`]).
fn round_choice(state: &LoopState) -> ToolChoice {
    choose(&Offer {
        asked: &state.request.tool_choice,
        round: state.progress.round,
        final_round: state.progress.final_round,
        any_tools: !state.prompt.tools.is_empty(),
        ours_answer_none: state.bench.skill_tools.is_some() || state.agents.is_some(),
        caller_tools: &state.prompt.caller_tools,
    })
}

/// What decides a round's tool choice.
struct Offer<'a> {
    /// The request's `tool_choice`.
    asked: &'a ToolChoice,
    /// 1-based.
    round: u32,
    /// The extra round after the rounds ran out: tools off.
    final_round: bool,
    /// Any tool is declared (the caller's or ours).
    any_tools: bool,
    /// Our skill or coordination tools stay callable under the caller's
    /// `none`: the caller declines its own tools, not the server's.
    ours_answer_none: bool,
    caller_tools: &'a HashSet<String>,
}

/// A forced choice that only our tools can satisfy applies to the first
/// round; one aimed at the caller's tools holds until the caller gets its
/// call. Forcing a call when no tool exists is passed on in the first
/// round, where the format refuses it and the client gets a 400 naming it.
fn choose(offer: &Offer<'_>) -> ToolChoice {
    let first = offer.round == 1;
    if offer.final_round {
        return ToolChoice::None;
    }
    if !offer.any_tools {
        return match offer.asked {
            choice @ (ToolChoice::Required | ToolChoice::Named(_)) if first => choice.clone(),
            _ => ToolChoice::None,
        };
    }
    match offer.asked {
        ToolChoice::None if offer.ours_answer_none => ToolChoice::Auto,
        ToolChoice::None => ToolChoice::None,
        ToolChoice::Auto => ToolChoice::Auto,
        ToolChoice::Required if first || !offer.caller_tools.is_empty() => ToolChoice::Required,
        ToolChoice::Required => ToolChoice::Auto,
        ToolChoice::Named(name) if offer.caller_tools.contains(name) || first => ToolChoice::Named(name.clone()),
        ToolChoice::Named(_) => ToolChoice::Auto,
    }
}

/// Renders the prompt, submits it, and starts relaying engine events.
pub(super) async fn start_round(myself: &ActorRef<LoopMsg>, state: &mut LoopState) -> Result<(), ChatError> {
    // A child's follow-ups that came while it worked are read now.
    for input in std::mem::take(&mut state.progress.inputs) {
        state.prompt.history.push(ChatMessage::new(Role::User, input));
    }
    if let Some(agents) = state.agents.as_mut() {
        agents.holding = agents.unread();
        agents.held.clear();
    }
    let choice = round_choice(state);
    // With `tool_choice: none` from the caller, only our tools stay visible.
    let tools: Vec<ToolDef> = match (&state.request.tool_choice, &choice) {
        (_, ToolChoice::None) => Vec::new(),
        (ToolChoice::None, _) => {
            state.prompt.tools.iter().filter(|t| !state.prompt.caller_tools.contains(&t.name)).cloned().collect()
        }
        _ => state.prompt.tools.clone(),
    };
    // The context budget: past the high-water mark, the loop lets go of one
    // thing at a time (see `budget`) and renders again.
    let n_ctx = state.backend.info().n_ctx as usize;
    state.prompt.round_demoted.clear();
    let prepared = loop {
        let prepared = render(state, &choice, &tools).await?;
        let estimate = prepared.text.len().div_ceil(prompt::BYTES_PER_TOKEN);
        let count = if budget::worth_counting(estimate, n_ctx) {
            state.backend.count_tokens(prepared.text.clone()).await.unwrap_or(estimate)
        } else {
            estimate
        };
        if budget::fits(count, n_ctx) {
            break prepared;
        }
        match budget::demote_one(
            &mut state.prompt.base_messages,
            &mut state.prompt.history,
            state.skills.snapshot.as_deref(),
        ) {
            Some(note) => {
                tracing::info!(agent = %state.agent_id, round = state.progress.round, tokens = count, n_ctx, note = ?note, "context budget: let go of one part");
                state.prompt.round_demoted.push(note);
                // A result let go is no longer "above" for a repeated call.
                state.bench.answered.clear();
            }
            // Nothing left to let go: the prompt goes as it is, and the
            // engine refuses it only when it does not fit at all.
            None => break prepared,
        }
    };
    state.prompt.round_parts =
        budget::account(&state.prompt.base_messages, &state.prompt.history, &tools, state.prompt.skills_block_bytes);
    let mut stops = state.request.stop.clone();
    stops.extend(prepared.stops);
    let generate = GenerateRequest {
        prompt: prepared.text,
        sampling: state.request.sampling.clone(),
        // The budget is the turn's, across every round, as OpenAI's API
        // counts it: each round gets what the earlier ones left.
        max_tokens: remaining_budget(state).map(|left| left.max(1)),
        stops,
        grammar: prepared.grammar,
        affinity: state.prompt.affinity,
        chat: prepared.chat,
    };
    let thinking = reasoning::prompt_opens_thinking(&generate.prompt);
    let submitted = match state.backend.submit(generate).await {
        Ok(submitted) => submitted,
        // The last tool results pushed the conversation past the context:
        // the model is told so, in their place, instead of the turn failing.
        Err(EngineError::PromptTooLong { n_prompt, n_ctx }) if shrink_last_results(state, n_prompt, n_ctx) => {
            return Box::pin(start_round(myself, state)).await;
        }
        // Counted by estimate, the prompt looked smaller than it is: the
        // budget lets go of more before the turn gives up.
        Err(EngineError::PromptTooLong { .. })
            if budget::demote_one(&mut state.prompt.base_messages, &mut state.prompt.history, state.skills.snapshot.as_deref()).is_some() =>
        {
            state.bench.answered.clear();
            return Box::pin(start_round(myself, state)).await;
        }
        Err(err @ EngineError::PromptTooLong { .. }) => {
            return Err(ChatError::BadRequest(format!(
                "{err}, with old tool results, idle skill instructions and earlier turns already left out; send a shorter message or start a new conversation"
            )))
        }
        Err(err) => return Err(chat_error(err)),
    };
    state.progress.n_prompt = submitted.n_prompt;
    state.progress.generated = submitted.generated.clone();
    let offered = tools.iter().map(|t| t.name.clone()).collect();
    state.progress.output = RoundOutput::new(prepared.tool_family, offered, thinking);
    if state.progress.round == 1 && !state.emit(ChatEvent::Accepted) {
        myself.stop(Some("client disconnected".into()));
        return Ok(());
    }
    let mut events = submitted.events;
    let relay_to = myself.clone();
    state.tasks.relay = Some(AbortOnDrop::new(tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let last = matches!(event, GenerationEvent::Finished { .. } | GenerationEvent::Failed(_));
            if relay_to.cast(LoopMsg::Generated(event)).is_err() || last {
                return;
            }
        }
        let _ = relay_to.cast(LoopMsg::EngineGone);
    })));
    Ok(())
}

/// Renders the round's prompt for the model. Rendering megabytes of
/// conversation takes CPU the decoding streams need: a large one is
/// rendered on a blocking thread at idle priority.
async fn render(state: &LoopState, choice: &ToolChoice, tools: &[ToolDef]) -> Result<PreparedPrompt, ChatError> {
    let mut messages = state.prompt.base_messages.clone();
    messages.extend(state.prompt.history.iter().cloned());
    let info = Arc::clone(state.backend.info());
    let (tools, choice) = (tools.to_vec(), choice.clone());
    let parallel_tool_calls = state.request.parallel_tool_calls;
    let response_format = state.request.response_format.clone();
    let render = move || {
        let conversation = Conversation {
            messages: &messages,
            tools: &tools,
            tool_choice: &choice,
            parallel_tool_calls,
            response_format: &response_format,
        };
        info.format.prepare(&conversation)
    };
    let size: usize =
        state.prompt.base_messages.iter().chain(state.prompt.history.iter()).map(|m| m.content.len()).sum();
    let rendered = if size > LARGE_PROMPT_BYTES {
        tokio::task::spawn_blocking(move || at_idle_priority(render))
            .await
            .map_err(|_| ChatError::Engine("rendering the prompt failed".into()))?
    } else {
        render()
    };
    rendered.map_err(|err| ChatError::BadRequest(err.to_string()))
}

/// Replaces the tool results of the last round with a note saying they did
/// not fit; false when there is nothing left to shrink (the turn then fails
/// as any prompt past the context does).
fn shrink_last_results(state: &mut LoopState, n_prompt: usize, n_ctx: usize) -> bool {
    let shrunk = shrink_results(&mut state.prompt.history, n_prompt, n_ctx);
    if shrunk {
        tracing::warn!(
            n_prompt,
            n_ctx,
            round = state.progress.round,
            "tool results did not fit the context; replaced with a note"
        );
    }
    shrunk
}

/// The tool results at the end of `history`, each replaced by a note with
/// its size; those already replaced stay as they are.
fn shrink_results(history: &mut [ChatMessage], n_prompt: usize, n_ctx: usize) -> bool {
    let results = history.iter().rev().take_while(|m| m.role == Role::Tool).count();
    let start = history.len() - results;
    let mut shrunk = false;
    for message in &mut history[start..] {
        if message.content.starts_with(TOO_LONG_NOTE) {
            continue;
        }
        message.content = format!(
            "{TOO_LONG_NOTE} The result was {} bytes; with it the conversation came to {n_prompt} tokens, and the context holds {n_ctx}. Answer with what you have, or ask for a smaller part.",
            message.content.len()
        );
        shrunk = true;
    }
    shrunk
}

/// How a tool result that did not fit the context begins.
pub(crate) const TOO_LONG_NOTE: &str = "[Result left out: too long for the context.]";

/// Generated tokens the turn may still spend; `None` without a budget.
pub(super) fn remaining_budget(state: &LoopState) -> Option<u32> {
    left(state.request.max_tokens, state.progress.usage.completion_tokens)
}

/// What a budget of `max_tokens` leaves after `spent`.
fn left(max_tokens: Option<u32>, spent: usize) -> Option<u32> {
    let spent = u32::try_from(spent).unwrap_or(u32::MAX);
    max_tokens.map(|budget| budget.saturating_sub(spent))
}

/// What follows a finished round.
pub(super) enum Next {
    /// Answer our calls first (`state.tasks.pending` holds them).
    Tools,
    /// Generate again (a child read a follow-up).
    Again,
    /// A final answer was withheld: collect the agents' reports first.
    Collect,
    /// The request is over.
    Done,
}

/// Ends a round: reports it, and decides what comes next.
pub(super) async fn finish_round(state: &mut LoopState, reason: FinishReason, timings: Timings) -> Next {
    let end = state.progress.output.finish(reason == FinishReason::Length);
    for diagnostic in &end.diagnostics {
        // Debug formatting escapes newlines: model text cannot forge a log line.
        tracing::info!(?diagnostic, round = state.progress.round, "the model's tool call was not read");
    }
    if !end.reasoning_delta.is_empty() {
        state.emit(ChatEvent::Reasoning(end.reasoning_delta));
    }
    let mut started = state.progress.output.content_started();
    state.emit_content(end.content_delta, &mut started);
    if state.progress.n_prompt == 0 {
        // An upstream tells the prompt's length only at the end.
        state.progress.n_prompt = timings.cache_n + timings.prompt_n;
    }
    state.progress.usage.prompt_tokens += state.progress.n_prompt;
    state.progress.usage.completion_tokens += timings.predicted_n;
    state.progress.rounds.push(RoundStats {
        agent_id: state.agent_id.clone(),
        prompt_tokens: state.progress.n_prompt,
        cached_tokens: timings.cache_n,
        copied_tokens: timings.copied_n,
        generated_tokens: timings.predicted_n,
        time_to_first_token_ms: timings.prompt_ms,
        context: state.prompt.round_parts.scaled_to(state.progress.n_prompt),
        demoted: std::mem::take(&mut state.prompt.round_demoted),
    });
    let parts = state.prompt.round_parts.scaled_to(state.progress.n_prompt);
    tracing::info!(
        agent = %state.agent_id,
        round = state.progress.round,
        prompt = state.progress.n_prompt,
        cached = timings.cache_n,
        system = parts.system,
        skills = parts.skills,
        tools = parts.tools,
        skill_bodies = parts.skill_bodies,
        tool_results = parts.tool_results,
        history = parts.history,
        "round finished"
    );

    if state.progress.final_round {
        flush_held(state);
        let separator = if state.progress.content_sent { "\n\n" } else { "" };
        let rounds = state.settings.max_rounds;
        let what = state.task_word();
        let note = format!("{separator}[This answer was cut short: the {what} used all {rounds} tool rounds.]");
        // The separator is explicit: the note belongs after this round's text.
        started = true;
        state.emit_content(note, &mut started);
        state.progress.cut = true;
        finish(state, ChatFinish::Stop, timings).await;
        return Next::Done;
    }

    let answers_ours = state.bench.skill_tools.is_some()
        || state.bench.code_tools
        || !state.bench.attachments.is_empty()
        || state.bench.mcp.is_some()
        || state.agents.is_some();
    // A caller's tool that a loaded skill's allowed-tools leaves out is
    // refused here, like one of ours, instead of going back to the caller.
    let for_caller = |call: &ToolCall| {
        !answers_ours
            || (state.prompt.caller_tools.contains(&call.name)
                && state.bench.allowed.refusal(&call.name, &call.arguments).is_none())
    };
    let (mut caller, ours): (Vec<ToolCall>, Vec<ToolCall>) = end.calls.into_iter().partition(for_caller);
    // A call to the caller's tool cut short by the budget goes back as it
    // is, arguments so far, with a finish that says it was cut (as OpenAI
    // returns it; LangChain shows it as an invalid call). One to our own
    // tools cannot run, and the turn has no budget left to redo it.
    let mut finish_calls = ChatFinish::ToolCalls;
    if let Some(cut) = end.cut {
        if for_caller(&cut) {
            caller.push(cut);
            finish_calls = ChatFinish::Length;
        } else {
            tracing::info!(tool = %cut.name, round = state.progress.round, "the budget ran out inside a call to our tool");
        }
    }
    if ours.is_empty() && caller.is_empty() {
        if !state.progress.inputs.is_empty() {
            // A child's follow-up came while it answered: it answers that too.
            push_answer_turn(state, Vec::new());
            next_round(state);
            return Next::Again;
        }
        if reason == FinishReason::Stop {
            if let Some(agents) = state.agents.as_mut().filter(|a| a.holding) {
                // An answer written before the reports were read is
                // withheld: they are collected and the model answers again.
                agents.collecting = Some(timings);
                push_answer_turn(state, Vec::new());
                return Next::Collect;
            }
        }
        flush_held(state);
        let finish_reason = match reason {
            FinishReason::Stop => ChatFinish::Stop,
            FinishReason::Length => ChatFinish::Length,
        };
        finish(state, finish_reason, timings).await;
        return Next::Done;
    }
    flush_held(state);
    state.tasks.pending = Some(PendingCalls { ours, caller, timings, finish: finish_calls });
    Next::Tools
}

/// Sends the content a held round kept back.
fn flush_held(state: &mut LoopState) {
    let Some(agents) = state.agents.as_mut().filter(|a| a.holding) else { return };
    agents.holding = false;
    let held = std::mem::take(&mut agents.held);
    let mut started = false;
    state.emit_content(held, &mut started);
}

/// Adds the round's assistant turn to the history. The content is what an
/// upstream in chat mode is sent back; the raw text, calls' markup
/// included, is what a prompt rendered here repeats.
pub(super) fn push_answer_turn(state: &mut LoopState, calls: Vec<ToolCall>) {
    let mut turn = ChatMessage::new(Role::Assistant, state.progress.output.content().to_string());
    turn.raw = Some(state.progress.output.raw().to_string());
    turn.tool_calls = calls;
    state.prompt.history.push(turn);
}

/// Moves to the next round; past the last one, the model is told to answer.
pub(super) fn next_round(state: &mut LoopState) {
    if let Some(note) = last_round_note(state.progress.round, state.settings.max_rounds) {
        state.prompt.history.push(ChatMessage::new(Role::User, note));
        state.progress.final_round = true;
    }
    state.progress.round += 1;
}

/// After round `round` of `max_rounds`: the note that makes the next one
/// the final, tool-less round, once the rounds are used up.
fn last_round_note(round: u32, max_rounds: u32) -> Option<String> {
    (round >= max_rounds).then(|| {
        format!(
            "You have used all {max_rounds} tool rounds for this turn. Answer now using what you have already read, and say which part you could not check."
        )
    })
}

/// Sends the request's final event.
pub(super) async fn finish(state: &mut LoopState, finish: ChatFinish, timings: Timings) {
    let rounds = std::mem::take(&mut state.progress.rounds);
    let usage = state.progress.usage;
    state.progress.ended_ok = true;
    state.end(ChatEvent::Finished { finish, usage, timings, rounds }).await;
}

/// Starts answering the pending calls in a task of their own, so the
/// mailbox stays open (a command can run for minutes).
pub(super) fn start_tools(myself: &ActorRef<LoopMsg>, state: &mut LoopState) {
    let Some(pending) = &state.tasks.pending else { return };
    let runner = ToolRunner {
        events: state.events.clone(),
        offered: state.prompt.tools.iter().map(|t| t.name.clone()).collect(),
        code_tools: state.bench.code_tools,
        attachments: Arc::clone(&state.bench.attachments),
        skill_tools: state.bench.skill_tools.clone(),
        workspace: state.bench.workspace.as_ref().map(|w| w.actor.clone()),
        sandbox: state.bench.sandbox.clone(),
        artifacts: state
            .bench
            .artifacts
            .clone()
            .map(|store| ArtifactsFor { store, run_id: state.bench.run_id.clone() }),
        exec: state.bench.exec.clone(),
        parent: myself.get_cell(),
        round: state.progress.round,
        run_id: state.bench.run_id.clone(),
        agents: state.agents.is_some().then(|| {
            let desk = myself.clone();
            AgentDesk::new(move |op, reply| desk.cast(LoopMsg::Agents(op, reply)).is_ok())
        }),
        agent_id: state.agent_id.clone(),
        given: state.seat.as_ref().map(|seat| seat.tools.clone()),
        allow_write: state.agents.as_ref().is_some_and(|a| a.tree.allow_write),
        outcomes: Arc::clone(&state.skills.skill_outcomes),
        surface: state.request.surface,
        mcp: state.bench.mcp.clone(),
    };
    let calls = pending.ours.clone();
    let mut answered = state.bench.answered.clone();
    let mut allowed = state.bench.allowed.clone();
    let reply_to = myself.clone();
    state.tasks.tools_task = Some(AbortOnDrop::new(tokio::spawn(async move {
        let message = match runner.answer_all(&calls, &mut answered, &mut allowed).await {
            Ok((answers, used)) => LoopMsg::ToolsAnswered(answers, answered, used, allowed),
            Err(err) => LoopMsg::ToolsFailed(err),
        };
        let _ = reply_to.cast(message);
    })));
}

/// Takes the answers to a round's calls into the history. Returns true when
/// another round should run.
pub(super) async fn tools_answered(state: &mut LoopState, answers: Vec<String>) -> bool {
    let Some(PendingCalls { ours, caller, timings, finish: finish_calls }) = state.tasks.pending.take() else {
        return false;
    };
    if !caller.is_empty() {
        // The caller's tools run on the caller's side: the loop ends here.
        if state.seat.is_none() {
            let raw = state.progress.output.raw().to_string();
            state.emit(ChatEvent::ServerTurns { turns: state.prompt.history.clone(), raw });
        }
        state.emit(ChatEvent::ToolCalls(caller));
        finish(state, finish_calls, timings).await;
        return false;
    }
    push_answer_turn(state, ours.clone());
    for (call, text) in ours.iter().zip(answers) {
        let mut result = ChatMessage::new(Role::Tool, text);
        result.tool_call_id = Some(call.id.clone());
        result.name = Some(call.name.clone());
        state.prompt.history.push(result);
    }
    // The turn's token budget is spent: the calls the model made were
    // answered (their effects, a written file, happen as asked), but no
    // round follows to read the answers.
    if remaining_budget(state) == Some(0) {
        finish(state, ChatFinish::Length, timings).await;
        return false;
    }
    next_round(state);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_round_choice_follows_the_request_and_the_round() {
        use ToolChoice::{Auto, None as Off, Required};
        let named = |n: &str| ToolChoice::Named(n.into());
        let caller: HashSet<String> = ["weather".to_string()].into();
        let nobody = HashSet::new();
        // (asked, round, final round, any tools, ours answer under none, caller's tools) -> choice
        type Case<'a> = ((ToolChoice, u32, bool, bool, bool, &'a HashSet<String>), ToolChoice);
        let cases: Vec<Case> = vec![
            ((Auto, 1, false, true, true, &caller), Auto),
            ((Auto, 3, true, true, true, &caller), Off),
            // No tool at all: a forced choice goes on in round 1 (the format refuses it).
            ((Required, 1, false, false, false, &nobody), Required),
            ((named("x"), 1, false, false, false, &nobody), named("x")),
            ((Required, 2, false, false, false, &nobody), Off),
            ((Auto, 1, false, false, false, &nobody), Off),
            // The caller's none leaves our tools callable.
            ((Off, 1, false, true, true, &caller), Auto),
            ((Off, 1, false, true, false, &caller), Off),
            // Required: every round while the caller has tools, else only the first.
            ((Required, 2, false, true, true, &caller), Required),
            ((Required, 1, false, true, true, &nobody), Required),
            ((Required, 2, false, true, true, &nobody), Auto),
            // A named tool of the caller's holds; one of ours only in round 1.
            ((named("weather"), 4, false, true, true, &caller), named("weather")),
            ((named("skills_read"), 1, false, true, true, &caller), named("skills_read")),
            ((named("skills_read"), 2, false, true, true, &caller), Auto),
        ];
        for ((asked, round, final_round, any_tools, ours_answer_none, caller_tools), expected) in cases {
            let offer = Offer { asked: &asked, round, final_round, any_tools, ours_answer_none, caller_tools };
            assert_eq!(choose(&offer), expected, "{asked:?} in round {round}, final {final_round}");
        }
    }

    #[test]
    fn the_budget_left_is_what_the_earlier_rounds_did_not_spend() {
        let cases = [
            (None, 500, None),
            (Some(100), 0, Some(100)),
            (Some(100), 99, Some(1)),
            (Some(100), 100, Some(0)),
            (Some(100), 250, Some(0)),
        ];
        for (max_tokens, spent, expected) in cases {
            assert_eq!(left(max_tokens, spent), expected, "{max_tokens:?} after {spent}");
        }
        let huge = usize::MAX;
        assert_eq!(left(Some(u32::MAX), huge), Some(0));
    }

    #[test]
    fn the_last_round_is_announced_once_the_rounds_are_used() {
        assert_eq!(last_round_note(7, 8), None);
        let note = last_round_note(8, 8).expect("the rounds are used up");
        assert!(note.starts_with("You have used all 8 tool rounds"), "{note}");
        assert!(last_round_note(9, 8).is_some());
    }

    #[test]
    fn only_the_last_results_are_shrunk_and_only_once() {
        let tool = |text: &str| ChatMessage::new(Role::Tool, text);
        let mut history = vec![tool("old result"), ChatMessage::new(Role::Assistant, "call"), tool("a"), tool("bb")];
        assert!(shrink_results(&mut history, 9000, 8192));
        assert_eq!(history[0].content, "old result");
        assert!(history[2].content.starts_with(TOO_LONG_NOTE) && history[2].content.contains("was 1 bytes"));
        assert!(history[3].content.contains("was 2 bytes; with it the conversation came to 9000 tokens"));
        // A second try has nothing left to shrink.
        assert!(!shrink_results(&mut history, 9000, 8192));
        assert!(!shrink_results(&mut [ChatMessage::new(Role::User, "hi")], 9000, 8192));
    }
}
