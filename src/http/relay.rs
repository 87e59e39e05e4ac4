//! A turn's frames, kept for whoever attaches: the host runs the turn and
//! pushes each SSE frame here under the next id; any number of clients
//! (the page that started it, a reloaded page, a second tab) read them
//! from the frame after the id they last saw, then live until it ends.
//!
//! Ids rise across a conversation's turns: a turn's relay starts after the
//! last id of the one before, so a `Last-Event-ID` from an older turn
//! replays the whole of the current one.
//!
//! The relay counts its readers and tells its [`Watcher`] when the last
//! one leaves and when one comes back, which is how a Web UI turn learns
//! it runs with no client attached (see `webui_turns`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, Stream};

/// Told when a running turn loses its last reader and when it gains one.
pub trait Watcher: Send + Sync {
    fn alone(&self);
    fn joined(&self);
}

struct Frames {
    /// Each frame as the encoder made it (`data: …\n\n`), without its id.
    data: Vec<Bytes>,
    ended: bool,
    readers: usize,
}

pub struct Relay {
    /// The id before this turn's first frame.
    base: u64,
    frames: Mutex<Frames>,
    /// The number of frames pushed (and the end), for readers to wait on.
    changed: tokio::sync::watch::Sender<(usize, bool)>,
    watcher: Option<Box<dyn Watcher>>,
}

impl Relay {
    pub fn new(base: u64, watcher: Option<Box<dyn Watcher>>) -> Arc<Relay> {
        let (changed, _) = tokio::sync::watch::channel((0, false));
        Arc::new(Relay {
            base,
            frames: Mutex::new(Frames { data: Vec::new(), ended: false, readers: 0 }),
            changed,
            watcher,
        })
    }

    fn frames(&self) -> std::sync::MutexGuard<'_, Frames> {
        self.frames.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a frame; returns its id.
    pub fn push(&self, frame: Bytes) -> u64 {
        let (count, ended) = {
            let mut frames = self.frames();
            if frames.ended {
                return self.base + frames.data.len() as u64;
            }
            frames.data.push(frame);
            (frames.data.len(), frames.ended)
        };
        self.changed.send_replace((count, ended));
        self.base + count as u64
    }

    /// No frame follows; readers finish once they have read every frame.
    pub fn end(&self) {
        let count = {
            let mut frames = self.frames();
            frames.ended = true;
            frames.data.len()
        };
        self.changed.send_replace((count, true));
    }

    pub fn ended(&self) -> bool {
        self.frames().ended
    }

    /// The id of the last frame pushed (the base when none was).
    pub fn last_id(&self) -> u64 {
        self.base + self.frames().data.len() as u64
    }

    /// Whether anyone reads the frames now.
    #[cfg(test)]
    pub fn attached(&self) -> bool {
        self.frames().readers > 0
    }

    /// The watcher hears of a change under the frames' lock, so a reader
    /// leaving and another coming at once reach it in the order they did.
    fn attach(self: &Arc<Self>) -> Reader {
        let mut frames = self.frames();
        frames.readers += 1;
        if frames.readers == 1 && !frames.ended {
            if let Some(watcher) = &self.watcher {
                watcher.joined();
            }
        }
        drop(frames);
        Reader { relay: self.clone() }
    }

    /// The frames after id `after` (all of this turn's when `after` is
    /// older than its first), each with its `id:` line, then the live ones
    /// until the turn ends; a comment frame after `keep_alive` of silence.
    pub fn subscribe(
        self: &Arc<Self>,
        after: u64,
        keep_alive: Duration,
    ) -> impl Stream<Item = Result<Bytes, actix_web::Error>> + 'static {
        let reader = self.attach();
        let next = after.saturating_sub(self.base) as usize;
        let changes = self.changed.subscribe();
        stream::unfold((reader, next, changes), move |(reader, mut next, mut changes)| async move {
            loop {
                let (frame, ended) = {
                    let frames = reader.relay.frames();
                    (frames.data.get(next).cloned(), frames.ended)
                };
                if let Some(frame) = frame {
                    next += 1;
                    let id = reader.relay.base + next as u64;
                    let mut bytes = format!("id: {id}\n").into_bytes();
                    bytes.extend_from_slice(&frame);
                    return Some((Ok(Bytes::from(bytes)), (reader, next, changes)));
                }
                if ended {
                    return None;
                }
                match tokio::time::timeout(keep_alive, changes.changed()).await {
                    Ok(Ok(())) => {}
                    // The relay is gone: nothing more can come.
                    Ok(Err(_)) => return None,
                    Err(_) => return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), (reader, next, changes))),
                }
            }
        })
    }
}

