//! Several models behind one server, on scripted models (each answers with
//! its own name) and one broken GGUF: routing by the `model` field on every
//! surface, the listings, loading on demand, eviction by count, never under
//! a running turn, idle unloading, and a model that fails alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::model::catalog::{Catalog, ModelEntry, ModelLimits};
use skillhost_actors::model::scripted::{ScriptedBackend, ScriptedOutput};
use skillhost_actors::model::ModelSource;
use skillhost_actors::ModelStatus;

use crate::http::test_server::{TestServer, CHATML};
use crate::http::{configure, AppState};

/// A scripted model called `name` that answers "I am NAME." `turns` times.
fn scripted(name: &str, turns: usize) -> Arc<ScriptedBackend> {
    let outputs = vec![format!("I am {name}."); turns];
    Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 4096, outputs).unwrap().named(name))
}

/// A scripted model called `name` whose one answer stalls after its first
/// token: its turn runs until the client goes.
fn stalling(name: &str) -> Arc<ScriptedBackend> {
    let output = ScriptedOutput { stall_after: Some(1), ..ScriptedOutput::from("I am small, and I go on and on.") };
    Arc::new(ScriptedBackend::for_agents(Some(CHATML), "llama", 4096, vec![output]).unwrap().named(name))
}

fn entry(backend: &Arc<ScriptedBackend>) -> ModelEntry {
    use skillhost_actors::model::ModelBackend;
    ModelEntry { name: backend.info().id.clone(), source: ModelSource::Provided(backend.clone()), bytes: 1 << 20 }
}

/// A model called `broken` whose file in `dir` says GGUF and is not one.
fn broken(dir: &std::path::Path) -> ModelEntry {
    let path = dir.join("broken.gguf");
    std::fs::write(&path, b"GGUF but not really a model").unwrap();
    let engine = skillhost_engine::EngineConfig {
        model_path: path,
        name: Some("broken".into()),
        n_parallel: 1,
        ..Default::default()
    };
    ModelEntry { name: "broken".into(), source: ModelSource::Load(engine), bytes: 27 }
}

async fn start(entries: Vec<ModelEntry>, limits: ModelLimits) -> web::Data<AppState> {
    let catalog = Catalog::new(entries, None, limits).unwrap();
    TestServer::models(catalog, None).start().await.unwrap_or_else(|err| panic!("{err}")).state
}

fn ask(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 16})
}

