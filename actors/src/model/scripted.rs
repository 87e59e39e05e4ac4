//! A scripted model for testing loop logic deterministically: it replays
//! prepared outputs in order, streaming each in small pieces, and records
//! every prompt it was given. Outputs may be meant for one agent (a child
//! is told its id in its first prompt), so children that run side by side
//! each get theirs whatever order they ask in. It never stands in for the
//! real model in a test of model behaviour.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use skillhost_engine::template::ChatTemplate;
use skillhost_engine::{
    ChatFormat, EngineError, EngineStats, FinishReason, GenerateRequest, GenerationEvent, ModelInfo, Submitted, Timings,
};
use tokio::sync::mpsc;

use super::backend::{CountFuture, ModelBackend, SubmitFuture};

/// Bytes per streamed piece, small enough to split markup across pieces.
const PIECE_BYTES: usize = 7;

/// One output to replay, for the agent it is meant for.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedOutput {
    /// `/root`, or a child's id.
    pub agent: String,
    pub text: String,
    /// Waits this long before the first piece (a slow generation).
    pub delay: std::time::Duration,
    /// Panics when submitted, in the caller's task (a bug in a loop).
    pub panic: bool,
    /// Streams this many pieces, then never ends (a generation that a
    /// bound outside it cuts).
    pub stall_after: Option<usize>,
    /// Waits for a permit of this before the first piece: the test decides
    /// when the output goes on (after it changed something under the turn).
    pub gate: Option<Gate>,
}

/// A permit a scripted output waits for; equal to itself only.
#[derive(Debug, Clone)]
pub struct Gate(pub Arc<tokio::sync::Semaphore>);

impl Gate {
    pub fn closed() -> Gate {
        Gate(Arc::new(tokio::sync::Semaphore::new(0)))
    }

    /// Lets one waiting output go on.
    pub fn open(&self) {
        self.0.add_permits(1);
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Gate) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl From<String> for ScriptedOutput {
    fn from(text: String) -> Self {
        ScriptedOutput {
            agent: crate::request::ROOT_AGENT.into(),
            text,
            delay: std::time::Duration::ZERO,
            panic: false,
            stall_after: None,
            gate: None,
        }
    }
}

impl From<&str> for ScriptedOutput {
    fn from(text: &str) -> Self {
        text.to_string().into()
    }
}

/// The agent a prompt is for: a child's first message names it.
fn agent_of(prompt: &str) -> String {
    let mark = crate::request::AGENT_MARK;
    match prompt.rfind(mark) {
        Some(at) => prompt[at + mark.len()..]
            .split(|c: char| !(c == '/' || c.is_ascii_alphanumeric()))
            .next()
            .unwrap_or_default()
            .to_string(),
        None => crate::request::ROOT_AGENT.into(),
    }
}

/// What the loop asked of the model, one prompt at a time.
struct Submission {
    agent: String,
    prompt: String,
    temperature: f32,
    /// The grammar held the output to a call from the first token (a
    /// forced tool choice).
    forced: bool,
}

pub struct ScriptedBackend {
    info: Arc<ModelInfo>,
    stats: Arc<EngineStats>,
    outputs: Mutex<VecDeque<ScriptedOutput>>,
    submitted: Mutex<Vec<Submission>>,
    /// Refuse prompts longer than the context (four bytes a token), as the
    /// engine does.
    limit_context: bool,
}

impl ScriptedBackend {
    /// A model whose chat template is `template` (GGUF text, or `None` for
    /// a base model of `architecture` with no template).
    pub fn new(template: Option<&str>, architecture: &str, n_ctx: u32, outputs: Vec<String>) -> Result<Self, String> {
        Self::for_agents(template, architecture, n_ctx, outputs.into_iter().map(ScriptedOutput::from).collect())
    }

    /// As [`ScriptedBackend::new`], with outputs meant for given agents.
    pub fn for_agents(
        template: Option<&str>,
        architecture: &str,
        n_ctx: u32,
        outputs: Vec<ScriptedOutput>,
    ) -> Result<Self, String> {
        let template = ChatTemplate::for_model(template, architecture, "", "").map_err(|err| err.to_string())?;
        let info = ModelInfo {
            id: "scripted".into(),
            path: PathBuf::from("scripted.gguf"),
            architecture: architecture.into(),
            n_ctx,
            n_ctx_train: n_ctx,
            n_parallel: 1,
            n_params: 0,
            size_bytes: 0,
            kv_bytes: 0,
            format: ChatFormat::new(template),
            embedding: false,
            n_embd: 0,
        };
        Ok(ScriptedBackend {
            info: Arc::new(info),
            stats: Arc::new(EngineStats::default()),
            outputs: Mutex::new(outputs.into()),
            submitted: Mutex::new(Vec::new()),
            limit_context: false,
        })
    }

