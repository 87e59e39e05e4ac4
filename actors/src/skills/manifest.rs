//! Reading a SKILL.md: its YAML frontmatter and its body.
//!
//! Strict about the few things that make a skill unusable (no frontmatter,
//! invalid YAML, no description, no usable name); forgiving about everything
//! else, which loads with a warning. A skill three characters over a limit is
//! still a skill its user wants, and failing loudly at load beats failing
//! silently at inference.

use serde_yaml::Value as Yaml;

/// Longest legal skill name, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// Longest description the specification allows, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Longest compatibility note the specification allows, in characters.
pub const MAX_COMPATIBILITY_CHARS: usize = 500;

/// The keys the Agent Skills specification defines, then the governance
/// keys Claude Code's SKILL.md adds, which skills written for it carry.
const KNOWN_KEYS: [&str; 10] = [
    "name",
    "description",
    "license",
    "compatibility",
    "metadata",
    "allowed-tools",
    "disable-model-invocation",
    "user-invocable",
    "argument-hint",
    "model",
];
/// Longest argument hint kept, in characters (it is shown in listings).
pub const MAX_ARGUMENT_HINT_CHARS: usize = 200;

/// A parsed SKILL.md.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The skill's name: as written when legal, else normalized or taken
    /// from the directory.
    pub name: String,
    /// Collapsed onto one line.
    pub description: String,
    pub license: Option<String>,
    pub compatibility: Option<String>,
    /// String-to-string entries, in the order written.
    pub metadata: Vec<(String, String)>,
    /// The tools the skill may use once loaded: enforced for the rest of
    /// the turn that reads it (see `tools::allowed`).
    pub allowed_tools: Vec<String>,
    /// `disable-model-invocation: true`: for explicit use only. The model is
    /// never told of it, nor can it read it, unless a request selects it.
    pub disable_model_invocation: bool,
    /// `user-invocable: false`: not offered in the Web UI's picker or the
    /// chat CLI's `/skill` (the model may still use it).
    pub user_invocable: bool,
    /// `argument-hint`: what to type after the skill's name, shown in
    /// listings; this server passes a skill no arguments of its own.
    pub argument_hint: Option<String>,
    /// `model`: the model the skill asks for; this server runs one model,
    /// so it is reported and not applied.
    pub model: Option<String>,
    /// Keys the specification does not define, kept as written.
    pub extra: Vec<(String, serde_json::Value)>,
    /// Everything after the closing `---`: the instructions.
    pub body: String,
    /// What loaded but deviates from the specification.
    pub warnings: Vec<String>,
}

impl Manifest {
    /// What the governance keys say, one short phrase each, for the
    /// listings an operator or a user reads (`list-skills`, `/skills`).
    pub fn governance_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.disable_model_invocation {
            notes.push("explicit use only".to_string());
        }
        if !self.user_invocable {
            notes.push("not selectable".to_string());
        }
        if let Some(hint) = &self.argument_hint {
            notes.push(format!("arguments: {hint}"));
        }
        if !self.allowed_tools.is_empty() {
            notes.push(format!("allowed tools once loaded: {}", self.allowed_tools.join(" ")));
        }
        notes
    }
}

/// Whether `name` is a legal skill name: 1–64 of `a-z`, `0-9` and single
/// hyphens, not starting or ending with a hyphen.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// Turns any text into a legal name (`My PDF Tool` → `my-pdf-tool`), or
/// `None` when nothing usable remains.
pub fn normalize_name(raw: &str) -> Option<String> {
    let mut out = String::new();
    for c in raw.trim().chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed: String = out.trim_matches('-').chars().take(MAX_NAME_CHARS).collect();
    let trimmed = trimmed.trim_end_matches('-').to_string();
    (!trimmed.is_empty()).then_some(trimmed)
}

/// Why a SKILL.md cannot load at all (everything else loads with a
/// warning): the registry lists the skill among its errors while the others
/// load, and an upload is refused with this sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("SKILL.md does not start with a YAML frontmatter block ('---' on the first line)")]
    NoFrontmatter,
    #[error("SKILL.md's frontmatter block is not closed by a '---' line")]
    Unclosed,
    #[error("the frontmatter is not valid YAML: {0}")]
    Yaml(String),
    #[error("the frontmatter is not a YAML mapping of keys to values")]
    NotAMapping,
    #[error("the frontmatter has no description")]
    NoDescription,
    #[error("the description is not text")]
    DescriptionNotText,
    #[error("the description is empty")]
    EmptyDescription,
    /// No usable name, and no folder to take one from.
    #[error("{why}, and there is no directory name to use instead")]
    NoName { why: String },
    /// No usable name, and the folder's name cannot be made into one.
    #[error("{why}, and the directory name '{dir}' cannot be made into one")]
    NoNameFromDir { why: String, dir: String },
}

