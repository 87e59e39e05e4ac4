//! Agent Skills: reading SKILL.md files, confining every path inside a skill,
//! the static scan of what a skill holds, scanning roots into a registry, installing uploaded archives, and the
//! `SkillRegistryActor` that owns the current snapshot.

pub mod actor;
pub mod discovery;
pub mod fetch;
pub mod inline;
pub mod install;
pub mod manifest;
pub mod outcomes;
pub mod prompt;
pub mod registry;
pub mod roots;
pub mod scan;
pub mod skill;
pub mod versions;

pub use actor::{SkillsConfig, SkillsError};
pub use manifest::Manifest;
pub use registry::{Changes, LoadError, Root, Snapshot};
pub use scan::{Finding, Policy, Severity};
pub use skill::{FileKind, Origin, Skill, SkillFile};
