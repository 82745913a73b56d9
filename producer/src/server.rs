//! The control server: admits consumers on a Unix socket and notices when they go.
//!
//! One thread per connection, at most [`ProducerConfig::max_connections`](crate::ProducerConfig)
//! of them (more are refused with a reason); a new connection has [`HELLO_TIMEOUT`] in all to
//! say `Hello`, however slowly its bytes arrive. The accept loop polls the listener with a
//! timeout, so it sees the stop flag without anyone connecting (stopping does not depend on
//! the socket file), and backs off when the process is out of file descriptors instead of
//! spinning on a connection it cannot accept.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ladle_ring::protocol::{
    self, ClientMessage, DatasetInfo, GroupHello, Hello, MAX_WORLD_SIZE, PROTOCOL_VERSION,
    ServerMessage, Welcome,
};
use ladle_ring::{CursorPage, ProtocolError, sys};

use crate::ProducerError;
use crate::members::{Member, Shared};

/// How long a new connection has, in all, to say `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Characters of a consumer's name kept for logs.
pub const MAX_NAME: usize = 128;

/// The longest a rank waits for the rest of its group, whatever it asks for.
pub const MAX_GROUP_WAIT: Duration = Duration::from_secs(3600);

/// How often a waiting rank looks at its connection and the stop flag.
const GROUP_POLL: Duration = Duration::from_millis(100);

/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// Binds `path` with mode 0600, by the one policy of `ladle_os::net::bind_private`: a socket
/// file left by a dead producer is replaced; one that a live producer answers on is an error,
/// and so is anything at `path` that is not a socket (it is left as it is).
pub(crate) fn bind(path: &Path) -> Result<UnixListener, ProducerError> {
    ladle_os::net::bind_private(path).map_err(|e| ProducerError::Socket {
        path: path.into(),
        reason: match e {
            ladle_os::net::BindError::InUse => "another producer is serving on it".into(),
            other => other.to_string(),
        },
    })
}

/// Accepts connections until the producer stops; one thread per consumer connection, at most
/// `max_connections`.
pub(crate) fn serve(listener: UnixListener, shared: &Arc<Shared>) {
    ladle_os::net::accept_loop(
        &listener,
        &shared.stop,
        ACCEPT_POLL,
        "the producer",
        |conn| {
            let live = shared.connections.fetch_add(1, Ordering::SeqCst);
            if live >= shared.max_connections {
                shared.connections.fetch_sub(1, Ordering::SeqCst);
                let reason = format!(
                    "too many connections: this producer serves at most {}",
                    shared.max_connections
                );
                tracing::warn!("refused a connection: {reason}");
                let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
                let _ = protocol::send(&conn, &ServerMessage::Reject { reason }, &[]);
                return;
            }
            let for_thread = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("ladle-consumer-conn".into())
                .spawn(move || {
                    handle(&conn, &for_thread);
                    for_thread.connections.fetch_sub(1, Ordering::SeqCst);
                });
            if let Err(e) = spawned {
                // The connection went with the closure; its count goes too.
                shared.connections.fetch_sub(1, Ordering::SeqCst);
                tracing::error!("cannot start a connection thread: {e}");
            }
        },
    );
}

/// Admits one consumer, then serves its messages until it leaves (message or EOF).
fn handle(conn: &UnixStream, shared: &Shared) {
    let id = match admit(conn, shared) {
        Ok(id) => id,
        Err(Refusal::Gone) => {
            // A probe (`ladle serve` readiness checks do this) or a client that gave up.
            tracing::debug!("a connection closed before saying Hello");
            return;
        }
        Err(Refusal::Answered) => return,
        Err(Refusal::Reason(reason)) => {
            tracing::warn!("refused a connection: {reason}");
            let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = protocol::send(conn, &ServerMessage::Reject { reason }, &[]);
            return;
        }
    };
    let mut needs = protocol::NeedsReceiver::new(shared.info.len);
    let why = loop {
        match protocol::recv::<ClientMessage>(conn) {
            Ok((ClientMessage::Needs(frame), _)) => {
                if let Err(reason) = declare(shared, id, &mut needs, frame) {
                    shared.detach(&mut shared.lock(), id, &reason);
                    break reason;
                }
            }
            Ok((ClientMessage::Leave, _)) => {
                // Done, not broken: the other ranks of its group are not told.
                shared.lock().groups.left(id);
                break "left".to_owned();
            }
            Ok((ClientMessage::Rejoin, _)) => {
                if let Err(reason) = rejoin(shared, id) {
                    shared.detach(&mut shared.lock(), id, &reason);
                    break reason;
                }
            }
            Ok((ClientMessage::Skim, _)) => {
                if let Err(reason) = shared.skim(id) {
                    shared.detach(&mut shared.lock(), id, &reason);
                    break reason;
                }
            }
            Ok((ClientMessage::Hello(_), _)) => break "sent a second Hello".to_owned(),
            // Stats are asked for on a connection of their own (the producer also writes
            // End and Detached on this one, from other threads).
            Ok((ClientMessage::Stats, _)) => break "asked for stats while joined".to_owned(),
            Err(ProtocolError::Closed) => break "connection closed".to_owned(),
            Err(e) => break format!("protocol error: {e}"),
        }
    };
    shared.remove(id, &why);
}

