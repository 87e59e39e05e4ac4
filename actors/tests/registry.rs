//! The registry over real directories: the published fixtures, the limits at
//! and one past each, collisions, nesting and links.

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use skillhost_actors::skills::registry::{scan, MAX_REGISTRY_SKILLS, MAX_SCAN_DEPTH};
use skillhost_actors::skills::skill::{MAX_SKILL_BYTES, MAX_SKILL_FILES, MAX_SKILL_MD_BYTES};
use skillhost_actors::skills::{FileKind, Origin, Root};

fn fixtures() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/published-skills");
    assert!(path.is_dir(), "{} is missing: the shared fixtures are laid out next to the repository", path.display());
    path
}

fn discovered(path: &Path) -> Vec<Root> {
    vec![Root { path: path.to_path_buf(), origin: Origin::Discovered }]
}

fn write_skill(dir: &Path, name: &str) -> PathBuf {
    let skill = dir.join(name);
    fs::create_dir_all(&skill).unwrap();
    fs::write(skill.join("SKILL.md"), format!("---\nname: {name}\ndescription: Does {name} things.\n---\nBody\n"))
        .unwrap();
    skill
}

#[test]
fn every_published_skill_loads_without_warnings() {
    let snapshot = scan(&discovered(&fixtures()));
    assert_eq!(snapshot.errors, vec![], "load errors");
    assert_eq!(
        snapshot.ids(),
        vec![
            "algorithmic-art",
            "brand-guidelines",
            "frontend-design",
            "internal-comms",
            "mcp-builder",
            "skill-creator",
            "slack-gif-creator",
            "theme-factory",
            "webapp-testing"
        ]
    );
    for skill in snapshot.skills.values() {
        // The fixtures are spec-clean: names match folders, fields in range.
        assert_eq!(skill.warnings, Vec::<String>::new(), "{}", skill.id());
        assert_eq!(skill.origin, Origin::Discovered);
        assert!(!skill.manifest.body.is_empty());
    }
    let mcp = snapshot.get("mcp-builder").unwrap();
    let kinds: Vec<(&str, FileKind)> = mcp.files.iter().map(|f| (f.path.as_str(), f.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            ("LICENSE.txt", FileKind::Other),
            ("reference/evaluation.md", FileKind::Reference),
            ("reference/mcp_best_practices.md", FileKind::Reference),
            ("reference/node_mcp_server.md", FileKind::Reference),
            ("reference/python_mcp_server.md", FileKind::Reference),
            ("scripts/requirements.txt", FileKind::Script),
        ]
    );
    assert!(mcp.files.iter().all(|f| f.text));
    let total: u64 =
        mcp.files.iter().map(|f| f.bytes).sum::<u64>() + fs::metadata(mcp.root.join("SKILL.md")).unwrap().len();
    assert_eq!(mcp.bytes, total);
}

#[test]
fn skill_md_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    for (name, size) in [("at-limit", MAX_SKILL_MD_BYTES), ("over-limit", MAX_SKILL_MD_BYTES + 1)] {
        let skill = dir.path().join(name);
        fs::create_dir_all(&skill).unwrap();
        let head = format!("---\nname: {name}\ndescription: Big.\n---\n");
        let mut text = head.into_bytes();
        text.resize(size as usize, b'x');
        fs::write(skill.join("SKILL.md"), text).unwrap();
    }
    let snapshot = scan(&discovered(dir.path()));
    assert_eq!(snapshot.ids(), vec!["at-limit"]);
    assert_eq!(snapshot.errors.len(), 1);
    assert_eq!(snapshot.errors[0].message, "SKILL.md is 4194305 bytes; the limit is 4194304 bytes (4 MB)");
}

#[test]
fn file_count_and_size_limits() {
    let dir = tempfile::tempdir().unwrap();
    for (name, files) in [("many-files", MAX_SKILL_FILES), ("too-many-files", MAX_SKILL_FILES + 1)] {
        let skill = write_skill(dir.path(), name);
        fs::create_dir_all(skill.join("data")).unwrap();
        for i in 0..files {
            File::create(skill.join(format!("data/{i}.txt"))).unwrap();
        }
    }
    // Sparse files: the limit counts bytes without writing them.
    for (name, extra) in [("big", 0), ("too-big", 1)] {
        let skill = write_skill(dir.path(), name);
        let skill_md = fs::metadata(skill.join("SKILL.md")).unwrap().len();
        File::create(skill.join("blob.bin")).unwrap().set_len(MAX_SKILL_BYTES - skill_md + extra).unwrap();
    }
    let snapshot = scan(&discovered(dir.path()));
    assert_eq!(snapshot.ids(), vec!["big", "many-files"]);
    assert_eq!(snapshot.get("many-files").unwrap().files.len(), MAX_SKILL_FILES);
    assert_eq!(snapshot.get("big").unwrap().bytes, MAX_SKILL_BYTES);
    let messages: Vec<&str> = snapshot.errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        vec!["the skill's files total more than 268435456 bytes (256 MB)", "the skill holds more than 4096 files"]
    );
}

