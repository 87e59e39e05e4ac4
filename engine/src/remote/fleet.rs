//! The upstream servers as one pool: their health, what each is running,
//! and which one a request goes to.
//!
//! Routing is rendezvous hashing over a conversation's key: every replica
//! of skillhost computes the same home upstream for a conversation without
//! sharing any state, an upstream that goes down moves only its own
//! conversations, and weights skew the share each one gets. A request goes
//! to the first upstream in its key's order that is up, not backing off and
//! below its concurrency limit; a request without a key goes to the least
//! loaded one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::chat::{ChatMessage, Role};
use crate::error::EngineError;
pub use crate::protocol::UpstreamStats;

use super::wire::Dialect;
use super::{Routing, UpstreamConfig, UpstreamMode};

/// The longest a request waits for upstreams that asked for a pause
/// (`429`/`503` with `Retry-After`) before it fails with a 503 itself.
pub const BACKPRESSURE_WAIT: Duration = Duration::from_secs(30);
/// The pause assumed when a `429`/`503` names none.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest pause an upstream's `Retry-After` is honoured for; a larger
/// value is capped, so one bad header cannot take an upstream out for hours.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// How often a request waiting for a free upstream looks at its client.
const WAIT_TICK: Duration = Duration::from_millis(500);

/// One upstream server and what is known about it.
pub(crate) struct Upstream {
    pub config: UpstreamConfig,
    /// How to talk to it; learned by the first probe that reaches it.
    pub dialect: OnceLock<Dialect>,
    /// It adds BOS to a prompt itself (llama-server does, whatever the
    /// prompt begins with), so a rendered BOS must be left off.
    pub adds_bos: OnceLock<bool>,
    pub stats: Arc<UpstreamStats>,
    /// It asked for a pause until then.
    paused_until: Mutex<Option<Instant>>,
    /// Rendezvous seed: a hash of its URL, stable across replicas.
    seed: u64,
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Self {
        let stats = Arc::new(UpstreamStats { url: config.url.clone(), ..UpstreamStats::default() });
        let seed = fnv1a(config.url.as_bytes(), FNV_OFFSET);
        Upstream {
            config,
            dialect: OnceLock::new(),
            adds_bos: OnceLock::new(),
            stats,
            paused_until: Mutex::new(None),
            seed,
        }
    }

    pub fn is_up(&self) -> bool {
        self.stats.up.load(Ordering::Relaxed)
    }

    fn paused_until(&self) -> Option<Instant> {
        *self.paused_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn has_room(&self) -> bool {
        let limit = self.config.max_concurrent.map_or(usize::MAX, |n| n as usize);
        self.stats.in_flight.load(Ordering::Relaxed) < limit
    }

    fn load(&self) -> f64 {
        self.stats.in_flight.load(Ordering::Relaxed) as f64 / f64::from(self.config.weight.max(1))
    }

    pub fn mode(&self) -> UpstreamMode {
        self.config.mode
    }
}

/// Every upstream, plus the lock and signal that hand out their capacity.
pub(crate) struct Fleet {
    pub upstreams: Vec<Upstream>,
    routing: Routing,
    /// The next upstream in round-robin order.
    turn: AtomicUsize,
    room: Mutex<()>,
    freed: Condvar,
}

/// What one request has been through on its way to an upstream.
pub(crate) struct Tried {
    /// Upstreams it failed on; it goes to each at most once.
    pub failed: Vec<usize>,
    /// How long it may wait, in all, for upstreams that asked for a pause:
    /// one that answers `429` every time cannot keep it forever.
    pub pauses_until: Instant,
}

impl Tried {
    pub fn new() -> Self {
        Tried { failed: Vec::new(), pauses_until: Instant::now() + BACKPRESSURE_WAIT }
    }
}

/// A request's hold on one upstream; dropping it frees the place.
pub(crate) struct Lease {
    fleet: Arc<Fleet>,
    pub index: usize,
}

impl Lease {
    pub fn upstream(&self) -> &Upstream {
        &self.fleet.upstreams[self.index]
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.upstream().stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.fleet.wake();
    }
}

impl Fleet {
    pub fn new(upstreams: Vec<UpstreamConfig>, routing: Routing) -> Self {
        Fleet {
            upstreams: upstreams.into_iter().map(Upstream::new).collect(),
            routing,
            turn: AtomicUsize::new(0),
            room: Mutex::new(()),
            freed: Condvar::new(),
        }
    }

