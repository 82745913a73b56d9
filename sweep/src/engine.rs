//! One node's sweep: its runs as consumers of one feed, each admitted by a scheduler.
//!
//! [`run`] starts (or reuses) the feed, uses the running scheduler or starts a private one
//! in-process, submits every run with `LADLE_SOCKET` (the feed), `LADLE_RUN` (its name) and
//! `LADLE_CONNECT_TIMEOUT` in its environment, follows the runs as they start and end, and
//! returns the report with the cost. Raising `stop` cancels every run (each gets SIGTERM from
//! the scheduler, then its process group SIGKILL after the stop grace); raising `hurry` kills
//! them at once. Under the sweep's directory (`out`) it writes, as it goes:
//! [`crate::ledger::NODE`] at start, one line of [`crate::ledger::RUNS`] per run that ends,
//! and [`crate::ledger::REPORT`] at the end: what `ladle report --merge` and a requeued or
//! resumed Slurm sweep read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ladle_observe::Observer;
use ladle_observe::report::{Cost, FeedReport, RunReport, SweepReport};
use ladle_producer::{Producer, ProducerConfig};
use ladle_scheduler::daemon::{self, DaemonConfig};
use ladle_scheduler::job::{JobId, JobSpec};
use ladle_scheduler::protocol::{self, FeedSpec, JobQuery, JobView, Request, Response};

use crate::SweepError;
use crate::grid::{PlannedRun, Shard};
use crate::ledger::{Ledger, NodeStart};
use crate::view::{Progress, Run, ShowProgress, follow_consumers, table};

/// How often the sweep asks the scheduler how its runs stand.
const POLL: Duration = Duration::from_millis(500);

/// How long a client waits for the daemon's answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Jobs requests that may fail in a row before the sweep gives up (and cancels its runs).
const QUEUE_TRIES: u32 = 5;

/// How long a run waits for its feed's socket to appear (`LADLE_CONNECT_TIMEOUT`).
pub const RUN_CONNECT_TIMEOUT_S: u32 = 60;

/// Which scheduler admits the runs.
#[derive(Debug)]
pub enum SchedulerChoice {
    /// The daemon answering on this state directory's socket, if it runs; else a private one.
    PreferRunning {
        /// The running daemon's state directory.
        dir: PathBuf,
        /// The private daemon to start otherwise.
        private: Box<DaemonConfig>,
    },
    /// The daemon of this state directory, which must be running.
    Running(PathBuf),
    /// A private daemon, in-process, for this sweep only (always so under Slurm).
    Private(Box<DaemonConfig>),
}

/// The feed a sweep serves its runs from.
pub struct FeedSource {
    /// The dataset's path, as given (for the lines and the feed's key).
    pub path: PathBuf,
    /// The dataset, opened.
    pub dataset: Box<dyn ladle_datasets::Dataset>,
    /// The producer's configuration; its socket is where the feed listens.
    pub config: ProducerConfig,
}

impl std::fmt::Debug for FeedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedSource")
            .field("path", &self.path)
            .field("socket", &self.config.socket)
            .finish_non_exhaustive()
    }
}

/// Prices for the report's dollars (none given: no dollars).
#[derive(Debug, Clone, Copy, Default)]
pub struct Prices {
    /// One CPU core-hour, USD.
    pub cpu_hour: Option<f64>,
    /// One GPU-hour, USD.
    pub gpu_hour: Option<f64>,
}

/// Starts `--metrics`/`--record` once the feed and scheduler sockets are known.
pub type StartObserver =
    Box<dyn FnOnce(ladle_observe::Sockets) -> Result<Option<Observer>, String>>;

