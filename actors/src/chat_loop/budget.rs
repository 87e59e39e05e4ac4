//! The context budget: what each round's prompt spends its tokens on, and
//! what the loop lets go when a long conversation nears the context.
//!
//! Every prompt is accounted in six parts (system text, the skills block,
//! tool declarations, loaded skill instructions, tool results, the rest of
//! the conversation). When a round's prompt would pass
//! [`HIGH_WATER_PERCENT`] of the context, the loop frees space one step at a
//! time, in a fixed order, each step leaving a one-line note the model can
//! act on:
//!
//! 1. an old tool result (not of the latest round) becomes a line naming
//!    the call and its size, which the model can repeat;
//! 2. a skill's instructions not used in the last [`IDLE_SKILL_ROUNDS`]
//!    rounds become its description and the exact `skills_read` call that
//!    reloads them;
//! 3. the oldest turn of the conversation goes, and one line at the end of
//!    the system text says how much went and how it began.
//!
//! The system text and the latest user message are never touched. Within a
//! step the newest candidate goes first: the KV cache holds the prompt up to
//! the first byte that changes, so a change near the end re-decodes least.
//! What each step costs: (1) and (2) re-decode from the changed message to
//! the end (the tokens after it); (3) changes the system text's end, so the
//! whole conversation after the system text is decoded again; the log and
//! `rounds` say which steps a round took and how many tokens it re-decoded.

use serde_json::Value;
use skillhost_engine::{ChatMessage, Role, ToolCall, ToolDef};

use crate::request::ContextParts;
use crate::skills::prompt::BYTES_PER_TOKEN;
use crate::skills::Snapshot;

/// A prompt may take this share of the context, in percent; the rest is
/// left for the answer.
pub const HIGH_WATER_PERCENT: usize = 85;
/// Past this share of the context by the estimate, the prompt is counted
/// exactly before it is sent, in percent.
pub const EXACT_COUNT_PERCENT: usize = 60;
/// A loaded skill's instructions may be let go once no call has named the
/// skill for this many rounds.
pub const IDLE_SKILL_ROUNDS: u32 = 2;
/// Characters of the first left-out message quoted in the history note.
pub const SUMMARY_QUOTE_CHARS: usize = 160;

/// How an old result begins once it is let go (never demoted twice).
pub const RESULT_NOTE: &str = "[Result left out to save context:";
/// How a loaded skill's instructions begin once they are let go.
pub const BODY_NOTE: &str = "[Instructions unloaded to save context:";
/// How the note on left-out turns begins, at the end of the system text.
pub const HISTORY_NOTE: &str = "[Earlier turns left out to fit the context:";

/// Whether a prompt of `tokens` stays within the high-water mark of a
/// context of `n_ctx`.
pub fn fits(tokens: usize, n_ctx: usize) -> bool {
    tokens <= n_ctx * HIGH_WATER_PERCENT / 100
}

/// Whether an estimate is close enough to the mark to count exactly.
pub fn worth_counting(estimate: usize, n_ctx: usize) -> bool {
    estimate > n_ctx * EXACT_COUNT_PERCENT / 100
}

/// The call a tool result answers: its name and arguments.
fn call_of<'a>(messages: &'a [ChatMessage], result: &ChatMessage) -> Option<&'a ToolCall> {
    let id = result.tool_call_id.as_deref()?;
    messages.iter().rev().flat_map(|m| m.tool_calls.iter()).find(|call| call.id == id)
}

fn argument(call: &ToolCall, keys: &[&str]) -> Option<String> {
    let args: Value = serde_json::from_str(&call.arguments).ok()?;
    keys.iter().find_map(|key| args.get(*key).and_then(Value::as_str)).map(|s| s.trim().to_string())
}

/// The skill whose SKILL.md a result holds, when it is one.
fn body_of(messages: &[ChatMessage], result: &ChatMessage) -> Option<String> {
    let call = call_of(messages, result)?;
    if call.name != "skills_read" || result.content.starts_with(BODY_NOTE) {
        return None;
    }
    let path = argument(call, &["path", "file", "resource"]).unwrap_or_else(|| "SKILL.md".into());
    let offset = serde_json::from_str::<Value>(&call.arguments).ok().and_then(|a| a.get("offset").cloned());
    let first_page = offset.is_none_or(|o| o.as_u64() == Some(0) || o.as_str() == Some("0"));
    (path.trim_start_matches("./") == "SKILL.md" && first_page)
        .then(|| argument(call, &["skill", "name", "skill_name"]))
        .flatten()
}

