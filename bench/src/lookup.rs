//! Speculative decoding from the context (`--spec-lookup`): the same greedy
//! requests on two engines in this process, drafting off and on, one run
//! of each in turn so drift in the machine's speed hits both alike. Three
//! workloads: a copy-heavy turn (a 149-line file to rewrite with one name
//! changed, which the model copies), prose that repeats nothing, and 8
//! concurrent streams mixing both. The figure is decode speed (generated
//! tokens over the time after the first token) with drafting against
//! without; a single stream's first output is also checked to be the same
//! text, and the copy's lines counted against the file. The same workloads against
//! llama-server with and without its own n-gram speculation, through both
//! servers' HTTP, are `baseline::lookup`, and those are the figures: with
//! llama.cpp's OpenMP build, two engines in one process made every
//! one-position step wait at ggml's barriers, so the ratios here overstated
//! the gain (docs/benchmarks.md, "Drafting from the context"); without it
//! they take turns (`models`).

use std::path::PathBuf;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use skillhost_engine::lookup::MAX_DRAFT;
use skillhost_engine::FlashAttn;
use skillhost_engine::{
    ChatMessage, Conversation, Engine, EngineConfig, GenerateRequest, GenerationEvent, ResponseFormat, Role,
    SamplingParams, ToolChoice,
};

const RUNS: usize = 3;
/// Rounds of [`step_costs`]; the median is reported.
const STEP_REPS: usize = 21;

/// A 149-line Python file: fifty two-line functions. The 135M model copies
/// this one when asked to rewrite it; given functions of four lines with
/// docstrings, it describes them in prose instead.
fn file() -> String {
    let functions: Vec<String> = (0..50).map(|i| format!("def shape_{i}(x):\n    return x * {}", i + 1)).collect();
    functions.join("\n\n")
}

pub(crate) fn copy_prompt() -> String {
    format!(
        "Rewrite this code with `x` renamed to `value`. Print the whole code and nothing else.\n\n```python\n{}\n```",
        file()
    )
}

/// How many of `text`'s non-blank lines are lines of the copied file,
/// renamed or not, and how many non-blank lines it has: whether the model
/// copied, which decides what drafting from the context can gain.
pub(crate) fn copied_lines(text: &str) -> (usize, usize) {
    let file = file();
    let renamed = file.replace('x', "value");
    let known: std::collections::HashSet<&str> = file.lines().chain(renamed.lines()).collect();
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    (lines.iter().filter(|line| known.contains(*line)).count(), lines.len())
}

pub(crate) fn prose_prompt(topic: &str) -> String {
    format!("Write a long story about {topic}, with new details in every sentence.")
}

/// One request of a workload: a system turn if any, the user's turn, and
/// the tokens to generate.
struct Prompt {
    system: Option<String>,
    user: String,
    max_tokens: u32,
}

impl Prompt {
    fn user(user: String, max_tokens: u32) -> Self {
        Prompt { system: None, user, max_tokens }
    }
}

pub(crate) fn request(engine: &Engine, text: &str, max_tokens: u32) -> GenerateRequest {
    request_with(engine, None, text, max_tokens)
}

fn request_with(engine: &Engine, system: Option<&str>, text: &str, max_tokens: u32) -> GenerateRequest {
    let mut messages: Vec<ChatMessage> =
        system.map(|s| ChatMessage::new(Role::System, s.to_string())).into_iter().collect();
    messages.push(ChatMessage::new(Role::User, text.to_string()));
    let conversation = Conversation {
        messages: &messages,
        tools: &[],
        tool_choice: &ToolChoice::Auto,
        parallel_tool_calls: true,
        response_format: &ResponseFormat::Text,
    };
    let prompt = engine.info().format.prepare(&conversation).expect("a prompt").text;
    GenerateRequest {
        prompt,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        max_tokens: Some(max_tokens),
        ..Default::default()
    }
}

