//! Speculative decoding from the context ("prompt lookup"): no draft model.
//! A sequence's last few tokens are looked up in what it already holds (its
//! prompt and its output); when they occurred before, the tokens that
//! followed them then are the draft. The executor decodes the draft with
//! the sequence's next token in the same batch and samples each position in
//! turn, keeping drafted tokens while the sampled token equals the draft.
//!
//! Sampling and comparing keeps the output exact: a draft is one fixed
//! token, so "keep it when the sampler picks it, else take what the sampler
//! picked" yields each token with the sampler's own probability, greedy or
//! not (the general rule, accept with probability min(1, p/q), reduces to
//! this when q is 1 on the drafted token).
//!
//! Agent turns copy a lot (a file rewritten with one change, a patch whose
//! context lines repeat the file, a tool result quoted back), where drafts
//! are long and mostly kept. Prose repeats short runs ("of the", ", and")
//! whose continuations rarely repeat, so a sequence that is not copying
//! drafts only from a longer run, longer still while other streams share
//! the step; and a sequence whose drafts keep failing stops drafting for a
//! while, doubling the pause each time, so the cost of verifying drafts
//! that fail stays small.

/// Most tokens drafted in one step for one sequence.
pub const MAX_DRAFT: usize = 16;
/// Tokens one step may hold with its drafts: drafts only fill a batch up
/// to this. A lone stream may draft its longest draft; with several, the
/// streams' own tokens take places first. On two CPU cores with the 135M
/// model each position past the first costs about 0.35 to 0.55 of a
/// one-position step, by host (`skillhost-bench steps`), so a lone
/// stream's draft pays while more than that share of its tokens is kept;
/// lookup pauses a sequence whose drafts keep failing.
pub const MAX_STEP_TOKENS_WITH_DRAFTS: usize = MAX_DRAFT + 1;
/// The draft length a sequence starts with, and returns to after a pause.
pub const START_DRAFT: usize = 4;
/// The longest run looked up; a longer match is tried first, as it
/// predicts better. Long enough to tell apart places in text that repeats a
/// pattern with small changes (a file of similar functions): a run of 4
/// ends the same in each of them and drafts what followed the latest one,
/// where the copy follows another.
pub const MAX_NGRAM: usize = 12;
/// The shortest run looked up by a sequence that is copying (its last
/// draft had a token kept): after a change in the copy (a renamed name), a
/// run of 2 finds where the copy goes on.
pub const MIN_NGRAM: usize = 2;
/// The shortest run a sequence that is not copying (no draft yet, or its
/// last draft kept nothing) drafts from when it decodes alone. In the
/// baseline's 128-token stories, drafts from runs of 2 and 3 were mostly
/// wrong (15 of 63 drafted tokens kept); from runs of 4, 6 of 30, while
/// the copy-heavy turn starts copying as soon (`skillhost-bench
/// lookup-engine`, docs/benchmarks.md).
pub const COLD_MIN_NGRAM: usize = 4;
/// The same while other streams share the step: a drafted position there
/// costs every stream in the step, and a kept one gains only its own, so a
/// draft must be likelier to be kept. With 4 and 8 streams of stories,
/// runs of 2 drafted 260 and 485 tokens of which 50 and 95 were kept; runs
/// of 6, 16 each, while copying streams among prose streams kept 93% of
/// their drafts.
pub const CROWDED_COLD_MIN_NGRAM: usize = 6;
/// Drafts in a row with nothing kept after which a sequence pauses.
pub const MISSES_BEFORE_PAUSE: u32 = 4;
/// The first pause, in steps; each pause after a failed retry doubles, up
/// to [`MAX_PAUSE_STEPS`].
pub const FIRST_PAUSE_STEPS: u32 = 16;
pub const MAX_PAUSE_STEPS: u32 = 512;

