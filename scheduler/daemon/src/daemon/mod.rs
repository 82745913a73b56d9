//! The scheduler daemon: a Unix socket (mode 0600, peer uid checked) taking
//! [`crate::protocol::Request`]s, a journal, and a loop that samples telemetry at 1 Hz, reaps finished jobs
//! and admits queued ones.
//!
//! ## Jobs as processes
//! Each attempt runs as `/bin/sh -c WRAPPER ladle-job-ID.ATTEMPT CLAIM STATUS CMD…` in its
//! own process group, stdout and stderr to `DIR/jobs/ID/ATTEMPT.out` / `.err`, or to
//! `LOG_DIR/ID/ATTEMPT.out` / `.err` with [`DaemonConfig::log_dir`] (a shared submit
//! directory under Slurm, while the claim and status files stay in the node-local state
//! directory). The small wrapper makes exactly-once launches checkable after a crash: it
//! first creates the attempt's claim file exclusively (`set -C`) with its pid in it, and
//! refuses to run the command if the claim exists; after the command it writes the exit
//! code to the status file. Jobs run in their own process groups, so they outlive a crashed
//! or stopped daemon, unless [`DaemonConfig::stop_jobs`] says to take them down with it.
//!
//! ## Stopping with the jobs (`stop_jobs`)
//! A daemon inside a Slurm allocation must not leave processes behind when its step ends
//! (ladle never relies on Slurm to clean up what it started). With
//! [`DaemonConfig::stop_jobs`] `Some(grace)`, on stop it stops admitting, sends SIGTERM to
//! every running job's process group (a training loop may checkpoint), reaps those that end
//! within `grace` (journaled as interrupted, "stopped with the scheduler", and not run
//! again), sends SIGKILL to every group that still has a live process, reaps them, and
//! quits MPS if it started it. The socket answers until then.
//!
//! ## Only the allocated GPUs
//! [`DaemonConfig::allocated`] ([`crate::allocation`]) restricts the daemon to some of the
//! node's GPUs: NVML is enumerated and only those are kept, simulated GPUs are one per
//! allocated GPU, and an MPS control daemon started here sees only their UUIDs. The
//! daemon's GPUs are numbered `0..k` in NVML's order: that is what a job's `gpus`, the
//! journal and admission name; [`GpuInfo::index`] keeps NVML's own index for the log,
//! `ladle queue` and DCGM. Jobs get their GPUs by UUID in `CUDA_VISIBLE_DEVICES` as always.
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
//!
//! ## A journal that went wrong
//! An append that fails (a full disk) leaves nothing in the journal, and the request that
//! needed it is answered with the error, which names the journal and the full disk; the
//! daemon keeps serving. A torn last line is cut off with a warning naming its job and what
//! was lost; a damaged line elsewhere holds the jobs it may concern ([`state`]'s module docs)
//! with a warning giving the commands to look at them and release them (`ladle release`).
//! The journal is compacted into a snapshot now and then, and finished jobs' files are
//! pruned ([`Retention`], `compact`).
//!
//! ## Estimates, measurement, settling
//! A submission's estimate is declared, measured for its family, or a guess
//! ([`crate::estimate`]); admission reads the current one every round (a family measured
//! meanwhile, declarations checked against measured peaks). A running job is measured once
//! seen on its GPUs for the policy's `measure_s` with full windows: the peak is journaled
//! (`measured`), its family learns it, and a job placed alone until measured takes
//! neighbours. An out-of-memory exit is retried at the head with 1.1 × the peak the attempt
//! reached, alone until measured, at most `max_oom_retries` times; then it fails with a
//! reason naming what was seen. The settle lock after a dispatch ends once the job's process
//! is seen on its GPU plus [`SEEN_GRACE_S`] (at most the policy's `settle_s`).
//!
//! ## Layout
//! - [`state`] (`ladle-scheduler-core`'s): the jobs as a pure fold of journal records (no
//!   process, file or GPU);
//! - `server`: the socket (tokio on one thread: a connection cap, a deadline per request,
//!   peer uid) and the requests; `answers`: the answers that could grow, built to fit a
//!   frame;
//! - `recover`: settling the attempts a previous daemon left open;
//! - `launch`: starting attempts under the wrapper, reaping them, deciding what follows;
//! - `compact`: compaction of the journal, forgetting old finished jobs, pruning files;
//! - `hold`: held jobs (a damaged journal line) and `ladle release`;
//! - `telemetry`: sampling the GPUs, measuring jobs' peaks, the GPU state admission sees;
//! - `config`: [`DaemonConfig`], its choices and constants, [`socket_path`];
//! - `stop`: stopping with the jobs ([`DaemonConfig::stop_jobs`]);
//! - this module: the `Daemon` that owns all of it, start-up, and [`run`]'s loop.

