//! `skillhost list-skills`: the registry as an operator reads it.

use std::fmt::Write;

use skillhost_actors::skills::registry::scan_under;
use skillhost_actors::skills::{Origin, SkillsConfig, Snapshot};

fn origin_name(origin: Origin) -> &'static str {
    match origin {
        Origin::Discovered => "discovered",
        Origin::Installed => "installed",
        Origin::Request => "request",
    }
}

/// Scans the configured roots and renders what was found.
pub fn render(config: Option<&SkillsConfig>) -> String {
    let Some(config) = config else {
        return "Skills are off (--no-skills).\n".to_string();
    };
    let snapshot = scan_under(&config.roots, config.policy.roots);
    render_snapshot(config, &snapshot)
}

fn render_snapshot(config: &SkillsConfig, snapshot: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Roots, in precedence order:");
    for root in &config.roots {
        let _ = writeln!(out, "  {:<10}  {}", origin_name(root.origin), root.path.display());
    }
    let _ = writeln!(out, "\n{} skill(s):", snapshot.skills.len());
    for skill in snapshot.skills.values() {
        let _ = writeln!(
            out,
            "  {}  ({}, {} files, {} bytes)  {}",
            skill.id(),
            origin_name(skill.origin),
            skill.files.len(),
            skill.bytes,
            skill.root.display()
        );
        let _ = writeln!(out, "      {}", skill.manifest.description);
        let marks = skill.manifest.governance_notes();
        for mark in marks {
            let _ = writeln!(out, "      {mark}");
        }
        for warning in &skill.warnings {
            let _ = writeln!(out, "      warning: {warning}");
        }
        for finding in &skill.findings {
            let excerpt = finding.excerpt.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "      {} {} at {} ({}){excerpt}",
                finding.severity.as_str(),
                finding.rule,
                finding.place(),
                finding.message
            );
        }
    }
    if !snapshot.errors.is_empty() {
        let _ = writeln!(out, "\n{} folder(s) did not load:", snapshot.errors.len());
        for error in &snapshot.errors {
            let _ = writeln!(out, "  {}: {}", error.path.display(), error.message);
        }
    }
    out
}
