//! The consumer: the handshake, epochs, and zero-copy batches that release on drop.

use std::collections::BTreeSet;
use std::fmt;
use std::io::ErrorKind;
use std::iter::FusedIterator;
use std::ops::Deref;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ladle_ring::protocol::{
    self, ClientMessage, DatasetInfo, FeedIdentity, GroupHello, Hello, ServerMessage,
};
use ladle_ring::{
    ConsumerRing, CursorPage, PROTOCOL_VERSION, ProtocolError, RingLayout, Schema, shm, sys,
};

use crate::config::{self, ConsumerConfig};
use crate::error::{ConnectError, ConsumerError, FieldError, ResumeError};
use crate::fields::{AlignedBytes, Element, FieldView, cast};
use crate::plan::{Bitmap, EpochPlan, Even, GroupSpec};
use crate::position::SavedPosition;

/// The longest dataset a consumer accepts (2^40 samples; its per-epoch record is then 128 GiB
/// of bits, so the real limit is memory).
pub const MAX_DATASET_LEN: u64 = 1 << 40;

/// How long one wait for the head sleeps before the control socket is checked again: a
/// producer that dies is noticed within about this long.
const POLL: Duration = Duration::from_millis(100);

/// A training process's connection to a producer: the control socket, the ring mapped
/// read-only, and this consumer's cursor page.
///
/// Read with [`Consumer::epoch`] (batches borrow the consumer) or, from an `Arc<Consumer>`,
/// with [`Consumer::shared_epoch`] (batches own a reference: what language bindings use).
/// Several batches can be held at once (up to [`ConsumerConfig::max_batches_held`]).
/// Dropping the consumer tells the producer it leaves. A `Consumer` is `Send` and `Sync`:
/// batches may be dropped on any thread, and threads sharing one epoch iterator each get
/// whole, distinct batches.
#[derive(Debug)]
pub struct Consumer {
    socket: PathBuf,
    /// Locked while a frame is read, so that two threads never split one.
    sock: Mutex<UnixStream>,
    ring: ConsumerRing,
    cursor: CursorPage,
    config: ConsumerConfig,
    consumer_id: u64,
    dataset: DatasetInfo,
    /// The feed's identity, which saved positions are checked against.
    identity: FeedIdentity,
    start_seq: u64,
    state: Mutex<State>,
    /// Held while a catch-up batch is gathered (one at a time; see [`Consumer::rejoin`]).
    catching_up: Mutex<()>,
}

// A consumer is shared by the batches of a `SharedEpoch`, which bindings hand to any thread.
const _: fn() = || {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Consumer>();
    send_and_sync::<SharedBatch>();
    send_and_sync::<SharedEpoch>();
};

/// What changes while batches are handed out and dropped. Locked only for bookkeeping, never
/// across a wait.
#[derive(Debug)]
struct State {
    /// The first sequence number not yet handed out (or skipped).
    next_seq: u64,
    /// The number the next [`Consumer::epoch`] call gives its epoch.
    next_epoch: u64,
    /// The epoch whose iterator is current; older iterators yield nothing more.
    current_epoch: Option<u64>,
    /// `first_seq` of every batch held, including one being waited for.
    held: BTreeSet<u64>,
    /// What the cursor page says was released.
    released: u64,
    /// The final error, once the producer is gone for this consumer.
    fatal: Option<ConsumerError>,
    /// Where epoch `first_epoch` starts: epoch `k` is `[base + (k − first_epoch)·N, …)`, `N`
    /// sequences. Moves (by whole epochs or to a rejoin point) only when the consumer
    /// rejoins after being let go.
    base: u64,
    /// The number of the first epoch: 0, or the epoch of a loaded position.
    first_epoch: u64,
    /// What the current epoch delivers (every index, or a rank's share) and has delivered
    /// (a bit per index): what a rejoin needs to finish the epoch exactly, and what a saved
    /// position records.
    plan: EpochPlan,
    /// A loaded position's delivered set, for the first epoch to begin.
    resume: Option<Bitmap>,
    /// What the current epoch delivers in all ([`Consumer::epoch_samples`]).
    epoch_samples: u64,
    /// The current epoch is gathered: its window of the feed holds every index once, and
    /// only those its plan still wants are delivered, copied into owned batches (after a
    /// rejoin, a resume, and always for a rank of a group).
    catch_up: bool,
    /// Rejoins so far: a batch made before the last one may have been overwritten.
    generation: u64,
}

/// Samples copied out of the ring: a batch gathered after a rejoin.
#[derive(Debug)]
struct Owned {
    /// The sequence number of the first sample copied.
    first_seq: u64,
    /// One buffer per schema field, `len × ` its bytes per sample.
    fields: Vec<AlignedBytes>,
    indices: Vec<u64>,
    flags: Vec<u64>,
}

impl Owned {
    fn with_capacity(samples: usize, schema: &Schema) -> Self {
        Self {
            first_seq: 0,
            fields: schema
                .fields()
                .iter()
                .map(|f| AlignedBytes::with_capacity(samples * f.bytes()))
                .collect(),
            indices: Vec::with_capacity(samples),
            flags: Vec::with_capacity(samples),
        }
    }

    /// Copies sample `k` of the ring window `(fields, index, flags)` that starts at `seq`.
    fn push(&mut self, seq: u64, k: usize, fields: &[(&[u8], usize)], index: u64, flags: u64) {
        if self.is_empty() {
            self.first_seq = seq;
        }
        for (owned, &(window, bytes)) in self.fields.iter_mut().zip(fields) {
            owned.extend(&window[k * bytes..(k + 1) * bytes]);
        }
        self.indices.push(index);
        self.flags.push(flags);
    }

    fn len(&self) -> usize {
        self.indices.len()
    }

    /// Keeps the first `samples` samples.
    fn truncate(&mut self, samples: usize, schema: &Schema) {
        for (owned, field) in self.fields.iter_mut().zip(schema.fields()) {
            owned.truncate(samples * field.bytes());
        }
        self.indices.truncate(samples);
        self.flags.truncate(samples);
    }

    fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// What [`Consumer::reserve`] decided for an epoch's next batch.
enum Reserve {
    /// The epoch is over (or superseded by a newer one).
    Done,
    /// The batch `first..first + count`, now counted as held.
    Batch {
        first: u64,
        count: u64,
        generation: u64,
    },
    /// The epoch goes on after a rejoin: gather a batch with [`Consumer::next_catch_up`].
    CatchUp,
}

/// What became of a reserved batch when it was to be handed out.
enum Delivery {
    /// Handed out: the producer cannot let this consumer go for a stall timeout.
    Delivered,
    /// The consumer was let go (and has rejoined), or rejoined on another thread meanwhile:
    /// the reservation is void; ask again.
    Void,
}

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
    started: Instant,
    mut deadline: Instant,
) -> Result<(ServerMessage, Vec<OwnedFd>), Result<ProtocolError, ConnectError>> {
    let Some(group) = &config.group else {
        return protocol::recv_by::<ServerMessage>(sock, deadline).map_err(Ok);
    };
    let group_deadline =
        started + config.group_timeout.min(GROUP_WAIT_CAP) + config.handshake_timeout;
    let mut joined = Vec::new();
    loop {
        match protocol::recv_by::<ServerMessage>(sock, deadline) {
            Ok((ServerMessage::GroupWaiting { joined: now, .. }, _)) => {
                tracing::info!(group = %group.name, rank = group.rank, joined = ?now, world_size = group.world_size, "waiting for the other ranks of the group");
                joined = now;
                deadline = group_deadline;
            }
            Ok((ServerMessage::GroupIncomplete { missing, waited_s }, _)) => {
                return Err(Err(ConnectError::GroupIncomplete {
                    socket: socket.into(),
                    group: group.name.clone(),
                    missing,
                    world_size: group.world_size,
                    waited: Duration::try_from_secs_f64(waited_s).unwrap_or_default(),
                }));
            }
            // No answer by the group's deadline: the ranks not heard of are the missing ones.
            Err(ProtocolError::Io(e))
                if !joined.is_empty()
                    && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                return Err(Err(ConnectError::GroupIncomplete {
                    socket: socket.into(),
                    group: group.name.clone(),
                    missing: (0..group.world_size)
                        .filter(|r| !joined.contains(r))
                        .collect(),
                    world_size: group.world_size,
                    waited: started.elapsed(),
                }));
            }
            other => return other.map_err(Ok),
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
        let connected = connect_waiting(&socket, config.connect_timeout, timeout);
        let (sock, deadline) = match connected {
            Ok(connected) => connected,
            Err(e) if e.kind() == ErrorKind::NotFound && config.connect_timeout.is_zero() => {
                return Err(ConnectError::SocketMissing { socket });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(ConnectError::SocketNeverAppeared {
                    socket,
                    waited: started.elapsed(),
                });
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                return Err(ConnectError::NoProducer { socket });
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                return Err(ConnectError::HandshakeTimeout { socket, timeout });
            }
            Err(source) => return Err(ConnectError::Connect { socket, source }),
        };
        let ours = sys::my_uid();
        let peer = match sys::peer_uid(&sock) {
            Ok(peer) => peer,
            Err(e) => {
                return Err(ConnectError::Connect {
                    socket,
                    source: e.into(),
                });
            }
        };
        if peer != ours {
            return Err(ConnectError::ForeignPeer { socket, peer, ours });
        }
        // Sending `Hello` gets what is left of the handshake's time; reading `Welcome` is
        // bounded by the deadline however the bytes trickle in (`recv_by`).
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        if let Err(source) = sock.set_write_timeout(Some(left)) {
            return Err(ConnectError::Connect { socket, source });
        }

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
                timeout_ms: u64::try_from(config.group_timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        });
        let handshake_error = |source: ProtocolError, socket: PathBuf| match source {
            ProtocolError::Io(e)
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                ConnectError::HandshakeTimeout { socket, timeout }
            }
            source => ConnectError::Protocol { socket, source },
        };
        if let Err(e) = protocol::send(&sock, &hello, &[]) {
            return Err(handshake_error(e, socket));
        }
        let (message, fds) = match receive_welcome(&sock, &socket, &config, started, deadline) {
            Ok(received) => received,
            Err(Ok(e)) => return Err(handshake_error(e, socket)),
            Err(Err(e)) => return Err(e),
        };
        // From here on the timeouts bound the reading (and writing) of one frame that has
        // begun to arrive.
        if let Err(source) = sock
            .set_read_timeout(Some(timeout))
            .and_then(|()| sock.set_write_timeout(Some(timeout)))
        {
            return Err(ConnectError::Connect { socket, source });
        }
        let welcome = match message {
            ServerMessage::Welcome(welcome) => welcome,
            ServerMessage::Reject { reason }
            | ServerMessage::End { reason }
            | ServerMessage::Detached { reason } => {
                return Err(ConnectError::Rejected { socket, reason });
            }
            ServerMessage::Rejoined { .. }
            | ServerMessage::Stats(_)
            | ServerMessage::GroupWaiting { .. }
            | ServerMessage::GroupIncomplete { .. }
            | ServerMessage::GroupBroken { .. } => {
                return Err(ConnectError::Protocol {
                    socket,
                    source: ProtocolError::Malformed("an answer other than Welcome".into()),
                });
            }
        };
        if welcome.version != PROTOCOL_VERSION {
            return Err(ConnectError::Version {
                socket,
                ours: PROTOCOL_VERSION,
                theirs: welcome.version,
            });
        }
        let [ring_fd, cursor_fd]: [OwnedFd; 2] = match fds.try_into() {
            Ok(fds) => fds,
            Err(fds) => {
                return Err(ConnectError::MissingFds {
                    socket,
                    got: fds.len(),
                });
            }
        };
        // Re-validate the shape: a zero capacity or odd granule must not reach the slot math.
        let sent = welcome.layout;
        let layout = match RingLayout::new(sent.capacity, sent.schema) {
            Ok(layout) => layout,
            Err(source) => return Err(ConnectError::Layout { socket, source }),
        };
        if u64::from(config.batch_size) > layout.max_batch() {
            return Err(ConnectError::BatchTooLarge {
                socket,
                batch_size: config.batch_size,
                max: layout.max_batch(),
            });
        }
        if welcome.dataset.len == 0 {
            return Err(ConnectError::EmptyDataset { socket });
        }
        if welcome.start_seq.checked_add(welcome.dataset.len).is_none() {
            return Err(ConnectError::SequenceOverflow {
                socket,
                start_seq: welcome.start_seq,
                len: welcome.dataset.len,
            });
        }
        // Only memory whose size is sealed: a file the producer could shrink under the mapping
        // would kill this process with SIGBUS at its next read.
        for (fd, file) in [(&ring_fd, "ring"), (&cursor_fd, "cursor page")] {
            if !shm::size_sealed(fd.as_fd()) {
                return Err(ConnectError::UnsealedMemory { socket, file });
            }
        }
        let mapped = ConsumerRing::map(ring_fd.as_fd(), layout)
            .and_then(|ring| Ok((ring, CursorPage::map(cursor_fd.as_fd())?)));
        let (ring, cursor) = match mapped {
            Ok(mapped) => mapped,
            Err(source) => return Err(ConnectError::Shm { socket, source }),
        };
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
        let Ok(plan) = EpochPlan::try_whole(len) else {
            return Err(ConnectError::DatasetTooLarge { socket, len });
        };
        if let Some(group) = &config.group {
            if let Err(source) = group.validate(len) {
                return Err(ConnectError::Group { socket, source });
            }
        }
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
                next_epoch: 0,
                current_epoch: None,
                held: BTreeSet::new(),
                released: start_seq,
                fatal: None,
                base: start_seq,
                first_epoch: 0,
                plan,
                resume: None,
                epoch_samples: 0,
                catch_up: false,
                generation: 0,
            }),
            catching_up: Mutex::new(()),
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

    /// Starts the next epoch: the `N` (dataset length) sequence numbers
    /// `[start_seq + k·N, start_seq + (k+1)·N)` for epoch `k`, in consecutive batches of the
    /// batch size (the last one partial, or skipped with `drop_last`).
    ///
    /// An earlier epoch that was not read to its end is abandoned: its remaining samples are
    /// skipped and released, and its iterator yields nothing more. Batches already handed out
    /// stay valid until dropped.
    #[must_use = "an epoch yields nothing unless iterated, and discarding it skips the epoch"]
    pub fn epoch(&self) -> Epoch<'_> {
        let number = self.begin_epoch();
        EpochOf {
            consumer: self,
            number,
            done: false,
        }
    }

    /// [`Consumer::epoch`] for a consumer behind an [`Arc`]: the epoch and its batches each
    /// hold a reference instead of a borrow, so they can be stored, sent to other threads or
    /// handed to another language's garbage collector. Same rules otherwise.
    #[must_use = "an epoch yields nothing unless iterated, and discarding it skips the epoch"]
    pub fn shared_epoch(self: &Arc<Self>) -> SharedEpoch {
        let number = self.begin_epoch();
        EpochOf {
            consumer: Arc::clone(self),
            number,
            done: false,
        }
    }

    /// Makes epoch `next_epoch` current; returns its number.
    fn begin_epoch(&self) -> u64 {
        let mut state = self.state();
        let number = state.next_epoch;
        state.next_epoch = number.saturating_add(1);
        state.current_epoch = Some(number);
        let resume = state.resume.take();
        match &self.config.group {
            None => state.plan.reset(),
            Some(group) => match EpochPlan::for_rank(self.dataset.len, group, number) {
                Ok(plan) => state.plan = plan,
                Err(source) => {
                    let error = ConsumerError::Plan {
                        socket: self.socket.clone(),
                        source,
                    };
                    self.fail(&mut state, error);
                }
            },
        }
        if let Some(delivered) = resume {
            // Checked against this plan when the position was loaded.
            if let Err(source) = state.plan.restore(&delivered) {
                let error = ConsumerError::Plan {
                    socket: self.socket.clone(),
                    source,
                };
                self.fail(&mut state, error);
            }
        }
        state.catch_up = self.config.group.is_some() || state.plan.delivered() > 0;
        let remaining = state.plan.remaining();
        let batch = u64::from(self.config.batch_size);
        state.epoch_samples = if self.config.drop_last {
            remaining - remaining % batch
        } else {
            remaining
        };
        // An epoch that starts past 2^64 is reported by its first `next`.
        let begin = self.epoch_start(&state, number).unwrap_or(0);
        if state.next_seq < begin {
            state.next_seq = begin;
            self.release_locked(&mut state);
        }
        number
    }

    /// Where this consumer stands, to resume from later ([`Consumer::load_position`]): the
    /// epoch in progress and the indices it has delivered (batches handed out, dropped or
    /// not), or the next epoch, none delivered, when the current one is complete. The feed's
    /// identity comes with it. Encode it with [`SavedPosition::encode`] to store it beside a
    /// checkpoint.
    pub fn position(&self) -> SavedPosition {
        let state = self.state();
        let (epoch, delivered) = match (state.current_epoch, &state.resume) {
            // Loaded and not begun: the loaded position itself.
            (None, Some(delivered)) => (state.next_epoch, delivered.clone()),
            (Some(k), _) if !state.plan.is_complete() => (k, state.plan.delivered_set().clone()),
            _ => (state.next_epoch, Bitmap::new(self.dataset.len)),
        };
        SavedPosition {
            identity: self.identity.clone(),
            epoch,
            delivered,
            group: self.config.group.clone(),
            batch_size: self.config.batch_size,
            drop_last: self.config.drop_last,
        }
    }

    /// Continues from `position` (saved by [`Consumer::position`], by this process or an
    /// earlier one, against this producer or a restarted one of the same feed): the next
    /// [`Consumer::epoch`] is the saved epoch and delivers exactly the indices it had not
    /// delivered (a rank: of its share), then whole epochs follow. What is exact is the set
    /// of indices; each sample's augmentation follows the producer epoch it is decoded in,
    /// as for any late joiner.
    ///
    /// Refused, changing nothing, when the position belongs to another feed (naming the
    /// first difference), another group or rank, or an epoch has begun already.
    pub fn load_position(&self, position: &SavedPosition) -> Result<(), ResumeError> {
        position.check_feed(&self.identity)?;
        if position.group != self.config.group {
            let words = |g: &Option<GroupSpec>| match g {
                None => "a consumer of whole epochs".to_owned(),
                Some(g) => format!(
                    "rank {} of {} of group {:?} (even={})",
                    g.rank, g.world_size, g.name, g.even
                ),
            };
            return Err(ResumeError::OtherGroup {
                saved: words(&position.group),
                configured: words(&self.config.group),
            });
        }
        let mut state = self.state();
        if let Some(epoch) = state.current_epoch {
            return Err(ResumeError::AlreadyStarted { epoch });
        }
        // The saved set must fit the saved epoch's plan.
        let mut plan = match &self.config.group {
            None => EpochPlan::try_whole(self.dataset.len),
            Some(group) => EpochPlan::for_rank(self.dataset.len, group, position.epoch),
        }
        .map_err(ResumeError::Plan)?;
        plan.restore(&position.delivered)
            .map_err(ResumeError::Plan)?;
        state.next_epoch = position.epoch;
        state.first_epoch = position.epoch;
        state.resume = Some(position.delivered.clone());
        Ok(())
    }

    /// The samples the current epoch delivers in all, fixed when it began: the consumer's
    /// share ([`Consumer::samples_per_epoch`]), or after a loaded position what the saved
    /// epoch had left (less the partial batch under `drop_last`). 0 before the first epoch.
    pub fn epoch_samples(&self) -> u64 {
        self.state().epoch_samples
    }

    /// How many epochs were started: the number the next [`Consumer::epoch`] gives its epoch.
    pub fn epoch_number(&self) -> u64 {
        self.state().next_epoch
    }

    /// The dataset the producer serves (its length is this consumer's epoch length).
    pub fn dataset(&self) -> &DatasetInfo {
        &self.dataset
    }

    /// The ring's shape: image height and width, capacity.
    pub fn layout(&self) -> &RingLayout {
        self.ring.layout()
    }

    /// The settings this consumer was connected with.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Samples in a whole epoch of this consumer before batching: `N`, or for a rank of a
    /// group its share, `ceil(N / W)` (`Even::Pad`) or `floor(N / W)` (`Even::Drop`).
    pub fn share_per_epoch(&self) -> u64 {
        let n = self.dataset.len;
        match &self.config.group {
            None => n,
            Some(g) => match g.even {
                Even::Pad => n.div_ceil(u64::from(g.world_size.max(1))),
                Even::Drop => n / u64::from(g.world_size.max(1)),
            },
        }
    }

    /// Batches per whole epoch: `ceil(S / B)`, or `floor(S / B)` with `drop_last`, where `S`
    /// is [`Consumer::share_per_epoch`] (`N` unless a rank of a group). A resumed epoch has
    /// fewer.
    pub fn batches_per_epoch(&self) -> u64 {
        let (n, b) = (self.share_per_epoch(), u64::from(self.config.batch_size));
        if self.config.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// Samples per whole epoch that are delivered: `S`, or `S − S mod B` with `drop_last`
    /// (`S`: [`Consumer::share_per_epoch`]).
    pub fn samples_per_epoch(&self) -> u64 {
        self.batches_per_epoch()
            .saturating_mul(u64::from(self.config.batch_size))
            .min(self.share_per_epoch())
    }

    /// This consumer's id in the producer's logs.
    pub fn consumer_id(&self) -> u64 {
        self.consumer_id
    }

    /// The producer's control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The sequence number epoch 0 started at when this consumer joined.
    pub fn start_seq(&self) -> u64 {
        self.start_seq
    }

    /// How many times the producer let this consumer go (it held the feed back without
    /// taking a batch for the producer's stall timeout) and it rejoined.
    pub fn rejoins(&self) -> u64 {
        self.state().generation
    }

    /// Batches handed out and not yet dropped.
    pub fn held_batches(&self) -> usize {
        self.state().held.len()
    }

    /// The bookkeeping, even if a thread panicked while holding it (every update leaves it
    /// consistent, and pinning too much is the safe side).
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where epoch `number` starts: `base + (number − first_epoch)·N`, `None` past sequence
    /// 2^64.
    fn epoch_start(&self, state: &State, number: u64) -> Option<u64> {
        number
            .checked_sub(state.first_epoch)
            .and_then(|k| k.checked_mul(self.dataset.len))
            .and_then(|offset| state.base.checked_add(offset))
    }

    /// Where epoch `number` ends, or the error that it ends past sequence 2^64 (no epoch is
    /// ever cut short silently).
    fn epoch_end(&self, state: &State, number: u64) -> Result<u64, ConsumerError> {
        number
            .checked_add(1)
            .and_then(|next| self.epoch_start(state, next))
            .ok_or_else(|| ConsumerError::SequenceOverflow {
                socket: self.socket.clone(),
                epoch: number,
            })
    }

    /// Takes the next batch of epoch `number` and counts it as held, if that exceeds neither
    /// `max_batches_held` nor what the ring holds beside the batches held (a deadlock: the
    /// producer could never write the batch's end).
    fn reserve(&self, number: u64) -> Result<Reserve, ConsumerError> {
        let mut state = self.state();
        if state.current_epoch == Some(number) && state.plan.is_complete() {
            return Ok(Reserve::Done);
        }
        if state.catch_up && state.current_epoch == Some(number) {
            return Ok(Reserve::CatchUp);
        }
        let span = match self.next_span(&state, number) {
            Ok(span) => span,
            Err(e) => return Err(self.fail(&mut state, e)),
        };
        let Some((next, count)) = span else {
            return Ok(Reserve::Done);
        };
        let held = state.held.len();
        let max = self.config.max_batches_held;
        if held >= max {
            return Err(ConsumerError::TooManyBatchesHeld { held, max });
        }
        let floor = state.held.first().map_or(next, |&oldest| oldest.min(next));
        if next.saturating_add(count) > floor.saturating_add(self.ring.layout().capacity) {
            return Err(ConsumerError::TooManyBatchesHeld { held, max: held });
        }
        // Tracked before it is handed out: the cursor must not pass it.
        state.next_seq = next + count;
        state.held.insert(next);
        Ok(Reserve::Batch {
            first: next,
            count,
            generation: state.generation,
        })
    }

    /// The first sequence number and length of epoch `number`'s next batch, or `None` when it
    /// has no more: read to its end, only a partial batch left under `drop_last`, or
    /// superseded by a newer epoch.
    fn next_span(&self, state: &State, number: u64) -> Result<Option<(u64, u64)>, ConsumerError> {
        if state.current_epoch != Some(number) {
            return Ok(None);
        }
        let end = self.epoch_end(state, number)?;
        let next = state.next_seq;
        let remaining = end.saturating_sub(next);
        let batch_size = u64::from(self.config.batch_size);
        if remaining == 0 || (self.config.drop_last && remaining < batch_size) {
            return Ok(None);
        }
        Ok(Some((next, remaining.min(batch_size))))
    }

    /// Hands out the reserved batch `first..first + count` (made in `generation`): records
    /// the delivery in the lease word, which fails if the producer let this consumer go,
    /// and the batch's indices as seen in this epoch. On a let-go, drops the reservation,
    /// rejoins, and returns [`Delivery::Void`].
    fn deliver(
        &self,
        first: u64,
        count: u64,
        generation: u64,
        number: u64,
    ) -> Result<Delivery, ConsumerError> {
        let mut state = self.state();
        if let Delivery::Void = self.deliver_locked(&mut state, first, generation, number)? {
            return Ok(Delivery::Void);
        }
        // SAFETY: `first..first + count` is published (the caller waited for it), held (so
        // at or above the cursor) and delivered just now, so the producer may not write it
        // for at least its stall timeout; `count <= capacity / 2`.
        let indices = unsafe { self.ring.indices(first, count as usize) };
        for &index in indices {
            state.plan.mark(index);
        }
        Ok(Delivery::Delivered)
    }

    /// The delivery itself, for [`Consumer::deliver`] and a catch-up span (whose indices are
    /// marked as they are copied).
    fn deliver_locked(
        &self,
        state: &mut State,
        first: u64,
        generation: u64,
        number: u64,
    ) -> Result<Delivery, ConsumerError> {
        if state.generation != generation {
            // Another thread rejoined meanwhile: the reservation predates it.
            state.held.remove(&first);
            return Ok(Delivery::Void);
        }
        if state.current_epoch != Some(number) {
            // A newer epoch began while this batch was waited for: the old epoch yields
            // nothing more, and its batch must not count in the new epoch's record.
            state.held.remove(&first);
            self.release_locked(state);
            return Ok(Delivery::Void);
        }
        if self.cursor.deliver(state.next_seq).is_err() {
            state.held.remove(&first);
            self.rejoin(state)?;
            return Ok(Delivery::Void);
        }
        Ok(Delivery::Delivered)
    }

    /// After the producer let this consumer go (it took no batch for the stall timeout while
    /// holding the feed back): asks to be attached again and moves this consumer's record to
    /// where the producer put it. Batches made before may have been overwritten
    /// ([`BatchOf::is_intact`] says so). The epoch in progress goes on: the feed's next `N`
    /// samples from the rejoin point hold every index once, and [`Consumer::next_catch_up`]
    /// delivers only those not seen yet, so the epoch stays exact.
    ///
    /// Runs under the state lock (so that no release moves the cursor while the producer
    /// resets it) and the socket lock, for at most the handshake timeout.
    fn rejoin(&self, state: &mut State) -> Result<(), ConsumerError> {
        let socket = || self.socket.clone();
        let start = {
            let sock = self.sock.lock().unwrap_or_else(PoisonError::into_inner);
            let failed = |source: ProtocolError| ConsumerError::Protocol {
                socket: socket(),
                source: Arc::new(source),
            };
            protocol::send(&sock, &ClientMessage::Rejoin, &[]).map_err(failed)?;
            let deadline = Instant::now() + self.config.handshake_timeout;
            let answer = loop {
                match protocol::recv_by::<ServerMessage>(&sock, deadline) {
                    Ok((ServerMessage::Rejoined { start_seq }, _)) => break Ok(start_seq),
                    Ok((ServerMessage::End { reason }, _)) => {
                        break Err(ConsumerError::ProducerEnded {
                            socket: socket(),
                            reason,
                        });
                    }
                    Ok((ServerMessage::Detached { reason }, _)) => {
                        break Err(ConsumerError::Detached {
                            socket: socket(),
                            reason,
                        });
                    }
                    Ok((other, _)) => {
                        tracing::warn!(consumer_id = self.consumer_id, "ignoring {other:?}");
                    }
                    Err(ProtocolError::Closed) => {
                        break Err(ConsumerError::ProducerGone { socket: socket() });
                    }
                    Err(e) => break Err(failed(e)),
                }
            };
            // Back to the timeout that bounds the reading of a frame that began to arrive.
            let _ = sock.set_read_timeout(Some(
                self.config.handshake_timeout.max(Duration::from_millis(1)),
            ));
            answer
        };
        let start = match start {
            Ok(start) if start >= state.released => start,
            Ok(start) => {
                return Err(self.fail(
                    state,
                    ConsumerError::Protocol {
                        socket: socket(),
                        source: Arc::new(ProtocolError::Malformed(format!(
                            "rejoined at {start}, behind this consumer's cursor {}",
                            state.released
                        ))),
                    },
                ));
            }
            Err(e) => return Err(self.fail(state, e)),
        };
        let n = self.dataset.len;
        state.generation += 1;
        state.held.clear();
        state.next_seq = start;
        state.released = start;
        // The epoch in progress takes the window [start, start + N) when it has seen part of
        // the dataset; otherwise the next epoch to begin starts at `start`.
        let gathered = self.config.group.is_some();
        let (number, catch_up) = match state.current_epoch {
            Some(k) if state.plan.delivered() > 0 && !state.plan.is_complete() => (k, true),
            Some(k) if state.plan.delivered() == 0 => (k, gathered),
            _ => (state.next_epoch, gathered),
        };
        // Epoch `number` starts at `start` (`base = start − number·N`), or at `number·N` when
        // that lies beyond (the samples between are skipped): N consecutive samples either way.
        let Some(offset) = number
            .checked_sub(state.first_epoch)
            .and_then(|k| k.checked_mul(n))
        else {
            let error = ConsumerError::SequenceOverflow {
                socket: socket(),
                epoch: number,
            };
            return Err(self.fail(state, error));
        };
        state.base = start.saturating_sub(offset);
        state.next_seq = start.max(offset);
        state.catch_up = catch_up;
        tracing::warn!(
            consumer_id = self.consumer_id,
            start,
            delivered = state.plan.delivered(),
            "the producer let this consumer go (it held the feed back without taking a batch \
             for the stall timeout); rejoined"
        );
        Ok(())
    }

    /// Records `error` as final (under the state lock) and returns it.
    fn fail(&self, state: &mut State, error: ConsumerError) -> ConsumerError {
        tracing::warn!(consumer_id = self.consumer_id, "{error}");
        state.fatal.get_or_insert(error).clone()
    }

    /// Gathers the next batch of epoch `number` after a rejoin: walks the epoch's window of
    /// the feed span by span, copying each sample whose index this epoch has not delivered
    /// yet into an owned batch, until it holds a batch or the window ends. `None` when the
    /// epoch is over.
    fn next_catch_up(&self, number: u64) -> Result<Option<Owned>, ConsumerError> {
        let _one_at_a_time = self
            .catching_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.config.group.is_some() {
            // A rank hears promptly that another went, even while data keeps coming.
            self.check_socket();
            if let Some(error @ ConsumerError::GroupBroken { .. }) = self.fatal() {
                return Err(error);
            }
        }
        let batch_size = u64::from(self.config.batch_size);
        let schema = &self.ring.layout().schema;
        let mut owned = Owned::with_capacity(batch_size as usize, schema);
        loop {
            let (first, count, generation) = {
                let mut state = self.state();
                if state.current_epoch != Some(number) {
                    return Ok(None); // superseded: the old epoch yields nothing more
                }
                if !state.catch_up {
                    break;
                }
                let end = match self.epoch_end(&state, number) {
                    Ok(end) => end,
                    Err(e) => return Err(self.fail(&mut state, e)),
                };
                let first = state.next_seq;
                if first >= end {
                    state.catch_up = false;
                    break;
                }
                let count = (end - first).min(batch_size);
                let floor = state
                    .held
                    .first()
                    .map_or(first, |&oldest| oldest.min(first));
                if first + count > floor.saturating_add(self.ring.layout().capacity) {
                    let held = state.held.len();
                    return Err(ConsumerError::TooManyBatchesHeld { held, max: held });
                }
                state.next_seq = first + count;
                state.held.insert(first);
                (first, count, state.generation)
            };
            if let Err(e) = self.wait_for(first + count) {
                self.unhold(first);
                return Err(e);
            }
            let mut state = self.state();
            if let Delivery::Void = self.deliver_locked(&mut state, first, generation, number)? {
                continue;
            }
            // SAFETY: as in `deliver`: published, held, and delivered just now.
            let (indices, flags, fields) = unsafe {
                let fields: Vec<(&[u8], usize)> = (schema.fields().iter().enumerate())
                    .map(|(k, f)| (self.ring.field(k, first, count as usize), f.bytes()))
                    .collect();
                (
                    self.ring.indices(first, count as usize),
                    self.ring.flags(first, count as usize),
                    fields,
                )
            };
            let mut stop = first + count;
            let before = owned.len();
            for (k, &index) in indices.iter().enumerate() {
                if state.plan.mark(index) {
                    owned.push(first + k as u64, k, &fields, index, flags[k]);
                    if owned.len() as u64 == batch_size || state.plan.is_complete() {
                        stop = first + k as u64 + 1;
                        break;
                    }
                }
            }
            state.held.remove(&first);
            if self.cursor.is_let_go() {
                // Let go while copying (a stall timeout passed since the delivery): the copy
                // may be torn. Forget it and gather the span again after the rejoin.
                for &index in &owned.indices[before..] {
                    state.plan.unmark(index);
                }
                owned.truncate(before, schema);
                self.rejoin(&mut state)?;
                continue;
            }
            // The rest of the span is gathered next time (it stays unreleased).
            state.next_seq = stop;
            self.release_locked(&mut state);
            if owned.len() as u64 == batch_size || state.plan.is_complete() {
                break;
            }
        }
        let partial_dropped = self.config.drop_last && (owned.len() as u64) < batch_size;
        Ok((!owned.is_empty() && !partial_dropped).then_some(owned))
    }

    /// Stops holding the batch starting at `first` and moves the cursor as far as it may go.
    fn unhold(&self, first: u64) {
        let mut state = self.state();
        state.held.remove(&first);
        self.release_locked(&mut state);
    }

    /// Moves the cursor up to the oldest held batch, or to the next sequence not handed out
    /// when none is held; never past the head (skipped samples are released as they are
    /// published) and never backwards.
    fn release_locked(&self, state: &mut State) {
        let next = state.next_seq;
        let target = state.held.first().map_or(next, |&oldest| oldest.min(next));
        let target = target.min(self.ring.head());
        if target > state.released {
            self.cursor.release(target);
            state.released = target;
        }
    }

    fn release_free(&self) {
        let mut state = self.state();
        self.release_locked(&mut state);
    }

    fn fatal(&self) -> Option<ConsumerError> {
        self.state().fatal.clone()
    }

    fn set_fatal(&self, error: ConsumerError) {
        self.fail(&mut self.state(), error);
    }

    /// Sleeps until every sample below `end` is published, checking the control socket at
    /// every wake-up (at least every [`POLL`]) so that a dead producer is an error, not a hang.
    fn wait_for(&self, end: u64) -> Result<(), ConsumerError> {
        self.wait_until(end, None).map(|_| ())
    }

    /// [`Consumer::wait_for`] that gives up at `deadline`: `Ok(false)` when it passed first.
    fn wait_until(&self, end: u64, deadline: Option<Instant>) -> Result<bool, ConsumerError> {
        loop {
            let head = self.ring.head();
            if head >= end {
                return Ok(true);
            }
            if let Some(error) = self.fatal() {
                return Err(error);
            }
            if self.cursor.is_let_go() {
                // The producer no longer writes for this consumer: what it waits for may
                // never come. The delivery that follows fails and rejoins.
                return Ok(true);
            }
            // The producer may be waiting for samples this consumer skipped.
            self.release_free();
            if self.ring.ended() {
                self.check_socket();
                if self.fatal().is_none() {
                    self.set_fatal(ConsumerError::ProducerEnded {
                        socket: self.socket.clone(),
                        reason: "the ring is marked ended".into(),
                    });
                }
                // Look at the head once more: it may have moved before the end.
                continue;
            }
            let mut timeout = POLL;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                timeout = timeout.min(left);
            }
            self.ring.wait_for_head(&self.cursor, end, timeout);
            self.check_socket();
        }
    }

    /// What a sample of this feed is.
    pub fn schema(&self) -> &Schema {
        &self.ring.layout().schema
    }

    /// The address and length of this process's read-only mapping of field `name`'s region
    /// (both halves of the double mapping), page-aligned: what a CUDA binding registers
    /// (`cuMemHostRegister`, read-only flag) so that copies from batches run from pinned
    /// memory. Every batch's values of the field lie inside it. `None`: no such field.
    pub fn field_region(&self, name: &str) -> Option<(*const u8, usize)> {
        let (k, _) = self.schema().field(name)?;
        Some(self.ring.field_mapping(k))
    }

    /// [`Consumer::field_region`] of an image feed's `image` field.
    pub fn images_region(&self) -> Option<(*const u8, usize)> {
        self.schema().image_size()?;
        self.field_region(ladle_ring::schema::IMAGE)
    }

    /// [`Consumer::field_region`] of the `label: i64` field.
    pub fn labels_region(&self) -> Option<(*const u8, usize)> {
        let k = self.schema().label_field()?;
        Some(self.ring.field_mapping(k))
    }

    /// Reads whatever the producer has said, without blocking.
    fn check_socket(&self) {
        let socket = || self.socket.clone();
        let polled = {
            let sock = self.sock.lock().unwrap_or_else(PoisonError::into_inner);
            protocol::poll::<ServerMessage>(&sock)
        };
        match polled {
            Ok(None) => {}
            Ok(Some(ServerMessage::End { reason })) => {
                self.set_fatal(ConsumerError::ProducerEnded {
                    socket: socket(),
                    reason,
                })
            }
            Ok(Some(ServerMessage::Detached { reason })) => {
                self.set_fatal(ConsumerError::Detached {
                    socket: socket(),
                    reason,
                })
            }
            Ok(Some(ServerMessage::GroupBroken { rank, reason })) => {
                let group = self.config.group.as_ref().map(|g| g.name.clone());
                self.set_fatal(ConsumerError::GroupBroken {
                    socket: socket(),
                    group: group.unwrap_or_default(),
                    rank,
                    reason,
                })
            }
            Ok(Some(other)) => {
                tracing::warn!(
                    consumer_id = self.consumer_id,
                    "ignoring an unexpected {other:?}"
                );
            }
            Err(ProtocolError::Closed) => {
                self.set_fatal(ConsumerError::ProducerGone { socket: socket() })
            }
            Err(ProtocolError::Io(e))
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::BrokenPipe
                        | ErrorKind::ConnectionAborted
                ) =>
            {
                self.set_fatal(ConsumerError::ProducerGone { socket: socket() })
            }
            Err(source) => self.set_fatal(ConsumerError::Protocol {
                socket: socket(),
                source: Arc::new(source),
            }),
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let sock = self.sock.get_mut().unwrap_or_else(PoisonError::into_inner);
        // Best effort: closing the socket, which follows, is a leave as well.
        if let Err(e) = protocol::send(sock, &ClientMessage::Leave, &[]) {
            tracing::debug!(consumer_id = self.consumer_id, "sending Leave failed: {e}");
        }
    }
}

