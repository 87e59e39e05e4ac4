//! What a chat request is once the HTTP edge has validated it, and what the
//! loop reports back while it runs.

pub use crate::surface::Surface;
use skillhost_engine::{ChatMessage, ResponseFormat, SamplingParams, Timings, ToolCall, ToolChoice, ToolDef};

/// A validated chat request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    /// The model it runs on, as the client named it; `None` is the
    /// server's default model.
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// The caller's own tools: returned as calls, never executed here.
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    pub response_format: ResponseFormat,
    pub sampling: SamplingParams,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    /// Skills selected for this request, by id (validated at the edge).
    pub skills: Vec<String>,
    /// Whether unselected skills are advertised; `None` uses the server's setting.
    pub skills_discovery: Option<bool>,
    /// The client chose the temperature (so server-side defaults leave it).
    pub temperature_set: bool,
    /// A conversation whose workspace outlives this request (Web UI);
    /// `None` gives the request a workspace of its own.
    pub conversation: Option<String>,
    /// Files to write into the conversation's workspace when this request
    /// makes it anew (kept from before its folder went; see
    /// `workspace::snapshot`).
    pub restore: Option<std::sync::Arc<Vec<crate::workspace::snapshot::SavedFile>>>,
    /// Whether the model may delegate to child agents; `None` uses the
    /// server's setting, `Some(false)` turns it off for this request.
    pub multi_agent: Option<bool>,
    /// Which of the server's ways in the request came by (for the
    /// per-skill outcomes).
    pub surface: Surface,
    /// Files the user attached, named and checked at the edge; each
    /// message that carries one already holds its note.
    pub attachments: Vec<crate::attachments::Attachment>,
    /// Which of the operator's MCP servers (and tools) the request may use.
    pub mcp: McpSelection,
    /// Skills the request brought (`skills_inline`), written, loaded and
    /// scanned at the edge. The turn sees them beside the registry's and
    /// selected; their folder goes when the last clone of this drops.
    pub brought: Option<std::sync::Arc<crate::skills::inline::InlineSkills>>,
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
    /// The request names a model this server does not offer (HTTP 404).
    #[error("{0}")]
    ModelNotFound(String),
    /// The engine failed while running the request (HTTP 500).
    #[error("{0}")]
    Engine(String),
    /// The change conflicts with what is running (HTTP 409): unloading a
    /// model with running turns.
    #[error("{0}")]
    Conflict(String),
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFinish {
    Stop,
    /// The token budget ran out (or the context did).
    Length,
    ToolCalls,
    /// The turn's time budget (`--turn-timeout`) ran out.
    TimedOut,
}

impl ChatFinish {
    /// Whether a bound cut the reply: the surfaces without a word for a
    /// timeout report it as they report the token budget.
    pub fn cut_short(self) -> bool {
        matches!(self, ChatFinish::Length | ChatFinish::TimedOut)
    }
}

/// Token counts of a whole request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// One tool call the server answered itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillStep {
    /// The agent that made the call; `/root` for the request's own model.
    pub agent_id: String,
    pub tool: String,
    pub skill: Option<String>,
    /// What the call was about (a path), when anything.
    pub detail: Option<String>,
    pub ok: bool,
    /// 1-based round of the tool loop.
    pub round: u32,
}

/// Where a code tool call stands, for the Web UI's activity panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolPhase {
    Writing,
    Running,
    Finished,
}

/// Progress of one code tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolProgress {
    /// The agent that made the call; `/root` for the request's own model.
    pub agent_id: String,
    pub phase: ToolPhase,
    pub tool: String,
    /// A path or a command, shortened.
    pub detail: String,
    /// The run whose artifacts hold the produced files.
    pub run_id: String,
    /// Files produced (on `Finished`).
    pub files: Vec<Artifact>,
    pub round: u32,
}

/// What one round of the loop cost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RoundStats {
    /// The agent whose round it was; `/root` for the request's own model.
    pub agent_id: String,
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the KV cache.
    pub cached_tokens: usize,
    /// Of those, tokens copied from another sequence (another conversation
    /// or the saved shared prefix).
    pub copied_tokens: usize,
    pub generated_tokens: usize,
    pub time_to_first_token_ms: f64,
    /// What the prompt spent its tokens on.
    pub context: ContextParts,
    /// The notes of what the context budget let go before this round.
    pub demoted: Vec<String>,
}

