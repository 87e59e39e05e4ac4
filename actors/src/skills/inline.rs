//! Skills a request brings: written to a private folder for that request,
//! loaded and scanned like any other, visible to that request alone, and
//! removed with it.
//!
//! A coding agent's repository skills are the common case: they belong to
//! the caller's working copy, not to the server. So they never enter the
//! registry: the request's turn sees the registry's snapshot with these
//! added, and the folder goes when the last holder of the request drops.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::install::MAX_ENTRY_BYTES;
use super::registry::skip_set;
use super::scan::{summarize, Finding, Policy};
use super::skill::{load_skill, Origin, Skill};
use crate::path_guard;

/// Most skills one request brings.
pub const MAX_INLINE_SKILLS: usize = 16;
/// Most files one skill a request brings holds, SKILL.md included.
pub const MAX_INLINE_FILES: usize = 256;
/// Most bytes all the skills of one request hold together. A request body
/// is JSON held in memory, so this is far below an upload's 256 MB.
pub const MAX_INLINE_BYTES: usize = 8 * 1024 * 1024;

/// One skill as the request spelled it: its name and its files' text by
/// path inside the skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineSpec {
    pub name: String,
    pub files: BTreeMap<String, String>,
}

/// The skills of one request, in their folder. The folder is removed when
/// this drops, which is when the request's turn lets go of it.
#[derive(Debug)]
pub struct InlineSkills {
    pub skills: Vec<Arc<Skill>>,
    _folder: tempfile::TempDir,
}

impl PartialEq for InlineSkills {
    fn eq(&self, other: &Self) -> bool {
        self.skills == other.skills
    }
}

/// Why a request's skills were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InlineError {
    /// Malformed, over a limit, or not a skill (HTTP 400).
    #[error("{0}")]
    Rejected(String),
    /// The scan found what the install policy refuses (HTTP 422).
    #[error("{message}")]
    Unsafe { message: String, findings: Vec<Finding> },
    /// The private folder could not be written (HTTP 500).
    #[error("{0}")]
    Io(String),
}

fn rejected(message: impl Into<String>) -> InlineError {
    InlineError::Rejected(message.into())
}

