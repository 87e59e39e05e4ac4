//! HTTP tests over the app as `main` builds it, with the real default model.

use actix_web::{test, web, App};
use serde_json::{json, Value};

use crate::http::body::MAX_JSON_BODY_BYTES;
use crate::http::test_server::TestServer;
use crate::http::{configure, AppState};

async fn state(n_ctx: u32) -> web::Data<AppState> {
    let running = TestServer::real_model(n_ctx, 2).start().await;
    running.unwrap_or_else(|err| panic!("{err}")).state
}

fn france(stream: bool) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}
        ],
        "temperature": 0,
        "max_tokens": 48,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// Parses an SSE body into its `data:` payloads.
fn sse_events(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: ").map(str::to_string))
        .collect()
}

fn parse(text: &str) -> Value {
    match serde_json::from_str(text) {
        Ok(v) => v,
        Err(err) => panic!("not JSON ({err}): {text}"),
    }
}

#[actix_web::test]
async fn answers_paris_and_the_stream_equals_the_non_streamed_answer() {
    let state = state(4096).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;

    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(france(false)).to_request();
    let response: Value = test::call_and_read_body_json(&app, request).await;
    let content = response["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
    assert!(content.contains("Paris"), "answer: {response}");
    assert_eq!(response["choices"][0]["finish_reason"], "stop");
    assert_eq!(response["object"], "chat.completion");

    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(france(true)).to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("text/event-stream"));
    let events = sse_events(&test::read_body(response).await);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| parse(e)).collect();
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, content, "the stream differs from the non-streamed answer");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let finish: Vec<&Value> = chunks.iter().filter(|c| !c["choices"][0]["finish_reason"].is_null()).collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "stop");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["completion_tokens"].as_u64().is_some_and(|n| n > 0), "{usage}");
}

#[actix_web::test]
async fn second_turn_reuses_the_first_turns_kv_prefix() {
    let state = state(4096).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let system = json!({"role": "system", "content": "You are a helpful assistant."});
    let question = json!({"role": "user", "content": "Name three colors of the rainbow."});
    let first = json!({"messages": [system, question], "temperature": 0, "max_tokens": 64});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(first).to_request();
    let first: Value = test::call_and_read_body_json(&app, request).await;
    let answer = first["choices"][0]["message"]["content"].clone();
    let previous = first["usage"]["total_tokens"].as_u64().unwrap_or(0);

    let second = json!({
        "messages": [system, question, {"role": "assistant", "content": answer}, {"role": "user", "content": "And two more?"}],
        "temperature": 0,
        "max_tokens": 16,
    });
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(second).to_request();
    let second: Value = test::call_and_read_body_json(&app, request).await;
    let cached = second["timings"]["cache_n"].as_u64().unwrap_or(0);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(cached));
    assert!(
        cached > 0 && cached * 10 >= previous * 9,
        "the second turn reused {cached} tokens of the first turn's {previous}: {second}"
    );
}

/// One bad request and what must come back.
struct Bad {
    method: &'static str,
    uri: &'static str,
    body: Vec<u8>,
    status: u16,
    message: &'static str,
}

fn bad(method: &'static str, uri: &'static str, body: impl Into<Vec<u8>>, status: u16, message: &'static str) -> Bad {
    Bad { method, uri, body: body.into(), status, message }
}