/// A consumer's name as logs show it: at most [`MAX_NAME`] characters, quoted and escaped,
/// so that no name can forge a log line.
fn log_name(name: &str) -> String {
    let short: String = name.chars().take(MAX_NAME).collect();
    format!("{short:?}")
}

/// Why a connection was not admitted.
enum Refusal {
    /// It closed before saying `Hello`: nothing to tell it.
    Gone,
    /// It asked for stats instead, and has them.
    Answered,
    /// Told to the peer (`Reject`) and logged.
    Reason(String),
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Self::Reason(reason)
    }
}

impl From<&str> for Refusal {
    fn from(reason: &str) -> Self {
        Self::Reason(reason.to_owned())
    }
}

/// Checks the peer and its `Hello`, registers it and sends `Welcome` with the fds.
fn admit(conn: &UnixStream, shared: &Shared) -> Result<u64, Refusal> {
    let peer = sys::peer_uid(conn).map_err(|e| format!("SO_PEERCRED failed: {e}"))?;
    if peer != sys::my_uid() {
        return Err(format!("peer uid {peer} is not ours ({})", sys::my_uid()).into());
    }
    conn.set_write_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let hello = match protocol::recv_by::<ClientMessage>(conn, Instant::now() + HELLO_TIMEOUT) {
        Ok((ClientMessage::Hello(hello), _)) => hello,
        Ok((ClientMessage::Stats, _)) => {
            let mut stats = shared.stats();
            stats.fit_frame();
            let stats = ServerMessage::Stats(stats);
            return match protocol::send(conn, &stats, &[]) {
                Ok(()) => Err(Refusal::Answered),
                Err(e) => Err(format!("cannot send stats: {e}").into()),
            };
        }
        Ok((other, _)) => return Err(format!("expected Hello, got {other:?}").into()),
        Err(ProtocolError::Closed) => return Err(Refusal::Gone),
        Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
            return Err(format!("no Hello within {HELLO_TIMEOUT:?}").into());
        }
        Err(e) => return Err(format!("bad Hello: {e}").into()),
    };
    conn.set_read_timeout(None).map_err(|e| e.to_string())?;
    let Hello {
        version,
        batch_size,
        name,
        pid,
        group,
        ..
    } = hello;
    let name = log_name(&name);
    if version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version mismatch: the producer speaks {PROTOCOL_VERSION}, {name} speaks {version}"
        )
        .into());
    }
    let layout = shared.ring.layout();
    if batch_size == 0 || u64::from(batch_size) > layout.max_batch() {
        return Err(format!(
            "batch size {batch_size} is outside 1..={} (half the ring's {} samples)",
            layout.max_batch(),
            layout.capacity
        )
        .into());
    }
    // Class names that do not fit the Welcome's frame come before it (and before a group's
    // wait), within this handshake's write timeout.
    for frame in &shared.class_names.frames {
        protocol::send(conn, frame, &[]).map_err(|e| format!("cannot send class names: {e}"))?;
    }
    let socket = conn.try_clone().map_err(|e| e.to_string())?;
    let page = Arc::new(CursorPage::create(0).map_err(|e| e.to_string())?);
    if let Some(g) = &group {
        if g.local() > MAX_WORLD_SIZE {
            return Err(format!(
                "group {}: {} ranks are more than a feed takes ({MAX_WORLD_SIZE})",
                log_name(&g.name),
                g.local(),
            )
            .into());
        }
        if g.local() > g.world_size {
            return Err(format!(
                "group {}: {} ranks on this node are more than the world size {}",
                log_name(&g.name),
                g.local(),
                g.world_size,
            )
            .into());
        }
        if u64::from(g.world_size) > shared.info.len {
            return Err(format!(
                "group {}: {} ranks cannot split a dataset of {} samples",
                log_name(&g.name),
                g.world_size,
                shared.info.len
            )
            .into());
        }
    }
    let ticket = match &group {
        Some(g) => {
            // Nothing is to come while it waits: a byte that starts a frame is a leave, and
            // the rest of that frame gets a second, not for ever.
            conn.set_read_timeout(Some(Duration::from_secs(1)))
                .map_err(|e| e.to_string())?;
            let ticket = wait_for_group(conn, shared, g, &name)?;
            conn.set_read_timeout(None).map_err(|e| e.to_string())?;
            Some(ticket)
        }
        None => None,
    };
    let mut state = shared.lock();
    if shared.stop.load(Ordering::SeqCst) {
        // The feed decided to stop (its idle timeout) under this lock: the asker starts a
        // new one rather than joining one that ends.
        return Err(protocol::STOPPING.to_owned().into());
    }
    let id = state.next_id;
    state.next_id += 1;
    let start = state
        .readers
        .attach(&shared.ring, id, page.clone(), None)
        .map_err(|e| e.to_string())?;
    let welcome = Welcome {
        version: PROTOCOL_VERSION,
        consumer_id: id,
        layout: layout.clone(),
        dataset: if shared.class_names.inline {
            shared.info.clone()
        } else {
            DatasetInfo {
                len: shared.info.len,
                class_names: Vec::new(),
                source: shared.info.source.clone(),
            }
        },
        start_seq: start,
        identity: shared.identity.clone(),
    };
    let sent = match page.fd() {
        Some(cursor_fd) => protocol::send(
            conn,
            &ServerMessage::Welcome(welcome),
            &[shared.ring.fd(), cursor_fd.as_fd()],
        )
        .map_err(|e| e.to_string()),
        None => Err("cursor page without a file".to_owned()),
    };
    if let Err(e) = sent {
        state.readers.detach(id);
        if let (Some(g), Some(ticket)) = (&group, ticket) {
            if let Some((others, rank)) = state.groups.not_welcomed(&g.name, ticket, g.rank) {
                shared.tell_broken(&state, &g.name, &others, rank, "its Welcome failed");
            }
        }
        return Err(e.into());
    }
    state.cuts.add(start % shared.info.len);
    tracing::info!(consumer = id, name = %name, pid, batch_size, start, "consumer joined");
    state.members.push(Member::new(
        id,
        name,
        start,
        page,
        socket,
        (pid, batch_size),
    ));
    if let (Some(g), Some(ticket)) = (&group, ticket) {
        tracing::info!(consumer = id, group = %log_name(&g.name), rank = g.rank, world_size = g.world_size, "a rank of a group joined");
        if !state.groups.running(&g.name, ticket, g.rank, id) {
            let broken = ServerMessage::GroupBroken {
                rank: g.rank,
                reason: "another rank could not be welcomed".into(),
            };
            let _ = protocol::send(conn, &broken, &[]);
        }
    }
    shared.joins.fetch_add(1, Ordering::Relaxed);
    drop(state);
    shared.changed.notify_all();
    Ok(id)
}

