//! Files of OpenAI's Files API (`/v1/files`) and the Web UI's attachments:
//! a row of what the file is (its name, its purpose, the type its content
//! showed, its size) and the content as a blob, owned by the caller that
//! uploaded it. A file a Web UI conversation uses belongs to it from then
//! on and goes with it; any other file stays until it is deleted, its
//! `expires_at` passes, or retention takes it.
//!
//! The content is written through SQLite's incremental blob I/O from the
//! upload's spooled copy, so a 32 MiB file never sits in memory whole.

use std::io::{Read, Write};

use rusqlite::{params, Connection, OptionalExtension, MAIN_DB};

use super::StoreError;

/// What a stored file is, without its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    pub id: String,
    /// As the uploader named it, made safe (see `attachments::safe_name`).
    pub filename: String,
    pub purpose: String,
    /// The type its content showed, never the one its name claims.
    pub media_type: String,
    pub bytes: u64,
    pub created_at: u64,
    /// When it goes by itself, if the upload said so.
    pub expires_at: Option<u64>,
}

const COLUMNS: &str = "id, filename, purpose, media_type, bytes, created_at, expires_at";

fn meta(row: &rusqlite::Row<'_>) -> rusqlite::Result<FileMeta> {
    Ok(FileMeta {
        id: row.get(0)?,
        filename: row.get(1)?,
        purpose: row.get(2)?,
        media_type: row.get(3)?,
        bytes: row.get::<_, i64>(4)? as u64,
        created_at: row.get::<_, i64>(5)? as u64,
        expires_at: row.get::<_, Option<i64>>(6)?.map(|at| at as u64),
    })
}

/// Stores `owner`'s file `file`, its `bytes` bytes read from `content`, in
/// one transaction: a content that ends early or fails to read leaves
/// nothing.
pub fn put(conn: &mut Connection, owner: &str, file: &FileMeta, content: &mut impl Read) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO files (id, owner, filename, purpose, media_type, bytes, created_at, expires_at, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, zeroblob(?6))",
        params![
            file.id,
            owner,
            file.filename,
            file.purpose,
            file.media_type,
            file.bytes as i64,
            file.created_at as i64,
            file.expires_at.map(|at| at as i64),
        ],
    )?;
    let row = tx.last_insert_rowid();
    {
        let mut blob = tx.blob_open(MAIN_DB, "files", "content", row, false)?;
        let copied = std::io::copy(&mut content.take(file.bytes), &mut blob)
            .map_err(|err| StoreError::Worker(format!("the upload could not be copied into the store: {err}")))?;
        if copied != file.bytes {
            return Err(StoreError::Worker(format!("the upload ended after {copied} of its {} bytes", file.bytes)));
        }
        blob.flush().map_err(|err| StoreError::Worker(format!("the upload could not be written: {err}")))?;
    }
    tx.commit()?;
    Ok(())
}

/// `owner`'s file `id`.
pub fn get(conn: &Connection, owner: &str, id: &str) -> Result<Option<FileMeta>, StoreError> {
    Ok(conn
        .query_row(&format!("SELECT {COLUMNS} FROM files WHERE id = ?1 AND owner = ?2"), params![id, owner], meta)
        .optional()?)
}

/// `owner`'s file `id` with its content.
pub fn read(conn: &Connection, owner: &str, id: &str) -> Result<Option<(FileMeta, Vec<u8>)>, StoreError> {
    let found = conn
        .query_row(
            &format!("SELECT {COLUMNS}, rowid FROM files WHERE id = ?1 AND owner = ?2"),
            params![id, owner],
            |row| Ok((meta(row)?, row.get::<_, i64>(7)?)),
        )
        .optional()?;
    let Some((file, row)) = found else { return Ok(None) };
    let mut blob = conn.blob_open(MAIN_DB, "files", "content", row, true)?;
    let mut content = Vec::with_capacity(file.bytes as usize);
    blob.read_to_end(&mut content)
        .map_err(|err| StoreError::Worker(format!("a stored file could not be read: {err}")))?;
    Ok(Some((file, content)))
}

/// Which end of the list a page starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Oldest,
    Newest,
}

