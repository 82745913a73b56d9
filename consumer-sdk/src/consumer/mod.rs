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
    ConsumerRing, CursorPage, FLAG_HOLE, PROTOCOL_VERSION, ProtocolError, ReadLoan, RingLayout,
    Schema, shm, sys,
};

use crate::config::{self, ConsumerConfig};
use crate::epochs::{Begun, Epochs, LoadError};
use crate::error::{ConnectError, ConsumerError, FieldError, ResumeError};
use crate::fields::{AlignedBytes, Element, FieldView, cast};
use crate::plan::{GroupSpec, PlanError};
use crate::position::SavedPosition;

mod batch;
mod connect;
mod gather;
mod resume;
mod skim;

pub use crate::plan::MAX_DATASET_LEN;
use batch::Owned;
pub use batch::{Batch, BatchOf, Epoch, EpochOf, SharedBatch, SharedEpoch};

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
    /// [`Consumer::close`] said `Leave`: dropping says nothing more.
    closed: std::sync::atomic::AtomicBool,
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
    /// `first_seq` of every batch held, including one being waited for.
    held: BTreeSet<u64>,
    /// What the cursor page says was released.
    released: u64,
    /// The final error, once the producer is gone for this consumer.
    fatal: Option<ConsumerError>,
    /// The epochs: windows, plans, rejoins and loaded positions (pure: `crate::epochs`).
    epochs: Epochs,
    /// Rejoins so far: a batch made before the last one may have been overwritten.
    generation: u64,
    /// Whether it skims (the producer asked: it held the others back).
    skimming: skim::Skimming,
    /// While it skims: when to pace the feed again (pure: `crate::skim`).
    pace: Option<crate::skim::SkimPace>,
    /// Times it was let go and rejoined.
    rejoins: u64,
    /// Times it was asked to skim: a zero-copy reservation made before the last switch is
    /// void (the skimmer reads past it, and may take its indices again as they pass).
    skims: u64,
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
        skims: u64,
    },
    /// The epoch goes on after a rejoin: gather a batch with [`Consumer::next_catch_up`].
    CatchUp,
}

/// What became of a reserved batch when it was to be handed out.
enum Delivery {
    /// Handed out, to be read through this loan: the producer cannot let this consumer go
    /// for a stall timeout.
    Delivered(ReadLoan),
    /// The consumer was let go (and has rejoined), or rejoined on another thread meanwhile:
    /// the reservation is void; ask again.
    Void,
}