/// Splits a SKILL.md into frontmatter text and body.
fn split_frontmatter(text: &str) -> Result<(&str, &str), ManifestError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim_end() != "---" {
        return Err(ManifestError::NoFrontmatter);
    }
    let start = first.len();
    let mut offset = start;
    for line in lines {
        if line.trim_end() == "---" {
            let body = &text[offset + line.len()..];
            return Ok((&text[start..offset], body));
        }
        offset += line.len();
    }
    Err(ManifestError::Unclosed)
}

/// A YAML scalar as text; `None` for mappings, sequences and null.
fn scalar_text(value: &Yaml) -> Option<String> {
    match value {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Bool(b) => Some(b.to_string()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Tagged(tagged) => scalar_text(&tagged.value),
        Yaml::Null | Yaml::Sequence(_) | Yaml::Mapping(_) => None,
    }
}

/// Parses a SKILL.md. `dir_name` is the name of the directory holding it,
/// when there is one (an uploaded bare SKILL.md has none).
pub fn parse_manifest(text: &str, dir_name: Option<&str>) -> Result<Manifest, ManifestError> {
    let (frontmatter, body) = split_frontmatter(text)?;
    // serde_yaml refuses duplicate keys in a mapping, which is what we want:
    // a silent last-one-wins would load something the author did not mean.
    let yaml: Yaml = serde_yaml::from_str(frontmatter).map_err(|err| ManifestError::Yaml(err.to_string()))?;
    let mapping = match yaml {
        Yaml::Mapping(mapping) => mapping,
        Yaml::Null => serde_yaml::Mapping::new(),
        _ => return Err(ManifestError::NotAMapping),
    };
    let get = |key: &str| mapping.get(key).filter(|v| !v.is_null());
    let mut warnings = Vec::new();

    let description = match get("description").and_then(scalar_text) {
        Some(text) => text.split_whitespace().collect::<Vec<_>>().join(" "),
        None if get("description").is_some() => return Err(ManifestError::DescriptionNotText),
        None => return Err(ManifestError::NoDescription),
    };
    if description.is_empty() {
        return Err(ManifestError::EmptyDescription);
    }
    let description_chars = description.chars().count();
    if description_chars > MAX_DESCRIPTION_CHARS {
        warnings.push(format!(
            "the description is {description_chars} characters long; the specification allows {MAX_DESCRIPTION_CHARS}"
        ));
    }

    let name = resolve_name(get("name"), dir_name, &mut warnings)?;

    let license = match get("license") {
        None => None,
        Some(value) => match scalar_text(value) {
            Some(text) => Some(text.trim().to_string()),
            None => {
                warnings.push("the license is not text and was ignored".into());
                None
            }
        },
    };

    let compatibility = match get("compatibility") {
        None => None,
        Some(value) => match scalar_text(value) {
            Some(text) => {
                let text = text.trim().to_string();
                let chars = text.chars().count();
                if chars > MAX_COMPATIBILITY_CHARS {
                    warnings.push(format!(
                        "the compatibility note is {chars} characters long; the specification allows {MAX_COMPATIBILITY_CHARS}"
                    ));
                }
                Some(text)
            }
            None => {
                warnings.push("compatibility is not text and was ignored".into());
                None
            }
        },
    };

    let mut metadata = Vec::new();
    match get("metadata") {
        None => {}
        Some(Yaml::Mapping(entries)) => {
            for (key, value) in entries {
                match (key, value) {
                    (Yaml::String(key), Yaml::String(value)) => metadata.push((key.clone(), value.clone())),
                    (Yaml::String(key), _) => {
                        warnings.push(format!("metadata '{key}' is not a string and was dropped (quote it to keep it)"))
                    }
                    _ => warnings.push("metadata has a key that is not a string; that entry was dropped".into()),
                }
            }
        }
        Some(_) => warnings.push("metadata is not a mapping of strings to strings and was dropped".into()),
    }

    let allowed_tools = match get("allowed-tools") {
        None => Vec::new(),
        Some(Yaml::String(text)) => text.split_whitespace().map(str::to_string).collect(),
        Some(Yaml::Sequence(items)) => {
            let tools: Vec<String> = items.iter().filter_map(scalar_text).collect();
            if tools.len() != items.len() {
                warnings.push("allowed-tools has entries that are not text; they were dropped".into());
            }
            tools
        }
        Some(_) => {
            warnings.push("allowed-tools is neither a space-separated string nor a list and was ignored".into());
            Vec::new()
        }
    };

    let flag = |key: &str, default: bool, warnings: &mut Vec<String>| match get(key) {
        None => default,
        Some(Yaml::Bool(b)) => *b,
        Some(Yaml::String(text)) if text.trim().eq_ignore_ascii_case("true") => true,
        Some(Yaml::String(text)) if text.trim().eq_ignore_ascii_case("false") => false,
        Some(_) => {
            warnings.push(format!("{key} is not true or false and was ignored"));
            default
        }
    };
    let disable_model_invocation = flag("disable-model-invocation", false, &mut warnings);
    let user_invocable = flag("user-invocable", true, &mut warnings);
    let argument_hint = match get("argument-hint") {
        None => None,
        Some(value) => match scalar_text(value) {
            Some(text) => {
                let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
                Some(text.chars().take(MAX_ARGUMENT_HINT_CHARS).collect::<String>())
            }
            None => {
                warnings.push("argument-hint is not text and was ignored".into());
                None
            }
        },
    };
    let model = match get("model") {
        None => None,
        Some(value) => match scalar_text(value) {
            Some(text) => {
                // Claude Code switches models per skill; one server runs one.
                warnings.push(format!(
                    "model '{}' does not apply here: this server runs one model for every skill",
                    text.trim()
                ));
                Some(text.trim().to_string())
            }
            None => {
                warnings.push("model is not text and was ignored".into());
                None
            }
        },
    };

    let mut extra = Vec::new();
    for (key, value) in &mapping {
        let key_text = scalar_text(key).unwrap_or_default();
        if KNOWN_KEYS.contains(&key_text.as_str()) {
            continue;
        }
        warnings
            .push(format!("'{key_text}' is not a key the Agent Skills specification defines; it is kept as written"));
        extra.push((key_text, serde_json::to_value(value).unwrap_or(serde_json::Value::Null)));
    }

    let body = body.strip_prefix("\r\n").or_else(|| body.strip_prefix('\n')).unwrap_or(body).to_string();
    Ok(Manifest {
        name,
        description,
        license,
        compatibility,
        metadata,
        allowed_tools,
        disable_model_invocation,
        user_invocable,
        argument_hint,
        model,
        extra,
        body,
        warnings,
    })
}

/// The name to use, with warnings for every deviation.
fn resolve_name(
    value: Option<&Yaml>,
    dir_name: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<String, ManifestError> {
    let from_dir = |warnings: &mut Vec<String>, why: &str| -> Result<String, ManifestError> {
        let Some(dir) = dir_name else {
            return Err(ManifestError::NoName { why: why.to_string() });
        };
        if is_valid_name(dir) {
            warnings.push(format!("{why}; using the directory name '{dir}'"));
            return Ok(dir.to_string());
        }
        match normalize_name(dir) {
            Some(name) => {
                warnings.push(format!("{why}; using '{name}', made from the directory name '{dir}'"));
                Ok(name)
            }
            None => Err(ManifestError::NoNameFromDir { why: why.to_string(), dir: dir.to_string() }),
        }
    };
    let raw = match value {
        None => return from_dir(warnings, "the frontmatter has no name"),
        Some(value) => match scalar_text(value) {
            Some(text) if !text.trim().is_empty() => text,
            _ => return from_dir(warnings, "the name is not usable text"),
        },
    };
    let name = if is_valid_name(&raw) {
        raw
    } else {
        match normalize_name(&raw) {
            Some(name) => {
                warnings.push(format!(
                    "the name '{raw}' is not a valid skill name (lowercase a-z, 0-9 and single hyphens); using '{name}'"
                ));
                name
            }
            None => return from_dir(warnings, &format!("the name '{raw}' cannot be made into a valid skill name")),
        }
    };
    if let Some(dir) = dir_name {
        if dir != name {
            warnings.push(format!("the name '{name}' differs from its directory '{dir}'"));
        }
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn manifest(frontmatter: &str) -> String {
        format!("---\n{frontmatter}---\n# Body\n")
    }

    #[test]
    fn refusals() {
        let cases = [
            ("# No frontmatter\n".to_string(), "does not start with a YAML frontmatter block"),
            ("---\nname: a\ndescription: b\n".to_string(), "is not closed by a '---' line"),
            (manifest("name: [unclosed\ndescription: x\n"), "the frontmatter is not valid YAML"),
            (manifest("name: a\nname: b\ndescription: x\n"), "duplicate entry with key \"name\""),
            (manifest("- a\n- b\n"), "is not a YAML mapping"),
            (manifest("name: a\n"), "the frontmatter has no description"),
            (manifest("name: a\ndescription: \"  \"\n"), "the description is empty"),
            (manifest("name: a\ndescription: [x]\n"), "the description is not text"),
            (manifest(""), "the frontmatter has no description"),
        ];
        for (text, expected) in cases {
            match parse_manifest(&text, Some("a")) {
                Ok(m) => panic!("accepted {text:?}: {m:?}"),
                Err(err) => assert!(err.to_string().contains(expected), "{err:?} does not contain {expected:?}"),
            }
        }
        // No usable name and no directory to fall back on.
        let err = parse_manifest(&manifest("description: x\n"), None).unwrap_err();
        assert_eq!(err, ManifestError::NoName { why: "the frontmatter has no name".into() });
        assert_eq!(err.to_string(), "the frontmatter has no name, and there is no directory name to use instead");
        let err = parse_manifest(&manifest("name: \"!!!\"\ndescription: x\n"), Some("???")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the name '!!!' cannot be made into a valid skill name, and the directory name '???' cannot be made into one"
        );
    }

    /// (frontmatter, directory) -> (name, warnings)
    #[test]
    fn names_and_warnings() {
        let cases: Vec<(&str, Option<&str>, &str, Vec<&str>)> = vec![
            ("name: pdf\ndescription: x\n", Some("pdf"), "pdf", vec![]),
            ("name: pdf\ndescription: x\n", Some("pdf-tools"), "pdf", vec!["the name 'pdf' differs from its directory 'pdf-tools'"]),
            (
                "name: My PDF Tool\ndescription: x\n",
                Some("my-pdf-tool"),
                "my-pdf-tool",
                vec!["the name 'My PDF Tool' is not a valid skill name (lowercase a-z, 0-9 and single hyphens); using 'my-pdf-tool'"],
            ),
            ("description: x\n", Some("docs"), "docs", vec!["the frontmatter has no name; using the directory name 'docs'"]),
            (
                "description: x\n",
                Some("Data Tools"),
                "data-tools",
                vec!["the frontmatter has no name; using 'data-tools', made from the directory name 'Data Tools'"],
            ),
            ("name: pdf\ndescription: x\n", None, "pdf", vec![]),
            ("name: 42\ndescription: x\n", Some("42"), "42", vec![]),
        ];
        for (frontmatter, dir, name, warnings) in cases {
            let parsed = match parse_manifest(&manifest(frontmatter), dir) {
                Ok(m) => m,
                Err(err) => panic!("{frontmatter:?}: {err}"),
            };
            assert_eq!(
                (parsed.name.as_str(), parsed.warnings),
                (name, warnings.iter().map(|w| w.to_string()).collect())
            );
        }
    }

    #[test]
    fn normalization_examples() {
        let cases = [
            ("My PDF Tool", Some("my-pdf-tool")),
            ("--Data__Analysis--", Some("data-analysis")),
            ("pdf--processing", Some("pdf-processing")),
            ("Café Tool", Some("caf-tool")),
            ("!!!", None),
            (&"a".repeat(70), Some(&*"a".repeat(64))),
        ];
        for (raw, expected) in cases {
            assert_eq!(normalize_name(raw).as_deref(), expected, "{raw}");
        }
        for valid in ["pdf", "a", "data-analysis", "x1-2y", &"a".repeat(MAX_NAME_CHARS)] {
            assert!(is_valid_name(valid), "{valid}");
        }
        for invalid in ["", "PDF", "-pdf", "pdf-", "pdf--x", "pdf_x", "pdf x", &"a".repeat(MAX_NAME_CHARS + 1)] {
            assert!(!is_valid_name(invalid), "{invalid}");
        }
    }

    #[test]
    fn fields_limits_and_unknown_keys() {
        let at_limit = "é".repeat(MAX_DESCRIPTION_CHARS);
        let over = "é".repeat(MAX_DESCRIPTION_CHARS + 1);
        let compat_at = "c".repeat(MAX_COMPATIBILITY_CHARS);
        let compat_over = "c".repeat(MAX_COMPATIBILITY_CHARS + 1);
        let ok = parse_manifest(
            &manifest(&format!("name: a\ndescription: {at_limit}\ncompatibility: {compat_at}\n")),
            Some("a"),
        );
        assert_eq!(ok.map(|m| m.warnings), Ok(vec![]));
        let over = parse_manifest(
            &manifest(&format!("name: a\ndescription: {over}\ncompatibility: {compat_over}\n")),
            Some("a"),
        );
        assert_eq!(
            over.map(|m| m.warnings),
            Ok(vec![
                "the description is 1025 characters long; the specification allows 1024".to_string(),
                "the compatibility note is 501 characters long; the specification allows 500".to_string(),
            ])
        );

        let text = manifest(concat!(
            "name: pdf\n",
            "description: >-\n  Extract text\n  and tables.\n",
            "license: Apache-2.0\n",
            "metadata:\n  version: \"1.2\"\n  build: 7\n  author: me\n",
            "allowed-tools: Bash(git:*)  Read\n",
            "disable-model-invocation: true\n",
            "argument-hint: \"[file]\"\n",
        ));
        let parsed = match parse_manifest(&text, Some("pdf")) {
            Ok(m) => m,
            Err(err) => panic!("{err}"),
        };
        assert_eq!(parsed.description, "Extract text and tables.");
        assert_eq!(parsed.license.as_deref(), Some("Apache-2.0"));
        assert_eq!(parsed.metadata, vec![("version".into(), "1.2".into()), ("author".into(), "me".into())]);
        assert_eq!(parsed.allowed_tools, vec!["Bash(git:*)".to_string(), "Read".to_string()]);
        assert!(parsed.extra.is_empty(), "{:?}", parsed.extra);
        assert!(parsed.disable_model_invocation && parsed.user_invocable);
        assert_eq!(parsed.argument_hint.as_deref(), Some("[file]"));
        assert_eq!(parsed.warnings, vec!["metadata 'build' is not a string and was dropped (quote it to keep it)"]);
        assert_eq!(parsed.body, "# Body\n");

        let literal = parse_manifest(&manifest("name: a\ndescription: |\n  line one\n  line two\nallowed-tools:\n  - Read\n  - Write\nmetadata: just text\n"), Some("a"));
        let literal = literal.unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(literal.description, "line one line two");
        assert_eq!(literal.allowed_tools, vec!["Read".to_string(), "Write".to_string()]);
        assert_eq!(
            literal.warnings,
            vec!["metadata is not a mapping of strings to strings and was dropped".to_string()]
        );
    }

    #[test]
    fn governance_keys() {
        let text = manifest(concat!(
            "name: deploy\ndescription: Ships it.\n",
            "disable-model-invocation: \"true\"\nuser-invocable: false\n",
            "model: claude-opus-4\nx-team: infra\n",
        ));
        let parsed = parse_manifest(&text, Some("deploy")).unwrap_or_else(|err| panic!("{err}"));
        assert!(parsed.disable_model_invocation);
        assert!(!parsed.user_invocable);
        assert_eq!(parsed.model.as_deref(), Some("claude-opus-4"));
        assert_eq!(parsed.governance_notes(), vec!["explicit use only", "not selectable"]);
        // Unknown keys stay in `extra`, as before; the governance keys do not.
        assert_eq!(parsed.extra, vec![("x-team".to_string(), serde_json::json!("infra"))]);
        assert_eq!(
            parsed.warnings,
            vec![
                "model 'claude-opus-4' does not apply here: this server runs one model for every skill",
                "'x-team' is not a key the Agent Skills specification defines; it is kept as written",
            ]
        );

        // A flag that is not a boolean is ignored with a warning, not a refusal.
        let odd = manifest("name: a\ndescription: x\ndisable-model-invocation: sometimes\nuser-invocable: [1]\n");
        let odd = parse_manifest(&odd, Some("a")).unwrap_or_else(|err| panic!("{err}"));
        assert!(!odd.disable_model_invocation && odd.user_invocable);
        assert_eq!(
            odd.warnings,
            vec![
                "disable-model-invocation is not true or false and was ignored",
                "user-invocable is not true or false and was ignored"
            ]
        );

        // The hint is shown in listings: kept on one line, cut at the limit.
        let at = "h".repeat(MAX_ARGUMENT_HINT_CHARS);
        let over = format!("{at}h");
        for (hint, kept) in [(&at, &at), (&over, &at)] {
            let text = manifest(&format!("name: a\ndescription: x\nargument-hint: {hint}\n"));
            let parsed = parse_manifest(&text, Some("a")).unwrap_or_else(|err| panic!("{err}"));
            assert_eq!(parsed.argument_hint.as_ref(), Some(kept));
        }
    }

    #[test]
    fn crlf_and_bom() {
        let text = "\u{feff}---\r\nname: a\r\ndescription: x\r\n---\r\nBody\r\n";
        let parsed = parse_manifest(text, Some("a")).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((parsed.name.as_str(), parsed.body.as_str()), ("a", "Body\r\n"));
    }
}
