//! Attachments through the real server: the rate a 32 MiB upload to
//! `/v1/files` reaches the store, against writing (and syncing) the same
//! bytes to a file in the same folder in this process; and the prompt
//! tokens one attachment adds, by kind, counted by the server's own
//! `/v1/responses/input_tokens` with and without it.

use std::io::Write;
use std::time::Instant;

use base64::Engine;
use serde_json::{json, Value};

use crate::median;

/// The upload: the default `--max-attachment-bytes`.
const UPLOAD_BYTES: usize = 32 * 1024 * 1024;
/// Uploads timed; the median is reported.
const RUNS: usize = 5;

fn upload(url: &str, content: &[u8]) -> f64 {
    let boundary = "benchboundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"data.bin\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let started = Instant::now();
    let mut response = ureq::post(&format!("{url}/v1/files"))
        .header("Content-Type", &format!("multipart/form-data; boundary={boundary}"))
        .send(&body[..])
        .expect("upload");
    let made: Value = serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json");
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(made["bytes"], content.len(), "{made}");
    let id = made["id"].as_str().expect("an id");
    ureq::delete(&format!("{url}/v1/files/{id}")).call().expect("delete");
    elapsed
}

/// Writing and syncing `content` to a new file in `dir`, as the store's
/// spool and commit write it once each.
fn write_to_disk(dir: &std::path::Path, content: &[u8]) -> f64 {
    let started = Instant::now();
    let mut file = tempfile::NamedTempFile::new_in(dir).expect("a file");
    file.write_all(content).expect("write");
    file.as_file().sync_all().expect("sync");
    started.elapsed().as_secs_f64()
}

fn count(url: &str, content: Value) -> u64 {
    let body = json!({"input": [{"role": "user", "content": content}]});
    let mut response = ureq::post(&format!("{url}/v1/responses/input_tokens"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("count");
    let counted: Value = serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json");
    counted["input_tokens"].as_u64().expect("input_tokens")
}

pub fn run(url: &str, state: &std::path::Path) {
    let content: Vec<u8> = (0..UPLOAD_BYTES).map(|n| (n % 251) as u8).collect();
    upload(url, &content);
    let (mut server, mut disk) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        server.push(upload(url, &content));
        disk.push(write_to_disk(state, &content));
    }
    let (server, disk) = (median(server), median(disk));
    let rate = |seconds: f64| UPLOAD_BYTES as f64 / seconds / (1024.0 * 1024.0);
    println!(
        "  a 32 MiB upload to /v1/files           {:>8.0} MiB/s, {:.2}x writing and syncing it to a file here ({:.0} MiB/s)",
        rate(server),
        disk / server,
        rate(disk)
    );
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let text = json!([{"type": "input_text", "text": "Summarize the attached statement."}]);
    let plain = count(url, text.clone());
    let with = |part: Value| {
        let mut parts = text.as_array().expect("parts").clone();
        parts.push(part);
        count(url, Value::Array(parts)) - plain
    };
    let pdf = b"%PDF-1.4\n% a statement of 20 kB, as a bank exports it\n".repeat(400);
    let kinds = [
        ("a PDF (its line only)", json!({"type": "input_file", "filename": "statement.pdf", "file_data": b64(&pdf)})),
        (
            "an image (its line only)",
            json!({"type": "input_image", "image_url": format!("data:image/png;base64,{}", b64(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"))}),
        ),
        (
            "a 200-byte text file (inlined)",
            json!({"type": "input_file", "filename": "notes.txt", "file_data": b64("Rent 1200, power 80, water 30. ".repeat(6).as_bytes())}),
        ),
    ];
    for (kind, part) in kinds {
        println!("  prompt tokens an attachment adds: {kind:<32} {:>4}", with(part));
    }
}
