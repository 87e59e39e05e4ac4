//! MCP on the HTTP side, both ways. `GET /api/mcp` shows the operator's
//! MCP servers: each with its state, its tools (and those left out, with
//! why), its resources and its prompts; `?start=true` starts idle servers
//! first. `POST /mcp` makes skillhost an MCP server of its skills.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use skillhost_actors::path_guard;
use skillhost_actors::sandbox::ExecRuntime;
use skillhost_actors::skills::{Skill, Snapshot};
use skillhost_actors::tools::skills::{self as skill_tools, ToolContext};
use skillhost_actors::tools::Tool;

use crate::http::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    start: bool,
}

/// `GET /api/mcp`.
pub async fn api_list(state: web::Data<AppState>, query: web::Query<ListQuery>) -> HttpResponse {
    let servers = match state.server.mcp() {
        Some(hub) => hub.report(query.start).await,
        None => Vec::new(),
    };
    HttpResponse::Ok().json(json!({ "servers": servers }))
}

/// Protocol versions `POST /mcp` speaks, newest first; a client asking for
/// another gets the newest, as the specification says.
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The MCP Skills extension's identifier (SEP-2640).
pub const SKILLS_EXTENSION: &str = "io.modelcontextprotocol/skills";
/// Largest skill file `resources/read` returns; a bigger one is an error
/// naming its size (skills_read pages through text instead).
pub const MAX_RESOURCE_BYTES: u64 = 8 * 1024 * 1024;
/// A skill whose files together pass this is listed with `"dynamic"`
/// resources instead of a digest of every file.
pub const MAX_DIGESTED_SKILL_BYTES: u64 = 16 * 1024 * 1024;

/// JSON-RPC error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
/// In JSON-RPC's range for a server's own errors: at capacity, retry.
const SERVER_BUSY: i64 = -32000;

fn rpc_error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// `POST /mcp`: skillhost as an MCP server (streamable HTTP, answered as
/// JSON, no session), serving the skills registry as `skill://` resources,
/// the Skills extension's `skills/list` and `skills/get`, and the plain
/// tools `skills_list` and `skills_read` for clients without it. Behind the
/// same keys and origin checks as every route.
pub async fn serve(state: web::Data<AppState>, request: HttpRequest, payload: web::Payload) -> HttpResponse {
    let body = match crate::http::body::read_limited(
        payload,
        crate::http::body::content_length(&request),
        crate::http::body::MAX_JSON_BODY_BYTES,
    )
    .await
    {
        Ok(body) => body,
        Err(err) => {
            return HttpResponse::PayloadTooLarge().json(rpc_error(&Value::Null, INVALID_REQUEST, err.to_string()))
        }
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(message) => message,
        Err(err) => {
            let error = rpc_error(&Value::Null, PARSE_ERROR, format!("the body is not valid JSON: {err}"));
            return HttpResponse::BadRequest().json(error);
        }
    };
    let Some(fields) = message.as_object() else {
        let error = rpc_error(
            &Value::Null,
            INVALID_REQUEST,
            "send one JSON-RPC message as an object (batches are not part of MCP)",
        );
        return HttpResponse::BadRequest().json(error);
    };
    let method = fields.get("method").and_then(Value::as_str);
    let Some(id) = fields.get("id").cloned() else {
        // A notification (initialized, cancelled) or a response: nothing to say.
        return HttpResponse::Accepted().finish();
    };
    let Some(method) = method else {
        return HttpResponse::BadRequest().json(rpc_error(&id, INVALID_REQUEST, "a request needs a method"));
    };
    let params = fields.get("params").cloned().unwrap_or(Value::Null);
    let snapshot = state.server.skills().map_or_else(|| Arc::new(Snapshot::default()), |skills| skills.snapshot());
    let runner = state.server.script_runner().cloned();
    let answer = match (method, runner) {
        // A script runs in the sandbox, asynchronously; everything else is
        // a read of the registry.
        // A script takes an admission place, as a turn does: clients of
        // this route cannot run more at once than the server takes turns.
        ("tools/call", Some(exec)) if params.get("name").and_then(Value::as_str) == Some("skills_run") => {
            let _permit = match state.admission.admit() {
                Ok(permit) => permit,
                Err(refused) => {
                    let retry = crate::http::access::RETRY_AFTER_SECONDS.to_string();
                    return HttpResponse::ServiceUnavailable()
                        .insert_header((actix_web::http::header::RETRY_AFTER, retry))
                        .json(rpc_error(&id, SERVER_BUSY, refused.to_string()));
                }
            };
            run_script(&exec, &params, &snapshot).await
        }
        (_, runner) => {
            let method = method.to_string();
            let scripts = runner.is_some();
            tokio::task::spawn_blocking(move || answer(&method, &params, &snapshot, scripts))
                .await
                .unwrap_or_else(|_| Err((INVALID_REQUEST, "the request failed".to_string())))
        }
    };
    HttpResponse::Ok().json(match answer {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => rpc_error(&id, code, message),
    })
}

