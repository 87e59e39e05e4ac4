//! Ending a reply of several tool calls where the model starts repeating one.
//!
//! A grammar that allows a list of calls lets a small model write the same
//! call again and again until the list's cap: a client would run its tool
//! that many times, and every repeat costs decode steps. [`RepeatWatch`] sits
//! after the text stream of such a reply. Once a call is complete, the
//! separator followed by that same call is held back while it is being
//! written; when it is whole, the reply ends there, closed as the grammar
//! would have closed it.

use crate::format::GrammarSpec;

/// What one push let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Watched {
    /// Text safe to pass on now (possibly empty).
    Text(String),
    /// The model repeated a call: pass this text on and end the reply.
    Repeated(String),
}

/// Watches the text of a reply held to a list of calls (a [`GrammarSpec`]
/// with `repeat`). The calls are JSON objects between `open`, `separator`s
/// and `close`.
#[derive(Debug)]
pub struct RepeatWatch {
    open: String,
    separator: String,
    close: String,
    /// Everything received.
    text: String,
    /// Bytes of `text` passed on.
    released: usize,
    /// Where the list starts (after `open`), once it was seen.
    list_start: Option<usize>,
    /// Bytes of `text` the scanner has read.
    scanned: usize,
    scan: Scan,
    /// The calls completed so far, as byte ranges of `text`.
    calls: Vec<std::ops::Range<usize>>,
}

/// The state of a small JSON scanner that only tells where top-level
/// objects start and end (strings and escapes are tracked so braces inside
/// them do not count).
#[derive(Debug, Default)]
struct Scan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    start: usize,
}

impl RepeatWatch {
    /// A watch for replies held to `spec`; `None` when the grammar allows
    /// a single value only.
    pub fn new(spec: &GrammarSpec) -> Option<RepeatWatch> {
        spec.repeat.then(|| RepeatWatch {
            open: spec.open.clone(),
            separator: spec.separator.clone(),
            close: spec.close.clone(),
            text: String::new(),
            released: 0,
            list_start: None,
            scanned: 0,
            scan: Scan::default(),
            calls: Vec::new(),
        })
    }

    /// Adds text from the stream.
    pub fn push(&mut self, delta: &str) -> Watched {
        self.text.push_str(delta);
        if self.list_start.is_none() {
            // In a lazy grammar, free text comes first; the list starts
            // after `open` (empty when the grammar holds from the start).
            self.list_start = self.text.find(self.open.as_str()).map(|at| at + self.open.len());
            self.scanned = self.list_start.unwrap_or(0);
        }
        if self.list_start.is_some() {
            self.scan_new();
        }
        if let Some(at) = self.repeat_at() {
            let out = format!("{}{}", &self.text[self.released..at], self.close);
            self.released = self.text.len();
            return Watched::Repeated(out);
        }
        let keep = self.held_back();
        let until = self.text.len() - keep;
        let out = self.text[self.released..until].to_string();
        self.released = until;
        Watched::Text(out)
    }

    /// Ends the stream: what was held back is released.
    pub fn finish(&mut self) -> String {
        let out = self.text[self.released..].to_string();
        self.released = self.text.len();
        out
    }

