//! Fetching a skill archive (or another server's discovery index) by URL,
//! for an install by digest.
//!
//! The URL is the caller's and the answer is a stranger's, so every hop is
//! judged before it is taken: the host must be one the operator allows
//! (`--skills-install-domains`), the scheme HTTPS (plain HTTP only to this
//! machine), and a redirect is followed only to another allowed host, a few
//! times at most. The archive streams to a file while it is hashed; the
//! caller compares the digest before anything is unpacked.

use std::net::IpAddr;
use std::time::Duration;

use reqwest::Url;
use sha2::Digest;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Redirects one fetch follows, each to an allowed host.
pub const MAX_REDIRECTS: usize = 5;
/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one whole fetch may take, redirects and body included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest discovery index read: thousands of entries fit in far less.
pub const MAX_INDEX_BYTES: u64 = 1024 * 1024;

/// Why a fetch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The URL, or a redirect, names what the operator does not allow (HTTP 403).
    #[error("{0}")]
    NotAllowed(String),
    /// The URL or digest as given cannot be used (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// The bytes are not the ones the digest names (HTTP 422).
    #[error(
        "the archive at {url} has the digest sha256:{actual}, not the sha256:{expected} given; nothing was installed"
    )]
    DigestMismatch { url: String, expected: String, actual: String },
    /// The archive is larger than an install takes (HTTP 422).
    #[error("{0}")]
    TooLarge(String),
    /// The other server failed, or could not be reached (HTTP 502).
    #[error("{0}")]
    Remote(String),
    /// Writing what arrived failed (HTTP 500).
    #[error("{0}")]
    Io(String),
}

/// The hosts installs may fetch from (`--skills-install-domains`): a name
/// matches itself, `*.example.com` matches every name under example.com
/// (not example.com itself), and an IP address matches itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Domains {
    entries: Vec<String>,
}

impl Domains {
    /// Checks and keeps the operator's list. Each entry is a bare host:
    /// no scheme, path or port, and a wildcard only as a leading `*.`.
    pub fn parse(list: &[String]) -> Result<Domains, String> {
        let mut entries = Vec::new();
        for raw in list {
            let entry = raw.trim().trim_end_matches('.').to_ascii_lowercase();
            if entry.is_empty() {
                continue;
            }
            let host = entry.strip_prefix("*.").unwrap_or(&entry);
            let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
            let is_ip = bracketed.parse::<IpAddr>().is_ok();
            let is_name = !host.is_empty()
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                });
            if !(is_ip && host == entry || is_name) {
                return Err(format!(
                    "'{raw}' is not a host name: give names like github.com or *.example.com, without a scheme, path or port"
                ));
            }
            entries.push(if is_ip { bracketed.to_string() } else { entry });
        }
        Ok(Domains { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn allows_host(&self, host: &str) -> bool {
        self.entries.iter().any(|entry| match entry.strip_prefix("*.") {
            Some(parent) => {
                host.len() > parent.len() + 1 && host.ends_with(parent) && {
                    let cut = host.len() - parent.len();
                    host.as_bytes()[cut - 1] == b'.'
                }
            }
            None => entry == host,
        })
    }

    /// Whether a fetch may go to `url`, and why not. `what` names the URL
    /// in the refusal ("the URL", "the redirect to ...").
    pub fn check(&self, url: &Url, what: &str) -> Result<(), FetchError> {
        let Some(host) = url_host(url) else {
            return Err(FetchError::Invalid(format!("{what} {url} names no host")));
        };
        if !url.username().is_empty() || url.password().is_some() {
            // Credentials in a URL would be sent to whoever answers, and
            // `https://allowed@elsewhere` reads like the allowed host.
            return Err(FetchError::Invalid(format!("{what} {url} carries a user name or password; give it without")));
        }
        match url.scheme() {
            "https" => {}
            // Plain HTTP is readable and changeable on the way; only a
            // fetch that never leaves this machine may use it.
            "http" if is_loopback(&host) => {}
            "http" => {
                return Err(FetchError::NotAllowed(format!(
                    "{what} {url} uses plain HTTP; installs fetch over HTTPS (HTTP only from this machine)"
                )))
            }
            other => return Err(FetchError::Invalid(format!("{what} {url} is a {other} URL; give an https URL"))),
        }
        if self.entries.is_empty() {
            return Err(FetchError::NotAllowed(
                "installs by URL are off: no host is allowed; list the hosts to fetch from with --skills-install-domains"
                    .into(),
            ));
        }
        if !self.allows_host(&host) {
            return Err(FetchError::NotAllowed(format!(
                "{what} {url} is on {host}, which is not in --skills-install-domains ({})",
                self.entries.join(", ")
            )));
        }
        Ok(())
    }
}

/// A URL's host as the allow-list spells hosts: lowercase, an IPv6 address
/// without brackets.
fn url_host(url: &Url) -> Option<String> {
    Some(match url.host()? {
        url::Host::Domain(name) => name.trim_end_matches('.').to_ascii_lowercase(),
        url::Host::Ipv4(ip) => ip.to_string(),
        url::Host::Ipv6(ip) => ip.to_string(),
    })
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A digest as given: 64 hex digits, with or without `sha256:`. Answers
/// the lowercase hex.
pub fn parse_sha256(given: &str) -> Result<String, FetchError> {
    let hex = given.trim();
    let hex = hex.strip_prefix("sha256:").unwrap_or(hex);
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(FetchError::Invalid(format!(
            "'{given}' is not a SHA-256 digest: give 64 hexadecimal digits, optionally after 'sha256:'"
        )));
    }
    Ok(hex.to_ascii_lowercase())
}

/// What a fetch brought: the bytes' digest (lowercase hex), their count,
/// and the URL they finally came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub sha256: String,
    pub bytes: u64,
    pub url: Url,
}