/// One sequence's drafting state.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// Tokens to draft next time a match is found.
    length: usize,
    /// Drafts in a row of which nothing was kept.
    misses: u32,
    /// Steps left before drafting again.
    paused: u32,
    /// The next pause's length.
    next_pause: u32,
    /// Whether the last draft had a token kept: the sequence is copying.
    copying: bool,
    /// Tokens drafted and kept, for the request's timings.
    pub drafted: usize,
    pub accepted: usize,
}

impl Default for Lookup {
    fn default() -> Self {
        Lookup {
            length: START_DRAFT,
            misses: 0,
            paused: 0,
            next_pause: FIRST_PAUSE_STEPS,
            copying: false,
            drafted: 0,
            accepted: 0,
        }
    }
}

impl Lookup {
    /// The draft that follows `history` then `next` (the token about to be
    /// decoded), at most `room` tokens, in a step that decodes `streams`
    /// sequences; empty while paused or without a match.
    pub fn draft<T: Copy + PartialEq>(&mut self, history: &[T], next: T, room: usize, streams: usize) -> Vec<T> {
        if self.paused > 0 {
            self.paused -= 1;
            return Vec::new();
        }
        let limit = self.length.min(room);
        if limit == 0 {
            return Vec::new();
        }
        let shortest = match (self.copying, streams > 1) {
            (true, _) => MIN_NGRAM,
            (false, false) => COLD_MIN_NGRAM,
            (false, true) => CROWDED_COLD_MIN_NGRAM,
        };
        (shortest..=MAX_NGRAM).rev().find_map(|n| continuation(history, next, n, limit)).unwrap_or_default()
    }

    /// Takes in how a draft of `drafted` tokens fared: `accepted` of them
    /// were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafted += drafted;
        self.accepted += accepted;
        self.copying = accepted > 0;
        if accepted == drafted {
            self.length = (self.length * 2).min(MAX_DRAFT);
            self.misses = 0;
            self.next_pause = FIRST_PAUSE_STEPS;
        } else if accepted > 0 {
            self.length = (accepted + 1).clamp(1, MAX_DRAFT);
            self.misses = 0;
        } else {
            self.length = (self.length / 2).max(1);
            self.misses += 1;
            if self.misses >= MISSES_BEFORE_PAUSE {
                self.paused = self.next_pause;
                self.next_pause = (self.next_pause * 2).min(MAX_PAUSE_STEPS);
                self.misses = 0;
                self.length = START_DRAFT;
            }
        }
    }
}

