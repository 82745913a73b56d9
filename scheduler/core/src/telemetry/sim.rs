//! Simulated GPUs: memory and SM demand are whatever the jobs placed on them say.
//!
//! The model, shared by the daemon's `--gpu sim` mode and the trace simulator:
//! - memory used = Σ of the jobs' memory (it may exceed the total: that is how the simulator
//!   sees an out-of-memory crash coming; a sample reports at most the total);
//! - SM activity = min(1, Σ of the jobs' SM demand); utilisation equals SM activity;
//! - SM occupancy = min(1, [`OCCUPANCY_PER_ACTIVITY`] · Σ demand) and DRAM bandwidth =
//!   min(1, [`DRAM_PER_ACTIVITY`] · Σ demand): a typical training job keeps about half its
//!   SMs' warp slots and a little under half of DRAM bandwidth busy while active, so CARMA's
//!   compute screen (`smact ≥ 0.80 ∧ (smocc ≥ 0.45 ∨ dram ≥ 0.40)`) trips once the summed
//!   demand reaches about 0.89.
//!
//! Beyond the jobs placed on them, simulated GPUs can hold what a real machine shows and the
//! daemon must cope with (all settable from a JSON [`SimScenario`], for `--gpu sim`):
//! - foreign processes ([`SimGpus::add_foreign`]): other users' jobs, whose memory and SM
//!   demand count like a job's, and which may be visible only through NVML's MPS process
//!   call ([`SimProcess::mps_only`]) or hold memory NVML does not report;
//! - a compute mode ([`SimGpus::set_compute_mode`]; `Prohibited` makes the GPU unsuitable);
//! - a compute source ([`SimGpus::set_compute_source`]): `UtilizationOnly` is a GPU without
//!   GPM or DCGM, whose samples carry no SM occupancy or DRAM bandwidth;
//! - failing queries ([`SimGpus::fail`]): a failing memory or utilisation query fails the
//!   sample, a failing process query leaves the processes unknown, a failing compute-metrics
//!   query leaves the metrics unknown, each with a [`SampleGap`] as the NVML backend gives.
//!
//! Placed jobs show through the compute process call with their key as pid.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::allocation::{AllocationError, GpuSelector};

use super::{
    ComputeMode, ComputeSource, GpuInfo, GpuSample, ProcessMemory, RawProcess, SampleGap,
    Telemetry, TelemetryError, collocation_note, merge_processes,
};

/// SM occupancy per unit of SM demand.
pub const OCCUPANCY_PER_ACTIVITY: f64 = 0.5;
/// DRAM bandwidth utilisation per unit of SM demand.
pub const DRAM_PER_ACTIVITY: f64 = 0.45;

/// What one job puts on a simulated GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimLoad {
    /// Device memory the job holds, MiB.
    pub mem_mib: u64,
    /// SM demand when running alone, 0 – 1.
    pub sm: f64,
}

/// A process on a simulated GPU that is not one of the daemon's jobs (another user's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimProcess {
    /// Its pid.
    pub pid: u32,
    /// Device memory it holds, MiB (counted in the GPU's used memory either way).
    pub mem_mib: u64,
    /// Its SM demand, 0 – 1.
    #[serde(default)]
    pub sm: f64,
    /// Visible only through NVML's MPS process call (an MPS client).
    #[serde(default)]
    pub mps_only: bool,
    /// NVML does not report its memory (the process lists it as unavailable).
    #[serde(default)]
    pub memory_unreported: bool,
    /// It is another user's MPS server (`nvidia-cuda-mps-server`, owned by another uid).
    #[serde(default)]
    pub other_users_mps_server: bool,
}

/// A query of a simulated GPU that can be made to fail ([`SimGpus::fail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimCall {
    /// NVML `memory_info`: the sample fails.
    MemoryInfo,
    /// NVML `utilization_rates`: the sample fails.
    Utilization,
    /// NVML `running_compute_processes`: the processes are unknown.
    ComputeProcesses,
    /// NVML `mps_running_compute_processes`: the processes are unknown.
    MpsProcesses,
    /// GPM or DCGM: the compute metrics are unknown.
    ComputeMetrics,
}