impl Consumer {
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
        let begun = match state.epochs.begin() {
            Ok(begun) => begun,
            Err(source) => {
                let error = ConsumerError::Plan {
                    socket: self.socket.clone(),
                    source,
                };
                self.fail(&mut state, error);
                Begun {
                    number: state.epochs.current().unwrap_or_default(),
                    start: None,
                }
            }
        };
        let number = begun.number;
        let begin = begun.start.unwrap_or(0);
        // A skimming consumer's epoch begins wherever it is.
        if state.next_seq < begin && !state.epochs.skimming() {
            state.next_seq = begin;
            self.release_locked(&mut state);
        }
        self.declare(&mut state);
        number
    }

    /// Tells the producer what the current epoch still needs, if it is gathered (protocol
    /// version 13), and waits for its answer (`Declared`, version 14): the feed then decodes
    /// only what some consumer needs. A failure to send, or no answer within the handshake
    /// timeout, is this consumer's end, as any broken socket is.
    fn declare(&self, state: &mut State) {
        let Some(current) = state.epochs.declaration() else {
            return;
        };
        // A rank also declares its next epoch's share, so that the read-ahead past this
        // window decodes only what this node's ranks take (the current window first: the
        // producer keeps two windows per consumer and lets the oldest go).
        let declarations = [Some(current), state.epochs.next_declaration()];
        let mut frames = Vec::new();
        let mut last = 0;
        for (from, to, words) in declarations.into_iter().flatten() {
            let split = protocol::NeedsFrame::split(from, from, to, self.dataset.len, &words);
            frames.extend(split.into_iter().map(ClientMessage::Needs));
            last = from;
        }
        // Demand is raised only after the answer: a position asked for before the producer
        // installed the declaration would be decoded whether needed or not.
        let answered = self.ask(state, frames, |answer| match answer {
            ServerMessage::Declared { id } if *id == last => Some(()),
            _ => None,
        });
        if let Err(e) = answered {
            self.fail(state, e);
        }
    }

    /// Sends `messages` and waits, for at most the handshake timeout, for the answer that
    /// `pick` takes. `End` and `Detached` end the wait as errors; another rank's
    /// `GroupBroken` is recorded as this consumer's fatal error and the wait goes on; an
    /// answer nobody waits for any more (a `Declared` after a timeout) is skipped.
    ///
    /// Runs under the state lock (its caller's) and the socket lock.
    fn ask<T>(
        &self,
        state: &mut State,
        messages: Vec<ClientMessage>,
        pick: impl Fn(&ServerMessage) -> Option<T>,
    ) -> Result<T, ConsumerError> {
        let socket = || self.socket.clone();
        let sock = self.sock.lock().unwrap_or_else(PoisonError::into_inner);
        let failed = |source: ProtocolError| ConsumerError::Protocol {
            socket: socket(),
            source: Arc::new(source),
        };
        for message in &messages {
            protocol::send(&sock, message, &[]).map_err(failed)?;
        }
        let deadline = Instant::now() + self.config.handshake_timeout;
        let answer = loop {
            match protocol::recv_by::<ServerMessage>(&sock, deadline) {
                Ok((message, _)) => {
                    if let Some(answer) = pick(&message) {
                        break Ok(answer);
                    }
                    match self.told(message) {
                        Some(e @ ConsumerError::GroupBroken { .. }) => {
                            self.fail(state, e);
                        }
                        Some(e) => break Err(e),
                        None => {}
                    }
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
    }

    /// What a message the producer sent unasked means for this consumer: the error it
    /// ends with (`End`, `Detached`, `GroupBroken`), or `None` (logged and skipped).
    fn told(&self, message: ServerMessage) -> Option<ConsumerError> {
        let socket = self.socket.clone();
        match message {
            ServerMessage::End { reason } => Some(ConsumerError::ProducerEnded { socket, reason }),
            ServerMessage::Detached { reason } => Some(ConsumerError::Detached { socket, reason }),
            ServerMessage::GroupBroken { rank, reason } => {
                let group = self.config.group.as_ref().map(|g| g.name.clone());
                Some(ConsumerError::GroupBroken {
                    socket,
                    group: group.unwrap_or_default(),
                    rank,
                    reason,
                })
            }
            // The answer to a declaration whose wait timed out.
            ServerMessage::Declared { .. } => None,
            other => {
                tracing::warn!(
                    consumer_id = self.consumer_id,
                    "ignoring an unexpected {other:?}"
                );
                None
            }
        }
    }

    /// The samples the current epoch delivers in all, fixed when it began: the consumer's
    /// share ([`Consumer::samples_per_epoch`]), or after a loaded position what the saved
    /// epoch had left (less the partial batch under `drop_last`). 0 before the first epoch.
    pub fn epoch_samples(&self) -> u64 {
        self.state().epochs.samples()
    }

    /// How many epochs were started: the number the next [`Consumer::epoch`] gives its epoch.
    pub fn epoch_number(&self) -> u64 {
        self.state().epochs.next_number()
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
        self.state().epochs.share()
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

    /// How long this consumer has waited for data in all: time its batches were not yet
    /// decoded when it asked (the rest of its time is its own, its training step's).
    pub fn waited(&self) -> Duration {
        self.cursor.waited()
    }

    /// How many times the producer let this consumer go (it held the feed back without
    /// taking a batch for the producer's stall timeout) and it rejoined.
    pub fn rejoins(&self) -> u64 {
        self.state().rejoins
    }

    /// How many times the producer asked this consumer to skim (it held the others back
    /// while they waited for data; see [`Consumer::skimming`]).
    pub fn skims(&self) -> u64 {
        self.state().skims
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

    /// Where epoch `number` ends, or the error that it ends past sequence 2^64 (no epoch is
    /// ever cut short silently).
    fn epoch_end(&self, state: &State, number: u64) -> Result<u64, ConsumerError> {
        state
            .epochs
            .end(number)
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
        if let Some(error @ ConsumerError::Plan { .. }) = &state.fatal {
            return Err(error.clone());
        }
        self.check_skim(&mut state)?;
        let current = state.epochs.current() == Some(number);
        if current && state.epochs.is_complete() {
            return Ok(Reserve::Done);
        }
        if current && state.epochs.gathered() {
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
        self.check_room(&state, next, count)?;
        // Tracked before it is handed out: the cursor must not pass it.
        state.next_seq = next + count;
        state.held.insert(next);
        // Asked for: the producer decodes its read-ahead beyond the furthest demand.
        self.cursor.raise_demand(next + count);
        Ok(Reserve::Batch {
            first: next,
            count,
            generation: state.generation,
            skims: state.skims,
        })
    }

    /// Whether the ring holds the batch `next..next + count` beside the batches held: the
    /// producer can never write past the oldest held batch plus the ring, so waiting for more
    /// would deadlock. Too many batches for the ring, or one batch kept while later ones
    /// were read until they reached it around the ring, is an error that is not final.
    fn check_room(&self, state: &State, next: u64, count: u64) -> Result<(), ConsumerError> {
        let capacity = self.ring.layout().capacity;
        let Some(&oldest) = state.held.first() else {
            return Ok(());
        };
        let end = next.saturating_add(count);
        if end <= oldest.min(next).saturating_add(capacity) {
            return Ok(());
        }
        let held = state.held.len();
        // Batches of this size the ring holds at once (at least one).
        let fit = (capacity / u64::from(self.config.batch_size).max(1)).max(1) as usize;
        if held >= fit {
            return Err(ConsumerError::TooManyBatchesHeld { held, max: fit });
        }
        Err(ConsumerError::OldBatchHeld {
            oldest,
            next: end,
            capacity,
        })
    }

    /// The first sequence number and length of epoch `number`'s next batch, or `None` when it
    /// has no more: read to its end, only a partial batch left under `drop_last`, or
    /// superseded by a newer epoch.
    fn next_span(&self, state: &State, number: u64) -> Result<Option<(u64, u64)>, ConsumerError> {
        if state.epochs.current() != Some(number) {
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
        (generation, skims): (u64, u64),
        number: u64,
    ) -> Result<Delivery, ConsumerError> {
        let mut state = self.state();
        if state.skims != skims {
            // Reserved before this consumer began to skim: it reads past the reservation and
            // may take its indices as they pass again; delivering them too would repeat them.
            state.held.remove(&first);
            self.release_locked(&mut state);
            return Ok(Delivery::Void);
        }
        let delivery = self.deliver_locked(&mut state, (first, count), generation, number)?;
        if let Delivery::Delivered(loan) = &delivery
            && self.ring.flags(loan).iter().any(|f| f & FLAG_HOLE != 0)
        {
            // A whole epoch's window holds no hole: this consumer needs all of it.
            let error = ConsumerError::Protocol {
                socket: self.socket.clone(),
                source: Arc::new(ProtocolError::Malformed(format!(
                    "a position of {first}..{} was let pass undecoded (a hole), in a window \
                     this consumer reads whole",
                    first + count
                ))),
            };
            return Err(self.fail(&mut state, error));
        }
        if let Delivery::Delivered(loan) = &delivery {
            // Published (the caller waited for it), held (so at or above the cursor) and
            // delivered just now: the producer may not write it for its stall timeout.
            for &index in self.ring.indices(loan) {
                state.epochs.deliver(index);
            }
            self.cursor.add_delivered(count);
        }
        Ok(delivery)
    }

    /// The delivery itself, for [`Consumer::deliver`] and a catch-up span (whose indices are
    /// marked as they are copied).
    fn deliver_locked(
        &self,
        state: &mut State,
        (first, count): (u64, u64),
        generation: u64,
        number: u64,
    ) -> Result<Delivery, ConsumerError> {
        if state.generation != generation {
            // Another thread rejoined meanwhile: the reservation predates it.
            state.held.remove(&first);
            return Ok(Delivery::Void);
        }
        if state.epochs.current() != Some(number) {
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
        match self.ring.read_loan(first, count as usize) {
            Some(loan) => Ok(Delivery::Delivered(loan)),
            // It waited for the head to pass `first + count`, and it is behind it now.
            None => {
                state.held.remove(&first);
                let error = ConsumerError::Protocol {
                    socket: self.socket.clone(),
                    source: Arc::new(ProtocolError::Malformed(format!(
                        "the ring's head went back to {} after passing {}",
                        self.ring.head(),
                        first + count
                    ))),
                };
                Err(self.fail(state, error))
            }
        }
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
        let start = self.ask(state, vec![ClientMessage::Rejoin], |answer| match answer {
            ServerMessage::Rejoined { start_seq } => Some(*start_seq),
            _ => None,
        });
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
        state.generation += 1;
        state.held.clear();
        state.released = start;
        let was_skimming = std::mem::take(&mut state.skimming) != skim::Skimming::Off;
        state.pace = None;
        // The epoch in progress takes the window [start, start + N) when it has seen part of
        // the dataset; otherwise the next epoch to begin starts at `start`.
        state.next_seq = state.epochs.rejoined(start);
        // What it declared was for its old attachment: the producer forgot it.
        self.declare(state);
        if !was_skimming {
            state.rejoins += 1;
        }
        if was_skimming {
            tracing::info!(
                consumer_id = self.consumer_id,
                start,
                delivered = state.epochs.delivered(),
                "attached again after skimming"
            );
        } else {
            tracing::warn!(
                consumer_id = self.consumer_id,
                start,
                delivered = state.epochs.delivered(),
                "the producer let this consumer go (it held the feed back without taking a \
                 batch for the stall timeout); rejoined"
            );
        }
        Ok(())
    }

    /// Records `error` as final (under the state lock) and returns it.
    fn fail(&self, state: &mut State, error: ConsumerError) -> ConsumerError {
        tracing::warn!(consumer_id = self.consumer_id, "{error}");
        state.fatal.get_or_insert(error).clone()
    }

    /// Stops holding the batch starting at `first` and moves the cursor as far as it may go.
    fn unhold(&self, first: u64) {
        let mut state = self.state();
        state.held.remove(&first);
        self.release_locked(&mut state);
        // Asked to skim and holding nothing now: say `Skim` at once (an error is recorded
        // as final and met at the next batch).
        let _ = self.check_skim(&mut state);
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
        self.cursor.raise_demand(end);
        if self.ring.head() >= end {
            return Ok(true);
        }
        // Waiting for data: counted in the cursor page (`Stats`, the cost report).
        let started = Instant::now();
        let waited = self.wait_for_head(end, deadline);
        self.cursor.add_waited(started.elapsed());
        waited
    }

    /// [`Consumer::wait_until`]'s loop.
    fn wait_for_head(&self, end: u64, deadline: Option<Instant>) -> Result<bool, ConsumerError> {
        loop {
            let head = self.ring.head();
            if head >= end {
                return Ok(true);
            }
            if let Some(error) = self.fatal() {
                return Err(error);
            }
            if self.cursor.is_let_go() && !self.state().epochs.skimming() {
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

    /// The feed's identity (its data, seed, transform and schema), as its `Welcome` said.
    pub fn identity(&self) -> &FeedIdentity {
        &self.identity
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
            Ok(Some(message)) => {
                if let Some(error) = self.told(message) {
                    self.set_fatal(error);
                }
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

impl Consumer {
    /// Leaves the feed now, as done: the producer forgets this consumer, and a rank's group
    /// is not broken by it whatever its epoch (the last rank of a job to finish, or one that
    /// stops early on purpose). Batches read after it fail. Dropping a consumer leaves too,
    /// except a rank in the middle of an epoch: see the [`Drop`] impl.
    pub fn close(&self) {
        if self.closed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        send_leave(
            &self.sock.lock().unwrap_or_else(PoisonError::into_inner),
            self.consumer_id,
        );
    }
}

/// Says `Leave`, best effort: closing the socket, which follows, is a leave as well (except
/// for a rank of a group).
fn send_leave(sock: &UnixStream, consumer_id: u64) {
    if let Err(e) = protocol::send(sock, &ClientMessage::Leave, &[]) {
        tracing::debug!(consumer_id, "sending Leave failed: {e}");
    }
}

/// Dropping a consumer says `Leave`, as done, with one exception: a rank of a group dropped
/// in the middle of an epoch (an exception unwinding the training loop, `sys.exit`, Ctrl-C)
/// did not take its share, so it hangs up without `Leave` and the producer tells the other
/// ranks `GroupBroken`, as when it is killed. At an epoch's end, or after
/// [`Consumer::close`], a rank leaves cleanly.
///
/// Either way the connection is shut down before its descriptor closes, so the producer
/// sees this consumer go at once even while a process forked by another thread of this one
/// still holds a copy of the descriptor (until that child's `exec` closes it): a rank
/// restarted at once is then never refused as "already running" by its own old incarnation.
impl Drop for Consumer {
    fn drop(&mut self) {
        self.leave_on_drop();
        let sock = self.sock.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = sock.shutdown(std::net::Shutdown::Both) {
            tracing::debug!(
                consumer_id = self.consumer_id,
                "shutting the connection down: {e}"
            );
        }
    }
}

impl Consumer {
    /// What dropping says before it hangs up: `Leave`, unless closed already or a rank in
    /// the middle of an epoch.
    fn leave_on_drop(&mut self) {
        if *self.closed.get_mut() {
            return;
        }
        let broken = self.config.group.is_some()
            && self
                .state
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .epochs
                .mid_epoch();
        if broken {
            tracing::info!(
                consumer_id = self.consumer_id,
                "a rank dropped in the middle of an epoch: its group breaks"
            );
            return;
        }
        let id = self.consumer_id;
        send_leave(
            self.sock.get_mut().unwrap_or_else(PoisonError::into_inner),
            id,
        );
    }
}
