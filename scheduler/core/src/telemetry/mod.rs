//! GPU telemetry behind one trait, two backends: NVML (a real GPU, through libnvidia-ml
//! loaded at run time: `ladle_scheduler::telemetry::nvml`, in the daemon's crate, which
//! loads libraries and starts processes) and [`sim`] (simulated GPUs for tests, the daemon's
//! `--gpu sim` mode and the trace simulator), plus DCGM (`ladle_scheduler::telemetry::dcgm`),
//! the DCGM profiling metrics a GPU without GPM gets from a `dcgmi dmon` child process.
//!
//! The scheduler samples every GPU at 1 Hz and keeps the last 30 samples of each metric in a
//! [`GpuWindows`]; admission reads the windows' risk scores, never a single sample.
//!
//! ## Trusting the GPU (CARMA's rule)
//! - Processes: a sample lists every process NVML reports, from both
//!   `nvmlDeviceGetComputeRunningProcesses` and `nvmlDeviceGetMPSComputeRunningProcesses`
//!   (MPS clients may show only through the second), merged by pid
//!   ([`GpuSample::gpu_processes`]). [`GpuSample::foreign`] gives the processes (and memory)
//!   that are not the caller's jobs: other users on the same GPU.
//! - Failures are explicit: a failed memory or utilisation query fails the whole sample
//!   ([`TelemetryError`], never zeros); a failed process query leaves
//!   [`GpuSample::gpu_processes`] `None` ("unknown", not "no processes") and a
//!   [`SampleGap`] in [`GpuSample::gaps`]; a failed GPM or DCGM read leaves the three
//!   compute metrics `None` (counted as high by admission) with
//!   [`GpuSample::compute_source`] `UtilizationOnly` and a gap.
//! - Compute mode: [`GpuInfo::compute_mode`], and [`GpuInfo::collocation`] says, given
//!   whether MPS runs, whether jobs can share the GPU (ladle never changes the mode).
//! - Compute screen source: [`GpuInfo::compute_source`] is GPM (Hopper and newer), DCGM
//!   profiling fields 1002/1003/1005 (A100, L40 and other GPUs without GPM, when `dcgmi`
//!   and its host engine work), or `UtilizationOnly`: the screen is then degraded, judging
//!   SM activity by utilisation and counting occupancy and DRAM bandwidth as high.
//!
//! ## Checks that still need a real GPU
//! None of these paths has run on a GPU yet; the simulated backend and a fake `dcgmi` cover
//! their logic only.
//! - `mps_running_compute_processes` under a running MPS server: which processes each NVML
//!   call lists (clients, the `nvidia-cuda-mps-server` itself), and whether `used_gpu_memory`
//!   is reported per client or as unavailable (then counted as unknown, not 0).
//! - The merge: a client in both lists appears once, with its memory, and the sum of the
//!   processes' memory is close to NVML's used memory.
//! - Compute mode read on a GPU set to `EXCLUSIVE_PROCESS` and `PROHIBITED` by an
//!   administrator (`nvidia-smi -c`), and a second job failing without MPS under
//!   `EXCLUSIVE_PROCESS` as [`collocation_note`] predicts.
//! - DCGM on an A100 or L40: `dcgmi dmon -e 1002,1003,1005 -d 1000` output matches the parser
//!   (header, `GPU <id>` rows, `N/A`), DCGM's GPU ids equal NVML's indices, values track load,
//!   and killing `nv-hostengine` degrades the GPU's samples instead of stalling them.
//! - GPM on an H100: the three metrics after the second sample; a failed `gpm_sample` shows
//!   as a gap.
//! - `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` keyed by UUID on a machine with two or more GPUs,
//!   a job on the second GPU (where an ordinal would be ambiguous), and whether `M` means
//!   MiB or MB (allocate up to the limit and read where it fails).
//! - An allocation (`NvmlOptions::allocated`) on a machine with several GPUs: an index
//!   keeps the GPU of that `/dev/nvidiaN` (minor number, not NVML's index), the kept GPUs are
//!   sampled by their NVML index, and an MPS control daemon started with their UUIDs in
//!   `CUDA_VISIBLE_DEVICES` serves clients that name them by UUID. The unit tests cover the
//!   matching and the environment only; `scheduler/daemon/tests/daemon_slurm.rs` checks the UUID
//!   and device-file selection where a driver is present.
//! - OOM markers from real TensorFlow and JAX jobs under an MPS limit (the verbatim texts in
//!   the tests come from their issue trackers, not from runs on this machine).

