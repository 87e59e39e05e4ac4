//! The five coordination tools (`spawn_agent`, `send_input`, `wait_agent`,
//! `close_agent`, `list_agents`): their declarations and the readers that
//! turn a call into an [`AgentOp`]. They share one file because they are
//! one protocol; what each does is the parent loop's bookkeeping
//! (`chat_loop::agents`), reached through the loop's mailbox.

use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use serde_json::{json, Map, Value};
use skillhost_engine::{ToolCall, ToolDef};

use super::{args, Answer, Tool, ToolError};

/// A task message of at most this many bytes: a task is a paragraph or a
/// page, not a document (a child reads documents with its own tools).
pub const MAX_TASK_BYTES: usize = 16 * 1024;
/// `wait_agent` waits this long when the call names no timeout.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The longest `wait_agent` waits; a longer timeout is cut to this, and
/// the result says so. The model can always wait again.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// The coordination tools' names.
pub const NAMES: [&str; 5] = ["spawn_agent", "send_input", "wait_agent", "close_agent", "list_agents"];

/// What a coordination call asks of the loop.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentOp {
    Spawn {
        message: String,
        role: Option<String>,
        skills: Option<Vec<String>>,
        tools: Option<Vec<String>>,
    },
    Send {
        id: String,
        message: String,
    },
    /// Waits until one of `ids` (every open child when empty) has a report.
    Wait {
        ids: Vec<String>,
    },
    /// What a wait that timed out answers: where each of `ids` stands.
    Status {
        ids: Vec<String>,
        waited: Duration,
        note: Option<String>,
    },
    Close {
        id: String,
    },
    List,
}

/// A call read: the operation, how long a wait may take, and a note for
/// the result (a timeout that was cut to the limit).
pub struct Read {
    pub op: AgentOp,
    pub wait: Duration,
    pub note: Option<String>,
}

/// How long a coordination call other than a wait may take the loop.
const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the coordination calls go: the loop that holds the children,
/// through its mailbox. The tool router holds one only when delegation is
/// on; the loop makes it, so the tools never name the loop's messages.
#[derive(Clone)]
pub struct AgentDesk(Arc<dyn Fn(AgentOp, RpcReplyPort<String>) -> bool + Send + Sync>);

impl AgentDesk {
    /// `send` hands an operation and its reply port to the loop; false
    /// when the loop is gone.
    pub fn new(send: impl Fn(AgentOp, RpcReplyPort<String>) -> bool + Send + Sync + 'static) -> AgentDesk {
        AgentDesk(Arc::new(send))
    }

    /// The loop's answer to `op`; `None` when it is gone or `timeout`
    /// passed first (`Some(None)`).
    async fn ask(&self, op: AgentOp, timeout: Duration) -> Option<Option<String>> {
        let (reply, answer) = ractor::concurrency::oneshot();
        if !(self.0)(op, RpcReplyPort::from(reply)) {
            return None;
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(text)) => Some(Some(text)),
            Ok(Err(_)) => None,
            Err(_) => Some(None),
        }
    }

    /// Answers a coordination call. A wait that times out asks where the
    /// agents stand instead.
    pub async fn call(&self, tool: Tool, agent_id: &str, call: &ToolCall) -> Result<Answer, ToolError> {
        let args = args::arguments(call);
        let read = read(tool, agent_id, &args).map_err(ToolError::Model)?;
        let gone = || ToolError::Fatal("the request ended while an agent call was answered".into());
        let timeout = match &read.op {
            AgentOp::Wait { .. } => read.wait,
            _ => OP_TIMEOUT,
        };
        let text = match self.ask(read.op.clone(), timeout).await {
            Some(Some(text)) => text,
            Some(None) => {
                let AgentOp::Wait { ids } = read.op else { return Err(gone()) };
                let status = AgentOp::Status { ids, waited: read.wait, note: read.note.clone() };
                return match self.ask(status, OP_TIMEOUT).await {
                    Some(Some(text)) => Ok(Answer::done(text)),
                    _ => Err(gone()),
                };
            }
            None => return Err(gone()),
        };
        let text = match read.note {
            Some(note) => format!("{text}\n{note}"),
            None => text,
        };
        Ok(Answer { detail: None, ..Answer::done(text) })
    }
}

