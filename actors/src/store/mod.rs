//! The state folder's store: one SQLite file (`state.db`) that keeps what
//! must outlive a process: the Responses API's stored responses and
//! conversations, the Web UI's conversations with their files, and the
//! files uploaded to `/v1/files` or attached in the Web UI.
//!
//! The file is opened once, at start-up, by one server: it holds an
//! exclusive lock on `state.lock` beside it for as long as it runs, so a
//! second server pointed at the same folder is refused instead of
//! interleaving its writes. A file this version did
//! not write (another program's, a newer skillhost's, or one damaged on
//! disk) is refused with a sentence and left as it is, never rewritten.
//!
//! Writes go through the write-ahead log with a sync at every commit
//! (`synchronous=FULL`): what a commit returned survives `kill -9` and a
//! power cut. A turn commits once, at its end, before its answer says the
//! response is stored.
//!
//! SQLite is blocking; every call from async code goes through
//! [`Store::run`], which runs it on tokio's blocking pool.

pub mod conversations;
pub mod files;
pub mod responses;
pub mod webui;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use rusqlite::Connection;
use rusqlite::{ErrorCode, OpenFlags, OptionalExtension};

/// The file inside the state folder.
pub const STORE_FILE: &str = "state.db";
/// The file whose lock says a server has the folder.
const LOCK_FILE: &str = "state.lock";

/// Marks a SQLite file as ours (`PRAGMA application_id`): "skhs".
const APPLICATION_ID: i64 = 0x736b_6873;

/// The schema, one step per version: a file at version `n` has run the
/// first `n` steps, and opening it runs the rest in one transaction.
/// A step, once released, never changes; a new version adds a step.
const MIGRATIONS: &[&str] = &[
    // 1: stored responses. A response's own input items and its output
    // items are rows of `response_items` (side 0 and 1), so a follow-up's
    // context is the chain of `previous_id`s, each turn stored once.
    "CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        previous_id TEXT,
        created_at INTEGER NOT NULL,
        status TEXT NOT NULL,
        body TEXT NOT NULL
    ) STRICT;
    CREATE TABLE response_items (
        response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
        side INTEGER NOT NULL CHECK (side IN (0, 1)),
        position INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (response_id, side, position)
    ) STRICT;
    CREATE INDEX response_items_by_id ON response_items(item_id);
    CREATE INDEX responses_by_owner ON responses(owner, created_at);",
    // 2: conversations of OpenAI's Conversations API, their items in order.
    // `touched_at` moves with every change, and retention goes by it.
    "CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        touched_at INTEGER NOT NULL,
        metadata TEXT NOT NULL
    ) STRICT;
    CREATE TABLE conversation_items (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (conversation_id, position)
    ) STRICT;
    CREATE INDEX conversation_items_by_id ON conversation_items(item_id);
    CREATE INDEX conversations_by_owner ON conversations(owner, touched_at);",
    // 3: the Web UI's conversations: the messages and settings the page
    // reopens, whether a turn was running, the last frame id its events
    // had (so ids keep rising across restarts), and the files its commands
    // left in its workspace, restored when it continues.
    "CREATE TABLE webui_conversations (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        title TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        touched_at INTEGER NOT NULL,
        running INTEGER NOT NULL CHECK (running IN (0, 1)),
        last_event INTEGER NOT NULL,
        body TEXT NOT NULL
    ) STRICT;
    CREATE TABLE webui_files (
        conversation_id TEXT NOT NULL REFERENCES webui_conversations(id) ON DELETE CASCADE,
        path TEXT NOT NULL,
        executable INTEGER NOT NULL CHECK (executable IN (0, 1)),
        content BLOB NOT NULL,
        PRIMARY KEY (conversation_id, path)
    ) STRICT;
    CREATE INDEX webui_conversations_by_owner ON webui_conversations(owner, touched_at);",
    // 4: files (`/v1/files` and the Web UI's attachments), their content
    // as a blob. A file a Web UI conversation took in goes with it.
    "CREATE TABLE files (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        media_type TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        conversation_id TEXT REFERENCES webui_conversations(id) ON DELETE CASCADE,
        content BLOB NOT NULL
    ) STRICT;
    CREATE INDEX files_by_owner ON files(owner, created_at);
    CREATE INDEX files_by_conversation ON files(conversation_id);",
];