/// One page of `owner`'s files (of `purpose`, when given) after the file
/// `after`, and whether more follow.
pub fn list(
    conn: &Connection,
    owner: &str,
    purpose: Option<&str>,
    after: Option<&str>,
    limit: usize,
    order: Order,
) -> Result<(Vec<FileMeta>, bool), StoreError> {
    let (direction, past) = match order {
        Order::Oldest => ("ASC", ">"),
        Order::Newest => ("DESC", "<"),
    };
    // Files sort by when they came, then by rowid among those of one second.
    let sql = format!(
        "SELECT {COLUMNS} FROM files WHERE owner = ?1 AND (?2 IS NULL OR purpose = ?2)
           AND (?3 IS NULL OR (created_at, rowid) {past} (SELECT created_at, rowid FROM files WHERE id = ?3 AND owner = ?1))
         ORDER BY created_at {direction}, rowid {direction} LIMIT ?4"
    );
    let mut statement = conn.prepare(&sql)?;
    let mut files = statement
        .query_map(params![owner, purpose, after, (limit + 1) as i64], meta)?
        .collect::<Result<Vec<_>, _>>()?;
    let more = files.len() > limit;
    files.truncate(limit);
    Ok((files, more))
}

/// Deletes `owner`'s file `id`; `false` when there is none.
pub fn delete(conn: &Connection, owner: &str, id: &str) -> Result<bool, StoreError> {
    Ok(conn.execute("DELETE FROM files WHERE id = ?1 AND owner = ?2", params![id, owner])? > 0)
}

/// Makes `owner`'s files `ids` belong to the Web UI conversation
/// `conversation` (those that belong to none yet), so they go with it.
pub fn adopt(conn: &Connection, owner: &str, conversation: &str, ids: &[String]) -> Result<usize, StoreError> {
    let mut update = conn.prepare_cached(
        "UPDATE files SET conversation_id = ?3 WHERE id = ?1 AND owner = ?2 AND conversation_id IS NULL",
    )?;
    let mut adopted = 0;
    for id in ids {
        adopted += update.execute(params![id, owner, conversation])?;
    }
    Ok(adopted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn file(id: &str, created_at: u64) -> FileMeta {
        FileMeta {
            id: id.into(),
            filename: format!("{id}.txt"),
            purpose: "user_data".into(),
            media_type: "text/plain".into(),
            bytes: 5,
            created_at,
            expires_at: None,
        }
    }

    #[test]
    fn a_file_is_stored_read_listed_and_deleted_by_its_owner_only() {
        let store = Store::temporary().unwrap();
        store
            .run_here(|conn| {
                put(conn, "me", &file("file-a", 10), &mut &b"hello"[..])?;
                put(conn, "me", &file("file-b", 10), &mut &b"world"[..])?;
                put(conn, "me", &file("file-c", 11), &mut &b"again"[..])?;
                put(conn, "you", &file("file-d", 12), &mut &b"yours"[..])?;
                Ok(())
            })
            .unwrap();
        let (meta, content) = store.run_here(|conn| read(conn, "me", "file-b")).unwrap().unwrap();
        assert_eq!((meta, content), (file("file-b", 10), b"world".to_vec()));
        assert_eq!(store.run_here(|conn| read(conn, "you", "file-b")).unwrap(), None);
        let ids = |page: (Vec<FileMeta>, bool)| (page.0.into_iter().map(|f| f.id).collect::<Vec<_>>(), page.1);
        let page = store.run_here(|conn| list(conn, "me", None, None, 2, Order::Oldest)).unwrap();
        assert_eq!(ids(page), (vec!["file-a".to_string(), "file-b".into()], true));
        let page = store.run_here(|conn| list(conn, "me", None, Some("file-b"), 2, Order::Oldest)).unwrap();
        assert_eq!(ids(page), (vec!["file-c".to_string()], false));
        let page = store.run_here(|conn| list(conn, "me", None, Some("file-c"), 5, Order::Newest)).unwrap();
        assert_eq!(ids(page), (vec!["file-b".to_string(), "file-a".into()], false));
        let page = store.run_here(|conn| list(conn, "me", Some("batch"), None, 5, Order::Newest)).unwrap();
        assert_eq!(ids(page), (vec![], false));
        assert!(!store.run_here(|conn| delete(conn, "you", "file-a")).unwrap());
        assert!(store.run_here(|conn| delete(conn, "me", "file-a")).unwrap());
        assert_eq!(store.run_here(|conn| get(conn, "me", "file-a")).unwrap(), None);
    }

    #[test]
    fn a_content_that_ends_early_leaves_nothing() {
        let store = Store::temporary().unwrap();
        let short = FileMeta { bytes: 10, ..file("file-short", 1) };
        let err = store.run_here(|conn| put(conn, "me", &short, &mut &b"hello"[..])).unwrap_err();
        assert!(err.to_string().contains("ended after 5 of its 10 bytes"), "{err}");
        assert_eq!(store.run_here(|conn| get(conn, "me", "file-short")).unwrap(), None);
    }
}
