//! A quick parse of a file the model just changed: Python, JSON, shell and
//! JavaScript, where an interpreter for them is installed. Only parsing:
//! nothing the model wrote is executed here.

use std::path::Path;
use std::process::{Command, Stdio};

/// The check's verdict for a file type we know, `None` otherwise.
pub fn check(path: &Path) -> Option<String> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    let verdict = match extension.as_str() {
        "json" => {
            let text = std::fs::read_to_string(path).ok()?;
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(_) => Ok(()),
                Err(err) => Err(err.to_string()),
            }
        }
        "py" => run(
            "/usr/bin/python3",
            &["-c", "import ast,sys; ast.parse(open(sys.argv[1], encoding='utf-8').read(), sys.argv[1])"],
            path,
        )?,
        "sh" | "bash" => run("/bin/bash", &["-n"], path)?,
        "js" | "mjs" | "cjs" => run("/usr/bin/node", &["--check"], path)?,
        _ => return None,
    };
    Some(match verdict {
        Ok(()) => "ok".to_string(),
        Err(message) => format!("FAILED: {}", message.trim()),
    })
}

/// Runs a parser on the file; `None` when the parser is not installed.
fn run(program: &str, args: &[&str], path: &Path) -> Option<Result<(), String>> {
    if !Path::new(program).exists() {
        return None;
    }
    let output = Command::new(program).args(args).arg(path).env_clear().stdin(Stdio::null()).output().ok()?;
    if output.status.success() {
        return Some(Ok(()));
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    Some(Err(last))
}
