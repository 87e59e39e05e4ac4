//! The host's installer (`--code-exec-allow-install`) through the real
//! sandbox: installs read out of shell lines and performed from a package
//! index and npm registry this test serves on 127.0.0.1, and the hostile
//! table of code the model plants for the installer to run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{json, Value};
use skillhost_actors::chat_loop::LoopSettings;
use skillhost_actors::tools::install::InstallSettings;

use super::code_tests::{ask, call, harness, one_script_skill, start};
use super::test_server::TestServer;

/// Serves the files under `root` over HTTP on 127.0.0.1 (a folder's
/// `index.html` or `index.json`), one request per connection: the
/// package index and npm registry of the install tests.
async fn serve_folder(root: PathBuf) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let root = root.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let path = text.split(' ').nth(1).unwrap_or("/").split('?').next().unwrap_or("/").to_string();
                // A folder answers with its index page (pip) or document (npm).
                let mut file = root.join(path.trim_start_matches('/'));
                if file.is_dir() {
                    file =
                        ["index.html", "index.json"].iter().map(|n| file.join(n)).find(|f| f.exists()).unwrap_or(file);
                }
                let reply = match std::fs::read(&file).ok().filter(|_| !path.contains("..")) {
                    Some(body) => {
                        let kind = match file.extension().and_then(|e| e.to_str()) {
                            Some("html") => "text/html",
                            Some("json") => "application/json",
                            _ => "application/octet-stream",
                        };
                        let mut reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        reply.extend(body);
                        reply
                    }
                    None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
                };
                let _ = stream.write_all(&reply).await;
            });
        }
    });
    addr
}

/// Zips `tests/packages/<folder>` into a wheel of `name` 1.0 under
/// `index/simple/<name>/`, with the index pages pip reads.
fn publish_wheel(index: &Path, folder: &str, name: &str) {
    use std::io::Write;
    let module = name.replace('-', "_");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packages").join(folder).join(&module);
    let dist_info = format!("{module}-1.0.dist-info");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&source)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (format!("{module}/{}", p.file_name().unwrap().to_string_lossy()), std::fs::read(&p).unwrap()))
        .collect();
    // A `.pth` beside the module goes to the top of site-packages, where
    // Python runs its `import` lines at every start that reads that folder.
    let package = source.parent().unwrap();
    for entry in std::fs::read_dir(package).unwrap().map(|e| e.unwrap().path()) {
        if entry.extension().is_some_and(|e| e == "pth") {
            files.push((entry.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&entry).unwrap()));
        }
    }
    files.push((
        format!("{dist_info}/METADATA"),
        format!("Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n").into_bytes(),
    ));
    files.push((
        format!("{dist_info}/WHEEL"),
        b"Wheel-Version: 1.0\nGenerator: skillhost-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
    ));
    let mut record: String = files.iter().map(|(path, _)| format!("{path},,\n")).collect();
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    files.push((format!("{dist_info}/RECORD"), record.into_bytes()));
    let folder = index.join("simple").join(name);
    std::fs::create_dir_all(&folder).unwrap();
    let wheel = format!("{module}-1.0-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(folder.join(&wheel)).unwrap());
    for (path, bytes) in files {
        zip.start_file(path, zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(&bytes).unwrap();
    }
    zip.finish().unwrap();
    std::fs::write(folder.join("index.html"), format!("<a href=\"{wheel}\">{wheel}</a>\n")).unwrap();
}

/// Packs `tests/packages/<name>` (version 1.0.0) with `npm pack` into a
/// registry under `registry/`, as `base` will serve it.
fn publish_npm(registry: &Path, base: &str, name: &str) {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packages").join(name);
    let folder = registry.join(name).join("-");
    std::fs::create_dir_all(&folder).unwrap();
    let packed = Command::new("npm")
        .args(["pack", "--silent", "--ignore-scripts", "--pack-destination"])
        .arg(&folder)
        .arg(&source)
        .env("npm_config_cache", registry.join(".npm-cache"))
        .output()
        .expect("npm is installed for the install tests");
    assert!(packed.status.success(), "npm pack: {}", String::from_utf8_lossy(&packed.stderr));
    let tarball = format!("{name}-1.0.0.tgz");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(source.join("package.json")).unwrap()).unwrap();
    manifest["dist"] = json!({"tarball": format!("{base}/{name}/-/{tarball}")});
    let packument = json!({"name": name, "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": manifest}});
    // npm asks for /<name>: the folder's document.
    std::fs::write(registry.join(name).join("index.json"), packument.to_string()).unwrap();
}

