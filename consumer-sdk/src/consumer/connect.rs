//! Connecting: the socket, the peer check, `Hello`, a group's wait, `Welcome` and the
//! mappings.

use super::*;
use crate::error::LocalRanks;
use crate::launch::{self, Found};
use ladle_ring::protocol::{ClassNamesReceiver, Welcome};

/// Connects to `socket`, retrying for up to `wait` while no file exists there yet (a feed
/// still starting); any other error, a refused connection included, is returned at once.
/// Returns the stream and the deadline of the handshake: `handshake` from the attempt that
/// found the socket, which bounds that connect too (a stopped producer's full queue).
fn connect_waiting(
    socket: &Path,
    wait: Duration,
    handshake: Duration,
) -> std::io::Result<(UnixStream, Instant)> {
    let waited = Instant::now() + wait;
    loop {
        let deadline = Instant::now() + handshake;
        match sys::connect_by(socket, deadline) {
            Err(e) if e.kind() == ErrorKind::NotFound && Instant::now() < waited => {
                let left = waited.saturating_duration_since(Instant::now());
                std::thread::sleep(left.min(Duration::from_millis(50)));
            }
            other => return other.map(|sock| (sock, deadline)),
        }
    }
}

/// Reads the producer's answer to `Hello`: the first frame, or for a rank of a group the
/// first after its `GroupWaiting`s, each of which moves the deadline to the group timeout
/// (from `started`) plus a handshake timeout. `Err(Ok(_))` is a protocol error for the
/// caller to classify; `Err(Err(_))` is [`ConnectError::GroupIncomplete`].
fn receive_welcome(
    sock: &UnixStream,
    socket: &Path,
    config: &ConsumerConfig,
    local: Option<&Found>,
    started: Instant,
    mut deadline: Instant,
    names: &mut ClassNamesReceiver,
) -> Result<(ServerMessage, Vec<OwnedFd>), Result<ProtocolError, ConnectError>> {
    let Some(group) = &config.group else {
        return recv_gathering_names(sock, deadline, names).map_err(Ok);
    };
    let group_deadline =
        started + config.group_timeout.min(GROUP_WAIT_CAP) + config.handshake_timeout;
    let (local, local_from) = match local {
        Some((n, from)) => (*n, from.to_string()),
        None => (group.world_size, launch::Origin::WorldSize.to_string()),
    };
    let mut joined = Vec::new();
    loop {
        match recv_gathering_names(sock, deadline, names) {
            Ok((ServerMessage::GroupWaiting { joined: now, .. }, _)) => {
                tracing::info!(group = %group.name, rank = group.rank, joined = ?now, world_size = group.world_size, local_world_size = local, "waiting for the other ranks of the group on this node");
                joined = now;
                deadline = group_deadline;
            }
            Ok((
                ServerMessage::GroupIncomplete {
                    missing,
                    waited_s,
                    arrived,
                    ..
                },
                _,
            )) => {
                return Err(Err(ConnectError::GroupIncomplete {
                    socket: socket.into(),
                    group: group.name.clone(),
                    missing,
                    world_size: group.world_size,
                    local: Box::new(LocalRanks {
                        arrived,
                        local_world_size: local,
                        local_from,
                    }),
                    waited: Duration::try_from_secs_f64(waited_s).unwrap_or_default(),
                }));
            }
            // No answer by the group's deadline: the ranks not heard of are the missing ones.
            Err(ProtocolError::Io(e))
                if !joined.is_empty()
                    && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                let missing = if local < group.world_size {
                    Vec::new()
                } else {
                    (0..group.world_size)
                        .filter(|r| !joined.contains(r))
                        .collect()
                };
                return Err(Err(ConnectError::GroupIncomplete {
                    socket: socket.into(),
                    group: group.name.clone(),
                    missing,
                    world_size: group.world_size,
                    local: Box::new(LocalRanks {
                        arrived: joined,
                        local_world_size: local,
                        local_from,
                    }),
                    waited: started.elapsed(),
                }));
            }
            other => return other.map_err(Ok),
        }
    }
}

