//! OpenAI's Conversations API with the scripted model: a conversation made,
//! read, renamed, paged, added to and deleted; a Responses turn that names
//! it continues from its items and adds its own; the limits at and one past
//! them; another caller's conversation.

use std::net::{IpAddr, Ipv4Addr};

use actix_web::{test, App};
use serde_json::{json, Value};

use crate::config::AccessConfig;
use crate::http::configure;
use crate::http::conversations_api::{
    MAX_ITEMS_PER_REQUEST, MAX_METADATA_KEY_CHARS, MAX_METADATA_PAIRS, MAX_METADATA_VALUE_CHARS,
};
use crate::http::responses_tests::{get, message, send};
use crate::http::test_server::TestServer;

fn post(uri: &str, body: Value) -> test::TestRequest {
    test::TestRequest::post().uri(uri).set_json(body)
}

fn delete(uri: &str) -> test::TestRequest {
    test::TestRequest::delete().uri(uri)
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": text})
}

fn texts(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| match &item["content"] {
            Value::Array(parts) => parts.iter().map(|part| part["text"].as_str().unwrap_or_default()).collect(),
            other => other.as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

#[actix_web::test]
async fn a_conversation_is_made_read_renamed_paged_added_to_and_deleted() {
    let running = TestServer::scripted(Vec::<String>::new()).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state).configure(configure)).await;
    let body = json!({"items": [user("one"), user("two")], "metadata": {"topic": "demo"}});
    let (status, made) = send(&app, post("/v1/conversations", body)).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("conv_"));
    assert_eq!((made["object"].as_str(), &made["metadata"]), (Some("conversation"), &json!({"topic": "demo"})));
    let (_, read) = send(&app, get(&format!("/v1/conversations/{id}"))).await;
    assert_eq!(read, made);

    let (status, renamed) =
        send(&app, post(&format!("/v1/conversations/{id}"), json!({"metadata": {"topic": "b"}}))).await;
    assert_eq!((status, &renamed["metadata"]), (200, &json!({"topic": "b"})));

    let items = format!("/v1/conversations/{id}/items");
    let (status, added) = send(&app, post(&items, json!({"items": [user("three")]}))).await;
    assert_eq!(status, 200, "{added}");
    assert_eq!((added["object"].as_str(), texts(&added)), (Some("list"), vec!["three".to_string()]));
    let three = added["data"][0]["id"].as_str().unwrap().to_string();

    // Newest first by default; a page of one, then the next after it.
    let (_, page) = send(&app, get(&format!("{items}?limit=1"))).await;
    assert_eq!((texts(&page), page["has_more"].as_bool()), (vec!["three".to_string()], Some(true)));
    let (_, next) = send(&app, get(&format!("{items}?limit=1&after={three}"))).await;
    assert_eq!(texts(&next), ["two"]);
    let (_, oldest) = send(&app, get(&format!("{items}?order=asc"))).await;
    assert_eq!(
        (texts(&oldest), oldest["has_more"].as_bool()),
        (vec!["one".into(), "two".into(), "three".into()], Some(false))
    );
    let (status, body) = send(&app, get(&format!("{items}?after=msg_nothing"))).await;
    assert_eq!(
        (status, message(&body)),
        (400, format!("'after' names the item 'msg_nothing', which is not an item of {id}").as_str())
    );

    let (status, item) = send(&app, get(&format!("{items}/{three}"))).await;
    assert_eq!((status, item["role"].as_str()), (200, Some("user")));
    let (status, after) = send(&app, delete(&format!("{items}/{three}"))).await;
    assert_eq!((status, after["id"].as_str()), (200, Some(id.as_str())), "deleting an item answers the conversation");
    let (status, body) = send(&app, get(&format!("{items}/{three}"))).await;
    assert_eq!((status, message(&body)), (404, format!("the conversation '{id}' has no item '{three}'").as_str()));

    let (status, gone) = send(&app, delete(&format!("/v1/conversations/{id}"))).await;
    assert_eq!((status, gone), (200, json!({"id": id, "object": "conversation.deleted", "deleted": true})));
    for request in [get(&format!("/v1/conversations/{id}")), get(&items), delete(&format!("/v1/conversations/{id}"))] {
        let (status, body) = send(&app, request).await;
        assert_eq!(status, 404);
        assert!(message(&body).starts_with(&format!("no conversation has the id '{id}'")), "{body}");
    }
}

