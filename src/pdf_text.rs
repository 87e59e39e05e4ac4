//! The text of an attached PDF, for a `read_file` that has no working
//! folder (and so no sandboxed `pdftotext`) to read it with.
//!
//! A PDF is the user's, and so untrusted: a parser can be driven into huge
//! allocations (a decompression bomb in a stream) or long loops. The server
//! never parses one itself. It starts its own binary as `skillhost
//! pdf-text`, in a process of its own, with the PDF on stdin: that process
//! drops to `nobody` when started as root, limits its memory, CPU time and
//! files, parses with lopdf (memory-safe, no scripts, no fonts rendered),
//! and writes at most [`MAX_PDF_TEXT_BYTES`] of text to stdout. The server
//! gives it [`PDF_TEXT_TIMEOUT`], then kills it.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The subcommand, dispatched in `main` before anything else runs.
pub const SUBCOMMAND: &str = "pdf-text";
/// Most text kept of one PDF.
pub const MAX_PDF_TEXT_BYTES: usize = 256 * 1024;
/// How long one PDF may take, from start to exit.
pub const PDF_TEXT_TIMEOUT: Duration = Duration::from_secs(20);
/// The child's address space: room for a large PDF and its parse.
const MEMORY_BYTES: u64 = 768 * 1024 * 1024;
/// The child's CPU time.
const CPU_SECONDS: u64 = 15;
/// `nobody`, which a child started as root becomes.
const NOBODY: u32 = 65534;

/// Why a PDF has no text here, as a sentence for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PdfTextError {
    /// The reader could not be started or fed.
    #[error("the PDF reader could not run: {0}")]
    Start(String),
    /// It took longer than [`PDF_TEXT_TIMEOUT`].
    #[error("reading the PDF took longer than {} s", PDF_TEXT_TIMEOUT.as_secs())]
    TimedOut,
    /// It ended without text: not a PDF it can read, or past its limits.
    #[error("the PDF could not be read ({0})")]
    Unreadable(String),
}

/// How the child ended badly: its exit code and the sentence for stderr.
pub struct Failed {
    pub code: u8,
    pub why: String,
}

/// In the child: confines this process, reads a PDF from stdin and writes
/// its text to stdout. A PDF it cannot read exits 1, anything else 2.
pub fn run() -> Result<(), Failed> {
    let fail = |code: u8| move |why: String| Failed { code, why };
    confine().map_err(fail(2))?;
    let mut pdf = Vec::new();
    let limit = skillhost_actors::attachments::MAX_CONVERSATION_ATTACHMENT_BYTES;
    std::io::stdin().take(limit).read_to_end(&mut pdf).map_err(|err| fail(2)(err.to_string()))?;
    let text = text_of(&pdf).map_err(fail(1))?;
    let mut cut = text.len().min(MAX_PDF_TEXT_BYTES);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    std::io::stdout().write_all(&text.as_bytes()[..cut]).map_err(|err| fail(2)(err.to_string()))
}

fn text_of(pdf: &[u8]) -> Result<String, String> {
    let document = lopdf::Document::load_mem(pdf).map_err(|err| format!("not a readable PDF: {err}"))?;
    let pages: Vec<u32> = document.get_pages().keys().copied().collect();
    document.extract_text(&pages).map_err(|err| format!("its text could not be extracted: {err}"))
}

/// Drops root (to `nobody`, no groups), and limits memory, CPU time, files
/// written and core dumps, before any input is read.
fn confine() -> Result<(), String> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: standard privilege drop: supplementary groups, then gid, then uid.
        let dropped = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(NOBODY) == 0 && libc::setuid(NOBODY) == 0
        };
        // SAFETY: plain getters.
        if !dropped || unsafe { libc::getuid() == 0 || libc::geteuid() == 0 } {
            return Err(format!("cannot become nobody: {}", std::io::Error::last_os_error()));
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    for (resource, value, what) in [
        (libc::RLIMIT_AS, MEMORY_BYTES, "memory"),
        (libc::RLIMIT_CPU, CPU_SECONDS, "CPU time"),
        (libc::RLIMIT_FSIZE, 0, "file size"),
        (libc::RLIMIT_CORE, 0, "core dumps"),
    ] {
        let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(format!("cannot limit {what}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// In the server: the text of `pdf`, read by `binary pdf-text` as above.
pub async fn read(binary: &Path, pdf: &[u8]) -> Result<String, PdfTextError> {
    let mut child = tokio::process::Command::new(binary)
        .arg(SUBCOMMAND)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| PdfTextError::Start(err.to_string()))?;
    let (mut stdin, mut stdout, mut stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
        (Some(stdin), Some(stdout), Some(stderr)) => (stdin, stdout, stderr),
        _ => return Err(PdfTextError::Start("its pipes are missing".into())),
    };
    let pdf = pdf.to_vec();
    let work = async move {
        // The child may stop reading early (a PDF it refuses at once).
        let feed = async move {
            let _ = stdin.write_all(&pdf).await;
        };
        let mut text = Vec::new();
        let mut said = Vec::new();
        let (mut stdout, mut stderr) = ((&mut stdout).take(MAX_PDF_TEXT_BYTES as u64 + 1), (&mut stderr).take(4096));
        let (_, read, _) = tokio::join!(feed, stdout.read_to_end(&mut text), stderr.read_to_end(&mut said));
        read.map_err(|err| PdfTextError::Start(err.to_string()))?;
        let status = child.wait().await.map_err(|err| PdfTextError::Start(err.to_string()))?;
        if !status.success() {
            let why = String::from_utf8_lossy(&said).trim().to_string();
            return Err(PdfTextError::Unreadable(if why.is_empty() { status.to_string() } else { why }));
        }
        Ok(String::from_utf8_lossy(&text).into_owned())
    };
    tokio::time::timeout(PDF_TEXT_TIMEOUT, work).await.map_err(|_| PdfTextError::TimedOut)?
}
