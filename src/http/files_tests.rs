//! Files and attachments with the scripted model: `/v1/files` uploaded,
//! listed, read and deleted by their owner only, its limits at and past
//! their bounds with nothing left behind, and attachments on each surface
//! reaching the prompt as one line each (small text inlined), named safely
//! and read with `read_file` when there is no working folder.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use actix_web::dev::{Service, ServiceResponse};
use actix_web::{test, web, App};
use base64::Engine;
use serde_json::{json, Value};
use skillhost_actors::attachments::{
    MAX_ATTACHMENTS_PER_MESSAGE, MAX_CONVERSATION_ATTACHMENTS, MAX_CONVERSATION_ATTACHMENT_BYTES,
};
use skillhost_actors::model::scripted::ScriptedBackend;

use crate::config::AccessConfig;
use crate::http::responses_tests::{get, message, send};
use crate::http::test_server::TestServer;
use crate::http::{configure, AppState};

async fn started(server: TestServer) -> (web::Data<AppState>, Arc<ScriptedBackend>) {
    let running = server.start().await.unwrap();
    (running.state, running.backend.unwrap())
}

const BOUNDARY: &str = "filesboundary";

/// A multipart body: the file's bytes under `filename`, then the fields.
fn form(filename: &str, content: &[u8], fields: &[(&str, &str)]) -> Vec<u8> {
    let mut body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    for (name, value) in fields {
        body.extend_from_slice(
            format!("\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}").as_bytes(),
        );
    }
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    body
}

fn upload(body: Vec<u8>) -> test::TestRequest {
    test::TestRequest::post()
        .uri("/v1/files")
        .insert_header(("content-type", format!("multipart/form-data; boundary={BOUNDARY}")))
        .set_payload(body)
}

fn chat(messages: Value) -> test::TestRequest {
    test::TestRequest::post().uri("/v1/chat/completions").set_json(json!({"messages": messages}))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn raw(
    app: &impl Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
    request: test::TestRequest,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let response = test::call_service(app, request.to_request()).await;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or_default().to_string()))
        .collect();
    (status, headers, test::read_body(response).await.to_vec())
}

/// What the spool folder holds.
fn spooled(state: &AppState) -> usize {
    let dir = state.store.path().parent().unwrap().join(crate::http::files::SPOOL_DIR);
    std::fs::read_dir(dir).map_or(0, |entries| entries.count())
}

#[actix_web::test]
async fn a_file_is_uploaded_listed_read_and_deleted_by_its_owner_only() {
    let access = AccessConfig { api_keys: vec!["key-a".into(), "key-b".into()], ..AccessConfig::default() };
    let server = TestServer::scripted(Vec::<String>::new()).keys(access, IpAddr::V4(Ipv4Addr::LOCALHOST));
    let (state, _) = started(server).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let as_a = |request: test::TestRequest| request.insert_header(("authorization", "Bearer key-a"));
    let as_b = |request: test::TestRequest| request.insert_header(("authorization", "Bearer key-b"));
    let (status, made) =
        send(&app, as_a(upload(form("notes.txt", b"The totals are in.\n", &[("purpose", "user_data")])))).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("file-"), "{id}");
    let expected = json!({"id": id, "object": "file", "bytes": 19, "created_at": made["created_at"], "expires_at": null,
        "filename": "notes.txt", "purpose": "user_data", "status": "processed", "status_details": null});
    pretty_assertions::assert_eq!(made, expected);
    let (_, read) = send(&app, as_a(get(&format!("/v1/files/{id}")))).await;
    assert_eq!(read, expected);
    let (_, listed) = send(&app, as_a(get("/v1/files?purpose=user_data"))).await;
    assert_eq!(listed["data"], json!([expected]));
    assert_eq!((listed["has_more"].as_bool(), listed["first_id"].as_str()), (Some(false), Some(id.as_str())));
    let (status, headers, bytes) = raw(&app, as_a(get(&format!("/v1/files/{id}/content")))).await;
    assert_eq!((status, bytes.as_slice()), (200, &b"The totals are in.\n"[..]));
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap_or_default();
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert!(header("content-disposition").starts_with("attachment"), "{headers:?}");

    // Another key's caller sees none of it.
    for uri in [format!("/v1/files/{id}"), format!("/v1/files/{id}/content")] {
        let (status, body) = send(&app, as_b(get(&uri))).await;
        assert_eq!(status, 404, "{uri}: {body}");
    }
    let (_, listed) = send(&app, as_b(get("/v1/files"))).await;
    assert_eq!(listed["data"], json!([]));
    let (status, _) = send(&app, as_b(test::TestRequest::delete().uri(&format!("/v1/files/{id}")))).await;
    assert_eq!(status, 404);

    let (status, deleted) = send(&app, as_a(test::TestRequest::delete().uri(&format!("/v1/files/{id}")))).await;
    assert_eq!((status, deleted), (200, json!({"id": id, "object": "file", "deleted": true})));
    let (status, gone) = send(&app, as_a(get(&format!("/v1/files/{id}")))).await;
    assert_eq!(status, 404);
    assert!(message(&gone).starts_with(&format!("no file of yours has the id '{id}'")), "{gone}");
    assert_eq!(spooled(&state), 0);
}

