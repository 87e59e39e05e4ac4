//! The context budget on the real engine: what letting go costs in tokens
//! decoded again.
//!
//! A turn reads a skill and then one reference file a round until its
//! prompt passes the high-water mark of a 4,096-token context; the loop
//! then lets go of old results and the idle skill body. For each round the
//! table shows the prompt, what the KV cache kept and what was decoded;
//! a round that let something go decodes from the first changed message to
//! the end, one that did not decodes only what is new. A second
//! conversation grows past the mark with long turns, so its oldest turn
//! goes, which changes the end of the system text: everything after it is
//! decoded again.
//!
//! The request's own calls are scripted (each round's output is fixed);
//! every prompt is prefilled by the real engine, which reports what it
//! reused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use skillhost_actors::chat_loop::{LoopSettings, MultiAgent};
use skillhost_actors::model::backend::{CountFuture, SubmitFuture};
use skillhost_actors::model::{Catalog, ModelBackend, ModelSource};
use skillhost_actors::request::{ChatEvent, ChatRequest, RoundStats};
use skillhost_actors::skills::{Origin, Root, SkillsConfig};
use skillhost_actors::{Server, ServerConfig};
use skillhost_engine::{
    ChatMessage, Engine, EngineConfig, EngineStats, FinishReason, GenerateRequest, GenerationEvent, ModelInfo, Role,
    SamplingParams, Submitted,
};
use tokio::sync::mpsc;

use super::MODEL;

/// A small context, so a handful of rounds reaches the mark.
const N_CTX: u32 = 4096;
/// Reference files the turn reads, one a round.
const FILES: usize = 7;

/// The real engine prefills each prompt (one token generated, to learn
/// what it reused); the text the loop reads is scripted.
struct Budgeted {
    engine: Engine,
    script: Mutex<VecDeque<String>>,
}

impl ModelBackend for Budgeted {
    fn info(&self) -> &Arc<ModelInfo> {
        self.engine.info()
    }

    fn stats(&self) -> &Arc<EngineStats> {
        self.engine.stats()
    }

    fn count_tokens(&self, text: String) -> CountFuture<'_> {
        Box::pin(self.engine.count_tokens(text))
    }

    fn submit(&self, mut request: GenerateRequest) -> SubmitFuture<'_> {
        let output = self.script.lock().expect("script").pop_front().unwrap_or_else(|| "Done.".into());
        request.max_tokens = Some(1);
        request.grammar = None;
        request.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
        Box::pin(async move {
            let mut submitted = self.engine.submit(request).await?;
            let n_prompt = submitted.n_prompt;
            let timings = loop {
                match submitted.events.recv().await {
                    Some(GenerationEvent::Finished { timings, .. }) => break timings,
                    Some(GenerationEvent::Failed(err)) => return Err(err),
                    Some(_) => {}
                    None => panic!("the engine stopped"),
                }
            };
            let (events, receiver) = mpsc::unbounded_channel();
            let _ = events.send(GenerationEvent::Text(output));
            let _ = events.send(GenerationEvent::Finished { reason: FinishReason::Stop, timings });
            Ok(Submitted { events: receiver, n_prompt, generated: Default::default() })
        })
    }
}

fn call(name: &str, arguments: serde_json::Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", serde_json::json!({"name": name, "arguments": arguments}))
}

/// A skill with a short SKILL.md and reference files of about 600 tokens.
fn skills_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path().join("manual");
    std::fs::create_dir_all(root.join("references")).expect("folders");
    let body: String =
        (1..=12).map(|i| format!("Step {i}: check the valve, log the pressure, sign the sheet.\n")).collect();
    std::fs::write(root.join("SKILL.md"), format!("---\nname: manual\ndescription: The plant's operating manual. Use for any plant procedure.\n---\n# Manual\n{body}"))
        .expect("SKILL.md");
    for file in 1..=FILES {
        let text: String = (1..=40)
            .map(|line| format!("Section {file}.{line}: pump {line} runs at {} kPa on shift {file}.\n", 100 + line))
            .collect();
        std::fs::write(root.join(format!("references/part-{file}.md")), text).expect("reference");
    }
    dir
}

async fn turn(server: &Server, request: ChatRequest) -> Vec<RoundStats> {
    let mut chat = server.chat(request).await.expect("the turn starts");
    loop {
        match chat.events.recv().await {
            Some(ChatEvent::Finished { rounds, .. }) => return rounds,
            Some(ChatEvent::Failed(err)) => panic!("the turn failed: {err}"),
            Some(_) => {}
            None => panic!("the turn ended without an answer"),
        }
    }
}

