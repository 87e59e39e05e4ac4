//! Package installs the host performs for the model
//! (`--code-exec-allow-install`).
//!
//! Commands run offline, so `pip install x` inside one cannot work, and
//! opening the network to the whole line would open it to everything on
//! the line. Instead the host *reads* the install out of the command line:
//! the installer and the names, nothing else. It checks every name, runs the
//! installer itself with an argument vector it built (wheels only, no
//! package scripts, its own index, egress through the install proxy, into
//! the workspace's own folders, confined like a command), and replaces the
//! install in the line with `true`, so `pip install x && python y.py`
//! installs and then runs `y.py` offline. A failed install stops the line:
//! nothing after it runs, and the failure is what comes back.
//!
//! Only a subset of what pip and npm accept is understood, and the rest is
//! refused by name rather than ignored: an option that changes where a
//! package comes from (`--index-url`, `-i`, `--find-links`, a URL or a
//! path), an installer the host cannot run for the model (uv, poetry,
//! gem, cargo, …), a runner that fetches on its own (npx, uvx, npm exec).
//! Ignoring any of them would install something other than what was asked
//! and report success, the one result a model cannot recover from.

use std::ops::Range;

/// Distinct packages installed for missing imports within one call.
pub const MAX_AUTO_INSTALLS: usize = 5;
/// Largest requirements file read for `-r`.
pub const MAX_REQUIREMENTS_BYTES: u64 = 64 * 1024;
/// Lines of a failed install's output kept in the result.
pub const INSTALL_OUTPUT_LINES: usize = 20;
pub use crate::sandbox::installs::{
    InstallSettings, DEFAULT_INSTALL_DOMAINS, DEFAULT_NPM_REGISTRY, DEFAULT_PYTHON_INDEX,
};

/// Which installer a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecosystem {
    Python,
    Node,
}

impl Ecosystem {
    pub fn tool(self) -> &'static str {
        match self {
            Ecosystem::Python => "pip",
            Ecosystem::Node => "npm",
        }
    }
}

/// One install read out of a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub ecosystem: Ecosystem,
    /// Requirement specs as written (`PyYAML>=6`, `@scope/tool@1.2.3`),
    /// each checked; requirements files are read into this later.
    pub specs: Vec<String>,
    /// `-r FILE` names, relative to where the command starts.
    pub requirements: Vec<String>,
    /// pip options that do not change the source and are passed on.
    pub options: Vec<String>,
    /// The folder the line had `cd`'d into before this install, relative.
    pub cwd: String,
}

impl Request {
    pub fn new(ecosystem: Ecosystem, specs: Vec<String>) -> Request {
        Request { ecosystem, specs, requirements: Vec::new(), options: Vec::new(), cwd: String::new() }
    }
}

/// What the host makes of a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No install in it: run it as it is.
    Run,
    /// Installs to perform first, and the line to run after, with each
    /// install replaced by `true` (`None` when nothing else is left).
    Install { requests: Vec<Request>, rest: Option<String> },
    /// The line does not run; the sentence says why.
    Refused(String),
}

/// The rules a line is read under.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    pub allowed: bool,
    /// Commands have the network: package runners may then fetch on their
    /// own, when installs are on and no package list is set.
    pub network: bool,
    pub packages: &'a [String],
}

/// The sentence for any install when installs are off.
pub fn not_enabled() -> String {
    "Installing packages is not enabled on this server (the operator can allow it with --code-exec-allow-install): use what is installed, or do without the package.".into()
}

/// A name as the Python package index compares it (PEP 503).
pub fn normalize_python(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
            continue;
        }
        if separator && !out.is_empty() {
            out.push('-');
        }
        separator = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

// ---------------------------------------------------------------------
// Reading a command line.
// ---------------------------------------------------------------------

/// One simple command of a line: its words and where it lies in the line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    words: Vec<String>,
    span: Range<usize>,
    /// It holds syntax whose words this reader cannot know (`$(…)`,
    /// backticks, a subshell, an expansion in a word).
    opaque: bool,
}

/// Splits a line at `&&`, `||`, `;`, `|`, `&` and newlines outside quotes,
/// into words with quotes removed. Redirections (`2>&1`, `> log`, `<in`)
/// and their targets are not words: read as names, they would be installed.
fn segments(line: &str) -> Vec<Segment> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut opaque = false;
    let mut start = 0;
    let mut redirect_target = false;
    let mut i = 0;
    let finish_word = |words: &mut Vec<String>, word: &mut String, in_word: &mut bool, redirect: &mut bool| {
        if *in_word {
            if *redirect {
                *redirect = false;
            } else {
                words.push(std::mem::take(word));
            }
            word.clear();
            *in_word = false;
        }
    };
    while i < bytes.len() {
        let c = bytes[i] as char;
        match c {
            '\'' => {
                in_word = true;
                let end = line[i + 1..].find('\'').map_or(line.len(), |at| i + 1 + at);
                word.push_str(&line[i + 1..end]);
                i = end + 1;
                continue;
            }
            '"' => {
                in_word = true;
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != b'"' {
                    if bytes[j] == b'\\' && j + 1 < bytes.len() {
                        j += 1;
                    } else if bytes[j] == b'$' || bytes[j] == b'`' {
                        opaque = true;
                    }
                    let ch = line[j..].chars().next().unwrap_or(' ');
                    word.push(ch);
                    j += ch.len_utf8();
                }
                i = j + 1;
                continue;
            }
            '\\' if i + 1 < bytes.len() => {
                in_word = true;
                let ch = line[i + 1..].chars().next().unwrap_or(' ');
                if ch != '\n' {
                    word.push(ch);
                }
                i += 1 + ch.len_utf8();
                continue;
            }
            ' ' | '\t' => finish_word(&mut words, &mut word, &mut in_word, &mut redirect_target),
            '\n' | ';' | '|' | '&' => {
                // `&>file`: a redirection, not a separator (`2>&1` is read
                // whole by the `>` branch).
                if c == '&' && bytes.get(i + 1) == Some(&b'>') {
                    finish_word(&mut words, &mut word, &mut in_word, &mut redirect_target);
                    redirect_target = true;
                    i += 2;
                    if bytes.get(i) == Some(&b'>') {
                        i += 1;
                    }
                    continue;
                }
                finish_word(&mut words, &mut word, &mut in_word, &mut redirect_target);
                out.push(Segment { words: std::mem::take(&mut words), span: start..i, opaque });
                opaque = false;
                redirect_target = false;
                // `&&`, `||`, `|&` are one separator.
                let next = bytes.get(i + 1).copied();
                i += if matches!((c, next), ('&', Some(b'&')) | ('|', Some(b'|')) | ('|', Some(b'&'))) { 2 } else { 1 };
                start = i;
                continue;
            }
            '>' | '<' => {
                // `2>` and `1>`: the digits were the start of a redirection.
                if in_word && !word.is_empty() && word.chars().all(|c| c.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                } else {
                    finish_word(&mut words, &mut word, &mut in_word, &mut redirect_target);
                }
                redirect_target = true;
                i += 1;
                while matches!(bytes.get(i), Some(b'>') | Some(b'<')) {
                    i += 1;
                }
                // `>&1`: a descriptor, which the `&` branch skips with its digits.
                if bytes.get(i) == Some(&b'&') {
                    i += 1;
                    while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                        i += 1;
                    }
                    redirect_target = false;
                }
                continue;
            }
            '$' | '`' | '(' | ')' | '{' | '}' => {
                opaque = true;
                in_word = true;
                word.push(c);
            }
            _ => {
                in_word = true;
                let ch = line[i..].chars().next().unwrap_or(' ');
                word.push(ch);
                i += ch.len_utf8();
                continue;
            }
        }
        i += 1;
    }
    finish_word(&mut words, &mut word, &mut in_word, &mut redirect_target);
    out.push(Segment { words, span: start..line.len(), opaque });
    out.retain(|s| !s.words.is_empty() || s.opaque);
    out
}

