//! The daemon's socket: a Unix socket (mode 0600, peer uid checked) taking one [`Request`]
//! per connection, served on one thread by a current-thread tokio runtime, and the
//! handlers of the requests.
//!
//! What the socket promises, whatever its clients do:
//! - at most [`MAX_CONNECTIONS`] connections at once; one more is answered with an error
//!   saying why ("too many connections") and closed, without reading it;
//! - one deadline, [`REQUEST_TIMEOUT`], for the whole request however slowly its bytes
//!   come, and another for taking the whole answer: a client that trickles is cut off,
//!   and holds no thread meanwhile (only a task and its socket);
//! - garbage, a wrong version or a line over [`MAX_FRAME`] gets an error and closes that
//!   connection only;
//! - out of file descriptors (`EMFILE`), accepting backs off [`ACCEPT_BACKOFF`] instead of
//!   spinning, and says so once;
//! - threads: the serving thread and at most [`HANDLER_THREADS`] that run handlers, under
//!   the daemon's lock (the state and the policy stay synchronous);
//! - every answer fits in a frame ([`super::answers`]; an error message is cut to
//!   [`MAX_MESSAGE`] bytes).

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use crate::job::{JobId, JobSpec};
use crate::journal::Record;
use crate::protocol::{
    self, FeedSpec, HostMem, MAX_CANCEL_GRACE_S, MAX_FRAME, MAX_MESSAGE, Request, Response,
};
use crate::sys;

use super::state::Stage;
use super::{CANCEL_GRACE, Daemon, DaemonError, Feed, Shared, now_unix};

/// The name prefix of feeds the scheduler finds in the user's registry of feeds started on
/// demand (`ladle_feeds`).
const AUTO_FEED: &str = "auto-";

/// Most connections served at once; more are refused with a reason.
pub const MAX_CONNECTIONS: usize = 128;

/// How long a connection has, in all, to send its request, and again to take the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long accepting pauses when the process is out of file descriptors.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Threads that run handlers (under the daemon's lock, so more would only wait).
pub const HANDLER_THREADS: usize = 2;

/// Binds `socket` (mode 0600, non-blocking) by ladle's one policy for a socket file left
/// behind (`ladle_os::net::bind_private`): one nobody answers on is replaced; anything else
/// there is an error naming it, and is left alone.
pub(super) fn bind(socket: &Path) -> Result<UnixListener, DaemonError> {
    ladle_os::net::bind_private(socket).map_err(|e| DaemonError::Socket {
        path: socket.to_owned(),
        source: match e {
            ladle_os::net::BindError::Os { source, .. } => source,
            other => std::io::Error::new(std::io::ErrorKind::AlreadyExists, other.to_string()),
        },
    })
}

