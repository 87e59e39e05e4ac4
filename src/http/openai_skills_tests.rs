//! OpenAI's Skills API on the scripted model: what each malformed request
//! is told, and the list's limit at its bounds. The SDK's own round trip is
//! `tests/python/test_skills_api.py`.

use actix_web::{test, App};
use serde_json::{json, Value};

use crate::http::configure;
use crate::http::openai_skills::{MAX_FIELD_BYTES, MAX_PAGE_ITEMS};
use crate::http::test_server::{install_only, multipart, TestServer};

fn create(uri: &str, parts: &[(&str, &str, &[u8])]) -> actix_http::Request {
    let (content_type, body) = multipart(parts);
    test::TestRequest::post().uri(uri).insert_header(("content-type", content_type)).set_payload(body).to_request()
}

fn skill_md(name: &str) -> Vec<u8> {
    format!("---\nname: {name}\ndescription: Does {name} things.\n---\nBody.\n").into_bytes()
}

#[actix_web::test]
async fn each_malformed_request_is_told_what_was_wrong() {
    let install = tempfile::tempdir().unwrap();
    let running =
        TestServer::scripted(Vec::<String>::new()).skills(install_only(install.path())).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let created = test::call_service(&app, create("/v1/skills", &[("files[]", "SKILL.md", &skill_md("demo"))])).await;
    assert_eq!(created.status(), 200);
    let body: Value = test::read_body_json(created).await;
    assert_eq!(
        (&body["id"], &body["default_version"], &body["latest_version"]),
        (&json!("demo"), &json!("1"), &json!("1"))
    );

    let zip = {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        zip.start_file("SKILL.md", zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(&skill_md("demo")).unwrap();
        zip.finish().unwrap().into_inner()
    };
    let cases: Vec<(actix_http::Request, u16, &str)> = vec![
        (
            create("/v1/skills", &[("archive", "demo.zip", &zip)]),
            400,
            "'archive' is not a field of this route; send the skill in 'files'",
        ),
        (create("/v1/skills", &[]), 400, ""),
        (
            create("/v1/skills", &[("files", "demo.zip", &zip), ("files[]", "notes.md", b"x")]),
            400,
            "send either one ZIP or the skill's files, not both and not two ZIPs",
        ),
        (
            create("/v1/skills", &[("files[]", "../SKILL.md", &skill_md("evil"))]),
            400,
            "",
        ),
        (
            test::TestRequest::post().uri("/v1/skills").set_json(json!({"files": "x"})).to_request(),
            400,
            "send the skill as multipart/form-data: one ZIP in 'files', or its files in 'files[]', each named by its path",
        ),
        (
            test::TestRequest::post().uri("/v1/skills/demo").set_json(json!({"default_version": "latest"})).to_request(),
            400,
            "'latest' is not a version of 'demo': versions here are numbers (1, 2, …)",
        ),
        (
            test::TestRequest::post().uri("/v1/skills/demo").set_json(json!({"default_version": "1", "name": "x"})).to_request(),
            400,
            "",
        ),
        (
            test::TestRequest::post().uri("/v1/skills/demo").set_json(json!({"default_version": "7"})).to_request(),
            404,
            "the skill 'demo' has no version 7; its versions: 1",
        ),
        (test::TestRequest::get().uri("/v1/skills?order=up").to_request(), 400, "order must be 'asc' or 'desc', got 'up'"),
        (test::TestRequest::get().uri("/v1/skills?after=nope").to_request(), 400, "'nope' is not an id in this list"),
        (test::TestRequest::get().uri("/v1/skills?cursor=1").to_request(), 400, ""),
        (test::TestRequest::get().uri("/v1/skills/demo/versions/x").to_request(), 400, ""),
        (test::TestRequest::get().uri("/v1/skills/nope/content").to_request(), 404, ""),
    ];
    for (request, status, message) in cases {
        let uri = request.uri().to_string();
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status(), status, "{uri}");
        let body: Value = test::read_body_json(response).await;
        let said = body["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(!said.is_empty(), "{uri}: {body}");
        if !message.is_empty() {
            assert_eq!(said, message, "{uri}");
        }
    }
    // The traversing path never reached the install folder.
    assert!(!install.path().join("evil").exists() && !install.path().parent().unwrap().join("SKILL.md").exists());

    // A text field at its limit is read; one byte past it is refused, not cut.
    for (padding, status) in [(MAX_FIELD_BYTES - 1, 200), (MAX_FIELD_BYTES, 400)] {
        let default = format!("1{}", " ".repeat(padding));
        let request =
            create("/v1/skills/demo/versions", &[("files", "demo.zip", &zip), ("default", "", default.as_bytes())]);
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status(), status, "{} bytes", padding + 1);
        if status == 400 {
            let body: Value = test::read_body_json(response).await;
            assert_eq!(
                body["error"]["message"],
                format!("'default' is longer than the limit of {MAX_FIELD_BYTES} bytes")
            );
        }
    }

    for (limit, status) in [(0, 400), (1, 200), (MAX_PAGE_ITEMS, 200), (MAX_PAGE_ITEMS + 1, 400)] {
        let request = test::TestRequest::get().uri(&format!("/v1/skills?limit={limit}")).to_request();
        assert_eq!(test::call_service(&app, request).await.status(), status, "limit {limit}");
    }
}
