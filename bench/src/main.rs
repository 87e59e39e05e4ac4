//! `make bench`: skillhost against a bare llama.cpp decode loop, side by side,
//! on the default model with the same thread count, printed as ratios.
//!
//! 1. Generation speed through `POST /v1/chat/completions` (streaming) over
//!    the bare loop's: the overhead of everything we add.
//! 2. Time to first token through HTTP minus the bare loop's prefill time.
//! 3. Aggregate generation speed with 1, 4 and 8 concurrent streams, and the
//!    time to first token at 8 streams.
//! 4. Prompt tokens re-decoded on a conversation's second turn over the
//!    tokens that turn added.
//! 5. A running stream's longest pause while an 8 MB prompt arrives, over
//!    its longest pause alone.
//!
//! Before those, the skills registry: scan time for 10, 100 and 512
//! generated skills, cold and warm, and ZIP install throughput; then code
//! execution: a sandboxed `true` over a plain one, and `apply_patch` on a
//! 10,000-line file with 50 hunks; then an MCP stdio server's call and cold
//! start, confined against not (see `mcp`). Then the Web UI stream: when each
//! round's frames of a two-round skills request arrive. Then four child
//! agents decoding together against the same generations one at a time
//! (see `agents`); what letting go of context costs in tokens decoded
//! again (see `budget`); what the state folder's store costs a turn, a
//! restart and the disk (see `store`); an upload's rate to the store and
//! the prompt tokens an attachment adds (see `attachments`).
//!
//! The bare loop runs in this process and the real `skillhost` binary in its
//! own; their runs alternate, one at a time, so they never share the CPU and
//! drift in the machine's speed hits both alike.
//!
//! Last, skillhost against llama.cpp's llama-server on the same settings
//! (see `baseline`): prefill, streams, a shared system prompt and a restart;
//! and skillhost in front of llama-server as its upstream against
//! llama-server alone (see `upstream`).

#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

mod agents;
mod attachments;
mod baseline;
mod budget;
mod exec;
mod huge;
mod lookup;
mod mcp;
mod models;
mod skills;
mod store;
mod upstream;
mod webui;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use serde_json::{json, Value};
use skillhost_engine::template::ChatTemplate;

const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
const N_CTX: u32 = 8192;
const N_PARALLEL: u32 = 8;
/// Tokens generated per measured request.
const MAX_TOKENS: usize = 128;
/// Repetitions of the single-stream measurements; the median is reported.
const RUNS: usize = 7;

/// The story request's system turn. The run number at the very front keeps
/// any run from reusing another's KV prefix, so every time to first token
/// includes a full prefill.
fn story_system(run: usize) -> String {
    format!("Session {run}. You are a helpful assistant who writes at length.")
}

const STORY_USER: &str = "Tell me a long story about a lighthouse keeper and a storm. Describe the sea, the light, the ships and the people in detail.";

fn messages(run: usize) -> Value {
    json!([{"role": "system", "content": story_system(run)}, {"role": "user", "content": STORY_USER}])
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (values.len() as f64 - 1.0)).round() as usize;
    values[rank.min(values.len() - 1)]
}

struct BareRun {
    prefill_ms: f64,
    gen_tokens_per_s: f64,
    n_generated: usize,
}

/// The bare loop's llama.cpp objects, created once.
struct Bare<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    template: ChatTemplate,
    batch: LlamaBatch<'static>,
}

impl<'m> Bare<'m> {
    fn new(backend: &LlamaBackend, model: &'m LlamaModel, threads: i32) -> Self {
        let ctx = model
            .new_context(backend, skillhost_engine::context_params(N_CTX, N_PARALLEL, threads, flash_attn()))
            .expect("context");
        let template_text = model.chat_template(None).ok().and_then(|t| t.to_string().ok());
        let template = ChatTemplate::for_model(template_text.as_deref(), "llama", "", "").expect("template");
        let batch = LlamaBatch::new(skillhost_engine::BATCH_SIZE as usize, 1);
        Bare { model, ctx, template, batch }
    }

    /// The measuring thread may have been marked as batch work by a stream;
    /// the bare loop decodes in the normal class, as the engine thread does.
    fn run_at_normal_priority(&mut self, run: usize) -> BareRun {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
        self.run(run)
    }

