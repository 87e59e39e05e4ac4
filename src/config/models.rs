//! The models a server offers: `--model` (repeatable, `NAME=PATH` or a
//! bare path), `--models-dir`, and the limits on loading them.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use skillhost_actors::model::catalog::{ModelLimits, DEFAULT_MAX_LOADED, DEFAULT_MEMORY_PERCENT};
use skillhost_engine::Pooling;

use super::ConfigError;

/// The longest model name a server accepts: names travel in every
/// request's `model` field and in metric labels.
pub const MAX_MODEL_NAME_LEN: usize = 128;

/// Models one server may be configured with, from flags and a models
/// folder together: each is a catalog entry the supervisor tracks.
pub const MAX_MODELS: usize = 256;

/// A `--model` value: `NAME=PATH`, or a path that names its model after
/// its file. The part before `=` is a name only when it could be one, so a
/// path holding `=` still reads as a path.
pub fn parse_spec(spec: &str) -> (Option<String>, PathBuf) {
    match spec.split_once('=') {
        Some((name, path)) if valid_name(name) && !path.is_empty() => (Some(name.to_string()), PathBuf::from(path)),
        _ => (None, PathBuf::from(spec)),
    }
}

/// Letters, digits and `._:-`, not starting with a dot: what fits a
/// request's `model` field, an Ollama tag and a metric label unquoted.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_MODEL_NAME_LEN
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// One model with its own settings: a config file's `models:` entry (or a
/// `--model-entry` JSON object). A setting left out takes the server-wide
/// flag's value.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct EntrySpec {
    pub name: Option<String>,
    /// A GGUF to load here; an entry has this or `upstream`.
    pub path: Option<PathBuf>,
    /// Servers to send its generation to, each as an `--upstream` value
    /// (`URL[,option=value]...`); several make a fleet for this one model.
    pub upstream: Option<OneOrMany>,
    /// With `upstream`: a GGUF whose chat template and vocabulary render
    /// and count prompts, as `--template-from`.
    pub template_from: Option<PathBuf>,
    /// With `upstream`: a built-in format, as `--template-format`.
    pub template_format: Option<String>,
    pub ctx_size: Option<u32>,
    pub parallel: Option<u32>,
    pub gpu_layers: Option<u32>,
    pub threads: Option<u32>,
    /// Other names requests may use for it.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Load it for `/v1/embeddings` and `/api/embed` only.
    #[serde(default)]
    pub embedding: bool,
    /// How an embedding model pools [default: what its GGUF declares].
    pub pooling: Option<PoolingArg>,
}

/// One value or a list of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(one) => vec![one.clone()],
            OneOrMany::Many(many) => many.clone(),
        }
    }
}

/// A `pooling:` value, as llama-server's `--pooling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolingArg {
    Mean,
    Cls,
    Last,
}

impl From<PoolingArg> for Pooling {
    fn from(arg: PoolingArg) -> Pooling {
        match arg {
            PoolingArg::Mean => Pooling::Mean,
            PoolingArg::Cls => Pooling::Cls,
            PoolingArg::Last => Pooling::Last,
        }
    }
}

