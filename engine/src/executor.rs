//! The engine thread: loads the model and runs the batch executor.
//!
//! Each loop iteration takes new commands, admits queued requests into free
//! slots (continuous batching: a request joins between decode steps), builds
//! one batch with a token for every generating sequence plus prompt chunks of
//! prefilling ones, decodes it, and samples for every sequence that got
//! logits. The KV cache is unified, so one long request can use the whole
//! context while the others are short.
//!
//! A new request whose prompt starts with a prefix another sequence holds
//! (the same system prompt and skills block, typically) takes those cells
//! with `llama_memory_seq_cp` instead of decoding them; on the unified cache
//! the copy shares the cells, so it costs neither time nor memory. The
//! longest such shared prefix is also kept by a sequence of its own, which no
//! request runs on and which is evicted last, and is saved to disk when
//! `--prefix-cache` names a folder (see `saved_prefix`).
//!
//! When a request starts, the other idle slots move their cells to host
//! memory ("parked"), as llama-server does with its idle slots: cells that no
//! running sequence attends to still cost every decode step, since the
//! attention spans the cache up to its last used cell. A parked slot keeps
//! its tokens for matching, and a prompt that continues it gets the cells
//! back by a copy, not a prefill.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::DecodeError;
use tokio::sync::mpsc;

use crate::cells::CellLedger;
use crate::error::EngineError;
use crate::load::{
    backend, context_params, flash_attention, flash_attention_name, model_info, model_params, LoadProgress,
};
use crate::lookup::Lookup;
use crate::prefix::{common_prefix, plan_reuse, CachedSequence, MIN_SHARED_PREFIX_TOKENS};
use crate::protocol::{
    set_gauge, Command, EngineConfig, EngineStats, FinishReason, GenerateRequest, GenerationEvent, ModelInfo,
    Submitted, Timings, BATCH_SIZE, DEFAULT_MAX_CTX,
};
use crate::repeat::{RepeatWatch, Watched};
use crate::sampling::{CompiledGrammar, Sampler};
use crate::saved_prefix::SavedPrefix;
use crate::schedule::{self, Admission, Cache, Candidate, Placement, SlotView};
use crate::text::{Pushed, TextStream};
use crate::tokenizer::Tokenizer;

/// Entry point of the engine thread.
pub(crate) fn run(
    config: EngineConfig,
    commands: Receiver<Command>,
    loaded: Sender<Result<(ModelInfo, Arc<Tokenizer>), EngineError>>,
    stats: Arc<EngineStats>,
    progress: LoadProgress,
) {
    let load_error = |reason: String| EngineError::Load { path: config.model_path.display().to_string(), reason };
    decode_at_normal_priority();
    let backend = match backend() {
        Ok(backend) => backend,
        Err(reason) => {
            let _ = loaded.send(Err(load_error(reason)));
            return;
        }
    };
    let model =
        match LlamaModel::load_from_file(backend, &config.model_path, &model_params(config.gpu_layers, &progress)) {
            Ok(model) => Arc::new(model),
            Err(err) => {
                let _ = loaded.send(Err(load_error(err.to_string())));
                return;
            }
        };
    let threads = config
        .n_threads
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as i32), |n| n.max(1) as i32);
    if config.embedding {
        return run_embedding(backend, &model, &config, threads, commands, loaded);
    }
    let n_ctx = config.n_ctx.unwrap_or_else(|| model.n_ctx_train().min(DEFAULT_MAX_CTX)).max(1);
    let n_parallel = config.n_parallel.max(1);
    let flash_attn = flash_attention(config.flash_attn);
    let ctx = match model.new_context(backend, context_params(n_ctx, n_parallel, threads, flash_attn)) {
        Ok(ctx) => ctx,
        Err(err) => {
            let _ = loaded.send(Err(load_error(format!("cannot create a context of {n_ctx} tokens: {err}"))));
            return;
        }
    };
    tracing::info!(
        n_ctx,
        n_parallel,
        threads,
        flash_attn = flash_attention_name(flash_attn),
        spec_lookup = config.spec_lookup,
        "model context ready"
    );
    let info = match model_info(&model, &config, n_ctx, n_parallel) {
        Ok(info) => info,
        Err(err) => {
            let _ = loaded.send(Err(err));
            return;
        }
    };
    let tokenizer = Arc::new(Tokenizer::new(Arc::clone(&model)));
    if loaded.send(Ok((info, Arc::clone(&tokenizer)))).is_err() {
        return;
    }
    let template = model.chat_template(None).ok().and_then(|t| t.to_string().ok()).unwrap_or_default();
    let saved = config
        .prefix_cache
        .as_deref()
        .and_then(|dir| SavedPrefix::new(dir, &config.model_path, &template, flash_attention_name(flash_attn)));
    let mut executor = Executor::new(&model, ctx, n_parallel as usize, tokenizer, stats, saved);
    executor.spec_lookup = config.spec_lookup && executor.partial_removal_ok;
    executor.restore_prefix();
    executor.run(commands);
}

