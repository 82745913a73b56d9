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
//! - A slot is reused only once every live consumer has released it (backpressure: the sweep
//!   moves at the pace of its slowest consumer), unless `max_lag` detaches a laggard.
//! - The control server ([`server`]) binds the socket with mode 0600, refuses peers of another
//!   uid (`SO_PEERCRED`), and treats EOF as a leave: a consumer that exits, crashes or is
//!   killed with `SIGKILL` is dropped at once and its hold on the ring released.
//!
//! A sample that cannot be read or decoded is, under the default skip policy, delivered as an
//! all-zero image with label `-1` (so that every consumer's epoch keeps its length and its
//! coverage), and logged with its file name.
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
//! `info`: start, each consumer's join and leave; `warn`: a bad sample skipped, a consumer
//! detached or refused; `error`: a failure that ends the producer.

mod feed;
pub mod server;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use ladle_datasets::augment::Augment;
use ladle_datasets::pipeline::{PipelineConfig, SampleSink, WorkItem, default_threads};
use ladle_datasets::{BadSamplePolicy, Dataset, PipelineError, SampleError};
use ladle_ring::protocol::{DatasetInfo, ServerMessage};
use ladle_ring::{CursorPage, LayoutError, ProducerRing, RingLayout, ShmError, protocol_core};

use crate::feed::{CutPoints, Feed};

/// Producer settings; `Default` gives a 256 MiB ring of 224×224 training samples.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// The control socket's path.
    pub socket: PathBuf,
    /// Bytes of shared memory for the ring.
    pub ring_bytes: u64,
    /// The augmentation; its size is the ring's image size.
    pub augment: Augment,
    /// Decode threads.
    pub threads: usize,
    /// Seed of the permutations and the augmentation.
    pub seed: u64,
    /// What to do with samples that cannot be decoded.
    pub policy: BadSamplePolicy,
    /// Detach a consumer more than this many samples behind the head (`None`: never; the
    /// producer waits for the slowest).
    pub max_lag: Option<u64>,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("ladle.sock"),
            ring_bytes: 256 << 20,
            augment: Augment::train(224),
            threads: default_threads(),
            seed: 0,
            policy: BadSamplePolicy::Skip,
            max_lag: None,
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
    /// `max_lag` is smaller than a ring's worth of samples.
    #[error("invalid option: {0}")]
    InvalidOption(String),
}

/// One admitted consumer, as the producer tracks it.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) start: u64,
    pub(crate) cursor: Arc<CursorPage>,
    /// A handle to its socket, to tell it `End` or `Detached`.
    pub(crate) socket: std::os::unix::net::UnixStream,
}

/// What the feeder and the control server share.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The next sequence number the feeder will hand out; a joining consumer starts here.
    pub(crate) next_seq: u64,
    pub(crate) cuts: CutPoints,
    pub(crate) members: Vec<Member>,
    pub(crate) next_id: u64,
}

/// Everything the producer's threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) ring: ProducerRing,
    pub(crate) dataset: Arc<dyn Dataset>,
    pub(crate) info: DatasetInfo,
    pub(crate) state: Mutex<State>,
    /// Signalled when a consumer joins or leaves.
    pub(crate) changed: Condvar,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) published: AtomicU64,
    pub(crate) max_lag: Option<u64>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops consumer `id` (it left, died or was detached); its cut point dissolves.
    pub(crate) fn remove(&self, id: u64, why: &str) {
        let mut state = self.lock();
        if let Some(at) = state.members.iter().position(|m| m.id == id) {
            let m = state.members.swap_remove(at);
            let offset = m.start % self.info.len;
            state.cuts.remove(offset);
            tracing::info!(consumer = m.id, name = %m.name, "consumer left ({why})");
        }
        drop(state);
        self.changed.notify_all();
    }
}

/// Publishes completed samples in order: the head advances over a run of finished slots.
struct RingSink<'a> {
    shared: &'a Shared,
    done: Mutex<(u64, Vec<bool>)>,
}

