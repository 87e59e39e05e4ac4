//! The batch executor's decisions, as pure functions over what it knows of
//! its slots: which queued request starts and in which slot (admission and
//! slot choice), which idle caches go when cells run short (eviction), and
//! which parked states are dropped. The executor gathers one [`SlotView`]
//! per slot and applies the answer; nothing here touches llama.cpp, so each
//! rule is table-tested without a model, as text-generation-inference tests
//! its queue.

use crate::prefix::MIN_SHARED_PREFIX_TOKENS;
use crate::protocol::BATCH_SIZE;

/// A new request takes the cached tokens of a free slot even when this many
/// of them, at most, must be dropped from its end, rather than move to an
/// empty slot: the end of a turn the template renders differently next time
/// costs a few tokens, not a slot.
pub const NEGLIGIBLE_TAIL_TOKENS: usize = 32;

/// Parked slots (idle caches moved to host memory) together keep at most
/// this many contexts' worth of tokens: as much host memory as the KV cache
/// itself takes, at this factor. Past it, the least recently used go.
pub const MAX_PARKED_TOKENS_PER_CTX: usize = 1;

/// What the scheduler knows of one slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotView {
    /// The slot runs a request.
    pub active: bool,
    /// The sequence that keeps the shared prefix: it never runs a request
    /// and is evicted after every idle slot.
    pub keeps_prefix: bool,
    /// Tokens its cache lists (parked or not).
    pub cached: usize,
    /// KV cells it holds now (none while parked).
    pub cells: usize,
    /// Where the prompt of its last request ended.
    pub prompt_end: usize,
    /// When it was last used, on the executor's clock.
    pub last_used: u64,
    /// How many tokens of the prompt being placed its cache holds (by token
    /// or by text, whichever is longer); 0 when nothing is being placed.
    pub reuse: usize,
    /// Cells its running request adds in the next step: one while it
    /// generates, the next prompt chunk while it prefills, none when idle.
    pub step_cells: usize,
}

impl SlotView {
    /// A slot a queued request may start in.
    fn is_free(&self) -> bool {
        !self.active && !self.keeps_prefix
    }
}

/// Cells one running request adds in the next step: one for its next token,
/// or as much of its prompt as one batch holds.
pub fn step_cells(generating: bool, prompt_left: usize) -> usize {
    match generating {
        true => 1,
        false => prompt_left.min(BATCH_SIZE as usize),
    }
}

/// The request at the head of the queue, and what the executor knows of the
/// cache around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Tokens of its prompt.
    pub prompt: usize,
    /// The most tokens its prompt shares with a prompt still being prefilled
    /// in some slot (0 when none is).
    pub shared_in_prefill: usize,
}

/// The cache the candidate would join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cache {
    /// Context size in cells, shared by every slot.
    pub n_ctx: usize,
    /// Cells held by running sequences, each cell counted once.
    pub active_cells: usize,
    /// Prefixes may be copied between sequences (not on recurrent or hybrid
    /// models, whose state is not a list of per-position cells).
    pub sharing: bool,
}

/// Where an admitted request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The free slot it runs in.
    pub slot: usize,
    /// A slot whose longer prefix of the prompt is copied into `slot` first.
    pub donor: Option<usize>,
}

/// What becomes of the candidate this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It starts now.
    Start(Placement),
    /// Its prefix is being decoded for another request: it takes the copy
    /// once that is done, and the requests behind it may go first.
    Wait,
    /// Nothing more starts this step: no slot is free, or the running
    /// sequences leave no room for its prompt.
    Full,
}

/// Admission and slot choice for one queued request. `slots` carries each
/// slot's reuse of the candidate's prompt.
///
/// The request goes to the free slot that loses the least of what it caches
/// (a conversation's next turn to its own slot, a new conversation to an
/// empty one, see [`destination_rank`]), and takes the longest prefix of its
/// prompt any sequence holds, copied when another holds at least
/// [`MIN_SHARED_PREFIX_TOKENS`] more of it than that slot: a few tokens (a
/// template's opening) are cheaper to decode, and decoded there they leave a
/// short prompt's answer independent of what other conversations happen to
/// be cached. Running sequences plus this prompt must fit the context (idle
/// caches are evicted for it later); cells copied from a running sequence
/// are already counted.
pub fn admit(slots: &[SlotView], candidate: Candidate, cache: Cache) -> Admission {
    if !slots.iter().any(SlotView::is_free) {
        return Admission::Full;
    }
    let reuse_now = slots.iter().map(|s| s.reuse).max().unwrap_or(0);
    if cache.sharing && candidate.shared_in_prefill >= reuse_now + MIN_SHARED_PREFIX_TOKENS {
        return Admission::Wait;
    }
    let free = || slots.iter().enumerate().filter(|(_, s)| s.is_free());
    let chosen = match cache.sharing {
        true => free().min_by_key(|(_, s)| destination_rank(s.cached, s.reuse, s.prompt_end, s.last_used)),
        false => free().max_by_key(|(_, s)| (s.reuse, std::cmp::Reverse(s.last_used))),
    };
    let Some((slot, chosen)) = chosen else { return Admission::Full };
    let donor = match cache.sharing {
        true => slots
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != slot)
            .max_by_key(|(_, s)| s.reuse)
            .filter(|(_, s)| s.reuse >= chosen.reuse + MIN_SHARED_PREFIX_TOKENS)
            .map(|(i, _)| i),
        false => None,
    };
    let shared_with_active = donor.map(|d| slots[d]).filter(|d| d.active).map_or(0, |d| d.reuse);
    let busy = slots.iter().any(|s| s.active);
    if busy && cache.active_cells + candidate.prompt.saturating_sub(shared_with_active) + 1 > cache.n_ctx {
        return Admission::Full;
    }
    Admission::Start(Placement { slot, donor })
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

