//! `skillhost mcp list`: the operator's MCP servers, started as `serve`
//! starts them (confined, from the same flags and config file), with what
//! each offers or why it did not start. No model is loaded.

use std::fmt::Write;
use std::sync::Arc;

use skillhost_actors::tools::mcp::hub::{HubSettings, McpHub, ServerReport, START_TIMEOUT};

use crate::config::ServeConfig;
use crate::setup::{exec_runtime, StartupError};

/// Starts every server, reads its catalog and stops it again. Returns the
/// reports; the process's own folders are gone when this returns.
pub async fn reports(config: &ServeConfig) -> Result<Vec<ServerReport>, StartupError> {
    if config.mcp_servers.is_empty() {
        return Ok(Vec::new());
    }
    let (exec, _artifacts, own_folders) = exec_runtime(config).await?;
    let settings = HubSettings { exec, call_timeout: config.mcp_call_timeout, start_timeout: START_TIMEOUT };
    let hub = Arc::new(McpHub::new(config.mcp_servers.clone(), settings));
    let reports = hub.report(true).await;
    hub.shutdown().await;
    drop(own_folders);
    Ok(reports)
}

/// The reports as an operator reads them.
pub fn render(reports: &[ServerReport]) -> String {
    let mut out = String::new();
    if reports.is_empty() {
        out.push_str("No MCP servers are configured (--mcp-config FILE, or mcp-servers: in a --config file).\n");
        return out;
    }
    let _ = writeln!(out, "{} MCP server(s):", reports.len());
    for report in reports {
        let _ = writeln!(out, "\n{}  ({}, {})", report.name, report.transport, report.target);
        match &report.error {
            Some(error) => {
                let _ = writeln!(out, "  {}: {error}", report.state);
            }
            None => {
                let _ = writeln!(out, "  {}", report.state);
            }
        }
        let _ = writeln!(out, "  tools ({}):", report.tools.len());
        for tool in &report.tools {
            let _ = writeln!(out, "    {tool}");
        }
        if !report.skipped_tools.is_empty() {
            let _ = writeln!(out, "  left out ({}):", report.skipped_tools.len());
            for skipped in &report.skipped_tools {
                let _ = writeln!(out, "    {}: {}", skipped.name, skipped.reason);
            }
        }
        let field = |value: &serde_json::Value, key: &str| value[key].as_str().unwrap_or_default().to_string();
        let _ = writeln!(out, "  resources ({}):", report.resources.len());
        for resource in &report.resources {
            let _ = writeln!(out, "    {}  {}", field(resource, "uri"), field(resource, "name"));
        }
        let _ = writeln!(out, "  prompts ({}):", report.prompts.len());
        for prompt in &report.prompts {
            let _ = writeln!(out, "    {}  {}", field(prompt, "name"), field(prompt, "description"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillhost_actors::tools::mcp::hub::SkippedTool;

    #[test]
    fn each_server_shows_its_state_tools_and_what_was_left_out() {
        let up = ServerReport {
            name: "time".into(),
            transport: "stdio",
            target: "python3 -m mcp_server_time".into(),
            state: "up",
            error: None,
            tools: vec!["mcp__time__get_current_time".into()],
            skipped_tools: vec![SkippedTool { name: "bomb".into(), reason: "its schema is too deep".into() }],
            resources: vec![serde_json::json!({"uri": "time://zones", "name": "zones"})],
            prompts: Vec::new(),
        };
        let down = ServerReport {
            name: "search".into(),
            transport: "http",
            target: "http://127.0.0.1:9/mcp".into(),
            state: "down",
            error: Some("connection refused".into()),
            tools: Vec::new(),
            skipped_tools: Vec::new(),
            resources: Vec::new(),
            prompts: Vec::new(),
        };
        let text = render(&[up, down]);
        assert!(text.starts_with("2 MCP server(s):\n\ntime  (stdio, python3 -m mcp_server_time)\n  up\n"), "{text}");
        assert!(text.contains("  tools (1):\n    mcp__time__get_current_time\n"), "{text}");
        assert!(text.contains("  left out (1):\n    bomb: its schema is too deep\n"), "{text}");
        assert!(text.contains("    time://zones  zones\n"), "{text}");
        assert!(text.contains("search  (http, http://127.0.0.1:9/mcp)\n  down: connection refused\n"), "{text}");
        assert!(render(&[]).starts_with("No MCP servers are configured"));
    }
}
