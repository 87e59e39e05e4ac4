//! The Agent Skills discovery index: `/.well-known/agent-skills/index.json`
//! as the draft (version 0.2.0) shapes it. This server publishes the skills
//! the operator names (`--skills-publish`), each as a ZIP archive at a
//! stable URL with its digest, and `skillhost skills add https://host`
//! reads another server's index and installs every entry after checking
//! its digest.
//!
//! A published archive is packed once per loaded skill and kept, so the
//! digest the index gives is the digest of the bytes the archive route
//! serves, even if the folder changes on disk before the next rescan.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::install::MAX_ARCHIVE_BYTES;
use super::skill::Skill;
use crate::path_guard;

/// The schema URL of the draft this index follows.
pub const SCHEMA: &str = "https://schemas.agentskills.io/discovery/0.2.0/schema.json";
/// Where the index lives on a server.
pub const INDEX_PATH: &str = "/.well-known/agent-skills/index.json";
/// Where a published skill's archive lives: `{ARCHIVE_PREFIX}{name}.zip`.
pub const ARCHIVE_PREFIX: &str = "/.well-known/agent-skills/";
/// Most entries read from another server's index.
pub const MAX_INDEX_ENTRIES: usize = 1000;

/// The index document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// Absent in the draft's first version, which had no digests.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    pub skills: Vec<Entry>,
}

/// One skill in the index. Fields the draft may add later are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    /// `archive` (a ZIP or tar.gz of the skill folder) or `skill-md` (the
    /// SKILL.md alone).
    #[serde(rename = "type")]
    pub kind: String,
    pub description: String,
    /// The artifact, absolute or relative to the index's own URL.
    pub url: String,
    /// `sha256:<hex>` of the artifact's bytes.
    pub digest: String,
}

/// What an entry's artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Artifact {
    Zip,
    SkillMd,
}

impl Entry {
    /// What this entry holds, or why it cannot be installed here.
    pub fn artifact(&self) -> Result<Artifact, String> {
        match self.kind.as_str() {
            "skill-md" => Ok(Artifact::SkillMd),
            "archive" => {
                let path = self.url.split(['?', '#']).next().unwrap_or_default().to_ascii_lowercase();
                if path.ends_with(".zip") {
                    Ok(Artifact::Zip)
                } else {
                    Err(format!(
                        "'{}' is published as {}, and only .zip archives (or a lone SKILL.md) install here",
                        self.name, self.url
                    ))
                }
            }
            other => Err(format!("'{}' has the type '{other}'; the draft knows 'archive' and 'skill-md'", self.name)),
        }
    }
}

/// Reads another server's index: the draft's 0.2 schema, at most
/// [`MAX_INDEX_ENTRIES`] entries.
pub fn parse_index(bytes: &[u8]) -> Result<Index, String> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|err| format!("the index is not JSON: {err}"))?;
    // The version first: an older draft's entries have other fields.
    match value.get("$schema").and_then(|s| s.as_str()) {
        Some(schema) if schema.contains("/discovery/0.2.") => {}
        Some(schema) => {
            return Err(format!("the index follows {schema}; this server reads the draft's version 0.2 ({SCHEMA})"))
        }
        None => {
            return Err(format!(
                "the index names no $schema, so it is the draft's first version, which has no digests; every entry's digest is checked, so it cannot be installed from (expected {SCHEMA})"
            ))
        }
    }
    let index: Index = serde_json::from_value(value)
        .map_err(|err| format!("the index does not follow the draft's 0.2 shape: {err}"))?;
    if index.skills.len() > MAX_INDEX_ENTRIES {
        return Err(format!("the index lists {} skills; at most {MAX_INDEX_ENTRIES} are read", index.skills.len()));
    }
    Ok(index)
}

/// Which registered skills the index lists (`--skills-publish`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Publish {
    /// Nothing: the index and archives answer 404.
    #[default]
    Nothing,
    Everything,
    Only(BTreeSet<String>),
}

impl Publish {
    /// From the flag's list: `all` (or `*`) for every skill, else names.
    pub fn from_names(names: &[String]) -> Publish {
        let names: BTreeSet<String> = names.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        if names.is_empty() {
            Publish::Nothing
        } else if names.contains("all") || names.contains("*") {
            Publish::Everything
        } else {
            Publish::Only(names)
        }
    }