impl SimCall {
    /// The name of the real query it stands for.
    pub fn name(self) -> &'static str {
        match self {
            Self::MemoryInfo => "memory_info",
            Self::Utilization => "utilization_rates",
            Self::ComputeProcesses => "running_compute_processes",
            Self::MpsProcesses => "mps_running_compute_processes",
            Self::ComputeMetrics => "compute_metrics",
        }
    }
}

/// What to set on one simulated GPU ([`SimScenario`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGpuScenario {
    /// The GPU's index.
    pub gpu: usize,
    /// Its compute mode.
    #[serde(default)]
    pub compute_mode: Option<ComputeMode>,
    /// Its compute source (`utilization_only` for a GPU without GPM or DCGM).
    #[serde(default)]
    pub compute_source: Option<ComputeSource>,
    /// Other users' processes.
    #[serde(default)]
    pub foreign: Vec<SimProcess>,
    /// Queries that fail on every sample.
    #[serde(default)]
    pub failing: Vec<SimCall>,
}

/// Settings for simulated GPUs, as JSON for the daemon's `--gpu sim` mode, e.g.
/// `{"gpus": [{"gpu": 0, "compute_mode": "exclusive_process", "compute_source":
/// "utilization_only", "foreign": [{"pid": 4242, "mem_mib": 8000, "mps_only": true}],
/// "failing": ["mps_processes"]}]}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimScenario {
    /// Per-GPU settings.
    #[serde(default)]
    pub gpus: Vec<SimGpuScenario>,
}

impl SimScenario {
    /// Parses a scenario from JSON.
    ///
    /// # Errors
    /// The JSON error (unknown fields are errors, so a typo does not go unnoticed).
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}

/// How often a simulated query fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failing {
    Always,
    Times(u32),
}

/// A set of simulated GPUs.
#[derive(Debug, Clone)]
pub struct SimGpus {
    infos: Vec<GpuInfo>,
    /// GPUs the simulated machine has (more than `infos` under an allocation): CUDA device
    /// numbers past it name no GPU.
    machine: usize,
    loads: Vec<BTreeMap<u64, SimLoad>>,
    foreign: Vec<Vec<SimProcess>>,
    failing: Vec<BTreeMap<SimCall, Failing>>,
}

impl SimGpus {
    /// `count` GPUs of `memory_mib` each, named `sim-gpu-N` with stable fake UUIDs.
    pub fn new(count: usize, memory_mib: u64) -> Self {
        let infos = (0..count)
            .map(|i| {
                let mut info = GpuInfo::new(
                    i as u32,
                    format!("GPU-00000000-0000-4000-8000-{i:012x}"),
                    format!("sim-gpu-{i}"),
                    memory_mib,
                );
                info.compute_mode = Some(ComputeMode::Default);
                info.compute_source = ComputeSource::Gpm;
                info
            })
            .collect();
        Self {
            infos,
            machine: count,
            loads: vec![BTreeMap::new(); count],
            foreign: vec![Vec::new(); count],
            failing: vec![BTreeMap::new(); count],
        }
    }

    /// One simulated GPU of `memory_mib` for each GPU of an allocation
    /// ([`crate::allocation`]) on a simulated machine of `machine_gpus`, in its order,
    /// numbered `0..k`; each UUID says that it is simulated and which allocated GPU it stands
    /// for (`GPU-simulated-dev-nvidia2`, `GPU-simulated-GPU-…`), so no job can take it for a
    /// real one; a CUDA device number `i` (a numeric `CUDA_VISIBLE_DEVICES`) stands for
    /// simulated GPU `i` of [`SimGpus::new`], with its UUID ([`SimGpus::uuid_of`]).
    pub fn for_allocation(allocated: &[GpuSelector], machine_gpus: usize, memory_mib: u64) -> Self {
        let mut sim = Self::new(allocated.len(), memory_mib);
        sim.machine = machine_gpus.max(allocated.len());
        for (info, selector) in sim.infos.iter_mut().zip(allocated) {
            info.uuid = Self::uuid_of(selector);
            info.name = format!("sim-gpu-{} (for {selector})", info.index);
        }
        sim
    }

