//! The layers of each crate, checked from the source as rust-analyzer's
//! tidy tests check theirs: no two top-level modules of a crate (the files
//! and folders directly under its `src/`) import each other, directly or
//! through others, and the rules below name the edges that would bring a
//! circle back. A failure names the modules and the files that import.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Imports that must never appear: (crate folder, importing module,
/// imported module, why).
const FORBIDDEN: &[(&str, &str, &str, &str)] = &[
    ("actors", "sandbox", "chat_loop", "the sandbox runs commands for any caller, not for the loop"),
    ("actors", "skills", "chat_loop", "the registry knows nothing of requests"),
    ("actors", "workspace", "chat_loop", "a folder knows nothing of requests"),
    ("actors", "workspace", "tools", "the tools work in folders, not the other way round"),
    ("actors", "tools", "chat_loop", "the router reaches the loop only through the AgentDesk it is given"),
    ("actors", "model", "chat_loop", "the loop uses the model, not the other way round"),
    ("actors", "request", "chat_loop", "the request's types are what the loop reports, below it"),
    ("actors", "store", "chat_loop", "state is written by its owners; the store knows nothing of turns"),
    ("actors", "store", "conversations", "the store keeps records; who holds a conversation is decided above it"),
    ("actors", "store", "tools", "the store keeps records, never runs anything"),
    ("engine", "remote", "executor", "an upstream fleet shares the protocol, never the engine thread's internals"),
    ("engine", "protocol", "engine", "the protocol is what the handle and the thread both speak"),
    ("engine", "schedule", "executor", "the scheduler decides from slot views alone, never from the thread's state"),
    (".", "http", "setup", "setup wires the HTTP layer; routes never start servers"),
];

/// The crates whose `src/` is checked, relative to the repository root.
const CRATES: [&str; 4] = ["actors", "engine", "sandbox", "."];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules of a crate and the files of each.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if name == "lib" || name == "main" {
            continue;
        }
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        } else {
            continue;
        }
        modules.insert(name, files);
    }
    modules
}

/// Files that are test modules of their own (declared `#[cfg(test)] mod
/// name;`): like unit tests, they may use anything (the route tests' server
/// builder is wired by `setup`, above the HTTP layer it tests).
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut test_only = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let stem = file.file_stem().unwrap().to_string_lossy().to_string();
        // `mod.rs`, `lib.rs` and `main.rs` declare siblings; `foo.rs` declares
        // what lies in `foo/`.
        let dir = match stem.as_str() {
            "mod" | "lib" | "main" => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        let mut rest = text.as_str();
        while let Some(at) = rest.find("#[cfg(test)]") {
            rest = &rest[at + "#[cfg(test)]".len()..];
            let line = rest.trim_start().lines().next().unwrap_or_default();
            let line = line.trim_start_matches("pub(crate) ").trim_start_matches("pub(super) ");
            if let Some(name) = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';')) {
                test_only.insert(dir.join(format!("{name}.rs")));
            }
        }
    }
    test_only
}

/// The code of a file without its unit tests (a test module may use
/// anything) and without comments.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The top-level modules `code` names through `crate::`, also inside
/// `crate::{a, b::c}` groups. `super::` from a top-level file or a folder's
/// `mod.rs` also names the crate root.
fn imports(code: &str, top_level_file: bool) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut prefixes = vec!["crate::"];
    if top_level_file {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            // `skillhost_crate::` or `my_super::` are other names.
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() {
                        found.insert(name);
                    }
                }
            } else {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
    }
    found
}

/// module -> (imported module -> files that import it)
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn graph(krate: &str) -> Graph {
    let src = root().join(krate).join("src");
    let modules = modules(&src);
    let mut every_file = Vec::new();
    rust_files(&src, &mut every_file);
    let test_only = test_only_files(&every_file);
    let mut graph = Graph::new();
    for (name, files) in &modules {
        let edges = graph.entry(name.clone()).or_default();
        for file in files.iter().filter(|file| !test_only.contains(*file)) {
            let text = std::fs::read_to_string(file).unwrap();
            let parent = file.parent().unwrap();
            let top_level_file =
                parent == src || (file.file_name().unwrap() == "mod.rs" && parent.parent() == Some(&src));
            for imported in imports(&code(&text), top_level_file) {
                if &imported != name && modules.contains_key(&imported) {
                    let shown = file.strip_prefix(root()).unwrap().display().to_string();
                    edges.entry(imported).or_default().insert(shown);
                }
            }
        }
    }
    graph
}

/// A path from `from` back to itself, if there is one.
fn circle(graph: &Graph, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in graph.get(&at).map(|e| e.keys()).into_iter().flatten() {
            if next == from {
                let mut path = path.clone();
                path.push(next.clone());
                return Some(path);
            }
            if seen.insert(next.clone()) {
                let mut path = path.clone();
                path.push(next.clone());
                stack.push((next.clone(), path));
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_circle_between_its_top_level_modules() {
    let mut circles = Vec::new();
    for krate in CRATES {
        let graph = graph(krate);
        for module in graph.keys() {
            if let Some(path) = circle(&graph, module) {
                let steps: Vec<String> = path
                    .windows(2)
                    .map(|pair| format!("{} -> {} ({:?})", pair[0], pair[1], graph[&pair[0]][&pair[1]]))
                    .collect();
                circles.push(format!("{krate}: {}", steps.join(", ")));
            }
        }
    }
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn no_lower_module_imports_a_higher_one() {
    let mut broken = Vec::new();
    for (krate, from, to, why) in FORBIDDEN {
        let graph = graph(krate);
        assert!(graph.contains_key(*from) && graph.contains_key(*to), "{krate} has no module {from} or {to}");
        if let Some(files) = graph[*from].get(*to) {
            broken.push(format!("{krate}: {from} imports {to} in {files:?}: {why}"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_reader_sees_grouped_and_relative_imports() {
    let code = "use crate::{a, b::c};\nuse crate::d::e;\nlet x = super::f::g;\nskillhost_crate::h;";
    let found: Vec<String> = imports(code, true).into_iter().collect();
    assert_eq!(found, ["a", "b", "d", "f"]);
    assert_eq!(imports("super::f::g", false).len(), 0);
}

/// The sandbox helper starts for every command: its crate depends on no
/// crate of the server's and on no async runtime.
#[test]
fn the_helper_crate_depends_on_nothing_of_the_servers() {
    let manifest = std::fs::read_to_string(root().join("sandbox/Cargo.toml")).unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    for heavy in ["skillhost-engine", "skillhost-actors", "llama-cpp", "tokio", "actix"] {
        assert!(!dependencies.contains(heavy), "sandbox/Cargo.toml depends on {heavy}");
    }
}

/// The test hooks (the scripted model, the engine panic) are compiled into
/// every build so `cargo test` and `make build` make one binary; what keeps
/// them out of reach is that no code of the server outside its tests names
/// them. A route, flag or config field that did would fail here.
#[test]
fn only_tests_reach_the_test_hooks() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let test_only = test_only_files(&files);
    let mut reached = Vec::new();
    for file in files.iter().filter(|file| !test_only.contains(*file)) {
        let code = code(&std::fs::read_to_string(file).unwrap());
        for hook in ["scripted::", "inject_engine_panic", "inject_panic", "InjectEnginePanic"] {
            if code.contains(hook) {
                reached.push(format!("{} names {hook}", file.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert_eq!(reached, Vec::<String>::new());
}
