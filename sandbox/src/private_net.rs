//! The network the host's installer runs in: a namespace of its own whose
//! one way out is the install proxy.
//!
//! The sandbox's network is otherwise all or nothing: a command granted it
//! shares the host's, with the server's own port, every loopback service
//! and link-local address. The installer needs one thing from the network,
//! the proxy, so it gets exactly that:
//!
//! 1. the launcher gives the helper one end of a Unix socket pair;
//! 2. the helper, still single-threaded and before it drops privileges,
//!    moves into a new network namespace (a new user namespace with it when
//!    it is not root), brings its loopback interface up, listens on
//!    127.0.0.1:[`NAMESPACE_PORT`] there, and sends the listening socket
//!    back over the pair ([`make_and_hand_over`]);
//! 3. the server receives it (`skillhost_actors::sandbox::private_net::receive`) and serves it with the install
//!    proxy for as long as the install runs.
//!
//! A socket stays in the namespace it was made in, so connections to that
//! listener come only from the installer's namespace, and the installer's
//! namespace holds nothing else: no route, no other address, no port of
//! the host's.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// The port the installer's proxy listens on inside its own namespace,
/// where nothing else listens: the same on every install.
pub const NAMESPACE_PORT: u16 = 3128;

/// Why the installer's network could not be made; the helper stops and the
/// install is reported as not run.
#[derive(Debug, thiserror::Error)]
pub enum PrivateNetError {
    /// A step failed on this host (no namespaces, no loopback, no socket).
    #[error("cannot {step}: {source}")]
    Step { step: String, source: std::io::Error },
    /// The listener does not fit in the message that carries it.
    #[error("cannot pass the installer's listener: no room in the message")]
    NoRoom,
}

fn failed<E: Into<std::io::Error>>(step: impl Into<String>) -> impl FnOnce(E) -> PrivateNetError {
    let step = step.into();
    move |err| PrivateNetError::Step { step, source: err.into() }
}

/// Helper side: a new network namespace for this process holding only a
/// loopback interface, a listener on 127.0.0.1:[`NAMESPACE_PORT`] in it,
/// and that listener sent over `channel`. Must run before any thread
/// exists (a new user namespace requires it).
pub fn make_and_hand_over(channel: OwnedFd) -> Result<(), PrivateNetError> {
    enter_own_namespace()?;
    loopback_up().map_err(failed("bring up the loopback interface of the installer's network"))?;
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, NAMESPACE_PORT))
        .map_err(failed("listen in the installer's network"))?;
    let fds = [listener.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(PrivateNetError::NoRoom);
    }
    sendmsg(&channel, &[IoSlice::new(b"L")], &mut control, SendFlags::empty())
        .map_err(failed("pass the installer's listener to the server"))?;
    Ok(())
}

fn enter_own_namespace() -> Result<(), PrivateNetError> {
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        // SAFETY: unshare with constant flags changes only this process.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(failed("make the installer's network")(std::io::Error::last_os_error()));
        }
        return Ok(());
    }
    // Not root: a user namespace owns the new network namespace, with this
    // process's own ids mapped to themselves (the sandbox nests in it).
    // SAFETY: as above; the process is single-threaded.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } != 0 {
        return Err(failed("make the installer's network")(std::io::Error::last_os_error()));
    }
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(failed(format!("map ids for the installer's network ({file})")))
    };
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("setgroups", "deny".into())?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// `ip link set lo up`, by ioctl.
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: socket with constant arguments; the descriptor is owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new descriptor nothing else owns.
    let socket: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo") {
        *slot = *byte as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the ifreq given.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
