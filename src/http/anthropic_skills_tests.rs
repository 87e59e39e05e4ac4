//! Anthropic's Skills API on the scripted model: the same paths answer in
//! Anthropic's shapes when the request carries its headers, each malformed
//! request is told what was wrong in Anthropic's error shape, and the
//! list's limit holds at its bounds. The SDK's own round trip is
//! `tests/python/test_skills_api.py`.

use actix_web::{test, App};
use serde_json::{json, Value};

use crate::http::anthropic_skills::MAX_PAGE_ITEMS;
use crate::http::configure;
use crate::http::test_server::{install_only, multipart, TestServer};

const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

fn get(uri: &str) -> actix_http::Request {
    test::TestRequest::get().uri(uri).insert_header(VERSION).to_request()
}

fn post(uri: &str, parts: &[(&str, &str, &[u8])]) -> actix_http::Request {
    let (content_type, body) = multipart(parts);
    test::TestRequest::post()
        .uri(uri)
        .insert_header(VERSION)
        .insert_header(("content-type", content_type))
        .set_payload(body)
        .to_request()
}

fn skill_md(name: &str, says: &str) -> Vec<u8> {
    format!("---\nname: {name}\ndescription: {says}\n---\nBody.\n").into_bytes()
}

#[actix_web::test]
async fn the_same_paths_answer_in_anthropics_shapes() {
    let install = tempfile::tempdir().unwrap();
    let running =
        TestServer::scripted(Vec::<String>::new()).skills(install_only(install.path())).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let call = |request| test::call_service(&app, request);

    let first = skill_md("demo", "First.");
    let created =
        call(post("/v1/skills?beta=true", &[("files[]", "demo/SKILL.md", &first), ("display_name", "", b"demo")]))
            .await;
    assert_eq!(created.status(), 200);
    let body: Value = test::read_body_json(created).await;
    assert_eq!(
        (&body["id"], &body["type"], &body["display_name"], &body["source"], &body["latest_version_id"]),
        (&json!("demo"), &json!("skill"), &json!("demo"), &json!({"type": "custom"}), &json!("1"))
    );
    assert!(body["created_at"].as_str().unwrap().ends_with('Z'), "{body}");

    let second = skill_md("demo", "Second.");
    let version = call(post("/v1/skills/demo/versions?beta=true", &[("files[]", "demo/SKILL.md", &second)])).await;
    assert_eq!(version.status(), 200);
    let version: Value = test::read_body_json(version).await;
    assert_eq!(
        (&version["id"], &version["type"], &version["skill_id"], &version["name"], &version["description"]),
        (&json!("2"), &json!("skill_version"), &json!("demo"), &json!("demo"), &json!("Second."))
    );
    let listed: Value = test::read_body_json(call(get("/v1/skills/demo/versions?limit=1&beta=true")).await).await;
    assert_eq!(
        (&listed["data"][0]["id"], &listed["has_more"], &listed["next_page"]),
        (&json!("1"), &json!(true), &json!("1"))
    );
    let rest: Value = test::read_body_json(call(get("/v1/skills/demo/versions?limit=1&page=1")).await).await;
    assert_eq!(
        (&rest["data"][0]["id"], &rest["has_more"], &rest["next_page"]),
        (&json!("2"), &json!(false), &Value::Null)
    );
    let one: Value = test::read_body_json(call(get("/v1/skills/demo/versions/1")).await).await;
    assert_eq!(one["description"], "First.");
    let zip = call(get("/v1/skills/demo/versions/2/content")).await;
    assert_eq!(zip.headers().get("content-type").unwrap(), "application/zip");

    // Without Anthropic's headers the same path is OpenAI's.
    let openai = call(test::TestRequest::get().uri("/v1/skills/demo").to_request()).await;
    let openai: Value = test::read_body_json(openai).await;
    assert_eq!((&openai["object"], &openai["default_version"]), (&json!("skill"), &json!("2")));
    let listed: Value = test::read_body_json(call(get("/v1/skills?source=custom")).await).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "{listed}");
    let listed: Value = test::read_body_json(call(get("/v1/skills?source=anthropic")).await).await;
    assert_eq!(listed["data"], json!([]), "{listed}");

    let cases: Vec<(actix_http::Request, u16, &str)> = vec![
        (
            post("/v1/skills", &[("files[]", "other/SKILL.md", &skill_md("other", "x")), ("display_name", "", b"Other Skill")]),
            400,
            "the archive holds the skill 'other', not 'Other Skill'",
        ),
        (post("/v1/skills", &[("name", "", b"x")]), 400, "'name' is not a field of this route; send the skill in 'files'"),
        (post("/v1/skills", &[("files[]", "demo/SKILL.md", &first)]), 409, ""),
        (post("/v1/skills/nope/versions", &[("files[]", "nope/SKILL.md", &skill_md("nope", "x"))]), 404, ""),
        (get("/v1/skills?source=mine"), 400, "source must be 'custom' or 'anthropic', got 'mine'"),
        (get("/v1/skills?page=zzz"), 400, "'zzz' is not a page token of this list; send a next_page you were given"),
        (get("/v1/skills?after=demo"), 400, ""),
        (get("/v1/skills/demo/versions?source=custom"), 400, "'source' filters skills, not versions"),
        (get("/v1/skills/demo/versions/latest"), 400, ""),
        (get("/v1/skills/demo/versions/9"), 404, ""),
        (
            test::TestRequest::delete().uri("/v1/skills/demo/versions/1").insert_header(VERSION).to_request(),
            400,
            "one version cannot be deleted alone here: versions past --skills-keep-versions leave by themselves, and DELETE /v1/skills/demo removes the skill with every version",
        ),
    ];
    for (request, status, message) in cases {
        let uri = request.uri().to_string();
        let response = call(request).await;
        assert_eq!(response.status(), status, "{uri}");
        let body: Value = test::read_body_json(response).await;
        assert_eq!(body["type"], "error", "{uri}: {body}");
        let said = body["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(!said.is_empty(), "{uri}: {body}");
        assert!(said.starts_with(message), "{uri}: {said}");
    }

    for (limit, status) in [(0, 400), (1, 200), (MAX_PAGE_ITEMS, 200), (MAX_PAGE_ITEMS + 1, 400)] {
        assert_eq!(call(get(&format!("/v1/skills?limit={limit}"))).await.status(), status, "limit {limit}");
    }

    let deleted = call(test::TestRequest::delete().uri("/v1/skills/demo").insert_header(VERSION).to_request()).await;
    let deleted: Value = test::read_body_json(deleted).await;
    assert_eq!(deleted, json!({"id": "demo", "type": "skill_deleted"}));
    assert_eq!(call(get("/v1/skills/demo")).await.status(), 404);
}
