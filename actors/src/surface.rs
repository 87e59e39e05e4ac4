//! The ways a chat request reaches the loop: its own module, because both
//! the request and the skills' outcome table name it, and the request
//! names skills.

/// The ways a chat request reaches the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Surface {
    /// `/v1/chat/completions`.
    #[default]
    OpenAi,
    /// `/v1/responses`.
    Responses,
    /// `/v1/messages`.
    Anthropic,
    /// Ollama's `/api/chat/ollama` and `/ollama/api/chat`.
    Ollama,
    /// The Web UI's `/api/chat`.
    WebUi,
    /// `skillhost chat`, in process.
    Cli,
}

impl Surface {
    pub const ALL: [Surface; 6] =
        [Surface::OpenAi, Surface::Responses, Surface::Anthropic, Surface::Ollama, Surface::WebUi, Surface::Cli];

    /// The label `/metrics` and the skills API use.
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::OpenAi => "openai",
            Surface::Responses => "responses",
            Surface::Anthropic => "anthropic",
            Surface::Ollama => "ollama",
            Surface::WebUi => "webui",
            Surface::Cli => "cli",
        }
    }
}
