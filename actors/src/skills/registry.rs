//! Scanning skill roots into an immutable registry snapshot.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::scan::{summarize, Policy};
use super::skill::{load_skill, Origin, Skill};

/// Most skills one registry holds, so that a root pointed at the wrong
/// directory (a home folder, a monorepo) fails visibly instead of filling
/// memory.
pub const MAX_REGISTRY_SKILLS: usize = 512;
/// How many levels below a root a SKILL.md is looked for:
/// `root/SKILL.md`, `root/<skill>/SKILL.md` and `root/skills/<skill>/SKILL.md`.
pub const MAX_SCAN_DEPTH: usize = 3;
/// Folder names never scanned or indexed: tool folders, and the install
/// folder's own (staged uploads, every version, links not yet in place),
/// which would otherwise load as second copies of a skill.
const SKIPPED: [&str; 6] = [".git", "node_modules", "__pycache__", ".upload-*", ".versions", ".link-*"];

/// A directory to scan and the origin of what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub path: PathBuf,
    pub origin: Origin,
}

/// A directory that looked like a skill and did not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub path: PathBuf,
    pub message: String,
}

/// What the registry holds at one moment. Never changed once built; a scan,
/// an install or a delete builds a new one.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// By id, in ordinal order.
    pub skills: BTreeMap<String, Arc<Skill>>,
    pub errors: Vec<LoadError>,
}

impl Snapshot {
    pub fn get(&self, id: &str) -> Option<&Arc<Skill>> {
        self.skills.get(id)
    }

    /// The ids, sorted, for "available skills: …" messages.
    pub fn ids(&self) -> Vec<&str> {
        self.skills.keys().map(String::as_str).collect()
    }
}

/// What a rescan changed, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// Compares two snapshots.
pub fn changes(before: &Snapshot, after: &Snapshot) -> Changes {
    let mut out = Changes::default();
    for (id, skill) in &after.skills {
        match before.skills.get(id) {
            None => out.added.push(id.clone()),
            Some(old) if **old != **skill => out.changed.push(id.clone()),
            Some(_) => {}
        }
    }
    out.removed = before.skills.keys().filter(|id| !after.skills.contains_key(*id)).cloned().collect();
    out
}

/// The folder names skipped while scanning and indexing.
pub fn skip_set() -> GlobSet {
    let mut builder = GlobSetBuilder::new();
    for name in SKIPPED {
        // Literal names always compile.
        if let Ok(glob) = Glob::new(name) {
            builder.add(glob);
        }
    }
    builder.build().unwrap_or_else(|_| GlobSet::empty())
}

/// Scans every root, in order, into a snapshot, loading every skill whatever
/// its findings.
pub fn scan(roots: &[Root]) -> Snapshot {
    scan_under(roots, Policy::Warn)
}

/// Scans every root, in order, into a snapshot; `policy` judges the skills
/// of the operator's roots. Installed skills were judged when they went in.
pub fn scan_under(roots: &[Root], policy: Policy) -> Snapshot {
    let skip = skip_set();
    let mut errors = Vec::new();
    let mut seen_dirs = HashSet::new();
    let mut loaded: Vec<Skill> = Vec::new();
    for root in roots {
        let Ok(canonical) = std::fs::canonicalize(&root.path) else {
            // The install folder is made by the first upload; until then
            // it simply holds nothing.
            if root.origin != Origin::Installed {
                errors.push(LoadError { path: root.path.clone(), message: "the skills root does not exist".into() });
            }
            continue;
        };
        let mut dirs = Vec::new();
        find_skill_dirs(&canonical, &canonical, 0, &skip, &mut dirs);
        for dir in dirs {
            if !seen_dirs.insert(dir.clone()) {
                continue;
            }
            match load_skill(&dir, root.origin, &skip) {
                Ok(skill) => {
                    // Installed skills were judged when they went in.
                    let refusals = match root.origin {
                        Origin::Discovered => policy.refusals(&skill.findings),
                        Origin::Installed | Origin::Request => Vec::new(),
                    };
                    if refusals.is_empty() {
                        loaded.push(skill);
                    } else {
                        errors.push(LoadError {
                            path: dir,
                            message: format!(
                                "the skill '{}' is not loaded under the strict install policy: {}",
                                skill.id(),
                                summarize(&refusals)
                            ),
                        });
                    }
                }
                Err(err) => errors.push(LoadError { path: dir, message: err.to_string() }),
            }
        }
    }

    // A name is what users type and what SKILL.md files cross-reference, so
    // two skills claiming one name are both refused rather than one renamed.
    let mut by_name: HashMap<String, Vec<PathBuf>> = HashMap::new();
    for skill in &loaded {
        by_name.entry(skill.id().to_string()).or_default().push(skill.root.clone());
    }
    let mut skills = BTreeMap::new();
    let mut over_limit = Vec::new();
    for skill in loaded {
        let paths = &by_name[skill.id()];
        if paths.len() > 1 {
            let others: Vec<String> =
                paths.iter().filter(|p| **p != skill.root).map(|p| p.display().to_string()).collect();
            errors.push(LoadError {
                path: skill.root.clone(),
                message: format!(
                    "the name '{}' is also used by {}; skill names must be unique, so neither is loaded",
                    skill.id(),
                    others.join(" and ")
                ),
            });
            continue;
        }
        if skills.len() >= MAX_REGISTRY_SKILLS {
            over_limit.push(skill.root);
            continue;
        }
        skills.insert(skill.id().to_string(), Arc::new(skill));
    }
    if let Some(first) = over_limit.first() {
        errors.push(LoadError {
            path: first.clone(),
            message: format!(
                "the registry holds at most {MAX_REGISTRY_SKILLS} skills; {} more were found and not loaded (is a skills root pointing at the wrong folder?)",
                over_limit.len()
            ),
        });
    }
    errors.sort_by(|a, b| a.path.cmp(&b.path));
    Snapshot { skills, errors }
}

/// Collects folders holding a SKILL.md, at most [`MAX_SCAN_DEPTH`] levels
/// down, never following a link out of the root and never descending into a
/// skill (skills do not nest).
fn find_skill_dirs(root: &Path, dir: &Path, depth: usize, skip: &GlobSet, out: &mut Vec<PathBuf>) {
    if std::fs::symlink_metadata(dir.join("SKILL.md")).is_ok() {
        out.push(dir.to_path_buf());
        return;
    }
    if depth + 1 >= MAX_SCAN_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if skip.is_match(entry.file_name()) {
            continue;
        }
        let Ok(file_type) = entry.file_type() else { continue };
        let path = entry.path();
        let next = if file_type.is_symlink() {
            match std::fs::canonicalize(&path) {
                Ok(target) if target.starts_with(root) && target.is_dir() => target,
                _ => continue,
            }
        } else if file_type.is_dir() {
            path
        } else {
            continue;
        };
        find_skill_dirs(root, &next, depth + 1, skip, out);
    }
}
