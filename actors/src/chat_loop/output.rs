//! Splits generated text into what can be streamed as content right away and
//! the tool calls read at the end of the round.

use rand::distr::{Alphanumeric, SampleString};
use skillhost_engine::{ToolCall, ToolFamily};

use super::reasoning::{ReasoningSplit, Split};
use crate::tools::router::same_arguments;

/// Length of the random part of a generated call id (`call_` + 24 characters).
pub const CALL_ID_LEN: usize = 24;

/// Collects one round's output.
#[derive(Debug)]
pub struct RoundOutput {
    /// The parser, when the request offered tools.
    family: Option<ToolFamily>,
    declared: Vec<String>,
    /// Everything the model wrote, thinking included.
    full: String,
    think: ReasoningSplit,
    /// The answer part, read for tool calls.
    answer: String,
    /// Bytes of `answer` already sent as content.
    streamed: usize,
    /// Whether this round has sent any content (rounds are separated by a
    /// blank line when they both have some).
    content_started: bool,
    /// Calls that came as data (an upstream in chat mode), not as text.
    given_calls: Vec<ToolCall>,
    /// The round's content without call markup, once finished.
    content: String,
}

/// The end of a round: the last content delta and the calls.
#[derive(Debug, PartialEq)]
pub struct RoundEnd {
    pub reasoning_delta: String,
    pub content_delta: String,
    pub calls: Vec<ToolCall>,
    /// The call the round was cut short in (only for a round that ran out
    /// of tokens), with the arguments so far.
    pub cut: Option<ToolCall>,
    pub diagnostics: Vec<String>,
}

impl RoundOutput {
    /// `thinking`: the prompt left the model inside a `<think>` block.
    pub fn new(family: Option<ToolFamily>, declared: Vec<String>, thinking: bool) -> Self {
        RoundOutput {
            family,
            declared,
            full: String::new(),
            think: ReasoningSplit::new(thinking),
            answer: String::new(),
            streamed: 0,
            content_started: false,
            given_calls: Vec::new(),
            content: String::new(),
        }
    }

    /// Adds generated text; returns the reasoning and the content that are
    /// safe to send now.
    pub fn push(&mut self, delta: &str) -> Split {
        self.full.push_str(delta);
        let Split { reasoning, content } = self.think.push(delta);
        self.answer.push_str(&content);
        let safe = match self.family {
            None => self.answer.len(),
            Some(family) => family.parser().content_prefix_len(&self.answer),
        };
        if safe <= self.streamed {
            return Split { reasoning, content: String::new() };
        }
        let out = self.answer[self.streamed..safe].to_string();
        self.streamed = safe;
        Split { reasoning, content: out }
    }

    pub fn content_started(&self) -> bool {
        self.content_started
    }

    pub fn set_content_started(&mut self, started: bool) {
        self.content_started = started;
    }

    /// Adds calls an upstream returned as data; they follow any read from
    /// the text, and keep their ids unless two collide.
    pub fn push_calls(&mut self, calls: Vec<ToolCall>) {
        self.given_calls.extend(calls);
    }

    /// The round's content, call markup left out (after [`Self::finish`]).
    pub fn content(&self) -> &str {
        &self.content
    }

    /// Everything the model wrote this round, thinking included.
    pub fn raw(&self) -> &str {
        &self.full
    }