/// One node's sweep.
#[derive(Debug)]
pub struct SweepConfig {
    /// The runs this node runs (a shard of the grid, named over the whole grid).
    pub runs: Vec<PlannedRun>,
    /// Runs of `runs` that already succeeded (a requeued or resumed sweep): not run again.
    pub done: BTreeSet<String>,
    /// Which shard of the grid `runs` is, for the record.
    pub shard: Shard,
    /// The node's name in lines and reports (`None` on one machine without shards).
    pub node: Option<String>,
    /// The Slurm job, when there is one, for the record.
    pub job_id: Option<String>,
    /// Where the runs' logs, the ledger and the report go (shared under Slurm).
    pub out: PathBuf,
    /// The runs' working directory.
    pub cwd: PathBuf,
    /// The feed.
    pub feed: FeedSource,
    /// The feed's name with the scheduler (default: `sweep-PID`).
    pub feed_name: Option<String>,
    /// The scheduler.
    pub scheduler: SchedulerChoice,
    /// Device memory each run needs per GPU, MiB (none: measured, then packed).
    pub gpu_mem_mib: Option<u64>,
    /// GPUs each run needs at once (a `torchrun --nproc_per_node N` run: N).
    pub gpus_per_run: u32,
    /// The family the runs' measured memory is shared under.
    pub family: Option<String>,
    /// Prices for the report.
    pub prices: Prices,
    /// After `stop`, how long cancelled runs get to end before their process groups are
    /// killed.
    pub stop_grace: Duration,
    /// Where the live table goes at each look (`ladle sweep` draws it on a terminal);
    /// `None`: a plain line per change on stderr instead.
    pub progress: Option<ShowProgress>,
    /// Where `--record` records: the report is written there too, for `ladle report`.
    pub record: Option<PathBuf>,
}

/// Raised by the caller's signal handling: `stop` for a clean stop, `hurry` for an
/// immediate one.
#[derive(Debug, Clone, Default)]
pub struct StopFlags {
    /// Cancel every run, stop the feed and the private scheduler.
    pub stop: Arc<AtomicBool>,
    /// Kill the runs' process groups now.
    pub hurry: Arc<AtomicBool>,
}

/// A progress line: on stderr, so that stdout holds only the report.
fn say(node: Option<&str>, line: &str) {
    match node {
        Some(node) => eprintln!("ladle sweep [{node}]: {line}"),
        None => eprintln!("ladle sweep: {line}"),
    }
}

