//! The supervisor recovers from an engine crash: in-flight requests get a
//! clean error and the next request is served. Uses the real default model.

// Integration tests are test code: unwrapping is how they fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use skillhost_actors::{ChatError, ChatEvent, ChatRequest, ModelStatus, Server, ServerConfig};
use skillhost_engine::{ChatMessage, EngineConfig, Role, SamplingParams};

fn config() -> EngineConfig {
    let model_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model_path.exists(), "{} is missing: run `make model`", model_path.display());
    EngineConfig { model_path, n_ctx: Some(2048), n_parallel: 2, n_threads: None, ..Default::default() }
}

fn request(text: &str, max_tokens: u32) -> ChatRequest {
    ChatRequest {
        messages: vec![
            ChatMessage::new(Role::System, "You are a helpful assistant."),
            ChatMessage::new(Role::User, text),
        ],
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        max_tokens: Some(max_tokens),
        ..ChatRequest::default()
    }
}

async fn ready(server: &Server) -> Arc<skillhost_engine::ModelInfo> {
    match server.wait_until_loaded().await {
        ModelStatus::Ready { info, .. } => info,
        other => panic!("the model did not load: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_panic_fails_in_flight_requests_and_the_next_one_succeeds() {
    let server = match Server::start(ServerConfig::new(config(), None)).await {
        Ok(s) => s,
        Err(err) => panic!("{err}"),
    };
    let first_info = ready(&server).await;

    // The end token is ignored, so the answer is still being written when
    // the engine is crashed under it, however short the model would keep it
    // (greedy, it answers a similar prompt in three tokens).
    let mut long = request("Count from one to one thousand in words.", 1000);
    long.sampling.ignore_eos = true;
    let mut chat = match server.chat(long).await {
        Ok(c) => c,
        Err(err) => panic!("{err}"),
    };
    // Wait until text flows, then crash the engine under it.
    loop {
        match chat.events.recv().await {
            Some(ChatEvent::Content(_)) => break,
            Some(ChatEvent::Accepted) => {}
            other => panic!("unexpected event before the crash: {other:?}"),
        }
    }
    server.inject_engine_panic();
    let ending = loop {
        match chat.events.recv().await {
            Some(ChatEvent::Content(_)) => {}
            other => break other,
        }
    };
    assert_eq!(ending, Some(ChatEvent::Failed(ChatError::Unavailable("the model engine stopped unexpectedly".into()))));

    // The supervisor reloads the model; wait for the new engine.
    let reloaded = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            if let ModelStatus::Ready { info, .. } = server.status() {
                if !Arc::ptr_eq(&info, &first_info) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(reloaded.is_ok(), "the model was not reloaded");

    let mut chat = match server.chat(request("What is the capital of France?", 32)).await {
        Ok(c) => c,
        Err(err) => panic!("the request after the restart failed: {err}"),
    };
    let mut answer = String::new();
    loop {
        match chat.events.recv().await {
            Some(ChatEvent::Content(text)) => answer.push_str(&text),
            Some(ChatEvent::Finished { .. }) => break,
            Some(ChatEvent::Accepted) => {}
            other => panic!("unexpected event after the restart: {other:?}"),
        }
    }
    assert!(answer.contains("Paris"), "answer after the restart: {answer}");
    server.shutdown();
}

/// Loading runs outside the supervisor's mailbox: while the model's file
/// cannot be read yet (a FIFO nobody writes to), the skills registry still
/// answers through the supervisor, and a chat waits for the model; when the
/// load fails, the waiting chat gets the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_answers_while_the_model_loads() {
    use skillhost_actors::skills::{Origin, Root, SkillsConfig};
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let root = dir.path().join("skills");
    std::fs::create_dir_all(&root).unwrap();
    let skills = SkillsConfig {
        roots: vec![Root { path: root, origin: Origin::Discovered }],
        install_dir: None,
        watch: false,
        poll: None,
        selected: Vec::new(),
        keep_versions: skillhost_actors::skills::versions::DEFAULT_KEEP_VERSIONS,
        policy: Default::default(),
        ..Default::default()
    };
    let engine = EngineConfig { model_path: fifo.clone(), n_parallel: 1, ..Default::default() };
    let server = Server::start(ServerConfig::new(engine, Some(skills))).await.unwrap();
    // No one has opened the FIFO for writing, so the loader cannot get
    // past opening the file: the model is loading for as long as we like.
    // A supervisor that loaded in its own handler would not answer here.
    let skills = server.skills().unwrap().clone();
    skills.rescan().await.unwrap();
    assert!(matches!(server.status(), ModelStatus::Loading), "{:?}", server.status());
    let waiting = {
        let server = server.clone();
        tokio::spawn(async move { server.chat(request("Hello", 4)).await.err() })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a chat for a loading model should wait for it");
    skills.rescan().await.unwrap();
    // A writer that opens and closes lets the loader on; the FIFO is no
    // model, so the load fails and says so.
    let writer_path = fifo.clone();
    tokio::task::spawn_blocking(move || drop(std::fs::OpenOptions::new().write(true).open(writer_path).unwrap()))
        .await
        .unwrap();
    assert!(matches!(server.wait_until_loaded().await, ModelStatus::Failed(_)));
    let refused = waiting.await.unwrap();
    assert!(matches!(refused, Some(ChatError::Unavailable(ref m)) if m.contains("is not available")), "{refused:?}");
    server.shutdown();
}
