//! The server's half of the installer's own network: receiving the
//! listener the helper made there (the helper's half, and the whole
//! design, are in `skillhost_sandbox::private_net`).

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

pub use skillhost_sandbox::private_net::{make_and_hand_over, PrivateNetError, NAMESPACE_PORT};

/// Server side: the listener the helper sent over `channel`, or why none
/// came (the helper failed first, and says why in its own output).
pub async fn receive(channel: UnixStream) -> std::io::Result<std::net::TcpListener> {
    channel.set_nonblocking(true)?;
    let channel = tokio::net::UnixStream::from_std(channel)?;
    loop {
        channel.readable().await?;
        let received = channel.try_io(tokio::io::Interest::READABLE, || {
            let mut byte = [0u8; 1];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let got = recvmsg(&channel, &mut [IoSliceMut::new(&mut byte)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
            let mut fds: Vec<OwnedFd> = Vec::new();
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = message {
                    fds.extend(received);
                }
            }
            Ok((got.bytes, fds))
        });
        match received {
            Ok((_, mut fds)) if fds.len() == 1 => {
                let fd = fds.remove(0);
                // Only a listening TCP socket is accepted as one.
                let listener = std::net::TcpListener::from(fd);
                listener.local_addr()?;
                return Ok(listener);
            }
            Ok((0, _)) => {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the helper sent no listener"))
            }
            Ok(_) => return Err(std::io::Error::other("the helper sent something other than one listener")),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(err) => return Err(err),
        }
    }
}
