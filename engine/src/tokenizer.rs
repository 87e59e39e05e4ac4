//! Prompt tokenization, shared by the engine thread and the threads that
//! submit requests. Tokenizing reads only the model's vocabulary
//! (`llama_tokenize` is safe to call from several threads at once), and it
//! is the costly part of taking a request: a few megabytes of text take
//! seconds. Done on the submitting side, it never stalls decoding.

use std::sync::Arc;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

/// The model's vocabulary, usable from any thread.
pub(crate) struct Tokenizer {
    model: Arc<LlamaModel>,
    /// The BOS token's text: templates usually write it themselves.
    bos_text: String,
}

impl Tokenizer {
    pub(crate) fn new(model: Arc<LlamaModel>) -> Self {
        let vocab = model.vocab();
        let bos_text = String::from_utf8_lossy(&vocab.token_to_piece(vocab.bos(), true, None)).into_owned();
        Tokenizer { model, bos_text }
    }

    /// A whole prompt: BOS is added when the model wants one and the text
    /// does not already start with it (that would put two at the front).
    pub(crate) fn prompt(&self, text: &str) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let add_bos = vocab.should_add_bos() && (self.bos_text.is_empty() || !text.starts_with(&self.bos_text));
        vocab.tokenize(text.as_bytes(), add_bos, true)
    }

    /// An embedding input: with the special tokens the vocabulary adds
    /// around a text (BOS; EOS or SEP for BERT-like models).
    pub(crate) fn input(&self, text: &str) -> Vec<LlamaToken> {
        self.model.vocab().tokenize(text.as_bytes(), true, true)
    }

    /// Token ids a client sent, each checked against the vocabulary:
    /// llama.cpp would read past its tables for one that is not in it.
    pub(crate) fn known(&self, ids: &[u32]) -> Result<Vec<LlamaToken>, crate::EngineError> {
        let n_vocab = self.model.n_vocab().max(0) as u32;
        ids.iter()
            .map(|&id| {
                if id < n_vocab {
                    Ok(LlamaToken::new(id as i32))
                } else {
                    Err(crate::EngineError::BadInput(format!(
                        "token id {id} is not in the model's vocabulary (ids run from 0 to {})",
                        n_vocab.saturating_sub(1)
                    )))
                }
            })
            .collect()
    }

    /// Text that continues tokens already in a sequence.
    pub(crate) fn continuation(&self, text: &str) -> Vec<LlamaToken> {
        self.model.vocab().tokenize(text.as_bytes(), false, true)
    }
}