/// The simple commands of a line, each as its words; `None` when any holds
/// syntax whose words cannot be known (`$(…)`, backticks, a subshell, an
/// expansion), which a check of what runs must not guess at.
pub fn simple_commands(line: &str) -> Option<Vec<Vec<String>>> {
    let found = segments(line);
    if found.iter().any(|s| s.opaque) {
        return None;
    }
    Some(found.into_iter().map(|s| s.words).collect())
}

/// The program a word names, without its folder.
fn program(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn is_python(name: &str) -> bool {
    name == "python"
        || name == "python3"
        || name.strip_prefix("python3.").is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()))
}

fn is_pip(name: &str) -> bool {
    name == "pip"
        || name == "pip3"
        || name.strip_prefix("pip3.").is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()))
}

/// What one segment is.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// Not an install.
    Other,
    Install(Request),
    Refused(String),
}

/// Installers the host does not run for the model, with the way to get the
/// same package.
fn foreign_installer(words: &[String]) -> Option<String> {
    let name = program(&words[0]);
    let sub = words.get(1).map(String::as_str).unwrap_or_default();
    let instead = match name {
        "uv" if matches!(sub, "pip" | "add" | "sync" | "tool" | "install") => "pip install NAME",
        "poetry" | "pipenv" if matches!(sub, "add" | "install" | "update" | "sync") => "pip install NAME",
        "conda" | "mamba" | "micromamba" if matches!(sub, "install" | "create" | "update") => "pip install NAME",
        "pipx" if matches!(sub, "install" | "run" | "inject") => "pip install NAME",
        "easy_install" => "pip install NAME",
        "pnpm" | "yarn" | "bun" if matches!(sub, "add" | "install" | "i" | "up" | "upgrade" | "update") => {
            "npm install NAME@VERSION"
        }
        "gem" if sub == "install" => "a Python or Node package",
        "cargo" if matches!(sub, "install" | "add" | "binstall") => "a Python or Node package",
        "go" if matches!(sub, "install" | "get") => "a Python or Node package",
        "apt" | "apt-get" | "yum" | "dnf" | "apk" if matches!(sub, "install" | "add") => {
            return Some(format!(
                "{name} {sub} installs system packages, which are the operator's to choose; the host installs Python wheels (pip install NAME) and npm packages (npm install NAME) only."
            ))
        }
        _ => return None,
    };
    Some(format!(
        "The host does not run `{name} {sub}` for you, and commands are offline; ask for the package with {instead} instead."
    ))
}

/// Package runners: they fetch a package in order to run it.
fn runner(words: &[String]) -> Option<String> {
    let name = program(&words[0]);
    let sub = words.get(1).map(String::as_str).unwrap_or_default();
    let spelled = match name {
        "npx" | "uvx" | "bunx" | "pipx" if name != "pipx" || sub == "run" => name.to_string(),
        "npm" if matches!(sub, "exec" | "x") => format!("npm {sub}"),
        "pnpm" | "yarn" if sub == "dlx" => format!("{name} dlx"),
        "bun" if sub == "x" => "bun x".to_string(),
        _ => return None,
    };
    Some(spelled)
}

fn probe_only(args: &[String]) -> bool {
    matches!(args, [flag] if matches!(flag.as_str(), "--version" | "-V" | "--help" | "-h" | "help" | "version"))
}

/// Reads one segment (words without `VAR=` prefixes and `sudo`).
fn classify(words: &[String], rules: &Rules, cwd: &str) -> Kind {
    let Some(first) = words.first() else { return Kind::Other };
    let name = program(first);
    if let Some(runner) = runner(words) {
        if probe_only(&words[1..]) {
            return Kind::Other;
        }
        if rules.allowed && rules.network && rules.packages.is_empty() {
            return Kind::Other;
        }
        if !rules.allowed {
            return Kind::Refused(not_enabled());
        }
        return Kind::Refused(format!(
            "`{runner}` fetches a package on its own to run it, which would go around the host's installer: install the tool by name first (npm install NAME or pip install NAME), then run its program from node_modules/.bin/ or .local/bin/, or call the interpreter directly."
        ));
    }
    if let Some(refusal) = foreign_installer(words) {
        return Kind::Refused(if rules.allowed { refusal } else { not_enabled() });
    }
    let (ecosystem, args) = if is_pip(name) {
        (Ecosystem::Python, &words[1..])
    } else if is_python(name) && words.get(1).is_some_and(|w| w == "-m") && words.get(2).is_some_and(|w| is_pip(w)) {
        (Ecosystem::Python, &words[3..])
    } else if is_python(name) && words.get(1).is_some_and(|w| w == "-mpip") {
        (Ecosystem::Python, &words[2..])
    } else if name == "npm" {
        (Ecosystem::Node, &words[1..])
    } else {
        return Kind::Other;
    };
    if probe_only(args) {
        return Kind::Other;
    }
    let read = match ecosystem {
        Ecosystem::Python => read_pip(args),
        Ecosystem::Node => read_npm(args),
    };
    match read {
        Ok(None) => Kind::Other,
        Ok(Some(_)) | Err(_) if !rules.allowed => Kind::Refused(not_enabled()),
        Err(refusal) => Kind::Refused(refusal),
        Ok(Some(mut request)) => {
            request.cwd = cwd.to_string();
            match check_allowed(&request, rules.packages) {
                Ok(()) => Kind::Install(request),
                Err(refusal) => Kind::Refused(refusal),
            }
        }
    }
}

/// Options before pip's subcommand that change nothing about the install.
const PIP_GLOBAL_FLAGS: [&str; 7] =
    ["-q", "-qq", "--quiet", "-v", "--verbose", "--disable-pip-version-check", "--no-input"];
