//! Installs by URL and digest, and the discovery index, over real sockets
//! on 127.0.0.1: an origin this test serves, a digest mismatch, redirects
//! on and off the allow-list, the limits, and one server installing what
//! another publishes, over HTTP and with `skillhost skills add`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use actix_web::{test, web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};
use skillhost_actors::skills::discovery::{Publish, INDEX_PATH, SCHEMA};
use skillhost_actors::skills::fetch::{self, Domains, FetchError, MAX_INDEX_BYTES, MAX_REDIRECTS};
use skillhost_actors::skills::{Origin, Root, SkillsConfig};

use crate::config::{SkillArgs, SkillsAddArgs};
use crate::http::test_server::{skills_config, TestServer};
use crate::http::{configure, AppState};

/// An archive of the skill `demo` whose notes say `notes`.
fn archive(notes: &str) -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    zip.start_file("demo/SKILL.md", options).unwrap();
    zip.write_all(b"---\nname: demo\ndescription: A skill fetched by URL.\n---\nRead notes.md.\n").unwrap();
    zip.start_file("demo/notes.md", options).unwrap();
    zip.write_all(notes.as_bytes()).unwrap();
    zip.finish().unwrap().into_inner()
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// What the test origin answers at a path.
#[derive(Clone)]
enum Reply {
    Bytes(Vec<u8>),
    Redirect(String),
}

/// A web server on 127.0.0.1 answering fixed replies by path, and the
/// paths asked for, in order.
struct Served {
    base: String,
    asked: Arc<Mutex<Vec<String>>>,
}

async fn origin(replies: Vec<(String, Reply)>) -> Served {
    let replies: Arc<HashMap<String, Reply>> = Arc::new(replies.into_iter().collect());
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&asked);
    let server = HttpServer::new(move || {
        let replies = Arc::clone(&replies);
        let seen = Arc::clone(&seen);
        App::new().default_service(web::to(move |request: HttpRequest| {
            let replies = Arc::clone(&replies);
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(request.path().to_string());
                match replies.get(request.path()) {
                    Some(Reply::Bytes(bytes)) => HttpResponse::Ok().body(bytes.clone()),
                    Some(Reply::Redirect(to)) => {
                        HttpResponse::Found().insert_header(("location", to.as_str())).finish()
                    }
                    None => HttpResponse::NotFound().finish(),
                }
            }
        }))
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let base = format!("http://{}", server.addrs()[0]);
    actix_web::rt::spawn(server.run());
    Served { base, asked }
}

/// A skills server on a real socket, as another server reaches it.
fn serve(state: web::Data<AppState>) -> String {
    let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(configure))
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap();
    let base = format!("http://{}", server.addrs()[0]);
    actix_web::rt::spawn(server.run());
    base
}

fn config(install: &Path, domains: &[&str]) -> SkillsConfig {
    let roots = vec![Root { path: install.to_path_buf(), origin: Origin::Installed }];
    SkillsConfig {
        install_domains: Domains::parse(&domains.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap(),
        ..skills_config(roots, Some(install.to_path_buf()), Vec::new())
    }
}

fn install(body: Value) -> actix_http::Request {
    test::TestRequest::post().uri("/api/skills/install").set_json(body).to_request()
}

/// What the install folder holds besides its own bookkeeping.
fn installed(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.retain(|name| !name.starts_with(".versions"));
    names.sort();
    names
}

#[actix_web::test]
async fn an_archive_installs_only_when_its_bytes_match_the_digest() {
    let good = archive("fetched");
    let origin = origin(vec![("/demo.zip".into(), Reply::Bytes(good.clone()))]).await;
    let dir = tempfile::tempdir().unwrap();
    let running =
        TestServer::scripted(Vec::<String>::new()).skills(config(dir.path(), &["127.0.0.1"])).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let url = format!("{}/demo.zip", origin.base);

    let wrong = "0".repeat(64);
    let response = test::call_service(&app, install(json!({"url": url, "sha256": wrong}))).await;
    assert_eq!(response.status(), 422);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(
        body,
        json!({
            "error": format!("the archive at {url} has the digest sha256:{}, not the sha256:{wrong} given; nothing was installed", hex_sha256(&good)),
            "expected": format!("sha256:{wrong}"),
            "actual": format!("sha256:{}", hex_sha256(&good)),
        })
    );
    // Nothing was unpacked: no skill, and the download is gone.
    assert_eq!(installed(dir.path()), Vec::<String>::new());
    let missing = test::TestRequest::get().uri("/api/skills/demo").to_request();
    assert_eq!(test::call_service(&app, missing).await.status(), 404);

    let digest = format!("sha256:{}", hex_sha256(&good).to_uppercase());
    let response = test::call_service(&app, install(json!({"url": url, "sha256": digest}))).await;
    assert_eq!(response.status(), 201);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["id"], "demo");
    assert_eq!(
        body["source"],
        json!({"url": url, "digest": format!("sha256:{}", hex_sha256(&good)), "bytes": good.len()})
    );
    let notes = test::TestRequest::get().uri("/api/skills/demo/files/notes.md").to_request();
    assert_eq!(test::call_and_read_body(&app, notes).await, "fetched");
    // Its version records the digest it was checked against.
    let versions: Value =
        test::call_and_read_body_json(&app, test::TestRequest::get().uri("/api/skills/demo/versions").to_request())
            .await;
    assert_eq!(versions["versions"][0]["digest"], format!("sha256:{}", hex_sha256(&good)));
    assert_eq!(origin.asked.lock().unwrap().len(), 2);
}