/// The next answer that is not `ClassNames` (protocol version 10): those are gathered into
/// `names`, to be put back into the `Welcome`.
fn recv_gathering_names(
    sock: &UnixStream,
    deadline: Instant,
    names: &mut ClassNamesReceiver,
) -> Result<(ServerMessage, Vec<OwnedFd>), ProtocolError> {
    loop {
        match protocol::recv_by::<ServerMessage>(sock, deadline)? {
            (ServerMessage::ClassNames { total, names: some }, _) => names.add(total, some)?,
            other => return Ok(other),
        }
    }
}

/// The longest a rank waits for its group (the producer's cap, `MAX_GROUP_WAIT`).
const GROUP_WAIT_CAP: Duration = Duration::from_secs(3600);

impl Consumer {
    /// Connects to the producer listening on `socket`, checks that it runs as our user, says
    /// `Hello` and maps the ring it hands over.
    ///
    /// Fails with a [`ConnectError`] naming the socket: no socket there, nobody listening, a
    /// foreign peer, a rejection, a version mismatch, a batch size outside
    /// `1..=capacity/2`, no `Welcome` within [`ConsumerConfig::handshake_timeout`] of
    /// connecting (however slowly it trickles in), shared memory that cannot be mapped or
    /// whose size is not sealed, or a start whose first epoch runs past sequence 2^64.
    pub fn connect(socket: impl AsRef<Path>, config: ConsumerConfig) -> Result<Self, ConnectError> {
        let socket = socket.as_ref().to_path_buf();
        if config.batch_size == 0 {
            return Err(ConnectError::ZeroBatchSize { socket });
        }
        if config.max_batches_held == 0 {
            return Err(ConnectError::ZeroMaxBatchesHeld { socket });
        }
        let started = std::time::Instant::now();
        let timeout = config.handshake_timeout.max(Duration::from_millis(1));
        let (sock, deadline) = open_checked(&socket, &config, started, timeout)?;
        let local = match &config.group {
            Some(g) => Some(
                launch::local_world_size(
                    config.local_world_size,
                    g.world_size,
                    launch::process_env,
                )
                .map_err(|source| ConnectError::Launch {
                    socket: socket.clone(),
                    group: g.name.clone(),
                    source,
                })?,
            ),
            None => None,
        };
        let (welcome, fds) = handshake(
            &sock,
            &socket,
            &config,
            local.as_ref(),
            started,
            deadline,
            timeout,
        )?;
        let (ring, cursor) = map_welcome(&socket, &config, &welcome, fds)?;
        tracing::info!(
            socket = %socket.display(),
            consumer_id = welcome.consumer_id,
            start_seq = welcome.start_seq,
            dataset_len = welcome.dataset.len,
            batch_size = config.batch_size,
            "joined the producer"
        );
        let start_seq = welcome.start_seq;
        // A bit per sample for the epoch's record: a length no memory holds is refused, not an
        // abort (it comes from another process).
        let len = welcome.dataset.len;
        let epochs = Epochs::new(
            len,
            start_seq,
            config.group.clone(),
            config.batch_size,
            config.drop_last,
        );
        let epochs = match epochs {
            Ok(epochs) => epochs,
            Err(PlanError::DatasetTooLong { .. } | PlanError::OutOfMemory { .. }) => {
                return Err(ConnectError::DatasetTooLarge { socket, len });
            }
            Err(source) => return Err(ConnectError::Group { socket, source }),
        };
        Ok(Self {
            socket,
            sock: Mutex::new(sock),
            ring,
            cursor,
            config,
            consumer_id: welcome.consumer_id,
            dataset: welcome.dataset,
            identity: welcome.identity,
            start_seq,
            state: Mutex::new(State {
                next_seq: start_seq,
                held: BTreeSet::new(),
                released: start_seq,
                fatal: None,
                epochs,
                generation: 0,
                skimming: Default::default(),
                pace: None,
                rejoins: 0,
                skims: 0,
            }),
            catching_up: Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Connects to the producer whose control socket `$LADLE_SOCKET`
    /// ([`SOCKET_ENV`](crate::SOCKET_ENV)) names, as [`Consumer::connect`] does: what a run of
    /// `ladle sweep` (or a scheduler job of a feed) calls, so that a training script needs no
    /// socket flag. The default [`ConsumerConfig::name`] is already `$LADLE_RUN`
    /// ([`RUN_ENV`](crate::RUN_ENV)) when set.
    ///
    /// Fails with [`ConnectError::NoSocket`], naming the variable, when it is unset or empty,
    /// and otherwise as [`Consumer::connect`] does.
    ///
    /// ```no_run
    /// use ladle_consumer::prelude::*;
    ///
    /// # fn main() -> Result<(), ConnectError> {
    /// let config = ConsumerConfig { batch_size: 64, ..ConsumerConfig::default() };
    /// let consumer = Consumer::connect_from_env(config)?;
    /// println!("{} joined {}", consumer.config().name, consumer.socket().display());
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect_from_env(config: ConsumerConfig) -> Result<Self, ConnectError> {
        let socket = config::socket_from_env(std::env::var_os(config::SOCKET_ENV).as_deref())?;
        Self::connect(socket, config)
    }
}

/// Connects to `socket` (waiting for it as `config` says) and checks that the peer runs as
/// our user; returns the stream, with what is left of the handshake's time as its write
/// timeout, and the handshake's deadline.
fn open_checked(
    socket: &Path,
    config: &ConsumerConfig,
    started: Instant,
    timeout: Duration,
) -> Result<(UnixStream, Instant), ConnectError> {
    let connected = connect_waiting(socket, config.connect_timeout, timeout);
    let (sock, deadline) = match connected {
        Ok(connected) => connected,
        Err(e) if e.kind() == ErrorKind::NotFound && config.connect_timeout.is_zero() => {
            return Err(ConnectError::SocketMissing {
                socket: socket.to_owned(),
            });
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(ConnectError::SocketNeverAppeared {
                socket: socket.to_owned(),
                waited: started.elapsed(),
            });
        }
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            return Err(ConnectError::NoProducer {
                socket: socket.to_owned(),
            });
        }
        Err(e) if e.kind() == ErrorKind::TimedOut => {
            return Err(ConnectError::HandshakeTimeout {
                socket: socket.to_owned(),
                timeout,
            });
        }
        Err(source) => {
            return Err(ConnectError::Connect {
                socket: socket.to_owned(),
                source,
            });
        }
    };
    let ours = sys::my_uid();
    let peer = match sys::peer_uid(&sock) {
        Ok(peer) => peer,
        Err(e) => {
            return Err(ConnectError::Connect {
                socket: socket.to_owned(),
                source: e,
            });
        }
    };
    if peer != ours {
        return Err(ConnectError::ForeignPeer {
            socket: socket.to_owned(),
            peer,
            ours,
        });
    }
    // Sending `Hello` gets what is left of the handshake's time; reading `Welcome` is
    // bounded by the deadline however the bytes trickle in (`recv_by`).
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    if let Err(source) = sock.set_write_timeout(Some(left)) {
        return Err(ConnectError::Connect {
            socket: socket.to_owned(),
            source,
        });
    }

    Ok((sock, deadline))
}

/// Says `Hello` and reads the producer's `Welcome` (with the ring's file descriptors) by
/// `deadline`; a refusal, another answer or another protocol version is an error.
fn handshake(
    sock: &UnixStream,
    socket: &Path,
    config: &ConsumerConfig,
    local: Option<&Found>,
    started: Instant,
    deadline: Instant,
    timeout: Duration,
) -> Result<(Welcome, Vec<OwnedFd>), ConnectError> {
    let hello = ClientMessage::Hello(Hello {
        version: PROTOCOL_VERSION,
        batch_size: config.batch_size,
        drop_last: config.drop_last,
        name: config.name.clone(),
        pid: std::process::id(),
        group: config.group.as_ref().map(|g| GroupHello {
            name: g.name.clone(),
            rank: g.rank,
            world_size: g.world_size,
            local_world_size: local.map_or(g.world_size, |(n, _)| *n),
            timeout_ms: u64::try_from(config.group_timeout.as_millis()).unwrap_or(u64::MAX),
        }),
    });
    let handshake_error = |source: ProtocolError, socket: PathBuf| match source {
        ProtocolError::Io(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            ConnectError::HandshakeTimeout {
                socket: socket.to_owned(),
                timeout,
            }
        }
        source => ConnectError::Protocol {
            socket: socket.to_owned(),
            source,
        },
    };
    if let Err(e) = protocol::send(sock, &hello, &[]) {
        return Err(handshake_error(e, socket.to_owned()));
    }
    let mut names = ClassNamesReceiver::default();
    let (message, fds) =
        match receive_welcome(sock, socket, config, local, started, deadline, &mut names) {
            Ok(received) => received,
            Err(Ok(e)) => return Err(handshake_error(e, socket.to_owned())),
            Err(Err(e)) => return Err(e),
        };
    // From here on the timeouts bound the reading (and writing) of one frame that has
    // begun to arrive.
    if let Err(source) = sock
        .set_read_timeout(Some(timeout))
        .and_then(|()| sock.set_write_timeout(Some(timeout)))
    {
        return Err(ConnectError::Connect {
            socket: socket.to_owned(),
            source,
        });
    }
    let mut welcome = match message {
        ServerMessage::Welcome(welcome) => welcome,
        ServerMessage::Reject { reason }
        | ServerMessage::End { reason }
        | ServerMessage::Detached { reason } => {
            return Err(ConnectError::Rejected {
                socket: socket.to_owned(),
                reason,
            });
        }
        ServerMessage::Rejoined { .. }
        | ServerMessage::Stats(_)
        | ServerMessage::ClassNames { .. }
        | ServerMessage::GroupWaiting { .. }
        | ServerMessage::GroupIncomplete { .. }
        | ServerMessage::GroupBroken { .. }
        | ServerMessage::Declared { .. } => {
            return Err(ConnectError::Protocol {
                socket: socket.to_owned(),
                source: ProtocolError::Malformed("an answer other than Welcome".into()),
            });
        }
    };
    if welcome.version != PROTOCOL_VERSION {
        return Err(ConnectError::Version {
            socket: socket.to_owned(),
            ours: PROTOCOL_VERSION,
            theirs: welcome.version,
        });
    }
    names
        .finish(&mut welcome)
        .map_err(|source| ConnectError::Protocol {
            socket: socket.to_owned(),
            source,
        })?;
    Ok((welcome, fds))
}

/// Checks what `welcome` describes (layout, batch size, dataset length, sealed sizes) and
/// maps the ring and the cursor page it hands over in `fds`.
fn map_welcome(
    socket: &Path,
    config: &ConsumerConfig,
    welcome: &Welcome,
    fds: Vec<OwnedFd>,
) -> Result<(ConsumerRing, CursorPage), ConnectError> {
    let [ring_fd, cursor_fd]: [OwnedFd; 2] = match fds.try_into() {
        Ok(fds) => fds,
        Err(fds) => {
            return Err(ConnectError::MissingFds {
                socket: socket.to_owned(),
                got: fds.len(),
            });
        }
    };
    // Re-validate the shape: a zero capacity or odd granule must not reach the slot math.
    let sent = welcome.layout.clone();
    let layout = match RingLayout::new(sent.capacity, sent.schema) {
        Ok(layout) => layout,
        Err(source) => {
            return Err(ConnectError::Layout {
                socket: socket.to_owned(),
                source,
            });
        }
    };
    if u64::from(config.batch_size) > layout.max_batch() {
        return Err(ConnectError::BatchTooLarge {
            socket: socket.to_owned(),
            batch_size: config.batch_size,
            max: layout.max_batch(),
        });
    }
    if welcome.dataset.len == 0 {
        return Err(ConnectError::EmptyDataset {
            socket: socket.to_owned(),
        });
    }
    if welcome.start_seq.checked_add(welcome.dataset.len).is_none() {
        return Err(ConnectError::SequenceOverflow {
            socket: socket.to_owned(),
            start_seq: welcome.start_seq,
            len: welcome.dataset.len,
        });
    }
    // Only memory whose size is sealed: a file the producer could shrink under the mapping
    // would kill this process with SIGBUS at its next read.
    for (fd, file) in [(&ring_fd, "ring"), (&cursor_fd, "cursor page")] {
        if !shm::size_sealed(fd.as_fd()) {
            return Err(ConnectError::UnsealedMemory {
                socket: socket.to_owned(),
                file,
            });
        }
    }
    let mapped = ConsumerRing::map(ring_fd.as_fd(), layout)
        .and_then(|ring| Ok((ring, CursorPage::map(cursor_fd.as_fd())?)));
    let (ring, cursor) = match mapped {
        Ok(mapped) => mapped,
        Err(source) => {
            return Err(ConnectError::Shm {
                socket: socket.to_owned(),
                source,
            });
        }
    };
    Ok((ring, cursor))
}