/// The engine thread of a model loaded for embeddings (see `embed`).
fn run_embedding(
    backend: &llama_cpp_2::llama_backend::LlamaBackend,
    model: &Arc<LlamaModel>,
    config: &EngineConfig,
    threads: i32,
    commands: Receiver<Command>,
    loaded: Sender<Result<(ModelInfo, Arc<Tokenizer>), EngineError>>,
) {
    let load_error = |reason: String| EngineError::Load { path: config.model_path.display().to_string(), reason };
    if let Some(reason) = crate::embed::pooling_problem(model, config) {
        let _ = loaded.send(Err(load_error(reason)));
        return;
    }
    let n_ctx = config.n_ctx.unwrap_or_else(|| model.n_ctx_train().min(crate::embed::EMBED_MAX_CTX)).max(1);
    let params = crate::embed::context_params(n_ctx, threads, config.pooling, config.flash_attn);
    let ctx = match model.new_context(backend, params) {
        Ok(ctx) => ctx,
        Err(err) => {
            let _ =
                loaded.send(Err(load_error(format!("cannot create an embedding context of {n_ctx} tokens: {err}"))));
            return;
        }
    };
    tracing::info!(n_ctx, threads, pooling = ?config.pooling, "embedding context ready");
    // The KV cache holds every sequence's own cells; `n_ctx` in the facts
    // is what one input may take.
    let info = match model_info(model, config, n_ctx * crate::embed::EMBED_SEQS, 1) {
        Ok(info) => ModelInfo { n_ctx, ..info },
        Err(err) => {
            let _ = loaded.send(Err(err));
            return;
        }
    };
    if loaded.send(Ok((info, Arc::new(Tokenizer::new(Arc::clone(model)))))).is_err() {
        return;
    }
    crate::embed::run(ctx, commands, n_ctx as usize);
}