/// pip install options passed on: they do not change the source or target.
const PIP_PASSED: [&str; 6] = ["-U", "--upgrade", "--no-deps", "--pre", "--force-reinstall", "--ignore-installed"];
/// pip install options the host's own install already implies or that
/// only change the output.
const PIP_IGNORED: [&str; 12] = [
    "-q",
    "-qq",
    "--quiet",
    "-v",
    "--user",
    "--no-cache-dir",
    "--disable-pip-version-check",
    "--no-input",
    "--break-system-packages",
    "--no-warn-script-location",
    "--prefer-binary",
    "--no-color",
];
/// pip install options with a value that only change the output or retries.
const PIP_IGNORED_WITH_VALUE: [&str; 6] =
    ["--progress-bar", "--only-binary", "--root-user-action", "--timeout", "--retries", "--upgrade-strategy"];

/// Why a pip option is refused, when it is one of those that change what
/// is installed or where.
fn pip_refusal(option: &str) -> Option<String> {
    let source = [
        "-i",
        "--index-url",
        "--extra-index-url",
        "-f",
        "--find-links",
        "--no-index",
        "--trusted-host",
        "--no-binary",
        "-c",
        "--constraint",
    ];
    let target = ["-t", "--target", "--prefix", "--root", "--src", "--home"];
    if source.contains(&option) {
        return Some(format!(
            "`pip install {option}` changes where packages come from, and the host installs wheels from its own index only: drop {option} and name the packages."
        ));
    }
    if target.contains(&option) {
        return Some(format!(
            "`pip install {option}` changes where packages go; the host installs into this working folder, where the shell and scripts find them: drop {option}."
        ));
    }
    if matches!(option, "-e" | "--editable") {
        return Some(format!(
            "`pip install {option}` installs from a local folder, which the host does not do: name published packages, or put the folder on PYTHONPATH."
        ));
    }
    None
}

/// Where an installer's subcommand is, past the options before it that
/// change nothing (`harmless`); any other option there is refused by name.
fn subcommand_at(args: &[String], harmless: &[&str], refusal: impl Fn(&str) -> String) -> Result<usize, String> {
    let mut i = 0;
    while i < args.len() && args[i].starts_with('-') {
        if !harmless.contains(&args[i].as_str()) {
            return Err(refusal(&args[i]));
        }
        i += 1;
    }
    Ok(i)
}

/// pip's arguments after the program: `Ok(None)` when it is not an install.
fn read_pip(args: &[String]) -> Result<Option<Request>, String> {
    let i = subcommand_at(args, &PIP_GLOBAL_FLAGS, |flag| {
        format!("The host does not know what `pip {flag}` before the subcommand does, so it will not guess: write pip install NAME.")
    })?;
    match args.get(i).map(String::as_str) {
        Some("install") => {}
        Some(sub @ ("download" | "wheel")) => {
            return Err(format!(
                "`pip {sub}` produces archives, and the host installs packages instead: write pip install NAME."
            ))
        }
        _ => return Ok(None),
    }
    let mut request = Request::new(Ecosystem::Python, Vec::new());
    let mut rest = args[i + 1..].iter();
    let mut only_names = false;
    while let Some(arg) = rest.next() {
        if only_names || !arg.starts_with('-') {
            request.specs.push(python_spec(arg)?);
            continue;
        }
        if arg == "--" {
            only_names = true;
            continue;
        }
        let (option, inline) = match arg.split_once('=') {
            Some((option, value)) if option.starts_with("--") => (option, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        if option == "-r" || option == "--requirement" || (option.starts_with("-r") && option.len() > 2) {
            let file = match (inline, option.strip_prefix("-r").filter(|f| !f.is_empty() && option != "-r")) {
                (Some(value), _) => Some(value),
                (None, Some(attached)) if !attached.starts_with('-') => Some(attached.to_string()),
                _ => rest.next().cloned(),
            };
            match file {
                Some(file) if !file.is_empty() => request.requirements.push(file),
                _ => return Err("`pip install -r` needs the requirements file's name.".into()),
            }
            continue;
        }
        if let Some(refusal) = pip_refusal(option) {
            return Err(refusal);
        }
        if PIP_PASSED.contains(&option) {
            request.options.push(option.to_string());
        } else if PIP_IGNORED_WITH_VALUE.contains(&option) {
            if inline.is_none() {
                rest.next();
            }
        } else if !PIP_IGNORED.contains(&option) {
            return Err(format!(
                "The host does not know what `pip install {option}` does, so it will not guess: drop it, or install without it."
            ));
        }
    }
    if request.specs.is_empty() && request.requirements.is_empty() {
        return Err("Name the packages to install: pip install NAME…".into());
    }
    Ok(Some(request))
}

/// Checks one pip requirement: a published name, optionally with extras, a
/// version and an environment marker; never a URL or a path.
pub fn python_spec(spec: &str) -> Result<String, String> {
    let spec = spec.trim();
    let refused_as = |what: &str| {
        Err(format!(
            "'{spec}' is {what}; the host installs published packages from its own index only: name the package (and a version, e.g. NAME==1.2)."
        ))
    };
    if spec.contains("://") || spec.starts_with("git+") || spec.contains(" @ ") || spec.contains('@') {
        return refused_as("a URL");
    }
    let lower = spec.to_ascii_lowercase();
    if spec.starts_with('.')
        || spec.starts_with('/')
        || spec.starts_with('~')
        || spec.contains('/')
        || [".whl", ".tar.gz", ".zip", ".tgz"].iter().any(|ext| lower.ends_with(ext))
    {
        return refused_as("a local path");
    }
    let (requirement, _marker) = spec.split_once(';').unwrap_or((spec, ""));
    let name_end = requirement
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(requirement.len());
    let name = &requirement[..name_end];
    let valid_name = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if !valid_name {
        return Err(format!("'{spec}' is not a package name pip accepts."));
    }
    let mut after = requirement[name_end..].trim();
    if let Some(extras) = after.strip_prefix('[') {
        let Some((inside, tail)) = extras.split_once(']') else {
            return Err(format!("'{spec}' opens its extras with [ and never closes them."));
        };
        if !inside.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ',' | ' ')) {
            return Err(format!("'{spec}' has extras pip does not accept."));
        }
        after = tail.trim();
    }
    let version_chars = |c: char| c.is_ascii_alphanumeric() || " <>=!~.,*+-_".contains(c);
    let versioned = after.starts_with(['<', '>', '=', '!', '~'])
        && after.chars().all(version_chars)
        && after.chars().any(|c| c.is_ascii_alphanumeric() || c == '*');
    if !after.is_empty() && !versioned {
        return Err(format!("'{spec}' has a version pip does not accept; write NAME==1.2 or NAME>=1.2."));
    }
    Ok(spec.to_string())
}