    /// The UUID of the simulated GPU `selector` names: device file `i` is
    /// `GPU-simulated-dev-nvidia{i}`, a UUID `u` is `GPU-simulated-{u}`, CUDA device `i` is
    /// [`SimGpus::new`]'s GPU `i`.
    pub fn uuid_of(selector: &GpuSelector) -> String {
        match selector {
            GpuSelector::Index(i) => format!("GPU-simulated-dev-nvidia{i}"),
            GpuSelector::Uuid(uuid) if uuid.starts_with("GPU-simulated-") => uuid.clone(),
            GpuSelector::Uuid(uuid) => format!("GPU-simulated-{uuid}"),
            GpuSelector::CudaIndex { index, .. } => {
                format!("GPU-00000000-0000-4000-8000-{index:012x}")
            }
        }
    }

    /// Applies `scenario`.
    ///
    /// # Errors
    /// [`TelemetryError::NoSuchGpu`] for a GPU beyond these (nothing is applied then).
    pub fn apply(&mut self, scenario: &SimScenario) -> Result<(), TelemetryError> {
        if let Some(bad) = scenario.gpus.iter().find(|g| g.gpu >= self.infos.len()) {
            return Err(TelemetryError::NoSuchGpu {
                gpu: bad.gpu,
                count: self.infos.len(),
            });
        }
        for g in &scenario.gpus {
            if let Some(mode) = g.compute_mode {
                self.set_compute_mode(g.gpu, mode);
            }
            if let Some(source) = g.compute_source {
                self.set_compute_source(g.gpu, source);
            }
            for p in &g.foreign {
                self.add_foreign(g.gpu, p.clone());
            }
            for &call in &g.failing {
                self.fail(g.gpu, call, None);
            }
        }
        Ok(())
    }

    /// Puts another user's process on GPU `gpu` (replacing one with the same pid); an
    /// unknown GPU is ignored.
    pub fn add_foreign(&mut self, gpu: usize, process: SimProcess) {
        if let Some(list) = self.foreign.get_mut(gpu) {
            list.retain(|p| p.pid != process.pid);
            list.push(process);
        }
    }

    /// Takes the foreign process `pid` off every GPU.
    pub fn remove_foreign(&mut self, pid: u32) {
        for list in &mut self.foreign {
            list.retain(|p| p.pid != pid);
        }
    }

    /// Sets GPU `gpu`'s compute mode, and whether it is unsuitable for it (`Prohibited`,
    /// `ExclusiveThread`), as the NVML backend reports them.
    pub fn set_compute_mode(&mut self, gpu: usize, mode: ComputeMode) {
        if let Some(info) = self.infos.get_mut(gpu) {
            info.compute_mode = Some(mode);
            let note = collocation_note(Some(mode), true);
            info.unsuitable.retain(|u| !u.starts_with("compute mode"));
            if note.max_jobs == Some(0) {
                info.unsuitable.push(note.note);
            }
        }
    }

    /// Sets where GPU `gpu`'s compute metrics come from; `UtilizationOnly` drops them from
    /// its samples, as a GPU without GPM or DCGM.
    pub fn set_compute_source(&mut self, gpu: usize, source: ComputeSource) {
        if let Some(info) = self.infos.get_mut(gpu) {
            info.compute_source = source;
            info.compute_source_note = source
                .is_degraded()
                .then(|| "compute screen degraded: simulated GPU without GPM or DCGM".to_owned());
        }
    }

    /// Makes `call` fail on GPU `gpu`: `times` samples, or every sample until
    /// [`SimGpus::clear_failures`] with `None`.
    pub fn fail(&mut self, gpu: usize, call: SimCall, times: Option<u32>) {
        if let Some(failing) = self.failing.get_mut(gpu) {
            let how = times.map_or(Failing::Always, Failing::Times);
            if how != Failing::Times(0) {
                failing.insert(call, how);
            }
        }
    }

