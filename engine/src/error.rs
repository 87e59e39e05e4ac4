//! The engine's error type.

/// Why the engine could not start or could not run a request.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum EngineError {
    /// The model file could not be loaded. Start-up fails with this message.
    #[error("cannot load the model from {path}: {reason}")]
    Load { path: String, reason: String },
    /// The prompt does not fit the context. The caller's fault (HTTP 400).
    #[error("the prompt is {n_prompt} tokens long, but the context holds {n_ctx} tokens")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    /// The request does not fit this model: chat on an embedding model,
    /// embeddings from a chat model, a token id outside the vocabulary.
    /// The caller's fault (HTTP 400); the sentence says what to change.
    #[error("{0}")]
    BadInput(String),
    /// The prompt rendered to nothing. The caller's fault (HTTP 400).
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A grammar or JSON schema could not be compiled. The caller's fault (HTTP 400).
    #[error("{0}")]
    InvalidGrammar(String),
    /// llama.cpp failed to decode a batch; the request ends with this error.
    #[error("the model failed to decode: {0}")]
    Decode(String),
    /// The engine thread is gone (it panicked or was shut down). In-flight
    /// requests end with this error; the supervisor restarts the engine.
    #[error("the model engine stopped unexpectedly")]
    Stopped,
    /// No upstream server could take the request, or one failed while it
    /// streamed (HTTP 503).
    #[error("{0}")]
    Upstream(String),
    /// An upstream server refused the request as malformed (HTTP 400).
    #[error("the upstream server refused the request: {0}")]
    UpstreamRefused(String),
}
