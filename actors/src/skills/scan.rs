//! The static scan every skill goes through before it loads.
//!
//! A skill is untrusted input: a published audit of public skill registries
//! found more than one in eight critically unsafe. The scan reads every file
//! of a skill once and reports findings, each a named rule with a file and a
//! line, so an operator sees what a skill would do before the model runs
//! it. The rules are data (`scan-rules.yaml`, built in), each with examples
//! it must match and miss that are checked when the rules load.
//!
//! The scan informs; the sandbox confines. A skill with no findings is not
//! thereby safe, and its commands still run confined.

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::LazyLock;

use regex::bytes::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use serde::Deserialize;

use super::skill::{FileKind, SkillFile};
use crate::path_guard;

/// The rule set, as shipped.
const BUILT_IN: &str = include_str!("scan-rules.yaml");

/// Most findings one skill reports; a skill with more is plainly refused
/// under `strict` long before, and a listing of thousands helps no one.
pub const MAX_FINDINGS: usize = 200;
/// Most lines one rule reports in one file: the first few show the pattern.
pub const MAX_LINES_PER_RULE: usize = 3;
/// Longest excerpt of a matched line kept in a finding.
pub const MAX_EXCERPT_CHARS: usize = 120;
/// Most bytes of one file the scan reads. Skills are capped at 256 MB in
/// all; this bounds one rescan's work on a file that is mostly data.
pub const MAX_SCANNED_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// The severity `strict` refuses at and above.
pub const STRICT_REFUSES_AT: Severity = Severity::High;

/// How much a finding matters, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Low,
    Medium,
    High,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

/// What an install does with a skill that has findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Load it and show the findings.
    Warn,
    /// Refuse it when any finding is at or above [`STRICT_REFUSES_AT`].
    Strict,
}

impl Policy {
    /// The findings this policy refuses a skill for; empty when it loads.
    pub fn refusals(self, findings: &[Finding]) -> Vec<Finding> {
        match self {
            Policy::Warn => Vec::new(),
            Policy::Strict => findings.iter().filter(|f| f.severity >= STRICT_REFUSES_AT).cloned().collect(),
        }
    }
}

/// The policy for each way a skill arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policies {
    /// Skills found by scanning a root the operator configured.
    pub roots: Policy,
    /// Uploads, installs by URL and skills a request brings: text from
    /// elsewhere, judged before anything is written.
    pub installs: Policy,
}

impl Default for Policies {
    /// The operator's own folders warn; what arrives from outside is strict.
    fn default() -> Self {
        Policies { roots: Policy::Warn, installs: Policy::Strict }
    }
}

impl Policies {
    /// One policy for every source (`--skills-install-policy`).
    pub fn all(policy: Policy) -> Self {
        Policies { roots: policy, installs: policy }
    }
}

/// One thing the scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The rule's id (`pipe-to-shell`).
    pub rule: String,
    pub severity: Severity,
    /// Relative to the skill root, `/`-separated.
    pub file: String,
    /// 1-based; `None` for findings about a whole file (a binary, a mode).
    pub line: Option<u32>,
    /// The rule's sentence.
    pub message: String,
    /// The matched text, clipped, with invisible characters written as
    /// `\u{…}` so a listing never hides what it reports.
    pub excerpt: Option<String>,
}

impl Finding {
    /// `file:line`, or the file alone.
    pub fn place(&self) -> String {
        match self.line {
            Some(line) => format!("{}:{line}", self.file),
            None => self.file.clone(),
        }
    }
}

/// The findings' summary in one sentence (for refusals and load errors).
pub fn summarize(findings: &[Finding]) -> String {
    let listed: Vec<String> = findings
        .iter()
        .map(|f| format!("{} {} in {} ({})", f.severity.as_str(), f.rule, f.place(), f.message))
        .collect();
    listed.join("; ")
}

/// Which files a pattern reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Scope {
    Scripts,
    Instructions,
    Text,
}