/// Polls the models view until `done` holds (a bound, never a timing claim).
async fn until(state: &AppState, what: &str, done: impl Fn(&[skillhost_actors::ModelView]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(&state.server.models().models) {
        assert!(Instant::now() < deadline, "{what}: {:?}", state.server.models());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn loaded(models: &[skillhost_actors::ModelView], name: &str) -> bool {
    models.iter().any(|m| m.name == name && matches!(m.status, ModelStatus::Ready { .. }))
}

#[actix_web::test]
async fn each_surface_routes_by_the_model_field_and_lists_every_model() {
    let (small, big) = (scripted("small", 8), scripted("big", 8));
    let state = start(vec![entry(&small), entry(&big)], ModelLimits::default()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;

    // Before any request names it, `big` is listed but not loaded.
    let listed: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/v1/models").to_request()).await;
    let ids: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["small", "big"], "{listed}");
    assert_eq!((listed["data"][0]["loaded"].clone(), listed["data"][1]["loaded"].clone()), (json!(true), json!(false)));

    let chat = |body: Value| test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    for (asked, answers) in [("big", "big"), ("small.gguf", "small"), ("", "small")] {
        let reply: Value = test::call_and_read_body_json(&app, chat(ask(asked))).await;
        assert_eq!(reply["choices"][0]["message"]["content"], format!("I am {answers}."), "{asked}: {reply}");
        assert_eq!(reply["model"], answers, "{reply}");
    }
    let without = json!({"messages": [{"role": "user", "content": "Who are you?"}]});
    let reply: Value = test::call_and_read_body_json(&app, chat(without)).await;
    assert_eq!(reply["model"], "small", "no model field is the default: {reply}");

    // Ollama names carry a tag.
    let ollama = json!({"model": "big:latest", "stream": false, "messages": [{"role": "user", "content": "Hi"}]});
    let request = test::TestRequest::post().uri("/ollama/api/chat").set_json(ollama).to_request();
    let reply: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(
        (reply["model"].clone(), reply["message"]["content"].clone()),
        (json!("big:latest"), json!("I am big."))
    );

    // Anthropic: a served name picks it; a Claude name gets the default.
    for (asked, answers) in [("big", "big"), ("claude-sonnet-4-5", "small")] {
        let body = json!({"model": asked, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]});
        let request = test::TestRequest::post().uri("/v1/messages").set_json(body).to_request();
        let reply: Value = test::call_and_read_body_json(&app, request).await;
        assert_eq!(reply["content"][0]["text"], format!("I am {answers}."), "{asked}: {reply}");
    }

    // Responses.
    let body = json!({"model": "big", "input": "Hi", "store": false});
    let request = test::TestRequest::post().uri("/v1/responses").set_json(body).to_request();
    let reply: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(reply["model"], "big", "{reply}");

    let tags: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/ollama/api/tags").to_request()).await;
    let names: Vec<&str> = tags["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["small:latest", "big:latest"]);
    let ps: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/ollama/api/ps").to_request()).await;
    assert_eq!(ps["models"].as_array().unwrap().len(), 2, "both are loaded now: {ps}");
    let show = json!({"model": "big:latest"});
    let request = test::TestRequest::post().uri("/ollama/api/show").set_json(show).to_request();
    assert_eq!(test::call_service(&app, request).await.status(), 200);

    let metrics =
        test::read_body(test::call_service(&app, test::TestRequest::get().uri("/metrics").to_request()).await).await;
    let metrics = String::from_utf8_lossy(&metrics);
    for line in [
        "skillhost_model_loaded{model=\"big\"} 1",
        "skillhost_model_loaded{model=\"small\"} 1",
        "skillhost_model_active_slots{model=\"big\"} 0",
        "skillhost_model_queued_requests{model=\"small\"} 0",
        "skillhost_model_batch_sequences_max{model=\"big\"}",
    ] {
        assert!(metrics.contains(line), "/metrics lacks {line}:\n{metrics}");
    }
}

#[actix_web::test]
async fn an_unknown_model_is_a_404_in_each_surfaces_shape_that_lists_the_models() {
    let state = start(vec![entry(&scripted("small", 1)), entry(&scripted("big", 1))], ModelLimits::default()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let expected = "the model 'huge' is not served here; the models are: small, big";
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(ask("huge")).to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), 404);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    assert_eq!(body["error"]["message"], expected, "{body}");

    let ollama = json!({"model": "huge:latest", "stream": false, "messages": [{"role": "user", "content": "Hi"}]});
    let request = test::TestRequest::post().uri("/ollama/api/chat").set_json(ollama).to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), 404);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["error"], expected, "{body}");

    let request = test::TestRequest::post().uri("/ollama/api/show").set_json(json!({"model": "huge"})).to_request();
    assert_eq!(test::call_service(&app, request).await.status(), 404);
    let request =
        test::TestRequest::post().uri("/v1/responses").set_json(json!({"model": "huge", "input": "Hi"})).to_request();
    assert_eq!(test::call_service(&app, request).await.status(), 404);
    let webui = json!({"model": "huge", "messages": [{"role": "user", "content": "Hi"}]});
    let request = test::TestRequest::post().uri("/api/chat").set_json(webui).to_request();
    assert_eq!(test::call_service(&app, request).await.status(), 404);
}