    /// Makes every query of GPU `gpu` succeed again.
    pub fn clear_failures(&mut self, gpu: usize) {
        if let Some(failing) = self.failing.get_mut(gpu) {
            failing.clear();
        }
    }

    /// Whether `call` fails on this sample of GPU `gpu` (counting down a limited failure).
    fn fails(&mut self, gpu: usize, call: SimCall) -> bool {
        let Some(failing) = self.failing.get_mut(gpu) else {
            return false;
        };
        match failing.get(&call).copied() {
            None => false,
            Some(Failing::Always) => true,
            Some(Failing::Times(n)) => {
                if n <= 1 {
                    failing.remove(&call);
                } else {
                    failing.insert(call, Failing::Times(n - 1));
                }
                true
            }
        }
    }

    /// Puts (or replaces) job `key`'s load on GPU `gpu`; an unknown GPU is ignored.
    pub fn place(&mut self, gpu: usize, key: u64, load: SimLoad) {
        if let Some(loads) = self.loads.get_mut(gpu) {
            loads.insert(key, load);
        }
    }

    /// Takes job `key` off every GPU.
    pub fn remove(&mut self, key: u64) {
        for loads in &mut self.loads {
            loads.remove(&key);
        }
    }

    /// Summed SM demand on GPU `gpu`, jobs' and foreign processes' (may exceed 1).
    pub fn demand(&self, gpu: usize) -> f64 {
        let jobs: f64 = self
            .loads
            .get(gpu)
            .map_or(0.0, |l| l.values().map(|x| x.sm).sum());
        let foreign: f64 = self
            .foreign
            .get(gpu)
            .map_or(0.0, |l| l.iter().map(|p| p.sm).sum());
        jobs + foreign
    }

    /// Summed memory on GPU `gpu`, jobs' and foreign processes', MiB (may exceed the total;
    /// saturates at `u64::MAX`).
    pub fn memory_mib(&self, gpu: usize) -> u64 {
        let jobs = self.loads.get(gpu).map_or(0, |l| {
            l.values()
                .fold(0u64, |sum, x| sum.saturating_add(x.mem_mib))
        });
        self.foreign.get(gpu).map_or(jobs, |l| {
            l.iter().fold(jobs, |sum, p| sum.saturating_add(p.mem_mib))
        })
    }

    /// Jobs placed on GPU `gpu` (foreign processes not counted).
    pub fn jobs(&self, gpu: usize) -> usize {
        self.loads.get(gpu).map_or(0, BTreeMap::len)
    }
}

impl Telemetry for SimGpus {
    fn gpus(&self) -> &[GpuInfo] {
        &self.infos
    }

    /// A simulated GPU's own UUID names it; otherwise as [`SimGpus::uuid_of`], with CUDA
    /// device numbers counted on the simulated machine.
    fn machine_uuids(&self, selectors: &[GpuSelector]) -> Result<Vec<String>, AllocationError> {
        (selectors.iter())
            .map(|s| match s {
                GpuSelector::CudaIndex { index, .. } if *index as usize >= self.machine => {
                    Err(AllocationError::NoCudaDevice {
                        index: *index,
                        count: self.machine,
                    })
                }
                GpuSelector::Uuid(uuid) if self.infos.iter().any(|g| &g.uuid == uuid) => {
                    Ok(uuid.clone())
                }
                _ => Ok(Self::uuid_of(s)),
            })
            .collect()
    }