/// One epoch of a [`Consumer`]: an iterator of its batches, made by [`Consumer::epoch`]
/// (`Epoch<'_>`, borrowing) or [`Consumer::shared_epoch`] ([`SharedEpoch`], owning an
/// `Arc`). `C` is how the epoch and its batches reach the consumer.
///
/// Yields `Err` when the producer is gone (then nothing more), or
/// [`ConsumerError::TooManyBatchesHeld`] when the caller holds too many batches (drop some and
/// call `next` again).
pub struct EpochOf<C> {
    consumer: C,
    number: u64,
    done: bool,
}

/// An epoch whose batches borrow the consumer: [`Consumer::epoch`].
pub type Epoch<'a> = EpochOf<&'a Consumer>;
/// An epoch whose batches each hold an `Arc` of the consumer: [`Consumer::shared_epoch`].
pub type SharedEpoch = EpochOf<Arc<Consumer>>;

impl<C: Deref<Target = Consumer>> EpochOf<C> {
    /// This epoch's number (0 for the first).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Waits at most `timeout` for the epoch's next batch to be published, without taking it:
    /// `Ok(true)` when the next `next()` will not block (the batch is there, or the epoch is
    /// over), `Ok(false)` when the time ran out first. Bindings call it in short slices so
    /// that a waiting training loop still answers Ctrl-C.
    pub fn wait_ready(&self, timeout: Duration) -> Result<bool, ConsumerError> {
        let consumer = &*self.consumer;
        if self.done {
            return Ok(true);
        }
        let span = {
            let mut state = consumer.state();
            match consumer.next_span(&state, self.number) {
                Ok(span) => span,
                Err(e) => return Err(consumer.fail(&mut state, e)),
            }
        };
        match span {
            None => Ok(true),
            Some((next, count)) => {
                consumer.wait_until(next + count, Some(Instant::now() + timeout))
            }
        }
    }
}