/// Puts the calling thread (and the OpenMP workers it will start, which
/// inherit its policy) in the normal scheduling class. The engine thread is
/// spawned from a thread the server may have marked as batch work; decoding
/// must not inherit that.
fn decode_at_normal_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` with pid 0 changes only the calling thread
    // and reads `param`, which lives across the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot set the engine thread's scheduling class");
    }
}

/// A request waiting for a free slot.
struct Queued {
    tokens: Vec<LlamaToken>,
    text: String,
    request: Box<GenerateRequest>,
    sampler: Sampler,
    events: mpsc::UnboundedSender<GenerationEvent>,
    generated: Arc<AtomicUsize>,
}

/// A request running in a slot.
struct Active {
    events: mpsc::UnboundedSender<GenerationEvent>,
    sampler: Sampler,
    text: TextStream,
    /// For a reply held to a list of calls: ends it at a repeated call.
    calls: Option<RepeatWatch>,
    max_tokens: Option<u32>,
    /// Prompt tokens not yet decoded, and the text they came from (when known).
    prompt_pending: Vec<LlamaToken>,
    prompt_decoded: usize,
    prompt_text: Option<Vec<u8>>,
    /// The sampled token to feed next, with its text.
    next: Option<(LlamaToken, Vec<u8>)>,
    /// Index in the current batch whose logits belong to this sequence;
    /// its drafts, when it has any this step, follow it.
    logits_at: Option<i32>,
    /// Drafting from the context (`--spec-lookup`), and this step's draft.
    lookup: Option<Lookup>,
    drafts: Vec<LlamaToken>,
    /// Prompt tokens this sequence put into the current batch.
    prompt_in_batch: usize,
    timings: Timings,
    /// `predicted_n` as the submitter reads it while the sequence runs.
    generated: Arc<AtomicUsize>,
    started: Instant,
    first_token: Option<Instant>,
}

struct Slot {
    seq: i32,
    cache: CachedSequence<LlamaToken>,
    /// Labels of the KV cells the sequence holds, in position order: the
    /// cached tokens and, while a prompt is prefilled, its decoded part.
    cells: Vec<u32>,
    active: Option<Active>,
    /// When the slot was last used, for evicting idle caches oldest first.
    last_used: u64,
    /// The sequence that keeps the shared prefix: it never runs a request
    /// and is evicted after every idle slot.
    keeps_prefix: bool,
    /// Cached tokens that were the prompt of the slot's last request (the
    /// rest it generated): a new prompt that leaves the cache before this
    /// point is another conversation sharing a prefix, not the next turn.
    prompt_end: usize,
    /// The cells of an idle slot, moved to host memory; `cells` is empty
    /// meanwhile and `cache` still lists the tokens.
    parked: Option<SeqState>,
}

impl Slot {
    /// Takes the running request out of the slot. Prompt tokens decoded so far
    /// stay in the KV cache and are recorded (without text: the text of a
    /// prompt is only recorded once the whole prompt is in).
    fn release(&mut self) -> Option<Active> {
        let active = self.active.take()?;
        if active.next.is_none() && active.prompt_decoded < active.prompt_pending.len() {
            self.cache.push_tokens_without_text(&active.prompt_pending[..active.prompt_decoded]);
        }
        Some(active)
    }
}

struct Executor<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    slots: Vec<Slot>,
    queue: VecDeque<Queued>,
    n_ctx: usize,
    /// The memory can drop an arbitrary tail of a sequence (not true of
    /// sliding-window or recurrent models).
    partial_removal_ok: bool,
    tokenizer: Arc<Tokenizer>,
    /// The model's end-of-generation tokens, banned for `ignore_eos`.
    eog_tokens: Vec<LlamaToken>,
    stats: Arc<EngineStats>,
    clock: u64,
    ledger: CellLedger,
    /// Prefixes may be copied between sequences (not on recurrent or hybrid
    /// models, whose state is not a list of per-position cells).
    sharing: bool,
    /// Where the shared prefix is saved, with `--prefix-cache`.
    saved: Option<SavedPrefix>,
    /// Generating sequences draft from their context (see `lookup`); only
    /// where a rejected draft's cells can be dropped from the cache.
    spec_lookup: bool,
}

impl<'m> Executor<'m> {
    fn new(
        model: &'m LlamaModel,
        ctx: LlamaContext<'m>,
        n_parallel: usize,
        tokenizer: Arc<Tokenizer>,
        stats: Arc<EngineStats>,
        saved: Option<SavedPrefix>,
    ) -> Self {
        let n_ctx = ctx.n_ctx() as usize;
        let swa = model
            .meta_val_str(&format!(
                "{}.attention.sliding_window",
                model.meta_val_str("general.architecture").unwrap_or_default()
            ))
            .is_ok();
        Executor {
            model,
            ctx,
            batch: LlamaBatch::new(BATCH_SIZE as usize, 1),
            slots: (0..=n_parallel)
                .map(|i| Slot {
                    seq: i as i32,
                    cache: CachedSequence::default(),
                    cells: Vec::new(),
                    active: None,
                    last_used: 0,
                    keeps_prefix: i == n_parallel,
                    prompt_end: 0,
                    parked: None,
                })
                .collect(),
            queue: VecDeque::new(),
            n_ctx,
            partial_removal_ok: !(swa || model.is_recurrent() || model.is_hybrid()),
            tokenizer,
            eog_tokens: model.vocab().tokens().filter(|&t| model.vocab().is_eog(t)).collect(),
            stats,
            clock: 0,
            ledger: CellLedger::default(),
            sharing: !(model.is_recurrent() || model.is_hybrid()),
            saved,
            spec_lookup: false,
        }
    }

    fn run(&mut self, commands: Receiver<Command>) {
        loop {
            let busy = self.slots.iter().any(|s| s.active.is_some()) || !self.queue.is_empty();
            if !busy {
                self.publish_stats();
                // Idle: sleep until a command arrives; a closed channel ends the thread.
                match commands.recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if !self.slots.iter().any(|s| s.active.is_some()) && self.queue.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.admit();
            self.publish_stats();
            if self.slots.iter().any(|s| s.active.is_some()) {
                self.step();
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Embed { reply, .. } => {
                // The handle refuses embeddings from a chat model before sending.
                let _ = reply.send(Err(EngineError::BadInput("this model is loaded for chat only".into())));
            }
            Command::Submit { request, tokens, grammar, reply } => {
                let result = self.prepare(request, tokens, grammar);
                match result {
                    Ok((queued, submitted)) => {
                        if reply.send(Ok(submitted)).is_ok() {
                            self.queue.push_back(queued);
                        }
                    }
                    Err(err) => {
                        let _ = reply.send(Err(err));
                    }
                }
            }
            Command::Panic => panic!("fault injection: engine thread panic requested"),
        }
    }

    /// Builds the sampler (the prompt came tokenized and checked, the grammar
    /// converted), so the caller learns of bad input before anything is queued.
    fn prepare(
        &mut self,
        request: Box<GenerateRequest>,
        tokens: Vec<LlamaToken>,
        grammar: Option<CompiledGrammar>,
    ) -> Result<(Queued, Submitted), EngineError> {
        let sampler = Sampler::new(self.model, &request.sampling, grammar.as_ref(), &self.eog_tokens)?;
        let (events, events_rx) = mpsc::unbounded_channel();
        let n_prompt = tokens.len();
        let text = request.prompt.clone();
        let generated = Arc::new(AtomicUsize::new(0));
        let submitted = Submitted { events: events_rx, n_prompt, generated: generated.clone() };
        Ok((Queued { tokens, text, request, sampler, events, generated }, submitted))
    }

    /// Ends sequences whose receiver is gone (client disconnected or request
    /// cancelled): the slot is freed and the KV entries kept for reuse.
    fn drop_cancelled(&mut self) {
        let queued = self.queue.len();
        self.queue.retain(|q| !q.events.is_closed());
        let mut cancelled = queued - self.queue.len();
        for slot in &mut self.slots {
            if slot.active.as_ref().is_some_and(|a| a.events.is_closed()) {
                slot.release();
                cancelled += 1;
            }
        }
        if cancelled > 0 {
            self.stats.cancelled.fetch_add(cancelled, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn kv_used(&self) -> usize {
        self.ledger.used()
    }

    /// Drops a sequence's cells from position `keep` on, in the KV cache and
    /// in the books. A memory that cannot drop that tail drops all of it.
    /// Returns the tokens kept.
    fn forget_from(&mut self, index: usize, keep: usize) -> usize {
        let slot = &mut self.slots[index];
        let mut keep = keep.min(slot.cells.len());
        if keep == slot.cells.len() {
            return keep;
        }
        let removed = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), Some(keep as u32), None);
        if !matches!(removed, Ok(true)) {
            let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), None, None);
            keep = 0;
        }
        self.ledger.release(&slot.cells[keep..]);
        slot.cells.truncate(keep);
        slot.cache.truncate(keep);
        slot.prompt_end = slot.prompt_end.min(keep);
        if keep == 0 {
            slot.cache.clear();
        }
        keep
    }

    /// Empties a sequence; returns how many cells became free (shared ones
    /// stay with their other holders).
    fn clear_slot(&mut self, index: usize) -> usize {
        let slot = &mut self.slots[index];
        let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), None, None);
        let freed = self.ledger.release(&slot.cells);
        slot.cells.clear();
        slot.cache.clear();
        slot.prompt_end = 0;
        slot.parked = None;
        freed
    }

    /// Makes slot `to` hold the first `n` cached tokens of slot `from`,
    /// sharing their cells. Returns whether it did.
    fn copy_prefix(&mut self, from: usize, to: usize, n: usize) -> bool {
        let n = n.min(self.slots[from].cells.len());
        self.clear_slot(to);
        let (src, dst) = (self.slots[from].seq, self.slots[to].seq);
        if self.ctx.copy_kv_cache_seq(src, dst, Some(0), Some(n as u32)).is_err() {
            return false;
        }
        let cells = self.ledger.share(&self.slots[from].cells[..n]);
        let cache = self.slots[from].cache.prefix(n);
        self.slots[to].cells = cells;
        self.slots[to].cache = cache;
        self.slots[to].prompt_end = n;
        true
    }

    fn prefix_slot(&self) -> usize {
        self.slots.len() - 1
    }

    /// Parks every idle slot that still has cells, except `spared` and the
    /// shared-prefix sequence (which running requests copy from), then drops
    /// the oldest parked states past [`schedule::MAX_PARKED_TOKENS_PER_CTX`].
    fn park_idle(&mut self, spared: &[usize]) {
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.active.is_some() || slot.keeps_prefix || slot.cells.is_empty() || spared.contains(&index) {
                continue;
            }
            let Ok(state) = self.ctx.state_seq_get(slot.seq, LlamaStateSeqFlags::empty()) else { continue };
            let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), None, None);
            self.ledger.release(&slot.cells);
            slot.cells.clear();
            slot.parked = Some(state);
        }
        let parked: Vec<(usize, usize, u64)> = (0..self.slots.len())
            .filter(|&i| self.slots[i].parked.is_some())
            .map(|i| (i, self.slots[i].cache.len(), self.slots[i].last_used))
            .collect();
        for index in schedule::parked_to_drop(&parked, self.n_ctx) {
            let slot = &mut self.slots[index];
            slot.parked = None;
            slot.cache.clear();
            slot.prompt_end = 0;
        }
    }

    /// Gives a parked slot its cells back; when they do not fit, the slot
    /// forgets them instead.
    fn unpark(&mut self, index: usize) {
        let Some(state) = self.slots[index].parked.take() else { return };
        let slot = &mut self.slots[index];
        let fits = self.ledger.used() + slot.cache.len() <= self.n_ctx;
        if fits && self.ctx.state_seq_set(&state, slot.seq).is_ok() {
            self.ledger.add(&mut slot.cells, slot.cache.len());
        } else {
            let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), None, None);
            slot.cache.clear();
            slot.prompt_end = 0;
        }
    }

    /// What the scheduler knows of each slot, with its reuse of `queued`'s
    /// prompt (by tokens or by text, see `prefix`) when one is being placed.
    fn slot_views(&self, queued: Option<&Queued>) -> Vec<SlotView> {
        self.slots
            .iter()
            .map(|slot| {
                let reuse = queued.map_or(0, |queued| {
                    let by_tokens = common_prefix(slot.cache.tokens(), &queued.tokens);
                    let by_text = slot.cache.text_match(queued.text.as_bytes()).0;
                    by_tokens.max(by_text)
                });
                let step_cells = slot
                    .active
                    .as_ref()
                    .map_or(0, |a| schedule::step_cells(a.next.is_some(), a.prompt_pending.len() - a.prompt_decoded));
                SlotView {
                    active: slot.active.is_some(),
                    keeps_prefix: slot.keeps_prefix,
                    cached: slot.cache.len(),
                    cells: slot.cells.len(),
                    prompt_end: slot.prompt_end,
                    last_used: slot.last_used,
                    reuse,
                    step_cells,
                }
            })
            .collect()
    }

    /// Moves queued requests into free slots, in queue order, as
    /// [`schedule::admit`] decides: a request whose prefix is being
    /// prefilled for another lets those behind it go first.
    fn admit(&mut self) {
        let mut position = 0;
        while let Some(queued) = self.queue.get(position) {
            let views = self.slot_views(Some(queued));
            let candidate =
                Candidate { prompt: queued.tokens.len(), shared_in_prefill: self.shared_in_prefill(&queued.tokens) };
            let active = self.slots.iter().filter(|s| s.active.is_some());
            let cache = Cache {
                n_ctx: self.n_ctx,
                active_cells: self.ledger.union(active.map(|s| s.cells.as_slice())),
                sharing: self.sharing,
            };
            match schedule::admit(&views, candidate, cache) {
                Admission::Start(Placement { slot, donor }) => {
                    let Some(queued) = self.queue.remove(position) else { return };
                    self.start(slot, donor, queued);
                }
                Admission::Wait => position += 1,
                Admission::Full => return,
            }
        }
    }

    /// The most tokens a prompt shares with a prompt still being
    /// prefilled, counting what that slot already holds. A prompt that
    /// shares enough (children an agent started together, a burst of
    /// requests with one system prompt) waits for that prefill and copies
    /// the prefix, instead of decoding the same tokens beside it.
    fn shared_in_prefill(&self, tokens: &[LlamaToken]) -> usize {
        if !self.sharing {
            return 0;
        }
        self.slots
            .iter()
            .filter_map(|slot| {
                let active = slot.active.as_ref().filter(|a| !a.prompt_pending.is_empty())?;
                let held = slot.cache.len();
                let kept = common_prefix(slot.cache.tokens(), tokens);
                Some(if kept < held { kept } else { held + common_prefix(&active.prompt_pending, &tokens[held..]) })
            })
            .max()
            .unwrap_or(0)
    }

    /// Starts a request in slot `index`, reusing what that slot caches or,
    /// when `donor` is given, the prefix that slot holds.
    fn start(&mut self, index: usize, donor: Option<usize>, queued: Queued) {
        self.clock += 1;
        let own = &self.slots[index].cache;
        if self.slots[index].parked.is_some()
            && common_prefix(own.tokens(), &queued.tokens) == 0
            && own.text_match(queued.text.as_bytes()).0 == 0
        {
            // Nothing of it is reused: its parked cells are dropped, not restored.
            self.clear_slot(index);
        }
        // The other idle slots go first, so the cells restored next (and this
        // prompt's) can take the lowest free cells: the attention of every
        // step spans the cache up to its highest used cell.
        let spared: Vec<usize> = std::iter::once(index).chain(donor).collect();
        self.park_idle(&spared);
        self.unpark(index);
        if let Some(donor) = donor {
            self.unpark(donor);
        }
        let partial_ok = self.partial_removal_ok;
        let source_prompt_end = self.slots[donor.unwrap_or(index)].prompt_end;
        let source = &self.slots[donor.unwrap_or(index)].cache;
        let by_tokens = common_prefix(source.tokens(), &queued.tokens);
        let (text_tokens, text_bytes) = source.text_match(queued.text.as_bytes());
        // The prompt as tokens, with the text of the part after the reused prefix.
        let (prompt, mut common, mut text_from): (Vec<LlamaToken>, usize, Option<usize>) = if text_tokens > by_tokens {
            let mut tokens = source.tokens()[..text_tokens].to_vec();
            let rest = &queued.text[text_bytes..];
            tokens.extend(self.tokenizer.continuation(rest));
            (tokens, text_tokens, Some(text_bytes))
        } else {
            (queued.tokens, by_tokens, None)
        };
        let matched = common;
        let mut copied_n = 0;
        if let Some(donor) = donor {
            // Never past the last prompt token, which is decoded for logits.
            let n = common.min(prompt.len() - 1);
            if n < common {
                // The copy ends inside the matched text: what follows it is
                // not known as text.
                text_from = None;
            }
            if self.copy_prefix(donor, index, n) {
                copied_n = n;
                common = n;
            } else {
                common = 0;
            }
        }
        let slot = &self.slots[index];
        let plan = plan_reuse(slot.cache.len(), prompt.len(), common, partial_ok);
        let keep = if plan.removed > 0 { self.forget_from(index, plan.keep) } else { plan.keep };
        // The text of the tokens still to decode, when it is known exactly.
        let prompt_text = match text_from {
            Some(offset) if keep == common => Some(queued.text.as_bytes()[offset..].to_vec()),
            _ if keep == 0 => Some(queued.text.as_bytes().to_vec()),
            _ => None,
        };
        if matched < source_prompt_end {
            // This prompt and the cached one part inside the earlier prompt:
            // two conversations share these tokens.
            self.keep_shared_prefix(index);
        }
        let slot = &mut self.slots[index];
        slot.prompt_end = prompt.len();
        let cache_n = keep;
        slot.last_used = self.clock;
        slot.active = Some(Active {
            events: queued.events,
            sampler: queued.sampler,
            text: TextStream::new(&queued.request.stops),
            calls: queued.request.grammar.as_ref().and_then(RepeatWatch::new),
            max_tokens: queued.request.max_tokens,
            prompt_pending: prompt[cache_n..].to_vec(),
            prompt_decoded: 0,
            prompt_text,
            next: None,
            logits_at: None,
            lookup: self.spec_lookup.then(Lookup::default),
            drafts: Vec::new(),
            prompt_in_batch: 0,
            timings: Timings { cache_n, copied_n: copied_n.min(cache_n), ..Timings::default() },
            generated: queued.generated,
            started: Instant::now(),
            first_token: None,
        });
        // The donor, if idle, has given what it had to give.
        self.park_idle(&[]);
    }

    /// Slot `index` holds a prefix another conversation shares: the sequence
    /// that keeps the shared prefix takes it too, unless it already holds all
    /// of it; a changed prefix is saved.
    fn keep_shared_prefix(&mut self, index: usize) {
        let keeper = self.prefix_slot();
        let n = self.slots[index].cache.len();
        if n < MIN_SHARED_PREFIX_TOKENS || index == keeper {
            return;
        }
        let held = common_prefix(self.slots[keeper].cache.tokens(), self.slots[index].cache.tokens());
        if held == n {
            return;
        }
        if self.copy_prefix(index, keeper, n) {
            tracing::debug!(tokens = n, "keeping a new shared prefix");
            self.save_prefix();
        }
    }

    /// Writes the kept prefix to `--prefix-cache`, if set.
    fn save_prefix(&mut self) {
        let Some(saved) = &self.saved else { return };
        let keeper = &self.slots[self.slots.len() - 1];
        saved.save(&self.ctx, keeper.seq, keeper.cache.tokens(), keeper.cache.text());
    }

    /// Loads the prefix saved by an earlier run, if it is for this model.
    fn restore_prefix(&mut self) {
        let Some(saved) = &self.saved else { return };
        let keeper = self.slots.len() - 1;
        let seq = self.slots[keeper].seq;
        let Some((tokens, text)) = saved.load(&mut self.ctx, seq, self.n_ctx) else { return };
        let slot = &mut self.slots[keeper];
        match text {
            Some(text) => slot.cache.push_chunk(&tokens, &text),
            None => slot.cache.push_tokens_without_text(&tokens),
        }
        self.ledger.add(&mut slot.cells, tokens.len());
        slot.prompt_end = tokens.len();
    }

    fn publish_stats(&self) {
        set_gauge(&self.stats.active_slots, self.slots.iter().filter(|s| s.active.is_some()).count());
        set_gauge(&self.stats.queued, self.queue.len());
    }

    /// Builds and decodes one batch, then samples.
    fn step(&mut self) {
        // A poisoned turn is still a turn: the step that panicked held no state in it.
        let _turn = crate::turn::step_turn();
        self.make_room();
        self.batch.clear();
        let mut budget = BATCH_SIZE as usize;
        // Cells no sequence needs this step: what drafts may take.
        let generating = self.slots.iter().filter(|s| s.active.as_ref().is_some_and(|a| a.next.is_some())).count();
        let mut spare = self
            .n_ctx
            .saturating_sub(self.kv_used() + generating)
            .min(crate::lookup::MAX_STEP_TOKENS_WITH_DRAFTS.saturating_sub(generating));
        // Generating sequences first: one token each keeps every stream moving
        // while a long prompt is prefilled in chunks.
        for slot in &mut self.slots {
            let Some(active) = slot.active.as_mut() else { continue };
            active.logits_at = None;
            active.prompt_in_batch = 0;
            active.drafts.clear();
            if let Some((token, _)) = &active.next {
                let pos = slot.cache.len() as i32;
                if self.batch.add(*token, pos, &[slot.seq], true).is_ok() {
                    active.logits_at = Some(self.batch.n_tokens() - 1);
                    budget -= 1;
                    if let Some(lookup) = active.lookup.as_mut() {
                        // Every draft kept is a token sampled: never past max_tokens.
                        let left = active
                            .max_tokens
                            .map_or(usize::MAX, |max| (max as usize).saturating_sub(active.timings.predicted_n + 1));
                        for draft in lookup.draft(slot.cache.tokens(), *token, spare.min(budget).min(left), generating)
                        {
                            let at = pos + 1 + active.drafts.len() as i32;
                            if self.batch.add(draft, at, &[slot.seq], true).is_err() {
                                break;
                            }
                            active.drafts.push(draft);
                        }
                        budget -= active.drafts.len();
                        spare -= active.drafts.len();
                        active.timings.draft_n += active.drafts.len();
                    }
                }
            }
        }
        for slot in &mut self.slots {
            let Some(active) = slot.active.as_mut() else { continue };
            if active.next.is_some() || active.prompt_pending.len() == active.prompt_decoded || budget == 0 {
                continue;
            }
            let start = active.prompt_decoded;
            let take = (active.prompt_pending.len() - start).min(budget);
            let base = (slot.cache.len() + start) as i32;
            for i in 0..take {
                let last = start + i + 1 == active.prompt_pending.len();
                if self.batch.add(active.prompt_pending[start + i], base + i as i32, &[slot.seq], last).is_err() {
                    break;
                }
                active.prompt_in_batch += 1;
                if last {
                    active.logits_at = Some(self.batch.n_tokens() - 1);
                }
            }
            budget -= active.prompt_in_batch;
        }
        if self.batch.n_tokens() == 0 {
            return;
        }
        match self.ctx.decode(&mut self.batch) {
            Ok(()) => {}
            Err(DecodeError::NoKvCacheSlot) => {
                // The shared cache is full: free idle caches, or end the
                // youngest sequence, and try again next step.
                if !self.evict_idle(usize::MAX) {
                    self.end_youngest_for_room();
                }
                return;
            }
            Err(err) => {
                self.fail_batch(&err.to_string());
                return;
            }
        }
        // How many sequences decode side by side, for `/metrics`.
        let sequences = self
            .slots
            .iter()
            .filter_map(|s| s.active.as_ref())
            .filter(|a| a.logits_at.is_some() || a.prompt_in_batch > 0)
            .count();
        self.stats.batch_sequences_max.fetch_max(sequences, std::sync::atomic::Ordering::Relaxed);
        self.after_decode();
    }

    /// Makes sure the cells this step needs are free: idle caches go first;
    /// a sequence that would outgrow the context ends with `length`.
    fn make_room(&mut self) {
        let short = schedule::cells_short(&self.slot_views(None), self.kv_used(), self.n_ctx);
        if short > 0 {
            self.evict_idle(short);
        }
        for index in 0..self.slots.len() {
            let full =
                self.slots[index].active.as_ref().is_some_and(|a| a.next.is_some()) && self.kv_used() + 1 > self.n_ctx;
            if full {
                self.finish(index, FinishReason::Length);
            }
        }
    }

    /// Clears idle caches in [`schedule::eviction_order`] until `cells` are
    /// freed. Returns whether anything was freed (cells shared with a
    /// running sequence stay).
    fn evict_idle(&mut self, cells: usize) -> bool {
        let mut freed = 0;
        for i in schedule::eviction_order(&self.slot_views(None)) {
            if freed >= cells {
                break;
            }
            freed += self.clear_slot(i);
        }
        freed > 0
    }

    fn end_youngest_for_room(&mut self) {
        if let Some(index) = schedule::youngest_active(&self.slot_views(None)) {
            self.finish(index, FinishReason::Length);
        }
    }

    fn fail_batch(&mut self, reason: &str) {
        for index in 0..self.slots.len() {
            let in_batch = self.slots[index].active.as_ref().is_some_and(|a| a.next.is_some() || a.prompt_in_batch > 0);
            if in_batch {
                if let Some(active) = self.slots[index].active.take() {
                    let _ = active.events.send(GenerationEvent::Failed(EngineError::Decode(reason.to_string())));
                }
                self.clear_slot(index);
            }
        }
    }

    /// Records what the batch put into the KV cache, then samples.
    fn after_decode(&mut self) {
        let now = Instant::now();
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            let Some(active) = slot.active.as_mut() else { continue };
            if let Some((token, piece)) = active.next.take() {
                slot.cache.push_chunk(&[token], &piece);
                self.ledger.add(&mut slot.cells, 1);
            } else if active.prompt_in_batch > 0 {
                self.ledger.add(&mut slot.cells, active.prompt_in_batch);
                active.prompt_decoded += active.prompt_in_batch;
                if active.prompt_decoded == active.prompt_pending.len() {
                    let tokens = std::mem::take(&mut active.prompt_pending);
                    match active.prompt_text.take() {
                        Some(text) => slot.cache.push_chunk(&tokens, &text),
                        None => slot.cache.push_tokens_without_text(&tokens),
                    }
                    active.prompt_decoded = 0;
                    active.timings.prompt_n = tokens.len();
                    active.timings.prompt_ms = now.duration_since(active.started).as_secs_f64() * 1000.0;
                    active.first_token = Some(now);
                }
            }
            let Some(at) = active.logits_at else { continue };
            let drafts = std::mem::take(&mut active.drafts);
            self.sample_drafted(index, at, &drafts);
        }
    }

    /// Samples the sequence's next token at batch index `at` and, while each
    /// sampled token is the draft decoded after it, the token after that
    /// draft too: a kept draft is already in the cache. The cells of the
    /// drafts not kept are dropped.
    fn sample_drafted(&mut self, index: usize, at: i32, drafts: &[LlamaToken]) {
        let mut kept = 0;
        while let Some(active) = self.slots[index].active.as_mut() {
            let token = active.sampler.sample(&self.ctx, at + kept as i32, self.model);
            let drafted = drafts.get(kept) == Some(&token);
            if drafted {
                // Counted before `on_token`, which may end the sequence and
                // report its timings.
                active.timings.draft_n_accepted += 1;
            }
            self.on_token(index, token);
            if !drafted {
                break;
            }
            let slot = &mut self.slots[index];
            let Some((token, piece)) = slot.active.as_mut().and_then(|active| active.next.take()) else { break };
            slot.cache.push_chunk(&[token], &piece);
            self.ledger.add(&mut slot.cells, 1);
            kept += 1;
        }
        if drafts.is_empty() {
            return;
        }
        let slot = &mut self.slots[index];
        // Past what the sequence holds now lie only drafts it did not keep.
        let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), Some(slot.cache.len() as u32), None);
        if let Some(lookup) = slot.active.as_mut().and_then(|active| active.lookup.as_mut()) {
            lookup.record(drafts.len(), kept);
        }
    }

    fn on_token(&mut self, index: usize, token: LlamaToken) {
        let vocab = self.model.vocab();
        let n_ctx = self.n_ctx;
        let slot = &mut self.slots[index];
        let Some(active) = slot.active.as_mut() else { return };
        active.timings.predicted_n += 1;
        active.generated.store(active.timings.predicted_n, Ordering::Relaxed);
        // Under `ignore_eos` the sampler never picks one, so this is a real end.
        if vocab.is_eog(token) {
            self.finish(index, FinishReason::Stop);
            return;
        }
        let piece = vocab.token_to_piece(token, true, None);
        let (mut delta, mut stopped) = match active.text.push(&piece) {
            Pushed::Text(text) => (text, false),
            Pushed::Stopped(text) => (text, true),
        };
        if let Some(watch) = active.calls.as_mut() {
            match watch.push(&delta) {
                Watched::Text(text) => delta = text,
                Watched::Repeated(text) => (delta, stopped) = (text, true),
            }
        }
        if !delta.is_empty() && active.events.send(GenerationEvent::Text(delta)).is_err() {
            return;
        }
        if stopped {
            self.finish(index, FinishReason::Stop);
            return;
        }
        let at_max = active.max_tokens.is_some_and(|max| active.timings.predicted_n >= max as usize);
        if at_max || slot.cache.len() + 1 >= n_ctx {
            self.finish(index, FinishReason::Length);
            return;
        }
        active.next = Some((token, piece));
    }

    /// Ends the sequence in a slot and reports how it went. The slot keeps its
    /// cache for the next request.
    fn finish(&mut self, index: usize, reason: FinishReason) {
        let Some(mut active) = self.slots[index].release() else { return };
        // Before the client hears of the end, so /metrics read after a
        // response never counts its slot as busy.
        self.publish_stats();
        let mut rest = active.text.finish();
        if let Some(watch) = active.calls.as_mut() {
            rest = match watch.push(&rest) {
                Watched::Text(text) => text + &watch.finish(),
                Watched::Repeated(text) => text,
            };
        }
        if !rest.is_empty() {
            let _ = active.events.send(GenerationEvent::Text(rest));
        }
        let now = Instant::now();
        let mut timings = active.timings;
        if let Some(first) = active.first_token {
            timings.predicted_ms = now.duration_since(first).as_secs_f64() * 1000.0;
        }
        let _ = active.events.send(GenerationEvent::Finished { reason, timings });
    }
}