/// npm options before the subcommand that change nothing about the install.
const NPM_GLOBAL_FLAGS: [&str; 7] = ["--silent", "-s", "--quiet", "-q", "--no-audit", "--no-fund", "--no-progress"];
/// npm install options the host's own install implies or that only change
/// what npm writes about the install.
const NPM_IGNORED: [&str; 19] = [
    "--save",
    "-S",
    "--save-dev",
    "-D",
    "--save-optional",
    "-O",
    "--save-exact",
    "-E",
    "--save-prod",
    "-P",
    "--no-save",
    "--silent",
    "-s",
    "--quiet",
    "--no-audit",
    "--no-fund",
    "--no-package-lock",
    "--no-progress",
    "--ignore-scripts",
];

/// npm's arguments after the program: `Ok(None)` when it is not an install.
fn read_npm(args: &[String]) -> Result<Option<Request>, String> {
    let i = subcommand_at(args, &NPM_GLOBAL_FLAGS, |flag| {
        format!("The host does not install with `npm {flag}`: it installs into this working folder's node_modules; write npm install NAME.")
    })?;
    match args.get(i).map(String::as_str) {
        Some("install" | "i" | "add" | "in" | "isntall") => {}
        Some("ci") => return Err("`npm ci` installs what a lock file lists, which the host does not read: name the packages, npm install NAME@VERSION.".into()),
        Some(sub @ ("update" | "up" | "upgrade")) => {
            return Err(format!(
                "`npm {sub}` does not say which versions it will fetch: name the package and version instead, npm install NAME@latest."
            ))
        }
        _ => return Ok(None),
    }
    let mut request = Request::new(Ecosystem::Node, Vec::new());
    let mut rest = args[i + 1..].iter();
    while let Some(arg) = rest.next() {
        if !arg.starts_with('-') {
            request.specs.push(npm_spec(arg)?);
            continue;
        }
        let option = arg.split_once('=').map_or(arg.as_str(), |(option, _)| option);
        if option == "--loglevel" {
            if !arg.contains('=') {
                rest.next();
            }
            continue;
        }
        if NPM_IGNORED.contains(&option) {
            continue;
        }
        if matches!(option, "-g" | "--global" | "--location" | "--prefix" | "-C") {
            return Err(format!(
                "`npm install {option}` installs outside this working folder; the host installs into its node_modules, where node and the shell find them: drop {option}."
            ));
        }
        if matches!(option, "--registry" | "--userconfig" | "--globalconfig") {
            return Err(format!(
                "`npm install {option}` changes where packages come from, and the host installs from its own registry only: drop {option}."
            ));
        }
        return Err(format!(
            "The host does not know what `npm install {option}` does, so it will not guess: drop it, or install without it."
        ));
    }
    if request.specs.is_empty() {
        return Err(
            "Name the packages to install: npm install NAME… (the host does not install what package.json lists)."
                .into(),
        );
    }
    Ok(Some(request))
}

/// Checks one npm spec: a registry name with an optional scope and an
/// optional version, range or tag; never a URL, a Git repository, a path,
/// a tarball or an alias.
pub fn npm_spec(spec: &str) -> Result<String, String> {
    let refused_as = |what: &str| {
        Err(format!(
            "'{spec}' is {what}; the host installs registry packages only: name the package (and a version, e.g. NAME@1.2.3)."
        ))
    };
    let lower = spec.to_ascii_lowercase();
    if spec.contains(':') || lower.starts_with("git") && spec.contains('+') {
        return refused_as("a URL, a Git repository or an alias");
    }
    if spec.starts_with('.')
        || spec.starts_with('/')
        || spec.starts_with('~')
        || lower.ends_with(".tgz")
        || lower.ends_with(".tar.gz")
    {
        return refused_as("a local path or tarball");
    }
    let (scope, rest) = match spec.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, rest)) => (Some(scope), rest),
            None => return Err(format!("'{spec}' has a scope but no package name; write @scope/NAME.")),
        },
        None => (None, spec),
    };
    if rest.contains('/') {
        return refused_as("a GitHub repository");
    }
    let (name, version) = rest.split_once('@').unwrap_or((rest, ""));
    let valid = |part: &str| {
        part.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !valid(name) || scope.is_some_and(|s| !valid(s)) {
        return Err(format!("'{spec}' is not a package name npm accepts."));
    }
    if !version.chars().all(|c| c.is_ascii_alphanumeric() || " .^~<>=*|-+_".contains(c)) {
        return Err(format!("'{spec}' has a version npm does not accept; write NAME@1.2.3 or NAME@latest."));
    }
    Ok(spec.to_string())
}

/// The name a spec installs, for the allow-list.
pub fn spec_name(ecosystem: Ecosystem, spec: &str) -> String {
    match ecosystem {
        Ecosystem::Python => {
            let end =
                spec.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))).unwrap_or(spec.len());
            normalize_python(&spec[..end])
        }
        Ecosystem::Node => {
            let version_at = spec.char_indices().skip(1).find(|(_, c)| *c == '@').map(|(at, _)| at);
            spec[..version_at.unwrap_or(spec.len())].to_string()
        }
    }
}

/// Whether `--code-exec-packages` lets every name in `request` through.
pub fn check_allowed(request: &Request, packages: &[String]) -> Result<(), String> {
    if packages.is_empty() {
        return Ok(());
    }
    for spec in &request.specs {
        let name = spec_name(request.ecosystem, spec);
        let listed = packages.iter().any(|p| match request.ecosystem {
            Ecosystem::Python => normalize_python(p) == name,
            Ecosystem::Node => *p == name,
        });
        if !listed {
            return Err(format!(
                "'{name}' is not on this server's package list (--code-exec-packages: {}); use one of those, or do without it.",
                packages.join(", ")
            ));
        }
    }
    Ok(())
}

