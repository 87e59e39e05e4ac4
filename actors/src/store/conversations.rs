//! Conversations of OpenAI's Conversations API: an ordered list of items
//! under an id, owned by the caller that made it. Items are appended by the
//! client (`POST …/items`) and by every Responses turn that names the
//! conversation, and a turn continues from all of them.

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::StoreError;

/// A conversation's own fields (its items are read apart).
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub id: String,
    pub created_at: u64,
    pub metadata: Value,
}

impl Conversation {
    /// The object the API answers with.
    pub fn object(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        })
    }
}

/// Makes `owner`'s conversation `id` with its first `items` (each with an
/// `id`), in one transaction.
pub fn create(
    conn: &mut Connection,
    owner: &str,
    conversation: &Conversation,
    items: &[Value],
) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO conversations (id, owner, created_at, touched_at, metadata) VALUES (?1, ?2, ?3, ?3, ?4)",
        params![conversation.id, owner, conversation.created_at as i64, serde_json::to_string(&conversation.metadata)?],
    )?;
    insert_items(&tx, &conversation.id, items)?;
    tx.commit()?;
    Ok(())
}

fn insert_items(conn: &Connection, id: &str, items: &[Value]) -> Result<(), StoreError> {
    let next: i64 = conn.query_row(
        "SELECT coalesce(max(position), -1) + 1 FROM conversation_items WHERE conversation_id = ?1",
        params![id],
        |row| row.get(0),
    )?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO conversation_items (conversation_id, position, item_id, body) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (n, item) in items.iter().enumerate() {
        let item_id = item.get("id").and_then(Value::as_str).unwrap_or_default();
        insert.execute(params![id, next + n as i64, item_id, serde_json::to_string(item)?])?;
    }
    Ok(())
}