    /// Reads the calls and returns the content not yet streamed, so the
    /// streamed text always adds up to the final content. `cut`: the round
    /// ran out of tokens, so its last call may be unfinished.
    pub fn finish(&mut self, cut: bool) -> RoundEnd {
        let Split { reasoning: reasoning_delta, content } = self.think.finish();
        self.answer.push_str(&content);
        let given = std::mem::take(&mut self.given_calls);
        let Some(family) = self.family else {
            let content_delta = self.answer[self.streamed..].to_string();
            self.streamed = self.answer.len();
            self.content = self.answer.clone();
            let calls = distinct(unique_ids(Vec::new(), given));
            return RoundEnd { reasoning_delta, content_delta, calls, cut: None, diagnostics: Vec::new() };
        };
        let declared: Vec<&str> = self.declared.iter().map(String::as_str).collect();
        let parser = family.parser();
        let cut_call = cut.then(|| parser.cut_call(&self.answer, &declared)).flatten();
        // The markup of a cut call is neither content nor a whole call.
        let whole = cut_call.as_ref().map_or(self.answer.as_str(), |c| self.answer[..c.start].trim_end());
        let parsed = parser.parse(whole, &declared);
        let streamed = &self.answer[..self.streamed];
        let mut diagnostics = parsed.diagnostics;
        let content_delta = match parsed.content.strip_prefix(streamed) {
            Some(rest) => rest.to_string(),
            None => {
                diagnostics.push("the parsed content does not continue the streamed text".into());
                String::new()
            }
        };
        self.streamed = self.answer.len();
        self.content = parsed.content;
        let mut calls: Vec<ToolCall> = Vec::with_capacity(parsed.calls.len());
        for call in parsed.calls {
            // Keep the model's own id when it is unique; otherwise make one.
            let id = match call.id {
                Some(id) if !calls.iter().any(|c| c.id == id) => id,
                _ => new_call_id(),
            };
            calls.push(ToolCall { id, name: call.name, arguments: call.arguments });
        }
        let calls = distinct(unique_ids(calls, given));
        let cut = cut_call.map(|c| ToolCall { id: new_call_id(), name: c.call.name, arguments: c.call.arguments });
        RoundEnd { reasoning_delta, content_delta, calls, cut, diagnostics }
    }
}

/// `calls` without exact repeats (the same tool with the same arguments):
/// a small model allowed several calls can write one call again and again,
/// and neither the client nor the loop should run it twice.
fn distinct(calls: Vec<ToolCall>) -> Vec<ToolCall> {
    let mut kept: Vec<ToolCall> = Vec::with_capacity(calls.len());
    for call in calls {
        if !kept.iter().any(|k| k.name == call.name && same_arguments(&k.arguments, &call.arguments)) {
            kept.push(call);
        }
    }
    kept
}

/// `calls` followed by `more`, each of `more` keeping its id when it is
/// unique and not empty.
fn unique_ids(mut calls: Vec<ToolCall>, more: Vec<ToolCall>) -> Vec<ToolCall> {
    for mut call in more {
        if call.id.is_empty() || calls.iter().any(|c| c.id == call.id) {
            call.id = new_call_id();
        }
        calls.push(call);
    }
    calls
}

