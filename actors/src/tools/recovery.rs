//! What a failed run's output says about the model's own code, read so the
//! next round starts from the facts instead of a guess:
//!
//! - where it failed: the last traceback frame, compiler error or shell
//!   error that names a file inside the workspace, so the result can show
//!   that file's lines around the failing one and ask for the smallest
//!   exact edit;
//! - which name it guessed wrong: `AttributeError: module 'x' has no
//!   attribute 'y'` or `ImportError: cannot import name 'y' from 'x'`, so a
//!   probe can read the module's real public names and offer the closest.
//!
//! The output is the command's, so it is untrusted text: it is only
//! searched, paths found in it are checked to lie inside the workspace and
//! then opened through its handle, and everything quoted back is bounded.

use std::path::Path;

/// Lines shown before and after the failing one.
pub const SNIPPET_CONTEXT_LINES: usize = 4;
/// Longest line of a snippet, in characters; the rest is cut.
pub const SNIPPET_LINE_CHARS: usize = 200;
/// Largest file a snippet is read from.
pub const SNIPPET_FILE_MAX_BYTES: u64 = 1024 * 1024;
/// Names a probe result lists at most, and "did you mean" candidates.
pub const PROBE_MAX_NAMES: usize = 60;
pub const PROBE_CANDIDATES: usize = 3;

/// A file and line a failure points at, relative to the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub path: String,
    pub line: usize,
}

