//! Agent Skills: reading SKILL.md files, confining every path inside a skill,
//! scanning roots into a registry, installing uploaded archives, and the
//! `SkillRegistryActor` that owns the current snapshot.

pub mod actor;
pub mod install;
pub mod manifest;
pub mod outcomes;
pub mod prompt;
pub mod registry;
pub mod roots;
pub mod skill;
pub mod versions;

pub use actor::{SkillsConfig, SkillsError};
pub use manifest::Manifest;
pub use registry::{Changes, LoadError, Root, Snapshot};
pub use skill::{FileKind, Origin, Skill, SkillFile};
