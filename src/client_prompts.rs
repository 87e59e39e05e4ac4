//! `--normalize-client-prompts`: named rules for text a known client puts
//! at the front of its prompt and changes between requests or sessions.
//!
//! The KV cache reuses a prompt only up to its first changed token, so one
//! changed line near the front makes the engine prefill everything after
//! it again: the client's whole system prompt and tools, 10,000 tokens and
//! more for a coding agent. Each rule removes exactly one such line, by a
//! test on a whole block that a client's own text cannot match by chance;
//! every rewrite is counted in `/metrics`
//! (`skillhost_client_prompt_rewrites_total{rule}`), the rules are listed
//! in docs/clients-and-agents.md, and `--normalize-client-prompts none`
//! (or a list without a rule) turns them off.

use std::fmt;

/// One rewrite of a client's prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Claude Code opens its system prompt with a block
    /// `x-anthropic-billing-header: cc_version=…; cc_entrypoint=…;`, which
    /// is accounting for Anthropic's API, not text for the model. Its
    /// version suffix follows the session's first prompt, and Anthropic's
    /// own deployments add a hash of each request, so no two sessions (and
    /// there, no two requests) share even the first token. The block is
    /// dropped.
    ClaudeCodeBillingHeader,
}

/// Every rule, by the name `--normalize-client-prompts` takes.
pub const RULES: [(&str, Rule); 1] = [("claude-code-billing-header", Rule::ClaudeCodeBillingHeader)];

/// What Claude Code's billing block starts with.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

impl Rule {
    pub fn name(self) -> &'static str {
        RULES.iter().find(|(_, rule)| *rule == self).map_or("", |(name, _)| name)
    }
}

/// The rules in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPrompts {
    rules: Vec<Rule>,
}

impl Default for ClientPrompts {
    /// Every rule: each removes only text that is not meant for the model.
    fn default() -> Self {
        ClientPrompts { rules: RULES.iter().map(|(_, rule)| *rule).collect() }
    }
}

/// `--normalize-client-prompts` named something that is not a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownRule(pub String);

impl fmt::Display for UnknownRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = RULES.iter().map(|(name, _)| *name).collect();
        write!(
            f,
            "--normalize-client-prompts has no rule '{}'; give `all`, `none` or a comma-separated list of: {}",
            self.0,
            names.join(", ")
        )
    }
}

impl ClientPrompts {
    /// No rule: every client's prompt as it was sent.
    pub fn none() -> Self {
        ClientPrompts { rules: Vec::new() }
    }

    /// `all`, `none`, or rule names separated by commas.
    pub fn parse(spec: &str) -> Result<Self, UnknownRule> {
        match spec.trim() {
            "all" => return Ok(Self::default()),
            "none" | "" => return Ok(Self::none()),
            _ => {}
        }
        let mut rules = Vec::new();
        for name in spec.split(',').map(str::trim).filter(|name| !name.is_empty()) {
            let (_, rule) =
                RULES.iter().find(|(known, _)| *known == name).ok_or_else(|| UnknownRule(name.to_string()))?;
            if !rules.contains(rule) {
                rules.push(*rule);
            }
        }
        Ok(ClientPrompts { rules })
    }

    pub fn has(&self, rule: Rule) -> bool {
        self.rules.contains(&rule)
    }

    /// The names of the rules in force, for the start-up log.
    pub fn names(&self) -> Vec<&'static str> {
        self.rules.iter().map(|rule| rule.name()).collect()
    }

    /// Whether an Anthropic system block is one a rule drops (and which).
    pub fn drops_system_block(&self, block: &serde_json::Value) -> Option<Rule> {
        let text = block.get("text").and_then(serde_json::Value::as_str)?;
        let rule = Rule::ClaudeCodeBillingHeader;
        // The whole block is the header: one line, nothing else after it.
        let is_header = block.get("type").and_then(serde_json::Value::as_str) == Some("text")
            && text.starts_with(BILLING_HEADER)
            && !text.trim_end().contains('\n');
        (self.has(rule) && is_header).then_some(rule)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_all_none_and_lists() {
        assert_eq!(ClientPrompts::parse("all").unwrap(), ClientPrompts::default());
        assert_eq!(ClientPrompts::parse("none").unwrap(), ClientPrompts::none());
        let one = ClientPrompts::parse(" claude-code-billing-header , claude-code-billing-header").unwrap();
        assert_eq!(one.names(), ["claude-code-billing-header"]);
        let err = ClientPrompts::parse("claude-code-billing-header,timestamps").unwrap_err();
        assert_eq!(err, UnknownRule("timestamps".into()));
        assert!(err.to_string().contains("of: claude-code-billing-header"), "{err}");
    }

    #[test]
    fn drops_claude_codes_billing_block_and_nothing_like_it() {
        let rules = ClientPrompts::default();
        // As Claude Code 2.1 sends it (the suffix varies with the first prompt).
        let header = json!({"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.28b; cc_entrypoint=sdk-cli;"});
        assert_eq!(rules.drops_system_block(&header), Some(Rule::ClaudeCodeBillingHeader));
        assert_eq!(ClientPrompts::none().drops_system_block(&header), None);
        // A caller's own text that merely mentions it, or goes on past it, stays.
        for kept in [
            json!({"type": "text", "text": "Explain x-anthropic-billing-header: what is it?"}),
            json!({"type": "text", "text": "x-anthropic-billing-header: cc_version=1;\nYou are a helpful assistant."}),
            json!({"type": "text", "text": "You are Claude Code."}),
            json!({"type": "image", "text": "x-anthropic-billing-header: cc_version=1;"}),
        ] {
            assert_eq!(rules.drops_system_block(&kept), None, "{kept}");
        }
    }
}