/// Where a child agent stands, for the Web UI's activity line and panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentPhase {
    /// Started, with its task.
    Spawned,
    /// Took a follow-up message (`send_input`) and works again.
    Working,
    /// Finished its task; its report waits for the parent.
    Reported,
    /// Ended with an error or a crash; the parent reads why.
    Failed,
    /// Stopped by its parent (`close_agent`).
    Closed,
}

/// A change in a child agent's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUpdate {
    pub agent_id: String,
    pub phase: AgentPhase,
    /// The task (spawned, working) or the report's first line, shortened.
    pub detail: String,
    /// Rounds the agent has run in its current task.
    pub rounds: u32,
}

/// What a running request reports, in order: `Accepted`, then `Content`
/// and `SkillStep` as they happen, then at most one `ToolCalls`, then
/// `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// The prompt was accepted by the engine; output follows.
    Accepted,
    /// Answer text generated since the last event.
    Content(String),
    /// Thinking text (a `<think>` block) generated since the last event.
    Reasoning(String),
    /// A skill tool call was answered in process.
    SkillStep(SkillStep),
    /// A code tool call is writing, running or done.
    ToolProgress(ToolProgress),
    /// A child agent started, took input, reported, failed or was closed.
    Agent(AgentUpdate),
    /// Before `ToolCalls`, in a turn whose earlier rounds called our tools:
    /// those rounds (assistant turns and tool results) and the text the
    /// model generated for the calls, so a client can resend the turn as
    /// the model saw it and the KV prefix holds on its next request.
    ServerTurns {
        turns: Vec<ChatMessage>,
        raw: String,
    },
    /// The calls the model made to the caller's tools, complete, with unique ids.
    ToolCalls(Vec<ToolCall>),
    /// `timings` are the last round's; `rounds` has every round.
    Finished {
        finish: ChatFinish,
        usage: Usage,
        timings: Timings,
        rounds: Vec<RoundStats>,
    },
    Failed(ChatError),
}

/// Who makes the calls in a request without sub-agents.
pub const ROOT_AGENT: &str = "/root";

/// How a child's first message tells it who it is (the scripted model
/// reads it to know which agent a prompt is for).
pub const AGENT_MARK: &str = "[You are agent ";

/// A file a code run produced, as the artifact store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Relative to the workspace, `/`-separated.
    pub path: String,
    pub bytes: u64,
}

/// What a prompt spends its tokens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContextParts {
    /// The caller's system text and the server's fixed guidance.
    pub system: usize,
    /// The skills block (catalog, selected skills, rules).
    pub skills: usize,
    /// Tool declarations.
    pub tools: usize,
    /// Skill instructions the model loaded with `skills_read`.
    pub skill_bodies: usize,
    /// Results of the other tool calls.
    pub tool_results: usize,
    /// The rest of the conversation: user and assistant turns.
    pub history: usize,
}

impl ContextParts {
    pub fn total(&self) -> usize {
        self.system + self.skills + self.tools + self.skill_bodies + self.tool_results + self.history
    }

    /// The parts scaled so they add up to `tokens` (the prompt's real
    /// count; the parts are measured in bytes, and the template's own
    /// markup is spread over them).
    pub fn scaled_to(&self, tokens: usize) -> ContextParts {
        let total = self.total().max(1);
        let scale = |part: usize| part * tokens / total;
        let mut out = ContextParts {
            system: scale(self.system),
            skills: scale(self.skills),
            tools: scale(self.tools),
            skill_bodies: scale(self.skill_bodies),
            tool_results: scale(self.tool_results),
            history: scale(self.history),
        };
        // Rounding down loses a few tokens; they belong to the history.
        out.history += tokens.saturating_sub(out.total());
        out
    }
}

/// Which servers (and which of their tools) a request may use; the default
/// is every configured server, every tool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpSelection {
    /// `None`: all. `Some([])`: none.
    pub servers: Option<Vec<String>>,
    /// Per server, the only tools it may use (Responses' `allowed_tools`).
    pub allowed_tools: std::collections::BTreeMap<String, Vec<String>>,
}

impl McpSelection {
    pub fn includes(&self, server: &str) -> bool {
        self.servers.as_ref().is_none_or(|servers| servers.iter().any(|s| s == server))
    }

    pub fn allows(&self, server: &str, tool: &str) -> bool {
        self.includes(server) && self.allowed_tools.get(server).is_none_or(|tools| tools.iter().any(|t| t == tool))
    }
}
