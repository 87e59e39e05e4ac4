//! The access gate with the scripted model: every route against every kind
//! of key, the error shape of each surface, browser origins and preflights,
//! the Host check, the JSON content type, and admission.

use std::net::IpAddr;

use actix_web::dev::ServiceResponse;
use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::skills::{Origin, Root};

use crate::config::AccessConfig;
use crate::http::access::Admission;
use crate::http::test_server::{multipart_body, scenario_skills_root, skills_config, TestServer};
use crate::http::{configure, AppState};

const USER_KEY: &str = "sk-user-1";
const ADMIN_KEY: &str = "sk-admin-1";
const METRICS_KEY: &str = "metrics-1";

/// The scripted model with an install folder and the scenario skills,
/// behind `access` on `host`.
async fn app_state(
    access: AccessConfig,
    host: IpAddr,
    admission: Admission,
    install: &std::path::Path,
) -> web::Data<AppState> {
    let roots = vec![
        Root { path: install.to_path_buf(), origin: Origin::Installed },
        Root { path: scenario_skills_root(), origin: Origin::Discovered },
    ];
    let skills = skills_config(roots, Some(install.to_path_buf()), Vec::new());
    let server = TestServer::scripted(vec!["Hello there.".to_string(); 64]).skills(skills);
    server.keys(access, host).admission(admission).start().await.unwrap().state
}

fn keyed() -> AccessConfig {
    AccessConfig {
        api_keys: vec![USER_KEY.into()],
        admin_keys: vec![ADMIN_KEY.into()],
        metrics_key: Some(METRICS_KEY.into()),
        ..AccessConfig::default()
    }
}

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A small skill archive for the upload route.
fn archive() -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    zip.start_file("gate-check/SKILL.md", options).unwrap();
    zip.write_all(b"---\nname: gate-check\ndescription: A skill the access tests upload.\n---\nBody.\n").unwrap();
    zip.finish().unwrap().into_inner()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Need {
    Open,
    Metrics,
    User,
    Admin,
}