impl EntrySpec {
    /// A `--model-entry` value, checked field by field.
    pub fn parse(json: &str) -> Result<EntrySpec, ConfigError> {
        let entry: EntrySpec =
            serde_json::from_str(json).map_err(|err| ConfigError(format!("models entry {json}: {err}")))?;
        let what = || {
            let path = entry.path.as_ref().map(|path| path.display().to_string());
            entry.name.clone().or(path).unwrap_or_default()
        };
        if let Some(name) = entry.name.as_deref().filter(|name| !valid_name(name)) {
            return Err(ConfigError(format!(
                "models entry: '{name}' is not a model name (letters, digits and ._:- only, at most {MAX_MODEL_NAME_LEN})"
            )));
        }
        if let Some(alias) = entry.aliases.iter().find(|alias| !valid_name(alias)) {
            return Err(ConfigError(format!(
                "models entry '{}': the alias '{alias}' is not a model name (letters, digits and ._:- only)",
                what()
            )));
        }
        match (&entry.path, &entry.upstream) {
            (Some(_), Some(_)) => {
                return Err(ConfigError(format!(
                    "models entry '{}': give `path` (a GGUF loaded here) or `upstream` (a server that runs the model), not both",
                    what()
                )))
            }
            (None, None) => {
                return Err(ConfigError(format!(
                    "models entry {json}: give `path` (a GGUF loaded here) or `upstream` (a server that runs the model)"
                )))
            }
            (None, Some(_)) => {
                // Settings of an engine this server does not run.
                let local = [
                    (entry.parallel.is_some(), "parallel"),
                    (entry.threads.is_some(), "threads"),
                    (entry.gpu_layers.is_some(), "gpu-layers"),
                    (entry.embedding, "embedding"),
                    (entry.pooling.is_some(), "pooling"),
                ];
                if let Some((_, key)) = local.iter().find(|(set, _)| *set) {
                    return Err(ConfigError(format!(
                        "models entry '{}': `{key}` applies to a model loaded here, and this one runs upstream",
                        what()
                    )));
                }
                if entry.name.is_none() {
                    return Err(ConfigError(format!(
                        "models entry {json}: an upstream entry needs a `name`, which requests use in their model field"
                    )));
                }
            }
            (Some(_), None) => {
                for (set, key) in
                    [(entry.template_from.is_some(), "template-from"), (entry.template_format.is_some(), "template-format")]
                {
                    if set {
                        return Err(ConfigError(format!(
                            "models entry '{}': `{key}` applies to an upstream entry; a model loaded here renders prompts with its own GGUF's template",
                            what()
                        )));
                    }
                }
            }
        }
        if entry.pooling.is_some() && !entry.embedding {
            return Err(ConfigError(format!(
                "models entry '{}': pooling applies to an embedding model; add `embedding: true` or drop `pooling`",
                what()
            )));
        }
        Ok(entry)
    }

    /// A `--model` value as an entry with no settings of its own.
    pub fn from_spec(spec: &str) -> EntrySpec {
        let (name, path) = parse_spec(spec);
        EntrySpec { name, path: Some(path), ..EntrySpec::default() }
    }
}

/// The GGUF files in `dir` (not its subfolders), sorted by name, as
/// (name, path): a split model (`-00001-of-00003.gguf`) is one model,
/// named without the split suffix and loaded from its first file, which
/// is how llama.cpp finds the rest.
pub fn scan_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>, ConfigError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|err| ConfigError(format!("--models-dir: cannot read {}: {err}", dir.display())))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(file) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let Some(stem) = file.strip_suffix(".gguf") else { continue };
        if !path.is_file() {
            continue;
        }
        let name = match split_part(stem) {
            Some((base, 1)) => base.to_string(),
            Some(_) => continue,
            None => stem.to_string(),
        };
        if !valid_name(&name) {
            return Err(ConfigError(format!(
                "--models-dir: the file {} gives the model name '{name}', which is not a valid name (letters, digits and ._:- only, at most {MAX_MODEL_NAME_LEN}); rename it or give it with --model NAME=PATH",
                path.display()
            )));
        }
        found.push((name, path));
    }
    found.sort();
    Ok(found)
}

/// `base-00002-of-00005` as (`base`, 2).
fn split_part(stem: &str) -> Option<(&str, u32)> {
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (base, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.chars().all(|c| c.is_ascii_digit());
    (digits(part) && digits(total)).then(|| (base, part.parse().unwrap_or(0)))
}

/// A size in bytes, with an optional binary suffix: `512M`, `8G`, `1T`
/// (`K`, `M`, `G`, `T`, with or without a trailing `iB` or `B`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let number_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let number: u64 = number.parse().map_err(|_| format!("'{text}' is not a size (write bytes, or 512M, 8G)"))?;
    let shift = match suffix.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("'{text}' is not a size (write bytes, or 512M, 8G)")),
    };
    number.checked_mul(1 << shift).ok_or_else(|| format!("'{text}' is too large"))
}