/// `path` relative to the workspace, when it names something inside it:
/// absolute under `root`, or relative to `cwd` (itself inside `root`).
/// `..` may not climb out.
pub fn inside(path: &str, root: &Path, cwd: &Path) -> Option<String> {
    // `<string>`, `<stdin>`: code that came from no file.
    if path.trim().starts_with('<') {
        return None;
    }
    let path = Path::new(path.trim());
    let joined = if path.is_absolute() { path.to_path_buf() } else { cwd.join(path) };
    let relative = joined.strip_prefix(root).ok()?;
    let mut parts: Vec<String> = Vec::new();
    for part in relative.components() {
        match part {
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            std::path::Component::ParentDir => {
                parts.pop()?;
            }
            std::path::Component::CurDir => {}
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// The innermost place in the workspace the output blames: the last
/// Python frame (`File "x.py", line 3`), a Node or compiler location
/// (`x.js:3`, `x.c:3:5: error`), or a shell script's (`x.sh: line 3:`).
pub fn failing_location(output: &str, root: &Path, cwd: &Path) -> Option<Location> {
    let mut found = None;
    for line in output.lines() {
        let trimmed = line.trim_start();
        // Python: File "path", line N, in f
        if let Some(rest) = trimmed.strip_prefix("File \"") {
            if let Some((path, after)) = rest.split_once('"') {
                let number = after.trim_start_matches(", line ").split(|c: char| !c.is_ascii_digit()).next();
                if let (Some(path), Some(Ok(line))) = (inside(path, root, cwd), number.map(str::parse)) {
                    found = Some(Location { path, line });
                }
            }
            continue;
        }
        // bash: path: line N: message
        if let Some((path, after)) = trimmed.split_once(": line ") {
            let number = after.split(':').next().unwrap_or_default();
            // `bash: line 1:` is the shell's own command line, not a file.
            let script = path.contains('.');
            if let (true, Some(path), Ok(line)) = (script, inside(path, root, cwd), number.parse()) {
                found = found.or(Some(Location { path, line }));
            }
            continue;
        }
        // Node stack frames `at f (path:N:C)` and compilers `path:N:C: error`.
        let candidate = trimmed.rsplit_once('(').map_or(trimmed, |(_, inner)| inner.trim_end_matches(')'));
        let candidate = candidate.strip_prefix("at ").unwrap_or(candidate);
        let mut parts = candidate.splitn(3, ':');
        if let (Some(path), Some(number)) = (parts.next(), parts.next()) {
            let looks_like_file = path.contains('.') && !path.contains(' ') && !path.starts_with("node");
            if let (true, Some(path), Ok(line)) = (looks_like_file, inside(path, root, cwd), number.trim().parse()) {
                // The first such line is where Node and compilers report it.
                found = found.or(Some(Location { path, line }));
            }
        }
    }
    found
}

/// The numbered lines of `text` around `line` (1-based), the failing one
/// marked; `None` when the file has no such line.
pub fn snippet(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    if line == 0 || line > lines.len() {
        return None;
    }
    let first = line.saturating_sub(SNIPPET_CONTEXT_LINES).max(1);
    let last = (line + SNIPPET_CONTEXT_LINES).min(lines.len());
    let width = last.to_string().len();
    let mut out = String::new();
    for number in first..=last {
        let text = lines[number - 1];
        let shown: String = text.chars().take(SNIPPET_LINE_CHARS).collect();
        let cut = if shown.len() < text.len() { " …" } else { "" };
        let mark = if number == line { ">" } else { " " };
        out.push_str(&format!("{mark}{number:>width$} | {shown}{cut}\n"));
    }
    Some(out)
}

/// A name the code asked a module for that it does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongName {
    pub module: String,
    pub name: String,
}

/// `AttributeError: module 'x' has no attribute 'y'` and `ImportError:
/// cannot import name 'y' from 'x' (…)`, the last one in the output.
pub fn wrong_name(output: &str) -> Option<WrongName> {
    let quoted = |text: &str| -> Option<(String, usize)> {
        let start = text.find('\'')? + 1;
        let end = text[start..].find('\'')? + start;
        Some((text[start..end].to_string(), end + 1))
    };
    let valid = |name: &str| {
        !name.is_empty() && name.split('.').all(|p| p.chars().all(|c| c.is_alphanumeric() || c == '_') && !p.is_empty())
    };
    for line in output.lines().rev() {
        if let Some(rest) = line.split("AttributeError: module ").nth(1) {
            let (module, at) = quoted(rest)?;
            let (name, _) = quoted(rest[at..].strip_prefix(" has no attribute ")?)?;
            return (valid(&module) && valid(&name)).then_some(WrongName { module, name });
        }
        if let Some(rest) = line.split("ImportError: cannot import name ").nth(1) {
            let (name, at) = quoted(rest)?;
            let (module, _) = quoted(rest[at..].strip_prefix(" from ")?)?;
            return (valid(&module) && valid(&name)).then_some(WrongName { module, name });
        }
    }
    None
}

/// The probe's program: import the module, print its public names, one a
/// line. The module's name goes in as an argument, never into the code.
pub const PROBE_SCRIPT: &str = "import importlib, sys\nm = importlib.import_module(sys.argv[1])\nfor n in sorted(set(dir(m))):\n    if not n.startswith('_'):\n        print(n)\n";

/// The note for a wrong name, from the probe's list of the module's names.
pub fn did_you_mean(wrong: &WrongName, names: &[String]) -> String {
    let mut scored: Vec<(f64, &String)> = names
        .iter()
        .map(|n| (strsim::jaro_winkler(&wrong.name.to_lowercase(), &n.to_lowercase()), n))
        .filter(|(score, n)| *score >= 0.8 || n.to_lowercase().contains(&wrong.name.to_lowercase()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let candidates: Vec<&str> = scored.iter().take(PROBE_CANDIDATES).map(|(_, n)| n.as_str()).collect();
    let listed: Vec<&str> = names.iter().take(PROBE_MAX_NAMES).map(String::as_str).collect();
    let more = if names.len() > PROBE_MAX_NAMES {
        format!(" and {} more", names.len() - PROBE_MAX_NAMES)
    } else {
        String::new()
    };
    let guess = match candidates.as_slice() {
        [] => String::new(),
        some => format!(" Did you mean: {}?", some.join(", ")),
    };
    format!(
        "[{} has no {}.{guess} Its public names, read from the installed module: {}{more}]",
        wrong.module,
        wrong.name,
        listed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/w/ws-1";

    fn at(output: &str) -> Option<Location> {
        failing_location(output, Path::new(ROOT), &Path::new(ROOT).join("src"))
    }

    #[test]
    fn the_innermost_frame_inside_the_workspace_is_blamed() {
        let python = "Traceback (most recent call last):\n  File \"/w/ws-1/src/main.py\", line 9, in <module>\n    run()\n  File \"/w/ws-1/src/lib/calc.py\", line 3, in run\n    return a - b\n  File \"/usr/lib/python3.11/json/__init__.py\", line 2, in loads\nTypeError: x\n";
        assert_eq!(at(python), Some(Location { path: "src/lib/calc.py".into(), line: 3 }));
        let relative = "  File \"helper.py\", line 12, in f\n";
        assert_eq!(at(relative), Some(Location { path: "src/helper.py".into(), line: 12 }));
        let node = "/w/ws-1/src/app.js:7\n  foo(;\n     ^\nSyntaxError: Unexpected token ';'\n    at wrapSafe (node:internal/modules/cjs/loader:1378:20)\n";
        assert_eq!(at(node), Some(Location { path: "src/app.js".into(), line: 7 }));
        let stack = "TypeError: x is not a function\n    at run (/w/ws-1/src/lib.js:4:11)\n    at Object.<anonymous> (/w/ws-1/src/app.js:2:1)\n";
        assert_eq!(at(stack), Some(Location { path: "src/lib.js".into(), line: 4 }));
        let gcc = "main.c:5:3: error: expected ';' before '}' token\n";
        assert_eq!(at(gcc), Some(Location { path: "src/main.c".into(), line: 5 }));
        assert_eq!(at("bash: line 1: foo: command not found\n"), None, "the command line is not a file");
        let bash = "run.sh: line 2: fi: command not found\n";
        assert_eq!(at(bash), Some(Location { path: "src/run.sh".into(), line: 2 }));
    }

    #[test]
    fn nothing_outside_the_workspace_is_blamed() {
        for output in [
            "  File \"/etc/passwd\", line 1\n",
            "  File \"../../../etc/passwd\", line 1\n",
            "  File \"/usr/lib/python3.11/x.py\", line 1\n",
            "  File \"<string>\", line 1\n",
            "node:internal/modules/cjs/loader:1228\n",
            "Error: 12:30 is late\n",
        ] {
            assert_eq!(at(output), None, "{output}");
        }
    }

    #[test]
    fn a_snippet_is_numbered_bounded_and_marks_the_line() {
        let text: String = (1..=20).map(|n| format!("line {n}\n")).collect();
        let shown = snippet(&text, 10).unwrap();
        assert!(
            shown.starts_with("  6 | line 6\n")
                && shown.contains(">10 | line 10\n")
                && shown.ends_with(" 14 | line 14\n"),
            "{shown}"
        );
        assert_eq!(snippet(&text, 1).unwrap().lines().count(), 1 + SNIPPET_CONTEXT_LINES);
        assert_eq!(snippet(&text, 21), None);
        assert_eq!(snippet(&text, 0), None);
        let long = format!("{}\n", "x".repeat(SNIPPET_LINE_CHARS + 1));
        assert!(snippet(&long, 1).unwrap().ends_with(" …\n"));
        let exact = format!("{}\n", "x".repeat(SNIPPET_LINE_CHARS));
        assert!(!snippet(&exact, 1).unwrap().contains('…'));
    }

    #[test]
    fn wrong_names_are_read_and_answered_with_the_closest_real_ones() {
        let attribute = "Traceback …\nAttributeError: module 'yaml' has no attribute 'safe_lod'\n";
        let wrong = wrong_name(attribute).unwrap();
        assert_eq!(wrong, WrongName { module: "yaml".into(), name: "safe_lod".into() });
        let import = "ImportError: cannot import name 'notes_slid' from 'pptx.slide' (/w/.local/lib/python3.11/site-packages/pptx/slide.py)";
        assert_eq!(wrong_name(import).unwrap(), WrongName { module: "pptx.slide".into(), name: "notes_slid".into() });
        assert_eq!(wrong_name("AttributeError: 'Foo' object has no attribute 'x'"), None);
        assert_eq!(wrong_name("AttributeError: module 'a; rm' has no attribute 'b'"), None);
        let names: Vec<String> = ["dump", "load", "safe_dump", "safe_load", "safe_load_all"].map(String::from).into();
        let note = did_you_mean(&wrong, &names);
        assert!(note.starts_with("[yaml has no safe_lod. Did you mean: safe_load, safe_load_all"), "{note}");
        assert!(
            note.ends_with("names, read from the installed module: dump, load, safe_dump, safe_load, safe_load_all]"),
            "{note}"
        );
        let many: Vec<String> = (0..PROBE_MAX_NAMES + 1).map(|n| format!("n{n}")).collect();
        assert!(did_you_mean(&wrong, &many).ends_with(" and 1 more]"));
        let exact: Vec<String> = (0..PROBE_MAX_NAMES).map(|n| format!("n{n}")).collect();
        assert!(!did_you_mean(&wrong, &exact).contains("more]"));
    }
}
