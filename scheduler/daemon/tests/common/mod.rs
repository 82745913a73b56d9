//! A real daemon on its own state directory, in a thread of the test, over its real Unix
//! socket; stopped (and its directory removed) on drop. And the tests' bounded wait
//! ([`wait_until`]).

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use ladle_scheduler::daemon::{self, DaemonConfig, DaemonError, GpuBackend};
use ladle_scheduler::journal::{Journal, Record};
use ladle_scheduler::policy::Policy;
use ladle_scheduler::protocol::{self, MAX_FRAME, Request, Response};

/// Longest any test waits for something that should happen (a deadlock catcher, not a
/// bound on speed).
pub const GUARD: Duration = Duration::from_secs(120);

pub struct Daemon {
    pub dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), DaemonError>>>,
    /// The directory `dir` is in, when the daemon owns it: removed once it has stopped.
    _tmp: Option<tempfile::TempDir>,
}

impl Daemon {
    /// A daemon (one simulated GPU, the exclusive policy, keeping every finished job) whose
    /// journal holds `records` when it starts; returns once its socket answers.
    pub fn start(records: &[Record]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sched");
        std::fs::create_dir_all(&dir).unwrap();
        if !records.is_empty() {
            let (mut journal, _) = Journal::open(&dir.join("journal.jsonl")).unwrap();
            for r in records {
                journal.append(r).unwrap();
            }
        }
        let mut config = sim_config(&dir);
        config.tick = Duration::from_millis(100);
        // Every job it is given is kept, however many: answers must fit whatever it holds.
        config.retention.keep_finished = 1_000_000;
        config.retention.keep_logs = 1_000_000;
        config.retention.keep_logs_for = None;
        Self::run(config, Some(tmp))
    }

    /// A daemon with `config`, in a thread of the test; returns once its socket answers.
    /// `tmp`, the temporary directory its state directory is in (if it has one of its own),
    /// goes once the daemon has stopped.
    pub fn run(config: DaemonConfig, tmp: Option<tempfile::TempDir>) -> Self {
        let dir = config.dir.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || daemon::run(config, stop))
        };
        let mut daemon = Self {
            dir,
            stop,
            thread: Some(thread),
            _tmp: tmp,
        };
        wait_until("the daemon answering", GUARD, || {
            let last = match daemon.request(&Request::Feeds) {
                Ok(Response::Feeds { .. }) => return Ok(Some(())),
                Ok(other) => format!("{other:?}"),
                Err(e) => e.to_string(),
            };
            if daemon.thread.as_ref().unwrap().is_finished() {
                let ended = daemon.thread.take().unwrap().join();
                panic!("the daemon stopped: {ended:?}");
            }
            Err(last)
        });
        daemon
    }

    /// Sets the stop flag and waits for the daemon to stop; fails the test if it ends with an
    /// error.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().unwrap();
        wait_until("the daemon stopping", GUARD, || {
            Ok::<_, String>(thread.is_finished().then_some(()))
        });
        thread.join().unwrap().unwrap();
    }

    pub fn socket(&self) -> PathBuf {
        daemon::socket_path(&self.dir)
    }

    pub fn request(&self, request: &Request) -> Result<Response, protocol::ProtocolError> {
        protocol::request(&self.socket(), request, GUARD)
    }

    /// Sends `request` and returns the answer's raw line (newline included).
    pub fn raw(&self, request: &Request) -> Vec<u8> {
        let mut line = Vec::new();
        let mut frame = Vec::new();
        protocol::write_frame(&mut frame, request, Path::new("x")).unwrap();
        let mut conn = self.connect();
        conn.write_all(&frame).unwrap();
        conn.read_to_end(&mut line).unwrap();
        line
    }

    pub fn connect(&self) -> UnixStream {
        let conn = UnixStream::connect(self.socket()).unwrap();
        conn.set_read_timeout(Some(GUARD)).unwrap();
        conn.set_write_timeout(Some(GUARD)).unwrap();
        conn
    }

    /// Sends `request` until it is served (not refused for too many connections).
    pub fn served(&self, request: &Request) -> Response {
        wait_until("the request served", GUARD, || {
            match self.request(request) {
                Ok(Response::Error { message }) if message.contains("too many connections") => {
                    Err(message)
                }
                Ok(answer) => Ok(Some(answer)),
                Err(e) => panic!("{e}"),
            }
        })
    }
}

/// One simulated GPU of 40 GiB and the exclusive policy, on the state directory `dir`; the
/// rest as [`DaemonConfig::new`] has it: where every daemon of these tests starts from.
pub fn sim_config(dir: &Path) -> DaemonConfig {
    let mut config = DaemonConfig::new(dir.to_owned());
    config.gpu = GpuBackend::Sim {
        gpus: 1,
        memory_mib: 40 * 1024,
    };
    config.policy = Policy::named("exclusive").unwrap();
    config
}

/// The tests' one deadline loop (a hang guard, never a speed assertion).
pub use ladle_tests::wait_until;

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answer in a raw line, checked to be one frame of at most [`MAX_FRAME`] bytes.
pub fn decoded(line: &[u8]) -> Response {
    assert!(
        line.len() <= MAX_FRAME,
        "an answer of {} bytes, over the frame limit of {MAX_FRAME}",
        line.len()
    );
    protocol::decode_frame(line).unwrap_or_else(|e| panic!("{e}"))
}

/// Reads what the daemon says on `conn` until it closes it. (A connection closed with
/// some of our bytes unread reads as reset once its answer is read.)
pub fn answer_on(conn: &mut UnixStream) -> Response {
    let mut line = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{e}"),
        }
    }
    decoded(&line)
}
