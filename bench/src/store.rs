//! The state folder's store. In this process: the bytes one stored turn
//! takes, one commit (synced to disk), and opening a store that holds 1,000
//! turns and 1,000 conversations of each kind against opening an empty
//! one. Through the real server: a Responses turn with `store: true`
//! against the same turn with `store: false`, alternating, so the ratio is
//! what storing adds to a turn; and the server's restart on that store
//! against a restart on an empty one.

use std::time::Instant;

use serde_json::{json, Value};
use skillhost_actors::store::conversations::{self, Conversation};
use skillhost_actors::store::responses::{put, ResponseRecord};
use skillhost_actors::store::webui::{self, SavedFile};
use skillhost_actors::store::{live_bytes, Retention, Store};

use crate::{median, ServerProcess};

/// Stored turns in the store that is opened.
const TURNS: usize = 1000;
/// Conversations (of the Conversations API) in it, four items each.
const CONVERSATIONS: usize = 1000;
/// Repetitions of each timed step; the median is reported.
const RUNS: usize = 7;
/// Server starts each way (each loads the model).
const RESTARTS: usize = 5;

/// A turn shaped as the default model's answers are: a question, a
/// paragraph back, and the response object around it.
fn turn(n: usize, previous: Option<String>) -> ResponseRecord {
    let id = format!("resp_bench{n:08}");
    let question = format!("Question {n}: tell me about the lighthouse keeper and the storm, in a few sentences.");
    let answer = "The keeper climbed the tower as the storm rolled in, trimmed the wick and watched the beam sweep \
                  the water. Ships rode the swell past the reef, and by morning the sea lay flat and grey."
        .repeat(2);
    let body = json!({
        "id": id, "object": "response", "created_at": 1_800_000_000u64 + n as u64, "status": "completed",
        "model": "SmolLM2-135M-Instruct.Q4_1", "output": [], "store": true, "tools": [], "tool_choice": "auto",
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {},
        "usage": {"input_tokens": 120, "output_tokens": 96, "total_tokens": 216},
    });
    ResponseRecord {
        id,
        owner: "addr:127.0.0.1".into(),
        previous_id: previous,
        created_at: 1_800_000_000 + n as u64,
        status: "completed".into(),
        body,
        input: vec![json!({"id": format!("msg_in{n:08}"), "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": question}]})],
        output: vec![json!({"id": format!("msg_out{n:08}"), "type": "message", "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": answer, "annotations": []}]})],
    }
}

fn open(dir: &std::path::Path) -> Store {
    // Far in the future of the records' stamps: nothing expires here.
    let retention = Retention { max_age: std::time::Duration::from_secs(u32::MAX as u64), ..Retention::default() };
    Store::open(dir, retention).expect("the store")
}