/// The version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `--state-max-age` by default: what nobody touched for 30 days goes, as
/// OpenAI keeps stored responses.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// `--state-max-bytes` by default.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// The smallest `--state-max-bytes`: below it, one long turn would not fit.
pub const MIN_MAX_BYTES: u64 = 1 << 20;

/// How much the store keeps: records older than `max_age` go, and past
/// `max_bytes` of live pages the oldest go until it fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { max_age: DEFAULT_MAX_AGE, max_bytes: DEFAULT_MAX_BYTES }
    }
}

/// Seconds since the Unix epoch, as records are stamped.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot make the state folder {}: {source}", path.display())]
    Folder { path: PathBuf, source: std::io::Error },
    #[error("{} is not a skillhost store (it is another program's database or not a database at all); move it away or pass another --state-dir", path.display())]
    Foreign { path: PathBuf },
    #[error("{} is damaged ({detail}); it was left as it is: restore it from a backup or move it away to start empty", path.display())]
    Damaged { path: PathBuf, detail: String },
    #[error("{} was written by a newer skillhost (schema version {found}, this one knows up to {SCHEMA_VERSION}); run that version or pass another --state-dir", path.display())]
    Newer { path: PathBuf, found: i64 },
    #[error("{} is in use by another skillhost process; each server needs a --state-dir of its own", path.display())]
    Locked { path: PathBuf },
    #[error("the store failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("a stored record is unreadable: {0}")]
    Record(#[from] serde_json::Error),
    #[error("the store's worker stopped: {0}")]
    Worker(String),
}

/// The open store; clones share one connection.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    retention: Retention,
    /// Held open, and with it the lock, while any clone lives.
    _lock: Arc<std::fs::File>,
    /// The folder of a [`Store::temporary`] store, deleted after the
    /// connection above it closes (fields drop in order).
    _temporary: Option<Arc<tempfile::TempDir>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (or makes) the store in `dir`, migrating an older file to
    /// [`SCHEMA_VERSION`]. The file is private to this user: it holds every
    /// caller's responses.
    pub fn open(dir: &Path, retention: Retention) -> Result<Store, StoreError> {
        make_folder(dir)?;
        let lock = lock_folder(dir)?;
        let path = dir.join(STORE_FILE);
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|err| classify(err, &path))?;
        prepare(&conn, &path)?;
        let store =
            Store { conn: Arc::new(Mutex::new(conn)), path, retention, _lock: Arc::new(lock), _temporary: None };
        let failed = store.run_here(|conn| responses::fail_interrupted(conn))?;
        if failed > 0 {
            tracing::warn!(failed, "responses that were running when the server last stopped are marked failed");
        }
        let cut = store.run_here(|conn| webui::note_interrupted(conn))?;
        if cut > 0 {
            tracing::warn!(cut, "Web UI turns that were running when the server last stopped end with a note");
        }
        let dropped = store.run_here(|conn| retain(conn, retention, unix_now()))?;
        if dropped > 0 {
            tracing::info!(dropped, "the store dropped what it keeps no longer (--state-max-age, --state-max-bytes)");
        }
        Ok(store)
    }

    /// A store in a new private folder that goes when the last clone does:
    /// for what needs no state after its process (tests, one-off runs).
    pub fn temporary() -> Result<Store, StoreError> {
        let dir = tempfile::Builder::new()
            .prefix("skillhost-state-")
            .tempdir()
            .map_err(|source| StoreError::Folder { path: std::env::temp_dir(), source })?;
        let mut store = Store::open(dir.path(), Retention::default())?;
        store._temporary = Some(Arc::new(dir));
        Ok(store)
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the store keeps.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// Runs `work` on the connection, on the blocking pool.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            work(&mut conn)
        })
        .await
        .map_err(|err| StoreError::Worker(err.to_string()))?
    }

    /// Applies the retention now; what `serve` runs every hour.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        let retention = self.retention;
        self.run(move |conn| retain(conn, retention, unix_now())).await
    }

    /// Runs `work` on the connection on this thread (tests and start-up).
    pub fn run_here<T>(&self, work: impl FnOnce(&mut Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut conn = self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        work(&mut conn)
    }
}

