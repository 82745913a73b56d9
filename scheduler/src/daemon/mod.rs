//! The scheduler daemon: a Unix socket (mode 0600, peer uid checked) taking
//! [`Request`]s, a journal, and a loop that samples telemetry at 1 Hz, reaps finished jobs
//! and admits queued ones.
//!
//! ## Jobs as processes
//! Each attempt runs as `/bin/sh -c WRAPPER ladle-job-ID.ATTEMPT CLAIM STATUS CMD…` in its
//! own process group, stdout and stderr to `DIR/jobs/ID/ATTEMPT.out` / `.err`. The small
//! wrapper makes exactly-once launches checkable after a crash: it first creates the
//! attempt's claim file exclusively (`set -C`) with its pid in it, and refuses to run the
//! command if the claim exists; after the command it writes the exit code to the status
//! file. Jobs run in their own process groups, so they outlive a crashed or stopped daemon.
//!
//! ## Recovery (what "no job lost, none run twice" means here)
//! At start the journal is replayed. For an attempt journaled as starting or started with
//! no end:
//! - process still alive (pid and start time match) → **adopted**: watched until it exits;
//!   its exit code is read from the status file;
//! - process gone, status file present → finished with that code (success, failure, or an
//!   out-of-memory retry), as if the daemon had seen it;
//! - process gone, no status file → **interrupted**: it ran and was killed (e.g. a reboot);
//!   it is reported and *not* run again (at-most-once);
//! - `starting` journaled but no claim file → the daemon died before the job began; the
//!   daemon takes the claim itself (so a late wrapper can never run) and requeues the job
//!   at the head.
//!
//! A job journaled as finished never runs again; a queued job stays queued.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::job::{self, JobId, JobSpec, JobState};
use crate::journal::{Journal, JournalError, Outcome, Record};
use crate::mps::{self, Mps, MpsError};
use crate::policy::{Admission, GpuState, Pending, Policy};
use crate::protocol::{
    self, AttemptLogs, FeedSpec, GpuView, JobView, LOG_TAIL, ProtocolError, Request, Response,
};
use crate::sys;
use crate::telemetry::{
    GpuInfo, GpuWindows, NvmlTelemetry, ProcessMemory, SimGpus, SimLoad, Telemetry, TelemetryError,
};

/// Which GPUs the daemon schedules.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum GpuBackend {
    /// NVML if it loads, else an error.
    Nvml,
    /// NVML if it loads, else simulated GPUs (with a warning).
    Auto {
        /// Simulated GPUs to fall back on.
        sim_gpus: usize,
        /// Their memory, MiB.
        sim_memory_mib: u64,
    },
    /// Simulated GPUs: a job holds its estimate (or what it prints, see [`SIM_MARKER`]).
    Sim {
        /// GPUs.
        gpus: usize,
        /// Memory each, MiB.
        memory_mib: u64,
    },
}

/// Whether jobs run under MPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MpsMode {
    /// Start or adopt MPS when `nvidia-cuda-mps-control` exists, else run without (warn).
    Auto,
    /// MPS is required.
    On,
    /// Never use MPS.
    Off,
}

/// A job in sim mode may report its memory and SM demand on stdout with a line
/// `ladle-sim: mem_mib=3000 sm=0.4` (either field optional); until it does, it holds its
/// estimate and [`SIM_DEFAULT_SM`].
pub const SIM_MARKER: &str = "ladle-sim:";

/// SM demand a sim-mode job has until it reports one.
pub const SIM_DEFAULT_SM: f64 = 0.3;

/// Seconds between SIGTERM and SIGKILL when a running job is cancelled.
pub const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// The daemon's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DaemonConfig {
    /// State directory: socket, journal, job logs, MPS pipes.
    pub dir: PathBuf,
    /// Admission policy.
    pub policy: Policy,
    /// GPUs.
    pub gpu: GpuBackend,
    /// MPS.
    pub mps: MpsMode,
    /// Estimate for a job that states none and has no learned peak, MiB.
    pub default_estimate_mib: u64,
    /// Out-of-memory retries per job.
    pub max_oom_retries: u32,
    /// Telemetry and admission period.
    pub tick: Duration,
    /// CPU cores the admission shares between registered feeds' decode threads and jobs that
    /// state `cpus` (default: this machine's).
    pub cpu_cores: u32,
}

impl DaemonConfig {
    /// Defaults: policy `ladle`, GPUs `auto` (2 simulated GPUs of 40 GiB without NVML), MPS
    /// `auto`, 4 GiB default estimate, 3 retries, 1 s tick.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            policy: Policy::ladle(),
            gpu: GpuBackend::Auto {
                sim_gpus: 2,
                sim_memory_mib: 40 * 1024,
            },
            mps: MpsMode::Auto,
            default_estimate_mib: 4 * 1024,
            max_oom_retries: 3,
            tick: Duration::from_secs(1),
            cpu_cores: std::thread::available_parallelism()
                .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
        }
    }
}

/// The daemon's socket inside a state directory.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("scheduler.sock")
}

