//! skillhost against llama.cpp's own llama-server, side by side: the same
//! model, threads, context and slots (`-kvu`: one KV buffer, the whole
//! context for every request, as skillhost runs), the same requests through
//! the same streaming client. The two servers take turns, one request or one
//! round at a time, so they never share the CPU; each figure is the median of
//! three rounds, with the range beside it.
//!
//! llama-server comes from `scripts/build-llama-server.sh` (the llama.cpp tree
//! vendored in the llama-cpp-python sdist, built once into a cache outside
//! the clone); `LLAMA_SERVER=path` names another binary.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{concurrent, median, percentile, ServerProcess, MODEL, N_CTX, N_PARALLEL};

/// Rounds of every side-by-side measure.
const ROUNDS: usize = 3;
/// Rounds of the drafting comparison: prose gains or loses a few percent
/// with drafting, less than a round of it varies on a busy host.
const LOOKUP_ROUNDS: usize = 5;
/// Tokens in the shared system prompt of the prefix measures.
const SHARED_SYSTEM_TOKENS: usize = 1500;

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Skillhost,
    LlamaServer,
}

const SIDES: [Side; 2] = [Side::Skillhost, Side::LlamaServer];

struct Baseline {
    binary: PathBuf,
    threads: i32,
}

impl Baseline {
    fn start(&self, side: Side, extra: &[&str]) -> ServerProcess {
        match side {
            Side::Skillhost => ServerProcess::start_with(self.threads, &[&["--no-skills"], extra].concat()),
            Side::LlamaServer => {
                let port = free_port();
                let mut command = Command::new(&self.binary);
                command
                    .args(["-m", MODEL, "--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["-t", &self.threads.to_string(), "-c", &N_CTX.to_string()])
                    .args(["-np", &N_PARALLEL.to_string(), "-kvu", "--no-webui"]);
                ServerProcess::spawn(command)
            }
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Roughly `tokens` tokens of text that no other request shares (the tag
/// comes first, so not even the chat template's opening is reused past it).
fn filler(tag: &str, tokens: usize) -> String {
    const WORDS: [&str; 16] = [
        "harbour", "lantern", "gull", "tide", "rope", "keeper", "storm", "cliff", "wave", "signal", "mast", "fog",
        "beacon", "shore", "current", "night",
    ];
    let mut text = format!("{tag}.");
    // One word is about one token for this tokenizer, give or take.
    for i in 0..tokens {
        text.push(' ');
        text.push_str(WORDS[(i * 7 + tag.len()) % WORDS.len()]);
    }
    text
}

/// One non-streamed request of one generated token; its `timings`.
fn prefill(url: &str, system: &str, user: &str) -> (Value, f64) {
    let body = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 1,
        "temperature": 0,
    });
    let started = Instant::now();
    let mut response = ureq::post(&format!("{url}/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    let answer: Value = serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json");
    (answer["timings"].clone(), started.elapsed().as_secs_f64() * 1000.0)
}

fn prompt_rate(url: &str, tag: &str, tokens: usize) -> f64 {
    let (timings, _) = prefill(url, &filler(tag, tokens), "Summarise.");
    timings["prompt_per_second"].as_f64().expect("prompt_per_second")
}

/// A row's figures per side: every round's value.
#[derive(Default)]
struct Row {
    ours: Vec<f64>,
    theirs: Vec<f64>,
}

impl Row {
    fn push(&mut self, side: Side, value: f64) {
        match side {
            Side::Skillhost => self.ours.push(value),
            Side::LlamaServer => self.theirs.push(value),
        }
    }

    /// `| measure | ours (range) | theirs (range) | ratio | goal |`; the ratio
    /// is ours over theirs, or theirs over ours when lower is better.
    fn print(&self, measure: &str, lower_is_better: bool, goal: &str) {
        let (ours, theirs) = (median(self.ours.clone()), median(self.theirs.clone()));
        let ratio = if lower_is_better { theirs / ours } else { ours / theirs };
        println!(
            "| {measure} | {ours:.1} ({}) | {theirs:.1} ({}) | {ratio:.2} | {goal} |",
            range(&self.ours),
            range(&self.theirs)
        );
    }
}

fn range(values: &[f64]) -> String {
    range_to(values, 1)
}

/// `min–max` with `digits` decimals.
fn range_to(values: &[f64], digits: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.digits$}–{max:.digits$}")
}

fn pause() {
    std::thread::sleep(Duration::from_millis(300));
}

pub fn run(binary: PathBuf, threads: i32) {
    let baseline = Baseline { binary, threads };
    let (mut fresh_500, mut fresh_3000) = (Row::default(), Row::default());
    eprintln!("prefill on fresh servers, {ROUNDS} rounds…");
    for round in 0..ROUNDS {
        for side in SIDES {
            let server = baseline.start(side, &[]);
            prefill(&server.url, "warm-up", "hi");
            fresh_500.push(side, prompt_rate(&server.url, &format!("Fresh {round} short"), 500));
            pause();
            fresh_3000.push(side, prompt_rate(&server.url, &format!("Fresh {round} long"), 3000));
        }
    }

    eprintln!("1, 4 and 8 streams, {ROUNDS} rounds…");
    let levels = [1usize, 4, 8];
    let mut aggregate: Vec<Row> = levels.iter().map(|_| Row::default()).collect();
    let (mut ttft_8, mut after_streams) = (Row::default(), Row::default());
    let servers: Vec<ServerProcess> = SIDES.iter().map(|&side| baseline.start(side, &[])).collect();
    for round in 0..ROUNDS {
        // The sides take turns at every level, so drift in the machine's
        // speed between minutes hits both alike.
        for (i, &n) in levels.iter().enumerate() {
            for (side, server) in SIDES.iter().zip(&servers) {
                pause();
                let (tps, ttfts) = concurrent(&server.url, n, 500 + round * 10 + i);
                aggregate[i].push(*side, tps);
                if n == 8 {
                    ttft_8.push(*side, percentile(ttfts, 50.0));
                }
            }
        }
        // The eight conversations stay cached in their slots.
        for (side, server) in SIDES.iter().zip(&servers) {
            pause();
            after_streams.push(*side, prompt_rate(&server.url, &format!("After {round}"), 3000));
        }
    }
    drop(servers);

    eprintln!("a new conversation whose system prompt another slot holds, {ROUNDS} rounds…");
    let mut shared = Row::default();
    let mut shared_prefilled = Row::default();
    let servers: Vec<ServerProcess> = SIDES.iter().map(|&side| baseline.start(side, &[])).collect();
    for round in 0..ROUNDS {
        let system = filler(&format!("Shared {round}"), SHARED_SYSTEM_TOKENS);
        for (side, server) in SIDES.iter().zip(&servers) {
            pause();
            // Conversation A holds the system prompt in its slot and is still
            // generating when conversation B arrives.
            let url = server.url.clone();
            let first = system.clone();
            let (generating, started) = std::sync::mpsc::channel();
            let running = std::thread::spawn(move || {
                let messages =
                    json!([{"role": "system", "content": first}, {"role": "user", "content": "Tell me a long story."}]);
                super::stream_with(&url, messages, Some(generating))
            });
            started.recv().expect("conversation A started generating");
            let (timings, ms) = prefill(&server.url, &system, "What is the capital of France?");
            shared.push(*side, ms);
            shared_prefilled.push(*side, timings["prompt_n"].as_f64().unwrap_or(f64::NAN));
            running.join().expect("conversation A");
        }
    }
    drop(servers);

    eprintln!("the first request after a restart, {ROUNDS} rounds…");
    let mut restarted = Row::default();
    let mut restarted_prefilled = Row::default();
    let cache = tempfile::tempdir().expect("prefix cache folder");
    let cache_dir = cache.path().to_string_lossy().into_owned();
    for round in 0..ROUNDS {
        let system = filler(&format!("Restart {round}"), SHARED_SYSTEM_TOKENS);
        // Two conversations make the system prompt the shared prefix, which
        // skillhost saves; then both servers restart.
        {
            let server = baseline.start(Side::Skillhost, &["--prefix-cache", &cache_dir]);
            prefill(&server.url, &system, "Hello.");
            prefill(&server.url, &system, "Good morning.");
        }
        for side in SIDES {
            pause();
            let server = match side {
                Side::Skillhost => baseline.start(side, &["--prefix-cache", &cache_dir]),
                Side::LlamaServer => baseline.start(side, &[]),
            };
            let (timings, ms) = prefill(&server.url, &system, "What is the capital of France?");
            restarted.push(side, ms);
            restarted_prefilled.push(side, timings["prompt_n"].as_f64().unwrap_or(f64::NAN));
        }
    }

    println!();
    println!(
        "skillhost vs llama-server ({}): {MODEL}, {threads} threads, ctx {N_CTX}, {N_PARALLEL} slots, unified KV, median of {ROUNDS} (min–max)",
        baseline.binary.display()
    );
    println!("| measure | skillhost | llama-server | skillhost ÷ llama-server | goal |");
    println!("|---|---|---|---|---|");
    fresh_500.print("prefill of ~500 tokens, fresh server, tok/s", false, "≥ 1.0");
    fresh_3000.print("prefill of ~3,000 tokens, fresh server, tok/s", false, "≥ 1.0");
    after_streams.print("prefill of ~3,000 tokens after the 8-stream runs, tok/s", false, "≥ 1.0");
    for (row, n) in aggregate.iter().zip(levels) {
        row.print(&format!("aggregate generation at {n} stream(s), tok/s"), false, "≥ 1.0");
    }
    ttft_8.print("time to first token at 8 streams, p50 ms (ratio: theirs ÷ ours)", true, "≥ 1.0");
    shared.print(
        &format!("new conversation, {SHARED_SYSTEM_TOKENS}-token system prompt held by a running slot, ms to its answer (theirs ÷ ours)"),
        true,
        "≥ 1.0",
    );
    shared_prefilled.print("  … prompt tokens it decoded (theirs ÷ ours)", true, "copy, not prefill");
    restarted.print("first request after a restart, same system prompt, ms (theirs ÷ ours)", true, "≥ 1.0");
    restarted_prefilled.print("  … prompt tokens it decoded (theirs ÷ ours)", true, "no prefill of the prefix");
}

/// llama-server's n-gram speculation types, as its `--help` lists them for
/// `--spec-type` (builds differ; the table says which were tried).
fn ngram_spec_types(binary: &PathBuf) -> Vec<String> {
    let help = Command::new(binary).arg("--help").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let help = help.unwrap_or_default();
    // The option's own line lists the kinds: `--spec-type none,draft-simple,…,ngram-cache`.
    help.lines()
        .filter_map(|line| line.trim_start().strip_prefix("--spec-type "))
        .flat_map(|rest| rest.split_whitespace().next().unwrap_or_default().split(','))
        .filter(|kind| kind.starts_with("ngram"))
        .map(str::to_string)
        .collect()
}

/// One greedy, non-streamed chat request; the answer.
fn greedy_chat(url: &str, prompt: &str, max_tokens: u32) -> Value {
    let body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    let mut response = ureq::post(&format!("{url}/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json")
}

/// Decode tokens a second of one greedy request (the server's own
/// `predicted_per_second`), and its text.
fn decode_rate(url: &str, prompt: &str, max_tokens: u32) -> (f64, String) {
    let answer = greedy_chat(url, prompt, max_tokens);
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
    (answer["timings"]["predicted_per_second"].as_f64().unwrap_or(f64::NAN), text)
}

/// Generated tokens a second over `prompts` sent at once (wall time).
fn aggregate_rate(url: &str, prompts: &[(String, u32)]) -> f64 {
    let started = Instant::now();
    let handles: Vec<_> = prompts
        .iter()
        .map(|(prompt, max_tokens)| {
            let (url, prompt, max_tokens) = (url.to_string(), prompt.clone(), *max_tokens);
            std::thread::spawn(move || {
                greedy_chat(&url, &prompt, max_tokens)["usage"]["completion_tokens"].as_f64().unwrap_or(0.0)
            })
        })
        .collect();
    let tokens: f64 = handles.into_iter().map(|h| h.join().expect("request thread")).sum();
    tokens / started.elapsed().as_secs_f64()
}

/// Speculative decoding from the context, side by side: skillhost on its
/// default attention (`auto`: fused on the CPU) with drafting and without,
/// both named so the rows stay what they say whatever the defaults, against
/// llama-server without speculation and with each n-gram `--spec-type` its
/// build offers; every server is up at once and they take turns request by
/// request. (`--flash-attn prefill`'s rows are in docs/benchmarks.md from
/// earlier runs.)
pub fn lookup(binary: PathBuf, threads: i32) {
    let baseline = Baseline { binary: binary.clone(), threads };
    // `LOOKUP_SPEC_TYPES=a,b` (or empty) measures only those of its kinds.
    let types = match std::env::var("LOOKUP_SPEC_TYPES") {
        Ok(list) => list.split(',').filter(|kind| !kind.is_empty()).map(str::to_string).collect(),
        Err(_) => ngram_spec_types(&binary),
    };
    let mut configs: Vec<(String, Side, Vec<String>)> = vec![
        (
            "skillhost --flash-attn auto --spec-lookup".into(),
            Side::Skillhost,
            vec!["--flash-attn".into(), "auto".into(), "--spec-lookup".into()],
        ),
        (
            "skillhost --flash-attn auto --spec-lookup=false".into(),
            Side::Skillhost,
            vec!["--flash-attn".into(), "auto".into(), "--spec-lookup=false".into()],
        ),
        ("llama-server".into(), Side::LlamaServer, vec![]),
        ("llama-server -fa off".into(), Side::LlamaServer, vec!["-fa".into(), "off".into()]),
    ];
    // Its n-gram kinds with flash attention off, as ours: on the CPU that
    // checks drafts for less (its default is on).
    for kind in &types {
        configs.push((
            format!("llama-server -fa off --spec-type {kind}"),
            Side::LlamaServer,
            vec!["-fa".into(), "off".into(), "--spec-type".into(), kind.clone()],
        ));
    }
    let copy = super::lookup::copy_prompt();
    let prose = super::lookup::prose_prompt("a lighthouse keeper");
    let mixed: Vec<(String, u32)> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                (copy.clone(), 300)
            } else {
                (super::lookup::prose_prompt(&format!("a traveller, day {i}")), 300)
            }
        })
        .collect();
    // Every server is up for the whole run and they take turns request by
    // request, each round in another order, so a drift in the host's speed
    // (minutes apart, it moved prose by 0.6× to 1.8× when each server ran its
    // three workloads in a block of its own) falls on every server of a round
    // alike, and each goal is judged on its ratio within a round.
    eprintln!("drafting from the context against llama-server ({}), {LOOKUP_ROUNDS} rounds…", types.join(", "));
    let servers: Vec<ServerProcess> = configs
        .iter()
        .map(|(_, side, extra)| {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let server = baseline.start(*side, &extra);
            decode_rate(&server.url, "Say hello.", 8);
            server
        })
        .collect();
    // rows[config][workload][round]
    let mut rows: Vec<[Vec<f64>; 3]> = configs.iter().map(|_| Default::default()).collect();
    let mut texts: Vec<Option<String>> = configs.iter().map(|_| None).collect();
    for round in 0..LOOKUP_ROUNDS {
        let started = Instant::now();
        let order: Vec<usize> = (0..configs.len()).map(|i| (i + round) % configs.len()).collect();
        for &i in &order {
            pause();
            let (copy_rate, text) = decode_rate(&servers[i].url, &copy, 400);
            texts[i].get_or_insert(text);
            rows[i][0].push(copy_rate);
        }
        for &i in &order {
            pause();
            rows[i][1].push(decode_rate(&servers[i].url, &prose, 300).0);
        }
        for &i in &order {
            pause();
            rows[i][2].push(aggregate_rate(&servers[i].url, &mixed));
        }
        eprintln!("  round {}: {:.0} s", round + 1, started.elapsed().as_secs_f64());
    }
    drop(servers);
    println!();
    println!(
        "drafting from the context, decode tok/s (greedy), median of {LOOKUP_ROUNDS} (min–max), {threads} threads, every server up, taking turns request by request:"
    );
    println!(
        "| server | copy-heavy turn | prose | 8 streams, copy and prose (aggregate) | copy text: as the first row's; lines copied |"
    );
    println!("|---|---|---|---|---|");
    for (i, (name, _, _)) in configs.iter().enumerate() {
        let cell = |values: &Vec<f64>| format!("{:.1} ({})", median(values.clone()), range(values));
        println!("| {name} | {} | {} | {} | {} |", cell(&rows[i][0]), cell(&rows[i][1]), cell(&rows[i][2]), {
            let text = texts[i].as_deref().unwrap_or_default();
            let (copied, lines) = super::lookup::copied_lines(text);
            format!("{}; {copied} of {lines}", if texts[i] == texts[0] { "same" } else { "differs" })
        });
    }
    // Each goal's ratio within every round: ours with drafting (row 0) over
    // ours without (row 1), or over the fastest llama-server of that round.
    let theirs: Vec<usize> = (0..configs.len()).filter(|&i| configs[i].1 == Side::LlamaServer).collect();
    let ratios = |column: usize, against_theirs: bool| -> Vec<f64> {
        (0..LOOKUP_ROUNDS)
            .map(|round| {
                let baseline = if against_theirs {
                    theirs.iter().map(|&i| rows[i][column][round]).fold(0.0, f64::max)
                } else {
                    rows[1][column][round]
                };
                rows[0][column][round] / baseline
            })
            .collect()
    };
    let goal = |values: Vec<f64>| format!("{:.2}× ({}×)", median(values.clone()), range_to(&values, 2));
    println!(
        "within each round, median (min–max): copy-heavy {} our decode without lookup on the same attention (goal ≥ 2.0), {} llama-server's best (goal ≥ 1.2); prose {} without lookup (goal ≥ 0.97); 8 streams {} llama-server's best (goal ≥ 1.0)",
        goal(ratios(0, false)),
        goal(ratios(0, true)),
        goal(ratios(1, false)),
        goal(ratios(2, true))
    );
}
