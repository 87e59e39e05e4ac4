//! Installed skills keep their versions, and a reader never sees a half
//! replaced skill.
//!
//! The install folder holds, for each installed skill:
//!
//! ```text
//! <install>/<name>                     a link to the live version: .versions/<name>/<n>
//! <install>/.versions/<name>/<n>/      one folder per install, never written again
//! <install>/.versions/<name>/<n>.json  its record: digest, time, size
//! ```
//!
//! An install extracts into a new version folder and then swaps the link
//! with one `rename`, which the kernel does atomically, so a scan or a read
//! by name finds the old version or the new one, never a mix and never
//! nothing. The registry loads a skill from its canonical folder, the
//! version's own, so a turn that started on version 3 goes on reading
//! version 3 while version 4 goes live. A version that leaves the history
//! (pruned past `--skills-keep-versions`, or its skill deleted) loses its
//! record at once and its folder once no snapshot a turn holds names it
//! (see `SkillsState::sweep`).
//!
//! Everything here is under the install folder, which only the server
//! writes; the names come from a skill that loaded (its manifest's name
//! passed the spec's rules: lowercase letters, digits and hyphens), and
//! versions are numbers this module makes.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Previous versions an installed skill keeps by default.
pub const DEFAULT_KEEP_VERSIONS: usize = 5;
/// The most `--skills-keep-versions` accepts: each version is a full copy.
pub const MAX_KEEP_VERSIONS: usize = 100;
/// The folder of the install folder that holds every version.
pub const VERSIONS_DIR: &str = ".versions";
/// The name a new link has before it replaces the live one.
const LINK_PREFIX: &str = ".link-";

/// One version of an installed skill, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub version: u32,
    /// `sha256:<hex>` of the archive it was installed from; `None` for a
    /// folder that was put there by hand and adopted.
    pub digest: Option<String>,
    /// Unix seconds.
    pub installed_at: u64,
    /// The skill's bytes, SKILL.md included.
    pub bytes: u64,
}

/// A skill's versions, the newest first, and which one is live.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub current: Option<u32>,
    pub versions: Vec<Version>,
}

fn versions_of(install_dir: &Path, name: &str) -> PathBuf {
    install_dir.join(VERSIONS_DIR).join(name)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The folder of one version of `name`.
pub fn folder(install_dir: &Path, name: &str, version: u32) -> PathBuf {
    versions_of(install_dir, name).join(version.to_string())
}

/// The version the live link names, if it is one of ours.
pub fn current(install_dir: &Path, name: &str) -> Option<u32> {
    let target = std::fs::read_link(install_dir.join(name)).ok()?;
    let expected = Path::new(VERSIONS_DIR).join(name);
    let number = target.strip_prefix(&expected).ok()?.to_str()?;
    number.parse().ok()
}

/// Every recorded version of `name`, the newest first.
pub fn history(install_dir: &Path, name: &str) -> History {
    let mut versions: Vec<Version> = std::fs::read_dir(versions_of(install_dir, name))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|entry| serde_json::from_slice::<Version>(&std::fs::read(entry.path()).ok()?).ok())
        .collect();
    versions.sort_by_key(|v| std::cmp::Reverse(v.version));
    History { current: current(install_dir, name), versions }
}

/// The number the next version of `name` gets: past every folder and
/// record there is, so a number is never reused, even for a folder still
/// waiting to be removed.
fn next_version(install_dir: &Path, name: &str) -> u32 {
    std::fs::read_dir(versions_of(install_dir, name))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.trim_end_matches(".json").parse::<u32>().ok())
        .max()
        .map_or(1, |n| n + 1)
}

fn write_record(install_dir: &Path, name: &str, record: &Version) -> std::io::Result<()> {
    let dir = versions_of(install_dir, name);
    let mut staged = tempfile::Builder::new().prefix(".record-").tempfile_in(&dir)?;
    staged.write_all(&serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?)?;
    staged.persist(dir.join(format!("{}.json", record.version))).map_err(|err| err.error)?;
    Ok(())
}

/// Makes the live link of `name` name `version`, replacing the old link in
/// one step.
pub fn point(install_dir: &Path, name: &str, version: u32) -> std::io::Result<()> {
    let target = Path::new(VERSIONS_DIR).join(name).join(version.to_string());
    let link = install_dir.join(format!("{LINK_PREFIX}{name}-{}", rand::random::<u32>()));
    std::os::unix::fs::symlink(&target, &link)?;
    // `rename` replaces a link (or nothing) atomically; a real folder in the
    // way was adopted first (`adopt`).
    std::fs::rename(&link, install_dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&link);
    })
}