/// Whether a host name found through DNS may lead to `ip`: not this
/// machine, a private or shared (carrier) network, a link-local address
/// (where clouds answer metadata), nor a multicast, documentation,
/// benchmarking, reserved or unspecified one. IPv4 carried in IPv6
/// (mapped, or behind NAT64's well-known prefix) is judged as that IPv4.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || a >= 240
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && c == 0)
                || (a == 198 && (b == 18 || b == 19)))
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(v4.into());
            }
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return is_public(std::net::Ipv4Addr::from(u128::from(v6) as u32).into());
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0x0db8))
        }
    }
}

/// A name that resolved only to addresses a fetch by name may not reach.
#[derive(Debug)]
struct InsideAddress(String);

impl std::fmt::Display for InsideAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InsideAddress {}

/// The addresses of `host` a fetch may connect to. The allow-list judges
/// names; this judges where a name leads, so an allowed name (one under a
/// wildcard most of all) whose DNS points at this machine, its networks or
/// a cloud's metadata address reaches none of them. `localhost` may lead
/// to this machine, as its plain HTTP may; an address the operator wants
/// fetched from is listed as itself, and no DNS is asked for it.
fn keep_public(host: &str, found: Vec<std::net::SocketAddr>) -> Result<Vec<std::net::SocketAddr>, InsideAddress> {
    if is_loopback(host) {
        return Ok(found.into_iter().filter(|addr| addr.ip().is_loopback()).collect());
    }
    let (public, inside): (Vec<_>, Vec<_>) = found.into_iter().partition(|addr| is_public(addr.ip()));
    if public.is_empty() && !inside.is_empty() {
        let listed: Vec<String> = inside.iter().map(|addr| addr.ip().to_string()).collect();
        return Err(InsideAddress(format!(
            "{host} resolves only to {}, which is not a public address; a fetch by name reaches public addresses only (list an address itself in --skills-install-domains to fetch from it)",
            listed.join(", ")
        )));
    }
    Ok(public)
}

/// The DNS resolver of every fetch: the system's, through [`keep_public`].
/// (A proxy named in the environment resolves the names it is sent, so
/// this judges only fetches that connect by themselves.)
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<_> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept = keep_public(host.trim_end_matches('.'), found)?;
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The client every fetch uses: it follows no redirect by itself (each is
/// judged here), resolves names through [`PublicOnly`], and skips any
/// proxy for this machine's own addresses.
fn client(url: &Url) -> Result<reqwest::Client, FetchError> {
    // reqwest is built without a TLS provider of its own; ring is the one
    // already in the tree. Installing it twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .dns_resolver(std::sync::Arc::new(PublicOnly))
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("skillhost/", env!("CARGO_PKG_VERSION")));
    if url_host(url).is_some_and(|host| is_loopback(&host)) {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|err| FetchError::Io(format!("cannot build the HTTP client: {err}")))
}