/// The daemon could not start or went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// The state directory could not be used.
    #[error("scheduler directory {path}: {source}")]
    Dir {
        /// The directory or file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another daemon holds this directory.
    #[error("another ladle scheduler is running on {0}")]
    AlreadyRunning(PathBuf),
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Telemetry failed to open.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// MPS was required and failed.
    #[error(transparent)]
    Mps(#[from] MpsError),
}

/// The shell wrapper around every attempt (see the module docs). `$0` names the attempt,
/// `$1` is the claim file, `$2` the status file, the rest the command.
const WRAPPER: &str = r#"set -C
{ echo $$ > "$1"; } 2>/dev/null || exit 86
set +C
status=$2
shift 2
trap : TERM INT HUP
"$@"
code=$?
echo $code >| "$status.tmp" && mv -f "$status.tmp" "$status"
exit $code
"#;

#[derive(Debug)]
struct Run {
    attempt: u32,
    gpus: Vec<usize>,
    pid: Option<u32>,
    child: Option<Child>,
    peak_mib: Option<u64>,
    cancel_at: Option<Instant>,
    sim_load: SimLoad,
    stdout_read: u64,
}

#[derive(Debug)]
struct Job {
    id: JobId,
    spec: JobSpec,
    estimate_mib: u64,
    exclusive: bool,
    attempts: u32,
    oom_retries: u32,
    state: JobState,
    submitted_at: f64,
    peak_mib: Option<u64>,
    run: Option<Run>,
}

struct State {
    journal: Journal,
    jobs: BTreeMap<JobId, Job>,
    queue: VecDeque<JobId>,
    learned: HashMap<String, u64>,
    next_id: JobId,
    telemetry: Box<dyn Telemetry>,
    gpus: Vec<GpuInfo>,
    windows: Vec<GpuWindows>,
    locked_until: Vec<f64>,
    engine: Admission,
    dir: PathBuf,
    default_estimate_mib: u64,
    max_oom_retries: u32,
    mps_env: Vec<(String, String)>,
    clock: Instant,
    /// CPU cores shared by feeds and jobs that state `cpus`.
    cpu_cores: u32,
    /// Registered producer feeds by name; not journaled (a feed re-registers when it
    /// starts, and lives as long as its process).
    feeds: BTreeMap<String, Feed>,
}

/// A registered feed and the start time of its process (so a reused pid is not taken for it).
struct Feed {
    spec: FeedSpec,
    started: u64,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug; the state is still the best we have.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn open_telemetry(backend: &GpuBackend) -> Result<Box<dyn Telemetry>, TelemetryError> {
    match backend {
        GpuBackend::Nvml => Ok(Box::new(NvmlTelemetry::open()?)),
        GpuBackend::Sim { gpus, memory_mib } => Ok(Box::new(SimGpus::new(*gpus, *memory_mib))),
        GpuBackend::Auto {
            sim_gpus,
            sim_memory_mib,
        } => match NvmlTelemetry::open() {
            Ok(nvml) => Ok(Box::new(nvml)),
            Err(e) => {
                tracing::warn!(
                    "{e}; scheduling {sim_gpus} simulated GPUs instead (use --gpu nvml to require a GPU)"
                );
                Ok(Box::new(SimGpus::new(*sim_gpus, *sim_memory_mib)))
            }
        },
    }
}

/// Runs the daemon until `stop` is set (SIGINT/SIGTERM in `ladle scheduler`). Running jobs
/// are left running when it stops; the next daemon on the same directory adopts them.
///
/// # Errors
/// [`DaemonError`] when it cannot start.
pub fn run(config: DaemonConfig, stop: Arc<AtomicBool>) -> Result<(), DaemonError> {
    let dir = config.dir.clone();
    let dir_err = |path: &Path| {
        let path = path.to_owned();
        move |source| DaemonError::Dir { path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(dir_err(&dir))?;
    let _lock = sys::lock_file(&dir.join("lock"))
        .map_err(dir_err(&dir.join("lock")))?
        .ok_or_else(|| DaemonError::AlreadyRunning(dir.clone()))?;
    std::fs::create_dir_all(dir.join("jobs")).map_err(dir_err(&dir.join("jobs")))?;

    let mut telemetry = open_telemetry(&config.gpu)?;
    let gpus = telemetry.gpus().to_vec();
    for gpu in &gpus {
        for why in &gpu.unsuitable {
            tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, "GPU takes no jobs: {why}");
        }
    }
    let simulated = telemetry.simulated().is_some();
    let mps = match (config.mps, simulated) {
        (MpsMode::Off, _) => None,
        (MpsMode::Auto, true) => None,
        (MpsMode::Auto, false) => match Mps::start_or_adopt(&dir) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!("{e}; running jobs without MPS");
                None
            }
        },
        (MpsMode::On, _) => Some(Mps::start_or_adopt(&dir)?),
    };

    let (journal, records) = Journal::open(&dir.join("journal.jsonl"))?;
    let mut state = State {
        journal,
        jobs: BTreeMap::new(),
        queue: VecDeque::new(),
        learned: HashMap::new(),
        next_id: 1,
        windows: vec![GpuWindows::default(); gpus.len()],
        locked_until: vec![f64::NEG_INFINITY; gpus.len()],
        gpus,
        telemetry,
        engine: Admission::new(config.policy.clone()),
        dir: dir.clone(),
        default_estimate_mib: config.default_estimate_mib,
        max_oom_retries: config.max_oom_retries,
        cpu_cores: config.cpu_cores,
        feeds: BTreeMap::new(),
        mps_env: mps.as_ref().map(Mps::env).unwrap_or_default(),
        clock: Instant::now(),
    };
    state.replay(records);
    state.recover()?;

    let socket = socket_path(&dir);
    let listener = bind(&socket)?;
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        wake: Condvar::new(),
    });
    {
        let shared = shared.clone();
        let socket = socket.clone();
        std::thread::Builder::new()
            .name("ladle-scheduler-accept".to_owned())
            .spawn(move || accept(listener, &shared, &socket))
            .map_err(|source| DaemonError::Socket {
                path: socket_path(&dir),
                source,
            })?;
    }
    tracing::info!(socket = %socket.display(), policy = %config.policy.name, "scheduler ready");

    let mut next_sample = Instant::now();
    let mut state = shared.lock();
    while !stop.load(Ordering::Relaxed) {
        let sample = Instant::now() >= next_sample;
        if sample {
            next_sample += config.tick;
            if next_sample < Instant::now() {
                next_sample = Instant::now() + config.tick;
            }
        }
        state.tick(sample);
        let wait = next_sample
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(250));
        state = shared
            .wake
            .wait_timeout(state, wait)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|e| e.into_inner().0);
    }
    let running = state.jobs.values().filter(|j| j.run.is_some()).count();
    drop(state);
    let _ = std::fs::remove_file(&socket);
    if let Some(mps) = mps {
        if mps.started_here() && running == 0 {
            if let Err(e) = mps.quit() {
                tracing::warn!("stopping MPS: {e}");
            }
        } else if running > 0 {
            tracing::info!("{running} jobs still running: leaving MPS up for them");
        }
    }
    tracing::info!(
        running,
        "scheduler stopped; running jobs continue and are adopted on restart"
    );
    Ok(())
}

