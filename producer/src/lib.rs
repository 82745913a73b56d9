//! # ladle-producer: decode and augment once, into the shared sample ring
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate is the producer: *sampler → decode+augment
//! threads → sample ring*, plus the control server on a Unix socket that admits and drops
//! consumers.
//!
//! - The feed (module `feed`) turns sequence numbers into dataset indices: seeded per-epoch
//!   permutations, reshuffled only inside segments between late joiners' cut points, so every
//!   consumer sees every sample exactly once per own epoch whenever it joined.
//! - The pipeline ([`ladle_datasets::pipeline::Pipeline`]) runs `T` threads that write each
//!   sample straight into its ring slot (no intermediate copy); completions are published in
//!   order by advancing the head.
//! - Every slot write goes through a write loan from the ring
//!   ([`ladle_ring::ProducerRing::try_loan`]), granted only once every attached consumer has
//!   released the slot (backpressure), and only a bounded read-ahead beyond what consumers
//!   asked for ([`ReadAhead`]). Each cursor is read once per decision and range-checked; a
//!   consumer whose cursor lies outside what it may show is detached, and only it.
//! - A consumer that keeps the others waiting for data is asked to *skim* (module `pacing`,
//!   pure; [`Pacing`]): it stops gating the feed and copies what its epoch still needs as the
//!   samples pass, so one slow run no longer sets every run's pace.
//! - A consumer that holds the feed back and takes no batch for the stall timeout
//!   ([`ProducerConfig::stall_timeout`], 10 s by default: a paused, evaluating or stopped
//!   run) is *let go*: the feed goes on without it, it is told before it can hand out a batch
//!   from an overwritten slot, and when it resumes the SDK rejoins and still delivers its
//!   epoch exactly. Who holds the feed back, and for how long, is logged and counted.
//! - How the feed is doing ([`Producer::stats`], [`FeedStats`]: counters, ring occupancy,
//!   each consumer's lag, the seconds it held the feed back, its rejoins) is what `ladle
//!   top`, `--metrics` and `--record` show; a `Stats` message instead of `Hello` on the socket
//!   gets the same answer (the list cut to fit one frame).
//! - What it serves: a native image dataset (the pipeline decodes and transforms, the ring's
//!   schema is `image: u8[S, S, 3], label: i64`) or any [`CustomSource`]: a schema of named
//!   fields and one [`SampleMaker`] per pipeline thread ([`Producer::start_custom`]). The
//!   Python producer's source ([`workers`]) hands each sample to a worker process that writes
//!   it into a staging buffer of its own, which the maker copies into the slot: the ring is
//!   sealed against every writer but this process, whatever the source.
//! - The control server ([`server`]) binds the socket with mode 0600, refuses peers of another
//!   uid (`SO_PEERCRED`), and treats EOF as a leave: a consumer that exits, crashes or is
//!   killed with `SIGKILL` is dropped at once and its hold on the ring released.
//!
//! A sample that cannot be read, decoded or made is, under the default skip policy, delivered
//! with every field zero, an `i64` label `-1` and the bad flag (so that every consumer's epoch keeps its length and its
//! coverage; the SDKs count such samples per batch), and logged with its file name. A
//! transient read error (no file descriptors for a moment) is retried, not counted as bad.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ladle_producer::{Producer, ProducerConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dataset = ladle_datasets::open("/data/imagenet/train")?;
//! let config = ProducerConfig { socket: "/tmp/ladle.sock".into(), ..ProducerConfig::default() };
//! let producer = Producer::start(Arc::from(dataset), config)?;
//! producer.wait()?; // until stop() or a signal handler sets the stop flag
//! # Ok(()) }
//! ```
//!
//! # Logging
//! `info`: start, each consumer's join, leave and rejoin, a consumer holding the feed back for
//! over a second; `warn`: a bad sample skipped, a consumer let go, detached or refused, too
//! many connections or open files; `error`: a failure that ends the producer. Consumer names
//! are logged quoted and escaped.

mod feed;
mod groups;
mod pacing;
pub mod server;
pub mod workers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ladle_datasets::pipeline::{
    PipelineConfig, SampleMaker, SampleSink, WorkItem, WorkSource, default_threads,
};
use ladle_datasets::transforms::Transforms;
use ladle_datasets::{BadSamplePolicy, Dataset, PipelineError, SampleError};
use ladle_ring::protocol::{ConsumerInfo, DatasetInfo, FeedIdentity, FeedStats, ServerMessage};
use ladle_ring::{
    CursorPage, Gate, LayoutError, ProducerRing, Readers, RingLayout, Schema, ShmError, WriteLoan,
};

use crate::feed::{CutPoints, Feed};
pub use crate::pacing::Pacing;
use crate::pacing::{Pacer, PacingRule};

