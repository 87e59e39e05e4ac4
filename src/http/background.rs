//! Turns that run with no client attached: Responses API requests with
//! `background: true`. Each is registered here while it runs, with the
//! handle that stops it. At most `cap` run at once (`--max-detached-turns`,
//! `--parallel` by default); one past it stops the oldest, so a client
//! starting background turns in a loop cannot hold the model forever.
//!
//! Whoever takes a turn out of the registry writes its last status: the
//! turn itself when it ends, or the route that cancels it. A turn taken by
//! both cannot happen, so a finished turn is never reported cancelled and
//! a cancelled one never completed.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures_util::future::AbortHandle;

struct Running {
    id: String,
    owner: String,
    stop: AbortHandle,
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

    /// Registers a turn that is about to run; returns the id of the oldest
    /// turn it pushed out (already stopped), whose status the caller writes.
    pub fn admit(&self, id: &str, owner: &str, stop: AbortHandle) -> Option<String> {
        let mut running = self.running();
        let pushed = if running.len() >= self.cap { running.pop_front() } else { None };
        running.push_back(Running { id: id.to_string(), owner: owner.to_string(), stop });
        pushed.map(|oldest| {
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

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
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
        assert_eq!(background.admit("a", "o", first.clone()), None);
        assert_eq!(background.admit("b", "o", second.clone()), None);
        assert_eq!(background.len(), 2);
        let (third, _) = handle();
        assert_eq!(background.admit("c", "o", third), Some("a".to_string()));
        assert!(first.is_aborted() && !second.is_aborted());
        assert_eq!(background.len(), 2);
        // The pushed-out turn is no longer there to finish.
        assert!(!background.finish("a"));
        assert!(background.finish("b"));
    }

    #[test]
    fn a_cancel_and_an_end_never_both_take_a_turn() {
        let background = Background::new(4);
        let (stop, _) = handle();
        background.admit("a", "owner", stop.clone());
        assert!(!background.cancel("someone else", "a"), "another owner's turn is not theirs to stop");
        assert!(!stop.is_aborted());
        assert!(background.cancel("owner", "a"));
        assert!(stop.is_aborted());
        assert!(!background.finish("a"), "the cancel took it");
        assert!(!background.cancel("owner", "a"));
    }
}
