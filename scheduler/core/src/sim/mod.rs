//! The trace simulator: a deterministic discrete-event replay of a trace on N simulated
//! GPUs, admitting jobs with the same [`Admission`](crate::policy::Admission) engine the daemon uses.
//!
//! ## Model
//! - **Events**: arrivals, completions, out-of-memory crashes, and a telemetry tick every
//!   second (the daemon's 1 Hz) that samples the simulated GPUs into 30-sample windows.
//!   Admission runs after every event, as the daemon's loop does after a submit, a job's
//!   end, or a tick.
//! - **Quiet stretches are skipped**: once [`WINDOW`](crate::window::WINDOW) ticks in a row changed nothing (no
//!   arrival, end or placement), the windows hold thirty copies of the same sample and
//!   admission has refused the same queue on the same GPUs, so every further tick would do
//!   the same. The clock then jumps to the first tick at or after the next arrival, end,
//!   crash or settle-lock expiry, with the result of ticking through (to rounding). The
//!   work is therefore proportional to the events, not to the simulated seconds: a job of
//!   10⁹ s costs what a job of 100 s does. A queue that can never start is reported
//!   ([`SimError::Stalled`]) instead of ticked on forever.
//! - **Inputs are bounded** (see [`trace`]'s bounds, checked again here, and
//!   [`SimConfig`]'s), so the `f64` clock always resolves a tick.
//! - **Interference**: on a GPU whose jobs' summed SM demand is `D` with `n` jobs, each job
//!   progresses at `1 / (max(1, D) · (1 + c·(n − 1)))` of its solo speed: jobs share the SMs
//!   fairly once they oversubscribe them, and every co-runner costs [`SimConfig::contention`]
//!   (5 % by default) for MPS context switching, cache and memory-bandwidth contention. A
//!   multi-GPU job moves at the pace of its slowest GPU.
//! - **Memory**: a job holds its trace `mem_mib` on each of its GPUs from start to end. A job
//!   that starts on a GPU whose summed memory then exceeds the GPU's, or whose memory
//!   exceeds its own MPS limit, crashes out of memory [`SimConfig::oom_after_s`] seconds later
//!   (10 s: the framework's first allocations), releasing its GPUs. Its observed peak is its
//!   memory, or its limit if that stopped it. It goes back to the head of the queue flagged
//!   [`Pending::exclusive`](crate::policy::Pending::exclusive): with learned estimates (`ladle`) asking for 1.1 × the observed
//!   peak ([`Basis::Measured`]), alone until measured; otherwise (CARMA) with 1.5 × its
//!   estimate, alone for its whole run. After [`SimConfig::max_oom_retries`] retries it counts
//!   as failed ([`JobOutcome::failed`]) and is not run again.
//! - **Estimates**: a job that declares (the trace's `declared` column, default true)
//!   declares `estimate_scale × mem_mib` (1.0: honest); one that does not gets
//!   [`SimConfig::default_estimate_mib`] (4096, the daemon's default) as a
//!   [`Basis::Guess`], or with learned estimates its family's measured peak × 1.1 (a job
//!   without a `family` is a family of its own). With learned estimates, a declaration is
//!   scaled by [`Families::declared_factor`](crate::estimate::Families::declared_factor) at each admission round.
//! - **Measurement**: a job is measured [`Policy::measure_s`] seconds after it starts (the
//!   windows are full by then: they fill in the first 30 s of the trace). Its peak is then
//!   known: its family learns it, queued guesses of the family become measured estimates, a
//!   declaration is compared with it, and with learned estimates its reservation becomes
//!   `max(estimate, 1.1 × peak)` (see [`crate::policy`]'s "Measured").
//! - **Power**: each GPU draws `idle_w + (max_w − idle_w) · min(1, D)`; defaults 60 W idle and
//!   400 W at full load, an A100-SXM4-40GB's idle draw and TDP. All GPUs count from the first
//!   arrival to the last completion.
//!
//! ## Metrics
//! `makespan_s` (first arrival to last completion), `mean_jct_s` (completion − arrival,
//! over completed jobs), `mean_gpu_util` (time-average of `min(1, D)` over GPUs),
//! `oom_crashes`, `energy_kwh`, `failed_jobs`, and the trace's `lower_bound_s`
//! ([`LowerBound`]: no schedule under this model finishes sooner).