/// The default [`ProducerConfig::stall_timeout`].
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`ProducerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Producer settings; `Default` gives a 256 MiB ring of 224×224 training samples.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// The control socket's path.
    pub socket: PathBuf,
    /// Bytes of shared memory for the ring.
    pub ring_bytes: u64,
    /// The transform pipeline of an image feed; its output size is the ring's image size.
    /// Unused by a [`CustomSource`].
    pub augment: Transforms,
    /// Decode threads (for a [`CustomSource`]: its makers, one per thread).
    pub threads: usize,
    /// Seed of the permutations and the augmentation.
    pub seed: u64,
    /// What to do with samples that cannot be decoded.
    pub policy: BadSamplePolicy,
    /// How long a consumer may hold the feed back without taking a batch before the feed
    /// goes on without it (it rejoins when it resumes).
    pub stall_timeout: Duration,
    /// Connections served at once (admitted consumers and handshakes in progress); more are
    /// refused with a clear reason.
    pub max_connections: usize,
    /// Stop once the last consumer has been gone this long (after at least one joined);
    /// `None`: serve until stopped.
    pub keep_alive: Option<Duration>,
    /// How far ahead of its consumers the feed decodes.
    pub read_ahead: ReadAhead,
    /// Whether a consumer that keeps holding the others back is asked to skim.
    pub pacing: Pacing,
}

/// How far ahead of what its consumers asked for a feed decodes: samples decoded beyond that
/// would wait in the ring, and be wasted if nobody reads them (the runs of a sweep end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAhead {
    /// Four batches of the largest batch size among the attached consumers, and at least
    /// [`READ_AHEAD_PER_THREAD`] samples per decode thread (so that every thread has work).
    #[default]
    Auto,
    /// This many samples beyond the furthest any consumer has asked for.
    Samples(u64),
    /// As far as the ring allows: every consumer's unread samples, up to the ring's
    /// capacity (what feeds did before protocol version 7).
    Ring,
}

/// [`ReadAhead::Auto`]'s floor per decode thread.
pub const READ_AHEAD_PER_THREAD: u64 = 16;

impl ReadAhead {
    /// The read-ahead in samples for consumers whose largest batch is `largest_batch`, on
    /// `threads` decode threads (`u64::MAX` for [`ReadAhead::Ring`]).
    pub fn samples(self, largest_batch: u64, threads: u64) -> u64 {
        match self {
            Self::Auto => (4 * largest_batch).max(READ_AHEAD_PER_THREAD * threads.max(1)),
            Self::Samples(n) => n.max(1),
            Self::Ring => u64::MAX,
        }
    }
}

impl std::str::FromStr for ReadAhead {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "ring" => Ok(Self::Ring),
            n => match n.parse::<u64>() {
                Ok(0) | Err(_) => Err(format!(
                    "read-ahead {n:?}: give a number of samples (at least 1), `auto` or `ring`"
                )),
                Ok(n) => Ok(Self::Samples(n)),
            },
        }
    }
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("ladle.sock"),
            ring_bytes: 256 << 20,
            augment: Transforms::train(224),
            threads: default_threads(),
            seed: 0,
            policy: BadSamplePolicy::Skip,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            keep_alive: None,
            read_ahead: ReadAhead::Auto,
            pacing: Pacing::Skim,
        }
    }
}

/// The producer could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// The ring's shape is invalid for these images.
    #[error("ring layout: {0}")]
    Layout(#[from] LayoutError),
    /// Creating the shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] ShmError),
    /// The control socket could not be set up.
    #[error("control socket {path}: {reason}")]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The decode pipeline failed (a bad sample under the fail policy, a bad option).
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// An option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
}

/// Where a feed's samples come from when they are not images the native pipeline decodes:
/// samples of any [`Schema`], made by one [`SampleMaker`] per pipeline thread (the Python
/// producer's makers hand each sample to a worker process that writes it into the slot).
pub trait CustomSource: Send + Sync + std::fmt::Debug {
    /// What a sample is.
    fn schema(&self) -> &Schema;
    /// Samples per epoch, class names (may be empty) and a name for logs.
    fn info(&self) -> DatasetInfo;
    /// A maker for one pipeline thread; called once per thread when the feed starts. It
    /// writes each sample into the slot's buffers it is given, in this process: the ring is
    /// sealed against every other writer.
    fn maker(&self) -> Box<dyn SampleMaker + '_>;
}

/// What a producer serves: a native image dataset, or a [`CustomSource`].
#[derive(Debug, Clone)]
enum Source {
    Images(Arc<dyn Dataset>),
    Custom(Arc<dyn CustomSource>),
}

/// How long a consumer has held the feed back, as the feeder watches it.
#[derive(Debug, Clone, Copy)]
struct Watch {
    lease: u64,
    cursor: u64,
    since: Instant,
    logged: bool,
}

/// One admitted consumer, as the producer tracks it.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) id: u64,
    /// For logs: quoted and escaped, at most [`server::MAX_NAME`] characters.
    pub(crate) name: String,
    /// Where its current attachment started (its cut point is `start mod N`).
    pub(crate) start: u64,
    pub(crate) page: Arc<CursorPage>,
    /// A handle to its socket, to tell it `End`, `Detached` or `Rejoined`.
    pub(crate) socket: std::os::unix::net::UnixStream,
    /// Whether its cursor gates the producer (false once let go, until it rejoins).
    pub(crate) attached: bool,
    watch: Option<Watch>,
    /// Its process id and batch size, as it said in `Hello`.
    pub(crate) pid: u32,
    pub(crate) batch_size: u32,
    /// When it joined.
    pub(crate) joined: Instant,
    /// Time it held the feed back in watches that have ended.
    pub(crate) held_back: Duration,
    /// Times it rejoined after a let-go.
    pub(crate) rejoins: u32,
    /// Asked to skim (its cursor page says so) and not attached again since.
    pub(crate) skim_asked: bool,
    /// Skimming: it said `Skim`, its cursor no longer gates the feed.
    pub(crate) skimming: bool,
    /// Times it was moved to skimming.
    pub(crate) skims: u32,
}

impl Member {
    /// A member just admitted (see [`server`]).
    pub(crate) fn new(
        id: u64,
        name: String,
        start: u64,
        page: Arc<CursorPage>,
        socket: std::os::unix::net::UnixStream,
        hello: (u32, u32),
    ) -> Self {
        Self {
            id,
            name,
            start,
            page,
            socket,
            attached: true,
            watch: None,
            pid: hello.0,
            batch_size: hello.1,
            joined: Instant::now(),
            held_back: Duration::ZERO,
            rejoins: 0,
            skim_asked: false,
            skimming: false,
            skims: 0,
        }
    }

    /// Ends its watch, if any, adding how long it ran to the time it held the feed back.
    fn end_watch(&mut self, now: Instant) {
        if let Some(w) = self.watch.take() {
            self.held_back += now.saturating_duration_since(w.since);
        }
    }

    /// What it has delivered, over all its attachments and while skimming, as its page
    /// says: at most what was published (`head`), whatever a hostile consumer writes there
    /// (a figure for reports, never for a decision).
    pub(crate) fn released(&self, head: u64) -> u64 {
        self.page.delivered().min(head)
    }
}

/// One consumer as [`Producer::consumer_stats`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Its id in the producer's logs.
    pub id: u64,
    /// Its name as logged: quoted and escaped (`"run-00"`).
    pub name: String,
    /// Samples it has released so far (read and dropped), over all its attachments.
    pub released: u64,
    /// Whether its cursor gates the producer (false while let go).
    pub attached: bool,
    /// How long it has been holding the feed back without taking a batch, if it is.
    pub holding_back: Option<Duration>,
}

/// What the feeder and the control server share.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) readers: Readers,
    pub(crate) cuts: CutPoints,
    pub(crate) members: Vec<Member>,
    pub(crate) next_id: u64,
    /// Consumer groups: ranks waiting for the others, and the ranks running.
    pub(crate) groups: groups::Groups,
    /// Whether some member has a watch (so that a loan, once per sample, need not look).
    watching: bool,
}

/// Everything the producer's threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) ring: ProducerRing,
    source: Source,
    pub(crate) info: DatasetInfo,
    /// What a consumer's saved position is checked against.
    pub(crate) identity: FeedIdentity,
    pub(crate) state: Mutex<State>,
    /// Signalled when a consumer joins or leaves.
    pub(crate) changed: Condvar,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) published: AtomicU64,
    pub(crate) bad: AtomicU64,
    /// Samples released by consumers that have left or been let go (see
    /// [`Producer::consumed`]).
    pub(crate) consumed: AtomicU64,
    pub(crate) stall_timeout: Duration,
    pub(crate) read_ahead: ReadAhead,
    pub(crate) pacing: Pacing,
    pub(crate) keep_alive: Option<Duration>,
    pub(crate) max_connections: usize,
    /// Connection threads alive.
    pub(crate) connections: AtomicUsize,
    /// When the producer started, and its decode threads (for [`FeedStats`]).
    started: Instant,
    threads: u32,
    /// Consumers admitted, gone and let go since the start.
    pub(crate) joins: AtomicU64,
    leaves: AtomicU64,
    let_gos: AtomicU64,
    /// Consumers moved to skimming since the start.
    pub(crate) skims: AtomicU64,
    /// CPU nanoseconds the decode threads used (counted as each completes a sample).
    pub(crate) decode_cpu_ns: AtomicU64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops consumer `id` (it left or died); its cut point dissolves.
    pub(crate) fn remove(&self, id: u64, why: &str) {
        let mut state = self.lock();
        if let Some(m) = self.forget(&mut state, id, why) {
            tracing::info!(consumer = m.id, name = %m.name, "consumer left ({why})");
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Takes consumer `id` out of every record: members, readers, cut points, its group
    /// (whose other ranks are told it broke, and why: `why`).
    fn forget(&self, state: &mut State, id: u64, why: &str) -> Option<Member> {
        let at = state.members.iter().position(|m| m.id == id)?;
        let m = state.members.swap_remove(at);
        if let Some((group, (others, rank))) = state.groups.gone(id) {
            if !others.is_empty() {
                self.tell_broken(state, &group, &others, rank, why);
            }
        }
        self.leaves.fetch_add(1, Ordering::Relaxed);
        state.readers.detach(id);
        if m.attached {
            state.cuts.remove(m.start % self.info.len);
        }
        let released = m.released(self.ring.head());
        self.consumed.fetch_add(released, Ordering::Relaxed);
        Some(m)
    }

    /// Tells the consumers `others` of group `group` that rank `rank` went (`why`): their
    /// group cannot go on. They stay attached until they leave.
    pub(crate) fn tell_broken(
        &self,
        state: &State,
        group: &str,
        others: &[u64],
        rank: u32,
        why: &str,
    ) {
        tracing::warn!(
            group,
            rank,
            "a rank of a consumer group went ({why}); the group is broken"
        );
        let message = ServerMessage::GroupBroken {
            rank,
            reason: why.to_owned(),
        };
        for m in state.members.iter().filter(|m| others.contains(&m.id)) {
            // The write timeout set at admission bounds a stalled peer.
            if let Err(e) = ladle_ring::protocol::send(&m.socket, &message, &[]) {
                tracing::debug!(consumer = m.id, "cannot tell it that its group broke: {e}");
            }
        }
    }

    /// Detaches consumer `id` for good (it broke the protocol): tells it why and closes its
    /// connection; nobody else is affected.
    pub(crate) fn detach(&self, state: &mut State, id: u64, reason: &str) {
        if let Some(m) = self.forget(state, id, reason) {
            tracing::warn!(consumer = m.id, name = %m.name, "consumer detached: {reason}");
            let reason = reason.to_owned();
            let _ = ladle_ring::protocol::send(&m.socket, &ServerMessage::Detached { reason }, &[]);
            let _ = m.socket.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Called while consumer `id`, at `cursor`, holds the feed back: lets it go once it has
    /// taken no batch for the stall timeout. Returns whether it did.
    fn check_stall(&self, state: &mut State, id: u64, cursor: u64) -> bool {
        let now = Instant::now();
        state.watching = true;
        // Only the consumer the gate waits on now holds the feed back: a watch left on
        // another (it was the slowest a moment ago) ends here, or its held-back time would
        // grow while it reads, and a later watch would start from its old instant.
        for other in state.members.iter_mut().filter(|m| m.id != id) {
            other.end_watch(now);
        }
        let Some(m) = state.members.iter_mut().find(|m| m.id == id) else {
            return false;
        };
        let lease = m.page.lease();
        let watch = match &mut m.watch {
            Some(w) if w.lease == lease && w.cursor == cursor => w,
            _ => {
                m.end_watch(now);
                m.watch = Some(Watch {
                    lease,
                    cursor,
                    since: now,
                    logged: false,
                });
                return false;
            }
        };
        let held = now.duration_since(watch.since);
        // Letting the only attached consumer go would help nobody (and cost it a rejoin): a
        // consumer that joins later is held back at most one poll, since the watch has run.
        let alone = state.readers.len() <= 1;
        if held < self.stall_timeout || alone {
            let worth_a_line = Duration::from_secs(1).min(self.stall_timeout / 2);
            if held >= worth_a_line && !watch.logged && !alone {
                watch.logged = true;
                tracing::info!(
                    consumer = m.id,
                    name = %m.name,
                    "the feed is held back by this consumer: no batch taken for {:.1} s",
                    held.as_secs_f64()
                );
            }
            return false;
        }
        if !m.page.let_go(lease) {
            m.end_watch(now); // it delivered a batch just now
            return false;
        }
        m.end_watch(now);
        self.let_gos.fetch_add(1, Ordering::Relaxed);
        m.attached = false;
        let (mid, start) = (m.id, m.start);
        tracing::warn!(
            consumer = mid,
            name = %m.name,
            "consumer let go: it held the feed back for {:.1} s without taking a batch \
             (stall timeout); the feed goes on, and it rejoins when it resumes",
            held.as_secs_f64()
        );
        state.readers.detach(mid);
        state.cuts.remove(start % self.info.len);
        true
    }

    /// How the feed is doing (see [`FeedStats`]); every consumer listed (the control server
    /// cuts the list to fit a frame).
    pub(crate) fn stats(&self) -> FeedStats {
        let now = Instant::now();
        let head = self.published.load(Ordering::Relaxed);
        let state = self.lock();
        let mut consumers: Vec<ConsumerInfo> = state
            .members
            .iter()
            .map(|m| {
                let lag = if m.attached {
                    head.saturating_sub(m.page.cursor())
                } else {
                    0
                };
                let holding = m.watch.map(|w| now.saturating_duration_since(w.since));
                ConsumerInfo {
                    id: m.id,
                    name: m.name.clone(),
                    pid: m.pid,
                    batch_size: m.batch_size,
                    connected_s: now.saturating_duration_since(m.joined).as_secs_f64(),
                    released: m.released(head),
                    lag,
                    attached: m.attached,
                    holding_back_s: holding.map(|d| d.as_secs_f64()),
                    held_back_s: (m.held_back + holding.unwrap_or_default()).as_secs_f64(),
                    waited_s: m.page.waited().as_secs_f64(),
                    rejoins: m.rejoins,
                    skimming: m.skimming,
                    skims: m.skims,
                }
            })
            .collect();
        drop(state);
        consumers.sort_by_key(|c| c.id);
        let capacity = self.ring.layout().capacity;
        let occupancy = consumers
            .iter()
            .filter(|c| c.attached)
            .map(|c| c.lag)
            .max()
            .unwrap_or(0)
            .min(capacity);
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        FeedStats {
            source: self.info.source.clone(),
            dataset_len: self.info.len,
            capacity,
            threads: self.threads,
            pid: std::process::id(),
            uptime_s: now.saturating_duration_since(self.started).as_secs_f64(),
            cpu_s: cpu.tv_sec as f64 + cpu.tv_nsec as f64 * 1e-9,
            decode_cpu_s: self.decode_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            published: head,
            bad: self.bad.load(Ordering::Relaxed),
            occupancy,
            joins: self.joins.load(Ordering::Relaxed),
            leaves: self.leaves.load(Ordering::Relaxed),
            let_gos: self.let_gos.load(Ordering::Relaxed),
            consumers,
            consumers_omitted: 0,
        }
    }

    /// Asks a consumer that held the others back to skim (the pacing rule decided it).
    fn ask_to_skim(&self, state: &mut State, ask: pacing::AskToSkim) {
        let Some(m) = state.members.iter_mut().find(|m| m.id == ask.id) else {
            return;
        };
        if !m.attached || m.skim_asked {
            return;
        }
        m.skim_asked = true;
        m.page.ask_to_skim();
        tracing::info!(
            consumer = m.id,
            name = %m.name,
            "asking the consumer to skim: it held the others back {:.1} s of the last {:.1} s \
             while they waited for data",
            ask.held.as_secs_f64(),
            ask.window.as_secs_f64()
        );
    }

    /// Consumer `id`, asked to skim, holds no batch of the ring any more: its cursor stops
    /// gating the feed (and its cut point dissolves), it copies what it needs as it passes.
    pub(crate) fn skim(&self, id: u64) -> Result<(), String> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let m = (state.members.iter_mut())
            .find(|m| m.id == id)
            .ok_or("Skim from an unknown consumer")?;
        if !m.skim_asked {
            return Err("sent Skim without being asked to skim".into());
        }
        if m.skimming {
            return Err("sent Skim twice".into());
        }
        m.skimming = true;
        m.skims += 1;
        self.skims.fetch_add(1, Ordering::Relaxed);
        if !m.attached {
            // Let go (a stall) since it was asked: nothing gates on it already.
            return Ok(());
        }
        m.end_watch(Instant::now());
        m.attached = false;
        let (mid, start) = (m.id, m.start);
        tracing::info!(
            consumer = mid,
            name = %m.name,
            "consumer skims: the feed goes on at the others' pace, and it copies what its \
             epoch still needs as the samples pass"
        );
        state.readers.detach(mid);
        state.cuts.remove(start % self.info.len);
        drop(guard);
        self.changed.notify_all();
        Ok(())
    }

    /// Forgets every watch: the feed is not held back.
    fn clear_watches(state: &mut State) {
        if std::mem::take(&mut state.watching) {
            let now = Instant::now();
            for m in &mut state.members {
                m.end_watch(now);
            }
        }
    }
}

/// Publishes completed samples in order (the ring's loans) and wakes consumers whose next
/// batch is complete.
struct RingSink<'a> {
    shared: &'a Shared,
}

impl<'a> SampleSink for RingSink<'a> {
    type Ticket = WriteLoan<'a>;

    fn write<R>(
        &self,
        loan: &mut WriteLoan<'a>,
        _: &WorkItem,
        fill: impl FnOnce(&mut [&mut [u8]]) -> R,
    ) -> R {
        fill(loan.slot().fields())
    }

    fn complete(&self, loan: WriteLoan<'a>, item: WorkItem, outcome: Result<(), &SampleError>) {
        self.count_cpu();
        let head = match outcome {
            Ok(()) => loan.commit(item.index),
            Err(_) => {
                self.shared.bad.fetch_add(1, Ordering::Relaxed);
                loan.commit_bad(item.index)
            }
        };
        if let Some(head) = head {
            self.shared.published.store(head, Ordering::Relaxed);
            // Wake only consumers whose next batch is now complete: one wake-up per batch.
            for m in &self.shared.lock().members {
                m.page.wake_if_due(head);
            }
        }
    }
}

thread_local! {
    /// This decode thread's CPU time when it last counted it, nanoseconds.
    static COUNTED_CPU_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl RingSink<'_> {
    /// Adds the CPU time this decode thread used since it last counted to the feed's decode
    /// CPU (a `clock_gettime` per sample: well under a microsecond beside a decode).
    fn count_cpu(&self) {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        let now = u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(now.tv_nsec).unwrap_or(0);
        let last = COUNTED_CPU_NS.with(|c| c.replace(now));
        // A thread's clock starts at its creation: its first count holds its start-up too.
        (self.shared.decode_cpu_ns).fetch_add(now.saturating_sub(last), Ordering::Relaxed);
    }
}

/// Reads a producer's [`FeedStats`] from any thread; see [`Producer::stats_source`].
#[derive(Debug, Clone)]
pub struct StatsSource(Arc<Shared>);

impl StatsSource {
    /// How the feed is doing now.
    pub fn stats(&self) -> FeedStats {
        self.0.stats()
    }
}

/// What a producer served, from [`Producer::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Samples published.
    pub published: u64,
    /// Samples consumers released, summed over consumers ([`Producer::consumed`]).
    pub consumed: u64,
    /// Of them, samples that could not be read or decoded (zero images, label −1).
    pub bad_samples: u64,
    /// CPU time its decode threads used: the feed's own cost per sample, without what else
    /// the process runs.
    pub decode_cpu: Duration,
}

