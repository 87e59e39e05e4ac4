//! The HTTP surface: routes, wire formats and error mapping. Only this module
//! knows the JSON shapes clients speak.

pub mod access;
pub mod anthropic;
pub mod anthropic_skills;
pub mod artifacts;
pub mod attachments;
pub mod background;
pub mod body;
pub mod chat;
pub mod compact;
pub mod conversations_api;
pub mod discovery;
pub mod embeddings;
pub mod error;
pub mod files;
pub mod hosted_skills;
pub mod mcp;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod openai_skills;
pub mod ops;
pub mod peer;
pub mod relay;
pub mod responses;
pub mod responses_socket;
pub mod skills;
pub mod stream;
pub mod webui;
pub mod webui_turns;

use actix_web::web;
use skillhost_actors::Server;

/// Shared by every handler.
pub struct AppState {
    pub server: Server,
    pub metrics: metrics::Metrics,
    /// Unix time the server started, reported as the model's `created`.
    pub started_at: u64,
    /// Silence after which the Web UI stream sends a comment frame.
    pub keep_alive: std::time::Duration,
    /// Keys, origins and hosts (see [`access::gate`]).
    pub access: std::sync::Arc<access::Access>,
    /// Requests running or waiting, bounded by `--max-queued`.
    pub admission: access::Admission,
    /// The state folder's store: stored responses, conversations, files.
    pub store: skillhost_actors::store::Store,
    /// `--max-attachment-bytes`: the largest file a message may carry or
    /// `/v1/files` may take.
    pub max_attachment_bytes: u64,
    /// This server's own binary, started as `skillhost pdf-text` to read an
    /// attached PDF's text; `None` where it cannot be found.
    pub pdf_reader: Option<std::path::PathBuf>,
    /// Turns running with no client attached (background responses, Web
    /// UI turns whose pages left), bounded by `--max-detached-turns`.
    pub background: std::sync::Arc<background::Background>,
    /// Background responses' events, for `GET /v1/responses/{id}?stream=true`.
    pub response_streams: background::Streams,
    /// Each Web UI conversation's running or last turn, for pages that
    /// attach to it.
    pub webui_turns: webui_turns::Turns,
    /// `--hosted-tool` and `--strict-hosted-tools`.
    pub hosted: std::sync::Arc<skillhost_actors::tools::mcp::hosted::HostedTools>,
    /// `--normalize-client-prompts`.
    pub client_prompts: crate::client_prompts::ClientPrompts,
}

/// Registers every route behind the access gate; `main` and the tests
/// build the app through this.
pub fn configure(config: &mut web::ServiceConfig) {
    config.service(web::scope("").wrap(actix_web::middleware::from_fn(access::gate)).configure(routes));
}

