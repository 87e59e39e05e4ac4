//! MCP servers as a tool source: the operator's servers (stdio, started
//! confined on first use; or streamable HTTP at their configured URL) offer
//! their tools to the model as `mcp__SERVER__TOOL`, Claude Code's spelling,
//! and the loop answers those calls like its own tools. Nothing here is a
//! loop of its own: [`hub::McpHub`] keeps the connections, a turn takes a
//! snapshot of the catalog when it starts ([`TurnMcp`]) so its prompt stays
//! byte-stable, and the router sends each call through the hub.

pub mod config;
pub mod hosted;
pub mod hub;
pub mod lines;
pub mod result;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::request::McpSelection;

use serde_json::{json, Map, Value};
use skillhost_engine::ToolDef;

/// What every MCP tool's name starts with.
pub const PREFIX: &str = "mcp__";
/// The one tool that reads a server's resources.
pub const READ_RESOURCE: &str = "mcp_read_resource";
/// Tools taken from one server; past them the rest are left out, named in
/// the log and in the listing.
pub const MAX_TOOLS_PER_SERVER: usize = 64;
/// Characters of a tool's description the model reads.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Longest tool name the model is given (`mcp__SERVER__TOOL` whole):
/// OpenAI's and Anthropic's limit, which clients forward tools under.
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// `mcp__SERVER__TOOL`.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{PREFIX}{server}__{tool}")
}

/// The server and the tool of `mcp__SERVER__TOOL`; server names never hold
/// `__`, so the first one after the prefix ends the server's.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    let (server, tool) = name.strip_prefix(PREFIX)?.split_once("__")?;
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

/// One tool a server offers, as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// The server's own name for it.
    pub name: String,
    pub declaration: ToolDef,
}

/// What one server offers, as last listed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    pub tools: Vec<McpTool>,
    /// Tools left out, each with the reason.
    pub skipped: Vec<(String, String)>,
    /// The server offers resources (and `mcp_read_resource` may read them).
    pub resources: bool,
    pub prompts: bool,
}

impl Catalog {
    /// Reads a `tools/list` answer (the tools as JSON): each tool whose
    /// name and schema pass the same caps as a caller's tools.
    pub fn from_tools(server: &str, tools: &[Value]) -> Catalog {
        let mut catalog = Catalog::default();
        for tool in tools {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            let shown: String = name.chars().take(80).collect();
            let full = tool_name(server, &name);
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            let schema = tool.get("inputSchema").cloned().unwrap_or_else(|| json!({"type": "object"}));
            let refusal = if !valid {
                Some("its name holds characters a tool name cannot (letters, digits, '_', '-', '.')".to_string())
            } else if full.chars().count() > MAX_TOOL_NAME_CHARS {
                Some(format!("{full} is longer than {MAX_TOOL_NAME_CHARS} characters"))
            } else if catalog.tools.iter().any(|t| t.name == name) {
                Some("the server lists it twice".into())
            } else if catalog.tools.len() >= MAX_TOOLS_PER_SERVER {
                Some(format!("the server offers more than {MAX_TOOLS_PER_SERVER} tools"))
            } else if !schema.is_object() {
                Some("its input schema is not an object".into())
            } else {
                skillhost_engine::schema_limits::check(&schema).err().map(|why| format!("its input schema {why}"))
            };
            if let Some(why) = refusal {
                tracing::warn!(server, tool = %shown, reason = %why, "an MCP tool is left out");
                catalog.skipped.push((shown, why));
                continue;
            }
            let mut description: String = tool
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .chars()
                .take(MAX_DESCRIPTION_CHARS)
                .collect();
            if description.is_empty() {
                description = format!("The tool {name} of the MCP server {server}.");
            }
            catalog.tools.push(McpTool { name, declaration: ToolDef { name: full, description, parameters: schema } });
        }
        catalog
    }
}

/// A turn's view of the MCP servers: the tools it was offered when it
/// started (a later `list_changed` waits for the next turn).
#[derive(Clone)]
pub struct TurnMcp {
    pub hub: Arc<hub::McpHub>,
    /// Full name to (server, tool), for every tool offered this turn.
    pub tools: BTreeMap<String, (String, String)>,
    /// Servers whose resources `mcp_read_resource` may read this turn.
    pub resource_servers: Vec<String>,
    pub declarations: Vec<ToolDef>,
}

impl std::fmt::Debug for TurnMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnMcp").field("tools", &self.tools.keys()).finish()
    }
}

