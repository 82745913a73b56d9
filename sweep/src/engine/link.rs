//! The sweep's link to its scheduler: a private one it starts and stops, or one already
//! running; requests with a deadline; cancelling and killing its runs.

use super::*;

/// Where the sweep talks to its scheduler.
pub(super) struct Scheduler {
    pub(super) socket: PathBuf,
    pub(super) private: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Scheduler {
    pub(super) fn request(&self, request: &Request, what: &str) -> Result<Response, SweepError> {
        let err = |detail: String| SweepError::Scheduler {
            socket: self.socket.clone(),
            what: what.to_owned(),
            detail,
        };
        match protocol::request(&self.socket, request, CLIENT_TIMEOUT) {
            Ok(Response::Error { message }) => Err(err(message)),
            Ok(other) => Ok(other),
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// The scheduler's view of the jobs `ids`, a page at a time ([`Request::Jobs`]): what
    /// the sweep follows its runs by, however many jobs the scheduler has seen.
    pub(super) fn jobs(&self, ids: &[JobId], what: &str) -> Result<Vec<JobView>, SweepError> {
        let mut jobs = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(protocol::MAX_QUERY_IDS) {
            let mut query = JobQuery {
                ids: chunk.to_vec(),
                ..JobQuery::default()
            };
            loop {
                let Response::Jobs {
                    jobs: page, next, ..
                } = self.request(&Request::Jobs(query.clone()), what)?
                else {
                    return Err(SweepError::Scheduler {
                        socket: self.socket.clone(),
                        what: what.to_owned(),
                        detail: "unexpected answer to a jobs request".into(),
                    });
                };
                jobs.extend(page);
                match next {
                    Some(after) if query.after != Some(after) => query.after = Some(after),
                    _ => break,
                }
            }
        }
        Ok(jobs)
    }

    pub(super) fn answers(socket: &std::path::Path, timeout: Duration) -> bool {
        protocol::request(socket, &Request::Queue, timeout).is_ok()
    }

    pub(super) fn stop(&mut self) {
        if let Some((stop, thread)) = self.private.take() {
            stop.store(true, Ordering::SeqCst);
            let _ = thread.join();
        }
    }

    pub(super) fn start(choice: SchedulerChoice) -> Result<Self, SweepError> {
        let config = match choice {
            SchedulerChoice::PreferRunning { dir, private } => {
                let socket = daemon::socket_path(&dir);
                if Self::answers(&socket, Duration::from_secs(2)) {
                    return Ok(Self {
                        socket,
                        private: None,
                    });
                }
                private
            }
            SchedulerChoice::Running(dir) => {
                let socket = daemon::socket_path(&dir);
                if let Err(e) = protocol::request(&socket, &Request::Queue, CLIENT_TIMEOUT) {
                    return Err(SweepError::Scheduler {
                        socket,
                        what: "no scheduler answers (--scheduler-dir)".into(),
                        detail: e.to_string(),
                    });
                }
                return Ok(Self {
                    socket,
                    private: None,
                });
            }
            SchedulerChoice::Private(config) => config,
        };
        let dir = config.dir.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("ladle-sweep-scheduler".into())
                .spawn(move || {
                    if let Err(e) = daemon::run(*config, stop) {
                        tracing::error!("the sweep's scheduler stopped: {e}");
                    }
                })
                .map_err(|source| SweepError::Io {
                    what: "starting the sweep's scheduler thread for",
                    path: dir.clone(),
                    source,
                })?
        };
        let mut scheduler = Self {
            socket: daemon::socket_path(&dir),
            private: Some((stop, thread)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Self::answers(&scheduler.socket, CLIENT_TIMEOUT) {
            let dead = scheduler
                .private
                .as_ref()
                .is_some_and(|(_, t)| t.is_finished());
            if dead || Instant::now() > deadline {
                scheduler.stop();
                return Err(SweepError::Scheduler {
                    socket: scheduler.socket.clone(),
                    what: "starting the sweep's private scheduler".into(),
                    detail: "it did not come up (its error is logged above)".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(scheduler)
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Asks the scheduler to kill every run still running now (the second Ctrl-C, a grace overrun,
/// or a path that ends the sweep with an error): a cancel with no grace, which shortens one already under way. The scheduler,
/// which started the runs and knows each by its pid and start time, sends the signals; the
/// sweep never signals a process by a pid it was told earlier.
pub(super) fn kill_runs(scheduler: &Scheduler, runs: &[Run]) {
    for run in runs.iter().filter(|r| r.ended.is_none()) {
        let cancel = Request::Cancel {
            id: run.id,
            grace_s: Some(0.0),
        };
        let _ = scheduler.request(&cancel, "cancelling");
    }
}