/// The built-in checks a rule may name instead of a pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Check {
    Executable,
    Setuid,
    EncodedBlob,
    Link,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExamples {
    #[serde(rename = "match", default)]
    matching: Vec<String>,
    #[serde(rename = "miss", default)]
    missing: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    severity: Severity,
    message: String,
    #[serde(rename = "in")]
    scope: Option<Scope>,
    pattern: Option<String>,
    check: Option<Check>,
    examples: Option<RawExamples>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRules {
    link_hosts: Vec<String>,
    blob_min_chars: usize,
    rules: Vec<RawRule>,
}

/// A rule, compiled.
#[derive(Debug)]
struct Rule {
    id: String,
    severity: Severity,
    message: String,
}

#[derive(Debug)]
struct PatternRule {
    rule: Rule,
    scope: Scope,
    regex: Regex,
}

/// The rule set, compiled and checked against its own examples.
#[derive(Debug)]
pub struct Rules {
    patterns: Vec<PatternRule>,
    /// One set per scope over every pattern, so a file that matches nothing
    /// (most files) costs one pass.
    sets: Vec<(Scope, RegexSet, Vec<usize>)>,
    checks: Vec<(Check, Rule)>,
    link_hosts: Vec<String>,
    blob_min_chars: usize,
}

/// Why a rule set does not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the skill scan rules do not load: {0}")]
pub struct RulesError(String);

fn compile(pattern: &str) -> Result<Regex, regex::Error> {
    // `$` and `^` are line ends: a rule reads one line at a time.
    RegexBuilder::new(pattern).multi_line(true).size_limit(8 * 1024 * 1024).build()
}

impl Rules {
    /// Parses and compiles a rule set, checking every example.
    pub fn parse(text: &str) -> Result<Rules, RulesError> {
        let raw: RawRules = serde_yaml::from_str(text).map_err(|err| RulesError(err.to_string()))?;
        let mut ids = HashSet::new();
        let mut patterns = Vec::new();
        let mut checks = Vec::new();
        for rule in raw.rules {
            if !ids.insert(rule.id.clone()) {
                return Err(RulesError(format!("the rule id '{}' is used twice", rule.id)));
            }
            let compiled = Rule { id: rule.id.clone(), severity: rule.severity, message: rule.message };
            match (rule.pattern, rule.check, rule.scope) {
                (Some(pattern), None, Some(scope)) => {
                    let regex = compile(&pattern)
                        .map_err(|err| RulesError(format!("the rule '{}' has a bad pattern: {err}", rule.id)))?;
                    let examples = rule.examples.ok_or_else(|| {
                        RulesError(format!("the rule '{}' has no examples to match and miss", rule.id))
                    })?;
                    if examples.matching.is_empty() {
                        return Err(RulesError(format!("the rule '{}' has no example it must match", rule.id)));
                    }
                    for example in &examples.matching {
                        if !regex.is_match(example.as_bytes()) {
                            return Err(RulesError(format!(
                                "the rule '{}' does not match its example {example:?}",
                                rule.id
                            )));
                        }
                    }
                    for example in &examples.missing {
                        if regex.is_match(example.as_bytes()) {
                            return Err(RulesError(format!(
                                "the rule '{}' matches {example:?}, which it must miss",
                                rule.id
                            )));
                        }
                    }
                    patterns.push(PatternRule { rule: compiled, scope, regex });
                }
                (None, Some(check), None) if rule.examples.is_none() => checks.push((check, compiled)),
                _ => {
                    return Err(RulesError(format!(
                        "the rule '{}' needs either `pattern` with `in` and `examples`, or `check` alone",
                        rule.id
                    )))
                }
            }
        }
        let mut sets = Vec::new();
        for scope in [Scope::Scripts, Scope::Instructions, Scope::Text] {
            let members: Vec<usize> = (0..patterns.len()).filter(|&i| patterns[i].scope == scope).collect();
            let set = RegexSetBuilder::new(members.iter().map(|&i| patterns[i].regex.as_str()))
                .multi_line(true)
                .size_limit(64 * 1024 * 1024)
                .build()
                .map_err(|err| RulesError(err.to_string()))?;
            sets.push((scope, set, members));
        }
        let link_hosts = raw.link_hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect();
        Ok(Rules { patterns, sets, checks, link_hosts, blob_min_chars: raw.blob_min_chars.max(1) })
    }

    /// The rules that ship with the server.
    pub fn built_in() -> &'static Rules {
        static RULES: LazyLock<Result<Rules, RulesError>> = LazyLock::new(|| Rules::parse(BUILT_IN));
        match &*RULES {
            Ok(rules) => rules,
            // The file is part of the build and a unit test loads it, so
            // this cannot be reached by a build that passed its tests.
            Err(err) => panic!("{err}"),
        }
    }

    /// The ids and severities, for documentation and listings.
    pub fn ids(&self) -> Vec<(&str, Severity)> {
        let patterns = self.patterns.iter().map(|p| &p.rule);
        patterns.chain(self.checks.iter().map(|(_, r)| r)).map(|r| (r.id.as_str(), r.severity)).collect()
    }

    fn check(&self, which: Check) -> Option<&Rule> {
        self.checks.iter().find(|(check, _)| *check == which).map(|(_, rule)| rule)
    }

    /// Whether a link to `host` goes unreported.
    fn allows_host(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.link_hosts.iter().any(|allowed| {
            host == *allowed
                || (host.len() > allowed.len()
                    && host.ends_with(allowed.as_str())
                    && host[..host.len() - allowed.len()].ends_with('.'))
        })
    }
}

