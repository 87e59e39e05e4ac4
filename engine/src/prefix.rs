//! Prompt reuse: what a slot's KV cache already holds and how much of a new
//! prompt it can skip.
//!
//! A slot remembers the tokens in its KV cache and, beside them, the bytes each
//! token stood for. A new prompt is matched two ways and the better one wins:
//! token by token against a fresh tokenization, and byte by byte against the
//! remembered text. The second catches the common case of a follow-up turn
//! whose previous answer the model generated token by token: re-tokenizing the
//! answer text can pick different tokens than the model sampled, which would
//! end a token-level match at the first such token.

/// Most trailing cached tokens that may be removed to continue a sequence on a
/// sliding-window or recurrent model. A turn that ends on a control token the
/// template never re-renders differs from the next prompt by a token or two;
/// anything longer means the prompt genuinely diverges, and on those models a
/// clean re-prefill is the correct answer rather than a cheaper wrong one.
pub const MAX_REWIND_TOKENS: usize = 16;

/// A new request takes the cached tokens of a free slot even when this many
/// of them, at most, must be dropped from its end, rather than move to an
/// empty slot: the end of a turn the template renders differently next time
/// costs a few tokens, not a slot.
pub const NEGLIGIBLE_TAIL_TOKENS: usize = 32;
/// A prefix copied between sequences is kept by the shared-prefix sequence
/// (and saved) only from this many tokens: shorter ones are a chat
/// template's opening, cheaper to decode than to keep.
pub const MIN_SHARED_PREFIX_TOKENS: usize = 64;

/// Parked slots (idle caches moved to host memory) together keep at most
/// this many contexts' worth of tokens: as much host memory as the KV cache
/// itself takes, at this factor. Past it, the least recently used go.
pub const MAX_PARKED_TOKENS_PER_CTX: usize = 1;

/// Which parked slots to drop, given each as `(index, tokens, last_used)`,
/// so the rest hold at most `n_ctx` × [`MAX_PARKED_TOKENS_PER_CTX`] tokens:
/// the least recently used first.
pub fn parked_to_drop(parked: &[(usize, usize, u64)], n_ctx: usize) -> Vec<usize> {
    let limit = n_ctx * MAX_PARKED_TOKENS_PER_CTX;
    let mut by_age = parked.to_vec();
    by_age.sort_by_key(|&(_, _, last_used)| last_used);
    let mut total: usize = parked.iter().map(|&(_, tokens, _)| tokens).sum();
    let mut dropped = Vec::new();
    for (index, tokens, _) in by_age {
        if total <= limit {
            break;
        }
        total -= tokens;
        dropped.push(index);
    }
    dropped
}

/// How well a free slot suits a new prompt, best first in ascending order:
/// fewest cached tokens lost, then most of the prompt already held, then
/// used longest ago. `reuse` is how many of its `cached` tokens the prompt
/// keeps; `prompt_end` is where the slot's last prompt ended. A prompt that
/// keeps all of that prompt is the conversation's next turn, and a tail of up
/// to [`NEGLIGIBLE_TAIL_TOKENS`] of its answer counts as nothing lost.
pub fn destination_rank(
    cached: usize,
    reuse: usize,
    prompt_end: usize,
    last_used: u64,
) -> (usize, std::cmp::Reverse<usize>, u64) {
    let lost = cached - reuse.min(cached);
    let lost = if reuse >= prompt_end { lost.saturating_sub(NEGLIGIBLE_TAIL_TOKENS) } else { lost };
    (lost, std::cmp::Reverse(reuse), last_used)
}

/// The tokens in one slot's KV cache, in position order, with their text.
#[derive(Debug, Clone)]
pub struct CachedSequence<T> {
    tokens: Vec<T>,
    /// All cached bytes, concatenated.
    bytes: Vec<u8>,
    /// `(byte_end, token_end)` after each appended chunk: the places where the
    /// text and the tokens line up.
    boundaries: Vec<(usize, usize)>,
}

