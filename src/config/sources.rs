//! Where each setting comes from. Flags, `SKILLHOST_*` variables and
//! `--config` files are read into one list of layers, merged key by key
//! (flag > variable > later file > earlier file), and the merged list is
//! parsed once by the same clap definition the command line uses, so every
//! type (switches included) follows one precedence.
//!
//! Every switch `--x` gets a `--no-x` negation here (for switches whose name
//! already says "no", `--no-skills`, the negation drops it: `--skills`), so
//! a flag or variable can turn off what a file turned on.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use clap::builder::BoolishValueParser;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, ValueHint};

use super::ConfigError;

/// Arguments that steer the command itself rather than set a value; they
/// have no config-file key.
const NOT_SETTINGS: &[&str] = &["config", "list_skills", "print_config", "help", "version"];

/// Prefix of the ids of generated negations (never a field name).
const NEGATION: &str = "negate.";

/// Keys whose values are secrets: `--print-config` never shows them.
pub const SECRET_KEYS: &[&str] = &["api-key", "admin-key", "metrics-key"];

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Flag,
    Env(String),
    File(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag => f.write_str("the command line"),
            Origin::Env(name) => write!(f, "${name}"),
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The merged settings: per argument id, its values and where they came from.
#[derive(Debug, Default)]
pub struct Merged {
    values: BTreeMap<String, (Vec<String>, Origin)>,
}

/// Adds the generated negations to a subcommand and lets switches read
/// `1`/`0`, `yes`/`no`, `on`/`off` from the environment.
pub fn with_negations(command: Command) -> Command {
    let switches: Vec<(String, String)> = command
        .get_arguments()
        .filter(|arg| is_setting(arg) && is_switch(arg))
        .filter_map(|arg| Some((arg.get_id().to_string(), arg.get_long()?.to_string())))
        .collect();
    let mut command = command;
    for (id, long) in switches {
        let negation_id = format!("{NEGATION}{id}");
        let negation_long = negated(&long);
        command = command.mut_arg(&id, |arg| arg.value_parser(BoolishValueParser::new())).arg(
            Arg::new(negation_id)
                .long(negation_long)
                .action(ArgAction::SetTrue)
                .hide(true)
                .help(format!("Turn --{long} off")),
        );
    }
    command
}

/// `--code-exec` → `--no-code-exec`; `--no-skills` → `--skills`;
/// `--skills-no-discovery` → `--skills-discovery`.
fn negated(long: &str) -> String {
    if let Some(rest) = long.strip_prefix("no-") {
        rest.to_string()
    } else if let Some((head, tail)) = long.split_once("-no-") {
        format!("{head}-{tail}")
    } else {
        format!("no-{long}")
    }
}

fn is_setting(arg: &Arg) -> bool {
    let id = arg.get_id().as_str();
    !NOT_SETTINGS.contains(&id) && !id.starts_with(NEGATION) && arg.get_long().is_some()
}

fn is_switch(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue)
}

fn is_list(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

fn is_path(arg: &Arg) -> bool {
    matches!(arg.get_value_hint(), ValueHint::AnyPath | ValueHint::FilePath | ValueHint::DirPath)
}

/// Reads every layer for `command` (already given [`with_negations`]) as
/// parsed into `matches`, and merges them.
pub fn merge(command: &Command, matches: &ArgMatches) -> Result<Merged, ConfigError> {
    let mut merged = Merged::default();
    let files: Vec<PathBuf> = matches.get_many::<PathBuf>("config").map(|v| v.cloned().collect()).unwrap_or_default();
    for path in &files {
        for (id, values) in read_file(command, path)? {
            merged.values.insert(id, (values, Origin::File(path.clone())));
        }
    }
    // Variables first, then flags, so a flag lands on top.
    for wanted in [ValueSource::EnvVariable, ValueSource::CommandLine] {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if matches.value_source(id) != Some(wanted) {
                continue;
            }
            let origin = match wanted {
                ValueSource::EnvVariable => {
                    Origin::Env(arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default())
                }
                _ => Origin::Flag,
            };
            if let Some(base) = id.strip_prefix(NEGATION) {
                // `--x --no-x`: the later one on the command line wins.
                let later_on = matches.value_source(base) == Some(ValueSource::CommandLine)
                    && matches.index_of(base) > matches.index_of(id);
                if matches.get_flag(id) && !later_on {
                    merged.values.insert(base.to_string(), (vec!["false".into()], origin));
                }
            } else if is_setting(arg) && is_switch(arg) {
                let negation = format!("{NEGATION}{id}");
                let later_off = wanted == ValueSource::CommandLine
                    && matches.value_source(&negation) == Some(ValueSource::CommandLine)
                    && matches.index_of(&negation) > matches.index_of(id);
                if !later_off {
                    merged.values.insert(id.to_string(), (vec![matches.get_flag(id).to_string()], origin));
                }
            } else if is_setting(arg) {
                let values = matches
                    .get_raw(id)
                    .map(|raw| raw.map(|v| v.to_string_lossy().into_owned()).collect())
                    .unwrap_or_default();
                merged.values.insert(id.to_string(), (values, origin));
            }
        }
    }
    Ok(merged)
}

