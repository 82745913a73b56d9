//! The daemon's socket: a Unix socket (mode 0600, peer uid checked, 5 s per connection)
//! taking one [`Request`] per connection, and the handlers of the requests.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::job::{JobId, JobSpec};
use crate::journal::Record;
use crate::policy::windows_full;
use crate::protocol::{
    self, AttemptLogs, FeedSpec, GpuView, JobView, LOG_TAIL, ProtocolError, Request, Response,
};
use crate::sys;

use super::launch::tail;
use super::state::Stage;
use super::{Daemon, DaemonError, Feed, Shared, now_unix};

pub(super) fn bind(socket: &Path) -> Result<UnixListener, DaemonError> {
    let err = |source| DaemonError::Socket {
        path: socket.to_owned(),
        source,
    };
    if socket.exists() {
        // We hold the directory's lock, so whatever is there is stale.
        std::fs::remove_file(socket).map_err(err)?;
    }
    let listener = UnixListener::bind(socket).map_err(err)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

pub(super) fn accept(listener: UnixListener, shared: &Arc<Shared>, socket: &Path) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let shared = shared.clone();
        let socket = socket.to_owned();
        let spawned = std::thread::Builder::new()
            .name("ladle-scheduler-conn".to_owned())
            .spawn(move || serve(conn, &shared, &socket));
        if let Err(e) = spawned {
            tracing::warn!("cannot serve a connection: {e}");
        }
    }
}

fn serve(conn: UnixStream, shared: &Shared, socket: &Path) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let response = match sys::peer_uid(&conn) {
        Ok(uid) if uid == sys::my_uid() => match protocol::read_request(&conn, socket) {
            Ok(request) => {
                let response = shared.lock().handle(request);
                shared.wake.notify_all();
                response
            }
            Err(e) => {
                tracing::debug!("bad request: {e}");
                Response::Error {
                    message: e.to_string(),
                }
            }
        },
        Ok(uid) => Response::Error {
            message: format!("permission denied: uid {uid} is not the scheduler's"),
        },
        Err(e) => Response::Error {
            message: format!("cannot identify the peer: {e}"),
        },
    };
    if let Err(e @ ProtocolError::Io { .. }) = protocol::write_frame(&conn, &response, socket) {
        tracing::debug!("cannot answer a client: {e}");
    }
}

impl Daemon {
    pub(super) fn handle(&mut self, request: Request) -> Response {
        match request {
            Request::Submit(spec) => self.submit(spec),
            Request::Queue => self.queue_view(),
            Request::Cancel { id } => self.cancel(id),
            Request::Logs { id } => self.logs(id),
            Request::RegisterFeed(feed) => self.register_feed(feed),
            Request::Feeds => Response::Feeds {
                feeds: self.live_feeds().map(|f| f.spec.clone()).collect(),
                cpu_cores: self.cpu_cores,
                cpus_busy: self.cpus_busy(),
            },
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

    /// The feeds whose serving process is still the one that registered.
    fn live_feeds(&mut self) -> impl Iterator<Item = &Feed> {
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
        if spec.thread_percentage.is_some_and(|p| p == 0 || p > 100) {
            return Response::Error {
                message: "the active thread percentage must be 1–100".to_owned(),
            };
        }
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
        if !self.commit(record) {
            return Response::Error {
                message: "the journal cannot be written; job not accepted".to_owned(),
            };
        }
        tracing::info!(job = id, estimate_mib, basis = ?estimate.basis, "submitted");
        Response::Submitted { id, estimate_mib }
    }

    fn queue_view(&self) -> Response {
        let mut counts = vec![0u32; self.gpus.len()];
        for (_, attempt) in self.jobs.running() {
            for &g in &attempt.gpus {
                if let Some(c) = counts.get_mut(g) {
                    *c += 1;
                }
            }
        }
        Response::Queue {
            policy: self.engine.policy().name.clone(),
            jobs: self
                .jobs
                .jobs
                .values()
                .map(|j| JobView {
                    id: j.id,
                    spec: j.spec.clone(),
                    state: j.state(),
                    estimate_mib: j.estimate.mib,
                    basis: j.estimate.basis,
                    family: j.family.clone(),
                    measured: j.measured,
                    exclusive: j.exclusive,
                    attempts: j.attempts,
                    oom_retries: j.oom_retries,
                    peak_mib: j
                        .peak_mib
                        .max(self.live.get(&j.id).and_then(|l| l.peak_mib)),
                    submitted_at: j.submitted_at,
                })
                .collect(),
            gpus: self
                .gpus
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    let last = self.windows[i].last.as_ref();
                    GpuView {
                        info: info.clone(),
                        memory_used_mib: last.map_or(0, |s| s.memory_used_mib),
                        sm_activity_risk: self.windows[i].risk().sm_activity,
                        utilization: last.map_or(0.0, |s| s.utilization),
                        sm_activity: last.and_then(|s| s.sm_activity),
                        jobs: counts[i],
                        window_full: windows_full(&self.windows[i]),
                    }
                })
                .collect(),
        }
    }

    fn cancel(&mut self, id: JobId) -> Response {
        let Some(job) = self.jobs.jobs.get(&id) else {
            return Response::Error {
                message: format!("no job {id}"),
            };
        };
        match &job.stage {
            Stage::Queued => {
                if !self.commit(Record::Cancelled { id }) {
                    return Response::Error {
                        message: "the journal cannot be written".to_owned(),
                    };
                }
                Response::Cancelled { id }
            }
            Stage::Running(attempt) => {
                let pid = attempt.pid;
                let Some(live) = self.live.get_mut(&id) else {
                    return Response::Error {
                        message: format!("job {id} is starting; try again"),
                    };
                };
                if let Some(pid) = pid
                    && let Err(e) = sys::signal_group(pid, rustix::process::Signal::TERM)
                {
                    tracing::warn!(job = id, "SIGTERM: {e}");
                }
                live.cancel_at.get_or_insert_with(Instant::now);
                Response::Cancelled { id }
            }
            Stage::Ended(state) => Response::Error {
                message: format!("job {id} has already ended ({state:?})"),
            },
        }
    }

    fn logs(&self, id: JobId) -> Response {
        let Some(job) = self.jobs.jobs.get(&id) else {
            return Response::Error {
                message: format!("no job {id}"),
            };
        };
        let attempts = (1..=job.attempts)
            .map(|attempt| {
                let stdout_path = self.files.stdout(id, attempt);
                let stderr_path = self.files.stderr(id, attempt);
                AttemptLogs {
                    attempt,
                    stdout: tail(&stdout_path, LOG_TAIL),
                    stderr: tail(&stderr_path, LOG_TAIL),
                    stdout_path,
                    stderr_path,
                }
            })
            .collect();
        Response::Logs { id, attempts }
    }
}
