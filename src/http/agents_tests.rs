//! Multiple agents over HTTP with the scripted model: the Web UI's frames
//! of a turn with two children, a client that leaves while children work
//! (every child stops, counted on `/metrics`), and delegation turned off
//! per request (no coordination tools in the prompt, a forced
//! `spawn_agent` refused), and a plain request that offers no tools left
//! without them.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::chat_loop::LoopSettings;
use skillhost_actors::model::scripted::{ScriptedBackend, ScriptedOutput};

use crate::http::test_server::{TestServer, CHATML};
use crate::http::{configure, AppState};

fn call(name: &str, arguments: Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": arguments}))
}

fn child(agent: &str, text: String, delay_ms: u64) -> ScriptedOutput {
    ScriptedOutput { agent: agent.into(), delay: Duration::from_millis(delay_ms), ..ScriptedOutput::from(text) }
}

async fn app_state(outputs: Vec<ScriptedOutput>) -> (web::Data<AppState>, Arc<ScriptedBackend>) {
    let running = TestServer::scripted(outputs).scenario_skills().start().await.unwrap();
    (running.state, running.backend.unwrap())
}

fn frames(body: &[u8]) -> Vec<Value> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter_map(|chunk| chunk.lines().find_map(|line| line.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

/// One series of the `/metrics` text, 0 when absent.
fn series(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

#[actix_web::test]
async fn a_turn_with_two_children_shows_each_childs_steps_and_reports_in_the_web_ui() {
    let outputs = vec![
        ScriptedOutput::from(
            call("spawn_agent", json!({"message": "Read the notes skill."}))
                + &call("spawn_agent", json!({"message": "What is W-12?"})),
        ),
        ScriptedOutput::from(call("wait_agent", json!({}))),
        ScriptedOutput::from(call("wait_agent", json!({}))),
        ScriptedOutput::from("Both helpers reported.".to_string()),
        child("/root/1", call("skills_read", json!({"skill": "notes"})), 0),
        child("/root/1", "Notes: decisions first.".into(), 0),
        child("/root/2", call("skills_read", json!({"skill": "weather-codes"})), 50),
        child("/root/2", "W-12 is freezing fog.".into(), 0),
    ];
    let (state, _) = app_state(outputs).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Use two helpers."}]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/api/chat").set_json(body).to_request()).await;
    assert_eq!(response.status().as_u16(), 200);
    let frames = frames(&test::read_body(response).await);
    let phases = |id: &str| -> Vec<String> {
        frames
            .iter()
            .filter(|f| f["agent"]["agent_id"] == id)
            .map(|f| f["agent"]["phase"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(phases("/root/1"), ["spawned", "reported"], "{frames:?}");
    assert_eq!(phases("/root/2"), ["spawned", "reported"], "{frames:?}");
    let steps: Vec<(String, String)> = frames
        .iter()
        .filter(|f| f.get("skill_step").is_some())
        .map(|f| (f["agent_id"].as_str().unwrap().into(), f["skill"].as_str().unwrap().into()))
        .collect();
    assert!(steps.contains(&("/root/1".into(), "notes".into())), "{steps:?}");
    assert!(steps.contains(&("/root/2".into(), "weather-codes".into())), "{steps:?}");
    // The children's text is their report, never the client's content.
    let content: String = frames.iter().filter_map(|f| f["content"].as_str()).collect();
    assert_eq!(content, "Both helpers reported.");
    let done = frames.iter().find(|f| f["done"] == true).unwrap();
    let agents: Vec<&str> =
        done["rounds"].as_array().unwrap().iter().map(|r| r["agent_id"].as_str().unwrap()).collect();
    assert_eq!(agents.iter().filter(|a| **a == "/root/1").count(), 2, "{done}");
    assert_eq!(agents.iter().filter(|a| **a == "/root/2").count(), 2, "{done}");
    let generated: u64 =
        done["rounds"].as_array().unwrap().iter().map(|r| r["generated_tokens"].as_u64().unwrap()).sum();
    assert_eq!(done["usage"]["completion_tokens"].as_u64().unwrap(), generated, "{done}");
}

#[actix_web::test]
async fn a_client_that_leaves_mid_turn_stops_every_child() {
    let outputs = vec![
        ScriptedOutput::from(
            call("spawn_agent", json!({"message": "A long task."}))
                + &call("spawn_agent", json!({"message": "Another long task."})),
        ),
        ScriptedOutput::from(call("wait_agent", json!({"timeout_ms": 120000}))),
        child("/root/1", "never".into(), 120_000),
        child("/root/2", "never".into(), 120_000),
    ];
    let (state, _) = app_state(outputs).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let metrics = || async {
        let request = test::TestRequest::get().uri("/metrics").to_request();
        String::from_utf8(test::read_body(test::call_service(&app, request).await).await.to_vec()).unwrap()
    };
    let body = json!({"messages": [{"role": "user", "content": "Delegate."}], "stream": true});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request())
            .await;
    let mut open = false;
    for _ in 0..200 {
        if series(&metrics().await, "skillhost_agents_open") == 2.0 {
            open = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(open, "the children never started, so their end would prove nothing: {}", metrics().await);
    drop(response);
    let mut gone = false;
    for _ in 0..200 {
        let text = metrics().await;
        if series(&text, "skillhost_agents_open") == 0.0 && series(&text, "skillhost_agents_stopped_total") == 2.0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let text = metrics().await;
    assert!(gone, "children outlived their client: {text}");
    assert_eq!(series(&text, "skillhost_agents_spawned_total"), 2.0, "{text}");
    assert_eq!(series(&text, "skillhost_agents_finished_total"), 0.0, "{text}");
}

#[actix_web::test]
async fn multi_agent_false_declares_no_coordination_tools_on_any_surface() {
    let outputs: Vec<ScriptedOutput> = (0..3).map(|_| ScriptedOutput::from("Hello.".to_string())).collect();
    let (state, backend) = app_state(outputs).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let user = json!([{"role": "user", "content": "Hi."}]);
    for (uri, body) in [
        ("/v1/chat/completions", json!({"messages": user, "multi_agent": false})),
        ("/api/chat", json!({"messages": user, "multiAgent": false})),
        ("/ollama/api/chat", json!({"model": "scripted", "messages": user, "multi_agent": false, "stream": false})),
    ] {
        let response = test::call_service(&app, test::TestRequest::post().uri(uri).set_json(&body).to_request()).await;
        assert_eq!(response.status().as_u16(), 200, "{uri}");
        let _ = test::read_body(response).await;
    }
    let prompts = backend.prompts();
    assert_eq!(prompts.len(), 3);
    for prompt in &prompts {
        assert!(!prompt.contains("spawn_agent"), "{prompt}");
        assert!(prompt.contains("skills_read"), "skills stay on: {prompt}");
    }
    // Forcing the tool that is not declared is the usual 400.
    let body = json!({
        "messages": user,
        "multi_agent": false,
        "tool_choice": {"type": "function", "function": {"name": "spawn_agent"}},
    });
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request())
            .await;
    assert_eq!(response.status().as_u16(), 400);
    let error: Value = test::read_body_json(response).await;
    assert!(error["error"]["message"].as_str().unwrap().contains("spawn_agent"), "{error}");
}

#[actix_web::test]
async fn a_plain_request_carries_no_coordination_tools_unless_asked() {
    use skillhost_actors::chat_loop::MultiAgent;
    let user = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let weather = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    // (server setting, request body, declared?)
    let cases = [
        (MultiAgent::Auto, json!({"messages": user}), false),
        (MultiAgent::Auto, json!({"messages": user, "multi_agent": true}), true),
        (MultiAgent::Auto, json!({"messages": user, "tools": weather}), true),
        (MultiAgent::Always, json!({"messages": user}), true),
        (MultiAgent::Off, json!({"messages": user, "multi_agent": true}), false),
    ];
    for (mode, body, declared) in cases {
        let backend = Arc::new(
            ScriptedBackend::for_agents(Some(CHATML), "llama", 8192, vec![ScriptedOutput::from("Paris.".to_string())])
                .unwrap(),
        );
        let settings = LoopSettings { multi_agent: mode, ..LoopSettings::default() };
        let state = TestServer::on(backend.clone()).settings(settings).start().await.unwrap().state;
        let app = test::init_service(App::new().app_data(state).configure(configure)).await;
        let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(&body).to_request();
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status().as_u16(), 200, "{mode:?} {body}");
        let _ = test::read_body(response).await;
        let prompt = backend.prompts().pop().unwrap();
        assert_eq!(prompt.contains("spawn_agent"), declared, "{mode:?} {body}: {prompt}");
        if !declared && !body.to_string().contains("tools") {
            // Nothing but the conversation: no tool text at all.
            assert!(!prompt.contains("tool_call"), "{prompt}");
        }
    }
}
