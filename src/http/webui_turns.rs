//! The host owns a Web UI turn. `POST /api/chat` starts the turn as a
//! task of its own that pushes every frame into the conversation's
//! [`Relay`]; the POST's response, a reloaded page and a second tab are
//! all readers of that relay. A reader that leaves (a closed page, lost
//! Wi-Fi) never stops the turn: only Stop (`DELETE
//! /api/conversations/{id}/turn`), deleting the conversation, and the
//! turn's own bounds (`--turn-timeout`, its token budget) do. While no
//! reader is attached the turn counts against `--max-detached-turns`
//! (see [`crate::http::background`]); past that cap the oldest such turn
//! is stopped with a note in its history.
//!
//! The turn writes its conversation to the store twice: when it starts
//! (the messages it was sent, so a reload finds them) and when it ends
//! (the answer added), the second before its last frame goes out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::{AbortHandle, Abortable};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::http::background::Background;
use crate::http::relay::{Relay, Watcher};

/// Why a turn was stopped before it ended on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The page's Stop.
    ByUser,
    /// Its conversation was deleted: nothing is written back.
    Deleted,
    /// Pushed out past `--max-detached-turns`, with the sentence why.
    PushedOut(String),
}

impl Stopped {
    /// The note the turn's history keeps.
    pub fn note(&self) -> String {
        match self {
            Stopped::ByUser => "stopped".to_string(),
            Stopped::Deleted => "the conversation was deleted".to_string(),
            Stopped::PushedOut(why) => why.clone(),
        }
    }
}

/// One Web UI turn: running, or the last one of its conversation.
pub struct WebTurn {
    pub conversation: String,
    pub owner: String,
    pub relay: Arc<Relay>,
    stop: AbortHandle,
    stopped: Arc<Mutex<Option<Stopped>>>,
}

impl WebTurn {
    pub fn running(&self) -> bool {
        !self.relay.ended()
    }

    /// Stops the turn, saying why; `false` when it had already ended.
    pub fn stop(&self, why: Stopped) -> bool {
        if !self.running() {
            return false;
        }
        let mut stopped = self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        stopped.get_or_insert(why);
        drop(stopped);
        self.stop.abort();
        true
    }

