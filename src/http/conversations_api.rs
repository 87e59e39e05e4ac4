//! OpenAI's Conversations API: a conversation is a list of items kept in
//! the state folder's store, owned by the caller that made it. Clients add
//! items (`POST …/items`, as the Agents SDK's conversation session does),
//! and a Responses request that names the conversation continues from all
//! of them and adds its own input and output (see `responses.rs`).
//!
//! (The Web UI's conversations, `/api/conversations/{id}`, are another
//! thing: a working folder per chat, in `webui.rs`.)

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use skillhost_actors::store::conversations::{self, Conversation};
use skillhost_actors::store::unix_now;

use crate::http::access::Caller;
use crate::http::body::read_json;
use crate::http::error::{ApiError, OpenAiError};
use crate::http::responses::{
    messages_from_items, new_id, no_conversation, owned_id, refuse_unknown_query, store_failed, stored_item,
    stored_query, Page,
};
use crate::http::AppState;

/// Items one request may add, as OpenAI allows (creating a conversation,
/// or `POST …/items`).
pub const MAX_ITEMS_PER_REQUEST: usize = 20;
/// Pairs of `metadata`, and the length of a key and of a value, as OpenAI
/// bounds them.
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY_CHARS: usize = 64;
pub const MAX_METADATA_VALUE_CHARS: usize = 512;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    items: Option<Vec<Value>>,
    metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequest {
    /// Required, as OpenAI has it; `null` clears it.
    metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsRequest {
    items: Vec<Value>,
}

/// `metadata` within OpenAI's bounds: string values only.
fn checked_metadata(metadata: Option<Map<String, Value>>) -> Result<Value, ApiError> {
    let metadata = metadata.unwrap_or_default();
    if metadata.len() > MAX_METADATA_PAIRS {
        return Err(ApiError::bad_param(
            "metadata",
            format!("'metadata' holds at most {MAX_METADATA_PAIRS} pairs, got {}", metadata.len()),
        ));
    }
    for (key, value) in &metadata {
        if key.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(ApiError::bad_param(
                "metadata",
                format!("a 'metadata' key is at most {MAX_METADATA_KEY_CHARS} characters; '{key}' is longer"),
            ));
        }
        match value {
            Value::String(text) if text.chars().count() <= MAX_METADATA_VALUE_CHARS => {}
            Value::String(_) => {
                return Err(ApiError::bad_param(
                    "metadata",
                    format!("'metadata.{key}' is longer than {MAX_METADATA_VALUE_CHARS} characters"),
                ))
            }
            other => {
                return Err(ApiError::bad_param("metadata", format!("'metadata.{key}' must be a string, got {other}")))
            }
        }
    }
    Ok(Value::Object(metadata))
}

/// Items as they are stored: each one the Responses API would read (the
/// same check a turn makes), with an `id`; at most
/// [`MAX_ITEMS_PER_REQUEST`].
fn checked_items(items: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if items.len() > MAX_ITEMS_PER_REQUEST {
        return Err(ApiError::bad_param(
            "items",
            format!("'items' adds at most {MAX_ITEMS_PER_REQUEST} items at a time, got {}", items.len()),
        ));
    }
    for (n, item) in items.iter().enumerate() {
        if !item.is_object() {
            return Err(ApiError::bad_param(
                &format!("items[{n}]"),
                format!("'items[{n}]' must be an object, got {item}"),
            ));
        }
        if item.get("type").and_then(Value::as_str) == Some("item_reference") {
            return Err(ApiError::bad_param(
                &format!("items[{n}]"),
                format!("'items[{n}]' is an item_reference; add the item itself"),
            ));
        }
    }
    messages_from_items(&items, "items")?;
    Ok(items.into_iter().map(stored_item).collect())
}

async fn conversation_of(state: &AppState, owner: String, id: &str) -> Result<Conversation, ApiError> {
    let lookup = id.to_string();
    let found = state.store.run(move |conn| conversations::get(conn, &owner, &lookup)).await.map_err(store_failed)?;
    found.ok_or_else(|| no_conversation(id))
}

/// `POST /v1/conversations`
pub async fn create(
    state: web::Data<AppState>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &[])?;
    let body: CreateRequest = read_json(&request, payload).await?;
    let metadata = checked_metadata(body.metadata)?;
    let items = checked_items(body.items.unwrap_or_default())?;
    // The id names this replica (`--replica-id`), as response ids do.
    let conversation =
        Conversation { id: skillhost_actors::replica::stamp(new_id("conv")), created_at: unix_now(), metadata };
    let owner = Caller::of(&request);
    let made = conversation.clone();
    state.store.run(move |conn| conversations::create(conn, &owner, &made, &items)).await.map_err(store_failed)?;
    Ok(HttpResponse::Ok().json(conversation.object()))
}