pub mod sim;

use serde::{Deserialize, Serialize};

use crate::window::Window;

pub use ladle_scheduler_protocol::gpu::{
    CollocationNote, ComputeMode, ComputeSource, GpuInfo, NoteLevel, collocation_note,
};

pub use self::sim::{SimCall, SimGpuScenario, SimGpus, SimLoad, SimProcess, SimScenario};

/// One GPU process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    /// The process id (in the host's pid namespace).
    pub pid: u32,
    /// Device memory it holds, in MiB.
    pub used_mib: u64,
}

/// One process NVML reports on a GPU, from either process call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// The process id (in the host's pid namespace).
    pub pid: u32,
    /// Device memory it holds, MiB; `None` when NVML does not say (it may report the value
    /// as unavailable, as under WDDM, and possibly for MPS clients): unknown, not 0.
    pub used_mib: Option<u64>,
    /// Listed by `nvmlDeviceGetComputeRunningProcesses`.
    pub compute: bool,
    /// Listed by `nvmlDeviceGetMPSComputeRunningProcesses` (an MPS client).
    pub mps: bool,
    /// The process's name (`/proc/<pid>/comm`, at most 15 characters), when it can be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// It belongs to another user than the scheduler's (the owner of `/proc/<pid>`); false
    /// when that cannot be read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub other_user: bool,
}

impl GpuProcess {
    /// Whether this is an MPS server (`nvidia-cuda-mps-server`, whose `comm` is cut to
    /// `nvidia-cuda-mps`): infrastructure, not a user's job.
    pub fn is_mps_server(&self) -> bool {
        self.name
            .as_deref()
            .is_some_and(|n| n.starts_with("nvidia-cuda-mps"))
    }

    /// Whether this is another user's MPS server: its GPU is theirs under MPS until their
    /// clients are gone, and a second user's MPS cannot share it (`ladle_scheduler::mps`).
    pub fn is_other_users_mps_server(&self) -> bool {
        self.other_user && self.is_mps_server()
    }
}

/// One process as one NVML call lists it, before the two calls are merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawProcess {
    /// Process id.
    pub pid: u32,
    /// Device memory, MiB; `None` when unavailable.
    pub used_mib: Option<u64>,
}

/// Merges the compute and MPS process lists by pid: a process in both appears once, marked
/// as both, with the larger of the memories known. Sorted by pid.
pub fn merge_processes(compute: &[RawProcess], mps: &[RawProcess]) -> Vec<GpuProcess> {
    let mut by_pid: std::collections::BTreeMap<u32, GpuProcess> = std::collections::BTreeMap::new();
    for (list, is_mps) in [(compute, false), (mps, true)] {
        for p in list {
            let entry = by_pid.entry(p.pid).or_insert_with(|| GpuProcess {
                pid: p.pid,
                used_mib: None,
                compute: false,
                mps: false,
                name: None,
                other_user: false,
            });
            entry.used_mib = match (entry.used_mib, p.used_mib) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            if is_mps {
                entry.mps = true;
            } else {
                entry.compute = true;
            }
        }
    }
    by_pid.into_values().collect()
}

/// A part of a sample that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleGap {
    /// The query that failed (`running_compute_processes`, `mps_running_compute_processes`,
    /// `gpm_sample`, `dcgm`, …).
    pub call: String,
    /// Why, in words.
    pub error: String,
}

/// The processes on a GPU that are not the caller's ([`GpuSample::foreign`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ForeignUse {
    /// The processes, MPS servers left out.
    pub processes: Vec<GpuProcess>,
    /// Their device memory whose amount NVML reports, MiB.
    pub memory_mib: u64,
    /// How many of them hold memory NVML does not report.
    pub memory_unknown: usize,
}