/// Writes, loads and scans the skills `specs` describe, under a fresh
/// private folder in `parent`. `taken` says whether a name is already used
/// by a registered skill: a request may not shadow one.
pub fn materialize(
    specs: &[InlineSpec],
    parent: &Path,
    policy: Policy,
    taken: &dyn Fn(&str) -> bool,
) -> Result<InlineSkills, InlineError> {
    if specs.len() > MAX_INLINE_SKILLS {
        return Err(rejected(format!(
            "the request brings {} skills; at most {MAX_INLINE_SKILLS} are accepted",
            specs.len()
        )));
    }
    let total: usize = specs.iter().flat_map(|s| s.files.iter()).map(|(path, text)| path.len() + text.len()).sum();
    if total > MAX_INLINE_BYTES {
        return Err(rejected(format!(
            "the request's skills hold {total} bytes; at most {MAX_INLINE_BYTES} are accepted"
        )));
    }
    let folder = tempfile::Builder::new()
        .prefix(".request-skills-")
        .tempdir_in(parent)
        .map_err(|err| InlineError::Io(format!("cannot make a folder for the request's skills: {err}")))?;
    // Traversable but not listable: a command running as its own uid reaches
    // the skill's files by the path the turn gives it, while no one lists
    // the folder to find another request's skills.
    std::fs::set_permissions(folder.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711))
        .map_err(|err| InlineError::Io(format!("cannot make a folder for the request's skills: {err}")))?;
    let mut skills = Vec::with_capacity(specs.len());
    let mut names = std::collections::HashSet::new();
    for spec in specs {
        // The name is a folder name: one segment the path guard accepts.
        let segments = path_guard::check_lexical(&spec.name).map_err(|err| rejected(format!("skill name: {err}")))?;
        if segments.len() != 1 {
            return Err(rejected(format!("the skill name '{}' must be one folder name, without '/'", spec.name)));
        }
        if !names.insert(spec.name.clone()) {
            return Err(rejected(format!("the request brings the skill '{}' twice", spec.name)));
        }
        if taken(&spec.name) {
            return Err(rejected(format!(
                "a skill named '{}' is already registered on this server; a request may not replace it, so name yours otherwise",
                spec.name
            )));
        }
        if spec.files.len() > MAX_INLINE_FILES {
            return Err(rejected(format!(
                "the skill '{}' has {} files; at most {MAX_INLINE_FILES} are accepted",
                spec.name,
                spec.files.len()
            )));
        }
        if !spec.files.contains_key("SKILL.md") {
            return Err(rejected(format!("the skill '{}' has no SKILL.md among its files", spec.name)));
        }
        let root = folder.path().join(&spec.name);
        std::fs::create_dir(&root).map_err(|err| InlineError::Io(format!("cannot write '{}': {err}", spec.name)))?;
        for (path, text) in &spec.files {
            if text.len() as u64 > MAX_ENTRY_BYTES {
                return Err(rejected(format!(
                    "'{}' in the skill '{}' is larger than one file may be",
                    path, spec.name
                )));
            }
            // Every path goes through the guard that confines the model's
            // reads, so writing and reading agree on "inside the skill".
            let target = path_guard::path_for_create(&root, path)
                .map_err(|err| rejected(format!("the skill '{}': {err}", spec.name)))?;
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir).map_err(|err| InlineError::Io(format!("cannot write '{path}': {err}")))?;
            }
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&target)
                .and_then(|mut file| std::io::Write::write_all(&mut file, text.as_bytes()))
                .map_err(|err| InlineError::Io(format!("cannot write '{path}': {err}")))?;
        }
        let skill = load_skill(&root, Origin::Request, &skip_set())
            .map_err(|err| rejected(format!("the skill '{}' does not load: {err}", spec.name)))?;
        if skill.id() != spec.name {
            return Err(rejected(format!(
                "the skill is named '{}' but its SKILL.md says '{}'; they must agree",
                spec.name,
                skill.id()
            )));
        }
        let refusals = policy.refusals(&skill.findings);
        if !refusals.is_empty() {
            return Err(InlineError::Unsafe {
                message: format!(
                    "the skill '{}' is refused by the strict install policy: {}",
                    spec.name,
                    summarize(&refusals)
                ),
                findings: skill.findings.clone(),
            });
        }
        skills.push(Arc::new(skill));
    }
    Ok(InlineSkills { skills, _folder: folder })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, files: &[(&str, &str)]) -> InlineSpec {
        InlineSpec { name: name.into(), files: files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect() }
    }

    fn manifest(name: &str) -> String {
        format!("---\nname: {name}\ndescription: Checks the repository's style.\n---\nRun scripts/check.py.\n")
    }

    #[test]
    fn skills_load_into_a_private_folder_that_goes_with_them() {
        let parent = tempfile::tempdir().unwrap();
        let md = manifest("repo-style");
        let brought = materialize(
            &[spec("repo-style", &[("SKILL.md", &md), ("scripts/check.py", "print('ok')\n")])],
            parent.path(),
            Policy::Strict,
            &|_| false,
        )
        .unwrap();
        let skill = &brought.skills[0];
        assert_eq!((skill.id(), skill.origin, skill.files.len()), ("repo-style", Origin::Request, 1));
        assert!(skill.root.starts_with(std::fs::canonicalize(parent.path()).unwrap()));
        let folder = skill.root.parent().unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(folder).unwrap().permissions()) & 0o777,
            0o711
        );
        let root = skill.root.clone();
        drop(brought);
        assert!(!root.exists());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let parent = tempfile::tempdir().unwrap();
        let md = manifest("a");
        let cases = [
            (vec![spec("a", &[("notes.md", "x")])], "has no SKILL.md"),
            (vec![spec("a/b", &[("SKILL.md", &md)])], "must be one folder name"),
            (vec![spec("..", &[("SKILL.md", &md)])], "skill name: the path '..' is not allowed"),
            (vec![spec("a", &[("SKILL.md", &md), ("../x", "y")])], "climbs out of the skill folder"),
            (vec![spec("a", &[("SKILL.md", &md)]), spec("a", &[("SKILL.md", &md)])], "brings the skill 'a' twice"),
            (vec![spec("b", &[("SKILL.md", &md)])], "named 'b' but its SKILL.md says 'a'"),
            (vec![spec("taken", &[("SKILL.md", &manifest("taken"))])], "already registered"),
        ];
        for (specs, sentence) in cases {
            let err = materialize(&specs, parent.path(), Policy::Strict, &|name| name == "taken").unwrap_err();
            assert!(err.to_string().contains(sentence), "{err} lacks {sentence}");
        }
        // Nothing is left behind by a refusal.
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_limits_hold_at_the_limit_and_refuse_one_past_it() {
        let parent = tempfile::tempdir().unwrap();
        let many: Vec<InlineSpec> = (0..=MAX_INLINE_SKILLS)
            .map(|i| spec(&format!("s{i}"), &[("SKILL.md", &manifest(&format!("s{i}")))]))
            .collect();
        assert!(materialize(&many[..MAX_INLINE_SKILLS], parent.path(), Policy::Strict, &|_| false).is_ok());
        let err = materialize(&many, parent.path(), Policy::Strict, &|_| false).unwrap_err().to_string();
        assert!(err.contains(&format!("at most {MAX_INLINE_SKILLS}")), "{err}");

        let md = manifest("big");
        let filler = |n: usize| "x".repeat(n);
        let room = MAX_INLINE_BYTES - "SKILL.md".len() - md.len() - "a.txt".len();
        assert!(materialize(
            &[spec("big", &[("SKILL.md", &md), ("a.txt", &filler(room))])],
            parent.path(),
            Policy::Strict,
            &|_| false
        )
        .is_ok());
        let err = materialize(
            &[spec("big", &[("SKILL.md", &md), ("a.txt", &filler(room + 1))])],
            parent.path(),
            Policy::Strict,
            &|_| false,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(&format!("at most {MAX_INLINE_BYTES}")), "{err}");

        let files: Vec<(String, String)> =
            (0..MAX_INLINE_FILES).map(|i| (format!("f{i}.txt"), String::new())).collect();
        let mut at_limit = spec("wide", &[("SKILL.md", &manifest("wide"))]);
        at_limit.files.extend(files.iter().take(MAX_INLINE_FILES - 1).cloned());
        assert!(materialize(&[at_limit.clone()], parent.path(), Policy::Strict, &|_| false).is_ok());
        at_limit.files.insert("one-more.txt".into(), String::new());
        let err = materialize(&[at_limit], parent.path(), Policy::Strict, &|_| false).unwrap_err().to_string();
        assert!(err.contains(&format!("at most {MAX_INLINE_FILES}")), "{err}");
    }

    #[test]
    fn an_unsafe_skill_is_refused_with_its_findings() {
        let parent = tempfile::tempdir().unwrap();
        let md = manifest("grab");
        let specs = [spec("grab", &[("SKILL.md", &md), ("scripts/check.py", "open('/root/.ssh/id_rsa').read()\n")])];
        let Err(InlineError::Unsafe { findings, .. }) = materialize(&specs, parent.path(), Policy::Strict, &|_| false)
        else {
            panic!("not refused")
        };
        assert_eq!(findings.iter().map(|f| f.rule.as_str()).collect::<Vec<_>>(), ["credential-files"]);
        assert!(materialize(&specs, parent.path(), Policy::Warn, &|_| false).is_ok());
    }
}
