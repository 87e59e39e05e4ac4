//! The skills half of `make bench`: registry scan time by registry size,
//! cold and warm; the static scan's speed per MB against reading the same
//! bytes, and its share of a 512-skill rescan; a rescan of installed skills
//! that keep versions against the same skills without; ZIP install
//! throughput.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

use skillhost_actors::skills::install::{install_archive, InstallOptions};
use skillhost_actors::skills::registry::{scan, skip_set};
use skillhost_actors::skills::scan::{scan_skill, FileToScan, Rules};
use skillhost_actors::skills::skill::load_skill;
use skillhost_actors::skills::{Origin, Policy, Root, Snapshot};

/// Files per generated skill besides SKILL.md.
const FILES_PER_SKILL: usize = 6;
const WARM_RUNS: usize = 5;
/// Size of the archive the install is timed on.
const ARCHIVE_BYTES: usize = 50 * 1024 * 1024;
/// Size of the one large skill the static scan's speed is timed on.
const SCANNED_BYTES: usize = 16 * 1024 * 1024;
/// Installed skills, and installs of each, for the rescan with versions.
const VERSIONED_SKILLS: usize = 100;
const INSTALLS_EACH: usize = 6;

fn generate(root: &Path, count: usize) {
    for i in 0..count {
        let dir = root.join(format!("skill-{i:04}"));
        std::fs::create_dir_all(dir.join("references")).expect("mkdir");
        std::fs::create_dir_all(dir.join("scripts")).expect("mkdir");
        let body = "Step one. Step two. ".repeat(100);
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: skill-{i:04}\ndescription: Generated skill number {i} for the scan benchmark.\nlicense: MIT\nmetadata:\n  version: \"1.0\"\n---\n# Skill {i}\n{body}\n"),
        )
        .expect("write");
        for f in 0..FILES_PER_SKILL {
            let path = if f % 2 == 0 {
                dir.join(format!("references/ref-{f}.md"))
            } else {
                dir.join(format!("scripts/run-{f}.py"))
            };
            std::fs::write(path, "x = 1\n".repeat(200)).expect("write");
        }
    }
}

/// Drops every file under `dir` from the page cache, so the next scan reads
/// the disk (POSIX_FADV_DONTNEED needs no privilege).
fn evict(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            evict(&path);
        } else if let Ok(file) = std::fs::File::open(&path) {
            // SAFETY: advisory call on an open descriptor.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(|a, b| a.total_cmp(b));
    runs[runs.len() / 2]
}

/// The static scan of every skill in `snapshot`, ms.
fn time_static_scan(snapshot: &Snapshot) -> f64 {
    let started = Instant::now();
    for skill in snapshot.skills.values() {
        let manifest = std::fs::read_to_string(skill.root.join("SKILL.md")).expect("read");
        let files: Vec<FileToScan<'_>> = skill.files.iter().map(FileToScan::from).collect();
        std::hint::black_box(scan_skill(&skill.root, &manifest, &files, Rules::built_in()));
    }
    started.elapsed().as_secs_f64() * 1000.0
}

/// Reading every byte of `snapshot`'s files, the floor any scan pays, ms.
fn time_read(snapshot: &Snapshot) -> f64 {
    let started = Instant::now();
    for skill in snapshot.skills.values() {
        std::hint::black_box(std::fs::read(skill.root.join("SKILL.md")).expect("read"));
        for file in &skill.files {
            std::hint::black_box(std::fs::read(skill.root.join(&file.path)).expect("read"));
        }
    }
    started.elapsed().as_secs_f64() * 1000.0
}

/// A skill of about [`SCANNED_BYTES`]: scripts and Markdown of the kind
/// skills ship, with a network call, an environment read and links.
fn generate_large(dir: &Path) {
    std::fs::create_dir_all(dir.join("scripts")).expect("mkdir");
    std::fs::create_dir_all(dir.join("references")).expect("mkdir");
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: large\ndescription: A large skill for the scan benchmark.\n---\nRead the references.\n",
    )
    .expect("write");
    let script = "import os, json\nimport requests\n\ndef fetch(page):\n    token = os.environ.get('HOME')\n    rows = [json.loads(line) for line in open('data/rows.jsonl')]\n    return {'page': page, 'rows': len(rows), 'home': token}\n\n";
    let prose = "## Forms\n\nFill each field, then check the totals against the table in [the guide](https://docs.example.com/forms). Keep the user informed of each step.\n\n";
    let per_file = SCANNED_BYTES / 16;
    for i in 0..16 {
        let (path, unit) = if i % 2 == 0 {
            (dir.join(format!("scripts/tool_{i}.py")), script)
        } else {
            (dir.join(format!("references/part-{i}.md")), prose)
        };
        std::fs::write(path, unit.repeat(per_file / unit.len())).expect("write");
    }
}

/// Every file under `dir` as one skill archive under `name/`.
fn zip_dir(dir: &Path, name: &str) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("inside").to_string_lossy().into_owned();
                writer.start_file(format!("{name}/{relative}"), options).expect("zip");
                writer.write_all(&std::fs::read(&path).expect("read")).expect("zip");
            }
        }
    }
    writer.finish().expect("zip").into_inner()
}

fn time_scan(roots: &[Root]) -> (f64, usize) {
    let started = Instant::now();
    let snapshot = scan(roots);
    (started.elapsed().as_secs_f64() * 1000.0, snapshot.skills.len())
}