/// One config file's keys as argument ids and text values. Keys are the
/// long flag names; relative paths are relative to the file.
fn read_file(command: &Command, path: &Path) -> Result<Vec<(String, Vec<String>)>, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| ConfigError(format!("--config: cannot read {}: {err}", path.display())))?;
    let invalid = |detail: String| ConfigError(format!("--config: {} is not a valid config: {detail}", path.display()));
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mapping: serde_yaml::Mapping = serde_yaml::from_str(&text).map_err(|err| invalid(err.to_string()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    // `model` adds to `--model`, `models` to `--model-entry`.
    let mut models = Vec::new();
    let mut entries = Vec::new();
    for (key, value) in mapping {
        let Some(key) = key.as_str() else {
            return Err(invalid(format!("a key is not text: {key:?}")));
        };
        if key == "model" {
            models.extend(model_specs(&value, base).map_err(invalid)?);
            continue;
        }
        if key == "models" {
            entries.extend(model_entries(&value, base).map_err(invalid)?);
            continue;
        }
        if key == "mcp-servers" {
            // A map of servers (the mcpServers object of Claude Code's
            // file, in YAML): passed on as its JSON, checked with the rest.
            let json = serde_json::to_string(&value).map_err(|err| invalid(format!("`mcp-servers`: {err}")))?;
            out.push(("mcp_servers".to_string(), vec![json]));
            continue;
        }
        if key == "upstreams" {
            out.push(("upstream".to_string(), upstream_specs(&value).map_err(invalid)?));
            continue;
        }
        let Some(arg) = command.get_arguments().find(|arg| is_setting(arg) && arg.get_long() == Some(key)) else {
            return Err(invalid(format!(
                "unknown key `{key}` (the keys are the long flag names of `skillhost serve`)"
            )));
        };
        let scalar = |value: &serde_yaml::Value| -> Result<String, ConfigError> {
            let text = match value {
                serde_yaml::Value::String(s) => s.clone(),
                serde_yaml::Value::Bool(b) => b.to_string(),
                serde_yaml::Value::Number(n) => n.to_string(),
                _ => return Err(invalid(format!("`{key}` must be a single value, not {value:?}"))),
            };
            Ok(if is_path(arg) && !text.is_empty() { base.join(text).to_string_lossy().into_owned() } else { text })
        };
        let values = match &value {
            serde_yaml::Value::Sequence(items) if is_list(arg) => items.iter().map(scalar).collect::<Result<_, _>>()?,
            serde_yaml::Value::Sequence(_) => return Err(invalid(format!("`{key}` takes one value, not a list"))),
            _ if is_switch(arg) && !value.is_bool() => {
                return Err(invalid(format!("`{key}` is a switch: write true or false")))
            }
            _ => vec![scalar(&value)?],
        };
        out.push((arg.get_id().to_string(), values));
    }
    if !models.is_empty() {
        out.push(("model".to_string(), models));
    }
    if !entries.is_empty() {
        out.push(("model_entry".to_string(), entries));
    }
    Ok(out)
}

/// The `model` key (a path, `NAME=PATH`, or a list of them) as `--model`
/// values, each path made relative to the file's folder.
fn model_specs(value: &serde_yaml::Value, base: &Path) -> Result<Vec<String>, String> {
    let entry = |item: &serde_yaml::Value| match item {
        serde_yaml::Value::String(text) => {
            let (name, path) = super::models::parse_spec(text);
            let path = base.join(path).to_string_lossy().into_owned();
            Ok(match name {
                Some(name) => format!("{name}={path}"),
                None => path,
            })
        }
        other => Err(format!("`model`: an entry must be a path or NAME=PATH, not {other:?}")),
    };
    match value {
        serde_yaml::Value::Sequence(items) => items.iter().map(entry).collect(),
        single => Ok(vec![entry(single)?]),
    }
}

/// The `models` key: a list of paths, `NAME=PATH`s, or mappings with
/// `name`, `path` (or `upstream`) and the model's own settings, as
/// `--model-entry` JSON values with each path made relative to the file's
/// folder. The fields
/// are checked where the entries are read (`models::EntrySpec`).
fn model_entries(value: &serde_yaml::Value, base: &Path) -> Result<Vec<String>, String> {
    let serde_yaml::Value::Sequence(items) = value else {
        return Err("`models` must be a list".into());
    };
    let entry = |item: &serde_yaml::Value| {
        let mut fields = match item {
            serde_yaml::Value::String(text) => {
                let (name, path) = super::models::parse_spec(text);
                let mut fields = serde_json::Map::new();
                if let Some(name) = name {
                    fields.insert("name".into(), name.into());
                }
                fields.insert("path".into(), path.to_string_lossy().into_owned().into());
                fields
            }
            serde_yaml::Value::Mapping(_) => match serde_json::to_value(item) {
                Ok(serde_json::Value::Object(fields)) => fields,
                _ => return Err("`models`: an entry's keys must be text".to_string()),
            },
            other => return Err(format!("`models`: an entry must be a path or a mapping, not {other:?}")),
        };
        for key in ["path", "template-from"] {
            if let Some(serde_json::Value::String(path)) = fields.get(key) {
                let joined = base.join(path).to_string_lossy().into_owned();
                fields.insert(key.into(), joined.into());
            }
        }
        // `upstream:` as `upstreams:` takes it: a URL, a mapping of `url`
        // and its options, or a list of them.
        if let serde_yaml::Value::Mapping(map) = item {
            match map.get("upstream") {
                Some(one @ serde_yaml::Value::Mapping(_)) => {
                    let servers = upstream_specs(&serde_yaml::Value::Sequence(vec![one.clone()]))?;
                    fields.insert("upstream".into(), servers.into());
                }
                Some(many @ serde_yaml::Value::Sequence(_)) => {
                    fields.insert("upstream".into(), upstream_specs(many)?.into());
                }
                _ => {}
            }
        }
        Ok(serde_json::Value::Object(fields).to_string())
    };
    items.iter().map(entry).collect()
}

/// The `upstreams:` key: a list of `--upstream` values, each a URL or a
/// mapping of `url` and the options (`mode`, `weight`, `max-concurrent`,
/// `model`, `key-env`).
fn upstream_specs(value: &serde_yaml::Value) -> Result<Vec<String>, String> {
    let serde_yaml::Value::Sequence(items) = value else {
        return Err("`upstreams` must be a list".into());
    };
    let text = |value: &serde_yaml::Value, what: &str| match value {
        serde_yaml::Value::String(s) => Ok(s.clone()),
        serde_yaml::Value::Number(n) => Ok(n.to_string()),
        other => Err(format!("`upstreams`: {what} must be text or a number, not {other:?}")),
    };
    items
        .iter()
        .map(|item| match item {
            serde_yaml::Value::Mapping(options) => {
                let mut url = None;
                let mut rest = Vec::new();
                for (key, value) in options {
                    let key = text(key, "a key")?;
                    let value = text(value, &key)?;
                    if value.contains(',') {
                        return Err(format!("`upstreams`: {key} may not contain a comma"));
                    }
                    if key == "url" {
                        url = Some(value);
                    } else {
                        rest.push(format!("{key}={value}"));
                    }
                }
                let url = url.ok_or("`upstreams`: every entry needs a url")?;
                Ok(std::iter::once(url).chain(rest).collect::<Vec<_>>().join(","))
            }
            other => text(other, "an entry"),
        })
        .collect()
}

impl Merged {
    /// The merged settings as one command line for `command`'s parser.
    pub fn to_args(&self, command: &Command) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![command.get_name().into()];
        for arg in command.get_arguments() {
            let Some((values, _)) = self.values.get(arg.get_id().as_str()) else { continue };
            let Some(long) = arg.get_long() else { continue };
            if is_switch(arg) {
                if values.first().is_some_and(|v| v == "true") {
                    args.push(format!("--{long}").into());
                }
            } else {
                for value in values {
                    args.push(format!("--{long}={value}").into());
                }
            }
        }
        args
    }

    /// Where `id`'s value came from, if anywhere.
    pub fn origin(&self, id: &str) -> Option<&Origin> {
        self.values.get(id).map(|(_, origin)| origin)
    }

    /// The effective settings as YAML a config file could hold, each key
    /// with where it came from; unset keys are listed as comments with
    /// their defaults. Secrets are never printed.
    pub fn render(&self, command: &Command) -> String {
        let mut out = String::from(
            "# skillhost serve: effective settings (flag > variable > later file > earlier file > default)\n",
        );
        for arg in command.get_arguments().filter(|arg| is_setting(arg)) {
            let Some(long) = arg.get_long() else { continue };
            match self.values.get(arg.get_id().as_str()) {
                Some((values, origin)) => {
                    let shown: Vec<String> = if SECRET_KEYS.contains(&long) {
                        values.iter().map(|_| "'<hidden>'".to_string()).collect()
                    } else {
                        values.iter().map(|v| yaml_scalar(v, is_switch(arg))).collect()
                    };
                    let value = if is_list(arg) { format!("[{}]", shown.join(", ")) } else { shown.join("") };
                    out.push_str(&format!("{long}: {value}  # from {origin}\n"));
                }
                None => {
                    let default = arg
                        .get_help()
                        .map(|h| h.to_string())
                        .and_then(|h| h.split_once("[default: ").map(|(_, d)| d.trim_end_matches(']').to_string()))
                        .unwrap_or_else(|| if is_switch(arg) { "false".into() } else { "unset".into() });
                    out.push_str(&format!("# {long}: default ({default})\n"));
                }
            }
        }
        out
    }
}

