//! Workspaces that outlive one request: a Web UI conversation keeps its
//! folder from turn to turn until it is closed, idle past a limit, or pushed
//! out by newer conversations.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Workspace;

/// A conversation's folder is deleted after this long without a request.
pub const CONVERSATION_IDLE: Duration = Duration::from_secs(30 * 60);
/// Most conversations holding a folder at once; the least recently used
/// one goes first, so a client inventing ids cannot fill the disk.
pub const MAX_CONVERSATIONS: usize = 64;

struct Entry {
    workspace: Arc<Workspace>,
    last_used: Instant,
}

/// Conversation id → its workspace. A request holds its own `Arc`, so a
/// folder closed or evicted mid-request lives until that request ends.
#[derive(Default)]
pub struct Conversations {
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for Conversations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversations").field("open", &self.len()).finish()
    }
}

impl Conversations {
    /// The conversation's workspace, created on first use.
    pub fn open(
        &self,
        id: &str,
        create: impl FnOnce() -> std::io::Result<Workspace>,
    ) -> std::io::Result<Arc<Workspace>> {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.retain(|_, entry| now.duration_since(entry.last_used) < CONVERSATION_IDLE);
        if let Some(entry) = entries.get_mut(id) {
            entry.last_used = now;
            return Ok(Arc::clone(&entry.workspace));
        }
        if entries.len() >= MAX_CONVERSATIONS {
            if let Some(oldest) = entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone()) {
                entries.remove(&oldest);
            }
        }
        let workspace = Arc::new(create()?);
        entries.insert(id.to_string(), Entry { workspace: Arc::clone(&workspace), last_used: now });
        Ok(workspace)
    }

    /// Forgets a conversation; its folder goes when no request holds it.
    pub fn close(&self, id: &str) -> bool {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folders(base: &std::path::Path) -> usize {
        std::fs::read_dir(base).unwrap().count()
    }

    #[test]
    fn a_conversation_keeps_its_folder_until_closed() {
        let base = tempfile::tempdir().unwrap();
        let conversations = Conversations::default();
        let first = conversations.open("c1", || Workspace::create(base.path(), None)).unwrap();
        std::fs::write(first.root().join("kept.txt"), "x").unwrap();
        let root = first.root().to_path_buf();
        drop(first);
        let again = conversations.open("c1", || unreachable!("the folder exists")).unwrap();
        assert_eq!(again.root(), root);
        assert!(root.join("kept.txt").exists());
        // Closed while a request still holds it: gone when that request ends.
        assert!(conversations.close("c1"));
        assert!(root.exists());
        drop(again);
        assert!(!root.exists());
        assert!(!conversations.close("c1"));
    }

    #[test]
    fn conversation_limit_at_and_past() {
        let base = tempfile::tempdir().unwrap();
        let conversations = Conversations::default();
        for i in 0..MAX_CONVERSATIONS {
            conversations.open(&format!("c{i}"), || Workspace::create(base.path(), None)).unwrap();
        }
        assert_eq!(conversations.len(), MAX_CONVERSATIONS);
        assert_eq!(folders(base.path()), MAX_CONVERSATIONS);
        // One more pushes out the least recently used (c0).
        conversations.open("new", || Workspace::create(base.path(), None)).unwrap();
        assert_eq!(conversations.len(), MAX_CONVERSATIONS);
        assert_eq!(folders(base.path()), MAX_CONVERSATIONS);
        assert!(!conversations.close("c0"));
        assert!(conversations.close("c1"));
    }
}
