//! MCP on the HTTP side, both ways. `GET /api/mcp` shows the operator's
//! MCP servers: each with its state, its tools (and those left out, with
//! why), its resources and its prompts; `?start=true` starts idle servers
//! first. `POST /mcp` makes skillhost an MCP server of its skills.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use skillhost_actors::path_guard;
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
    let skills = state.server.skills().map(|skills| skills.snapshot());
    let answer = match skills {
        Some(snapshot) => {
            let method = method.to_string();
            tokio::task::spawn_blocking(move || answer(&method, &params, &snapshot))
                .await
                .unwrap_or_else(|_| Err((INVALID_REQUEST, "the request failed".to_string())))
        }
        None => answer(method, &params, &Arc::new(Snapshot::default())),
    };
    HttpResponse::Ok().json(match answer {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => rpc_error(&id, code, message),
    })
}

type Answer = Result<Value, (i64, String)>;

fn answer(method: &str, params: &Value, snapshot: &Arc<Snapshot>) -> Answer {
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
        "tools/list" => Ok(json!({"tools": tool_declarations(snapshot)})),
        "tools/call" => call_tool(params, snapshot),
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
fn context(snapshot: &Arc<Snapshot>) -> ToolContext {
    ToolContext {
        snapshot: Arc::clone(snapshot),
        reachable: snapshot.skills.keys().cloned().collect(),
        allow_exec: false,
    }
}

fn tool_declarations(snapshot: &Arc<Snapshot>) -> Vec<Value> {
    let context = context(snapshot);
    skill_tools::declarations(false, &context.reachable)
        .into_iter()
        .map(|tool| json!({"name": tool.name, "description": tool.description, "inputSchema": tool.parameters}))
        .collect()
}

fn call_tool(params: &Value, snapshot: &Arc<Snapshot>) -> Answer {
    let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
    let tool = match Tool::from_name(name) {
        Some(tool @ (Tool::SkillsList | Tool::SkillsRead)) => tool,
        _ => {
            return Err((
                INVALID_PARAMS,
                format!("there is no tool called '{name}'; the tools are skills_list and skills_read"),
            ))
        }
    };
    let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
    if !arguments.is_object() {
        return Err((INVALID_PARAMS, "arguments must be an object".into()));
    }
    let call =
        skillhost_engine::ToolCall { id: "mcp".into(), name: name.to_string(), arguments: arguments.to_string() };
    let answer = skill_tools::answer(&context(snapshot), tool, &call);
    Ok(json!({"content": [{"type": "text", "text": answer.text}], "isError": !answer.ok}))
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
