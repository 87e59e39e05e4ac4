//! Turns that run with no client attached: Responses API requests with
//! `background: true`, and Web UI turns whose pages all left. Each is
//! registered here while it runs so, with the handle that stops it. At most
//! `cap` run at once (`--max-detached-turns`, `--parallel` by default); one
//! past it stops the oldest, so a client starting turns and leaving them in
//! a loop cannot hold the model forever.
//!
//! Whoever takes a turn out of the registry writes its last status: the
//! turn itself when it ends (or a page that came back to it), the route
//! that cancels it, or, for the oldest pushed out, its `pushed` hook. A
//! turn taken by two cannot happen, so a finished turn is never reported
//! cancelled and a cancelled one never completed.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures_util::future::AbortHandle;

/// Run on a turn pushed out past the cap, before it is stopped: it says
/// so where its client will look (a stored response's status, a Web UI
/// turn's history).
pub type Pushed = Box<dyn FnOnce(String) + Send>;

struct Running {
    id: String,
    owner: String,
    stop: AbortHandle,
    pushed: Pushed,
}

/// The background turns running now, oldest first.
pub struct Background {
    running: Mutex<VecDeque<Running>>,
    cap: usize,
}

impl Background {
    pub fn new(cap: usize) -> Self {
        Background { running: Mutex::new(VecDeque::new()), cap: cap.max(1) }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, VecDeque<Running>> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a turn that runs on alone; past the cap, the oldest is
    /// told why (its `pushed` hook, with a sentence) and stopped. Returns
    /// the id of the one pushed out.
    pub fn admit(&self, id: &str, owner: &str, stop: AbortHandle, pushed: Pushed) -> Option<String> {
        let oldest = {
            let mut running = self.running();
            let oldest = if running.len() >= self.cap { running.pop_front() } else { None };
            running.push_back(Running { id: id.to_string(), owner: owner.to_string(), stop, pushed });
            oldest
        };
        oldest.map(|oldest| {
            let why = format!(
                "cancelled: more than {} turns were running with no client attached (--max-detached-turns), and this was the oldest",
                self.cap
            );
            (oldest.pushed)(why);
            oldest.stop.abort();
            oldest.id
        })
    }

    /// A turn that ended takes itself out; `false` when a cancel took it
    /// first (and writes its status).
    pub fn finish(&self, id: &str) -> bool {
        let mut running = self.running();
        match running.iter().position(|turn| turn.id == id) {
            Some(at) => {
                running.remove(at);
                true
            }
            None => false,
        }
    }

    /// Stops `owner`'s running turn `id`; `false` when it has none running.
    pub fn cancel(&self, owner: &str, id: &str) -> bool {
        let mut running = self.running();
        match running.iter().position(|turn| turn.id == id && turn.owner == owner) {
            Some(at) => {
                if let Some(turn) = running.remove(at) {
                    turn.stop.abort();
                }
                true
            }
            None => false,
        }
    }

    /// How many run now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.running().len()
    }
}

/// Most background responses whose events are kept for `GET
/// /v1/responses/{id}?stream=true`; past it the oldest that ended go.
pub const MAX_KEPT_STREAMS: usize = 64;

/// The events of background responses, by id, while the server runs.
#[derive(Default)]
pub struct Streams {
    kept: Mutex<VecDeque<(String, String, std::sync::Arc<crate::http::relay::Relay>)>>,
}

impl Streams {
    fn kept(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, String, std::sync::Arc<crate::http::relay::Relay>)>> {
        self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `owner`'s response `id`'s events; past [`MAX_KEPT_STREAMS`],
    /// the oldest that ended go (a running one stays: its reader needs it).
    pub fn keep(&self, id: &str, owner: &str, relay: std::sync::Arc<crate::http::relay::Relay>) {
        let mut kept = self.kept();
        while kept.len() >= MAX_KEPT_STREAMS {
            match kept.iter().position(|(_, _, relay)| relay.ended()) {
                Some(at) => {
                    kept.remove(at);
                }
                None => break,
            }
        }
        kept.push_back((id.to_string(), owner.to_string(), relay));
    }

    pub fn get(&self, id: &str, owner: &str) -> Option<std::sync::Arc<crate::http::relay::Relay>> {
        self.kept().iter().find(|(i, o, _)| i == id && o == owner).map(|(_, _, relay)| relay.clone())
    }

    pub fn forget(&self, id: &str, owner: &str) {
        self.kept().retain(|(i, o, _)| !(i == id && o == owner));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> (AbortHandle, futures_util::future::AbortRegistration) {
        AbortHandle::new_pair()
    }

    #[test]
    fn at_the_cap_all_run_and_one_past_it_stops_the_oldest() {
        let background = Background::new(2);
        let (first, _) = handle();
        let (second, _) = handle();
        let told = std::sync::Arc::new(Mutex::new(Vec::new()));
        let hook = |id: &'static str| -> Pushed {
            let told = told.clone();
            Box::new(move |why| told.lock().unwrap().push((id, why)))
        };
        assert_eq!(background.admit("a", "o", first.clone(), hook("a")), None);
        assert_eq!(background.admit("b", "o", second.clone(), hook("b")), None);
        assert_eq!(background.len(), 2);
        let (third, _) = handle();
        assert_eq!(background.admit("c", "o", third, hook("c")), Some("a".to_string()));
        assert!(first.is_aborted() && !second.is_aborted());
        let told = told.lock().unwrap();
        assert_eq!(told.len(), 1);
        assert_eq!(told[0].0, "a");
        assert!(told[0].1.contains("more than 2 turns were running with no client attached"), "{}", told[0].1);
        assert_eq!(background.len(), 2);
        // The pushed-out turn is no longer there to finish.
        assert!(!background.finish("a"));
        assert!(background.finish("b"));
    }

    #[test]
    fn kept_streams_at_and_past_the_limit_drop_the_oldest_that_ended() {
        let streams = Streams::default();
        let relays: Vec<_> = (0..MAX_KEPT_STREAMS).map(|_| crate::http::relay::Relay::new(0, None)).collect();
        for (n, relay) in relays.iter().enumerate() {
            streams.keep(&format!("resp_{n}"), "o", relay.clone());
        }
        assert_eq!(streams.len(), MAX_KEPT_STREAMS);
        // All running: one more is kept beside them.
        streams.keep("resp_more", "o", crate::http::relay::Relay::new(0, None));
        assert_eq!(streams.len(), MAX_KEPT_STREAMS + 1);
        relays[1].end();
        streams.keep("resp_last", "o", crate::http::relay::Relay::new(0, None));
        assert!(streams.get("resp_1", "o").is_none(), "the oldest that ended went");
        assert!(streams.get("resp_0", "o").is_some() && streams.get("resp_last", "o").is_some());
        assert!(streams.get("resp_last", "someone else").is_none());
        streams.forget("resp_last", "o");
        assert!(streams.get("resp_last", "o").is_none());
    }

    #[test]
    fn a_cancel_and_an_end_never_both_take_a_turn() {
        let background = Background::new(4);
        let (stop, _) = handle();
        background.admit("a", "owner", stop.clone(), Box::new(|_| {}));
        assert!(!background.cancel("someone else", "a"), "another owner's turn is not theirs to stop");
        assert!(!stop.is_aborted());
        assert!(background.cancel("owner", "a"));
        assert!(stop.is_aborted());
        assert!(!background.finish("a"), "the cancel took it");
        assert!(!background.cancel("owner", "a"));
    }
}