/// The text, the tokens generated and the decode time in seconds (after
/// the first token), and the drafted and kept counts.
async fn generate(engine: &Engine, request: GenerateRequest) -> (String, usize, f64, usize, usize) {
    let mut submitted = engine.submit(request).await.expect("submitted");
    let mut text = String::new();
    while let Some(event) = submitted.events.recv().await {
        match event {
            GenerationEvent::Text(delta) => text.push_str(&delta),
            GenerationEvent::Finished { timings, .. } => {
                let seconds = timings.predicted_ms / 1000.0;
                return (text, timings.predicted_n, seconds, timings.draft_n, timings.draft_n_accepted);
            }
            GenerationEvent::Failed(err) => panic!("generation failed: {err}"),
            GenerationEvent::ToolCalls(_) => panic!("calls from the local engine"),
        }
    }
    panic!("no finish")
}

/// Tokens a second over `prompts` at once (wall time from the first
/// request to the last finish), their texts, and drafted/kept totals.
async fn workload(engine: &Engine, prompts: &[Prompt]) -> (f64, Vec<String>, usize, usize) {
    let started = Instant::now();
    let runs =
        prompts.iter().map(|p| generate(engine, request_with(engine, p.system.as_deref(), &p.user, p.max_tokens)));
    let done = futures_util::future::join_all(runs).await;
    let wall = started.elapsed().as_secs_f64();
    let tokens: usize = done.iter().map(|d| d.1).sum();
    // One stream: its own decode time, which leaves out the prefill.
    let rate = if done.len() == 1 { done[0].1 as f64 / done[0].2 } else { tokens as f64 / wall };
    let drafted = done.iter().map(|d| d.3).sum();
    let kept = done.iter().map(|d| d.4).sum();
    (rate, done.into_iter().map(|d| d.0).collect(), drafted, kept)
}

fn median(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    (values[values.len() / 2], values[0], values[values.len() - 1])
}

/// Decodes `tokens` into sequence `seq` from position 0, a batch at a time.
fn prefill_sequence(ctx: &mut LlamaContext, batch: &mut LlamaBatch, tokens: &[LlamaToken], seq: i32) {
    for (chunk, tokens_in) in tokens.chunks(skillhost_engine::BATCH_SIZE as usize).enumerate() {
        batch.clear();
        for (i, token) in tokens_in.iter().enumerate() {
            let at = chunk * skillhost_engine::BATCH_SIZE as usize + i;
            batch.add(*token, at as i32, &[seq], at + 1 == tokens.len()).expect("batch");
        }
        ctx.decode(batch).expect("prefill");
    }
}

/// Decode steps of one sequence by the positions they hold, from one to
/// a longest draft's worth, interleaved over [`STEP_REPS`] rounds, after
/// `copies` copies of the copy-heavy prompt: a drafted token costs one more
/// position, and what that costs on this machine bounds what drafting can
/// gain here. Returns the prompt's tokens and (positions, median
/// milliseconds) pairs.
fn step_costs(flash_attn: i32, copies: usize) -> (usize, Vec<(usize, f64)>) {
    let backend = skillhost_engine::backend().expect("llama backend");
    let model = LlamaModel::load_from_file(backend, super::MODEL, &LlamaModelParams::default()).expect("model");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as i32;
    let params = skillhost_engine::context_params(8192, 8, threads, flash_attn);
    let mut ctx = model.new_context(backend, params).expect("context");
    let tokens = model.vocab().tokenize(copy_prompt().repeat(copies).as_bytes(), false, true);
    let mut batch = LlamaBatch::new(skillhost_engine::BATCH_SIZE as usize, 1);
    prefill_sequence(&mut ctx, &mut batch, &tokens, 0);
    let base = tokens.len();
    let sizes = [1, 2, 3, 5, 9, MAX_DRAFT + 1];
    let mut times: Vec<Vec<f64>> = sizes.iter().map(|_| Vec::new()).collect();
    for _ in 0..STEP_REPS {
        for (size, times) in sizes.iter().zip(&mut times) {
            batch.clear();
            for (i, token) in tokens.iter().take(*size).enumerate() {
                batch.add(*token, (base + i) as i32, &[0], true).expect("batch");
            }
            let started = Instant::now();
            ctx.decode(&mut batch).expect("decode");
            let _ = ctx.get_logits_ith(*size as i32 - 1);
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            ctx.clear_kv_cache_seq(Some(0), Some(base as u32), None).expect("rewind");
        }
    }
    (base, sizes.iter().zip(times).map(|(size, times)| (*size, median(times).0)).collect())
}