pub mod generate;
mod replay;
pub mod trace;

use serde::{Deserialize, Serialize};

use crate::estimate::Basis;
use crate::job::learned_estimate;
use crate::policy::Policy;

use self::replay::replay;
use self::trace::{JobError, MAX_DURATION_S, TraceJob};

/// The simulated machine and the model's constants. [`simulate`] refuses values out of
/// range ([`SimError::BadSetting`]): the times must be finite and at most
/// [`trace::MAX_DURATION_S`] (`tick_s` at least [`MIN_TICK_S`]), `contention`, the powers
/// and `estimate_scale` finite and not negative (`estimate_scale` above 0), as must the
/// policy's `settle_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// GPUs.
    pub gpus: usize,
    /// Memory per GPU, MiB.
    pub gpu_mem_mib: u64,
    /// Estimate = `estimate_scale × mem_mib` (1.0: honest estimates).
    pub estimate_scale: f64,
    /// Slowdown per co-runner.
    pub contention: f64,
    /// Seconds from start to an out-of-memory crash.
    pub oom_after_s: f64,
    /// Out-of-memory retries before a job counts as failed.
    pub max_oom_retries: u32,
    /// Power of an idle GPU, W.
    pub idle_w: f64,
    /// Power of a fully busy GPU, W.
    pub max_w: f64,
    /// Telemetry period, s.
    pub tick_s: f64,
    /// The estimate of a job that declares nothing, MiB (the daemon's default, 4096).
    pub default_estimate_mib: u64,
    /// A fixed queue order, as each trace job's rank (in trace order; lower goes first,
    /// equal ranks in arrival order): every round, the queued jobs are offered to admission
    /// sorted by it instead of in arrival order. `None` (the default): arrival order, every
    /// policy's own. An instrument (`ladle sim --order`), not a policy: it asks how much a
    /// better order could gain, with hindsight no online scheduler has (see
    /// `benches/sim/hindsight.py`).
    pub queue_order: Option<Vec<u32>>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            gpus: 3,
            gpu_mem_mib: 40 * 1024,
            estimate_scale: 1.0,
            contention: 0.05,
            oom_after_s: 10.0,
            max_oom_retries: 3,
            idle_w: 60.0,
            max_w: 400.0,
            tick_s: 1.0,
            default_estimate_mib: 4 * 1024,
            queue_order: None,
        }
    }
}

/// One policy's results on one trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// First arrival to last completion, s.
    pub makespan_s: f64,
    /// Mean of completion − arrival over completed jobs, s.
    pub mean_jct_s: f64,
    /// Time-averaged GPU utilisation, 0 – 1.
    pub mean_gpu_util: f64,
    /// Out-of-memory crashes.
    pub oom_crashes: u32,
    /// Energy of all GPUs over the makespan, kWh.
    pub energy_kwh: f64,
    /// Jobs that ran out of retries.
    pub failed_jobs: u32,
    /// Jobs in the trace.
    pub jobs: usize,
    /// The model's lower bound on the makespan, s ([`LowerBound`]).
    pub lower_bound_s: f64,
}

