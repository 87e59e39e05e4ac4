//! The public face of the engine: start it, submit requests, learn when it dies.
//!
//! One dedicated OS thread owns the llama.cpp backend, model and context (the
//! context borrows the model and is not `Sync`). Everything else holds an
//! [`Engine`], which is only a channel to that thread plus read-only facts.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::error::EngineError;
use crate::executor;
use crate::format::GrammarSpec;
use crate::load::LoadProgress;
use crate::protocol::{Command, EngineConfig, EngineStats, Exit, GenerateRequest, ModelInfo, Submitted};
use crate::sampling::CompiledGrammar;
use crate::tokenizer::Tokenizer;

/// A handle to the engine thread. Cheap to clone; the thread ends when the
/// last handle is dropped and every sequence has finished.
#[derive(Clone)]
pub struct Engine {
    commands: std::sync::mpsc::Sender<Command>,
    info: Arc<ModelInfo>,
    stats: Arc<EngineStats>,
    tokenizer: Arc<Tokenizer>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("model", &self.info.id).finish()
    }
}

impl Engine {
    /// Starts the engine thread and waits until the model is loaded. Blocking:
    /// call it from a blocking-capable thread.
    ///
    /// Returns the handle and a receiver that fires when the thread ends.
    pub fn start(config: EngineConfig) -> Result<(Engine, oneshot::Receiver<Exit>), EngineError> {
        Engine::start_reporting(config, LoadProgress::default())
    }

    /// [`Engine::start`], reporting how far the weights are read in `progress`.
    pub fn start_reporting(
        config: EngineConfig,
        progress: LoadProgress,
    ) -> Result<(Engine, oneshot::Receiver<Exit>), EngineError> {
        let (commands, command_rx) = std::sync::mpsc::channel();
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let stats = Arc::new(EngineStats::default());
        let thread_stats = Arc::clone(&stats);
        let spawned = std::thread::Builder::new().name("llama-engine".into()).spawn(move || {
            let _exit = ExitGuard(Some(exit_tx));
            executor::run(config, command_rx, loaded_tx, thread_stats, progress);
        });
        if let Err(err) = spawned {
            return Err(EngineError::Load {
                path: String::new(),
                reason: format!("cannot start the engine thread: {err}"),
            });
        }
        match loaded_rx.recv() {
            Ok(Ok((info, tokenizer))) => Ok((Engine { commands, info: Arc::new(info), stats, tokenizer }, exit_rx)),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(EngineError::Stopped),
        }
    }

