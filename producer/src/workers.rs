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

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ladle_datasets::SampleError;
use ladle_datasets::pipeline::{SampleMaker, WorkItem};
use ladle_ring::ProtocolError;
use ladle_ring::Schema;
use ladle_ring::protocol::{self, DatasetInfo};
use ladle_ring::sys::{self, Mapping, PAGE};
use serde::{Deserialize, Serialize};

use crate::{CustomSource, ProducerError};

/// A worker's first message.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerHello {
    /// The pool's token (proves the worker was started by the producer's own process).
    token: String,
    /// The worker's process id, for logs.
    pid: u32,
}

/// The answer to [`WorkerHello`]; the worker's staging fd comes with it.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerWelcome {
    /// `(offset, length)` of every field of the schema in the staging buffer, in order.
    fields: Vec<(u64, usize)>,
    /// The staging buffer's length in bytes.
    len: u64,
}

/// What a refused connection gets instead of a welcome.
#[derive(Debug, Serialize, Deserialize)]
struct Refusal {
    error: String,
}

/// One sample to make.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    index: u64,
    epoch: u64,
}

/// A worker's answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    #[serde(default)]
    ok: bool,
    #[serde(default)]
    error: Option<String>,
}

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

/// Where each field of a sample lies in a worker's staging buffer.
#[derive(Debug)]
struct StagingPlan {
    /// `(offset, length)` per schema field, each offset a multiple of 64.
    fields: Vec<(u64, usize)>,
    /// The buffer's length: whole pages.
    len: usize,
}

impl StagingPlan {
    fn for_schema(schema: &Schema) -> Self {
        let mut at = 0usize;
        let fields = schema
            .fields()
            .iter()
            .map(|field| {
                let place = (at as u64, field.bytes());
                at = (at + field.bytes()).next_multiple_of(64);
                place
            })
            .collect();
        Self {
            fields,
            len: at.max(1).next_multiple_of(PAGE),
        }
    }

    /// A new staging buffer: the fd for the worker (read-write, its size sealed) and the
    /// producer's read-only mapping of it.
    fn create(&self) -> Result<(OwnedFd, Mapping), String> {
        let fd = sys::memfd("ladle-staging", self.len as u64)
            .map_err(|e| format!("cannot make a staging buffer: {e}"))?;
        // A worker that shrank it would kill the producer with SIGBUS on its next copy.
        sys::seal_size(fd.as_fd()).map_err(|e| format!("cannot seal a staging buffer: {e}"))?;
        let map = Mapping::new(fd.as_fd(), 0, self.len, false, false)
            .map_err(|e| format!("cannot map a staging buffer: {e}"))?;
        map.prefault(false)
            .map_err(|e| format!("cannot pre-fault a staging buffer: {e}"))?;
        Ok((fd, map))
    }
}

/// A connected worker.
#[derive(Debug)]
struct Worker {
    conn: UnixStream,
    pid: u32,
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
    /// remove the socket file (within [`POLL`]), so that the path is free on return.
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