type Answer = Result<Value, (i64, String)>;

/// Answers one request; `scripts` when `skills_run` is offered.
fn answer(method: &str, params: &Value, snapshot: &Arc<Snapshot>, scripts: bool) -> Answer {
    match method {
        "initialize" => {
            let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
            let version = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&PROTOCOL_VERSIONS[0]);
            Ok(json!({
                "protocolVersion": version,
                "capabilities": {
                    "tools": {"listChanged": false},
                    "resources": {"listChanged": false},
                    "extensions": {SKILLS_EXTENSION: {}},
                },
                "serverInfo": {"name": "skillhost", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "Agent Skills served by skillhost. List them with skills/list (or the skills_list tool), then read a skill's SKILL.md and its files with resources/read (or skills_read).",
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tool_declarations(snapshot, scripts)})),
        "tools/call" => call_tool(params, snapshot, scripts),
        "resources/list" => Ok(json!({"resources": resource_list(snapshot)})),
        "resources/templates/list" => Ok(json!({"resourceTemplates": []})),
        "resources/read" => read_resource(params, snapshot),
        "prompts/list" => Ok(json!({"prompts": []})),
        "skills/list" => {
            Ok(json!({"skills": snapshot.skills.values().map(|skill| manifest(skill)).collect::<Vec<_>>()}))
        }
        "skills/get" => {
            let uri = params.get("uri").and_then(Value::as_str).unwrap_or_default();
            let (skill, _) = by_uri(snapshot, uri)?;
            Ok(json!({"skill": manifest(skill)}))
        }
        other => Err((METHOD_NOT_FOUND, format!("this server does not answer '{other}'"))),
    }
}

/// Every registered skill, for the plain tools.
fn context(snapshot: &Arc<Snapshot>, scripts: bool) -> ToolContext {
    ToolContext {
        snapshot: Arc::clone(snapshot),
        reachable: snapshot.skills.keys().cloned().collect(),
        allow_exec: scripts,
    }
}

fn tool_declarations(snapshot: &Arc<Snapshot>, scripts: bool) -> Vec<Value> {
    let context = context(snapshot, scripts);
    skill_tools::declarations(scripts, &context.reachable)
        .into_iter()
        .map(|tool| json!({"name": tool.name, "description": tool.description, "inputSchema": tool.parameters}))
        .collect()
}

fn call_tool(params: &Value, snapshot: &Arc<Snapshot>, scripts: bool) -> Answer {
    let call = tool_call(params, scripts)?;
    let tool = Tool::from_name(&call.name).unwrap_or(Tool::SkillsList);
    Ok(tool_result(&skill_tools::answer(&context(snapshot, scripts), tool, &call)))
}

/// A `tools/call` request as the call our tools answer, when it names one
/// this server offers.
fn tool_call(params: &Value, scripts: bool) -> Result<skillhost_engine::ToolCall, (i64, String)> {
    let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
    let offered = match Tool::from_name(name) {
        Some(Tool::SkillsList | Tool::SkillsRead) => true,
        Some(Tool::SkillsRun) => scripts,
        _ => false,
    };
    if !offered {
        let tools = if scripts { "skills_list, skills_read and skills_run" } else { "skills_list and skills_read" };
        return Err((INVALID_PARAMS, format!("there is no tool called '{name}'; the tools are {tools}")));
    }
    let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
    if !arguments.is_object() {
        return Err((INVALID_PARAMS, "arguments must be an object".into()));
    }
    Ok(skillhost_engine::ToolCall { id: "mcp".into(), name: name.to_string(), arguments: arguments.to_string() })
}

fn tool_result(answer: &skillhost_actors::tools::Answer) -> Value {
    json!({"content": [{"type": "text", "text": answer.text}], "isError": !answer.ok})
}

/// `skills_run` for an MCP client: the checks the model's call gets, then a
/// scratch folder and sandbox of its own (`--mcp-serve-scripts`).
async fn run_script(exec: &Arc<ExecRuntime>, params: &Value, snapshot: &Arc<Snapshot>) -> Answer {
    let call = tool_call(params, true)?;
    let answer = skillhost_actors::tools::skills_run::run_detached(exec, &context(snapshot, true), &call).await;
    Ok(tool_result(&answer))
}

fn skill_uri(skill: &Skill, path: &str) -> String {
    format!("skill://{}/{path}", skill.id())
}

fn resource_list(snapshot: &Snapshot) -> Vec<Value> {
    let mut resources = Vec::new();
    for skill in snapshot.skills.values() {
        resources.push(json!({
            "uri": skill_uri(skill, "SKILL.md"),
            "name": skill.id(),
            "description": skill.manifest.description,
            "mimeType": "text/markdown",
        }));
        for file in &skill.files {
            resources.push(json!({
                "uri": skill_uri(skill, &file.path),
                "name": format!("{}/{}", skill.id(), file.path),
                "mimeType": if file.text { "text/plain" } else { "application/octet-stream" },
                "size": file.bytes,
            }));
        }
    }
    resources
}

/// The skill and the path inside it a `skill://` URI names.
fn by_uri<'a>(snapshot: &'a Snapshot, uri: &'a str) -> Result<(&'a Skill, &'a str), (i64, String)> {
    let not_found = || (INVALID_PARAMS, format!("no skill resource has the URI '{uri}'"));
    let rest = uri.strip_prefix("skill://").ok_or_else(not_found)?;
    let (id, path) = rest.split_once('/').ok_or_else(not_found)?;
    let skill = snapshot.get(id).ok_or_else(not_found)?;
    Ok((skill, path))
}

