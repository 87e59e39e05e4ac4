//! Four child agents started together, against the same four generations
//! run one after another, in this process on the real engine:
//!
//! 1. Wall time of a turn whose model starts four children with the same
//!    1,000-token task prefix (each ends with its own question), from the
//!    request to its answer, over the wall time of the children's very
//!    prompts submitted to a fresh engine one at a time.
//! 2. Prompt tokens the engine decoded for the four children, over four
//!    times the task prefix (goal: the prefix is decoded once, so about a
//!    quarter), and over one full prompt plus the others' own tails (goal:
//!    1.0).
//!
//! The request's own model is scripted (its calls are fixed: spawn four,
//! wait until all have reported, answer); every child's generation is the
//! real model's. Both sides run greedy, past the end of text, with the
//! same budget per child, so they generate the same number of tokens. The two sides alternate, each on a
//! fresh engine, and medians are reported.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use skillhost_actors::chat_loop::LoopSettings;
use skillhost_actors::model::backend::{CountFuture, SubmitFuture};
use skillhost_actors::model::{Catalog, ModelBackend, ModelSource};
use skillhost_actors::request::AGENT_MARK;
use skillhost_actors::request::{ChatEvent, ChatRequest, RoundStats};
use skillhost_actors::{Server, ServerConfig};
use skillhost_engine::{
    ChatMessage, Engine, EngineConfig, EngineStats, FinishReason, GenerateRequest, GenerationEvent, ModelInfo, Role,
    SamplingParams, Submitted, Timings,
};
use tokio::sync::mpsc;

use super::{median, MODEL, N_CTX};

/// Children the turn starts.
const CHILDREN: usize = 4;
/// Tokens each child generates (end of text ignored, so both sides
/// generate exactly this many).
const CHILD_TOKENS: u32 = 128;
/// Repetitions of each side; medians are reported.
const RUNS: usize = 3;

/// The real engine for children, scripted outputs for the request's own
/// model; every child's request is kept for the one-at-a-time side.
struct Delegating {
    engine: Engine,
    script: Mutex<VecDeque<String>>,
    children: Mutex<Vec<GenerateRequest>>,
}

impl ModelBackend for Delegating {
    fn info(&self) -> &Arc<ModelInfo> {
        self.engine.info()
    }

    fn stats(&self) -> &Arc<EngineStats> {
        self.engine.stats()
    }

    fn count_tokens(&self, text: String) -> CountFuture<'_> {
        Box::pin(self.engine.count_tokens(text))
    }

    fn submit(&self, request: GenerateRequest) -> SubmitFuture<'_> {
        if request.prompt.contains(AGENT_MARK) {
            self.children.lock().expect("children").push(request.clone());
            return Box::pin(self.engine.submit(request));
        }
        let output = self.script.lock().expect("script").pop_front().unwrap_or_else(|| "Done.".into());
        Box::pin(async move {
            let (events, receiver) = mpsc::unbounded_channel();
            let _ = events.send(GenerationEvent::Text(output));
            let _ = events.send(GenerationEvent::Finished { reason: FinishReason::Stop, timings: Timings::default() });
            Ok(Submitted { events: receiver, n_prompt: 0, generated: Default::default() })
        })
    }
}

fn engine() -> Engine {
    let config = EngineConfig {
        model_path: MODEL.into(),
        n_ctx: Some(N_CTX),
        n_parallel: CHILDREN as u32 + 1,
        ..Default::default()
    };
    Engine::start(config).expect("the engine starts").0
}

/// A task prefix of about 1,000 tokens, the same for every child.
fn task_prefix() -> String {
    let lines: Vec<String> = (1..=60)
        .map(|i| format!("Record {i}: the lighthouse log notes wind, sea state, visibility and passing ships."))
        .collect();
    format!("Here is the station's log.\n{}\n", lines.join("\n"))
}

fn call(name: &str, arguments: serde_json::Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": arguments}))
}

/// The request's own model: four spawns in one round, then waits until
/// every report is in (each wait returns at least one), then the answer.
fn script(prefix: &str) -> VecDeque<String> {
    let spawns: String = (1..=CHILDREN)
        .map(|i| call("spawn_agent", json!({"message": format!("{prefix}Question {i}: what does record {i} say?")})))
        .collect();
    let mut script = VecDeque::from([spawns]);
    for _ in 0..CHILDREN {
        script.push_back(call("wait_agent", json!({"timeout_ms": 300000})));
    }
    script.push_back("All four records are summarised.".into());
    script
}

struct Together {
    wall: Duration,
    /// The children's rounds.
    rounds: Vec<RoundStats>,
    requests: Vec<GenerateRequest>,
}