impl SampleSink for RingSink<'_> {
    fn write<R>(&self, seq: u64, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        // SAFETY: the feeder hands out each `seq` once, only after `may_write` held for every
        // live consumer's cursor, and the head is not past it until `complete` publishes it;
        // so this worker is the only one touching the slot and no consumer reads it.
        let (image, _, _) = unsafe { self.shared.ring.slot_mut(seq) };
        fill(image)
    }

    fn complete(&self, item: WorkItem, outcome: Result<i64, &SampleError>) {
        // SAFETY: as in `write`: the slot is still exclusively this item's.
        let (image, label, index) = unsafe { self.shared.ring.slot_mut(item.seq) };
        *index = item.index;
        *label = match outcome {
            Ok(label) => label,
            Err(_) => {
                image.fill(0);
                -1
            }
        };
        let capacity = self.shared.ring.layout().capacity;
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (head, flags) = &mut *done;
        flags[(item.seq % capacity) as usize] = true;
        let old = *head;
        while flags[(*head % capacity) as usize] {
            flags[(*head % capacity) as usize] = false;
            *head += 1;
        }
        if *head != old {
            self.shared.ring.publish(*head);
            self.shared.published.store(*head, Ordering::Relaxed);
            // Wake only consumers whose next batch is now complete: one wake-up per batch.
            for m in &self.shared.lock().members {
                m.cursor.wake_if_due(*head);
            }
        }
    }
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
        let size = config.augment.size();
        let layout = RingLayout::for_budget(config.ring_bytes, size, size)?;
        if let Some(lag) = config.max_lag {
            // A consumer is never more than a ring behind (backpressure), so a lag of C or
            // more could never trigger; below the largest batch it would detach at once.
            if lag < layout.max_batch() || lag >= layout.capacity {
                return Err(ProducerError::InvalidOption(format!(
                    "max lag {lag} must be between the largest batch ({}) and the ring's \
                     capacity ({}) minus one",
                    layout.max_batch(),
                    layout.capacity
                )));
            }
        }
        let pipeline = PipelineConfig {
            threads: config.threads,
            augment: config.augment,
            seed: config.seed,
            policy: config.policy,
        }
        .build()?;
        let listener = server::bind(&config.socket)?;
        let ring = ProducerRing::create(layout)?;
        let info = DatasetInfo {
            len: dataset.len(),
            class_names: dataset.class_names().to_vec(),
            source: dataset.root().display().to_string(),
        };
        tracing::info!(
            "serving {} samples of {} on {} (ring: {} samples of {size}x{size}, {} MiB, {} threads)",
            info.len,
            info.source,
            config.socket.display(),
            layout.capacity,
            layout.file_len() >> 20,
            config.threads
        );
        let shared = Arc::new(Shared {
            ring,
            dataset,
            info,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stop,
            published: AtomicU64::new(0),
            max_lag: config.max_lag,
        });
        let server = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ladle-control".into())
                .spawn(move || server::serve(listener, &shared))
                .map_err(|e| ProducerError::Socket {
                    path: config.socket.clone(),
                    reason: e.to_string(),
                })?
        };
        let feeder = {
            let shared = shared.clone();
            let seed = config.seed;
            std::thread::Builder::new()
                .name("ladle-feeder".into())
                .spawn(move || run_feeder(&shared, &pipeline, seed))
                .map_err(|e| ProducerError::Socket {
                    path: config.socket.clone(),
                    reason: e.to_string(),
                })?
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
        *self.shared.ring.layout()
    }

    /// Samples published so far.
    pub fn published(&self) -> u64 {
        self.shared.published.load(Ordering::Relaxed)
    }

    /// Live consumers.
    pub fn consumers(&self) -> usize {
        self.shared.lock().members.len()
    }

    /// Asks the producer to stop; [`Producer::wait`] returns once it has.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
    }

    /// Waits until the producer stops (after [`Producer::stop`] or the stop flag), tells every
    /// consumer `End`, and removes the socket file. Returns the samples published.
    pub fn wait(mut self) -> Result<u64, ProducerError> {
        self.join()?;
        Ok(self.published())
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
            m.cursor.wake();
        }
        for m in &self.shared.lock().members {
            let _ = m.socket.shutdown(std::net::Shutdown::Both);
        }
        server::wake_listener(&self.socket);
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

/// How long the feeder sleeps before re-checking stop flags, joins and leaves.
const POLL: Duration = Duration::from_millis(50);

/// Hands out `(seq, index, epoch)` items to the pipeline, waiting for room in the ring.
fn run_feeder(
    shared: &Shared,
    pipeline: &ladle_datasets::pipeline::Pipeline,
    seed: u64,
) -> Result<(), ProducerError> {
    let capacity = shared.ring.layout().capacity;
    let mut feed = Feed::new(shared.info.len, seed);
    let items = std::iter::from_fn(|| {
        let mut state = shared.lock();
        loop {
            if shared.stop.load(Ordering::SeqCst) {
                return None;
            }
            let seq = state.next_seq;
            let head = shared.ring.head();
            detach_laggards(shared, &mut state, head);
            let slowest = state.members.iter().min_by_key(|m| m.cursor.cursor());
            let Some(slowest) = slowest else {
                // Nobody to produce for: sleep until someone joins.
                state = shared
                    .changed
                    .wait_timeout(state, POLL)
                    .map_or_else(|p| p.into_inner().0, |r| r.0);
                continue;
            };
            let min_cursor = slowest.cursor.cursor();
            if protocol_core::may_write(seq, min_cursor, capacity) {
                let (index, epoch) = feed.index_of(seq, &state.cuts);
                state.next_seq += 1;
                return Some(WorkItem { seq, index, epoch });
            }
            // Ring full: sleep on the slowest consumer's cursor (it wakes us on release).
            let page = slowest.cursor.clone();
            drop(state);
            page.wait_for_release(min_cursor, POLL);
            state = shared.lock();
        }
    });
    let sink = RingSink {
        shared,
        done: Mutex::new((0, vec![false; capacity as usize])),
    };
    pipeline.run(shared.dataset.as_ref(), items, &sink)?;
    Ok(())
}

/// With `max_lag` set, detaches every consumer more than that many samples behind `head`.
fn detach_laggards(shared: &Shared, state: &mut State, head: u64) {
    let Some(lag) = shared.max_lag else { return };
    let (late, keep): (Vec<Member>, Vec<Member>) = state
        .members
        .drain(..)
        .partition(|m| head.saturating_sub(m.cursor.cursor()) > lag);
    state.members = keep;
    for m in late {
        state.cuts.remove(m.start % shared.info.len);
        let reason = format!(
            "consumer {:?} fell more than {lag} samples behind the producer and was detached",
            m.name
        );
        tracing::warn!(consumer = m.id, "{reason}");
        let _ = ladle_ring::protocol::send(&m.socket, &ServerMessage::Detached { reason }, &[]);
        let _ = m.socket.shutdown(std::net::Shutdown::Both);
    }
}