impl<T> Default for CachedSequence<T> {
    fn default() -> Self {
        CachedSequence { tokens: Vec::new(), bytes: Vec::new(), boundaries: Vec::new() }
    }
}

impl<T: Copy + PartialEq> CachedSequence<T> {
    pub fn tokens(&self) -> &[T] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Records tokens that are now in the KV cache together with the bytes
    /// they were tokenized from (or, for a generated token, its piece).
    pub fn push_chunk(&mut self, tokens: &[T], bytes: &[u8]) {
        let text_known = self.boundaries.last().map_or(0, |&(_, t)| t) == self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        if !text_known {
            // Tokens without text sit before this chunk, so these bytes would be
            // paired with the wrong positions; text matching ends at the gap.
            return;
        }
        self.bytes.extend_from_slice(bytes);
        self.boundaries.push((self.bytes.len(), self.tokens.len()));
    }

    /// Records tokens whose text is unknown; text matching stops before them.
    pub fn push_tokens_without_text(&mut self, tokens: &[T]) {
        self.tokens.extend_from_slice(tokens);
    }

    /// Keeps the first `n` tokens and forgets the rest.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.tokens.len() {
            return;
        }
        self.tokens.truncate(n);
        self.boundaries.retain(|&(_, token_end)| token_end <= n);
        // Tokens of a partly kept chunk stay valid in the cache, but their text
        // is unknown, so text matching ends at the last whole chunk.
        let byte_end = self.boundaries.last().map_or(0, |&(b, _)| b);
        self.bytes.truncate(byte_end);
    }

    /// A copy of the first `n` tokens, with the text of their whole chunks.
    pub fn prefix(&self, n: usize) -> Self {
        let mut copy = self.clone();
        copy.truncate(n);
        copy
    }

    /// The text of all cached tokens, when it is known for every one.
    pub fn text(&self) -> Option<&[u8]> {
        let known = self.boundaries.last().map_or(0, |&(_, t)| t);
        (known == self.tokens.len()).then_some(self.bytes.as_slice())
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.bytes.clear();
        self.boundaries.clear();
    }

    /// Tokens reusable for a prompt by matching text: the tokens up to the last
    /// chunk boundary inside the common byte prefix, and the byte offset where
    /// the not-yet-cached text starts.
    pub fn text_match(&self, prompt: &[u8]) -> (usize, usize) {
        let common = common_prefix(&self.bytes, prompt);
        self.boundaries
            .iter()
            .rev()
            .find(|&&(byte_end, _)| byte_end <= common)
            .map_or((0, 0), |&(byte_end, token_end)| (token_end, byte_end))
    }
}

/// Length of the common prefix of two slices.
pub fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How a new prompt continues a slot's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReusePlan {
    /// Cached tokens kept in place (the KV entries from here on are removed).
    pub keep: usize,
    /// Cached tokens removed from the end of the cache.
    pub removed: usize,
}

