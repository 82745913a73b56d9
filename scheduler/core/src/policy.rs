//! Admission policies: which queued job starts on which GPU(s), now.
//!
//! One engine, [`Admission`], serves both the daemon (GPU state from NVML or the simulated
//! backend) and the trace simulator, so a policy compared in `ladle sim` is exactly the code
//! that admits real jobs. The engine is pure: it reads a snapshot of the GPUs
//! ([`GpuState`]) and the queue ([`Pending`], head first) and returns [`Placement`]s; the
//! caller starts the jobs.
//!
//! ## The rules
//! - **Exclusive baseline** (`exclusive`): FIFO, one job per GPU.
//! - **CARMA** (`carma-*`): FIFO. An idle GPU is taken exclusively first (the job runs
//!   alone there until the next job collocates). Otherwise a GPU is a candidate when it is
//!   not settling, hosts fewer than [`Policy::max_clients`] MPS clients, passes the memory
//!   screen `free − reserve ≥ estimate + margin` (512 MiB and 2 GiB) and the compute screen,
//!   which rejects `smact ≥ 0.80 ∧ (smocc ≥ 0.45 ∨ dram ≥ 0.40)` on the windows' risk
//!   scores (unknown occupancy or bandwidth, on GPUs without GPM, counts as high).
//!   Candidates are ordered most-free-memory, least-utilised, first-fit or best-fit. After
//!   each dispatch the GPU settles for [`Policy::settle_s`] seconds, so the next decision sees
//!   the new job's memory and load. An out-of-memory retry ([`Pending::exclusive`]) waits
//!   for idle GPUs and holds them for its whole run.
//! - **ladle** (`ladle`): CARMA's rules with the least-utilised ordering (memory is already
//!   screened with reservations, so the scarce thing left to balance is SM time), plus
//!   - *measure, then pack* ([`Policy::measure_then_pack`]): a job on a [`Basis::Guess`]
//!     (it declared nothing and its family has not been measured) runs alone on idle GPUs
//!     until it is measured, and is never given a memory limit; so does an out-of-memory
//!     retry, which asks for its observed peak (×1.1, [`crate::job::learned_estimate`]) as
//!     [`Basis::Measured`]. Once measured, others may join it ([`Placement::until_measured`],
//!     [`GpuState::unmeasured_jobs`]). Declared jobs are trusted and packed at once;
//!   - *reservations*: free memory is `min(observed, total − other users' memory − Σ
//!     reservations of admitted jobs)`, so a job that has not allocated yet still counts;
//!   - *a 1 GiB margin* instead of CARMA's 2 GiB: estimates are declared and checked against
//!     measured peaks ([`crate::estimate::Families::declared_factor`]), or measured (+10%);
//!   - *per-job MPS memory limits that protect the neighbours*: a job whose estimate may cap
//!     ([`Basis::may_cap`]) and that is not placed alone gets
//!     `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` of the room its GPUs had for it: `free − reserve`
//!     by the formula above (at least its estimate). A job that under-declares dies at its
//!     limit only where it would really have overflowed the GPU or eaten a neighbour's
//!     reservation, never for overshooting a factor of its own estimate;
//!   - *backfill*: when the head cannot start, later jobs may, but never on the GPUs the head
//!     is waiting for (chosen when it is first blocked and kept until it starts: the ones
//!     whose screens it already passes, then the least utilised, then the most free memory;
//!     for a job that must run alone the idle or least loaded ones), at most
//!     [`Policy::max_bypass`] times per head and for at most
//!     [`Policy::max_bypass_s`] seconds, so the head cannot starve. A held GPU that is
//!     idle may still take one backfilled job at a time if the job leaves room for the
//!     head, `free − reserve ≥ (estimate + margin) + (head's estimate + margin)`
//!     ([`Policy::backfill_idle_held`]; never for a head that must run alone). A two-GPU
//!     head often holds an idle GPU for as long as it waits for its other one; filling it
//!     costs the head no memory, and keeps backfill off the GPUs of the jobs the head waits
//!     for, which it would slow. (Its SM load may still fail the head's compute screen there
//!     until it ends; such jobs count against the bypass limits like any other);
//!   - *wide jobs now* ([`Policy::wide_first`]): before anyone else, each queued job that
//!     needs two or more GPUs starts if GPUs that pass its screens can take it now, wherever
//!     it is in the queue. Two GPUs that pass the screens at the same moment are rare on a
//!     busy machine and a one-GPU job would take either; and two-GPU jobs are the long,
//!     SM-heavy chain that sets a trace's makespan, so starting them early (beside each
//!     other where memory allows) shortens it. Measured in `benches/README.md`;
//!   - *light jobs first* ([`Policy::light_first_mib`], 1 GiB): then jobs whose estimate is
//!     at most 1 GiB, in queue order, then the others. Such jobs fit beside anything, and
//!     are usually short (tests, small models, evaluation), so they cut the mean completion
//!     time at little cost to the rest. (The bound matches the light class of CARMA's
//!     trace, 256 MiB – 1 GiB; it was chosen there.)
//!
//!     Both count as backfill past a head blocked in an earlier round: each one that starts
//!     ahead of it uses one of its [`Policy::max_bypass`] passes, and once those are used
//!     (or [`Policy::max_bypass_s`] has passed) the head is offered first and nothing
//!     passes it, so no stream of wide or light jobs can starve it. Unlike backfill they
//!     may take the GPUs the head holds, even an idle one that a head which must run alone
//!     waits for: only the passes bound what they cost it;
//!   - *feed affinity*: consumers of one producer feed go to the GPUs already running
//!     consumers of that feed when those pass the screens, ahead of the idle-GPU rule and
//!     the ordering.
//!
//! For every policy: **the idle-GPU path screens memory too** (an idle GPU takes a job only
//! if the estimate, at most the GPU less the reserve, fits what telemetry shows free); a GPU
//! with another user's process is not idle ([`GpuState::foreign_processes`]), and a GPU whose
//! telemetry windows are not yet full takes no collocated job ([`GpuState::window_full`]).
//!
//! ## Measured
//! A running job is **measured** once it has run [`Policy::measure_s`] seconds (default 30,
//! one telemetry window at 1 Hz) with its GPUs' windows full: its peak memory so far (the
//! largest per-process memory telemetry showed for it on any of its GPUs) is then its
//! measured footprint. From then on the caller
//! - stops counting it in [`GpuState::unmeasured_jobs`] (if it was placed
//!   [`Placement::until_measured`]), so others may join it;
//! - reserves for it the larger of its estimate and `learned_estimate(peak)` in
//!   [`GpuState::reserved_mib`];
//! - records the peak for its family ([`crate::estimate::Families::observe`]) and, if it
//!   declared, against its declaration ([`crate::estimate::Families::observe_declared`]),
//!   so queued members of the family become [`Basis::Measured`] and pack by it.
//!
//! A job that is running but not yet measured and was placed `until_measured` shows as
//! `unmeasured_jobs > 0` on each of its GPUs: those GPUs take no job until it is measured.
//!
//! ## What the caller fills
//! [`GpuState::observed`] fills `total_mib`, `used_mib`, `risk` and `unusable`;
//! `window_full` is [`windows_full`] of the GPU's windows (false for 30 s after the
//! scheduler starts or restarts); [`GpuState::count_foreign`] fills `foreign_processes` and
//! `foreign_mib`
//! from the latest sample's processes that are not the scheduler's (its jobs' processes and
//! the MPS server). For each running job, on each of its GPUs: `jobs += 1`,
//! `reserved_mib += reservation` (above), `exclusive_job |= placement.exclusive`,
//! `unmeasured_jobs += 1` while placed `until_measured` and not measured, its feed in
//! `feeds`; `locked_until` from the previous round. For each queued job: `estimate_mib` and
//! `basis` from [`crate::estimate::Families::estimate`], `exclusive` for a retry.
//!
//! Memory arithmetic saturates: an estimate of any size (up to `u64::MAX`) fails the memory
//! screen of every busy GPU and fills a GPU's reservations, and never wraps around into a
//! small number. (The daemon's socket refuses sizes above
//! [`MAX_MIB`](ladle_scheduler_protocol::units::MAX_MIB) before they get here; the engine
//! does not rely on that.) An estimate beyond a GPU's size still fits that GPU when it is
//! idle and all free: a job alone on its GPUs may use all of them.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::estimate::Basis;
use crate::telemetry::{GpuInfo, GpuWindows, Risk};
use crate::window::WINDOW;