/// One file's bytes, through the path guard as skills_read opens it.
fn file_bytes(skill: &Skill, path: &str, limit: u64) -> Result<(String, Vec<u8>), (i64, String)> {
    use std::io::Read;
    let opened = path_guard::open_file(&skill.root, path).map_err(|err| (INVALID_PARAMS, err.to_string()))?;
    if opened.len > limit {
        return Err((
            INVALID_PARAMS,
            format!("'{}' in skill '{}' is {} bytes, more than the {limit} a read returns; page through it with the skills_read tool", opened.relative, skill.id(), opened.len),
        ));
    }
    let mut bytes = Vec::new();
    opened
        .file
        .take(limit)
        .read_to_end(&mut bytes)
        .map_err(|err| (INVALID_PARAMS, format!("'{path}' cannot be read: {err}")))?;
    Ok((opened.relative, bytes))
}

fn read_resource(params: &Value, snapshot: &Snapshot) -> Answer {
    use base64::Engine;
    let uri = params.get("uri").and_then(Value::as_str).unwrap_or_default();
    let (skill, path) = by_uri(snapshot, uri)?;
    let (relative, bytes) = file_bytes(skill, path, MAX_RESOURCE_BYTES)?;
    let content = match String::from_utf8(bytes) {
        Ok(text) => {
            json!({"uri": skill_uri(skill, &relative), "mimeType": if relative == "SKILL.md" { "text/markdown" } else { "text/plain" }, "text": text})
        }
        Err(bytes) => json!({
            "uri": skill_uri(skill, &relative),
            "mimeType": "application/octet-stream",
            "blob": base64::engine::general_purpose::STANDARD.encode(bytes.into_bytes()),
        }),
    };
    Ok(json!({"contents": [content]}))
}