/// Makes the state folder when it is missing. Its mode is left to the
/// operator (0755 when made here): workspaces may live below it, and the
/// sandbox uids must pass through. What is private is the files: the
/// store (SQLite gives its log the same mode) and the lock are 0600.
fn make_folder(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::DirBuilderExt;
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Folder { path, source }
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(failed(dir))?;
    let file = dir.join(STORE_FILE);
    private_file(&file).map_err(failed(&file))?;
    Ok(())
}

/// Opens (or makes) a file only this user may read. A link planted in the
/// folder in its place is not followed.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Bytes of the file's pages in use (freed pages are reused, not counted).
pub fn live_bytes(conn: &Connection) -> Result<u64, StoreError> {
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |row| row.get(0))?;
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |row| row.get(0))?;
    let size: i64 = conn.query_row("PRAGMA page_size", [], |row| row.get(0))?;
    Ok(((pages - free).max(0) * size) as u64)
}

/// Applies `retention` at `now`: every record (a response, or a
/// conversation with its items) untouched for longer than the age limit
/// goes, then the oldest of either kind until the live pages fit the byte
/// limit. Returns how many records went.
pub fn retain(conn: &mut Connection, retention: Retention, now: u64) -> Result<usize, StoreError> {
    let cutoff = now.saturating_sub(retention.max_age.as_secs()) as i64;
    let mut dropped = conn.execute("DELETE FROM responses WHERE created_at < ?1", [cutoff])?;
    dropped += conn.execute("DELETE FROM conversations WHERE touched_at < ?1", [cutoff])?;
    dropped += conn.execute("DELETE FROM webui_conversations WHERE touched_at < ?1", [cutoff])?;
    // A conversation's files go with it; the others by age, or when the
    // expiry their upload asked for has passed.
    dropped += conn.execute(
        "DELETE FROM files WHERE conversation_id IS NULL AND (created_at < ?1 OR expires_at <= ?2)",
        [cutoff, now as i64],
    )?;
    while live_bytes(conn)? > retention.max_bytes {
        // A tenth of what is left at a time (at least one), oldest first:
        // everything as old as the tenth-oldest record goes.
        let threshold: Option<i64> = conn
            .query_row(
                "SELECT t FROM (SELECT created_at AS t FROM responses UNION ALL SELECT touched_at FROM conversations
                     UNION ALL SELECT touched_at FROM webui_conversations
                     UNION ALL SELECT created_at FROM files WHERE conversation_id IS NULL)
                 ORDER BY t LIMIT 1 OFFSET max(0, ((SELECT count(*) FROM responses)
                     + (SELECT count(*) FROM conversations) + (SELECT count(*) FROM webui_conversations)
                     + (SELECT count(*) FROM files WHERE conversation_id IS NULL)) / 10 - 1)",
                [],
                |row| row.get(0),
            )
            .optional()?;
        let Some(threshold) = threshold else { break };
        let gone = conn.execute("DELETE FROM responses WHERE created_at <= ?1", [threshold])?
            + conn.execute("DELETE FROM conversations WHERE touched_at <= ?1", [threshold])?
            + conn.execute("DELETE FROM webui_conversations WHERE touched_at <= ?1", [threshold])?
            + conn.execute("DELETE FROM files WHERE conversation_id IS NULL AND created_at <= ?1", [threshold])?;
        if gone == 0 {
            break;
        }
        dropped += gone;
    }
    Ok(dropped)
}

