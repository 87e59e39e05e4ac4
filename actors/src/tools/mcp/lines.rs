//! A stdio server's output, read with a cap on one message (one line).
//!
//! The SDK's own reader drops a line past its cap and waits for the next,
//! so the call that line answered would hang until its timeout. Here the
//! stream ends instead: every pending call fails at once with a reason, and
//! the server is restarted on its next use. No line is ever held whole
//! past the cap.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// Bytes of one message a server may send: a tool result with a large
/// image, or a long listing, fits; a runaway one ends the connection.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// Wraps a server's stdout; `tripped` is set when a line passed the cap.
pub struct CappedLines<R> {
    inner: R,
    /// Bytes since the last newline.
    line: usize,
    cap: usize,
    tripped: Arc<AtomicBool>,
}

impl<R> CappedLines<R> {
    pub fn new(inner: R, cap: usize, tripped: Arc<AtomicBool>) -> Self {
        CappedLines { inner, line: 0, cap, tripped }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CappedLines<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        let read = &buf.filled()[before..];
        this.line = match read.iter().rposition(|b| *b == b'\n') {
            Some(end) => read.len() - end - 1,
            None => this.line + read.len(),
        };
        if this.line > this.cap {
            this.tripped.store(true, Ordering::Relaxed);
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a message longer than {} bytes", this.cap),
            )));
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn read_all(input: Vec<u8>, cap: usize) -> (std::io::Result<usize>, bool) {
        let tripped = Arc::new(AtomicBool::new(false));
        let mut reader = CappedLines::new(input.as_slice(), cap, Arc::clone(&tripped));
        let mut out = Vec::new();
        let result = reader.read_to_end(&mut out).await;
        (result, tripped.load(Ordering::Relaxed))
    }

    #[tokio::test]
    async fn a_line_at_the_cap_passes_and_one_past_ends_the_stream() {
        let cap = 16;
        let mut at = vec![b'a'; cap];
        at.push(b'\n');
        at.extend(vec![b'b'; cap]);
        let (result, tripped) = read_all(at, cap).await;
        assert_eq!((result.unwrap(), tripped), (2 * cap + 1, false));
        let (result, tripped) = read_all(vec![b'a'; cap + 1], cap).await;
        assert!(result.is_err() && tripped);
    }
}