    /// Names the model `id` (a server with several scripted models).
    pub fn named(mut self, id: &str) -> Self {
        if let Some(info) = Arc::get_mut(&mut self.info) {
            info.id = id.to_string();
        }
        self
    }

    /// Refuses a prompt longer than the context, counting four bytes a token.
    pub fn limiting_context(mut self) -> Self {
        self.limit_context = true;
        self
    }

    /// The agent of each prompt so far.
    pub fn agents(&self) -> Vec<String> {
        self.each(|s| s.agent.clone())
    }

    /// Every prompt submitted so far, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.each(|s| s.prompt.clone())
    }

    /// For each prompt so far, the temperature it was sampled at.
    pub fn temperatures(&self) -> Vec<f32> {
        self.each(|s| s.temperature)
    }

    /// For each prompt so far, whether a tool call was forced.
    pub fn forced_calls(&self) -> Vec<bool> {
        self.each(|s| s.forced)
    }

    fn each<T>(&self, field: impl Fn(&Submission) -> T) -> Vec<T> {
        self.submitted.lock().map(|all| all.iter().map(field).collect()).unwrap_or_default()
    }
}

impl ModelBackend for ScriptedBackend {
    fn info(&self) -> &Arc<ModelInfo> {
        &self.info
    }

    fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    fn count_tokens(&self, text: String) -> CountFuture<'_> {
        // As `submit` counts a prompt.
        Box::pin(async move { Ok(text.len().div_ceil(4)) })
    }

    fn submit(&self, request: GenerateRequest) -> SubmitFuture<'_> {
        let n_prompt = request.prompt.len().div_ceil(4);
        // Like the engine, a piece is a token and the budget cuts the output.
        let budget = request.max_tokens.map_or(usize::MAX, |n| n as usize);
        let n_ctx = self.info.n_ctx as usize;
        if self.limit_context && n_prompt > n_ctx {
            return Box::pin(async move { Err(EngineError::PromptTooLong { n_prompt, n_ctx }) });
        }
        let agent = agent_of(&request.prompt);
        let output = self.outputs.lock().ok().and_then(|mut outputs| {
            let at = outputs.iter().position(|o| o.agent == agent)?;
            outputs.remove(at)
        });
        if output.as_ref().is_some_and(|o| o.panic) {
            panic!("scripted panic for {agent}");
        }
        if let Ok(mut submitted) = self.submitted.lock() {
            submitted.push(Submission {
                agent,
                forced: request.grammar.as_ref().is_some_and(|grammar| grammar.trigger.is_none()),
                temperature: request.sampling.temperature,
                prompt: request.prompt,
            });
        }
        Box::pin(async move {
            let output = output.ok_or_else(|| EngineError::Decode("the script has no more outputs".into()))?;
            let (events, receiver) = mpsc::unbounded_channel();
            let (delay, stall_after, gate, output) = (output.delay, output.stall_after, output.gate, output.text);
            let generated = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = generated.clone();
            let mut pieces = 0;
            let mut reason = FinishReason::Stop;
            let waits = gate.is_some();
            let stream = async move {
                if let Some(Gate(permits)) = gate {
                    let _ = permits.acquire().await.map(tokio::sync::SemaphorePermit::forget);
                }
                tokio::time::sleep(delay).await;
                let mut rest = output.as_str();
                while !rest.is_empty() {
                    if stall_after == Some(pieces) {
                        // Held open until the receiver goes.
                        events.closed().await;
                        return;
                    }
                    if pieces == budget {
                        reason = FinishReason::Length;
                        break;
                    }
                    let mut cut = PIECE_BYTES.min(rest.len());
                    while !rest.is_char_boundary(cut) {
                        cut += 1;
                    }
                    let _ = events.send(GenerationEvent::Text(rest[..cut].to_string()));
                    rest = &rest[cut..];
                    pieces += 1;
                    counted.store(pieces, std::sync::atomic::Ordering::Relaxed);
                }
                let timings = Timings { prompt_n: n_prompt, predicted_n: pieces, ..Timings::default() };
                let _ = events.send(GenerationEvent::Finished { reason, timings });
            };
            if delay.is_zero() && stall_after.is_none() && !waits {
                stream.await;
            } else {
                tokio::spawn(stream);
            }
            Ok(Submitted { events: receiver, n_prompt, generated })
        })
    }
}