/// Cells to free before the next step: what the running requests add past
/// what the context holds beside the `used` cells.
pub fn cells_short(slots: &[SlotView], used: usize, n_ctx: usize) -> usize {
    let needed: usize = slots.iter().filter(|s| s.active).map(|s| s.step_cells).sum();
    (used + needed).saturating_sub(n_ctx)
}

/// The idle caches to clear when cells run short, in the order to clear
/// them: the least recently used first, the shared prefix last. The
/// executor stops once enough cells are free (a cell shared with another
/// holder frees nothing until the last lets go).
pub fn eviction_order(slots: &[SlotView]) -> Vec<usize> {
    let mut idle: Vec<usize> = (0..slots.len()).filter(|&i| !slots[i].active && slots[i].cells > 0).collect();
    idle.sort_by_key(|&i| (slots[i].keeps_prefix, slots[i].last_used));
    idle
}

/// The running request to end with `length` when the cache is full and no
/// idle cache is left to clear: the one started last.
pub fn youngest_active(slots: &[SlotView]) -> Option<usize> {
    (0..slots.len()).filter(|&i| slots[i].active).max_by_key(|&i| slots[i].last_used)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const N_CTX: usize = 4096;
    const SHARING: Cache = Cache { n_ctx: N_CTX, active_cells: 0, sharing: true };

    fn idle(cached: usize, reuse: usize, last_used: u64) -> SlotView {
        SlotView { cached, cells: cached, prompt_end: cached, last_used, reuse, ..SlotView::default() }
    }

    fn running(cells: usize, reuse: usize, last_used: u64) -> SlotView {
        SlotView { active: true, step_cells: 1, ..idle(cells, reuse, last_used) }
    }

    fn keeper(cached: usize, reuse: usize) -> SlotView {
        SlotView { keeps_prefix: true, ..idle(cached, reuse, 0) }
    }

    fn prompt(tokens: usize) -> Candidate {
        Candidate { prompt: tokens, shared_in_prefill: 0 }
    }

    fn start(slot: usize, donor: Option<usize>) -> Admission {
        Admission::Start(Placement { slot, donor })
    }

    #[test]
    fn admission_table() {
        let m = MIN_SHARED_PREFIX_TOKENS;
        // (case, slots, candidate, cache, expected)
        let cases: Vec<(&str, Vec<SlotView>, Candidate, Cache, Admission)> = vec![
            (
                "every slot busy",
                vec![running(10, 0, 1), running(10, 0, 2), keeper(0, 0)],
                prompt(5),
                SHARING,
                Admission::Full,
            ),
            (
                "the prefix keeper never runs a request",
                vec![running(10, 0, 1), keeper(500, 500)],
                prompt(600),
                SHARING,
                Admission::Full,
            ),
            (
                "an empty server: the first slot",
                vec![idle(0, 0, 0), idle(0, 0, 0), keeper(0, 0)],
                prompt(5),
                SHARING,
                start(0, None),
            ),
            (
                "the next turn goes to its own slot",
                vec![idle(300, 0, 1), idle(500, 500, 2), idle(0, 0, 0), keeper(0, 0)],
                prompt(700),
                SHARING,
                start(1, None),
            ),
            (
                "a new conversation goes to the empty slot, not over another's cache",
                vec![idle(300, 0, 1), idle(0, 0, 0), keeper(0, 0)],
                prompt(50),
                SHARING,
                start(1, None),
            ),
            (
                "between two caches it would wipe, the one used longest ago",
                vec![idle(300, 0, 5), idle(300, 0, 2), keeper(0, 0)],
                prompt(50),
                SHARING,
                start(1, None),
            ),
            (
                "a shared prefix of exactly the minimum is copied from the keeper",
                vec![idle(0, 0, 0), keeper(m, m)],
                prompt(m + 10),
                SHARING,
                start(0, Some(1)),
            ),
            (
                "one token short of the minimum is decoded instead",
                vec![idle(0, 0, 0), keeper(m - 1, m - 1)],
                prompt(m + 10),
                SHARING,
                start(0, None),
            ),
            (
                "a running sequence can be the donor",
                vec![running(400, 300, 3), idle(0, 0, 0), keeper(0, 0)],
                prompt(350),
                SHARING,
                start(1, Some(0)),
            ),
            (
                "a prompt whose prefix is being prefilled waits for it",
                vec![running(0, 0, 3), idle(0, 0, 0), keeper(0, 0)],
                Candidate { prompt: 500, shared_in_prefill: m },
                SHARING,
                Admission::Wait,
            ),
            (
                "one token less shared with the prefill, and it starts",
                vec![running(0, 0, 3), idle(0, 0, 0), keeper(0, 0)],
                Candidate { prompt: 500, shared_in_prefill: m - 1 },
                SHARING,
                start(1, None),
            ),
            (
                "without sharing no prompt waits and nothing is copied",
                vec![running(400, 300, 3), idle(0, 0, 0), keeper(0, 0)],
                Candidate { prompt: 500, shared_in_prefill: 400 },
                Cache { sharing: false, ..SHARING },
                start(1, None),
            ),
            (
                "without sharing: the most reuse, then the least recently used",
                vec![idle(100, 20, 1), idle(100, 40, 9), idle(100, 40, 4), keeper(0, 0)],
                prompt(100),
                Cache { sharing: false, ..SHARING },
                start(2, None),
            ),
        ];
        for (case, slots, candidate, cache, expected) in cases {
            assert_eq!(admit(&slots, candidate, cache), expected, "{case}");
        }
    }

    #[test]
    fn a_prompt_starts_beside_running_ones_exactly_while_it_fits() {
        let slots = [running(1000, 0, 1), idle(0, 0, 0), keeper(0, 0)];
        let cache = Cache { active_cells: 1000, ..SHARING };
        // Running cells, this prompt and one cell for its first token: at the limit.
        let fits = N_CTX - 1000 - 1;
        assert_eq!(admit(&slots, prompt(fits), cache), start(1, None));
        assert_eq!(admit(&slots, prompt(fits + 1), cache), Admission::Full);
        // What it copies from the running sequence is already counted.
        let sharing = [running(1000, 200, 1), idle(0, 0, 0), keeper(0, 0)];
        assert_eq!(admit(&sharing, prompt(fits + 200), cache), start(1, Some(0)));
        assert_eq!(admit(&sharing, prompt(fits + 201), cache), Admission::Full);
        // Alone, any prompt starts: the cache is emptied for it.
        assert_eq!(admit(&[idle(0, 0, 0), keeper(0, 0)], prompt(N_CTX * 2), cache), start(0, None));
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
    fn eviction_clears_idle_caches_oldest_first_and_the_shared_prefix_last() {
        let slots = [idle(100, 0, 7), running(50, 0, 9), idle(0, 0, 1), idle(80, 0, 3), keeper(200, 0)];
        // The running slot and the empty one are never in the list.
        assert_eq!(eviction_order(&slots), vec![3, 0, 4]);
        assert_eq!(eviction_order(&[running(5, 0, 1)]), Vec::<usize>::new());
    }

    #[test]
    fn room_for_the_next_step() {
        let prefilling = SlotView { active: true, step_cells: step_cells(false, 10_000), ..SlotView::default() };
        let generating = SlotView { active: true, step_cells: step_cells(true, 0), ..SlotView::default() };
        let slots = [prefilling, generating, idle(300, 0, 1)];
        assert_eq!(step_cells(false, 10_000), BATCH_SIZE as usize);
        assert_eq!(step_cells(false, 3), 3);
        let needed = BATCH_SIZE as usize + 1;
        // Exactly full after the step: nothing to free; one more: one cell.
        assert_eq!(cells_short(&slots, N_CTX - needed, N_CTX), 0);
        assert_eq!(cells_short(&slots, N_CTX - needed + 1, N_CTX), 1);
    }

    #[test]
    fn the_youngest_running_request_ends_for_room() {
        let slots = [running(10, 0, 4), idle(10, 0, 9), running(10, 0, 6), running(10, 0, 2)];
        assert_eq!(youngest_active(&slots), Some(2));
        assert_eq!(youngest_active(&[idle(10, 0, 1)]), None);
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
}
