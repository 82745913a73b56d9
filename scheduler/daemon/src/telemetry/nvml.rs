//! The NVML backend: a real NVIDIA GPU, through libnvidia-ml loaded at run time by
//! `nvml-wrapper` (`dlopen`, no link-time dependency). A machine without the driver gets
//! [`TelemetryError::NvmlUnavailable`], never a panic.
//!
//! Per sample it reads free/total memory, utilisation, and every process from both
//! `running_compute_processes` and `mps_running_compute_processes` (merged by pid; MPS
//! clients may show only through the second). SM activity, SM occupancy and DRAM bandwidth
//! come from GPM (GPU Performance Monitoring, Hopper and newer): two GPM samples a period
//! apart give the metrics over that period. A GPU without GPM gets them from DCGM's profiling
//! fields through a `dcgmi dmon` child ([`super::dcgm`]) when `dcgmi` works; otherwise the
//! three are `None`, and admission judges SM activity by utilisation and treats the unknown
//! occupancy and bandwidth as high (the conservative reading of CARMA's compute screen).
//! [`GpuInfo::compute_source`] says which, per GPU.
//!
//! A failed memory or utilisation query fails the sample; a failed process query leaves the
//! processes unknown ([`GpuSample::gpu_processes`] `None`) and a failed GPM or DCGM read
//! leaves the compute metrics unknown, each with a [`SampleGap`] ([`super`] has the rules).
//!
//! With an allocation ([`NvmlOptions::allocated`], [`crate::allocation`]) only the GPUs it
//! names are kept: by device file (`/dev/nvidiaN`, NVML's minor number, which Slurm's gres
//! indices name) or by UUID. The backend's GPUs are then `0..k` in NVML's order, each
//! [`GpuInfo::index`] still NVML's, and every query goes to that NVML index.
//!
//! ladle never changes compute mode, clocks, persistence or MIG; [`GpuInfo::unsuitable`]
//! and [`GpuInfo::compute_mode`] report what stands in the way instead.

use std::path::PathBuf;

use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{GpmSample, Nvml};

use super::dcgm::{DcgmConfig, DcgmMonitor};
use super::{
    ComputeMode, ComputeSource, GpuInfo, GpuSample, ProcessMemory, RawProcess, SampleGap,
    Telemetry, TelemetryError, collocation_note, merge_processes,
};
use crate::allocation::{AllocationError, GpuSelector, MachineGpu, PciGpu, machine_uuids};

/// Whether and how the NVML backend uses DCGM for GPUs without GPM.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DcgmMode {
    /// Run `dcgmi` from `PATH` when a GPU lacks GPM and `dcgmi` is there.
    #[default]
    Auto,
    /// Never: GPUs without GPM are utilisation-only.
    Off,
    /// Run this `dcgmi` when a GPU lacks GPM.
    Program(PathBuf),
}

/// Options of [`NvmlTelemetry::open_with`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NvmlOptions {
    /// DCGM for GPUs without GPM.
    pub dcgm: DcgmMode,
    /// Only these GPUs (a Slurm allocation, [`crate::allocation`]); `None`: every GPU NVML
    /// sees. An index selects by device file (NVML's minor number), a UUID by UUID.
    pub allocated: Option<Vec<GpuSelector>>,
}

/// Real GPUs through NVML.
pub struct NvmlTelemetry {
    /// NVML, leaked once per backend so the GPM samples (which borrow it) can live beside
    /// it; a daemon opens one backend for its whole life.
    nvml: &'static Nvml,
    infos: Vec<GpuInfo>,
    /// Every GPU NVML lists, used or not, in NVML's order: where a job's own
    /// `CUDA_VISIBLE_DEVICES` points ([`Telemetry::machine_uuids`]).
    machine: Vec<MachineGpu>,
    /// The previous GPM sample of each GPU; `None` where GPM is unsupported or not yet read.
    gpm_previous: Vec<Option<GpmSample<'static>>>,
    gpm_supported: Vec<bool>,
    /// `dcgmi dmon` for the GPUs whose [`GpuInfo::compute_source`] is DCGM.
    dcgm: Option<DcgmMonitor>,
}

impl std::fmt::Debug for NvmlTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlTelemetry")
            .field("gpus", &self.infos)
            .field("gpm_supported", &self.gpm_supported)
            .field("dcgm", &self.dcgm)
            .finish_non_exhaustive()
    }
}