/// `owner`'s conversation `id`, if it has one.
pub fn get(conn: &Connection, owner: &str, id: &str) -> Result<Option<Conversation>, StoreError> {
    let row: Option<(i64, String)> = conn
        .query_row(
            "SELECT created_at, metadata FROM conversations WHERE id = ?1 AND owner = ?2",
            params![id, owner],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let Some((created_at, metadata)) = row else { return Ok(None) };
    Ok(Some(Conversation {
        id: id.to_string(),
        created_at: created_at as u64,
        metadata: serde_json::from_str(&metadata)?,
    }))
}

/// Replaces the metadata of `owner`'s conversation `id`; `false` when it has none.
pub fn set_metadata(conn: &Connection, owner: &str, id: &str, metadata: &Value, now: u64) -> Result<bool, StoreError> {
    let changed = conn.execute(
        "UPDATE conversations SET metadata = ?3, touched_at = ?4 WHERE id = ?1 AND owner = ?2",
        params![id, owner, serde_json::to_string(metadata)?, now as i64],
    )?;
    Ok(changed > 0)
}

/// Deletes `owner`'s conversation `id` and its items; `false` when it has none.
pub fn delete(conn: &Connection, owner: &str, id: &str) -> Result<bool, StoreError> {
    Ok(conn.execute("DELETE FROM conversations WHERE id = ?1 AND owner = ?2", params![id, owner])? > 0)
}

/// Appends `items` (each with an `id`) to `owner`'s conversation `id`, in
/// one transaction; `false` when it has none.
pub fn append(conn: &mut Connection, owner: &str, id: &str, items: &[Value], now: u64) -> Result<bool, StoreError> {
    let tx = conn.transaction()?;
    let touched = tx.execute(
        "UPDATE conversations SET touched_at = ?3 WHERE id = ?1 AND owner = ?2",
        params![id, owner, now as i64],
    )?;
    if touched == 0 {
        return Ok(false);
    }
    insert_items(&tx, id, items)?;
    tx.commit()?;
    Ok(true)
}

/// Every item of `owner`'s conversation `id`, oldest first; `None` when it
/// has none.
pub fn items(conn: &Connection, owner: &str, id: &str) -> Result<Option<Vec<Value>>, StoreError> {
    if get(conn, owner, id)?.is_none() {
        return Ok(None);
    }
    let mut select =
        conn.prepare_cached("SELECT body FROM conversation_items WHERE conversation_id = ?1 ORDER BY position")?;
    let rows = select.query_map(params![id], |row| row.get::<_, String>(0))?;
    let mut items = Vec::new();
    for row in rows {
        items.push(serde_json::from_str(&row?)?);
    }
    Ok(Some(items))
}

/// The item `item` of `owner`'s conversation `id` (the latest, should the
/// client have sent one id twice).
pub fn item(conn: &Connection, owner: &str, id: &str, item: &str) -> Result<Option<Value>, StoreError> {
    let body: Option<String> = conn
        .query_row(
            "SELECT i.body FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id
             WHERE i.conversation_id = ?1 AND c.owner = ?2 AND i.item_id = ?3 ORDER BY i.position DESC LIMIT 1",
            params![id, owner, item],
            |row| row.get(0),
        )
        .optional()?;
    body.map(|body| serde_json::from_str(&body)).transpose().map_err(Into::into)
}

/// Deletes the item `item` of `owner`'s conversation `id`; `false` when it
/// has no such item.
pub fn delete_item(conn: &Connection, owner: &str, id: &str, item: &str, now: u64) -> Result<bool, StoreError> {
    if get(conn, owner, id)?.is_none() {
        return Ok(false);
    }
    let gone =
        conn.execute("DELETE FROM conversation_items WHERE conversation_id = ?1 AND item_id = ?2", params![id, item])?;
    if gone > 0 {
        conn.execute("UPDATE conversations SET touched_at = ?2 WHERE id = ?1", params![id, now as i64])?;
    }
    Ok(gone > 0)
}

/// The latest item of that id in any of `owner`'s conversations: what an
/// `item_reference` finds when no stored response holds it.
pub fn any_item(conn: &Connection, owner: &str, item: &str) -> Result<Option<Value>, StoreError> {
    let body: Option<String> = conn
        .query_row(
            "SELECT i.body FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id
             WHERE i.item_id = ?1 AND c.owner = ?2 ORDER BY c.touched_at DESC, i.position DESC LIMIT 1",
            params![item, owner],
            |row| row.get(0),
        )
        .optional()?;
    body.map(|body| serde_json::from_str(&body)).transpose().map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Retention, Store};
    use serde_json::json;

    fn said(id: &str, text: &str) -> Value {
        json!({"id": id, "type": "message", "role": "user", "content": text})
    }

    fn in_a_store(test: impl FnOnce(&mut Connection) -> Result<(), StoreError>) {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path(), Retention::default()).unwrap().run_here(test).unwrap();
    }

    fn conversation(id: &str) -> Conversation {
        Conversation { id: id.into(), created_at: 5, metadata: json!({"topic": "demo"}) }
    }

    #[test]
    fn items_come_back_in_order_and_belong_to_their_owner() {
        in_a_store(|conn| {
            create(conn, "a", &conversation("c1"), &[said("m1", "one")])?;
            assert!(append(conn, "a", "c1", &[said("m2", "two"), said("m3", "three")], 9)?);
            let all = items(conn, "a", "c1")?.unwrap();
            let ids: Vec<&str> = all.iter().map(|item| item["id"].as_str().unwrap()).collect();
            assert_eq!(ids, ["m1", "m2", "m3"]);
            assert_eq!(get(conn, "a", "c1")?, Some(conversation("c1")));
            // Another owner sees nothing and changes nothing.
            assert_eq!(get(conn, "b", "c1")?, None);
            assert_eq!(items(conn, "b", "c1")?, None);
            assert!(!append(conn, "b", "c1", &[said("m4", "four")], 9)?);
            assert!(!delete_item(conn, "b", "c1", "m1", 9)?);
            assert!(!set_metadata(conn, "b", "c1", &json!({}), 9)?);
            assert_eq!(item(conn, "b", "c1", "m1")?, None);
            assert_eq!(any_item(conn, "b", "m1")?, None);
            assert!(!delete(conn, "b", "c1")?);
            assert_eq!(items(conn, "a", "c1")?.unwrap().len(), 3);
            Ok(())
        });
    }

    #[test]
    fn an_item_is_read_and_deleted_alone_and_the_conversation_with_all_of_them() {
        in_a_store(|conn| {
            create(conn, "a", &conversation("c1"), &[said("m1", "one"), said("m2", "two")])?;
            assert_eq!(item(conn, "a", "c1", "m2")?.unwrap()["content"], "two");
            assert_eq!(any_item(conn, "a", "m2")?.unwrap()["content"], "two");
            assert!(delete_item(conn, "a", "c1", "m2", 9)?);
            assert!(!delete_item(conn, "a", "c1", "m2", 9)?);
            assert!(append(conn, "a", "c1", &[said("m3", "three")], 9)?);
            let all = items(conn, "a", "c1")?.unwrap();
            assert_eq!(all.iter().map(|item| item["content"].as_str().unwrap()).collect::<Vec<_>>(), ["one", "three"]);
            assert!(set_metadata(conn, "a", "c1", &json!({"topic": "other"}), 9)?);
            assert_eq!(get(conn, "a", "c1")?.unwrap().metadata, json!({"topic": "other"}));
            assert!(delete(conn, "a", "c1")?);
            let left: i64 = conn.query_row("SELECT count(*) FROM conversation_items", [], |row| row.get(0))?;
            assert_eq!(left, 0, "a deleted conversation leaves no items");
            Ok(())
        });
    }

    #[test]
    fn retention_goes_by_the_last_change_and_takes_the_items_along() {
        in_a_store(|conn| {
            let made_at = |id: &str, at: u64| Conversation { id: id.into(), created_at: at, metadata: json!({}) };
            create(conn, "a", &made_at("old", 100), &[said("o1", "old")])?;
            create(conn, "a", &made_at("kept", 100), &[said("k1", "kept")])?;
            // Touched at 950 by a new item: 50 s old at 1000, not 900.
            assert!(append(conn, "a", "kept", &[said("k2", "again")], 950)?);
            let retention = Retention { max_age: std::time::Duration::from_secs(100), ..Retention::default() };
            assert_eq!(crate::store::retain(conn, retention, 1000)?, 1);
            assert_eq!(get(conn, "a", "old")?, None);
            assert_eq!(any_item(conn, "a", "o1")?, None, "its items went with it");
            assert_eq!(items(conn, "a", "kept")?.unwrap().len(), 2);
            Ok(())
        });
    }

    #[test]
    fn past_the_byte_limit_old_conversations_and_responses_go_oldest_first() {
        in_a_store(|conn| {
            let big = "z".repeat(64 * 1024);
            for n in 0..20u64 {
                let id = format!("c{n}");
                create(conn, "a", &Conversation { id: id.clone(), created_at: 0, metadata: json!({}) }, &[])?;
                assert!(append(conn, "a", &id, &[said(&format!("i{n}"), &big)], 1000 + 2 * n)?);
            }
            let limit = crate::store::live_bytes(conn)? / 2;
            let retention = Retention { max_bytes: limit, ..Retention::default() };
            assert!(crate::store::retain(conn, retention, 2000)? > 0);
            assert!(crate::store::live_bytes(conn)? <= limit);
            assert_eq!(get(conn, "a", "c0")?, None, "the oldest went");
            assert!(get(conn, "a", "c19")?.is_some(), "the newest stayed");
            Ok(())
        });
    }
}