fn bind(socket: &Path) -> Result<UnixListener, DaemonError> {
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

fn accept(listener: UnixListener, shared: &Arc<Shared>, socket: &Path) {
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

fn attempt_path(dir: &Path, id: JobId, attempt: u32, ext: &str) -> PathBuf {
    dir.join("jobs")
        .join(id.to_string())
        .join(format!("{attempt}.{ext}"))
}

/// The last `max` bytes of a file, lossily as text; empty when unreadable.
fn tail(path: &Path, max: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max as u64)));
    let mut bytes = Vec::new();
    let _ = f.take(max as u64).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

fn read_status(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Parses a [`SIM_MARKER`] line.
fn parse_sim_marker(line: &str) -> Option<(Option<u64>, Option<f64>)> {
    let rest = line.trim().strip_prefix(SIM_MARKER)?;
    let (mut mem, mut sm) = (None, None);
    for field in rest.split_whitespace() {
        if let Some(v) = field.strip_prefix("mem_mib=") {
            mem = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("sm=") {
            sm = v.parse::<f64>().ok().filter(|x| (0.0..=1.0).contains(x));
        }
    }
    Some((mem, sm))
}

impl State {
    fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    fn cap_mib(&self) -> u64 {
        self.gpus
            .iter()
            .map(|g| g.memory_total_mib)
            .max()
            .unwrap_or(u64::MAX)
    }

    fn record(&mut self, record: &Record) -> bool {
        match self.journal.append(record) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("{e}");
                false
            }
        }
    }

    /// Folds the journal into jobs, queue and learned estimates.
    fn replay(&mut self, records: Vec<Record>) {
        for record in records {
            match record {
                Record::Submitted {
                    id,
                    spec,
                    estimate_mib,
                    at,
                } => {
                    self.next_id = self.next_id.max(id + 1);
                    self.jobs.insert(
                        id,
                        Job {
                            id,
                            spec,
                            estimate_mib,
                            exclusive: false,
                            attempts: 0,
                            oom_retries: 0,
                            state: JobState::Queued,
                            submitted_at: at,
                            peak_mib: None,
                            run: None,
                        },
                    );
                    self.queue.push_back(id);
                }
                Record::Starting {
                    id, attempt, gpus, ..
                } => {
                    self.queue.retain(|&q| q != id);
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.attempts = job.attempts.max(attempt);
                        job.state = JobState::Running {
                            gpus: gpus.clone(),
                            pid: None,
                            attempt,
                        };
                        job.run = Some(Run {
                            attempt,
                            gpus: gpus.iter().map(|&g| g as usize).collect(),
                            pid: None,
                            child: None,
                            peak_mib: None,
                            cancel_at: None,
                            sim_load: SimLoad {
                                mem_mib: job.estimate_mib,
                                sm: SIM_DEFAULT_SM,
                            },
                            stdout_read: 0,
                        });
                    }
                }
                Record::Started {
                    id, attempt, pid, ..
                } => {
                    if let Some(job) = self.jobs.get_mut(&id) {
                        if let Some(run) = job.run.as_mut().filter(|r| r.attempt == attempt) {
                            run.pid = Some(pid);
                        }
                        if let JobState::Running { pid: p, .. } = &mut job.state {
                            *p = Some(pid);
                        }
                    }
                }
                Record::Finished {
                    id,
                    outcome,
                    peak_mib,
                    reason,
                    ..
                } => {
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.run = None;
                        job.peak_mib = job.peak_mib.max(peak_mib);
                        job.state = match outcome {
                            Outcome::Succeeded => JobState::Succeeded,
                            Outcome::Cancelled => JobState::Cancelled,
                            Outcome::Interrupted => JobState::Interrupted { reason },
                            Outcome::Failed | Outcome::OutOfMemory => JobState::Failed { reason },
                        };
                        if let (Outcome::Succeeded, Some(peak)) = (outcome, peak_mib) {
                            self.learned.insert(job.spec.learning_key(), peak);
                        }
                    }
                }
                Record::Requeued {
                    id,
                    estimate_mib,
                    exclusive,
                    out_of_memory,
                } => {
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.run = None;
                        job.state = JobState::Queued;
                        job.estimate_mib = estimate_mib;
                        job.exclusive = exclusive;
                        job.oom_retries += u32::from(out_of_memory);
                        self.queue.retain(|&q| q != id);
                        self.queue.push_front(id);
                    }
                }
                Record::Cancelled { id } => {
                    self.queue.retain(|&q| q != id);
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.state = JobState::Cancelled;
                    }
                }
            }
        }
    }

    /// Settles every attempt the journal left open (see the module docs).
    fn recover(&mut self) -> Result<(), DaemonError> {
        let open: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.run.is_some())
            .map(|j| j.id)
            .collect();
        for id in open {
            let Some((attempt, journaled_pid)) = self
                .jobs
                .get(&id)
                .and_then(|j| j.run.as_ref())
                .map(|r| (r.attempt, r.pid))
            else {
                continue;
            };
            let claim = attempt_path(&self.dir, id, attempt, "claim");
            let pid = match journaled_pid {
                Some(pid) => Some(pid),
                None => {
                    if let Some(parent) = claim.parent() {
                        std::fs::create_dir_all(parent).map_err(|source| DaemonError::Dir {
                            path: parent.to_owned(),
                            source,
                        })?;
                    }
                    match OpenOptions::new().write(true).create_new(true).open(&claim) {
                        Ok(_) => {
                            tracing::warn!(
                                job = id,
                                attempt,
                                "the daemon died before this attempt began; requeued at the head"
                            );
                            let (estimate_mib, exclusive) = self
                                .jobs
                                .get(&id)
                                .map_or((0, false), |j| (j.estimate_mib, j.exclusive));
                            let record = Record::Requeued {
                                id,
                                estimate_mib,
                                exclusive,
                                out_of_memory: false,
                            };
                            if self.record(&record) {
                                self.replay(vec![record]);
                            }
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            read_claim(&claim)
                        }
                        Err(source) => {
                            return Err(DaemonError::Dir {
                                path: claim,
                                source,
                            });
                        }
                    }
                }
            };
            let marker = format!("ladle-job-{id}.{attempt}");
            let live = pid.filter(|&p| sys::alive(p) && sys::cmdline(p).contains(&marker));
            if let Some(pid) = live {
                tracing::warn!(
                    job = id,
                    attempt,
                    pid,
                    "adopting a job that outlived the previous daemon"
                );
                if journaled_pid.is_none() {
                    let start_ticks = sys::start_ticks(pid).unwrap_or(0);
                    self.record(&Record::Started {
                        id,
                        attempt,
                        pid,
                        start_ticks,
                    });
                }
                if let Some(job) = self.jobs.get_mut(&id) {
                    if let Some(run) = job.run.as_mut() {
                        run.pid = Some(pid);
                    }
                    if let JobState::Running { pid: p, .. } = &mut job.state {
                        *p = Some(pid);
                    }
                }
                if let Some(sim) = self.telemetry.simulated()
                    && let Some(run) = self.jobs.get(&id).and_then(|j| j.run.as_ref())
                {
                    for &g in &run.gpus {
                        sim.place(g, id, run.sim_load);
                    }
                }
            } else {
                let status = read_status(&attempt_path(&self.dir, id, attempt, "status"));
                self.finish(id, status, None, status.is_none());
            }
        }
        Ok(())
    }

    fn handle(&mut self, request: Request) -> Response {
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
    fn cpus_busy(&mut self) -> u32 {
        let feed_threads: u32 = self
            .live_feeds()
            .map(|f| f.spec.threads)
            .fold(0, u32::saturating_add);
        self.jobs
            .values()
            .filter(|j| j.run.is_some())
            .filter_map(|j| j.spec.cpus)
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
        let learned = self
            .engine
            .policy()
            .learned_estimates
            .then(|| self.learned.get(&spec.learning_key()).copied())
            .flatten()
            .map(job::learned_estimate);
        let estimate_mib = spec
            .gpu_mem_mib
            .or(learned)
            .unwrap_or(self.default_estimate_mib);
        let id = self.next_id;
        let record = Record::Submitted {
            id,
            spec,
            estimate_mib,
            at: now_unix(),
        };
        if !self.record(&record) {
            return Response::Error {
                message: "the journal cannot be written; job not accepted".to_owned(),
            };
        }
        self.replay(vec![record]);
        tracing::info!(job = id, estimate_mib, "submitted");
        Response::Submitted { id, estimate_mib }
    }

    fn queue_view(&self) -> Response {
        let mut counts = vec![0u32; self.gpus.len()];
        for run in self.jobs.values().filter_map(|j| j.run.as_ref()) {
            for &g in &run.gpus {
                if let Some(c) = counts.get_mut(g) {
                    *c += 1;
                }
            }
        }
        Response::Queue {
            policy: self.engine.policy().name.clone(),
            jobs: self
                .jobs
                .values()
                .map(|j| JobView {
                    id: j.id,
                    spec: j.spec.clone(),
                    state: j.state.clone(),
                    estimate_mib: j.estimate_mib,
                    exclusive: j.exclusive,
                    attempts: j.attempts,
                    oom_retries: j.oom_retries,
                    peak_mib: j.peak_mib.max(j.run.as_ref().and_then(|r| r.peak_mib)),
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
                    }
                })
                .collect(),
        }
    }

    fn cancel(&mut self, id: JobId) -> Response {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Response::Error {
                message: format!("no job {id}"),
            };
        };
        match &job.state {
            JobState::Queued => {
                if !self.record(&Record::Cancelled { id }) {
                    return Response::Error {
                        message: "the journal cannot be written".to_owned(),
                    };
                }
                self.replay(vec![Record::Cancelled { id }]);
                Response::Cancelled { id }
            }
            JobState::Running { .. } => {
                let Some(run) = job.run.as_mut() else {
                    return Response::Error {
                        message: format!("job {id} is starting; try again"),
                    };
                };
                if let Some(pid) = run.pid {
                    if let Err(e) = sys::signal_group(pid, rustix::process::Signal::TERM) {
                        tracing::warn!(job = id, "SIGTERM: {e}");
                    }
                }
                run.cancel_at.get_or_insert_with(Instant::now);
                Response::Cancelled { id }
            }
            other => Response::Error {
                message: format!("job {id} has already ended ({other:?})"),
            },
        }
    }

    fn logs(&self, id: JobId) -> Response {
        let Some(job) = self.jobs.get(&id) else {
            return Response::Error {
                message: format!("no job {id}"),
            };
        };
        let attempts = (1..=job.attempts)
            .map(|attempt| {
                let stdout_path = attempt_path(&self.dir, id, attempt, "out");
                let stderr_path = attempt_path(&self.dir, id, attempt, "err");
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

    /// One round: sample (when due), reap, admit.
    fn tick(&mut self, sample: bool) {
        if sample {
            self.sample();
        }
        self.reap();
        self.admit();
    }

    fn sample(&mut self) {
        if self.telemetry.simulated().is_some() {
            self.read_sim_markers();
        }
        let mut processes = Vec::with_capacity(self.gpus.len());
        for g in 0..self.gpus.len() {
            match self.telemetry.sample(g) {
                Ok(sample) => {
                    processes.push(sample.processes.clone());
                    self.windows[g].push(sample);
                }
                Err(e) => tracing::warn!(gpu = g, "telemetry: {e}"),
            }
        }
        let by_group = memory_by_group(&processes, sys::process_group);
        if self.telemetry.simulated().is_none() {
            for run in self.jobs.values_mut().filter_map(|j| j.run.as_mut()) {
                if let Some(&mib) = run.pid.and_then(|pid| by_group.get(&pid)) {
                    run.peak_mib = run.peak_mib.max(Some(mib));
                }
            }
        }
    }

    /// Sim mode: read what jobs printed about their memory and SM demand.
    fn read_sim_markers(&mut self) {
        let dir = self.dir.clone();
        let mut updates = Vec::new();
        for job in self.jobs.values_mut() {
            let Some(run) = job.run.as_mut() else {
                continue;
            };
            let path = attempt_path(&dir, job.id, run.attempt, "out");
            let Ok(mut f) = File::open(&path) else {
                continue;
            };
            if f.seek(SeekFrom::Start(run.stdout_read)).is_err() {
                continue;
            }
            let mut bytes = Vec::new();
            let _ = (&mut f).take(1 << 20).read_to_end(&mut bytes);
            let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            run.stdout_read += complete as u64;
            let text = String::from_utf8_lossy(&bytes[..complete]);
            let mut changed = false;
            for (mem, sm) in text.lines().filter_map(parse_sim_marker) {
                if let Some(mem) = mem {
                    run.sim_load.mem_mib = mem;
                    run.peak_mib = run.peak_mib.max(Some(mem));
                }
                if let Some(sm) = sm {
                    run.sim_load.sm = sm;
                }
                changed = true;
            }
            if changed {
                updates.push((job.id, run.gpus.clone(), run.sim_load));
            }
        }
        if let Some(sim) = self.telemetry.simulated() {
            for (id, gpus, load) in updates {
                for g in gpus {
                    sim.place(g, id, load);
                }
            }
        }
    }

    fn reap(&mut self) {
        let mut ended = Vec::new();
        for job in self.jobs.values_mut() {
            let Some(run) = job.run.as_mut() else {
                continue;
            };
            if let Some(child) = run.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => ended.push((job.id, status.code(), status.signal(), false)),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(job = job.id, "waiting for the job: {e}"),
                }
            } else if let Some(pid) = run.pid {
                if !sys::alive(pid) {
                    let status =
                        read_status(&attempt_path(&self.dir, job.id, run.attempt, "status"));
                    ended.push((job.id, status, None, status.is_none()));
                }
            }
            if let (Some(at), Some(pid)) = (run.cancel_at, run.pid)
                && at.elapsed() > CANCEL_GRACE
            {
                let _ = sys::signal_group(pid, rustix::process::Signal::KILL);
            }
        }
        for (id, code, signal, vanished) in ended {
            self.finish(id, code, signal, vanished);
        }
    }

    /// Records the end of job `id`'s current attempt and decides what follows.
    fn finish(&mut self, id: JobId, code: Option<i32>, signal: Option<i32>, vanished: bool) {
        if self.telemetry.simulated().is_some() {
            self.read_sim_markers();
        }
        let cap = self.cap_mib();
        let max_retries = self.max_oom_retries;
        let dir = self.dir.clone();
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(run) = job.run.take() else { return };
        let attempt = run.attempt;
        let stderr = tail(&attempt_path(&dir, id, attempt, "err"), 1 << 20);
        let peak_mib = run.peak_mib;
        let mut requeue = None;
        let (outcome, reason) = if run.cancel_at.is_some() {
            (Outcome::Cancelled, "cancelled".to_owned())
        } else if vanished {
            (
                Outcome::Interrupted,
                "the process ended while the scheduler was down and left no exit status; not run again"
                    .to_owned(),
            )
        } else if code == Some(0) {
            (Outcome::Succeeded, "exit code 0".to_owned())
        } else if job::is_out_of_memory(code, &stderr) {
            if job.oom_retries < max_retries {
                requeue = Some(job::raised_estimate(job.estimate_mib, peak_mib, cap));
                (
                    Outcome::OutOfMemory,
                    format!(
                        "CUDA out of memory; retry {} of {max_retries}",
                        job.oom_retries + 1
                    ),
                )
            } else {
                (
                    Outcome::OutOfMemory,
                    format!("CUDA out of memory after {max_retries} retries"),
                )
            }
        } else {
            let how = match (code, signal) {
                (Some(c), _) => format!("exit code {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                (None, None) => "ended without an exit status".to_owned(),
            };
            (Outcome::Failed, how)
        };
        tracing::info!(job = id, attempt, ?outcome, "{reason}");
        if let Some(sim) = self.telemetry.simulated() {
            sim.remove(id);
        }
        let finished = Record::Finished {
            id,
            attempt,
            outcome,
            code,
            peak_mib,
            reason,
        };
        self.record(&finished);
        self.replay(vec![finished]);
        if let Some(estimate_mib) = requeue {
            let record = Record::Requeued {
                id,
                estimate_mib,
                exclusive: true,
                out_of_memory: true,
            };
            self.record(&record);
            self.replay(vec![record]);
        }
    }

    fn admit(&mut self) {
        if self.queue.is_empty() {
            return;
        }
        let now = self.now();
        let mut states: Vec<GpuState> = self
            .gpus
            .iter()
            .zip(&self.windows)
            .zip(&self.locked_until)
            .map(|((info, windows), &locked_until)| GpuState {
                locked_until,
                ..GpuState::observed(info, windows)
            })
            .collect();
        for job in self.jobs.values() {
            let Some(run) = &job.run else { continue };
            for &g in &run.gpus {
                if let Some(s) = states.get_mut(g) {
                    s.jobs += 1;
                    // Saturating: a journal from before sizes were bounded may hold any u64.
                    s.reserved_mib = s.reserved_mib.saturating_add(job.estimate_mib);
                    s.exclusive_job |= job.exclusive;
                    s.feeds.extend(job.spec.feed.clone());
                }
            }
        }
        // Data-aware: feeds' decode threads and jobs that decode for themselves share the
        // cores; a consumer of a feed costs none.
        let mut free_cpus = self.cpu_cores.saturating_sub(self.cpus_busy());
        let pending: Vec<Pending> = self
            .queue
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| match j.spec.cpus {
                None => true,
                Some(n) if n <= free_cpus => {
                    free_cpus -= n;
                    true
                }
                Some(_) => false, // held until cores free up
            })
            .map(|j| Pending {
                id: j.id,
                estimate_mib: j.estimate_mib,
                gpus: j.spec.gpus,
                exclusive: j.exclusive,
                feed: j.spec.feed.clone(),
                ..Pending::default()
            })
            .collect();
        let placements = self.engine.admit(now, &pending, &mut states);
        for (i, s) in states.iter().enumerate() {
            self.locked_until[i] = s.locked_until;
        }
        for p in placements {
            self.launch(p.job, &p.gpus, p.mem_limit_mib);
        }
    }

    fn launch(&mut self, id: JobId, gpus: &[usize], limit_mib: Option<u64>) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let attempt = job.attempts + 1;
        let starting = Record::Starting {
            id,
            attempt,
            gpus: gpus.iter().map(|&g| g as u32).collect(),
            limit_mib,
        };
        if !self.record(&starting) {
            return;
        }
        self.replay(vec![starting]);
        let spawned = self.spawn(id, attempt, gpus, limit_mib);
        match spawned {
            Ok(child) => {
                let pid = child.id();
                let start_ticks = sys::start_ticks(pid).unwrap_or(0);
                let started = Record::Started {
                    id,
                    attempt,
                    pid,
                    start_ticks,
                };
                self.record(&started);
                self.replay(vec![started]);
                tracing::info!(job = id, attempt, pid, ?gpus, "started");
                let mut load = None;
                if let Some(run) = self.jobs.get_mut(&id).and_then(|j| j.run.as_mut()) {
                    run.child = Some(child);
                    load = Some(run.sim_load);
                }
                if let (Some(sim), Some(load)) = (self.telemetry.simulated(), load) {
                    for &g in gpus {
                        sim.place(g, id, load);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(job = id, "cannot start: {e}");
                let finished = Record::Finished {
                    id,
                    attempt,
                    outcome: Outcome::Failed,
                    code: None,
                    peak_mib: None,
                    reason: format!("cannot start: {e}"),
                };
                self.record(&finished);
                self.replay(vec![finished]);
            }
        }
    }

    fn spawn(
        &self,
        id: JobId,
        attempt: u32,
        gpus: &[usize],
        limit_mib: Option<u64>,
    ) -> std::io::Result<Child> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| std::io::Error::other("job vanished"))?;
        let out_path = attempt_path(&self.dir, id, attempt, "out");
        if let Some(parent) = out_path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let open = |ext| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(attempt_path(&self.dir, id, attempt, ext))
        };
        let (out, err) = (open("out")?, open("err")?);
        let uuids: Vec<&str> = gpus
            .iter()
            .filter_map(|&g| self.gpus.get(g).map(|i| i.uuid.as_str()))
            .collect();
        Command::new("/bin/sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg(format!("ladle-job-{id}.{attempt}"))
            .arg(attempt_path(&self.dir, id, attempt, "claim"))
            .arg(attempt_path(&self.dir, id, attempt, "status"))
            .args(&job.spec.command)
            .current_dir(&job.spec.cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .envs(self.mps_env.iter().cloned())
            .envs(mps::job_env(&uuids, limit_mib, job.spec.thread_percentage))
            .envs(job.spec.env.iter().cloned())
            .env("LADLE_JOB_ID", id.to_string())
            .env("LADLE_JOB_ATTEMPT", attempt.to_string())
            .spawn()
    }
}

