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

/// A prefix copied between sequences is kept by the shared-prefix sequence
/// (and saved) only from this many tokens: shorter ones are a chat
/// template's opening, cheaper to decode than to keep.
pub const MIN_SHARED_PREFIX_TOKENS: usize = 64;

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