#[actix_web::test]
async fn one_loaded_model_at_most_evicts_the_idle_one_and_reloads_it_on_demand() {
    let (small, big) = (scripted("small", 8), scripted("big", 8));
    let limits = ModelLimits { max_loaded: 1, ..ModelLimits::default() };
    let state = start(vec![entry(&small), entry(&big)], limits).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let chat = |model: &str| test::TestRequest::post().uri("/v1/chat/completions").set_json(ask(model)).to_request();
    for (asked, other) in [("big", "small"), ("small", "big"), ("big", "small")] {
        let reply: Value = test::call_and_read_body_json(&app, chat(asked)).await;
        assert_eq!(reply["choices"][0]["message"]["content"], format!("I am {asked}."), "{reply}");
        let models = state.server.models();
        assert!(loaded(&models.models, asked) && !loaded(&models.models, other), "{models:?}");
    }
}

#[actix_web::test]
async fn a_model_with_a_running_turn_is_never_unloaded_under_it() {
    let small = stalling("small");
    let big = scripted("big", 1);
    let limits = ModelLimits { max_loaded: 1, ..ModelLimits::default() };
    let state = start(vec![entry(&small), entry(&big)], limits).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;

    // A streamed turn on `small` that stalls: it runs until its client goes.
    let mut body = ask("small");
    body["stream"] = json!(true);
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let streaming = test::call_service(&app, request).await;
    assert_eq!(streaming.status(), 200);
    until(&state, "the turn runs", |models| models.iter().any(|m| m.name == "small" && m.running == 1)).await;

    // `big` needs the only place; it waits for the turn instead of
    // unloading `small` under it.
    let server = state.server.clone();
    let waiting = tokio::spawn(async move { server.model(Some("big")).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "big must wait");
    assert!(loaded(&state.server.models().models, "small"));

    // The client goes, the turn ends, and `big` takes the place.
    drop(streaming);
    assert!(waiting.await.unwrap().is_ok());
    let models = state.server.models();
    assert!(loaded(&models.models, "big") && !loaded(&models.models, "small"), "{models:?}");
}

/// A streamed request whose model is not in memory starts at once and
/// hears about the load in its surface's own frames, then gets its answer;
/// an error found once the model is there (a field it refuses, a failed
/// load) is the stream's error frame.
#[actix_web::test]
async fn a_stream_waiting_for_its_model_hears_about_the_load_on_every_surface() {
    let dir = tempfile::tempdir().unwrap();
    let bad = broken(dir.path());
    let state =
        start(vec![entry(&scripted("small", 1)), entry(&scripted("big", 8)), bad], ModelLimits::default()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let messages = json!([{"role": "user", "content": "Who are you?"}]);
    let surfaces = [
        ("/v1/chat/completions", json!({"model": "big", "messages": messages, "stream": true}), "data: [DONE]"),
        (
            "/v1/messages",
            json!({"model": "big", "messages": messages, "max_tokens": 16, "stream": true}),
            "event: message_stop",
        ),
        (
            "/v1/responses",
            json!({"model": "big", "input": "Who are you?", "stream": true}),
            "event: response.completed",
        ),
        ("/ollama/api/chat", json!({"model": "big", "messages": messages}), "\"done\":true"),
        ("/api/chat", json!({"model": "big", "messages": messages}), "\"done\":true"),
    ];
    for (path, body, last) in surfaces {
        until(&state, "the last turn ends", |models| models.iter().all(|m| m.running == 0)).await;
        state.server.unload_model("big").await.unwrap();
        let request = test::TestRequest::post().uri(path).set_json(body).to_request();
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status(), 200, "{path}");
        let text = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
        let first = text.lines().next().unwrap_or_default();
        match path {
            "/ollama/api/chat" => {
                let line: Value = serde_json::from_str(first).unwrap();
                assert_eq!(line["loading"]["model"], "big", "{text}");
                assert_eq!(line["message"], json!({"role": "assistant", "content": ""}), "{text}");
                assert_eq!(line["done"], false, "{text}");
            }
            "/api/chat" => {
                let frame: Value = serde_json::from_str(first.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(frame["loading"]["model"], "big", "{text}");
                assert!(frame["loading"]["progress"].is_number(), "{text}");
            }
            _ => assert!(first.starts_with(": loading model 'big' ("), "{path}: {text}"),
        }
        // The answer ran to its end (the scripted text comes in pieces).
        assert!(text.contains(last), "{path}: {text}");
    }

    // Loaded, the same request has no load frame.
    let body = json!({"model": "big", "messages": messages, "stream": true});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let text = String::from_utf8(test::call_and_read_body(&app, request).await.to_vec()).unwrap();
    assert!(text.starts_with("data: "), "{text}");

    // A field the model refuses, found after the load: the stream's error frame.
    until(&state, "the last turn ends", |models| models.iter().all(|m| m.running == 0)).await;
    state.server.unload_model("big").await.unwrap();
    let body = json!({"model": "big", "messages": messages, "stream": true, "temperature": 2.5});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let text = String::from_utf8(test::call_and_read_body(&app, request).await.to_vec()).unwrap();
    let error = text.lines().find_map(|line| line.strip_prefix("data: ")).unwrap();
    let error: Value = serde_json::from_str(error).unwrap();
    assert_eq!(error["error"]["message"], "'temperature' must be between 0 and 2, got 2.5", "{text}");

    // A model that fails to load: the same, and the others go on.
    let body = json!({"model": "broken", "messages": messages, "stream": true});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), 200);
    let text = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    assert!(text.starts_with(": loading model 'broken' ("), "{text}");
    assert!(text.contains("the model 'broken' is not available"), "{text}");
    let body = json!({"model": "small", "messages": messages, "stream": true});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let text = String::from_utf8(test::call_and_read_body(&app, request).await.to_vec()).unwrap();
    assert!(text.starts_with("data: ") && text.contains("data: [DONE]"), "{text}");
}

