//! The install proxy: the one way out of the network namespace the host's
//! package installer runs in, which forwards only to the hosts the operator
//! named (`--code-exec-install-domains`) and refuses the rest with a 403.
//!
//! It bounds what the installer the host starts (pip, npm: host-chosen
//! programs with an argument vector the host built, no package scripts)
//! can fetch. It is not a boundary for model-written code: on Linux the
//! sandbox's network is all or nothing, so this is only offered to the
//! installer, never to a command.
//!
//! There is no port on the host's network. Each install gets a namespace of
//! its own holding only a loopback interface, and the sandbox helper hands
//! the server a listening socket made in it ([`Egress::serve`]): only that
//! install can connect, so the listener itself is the install's credential,
//! and it is dropped when the install ends. Each listener serves at most
//! [`MAX_CONNECTIONS`] connections at once (the rest wait in its backlog),
//! and a relay that carries nothing for [`IDLE_TIMEOUT`] is closed.
//!
//! Both proxy forms are served: `CONNECT host:port` (https, then bytes are
//! relayed as they are) and an absolute-form request (`GET http://host/…`,
//! plain http), which is rewritten to origin form and sent with
//! `Connection: close`, so one connection never carries a request to a
//! second host.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head the proxy reads before refusing it.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client has to send its request head, and the proxy to reach
/// the host it names.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one install's listener serves at once; more wait their turn.
pub const MAX_CONNECTIONS: usize = 16;
/// A relay with no byte in either direction for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub use skillhost_sandbox::private_net::NAMESPACE_PORT;

/// The proxy's policy and counters; cheap to clone.
#[derive(Debug, Clone)]
pub struct Egress {
    domains: Arc<Vec<String>>,
    stats: Arc<EgressStats>,
    idle: Duration,
}

/// What it forwarded and refused, for tests and the log.
#[derive(Debug, Default)]
pub struct EgressStats {
    pub forwarded: std::sync::atomic::AtomicU64,
    pub refused: std::sync::atomic::AtomicU64,
    /// Connections accepted, over every listener.
    pub accepted: std::sync::atomic::AtomicU64,
}

/// Serving one listener; dropping it stops the listener and every relay
/// it started.
#[derive(Debug)]
pub struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Egress {
    /// A proxy that forwards to `domains` (compared without case).
    pub fn new(domains: Vec<String>) -> Egress {
        let domains = domains.into_iter().map(|d| d.to_ascii_lowercase()).collect();
        Egress { domains: Arc::new(domains), stats: Arc::default(), idle: IDLE_TIMEOUT }
    }

    /// The same proxy closing idle relays after `idle` (tests).
    pub fn with_idle(self, idle: Duration) -> Egress {
        Egress { idle, ..self }
    }

    /// `http://127.0.0.1:PORT` as the installer names its proxy, inside its
    /// own namespace.
    pub fn namespace_url() -> String {
        format!("http://127.0.0.1:{NAMESPACE_PORT}")
    }

    /// Serves `listener` (a socket the sandbox helper made in an install's
    /// namespace) until the returned handle is dropped.
    pub fn serve(&self, listener: std::net::TcpListener) -> std::io::Result<Serving> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let egress = self.clone();
        Ok(Serving(tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
            // Aborting this task drops the set, which aborts every relay.
            let mut relays = tokio::task::JoinSet::new();
            loop {
                // A slot first: past the cap, connections wait in the backlog.
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
                let client = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => return,
                    },
                    // Reap finished relays while waiting.
                    Some(_) = relays.join_next(), if !relays.is_empty() => continue,
                };
                egress.stats.accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let egress = egress.clone();
                relays.spawn(async move {
                    let _ = serve(client, &egress).await;
                    drop(slot);
                });
            }
        })))
    }

    pub fn stats(&self) -> &EgressStats {
        &self.stats
    }

    pub fn domains(&self) -> &[String] {
        &self.domains
    }
}

