//! The operator's MCP servers, as Claude Code, Cursor and llama-server read
//! them: `{"mcpServers": {"NAME": {...}}}` in a JSON file, or the same map
//! under `mcp-servers:` in our YAML config. An entry is a stdio server
//! (`command`, `args`, `env`, `cwd`) or a streamable HTTP one (`url`,
//! `headers`); ours adds `network` and `read` for the sandbox a stdio
//! server runs in. Every fault is a start-up error naming the entry.
//!
//! Secrets never sit in the file: a header that carries a credential
//! (`Authorization`, an API key, a token, a cookie) must be written as
//! `${VARIABLE}`, which is read from the server's environment when the file
//! loads; `env` values may use the same form.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value};

/// Longest server name: the model sees `mcp__SERVER__TOOL`, and names
/// that long are already hard for a small model to repeat.
pub const MAX_SERVER_NAME_CHARS: usize = 32;
/// Servers one configuration may name.
pub const MAX_SERVERS: usize = 32;

/// One configured server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    pub name: String,
    pub transport: Transport,
}

/// How the server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A program the server starts, confined, and talks to over its pipes.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Set for the program on top of the sandbox's own variables.
        env: Vec<(String, String)>,
        /// A folder to start in, which the program may read.
        cwd: Option<PathBuf>,
        /// The program may use the host's network.
        network: bool,
        /// Further host paths the program may read (its installation).
        read: Vec<PathBuf>,
    },
    /// Streamable HTTP at this URL only.
    Http { url: String, headers: Vec<(String, String)> },
}