/// Decides how many cached tokens a prompt of `prompt` tokens may keep, given
/// that the first `common` of them equal the cache.
///
/// At least one prompt token is always decoded so the request gets fresh
/// logits. When the memory cannot drop arbitrary tails (sliding-window or
/// recurrent models), a tail longer than [`MAX_REWIND_TOKENS`] means
/// re-prefilling from the start.
pub fn plan_reuse(cached_len: usize, prompt_len: usize, common: usize, partial_removal_ok: bool) -> ReusePlan {
    let keep = common.min(prompt_len.saturating_sub(1)).min(cached_len);
    let removed = cached_len - keep;
    if removed > MAX_REWIND_TOKENS && !partial_removal_ok {
        return ReusePlan { keep: 0, removed: cached_len };
    }
    ReusePlan { keep, removed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn plan_reuse_cases() {
        // (cached, prompt, common, partial removal ok) -> (keep, removed)
        let cases = [
            ((0, 10, 0, true), (0, 0)),
            // The whole cache is a prefix of the prompt: keep all of it.
            ((6, 10, 6, true), (6, 0)),
            // The prompt equals the cache: re-decode the last token for logits.
            ((10, 10, 10, true), (9, 1)),
            // Diverging at the limit of the rewind on a windowed model: rewind.
            ((26, 40, 10, false), (10, MAX_REWIND_TOKENS)),
            // One past the limit on a windowed model: re-prefill from zero.
            ((27, 40, 10, false), (0, 27)),
            // Full-attention models keep the common prefix however deep.
            ((27, 40, 10, true), (10, 17)),
        ];
        for ((cached, prompt, common, ok), (keep, removed)) in cases {
            assert_eq!(
                plan_reuse(cached, prompt, common, ok),
                ReusePlan { keep, removed },
                "cached {cached}, prompt {prompt}, common {common}"
            );
        }
    }

    #[test]
    fn parked_states_are_dropped_oldest_first_past_the_limit() {
        let n_ctx = 1000;
        let limit = n_ctx * MAX_PARKED_TOKENS_PER_CTX;
        // (index, tokens, last used): exactly at the limit, nothing goes.
        let at = [(0, limit - 600, 5), (1, 600, 2)];
        assert_eq!(parked_to_drop(&at, n_ctx), Vec::<usize>::new());
        // One past: the least recently used goes, even if it is smaller.
        let past = [(0, limit - 599, 5), (1, 600, 2)];
        assert_eq!(parked_to_drop(&past, n_ctx), vec![1]);
    }

    #[test]
    fn a_turn_keeps_its_slot_unless_that_loses_more_than_a_negligible_tail() {
        let empty = destination_rank(0, 0, 0, 0);
        // A conversation's slot (prompt of 400 tokens, then its answer),
        // whose next prompt drops the last few tokens of the answer.
        let own = |tail: usize| destination_rank(500 + tail, 500, 400, 9);
        assert!(own(NEGLIGIBLE_TAIL_TOKENS) < empty);
        assert!(own(NEGLIGIBLE_TAIL_TOKENS + 1) > empty);
        // Another conversation that parts inside that prompt loses even a
        // short tail: it goes to the empty slot (and copies the prefix).
        assert!(destination_rank(410, 390, 400, 9) > empty);
        // Between two slots that lose nothing, the one used longest ago.
        assert!(destination_rank(0, 0, 0, 1) < destination_rank(0, 0, 0, 2));
    }

    #[test]
    fn text_match_stops_at_chunk_boundaries() {
        let mut cache = CachedSequence::<u32>::default();
        cache.push_chunk(&[1, 2, 3], b"<s>user: hi\n");
        cache.push_chunk(&[7], b"Hel");
        cache.push_chunk(&[8], b"lo");
        // The next turn repeats everything, then adds more.
        assert_eq!(cache.text_match(b"<s>user: hi\nHello</s>user: more"), (5, 17));
        // A prompt that changes the answer's second token keeps the first.
        assert_eq!(cache.text_match(b"<s>user: hi\nHelp"), (4, 15));
        // A prompt that differs inside the first chunk reuses nothing.
        assert_eq!(cache.text_match(b"<s>user: ho\n"), (0, 0));
    }

    #[test]
    fn truncate_forgets_text_past_the_kept_tokens() {
        let mut cache = CachedSequence::<u32>::default();
        cache.push_chunk(&[1, 2], b"ab");
        cache.push_chunk(&[3], b"c");
        cache.truncate(2);
        assert_eq!(cache.tokens(), &[1, 2]);
        assert_eq!(cache.text_match(b"abc"), (2, 2));
        // Cutting inside a chunk keeps the tokens but no text for them.
        cache.truncate(1);
        assert_eq!(cache.tokens(), &[1]);
        assert_eq!(cache.text_match(b"abc"), (0, 0));
        // Text pushed after such a gap is never paired with the wrong tokens.
        cache.push_chunk(&[9], b"x");
        assert_eq!(cache.text_match(b"x"), (0, 0));
    }
}