#[test]
fn registry_limit() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..MAX_REGISTRY_SKILLS {
        write_skill(dir.path(), &format!("skill-{i:04}"));
    }
    let snapshot = scan(&discovered(dir.path()));
    assert_eq!((snapshot.skills.len(), snapshot.errors.len()), (MAX_REGISTRY_SKILLS, 0));
    write_skill(dir.path(), "skill-9999");
    let snapshot = scan(&discovered(dir.path()));
    assert_eq!(snapshot.skills.len(), MAX_REGISTRY_SKILLS);
    assert_eq!(snapshot.errors.len(), 1);
    assert!(snapshot.errors[0].message.starts_with("the registry holds at most 512 skills; 1 more were found"));
    assert!(snapshot.errors[0].path.ends_with("skill-9999"));
}

#[test]
fn layouts_depth_collisions_links_and_broken_skills() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    write_skill(&a, "direct");
    write_skill(&a.join("skills"), "nested");
    // Too deep: root/x/y/z/SKILL.md is four levels down.
    write_skill(&a.join("x/y"), "too-deep");
    write_skill(&a.join("node_modules"), "skipped");
    write_skill(&a.join(".git"), "skipped-too");
    // Collision between roots: both are refused and both paths reported.
    write_skill(&a, "shared");
    write_skill(&b, "shared");
    // A link to a folder outside the root is not followed.
    write_skill(dir.path(), "outside");
    std::os::unix::fs::symlink(dir.path().join("outside"), a.join("linked-out")).unwrap();
    // Broken skills are reported, not loaded.
    fs::create_dir_all(b.join("broken")).unwrap();
    fs::write(b.join("broken/SKILL.md"), "no frontmatter\n").unwrap();
    let roots =
        vec![Root { path: a.clone(), origin: Origin::Installed }, Root { path: b.clone(), origin: Origin::Discovered }];
    let snapshot = scan(&roots);
    assert_eq!(snapshot.ids(), vec!["direct", "nested"]);
    assert_eq!(snapshot.get("direct").unwrap().origin, Origin::Installed);
    let errors: Vec<(String, &str)> = snapshot
        .errors
        .iter()
        .map(|e| {
            (e.path.strip_prefix(dir.path().canonicalize().unwrap()).unwrap().display().to_string(), e.message.as_str())
        })
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].0 == "a/shared" && errors[0].1.contains("is also used by") && errors[0].1.contains("b/shared"));
    assert_eq!(errors[1].0, "b/broken");
    assert!(errors[1].1.contains("does not start with a YAML frontmatter block"));
    assert!(errors[2].0 == "b/shared" && errors[2].1.contains("a/shared"));
    assert_eq!(MAX_SCAN_DEPTH, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_rescans_after_changes() {
    assert!(sees_a_new_skill(true, None).await, "the watcher never rescanned");
}

/// `--skills-poll`: no file events (as on NFS, where another machine's
/// writes raise none here), yet the registry sees a new skill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_rescans_without_file_events() {
    let poll = Some(std::time::Duration::from_secs(1));
    assert!(sees_a_new_skill(false, poll).await, "the poller never rescanned");
}

/// Starts a registry on an empty root, writes a skill, and says whether the
/// registry came to list it.
async fn sees_a_new_skill(watch: bool, poll: Option<std::time::Duration>) -> bool {
    use skillhost_actors::skills::SkillsConfig;
    use skillhost_actors::{Server, ServerConfig};
    use skillhost_engine::EngineConfig;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("skills");
    fs::create_dir_all(&root).unwrap();
    let skills = SkillsConfig {
        roots: vec![Root { path: root.clone(), origin: Origin::Discovered }],
        install_dir: None,
        watch,
        poll,
        selected: Vec::new(),
        keep_versions: skillhost_actors::skills::versions::DEFAULT_KEEP_VERSIONS,
        policy: Default::default(),
        ..Default::default()
    };
    // No model is needed for the registry; a missing file just fails to load.
    let engine = EngineConfig { model_path: dir.path().join("none.gguf"), n_parallel: 1, ..Default::default() };
    let server = Server::start(ServerConfig::new(engine, Some(skills))).await.unwrap();
    let handle = server.skills().unwrap().clone();
    assert!(handle.snapshot().skills.is_empty());
    write_skill(&root, "fresh");
    // A readiness poll bounding a hang, not a timing assertion.
    let mut seen = false;
    for _ in 0..200 {
        if handle.snapshot().get("fresh").is_some() {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    server.shutdown();
    seen
}

#[test]
fn bundled_skills_load_without_warnings() {
    let bundled = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../skills");
    let snapshot = scan(&discovered(&bundled));
    assert_eq!(snapshot.errors, vec![]);
    assert_eq!(snapshot.ids(), vec!["skill-authoring", "skillhost-api"]);
    for skill in snapshot.skills.values() {
        assert_eq!(skill.warnings, Vec::<String>::new(), "{}", skill.id());
        assert!(skill.files.iter().any(|f| f.kind == FileKind::Script), "{} ships a script", skill.id());
    }
}