/// A lower bound on any policy's makespan under the model, from the trace alone: no
/// schedule can finish sooner than the largest of
/// - `latest_s`: the latest `arrival + duration` (a job runs at most at its solo speed), from
///   the first arrival;
/// - `sm_work_s`: Σ `duration × sm_activity × gpus` over the GPUs (a GPU delivers at most
///   one unit of SM demand per second: `min(1, D)` shared among its jobs, less contention);
/// - `memory_time_s`: Σ `duration × mem_mib × gpus` over `GPUs × GPU memory` (a job holds
///   its memory for at least its solo duration).
///
/// It ignores arrivals for the two sums and out-of-memory crashes, so it is not always
/// reachable; `makespan ÷ bound` says how far a schedule is from it at most.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LowerBound {
    /// Latest `arrival + duration` after the first arrival, s.
    pub latest_s: f64,
    /// Total SM work per GPU, s.
    pub sm_work_s: f64,
    /// Total memory-time per GPU's memory, s.
    pub memory_time_s: f64,
}

impl LowerBound {
    /// The bound of `trace` on `config`'s machine.
    pub fn of(trace: &[TraceJob], config: &SimConfig) -> Self {
        let start = trace
            .iter()
            .map(|j| j.submit_s)
            .fold(f64::INFINITY, f64::min);
        let gpus = config.gpus.max(1) as f64;
        Self {
            latest_s: trace
                .iter()
                .map(|j| j.submit_s - start + j.duration_s)
                .fold(0.0, f64::max),
            sm_work_s: trace
                .iter()
                .map(|j| j.duration_s * j.sm_activity * f64::from(j.gpus))
                .sum::<f64>()
                / gpus,
            memory_time_s: trace
                .iter()
                .map(|j| j.duration_s * j.mem_mib as f64 * f64::from(j.gpus))
                .sum::<f64>()
                / (gpus * config.gpu_mem_mib.max(1) as f64),
        }
    }

    /// The largest of the three, s.
    pub fn bound_s(&self) -> f64 {
        self.latest_s.max(self.sm_work_s).max(self.memory_time_s)
    }
}

/// What happened to one job of the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobOutcome {
    /// Name from the trace.
    pub id: String,
    /// Arrival, s.
    pub submit_s: f64,
    /// Start of its last attempt, s.
    pub start_s: Option<f64>,
    /// Completion, s (`None`: failed).
    pub finish_s: Option<f64>,
    /// GPUs of its last attempt.
    pub gpus: Vec<usize>,
    /// Out-of-memory crashes it had.
    pub oom_crashes: u32,
    /// It ran out of out-of-memory retries ([`SimConfig::max_oom_retries`]): its final state
    /// is failed, and it is not run again.
    pub failed: bool,
}

/// Shortest telemetry period the simulator takes, s.
pub const MIN_TICK_S: f64 = 1e-3;