/// `GET /v1/conversations/{id}`
pub async fn retrieve(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &[])?;
    let id = owned_id(&id)?;
    Ok(HttpResponse::Ok().json(conversation_of(&state, Caller::of(&request), id).await?.object()))
}

/// `POST /v1/conversations/{id}`: replaces its metadata.
pub async fn update(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &[])?;
    let id = owned_id(&id)?.to_string();
    let body: UpdateRequest = read_json(&request, payload).await?;
    let metadata = checked_metadata(body.metadata)?;
    let owner = Caller::of(&request);
    let changed = state.store.run({
        let (owner, id) = (owner.clone(), id.clone());
        move |conn| conversations::set_metadata(conn, &owner, &id, &metadata, unix_now())
    });
    if !changed.await.map_err(store_failed)? {
        return Err(no_conversation(&id).into());
    }
    Ok(HttpResponse::Ok().json(conversation_of(&state, owner, &id).await?.object()))
}

/// `DELETE /v1/conversations/{id}`: the conversation and its items.
pub async fn delete(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &[])?;
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    let deleted = state.store.run({
        let id = id.clone();
        move |conn| conversations::delete(conn, &owner, &id)
    });
    if !deleted.await.map_err(store_failed)? {
        return Err(no_conversation(&id).into());
    }
    Ok(HttpResponse::Ok().json(json!({"id": id, "object": "conversation.deleted", "deleted": true})))
}

/// `GET /v1/conversations/{id}/items`: a page at a time (`after`, `limit`,
/// `order`, as the input items of a response).
pub async fn list_items(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, OpenAiError> {
    let page = Page::asked(&stored_query(&request, &["after", "limit", "order", "include"])?)?;
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    let found = state.store.run({
        let id = id.clone();
        move |conn| conversations::items(conn, &owner, &id)
    });
    let Some(items) = found.await.map_err(store_failed)? else { return Err(no_conversation(&id).into()) };
    Ok(HttpResponse::Ok().json(page.of(items, &format!("an item of {id}"))?))
}

/// `POST /v1/conversations/{id}/items`: appends items; answers them as a list.
pub async fn add_items(
    state: web::Data<AppState>,
    request: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &["include"])?;
    let id = owned_id(&id)?.to_string();
    let body: ItemsRequest = read_json(&request, payload).await?;
    let items = checked_items(body.items)?;
    let owner = Caller::of(&request);
    let added = state.store.run({
        let (id, items) = (id.clone(), items.clone());
        move |conn| conversations::append(conn, &owner, &id, &items, unix_now())
    });
    if !added.await.map_err(store_failed)? {
        return Err(no_conversation(&id).into());
    }
    let item_id = |item: &Value| item.get("id").cloned().unwrap_or(Value::Null);
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "first_id": items.first().map(item_id),
        "last_id": items.last().map(item_id),
        "has_more": false,
        "data": items,
    })))
}

/// `GET /v1/conversations/{id}/items/{item}`
pub async fn item(
    state: web::Data<AppState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &["include"])?;
    let (id, item) = path.into_inner();
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    conversation_of(&state, owner.clone(), &id).await?;
    let found = state.store.run({
        let (id, item) = (id.clone(), item.clone());
        move |conn| conversations::item(conn, &owner, &id, &item)
    });
    match found.await.map_err(store_failed)? {
        Some(found) => Ok(HttpResponse::Ok().json(found)),
        None => Err(no_item(&id, &item).into()),
    }
}

/// `DELETE /v1/conversations/{id}/items/{item}`: answers the conversation.
pub async fn delete_item(
    state: web::Data<AppState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, OpenAiError> {
    refuse_unknown_query(&request, &[])?;
    let (id, item) = path.into_inner();
    let id = owned_id(&id)?.to_string();
    let owner = Caller::of(&request);
    let conversation = conversation_of(&state, owner.clone(), &id).await?;
    let deleted = state.store.run({
        let (id, item) = (id.clone(), item.clone());
        move |conn| conversations::delete_item(conn, &owner, &id, &item, unix_now())
    });
    if !deleted.await.map_err(store_failed)? {
        return Err(no_item(&id, &item).into());
    }
    Ok(HttpResponse::Ok().json(conversation.object()))
}

fn no_item(id: &str, item: &str) -> ApiError {
    ApiError::NotFound(format!("the conversation '{id}' has no item '{item}'"))
}