    pub fn info(&self) -> &Arc<ModelInfo> {
        &self.info
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    /// Queues a request. The prompt is tokenized and the grammar compiled
    /// before this returns, so their errors come back here, not as events.
    /// Tokenizing runs on a blocking thread, never the engine thread: a
    /// prompt of megabytes costs its own request time, not every stream's.
    pub async fn submit(&self, request: GenerateRequest) -> Result<Submitted, EngineError> {
        if self.info.embedding {
            return Err(EngineError::BadInput(format!(
                "the model '{}' is loaded for embeddings only; send chat to a model configured without `embedding: true`",
                self.info.id
            )));
        }
        let tokenizer = Arc::clone(&self.tokenizer);
        let (request, tokens) = tokio::task::spawn_blocking(move || {
            let tokens = if request.prompt.len() > LARGE_PROMPT_BYTES {
                at_idle_priority(|| tokenizer.prompt(&request.prompt))
            } else {
                tokenizer.prompt(&request.prompt)
            };
            (request, tokens)
        })
        .await
        .map_err(|_| EngineError::Stopped)?;
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        // One token of room is needed to generate anything.
        let n_ctx = self.info.n_ctx as usize;
        if tokens.len() >= n_ctx {
            return Err(EngineError::PromptTooLong { n_prompt: tokens.len(), n_ctx });
        }
        let grammar = match &request.grammar {
            Some(spec) => Some(convert_grammar(spec.clone()).await?),
            None => None,
        };
        let (reply, reply_rx) = oneshot::channel();
        self.commands
            .send(Command::Submit { request: Box::new(request), tokens, grammar, reply })
            .map_err(|_| EngineError::Stopped)?;
        reply_rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// One unit-length vector per input, in order, from a model loaded for
    /// embeddings. An input longer than the context is cut to it when
    /// `truncate` is set (Ollama's default), else refused. Inputs are
    /// tokenized on a blocking thread, with the model's special tokens
    /// (BOS, and EOS or SEP where its vocabulary adds them), as
    /// llama-server does.
    pub async fn embed(&self, inputs: Vec<EmbedInput>, truncate: bool) -> Result<Embedded, EngineError> {
        if !self.info.embedding {
            return Err(EngineError::BadInput(format!(
                "the model '{}' is loaded for chat, not embeddings; give a models entry `embedding: true` (and `pooling:` if its GGUF declares none) to serve embeddings from it",
                self.info.id
            )));
        }
        let tokenizer = Arc::clone(&self.tokenizer);
        let n_ctx = self.info.n_ctx as usize;
        let tokenized = tokio::task::spawn_blocking(move || {
            inputs
                .into_iter()
                .map(|input| {
                    let mut tokens = match input {
                        EmbedInput::Text(text) => tokenizer.input(&text),
                        EmbedInput::Tokens(ids) => tokenizer.known(&ids)?,
                    };
                    if tokens.is_empty() {
                        return Err(EngineError::EmptyPrompt);
                    }
                    if tokens.len() > n_ctx {
                        if !truncate {
                            return Err(EngineError::PromptTooLong { n_prompt: tokens.len(), n_ctx });
                        }
                        tokens.truncate(n_ctx);
                    }
                    Ok(tokens)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|_| EngineError::Stopped)??;
        let prompt_tokens = tokenized.iter().map(Vec::len).sum();
        let (reply, reply_rx) = oneshot::channel();
        self.commands.send(Command::Embed { inputs: tokenized, reply }).map_err(|_| EngineError::Stopped)?;
        let vectors = reply_rx.await.map_err(|_| EngineError::Stopped)??;
        Ok(Embedded { vectors, prompt_tokens })
    }

    /// How many tokens `text` is as a whole prompt (tokenized on a
    /// blocking thread, like a submitted prompt).
    pub async fn count_tokens(&self, text: String) -> Result<usize, EngineError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        tokio::task::spawn_blocking(move || {
            if text.len() > LARGE_PROMPT_BYTES {
                at_idle_priority(|| tokenizer.prompt(&text).len())
            } else {
                tokenizer.prompt(&text).len()
            }
        })
        .await
        .map_err(|_| EngineError::Stopped)
    }

    /// Makes the engine thread panic (for tests of recovery).
    pub fn inject_panic(&self) {
        let _ = self.commands.send(Command::Panic);
    }
}

/// One input of an embeddings request: text, or token ids already
/// tokenized by the client (OpenAI's API takes both).
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// The answer to an embeddings request.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// One unit-length vector per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens decoded over all inputs.
    pub prompt_tokens: usize,
}

/// Work for a prompt or body larger than this (in bytes) runs at idle
/// priority: parsing, rendering and tokenizing megabytes take seconds of
/// CPU, and on a machine whose cores are all decoding that work waits for
/// spare time instead of slowing every running stream. Ordinary prompts
/// (and whole conversations of a 128k context) stay below it.
pub const LARGE_PROMPT_BYTES: usize = 1024 * 1024;

/// Runs `work` with the calling thread in Linux's `SCHED_IDLE` class, then
/// puts the thread back in the class it had. Call it on a blocking thread.
pub fn at_idle_priority<T>(work: impl FnOnce() -> T) -> T {
    // SAFETY: pid 0 is the calling thread; `param` outlives each call.
    let previous = unsafe { libc::sched_getscheduler(0) };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as above.
    let lowered = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    let result = work();
    if lowered && previous >= 0 {
        // SAFETY: as above; a non-realtime class with priority 0.
        unsafe { libc::sched_setscheduler(0, previous, &param) };
    }
    result
}

/// Stack of the thread that converts a JSON schema into a grammar.
/// llama.cpp's converter recurses once per nesting level and property;
/// schemas are bounded before they get here (`schema_limits`), and this
/// much stack leaves the bounded worst case far from the guard page.
pub const GRAMMAR_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Converts a schema on a thread of its own: off the engine thread (a large
/// schema takes a while), at idle priority, and with a stack deep enough for
/// any schema the bounds admit.
pub(crate) async fn convert_grammar(spec: GrammarSpec) -> Result<CompiledGrammar, EngineError> {
    let (done, result) = oneshot::channel();
    std::thread::Builder::new()
        .name("grammar".into())
        .stack_size(GRAMMAR_STACK_BYTES)
        .spawn(move || {
            let _ = done.send(at_idle_priority(|| crate::grammar::compile(&spec)));
        })
        .map_err(|err| EngineError::InvalidGrammar(format!("cannot start the grammar conversion: {err}")))?;
    result.await.map_err(|_| EngineError::InvalidGrammar("the grammar conversion failed".into()))?
}

/// Reports the thread's end, including a panic, when dropped.
struct ExitGuard(Option<oneshot::Sender<Exit>>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let exit =
            if std::thread::panicking() { Exit::Panicked("the engine thread panicked".into()) } else { Exit::Normal };
        if let Some(tx) = self.0.take() {
            let _ = tx.send(exit);
        }
    }
}