const MIB: u64 = 1 << 20;

impl NvmlTelemetry {
    /// Loads NVML and lists the GPUs, with DCGM for GPUs without GPM when `dcgmi` is on
    /// `PATH` ([`DcgmMode::Auto`]).
    ///
    /// # Errors
    /// [`TelemetryError::NvmlUnavailable`] without a driver, [`TelemetryError::NoGpus`] when
    /// NVML sees no GPU, [`TelemetryError::Nvml`] when a GPU cannot be described.
    pub fn open() -> Result<Self, TelemetryError> {
        Self::open_with(&NvmlOptions::default())
    }

    /// [`NvmlTelemetry::open`] with options. A DCGM that cannot start is not an error: the
    /// GPUs without GPM are then utilisation-only, and [`GpuInfo::compute_source_note`]
    /// says why.
    ///
    /// With [`NvmlOptions::allocated`], every GPU is enumerated and only the selected ones
    /// are kept, in NVML's order: the backend's GPUs `0..k` are those, and each keeps NVML's
    /// index in [`GpuInfo::index`] (what `nvidia-smi` and DCGM call it). The other GPUs are
    /// not queried beyond their UUID and minor number.
    ///
    /// # Errors
    /// As [`NvmlTelemetry::open`], and [`TelemetryError::NotAllocated`] for a selector that
    /// matches no GPU (naming it and every GPU NVML sees).
    pub fn open_with(options: &NvmlOptions) -> Result<Self, TelemetryError> {
        let nvml = Nvml::init().map_err(|source| TelemetryError::NvmlUnavailable { source })?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml
            .device_count()
            .map_err(|source| TelemetryError::NvmlUnavailable { source })?;
        if count == 0 {
            return Err(TelemetryError::NoGpus);
        }
        let mut machine = Vec::new();
        for index in 0..count {
            let err = |call| nvml_error(index, call);
            let device = nvml
                .device_by_index(index)
                .map_err(err("device_by_index"))?;
            machine.push(MachineGpu {
                minor: device.minor_number().ok(),
                uuid: device.uuid().map_err(err("uuid"))?,
                pci: PciGpu {
                    bus_id: device.pci_info().map_err(err("pci_info"))?.bus_id,
                    name: device.name().unwrap_or_else(|_| "unknown".to_owned()),
                },
            });
        }
        let mut infos = Vec::new();
        let mut gpm_supported = Vec::new();
        let allocated = cuda_indices_to_uuids(&machine, options.allocated.as_deref())?;
        let mut matched = vec![false; allocated.as_ref().map_or(0, Vec::len)];
        for (index, gpu) in (0..count).zip(&machine) {
            let err = |call| nvml_error(index, call);
            let device = nvml
                .device_by_index(index)
                .map_err(err("device_by_index"))?;
            let uuid = gpu.uuid.clone();
            if let Some(allocated) = &allocated {
                let mut kept = false;
                for (selector, matched) in allocated.iter().zip(&mut matched) {
                    if selects(selector, gpu.minor, &uuid) {
                        *matched = true;
                        kept = true;
                    }
                }
                if !kept {
                    continue;
                }
            }
            let mut unsuitable = Vec::new();
            let compute_mode = match device.compute_mode() {
                Ok(mode) => Some(compute_mode_of(mode)),
                Err(e) => {
                    tracing::warn!(gpu = index, "NVML compute_mode failed: {e}");
                    None
                }
            };
            if let Some(mode @ (ComputeMode::Prohibited | ComputeMode::ExclusiveThread)) =
                compute_mode
            {
                // Unsuitable whether or not MPS runs.
                unsuitable.push(collocation_note(Some(mode), true).note);
            }
            if let Ok(mig) = device.mig_mode()
                && mig.current != 0
            {
                unsuitable.push(
                    "MIG is enabled: ladle schedules whole GPUs and does not place jobs in MIG instances (it never changes MIG)".to_owned(),
                );
            }
            let gpm = device.gpm_support().unwrap_or(false);
            gpm_supported.push(gpm);
            let mut info = GpuInfo::new(
                index,
                uuid,
                gpu.pci.name.clone(),
                device.memory_info().map_err(err("memory_info"))?.total / MIB,
            );
            info.unsuitable = unsuitable;
            info.compute_mode = compute_mode;
            info.compute_source = if gpm {
                ComputeSource::Gpm
            } else {
                ComputeSource::UtilizationOnly
            };
            infos.push(info);
        }
        if let Some(allocated) = &allocated
            && let Some((missing, _)) = allocated.iter().zip(&matched).find(|(_, m)| !**m)
        {
            let seen: Vec<String> = (machine.iter().zip(0..))
                .map(|(g, index)| {
                    let file = g.minor.map_or_else(
                        || format!("GPU {index} (minor number unknown)"),
                        |m| format!("/dev/nvidia{m}"),
                    );
                    format!("{file} {}", g.uuid)
                })
                .collect();
            return Err(TelemetryError::NotAllocated {
                gpu: missing.to_string(),
                seen: seen.join(", "),
            });
        }
        if infos.is_empty() {
            return Err(TelemetryError::NoGpus);
        }
        let dcgm = start_dcgm(&options.dcgm, &mut infos);
        Ok(Self {
            nvml,
            machine,
            gpm_previous: (0..infos.len()).map(|_| None).collect(),
            infos,
            gpm_supported,
            dcgm,
        })
    }

