//! Does every round of a skills request stream? One `POST /api/chat` on the
//! real model, round 1 held to `skills_read` (the 135M model never reads on
//! its own), timing each frame as it arrives: per round, the frame count
//! and when the first and last content frames came.

use std::io::{BufRead, BufReader};
use std::time::Instant;

use serde_json::{json, Value};

pub fn run(url: &str) {
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "How do I upload a skill to skillhost? Explain step by step."}
        ],
        "skills": ["skill-authoring"],
        "tool_choice": {"type": "function", "function": {"name": "skills_read"}},
        "maxTokens": 64,
        "temperature": 0,
    });
    let started = Instant::now();
    let mut response = ureq::post(&format!("{url}/api/chat"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    let reader = BufReader::new(response.body_mut().as_reader());
    // Per round: content frames, first and last arrival (s).
    let mut rounds: Vec<(usize, f64, f64)> = vec![(0, 0.0, 0.0)];
    let mut steps = Vec::new();
    let mut done = 0.0;
    for line in reader.lines() {
        let line = line.expect("read stream");
        let Some(data) = line.strip_prefix("data: ") else { continue };
        let at = started.elapsed().as_secs_f64();
        let frame: Value = serde_json::from_str(data).expect("frame");
        if frame.get("content").is_some() {
            let round = rounds.last_mut().expect("a round");
            if round.0 == 0 {
                round.1 = at;
            }
            round.0 += 1;
            round.2 = at;
        } else if let Some(tool) = frame["skill_step"].as_str() {
            let what = format!("{tool} {} {} (ok: {})", frame["skill"], frame["detail"], frame["ok"]);
            steps.push((what, at));
            rounds.push((0, 0.0, 0.0));
        } else if frame.get("done").is_some() {
            done = at;
            for (index, round) in frame["rounds"].as_array().into_iter().flatten().enumerate() {
                eprintln!(
                    "round {}: {} prompt tokens, {} from the cache, {} generated",
                    index + 1,
                    round["prompt_tokens"],
                    round["cached_tokens"],
                    round["generated_tokens"]
                );
            }
            break;
        } else if let Some(error) = frame.get("error") {
            panic!("the request failed: {error}");
        }
    }
    println!("| part | frames | first (s) | last (s) |");
    println!("|---|---|---|---|");
    for (index, (frames, first, last)) in rounds.iter().enumerate() {
        println!("| round {} content | {frames} | {first:.2} | {last:.2} |", index + 1);
        if let Some((tool, at)) = steps.get(index) {
            println!("| step: {tool} | 1 | {at:.2} | {at:.2} |");
        }
    }
    println!("| done | 1 | {done:.2} | {done:.2} |");
}
