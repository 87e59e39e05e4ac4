//! Installed skills' versions over HTTP, on the scripted model: the
//! history and its cap, rollback and its refusals, and a turn that keeps
//! reading the version it started with while the skill is overwritten and
//! deleted under it.

use std::path::Path;
use std::time::{Duration, Instant};

use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::model::scripted::{Gate, ScriptedOutput};
use skillhost_actors::skills::{Origin, Root, SkillsConfig};

use crate::http::test_server::{skills_config, upload_request, TestServer};
use crate::http::{configure, AppState};

/// An archive of the skill `demo` whose notes say `notes`.
fn archive(notes: &str) -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    zip.start_file("demo/SKILL.md", options).unwrap();
    zip.write_all(b"---\nname: demo\ndescription: A skill with versions.\n---\nRead notes.md.\n").unwrap();
    zip.start_file("demo/notes.md", options).unwrap();
    zip.write_all(notes.as_bytes()).unwrap();
    zip.finish().unwrap().into_inner()
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

fn upload(archive: &[u8]) -> actix_http::Request {
    upload_request("/api/skills?overwrite=true", archive)
}

fn skills(install: &Path, discovered: &Path, keep_versions: usize) -> SkillsConfig {
    let roots = vec![
        Root { path: install.to_path_buf(), origin: Origin::Installed },
        Root { path: discovered.to_path_buf(), origin: Origin::Discovered },
    ];
    SkillsConfig { keep_versions, ..skills_config(roots, Some(install.to_path_buf()), Vec::new()) }
}

fn call(name: &str, arguments: Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": arguments}))
}

async fn notes(
    app: &impl actix_web::dev::Service<
        actix_http::Request,
        Response = actix_web::dev::ServiceResponse,
        Error = actix_web::Error,
    >,
) -> String {
    let request = test::TestRequest::get().uri("/api/skills/demo/files/notes.md").to_request();
    String::from_utf8(test::call_and_read_body(app, request).await.to_vec()).unwrap()
}

fn rollback(body: Value) -> actix_http::Request {
    test::TestRequest::post().uri("/api/skills/demo/rollback").set_json(body).to_request()
}

#[actix_web::test]
async fn installs_keep_their_versions_up_to_the_cap_and_roll_back() {
    let (install, discovered) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let local = discovered.path().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("SKILL.md"), "---\nname: local\ndescription: Found on disk.\n---\nBody.\n").unwrap();
    let running = TestServer::scripted(Vec::<String>::new())
        .skills(skills(install.path(), discovered.path(), 2))
        .start()
        .await
        .unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let archives: Vec<Vec<u8>> = (1..=4).map(|n| archive(&format!("version {n}"))).collect();
    for archive in &archives {
        assert_eq!(test::call_service(&app, upload(archive)).await.status(), 201);
    }
    assert_eq!(notes(&app).await, "version 4");

    // Two previous versions are kept: 1 left when 4 came.
    let listed: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/skills/demo/versions").to_request())
            .await;
    assert_eq!(listed["current"], 4);
    let versions = listed["versions"].as_array().unwrap();
    assert_eq!(versions.iter().map(|v| v["version"].as_u64().unwrap()).collect::<Vec<_>>(), [4, 3, 2]);
    for (version, archive) in versions.iter().zip(archives.iter().rev()) {
        assert_eq!(version["digest"], sha256(archive), "{listed}");
        assert_eq!(version["current"], version["version"] == 4);
        assert!(version["bytes"].as_u64().unwrap() > 0 && version["installed_at"].is_string());
    }

    // Back one, then to a named version; the live files follow.
    let back: Value = test::call_and_read_body_json(&app, rollback(json!({}))).await;
    assert_eq!(back, json!({"id": "demo", "current": 3}));
    assert_eq!(notes(&app).await, "version 3");
    let named: Value = test::call_and_read_body_json(&app, rollback(json!({"version": 2}))).await;
    assert_eq!(named["current"], 2);
    assert_eq!(notes(&app).await, "version 2");

    // What cannot be done says why.
    let refusals = [
        (rollback(json!({})), 409, "the skill 'demo' has no version before 2 to roll back to; its versions: 4, 3, 2"),
        (rollback(json!({"version": 1})), 404, "the skill 'demo' has no version 1; its versions: 4, 3, 2"),
        (
            test::TestRequest::post().uri("/api/skills/local/rollback").set_json(json!({})).to_request(),
            403,
            "was discovered in",
        ),
        (
            test::TestRequest::post().uri("/api/skills/nope/rollback").set_json(json!({})).to_request(),
            404,
            "no skill named 'nope' is registered",
        ),
        (rollback(json!({"version": "two"})), 400, "version"),
        (rollback(json!({"to": 2})), 400, "unknown field `to`"),
        (
            test::TestRequest::get().uri("/api/skills/local/versions").to_request(),
            404,
            "only installed skills have versions",
        ),
        (test::TestRequest::delete().uri("/api/skills/demo/versions").to_request(), 405, "does not accept DELETE"),
    ];
    for (request, status, sentence) in refusals {
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status(), status, "{sentence}");
        let body: Value = test::read_body_json(response).await;
        assert!(body["error"].as_str().unwrap_or_default().contains(sentence), "{body}");
    }
    // A new install goes past every number used, and the live one before
    // it stays in the history.
    assert_eq!(test::call_service(&app, upload(&archive("version 5"))).await.status(), 201);
    let listed: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/skills/demo/versions").to_request())
            .await;
    let numbers: Vec<u64> =
        listed["versions"].as_array().unwrap().iter().map(|v| v["version"].as_u64().unwrap()).collect();
    assert_eq!((listed["current"].as_u64(), numbers), (Some(5), vec![5, 4, 3]));
}