    fn accept_loop(self: Arc<Self>, listener: &UnixListener) {
        while !self.stop.load(Ordering::SeqCst) {
            let mut fds = [rustix::event::PollFd::new(
                listener,
                rustix::event::PollFlags::IN,
            )];
            if rustix::event::poll(&mut fds, Some(&timespec(POLL))).is_err() {
                continue;
            }
            match listener.accept() {
                Ok((conn, _)) => self.handshake(conn),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    tracing::warn!("cannot accept a worker ({e}); backing off");
                    std::thread::sleep(POLL);
                }
            }
        }
        // The feed is stopping: idle workers are let go (EOF on their socket; they exit).
        while self.idle_rx.try_recv().is_ok() {}
        let _ = std::fs::remove_file(&self.path);
    }

    /// Runs `conn`'s handshake on a thread of its own, or refuses it when
    /// [`WorkerPoolConfig::max_handshakes`] are under way.
    fn handshake(self: &Arc<Self>, conn: UnixStream) {
        let max = self.config.max_handshakes;
        let place = self
            .handshakes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            });
        if place.is_err() {
            self.refuse(
                &conn,
                &format!(
                    "{max} connections are already saying hello on {}",
                    self.path.display()
                ),
            );
            return;
        }
        let pool = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("ladle-worker-hello".into())
            .spawn(move || {
                let admitted = pool.admit(conn);
                pool.handshakes.fetch_sub(1, Ordering::SeqCst);
                if let Err(why) = admitted {
                    tracing::warn!("refused a worker on {}: {why}", pool.path.display());
                }
            });
        if let Err(e) = spawned {
            // The closure, and the connection with it, is dropped: the peer sees EOF.
            self.handshakes.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("cannot start a thread for a worker's hello ({e}); closed it");
        }
    }

    fn refuse(&self, conn: &UnixStream, why: &str) {
        let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        // Logged at 1, 2, 4, 8, ... refusals: a flood of connections is not a flood of logs.
        if refused.is_power_of_two() {
            tracing::warn!("refused a connection ({refused} so far): {why}");
        }
        // Into an empty socket buffer: never blocks the accept loop.
        let _ = conn.set_nonblocking(true);
        let _ = protocol::send(
            conn,
            &Refusal {
                error: why.to_owned(),
            },
            &[],
        );
    }

    fn admit(&self, conn: UnixStream) -> Result<(), String> {
        conn.set_nonblocking(false).map_err(|e| e.to_string())?;
        let cred = rustix::net::sockopt::socket_peercred(&conn).map_err(|e| e.to_string())?;
        let uid = cred.uid.as_raw();
        if uid != sys::my_uid() {
            return Err(format!("its uid {uid} is not this process's"));
        }
        let deadline = Instant::now() + self.config.hello_timeout;
        let (hello, _) = protocol::recv_by::<WorkerHello>(&conn, deadline)
            .map_err(|e| format!("no hello: {e}"))?;
        if !same_token(&hello.token, &self.config.token) {
            return Err(format!("pid {} presented a wrong token", hello.pid));
        }
        let (fd, staging) = self.plan.create()?;
        let welcome = WorkerWelcome {
            fields: self.plan.fields.clone(),
            len: self.plan.len as u64,
        };
        protocol::send(&conn, &welcome, &[fd.as_fd()]).map_err(|e| e.to_string())?;
        self.connected.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(pid = hello.pid, "worker connected");
        // The kernel's pid for the socket, not the one the hello claims: it is what a
        // timeout kills.
        let pid = u32::try_from(cred.pid.as_raw_nonzero().get()).unwrap_or(hello.pid);
        let worker = Worker { conn, pid, staging };
        if self.stop.load(Ordering::SeqCst) {
            return Ok(()); // let go at once: the feed is stopping
        }
        self.idle_tx.send(worker).map_err(|e| e.to_string())
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

/// Compares tokens in time that does not depend on where they differ.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn timespec(d: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// `SIGKILL` to a worker by the pid the kernel gave for its socket; never to this process
/// (a worker that is a thread of it, in tests).
fn kill(pid: u32) {
    if pid == std::process::id() {
        return;
    }
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Samples of the pool's schema made by the workers of a [`WorkerPool`].
#[derive(Debug)]
pub struct WorkerSource {
    info: DatasetInfo,
    pool: Arc<WorkerPool>,
}

impl WorkerSource {
    /// A source of `info.len` samples of the pool's schema, made by `pool`'s workers.
    pub fn new(info: DatasetInfo, pool: Arc<WorkerPool>) -> Self {
        Self { info, pool }
    }
}

impl CustomSource for WorkerSource {
    fn schema(&self) -> &Schema {
        self.pool.schema()
    }

    fn info(&self) -> DatasetInfo {
        self.info.clone()
    }

    fn maker(&self) -> Box<dyn SampleMaker + '_> {
        Box::new(WorkerMaker {
            pool: &self.pool,
            source: &self.info.source,
            worker: None,
        })
    }
}

/// How one request to a worker ended.
enum Outcome {
    /// The sample is in the worker's staging buffer.
    Made,
    /// The user's code failed on it (an exception, a value that does not fit the schema).
    Failed(String),
    /// The worker died or was killed for overrunning: another may try.
    Died(String),
    /// No worker came, or the feed is stopping: nobody tries again.
    GaveUp(String),
}

/// How waiting for a worker's answer ended.
enum Waited {
    Answer(Reply),
    Closed(ProtocolError),
    /// The sample timeout passed, or a begun answer was not finished in [`ANSWER_TIMEOUT`].
    Overran(Duration),
    Stopped,
}

/// One pipeline thread's worker.
struct WorkerMaker<'a> {
    pool: &'a WorkerPool,
    source: &'a str,
    worker: Option<Worker>,
}