/// Takes the folder's lock, or says who has it.
fn lock_folder(dir: &Path) -> Result<std::fs::File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let file = private_file(&path).map_err(|source| StoreError::Folder { path: path.clone(), source })?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(StoreError::Locked { path: dir.join(STORE_FILE) }),
        Err(err) => Err(StoreError::Folder { path, source: err.into() }),
    }
}

/// The sentence for an SQLite error met while opening `path`.
fn classify(err: rusqlite::Error, path: &Path) -> StoreError {
    match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::Foreign { path: path.to_path_buf() },
        Some(ErrorCode::DatabaseCorrupt) => StoreError::Damaged { path: path.to_path_buf(), detail: err.to_string() },
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Locked { path: path.to_path_buf() },
        _ => StoreError::Sqlite(err),
    }
}

/// Settings, the checks that refuse a file, and the migrations.
fn prepare(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let on = |err| classify(err, path);
    // Another program holding the file: wait a little, then refuse.
    conn.busy_timeout(std::time::Duration::from_millis(200)).map_err(on)?;
    let id: i64 = conn.query_row("PRAGMA application_id", [], |row| row.get(0)).map_err(on)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0)).map_err(on)?;
    let tables: i64 = conn.query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0)).map_err(on)?;
    if id != APPLICATION_ID && (id != 0 || tables != 0 || version != 0) {
        return Err(StoreError::Foreign { path: path.to_path_buf() });
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::Newer { path: path.to_path_buf(), found: version });
    }
    let check: String = conn.query_row("PRAGMA quick_check", [], |row| row.get(0)).map_err(on)?;
    if check != "ok" {
        return Err(StoreError::Damaged { path: path.to_path_buf(), detail: check });
    }
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0)).map_err(on)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Damaged { path: path.to_path_buf(), detail: format!("journal mode {mode}") });
    }
    // Every commit reaches the disk before it returns.
    conn.pragma_update(None, "synchronous", "FULL").map_err(on)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(on)?;
    migrate(conn, version).map_err(on)?;
    Ok(())
}