#[actix_web::test]
async fn redirects_are_followed_only_to_allowed_hosts_and_only_so_often() {
    let good = archive("after redirects");
    let mut replies = vec![
        ("/demo.zip".to_string(), Reply::Bytes(good.clone())),
        ("/away".to_string(), Reply::Redirect("https://skills.example.invalid/demo.zip".into())),
        ("/plain".to_string(), Reply::Redirect("http://skills.example.invalid/demo.zip".into())),
    ];
    // `/hop-N` is N redirects from the archive.
    replies.push(("/hop-1".into(), Reply::Redirect("/demo.zip".into())));
    for n in 2..=MAX_REDIRECTS + 1 {
        replies.push((format!("/hop-{n}"), Reply::Redirect(format!("/hop-{}", n - 1))));
    }
    let origin = origin(replies).await;
    let dir = tempfile::tempdir().unwrap();
    let running = TestServer::scripted(Vec::<String>::new())
        .skills(config(dir.path(), &["127.0.0.1", "*.example.org"]))
        .start()
        .await
        .unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let sha256 = hex_sha256(&good);

    // Off the list: refused before anything is sent there.
    let away = format!("{}/away", origin.base);
    let response = test::call_service(&app, install(json!({"url": away, "sha256": sha256}))).await;
    assert_eq!(response.status(), 403);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(
        body["error"],
        format!("{away} redirected, and the redirect to https://skills.example.invalid/demo.zip is on skills.example.invalid, which is not in --skills-install-domains (127.0.0.1, *.example.org)")
    );
    let plain = format!("{}/plain", origin.base);
    let response = test::call_service(&app, install(json!({"url": plain, "sha256": sha256}))).await;
    assert_eq!(response.status(), 403);
    assert_eq!(installed(dir.path()), Vec::<String>::new());

    // At the limit the archive arrives; one more redirect is refused.
    let at_limit = format!("{}/hop-{MAX_REDIRECTS}", origin.base);
    let response = test::call_service(&app, install(json!({"url": at_limit, "sha256": sha256}))).await;
    assert_eq!(response.status(), 201);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["source"]["url"], format!("{}/demo.zip", origin.base));
    let past = format!("{}/hop-{}", origin.base, MAX_REDIRECTS + 1);
    let response = test::call_service(&app, install(json!({"url": past, "sha256": sha256, "overwrite": true}))).await;
    assert_eq!(response.status(), 502);
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["error"], format!("{}/hop-1 redirected more than {MAX_REDIRECTS} times", origin.base));
    // The origin saw only its own paths.
    assert!(origin.asked.lock().unwrap().iter().all(|path| path.starts_with('/')));
}

