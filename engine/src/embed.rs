//! The engine thread of a model loaded for embeddings (`embedding: true`).
//!
//! It generates nothing: each input is decoded once as a sequence of its
//! own and llama.cpp pools its token vectors into one. Inputs of every
//! waiting request that have the same length in tokens share a batch (up
//! to [`EMBED_SEQS`] of them, as many tokens as one micro-batch holds), so
//! clients sending like inputs one request at a time cost about what one
//! request with all of them would. A batch's cells are cleared before the
//! next: nothing is cached between inputs.
//!
//! Each input's vector is the one it gets decoded alone, whatever shares
//! its batch: every sequence has cells of its own (`kv_unified` off), and
//! attention runs unfused (see [`context_params`]). With one cache shared
//! by all, an input's cells sat at another offset in a batch than alone,
//! and the vectorised sums over them came out 2.7e-4 cosine distance apart.
//!
//! A sequence must be one micro-batch, because a model with bidirectional
//! attention (BERT) pools over every token at once; the micro-batch is
//! sized so (`n_ubatch` = the per-input context) and a longer input is
//! refused or cut by the submitter.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::mpsc::{Receiver, TryRecvError};

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::oneshot;

use crate::error::EngineError;
use crate::protocol::{Command, EngineConfig, FlashAttn, Pooling};
use llama_cpp_sys_2::{LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED};

/// Largest default context of an embedding model: inputs up to this many
/// tokens, each pooled whole in one micro-batch, as llama-server's default
/// micro-batch. Every one of the [`EMBED_SEQS`] sequences has this many
/// cells of its own, so unlike a chat model's it is not the training
/// context (`ctx-size` on the model's entry raises it).
pub const EMBED_MAX_CTX: u32 = 512;

/// Sequences, so inputs, one embedding batch holds at most; each has its
/// own cells, so the KV cache is this many times the per-input context.
pub const EMBED_SEQS: u32 = 8;

/// The context of an embedding model.
///
/// Attention runs unfused unless the operator asks for the fused kernel
/// (`--flash-attn on`): the fused one adds up a row's attention in chunks
/// of the cache, so one input's vector moved (1.3e-4 cosine distance) with
/// the other inputs sharing its batch; unfused, every dot product is whole
/// and a vector is the same whatever else is in the batch.
pub(crate) fn context_params(n_ctx: u32, threads: i32, pooling: Pooling, flash_attn: FlashAttn) -> LlamaContextParams {
    let flash_attn = match flash_attn {
        FlashAttn::On => LLAMA_FLASH_ATTN_TYPE_ENABLED,
        FlashAttn::Auto | FlashAttn::Off | FlashAttn::Prefill => LLAMA_FLASH_ATTN_TYPE_DISABLED,
    };
    let pooling = match pooling {
        Pooling::Declared => LlamaPoolingType::Unspecified,
        Pooling::Mean => LlamaPoolingType::Mean,
        Pooling::Cls => LlamaPoolingType::Cls,
        Pooling::Last => LlamaPoolingType::Last,
    };
    LlamaContextParams::default()
        .with_flash_attention_policy(flash_attn)
        .with_embeddings(true)
        .with_pooling_type(pooling)
        .with_n_ctx(NonZeroU32::new(n_ctx * EMBED_SEQS))
        .with_n_batch(n_ctx)
        .with_n_ubatch(n_ctx)
        .with_n_seq_max(EMBED_SEQS)
        .with_kv_unified(false)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
}

/// Why `config` cannot pool with `model`, if it cannot: llama.cpp gives no
/// vector per input without pooling, and a model that declares none
/// (every chat model) needs the operator to pick one.
pub(crate) fn pooling_problem(model: &LlamaModel, config: &EngineConfig) -> Option<String> {
    if config.pooling != Pooling::Declared {
        return None;
    }
    let architecture = model.meta_val_str("general.architecture").unwrap_or_default();
    let declared = model.meta_val_str(&format!("{architecture}.pooling_type")).ok();
    match declared.as_deref() {
        // 0 is none, 4 is ranking (a score per pair, not a vector).
        None | Some("0") | Some("4") => Some(format!(
            "it declares no pooling that gives one vector per input (pooling_type {}); set `pooling: mean`, `cls` or `last` on its models entry",
            declared.as_deref().unwrap_or("absent")
        )),
        Some(_) => None,
    }
}

/// One request's inputs and the vectors computed so far.
struct Job {
    inputs: Vec<Vec<LlamaToken>>,
    vectors: Vec<Option<Vec<f32>>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>>,
}

impl Job {
    fn new(inputs: Vec<Vec<LlamaToken>>, reply: oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>>) -> Job {
        Job { vectors: vec![None; inputs.len()], inputs, reply }
    }

    fn pending(&self) -> impl Iterator<Item = usize> + '_ {
        self.vectors.iter().enumerate().filter(|(_, vector)| vector.is_none()).map(|(index, _)| index)
    }
}