/// A skill folder put into the install folder by hand (or by a server
/// older than versions) becomes its version 1: moved under
/// [`VERSIONS_DIR`] and linked back. Nothing is done for a link or for a
/// name with nothing there.
pub fn adopt(install_dir: &Path, name: &str) -> std::io::Result<()> {
    let live = install_dir.join(name);
    let Ok(meta) = std::fs::symlink_metadata(&live) else { return Ok(()) };
    if !meta.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(versions_of(install_dir, name))?;
    let version = next_version(install_dir, name);
    let folder = versions_of(install_dir, name).join(version.to_string());
    let bytes = super::skill::folder_bytes(&live);
    std::fs::rename(&live, &folder)?;
    write_record(install_dir, name, &Version { version, digest: None, installed_at: unix_now(), bytes })?;
    point(install_dir, name, version)
}

/// Every folder in the install folder that holds a skill by hand: the
/// ones [`adopt`] takes at start-up.
pub fn adoptable(install_dir: &Path) -> Vec<String> {
    std::fs::read_dir(install_dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.'))
        .filter(|name| install_dir.join(name).join("SKILL.md").is_file())
        .collect()
}

/// Puts a staged skill folder in place as the newest version of `name`,
/// records it, makes it live, and lets go of the versions past `keep`
/// previous ones. Returns the new version and the folders that left the
/// history (the caller removes them once no turn reads them).
pub fn place(
    install_dir: &Path,
    name: &str,
    staged: &Path,
    digest: String,
    bytes: u64,
    keep: usize,
) -> std::io::Result<(u32, Vec<PathBuf>)> {
    adopt(install_dir, name)?;
    std::fs::create_dir_all(versions_of(install_dir, name))?;
    let version = next_version(install_dir, name);
    std::fs::rename(staged, versions_of(install_dir, name).join(version.to_string()))?;
    let record = Version { version, digest: Some(digest), installed_at: unix_now(), bytes };
    write_record(install_dir, name, &record)?;
    point(install_dir, name, version)?;
    Ok((version, prune(install_dir, name, keep)))
}

/// Drops the records of the oldest versions past `keep` previous ones (the
/// live one never counts or goes); returns their folders.
pub fn prune(install_dir: &Path, name: &str, keep: usize) -> Vec<PathBuf> {
    let History { current, versions } = history(install_dir, name);
    let previous = versions.iter().filter(|v| Some(v.version) != current);
    previous.skip(keep).filter_map(|v| forget(install_dir, name, v.version)).collect()
}

/// Drops one version's record; returns its folder.
fn forget(install_dir: &Path, name: &str, version: u32) -> Option<PathBuf> {
    let dir = versions_of(install_dir, name);
    std::fs::remove_file(dir.join(format!("{version}.json"))).ok()?;
    Some(dir.join(version.to_string()))
}

/// Deletes an installed skill: its link and every record go now; returns
/// the version folders, for removal once no turn reads them.
pub fn retire(install_dir: &Path, name: &str) -> std::io::Result<Vec<PathBuf>> {
    let live = install_dir.join(name);
    if std::fs::symlink_metadata(&live)?.is_dir() {
        // A folder put there by hand since start-up has no versions yet.
        std::fs::remove_dir_all(&live)?;
        return Ok(Vec::new());
    }
    std::fs::remove_file(&live)?;
    let versions = history(install_dir, name).versions;
    Ok(versions.iter().filter_map(|v| forget(install_dir, name, v.version)).collect())
}

/// Version folders no record names, left by a server that stopped before it
/// removed them; nothing can read them at start-up.
pub fn leftovers(install_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for skill in std::fs::read_dir(install_dir.join(VERSIONS_DIR)).into_iter().flatten().filter_map(Result::ok) {
        let Ok(entries) = std::fs::read_dir(skill.path()) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let file = entry.file_name().to_string_lossy().into_owned();
            let recorded = skill.path().join(format!("{file}.json")).is_file();
            if entry.file_type().is_ok_and(|t| t.is_dir()) && file.parse::<u32>().is_ok() && !recorded {
                out.push(entry.path());
            }
        }
    }
    out
}

