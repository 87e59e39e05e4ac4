//! The Web UI's routes with the scripted model: the `/api/chat` frames of a
//! two-round skills request in order and shape, `/api/models`, the page's
//! headers, and the refusals.

use std::sync::Arc;

use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::chat_loop::LoopSettings;
use skillhost_actors::model::scripted::ScriptedBackend;

use crate::http::test_server::{TestServer, CHATML};
use crate::http::{configure, AppState};

async fn state(outputs: Vec<String>, skills: bool) -> web::Data<AppState> {
    start(TestServer::scripted(outputs), skills).await
}

/// The app on `backend`, with the scenario skills when `skills`.
async fn state_with(backend: Arc<ScriptedBackend>, skills: bool) -> web::Data<AppState> {
    start(TestServer::on(backend), skills).await
}

async fn start(server: TestServer, skills: bool) -> web::Data<AppState> {
    let server = if skills { server.scenario_skills() } else { server };
    server.start().await.unwrap().state
}

/// The frames of a Web UI turn, without the opening one.
fn frames(body: &[u8]) -> Vec<Value> {
    crate::http::test_server::web_frames(body)
}

#[actix_web::test]
async fn a_two_round_skills_request_streams_every_round_with_its_skill_step() {
    let outputs = vec![
        "I will read the skill first.\n<tool_call>\n{\"name\": \"skills_read\", \"arguments\": {\"skill\": \"notes\"}}\n</tool_call>".to_string(),
        "2026-11-30\nDecisions: none.\nNOTE-7".to_string(),
    ];
    let app = test::init_service(App::new().app_data(state(outputs, true).await).configure(configure)).await;
    let body = json!({
        "messages": [{"role": "user", "content": "Write the meeting notes."}],
        "skills": ["notes"],
        "maxTokens": 200,
    });
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/api/chat").set_json(body).to_request()).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers().get("content-type").unwrap(), "text/event-stream");
    let frames = frames(&test::read_body(response).await);

    // Round 1's text, then the step, then round 2's text, then `done`.
    let step_at = frames.iter().position(|f| f.get("skill_step").is_some()).unwrap();
    assert_eq!(
        frames[step_at],
        json!({"skill_step": "skills_read", "agent_id": "/root", "skill": "notes", "detail": "SKILL.md", "ok": true, "round": 1})
    );
    let text = |range: &[Value]| range.iter().filter_map(|f| f["content"].as_str()).collect::<String>();
    let before = &frames[..step_at];
    let after = &frames[step_at + 1..frames.len() - 1];
    assert!(before.iter().all(|f| f.get("content").is_some()), "{before:?}");
    assert!(after.iter().all(|f| f.get("content").is_some()), "{after:?}");
    // Each round streams in several frames, not one block at its end.
    assert!(before.len() > 1 && after.len() > 1, "{} and {} frames", before.len(), after.len());
    assert_eq!(text(before), "I will read the skill first.");
    assert_eq!(text(after), "\n\n2026-11-30\nDecisions: none.\nNOTE-7");
    assert!(!text(&frames).contains("tool_call"));

    let done = frames.last().unwrap();
    assert_eq!(done["done"], true);
    assert_eq!(done["finish_reason"], "stop");
    assert!(done["conversationId"].as_str().unwrap().starts_with("c-"), "{done}");
    assert_eq!(done["rounds"].as_array().unwrap().len(), 2);
    assert!(done["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    assert!(done["timings"]["predicted_n"].as_u64().unwrap() > 0);
}

#[actix_web::test]
async fn a_new_conversation_gets_an_id_and_errors_are_frames_or_4xx() {
    let app = test::init_service(
        App::new().app_data(state(vec!["Hi.".into(), "Again.".into()], false).await).configure(configure),
    )
    .await;
    let body = json!({"messages": [{"role": "user", "content": "hello"}]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/api/chat").set_json(body).to_request()).await;
    let frames = frames(&test::read_body(response).await);
    assert_eq!(frames[0], json!({"content": "Hi."}));
    let id = frames.last().unwrap()["conversationId"].as_str().unwrap().to_string();
    assert!(id.starts_with("c-") && id.len() == 34, "{id}");

    let cases = [
        (json!({"messages": "hello"}), "messages"),
        (json!({"messages": [{"role": "user", "content": "x"}], "maxTokens": "many"}), "maxTokens"),
        (json!({"messages": [{"role": "user", "content": "x"}], "conversationId": "../etc"}), "conversationId"),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "conversationId": "a".repeat(crate::http::webui::MAX_CONVERSATION_ID_LEN + 1)}),
            "conversationId",
        ),
        (json!({"messages": [{"role": "user", "content": "x"}], "skills": ["notes"]}), "skills"),
        (json!({"messages": []}), "messages"),
    ];
    for (body, field) in cases {
        let response =
            test::call_service(&app, test::TestRequest::post().uri("/api/chat").set_json(&body).to_request()).await;
        assert_eq!(response.status().as_u16(), 400, "{body}");
        let error: Value = test::read_body_json(response).await;
        let message = error["error"].as_str().unwrap();
        assert!(message.contains(field), "{body} → {message}");
    }
    // A conversation id at the limit is read, but one the server did not
    // issue starts a new conversation: clients never choose the id.
    let body = json!({"messages": [{"role": "user", "content": "x"}], "conversationId": "a".repeat(64)});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/api/chat").set_json(body).to_request()).await;
    assert_eq!(response.status().as_u16(), 200);
    let issued = self::frames(&test::read_body(response).await).last().unwrap()["conversationId"].clone();
    assert!(issued != "a".repeat(64) && issued != id.as_str(), "{issued}");
    let response = test::call_service(&app, test::TestRequest::get().uri("/api/chat").to_request()).await;
    assert_eq!(response.status().as_u16(), 405);
}

#[actix_web::test]
async fn models_block_and_the_page_headers() {
    let app = test::init_service(App::new().app_data(state(vec![], true).await).configure(configure)).await;
    let models: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/models").to_request()).await;
    assert_eq!(models["data"][0]["context_length"], 8192);
    assert_eq!(models["data"][0]["capabilities"]["codeExec"], false);
    assert_eq!(models["skills"], json!({"enabled": true, "installable": false, "allowScripts": false, "count": 3}));
    let app = test::init_service(App::new().app_data(state(vec![], false).await).configure(configure)).await;
    let models: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/models").to_request()).await;
    assert_eq!(models["skills"], Value::Null);

    for (uri, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/assets/app.js", "text/javascript; charset=utf-8"),
        ("/assets/markdown.js", "text/javascript; charset=utf-8"),
        ("/assets/style.css", "text/css; charset=utf-8"),
    ] {
        let response = test::call_service(&app, test::TestRequest::get().uri(uri).to_request()).await;
        assert_eq!(response.status().as_u16(), 200, "{uri}");
        assert_eq!(response.headers().get("content-type").unwrap(), content_type);
        let csp = response.headers().get("content-security-policy").unwrap().to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{csp}");
        assert_eq!(response.headers().get("x-content-type-options").unwrap(), "nosniff");
    }
    let response = test::call_service(&app, test::TestRequest::get().uri("/assets/../Cargo.toml").to_request()).await;
    assert_eq!(response.status().as_u16(), 404);
    let response = test::call_service(&app, test::TestRequest::get().uri("/assets/secret.js").to_request()).await;
    assert_eq!(response.status().as_u16(), 404);
}

#[actix_web::test]
async fn ollama_shapes_over_http() {
    let outputs = vec![
        "Paris.".to_string(),
        "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>".to_string(),
    ];
    let state = state(outputs, false).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let body = json!({"model": "scripted:latest", "messages": [{"role": "user", "content": "Capital of France?"}], "stream": false});
    let reply: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/api/chat/ollama").set_json(body).to_request(),
    )
    .await;
    assert_eq!(reply["message"], json!({"role": "assistant", "content": "Paris."}), "{reply}");
    assert_eq!(reply["done"], true);
    assert_eq!(reply["done_reason"], "stop");
    for field in ["total_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"] {
        assert!(reply[field].is_u64(), "{field}: {reply}");
    }

    // Streamed by default: NDJSON, a tool call with object arguments.
    let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "Weather?"}], "tools": tools});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/ollama/api/chat").set_json(body).to_request()).await;
    assert_eq!(response.headers().get("content-type").unwrap(), "application/x-ndjson");
    let body = test::read_body(response).await;
    let lines: Vec<Value> =
        std::str::from_utf8(&body).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let call = lines.iter().find(|l| l["message"].get("tool_calls").is_some()).unwrap();
    assert_eq!(
        call["message"]["tool_calls"],
        json!([{"function": {"name": "weather", "arguments": {"city": "Paris"}}}])
    );
    assert_eq!(lines.last().unwrap()["done"], true);
    assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false));
    // Both answers (a text, then a tool call on the stream) count their
    // first output, as every surface does through the one stream core.
    assert_eq!(state.metrics.time_to_first_token.get_sample_count(), 2);

    let body = json!({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/ollama/api/chat").set_json(body).to_request()).await;
    assert_eq!(response.status().as_u16(), 404);
    let error: Value = test::read_body_json(response).await;
    assert!(error["error"].as_str().unwrap().contains("gpt-4"));

    let tags: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/ollama/api/tags").to_request()).await;
    assert_eq!(tags["models"][0]["name"], "scripted:latest");
    let version: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/ollama/api/version").to_request()).await;
    assert!(version["version"].is_string());
    let show: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/ollama/api/show").set_json(json!({"model": "scripted:latest"})).to_request(),
    )
    .await;
    assert!(show["capabilities"].as_array().unwrap().contains(&json!("completion")));
    for (body, status) in [("{\"model\": 3}", 400), ("not json", 400), ("{\"model\": \"gpt-4\"}", 404)] {
        let response = test::call_service(
            &app,
            test::TestRequest::post()
                .uri("/ollama/api/show")
                .insert_header(("content-type", "application/json"))
                .set_payload(body)
                .to_request(),
        )
        .await;
        assert_eq!(response.status().as_u16(), status, "{body}");
        let error: Value = test::read_body_json(response).await;
        assert!(error["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}");
    }
}

#[actix_web::test]
async fn thinking_travels_apart_from_the_answer_on_every_surface() {
    let output = "<think>The user asks for a capital.</think>\n\nParis.".to_string();
    let app = test::init_service(
        App::new().app_data(state(vec![output.clone(), output.clone(), output], false).await).configure(configure),
    )
    .await;
    let messages = json!([{"role": "user", "content": "Capital of France?"}]);

    let response = test::call_service(
        &app,
        test::TestRequest::post().uri("/api/chat").set_json(json!({"messages": messages})).to_request(),
    )
    .await;
    let frames = frames(&test::read_body(response).await);
    let reasoning: String = frames.iter().filter_map(|f| f["reasoning"].as_str()).collect();
    let content: String = frames.iter().filter_map(|f| f["content"].as_str()).collect();
    assert_eq!(reasoning, "The user asks for a capital.");
    assert_eq!(content, "Paris.");
    let last_reasoning = frames.iter().rposition(|f| f.get("reasoning").is_some()).unwrap();
    let first_content = frames.iter().position(|f| f.get("content").is_some()).unwrap();
    assert!(last_reasoning < first_content);

    let reply: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(json!({"messages": messages})).to_request(),
    )
    .await;
    assert_eq!(reply["choices"][0]["message"]["content"], "Paris.");
    assert_eq!(reply["choices"][0]["message"]["reasoning_content"], "The user asks for a capital.");

    let reply: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post()
            .uri("/api/chat/ollama")
            .set_json(json!({"messages": messages, "stream": false}))
            .to_request(),
    )
    .await;
    assert_eq!(reply["message"]["content"], "Paris.");
    assert_eq!(reply["message"]["thinking"], "The user asks for a capital.");
}