/// A trace the simulator cannot replay.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A job of the trace has a value out of range.
    #[error(transparent)]
    BadJob(#[from] JobError),
    /// A setting of the simulator or the policy is out of range (see [`SimConfig`]).
    #[error("simulator setting {name} = {value:?} is out of range")]
    BadSetting {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// A job needs more GPUs than the machine has.
    #[error("job {job} needs {needs} GPUs; the simulated machine has {have}")]
    TooWide {
        /// Job id.
        job: String,
        /// GPUs it needs.
        needs: u32,
        /// GPUs there are.
        have: usize,
    },
    /// No GPUs, or GPUs without memory.
    #[error("the simulated machine needs at least one GPU with memory")]
    NoGpus,
    /// [`SimConfig::queue_order`] does not rank every job of the trace once.
    #[error("the queue order ranks {ranked} jobs; the trace has {jobs}")]
    BadOrder {
        /// Jobs it ranks.
        ranked: usize,
        /// Jobs in the trace.
        jobs: usize,
    },
    /// Queued jobs that can never start (a policy that refuses an empty machine, reported
    /// rather than looped on).
    #[error("{queued} jobs can never start under policy {policy}")]
    Stalled {
        /// Policy name.
        policy: String,
        /// Jobs left in the queue.
        queued: usize,
    },
}

#[derive(Debug, Clone)]
struct Queued {
    job: usize,
    /// What it declares, MiB (`mem_mib × estimate_scale`), if it does.
    declared_mib: Option<u64>,
    estimate_mib: u64,
    basis: Basis,
    exclusive: bool,
    crashes: u32,
}

#[derive(Debug, Clone)]
struct Running {
    queued: Queued,
    gpus: Vec<usize>,
    /// Solo-speed seconds of work left.
    remaining: f64,
    crash_at: Option<f64>,
    limit_mib: Option<u64>,
    /// When it counts as measured (start + `measure_s`).
    measure_at: f64,
    /// Its peak, once measured, MiB.
    measured_mib: Option<u64>,
    /// Nobody joins it while it runs.
    exclusive: bool,
    /// Nobody joins it until it is measured.
    until_measured: bool,
}

impl Running {
    /// Its reservation: the estimate, or once measured (with learned estimates) the larger
    /// of the estimate and 1.1 × the peak.
    fn reservation_mib(&self, learned: bool) -> u64 {
        match (learned, self.measured_mib) {
            (true, Some(peak)) => self.queued.estimate_mib.max(learned_estimate(peak)),
            _ => self.queued.estimate_mib,
        }
    }
}

/// The family of trace job `j`: its `family` column, or one of its own.
fn family_of(trace: &[TraceJob], j: usize) -> String {
    trace[j]
        .family
        .clone()
        .unwrap_or_else(|| format!("\u{1f}job {j}"))
}

const EPS: f64 = 1e-9;

/// Replays `trace` under `policy`.
///
/// # Errors
/// [`SimError`] for a trace the machine cannot run.
pub fn simulate(
    trace: &[TraceJob],
    policy: Policy,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    simulate_jobs(trace, policy, config).map(|(report, _)| report)
}

/// [`simulate`], also returning what happened to each job (in trace order).
///
/// # Errors
/// [`SimError`] for a trace the machine cannot run.
pub fn simulate_jobs(
    trace: &[TraceJob],
    policy: Policy,
    config: &SimConfig,
) -> Result<(SimReport, Vec<JobOutcome>), SimError> {
    replay(trace, policy, config, Quiet::Skip).map(|(report, outcomes, _steps)| (report, outcomes))
}

/// Ticks in a row that changed nothing, after a step that `changed` the machine or the
/// queue (an arrival, an end, a placement) or not, and `ticked` or not.
fn quiet_after(quiet_ticks: usize, changed: bool, ticked: bool) -> usize {
    match (changed, ticked) {
        (true, _) => 0,
        (false, true) => quiet_ticks.saturating_add(1),
        (false, false) => quiet_ticks,
    }
}

/// Checks the settings the event loop's termination depends on.
fn check_settings(policy: &Policy, config: &SimConfig) -> Result<(), SimError> {
    let time = |x: f64, min: f64| x.is_finite() && (min..=MAX_DURATION_S).contains(&x);
    let amount = |x: f64| x.is_finite() && x >= 0.0;
    let settings = [
        ("tick_s", config.tick_s, time(config.tick_s, MIN_TICK_S)),
        (
            "oom_after_s",
            config.oom_after_s,
            time(config.oom_after_s, 0.0),
        ),
        ("settle_s", policy.settle_s, time(policy.settle_s, 0.0)),
        ("measure_s", policy.measure_s, time(policy.measure_s, 0.0)),
        ("contention", config.contention, amount(config.contention)),
        ("idle_w", config.idle_w, amount(config.idle_w)),
        ("max_w", config.max_w, amount(config.max_w)),
        (
            "estimate_scale",
            config.estimate_scale,
            amount(config.estimate_scale) && config.estimate_scale > 0.0,
        ),
    ];
    match settings.into_iter().find(|&(_, _, ok)| !ok) {
        Some((name, value, _)) => Err(SimError::BadSetting { name, value }),
        None => Ok(()),
    }
}

/// What the event loop does with a quiet stretch (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quiet {
    /// Jump over it.
    Skip,
    /// Tick through it, second by second (the tests' reference; a queue that can never
    /// start then ticks on forever).
    #[cfg(test)]
    TickThrough,
}

#[cfg(test)]
mod tests;
