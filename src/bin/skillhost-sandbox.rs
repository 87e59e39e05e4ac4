//! `skillhost-sandbox`, the sandbox helper the server starts for each
//! confined command; see `skillhost_sandbox`.

fn main() -> std::process::ExitCode {
    // Before anything could start a thread: birdcage needs a
    // single-threaded process.
    skillhost_sandbox::main(std::env::args_os().collect())
}