mod answers;
mod compact;
mod config;
mod confine;
mod hold;
mod launch;
mod recover;
mod server;
mod stop;
mod telemetry;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::allocation::{AllocationError, GpuSelector};
use crate::job::JobId;
use crate::journal::{Journal, JournalError, Record};
use crate::mps::{Mps, MpsError};
use crate::policy::Admission;
use crate::protocol::FeedSpec;
use crate::sys;
use crate::telemetry::{
    GpuInfo, GpuWindows, NoteLevel, NvmlOptions, NvmlTelemetry, SimGpus, Telemetry, TelemetryError,
};
// The jobs as a pure fold of journal records: `ladle-scheduler-core`'s.
use ladle_scheduler_core::state;

pub use self::compact::Retention;
pub use self::config::{
    CANCEL_GRACE, DaemonConfig, GpuBackend, MpsMode, SIM_DEFAULT_SM, SIM_MARKER, socket_path,
};
pub use self::server::{ACCEPT_BACKOFF, HANDLER_THREADS, MAX_CONNECTIONS, REQUEST_TIMEOUT};
pub use self::telemetry::SEEN_GRACE_S;

use self::compact::Housekeeping;
use self::launch::{JobFiles, Live};
use self::state::Jobs;
use self::stop::stop_jobs;

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

/// Everything the daemon owns, behind one lock: the journal and the jobs folded from it,
/// the live attempts' processes, the GPUs, the admission engine and the feeds.
struct Daemon {
    journal: Journal,
    jobs: Jobs,
    /// What only this daemon knows of each open attempt (its child, output offsets,
    /// measurements); the journaled part is in `jobs`.
    live: BTreeMap<JobId, Live>,
    telemetry: Box<dyn Telemetry>,
    gpus: Vec<GpuInfo>,
    windows: Vec<GpuWindows>,
    /// GPUs whose latest sample failed: admission skips them until one succeeds (their
    /// windows' last sample is stale).
    stale: Vec<bool>,
    /// GPUs whose latest sample shows another user's MPS server: under this scheduler's MPS
    /// they take no job ([`crate::mps::check_no_other_user`] has NVIDIA's rule).
    others_mps: Vec<bool>,
    /// Most jobs each GPU's compute mode lets run at once (`Some(1)`: EXCLUSIVE_PROCESS
    /// without MPS).
    max_jobs: Vec<Option<usize>>,
    /// The GPUs are simulated (`--gpu sim`).
    simulated: bool,
    /// Why these GPUs ([`DaemonConfig::gpus_from`]).
    gpus_from: Option<String>,
    /// The GPUs each queued job may use, from its own environment ([`confine`]); `None`:
    /// any. Filled at submission and, for recovered jobs, before admission.
    confined: BTreeMap<JobId, Option<BTreeSet<usize>>>,
    locked_until: Vec<f64>,
    engine: Admission,
    /// Admission rounds run with jobs queued (`Queue`'s `admission_rounds`).
    admission_rounds: u64,
    /// Where each attempt's claim, status and log files are.
    files: JobFiles,
    default_estimate_mib: u64,
    max_oom_retries: u32,
    mps_env: Vec<(String, String)>,
    clock: Instant,
    /// CPU cores shared by feeds and jobs that state `cpus`.
    cpu_cores: u32,
    /// Host memory shared by feeds' rings, the decoded-sample cache and jobs that state
    /// `host_mem_mib`, MiB.
    host_mem_mib: u64,
    /// Registered producer feeds by name; not journaled (a feed re-registers when it
    /// starts, and lives as long as its process).
    feeds: BTreeMap<String, Feed>,
    /// Compaction and pruning.
    housekeeping: Housekeeping,
}

/// A registered feed and the start time of its process (so a reused pid is not taken for it).
struct Feed {
    spec: FeedSpec,
    started: u64,
}