/// The host's memory in bytes.
fn host_memory() -> u64 {
    // SAFETY: sysconf only reads system facts.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        u64::MAX
    }
}

/// `--max-loaded-models`, `--models-memory` and `--model-idle-unload`.
pub fn limits(
    max_loaded: Option<usize>,
    memory: Option<&str>,
    idle_unload: Option<u64>,
) -> Result<ModelLimits, ConfigError> {
    let max_loaded = match max_loaded {
        Some(0) => return Err(ConfigError("--max-loaded-models must be at least 1".into())),
        Some(n) => n,
        None => DEFAULT_MAX_LOADED,
    };
    let memory_bytes = match memory {
        Some(text) => parse_bytes(text).map_err(|err| ConfigError(format!("--models-memory: {err}")))?,
        None => host_memory() / 100 * DEFAULT_MEMORY_PERCENT,
    };
    if memory_bytes == 0 {
        return Err(ConfigError("--models-memory must be more than 0 bytes".into()));
    }
    let idle_unload = match idle_unload {
        Some(0) => return Err(ConfigError("--model-idle-unload must be at least 1 second".into())),
        Some(seconds) => Some(std::time::Duration::from_secs(seconds)),
        None => None,
    };
    Ok(ModelLimits { max_loaded, memory_bytes, idle_unload })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_a_name_and_a_path_or_a_path() {
        assert_eq!(parse_spec("small=/m/a.gguf"), (Some("small".into()), PathBuf::from("/m/a.gguf")));
        assert_eq!(parse_spec("/m/a.gguf"), (None, PathBuf::from("/m/a.gguf")));
        // A path with `=` in it stays a path.
        assert_eq!(parse_spec("/m/x=y.gguf"), (None, PathBuf::from("/m/x=y.gguf")));
        assert_eq!(parse_spec("small="), (None, PathBuf::from("small=")));
        let longest = "n".repeat(MAX_MODEL_NAME_LEN);
        assert!(valid_name(&longest));
        assert!(!valid_name(&format!("{longest}n")));
        assert!(!valid_name(".hidden") && !valid_name("a b") && !valid_name(""));
    }

    #[test]
    fn a_models_folder_lists_each_gguf_once_and_a_split_model_by_its_first_part() {
        let dir = tempfile::tempdir().unwrap();
        for file in
            ["b.gguf", "a.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "notes.txt", "v-1-of-2.gguf"]
        {
            std::fs::write(dir.path().join(file), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub.gguf")).unwrap();
        let found = scan_dir(dir.path()).unwrap();
        let names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["a", "b", "big", "v-1-of-2"]);
        assert!(found[2].1.ends_with("big-00001-of-00002.gguf"));
        std::fs::write(dir.path().join("bad name.gguf"), b"").unwrap();
        assert!(scan_dir(dir.path()).unwrap_err().0.contains("not a valid name"));
        assert!(scan_dir(&dir.path().join("missing")).unwrap_err().0.contains("cannot read"));
    }

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("2gb").unwrap(), 2 << 30);
        assert!(parse_bytes("8X").is_err() && parse_bytes("G").is_err() && parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999T").unwrap_err().contains("too large"));
    }

    #[test]
    fn limits_refuse_zero_and_default_to_three_quarters_of_memory() {
        assert!(limits(Some(0), None, None).unwrap_err().0.contains("at least 1"));
        assert!(limits(None, Some("0"), None).unwrap_err().0.contains("more than 0"));
        assert!(limits(None, None, Some(0)).unwrap_err().0.contains("at least 1 second"));
        let defaults = limits(None, None, None).unwrap();
        assert_eq!(defaults.max_loaded, DEFAULT_MAX_LOADED);
        assert_eq!(defaults.memory_bytes, host_memory() / 100 * DEFAULT_MEMORY_PERCENT);
        let set = limits(Some(1), Some("1G"), Some(300)).unwrap();
        assert_eq!((set.max_loaded, set.memory_bytes), (1, 1 << 30));
        assert_eq!(set.idle_unload, Some(std::time::Duration::from_secs(300)));
    }
}
