//! The skills block: golden renderings, budget edges and byte stability.
//! `UPDATE_GOLDEN=1` rewrites the files under `tests/golden/`.

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use skillhost_actors::skills::prompt::{
    apply, inline_body_cap, inline_budget, metadata_budget, plan, trim_description, PromptOptions, BYTES_PER_TOKEN,
    MAX_CATALOG_ENTRIES, MAX_DESCRIPTION_CHARS, MAX_FILE_INDEX,
};
use skillhost_actors::skills::registry::scan;
use skillhost_actors::skills::{Origin, Root, Snapshot};
use skillhost_engine::{ChatMessage, Role};

fn write_skill(root: &Path, name: &str, description: &str, body: &str, files: usize) {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("references")).unwrap();
    std::fs::write(dir.join("SKILL.md"), format!("---\nname: {name}\ndescription: {description}\n---\n{body}"))
        .unwrap();
    for i in 0..files {
        std::fs::write(dir.join(format!("references/part-{i:02}.md")), "x".repeat(10 + i)).unwrap();
    }
}

fn snapshot_of(root: &Path) -> Snapshot {
    scan(&[Root { path: root.to_path_buf(), origin: Origin::Discovered }])
}

/// A registry of three ordinary skills.
fn registry() -> (tempfile::TempDir, Snapshot) {
    let dir = tempfile::tempdir().unwrap();
    write_skill(
        dir.path(),
        "pdf",
        "Extract text and tables from PDF files. Use when a PDF is involved.",
        "# PDF\nUse pdftotext.\n",
        2,
    );
    write_skill(
        dir.path(),
        "xlsx",
        "Build spreadsheets with formulas. Use for Excel files.",
        "# XLSX\nKeep formulas live.\n",
        0,
    );
    write_skill(
        dir.path(),
        "brand",
        "Apply the house colours and fonts. Use for any styled artifact.",
        "# Brand\nNavy #123456.\n",
        1,
    );
    let snapshot = snapshot_of(dir.path());
    (dir, snapshot)
}

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} is missing; run with UPDATE_GOLDEN=1 to create it", path.display()));
    pretty_assertions::assert_eq!(expected, actual, "{name}");
}

fn options(discovery: bool, inline: bool, tools: bool) -> PromptOptions {
    PromptOptions { discovery, inline_selected_bodies: inline, allow_exec: false, context_tokens: Some(8192), tools }
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn golden_blocks() {
    let (_dir, snapshot) = registry();
    golden("selected", &plan(&ids(&["pdf", "xlsx"]), &snapshot, &options(false, false, true)).text);
    golden("discovery", &plan(&ids(&["pdf"]), &snapshot, &options(true, false, true)).text);
    golden("discovery-only", &plan(&[], &snapshot, &options(true, false, true)).text);
    golden("no-discovery", &plan(&ids(&["xlsx"]), &snapshot, &options(false, false, true)).text);
    golden(
        "inlined",
        &plan(&ids(&["pdf"]), &snapshot, &PromptOptions { allow_exec: true, ..options(true, true, true) }).text,
    );
    golden("no-tools", &plan(&ids(&["pdf", "brand"]), &snapshot, &options(true, false, false)).text);
    // Nothing selected and nothing to discover: no block at all.
    assert_eq!(plan(&[], &snapshot, &options(false, false, true)).text, "");
}

#[test]
fn truncated_inline_body() {
    let dir = tempfile::tempdir().unwrap();
    let body: String = (0..400).map(|i| format!("Rule {i:03}: follow the procedure exactly.\n")).collect();
    write_skill(dir.path(), "big", "A skill with long instructions. Use for testing truncation.", &body, 0);
    let snapshot = snapshot_of(dir.path());
    // A 4096-token context: the inline block is 1024 tokens and one body at most 3/4 of it.
    let small = PromptOptions { context_tokens: Some(4096), ..options(false, false, false) };
    let block = plan(&ids(&["big"]), &snapshot, &small);
    assert_eq!(block.truncated, vec!["big".to_string()]);
    golden("truncated", &block.text);
    let with_tools = PromptOptions { context_tokens: Some(4096), ..options(false, true, true) };
    assert!(plan(&ids(&["big"]), &snapshot, &with_tools)
        .text
        .contains("Continue with skills_read(skill=\"big\", path=\"SKILL.md\", offset=3072)"));
}

#[test]
fn catalog_and_file_index_limits() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..MAX_CATALOG_ENTRIES + 1 {
        write_skill(dir.path(), &format!("skill-{i:03}"), &format!("Skill number {i}."), "Body.\n", 0);
    }
    write_skill(
        dir.path(),
        "files",
        "A skill with many files. Use for testing the index.",
        "Body.\n",
        MAX_FILE_INDEX + 1,
    );
    let snapshot = snapshot_of(dir.path());
    let big = PromptOptions { context_tokens: Some(500_000), ..options(true, false, true) };
    let block = plan(&[], &snapshot, &big);
    // 98 unselected skills: 96 listed, the rest summarized.
    assert_eq!(
        block.text.matches("\n- skill-").count() + block.text.matches("\n- files:").count(),
        MAX_CATALOG_ENTRIES
    );
    assert!(block.text.contains("(2 further skills are installed but not listed here; call skills_list to see them.)"));
    golden("catalog-97-plus", &block.text);
    let inlined = plan(&ids(&["files"]), &snapshot, &options(false, true, true));
    assert!(inlined.text.contains("- references/part-39.md"));
    assert!(!inlined.text.contains("part-40"));
    assert!(inlined.text.contains("(1 more; call skills_list)"));
    golden("files-41-plus", &inlined.text);
    // Exactly at the file limit nothing is summarized.
    let dir40 = tempfile::tempdir().unwrap();
    write_skill(dir40.path(), "forty", "Forty files.", "Body.\n", MAX_FILE_INDEX);
    let forty = plan(&ids(&["forty"]), &snapshot_of(dir40.path()), &options(false, true, true));
    assert!(forty.text.contains("part-39") && !forty.text.contains("more; call skills_list"));
}

