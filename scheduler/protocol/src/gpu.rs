//! The GPUs as the protocol carries them: what the scheduler knows about each one
//! ([`GpuInfo`]), its compute mode and what that mode means for running several jobs on it
//! ([`collocation_note`]), and where its compute metrics come from ([`ComputeSource`]).
//! Reading them from a GPU is the telemetry's job (`ladle_scheduler_core::telemetry` and the
//! NVML backend in `ladle-scheduler`).

use serde::{Deserialize, Serialize};

/// What the scheduler knows about one GPU that does not change while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index as NVML (and `nvidia-smi`) number it. Under an allocation the backend's GPUs
    /// are numbered `0..k` by position (what jobs' `gpus` name) and this stays NVML's.
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
    /// The compute mode NVML reports; `None` when the query failed (then
    /// [`GpuInfo::collocation`] warns that it cannot tell).
    #[serde(default)]
    pub compute_mode: Option<ComputeMode>,
    /// Where SM activity, SM occupancy and DRAM bandwidth come from on this GPU.
    #[serde(default)]
    pub compute_source: ComputeSource,
    /// Why the compute screen is degraded (no GPM and no working DCGM), for the log and
    /// `ladle queue`; `None` when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_source_note: Option<String>,
}

impl GpuInfo {
    /// A GPU described by index, UUID, name and total memory, with nothing unsuitable, the
    /// compute mode unknown and the compute screen degraded (utilisation only).
    pub fn new(index: u32, uuid: String, name: String, memory_total_mib: u64) -> Self {
        Self {
            index,
            uuid,
            name,
            memory_total_mib,
            unsuitable: Vec::new(),
            compute_mode: None,
            compute_source: ComputeSource::UtilizationOnly,
            compute_source_note: None,
        }
    }

    /// Whether jobs can share this GPU, given whether an MPS control daemon serves it, and a
    /// note for the log and `ladle queue` ([`collocation_note`]).
    pub fn collocation(&self, mps_running: bool) -> CollocationNote {
        collocation_note(self.compute_mode, mps_running)
    }
}

/// A GPU's compute mode (`nvidia-smi -q`, "Compute Mode"; NVML `nvmlComputeMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    /// Several processes may hold a context on the GPU at once.
    Default,
    /// One context used by one thread (support removed from current drivers).
    ExclusiveThread,
    /// No process may create a context: no compute at all.
    Prohibited,
    /// One process may hold a context at a time (with MPS, that process is the MPS server).
    ExclusiveProcess,
}

impl std::fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Default => "Default",
            Self::ExclusiveThread => "Exclusive_Thread",
            Self::Prohibited => "Prohibited",
            Self::ExclusiveProcess => "Exclusive_Process",
        })
    }
}

/// How serious a [`CollocationNote`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteLevel {
    /// Worth logging at `info`.
    Info,
    /// Worth logging at `warn`: jobs will not share the GPU, or will share it badly.
    Warning,
}

/// What a GPU's compute mode means for collocation ([`collocation_note`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollocationNote {
    /// Whether more than one job can run on the GPU at once.
    pub collocation: bool,
    /// The most jobs the GPU can run at once: `Some(0)` for no compute, `Some(1)` for one
    /// process only, `None` for no limit from the compute mode (MPS's own client limit and
    /// admission still apply).
    pub max_jobs: Option<usize>,
    /// How serious the note is.
    pub level: NoteLevel,
    /// The note, one sentence or two, naming the mode and what an administrator could do.
    pub note: String,
}