async fn start(script: VecDeque<String>, skills: Option<&std::path::Path>) -> Server {
    let engine = Engine::start(EngineConfig {
        model_path: MODEL.into(),
        n_ctx: Some(N_CTX),
        n_parallel: 1,
        ..Default::default()
    })
    .expect("the engine starts")
    .0;
    let backend = Arc::new(Budgeted { engine, script: Mutex::new(script) });
    let config = ServerConfig {
        models: Catalog::single(ModelSource::Provided(backend)),
        skills: skills.map(|path| SkillsConfig {
            roots: vec![Root { path: path.to_path_buf(), origin: Origin::Discovered }],
            install_dir: None,
            watch: false,
            poll: None,
            selected: Vec::new(),
            keep_versions: skillhost_actors::skills::versions::DEFAULT_KEEP_VERSIONS,
            policy: Default::default(),
            ..Default::default()
        }),
        loop_settings: LoopSettings { multi_agent: MultiAgent::Off, max_rounds: 16, ..LoopSettings::default() },
        exec: None,
        artifacts: None,
        mcp_servers: Vec::new(),
        mcp_call_timeout: skillhost_actors::tools::mcp::hub::DEFAULT_CALL_TIMEOUT,
        mcp_serve_scripts: false,
    };
    let server = Server::start(config).await.expect("the server starts");
    server.wait_until_loaded().await;
    server
}

fn table(rounds: &[RoundStats]) -> (usize, usize, usize, usize) {
    println!("| round | prompt | kept in the KV cache | decoded | let go before it |");
    println!("|---|---|---|---|---|");
    let (mut demoting, mut demoting_decoded, mut plain, mut plain_decoded) = (0, 0, 0, 0);
    for (i, r) in rounds.iter().enumerate() {
        let decoded = r.prompt_tokens - r.cached_tokens;
        let what: Vec<&str> = r.demoted.iter().map(|note| note.split(':').next().unwrap_or_default()).collect();
        println!("| {} | {} | {} | {decoded} | {} |", i + 1, r.prompt_tokens, r.cached_tokens, what.join("; "));
        if i == 0 {
            continue;
        }
        if r.demoted.is_empty() {
            plain += 1;
            plain_decoded += decoded;
        } else {
            demoting += 1;
            demoting_decoded += decoded;
        }
    }
    (demoting, demoting_decoded, plain, plain_decoded)
}

pub fn run() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let skills = skills_dir();
        let mut script = VecDeque::from([call("skills_read", serde_json::json!({"skill": "manual"}))]);
        for file in 1..=FILES {
            script.push_back(call(
                "skills_read",
                serde_json::json!({"skill": "manual", "path": format!("references/part-{file}.md")}),
            ));
        }
        script.push_back("Pump 3 runs at 103 kPa.".into());
        let server = start(script, Some(skills.path())).await;
        let request = ChatRequest {
            messages: vec![
                ChatMessage::new(Role::System, "You are the plant's assistant."),
                ChatMessage::new(Role::User, "What pressure does pump 3 run at on every shift?"),
            ],
            skills: vec!["manual".into()],
            skills_discovery: Some(false),
            ..ChatRequest::default()
        };
        let rounds = turn(&server, request).await;
        server.shutdown();
        println!("context budget, a {N_CTX}-token context: a turn reading one reference a round");
        let (demoting, demoting_decoded, plain, plain_decoded) = table(&rounds);
        println!(
            "rounds that let go decoded {:.0} tokens each on average, rounds that did not {:.0} (only what is new)",
            demoting_decoded as f64 / demoting.max(1) as f64,
            plain_decoded as f64 / plain.max(1) as f64
        );
        println!();

        // History: long turns, one more a request, until the oldest goes.
        let turn_text = |i: usize| -> String {
            (1..=20)
                .map(|line| format!("Turn {i}, line {line}: the shift report lists readings and repairs.\n"))
                .collect()
        };
        let mut messages = vec![ChatMessage::new(Role::System, "You are the plant's assistant.")];
        let mut script = VecDeque::new();
        for _ in 0..12 {
            script.push_back("Noted.".to_string());
        }
        let server = start(script, None).await;
        println!("context budget: a conversation that grows by a 500-token turn a request");
        println!("| request | prompt | kept in the KV cache | decoded | let go before it |");
        println!("|---|---|---|---|---|");
        for i in 1..=10 {
            messages.push(ChatMessage::new(Role::User, turn_text(i)));
            let request = ChatRequest { messages: messages.clone(), ..ChatRequest::default() };
            let rounds = turn(&server, request).await;
            let r = &rounds[0];
            let what: Vec<&str> = r.demoted.iter().map(|note| note.split(':').next().unwrap_or_default()).collect();
            println!(
                "| {i} | {} | {} | {} | {} |",
                r.prompt_tokens,
                r.cached_tokens,
                r.prompt_tokens - r.cached_tokens,
                what.join("; ")
            );
            messages.push(ChatMessage::new(Role::Assistant, "Noted."));
        }
        server.shutdown();
    });
}
