//! What the engine's handle, its thread and an upstream fleet speak: the
//! configuration, the facts of a loaded model, a generation request and the
//! events it reports, the live counters, and the commands sent to the
//! engine thread. Nothing here runs anything.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use llama_cpp_2::token::LlamaToken;
use tokio::sync::{mpsc, oneshot};

use crate::chat::{ChatPayload, ToolCall};
use crate::error::EngineError;
use crate::format::{ChatFormat, GrammarSpec};
use crate::sampling::{CompiledGrammar, SamplingParams};

/// Largest default context: the model's training context is used up to this
/// many tokens unless `--ctx-size` says otherwise, so a 128k-context model does
/// not allocate gigabytes of KV cache by surprise.
pub const DEFAULT_MAX_CTX: u32 = 8192;

/// Tokens decoded per `llama_decode` call at most (llama-server's default).
pub const BATCH_SIZE: u32 = 2048;

/// Physical micro-batch size (llama-server's default).
pub const UBATCH_SIZE: u32 = 512;

/// How to load and run the model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    /// The name requests use for it (`--model NAME=PATH`); `None` names it
    /// after its file, without `.gguf`.
    pub name: Option<String>,
    /// Context size in tokens, shared by all slots; `None` picks the model's
    /// training context capped at [`DEFAULT_MAX_CTX`].
    pub n_ctx: Option<u32>,
    /// Sequences decoded together.
    pub n_parallel: u32,
    /// CPU threads for decoding; `None` uses every core.
    pub n_threads: Option<u32>,
    /// Model layers to offload to a GPU; `None` is llama.cpp's default
    /// (all of them when a GPU backend is compiled in).
    pub gpu_layers: Option<u32>,
    /// Folder where the shared prefix is saved and restored across restarts.
    pub prefix_cache: Option<PathBuf>,
    /// Generating sequences draft tokens from their own context and verify
    /// them in the batch (`--spec-lookup`; see `lookup`).
    pub spec_lookup: bool,
    /// Whether attention runs as llama.cpp's fused flash-attention kernel.
    pub flash_attn: FlashAttn,
    /// Other names requests may use for it (a `models:` entry's `aliases`).
    pub aliases: Vec<String>,
    /// Loaded for embeddings (`embedding: true`): the engine pools each
    /// input into one vector and generates nothing (see `embed`).
    pub embedding: bool,
    /// How an embedding model pools its token vectors into one.
    pub pooling: Pooling,
}

/// How an embedding model turns its token vectors into one vector, as
/// llama-server's `--pooling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// What the GGUF declares (`{arch}.pooling_type`); a model that
    /// declares none cannot be loaded for embeddings without a choice.
    #[default]
    Declared,
    Mean,
    /// The first token's vector (BERT's `[CLS]`).
    Cls,
    /// The last token's vector (decoder models trained for embeddings).
    Last,
}

/// `--flash-attn`, as llama-server's `-fa`.
///
/// The trade on the CPU: the fused kernel makes a lone decode step pay more
/// for every token of context than the unfused one (its steps below 64
/// rows run the patch's own kernel, which checks drafts for less than the
/// unfused kernels do); without it prefill is slower. Drafting keeps greedy output
/// exact with each of them (see `flash_attention`). Figures in
/// docs/deployment.md (`skillhost-bench steps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlashAttn {
    /// llama.cpp's own choice, on wherever the device supports it, the CPU
    /// included. The default: with several
    /// streams, the fused kernel skips the cells of the other sequences
    /// that the unfused kernels multiply out, and that outweighs what
    /// `Prefill` gains on a lone stream (docs/benchmarks.md).
    #[default]
    Auto,
    On,
    Off,
    /// The fused kernel for micro-batches of at least 64 query rows
    /// (prefill), the unfused ones for smaller ones (decode steps, drafted
    /// ones included): a policy patched into llama.cpp (`load.rs`).
    Prefill,
}

/// Facts about the loaded model.
#[derive(Debug)]
pub struct ModelInfo {
    /// The model's id: its file name without `.gguf`.
    pub id: String,
    pub path: PathBuf,
    pub architecture: String,
    /// Context size in use, in tokens.
    pub n_ctx: u32,
    pub n_ctx_train: u32,
    pub n_parallel: u32,
    pub n_params: u64,
    pub size_bytes: u64,
    /// The KV cache's size at `n_ctx` (16-bit keys and values), as a
    /// model registry counts memory.
    pub kv_bytes: u64,
    pub format: ChatFormat,
    /// Loaded for embeddings only (see [`EngineConfig::embedding`]).
    pub embedding: bool,
    /// Width of the vectors an embedding model returns.
    pub n_embd: u32,
}