async fn together(prefix: &str) -> Together {
    let backend =
        Arc::new(Delegating { engine: engine(), script: Mutex::new(script(prefix)), children: Mutex::new(Vec::new()) });
    let mut settings = LoopSettings::default();
    settings.agent_limits.tokens = CHILD_TOKENS;
    // Children at the deepest level have no tools: each is one generation.
    settings.agent_limits.depth = 1;
    let config = ServerConfig {
        models: Catalog::single(ModelSource::Provided(backend.clone())),
        skills: None,
        loop_settings: settings,
        exec: None,
        artifacts: None,
        mcp_servers: Vec::new(),
        mcp_call_timeout: skillhost_actors::tools::mcp::hub::DEFAULT_CALL_TIMEOUT,
        mcp_serve_scripts: false,
    };
    let server = Server::start(config).await.expect("the server starts");
    server.wait_until_loaded().await;
    let request = ChatRequest {
        messages: vec![
            ChatMessage::new(Role::System, "You are a careful assistant."),
            ChatMessage::new(Role::User, "Summarise the log's first four records, one helper each."),
        ],
        // Children take the request's sampling.
        sampling: SamplingParams { temperature: 0.0, ignore_eos: true, ..SamplingParams::default() },
        temperature_set: true,
        ..ChatRequest::default()
    };
    let started = Instant::now();
    let mut chat = server.chat(request).await.expect("the turn starts");
    let rounds = loop {
        match chat.events.recv().await {
            Some(ChatEvent::Finished { rounds, .. }) => break rounds,
            Some(ChatEvent::Failed(err)) => panic!("the turn failed: {err}"),
            Some(_) => {}
            None => panic!("the turn ended without an answer"),
        }
    };
    let wall = started.elapsed();
    server.shutdown();
    let rounds: Vec<RoundStats> = rounds.into_iter().filter(|r| r.agent_id != "/root").collect();
    assert_eq!(rounds.len(), CHILDREN, "every child runs one generation");
    assert!(rounds.iter().all(|r| r.generated_tokens == CHILD_TOKENS as usize), "{rounds:?}");
    let requests = backend.children.lock().expect("children").clone();
    Together { wall, rounds, requests }
}

/// The children's prompts on a fresh engine, one after another.
async fn one_at_a_time(requests: &[GenerateRequest]) -> (Duration, usize) {
    let engine = engine();
    let started = Instant::now();
    let mut decoded = 0;
    for request in requests {
        let mut submitted = engine.submit(request.clone()).await.expect("submitted");
        loop {
            match submitted.events.recv().await {
                Some(GenerationEvent::Finished { timings, .. }) => {
                    decoded += timings.prompt_n;
                    break;
                }
                Some(GenerationEvent::Failed(err)) => panic!("{err}"),
                Some(_) => {}
                None => panic!("no finish"),
            }
        }
    }
    (started.elapsed(), decoded)
}

/// Tokens of the text every child's prompt opens with.
async fn shared_tokens(requests: &[GenerateRequest]) -> usize {
    let first = requests[0].prompt.as_bytes();
    let mut shared = first.len();
    for request in &requests[1..] {
        shared = shared.min(first.iter().zip(request.prompt.as_bytes()).take_while(|(a, b)| a == b).count());
    }
    let text = String::from_utf8_lossy(&first[..shared]).into_owned();
    let counter = engine();
    counter.count_tokens(text).await.expect("counted")
}

pub fn run() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let prefix = task_prefix();
        let counter = engine();
        let prefix_tokens = counter.count_tokens(prefix.clone()).await.expect("counted");
        drop(counter);
        let (mut walls, mut serial_walls, mut decoded, mut serial_decoded) = (vec![], vec![], vec![], vec![]);
        let mut ideal = 0;
        for _ in 0..RUNS {
            let run = together(&prefix).await;
            walls.push(run.wall.as_secs_f64() * 1000.0);
            decoded.push(run.rounds.iter().map(|r| r.prompt_tokens - r.cached_tokens).sum::<usize>() as f64);
            // One prefill of the shared part, plus each prompt's own tail.
            let shared = shared_tokens(&run.requests).await;
            ideal = run.rounds.iter().map(|r| r.prompt_tokens).sum::<usize>() - (CHILDREN - 1) * shared;
            let (wall, serial) = one_at_a_time(&run.requests).await;
            serial_walls.push(wall.as_secs_f64() * 1000.0);
            serial_decoded.push(serial as f64);
        }
        let (ours, theirs) = (median(walls), median(serial_walls));
        let (decoded, serial_decoded) = (median(decoded), median(serial_decoded));
        println!("four child agents with a {prefix_tokens}-token task prefix, together vs one after another:");
        println!("| measure | together | one at a time | ratio | goal |");
        println!("|---|---|---|---|---|");
        println!("| turn wall time (ms) | {ours:.0} | {theirs:.0} | {:.2} | < 1 |", ours / theirs);
        let four_prefixes = (CHILDREN * prefix_tokens) as f64;
        println!(
            "| children's prompt tokens decoded ÷ 4 × {prefix_tokens} | {decoded:.0} | {serial_decoded:.0} | {:.2} (one at a time {:.2}) | ≈ 0.25 + the rest of one prompt |",
            decoded / four_prefixes,
            serial_decoded / four_prefixes
        );
        println!(
            "| decoded ÷ (the shared part once + every prompt's own tail) | {decoded:.0} | {ideal} | {:.2} | ≤ 1.05 |",
            decoded / ideal as f64
        );
    });
}
