//! Web UI conversations: ids the server issues, and the workspace a
//! conversation keeps from turn to turn (with `--code-exec`) until it is
//! closed, idle past a limit, or pushed out by newer conversations.
//!
//! Ids are 128 random bits made here, never chosen by a client: a client
//! that sends an id this server did not issue (or has forgotten) gets a new
//! one, so nobody can name their way into another conversation's folder.
//!
//! Each conversation belongs to its caller (an API key, or the client's
//! address where no key is needed): another caller's id is treated as
//! unknown, a caller holds at most [`MAX_CONVERSATIONS_PER_CALLER`], and
//! when the server is full the caller holding the most gives one up, so a
//! client opening conversations in a loop pushes out only its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ractor::ActorRef;

use crate::tools::workspace_actor::WorkspaceMsg;

/// A conversation is forgotten (and its folder deleted) after this long
/// without a request.
pub const CONVERSATION_IDLE: Duration = Duration::from_secs(30 * 60);
/// Most conversations open at once; the least recently used one goes
/// first, so a client starting conversations cannot fill the disk.
pub const MAX_CONVERSATIONS: usize = 64;
/// Most conversations one caller holds; its least recently used goes first.
pub const MAX_CONVERSATIONS_PER_CALLER: usize = 16;
/// A conversation unused this long may give its folder back when the
/// sandbox memory is full (see `chat_loop::open_workspace`).
pub const RECLAIM_IDLE_AFTER: Duration = Duration::from_secs(10 * 60);
/// How long reclaiming waits for one conversation's folder to go.
const RECLAIM_WAIT: Duration = Duration::from_secs(10);

struct Entry {
    /// Who opened it (see the module's notes).
    caller: String,
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

    /// The conversation a request of `caller` belongs to: `given` when this
    /// server issued it to that caller and still has it open, else a new one.
    pub fn resume_or_start(&self, given: Option<&str>, caller: &str) -> String {
        self.open(given, caller, false)
    }

    /// Like [`Conversations::resume_or_start`], for an id the caller's
    /// store still holds (`stored`): one that is no longer open (the
    /// process restarted, or it fell out of the open set) opens again under
    /// the same id, with no folder until a request makes one.
    pub fn reopen_or_start(&self, given: Option<&str>, caller: &str, stored: bool) -> String {
        self.open(given, caller, stored)
    }