/// What compute mode `mode` means for running several jobs on one GPU, given whether an MPS
/// control daemon serves the GPU (ladle reports this and never changes the mode).
///
/// From NVIDIA's MPS documentation, "When to Use MPS", "Considerations" → "System
/// Considerations" → "GPU Compute Modes"
/// (<https://docs.nvidia.com/deploy/mps/latest/when-to-use-mps.html>): "Using MPS effectively
/// causes EXCLUSIVE_PROCESS mode to behave like DEFAULT mode for all MPS clients", and "When
/// using MPS it is recommended to use EXCLUSIVE_PROCESS mode to ensure that only a single MPS
/// server is using the GPU"; "Exclusive-mode restrictions are applied to the MPS server, not
/// MPS clients". Without MPS, EXCLUSIVE_PROCESS lets one process hold a context, so a second
/// job fails to create one: collocation needs MPS there.
pub fn collocation_note(mode: Option<ComputeMode>, mps_running: bool) -> CollocationNote {
    let note = |collocation, max_jobs, level, text: &str| CollocationNote {
        collocation,
        max_jobs,
        level,
        note: text.to_owned(),
    };
    match (mode, mps_running) {
        (Some(ComputeMode::Prohibited), _) => note(
            false,
            Some(0),
            NoteLevel::Warning,
            "compute mode is Prohibited: no process may create a CUDA context, so the GPU takes \
             no jobs (an administrator can run `nvidia-smi -c DEFAULT` or `EXCLUSIVE_PROCESS`; \
             ladle does not change it)",
        ),
        (Some(ComputeMode::ExclusiveThread), _) => note(
            false,
            Some(0),
            NoteLevel::Warning,
            "compute mode is Exclusive_Thread, which current drivers no longer support and MPS \
             cannot share: the GPU takes no jobs (ladle does not change the mode)",
        ),
        (Some(ComputeMode::ExclusiveProcess), true) => note(
            true,
            None,
            NoteLevel::Info,
            "compute mode is Exclusive_Process with MPS, NVIDIA's recommended setting: the MPS \
             server is the one process on the GPU and jobs share it as MPS clients",
        ),
        (Some(ComputeMode::ExclusiveProcess), false) => note(
            false,
            Some(1),
            NoteLevel::Warning,
            "compute mode is Exclusive_Process without MPS: one process may use the GPU, so it \
             runs one job at a time (start MPS to share it, or ask an administrator for \
             `nvidia-smi -c DEFAULT`)",
        ),
        (Some(ComputeMode::Default), true) => note(
            true,
            None,
            NoteLevel::Info,
            "compute mode is Default with MPS: jobs share the GPU as MPS clients; a process \
             started outside MPS can still take its own context (NVIDIA recommends \
             Exclusive_Process with MPS)",
        ),
        (Some(ComputeMode::Default), false) => note(
            true,
            None,
            NoteLevel::Warning,
            "compute mode is Default without MPS: jobs share the GPU by time-slicing, without \
             MPS's concurrent kernels or per-job memory limits",
        ),
        (None, mps) => note(
            true,
            None,
            NoteLevel::Warning,
            if mps {
                "compute mode unknown (NVML could not read it): assuming jobs can share the GPU \
                 through MPS"
            } else {
                "compute mode unknown (NVML could not read it) and no MPS: if the GPU is \
                 Exclusive_Process, a second job will fail to start"
            },
        ),
    }
}

/// Where a GPU's SM activity, SM occupancy and DRAM bandwidth come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeSource {
    /// NVML's GPU Performance Monitoring (Hopper and newer).
    Gpm,
    /// DCGM profiling fields 1002 (SM active), 1003 (SM occupancy), 1005 (DRAM active),
    /// streamed by `dcgmi dmon` (`ladle_scheduler::telemetry::dcgm`).
    Dcgm,
    /// None: the compute screen is degraded, judging SM activity by NVML utilisation and
    /// counting the unknown occupancy and bandwidth as high.
    #[default]
    UtilizationOnly,
}

impl ComputeSource {
    /// Whether the compute screen is degraded (utilisation only).
    pub fn is_degraded(self) -> bool {
        self == Self::UtilizationOnly
    }
}

impl std::fmt::Display for ComputeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Gpm => "GPM",
            Self::Dcgm => "DCGM",
            Self::UtilizationOnly => "utilisation only (degraded)",
        })
    }
}
