//! Sampling parameters and the llama.cpp sampler chain built from them.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;

use crate::error::EngineError;

/// Default temperature, as llama-server uses.
pub const DEFAULT_TEMPERATURE: f32 = 0.8;
pub const DEFAULT_TOP_K: i32 = 40;
pub const DEFAULT_TOP_P: f32 = 0.95;
pub const DEFAULT_MIN_P: f32 = 0.05;
/// How many recent tokens the repetition penalties look at.
pub const DEFAULT_PENALTY_LAST_N: i32 = 64;

/// How to pick each next token. Ranges are checked at the HTTP edge.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 or below means greedy.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1.0 disables it.
    pub repeat_penalty: f32,
    /// `None` draws a random seed.
    pub seed: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: DEFAULT_TEMPERATURE,
            top_k: DEFAULT_TOP_K,
            top_p: DEFAULT_TOP_P,
            min_p: DEFAULT_MIN_P,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_penalty: 1.0,
            seed: None,
        }
    }
}

/// A compiled grammar: GBNF text and its root rule, plus the lazy trigger.
pub struct CompiledGrammar {
    pub gbnf: String,
    pub root: String,
    pub trigger: Option<String>,
}

/// Builds the chain: penalties, the grammar, then truncation and the final pick.
///
/// The grammar comes before top-k and friends so it masks the whole
/// vocabulary; after them it could leave no allowed candidate. `sample()` on
/// the chain already accepts the token into every stage, the grammar included.
pub fn build_sampler(
    model: &LlamaModel,
    params: &SamplingParams,
    grammar: Option<&CompiledGrammar>,
) -> Result<LlamaSampler, EngineError> {
    let mut chain = Vec::new();
    if params.repeat_penalty != 1.0 || params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
        chain.push(LlamaSampler::penalties(
            model.n_vocab(),
            DEFAULT_PENALTY_LAST_N,
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        ));
    }
    if let Some(grammar) = grammar {
        let sampler = match &grammar.trigger {
            Some(word) => LlamaSampler::grammar_lazy(model, &grammar.gbnf, &grammar.root, [word.as_bytes()], &[]),
            None => LlamaSampler::grammar(model, &grammar.gbnf, &grammar.root),
        };
        chain.push(
            sampler.map_err(|err| EngineError::InvalidGrammar(format!("the grammar could not be compiled: {err}")))?,
        );
    }
    if params.temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        if params.top_k > 0 {
            chain.push(LlamaSampler::top_k(params.top_k));
        }
        if params.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(params.top_p, 1));
        }
        if params.min_p > 0.0 {
            chain.push(LlamaSampler::min_p(params.min_p, 1));
        }
        chain.push(LlamaSampler::temp(params.temperature));
        chain.push(LlamaSampler::dist(params.seed.unwrap_or_else(rand::random)));
    }
    Ok(LlamaSampler::chain_simple(chain))
}
