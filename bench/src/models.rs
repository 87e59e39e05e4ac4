//! Several models in one process, as a server with `--model` given twice
//! runs them: one engine thread each. Figures, each the median of
//! [`RUNS`] with min–max:
//!
//! - load plus first token: from `Engine::start` to the first text of a
//!   request, for each model (what a request that finds its model
//!   unloaded waits for, before the server's own few milliseconds);
//! - the default model's single-stream decode with the second model
//!   loaded and idle, over the same decode with it alone;
//! - both models decoding one stream each at once, aggregate tokens a
//!   second, over one at a time;
//! - a server with `--max-loaded-models 1`: a request for the model that
//!   is not loaded, from asking to its first text (the other unloaded,
//!   this one loaded, the request run), over the same request once its
//!   model is loaded;
//! - embeddings: 64 short inputs sent as 64 requests at once (batched
//!   across requests by the engine), over the same inputs one request at a
//!   time.
//!
//! With llama.cpp's OpenMP build, each engine thread leads its own OpenMP
//! team; once the process holds more OpenMP threads than cores, libgomp
//! stops spinning at barriers and sleeps on a futex, and ggml waits at a
//! barrier after every operation. The second row shows what that costs.

use std::time::Instant;

use skillhost_actors::model::{Catalog, ModelEntry, ModelLimits, ModelSource};
use skillhost_actors::{Server, ServerConfig};
use skillhost_engine::{EmbedInput, Engine, EngineConfig, GenerateRequest, GenerationEvent};

const RUNS: usize = 3;
/// Tokens each measured stream generates.
const TOKENS: u32 = 128;
/// The second model: gemma-3-270m, which `make test-models` fetches.
pub const SECOND: &str = "models/gemma-3-270m-q4_k_m.gguf";

/// A greedy story of exactly [`TOKENS`] tokens (the end token is ignored).
fn request(engine: &Engine, topic: &str) -> GenerateRequest {
    let mut request = super::lookup::request(engine, &format!("Write a long story about {topic}."), TOKENS);
    request.sampling.ignore_eos = true;
    request
}

/// Tokens generated and the seconds after the first one, and when the
/// first text arrived.
async fn generate(engine: &Engine, topic: &str) -> (usize, f64, Instant) {
    let mut submitted = engine.submit(request(engine, topic)).await.expect("submitted");
    let mut first = None;
    while let Some(event) = submitted.events.recv().await {
        match event {
            GenerationEvent::Text(_) => {
                first.get_or_insert_with(Instant::now);
            }
            GenerationEvent::Finished { timings, .. } => {
                return (timings.predicted_n, timings.predicted_ms / 1000.0, first.unwrap_or_else(Instant::now))
            }
            GenerationEvent::Failed(err) => panic!("generation failed: {err}"),
            GenerationEvent::ToolCalls(_) => panic!("calls from the local engine"),
        }
    }
    panic!("no finish")
}

fn config(path: &str) -> EngineConfig {
    EngineConfig { model_path: path.into(), n_ctx: Some(4096), n_parallel: 2, ..Default::default() }
}

/// Seconds from starting an engine for `path` to the first text of a request.
async fn load_and_first_token(path: &str) -> (Engine, f64) {
    let started = Instant::now();
    let config = config(path);
    let (engine, _exit) = tokio::task::spawn_blocking(move || Engine::start(config)).await.unwrap().expect("engine");
    let (_, _, first) = generate(&engine, "a lighthouse").await;
    (engine, (first - started).as_secs_f64())
}

async fn rate(engine: &Engine, topic: &str) -> f64 {
    let (tokens, seconds, _) = generate(engine, topic).await;
    tokens as f64 / seconds
}

fn median(mut values: Vec<f64>) -> String {
    values.sort_by(|a, b| a.total_cmp(b));
    format!("{:.2} ({:.2}–{:.2})", values[values.len() / 2], values[0], values[values.len() - 1])
}

