//! A quick parse of a file the model just wrote: JSON in the server (it is
//! only data), Python, shell and JavaScript through the sandbox helper, with
//! the same limits as any command and a deadline. Nothing the model wrote
//! runs outside the sandbox, not even a parser pointed at it: Python reads
//! `.pth` files and a planted `ast.py` before it parses anything.

use std::path::Path;
use std::time::Duration;

use super::{CodeContext, FILE_TOOL_MAX_BYTES};
use crate::sandbox::actor::{self, Job, Purpose};

/// How long one syntax check may run.
pub const SYNTAX_CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// The parser for a file type we know: (program, arguments before the path).
fn parser(path: &str) -> Option<(&'static str, &'static [&'static str])> {
    let extension = path.rsplit_once('.')?.1.to_ascii_lowercase();
    match extension.as_str() {
        // -I: isolated mode, so the working folder is not on sys.path and
        // no environment variable or user site reaches the parser.
        "py" => Some((
            "/usr/bin/python3",
            &["-I", "-c", "import ast,sys; ast.parse(open(sys.argv[1], encoding='utf-8').read(), sys.argv[1])"],
        )),
        "sh" | "bash" => Some(("/bin/bash", &["-n"])),
        "js" | "mjs" | "cjs" => Some(("/usr/bin/node", &["--check"])),
        _ => None,
    }
}

/// The check's verdict ("ok" or "FAILED: …") for a file type we know;
/// `None` for other files, or where the check cannot run here.
pub async fn check(context: &CodeContext<'_>, path: &str) -> Option<String> {
    let is_json = path.rsplit_once('.').is_some_and(|(_, ext)| ext.eq_ignore_ascii_case("json"));
    let verdict = if is_json {
        let target = path.to_string();
        let parsed = context
            .workspace
            .with_handle(move |dir| {
                let bytes = dir.read(&target, FILE_TOOL_MAX_BYTES).ok()?;
                Some(serde_json::from_slice::<serde_json::Value>(&bytes).map(|_| ()).map_err(|e| e.to_string()))
            })
            .await
            .flatten()?;
        parsed
    } else {
        let (program, arguments) = parser(path)?;
        // Python parses with the Python that will run the file.
        let python = context.settings.as_deref().and_then(|s| s.interpreters.python()).map(|p| p.path.clone());
        let program = match python {
            Some(python) if program.ends_with("python3") => python.display().to_string(),
            _ => program.to_string(),
        };
        if !Path::new(&program).exists() {
            return None;
        }
        let sandbox = context.sandbox?;
        let mut command: Vec<String> =
            std::iter::once(program.as_str()).chain(arguments.iter().copied()).map(String::from).collect();
        command.push(path.to_string());
        let job = Job {
            purpose: Purpose::SyntaxCheck,
            workspace: context.workspace.path().to_path_buf(),
            owner: context.workspace.owner(),
            skill: None,
            command,
            env: Vec::new(),
            start_in: None,
            proxy: None,
            timeout: SYNTAX_CHECK_TIMEOUT,
        };
        let finished = actor::run(sandbox, job).await.ok()?;
        match (finished.ran.exit_code, finished.ran.timed_out) {
            (Some(0), _) => Ok(()),
            (_, true) => Err(format!("the check did not finish in {} s", SYNTAX_CHECK_TIMEOUT.as_secs())),
            _ => {
                let stderr = &finished.ran.stderr;
                let last: Vec<&str> = stderr.lines().rev().take(3).collect();
                Err(last.into_iter().rev().collect::<Vec<_>>().join("\n"))
            }
        }
    };
    Some(match verdict {
        Ok(()) => "ok".to_string(),
        Err(message) => format!("FAILED: {}", message.trim()),
    })
}
