//! Samples made by worker processes: the engine of the Python producer (`ladle.serve`), where
//! the user's own `Dataset` and transforms run in Python worker processes.
//!
//! ```text
//! pipeline thread (a WorkerMaker)             worker process (Python, ladle._worker)
//!                                      ◄── connect to the workers' socket (0600, same uid)
//!                                      ◄── {"token", "pid"}
//!   {"fields", "len"} + its staging fd  ──►   maps its staging buffer read-write
//!   {"index", "epoch"}                  ──►   sample = dataset[index]; writes each field
//!                                             into its staging buffer
//!                                      ◄── {"ok": true} | {"error": "..."}
//!   copies the staging buffer into the slot it holds the write loan of
//! ```
//! Frames are the control protocol's (`u32` length + JSON).
//!
//! # Why workers never touch the ring
//! The ring is sealed like the native producer's (`F_SEAL_FUTURE_WRITE`): once sealed, nobody
//! can map it writable or `write(2)` it, a consumer holding its fd included, whatever it
//! re-opens through `/proc` or however it changes the file's mode. Workers start, die and are
//! replaced after the seal, so they could not map the ring writable; instead each worker
//! gets a staging buffer of its own (a memfd of one sample, its size sealed so that a worker
//! cannot shrink it under the producer's mapping), writes the sample there, and the pipeline
//! thread copies it into the slot: one `memcpy` per sample more than writing the slot
//! directly (its cost is in `benches/README.md`, "The Python producer: the cost of the sealed
//! ring"). Consumers never get a staging buffer, and a worker writes only its own.
//!
//! # Admission
//! A connection gets [`WorkerPoolConfig::hello_timeout`] (5 s) to present the pool's token;
//! handshakes run at the same time, each on its own thread, at most
//! [`WorkerPoolConfig::max_handshakes`] (64) at once: a connection over the cap is refused at
//! once with a `{"error"}` frame that says why, so idle connections cannot keep a worker out.
//!
//! # Deaths, timeouts and stopping
//! A worker that dies (EOF on its socket) while making a sample, or takes longer than the
//! pool's sample timeout on one (it is then killed: `SIGKILL` to the pid the kernel gives
//! for its socket, never one it claims), is logged with its pid and the sample index and
//! counted; the sample is made again by another worker (the process that started the workers
//! replaces the dead one). A sample that kills two workers, or that the user's code fails on
//! (an exception, a value that does not fit the schema), is a bad sample under the producer's
//! policy: every field zero, the bad flag, counted and logged. When the feed stops, a worker
//! still inside a sample a quarter of a second later is killed the same way (its
//! `__getitem__` may never return), and idle workers are let go (their socket closes, and
//! they exit).
//!
//! # Layout
//! - `handshake`: the accept loop, admitting a worker (peer uid, token, its staging buffer)
//!   or refusing it;
//! - `staging`: where each field lies in a worker's staging buffer, and making one;
//! - `maker`: [`WorkerSource`] and the pipeline thread's side: a request to a worker, its
//!   answer or death, the copy into the slot;
//! - this module: [`WorkerPool`], its configuration and counters, the idle workers.

mod handshake;
mod maker;
mod staging;
#[cfg(test)]
mod tests;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ladle_ring::Schema;
use ladle_ring::sys::Mapping;

use crate::ProducerError;

pub use self::maker::WorkerSource;

use self::staging::StagingPlan;

/// How long a maker waits for any worker before the sample counts as failed.
pub const NO_WORKER_TIMEOUT: Duration = Duration::from_secs(120);

/// Once a worker has begun its answer, how long it has to finish it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a waiting maker or the accept loop looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Once the feed stops, how long a worker inside a sample has to finish it before it is
/// killed (its `__getitem__` may never return).
const STOP_GRACE: Duration = Duration::from_millis(250);

/// How a [`WorkerPool`] admits and times its workers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerPoolConfig {
    /// What a worker must present: the process that starts the workers hands it to them.
    pub token: String,
    /// A worker that takes longer on one sample is killed (its sample made again by another);
    /// `None`: no limit.
    pub sample_timeout: Option<Duration>,
    /// How long a new connection has to say hello (5 s); handshakes run at the same time.
    pub hello_timeout: Duration,
    /// How many connections may be saying hello at once (64); more are refused with a reason.
    pub max_handshakes: usize,
}