/// A running producer.
#[derive(Debug)]
pub struct Producer {
    shared: Arc<Shared>,
    socket: PathBuf,
    feeder: Option<JoinHandle<Result<(), ProducerError>>>,
    server: Option<JoinHandle<()>>,
}

impl Producer {
    /// Creates the ring, binds the socket and starts the pipeline and the control server.
    pub fn start(dataset: Arc<dyn Dataset>, config: ProducerConfig) -> Result<Self, ProducerError> {
        Self::start_with_stop(dataset, config, Arc::new(AtomicBool::new(false)))
    }

    /// As [`Producer::start`], stopping when `stop` becomes true (e.g. set by a signal).
    pub fn start_with_stop(
        dataset: Arc<dyn Dataset>,
        config: ProducerConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<Self, ProducerError> {
        Self::start_source(Source::Images(dataset), config, stop)
    }

    /// Serves samples of any schema from `source` (see [`CustomSource`]); `config.augment`
    /// is not used. Stops when `stop` becomes true.
    pub fn start_custom(
        source: Arc<dyn CustomSource>,
        config: ProducerConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<Self, ProducerError> {
        Self::start_source(Source::Custom(source), config, stop)
    }

    fn start_source(
        source: Source,
        config: ProducerConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<Self, ProducerError> {
        let layout = match &source {
            Source::Images(_) => {
                let size = config.augment.size();
                RingLayout::image_for_budget(config.ring_bytes, size, size)?
            }
            Source::Custom(custom) => {
                RingLayout::for_budget(config.ring_bytes, custom.schema().clone())?
            }
        };
        if config.stall_timeout < Duration::from_millis(100) {
            return Err(ProducerError::InvalidOption(format!(
                "the stall timeout must be at least 100 ms, not {:?}",
                config.stall_timeout
            )));
        }
        if config.max_connections == 0 {
            return Err(ProducerError::InvalidOption(
                "max connections must be at least 1".into(),
            ));
        }
        let pipeline = PipelineConfig {
            threads: config.threads,
            augment: config.augment.clone(),
            seed: config.seed,
            policy: config.policy,
        }
        .build()?;
        let info = match &source {
            Source::Images(dataset) => DatasetInfo {
                len: dataset.len(),
                class_names: dataset.class_names().to_vec(),
                source: dataset.root().display().to_string(),
            },
            Source::Custom(custom) => custom.info(),
        };
        let identity = FeedIdentity {
            source: info.source.clone(),
            len: info.len,
            classes: FeedIdentity::hash_classes(&info.class_names),
            seed: config.seed,
            transform: match &source {
                Source::Images(_) => config.augment.to_string(),
                Source::Custom(_) => String::new(),
            },
            schema: layout.schema.to_string(),
        };
        let listener = server::bind(&config.socket)?;
        tracing::info!(
            "serving {} samples of {} on {} (ring: {} samples of {}, {} MiB, {} threads)",
            info.len,
            info.source,
            config.socket.display(),
            layout.capacity,
            layout.schema,
            layout.file_len() >> 20,
            config.threads
        );
        let ring = ProducerRing::create(layout)?;
        let readers = ring.readers().ok_or_else(|| {
            ProducerError::InvalidOption("the ring's reader set was already taken".into())
        })?;
        let shared = Arc::new(Shared {
            ring,
            source,
            info,
            identity,
            state: Mutex::new(State {
                readers,
                cuts: CutPoints::default(),
                members: Vec::new(),
                next_id: 0,
                groups: groups::Groups::default(),
                watching: false,
            }),
            changed: Condvar::new(),
            stop,
            published: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            stall_timeout: config.stall_timeout,
            read_ahead: config.read_ahead,
            pacing: config.pacing,
            keep_alive: config.keep_alive,
            max_connections: config.max_connections,
            connections: AtomicUsize::new(0),
            started: Instant::now(),
            threads: u32::try_from(config.threads).unwrap_or(u32::MAX),
            joins: AtomicU64::new(0),
            leaves: AtomicU64::new(0),
            let_gos: AtomicU64::new(0),
            skims: AtomicU64::new(0),
            decode_cpu_ns: AtomicU64::new(0),
        });
        let spawn_error = |e: std::io::Error| ProducerError::Socket {
            path: config.socket.clone(),
            reason: format!("cannot start a thread: {e}"),
        };
        let server = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ladle-control".into())
                .spawn(move || server::serve(listener, &shared))
                .map_err(spawn_error)?
        };
        let feeder = {
            let shared = shared.clone();
            let seed = config.seed;
            std::thread::Builder::new()
                .name("ladle-feeder".into())
                .spawn(move || run_feeder(&shared, &pipeline, seed))
                .map_err(spawn_error)?
        };
        Ok(Self {
            shared,
            socket: config.socket,
            feeder: Some(feeder),
            server: Some(server),
        })
    }

    /// The ring's layout.
    pub fn layout(&self) -> RingLayout {
        self.shared.ring.layout().clone()
    }

    /// Samples published so far.
    pub fn published(&self) -> u64 {
        self.shared.published.load(Ordering::Relaxed)
    }

    /// Samples published as bad (zero image, label −1) so far.
    pub fn bad_samples(&self) -> u64 {
        self.shared.bad.load(Ordering::Relaxed)
    }

    /// Samples consumers have released so far, summed over consumers (each attachment counts
    /// from where it started): what private pipelines would have decoded for the same reads.
    /// A batch still held is not counted until it is dropped.
    pub fn consumed(&self) -> u64 {
        let state = self.shared.lock();
        let live: u64 = state
            .members
            .iter()
            .map(|m| m.released(self.shared.ring.head()))
            .fold(0u64, u64::saturating_add);
        self.shared
            .consumed
            .load(Ordering::Relaxed)
            .saturating_add(live)
    }

    /// Every connected consumer: its name, what it has released, whether it holds the feed
    /// back and for how long (what a sweep's live view shows).
    pub fn consumer_stats(&self) -> Vec<ConsumerStats> {
        self.shared
            .stats()
            .consumers
            .into_iter()
            .map(|c| ConsumerStats {
                id: c.id,
                name: c.name,
                released: c.released,
                attached: c.attached,
                holding_back: c.holding_back_s.map(Duration::from_secs_f64),
            })
            .collect()
    }

    /// How the feed is doing: what `ladle top`, `--metrics` and `--record` show (the same
    /// answer a [`ClientMessage::Stats`](ladle_ring::protocol::ClientMessage::Stats) request
    /// on the socket gets).
    pub fn stats(&self) -> FeedStats {
        self.shared.stats()
    }

    /// A handle that reads [`Producer::stats`] from another thread (an observer), for as long
    /// as it lives.
    pub fn stats_source(&self) -> StatsSource {
        StatsSource(self.shared.clone())
    }

    /// Samples per epoch (the dataset's length).
    pub fn dataset_len(&self) -> u64 {
        self.shared.info.len
    }

    /// Live consumers (attached or let go).
    pub fn consumers(&self) -> usize {
        self.shared.lock().members.len()
    }

    /// Asks the producer to stop; [`Producer::wait`] returns once it has.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
    }

    /// Waits until the producer stops (after [`Producer::stop`] or the stop flag), tells every
    /// consumer `End`, and removes the socket file. Returns what it served.
    pub fn wait(mut self) -> Result<Served, ProducerError> {
        self.join()?;
        let consumed = self.consumed();
        Ok(Served {
            published: self.published(),
            consumed,
            bad_samples: self.bad_samples(),
            decode_cpu: Duration::from_nanos(self.shared.decode_cpu_ns.load(Ordering::Relaxed)),
        })
    }

    fn join(&mut self) -> Result<(), ProducerError> {
        let result = match self.feeder.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ProducerError::InvalidOption(
                "the feeder thread panicked".into(),
            )),
            None => Ok(()),
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        let reason = match &result {
            Ok(()) => "the producer is shutting down".to_owned(),
            Err(e) => format!("the producer failed: {e}"),
        };
        for m in &self.shared.lock().members {
            let _ = ladle_ring::protocol::send(
                &m.socket,
                &ServerMessage::End {
                    reason: reason.clone(),
                },
                &[],
            );
        }
        // After the messages, so that consumers read the reason before they see the flag.
        self.shared.ring.end();
        for m in &self.shared.lock().members {
            m.page.wake();
        }
        for m in &self.shared.lock().members {
            let _ = m.socket.shutdown(std::net::Shutdown::Both);
        }
        // The accept loop polls the stop flag: stopping does not depend on the socket file.
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        let _ = std::fs::remove_file(&self.socket);
        result
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if self.feeder.is_some() {
            self.stop();
            if let Err(e) = self.join() {
                tracing::error!("producer stopped with an error: {e}");
            }
        }
    }
}

