//! The daemon's configuration: [`DaemonConfig`] and the choices it holds ([`GpuBackend`],
//! [`MpsMode`]), the sim-mode constants ([`SIM_MARKER`], [`SIM_DEFAULT_SM`]),
//! [`CANCEL_GRACE`], and where the socket lives ([`socket_path`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::allocation::GpuSelector;
use crate::policy::Policy;
use crate::telemetry::{DcgmMode, SimScenario};

use super::Retention;

/// Which GPUs the daemon schedules.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum GpuBackend {
    /// NVML if it loads, else an error that names `--gpu sim`: a machine without a driver
    /// never falls back to simulated GPUs on its own (its jobs would train on the CPU while
    /// the scheduler showed GPUs).
    Nvml,
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
    /// State directory: socket, journal, claim and status files, job logs (unless
    /// [`DaemonConfig::log_dir`]), MPS pipes. Node-local.
    pub dir: PathBuf,
    /// Where jobs' stdout and stderr go, as `LOG_DIR/ID/ATTEMPT.out` / `.err` (created as
    /// needed); `None`: `DIR/jobs/ID/`. `Logs` answers these paths.
    pub log_dir: Option<PathBuf>,
    /// Only these GPUs of the node ([`crate::allocation`]); `None`: every GPU (or
    /// `GpuBackend`'s simulated count). With simulated GPUs, one per allocated GPU. The
    /// daemon never reads the environment for this: its caller decides, e.g. with
    /// [`crate::allocation::allocation_from_env`].
    pub allocated: Option<Vec<GpuSelector>>,
    /// Where [`DaemonConfig::allocated`] came from, as `ladle queue` and `top` say it
    /// (`CUDA_VISIBLE_DEVICES=2,3`, `--only-gpus 0`); `None` with every GPU.
    pub gpus_from: Option<String>,
    /// On stop, take the running jobs down: SIGTERM to their process groups, this long to
    /// end, then SIGKILL (see the module docs). `None`: they keep running and the next daemon
    /// on the directory adopts them.
    pub stop_jobs: Option<Duration>,
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
    /// Host memory the admission shares between live feeds' rings, the decoded-sample
    /// cache's budget and jobs that state `host_mem_mib`, MiB (default: 90% of this
    /// machine's memory, or of its cgroup's limit).
    pub host_mem_mib: u64,
    /// What simulated GPUs show beside the daemon's jobs (other users' processes, failing
    /// queries, a compute mode): the real-GPU paths, testable without a GPU.
    pub sim_scenario: Option<SimScenario>,
    /// DCGM for NVML GPUs without GPM.
    pub dcgm: DcgmMode,
    /// How many finished jobs (and their files) are kept, and when the journal is
    /// compacted.
    pub retention: Retention,
}

impl DaemonConfig {
    /// Defaults: policy `ladle`, GPUs through NVML (an error without a driver), MPS `auto`, 4 GiB default estimate, 3 retries, 1 s tick; logs in the state directory,
    /// every GPU, jobs left running on stop, [`Retention::default`].
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            log_dir: None,
            allocated: None,
            gpus_from: None,
            stop_jobs: None,
            policy: Policy::ladle(),
            gpu: GpuBackend::Nvml,
            mps: MpsMode::Auto,
            default_estimate_mib: 4 * 1024,
            max_oom_retries: 3,
            tick: Duration::from_secs(1),
            cpu_cores: std::thread::available_parallelism()
                .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
            host_mem_mib: ladle_os::mem::total().map_or(u64::MAX, |b| (b / 10 * 9) >> 20),
            sim_scenario: None,
            dcgm: DcgmMode::Auto,
            retention: Retention::default(),
        }
    }
}

/// The daemon's socket inside a state directory.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("scheduler.sock")
}