#[test]
fn catalog_respects_the_metadata_budget() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..60 {
        write_skill(dir.path(), &format!("skill-{i:02}"), &"word ".repeat(60), "Body.\n", 0);
    }
    let snapshot = snapshot_of(dir.path());
    // 2% of 51200 tokens is the 1024-token floor: 4096 bytes.
    let block = plan(&[], &snapshot, &PromptOptions { context_tokens: Some(51_200), ..options(true, false, true) });
    assert!(block.text.len() <= metadata_budget(Some(51_200)), "{} bytes", block.text.len());
    assert!(block.text.contains("further skills are installed"));
}

#[test]
fn budget_edges() {
    let bytes = |tokens: usize| tokens * BYTES_PER_TOKEN;
    // Metadata block: 2% clamped to 1024..=10000 tokens, 2000 unknown.
    assert_eq!(metadata_budget(None), bytes(2000));
    assert_eq!(metadata_budget(Some(51_200)), bytes(1024));
    assert_eq!(metadata_budget(Some(51_150)), bytes(1024));
    assert_eq!(metadata_budget(Some(51_250)), bytes(1025));
    assert_eq!(metadata_budget(Some(500_000)), bytes(10_000));
    assert_eq!(metadata_budget(Some(500_050)), bytes(10_000));
    // Inlined block: a quarter clamped to 1024..=48000 tokens, 16000 unknown.
    assert_eq!(inline_budget(None), bytes(16_000));
    assert_eq!(inline_budget(Some(4096)), bytes(1024));
    assert_eq!(inline_budget(Some(4092)), bytes(1024));
    assert_eq!(inline_budget(Some(4100)), bytes(1025));
    assert_eq!(inline_budget(Some(192_000)), bytes(48_000));
    assert_eq!(inline_budget(Some(192_004)), bytes(48_000));
    // One body: three quarters of the block, at least 512 tokens.
    assert_eq!(inline_body_cap(Some(4096)), bytes(768));
    assert_eq!(inline_body_cap(None), bytes(12_000));
    // Descriptions: kept whole at the limit, cut at a word past it.
    let at_limit = "é".repeat(MAX_DESCRIPTION_CHARS);
    assert_eq!(trim_description(&at_limit), at_limit);
    let over = format!("{} tail", "word ".repeat(MAX_DESCRIPTION_CHARS / 5));
    let trimmed = trim_description(&over);
    assert!(trimmed.ends_with("word...") && trimmed.chars().count() <= MAX_DESCRIPTION_CHARS + 3, "{trimmed}");
}

#[test]
fn byte_stable_across_order_and_load_time() {
    let (dir, first) = registry();
    std::thread::sleep(std::time::Duration::from_millis(20));
    // A second load of the same skills, later, with touched files.
    std::fs::write(dir.path().join("pdf/references/part-00.md"), "x".repeat(10)).unwrap();
    let second = snapshot_of(dir.path());
    for opts in [options(true, false, true), options(false, true, true), options(true, false, false)] {
        let a = plan(&ids(&["xlsx", "pdf"]), &first, &opts).text;
        let b = plan(&ids(&["pdf", "xlsx", "pdf"]), &second, &opts).text;
        assert_eq!(a.as_bytes(), b.as_bytes());
        assert!(!a.contains(&dir.path().display().to_string()), "an absolute path leaked into the block");
    }
}

#[test]
fn apply_merges_into_the_leading_system_message() {
    let (_dir, snapshot) = registry();
    let block = plan(&ids(&["pdf"]), &snapshot, &options(false, false, true));
    let with_system = [ChatMessage::new(Role::System, "Be brief."), ChatMessage::new(Role::User, "Hi")];
    let merged = apply(&with_system, &block);
    assert_eq!(merged.len(), 2);
    assert_eq!(merged[0].content, format!("{}\n\nBe brief.", block.text));
    let without = [ChatMessage::new(Role::User, "Hi")];
    let added = apply(&without, &block);
    assert_eq!((added.len(), added[0].role, added[0].content.as_str()), (2, Role::System, block.text.as_str()));
    let developer = [ChatMessage::new(Role::Developer, "Rules."), ChatMessage::new(Role::User, "Hi")];
    assert_eq!(
        apply(&developer, &block).iter().filter(|m| matches!(m.role, Role::System | Role::Developer)).count(),
        1
    );
}
