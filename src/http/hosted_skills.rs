//! Skills selected the way the hosted APIs select them, translated into
//! this server's `skills` and `skills_inline`:
//!
//! - Responses: a `shell` tool whose `environment` (`container_auto`) lists
//!   `skill_reference`s (by id and version) and `inline` skills (a base64
//!   ZIP). Commands run in this server's own sandbox, so no `shell_call`
//!   reaches the client; the tool only says which skills the turn has.
//! - Messages: `container.skills`, each `{type, skill_id, version}`, and
//!   the same `inline` form as Responses (Anthropic has none of its own).
//!
//! Where this server's model differs, a 400 names the field: a version
//! other than the one that runs, or a container to reuse. A `shell` tool
//! the client runs itself (no environment, or `local`) is not ours to read:
//! it is a hosted tool like any other (see `responses`).

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use serde_json::Value;
use skillhost_actors::skills::inline::{MAX_INLINE_BYTES, MAX_INLINE_FILES};
use skillhost_actors::skills::Origin;
use skillhost_actors::SkillsHandle;

use crate::http::error::ApiError;
use crate::http::openai::WireInlineSkill;

/// What a request's hosted-style skill fields select.
#[derive(Debug, Default)]
pub(crate) struct Selected {
    pub(crate) skills: Vec<String>,
    pub(crate) inline: Vec<WireInlineSkill>,
}

/// Refuses a version other than the one a turn would run: the default
/// (live) version of an installed skill. `latest` and no version pass.
fn check_version(skills: Option<&SkillsHandle>, at: &str, id: &str, version: Option<&str>) -> Result<(), ApiError> {
    let Some(asked) = version.map(str::trim).filter(|v| !v.is_empty() && *v != "latest") else { return Ok(()) };
    let Some(skills) = skills else { return Ok(()) };
    let snapshot = skills.snapshot();
    let Some(skill) = snapshot.get(id) else { return Ok(()) };
    let live = match skill.origin {
        Origin::Installed => skills.versions(id).ok().and_then(|h| h.current),
        Origin::Discovered | Origin::Request => None,
    };
    match live {
        Some(live) if asked == live.to_string() => Ok(()),
        Some(live) => Err(ApiError::bad_param(
            at,
            format!("'{at}' asks for version {asked} of '{id}', but a turn here runs a skill's default version ({live}); make {asked} the default with POST /v1/skills/{id}, or send 'latest'"),
        )),
        None => Err(ApiError::bad_param(
            at,
            format!("'{at}' asks for version {asked} of '{id}', which comes from the operator's folders and has no versions here; send 'latest' or leave the version out"),
        )),
    }
}

fn text<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field).and_then(Value::as_str)
}

/// Whether a Responses `shell` tool runs in a hosted container (which
/// this server's sandbox stands in for), not on the client's machine.
pub(crate) fn is_container(tool: &Value) -> bool {
    tool.get("environment")
        .and_then(|e| text(e, "type"))
        .is_some_and(|kind| kind == "container_auto" || kind == "container_reference")
}

/// The `environment` of a Responses `shell` tool at `at`.
pub(crate) fn shell_environment(
    tool: &Value,
    at: &str,
    skills: Option<&SkillsHandle>,
    into: &mut Selected,
) -> Result<(), ApiError> {
    let Some(environment) = tool.get("environment").filter(|e| !e.is_null()) else { return Ok(()) };
    let at = format!("{at}.environment");
    match text(environment, "type") {
        Some("container_auto") => {}
        Some("container_reference") => {
            return Err(ApiError::bad_param(
                &at,
                format!("'{at}' reuses a container; commands here run in a fresh sandbox for each request, so send {{\"type\": \"container_auto\"}}"),
            ))
        }
        other => {
            return Err(ApiError::bad_param(
                &format!("{at}.type"),
                format!("'{at}.type' must be container_auto, got {}", other.unwrap_or("nothing")),
            ))
        }
    }
    for field in ["file_ids", "network_policy", "memory_limit"] {
        if environment.get(field).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad_param(
                &format!("{at}.{field}"),
                format!("'{at}.{field}' is not supported here: the operator's sandbox settings decide files, network and memory"),
            ));
        }
    }
    let Some(list) = environment.get("skills").filter(|s| !s.is_null()) else { return Ok(()) };
    let Some(list) = list.as_array() else {
        return Err(ApiError::bad_param(&format!("{at}.skills"), format!("'{at}.skills' must be a list")));
    };
    for (n, skill) in list.iter().enumerate() {
        let at = format!("{at}.skills[{n}]");
        match text(skill, "type") {
            Some("skill_reference") => {
                let Some(id) = text(skill, "skill_id") else {
                    return Err(ApiError::bad_param(&format!("{at}.skill_id"), format!("'{at}' needs a 'skill_id'")));
                };
                check_version(skills, &format!("{at}.version"), id, text(skill, "version"))?;
                into.skills.push(id.to_string());
            }
            Some("inline") => into.inline.push(inline(skill, &at)?),
            other => {
                return Err(ApiError::bad_param(
                    &format!("{at}.type"),
                    format!("'{at}.type' must be skill_reference or inline, got {}", other.unwrap_or("nothing")),
                ))
            }
        }
    }
    Ok(())
}

