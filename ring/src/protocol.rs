//! The control protocol: typed, versioned, length-prefixed messages on a Unix stream socket.
//!
//! A frame is a little-endian `u32` length followed by that many bytes of JSON (one
//! [`ClientMessage`] or [`ServerMessage`]). Frames above [`MAX_FRAME`] bytes, bytes that are
//! not a message, and a `Hello` of another [`PROTOCOL_VERSION`] close that one connection.
//! The producer's `Welcome` carries two file descriptors (`SCM_RIGHTS`): the ring file and
//! the consumer's cursor page.
//!
//! ```text
//! consumer                         producer
//!   Hello{version, batch_size, …} ─►
//!                                 ◄─ Welcome{layout, dataset, start_seq} + [ring fd, cursor fd]
//!                                 ◄─ End{reason} | Detached{reason}   (any time)
//!   Leave                         ─►  (or just close: EOF is a leave)
//! ```

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;
use crate::layout::RingLayout;
use crate::sys;

/// Version of this protocol; both sides must speak the same.
pub const PROTOCOL_VERSION: u32 = 2;

/// The largest frame either side accepts.
pub const MAX_FRAME: usize = 64 * 1024;

/// A consumer's request to join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the consumer.
    pub version: u32,
    /// Samples per batch, `1..=capacity/2`.
    pub batch_size: u32,
    /// Drop the last, partial batch of each epoch.
    pub drop_last: bool,
    /// A name for logs (e.g. the run's name).
    pub name: String,
    /// The consumer's process id, for logs.
    pub pid: u32,
}

/// What the producer tells a consumer about the dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// Samples per epoch (`N`).
    pub len: u64,
    /// Class names; labels index into them.
    pub class_names: Vec<String>,
    /// Where the producer reads from, for logs.
    pub source: String,
}

/// The producer's acceptance of a consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// [`PROTOCOL_VERSION`] of the producer.
    pub version: u32,
    /// The consumer's id in the producer's logs.
    pub consumer_id: u64,
    /// The ring's shape.
    pub layout: RingLayout,
    /// The dataset.
    pub dataset: DatasetInfo,
    /// The consumer's first sample: its epochs are `[start + k·N, start + (k+1)·N)`.
    pub start_seq: u64,
}

/// Consumer → producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ClientMessage {
    /// Join.
    Hello(Hello),
    /// Leave now (closing the socket does the same).
    Leave,
}

/// Producer → consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ServerMessage {
    /// Joined; the ring and cursor fds come with this frame.
    Welcome(Welcome),
    /// Not admitted.
    Reject {
        /// Why, for the consumer's error message.
        reason: String,
    },
    /// The stream has ended (the producer is shutting down).
    End {
        /// Why.
        reason: String,
    },
    /// This consumer was detached (e.g. it fell too far behind).
    Detached {
        /// Why.
        reason: String,
    },
}

/// Writes one message, with `fds` attached.
pub fn send<M: Serialize>(
    sock: &UnixStream,
    message: &M,
    fds: &[BorrowedFd<'_>],
) -> Result<(), ProtocolError> {
    let body = serde_json::to_vec(message).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(ProtocolError::Oversize {
            len: body.len() as u64,
            max: MAX_FRAME,
        });
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    sys::send_with_fds(sock.as_fd(), &frame, fds).map_err(|e| ProtocolError::Io(e.into()))
}

/// Reads exactly `buf.len()` bytes, collecting any fds that arrive with them.
fn read_exact_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> Result<(), ProtocolError> {
    let mut have = 0;
    while have < buf.len() {
        match sys::recv_with_fds(sock.as_fd(), &mut buf[have..]) {
            Ok((0, _)) => return Err(ProtocolError::Closed),
            Ok((n, received)) => {
                have += n;
                fds.extend(received);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(ProtocolError::Io(e.into())),
        }
    }
    Ok(())
}

/// Reads one message and the fds that came with it.
pub fn recv<M: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
) -> Result<(M, Vec<OwnedFd>), ProtocolError> {
    let mut fds = Vec::new();
    let mut len = [0u8; 4];
    read_exact_with_fds(sock, &mut len, &mut fds)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::Oversize {
            len: len as u64,
            max: MAX_FRAME,
        });
    }
    let mut body = vec![0u8; len];
    read_exact_with_fds(sock, &mut body, &mut fds)?;
    let message =
        serde_json::from_slice(&body).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    Ok((message, fds))
}

/// Whether the peer has closed the socket or sent something, without blocking: `Ok(None)`
/// when nothing is pending, `Ok(Some(msg))` for a waiting message, an error on EOF.
pub fn poll<M: for<'de> Deserialize<'de>>(sock: &UnixStream) -> Result<Option<M>, ProtocolError> {
    let mut peek = [0u8; 1];
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    let pending = rustix::net::recv(sock, &mut peek, flags).map(|(n, _)| n);
    match pending {
        Ok(0) => Err(ProtocolError::Closed),
        Ok(_) => recv::<M>(sock).map(|(m, _)| Some(m)),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Ok(None),
        Err(e) => Err(ProtocolError::Io(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn hello() -> ClientMessage {
        ClientMessage::Hello(Hello {
            version: PROTOCOL_VERSION,
            batch_size: 32,
            drop_last: false,
            name: "t".into(),
            pid: 1,
        })
    }

    #[test]
    fn messages_round_trip_with_their_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let memfd = sys::memfd("t", 4096).unwrap();
        send(&a, &hello(), &[memfd.as_fd()]).unwrap();
        let (msg, fds): (ClientMessage, _) = recv(&b).unwrap();
        assert_eq!(msg, hello());
        assert_eq!(fds.len(), 1);
        assert_eq!(sys::file_len(fds[0].as_fd()).unwrap(), 4096);
    }

    #[test]
    fn oversize_garbage_and_eof_are_typed_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&(MAX_FRAME as u32 + 1).to_le_bytes()).unwrap();
        assert!(matches!(
            recv::<ClientMessage>(&b),
            Err(ProtocolError::Oversize { .. })
        ));
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&5u32.to_le_bytes()).unwrap();
        a.write_all(b"\x00garb").unwrap();
        assert!(matches!(
            recv::<ClientMessage>(&b),
            Err(ProtocolError::Malformed(_))
        ));
        drop(a);
        assert!(matches!(
            recv::<ClientMessage>(&b),
            Err(ProtocolError::Closed)
        ));
    }

    #[test]
    fn poll_sees_nothing_then_a_message_then_eof() {
        let (a, b) = UnixStream::pair().unwrap();
        assert!(poll::<ServerMessage>(&b).unwrap().is_none());
        send(
            &a,
            &ServerMessage::End {
                reason: "bye".into(),
            },
            &[],
        )
        .unwrap();
        assert!(matches!(
            poll::<ServerMessage>(&b).unwrap(),
            Some(ServerMessage::End { .. })
        ));
        drop(a);
        assert!(matches!(
            poll::<ServerMessage>(&b),
            Err(ProtocolError::Closed)
        ));
    }
}