#[actix_web::test]
async fn bad_requests_and_hosts_off_the_list_are_refused_with_a_reason() {
    let origin = origin(vec![("/demo.zip".into(), Reply::Bytes(archive("x")))]).await;
    let dir = tempfile::tempdir().unwrap();
    let running =
        TestServer::scripted(Vec::<String>::new()).skills(config(dir.path(), &["example.com"])).start().await.unwrap();
    let app = test::init_service(App::new().app_data(running.state.clone()).configure(configure)).await;
    let url = format!("{}/demo.zip", origin.base);
    let sha256 = "a".repeat(64);
    let cases = [
        (
            json!({"url": url, "sha256": sha256}),
            403,
            format!("the URL {url} is on 127.0.0.1, which is not in --skills-install-domains (example.com)"),
        ),
        (
            json!({"url": "https://example.com/demo.tar.gz?x", "sha256": "abc"}),
            400,
            "'abc' is not a SHA-256 digest: give 64 hexadecimal digits, optionally after 'sha256:'".to_string(),
        ),
        (
            json!({"url": "http://example.com/demo.zip", "sha256": sha256}),
            403,
            "the URL http://example.com/demo.zip uses plain HTTP; installs fetch over HTTPS (HTTP only from this machine)"
                .to_string(),
        ),
        (json!({"url": "not a url", "sha256": sha256}), 400, "'not a url' is not a URL: relative URL without a base".into()),
    ];
    for (body, status, message) in cases {
        let response = test::call_service(&app, install(body.clone())).await;
        assert_eq!(response.status(), status, "{body}");
        let answer: Value = test::read_body_json(response).await;
        assert_eq!(answer["error"], message, "{body}");
    }
    for body in [
        json!({"url": url}),
        json!({"url": url, "sha256": sha256, "mirror": true}),
        json!({"url": 5, "sha256": sha256}),
    ] {
        let response = test::call_service(&app, install(body.clone())).await;
        assert_eq!(response.status(), 400, "{body}");
    }
    assert!(origin.asked.lock().unwrap().is_empty(), "a refused URL was fetched");

    // With no list at all, installs by URL are off.
    let off_dir = tempfile::tempdir().unwrap();
    let off = TestServer::scripted(Vec::<String>::new()).skills(config(off_dir.path(), &[])).start().await.unwrap();
    let app = test::init_service(App::new().app_data(off.state.clone()).configure(configure)).await;
    let response = test::call_service(&app, install(json!({"url": url, "sha256": sha256}))).await;
    assert_eq!(response.status(), 403);
    let answer: Value = test::read_body_json(response).await;
    assert!(answer["error"].as_str().unwrap().contains("list the hosts to fetch from with --skills-install-domains"));

    // A missing archive is the other server's answer.
    let served = TestServer::scripted(Vec::<String>::new())
        .skills(config(off_dir.path(), &["127.0.0.1"]))
        .start()
        .await
        .unwrap();
    let app = test::init_service(App::new().app_data(served.state.clone()).configure(configure)).await;
    let gone = format!("{}/gone.zip", origin.base);
    let response = test::call_service(&app, install(json!({"url": gone, "sha256": sha256}))).await;
    assert_eq!(response.status(), 502);
    let answer: Value = test::read_body_json(response).await;
    assert_eq!(answer["error"], format!("{gone} answered 404 Not Found"));
}

#[actix_web::test]
async fn a_fetch_reads_up_to_its_limit_and_not_a_byte_more() {
    let origin = origin(vec![
        ("/full.json".into(), Reply::Bytes(vec![b' '; MAX_INDEX_BYTES as usize])),
        ("/over.json".into(), Reply::Bytes(vec![b' '; MAX_INDEX_BYTES as usize + 1])),
    ])
    .await;
    let domains = Domains::parse(&["127.0.0.1".to_string()]).unwrap();
    let mut kept = Vec::new();
    let fetched =
        fetch::fetch(&format!("{}/full.json", origin.base), &domains, MAX_INDEX_BYTES, &mut kept).await.unwrap();
    assert_eq!((fetched.bytes, kept.len() as u64), (MAX_INDEX_BYTES, MAX_INDEX_BYTES));
    let over = fetch::fetch(&format!("{}/over.json", origin.base), &domains, MAX_INDEX_BYTES, &mut Vec::new()).await;
    assert!(matches!(over, Err(FetchError::TooLarge(_))), "{over:?}");
}

/// A name goes through the fetch's own resolver: `localhost` reaches this
/// machine (any other name resolving here is refused, as the resolver's
/// unit tests show).
#[actix_web::test]
async fn a_fetch_by_name_resolves_through_the_guard() {
    let origin = origin(vec![("/index.json".into(), Reply::Bytes(b"{}".to_vec()))]).await;
    let by_name = origin.base.replace("127.0.0.1", "localhost");
    let domains = Domains::parse(&["localhost".to_string()]).unwrap();
    let fetched = fetch::fetch(&format!("{by_name}/index.json"), &domains, MAX_INDEX_BYTES, &mut Vec::new()).await;
    assert_eq!(fetched.unwrap().bytes, 2);
}