/// Where a `cd DIR` segment leaves the line, relative to the workspace,
/// when DIR is a plain relative path; `None` when it cannot be followed.
fn follow_cd(cwd: &str, dir: &str) -> Option<String> {
    if dir.starts_with('/') || dir.starts_with('~') || dir.starts_with('-') {
        return None;
    }
    let mut parts: Vec<&str> = cwd.split('/').filter(|p| !p.is_empty()).collect();
    for part in dir.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

/// Reads a command line: the installs in it, checked under `rules`, and
/// the line to run after them. `cwd` is where the line starts, relative to
/// the workspace.
pub fn read_line(line: &str, rules: &Rules, cwd: &str) -> Plan {
    let mut requests = Vec::new();
    let mut replaced: Vec<Range<usize>> = Vec::new();
    let mut others = 0;
    let mut line_cwd = Some(cwd.to_string());
    for segment in segments(line) {
        // `VAR=value`, `sudo`, `env`, `time` before the program.
        let mut words = segment.words.as_slice();
        let mut assignments = Vec::new();
        loop {
            match words.first().map(String::as_str) {
                Some(w) if w.contains('=') && !w.starts_with('=') && !w.starts_with('-') => {
                    assignments.push(w.to_string());
                    words = &words[1..];
                }
                Some("sudo" | "env" | "time" | "command" | "nohup") => {
                    words = &words[1..];
                    while words.first().is_some_and(|w| w.starts_with('-')) {
                        words = &words[1..];
                    }
                }
                _ => break,
            }
        }
        if segment.opaque && rules.allowed && mentions_install(&segment.words) {
            return Plan::Refused(
                "The host reads installs only as plain commands with the names written out, not inside $(…), backticks or a subshell, nor with variables in them: write the install as a command of its own, e.g. pip install NAME && …".into(),
            );
        }
        let kind =
            if words.is_empty() { Kind::Other } else { classify(words, rules, line_cwd.as_deref().unwrap_or(cwd)) };
        match kind {
            Kind::Other => {
                others += 1;
                line_cwd = match words {
                    [cd, dir] if cd == "cd" => line_cwd.and_then(|c| follow_cd(&c, dir)),
                    [cd] if cd == "cd" => Some(String::new()),
                    _ => line_cwd,
                };
            }
            Kind::Refused(refusal) => return Plan::Refused(refusal),
            Kind::Install(request) => {
                if !assignments.is_empty() {
                    return Plan::Refused(format!(
                        "The host runs installs with its own settings, so {} before the installer would not apply: drop it.",
                        assignments.join(" ")
                    ));
                }
                if line_cwd.is_none() && !request.requirements.is_empty() {
                    return Plan::Refused(
                        "The host cannot tell which folder the line has moved to before this `pip install -r`: name the requirements file from the top of the working folder, or cd in a command of its own first.".into(),
                    );
                }
                requests.push(request);
                replaced.push(segment.span.clone());
            }
        }
    }
    if requests.is_empty() {
        return Plan::Run;
    }
    let rest = (others > 0).then(|| {
        let mut text = String::with_capacity(line.len());
        let mut at = 0;
        for span in &replaced {
            let install = &line[span.clone()];
            let leading = install.len() - install.trim_start().len();
            text.push_str(&line[at..span.start + leading]);
            text.push_str("true ");
            at = span.end;
        }
        text.push_str(&line[at..]);
        text
    });
    Plan::Install { requests, rest }
}

fn mentions_install(words: &[String]) -> bool {
    let text = words.join(" ");
    ["pip install", "pip3 install", "-m pip", "npm install", "npm i ", "npx "].iter().any(|w| text.contains(w))
}

/// Reads a requirements file's text into specs, each checked; options in
/// it are refused by name as on the command line, and a nested `-r` is not
/// followed.
pub fn read_requirements(name: &str, text: &str) -> Result<Vec<String>, String> {
    let mut specs = Vec::new();
    let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
    for (number, raw) in joined.lines().enumerate() {
        let line = match raw.find(" #") {
            Some(at) => &raw[..at],
            None if raw.trim_start().starts_with('#') => "",
            None => raw,
        }
        .trim();
        if line.is_empty() {
            continue;
        }
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        let line = line.as_str();
        if line.starts_with('-') {
            let option = line.split([' ', '=']).next().unwrap_or(line);
            let why = pip_refusal(option).unwrap_or_else(|| {
                if matches!(option, "-r" | "--requirement") {
                    "a nested requirements file is not followed: list its packages here.".into()
                } else {
                    format!("the host does not know what {option} does there, so it will not guess.")
                }
            });
            return Err(format!("{name}, line {}: {why}", number + 1));
        }
        specs.push(python_spec(line).map_err(|why| format!("{name}, line {}: {why}", number + 1))?);
    }
    if specs.is_empty() {
        return Err(format!("{name} lists no packages."));
    }
    Ok(specs)
}

// ---------------------------------------------------------------------
// Missing imports.
// ---------------------------------------------------------------------

/// Import names whose distribution is called something else.
const DISTRIBUTIONS: [(&str, &str); 24] = [
    ("yaml", "PyYAML"),
    ("PIL", "pillow"),
    ("cv2", "opencv-python-headless"),
    ("sklearn", "scikit-learn"),
    ("skimage", "scikit-image"),
    ("bs4", "beautifulsoup4"),
    ("dateutil", "python-dateutil"),
    ("docx", "python-docx"),
    ("pptx", "python-pptx"),
    ("fitz", "PyMuPDF"),
    ("Crypto", "pycryptodome"),
    ("dotenv", "python-dotenv"),
    ("jwt", "PyJWT"),
    ("serial", "pyserial"),
    ("usb", "pyusb"),
    ("magic", "python-magic"),
    ("attr", "attrs"),
    ("OpenSSL", "pyOpenSSL"),
    ("Levenshtein", "python-Levenshtein"),
    ("google.protobuf", "protobuf"),
    ("MySQLdb", "mysqlclient"),
    ("psycopg2", "psycopg2-binary"),
    ("zmq", "pyzmq"),
    ("git", "GitPython"),
];

/// The package a command was missing: Python's `ModuleNotFoundError: No
/// module named 'x'` or Node's `Cannot find module 'x'`, mapped to the
/// distribution that provides it. A relative or absolute module (a file of
/// the model's own) is not a package.
pub fn missing_package(output: &str) -> Option<(Ecosystem, String, String)> {
    let quoted = |rest: &str| {
        let rest = rest.trim_start();
        let quote = rest.chars().next().filter(|c| matches!(c, '\'' | '"'))?;
        rest[1..].split(quote).next().map(str::to_string)
    };
    for line in output.lines().rev() {
        if let Some(at) = line.find("No module named") {
            let module = quoted(&line[at + "No module named".len()..])?;
            if module.starts_with('.') || module.is_empty() {
                return None;
            }
            let top = module.split('.').next().unwrap_or(&module).to_string();
            let dist = DISTRIBUTIONS
                .iter()
                .find(|(import, _)| *import == module || *import == top)
                .map_or(top.clone(), |(_, dist)| dist.to_string());
            if python_spec(&dist).is_err() {
                return None;
            }
            return Some((Ecosystem::Python, module, dist));
        }
        if let Some(at) = line.find("Cannot find module") {
            let module = quoted(&line[at + "Cannot find module".len()..])?;
            if module.starts_with('.') || module.starts_with('/') || module.starts_with("node:") {
                return None;
            }
            // `pkg/sub/path` and `@scope/pkg/sub`: the package is the first one or two parts.
            let parts: Vec<&str> = module.split('/').collect();
            let package = if module.starts_with('@') {
                parts.iter().take(2).copied().collect::<Vec<_>>().join("/")
            } else {
                parts[0].to_string()
            };
            if npm_spec(&package).is_err() {
                return None;
            }
            return Some((Ecosystem::Node, module, package));
        }
    }
    None
}

/// Where the installer starts and keeps its own files: a folder the host
/// makes fresh directly inside the workspace for each install and removes
/// after it, which no command can see (calls in a workspace run one at a
/// time). npm installs into it, so it reads no `.npmrc`, `package.json` or
/// lockfile the model wrote; it is the installer's HOME, so no `.gitconfig`,
/// `.netrc` or user configuration of the model's either.
pub fn stage_name() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(".skillhost-install-{}", Alphanumeric.sample_string(&mut rand::rng(), 12))
}

