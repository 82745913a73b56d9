//! The NVML backend: a real NVIDIA GPU, through libnvidia-ml loaded at run time by
//! `nvml-wrapper` (`dlopen`, no link-time dependency). A machine without the driver gets
//! [`TelemetryError::NvmlUnavailable`], never a panic.
//!
//! Per sample it reads free/total memory, utilisation and every compute process's memory.
//! SM activity, SM occupancy and DRAM bandwidth come from GPM (GPU Performance Monitoring,
//! Hopper and newer): two GPM samples a period apart give the metrics over that period. On
//! GPUs without GPM those three are `None`, and admission judges SM activity by
//! utilisation and treats the unknown occupancy and bandwidth as high (the conservative
//! reading of CARMA's compute screen).
//!
//! ladle never changes compute mode, clocks, persistence or MIG; [`GpuInfo::unsuitable`]
//! reports what stands in the way instead.

use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::{GpmSample, Nvml};

use super::{GpuInfo, GpuSample, ProcessMemory, Telemetry, TelemetryError};

/// Real GPUs through NVML.
pub struct NvmlTelemetry {
    /// NVML, leaked once per backend so the GPM samples (which borrow it) can live beside
    /// it; a daemon opens one backend for its whole life.
    nvml: &'static Nvml,
    infos: Vec<GpuInfo>,
    /// The previous GPM sample of each GPU; `None` where GPM is unsupported or not yet read.
    gpm_previous: Vec<Option<GpmSample<'static>>>,
    gpm_supported: Vec<bool>,
}

impl std::fmt::Debug for NvmlTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlTelemetry")
            .field("gpus", &self.infos)
            .field("gpm_supported", &self.gpm_supported)
            .finish_non_exhaustive()
    }
}

const MIB: u64 = 1 << 20;

impl NvmlTelemetry {
    /// Loads NVML and lists the GPUs.
    ///
    /// # Errors
    /// [`TelemetryError::NvmlUnavailable`] without a driver, [`TelemetryError::NoGpus`] when
    /// NVML sees no GPU, [`TelemetryError::Nvml`] when a GPU cannot be described.
    pub fn open() -> Result<Self, TelemetryError> {
        let nvml = Nvml::init().map_err(|source| TelemetryError::NvmlUnavailable { source })?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml
            .device_count()
            .map_err(|source| TelemetryError::NvmlUnavailable { source })?;
        if count == 0 {
            return Err(TelemetryError::NoGpus);
        }
        let mut infos = Vec::new();
        let mut gpm_supported = Vec::new();
        for index in 0..count {
            let err = |call| {
                move |source| TelemetryError::Nvml {
                    gpu: index,
                    call,
                    source,
                }
            };
            let device = nvml
                .device_by_index(index)
                .map_err(err("device_by_index"))?;
            let mut unsuitable = Vec::new();
            match device.compute_mode() {
                Ok(ComputeMode::Prohibited) => unsuitable.push(
                    "compute mode is Prohibited: no process may create a context (ladle does not change it; `nvidia-smi -c DEFAULT` or `EXCLUSIVE_PROCESS` does)".to_owned(),
                ),
                Ok(ComputeMode::ExclusiveThread) => unsuitable
                    .push("compute mode is Exclusive_Thread, which MPS cannot share".to_owned()),
                Ok(_) | Err(_) => {}
            }
            if let Ok(mig) = device.mig_mode()
                && mig.current != 0
            {
                unsuitable.push(
                    "MIG is enabled: ladle schedules whole GPUs and does not place jobs in MIG instances (it never changes MIG)".to_owned(),
                );
            }
            gpm_supported.push(device.gpm_support().unwrap_or(false));
            infos.push(GpuInfo {
                index,
                uuid: device.uuid().map_err(err("uuid"))?,
                name: device.name().unwrap_or_else(|_| "unknown".to_owned()),
                memory_total_mib: device.memory_info().map_err(err("memory_info"))?.total / MIB,
                unsuitable,
            });
        }
        Ok(Self {
            nvml,
            gpm_previous: (0..infos.len()).map(|_| None).collect(),
            infos,
            gpm_supported,
        })
    }

    /// SM activity, SM occupancy and DRAM bandwidth since the previous call, as fractions.
    fn gpm(&mut self, gpu: usize) -> (Option<f64>, Option<f64>, Option<f64>) {
        if !self.gpm_supported[gpu] {
            return (None, None, None);
        }
        let Ok(device) = self.nvml.device_by_index(gpu as u32) else {
            return (None, None, None);
        };
        let Ok(now) = device.gpm_sample() else {
            return (None, None, None);
        };
        let previous = self.gpm_previous[gpu].replace(now);
        let (Some(previous), Some(now)) = (previous, self.gpm_previous[gpu].as_ref()) else {
            return (None, None, None);
        };
        let ids = [
            GpmMetricId::SmUtil,
            GpmMetricId::SmOccupancy,
            GpmMetricId::DramBwUtil,
        ];
        let Ok(results) = nvml_wrapper::gpm::gpm_metrics_get(self.nvml, &previous, now, &ids)
        else {
            return (None, None, None);
        };
        let value = |i: usize| {
            results
                .get(i)
                .and_then(|r| r.as_ref().ok())
                .map(|r| (r.value / 100.0).clamp(0.0, 1.0))
        };
        (value(0), value(1), value(2))
    }
}

impl Telemetry for NvmlTelemetry {
    fn gpus(&self) -> &[GpuInfo] {
        &self.infos
    }

    fn sample(&mut self, gpu: usize) -> Result<GpuSample, TelemetryError> {
        if gpu >= self.infos.len() {
            return Err(TelemetryError::NoSuchGpu {
                gpu,
                count: self.infos.len(),
            });
        }
        let index = gpu as u32;
        let err = |call| {
            move |source| TelemetryError::Nvml {
                gpu: index,
                call,
                source,
            }
        };
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(err("device_by_index"))?;
        let memory = device.memory_info().map_err(err("memory_info"))?;
        let utilization = device
            .utilization_rates()
            .map_err(err("utilization_rates"))?;
        let processes = device
            .running_compute_processes()
            .map_err(err("running_compute_processes"))?
            .into_iter()
            .map(|p| ProcessMemory {
                pid: p.pid,
                used_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => bytes.div_ceil(MIB),
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect();
        let (sm_activity, sm_occupancy, dram_bandwidth) = self.gpm(gpu);
        Ok(GpuSample {
            memory_used_mib: memory.total.saturating_sub(memory.free) / MIB,
            memory_total_mib: self.infos[gpu].memory_total_mib,
            utilization: f64::from(utilization.gpu.min(100)) / 100.0,
            sm_activity,
            sm_occupancy,
            dram_bandwidth,
            processes,
        })
    }
}