/// Whether `host` is one of `domains`: the same name, compared without case.
/// Sub-domains are not included; the operator lists each host.
pub fn allowed(host: &str, domains: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    domains.iter().any(|d| d == host)
}

/// Host and port of `host:port`, `[v6]:port` or a bare host (`default` port).
fn split_authority(authority: &str, default: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => default,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
        None => Some((authority.to_string(), default)),
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// `CONNECT host:port`.
    Tunnel { host: String, port: u16 },
    /// An absolute-form request, with the head rewritten to origin form.
    Forward { host: String, port: u16, head: Vec<u8> },
}

/// Reads the request line and headers of `head` (which ends in CRLF CRLF).
fn parse_head(head: &[u8]) -> Result<Target, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not text")?;
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if v.starts_with("HTTP/1.") => (m, t, v),
        _ => return Err("the request line is not HTTP/1.x"),
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, 443).ok_or("CONNECT names no host:port")?;
        return Ok(Target::Tunnel { host, port });
    }
    let rest = target.strip_prefix("http://").ok_or("only http:// targets and CONNECT are proxied")?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err("credentials in a proxied URL are refused");
    }
    let (host, port) = split_authority(authority, 80).ok_or("the URL names no host")?;
    let mut rewritten = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        // Hop-by-hop headers are the proxy's; the connection closes after
        // one exchange, so it cannot be reused for another host.
        if ["connection", "proxy-connection", "proxy-authorization", "keep-alive"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        rewritten.push_str(line);
        rewritten.push_str("\r\n");
    }
    rewritten.push_str("Connection: close\r\n\r\n");
    Ok(Target::Forward { host, port, head: rewritten.into_bytes() })
}

async fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), &'static str> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let end = buffer.windows(4).position(|w| w == b"\r\n\r\n");
        if end.map_or(buffer.len(), |end| end + 4) > MAX_HEAD_BYTES {
            return Err("the request head is too long");
        }
        if let Some(end) = end {
            let rest = buffer.split_off(end + 4);
            return Ok((buffer, rest));
        }
        if buffer.len() > MAX_HEAD_BYTES {
            return Err("the request head is too long");
        }
        let n = client.read(&mut chunk).await.map_err(|_| "the client went away")?;
        if n == 0 {
            return Err("the client went away");
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

async fn answer(client: &mut TcpStream, status: &str, why: &str) {
    let body = format!("{why}\n");
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(text.as_bytes()).await;
}

async fn serve(mut client: TcpStream, egress: &Egress) -> std::io::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let (domains, stats) = (egress.domains.as_slice(), &egress.stats);
    let (head, early) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(read)) => read,
        Ok(Err(why)) => {
            answer(&mut client, "400 Bad Request", why).await;
            return Ok(());
        }
        Err(_) => return Ok(()),
    };
    let target = match parse_head(&head) {
        Ok(target) => target,
        Err(why) => {
            answer(&mut client, "400 Bad Request", why).await;
            return Ok(());
        }
    };
    let (host, port) = match &target {
        Target::Tunnel { host, port } | Target::Forward { host, port, .. } => (host.clone(), *port),
    };
    if !allowed(&host, domains) {
        stats.refused.fetch_add(1, Relaxed);
        tracing::warn!(host, "the install proxy refused a host outside --code-exec-install-domains");
        let why = format!("{host} is not one of this server's install hosts (--code-exec-install-domains)");
        answer(&mut client, "403 Forbidden", &why).await;
        return Ok(());
    }
    let mut upstream = match tokio::time::timeout(HEAD_TIMEOUT, TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(stream)) => stream,
        _ => {
            answer(&mut client, "502 Bad Gateway", &format!("cannot reach {host}:{port}")).await;
            return Ok(());
        }
    };
    stats.forwarded.fetch_add(1, Relaxed);
    match target {
        Target::Tunnel { .. } => client.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await?,
        Target::Forward { head, .. } => upstream.write_all(&head).await?,
    }
    upstream.write_all(&early).await?;
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    relay_until_idle((client_read, client_write), (upstream_read, upstream_write), egress.idle).await;
    Ok(())
}

