//! GPU telemetry behind one trait, two backends: [`nvml`] (a real GPU, through
//! libnvidia-ml loaded at run time) and [`sim`] (simulated GPUs for tests, the daemon's
//! `--gpu sim` mode and the trace simulator).
//!
//! The scheduler samples every GPU at 1 Hz and keeps the last 30 samples of each metric in a
//! [`GpuWindows`]; admission reads the windows' risk scores, never a single sample.

pub mod nvml;
pub mod sim;

use serde::{Deserialize, Serialize};

use crate::window::Window;

pub use self::nvml::NvmlTelemetry;
pub use self::sim::{SimGpus, SimLoad};

/// What the scheduler knows about one GPU that does not change while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index as NVML (and `nvidia-smi`) number it.
    pub index: u32,
    /// `GPU-…` UUID, what a job gets in `CUDA_VISIBLE_DEVICES`.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Total device memory in MiB.
    pub memory_total_mib: u64,
    /// Why this GPU cannot take jobs (compute mode Prohibited, MIG enabled); empty when it
    /// can. ladle reports these and never changes the GPU's settings.
    pub unsuitable: Vec<String>,
}

/// One GPU process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    /// The process id (in the host's pid namespace).
    pub pid: u32,
    /// Device memory it holds, in MiB.
    pub used_mib: u64,
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
    /// Memory of every compute process on the GPU.
    pub processes: Vec<ProcessMemory>,
}

impl GpuSample {
    /// Free device memory, MiB.
    pub fn memory_free_mib(&self) -> u64 {
        self.memory_total_mib.saturating_sub(self.memory_used_mib)
    }
}

/// A telemetry read that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// NVML could not be loaded or initialised: no NVIDIA driver, no GPU, or a driver this
    /// library cannot use. This is what a machine without a GPU gets.
    #[error("NVML is not available (no NVIDIA driver or GPU?): {source}")]
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
    /// The machine has no GPU the backend can see.
    #[error("no GPUs found")]
    NoGpus,
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
    /// Adds one sample to every window.
    pub fn push(&mut self, sample: GpuSample) {
        self.utilization.push(sample.utilization);
        self.sm_activity
            .push(sample.sm_activity.unwrap_or(sample.utilization));
        if let Some(x) = sample.sm_occupancy {
            self.sm_occupancy.push(x);
        }
        if let Some(x) = sample.dram_bandwidth {
            self.dram_bandwidth.push(x);
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
mod tests {
    use super::*;

    /// Behaviour every backend shows, written once (STYLE 18).
    fn conforms(backend: &mut dyn Telemetry) {
        let gpus = backend.gpus().to_vec();
        assert!(!gpus.is_empty());
        let mut uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
        uuids.sort_unstable();
        uuids.dedup();
        assert_eq!(uuids.len(), gpus.len(), "UUIDs are unique");
        for (i, info) in gpus.iter().enumerate() {
            assert!(info.uuid.starts_with("GPU-"), "{}", info.uuid);
            let s = backend.sample(i).unwrap();
            assert_eq!(s.memory_total_mib, info.memory_total_mib);
            assert!(s.memory_used_mib <= s.memory_total_mib);
            assert!((0.0..=1.0).contains(&s.utilization));
            for x in [s.sm_activity, s.sm_occupancy, s.dram_bandwidth]
                .into_iter()
                .flatten()
            {
                assert!((0.0..=1.0).contains(&x));
            }
            let mut windows = GpuWindows::default();
            for _ in 0..3 {
                windows.push(backend.sample(i).unwrap());
            }
            assert_eq!(windows.sm_activity.len(), 3);
        }
        assert!(matches!(
            backend.sample(gpus.len()),
            Err(TelemetryError::NoSuchGpu { .. })
        ));
    }

    #[test]
    fn the_simulated_backend_conforms() {
        let mut sim = SimGpus::new(2, 40 * 1024);
        sim.place(
            0,
            1,
            SimLoad {
                mem_mib: 1000,
                sm: 0.3,
            },
        );
        conforms(&mut sim);
    }

    #[test]
    fn the_nvml_backend_conforms_or_reports_a_typed_error_without_a_gpu() {
        match NvmlTelemetry::open() {
            Ok(mut nvml) => conforms(&mut nvml),
            Err(e) => assert!(
                matches!(
                    e,
                    TelemetryError::NvmlUnavailable { .. } | TelemetryError::NoGpus
                ),
                "{e}"
            ),
        }
    }

    #[test]
    fn gpus_without_gpm_judge_sm_activity_by_utilisation() {
        let mut w = GpuWindows::default();
        w.push(GpuSample {
            utilization: 0.7,
            ..GpuSample::default()
        });
        let risk = w.risk();
        assert!((risk.sm_activity - 0.7).abs() < 1e-12);
        assert_eq!(risk.sm_occupancy, None);
    }
}