/// Bytes as tokens, at the estimate the skills block uses.
fn tokens(bytes: usize) -> usize {
    bytes.div_ceil(BYTES_PER_TOKEN)
}

/// Accounts a round's prompt: `base` (the request's messages, the skills
/// block applied), `history` (the loop's turns), the tools offered, and
/// the bytes of the skills block and of the caller's system text.
pub fn account(
    base: &[ChatMessage],
    history: &[ChatMessage],
    tools: &[ToolDef],
    skills_block_bytes: usize,
) -> ContextParts {
    let mut parts = ContextParts::default();
    // A result's call is in the same part of the conversation: the client's
    // messages or the loop's turns.
    let all = base.iter().map(|m| (m, base)).chain(history.iter().map(|m| (m, history)));
    for (index, (message, around)) in all.enumerate() {
        let bytes = message.raw.as_deref().unwrap_or(&message.content).len()
            + message.tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>();
        match message.role {
            Role::System | Role::Developer if index == 0 => {
                let block = skills_block_bytes.min(bytes);
                parts.skills += tokens(block);
                parts.system += tokens(bytes - block);
            }
            Role::Tool if body_of(around, message).is_some() => parts.skill_bodies += tokens(bytes),
            Role::Tool => parts.tool_results += tokens(bytes),
            _ => parts.history += tokens(bytes),
        }
    }
    parts.tools =
        tools.iter().map(|t| tokens(t.name.len() + t.description.len() + t.parameters.to_string().len())).sum();
    parts
}

/// The round each of the loop's messages belongs to: an assistant turn
/// opens a round, its results belong to it.
fn rounds_of(history: &[ChatMessage]) -> Vec<u32> {
    let mut round = 0;
    history
        .iter()
        .map(|m| {
            if m.role == Role::Assistant {
                round += 1;
            }
            round
        })
        .collect()
}

/// The last round in which a call named `skill`.
fn last_use(history: &[ChatMessage], skill: &str) -> u32 {
    let rounds = rounds_of(history);
    history
        .iter()
        .zip(rounds)
        .filter(|(m, _)| {
            m.tool_calls.iter().any(|call| {
                matches!(call.name.as_str(), "skills_read" | "skills_run")
                    && argument(call, &["skill", "name", "skill_name"]).as_deref() == Some(skill)
            })
        })
        .map(|(_, round)| round)
        .max()
        .unwrap_or(0)
}

/// The call as the model would write it again.
fn call_text(call: &ToolCall) -> String {
    let arguments =
        serde_json::from_str::<Value>(&call.arguments).map_or_else(|_| call.arguments.clone(), |a| a.to_string());
    format!("{}({arguments})", call.name)
}

/// Lets go of one thing, in the fixed order; returns the step's note for
/// the log, or `None` when nothing is left to let go.
pub fn demote_one(
    base: &mut Vec<ChatMessage>,
    history: &mut [ChatMessage],
    snapshot: Option<&Snapshot>,
) -> Option<String> {
    demote_old_result(history).or_else(|| demote_idle_body(history, snapshot)).or_else(|| demote_oldest_turn(base))
}

/// Step 1: the newest tool result that is not of the latest round and not
/// a skill's instructions.
fn demote_old_result(history: &mut [ChatMessage]) -> Option<String> {
    let rounds = rounds_of(history);
    let latest = rounds.last().copied().unwrap_or(0);
    let index = (0..history.len()).rev().find(|&i| {
        let m = &history[i];
        m.role == Role::Tool
            && rounds[i] < latest
            && !m.content.starts_with(RESULT_NOTE)
            && !m.content.starts_with(BODY_NOTE)
            // Already a note (a result too long for the context).
            && !m.content.starts_with(super::round::TOO_LONG_NOTE)
            && body_of(history, m).is_none()
    })?;
    let call = call_of(history, &history[index]).map_or_else(|| "the call".to_string(), call_text);
    let bytes = history[index].content.len();
    let note = format!(
        "{RESULT_NOTE} {call} from round {} returned {bytes} bytes. Make the call again if you need it.]",
        rounds[index]
    );
    history[index].content = note.clone();
    Some(note)
}

