//! Code execution end to end over HTTP, with a scripted model and the real
//! sandbox: write a failing test, run it, patch the code, run it green, in
//! one request; the produced file is downloadable; the workspace is gone
//! when the response ends, also when the client leaves mid-command.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{test, web, App};
use serde_json::{json, Value};
use skillhost_actors::chat_loop::LoopSettings;
use skillhost_actors::model::scripted::{ScriptedBackend, ScriptedOutput};
use skillhost_actors::sandbox::launch::SandboxMode;

use crate::http::test_server::TestServer;
use crate::http::{configure, AppState};

pub(super) fn call(name: &str, arguments: Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": arguments}))
}

/// A started server on the scripted model with the real sandbox.
pub(super) struct Harness {
    pub(super) state: web::Data<AppState>,
    pub(super) backend: Arc<ScriptedBackend>,
    pub(super) base: tempfile::TempDir,
}

/// Starts `server`, which runs the scripted model with the sandbox.
pub(super) async fn start(server: TestServer) -> Harness {
    let running = server.start().await.unwrap();
    Harness {
        state: running.state,
        backend: running.backend.expect("a scripted model"),
        base: running.base.expect("the sandbox"),
    }
}

/// A code turn's settings: 24 rounds, as `--code-exec` sets.
pub(super) fn code_settings() -> LoopSettings {
    LoopSettings { max_rounds: 24, ..LoopSettings::default() }
}

/// The scripted model writing `outputs`, with the code tools.
pub(super) async fn harness(outputs: Vec<String>) -> Harness {
    start(TestServer::scripted(outputs).code_exec().settings(code_settings())).await
}

/// One non-streamed chat request of `content` to the harness's server.
pub(super) async fn ask(harness: &Harness, content: &str) -> Value {
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": content}]});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    test::call_and_read_body_json(&app, request).await
}

pub(super) fn workspaces(base: &Path) -> usize {
    std::fs::read_dir(base.join("workspaces")).unwrap().count()
}

#[actix_web::test]
async fn write_fail_patch_rerun_green_in_one_request() {
    let outputs = vec![
        call("write_file", json!({"path": "calc.py", "content": "def add(a, b):\n    return a - b\n"})),
        call(
            "write_file",
            json!({"path": "test_calc.py", "content": "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('all green')\n"}),
        ),
        call("shell", json!({"command": "python test_calc.py"})),
        call(
            "apply_patch",
            json!({"input": "*** Begin Patch\n*** Update File: calc.py\n def add(a, b):\n-    return a - b\n+    return a + b\n*** End Patch\n"}),
        ),
        call("shell", json!({"command": "python test_calc.py"})),
        "Fixed: add now adds, and the test passes.".to_string(),
    ];
    let harness = harness(outputs).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Write add() with a test and make it pass."}], "temperature": 0});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let response: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(response["choices"][0]["message"]["content"], "Fixed: add now adds, and the test passes.", "{response}");
    assert_eq!(response["rounds"].as_array().unwrap().len(), 6);

    let prompts = harness.backend.prompts();
    let last = prompts.last().unwrap();
    // The failing run, with the traceback and exit status, then the green one.
    assert!(last.contains("AssertionError: -1"), "{last}");
    assert!(last.contains("[exit status 1]"));
    assert!(last.contains("  updated calc.py"));
    assert!(last.contains("Syntax check of calc.py: ok"));
    assert!(last.contains("all green\n[exit status 0]"), "{last}");
    // Paths in output are relative, never the host's workspace path.
    assert!(!last.contains(harness.base.path().to_str().unwrap()), "a host path leaked into the prompt");
    // The shell's declaration says what this host gives a command.
    assert!(last.contains("- shell: Run a bash command in the working folder, sandboxed and offline."), "{last}");

    let artifacts = response["artifacts"].as_array().unwrap();
    let calc = artifacts.iter().find(|a| a["path"] == "calc.py").unwrap();
    let download =
        test::call_service(&app, test::TestRequest::get().uri(calc["url"].as_str().unwrap()).to_request()).await;
    assert_eq!(download.status().as_u16(), 200);
    assert_eq!(download.headers().get("x-content-type-options").unwrap(), "nosniff");
    assert!(download.headers().get("content-disposition").unwrap().to_str().unwrap().starts_with("attachment"));
    assert_eq!(test::read_body(download).await, "def add(a, b):\n    return a + b\n");
    let run_id = calc["url"].as_str().unwrap().split('/').nth(4).unwrap().to_string();
    let listing: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::get().uri(&format!("/api/code/artifacts/{run_id}")).to_request(),
    )
    .await;
    assert_eq!(listing["files"].as_array().unwrap().len(), 2, "{listing}");
    // The request's workspace is gone with the response.
    assert_eq!(workspaces(harness.base.path()), 0);
}

