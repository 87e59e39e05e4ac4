//! What a failed command's output says about the sandbox rather than the
//! code: a write outside the folder refused, the network kept off, a full
//! folder, a limit on processes or memory. Named in one sentence, such a
//! failure stops the model from "fixing" code that is correct.
//!
//! The output is the command's, so it is untrusted text: it is only
//! searched, and what is quoted back (a path) is bounded.

use std::path::Path;

/// Longest path quoted back from a command's output.
const MAX_QUOTED_PATH: usize = 120;

/// What a network call prints when there is no network at all.
const OFFLINE_SIGNS: [&str; 12] = [
    "Temporary failure in name resolution",
    "Name or service not known",
    "Could not resolve host",
    "Network is unreachable",
    "getaddrinfo failed",
    "nodename nor servname provided",
    "Failed to establish a new connection",
    "ENOTFOUND",
    "EAI_AGAIN",
    "ENETUNREACH",
    "ECONNREFUSED",
    "Connection refused",
];

/// What a refused file access prints.
const DENIED_SIGNS: [&str; 5] =
    ["Permission denied", "Operation not permitted", "Read-only file system", "EACCES", "EPERM"];

/// The sentence that names the environment's part in a failed command, if
/// its output shows one. `network`: commands may use the network here;
/// `root`: the working folder as commands see it.
pub fn environment_note(output: &str, network: bool, root: &Path) -> Option<String> {
    if output.contains("No space left on device") || output.contains("Disk quota exceeded") {
        return Some(
            "The working folder is full (it has a size cap on this server): delete what you no longer need or write less; the code is not at fault.".into(),
        );
    }
    if output.contains("fork: retry")
        || output.contains("can't start new thread")
        || output.contains("fork: Resource temporarily unavailable")
    {
        return Some(
            "The command reached the sandbox's limit on processes: start fewer at once; the code is not at fault."
                .into(),
        );
    }
    if output.contains("MemoryError") || output.contains("Cannot allocate memory") || output.contains("std::bad_alloc")
    {
        return Some(
            "The command ran out of the memory the sandbox allows: work on less data at once; the code is not at fault.".into(),
        );
    }
    if !network && OFFLINE_SIGNS.iter().any(|sign| output.contains(sign)) {
        return Some(
            "The sandbox kept this command offline: nothing here can reach the network, so do without it, or ask the operator for --code-exec-allow-network; the code is not at fault.".into(),
        );
    }
    let root = root.to_string_lossy();
    for line in output.lines() {
        let Some(at) = DENIED_SIGNS.iter().filter_map(|sign| line.find(sign)).min() else { continue };
        // The refused path is the last one before the complaint (bash:
        // "script: line 1: /etc/x: Read-only file system") or the first
        // after it (Python: "Permission denied: '/etc/x'").
        let path = absolute_paths(&line[..at]).last().cloned().or_else(|| absolute_paths(&line[at..]).first().cloned());
        if let Some(path) = path.filter(|path| !inside(path, &root)) {
            let path: String = path.chars().take(MAX_QUOTED_PATH).collect();
            return Some(format!(
                "The sandbox refused {path:?}: commands may change only the working folder (and /tmp) and read only the system paths its profile allows; work inside the folder, the code is not at fault."
            ));
        }
    }
    None
}

/// The absolute paths in `text`, in order.
fn absolute_paths(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | ':' | ',' | '(' | ')' | '`' | '‘' | '’'))
        .filter(|word| word.starts_with('/') && word.len() > 1)
        .map(str::to_string)
        .collect()
}

/// Whether `path` lies in the working folder `root`.
fn inside(path: &str, root: &str) -> bool {
    root.len() > 1 && (path == root || path.starts_with(&format!("{root}/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/tmp/skillhost-x/w-1";

    fn note(output: &str, network: bool) -> Option<String> {
        environment_note(output, network, Path::new(ROOT))
    }

    #[test]
    fn a_refused_path_outside_the_folder_is_the_sandbox() {
        let python = "PermissionError: [Errno 13] Permission denied: '/etc/skillhost-test'";
        assert!(note(python, false).unwrap().starts_with("The sandbox refused \"/etc/skillhost-test\""));
        let bash = "/skills/x/run.sh: line 1: /usr/local/bin/tool: Read-only file system";
        assert!(note(bash, false).unwrap().starts_with("The sandbox refused \"/usr/local/bin/tool\""));
        // Inside the folder, a refusal is the code's business (a mode it set).
        assert_eq!(note(&format!("Permission denied: '{ROOT}/out.txt'"), false), None);
        assert_eq!(note("cat: secret: Permission denied", false), None, "a relative path is inside");
    }

    #[test]
    fn network_errors_are_the_sandbox_only_while_it_is_offline() {
        let refused = "ConnectionRefusedError: [Errno 111] Connection refused";
        assert!(note(refused, false).unwrap().starts_with("The sandbox kept this command offline"));
        assert_eq!(note(refused, true), None, "with the network on, a refused connection is real");
        assert!(note("curl: (6) Could not resolve host: example.com", false).is_some());
    }

    #[test]
    fn full_folders_and_limits_are_named() {
        assert!(note("OSError: [Errno 28] No space left on device", true).unwrap().contains("size cap"));
        assert!(note("bash: fork: retry: Resource temporarily unavailable", true).unwrap().contains("processes"));
        assert!(note("MemoryError", true).unwrap().contains("memory"));
        assert_eq!(note("AssertionError: 5 != 6", false), None, "a plain bug is left alone");
    }

    #[test]
    fn a_quoted_path_is_bounded() {
        let long = format!("Permission denied: '/{}'", "a".repeat(500));
        let said = note(&long, false).unwrap();
        assert!(said.len() < MAX_QUOTED_PATH + 300, "{said}");
    }
}