/// Every test package published on an index and registry served on
/// 127.0.0.1, and the settings of a host installing from them through a
/// proxy that forwards to 127.0.0.1 alone.
struct Packages {
    folder: tempfile::TempDir,
    egress: skillhost_actors::sandbox::egress::Egress,
    settings: InstallSettings,
}

async fn packages() -> Packages {
    let folder = tempfile::tempdir().unwrap();
    let index = folder.path().join("index");
    for name in ["skillhost-probe", "skillhost-extra", "skillhost-pth"] {
        publish_wheel(&index, name, name);
    }
    let addr = serve_folder(folder.path().to_path_buf()).await;
    for name in ["skillhost-probe-js", "skillhost-scripted-js"] {
        publish_npm(&folder.path().join("npm"), &format!("http://{addr}/npm"), name);
    }
    let egress = skillhost_actors::sandbox::egress::Egress::new(vec!["127.0.0.1".into()]);
    let settings = InstallSettings {
        allowed: true,
        packages: Vec::new(),
        python_index: format!("http://{addr}/index/simple"),
        npm_registry: format!("http://{addr}/npm/"),
        proxy: Some(egress.clone()),
        npm: skillhost_actors::sandbox::interpreters::SEARCH_PATH
            .iter()
            .map(|dir| Path::new(dir).join("npm"))
            .find(|p| p.is_file()),
    };
    Packages { folder, egress, settings }
}

