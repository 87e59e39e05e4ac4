//! Sampling parameters and the llama.cpp sampler chain built from them.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

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
    /// Keep generating past end-of-generation tokens (until `max_tokens` or
    /// the context is full), as llama-server's `ignore_eos`. Ignored under a
    /// grammar, which needs its end token to finish.
    pub ignore_eos: bool,
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
            ignore_eos: false,
        }
    }
}

/// A compiled grammar: GBNF text and its root rule, plus the lazy trigger.
pub struct CompiledGrammar {
    pub gbnf: String,
    pub root: String,
    pub trigger: Option<String>,
}

/// The sampler of one sequence: a chain (penalties, truncation, the final
/// pick) and, separately, an optional grammar.
///
/// The grammar is checked against the token the chain picked and applied to
/// the whole vocabulary only when that token is not allowed, as llama.cpp's
/// own server does: masking a 49k-token vocabulary on every step made
/// constrained generation some twenty times slower than free text.
pub struct Sampler {
    chain: LlamaSampler,
    grammar: Option<LlamaSampler>,
}

impl Sampler {
    /// `eog_tokens` are the model's end-of-generation tokens, for `ignore_eos`.
    pub fn new(
        model: &LlamaModel,
        params: &SamplingParams,
        grammar: Option<&CompiledGrammar>,
        eog_tokens: &[LlamaToken],
    ) -> Result<Self, EngineError> {
        let grammar =
            match grammar {
                None => None,
                Some(grammar) => {
                    let sampler = match &grammar.trigger {
                        Some(word) => {
                            LlamaSampler::grammar_lazy(model, &grammar.gbnf, &grammar.root, [word.as_bytes()], &[])
                        }
                        None => LlamaSampler::grammar(model, &grammar.gbnf, &grammar.root),
                    };
                    Some(sampler.map_err(|err| {
                        EngineError::InvalidGrammar(format!("the grammar could not be compiled: {err}"))
                    })?)
                }
            };
        let banned = if params.ignore_eos && grammar.is_none() { eog_tokens } else { &[] };
        Ok(Sampler { chain: build_chain(model, params, banned), grammar })
    }

    /// Picks the next token from the logits at `index` of the last batch and
    /// records it in every stage.
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, index: i32, model: &LlamaModel) -> LlamaToken {
        let Some(grammar) = self.grammar.as_mut() else {
            // `sample` already accepts the token into the chain; accepting it
            // again would advance stateful stages twice.
            return self.chain.sample(ctx, index);
        };
        let mut candidates = ctx.token_data_array_ith(index);
        candidates.apply_sampler(&mut self.chain);
        let picked = candidates.selected_token();
        let allowed = picked.is_some_and(|token| {
            let mut single = LlamaTokenDataArray::new(vec![LlamaTokenData::new(token, 1.0, 0.0)], false);
            single.apply_sampler(grammar);
            single.data.first().is_some_and(|d| d.logit().is_finite())
        });
        let token = match picked {
            Some(token) if allowed => token,
            _ => {
                let mut candidates = ctx.token_data_array_ith(index);
                candidates.apply_sampler(grammar);
                candidates.apply_sampler(&mut self.chain);
                candidates.selected_token().unwrap_or_else(|| model.vocab().eos())
            }
        };
        // An end-of-generation token ends the sequence; the grammar only lets
        // it through in an accepting state, and feeding it on is pointless.
        if !model.vocab().is_eog(token) {
            grammar.accept(token);
        }
        self.chain.accept(token);
        token
    }
}

/// Builds the chain: banned tokens, penalties, then truncation and the final pick.
fn build_chain(model: &LlamaModel, params: &SamplingParams, banned: &[LlamaToken]) -> LlamaSampler {
    let mut chain = Vec::new();
    if !banned.is_empty() {
        let biases: Vec<LlamaLogitBias> = banned.iter().map(|&t| LlamaLogitBias::new(t, f32::NEG_INFINITY)).collect();
        chain.push(LlamaSampler::logit_bias(model.n_vocab(), &biases));
    }
    if params.repeat_penalty != 1.0 || params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
        chain.push(LlamaSampler::penalties(
            model.n_vocab(),
            DEFAULT_PENALTY_LAST_N,
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        ));
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
    LlamaSampler::chain_simple(chain)
}