/// The up to `limit` tokens that followed the latest earlier occurrence of
/// the last `n` tokens of `history` + `next`.
fn continuation<T: Copy + PartialEq>(history: &[T], next: T, n: usize, limit: usize) -> Option<Vec<T>> {
    let len = history.len() + 1;
    if len <= n {
        return None;
    }
    let at = |i: usize| if i < history.len() { history[i] } else { next };
    let key = len - n;
    // Latest first: the most recent repeat is the likeliest to go on. The
    // match itself may overlap the key, but must leave a token after it.
    (0..key).rev().find(|&start| (0..n).all(|i| at(start + i) == at(key + i))).and_then(|start| {
        let from = start + n;
        let end = (from + limit).min(len);
        (from < end).then(|| (from..end).map(at).collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<char> {
        text.chars().collect()
    }

    /// A sequence whose last draft had a token kept.
    fn copying() -> Lookup {
        Lookup { copying: true, ..Lookup::default() }
    }

    #[test]
    fn a_repeated_run_drafts_what_followed_it_last_time() {
        let mut lookup = copying();
        // "abcdXabc" then "d": "abcd" was seen at the start, followed by
        // "Xabcd" (the cycle goes on), of which a fresh sequence drafts 4.
        assert_eq!(lookup.draft(&split("abcdXabc"), 'd', 16, 1), split("Xabc"));
        // The latest occurrence wins over an earlier one: "ab" was followed
        // by X, then by Y.
        assert_eq!(lookup.draft(&split("abXabYa"), 'b', 1, 1), split("Y"));
        // Nothing repeats: nothing is drafted; a lone repeated token is not enough.
        assert!(lookup.draft(&split("abcdefg"), 'h', 16, 1).is_empty());
        assert!(lookup.draft(&split("xay"), 'a', 16, 1).is_empty());
        // Room bounds the draft.
        assert_eq!(lookup.draft(&split("abcdefab"), 'c', 2, 1), split("de"));
        assert!(lookup.draft(&split("abcab"), 'c', 0, 1).is_empty());
    }

    #[test]
    fn a_copy_of_similar_lines_drafts_from_the_line_it_is_copying() {
        // The prompt holds two lines that differ only at their ends; the
        // output has copied the first and most of the second. The last
        // four tokens ("cdef") were last seen in the output's first line,
        // followed by "Q"; the longest run that recurs ("P2abcdef") is the
        // second line's, followed by "R".
        let mut lookup = Lookup::default();
        let history = split("P1abcdefQP2abcdefR P1abcdefQP2abcde");
        assert_eq!(lookup.draft(&history, 'f', 2, 1), split("R "));
    }

    #[test]
    fn a_sequence_not_copying_drafts_from_longer_runs_and_longer_still_beside_other_streams() {
        // Runs of 3 ("abc"), 4 ("abcd") and 6 ("abcdef") recur.
        let (three, four, six) = (split("abc-ab"), split("abcdefg-abc"), split("abcdefgh-abcde"));
        let mut lookup = Lookup::default();
        assert_eq!(COLD_MIN_NGRAM, 4);
        assert!(lookup.draft(&three, 'c', 16, 1).is_empty(), "a run of 3 is not enough alone");
        assert_eq!(lookup.draft(&four, 'd', 16, 1), split("efg-"), "a run of 4 is, alone");
        assert_eq!(CROWDED_COLD_MIN_NGRAM, 6);
        assert!(lookup.draft(&four, 'd', 16, 2).is_empty(), "beside another stream a run of 4 is not");
        assert!(lookup.draft(&split("abcdefg-abcd"), 'e', 16, 2).is_empty(), "nor one of 5");
        assert_eq!(lookup.draft(&six, 'f', 16, 8), split("gh-a"), "a run of 6 is");
        // A draft with a token kept makes it a copy: runs of 2 will do,
        // however many streams share the step.
        lookup.record(4, 1);
        assert_eq!(lookup.draft(&three, 'c', 16, 8), split("-a"));
        assert_eq!(lookup.draft(&split("xyzaby"), 'z', 16, 8), split("ab"));
        // A draft with nothing kept ends the copy.
        lookup.record(2, 0);
        assert!(lookup.draft(&three, 'c', 16, 1).is_empty());
    }

    #[test]
    fn the_draft_grows_while_kept_and_pauses_after_misses() {
        let mut lookup = Lookup::default();
        lookup.record(START_DRAFT, START_DRAFT);
        assert_eq!(lookup.length, START_DRAFT * 2);
        for _ in 0..4 {
            lookup.record(lookup.length, lookup.length);
        }
        assert_eq!(lookup.length, MAX_DRAFT);
        lookup.record(MAX_DRAFT, 3);
        assert_eq!(lookup.length, 4);
        for _ in 0..MISSES_BEFORE_PAUSE {
            lookup.record(2, 0);
        }
        let history = split("abcdeabcd");
        for _ in 0..FIRST_PAUSE_STEPS {
            assert!(lookup.draft(&history, 'e', 16, 1).is_empty(), "paused");
        }
        assert_eq!(lookup.draft(&history, 'e', 16, 1), split("abcd"));
        // Failing again pauses twice as long.
        for _ in 0..MISSES_BEFORE_PAUSE {
            lookup.record(2, 0);
        }
        assert_eq!(lookup.paused, FIRST_PAUSE_STEPS * 2);
        assert_eq!((lookup.drafted, lookup.accepted), (4 + 8 + 16 * 3 + 16 + 2 * 8, 4 + 8 + 16 * 3 + 3));
    }
}
