//! Skills selected as the hosted APIs select them, on the scripted model:
//! a Responses `shell` tool's `skill_reference` and inline ZIP, Messages'
//! `container.skills` (by id, and inline), and a 400 naming each field where this server's
//! model differs.

use actix_web::{test, App};
use base64::Engine;
use serde_json::{json, Value};
use skillhost_actors::model::scripted::ScriptedOutput;

use crate::http::configure;
use crate::http::test_server::{install_only, upload_request, TestServer};

fn call(name: &str, arguments: Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": arguments}))
}

fn zip(files: &[(&str, &str)]) -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, text) in files {
        zip.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(text.as_bytes()).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn skill_md(name: &str) -> String {
    format!("---\nname: {name}\ndescription: Does {name} things.\n---\nRead notes.md.\n")
}

const SELECTED: &str = "### Skills selected for this conversation\n";

#[actix_web::test]
async fn a_shell_tool_and_a_container_select_skills_and_bring_one_inline() {
    let install = tempfile::tempdir().unwrap();
    let read = |skill: &str| ScriptedOutput::from(call("skills_read", json!({"skill": skill, "path": "notes.md"})));
    let running = TestServer::scripted(vec![
        read("haiku"),
        ScriptedOutput::from("Done."),
        read("repo-style"),
        ScriptedOutput::from("Done."),
        ScriptedOutput::from("Done."),
        read("repo-style"),
        ScriptedOutput::from("Done."),
    ])
    .skills(install_only(install.path()))
    .start()
    .await
    .unwrap();
    let backend = running.backend.clone().unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    for notes in ["first", "second"] {
        let archive = zip(&[("haiku/SKILL.md", &skill_md("haiku")), ("haiku/notes.md", notes)]);
        let upload = upload_request("/api/skills?overwrite=true", &archive);
        assert_eq!(test::call_service(&app, upload).await.status(), 201);
    }

    // A skill_reference at the default version selects the skill.
    let shell = |skills: Value| json!({"type": "shell", "environment": {"type": "container_auto", "skills": skills}});
    let reference = json!([{"type": "skill_reference", "skill_id": "haiku", "version": "2"}]);
    let body = json!({"input": "Write one.", "tools": [shell(reference)]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/responses").set_json(body).to_request()).await;
    assert_eq!(response.status(), 200);
    let prompts = backend.prompts();
    assert!(prompts[0].contains(&format!("{SELECTED}- haiku: ")), "{}", prompts[0]);
    assert!(prompts[1].contains("second"), "{}", prompts[1]);

    // An inline ZIP is brought for this request alone.
    let data = base64::engine::general_purpose::STANDARD
        .encode(zip(&[("repo-style/SKILL.md", &skill_md("repo-style")), ("repo-style/notes.md", "Tabs.")]));
    let inline = json!([{"type": "inline", "name": "repo-style", "description": "House style.",
        "source": {"type": "base64", "media_type": "application/zip", "data": data}}]);
    let body = json!({"input": "Check it.", "tools": [shell(inline.clone())]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/responses").set_json(body).to_request()).await;
    assert_eq!(response.status(), 200);
    let prompts = backend.prompts();
    assert!(prompts[2].contains(&format!("{SELECTED}- repo-style: ")), "{}", prompts[2]);
    assert!(prompts[3].contains("Tabs."), "{}", prompts[3]);

    // Messages: container.skills, by id and "latest".
    let body = json!({"max_tokens": 16, "messages": [{"role": "user", "content": "Write one."}],
        "container": {"skills": [{"type": "custom", "skill_id": "haiku", "version": "latest"}]}});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/messages").set_json(body).to_request()).await;
    assert_eq!(response.status(), 200);
    let last = backend.prompts().last().unwrap().clone();
    assert!(last.contains(&format!("{SELECTED}- haiku: ")), "{last}");

    // Messages: the Responses inline form in container.skills.
    let body = json!({"max_tokens": 16, "messages": [{"role": "user", "content": "Check it."}],
        "container": {"skills": inline}});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/messages").set_json(body).to_request()).await;
    assert_eq!(response.status(), 200);
    let prompts = backend.prompts();
    assert!(prompts[5].contains(&format!("{SELECTED}- repo-style: ")), "{}", prompts[5]);
    assert!(prompts[6].contains("Tabs."), "{}", prompts[6]);
    // Brought for that request alone.
    let listed = test::call_service(&app, test::TestRequest::get().uri("/api/skills").to_request()).await;
    let listed: Value = test::read_body_json(listed).await;
    assert!(!listed.to_string().contains("repo-style"), "{listed}");
}

#[actix_web::test]
async fn where_the_models_differ_a_400_names_the_field() {
    let install = tempfile::tempdir().unwrap();
    let running =
        TestServer::scripted(Vec::<String>::new()).skills(install_only(install.path())).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    for notes in ["first", "second"] {
        let archive = zip(&[("haiku/SKILL.md", &skill_md("haiku")), ("haiku/notes.md", notes)]);
        assert_eq!(
            test::call_service(&app, upload_request("/api/skills?overwrite=true", &archive)).await.status(),
            201
        );
    }
    let shell = |environment: Value| json!({"input": "x", "tools": [{"type": "shell", "environment": environment}]});
    let messages = |container: Value| json!({"max_tokens": 16, "messages": [{"role": "user", "content": "x"}], "container": container});
    let cases = [
        (
            "/v1/responses",
            shell(json!({"type": "container_auto", "skills": [{"type": "skill_reference", "skill_id": "haiku", "version": "1"}]})),
            "tools[0].environment.skills[0].version",
            "'tools[0].environment.skills[0].version' asks for version 1 of 'haiku', but a turn here runs a skill's default version (2); make 1 the default with POST /v1/skills/haiku, or send 'latest'",
        ),
        (
            "/v1/responses",
            shell(json!({"type": "container_reference", "container_id": "cntr_1"})),
            "tools[0].environment",
            "",
        ),
        (
            "/v1/responses",
            shell(json!({"type": "container_auto", "network_policy": {"type": "disabled"}})),
            "tools[0].environment.network_policy",
            "",
        ),
        (
            "/v1/responses",
            shell(json!({"type": "container_auto", "skills": [{"type": "inline", "name": "x", "description": "d",
                "source": {"type": "base64", "media_type": "application/zip", "data": "not base64!"}}]})),
            "tools[0].environment.skills[0].source.data",
            "",
        ),
        (
            "/v1/responses",
            shell(json!({"type": "container_auto", "skills": [{"type": "inline", "name": "x", "description": "d",
                "source": {"type": "base64", "media_type": "application/zip", "data": base64::engine::general_purpose::STANDARD
                    .encode(zip(&[("SKILL.md", &skill_md("x")), ("../up.md", "x")]))}}]})),
            "skills_inline",
            "climbs out of the skill folder",
        ),
        ("/v1/messages", messages(json!("cntr_1")), "", ""),
        (
            "/v1/messages",
            messages(json!({"skills": [{"type": "custom", "skill_id": "haiku", "version": "1"}]})),
            "",
            "'container.skills[0].version' asks for version 1 of 'haiku', but a turn here runs a skill's default version (2); make 1 the default with POST /v1/skills/haiku, or send 'latest'",
        ),
        ("/v1/messages", messages(json!({"skills": [{"type": "builtin", "skill_id": "haiku"}]})), "", ""),
        (
            "/v1/messages",
            messages(json!({"skills": [{"type": "inline", "name": "x", "source": {"type": "url", "url": "https://x"}}]})),
            "",
            "'container.skills[0].source' must be",
        ),
    ];
    for (uri, body, param, message) in cases {
        let response = test::call_service(&app, test::TestRequest::post().uri(uri).set_json(&body).to_request()).await;
        assert_eq!(response.status(), 400, "{body}");
        let answer: Value = test::read_body_json(response).await;
        let said = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(!said.is_empty(), "{answer}");
        if !param.is_empty() {
            assert_eq!(answer["error"]["param"], param, "{answer}");
        }
        assert!(said.contains(message), "{said}");
    }
}