/// One reading of one GPU. Fractions are 0 – 1.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuSample {
    /// Device memory in use, MiB.
    pub memory_used_mib: u64,
    /// Total device memory, MiB.
    pub memory_total_mib: u64,
    /// NVML utilisation: the fraction of the last period in which any kernel ran.
    pub utilization: f64,
    /// SM activity (fraction of time an SM had a warp resident), when the GPU exposes it
    /// (GPM, Hopper and newer); `None` elsewhere.
    pub sm_activity: Option<f64>,
    /// SM occupancy (resident warps over the maximum), GPM only.
    pub sm_occupancy: Option<f64>,
    /// DRAM bandwidth utilisation, GPM only.
    pub dram_bandwidth: Option<f64>,
    /// Memory of every process [`GpuSample::gpu_processes`] lists (both NVML calls), an
    /// unreported amount as 0; when a process call failed, the processes that were read (so
    /// it may be incomplete: [`GpuSample::gpu_processes`] is `None` then).
    pub processes: Vec<ProcessMemory>,
    /// Every process on the GPU, from NVML's compute and MPS process calls merged by pid;
    /// `None` when either call failed: the processes are unknown, which is not "none".
    #[serde(default)]
    pub gpu_processes: Option<Vec<GpuProcess>>,
    /// Where this sample's SM activity, occupancy and DRAM bandwidth came from:
    /// `UtilizationOnly` when they are `None`, including a GPM or DCGM read that failed.
    #[serde(default)]
    pub compute_source: ComputeSource,
    /// The queries of this sample that failed; empty when it is complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<SampleGap>,
}

impl GpuSample {
    /// Free device memory, MiB.
    pub fn memory_free_mib(&self) -> u64 {
        self.memory_total_mib.saturating_sub(self.memory_used_mib)
    }

    /// Whether the GPU's processes are known (both process calls succeeded).
    pub fn processes_known(&self) -> bool {
        self.gpu_processes.is_some()
    }

    /// Whether every query of this sample succeeded.
    pub fn is_complete(&self) -> bool {
        self.gaps.is_empty()
    }

    /// The processes that are not the caller's, by `is_ours(pid)` (the daemon: the pid's
    /// process group is one of its jobs'), MPS servers left out; `None` when the processes
    /// are unknown, which a caller must not read as "no other users".
    pub fn foreign(&self, is_ours: impl Fn(u32) -> bool) -> Option<ForeignUse> {
        let processes = self.gpu_processes.as_ref()?;
        let mut foreign = ForeignUse::default();
        for p in processes {
            if is_ours(p.pid) || (p.is_mps_server() && !p.other_user) {
                continue;
            }
            match p.used_mib {
                Some(mib) => foreign.memory_mib = foreign.memory_mib.saturating_add(mib),
                None => foreign.memory_unknown += 1,
            }
            foreign.processes.push(p.clone());
        }
        Some(foreign)
    }
}

/// A telemetry read that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// NVML could not be loaded or initialised: no NVIDIA driver, no GPU, or a driver this
    /// library cannot use. This is what a machine without a GPU gets. NVML's own words are
    /// the error's source (`{:#}` with anyhow prints them after this).
    #[error(
        "NVML is not available (no NVIDIA driver or GPU?); to try ladle without a GPU, \
         schedule simulated GPUs with `--gpu sim` (jobs then run on this machine's CPU)"
    )]
    NvmlUnavailable {
        /// NVML's error.
        #[source]
        source: ::nvml_wrapper::error::NvmlError,
    },
    /// An NVML call on one GPU failed.
    #[error("NVML {call} failed on GPU {gpu}: {source}")]
    Nvml {
        /// GPU index.
        gpu: u32,
        /// The NVML query.
        call: &'static str,
        /// NVML's error.
        #[source]
        source: ::nvml_wrapper::error::NvmlError,
    },
    /// A simulated query failed, as the simulated backend was told to ([`SimGpus::fail`]).
    #[error("simulated {call} failed on GPU {gpu}")]
    Simulated {
        /// GPU index.
        gpu: u32,
        /// The simulated query.
        call: &'static str,
    },
    /// The machine has no GPU the backend can see.
    #[error(
        "NVML found no GPU on this machine; to try ladle without a GPU, schedule simulated \
         GPUs with `--gpu sim`"
    )]
    NoGpus,
    /// A GPU of the allocation ([`crate::allocation`]) is not among those NVML sees.
    #[error(
        "the allocated GPU {gpu} is not on this machine; NVML sees {seen} (an index is the \
         device file's number, /dev/nvidiaN)"
    )]
    NotAllocated {
        /// The selector that matched nothing (`/dev/nvidiaN` or a UUID).
        gpu: String,
        /// Every GPU NVML sees: its device file and UUID.
        seen: String,
    },
    /// The GPUs a numeric `CUDA_VISIBLE_DEVICES` names cannot be told apart or are not there
    /// ([`crate::allocation::cuda_order`]).
    #[error(transparent)]
    Allocation(#[from] crate::allocation::AllocationError),
    /// A GPU index beyond the backend's GPUs.
    #[error("no GPU {gpu} (there are {count})")]
    NoSuchGpu {
        /// The index asked for.
        gpu: usize,
        /// GPUs there are.
        count: usize,
    },
}