/// What one file is, for the scan.
pub struct FileToScan<'a> {
    pub path: &'a str,
    pub kind: FileKind,
    pub text: bool,
}

impl<'a> From<&'a SkillFile> for FileToScan<'a> {
    fn from(file: &'a SkillFile) -> Self {
        FileToScan { path: &file.path, kind: file.kind, text: file.text }
    }
}

/// Collects findings under the caps.
struct Findings {
    found: Vec<Finding>,
}

impl Findings {
    fn push(&mut self, rule: &Rule, file: &str, line: Option<u32>, excerpt: Option<String>) {
        if self.found.len() < MAX_FINDINGS {
            self.found.push(Finding {
                rule: rule.id.clone(),
                severity: rule.severity,
                file: file.to_string(),
                line,
                message: rule.message.clone(),
                excerpt,
            });
        }
    }

    fn full(&self) -> bool {
        self.found.len() >= MAX_FINDINGS
    }
}

/// Scans a skill's files: SKILL.md (already read, as `manifest`) and every
/// listed file, each opened through the path guard.
pub fn scan_skill(root: &Path, manifest: &str, files: &[FileToScan<'_>], rules: &Rules) -> Vec<Finding> {
    let mut findings = Findings { found: Vec::new() };
    scan_text(rules, "SKILL.md", manifest.as_bytes(), &[Scope::Instructions, Scope::Text], &mut findings);
    for file in files {
        if findings.full() {
            break;
        }
        let Ok(opened) = path_guard::open_file(root, file.path) else { continue };
        if let Some(rule) = rules.check(Check::Setuid) {
            if opened.file.metadata().is_ok_and(|m| m.permissions().mode() & 0o6000 != 0) {
                findings.push(rule, file.path, None, None);
            }
        }
        let mut bytes = Vec::new();
        // A binary is only told by its header; a PE header sits within the first few hundred bytes.
        let limit = if file.text { MAX_SCANNED_FILE_BYTES } else { 4096 };
        if opened.file.take(limit).read_to_end(&mut bytes).is_err() {
            continue;
        }
        if let Some(rule) = rules.check(Check::Executable) {
            if is_executable_binary(&bytes) {
                findings.push(rule, file.path, None, None);
            }
        }
        if !file.text {
            continue;
        }
        let mut scopes = vec![Scope::Text];
        if file.kind == FileKind::Script || bytes.starts_with(b"#!") {
            scopes.push(Scope::Scripts);
        }
        if file.kind == FileKind::Reference && is_markdown(file.path) {
            scopes.push(Scope::Instructions);
        }
        scan_text(rules, file.path, &bytes, &scopes, &mut findings);
    }
    findings.found
}

/// Findings about an archive's entries that extraction erases (a setuid
/// bit is dropped on the way in, but an archive that asks for one says
/// something about its author).
pub fn archive_mode_findings(entries: &[(String, u32)], rules: &Rules) -> Vec<Finding> {
    let mut findings = Findings { found: Vec::new() };
    if let Some(rule) = rules.check(Check::Setuid) {
        for (path, mode) in entries {
            if mode & 0o6000 != 0 {
                findings.push(rule, path, None, None);
            }
        }
    }
    findings.found
}

fn is_markdown(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    [".md", ".markdown", ".mdx", ".txt"].iter().any(|ext| lower.ends_with(ext))
}

/// ELF, PE and Mach-O (thin and fat) headers.
fn is_executable_binary(head: &[u8]) -> bool {
    const MAGICS: [&[u8]; 6] = [
        b"\x7fELF",
        b"\xfe\xed\xfa\xce",
        b"\xfe\xed\xfa\xcf",
        b"\xce\xfa\xed\xfe",
        b"\xcf\xfa\xed\xfe",
        b"\xca\xfe\xba\xbe",
    ];
    if MAGICS.iter().any(|magic| head.starts_with(magic)) {
        return true;
    }
    // A PE file starts with "MZ" and names its "PE\0\0" header's offset at 0x3c.
    let Some(offset) = head.get(0x3c..0x40).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes) else {
        return false;
    };
    let offset = offset as usize;
    head.starts_with(b"MZ") && head.get(offset..offset.saturating_add(4)) == Some(b"PE\0\0".as_slice())
}