/// Each process group's device memory on its busiest GPU, MiB, from the GPUs' process
/// lists: a job's processes on one GPU add up, and a job's peak is per GPU, like its
/// estimate. `group_of` maps a pid to its process group (`None`: gone).
fn memory_by_group(
    per_gpu: &[Vec<ProcessMemory>],
    group_of: impl Fn(u32) -> Option<u32>,
) -> HashMap<u32, u64> {
    let mut by_group: HashMap<u32, u64> = HashMap::new();
    for processes in per_gpu {
        let mut on_gpu: HashMap<u32, u64> = HashMap::new();
        for p in processes {
            if let Some(pgid) = group_of(p.pid) {
                let sum = on_gpu.entry(pgid).or_default();
                *sum = sum.saturating_add(p.used_mib);
            }
        }
        for (pgid, mib) in on_gpu {
            let e = by_group.entry(pgid).or_default();
            *e = (*e).max(mib);
        }
    }
    by_group
}

/// The pid a wrapper wrote into its claim file; `None` if it never finished writing it.
fn read_claim(path: &Path) -> Option<u32> {
    for _ in 0..20 {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_markers_are_read_from_job_output() {
        assert_eq!(
            parse_sim_marker("ladle-sim: mem_mib=3000 sm=0.4"),
            Some((Some(3000), Some(0.4)))
        );
        assert_eq!(parse_sim_marker("ladle-sim: sm=7"), Some((None, None)));
        assert_eq!(parse_sim_marker("epoch 1 loss 0.3"), None);
    }

    #[test]
    fn a_jobs_memory_sums_its_processes_per_gpu_and_peaks_over_gpus() {
        let p = |pid, used_mib| ProcessMemory { pid, used_mib };
        // Group 100 = pids 1, 2 (a job and its data-loader child); group 200 = pid 3.
        let group = |pid: u32| match pid {
            1 | 2 => Some(100),
            3 => Some(200),
            _ => None,
        };
        let per_gpu = vec![
            vec![p(1, 3000), p(2, 500), p(3, 700), p(9, 9999)],
            vec![p(1, 4000), p(3, 100)],
        ];
        let by_group = memory_by_group(&per_gpu, group);
        assert_eq!(by_group.get(&100), Some(&4000));
        assert_eq!(by_group.get(&200), Some(&700));
        assert_eq!(by_group.len(), 2, "processes that are gone are ignored");
    }

    #[test]
    fn the_wrapper_runs_a_command_once_and_records_its_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let claim = dir.path().join("claim");
        let status = dir.path().join("status");
        let run = || {
            Command::new("/bin/sh")
                .arg("-c")
                .arg(WRAPPER)
                .arg("ladle-job-1.1")
                .arg(&claim)
                .arg(&status)
                .args(["sh", "-c", "echo ran >> \"$0\"; exit 3"])
                .arg(dir.path().join("ran"))
                .status()
                .unwrap()
        };
        assert_eq!(run().code(), Some(3));
        assert_eq!(read_status(&status), Some(3));
        assert!(read_claim(&claim).is_some());
        // A second launch of the same attempt refuses to run the command.
        assert_eq!(run().code(), Some(86));
        let ran = std::fs::read_to_string(dir.path().join("ran")).unwrap();
        assert_eq!(ran, "ran\n");
    }

    fn spec(script: &str) -> JobSpec {
        JobSpec {
            command: vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()],
            cwd: "/".into(),
            gpu_mem_mib: Some(1024),
            gpus: 1,
            feed: None,
            thread_percentage: None,
            env: Vec::new(),
            cpus: None,
        }
    }

    /// Starts a daemon on `dir` in a thread; returns its stop flag and handle.
    fn start(
        dir: &Path,
    ) -> (
        Arc<AtomicBool>,
        std::thread::JoinHandle<Result<(), DaemonError>>,
    ) {
        let mut config = DaemonConfig::new(dir.to_owned());
        config.gpu = GpuBackend::Sim {
            gpus: 1,
            memory_mib: 40 * 1024,
        };
        config.policy = Policy::named("exclusive").unwrap();
        config.tick = Duration::from_millis(100);
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::spawn(move || run(config, stop))
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while UnixStream::connect(socket_path(dir)).is_err() {
            assert!(Instant::now() < deadline, "daemon did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        (stop, handle)
    }

    fn jobs(dir: &Path) -> Vec<JobView> {
        match protocol::request(&socket_path(dir), &Request::Queue, Duration::from_secs(30)) {
            Ok(Response::Queue { jobs, .. }) => jobs,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn recovery_settles_every_attempt_the_journal_left_open_without_running_any_twice() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sched");
        std::fs::create_dir_all(dir.join("jobs/2")).unwrap();
        std::fs::create_dir_all(dir.join("jobs/3")).unwrap();
        let ran = tmp.path().join("ran");
        let script = |n: u32| format!("echo {n} >> {}", ran.display());
        // A process that has certainly exited, for the "started" records.
        let mut gone = Command::new("true").spawn().unwrap();
        let dead = gone.id();
        gone.wait().unwrap();
        let records = vec![
            // 1: the daemon died between "starting" and the spawn: no claim file.
            Record::Submitted {
                id: 1,
                spec: spec(&script(1)),
                estimate_mib: 1024,
                at: 0.0,
            },
            // 2: ran to completion while the daemon was down (status file 0).
            Record::Submitted {
                id: 2,
                spec: spec(&script(2)),
                estimate_mib: 1024,
                at: 0.0,
            },
            // 3: vanished without a status (killed with the machine).
            Record::Submitted {
                id: 3,
                spec: spec(&script(3)),
                estimate_mib: 1024,
                at: 0.0,
            },
            // 4: finished long ago.
            Record::Submitted {
                id: 4,
                spec: spec(&script(4)),
                estimate_mib: 1024,
                at: 0.0,
            },
            // 5: still queued.
            Record::Submitted {
                id: 5,
                spec: spec(&script(5)),
                estimate_mib: 1024,
                at: 0.0,
            },
            Record::Starting {
                id: 4,
                attempt: 1,
                gpus: vec![0],
                limit_mib: None,
            },
            Record::Started {
                id: 4,
                attempt: 1,
                pid: dead,
                start_ticks: 1,
            },
            Record::Finished {
                id: 4,
                attempt: 1,
                outcome: Outcome::Succeeded,
                code: Some(0),
                peak_mib: None,
                reason: String::new(),
            },
            Record::Starting {
                id: 2,
                attempt: 1,
                gpus: vec![0],
                limit_mib: None,
            },
            Record::Started {
                id: 2,
                attempt: 1,
                pid: dead,
                start_ticks: 1,
            },
            Record::Starting {
                id: 3,
                attempt: 1,
                gpus: vec![0],
                limit_mib: None,
            },
            Record::Started {
                id: 3,
                attempt: 1,
                pid: dead,
                start_ticks: 1,
            },
            Record::Starting {
                id: 1,
                attempt: 1,
                gpus: vec![0],
                limit_mib: None,
            },
        ];
        {
            let (mut journal, _) = Journal::open(&dir.join("journal.jsonl")).unwrap();
            for r in &records {
                journal.append(r).unwrap();
            }
        }
        std::fs::write(dir.join("jobs/2/1.status"), "0\n").unwrap();
        let (stop, handle) = start(&dir);
        let deadline = Instant::now() + Duration::from_secs(60);
        let jobs = loop {
            let jobs = jobs(&dir);
            if jobs.iter().all(|j| j.state.is_final()) {
                break jobs;
            }
            assert!(Instant::now() < deadline, "jobs never settled: {jobs:?}");
            std::thread::sleep(Duration::from_millis(50));
        };
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap().unwrap();
        let state = |id: u64| jobs.iter().find(|j| j.id == id).unwrap();
        assert_eq!(state(1).state, JobState::Succeeded);
        assert_eq!(state(1).attempts, 2, "attempt 1 was claimed by recovery");
        assert_eq!(state(2).state, JobState::Succeeded);
        assert!(matches!(state(3).state, JobState::Interrupted { .. }));
        assert_eq!(state(4).state, JobState::Succeeded);
        assert_eq!(state(5).state, JobState::Succeeded);
        // Only 1 (requeued at the head) and 5 (queued) ran in this daemon, in that order.
        assert_eq!(std::fs::read_to_string(&ran).unwrap(), "1\n5\n");
    }

    #[test]
    fn a_submit_over_the_socket_stating_u64_max_mib_is_refused_and_nothing_is_queued() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sched");
        let (stop, handle) = start(&dir);
        let mut absurd = spec("true");
        absurd.gpu_mem_mib = Some(u64::MAX);
        let answer = protocol::request(
            &socket_path(&dir),
            &Request::Submit(absurd),
            Duration::from_secs(30),
        );
        let queued = jobs(&dir);
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap().unwrap();
        match answer {
            Ok(Response::Error { message }) => {
                assert!(
                    message.contains("gpu_mem_mib") && message.contains("16 TiB"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(queued.is_empty(), "{queued:?}");
    }
}
