//! The shared prefix on disk, so the first request after a restart does not
//! prefill it again.
//!
//! Every request of a deployment starts with the same system text and skills
//! block; the engine keeps that prefix in a sequence of its own (see
//! `executor`) and, with `--prefix-cache DIR`, writes it to two files in DIR
//! whenever it changes: llama.cpp's own sequence state (the KV cells and the
//! tokens) and a small JSON record of what it is for, with the state's
//! SHA-256. At start-up the record is read first; a prefix saved for another
//! model file or chat template is ignored with a log line, and so is a state
//! whose digest differs (cut short, damaged or replaced: llama.cpp's reader
//! checks shapes, not contents, so it only ever gets back bytes it wrote).
//!
//! The folder is the operator's, named in the configuration; nothing a request
//! or a sandboxed command sends ever shapes these paths.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Bytes read from each end of the model file for its identity: the start
/// holds the GGUF header and metadata (architecture, tokenizer, template),
/// the end the last tensors, so another model or a re-quantization differs
/// in at least one; reading them takes milliseconds for any model size.
pub const MODEL_ID_BYTES: u64 = 4 * 1024 * 1024;
/// Version of the record; a record of another version is ignored.
const FORMAT: u32 = 1;

/// What a saved prefix is for, written beside its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    format: u32,
    /// Identity of the model file (see [`MODEL_ID_BYTES`]).
    model: String,
    /// SHA-256 of the chat template source.
    template: String,
    /// Tokens in the prefix.
    tokens: usize,
    /// SHA-256 of the state file.
    state: String,
    /// SHA-256 of the prefix's text, when its text is known.
    block: Option<String>,
    /// The prefix's text, so later prompts can be matched against it by text.
    text: Option<String>,
}

/// Where and for what the shared prefix is saved.
#[derive(Debug)]
pub struct SavedPrefix {
    state: PathBuf,
    record: PathBuf,
    model: String,
    template: String,
}

impl SavedPrefix {
    /// The files for this model in `dir`, which is created if missing.
    pub fn new(dir: &Path, model_path: &Path, template: &str) -> Option<Self> {
        let model = match model_identity(model_path) {
            Ok(id) => id,
            Err(err) => {
                tracing::warn!(path = %model_path.display(), error = %err, "cannot read the model for the prefix cache; it is off");
                return None;
            }
        };
        if let Err(err) = std::fs::create_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot create the prefix cache folder; it is off");
            return None;
        }
        let stem = &model[..16];
        Some(SavedPrefix {
            state: dir.join(format!("{stem}.kv")),
            record: dir.join(format!("{stem}.json")),
            model,
            template: hex(&Sha256::digest(template.as_bytes())),
        })
    }

    /// Writes the prefix held by `seq`; the previous files stay in place until
    /// both new ones are complete.
    pub fn save(&self, ctx: &LlamaContext<'_>, seq: i32, tokens: &[LlamaToken], text: Option<&[u8]>) {
        let text = text.and_then(|t| std::str::from_utf8(t).ok());
        let state_part = self.state.with_extension("kv.part");
        let record_part = self.record.with_extension("json.part");
        // llama.cpp opens the state file by name and follows links, and so
        // does `fs::write`: whatever sits at either name (a file left by a
        // crash, or a link planted there) is unlinked first, which removes
        // the link itself, so each file is always created anew.
        for part in [&state_part, &record_part] {
            if let Err(err) = std::fs::remove_file(part) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %part.display(), error = %err, "cannot save the shared prefix");
                    return;
                }
            }
        }
        let written =
            ctx.state_seq_save_file(&state_part, seq, tokens).map_err(|err| err.to_string()).and_then(|bytes| {
                let record = Record {
                    format: FORMAT,
                    model: self.model.clone(),
                    template: self.template.clone(),
                    tokens: tokens.len(),
                    state: file_digest(&state_part).map_err(|err| err.to_string())?,
                    block: text.map(|t| hex(&Sha256::digest(t.as_bytes()))),
                    text: text.map(str::to_owned),
                };
                let json = serde_json::to_vec(&record).map_err(|err| err.to_string())?;
                std::fs::write(&record_part, json).map_err(|err| err.to_string())?;
                std::fs::rename(&state_part, &self.state).map_err(|err| err.to_string())?;
                std::fs::rename(&record_part, &self.record).map_err(|err| err.to_string())?;
                Ok(bytes)
            });
        match written {
            Ok(bytes) => {
                tracing::info!(tokens = tokens.len(), bytes, path = %self.state.display(), "saved the shared prefix")
            }
            Err(err) => tracing::warn!(error = %err, path = %self.state.display(), "cannot save the shared prefix"),
        }
    }

    /// Loads a saved prefix into `seq` if it was saved for this model and
    /// template; returns its tokens and text.
    pub fn load(
        &self,
        ctx: &mut LlamaContext<'_>,
        seq: i32,
        n_ctx: usize,
    ) -> Option<(Vec<LlamaToken>, Option<Vec<u8>>)> {
        let bytes = match std::fs::read(&self.record) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
            Err(err) => {
                tracing::warn!(path = %self.record.display(), error = %err, "cannot read the saved prefix; ignored");
                return None;
            }
        };
        let record: Record = match serde_json::from_slice(&bytes) {
            Ok(record) => record,
            Err(err) => {
                tracing::warn!(path = %self.record.display(), error = %err, "the saved prefix's record is not valid; ignored");
                return None;
            }
        };
        let mismatch = if record.format != FORMAT {
            Some("another format")
        } else if record.model != self.model {
            Some("another model file")
        } else if record.template != self.template {
            Some("another chat template")
        } else if record.tokens >= n_ctx {
            Some("a larger context")
        } else {
            None
        };
        if let Some(what) = mismatch {
            tracing::info!(path = %self.record.display(), "the saved prefix is for {what}; ignored");
            return None;
        }
        if file_digest(&self.state).ok().as_deref() != Some(record.state.as_str()) {
            tracing::warn!(path = %self.state.display(), "the saved prefix's state is not the one its record describes (cut short or changed); ignored");
            return None;
        }
        let (tokens, bytes) = match ctx.state_seq_load_file(&self.state, seq, record.tokens) {
            Ok(loaded) => loaded,
            Err(err) => {
                tracing::warn!(path = %self.state.display(), error = %err, "llama.cpp refused the saved prefix; ignored");
                let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
                return None;
            }
        };
        if tokens.len() != record.tokens {
            tracing::warn!(path = %self.state.display(), "the saved prefix's state does not match its record; ignored");
            let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
            return None;
        }
        tracing::info!(tokens = tokens.len(), bytes, "restored the shared prefix");
        Some((tokens, record.text.map(String::into_bytes)))
    }
}

/// SHA-256 over the file's length and up to [`MODEL_ID_BYTES`] from each end.
fn model_identity(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut hasher = Sha256::new();
    hasher.update(len.to_le_bytes());
    let mut buf = Vec::new();
    file.by_ref().take(MODEL_ID_BYTES).read_to_end(&mut buf)?;
    hasher.update(&buf);
    buf.clear();
    file.seek(SeekFrom::Start(len.saturating_sub(MODEL_ID_BYTES)))?;
    file.take(MODEL_ID_BYTES).read_to_end(&mut buf)?;
    hasher.update(&buf);
    Ok(hex(&hasher.finalize()))
}

fn file_digest(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut File::open(path)?, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