    fn sample(&mut self, gpu: usize) -> Result<GpuSample, TelemetryError> {
        let count = self.infos.len();
        let info = self
            .infos
            .get(gpu)
            .ok_or(TelemetryError::NoSuchGpu { gpu, count })?;
        let (index, total, source) = (info.index, info.memory_total_mib, info.compute_source);
        for call in [SimCall::MemoryInfo, SimCall::Utilization] {
            if self.fails(gpu, call) {
                return Err(TelemetryError::Simulated {
                    gpu: index,
                    call: call.name(),
                });
            }
        }
        let demand = self.demand(gpu);
        let smact = demand.min(1.0);
        let mut gaps = Vec::new();
        let mut gap = |call: SimCall| {
            gaps.push(SampleGap {
                call: call.name().to_owned(),
                error: "simulated failure".to_owned(),
            });
        };
        let foreign = &self.foreign[gpu];
        let raw = |p: &SimProcess| RawProcess {
            pid: p.pid,
            used_mib: (!p.memory_unreported).then_some(p.mem_mib),
        };
        let mut compute: Vec<RawProcess> = self.loads[gpu]
            .iter()
            .map(|(&key, load)| RawProcess {
                pid: key as u32,
                used_mib: Some(load.mem_mib),
            })
            .collect();
        compute.extend(foreign.iter().filter(|p| !p.mps_only).map(raw));
        let mps: Vec<RawProcess> = foreign.iter().filter(|p| p.mps_only).map(raw).collect();
        let others_mps: Vec<u32> = (foreign.iter())
            .filter(|p| p.other_users_mps_server)
            .map(|p| p.pid)
            .collect();
        let compute_fails = self.fails(gpu, SimCall::ComputeProcesses);
        let mps_fails = self.fails(gpu, SimCall::MpsProcesses);
        if compute_fails {
            gap(SimCall::ComputeProcesses);
            compute.clear();
        }
        let mps = if mps_fails {
            gap(SimCall::MpsProcesses);
            Vec::new()
        } else {
            mps
        };
        let mut merged = merge_processes(&compute, &mps);
        for p in &mut merged {
            if others_mps.contains(&p.pid) {
                p.name = Some("nvidia-cuda-mps".to_owned());
                p.other_user = true;
            }
        }
        let metrics_fail = self.fails(gpu, SimCall::ComputeMetrics);
        let (metrics, compute_source) = if source.is_degraded() {
            (None, ComputeSource::UtilizationOnly)
        } else if metrics_fail {
            gap(SimCall::ComputeMetrics);
            (None, ComputeSource::UtilizationOnly)
        } else {
            (
                Some((
                    smact,
                    (OCCUPANCY_PER_ACTIVITY * demand).min(1.0),
                    (DRAM_PER_ACTIVITY * demand).min(1.0),
                )),
                source,
            )
        };
        Ok(GpuSample {
            memory_used_mib: self.memory_mib(gpu).min(total),
            memory_total_mib: total,
            utilization: smact,
            sm_activity: metrics.map(|m| m.0),
            sm_occupancy: metrics.map(|m| m.1),
            dram_bandwidth: metrics.map(|m| m.2),
            processes: merged
                .iter()
                .map(|p| ProcessMemory {
                    pid: p.pid,
                    used_mib: p.used_mib.unwrap_or(0),
                })
                .collect(),
            gpu_processes: (!compute_fails && !mps_fails).then_some(merged),
            compute_source,
            gaps,
        })
    }

    fn simulated(&mut self) -> Option<&mut SimGpus> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_add_up_and_saturate_at_one() {
        let mut sim = SimGpus::new(1, 1000);
        sim.place(
            0,
            1,
            SimLoad {
                mem_mib: 600,
                sm: 0.7,
            },
        );
        sim.place(
            0,
            2,
            SimLoad {
                mem_mib: 600,
                sm: 0.7,
            },
        );
        let s = sim.sample(0).unwrap();
        assert_eq!(s.memory_used_mib, 1000);
        assert_eq!(sim.memory_mib(0), 1200);
        assert_eq!(s.sm_activity, Some(1.0));
        assert!((sim.demand(0) - 1.4).abs() < 1e-12);
        sim.remove(1);
        assert_eq!(sim.jobs(0), 1);
        assert_eq!(sim.sample(0).unwrap().memory_used_mib, 600);
    }

    fn foreign(pid: u32, mem_mib: u64) -> SimProcess {
        SimProcess {
            pid,
            mem_mib,
            sm: 0.2,
            mps_only: false,
            memory_unreported: false,
            other_users_mps_server: false,
        }
    }

