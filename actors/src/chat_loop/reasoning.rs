//! Separates a reasoning model's thinking from its answer as the text
//! streams: a `<think>…</think>` block at the start of a round (or a round
//! whose prompt already opened one) is reasoning; the rest is content.
//! Tool calls are looked for in the content only, so a call the model
//! drafts while thinking is never run.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace yet: an opening tag may still come.
    Start,
    Thinking,
    /// Just closed: the whitespace between the block and the answer is dropped.
    Closed,
    Answer,
}

/// Text of one round, split as it arrives.
#[derive(Debug)]
pub struct ReasoningSplit {
    phase: Phase,
    /// Text held back because it may be the start of a tag.
    pending: String,
}

/// What one piece of text turned out to be.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// How many bytes at the end of `text` could begin `tag`.
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

impl ReasoningSplit {
    /// `thinking`: the prompt ends inside an open `<think>` block.
    pub fn new(thinking: bool) -> Self {
        ReasoningSplit { phase: if thinking { Phase::Thinking } else { Phase::Start }, pending: String::new() }
    }

    pub fn push(&mut self, delta: &str) -> Split {
        self.pending.push_str(delta);
        let mut split = Split::default();
        loop {
            match self.phase {
                Phase::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.pending = rest.to_string();
                        self.phase = Phase::Thinking;
                    } else if OPEN.starts_with(trimmed) {
                        return split;
                    } else {
                        self.phase = Phase::Answer;
                    }
                }
                Phase::Thinking => match self.pending.find(CLOSE) {
                    Some(at) => {
                        split.reasoning.push_str(&self.pending[..at]);
                        self.pending = self.pending[at + CLOSE.len()..].to_string();
                        self.phase = Phase::Closed;
                    }
                    None => {
                        let keep = partial_tag_len(&self.pending, CLOSE);
                        let cut = self.pending.len() - keep;
                        split.reasoning.push_str(&self.pending[..cut]);
                        self.pending.drain(..cut);
                        return split;
                    }
                },
                Phase::Closed => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        self.pending.clear();
                        return split;
                    }
                    self.pending = trimmed.to_string();
                    self.phase = Phase::Answer;
                }
                Phase::Answer => {
                    split.content.push_str(&self.pending);
                    self.pending.clear();
                    return split;
                }
            }
        }
    }

    /// What is still held back, at the end of the round.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        match self.phase {
            Phase::Thinking => Split { reasoning: rest, content: String::new() },
            Phase::Closed => Split::default(),
            Phase::Start | Phase::Answer => Split { reasoning: String::new(), content: rest },
        }
    }
}

/// Whether a rendered prompt leaves the model inside an open thinking block.
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    let tail = prompt.trim_end();
    tail.ends_with(OPEN) && tail.rfind(OPEN) > tail.rfind(CLOSE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// Feeds `pieces` one by one; returns all reasoning and all content.
    fn split(thinking: bool, pieces: &[&str]) -> (String, String) {
        let mut splitter = ReasoningSplit::new(thinking);
        let (mut reasoning, mut content) = (String::new(), String::new());
        for piece in pieces {
            let part = splitter.push(piece);
            reasoning.push_str(&part.reasoning);
            content.push_str(&part.content);
        }
        let part = splitter.finish();
        (reasoning + &part.reasoning, content + &part.content)
    }

    #[test]
    fn thinking_and_answer_in_any_pieces() {
        let text = "<think>\nThe user wants Paris.\n</think>\n\nParis.";
        // Every way of cutting the text in two gives the same split.
        for at in 0..=text.len() {
            let (a, b) = text.split_at(at);
            assert_eq!(
                split(false, &[a, b]),
                ("\nThe user wants Paris.\n".to_string(), "Paris.".to_string()),
                "cut at {at}"
            );
        }
        let cases: [(bool, &[&str], (&str, &str)); 7] = [
            (false, &["Plain ", "answer."], ("", "Plain answer.")),
            (false, &["  <th", "ink>a</th", "ink>b"], ("a", "b")),
            (false, &["<", "b>bold</b>"], ("", "<b>bold</b>")),
            (false, &["Text <think>not at the start</think>"], ("", "Text <think>not at the start</think>")),
            (true, &["still thinking</think>Answer"], ("still thinking", "Answer")),
            (true, &["cut off mid-thought </thi"], ("cut off mid-thought </thi", "")),
            (false, &["<think>only thoughts</think>\n\n"], ("only thoughts", "")),
        ];
        for (thinking, pieces, (reasoning, content)) in cases {
            assert_eq!(split(thinking, pieces), (reasoning.to_string(), content.to_string()), "{pieces:?}");
        }
    }

    #[test]
    fn multibyte_text_near_a_tag_is_kept_whole() {
        assert_eq!(split(true, &["é</", "think>ü"]), ("é".to_string(), "ü".to_string()));
        assert_eq!(partial_tag_len("é", CLOSE), 0);
    }

    #[test]
    fn prompts_that_open_a_block() {
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking("<think>old</think><|im_start|>assistant\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n"));
    }
}
