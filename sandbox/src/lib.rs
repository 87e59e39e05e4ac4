//! The sandbox helper, `skillhost-sandbox`: the one program that enters the
//! OS sandbox, and what the server shares with it (the helper's command
//! line and the profiles).
//!
//! It is a binary of its own, apart from the server's, because it starts
//! once for every command: the server's binary carries llama.cpp, whose
//! libraries load and initialise on every start.
//!
//! Its modes, chosen by the first argument:
//! - `sandbox-exec ARGS -- COMMAND…`: run one command ([`exec::run`]);
//! - `sandbox-warm --cgroup DIR…`: join the control groups now, then read
//!   the same command line from stdin and run it ([`exec::run_warm`]); the
//!   server keeps one or two of these started ahead of their commands.
//!
//! Either way it first marks every descriptor it inherited above 2
//! close-on-exec, so the command starts with 0, 1 and 2 alone.

pub mod args;
pub mod exec;
pub mod private_net;
pub mod profile;

use std::ffi::OsString;
use std::process::ExitCode;

/// Runs the helper with its own command line; never returns to a caller
/// that could start a thread first.
#[allow(clippy::print_stderr)]
pub fn main(raw: Vec<OsString>) -> ExitCode {
    exec::close_inherited_descriptors();
    let mode = raw.get(1).and_then(|a| a.to_str());
    match mode {
        Some(args::SUBCOMMAND) => match args::HelperArgs::parse(raw[2..].iter().cloned()) {
            Ok(args) => finish(exec::run(args)),
            Err(err) => {
                eprintln!("sandbox-exec: {err}");
                ExitCode::from(2)
            }
        },
        Some(args::WARM_SUBCOMMAND) => match args::parse_warm(raw[2..].iter().cloned()) {
            Ok(groups) => finish(exec::run_warm(groups)),
            Err(err) => {
                eprintln!("sandbox-warm: {err}");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!(
                "skillhost-sandbox is started by the skillhost server for each command it runs confined; \
                 to run one by hand, use `skillhost run-sandboxed`"
            );
            ExitCode::from(2)
        }
    }
}

#[allow(clippy::print_stderr)]
fn finish(ran: Result<u8, exec::HelperError>) -> ExitCode {
    match ran {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("sandbox: {err}");
            ExitCode::from(exec::SANDBOX_FAILURE)
        }
    }
}