    /// SM activity, SM occupancy and DRAM bandwidth since the previous call, as fractions;
    /// `Err` names the GPM query that failed. The first call has no previous sample and
    /// gives `None`s without an error.
    fn gpm(&mut self, gpu: usize) -> Result<Metrics, SampleGap> {
        let gap = |call: &str, e: NvmlError| SampleGap {
            call: call.to_owned(),
            error: e.to_string(),
        };
        let device = self
            .nvml
            .device_by_index(self.infos[gpu].index)
            .map_err(|e| gap("device_by_index", e))?;
        let now = match device.gpm_sample() {
            Ok(now) => now,
            Err(e) => {
                // The next pair must not span the failure.
                self.gpm_previous[gpu] = None;
                return Err(gap("gpm_sample", e));
            }
        };
        let previous = self.gpm_previous[gpu].replace(now);
        let (Some(previous), Some(now)) = (previous, self.gpm_previous[gpu].as_ref()) else {
            return Ok(Metrics::default());
        };
        let ids = [
            GpmMetricId::SmUtil,
            GpmMetricId::SmOccupancy,
            GpmMetricId::DramBwUtil,
        ];
        let results = nvml_wrapper::gpm::gpm_metrics_get(self.nvml, &previous, now, &ids)
            .map_err(|e| gap("gpm_metrics_get", e))?;
        let value = |i: usize| {
            results
                .get(i)
                .and_then(|r| r.as_ref().ok())
                .map(|r| (r.value / 100.0).clamp(0.0, 1.0))
        };
        Ok(Metrics {
            sm_activity: value(0),
            sm_occupancy: value(1),
            dram_bandwidth: value(2),
        })
    }

    /// The compute metrics of GPU `gpu` from its source, and where they came from.
    fn compute_metrics(
        &mut self,
        gpu: usize,
        gaps: &mut Vec<SampleGap>,
    ) -> (Metrics, ComputeSource) {
        let from = |m: Metrics, source| {
            if m.sm_activity.is_some() && m.sm_occupancy.is_some() && m.dram_bandwidth.is_some() {
                (m, source)
            } else {
                (m, ComputeSource::UtilizationOnly)
            }
        };
        match self.infos[gpu].compute_source {
            ComputeSource::Gpm if self.gpm_supported[gpu] => match self.gpm(gpu) {
                Ok(m) => from(m, ComputeSource::Gpm),
                Err(gap) => {
                    gaps.push(gap);
                    (Metrics::default(), ComputeSource::UtilizationOnly)
                }
            },
            ComputeSource::Dcgm => {
                let index = self.infos[gpu].index;
                match self.dcgm.as_mut().map(|d| d.reading(index)) {
                    Some(Ok(r)) => from(
                        Metrics {
                            sm_activity: r.sm_activity,
                            sm_occupancy: r.sm_occupancy,
                            dram_bandwidth: r.dram_active,
                        },
                        ComputeSource::Dcgm,
                    ),
                    Some(Err(e)) => {
                        gaps.push(SampleGap {
                            call: "dcgm".to_owned(),
                            error: e.to_string(),
                        });
                        (Metrics::default(), ComputeSource::UtilizationOnly)
                    }
                    None => (Metrics::default(), ComputeSource::UtilizationOnly),
                }
            }
            _ => (Metrics::default(), ComputeSource::UtilizationOnly),
        }
    }
}

