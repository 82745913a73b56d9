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

use std::collections::BTreeMap;

use super::{GpuInfo, GpuSample, ProcessMemory, Telemetry, TelemetryError};

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

/// A set of simulated GPUs.
#[derive(Debug, Clone)]
pub struct SimGpus {
    infos: Vec<GpuInfo>,
    loads: Vec<BTreeMap<u64, SimLoad>>,
}

impl SimGpus {
    /// `count` GPUs of `memory_mib` each, named `sim-gpu-N` with stable fake UUIDs.
    pub fn new(count: usize, memory_mib: u64) -> Self {
        let infos = (0..count)
            .map(|i| GpuInfo {
                index: i as u32,
                uuid: format!("GPU-00000000-0000-4000-8000-{i:012x}"),
                name: format!("sim-gpu-{i}"),
                memory_total_mib: memory_mib,
                unsuitable: Vec::new(),
            })
            .collect();
        Self {
            infos,
            loads: vec![BTreeMap::new(); count],
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

    /// Summed SM demand on GPU `gpu` (may exceed 1).
    pub fn demand(&self, gpu: usize) -> f64 {
        self.loads
            .get(gpu)
            .map_or(0.0, |l| l.values().map(|x| x.sm).sum())
    }

    /// Summed memory on GPU `gpu`, MiB (may exceed the total; saturates at `u64::MAX`).
    pub fn memory_mib(&self, gpu: usize) -> u64 {
        self.loads.get(gpu).map_or(0, |l| {
            l.values()
                .fold(0u64, |sum, x| sum.saturating_add(x.mem_mib))
        })
    }

    /// Jobs on GPU `gpu`.
    pub fn jobs(&self, gpu: usize) -> usize {
        self.loads.get(gpu).map_or(0, BTreeMap::len)
    }
}

impl Telemetry for SimGpus {
    fn gpus(&self) -> &[GpuInfo] {
        &self.infos
    }

    fn sample(&mut self, gpu: usize) -> Result<GpuSample, TelemetryError> {
        let info = self.infos.get(gpu).ok_or(TelemetryError::NoSuchGpu {
            gpu,
            count: self.infos.len(),
        })?;
        let demand = self.demand(gpu);
        let smact = demand.min(1.0);
        Ok(GpuSample {
            memory_used_mib: self.memory_mib(gpu).min(info.memory_total_mib),
            memory_total_mib: info.memory_total_mib,
            utilization: smact,
            sm_activity: Some(smact),
            sm_occupancy: Some((OCCUPANCY_PER_ACTIVITY * demand).min(1.0)),
            dram_bandwidth: Some((DRAM_PER_ACTIVITY * demand).min(1.0)),
            processes: self.loads[gpu]
                .iter()
                .map(|(&key, load)| ProcessMemory {
                    pid: key as u32,
                    used_mib: load.mem_mib,
                })
                .collect(),
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
}