impl McpServerConfig {
    /// What the operator sees in listings: the program or the URL.
    pub fn target(&self) -> String {
        match &self.transport {
            Transport::Stdio { command, args, .. } => {
                std::iter::once(command.as_str()).chain(args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
            }
            Transport::Http { url, .. } => url.clone(),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{source_name}: {reason}")]
    File { source_name: String, reason: String },
    #[error("{source_name}: MCP server '{server}': {reason}")]
    Entry { source_name: String, server: String, reason: String },
}

/// Keys an entry may have. `type` is Claude Code's (`stdio`, `http`).
const KEYS: [&str; 9] = ["type", "command", "args", "env", "cwd", "url", "headers", "network", "read"];

/// Reads `{"mcpServers": {...}}` (a file's text); `source_name` names the
/// file in errors, `variable` reads the environment.
pub fn parse_file(
    text: &str,
    source_name: &str,
    variable: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<McpServerConfig>, ConfigError> {
    let file = |reason: String| ConfigError::File { source_name: source_name.to_string(), reason };
    let value: Value = serde_json::from_str(text).map_err(|err| file(format!("not valid JSON: {err}")))?;
    let Some(object) = value.as_object() else { return Err(file("must be a JSON object".into())) };
    if let Some(other) = object.keys().find(|key| *key != "mcpServers") {
        return Err(file(format!("unknown key '{other}'; the file holds one object, mcpServers")));
    }
    let servers = object.get("mcpServers").ok_or_else(|| file("has no mcpServers object".into()))?;
    parse_servers(servers, source_name, variable)
}

/// Reads the map of servers (a file's `mcpServers`, or the YAML config's
/// `mcp-servers` as JSON).
pub fn parse_servers(
    servers: &Value,
    source_name: &str,
    variable: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<McpServerConfig>, ConfigError> {
    let file = |reason: String| ConfigError::File { source_name: source_name.to_string(), reason };
    let Some(servers) = servers.as_object() else {
        return Err(file("mcpServers must map server names to their settings".into()));
    };
    if servers.len() > MAX_SERVERS {
        return Err(file(format!("names {} MCP servers; at most {MAX_SERVERS} are allowed", servers.len())));
    }
    servers
        .iter()
        .map(|(name, entry)| {
            parse_entry(name, entry, variable).map_err(|reason| ConfigError::Entry {
                source_name: source_name.to_string(),
                server: name.chars().take(64).collect(),
                reason,
            })
        })
        .collect()
}

/// Whether `name` may name a server: letters, digits, `-` and single `_`
/// (a `__` would make `mcp__SERVER__TOOL` ambiguous).
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_SERVER_NAME_CHARS
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.contains("__")
        && !name.ends_with('_')
}

fn parse_entry(
    name: &str,
    entry: &Value,
    variable: &dyn Fn(&str) -> Option<String>,
) -> Result<McpServerConfig, String> {
    if !valid_server_name(name) {
        return Err(format!(
            "a server name is 1 to {MAX_SERVER_NAME_CHARS} letters, digits, '-' or '_' (never '__' nor a trailing '_'), since the model calls its tools as mcp__{{server}}__{{tool}}"
        ));
    }
    let Some(entry) = entry.as_object() else { return Err("must be an object".into()) };
    if let Some(key) = entry.keys().find(|key| !KEYS.contains(&key.as_str())) {
        return Err(format!("unknown key '{key}'; an entry takes {}", KEYS.join(", ")));
    }
    let kind = match entry.get("type") {
        None => None,
        Some(Value::String(kind)) => Some(kind.as_str()),
        Some(_) => return Err("type must be a string".into()),
    };
    let stdio = entry.contains_key("command");
    let http = entry.contains_key("url");
    let parsed = match (kind, stdio, http) {
        (_, true, true) => Err("has both command and url; a server is one or the other".into()),
        (Some("stdio") | None, true, false) => stdio_entry(entry, variable),
        (Some("http" | "streamable-http" | "streamableHttp") | None, false, true) => http_entry(entry, variable),
        (Some("sse"), _, _) => Err(
            "the legacy SSE transport is not supported; point url at the server's streamable HTTP endpoint (type http)"
                .into(),
        ),
        (Some(kind @ ("stdio" | "http" | "streamable-http" | "streamableHttp")), _, _) => {
            Err(format!("type {kind} needs {}", if kind == "stdio" { "command" } else { "url" }))
        }
        (Some(other), _, _) => Err(format!("unknown type '{other}'; use stdio or http")),
        (None, false, false) => Err("needs command (a stdio server) or url (a streamable HTTP server)".into()),
    };
    parsed.map(|config| McpServerConfig { name: name.to_string(), ..config })
}

fn text(entry: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match entry.get(key) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(format!("{key} must be a string")),
    }
}

fn texts(entry: &Map<String, Value>, key: &str) -> Result<Vec<String>, String> {
    match entry.get(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string).ok_or_else(|| format!("{key} must be a list of strings")))
            .collect(),
        Some(_) => Err(format!("{key} must be a list of strings")),
    }
}

fn pairs(entry: &Map<String, Value>, key: &str) -> Result<BTreeMap<String, String>, String> {
    match entry.get(key) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(name, value)| match value {
                Value::String(value) => Ok((name.clone(), value.clone())),
                _ => Err(format!("{key}.{name} must be a string")),
            })
            .collect(),
        Some(_) => Err(format!("{key} must map names to strings")),
    }
}

fn absolute(path: &str, key: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(format!("{key} must be an absolute path, not '{}'", path.display()));
    }
    Ok(path)
}

fn stdio_entry(
    entry: &Map<String, Value>,
    variable: &dyn Fn(&str) -> Option<String>,
) -> Result<McpServerConfig, String> {
    if entry.contains_key("headers") {
        return Err("headers belong to an HTTP server; a stdio server takes env".into());
    }
    let command = text(entry, "command")?.unwrap_or_default();
    if command.trim().is_empty() {
        return Err("command is empty".into());
    }
    let args = texts(entry, "args")?;
    let mut env = Vec::new();
    for (name, value) in pairs(entry, "env")? {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(format!("'{name}' is not an environment variable name"));
        }
        env.push((name.clone(), expand(&value, variable).map_err(|missing| unset(&format!("env.{name}"), &missing))?));
    }
    let cwd = text(entry, "cwd")?.map(|cwd| absolute(&cwd, "cwd")).transpose()?;
    let read = texts(entry, "read")?.iter().map(|path| absolute(path, "read")).collect::<Result<Vec<_>, _>>()?;
    let network = match entry.get("network") {
        None => false,
        Some(Value::Bool(network)) => *network,
        Some(_) => return Err("network must be true or false".into()),
    };
    Ok(McpServerConfig { name: String::new(), transport: Transport::Stdio { command, args, env, cwd, network, read } })
}

