//! The Responses API's stored responses with the scripted model: what is
//! stored and read back whole, what a follow-up's prompt continues from
//! (by `previous_response_id`, by `item_reference`, after a restart), the
//! input items' pages at their limits, another caller's ids, and the
//! fields the response object repeats of its request.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use actix_web::dev::{Service, ServiceResponse};
use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::model::scripted::{ScriptedBackend, ScriptedOutput};

use crate::config::AccessConfig;
use crate::http::responses::{DEFAULT_ITEMS_PAGE, MAX_ITEMS_PAGE};
use crate::http::test_server::TestServer;
use crate::http::{configure, AppState};
use crate::setup::StartupError;

async fn started(server: TestServer) -> (web::Data<AppState>, Arc<ScriptedBackend>) {
    let running = server.start().await.unwrap();
    (running.state, running.backend.unwrap())
}

pub(super) async fn send(
    app: &impl Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
    request: test::TestRequest,
) -> (u16, Value) {
    let response = test::call_service(app, request.to_request()).await;
    let status = response.status().as_u16();
    let body = test::read_body(response).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn post(body: Value) -> test::TestRequest {
    test::TestRequest::post().uri("/v1/responses").set_json(body)
}

pub(super) fn get(uri: &str) -> test::TestRequest {
    test::TestRequest::get().uri(uri)
}

pub(super) fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

#[actix_web::test]
async fn a_stored_response_is_read_back_whole_continued_and_deleted() {
    let (state, backend) = started(TestServer::scripted(["Paris.", "Rome.", "Again Paris."])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let (status, first) = send(&app, post(json!({"input": "Capital of France?"}))).await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let (status, read) = send(&app, get(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 200);
    pretty_assertions::assert_eq!(read, first, "what was answered is what is stored");

    let (_, items) = send(&app, get(&format!("/v1/responses/{id}/input_items"))).await;
    let item = &items["data"][0];
    assert_eq!((item["type"].as_str(), item["role"].as_str()), (Some("message"), Some("user")));
    assert_eq!(item["content"], json!([{"type": "input_text", "text": "Capital of France?"}]));
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));

    // A follow-up's prompt holds the turn before it.
    let (status, second) = send(&app, post(json!({"previous_response_id": id, "input": "And Italy?"}))).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["previous_response_id"], id.as_str());
    let prompt = backend.prompts().last().cloned().unwrap();
    assert!(prompt.contains("Capital of France?") && prompt.contains("Paris.") && prompt.contains("And Italy?"));

    // An item reference brings back the stored item of that id.
    let answer_id = first["output"][0]["id"].as_str().unwrap();
    let input = json!([{"type": "item_reference", "id": answer_id}, {"role": "user", "content": "Say it again."}]);
    let (status, third) = send(&app, post(json!({"input": input}))).await;
    assert_eq!(status, 200, "{third}");
    let prompt = backend.prompts().last().cloned().unwrap();
    assert!(prompt.contains("Paris.") && !prompt.contains("And Italy?"), "{prompt}");
    let third_id = third["id"].as_str().unwrap();
    let (_, items) = send(&app, get(&format!("/v1/responses/{third_id}/input_items?order=asc"))).await;
    assert_eq!(items["data"][0], first["output"][0]);

    let (status, body) = send(&app, test::TestRequest::post().uri(&format!("/v1/responses/{id}/cancel"))).await;
    assert_eq!(status, 400);
    assert!(message(&body).ends_with("only a background response can be cancelled"), "{body}");

    let (status, deleted) = send(&app, test::TestRequest::delete().uri(&format!("/v1/responses/{id}"))).await;
    assert_eq!((status, deleted), (200, json!({"id": id, "object": "response", "deleted": true})));
    let (status, gone) = send(&app, get(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 404);
    assert_eq!(message(&gone), format!("no stored response has the id '{id}'"));
    let (status, _) = send(&app, test::TestRequest::delete().uri(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 404);
}

#[actix_web::test]
async fn input_items_come_a_page_at_a_time_within_the_limits() {
    let (state, _) = started(TestServer::scripted(["ok"])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let count = MAX_ITEMS_PAGE + 1;
    let input: Vec<Value> = (0..count).map(|n| json!({"role": "user", "content": format!("m{n}")})).collect();
    let (_, made) = send(&app, post(json!({"input": input}))).await;
    let id = made["id"].as_str().unwrap();
    let texts = |page: &Value| -> Vec<String> {
        page["data"].as_array().unwrap().iter().map(|i| i["content"][0]["text"].as_str().unwrap().into()).collect()
    };
    let uri = |query: &str| format!("/v1/responses/{id}/input_items?{query}");
    // Newest first and DEFAULT_ITEMS_PAGE of them by default.
    let (_, page) = send(&app, get(&uri(""))).await;
    assert_eq!(texts(&page).len(), DEFAULT_ITEMS_PAGE);
    assert_eq!(texts(&page)[0], format!("m{}", count - 1));
    assert_eq!(page["has_more"], true);
    // The largest page holds all but one; the cursor brings the last.
    let (_, page) = send(&app, get(&uri(&format!("order=asc&limit={MAX_ITEMS_PAGE}")))).await;
    assert_eq!(texts(&page).len(), MAX_ITEMS_PAGE);
    assert_eq!((page["has_more"].as_bool(), texts(&page)[0].as_str()), (Some(true), "m0"));
    let last = page["last_id"].as_str().unwrap();
    let (_, rest) = send(&app, get(&uri(&format!("order=asc&limit={MAX_ITEMS_PAGE}&after={last}")))).await;
    assert_eq!(texts(&rest), [format!("m{MAX_ITEMS_PAGE}")]);
    assert_eq!(rest["has_more"], false);
    assert_eq!(rest["first_id"], rest["last_id"]);
    for (query, said) in [
        (format!("limit={}", MAX_ITEMS_PAGE + 1), "'limit' must be between 1 and 100, got 101".to_string()),
        ("limit=0".into(), "'limit' must be between 1 and 100, got 0".into()),
        ("limit=many".into(), "'limit' must be a whole number, got 'many'".into()),
        ("order=sideways".into(), "'order' must be asc or desc, got 'sideways'".into()),
        (
            "after=msg_nothing".into(),
            format!("'after' names the item 'msg_nothing', which is not an input item of {id}"),
        ),
        ("colour=red".into(), "the query parameter 'colour' is not one this route takes".into()),
    ] {
        let (status, body) = send(&app, get(&uri(&query))).await;
        assert_eq!(status, 400, "{query}");
        assert!(message(&body).starts_with(&said), "{query}: {body}");
    }
    let (status, body) = send(&app, get("/v1/responses/resp_nothing/input_items")).await;
    assert_eq!((status, message(&body)), (404, "no stored response has the id 'resp_nothing'"));
}

#[actix_web::test]
async fn store_false_keeps_nothing_and_unknown_ids_are_named() {
    let (state, _) = started(TestServer::scripted(["one", "two"])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let (_, made) = send(&app, post(json!({"input": "x", "store": false}))).await;
    assert_eq!(made["store"], false);
    let id = made["id"].as_str().unwrap();
    let (status, _) = send(&app, get(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 404);
    let (status, body) = send(&app, post(json!({"input": "y", "previous_response_id": id}))).await;
    assert_eq!(status, 400);
    assert!(message(&body).starts_with(&format!("no stored response has the id '{id}'")), "{body}");
    let input = json!([{"type": "item_reference", "id": "msg_nowhere"}]);
    let (status, body) = send(&app, post(json!({"input": input}))).await;
    assert_eq!(status, 400);
    assert_eq!(message(&body), "'input[0]' refers to the item 'msg_nowhere', which no stored response of yours holds");
    assert_eq!(body["error"]["param"], "input[0]");
}

#[actix_web::test]
async fn another_callers_responses_and_items_are_unknown_to_it() {
    let access = AccessConfig { api_keys: vec!["key-a".into(), "key-b".into()], ..AccessConfig::default() };
    let server = TestServer::scripted(["mine", "theirs"]).keys(access, IpAddr::V4(Ipv4Addr::LOCALHOST));
    let (state, backend) = started(server).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let as_a = |request: test::TestRequest| request.insert_header(("authorization", "Bearer key-a"));
    let as_b = |request: test::TestRequest| request.insert_header(("authorization", "Bearer key-b"));
    let (status, made) = send(&app, as_a(post(json!({"input": "a secret"})))).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap();
    let item = made["output"][0]["id"].as_str().unwrap();
    for uri in [format!("/v1/responses/{id}"), format!("/v1/responses/{id}/input_items")] {
        let (status, body) = send(&app, as_b(get(&uri))).await;
        assert_eq!((status, message(&body)), (404, format!("no stored response has the id '{id}'").as_str()));
    }
    let (status, _) = send(&app, as_b(test::TestRequest::delete().uri(&format!("/v1/responses/{id}")))).await;
    assert_eq!(status, 404);
    let (status, _) = send(&app, as_b(post(json!({"input": "go on", "previous_response_id": id})))).await;
    assert_eq!(status, 400);
    let input = json!([{"type": "item_reference", "id": item}]);
    let (status, _) = send(&app, as_b(post(json!({"input": input})))).await;
    assert_eq!(status, 400);
    // Nothing of the secret reached the model for the other caller, and
    // the owner still has all of it.
    assert_eq!(backend.prompts().len(), 1);
    let (status, _) = send(&app, as_a(get(&format!("/v1/responses/{id}")))).await;
    assert_eq!(status, 200);
}

#[actix_web::test]
async fn stored_responses_outlive_the_server_and_a_second_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (first, id) = {
        let (state, _) = started(TestServer::scripted(["Paris."]).state_dir(dir.path())).await;
        let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
        let (_, made) = send(&app, post(json!({"input": "Capital of France?"}))).await;
        // While it runs, the folder is taken.
        let err = TestServer::scripted(["x"]).state_dir(dir.path()).start().await.err().unwrap();
        assert!(matches!(err, StartupError::Store(_)), "{err}");
        assert!(err.to_string().contains("in use by another skillhost process"), "{err}");
        let id = made["id"].as_str().unwrap().to_string();
        (made, id)
    };
    let (state, backend) = started(TestServer::scripted(["Rome."]).state_dir(dir.path())).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let (status, read) = send(&app, get(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 200);
    assert_eq!(read, first);
    let (status, _) = send(&app, post(json!({"input": "And Italy?", "previous_response_id": id}))).await;
    assert_eq!(status, 200);
    let prompt = backend.prompts().last().cloned().unwrap();
    assert!(prompt.contains("Capital of France?") && prompt.contains("Paris."), "{prompt}");
}

/// What the Open Responses specification requires of every response object.
const REQUIRED: [&str; 31] = [
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "background",
    "error",
    "incomplete_details",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "model",
    "output",
    "parallel_tool_calls",
    "previous_response_id",
    "reasoning",
    "store",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "text",
    "tool_choice",
    "tools",
    "truncation",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "metadata",
    "usage",
];

#[actix_web::test]
async fn the_response_repeats_what_its_request_set() {
    let (state, _) = started(TestServer::scripted(["Sunny.", "Sunny."])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let tools = json!([{"type": "function", "name": "weather", "description": "The weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = json!({
        "input": "Weather?", "instructions": "Be brief.", "tools": tools, "tool_choice": "none",
        "temperature": 0.5, "top_p": 0.9, "presence_penalty": 0.25, "frequency_penalty": 0.5,
        "max_output_tokens": 16, "metadata": {"ticket": "7"}, "prompt_cache_key": "k-1",
        "safety_identifier": "user-9", "reasoning": {"effort": "low"}, "truncation": "auto",
        "text": {"format": {"type": "text"}, "verbosity": "low"}, "parallel_tool_calls": false,
    });
    let (status, response) = send(&app, post(body.clone())).await;
    assert_eq!(status, 200, "{response}");
    for field in REQUIRED {
        assert!(response.get(field).is_some(), "no '{field}' in {response}");
    }
    for field in [
        "instructions",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "max_output_tokens",
        "metadata",
        "prompt_cache_key",
        "safety_identifier",
        "truncation",
        "text",
        "parallel_tool_calls",
    ] {
        assert_eq!(response[field], body[field], "{field}");
    }
    assert_eq!(response["reasoning"], json!({"effort": "low", "summary": null}));
    assert_eq!((response["status"].as_str(), response["background"].as_bool()), (Some("completed"), Some(false)));
    assert!(response["completed_at"].as_u64().unwrap() >= response["created_at"].as_u64().unwrap());
    // The stream's first events carry the same object, still in progress.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let response = test::call_service(&app, post(streamed).to_request()).await;
    let text = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    let created: Value = serde_json::from_str(
        text.split("\n\n").next().unwrap().lines().find_map(|l| l.strip_prefix("data: ")).unwrap(),
    )
    .unwrap();
    assert_eq!(created["type"], "response.created");
    let object = &created["response"];
    for field in REQUIRED {
        assert!(object.get(field).is_some(), "no '{field}' in response.created");
    }
    assert_eq!((object["status"].as_str(), object["completed_at"].as_null()), (Some("in_progress"), Some(())));
    assert_eq!(object["tool_choice"], "none");
}

#[actix_web::test]
async fn a_request_shaped_as_codex_sends_it_is_answered() {
    // The fields Codex 0.x puts on every turn, `client_metadata` among them.
    let (state, _) = started(TestServer::scripted(["Done."])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let body = json!({
        "model": "scripted", "instructions": "You are Codex.", "tools": [], "tool_choice": "auto",
        "parallel_tool_calls": false, "reasoning": null, "store": false, "stream": false,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "019a-thread",
        "text": {"verbosity": "low"},
        "client_metadata": {"x-codex-turn-id": "019a-turn", "x-codex-session-source": "exec"},
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}],
    });
    let (status, response) = send(&app, post(body)).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["output"][0]["content"][0]["text"], "Done.");
    let (status, answer) = send(&app, post(json!({"input": "x", "client_metadata": "a string"}))).await;
    assert_eq!(status, 400);
    assert!(message(&answer).contains("client_metadata"), "{answer}");
}

#[actix_web::test]
async fn a_budget_cut_answer_is_incomplete_inside_and_out() {
    let long = "one two three four five six seven eight nine ten eleven twelve";
    let (state, _) = started(TestServer::scripted([long])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let (_, response) = send(&app, post(json!({"input": "Count.", "max_output_tokens": 2}))).await;
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(response["output"][0]["status"], "incomplete");
}

#[actix_web::test]
async fn fields_it_cannot_honour_or_does_not_know_are_400s_naming_them() {
    let (state, backend) = started(TestServer::scripted(Vec::<String>::new())).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    for (extra, said) in [
        (json!({"frobnicate": 1}), "unknown field `frobnicate`"),
        (json!({"prompt": {"id": "pmpt_1"}}), "'prompt' names a prompt template"),
        (json!({"max_tool_calls": 3}), "'max_tool_calls' is not supported"),
        (json!({"top_logprobs": 2}), "'top_logprobs' must be 0"),
        (json!({"truncation": "sometimes"}), "'truncation' must be auto or disabled, got 'sometimes'"),
    ] {
        let mut body = json!({"input": "x"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, answer) = send(&app, post(body)).await;
        assert_eq!(status, 400, "{extra}");
        assert!(message(&answer).contains(said), "{extra}: {answer}");
    }
    // `background: false`, `top_logprobs: 0` and the rest of OpenAI's
    // fields are fine; none of the refused requests reached the model.
    assert!(backend.prompts().is_empty());
    let (status, body) = send(&app, get("/v1/responses/resp_x?stream=true")).await;
    assert_eq!((status, message(&body)), (404, "no stored response has the id 'resp_x'"));
}

/// An output the scripted model starts only after an hour: a turn that
/// runs until something stops it.
fn endless() -> ScriptedOutput {
    ScriptedOutput { delay: std::time::Duration::from_secs(3600), ..ScriptedOutput::from("never") }
}

/// Polls `id` until its status is no longer `in_progress`.
async fn settled(
    app: &impl Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
    id: &str,
) -> Value {
    loop {
        let (status, response) = send(app, get(&format!("/v1/responses/{id}"))).await;
        assert_eq!(status, 200, "{response}");
        if response["status"] != "in_progress" {
            return response;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[actix_web::test]
async fn a_background_response_runs_on_is_polled_and_cancelled() {
    let outputs = vec![ScriptedOutput::from("Done."), endless(), endless(), endless(), endless()];
    let (state, _) = started(TestServer::scripted(outputs).max_detached_turns(2)).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let (status, accepted) = send(&app, post(json!({"input": "Go.", "background": true}))).await;
    assert_eq!(status, 200, "{accepted}");
    assert_eq!((accepted["status"].as_str(), accepted["background"].as_bool()), (Some("in_progress"), Some(true)));
    let id = accepted["id"].as_str().unwrap();
    let done = settled(&app, id).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "Done.");
    assert_eq!(done["background"], true);

    // A running one stops on cancel, and stays cancelled.
    let (_, running) = send(&app, post(json!({"input": "Go on.", "background": true}))).await;
    let running = running["id"].as_str().unwrap().to_string();
    let cancel = |id: &str| test::TestRequest::post().uri(&format!("/v1/responses/{id}/cancel"));
    let (status, cancelled) = send(&app, cancel(&running)).await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")));
    assert_eq!(settled(&app, &running).await["status"], "cancelled");
    let (status, again) = send(&app, cancel(&running)).await;
    assert_eq!((status, again["status"].as_str()), (200, Some("cancelled")));

    // At the cap both run; one past it stops the oldest, with a sentence.
    let (_, first) = send(&app, post(json!({"input": "One.", "background": true}))).await;
    let (_, second) = send(&app, post(json!({"input": "Two.", "background": true}))).await;
    assert_eq!(state.background.len(), 2);
    let (status, third) = send(&app, post(json!({"input": "Three.", "background": true}))).await;
    assert_eq!(status, 200, "{third}");
    let first = settled(&app, first["id"].as_str().unwrap()).await;
    assert_eq!(first["status"], "cancelled");
    assert!(
        first["error"]["message"].as_str().unwrap().contains("more than 2 turns were running with no client attached"),
        "{first}"
    );
    assert_eq!(state.background.len(), 2);
    for running in [&second, &third] {
        let (status, _) = send(&app, cancel(running["id"].as_str().unwrap())).await;
        assert_eq!(status, 200);
    }
    assert_eq!(state.background.len(), 0);

    // Only a background response can be cancelled; an unknown one is a 404.
    let (status, body) = send(&app, cancel(id)).await;
    assert_eq!(status, 200, "a finished background response is answered as it is: {body}");
    let (status, body) = send(&app, cancel("resp_nothing")).await;
    assert_eq!((status, message(&body)), (404, "no stored response has the id 'resp_nothing'"));
    for (extra, said) in [(json!({"store": false}), "'background' needs 'store'")] {
        let mut body = json!({"input": "x", "background": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, answer) = send(&app, post(body)).await;
        assert_eq!(status, 400, "{extra}");
        assert!(message(&answer).starts_with(said), "{answer}");
    }
}

#[actix_web::test]
async fn a_turn_cut_by_its_time_budget_says_why_and_its_answer_stays_the_models() {
    let settings = skillhost_actors::chat_loop::LoopSettings {
        turn_timeout: std::time::Duration::from_millis(300),
        ..Default::default()
    };
    // Three pieces (three tokens to the scripted model), then nothing until
    // the time budget cuts the round.
    let stalled = ScriptedOutput { stall_after: Some(3), ..ScriptedOutput::from("One, two, three, and the rest.") };
    let (state, _) = started(TestServer::scripted(vec![stalled, endless()]).settings(settings)).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let (status, response) = send(&app, post(json!({"input": "Wait."}))).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"], json!({"reason": "turn_timeout"}));
    // The cut round counts its prompt and the tokens it wrote.
    let usage = &response["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{response}");
    assert_eq!(usage["output_tokens"], 3, "{response}");
    assert_eq!(usage["total_tokens"], usage["input_tokens"].as_u64().unwrap() + 3, "{response}");
    let item = &response["output"][0];
    let said = (item["status"].as_str(), item["content"][0]["text"].as_str());
    assert_eq!(said, (Some("incomplete"), Some("One, two, three, and ")));
    // Streamed, the last event says the same.
    let response = test::call_service(&app, post(json!({"input": "Wait.", "stream": true})).to_request()).await;
    let text = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    let last = text.split("\n\n").filter(|frame| !frame.is_empty()).last().unwrap();
    assert!(last.starts_with("event: response.incomplete"), "{last}");
    assert!(last.contains(r#""incomplete_details":{"reason":"turn_timeout"}"#), "{last}");
    assert!(!text.contains("cut short"), "no note in the answer: {text}");
}

/// The `data:` objects of a Responses SSE body, in order.
fn events_of(body: &[u8]) -> Vec<Value> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|line| line.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

#[actix_web::test]
async fn a_background_stream_is_read_again_from_any_event() {
    let slow =
        ScriptedOutput { delay: std::time::Duration::from_millis(200), ..ScriptedOutput::from("Streamed later.") };
    let (state, _) = started(TestServer::scripted([slow, ScriptedOutput::from("Plain.")])).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let response =
        test::call_service(&app, post(json!({"input": "Go.", "background": true, "stream": true})).to_request()).await;
    assert_eq!(response.status().as_u16(), 200);
    let events = events_of(&test::read_body(response).await);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"), "{kinds:?}");
    let sequence: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(sequence, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0]["response"]["background"], true);
    let id = events[0]["response"]["id"].as_str().unwrap().to_string();
    assert_eq!(settled(&app, &id).await["status"], "completed");

    // From after event 2 to the end, as the SDK resumes a stream.
    let again =
        test::call_service(&app, get(&format!("/v1/responses/{id}?stream=true&starting_after=2")).to_request()).await;
    assert_eq!(again.status().as_u16(), 200);
    let tail = events_of(&test::read_body(again).await);
    assert_eq!(tail.first().unwrap()["sequence_number"], 3);
    assert_eq!(tail, events[3..].to_vec());
    let (status, body) = send(&app, get(&format!("/v1/responses/{id}?stream=true&starting_after=soon"))).await;
    assert_eq!(status, 400);
    assert!(message(&body).contains("'starting_after' must be"), "{body}");

    // A response that did not run in the background keeps no events.
    let (_, plain) = send(&app, post(json!({"input": "Hi."}))).await;
    let (status, body) = send(&app, get(&format!("/v1/responses/{}?stream=true", plain["id"].as_str().unwrap()))).await;
    assert_eq!(status, 400);
    assert!(message(&body).contains("are not kept: only a background response's are"), "{body}");
    // Deleting the response forgets its events.
    let deleted =
        test::call_service(&app, test::TestRequest::delete().uri(&format!("/v1/responses/{id}")).to_request()).await;
    assert_eq!(deleted.status().as_u16(), 200);
    assert_eq!(state.response_streams.len(), 0);
}

#[actix_web::test]
async fn a_compaction_keeps_the_users_words_and_the_next_turn_reads_its_summary() {
    let (state, backend) =
        started(TestServer::scripted(["We planned a trip to Rome; the weather tool said sunny.", "Pack light."])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let history = json!([
        {"type": "message", "role": "user", "content": "Plan a trip."},
        {"type": "message", "role": "assistant", "content": "Where to?"},
        {"type": "message", "role": "user", "content": "Rome."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]);
    let compact = |body: Value| test::TestRequest::post().uri("/v1/responses/compact").set_json(body);
    let (status, compacted) = send(&app, compact(json!({"model": "scripted", "input": history}))).await;
    assert_eq!(status, 200, "{compacted}");
    assert_eq!(compacted["object"], "response.compaction");
    let output = compacted["output"].as_array().unwrap();
    let users: Vec<&str> = output[..2].iter().map(|item| item["content"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(users, ["Plan a trip.", "Rome."], "the user's messages stay, verbatim and in order");
    assert_eq!(output.len(), 3);
    assert_eq!(output[2]["type"], "compaction");
    assert!(output[2]["id"].as_str().unwrap().starts_with("cmp_"));
    assert!(compacted["usage"]["output_tokens"].as_u64().unwrap() > 0);
    // The model was asked to summarize the whole transcript.
    let asked = backend.prompts().pop().unwrap();
    assert!(asked.contains("called get_weather") && asked.contains("sunny") && asked.contains("Where to?"), "{asked}");

    // The next turn sends the compacted items back; the summary stands in.
    let mut input = output.clone();
    input.push(json!({"type": "message", "role": "user", "content": "What do I pack?"}));
    let (status, next) = send(&app, post(json!({"input": input}))).await;
    assert_eq!(status, 200, "{next}");
    let prompt = backend.prompts().pop().unwrap();
    assert!(prompt.contains("We planned a trip to Rome; the weather tool said sunny."), "{prompt}");
    assert!(!prompt.contains("Where to?"), "the compacted turns are not replayed: {prompt}");

    // Another provider's compaction, and fields it cannot honour, are 400s naming them.
    let forged =
        json!([{"type": "compaction", "encrypted_content": "gAAAAB-opaque"}, {"role": "user", "content": "Hi"}]);
    let (status, body) = send(&app, post(json!({"input": forged}))).await;
    assert_eq!(status, 400);
    assert!(message(&body).contains("'input[0].encrypted_content' is not a compaction this server made"), "{body}");
    let (status, body) = send(&app, compact(json!({"input": "x", "image": {"context_compression": "enabled"}}))).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("image")), "{body}");
    let (status, body) = send(&app, compact(json!({"input": "x", "reasoning": {}}))).await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).contains("reasoning"), "{body}");
}
