//! Web UI conversations: ids the server issues, and the workspace a
//! conversation keeps from turn to turn (with `--code-exec`) until it is
//! closed, idle past a limit, or pushed out by newer conversations.
//!
//! Ids are 128 random bits made here, never chosen by a client: a client
//! that sends an id this server did not issue (or has forgotten) gets a new
//! one, so nobody can name their way into another conversation's folder.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ractor::ActorRef;

use super::actor::WorkspaceMsg;

/// A conversation is forgotten (and its folder deleted) after this long
/// without a request.
pub const CONVERSATION_IDLE: Duration = Duration::from_secs(30 * 60);
/// Most conversations open at once; the least recently used one goes
/// first, so a client starting conversations cannot fill the disk.
pub const MAX_CONVERSATIONS: usize = 64;

struct Entry {
    /// The conversation's workspace actor, once a request has made one.
    workspace: Option<ActorRef<WorkspaceMsg>>,
    last_used: Instant,
}

impl Drop for Entry {
    /// Forgetting a conversation stops its workspace actor, which deletes
    /// the folder after the call it is answering, if any.
    fn drop(&mut self) {
        if let Some(workspace) = &self.workspace {
            workspace.stop(None);
        }
    }
}

/// The open conversations.
#[derive(Default)]
pub struct Conversations {
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for Conversations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversations").field("open", &self.len()).finish()
    }
}

/// A new conversation id: `c-` and 32 hex digits (128 random bits), and
/// the replica's tag when it has one.
fn new_id() -> String {
    crate::replica::stamp(format!("c-{:032x}", rand::random::<u128>()))
}

impl Conversations {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        entries.retain(|_, entry| now.duration_since(entry.last_used) < CONVERSATION_IDLE);
        entries
    }

    /// The conversation a request belongs to: `given` when this server
    /// issued it and still has it open, else a new one.
    pub fn resume_or_start(&self, given: Option<&str>) -> String {
        let mut entries = self.entries();
        if let Some(entry) = given.and_then(|id| entries.get_mut(id)) {
            entry.last_used = Instant::now();
            return given.unwrap_or_default().to_string();
        }
        if entries.len() >= MAX_CONVERSATIONS {
            if let Some(oldest) = entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone()) {
                entries.remove(&oldest);
            }
        }
        let id = new_id();
        entries.insert(id.clone(), Entry { workspace: None, last_used: Instant::now() });
        id
    }

    /// The conversation's workspace actor, if it has one yet; `None` also
    /// for an id that is not open.
    pub fn workspace(&self, id: &str) -> Option<ActorRef<WorkspaceMsg>> {
        let mut entries = self.entries();
        let entry = entries.get_mut(id)?;
        entry.last_used = Instant::now();
        entry.workspace.clone()
    }

    /// Gives an open conversation its workspace actor. When another request
    /// of it attached one meanwhile, that one wins and is returned (the
    /// caller stops its own); `None` when the conversation is not open.
    pub fn attach(&self, id: &str, workspace: ActorRef<WorkspaceMsg>) -> Option<ActorRef<WorkspaceMsg>> {
        let mut entries = self.entries();
        let entry = entries.get_mut(id)?;
        entry.last_used = Instant::now();
        Some(entry.workspace.get_or_insert(workspace).clone())
    }

    /// Forgets a conversation; its folder goes once the call it is
    /// answering ends.
    pub fn close(&self, id: &str) -> bool {
        self.entries().remove(id).is_some()
    }

    /// Forgets a conversation and waits until its folder is deleted (or
    /// `timeout` passes while a long call still runs in it).
    pub async fn close_and_wait(&self, id: &str, timeout: Duration) -> bool {
        let removed = self.entries().remove(id);
        let Some(mut entry) = removed else { return false };
        if let Some(workspace) = entry.workspace.take() {
            let _ = workspace.stop_and_wait(None, Some(timeout)).await;
        }
        true
    }

    /// Closes every conversation and waits for their folders to go.
    pub async fn close_all(&self, timeout: Duration) {
        let ids: Vec<String> = self.entries().keys().cloned().collect();
        for id in ids {
            self.close_and_wait(&id, timeout).await;
        }
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

    #[test]
    fn ids_are_issued_here_and_unknown_ones_are_replaced() {
        let conversations = Conversations::default();
        let first = conversations.resume_or_start(None);
        assert!(first.starts_with("c-") && first.len() == 34, "{first}");
        assert_eq!(conversations.resume_or_start(Some(&first)), first);
        let chosen = conversations.resume_or_start(Some("c-mine"));
        assert_ne!(chosen, "c-mine", "a client-chosen id is never used");
        assert!(conversations.close(&first));
        assert_ne!(conversations.resume_or_start(Some(&first)), first, "a closed id does not come back");
    }

    #[test]
    fn conversation_limit_at_and_past() {
        let conversations = Conversations::default();
        let ids: Vec<String> = (0..MAX_CONVERSATIONS).map(|_| conversations.resume_or_start(None)).collect();
        assert_eq!(conversations.len(), MAX_CONVERSATIONS);
        // One more pushes out the least recently used (the first).
        conversations.resume_or_start(None);
        assert_eq!(conversations.len(), MAX_CONVERSATIONS);
        assert!(!conversations.close(&ids[0]));
        assert!(conversations.close(&ids[1]));
    }
}