/// Conversations in [`crowded_step_costs`]' cache.
const CROWD: usize = 8;

/// Decode steps of one position for each of 1, 2 and [`CROWD`] sequences,
/// over a cache that holds [`CROWD`] copies of the copy-heavy prompt, one
/// per sequence (as a server's does with its other conversations generating
/// or parked), interleaved over [`STEP_REPS`] rounds. The unfused kernels
/// multiply out every cell in use, the other sequences' included, and the
/// mask then zeroes them; the fused one skips a masked cell. Returns the
/// cells in use and (sequences, median milliseconds) pairs.
fn crowded_step_costs(flash_attn: i32) -> (usize, Vec<(usize, f64)>) {
    let backend = skillhost_engine::backend().expect("llama backend");
    let model = LlamaModel::load_from_file(backend, super::MODEL, &LlamaModelParams::default()).expect("model");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as i32;
    let params = skillhost_engine::context_params(8192, CROWD as u32, threads, flash_attn);
    let mut ctx = model.new_context(backend, params).expect("context");
    let tokens = model.vocab().tokenize(copy_prompt().as_bytes(), false, true);
    let mut batch = LlamaBatch::new(skillhost_engine::BATCH_SIZE as usize, CROWD as i32);
    for seq in 0..CROWD as i32 {
        prefill_sequence(&mut ctx, &mut batch, &tokens, seq);
    }
    let base = tokens.len();
    let sizes = [1, 2, CROWD];
    let mut times: Vec<Vec<f64>> = sizes.iter().map(|_| Vec::new()).collect();
    for token in tokens.iter().take(STEP_REPS) {
        for (size, times) in sizes.iter().zip(&mut times) {
            batch.clear();
            for seq in 0..*size as i32 {
                batch.add(*token, base as i32, &[seq], true).expect("batch");
            }
            let started = Instant::now();
            ctx.decode(&mut batch).expect("decode");
            let _ = ctx.get_logits_ith(*size as i32 - 1);
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            for seq in 0..*size as u32 {
                ctx.clear_kv_cache_seq(Some(seq), Some(base as u32), None).expect("rewind");
            }
        }
    }
    (base * CROWD, sizes.iter().zip(times).map(|(size, times)| (*size, median(times).0)).collect())
}

/// Prints [`step_costs`] as ratios to a step of one position, on `on`
/// (fused everywhere: the CPU's `auto`, the default, and llama-server's),
/// and with `more` also on `prefill` (unfused for steps this small), and at
/// a context four times as long.
pub fn print_step_costs(more: bool) {
    let (prefill, on) =
        (skillhost_engine::flash_attention(FlashAttn::Prefill), skillhost_engine::flash_attention(FlashAttn::On));
    let mut cases = vec![("on", on, 1)];
    if more {
        cases.push(("prefill", prefill, 1));
        cases.push(("prefill", prefill, 4));
        cases.push(("on", on, 4));
    }
    println!("a decode step of one sequence by the positions it holds, median of {STEP_REPS}, ratios to one position:");
    for (name, policy, copies) in cases {
        let (context, costs) = step_costs(policy, copies);
        let one = costs[0].1;
        let row: Vec<String> = costs.iter().skip(1).map(|(size, ms)| format!("{size}: {:.2}×", ms / one)).collect();
        println!("  flash attention {name:<4} at {context:>5} tokens of context: 1: {one:.2} ms, {}", row.join(", "));
    }
    if more {
        println!("a decode step of one position for each of 1, 2 and {CROWD} sequences, over a cache of {CROWD} conversations, median of {STEP_REPS}:");
        for (name, policy) in [("prefill", prefill), ("on", on)] {
            let (cells, costs) = crowded_step_costs(policy);
            let row: Vec<String> = costs.iter().map(|(size, ms)| format!("{size}: {ms:.2} ms")).collect();
            println!("  flash attention {name:<7} over {cells:>5} cells in use: {}", row.join(", "));
        }
    }
}

