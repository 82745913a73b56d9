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
//! - Only what an attached consumer needs is decoded (module `needs`, pure; protocol 13): a
//!   consumer reading part of an epoch (resumed, a rank's) declares what it still needs, and
//!   a position nobody needs passes as a hole (`FLAG_HOLE`), undecoded and not counted
//!   against the read-ahead.
//! - A feed stops by itself when its [`Lifetime`] says (module `lifetime`, pure: idle after
//!   its last consumer, orphaned when none came, never while a driver holds it); a `Hello`
//!   after that decision is refused as `STOPPING`.
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
//!   fields and one [`SampleMaker`](ladle_datasets::pipeline::SampleMaker) per pipeline thread ([`Producer::start_custom`]). The
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

mod cache;
mod config;
mod error;
mod feed;
mod feeder;
mod groups;
mod lifetime;
mod members;
mod needs;
mod pacing;
pub mod server;
mod sink;
mod source;
pub mod workers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ladle_datasets::Dataset;
use ladle_datasets::pipeline::PipelineConfig;
use ladle_ring::protocol::{
    ClassNameFrames, DatasetInfo, FeedIdentity, FeedStats, PROTOCOL_VERSION, ServerMessage, Welcome,
};
use ladle_ring::{ProducerRing, RingLayout};

use crate::feed::CutPoints;
pub use crate::pacing::Pacing;

pub use crate::config::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_STALL_TIMEOUT, ProducerConfig, READ_AHEAD_PER_THREAD,
    ReadAhead,
};
pub use crate::error::ProducerError;
use crate::feeder::run_feeder;
pub use crate::lifetime::Lifetime;
pub use crate::members::ConsumerStats;
use crate::members::{Shared, State};
pub use crate::source::CustomSource;
use crate::source::Source;

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
        let mut pipeline = PipelineConfig {
            threads: config.threads,
            augment: config.augment.clone(),
            seed: config.seed,
            policy: config.policy,
            limits: config.limits,
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
        // What the samples are, wherever they lie: a saved position is checked against it,
        // not against the path (a `stat` per ImageFolder file, over threads).
        let data = match &source {
            Source::Images(dataset) => {
                let started = Instant::now();
                let data = dataset.fingerprint();
                tracing::debug!(
                    "fingerprinted {} samples in {:.3} s",
                    info.len,
                    started.elapsed().as_secs_f64()
                );
                data
            }
            Source::Custom(_) => ladle_datasets::Fingerprint::default(),
        };
        let cache = match (&source, &config.cache) {
            (Source::Images(dataset), Some(start)) => {
                cache::client(dataset.as_ref(), &data, start, config.threads)
            }
            _ => None,
        };
        if let Some(cache) = &cache {
            pipeline.set_cache(cache.clone());
        }
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
            files: data.files,
            sizes: data.sizes,
        };
        // How the class names travel: in the Welcome, or before it when they do not fit its
        // frame (20 000 classes do not). Decided here, so that a feed no consumer could join
        // does not start.
        let class_names = ClassNameFrames::plan(&Welcome {
            version: PROTOCOL_VERSION,
            consumer_id: u64::MAX,
            layout: layout.clone(),
            dataset: info.clone(),
            start_seq: u64::MAX,
            identity: identity.clone(),
        })
        .map_err(|e| ProducerError::InvalidOption(e.to_string()))?;
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
            class_names,
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
            lifetime: config.lifetime,
            max_connections: config.max_connections,
            connections: AtomicUsize::new(0),
            started: Instant::now(),
            threads: u32::try_from(config.threads).unwrap_or(u32::MAX),
            joins: AtomicU64::new(0),
            leaves: AtomicU64::new(0),
            let_gos: AtomicU64::new(0),
            skims: AtomicU64::new(0),
            holes: AtomicU64::new(0),
            decode_cpu_ns: AtomicU64::new(0),
            cache,
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

    /// Samples published so far: decoded (or bad), not the positions let pass as holes.
    pub fn published(&self) -> u64 {
        (self.shared.published.load(Ordering::Relaxed))
            .saturating_sub(self.shared.holes.load(Ordering::Relaxed))
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