#[actix_web::test]
async fn a_turn_that_names_a_conversation_continues_it_and_adds_to_it() {
    let running = TestServer::scripted(["Paris.", "Rome.", "Streamed."]).start().await.unwrap();
    let backend = running.backend.clone().unwrap();
    let app = test::init_service(App::new().app_data(running.state).configure(configure)).await;
    let (_, made) = send(&app, post("/v1/conversations", json!({"items": [user("I like capitals.")]}))).await;
    let id = made["id"].as_str().unwrap().to_string();

    let (status, first) = send(&app, post("/v1/responses", json!({"conversation": id, "input": "France?"}))).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["conversation"], json!({"id": id}));
    let prompt = backend.prompts().last().cloned().unwrap();
    assert!(prompt.contains("I like capitals.") && prompt.contains("France?"), "{prompt}");

    // The object form; the prompt holds the first turn, question and answer.
    let (status, second) =
        send(&app, post("/v1/responses", json!({"conversation": {"id": id}, "input": "Italy?", "store": false}))).await;
    assert_eq!(status, 200, "{second}");
    let prompt = backend.prompts().last().cloned().unwrap();
    assert!(prompt.contains("France?") && prompt.contains("Paris.") && prompt.contains("Italy?"), "{prompt}");

    // A streamed turn adds its items before its last event.
    let streamed = post("/v1/responses", json!({"conversation": id, "input": "Stream it.", "stream": true}));
    let response = test::call_service(&app, streamed.to_request()).await;
    let text = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    assert!(text.contains("response.completed"), "{text}");

    let (_, items) = send(&app, get(&format!("/v1/conversations/{id}/items?order=asc"))).await;
    let expected = ["I like capitals.", "France?", "Paris.", "Italy?", "Rome.", "Stream it.", "Streamed."];
    assert_eq!(texts(&items), expected, "input then output of every turn, store or not");
    let answer = items["data"][2]["id"].as_str().unwrap();
    assert!(answer.starts_with("msg_"), "{items}");
    let (status, body) = send(&app, get(&format!("/v1/conversations/{id}/items/{answer}"))).await;
    assert_eq!((status, body["role"].as_str()), (200, Some("assistant")));

    // A conversation and a previous response at once, an unknown one, a bad shape.
    let previous = first["id"].as_str().unwrap();
    for (body, status, said) in [
        (json!({"conversation": id, "previous_response_id": previous, "input": "x"}), 400, "cannot both be set"),
        (json!({"conversation": "conv_nothing", "input": "x"}), 404, "no conversation has the id 'conv_nothing'"),
        (json!({"conversation": 7, "input": "x"}), 400, "'conversation' must be an id or {\"id\": …}, got 7"),
        (json!({"conversation": {"id": id, "extra": 1}, "input": "x"}), 400, "'conversation' must be an id"),
    ] {
        let (got, answer) = send(&app, post("/v1/responses", body.clone())).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(message(&answer).contains(said), "{body}: {answer}");
    }
}

#[actix_web::test]
async fn an_item_added_by_the_client_can_be_referenced() {
    let running = TestServer::scripted(["Noted."]).start().await.unwrap();
    let backend = running.backend.clone().unwrap();
    let app = test::init_service(App::new().app_data(running.state).configure(configure)).await;
    let (_, made) = send(&app, post("/v1/conversations", json!({"items": [user("The code word is plum.")]}))).await;
    let (_, items) = send(&app, get(&format!("/v1/conversations/{}/items", made["id"].as_str().unwrap()))).await;
    let word = items["data"][0]["id"].as_str().unwrap();
    let input = json!([{"type": "item_reference", "id": word}, user("Repeat it.")]);
    let (status, body) = send(&app, post("/v1/responses", json!({"input": input}))).await;
    assert_eq!(status, 200, "{body}");
    assert!(backend.prompts().last().unwrap().contains("The code word is plum."));
}

