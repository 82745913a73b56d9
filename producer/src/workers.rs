//! Samples made by worker processes that write straight into ring slots: the engine of the
//! Python producer (`ladle.serve`), where the user's own `Dataset` and transforms run in
//! Python worker processes.
//!
//! ```text
//! pipeline thread (a WorkerMaker)             worker process (Python, ladle._worker)
//!                                      ◄── connect to the workers' socket (0600, same uid)
//!                                      ◄── {"token", "pid"}
//!   {"layout", "file_len"} + writable ring fd ──►   maps the ring read-write
//!   {"slot", "index", "epoch"}          ──►   sample = dataset[index]; writes each field
//!                                             into its region at `slot`
//!                                      ◄── {"ok": true} | {"error": "..."}
//! ```
//! Frames are the control protocol's (`u32` length + JSON). The producer holds the slot's
//! write loan while the worker writes, so the worker writes only a slot nobody reads; the
//! ring file handed over is the writable one
//! ([`ProducerRing::writer_fd`](ladle_ring::ProducerRing::writer_fd)), which consumers never
//! get. Each pipeline thread keeps one worker; an idle one waits in the pool as a spare.
//!
//! A worker that dies (EOF on its socket) while making a sample, or takes longer than the
//! pool's sample timeout on one (it is then killed: `SIGKILL` to the pid the kernel gives
//! for its socket, never one it claims), is logged with its pid and the sample index and
//! counted; the sample is made again by another worker (the process
//! that started the workers replaces the dead one). A sample that kills two workers, or that
//! the user's code fails on (an exception, a value that does not fit the schema), is a bad
//! sample under the producer's policy: every field zero, the bad flag, counted and logged.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ladle_datasets::SampleError;
use ladle_datasets::pipeline::{SampleMaker, WorkItem};
use ladle_ring::ProtocolError;
use ladle_ring::protocol::{self, DatasetInfo};
use ladle_ring::{RingLayout, Schema, sys};
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

/// The answer to [`WorkerHello`]; the writable ring fd comes with it.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerWelcome {
    layout: RingLayout,
    /// `(offset, length)` of every region: the fields, then indices and flags.
    regions: Vec<(u64, usize)>,
    file_len: u64,
}

/// One sample to make.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    slot: u64,
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

/// How long a worker has to say hello once connected.
const HELLO_DEADLINE: Duration = Duration::from_secs(5);

/// How long a maker waits for any worker before the sample counts as failed.
pub const NO_WORKER_TIMEOUT: Duration = Duration::from_secs(120);

/// A connected worker.
#[derive(Debug)]
struct Worker {
    conn: UnixStream,
    pid: u32,
}

/// Counters of a [`WorkerPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Workers that connected since the start.
    pub connected: u64,
    /// Workers that died (closed their socket) while making a sample.
    pub died: u64,
    /// Samples that worker processes reported failing on (an exception in the user's code,
    /// a value that does not fit the schema).
    pub failed: u64,
}