/// A server publishing the skill `shared` (with a script) found in a root.
async fn publisher(root: &Path, publish: Publish) -> crate::http::test_server::Running {
    let skill = root.join("shared");
    std::fs::create_dir_all(skill.join("scripts")).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: shared\ndescription: Published for others.\n---\nRun scripts/go.sh.\n",
    )
    .unwrap();
    std::fs::write(skill.join("scripts/go.sh"), "#!/bin/sh\necho shared\n").unwrap();
    std::fs::set_permissions(skill.join("scripts/go.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hidden = root.join("private");
    std::fs::create_dir_all(&hidden).unwrap();
    std::fs::write(hidden.join("SKILL.md"), "---\nname: private\ndescription: Not published.\n---\nBody.\n").unwrap();
    let roots = vec![Root { path: root.to_path_buf(), origin: Origin::Discovered }];
    let config = SkillsConfig { publish, ..skills_config(roots, None, Vec::new()) };
    TestServer::scripted(Vec::<String>::new()).skills(config).start().await.unwrap()
}

#[actix_web::test]
async fn a_server_installs_what_another_publishes() {
    let root = tempfile::tempdir().unwrap();
    let only = Publish::Only(["shared".to_string()].into());
    let publishing = publisher(root.path(), only).await;
    let base = serve(publishing.state.clone());
    let domains = Domains::parse(&["127.0.0.1".to_string()]).unwrap();

    // The index, read over the socket as another server reads it.
    let mut bytes = Vec::new();
    fetch::fetch(&format!("{base}/.well-known/agent-skills/index.json"), &domains, MAX_INDEX_BYTES, &mut bytes)
        .await
        .unwrap();
    let index: Value = serde_json::from_slice(&bytes).unwrap();
    let mut archive = Vec::new();
    let fetched =
        fetch::fetch(&format!("{base}/.well-known/agent-skills/shared.zip"), &domains, u64::MAX, &mut archive)
            .await
            .unwrap();
    assert_eq!(
        index,
        json!({"$schema": SCHEMA, "skills": [{
            "name": "shared",
            "type": "archive",
            "description": "Published for others.",
            "url": "/.well-known/agent-skills/shared.zip",
            "digest": format!("sha256:{}", fetched.sha256),
        }]})
    );
    // The same bytes every time: the digest stays true.
    let mut again = Vec::new();
    fetch::fetch(&format!("{base}/.well-known/agent-skills/shared.zip"), &domains, u64::MAX, &mut again).await.unwrap();
    assert_eq!(again, archive);

    // What is not published is not there.
    let app = test::init_service(App::new().app_data(publishing.state.clone()).configure(configure)).await;
    for uri in [
        "/.well-known/agent-skills/private.zip",
        "/.well-known/agent-skills/shared",
        "/.well-known/agent-skills/x/../private.zip",
    ] {
        let response = test::call_service(&app, test::TestRequest::get().uri(uri).to_request()).await;
        assert_eq!(response.status(), 404, "{uri}");
    }

    // Another server installs it by URL and digest.
    let dir = tempfile::tempdir().unwrap();
    let installing =
        TestServer::scripted(Vec::<String>::new()).skills(config(dir.path(), &["127.0.0.1"])).start().await.unwrap();
    let app = test::init_service(App::new().app_data(installing.state.clone()).configure(configure)).await;
    let url = format!("{base}{}", index["skills"][0]["url"].as_str().unwrap());
    let response = test::call_service(&app, install(json!({"url": url, "sha256": index["skills"][0]["digest"]}))).await;
    assert_eq!(response.status(), 201);
    let script = test::TestRequest::get().uri("/api/skills/shared/files/scripts/go.sh").to_request();
    assert_eq!(test::call_and_read_body(&app, script).await, "#!/bin/sh\necho shared\n");
    let live = std::fs::canonicalize(dir.path().join("shared/scripts/go.sh")).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(live).unwrap().permissions());
    assert_eq!(mode & 0o111, 0o111, "the script lost its executable bit");

    // A server that publishes nothing has no index.
    let quiet_root = tempfile::tempdir().unwrap();
    let quiet = publisher(quiet_root.path(), Publish::Nothing).await;
    let app = test::init_service(App::new().app_data(quiet.state.clone()).configure(configure)).await;
    let response =
        test::call_service(&app, test::TestRequest::get().uri("/.well-known/agent-skills/index.json").to_request())
            .await;
    assert_eq!(response.status(), 404);
}