/// Header names whose value is a credential.
fn is_credential(header: &str) -> bool {
    let header = header.to_ascii_lowercase();
    header == "authorization"
        || header == "proxy-authorization"
        || header == "cookie"
        || ["key", "token", "secret", "password", "auth"].iter().any(|word| header.contains(word))
}

fn http_entry(
    entry: &Map<String, Value>,
    variable: &dyn Fn(&str) -> Option<String>,
) -> Result<McpServerConfig, String> {
    for key in ["args", "env", "cwd", "network", "read"] {
        if entry.contains_key(key) {
            return Err(format!("{key} belongs to a stdio server; an HTTP server takes url and headers"));
        }
    }
    let url = text(entry, "url")?.unwrap_or_default();
    let parsed = reqwest::Url::parse(&url).map_err(|err| format!("url '{url}' is not a URL: {err}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!("url '{url}' must be http:// or https:// with a host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("url must not carry a user or password; put the credential in a header as ${VARIABLE}".into());
    }
    let mut headers = Vec::new();
    for (name, value) in pairs(entry, "headers")? {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("'{name}' is not an HTTP header name"));
        }
        if is_credential(&name) && !value.contains("${") {
            return Err(format!(
                "headers.{name} holds a credential written in the file; write it as ${{VARIABLE}} and set the variable where skillhost runs"
            ));
        }
        let value = expand(&value, variable).map_err(|missing| unset(&format!("headers.{name}"), &missing))?;
        if reqwest::header::HeaderValue::from_str(&value).is_err() {
            return Err(format!("headers.{name} is not a valid header value once its variables are set"));
        }
        headers.push((name, value));
    }
    Ok(McpServerConfig { name: String::new(), transport: Transport::Http { url: parsed.to_string(), headers } })
}

fn unset(key: &str, missing: &str) -> String {
    format!("{key} uses ${{{missing}}}, which is not set in skillhost's environment")
}