/// The workers' socket and the workers waiting on it; see the module docs.
#[derive(Debug)]
pub struct WorkerPool {
    path: PathBuf,
    token: String,
    ring: OnceLock<(OwnedFd, WorkerWelcome)>,
    idle_tx: crossbeam_channel::Sender<Worker>,
    idle_rx: crossbeam_channel::Receiver<Worker>,
    stop: Arc<AtomicBool>,
    sample_timeout: Option<Duration>,
    connected: AtomicU64,
    died: AtomicU64,
    failed: AtomicU64,
    accept: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl WorkerPool {
    /// Binds the workers' socket at `path` (mode 0600) and accepts workers on a thread until
    /// `stop` is set. `token` is what a worker must present; a worker that takes longer than
    /// `sample_timeout` on one sample is killed.
    pub fn bind(
        path: &Path,
        token: String,
        stop: Arc<AtomicBool>,
        sample_timeout: Option<Duration>,
    ) -> Result<Arc<Self>, ProducerError> {
        let listener = crate::server::bind(path)?;
        let (idle_tx, idle_rx) = crossbeam_channel::unbounded();
        let pool = Arc::new(Self {
            path: path.to_owned(),
            token,
            ring: OnceLock::new(),
            idle_tx,
            idle_rx,
            stop,
            sample_timeout,
            connected: AtomicU64::new(0),
            died: AtomicU64::new(0),
            failed: AtomicU64::new(0),
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

    /// The workers' socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many workers connected, died and failed samples so far.
    pub fn counts(&self) -> WorkerCounts {
        WorkerCounts {
            connected: self.connected.load(Ordering::Relaxed),
            died: self.died.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    /// Hands the writable ring to the pool: workers connecting from now on map it.
    fn set_ring(&self, writer: BorrowedFd<'_>, layout: &RingLayout) -> Result<(), String> {
        let fd = writer
            .try_clone_to_owned()
            .map_err(|e| format!("cannot duplicate the ring fd: {e}"))?;
        let welcome = WorkerWelcome {
            layout: layout.clone(),
            regions: layout.regions(),
            file_len: layout.file_len(),
        };
        self.ring
            .set((fd, welcome))
            .map_err(|_| "the ring was already set".to_owned())
    }

    fn accept_loop(&self, listener: &UnixListener) {
        while !self.stop.load(Ordering::SeqCst) {
            let mut fds = [rustix::event::PollFd::new(
                listener,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            if rustix::event::poll(&mut fds, Some(&timeout)).is_err() {
                continue;
            }
            match listener.accept() {
                Ok((conn, _)) => {
                    if let Err(why) = self.admit(conn) {
                        tracing::warn!("refused a worker on {}: {why}", self.path.display());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    tracing::warn!("cannot accept a worker ({e}); backing off");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }

    fn admit(&self, conn: UnixStream) -> Result<(), String> {
        conn.set_nonblocking(false).map_err(|e| e.to_string())?;
        let cred = rustix::net::sockopt::socket_peercred(&conn).map_err(|e| e.to_string())?;
        let uid = cred.uid.as_raw();
        if uid != sys::my_uid() {
            return Err(format!("its uid {uid} is not this process's"));
        }
        let (hello, _) = protocol::recv_by::<WorkerHello>(&conn, Instant::now() + HELLO_DEADLINE)
            .map_err(|e| format!("no hello: {e}"))?;
        if hello.token != self.token {
            return Err(format!("pid {} presented a wrong token", hello.pid));
        }
        let (fd, welcome) = self.ring.get().ok_or("the ring is not made yet")?;
        conn.set_read_timeout(None).map_err(|e| e.to_string())?;
        protocol::send(&conn, welcome, &[fd.as_fd()]).map_err(|e| e.to_string())?;
        self.connected.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(pid = hello.pid, "worker connected");
        // The kernel's pid for the socket, not the one the hello claims: it is what a
        // timeout kills.
        let pid = u32::try_from(cred.pid.as_raw_nonzero().get()).unwrap_or(hello.pid);
        let worker = Worker { conn, pid };
        self.idle_tx.send(worker).map_err(|e| e.to_string())
    }

    /// A worker for a maker: an idle one, waiting up to [`NO_WORKER_TIMEOUT`].
    fn take(&self) -> Result<Worker, String> {
        let started = Instant::now();
        loop {
            match self.idle_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(worker) => return Ok(worker),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err("the worker pool is gone".into());
                }
            }
            if self.stop.load(Ordering::SeqCst) {
                return Err("the producer is stopping".into());
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

/// Samples of `schema` made by the workers of a [`WorkerPool`].
#[derive(Debug)]
pub struct WorkerSource {
    schema: Schema,
    info: DatasetInfo,
    pool: Arc<WorkerPool>,
}

impl WorkerSource {
    /// A source of `info.len` samples of `schema`, made by `pool`'s workers.
    pub fn new(schema: Schema, info: DatasetInfo, pool: Arc<WorkerPool>) -> Self {
        Self { schema, info, pool }
    }
}

impl CustomSource for WorkerSource {
    fn schema(&self) -> &Schema {
        &self.schema
    }

    fn info(&self) -> DatasetInfo {
        self.info.clone()
    }

    fn needs_writers(&self) -> bool {
        true
    }

    fn ring_created(
        &self,
        writer: Option<BorrowedFd<'_>>,
        layout: &RingLayout,
    ) -> Result<(), String> {
        let writer = writer.ok_or("the ring has no writer fd")?;
        self.pool.set_ring(writer, layout)
    }

    fn maker(&self) -> Box<dyn SampleMaker + '_> {
        Box::new(WorkerMaker {
            pool: &self.pool,
            source: &self.info.source,
            worker: None,
        })
    }
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

    /// One try on this thread's worker: `Ok(outcome)` when the worker answered, `Err` when
    /// it died.
    fn attempt(&mut self, item: &WorkItem, slot: u64) -> Result<Result<(), String>, String> {
        let worker = match self.worker.take() {
            Some(worker) => worker,
            None => self
                .pool
                .take()
                .map_err(|why| format!("no worker: {why}"))?,
        };
        let request = Request {
            slot,
            index: item.index,
            epoch: item.epoch,
        };
        let answered = protocol::send(&worker.conn, &request, &[]).and_then(|()| {
            match self.pool.sample_timeout {
                Some(limit) => protocol::recv_by::<Reply>(&worker.conn, Instant::now() + limit),
                None => protocol::recv::<Reply>(&worker.conn),
            }
        });
        match answered {
            Ok((reply, _)) => {
                self.worker = Some(worker);
                Ok(match (reply.ok, reply.error) {
                    (true, _) => Ok(()),
                    (false, Some(error)) => Err(error),
                    (false, None) => Err("the worker answered neither ok nor an error".into()),
                })
            }
            Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                self.pool.died.fetch_add(1, Ordering::Relaxed);
                let limit = self.pool.sample_timeout.unwrap_or_default().as_secs_f64();
                tracing::warn!(
                    pid = worker.pid,
                    index = item.index,
                    "worker process {} took over {limit} s on sample {} (seq {}, epoch {}): killing it",
                    worker.pid,
                    item.index,
                    item.seq,
                    item.epoch
                );
                if let Some(pid) = rustix::process::Pid::from_raw(worker.pid as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
                Err(format!(
                    "worker process {} took over {limit} s on it and was killed",
                    worker.pid
                ))
            }
            Err(e) => {
                self.pool.died.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    pid = worker.pid,
                    index = item.index,
                    "worker process {} died while making sample {} ({e})",
                    worker.pid,
                    item.index
                );
                Err(format!("worker process {} died on it", worker.pid))
            }
        }
    }
}

impl SampleMaker for WorkerMaker<'_> {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        // The worker writes the slot through its own mapping of the same file; `fields` are
        // this process's view of it, left to the worker.
        let _ = fields;
        let capacity = self
            .pool
            .ring
            .get()
            .map_or(1, |(_, welcome)| welcome.layout.capacity);
        let slot = item.seq % capacity;
        let mut deaths = Vec::new();
        while deaths.len() < 2 {
            match self.attempt(item, slot) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(message)) => {
                    self.pool.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(self.error(item, message));
                }
                Err(death) if death.starts_with("no worker") => {
                    return Err(self.error(item, death));
                }
                Err(death) => deaths.push(death),
            }
        }
        Err(self.error(item, format!("{}; not tried again", deaths.join(", then "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake worker on a thread: says hello, maps nothing, and answers requests with
    /// `answer(request)`; `None` closes the connection (a death).
    fn fake_worker(
        path: &Path,
        token: &str,
        answer: impl Fn(&Request) -> Option<Reply> + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let conn = UnixStream::connect(path).unwrap();
        let hello = WorkerHello {
            token: token.into(),
            pid: 4242,
        };
        protocol::send(&conn, &hello, &[]).unwrap();
        std::thread::spawn(move || {
            let Ok((_, fds)) = protocol::recv::<WorkerWelcome>(&conn) else {
                return;
            };
            assert_eq!(fds.len(), 1, "the ring fd comes with the welcome");
            while let Ok((request, _)) = protocol::recv::<Request>(&conn) {
                match answer(&request) {
                    Some(reply) => protocol::send(&conn, &reply, &[]).unwrap(),
                    None => return,
                }
            }
        })
    }

    fn pool() -> (tempfile::TempDir, Arc<WorkerPool>, ladle_ring::ProducerRing) {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let pool = WorkerPool::bind(&dir.path().join("w.sock"), "t0k".into(), stop, None).unwrap();
        let layout =
            RingLayout::for_budget(1 << 20, "x: f32[4], label: i64".parse().unwrap()).unwrap();
        let ring = ladle_ring::ProducerRing::create_with_writers(layout.clone()).unwrap();
        pool.set_ring(ring.writer_fd().unwrap(), &layout).unwrap();
        (dir, pool, ring)
    }

    fn item(index: u64) -> WorkItem {
        WorkItem {
            seq: index,
            index,
            epoch: 0,
        }
    }

    #[test]
    fn a_dead_worker_is_counted_and_its_sample_made_by_the_next_one() {
        let (_dir, pool, _ring) = pool();
        let ok = || Reply {
            ok: true,
            error: None,
        };
        let dies_on_3 = fake_worker(pool.path(), "t0k", move |r| (r.index != 3).then(ok));
        let source = WorkerSource::new(
            "x: f32[4], label: i64".parse().unwrap(),
            DatasetInfo {
                len: 10,
                class_names: vec![],
                source: "test".into(),
            },
            Arc::clone(&pool),
        );
        let mut maker = source.maker();
        maker.make(&item(1), &mut []).unwrap();
        let spare = fake_worker(pool.path(), "t0k", move |_| Some(ok()));
        maker.make(&item(3), &mut []).unwrap();
        assert_eq!(
            pool.counts(),
            WorkerCounts {
                connected: 2,
                died: 1,
                failed: 0
            }
        );
        dies_on_3.join().unwrap();
        drop(maker);
        spare.join().unwrap();
    }

    #[test]
    fn a_sample_that_kills_two_workers_or_raises_is_an_error_naming_it() {
        let (_dir, pool, _ring) = pool();
        let source = WorkerSource::new(
            "x: f32[4], label: i64".parse().unwrap(),
            DatasetInfo {
                len: 10,
                class_names: vec![],
                source: "MyDataset".into(),
            },
            Arc::clone(&pool),
        );
        let raises = |r: &Request| {
            Some(Reply {
                ok: false,
                error: Some(format!("ValueError: bad {}", r.index)),
            })
        };
        let first = fake_worker(pool.path(), "t0k", |_| None);
        let second = fake_worker(pool.path(), "t0k", |_| None);
        let mut maker = source.maker();
        let err = maker.make(&item(5), &mut []).unwrap_err().to_string();
        assert!(err.contains("index 5 of MyDataset"), "{err}");
        // The pid logged is the kernel's for the socket (this test process), not the 4242
        // the hello claimed.
        let me = std::process::id();
        let twice = format!("worker process {me} died on it, then worker process {me} died on it");
        assert!(err.contains(&format!("{twice}; not tried again")), "{err}");
        let third = fake_worker(pool.path(), "t0k", raises);
        let err = maker.make(&item(6), &mut []).unwrap_err().to_string();
        assert_eq!(err, "sample index 6 of MyDataset: ValueError: bad 6");
        assert_eq!(
            pool.counts(),
            WorkerCounts {
                connected: 3,
                died: 2,
                failed: 1
            }
        );
        drop(maker);
        for t in [first, second, third] {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_worker_with_a_wrong_token_gets_nothing() {
        let (_dir, pool, _ring) = pool();
        let conn = UnixStream::connect(pool.path()).unwrap();
        let hello = WorkerHello {
            token: "guess".into(),
            pid: 1,
        };
        protocol::send(&conn, &hello, &[]).unwrap();
        let got = protocol::recv::<WorkerWelcome>(&conn);
        assert!(got.is_err(), "a wrong token was welcomed");
        assert_eq!(pool.counts().connected, 0);
    }
}
