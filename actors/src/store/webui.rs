//! The Web UI's conversations: what the page reopens after a reload or a
//! restart. A conversation row holds its title, its messages and selected
//! skills (`body`), whether a turn is running, and the id of the last
//! frame its events carried; `webui_files` holds the regular files its
//! commands left in its workspace, written back when it continues.
//!
//! Every read and delete names the owner (the caller that opened it):
//! another caller's conversation is answered as unknown.

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::StoreError;

/// One stored Web UI conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct WebConversation {
    pub id: String,
    pub title: String,
    pub created_at: u64,
    pub touched_at: u64,
    /// A turn was running when this was last written.
    pub running: bool,
    /// The id of the last frame the conversation's events carried.
    pub last_event: u64,
    /// `{"messages": [...], "skills": [...]}`.
    pub body: Value,
}

impl WebConversation {
    /// The listing's entry: everything but the messages.
    pub fn summary(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "title": self.title,
            "created_at": self.created_at,
            "updated_at": self.touched_at,
            "running": self.running,
        })
    }
}

/// The files kept are what the workspace's snapshot copied out.
pub use crate::workspace::snapshot::SavedFile;

/// What the server says in the history of a turn that was running when it
/// stopped.
pub const INTERRUPTED: &str =
    "the server stopped (it was restarted or it crashed) while this turn was running; its answer was not kept";

/// Records that `owner`'s conversation `id` starts a turn with `body`: a
/// new row (titled `title`) or the conversation's row, updated. `false`
/// when the id is another owner's.
pub fn begin_turn(
    conn: &Connection,
    owner: &str,
    id: &str,
    title: &str,
    body: &Value,
    now: u64,
) -> Result<bool, StoreError> {
    let body = serde_json::to_string(body)?;
    let changed = conn.execute(
        "INSERT INTO webui_conversations (id, owner, title, created_at, touched_at, running, last_event, body)
         VALUES (?1, ?2, ?3, ?4, ?4, 1, 0, ?5)
         ON CONFLICT (id) DO UPDATE SET touched_at = ?4, running = 1, body = ?5 WHERE owner = ?2",
        params![id, owner, title, now as i64, body],
    )?;
    Ok(changed > 0)
}

/// Records the end of a turn: its `body` (the messages with the answer),
/// the last frame id, and, when given, the workspace's files (replacing
/// those kept before), in one transaction. `false` when the conversation
/// is gone (deleted mid-turn).
pub fn end_turn(
    conn: &mut Connection,
    owner: &str,
    id: &str,
    body: &Value,
    last_event: u64,
    files: Option<&[SavedFile]>,
    now: u64,
) -> Result<bool, StoreError> {
    let tx = conn.transaction()?;
    let changed = tx.execute(
        "UPDATE webui_conversations SET body = ?3, running = 0, last_event = max(last_event, ?4), touched_at = ?5
         WHERE id = ?1 AND owner = ?2",
        params![id, owner, serde_json::to_string(body)?, last_event as i64, now as i64],
    )?;
    if changed == 0 {
        return Ok(false);
    }
    if let Some(files) = files {
        tx.execute("DELETE FROM webui_files WHERE conversation_id = ?1", params![id])?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO webui_files (conversation_id, path, executable, content) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for file in files {
            insert.execute(params![id, file.path, i64::from(file.executable), file.content])?;
        }
    }
    tx.commit()?;
    Ok(true)
}

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, i64, i64, i64, i64, String)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?))
}

fn conversation(row: (String, String, i64, i64, i64, i64, String)) -> Result<WebConversation, StoreError> {
    let (id, title, created_at, touched_at, running, last_event, body) = row;
    Ok(WebConversation {
        id,
        title,
        created_at: created_at as u64,
        touched_at: touched_at as u64,
        running: running != 0,
        last_event: last_event as u64,
        body: serde_json::from_str(&body)?,
    })
}

const COLUMNS: &str = "id, title, created_at, touched_at, running, last_event, body";

/// `owner`'s conversation `id`, if it has one.
pub fn get(conn: &Connection, owner: &str, id: &str) -> Result<Option<WebConversation>, StoreError> {
    let row = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM webui_conversations WHERE id = ?1 AND owner = ?2"),
            params![id, owner],
            from_row,
        )
        .optional()?;
    row.map(conversation).transpose()
}

/// `owner`'s conversations, the most recently used first, at most `limit`.
pub fn list(conn: &Connection, owner: &str, limit: usize) -> Result<Vec<WebConversation>, StoreError> {
    let mut select = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM webui_conversations WHERE owner = ?1 ORDER BY touched_at DESC, rowid DESC LIMIT ?2"
    ))?;
    let rows = select.query_map(params![owner, limit as i64], from_row)?;
    rows.map(|row| conversation(row?)).collect()
}

/// Deletes `owner`'s conversation `id` with its files; `false` when it has none.
pub fn delete(conn: &Connection, owner: &str, id: &str) -> Result<bool, StoreError> {
    Ok(conn.execute("DELETE FROM webui_conversations WHERE id = ?1 AND owner = ?2", params![id, owner])? > 0)
}

