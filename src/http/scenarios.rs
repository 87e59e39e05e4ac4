//! Scenario tests of the agentic loop over the HTTP surface, with a scripted
//! model: each folder under `tests/scenarios/` holds `request.json` (the
//! OpenAI request) and `script.json` (the chat template, loop settings and
//! the outputs the model "generates"). The runner sends the request streamed
//! and not, checks that both carry the same text, and compares the prompts
//! the model saw plus the answer (`transcript.txt`) and the SSE stream
//! (`stream.sse`) with the expected files. `UPDATE_SCENARIOS=1` rewrites them.
//!
//! An output may be an object `{"agent": "/root/1", "output": "…",
//! "delay_ms": N, "panic": true}`: meant for that child agent (a panic
//! stands for a bug that crashes the child's loop) (plain strings are the
//! request's own model's). `agent_limits` and `agents_allow_write` set the
//! bounds on children; the transcript shows each agent's prompts in turn.
//! `n_ctx` gives the model a smaller context it enforces, and a scenario's
//! own `skills/` folder adds skills to the shared ones.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix_web::{test, App};
use serde_json::Value;
use skillhost_actors::chat_loop::{LoopSettings, MultiAgent};
use skillhost_actors::model::scripted::{ScriptedBackend, ScriptedOutput};
use skillhost_actors::skills::{Origin, Root};

use crate::http::configure;
use crate::http::test_server::{skills_config, TestServer};

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

struct Run {
    body: Vec<u8>,
    /// Each agent's prompts, in order, agents sorted by id.
    prompts: Vec<(String, Vec<String>)>,
}

fn outputs(script: &Value) -> Vec<ScriptedOutput> {
    script["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|output| match output {
            Value::String(text) => ScriptedOutput::from(text.clone()),
            object => ScriptedOutput {
                agent: object["agent"].as_str().unwrap().into(),
                text: object["output"].as_str().unwrap_or_default().into(),
                delay: std::time::Duration::from_millis(object["delay_ms"].as_u64().unwrap_or(0)),
                panic: object["panic"].as_bool().unwrap_or(false),
                stall_after: None,
                gate: None,
            },
        })
        .collect()
}

fn loop_settings(script: &Value) -> LoopSettings {
    let mut settings =
        LoopSettings { max_rounds: script["max_rounds"].as_u64().unwrap() as u32, ..LoopSettings::default() };
    let limits = &script["agent_limits"];
    let number = |key: &str| limits[key].as_u64();
    let agents = &mut settings.agent_limits;
    agents.per_request = number("per_request").map_or(agents.per_request, |n| n as usize);
    agents.depth = number("depth").map_or(agents.depth, |n| n as usize);
    agents.open = number("open").map_or(agents.open, |n| n as usize);
    agents.rounds = number("rounds").map_or(agents.rounds, |n| n as u32);
    agents.tokens = number("tokens").map_or(agents.tokens, |n| n as u32);
    agents.wall_time = number("wall_time_ms").map_or(agents.wall_time, std::time::Duration::from_millis);
    settings.agents_allow_write = script["agents_allow_write"].as_bool().unwrap_or(false);
    settings.multi_agent = match script["multi_agent"].as_str() {
        Some("always") => MultiAgent::Always,
        Some("off") => MultiAgent::Off,
        _ => MultiAgent::Auto,
    };
    settings
}