/// The socket being served, on its own thread, until [`Server::stop`] (or drop).
pub(super) struct Server {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serves `listener` (from [`bind`]) on a thread of its own.
    pub(super) fn start(
        listener: UnixListener,
        shared: Arc<Shared>,
        socket: PathBuf,
    ) -> Result<Self, DaemonError> {
        let err = |source| DaemonError::Socket {
            path: socket.clone(),
            source,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(HANDLER_THREADS)
            .thread_name("ladle-sched-work")
            .build()
            .map_err(err)?;
        let (stop, stopped) = oneshot::channel();
        let path = socket.clone();
        let thread = std::thread::Builder::new()
            .name("ladle-sched-serve".to_owned())
            .spawn(move || {
                runtime.block_on(accept(listener, shared, Arc::from(path), stopped));
                // Handlers in flight finish (they hold the daemon's lock briefly); a
                // connection still talking is dropped.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(err)?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops accepting and waits for the serving thread.
    pub(super) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the scheduler's socket thread panicked");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Counts a connection for as long as it lives.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept(
    listener: UnixListener,
    shared: Arc<Shared>,
    socket: Arc<Path>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(socket = %socket.display(), "cannot serve the socket: {e}");
            return;
        }
    };
    let live = Arc::new(AtomicUsize::new(0));
    let mut out_of_fds_since: Option<Instant> = None;
    let mut refused = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        let conn = match accepted {
            Ok((conn, _)) => conn,
            Err(e) => {
                // EMFILE / ENFILE / ENOBUFS: the connection stays queued; retrying at once
                // would spin. Say so once per episode and back off.
                if out_of_fds_since.is_none() {
                    tracing::warn!(socket = %socket.display(), "cannot accept a connection ({e}); backing off");
                }
                out_of_fds_since.get_or_insert_with(Instant::now);
                tokio::select! {
                    _ = &mut stop => return,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        if let Some(since) = out_of_fds_since.take() {
            tracing::info!(
                "accepting connections again after {:.1} s",
                since.elapsed().as_secs_f64()
            );
        }
        if live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            if refused == 0 {
                tracing::warn!(
                    socket = %socket.display(),
                    "{MAX_CONNECTIONS} connections open: refusing more until some close"
                );
            }
            refused += 1;
            refuse(&conn);
            continue;
        }
        if refused > 0 {
            tracing::info!(refused, "serving connections again");
            refused = 0;
        }
        live.fetch_add(1, Ordering::SeqCst);
        let counted = Counted(live.clone());
        let (shared, socket) = (shared.clone(), socket.clone());
        tokio::spawn(async move {
            let _counted = counted;
            serve(conn, shared, &socket).await;
        });
    }
}

/// Tells a connection over the cap why it is closed, if its socket buffer takes the line
/// now (a new socket's does); never waits for it.
fn refuse(conn: &UnixStream) {
    let line = encode(Response::Error {
        message: format!(
            "too many connections: this scheduler serves at most {MAX_CONNECTIONS} at once; \
             try again"
        ),
    });
    let _ = conn.try_write(&line);
}

/// One connection: its request within [`REQUEST_TIMEOUT`], the handler on a blocking
/// thread, the answer within [`REQUEST_TIMEOUT`].
async fn serve(mut conn: UnixStream, shared: Arc<Shared>, socket: &Path) {
    let line = match sys::peer_uid(&conn) {
        Ok(uid) if uid == sys::my_uid() => match read_request(&mut conn).await {
            Ok(request) => {
                let handled = tokio::task::spawn_blocking(move || {
                    let response = shared.lock().handle(request);
                    shared.wake.notify_all();
                    encode(response)
                })
                .await;
                handled.unwrap_or_else(|e| {
                    tracing::error!("a request's handler failed: {e}");
                    encode(Response::Error {
                        message: "the scheduler failed to handle the request (see its log)"
                            .to_owned(),
                    })
                })
            }
            Err(message) => {
                tracing::debug!(socket = %socket.display(), "bad request: {message}");
                encode(Response::Error { message })
            }
        },
        Ok(uid) => encode(Response::Error {
            message: format!("permission denied: uid {uid} is not the scheduler's"),
        }),
        Err(e) => encode(Response::Error {
            message: format!("cannot identify the peer: {e}"),
        }),
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, conn.write_all(&line)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(socket = %socket.display(), "cannot answer a client: {e}"),
        Err(_) => tracing::debug!(
            socket = %socket.display(),
            "a client did not take its answer within {REQUEST_TIMEOUT:?}"
        ),
    }
}

/// Reads one request line, all of it within [`REQUEST_TIMEOUT`], and decodes it.
async fn read_request(conn: &mut UnixStream) -> Result<Request, String> {
    let mut line = Vec::new();
    let mut reader = BufReader::new(conn.take(MAX_FRAME as u64 + 1));
    match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut line)).await {
        Err(_) => Err(format!(
            "no complete request within {} s: closing the connection",
            REQUEST_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("reading the request: {e}")),
        Ok(Ok(_)) => protocol::decode_request(&line).map_err(|e| e.to_string()),
    }
}

/// `response` framed, never over [`MAX_FRAME`]: an error message is cut to
/// [`MAX_MESSAGE`] bytes; an answer that would still not fit (a bug: answers are built to
/// fit) becomes an error saying so.
fn encode(response: Response) -> Vec<u8> {
    let response = match response {
        Response::Error { mut message } => {
            if message.len() > MAX_MESSAGE {
                let mut end = MAX_MESSAGE;
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                message.truncate(end);
                message.push_str("… (cut)");
            }
            Response::Error { message }
        }
        other => other,
    };
    match protocol::encode_frame(&response) {
        Ok(line) if line.len() <= MAX_FRAME => line,
        framed => {
            let why = match framed {
                Ok(line) => format!("the answer would be {} bytes", line.len()),
                Err(e) => e.to_string(),
            };
            tracing::error!("cannot send an answer: {why}");
            let error = Response::Error {
                message: format!("the scheduler cannot send its answer: {why}"),
            };
            protocol::encode_frame(&error).unwrap_or_default()
        }
    }
}

impl Daemon {
    pub(super) fn handle(&mut self, request: Request) -> Response {
        match request {
            Request::Submit(spec) => self.submit(spec),
            Request::Queue => self.queue_view(),
            Request::Jobs(query) => self.jobs_page(&query),
            Request::Cancel { id, grace_s } => self.cancel(id, grace_s),
            Request::Release { id } => self.release(id),
            Request::Logs { id } => self.logs(id),
            Request::RegisterFeed(feed) => self.register_feed(feed),
            Request::Feeds => self.feeds(),
        }
    }

    /// Cores taken by live feeds' decode threads and running jobs that state `cpus`.
    pub(super) fn cpus_busy(&mut self) -> u32 {
        let feed_threads: u32 = self
            .live_feeds()
            .map(|f| f.spec.threads)
            .fold(0, u32::saturating_add);
        self.jobs
            .running()
            .filter_map(|(j, _)| j.spec.cpus)
            .fold(feed_threads, u32::saturating_add)
    }

    /// Host memory as admission counts it: live feeds' rings, the decoded-sample cache's
    /// budget while its keeper runs (its entry in the feeds' registry), running jobs that
    /// state `host_mem_mib`.
    pub(super) fn host_mem(&mut self) -> HostMem {
        let rings_mib = self
            .live_feeds()
            .map(|f| f.spec.ring_bytes.div_ceil(1 << 20))
            .fold(0, u64::saturating_add);
        let jobs_mib = self
            .jobs
            .running()
            .filter_map(|(j, _)| j.spec.host_mem_mib)
            .fold(0, u64::saturating_add);
        HostMem {
            total_mib: self.host_mem_mib,
            rings_mib,
            cache_mib: cache_budget_mib(),
            jobs_mib,
        }
    }

    /// The feeds whose serving process is still the one that registered, and those of the
    /// user's registry of feeds started on demand (named `auto-` and their key's first 8
    /// digits: `ladle submit --feed auto-…` gives a job one's socket): the registry is their
    /// one source of truth, read again at each look.
    pub(super) fn live_feeds(&mut self) -> impl Iterator<Item = &Feed> {
        match ladle_feeds::Registry::existing() {
            Ok(Some(registry)) => {
                self.feeds.retain(|name, _| !name.starts_with(AUTO_FEED));
                for entry in registry.live() {
                    let name = format!("{AUTO_FEED}{}", &entry.key.0[..8.min(entry.key.0.len())]);
                    let spec = FeedSpec {
                        name: name.clone(),
                        socket: entry.socket,
                        dataset: entry.request.dataset.display().to_string(),
                        transform: format!(
                            "{} seed {}",
                            entry.request.transform, entry.request.seed
                        ),
                        threads: entry.threads,
                        pid: entry.pid,
                        ring_bytes: entry.ring_bytes,
                    };
                    let started = entry.start_ticks;
                    self.feeds.insert(name, Feed { spec, started });
                }
            }
            Ok(None) => self.feeds.retain(|name, _| !name.starts_with(AUTO_FEED)),
            Err(e) => tracing::debug!("the feed registry cannot be read: {e}"),
        }
        self.feeds.retain(|_, f| {
            let alive = sys::start_ticks(f.spec.pid) == Some(f.started);
            if !alive {
                tracing::info!(feed = %f.spec.name, "feed gone (its process ended)");
            }
            alive
        });
        self.feeds.values()
    }

    fn register_feed(&mut self, spec: FeedSpec) -> Response {
        if spec.name.starts_with(AUTO_FEED) {
            return Response::Error {
                message: format!(
                    "feed {:?}: names starting with {AUTO_FEED:?} are the registry's (feeds started on demand)",
                    spec.name
                ),
            };
        }
        let Some(started) = sys::start_ticks(spec.pid) else {
            return Response::Error {
                message: format!("feed {:?}: no process {} serves it", spec.name, spec.pid),
            };
        };
        if let Some(other) = self.live_feeds().find(|f| f.spec.name == spec.name)
            && other.spec.pid != spec.pid
        {
            return Response::Error {
                message: format!(
                    "a feed named {:?} is already served by process {} on {}",
                    spec.name,
                    other.spec.pid,
                    other.spec.socket.display()
                ),
            };
        }
        tracing::info!(feed = %spec.name, socket = %spec.socket.display(), pid = spec.pid, "feed registered");
        let name = spec.name.clone();
        self.feeds.insert(name.clone(), Feed { spec, started });
        Response::FeedRegistered { name }
    }

    fn submit(&mut self, mut spec: JobSpec) -> Response {
        if let Some(name) = spec.feed.clone() {
            let Some(feed) = self.live_feeds().find(|f| f.spec.name == name) else {
                return Response::Error {
                    message: format!(
                        "no live feed named {name:?}: start `ladle serve --name {name} ...` \
                         (with this scheduler running) first"
                    ),
                };
            };
            let socket = feed.spec.socket.display().to_string();
            if !spec.env.iter().any(|(k, _)| k == "LADLE_SOCKET") {
                spec.env.push(("LADLE_SOCKET".to_owned(), socket));
            }
        }
        let usable = self.gpus.iter().filter(|g| g.unsuitable.is_empty()).count();
        if spec.command.is_empty() || spec.command[0].is_empty() {
            return Response::Error {
                message: "no command to run".to_owned(),
            };
        }
        if spec.gpus == 0 || spec.gpus as usize > usable {
            return Response::Error {
                message: format!(
                    "the job asks for {} GPUs; this scheduler has {usable} usable",
                    spec.gpus
                ),
            };
        }
        if let Some(cpus) = spec.cpus
            && (cpus == 0 || cpus > self.cpu_cores)
        {
            return Response::Error {
                message: format!(
                    "the job states {cpus} CPU cores; this scheduler shares 1 to {}",
                    self.cpu_cores
                ),
            };
        }
        if let Some(mib) = spec.host_mem_mib
            && (mib == 0 || mib > self.host_mem_mib)
        {
            return Response::Error {
                message: format!(
                    "the job states {mib} MiB of host memory; this scheduler shares 1 to {} MiB",
                    self.host_mem_mib
                ),
            };
        }
        if spec.thread_percentage.is_some_and(|p| p == 0 || p > 100) {
            return Response::Error {
                message: "the active thread percentage must be 1–100".to_owned(),
            };
        }
        let only = match self.confinement(&spec) {
            Ok(only) => only,
            Err(message) => return Response::Error { message },
        };
        let estimate = self.jobs.estimate_for(&spec, self.default_estimate_mib);
        let id = self.jobs.next_id;
        let estimate_mib = estimate.mib;
        let record = Record::Submitted {
            id,
            spec,
            estimate_mib,
            basis: estimate.basis,
            at: now_unix(),
        };
        if let Err(e) = self.commit(record) {
            return Response::Error {
                message: format!("{e}; job not accepted"),
            };
        }
        self.confined.insert(id, only);
        tracing::info!(job = id, estimate_mib, basis = ?estimate.basis, "submitted");
        Response::Submitted { id, estimate_mib }
    }

    fn cancel(&mut self, id: JobId, grace_s: Option<f64>) -> Response {
        let grace = match grace_s {
            None => CANCEL_GRACE,
            Some(s) if (0.0..=MAX_CANCEL_GRACE_S).contains(&s) => Duration::from_secs_f64(s),
            Some(s) => {
                return Response::Error {
                    message: format!(
                        "a cancel's grace of {s} s is not between 0 and {MAX_CANCEL_GRACE_S} s"
                    ),
                };
            }
        };
        let Some(job) = self.jobs.jobs.get(&id) else {
            return Response::Error {
                message: format!("no job {id}"),
            };
        };
        match &job.stage {
            Stage::Queued => {
                if let Err(e) = self.commit(Record::Cancelled { id }) {
                    return Response::Error {
                        message: format!("{e}; job {id} not cancelled"),
                    };
                }
                Response::Cancelled { id }
            }
            Stage::Running(_) => {
                let Some(live) = self.live.get_mut(&id) else {
                    return Response::Error {
                        message: format!("job {id} is starting; try again"),
                    };
                };
                if let Some(process) = live.process
                    && let Err(e) = process.signal_group(sys::Signal::TERM)
                {
                    tracing::warn!(job = id, "SIGTERM: {e}");
                }
                // A second cancel never restarts or stretches the first one's grace, and may
                // shorten it (a sweep's second Ctrl-C asks for 0 s).
                let now = Instant::now();
                live.cancel_at = Some(match live.cancel_at {
                    Some((at, first)) if at + first <= now + grace => (at, first),
                    _ => (now, grace),
                });
                Response::Cancelled { id }
            }
            Stage::Ended(state) => Response::Error {
                message: format!("job {id} has already ended ({state:?})"),
            },
        }
    }
}

/// The decoded-sample cache's budget, MiB, while its keeper runs in this user's feeds
/// registry (0 otherwise): the keeper may hold up to that much between feeds.
fn cache_budget_mib() -> u64 {
    let Ok(Some(registry)) = ladle_feeds::Registry::existing() else {
        return 0;
    };
    let files = ladle_cache::KeeperFiles::in_dir(registry.dir());
    if !files.keeper_lives().unwrap_or(false) {
        return 0;
    }
    match ladle_cache::KeeperEntry::read(&files.entry) {
        Ok(Some(entry)) => entry.budget.div_ceil(1 << 20),
        _ => 0,
    }
}