/// Links left by an install that stopped between making one and putting it
/// in place.
pub fn stray_links(install_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(install_dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(LINK_PREFIX))
        .map(|entry| entry.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(dir: &Path, body: &str) -> PathBuf {
        let folder = dir.join(format!(".upload-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("SKILL.md"), format!("---\nname: demo\ndescription: d\n---\n{body}\n")).unwrap();
        folder
    }

    #[test]
    fn installs_keep_at_most_keep_previous_versions_and_never_reuse_a_number() {
        let dir = tempfile::tempdir().unwrap();
        let install = dir.path();
        for n in 1..=4u32 {
            let (version, _) =
                place(install, "demo", &staged(install, &n.to_string()), format!("sha256:{n}"), 10, 2).unwrap();
            assert_eq!(version, n);
            assert_eq!(current(install, "demo"), Some(n));
        }
        // Keeping 2 previous: 4 is live, 3 and 2 are kept, 1 left.
        let kept = history(install, "demo");
        assert_eq!(kept.versions.iter().map(|v| v.version).collect::<Vec<_>>(), [4, 3, 2]);
        assert_eq!(leftovers(install), [install.join(".versions/demo/1")]);
        let body = std::fs::read_to_string(install.join("demo/SKILL.md")).unwrap();
        assert!(body.ends_with("4\n"), "{body}");
        // Back to 2: the link moves, nothing is pruned.
        point(install, "demo", 2).unwrap();
        assert_eq!(prune(install, "demo", 2), Vec::<PathBuf>::new());
        assert!(std::fs::read_to_string(install.join("demo/SKILL.md")).unwrap().ends_with("2\n"));
        // The folder of 1 is still there (a turn may read it); the next
        // install takes 5, not 1, and the history keeps the two newest
        // before it by number, as rollback counts them.
        let (version, gone) = place(install, "demo", &staged(install, "5"), "sha256:5".into(), 10, 2).unwrap();
        assert_eq!(version, 5);
        assert_eq!(gone, [install.join(".versions/demo/2")]);
        assert!(stray_links(install).is_empty());
    }

    /// A reader that resolves the live link while versions go in finds a
    /// whole version every time: never nothing, never files of two.
    #[test]
    fn a_reader_always_finds_one_whole_version_while_installs_swap_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let install = dir.path().to_path_buf();
        let stage = |n: u32| {
            let folder = staged(&install, &n.to_string());
            std::fs::write(folder.join("notes.md"), n.to_string()).unwrap();
            folder
        };
        place(&install, "demo", &stage(1), "sha256:1".into(), 10, 100).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (install, done) = (install.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                    let folder = std::fs::canonicalize(install.join("demo")).expect("the live link always resolves");
                    let body = std::fs::read_to_string(folder.join("SKILL.md")).unwrap();
                    let notes = std::fs::read_to_string(folder.join("notes.md")).unwrap();
                    assert!(body.ends_with(&format!("{notes}\n")), "{body} with notes {notes}");
                    reads += 1;
                }
                reads
            })
        };
        for n in 2..=40 {
            place(&install, "demo", &stage(n), format!("sha256:{n}"), 10, 100).unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        assert_eq!(current(&install, "demo"), Some(40));
    }

    #[test]
    fn a_folder_put_there_by_hand_becomes_version_one() {
        let dir = tempfile::tempdir().unwrap();
        let install = dir.path();
        let by_hand = install.join("demo");
        std::fs::create_dir(&by_hand).unwrap();
        std::fs::write(by_hand.join("SKILL.md"), "---\nname: demo\ndescription: d\n---\nold\n").unwrap();
        assert_eq!(adoptable(install), ["demo"]);
        adopt(install, "demo").unwrap();
        assert!(adoptable(install).is_empty());
        let adopted = history(install, "demo");
        assert_eq!(adopted.current, Some(1));
        assert_eq!(adopted.versions[0].digest, None);
        assert!(std::fs::read_to_string(install.join("demo/SKILL.md")).unwrap().ends_with("old\n"));
        // Deleting lets go of every version at once.
        assert_eq!(retire(install, "demo").unwrap(), [install.join(".versions/demo/1")]);
        // One put there since start-up, not adopted yet, just goes.
        std::fs::create_dir(&by_hand).unwrap();
        std::fs::write(by_hand.join("SKILL.md"), "---\nname: demo\ndescription: d\n---\nnew\n").unwrap();
        assert_eq!(retire(install, "demo").unwrap(), Vec::<PathBuf>::new());
        assert!(!by_hand.exists());
        assert!(std::fs::symlink_metadata(install.join("demo")).is_err());
        assert_eq!(history(install, "demo"), History::default());
    }
}