    /// Prefill, then one token per decode, greedy, on the engine's own
    /// context parameters.
    fn run(&mut self, run: usize) -> BareRun {
        let prompt = self.template.render(&messages(run), None, true).expect("render");
        let tokens = self.model.vocab().tokenize(prompt.as_bytes(), false, true);
        self.ctx.clear_kv_cache();
        let mut sampler = LlamaSampler::chain_simple([LlamaSampler::greedy()]);
        let started = Instant::now();
        self.batch.clear();
        for (i, token) in tokens.iter().enumerate() {
            self.batch.add(*token, i as i32, &[0], i + 1 == tokens.len()).expect("batch");
        }
        self.ctx.decode(&mut self.batch).expect("decode");
        let mut token = sampler.sample(&self.ctx, self.batch.n_tokens() - 1);
        let first = Instant::now();
        let mut n_generated = 1;
        let mut pos = tokens.len() as i32;
        while n_generated < MAX_TOKENS && !self.model.vocab().is_eog(token) {
            self.batch.clear();
            self.batch.add(token, pos, &[0], true).expect("batch");
            pos += 1;
            self.ctx.decode(&mut self.batch).expect("decode");
            token = sampler.sample(&self.ctx, 0);
            n_generated += 1;
        }
        let done = Instant::now();
        BareRun {
            prefill_ms: (first - started).as_secs_f64() * 1000.0,
            gen_tokens_per_s: (n_generated - 1) as f64 / (done - first).as_secs_f64(),
            n_generated,
        }
    }
}

/// The real server, started as an operator would.
struct ServerProcess {
    child: Child,
    url: String,
    /// Its state folder, never the host's (and each server its own).
    _state: Option<tempfile::TempDir>,
}

impl ServerProcess {
    fn start(threads: i32) -> Self {
        Self::start_with(threads, &[])
    }

    fn start_with(threads: i32, extra: &[&str]) -> Self {
        Self::spawn_skillhost(Self::serve(threads, extra))
    }

    /// [`Self::start_with`] on the state folder `state`.
    fn start_on(threads: i32, extra: &[&str], state: &std::path::Path) -> Self {
        let mut command = Self::serve(threads, extra);
        command.arg("--state-dir").arg(state);
        Self::spawn(command)
    }

    /// `skillhost serve` on the default model, as the figures run it.
    fn serve(threads: i32, extra: &[&str]) -> Command {
        // The server binary sits next to this one, wherever cargo put both.
        let binary = std::env::current_exe().expect("own path").with_file_name("skillhost");
        assert!(binary.exists(), "build the server first: cargo build --release");
        let mut command = Command::new(&binary);
        command
            .args(["serve", "--model", MODEL, "--port", "0", "--parallel", &N_PARALLEL.to_string()])
            .args(["--ctx-size", &N_CTX.to_string(), "--threads", &threads.to_string()])
            .args(extra)
            .env("RUST_LOG", "warn,skillhost=info");
        command
    }

    /// Starts skillhost on a state folder of its own.
    fn spawn_skillhost(mut command: Command) -> Self {
        let state = tempfile::tempdir().expect("a state folder");
        command.arg("--state-dir").arg(state.path());
        let mut server = Self::spawn(command);
        server._state = Some(state);
        server
    }

    /// Starts a server that logs `listening on URL` to stderr and answers
    /// `GET /health` once ready (skillhost and llama-server both do).
    fn spawn(command: Command) -> Self {
        Self::spawn_keeping_log(command, None)
    }