/// A skill as `skills/list` and `skills/get` give it: the URI of its
/// SKILL.md, its frontmatter, and its files with their digests (or
/// `"dynamic"` for a skill too large to hash on every listing).
fn manifest(skill: &Skill) -> Value {
    use sha2::Digest;
    let mut frontmatter = json!({"name": skill.id(), "description": skill.manifest.description});
    if !skill.manifest.allowed_tools.is_empty() {
        frontmatter["allowed-tools"] = json!(skill.manifest.allowed_tools.join(" "));
    }
    let resources = if skill.bytes > MAX_DIGESTED_SKILL_BYTES {
        json!("dynamic")
    } else {
        let paths = std::iter::once("SKILL.md".to_string()).chain(skill.files.iter().map(|f| f.path.clone()));
        let mut files = Vec::new();
        for path in paths {
            // A file that went since the scan is left out of the manifest.
            let Ok((relative, bytes)) = file_bytes(skill, &path, MAX_DIGESTED_SKILL_BYTES) else { continue };
            let digest: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
            files.push(
                json!({"uri": skill_uri(skill, &relative), "digest": format!("sha256:{digest}"), "size": bytes.len()}),
            );
        }
        Value::Array(files)
    };
    json!({"uri": skill_uri(skill, "SKILL.md"), "frontmatter": frontmatter, "resources": resources})
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillhost_actors::skills::registry::scan;
    use skillhost_actors::skills::{Origin, Root};

    const SKILL_MD: &str = "---\nname: big\ndescription: Holds a large file.\n---\n# Big\n";

    /// A registry of one skill, `big`, whose `data.bin` has `size` bytes.
    fn skill_with_file(size: u64) -> (tempfile::TempDir, Arc<Snapshot>) {
        let root = tempfile::tempdir().unwrap();
        let skill = root.path().join("big");
        std::fs::create_dir(&skill).unwrap();
        std::fs::write(skill.join("SKILL.md"), SKILL_MD).unwrap();
        std::fs::File::create(skill.join("data.bin")).unwrap().set_len(size).unwrap();
        let snapshot = scan(&[Root { path: root.path().to_path_buf(), origin: Origin::Discovered }]);
        assert!(snapshot.get("big").is_some(), "{:?}", snapshot.errors);
        (root, Arc::new(snapshot))
    }

    fn read(snapshot: &Arc<Snapshot>) -> Answer {
        answer("resources/read", &json!({"uri": "skill://big/data.bin"}), snapshot, false)
    }

    #[test]
    fn a_resource_is_read_up_to_its_limit_and_refused_one_byte_past() {
        let (_root, at) = skill_with_file(MAX_RESOURCE_BYTES);
        let contents = &read(&at).unwrap()["contents"][0];
        // Zero bytes are text to UTF-8: all of them came back.
        assert_eq!(contents["text"].as_str().unwrap().len() as u64, MAX_RESOURCE_BYTES);
        let (_root, past) = skill_with_file(MAX_RESOURCE_BYTES + 1);
        let (code, message) = read(&past).unwrap_err();
        assert_eq!(code, INVALID_PARAMS);
        assert!(message.contains(&format!("is {} bytes, more than the {MAX_RESOURCE_BYTES}", MAX_RESOURCE_BYTES + 1)));
    }

    #[test]
    fn a_skill_is_listed_with_digests_up_to_its_limit_and_as_dynamic_past_it() {
        let skill_md = SKILL_MD.len() as u64;
        let (_root, at) = skill_with_file(MAX_DIGESTED_SKILL_BYTES - skill_md);
        assert_eq!(at.get("big").unwrap().bytes, MAX_DIGESTED_SKILL_BYTES);
        let listed = manifest(at.get("big").unwrap());
        let files = listed["resources"].as_array().unwrap();
        assert_eq!(files.len(), 2);
        assert!(files.iter().all(|file| file["digest"].as_str().unwrap().starts_with("sha256:")));
        let (_root, past) = skill_with_file(MAX_DIGESTED_SKILL_BYTES - skill_md + 1);
        assert_eq!(manifest(past.get("big").unwrap())["resources"], "dynamic");
    }
}