mod admission;
pub use admission::Admission;

/// Most MPS clients one GPU takes (the limit of MPS on Volta and newer).
pub const MAX_MPS_CLIENTS: u32 = 48;

/// How candidate GPUs are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum GpuOrdering {
    /// The GPU with the most free memory first.
    MostFreeMemory,
    /// The GPU with the lowest SM activity risk first.
    LeastUtilized,
    /// The lowest-numbered GPU that passes the screens.
    FirstFit,
    /// The GPU whose free memory the job fills most tightly.
    BestFit,
}

/// CARMA's compute screen: a GPU is rejected when its SM activity risk reaches
/// `sm_activity` and its occupancy or DRAM bandwidth risk reaches theirs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ComputeScreen {
    /// SM activity threshold (CARMA: 0.80).
    pub sm_activity: f64,
    /// SM occupancy threshold (CARMA: 0.45).
    pub sm_occupancy: f64,
    /// DRAM bandwidth threshold (CARMA: 0.40).
    pub dram_bandwidth: f64,
}

impl ComputeScreen {
    /// CARMA's thresholds.
    pub const CARMA: Self = Self {
        sm_activity: 0.80,
        sm_occupancy: 0.45,
        dram_bandwidth: 0.40,
    };

    /// Whether a GPU with these risk scores may take another job.
    pub fn passes(&self, risk: &Risk) -> bool {
        let busy = risk.sm_activity >= self.sm_activity;
        let occupied = risk.sm_occupancy.unwrap_or(1.0) >= self.sm_occupancy;
        let bandwidth = risk.dram_bandwidth.unwrap_or(1.0) >= self.dram_bandwidth;
        !(busy && (occupied || bandwidth))
    }
}

