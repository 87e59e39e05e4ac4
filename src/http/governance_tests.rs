//! Skill governance and outcomes over HTTP with the scripted model: what the
//! skills API says of `disable-model-invocation`, `user-invocable` and
//! `argument-hint`, per-skill outcomes on `/metrics` and
//! `GET /api/skills/{id}`, and `--skill` selecting for requests that name none.

use std::path::Path;

use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::chat_loop::{LoopSettings, MultiAgent};
use skillhost_actors::skills::{Origin, Root};

use crate::http::test_server::{skills_config, TestServer};
use crate::http::{configure, AppState};
use crate::setup::StartupError;
use skillhost_actors::StartError;

fn write_skill(root: &Path, name: &str, frontmatter: &str) {
    std::fs::create_dir_all(root.join(name)).unwrap();
    std::fs::write(
        root.join(name).join("SKILL.md"),
        format!("---\nname: {name}\ndescription: The {name} skill. Use for {name} work.\n{frontmatter}---\n# {name}\nDo it well.\n"),
    )
    .unwrap();
}

fn registry() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_skill(dir.path(), "deploy", "disable-model-invocation: true\nargument-hint: \"[env]\"\n");
    write_skill(dir.path(), "background", "user-invocable: false\n");
    write_skill(dir.path(), "notes", "");
    dir
}

async fn start(root: &Path, selected: Vec<String>, outputs: Vec<&str>) -> Result<web::Data<AppState>, StartupError> {
    let roots = vec![Root { path: root.to_path_buf(), origin: Origin::Discovered }];
    let settings = LoopSettings { multi_agent: MultiAgent::Off, ..LoopSettings::default() };
    let server =
        TestServer::scripted(outputs.into_iter().map(str::to_string)).skills(skills_config(roots, None, selected));
    Ok(server.settings(settings).start().await?.state)
}

const READ_NOTES: &str =
    "<tool_call>\n{\"name\": \"skills_read\", \"arguments\": {\"skill\": \"notes\"}}\n</tool_call>";

#[actix_web::test]
async fn the_api_marks_governance_keys_and_counts_outcomes_by_surface() {
    let dir = registry();
    let state = start(dir.path(), Vec::new(), vec![READ_NOTES, "Done.", READ_NOTES, "Also done."]).await.unwrap();
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;

    let listing: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/skills").to_request()).await;
    let skill = |id: &str| listing["skills"].as_array().unwrap().iter().find(|s| s["id"] == id).unwrap().clone();
    assert_eq!(skill("deploy")["explicit_only"], true);
    assert_eq!(skill("deploy")["argument_hint"], "[env]");
    assert_eq!(skill("background")["user_invocable"], false);
    assert_eq!(skill("notes")["explicit_only"], false);
    assert_eq!(skill("notes")["outcomes"]["read"], 0);

    for (uri, body) in [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Notes."}]})),
        ("/api/chat/ollama", json!({"messages": [{"role": "user", "content": "Notes."}], "stream": false})),
    ] {
        let response = test::call_service(&app, test::TestRequest::post().uri(uri).set_json(body).to_request()).await;
        assert!(response.status().is_success(), "{uri}: {}", response.status());
        let _ = test::read_body(response).await;
    }

    let notes: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/skills/notes").to_request()).await;
    let outcomes = &notes["outcomes"];
    // Each request advertised every model-invocable skill and read one.
    assert_eq!(
        (outcomes["advertised"].as_u64(), outcomes["read"].as_u64(), outcomes["answer"].as_u64()),
        (Some(2), Some(2), Some(2)),
        "{outcomes}"
    );
    assert_eq!(outcomes["by_surface"]["openai"]["read"], 1, "{outcomes}");
    assert_eq!(outcomes["by_surface"]["ollama"]["answer"], 1, "{outcomes}");
    let deploy: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/skills/deploy").to_request()).await;
    assert_eq!(deploy["outcomes"]["advertised"], 0, "an explicit-only skill is never advertised unselected");

    let metrics = String::from_utf8(
        test::call_and_read_body(&app, test::TestRequest::get().uri("/metrics").to_request()).await.to_vec(),
    )
    .unwrap();
    for line in [
        "skillhost_skill_events_total{event=\"read\",skill=\"notes\",surface=\"openai\"} 1",
        "skillhost_skill_events_total{event=\"advertised\",skill=\"background\",surface=\"ollama\"} 1",
        "skillhost_skill_turn_outcomes_total{outcome=\"answer\",skill=\"notes\",surface=\"ollama\"} 1",
        "skillhost_skill_turn_outcomes_total{outcome=\"error\",skill=\"notes\",surface=\"openai\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} is missing from:\n{metrics}");
    }
    state.server.shutdown();
}

#[actix_web::test]
async fn a_default_selection_applies_to_requests_that_name_none_and_must_exist() {
    let dir = registry();
    let refused = start(dir.path(), vec!["nope".into()], vec![]).await.err().unwrap();
    assert_eq!(refused.to_string(), "--skill nope: no such skill is registered; available: background, deploy, notes");
    assert!(matches!(refused, StartupError::Actors(StartError::UnknownSkills { .. })), "{refused:?}");

    let read_deploy = "<tool_call>\n{\"name\": \"skills_read\", \"arguments\": {\"skill\": \"deploy\"}}\n</tool_call>";
    let state = start(dir.path(), vec!["deploy".into()], vec![read_deploy, "Deployed.", read_deploy, "Not here."])
        .await
        .unwrap();
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let ask = |skills: Option<Vec<&str>>| {
        let mut body = json!({"messages": [{"role": "user", "content": "Deploy."}]});
        if let Some(skills) = skills {
            body["skills"] = json!(skills);
        }
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request()
    };
    // Selected by the operator, the explicit-only skill is readable.
    let answer: Value = test::call_and_read_body_json(&app, ask(None)).await;
    assert_eq!(answer["choices"][0]["message"]["content"], "Deployed.", "{answer}");
    // A request that names its own selection replaces the default, and the
    // explicit-only skill is out of reach again.
    let answer: Value = test::call_and_read_body_json(&app, ask(Some(vec!["notes"]))).await;
    assert_eq!(answer["choices"][0]["message"]["content"], "Not here.", "{answer}");
    let deploy: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/skills/deploy").to_request()).await;
    assert_eq!(deploy["selected_by_default"], true);
    assert_eq!(
        (deploy["outcomes"]["read"].as_u64(), deploy["outcomes"]["answer"].as_u64()),
        (Some(1), Some(1)),
        "{deploy}"
    );
    state.server.shutdown();
}