#[actix_web::test]
async fn a_tool_result_too_long_for_the_context_becomes_a_note() {
    // 3,000 tokens of context at four bytes a token; the manual's first page
    // is 48 KB.
    let outputs = vec![
        "<tool_call>\n{\"name\": \"skills_read\", \"arguments\": {\"skill\": \"long-doc\", \"path\": \"references/manual.md\"}}\n</tool_call>".to_string(),
        "The manual is too long to read here.".to_string(),
    ];
    let backend = Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 3000, outputs).unwrap().limiting_context());
    let state = state_with(backend.clone(), true).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "What does the manual say?"}], "skills": ["long-doc"]});
    let reply: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request(),
    )
    .await;
    assert_eq!(reply["choices"][0]["message"]["content"], "The manual is too long to read here.", "{reply}");
    let last = backend.prompts().pop().unwrap();
    assert!(last.contains("[Result left out: too long for the context.] The result was"), "{last}");
    assert!(last.len() / 4 <= 3000);
}

#[actix_web::test]
async fn a_looping_model_stops_at_the_turn_budget_and_repeats_are_answered_once() {
    // Would call skills_read with the same arguments forever.
    let looping = "<tool_call>\n{\"name\": \"skills_read\", \"arguments\": {\"skill\": \"notes\"}}\n</tool_call>";
    let backend = Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 8192, vec![looping.to_string(); 20]).unwrap());
    let app =
        test::init_service(App::new().app_data(state_with(backend.clone(), true).await).configure(configure)).await;
    // No `skills` field: discovery offers the catalog, as it does by default.
    let body = json!({"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 40});
    let response: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request(),
    )
    .await;
    // One budget of 40 generated tokens for the whole turn, not per round.
    assert_eq!(response["choices"][0]["finish_reason"], "length", "{response}");
    assert_eq!(response["usage"]["completion_tokens"], 40, "{response}");
    let rounds = response["rounds"].as_array().unwrap().len();
    assert!(rounds < 8, "{rounds} rounds");
    // The second identical call, a round later, was not run again.
    let prompts = backend.prompts();
    assert!(prompts[1].contains("NOTE-7"), "round 1's read is answered");
    assert!(
        prompts[2].contains("Not run again: this call is identical to one already answered in round 1"),
        "{}",
        prompts[2]
    );
}