/// How long a rank's `Hello` waits for the producer to read the end of the rank's old
/// incarnation, once that one has hung up.
const RESTART_PATIENCE: Duration = Duration::from_secs(10);

/// Holds a rank's `Welcome` until every rank of its group on this node has said `Hello`
/// (its `local_world_size`, protocol 15): tells it
/// `GroupWaiting` (again whenever the list of ranks changes), and at its deadline (its
/// `timeout_ms`, at most [`MAX_GROUP_WAIT`]) answers `GroupIncomplete` naming the missing
/// ranks. A rank whose connection closes while it waits stops counting. Returns its ticket
/// once the group is whole.
fn wait_for_group(
    conn: &UnixStream,
    shared: &Shared,
    g: &GroupHello,
    who: &str,
) -> Result<crate::groups::Ticket, Refusal> {
    use crate::groups::{Arrival, Standing};
    let started = Instant::now();
    let deadline = started + Duration::from_millis(g.timeout_ms).min(MAX_GROUP_WAIT);
    let group = log_name(&g.name);
    let arrival = {
        // A rank restarted at once (`torchrun --max-restarts`, or a job requeued with
        // another world size) can say `Hello` before this producer has read its old
        // incarnation's end. If a rank of the old one has hung up, its connection thread is
        // about to read the end (a `Leave`, or none: then the group broke); wait for it (the
        // wait ends as soon as that end is read) rather than refuse the rank as "already
        // running" or as disagreeing on the group's sizes.
        let patience = Instant::now() + RESTART_PATIENCE;
        let mut state = shared.lock();
        loop {
            let old_gone = (state.groups.running_ids(&g.name).into_iter())
                .filter_map(|old| state.members.iter().find(|m| m.id == old))
                .any(|m| sys::peer_hung_up(&m.socket));
            let left = patience.saturating_duration_since(Instant::now());
            if !old_gone || left.is_zero() {
                break;
            }
            state = (shared.changed)
                .wait_timeout(state, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        state
            .groups
            .arrive(&g.name, g.rank, g.world_size, g.local())?
    };
    shared.changed.notify_all();
    let ticket = match arrival {
        Arrival::Whole(ticket) => {
            tracing::info!(%group, who, rank = g.rank, "the group is whole");
            return Ok(ticket);
        }
        Arrival::Waiting(ticket, joined) => {
            tracing::info!(%group, who, rank = g.rank, ?joined, world_size = g.world_size, "a rank waits for its group");
            ticket
        }
    };
    let give_up = |refusal: Refusal| {
        let incomplete = shared.lock().groups.give_up(&g.name, ticket);
        shared.changed.notify_all();
        (incomplete, refusal)
    };
    let mut told = None;
    loop {
        let standing = shared.lock().groups.standing(&g.name, ticket);
        match standing {
            Standing::Released => return Ok(ticket),
            Standing::Unknown => {
                return Err(format!("group {group} broke while it was starting").into());
            }
            Standing::Waiting { joined, version } if told != Some(version) => {
                told = Some(version);
                let waiting = ServerMessage::GroupWaiting {
                    joined,
                    world_size: g.world_size,
                    local_world_size: g.local(),
                };
                if protocol::send(conn, &waiting, &[]).is_err() {
                    return Err(give_up(Refusal::Gone).1);
                }
            }
            Standing::Waiting { .. } => {}
        }
        if shared.stop.load(Ordering::SeqCst) {
            return Err(give_up("the producer is stopping".into()).1);
        }
        if Instant::now() >= deadline {
            let (incomplete, _) = give_up(Refusal::Answered);
            tracing::warn!(%group, who, rank = g.rank, missing = ?incomplete.missing, arrived = ?incomplete.arrived, local_world_size = incomplete.local, "a rank gave up waiting for its group");
            let incomplete = ServerMessage::GroupIncomplete {
                missing: incomplete.missing,
                waited_s: started.elapsed().as_secs_f64(),
                arrived: incomplete.arrived,
                local_world_size: incomplete.local,
            };
            let _ = protocol::send(conn, &incomplete, &[]);
            return Err(Refusal::Answered);
        }
        match protocol::poll::<ClientMessage>(conn) {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => {
                tracing::info!(%group, who, rank = g.rank, "a rank left while waiting for its group");
                return Err(give_up(Refusal::Gone).1);
            }
        }
        let state = shared.lock();
        let wait = GROUP_POLL.min(deadline.saturating_duration_since(Instant::now()));
        drop(shared.changed.wait_timeout(state, wait));
    }
}

/// Takes one frame of what consumer `id` still needs; installs the declaration once whole
/// and answers `Declared` (under the state lock, as every write to a member's socket).
fn declare(
    shared: &Shared,
    id: u64,
    receiver: &mut protocol::NeedsReceiver,
    frame: protocol::NeedsFrame,
) -> Result<(), String> {
    let declaration = frame.id;
    let Some(declared) = receiver.add(frame).map_err(|e| e.to_string())? else {
        return Ok(());
    };
    let mut state = shared.lock();
    let m = (state.members.iter_mut())
        .find(|m| m.id == id)
        .ok_or("a declaration from an unknown consumer")?;
    m.needs
        .declare(m.start, declared.from, declared.to, declared.words)?;
    protocol::send(&m.socket, &ServerMessage::Declared { id: declaration }, &[])
        .map_err(|e| format!("cannot answer Needs: {e}"))?;
    drop(state);
    // The feeder may be asleep on the read-ahead: what it may now skip changed.
    shared.changed.notify_all();
    Ok(())
}

/// Attaches a consumer that was let go again, at the producer's next sequence, and tells it
/// where (`Rejoined`). A consumer that is attached has nothing to rejoin: an error.
fn rejoin(shared: &Shared, id: u64) -> Result<(), String> {
    let mut state = shared.lock();
    let state = &mut *state;
    let m = state
        .members
        .iter_mut()
        .find(|m| m.id == id)
        .ok_or("rejoin from an unknown consumer")?;
    if m.attached {
        return Err("sent Rejoin while attached".into());
    }
    let was_skimming = std::mem::take(&mut m.skimming);
    m.skim_asked = false;
    let start = state
        .readers
        .attach(&shared.ring, id, m.page.clone(), None)
        .map_err(|e| e.to_string())?;
    m.start = start;
    m.attached = true;
    // What it declared was for its old attachment.
    m.needs.forget();
    if !was_skimming {
        m.rejoins += 1;
    }
    state.cuts.add(start % shared.info.len);
    protocol::send(
        &m.socket,
        &ServerMessage::Rejoined { start_seq: start },
        &[],
    )
    .map_err(|e| format!("cannot answer Rejoin: {e}"))?;
    if was_skimming {
        tracing::info!(
            consumer = id,
            name = %m.name,
            start,
            "consumer stops skimming: the feed no longer outruns it, it paces the feed again"
        );
    } else {
        tracing::info!(consumer = id, name = %m.name, start, "consumer rejoined");
    }
    shared.changed.notify_all();
    Ok(())
}
