//! Sandbox profiles: what a sandboxed command may read and execute, as data.
//!
//! A profile denies everything it does not list. It carries example paths it
//! must allow and must deny, checked when it loads, so an edit that widens or
//! breaks a profile fails at start-up instead of in production.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Resource limits applied to every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPU time, in seconds.
    pub cpu_seconds: u64,
    /// Virtual memory, in megabytes.
    pub address_space_mb: u64,
    /// Processes the sandbox user may have at once.
    pub processes: u64,
    /// Largest file a command may write, in megabytes.
    pub file_size_mb: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Examples {
    pub allow: Vec<PathBuf>,
    pub deny: Vec<PathBuf>,
}

/// A loaded, checked profile.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub description: String,
    /// Paths a command may read.
    #[serde(default)]
    pub read: Vec<PathBuf>,
    /// Paths a command may read and execute.
    #[serde(default)]
    pub execute: Vec<PathBuf>,
    pub limits: Limits,
    pub examples: Examples,
}

impl Profile {
    /// Whether `path` lies under a listed read or execute path.
    pub fn allows(&self, path: &Path) -> bool {
        self.read.iter().chain(&self.execute).any(|allowed| path.starts_with(allowed))
    }

    /// Parses and checks a profile.
    pub fn parse(text: &str, name: &str) -> Result<Profile, ProfileError> {
        let invalid = |reason: ProfileFault| ProfileError::Invalid { name: name.to_string(), reason };
        let profile: Profile =
            serde_yaml::from_str(text).map_err(|err| invalid(ProfileFault::Yaml(err.to_string())))?;
        for path in profile.read.iter().chain(&profile.execute) {
            if !path.is_absolute() {
                return Err(invalid(ProfileFault::Relative(path.clone())));
            }
        }
        for path in &profile.examples.allow {
            if !profile.allows(path) {
                return Err(invalid(ProfileFault::Denies(path.clone())));
            }
        }
        for path in &profile.examples.deny {
            if profile.allows(path) {
                return Err(invalid(ProfileFault::Allows(path.clone())));
            }
        }
        Ok(profile)
    }

    /// Loads `<dir>/<name>.yaml`.
    pub fn load(dir: &Path, name: &str) -> Result<Profile, ProfileError> {
        let path = dir.join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&path).map_err(|source| ProfileError::Unreadable { path, source })?;
        Profile::parse(&text, name)
    }
}

/// Why a sandbox profile cannot be used. Either way nothing runs under it:
/// the helper refuses the command, and the server does not start.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file is missing or cannot be read.
    #[error("cannot read the sandbox profile {}: {source}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    /// The file says something a profile may not.
    #[error("the sandbox profile '{name}' {reason}")]
    Invalid { name: String, reason: ProfileFault },
}

/// What is wrong inside a profile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileFault {
    #[error("is not valid: {0}")]
    Yaml(String),
    #[error("lists '{}', which is not an absolute path", .0.display())]
    Relative(PathBuf),
    /// A path its examples say it must allow is denied.
    #[error("must allow '{}' but does not", .0.display())]
    Denies(PathBuf),
    /// A path its examples say it must deny is allowed.
    #[error("must deny '{}' but allows it", .0.display())]
    Allows(PathBuf),
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "description: test\nread: [/etc]\nexecute: [/usr/bin]\nlimits: {cpu_seconds: 1, address_space_mb: 1, processes: 1, file_size_mb: 1}\n";

    #[test]
    fn examples_are_checked_at_load() {
        let ok = format!("{BASE}examples: {{allow: [/etc/passwd, /usr/bin/python3], deny: [/root, /etcetera]}}\n");
        assert!(Profile::parse(&ok, "ok").is_ok());
        let widened = format!("{BASE}examples: {{allow: [], deny: [/etc/hosts]}}\n");
        assert_eq!(
            Profile::parse(&widened, "w").unwrap_err().to_string(),
            "the sandbox profile 'w' must deny '/etc/hosts' but allows it"
        );
        let narrowed = format!("{BASE}examples: {{allow: [/bin/sh], deny: []}}\n");
        assert_eq!(
            Profile::parse(&narrowed, "n").unwrap_err().to_string(),
            "the sandbox profile 'n' must allow '/bin/sh' but does not"
        );
        let unknown = format!("{BASE}network: true\nexamples: {{allow: [], deny: []}}\n");
        assert!(Profile::parse(&unknown, "u").unwrap_err().to_string().contains("unknown field `network`"));
        let relative = "description: x\nread: [etc]\nlimits: {cpu_seconds: 1, address_space_mb: 1, processes: 1, file_size_mb: 1}\nexamples: {allow: [], deny: []}\n";
        assert!(Profile::parse(relative, "r").unwrap_err().to_string().contains("not an absolute path"));
    }

    #[test]
    fn shipped_profiles_load() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sandbox-profiles");
        for name in ["code-exec", "skills-run", "mcp"] {
            Profile::load(&dir, name).unwrap();
        }
    }
}