#[actix_web::test]
async fn bad_input_gets_a_4xx_with_a_sentence() {
    // A small context so an ordinary message can overflow it.
    let state = state(256).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let user = json!([{"role": "user", "content": "hi"}]);
    let json = |v: Value| v.to_string().into_bytes();
    let oversized = {
        let mut body = json!({"messages": user}).to_string().into_bytes();
        body.resize(MAX_JSON_BODY_BYTES + 1, b' ');
        body
    };
    // The schema bomb that used to overflow the engine thread's stack and
    // kill the process: 20,000 optional properties.
    let bomb: serde_json::Map<String, Value> =
        (0..20_000).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
    let bomb = json!({"type": "object", "properties": bomb});
    // 2,500 fit the byte bound but stalled decoding for a minute.
    let stall: serde_json::Map<String, Value> =
        (0..2_500).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
    let stall = json!({"type": "object", "properties": stall});
    // A body nested past serde_json's recursion limit, inside a field that
    // takes any JSON (a tool's parameters), where nothing stops it early.
    let deep = format!(
        "{{\"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}], \"tools\": [{{\"type\": \"function\", \"function\": {{\"name\": \"t\", \"parameters\": {}1{}}}}}]}}",
        "{\"a\": ".repeat(10_000),
        "}".repeat(10_000)
    );
    let cases = vec![
        bad(
            "POST",
            "/v1/chat/completions",
            json(
                json!({"messages": user, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bomb}}}),
            ),
            400,
            "response_format.json_schema.schema is 528922 bytes; a schema may have at most 262144",
        ),
        bad(
            "POST",
            "/v1/chat/completions",
            json(
                json!({"messages": user, "tools": [{"type": "function", "function": {"name": "t", "parameters": stall}}]}),
            ),
            400,
            "tools[0].function.parameters has 2500 properties in one object; at most 128 are allowed",
        ),
        bad("POST", "/v1/chat/completions", deep.into_bytes(), 400, "recursion limit exceeded"),
        bad("POST", "/v1/chat/completions", "{\"messages\": [", 400, "the request body is not valid JSON"),
        bad("POST", "/v1/chat/completions", "", 400, "the request body is empty"),
        bad(
            "POST",
            "/v1/chat/completions",
            json(json!({"messages": "hi"})),
            400,
            "'messages' is invalid: invalid type: string",
        ),
        bad(
            "POST",
            "/v1/chat/completions",
            json(json!({"messages": user, "temperature": "hot"})),
            400,
            "'temperature' is invalid",
        ),
        bad(
            "POST",
            "/v1/chat/completions",
            json(json!({"messages": user, "max_tokens": -1})),
            400,
            "'max_tokens' is invalid",
        ),
        bad(
            "POST",
            "/v1/chat/completions",
            json(json!({"messages": []})),
            400,
            "'messages' must contain at least one message",
        ),
        bad(
            "POST",
            "/v1/chat/completions",
            json(json!({"model": "gpt-4o", "messages": user})),
            404,
            "the model 'gpt-4o' is not served here",
        ),
        bad(
            "POST",
            "/v1/chat/completions",
            json(json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]})),
            400,
            "but the context holds 256 tokens",
        ),
        bad("POST", "/v1/chat/completions", json(json!({"messages": user, "multi_agent": "no"})), 400, "multi_agent"),
        bad("POST", "/v1/chat/completions", oversized, 413, "larger than the limit of 8388608 bytes"),
        bad(
            "POST",
            "/v1/chat/completions",
            json(
                json!({"messages": user, "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [{"type": "function", "function": {"name": "real"}}]}),
            ),
            400,
            "tool_choice names the tool 'nope'",
        ),
        bad(
            "POST",
            "/v1/chat/completions",
            json(
                // Without the coordination tools' declarations, so the
                // prompt fits the small context and the grammar is reached.
                json!({"messages": user, "multi_agent": false, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/missing"}}}}),
            ),
            400,
            "cannot be turned into a grammar",
        ),
        bad("GET", "/v1/chat/completions", "", 405, "/v1/chat/completions does not accept GET"),
        bad("GET", "/v1/nothing", "", 404, "there is no route GET /v1/nothing"),
        bad("GET", "/nothing", "", 404, "there is no route GET /nothing"),
    ];
    for case in cases {
        let request = test::TestRequest::default()
            .method(case.method.parse().unwrap_or_default())
            .uri(case.uri)
            .insert_header(("content-type", "application/json"))
            .set_payload(case.body)
            .to_request();
        let response = test::call_service(&app, request).await;
        let status = response.status().as_u16();
        let body: Value = match serde_json::from_slice(&test::read_body(response).await) {
            Ok(v) => v,
            Err(err) => panic!("{} {}: the error body is not JSON: {err}", case.method, case.uri),
        };
        let message = if case.uri.starts_with("/v1/") {
            assert!(body["error"]["type"].as_str().is_some(), "{body}");
            body["error"]["message"].as_str().unwrap_or_default().to_string()
        } else {
            body["error"].as_str().unwrap_or_default().to_string()
        };
        assert_eq!(status, case.status, "{} {} answered {body}", case.method, case.uri);
        assert!(
            message.contains(case.message),
            "{} {}: {message:?} does not contain {:?}",
            case.method,
            case.uri,
            case.message
        );
    }

    // After all of that, including the bombs, the server still serves. A
    // body of exactly the limit is read (and then served).
    let mut at_limit = json!({"messages": user, "max_tokens": 1, "multi_agent": false}).to_string().into_bytes();
    at_limit.resize(MAX_JSON_BODY_BYTES, b' ');
    let request = test::TestRequest::post()
        .uri("/v1/chat/completions")
        .insert_header(("content-type", "application/json"))
        .set_payload(at_limit)
        .to_request();
    assert_eq!(test::call_service(&app, request).await.status().as_u16(), 200);
}

#[actix_web::test]
async fn health_models_and_metrics() {
    let state = state(2048).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let response: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/health").to_request()).await;
    assert_eq!(response, json!({"status": "ok"}));
    let models: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/v1/models").to_request()).await;
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(models["data"][0]["context_length"], 2048);

    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(france(false)).to_request();
    let _: Value = test::call_and_read_body_json(&app, request).await;
    let metrics =
        test::read_body(test::call_service(&app, test::TestRequest::get().uri("/metrics").to_request()).await).await;
    let metrics = String::from_utf8_lossy(&metrics);
    for line in [
        "skillhost_requests_total{api=\"openai\"} 1",
        "skillhost_model_ready 1",
        "skillhost_time_to_first_token_seconds_count 1",
        "skillhost_active_slots 0",
    ] {
        assert!(metrics.contains(line), "/metrics lacks {line:?}:\n{metrics}");
    }
    assert!(metrics.contains("skillhost_generated_tokens_total"), "{metrics}");
}

#[actix_web::test]
async fn a_skills_request_reads_in_round_one_and_answers_in_round_two_on_the_real_model_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let skill = dir.path().join("greeting");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: greeting\ndescription: How to greet visitors. Use when asked to greet someone.\n---\nGreet with the words: Welcome aboard.\n",
    )
    .unwrap();
    let state = TestServer::real_model(4096, 1).skills_root(dir.path()).start().await.unwrap().state;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    // Round 1 is held to a skills_read call by the grammar (the default
    // model's template cannot declare tools, so this is the generic mode).
    let body = json!({
        "messages": [{"role": "user", "content": "Greet the new visitor."}],
        "skills": ["greeting"],
        "tool_choice": {"type": "function", "function": {"name": "skills_read"}},
        "parallel_tool_calls": false,
        "temperature": 0,
        "max_tokens": 48,
        // The budget is sized for the skill call and a short answer.
        "multi_agent": false,
    });
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let response: Value = test::call_and_read_body_json(&app, request).await;
    let rounds = response["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{response}");
    let (first, second) = (&rounds[0], &rounds[1]);
    let n = |v: &Value, key: &str| v[key].as_u64().unwrap();
    assert!(n(first, "generated_tokens") > 0);
    // Round 2 repeats round 1's prompt and the model's own tokens byte for
    // byte, so all of it comes from the KV cache (the end token was never
    // decoded; up to 16 trailing tokens may be rewound).
    let previous = n(first, "prompt_tokens") + n(first, "generated_tokens");
    assert!(
        n(second, "cached_tokens") + 16 >= previous,
        "round 2 reused {} of {previous}: {response}",
        n(second, "cached_tokens")
    );
    assert!(["stop", "length"].contains(&response["choices"][0]["finish_reason"].as_str().unwrap()), "{response}");
    let content = response["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(!content.contains("<tool_call>"), "tool markup reached the client: {content}");

    // The same on the Responses and Messages routes: the skill round runs
    // in the server and the client gets an answer, not the skill call.
    let responses = json!({
        "input": "Greet the new visitor.",
        "skills": ["greeting"],
        "tool_choice": {"type": "function", "name": "skills_read"},
        "parallel_tool_calls": false,
        "temperature": 0,
        "max_output_tokens": 160,
    });
    let messages = json!({
        "messages": [{"role": "user", "content": "Greet the new visitor."}],
        "skills": ["greeting"],
        "tool_choice": {"type": "tool", "name": "skills_read", "disable_parallel_tool_use": true},
        "temperature": 0,
        "max_tokens": 160,
    });
    for (uri, body) in [("/v1/responses", responses), ("/v1/messages", messages)] {
        let request = test::TestRequest::post().uri(uri).set_json(body).to_request();
        let response: Value = test::call_and_read_body_json(&app, request).await;
        let items = response.get("output").or_else(|| response.get("content")).unwrap().as_array().unwrap();
        assert!(!items.is_empty(), "{uri}: {response}");
        for item in items {
            assert!(["message", "text"].contains(&item["type"].as_str().unwrap()), "{uri}: {response}");
        }
        assert!(!response.to_string().contains("<tool_call>"), "tool markup reached the client: {response}");
    }
    let metrics = String::from_utf8_lossy(
        &test::read_body(test::call_service(&app, test::TestRequest::get().uri("/metrics").to_request()).await).await,
    )
    .to_string();
    assert!(metrics.contains("skillhost_skill_tool_calls_total{ok=\"true\",tool=\"skills_read\"} 3"), "{metrics}");
}