/// The declarations, in a fixed order. They ride beside every other tool
/// a request offers, so they are kept short; the skills and tools a
/// child may be given are checked when it is started, not listed here
/// (a long skills list would be repeated in the prompt). `skills` and
/// `tools` are offered only when the caller has some to share: a small
/// model fills every field it is shown.
pub fn declarations(share_skills: bool, share_tools: bool) -> Vec<ToolDef> {
    let ids = json!({"type": "array", "items": {"type": "string"}, "description": "Which agents; any of yours when omitted."});
    let mut spawn = json!({
        "type": "object",
        "properties": {
            "message": {"type": "string", "description": "The whole task."},
            "role": {"type": "string", "description": "A short label, such as reviewer."}
        },
        "required": ["message"]
    });
    if share_skills {
        spawn["properties"]["skills"] = json!({"type": "array", "items": {"type": "string"}, "description": "Skills it may use; yours when omitted."});
    }
    if share_tools {
        spawn["properties"]["tools"] = json!({"type": "array", "items": {"type": "string"}, "description": "Tools it may use; all it may have when omitted."});
    }
    vec![
        ToolDef {
            name: Tool::SpawnAgent.name().into(),
            description: "Start a helper agent on a self-contained task; it works while you go on and sees nothing of this conversation. Read its report with wait_agent.".into(),
            parameters: spawn,
        },
        ToolDef {
            name: Tool::SendInput.name().into(),
            description: "Send a follow-up to one of your agents.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"id": {"type": "string", "description": "Such as /root/1."}, "message": {"type": "string"}},
                "required": ["id", "message"]
            }),
        },
        ToolDef {
            name: Tool::WaitAgent.name().into(),
            description: "Wait for a report from your agents.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"ids": ids, "timeout_ms": {"type": "integer", "description": "30000 when omitted, at most 300000."}},
                "required": []
            }),
        },
        ToolDef {
            name: Tool::CloseAgent.name().into(),
            description: "Stop an agent you no longer need.".into(),
            parameters: json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
        },
        ToolDef {
            name: Tool::ListAgents.name().into(),
            description: "List your agents and where each stands.".into(),
            parameters: json!({"type": "object", "properties": {}, "required": []}),
        },
    ]
}

