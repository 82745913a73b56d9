//! # ladle-scheduler: collocation-aware GPU admission
//!
//! The scheduler of `docs/ARCHITECTURE.md`'s picture, the bottom line:
//!
//! ```text
//!  scheduler ── NVML telemetry, MPS control ── GPU(s) ◄── admits the consumers' training processes
//! ```
//!
//! It starts training processes (jobs) on the machine's GPUs under NVIDIA MPS only while
//! memory and compute headroom allow, as CARMA does, recovers jobs that crash out of
//! memory, loses no job across a crash of its own, and places the consumers of one producer
//! feed together. It knows feeds by name only. The `ladle` binary's `scheduler`, `submit`,
//! `queue`, `cancel`, `logs` and `sim` subcommands are thin shells over it.
//!
//! It is the OS side of the scheduler's three crates: the wire protocol is
//! `ladle-scheduler-protocol` (re-exported as [`protocol`], with [`units`]); what the
//! scheduler decides, remembers and simulates is `ladle-scheduler-core` (its modules
//! re-exported here, so that `ladle_scheduler::policy`, `::estimate`, `::sim` and the rest
//! keep their paths); this crate adds the sockets, files, processes and devices. Of ladle's
//! other crates it depends on `ladle-os` alone for the OS (child processes, their groups and CPU
//! time).
//!
//! ## Layers
//! - bottom, OS and devices (this crate): [`sys`] (`/proc`, process groups, peer uid, lock
//!   file), [`telemetry::nvml`] (libnvidia-ml loaded at run time) and [`telemetry::dcgm`]
//!   (a `dcgmi dmon` child), [`mps`] (`nvidia-cuda-mps-control`), the [`journal`]'s file
//!   ([`journal::Journal`]) and trace files ([`sim::trace::read`]);
//! - building blocks, pure (`ladle-scheduler-core`): [`telemetry`] (one trait; the
//!   simulated backend), [`window`] (30-sample windows, CARMA's risk score), [`estimate`]
//!   (where a memory estimate comes from: declared, measured per family, or a guess that
//!   limits nothing), [`policy`] (the admission engine, one for the daemon and the
//!   simulator), [`job`], the [`journal`]'s records and their fold into jobs
//!   (`ladle_scheduler_core::state`), [`allocation`] (which of the node's GPUs a Slurm
//!   allocation or `--only-gpus` gives the daemon), and [`sim`] (trace replay and the
//!   CARMA-like trace generator);
//! - on top: [`daemon`] (the Unix-socket service, its job state the core's pure fold of the
//!   journal).
//!
//! The core's docs say how admission measures, then packs, and what the simulator measured.
//!
//! ## Example: a trace file, replayed under the `ladle` policy
//! ```
//! use ladle_scheduler::policy::Policy;
//! use ladle_scheduler::sim::generate::{GenerateConfig, generate};
//! use ladle_scheduler::sim::{SimConfig, simulate, trace};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("trace.csv");
//! trace::write(&path, &generate(&GenerateConfig { jobs: 20, seed: 7, mean_gap_s: 30.0 }))?;
//! let jobs = trace::read(&path)?;
//! let config = SimConfig { gpus: 2, gpu_mem_mib: 40 * 1024, ..SimConfig::default() };
//! let report = simulate(&jobs, Policy::named("ladle")?, &config)?;
//! assert_eq!(report.oom_crashes, 0); // honest estimates
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## What is real and what is simulated
//! - NVML: memory, utilisation, compute mode and per-process memory (compute and MPS
//!   clients) on every NVIDIA GPU; SM activity, SM occupancy and DRAM bandwidth through GPM
//!   (nvml-wrapper's safe GPM API) on Hopper and newer, through DCGM's profiling fields
//!   (`dcgmi dmon`) where DCGM is installed, else none (the compute screen is then degraded:
//!   utilisation only, unknowns counted as high, and the daemon says so). No driver is
//!   [`telemetry::TelemetryError::NvmlUnavailable`], never a panic.
//! - The simulated backend serves the tests, the daemon's `--gpu sim` mode and the
//!   simulator; its model is in [`telemetry::sim`] and [`sim`].
//! - MPS limits are set with `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in the `GPU-<uuid>=6144M`
//!   form, one entry per GPU of the job ([`mps::pinned_mem_limit`] cites NVIDIA's format);
//!   the checks that still need a real GPU are listed in [`telemetry`].
//!
//! ## Logging
//! `error`: the journal cannot be written (jobs are then refused). `warn`: recoveries after
//! a crash, unsuitable GPUs, compute modes that forbid sharing, a degraded compute screen,
//! MPS unavailable, telemetry failures. `info`: jobs submitted (with their estimate's
//! basis), started, measured and ended, the evidence of an out-of-memory exit; each GPU's
//! metric source; the daemon starting and stopping. `debug`: rejected client frames,
//! telemetry gaps.

pub mod daemon;
pub mod journal;
pub mod mps;
pub mod sim;
pub mod sys;
pub mod telemetry;

pub use ladle_scheduler_core::{allocation, estimate, job, policy, window};
pub use ladle_scheduler_protocol as protocol;
pub use ladle_scheduler_protocol::units;
