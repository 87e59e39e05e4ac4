//! The engine against the real default model (`make model` fetches it).

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use skillhost_engine::{
    ChatMessage, Conversation, Engine, EngineConfig, FinishReason, GenerateRequest, GenerationEvent, ResponseFormat,
    Role, SamplingParams, Timings, ToolChoice,
};

fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run `make model`", path.display());
    path
}

fn start(n_parallel: u32) -> Engine {
    let config = EngineConfig { model_path: model_path(), n_ctx: Some(4096), n_parallel, n_threads: None };
    match Engine::start(config) {
        Ok((engine, _exit)) => engine,
        Err(err) => panic!("engine failed to start: {err}"),
    }
}

fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, ..SamplingParams::default() }
}

fn prompt(engine: &Engine, messages: &[ChatMessage]) -> String {
    let conversation = Conversation {
        messages,
        tools: &[],
        tool_choice: &ToolChoice::Auto,
        parallel_tool_calls: true,
        response_format: &ResponseFormat::Text,
    };
    match engine.info().format.prepare(&conversation) {
        Ok(p) => p.text,
        Err(err) => panic!("{err}"),
    }
}

async fn generate(engine: &Engine, request: GenerateRequest) -> (String, FinishReason, Timings) {
    let mut submitted = match engine.submit(request).await {
        Ok(s) => s,
        Err(err) => panic!("submit failed: {err}"),
    };
    let mut text = String::new();
    while let Some(event) = submitted.events.recv().await {
        match event {
            GenerationEvent::Text(delta) => text.push_str(&delta),
            GenerationEvent::Finished { reason, timings } => return (text, reason, timings),
            GenerationEvent::Failed(err) => panic!("generation failed: {err}"),
        }
    }
    panic!("the event stream ended without a finish");
}

#[tokio::test]
async fn answers_paris_and_reuses_the_prefix_on_the_next_turn() {
    let engine = start(2);
    // With its built-in default system message this 135M model rambles; with
    // an ordinary one it answers.
    let system = ChatMessage::new(Role::System, "You are a helpful assistant.");
    let question = ChatMessage::new(Role::User, "What is the capital of France?");
    let first_prompt = prompt(&engine, &[system.clone(), question.clone()]);
    let request =
        GenerateRequest { prompt: first_prompt, sampling: greedy(), max_tokens: Some(64), ..Default::default() };
    let (answer, reason, first) = generate(&engine, request).await;
    assert!(answer.contains("Paris"), "answer: {answer}");
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(first.cache_n, 0);

    let messages =
        [system, question, ChatMessage::new(Role::Assistant, answer), ChatMessage::new(Role::User, "And of Italy?")];
    let request = GenerateRequest {
        prompt: prompt(&engine, &messages),
        sampling: greedy(),
        max_tokens: Some(32),
        ..Default::default()
    };
    let (_, _, second) = generate(&engine, request).await;
    let previous = first.prompt_n + first.predicted_n;
    assert!(
        second.cache_n * 10 >= previous * 9,
        "second turn reused {} tokens of the first turn's {previous}",
        second.cache_n
    );
}

#[tokio::test]
async fn stop_strings_and_max_tokens() {
    let engine = start(1);
    let text = prompt(&engine, &[ChatMessage::new(Role::User, "Count from 1 to 20, separated by commas.")]);
    let request =
        GenerateRequest { prompt: text.clone(), sampling: greedy(), max_tokens: Some(5), ..Default::default() };
    let (_, reason, timings) = generate(&engine, request).await;
    assert_eq!((reason, timings.predicted_n), (FinishReason::Length, 5));
    let request = GenerateRequest {
        prompt: text,
        sampling: greedy(),
        max_tokens: Some(64),
        stops: vec!["3".into()],
        ..Default::default()
    };
    let (out, reason, _) = generate(&engine, request).await;
    assert_eq!(reason, FinishReason::Stop);
    assert!(!out.contains('3'), "stop string leaked: {out}");
}

#[tokio::test]
async fn ignore_eos_generates_to_max_tokens() {
    let engine = start(1);
    // Greedy, this model answers "1000." and stops.
    let text = prompt(
        &engine,
        &[
            ChatMessage::new(Role::System, "You are a helpful assistant."),
            ChatMessage::new(Role::User, "Count from one to one thousand, in words."),
        ],
    );
    let request =
        GenerateRequest { prompt: text.clone(), sampling: greedy(), max_tokens: Some(48), ..Default::default() };
    let (_, reason, timings) = generate(&engine, request).await;
    assert_eq!(reason, FinishReason::Stop);
    assert!(timings.predicted_n < 48, "the model did not stop early: {timings:?}");
    let sampling = SamplingParams { ignore_eos: true, ..greedy() };
    let request = GenerateRequest { prompt: text, sampling, max_tokens: Some(48), ..Default::default() };
    let (_, reason, timings) = generate(&engine, request).await;
    assert_eq!((reason, timings.predicted_n), (FinishReason::Length, 48));
}