pub fn run() {
    assert!(std::path::Path::new(SECOND).exists(), "{SECOND} is missing: run `make test-models`");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let (mut loads_first, mut loads_second) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let (engine, seconds) = load_and_first_token(super::MODEL).await;
            loads_first.push(seconds * 1000.0);
            drop(engine);
            let (engine, seconds) = load_and_first_token(SECOND).await;
            loads_second.push(seconds * 1000.0);
            drop(engine);
        }
        // Prefill of one ~3,000-token prompt, alone, on a fresh engine each time.
        let mut prefill = Vec::new();
        for _ in 0..RUNS {
            let (engine, _) = load_and_first_token(super::MODEL).await;
            let text = super::lookup::copy_prompt().repeat(3);
            let mut submitted = engine.submit(super::lookup::request(&engine, &text, 1)).await.expect("submitted");
            while let Some(event) = submitted.events.recv().await {
                if let GenerationEvent::Finished { timings, .. } = event {
                    prefill.push(timings.prompt_n as f64 / (timings.prompt_ms / 1000.0));
                }
            }
        }
        println!("  prefill of ~3,000 tokens, default model: {} tok/s", median(prefill));
        println!("  load + first token, default model: {} ms", median(loads_first));
        println!("  load + first token, gemma-3-270m: {} ms", median(loads_second));

        // The default model alone, then beside an idle second engine, in
        // turn; the second engine is started and dropped each round.
        let (first, _) = load_and_first_token(super::MODEL).await;
        let (mut alone, mut beside, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..RUNS {
            let a = rate(&first, &format!("a harbour {round}")).await;
            let (second, _) = load_and_first_token(SECOND).await;
            let b = rate(&first, &format!("a harbour {round}")).await;
            drop(second);
            alone.push(a);
            beside.push(b);
            ratios.push(b / a);
        }
        println!("  default model decode alone: {} tok/s", median(alone));
        println!("  default model decode, second model loaded and idle: {} tok/s", median(beside));
        println!("  ratio (idle second model / alone): {}", median(ratios));

        let (second, _) = load_and_first_token(SECOND).await;
        let (mut one_at_a_time, mut together, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..RUNS {
            let started = Instant::now();
            let (ta, _, _) = generate(&first, &format!("a river {round}")).await;
            let (tb, _, _) = generate(&second, &format!("a river {round}")).await;
            let sequential = (ta + tb) as f64 / started.elapsed().as_secs_f64();
            let started = Instant::now();
            let topic = format!("a road {round}");
            let ((ta, _, _), (tb, _, _)) = futures_util::join!(generate(&first, &topic), generate(&second, &topic));
            let both = (ta + tb) as f64 / started.elapsed().as_secs_f64();
            one_at_a_time.push(sequential);
            together.push(both);
            ratios.push(both / sequential);
        }
        println!("  two models one at a time: {} tok/s", median(one_at_a_time));
        println!("  two models at once: {} tok/s", median(together));
        println!("  ratio (at once / one at a time): {}", median(ratios));
        drop((first, second));

        switch_under_one_place().await;
        embeddings_batched().await;
    });
}

/// Milliseconds from asking `server` for `model` to the first text of a
/// greedy request on it.
async fn first_text(server: &Server, model: &str) -> f64 {
    let started = Instant::now();
    let backend = server.model(Some(model)).await.expect("the model loads");
    let request = GenerateRequest {
        prompt: "<|im_start|>user\nWrite a story.<|im_end|>\n<|im_start|>assistant\n".into(),
        max_tokens: Some(4),
        ..Default::default()
    };
    let mut submitted = backend.submit(request).await.expect("submitted");
    while let Some(event) = submitted.events.recv().await {
        if matches!(event, GenerationEvent::Text(_) | GenerationEvent::Finished { .. }) {
            break;
        }
    }
    started.elapsed().as_secs_f64() * 1000.0
}

async fn switch_under_one_place() {
    let entry = |name: &str, path: &str| ModelEntry {
        name: name.into(),
        source: ModelSource::Load(EngineConfig { name: Some(name.into()), ..config(path) }),
        bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
    };
    let limits = ModelLimits { max_loaded: 1, ..ModelLimits::default() };
    let catalog =
        Catalog::new(vec![entry("smol", super::MODEL), entry("gemma", SECOND)], None, limits).expect("catalog");
    let server = Server::start(ServerConfig { models: catalog, ..ServerConfig::new(config(super::MODEL), None) })
        .await
        .expect("server");
    server.wait_until_loaded().await;
    let (mut switched, mut loaded) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        for model in ["gemma", "smol"] {
            switched.push(first_text(&server, model).await);
            loaded.push(first_text(&server, model).await);
        }
    }
    server.shutdown();
    println!("  --max-loaded-models 1, request for the unloaded model, to first text: {} ms", median(switched.clone()));
    println!("  the same request with its model loaded: {} ms", median(loaded.clone()));
}

async fn embeddings_batched() {
    let config = EngineConfig {
        embedding: true,
        pooling: skillhost_engine::Pooling::Mean,
        n_ctx: Some(512),
        ..config(super::MODEL)
    };
    let (engine, _exit) = tokio::task::spawn_blocking(move || Engine::start(config)).await.unwrap().expect("engine");
    let inputs: Vec<String> = (0..64).map(|i| format!("Sentence number {i} about a quiet harbour at dawn.")).collect();
    let embed = |text: String| {
        let engine = engine.clone();
        async move { engine.embed(vec![EmbedInput::Text(text)], false).await.expect("embedded") }
    };
    let (mut serial, mut together, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let started = Instant::now();
        for text in &inputs {
            embed(text.clone()).await;
        }
        let one = inputs.len() as f64 / started.elapsed().as_secs_f64();
        let started = Instant::now();
        futures_util::future::join_all(inputs.iter().cloned().map(embed)).await;
        let all = inputs.len() as f64 / started.elapsed().as_secs_f64();
        serial.push(one);
        together.push(all);
        ratios.push(all / one);
    }
    println!("  embeddings, 64 inputs one request at a time: {} inputs/s", median(serial));
    println!("  embeddings, 64 requests at once: {} inputs/s", median(together));
    println!("  ratio (at once / one at a time): {}", median(ratios));
}