/// `event:`/`data:` pairs of an Anthropic or Responses stream.
fn named_events(body: &[u8]) -> Vec<(String, Value)> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter(|chunk| !chunk.is_empty())
        .map(|chunk| {
            let (name, data) = chunk.split_once('\n').unwrap();
            let name = name.strip_prefix("event: ").unwrap().to_string();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name.as_str(), "{data}");
            (name, data)
        })
        .collect()
}

#[actix_web::test]
async fn anthropic_events_over_http() {
    let outputs = vec![
        "Paris.".to_string(),
        "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>".to_string(),
    ];
    let state = state(outputs, false).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let body = json!({"model": "claude-haiku-4-5", "max_tokens": 16, "stream": true,
        "messages": [{"role": "user", "content": "Capital of France?"}]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/messages").set_json(body).to_request()).await;
    assert_eq!(response.headers().get("content-type").unwrap(), "text/event-stream");
    let events = named_events(&test::read_body(response).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[3].1["delta"], json!({"type": "text_delta", "text": "Paris."}));
    assert_eq!(events[5].1["delta"]["stop_reason"], "end_turn");
    assert!(events[5].1["usage"]["output_tokens"].as_u64().unwrap() > 0);

    // A tool call: a tool_use block whose input arrives as one JSON delta.
    let tools =
        json!([{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = json!({"max_tokens": 64, "stream": true, "tools": tools,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather?"}]}]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/messages").set_json(body).to_request()).await;
    let events = named_events(&test::read_body(response).await);
    let start =
        events.iter().find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use").unwrap();
    assert_eq!(start.1["content_block"]["name"], "weather");
    let delta = events.iter().find(|(n, _)| n == "content_block_delta").unwrap();
    assert_eq!(delta.1["delta"]["type"], "input_json_delta");
    let input: Value = serde_json::from_str(delta.1["delta"]["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(input, json!({"city": "Paris"}));
    let stop = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(stop.1["delta"]["stop_reason"], "tool_use");
    assert_eq!(state.metrics.time_to_first_token.get_sample_count(), 2);
}

#[actix_web::test]
async fn responses_events_over_http() {
    let outputs = vec![
        "Paris.".to_string(),
        "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>".to_string(),
    ];
    let state = state(outputs, false).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let body = json!({"input": "Capital of France?", "max_output_tokens": 16, "stream": true});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/responses").set_json(body).to_request()).await;
    let events = named_events(&test::read_body(response).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let numbers: Vec<u64> = events.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (0..names.len() as u64).collect::<Vec<_>>());
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], "Paris.");
    assert_eq!(done["status"], "completed");

    // A function call, as an output item with its call id (the follow-up
    // by previous_response_id runs against the real model in Python).
    let tools = json!([{"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = json!({"input": [{"role": "user", "content": "Weather?"}], "tools": tools});
    let first: Value =
        test::call_and_read_body_json(&app, test::TestRequest::post().uri("/v1/responses").set_json(body).to_request())
            .await;
    let call = &first["output"][0];
    assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("function_call"), Some("weather")));
    assert_eq!(state.metrics.time_to_first_token.get_sample_count(), 2);
}

/// The text of an error body in any surface's shape.
fn error_text(body: &Value) -> String {
    match &body["error"] {
        Value::String(text) => text.clone(),
        error => error["message"].as_str().unwrap_or_default().to_string(),
    }
}

#[actix_web::test]
async fn every_surface_names_a_bad_field_as_it_spells_it() {
    let state = state(vec![], false).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let user = json!([{"role": "user", "content": "x"}]);
    let stops: Vec<String> = (0..17).map(|n| n.to_string()).collect();
    let many: Vec<u32> = (0..1025).collect();
    let cases = [
        ("/api/chat", json!({"messages": user, "maxTokens": 0}), "'maxTokens' must be at least 1"),
        ("/v1/chat/completions", json!({"messages": user, "max_tokens": 0}), "'max_tokens' must be at least 1"),
        ("/v1/responses", json!({"input": "x", "max_output_tokens": 0}), "'max_output_tokens' must be at least 1"),
        ("/v1/responses", json!({"input": "x", "tools": [{"type": "function", "name": "a b"}]}), "tools[0].name 'a b'"),
        (
            "/v1/responses",
            json!({"input": "x", "text": {"format": {"type": "json_schema", "schema": "x"}}}),
            "text.format.schema must be a JSON Schema object",
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 8, "messages": user, "stop_sequences": stops}),
            "'stop_sequences' has 17",
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 8, "messages": user, "tools": [{"name": "w", "input_schema": "x"}]}),
            "tools[0].input_schema must be a JSON Schema object",
        ),
        ("/ollama/api/chat", json!({"messages": user, "options": {"temperature": 5}}), "'options.temperature' must be"),
        ("/ollama/api/chat", json!({"messages": user, "options": {"num_predict": 0}}), "'options.num_predict' must be"),
        ("/ollama/api/chat", json!({"messages": user, "format": {"enum": many}}), "format has an enum of 1025"),
    ];
    for (uri, body, expected) in cases {
        let response = test::call_service(&app, test::TestRequest::post().uri(uri).set_json(&body).to_request()).await;
        let status = response.status().as_u16();
        let error: Value = test::read_body_json(response).await;
        assert_eq!(status, 400, "{uri} {body} → {error}");
        let text = error_text(&error);
        assert!(text.contains(expected), "{uri} {body} → {text}");
    }
}

#[actix_web::test]
async fn the_tool_choice_header_holds_only_a_turns_first_round() {
    let call = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let backend =
        Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 8192, vec![call.into(), "Sunny.".into()]).unwrap());
    let state = state_with(backend.clone(), false).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let weather = json!({"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let first = json!({"input": "Weather in Paris?", "tools": [weather]});
    let request = test::TestRequest::post()
        .uri("/v1/responses")
        .insert_header((crate::http::stream::TOOL_CHOICE_HEADER, "weather"))
        .set_json(&first)
        .to_request();
    let reply: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(reply["output"][0]["type"], "function_call", "{reply}");
    assert_eq!(backend.forced_calls(), [true]);
    // The follow-up carries the call's result: the header no longer applies.
    let call_id = reply["output"][0]["call_id"].clone();
    let followup = json!({
        "input": [
            {"type": "message", "role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call_id, "name": "weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": call_id, "output": "Sunny"},
        ],
        "tools": [weather],
    });
    let request = test::TestRequest::post()
        .uri("/v1/responses")
        .insert_header((crate::http::stream::TOOL_CHOICE_HEADER, "weather"))
        .set_json(&followup)
        .to_request();
    let reply: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(reply["output"][0]["type"], "message", "{reply}");
    assert_eq!(backend.forced_calls(), [true, false]);
    // The Web UI's route reads it too: with no tools to choose from (no
    // skills, delegation off), a required call is refused before anything runs.
    let body = json!({"messages": [{"role": "user", "content": "x"}], "multiAgent": false});
    let request = test::TestRequest::post()
        .uri("/api/chat")
        .insert_header((crate::http::stream::TOOL_CHOICE_HEADER, "required"))
        .set_json(&body)
        .to_request();
    let response = test::call_service(&app, request).await;
    let status = response.status().as_u16();
    let error: Value = test::read_body_json(response).await;
    assert_eq!(status, 400, "{error}");
    assert!(error_text(&error).contains("required"), "{error}");
    assert_eq!(backend.forced_calls(), [true, false]);
    // A value the header cannot hold is refused with a sentence.
    let request = test::TestRequest::post()
        .uri("/v1/responses")
        .insert_header((crate::http::stream::TOOL_CHOICE_HEADER, " "))
        .set_json(&first)
        .to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status().as_u16(), 400);
    let error: Value = test::read_body_json(response).await;
    assert!(error_text(&error).contains("x-skillhost-tool-choice header must be"), "{error}");
}

#[actix_web::test]
async fn the_operators_temperature_and_budget_fill_in_only_for_requests_that_set_none() {
    // The scripted model streams seven bytes a token: a budget of one token
    // cuts "Unbounded." to "Unbound".
    let outputs = vec!["Unbounded.".to_string(), "Bounded.".to_string()];
    let backend = Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 8192, outputs).unwrap());
    let settings = LoopSettings { temperature: Some(0.0), max_tokens: Some(1), ..LoopSettings::default() };
    let app = test::init_service(
        App::new()
            .app_data(start(TestServer::on(backend.clone()).settings(settings), false).await)
            .configure(configure),
    )
    .await;
    let unset = json!({"input": "x"});
    let set = json!({"input": "x", "temperature": 1.5, "max_output_tokens": 8});
    let mut texts = Vec::new();
    for body in [unset, set] {
        let request = test::TestRequest::post().uri("/v1/responses").set_json(&body).to_request();
        let reply: Value = test::call_and_read_body_json(&app, request).await;
        texts.push(reply["output"][0]["content"][0]["text"].clone());
    }
    assert_eq!(backend.temperatures(), [0.0, 1.5]);
    assert_eq!(texts, ["Unbound", "Bounded."]);
}