#[actix_web::test]
async fn an_upload_at_the_limit_is_kept_and_one_byte_past_it_leaves_nothing() {
    const LIMIT: u64 = 4096;
    let (state, _) = started(TestServer::scripted(Vec::<String>::new()).max_attachment_bytes(LIMIT)).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let at = vec![b'a'; LIMIT as usize];
    let (status, made) = send(&app, upload(form("at.txt", &at, &[("purpose", "assistants")]))).await;
    assert_eq!((status, made["bytes"].as_u64()), (200, Some(LIMIT)), "{made}");
    let past = vec![b'a'; LIMIT as usize + 1];
    let (status, refused) = send(&app, upload(form("past.txt", &past, &[("purpose", "assistants")]))).await;
    assert_eq!(status, 413, "{refused}");
    assert_eq!(message(&refused), "the file is larger than the limit of 4096 bytes (--max-attachment-bytes)");
    let (_, listed) = send(&app, get("/v1/files")).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "only the file at the limit: {listed}");
    assert_eq!(spooled(&state), 0, "the refused upload's spooled copy is gone");

    // Bad forms say what was wrong, and leave nothing either.
    for (body, said) in [
        (form("a.txt", b"x", &[]), "the upload needs a 'purpose'"),
        (form("a.txt", b"x", &[("purpose", "memes")]), "'purpose' must be one of assistants, batch, fine-tune"),
        (form("a.txt", b"x", &[("purpose", "batch"), ("color", "red")]), "the upload has a field 'color'"),
        (
            form(
                "a.txt",
                b"x",
                &[("purpose", "batch"), ("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "5")],
            ),
            "'expires_after[seconds]' must be a whole number from 3600",
        ),
    ] {
        let (status, refused) = send(&app, upload(body)).await;
        assert_eq!(status, 400, "{refused}");
        assert!(message(&refused).starts_with(said), "{refused}");
    }
    let plain = test::TestRequest::post().uri("/v1/files").set_json(json!({"file": "x"}));
    let (status, refused) = send(&app, plain).await;
    assert_eq!(
        (status, message(&refused)),
        (400, "send the file as multipart/form-data, with the content in a field named 'file' and its 'purpose'")
    );
    let (_, listed) = send(&app, get("/v1/files")).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    assert_eq!(spooled(&state), 0);
}

#[actix_web::test]
async fn an_upload_cut_off_halfway_leaves_nothing() {
    let (state, _) = started(TestServer::scripted(Vec::<String>::new())).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let mut body = form("big.bin", &vec![7u8; 256 * 1024], &[("purpose", "user_data")]);
    // The connection drops in the middle of the file's bytes.
    body.truncate(128 * 1024);
    let (status, refused) = send(&app, upload(body)).await;
    assert_eq!(status, 400, "{refused}");
    let (_, listed) = send(&app, get("/v1/files")).await;
    assert_eq!(listed["data"], json!([]));
    assert_eq!(spooled(&state), 0);
}

#[actix_web::test]
async fn attachments_reach_the_prompt_one_line_each_in_every_part_shape() {
    let outputs: Vec<String> = vec!["Read.".into(); 4];
    let (state, backend) = started(TestServer::scripted(outputs)).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let (_, made) =
        send(&app, upload(form("totals.csv", b"item,total\nrent,1200\n", &[("purpose", "user_data")]))).await;
    let id = made["id"].as_str().unwrap();
    let pdf =
        b"%PDF-1.4\n1 0 obj << /Type /Catalog /OpenAction << /S /JavaScript /JS (app.alert(1)) >> >>\nendobj\n%%EOF\n";
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0";
    let content = json!([
        {"type": "text", "text": "Sum these up."},
        {"type": "file", "file": {"file_id": id}},
        {"type": "file", "file": {"filename": "../../etc/statement.pdf", "file_data": format!("data:application/pdf;base64,{}", b64(pdf))}},
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(png))}},
        // A ZIP bomb's first bytes, named as text: its type is its content's.
        {"type": "file", "file": {"filename": "notes.txt", "file_data": b64(b"PK\x03\x04\x14\x00\x00\x00\x08\x00rest")}},
    ]);
    let (status, answer) = send(&app, chat(json!([{"role": "user", "content": content}]))).await;
    assert_eq!(status, 200, "{answer}");
    let prompt = backend.prompts().last().cloned().unwrap();
    let lines = [
        "Sum these up.\n\n[Attached file: attachments/totals.csv (text/plain, 21 bytes). Its text:]\nitem,total\nrent,1200\n\n[End of attachments/totals.csv]",
        "[Attached file: attachments/statement.pdf (application/pdf, 103 bytes). Read it with the file tools.]",
        "[Attached image: attachments/attachment-3.png (image/png, 29 bytes). This model cannot see images; the file is there for tools to work with.]",
        "[Attached file: attachments/notes.txt (application/zip, 14 bytes). Read it with the file tools.]",
    ];
    for line in lines {
        assert!(prompt.contains(line), "{line}\n--- in ---\n{prompt}");
    }
    // The same conversation sent again renders the same bytes.
    let again = json!([{"role": "user", "content": content}, {"role": "assistant", "content": "Read."}, {"role": "user", "content": "And?"}]);
    let (status, _) = send(&app, chat(again)).await;
    assert_eq!(status, 200);
    let next = backend.prompts().last().cloned().unwrap();
    let cut = prompt.find(lines[3]).unwrap() + lines[3].len();
    assert_eq!(&next[..cut], &prompt[..cut], "the KV prefix survives");
}