/// `value` with each `${NAME}` replaced by the variable's value; the name
/// of the first unset (or malformed) one otherwise.
pub fn expand(value: &str, variable: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { return Err(after.to_string()) };
        let name = &after[..end];
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match variable(name).filter(|_| valid) {
            Some(found) => out.push_str(&found),
            None => return Err(name.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Every server of several sources; a name given twice is an error.
pub fn merge(sources: Vec<Vec<McpServerConfig>>) -> Result<Vec<McpServerConfig>, String> {
    let mut all: Vec<McpServerConfig> = Vec::new();
    for server in sources.into_iter().flatten() {
        if all.iter().any(|s| s.name == server.name) {
            return Err(format!("the MCP server '{}' is configured twice", server.name));
        }
        all.push(server);
    }
    if all.len() > MAX_SERVERS {
        return Err(format!("{} MCP servers are configured; at most {MAX_SERVERS} are allowed", all.len()));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(name: &str) -> Option<String> {
        (name == "SEARCH_KEY").then(|| "s3cret".to_string())
    }

    fn one(entry: Value) -> Result<Vec<McpServerConfig>, ConfigError> {
        parse_file(&json!({"mcpServers": {"srv": entry}}).to_string(), "mcp.json", &vars)
    }

    fn refusal(entry: Value) -> String {
        one(entry).unwrap_err().to_string()
    }

    #[test]
    fn claude_codes_entries_read_as_they_are_written() {
        let text = json!({"mcpServers": {
            "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
            "search": {"type": "http", "url": "https://search.example/mcp", "headers": {"Authorization": "Bearer ${SEARCH_KEY}"}},
        }})
        .to_string();
        let servers = parse_file(&text, "mcp.json", &vars).unwrap();
        assert_eq!(servers[0].name, "time");
        assert!(matches!(&servers[0].transport, Transport::Stdio { command, network: false, .. } if command == "uvx"));
        assert_eq!(
            servers[1].transport,
            Transport::Http {
                url: "https://search.example/mcp".into(),
                headers: vec![("Authorization".into(), "Bearer s3cret".into())]
            }
        );
    }

    #[test]
    fn every_fault_names_its_file_and_server() {
        assert_eq!(
            refusal(json!({"command": "x", "colour": "red"})),
            "mcp.json: MCP server 'srv': unknown key 'colour'; an entry takes type, command, args, env, cwd, url, headers, network, read"
        );
        assert!(refusal(json!({"command": "x", "url": "http://a"})).contains("both command and url"));
        assert!(
            refusal(json!({"type": "sse", "url": "http://a/sse"})).contains("legacy SSE transport is not supported")
        );
        assert!(refusal(json!({})).contains("needs command"));
        assert!(refusal(json!({"command": ""})).contains("command is empty"));
        assert!(refusal(json!({"command": "x", "args": "a b"})).contains("args must be a list of strings"));
        assert!(refusal(json!({"command": "x", "cwd": "rel"})).contains("cwd must be an absolute path"));
        assert!(refusal(json!({"url": "ftp://a"})).contains("must be http:// or https://"));
        assert!(refusal(json!({"url": "http://u:p@a/mcp"})).contains("must not carry a user or password"));
        // A credential is never written in the file, and a variable must be set.
        assert!(
            refusal(json!({"url": "http://a", "headers": {"X-Api-Key": "abc"}})).contains("write it as ${VARIABLE}")
        );
        assert!(refusal(json!({"url": "http://a", "headers": {"Authorization": "Bearer ${NOPE}"}}))
            .contains("headers.Authorization uses ${NOPE}, which is not set"));
        assert!(refusal(json!({"command": "x", "env": {"A": "${NOPE}"}})).contains("env.A uses ${NOPE}"));
        let file = parse_file("[]", "mcp.json", &vars).unwrap_err().to_string();
        assert_eq!(file, "mcp.json: must be a JSON object");
        for name in ["a__b", "", "b_", "x y", &"n".repeat(MAX_SERVER_NAME_CHARS + 1)] {
            let text = json!({"mcpServers": {name: {"command": "x"}}}).to_string();
            assert!(parse_file(&text, "f", &vars).is_err(), "{name}");
        }
        assert!(valid_server_name(&"n".repeat(MAX_SERVER_NAME_CHARS)));
    }

    #[test]
    fn servers_at_the_limit_and_one_past_and_no_name_twice() {
        let many = |n: usize| {
            let servers: Map<String, Value> = (0..n).map(|i| (format!("s{i}"), json!({"command": "x"}))).collect();
            parse_servers(&Value::Object(servers), "f", &vars)
        };
        assert_eq!(many(MAX_SERVERS).unwrap().len(), MAX_SERVERS);
        assert!(many(MAX_SERVERS + 1).unwrap_err().to_string().contains("at most 32"));
        let a = one(json!({"command": "x"})).unwrap();
        assert_eq!(merge(vec![a.clone(), a]).unwrap_err(), "the MCP server 'srv' is configured twice");
    }

    #[test]
    fn variables_expand_and_a_malformed_one_is_refused() {
        assert_eq!(expand("Bearer ${SEARCH_KEY}!", &vars).unwrap(), "Bearer s3cret!");
        assert_eq!(expand("plain", &vars).unwrap(), "plain");
        assert_eq!(expand("${SEARCH_KEY", &vars).unwrap_err(), "SEARCH_KEY");
        assert_eq!(expand("${A-B}", &vars).unwrap_err(), "A-B");
    }
}