    pub fn is_on(&self) -> bool {
        *self != Publish::Nothing
    }

    pub fn includes(&self, name: &str) -> bool {
        match self {
            Publish::Nothing => false,
            Publish::Everything => true,
            Publish::Only(names) => names.contains(name),
        }
    }
}

/// A published skill's archive and its digest.
#[derive(Debug)]
pub struct Packed {
    pub zip: bytes::Bytes,
    /// `sha256:<hex>`.
    pub digest: String,
}

/// A packed archive and the loaded skill it was packed from.
type Kept = (Weak<Skill>, Arc<Packed>);

/// Packed archives, one per loaded skill: a rescan that loads a skill anew
/// packs it anew.
#[derive(Debug, Default)]
pub struct Packs {
    by_name: Mutex<HashMap<String, Kept>>,
}

impl Packs {
    /// The archive of `skill` as loaded, packed on first use.
    pub fn get(&self, skill: &Arc<Skill>) -> Result<Arc<Packed>, String> {
        let name = skill.id().to_string();
        if let Some((loaded, packed)) = self.lock().get(&name) {
            if loaded.upgrade().is_some_and(|loaded| Arc::ptr_eq(&loaded, skill)) {
                return Ok(Arc::clone(packed));
            }
        }
        let packed = Arc::new(pack_with_digest(skill)?);
        self.lock().insert(name, (Arc::downgrade(skill), Arc::clone(&packed)));
        Ok(packed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.by_name.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A skill folder as a ZIP whose bytes depend only on the files: entries in
/// path order, one fixed time, modes reduced to 644 or 755. Every file is
/// read through the path guard, so a link inside the folder never packs
/// what lies outside it.
pub fn pack(skill: &Skill) -> Result<Vec<u8>, String> {
    let mut paths: Vec<&str> = std::iter::once("SKILL.md").chain(skill.files.iter().map(|f| f.path.as_str())).collect();
    paths.sort_unstable();
    paths.dedup();
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let mut total = 0u64;
    let failed =
        |path: &str, err: &dyn std::fmt::Display| format!("'{path}' of '{}' cannot be packed: {err}", skill.id());
    for path in paths {
        let opened = path_guard::open_file(&skill.root, path).map_err(|err| failed(path, &err))?;
        total += opened.len;
        if total > MAX_ARCHIVE_BYTES {
            return Err(format!(
                "'{}' holds more than {MAX_ARCHIVE_BYTES} bytes; it is too large to publish",
                skill.id()
            ));
        }
        let executable =
            opened.file.metadata().map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .last_modified_time(zip::DateTime::default())
            .unix_permissions(if executable.unwrap_or(false) { 0o755 } else { 0o644 });
        zip.start_file(path, options).map_err(|err| failed(path, &err))?;
        let mut contents = Vec::with_capacity(opened.len as usize);
        opened.file.take(opened.len).read_to_end(&mut contents).map_err(|err| failed(path, &err))?;
        zip.write_all(&contents).map_err(|err| failed(path, &err))?;
    }
    let bytes = zip.finish().map_err(|err| format!("'{}' cannot be packed: {err}", skill.id()))?.into_inner();
    Ok(bytes)
}

fn pack_with_digest(skill: &Skill) -> Result<Packed, String> {
    let zip = pack(skill)?;
    let digest = format!("sha256:{:x}", sha2::Sha256::digest(&zip));
    Ok(Packed { zip: zip.into(), digest })
}

/// The index entry of a published skill; its archive URL is relative to
/// the index, as the draft allows.
pub fn entry(skill: &Skill, packed: &Packed) -> Entry {
    Entry {
        name: skill.id().to_string(),
        kind: "archive".into(),
        description: skill.manifest.description.clone(),
        url: format!("{ARCHIVE_PREFIX}{}.zip", skill.id()),
        digest: packed.digest.clone(),
    }
}

/// A lone SKILL.md as a one-entry ZIP, so it installs through the same
/// guards as any archive.
pub fn zip_skill_md(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().unix_permissions(0o644);
    zip.start_file("SKILL.md", options).map_err(|err| err.to_string())?;
    zip.write_all(text).map_err(|err| err.to_string())?;
    Ok(zip.finish().map_err(|err| err.to_string())?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skills::registry::skip_set;
    use crate::skills::skill::{load_skill, Origin};

    fn skill(dir: &std::path::Path) -> Arc<Skill> {
        Arc::new(load_skill(dir, Origin::Discovered, &skip_set()).unwrap())
    }

    #[test]
    fn a_packed_skill_depends_only_on_its_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("SKILL.md"), "---\nname: demo\ndescription: d\n---\nbody\n").unwrap();
        std::fs::create_dir(dir.path().join("scripts")).unwrap();
        std::fs::write(dir.path().join("scripts/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
        let first = pack(&skill(dir.path())).unwrap();
        // Touching a file changes its time, never the archive.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        std::fs::File::options().write(true).open(dir.path().join("SKILL.md")).unwrap().set_modified(later).unwrap();
        assert_eq!(pack(&skill(dir.path())).unwrap(), first);
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(first)).unwrap();
        let names: Vec<&str> = archive.file_names().collect();
        assert_eq!(names.len(), 2);
        assert!(archive.by_name("scripts/run.sh").is_ok());
    }

    #[test]
    fn packs_are_kept_per_loaded_skill() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("SKILL.md"), "---\nname: demo\ndescription: d\n---\none\n").unwrap();
        let packs = Packs::default();
        let loaded = skill(dir.path());
        let first = packs.get(&loaded).unwrap();
        std::fs::write(dir.path().join("SKILL.md"), "---\nname: demo\ndescription: d\n---\ntwo\n").unwrap();
        // Until the skill loads again, the index and the archive agree.
        assert_eq!(packs.get(&loaded).unwrap().digest, first.digest);
        let reloaded = skill(dir.path());
        assert_ne!(packs.get(&reloaded).unwrap().digest, first.digest);
    }

    #[test]
    fn the_index_must_be_the_drafts_second_version() {
        let entry = r#"{"name":"a","type":"archive","description":"d","url":"a.zip","digest":"sha256:00"}"#;
        let good = format!(r#"{{"$schema":"{SCHEMA}","skills":[{entry}],"extra":1}}"#);
        assert_eq!(parse_index(good.as_bytes()).unwrap().skills.len(), 1);
        let first_draft = r#"{"skills":[{"name":"a","description":"d","files":["SKILL.md"]}]}"#;
        assert!(parse_index(first_draft.as_bytes()).unwrap_err().contains("first version"));
        let newer =
            format!(r#"{{"$schema":"https://schemas.agentskills.io/discovery/1.0.0/schema.json","skills":[{entry}]}}"#);
        assert!(parse_index(newer.as_bytes()).unwrap_err().contains("0.2"));
    }

    #[test]
    fn the_entry_limit_holds_at_the_limit_and_one_past_it() {
        let entry = r#"{"name":"a","type":"archive","description":"d","url":"a.zip","digest":"sha256:00"}"#;
        let index = |n: usize| format!(r#"{{"$schema":"{SCHEMA}","skills":[{}]}}"#, vec![entry; n].join(","));
        assert!(parse_index(index(MAX_INDEX_ENTRIES).as_bytes()).is_ok());
        assert!(parse_index(index(MAX_INDEX_ENTRIES + 1).as_bytes()).is_err());
    }

    #[test]
    fn only_zip_archives_and_lone_skill_files_install() {
        let entry = |kind: &str, url: &str| Entry {
            name: "a".into(),
            kind: kind.into(),
            description: String::new(),
            url: url.into(),
            digest: String::new(),
        };
        assert_eq!(entry("archive", "/x/a.zip?v=2").artifact(), Ok(Artifact::Zip));
        assert_eq!(entry("skill-md", "/x/a/SKILL.md").artifact(), Ok(Artifact::SkillMd));
        assert!(entry("archive", "/x/a.tar.gz").artifact().unwrap_err().contains(".zip"));
        assert!(entry("plugin", "/x/a").artifact().is_err());
    }
}