    fn why(&self) -> Option<Stopped> {
        self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// Registers a turn whose readers all left with the detached turns, and
/// takes it out when one comes back.
struct Detach {
    background: Arc<Background>,
    conversation: String,
    owner: String,
    stop: AbortHandle,
    stopped: Arc<Mutex<Option<Stopped>>>,
}

impl Watcher for Detach {
    fn alone(&self) {
        let stopped = self.stopped.clone();
        let pushed = Box::new(move |why: String| {
            let mut stopped = stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            stopped.get_or_insert(Stopped::PushedOut(why));
        });
        self.background.admit(&self.conversation, &self.owner, self.stop.clone(), pushed);
    }

    fn joined(&self) {
        self.background.finish(&self.conversation);
    }
}

/// Most ended turns kept for readers that come back; past it the one that
/// began longest ago goes (its history is in the store). Running turns are
/// bounded by the model's slots and `--max-detached-turns`, and always kept.
pub const MAX_KEPT_TURNS: usize = skillhost_actors::conversations::MAX_CONVERSATIONS;

/// Every conversation's running or last turn.
#[derive(Default)]
pub struct Turns {
    turns: Mutex<HashMap<String, (u64, Arc<WebTurn>)>>,
    /// Stamps each turn in the order turns began.
    begun: std::sync::atomic::AtomicU64,
}

impl Turns {
    fn turns(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Arc<WebTurn>)>> {
        self.turns.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `owner`'s turn of `conversation`, running or last.
    pub fn get(&self, conversation: &str, owner: &str) -> Option<Arc<WebTurn>> {
        self.turns().get(conversation).map(|(_, turn)| turn).filter(|turn| turn.owner == owner).cloned()
    }

    /// Forgets a conversation's turn, stopping it if it runs.
    pub fn remove(&self, conversation: &str, why: Stopped) {
        if let Some((_, turn)) = self.turns().remove(conversation) {
            turn.stop(why);
        }
    }

    /// How many turns are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.turns().len()
    }

    /// Makes the next turn of `conversation`, its frame ids after
    /// `last_event`; `None` when one is running there already. The turn
    /// runs once [`WebTurn`]'s task is handed to [`run`].
    pub fn begin(
        &self,
        background: &Arc<Background>,
        conversation: &str,
        owner: &str,
        last_event: u64,
    ) -> Option<(Arc<WebTurn>, futures_util::future::AbortRegistration)> {
        let mut turns = self.turns();
        let base = match turns.get(conversation) {
            Some((_, turn)) if turn.running() => return None,
            Some((_, turn)) => turn.relay.last_id().max(last_event),
            None => last_event,
        };
        turns.remove(conversation);
        while turns.len() >= MAX_KEPT_TURNS {
            let oldest = turns
                .iter()
                .filter(|(_, (_, turn))| !turn.running())
                .min_by_key(|(_, (begun, _))| *begun)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => turns.remove(&id),
                None => break,
            };
        }
        let (stop, registration) = AbortHandle::new_pair();
        let stopped = Arc::new(Mutex::new(None));
        let watcher = Detach {
            background: background.clone(),
            conversation: conversation.to_string(),
            owner: owner.to_string(),
            stop: stop.clone(),
            stopped: stopped.clone(),
        };
        let turn = Arc::new(WebTurn {
            conversation: conversation.to_string(),
            owner: owner.to_string(),
            relay: Relay::new(base, Some(Box::new(watcher))),
            stop,
            stopped,
        });
        let begun = self.begun.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        turns.insert(conversation.to_string(), (begun, turn.clone()));
        Some((turn, registration))
    }
}

/// What a turn's frames said, for its history.
#[derive(Debug, Default)]
pub struct Answer {
    pub content: String,
    pub reasoning: String,
    /// Files its code runs left: `{path, bytes, url}`, the latest of each.
    pub artifacts: Vec<Value>,
    /// The final frame's figures (`finish_reason`, `usage`, `rounds`).
    pub done: Option<Value>,
    /// The error the turn ended with.
    pub error: Option<String>,
    /// The end was written to the store (by the final frame).
    pub stored: bool,
}

impl Answer {
    /// The assistant message the history keeps.
    pub fn message(&self, note: Option<String>) -> Value {
        let mut message = json!({"role": "assistant", "content": self.content});
        if !self.reasoning.is_empty() {
            message["reasoning"] = json!(self.reasoning);
        }
        if !self.artifacts.is_empty() {
            message["artifacts"] = json!(self.artifacts);
        }
        if let Some(done) = &self.done {
            for key in ["finish_reason", "usage", "rounds"] {
                message[key] = done[key].clone();
            }
        }
        if let Some(error) = &self.error {
            message["error"] = json!(error);
        }
        if let Some(note) = note {
            message["note"] = json!(note);
        }
        message
    }
}

/// The turn's task: its frames into the relay until it ends or is
/// stopped; a stopped or failed turn's history is written here (a
/// finished one's by its final frame, before that frame goes out).
pub async fn run(
    turn: Arc<WebTurn>,
    frames: impl futures_util::Stream<Item = Result<bytes::Bytes, actix_web::Error>>,
    registration: futures_util::future::AbortRegistration,
    answer: Arc<Mutex<Answer>>,
    background: Arc<Background>,
    write_end: impl FnOnce(Value) -> futures_util::future::BoxFuture<'static, ()>,
) {
    let relay = turn.relay.clone();
    let pump = async move {
        futures_util::pin_mut!(frames);
        while let Some(frame) = frames.next().await {
            let Ok(frame) = frame else { break };
            // Readers make their own keep-alive comments.
            if !frame.starts_with(b":") {
                relay.push(frame);
            }
        }
    };
    let outcome = Abortable::new(pump, registration).await;
    let why = turn.why();
    let (stored, message) = {
        let answer = answer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let note = match (&outcome, &why) {
            (Err(_), Some(why)) => Some(why.note()),
            (Err(_), None) => Some("stopped".to_string()),
            (Ok(()), _) => None,
        };
        (answer.stored, answer.message(note))
    };
    if why == Some(Stopped::Deleted) {
        turn.relay.end();
        background.finish(&turn.conversation);
        return;
    }
    if !stored {
        write_end(message.clone()).await;
    }
    if outcome.is_err() {
        let note = message["note"].clone();
        let frame = json!({"stopped": true, "note": note, "conversationId": turn.conversation});
        turn.relay.push(bytes::Bytes::from(format!("data: {frame}\n\n")));
    }
    // Ended first: a reader leaving from now on cannot register it again.
    turn.relay.end();
    background.finish(&turn.conversation);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_turns_at_and_past_the_limit_give_way_oldest_first_and_running_ones_stay() {
        let background = Arc::new(Background::new(4));
        let turns = Turns::default();
        let running = turns.begin(&background, "c-running", "o", 0).unwrap().0;
        for n in 1..MAX_KEPT_TURNS {
            let (turn, _) = turns.begin(&background, &format!("c-{n}"), "o", 0).unwrap();
            turn.relay.end();
        }
        assert_eq!(turns.len(), MAX_KEPT_TURNS);
        assert!(turns.begin(&background, "c-running", "o", 0).is_none(), "one turn runs per conversation");
        // One more: the oldest ended turn goes, never the running one.
        let fresh = turns.begin(&background, "c-new", "o", 0).unwrap().0;
        fresh.relay.push(bytes::Bytes::from_static(b"data: {}\n\n"));
        fresh.relay.end();
        assert_eq!(turns.len(), MAX_KEPT_TURNS);
        assert!(turns.get("c-1", "o").is_none());
        assert!(turns.get("c-2", "o").is_some() && turns.get("c-running", "o").is_some());
        assert!(running.running());
        // A conversation's next turn replaces its last one, ids rising on.
        let (next, _) = turns.begin(&background, "c-new", "o", 0).unwrap();
        assert_eq!(next.relay.last_id(), 1);
        assert_eq!(turns.len(), MAX_KEPT_TURNS);
    }
}