/// File names that would end or escape a link's path: each artifact's link
/// leads to that file and no other, and its download names it exactly.
#[actix_web::test]
async fn an_artifacts_link_leads_to_its_own_file_whatever_its_name() {
    let names =
        ["a?b#c.txt", "50%.txt", "%41.txt", "c++ notes.txt", "r\u{e9}sum\u{e9}.txt", "q\"uote.txt", "sub/x?y=1"];
    let mut outputs: Vec<String> = names
        .iter()
        .map(|name| call("write_file", json!({"path": name, "content": format!("content of {name}")})))
        .collect();
    outputs.push("written".into());
    let harness = harness(outputs).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Write the files."}]});
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let response: Value = test::call_and_read_body_json(&app, request).await;
    let artifacts = response["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), names.len(), "{response}");
    for name in names {
        let artifact = artifacts.iter().find(|a| a["path"] == name).unwrap_or_else(|| panic!("{name}: {response}"));
        let url = artifact["url"].as_str().unwrap();
        let (path, _) = url.split_at(url.find(['?', '#']).unwrap_or(url.len()));
        assert_eq!(path, url, "{name}: the link has a query or fragment");
        let download = test::call_service(&app, test::TestRequest::get().uri(url).to_request()).await;
        assert_eq!(download.status().as_u16(), 200, "{name}: {url}");
        let disposition = download.headers().get("content-disposition").unwrap().to_str().unwrap().to_string();
        assert!(disposition.starts_with("attachment; filename=\""), "{disposition}");
        let leaf = name.rsplit('/').next().unwrap();
        let exact = disposition.split("filename*=UTF-8''").nth(1).unwrap_or_else(|| panic!("{disposition}"));
        assert_eq!(percent_encoding::percent_decode_str(exact).decode_utf8().unwrap(), leaf, "{disposition}");
        assert_eq!(test::read_body(download).await, format!("content of {name}"), "{name}: {url}");
    }
}

#[actix_web::test]
async fn shell_recoveries_and_state_across_calls() {
    let outputs = vec![
        call("shell", json!({"command": "mkdir -p sub && cd sub && export GREETING=hello && echo made > f.txt"})),
        call("shell", json!({"command": "pwd && echo $GREETING && cat f.txt"})),
        call("shell", json!({"command": "grep nothing-here f.txt"})),
        call("shell", json!({"command": "cat missing.txt"})),
        call("shell", json!({"command": "cat missing.txt"})),
        call("shell", json!({"command": "python -c 'print(6*7)'"})),
        call("shell", json!({"command": "sleep 30", "timeout_ms": 1000})),
        // `/`, not `/tmp`: the sandbox shows /tmp only where the test's
        // TMPDIR lies under it, and a command must leave the folder on
        // every host (with TMPDIR=/var/tmp/... `cd /tmp` failed).
        call("shell", json!({"command": "cd /"})),
        call("shell", json!({"command": "rm -f \"$HOME/.skillhost/state.sh\"; exit 0"})),
        "done".to_string(),
    ];
    let harness = harness(outputs).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Try things."}]});
    let _: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request(),
    )
    .await;
    let last = harness.backend.prompts().pop().unwrap();
    // The folder and exports carry over; paths print relative to the workspace.
    assert!(last.contains("$ pwd && echo $GREETING && cat f.txt\n"), "{last}");
    assert!(last.contains("hello\nmade\n[exit status 0]"), "{last}");
    assert!(!last.contains(harness.base.path().to_str().unwrap()));
    // grep finding nothing is an answer.
    assert!(
        last.contains("[exit status 1: grep found nothing or the inputs differ; that is an answer, not an error]"),
        "{last}"
    );
    // The same failure twice is counted.
    assert!(last.contains("This exact command has now failed the same way 2 times"), "{last}");
    // `python` is the host's Python 3.
    assert!(last.contains("42\n[exit status 0]"), "{last}");
    // The deadline kills and says so.
    assert!(last.contains("[killed after 1 s: the command did not finish in time"), "{last}");
    // A move of the working folder is said once; leaving the folder and a
    // lost state are said too.
    assert!(last.contains("made > f.txt\n[exit status 0]\nWorking directory is now sub."), "{last}");
    assert_eq!(last.matches("Working directory is now sub.").count(), 1, "{last}");
    assert!(last.contains("$ cd /\n[exit status 0]\nWorking directory is now the top of the working folder: the command ended outside it"), "{last}");
    assert!(last.contains("[exit status 0]\nThe shell's state was reset"), "{last}");
    assert_eq!(workspaces(harness.base.path()), 0);
}

