//! The skills half of `make bench`: registry scan time by registry size,
//! cold and warm, and ZIP install throughput.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

use skillhost_actors::skills::install::{install_archive, ZipLimits};
use skillhost_actors::skills::registry::scan;
use skillhost_actors::skills::{Origin, Root, Snapshot};

/// Files per generated skill besides SKILL.md.
const FILES_PER_SKILL: usize = 6;
const WARM_RUNS: usize = 5;
/// Size of the archive the install is timed on.
const ARCHIVE_BYTES: usize = 50 * 1024 * 1024;

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
    println!("| scan, cold (ms) | {:.1} | {:.1} | {:.1} |", cold[0], cold[1], cold[2]);
    println!("| scan, warm (ms) | {:.1} | {:.1} | {:.1} |", warm[0], warm[1], warm[2]);
    println!(
        "| growth per skill, warm / cold (µs) | {:.0} / {:.0} | | |",
        (warm[2] - warm[0]) * 1000.0 / 502.0,
        (cold[2] - cold[0]) * 1000.0 / 502.0
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
    install_archive(std::io::Cursor::new(&archive), dir.path(), false, &Snapshot::default(), ZipLimits::default(), 5)
        .expect("install");
    let seconds = started.elapsed().as_secs_f64();
    let megabytes = archive.len() as f64 / (1024.0 * 1024.0);
    println!("| ZIP install of a {megabytes:.0} MB archive (MB/s) | {:.0} | | |", megabytes / seconds);
}