/// Fetches `url` into `out`, at most `max_bytes`, hashing as it goes.
pub async fn fetch<W: AsyncWrite + Unpin>(
    url: &str,
    domains: &Domains,
    max_bytes: u64,
    out: &mut W,
) -> Result<Fetched, FetchError> {
    let url = Url::parse(url.trim()).map_err(|err| FetchError::Invalid(format!("'{url}' is not a URL: {err}")))?;
    match tokio::time::timeout(FETCH_TIMEOUT, fetch_within(url.clone(), domains, max_bytes, out)).await {
        Ok(result) => result,
        Err(_) => {
            Err(FetchError::Remote(format!("fetching {url} did not finish within {} seconds", FETCH_TIMEOUT.as_secs())))
        }
    }
}

async fn fetch_within<W: AsyncWrite + Unpin>(
    mut url: Url,
    domains: &Domains,
    max_bytes: u64,
    out: &mut W,
) -> Result<Fetched, FetchError> {
    domains.check(&url, "the URL")?;
    let mut hops = 0;
    let mut response = loop {
        let response = client(&url)?.get(url.clone()).send().await.map_err(|err| match inside_address(&err) {
            Some(why) => FetchError::NotAllowed(format!("{url} cannot be fetched: {why}")),
            None => FetchError::Remote(format!("{url} could not be fetched: {}", error_chain(&err))),
        })?;
        if !response.status().is_redirection() {
            break response;
        }
        let Some(location) = response.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok()) else {
            return Err(FetchError::Remote(format!(
                "{url} answered {} without saying where to",
                response.status().as_u16()
            )));
        };
        let next = url.join(location).map_err(|err| {
            FetchError::Remote(format!("{url} redirected to '{location}', which is not a URL: {err}"))
        })?;
        hops += 1;
        if hops > MAX_REDIRECTS {
            return Err(FetchError::Remote(format!("{url} redirected more than {MAX_REDIRECTS} times")));
        }
        domains.check(&next, &format!("{url} redirected, and the redirect to"))?;
        url = next;
    };
    if !response.status().is_success() {
        return Err(FetchError::Remote(format!("{url} answered {}", response.status())));
    }
    let too_large = || FetchError::TooLarge(format!("{url} holds more than the limit of {max_bytes} bytes"));
    if response.content_length().is_some_and(|n| n > max_bytes) {
        return Err(too_large());
    }
    let mut hasher = sha2::Sha256::new();
    let mut bytes = 0u64;
    while let Some(chunk) =
        response.chunk().await.map_err(|err| FetchError::Remote(format!("{url} broke off: {}", error_chain(&err))))?
    {
        bytes += chunk.len() as u64;
        if bytes > max_bytes {
            return Err(too_large());
        }
        hasher.update(&chunk);
        out.write_all(&chunk).await.map_err(|err| FetchError::Io(format!("cannot keep what {url} sent: {err}")))?;
    }
    out.flush().await.map_err(|err| FetchError::Io(format!("cannot keep what {url} sent: {err}")))?;
    Ok(Fetched { sha256: format!("{:x}", hasher.finalize()), bytes, url })
}

/// Fetches `url` into `out` and checks its bytes against `sha256` (lowercase
/// hex, as [`parse_sha256`] answers).
pub async fn fetch_verified<W: AsyncWrite + Unpin>(
    url: &str,
    sha256: &str,
    domains: &Domains,
    max_bytes: u64,
    out: &mut W,
) -> Result<Fetched, FetchError> {
    let fetched = fetch(url, domains, max_bytes, out).await?;
    if fetched.sha256 != sha256 {
        return Err(FetchError::DigestMismatch {
            url: fetched.url.to_string(),
            expected: sha256.to_string(),
            actual: fetched.sha256,
        });
    }
    Ok(fetched)
}

/// The refusal of [`keep_public`] among an error's causes, if it is one.
fn inside_address(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(err);
    while let Some(error) = cause {
        if let Some(inside) = error.downcast_ref::<InsideAddress>() {
            return Some(inside.0.clone());
        }
        cause = error.source();
    }
    None
}