#[actix_web::test]
async fn an_admin_loads_and_unloads_a_model_but_never_under_a_running_turn() {
    let small = stalling("small");
    let state = start(vec![entry(&small), entry(&scripted("big", 1))], ModelLimits::default()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let post = |uri: &str| test::TestRequest::post().uri(uri).to_request();

    let response = test::call_service(&app, post("/api/models/big/load")).await;
    assert_eq!(response.status(), 200);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body, json!({"model": "big", "loaded": true, "status": "ready"}));
    assert!(loaded(&state.server.models().models, "big"));
    for _ in 0..2 {
        // Unloading twice is the same as once.
        assert_eq!(test::call_service(&app, post("/api/models/big.gguf/unload")).await.status(), 200);
        assert!(!loaded(&state.server.models().models, "big"));
    }
    let response = test::call_service(&app, post("/api/models/huge/load")).await;
    assert_eq!(response.status(), 404);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["error"], "the model 'huge' is not served here; the models are: small, big", "{body}");
    let get = test::TestRequest::get().uri("/api/models/big/load").to_request();
    assert_eq!(test::call_service(&app, get).await.status(), 405);

    // A turn runs on `small`: unloading it is refused until the turn ends.
    let mut body = ask("small");
    body["stream"] = json!(true);
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let streaming = test::call_service(&app, request).await;
    until(&state, "the turn runs", |models| models.iter().any(|m| m.name == "small" && m.running == 1)).await;
    let response = test::call_service(&app, post("/api/models/small/unload")).await;
    assert_eq!(response.status(), 409);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["error"], "the model 'small' has 1 running turn(s); unload it once they end", "{body}");
    assert!(loaded(&state.server.models().models, "small"));
    drop(streaming);
    until(&state, "the turn ends", |models| models.iter().all(|m| m.running == 0)).await;
    assert_eq!(test::call_service(&app, post("/api/models/small/unload")).await.status(), 200);
    assert!(!loaded(&state.server.models().models, "small"));
}

#[actix_web::test]
async fn an_idle_model_is_unloaded_and_loads_again_when_named() {
    let (small, big) = (scripted("small", 4), scripted("big", 4));
    let limits = ModelLimits { idle_unload: Some(Duration::from_secs(1)), ..ModelLimits::default() };
    let state = start(vec![entry(&small), entry(&big)], limits).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let chat = |model: &str| test::TestRequest::post().uri("/v1/chat/completions").set_json(ask(model)).to_request();
    let _: Value = test::call_and_read_body_json(&app, chat("big")).await;
    until(&state, "both idle models unload", |models| models.iter().all(|m| matches!(m.status, ModelStatus::Unloaded)))
        .await;
    let reply: Value = test::call_and_read_body_json(&app, chat("big")).await;
    assert_eq!(reply["choices"][0]["message"]["content"], "I am big.");
    // Health stays ok: an unloaded default model loads on the next request.
    let health = test::call_service(&app, test::TestRequest::get().uri("/health").to_request()).await;
    assert_eq!(health.status(), 200);
}