/// A named, configurable admission policy. Build one with [`Policy::named`] and adjust
/// fields as needed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Policy {
    /// The name it was made from.
    pub name: String,
    /// One job per GPU, never collocate (the baseline).
    pub exclusive: bool,
    /// Candidate ranking.
    pub ordering: GpuOrdering,
    /// Memory kept free on every GPU, MiB (CARMA: 512).
    pub reserve_mib: u64,
    /// Safety margin added to a job's estimate, MiB (CARMA: 2048; `ladle`: 1024).
    pub margin_mib: u64,
    /// The compute screen, if any.
    pub compute: Option<ComputeScreen>,
    /// Seconds a GPU takes no further job after a dispatch.
    pub settle_s: f64,
    /// Most jobs (MPS clients) per GPU.
    pub max_clients: u32,
    /// Start later jobs when the head is blocked.
    pub backfill: bool,
    /// Most jobs that may start past one blocked head.
    pub max_bypass: u32,
    /// Count admitted jobs' estimates against free memory.
    pub reservations: bool,
    /// Give each job whose estimate may cap ([`Basis::may_cap`]) an MPS pinned-memory
    /// limit: the room its GPUs had for it (see the module docs).
    pub mps_limits: bool,
    /// Use a family's observed peak as its members' next estimate.
    pub learned_estimates: bool,
    /// Keep consumers of one feed on the same GPUs.
    pub feed_affinity: bool,
    /// Measure, then pack: a job on a [`Basis::Guess`] and an out-of-memory retry run alone
    /// until measured (then others may join them), instead of a retry holding its GPUs for
    /// its whole run. Default `true` (`ladle`); CARMA's rules and `exclusive` have `false`.
    #[serde(default = "yes")]
    pub measure_then_pack: bool,
    /// Seconds a job must have run, with its GPUs' telemetry windows full, before its peak
    /// counts as measured (default 30: one telemetry window at 1 Hz).
    #[serde(default = "measure_s")]
    pub measure_s: f64,
    /// Backfill past a blocked head only for this many seconds after it was first
    /// blocked (default `f64::INFINITY`: bounded by [`Policy::max_bypass`] only).
    #[serde(default = "infinity")]
    pub max_bypass_s: f64,
    /// Keep the GPUs a blocked head waits for until it starts (`ladle`; CARMA has no
    /// backfill). Chosen afresh in every round they move, and backfill fills them all.
    #[serde(default = "yes")]
    pub sticky_hold: bool,
    /// A GPU held for a blocked head may still take a backfilled job while it is idle, if
    /// the job leaves room for the head (`free − reserve ≥ (estimate + margin) + (head's
    /// estimate + margin)`) and the head does not need to run alone (`ladle`; see the module
    /// docs).
    #[serde(default = "yes")]
    pub backfill_idle_held: bool,
    /// A job that needs two or more GPUs starts as soon as GPUs that pass the screens can
    /// take it, ahead of the queue order (`ladle`; see the module docs, "Wide jobs now").
    #[serde(default = "yes")]
    pub wide_first: bool,
    /// Jobs whose estimate is at most this many MiB are offered before the others, in
    /// queue order (`ladle`: 1024; see the module docs, "Light jobs first"). `None`: queue
    /// order only.
    #[serde(default = "light_mib")]
    pub light_first_mib: Option<u64>,
}

