//! Loading a model: llama.cpp's process-wide backend, the model and
//! context parameters, and what a GGUF says about itself (its chat format,
//! its size). The engine thread loads weights with these; an upstream fleet
//! reads only the vocabulary.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_sys_2::{
    llama_flash_attn_type, LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED,
};

use crate::error::EngineError;
use crate::format::ChatFormat;
use crate::protocol::{EngineConfig, FlashAttn, ModelInfo, BATCH_SIZE, UBATCH_SIZE};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// llama.cpp's backend is process-global and may be initialized only once per
/// process, so it outlives any one engine thread: a restarted engine reuses it.
/// Public so the benchmark's bare loops share it with the engines they run.
static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();

pub fn backend() -> Result<&'static LlamaBackend, String> {
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|err| err.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether llama.cpp was built with a GPU backend.
pub const GPU_BUILD: bool = cfg!(any(feature = "cuda", feature = "vulkan"));

/// The flash-attention policy skillhost patches into llama.cpp
/// (`engine/llama-patch/patch.cmake`): graphs of at least 64 query rows run
/// the fused kernel, every smaller one the unfused kernels, over one KV
/// cache laid out for the unfused ones.
pub const FLASH_ATTN_FOR_PREFILL: llama_flash_attn_type = 2;

/// The fewest query rows for which that policy runs the fused kernel (the
/// `64` in `patch.cmake`).
pub const PREFILL_FUSED_FROM_ROWS: usize = 64;

// Every drafted step must stay below the rows from which the policy runs
// fused and ggml's fused kernel runs tiled (the same 64), or drafted greedy
// output would not be byte-identical: below them each row is computed the
// same whatever rows share its step.
const _: () = assert!(crate::lookup::MAX_STEP_TOKENS_WITH_DRAFTS < PREFILL_FUSED_FROM_ROWS);

extern "C" {
    /// Defined only by the patched llama.cpp, so the engine does not link
    /// against one without the policy: unpatched, llama.cpp would read the
    /// value as "on" and abort when it logs the policy's name.
    fn skillhost_flash_attn_for_prefill() -> llama_flash_attn_type;
}

/// [`FLASH_ATTN_FOR_PREFILL`], as the linked llama.cpp defines it.
fn patched_prefill_policy() -> llama_flash_attn_type {
    // SAFETY: a function of no arguments that returns a constant.
    unsafe { skillhost_flash_attn_for_prefill() }
}

/// llama.cpp's flash-attention policy for `setting`.
///
/// Drafting (`--spec-lookup`) keeps greedy output exact with every policy on
/// the CPU: a drafted step holds at most `MAX_STEP_TOKENS_WITH_DRAFTS`
/// positions, below the 64 rows from which ggml's fused kernel runs tiled,
/// and below that both kernels compute each position's row the same
/// whatever else the step holds. For the fused kernel that takes the
/// patch's edit to ggml-cpu, which runs such steps through a kernel of our
/// own and stops ggml's splitting a lone position's context across threads
/// (`engine/llama-patch/patch.cmake`, `flash-attn-rows.cpp`); the unfused
/// kernels do so as they are (with llamafile's tinyBLAS left out:
/// `.cargo/config.toml`). `prefill` is fused for prefill only: decode and
/// drafted steps run unfused. It is not `auto` because a prompt's numerics
/// then depend on how it was split into micro-batches: a suffix decoded
/// after a cache hit runs unfused where a fresh prefill of the same tokens
/// ran fused.
pub fn flash_attention(setting: FlashAttn) -> llama_flash_attn_type {
    match setting {
        FlashAttn::Auto => LLAMA_FLASH_ATTN_TYPE_AUTO,
        FlashAttn::On => LLAMA_FLASH_ATTN_TYPE_ENABLED,
        FlashAttn::Off => LLAMA_FLASH_ATTN_TYPE_DISABLED,
        FlashAttn::Prefill => patched_prefill_policy(),
    }
}

/// How logs and the saved prefix's record name a flash-attention policy.
pub(crate) fn flash_attention_name(policy: llama_flash_attn_type) -> &'static str {
    match policy {
        LLAMA_FLASH_ATTN_TYPE_ENABLED => "on",
        LLAMA_FLASH_ATTN_TYPE_DISABLED => "off",
        FLASH_ATTN_FOR_PREFILL => "on for prefill",
        _ => "llama.cpp's choice",
    }
}

/// How far a model's load has come, from 0 to 1: llama.cpp reports it as
/// it reads the weights, and requests waiting for the model read it (the
/// progress frames of streams). Shared, so the reader never asks the
/// engine thread, which is busy loading.
#[derive(Debug, Clone, Default)]
pub struct LoadProgress(Arc<AtomicU32>);

