//! skillhost in front of llama-server (`--upstream`) against llama-server
//! alone, on the same model and requests:
//!
//! 1. Single-stream generation speed through skillhost over straight to
//!    llama-server, and the time to first token skillhost adds. Runs
//!    alternate; the prompt starts with the run number, so every one
//!    prefills in full on both sides.
//! 2. Prompt tokens the upstream re-decodes on a conversation's second turn
//!    over the tokens that turn added, with affinity routing and with
//!    round-robin over two upstreams.
//! 3. A two-round skills request through skillhost, wall time, over the
//!    same two generations (the very request bodies skillhost sent,
//!    recorded from its log) sent straight to a fresh llama-server.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

use super::{chat, median, stream, ServerProcess, MODEL};

/// Repetitions of measure 1; medians are reported.
const STREAM_RUNS: usize = 11;
/// Repetitions of measure 3 (each restarts llama-server for a cold cache).
const RUNS: usize = 3;
/// Conversations of measure 2.
const CONVERSATIONS: usize = 6;

fn llama_server(binary: &Path, threads: i32) -> ServerProcess {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let mut command = Command::new(binary);
    command
        .args(["-m", MODEL, "--host", "127.0.0.1", "--port", &port.to_string()])
        // 8192 tokens a slot, as skillhost's own bench runs.
        .args(["-t", &threads.to_string(), "-c", "32768", "-np", "4", "--no-webui"]);
    ServerProcess::spawn(command)
}

/// skillhost with `upstreams`; its log's lines go to `log` when given.
fn fronting(upstreams: &[&ServerProcess], extra: &[&str], log: Option<Arc<Mutex<Vec<String>>>>) -> ServerProcess {
    let binary = std::env::current_exe().expect("own path").with_file_name("skillhost");
    let mut command = Command::new(binary);
    command.args(["serve", "--port", "0", "--parallel", "8"]);
    for upstream in upstreams {
        command.args(["--upstream", &upstream.url]);
    }
    command.args(extra);
    // With a log to keep, the request bodies are logged at trace level.
    let level =
        if log.is_some() { "warn,skillhost=info,skillhost_engine::remote=trace" } else { "warn,skillhost=info" };
    command.env("RUST_LOG", level);
    let state = tempfile::tempdir().expect("a state folder");
    command.arg("--state-dir").arg(state.path());
    let mut server = ServerProcess::spawn_keeping_log(command, log);
    server._state = Some(state);
    server
}

pub fn run(binary: PathBuf, threads: i32) {
    println!("skillhost in front of llama-server (--upstream) vs llama-server alone:");
    println!("| measure | through skillhost | straight | ratio | goal |");
    println!("|---|---|---|---|---|");
    streaming(&binary, threads);
    turn_two(&binary, threads);
    skills_request(&binary, threads);
}

fn session(run: usize) -> Value {
    json!([
        {"role": "system", "content": format!("Session {run}. You are a helpful assistant who writes at length.")},
        {"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm. Describe the sea, the light, the ships and the people in detail."}
    ])
}

fn streaming(binary: &Path, threads: i32) {
    let upstream = llama_server(binary, threads);
    let front = fronting(&[&upstream], &["--no-skills"], None);
    let (mut ours, mut theirs, mut ttft_ours, mut ttft_theirs) = (vec![], vec![], vec![], vec![]);
    // One request each side first, so neither pays for a first connection.
    let _ = stream(&front.url, session(999));
    let _ = stream(&upstream.url, session(998));
    for run in 0..STREAM_RUNS {
        // Each side gets its own session number: nothing is cached for it.
        for (url, rate, ttft, tag) in [
            (&front.url, &mut ours, &mut ttft_ours, 2 * run),
            (&upstream.url, &mut theirs, &mut ttft_theirs, 2 * run + 1),
        ] {
            let result = stream(url, session(1000 + tag));
            rate.push(result.predicted_n as f64 / (result.gen_ms / 1000.0));
            ttft.push(result.ttft_ms);
        }
    }
    let (ours_tps, theirs_tps) = (median(ours), median(theirs));
    println!(
        "| generation, 1 stream (tokens/s) | {ours_tps:.1} | {theirs_tps:.1} | {:.2} | ≥ 0.97 |",
        ours_tps / theirs_tps
    );
    // Each run's two requests went back to back: their difference is what
    // skillhost adds, with the machine's drift between runs cancelled.
    let added = median(ttft_ours.iter().zip(&ttft_theirs).map(|(a, b)| a - b).collect());
    let (ours_ttft, theirs_ttft) = (median(ttft_ours), median(ttft_theirs));
    println!("| time to first token (ms) | {ours_ttft:.1} | {theirs_ttft:.1} | {added:+.1} ms (paired) | ≤ +5 ms |");
}