/// Runs every pattern of `scopes` and the text checks over one file.
fn scan_text(rules: &Rules, path: &str, bytes: &[u8], scopes: &[Scope], findings: &mut Findings) {
    // Most files match nothing: lines are counted only once one does.
    let lines = std::cell::OnceCell::new();
    let lines = || lines.get_or_init(|| LineIndex::new(bytes));
    for (scope, set, members) in &rules.sets {
        if !scopes.contains(scope) {
            continue;
        }
        for matched in set.matches(bytes).iter() {
            let pattern = &rules.patterns[members[matched]];
            let mut seen = HashSet::new();
            for found in pattern.regex.find_iter(bytes) {
                let line = lines().line_of(found.start());
                if seen.insert(line) {
                    findings.push(&pattern.rule, path, Some(line), Some(excerpt(found.as_bytes())));
                }
                if seen.len() >= MAX_LINES_PER_RULE {
                    break;
                }
            }
        }
    }
    if let Some(rule) = rules.check(Check::EncodedBlob) {
        if let Some((start, len)) = longest_encoded_run(bytes) {
            if len >= rules.blob_min_chars {
                let shown = &bytes[start..start + len.min(24)];
                findings.push(
                    rule,
                    path,
                    Some(lines().line_of(start)),
                    Some(format!("{}… ({len} characters)", excerpt(shown))),
                );
            }
        }
    }
    if let Some(rule) = rules.check(Check::Link) {
        let mut reported = HashSet::new();
        for (at, host) in link_hosts(bytes) {
            if !rules.allows_host(&host) && reported.insert(host.clone()) {
                findings.push(rule, path, Some(lines().line_of(at)), Some(host));
            }
        }
    }
}

/// Line numbers by byte offset.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(bytes: &[u8]) -> Self {
        let mut starts = vec![0];
        starts.extend(bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i + 1));
        LineIndex { starts }
    }

    fn line_of(&self, offset: usize) -> u32 {
        let index = self.starts.partition_point(|start| *start <= offset);
        u32::try_from(index).unwrap_or(u32::MAX)
    }
}