#[actix_web::test]
async fn attachment_limits_hold_at_their_bound_and_refuse_one_past_it() {
    const LIMIT: u64 = 1024;
    let outputs: Vec<String> = vec!["Ok.".into(); 8];
    let (state, _) = started(TestServer::scripted(outputs).max_attachment_bytes(LIMIT)).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let file = |bytes: usize| json!({"type": "file", "file": {"file_data": b64(&vec![b'x'; bytes])}});
    let message_with = |parts: Vec<Value>| json!([{"role": "user", "content": parts}]);
    let (status, body) = send(&app, chat(message_with(vec![file(LIMIT as usize)]))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(&app, chat(message_with(vec![file(LIMIT as usize + 1)]))).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        message(&body),
        "'messages[0].content[0].file' is 1025 bytes; an attachment may be at most 1024 bytes (--max-attachment-bytes)"
    );
    let (status, body) = send(&app, chat(message_with(vec![file(1); MAX_ATTACHMENTS_PER_MESSAGE]))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(&app, chat(message_with(vec![file(1); MAX_ATTACHMENTS_PER_MESSAGE + 1]))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(message(&body), "messages[0] carries 21 files; a message may carry at most 20");
    // Across messages, the conversation's count: at the bound and past it.
    let spread = |count: usize| -> Value {
        (0..count)
            .map(|n| json!({"role": "user", "content": [{"type": "text", "text": format!("{n}")}, file(0)]}))
            .collect()
    };
    let (status, body) = send(&app, chat(spread(MAX_CONVERSATION_ATTACHMENTS))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(&app, chat(spread(MAX_CONVERSATION_ATTACHMENTS + 1))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        message(&body),
        "the conversation carries 101 files; one may carry at most 100: start a new conversation"
    );
    let (status, body) =
        send(&app, chat(message_with(vec![json!({"type": "file", "file": {"file_id": "file-nothing"}})]))).await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).contains("names the file 'file-nothing', which no file of yours has"), "{body}");
    assert!(MAX_CONVERSATION_ATTACHMENT_BYTES > LIMIT * MAX_ATTACHMENTS_PER_MESSAGE as u64);
}

#[actix_web::test]
async fn a_conversations_attachments_are_bounded_together() {
    // Files at the per-file limit, spread over messages, past what one
    // conversation may carry.
    let per_file = skillhost_actors::attachments::DEFAULT_MAX_ATTACHMENT_BYTES;
    let (state, _) = started(TestServer::scripted(vec!["Ok.".to_string(); 2])).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let mut ids = Vec::new();
    let whole = (MAX_CONVERSATION_ATTACHMENT_BYTES / per_file) as usize;
    for n in 0..=whole {
        let (status, made) = send(
            &app,
            upload(form(&format!("part{n}.bin"), &vec![0u8; per_file as usize], &[("purpose", "user_data")])),
        )
        .await;
        assert_eq!(status, 200, "{made}");
        ids.push(made["id"].as_str().unwrap().to_string());
    }
    let messages = |count: usize| -> Value {
        ids[..count]
            .iter()
            .map(|id| json!({"role": "user", "content": [{"type": "file", "file": {"file_id": id}}]}))
            .collect()
    };
    let (status, body) = send(&app, chat(messages(whole))).await;
    assert_eq!(status, 200, "at the bound: {body}");
    let (status, body) = send(&app, chat(messages(whole + 1))).await;
    assert_eq!(status, 413, "{body}");
    assert!(message(&body).starts_with("the conversation's attachments come to more than 67108864 bytes"), "{body}");
}

#[actix_web::test]
async fn without_a_working_folder_read_file_reads_the_attachments_only() {
    let call = crate::http::code_tests::call;
    let outputs = vec![
        call("read_file", json!({"path": "attachments/report.txt", "offset": 1001})),
        call("read_file", json!({"path": "/etc/passwd"})),
        "The report says 42.".to_string(),
    ];
    let (state, backend) = started(TestServer::scripted(outputs)).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let report = format!("{}The answer is 42.\n", "filler line\n".repeat(1000));
    let content = json!([{"type": "text", "text": "What does it say?"},
        {"type": "file", "file": {"filename": "report.txt", "file_data": b64(report.as_bytes())}}]);
    let (status, answer) = send(&app, chat(json!([{"role": "user", "content": content}]))).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "The report says 42.");
    let prompts = backend.prompts();
    assert!(prompts[0].contains("Show a file the user attached"), "read_file is offered: {}", prompts[0]);
    assert!(prompts[1].contains("1001\tThe answer is 42."), "{}", prompts[1]);
    assert!(prompts[2].contains("There is no attachment '/etc/passwd'. The attachments are: attachments/report.txt."));
    // A plain question is offered no such tool.
    let (state, backend) = started(TestServer::scripted(["Hi."])).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    send(&app, chat(json!([{"role": "user", "content": "Hello"}]))).await;
    assert!(!backend.prompts()[0].contains("read_file"));
}