/// A source of GPU readings.
pub trait Telemetry: Send {
    /// The GPUs, indexed 0..n in the order the scheduler uses.
    fn gpus(&self) -> &[GpuInfo];

    /// Reads GPU `gpu` now.
    fn sample(&mut self, gpu: usize) -> Result<GpuSample, TelemetryError>;

    /// The UUIDs of the machine's GPUs that `selectors` name, whether or not they are among
    /// [`Telemetry::gpus`]: where a job's own `CUDA_VISIBLE_DEVICES` points.
    ///
    /// # Errors
    /// [`crate::allocation::AllocationError`] for a GPU the machine lacks.
    fn machine_uuids(
        &self,
        selectors: &[crate::allocation::GpuSelector],
    ) -> Result<Vec<String>, crate::allocation::AllocationError>;

    /// The simulated GPUs behind this backend, if it is the simulated one: the daemon's
    /// `--gpu sim` mode tells them what each job holds.
    fn simulated(&mut self) -> Option<&mut SimGpus> {
        None
    }
}

/// The 30-sample windows of one GPU's metrics.
#[derive(Debug, Clone, Default)]
pub struct GpuWindows {
    /// NVML utilisation.
    pub utilization: Window,
    /// SM activity (falls back to utilisation when the GPU has no GPM).
    pub sm_activity: Window,
    /// SM occupancy, GPM only.
    pub sm_occupancy: Window,
    /// DRAM bandwidth, GPM only.
    pub dram_bandwidth: Window,
    /// The latest sample.
    pub last: Option<GpuSample>,
}

impl GpuWindows {
    /// Adds one sample to every window. A sample without SM occupancy or DRAM bandwidth
    /// (no GPM or DCGM, or their read failed) empties that window, so its risk is unknown
    /// (counted as high by admission) instead of resting on readings from before the source
    /// failed.
    pub fn push(&mut self, sample: GpuSample) {
        self.utilization.push(sample.utilization);
        self.sm_activity
            .push(sample.sm_activity.unwrap_or(sample.utilization));
        match sample.sm_occupancy {
            Some(x) => self.sm_occupancy.push(x),
            None => self.sm_occupancy = Window::default(),
        }
        match sample.dram_bandwidth {
            Some(x) => self.dram_bandwidth.push(x),
            None => self.dram_bandwidth = Window::default(),
        }
        self.last = Some(sample);
    }

    /// The risk scores admission reads.
    pub fn risk(&self) -> Risk {
        Risk {
            utilization: self.utilization.risk().unwrap_or(0.0),
            sm_activity: self.sm_activity.risk().unwrap_or(0.0),
            sm_occupancy: self.sm_occupancy.risk(),
            dram_bandwidth: self.dram_bandwidth.risk(),
        }
    }
}

/// Risk scores of one GPU's windows (see [`crate::window`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Risk {
    /// Utilisation risk.
    pub utilization: f64,
    /// SM activity risk (utilisation's where the GPU has no GPM).
    pub sm_activity: f64,
    /// SM occupancy risk; `None` without GPM.
    pub sm_occupancy: Option<f64>,
    /// DRAM bandwidth risk; `None` without GPM.
    pub dram_bandwidth: Option<f64>,
}

#[cfg(test)]
mod tests;