/// reqwest's error with its causes: its own text is often only "error
/// sending request", and the cause says connection refused or a bad name.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domains(list: &[&str]) -> Domains {
        Domains::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn a_name_matches_itself_and_a_wildcard_only_names_under_it() {
        let list = domains(&["github.com", "*.githubusercontent.com", "127.0.0.1", "::1"]);
        assert!(list.check(&url("https://github.com/a.zip"), "the URL").is_ok());
        assert!(list.check(&url("https://GitHub.com./a.zip"), "the URL").is_ok());
        assert!(list.check(&url("https://objects.githubusercontent.com/a"), "the URL").is_ok());
        assert!(list.check(&url("http://127.0.0.1:8080/a.zip"), "the URL").is_ok());
        assert!(list.check(&url("http://[::1]:8080/a.zip"), "the URL").is_ok());
        for refused in [
            "https://githubusercontent.com/a",
            "https://evilgithubusercontent.com/a",
            "https://github.com.evil.example/a",
            "https://api.github.com/a",
            "https://127.0.0.2/a",
        ] {
            assert!(matches!(list.check(&url(refused), "the URL"), Err(FetchError::NotAllowed(_))), "{refused} passed");
        }
    }

    #[test]
    fn plain_http_is_only_for_this_machine_and_credentials_never_travel() {
        let list = domains(&["example.com", "localhost"]);
        let err = list.check(&url("http://example.com/a.zip"), "the URL").unwrap_err();
        assert!(err.to_string().contains("plain HTTP"), "{err}");
        assert!(list.check(&url("http://localhost:9/a.zip"), "the URL").is_ok());
        let err = list.check(&url("https://example.com@evil.example/a.zip"), "the URL").unwrap_err();
        assert!(matches!(err, FetchError::Invalid(_)), "{err}");
        let err = list.check(&url("ftp://example.com/a.zip"), "the URL").unwrap_err();
        assert!(matches!(err, FetchError::Invalid(_)), "{err}");
    }

    #[test]
    fn an_empty_list_turns_installs_by_url_off() {
        let err = Domains::default().check(&url("https://github.com/a.zip"), "the URL").unwrap_err();
        assert!(err.to_string().contains("--skills-install-domains"), "{err}");
    }

    #[test]
    fn entries_must_be_bare_hosts() {
        for bad in ["https://github.com", "github.com/x", "github.com:443", "*github.com", "a.*.com", "-a.com"] {
            assert!(Domains::parse(&[bad.to_string()]).is_err(), "{bad} was accepted");
        }
        assert_eq!(domains(&[" GitHub.COM. ", ""]), domains(&["github.com"]));
    }

    #[test]
    fn a_name_leads_only_to_public_addresses() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        for inside in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "192.0.0.8",
            "198.18.0.1",
            "203.0.113.9",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
        ] {
            assert!(!is_public(ip(inside)), "{inside}");
        }
        for public in ["1.1.1.1", "140.82.112.3", "100.128.0.1", "2606:4700::1111", "64:ff9b::101:101"] {
            assert!(is_public(ip(public)), "{public}");
        }
    }

    #[test]
    fn a_name_that_resolves_inside_is_refused_and_mixed_answers_keep_the_public_part() {
        let addr = |text: &str| std::net::SocketAddr::new(text.parse().unwrap(), 0);
        let refused = keep_public("skills.example.com", vec![addr("169.254.169.254"), addr("10.0.0.1")]).unwrap_err();
        assert!(refused.0.starts_with("skills.example.com resolves only to 169.254.169.254, 10.0.0.1"), "{refused}");
        let kept = keep_public("skills.example.com", vec![addr("10.0.0.1"), addr("1.1.1.1")]).unwrap();
        assert_eq!(kept, vec![addr("1.1.1.1")]);
        // localhost reaches this machine, and only this machine.
        let kept = keep_public("localhost", vec![addr("127.0.0.1"), addr("::1"), addr("10.0.0.1")]).unwrap();
        assert_eq!(kept, vec![addr("127.0.0.1"), addr("::1")]);
    }

    #[test]
    fn a_digest_is_64_hex_digits_with_or_without_its_prefix() {
        let hex = "AB".repeat(32);
        assert_eq!(parse_sha256(&hex).unwrap(), "ab".repeat(32));
        assert_eq!(parse_sha256(&format!("sha256:{hex}")).unwrap(), "ab".repeat(32));
        assert!(parse_sha256(&hex[..63]).is_err());
        assert!(parse_sha256(&format!("{hex}0")).is_err());
        assert!(parse_sha256(&"zz".repeat(32)).is_err());
        assert!(parse_sha256(&format!("md5:{hex}")).is_err());
    }
}