/// One generation request, with an already rendered prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateRequest {
    pub prompt: String,
    pub sampling: SamplingParams,
    /// `None` generates until the model stops or the context is full.
    pub max_tokens: Option<u32>,
    pub stops: Vec<String>,
    pub grammar: Option<GrammarSpec>,
    /// Which conversation this is (a hash of its leading messages): an
    /// upstream fleet sends every round of it to the same upstream, where
    /// its prefix is cached. The local engine finds prefixes itself.
    pub affinity: Option<u64>,
    /// The conversation as data, for an upstream in chat mode.
    pub chat: Option<Arc<ChatPayload>>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
}

/// Token counts and times of one request, as llama-server's `timings`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Timings {
    /// Prompt tokens reused from the KV cache.
    pub cache_n: usize,
    /// Of `cache_n`, tokens copied from another sequence's cache (another
    /// conversation or the saved shared prefix) rather than this slot's own.
    pub copied_n: usize,
    /// Prompt tokens decoded.
    pub prompt_n: usize,
    pub prompt_ms: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    pub predicted_ms: f64,
    /// Tokens drafted from the context, and those of them kept (of
    /// `predicted_n`), as llama-server reports them.
    pub draft_n: usize,
    pub draft_n_accepted: usize,
}

impl Timings {
    pub fn prompt_per_second(&self) -> f64 {
        per_second(self.prompt_n, self.prompt_ms)
    }
    pub fn predicted_per_second(&self) -> f64 {
        per_second(self.predicted_n, self.predicted_ms)
    }
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// What a running sequence reports.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// Text generated since the last event; never splits a character or leaks
    /// part of a stop string.
    Text(String),
    /// Tool calls an upstream in chat mode returned as data (the local
    /// engine's calls are in its text). Sent before `Finished`.
    ToolCalls(Vec<ToolCall>),
    /// The sequence ended normally.
    Finished { reason: FinishReason, timings: Timings },
    /// The sequence ended with an error.
    Failed(EngineError),
}

/// A submitted request: its events arrive on `events`. Dropping the receiver
/// cancels the sequence at the next decode step and frees its slot.
#[derive(Debug)]
pub struct Submitted {
    pub events: mpsc::UnboundedReceiver<GenerationEvent>,
    /// Tokens in the prompt (reused and decoded); 0 when only the end
    /// tells (an upstream), and then `cache_n + prompt_n` of the timings.
    pub n_prompt: usize,
    /// Tokens generated so far, counted as they are sampled, so that a
    /// sequence cut before its end (a turn out of time) still reports what
    /// it wrote; stays 0 where only the end tells (an upstream).
    pub generated: Arc<AtomicUsize>,
}

/// Live counters the engine thread keeps for `/metrics`.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub active_slots: AtomicUsize,
    pub queued: AtomicUsize,
    /// Requests whose receiver went away before they finished (client
    /// disconnects and cancellations).
    pub cancelled: AtomicUsize,
    /// Most sequences one decode step carried since the engine started.
    pub batch_sequences_max: AtomicUsize,
    /// Each upstream's counters, when generation goes to upstream servers.
    pub upstreams: Vec<Arc<UpstreamStats>>,
}

/// Messages to the engine thread.
pub(crate) enum Command {
    Submit {
        request: Box<GenerateRequest>,
        /// The prompt, tokenized by the submitter.
        tokens: Vec<LlamaToken>,
        /// The grammar, converted by the submitter.
        grammar: Option<CompiledGrammar>,
        reply: oneshot::Sender<Result<Submitted, EngineError>>,
    },
    /// Inputs of one embeddings request, tokenized by the submitter; the
    /// reply holds one vector per input, in order.
    Embed { inputs: Vec<Vec<LlamaToken>>, reply: oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>> },
    /// Makes the engine thread panic, to test recovery.
    Panic,
}

/// How the engine thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Every [`Engine`] handle was dropped.
    Normal,
    /// The thread panicked with this message.
    Panicked(String),
}

impl Exit {
    pub fn is_panic(&self) -> bool {
        matches!(self, Exit::Panicked(_))
    }
}

/// Publishes a gauge value for `/metrics`.
pub(crate) fn set_gauge(gauge: &AtomicUsize, value: usize) {
    gauge.store(value, Ordering::Relaxed);
}

/// Live counters of one upstream, read by `/metrics`.
#[derive(Debug, Default)]
pub struct UpstreamStats {
    pub url: String,
    pub up: AtomicBool,
    pub in_flight: AtomicUsize,
    /// Requests sent to it.
    pub requests: AtomicU64,
    /// Requests it failed (refused connections, 5xx, broken streams).
    pub errors: AtomicU64,
    /// Requests that went on to another upstream after this one failed
    /// before their first token.
    pub retried: AtomicU64,
    /// `429`/`503` answers that asked for a pause.
    pub backpressure: AtomicU64,
    /// Requests with a conversation key that went to the key's home here.
    pub affinity_hits: AtomicU64,
    /// Requests whose home was this upstream but that went elsewhere
    /// (down, paused or full).
    pub affinity_misses: AtomicU64,
    /// Time to first token, summed over requests, in microseconds.
    pub first_token_us: AtomicU64,
    pub first_tokens: AtomicU64,
}
