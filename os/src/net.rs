//! Unix sockets: file descriptors passed with a message (`SCM_RIGHTS`), a connect that gives
//! up at a deadline, whether the peer hung up, and who the peer is (`SO_PEERCRED`).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io;

/// Sends `bytes` on a connected stream socket with `fds` attached (`SCM_RIGHTS`).
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(rustix::io::Errno::NOBUFS.into());
    }
    let mut sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    while sent < bytes.len() {
        sent += rustix::net::send(sock, &bytes[sent..], SendFlags::NOSIGNAL)?;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and any fds attached to them.
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok((msg.bytes, fds))
}

/// Connects to the Unix stream socket at `path`, giving up with `TimedOut` at `deadline`. A
/// blocking `connect` waits as long as the listener's queue is full, which is for ever when the
/// process behind it is stopped (SIGSTOP, a debugger): this one connects without blocking and
/// tries again until the deadline. The stream it returns is blocking.
pub fn connect_by(
    path: &std::path::Path,
    deadline: std::time::Instant,
) -> std::io::Result<std::os::unix::net::UnixStream> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let addr = SocketAddrUnix::new(path)?;
    loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => {
                let stream = std::os::unix::net::UnixStream::from(fd);
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            // The listener's queue is full (a Unix socket's connect never says EINPROGRESS).
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                if std::time::Instant::now() >= deadline {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether the other end of a connected socket has closed (or the socket failed), without
/// reading or blocking: what a producer asks of a rank's old connection before it refuses its
/// restarted incarnation as "already running".
pub fn peer_hung_up(sock: impl AsFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &sock,
        rustix::event::PollFlags::RDHUP,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|_| {
        fds[0].revents().intersects(
            rustix::event::PollFlags::RDHUP
                | rustix::event::PollFlags::HUP
                | rustix::event::PollFlags::ERR,
        )
    })
}

/// The uid of the process at the other end of a Unix socket (`SO_PEERCRED`).
pub fn peer_uid(sock: impl AsFd) -> io::Result<u32> {
    Ok(peer_cred(sock)?.uid)
}

/// Who is at the other end of a Unix socket, as the kernel recorded it when the socket
/// connected (`SO_PEERCRED`), not as the peer claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Its pid.
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
}

/// [`PeerCred`] of a connected Unix socket.
pub fn peer_cred(sock: impl AsFd) -> io::Result<PeerCred> {
    let cred = rustix::net::sockopt::socket_peercred(sock)?;
    Ok(PeerCred {
        pid: u32::try_from(cred.pid.as_raw_nonzero().get()).unwrap_or(0),
        uid: cred.uid.as_raw(),
    })
}

pub use crate::process::my_uid;

/// Whether something is waiting to be read on `sock`, without reading it or blocking:
/// `Some(0)` when the peer has closed it, `Some(n)` when bytes are pending, `None` when
/// nothing is (yet).
pub fn pending(sock: impl AsFd) -> io::Result<Option<usize>> {
    let mut peek = [0u8; 1];
    match rustix::net::recv(sock, &mut peek, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Ok((n, _)) => Ok(Some(n)),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Why [`bind_private`] could not listen on a path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// Something that is not a socket is at the path: it is left as it is.
    #[error("a file that is not a socket is in the way; refusing to replace it")]
    NotASocket,
    /// A live process answers on the socket at the path.
    #[error("another process is serving on it")]
    InUse,
    /// A step failed: `what` says which.
    #[error("{what}: {source}")]
    Os {
        /// The step ("cannot remove the stale socket", "cannot set mode 0600", ...).
        what: &'static str,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

/// Listens on the Unix socket `path`, mode 0600, non-blocking (for [`accept_loop`]): the one
/// policy every ladle server follows for a socket file left behind. A socket file nobody
/// answers on (its server died) is replaced; one a live process answers on is
/// [`BindError::InUse`]; anything at `path` that is not a socket is [`BindError::NotASocket`]
/// and is left alone.
pub fn bind_private(path: &std::path::Path) -> Result<std::os::unix::net::UnixListener, BindError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use std::os::unix::net::{UnixListener, UnixStream};
    let os = |what| move |source| BindError::Os { what, source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket);
        }
        if UnixStream::connect(path).is_ok() {
            return Err(BindError::InUse);
        }
        std::fs::remove_file(path).map_err(os("cannot remove the stale socket"))?;
    }
    let listener = UnixListener::bind(path).map_err(os("cannot bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(os("cannot set mode 0600"))?;
    listener
        .set_nonblocking(true)
        .map_err(os("cannot make the listener non-blocking"))?;
    Ok(listener)
}

/// Waits at most `timeout` for `fd` to be readable (data, a connection to accept, a hang-up or
/// an error: what the read that follows finds out). `Ok(false)`: the time ran out, or a
/// signal interrupted the wait; look again.
pub fn wait_readable(fd: impl AsFd, timeout: Duration) -> io::Result<bool> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The one accept loop of every ladle server: accepts connections on `listener` (from
/// [`bind_private`]: non-blocking) until `stop` is set, looking at it at least every `poll`
/// (so stopping depends neither on a client nor on the socket file), and hands each to
/// `accept` as a blocking stream. When accepting fails (out of file descriptors: the
/// connection stays queued, and retrying at once would spin) it backs off `poll` at a time,
/// saying so once per episode, naming `what` it serves.
pub fn accept_loop(
    listener: &std::os::unix::net::UnixListener,
    stop: &std::sync::atomic::AtomicBool,
    poll: Duration,
    what: &str,
    mut accept: impl FnMut(std::os::unix::net::UnixStream),
) {
    let mut failing_since: Option<std::time::Instant> = None;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        if !wait_readable(listener, poll).unwrap_or(false) {
            continue;
        }
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                if failing_since.is_none() {
                    tracing::warn!("cannot accept a connection to {what} ({e}); backing off");
                }
                failing_since.get_or_insert_with(std::time::Instant::now);
                std::thread::sleep(poll);
                continue;
            }
        };
        if let Some(since) = failing_since.take() {
            tracing::info!(
                "{what} accepts connections again after {:.1} s",
                since.elapsed().as_secs_f64()
            );
        }
        // Accepted sockets do not inherit O_NONBLOCK on Linux; make sure.
        let _ = conn.set_nonblocking(false);
        accept(conn);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn bind_private_replaces_a_dead_socket_refuses_a_live_one_and_leaves_other_files_alone() {
        let dir = std::env::temp_dir().join(format!("ladle-os-bind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        // A file that is not a socket: refused, and left as it was.
        std::fs::write(&path, "my notes").unwrap();
        assert!(matches!(bind_private(&path), Err(BindError::NotASocket)));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "my notes");
        std::fs::remove_file(&path).unwrap();
        // A live server's socket: refused; the live one keeps serving.
        let live = bind_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(bind_private(&path), Err(BindError::InUse)));
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        // The same socket file once its server is gone: replaced.
        drop(live);
        assert!(path.exists(), "a dropped listener leaves its file");
        let again = bind_private(&path).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