pub fn run() {
    print_step_costs(false);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let copy = vec![Prompt::user(copy_prompt(), 400)];
    let prose = vec![Prompt::user(prose_prompt("a lighthouse keeper"), 300)];
    let mixed: Vec<Prompt> = (0..8)
        .map(|i| match i % 2 {
            0 => Prompt::user(copy_prompt(), 300),
            _ => Prompt::user(prose_prompt(&format!("a traveller, day {i}")), 300),
        })
        .collect();
    // The baseline's generation rows: short stories at 1, 4 and 8 streams,
    // where every drafted position that fails slows all the streams in its step.
    let stories = |n: usize| -> Vec<Prompt> {
        (0..n)
            .map(|i| Prompt {
                system: Some(super::story_system(900 + i)),
                user: super::STORY_USER.to_string(),
                max_tokens: super::MAX_TOKENS as u32,
            })
            .collect()
    };
    // Drafting on the default flash attention (`auto`: fused on the CPU)
    // against the same attention without drafting.
    let start = |spec_lookup, flash_attn| {
        let config = EngineConfig {
            model_path: PathBuf::from(super::MODEL),
            n_ctx: Some(8192),
            n_parallel: 8,
            spec_lookup,
            flash_attn,
            ..Default::default()
        };
        Engine::start(config).expect("the engine").0
    };
    let (plain, drafting) =
        runtime.block_on(async { (start(false, FlashAttn::default()), start(true, FlashAttn::default())) });
    println!(
        "speculative decoding from the context (greedy, {RUNS} runs each, drafting ÷ not, both on --flash-attn auto):"
    );
    let workloads = [
        ("copy-heavy turn", copy),
        ("prose", prose),
        ("8 streams, copy and prose", mixed),
        ("stories at 1 stream", stories(1)),
        ("stories at 4 streams", stories(4)),
        ("stories at 8 streams", stories(8)),
    ];
    // `LOOKUP_WORKLOADS=stories,copy-heavy` measures only the workloads
    // whose names begin with one of its comma-separated words (so no name
    // holds a comma before its end: "8 streams" picks the mix).
    let only = std::env::var("LOOKUP_WORKLOADS").unwrap_or_default();
    let chosen = |name: &str| only.split(',').any(|word| name.starts_with(word.trim()));
    for (name, prompts) in workloads.iter().filter(|(name, _)| chosen(name)) {
        measure(&runtime, (&plain, &drafting), name, prompts);
    }
}

/// One workload's runs on both engines, in turn, and its line.
fn measure(runtime: &tokio::runtime::Runtime, engines: (&Engine, &Engine), name: &str, prompts: &[Prompt]) {
    let (plain, drafting) = engines;
    let (mut ratios, mut offs, mut ons) = (Vec::new(), Vec::new(), Vec::new());
    let (mut drafted, mut kept, mut same, mut copied) = (0, 0, None, (0, 0));
    for run in 0..RUNS {
        let (off, off_texts, _, _) = runtime.block_on(workload(plain, prompts));
        let (on, on_texts, d, k) = runtime.block_on(workload(drafting, prompts));
        ratios.push(on / off);
        offs.push(off);
        ons.push(on);
        drafted += d;
        kept += k;
        // Later runs find their prompt cached, which changes how it is
        // decoded and so the rounding; concurrent streams share steps
        // in whatever mix their timing gives. The first run of one
        // stream is the like-for-like one.
        if run == 0 && prompts.len() == 1 {
            same = Some(off_texts == on_texts);
            if prompts[0].user == copy_prompt() {
                copied = copied_lines(&off_texts[0]);
            }
        }
    }
    let (mid, low, high) = median(ratios);
    let copied = if copied.1 > 0 { format!("; {} of {} lines copied", copied.0, copied.1) } else { String::new() };
    println!(
        "  {name:<26} {mid:.2}x (min {low:.2}x, max {high:.2}x; {:.1} tok/s on, {:.1} off); {kept} of {drafted} drafted tokens kept{}{copied}",
        median(ons).0,
        median(offs).0,
        same.map_or(String::new(), |same| format!("; same text on a cold cache: {same}"))
    );
}