pub fn run() {
    println!("| measure | 10 skills | 100 skills | 512 skills |");
    println!("|---|---|---|---|");
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for count in [10usize, 100, 512] {
        let dir = tempfile::tempdir().expect("tempdir");
        generate(dir.path(), count);
        let roots = vec![Root { path: dir.path().to_path_buf(), origin: Origin::Discovered }];
        evict(dir.path());
        let (cold_ms, loaded) = time_scan(&roots);
        assert_eq!(loaded, count, "the scan lost skills");
        let mut runs: Vec<f64> = (0..WARM_RUNS).map(|_| time_scan(&roots).0).collect();
        runs.sort_by(|a, b| a.total_cmp(b));
        cold.push(cold_ms);
        warm.push(runs[WARM_RUNS / 2]);
    }
    let static_share = {
        // The static scan's part of a warm 512-skill rescan.
        let dir = tempfile::tempdir().expect("tempdir");
        generate(dir.path(), 512);
        let roots = vec![Root { path: dir.path().to_path_buf(), origin: Origin::Discovered }];
        let snapshot = scan(&roots);
        let whole = median((0..WARM_RUNS).map(|_| time_scan(&roots).0).collect());
        let alone = median((0..WARM_RUNS).map(|_| time_static_scan(&snapshot)).collect());
        alone / whole
    };
    println!("| scan, cold (ms) | {:.1} | {:.1} | {:.1} |", cold[0], cold[1], cold[2]);
    println!("| scan, warm (ms) | {:.1} | {:.1} | {:.1} |", warm[0], warm[1], warm[2]);
    println!(
        "| growth per skill, warm / cold (µs) | {:.0} / {:.0} | | |",
        (warm[2] - warm[0]) * 1000.0 / 502.0,
        (cold[2] - cold[0]) * 1000.0 / 502.0
    );

    println!("| static scan's share of a warm 512-skill rescan | | | {:.0}% |", static_share * 100.0);

    // The static scan's speed on one large skill, against reading its bytes.
    let dir = tempfile::tempdir().expect("tempdir");
    let large = dir.path().join("large");
    generate_large(&large);
    let skill = load_skill(&large, Origin::Discovered, &skip_set()).expect("load");
    let snapshot = Snapshot { skills: [("large".to_string(), std::sync::Arc::new(skill))].into(), errors: Vec::new() };
    let megabytes = snapshot.skills["large"].bytes as f64 / (1024.0 * 1024.0);
    let scanning = median((0..WARM_RUNS).map(|_| time_static_scan(&snapshot)).collect());
    let reading = median((0..WARM_RUNS).map(|_| time_read(&snapshot)).collect());
    println!(
        "| static scan of a {megabytes:.0} MB skill (ms per MB; over reading it) | {:.1} ({:.1}x) | | |",
        scanning / megabytes,
        scanning / reading
    );

    // Installed skills with versions kept, rescanned, against the same
    // skills as plain folders.
    let plain = tempfile::tempdir().expect("tempdir");
    generate(plain.path(), VERSIONED_SKILLS);
    let install = tempfile::tempdir().expect("tempdir");
    for i in 0..VERSIONED_SKILLS {
        let name = format!("skill-{i:04}");
        let archive = zip_dir(&plain.path().join(&name), &name);
        for _ in 0..INSTALLS_EACH {
            let options = InstallOptions { overwrite: true, policy: Policy::Warn, ..InstallOptions::default() };
            install_archive(std::io::Cursor::new(&archive), install.path(), &Snapshot::default(), options)
                .expect("install");
        }
    }
    let installed = vec![Root { path: install.path().to_path_buf(), origin: Origin::Installed }];
    let folders = vec![Root { path: plain.path().to_path_buf(), origin: Origin::Discovered }];
    assert_eq!(time_scan(&installed).1, VERSIONED_SKILLS, "the rescan lost skills");
    let with_versions = median((0..WARM_RUNS).map(|_| time_scan(&installed).0).collect());
    let without = median((0..WARM_RUNS).map(|_| time_scan(&folders).0).collect());
    println!(
        "| rescan of {VERSIONED_SKILLS} installed skills with {} versions kept (ms; over plain folders) | {with_versions:.1} ({:.2}x) | | |",
        INSTALLS_EACH,
        with_versions / without
    );

    // A 50 MB archive of incompressible files, installed into a fresh folder.
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    writer.start_file("big/SKILL.md", options).expect("zip");
    writer
        .write_all(b"---\nname: big\ndescription: A large skill for the install benchmark.\n---\nBody\n")
        .expect("zip");
    let chunk = 1024 * 1024;
    for i in 0..ARCHIVE_BYTES / chunk {
        writer.start_file(format!("big/assets/blob-{i:02}.bin"), options).expect("zip");
        let data: Vec<u8> = (0..chunk).map(|_| rand::random::<u8>()).collect();
        writer.write_all(&data).expect("zip");
    }
    let archive = writer.finish().expect("zip").into_inner();
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let options = InstallOptions { policy: Policy::Warn, ..InstallOptions::default() };
    install_archive(std::io::Cursor::new(&archive), dir.path(), &Snapshot::default(), options).expect("install");
    let seconds = started.elapsed().as_secs_f64();
    let megabytes = archive.len() as f64 / (1024.0 * 1024.0);
    println!("| ZIP install of a {megabytes:.0} MB archive (MB/s) | {:.0} | | |", megabytes / seconds);
}