fn yes() -> bool {
    true
}

fn measure_s() -> f64 {
    Policy::MEASURE_S
}

fn infinity() -> f64 {
    f64::INFINITY
}

fn light_mib() -> Option<u64> {
    Some(Policy::LIGHT_MIB)
}

/// The `ladle` policy.
impl Default for Policy {
    fn default() -> Self {
        Self::ladle()
    }
}

/// A policy name that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// No policy has this name.
    #[error("unknown policy {name:?}; known: {}", Policy::NAMES.join(", "))]
    Unknown {
        /// The name given.
        name: String,
    },
}

impl Policy {
    /// Every policy name, baseline first.
    pub const NAMES: [&'static str; 6] = [
        "exclusive",
        "carma-most-free",
        "carma-least-util",
        "carma-first-fit",
        "carma-best-fit",
        "ladle",
    ];

    /// Default settle lock after a dispatch, seconds.
    pub const SETTLE_S: f64 = 20.0;

    /// Default time to measure a job, seconds: one 30-sample telemetry window at 1 Hz.
    pub const MEASURE_S: f64 = 30.0;

    /// `ladle`'s bound for a light job ([`Policy::light_first_mib`]), MiB.
    pub const LIGHT_MIB: u64 = 1024;

    /// The policy called `name` (one of [`Policy::NAMES`]).
    ///
    /// # Errors
    /// [`PolicyError::Unknown`] for any other name.
    pub fn named(name: &str) -> Result<Self, PolicyError> {
        Ok(match name {
            "exclusive" => Self::exclusive(),
            "carma-most-free" => Self::carma(GpuOrdering::MostFreeMemory),
            "carma-least-util" => Self::carma(GpuOrdering::LeastUtilized),
            "carma-first-fit" => Self::carma(GpuOrdering::FirstFit),
            "carma-best-fit" => Self::carma(GpuOrdering::BestFit),
            "ladle" => Self::ladle(),
            _ => {
                return Err(PolicyError::Unknown {
                    name: name.to_owned(),
                });
            }
        })
    }

    /// CARMA's rules with one of its orderings (`carma-most-free`, `carma-least-util`,
    /// `carma-first-fit`, `carma-best-fit`).
    pub fn carma(ordering: GpuOrdering) -> Self {
        let name = match ordering {
            GpuOrdering::MostFreeMemory => "carma-most-free",
            GpuOrdering::LeastUtilized => "carma-least-util",
            GpuOrdering::FirstFit => "carma-first-fit",
            GpuOrdering::BestFit => "carma-best-fit",
        };
        Self {
            name: name.to_owned(),
            exclusive: false,
            ordering,
            reserve_mib: 512,
            margin_mib: 2048,
            compute: Some(ComputeScreen::CARMA),
            settle_s: Self::SETTLE_S,
            max_clients: MAX_MPS_CLIENTS,
            backfill: false,
            max_bypass: 0,
            reservations: false,
            mps_limits: false,
            learned_estimates: false,
            feed_affinity: false,
            measure_then_pack: false,
            measure_s: Self::MEASURE_S,
            max_bypass_s: f64::INFINITY,
            sticky_hold: false,
            backfill_idle_held: false,
            wide_first: false,
            light_first_mib: None,
        }
    }