#[actix_web::test]
async fn a_broken_gguf_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let bad = broken(dir.path());
    let state = start(vec![entry(&scripted("small", 2)), bad], ModelLimits::default()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let chat = |model: &str| test::TestRequest::post().uri("/v1/chat/completions").set_json(ask(model)).to_request();
    let response = test::call_service(&app, chat("broken")).await;
    assert_eq!(response.status(), 503);
    let body: Value = test::read_body_json(response).await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("the model 'broken' is not available"), "{body}");
    let reply: Value = test::call_and_read_body_json(&app, chat("small")).await;
    assert_eq!(reply["choices"][0]["message"]["content"], "I am small.");
    let listed: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/v1/models").to_request()).await;
    assert_eq!(listed["data"][1]["status"], "failed", "{listed}");
}

/// The default model and gemma-3-270m (`make test-models`) as real models
/// in one server: greedy answers to both at once equal each model's answer
/// alone, and with one place, switching evicts and reloads with the same
/// answers. Each model runs one sequence, so its batches never change.
#[actix_web::test]
async fn two_real_models_answer_at_once_as_they_do_alone_and_survive_eviction() {
    let gemma = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(gemma.exists(), "{} is missing: run `make test-models`", gemma.display());
    let real = |name: &str, path: std::path::PathBuf| ModelEntry {
        name: name.into(),
        bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
        source: ModelSource::Load(skillhost_engine::EngineConfig {
            model_path: path,
            name: Some(name.into()),
            n_ctx: Some(1024),
            n_parallel: 1,
            ..Default::default()
        }),
    };
    let entries = || vec![real("smol", crate::http::test_server::model_path()), real("gemma", gemma.clone())];
    let body = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0, "max_tokens": 24});
    let answer = |reply: &Value| {
        assert_eq!(reply["object"], "chat.completion", "{reply}");
        assert!(reply["usage"]["completion_tokens"].as_u64().unwrap_or_default() > 0, "{reply}");
        reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string()
    };

    let state = start(entries(), ModelLimits::default()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let chat = |model: &str| test::TestRequest::post().uri("/v1/chat/completions").set_json(body(model)).to_request();
    let smol_alone = answer(&test::call_and_read_body_json(&app, chat("smol")).await);
    let gemma_alone = answer(&test::call_and_read_body_json(&app, chat("gemma")).await);
    let (smol, gemma_reply): (Value, Value) = futures_util::join!(
        test::call_and_read_body_json(&app, chat("smol")),
        test::call_and_read_body_json(&app, chat("gemma"))
    );
    assert_eq!((answer(&smol), answer(&gemma_reply)), (smol_alone.clone(), gemma_alone.clone()));
    let listed: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/v1/models").to_request()).await;
    for entry in listed["data"].as_array().unwrap() {
        assert_eq!((entry["loaded"].clone(), entry["context_length"].clone()), (json!(true), json!(1024)), "{listed}");
        assert!(entry["meta"]["kv_size"].as_u64().unwrap_or_default() > 0, "{listed}");
    }

    let limits = ModelLimits { max_loaded: 1, ..ModelLimits::default() };
    let state = start(entries(), limits).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    for (model, expected) in [("gemma", &gemma_alone), ("smol", &smol_alone), ("gemma", &gemma_alone)] {
        assert_eq!(&answer(&test::call_and_read_body_json(&app, chat(model)).await), expected, "{model}");
        let models = state.server.models();
        assert_eq!(models.models.iter().filter(|m| matches!(m.status, ModelStatus::Ready { .. })).count(), 1);
        assert!(loaded(&models.models, model), "{models:?}");
    }
}