/// A value as a YAML scalar: switches and numbers plain, text quoted when
/// YAML would read it as something else.
fn yaml_scalar(value: &str, switch: bool) -> String {
    if switch || value.parse::<f64>().is_ok() {
        return value.to_string();
    }
    match serde_yaml::to_string(value) {
        Ok(text) => text.trim_end().to_string(),
        Err(_) => format!("{value:?}"),
    }
}

/// Parses the merged settings with `command` (once, as one command line).
/// A value clap rejects is reported with where it came from.
pub fn parse(command: &Command, merged: &Merged) -> Result<ArgMatches, ConfigError> {
    let args = merged.to_args(command);
    // Values from the environment are already merged in; the second parse
    // must not read a variable again over a file's value. Parsing from a
    // command without `env` keeps the one precedence.
    // Positional arguments (a command's URL) are not settings: no file or
    // variable holds them, so the caller takes them from the command line.
    let plain = command.clone().mut_args(|arg| {
        let arg = arg.env(None::<&str>);
        if arg.is_positional() {
            arg.required(false)
        } else {
            arg
        }
    });
    plain.try_get_matches_from(args).map_err(|err| {
        let text = err.render().to_string();
        let line = text.lines().next().unwrap_or("").trim_start_matches("error: ").to_string();
        let from = err
            .get(clap::error::ContextKind::InvalidArg)
            .map(|arg| arg.to_string())
            .and_then(|arg| {
                let long = arg.trim_start_matches("--").split([' ', '=']).next().unwrap_or("").to_string();
                command.get_arguments().find(|a| a.get_long() == Some(long.as_str())).map(|a| a.get_id().to_string())
            })
            .and_then(|id| merged.origin(&id).cloned());
        match from {
            Some(origin) => ConfigError(format!("{line} (set in {origin})")),
            None => ConfigError(line),
        }
    })
}
