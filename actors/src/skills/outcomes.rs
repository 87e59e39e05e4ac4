//! Per-skill outcomes: how often each skill is advertised, read and run,
//! and how the turns that used it ended, by the surface the request came
//! by. `/metrics`, `GET /api/skills/{id}` and the Web UI's skills page show
//! them, so an operator can tell which skills help and which the model
//! reads and then fails with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::surface::Surface;

/// Skill and surface pairs kept. The registry holds at most 512 skills, but
/// ids come and go with rescans and uploads over a server's life; past
/// this, new pairs are not counted (and the log says so once) rather than
/// letting the table grow without end.
pub const MAX_TRACKED: usize = 4096;

/// Something that happened to a skill in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkillEvent {
    /// Named in the prompt: selected, or listed in the catalog.
    Advertised,
    /// Its SKILL.md was read (`skills_read`), or inlined in the prompt.
    Read,
    /// One of its scripts ran (`skills_run`).
    Run,
    /// An MCP tool its `allowed-tools` names was called while it was loaded.
    McpCall,
}

/// How a turn that read or ran a skill ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// A final answer.
    Answer,
    /// An error ended it.
    Error,
    /// A call to one of the caller's own tools ended it.
    ToolCall,
    /// A bound cut it short: the token budget, the rounds or the time.
    Budget,
    /// The client left before it ended.
    Cancelled,
}

impl Outcome {
    pub const ALL: [Outcome; 5] =
        [Outcome::Answer, Outcome::Error, Outcome::ToolCall, Outcome::Budget, Outcome::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Answer => "answer",
            Outcome::Error => "error",
            Outcome::ToolCall => "tool_call",
            Outcome::Budget => "budget",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// One skill's counts on one surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub advertised: u64,
    pub read: u64,
    pub run: u64,
    pub mcp_calls: u64,
    /// Turns that read or ran the skill, by how they ended ([`Outcome::ALL`] order).
    pub outcomes: [u64; 5],
}

impl Counts {
    pub fn outcome(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome as usize]
    }
}

/// The server's table of counts.
#[derive(Debug, Default)]
pub struct SkillOutcomes {
    table: Mutex<BTreeMap<(String, Surface), Counts>>,
    /// The table was full once (logged once).
    full: AtomicBool,
}

impl SkillOutcomes {
    fn with(&self, skill: &str, surface: Surface, change: impl FnOnce(&mut Counts)) {
        let mut table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (skill.to_string(), surface);
        if let Some(counts) = table.get_mut(&key) {
            change(counts);
        } else if table.len() < MAX_TRACKED {
            change(table.entry(key).or_default());
        } else if !self.full.swap(true, Ordering::Relaxed) {
            tracing::warn!(limit = MAX_TRACKED, "the per-skill outcome table is full; new skills are not counted");
        }
    }

    /// Counts one event for each of `skills`.
    pub fn event<'a>(&self, skills: impl IntoIterator<Item = &'a String>, surface: Surface, event: SkillEvent) {
        for skill in skills {
            self.with(skill, surface, |counts| match event {
                SkillEvent::Advertised => counts.advertised += 1,
                SkillEvent::Read => counts.read += 1,
                SkillEvent::Run => counts.run += 1,
                SkillEvent::McpCall => counts.mcp_calls += 1,
            });
        }
    }

    /// Counts how a turn ended, once for each skill it read or ran.
    pub fn outcome(&self, used: &BTreeSet<String>, surface: Surface, outcome: Outcome) {
        for skill in used {
            self.with(skill, surface, |counts| counts.outcomes[outcome as usize] += 1);
        }
    }

    /// Every pair counted so far, in order.
    pub fn all(&self) -> Vec<(String, Surface, Counts)> {
        let table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        table.iter().map(|((skill, surface), counts)| (skill.clone(), *surface, *counts)).collect()
    }

    /// One skill's counts, by surface.
    pub fn of(&self, skill: &str) -> Vec<(Surface, Counts)> {
        let table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Surface::ALL
            .iter()
            .filter_map(|surface| table.get(&(skill.to_string(), *surface)).map(|c| (*surface, *c)))
            .collect()
    }
}

/// The skills one turn read or ran, counted with how the turn ends; a
/// turn dropped before it ended (its client left, its loop was killed) is
/// counted as cancelled.
#[derive(Debug)]
pub struct TurnSkills {
    outcomes: std::sync::Arc<SkillOutcomes>,
    surface: Surface,
    used: BTreeSet<String>,
}

impl TurnSkills {
    pub fn new(outcomes: std::sync::Arc<SkillOutcomes>, surface: Surface) -> TurnSkills {
        TurnSkills { outcomes, surface, used: BTreeSet::new() }
    }

    pub fn insert(&mut self, skill: String) {
        self.used.insert(skill);
    }

    /// Counts the turn's end for each skill it used; the next turn starts
    /// with none.
    pub fn end(&mut self, outcome: Outcome) {
        let used = std::mem::take(&mut self.used);
        self.outcomes.outcome(&used, self.surface, outcome);
    }
}

impl Drop for TurnSkills {
    fn drop(&mut self) {
        self.end(Outcome::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_skill_and_surface() {
        let outcomes = SkillOutcomes::default();
        let pdf = vec!["pdf".to_string()];
        outcomes.event(&pdf, Surface::OpenAi, SkillEvent::Advertised);
        outcomes.event(&pdf, Surface::OpenAi, SkillEvent::Read);
        outcomes.event(&pdf, Surface::WebUi, SkillEvent::Run);
        outcomes.outcome(&pdf.iter().cloned().collect(), Surface::OpenAi, Outcome::ToolCall);
        let of = outcomes.of("pdf");
        assert_eq!(of.len(), 2);
        assert_eq!(
            (of[0].0, of[0].1.advertised, of[0].1.read, of[0].1.outcome(Outcome::ToolCall)),
            (Surface::OpenAi, 1, 1, 1)
        );
        assert_eq!((of[1].0, of[1].1.run, of[1].1.outcome(Outcome::Answer)), (Surface::WebUi, 1, 0));
        assert!(outcomes.of("xlsx").is_empty());
    }

    #[test]
    fn a_turn_dropped_before_its_end_counts_as_cancelled() {
        let outcomes = std::sync::Arc::new(SkillOutcomes::default());
        let mut turn = TurnSkills::new(std::sync::Arc::clone(&outcomes), Surface::Cli);
        turn.insert("pdf".into());
        turn.end(Outcome::Answer);
        turn.insert("pdf".into());
        drop(turn);
        let counts = outcomes.of("pdf")[0].1;
        assert_eq!((counts.outcome(Outcome::Answer), counts.outcome(Outcome::Cancelled)), (1, 1));
    }

    #[test]
    fn the_table_stops_growing_at_its_limit() {
        let outcomes = SkillOutcomes::default();
        for i in 0..MAX_TRACKED {
            outcomes.event(&[format!("s{i}")], Surface::OpenAi, SkillEvent::Read);
        }
        assert_eq!(outcomes.all().len(), MAX_TRACKED);
        // One past: not counted, and what is there still counts.
        outcomes.event(&["one-more".to_string()], Surface::OpenAi, SkillEvent::Read);
        assert_eq!(outcomes.all().len(), MAX_TRACKED);
        assert!(outcomes.of("one-more").is_empty());
        outcomes.event(&["s0".to_string()], Surface::OpenAi, SkillEvent::Read);
        assert_eq!(outcomes.of("s0")[0].1.read, 2);
    }
}