    /// [`Self::spawn`], keeping every later log line in `log` when given.
    fn spawn_keeping_log(mut command: Command, log: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>) -> Self {
        let mut child = command.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("start skillhost");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            let line = lines.next().expect("the server exited before listening").expect("read log");
            if let Some(at) = line.find("listening on ") {
                break line[at + "listening on ".len()..].trim().to_string();
            }
        };
        // Keep draining the log so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Some(log) = &log {
                    log.lock().expect("log").push(line);
                }
            }
        });
        let server = ServerProcess { child, url, _state: None };
        // Asked often: the restart figure is the time to this answer.
        for _ in 0..12_000 {
            if ureq::get(&format!("{}/health", server.url)).call().is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the server never became healthy");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the client saw of one streamed request.
struct StreamRun {
    ttft_ms: f64,
    /// From the first content frame to the last one.
    gen_ms: f64,
    predicted_n: usize,
    started: Instant,
    finished: Instant,
}

fn stream(url: &str, messages: Value) -> StreamRun {
    stream_with(url, messages, None)
}

/// [`stream`], telling `generating` when the first content arrives.
fn stream_with(url: &str, messages: Value, generating: Option<std::sync::mpsc::Sender<()>>) -> StreamRun {
    // The client shares this machine's cores with the server only because
    // this is a benchmark; as batch work its wakeups do not preempt decoding,
    // as they would not from another machine.
    mark_as_batch_work();
    let body = json!({"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": true});
    let started = Instant::now();
    let mut response = ureq::post(&format!("{url}/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    let reader = BufReader::new(response.body_mut().as_reader());
    let (mut first, mut last, mut predicted_n) = (None, None, 0);
    for line in reader.lines() {
        let line = line.expect("read stream");
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).expect("chunk");
        let now = Instant::now();
        if chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|s| !s.is_empty()) {
            if first.is_none() {
                if let Some(generating) = &generating {
                    let _ = generating.send(());
                }
            }
            first.get_or_insert(now);
            last = Some(now);
        }
        if let Some(n) = chunk["timings"]["predicted_n"].as_u64() {
            predicted_n = n as usize;
        }
    }
    let finished = Instant::now();
    let first = first.expect("no content arrived");
    let last = last.unwrap_or(first);
    StreamRun {
        ttft_ms: (first - started).as_secs_f64() * 1000.0,
        gen_ms: (last - first).as_secs_f64() * 1000.0,
        predicted_n,
        started,
        finished,
    }
}

fn mark_as_batch_work() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
}

fn chat(url: &str, body: Value) -> Value {
    let mut response = ureq::post(&format!("{url}/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json")
}

fn concurrent(url: &str, n: usize, round: usize) -> (f64, Vec<f64>) {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let url = url.to_string();
            std::thread::spawn(move || stream(&url, messages(round * 100 + i)))
        })
        .collect();
    let runs: Vec<StreamRun> = handles.into_iter().map(|h| h.join().expect("stream thread")).collect();
    let start = runs.iter().map(|r| r.started).min().expect("runs");
    let end = runs.iter().map(|r| r.finished).max().expect("runs");
    let tokens: usize = runs.iter().map(|r| r.predicted_n).sum();
    (tokens as f64 / (end - start).as_secs_f64(), runs.iter().map(|r| r.ttft_ms).collect())
}

