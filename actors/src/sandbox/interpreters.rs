//! Which program runs a script, by its extension, and what the shell's
//! `python` is: found once at start-up on the folders a sandboxed command
//! can execute from, replaceable by the operator (`--interpreter EXT=PATH`,
//! or `EXT=` to remove one).
//!
//! `.py` runs on the newest `python3.N` those folders hold (else `python3`),
//! the same one the shell's `python` and `python3` name, so a package the
//! host installed for one is found by the other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Folders searched for interpreters, in order: those of the PATH a
/// command gets that the sandbox lets it execute from.
pub const SEARCH_PATH: [&str; 3] = ["/usr/local/bin", "/usr/bin", "/bin"];

/// The Python commands run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Python {
    pub path: PathBuf,
    /// `major.minor`, e.g. `3.11`: names the workspace's package folder.
    pub version: String,
}

/// The interpreter table and what the host has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interpreters {
    /// Extension (lowercase, no dot) to program.
    table: BTreeMap<String, PathBuf>,
    python: Option<Python>,
    node: Option<PathBuf>,
    /// "Python 3.11.2", "node v20.20.2", "bash 5.2.15": for the "On this
    /// host:" line, read from each program's `--version` at start-up.
    versions: Vec<String>,
}

/// The newest `python3.N` in `dirs` (numerically: 3.12 after 3.9), else the
/// first `python3`.
pub fn newest_python(dirs: &[&Path]) -> Option<Python> {
    let mut best: Option<(u32, PathBuf)> = None;
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(minor) = name.to_str().and_then(|n| n.strip_prefix("python3.")).and_then(|m| m.parse().ok())
            else {
                continue;
            };
            if executable(&entry.path()) && best.as_ref().is_none_or(|(b, _)| minor > *b) {
                best = Some((minor, entry.path()));
            }
        }
    }
    if let Some((minor, path)) = best {
        return Some(Python { path, version: format!("3.{minor}") });
    }
    let path = dirs.iter().map(|dir| dir.join("python3")).find(|p| executable(p))?;
    let version = version_of(&path, "python3")
        .and_then(|v| v.strip_prefix("Python ").map(|v| v.split('.').take(2).collect::<Vec<_>>().join(".")))
        .unwrap_or_else(|| "3".into());
    Some(Python { path, version })
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn first_in(dirs: &[&Path], name: &str) -> Option<PathBuf> {
    dirs.iter().map(|dir| dir.join(name)).find(|p| executable(p))
}

/// The first line of `program --version`, e.g. "Python 3.11.2". Runs a
/// program the operator installed, at start-up, never one a command made.
fn version_of(program: &Path, label: &str) -> Option<String> {
    let out = std::process::Command::new(program).arg("--version").stdin(std::process::Stdio::null()).output().ok()?;
    let text = if out.stdout.is_empty() { out.stderr } else { out.stdout };
    let line = String::from_utf8_lossy(&text).lines().next()?.trim().to_string();
    match label {
        // "GNU bash, version 5.2.15(1)-release (x86_64-pc-linux-gnu)"
        "bash" => line.split("version ").nth(1).map(|v| format!("bash {}", v.split('(').next().unwrap_or(v))),
        "node" => Some(format!("node {line}")),
        _ => Some(line),
    }
}

/// Why an `--interpreter` entry is refused: the server does not start
/// with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterpreterError {
    #[error("--interpreter '{entry}': expected EXT=PATH, or EXT= to remove one")]
    Malformed { entry: String },
    #[error("--interpreter '{entry}': '{ext}' is not a file extension")]
    NotAnExtension { entry: String, ext: String },
    #[error("--interpreter '{entry}': {} is not an executable file", program.display())]
    NotExecutable { entry: String, program: PathBuf },
}

impl Interpreters {
    /// What the host has in [`SEARCH_PATH`].
    pub fn detect() -> Interpreters {
        let dirs: Vec<&Path> = SEARCH_PATH.iter().map(Path::new).collect();
        Interpreters::detect_in(&dirs, true)
    }

    /// What `dirs` hold; `probe` reads each interpreter's version.
    pub fn detect_in(dirs: &[&Path], probe: bool) -> Interpreters {
        let python = newest_python(dirs);
        let node = first_in(dirs, "node");
        let bash = first_in(dirs, "bash");
        let mut table = BTreeMap::new();
        if let Some(python) = &python {
            table.insert("py".to_string(), python.path.clone());
        }
        for ext in ["js", "mjs", "cjs"] {
            if let Some(node) = &node {
                table.insert(ext.to_string(), node.clone());
            }
        }
        for ext in ["sh", "bash"] {
            if let Some(bash) = &bash {
                table.insert(ext.to_string(), bash.clone());
            }
        }
        let mut versions = Vec::new();
        if probe {
            for (program, label) in
                [(python.as_ref().map(|p| &p.path), "python"), (node.as_ref(), "node"), (bash.as_ref(), "bash")]
            {
                if let Some(version) = program.and_then(|p| version_of(p, label)) {
                    versions.push(version);
                }
            }
        }
        Interpreters { table, python, node, versions }
    }