struct Shared {
    state: Mutex<Daemon>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Daemon> {
        // A panic while holding the lock is a bug; the state is still the best we have.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Daemon {
    /// Seconds on the daemon's own clock (admission's time).
    fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// Journals `record` and, only if that worked, applies it: for decisions (a submit, a
    /// start, a cancel) that must not happen unjournaled.
    ///
    /// # Errors
    /// The journal's, for the request that asked (nothing was recorded).
    fn commit(&mut self, record: Record) -> Result<(), JournalError> {
        match self.journal.append(&record) {
            Ok(()) => {
                self.jobs.apply(record);
                Ok(())
            }
            Err(e) => {
                tracing::error!("{e}");
                Err(e)
            }
        }
    }

    /// Journals `record` and applies it even if the journal failed: for facts (a process
    /// started, measured or ended) that are true whether written or not.
    fn note(&mut self, record: Record) {
        if let Err(e) = self.journal.append(&record) {
            tracing::error!("{e}");
        }
        self.jobs.apply(record);
    }

    /// One round: sample (when due), reap, admit, compact (when due).
    fn tick(&mut self, sample: bool) {
        if sample {
            self.sample();
        }
        self.reap();
        self.admit();
        self.housekeeping();
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn open_telemetry(config: &DaemonConfig) -> Result<Box<dyn Telemetry>, TelemetryError> {
    let options = NvmlOptions {
        dcgm: config.dcgm.clone(),
        allocated: config.allocated.clone(),
    };
    let sim = |gpus: usize, memory_mib: u64| -> Result<Box<dyn Telemetry>, TelemetryError> {
        // A CUDA device number selects simulated GPU `i` of `gpus`.
        let beyond = (config.allocated.iter().flatten()).find_map(|s| match s {
            GpuSelector::CudaIndex { index, .. } if *index as usize >= gpus => Some(*index),
            _ => None,
        });
        if let Some(index) = beyond {
            return Err(AllocationError::NoCudaDevice { index, count: gpus }.into());
        }
        let mut sim = match &config.allocated {
            Some(allocated) => SimGpus::for_allocation(allocated, gpus, memory_mib),
            None => SimGpus::new(gpus, memory_mib),
        };
        if let Some(scenario) = &config.sim_scenario {
            sim.apply(scenario)?;
        }
        Ok(Box::new(sim))
    };
    match &config.gpu {
        GpuBackend::Nvml => Ok(Box::new(NvmlTelemetry::open_with(&options)?)),
        GpuBackend::Sim { gpus, memory_mib } => sim(*gpus, *memory_mib),
    }
}

/// Says, once at start, what each GPU's compute mode means for collocation under this
/// daemon's MPS, and where its compute screen's metrics come from.
fn report_gpus(gpus: &[GpuInfo], mps_running: bool) {
    for gpu in gpus {
        for why in &gpu.unsuitable {
            tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, "GPU takes no jobs: {why}");
        }
        let note = gpu.collocation(mps_running);
        match note.level {
            NoteLevel::Warning => tracing::warn!(gpu = gpu.index, "{}", note.note),
            NoteLevel::Info => tracing::info!(gpu = gpu.index, "{}", note.note),
        }
        if gpu.compute_source.is_degraded() {
            tracing::warn!(
                gpu = gpu.index,
                "compute screen degraded: {}",
                gpu.compute_source_note
                    .as_deref()
                    .unwrap_or("no GPM or DCGM; utilisation only, unknown occupancy and bandwidth count as high")
            );
        } else {
            tracing::info!(gpu = gpu.index, source = ?gpu.compute_source, "compute screen metrics");
        }
    }
}

/// How long a starting daemon retries the state directory's lock before it says another
/// daemon runs there: a process that forked in the moment the previous daemon let go holds
/// the lock's open file until it execs (the same process's other threads, in tests).
const LOCK_RETRY: Duration = Duration::from_secs(2);

/// Takes the state directory's lock, retrying for [`LOCK_RETRY`]; `Ok(None)` when another
/// daemon holds it all that time.
fn lock_state_dir(dir: &Path) -> std::io::Result<Option<std::fs::File>> {
    let deadline = Instant::now() + LOCK_RETRY;
    loop {
        match sys::lock_file(&dir.join("lock"))? {
            Some(lock) => return Ok(Some(lock)),
            None if Instant::now() >= deadline => return Ok(None),
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Runs the daemon until `stop` is set (SIGINT/SIGTERM in `ladle scheduler`). Running jobs
/// are left running when it stops, and the next daemon on the same directory adopts them,
/// unless [`DaemonConfig::stop_jobs`] says to stop them first (then it returns once they
/// are gone, or after the grace and a SIGKILL).
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
    let Some(_lock) = lock_state_dir(&dir).map_err(dir_err(&dir.join("lock")))? else {
        return Err(DaemonError::AlreadyRunning(dir.clone()));
    };
    std::fs::create_dir_all(dir.join("jobs")).map_err(dir_err(&dir.join("jobs")))?;
    if let Some(logs) = &config.log_dir {
        std::fs::create_dir_all(logs).map_err(dir_err(logs))?;
    }

    let mut telemetry = open_telemetry(&config)?;
    let gpus = telemetry.gpus().to_vec();
    let simulated = telemetry.simulated().is_some();
    // Under an allocation, an MPS control daemon started here sees only its GPUs.
    let allocated_uuids: Option<Vec<String>> = config
        .allocated
        .as_ref()
        .map(|_| gpus.iter().map(|g| g.uuid.clone()).collect());
    let allocated_uuids = allocated_uuids.as_deref();
    let mps = match (config.mps, simulated) {
        (MpsMode::Off, _) => None,
        (MpsMode::Auto, true) => None,
        (MpsMode::Auto, false) => match Mps::start_or_adopt(&dir, allocated_uuids) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!("{e}; running jobs without MPS");
                None
            }
        },
        (MpsMode::On, _) => Some(Mps::start_or_adopt(&dir, allocated_uuids)?),
    };

    report_gpus(&gpus, mps.is_some());
    let (journal, replay) = Journal::replay(&dir.join("journal.jsonl"))?;
    let dir_arg = hold::dir_arg(&dir);
    let (jobs, held) = Jobs::replay(config.policy.learned_estimates, replay.entries, &dir_arg);
    let mut state = Daemon {
        journal,
        jobs,
        live: BTreeMap::new(),
        windows: vec![GpuWindows::default(); gpus.len()],
        stale: vec![false; gpus.len()],
        others_mps: vec![false; gpus.len()],
        max_jobs: gpus
            .iter()
            .map(|g| g.collocation(mps.is_some()).max_jobs)
            .collect(),
        simulated,
        gpus_from: config.gpus_from.clone(),
        confined: BTreeMap::new(),
        locked_until: vec![f64::NEG_INFINITY; gpus.len()],
        gpus,
        telemetry,
        engine: Admission::new(config.policy.clone()),
        admission_rounds: 0,
        files: JobFiles::new(dir.clone(), config.log_dir.clone()),
        default_estimate_mib: config.default_estimate_mib,
        max_oom_retries: config.max_oom_retries,
        cpu_cores: config.cpu_cores,
        host_mem_mib: config.host_mem_mib,
        feeds: BTreeMap::new(),
        mps_env: mps.as_ref().map(Mps::env).unwrap_or_default(),
        clock: Instant::now(),
        housekeeping: Housekeeping::new(config.retention.clone()),
    };
    state.report_held(&held, &dir_arg);
    state.recover()?;
    state.start_housekeeping();

    let socket = socket_path(&dir);
    let listener = server::bind(&socket)?;
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        wake: Condvar::new(),
    });
    let mut server = server::Server::start(listener, shared.clone(), socket.clone())?;
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
    if let Some(grace) = config.stop_jobs {
        state = stop_jobs(&shared, state, grace);
    }
    let running = state.jobs.running().count();
    state.finish_pruning();
    drop(state);
    server.stop();
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
    if running == 0 {
        tracing::info!("scheduler stopped");
    } else {
        tracing::info!(
            running,
            "scheduler stopped; running jobs continue and are adopted on restart"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::process::Command;

    use super::*;
    use crate::estimate::Basis;
    use crate::job::{JobSpec, JobState};
    use crate::journal::Outcome;
    use crate::policy::Policy;
    use crate::protocol::{self, JobView, Request, Response};

    fn spec(script: &str) -> JobSpec {
        JobSpec {
            gpu_mem_mib: Some(1024),
            ..JobSpec::new(
                vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()],
                "/".into(),
            )
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

    fn starting(id: u64) -> Record {
        Record::Starting {
            id,
            attempt: 1,
            gpus: vec![0],
            limit_mib: None,
            estimate_mib: Some(1024),
            exclusive: false,
            until_measured: false,
        }
    }

    fn started(id: u64, pid: u32) -> Record {
        Record::Started {
            id,
            attempt: 1,
            pid,
            start_ticks: 1,
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
                basis: Basis::Declared,
                at: 0.0,
            },
            // 2: ran to completion while the daemon was down (status file 0).
            Record::Submitted {
                id: 2,
                spec: spec(&script(2)),
                estimate_mib: 1024,
                basis: Basis::Declared,
                at: 0.0,
            },
            // 3: vanished without a status (killed with the machine).
            Record::Submitted {
                id: 3,
                spec: spec(&script(3)),
                estimate_mib: 1024,
                basis: Basis::Declared,
                at: 0.0,
            },
            // 4: finished long ago.
            Record::Submitted {
                id: 4,
                spec: spec(&script(4)),
                estimate_mib: 1024,
                basis: Basis::Declared,
                at: 0.0,
            },
            // 5: still queued.
            Record::Submitted {
                id: 5,
                spec: spec(&script(5)),
                estimate_mib: 1024,
                basis: Basis::Declared,
                at: 0.0,
            },
            starting(4),
            started(4, dead),
            Record::Finished {
                id: 4,
                attempt: 1,
                outcome: Outcome::Succeeded,
                code: Some(0),
                peak_mib: None,
                reason: String::new(),
                cpu_s: None,
            },
            starting(2),
            started(2, dead),
            starting(3),
            started(3, dead),
            starting(1),
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