/// The files kept for `owner`'s conversation `id`, by path.
pub fn files(conn: &Connection, owner: &str, id: &str) -> Result<Vec<SavedFile>, StoreError> {
    let mut select = conn.prepare_cached(
        "SELECT f.path, f.executable, f.content FROM webui_files f
         JOIN webui_conversations c ON c.id = f.conversation_id
         WHERE c.id = ?1 AND c.owner = ?2 ORDER BY f.path",
    )?;
    let rows = select.query_map(params![id, owner], |row| {
        Ok(SavedFile { path: row.get(0)?, executable: row.get::<_, i64>(1)? != 0, content: row.get(2)? })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Ends every turn that was still running with a note ([`INTERRUPTED`])
/// in its history: at start-up nothing runs yet, so those were cut by the
/// end of the process before. Returns how many.
pub fn note_interrupted(conn: &Connection) -> Result<usize, StoreError> {
    let note = serde_json::json!({"role": "assistant", "content": "", "note": INTERRUPTED}).to_string();
    Ok(conn.execute(
        "UPDATE webui_conversations SET running = 0, body = json_insert(body, '$.messages[#]', json(?1))
         WHERE running = 1",
        params![note],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{retain, Retention, Store};
    use serde_json::json;

    fn body(messages: &[(&str, &str)]) -> Value {
        let messages: Vec<Value> =
            messages.iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
        json!({"messages": messages, "skills": []})
    }

    #[test]
    fn a_turn_is_begun_ended_and_read_back_only_by_its_owner() {
        let store = Store::temporary().unwrap();
        store
            .run_here(|conn| {
                assert!(begin_turn(conn, "a", "c-1", "Hello", &body(&[("user", "hi")]), 10)?);
                let running = get(conn, "a", "c-1")?.unwrap();
                assert!(running.running && running.title == "Hello");
                assert_eq!(get(conn, "b", "c-1")?, None, "another owner's conversation is unknown");
                assert!(!begin_turn(conn, "b", "c-1", "Mine", &body(&[]), 11)?, "nor can it be taken over");
                let files = [SavedFile { path: "out/a.txt".into(), executable: false, content: b"x".to_vec() }];
                let answered = body(&[("user", "hi"), ("assistant", "hello")]);
                assert!(end_turn(conn, "a", "c-1", &answered, 7, Some(&files), 12)?);
                let ended = get(conn, "a", "c-1")?.unwrap();
                assert!(!ended.running);
                assert_eq!((ended.last_event, ended.touched_at, ended.title.as_str()), (7, 12, "Hello"));
                assert_eq!(ended.body, answered);
                assert_eq!(self::files(conn, "a", "c-1")?, files);
                assert!(self::files(conn, "b", "c-1")?.is_empty());
                // Ending a turn without files keeps those kept before.
                assert!(end_turn(conn, "a", "c-1", &answered, 3, None, 13)?);
                assert_eq!(self::files(conn, "a", "c-1")?.len(), 1);
                assert_eq!(get(conn, "a", "c-1")?.unwrap().last_event, 7, "frame ids never go back");
                assert!(!delete(conn, "b", "c-1")?);
                assert!(delete(conn, "a", "c-1")?);
                assert!(self::files(conn, "a", "c-1")?.is_empty());
                let left: i64 = conn.query_row("SELECT count(*) FROM webui_files", [], |row| row.get(0))?;
                assert_eq!(left, 0, "a deleted conversation's files go with it");
                assert!(!end_turn(conn, "a", "c-1", &answered, 8, None, 14)?, "a deleted conversation stays gone");
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn the_listing_is_the_owners_most_recent_first() {
        let store = Store::temporary().unwrap();
        store
            .run_here(|conn| {
                for (n, id) in ["c-1", "c-2", "c-3"].iter().enumerate() {
                    begin_turn(conn, "a", id, id, &body(&[]), 100 + n as u64)?;
                }
                begin_turn(conn, "b", "c-9", "theirs", &body(&[]), 200)?;
                begin_turn(conn, "a", "c-1", "c-1", &body(&[]), 300)?;
                let ids: Vec<String> = list(conn, "a", 10)?.into_iter().map(|c| c.id).collect();
                assert_eq!(ids, ["c-1", "c-3", "c-2"]);
                assert_eq!(list(conn, "a", 2)?.len(), 2);
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn a_turn_running_when_the_server_stopped_ends_with_a_note_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), Retention::default()).unwrap();
            let now = crate::store::unix_now();
            store.run_here(|conn| begin_turn(conn, "a", "c-1", "t", &body(&[("user", "hi")]), now)).unwrap();
        }
        let store = Store::open(dir.path(), Retention::default()).unwrap();
        let after = store.run_here(|conn| get(conn, "a", "c-1")).unwrap().unwrap();
        assert!(!after.running);
        let messages = after.body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[1]["note"], INTERRUPTED);
        assert_eq!(messages[1]["role"], "assistant");
    }

    #[test]
    fn retention_takes_web_conversations_and_their_files() {
        let store = Store::temporary().unwrap();
        store
            .run_here(|conn| {
                begin_turn(conn, "a", "c-old", "t", &body(&[]), 10)?;
                let files = [SavedFile { path: "f".into(), executable: true, content: vec![0; 64] }];
                end_turn(conn, "a", "c-old", &body(&[]), 1, Some(&files), 10)?;
                begin_turn(conn, "a", "c-new", "t", &body(&[]), 1_000)?;
                let retention = Retention { max_age: std::time::Duration::from_secs(100), ..Retention::default() };
                assert_eq!(retain(conn, retention, 1_050)?, 1);
                assert_eq!(get(conn, "a", "c-old")?, None);
                assert!(get(conn, "a", "c-new")?.is_some());
                let left: i64 = conn.query_row("SELECT count(*) FROM webui_files", [], |row| row.get(0))?;
                assert_eq!(left, 0);
                Ok(())
            })
            .unwrap();
    }
}