/// The declaration of [`READ_RESOURCE`] for these servers.
pub fn read_resource_declaration(servers: &[String]) -> ToolDef {
    ToolDef {
        name: READ_RESOURCE.into(),
        description: format!(
            "Read a resource of an MCP server by its URI (as a tool result or the server's documentation names it). Servers with resources: {}.",
            servers.join(", ")
        ),
        parameters: json!({
            "type": "object",
            "properties": {
                "server": {"type": "string", "enum": servers},
                "uri": {"type": "string", "description": "The resource's URI."}
            },
            "required": ["server", "uri"]
        }),
    }
}

/// A call's arguments as the object MCP sends: `{}` for none, and a
/// sentence for the model when they are not an object.
pub fn call_arguments(arguments: &str) -> Result<Map<String, Value>, String> {
    if arguments.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("The arguments must be a JSON object.".into()),
        Err(err) => Err(format!("The arguments are not valid JSON ({err}); send a JSON object.")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_at_the_first_double_underscore_after_the_server() {
        assert_eq!(split_name("mcp__time__get_current_time"), Some(("time", "get_current_time")));
        assert_eq!(split_name("mcp__fs__read__all"), Some(("fs", "read__all")));
        assert_eq!(split_name("mcp__x"), None);
        assert_eq!(split_name("mcp____t"), None);
        assert_eq!(split_name("shell"), None);
        assert_eq!(tool_name("everything", "echo"), "mcp__everything__echo");
    }

    #[test]
    fn hostile_tools_are_left_out_with_a_reason() {
        let mut deep = json!({"type": "string"});
        for _ in 0..(skillhost_engine::schema_limits::MAX_SCHEMA_DEPTH + 2) {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        let tools = vec![
            json!({"name": "echo", "description": "Echoes", "inputSchema": {"type": "object"}}),
            json!({"name": "bomb", "inputSchema": deep}),
            json!({"name": "bad name;rm", "inputSchema": {"type": "object"}}),
            json!({"name": "echo", "inputSchema": {"type": "object"}}),
            json!({"name": "shell", "inputSchema": {"type": "object"}}),
            json!({"name": "x".repeat(60), "inputSchema": {"type": "object"}}),
        ];
        let catalog = Catalog::from_tools("srv", &tools);
        let names: Vec<&str> = catalog.tools.iter().map(|t| t.declaration.name.as_str()).collect();
        // A tool named like one of ours stays the server's: its name says so.
        assert_eq!(names, ["mcp__srv__echo", "mcp__srv__shell"]);
        let skipped: Vec<&str> = catalog.skipped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(skipped, ["bomb", "bad name;rm", "echo", &"x".repeat(60)]);
        assert!(catalog.skipped[0].1.contains("schema"), "{:?}", catalog.skipped[0]);
    }

    #[test]
    fn tools_per_server_at_the_limit_and_past_it() {
        let tools: Vec<Value> = (0..=MAX_TOOLS_PER_SERVER)
            .map(|i| json!({"name": format!("t{i}"), "inputSchema": {"type": "object"}}))
            .collect();
        let at = Catalog::from_tools("s", &tools[..MAX_TOOLS_PER_SERVER]);
        assert_eq!((at.tools.len(), at.skipped.len()), (MAX_TOOLS_PER_SERVER, 0));
        let past = Catalog::from_tools("s", &tools);
        assert_eq!((past.tools.len(), past.skipped.len()), (MAX_TOOLS_PER_SERVER, 1));
    }

    #[test]
    fn a_full_name_and_a_description_at_their_limits_and_one_past() {
        // "mcp__s__" is 8 characters.
        let at = "t".repeat(MAX_TOOL_NAME_CHARS - 8);
        let past = "u".repeat(MAX_TOOL_NAME_CHARS - 7);
        let long = "d".repeat(MAX_DESCRIPTION_CHARS + 1);
        let tools = vec![
            json!({"name": at, "description": long, "inputSchema": {"type": "object"}}),
            json!({"name": past, "inputSchema": {"type": "object"}}),
        ];
        let catalog = Catalog::from_tools("s", &tools);
        assert_eq!(catalog.tools.len(), 1);
        assert_eq!(catalog.tools[0].declaration.name.chars().count(), MAX_TOOL_NAME_CHARS);
        assert_eq!(catalog.tools[0].declaration.description.chars().count(), MAX_DESCRIPTION_CHARS);
        assert_eq!(catalog.skipped[0].0, past);
    }

    #[test]
    fn a_selection_narrows_servers_and_tools() {
        let all = McpSelection::default();
        assert!(all.allows("a", "x"));
        let some = McpSelection {
            servers: Some(vec!["a".into()]),
            allowed_tools: BTreeMap::from([("a".into(), vec!["x".into()])]),
        };
        assert!(some.allows("a", "x"));
        assert!(!some.allows("a", "y"));
        assert!(!some.allows("b", "x"));
    }
}