async fn run(dir: &Path, script: &Value, request: &Value, stream: bool) -> Run {
    // `"n_ctx"` shrinks the context (the budget's scenarios), and the
    // scripted model then refuses a prompt past it, as the engine does.
    let n_ctx = script["n_ctx"].as_u64().map_or(8192, |n| n as u32);
    let backend = ScriptedBackend::for_agents(
        script["template"].as_str(),
        script["architecture"].as_str().unwrap(),
        n_ctx,
        outputs(script),
    )
    .unwrap();
    let backend = Arc::new(if script["n_ctx"].is_u64() { backend.limiting_context() } else { backend });
    // The shared skills, and a scenario's own when it has a `skills/` folder.
    let mut roots = vec![Root { path: dir.parent().unwrap().join("skills"), origin: Origin::Discovered }];
    if dir.join("skills").is_dir() {
        roots.push(Root { path: dir.join("skills"), origin: Origin::Discovered });
    }
    // `"selected"`: the operator's `--skill` selection.
    let selected = script["selected"]
        .as_array()
        .map(|ids| ids.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let server = TestServer::on(backend.clone()).skills(skills_config(roots, None, selected));
    let state = server.settings(loop_settings(script)).start().await.unwrap().state;
    let app = test::init_service(App::new().app_data(state.clone()).configure(configure)).await;
    let mut request = request.clone();
    request["stream"] = Value::Bool(stream);
    let response =
        test::call_service(&app, test::TestRequest::post().uri("/v1/chat/completions").set_json(request).to_request())
            .await;
    let body = test::read_body(response).await.to_vec();
    state.server.shutdown();
    let mut prompts: Vec<(String, Vec<String>)> = Vec::new();
    for (agent, prompt) in backend.agents().into_iter().zip(backend.prompts()) {
        match prompts.iter_mut().find(|(known, _)| *known == agent) {
            Some((_, list)) => list.push(prompt),
            None => prompts.push((agent, vec![prompt])),
        }
    }
    prompts.sort_by(|a, b| a.0.cmp(&b.0));
    Run { body, prompts }
}

/// Replaces what changes from run to run (ids, times, durations).
fn normalize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match key.as_str() {
                    "id" | "tool_call_id"
                        if item.as_str().is_some_and(|s| s.starts_with("chatcmpl-") || s.starts_with("call_")) =>
                    {
                        *item = Value::String(
                            if item.as_str().unwrap().starts_with("call_") { "call_*" } else { "chatcmpl-*" }.into(),
                        )
                    }
                    "created" => *item = Value::from(0),
                    key if key.ends_with("_ms") || key.ends_with("per_second") => *item = Value::from(0),
                    _ => normalize(item),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
    // Children report in the order they finish, which runs side by side;
    // each agent's rounds keep their order.
    if let Some(rounds) = value.get_mut("rounds").and_then(Value::as_array_mut) {
        rounds.sort_by(|a, b| a["agent_id"].as_str().cmp(&b["agent_id"].as_str()));
    }
}

fn sse_payloads(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body).split("\n\n").filter_map(|f| f.strip_prefix("data: ").map(str::to_string)).collect()
}

fn check(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_SCENARIOS").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|_| panic!("{} is missing; run with UPDATE_SCENARIOS=1 to create it", path.display()));
    pretty_assertions::assert_eq!(expected, actual, "{}", path.display());
}

#[actix_web::test]
async fn scenarios() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("script.json").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 12, "scenario folders are missing");
    for dir in dirs {
        let script: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("script.json")).unwrap()).unwrap();
        let request: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("request.json")).unwrap()).unwrap();
        let streamed = run(&dir, &script, &request, true).await;
        let whole = run(&dir, &script, &request, false).await;
        assert_eq!(streamed.prompts, whole.prompts, "{}: the prompts differ between streamed and not", dir.display());

        let mut answer: Value = serde_json::from_slice(&whole.body).unwrap();
        normalize(&mut answer);
        let mut chunks: Vec<Value> = Vec::new();
        let mut sse = String::new();
        for payload in sse_payloads(&streamed.body) {
            if payload == "[DONE]" {
                sse.push_str("data: [DONE]\n\n");
                continue;
            }
            let mut chunk: Value = serde_json::from_str(&payload).unwrap();
            normalize(&mut chunk);
            sse.push_str(&format!("data: {chunk}\n\n"));
            chunks.push(chunk);
        }
        let streamed_text: String =
            chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        let whole_text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default();
        assert_eq!(streamed_text, whole_text, "{}: the stream differs from the answer", dir.display());

        let mut transcript = String::new();
        for (agent, prompts) in &whole.prompts {
            let agent = if agent == "/root" { String::new() } else { format!("{agent} ") };
            for (round, prompt) in prompts.iter().enumerate() {
                transcript.push_str(&format!("===== {agent}round {} prompt =====\n{prompt}\n", round + 1));
            }
        }
        transcript.push_str(&format!("===== response =====\n{}\n", serde_json::to_string_pretty(&answer).unwrap()));
        check(&dir.join("transcript.txt"), &transcript);
        check(&dir.join("stream.sse"), &sse);
    }
}

