//! Scenario tests of the agentic loop over the HTTP surface, with a scripted
//! model: each folder under `tests/scenarios/` holds `request.json` (the
//! OpenAI request) and `script.json` (the chat template, loop settings and
//! the outputs the model "generates"). The runner sends the request streamed
//! and not, checks that both carry the same text, and compares the prompts
//! the model saw plus the answer (`transcript.txt`) and the SSE stream
//! (`stream.sse`) with the expected files. `UPDATE_SCENARIOS=1` rewrites them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix_web::{test, web, App};
use serde_json::Value;
use skillhost_actors::chat_loop::LoopSettings;
use skillhost_actors::model::scripted::ScriptedBackend;
use skillhost_actors::model::ModelSource;
use skillhost_actors::skills::{Origin, Root, SkillsConfig};
use skillhost_actors::{ModelStatus, Server, ServerConfig};

use crate::http::{configure, metrics::Metrics, AppState};

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

struct Run {
    body: Vec<u8>,
    prompts: Vec<String>,
}

async fn run(dir: &Path, script: &Value, request: &Value, stream: bool) -> Run {
    let outputs: Vec<String> = serde_json::from_value(script["outputs"].clone()).unwrap();
    let backend = Arc::new(
        ScriptedBackend::new(script["template"].as_str(), script["architecture"].as_str().unwrap(), 8192, outputs)
            .unwrap(),
    );
    let skills = SkillsConfig {
        roots: vec![Root { path: dir.parent().unwrap().join("skills"), origin: Origin::Discovered }],
        install_dir: None,
        watch: false,
        poll: None,
    };
    let loop_settings =
        LoopSettings { max_rounds: script["max_rounds"].as_u64().unwrap() as u32, ..LoopSettings::default() };
    let config = ServerConfig {
        model: ModelSource::Provided(backend.clone()),
        skills: Some(skills),
        loop_settings,
        exec: None,
        artifacts: None,
    };
    let server = Server::start(config).await.unwrap();
    assert!(matches!(server.wait_until_loaded().await, ModelStatus::Ready { .. }));
    let state = web::Data::new(AppState {
        server: server.clone(),
        metrics: Metrics::new().unwrap(),
        started_at: 0,
        keep_alive: crate::http::webui::KEEP_ALIVE,
        access: Default::default(),
        admission: Default::default(),
        responses: Default::default(),
    });
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let mut request = request.clone();
    request["stream"] = Value::Bool(stream);
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/chat/completions").set_json(request).to_request())
            .await;
    let body = test::read_body(response).await.to_vec();
    server.shutdown();
    Run { body, prompts: backend.prompts() }
}

/// Replaces what changes from run to run (ids, times, durations).
fn normalize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match key.as_str() {
                    "id" if item.as_str().is_some_and(|s| s.starts_with("chatcmpl-") || s.starts_with("call_")) => {
                        *item = Value::String(
                            if item.as_str().unwrap().starts_with("call_") { "call_*" } else { "chatcmpl-*" }.into(),
                        )
                    }
                    "created" => *item = Value::from(0),
                    key if key.ends_with("_ms") || key.ends_with("per_second") => *item = Value::from(0),
                    _ => normalize(item),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

fn sse_payloads(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body).split("\n\n").filter_map(|f| f.strip_prefix("data: ").map(str::to_string)).collect()
}

fn check(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_SCENARIOS").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|_| panic!("{} is missing; run with UPDATE_SCENARIOS=1 to create it", path.display()));
    pretty_assertions::assert_eq!(expected, actual, "{}", path.display());
}

#[actix_web::test]
async fn scenarios() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("script.json").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 12, "scenario folders are missing");
    for dir in dirs {
        let script: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("script.json")).unwrap()).unwrap();
        let request: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("request.json")).unwrap()).unwrap();
        let streamed = run(&dir, &script, &request, true).await;
        let whole = run(&dir, &script, &request, false).await;
        assert_eq!(streamed.prompts, whole.prompts, "{}: the prompts differ between streamed and not", dir.display());

        let mut answer: Value = serde_json::from_slice(&whole.body).unwrap();
        normalize(&mut answer);
        let mut chunks: Vec<Value> = Vec::new();
        let mut sse = String::new();
        for payload in sse_payloads(&streamed.body) {
            if payload == "[DONE]" {
                sse.push_str("data: [DONE]\n\n");
                continue;
            }
            let mut chunk: Value = serde_json::from_str(&payload).unwrap();
            normalize(&mut chunk);
            sse.push_str(&format!("data: {chunk}\n\n"));
            chunks.push(chunk);
        }
        let streamed_text: String =
            chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        let whole_text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default();
        assert_eq!(streamed_text, whole_text, "{}: the stream differs from the answer", dir.display());

        let mut transcript = String::new();
        for (round, prompt) in whole.prompts.iter().enumerate() {
            transcript.push_str(&format!("===== round {} prompt =====\n{prompt}\n", round + 1));
        }
        transcript.push_str(&format!("===== response =====\n{}\n", serde_json::to_string_pretty(&answer).unwrap()));
        check(&dir.join("transcript.txt"), &transcript);
        check(&dir.join("stream.sse"), &sse);
    }
}
