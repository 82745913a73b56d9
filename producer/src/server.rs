//! The control server: admits consumers on a Unix socket and notices when they go.

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ladle_ring::protocol::{self, ClientMessage, Hello, PROTOCOL_VERSION, ServerMessage, Welcome};
use ladle_ring::{CursorPage, ProtocolError, sys};

use crate::{Member, ProducerError, Shared};

/// How long a new connection has to say `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `path` with mode 0600. A socket file left by a dead producer is replaced; one that a
/// live producer answers on is an error.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, ProducerError> {
    let fail = |reason: String| ProducerError::Socket {
        path: path.into(),
        reason,
    };
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(fail("another producer is serving on it".into()));
        }
        std::fs::remove_file(path)
            .map_err(|e| fail(format!("cannot remove the stale socket: {e}")))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| fail(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| fail(format!("cannot set mode 0600: {e}")))?;
    Ok(listener)
}

/// Unblocks the accept loop so that it sees the stop flag.
pub(crate) fn wake_listener(path: &Path) {
    let _ = UnixStream::connect(path);
}

/// Accepts connections until the producer stops; one thread per consumer connection.
pub(crate) fn serve(listener: UnixListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("ladle-consumer-conn".into())
            .spawn(move || handle(conn, &shared));
        if let Err(e) = spawned {
            tracing::error!("cannot start a connection thread: {e}");
        }
    }
}

/// Admits one consumer, then waits for it to leave (message or EOF).
fn handle(conn: UnixStream, shared: &Shared) {
    let id = match admit(&conn, shared) {
        Ok(id) => id,
        Err(reason) => {
            tracing::warn!("refused a connection: {reason}");
            let _ = protocol::send(&conn, &ServerMessage::Reject { reason }, &[]);
            return;
        }
    };
    // Consumers send nothing after Hello but Leave; any frame, EOF or error ends them.
    let why = match protocol::recv::<ClientMessage>(&conn) {
        Ok((ClientMessage::Leave, _)) => "left".to_owned(),
        Ok((ClientMessage::Hello(_), _)) => "sent a second Hello".to_owned(),
        Err(ProtocolError::Closed) => "connection closed".to_owned(),
        Err(e) => format!("protocol error: {e}"),
    };
    shared.remove(id, &why);
}

/// Checks the peer and its `Hello`, registers it and sends `Welcome` with the fds.
fn admit(conn: &UnixStream, shared: &Shared) -> Result<u64, String> {
    let peer = sys::peer_uid(conn).map_err(|e| format!("SO_PEERCRED failed: {e}"))?;
    if peer != sys::my_uid() {
        return Err(format!("peer uid {peer} is not ours ({})", sys::my_uid()));
    }
    conn.set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let hello = match protocol::recv::<ClientMessage>(conn) {
        Ok((ClientMessage::Hello(hello), _)) => hello,
        Ok((other, _)) => return Err(format!("expected Hello, got {other:?}")),
        Err(e) => return Err(e.to_string()),
    };
    conn.set_read_timeout(None).map_err(|e| e.to_string())?;
    let Hello {
        version,
        batch_size,
        name,
        pid,
        ..
    } = hello;
    if version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version mismatch: the producer speaks {PROTOCOL_VERSION}, {name:?} speaks {version}"
        ));
    }
    let layout = *shared.ring.layout();
    if batch_size == 0 || u64::from(batch_size) > layout.max_batch() {
        return Err(format!(
            "batch size {batch_size} is outside 1..={} (half the ring's {} samples)",
            layout.max_batch(),
            layout.capacity
        ));
    }
    let socket = conn.try_clone().map_err(|e| e.to_string())?;
    let mut state = shared.lock();
    let start = state.next_seq;
    let cursor = CursorPage::create(start).map_err(|e| e.to_string())?;
    let id = state.next_id;
    state.next_id += 1;
    let welcome = Welcome {
        version: PROTOCOL_VERSION,
        consumer_id: id,
        layout,
        dataset: shared.info.clone(),
        start_seq: start,
    };
    let cursor_fd = cursor.fd().ok_or("cursor page without a file")?;
    protocol::send(
        conn,
        &ServerMessage::Welcome(welcome),
        &[shared.ring.fd(), cursor_fd.as_fd()],
    )
    .map_err(|e| e.to_string())?;
    state.cuts.add(start % shared.info.len);
    tracing::info!(consumer = id, %name, pid, batch_size, start, "consumer joined");
    state.members.push(Member {
        id,
        name,
        start,
        cursor: Arc::new(cursor),
        socket,
    });
    drop(state);
    shared.changed.notify_all();
    Ok(id)
}
