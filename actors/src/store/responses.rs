//! Stored responses of the Responses API: the response object, its own
//! input items and its output items, each item under its id.
//!
//! Every read and delete names the owner (the caller that made the
//! response): another caller's response or item is answered as unknown,
//! so ids are no oracle across callers.

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::{live_bytes, retain, unix_now, Store, StoreError};

impl Store {
    /// Writes what a finished turn keeps: its response `record` (when the
    /// request asked to store it) and the items it adds to a conversation
    /// (when it named one). Past the byte limit, the oldest records go.
    /// `Ok(false)` when the conversation is gone (deleted mid-turn).
    pub async fn put_turn(
        &self,
        record: Option<ResponseRecord>,
        appended: Option<Appended>,
    ) -> Result<bool, StoreError> {
        let retention = self.retention();
        self.run(move |conn| {
            if let Some(record) = &record {
                put(conn, record)?;
            }
            let mut found = true;
            if let Some(turn) = &appended {
                found = super::conversations::append(conn, &turn.owner, &turn.conversation, &turn.items, unix_now())?;
            }
            if live_bytes(conn)? > retention.max_bytes {
                retain(conn, retention, unix_now())?;
            }
            Ok(found)
        })
        .await
    }
}

/// The items a turn adds to `owner`'s conversation: its input, then its output.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    pub owner: String,
    pub conversation: String,
    pub items: Vec<Value>,
}

/// What one stored response is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseRecord {
    pub id: String,
    pub owner: String,
    pub previous_id: Option<String>,
    pub created_at: u64,
    pub status: String,
    /// The response object without its `output`, which is `output` below.
    pub body: Value,
    /// The request's own input items, each with an `id`.
    pub input: Vec<Value>,
    pub output: Vec<Value>,
}

const INPUT: i64 = 0;
const OUTPUT: i64 = 1;

/// The item's id, which every stored item has.
fn item_id(item: &Value) -> &str {
    item.get("id").and_then(Value::as_str).unwrap_or_default()
}