/// A turn that called our tools before the caller's carries those rounds in
/// `skillhost_messages` and the calls' raw text in `skillhost_raw`; resent
/// with the caller's result, they render the next prompt so that it starts
/// with exactly what the first turn left in the KV cache (its last prompt
/// and the text generated after it).
#[actix_web::test]
async fn replayed_server_turns_keep_the_prefix() {
    let dir = scenarios_dir().join("10-caller-skills-read");
    let script = |outputs: Vec<&str>| {
        serde_json::json!({
            "template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "architecture": "llama",
            "max_rounds": 8,
            "outputs": outputs,
        })
    };
    let read = "<tool_call>\n{\"name\": \"skills_read\",   \"arguments\": {\"skill\": \"notes\"}}\n</tool_call>";
    let weather =
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":  \"Oslo\"}}\n</tool_call>";
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let mut request = serde_json::json!({
        "messages": [{"role": "user", "content": "Weather in Oslo, in the house style."}],
        "skills": ["notes"],
        "tools": tools,
        "temperature": 0,
    });
    let first = run(&dir, &script(vec![read, weather]), &request, false).await;
    let answer: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls", "{answer}");
    let message = answer["choices"][0]["message"].clone();
    assert_eq!(message["skillhost_raw"], weather, "{answer}");
    let replay = answer["skillhost_messages"].as_array().unwrap().clone();
    assert_eq!(replay.len(), 2, "{answer}");
    assert_eq!(replay[0]["tool_calls"][0]["function"]["name"], "skills_read");
    assert_eq!(replay[0]["skillhost_raw"], read);
    assert_eq!(replay[1]["role"], "tool");
    assert!(replay[1]["content"].as_str().unwrap().contains("House rules"), "{answer}");

    let call_id = message["tool_calls"][0]["id"].clone();
    let messages = request["messages"].as_array_mut().unwrap();
    messages.extend(replay);
    messages.push(message);
    messages.push(serde_json::json!({"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C."}));
    let second = run(&dir, &script(vec!["It is sunny in Oslo."]), &request, false).await;
    let turn_one = &first.prompts[0].1;
    let cached = format!("{}{weather}", turn_one.last().unwrap());
    let next = &second.prompts[0].1[0];
    assert!(
        next.starts_with(&cached),
        "the replayed prompt left the cached prefix:\n--- cached\n{cached}\n--- next\n{next}"
    );

    // Without the raw text the calls are re-rendered, and the prefix breaks
    // where the model's own spacing was: the field is what keeps it.
    let mut plain = request.clone();
    for message in plain["messages"].as_array_mut().unwrap() {
        message.as_object_mut().unwrap().remove("skillhost_raw");
    }
    let third = run(&dir, &script(vec!["It is sunny in Oslo."]), &plain, false).await;
    assert!(!third.prompts[0].1[0].starts_with(&cached));

    // Only an assistant turn may carry the field.
    let mut wrong = request.clone();
    wrong["messages"][0]["skillhost_raw"] = serde_json::json!("x");
    let refused = run(&dir, &script(vec![]), &wrong, false).await;
    let error: Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(error["error"]["message"], "messages[0] has skillhost_raw but only assistant messages can", "{error}");
}