/// Waits until `done` holds (a bound, never a timing claim).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_web::test]
async fn a_turn_reads_the_version_it_started_with_while_the_skill_is_replaced_and_deleted() {
    let (install, discovered) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The model's first round waits until the skill changed under the turn.
    let gate = Gate::closed();
    let read = ScriptedOutput {
        gate: Some(gate.clone()),
        ..ScriptedOutput::from(call("skills_read", json!({"skill": "demo", "path": "notes.md"})))
    };
    let running = TestServer::scripted(vec![read, ScriptedOutput::from("Done.")])
        .skills(skills(install.path(), discovered.path(), 5))
        .start()
        .await
        .unwrap();
    let (state, backend): (web::Data<AppState>, _) = (running.state, running.backend.unwrap());
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    assert_eq!(test::call_service(&app, upload(&archive("the first notes"))).await.status(), 201);

    let ask = json!({"messages": [{"role": "user", "content": "Read the notes."}], "skills": ["demo"]});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(ask).to_request();
    let turn = test::call_service(&app, request);
    let changes = async {
        until("the turn started", || backend.prompts().len() == 1).await;
        // Replaced, then deleted, while the turn runs.
        assert_eq!(test::call_service(&app, upload(&archive("the second notes"))).await.status(), 201);
        assert_eq!(notes(&app).await, "the second notes");
        let delete = test::TestRequest::delete().uri("/api/skills/demo").to_request();
        assert_eq!(test::call_service(&app, delete).await.status(), 200);
        gate.open();
    };
    let (response, ()) = futures_util::join!(turn, changes);
    assert_eq!(response.status(), 200);
    let prompts = backend.prompts();
    let result = prompts.last().unwrap();
    assert!(result.contains("the first notes") && !result.contains("the second notes"), "{result}");

    // Once the turn let go, the next registry change removes both folders.
    let versions = install.path().join(".versions/demo");
    let rescan = || test::TestRequest::post().uri("/api/skills/rescan").to_request();
    let deadline = Instant::now() + Duration::from_secs(20);
    while versions.exists() {
        assert!(Instant::now() < deadline, "the retired versions stayed: {versions:?}");
        assert_eq!(test::call_service(&app, rescan()).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(std::fs::symlink_metadata(install.path().join("demo")).is_err());
}