#[actix_web::test]
async fn the_host_installs_what_a_command_asks_for_and_what_it_was_missing() {
    let Packages { folder: packages, egress, settings: install } = packages().await;
    // A host folder anyone may write, which a link in the workspace names:
    // an installer that followed it outside the sandbox would fill it.
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let skills_base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(skills_base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let skills = one_script_skill(
        skills_base.path(),
        "use-probe",
        "greet.py",
        "import skillhost_probe\nprint('script says', skillhost_probe.greet())\n",
    );
    std::fs::write(packages.path().join("requirements.txt"), "skillhost-probe\n").unwrap();
    let interpreters = skillhost_actors::sandbox::interpreters::Interpreters::detect();
    assert!(interpreters.python().is_some(), "the install test needs python3");
    let outputs = vec![
        call("shell", json!({"command": "echo \"$PYTHONUSERBASE|$NODE_PATH|$TMPDIR|$PATH\""})),
        call(
            "shell",
            json!({"command": "pip install skillhost-probe 2>&1 | tail -1 && python -c 'import skillhost_probe; print(skillhost_probe.greet())'"}),
        ),
        // A later call and a skill's script find what the host installed.
        call(
            "shell",
            json!({"command": "python3 -c 'import skillhost_probe; print(\"later:\", skillhost_probe.greet())'"}),
        ),
        call("skills_run", json!({"skill": "use-probe", "path": "scripts/greet.py"})),
        call("shell", json!({"command": "python3 -c 'import skillhost_extra; print(skillhost_extra.VALUE)'"})),
        call(
            "shell",
            json!({"command": "npm install skillhost-probe-js && node -e \"console.log(require('skillhost-probe-js').greet())\""}),
        ),
        // Install scripts never run.
        call(
            "shell",
            json!({"command": "npm install skillhost-scripted-js && ls PREINSTALL_RAN POSTINSTALL_RAN node_modules/skillhost-scripted-js/index.js"}),
        ),
        // The workspace's package folder is a link to a host folder: the
        // install fails inside the sandbox and writes nothing there.
        call(
            "shell",
            json!({"command": format!("rm -rf .local && ln -s {} .local && echo linked", host.path().display())}),
        ),
        call("shell", json!({"command": "pip install skillhost-extra"})),
        call("shell", json!({"command": "rm -f .local && echo unlinked"})),
        // A requirements file that is a link to a host file is refused, not read.
        call("shell", json!({"command": "ln -sf /etc/passwd req.txt && echo planted"})),
        call("shell", json!({"command": "pip install -r req.txt"})),
        call("shell", json!({"command": "pip install -i https://pypi.invalid/simple skillhost-probe && echo ran"})),
        call("shell", json!({"command": "pip install skillhost-absent && echo ran"})),
        call("shell", json!({"command": "python3 -c 'import skillhost_absent'"})),
        "done".to_string(),
    ];
    let settings = LoopSettings { max_rounds: 24, allow_exec: true, ..LoopSettings::default() };
    let server = TestServer::scripted(outputs).code_exec().skills_root(&skills).settings(settings);
    let harness = start(server.exec_settings(|exec| exec.install = Some(Arc::new(install)))).await;
    let response = ask(&harness, "Install and use the probes.").await;
    assert_eq!(response["choices"][0]["message"]["content"], "done", "{response}");
    // What the host installed is not something the model produced.
    let artifacts = response["artifacts"].as_array().cloned().unwrap_or_default();
    assert!(artifacts.is_empty(), "{artifacts:?}");
    let last = harness.backend.prompts().pop().unwrap();
    // The declaration says so, and names the interpreters.
    assert!(last.contains("The host itself performs `pip install NAME`"), "{last}");
    assert!(last.contains("On this host: Python 3."), "{last}");
    let result = |marker: &str| {
        let at = last.find(marker).unwrap_or_else(|| panic!("{marker} is not in {last}"));
        last[at..].split("<|im_end|>").next().unwrap().to_string()
    };
    // The workspace's own folders come first and hold the packages.
    let env = result("$ echo");
    // (Paths inside the workspace come back relative to it.)
    assert!(env.contains(".local|") && env.contains("/node_modules|") && env.contains("/.tmp|"), "{env}");
    assert!(env.contains(".local/bin:node_modules/.bin:"), "{env}");
    // An install, read out of the line and replaced by `true`: the rest ran offline.
    let probe = result("$ pip install skillhost-probe 2>&1");
    assert!(
        probe.contains("[the host ran pip install skillhost-probe: Successfully installed skillhost-probe-1.0]"),
        "{probe}"
    );
    assert!(probe.contains("hello from the probe") && probe.contains("[exit status 0]"), "{probe}");
    let later = result("$ python3 -c 'import skillhost_probe; print(\"later:\"");
    assert!(later.contains("later: hello from the probe"), "{later}");
    let script = result("[skills_run: scripts/greet.py]");
    assert!(script.contains("script says hello from the probe"), "{script}");
    let scripted = result("$ npm install skillhost-scripted-js");
    assert!(scripted.contains("[the host ran npm install skillhost-scripted-js:"), "{scripted}");
    assert!(
        scripted.contains("PREINSTALL_RAN': No such file") && scripted.contains("POSTINSTALL_RAN': No such file"),
        "{scripted}"
    );
    assert!(scripted.contains("node_modules/skillhost-scripted-js/index.js"), "{scripted}");
    let linked = result("$ pip install skillhost-extra\n");
    assert!(linked.contains("the host's install failed"), "{linked}");
    assert_eq!(std::fs::read_dir(host.path()).unwrap().count(), 0, "the installer wrote through a link: {linked}");
    let linked_requirements = result("$ pip install -r req.txt");
    assert!(
        linked_requirements.contains("[not run]") && !linked_requirements.contains("root:"),
        "{linked_requirements}"
    );
    // A missing import, installed and the same command run again in one call.
    let extra = result("$ python3 -c 'import skillhost_extra");
    assert!(extra.contains("skillhost_extra was missing, so the host installed skillhost_extra"), "{extra}");
    assert!(extra.contains("the extra package is here") && extra.contains("[exit status 0]"), "{extra}");
    let js = result("$ npm install skillhost-probe-js");
    assert!(js.contains("[the host ran npm install skillhost-probe-js:"), "{js}");
    assert!(js.contains("hello from the js probe") && js.contains("[exit status 0]"), "{js}");
    // Refused by name, and nothing after it ran.
    let other_index = result("$ pip install -i https://pypi.invalid");
    assert!(other_index.contains("[not run] `pip install -i` changes where packages come from"), "{other_index}");
    assert!(!other_index.contains("\nran"), "{other_index}");
    let absent = result("$ pip install skillhost-absent");
    assert!(absent.contains("the host's install failed, so nothing after it on the line ran"), "{absent}");
    assert!(absent.contains("The index has no wheel of skillhost-absent"), "{absent}");
    assert!(!absent.contains("\nran\n"), "{absent}");
    let unfound = result("$ python3 -c 'import skillhost_absent'");
    assert!(unfound.contains("the host's install of skillhost_absent failed"), "{unfound}");
    assert!(unfound.contains("ModuleNotFoundError"), "the command's own output follows: {unfound}");
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(egress.stats().refused.load(Relaxed), 0, "the installer only asked for the test's server");
    assert!(egress.stats().forwarded.load(Relaxed) >= 4);
}

#[actix_web::test]
async fn with_installs_off_an_install_is_refused_in_one_sentence() {
    let outputs = vec![call("shell", json!({"command": "pip install PyYAML && echo ran"})), "done".to_string()];
    let harness = harness(outputs).await;
    ask(&harness, "Install it.").await;
    let last = harness.backend.prompts().pop().unwrap();
    assert!(last.contains("[not run] Installing packages is not enabled on this server (the operator can allow it with --code-exec-allow-install)"), "{last}");
    assert!(!last.contains("\nran"), "{last}");
}

/// Python the model plants where an installer might import it: it leaves
/// `marker` beside the workspace's user base and knocks on `api` (standing
/// for the server's own port).
fn planted(marker: &str, api: u16) -> String {
    format!(
        "import os, socket\nopen(os.path.join(os.environ.get('PYTHONUSERBASE', '/nonexistent'), '..', '{marker}'), 'w').write('ran')\ntry:\n    socket.create_connection(('127.0.0.1', {api}), 2).close()\nexcept OSError:\n    pass\n"
    )
}

/// Every place a Python or Node process reads code or settings from its
/// working folder, its home, its user site or its environment, filled by
/// the model before it asks for installs: the installer runs none of it,
/// reads none of it, and nothing reaches the server's port. (Against
/// a1d68f9 the planted `pip` ran as the installer with the host's network.)
#[actix_web::test]
async fn the_installer_runs_and_reads_nothing_the_model_wrote() {
    let Packages { folder: _packages, egress, settings: install } = packages().await;
    // Stands for the server's own port on the host's loopback.
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    api.set_nonblocking(true).unwrap();
    let port = api.local_addr().unwrap().port();
    let interpreters = skillhost_actors::sandbox::interpreters::Interpreters::detect();
    let version = interpreters.python().expect("the install test needs python3").version.clone();
    let site = format!(".local/lib/python{version}/site-packages");
    let write = |path: &str, content: &str| call("write_file", json!({"path": path, "content": content}));
    let node = format!(
        "const p = require('path');\nrequire('fs').writeFileSync(p.join(process.env.PYTHONUSERBASE || '/nonexistent', '..', 'NODE_RAN'), 'ran');\nrequire('net').connect({port}, '127.0.0.1').on('error', () => {{}});\n"
    );
    let outputs = vec![
        // `python -m pip` from the working folder, and from the user site
        // that PYTHONPATH named for every command.
        write("pip/__main__.py", &planted("PIP_TOP_RAN", port)),
        write(&format!("{site}/pip/__main__.py"), &planted("PIP_SITE_RAN", port)),
        write(&format!("{site}/pip/__init__.py"), ""),
        // Run at every start that reads the user site.
        write(&format!("{site}/usercustomize.py"), &planted("USERCUSTOMIZE_RAN", port)),
        write(&format!("{site}/sitecustomize.py"), &planted("SITECUSTOMIZE_RAN", port)),
        write(&format!("{site}/planted.pth"), &format!("import os; exec({:?})\n", planted("PTH_LINE_RAN", port))),
        write("sitecustomize.py", &planted("SITECUSTOMIZE_TOP_RAN", port)),
        // npm's project settings and package list, git's settings in HOME,
        // and a module NODE_OPTIONS would load.
        write("evil.js", &node),
        write(
            "package.json",
            "{\"name\": \"w\", \"version\": \"1.0.0\", \"dependencies\": {\"skillhost-scripted-js\": \"1.0.0\"}}\n",
        ),
        write(".gitconfig", "[core]\n\tfsmonitor = touch GIT_RAN\n"),
        call(
            "shell",
            json!({"command": "printf 'dry-run=true\\nnode-options=--require %s/evil.js\\n' \"$PWD\" > .npmrc && echo planted"}),
        ),
        // The line's own exports never reach the installer either.
        call(
            "shell",
            json!({"command": "export PYTHONPATH=\"$PWD\" PYTHONSTARTUP=\"$PWD/sitecustomize.py\" NODE_OPTIONS=\"--require $PWD/evil.js\" && pip install skillhost-probe && echo after"}),
        ),
        // A package's own .pth, then a second install that would read it.
        call("shell", json!({"command": "pip install skillhost-pth"})),
        call("shell", json!({"command": "pip install skillhost-extra"})),
        call("shell", json!({"command": "npm install skillhost-probe-js && ls node_modules"})),
        call("shell", json!({"command": "ls -a"})),
        "done".to_string(),
    ];
    let settings = LoopSettings { max_rounds: 24, allow_exec: true, ..LoopSettings::default() };
    let server = TestServer::scripted(outputs).code_exec().settings(settings);
    let harness = start(server.exec_settings(|exec| exec.install = Some(Arc::new(install)))).await;
    let response = ask(&harness, "Install the packages.").await;
    assert_eq!(response["choices"][0]["message"]["content"], "done", "{response}");
    let last = harness.backend.prompts().pop().unwrap();
    let result = |marker: &str| {
        let at = last.find(marker).unwrap_or_else(|| panic!("{marker} is not in {last}"));
        last[at..].split("<|im_end|>").next().unwrap().to_string()
    };
    // Each install did what was asked: a planted `pip` would have answered
    // instead, without installing anything.
    let probe = result("$ export PYTHONPATH");
    assert!(probe.contains("Successfully installed skillhost-probe-1.0") && probe.contains("after"), "{probe}");
    let pth = result("$ pip install skillhost-pth");
    assert!(pth.contains("Successfully installed skillhost-pth-1.0"), "{pth}");
    let extra = result("$ pip install skillhost-extra");
    assert!(extra.contains("Successfully installed skillhost-extra-1.0"), "{extra}");
    // npm read neither the model's .npmrc (dry-run) nor its package.json
    // (which would have added skillhost-scripted-js).
    let js = result("$ npm install skillhost-probe-js");
    assert!(js.contains("[the host ran npm install skillhost-probe-js:"), "{js}");
    assert!(js.contains("skillhost-probe-js") && !js.contains("skillhost-scripted-js"), "{js}");
    // Nothing planted ran: no marker, and the installer's folder is gone.
    let listing = result("$ ls -a");
    assert!(!listing.contains("_RAN") && !listing.contains(".skillhost-install-"), "{listing}");
    assert!(listing.contains("sitecustomize.py") && listing.contains(".npmrc"), "the planted files stayed: {listing}");
    assert!(api.accept().is_err(), "nothing reached the server's port");
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(egress.stats().refused.load(Relaxed), 0, "the installer only asked for the test's server");
}