impl WorkerMaker<'_> {
    fn error(&self, item: &WorkItem, message: String) -> SampleError {
        SampleError::Source {
            location: format!("index {} of {}", item.index, self.source),
            message,
        }
    }

    /// Waits for `worker`'s answer, looking at the sample timeout and the stop flag every
    /// [`POLL`]: once the feed stops, the worker has [`STOP_GRACE`] to answer.
    fn wait_for_answer(&self, worker: &Worker) -> Waited {
        let limit = self.pool.config.sample_timeout;
        let deadline = limit.map(|limit| Instant::now() + limit);
        let mut stopping_since = None;
        loop {
            let now = Instant::now();
            let wait = match deadline {
                Some(deadline) if now >= deadline => {
                    return Waited::Overran(limit.unwrap_or_default());
                }
                Some(deadline) => POLL.min(deadline - now),
                None => POLL,
            };
            let mut fds = [rustix::event::PollFd::new(
                &worker.conn,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, Some(&timespec(wait))) {
                Ok(0) | Err(rustix::io::Errno::INTR) => {}
                // Readable, closed or failed: the read below says which.
                Ok(_) => break,
                Err(e) => return Waited::Closed(ProtocolError::Io(e.into())),
            }
            if self.pool.stop.load(Ordering::SeqCst) {
                let since = *stopping_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= STOP_GRACE {
                    return Waited::Stopped;
                }
            }
        }
        match protocol::recv_by::<Reply>(&worker.conn, Instant::now() + ANSWER_TIMEOUT) {
            Ok((reply, _)) => Waited::Answer(reply),
            Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                Waited::Overran(limit.unwrap_or(ANSWER_TIMEOUT))
            }
            Err(e) => Waited::Closed(e),
        }
    }

    /// One try on this thread's worker (or an idle one when it has none).
    fn attempt(&mut self, item: &WorkItem) -> Outcome {
        let worker = match self.worker.take() {
            Some(worker) => worker,
            None => match self.pool.take() {
                Ok(worker) => worker,
                Err(why) => return Outcome::GaveUp(format!("no worker: {why}")),
            },
        };
        let request = Request {
            index: item.index,
            epoch: item.epoch,
        };
        let waited = match protocol::send(&worker.conn, &request, &[]) {
            Ok(()) => self.wait_for_answer(&worker),
            Err(e) => Waited::Closed(e),
        };
        let pid = worker.pid;
        match waited {
            Waited::Answer(reply) => {
                self.worker = Some(worker);
                match (reply.ok, reply.error) {
                    (true, _) => Outcome::Made,
                    (false, Some(error)) => Outcome::Failed(error),
                    (false, None) => {
                        Outcome::Failed("the worker answered neither ok nor an error".into())
                    }
                }
            }
            Waited::Overran(limit) => {
                self.pool.died.fetch_add(1, Ordering::Relaxed);
                let limit = limit.as_secs_f64();
                tracing::warn!(
                    pid,
                    index = item.index,
                    "worker process {pid} took over {limit} s on sample {} (seq {}, epoch {}): killing it",
                    item.index,
                    item.seq,
                    item.epoch
                );
                kill(pid);
                Outcome::Died(format!(
                    "worker process {pid} took over {limit} s on it and was killed"
                ))
            }
            Waited::Stopped => {
                tracing::info!(
                    pid,
                    index = item.index,
                    "the feed stopped while worker process {pid} made sample {}: killing it",
                    item.index
                );
                kill(pid);
                Outcome::GaveUp(format!(
                    "the feed stopped before worker process {pid} made it"
                ))
            }
            Waited::Closed(e) => {
                self.pool.died.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    pid,
                    index = item.index,
                    "worker process {pid} died while making sample {} ({e})",
                    item.index
                );
                Outcome::Died(format!("worker process {pid} died on it"))
            }
        }
    }

    /// Copies the sample the worker left in its staging buffer into the slot.
    fn copy_out(&self, fields: &mut [&mut [u8]]) -> Result<(), String> {
        let worker = self
            .worker
            .as_ref()
            .ok_or("no worker after a made sample")?;
        let plan = &self.pool.plan.fields;
        if fields.len() != plan.len() {
            return Err(format!(
                "the slot has {} fields, the staging buffer {}",
                fields.len(),
                plan.len()
            ));
        }
        for (field, &(offset, len)) in fields.iter_mut().zip(plan) {
            if field.len() != len {
                return Err(format!(
                    "a field of {} bytes in the slot, {len} in the staging buffer",
                    field.len()
                ));
            }
            // SAFETY: `offset + len <= plan.len`, the mapping's length (`StagingPlan`), and
            // the mapping lives as long as `worker`; the slot is another file, so the two do
            // not overlap. The bytes are plain `u8`, valid at any value. The worker answered
            // before this copy and writes its buffer again only for its next request; one
            // that broke that rule would garble only the sample it was asked for.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    worker.staging.as_ptr().add(offset as usize),
                    field.as_mut_ptr(),
                    len,
                );
            }
        }
        Ok(())
    }
}

