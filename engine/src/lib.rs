//! skillhost's model engine: llama.cpp on one thread, and everything that
//! depends on which model is loaded.
//!
//! Code map:
//! - [`engine`]: the handle the rest of the server holds (start, submit, stats).
//! - [`protocol`]: what the handle, the engine thread and an upstream fleet
//!   speak: requests, events, counters, commands.
//! - `load`: llama.cpp's backend, model and context parameters, a GGUF's facts.
//! - `executor`: the engine thread: the batch executor.
//! - [`prefix`]: which cached KV prefix a new prompt can reuse.
//! - [`schedule`]: admission, slot choice and eviction, as pure functions.
//! - `cells`: which KV cells are in use when sequences share them.
//! - `saved_prefix`: the shared prefix saved to disk across restarts.
//! - [`text`]: token bytes to text deltas, with stop strings.
//! - `repeat`: ends a reply of several calls where the model repeats one.
//! - [`sampling`]: sampling parameters and the sampler chain.
//! - `grammar`: grammar specs to GBNF through llama.cpp's JSON-schema converter.
//! - [`template`]: chat templates (minijinja) and built-in fallbacks.
//! - [`format`]: conversation to prompt, capabilities, tool grammars.
//! - [`tool_calls`]: one parser per tool-call syntax.
//! - [`chat`]: the conversation types.
//! - [`remote`]: upstream inference servers in place of a loaded model.
//!
//! This crate knows nothing of skills, actors or HTTP.

mod cells;
pub mod chat;
mod embed;
pub mod engine;
pub mod error;
mod executor;
pub mod format;
mod grammar;
mod load;
pub mod lookup;
pub mod prefix;
pub mod protocol;
pub mod remote;
mod repeat;
pub mod sampling;
mod saved_prefix;
pub mod schedule;
pub mod schema_limits;
pub mod template;
pub mod text;
mod tokenizer;
pub mod tool_calls;
mod turn;

pub use chat::{ChatMessage, ChatPayload, ResponseFormat, Role, ToolCall, ToolChoice, ToolDef};
pub use embed::{EMBED_MAX_CTX, EMBED_SEQS};
pub use engine::{at_idle_priority, EmbedInput, Embedded, Engine, LARGE_PROMPT_BYTES};
pub use error::EngineError;
pub use format::{Capabilities, ChatFormat, Conversation, FormatError, GrammarSpec, PreparedPrompt};
pub use load::{backend, context_params, file_model_name, flash_attention, LoadProgress, GPU_BUILD};
pub use prefix::MIN_SHARED_PREFIX_TOKENS;
pub use protocol::UpstreamStats;
pub use protocol::{
    EngineConfig, EngineStats, Exit, FinishReason, FlashAttn, GenerateRequest, GenerationEvent, ModelInfo, Pooling,
    Submitted, Timings, BATCH_SIZE,
};
pub use remote::{Remote, RemoteConfig, Routing, UpstreamConfig, UpstreamMode};
pub use sampling::SamplingParams;
/// The signing key's name in a `--prefix-cache` folder.
pub use saved_prefix::KEY_FILE as PREFIX_KEY_FILE;
pub use schedule::{MAX_PARKED_TOKENS_PER_CTX, NEGLIGIBLE_TAIL_TOKENS};
pub use tool_calls::{arguments_object, CutCall, ParsedCall, ParsedOutput, ToolCallParser, ToolFamily};
