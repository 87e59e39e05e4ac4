//! `--normalize-client-prompts` through the Messages route: the prompt the
//! model is given, and the count in `/metrics`.

use actix_web::{test, App};
use serde_json::json;
use skillhost_actors::model::scripted::ScriptedOutput;

use crate::client_prompts::ClientPrompts;
use crate::http::configure;
use crate::http::test_server::TestServer;

/// Claude Code 2.1's billing line, as it opens every system prompt.
const BILLING: &str = "x-anthropic-billing-header: cc_version=2.1.332.857; cc_entrypoint=sdk-cli;";
const COUNTER: &str = "skillhost_client_prompt_rewrites_total{rule=\"claude-code-billing-header\"}";

#[actix_web::test]
async fn claude_codes_billing_line_leaves_the_prompt_under_the_rule_and_stays_without_it() {
    for (rules, removed) in [(ClientPrompts::default(), true), (ClientPrompts::none(), false)] {
        let running = TestServer::scripted(vec![ScriptedOutput::from("Hello.".to_string())])
            .client_prompts(rules.clone())
            .start()
            .await
            .unwrap();
        let (state, backend) = (running.state, running.backend.unwrap());
        let app = test::init_service(App::new().app_data(state).configure(configure)).await;
        let body = json!({
            "model": "claude-opus-5-5",
            "max_tokens": 8,
            "system": [
                {"type": "text", "text": BILLING},
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
        });
        let request = test::TestRequest::post().uri("/v1/messages").set_json(&body).to_request();
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status().as_u16(), 200, "{rules:?}");
        let _ = test::read_body(response).await;
        let prompt = backend.prompts().pop().unwrap();
        assert!(prompt.contains("You are Claude Code."), "{prompt}");
        assert_eq!(!prompt.contains("x-anthropic-billing-header"), removed, "{rules:?}: {prompt}");

        let metrics = test::call_and_read_body(&app, test::TestRequest::get().uri("/metrics").to_request()).await;
        let metrics = String::from_utf8_lossy(&metrics);
        let counted = metrics.lines().any(|line| line == format!("{COUNTER} 1"));
        assert_eq!(counted, removed, "{rules:?}: {metrics}");
    }
}
