//! MCP servers as a tool source, end to end over HTTP: the scripted model
//! calls real MCP servers started confined over stdio (the reference
//! `server-everything` from npm, installed by `make test` into
//! tests/mcp-servers) and a hostile one (tests/mcp-servers/rogue.py), and
//! the loop answers every call, whatever the server does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use actix_web::{test, App};
use serde_json::{json, Value};
use skillhost_actors::sandbox::launch::SandboxMode;
use skillhost_actors::tools::mcp::config::{self, McpServerConfig};

use crate::http::access::Admission;
use crate::http::code_tests::{call, code_settings, echo_skill, start, workspaces, Harness};
use crate::http::configure;
use crate::http::test_server::TestServer;
use skillhost_actors::chat_loop::LoopSettings;

/// The test servers, copied where the sandbox user can read them (the
/// checkout may sit under a home folder it cannot enter).
fn servers_dir() -> tempfile::TempDir {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-servers");
    assert!(
        source.join("node_modules/@modelcontextprotocol/server-everything").exists(),
        "the MCP test servers are missing: run `make test` (or npm ci in tests/mcp-servers)"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let copied = std::process::Command::new("cp")
        .args(["-r", "--no-preserve=ownership"])
        .arg(source.join("node_modules"))
        .arg(source.join("rogue.py"))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(copied.success());
    // server-filesystem's one allowed folder.
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    std::fs::write(docs.join("notes.txt"), "read through server-filesystem\n").unwrap();
    std::fs::set_permissions(&docs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(docs.join("notes.txt"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    dir
}

/// `{"mcpServers": ...}` read as `--mcp-config` reads it.
fn servers(dir: &Path, names: &[&str]) -> Vec<McpServerConfig> {
    let everything = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let files = dir.join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    let mut all = json!({
        "everything": {"command": "node", "args": [everything, "stdio"], "read": [dir]},
        "files": {"command": "node", "args": [files, dir.join("docs")], "read": [dir]},
        "rogue": {"command": "/usr/bin/python3", "args": [dir.join("rogue.py")], "read": [dir]},
    });
    all.as_object_mut().unwrap().retain(|name, _| names.contains(&name.as_str()));
    let text = json!({ "mcpServers": all }).to_string();
    config::parse_file(&text, "test", &|_| None).unwrap()
}

async fn harness(outputs: Vec<String>, dir: &Path, names: &[&str], call_timeout: Duration) -> Harness {
    let server = TestServer::scripted(outputs).sandbox(false).settings(code_settings());
    start(server.mcp(servers(dir, names), call_timeout)).await
}

async fn post(harness: &Harness, body: Value) -> (u16, Value) {
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let request = test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request();
    let response = test::call_service(&app, request).await;
    let status = response.status().as_u16();
    (status, test::read_body_json(response).await)
}

async fn ask(harness: &Harness, content: &str) -> Value {
    let (status, body) = post(harness, json!({"messages": [{"role": "user", "content": content}]})).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The `index`th prompt the scripted model was given (0: the turn's first;
/// each tool round adds one holding the answers so far).
fn prompt(harness: &Harness, index: usize) -> String {
    harness.backend.prompts()[index].clone()
}

#[actix_web::test]
async fn a_call_to_server_everything_is_answered_in_the_loop_and_counted() {
    let dir = servers_dir();
    let outputs = vec![
        call("mcp__everything__echo", json!({"message": "hello from the loop"})),
        call("mcp__everything__get-env", json!({})),
        call(
            "mcp_read_resource",
            json!({"server": "everything", "uri": "demo://resource/static/document/architecture.md"}),
        ),
        "Done.".to_string(),
    ];
    let harness = harness(outputs, dir.path(), &["everything"], Duration::from_secs(60)).await;
    let body = ask(&harness, "Echo something.").await;
    assert_eq!(body["choices"][0]["message"]["content"], "Done.");
    let first = prompt(&harness, 0);
    assert!(first.contains("mcp__everything__echo"), "the tools are declared: {first}");
    assert!(prompt(&harness, 1).contains("Echo: hello from the loop"), "{}", prompt(&harness, 1));
    // The server's environment is the sandbox's: its own HOME, nothing of
    // the test process (cargo sets CARGO_* for it).
    let env = prompt(&harness, 2);
    assert!(env.contains("\"HOME\""), "{env}");
    assert!(!env.contains("CARGO_PKG_NAME"), "the server saw the host's environment: {env}");
    // It offers resources, so the one reading tool is declared and reads.
    assert!(first.contains("mcp_read_resource"));
    assert!(prompt(&harness, 3).contains("# Everything Server"), "{}", prompt(&harness, 3));
    let counts = harness.state.server.mcp().unwrap().counts();
    let row =
        |tool: &str| counts.iter().find(|(s, t, _, _)| s == "everything" && t == tool).map(|r| (r.2.as_str(), r.3));
    assert_eq!(row("echo"), Some(("ok", 1)));
    assert_eq!(row("get-env"), Some(("ok", 1)));
}

#[actix_web::test]
async fn server_filesystem_reads_its_folder_and_the_sandbox_refuses_its_writes() {
    let dir = servers_dir();
    let docs = dir.path().join("docs");
    let outputs = vec![
        call("mcp__files__read_text_file", json!({"path": docs.join("notes.txt")})),
        // The server allows writes in its folder; the sandbox does not (the
        // operator listed it under `read`).
        call("mcp__files__write_file", json!({"path": docs.join("new.txt"), "content": "x"})),
        // Outside its folder, the server itself refuses.
        call("mcp__files__read_text_file", json!({"path": "/etc/hostname"})),
        "Done.".to_string(),
    ];
    let harness = harness(outputs, dir.path(), &["files"], Duration::from_secs(60)).await;
    ask(&harness, "Read the notes.").await;
    assert!(prompt(&harness, 1).contains("read through server-filesystem"), "{}", prompt(&harness, 1));
    let write = prompt(&harness, 2);
    // How the refusal reads depends on how the host confines (a read-only
    // mount, or Landlock); either way nothing was written.
    assert!(["EROFS", "EACCES", "EPERM"].iter().any(|code| write.contains(code)), "{write}");
    assert!(!docs.join("new.txt").exists(), "a confined MCP server wrote into a read-only folder");
    let outside = prompt(&harness, 3);
    assert!(outside.contains("outside allowed directories"), "{outside}");
}

#[actix_web::test]
async fn a_hostile_server_is_confined_cut_off_and_named_for_the_model() {
    let dir = servers_dir();
    // A folder anyone may write: only the sandbox stands between the
    // server and it.
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let target = open.path().join("escaped.txt");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let outputs = vec![
        call("mcp__rogue__escape", json!({"path": target, "port": port})),
        call("mcp__rogue__shell", json!({})),
        call("mcp__rogue__flood", json!({})),
        "Done.".to_string(),
    ];
    let harness = harness(outputs, dir.path(), &["rogue"], Duration::from_secs(60)).await;
    let body = ask(&harness, "Misbehave.").await;
    assert_eq!(body["choices"][0]["message"]["content"], "Done.");
    let first = prompt(&harness, 0);
    assert!(first.contains("mcp__rogue__shell") && first.contains("mcp__rogue__escape"), "{first}");
    assert!(!first.contains("mcp__rogue__bomb"), "the schema bomb is left out");
    let escape = prompt(&harness, 1);
    assert!(escape.contains("write refused"), "{escape}");
    assert!(escape.contains("network refused"), "{escape}");
    assert!(!target.exists(), "the server wrote outside its folder");
    assert!(listener.accept().is_err(), "the server reached the host's network");
    // Named like our shell, it stays the server's tool.
    assert!(prompt(&harness, 2).contains("the rogue server's shell"));
    let flood = prompt(&harness, 3);
    assert!(flood.contains("longer than 8 MiB") && flood.contains("started again"), "{flood}");
    let counts = harness.state.server.mcp().unwrap().counts();
    assert!(counts.iter().any(|(_, tool, outcome, _)| tool == "flood" && outcome.as_str() == "failed"), "{counts:?}");
}

#[actix_web::test]
async fn a_crashed_server_is_restarted_after_its_back_off() {
    let dir = servers_dir();
    let outputs = vec![
        call("mcp__rogue__crash", json!({})),
        call("mcp__rogue__shell", json!({})),
        "First.".to_string(),
        call("mcp__rogue__shell", json!({})),
        "Second.".to_string(),
    ];
    let harness = harness(outputs, dir.path(), &["rogue"], Duration::from_secs(60)).await;
    ask(&harness, "Crash.").await;
    let crashed = prompt(&harness, 1);
    assert!(crashed.contains("The MCP tool crash of rogue failed"), "{crashed}");
    let waiting = prompt(&harness, 2);
    assert!(waiting.contains("exited") && waiting.contains("started again in 1 s"), "{waiting}");
    // Past the back-off, the next call starts it again.
    tokio::time::sleep(skillhost_actors::tools::mcp::hub::FIRST_RESTART_BACKOFF + Duration::from_millis(200)).await;
    let body = ask(&harness, "Again.").await;
    assert_eq!(body["choices"][0]["message"]["content"], "Second.");
    assert!(prompt(&harness, 4).contains("the rogue server's shell"), "{}", prompt(&harness, 4));
}

#[actix_web::test]
async fn a_slow_call_times_out_and_a_changed_tool_list_waits_for_the_next_turn() {
    let dir = servers_dir();
    let outputs = vec![
        call("mcp__rogue__grow", json!({})),
        "Grown.".to_string(),
        call("mcp__rogue__grown", json!({})),
        call("mcp__rogue__sleep", json!({"seconds": 30})),
        "Done.".to_string(),
    ];
    let harness = harness(outputs, dir.path(), &["rogue"], Duration::from_secs(1)).await;
    ask(&harness, "Grow.").await;
    // The round after the change keeps the prompt the turn started with.
    assert!(!prompt(&harness, 1).contains("mcp__rogue__grown"));
    ask(&harness, "Use it.").await;
    assert!(prompt(&harness, 2).contains("mcp__rogue__grown"), "the next turn lists it");
    assert!(prompt(&harness, 3).contains("the new tool answers"));
    let slow = prompt(&harness, 4);
    assert!(slow.contains("did not answer within 1 s"), "{slow}");
}

#[actix_web::test]
async fn a_loaded_skill_limits_mcp_tools_and_requests_narrow_the_servers() {
    let dir = servers_dir();
    let skills = tempfile::tempdir().unwrap();
    let skill = skills.path().join("careful");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: careful\ndescription: Uses only the rogue server's shell.\nallowed-tools: mcp__rogue__shell\n---\n# Careful\nCall mcp__rogue__shell.\n",
    )
    .unwrap();
    let outputs = vec![
        call("skills_read", json!({"skill": "careful"})),
        call("mcp__rogue__escape", json!({})),
        call("mcp__rogue__shell", json!({})),
        "Done.".to_string(),
        "No tools.".to_string(),
    ];
    let server = TestServer::scripted(outputs).sandbox(false).settings(code_settings()).skills_root(skills.path());
    let harness = start(server.mcp(servers(dir.path(), &["rogue"]), Duration::from_secs(60))).await;
    ask(&harness, "Be careful.").await;
    assert!(prompt(&harness, 2).contains("mcp__rogue__escape is not allowed"), "{}", prompt(&harness, 2));
    assert!(prompt(&harness, 3).contains("the rogue server's shell"));
    // The call its list named counts for the skill; the refused one not.
    let counts = harness.state.server.skill_outcomes().of("careful")[0].1;
    assert_eq!((counts.read, counts.mcp_calls), (1, 1));
    // `mcp_servers: []` offers none of them; an unknown name is a 400.
    let (status, _) = post(&harness, json!({"messages": [{"role": "user", "content": "x"}], "mcp_servers": []})).await;
    assert_eq!(status, 200);
    assert!(!prompt(&harness, 4).contains("mcp__rogue__"), "{}", prompt(&harness, 4));
    let (status, body) =
        post(&harness, json!({"messages": [{"role": "user", "content": "x"}], "mcp_servers": ["rogeu"]})).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no MCP server called 'rogeu'") && message.contains("rogue"), "{message}");
}

#[actix_web::test]
async fn a_required_sandbox_that_cannot_confine_starts_no_server() {
    let dir = servers_dir();
    let server = TestServer::scripted(vec!["Plain answer.".to_string()])
        .sandbox(false)
        .exec_settings(|settings| {
            settings.mode = SandboxMode::Required;
            settings.unavailable = Some("no Landlock on this host".into());
        })
        .settings(code_settings());
    let harness = start(server.mcp(servers(dir.path(), &["rogue"]), Duration::from_secs(60))).await;
    let body = ask(&harness, "Hello.").await;
    assert_eq!(body["choices"][0]["message"]["content"], "Plain answer.");
    assert!(!prompt(&harness, 0).contains("mcp__rogue__"), "an unconfined server was offered");
    let reports = harness.state.server.mcp().unwrap().report(false).await;
    assert_eq!(reports[0].state, "down");
    assert!(reports[0].error.as_deref().unwrap().contains("--skills-sandbox is required"), "{:?}", reports[0].error);
}

async fn respond(harness: &Harness, body: Value) -> (u16, Option<String>, Value) {
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let request = test::TestRequest::post().uri("/v1/responses").set_json(body).to_request();
    let response = test::call_service(&app, request).await;
    let status = response.status().as_u16();
    let dropped = response.headers().get("x-skillhost-dropped-tools").map(|value| value.to_str().unwrap().to_string());
    (status, dropped, test::read_body_json(response).await)
}

#[actix_web::test]
async fn responses_mcp_tools_choose_configured_servers_and_hosted_tools_drop_or_map() {
    let dir = servers_dir();
    let outputs = vec!["One.".to_string(), "Two.".to_string()];
    let server = TestServer::scripted(outputs).sandbox(false).settings(code_settings());
    let harness = start(server.mcp(servers(dir.path(), &["rogue", "everything"]), Duration::from_secs(60))).await;
    // OpenAI's mcp tool for a configured server, narrowed to one tool, and
    // Codex's web_search, which nothing maps: left out and named.
    let body = json!({"input": "hi", "tools": [
        {"type": "web_search"},
        {"type": "mcp", "server_label": "rogue", "allowed_tools": ["shell"], "require_approval": "never"},
    ]});
    let (status, dropped, reply) = respond(&harness, body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(dropped.as_deref(), Some("web_search"));
    let first = prompt(&harness, 0);
    assert!(first.contains("mcp__rogue__shell"), "{first}");
    assert!(!first.contains("mcp__rogue__escape") && !first.contains("mcp__everything__"), "{first}");
    // A request never points the server anywhere: an unknown label, or a
    // URL other than the configured one, is a 400.
    for (tool, says) in [
        (
            json!({"type": "mcp", "server_label": "elsewhere", "server_url": "https://mcp.example/"}),
            "must name one of this server's MCP servers (everything, rogue)",
        ),
        (
            json!({"type": "mcp", "server_label": "rogue", "server_url": "https://mcp.example/"}),
            "is not the URL configured for 'rogue'",
        ),
    ] {
        let (status, _, reply) = respond(&harness, json!({"input": "hi", "tools": [tool]})).await;
        assert_eq!(status, 400, "{reply}");
        assert!(reply["error"]["message"].as_str().unwrap().contains(says), "{reply}");
    }
    assert_eq!(harness.backend.prompts().len(), 1, "a refused request reached the model");
}

#[actix_web::test]
async fn a_mapped_hosted_tool_is_its_mcp_tool_and_strict_servers_refuse_the_rest() {
    let dir = servers_dir();
    let names = vec!["rogue".to_string()];
    let hosted = skillhost_actors::tools::mcp::hosted::HostedTools::parse(
        &["web_search=mcp__rogue__shell".into()],
        true,
        &names,
    )
    .unwrap();
    let server = TestServer::scripted(vec!["Mapped.".to_string()]).sandbox(false).settings(code_settings());
    let harness = start(server.hosted(hosted).mcp(servers(dir.path(), &["rogue"]), Duration::from_secs(60))).await;
    let (status, dropped, reply) = respond(&harness, json!({"input": "hi", "tools": [{"type": "web_search"}]})).await;
    assert_eq!((status, dropped), (200, None), "{reply}");
    assert!(prompt(&harness, 0).contains("mcp__rogue__shell"));
    let (status, _, reply) = respond(&harness, json!({"input": "hi", "tools": [{"type": "file_search"}]})).await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("built-in tool 'file_search'") && message.contains("--hosted-tool file_search="),
        "{message}"
    );
}

/// One JSON-RPC request to `POST /mcp`.
async fn rpc(harness: &Harness, method: &str, params: Value) -> Value {
    let app = test::init_service(App::new().app_data(harness.state.clone()).configure(configure)).await;
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let request = test::TestRequest::post().uri("/mcp").set_json(body).to_request();
    test::call_and_read_body_json(&app, request).await
}

#[actix_web::test]
async fn mcp_clients_run_skill_scripts_in_the_sandbox_only_when_the_operator_serves_them() {
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let skills = echo_skill(base.path());
    let settings = LoopSettings { allow_exec: true, ..code_settings() };
    let names = |list: &Value| -> Vec<String> {
        list["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
    };
    let run = json!({"name": "skills_run", "arguments": {"skill": "echo-args", "path": "scripts/show.py", "args": ["a b", "$(id)"]}});

    // The model may run scripts, but MCP clients are not offered them.
    let model_only = TestServer::scripted(Vec::<String>::new()).sandbox(false).skills_root(&skills).settings(settings);
    let harness = start(model_only).await;
    assert_eq!(names(&rpc(&harness, "tools/list", json!({})).await), ["skills_list", "skills_read"]);
    let refused = rpc(&harness, "tools/call", run.clone()).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("the tools are skills_list and skills_read"));

    // Served: the script runs confined in a scratch folder of its own,
    // which is gone after the call, with its arguments as data.
    let served = TestServer::scripted(Vec::<String>::new())
        .sandbox(false)
        .skills_root(&skills)
        .settings(settings)
        .admission(Admission::new(1, 0))
        .mcp_serve_scripts();
    let harness = start(served).await;
    assert_eq!(names(&rpc(&harness, "tools/list", json!({})).await), ["skills_list", "skills_read", "skills_run"]);
    let ran = rpc(&harness, "tools/call", run).await;
    let text = ran["result"]["content"][0]["text"].as_str().unwrap();
    assert_eq!(ran["result"]["isError"], false, "{ran}");
    assert!(text.contains(r#"["a b", "$(id)"]"#) && text.contains("own folder: read-only"), "{text}");
    assert!(text.contains("cwd holds: ['.tmp', 'made.txt']"), "{text}");
    assert_eq!(workspaces(harness.base.path()), 0, "the scratch folder outlived the call");
    // Refusals are results the client reads, as the model would.
    let outside = json!({"name": "skills_run", "arguments": {"skill": "echo-args", "path": "../../etc/passwd.py"}});
    let outside = rpc(&harness, "tools/call", outside).await;
    assert_eq!(outside["result"]["isError"], true, "{outside}");
    assert!(outside["result"]["content"][0]["text"].as_str().unwrap().contains("climbs out of the skill folder"));
    let denied = json!({"name": "skills_run", "arguments": {"skill": "echo-args", "path": "scripts/write-etc.sh"}});
    let denied = rpc(&harness, "tools/call", denied).await;
    assert_eq!(denied["result"]["isError"], true, "{denied}");
    assert!(!Path::new("/etc/skillhost-denied-by-a-script").exists(), "a script wrote outside the sandbox");
    let bad = rpc(&harness, "tools/call", json!({"name": "skills_run", "arguments": "[1]"})).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    // A script holds an admission place as a turn does: with every place
    // taken it is refused with a retry, and runs once one is free.
    let turn = harness.state.admission.admit().unwrap();
    let again = json!({"name": "skills_run", "arguments": {"skill": "echo-args", "path": "scripts/show.py"}});
    let busy = rpc(&harness, "tools/call", again.clone()).await;
    assert_eq!(busy["error"]["code"], -32000, "{busy}");
    assert!(busy["error"]["message"].as_str().unwrap().contains("at capacity"), "{busy}");
    drop(turn);
    assert_eq!(rpc(&harness, "tools/call", again).await["result"]["isError"], false);
}
