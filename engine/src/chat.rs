//! The conversation as the model sees it: messages, tool declarations and
//! tool calls, independent of any wire format.

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    /// OpenAI's newer name for a system message; templates see it as `system`.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The role name chat templates expect.
    pub fn template_name(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// Calls an assistant message made (empty for other roles).
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// For a tool result: the name of the tool, when the client gave it.
    pub name: Option<String>,
    /// For an assistant turn generated inside this server: exactly what the
    /// model wrote, tool-call markup included. Rendered verbatim instead of
    /// `content` and `tool_calls`, so the next round's prompt repeats the
    /// model's own bytes and the KV cache stays reusable.
    pub raw: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage { role, content: content.into(), tool_calls: Vec::new(), tool_call_id: None, name: None, raw: None }
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Unique within the response; generated when the model did not give one.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text (OpenAI's representation).
    pub arguments: String,
}

/// Whether and how the model must call a tool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Tools are not offered to the model.
    None,
    /// The model decides between text and calls.
    #[default]
    Auto,
    /// The model must call at least one tool.
    Required,
    /// The model must call this tool.
    Named(String),
}

/// Constraint on the shape of the answer text.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ResponseFormat {
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against this schema.
    JsonSchema(serde_json::Value),
}

/// One round's conversation as data, for an upstream that renders prompts
/// itself (an OpenAI-compatible chat endpoint): what the local formats turn
/// into prompt text, sent as messages and tool declarations instead.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatPayload {
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    pub response_format: ResponseFormat,
}