impl WorkerPoolConfig {
    /// The defaults, with `token`.
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            sample_timeout: None,
            hello_timeout: Duration::from_secs(5),
            max_handshakes: 64,
        }
    }
}

/// A connected worker.
#[derive(Debug)]
struct Worker {
    conn: UnixStream,
    pid: u32,
    /// Its pid with its start time, read at admission: what a kill goes through, so that a
    /// worker that died and whose pid was reused is never the one signalled.
    process: Option<ladle_os::process::ProcessId>,
    /// The producer's read-only view of the worker's staging buffer.
    staging: Mapping,
}

/// Counters of a [`WorkerPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerCounts {
    /// Workers that connected since the start.
    pub connected: u64,
    /// Workers that died (closed their socket) while making a sample, or were killed for
    /// overrunning the sample timeout.
    pub died: u64,
    /// Samples that worker processes reported failing on (an exception in the user's code,
    /// a value that does not fit the schema).
    pub failed: u64,
    /// Connections refused because [`WorkerPoolConfig::max_handshakes`] were already saying
    /// hello.
    pub refused: u64,
}

/// The workers' socket and the workers waiting on it; see the module docs.
#[derive(Debug)]
pub struct WorkerPool {
    path: PathBuf,
    schema: Schema,
    plan: StagingPlan,
    config: WorkerPoolConfig,
    idle_tx: crossbeam_channel::Sender<Worker>,
    idle_rx: crossbeam_channel::Receiver<Worker>,
    stop: Arc<AtomicBool>,
    /// Connections saying hello now.
    handshakes: AtomicUsize,
    connected: AtomicU64,
    died: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    accept: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl WorkerPool {
    /// Binds the workers' socket at `path` (mode 0600) for workers making samples of
    /// `schema`, and accepts them on a thread until `stop` is set.
    pub fn bind(
        path: &Path,
        schema: Schema,
        config: WorkerPoolConfig,
        stop: Arc<AtomicBool>,
    ) -> Result<Arc<Self>, ProducerError> {
        if config.max_handshakes == 0 {
            return Err(ProducerError::InvalidOption(
                "the workers' socket must admit at least one handshake at a time".into(),
            ));
        }
        let listener = crate::server::bind(path)?;
        let (idle_tx, idle_rx) = crossbeam_channel::unbounded();
        let pool = Arc::new(Self {
            path: path.to_owned(),
            plan: StagingPlan::for_schema(&schema),
            schema,
            config,
            idle_tx,
            idle_rx,
            stop,
            handshakes: AtomicUsize::new(0),
            connected: AtomicU64::new(0),
            died: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            accept: Mutex::new(None),
        });
        let handle = {
            let pool = Arc::clone(&pool);
            std::thread::Builder::new()
                .name("ladle-workers".into())
                .spawn(move || pool.accept_loop(&listener))
                .map_err(|e| ProducerError::Socket {
                    path: path.to_owned(),
                    reason: format!("cannot start a thread: {e}"),
                })?
        };
        *pool.accept.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(pool)
    }

    /// Once the stop flag is set: waits for the accept loop to let the idle workers go and
    /// remove the socket file (within `POLL`, 100 ms), so that the path is free on return.
    pub fn join(&self) {
        let handle = self.accept.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle
            && handle.join().is_err()
        {
            tracing::error!("the accept loop of {} panicked", self.path.display());
        }
    }

    /// The workers' socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the workers make.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// How many workers connected, died and failed samples, and connections refused, so far.
    pub fn counts(&self) -> WorkerCounts {
        WorkerCounts {
            connected: self.connected.load(Ordering::Relaxed),
            died: self.died.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
    /// A worker for a maker: an idle one, waiting up to [`NO_WORKER_TIMEOUT`].
    fn take(&self) -> Result<Worker, String> {
        let started = Instant::now();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Err("the producer is stopping".into());
            }
            match self.idle_rx.recv_timeout(POLL) {
                Ok(worker) => return Ok(worker),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err("the worker pool is gone".into());
                }
            }
            if started.elapsed() >= NO_WORKER_TIMEOUT {
                return Err(format!(
                    "no worker process connected to {} for {} s",
                    self.path.display(),
                    NO_WORKER_TIMEOUT.as_secs()
                ));
            }
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
