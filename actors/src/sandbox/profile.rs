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
    pub fn parse(text: &str, name: &str) -> Result<Profile, String> {
        let profile: Profile =
            serde_yaml::from_str(text).map_err(|err| format!("the sandbox profile '{name}' is not valid: {err}"))?;
        for path in profile.read.iter().chain(&profile.execute) {
            if !path.is_absolute() {
                return Err(format!(
                    "the sandbox profile '{name}' lists '{}', which is not an absolute path",
                    path.display()
                ));
            }
        }
        for path in &profile.examples.allow {
            if !profile.allows(path) {
                return Err(format!("the sandbox profile '{name}' must allow '{}' but does not", path.display()));
            }
        }
        for path in &profile.examples.deny {
            if profile.allows(path) {
                return Err(format!("the sandbox profile '{name}' must deny '{}' but allows it", path.display()));
            }
        }
        Ok(profile)
    }

    /// Loads `<dir>/<name>.yaml`.
    pub fn load(dir: &Path, name: &str) -> Result<Profile, String> {
        let path = dir.join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&path)
            .map_err(|err| format!("cannot read the sandbox profile {}: {err}", path.display()))?;
        Profile::parse(&text, name)
    }
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
            Profile::parse(&widened, "w").unwrap_err(),
            "the sandbox profile 'w' must deny '/etc/hosts' but allows it"
        );
        let narrowed = format!("{BASE}examples: {{allow: [/bin/sh], deny: []}}\n");
        assert_eq!(
            Profile::parse(&narrowed, "n").unwrap_err(),
            "the sandbox profile 'n' must allow '/bin/sh' but does not"
        );
        let unknown = format!("{BASE}network: true\nexamples: {{allow: [], deny: []}}\n");
        assert!(Profile::parse(&unknown, "u").unwrap_err().contains("unknown field `network`"));
        let relative = "description: x\nread: [etc]\nlimits: {cpu_seconds: 1, address_space_mb: 1, processes: 1, file_size_mb: 1}\nexamples: {allow: [], deny: []}\n";
        assert!(Profile::parse(relative, "r").unwrap_err().contains("not an absolute path"));
    }

    #[test]
    fn shipped_profiles_load() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sandbox-profiles");
        for name in ["code-exec", "skills-run"] {
            Profile::load(&dir, name).unwrap();
        }
    }
}