/// The `container` of a Messages request.
pub(crate) fn container(container: &Value, skills: Option<&SkillsHandle>) -> Result<Selected, ApiError> {
    let mut selected = Selected::default();
    if container.is_string() || container.get("id").is_some_and(|id| !id.is_null()) {
        return Err(ApiError::bad_param(
            "container",
            "'container' names a container to reuse; commands here run in a fresh sandbox for each request, so send only {\"skills\": […]}",
        ));
    }
    let Some(list) = container.get("skills").filter(|s| !s.is_null()) else { return Ok(selected) };
    let Some(list) = list.as_array() else {
        return Err(ApiError::bad_param("container.skills", "'container.skills' must be a list"));
    };
    for (n, skill) in list.iter().enumerate() {
        let at = format!("container.skills[{n}]");
        match text(skill, "type") {
            // Anthropic's own skills (pptx, xlsx, docx, pdf) are selected by
            // id like any other: they run here when the operator installed
            // a skill of that name.
            Some("custom" | "anthropic") => {}
            // Anthropic has no inline form; this one is the Responses
            // shell tool's, so a repository's skills can come with a
            // Messages request too.
            Some("inline") => {
                selected.inline.push(inline(skill, &at)?);
                continue;
            }
            other => {
                return Err(ApiError::bad_param(
                    &format!("{at}.type"),
                    format!("'{at}.type' must be custom, anthropic or inline, got {}", other.unwrap_or("nothing")),
                ))
            }
        }
        let Some(id) = text(skill, "skill_id") else {
            return Err(ApiError::bad_param(&format!("{at}.skill_id"), format!("'{at}' needs a 'skill_id'")));
        };
        check_version(skills, &format!("{at}.version"), id, text(skill, "version"))?;
        selected.skills.push(id.to_string());
    }
    Ok(selected)
}

/// An `inline` skill: `{name, source: {type: base64, media_type:
/// application/zip, data}}`.
fn inline(skill: &Value, at: &str) -> Result<WireInlineSkill, ApiError> {
    let (Some(name), Some(source)) = (text(skill, "name"), skill.get("source")) else {
        return Err(ApiError::bad_param(at, format!("'{at}' needs a 'name' and a 'source'")));
    };
    if text(source, "type") != Some("base64") || text(source, "media_type") != Some("application/zip") {
        return Err(ApiError::bad_param(
            &format!("{at}.source"),
            format!("'{at}.source' must be {{\"type\": \"base64\", \"media_type\": \"application/zip\", \"data\": …}}"),
        ));
    }
    let files = unzip_text(text(source, "data").unwrap_or_default(), &format!("{at}.source.data"))?;
    Ok(WireInlineSkill { name: name.to_string(), files })
}