/// A fresh call id, unique with overwhelming probability.
pub fn new_call_id() -> String {
    format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), CALL_ID_LEN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// Streams `pieces` and returns (streamed content, final delta, call names).
    fn run(family: Option<ToolFamily>, pieces: &[&str]) -> (Vec<String>, String, Vec<String>) {
        let mut output = RoundOutput::new(family, vec!["get_weather".into()], false);
        let streamed: Vec<String> = pieces.iter().map(|p| output.push(p).content).collect();
        let end = output.finish(false);
        (streamed, end.content_delta, end.calls.into_iter().map(|c| c.name).collect())
    }

    /// (parser, pieces pushed) -> (content streamed per piece, last delta, call names)
    type Case<'a> = (Option<ToolFamily>, Vec<&'a str>, (Vec<&'a str>, &'a str, Vec<&'a str>));

    #[test]
    fn streaming_adds_up_to_the_final_content() {
        let cases: Vec<Case> = vec![
            (None, vec!["Hel", "lo"], (vec!["Hel", "lo"], "", vec![])),
            (Some(ToolFamily::Generic), vec!["Par", "is."], (vec!["Par", "is."], "", vec![])),
            (
                Some(ToolFamily::Generic),
                vec!["Sure.\n<tool", "_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"],
                (vec!["Sure.", ""], "", vec!["get_weather"]),
            ),
            // Trailing whitespace is held and released when no call follows.
            (Some(ToolFamily::Hermes), vec!["Hi ", "there "], (vec!["Hi", " there"], " ", vec![])),
        ];
        for (family, pieces, (streamed, delta, calls)) in cases {
            let (got_streamed, got_delta, got_calls) = run(family, &pieces);
            assert_eq!(
                (got_streamed, got_delta, got_calls),
                (
                    streamed.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                    delta.to_string(),
                    calls.iter().map(|s| s.to_string()).collect::<Vec<_>>()
                ),
                "{pieces:?}"
            );
        }
    }

    #[test]
    fn thinking_streams_apart_and_its_calls_are_not_read() {
        let mut output = RoundOutput::new(Some(ToolFamily::Hermes), vec!["get_weather".into()], false);
        let drafted = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
        let first = output.push(&format!("<think>Maybe {drafted}"));
        assert_eq!(first.reasoning, format!("Maybe {drafted}"));
        assert_eq!(first.content, "");
        let second = output.push("</think>\nNo call needed.");
        assert_eq!(second.content, "No call needed.");
        let end = output.finish(false);
        assert!(end.calls.is_empty());
        assert_eq!(output.raw(), format!("<think>Maybe {drafted}</think>\nNo call needed."));
    }

    #[test]
    fn a_round_keeps_one_of_each_repeated_call() {
        let mut output = RoundOutput::new(Some(ToolFamily::Hermes), vec!["get_weather".into()], false);
        let call = |city: &str, spaced: bool| {
            let args = if spaced { format!("{{ \"city\" : \"{city}\" }}") } else { format!("{{\"city\":\"{city}\"}}") };
            format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n")
        };
        output.push(&format!(
            "{}{}{}{}",
            call("Paris", false),
            call("Paris", true),
            call("Rome", false),
            call("Paris", false)
        ));
        let end = output.finish(false);
        let args: Vec<&str> = end.calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(args, vec![r#"{"city":"Paris"}"#, r#"{"city":"Rome"}"#]);
        // Calls an upstream returned as data are held to the same rule.
        let mut output = RoundOutput::new(None, Vec::new(), false);
        let given = |id: &str| ToolCall { id: id.into(), name: "f".into(), arguments: "{}".into() };
        output.push_calls(vec![given("a"), given("b")]);
        assert_eq!(output.finish(false).calls.len(), 1);
    }

    #[test]
    fn a_cut_round_returns_its_unfinished_call_apart() {
        let text = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa";
        let mut output = RoundOutput::new(Some(ToolFamily::Hermes), vec!["get_weather".into()], false);
        let streamed = output.push(text).content;
        let end = output.finish(true);
        assert_eq!(format!("{streamed}{}", end.content_delta), "Checking.");
        assert!(end.calls.is_empty() && end.diagnostics.is_empty(), "{:?}", end.diagnostics);
        let cut = end.cut.expect("the cut call");
        assert_eq!((cut.name.as_str(), cut.arguments.as_str()), ("get_weather", "{\"city\": \"Pa"));
        // The same text, not cut by the budget, is a broken call and nothing more.
        let mut output = RoundOutput::new(Some(ToolFamily::Hermes), vec!["get_weather".into()], false);
        output.push(text);
        let end = output.finish(false);
        assert!(end.cut.is_none() && end.calls.is_empty() && end.diagnostics.len() == 1);
    }

    #[test]
    fn call_ids_are_unique_and_non_empty() {
        let mut output = RoundOutput::new(Some(ToolFamily::Mistral), vec![], false);
        output.push(r#"[TOOL_CALLS][{"name": "a", "arguments": {}, "id": "x"}, {"name": "b", "arguments": {}, "id": "x"}, {"name": "c", "arguments": {}}]"#);
        let ids: Vec<String> = output.finish(false).calls.into_iter().map(|c| c.id).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids[0], "x");
        assert!(ids[1].starts_with("call_") && ids[1].len() == 5 + CALL_ID_LEN);
        assert!(ids[1] != ids[2]);
    }
}
