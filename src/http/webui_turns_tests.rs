//! The host owns a Web UI turn (scripted model, in process): a turn runs
//! on when its page leaves, a reader that comes back (a reload, a second
//! tab) reads its frames from any id, Stop and the detached cap end it
//! with a note in its history, one turn runs per conversation, and the
//! history outlives the server.

use std::time::Duration;

use actix_http::Request;
use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::{test, App};
use serde_json::{json, Value};
use skillhost_actors::model::scripted::ScriptedOutput;

use crate::http::configure;
use crate::http::test_server::{web_frames, TestServer};

fn slow(text: &str, delay: Duration) -> ScriptedOutput {
    ScriptedOutput { delay, ..ScriptedOutput::from(text) }
}

fn never() -> ScriptedOutput {
    slow("never", Duration::from_secs(3600))
}

fn chat(body: Value) -> Request {
    test::TestRequest::post().uri("/api/chat").set_json(body).to_request()
}

fn ask(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

/// Starts a turn and reads only its opening frame, then drops the
/// response, as a page that closes does: returns the conversation id.
async fn start_and_leave(
    app: &impl Service<Request, Response = ServiceResponse, Error = actix_web::Error>,
    body: Value,
) -> String {
    let response = test::call_service(app, chat(body)).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut body = Box::pin(response.into_body());
    let first = std::future::poll_fn(|cx| body.as_mut().poll_next(cx)).await.unwrap().unwrap();
    let text = String::from_utf8(first.to_vec()).unwrap();
    assert!(text.starts_with("id: "), "{text}");
    let data = text.lines().find_map(|line| line.strip_prefix("data: ")).unwrap();
    let opening: Value = serde_json::from_str(data).unwrap();
    opening["conversationId"].as_str().unwrap().to_string()
}

async fn get(
    app: &impl Service<Request, Response = ServiceResponse, Error = actix_web::Error>,
    uri: &str,
) -> (u16, Value) {
    let response = test::call_service(app, test::TestRequest::get().uri(uri).to_request()).await;
    let status = response.status().as_u16();
    (status, serde_json::from_slice(&test::read_body(response).await).unwrap_or(Value::Null))
}

async fn delete(app: &impl Service<Request, Response = ServiceResponse, Error = actix_web::Error>, uri: &str) -> Value {
    let response = test::call_service(app, test::TestRequest::delete().uri(uri).to_request()).await;
    assert_eq!(response.status().as_u16(), 200);
    test::read_body_json(response).await
}

/// The raw SSE body of a conversation's events from `query`.
async fn events(
    app: &impl Service<Request, Response = ServiceResponse, Error = actix_web::Error>,
    id: &str,
    query: &str,
    header: Option<&str>,
) -> (u16, String) {
    let mut request = test::TestRequest::get().uri(&format!("/api/conversations/{id}/events{query}"));
    if let Some(last) = header {
        request = request.insert_header(("Last-Event-ID", last));
    }
    let response = test::call_service(app, request.to_request()).await;
    let status = response.status().as_u16();
    (status, String::from_utf8(test::read_body(response).await.to_vec()).unwrap())
}

#[actix_web::test]
async fn a_turn_outlives_its_page_and_a_reader_that_comes_back_reads_from_any_frame() {
    let running =
        TestServer::scripted([slow("The answer is four.", Duration::from_millis(300))]).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let id = start_and_leave(&app, ask("What is two and two?")).await;

    // The page is gone; the turn is not, and a reload finds it running.
    let (status, listed) = get(&app, "/api/conversations").await;
    assert_eq!(status, 200);
    assert_eq!(listed["data"][0]["id"], id.as_str());
    assert_eq!(listed["data"][0]["title"], "What is two and two?");
    let (_, open) = get(&app, &format!("/api/conversations/{id}")).await;
    assert_eq!(open["messages"][0]["content"], "What is two and two?");

    // Attached from the start, a reader sees every frame, live, to the end.
    let (status, body) = events(&app, &id, "?after=0", None).await;
    assert_eq!(status, 200);
    let frames = web_frames(body.as_bytes());
    let text: String = frames.iter().filter_map(|f| f["content"].as_str()).collect();
    assert_eq!(text, "The answer is four.");
    let done = frames.last().unwrap();
    assert_eq!((done["done"].as_bool(), done["conversationId"].as_str()), (Some(true), Some(id.as_str())));
    let last: u64 = body.rsplit("id: ").next().unwrap().lines().next().unwrap().parse().unwrap();

    // The history holds the answer, stored before the final frame went out.
    let (_, ended) = get(&app, &format!("/api/conversations/{id}")).await;
    assert_eq!(ended["running"], false);
    assert_eq!(ended["last_event_id"], last);
    let messages = ended["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{ended}");
    assert_eq!(
        (messages[1]["role"].as_str(), messages[1]["content"].as_str()),
        (Some("assistant"), Some("The answer is four."))
    );
    assert_eq!(messages[1]["finish_reason"], "stop");

    // From any id: the header (as EventSource sends it) or `after`.
    let (_, tail) = events(&app, &id, "", Some(&(last - 1).to_string())).await;
    assert!(tail.starts_with(&format!("id: {last}\ndata: ")) && tail.contains("\"done\":true"), "{tail}");
    assert_eq!(tail.matches("id: ").count(), 1, "{tail}");
    let (status, nothing) = events(&app, &id, &format!("?after={last}"), None).await;
    assert_eq!((status, nothing.as_str()), (200, ""));

    // Bad ids and unknown conversations are 4xx with a sentence.
    let (status, bad) = events(&app, &id, "?after=soon", None).await;
    assert_eq!(status, 400);
    assert!(bad.contains("'after' must be a frame id"), "{bad}");
    let (status, bad) = events(&app, &id, "", Some("x")).await;
    assert_eq!(status, 400);
    assert!(bad.contains("Last-Event-ID"), "{bad}");
    let (status, unknown) = get(&app, "/api/conversations/c-00000000000000000000000000000000").await;
    assert_eq!(status, 404);
    assert!(unknown["error"].as_str().unwrap().contains("there is no conversation"), "{unknown}");
    let (status, _) = events(&app, "c-00000000000000000000000000000000", "", None).await;
    assert_eq!(status, 404);
    let (status, _) = get(&app, "/api/conversations/..%2Fetc").await;
    assert_eq!(status, 400);
}

#[actix_web::test]
async fn stop_ends_a_turn_with_its_note_and_a_conversation_runs_one_turn_at_a_time() {
    let running = TestServer::scripted([never()]).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let id = start_and_leave(&app, ask("Count to a billion.")).await;
    let mut again = ask("And then?");
    again["conversationId"] = json!(id);
    let response = test::call_service(&app, chat(again)).await;
    assert_eq!(response.status().as_u16(), 409);
    let refused: Value = test::read_body_json(response).await;
    assert!(refused["error"].as_str().unwrap().contains("has a turn running"), "{refused}");

    assert_eq!(delete(&app, &format!("/api/conversations/{id}/turn")).await, json!({"stopped": true}));
    let (_, body) = events(&app, &id, "?after=0", None).await;
    let frames = web_frames(body.as_bytes());
    assert_eq!(frames.last().unwrap()["stopped"], true, "{frames:?}");
    assert_eq!(frames.last().unwrap()["note"], "stopped");
    let (_, open) = get(&app, &format!("/api/conversations/{id}")).await;
    assert_eq!(open["running"], false);
    assert_eq!(open["messages"][1]["note"], "stopped", "{open}");
    assert_eq!(delete(&app, &format!("/api/conversations/{id}/turn")).await, json!({"stopped": false}));
    assert_eq!(running.state.background.len(), 0, "no turn is left counted as detached");

    // Deleting the conversation takes its history.
    assert_eq!(delete(&app, &format!("/api/conversations/{id}")).await, json!({"closed": true}));
    let (status, _) = get(&app, &format!("/api/conversations/{id}")).await;
    assert_eq!(status, 404);
}

#[actix_web::test]
async fn at_the_detached_cap_all_run_and_one_past_it_stops_the_oldest_with_a_note() {
    let running = TestServer::scripted([never(), never(), never()]).max_detached_turns(2).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let first = start_and_leave(&app, ask("One.")).await;
    let second = start_and_leave(&app, ask("Two.")).await;
    assert_eq!(running.state.background.len(), 2);
    let (_, open) = get(&app, &format!("/api/conversations/{first}")).await;
    assert_eq!(open["running"], true, "at the cap, every detached turn runs");

    let third = start_and_leave(&app, ask("Three.")).await;
    let (_, body) = events(&app, &first, "?after=0", None).await;
    let note = web_frames(body.as_bytes()).last().unwrap()["note"].as_str().unwrap_or_default().to_string();
    assert!(note.contains("more than 2 turns were running with no client attached (--max-detached-turns)"), "{body}");
    let (_, open) = get(&app, &format!("/api/conversations/{first}")).await;
    assert_eq!(open["messages"][1]["note"], note.as_str());
    assert_eq!(running.state.background.len(), 2);

    // A reader that comes back takes its turn out of the count.
    let reader = test::call_service(
        &app,
        test::TestRequest::get().uri(&format!("/api/conversations/{second}/events")).to_request(),
    )
    .await;
    assert_eq!(running.state.background.len(), 1);
    drop(reader);
    assert_eq!(running.state.background.len(), 2);
    for id in [&second, &third] {
        assert_eq!(delete(&app, &format!("/api/conversations/{id}")).await, json!({"closed": true}));
    }
    assert_eq!(running.state.background.len(), 0);
}

#[actix_web::test]
async fn a_conversation_outlives_the_server_and_continues_under_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let (id, last) = {
        let running = TestServer::scripted(["Paris."]).state_dir(dir.path()).start().await.unwrap();
        let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
        let body =
            String::from_utf8(test::call_and_read_body(&app, chat(ask("Capital of France?"))).await.to_vec()).unwrap();
        let done = web_frames(body.as_bytes()).pop().unwrap();
        let (_, open) = get(&app, &format!("/api/conversations/{}", done["conversationId"].as_str().unwrap())).await;
        (done["conversationId"].as_str().unwrap().to_string(), open["last_event_id"].as_u64().unwrap())
    };
    let running = TestServer::scripted(["Rome."]).state_dir(dir.path()).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let (_, listed) = get(&app, "/api/conversations").await;
    assert_eq!(listed["data"][0]["id"], id.as_str());
    let (_, open) = get(&app, &format!("/api/conversations/{id}")).await;
    assert_eq!(open["messages"][1]["content"], "Paris.");
    // No turn since the start: its events say where its messages are.
    let (status, body) = events(&app, &id, "", None).await;
    assert_eq!(status, 404);
    assert!(body.contains("no turn since the server started"), "{body}");

    let body = json!({
        "messages": [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And Italy?"},
        ],
        "conversationId": id,
    });
    let text = String::from_utf8(test::call_and_read_body(&app, chat(body)).await.to_vec()).unwrap();
    assert_eq!(web_frames(text.as_bytes()).pop().unwrap()["conversationId"], id.as_str(), "the same conversation");
    let first_id: u64 = text.strip_prefix("id: ").unwrap().lines().next().unwrap().parse().unwrap();
    assert_eq!(first_id, last + 1, "frame ids go on rising across the restart");
    let (_, open) = get(&app, &format!("/api/conversations/{id}")).await;
    assert_eq!(open["messages"].as_array().unwrap().len(), 4);
    assert_eq!(open["title"], "Capital of France?");
}