/// A store of [`TURNS`] stored turns, [`CONVERSATIONS`] conversations of
/// the Conversations API and as many Web UI conversations (each with its
/// messages and one kept file); also returns each turn's commit time and
/// the bytes the turns took.
fn filled() -> (tempfile::TempDir, Vec<f64>, u64) {
    let full = tempfile::tempdir().expect("a folder");
    let store = open(full.path());
    let mut commits = Vec::new();
    store
        .run_here(|conn| {
            for n in 0..TURNS {
                // Ten conversations of a hundred turns each.
                let previous = (n >= 10).then(|| turn(n - 10, None).id);
                let started = Instant::now();
                put(conn, &turn(n, previous))?;
                commits.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            Ok(())
        })
        .expect("stored");
    let bytes = store.run_here(|conn| live_bytes(conn)).expect("the size");
    store
        .run_here(|conn| {
            for n in 0..CONVERSATIONS {
                let made =
                    Conversation { id: format!("conv_bench{n:08}"), created_at: 1_800_000_000, metadata: json!({}) };
                let mut items = turn(n, None).input;
                items.extend(turn(n, None).output);
                items.extend(items.clone().into_iter().map(|mut item| {
                    item["id"] = json!(format!("{}_again", item["id"].as_str().unwrap_or_default()));
                    item
                }));
                conversations::create(conn, "addr:127.0.0.1", &made, &items)?;
                let id = format!("webui_bench{n:08}");
                let record = turn(n, None);
                let body = json!({"messages": [
                    {"role": "user", "content": record.input[0]["content"][0]["text"]},
                    {"role": "assistant", "content": record.output[0]["content"][0]["text"]},
                ], "skills": []});
                webui::begin_turn(conn, "addr:127.0.0.1", &id, "Lighthouses", &body, 1_800_000_000)?;
                let kept = [SavedFile { path: "notes.md".into(), executable: false, content: vec![b'x'; 2048] }];
                webui::end_turn(conn, "addr:127.0.0.1", &id, &body, 40, Some(&kept), 1_800_000_000)?;
            }
            Ok(())
        })
        .expect("stored");
    (full, commits, bytes)
}

/// The figures that need no model.
pub fn run_offline() {
    let empty = tempfile::tempdir().expect("a folder");
    drop(open(empty.path()));
    let (full, commits, bytes) = filled();
    let time_open = |dir: &std::path::Path| {
        median(
            (0..RUNS)
                .map(|_| {
                    let started = Instant::now();
                    drop(open(dir));
                    started.elapsed().as_secs_f64() * 1000.0
                })
                .collect(),
        )
    };
    let (open_empty, open_full) = (time_open(empty.path()), time_open(full.path()));
    println!("  bytes per stored turn                  {:>8.0}", bytes as f64 / TURNS as f64);
    println!("  one stored turn's commit (synced)      {:>8.2} ms (median of {TURNS})", median(commits));
    println!(
        "  opening a store of {TURNS} turns and {CONVERSATIONS} conversations of each kind {open_full:>8.1} ms, {:.2}x opening an empty one ({open_empty:.1} ms)",
        open_full / open_empty
    );
}

/// The real server's restart, from its start to its first healthy answer,
/// on the store [`filled`] makes against an empty state folder, in
/// alternating order.
pub fn run_restart(threads: i32) {
    let (full, _, _) = filled();
    let empty = tempfile::tempdir().expect("a folder");
    let (mut on_full, mut on_empty) = (Vec::new(), Vec::new());
    for run in 0..RESTARTS {
        let time = |state: &std::path::Path| {
            let started = Instant::now();
            drop(ServerProcess::start_on(threads, &["--no-skills"], state));
            started.elapsed().as_secs_f64() * 1000.0
        };
        if run % 2 == 0 {
            on_empty.push(time(empty.path()));
            on_full.push(time(full.path()));
        } else {
            on_full.push(time(full.path()));
            on_empty.push(time(empty.path()));
        }
    }
    let (full, empty) = (median(on_full), median(on_empty));
    println!(
        "  a restart with {TURNS} turns and {CONVERSATIONS} conversations of each kind {full:>8.1} ms, {:.3}x a restart with none ({empty:.1} ms; median of {RESTARTS})",
        full / empty
    );
}

/// Turns each way for the end-to-end comparison.
const TURN_RUNS: usize = 15;
/// Tokens each compared turn writes: the prompt asks for far more, so
/// every turn runs to this budget and both sides do the same work.
const TURN_TOKENS: u64 = 32;

/// One turn's wall time, or `None` when it ended before its budget (its
/// work would not compare). `side` and `run` make a prompt of the same
/// length as every other, which no earlier turn cached.
fn respond(url: &str, side: char, run: usize, store: bool) -> Option<f64> {
    let body = json!({
        "input": format!("Session {side}{run:04}. Write a long essay about the history of lighthouses."),
        "max_output_tokens": TURN_TOKENS, "temperature": 0, "store": store,
    });
    let started = Instant::now();
    let mut response = ureq::post(&format!("{url}/v1/responses"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    let answer: Value = serde_json::from_str(&response.body_mut().read_to_string().expect("body")).expect("json");
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(answer["store"], store, "{answer}");
    (answer["usage"]["output_tokens"] == TURN_TOKENS).then_some(elapsed)
}

/// A turn with the store on against the same work with it off: pairs of
/// turns, each writing the whole budget, in alternating order so that a
/// drift of the machine's speed falls on both sides alike.
pub fn run_turns(url: &str) {
    respond(url, 'W', 0, true);
    let (mut on, mut off, mut dropped) = (Vec::new(), Vec::new(), 0);
    for run in 0..TURN_RUNS {
        let pair = if run % 2 == 0 {
            let off = respond(url, 'A', run, false);
            (respond(url, 'B', run, true), off)
        } else {
            (respond(url, 'B', run, true), respond(url, 'A', run, false))
        };
        match pair {
            (Some(with), Some(without)) => {
                on.push(with);
                off.push(without);
            }
            _ => dropped += 1,
        }
    }
    if on.is_empty() {
        println!("  a Responses turn: no pair of turns wrote its whole budget, so none compare");
        return;
    }
    let (on, off) = (median(on), median(off));
    println!(
        "  a Responses turn of {TURN_TOKENS} tokens, store on {on:>8.1} ms, {:.3}x the same turn with store off ({off:.1} ms; median of {} pairs, {dropped} that ended early left out)",
        on / off,
        TURN_RUNS - dropped
    );
}