/// A model that reads the `notes` skill, then answers from it.
fn skill_round_trip() -> Vec<String> {
    vec![
        "<tool_call>\n{\"name\": \"skills_read\", \"arguments\": {\"skill\": \"notes\"}}\n</tool_call>".to_string(),
        "2026-11-30\nDecisions: none.\nNOTE-7".to_string(),
    ]
}

#[actix_web::test]
async fn a_skills_request_on_the_responses_and_messages_routes_runs_its_rounds_in_the_server() {
    for (uri, body) in [
        ("/v1/responses", json!({"input": "Write the meeting notes.", "skills": ["notes"], "stream": true})),
        (
            "/v1/messages",
            json!({"max_tokens": 200, "messages": [{"role": "user", "content": "Write the meeting notes."}],
                "skills": ["notes"], "stream": true}),
        ),
    ] {
        let backend = Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 8192, skill_round_trip()).unwrap());
        let state = state_with(backend.clone(), true).await;
        let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
        let response = test::call_service(&app, test::TestRequest::post().uri(uri).set_json(&body).to_request()).await;
        assert_eq!(response.status().as_u16(), 200, "{uri}");
        let events = named_events(&test::read_body(response).await);
        // The skill round ran in the server: its body reached the second prompt.
        let prompts = backend.prompts();
        assert_eq!(prompts.len(), 2, "{uri}");
        assert!(!prompts[0].contains("the marker NOTE-7") && prompts[1].contains("the marker NOTE-7"), "{uri}");
        // The client sees the final answer only: no call to skills_read.
        let text: String = events
            .iter()
            .filter_map(|(_, data)| data["delta"].as_str().or_else(|| data["delta"]["text"].as_str()))
            .collect();
        assert!(text.ends_with("2026-11-30\nDecisions: none.\nNOTE-7"), "{uri}: {text:?}");
        let everything = format!("{events:?}");
        assert!(!everything.contains("skills_read") && !everything.contains("tool_use"), "{uri}: {everything}");
        assert!(!everything.contains("function_call"), "{uri}: {everything}");
        assert_eq!(state.metrics.skill_steps.with_label_values(&["skills_read", "true"]).get(), 1, "{uri}");
    }
}

