//! The models a server offers, by name, and the rule that decides which of
//! them stay loaded. The rule is a pure function over what is loaded
//! ([`Resident`]), so each case is a table test with no model.

use std::time::{Duration, Instant};

use super::ModelSource;

/// Models a server keeps loaded at once when the operator sets no
/// `--max-loaded-models`: every configured one may be resident, and memory
/// (`--models-memory`) is the bound that evicts.
pub const DEFAULT_MAX_LOADED: usize = usize::MAX;

/// The share of the host's memory the loaded models may take when the
/// operator sets no `--models-memory`, in percent.
pub const DEFAULT_MEMORY_PERCENT: u64 = 75;

/// One model the server offers.
#[derive(Debug, Clone)]
pub struct ModelEntry {
    /// The name requests use in their `model` field.
    pub name: String,
    pub source: ModelSource,
    /// What loading it is expected to take, in bytes, before it was ever
    /// loaded: the size of its files. Once loaded, the engine's own figure
    /// (weights plus KV cache) replaces it.
    pub bytes: u64,
}

/// How many models, and how much of them, may be loaded at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// `--max-loaded-models`.
    pub max_loaded: usize,
    /// `--models-memory`: weights plus KV cache of the loaded models.
    pub memory_bytes: u64,
    /// `--model-idle-unload`: a model nobody used for this long is unloaded.
    pub idle_unload: Option<Duration>,
}

impl Default for ModelLimits {
    fn default() -> Self {
        ModelLimits { max_loaded: DEFAULT_MAX_LOADED, memory_bytes: u64::MAX, idle_unload: None }
    }
}

/// The configured models, the one that answers requests naming none, and
/// the limits on loading them.
#[derive(Debug, Clone)]
pub struct Catalog {
    entries: Vec<ModelEntry>,
    default: usize,
    pub limits: ModelLimits,
}

/// Why a catalog could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("no model is configured")]
    Empty,
    #[error("two models are called '{0}'; give each its own name (--model NAME=PATH)")]
    Duplicate(String),
    #[error("--default-model '{asked}' is not one of the configured models: {known}")]
    UnknownDefault { asked: String, known: String },
}

impl Catalog {
    /// One model, loaded at start-up as it always was.
    pub fn single(source: ModelSource) -> Catalog {
        let name = source.name();
        Catalog { entries: vec![ModelEntry { name, source, bytes: 0 }], default: 0, limits: ModelLimits::default() }
    }

    /// Several models; `default` names the one for requests that name none
    /// (the first one when `None`).
    pub fn new(entries: Vec<ModelEntry>, default: Option<&str>, limits: ModelLimits) -> Result<Catalog, CatalogError> {
        if entries.is_empty() {
            return Err(CatalogError::Empty);
        }
        for (index, entry) in entries.iter().enumerate() {
            if entries[..index].iter().any(|earlier| earlier.name == entry.name) {
                return Err(CatalogError::Duplicate(entry.name.clone()));
            }
        }
        let default = match default {
            None => 0,
            Some(asked) => {
                entries.iter().position(|entry| entry.name == asked).ok_or_else(|| CatalogError::UnknownDefault {
                    asked: asked.to_string(),
                    known: entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", "),
                })?
            }
        };
        Ok(Catalog { entries, default, limits })
    }

    pub fn entries(&self) -> &[ModelEntry] {
        &self.entries
    }

    pub fn default_name(&self) -> &str {
        &self.entries[self.default].name
    }

    /// The configured names, the default first.
    pub fn names(&self) -> Vec<&str> {
        let mut names = vec![self.default_name()];
        names.extend(self.entries.iter().map(|e| e.name.as_str()).filter(|name| *name != self.default_name()));
        names
    }
}

/// A loaded model as the eviction rule sees it.
#[derive(Debug, Clone)]
pub struct Resident<'a> {
    pub name: &'a str,
    pub bytes: u64,
    /// Turns running on it; a model with any is never unloaded under them.
    pub running: usize,
    pub last_used: Instant,
}

/// What loading one more model takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Room<'a> {
    /// It fits once these idle models are unloaded (maybe none), least
    /// recently used first.
    Evict(Vec<&'a str>),
    /// It fits only once a model with running turns goes idle: wait.
    Wait,
}

/// Which idle models to unload so one of `need` bytes fits within
/// `limits`, least recently used first. A model larger than the memory
/// bound alone is loaded alone: the bound decides what shares memory with
/// it, not whether the operator's model can run at all.
pub fn make_room<'a>(resident: &[Resident<'a>], need: u64, limits: &ModelLimits) -> Room<'a> {
    let fits = |count: usize, bytes: u64| {
        count < limits.max_loaded.max(1) && (count == 0 || bytes.saturating_add(need) <= limits.memory_bytes)
    };
    let mut count = resident.len();
    let mut bytes: u64 = resident.iter().map(|r| r.bytes).sum();
    let mut idle: Vec<&Resident<'a>> = resident.iter().filter(|r| r.running == 0).collect();
    idle.sort_by_key(|r| r.last_used);
    let mut evict = Vec::new();
    for candidate in idle {
        if fits(count, bytes) {
            break;
        }
        evict.push(candidate.name);
        count -= 1;
        bytes -= candidate.bytes;
    }
    if fits(count, bytes) {
        Room::Evict(evict)
    } else {
        Room::Wait
    }
}