/// How long the feeder sleeps before re-checking stop flags, joins, leaves and stalls.
const POLL: Duration = Duration::from_millis(50);

/// The longest the feeder sleeps on one consumer's demand while it is far enough ahead: the
/// consumer that asked for the most wakes it sooner, another that overtakes it within this.
const AHEAD_POLL: Duration = Duration::from_millis(10);

/// The pipeline's work: a write loan for each next sequence, with its dataset index.
struct FeedSource<'a> {
    shared: &'a Shared,
    feed: Feed,
    /// Since when no consumer is connected (after one was), for the keep-alive.
    alone_since: Option<Instant>,
    /// Who holds the others back (`None` under [`Pacing::Lockstep`]).
    pacer: Option<Pacer>,
}

impl<'a> WorkSource for FeedSource<'a> {
    type Item = (WorkItem, WriteLoan<'a>);

    fn next(&mut self, wait: bool) -> Poll<Option<Self::Item>> {
        let shared = self.shared;
        let mut state = shared.lock();
        loop {
            if shared.stop.load(Ordering::SeqCst) {
                return Poll::Ready(None);
            }
            let largest_batch = state
                .members
                .iter()
                .filter(|m| m.attached)
                .map(|m| u64::from(m.batch_size))
                .max()
                .unwrap_or(1);
            let read_ahead = shared
                .read_ahead
                .samples(largest_batch, u64::from(shared.threads));
            match shared.ring.try_loan_within(&state.readers, read_ahead) {
                Gate::Loan(loan) => {
                    let seq = loan.seq();
                    let (index, epoch) = self.feed.index_of(seq, &state.cuts);
                    Shared::clear_watches(&mut state);
                    return Poll::Ready(Some((WorkItem { seq, index, epoch }, loan)));
                }
                Gate::Violations(violations) => {
                    for v in violations {
                        let reason = format!(
                            "its cursor {} lies outside {}..={} (where it started .. the head)",
                            v.cursor,
                            v.floor,
                            v.head.max(v.floor)
                        );
                        shared.detach(&mut state, v.id, &reason);
                    }
                }
                Gate::Idle => {
                    if let Some(keep_alive) = shared.keep_alive
                        && state.members.is_empty()
                        && state.next_id > 0
                    {
                        let since = *self.alone_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= keep_alive {
                            tracing::info!(
                                "no consumer for {:.1} s (keep-alive): stopping",
                                keep_alive.as_secs_f64()
                            );
                            shared.stop.store(true, Ordering::SeqCst);
                            return Poll::Ready(None);
                        }
                    } else {
                        self.alone_since = None;
                    }
                    if !wait {
                        return Poll::Pending;
                    }
                    // Nobody to produce for: sleep until someone joins.
                    state = shared
                        .changed
                        .wait_timeout(state, POLL)
                        .map_or_else(|p| p.into_inner().0, |r| r.0);
                }
                Gate::Ahead { page, word } => {
                    if !wait {
                        return Poll::Pending;
                    }
                    // Far enough ahead of what consumers asked for: sleep until the consumer
                    // that asked for the most asks for more (it wakes us), at most
                    // AHEAD_POLL (another consumer may overtake it).
                    drop(state);
                    page.wait_for_demand(word, AHEAD_POLL);
                    state = shared.lock();
                }
                Gate::Full { id, cursor, page } => {
                    if shared.check_stall(&mut state, id, cursor) {
                        continue;
                    }
                    if !wait {
                        return Poll::Pending;
                    }
                    // Does it hold anyone back: another attached consumer asked for samples
                    // not published yet?
                    let head = shared.ring.head();
                    let others_waiting = state
                        .members
                        .iter()
                        .any(|m| m.attached && m.id != id && m.page.demand() > head);
                    // Ring full: sleep on the slowest consumer's cursor (it wakes us on
                    // release), at most POLL, so that stalls and stops are seen.
                    drop(state);
                    let asleep = Instant::now();
                    page.wait_for_release(cursor, POLL);
                    if page.cursor() == cursor && asleep.elapsed() < Duration::from_millis(1) {
                        // Its futex word disagrees with its cursor (a broken or hostile
                        // consumer): bound the rate instead of spinning.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    state = shared.lock();
                    if let Some(pacer) = &mut self.pacer {
                        pacer.held(id, asleep.elapsed(), others_waiting);
                        let now = Instant::now();
                        let recent = pacer.rule().recent;
                        // Attached and taking batches (a watch runs from its last one).
                        let candidates: Vec<u64> = (state.members.iter())
                            .filter(|m| m.attached)
                            .filter(|m| m.watch.is_none_or(|w| now - w.since < recent))
                            .map(|m| m.id)
                            .collect();
                        if let Some(ask) = pacer.tick(now, &candidates) {
                            shared.ask_to_skim(&mut state, ask);
                        }
                    }
                }
            }
        }
    }
}

/// Runs the pipeline over the feed until the producer stops.
fn run_feeder(
    shared: &Shared,
    pipeline: &ladle_datasets::pipeline::Pipeline,
    seed: u64,
) -> Result<(), ProducerError> {
    let source = FeedSource {
        shared,
        feed: Feed::new(shared.info.len, seed),
        alone_since: None,
        pacer: (shared.pacing == Pacing::Skim)
            .then(|| Pacer::new(PacingRule::default(), Instant::now())),
    };
    let sink = RingSink { shared };
    let run = match &shared.source {
        Source::Images(dataset) => pipeline.run_from(dataset.as_ref(), source, &sink),
        Source::Custom(custom) => pipeline.run_with(|| custom.maker(), source, &sink),
    };
    if let Err(error) = run {
        if shared.stop.load(Ordering::SeqCst) {
            // Asked to stop: a sample cut short by the stop (the Python producer kills a
            // worker still making one) is not a failure of the feed.
            tracing::debug!("the feed stopped with a sample unmade: {error}");
            return Ok(());
        }
        // A bad sample under the fail policy ends the whole feed, not just the pipeline:
        // whoever waits on the stop flag (a signal loop, the Python producer) sees it.
        tracing::error!("the feed stops: {error}");
        shared.stop.store(true, Ordering::SeqCst);
        return Err(error.into());
    }
    Ok(())
}
