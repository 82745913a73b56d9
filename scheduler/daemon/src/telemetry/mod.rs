//! GPU telemetry: `ladle-scheduler-core`'s [`telemetry`](ladle_scheduler_core::telemetry)
//! (the [`Telemetry`] trait, samples, windows and the simulated backend [`sim`]), re-exported
//! here whole, with the two readers of a real GPU, which load a library or start a process:
//! [`nvml`] (libnvidia-ml loaded at run time) and [`dcgm`] (the DCGM profiling metrics a GPU
//! without GPM gets from a `dcgmi dmon` child process). The core's docs say how samples are
//! trusted and which checks still need a real GPU.

pub use ladle_scheduler_core::telemetry::*;

pub mod dcgm;
pub mod nvml;

pub use self::nvml::{DcgmMode, NvmlOptions, NvmlTelemetry};

#[cfg(test)]
mod tests;