/// An NVML call `call` that failed on GPU `gpu`, as a [`TelemetryError::Nvml`].
fn nvml_error(gpu: u32, call: &'static str) -> impl FnOnce(NvmlError) -> TelemetryError {
    move |source| TelemetryError::Nvml { gpu, call, source }
}

/// Whether `selector` names the GPU with device file `/dev/nvidia{minor}` and `uuid` (CUDA
/// device numbers are UUIDs by now: [`cuda_indices_to_uuids`]).
fn selects(selector: &GpuSelector, minor: Option<u32>, uuid: &str) -> bool {
    match selector {
        GpuSelector::Index(i) => minor == Some(*i),
        GpuSelector::Uuid(u) => u == uuid,
        _ => false,
    }
}

/// `allocated` with each CUDA device number ([`GpuSelector::CudaIndex`]) replaced by the UUID
/// of the GPU CUDA gives that number ([`crate::allocation::cuda_order`] over every GPU's PCI
/// bus id and name).
fn cuda_indices_to_uuids(
    machine: &[MachineGpu],
    allocated: Option<&[GpuSelector]>,
) -> Result<Option<Vec<GpuSelector>>, AllocationError> {
    allocated
        .map(|allocated| {
            (allocated.iter())
                .map(|s| match s {
                    GpuSelector::CudaIndex { .. } => {
                        let uuid = machine_uuids(std::slice::from_ref(s), machine)?;
                        Ok(GpuSelector::Uuid(
                            uuid.into_iter().next().unwrap_or_default(),
                        ))
                    }
                    other => Ok(other.clone()),
                })
                .collect()
        })
        .transpose()
}

/// SM activity, SM occupancy and DRAM bandwidth of one sample.
#[derive(Debug, Clone, Copy, Default)]
struct Metrics {
    sm_activity: Option<f64>,
    sm_occupancy: Option<f64>,
    dram_bandwidth: Option<f64>,
}

fn compute_mode_of(mode: NvmlComputeMode) -> ComputeMode {
    match mode {
        NvmlComputeMode::Default => ComputeMode::Default,
        NvmlComputeMode::ExclusiveThread => ComputeMode::ExclusiveThread,
        NvmlComputeMode::Prohibited => ComputeMode::Prohibited,
        NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
    }
}

/// Starts DCGM for the GPUs in `infos` without GPM, as `mode` says, and marks them DCGM or
/// notes why they stay utilisation-only.
fn start_dcgm(mode: &DcgmMode, infos: &mut [GpuInfo]) -> Option<DcgmMonitor> {
    let without_gpm = infos
        .iter()
        .filter(|i| i.compute_source != ComputeSource::Gpm)
        .count();
    if without_gpm == 0 {
        return None;
    }
    let program = match mode {
        DcgmMode::Off => {
            note_degraded(infos, "no GPM, and DCGM is turned off");
            return None;
        }
        DcgmMode::Program(path) => path.clone(),
        DcgmMode::Auto => match crate::mps::which("dcgmi") {
            Some(path) => path,
            None => {
                note_degraded(
                    infos,
                    "no GPM, and no `dcgmi` on PATH (install DCGM for SM occupancy and DRAM activity)",
                );
                return None;
            }
        },
    };
    match DcgmMonitor::spawn(&DcgmConfig::new(program)) {
        Ok(mut monitor) => {
            let mut missing = Vec::new();
            for info in infos.iter_mut() {
                if info.compute_source == ComputeSource::Gpm {
                    continue;
                }
                // A GPU DCGM has no row for (yet) is still given to DCGM: a later row fills
                // it, and until then each sample notes the gap.
                if monitor.reading(info.index).is_err() {
                    missing.push(info.index);
                }
                info.compute_source = ComputeSource::Dcgm;
                info.compute_source_note = None;
            }
            if !missing.is_empty() {
                tracing::warn!(?missing, "DCGM has no reading yet for these GPUs");
            }
            Some(monitor)
        }
        Err(e) => {
            note_degraded(infos, &format!("no GPM, and DCGM failed: {e}"));
            None
        }
    }
}