#[actix_web::test]
async fn a_client_that_leaves_mid_command_takes_its_workspace_along() {
    // An odd duration, so `pgrep` finds this command and no other on the
    // machine (a `sleep 600` elsewhere would match "sleep 60").
    let outputs = vec![call("shell", json!({"command": "echo started; sleep 59.71"})), "never".to_string()];
    let harness = harness(outputs).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Run it."}], "stream": true});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request())
            .await;
    // Wait until the command runs, then drop the response: the client is gone.
    let mut running = false;
    for _ in 0..200 {
        if workspaces(harness.base.path()) == 1
            && !Command::new("pgrep").args(["-x", "-f", "sleep 59.71"]).output().unwrap().stdout.is_empty()
        {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(running, "the command never started, so its end would prove nothing");
    drop(response);
    let mut gone = false;
    for _ in 0..200 {
        let sleeping = Command::new("pgrep").args(["-x", "-f", "sleep 59.71"]).output().unwrap().stdout;
        if workspaces(harness.base.path()) == 0 && sleeping.is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the workspace or the command outlived the client");
}

/// A skill whose scripts report what they were given and where they ran.
pub(super) fn echo_skill(base: &Path) -> PathBuf {
    let skills = base.join("skills");
    let skill = skills.join("echo-args");
    std::fs::create_dir_all(skill.join("scripts")).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: echo-args\ndescription: Prints its arguments as JSON. Use to check quoting.\n---\n# Echo\nRun scripts/show.py with any arguments.\n",
    )
    .unwrap();
    // Prints argv as JSON, tries its own folder (read-only), writes to its cwd.
    std::fs::write(
        skill.join("scripts/show.py"),
        "import json, os, sys\n\
print(json.dumps(sys.argv[1:]))\n\
try:\n    open(os.path.join(os.path.dirname(__file__), 'mark'), 'w')\n    print('own folder: writable')\n\
except OSError:\n    print('own folder: read-only')\n\
open('made.txt', 'w').write('x')\n\
print('cwd holds:', sorted(os.listdir('.')))\n",
    )
    .unwrap();
    // The first line names Python, but the extension decides: bash runs it.
    std::fs::write(skill.join("scripts/which.sh"), "#!/usr/bin/python3\necho \"bash $BASH_VERSION\" | cut -c1-4\n")
        .unwrap();
    std::fs::write(skill.join("scripts/notes.txt"), "not a script\n").unwrap();
    // Writes where the sandbox allows no writes.
    std::fs::write(skill.join("scripts/write-etc.sh"), "echo x > /etc/skillhost-denied-by-a-script\n").unwrap();
    for dir in [&skills, &skill, &skill.join("scripts")] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    skills
}

#[actix_web::test]
async fn skills_run_argument_shapes_refusals_and_scratch_folders() {
    let skills_base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(skills_base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let skills = echo_skill(skills_base.path());
    let run = |args: Value| call("skills_run", json!({"skill": "echo-args", "path": "scripts/show.py", "args": args}));
    let outputs = vec![
        // An array: shell metacharacters are data, nothing parses them.
        run(json!(["a b", "$(id)", "; rm -rf .", "`x`", "> f"])),
        // A JSON array inside a string.
        run(json!("[\"--flag\", \"two words\"]")),
        // A plain string is one argument.
        run(json!("just one")),
        // A string that looks like an array but is not.
        run(json!("[--flag, value")),
        call("skills_run", json!({"skill": "echo-args", "path": "scripts/which.sh"})),
        call("skills_run", json!({"skill": "echo-args", "path": "scripts/notes.txt"})),
        call("skills_run", json!({"skill": "echo-args", "path": "scripts/write-etc.sh"})),
        call("skills_run", json!({"skill": "echo-args", "path": "../../etc/passwd.py"})),
        call("skills_run", json!({"skill": "no-such-skill", "path": "scripts/show.py"})),
        call("skills_run", json!({"skill": "echo-args"})),
        "Done.".to_string(),
    ];
    let harness = start(
        TestServer::scripted(outputs)
            .sandbox(false)
            .skills_root(&skills)
            .settings(LoopSettings { allow_exec: true, ..code_settings() }),
    )
    .await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Use echo-args."}]});
    let response: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request(),
    )
    .await;
    assert_eq!(response["choices"][0]["message"]["content"], "Done.", "{response}");
    let last = harness.backend.prompts().pop().unwrap();
    assert!(last.contains(r#"["a b", "$(id)", "; rm -rf .", "`x`", "> f"]"#), "{last}");
    assert!(last.contains(r#"["--flag", "two words"]"#), "{last}");
    assert!(last.contains(r#"["just one"]"#), "{last}");
    assert!(last.contains("args looks like a JSON array but is not one of strings"), "{last}");
    // The skill folder is read-only; each call starts in an empty scratch
    // folder (no made.txt from the call before).
    assert_eq!(last.matches("own folder: read-only").count(), 3, "{last}");
    assert!(!last.contains("own folder: writable"));
    assert_eq!(last.matches("cwd holds: ['.tmp', 'made.txt']").count(), 3, "{last}");
    assert!(last.contains("[skills_run: scripts/show.py 'a b' '$(id)' '; rm -rf .' '`x`' '> f']"), "{last}");
    assert!(last.contains("[skills_run: scripts/which.sh]\nbash\n"), "{last}");
    assert!(last.contains("bash\n[exit status 0]"), "{last}");
    assert!(last.contains("is not a script skills_run can run"), "{last}");
    // A failure the sandbox caused is named, as for the shell.
    assert!(last.contains("The sandbox refused \"/etc/skillhost-denied-by-a-script\""), "{last}");
    assert!(!Path::new("/etc/skillhost-denied-by-a-script").exists(), "a script wrote outside the sandbox");
    assert!(last.contains("No skill called 'no-such-skill'"), "{last}");
    assert!(last.contains("climbs out of the skill folder"), "{last}");
    assert!(last.contains("Say which script to run"), "{last}");
    assert!(!skills.join("echo-args/scripts/mark").exists());
    // Scratch folders are gone after each call; no request workspace exists.
    assert_eq!(workspaces(harness.base.path()), 0);
}

#[actix_web::test]
async fn skills_run_is_refused_unless_enabled_and_guides_after_a_full_read() {
    let skills_base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(skills_base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let skills = echo_skill(skills_base.path());
    let outputs = vec![
        call("skills_read", json!({"skill": "echo-args"})),
        call("skills_run", json!({"skill": "echo-args", "path": "scripts/show.py"})),
        "Done.".to_string(),
    ];
    // Enabled: the full SKILL.md read ends with a ready skills_run example.
    let harness = start(
        TestServer::scripted(outputs.clone())
            .sandbox(false)
            .skills_root(&skills)
            .settings(LoopSettings { allow_exec: true, ..code_settings() }),
    )
    .await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Use echo-args."}]});
    let _: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body.clone()).to_request(),
    )
    .await;
    let last = harness.backend.prompts().pop().unwrap();
    assert!(last.contains("skills_run(skill=\"echo-args\", path=\"scripts/show.py\""), "{last}");
    assert!(last.contains("[exit status 0]"), "{last}");

    // Not enabled: no skills_run tool, and a call to it is refused.
    let harness =
        start(TestServer::scripted(outputs).sandbox(false).skills_root(&skills).settings(code_settings())).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let reply: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request(),
    )
    .await;
    assert_eq!(reply["choices"][0]["message"]["content"], "Done.", "{reply}");
    let last = harness.backend.prompts().pop().unwrap();
    assert!(!last.contains("- skills_run:"), "skills_run is declared: {last}");
    assert!(last.contains("skills_run is not enabled on this server; read the script with skills_read instead."));
    assert!(!last.contains("[skillhost execution guidance"), "{last}");
    assert!(!last.contains("[exit status"), "{last}");
}

#[actix_web::test]
async fn a_web_ui_conversation_keeps_its_workspace_until_closed() {
    let outputs = vec![
        call("write_file", json!({"path": "plan.txt", "content": "step one\n"})),
        "Saved.".to_string(),
        call("read_file", json!({"path": "plan.txt"})),
        "It says step one.".to_string(),
    ];
    let harness = harness(outputs).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let first = json!({"messages": [{"role": "user", "content": "Save a plan."}], "conversationId": "conv-7"});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/api/chat").set_json(first).to_request()).await;
    let body = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    let frames = crate::http::test_server::web_frames(body.as_bytes());
    // The id is the server's own, not the one the client made up.
    let id = frames.last().unwrap()["conversationId"].as_str().unwrap().to_string();
    assert!(id.starts_with("c-") && id.len() == 34, "{id}");
    let turn = |content: &str| json!({"messages": [{"role": "user", "content": content}], "conversationId": id});
    // The activity frames: writing, then finished with the produced file.
    let progress: Vec<&Value> = frames.iter().filter_map(|f| f.get("tool_progress")).collect();
    assert_eq!(progress[0]["phase"], "writing");
    assert_eq!(progress[0]["detail"], "plan.txt");
    let finished = progress.iter().find(|p| p["phase"] == "finished").unwrap();
    assert_eq!(finished["files"][0]["path"], "plan.txt");
    let url = finished["files"][0]["url"].as_str().unwrap();
    let download = test::call_service(&app, test::TestRequest::get().uri(url).to_request()).await;
    assert_eq!(test::read_body(download).await, "step one\n");
    // The conversation's folder outlives the request.
    assert_eq!(workspaces(harness.base.path()), 1);

    let response = test::call_service(
        &app,
        test::TestRequest::post().uri("/api/chat").set_json(turn("What does the plan say?")).to_request(),
    )
    .await;
    let _ = test::read_body(response).await;
    let last = harness.backend.prompts().pop().unwrap();
    assert!(last.contains("1\tstep one"), "{last}");

    let closed: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::delete().uri(&format!("/api/conversations/{id}")).to_request(),
    )
    .await;
    assert_eq!(closed, json!({"closed": true}));
    assert_eq!(workspaces(harness.base.path()), 0);
}

#[actix_web::test]
async fn a_conversations_files_come_back_after_a_restart_and_its_links_never_do() {
    let state_dir = tempfile::tempdir().unwrap();
    // A command leaves a file, a script, a link to a host file and a FIFO.
    let leave = "mkdir -p out && printf 'step one\\n' > out/plan.txt && printf 'echo ran\\n' > run.sh \
        && chmod +x run.sh && ln -s /etc/passwd passwd-link && mkfifo pipe && echo made";
    let first = vec![call("shell", json!({"command": leave})), "Saved.".to_string()];
    let id = {
        let harness =
            start(TestServer::scripted(first).code_exec().settings(code_settings()).state_dir(state_dir.path())).await;
        let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
        let body = json!({"messages": [{"role": "user", "content": "Save a plan."}]});
        let request = test::TestRequest::post().uri("/api/chat").set_json(body).to_request();
        let text = String::from_utf8(test::call_and_read_body(&app, request).await.to_vec()).unwrap();
        let done = crate::http::test_server::web_frames(text.as_bytes()).pop().unwrap();
        assert_eq!(done["done"], true, "{text}");
        assert!(harness.backend.prompts().last().unwrap().contains("made"));
        done["conversationId"].as_str().unwrap().to_string()
    };
    // Only the regular files were kept.
    let store = crate::http::test_server::open_when_free(state_dir.path()).await.unwrap();
    let kept = store
        .run_here(|conn| {
            let owner: String =
                conn.query_row("SELECT owner FROM webui_conversations WHERE id = ?1", [&id], |row| row.get(0))?;
            skillhost_actors::store::webui::files(conn, &owner, &id)
        })
        .unwrap();
    let paths: Vec<&str> = kept.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["out/plan.txt", "run.sh"]);
    drop(store);

    let second = vec![
        call("shell", json!({"command": "cat out/plan.txt && sh run.sh && stat -c mode=%a run.sh && ls -a"})),
        "It says step one.".to_string(),
    ];
    let harness =
        start(TestServer::scripted(second).code_exec().settings(code_settings()).state_dir(state_dir.path())).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({
        "messages": [
            {"role": "user", "content": "Save a plan."},
            {"role": "assistant", "content": "Saved."},
            {"role": "user", "content": "What does it say?"},
        ],
        "conversationId": id,
    });
    let request = test::TestRequest::post().uri("/api/chat").set_json(body).to_request();
    let text = String::from_utf8(test::call_and_read_body(&app, request).await.to_vec()).unwrap();
    assert_eq!(crate::http::test_server::web_frames(text.as_bytes()).pop().unwrap()["conversationId"], id.as_str());
    let last = harness.backend.prompts().pop().unwrap();
    assert!(last.contains("step one") && last.contains("ran") && last.contains("mode=755"), "{last}");
    assert!(!last.contains("passwd-link") && !last.contains("pipe"), "a link or a FIFO came back: {last}");
}

/// An attachment of a Web UI conversation: a read-only file under
/// `attachments/` that its commands read and cannot change, not kept twice
/// (it is a file of the store, not of the folder's snapshot), back in the
/// new folder after a restart, and gone with the conversation.
#[actix_web::test]
async fn a_conversations_attachment_is_read_only_to_its_commands_and_outlives_a_restart() {
    let state_dir = tempfile::tempdir().unwrap();
    let look = "cat attachments/notes.txt; stat -c mode=%a attachments/notes.txt; \
        (echo changed >> attachments/notes.txt) 2>/dev/null || echo refused";
    let first = vec![call("shell", json!({"command": look})), "It lists the totals.".to_string()];
    let boundary = "attachboundary";
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n\r\nrent 1200\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n--{boundary}--\r\n"
    );
    let message = |id: &str| json!({"role": "user", "content": [{"type": "text", "text": "What is in it?"}, {"type": "file", "file": {"file_id": id}}]});
    let (conversation, file) = {
        let harness =
            start(TestServer::scripted(first).code_exec().settings(code_settings()).state_dir(state_dir.path())).await;
        let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
        let upload = test::TestRequest::post()
            .uri("/v1/files")
            .insert_header(("content-type", format!("multipart/form-data; boundary={boundary}")))
            .set_payload(form);
        let made: Value = test::call_and_read_body_json(&app, upload.to_request()).await;
        let file = made["id"].as_str().unwrap().to_string();
        let body = json!({"messages": [message(&file)]});
        let request = test::TestRequest::post().uri("/api/chat").set_json(body).to_request();
        let text = String::from_utf8(test::call_and_read_body(&app, request).await.to_vec()).unwrap();
        let frames = crate::http::test_server::web_frames(text.as_bytes());
        // Regression: the attachments, written just before the command ran,
        // were reported as files the command produced.
        let produced: Vec<&Value> =
            frames.iter().filter_map(|f| f["tool_progress"]["files"].as_array()).flatten().collect();
        assert!(produced.is_empty(), "{produced:?}");
        let done = frames.last().unwrap().clone();
        assert_eq!(done["done"], true, "{text}");
        let prompts = harness.backend.prompts();
        assert!(
            prompts[0].contains("[Attached file: attachments/notes.txt (text/plain, 9 bytes). Its text:]\nrent 1200")
        );
        let seen = prompts.last().unwrap();
        assert!(seen.contains("rent 1200mode=444\nrefused"), "{seen}");
        (done["conversationId"].as_str().unwrap().to_string(), file)
    };
    let store = crate::http::test_server::open_when_free(state_dir.path()).await.unwrap();
    let kept = store
        .run_here(|conn| {
            let owner: String =
                conn.query_row("SELECT owner FROM webui_conversations WHERE id = ?1", [&conversation], |row| {
                    row.get(0)
                })?;
            skillhost_actors::store::webui::files(conn, &owner, &conversation)
        })
        .unwrap();
    assert!(kept.iter().all(|f| !f.path.starts_with("attachments")), "kept twice: {kept:?}");
    drop(store);

    let second = vec![call("shell", json!({"command": "cat attachments/notes.txt"})), "Still 1200.".to_string()];
    let harness =
        start(TestServer::scripted(second).code_exec().settings(code_settings()).state_dir(state_dir.path())).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({
        "messages": [message(&file), {"role": "assistant", "content": "It lists the totals."}, {"role": "user", "content": "Again?"}],
        "conversationId": conversation,
    });
    let request = test::TestRequest::post().uri("/api/chat").set_json(body).to_request();
    test::call_and_read_body(&app, request).await;
    let seen = harness.backend.prompts().pop().unwrap();
    assert!(seen.contains("$ cat attachments/notes.txt\nrent 1200\n[exit status 0]"), "{seen}");
    // The conversation took the file in: deleting it deletes the file.
    let delete = test::TestRequest::delete().uri(&format!("/api/conversations/{conversation}")).to_request();
    assert!(test::call_service(&app, delete).await.status().is_success());
    let read = test::TestRequest::get().uri(&format!("/v1/files/{file}")).to_request();
    assert_eq!(test::call_service(&app, read).await.status().as_u16(), 404);
}

#[actix_web::test]
async fn a_silent_stretch_of_the_web_stream_gets_keep_alive_comments() {
    let outputs = vec![call("shell", json!({"command": "sleep 1; echo slept"})), "Done.".to_string()];
    // A keep-alive far shorter than the command.
    let server = TestServer::scripted(outputs).code_exec().settings(code_settings());
    let harness = start(server.keep_alive(Duration::from_millis(200))).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Wait a second."}]});
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/api/chat").set_json(body).to_request()).await;
    let body = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    let chunks: Vec<&str> = body.split("\n\n").filter(|c| !c.is_empty()).collect();
    let running = chunks.iter().position(|c| c.contains("\"phase\":\"running\"")).unwrap();
    let finished = chunks.iter().position(|c| c.contains("\"phase\":\"finished\"")).unwrap();
    // While the command ran, the stream was kept open with comments only.
    assert!(chunks[running + 1..finished].iter().all(|c| *c == ": keep-alive"), "{body}");
    assert!(finished > running + 1, "no keep-alive while the command ran: {body}");
    assert!(chunks.last().unwrap().contains("\"done\":true"));
}

#[actix_web::test]
async fn a_turn_ends_at_its_time_budget_and_says_so() {
    let outputs = vec![call("shell", json!({"command": "sleep 47"})), "Never reached.".to_string()];
    let settings = LoopSettings { turn_timeout: Duration::from_millis(1500), ..LoopSettings::default() };
    let harness = start(TestServer::scripted(outputs).code_exec().settings(settings)).await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"messages": [{"role": "user", "content": "Wait."}]});
    let response: Value = test::call_and_read_body_json(
        &app,
        test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request(),
    )
    .await;
    assert_eq!(response["choices"][0]["finish_reason"], "length", "{response}");
    let content = response["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("the turn used its whole time budget of 1 s"), "{content}");
    // The command was killed with the turn and its folder is gone.
    assert_eq!(workspaces(harness.base.path()), 0);
    let survivors = Command::new("pgrep").args(["-x", "-f", "sleep 47"]).output().unwrap();
    assert!(survivors.stdout.is_empty(), "the command outlived its turn");
}

#[actix_web::test]
async fn children_read_the_parents_folder_and_write_there_only_when_allowed() {
    for allow_write in [false, true] {
        let child = |text: String| ScriptedOutput { agent: "/root/1".into(), ..ScriptedOutput::from(text) };
        let task = "Read notes.txt and answer in reply.txt.";
        // Read-only, a child cannot be given write_file (refused at the
        // spawn) and is started with what it may have; allowed, it gets it.
        let spawns = if allow_write {
            vec![call("spawn_agent", json!({"message": task, "tools": ["read_file", "write_file"]}))]
        } else {
            vec![
                call("spawn_agent", json!({"message": task, "tools": ["write_file"]})),
                call("spawn_agent", json!({"message": task})),
            ]
        };
        let mut outputs = vec![ScriptedOutput::from(call(
            "write_file",
            json!({"path": "notes.txt", "content": "from the parent\n"}),
        ))];
        outputs.extend(spawns.into_iter().map(ScriptedOutput::from));
        outputs.extend([
            ScriptedOutput::from(call("wait_agent", json!({}))),
            ScriptedOutput::from(call("read_file", json!({"path": "reply.txt"}))),
            ScriptedOutput::from("Done.".to_string()),
            child(call("read_file", json!({"path": "notes.txt"}))),
            child(call("write_file", json!({"path": "reply.txt", "content": "from the child\n"}))),
            child("Wrote my answer.".to_string()),
        ]);
        let settings = LoopSettings { max_rounds: 24, agents_allow_write: allow_write, ..LoopSettings::default() };
        let harness = start(TestServer::scripted(outputs).code_exec().settings(settings)).await;
        let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
        let body = json!({"messages": [{"role": "user", "content": "Delegate."}], "temperature": 0});
        let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
        let reply: Value = test::call_and_read_body_json(&app, request).await;
        assert_eq!(reply["choices"][0]["message"]["content"], "Done.", "{reply}");
        let agents = harness.backend.agents();
        let prompts = harness.backend.prompts();
        let last_of = |agent: &str| {
            agents.iter().zip(&prompts).filter(|(a, _)| *a == agent).map(|(_, p)| p.clone()).next_back().unwrap()
        };
        let (parent, child) = (last_of("/root"), last_of("/root/1"));
        // The child reads the parent's folder either way.
        assert!(child.contains("from the parent"), "{child}");
        if allow_write {
            assert!(!parent.contains("agent cannot be given"), "{parent}");
            assert!(parent.contains("from the child"), "the parent does not see the child's file: {parent}");
        } else {
            assert!(parent.contains("agents only read on this server"), "{parent}");
            assert!(child.contains("write_file is not open to you"), "{child}");
            assert!(!parent.contains("from the child"), "a read-only child wrote: {parent}");
        }
        assert_eq!(workspaces(harness.base.path()), 0, "the request's folder outlived it");
    }
}

/// A skill's `allowed-tools` binds the whole turn: a child the parent
/// spawns after loading it starts under the same list, so it cannot write
/// where the parent may not. (Against a1d68f9 the child wrote.)
#[actix_web::test]
async fn a_child_starts_under_the_skills_its_parent_loaded() {
    let child = |text: String| ScriptedOutput { agent: "/root/1".into(), ..ScriptedOutput::from(text) };
    let base = tempfile::tempdir().unwrap();
    let skill = base.path().join("skills/delegate-read");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: delegate-read\ndescription: Delegates reading.\nallowed-tools: Task Read\n---\nDelegate, and only read.\n",
    )
    .unwrap();
    for dir in [base.path().to_path_buf(), base.path().join("skills"), skill] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let outputs = vec![
        ScriptedOutput::from(call("skills_read", json!({"skill": "delegate-read"}))),
        ScriptedOutput::from(call(
            "spawn_agent",
            json!({"message": "Write reply.txt.", "tools": ["read_file", "write_file"]}),
        )),
        ScriptedOutput::from(call("wait_agent", json!({}))),
        ScriptedOutput::from("Done.".to_string()),
        child(call("write_file", json!({"path": "reply.txt", "content": "from the child\n"}))),
        child("Tried.".to_string()),
    ];
    let settings = LoopSettings { max_rounds: 12, agents_allow_write: true, ..LoopSettings::default() };
    let harness =
        start(TestServer::scripted(outputs).code_exec().skills_root(&base.path().join("skills")).settings(settings))
            .await;
    let reply = ask(&harness, "Delegate.").await;
    assert_eq!(reply["choices"][0]["message"]["content"], "Done.", "{reply}");
    let agents = harness.backend.agents();
    let prompts = harness.backend.prompts();
    let child_prompt =
        agents.iter().zip(&prompts).filter(|(a, _)| *a == "/root/1").map(|(_, p)| p.clone()).next_back().unwrap();
    assert!(
        child_prompt.contains("write_file is not allowed for the rest of this turn")
            && child_prompt.contains("'delegate-read' (Task Read)"),
        "{child_prompt}"
    );
}

/// Workspaces filled to their caps never pass the sandbox memory: past it
/// a new conversation's turn is told why it has no code tools, the server
/// keeps answering, and a closed conversation's share comes back. (Needs
/// root, which mounts the size-capped tmpfs; CI runs as root.)
#[actix_web::test]
async fn a_full_sandbox_memory_refuses_a_new_workspace_and_the_server_answers_throughout() {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root mounts size-capped workspaces");
        return;
    }
    const CAP: u64 = 4 * 1024 * 1024;
    let fill = || call("shell", json!({"command": "head -c 3000000 /dev/zero > fill && echo filled"}));
    let outputs = vec![fill(), "one".into(), fill(), "two".into(), "three".into(), fill(), "four".into()];
    let settings = LoopSettings { max_rounds: 4, ..LoopSettings::default() };
    let budget = skillhost_actors::workspace::MemoryBudget::new(2 * CAP);
    let held = Arc::clone(&budget);
    let harness = start(TestServer::scripted(outputs).code_exec().settings(settings).workspaces(move |options| {
        options.size_cap = Some(CAP);
        options.budget = Some(budget);
    }))
    .await;
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let health = || async {
        let response = test::call_service(&app, test::TestRequest::get().uri("/health").to_request()).await;
        assert_eq!(response.status().as_u16(), 200);
    };
    let turn = |content: &'static str| {
        let app = &app;
        async move {
            let body = json!({"messages": [{"role": "user", "content": content}]});
            let request = test::TestRequest::post().uri("/api/chat").set_json(body).to_request();
            let text = String::from_utf8(test::call_and_read_body(app, request).await.to_vec()).unwrap();
            let done = crate::http::test_server::web_frames(text.as_bytes()).pop().unwrap();
            done["conversationId"].as_str().unwrap().to_string()
        }
    };
    let first = turn("Fill one.").await;
    health().await;
    turn("Fill two.").await;
    health().await;
    assert_eq!(held.held(), 2 * CAP);
    turn("A third.").await;
    health().await;
    let third = harness.backend.prompts().pop().unwrap();
    assert!(
        third.contains("Code execution is not available for this request: the server's sandbox memory is full"),
        "{third}"
    );
    assert!(!third.contains("- shell:"), "the refused turn was offered the shell: {third}");
    // The first conversation closes: its share comes back, and a new one fits.
    let closed =
        test::call_service(&app, test::TestRequest::delete().uri(&format!("/api/conversations/{first}")).to_request())
            .await;
    assert_eq!(closed.status().as_u16(), 200);
    assert_eq!(held.held(), CAP);
    turn("A fourth.").await;
    let fourth = harness.backend.prompts().pop().unwrap();
    assert!(fourth.contains("filled\n[exit status 0]"), "{fourth}");
    health().await;
}