impl LoadProgress {
    pub fn set(&self, fraction: f32) {
        self.0.store(fraction.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> f32 {
        f32::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// Layers to offload to a GPU: what the operator asked for, else llama.cpp's
/// default, which is every layer when a GPU backend is compiled in (the CPU
/// build has nowhere to put them and ignores it).
pub(crate) fn model_params(gpu_layers: Option<u32>, progress: &LoadProgress) -> LlamaModelParams {
    let progress = progress.clone();
    // llama.cpp calls back as it reads each tensor; `true` goes on loading.
    let params = LlamaModelParams::default().with_progress_callback(move |fraction| {
        progress.set(fraction);
        true
    });
    match gpu_layers {
        Some(n) => params.with_n_gpu_layers(n),
        None => params,
    }
}

/// The context parameters the engine runs with; public so the benchmark's
/// bare decode loop runs on exactly the same settings. There is one sequence
/// more than slots: the one that keeps the shared prefix.
pub fn context_params(
    n_ctx: u32,
    n_parallel: u32,
    threads: i32,
    flash_attn: llama_flash_attn_type,
) -> LlamaContextParams {
    LlamaContextParams::default()
        .with_flash_attention_policy(flash_attn)
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(BATCH_SIZE)
        .with_n_ubatch(UBATCH_SIZE)
        .with_n_seq_max(n_parallel + 1)
        // One KV buffer shared by all slots, so one long request can use the
        // whole context while the others are short.
        .with_kv_unified(true)
        // Sliding-window layers keep every position rather than only the
        // window, so a sequence can be continued or rewound wherever its
        // cache ends (no effect on models without such layers).
        .with_swa_full(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
}

/// Reads a GGUF's metadata and vocabulary, never its weights: the chat
/// format and a tokenizer for a model that runs on upstream servers.
pub(crate) fn vocabulary(path: &std::path::Path) -> Result<(ModelInfo, Arc<Tokenizer>), EngineError> {
    let load_error = |reason: String| EngineError::Load { path: path.display().to_string(), reason };
    let backend = backend().map_err(load_error)?;
    let params = llama_cpp_2::model::params::LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(backend, path, &params).map_err(|err| load_error(err.to_string()))?;
    let model = Arc::new(model);
    let config = EngineConfig { model_path: path.to_path_buf(), ..EngineConfig::default() };
    let info = model_info(&model, &config, model.n_ctx_train(), 1)?;
    Ok((info, Arc::new(Tokenizer::new(model))))
}

pub(crate) fn model_info(
    model: &LlamaModel,
    config: &EngineConfig,
    n_ctx: u32,
    n_parallel: u32,
) -> Result<ModelInfo, EngineError> {
    let architecture = model.meta_val_str("general.architecture").unwrap_or_default();
    let gguf_template = model.chat_template(None).ok().and_then(|t| t.to_string().ok());
    let vocab = model.vocab();
    let token_text = |token| String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned();
    let template = ChatTemplate::for_model(
        gguf_template.as_deref(),
        &architecture,
        &token_text(vocab.bos()),
        &token_text(vocab.eos()),
    )
    .map_err(|err| EngineError::Load {
        path: config.model_path.display().to_string(),
        reason: format!("its chat template does not compile: {err}"),
    })?;
    let id = config.name.clone().unwrap_or_else(|| file_model_name(&config.model_path));
    let kv_bytes = kv_cache_bytes(model, &architecture, n_ctx);
    Ok(ModelInfo {
        id,
        path: config.model_path.clone(),
        architecture,
        n_ctx,
        n_ctx_train: model.n_ctx_train(),
        n_parallel,
        n_params: model.n_params(),
        size_bytes: model.size(),
        kv_bytes,
        format: ChatFormat::new(template),
        embedding: config.embedding,
        n_embd: u32::try_from(model.n_embd()).unwrap_or(0),
    })
}

/// The name a model file gives its model: the file's name without `.gguf`.
pub fn file_model_name(path: &std::path::Path) -> String {
    path.file_name().map(|name| name.to_string_lossy().trim_end_matches(".gguf").to_string()).unwrap_or_default()
}

/// Bytes of a 16-bit KV cache of `n_ctx` cells: keys and values of every
/// layer's KV heads. A head's width is the GGUF's key length where it gives
/// one (Gemma's heads are wider than the embedding divided by the heads).
fn kv_cache_bytes(model: &LlamaModel, architecture: &str, n_ctx: u32) -> u64 {
    let heads = u64::from(model.n_head().max(1));
    let head_width = model
        .meta_val_str(&format!("{architecture}.attention.key_length"))
        .ok()
        .and_then(|value| value.parse::<u64>().ok())
        .unwrap_or(model.n_embd().max(0) as u64 / heads);
    let per_cell = u64::from(model.n_layer()) * u64::from(model.n_head_kv()) * head_width * 2 * 2;
    per_cell * u64::from(n_ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linked_llama_cpp_has_the_prefill_policy() {
        assert_eq!(patched_prefill_policy(), FLASH_ATTN_FOR_PREFILL);
        assert_eq!(flash_attention_name(FLASH_ATTN_FOR_PREFILL), "on for prefill");
        assert_eq!(flash_attention(FlashAttn::Prefill), FLASH_ATTN_FOR_PREFILL);
        assert_eq!(flash_attention(FlashAttn::Auto), LLAMA_FLASH_ATTN_TYPE_AUTO);
        assert_eq!(flash_attention(FlashAttn::On), LLAMA_FLASH_ATTN_TYPE_ENABLED);
        assert_eq!(flash_attention(FlashAttn::Off), LLAMA_FLASH_ATTN_TYPE_DISABLED);
    }
}
