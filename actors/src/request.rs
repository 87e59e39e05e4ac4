//! What a chat request is once the HTTP edge has validated it, and what the
//! loop reports back while it runs.

use skillhost_engine::{ChatMessage, ResponseFormat, SamplingParams, Timings, ToolCall, ToolChoice, ToolDef};

/// A validated chat request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// The caller's own tools: returned as calls, never executed here.
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    pub response_format: ResponseFormat,
    pub sampling: SamplingParams,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
}

/// Why a request ended without an answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatError {
    /// The request cannot be served as given (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    /// No model is loaded right now: it is loading or restarting (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// The engine failed while running the request (HTTP 500).
    #[error("{0}")]
    Engine(String),
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFinish {
    Stop,
    Length,
    ToolCalls,
}

/// Token counts of a whole request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// What a running request reports, in order: `Accepted`, then any number of
/// `Content`, then at most one `ToolCalls`, then `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// The prompt was accepted by the engine; output follows.
    Accepted,
    /// Answer text generated since the last event.
    Content(String),
    /// The calls the model made, complete, with unique ids.
    ToolCalls(Vec<ToolCall>),
    Finished {
        finish: ChatFinish,
        usage: Usage,
        timings: Timings,
    },
    Failed(ChatError),
}