/// Step 2: the newest loaded SKILL.md whose skill no call has named for
/// [`IDLE_SKILL_ROUNDS`] rounds.
fn demote_idle_body(history: &mut [ChatMessage], snapshot: Option<&Snapshot>) -> Option<String> {
    let rounds = rounds_of(history);
    let latest = rounds.last().copied().unwrap_or(0);
    let (index, skill) = (0..history.len()).rev().find_map(|i| {
        let skill = body_of(history, &history[i]).filter(|_| history[i].role == Role::Tool)?;
        (latest.saturating_sub(last_use(history, &skill)) >= IDLE_SKILL_ROUNDS).then_some((i, skill))
    })?;
    let description = snapshot
        .and_then(|s| s.get(&skill))
        .map(|s| crate::skills::prompt::trim_description(&s.manifest.description))
        .unwrap_or_default();
    let note = format!(
        "{BODY_NOTE} '{skill}' ({description}) Reload them with skills_read(skill=\"{skill}\", path=\"SKILL.md\") before acting on it again.]"
    );
    history[index].content = note.clone();
    Some(note)
}

/// Step 3: the oldest turn of the conversation (a user message and what
/// answered it, up to the next user message), never the system text or the
/// latest user message; the note at the end of the system text counts what
/// went.
fn demote_oldest_turn(base: &mut Vec<ChatMessage>) -> Option<String> {
    let start = usize::from(base.first().is_some_and(|m| matches!(m.role, Role::System | Role::Developer)));
    let latest_user = base.iter().rposition(|m| m.role == Role::User)?;
    if latest_user <= start {
        return None;
    }
    // The turn ends where the next user message starts; it never reaches
    // the latest one.
    let end = (start + 1..=latest_user).find(|&i| base[i].role == Role::User).unwrap_or(latest_user);
    let removed: Vec<ChatMessage> = base.drain(start..end).collect();
    let bytes: usize = removed.iter().map(|m| m.content.len()).sum();
    let quote: String = removed
        .iter()
        .find(|m| !m.content.trim().is_empty())
        .map(|m| m.content.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
        .chars()
        .take(SUMMARY_QUOTE_CHARS)
        .collect();
    // The counts so far, from an earlier note, carry over into the new one.
    let (mut messages, mut total_bytes) = (removed.len(), bytes);
    let mut first_quote = quote;
    if start == 1 {
        let system = &mut base[0].content;
        if let Some(at) = system.find(HISTORY_NOTE) {
            let old = system[at..].to_string();
            system.truncate(at);
            system.truncate(system.trim_end().len());
            let number = |after: &str| -> usize {
                old.split(after)
                    .next()
                    .and_then(|s| s.split_whitespace().last())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            messages += number(" messages");
            total_bytes += number(" bytes");
            if let Some(q) = old.split('“').nth(1).and_then(|s| s.split('”').next()) {
                first_quote = q.to_string();
            }
        }
    }
    let note = format!(
        "{HISTORY_NOTE} {messages} messages, {total_bytes} bytes. The conversation began: “{first_quote}”. Ask the user if you need what was said there.]"
    );
    if start == 1 {
        let system = &mut base[0].content;
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&note);
    } else {
        base.insert(0, ChatMessage::new(Role::System, note.clone()));
    }
    Some(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall { id: id.into(), name: name.into(), arguments: arguments.into() }
    }

    fn assistant(calls: Vec<ToolCall>) -> ChatMessage {
        let mut m = ChatMessage::new(Role::Assistant, "");
        m.tool_calls = calls;
        m
    }

    fn result(id: &str, name: &str, text: &str) -> ChatMessage {
        let mut m = ChatMessage::new(Role::Tool, text);
        m.tool_call_id = Some(id.into());
        m.name = Some(name.into());
        m
    }

    /// Round 1 reads a skill, round 2 reads a file, round 3 reads another.
    fn loop_history() -> Vec<ChatMessage> {
        vec![
            assistant(vec![call("a", "skills_read", r#"{"skill":"notes"}"#)]),
            result("a", "skills_read", &"N".repeat(400)),
            assistant(vec![call("b", "read_file", r#"{"path":"one.txt"}"#)]),
            result("b", "read_file", &"1".repeat(800)),
            assistant(vec![call("c", "read_file", r#"{"path":"two.txt"}"#)]),
            result("c", "read_file", &"2".repeat(800)),
        ]
    }

    #[test]
    fn the_marks_hold_at_their_limit_and_not_one_past() {
        assert!(fits(850, 1000) && !fits(851, 1000));
        assert!(!worth_counting(600, 1000) && worth_counting(601, 1000));
    }

    #[test]
    fn the_history_note_quotes_at_most_its_limit() {
        for (length, quoted) in
            [(SUMMARY_QUOTE_CHARS, SUMMARY_QUOTE_CHARS), (SUMMARY_QUOTE_CHARS + 1, SUMMARY_QUOTE_CHARS)]
        {
            let first = "q".repeat(length);
            let mut base = vec![ChatMessage::new(Role::User, first), ChatMessage::new(Role::User, "Latest.")];
            let note = demote_oldest_turn(&mut base).unwrap();
            assert!(note.contains(&format!("“{}”", "q".repeat(quoted))), "{note}");
        }
    }

    #[test]
    fn parts_are_told_apart() {
        let base = vec![
            ChatMessage::new(Role::System, format!("{}{}", "S".repeat(400), "B".repeat(40))),
            ChatMessage::new(Role::User, "hi"),
        ];
        let parts = account(&base, &loop_history(), &[], 400);
        assert_eq!(parts.skills, 100);
        assert_eq!(parts.system, 10);
        assert_eq!(parts.skill_bodies, 100);
        assert_eq!(parts.tool_results, 400);
        // "hi" and the three calls.
        assert!(parts.history > 0 && parts.history < 30, "{parts:?}");
        let scaled = parts.scaled_to(1000);
        assert_eq!(scaled.total(), 1000);
    }

    #[test]
    fn old_results_go_first_newest_first_and_never_the_latest_round() {
        let mut base = vec![ChatMessage::new(Role::User, "go")];
        let mut history = loop_history();
        let note = demote_one(&mut base, &mut history, None).unwrap();
        assert_eq!(
            note,
            "[Result left out to save context: read_file({\"path\":\"one.txt\"}) from round 2 returned 800 bytes. Make the call again if you need it.]"
        );
        assert_eq!(history[3].content, note);
        assert_eq!(history[5].content.len(), 800, "the latest round's result stays");
        // Next: the skill's instructions (idle since round 1, two rounds ago).
        let note = demote_one(&mut base, &mut history, None).unwrap();
        assert!(note.starts_with(BODY_NOTE), "{note}");
        assert!(note.contains("skills_read(skill=\"notes\", path=\"SKILL.md\")"), "{note}");
        // Then nothing but the history, and the latest user message stays.
        assert_eq!(demote_one(&mut base, &mut history, None), None);
        assert_eq!(base.len(), 1);
    }

    #[test]
    fn a_skill_used_lately_keeps_its_instructions() {
        let mut history = loop_history();
        // Round 3 runs a script of the skill: it is in use.
        history[4].tool_calls.push(call("d", "skills_run", r#"{"skill":"notes","path":"x.py"}"#));
        let mut base = vec![ChatMessage::new(Role::User, "go")];
        demote_one(&mut base, &mut history, None);
        assert_eq!(demote_idle_body(&mut history, None), None);
        // At IDLE_SKILL_ROUNDS - 1 rounds idle it stays; at the limit it goes.
        let mut history = loop_history();
        history.truncate(4);
        assert_eq!(demote_idle_body(&mut history, None), None, "idle one round");
        let mut history = loop_history();
        assert!(demote_idle_body(&mut history, None).is_some(), "idle two rounds");
    }

    #[test]
    fn the_oldest_turns_go_with_one_note_and_the_latest_user_message_stays() {
        let mut base = vec![
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "First question about apples."),
            ChatMessage::new(Role::Assistant, "Apples are red."),
            ChatMessage::new(Role::User, "Second question."),
            ChatMessage::new(Role::Assistant, "Second answer."),
            ChatMessage::new(Role::User, "Latest question."),
        ];
        let note = demote_oldest_turn(&mut base).unwrap();
        assert_eq!(base.len(), 4);
        assert_eq!(note, "[Earlier turns left out to fit the context: 2 messages, 43 bytes. The conversation began: “First question about apples.”. Ask the user if you need what was said there.]");
        assert_eq!(base[0].content, format!("Be brief.\n\n{note}"));
        // A second step counts both, quoting the first turn still.
        let note = demote_oldest_turn(&mut base).unwrap();
        assert!(note.contains("4 messages, 73 bytes"), "{note}");
        assert!(note.contains("“First question about apples.”"), "{note}");
        assert_eq!(base.len(), 2);
        assert_eq!(base[1].content, "Latest question.");
        assert_eq!(base[0].content.matches(HISTORY_NOTE).count(), 1);
        assert_eq!(demote_oldest_turn(&mut base), None);
    }
}