fn main() {
    std::env::set_current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")).expect("cd to the repository");
    assert!(Path::new(MODEL).exists(), "{MODEL} is missing: run `make model`");
    // `skillhost-bench skills`, `exec`, `mcp`, `lookup`, `models`, `agents`, `budget`, `store`, `webui`,
    // `model`, `baseline`, `upstream`, `lookup-engine` and `lookup-servers`
    // (the two halves of `lookup`), `huge` (row 5 alone) or `steps` (a decode step's
    // cost by its positions, which `lookup` prints first, and by the
    // sequences in it over a crowded cache) runs one part.
    let only = std::env::args().nth(1);
    let wanted = |part: &str| only.as_deref().is_none_or(|o| o == part);
    if only.as_deref() == Some("steps") {
        lookup::print_step_costs(true);
        return;
    }
    if only.as_deref() == Some("huge") {
        let server = ServerProcess::start(std::thread::available_parallelism().map_or(1, |n| n.get()) as i32);
        let (alone, during, refused) = huge::run(&server.url);
        println!("longest pause alone {alone:.1} ms, while an 8 MB prompt arrives {during:.1} ms, refused after {refused:.0} ms");
        return;
    }
    if wanted("skills") {
        println!("skills registry and installs:");
        skills::run();
        println!();
    }
    if wanted("exec") {
        println!("code execution:");
        exec::run();
        println!();
    }
    if wanted("mcp") {
        println!("MCP servers:");
        mcp::run();
        println!();
    }
    if wanted("lookup") || only.as_deref() == Some("lookup-engine") {
        lookup::run();
        println!();
    }
    if wanted("models") {
        println!("several models in one process:");
        models::run();
        println!();
    }
    if wanted("agents") {
        agents::run();
        println!();
    }
    if wanted("budget") {
        budget::run();
        println!();
    }
    if wanted("store") {
        println!("the state folder's store:");
        store::run_offline();
    }
    let served = ["model", "webui", "baseline", "lookup", "lookup-servers", "upstream", "store", "attachments"];
    if !served.iter().any(|part| wanted(part)) {
        return;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as i32;
    let status = Command::new("cargo").args(["build", "--release", "-p", "skillhost"]).status().expect("cargo");
    assert!(status.success(), "building the server failed");
    if wanted("webui") {
        println!("Web UI stream of a two-round skills request:");
        let server = ServerProcess::start_with(threads, &["--skills-dir", "skills"]);
        webui::run(&server.url);
        println!();
    }
    if wanted("store") {
        let server = ServerProcess::start_with(threads, &["--no-skills"]);
        store::run_turns(&server.url);
        drop(server);
        store::run_restart(threads);
        println!();
    }
    if wanted("attachments") {
        println!("attachments:");
        let server = ServerProcess::start_with(threads, &["--no-skills"]);
        let state = server._state.as_ref().expect("its own state folder").path().to_path_buf();
        attachments::run(&server.url, &state);
        println!();
    }
    if wanted("model") {
        model_table(threads);
    }
    if wanted("baseline") {
        let binary = llama_server();
        eprintln!(
            "llama.cpp: ours from llama-cpp-sys-2 {}, llama-server's from {}",
            llama_cpp_sys_version(),
            binary.display()
        );
        baseline::run(binary, threads);
    }
    if wanted("lookup") || only.as_deref() == Some("lookup-servers") {
        baseline::lookup(llama_server(), threads);
    }
    if wanted("upstream") {
        println!();
        upstream::run(llama_server(), threads);
    }
}

/// The engine's default flash-attention policy, for the bare loops.
fn flash_attn() -> i32 {
    skillhost_engine::flash_attention(skillhost_engine::FlashAttn::default())
}

/// llama-server: `LLAMA_SERVER`, else the one `scripts/build-llama-server.sh`
/// builds (once) or finds in its cache.
fn llama_server() -> PathBuf {
    if let Some(path) = std::env::var_os("LLAMA_SERVER") {
        return PathBuf::from(path);
    }
    let output = Command::new("scripts/build-llama-server.sh").output().expect("scripts/build-llama-server.sh");
    assert!(output.status.success(), "building llama-server failed: {}", String::from_utf8_lossy(&output.stderr));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// The llama-cpp-sys-2 release in the lock file, which pins our llama.cpp.
fn llama_cpp_sys_version() -> String {
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"llama-cpp-sys-2\"" {
            return lines.next().unwrap_or_default().trim_start_matches("version = ").trim_matches('"').to_string();
        }
    }
    "unknown".into()
}

/// The bare loop against the server, concurrency, the second turn and the
/// 8 MB prompt.
fn model_table(threads: i32) {
    llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default().with_logs_enabled(false));
    let backend = LlamaBackend::init().expect("llama backend");
    let model = LlamaModel::load_from_file(&backend, MODEL, &LlamaModelParams::default()).expect("model");
    let mut bare = Bare::new(&backend, &model, threads);
    let server = ServerProcess::start(threads);

    // Bare and HTTP runs alternate, so drift in the machine's speed hits both
    // alike; each side gets one unmeasured run first (the first decode of a
    // fresh context allocates its compute graph). The pauses let the other
    // side's idle threads stop spinning.
    eprintln!("{RUNS} alternating runs of {MAX_TOKENS} tokens, bare loop and HTTP, {threads} threads…");
    let pause = || std::thread::sleep(Duration::from_millis(300));
    bare.run_at_normal_priority(9998);
    pause();
    stream(&server.url, messages(9999));
    let (mut bare_runs, mut http_runs) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        pause();
        bare_runs.push(bare.run_at_normal_priority(1000 + run));
        pause();
        http_runs.push(stream(&server.url, messages(2000 + run)));
    }
    assert_eq!(
        http_runs[0].predicted_n, bare_runs[0].n_generated,
        "the bare loop and the server generated different lengths"
    );
    let bare_tps = median(bare_runs.iter().map(|r| r.gen_tokens_per_s).collect());
    let bare_prefill = median(bare_runs.iter().map(|r| r.prefill_ms).collect());
    let http_tps = median(http_runs.iter().map(|r| (r.predicted_n - 1) as f64 / (r.gen_ms / 1000.0)).collect());
    let http_ttft = median(http_runs.iter().map(|r| r.ttft_ms).collect());
    drop(bare);

    // Concurrency levels alternate too; the median of three rounds each.
    let levels = [1usize, 4, 8];
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); levels.len()];
    let mut ttft_8 = Vec::new();
    for round in 0..3 {
        for (i, &n) in levels.iter().enumerate() {
            pause();
            let (tps, ttfts) = concurrent(&server.url, n, 30 + round * 10 + i);
            rounds[i].push(tps);
            if n == 8 {
                ttft_8.extend(ttfts);
            }
        }
    }
    let aggregate: Vec<(usize, f64)> = levels.iter().zip(rounds).map(|(&n, tps)| (n, median(tps))).collect();

    // A question the model answers and ends on its own, so every answer token
    // was decoded into the KV cache and the second turn can skip all of it.
    let question = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}
    ]);
    let first = chat(&server.url, json!({"messages": question, "temperature": 0, "max_tokens": 64}));
    assert_eq!(first["choices"][0]["finish_reason"], "stop", "the first turn did not end on its own: {first}");
    let mut history = question.as_array().cloned().expect("messages");
    history.push(json!({"role": "assistant", "content": first["choices"][0]["message"]["content"]}));
    history.push(json!({"role": "user", "content": "And what is the capital of Italy?"}));
    let second = chat(&server.url, json!({"messages": history, "temperature": 0, "max_tokens": 32}));
    // The end-of-turn token ends generation without being decoded or shown.
    let answer_tokens = first["usage"]["completion_tokens"].as_u64().expect("usage") - 1;
    let known = first["usage"]["prompt_tokens"].as_u64().expect("usage") + answer_tokens;
    let new_tokens = second["usage"]["prompt_tokens"].as_u64().expect("usage") - known;
    let redecoded = second["timings"]["prompt_n"].as_u64().expect("timings");

    let (alone_pause, huge_pause, huge_refused) = huge::run(&server.url);

    let single = aggregate[0].1;
    println!();
    println!(
        "skillhost bench: {MODEL}, {threads} threads, ctx {N_CTX}, {N_PARALLEL} slots, {MAX_TOKENS} tokens per request"
    );
    println!("| # | measure | skillhost | baseline | result | goal |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| 1 | generation tok/s, HTTP stream ÷ bare loop | {http_tps:.1} | {bare_tps:.1} | {:.3} | ≥ 0.97 |",
        http_tps / bare_tps
    );
    println!(
        "| 2 | time to first token, HTTP − bare prefill (ms) | {http_ttft:.1} | {bare_prefill:.1} | {:+.1} | ≤ 5 |",
        http_ttft - bare_prefill
    );
    for (n, tps) in &aggregate {
        println!("| 3 | aggregate tok/s, {n} stream(s) | {tps:.1} | | | |");
    }
    println!(
        "| 3 | 8-stream aggregate ÷ single stream | {:.1} | {single:.1} | {:.2} | ≥ 1.3 |",
        aggregate[2].1,
        aggregate[2].1 / single
    );
    println!(
        "| 3 | time to first token at 8 streams, p50 / p99 (ms) | {:.0} / {:.0} | | | |",
        percentile(ttft_8.clone(), 50.0),
        percentile(ttft_8, 99.0)
    );
    println!(
        "| 4 | second-turn prompt tokens decoded ÷ new tokens | {redecoded} | {new_tokens} | {:.2} | 1.0 |",
        redecoded as f64 / new_tokens.max(1) as f64
    );
    println!(
        "| 5 | longest pause of a running stream while an 8 MB prompt arrives ÷ alone (ms; refused after {huge_refused:.0} ms) | {huge_pause:.1} | {alone_pause:.1} | {:.2} | ≤ 2 |",
        huge_pause / alone_pause
    );
}