/// Stores `record` in one transaction, in place of a response of the same id.
pub fn put(conn: &mut Connection, record: &ResponseRecord) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    tx.execute("DELETE FROM responses WHERE id = ?1", params![record.id])?;
    tx.execute(
        "INSERT INTO responses (id, owner, previous_id, created_at, status, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            record.id,
            record.owner,
            record.previous_id,
            record.created_at as i64,
            record.status,
            serde_json::to_string(&record.body)?
        ],
    )?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO response_items (response_id, side, position, item_id, body) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for (side, items) in [(INPUT, &record.input), (OUTPUT, &record.output)] {
            for (position, item) in items.iter().enumerate() {
                insert.execute(params![
                    record.id,
                    side,
                    position as i64,
                    item_id(item),
                    serde_json::to_string(item)?
                ])?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

fn items(conn: &Connection, id: &str, side: i64) -> Result<Vec<Value>, StoreError> {
    let mut select =
        conn.prepare_cached("SELECT body FROM response_items WHERE response_id = ?1 AND side = ?2 ORDER BY position")?;
    let rows = select.query_map(params![id, side], |row| row.get::<_, String>(0))?;
    let mut items = Vec::new();
    for row in rows {
        items.push(serde_json::from_str(&row?)?);
    }
    Ok(items)
}

/// Sets the status of response `id` (and of its object, with `error` and
/// `completed_at`), whoever owns it; `false` when there is none.
pub fn set_status(
    conn: &Connection,
    id: &str,
    status: &str,
    error: Option<&Value>,
    completed_at: Option<u64>,
) -> Result<bool, StoreError> {
    let error = serde_json::to_string(&error.cloned().unwrap_or(Value::Null))?;
    let changed = conn.execute(
        "UPDATE responses SET status = ?2,
         body = json_set(body, '$.status', ?2, '$.error', json(?3), '$.completed_at', ?4) WHERE id = ?1",
        params![id, status, error, completed_at.map(|t| t as i64)],
    )?;
    Ok(changed > 0)
}

/// What the server says of a response that was running when it stopped.
pub const INTERRUPTED: &str =
    "the server stopped (it was restarted or it crashed) while this response was running; nothing after that point was kept";

/// Marks every response that was still queued or running as failed, with
/// [`INTERRUPTED`]: at start-up nothing runs yet, so those were cut by the
/// end of the process before. Returns how many.
pub fn fail_interrupted(conn: &Connection) -> Result<usize, StoreError> {
    let error = serde_json::json!({"code": "server_error", "message": INTERRUPTED}).to_string();
    Ok(conn.execute(
        "UPDATE responses SET status = 'failed',
         body = json_set(body, '$.status', 'failed', '$.error', json(?1))
         WHERE status IN ('queued', 'in_progress')",
        params![error],
    )?)
}

/// The stored response object, with its output, if `owner` has one of `id`.
pub fn get(conn: &Connection, owner: &str, id: &str) -> Result<Option<Value>, StoreError> {
    let body: Option<String> = conn
        .query_row("SELECT body FROM responses WHERE id = ?1 AND owner = ?2", params![id, owner], |row| row.get(0))
        .optional()?;
    let Some(body) = body else { return Ok(None) };
    let mut response: Value = serde_json::from_str(&body)?;
    response["output"] = Value::Array(items(conn, id, OUTPUT)?);
    Ok(Some(response))
}

/// Deletes `owner`'s response `id` and its items; `false` when it has none.
pub fn delete(conn: &Connection, owner: &str, id: &str) -> Result<bool, StoreError> {
    Ok(conn.execute("DELETE FROM responses WHERE id = ?1 AND owner = ?2", params![id, owner])? > 0)
}

/// The request's own input items of `owner`'s response `id`, or `None`.
pub fn input_items(conn: &Connection, owner: &str, id: &str) -> Result<Option<Vec<Value>>, StoreError> {
    let known: Option<i64> = conn
        .query_row("SELECT 1 FROM responses WHERE id = ?1 AND owner = ?2", params![id, owner], |row| row.get(0))
        .optional()?;
    match known {
        Some(_) => Ok(Some(items(conn, id, INPUT)?)),
        None => Ok(None),
    }
}

/// What a follow-up of `owner`'s response `id` continues from: every
/// response of its chain, oldest first, as its input then its output
/// items; `None` when `owner` has no response `id`. A predecessor that
/// was deleted ends the chain there.
pub fn context(conn: &Connection, owner: &str, id: &str) -> Result<Option<Vec<Value>>, StoreError> {
    let mut chain = Vec::new();
    let mut next = Some(id.to_string());
    while let Some(at) = next.take() {
        let previous: Option<Option<String>> = conn
            .query_row("SELECT previous_id FROM responses WHERE id = ?1 AND owner = ?2", params![at, owner], |row| {
                row.get(0)
            })
            .optional()?;
        let Some(previous) = previous else { break };
        // Ids are made fresh for each response, so a chain cannot loop;
        // the check keeps a hand-edited file from hanging a request.
        if chain.contains(&at) {
            break;
        }
        chain.push(at);
        next = previous;
    }
    if chain.is_empty() {
        return Ok(None);
    }
    let mut context = Vec::new();
    for at in chain.iter().rev() {
        context.extend(items(conn, at, INPUT)?);
        context.extend(items(conn, at, OUTPUT)?);
    }
    Ok(Some(context))
}

/// The newest stored item of `owner` with the id `item`, input or output
/// of a response, or else an item of one of its conversations.
pub fn item(conn: &Connection, owner: &str, item: &str) -> Result<Option<Value>, StoreError> {
    let body: Option<String> = conn
        .query_row(
            "SELECT i.body FROM response_items i JOIN responses r ON r.id = i.response_id
             WHERE i.item_id = ?1 AND r.owner = ?2 ORDER BY r.created_at DESC, r.rowid DESC LIMIT 1",
            params![item, owner],
            |row| row.get(0),
        )
        .optional()?;
    match body {
        Some(body) => Ok(Some(serde_json::from_str(&body)?)),
        // Items a client added to a conversation are referenced the same way.
        None => super::conversations::any_item(conn, owner, item),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Retention, Store};
    use serde_json::json;

    fn record(id: &str, owner: &str, previous: Option<&str>, said: &str, answer: &str) -> ResponseRecord {
        ResponseRecord {
            id: id.into(),
            owner: owner.into(),
            previous_id: previous.map(Into::into),
            created_at: 1,
            status: "completed".into(),
            body: json!({"id": id, "object": "response", "status": "completed"}),
            input: vec![json!({"id": format!("in_{id}"), "type": "message", "role": "user", "content": said})],
            output: vec![json!({"id": format!("out_{id}"), "type": "message", "role": "assistant", "content": answer})],
        }
    }

    /// Runs `test` on a new store's connection.
    fn in_a_store(test: impl FnOnce(&mut Connection) -> Result<(), StoreError>) {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path(), Retention::default()).unwrap().run_here(test).unwrap();
    }

    fn texts(items: &[Value]) -> Vec<&str> {
        items.iter().map(|item| item["content"].as_str().unwrap_or_default()).collect()
    }

    #[test]
    fn a_chain_continues_from_every_turn_before_it() {
        in_a_store(|conn| {
            put(conn, &record("r1", "a", None, "one", "1"))?;
            put(conn, &record("r2", "a", Some("r1"), "two", "2"))?;
            put(conn, &record("r3", "a", Some("r2"), "three", "3"))?;
            let context = context(conn, "a", "r3")?.unwrap();
            assert_eq!(texts(&context), ["one", "1", "two", "2", "three", "3"]);
            // Deleting the middle ends the chain there.
            assert!(delete(conn, "a", "r2")?);
            assert_eq!(texts(&context_of(conn, "r3")), ["three", "3"]);
            Ok(())
        });
        fn context_of(conn: &Connection, id: &str) -> Vec<Value> {
            context(conn, "a", id).unwrap().unwrap()
        }
    }

    #[test]
    fn another_owner_sees_nothing() {
        in_a_store(|conn| {
            put(conn, &record("r1", "a", None, "secret", "kept"))?;
            assert!(get(conn, "b", "r1")?.is_none());
            assert!(context(conn, "b", "r1")?.is_none());
            assert!(input_items(conn, "b", "r1")?.is_none());
            assert!(item(conn, "b", "out_r1")?.is_none());
            assert!(!delete(conn, "b", "r1")?);
            // The owner still has all of it.
            let response = get(conn, "a", "r1")?.unwrap();
            assert_eq!(response["output"][0]["content"], "kept");
            assert_eq!(item(conn, "a", "in_r1")?.unwrap()["content"], "secret");
            Ok(())
        });
    }

    #[test]
    fn a_deleted_response_takes_its_items_with_it() {
        in_a_store(|conn| {
            put(conn, &record("r1", "a", None, "x", "y"))?;
            assert!(delete(conn, "a", "r1")?);
            assert!(get(conn, "a", "r1")?.is_none());
            assert!(item(conn, "a", "out_r1")?.is_none());
            let left: i64 = conn.query_row("SELECT count(*) FROM response_items", [], |row| row.get(0))?;
            assert_eq!(left, 0);
            Ok(())
        });
    }

    #[test]
    fn records_older_than_the_age_limit_go_and_younger_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Retention::default()).unwrap();
        let retention = Retention { max_age: std::time::Duration::from_secs(100), ..Retention::default() };
        store
            .run_here(|conn| {
                let mut at_limit = record("at", "a", None, "x", "y");
                at_limit.created_at = 900;
                let mut past = record("past", "a", None, "x", "y");
                past.created_at = 899;
                put(conn, &at_limit)?;
                put(conn, &past)?;
                // At 1000, a record of 900 is exactly 100 s old: kept.
                assert_eq!(crate::store::retain(conn, retention, 1000)?, 1);
                assert!(get(conn, "a", "at")?.is_some());
                assert!(get(conn, "a", "past")?.is_none());
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn past_the_byte_limit_the_oldest_go_first() {
        in_a_store(|conn| {
            let big = "z".repeat(64 * 1024);
            for n in 0..40u64 {
                let mut one = record(&format!("r{n}"), "a", None, &big, "y");
                one.created_at = 1000 + n;
                put(conn, &one)?;
            }
            let before = crate::store::live_bytes(conn)?;
            let limit = before / 2;
            let retention = Retention { max_bytes: limit, ..Retention::default() };
            let dropped = crate::store::retain(conn, retention, 2000)?;
            assert!(dropped > 0 && crate::store::live_bytes(conn)? <= limit);
            assert!(get(conn, "a", "r0")?.is_none(), "the oldest went");
            assert!(get(conn, "a", "r39")?.is_some(), "the newest stayed");
            // At the limit nothing more goes.
            let at = Retention { max_bytes: crate::store::live_bytes(conn)?, ..Retention::default() };
            assert_eq!(crate::store::retain(conn, at, 2000)?, 0);
            Ok(())
        });
    }

    #[test]
    fn a_running_response_is_failed_with_a_sentence_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), Retention::default()).unwrap();
            let mut running = record("r1", "a", None, "x", "");
            (running.created_at, running.status) = (unix_now(), "in_progress".into());
            running.body["status"] = "in_progress".into();
            let mut done = record("r2", "a", None, "x", "y");
            done.created_at = unix_now();
            store.run_here(|conn| put(conn, &running).and_then(|()| put(conn, &done))).unwrap();
        }
        let store = Store::open(dir.path(), Retention::default()).unwrap();
        let (running, done) =
            store.run_here(|conn| Ok((get(conn, "a", "r1")?.unwrap(), get(conn, "a", "r2")?.unwrap()))).unwrap();
        assert_eq!(running["status"], "failed");
        assert_eq!(running["error"]["message"], INTERRUPTED);
        assert_eq!(done["status"], "completed", "a finished response is left alone");
    }

    #[test]
    fn what_was_committed_is_there_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), Retention::default()).unwrap();
            let mut fresh = record("r1", "a", None, "x", "y");
            fresh.created_at = unix_now();
            store.run_here(|conn| put(conn, &fresh)).unwrap();
        }
        let store = Store::open(dir.path(), Retention::default()).unwrap();
        let response = store.run_here(|conn| get(conn, "a", "r1")).unwrap().unwrap();
        assert_eq!(response["id"], "r1");
    }
}