/// A list argument sent as an array, as one string, or as a string that
/// holds a JSON array (small models send all three).
fn list(args: &Map<String, Value>, keys: &[&str]) -> Option<Vec<String>> {
    let value = keys.iter().find_map(|key| args.get(*key))?;
    let items = match value {
        Value::Array(items) => items.clone(),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => items,
            _ => text.split(',').map(|item| Value::String(item.trim().to_string())).collect(),
        },
        Value::Null => return None,
        other => vec![other.clone()],
    };
    Some(
        items
            .into_iter()
            .filter_map(|item| match item {
                Value::String(s) => Some(s.trim().to_string()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .filter(|s| !s.is_empty())
            .collect(),
    )
}

/// An agent id as the model wrote it: `/root/1`, or `1` for a child of the
/// caller, or `root/1`.
pub fn agent_id(parent: &str, written: &str) -> String {
    let written = written.trim();
    if written.starts_with('/') {
        written.to_string()
    } else if written.starts_with("root") {
        format!("/{written}")
    } else {
        format!("{parent}/{written}")
    }
}

/// Reads a coordination call made by the agent `me`. `Err` is the sentence
/// the model reads.
pub fn read(tool: Tool, me: &str, args: &Map<String, Value>) -> Result<Read, String> {
    let read = |op| Ok(Read { op, wait: DEFAULT_WAIT, note: None });
    let id = || {
        args::trimmed(args, &["id", "agent_id", "agent"])
            .filter(|id| !id.is_empty())
            .map(|id| agent_id(me, &id))
            .ok_or_else(|| format!("{} needs the agent's id, such as {me}/1.", tool.name()))
    };
    let message = |name: &str| {
        let message = args::text(args, &["message", "task", "input", "prompt"]).unwrap_or_default();
        if message.trim().is_empty() {
            return Err(format!("{name} needs a message: the text the agent should read."));
        }
        if message.len() > MAX_TASK_BYTES {
            return Err(format!(
                "The message is {} bytes; a message to an agent may have at most {MAX_TASK_BYTES}. Shorten it, or let the agent read the long part with its tools.",
                message.len()
            ));
        }
        Ok(message)
    };
    match tool {
        Tool::SpawnAgent => read(AgentOp::Spawn {
            message: message("spawn_agent")?,
            role: args::trimmed(args, &["role", "agent_type", "name"]).filter(|r| !r.is_empty()),
            skills: list(args, &["skills", "skill"]),
            tools: list(args, &["tools"]),
        }),
        Tool::SendInput => read(AgentOp::Send { id: id()?, message: message("send_input")? }),
        Tool::WaitAgent => {
            let mut ids = list(args, &["ids", "agents"]).unwrap_or_default();
            if let Some(one) = args::trimmed(args, &["id", "agent_id", "agent"]).filter(|id| !id.is_empty()) {
                ids.push(one);
            }
            let ids = ids.iter().map(|id| agent_id(me, id)).collect();
            let asked = args::number(args, "timeout_ms").map(Duration::from_millis);
            let (wait, note) = match asked {
                None => (DEFAULT_WAIT, None),
                Some(asked) if asked > MAX_WAIT => (
                    MAX_WAIT,
                    Some(format!("(timeout_ms was cut to {}, the longest one wait may take.)", MAX_WAIT.as_millis())),
                ),
                Some(asked) => (asked, None),
            };
            Ok(Read { op: AgentOp::Wait { ids }, wait, note })
        }
        Tool::CloseAgent => read(AgentOp::Close { id: id()? }),
        Tool::ListAgents => read(AgentOp::List),
        _ => Err(format!("{} is not a coordination tool.", tool.name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn wait_agent_requires_nothing_and_renders_an_empty_list() {
        let declared: Vec<String> = declarations(true, true).into_iter().map(|d| d.name).collect();
        assert_eq!(declared, NAMES);
        let wait = declarations(false, false).into_iter().find(|d| d.name == "wait_agent").unwrap();
        assert_eq!(wait.parameters["required"], json!([]));
        let read = read(Tool::WaitAgent, "/root", &Map::new()).unwrap();
        assert_eq!(read.op, AgentOp::Wait { ids: Vec::new() });
        assert_eq!(read.wait, DEFAULT_WAIT);
    }

    #[test]
    fn wait_timeout_is_kept_at_the_limit_and_cut_one_past_it() {
        let at = read(Tool::WaitAgent, "/root", &object(json!({"timeout_ms": MAX_WAIT.as_millis() as u64}))).unwrap();
        assert_eq!((at.wait, at.note), (MAX_WAIT, None));
        let past =
            read(Tool::WaitAgent, "/root", &object(json!({"timeout_ms": MAX_WAIT.as_millis() as u64 + 1}))).unwrap();
        assert_eq!(past.wait, MAX_WAIT);
        assert!(past.note.unwrap().contains("cut to 300000"));
    }

    #[test]
    fn ids_come_as_arrays_strings_or_bare_numbers() {
        let read_ids = |value: Value| match read(Tool::WaitAgent, "/root", &object(value)).unwrap().op {
            AgentOp::Wait { ids } => ids,
            other => panic!("{other:?}"),
        };
        assert_eq!(read_ids(json!({"ids": ["/root/1", "2"]})), ["/root/1", "/root/2"]);
        assert_eq!(read_ids(json!({"ids": "[\"/root/3\"]"})), ["/root/3"]);
        assert_eq!(read_ids(json!({"ids": "root/4, 5"})), ["/root/4", "/root/5"]);
        assert_eq!(read_ids(json!({"id": 6})), ["/root/6"]);
        assert_eq!(agent_id("/root/1", "2"), "/root/1/2");
    }

    #[test]
    fn a_task_message_is_taken_at_the_limit_and_refused_one_past_it() {
        let at = "a".repeat(MAX_TASK_BYTES);
        assert!(read(Tool::SpawnAgent, "/root", &object(json!({"message": at}))).is_ok());
        let past = "a".repeat(MAX_TASK_BYTES + 1);
        let err = read(Tool::SpawnAgent, "/root", &object(json!({"message": past}))).err().unwrap();
        assert!(err.contains("at most 16384"), "{err}");
        let err = read(Tool::SpawnAgent, "/root", &Map::new()).err().unwrap();
        assert!(err.contains("needs a message"), "{err}");
        let err = read(Tool::SendInput, "/root", &object(json!({"message": "x"}))).err().unwrap();
        assert!(err.contains("needs the agent's id"), "{err}");
    }
}
