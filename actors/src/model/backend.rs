//! What the loop needs from a model: its facts and a way to submit. The real
//! engine implements it, and so does a fleet of upstream servers; tests substitute a scripted double that replays
//! model outputs, so loop logic can be checked deterministically.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use skillhost_engine::{
    EmbedInput, Embedded, Engine, EngineError, EngineStats, GenerateRequest, ModelInfo, Remote, Submitted,
};

/// A boxed future returned by [`ModelBackend::submit`].
pub type SubmitFuture<'a> = Pin<Box<dyn Future<Output = Result<Submitted, EngineError>> + Send + 'a>>;

/// A boxed future returned by [`ModelBackend::count_tokens`].
pub type CountFuture<'a> = Pin<Box<dyn Future<Output = Result<usize, EngineError>> + Send + 'a>>;

/// A boxed future returned by [`ModelBackend::embed`].
pub type EmbedFuture<'a> = Pin<Box<dyn Future<Output = Result<Embedded, EngineError>> + Send + 'a>>;

/// A model that can run generation requests.
pub trait ModelBackend: Send + Sync {
    /// Facts about the model, its chat format included.
    fn info(&self) -> &Arc<ModelInfo>;
    /// Live counters for `/metrics`.
    fn stats(&self) -> &Arc<EngineStats>;
    /// Queues a request; see [`Engine::submit`].
    fn submit(&self, request: GenerateRequest) -> SubmitFuture<'_>;
    /// Tokens in `text` as a whole prompt; see [`Engine::count_tokens`].
    fn count_tokens(&self, text: String) -> CountFuture<'_>;
    /// One vector per input; see [`Engine::embed`]. Only a local model
    /// loaded with `embedding: true` embeds.
    fn embed(&self, inputs: Vec<EmbedInput>, truncate: bool) -> EmbedFuture<'_> {
        let _ = (inputs, truncate);
        let id = self.info().id.clone();
        Box::pin(async move {
            Err(EngineError::BadInput(format!(
                "the model '{id}' cannot embed: embeddings come from a local GGUF model configured with `embedding: true`"
            )))
        })
    }
}

impl ModelBackend for Engine {
    fn info(&self) -> &Arc<ModelInfo> {
        Engine::info(self)
    }

    fn stats(&self) -> &Arc<EngineStats> {
        Engine::stats(self)
    }

    fn submit(&self, request: GenerateRequest) -> SubmitFuture<'_> {
        Box::pin(Engine::submit(self, request))
    }

    fn count_tokens(&self, text: String) -> CountFuture<'_> {
        Box::pin(Engine::count_tokens(self, text))
    }

    fn embed(&self, inputs: Vec<EmbedInput>, truncate: bool) -> EmbedFuture<'_> {
        Box::pin(Engine::embed(self, inputs, truncate))
    }
}

impl ModelBackend for Remote {
    fn info(&self) -> &Arc<ModelInfo> {
        Remote::info(self)
    }

    fn stats(&self) -> &Arc<EngineStats> {
        Remote::stats(self)
    }

    fn submit(&self, request: GenerateRequest) -> SubmitFuture<'_> {
        Box::pin(Remote::submit(self, request))
    }

    fn count_tokens(&self, text: String) -> CountFuture<'_> {
        Box::pin(Remote::count_tokens(self, text))
    }
}