/// A request body: its content type and bytes.
type Body = Option<(&'static str, Vec<u8>)>;

/// Every route, with a request that would succeed given the right key.
fn routes() -> Vec<(&'static str, &'static str, Body, Need)> {
    let chat = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}"#.to_vec();
    let json = |body: &[u8]| Some(("application/json", body.to_vec()));
    vec![
        ("GET", "/health", None, Need::Open),
        ("GET", "/", None, Need::Open),
        ("GET", "/api/whoami", None, Need::Open),
        ("GET", "/metrics", None, Need::Metrics),
        ("POST", "/v1/chat/completions", json(&chat), Need::User),
        ("POST", "/chat/completions", json(&chat), Need::User),
        ("POST", "/v1/messages", json(&chat), Need::User),
        ("POST", "/v1/responses", json(br#"{"input": "hi", "max_output_tokens": 4}"#), Need::User),
        ("POST", "/v1/responses/input_tokens", json(br#"{"input": "hi"}"#), Need::User),
        ("GET", "/v1/responses/resp_x", None, Need::User),
        ("DELETE", "/v1/responses/resp_x", None, Need::User),
        ("GET", "/v1/responses/resp_x/input_items", None, Need::User),
        ("POST", "/v1/responses/resp_x/cancel", None, Need::User),
        ("POST", "/v1/conversations", json(br#"{}"#), Need::User),
        ("GET", "/v1/conversations/conv_x", None, Need::User),
        ("POST", "/v1/conversations/conv_x", json(br#"{"metadata": {}}"#), Need::User),
        ("DELETE", "/v1/conversations/conv_x", None, Need::User),
        ("GET", "/v1/conversations/conv_x/items", None, Need::User),
        ("POST", "/v1/conversations/conv_x/items", json(br#"{"items": []}"#), Need::User),
        ("GET", "/v1/conversations/conv_x/items/msg_x", None, Need::User),
        ("DELETE", "/v1/conversations/conv_x/items/msg_x", None, Need::User),
        ("POST", "/v1/files", Some(("file-upload", Vec::new())), Need::User),
        ("GET", "/v1/files", None, Need::User),
        ("GET", "/v1/files/file-x", None, Need::User),
        ("DELETE", "/v1/files/file-x", None, Need::User),
        ("GET", "/v1/files/file-x/content", None, Need::User),
        ("GET", "/v1/models", None, Need::User),
        ("GET", "/models", None, Need::User),
        ("GET", "/v1/skills", None, Need::User),
        ("GET", "/v1/skills/pdf", None, Need::User),
        ("GET", "/api/skills", None, Need::User),
        ("GET", "/api/skills/pdf", None, Need::User),
        ("GET", "/api/skills/pdf/files/SKILL.md", None, Need::User),
        ("GET", "/api/models", None, Need::User),
        ("POST", "/mcp", json(br#"{"jsonrpc": "2.0", "id": 1, "method": "ping"}"#), Need::User),
        ("GET", "/api/mcp", None, Need::User),
        (
            "POST",
            "/api/chat",
            json(br#"{"messages": [{"role": "user", "content": "hi"}], "maxTokens": 4}"#),
            Need::User,
        ),
        ("DELETE", "/api/conversations/c-00000000000000000000000000000000", None, Need::User),
        (
            "POST",
            "/api/chat/ollama",
            json(br#"{"messages": [{"role": "user", "content": "hi"}], "stream": false}"#),
            Need::User,
        ),
        (
            "POST",
            "/ollama/api/chat",
            json(br#"{"messages": [{"role": "user", "content": "hi"}], "stream": false}"#),
            Need::User,
        ),
        ("GET", "/ollama/api/tags", None, Need::User),
        ("POST", "/ollama/api/show", json(br#"{"model": "scripted"}"#), Need::User),
        ("GET", "/ollama/api/version", None, Need::User),
        ("GET", "/api/code/artifacts/run-1", None, Need::User),
        ("GET", "/api/code/artifacts/run-1/out.txt", None, Need::User),
        // A model the server lacks: past the gate, a 404 (the scripted
        // model embeds nothing).
        ("POST", "/v1/embeddings", json(br#"{"model": "nope", "input": "hi"}"#), Need::User),
        ("POST", "/embeddings", json(br#"{"model": "nope", "input": "hi"}"#), Need::User),
        ("POST", "/ollama/api/embed", json(br#"{"model": "nope", "input": "hi"}"#), Need::User),
        ("POST", "/api/models/scripted/unload", None, Need::Admin),
        ("POST", "/api/models/scripted/load", None, Need::Admin),
        ("POST", "/api/skills/rescan", None, Need::Admin),
        ("POST", "/api/skills", Some(("multipart", Vec::new())), Need::Admin),
        ("DELETE", "/api/skills/gate-check", None, Need::Admin),
        // Past the gate, a skill the server lacks: 404.
        ("GET", "/api/skills/nope/versions", None, Need::User),
        ("POST", "/api/skills/nope/rollback", json(br#"{}"#), Need::Admin),
        ("GET", "/no/such/route", None, Need::User),
    ]
}

async fn send(
    app: &impl actix_web::dev::Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
    method: &str,
    uri: &str,
    body: &Option<(&str, Vec<u8>)>,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut request = test::TestRequest::default().method(method.parse().unwrap()).uri(uri);
    match body {
        Some(("multipart", _)) => {
            let (content_type, payload) = multipart_body(&archive());
            request = request.insert_header(("content-type", content_type)).set_payload(payload);
        }
        Some(("file-upload", _)) => {
            let (content_type, mut payload) = multipart_body(b"notes");
            // The form's last boundary, then its purpose.
            payload.truncate(payload.len() - "--\r\n".len());
            payload.extend_from_slice(
                b"\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n--skillhostuploadboundary--\r\n",
            );
            request = request.insert_header(("content-type", content_type)).set_payload(payload);
        }
        Some((content_type, payload)) => {
            request = request.insert_header(("content-type", *content_type)).set_payload(payload.clone());
        }
        None => {}
    }
    for header in headers {
        request = request.insert_header(*header);
    }
    let response = test::call_service(app, request.to_request()).await;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    (status, headers, test::read_body(response).await.to_vec())
}

fn message(uri: &str, body: &[u8]) -> String {
    let body: Value = serde_json::from_slice(body).unwrap_or_else(|_| panic!("{uri}: not JSON"));
    if uri == "/v1/messages" {
        assert_eq!(body["type"], "error", "{uri}: {body}");
        body["error"]["message"].as_str().unwrap().to_string()
    } else if uri.starts_with("/v1/") || uri == "/chat/completions" || uri == "/models" {
        assert_eq!(body["error"]["type"], "invalid_request_error", "{uri}: {body}");
        body["error"]["message"].as_str().unwrap().to_string()
    } else {
        body["error"].as_str().unwrap_or_else(|| panic!("{uri}: {body}")).to_string()
    }
}

/// Whether the caller `who` (as the key tables name it) may use a route
/// that needs `need`.
fn allowed(need: Need, who: &str) -> bool {
    match need {
        Need::Open => true,
        Need::Metrics => who == "metrics key",
        Need::User => who.starts_with("user key") || who == "admin key",
        Need::Admin => who == "admin key",
    }
}

#[actix_web::test]
async fn every_route_against_every_key() {
    let install = tempfile::tempdir().unwrap();
    let state = app_state(keyed(), LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let bearer = |key: &str| format!("Bearer {key}");
    let (user, admin, wrong, metrics) = (bearer(USER_KEY), bearer(ADMIN_KEY), bearer("sk-nope"), bearer(METRICS_KEY));
    for (method, uri, body, need) in routes() {
        for (who, headers) in [
            ("no key", vec![]),
            ("wrong key", vec![("authorization", wrong.as_str())]),
            ("user key", vec![("authorization", user.as_str())]),
            ("user key in x-api-key", vec![("x-api-key", USER_KEY)]),
            ("admin key", vec![("authorization", admin.as_str())]),
            ("metrics key", vec![("authorization", metrics.as_str())]),
        ] {
            let (status, response_headers, response) = send(&app, method, uri, &body, &headers).await;
            if allowed(need, who) {
                assert!(
                    status < 400 || status == 404,
                    "{who} {method} {uri}: {status} {}",
                    String::from_utf8_lossy(&response)
                );
                continue;
            }
            let user_on_admin = need == Need::Admin && who.starts_with("user key");
            let expected = if user_on_admin { 403 } else { 401 };
            assert_eq!(status, expected, "{who} {method} {uri}: {}", String::from_utf8_lossy(&response));
            let text = message(uri, &response);
            if status == 401 {
                assert!(response_headers.iter().any(|(k, v)| k == "www-authenticate" && v == "Bearer"), "{uri}");
                let expected = if who == "no key" { "needs a key" } else { "not valid" };
                assert!(text.contains(expected), "{who} {uri}: {text}");
                // The key a client sent is never repeated back.
                assert!(!text.contains("sk-nope") && !text.contains(USER_KEY), "{text}");
                let body: Value = serde_json::from_slice(&response).unwrap();
                if uri == "/v1/messages" {
                    assert_eq!(body["error"]["type"], "authentication_error");
                } else if uri.starts_with("/v1/") {
                    assert_eq!(body["error"]["code"], "invalid_api_key");
                }
            } else {
                assert!(text.contains("admin key"), "{text}");
            }
        }
    }
    // The upload went through with the admin key and was deleted with it.
    assert!(!install.path().join("gate-check").exists());
    let scraped =
        String::from_utf8(send(&app, "GET", "/metrics", &None, &[("authorization", metrics.as_str())]).await.2)
            .unwrap();
    assert!(scraped.contains("skillhost_refused_requests_total{reason=\"unauthorized\"}"), "{scraped}");
}

#[actix_web::test]
async fn loopback_without_keys_is_open_and_user_keys_alone_close_admin_routes() {
    let install = tempfile::tempdir().unwrap();
    let state = app_state(AccessConfig::default(), LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    for (method, uri, body, _) in routes() {
        // Clients like `openai` always send some key; with none configured it is ignored.
        for headers in [vec![], vec![("authorization", "Bearer anything")]] {
            let (status, _, response) = send(&app, method, uri, &body, &headers).await;
            assert!(![401, 403].contains(&status), "{method} {uri}: {status} {}", String::from_utf8_lossy(&response));
        }
    }
    let whoami: Value = serde_json::from_slice(&send(&app, "GET", "/api/whoami", &None, &[]).await.2).unwrap();
    assert_eq!(whoami, serde_json::json!({"keys_required": false, "admin_keys": false, "role": "admin"}));

    let install = tempfile::tempdir().unwrap();
    let only_users = AccessConfig { api_keys: vec![USER_KEY.into()], ..AccessConfig::default() };
    let state = app_state(only_users, LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let user = format!("Bearer {USER_KEY}");
    let (status, _, body) = send(&app, "POST", "/api/skills/rescan", &None, &[("authorization", user.as_str())]).await;
    assert_eq!(status, 403);
    assert!(message("/api/skills/rescan", &body).contains("start it with --admin-key"));
    let whoami: Value =
        serde_json::from_slice(&send(&app, "GET", "/api/whoami", &None, &[("authorization", user.as_str())]).await.2)
            .unwrap();
    assert_eq!(whoami, serde_json::json!({"keys_required": true, "admin_keys": false, "role": "user"}));
    let whoami: Value = serde_json::from_slice(&send(&app, "GET", "/api/whoami", &None, &[]).await.2).unwrap();
    assert_eq!(whoami["role"], Value::Null);

    // Admin keys alone: chat stays open to anyone, changes need the key.
    let install = tempfile::tempdir().unwrap();
    let only_admins = AccessConfig { admin_keys: vec![ADMIN_KEY.into()], ..AccessConfig::default() };
    let state = app_state(only_admins, LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let whoami: Value = serde_json::from_slice(&send(&app, "GET", "/api/whoami", &None, &[]).await.2).unwrap();
    assert_eq!(whoami, serde_json::json!({"keys_required": false, "admin_keys": true, "role": "user"}));
    assert_eq!(send(&app, "GET", "/v1/models", &None, &[("authorization", "Bearer sk-any")]).await.0, 200);
    assert_eq!(send(&app, "POST", "/api/skills/rescan", &None, &[]).await.0, 401);
    let admin = format!("Bearer {ADMIN_KEY}");
    assert_eq!(send(&app, "POST", "/api/skills/rescan", &None, &[("authorization", admin.as_str())]).await.0, 200);
}

#[actix_web::test]
async fn browser_origins_hosts_and_content_types() {
    let install = tempfile::tempdir().unwrap();
    let access = AccessConfig {
        allowed_origins: vec!["http://ui.example:3000".into()],
        allowed_hosts: vec!["skillhost.internal".into()],
        ..AccessConfig::default()
    };
    let state = app_state(access, LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let chat =
        Some(("application/json", br#"{"messages": [{"role": "user", "content": "hi"}], "maxTokens": 4}"#.to_vec()));
    let host = ("host", "127.0.0.1:5000");
    // Another page (another port is another origin) cannot start work or install.
    for (method, uri, body) in
        [("POST", "/api/chat", chat.clone()), ("POST", "/api/skills", Some(("multipart", Vec::new())))]
    {
        let (status, _, response) = send(&app, method, uri, &body, &[host, ("origin", "http://127.0.0.1:5001")]).await;
        assert_eq!(status, 403, "{uri}");
        assert!(message(uri, &response).contains("not this server's own origin"));
    }
    assert!(!install.path().join("gate-check").exists());
    let (status, _, _) = send(&app, "POST", "/api/chat", &chat, &[host, ("sec-fetch-site", "cross-site")]).await;
    assert_eq!(status, 403);
    // The page the server itself served may.
    let (status, _, _) = send(&app, "POST", "/api/chat", &chat, &[host, ("origin", "http://127.0.0.1:5000")]).await;
    assert_eq!(status, 200);
    // An allowed origin may, and can read the answer.
    let allowed = ("origin", "http://ui.example:3000");
    let (status, headers, _) = send(&app, "POST", "/api/chat", &chat, &[host, allowed]).await;
    assert_eq!(status, 200);
    assert!(headers.contains(&("access-control-allow-origin".into(), "http://ui.example:3000".into())));
    // Preflights: answered for allowed origins only.
    let (status, headers, _) = send(&app, "OPTIONS", "/v1/chat/completions", &None, &[host, allowed]).await;
    assert_eq!(status, 204);
    assert!(headers.iter().any(|(k, v)| k == "access-control-allow-headers" && v.contains("authorization")));
    let (status, _, _) =
        send(&app, "OPTIONS", "/v1/chat/completions", &None, &[host, ("origin", "http://evil.example")]).await;
    assert_eq!(status, 403);
    // A form (or a no-cors fetch) can only send form and text types.
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let body = Some((content_type, br#"{"message": "hi"}"#.to_vec()));
        let (status, _, response) = send(&app, "POST", "/api/chat", &body, &[host]).await;
        assert_eq!(status, 415, "{content_type}");
        assert!(message("/api/chat", &response).contains("application/json"));
    }
    // DNS rebinding: a loopback server answers only to loopback names.
    for name in ["localhost:5000", "[::1]:5000", "app.localhost", "skillhost.internal:5000"] {
        let (status, _, _) = send(&app, "GET", "/v1/models", &None, &[("host", name)]).await;
        assert_eq!(status, 200, "{name}");
    }
    let (status, _, response) = send(&app, "GET", "/v1/models", &None, &[("host", "evil.example:5000")]).await;
    assert_eq!(status, 403);
    assert!(message("/v1/models", &response).contains("--allowed-hosts"));
    // Bound to a routable address, names are the operator's business.
    let install = tempfile::tempdir().unwrap();
    let open = AccessConfig { insecure_no_auth: true, ..AccessConfig::default() };
    let state = app_state(open, IpAddr::from([0, 0, 0, 0]), Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let (status, _, _) = send(&app, "GET", "/v1/models", &None, &[("host", "skillhost.example:5000")]).await;
    assert_eq!(status, 200);
}

#[actix_web::test]
async fn admission_refuses_past_the_queue_and_gives_places_back() {
    let install = tempfile::tempdir().unwrap();
    // One decoding and one waiting: the third is refused.
    let state = app_state(AccessConfig::default(), LOOPBACK, Admission::new(1, 1), install.path()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let stream = Some((
        "application/json",
        br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true}"#.to_vec(),
    ));
    let payload = stream.clone().unwrap().1;
    let open = || {
        test::TestRequest::post()
            .uri("/v1/chat/completions")
            .insert_header(("content-type", "application/json"))
            .set_payload(payload.clone())
            .to_request()
    };
    // A streaming response holds its place until its body is finished or dropped.
    let first = test::call_service(&app, open()).await;
    let second = test::call_service(&app, open()).await;
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
    assert_eq!(state.admission.in_flight(), 2);
    let (status, headers, body) = send(&app, "POST", "/v1/chat/completions", &stream, &[]).await;
    assert_eq!(status, 503);
    assert!(headers.contains(&("retry-after".into(), crate::http::access::RETRY_AFTER_SECONDS.to_string())));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("--max-queued"), "{body}");
    // Work that is not generation is never refused for capacity.
    assert_eq!(send(&app, "GET", "/v1/models", &None, &[]).await.0, 200);
    let scraped = String::from_utf8(send(&app, "GET", "/metrics", &None, &[]).await.2).unwrap();
    assert!(scraped.contains("skillhost_refused_requests_total{reason=\"overloaded\"} 1"), "{scraped}");
    assert!(scraped.contains("skillhost_admitted_requests 2"), "{scraped}");
    // A finished stream and a dropped one both give their places back.
    let finished = test::read_body(first).await;
    assert!(String::from_utf8_lossy(&finished).contains("[DONE]"));
    drop(second);
    assert_eq!(state.admission.in_flight(), 0);
    assert_eq!(send(&app, "POST", "/v1/chat/completions", &stream, &[]).await.0, 200);
}

/// `path` with the letters at the positions `pick` chooses percent-encoded,
/// in upper or lower case hex as `upper` says: a spelling the router decodes
/// back to `path`.
fn encoded(path: &str, pick: impl Fn(usize) -> bool, upper: bool) -> String {
    path.char_indices()
        .map(|(at, c)| match c {
            c if c.is_ascii_alphanumeric() && pick(at) => {
                if upper {
                    format!("%{:02X}", c as u32)
                } else {
                    format!("%{:02x}", c as u32)
                }
            }
            c => c.to_string(),
        })
        .collect()
}

/// The spellings a client can send for `path`: encoded letters (one, every
/// other, all), `//`, `/./`, a trailing slash, `..`, mixed case, a query.
fn spellings(path: &str) -> Vec<String> {
    let last_letter = path.rfind(|c: char| c.is_ascii_alphabetic()).unwrap_or(0);
    let first_slash = path[1..].find('/').map_or(path.len(), |at| at + 1);
    vec![
        encoded(path, |at| at == last_letter, false),
        encoded(path, |at| at % 2 == 0, true),
        encoded(path, |_| true, false),
        path.replacen('/', "//", 1),
        format!("/.{path}"),
        format!("{path}/"),
        format!("{}/x/..{}", &path[..first_slash], &path[first_slash..]),
        path.to_uppercase(),
        format!("{path}?a=1&b=%2F"),
    ]
}

// Regression: the gate judged the raw path while the router ran the decoded
// one, so `POST /api/skill%73` installed a skill with a user key (issue 26).
#[actix_web::test]
async fn every_spelling_of_every_route_is_refused_as_the_plain_spelling_is() {
    let install = tempfile::tempdir().unwrap();
    let state = app_state(keyed(), LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let bearer = |key: &str| format!("Bearer {key}");
    let (user, wrong, metrics) = (bearer(USER_KEY), bearer("sk-nope"), bearer(METRICS_KEY));
    for (method, uri, body, need) in routes() {
        for (who, headers) in [
            ("no key", vec![]),
            ("wrong key", vec![("authorization", wrong.as_str())]),
            ("user key", vec![("authorization", user.as_str())]),
            ("metrics key", vec![("authorization", metrics.as_str())]),
        ] {
            if allowed(need, who) {
                continue;
            }
            let plain = send(&app, method, uri, &body, &headers).await.0;
            assert!(matches!(plain, 401 | 403), "{who} {method} {uri}: {plain}");
            for spelling in spellings(uri) {
                let (status, _, response) = send(&app, method, &spelling, &body, &headers).await;
                assert!(
                    status == plain || status == 400 || status == 404,
                    "{who} {method} {spelling} (plain {uri}: {plain}): {status} {}",
                    String::from_utf8_lossy(&response)
                );
            }
        }
    }
    // Nothing was installed or deleted without the admin key.
    assert!(!install.path().join("gate-check").exists());
    assert!(std::fs::read_dir(install.path()).unwrap().next().is_none());
}

/// Encodings of every route drawn at random (seeded, so a failure names one
/// that can be sent again): a key that the plain spelling refuses is refused
/// for every encoding of it too.
#[actix_web::test]
async fn generated_encodings_of_every_route_never_widen_a_key() {
    use rand::{Rng, SeedableRng};
    const ENCODINGS_PER_ROUTE: usize = 24;
    let install = tempfile::tempdir().unwrap();
    let state = app_state(keyed(), LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let user = format!("Bearer {USER_KEY}");
    let mut random = rand::rngs::StdRng::seed_from_u64(26);
    for (method, uri, body, need) in routes() {
        // The user key is what an attacker holds; without any key, the
        // user routes are closed too.
        let cases: &[(&str, Vec<(&str, &str)>)] = match need {
            Need::Open => continue,
            Need::Admin | Need::Metrics => &[("user key", vec![("authorization", user.as_str())]), ("no key", vec![])],
            Need::User => &[("no key", vec![])],
        };
        for (who, headers) in cases {
            let plain = send(&app, method, uri, &body, headers).await.0;
            for _ in 0..ENCODINGS_PER_ROUTE {
                let picks: Vec<bool> = uri.chars().map(|_| random.random_bool(0.5)).collect();
                let spelling = encoded(uri, |at| picks[at], random.random_bool(0.5));
                let status = send(&app, method, &spelling, &body, headers).await.0;
                assert!(status == plain || status == 404, "{who} {method} {spelling} (plain {uri}: {plain}): {status}");
            }
        }
    }
    assert!(std::fs::read_dir(install.path()).unwrap().next().is_none());
}

// Regression: only the chat-completions spellings took an admission place
// and needed JSON, so `/v1/messages`, `/v1/responses` and an encoded chat
// path waited unbounded behind a full queue (issue 26).
#[actix_web::test]
async fn every_surface_that_starts_a_turn_is_admitted_and_needs_json() {
    let install = tempfile::tempdir().unwrap();
    let state = app_state(AccessConfig::default(), LOOPBACK, Admission::new(1, 0), install.path()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let chat = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true}"#.to_vec();
    let held = test::call_service(
        &app,
        test::TestRequest::post()
            .uri("/v1/chat/completions")
            .insert_header(("content-type", "application/json"))
            .set_payload(chat.clone())
            .to_request(),
    )
    .await;
    assert_eq!(held.status().as_u16(), 200);
    let turns: Vec<(&str, &[u8])> = vec![
        ("/v1/chat/completions", &chat),
        ("/v1/chat/completion%73", &chat),
        ("/chat/completions", &chat),
        ("/v1/messages", &chat),
        ("/v1/me%73sages", &chat),
        ("/v1/responses", br#"{"input": "hi", "max_output_tokens": 4}"#),
        ("/v1/respon%73es", br#"{"input": "hi", "max_output_tokens": 4}"#),
        ("/v1/responses/compact", br#"{"input": "hi"}"#),
        ("/v1/responses/compac%74", br#"{"input": "hi"}"#),
        ("/api/chat", br#"{"messages": [{"role": "user", "content": "hi"}], "maxTokens": 4}"#),
        ("/api/chat/ollama", br#"{"messages": [{"role": "user", "content": "hi"}], "stream": false}"#),
        ("/ollama/api/chat", br#"{"messages": [{"role": "user", "content": "hi"}], "stream": false}"#),
        ("/v1/embeddings", br#"{"input": "hi"}"#),
        ("/v1/embedding%73", br#"{"input": "hi"}"#),
        ("/embeddings", br#"{"input": "hi"}"#),
        ("/ollama/api/embed", br#"{"input": "hi"}"#),
    ];
    for (uri, body) in &turns {
        let json = Some(("application/json", body.to_vec()));
        let (status, _, response) = send(&app, "POST", uri, &json, &[]).await;
        assert_eq!(status, 503, "{uri}: {}", String::from_utf8_lossy(&response));
    }
    drop(held);
    assert_eq!(state.admission.in_flight(), 0);
    for (uri, body) in &turns {
        let text = Some(("text/plain", body.to_vec()));
        let (status, _, response) = send(&app, "POST", uri, &text, &[]).await;
        assert_eq!(status, 415, "{uri}: {}", String::from_utf8_lossy(&response));
    }
}

/// The stored-state routes that take a body need JSON, however the path is
/// spelled: a form on another origin cannot make or fill a conversation or
/// run a count (the gate judges the path the router matches).
#[actix_web::test]
async fn the_conversation_count_and_mcp_routes_need_json_in_every_spelling() {
    let install = tempfile::tempdir().unwrap();
    let state = app_state(AccessConfig::default(), LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    for uri in [
        "/v1/conversations",
        "/v1/conversation%73",
        "/v1/conversations/conv_x",
        "/v1/conversations/conv_x/item%73",
        "/v1/responses/input_tokens",
        "/v1/responses/input_token%73",
        "/v1/responses/compact",
        "/v1/responses/compac%74",
        "/mcp",
        "/mc%70",
    ] {
        let form = Some(("application/x-www-form-urlencoded", b"items=x".to_vec()));
        let (status, _, response) = send(&app, "POST", uri, &form, &[]).await;
        assert_eq!(status, 415, "{uri}: {}", String::from_utf8_lossy(&response));
    }
}

/// The WebSocket mode of `/v1/responses` is a GET, but its socket runs
/// turns, and a browser lets any page open one: a handshake from another
/// site's page is refused, however the path is spelled, and one from a
/// client that is no browser page goes through.
/// Anthropic's dialect of `/v1/skills` is picked by a header after the
/// gate has judged the path: the header changes the shapes, never who may
/// install or delete.
#[actix_web::test]
async fn anthropics_headers_do_not_open_the_skills_api_to_a_user_key() {
    let install = tempfile::tempdir().unwrap();
    let state = app_state(keyed(), LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let dialect = [("anthropic-version", "2023-06-01"), ("anthropic-beta", "skills-2025-10-02")];
    for (method, uri, body) in [
        ("POST", "/v1/skills?beta=true", Some(("multipart", Vec::new()))),
        ("POST", "/v1/skills/demo/versions?beta=true", Some(("multipart", Vec::new()))),
        ("DELETE", "/v1/skills/demo?beta=true", None),
        ("DELETE", "/v1/skills/demo/versions/1?beta=true", None),
    ] {
        let headers = [&dialect[..], &[("x-api-key", USER_KEY)]].concat();
        let (status, _, response) = send(&app, method, uri, &body, &headers).await;
        assert_eq!(status, 403, "{method} {uri}: {}", String::from_utf8_lossy(&response));
        let (status, _, _) = send(&app, method, uri, &body, &dialect).await;
        assert_eq!(status, 401, "{method} {uri}");
    }
    let (status, _, listed) =
        send(&app, "GET", "/v1/skills?beta=true", &None, &[&dialect[..], &[("x-api-key", USER_KEY)]].concat()).await;
    assert_eq!(status, 200);
    // A user key reads the list, in Anthropic's shape.
    let listed: Value = serde_json::from_slice(&listed).unwrap();
    assert!(listed["has_more"].is_boolean() && listed.get("object").is_none(), "{listed}");
}

#[actix_web::test]
async fn a_page_on_another_site_cannot_open_a_responses_socket() {
    let install = tempfile::tempdir().unwrap();
    let state = app_state(AccessConfig::default(), LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state).configure(configure)).await;
    let handshake = [
        ("upgrade", "websocket"),
        ("connection", "upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    for uri in ["/v1/responses", "/v1/respon%73es"] {
        let (status, _, _) = send(&app, "GET", uri, &None, &handshake).await;
        assert_eq!(status, 101, "{uri}: a client that is no page");
        let from_page = [&handshake[..], &[("origin", "http://attacker.example")]].concat();
        let (status, _, body) = send(&app, "GET", uri, &None, &from_page).await;
        assert_eq!(status, 403, "{uri}: {}", String::from_utf8_lossy(&body));
        let cross_site = [&handshake[..], &[("sec-fetch-site", "cross-site")]].concat();
        let (status, _, _) = send(&app, "GET", uri, &None, &cross_site).await;
        assert_eq!(status, 403, "{uri}");
        // Whatever the upgrade is spelled as, the guard is the same.
        let odd = [("upgrade", "WebSocket"), ("origin", "http://attacker.example")];
        let (status, _, _) = send(&app, "GET", uri, &None, &odd).await;
        assert_eq!(status, 403, "{uri}");
    }
}

/// A Web UI conversation belongs to the key that opened it: another valid
/// key naming its id starts a conversation of its own and cannot close it.
#[actix_web::test]
async fn a_conversation_belongs_to_the_key_that_opened_it() {
    const OTHER_USER_KEY: &str = "sk-user-2";
    let install = tempfile::tempdir().unwrap();
    let access = AccessConfig { api_keys: vec![USER_KEY.into(), OTHER_USER_KEY.into()], ..keyed() };
    let state = app_state(access, LOOPBACK, Admission::default(), install.path()).await;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let chat = |key: &'static str, conversation: Option<String>| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}]});
        if let Some(id) = conversation {
            body["conversationId"] = json!(id);
        }
        (key, body.to_string().into_bytes())
    };
    let conversation_of = |body: &[u8]| -> String {
        let text = String::from_utf8_lossy(body);
        let done = crate::http::test_server::web_frames(text.as_bytes()).pop().unwrap();
        done["conversationId"].as_str().unwrap().to_string()
    };
    let ask = |(key, body): (&'static str, Vec<u8>)| {
        let auth = format!("Bearer {key}");
        let app = &app;
        async move {
            let (status, _, reply) =
                send(app, "POST", "/api/chat", &Some(("application/json", body)), &[("authorization", &auth)]).await;
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
            conversation_of(&reply)
        }
    };
    let mine = ask(chat(USER_KEY, None)).await;
    assert_eq!(ask(chat(USER_KEY, Some(mine.clone()))).await, mine, "the opener continues it");
    let theirs = ask(chat(OTHER_USER_KEY, Some(mine.clone()))).await;
    assert_ne!(theirs, mine, "another key got the opener's conversation");
    let close = |key: &'static str| {
        let auth = format!("Bearer {key}");
        let uri = format!("/api/conversations/{mine}");
        let app = &app;
        async move {
            let (status, _, body) = send(app, "DELETE", &uri, &None, &[("authorization", &auth)]).await;
            assert_eq!(status, 200);
            serde_json::from_slice::<Value>(&body).unwrap()["closed"].clone()
        }
    };
    // Nor can another key list it, read it, re-read its events or stop it.
    let other = format!("Bearer {OTHER_USER_KEY}");
    let (_, _, listed) = send(&app, "GET", "/api/conversations", &None, &[("authorization", &other)]).await;
    assert!(!String::from_utf8_lossy(&listed).contains(&mine), "another key lists the opener's conversation");
    for uri in [format!("/api/conversations/{mine}"), format!("/api/conversations/{mine}/events")] {
        let (status, _, _) = send(&app, "GET", &uri, &None, &[("authorization", &other)]).await;
        assert_eq!(status, 404, "{uri}");
    }
    let stop = format!("/api/conversations/{mine}/turn");
    let (_, _, stopped) = send(&app, "DELETE", &stop, &None, &[("authorization", &other)]).await;
    assert_eq!(serde_json::from_slice::<Value>(&stopped).unwrap(), json!({"stopped": false}));
    let mine_auth = format!("Bearer {USER_KEY}");
    let (status, _, _) =
        send(&app, "GET", &format!("/api/conversations/{mine}"), &None, &[("authorization", &mine_auth)]).await;
    assert_eq!(status, 200);
    assert_eq!(close(OTHER_USER_KEY).await, json!(false));
    assert_eq!(close(USER_KEY).await, json!(true));
}