fn note_degraded(infos: &mut [GpuInfo], why: &str) {
    for info in infos.iter_mut() {
        if info.compute_source == ComputeSource::UtilizationOnly {
            info.compute_source_note = Some(format!(
                "compute screen degraded: {why}; SM activity is judged by utilisation and the \
                 unknown SM occupancy and DRAM bandwidth count as high"
            ));
        }
    }
}

/// One NVML process list as [`RawProcess`]es.
fn raw(processes: Vec<ProcessInfo>) -> Vec<RawProcess> {
    processes
        .into_iter()
        .map(|p| RawProcess {
            pid: p.pid,
            used_mib: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes.div_ceil(MIB)),
                UsedGpuMemory::Unavailable => None,
            },
        })
        .collect()
}

/// A process's name from `/proc/<pid>/comm`, when this pid namespace shows it.
fn process_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end().to_owned())
}

impl Telemetry for NvmlTelemetry {
    fn gpus(&self) -> &[GpuInfo] {
        &self.infos
    }

    fn machine_uuids(&self, selectors: &[GpuSelector]) -> Result<Vec<String>, AllocationError> {
        machine_uuids(selectors, &self.machine)
    }

    fn sample(&mut self, gpu: usize) -> Result<GpuSample, TelemetryError> {
        if gpu >= self.infos.len() {
            return Err(TelemetryError::NoSuchGpu {
                gpu,
                count: self.infos.len(),
            });
        }
        // The backend's GPU `gpu` is NVML's GPU `index` (they differ under an allocation).
        let index = self.infos[gpu].index;
        let err = |call| nvml_error(index, call);
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(err("device_by_index"))?;
        let memory = device.memory_info().map_err(err("memory_info"))?;
        let utilization = device
            .utilization_rates()
            .map_err(err("utilization_rates"))?;
        let mut gaps = Vec::new();
        let compute = device.running_compute_processes().map(raw);
        let mps = match device.mps_running_compute_processes() {
            // A GPU or driver without the MPS query (pre-Volta) has no MPS clients to list.
            Err(NvmlError::NotSupported) => Ok(Vec::new()),
            other => other.map(raw),
        };
        let mut known = true;
        let mut lists = Vec::new();
        for (call, list) in [
            ("running_compute_processes", compute),
            ("mps_running_compute_processes", mps),
        ] {
            match list {
                Ok(list) => lists.push(list),
                Err(e) => {
                    known = false;
                    lists.push(Vec::new());
                    gaps.push(SampleGap {
                        call: call.to_owned(),
                        error: e.to_string(),
                    });
                }
            }
        }
        let mut merged = merge_processes(&lists[0], &lists[1]);
        let me = crate::sys::my_uid();
        for p in &mut merged {
            p.name = process_name(p.pid);
            p.other_user = crate::sys::owner(p.pid).is_some_and(|uid| uid != me);
        }
        let processes = merged
            .iter()
            .map(|p| ProcessMemory {
                pid: p.pid,
                used_mib: p.used_mib.unwrap_or(0),
            })
            .collect();
        let (metrics, compute_source) = self.compute_metrics(gpu, &mut gaps);
        Ok(GpuSample {
            memory_used_mib: memory.total.saturating_sub(memory.free) / MIB,
            memory_total_mib: self.infos[gpu].memory_total_mib,
            utilization: f64::from(utilization.gpu.min(100)) / 100.0,
            sm_activity: metrics.sm_activity,
            sm_occupancy: metrics.sm_occupancy,
            dram_bandwidth: metrics.dram_bandwidth,
            processes,
            gpu_processes: known.then_some(merged),
            compute_source,
            gaps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_selects_by_device_file_and_a_uuid_by_uuid() {
        let index = GpuSelector::Index(2);
        assert!(selects(&index, Some(2), "GPU-a"));
        assert!(!selects(&index, Some(0), "GPU-a"));
        // A GPU whose minor number NVML cannot give is never taken for an index.
        assert!(!selects(&index, None, "GPU-a"));
        let uuid = GpuSelector::Uuid("GPU-a".to_owned());
        assert!(selects(&uuid, None, "GPU-a"));
        assert!(!selects(&uuid, Some(2), "GPU-b"));
    }
}
