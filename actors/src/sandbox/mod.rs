//! Running model-written commands and skill scripts confined by the OS.
//!
//! The server never enters the sandbox itself (birdcage needs a
//! single-threaded caller and rewrites its caller's environment): it starts
//! `skillhost sandbox-exec`, which sets everything up in a fresh process
//! before any thread exists.

pub mod doctor;
pub mod launch;
pub mod profile;