/// Runs embedding requests until every handle is dropped.
pub(crate) fn run(mut ctx: LlamaContext, commands: Receiver<Command>, n_ctx: usize) {
    let mut jobs: VecDeque<Job> = VecDeque::new();
    loop {
        if jobs.is_empty() {
            match commands.recv() {
                Ok(command) => take(command, &mut jobs),
                Err(_) => return,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(command) => take(command, &mut jobs),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if jobs.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        // A client that went away frees its inputs' turn.
        jobs.retain(|job| !job.reply.is_closed());
        if !jobs.is_empty() {
            step(&mut ctx, &mut jobs, n_ctx);
        }
    }
}

fn take(command: Command, jobs: &mut VecDeque<Job>) {
    match command {
        Command::Embed { inputs, reply } => {
            if inputs.is_empty() {
                let _ = reply.send(Ok(Vec::new()));
            } else {
                jobs.push_back(Job::new(inputs, reply));
            }
        }
        Command::Submit { reply, .. } => {
            // The handle refuses chat on an embedding model before sending.
            let _ = reply.send(Err(EngineError::BadInput("this model is loaded for embeddings only".into())));
        }
        Command::Panic => panic!("injected engine panic"),
    }
}

/// Decodes one batch, then answers every job that is complete. The batch
/// holds the oldest waiting input and every other waiting input of its
/// length in tokens, oldest job first, as many as fit.
///
/// One length per batch, because llama.cpp splits a batch of sequences
/// kept apart (`kv_unified` off, so each input's attention spans only its
/// own cells and its vector is the one it gets alone) into micro-batches
/// of equally many tokens from each: inputs of different lengths would be
/// split across micro-batches and a mean pooled over part of one.
fn step(ctx: &mut LlamaContext, jobs: &mut VecDeque<Job>, n_ctx: usize) {
    let Some(length) = jobs.iter().find_map(|job| job.pending().next().map(|index| job.inputs[index].len())) else {
        return;
    };
    let mut batch = LlamaBatch::new(n_ctx, EMBED_SEQS as i32);
    // (job, input) of each sequence in the batch, by sequence id.
    let mut placed: Vec<(usize, usize)> = Vec::new();
    'fill: for (job_index, job) in jobs.iter().enumerate() {
        for index in job.pending().filter(|&index| job.inputs[index].len() == length) {
            if placed.len() == EMBED_SEQS as usize || (placed.len() + 1) * length > n_ctx {
                break 'fill;
            }
            placed.push((job_index, index));
        }
    }
    for (seq, &(job_index, index)) in placed.iter().enumerate() {
        if let Err(err) = batch.add_sequence(&jobs[job_index].inputs[index], seq as i32, true) {
            fail_all(jobs, &format!("cannot build the batch: {err}"));
            return;
        }
    }
    if placed.is_empty() {
        // The submitter cuts or refuses inputs longer than the context, so
        // this is a bug; failing beats spinning on a batch of nothing.
        fail_all(jobs, "an input is longer than the context");
        return;
    }
    ctx.clear_kv_cache();
    let decoded = {
        let _turn = crate::turn::step_turn();
        ctx.decode(&mut batch)
    };
    if let Err(err) = decoded {
        fail_all(jobs, &err.to_string());
        return;
    }
    for (seq, (job_index, index)) in placed.into_iter().enumerate() {
        match ctx.embeddings_seq_ith(seq as i32) {
            Ok(vector) => jobs[job_index].vectors[index] = Some(normalized(vector)),
            Err(_) => {
                fail_all(jobs, "llama.cpp returned no pooled vector");
                return;
            }
        }
    }
    let (done, waiting): (VecDeque<Job>, VecDeque<Job>) =
        jobs.drain(..).partition(|job| job.pending().next().is_none());
    *jobs = waiting;
    for job in done {
        let _ = job.reply.send(Ok(job.vectors.into_iter().flatten().collect()));
    }
}

fn fail_all(jobs: &mut VecDeque<Job>, reason: &str) {
    tracing::error!(reason, "an embedding batch failed");
    for job in jobs.drain(..) {
        let _ = job.reply.send(Err(EngineError::Decode(reason.to_string())));
    }
}

/// `vector` scaled to unit length, as llama-server and Ollama return
/// embeddings (its cosine similarity to another is then a dot product).
pub(crate) fn normalized(vector: &[f32]) -> Vec<f32> {
    let norm = vector.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm == 0.0 {
        return vector.to_vec();
    }
    vector.iter().map(|x| (f64::from(*x) / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_is_scaled_to_unit_length_and_zero_stays_zero() {
        let unit = normalized(&[3.0, 4.0]);
        assert!((unit[0] - 0.6).abs() < 1e-6 && (unit[1] - 0.8).abs() < 1e-6);
        assert_eq!(normalized(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