/// Re-decoded ÷ new tokens on turn 2, summed over the conversations.
fn second_turns(url: &str, round: usize) -> (u64, u64) {
    let (mut redecoded, mut new) = (0, 0);
    for i in 0..CONVERSATIONS {
        let question = json!([
            {"role": "system", "content": format!("Conversation {round}-{i}. You are a helpful assistant.")},
            {"role": "user", "content": "What is the capital of France?"}
        ]);
        let first = chat(url, json!({"messages": question, "temperature": 0, "max_tokens": 64}));
        let mut history = question.as_array().cloned().expect("messages");
        history.push(json!({"role": "assistant", "content": first["choices"][0]["message"]["content"]}));
        history.push(json!({"role": "user", "content": "And what is the capital of Italy?"}));
        let second = chat(url, json!({"messages": history, "temperature": 0, "max_tokens": 16}));
        // The end-of-turn token ends generation without being decoded.
        let answer = first["usage"]["completion_tokens"].as_u64().expect("usage").saturating_sub(1);
        let known = first["usage"]["prompt_tokens"].as_u64().expect("usage") + answer;
        new += second["usage"]["prompt_tokens"].as_u64().expect("usage").saturating_sub(known);
        redecoded += second["timings"]["prompt_n"].as_u64().expect("timings");
    }
    (redecoded, new.max(1))
}

fn turn_two(binary: &Path, threads: i32) {
    let per_upstream = (threads / 2).max(1);
    let (a, b) = (llama_server(binary, per_upstream), llama_server(binary, per_upstream));
    let mut ratios = Vec::new();
    for (round, routing) in ["affinity", "round-robin"].into_iter().enumerate() {
        let front = fronting(&[&a, &b], &["--no-skills", "--upstream-routing", routing], None);
        let (redecoded, new) = second_turns(&front.url, round);
        ratios.push((routing, redecoded, new));
    }
    let [(_, ours_re, ours_new), (_, rr_re, rr_new)] = ratios[..] else { unreachable!() };
    let affinity = ours_re as f64 / ours_new as f64;
    let round_robin = rr_re as f64 / rr_new as f64;
    println!(
        "| turn-2 tokens re-decoded ÷ new, {CONVERSATIONS} conversations, 2 upstreams | affinity {ours_re} ÷ {ours_new} = {affinity:.2} | round-robin {rr_re} ÷ {rr_new} = {round_robin:.2} | {:.2} | affinity 1.0 |",
        affinity
    );
}

/// Sends a recorded `/completion` body and reads its stream to the end.
fn replay(url: &str, body: &Value) {
    let mut response = ureq::post(&format!("{url}/completion"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("replay");
    let reader = BufReader::new(response.body_mut().as_reader());
    for line in reader.lines() {
        let line = line.expect("read stream");
        if line.contains("\"stop\":true") {
            break;
        }
    }
}

fn skills_request(binary: &Path, threads: i32) {
    let body = json!({
        "messages": [{"role": "user", "content": "Read the skill-authoring skill and say what it is for."}],
        "max_tokens": 300,
        "temperature": 0,
        "parallel_tool_calls": false,
    });
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let log = Arc::new(Mutex::new(Vec::new()));
        let upstream = llama_server(binary, threads);
        let front = fronting(&[&upstream], &["--skills-dir", "skills"], Some(Arc::clone(&log)));
        let started = Instant::now();
        let mut response = ureq::post(&format!("{}/v1/chat/completions", front.url))
            .header("Content-Type", "application/json")
            .header("x-skillhost-tool-choice", "skills_read")
            .send(body.to_string())
            .expect("request");
        let answer: Value = serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json");
        ours.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(answer["rounds"].as_array().map(Vec::len), Some(2), "not a two-round request: {answer}");
        let sent: Vec<Value> = log
            .lock()
            .expect("log")
            .iter()
            .filter(|line| line.contains("upstream request"))
            .filter_map(|line| line.split_once("body=").and_then(|(_, b)| serde_json::from_str(b.trim()).ok()))
            .collect();
        assert_eq!(
            sent.len(),
            2,
            "expected two recorded bodies: {:?}",
            sent.iter().map(|b| b["prompt"].as_str().map(str::len)).collect::<Vec<_>>()
        );
        drop(front);
        drop(upstream);
        // The same two generations, straight to a fresh llama-server.
        let fresh = llama_server(binary, threads);
        let started = Instant::now();
        for body in &sent {
            replay(&fresh.url, body);
        }
        theirs.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let (ours, theirs) = (median(ours), median(theirs));
    println!(
        "| two-round skills request, wall (ms) | {ours:.0} | {theirs:.0} (its two generations) | {:.2} | ≤ 1.05 |",
        ours / theirs
    );
}