/// The matched text as a listing shows it: clipped, one line, with every
/// control or invisible formatting character spelled out.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for (count, c) in text.chars().enumerate() {
        if count >= MAX_EXCERPT_CHARS {
            out.push('…');
            break;
        }
        let invisible = c.is_control()
            || matches!(c as u32, 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2069 | 0xFEFF | 0xE0000..=0xE007F);
        if invisible {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// The longest run of base64 (or hex, a subset) characters: its start and length.
fn longest_encoded_run(bytes: &[u8]) -> Option<(usize, usize)> {
    let encoded = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_');
    let mut best: Option<(usize, usize)> = None;
    let mut start = 0;
    for (i, b) in bytes.iter().copied().chain(std::iter::once(b' ')).enumerate() {
        if !encoded(b) {
            let len = i - start;
            if len > 0 && best.is_none_or(|(_, l)| len > l) {
                best = Some((start, len));
            }
            start = i + 1;
        }
    }
    best
}

/// Every `http://` or `https://` link's host, with its offset.
fn link_hosts(bytes: &[u8]) -> Vec<(usize, String)> {
    static LINK: LazyLock<Option<Regex>> =
        LazyLock::new(|| compile(r"(?i)\bhttps?://(\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?)").ok());
    let Some(link) = LINK.as_ref() else { return Vec::new() };
    link.captures_iter(bytes)
        .filter_map(|c| {
            let host = c.get(1)?;
            Some((host.start(), String::from_utf8_lossy(host.as_bytes()).to_ascii_lowercase()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_rules_load_and_pass_their_examples() {
        let rules = Rules::parse(BUILT_IN).unwrap();
        assert!(rules.ids().len() >= 20, "{:?}", rules.ids());
        for check in [Check::Executable, Check::Setuid, Check::EncodedBlob, Check::Link] {
            assert!(rules.check(check).is_some(), "{check:?}");
        }
    }

    #[test]
    fn a_rule_that_misses_its_example_fails_to_load() {
        let base = "link-hosts: []\nblob-min-chars: 10\nrules:\n";
        let rule = |pattern: &str, matching: &str, miss: &str| {
            format!("{base}  - id: r\n    severity: high\n    in: scripts\n    message: m\n    pattern: '{pattern}'\n    examples: {{match: ['{matching}'], miss: ['{miss}']}}\n")
        };
        assert!(Rules::parse(&rule("curl", "curl x", "wget x")).is_ok());
        let err = Rules::parse(&rule("curl", "wget x", "ls")).unwrap_err().to_string();
        assert!(err.contains("does not match its example"), "{err}");
        let err = Rules::parse(&rule("curl", "curl x", "curl y")).unwrap_err().to_string();
        assert!(err.contains("which it must miss"), "{err}");
        let err = Rules::parse(&format!("{base}  - id: r\n    severity: high\n    message: m\n    pattern: x\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs either"), "{err}");
        let err = Rules::parse(&format!("{base}  - id: r\n    severity: severe\n    message: m\n    check: link\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("severe"), "{err}");
        let twice = format!(
            "{base}  - id: r\n    severity: low\n    message: m\n    check: link\n  - id: r\n    severity: low\n    message: m\n    check: setuid\n"
        );
        assert!(Rules::parse(&twice).unwrap_err().to_string().contains("used twice"));
    }

    #[test]
    fn hosts_match_themselves_and_their_subdomains_only() {
        let rules = Rules::built_in();
        for allowed in ["github.com", "docs.github.com", "GITHUB.COM", "en.wikipedia.org", "localhost"] {
            assert!(rules.allows_host(allowed), "{allowed}");
        }
        for outside in
            ["evilgithub.com", "github.com.evil.example.xyz", "collect.example.net.attacker.io", "pastebin.com"]
        {
            assert!(!rules.allows_host(outside), "{outside}");
        }
    }

    #[test]
    fn lines_runs_and_excerpts() {
        let index = LineIndex::new(b"a\nbb\n\nc");
        assert_eq!([0, 1, 2, 4, 5, 6].map(|o| index.line_of(o)), [1, 1, 2, 2, 3, 4]);
        assert_eq!(longest_encoded_run(b"ab cdef g"), Some((3, 4)));
        assert_eq!(longest_encoded_run(b"abcdef"), Some((0, 6)));
        assert_eq!(longest_encoded_run(b"  "), None);
        assert_eq!(excerpt("a\u{202e}b\tc".as_bytes()), "a\\u{202e}b\\u{9}c");
        assert_eq!(excerpt("x".repeat(MAX_EXCERPT_CHARS + 5).as_bytes()).chars().count(), MAX_EXCERPT_CHARS + 1);
    }

    #[test]
    fn binaries_are_told_by_their_headers() {
        assert!(is_executable_binary(b"\x7fELF\x02\x01\x01"));
        assert!(is_executable_binary(b"\xcf\xfa\xed\xfe\x07"));
        let mut pe = vec![0u8; 0x84];
        pe[..2].copy_from_slice(b"MZ");
        pe[0x3c] = 0x80;
        pe[0x80..].copy_from_slice(b"PE\0\0");
        assert!(is_executable_binary(&pe));
        pe[0x3c] = 0x7f;
        assert!(!is_executable_binary(&pe));
        assert!(!is_executable_binary(b"\x89PNG\r\n\x1a\n"));
        assert!(!is_executable_binary(b"MZ is a postcode"));
    }
}
