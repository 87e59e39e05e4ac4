//! Hosted tools a client declares (OpenAI's `web_search`, `file_search`,
//! `code_interpreter`, ...), which this server does not run itself. Codex
//! declares `web_search` on every request by default. The operator may map
//! one to an MCP tool (`--hosted-tool web_search=mcp__search__query`); an
//! unmapped one is left out of the prompt and named in a log line and in
//! the `x-skillhost-dropped-tools` header, as llama-server ignores it, or
//! refused with a 400 under `--strict-hosted-tools`.

use std::collections::BTreeMap;

/// The operator's mappings and strictness.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostedTools {
    /// Hosted tool type to the MCP server and tool that stand for it.
    pub mapped: BTreeMap<String, (String, String)>,
    /// Refuse an unmapped hosted tool instead of leaving it out.
    pub strict: bool,
}

/// What becomes of one hosted tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hosted {
    Mapped { server: String, tool: String },
    Dropped,
    Refused,
}

impl HostedTools {
    /// Reads `--hosted-tool KIND=mcp__SERVER__TOOL` values, each naming a
    /// configured server.
    pub fn parse(values: &[String], strict: bool, servers: &[String]) -> Result<HostedTools, String> {
        let mut mapped = BTreeMap::new();
        for value in values {
            let Some((kind, target)) = value.split_once('=') else {
                return Err(format!("--hosted-tool '{value}' must be KIND=mcp__SERVER__TOOL"));
            };
            let kind = kind.trim();
            if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("--hosted-tool '{value}': '{kind}' is not a hosted tool type such as web_search"));
            }
            let Some((server, tool)) = super::split_name(target.trim()) else {
                return Err(format!("--hosted-tool '{value}': '{target}' is not an MCP tool name (mcp__SERVER__TOOL)"));
            };
            if !servers.iter().any(|name| name == server) {
                return Err(format!(
                    "--hosted-tool '{value}': there is no MCP server called '{server}' (--mcp-config or mcp-servers names them)"
                ));
            }
            if mapped.insert(kind.to_string(), (server.to_string(), tool.to_string())).is_some() {
                return Err(format!("--hosted-tool maps '{kind}' twice"));
            }
        }
        Ok(HostedTools { mapped, strict })
    }

    pub fn resolve(&self, kind: &str) -> Hosted {
        match self.mapped.get(kind) {
            Some((server, tool)) => Hosted::Mapped { server: server.clone(), tool: tool.clone() },
            None if self.strict => Hosted::Refused,
            None => Hosted::Dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_name_a_configured_server_and_unmapped_tools_drop_or_refuse() {
        let servers = vec!["search".to_string()];
        let hosted = HostedTools::parse(&["web_search=mcp__search__query".into()], false, &servers).unwrap();
        assert_eq!(hosted.resolve("web_search"), Hosted::Mapped { server: "search".into(), tool: "query".into() });
        assert_eq!(hosted.resolve("file_search"), Hosted::Dropped);
        let strict = HostedTools::parse(&[], true, &servers).unwrap();
        assert_eq!(strict.resolve("web_search"), Hosted::Refused);
        for (value, says) in [
            ("web_search", "must be KIND=mcp__SERVER__TOOL"),
            ("web search=mcp__search__q", "not a hosted tool type"),
            ("web_search=query", "not an MCP tool name"),
            ("web_search=mcp__other__q", "no MCP server called 'other'"),
        ] {
            let err = HostedTools::parse(&[value.into()], false, &servers).unwrap_err();
            assert!(err.contains(says), "{value}: {err}");
        }
        let twice = ["web_search=mcp__search__a".to_string(), "web_search=mcp__search__b".to_string()];
        assert!(HostedTools::parse(&twice, false, &servers).unwrap_err().contains("twice"));
    }
}