fn routes(config: &mut web::ServiceConfig) {
    config
        .service(
            web::resource("/api/whoami")
                .route(web::get().to(access::whoami))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource(["/v1/chat/completions", "/chat/completions"])
                .route(web::post().to(chat::chat_completions))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/responses")
                .route(web::post().to(responses::responses))
                .route(web::get().guard(actix_web::guard::Header("upgrade", "websocket")).to(responses_socket::socket))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            // Before `/v1/responses/{id}`, which would take the path first.
            web::resource("/v1/responses/compact")
                .route(web::post().to(compact::compact))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/responses/input_tokens")
                .route(web::post().to(responses::input_tokens))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/responses/{id}")
                .route(web::get().to(responses::retrieve))
                .route(web::delete().to(responses::delete))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/responses/{id}/cancel")
                .route(web::post().to(responses::cancel))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/responses/{id}/input_items")
                .route(web::get().to(responses::input_items_list))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/files")
                .route(web::post().to(files::upload))
                .route(web::get().to(files::list))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/files/{id}")
                .route(web::get().to(files::retrieve))
                .route(web::delete().to(files::delete))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/files/{id}/content")
                .route(web::get().to(files::content))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/conversations")
                .route(web::post().to(conversations_api::create))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/conversations/{id}")
                .route(web::get().to(conversations_api::retrieve))
                .route(web::post().to(conversations_api::update))
                .route(web::delete().to(conversations_api::delete))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/conversations/{id}/items")
                .route(web::get().to(conversations_api::list_items))
                .route(web::post().to(conversations_api::add_items))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/conversations/{id}/items/{item}")
                .route(web::get().to(conversations_api::item))
                .route(web::delete().to(conversations_api::delete_item))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/messages")
                .route(web::post().to(anthropic::messages))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/messages/count_tokens")
                .route(web::post().to(anthropic::count_tokens))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource(["/v1/models", "/models"])
                .route(web::get().to(ops::models))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/skills")
                .route(web::get().guard(anthropic_skills::dialect()).to(anthropic_skills::list))
                .route(web::post().guard(anthropic_skills::dialect()).to(anthropic_skills::create))
                .route(web::get().to(openai_skills::list))
                .route(web::post().to(openai_skills::create))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/skills/{id}")
                .route(web::get().guard(anthropic_skills::dialect()).to(anthropic_skills::retrieve))
                .route(web::delete().guard(anthropic_skills::dialect()).to(anthropic_skills::delete))
                .route(web::get().to(openai_skills::retrieve))
                .route(web::post().to(openai_skills::update))
                .route(web::delete().to(openai_skills::delete))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/skills/{id}/content")
                .route(web::get().to(openai_skills::content))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/skills/{id}/versions")
                .route(web::get().guard(anthropic_skills::dialect()).to(anthropic_skills::versions))
                .route(web::post().guard(anthropic_skills::dialect()).to(anthropic_skills::create_version))
                .route(web::get().to(openai_skills::versions))
                .route(web::post().to(openai_skills::create_version))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/skills/{id}/versions/{version}")
                .route(web::get().guard(anthropic_skills::dialect()).to(anthropic_skills::retrieve_version))
                .route(web::delete().guard(anthropic_skills::dialect()).to(anthropic_skills::delete_version))
                .route(web::get().to(openai_skills::retrieve_version))
                .route(web::delete().to(openai_skills::delete_version))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/v1/skills/{id}/versions/{version}/content")
                .route(web::get().guard(anthropic_skills::dialect()).to(anthropic_skills::version_content))
                .route(web::get().to(openai_skills::version_content))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/mcp").route(web::post().to(mcp::serve)).default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/mcp")
                .route(web::get().to(mcp::api_list))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/skills")
                .route(web::get().to(skills::api_list))
                .route(web::post().to(skills::api_install))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/skills/install")
                .route(web::post().to(skills::api_install_url))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource(skillhost_actors::skills::discovery::INDEX_PATH)
                .route(web::get().to(discovery::index))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/.well-known/agent-skills/{file}")
                .route(web::get().to(discovery::archive))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/skills/rescan")
                .route(web::post().to(skills::api_rescan))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/skills/{id}")
                .route(web::get().to(skills::api_get))
                .route(web::delete().to(skills::api_delete))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/skills/{id}/versions")
                .route(web::get().to(skills::api_versions))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/skills/{id}/rollback")
                .route(web::post().to(skills::api_rollback))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/skills/{id}/files/{path:.*}")
                .route(web::get().to(skills::api_file))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/code/artifacts/{run_id}")
                .route(web::get().to(artifacts::list))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/code/artifacts/{run_id}/{path:.*}")
                .route(web::get().to(artifacts::download))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/").route(web::get().to(webui::index)).default_service(web::to(ops::method_not_allowed)),
        )
        .service(web::resource("/favicon.ico").route(web::get().to(webui::favicon)))
        .service(
            web::resource("/assets/{name}")
                .route(web::get().to(webui::assets))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/models")
                .route(web::get().to(webui::models))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/chat")
                .route(web::post().to(webui::chat))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/conversations")
                .route(web::get().to(webui::list_conversations))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/conversations/{id}")
                .route(web::get().to(webui::get_conversation))
                .route(web::delete().to(webui::close_conversation))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/conversations/{id}/events")
                .route(web::get().to(webui::conversation_events))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/conversations/{id}/turn")
                .route(web::delete().to(webui::stop_turn))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource(["/api/chat/ollama", "/ollama/api/chat"])
                .route(web::post().to(ollama::chat))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/ollama/api/tags")
                .route(web::get().to(ollama::tags))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/ollama/api/ps")
                .route(web::get().to(ollama::ps))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/ollama/api/show")
                .route(web::post().to(ollama::show))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/models/{name}/load")
                .route(web::post().to(ops::load_model))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/api/models/{name}/unload")
                .route(web::post().to(ops::unload_model))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource(["/v1/embeddings", "/embeddings"])
                .route(web::post().to(embeddings::openai))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/ollama/api/embed")
                .route(web::post().to(embeddings::ollama))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/ollama/api/version")
                .route(web::get().to(ollama::version))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/health")
                .route(web::get().to(ops::health))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .service(
            web::resource("/metrics")
                .route(web::get().to(ops::metrics))
                .default_service(web::to(ops::method_not_allowed)),
        )
        .default_service(web::to(ops::not_found));
}

#[cfg(test)]
pub(crate) mod test_server;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod scenarios;

#[cfg(test)]
mod code_tests;
#[cfg(test)]
mod mcp_tests;

#[cfg(test)]
mod install_tests;

#[cfg(test)]
mod webui_tests;

#[cfg(test)]
mod access_tests;

#[cfg(test)]
mod agents_tests;

#[cfg(test)]
mod governance_tests;

#[cfg(test)]
mod forced_call_tests;

#[cfg(test)]
mod client_prompts_tests;

#[cfg(test)]
mod anthropic_skills_tests;
#[cfg(test)]
mod conversations_tests;
#[cfg(test)]
mod discovery_tests;
#[cfg(test)]
mod files_tests;
#[cfg(test)]
mod hosted_skills_tests;
#[cfg(test)]
mod inline_tests;
#[cfg(test)]
mod models_tests;
#[cfg(test)]
mod openai_skills_tests;
#[cfg(test)]
mod responses_tests;
#[cfg(test)]
mod scan_tests;
#[cfg(test)]
mod versions_tests;
#[cfg(test)]
mod webui_turns_tests;