    /// Wakes requests waiting for an upstream (one finished, came up or
    /// ended its pause).
    pub fn wake(&self) {
        let _guard = self.room.lock().unwrap_or_else(|e| e.into_inner());
        self.freed.notify_all();
    }

    pub fn set_up(&self, index: usize, up: bool, why: &str) {
        let upstream = &self.upstreams[index];
        if upstream.stats.up.swap(up, Ordering::Relaxed) != up {
            if up {
                tracing::info!(upstream = %upstream.config.url, "upstream is up");
                self.wake();
            } else {
                tracing::warn!(upstream = %upstream.config.url, reason = why, "upstream is down");
            }
        }
    }

    /// The upstream asked for a pause (`Retry-After`).
    pub fn pause(&self, index: usize, pause: Duration) {
        let upstream = &self.upstreams[index];
        upstream.stats.backpressure.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + pause.min(MAX_RETRY_AFTER);
        *upstream.paused_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
        tracing::info!(upstream = %upstream.config.url, seconds = pause.as_secs_f64(), "upstream asked for a pause");
    }

    /// Takes a place on an upstream for a request: the first of its key's
    /// order that can take it, or the least loaded without a key. Waits
    /// while every usable upstream is full, and for pauses until the
    /// request's [`Tried::pauses_until`]; `gone` says the client left.
    pub fn acquire(
        self: &Arc<Self>,
        key: Option<u64>,
        tried: &Tried,
        gone: &dyn Fn() -> bool,
    ) -> Result<Lease, EngineError> {
        let failed = tried.failed.as_slice();
        let give_up_pauses = tried.pauses_until;
        let n = self.upstreams.len();
        let (order, home) = match self.routing {
            Routing::Affinity => {
                let order = key.map(|key| rendezvous_order(key, &self.upstreams));
                let home = order.as_ref().and_then(|o| o.first().copied());
                (order, home)
            }
            Routing::RoundRobin => {
                let first = self.turn.fetch_add(1, Ordering::Relaxed) % n.max(1);
                (Some((0..n).map(|i| (first + i) % n).collect()), None)
            }
        };
        let mut guard = self.room.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if gone() {
                return Err(EngineError::Stopped);
            }
            let now = Instant::now();
            let usable = |i: &usize| {
                let upstream = &self.upstreams[*i];
                upstream.is_up() && !failed.contains(i) && upstream.paused_until().is_none_or(|t| t <= now)
            };
            let chosen = match &order {
                Some(order) => order.iter().copied().filter(usable).find(|&i| self.upstreams[i].has_room()),
                None => (0..self.upstreams.len())
                    .filter(usable)
                    .filter(|&i| self.upstreams[i].has_room())
                    .min_by(|&a, &b| self.upstreams[a].load().total_cmp(&self.upstreams[b].load())),
            };
            if let Some(index) = chosen {
                let upstream = &self.upstreams[index];
                upstream.stats.in_flight.fetch_add(1, Ordering::Relaxed);
                upstream.stats.requests.fetch_add(1, Ordering::Relaxed);
                if let Some(home) = home {
                    if home == index {
                        upstream.stats.affinity_hits.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.upstreams[home].stats.affinity_misses.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return Ok(Lease { fleet: Arc::clone(self), index });
            }
            let any_usable = (0..self.upstreams.len()).any(|i| usable(&i));
            let wait = if any_usable {
                // All full: a place frees when a request ends.
                WAIT_TICK
            } else {
                let next_pause_end = (0..self.upstreams.len())
                    .filter(|i| self.upstreams[*i].is_up() && !failed.contains(i))
                    .filter_map(|i| self.upstreams[i].paused_until())
                    .min();
                match next_pause_end {
                    Some(end) if end <= give_up_pauses => end.saturating_duration_since(now).min(WAIT_TICK),
                    Some(_) => return Err(EngineError::Upstream(self.unavailable("every upstream asked for a pause"))),
                    None => return Err(EngineError::Upstream(self.unavailable("no upstream can take the request"))),
                }
            };
            guard = self.freed.wait_timeout(guard, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// A sentence naming each upstream's state.
    fn unavailable(&self, lead: &str) -> String {
        let states: Vec<String> = self
            .upstreams
            .iter()
            .map(|u| {
                let state = if !u.is_up() {
                    "down"
                } else if u.paused_until().is_some_and(|t| t > Instant::now()) {
                    "paused"
                } else {
                    "failed this request"
                };
                format!("{} ({state})", u.config.url)
            })
            .collect();
        format!("{lead}: {}", states.join(", "))
    }
}

/// The upstreams in a key's rendezvous order, best first: the weighted
/// highest-random-weight score `weight / -ln(u)`, with `u` in (0, 1] drawn
/// from a hash of the key and the upstream's URL.
pub(crate) fn rendezvous_order(key: u64, upstreams: &[Upstream]) -> Vec<usize> {
    let weighted: Vec<(u64, u32)> = upstreams.iter().map(|u| (u.seed, u.config.weight)).collect();
    rank(key, &weighted)
}

fn rank(key: u64, upstreams: &[(u64, u32)]) -> Vec<usize> {
    let score = |(seed, weight): (u64, u32)| {
        let draw = ((splitmix64(key ^ seed) >> 11) + 1) as f64 / (1u64 << 53) as f64;
        f64::from(weight.max(1)) / -draw.ln().min(-f64::MIN_POSITIVE)
    };
    let mut order: Vec<usize> = (0..upstreams.len()).collect();
    order.sort_by(|&a, &b| score(upstreams[b]).total_cmp(&score(upstreams[a])));
    order
}

/// A conversation's key: a hash of its messages up to and including the
/// first user message (its system prompt and opening question), which
/// every later turn and round of it repeats. `None` without a user message.
pub fn affinity_key(messages: &[ChatMessage]) -> Option<u64> {
    let first_user = messages.iter().position(|m| m.role == Role::User)?;
    let mut hash = FNV_OFFSET;
    for message in &messages[..=first_user] {
        hash = fnv1a(message.role.template_name().as_bytes(), hash);
        hash = fnv1a(&[0], hash);
        hash = fnv1a(message.content.as_bytes(), hash);
        hash = fnv1a(&[0], hash);
    }
    Some(hash)
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a: a fixed hash, the same in every build and replica (std's
/// hasher makes no such promise).
fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// A full-avalanche mix, so keys that differ in a bit land far apart.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str, weight: u32, max_concurrent: Option<u32>) -> UpstreamConfig {
        UpstreamConfig { url: url.into(), weight, max_concurrent, ..UpstreamConfig::default() }
    }

    fn fleet(configs: Vec<UpstreamConfig>) -> Arc<Fleet> {
        let fleet = Arc::new(Fleet::new(configs, Routing::Affinity));
        for i in 0..fleet.upstreams.len() {
            fleet.set_up(i, true, "");
        }
        fleet
    }

    #[test]
    fn keys_spread_by_weight_and_move_only_from_a_removed_upstream() {
        let three = [(1, 1), (2, 1), (3, 2)];
        let mut share = [0usize; 3];
        let homes: Vec<usize> = (0..20_000u64).map(|key| rank(key, &three)[0]).collect();
        for &home in &homes {
            share[home] += 1;
        }
        // Weight 2 takes about half; 1 and 1 about a quarter each.
        assert!((9_000..11_000).contains(&share[2]), "{share:?}");
        assert!((4_000..6_000).contains(&share[0]), "{share:?}");
        // Without upstream 1, only its keys move.
        let two = [(1, 1), (3, 2)];
        for (key, &home) in homes.iter().enumerate() {
            let moved = rank(key as u64, &two)[0];
            let expected = match home {
                0 => 0,
                2 => 1,
                _ => moved,
            };
            assert_eq!(moved, expected, "key {key} moved although its home stayed");
        }
    }

    #[test]
    fn a_conversation_keeps_its_upstream_and_moves_when_it_is_down() {
        let fleet = fleet(vec![config("http://a", 1, None), config("http://b", 1, None)]);
        let never = || false;
        let first = fleet.acquire(Some(7), &Tried::new(), &never).map(|l| l.index);
        let again = fleet.acquire(Some(7), &Tried::new(), &never).map(|l| l.index);
        assert_eq!(first, again);
        let home = first.unwrap_or_default();
        fleet.set_up(home, false, "test");
        let moved = fleet.acquire(Some(7), &Tried::new(), &never).map(|l| l.index);
        assert_eq!(moved, Ok(1 - home));
        assert_eq!(fleet.upstreams[home].stats.affinity_misses.load(Ordering::Relaxed), 1);
        assert_eq!(fleet.upstreams[home].stats.affinity_hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_full_upstream_sends_the_next_request_to_the_other_and_frees_on_drop() {
        let fleet = fleet(vec![config("http://a", 1, Some(1)), config("http://b", 1, Some(1))]);
        let never = || false;
        let a = fleet.acquire(None, &Tried::new(), &never);
        let b = fleet.acquire(None, &Tried::new(), &never);
        let (Ok(a), Ok(b)) = (a, b) else { panic!("two places were free") };
        assert_ne!(a.index, b.index);
        let freed = a.index;
        drop(a);
        assert_eq!(fleet.acquire(None, &Tried::new(), &never).map(|l| l.index), Ok(freed));
    }

    #[test]
    fn round_robin_takes_turns_whatever_the_key() {
        let fleet =
            Arc::new(Fleet::new(vec![config("http://a", 1, None), config("http://b", 1, None)], Routing::RoundRobin));
        for i in 0..2 {
            fleet.set_up(i, true, "");
        }
        let picks: Vec<usize> =
            (0..4).filter_map(|_| fleet.acquire(Some(7), &Tried::new(), &|| false).ok().map(|l| l.index)).collect();
        assert_eq!(picks, vec![0, 1, 0, 1]);
    }

    #[test]
    fn nothing_up_fails_at_once_naming_each_upstream() {
        let fleet = Arc::new(Fleet::new(vec![config("http://a", 1, None)], Routing::Affinity));
        let err = fleet.acquire(Some(1), &Tried::new(), &|| false).map(|l| l.index);
        assert_eq!(err, Err(EngineError::Upstream("no upstream can take the request: http://a (down)".into())));
    }

    #[test]
    fn a_pause_past_the_wait_fails_and_a_short_one_is_waited_out() {
        let fleet = fleet(vec![config("http://a", 1, None)]);
        fleet.pause(0, BACKPRESSURE_WAIT + Duration::from_secs(5));
        let err = fleet.acquire(None, &Tried::new(), &|| false).map(|l| l.index);
        assert!(matches!(err, Err(EngineError::Upstream(ref m)) if m.contains("http://a (paused)")), "{err:?}");
        fleet.pause(0, Duration::from_millis(50));
        assert_eq!(fleet.acquire(None, &Tried::new(), &|| false).map(|l| l.index), Ok(0));
        // The wait for pauses is the request's, across its attempts.
        let spent = Tried { failed: Vec::new(), pauses_until: Instant::now() };
        fleet.pause(0, Duration::from_millis(50));
        let err = fleet.acquire(None, &spent, &|| false).map(|l| l.index);
        assert!(
            matches!(err, Err(EngineError::Upstream(ref m)) if m.starts_with("every upstream asked for a pause")),
            "{err:?}"
        );
    }

    #[test]
    fn a_pause_is_honoured_up_to_its_cap_and_capped_past_it() {
        let fleet = fleet(vec![config("http://a", 1, None)]);
        let until = |fleet: &Fleet| fleet.upstreams[0].paused_until().unwrap_or_else(Instant::now);
        let before = Instant::now();
        fleet.pause(0, MAX_RETRY_AFTER);
        assert!(until(&fleet) >= before + MAX_RETRY_AFTER, "a pause at the cap is taken whole");
        let before = Instant::now();
        fleet.pause(0, MAX_RETRY_AFTER + Duration::from_secs(1));
        let after = Instant::now();
        let paused = until(&fleet);
        assert!(paused >= before + MAX_RETRY_AFTER && paused <= after + MAX_RETRY_AFTER, "one past the cap is capped");
        assert_eq!(fleet.upstreams[0].stats.backpressure.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn the_key_covers_the_opening_and_nothing_after_it() {
        let system = ChatMessage::new(Role::System, "s");
        let user = ChatMessage::new(Role::User, "q");
        let later = ChatMessage::new(Role::Assistant, "a");
        let one = affinity_key(&[system.clone(), user.clone()]);
        assert_eq!(one, affinity_key(&[system.clone(), user.clone(), later]));
        assert_ne!(one, affinity_key(&[system, ChatMessage::new(Role::User, "other")]));
        assert_eq!(affinity_key(&[ChatMessage::new(Role::System, "s")]), None);
    }
}
