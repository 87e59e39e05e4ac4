//! What a client sees of the calls to its own tools, with the scripted
//! model: a call repeated in one round comes back once, and a call cut
//! short by the token budget comes back on every surface, in that
//! surface's shape, with the finish that says it was cut.

use std::sync::Arc;

use actix_web::{test, App};
use serde_json::{json, Value};
use skillhost_actors::model::scripted::{ScriptedBackend, ScriptedOutput};

use crate::http::configure;
use crate::http::test_server::TestServer;

const CALL: &str =
    "<tool_call>\n{\"name\": \"fill_form\", \"arguments\": {\"a\": \"first\", \"b\": \"second value\"}}\n</tool_call>";
/// Pieces of the scripted model (7 bytes each) before the budget cuts
/// `CALL` inside its arguments: `{"a": "first", "` is written.
const CUT_AT: u64 = 9;
const WRITTEN: &str = "{\"a\": \"first\", \"";

fn form_schema() -> Value {
    json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a", "b"]})
}

/// Posts `body` to `uri` on a server whose model writes `output` once.
async fn post(output: &str, uri: &str, body: Value) -> (Vec<u8>, Arc<ScriptedBackend>) {
    let outputs = vec![ScriptedOutput::from(output.to_string())];
    let running = TestServer::scripted(outputs).start().await.unwrap();
    let (state, backend) = (running.state, running.backend.unwrap());
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let response = test::call_service(&app, test::TestRequest::post().uri(uri).set_json(&body).to_request()).await;
    assert_eq!(response.status().as_u16(), 200, "{uri} {body}");
    (test::read_body(response).await.to_vec(), backend)
}

fn user() -> Value {
    json!([{"role": "user", "content": "Fill in the form."}])
}

fn openai_tools() -> Value {
    json!([{"type": "function", "function": {"name": "fill_form", "parameters": form_schema()}}])
}

/// The `data:` payloads of an SSE body, with the `event:` name when given.
fn events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).unwrap();
    text.split("\n\n")
        .filter_map(|frame| {
            let kind = frame.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("").to_string();
            let data = frame.lines().find_map(|l| l.strip_prefix("data: "))?;
            serde_json::from_str(data).ok().map(|value| (kind, value))
        })
        .collect()
}

#[actix_web::test]
async fn a_call_written_twice_in_a_round_reaches_the_client_once() {
    let twice = format!("{CALL}\n{CALL}");
    let body = json!({"messages": user(), "tools": openai_tools(), "tool_choice": "required"});
    let (body, _) = post(&twice, "/v1/chat/completions", body).await;
    let answer: Value = serde_json::from_slice(&body).unwrap();
    let calls = answer["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
}

#[actix_web::test]
async fn a_call_cut_by_the_budget_comes_back_with_its_arguments_so_far_on_every_surface() {
    let forced = json!({"type": "function", "function": {"name": "fill_form"}});

    // Chat Completions: the call with the text written, `length`.
    let body = json!({"messages": user(), "tools": openai_tools(), "tool_choice": forced, "max_tokens": CUT_AT});
    let (body, backend) = post(CALL, "/v1/chat/completions", body).await;
    assert_eq!(backend.forced_calls(), vec![true], "the call was forced");
    let answer: Value = serde_json::from_slice(&body).unwrap();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{answer}");
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "fill_form");
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["arguments"], WRITTEN);
    assert_eq!(answer["usage"]["completion_tokens"], CUT_AT);

    // Streamed: the same call in the deltas, then `length`.
    let body = json!({"messages": user(), "tools": openai_tools(), "tool_choice": forced, "max_tokens": CUT_AT, "stream": true});
    let (body, _) = post(CALL, "/v1/chat/completions", body).await;
    let chunks = events(&body);
    let arguments: String = chunks
        .iter()
        .filter_map(|(_, c)| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, WRITTEN);
    let finish: Vec<&Value> =
        chunks.iter().map(|(_, c)| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
    assert_eq!(finish, vec![&json!("length")]);

    // Responses: an incomplete function_call in an incomplete response.
    let tools = json!([{"type": "function", "name": "fill_form", "parameters": form_schema()}]);
    let request = json!({"input": "Fill in the form.", "tools": tools, "tool_choice": {"type": "function", "name": "fill_form"}, "max_output_tokens": CUT_AT});
    let (body, _) = post(CALL, "/v1/responses", request.clone()).await;
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(response["status"], "incomplete", "{response}");
    assert_eq!(response["incomplete_details"]["reason"], "max_output_tokens");
    let item = response["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").unwrap();
    assert_eq!((&item["status"], &item["arguments"]), (&json!("incomplete"), &json!(WRITTEN)));

    // A Responses stream cut by its budget ends with `response.incomplete`.
    let mut streamed = request;
    streamed["stream"] = json!(true);
    let (body, _) = post(CALL, "/v1/responses", streamed).await;
    let frames = events(&body);
    let (last, end) = frames.last().unwrap();
    assert_eq!(last, "response.incomplete");
    assert_eq!(end["response"]["status"], "incomplete");
    assert!(!frames.iter().any(|(kind, _)| kind == "response.completed"));
    let done =
        frames.iter().find(|(kind, e)| kind == "response.output_item.done" && e["item"]["type"] == "function_call");
    assert_eq!(done.unwrap().1["item"]["status"], "incomplete");

    // Anthropic: a tool_use block whose input is the part written whole.
    let tools = json!([{"name": "fill_form", "input_schema": form_schema()}]);
    let request = json!({"model": "scripted", "max_tokens": CUT_AT, "messages": user(), "tools": tools, "tool_choice": {"type": "tool", "name": "fill_form"}});
    let (body, _) = post(CALL, "/v1/messages", request.clone()).await;
    let message: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(message["stop_reason"], "max_tokens", "{message}");
    let block = message["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap();
    assert_eq!((&block["name"], &block["input"]), (&json!("fill_form"), &json!({"a": "first"})));
    // Streamed, the input's JSON text is what was written.
    let mut streamed = request;
    streamed["stream"] = json!(true);
    let (body, _) = post(CALL, "/v1/messages", streamed).await;
    let frames = events(&body);
    let partial: String = frames.iter().filter_map(|(_, e)| e["delta"]["partial_json"].as_str()).collect();
    assert_eq!(partial, WRITTEN);
    let stop = frames.iter().find_map(|(_, e)| e["delta"]["stop_reason"].as_str());
    assert_eq!(stop, Some("max_tokens"));

    // Ollama: its tool_calls, arguments as an object, done_reason length.
    // Ollama's API has no tool_choice; a client forces the call with the header.
    let outputs = vec![ScriptedOutput::from(CALL.to_string())];
    let state = TestServer::scripted(outputs).start().await.unwrap().state;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let request = json!({"model": "scripted", "messages": user(), "tools": openai_tools(), "options": {"num_predict": CUT_AT}, "stream": false});
    let request = test::TestRequest::post()
        .uri("/ollama/api/chat")
        .insert_header(("x-skillhost-tool-choice", "fill_form"))
        .set_json(&request)
        .to_request();
    let reply: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(reply["done_reason"], "length", "{reply}");
    assert_eq!(
        reply["message"]["tool_calls"],
        json!([{"function": {"name": "fill_form", "arguments": {"a": "first"}}}])
    );
}