/// The idle models unused for longer than `limits.idle_unload` at `now`.
pub fn idle_expired<'a>(resident: &[Resident<'a>], limits: &ModelLimits, now: Instant) -> Vec<&'a str> {
    let Some(after) = limits.idle_unload else { return Vec::new() };
    resident
        .iter()
        .filter(|r| r.running == 0 && now.saturating_duration_since(r.last_used) >= after)
        .map(|r| r.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    fn resident(name: &str, gb: u64, running: usize, age_s: u64, now: Instant) -> Resident<'_> {
        Resident { name, bytes: gb * GB, running, last_used: now - Duration::from_secs(age_s) }
    }

    #[test]
    fn room_is_made_by_unloading_idle_models_least_recently_used_first() {
        let now = Instant::now();
        let limits =
            |max_loaded, memory_gb: u64| ModelLimits { max_loaded, memory_bytes: memory_gb * GB, idle_unload: None };
        let a = resident("a", 4, 0, 10, now);
        let b = resident("b", 4, 0, 100, now);
        let busy = resident("busy", 4, 2, 1000, now);
        let cases: Vec<(&str, Vec<Resident>, u64, ModelLimits, Room)> = vec![
            ("nothing loaded", vec![], 4, limits(1, 8), Room::Evict(vec![])),
            ("fits beside the others", vec![a.clone()], 4, limits(2, 8), Room::Evict(vec![])),
            ("exactly at the memory bound", vec![a.clone()], 4, limits(9, 8), Room::Evict(vec![])),
            (
                "one byte past it evicts",
                vec![a.clone()],
                4 * GB + 1,
                ModelLimits { memory_bytes: 8 * GB, ..limits(9, 8) },
                Room::Evict(vec!["a"]),
            ),
            ("the count bound evicts the oldest", vec![a.clone(), b.clone()], 1, limits(2, 64), Room::Evict(vec!["b"])),
            (
                "memory evicts the oldest, and stops once it fits",
                vec![a.clone(), b.clone()],
                8,
                limits(9, 12),
                Room::Evict(vec!["b"]),
            ),
            (
                "memory goes on to the next oldest",
                vec![a.clone(), b.clone()],
                8,
                limits(9, 11),
                Room::Evict(vec!["b", "a"]),
            ),
            ("a running model is never evicted", vec![busy.clone()], 4, limits(1, 64), Room::Wait),
            (
                "the idle one goes, the busy one stays",
                vec![busy.clone(), a.clone()],
                4,
                limits(2, 64),
                Room::Evict(vec!["a"]),
            ),
            ("busy ones alone fill memory", vec![busy.clone(), a.clone()], 61, limits(9, 64), Room::Wait),
            (
                "beside a busy one once the idle one goes",
                vec![busy.clone(), a.clone()],
                60,
                limits(9, 64),
                Room::Evict(vec!["a"]),
            ),
            ("larger than the bound loads alone", vec![a.clone()], 100, limits(9, 64), Room::Evict(vec!["a"])),
            ("larger than the bound, nothing loaded", vec![], 100, limits(9, 64), Room::Evict(vec![])),
            ("a bound of 0 models still loads one", vec![], 1, limits(0, 64), Room::Evict(vec![])),
        ];
        for (what, resident, need, limits, expected) in cases {
            let need = if need < GB { need * GB } else { need };
            assert_eq!(make_room(&resident, need, &limits), expected, "{what}");
        }
    }

    #[test]
    fn idle_models_expire_after_the_idle_time_and_busy_ones_never() {
        let now = Instant::now();
        let limits = ModelLimits { idle_unload: Some(Duration::from_secs(60)), ..ModelLimits::default() };
        let resident =
            [resident("at", 1, 0, 60, now), resident("before", 1, 0, 59, now), resident("busy", 1, 1, 600, now)];
        assert_eq!(idle_expired(&resident, &limits, now), vec!["at"]);
        assert!(idle_expired(&resident, &ModelLimits::default(), now).is_empty());
    }

    #[test]
    fn the_default_leads_the_names_and_duplicates_or_an_unknown_default_are_refused() {
        let entry = |name: &str| ModelEntry {
            name: name.into(),
            source: ModelSource::Load(skillhost_engine::EngineConfig {
                model_path: format!("/m/{name}.gguf").into(),
                ..Default::default()
            }),
            bytes: 0,
        };
        let catalog = Catalog::new(vec![entry("small"), entry("big")], Some("big"), ModelLimits::default()).unwrap();
        assert_eq!(catalog.default_name(), "big");
        assert_eq!(catalog.names(), ["big", "small"]);
        assert_eq!(
            Catalog::new(vec![entry("a"), entry("a")], None, ModelLimits::default()).unwrap_err(),
            CatalogError::Duplicate("a".into())
        );
        assert!(matches!(
            Catalog::new(vec![entry("a")], Some("b"), ModelLimits::default()),
            Err(CatalogError::UnknownDefault { .. })
        ));
    }
}