/// Copies both ways until both sides have ended (one side's end is passed
/// on as a half-close) or nothing moves for `idle`.
async fn relay_until_idle(
    (mut a_read, mut a_write): (impl AsyncRead + Unpin, impl AsyncWrite + Unpin),
    (mut b_read, mut b_write): (impl AsyncRead + Unpin, impl AsyncWrite + Unpin),
    idle: Duration,
) {
    let (mut a_buffer, mut b_buffer) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        let step = tokio::time::timeout(idle, async {
            tokio::select! {
                n = a_read.read(&mut a_buffer), if a_open => match n {
                    Ok(0) => {
                        a_open = false;
                        b_write.shutdown().await.is_ok()
                    }
                    Ok(n) => b_write.write_all(&a_buffer[..n]).await.is_ok(),
                    Err(_) => false,
                },
                n = b_read.read(&mut b_buffer), if b_open => match n {
                    Ok(0) => {
                        b_open = false;
                        a_write.shutdown().await.is_ok()
                    }
                    Ok(n) => a_write.write_all(&b_buffer[..n]).await.is_ok(),
                    Err(_) => false,
                },
            }
        })
        .await;
        if step != Ok(true) {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_hosts_pass() {
        let domains = vec!["pypi.org".to_string(), "127.0.0.1".to_string()];
        assert!(allowed("pypi.org", &domains));
        assert!(allowed("PyPI.org.", &domains));
        assert!(allowed("127.0.0.1", &domains));
        assert!(!allowed("evil.pypi.org", &domains), "sub-domains are not implied");
        assert!(!allowed("pypi.org.evil.com", &domains));
        assert!(!allowed("169.254.169.254", &domains));
    }

    #[test]
    fn heads_are_read_and_rewritten() {
        assert_eq!(
            parse_head(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").unwrap(),
            Target::Tunnel { host: "pypi.org".into(), port: 443 }
        );
        let Target::Forward { host, port, head } = parse_head(
            b"GET http://127.0.0.1:8080/simple/x/ HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap() else {
            panic!("a forward")
        };
        assert_eq!((host.as_str(), port), ("127.0.0.1", 8080));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /simple/x/ HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: close\r\n\r\n"
        );
        for (head, why) in [
            (&b"GET /local HTTP/1.1\r\n\r\n"[..], "only http:// targets"),
            (b"GET ftp://x/ HTTP/1.1\r\n\r\n", "only http:// targets"),
            (b"GET http://u:p@host/ HTTP/1.1\r\n\r\n", "credentials"),
            (b"NONSENSE\r\n\r\n", "not HTTP/1.x"),
        ] {
            assert!(parse_head(head).unwrap_err().contains(why), "{}", String::from_utf8_lossy(head));
        }
    }

    /// A listener on 127.0.0.1 served by `egress`, as an install's would be.
    fn listening(egress: &Egress) -> (std::net::SocketAddr, Serving) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        (addr, egress.serve(listener).unwrap())
    }

    /// An origin on 127.0.0.1 that accepts and then stays silent, holding
    /// each connection until the other side closes it.
    async fn silent_origin() -> std::net::SocketAddr {
        let origin = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = origin.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = origin.accept().await {
                tokio::spawn(async move {
                    let mut sink = [0u8; 1024];
                    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                });
            }
        });
        addr
    }

    async fn wait_for_accepted(egress: &Egress, count: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        while egress.stats().accepted.load(Relaxed) < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_listener_serves_its_cap_of_connections_and_the_next_waits_its_turn() {
        use std::sync::atomic::Ordering::Relaxed;
        let origin = silent_origin().await;
        let egress = Egress::new(vec!["127.0.0.1".into()]);
        let (addr, _serving) = listening(&egress);
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(format!("CONNECT {origin} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
            let mut reply = [0u8; 39];
            stream.read_exact(&mut reply).await.unwrap();
            assert!(reply.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&reply));
            held.push(stream);
        }
        wait_for_accepted(&egress, MAX_CONNECTIONS as u64).await;
        // One past the cap connects (the backlog) but is not taken up...
        let mut next = TcpStream::connect(addr).await.unwrap();
        next.write_all(b"CONNECT other.invalid:443 HTTP/1.1\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(egress.stats().accepted.load(Relaxed), MAX_CONNECTIONS as u64);
        // ...until one of the others ends.
        drop(held.pop());
        let mut reply = String::new();
        next.read_to_string(&mut reply).await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
        assert_eq!(egress.stats().accepted.load(Relaxed), MAX_CONNECTIONS as u64 + 1);
    }

    #[tokio::test]
    async fn an_idle_relay_is_closed_and_dropping_the_listener_ends_every_relay() {
        let origin = silent_origin().await;
        let egress = Egress::new(vec!["127.0.0.1".into()]).with_idle(Duration::from_millis(200));
        let (addr, serving) = listening(&egress);
        let open = |addr| async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(format!("CONNECT {origin} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
            let mut reply = [0u8; 39];
            stream.read_exact(&mut reply).await.unwrap();
            stream
        };
        // Nothing moves either way: the proxy closes the tunnel.
        let mut idle = open(addr).await;
        let mut rest = Vec::new();
        assert_eq!(idle.read_to_end(&mut rest).await.unwrap(), 0);
        // A tunnel that would stay open ends with its listener's handle.
        let egress = Egress::new(vec!["127.0.0.1".into()]);
        drop(serving);
        let (addr, serving) = listening(&egress);
        let mut live = open(addr).await;
        drop(serving);
        assert_eq!(live.read_to_end(&mut rest).await.unwrap(), 0);
        assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
    }

    #[tokio::test]
    async fn a_host_outside_the_list_gets_a_403_and_a_listed_one_is_reached() {
        // An origin on 127.0.0.1 that answers one request.
        let origin = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let origin_addr = origin.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = origin.accept().await.unwrap();
            let mut buffer = vec![0u8; 4096];
            let n = stream.read(&mut buffer).await.unwrap();
            let got = String::from_utf8_lossy(&buffer[..n]).into_owned();
            let body = if got.starts_with("GET /hello HTTP/1.1\r\n") { "hi" } else { "bad" };
            let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            stream.write_all(reply.as_bytes()).await.unwrap();
        });
        let egress = Egress::new(vec!["127.0.0.1".into()]);
        let (addr, _serving) = listening(&egress);
        let ask = |head: String| async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut reply = String::new();
            stream.read_to_string(&mut reply).await.unwrap();
            reply
        };
        let reply = ask(format!("GET http://{origin_addr}/hello HTTP/1.1\r\nHost: {origin_addr}\r\n\r\n")).await;
        assert!(reply.starts_with("HTTP/1.1 200 OK") && reply.ends_with("hi"), "{reply}");
        // Named by a name that is not on the list (nothing is sent: refused first).
        let reply = ask("CONNECT localhost:443 HTTP/1.1\r\n\r\n".into()).await;
        assert!(reply.starts_with("HTTP/1.1 403") && reply.contains("localhost is not one of"), "{reply}");
        let reply = ask("GET http://metadata.invalid/ HTTP/1.1\r\n\r\n".into()).await;
        assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
        // A head of exactly the limit is read (and refused for its host);
        // one byte more is refused for its length.
        let sized = |bytes: usize| {
            let start = "GET http://other.invalid/ HTTP/1.1\r\nX-Pad: ";
            format!("{start}{}\r\n\r\n", "x".repeat(bytes - start.len() - 4))
        };
        let reply = ask(sized(MAX_HEAD_BYTES)).await;
        assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
        let reply = ask(sized(MAX_HEAD_BYTES + 1)).await;
        assert!(reply.starts_with("HTTP/1.1 400") && reply.contains("too long"), "{reply}");
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!((egress.stats().forwarded.load(Relaxed), egress.stats().refused.load(Relaxed)), (1, 3));
    }
}