    fn open(&self, given: Option<&str>, caller: &str, stored: bool) -> String {
        let mut entries = self.entries();
        if let Some(entry) = given.and_then(|id| entries.get_mut(id)).filter(|e| e.caller == caller) {
            entry.last_used = Instant::now();
            return given.unwrap_or_default().to_string();
        }
        // Open under another caller: not theirs, whatever the store says.
        let reopening = stored && given.is_some_and(|id| !entries.contains_key(id));
        let held = |entries: &HashMap<String, Entry>, who: &str| entries.values().filter(|e| e.caller == who).count();
        // Past its own cap, the caller's oldest goes; on a full server, the
        // oldest of whoever holds the most.
        let giving_up = if held(&entries, caller) >= MAX_CONVERSATIONS_PER_CALLER {
            Some(caller.to_string())
        } else if entries.len() >= MAX_CONVERSATIONS {
            entries.values().map(|e| e.caller.clone()).max_by_key(|who| held(&entries, who))
        } else {
            None
        };
        if let Some(who) = giving_up {
            let oldest = entries
                .iter()
                .filter(|(_, e)| e.caller == who)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
        let id = match given {
            Some(id) if reopening => id.to_string(),
            _ => new_id(),
        };
        entries.insert(id.clone(), Entry { caller: caller.to_string(), workspace: None, last_used: Instant::now() });
        id
    }

    /// Whether `id` is open and belongs to `caller`.
    pub fn belongs_to(&self, id: &str, caller: &str) -> bool {
        self.entries().get(id).is_some_and(|e| e.caller == caller)
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

    /// Copies the regular files of the conversation's folder out (see
    /// `workspace::snapshot`), after the call it is answering, if any;
    /// `None` when it has no folder.
    pub async fn snapshot(&self, id: &str, max_bytes: u64) -> Option<crate::workspace::snapshot::Snapshot> {
        let workspace = self.entries().get(id)?.workspace.clone()?;
        ractor::call!(workspace, |reply| WorkspaceMsg::Snapshot { max_bytes, reply }).ok().flatten()
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

    /// Closes the least recently used conversation that holds a folder and
    /// was last used before `idle_before` (never `keep`), and waits for its
    /// folder to go; `false` when there is none.
    pub async fn close_least_recent_idle(&self, idle_before: Instant, keep: Option<&str>) -> bool {
        let oldest = {
            let entries = self.entries();
            entries
                .iter()
                .filter(|(id, e)| e.workspace.is_some() && e.last_used < idle_before && Some(id.as_str()) != keep)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(id, _)| id.clone())
        };
        match oldest {
            Some(id) => {
                tracing::warn!(conversation = %id, "the sandbox memory is full: an idle conversation's folder is reclaimed");
                self.close_and_wait(&id, RECLAIM_WAIT).await
            }
            None => false,
        }
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
        let first = conversations.resume_or_start(None, "a");
        assert!(first.starts_with("c-") && first.len() == 34, "{first}");
        assert_eq!(conversations.resume_or_start(Some(&first), "a"), first);
        let chosen = conversations.resume_or_start(Some("c-mine"), "a");
        assert_ne!(chosen, "c-mine", "a client-chosen id is never used");
        // Another caller's id is not theirs to resume.
        assert_ne!(conversations.resume_or_start(Some(&first), "b"), first);
        assert!(conversations.belongs_to(&first, "a") && !conversations.belongs_to(&first, "b"));
        assert!(conversations.close(&first));
        assert_ne!(conversations.resume_or_start(Some(&first), "a"), first, "a closed id does not come back");
    }

    #[test]
    fn a_stored_id_opens_again_only_for_its_caller_and_only_when_closed() {
        let conversations = Conversations::default();
        assert_eq!(conversations.reopen_or_start(Some("c-kept"), "a", true), "c-kept");
        assert!(conversations.belongs_to("c-kept", "a"));
        assert_eq!(conversations.reopen_or_start(Some("c-kept"), "a", true), "c-kept");
        // Open for a, it is not b's, whatever b claims.
        assert_ne!(conversations.reopen_or_start(Some("c-kept"), "b", true), "c-kept");
        assert_ne!(conversations.reopen_or_start(Some("c-other"), "a", false), "c-other");
    }

    #[test]
    fn a_callers_limit_at_and_past_pushes_out_only_its_own() {
        let conversations = Conversations::default();
        let other = conversations.resume_or_start(None, "b");
        let ids: Vec<String> =
            (0..MAX_CONVERSATIONS_PER_CALLER).map(|_| conversations.resume_or_start(None, "a")).collect();
        assert_eq!(conversations.len(), MAX_CONVERSATIONS_PER_CALLER + 1);
        // One more of a's pushes out a's least recently used, not b's.
        conversations.resume_or_start(None, "a");
        assert_eq!(conversations.len(), MAX_CONVERSATIONS_PER_CALLER + 1);
        assert!(!conversations.belongs_to(&ids[0], "a"));
        assert!(conversations.belongs_to(&ids[1], "a") && conversations.belongs_to(&other, "b"));
    }

    #[tokio::test]
    async fn reclaiming_takes_the_least_recently_used_idle_folder_never_the_one_kept() {
        let base = tempfile::tempdir().unwrap();
        let conversations = Conversations::default();
        let before_any = Instant::now();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let id = conversations.resume_or_start(None, "a");
            let workspace = crate::workspace::Workspace::create(base.path(), &Default::default()).unwrap();
            let (actor, _) =
                ractor::Actor::spawn(None, crate::tools::workspace_actor::WorkspaceActor, workspace).await.unwrap();
            conversations.attach(&id, actor);
            ids.push(id);
        }
        // One without a folder holds no memory: never picked.
        let bare = conversations.resume_or_start(None, "a");
        let now = Instant::now();
        assert!(!conversations.close_least_recent_idle(before_any, None).await, "nothing was idle that long");
        // The oldest is kept (the request's own): the next oldest goes.
        assert!(conversations.close_least_recent_idle(now, Some(&ids[0])).await);
        assert!(conversations.belongs_to(&ids[0], "a") && !conversations.belongs_to(&ids[1], "a"));
        assert!(conversations.close_least_recent_idle(now, None).await);
        assert!(!conversations.belongs_to(&ids[0], "a"));
        assert!(conversations.close_least_recent_idle(now, None).await);
        assert!(!conversations.close_least_recent_idle(now, None).await);
        assert!(conversations.belongs_to(&bare, "a"));
        assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0, "every reclaimed folder is gone");
    }

    #[test]
    fn conversation_limit_at_and_past() {
        let conversations = Conversations::default();
        let callers = MAX_CONVERSATIONS / MAX_CONVERSATIONS_PER_CALLER;
        let mut ids = Vec::new();
        for caller in 0..callers {
            for _ in 0..MAX_CONVERSATIONS_PER_CALLER - usize::from(caller > 0) {
                ids.push((caller, conversations.resume_or_start(None, &caller.to_string())));
            }
        }
        let last = conversations.resume_or_start(None, "last");
        while conversations.len() < MAX_CONVERSATIONS {
            conversations.resume_or_start(None, &format!("one of {}", conversations.len()));
        }
        assert_eq!(conversations.len(), MAX_CONVERSATIONS);
        // One more, on a full server: caller 0 holds the most and gives up
        // its least recently used; the newcomer and the rest keep theirs.
        let newest = conversations.resume_or_start(None, "newest");
        assert_eq!(conversations.len(), MAX_CONVERSATIONS);
        assert!(!conversations.belongs_to(&ids[0].1, "0"));
        assert!(conversations.belongs_to(&ids[1].1, "0") && conversations.belongs_to(&last, "last"));
        assert!(conversations.belongs_to(&newest, "newest"));
    }
}