    /// The baseline `exclusive`: FIFO, one job per GPU.
    pub fn exclusive() -> Self {
        Self {
            name: "exclusive".to_owned(),
            exclusive: true,
            compute: None,
            settle_s: 0.0,
            max_clients: 1,
            ..Self::carma(GpuOrdering::FirstFit)
        }
    }

    /// `ladle`: CARMA least-utilised plus measure-then-pack, backfill with held GPUs,
    /// wide jobs now and light jobs first, reservations, a 1 GiB margin, per-job MPS limits
    /// from the room left, learned estimates and feed affinity (see the module docs).
    pub fn ladle() -> Self {
        Self {
            name: "ladle".to_owned(),
            backfill: true,
            max_bypass: 16,
            reservations: true,
            mps_limits: true,
            learned_estimates: true,
            feed_affinity: true,
            measure_then_pack: true,
            sticky_hold: true,
            backfill_idle_held: true,
            wide_first: true,
            light_first_mib: Some(Self::LIGHT_MIB),
            margin_mib: 1024,
            ..Self::carma(GpuOrdering::LeastUtilized)
        }
    }
}

/// One GPU as admission sees it. The caller fills it from telemetry
/// ([`GpuState::observed`], [`GpuState::count_foreign`]) and from its own running jobs
/// (`jobs`, `reserved_mib`, `exclusive_job`, `unmeasured_jobs`, `feeds`, `locked_until`).
/// Every field has a default a GPU with nothing known would have: no memory, no jobs, a
/// full window, no lock.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    /// Total memory, MiB.
    pub total_mib: u64,
    /// Memory in use by telemetry's latest sample, MiB: everyone's, the scheduler's jobs and
    /// other users' processes alike.
    pub used_mib: u64,
    /// Σ reservations of the scheduler's jobs on this GPU, MiB. A job's reservation is its
    /// estimate; once the job is measured, the larger of its estimate and
    /// [`crate::job::learned_estimate`] of its peak so far.
    pub reserved_mib: u64,
    /// The scheduler's jobs on this GPU.
    pub jobs: u32,
    /// Whether one of them holds the GPU for its whole run ([`Placement::exclusive`]).
    pub exclusive_job: bool,
    /// The scheduler's jobs on this GPU placed alone until measured
    /// ([`Placement::until_measured`]) that are not measured yet (see the module docs'
    /// "Measured"). While it is above 0 the GPU takes no other job.
    pub unmeasured_jobs: u32,
    /// Memory held on this GPU by processes that are not the scheduler's jobs (other users,
    /// other tools), MiB, from the latest sample's process list.
    pub foreign_mib: u64,
    /// Such processes. A GPU with one is never idle: a job goes there only through the
    /// screens, as if it collocated.
    pub foreign_processes: u32,
    /// Whether the telemetry windows are full ([`WINDOW`] samples). Just after the
    /// scheduler starts or restarts they are not, the risk scores mean little, and the GPU
    /// takes no collocated job (an idle GPU may still take one, memory screened).
    pub window_full: bool,
    /// Risk scores of the telemetry windows.
    pub risk: Risk,
    /// Settling until this time (seconds on the caller's clock).
    pub locked_until: f64,
    /// Feeds of the jobs on this GPU.
    pub feeds: Vec<String>,
    /// True for a GPU that must not take jobs (see `GpuInfo::unsuitable`).
    pub unusable: bool,
}

impl Default for GpuState {
    fn default() -> Self {
        Self {
            total_mib: 0,
            used_mib: 0,
            reserved_mib: 0,
            jobs: 0,
            exclusive_job: false,
            unmeasured_jobs: 0,
            foreign_mib: 0,
            foreign_processes: 0,
            window_full: true,
            risk: Risk::default(),
            locked_until: 0.0,
            feeds: Vec::new(),
            unusable: false,
        }
    }
}

