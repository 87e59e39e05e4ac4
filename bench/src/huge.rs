//! Row 5: a huge prompt must not stall the streams already running. A
//! stream's longest pause between two content frames, alone and while a
//! request with an 8 MB prompt arrives (tokenizing it takes seconds; it is
//! then refused as longer than the context), medians of three each.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Just under the server's 8 MiB body limit.
const HUGE_PROMPT_BYTES: usize = 8_000_000;
const ROUNDS: usize = 3;
const STREAM_TOKENS: usize = 192;

/// The longest gap between content frames of one stream, in ms.
fn longest_pause(url: &str, during: Option<&dyn Fn()>) -> f64 {
    super::mark_as_batch_work();
    let body = json!({
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "temperature": 0, "max_tokens": STREAM_TOKENS, "stream": true, "ignore_eos": true,
    });
    let mut response = ureq::post(&format!("{url}/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    let reader = BufReader::new(response.body_mut().as_reader());
    let (mut last, mut longest, mut frames) = (None::<Instant>, 0.0f64, 0usize);
    for line in reader.lines() {
        let line = line.expect("read stream");
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).expect("chunk");
        if chunk["choices"][0]["delta"]["content"].as_str().is_none_or(|s| s.is_empty()) {
            continue;
        }
        let now = Instant::now();
        frames += 1;
        // The huge request is sent once the stream is well under way.
        if frames == 16 {
            if let Some(start) = during {
                start();
            }
        }
        if let Some(previous) = last {
            longest = longest.max((now - previous).as_secs_f64() * 1000.0);
        }
        last = Some(now);
    }
    longest
}

/// Sends the huge prompt on another thread; returns how long it took to be
/// answered (it is refused: it does not fit the context).
fn send_huge(url: String) -> std::thread::JoinHandle<(u16, f64)> {
    std::thread::spawn(move || {
        let content = "lighthouse ".repeat(HUGE_PROMPT_BYTES / 11);
        let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 8}).to_string();
        let started = Instant::now();
        let status = match ureq::post(&format!("{url}/v1/chat/completions"))
            .header("Content-Type", "application/json")
            .config()
            .http_status_as_error(false)
            .build()
            .send(body)
        {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        };
        (status, started.elapsed().as_secs_f64() * 1000.0)
    })
}

/// `(alone, during, refused_after)`, in ms.
pub fn run(url: &str) -> (f64, f64, f64) {
    let (mut alone, mut during, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        std::thread::sleep(Duration::from_millis(300));
        alone.push(longest_pause(url, None));
        std::thread::sleep(Duration::from_millis(300));
        let sent = std::cell::RefCell::new(None);
        let start = || *sent.borrow_mut() = Some(send_huge(url.to_string()));
        during.push(longest_pause(url, Some(&start)));
        let handle = sent.into_inner().expect("the huge request was sent");
        let (status, ms) = handle.join().expect("huge request thread");
        assert_eq!(status, 400, "the 8 MB prompt was not refused as too long");
        refused.push(ms);
    }
    (super::median(alone), super::median(during), super::median(refused))
}
