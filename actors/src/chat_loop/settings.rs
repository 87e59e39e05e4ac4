//! The loop's server-wide settings: rounds, time, temperatures, delegation,
//! as the operator's flags set them.

use std::time::Duration;

use super::agents::AgentLimits;

/// Rounds per turn unless the operator says otherwise.
pub const DEFAULT_MAX_ROUNDS: u32 = 8;
/// Rounds per turn with code execution: one fix is a write, a run, a read
/// of the traceback and a patch.
pub const DEFAULT_CODE_ROUNDS: u32 = 24;
/// The range `--skills-max-rounds` accepts.
pub const MIN_ROUNDS: u32 = 1;
pub const MAX_ROUNDS: u32 = 64;
/// How long a turn may run unless the operator says otherwise: long enough
/// for 24 rounds with a minute-long command in each, short enough that a
/// looping model does not hold a slot for good.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Server-wide loop settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoopSettings {
    pub max_rounds: u32,
    /// Advertise unselected skills unless a request says otherwise.
    pub discovery: bool,
    pub inline_selected_bodies: bool,
    pub allow_exec: bool,
    /// Temperature for requests that left it unset (clients such as Codex
    /// cannot send one).
    pub temperature: Option<f32>,
    /// The turn's token budget when the request sets none.
    pub max_tokens: Option<u32>,
    /// Temperature for code turns whose request left it at the default.
    pub code_temperature: Option<f32>,
    /// How long one turn may run, all rounds and tools together; then it
    /// ends with what it has.
    pub turn_timeout: Duration,
    /// When the model may delegate to child agents (`--multi-agent`).
    pub multi_agent: MultiAgent,
    /// Children may write and run, not only read (`--agents-allow-write`).
    pub agents_allow_write: bool,
    pub agent_limits: AgentLimits,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings {
            max_rounds: DEFAULT_MAX_ROUNDS,
            discovery: true,
            inline_selected_bodies: false,
            allow_exec: false,
            temperature: None,
            max_tokens: None,
            code_temperature: None,
            turn_timeout: DEFAULT_TURN_TIMEOUT,
            multi_agent: MultiAgent::Auto,
            agents_allow_write: false,
            agent_limits: AgentLimits::default(),
        }
    }
}

/// When requests may delegate to child agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiAgent {
    /// On requests that offer the model other tools (the caller's, skills
    /// or code tools), or that ask for it (`"multi_agent": true`). A plain
    /// question is not made to carry five tool declarations it never uses.
    Auto,
    /// On every request of a model that can call tools.
    Always,
    Off,
}
