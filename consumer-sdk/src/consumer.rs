//! The consumer: the handshake, epochs, and zero-copy batches that release on drop.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::fmt;
use std::io::ErrorKind;
use std::iter::FusedIterator;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ladle_ring::protocol::{self, ClientMessage, DatasetInfo, Hello, ServerMessage};
use ladle_ring::{ConsumerRing, CursorPage, PROTOCOL_VERSION, ProtocolError, RingLayout, sys};

use crate::config::ConsumerConfig;
use crate::error::{ConnectError, ConsumerError};

/// How long one wait for the head sleeps before the control socket is checked again: a
/// producer that dies is noticed within about this long.
const POLL: Duration = Duration::from_millis(100);

/// A training process's connection to a producer: the control socket, the ring mapped
/// read-only, and this consumer's cursor page.
///
/// Read with [`Consumer::epoch`]; each [`Batch`] borrows the consumer, so several can be held
/// at once (up to [`ConsumerConfig::max_batches_held`]). Dropping the consumer tells the
/// producer it leaves. A `Consumer` can move between threads but is not shared by them.
#[derive(Debug)]
pub struct Consumer {
    socket: PathBuf,
    sock: UnixStream,
    ring: ConsumerRing,
    cursor: CursorPage,
    config: ConsumerConfig,
    consumer_id: u64,
    dataset: DatasetInfo,
    start_seq: u64,
    state: State,
}

/// What changes while batches are handed out and dropped (behind `&Consumer`).
#[derive(Debug)]
struct State {
    /// The first sequence number not yet handed out (or skipped).
    next_seq: Cell<u64>,
    /// The number the next [`Consumer::epoch`] call gives its epoch.
    next_epoch: Cell<u64>,
    /// The epoch whose iterator is current; older iterators yield nothing more.
    current_epoch: Cell<Option<u64>>,
    /// `first_seq` of every batch still held.
    held: RefCell<BTreeSet<u64>>,
    /// What the cursor page says was released.
    released: Cell<u64>,
    /// The final error, once the producer is gone for this consumer.
    fatal: RefCell<Option<ConsumerError>>,
}