#[actix_web::test]
async fn a_tool_namespace_is_offered_under_qualified_names_and_answered_in_its_own_terms() {
    let call = "<tool_call>\n{\"name\": \"crm__lookup\", \"arguments\": {\"id\": \"7\"}}\n</tool_call>";
    let backend =
        Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 8192, vec![call.into(), "Found.".into()]).unwrap());
    let app =
        test::init_service(App::new().app_data(state_with(backend.clone(), false).await).configure(configure)).await;
    let lookup = json!({"type": "function", "name": "lookup", "description": "Find a customer.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}});
    let tools =
        json!([{"type": "namespace", "name": "crm", "description": "The customer records.", "tools": [lookup]}]);
    let first = json!({"input": "Who is customer 7?", "tools": tools, "tool_choice": "required"});
    let request = test::TestRequest::post().uri("/v1/responses").set_json(&first).to_request();
    let reply: Value = test::call_and_read_body_json(&app, request).await;
    let item = &reply["output"][0];
    assert_eq!(
        (item["type"].as_str(), item["name"].as_str(), item["namespace"].as_str()),
        (Some("function_call"), Some("lookup"), Some("crm")),
        "{reply}"
    );
    assert!(backend.prompts()[0].contains("crm__lookup"));
    // The client answers the call as it was given: by namespace and name.
    let followup = json!({
        "input": [
            {"type": "message", "role": "user", "content": "Who is customer 7?"},
            {"type": "function_call", "call_id": item["call_id"], "namespace": "crm", "name": "lookup", "arguments": "{\"id\": \"7\"}"},
            {"type": "function_call_output", "call_id": item["call_id"], "output": "Ada"},
        ],
        "tools": tools,
    });
    let request = test::TestRequest::post().uri("/v1/responses").set_json(&followup).to_request();
    let reply: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(reply["output"][0]["content"][0]["text"], "Found.", "{reply}");
    let prompt = &backend.prompts()[1];
    assert!(prompt.contains("crm__lookup") && prompt.contains("Ada"), "{prompt}");
    // Bad namespaces are refused, naming the path inside them.
    let cases = [
        (json!([{"type": "namespace", "tools": []}]), "'tools[0]' (namespace) needs a 'name'"),
        (json!([{"type": "namespace", "name": "crm"}]), "needs a list of 'tools'"),
        (
            json!([{"type": "namespace", "name": "crm", "tools": [{"type": "custom", "name": "x"}]}]),
            "'tools[0].tools[0]' is a 'custom' tool",
        ),
        (json!([{"type": "namespace", "name": "c".repeat(60), "tools": [lookup]}]), "which must be 1 to 64"),
        (
            json!([{"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "f", "parameters": 3}]}]),
            "tools[0].tools[0].parameters must be a JSON Schema object",
        ),
    ];
    for (tools, expected) in cases {
        let body = json!({"input": "x", "tools": tools});
        let response =
            test::call_service(&app, test::TestRequest::post().uri("/v1/responses").set_json(&body).to_request()).await;
        assert_eq!(response.status().as_u16(), 400, "{body}");
        let error: Value = test::read_body_json(response).await;
        assert!(error_text(&error).contains(expected), "{body} → {error}");
    }
}

#[actix_web::test]
async fn a_responses_stream_that_fails_midway_ends_with_error_and_response_failed() {
    // Round 2 has no scripted output: the engine fails after the stream started.
    let outputs = skill_round_trip().into_iter().take(1).collect();
    let backend = Arc::new(ScriptedBackend::new(Some(CHATML), "llama", 8192, outputs).unwrap());
    let app = test::init_service(App::new().app_data(state_with(backend, true).await).configure(configure)).await;
    let body = json!({"input": "Write the meeting notes.", "skills": ["notes"], "stream": true});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/responses").set_json(body).to_request()).await;
    assert_eq!(response.status().as_u16(), 200);
    let events = named_events(&test::read_body(response).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[names.len() - 2..], ["error", "response.failed"], "{names:?}");
    let numbers: Vec<u64> = events.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (0..names.len() as u64).collect::<Vec<_>>());
    let failed = &events.last().unwrap().1["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "server_error");
    assert!(failed["error"]["message"].as_str().unwrap().contains("no more outputs"), "{failed}");
}