impl GpuState {
    /// A GPU as its telemetry windows show it, before the scheduler's own jobs are counted
    /// (`jobs`, `reserved_mib`, `exclusive_job`, `unmeasured_jobs`, `feeds`), other users'
    /// processes are told apart ([`GpuState::count_foreign`]) and `window_full` is set
    /// ([`windows_full`]; left `true` here), with no settle lock.
    pub fn observed(info: &GpuInfo, windows: &GpuWindows) -> Self {
        Self {
            total_mib: info.memory_total_mib,
            used_mib: windows.last.as_ref().map_or(0, |s| s.memory_used_mib),
            risk: windows.risk(),
            locked_until: f64::NEG_INFINITY,
            unusable: !info.unsuitable.is_empty(),
            ..Self::default()
        }
    }

    /// Counts the processes of the latest sample that are not the scheduler's (`ours(pid)`
    /// false; MPS servers are never foreign) as foreign: `foreign_processes` and
    /// `foreign_mib` ([`crate::telemetry::GpuSample::foreign`]). A sample whose process
    /// lists are unknown (a failed NVML call), or no sample at all, counts as one foreign
    /// process: a GPU is never taken for idle because a query failed.
    pub fn count_foreign(&mut self, windows: &GpuWindows, ours: impl Fn(u32) -> bool) {
        match windows.last.as_ref().and_then(|s| s.foreign(ours)) {
            Some(foreign) => {
                let count = u32::try_from(foreign.processes.len()).unwrap_or(u32::MAX);
                self.foreign_processes = self.foreign_processes.saturating_add(count);
                self.foreign_mib = self.foreign_mib.saturating_add(foreign.memory_mib);
            }
            None => self.foreign_processes = self.foreign_processes.saturating_add(1),
        }
    }
}

/// Whether a GPU's telemetry windows are full ([`WINDOW`] samples): the value of
/// [`GpuState::window_full`].
pub fn windows_full(windows: &GpuWindows) -> bool {
    windows.sm_activity.len() >= WINDOW
}

/// A queued job as admission sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pending {
    /// Job id.
    pub id: u64,
    /// Device memory it will need per GPU, MiB.
    pub estimate_mib: u64,
    /// Where `estimate_mib` comes from: no memory limit is derived from a
    /// [`Basis::Guess`], and under [`Policy::measure_then_pack`] a guess runs alone until
    /// measured. The default is a guess.
    pub basis: Basis,
    /// Its family ([`crate::estimate::family_key`] or `--family`); empty: none. Admission
    /// does not read it: the caller turns a family's measured peak into `estimate_mib`
    /// with [`Basis::Measured`] ([`crate::estimate::Families::estimate`]).
    pub family: String,
    /// GPUs it needs.
    pub gpus: u32,
    /// It must start on idle GPUs (an out-of-memory retry). Under
    /// [`Policy::measure_then_pack`] nobody joins it until it is measured; otherwise for
    /// its whole run.
    pub exclusive: bool,
    /// The producer feed it consumes, if any.
    pub feed: Option<String>,
    /// The only GPUs (positions in the scheduler's list) it may run on: those its
    /// submitter's `CUDA_VISIBLE_DEVICES` names. `None`: any of the scheduler's.
    pub only: Option<BTreeSet<usize>>,
}

impl Pending {
    /// Whether it may run on GPU `i`.
    fn may_use(&self, i: usize) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(&i))
    }
}

/// A decision: start `job` on `gpus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Job id.
    pub job: u64,
    /// GPU indices.
    pub gpus: Vec<usize>,
    /// Nobody may join it on these GPUs for as long as it runs (the caller sets
    /// [`GpuState::exclusive_job`] until it ends).
    pub exclusive: bool,
    /// Nobody may join it on these GPUs until it is measured (the caller counts it in
    /// [`GpuState::unmeasured_jobs`] until then).
    pub until_measured: bool,
    /// MPS pinned-memory limit per GPU, MiB, when the policy sets one (never from a
    /// [`Basis::Guess`], never for a job placed alone).
    pub mem_limit_mib: Option<u64>,
}

#[cfg(test)]
mod tests;