impl Consumer {
    /// Connects to the producer listening on `socket`, checks that it runs as our user, says
    /// `Hello` and maps the ring it hands over.
    ///
    /// Fails with a [`ConnectError`] naming the socket: no socket there, nobody listening, a
    /// foreign peer, a rejection, a version mismatch, a batch size outside
    /// `1..=capacity/2`, no answer within [`ConsumerConfig::handshake_timeout`], or shared
    /// memory that cannot be mapped.
    pub fn connect(socket: impl AsRef<Path>, config: ConsumerConfig) -> Result<Self, ConnectError> {
        let socket = socket.as_ref().to_path_buf();
        if config.batch_size == 0 {
            return Err(ConnectError::ZeroBatchSize { socket });
        }
        if config.max_batches_held == 0 {
            return Err(ConnectError::ZeroMaxBatchesHeld { socket });
        }
        let sock = match UnixStream::connect(&socket) {
            Ok(sock) => sock,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(ConnectError::SocketMissing { socket });
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                return Err(ConnectError::NoProducer { socket });
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
        let timeout = config.handshake_timeout.max(Duration::from_millis(1));
        // Bounds the handshake, and later the reading of a frame that has begun to arrive.
        if let Err(source) = sock
            .set_read_timeout(Some(timeout))
            .and_then(|()| sock.set_write_timeout(Some(timeout)))
        {
            return Err(ConnectError::Connect { socket, source });
        }

        let hello = ClientMessage::Hello(Hello {
            version: PROTOCOL_VERSION,
            batch_size: config.batch_size,
            drop_last: config.drop_last,
            name: config.name.clone(),
            pid: std::process::id(),
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
        let (message, fds) = match protocol::recv::<ServerMessage>(&sock) {
            Ok(received) => received,
            Err(e) => return Err(handshake_error(e, socket)),
        };
        let welcome = match message {
            ServerMessage::Welcome(welcome) => welcome,
            ServerMessage::Reject { reason }
            | ServerMessage::End { reason }
            | ServerMessage::Detached { reason } => {
                return Err(ConnectError::Rejected { socket, reason });
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
        let layout = match RingLayout::new(sent.capacity, sent.height, sent.width) {
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
        Ok(Self {
            socket,
            sock,
            ring,
            cursor,
            config,
            consumer_id: welcome.consumer_id,
            dataset: welcome.dataset,
            start_seq,
            state: State {
                next_seq: Cell::new(start_seq),
                next_epoch: Cell::new(0),
                current_epoch: Cell::new(None),
                held: RefCell::new(BTreeSet::new()),
                released: Cell::new(start_seq),
                fatal: RefCell::new(None),
            },
        })
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
        let number = self.state.next_epoch.get();
        self.state.next_epoch.set(number.saturating_add(1));
        self.state.current_epoch.set(Some(number));
        let begin = self.epoch_start(number);
        if self.state.next_seq.get() < begin {
            self.state.next_seq.set(begin);
            self.release_free();
        }
        Epoch {
            consumer: self,
            number,
            end: self.epoch_start(number.saturating_add(1)),
            done: false,
        }
    }

    /// How many epochs were started: the number the next [`Consumer::epoch`] gives its epoch.
    pub fn epoch_number(&self) -> u64 {
        self.state.next_epoch.get()
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

    /// Batches per epoch: `ceil(N / B)`, or `floor(N / B)` with `drop_last`.
    pub fn batches_per_epoch(&self) -> u64 {
        let (n, b) = (self.dataset.len, u64::from(self.config.batch_size));
        if self.config.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// Samples per epoch that are delivered: `N`, or `N − N mod B` with `drop_last`.
    pub fn samples_per_epoch(&self) -> u64 {
        self.batches_per_epoch()
            .saturating_mul(u64::from(self.config.batch_size))
            .min(self.dataset.len)
    }

    /// This consumer's id in the producer's logs.
    pub fn consumer_id(&self) -> u64 {
        self.consumer_id
    }

    /// The producer's control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The sequence number epoch 0 starts at.
    pub fn start_seq(&self) -> u64 {
        self.start_seq
    }

    /// Batches handed out and not yet dropped.
    pub fn held_batches(&self) -> usize {
        self.state.held.try_borrow().map_or(0, |held| held.len())
    }

    fn epoch_start(&self, number: u64) -> u64 {
        self.start_seq
            .saturating_add(number.saturating_mul(self.dataset.len))
    }

    /// Whether `count` samples from `next` may be handed out without exceeding
    /// `max_batches_held` or pinning more than the ring holds (a deadlock: the producer
    /// could never write the batch's end).
    fn check_room(&self, next: u64, count: u64) -> Result<(), ConsumerError> {
        let held = self.held_batches();
        let max = self.config.max_batches_held;
        if held >= max {
            return Err(ConsumerError::TooManyBatchesHeld { held, max });
        }
        let floor = self.oldest_held().map_or(next, |oldest| oldest.min(next));
        if next.saturating_add(count) > floor.saturating_add(self.ring.layout().capacity) {
            return Err(ConsumerError::TooManyBatchesHeld { held, max: held });
        }
        Ok(())
    }

    fn oldest_held(&self) -> Option<u64> {
        self.state
            .held
            .try_borrow()
            .ok()
            .and_then(|held| held.first().copied())
    }

    /// Moves the cursor up to the oldest held batch, or to the next sequence not handed out
    /// when none is held; never past the head (skipped samples are released as they are
    /// published) and never backwards.
    fn release_free(&self) {
        let next = self.state.next_seq.get();
        let target = self.oldest_held().map_or(next, |oldest| oldest.min(next));
        let target = target.min(self.ring.head());
        if target > self.state.released.get() {
            self.cursor.release(target);
            self.state.released.set(target);
        }
    }

    fn fatal(&self) -> Option<ConsumerError> {
        self.state
            .fatal
            .try_borrow()
            .ok()
            .and_then(|fatal| fatal.clone())
    }

    fn set_fatal(&self, error: ConsumerError) {
        tracing::warn!(consumer_id = self.consumer_id, "{error}");
        if let Ok(mut fatal) = self.state.fatal.try_borrow_mut() {
            fatal.get_or_insert(error);
        }
    }

    /// Sleeps until every sample below `end` is published, checking the control socket at
    /// every wake-up (at least every [`POLL`]) so that a dead producer is an error, not a hang.
    fn wait_for(&self, end: u64) -> Result<(), ConsumerError> {
        loop {
            let head = self.ring.head();
            if head >= end {
                return Ok(());
            }
            if let Some(error) = self.fatal() {
                return Err(error);
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
            self.ring.wait_for_head(&self.cursor, head, POLL);
            self.check_socket();
        }
    }

    /// Reads whatever the producer has said, without blocking.
    fn check_socket(&self) {
        let socket = || self.socket.clone();
        match protocol::poll::<ServerMessage>(&self.sock) {
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
        // Best effort: closing the socket, which follows, is a leave as well.
        if let Err(e) = protocol::send(&self.sock, &ClientMessage::Leave, &[]) {
            tracing::debug!(consumer_id = self.consumer_id, "sending Leave failed: {e}");
        }
    }
}

/// One epoch of a [`Consumer`]: an iterator of its batches, made by [`Consumer::epoch`].
///
/// Yields `Err` when the producer is gone (then nothing more), or
/// [`ConsumerError::TooManyBatchesHeld`] when the caller holds too many batches (drop some and
/// call `next` again).
pub struct Epoch<'a> {
    consumer: &'a Consumer,
    number: u64,
    /// One past the epoch's last sequence number.
    end: u64,
    done: bool,
}

impl Epoch<'_> {
    /// This epoch's number (0 for the first).
    pub fn number(&self) -> u64 {
        self.number
    }
}

impl fmt::Debug for Epoch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Epoch")
            .field("number", &self.number)
            .field("end", &self.end)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<'a> Iterator for Epoch<'a> {
    type Item = Result<Batch<'a>, ConsumerError>;

    fn next(&mut self) -> Option<Self::Item> {
        let consumer = self.consumer;
        let state = &consumer.state;
        if self.done || state.current_epoch.get() != Some(self.number) {
            self.done = true;
            return None;
        }
        let next = state.next_seq.get();
        let remaining = self.end.saturating_sub(next);
        let batch_size = u64::from(consumer.config.batch_size);
        if remaining == 0 || (consumer.config.drop_last && remaining < batch_size) {
            self.done = true;
            return None;
        }
        let count = remaining.min(batch_size);
        if let Err(e) = consumer.check_room(next, count) {
            return Some(Err(e));
        }
        if let Err(e) = consumer.wait_for(next + count) {
            self.done = true;
            return Some(Err(e));
        }
        state.next_seq.set(next + count);
        // Cannot be busy: borrows of `held` never outlive a call and a consumer is not shared
        // between threads. The batch must be tracked before it is handed out: the cursor
        // must not pass it.
        state.held.borrow_mut().insert(next);
        Some(Ok(Batch {
            consumer,
            first_seq: next,
            // `count <= batch_size <= capacity / 2`, checked at connect.
            len: count as usize,
            epoch: self.number,
        }))
    }
}

impl FusedIterator for Epoch<'_> {}

/// A batch: `len` consecutive samples of the ring, read in place (zero copy). Its images are
/// one contiguous `[B, H, W, 3]` u8 array, its labels `[B]` i64, its dataset indices `[B]`
/// u64. Dropping it releases its samples to the producer.
pub struct Batch<'a> {
    consumer: &'a Consumer,
    first_seq: u64,
    len: usize,
    epoch: u64,
}

impl Batch<'_> {
    /// The images, `[B, H, W, 3]` u8 (HWC), one contiguous slice of the shared ring.
    pub fn images(&self) -> &[u8] {
        // SAFETY: `first_seq..first_seq + len` is below the head (`wait_for` returned before
        // this batch was made) and at or above the cursor (this batch is held, and the cursor
        // never passes the oldest held batch), so the producer cannot write these slots while
        // `self` lives; `len <= capacity / 2`.
        unsafe { self.consumer.ring.images(self.first_seq, self.len) }
    }

    /// The labels, `[B]`.
    pub fn labels(&self) -> &[i64] {
        // SAFETY: as in `images`.
        unsafe { self.consumer.ring.labels(self.first_seq, self.len) }
    }

    /// The dataset index of each sample, `[B]`.
    pub fn indices(&self) -> &[u64] {
        // SAFETY: as in `images`.
        unsafe { self.consumer.ring.indices(self.first_seq, self.len) }
    }

    /// Samples in this batch (the batch size, or fewer for an epoch's last batch).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a batch holds at least one sample.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `[B, H, W, 3]`, the shape of [`Batch::images`].
    pub fn shape(&self) -> [usize; 4] {
        let layout = self.consumer.ring.layout();
        [
            self.len,
            layout.height as usize,
            layout.width as usize,
            ladle_ring::layout::CHANNELS as usize,
        ]
    }

    /// The consumer's epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sequence number of the batch's first sample.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("epoch", &self.epoch)
            .field("first_seq", &self.first_seq)
            .field("shape", &self.shape())
            .finish()
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        match self.consumer.state.held.try_borrow_mut() {
            Ok(mut held) => {
                held.remove(&self.first_seq);
            }
            Err(_) => {
                // Unreachable (see `Epoch::next`); keeping the batch pinned is the safe side.
                tracing::error!("held-batch set busy; batch {} stays pinned", self.first_seq);
                return;
            }
        }
        self.consumer.release_free();
    }
}