/// The host's argument vector for one install, staged in `stage` (a
/// folder directly inside `work`).
pub fn argv(
    request: &Request,
    settings: &InstallSettings,
    python: &std::path::Path,
    work: &std::path::Path,
    stage: &str,
) -> Vec<String> {
    match request.ecosystem {
        Ecosystem::Python => {
            let mut argv: Vec<String> = [
                python.display().to_string(),
                // Isolated: neither the working folder nor the user site
                // (where the model's files are) is on pip's own import path,
                // and no PYTHON* variable counts, so a planted `pip/`,
                // `usercustomize.py` or `.pth` never runs in the installer.
                "-I".into(),
                "-m".into(),
                "pip".into(),
                "--disable-pip-version-check".into(),
                "--no-input".into(),
                "install".into(),
                // Into the workspace's user base (PYTHONUSERBASE below),
                // which pip itself does not import from.
                "--user".into(),
                "--only-binary".into(),
                ":all:".into(),
                "--no-cache-dir".into(),
                "--no-warn-script-location".into(),
                "--progress-bar".into(),
                "off".into(),
                "--index-url".into(),
                settings.python_index.clone(),
            ]
            .into();
            if settings.proxy.is_some() {
                argv.extend(["--proxy".into(), crate::sandbox::egress::Egress::namespace_url()]);
            }
            argv.extend(request.options.iter().cloned());
            argv.push("--".into());
            argv.extend(request.specs.iter().cloned());
            argv
        }
        Ecosystem::Node => {
            let npm = settings.npm.as_ref().map_or("npm".into(), |p| p.display().to_string());
            let stage = work.join(stage);
            let mut argv: Vec<String> = [
                npm,
                "install".into(),
                // The fresh stage, not the workspace: the host moves what
                // lands in its node_modules into the workspace's after.
                "--prefix".into(),
                stage.display().to_string(),
                "--ignore-scripts".into(),
                "--no-audit".into(),
                "--no-fund".into(),
                "--no-save".into(),
                "--no-package-lock".into(),
                "--no-progress".into(),
                "--no-update-notifier".into(),
                "--registry".into(),
                settings.npm_registry.clone(),
                "--cache".into(),
                stage.join(".npm-cache").display().to_string(),
            ]
            .into();
            if settings.proxy.is_some() {
                let proxy = crate::sandbox::egress::Egress::namespace_url();
                argv.extend(["--proxy".into(), proxy.clone(), "--https-proxy".into(), proxy]);
            }
            argv.push("--".into());
            argv.extend(request.specs.iter().cloned());
            argv
        }
    }
}

/// The installer's whole environment besides what the helper passes (PATH,
/// the locale, the temp folders): HOME in the stage, Python's user base in
/// the workspace, every configuration file ignored (the index, registry,
/// proxy and scripts setting are on the command line as well, which wins
/// over any file), the proxy for both spellings, and Debian's marker
/// against installing into the system Python lifted, since `--user`
/// installs into this workspace. None of the workspace's own variables:
/// they name folders the model writes.
pub fn environment(settings: &InstallSettings, work: &std::path::Path, stage: &str) -> Vec<(String, String)> {
    let home = work.join(stage).display().to_string();
    let user_base = work.join(crate::sandbox::PYTHON_USER_BASE).display().to_string();
    let mut env: Vec<(String, String)> = [
        ("HOME", home.as_str()),
        ("PYTHONUSERBASE", user_base.as_str()),
        ("PIP_CONFIG_FILE", "/dev/null"),
        ("PIP_BREAK_SYSTEM_PACKAGES", "1"),
        ("npm_config_userconfig", "/dev/null"),
        ("npm_config_update_notifier", "false"),
    ]
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .into();
    if settings.proxy.is_some() {
        let proxy = crate::sandbox::egress::Egress::namespace_url();
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.push((name.to_string(), proxy.clone()));
        }
        // An empty NO_PROXY, so even a 127.0.0.1 index goes through the proxy.
        env.push(("NO_PROXY".into(), String::new()));
        env.push(("no_proxy".into(), String::new()));
    }
    env
}

/// One line saying what an install did, from the installer's output.
pub fn summary(ecosystem: Ecosystem, output: &str) -> String {
    let line = match ecosystem {
        Ecosystem::Python => {
            output.lines().rev().find(|l| l.starts_with("Successfully installed")).map(str::to_string).or_else(|| {
                output
                    .lines()
                    .any(|l| l.starts_with("Requirement already satisfied"))
                    .then(|| "already installed".into())
            })
        }
        Ecosystem::Node => output
            .lines()
            .rev()
            .find(|l| l.starts_with("added ") || l.starts_with("up to date") || l.starts_with("changed "))
            .map(str::to_string),
    };
    line.unwrap_or_else(|| "installed".into())
}

