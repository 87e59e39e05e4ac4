//! Custom certificate authorities for commands granted the network
//! (`--ca-bundle`): a network behind a TLS-inspecting proxy needs its CA,
//! but the operator's bundle file may sit next to private material, and its
//! path says something about the host.
//!
//! Each bundle is read once at start-up (at most [`MAX_CA_BUNDLE_BYTES`]),
//! and only its certificates that parse as trust anchors are kept: a
//! private key, a comment or anything else in the file never reaches a
//! command. They are written, with the host's own roots, into one snapshot
//! the server owns; commands see it read-only at its own path, named by
//! `SSL_CERT_FILE` and its relatives.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Largest CA bundle read, in bytes.
pub const MAX_CA_BUNDLE_BYTES: u64 = 16 * 1024 * 1024;
/// The host's own roots, kept in the snapshot so `SSL_CERT_FILE` adds to
/// them rather than replacing them.
pub const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The variables that point TLS clients at the snapshot: OpenSSL, Python's
/// requests and pip, Node (which adds it to its own roots), curl and git.
pub const CA_VARIABLES: [&str; 6] =
    ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"];

/// Why an operator's CA bundle is refused: the server does not start with
/// it (a bad bundle is a bad flag).
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("--ca-bundle {name}: {source}")]
    Unreadable { name: String, source: std::io::Error },
    #[error("--ca-bundle {name}: {size} bytes is past the {MAX_CA_BUNDLE_BYTES}-byte limit for a CA bundle")]
    TooLarge { name: String, size: u64 },
    #[error("--ca-bundle {name}: holds no certificate that parses")]
    NoCertificate { name: String },
}

/// The certificates of one bundle's text that parse as trust anchors, as
/// PEM; an error when it holds none.
pub fn certificates(name: &str, bytes: &[u8]) -> Result<Vec<String>, CaError> {
    let mut kept = Vec::new();
    for item in CertificateDer::pem_slice_iter(bytes) {
        let Ok(cert) = item else { continue };
        if webpki::anchor_from_trusted_cert(&cert).is_err() {
            continue;
        }
        kept.push(pem(&cert));
    }
    if kept.is_empty() {
        return Err(CaError::NoCertificate { name: name.to_string() });
    }
    Ok(kept)
}

fn pem(cert: &CertificateDer<'_>) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in text.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Reads the operator's bundles, each checked against the size cap before
/// it is read whole.
pub fn read_bundles(paths: &[PathBuf]) -> Result<Vec<String>, CaError> {
    let mut all = Vec::new();
    for path in paths {
        let name = path.display().to_string();
        let unreadable = |source| CaError::Unreadable { name: name.clone(), source };
        let size = std::fs::metadata(path).map_err(unreadable)?.len();
        if size > MAX_CA_BUNDLE_BYTES {
            return Err(CaError::TooLarge { name, size });
        }
        let bytes = std::fs::read(path).map_err(unreadable)?;
        all.extend(certificates(&name, &bytes)?);
    }
    Ok(all)
}

/// Writes the snapshot (the host's roots, then the operator's) as a file
/// of the server's, mode 0644, at `target`, a path in the server's own
/// folder that nothing else writes.
pub fn write_snapshot(target: &Path, custom: &[String]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let system = std::fs::read(SYSTEM_ROOTS).unwrap_or_default();
    let mut text: String = match certificates(SYSTEM_ROOTS, &system) {
        Ok(roots) => roots.concat(),
        Err(_) => String::new(),
    };
    text.push_str(&custom.concat());
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(target)?;
    file.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One real root from the host's bundle (Debian's ca-certificates).
    fn a_root() -> String {
        let system = std::fs::read(SYSTEM_ROOTS).expect("the ca-certificates package");
        certificates(SYSTEM_ROOTS, &system).unwrap().remove(0)
    }

    #[test]
    fn only_certificates_that_parse_are_kept() {
        let root = a_root();
        let key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n";
        let junk = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
        let bundle = format!("# corporate roots, see /srv/secret/notes\n{key}{root}{junk}");
        assert_eq!(certificates("b.pem", bundle.as_bytes()).unwrap(), std::slice::from_ref(&root));
        let err = certificates("k.pem", key.as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), "--ca-bundle k.pem: holds no certificate that parses");
    }

    #[test]
    fn a_bundle_is_read_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let root = a_root();
        let at = dir.path().join("at.pem");
        let mut text = root.clone();
        text.push_str(&" ".repeat(MAX_CA_BUNDLE_BYTES as usize - root.len()));
        std::fs::write(&at, &text).unwrap();
        assert_eq!(read_bundles(std::slice::from_ref(&at)).unwrap(), std::slice::from_ref(&root));
        let past = dir.path().join("past.pem");
        text.push(' ');
        std::fs::write(&past, &text).unwrap();
        let err = read_bundles(std::slice::from_ref(&past)).unwrap_err();
        let expected =
            format!("--ca-bundle {}: 16777217 bytes is past the 16777216-byte limit for a CA bundle", past.display());
        assert_eq!(err.to_string(), expected);
        let snapshot = dir.path().join("snapshot.pem");
        write_snapshot(&snapshot, std::slice::from_ref(&root)).unwrap();
        let written = std::fs::read_to_string(&snapshot).unwrap();
        assert!(written.ends_with(&root) && written.matches("BEGIN CERTIFICATE").count() > 1);
        assert!(write_snapshot(&snapshot, &[]).is_err(), "never written over");
    }
}