impl SampleMaker for WorkerMaker<'_> {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        let mut deaths = Vec::new();
        while deaths.len() < 2 {
            match self.attempt(item) {
                Outcome::Made => {
                    return self
                        .copy_out(fields)
                        .map_err(|message| self.error(item, message));
                }
                Outcome::Failed(message) => {
                    self.pool.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(self.error(item, message));
                }
                Outcome::GaveUp(message) => return Err(self.error(item, message)),
                Outcome::Died(death) => deaths.push(death),
            }
        }
        Err(self.error(item, format!("{}; not tried again", deaths.join(", then "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = "x: f32[4], label: i64";

    /// A fake worker on a thread: says hello, maps its staging buffer, and answers requests
    /// with `answer(request, staging)`; `None` closes the connection (a death).
    fn fake_worker(
        path: &Path,
        token: &str,
        answer: impl Fn(&Request, &mut [u8]) -> Option<Reply> + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let conn = UnixStream::connect(path).unwrap();
        let hello = WorkerHello {
            token: token.into(),
            pid: 4242,
        };
        protocol::send(&conn, &hello, &[]).unwrap();
        std::thread::spawn(move || {
            let Ok((welcome, fds)) = protocol::recv::<WorkerWelcome>(&conn) else {
                return;
            };
            assert_eq!(fds.len(), 1, "the staging buffer comes with the welcome");
            let len = usize::try_from(welcome.len).unwrap();
            let staging = Mapping::new(fds[0].as_fd(), 0, len, true, false).unwrap();
            while let Ok((request, _)) = protocol::recv::<Request>(&conn) {
                // SAFETY: the whole mapping, which only this thread writes, and only while
                // the maker waits for the answer.
                let bytes = unsafe { std::slice::from_raw_parts_mut(staging.as_ptr(), len) };
                match answer(&request, bytes) {
                    Some(reply) => protocol::send(&conn, &reply, &[]).unwrap(),
                    None => return,
                }
            }
        })
    }

    fn ok() -> Reply {
        Reply {
            ok: true,
            error: None,
        }
    }

    fn pool_with(config: WorkerPoolConfig) -> (tempfile::TempDir, Arc<WorkerPool>) {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let path = dir.path().join("w.sock");
        let pool = WorkerPool::bind(&path, SCHEMA.parse().unwrap(), config, stop).unwrap();
        (dir, pool)
    }

    fn pool() -> (tempfile::TempDir, Arc<WorkerPool>) {
        pool_with(WorkerPoolConfig::new("t0k"))
    }

    fn source(pool: &Arc<WorkerPool>, name: &str) -> WorkerSource {
        let info = DatasetInfo {
            len: 10,
            class_names: vec![],
            source: name.into(),
        };
        WorkerSource::new(info, Arc::clone(pool))
    }

    fn item(index: u64) -> WorkItem {
        WorkItem {
            seq: index,
            index,
            epoch: 0,
        }
    }

    /// Makes `index` into fresh buffers the size of the schema's fields.
    fn make(maker: &mut dyn SampleMaker, index: u64) -> Result<(Vec<u8>, Vec<u8>), SampleError> {
        let (mut x, mut label) = (vec![0u8; 16], vec![0u8; 8]);
        maker.make(&item(index), &mut [&mut x, &mut label])?;
        Ok((x, label))
    }

    /// Waits, with a deadline that only catches a hang, until `ready`.
    fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            assert!(Instant::now() < deadline, "gave up waiting: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_made_sample_is_copied_from_the_workers_staging_buffer_into_the_slot() {
        let (_dir, pool) = pool();
        let plan: Vec<(u64, usize)> = pool.plan.fields.clone();
        let worker = fake_worker(pool.path(), "t0k", move |r, staging| {
            let (x, label) = (plan[0], plan[1]);
            let value = (r.index as f32).to_ne_bytes().repeat(4);
            staging[x.0 as usize..][..x.1].copy_from_slice(&value);
            staging[label.0 as usize..][..label.1].copy_from_slice(&(r.index as i64).to_ne_bytes());
            Some(ok())
        });
        let source = source(&pool, "test");
        let mut maker = source.maker();
        for index in [3, 7] {
            let (x, label) = make(&mut maker, index).unwrap();
            assert_eq!(x, (index as f32).to_ne_bytes().repeat(4));
            assert_eq!(label, (index as i64).to_ne_bytes());
        }
        drop(maker);
        worker.join().unwrap();
    }

    #[test]
    fn a_dead_worker_is_counted_and_its_sample_made_by_the_next_one() {
        let (_dir, pool) = pool();
        let dies_on_3 = fake_worker(pool.path(), "t0k", move |r, _| (r.index != 3).then(ok));
        let source = source(&pool, "test");
        let mut maker = source.maker();
        make(&mut maker, 1).unwrap();
        let spare = fake_worker(pool.path(), "t0k", move |_, _| Some(ok()));
        make(&mut maker, 3).unwrap();
        assert_eq!(
            pool.counts(),
            WorkerCounts {
                connected: 2,
                died: 1,
                failed: 0,
                refused: 0,
            }
        );
        dies_on_3.join().unwrap();
        drop(maker);
        spare.join().unwrap();
    }

    #[test]
    fn a_sample_that_kills_two_workers_or_raises_is_an_error_naming_it() {
        let (_dir, pool) = pool();
        let source = source(&pool, "MyDataset");
        let raises = |r: &Request, _: &mut [u8]| {
            Some(Reply {
                ok: false,
                error: Some(format!("ValueError: bad {}", r.index)),
            })
        };
        let first = fake_worker(pool.path(), "t0k", |_, _| None);
        let second = fake_worker(pool.path(), "t0k", |_, _| None);
        let mut maker = source.maker();
        let err = make(&mut maker, 5).unwrap_err().to_string();
        assert!(err.contains("index 5 of MyDataset"), "{err}");
        // The pid logged is the kernel's for the socket (this test process), not the 4242
        // the hello claimed.
        let me = std::process::id();
        let twice = format!("worker process {me} died on it, then worker process {me} died on it");
        assert!(err.contains(&format!("{twice}; not tried again")), "{err}");
        let third = fake_worker(pool.path(), "t0k", raises);
        let err = make(&mut maker, 6).unwrap_err().to_string();
        assert_eq!(err, "sample index 6 of MyDataset: ValueError: bad 6");
        assert_eq!(
            pool.counts(),
            WorkerCounts {
                connected: 3,
                died: 2,
                failed: 1,
                refused: 0,
            }
        );
        drop(maker);
        for t in [first, second, third] {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_worker_with_a_wrong_token_gets_nothing() {
        let (_dir, pool) = pool();
        let conn = UnixStream::connect(pool.path()).unwrap();
        let hello = WorkerHello {
            token: "guess".into(),
            pid: 1,
        };
        protocol::send(&conn, &hello, &[]).unwrap();
        let got = protocol::recv::<WorkerWelcome>(&conn);
        assert!(got.is_err(), "a wrong token was welcomed");
        assert_eq!(pool.counts().connected, 0);
        assert!(same_token("t0k", "t0k") && !same_token("t0k", "t0K") && !same_token("t0k", "t0"));
    }

    #[test]
    fn ten_idle_connections_do_not_keep_a_worker_out_and_samples_flow() {
        // Idle connections get two minutes to say hello: were handshakes one at a time, the
        // worker behind them would wait twenty.
        let mut config = WorkerPoolConfig::new("t0k");
        config.hello_timeout = Duration::from_secs(120);
        let (_dir, pool) = pool_with(config);
        let idle: Vec<UnixStream> = (0..10)
            .map(|_| UnixStream::connect(pool.path()).unwrap())
            .collect();
        wait_until("ten handshakes under way", || {
            pool.handshakes.load(Ordering::SeqCst) == 10
        });
        let worker = fake_worker(pool.path(), "t0k", |_, _| Some(ok()));
        wait_until("the worker admitted", || pool.counts().connected == 1);
        let source = source(&pool, "test");
        let mut maker = source.maker();
        for index in 0..5 {
            make(&mut maker, index).unwrap();
        }
        assert_eq!(
            pool.handshakes.load(Ordering::SeqCst),
            10,
            "the idle connections are still waiting, none was refused"
        );
        drop(maker);
        worker.join().unwrap();
        drop(idle);
    }

    #[test]
    fn connections_over_the_handshake_cap_are_refused_with_a_reason() {
        let mut config = WorkerPoolConfig::new("t0k");
        config.hello_timeout = Duration::from_secs(120);
        config.max_handshakes = 3;
        let (_dir, pool) = pool_with(config);
        let idle: Vec<UnixStream> = (0..3)
            .map(|_| UnixStream::connect(pool.path()).unwrap())
            .collect();
        wait_until("three handshakes under way", || {
            pool.handshakes.load(Ordering::SeqCst) == 3
        });
        let over = UnixStream::connect(pool.path()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let (refusal, fds) = protocol::recv_by::<Refusal>(&over, deadline).unwrap();
        assert!(fds.is_empty());
        assert!(
            refusal
                .error
                .starts_with("3 connections are already saying hello on "),
            "{}",
            refusal.error
        );
        assert_eq!(pool.counts().refused, 1);
        drop(idle);
        wait_until("the idle connections' handshakes over", || {
            pool.handshakes.load(Ordering::SeqCst) == 0
        });
        // Once they have hung up, a worker is admitted again.
        let worker = fake_worker(pool.path(), "t0k", |_, _| Some(ok()));
        wait_until("the worker admitted", || pool.counts().connected == 1);
        let source = source(&pool, "test");
        make(&mut source.maker(), 1).unwrap();
        worker.join().unwrap();
    }

    #[test]
    fn stopping_the_feed_ends_a_sample_that_a_worker_never_answers() {
        let (_dir, pool) = pool();
        let (started_tx, started) = crossbeam_channel::bounded(1);
        let (release_tx, release) = crossbeam_channel::bounded::<()>(0);
        let stuck = fake_worker(pool.path(), "t0k", move |_, _| {
            started_tx.send(()).unwrap();
            let _ = release.recv(); // until the test ends: a __getitem__ that never returns
            None
        });
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let maker_thread = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let source = source(&pool, "Stuck");
                let made = make(&mut source.maker(), 9).map(|_| ());
                done_tx.send(made.map_err(|e| e.to_string())).unwrap();
            })
        };
        started.recv_timeout(Duration::from_secs(30)).unwrap();
        pool.stop.store(true, Ordering::SeqCst);
        let made = done
            .recv_timeout(Duration::from_secs(30))
            .expect("the maker still waits on a worker after the stop");
        let err = made.unwrap_err();
        let me = std::process::id();
        assert_eq!(
            err,
            format!("sample index 9 of Stuck: the feed stopped before worker process {me} made it")
        );
        assert_eq!(pool.counts().died, 0, "a stop is not a death");
        maker_thread.join().unwrap();
        drop(release_tx);
        stuck.join().unwrap();
    }
}