impl<C> fmt::Debug for EpochOf<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Epoch")
            .field("number", &self.number)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<C: Deref<Target = Consumer> + Clone> Iterator for EpochOf<C> {
    type Item = Result<BatchOf<C>, ConsumerError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let consumer = &*self.consumer;
        loop {
            let (first, count, generation) = match consumer.reserve(self.number) {
                Ok(Reserve::Done) => {
                    self.done = true;
                    return None;
                }
                Ok(Reserve::Batch {
                    first,
                    count,
                    generation,
                }) => (first, count, generation),
                Ok(Reserve::CatchUp) => match consumer.next_catch_up(self.number) {
                    Ok(Some(owned)) => {
                        return Some(Ok(BatchOf {
                            consumer: self.consumer.clone(),
                            first_seq: owned.first_seq,
                            len: owned.len(),
                            epoch: self.number,
                            generation: 0,
                            owned: Some(Box::new(owned)),
                        }));
                    }
                    // The catch-up is over; the plain path says what comes next.
                    Ok(None) => continue,
                    Err(e) => {
                        self.done = e.is_final();
                        return Some(Err(e));
                    }
                },
                Err(e) => {
                    self.done = e.is_final();
                    return Some(Err(e));
                }
            };
            if let Err(e) = consumer.wait_for(first + count) {
                consumer.unhold(first);
                self.done = true;
                return Some(Err(e));
            }
            match consumer.deliver(first, count, generation, self.number) {
                Ok(Delivery::Delivered) => {
                    return Some(Ok(BatchOf {
                        consumer: self.consumer.clone(),
                        first_seq: first,
                        // `count <= batch_size <= capacity / 2`, checked at connect.
                        len: count as usize,
                        epoch: self.number,
                        generation,
                        owned: None,
                    }));
                }
                Ok(Delivery::Void) => continue,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl<C: Deref<Target = Consumer> + Clone> FusedIterator for EpochOf<C> {}

/// A batch: `len` consecutive samples of the ring, read in place (zero copy). Each field of
/// the feed's schema is one contiguous `[B, ...shape]` array ([`BatchOf::field`],
/// [`BatchOf::fields`]); an image feed's images are `[B, H, W, 3]` u8 ([`BatchOf::images`])
/// and its labels `[B]` i64; the dataset indices are `[B]` u64. Dropping it releases its
/// samples to the producer. `C` is how it reaches its consumer: see [`Batch`] and
/// [`SharedBatch`].
pub struct BatchOf<C: Deref<Target = Consumer>> {
    consumer: C,
    first_seq: u64,
    len: usize,
    epoch: u64,
    /// The consumer's rejoin count when the batch was handed out.
    generation: u64,
    /// The samples, copied, for a batch gathered after a rejoin; `None` for a view of the
    /// ring.
    owned: Option<Box<Owned>>,
}

/// A batch borrowing its consumer, from an [`Epoch`].
pub type Batch<'a> = BatchOf<&'a Consumer>;
/// A batch holding an `Arc` of its consumer, from a [`SharedEpoch`].
pub type SharedBatch = BatchOf<Arc<Consumer>>;

impl<C: Deref<Target = Consumer>> BatchOf<C> {
    /// The bytes of field `k`, `B × ` its bytes per sample.
    fn field_bytes(&self, k: usize) -> &[u8] {
        if let Some(owned) = &self.owned {
            return owned.fields[k].as_bytes();
        }
        // SAFETY: `first_seq..first_seq + len` is below the head (`wait_for` returned before
        // this batch was made) and at or above the cursor (this batch is held, and the cursor
        // never passes the oldest held batch), so the producer cannot write these slots while
        // `self` lives; `len <= capacity / 2`. The mapping lives as long as the consumer,
        // which `self` keeps alive.
        unsafe { self.consumer.ring.field(k, self.first_seq, self.len) }
    }

    /// Every field of the batch, in schema order.
    pub fn fields(&self) -> impl Iterator<Item = FieldView<'_>> {
        let schema = &self.consumer.ring.layout().schema;
        (schema.fields().iter().enumerate()).map(|(k, field)| FieldView {
            field,
            len: self.len,
            bytes: self.field_bytes(k),
        })
    }

    /// Field `name`, untyped (any dtype, `f16`, `bf16` and `bool` included); `None`: the
    /// feed has no such field.
    pub fn field_view(&self, name: &str) -> Option<FieldView<'_>> {
        let (k, field) = self.consumer.ring.layout().schema.field(name)?;
        Some(FieldView {
            field,
            len: self.len,
            bytes: self.field_bytes(k),
        })
    }

    /// Field `name` as a flat `[B × ...shape]` slice of `T`, zero copy; an error when the
    /// feed has no such field or `T` is not its dtype.
    pub fn field<T: Element>(&self, name: &str) -> Result<&[T], FieldError> {
        let schema = &self.consumer.ring.layout().schema;
        let view = self.field_view(name).ok_or_else(|| FieldError::Missing {
            name: name.to_owned(),
            schema: schema.to_string(),
        })?;
        view.as_slice().ok_or_else(|| FieldError::DType {
            name: name.to_owned(),
            dtype: view.dtype(),
            asked: T::DTYPE,
        })
    }

    /// An image feed's images, `[B, H, W, 3]` u8 (HWC), one contiguous slice of the shared
    /// ring; empty for a feed without an `image: u8[H, W, 3]` field.
    pub fn images(&self) -> &[u8] {
        match self.consumer.schema().image_size() {
            Some(_) => self.field::<u8>(ladle_ring::schema::IMAGE).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The labels, `[B]` i64; empty for a feed without a `label: i64` field.
    pub fn labels(&self) -> &[i64] {
        match self.consumer.schema().label_field() {
            Some(k) => cast(self.field_bytes(k)).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The dataset index of each sample, `[B]`.
    pub fn indices(&self) -> &[u64] {
        if let Some(owned) = &self.owned {
            return &owned.indices;
        }
        // SAFETY: as in `field_bytes`.
        unsafe { self.consumer.ring.indices(self.first_seq, self.len) }
    }

    /// Each sample's flags word, `[B]` ([`ladle_ring::FLAG_BAD`]: the producer could not
    /// make it).
    pub fn flags(&self) -> &[u64] {
        if let Some(owned) = &self.owned {
            return &owned.flags;
        }
        // SAFETY: as in `field_bytes`.
        unsafe { self.consumer.ring.flags(self.first_seq, self.len) }
    }

    /// Samples in this batch (the batch size, or fewer for an epoch's last batch).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Samples in this batch that the producer could not read, decode or make: each has
    /// every field zero (an image feed's label is −1) and the bad flag, so the epoch keeps
    /// its length and its coverage. Usually 0; the producer logs each such sample.
    pub fn bad_count(&self) -> usize {
        let bad = |&&f: &&u64| f & ladle_ring::FLAG_BAD != 0;
        self.flags().iter().filter(bad).count()
    }

    /// Whether the batch still holds what it was handed out with. A batch is a view of the
    /// shared ring; the producer never overwrites it while this consumer keeps taking
    /// batches, but once the consumer holds the feed back for the stall timeout without
    /// taking one (a paused or stopped run), the producer lets it go and may overwrite the
    /// batches it holds. Check this *after* reading a batch that was held across a long
    /// pause: `false` means the data read may be mixed with later samples. Batches gathered
    /// after a rejoin are copies and always intact.
    pub fn is_intact(&self) -> bool {
        self.owned.is_some()
            || (self.generation == self.consumer.state().generation
                && !self.consumer.cursor.is_let_go())
    }

    /// Whether the batch is a copy (gathered after a rejoin) rather than a view of the ring.
    pub fn is_copy(&self) -> bool {
        self.owned.is_some()
    }

    /// Always false: a batch holds at least one sample.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `[B, H, W, 3]`, the shape of [`BatchOf::images`] (`[B, 0, 0, 3]` for a feed without
    /// images).
    pub fn shape(&self) -> [usize; 4] {
        let (h, w) = self.consumer.schema().image_size().unwrap_or((0, 0));
        [self.len, h as usize, w as usize, 3]
    }

    /// The consumer's epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sequence number of the batch's first sample.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// The consumer this batch came from.
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }
}

impl<C: Deref<Target = Consumer>> fmt::Debug for BatchOf<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("epoch", &self.epoch)
            .field("first_seq", &self.first_seq)
            .field("shape", &self.shape())
            .finish()
    }
}

impl<C: Deref<Target = Consumer>> Drop for BatchOf<C> {
    fn drop(&mut self) {
        if self.owned.is_none() {
            self.consumer.unhold(self.first_seq);
        }
    }
}