/// The last lines of a failed install's output, and why in one sentence
/// when the installer says something this host can explain.
pub fn failure(ecosystem: Ecosystem, specs: &[String], output: &str) -> String {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(INSTALL_OUTPUT_LINES)..].join("\n");
    let names = specs.join(" ");
    let why = if output.contains("No matching distribution found") || output.contains("from versions: none") {
        format!(
            "The index has no wheel of {names} for this Python (the host installs wheels only, never builds from source): check the name, or pick a version or a package that ships a wheel."
        )
    } else if output.contains("403 Forbidden") || output.contains("not one of this server's install hosts") {
        "The installer tried to reach a host outside the install hosts (--code-exec-install-domains), and the host refused it.".into()
    } else if output.contains("E404") || output.contains("404 Not Found") {
        format!("The registry has no package called {names}: check the name.")
    } else {
        format!("{} could not install {names}.", ecosystem.tool())
    };
    format!("[the host's install failed, so nothing after it on the line ran]\n{tail}\n{why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: Rules = Rules { allowed: true, network: false, packages: &[] };

    fn words(line: &str) -> Vec<Vec<String>> {
        segments(line).into_iter().map(|s| s.words).collect()
    }

    fn install(line: &str) -> (Vec<Request>, Option<String>) {
        match read_line(line, &OPEN, "") {
            Plan::Install { requests, rest } => (requests, rest),
            other => panic!("{line}: {other:?}"),
        }
    }

    fn refused(line: &str, rules: &Rules) -> String {
        match read_line(line, rules, "") {
            Plan::Refused(why) => why,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn lines_split_into_commands_with_redirections_left_out() {
        assert_eq!(words("pip install x 2>&1 | tail -5"), [vec!["pip", "install", "x"], vec!["tail", "-5"]]);
        assert_eq!(words("pip install 'a b' \"c\" d\\ e"), [vec!["pip", "install", "a b", "c", "d e"]]);
        assert_eq!(words("a && b || c; d & e\nf"), [["a"], ["b"], ["c"], ["d"], ["e"], ["f"]]);
        assert_eq!(words("npm i x >/dev/null 2> err.log < in"), [vec!["npm", "i", "x"]]);
        assert_eq!(words("pip install x &> log"), [vec!["pip", "install", "x"]]);
        assert_eq!(words("echo 'a && b'"), [vec!["echo", "a && b"]]);
        assert!(segments("echo $(pip install x)")[0].opaque);
    }

    #[test]
    fn installs_are_read_and_replaced_by_true() {
        let (requests, rest) = install("pip install PyYAML requests==2.31 && python y.py");
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].specs, ["PyYAML", "requests==2.31"]);
        assert_eq!(rest.as_deref(), Some("true && python y.py"));
        let (requests, rest) = install("pip install x 2>&1 | tail -5");
        assert_eq!(requests[0].specs, ["x"], "a redirection is not a package");
        assert_eq!(rest.as_deref(), Some("true | tail -5"));
        let (requests, rest) = install("python3 -m pip --disable-pip-version-check install -q -U x");
        assert_eq!((requests[0].specs.clone(), requests[0].options.clone()), (vec!["x".into()], vec!["-U".into()]));
        assert_eq!(rest, None, "nothing else to run");
        for line in ["pip -q install x", "pip3 install --user x", "python3.11 -m pip install x", "sudo pip install x"] {
            assert_eq!(install(line).0[0].specs, ["x"], "{line}");
        }
        let (requests, rest) =
            install("npm --silent install @scope/tool@1.2.3 typescript@latest --save-dev; node a.js");
        assert_eq!(requests[0].ecosystem, Ecosystem::Node);
        assert_eq!(requests[0].specs, ["@scope/tool@1.2.3", "typescript@latest"]);
        assert_eq!(rest.as_deref(), Some("true ; node a.js"));
        let (requests, _) = install("cd sub && pip install -r requirements.txt && cd .. && pip install -rother.txt");
        assert_eq!(
            (requests[0].requirements.clone(), requests[0].cwd.as_str()),
            (vec!["requirements.txt".into()], "sub")
        );
        assert_eq!((requests[1].requirements.clone(), requests[1].cwd.as_str()), (vec!["other.txt".into()], ""));
    }

    #[test]
    fn what_is_not_an_install_runs_as_it_is() {
        for line in [
            "python y.py",
            "pip --version",
            "pip list",
            "pip show requests",
            "python3 -m pip --help",
            "npm test",
            "npm run build",
            "npx --version",
            "echo pip install x",
            "grep 'pip install' README.md",
        ] {
            assert_eq!(read_line(line, &OPEN, ""), Plan::Run, "{line}");
        }
    }

    #[test]
    fn options_sources_and_installers_are_refused_by_name() {
        for (line, named) in [
            ("pip install -i https://evil/simple x", "-i"),
            ("pip install --index-url=https://evil x", "--index-url"),
            ("pip install --extra-index-url https://x y", "--extra-index-url"),
            ("pip install --find-links ./wheels x", "--find-links"),
            ("pip install -f ./wheels x", "-f"),
            ("pip install --target /usr/lib x", "--target"),
            ("pip install -e .", "-e"),
            ("pip install --no-binary :all: x", "--no-binary"),
            ("pip install --frobnicate x", "--frobnicate"),
            ("pip --isolated install x", "--isolated"),
            ("pip download x", "pip download"),
            ("pip wheel x", "pip wheel"),
            ("pip install https://evil/x.whl", "a URL"),
            ("pip install git+https://github.com/a/b", "a URL"),
            ("pip install 'x @ https://evil/x.whl'", "a URL"),
            ("pip install ./x.whl", "a local path"),
            ("pip install ../pkg", "a local path"),
            ("pip install", "Name the packages"),
            ("npm install", "Name the packages"),
            ("npm ci", "npm ci"),
            ("npm update", "npm update"),
            ("npm -g install x", "npm -g"),
            ("npm install --registry https://evil x", "--registry"),
            ("npm install -g x", "-g"),
            ("npm install github:user/repo", "a URL"),
            ("npm install user/repo", "a GitHub repository"),
            ("npm install ./local", "a local path"),
            ("npm install x.tgz", "a local path"),
            ("npm install alias@npm:other", "alias"),
            ("uv pip install x", "uv pip"),
            ("uv add x", "uv add"),
            ("poetry add x", "poetry add"),
            ("gem install rails", "gem install"),
            ("cargo install ripgrep", "cargo install"),
            ("pnpm add x", "pnpm add"),
            ("yarn up", "yarn up"),
            ("apt-get install -y jq", "system packages"),
            ("npx cowsay hi", "`npx` fetches"),
            ("npm exec cowsay", "`npm exec` fetches"),
            ("uvx ruff", "`uvx` fetches"),
            ("PIP_INDEX_URL=https://evil pip install x", "PIP_INDEX_URL=https://evil"),
            ("echo $(pip install x)", "not inside $(…)"),
            ("pip install $PKG", "variables"),
        ] {
            let why = refused(line, &OPEN);
            assert!(why.contains(named), "{line}: {why}");
        }
    }

    #[test]
    fn with_installs_off_every_install_gets_the_one_sentence() {
        let off = Rules { allowed: false, network: true, packages: &[] };
        for line in ["pip install x", "npm i x", "uv add x", "npx x", "pip install -i https://evil x"] {
            assert_eq!(refused(line, &off), not_enabled(), "{line}");
        }
        assert_eq!(read_line("python y.py", &off, ""), Plan::Run);
    }

    #[test]
    fn runners_run_as_commands_only_when_everything_is_open() {
        let open = Rules { allowed: true, network: true, packages: &[] };
        assert_eq!(read_line("npx cowsay hi", &open, ""), Plan::Run);
        let listed = ["cowsay".to_string()];
        let bounded = Rules { allowed: true, network: true, packages: &listed };
        assert!(refused("npx cowsay hi", &bounded).contains("fetches a package"));
    }

    #[test]
    fn the_package_list_applies_however_the_name_is_spelled() {
        let listed = ["PyYAML".to_string(), "left-pad".to_string()];
        let rules = Rules { allowed: true, network: false, packages: &listed };
        for line in ["pip install pyyaml", "pip install PyYAML==6.0", "pip install PYYAML", "npm i left-pad@1.3.0"] {
            assert!(matches!(read_line(line, &rules, ""), Plan::Install { .. }), "{line}");
        }
        let why = refused("pip install pyyaml requests", &rules);
        assert!(why.contains("'requests' is not on this server's package list"), "{why}");
        assert!(refused("npm i lodash", &rules).contains("'lodash'"));
        assert!(refused("pip install py-yaml", &rules).contains("'py-yaml'"), "another name on the index");
    }

    #[test]
    fn specs_are_checked() {
        for spec in ["x", "PyYAML>=6,<7", "requests[socks]==2.31.0", "numpy; python_version >= '3.8'", "a.b-c_d~=1.0"] {
            assert_eq!(python_spec(spec).as_deref(), Ok(spec), "{spec}");
        }
        for spec in ["-x", "x==", "x y", "x[a", "x>=1;rm -rf /"] {
            let result = python_spec(spec);
            // A marker is pip's to read, but never a path or URL.
            assert!(result.is_err() || spec.contains(';'), "{spec}: {result:?}");
        }
        for spec in ["x", "@scope/x", "x@1.2.3", "@s/x@^1.0", "x@latest"] {
            assert_eq!(npm_spec(spec).as_deref(), Ok(spec), "{spec}");
        }
        for spec in ["@scope", "X Y", "file:../x", "http://x/y.tgz"] {
            assert!(npm_spec(spec).is_err(), "{spec}");
        }
        assert_eq!(spec_name(Ecosystem::Node, "@s/x@^1.0"), "@s/x");
        assert_eq!(spec_name(Ecosystem::Python, "Py.YAML>=6"), "py-yaml");
    }

    #[test]
    fn requirements_files_are_read_line_by_line() {
        let text = "# tools\nPyYAML>=6  # parsing\n\nrequests==2.31 \\\n  ; python_version >= '3'\n";
        assert_eq!(read_requirements("r.txt", text).unwrap(), ["PyYAML>=6", "requests==2.31 ; python_version >= '3'"]);
        let why = read_requirements("r.txt", "x\n--index-url https://evil/simple\n").unwrap_err();
        assert!(why.starts_with("r.txt, line 2:") && why.contains("--index-url"), "{why}");
        assert!(read_requirements("r.txt", "-r other.txt\n").unwrap_err().contains("nested"));
        assert!(read_requirements("r.txt", "https://evil/x.whl\n").unwrap_err().contains("a URL"));
        assert!(read_requirements("r.txt", "# nothing\n").unwrap_err().contains("lists no packages"));
    }

    #[test]
    fn a_failed_install_shows_its_last_lines() {
        let output = |n: usize| (1..=n).map(|i| format!("line {i}\n")).collect::<String>();
        let at = failure(Ecosystem::Python, &["x".into()], &output(INSTALL_OUTPUT_LINES));
        assert!(at.contains("\nline 1\n") && at.contains(&format!("line {INSTALL_OUTPUT_LINES}\n")), "{at}");
        let past = failure(Ecosystem::Python, &["x".into()], &output(INSTALL_OUTPUT_LINES + 1));
        assert!(!past.contains("\nline 1\n") && past.contains("\nline 2\n"), "{past}");
        assert!(past.ends_with("pip could not install x."), "{past}");
    }

    #[test]
    fn a_requirements_file_is_read_up_to_its_cap() {
        // Read through the workspace handle with this cap, as the shell does.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("at.txt"), vec![b'x'; MAX_REQUIREMENTS_BYTES as usize]).unwrap();
        std::fs::write(dir.path().join("past.txt"), vec![b'x'; MAX_REQUIREMENTS_BYTES as usize + 1]).unwrap();
        let handle = crate::workspace::handle::DirHandle::open(dir.path()).unwrap();
        assert!(handle.read("at.txt", MAX_REQUIREMENTS_BYTES).is_ok());
        assert!(handle.read("past.txt", MAX_REQUIREMENTS_BYTES).is_err());
    }

    #[test]
    fn missing_imports_map_to_their_distribution() {
        let python = "Traceback (most recent call last):\n  File \"a.py\", line 1\nModuleNotFoundError: No module named 'yaml'\n";
        assert_eq!(missing_package(python), Some((Ecosystem::Python, "yaml".into(), "PyYAML".into())));
        let nested = "ModuleNotFoundError: No module named 'sklearn.linear_model'";
        assert_eq!(missing_package(nested).unwrap().2, "scikit-learn");
        assert_eq!(missing_package("No module named 'skillhost_probe'").unwrap().2, "skillhost_probe");
        assert_eq!(missing_package("ModuleNotFoundError: No module named '.local'"), None);
        let node = "Error: Cannot find module 'left-pad'\nRequire stack:\n- /w/a.js";
        assert_eq!(missing_package(node), Some((Ecosystem::Node, "left-pad".into(), "left-pad".into())));
        assert_eq!(missing_package("Cannot find module '@s/x/lib/y'").unwrap().2, "@s/x");
        assert_eq!(missing_package("Cannot find module './util'"), None, "the model's own file");
        assert_eq!(missing_package("all fine"), None);
    }

    #[test]
    fn the_host_builds_the_installer_command() {
        let settings = InstallSettings {
            proxy: Some(crate::sandbox::egress::Egress::new(vec!["pypi.org".into()])),
            ..InstallSettings::default()
        };
        let (python, work) = (std::path::Path::new("/usr/bin/python3.11"), std::path::Path::new("/w"));
        let request = install("pip install -U x==1").0.remove(0);
        let text = argv(&request, &settings, python, work, ".stage").join(" ");
        assert!(text.starts_with("/usr/bin/python3.11 -I -m pip"), "{text}");
        for part in [
            "--user",
            "--only-binary :all:",
            "--index-url https://pypi.org/simple",
            "--proxy http://127.0.0.1:3128",
            "-U -- x==1",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let request = install("npm i left-pad").0.remove(0);
        let text = argv(&request, &settings, std::path::Path::new("/p"), work, ".stage").join(" ");
        for part in [
            "install --prefix /w/.stage --ignore-scripts",
            "--cache /w/.stage/.npm-cache",
            "--registry https://registry.npmjs.org/",
            "-- left-pad",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        // HOME is the stage; nothing names a folder the model wrote but the
        // user base pip installs into.
        let env: std::collections::HashMap<String, String> =
            environment(&settings, work, ".stage").into_iter().collect();
        assert_eq!(env["HOME"], "/w/.stage");
        assert_eq!(env["PYTHONUSERBASE"], "/w/.local");
        assert_eq!(env["HTTPS_PROXY"], "http://127.0.0.1:3128");
        assert!(!env.contains_key("PYTHONPATH") && !env.contains_key("NODE_PATH"), "{env:?}");
        let stage = stage_name();
        assert!(stage.starts_with(".skillhost-install-") && stage != stage_name(), "{stage}");
    }
}