#[actix_web::test]
async fn a_failure_the_sandbox_caused_is_named_as_such() {
    // A listener on the host's loopback: the sandbox has a loopback of its
    // own, so the connection is refused there, and nothing leaves 127.0.0.1.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // /etc is read-only in the profile; a new file there is refused.
    let outside = "/etc/skillhost-denied-by-the-sandbox";
    let outputs = vec![
        call("shell", json!({"command": format!("python -c \"open('{outside}', 'w')\"")})),
        call(
            "shell",
            json!({"command": format!("python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"")}),
        ),
        call("shell", json!({"command": "python -c \"assert 2 + 2 == 5\""})),
        "done".to_string(),
    ];
    let harness = harness(outputs).await;
    ask(&harness, "Try it.").await;
    if Path::new(outside).exists() {
        let _ = std::fs::remove_file(outside);
        panic!("the sandbox let a command write {outside}");
    }
    let last = harness.backend.prompts().pop().unwrap();
    assert!(last.contains(&format!("The sandbox refused \"{outside}\"")), "{last}");
    assert!(last.contains("The sandbox kept this command offline"), "{last}");
    // A plain bug is left to the model.
    let bug = last.split("assert 2 + 2 == 5").nth(1).unwrap();
    assert!(!bug.contains("the code is not at fault"), "{last}");
}

/// A skill `name` with one script, `scripts/<script>` holding `code`, in
/// a root under `base` that the sandbox users can read.
pub(super) fn one_script_skill(base: &Path, name: &str, script: &str, code: &str) -> PathBuf {
    let skills = base.join("skills");
    let skill = skills.join(name);
    std::fs::create_dir_all(skill.join("scripts")).unwrap();
    let manifest = format!("---\nname: {name}\ndescription: Runs scripts/{script}.\n---\nRun scripts/{script}.\n");
    std::fs::write(skill.join("SKILL.md"), manifest).unwrap();
    std::fs::write(skill.join("scripts").join(script), code).unwrap();
    for dir in [&skills, &skill, &skill.join("scripts")] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    skills
}

#[actix_web::test]
async fn a_failure_of_the_code_shows_the_failing_lines_and_the_names_a_module_really_has() {
    let outputs = vec![
        call(
            "write_file",
            json!({"path": "lib/calc.py", "content": "def ratio(a, b):\n    total = a + b\n    return a / (b - b)\n"}),
        ),
        call(
            "write_file",
            json!({"path": "main.py", "content": "import sys\nsys.path.insert(0, 'lib')\nfrom calc import ratio\nprint(ratio(1, 2))\n"}),
        ),
        call("shell", json!({"command": "python main.py"})),
        call(
            "write_file",
            json!({"path": "shapes.py", "content": "def area_of_circle(r):\n    return 3.14 * r * r\n\ndef area_of_square(s):\n    return s * s\n"}),
        ),
        call("shell", json!({"command": "python -c 'import shapes; print(shapes.area_of_circl(2))'"})),
        // Output naming a planted link: the snippet reader refuses it.
        call(
            "shell",
            json!({"command": "ln -sf /etc/passwd linked.txt; echo '  File \"linked.txt\", line 1' >&2; exit 1"}),
        ),
        "done".to_string(),
    ];
    let harness = harness(outputs).await;
    ask(&harness, "Run it.").await;
    let last = harness.backend.prompts().pop().unwrap();
    // The innermost frame in the workspace, numbered, the failing line marked.
    assert!(last.contains("ZeroDivisionError"), "{last}");
    assert!(last.contains("[lib/calc.py, around line 3:]\n 1 | def ratio(a, b):\n 2 |     total = a + b\n>3 |     return a / (b - b)\nFix it with the smallest exact edit"), "{last}");
    // A guessed name: the module's real ones, read by a probe in the sandbox.
    assert!(last.contains("[shapes has no area_of_circl. Did you mean: area_of_circle"), "{last}");
    assert!(
        last.contains("Its public names, read from the installed module: area_of_circle, area_of_square]"),
        "{last}"
    );
    let planted = last.split("$ ln -sf /etc/passwd linked.txt").nth(1).unwrap();
    assert!(!planted.contains("root:") && !planted.contains("around line"), "{planted}");
}

#[actix_web::test]
async fn a_script_sees_the_shells_setup_unless_it_has_a_network_the_shell_lacks() {
    let python = skillhost_actors::sandbox::interpreters::Interpreters::detect().python().unwrap().version.clone();
    // The model plants code Python runs at start-up in the workspace's user
    // site, and exports a variable.
    let plant = format!(
        "export FROM_SHELL=yes; mkdir -p .local/lib/python{python}/site-packages && echo \"print('PLANTED CODE RAN')\" > .local/lib/python{python}/site-packages/usercustomize.py"
    );
    let outputs = || {
        vec![
            call("shell", json!({"command": plant})),
            call("skills_run", json!({"skill": "show-env", "path": "scripts/env.py"})),
            "done".to_string(),
        ]
    };
    let skills_base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(skills_base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let skills = one_script_skill(
        skills_base.path(),
        "show-env",
        "env.py",
        "import os\nprint('FROM_SHELL=' + os.environ.get('FROM_SHELL', 'unset'))\n",
    );
    let settings = || LoopSettings { max_rounds: 24, allow_exec: true, ..LoopSettings::default() };
    // Same network as the shell: the same environment, exports included.
    let harness = start(TestServer::scripted(outputs()).code_exec().skills_root(&skills).settings(settings())).await;
    ask(&harness, "Show it.").await;
    let last = harness.backend.prompts().pop().unwrap();
    let script = last.split("[skills_run: scripts/env.py]").nth(1).unwrap();
    assert!(script.contains("FROM_SHELL=yes") && script.contains("PLANTED CODE RAN"), "{script}");
    // A network the shell lacks: nothing the model set up offline runs with it.
    let harness = start(
        TestServer::scripted(outputs()).code_exec().skills_root(&skills).settings(settings()).exec_settings(|exec| {
            exec.mode = SandboxMode::Preferred;
            exec.skills_network = true;
        }),
    )
    .await;
    ask(&harness, "Show it.").await;
    let last = harness.backend.prompts().pop().unwrap();
    let script = last.split("[skills_run: scripts/env.py]").nth(1).unwrap();
    assert!(script.contains("FROM_SHELL=unset") && !script.contains("PLANTED CODE RAN"), "{script}");
}

#[actix_web::test]
async fn a_networked_command_trusts_the_operators_cas_and_sees_nothing_else_of_the_bundle() {
    use skillhost_actors::sandbox::ca;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The operator's bundle: a root, a private key and a note, in a folder of its own.
    let private = dir.path().join("operator");
    std::fs::create_dir(&private).unwrap();
    let root = ca::certificates("system", &std::fs::read(ca::SYSTEM_ROOTS).unwrap()).unwrap().remove(0);
    let bundle = private.join("corp.pem");
    std::fs::write(
        &bundle,
        format!("# see the vault\n-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n{root}"),
    )
    .unwrap();
    let snapshot = dir.path().join("ca-bundle.pem");
    ca::write_snapshot(&snapshot, &ca::read_bundles(std::slice::from_ref(&bundle)).unwrap()).unwrap();
    let look = format!(
        "echo \"file=$SSL_CERT_FILE node=$NODE_EXTRA_CA_CERTS\"; grep -c 'BEGIN CERTIFICATE' \"$SSL_CERT_FILE\" >/dev/null && echo certificates; grep -c -e PRIVATE -e vault \"$SSL_CERT_FILE\"; cat {} || echo no-original",
        bundle.display()
    );
    let outputs = || vec![call("shell", json!({"command": look})), "done".to_string()];
    let settings = || LoopSettings { max_rounds: 24, ..LoopSettings::default() };
    let networked = start(TestServer::scripted(outputs()).code_exec().settings(settings()).exec_settings(|exec| {
        exec.mode = SandboxMode::Preferred;
        exec.shell_network = true;
        exec.ca_bundle = Some(snapshot.clone());
    }))
    .await;
    ask(&networked, "Look.").await;
    let last = networked.backend.prompts().pop().unwrap();
    let result = last.split("$ echo").nth(1).unwrap();
    let shown = snapshot.display().to_string();
    assert!(result.contains(&format!("file={shown} node={shown}")), "{result}");
    assert!(result.contains("certificates\n0\n"), "only certificates: {result}");
    assert!(result.contains("no-original"), "the operator's file stays out of reach: {result}");
    // Offline, nothing names it.
    let offline = start(
        TestServer::scripted(outputs())
            .code_exec()
            .settings(settings())
            .exec_settings(|exec| exec.ca_bundle = Some(snapshot.clone())),
    )
    .await;
    ask(&offline, "Look.").await;
    let last = offline.backend.prompts().pop().unwrap();
    assert!(last.contains("file= node="), "{last}");
}