    /// Reads the bytes not scanned yet, recording each completed object.
    fn scan_new(&mut self) {
        let bytes = self.text.as_bytes();
        for (at, &byte) in bytes.iter().enumerate().skip(self.scanned) {
            let scan = &mut self.scan;
            if scan.in_string {
                match byte {
                    _ if scan.escaped => scan.escaped = false,
                    b'\\' => scan.escaped = true,
                    b'"' => scan.in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' if scan.depth > 0 => scan.in_string = true,
                b'{' => {
                    if scan.depth == 0 {
                        scan.start = at;
                    }
                    scan.depth += 1;
                }
                b'}' if scan.depth > 0 => {
                    scan.depth -= 1;
                    if scan.depth == 0 {
                        self.calls.push(scan.start..at + 1);
                    }
                }
                _ => {}
            }
        }
        self.scanned = bytes.len();
    }

    /// The start of a separator followed by a call equal to an earlier one.
    fn repeat_at(&self) -> Option<usize> {
        let (last, earlier) = self.calls.split_last()?;
        let call = &self.text[last.clone()];
        let separator_at = last.start.checked_sub(self.separator.len())?;
        let repeated = self.text[separator_at..last.start] == self.separator
            && earlier.iter().any(|range| &self.text[range.clone()] == call);
        (repeated && separator_at >= self.released).then_some(separator_at)
    }

    /// How many trailing bytes could still become a separator and a repeat
    /// of a completed call.
    fn held_back(&self) -> usize {
        let pending = &self.text[self.released..];
        let mut best = 0;
        for range in &self.calls {
            // Only what follows the call itself can repeat it.
            let after = range.end.max(self.released);
            let tail = &self.text[after..];
            let repeat = format!("{}{}", self.separator, &self.text[range.clone()]);
            for len in (best + 1..=tail.len().min(repeat.len())).rev() {
                let start = tail.len() - len;
                if tail.is_char_boundary(start) && repeat.starts_with(&tail[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best.min(pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn hermes() -> RepeatWatch {
        RepeatWatch::new(&GrammarSpec {
            schema: json!({"type": "object"}),
            open: "<tool_call>\n".into(),
            separator: "\n</tool_call>\n<tool_call>\n".into(),
            close: "\n</tool_call>".into(),
            repeat: true,
            trigger: Some("<tool_call>".into()),
        })
        .expect("a list grammar is watched")
    }

    /// Feeds `pieces` one at a time; returns what came out and whether it
    /// ended as a repeat.
    fn run(pieces: &[&str]) -> (String, bool) {
        let mut watch = hermes();
        let mut out = String::new();
        for piece in pieces {
            match watch.push(piece) {
                Watched::Text(text) => out.push_str(&text),
                Watched::Repeated(text) => {
                    out.push_str(&text);
                    return (out, true);
                }
            }
        }
        out.push_str(&watch.finish());
        (out, false)
    }

    fn chars(text: &str) -> Vec<String> {
        text.chars().map(String::from).collect()
    }

    #[test]
    fn a_repeated_call_ends_the_reply_closed_and_unrepeated() {
        let call = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let text = format!("<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{call}");
        let pieces = chars(&text);
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(run(&pieces), (format!("<tool_call>\n{call}\n</tool_call>"), true));
    }

    #[test]
    fn distinct_calls_pass_and_a_shared_prefix_is_released() {
        let paris = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let parma = r#"{"name": "get_weather", "arguments": {"city": "Parma"}}"#;
        let text = format!("Let me look.<tool_call>\n{paris}\n</tool_call>\n<tool_call>\n{parma}\n</tool_call>");
        let pieces = chars(&text);
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(run(&pieces), (text.clone(), false));
        // The same in one piece, and a call whose strings hold braces.
        assert_eq!(run(&[&text]), (text, false));
        let braces = r#"{"name": "f", "arguments": {"q": "}{\"}"}}"#;
        let twice = format!("<tool_call>\n{braces}\n</tool_call>\n<tool_call>\n{braces}");
        assert_eq!(run(&[&twice]), (format!("<tool_call>\n{braces}\n</tool_call>"), true));
    }

    #[test]
    fn text_before_the_list_is_not_read_as_calls() {
        let mut watch = RepeatWatch::new(&GrammarSpec {
            schema: json!({"type": "object"}),
            open: "[TOOL_CALLS][".into(),
            separator: ", ".into(),
            close: "]".into(),
            repeat: true,
            trigger: Some("[TOOL_CALLS]".into()),
        })
        .expect("a list grammar is watched");
        // Free text that looks like a repeat is the model's answer, not calls.
        let text = r#"Like {"a": 1}, {"a": 1} here. [TOOL_CALLS][{"a": 1}, {"b": 2}"#;
        assert_eq!(watch.push(text), Watched::Text(text.into()));
        assert_eq!(watch.push(r#", {"a": 1}"#), Watched::Repeated("]".into()));
    }

    #[test]
    fn a_single_value_grammar_is_not_watched() {
        let spec = GrammarSpec {
            schema: json!({"type": "object"}),
            open: String::new(),
            separator: String::new(),
            close: String::new(),
            repeat: false,
            trigger: None,
        };
        assert!(RepeatWatch::new(&spec).is_none());
    }
}