/// Runs the steps after `from` in one transaction, so a crash mid-way
/// leaves the file at `from`.
fn migrate(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    if from == SCHEMA_VERSION {
        return Ok(());
    }
    let mut batch = String::from("BEGIN IMMEDIATE;\n");
    for step in &MIGRATIONS[from as usize..] {
        batch.push_str(step);
        batch.push('\n');
    }
    batch.push_str(&format!(
        "PRAGMA application_id = {APPLICATION_ID};\nPRAGMA user_version = {SCHEMA_VERSION};\nCOMMIT;"
    ));
    conn.execute_batch(&batch).inspect_err(|_| {
        let _ = conn.execute_batch("ROLLBACK");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(dir: &Path) -> i64 {
        let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
        conn.query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap()
    }

    #[test]
    fn a_new_folder_gets_a_private_store_at_the_current_version() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let store = Store::open(&state, Retention::default()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |name: &str| std::fs::metadata(state.join(name)).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(STORE_FILE), mode(LOCK_FILE)), (0o600, 0o600));
        assert_eq!(mode(&format!("{STORE_FILE}-wal")), 0o600, "the log has the store's mode");
        drop(store);
        assert_eq!(version(&state), SCHEMA_VERSION);
        // Opening again finds it as it was left.
        Store::open(&state, Retention::default()).unwrap();
    }

    #[test]
    fn every_older_version_migrates_to_the_current_one() {
        for from in 0..SCHEMA_VERSION {
            let dir = tempfile::tempdir().unwrap();
            {
                let conn = Connection::open(dir.path().join(STORE_FILE)).unwrap();
                for step in &MIGRATIONS[..from as usize] {
                    conn.execute_batch(step).unwrap();
                }
                if from > 0 {
                    conn.execute_batch(&format!(
                        "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {from};"
                    ))
                    .unwrap();
                }
            }
            Store::open(dir.path(), Retention::default()).unwrap();
            assert_eq!(version(dir.path()), SCHEMA_VERSION, "from version {from}");
        }
    }

    #[test]
    fn a_version_1_store_keeps_its_responses_when_it_gains_conversations() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join(STORE_FILE)).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 1;
                 INSERT INTO responses (id, owner, created_at, status, body)
                 VALUES ('resp_old', 'o', {}, 'completed', '{{\"id\": \"resp_old\"}}');",
                unix_now()
            ))
            .unwrap();
        }
        let store = Store::open(dir.path(), Retention::default()).unwrap();
        let kept = store.run_here(|conn| responses::get(conn, "o", "resp_old")).unwrap();
        assert_eq!(kept.unwrap()["id"], "resp_old");
        let none = store.run_here(|conn| conversations::get(conn, "o", "conv_x")).unwrap();
        assert_eq!(none, None);
    }

    #[test]
    fn a_newer_store_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path(), Retention::default()).unwrap();
        let newer = SCHEMA_VERSION + 1;
        Connection::open(dir.path().join(STORE_FILE))
            .unwrap()
            .execute_batch(&format!("PRAGMA user_version = {newer}"))
            .unwrap();
        let err = Store::open(dir.path(), Retention::default()).unwrap_err();
        assert!(matches!(err, StoreError::Newer { found, .. } if found == newer), "{err}");
        assert!(err.to_string().contains("written by a newer skillhost"), "{err}");
        assert_eq!(version(dir.path()), newer);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let junk = b"these bytes are not SQLite, and no page header follows them".repeat(100);
        std::fs::write(dir.path().join(STORE_FILE), &junk).unwrap();
        let err = Store::open(dir.path(), Retention::default()).unwrap_err();
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
        assert_eq!(std::fs::read(dir.path().join(STORE_FILE)).unwrap(), junk);
    }

    #[test]
    fn another_programs_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        Connection::open(dir.path().join(STORE_FILE)).unwrap().execute_batch("CREATE TABLE notes (body TEXT)").unwrap();
        let err = Store::open(dir.path(), Retention::default()).unwrap_err();
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    }

    #[test]
    fn a_damaged_store_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Retention::default()).unwrap();
        store
            .run_here(|conn| {
                let tx = conn.transaction()?;
                for n in 0..200 {
                    tx.execute(
                        "INSERT INTO responses (id, owner, created_at, status, body) VALUES (?1, 'o', 0, 'completed', ?2)",
                        rusqlite::params![format!("resp_{n}"), "x".repeat(500)],
                    )?;
                }
                tx.commit()?;
                Ok(())
            })
            .unwrap();
        // Closing checkpoints the log into the file.
        drop(store);
        let file = dir.path().join(STORE_FILE);
        let mut bytes = std::fs::read(&file).unwrap();
        // Past the header page: the table's pages, overwritten.
        let page = 4096;
        for byte in &mut bytes[page..page * 3] {
            *byte = 0xA5;
        }
        std::fs::write(&file, &bytes).unwrap();
        let err = Store::open(dir.path(), Retention::default()).unwrap_err();
        assert!(matches!(err, StoreError::Damaged { .. } | StoreError::Foreign { .. }), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), bytes, "a refused file is not rewritten");
    }

    #[test]
    fn a_temporary_store_goes_with_its_last_clone() {
        let store = Store::temporary().unwrap();
        let folder = store.path().parent().unwrap().to_path_buf();
        let clone = store.clone();
        drop(store);
        assert!(folder.join(STORE_FILE).exists());
        drop(clone);
        assert!(!folder.exists());
    }

    #[test]
    fn a_link_in_place_of_the_store_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.db");
        std::fs::write(&elsewhere, b"not ours").unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::symlink(&elsewhere, state.join(STORE_FILE)).unwrap();
        let err = Store::open(&state, Retention::default()).unwrap_err();
        assert!(matches!(err, StoreError::Folder { .. }), "{err}");
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"not ours");
    }

    #[test]
    fn a_second_server_on_the_same_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path(), Retention::default()).unwrap();
        let err = Store::open(dir.path(), Retention::default()).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(err.to_string().contains("in use by another skillhost"), "{err}");
    }
}