/// One reader; its drop may leave the turn alone.
struct Reader {
    relay: Arc<Relay>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut frames = self.relay.frames();
        frames.readers -= 1;
        if frames.readers == 0 && !frames.ended {
            if let Some(watcher) = &self.relay.watcher {
                watcher.alone();
            }
        }
    }
}

/// The id after which a reader starts: `Last-Event-ID` (what a browser's
/// EventSource sends when it reconnects), else `?after=N`, else 0.
pub fn after(request: &actix_web::HttpRequest, query: Option<&str>) -> Result<u64, String> {
    let header = request.headers().get("last-event-id").map(|v| v.to_str().unwrap_or("").trim().to_string());
    let (name, given) = match (header, query) {
        (Some(value), _) => ("the Last-Event-ID header", value),
        (None, Some(value)) => ("'after'", value.to_string()),
        (None, None) => return Ok(0),
    };
    given.parse::<u64>().map_err(|_| format!("{name} must be a frame id (a whole number), got '{given}'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use std::sync::atomic::{AtomicIsize, Ordering};

    fn frame(n: u32) -> Bytes {
        Bytes::from(format!("data: {n}\n\n"))
    }

    async fn read_all(relay: &Arc<Relay>, after: u64) -> Vec<String> {
        let frames: Vec<_> = relay.subscribe(after, Duration::from_secs(60)).collect().await;
        frames.into_iter().map(|f| String::from_utf8(f.unwrap().to_vec()).unwrap()).collect()
    }

    #[tokio::test]
    async fn readers_start_after_the_id_they_give_and_ids_follow_the_base() {
        let relay = Relay::new(10, None);
        assert_eq!(relay.push(frame(1)), 11);
        assert_eq!(relay.push(frame(2)), 12);
        relay.end();
        assert_eq!(relay.push(frame(3)), 12, "nothing is added after the end");
        assert_eq!(read_all(&relay, 0).await, ["id: 11\ndata: 1\n\n", "id: 12\ndata: 2\n\n"]);
        assert_eq!(read_all(&relay, 11).await, ["id: 12\ndata: 2\n\n"]);
        assert!(read_all(&relay, 12).await.is_empty());
        assert!(read_all(&relay, 99).await.is_empty());
    }

    #[tokio::test]
    async fn a_live_reader_sees_frames_pushed_after_it_attached_and_keep_alives_between() {
        let relay = Relay::new(0, None);
        let mut reader = Box::pin(relay.subscribe(0, Duration::from_millis(20)));
        let pusher = relay.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(60)).await;
            pusher.push(frame(1));
            pusher.end();
        });
        let mut seen = Vec::new();
        while let Some(bytes) = reader.next().await {
            seen.push(String::from_utf8(bytes.unwrap().to_vec()).unwrap());
        }
        assert!(seen.iter().any(|f| f.starts_with(": keep-alive")), "{seen:?}");
        assert_eq!(seen.last().map(String::as_str), Some("id: 1\ndata: 1\n\n"));
    }

    #[derive(Default)]
    struct Count(AtomicIsize, AtomicIsize);
    impl Watcher for Arc<Count> {
        fn alone(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn joined(&self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn the_watcher_hears_the_last_reader_leave_and_the_first_come_back() {
        let count = Arc::new(Count::default());
        let relay = Relay::new(0, Some(Box::new(count.clone())));
        let first = relay.subscribe(0, Duration::from_secs(1));
        let second = relay.subscribe(0, Duration::from_secs(1));
        assert_eq!(count.1.load(Ordering::SeqCst), 1);
        drop(first);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "one reader is still there");
        drop(second);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(!relay.attached());
        let back = relay.subscribe(0, Duration::from_secs(1));
        assert_eq!(count.1.load(Ordering::SeqCst), 2);
        relay.end();
        drop(back);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "an ended turn is not left alone");
    }
}