    #[test]
    fn foreign_processes_use_memory_and_show_as_other_users() {
        let mut sim = SimGpus::new(1, 40_000);
        sim.place(
            0,
            100,
            SimLoad {
                mem_mib: 5000,
                sm: 0.3,
            },
        );
        sim.add_foreign(0, foreign(4242, 8000));
        let s = sim.sample(0).unwrap();
        assert_eq!(s.memory_used_mib, 13_000);
        assert!((sim.demand(0) - 0.5).abs() < 1e-12);
        assert_eq!(sim.jobs(0), 1, "foreign processes are not jobs");
        let other = s.foreign(|pid| pid == 100).unwrap();
        assert_eq!(other.processes.len(), 1);
        assert_eq!(other.processes[0].pid, 4242);
        assert_eq!(other.memory_mib, 8000);
        sim.remove_foreign(4242);
        assert_eq!(sim.sample(0).unwrap().memory_used_mib, 5000);
    }

    #[test]
    fn an_mps_only_client_shows_through_the_mps_list_alone() {
        let mut sim = SimGpus::new(1, 40_000);
        sim.add_foreign(
            0,
            SimProcess {
                mps_only: true,
                memory_unreported: true,
                ..foreign(77, 3000)
            },
        );
        let s = sim.sample(0).unwrap();
        let processes = s.gpu_processes.unwrap();
        assert_eq!(processes.len(), 1);
        assert!(processes[0].mps && !processes[0].compute);
        assert_eq!(
            processes[0].used_mib, None,
            "unreported memory is unknown, not 0"
        );
        assert_eq!(
            s.memory_used_mib, 3000,
            "the GPU's used memory still counts it"
        );
    }

    #[test]
    fn a_failing_process_query_makes_the_processes_unknown_not_empty() {
        let mut sim = SimGpus::new(1, 40_000);
        sim.add_foreign(0, foreign(4242, 8000));
        sim.fail(0, SimCall::MpsProcesses, Some(1));
        let s = sim.sample(0).unwrap();
        assert!(!s.processes_known());
        assert_eq!(s.foreign(|_| false), None);
        assert_eq!(s.gaps.len(), 1);
        assert_eq!(s.gaps[0].call, "mps_running_compute_processes");
        assert_eq!(s.memory_used_mib, 8000, "memory is still read");
        let next = sim.sample(0).unwrap();
        assert!(next.processes_known(), "a one-time failure passes");
        assert!(next.is_complete());
    }

    #[test]
    fn a_failing_memory_query_fails_the_sample_instead_of_reading_zero() {
        let mut sim = SimGpus::new(1, 40_000);
        sim.add_foreign(0, foreign(4242, 8000));
        sim.fail(0, SimCall::MemoryInfo, None);
        for _ in 0..3 {
            assert!(matches!(
                sim.sample(0),
                Err(TelemetryError::Simulated {
                    call: "memory_info",
                    ..
                })
            ));
        }
        sim.clear_failures(0);
        assert_eq!(sim.sample(0).unwrap().memory_used_mib, 8000);
    }

    #[test]
    fn a_failing_compute_metrics_read_degrades_only_that_sample() {
        let mut sim = SimGpus::new(1, 40_000);
        sim.place(
            0,
            1,
            SimLoad {
                mem_mib: 1,
                sm: 0.9,
            },
        );
        sim.fail(0, SimCall::ComputeMetrics, Some(1));
        let s = sim.sample(0).unwrap();
        assert_eq!(s.compute_source, ComputeSource::UtilizationOnly);
        assert_eq!(s.sm_occupancy, None);
        assert_eq!(s.gaps[0].call, "compute_metrics");
        assert!((s.utilization - 0.9).abs() < 1e-12);
        assert_eq!(sim.sample(0).unwrap().compute_source, ComputeSource::Gpm);
    }