    /// Applies the operator's `EXT=PATH` (replace or add) and `EXT=`
    /// (remove) entries. A replacement must be an absolute path to an
    /// executable file, checked now rather than on the first script.
    pub fn with_overrides(mut self, entries: &[String]) -> Result<Interpreters, InterpreterError> {
        for entry in entries {
            let (ext, program) =
                entry.split_once('=').ok_or_else(|| InterpreterError::Malformed { entry: entry.clone() })?;
            let ext = ext.trim().trim_start_matches('.').to_ascii_lowercase();
            if ext.is_empty() || !ext.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(InterpreterError::NotAnExtension { entry: entry.clone(), ext });
            }
            if program.is_empty() {
                self.table.remove(&ext);
                continue;
            }
            let program = PathBuf::from(program);
            if !program.is_absolute() || !executable(&program) {
                return Err(InterpreterError::NotExecutable { entry: entry.clone(), program });
            }
            if ext == "py" {
                let minor = program.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("python3."));
                let version =
                    minor.map(|m| format!("3.{m}")).or_else(|| self.python.as_ref().map(|p| p.version.clone()));
                self.python = Some(Python { path: program.clone(), version: version.unwrap_or_else(|| "3".into()) });
            }
            self.table.insert(ext, program);
        }
        Ok(self)
    }

    /// The program for `script`, by its extension; never its first line.
    pub fn for_script(&self, script: &str) -> Option<&Path> {
        let ext = script.rsplit_once('.')?.1.to_ascii_lowercase();
        self.table.get(&ext).map(PathBuf::as_path)
    }

    /// The Python the shell's `python` and `python3` name, and `.py` runs on.
    pub fn python(&self) -> Option<&Python> {
        self.python.as_ref()
    }

    pub fn node(&self) -> Option<&Path> {
        self.node.as_deref()
    }

    /// "py (python3.11), js, mjs and cjs (node), …": what `skills_run`
    /// says it can run.
    pub fn describe(&self) -> String {
        let mut by_program: BTreeMap<&Path, Vec<String>> = BTreeMap::new();
        for (ext, program) in &self.table {
            by_program.entry(program).or_default().push(format!(".{ext}"));
        }
        let parts: Vec<String> = by_program
            .into_iter()
            .map(|(program, exts)| {
                let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                format!("{} ({name})", exts.join(", "))
            })
            .collect();
        if parts.is_empty() {
            "nothing (no interpreter is configured)".into()
        } else {
            parts.join("; ")
        }
    }

    /// "On this host: Python 3.11.2, node v20.20.2, bash 5.2.15." for the
    /// shell's declaration, so the model writes for what is there.
    pub fn host_line(&self) -> Option<String> {
        (!self.versions.is_empty()).then(|| format!("On this host: {}.", self.versions.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn the_newest_python_is_chosen_by_number_not_by_name() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        program(a.path(), "python3");
        program(a.path(), "python3.9");
        program(b.path(), "python3.12");
        program(b.path(), "python3.11-config");
        std::fs::write(b.path().join("python3.13"), "not executable").unwrap();
        let found = newest_python(&[a.path(), b.path()]).unwrap();
        assert_eq!(found, Python { path: b.path().join("python3.12"), version: "3.12".into() });
        let only = tempfile::tempdir().unwrap();
        assert_eq!(newest_python(&[only.path()]), None);
    }

    #[test]
    fn the_table_goes_by_extension_and_takes_the_operators_entries() {
        let dir = tempfile::tempdir().unwrap();
        let python = program(dir.path(), "python3.11");
        let node = program(dir.path(), "node");
        program(dir.path(), "bash");
        let found = Interpreters::detect_in(&[dir.path()], false);
        assert_eq!(found.for_script("scripts/a.py"), Some(python.as_path()));
        assert_eq!(found.for_script("x.MJS"), Some(node.as_path()));
        assert_eq!(found.for_script("run.bash"), Some(dir.path().join("bash").as_path()));
        assert_eq!(found.for_script("Makefile"), None);
        assert_eq!(found.for_script("tool.rb"), None);
        assert_eq!(found.python().unwrap().version, "3.11");

        let ruby = program(dir.path(), "ruby");
        let changed =
            found.clone().with_overrides(&["rb=".to_string() + ruby.to_str().unwrap(), ".js=".into()]).unwrap();
        assert_eq!(changed.for_script("tool.rb"), Some(ruby.as_path()));
        assert_eq!(changed.for_script("a.js"), None, "removed");
        assert_eq!(changed.for_script("a.mjs"), Some(node.as_path()), "only the named extension");
        let other = program(dir.path(), "python3.12");
        let python12 = found.clone().with_overrides(&[format!("py={}", other.display())]).unwrap();
        assert_eq!(python12.python().unwrap().version, "3.12", "the shell's python follows the table");

        let entry = |e: &str| e.to_string();
        for (given, expected, message) in [
            (
                "py",
                InterpreterError::Malformed { entry: entry("py") },
                "--interpreter 'py': expected EXT=PATH, or EXT= to remove one",
            ),
            (
                "=/bin/sh",
                InterpreterError::NotAnExtension { entry: entry("=/bin/sh"), ext: String::new() },
                "--interpreter '=/bin/sh': '' is not a file extension",
            ),
            (
                "py=python3",
                InterpreterError::NotExecutable { entry: entry("py=python3"), program: "python3".into() },
                "--interpreter 'py=python3': python3 is not an executable file",
            ),
            (
                "py=/nonexistent/python3",
                InterpreterError::NotExecutable {
                    entry: entry("py=/nonexistent/python3"),
                    program: "/nonexistent/python3".into(),
                },
                "--interpreter 'py=/nonexistent/python3': /nonexistent/python3 is not an executable file",
            ),
        ] {
            let err = found.clone().with_overrides(&[given.to_string()]).unwrap_err();
            assert_eq!(err, expected);
            assert_eq!(err.to_string(), message);
        }
    }
}