#[actix_web::test]
async fn limits_hold_at_their_bound_and_one_past_it() {
    let running = TestServer::scripted(Vec::<String>::new()).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state).configure(configure)).await;
    let items = |n: usize| (0..n).map(|k| user(&format!("item {k}"))).collect::<Vec<_>>();
    let pairs = |n: usize| (0..n).map(|k| (format!("k{k}"), json!("v"))).collect::<serde_json::Map<String, Value>>();
    let key = |n: usize| json!({"k".repeat(n): "v"});
    let value = |n: usize| json!({"k": "v".repeat(n)});
    for (body, fine) in [
        (json!({"items": items(MAX_ITEMS_PER_REQUEST)}), true),
        (json!({"items": items(MAX_ITEMS_PER_REQUEST + 1)}), false),
        (json!({"metadata": pairs(MAX_METADATA_PAIRS)}), true),
        (json!({"metadata": pairs(MAX_METADATA_PAIRS + 1)}), false),
        (json!({"metadata": key(MAX_METADATA_KEY_CHARS)}), true),
        (json!({"metadata": key(MAX_METADATA_KEY_CHARS + 1)}), false),
        (json!({"metadata": value(MAX_METADATA_VALUE_CHARS)}), true),
        (json!({"metadata": value(MAX_METADATA_VALUE_CHARS + 1)}), false),
    ] {
        let (status, answer) = send(&app, post("/v1/conversations", body.clone())).await;
        assert_eq!(status, if fine { 200 } else { 400 }, "{answer}");
    }
    let (_, made) = send(&app, post("/v1/conversations", json!({}))).await;
    let id = made["id"].as_str().unwrap();
    let (status, _) =
        send(&app, post(&format!("/v1/conversations/{id}/items"), json!({"items": items(MAX_ITEMS_PER_REQUEST + 1)})))
            .await;
    assert_eq!(status, 400);
    for (body, said) in [
        (json!({"items": [], "frobnicate": 1}), "unknown field `frobnicate`"),
        (json!({"metadata": {"n": 5}}), "'metadata.n' must be a string, got 5"),
        (
            json!({"items": [{"role": "tool", "content": "x"}]}),
            "'items[0].role' must be user, assistant, system or developer",
        ),
        (json!({"items": [{"type": "item_reference", "id": "msg_x"}]}), "'items[0]' is an item_reference"),
        (json!({"items": ["text"]}), "'items[0]' must be an object"),
    ] {
        let (status, answer) = send(&app, post("/v1/conversations", body.clone())).await;
        assert_eq!(status, 400, "{body}");
        assert!(message(&answer).contains(said), "{body}: {answer}");
    }
    let (status, answer) = send(&app, get(&format!("/v1/conversations/{id}/items?limit=0"))).await;
    assert_eq!((status, message(&answer)), (400, "'limit' must be between 1 and 100, got 0"));
}

#[actix_web::test]
async fn another_callers_conversation_is_unknown_to_it() {
    let access = AccessConfig { api_keys: vec!["key-a".into(), "key-b".into()], ..AccessConfig::default() };
    let running =
        TestServer::scripted(["Hidden."]).keys(access, IpAddr::V4(Ipv4Addr::LOCALHOST)).start().await.unwrap();
    let backend = running.backend.clone().unwrap();
    let app = test::init_service(App::new().app_data(running.state).configure(configure)).await;
    let as_a = |request: test::TestRequest| request.insert_header(("authorization", "Bearer key-a"));
    let as_b = |request: test::TestRequest| request.insert_header(("authorization", "Bearer key-b"));
    let (_, made) = send(&app, as_a(post("/v1/conversations", json!({"items": [user("mine")]})))).await;
    let id = made["id"].as_str().unwrap().to_string();
    let (_, items) = send(&app, as_a(get(&format!("/v1/conversations/{id}/items")))).await;
    let item = items["data"][0]["id"].as_str().unwrap().to_string();
    for request in [
        get(&format!("/v1/conversations/{id}")),
        get(&format!("/v1/conversations/{id}/items")),
        get(&format!("/v1/conversations/{id}/items/{item}")),
        delete(&format!("/v1/conversations/{id}/items/{item}")),
        post(&format!("/v1/conversations/{id}/items"), json!({"items": [user("theirs")]})),
        post(&format!("/v1/conversations/{id}"), json!({"metadata": {}})),
        delete(&format!("/v1/conversations/{id}")),
        post("/v1/responses", json!({"conversation": id, "input": "x"})),
    ] {
        let (status, body) = send(&app, as_b(request)).await;
        assert_eq!(status, 404, "{body}");
    }
    let input = json!([{"type": "item_reference", "id": item}]);
    let (status, _) = send(&app, as_b(post("/v1/responses", json!({"input": input})))).await;
    assert_eq!(status, 400, "another caller's item cannot be referenced");
    // Nothing reached the model, and the owner still has all of it.
    assert!(backend.prompts().is_empty());
    let (_, items) = send(&app, as_a(get(&format!("/v1/conversations/{id}/items")))).await;
    assert_eq!(texts(&items), ["mine"]);
}