/// An inline skill's base64 ZIP as its files' text, bounded as
/// `skills_inline` is: at most [`MAX_INLINE_FILES`] files and
/// [`MAX_INLINE_BYTES`] in all, counted as they are inflated. One folder
/// around the whole skill is taken off. The paths are checked where
/// `skills_inline`'s are, when the files are written.
fn unzip_text(data: &str, at: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let refuse = |why: String| ApiError::bad_param(at, format!("'{at}' {why}"));
    if data.len() > MAX_INLINE_BYTES / 3 * 4 + 4 {
        return Err(refuse(format!("is larger than the limit of {MAX_INLINE_BYTES} bytes for a request's skills")));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|err| refuse(format!("is not base64: {err}")))?;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|err| refuse(format!("is not a readable ZIP archive: {err}")))?;
    if zip.len() > MAX_INLINE_FILES {
        return Err(refuse(format!("holds {} entries; at most {MAX_INLINE_FILES} files are accepted", zip.len())));
    }
    let mut files = BTreeMap::new();
    let mut total = 0usize;
    for index in 0..zip.len() {
        let entry = zip.by_index(index).map_err(|err| refuse(format!("has an unreadable entry: {err}")))?;
        if entry.is_dir() {
            continue;
        }
        let name = entry.name().to_string();
        let mut text = String::new();
        let room = (MAX_INLINE_BYTES - total) as u64;
        // One byte past the room tells an entry that does not fit, whatever
        // size its header claims.
        entry
            .take(room + 1)
            .read_to_string(&mut text)
            .map_err(|_| refuse(format!("holds '{name}', which is not UTF-8 text; inline skills carry text files")))?;
        total += text.len();
        if total > MAX_INLINE_BYTES {
            return Err(refuse(format!("inflates past the limit of {MAX_INLINE_BYTES} bytes for a request's skills")));
        }
        files.insert(name, text);
    }
    // `folder/SKILL.md` and everything else under `folder/`: the skill is
    // the folder.
    let top = files.keys().next().and_then(|first| first.split_once('/')).map(|(top, _)| format!("{top}/"));
    if let Some(top) = top.filter(|top| {
        !files.contains_key("SKILL.md")
            && files.contains_key(&format!("{top}SKILL.md"))
            && files.keys().all(|k| k.starts_with(top.as_str()))
    }) {
        files = files.into_iter().map(|(k, v)| (k[top.len()..].to_string(), v)).collect();
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zip_of(files: &[(&str, &[u8])]) -> String {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for (name, bytes) in files {
            zip.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
            zip.write_all(bytes).unwrap();
        }
        base64::engine::general_purpose::STANDARD.encode(zip.finish().unwrap().into_inner())
    }

    #[test]
    fn an_inline_zip_becomes_text_files_with_its_folder_taken_off() {
        let data = zip_of(&[("style/SKILL.md", b"---\nname: style\n---\n"), ("style/notes.md", b"tabs")]);
        let files = unzip_text(&data, "x").unwrap();
        assert_eq!(files.keys().collect::<Vec<_>>(), ["SKILL.md", "notes.md"]);
        let binary = zip_of(&[("SKILL.md", b"ok"), ("logo.png", &[0x89, 0x50, 0xff, 0xfe])]);
        assert!(unzip_text(&binary, "x").unwrap_err().to_string().contains("not UTF-8 text"));
        assert!(unzip_text("%%%", "x").unwrap_err().to_string().contains("not base64"));
    }

    #[test]
    fn the_inflated_size_holds_at_the_limit_and_one_past_it() {
        let at = vec![b'a'; MAX_INLINE_BYTES - 2];
        assert!(unzip_text(&zip_of(&[("SKILL.md", b"ok"), ("big.md", &at)]), "x").is_ok());
        let past = vec![b'a'; MAX_INLINE_BYTES - 1];
        assert!(unzip_text(&zip_of(&[("SKILL.md", b"ok"), ("big.md", &past)]), "x").is_err());
    }

    #[test]
    fn the_file_count_holds_at_the_limit_and_one_past_it() {
        let names: Vec<String> = (0..MAX_INLINE_FILES).map(|n| format!("f{n}.md")).collect();
        let mut files: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"x"[..])).collect();
        assert!(unzip_text(&zip_of(&files), "x").is_ok());
        files.push(("one-more.md", b"x"));
        assert!(unzip_text(&zip_of(&files), "x").unwrap_err().to_string().contains("entries"));
    }
}
