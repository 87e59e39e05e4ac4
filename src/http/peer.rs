//! Noticing a client that went away while nothing is being written to it.
//!
//! actix-web only learns that a peer closed its connection when it writes to
//! it, so a non-streaming request (or a stream still prefilling its prompt)
//! would run to the end for nobody. Each connection keeps a duplicate of its
//! socket; a handler peeks at it to see whether the peer has closed, as
//! llama-server does.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::Extensions;
use actix_web::HttpRequest;
use skillhost_actors::{ChatEvent, ChatStream};

/// How often a waiting handler checks whether its client is still there.
pub const PEER_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// A duplicate of the connection's socket, owned, so its descriptor can never
/// be reused by another connection while a handler holds it.
#[derive(Clone)]
pub struct PeerSocket(Arc<TcpStream>);

impl PeerSocket {
    /// True once the peer has closed its side of the connection.
    pub fn is_closed(&self) -> bool {
        let mut byte = [0u8; 1];
        // The socket is non-blocking (tokio made it so, and a duplicate shares
        // that flag): no data and no EOF is `WouldBlock`. EOF is a close; an
        // error such as a reset is one too.
        match self.0.peek(&mut byte) {
            Ok(n) => n == 0,
            Err(err) => !matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted),
        }
    }
}

/// `HttpServer::on_connect` hook: remembers each TCP connection's socket.
pub fn on_connect(connection: &dyn std::any::Any, extensions: &mut Extensions) {
    use std::os::fd::AsFd;
    let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() else {
        return;
    };
    match stream.as_fd().try_clone_to_owned() {
        Ok(fd) => {
            extensions.insert(PeerSocket(Arc::new(TcpStream::from(fd))));
        }
        Err(err) => tracing::warn!(error = %err, "cannot watch a connection for disconnects"),
    }
}

/// Watches one request's client while its events are awaited.
pub struct PeerWatch {
    socket: Option<PeerSocket>,
    last_check: Instant,
}

impl PeerWatch {
    pub fn new(request: &HttpRequest) -> Self {
        PeerWatch { socket: request.conn_data::<PeerSocket>().cloned(), last_check: Instant::now() }
    }

    /// A watch that never sees a client leave: for a turn that runs on
    /// with none attached (a background response).
    pub fn detached() -> Self {
        PeerWatch { socket: None, last_check: Instant::now() }
    }

    /// True when the client is known to have closed the connection.
    pub fn is_closed(&self) -> bool {
        self.socket.as_ref().is_some_and(PeerSocket::is_closed)
    }

    /// The next event of a request, or `None` when its events ended or its
    /// client disconnected (dropping the stream then cancels the request).
    pub async fn next_event(&mut self, chat: &mut ChatStream) -> Option<ChatEvent> {
        let Some(socket) = self.socket.clone() else {
            return chat.events.recv().await;
        };
        loop {
            // Checked by elapsed time too, since a steady flow of events would
            // otherwise keep restarting the timer below.
            if self.last_check.elapsed() >= PEER_CHECK_INTERVAL {
                self.last_check = Instant::now();
                if socket.is_closed() {
                    return None;
                }
            }
            let wait = PEER_CHECK_INTERVAL.saturating_sub(self.last_check.elapsed());
            tokio::select! {
                event = chat.events.recv() => return event,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}