/// Where the sweep talks to its scheduler.
struct Scheduler {
    socket: PathBuf,
    private: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Scheduler {
    fn request(&self, request: &Request, what: &str) -> Result<Response, SweepError> {
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
    fn jobs(&self, ids: &[JobId], what: &str) -> Result<Vec<JobView>, SweepError> {
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

    fn answers(socket: &std::path::Path, timeout: Duration) -> bool {
        protocol::request(socket, &Request::Queue, timeout).is_ok()
    }

    fn stop(&mut self) {
        if let Some((stop, thread)) = self.private.take() {
            stop.store(true, Ordering::SeqCst);
            let _ = thread.join();
        }
    }

    fn start(choice: SchedulerChoice) -> Result<Self, SweepError> {
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

/// A dataset as feeds are matched: its canonical path.
pub fn dataset_key(dataset: &std::path::Path) -> String {
    dataset
        .canonicalize()
        .unwrap_or_else(|_| dataset.to_owned())
        .display()
        .to_string()
}

/// A feed's transform as feeds are matched: the whole pipeline in canonical form (equal for
/// equal pipelines, whichever way they were written), the seed, the ring and the policy.
pub fn transform_key(config: &ProducerConfig) -> String {
    format!(
        "{} seed {} ring {} policy {:?}",
        config.augment, config.seed, config.ring_bytes, config.policy
    )
}

/// Runs one node's sweep to its end (or until `flags.stop`), and returns its report.
///
/// # Errors
/// A scheduler that cannot be reached or refuses a run, a feed that cannot start or fails,
/// files of `out` that cannot be written. A sweep whose runs fail is not an error: the
/// report says so.
pub fn run(
    config: SweepConfig,
    observe: StartObserver,
    flags: &StopFlags,
) -> Result<SweepReport, SweepError> {
    let SweepConfig {
        runs: planned,
        done,
        shard,
        node,
        job_id,
        out,
        cwd,
        feed,
        feed_name,
        scheduler,
        gpu_mem_mib,
        gpus_per_run,
        family,
        prices,
        stop_grace,
        progress,
        record,
    } = config;
    let node_ref = node.as_deref();
    let (stop, hurry) = (&*flags.stop, &*flags.hurry);
    std::fs::create_dir_all(&out).map_err(|source| SweepError::Io {
        what: "creating the sweep's directory",
        path: out.clone(),
        source,
    })?;
    let (todo, skipped): (Vec<_>, Vec<_>) =
        planned.into_iter().partition(|r| !done.contains(&r.name));
    let mut ledger = Ledger::start(
        &out,
        &NodeStart {
            node: node.clone(),
            shard,
            job_id: job_id.clone(),
            runs: todo.iter().map(|r| r.name.clone()).collect(),
            skipped: skipped.iter().map(|r| r.name.clone()).collect(),
        },
    )?;
    if !skipped.is_empty() {
        say(
            node_ref,
            &format!(
                "{} runs already succeeded, not run again: {}",
                skipped.len(),
                skipped
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        );
    }

    let started = Instant::now();
    let mut scheduler = Scheduler::start(scheduler)?;
    let FeedSource {
        path: dataset_path,
        dataset,
        config: producer_config,
    } = feed;
    let (dataset_key, transform) = (dataset_key(&dataset_path), transform_key(&producer_config));
    // A live feed of the same dataset and transform serves this sweep as well as its own.
    let reuse = match scheduler.request(&Request::Feeds, "listing feeds")? {
        Response::Feeds { feeds, .. } => feeds
            .into_iter()
            .find(|f| f.dataset == dataset_key && f.transform == transform),
        _ => None,
    };
    if reuse.is_none() && !todo.is_empty() {
        wait_for_cores(&scheduler, producer_config.threads, stop, node_ref)?;
    }
    let feed_stop = Arc::new(AtomicBool::new(false));
    let (producer, socket, feed_name) = if let Some(feed) = reuse {
        say(
            node_ref,
            &format!(
                "reusing the live feed {:?} on {}",
                feed.name,
                feed.socket.display()
            ),
        );
        (None, feed.socket, feed.name)
    } else {
        let socket = producer_config.socket.clone();
        let threads = u32::try_from(producer_config.threads).unwrap_or(u32::MAX);
        let producer =
            Producer::start_with_stop(Arc::from(dataset), producer_config, feed_stop.clone())
                .map_err(|e| SweepError::Feed {
                    socket: socket.clone(),
                    detail: format!("cannot start: {e}"),
                })?;
        let feed_name = feed_name.unwrap_or_else(|| format!("sweep-{}", std::process::id()));
        scheduler.request(
            &Request::RegisterFeed(FeedSpec {
                name: feed_name.clone(),
                socket: socket.clone(),
                dataset: dataset_key,
                transform,
                threads,
                pid: std::process::id(),
            }),
            &format!("registering the feed {feed_name:?}"),
        )?;
        (Some(producer), socket, feed_name)
    };
    say(
        node_ref,
        &format!(
            "sweep of {} runs: feed {feed_name:?} of {} on {}, scheduler {}",
            todo.len(),
            dataset_path.display(),
            socket.display(),
            scheduler.socket.display()
        ),
    );

    // --metrics / --record: the feed and the scheduler, over their sockets.
    let observer = observe(ladle_observe::Sockets {
        feeds: vec![(feed_name.clone(), socket.clone())],
        scheduler: Some(scheduler.socket.clone()),
        scheduler_feeds: false,
    })
    .map_err(SweepError::Observe)?;
    // Each run gets the sweep's own environment (its venv, PYTHONPATH, keys), whichever
    // scheduler starts it: a scheduler started earlier from another shell would otherwise
    // give it that shell's. (A variable that is not UTF-8 cannot cross the socket.)
    let sweep_env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(n, v)| Some((n.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let mut runs = Vec::new();
    for planned in todo {
        let mut env = sweep_env.clone();
        env.extend([
            ("LADLE_SOCKET".into(), socket.display().to_string()),
            ("LADLE_RUN".into(), planned.name.clone()),
            (
                "LADLE_CONNECT_TIMEOUT".into(),
                RUN_CONNECT_TIMEOUT_S.to_string(),
            ),
        ]);
        let spec = JobSpec {
            command: planned.args.clone(),
            cwd: cwd.clone(),
            gpu_mem_mib,
            gpus: gpus_per_run,
            feed: Some(feed_name.clone()),
            thread_percentage: None,
            env,
            whole_env: true,
            cpus: None,
            family: family.clone(),
        };
        let id = match scheduler.request(
            &Request::Submit(spec),
            &format!("submitting {}", planned.name),
        ) {
            Ok(Response::Submitted { id, .. }) => id,
            failed => {
                // Nothing of a sweep that cannot be submitted whole is left to run.
                cancel_all(&scheduler, &runs);
                return Err(failed.err().unwrap_or_else(|| SweepError::Scheduler {
                    socket: scheduler.socket.clone(),
                    what: format!("submitting {}", planned.name),
                    detail: "unexpected answer".into(),
                }));
            }
        };
        say(
            node_ref,
            &format!("{}: job {id}: {}", planned.name, planned.args.join(" ")),
        );
        runs.push(Run::queued(planned.name, planned.args, id));
    }

    let mut next_feed_line = Instant::now() + Duration::from_secs(10);
    let mut live = progress;
    let mut last_published = 0u64;
    let mut last_look = Instant::now();
    let mut queue_failures = 0u32;
    let mut cancelled_at: Option<Instant> = None;
    let mut recorded = BTreeSet::new();
    loop {
        let pending: Vec<JobId> = runs
            .iter()
            .filter(|r| r.ended.is_none())
            .map(|r| r.id)
            .collect();
        let jobs = match scheduler.jobs(&pending, "following the runs") {
            Ok(jobs) => {
                queue_failures = 0;
                jobs
            }
            failed => {
                // A scheduler that stops answering: a few more tries, then give up and leave
                // nothing running behind.
                queue_failures += 1;
                if queue_failures < QUEUE_TRIES {
                    std::thread::sleep(POLL);
                    continue;
                }
                cancel_all(&scheduler, &runs);
                return Err(failed.err().unwrap_or_else(|| SweepError::Scheduler {
                    socket: scheduler.socket.clone(),
                    what: "following the runs".into(),
                    detail: "unexpected answer to a jobs request".into(),
                }));
            }
        };
        let by_id: BTreeMap<JobId, _> = jobs.iter().map(|j| (j.id, j)).collect();
        for run in &mut runs {
            let Some(job) = by_id.get(&run.id) else {
                continue;
            };
            run.peak_mib = job.peak_mib;
            run.cpu_s = job.cpu_s;
            if let Some(line) = run.follow(&job.state)
                && live.is_none()
            {
                say(node_ref, &line);
            }
            if run.ended.is_some() && recorded.insert(run.id) {
                ledger.append(&run_report(&scheduler, run, node_ref));
            }
        }
        if let Some(ShowProgress(show)) = &mut live {
            let seconds = last_look.elapsed().as_secs_f64().max(1e-3);
            last_look = Instant::now();
            let feed = match &producer {
                Some(p) => {
                    let published = p.published();
                    let rate = published.saturating_sub(last_published) as f64 / seconds;
                    last_published = published;
                    let stats = p.consumer_stats();
                    let held = follow_consumers(&mut runs, &stats, p.dataset_len(), seconds);
                    format!(
                        "feed {feed_name:?}: {published} samples decoded ({rate:.0}/s), {} bad{held}",
                        p.bad_samples()
                    )
                }
                None => format!("feed {feed_name:?} (reused)"),
            };
            show(&Progress {
                table: table(&runs, Instant::now()),
                feed,
            });
        }
        if runs.iter().all(|r| r.ended.is_some()) {
            break;
        }
        if stop.load(Ordering::SeqCst) && cancelled_at.is_none() {
            say(node_ref, "stopping: cancelling every run");
            // The scheduler gives each run the sweep's grace before its SIGKILL (before
            // protocol version 5 its own 10 s cut a longer `--stop-grace` short).
            let grace_s = Some(stop_grace.as_secs_f64());
            for run in runs.iter().filter(|r| r.ended.is_none()) {
                let cancel = Request::Cancel {
                    id: run.id,
                    grace_s,
                };
                let _ = scheduler.request(&cancel, "cancelling");
            }
            cancelled_at = Some(Instant::now());
        }
        let overdue = cancelled_at.is_some_and(|at| at.elapsed() > stop_grace);
        if hurry.load(Ordering::SeqCst) || overdue {
            kill_runs(&runs);
            if cancelled_at.is_some_and(|at| at.elapsed() > stop_grace * 2 + POLL * 4) {
                break; // the scheduler does not see them end; give up waiting
            }
        }
        if live.is_none() && Instant::now() >= next_feed_line {
            next_feed_line += Duration::from_secs(10);
            let live = runs.iter().filter(|r| r.state == "running").count();
            say(
                node_ref,
                &match &producer {
                    Some(p) => format!(
                        "feed: {} samples published, {} bad; {live} runs running",
                        p.published(),
                        p.bad_samples()
                    ),
                    None => format!("{live} runs running"),
                },
            );
        }
        std::thread::sleep(POLL);
    }

    if let Some(observer) = observer {
        observer.stop();
    }
    // Logs before the scheduler goes away.
    let mut reports = Vec::new();
    for run in &runs {
        let report = run_report(&scheduler, run, node_ref);
        if recorded.insert(run.id) {
            ledger.append(&report);
        }
        reports.push(report);
    }
    scheduler.stop();
    feed_stop.store(true, Ordering::SeqCst);
    let served = match producer {
        Some(producer) => {
            producer.stop();
            Some(producer.wait().map_err(|e| SweepError::Feed {
                socket: socket.clone(),
                detail: format!("failed: {e}"),
            })?)
        }
        None => None,
    };
    let (published, consumed, bad) =
        (served.as_ref()).map_or((0, 0, 0), |s| (s.published, s.consumed, s.bad_samples));
    let decode_cpu = (served.as_ref()).map_or(0.0, |s| s.decode_cpu.as_secs_f64());
    let wall = started.elapsed().as_secs_f64();
    let own_cpu = ladle_procs::cpu_time(ladle_procs::Usage::Myself).as_secs_f64();
    // As the scheduler measured each run (wait4), whichever scheduler ran it: the sweep's
    // own, or a shared one whose runs are not this process's children.
    let runs_cpu: f64 = reports.iter().filter_map(|r| r.cpu_seconds).sum();
    let gpu_hours: f64 = reports
        .iter()
        .map(|r| r.seconds.unwrap_or(0.0) * r.gpu.len().max(1) as f64 / 3600.0)
        .sum();
    let per_sample = decode_cpu / published.max(1) as f64;
    let private_cpu = runs_cpu + per_sample * consumed as f64;
    // Private pipelines on the same cores (the CPU bound of `ladle cost`'s model, the measured
    // wall standing for the GPUs' time): the runs' CPU and their decoding must fit in the
    // cores' time, else the sweep takes longer and its runs hold their GPUs longer. A run
    // whose CPU its scheduler did not measure (adopted after a restart) counts none.
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let (private_wall, _) = ladle_observe::cost::wall_seconds(wall, private_cpu, cores);
    let private_gpu_hours = gpu_hours * private_wall / wall.max(f64::MIN_POSITIVE);
    let report = SweepReport {
        runs: reports,
        feed: FeedReport {
            socket: socket.clone(),
            reused: served.is_none(),
            samples_published: published,
            samples_consumed: consumed,
            bad_samples: bad,
            cpu_seconds: decode_cpu,
        },
        wall_seconds: wall,
        cpu_seconds: own_cpu + runs_cpu,
        cost: Cost {
            cpu_seconds: own_cpu + runs_cpu,
            gpu_hours,
            dollars: prices.price(own_cpu + runs_cpu, gpu_hours),
            private_pipelines_cpu_seconds: private_cpu,
            private_pipelines_dollars: prices.price(private_cpu, private_gpu_hours),
            private_pipelines_wall_seconds: Some(private_wall),
            private_pipelines_gpu_hours: Some(private_gpu_hours),
        },
        nodes: Vec::new(),
    };
    ledger.finish(&report);
    if let Some(dir) = &record {
        // Beside the recorded series, for `ladle report`'s cost plot.
        crate::ledger::write_report(&dir.join(ladle_observe::record::REPORT), &report);
    }
    Ok(report)
}

impl Prices {
    /// The price of `cpu_s` core-seconds and `gpu_hours`, when any price was given.
    pub fn price(&self, cpu_s: f64, gpu_hours: f64) -> Option<f64> {
        match (self.cpu_hour, self.gpu_hour) {
            (None, None) => None,
            (cpu, gpu) => {
                Some(cpu.unwrap_or(0.0) * cpu_s / 3600.0 + gpu.unwrap_or(0.0) * gpu_hours)
            }
        }
    }
}

/// A new feed needs `threads` cores: waits while the scheduler's feeds and jobs that state
/// `cpus` leave fewer free (a sweep of an existing feed never waits here). A feed wider than
/// the machine starts once nothing else holds cores.
fn wait_for_cores(
    scheduler: &Scheduler,
    threads: usize,
    stop: &AtomicBool,
    node: Option<&str>,
) -> Result<(), SweepError> {
    let threads = u32::try_from(threads).unwrap_or(u32::MAX);
    let mut said = false;
    loop {
        let Response::Feeds {
            cpu_cores,
            cpus_busy,
            ..
        } = scheduler.request(&Request::Feeds, "listing feeds")?
        else {
            return Ok(());
        };
        if cpus_busy == 0 || cpus_busy.saturating_add(threads) <= cpu_cores {
            return Ok(());
        }
        if !said {
            say(
                node,
                &format!(
                    "waiting for cores: the new feed needs {threads}, {cpus_busy} of {cpu_cores} \
                     are taken by feeds and jobs"
                ),
            );
            said = true;
        }
        if stop.load(Ordering::SeqCst) {
            return Err(SweepError::Stopped("while waiting for cores for the feed"));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Cancels every run not ended (best effort: on a path that ends the sweep with an error) and
/// kills the process groups of those it knows to be running.
fn cancel_all(scheduler: &Scheduler, runs: &[Run]) {
    for run in runs.iter().filter(|r| r.ended.is_none()) {
        let cancel = Request::Cancel {
            id: run.id,
            grace_s: None,
        };
        let _ = scheduler.request(&cancel, "cancelling");
    }
    kill_runs(runs);
}

/// Kills the process group of every run still running (the second Ctrl-C).
fn kill_runs(runs: &[Run]) {
    for run in runs.iter().filter(|r| r.ended.is_none()) {
        if let Some(pid) = run.pid {
            let _ = ladle_scheduler::sys::signal_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A run's line of the report, with its logs from the scheduler.
fn run_report(scheduler: &Scheduler, run: &Run, node: Option<&str>) -> RunReport {
    let attempts = match scheduler.request(&Request::Logs { id: run.id }, "reading logs") {
        Ok(Response::Logs { attempts, .. }) => attempts,
        _ => Vec::new(),
    };
    let last = attempts.last();
    let exit_code = match run.state {
        "succeeded" => Some(0),
        _ => run
            .reason
            .as_deref()
            .and_then(|r| r.strip_prefix("exit code "))
            .and_then(|c| c.parse().ok()),
    };
    let last_lines = match last {
        Some(a) if exit_code != Some(0) => {
            let lines: Vec<&str> = a.stderr.lines().collect();
            lines[lines.len().saturating_sub(5)..]
                .iter()
                .map(|l| (*l).to_owned())
                .collect()
        }
        _ => Vec::new(),
    };
    RunReport {
        name: run.name.clone(),
        args: run.args.clone(),
        state: run.state.to_owned(),
        exit_code,
        reason: run.reason.clone(),
        log: last.map(|a| a.stdout_path.clone()),
        stderr_log: last.map(|a| a.stderr_path.clone()),
        seconds: run
            .started
            .zip(run.ended)
            .map(|(s, e)| e.duration_since(s).as_secs_f64()),
        gpu: run.gpus.clone(),
        last_lines,
        node: node.map(str::to_owned),
        cpu_seconds: run.cpu_s,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use ladle_datasets::transforms::Transforms;

    fn key(spec: &str) -> String {
        transform_key(&ProducerConfig {
            augment: Transforms::parse(spec).unwrap(),
            ..ProducerConfig::default()
        })
    }

    #[test]
    fn the_transform_key_is_equal_for_equal_pipelines_however_written_and_differs_otherwise() {
        let calls = key("RandomCrop(32, padding=4), RandomHorizontalFlip()");
        assert_eq!(
            calls,
            key(r#"[{"name":"RandomCrop","size":32,"padding":4},{"name":"RandomHorizontalFlip"}]"#)
        );
        assert_eq!(
            calls,
            key("RandomCrop(size=(32, 32), padding=(4, 4, 4, 4)), RandomHorizontalFlip(p=0.5)")
        );
        assert!(
            calls.contains("RandomCrop(size=(32, 32), padding=(4, 4, 4, 4)"),
            "{calls}"
        );
        assert!(calls.contains("RandomHorizontalFlip(p=0.5)"), "{calls}");
        assert_ne!(
            calls,
            key("RandomCrop(32, padding=4), RandomHorizontalFlip(0.4)")
        );
        assert_ne!(calls, key("RandomCrop(32, padding=4)"));
        assert_eq!(
            key("RandomResizedCrop(224), RandomHorizontalFlip()"),
            transform_key(&ProducerConfig::default())
        );
    }
}