    #[test]
    fn a_gpu_without_gpm_or_dcgm_gives_utilisation_only() {
        let mut sim = SimGpus::new(1, 40_000);
        sim.set_compute_source(0, ComputeSource::UtilizationOnly);
        sim.place(
            0,
            1,
            SimLoad {
                mem_mib: 1,
                sm: 0.6,
            },
        );
        assert!(sim.gpus()[0].compute_source.is_degraded());
        assert!(sim.gpus()[0].compute_source_note.is_some());
        let s = sim.sample(0).unwrap();
        assert_eq!(
            (s.sm_activity, s.sm_occupancy, s.dram_bandwidth),
            (None, None, None)
        );
        assert!(
            s.is_complete(),
            "a GPU without the metrics is not a failed read"
        );
        let mut windows = crate::telemetry::GpuWindows::default();
        windows.push(s);
        let risk = windows.risk();
        assert!((risk.sm_activity - 0.6).abs() < 1e-12);
        assert_eq!(risk.sm_occupancy, None);
    }

    #[test]
    fn compute_modes_are_reported_and_prohibited_is_unsuitable() {
        let mut sim = SimGpus::new(2, 40_000);
        sim.set_compute_mode(0, ComputeMode::Prohibited);
        sim.set_compute_mode(1, ComputeMode::ExclusiveProcess);
        let gpus = sim.gpus();
        assert_eq!(gpus[0].compute_mode, Some(ComputeMode::Prohibited));
        assert_eq!(gpus[0].unsuitable.len(), 1);
        assert!(gpus[1].unsuitable.is_empty());
        assert!(!gpus[1].collocation(false).collocation);
        assert!(gpus[1].collocation(true).collocation);
        sim.set_compute_mode(0, ComputeMode::Default);
        assert!(sim.gpus()[0].unsuitable.is_empty());
    }

    #[test]
    fn a_scenario_is_read_from_json_and_checked() {
        let json = r#"{"gpus": [{"gpu": 0, "compute_mode": "exclusive_process",
            "compute_source": "utilization_only",
            "foreign": [{"pid": 4242, "mem_mib": 8000, "mps_only": true}],
            "failing": ["compute_processes"]}]}"#;
        let scenario = SimScenario::from_json(json).unwrap();
        let mut sim = SimGpus::new(2, 40_000);
        sim.apply(&scenario).unwrap();
        assert_eq!(
            sim.gpus()[0].compute_mode,
            Some(ComputeMode::ExclusiveProcess)
        );
        let s = sim.sample(0).unwrap();
        assert!(!s.processes_known());
        assert_eq!(s.memory_used_mib, 8000);
        assert!(SimScenario::from_json(r#"{"gpus": [{"gpu": 0, "fail": []}]}"#).is_err());
        let too_far = SimScenario::from_json(r#"{"gpus": [{"gpu": 5}]}"#).unwrap();
        assert!(matches!(
            sim.apply(&too_far),
            Err(TelemetryError::NoSuchGpu { gpu: 5, count: 2 })
        ));
    }

    #[test]
    fn summed_memory_saturates_instead_of_overflowing() {
        let mut sim = SimGpus::new(1, 1000);
        for key in 1..=2 {
            let load = SimLoad {
                mem_mib: u64::MAX,
                sm: 0.1,
            };
            sim.place(0, key, load);
        }
        assert_eq!(sim.memory_mib(0), u64::MAX);
        assert_eq!(sim.sample(0).unwrap().memory_used_mib, 1000);
    }

    #[test]
    fn an_allocation_is_simulated_as_one_gpu_each_with_uuids_that_say_so() {
        let allocated = [
            GpuSelector::Index(2),
            GpuSelector::Uuid("GPU-8932f937".to_owned()),
        ];
        let sim = SimGpus::for_allocation(&allocated, 8, 1000);
        let gpus = sim.gpus();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].index, 0);
        assert_eq!(gpus[0].uuid, "GPU-simulated-dev-nvidia2");
        assert_eq!(gpus[1].uuid, "GPU-simulated-GPU-8932f937");
        assert!(gpus.iter().all(|g| g.memory_total_mib == 1000));
    }
}
