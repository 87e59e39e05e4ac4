//! The sandbox helper, `skillhost-sandbox`: the one program that enters the
//! OS sandbox, and what the server shares with it (the helper's command
//! line and the profiles).
//!
//! It is a binary of its own, apart from the server's, because it starts
//! once for every command and once more inside the sandbox as the
//! descriptor-closing trampoline: the server's binary carries llama.cpp,
//! whose libraries load and initialise on every start.
//!
//! Its modes, chosen by the first argument:
//! - `sandbox-exec ARGS -- COMMAND…`: run one command ([`exec::run`]);
//! - `sandbox-warm --cgroup DIR…`: join the control groups now, then read
//!   the same command line from stdin and run it ([`exec::run_warm`]); the
//!   server keeps one or two of these started ahead of their commands;
//! - `sandbox-close-fds -- COMMAND…`: inside the sandbox, close every
//!   inherited descriptor above 2 and become the command.

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
    let mode = raw.get(1).and_then(|a| a.to_str());
    match mode {
        Some(exec::CLOSE_FDS_COMMAND) if raw.get(2).is_some_and(|a| a == "--") => {
            eprintln!("sandbox: {}", exec::close_fds_and_exec(&raw[3..]));
            ExitCode::from(exec::SANDBOX_FAILURE)
        }
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