/// `skillhost skills add`, as the command line runs it, on its own thread
/// (it runs its own fetcher).
async fn skills_add(args: SkillsAddArgs) -> Result<(String, bool), String> {
    web::block(move || crate::skills_cli::add(args)).await.unwrap()
}

fn add_args(install: &Path, url: String, sha256: Option<String>) -> SkillsAddArgs {
    SkillsAddArgs {
        skills: SkillArgs {
            skills_dir: vec![install.parent().unwrap().join("none")],
            skills_install_dir: Some(install.to_path_buf()),
            skills_install_domains: vec!["127.0.0.1".into()],
            ..SkillArgs::default()
        },
        url: Some(url),
        sha256,
        ..SkillsAddArgs::default()
    }
}

#[actix_web::test]
async fn skills_add_installs_from_an_index_or_an_archive_and_its_digest() {
    let root = tempfile::tempdir().unwrap();
    let publishing = publisher(root.path(), Publish::Everything).await;
    let base = serve(publishing.state.clone());
    let target = tempfile::tempdir().unwrap();
    std::fs::create_dir(target.path().join("none")).unwrap();
    let install = target.path().join("installed");

    let (report, ok) = skills_add(add_args(&install, base.clone(), None)).await.unwrap();
    assert!(ok, "{report}");
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), 2, "{report}");
    assert!(
        lines[0].starts_with(&format!(
            "installed private version 1 from {base}/.well-known/agent-skills/private.zip (sha256:"
        )),
        "{report}"
    );
    assert!(lines[1].starts_with("installed shared version 1 from "), "{report}");
    assert_eq!(std::fs::read_to_string(install.join("shared/scripts/go.sh")).unwrap(), "#!/bin/sh\necho shared\n");

    // Again: the names are taken, and nothing changes without --overwrite.
    let (report, ok) = skills_add(add_args(&install, base.clone(), None)).await.unwrap();
    assert!(!ok);
    assert!(report.lines().all(|line| line.starts_with("not installed: ")), "{report}");

    // An archive by URL needs its digest, and a wrong one installs nothing.
    let archive_url = format!("{base}/.well-known/agent-skills/shared.zip");
    let refused = skills_add(add_args(&install, archive_url.clone(), None)).await.unwrap_err();
    assert_eq!(refused, format!("{archive_url} is an archive: give its digest with --sha256"));
    let mut args = add_args(&install, archive_url.clone(), Some("1".repeat(64)));
    args.overwrite = true;
    let (report, ok) = skills_add(args).await.unwrap();
    assert!(!ok);
    assert!(report.contains("has the digest sha256:"), "{report}");
    assert_eq!(skillhost_actors::skills::versions::history(&install, "shared").versions.len(), 1);
}

/// An index entry whose archive holds another skill than the entry names
/// is refused: with --overwrite it would otherwise replace a skill the
/// operator never chose.
#[actix_web::test]
async fn skills_add_refuses_an_entry_whose_archive_holds_another_skill() {
    let root = tempfile::tempdir().unwrap();
    let publishing = publisher(root.path(), Publish::Everything).await;
    let base = serve(publishing.state.clone());
    let domains = Domains::parse(&["127.0.0.1".to_string()]).unwrap();
    let mut index = Vec::new();
    fetch::fetch(&format!("{base}{INDEX_PATH}"), &domains, MAX_INDEX_BYTES, &mut index).await.unwrap();
    let mut index: Value = serde_json::from_slice(&index).unwrap();
    let skills = index["skills"].as_array_mut().unwrap();
    skills.retain(|entry| entry["name"] == "shared");
    skills[0]["name"] = json!("private");
    skills[0]["url"] = json!(format!("{base}/.well-known/agent-skills/shared.zip"));
    let mislabelled = origin(vec![(INDEX_PATH.into(), Reply::Bytes(index.to_string().into_bytes()))]).await;

    let target = tempfile::tempdir().unwrap();
    std::fs::create_dir(target.path().join("none")).unwrap();
    let install = target.path().join("installed");
    let mut args = add_args(&install, mislabelled.base.clone(), None);
    args.overwrite = true;
    let (report, ok) = skills_add(args).await.unwrap();
    assert!(!ok, "{report}");
    assert!(report.contains("the archive holds the skill 'shared', not 'private'"), "{report}");
    assert!(installed(&install).is_empty(), "{report}");
}
