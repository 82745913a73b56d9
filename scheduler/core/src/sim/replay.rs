//! The simulator's event loop: a trace replayed on simulated GPUs, one step per event (a job
//! finishes, crashes, is measured or arrives; a telemetry tick), each step in phases:
//! advance the clock, end what ended, measure, take arrivals, sample, admit.

use std::collections::VecDeque;

use super::{
    EPS, JobOutcome, LowerBound, Queued, Quiet, Running, SimConfig, SimError, SimReport,
    check_settings, family_of, quiet_after,
};
use crate::estimate::{Basis, Families};
use crate::job::learned_estimate;
use crate::policy::{Admission, GpuState, Pending, Placement, Policy, windows_full};
use crate::telemetry::{GpuWindows, SimGpus, SimLoad, Telemetry};
use crate::window::WINDOW;

use super::trace::TraceJob;

/// [`super::simulate_jobs`], also returning how many steps the event loop took.
pub(super) fn replay(
    trace: &[TraceJob],
    policy: Policy,
    config: &SimConfig,
    quiet: Quiet,
) -> Result<(SimReport, Vec<JobOutcome>, u64), SimError> {
    check(trace, &policy, config)?;
    let mut replay = Replay::new(trace, policy, config);
    loop {
        replay.steps += 1;
        let speeds = replay.speeds();
        let next = replay.next_events(&speeds);
        if replay.running.is_empty() && replay.arrivals.is_empty() && replay.queue.is_empty() {
            break;
        }
        if quiet == Quiet::Skip && replay.quiet_ticks >= WINDOW {
            replay.skip_quiet(&next)?;
        }
        // Never backwards, even where rounding puts a tick a hair before `t`.
        let to = next.earliest().min(replay.next_tick).max(replay.t);
        replay.advance(to, &speeds);
        let mut changed = replay.end_crashes_and_completions();
        changed |= replay.measure();
        changed |= replay.arrive();
        let ticked = replay.sample();
        if replay.queue.is_empty() {
            replay.quiet_ticks = quiet_after(replay.quiet_ticks, changed, ticked);
            continue;
        }
        changed |= replay.admit();
        replay.quiet_ticks = quiet_after(replay.quiet_ticks, changed, ticked);
    }
    Ok(replay.report())
}

/// The trace and settings make a simulation.
fn check(trace: &[TraceJob], policy: &Policy, config: &SimConfig) -> Result<(), SimError> {
    if config.gpus == 0 || config.gpu_mem_mib == 0 {
        return Err(SimError::NoGpus);
    }
    for job in trace {
        job.validate()?;
    }
    check_settings(policy, config)?;
    if let Some(order) = config
        .queue_order
        .as_ref()
        .filter(|o| o.len() != trace.len())
    {
        return Err(SimError::BadOrder {
            ranked: order.len(),
            jobs: trace.len(),
        });
    }
    if let Some(j) = trace.iter().find(|j| j.gpus as usize > config.gpus) {
        return Err(SimError::TooWide {
            job: j.id.clone(),
            needs: j.gpus,
            have: config.gpus,
        });
    }
    Ok(())
}

/// When the next events come, from the time of the current step.
struct NextEvents {
    finish: f64,
    crash: f64,
    arrival: f64,
    measure: f64,
}

impl NextEvents {
    /// The next step's time before telemetry ticks: a finish, crash or arrival (a
    /// measurement is seen at the step after it is due, as the daemon sees it).
    fn earliest(&self) -> f64 {
        self.finish.min(self.crash).min(self.arrival)
    }
}

/// A replay in progress.
struct Replay<'a> {
    trace: &'a [TraceJob],
    config: &'a SimConfig,
    policy_name: String,
    learned: bool,
    measure_s: f64,
    families: Families,
    engine: Admission,
    arrivals: VecDeque<usize>,
    start: f64,
    t: f64,
    /// Ticks fall on `start + k · tick_s`; `ticks` is the k of the next one.
    ticks: u64,
    next_tick: f64,
    /// Ticks in a row that changed nothing (see the module docs).
    quiet_ticks: usize,
    steps: u64,
    sim: SimGpus,
    windows: Vec<GpuWindows>,
    locked_until: Vec<f64>,
    queue: VecDeque<Queued>,
    running: Vec<Running>,
    finished_at: Vec<Option<f64>>,
    outcomes: Vec<JobOutcome>,
    busy_integral: f64,
    energy_j: f64,
    oom_crashes: u32,
    failed_jobs: u32,
    end: f64,
}

impl<'a> Replay<'a> {
    fn new(trace: &'a [TraceJob], policy: Policy, config: &'a SimConfig) -> Self {
        let mut order: Vec<usize> = (0..trace.len()).collect();
        order.sort_by(|&a, &b| trace[a].submit_s.total_cmp(&trace[b].submit_s));
        let arrivals: VecDeque<usize> = order.into();
        let start = arrivals.front().map_or(0.0, |&j| trace[j].submit_s);
        Self {
            trace,
            config,
            policy_name: policy.name.clone(),
            learned: policy.learned_estimates,
            measure_s: policy.measure_s,
            families: Families::new(),
            engine: Admission::new(policy),
            arrivals,
            start,
            t: start,
            ticks: 0,
            next_tick: start,
            quiet_ticks: 0,
            steps: 0,
            sim: SimGpus::new(config.gpus, config.gpu_mem_mib),
            windows: vec![GpuWindows::default(); config.gpus],
            locked_until: vec![f64::NEG_INFINITY; config.gpus],
            queue: VecDeque::new(),
            running: Vec::new(),
            finished_at: vec![None; trace.len()],
            outcomes: trace
                .iter()
                .map(|j| JobOutcome {
                    id: j.id.clone(),
                    submit_s: j.submit_s,
                    start_s: None,
                    finish_s: None,
                    gpus: Vec::new(),
                    oom_crashes: 0,
                    failed: false,
                })
                .collect(),
            busy_integral: 0.0,
            energy_j: 0.0,
            oom_crashes: 0,
            failed_jobs: 0,
            end: start,
        }
    }

    fn tick_at(&self, k: u64) -> f64 {
        self.start + k as f64 * self.config.tick_s
    }

    /// Each running job's speed under the interference model.
    fn speeds(&self) -> Vec<f64> {
        let config = self.config;
        let speed_of_gpu: Vec<f64> = (0..config.gpus)
            .map(|g| {
                let n = self.sim.jobs(g) as f64;
                1.0 / (self.sim.demand(g).max(1.0) * (1.0 + config.contention * (n - 1.0).max(0.0)))
            })
            .collect();
        (self.running.iter())
            .map(|r| {
                r.gpus
                    .iter()
                    .map(|&g| speed_of_gpu[g])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect()
    }

    fn next_events(&self, speeds: &[f64]) -> NextEvents {
        let t = self.t;
        NextEvents {
            finish: (self.running.iter().zip(speeds))
                .map(|(r, s)| t + r.remaining / s)
                .fold(f64::INFINITY, f64::min),
            crash: (self.running.iter())
                .filter_map(|r| r.crash_at)
                .fold(f64::INFINITY, f64::min),
            arrival: (self.arrivals.front()).map_or(f64::INFINITY, |&j| self.trace[j].submit_s),
            measure: (self.running.iter())
                .filter(|r| r.measured_mib.is_none())
                .map(|r| r.measure_at)
                .fold(f64::INFINITY, f64::min),
        }
    }

    /// Nothing changes before the next event or settle-lock expiry: skips to the first tick
    /// at or after it.
    ///
    /// # Errors
    /// [`SimError::Stalled`] when no job runs or arrives, no lock expires, and the queue was
    /// refused: it always will be.
    fn skip_quiet(&mut self, next: &NextEvents) -> Result<(), SimError> {
        let t = self.t;
        let next_unlock = (self.locked_until.iter().copied())
            .filter(|&l| l > t)
            .fold(f64::INFINITY, f64::min);
        let until = next
            .finish
            .min(next.crash)
            .min(next.arrival)
            .min(next_unlock)
            .min(next.measure);
        if until == f64::INFINITY {
            return Err(SimError::Stalled {
                policy: self.policy_name.clone(),
                queued: self.queue.len(),
            });
        }
        // Saturating cast; bounded inputs keep it far below u64::MAX.
        let k = ((until - self.start) / self.config.tick_s).ceil() as u64;
        self.ticks = self.ticks.max(k);
        self.next_tick = self.tick_at(self.ticks);
        Ok(())
    }

    /// Moves the clock to `next`: the running jobs progress at their `speeds`, the GPUs'
    /// busy time and energy accrue.
    fn advance(&mut self, next: f64, speeds: &[f64]) {
        let dt = next - self.t;
        for (r, s) in self.running.iter_mut().zip(speeds) {
            r.remaining -= s * dt;
            // A remainder the clock can no longer step to (its finish rounds to `next`) is
            // done: left alone it would make steps of zero, forever.
            if next + r.remaining / s <= next {
                r.remaining = 0.0;
            }
        }
        let config = self.config;
        for g in 0..config.gpus {
            let util = self.sim.demand(g).min(1.0);
            self.busy_integral += util * dt;
            self.energy_j += (config.idle_w + (config.max_w - config.idle_w) * util) * dt;
        }
        self.t = next;
    }

    /// Crashes, then completions; a crashed job is requeued ahead of the others with a
    /// raised estimate, or fails after its retries. Returns whether anything ended.
    fn end_crashes_and_completions(&mut self) -> bool {
        let (t, trace, config) = (self.t, self.trace, self.config);
        let mut changed = false;
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            let crashed = r.crash_at.is_some_and(|c| c <= t + EPS);
            let done = !crashed && r.remaining <= EPS * trace[r.queued.job].duration_s.max(1.0);
            if !(crashed || done) {
                i += 1;
                continue;
            }
            let r = self.running.swap_remove(i);
            self.sim.remove(r.queued.job as u64);
            self.end = t;
            changed = true;
            if done {
                self.finished_at[r.queued.job] = Some(t);
                continue;
            }
            self.oom_crashes += 1;
            self.outcomes[r.queued.job].oom_crashes += 1;
            let job = &trace[r.queued.job];
            let peak = job.mem_mib.min(r.limit_mib.unwrap_or(u64::MAX));
            if self.learned {
                // What it held when it died is at least what its family needs.
                self.families.observe(&family_of(trace, r.queued.job), peak);
                if let Some(declared) = r.queued.declared_mib {
                    self.families.observe_declared(declared, peak);
                }
            }
            if r.queued.crashes >= config.max_oom_retries {
                self.failed_jobs += 1;
                self.outcomes[r.queued.job].failed = true;
                continue;
            }
            // With learned estimates the retry asks for its observed peak (×1.1) and runs
            // alone, uncapped, until measured; otherwise 1.5 × the old estimate.
            let (raised, basis) = if self.learned {
                (learned_estimate(peak), Basis::Measured)
            } else {
                (
                    r.queued.estimate_mib.saturating_mul(3).div_ceil(2),
                    r.queued.basis,
                )
            };
            self.queue.push_front(Queued {
                job: r.queued.job,
                declared_mib: r.queued.declared_mib,
                estimate_mib: raised.min(config.gpu_mem_mib),
                basis,
                exclusive: true,
                crashes: r.queued.crashes + 1,
            });
        }
        changed
    }

    /// A job that has run `measure_s` seconds shows its peak; with learned estimates, its
    /// family's queued guesses take it. Returns whether any job was measured.
    fn measure(&mut self) -> bool {
        let (t, trace) = (self.t, self.trace);
        let mut changed = false;
        for r in &mut self.running {
            if r.measured_mib.is_some() || r.measure_at > t + EPS {
                continue;
            }
            let peak = trace[r.queued.job]
                .mem_mib
                .min(r.limit_mib.unwrap_or(u64::MAX));
            r.measured_mib = Some(peak);
            changed = true;
            if self.learned {
                let family = family_of(trace, r.queued.job);
                self.families.observe(&family, peak);
                if let Some(declared) = r.queued.declared_mib {
                    self.families.observe_declared(declared, peak);
                }
                let estimate = learned_estimate(self.families.peak(&family).unwrap_or(peak));
                for q in (self.queue.iter_mut())
                    .filter(|q| q.basis == Basis::Guess && family_of(trace, q.job) == family)
                {
                    q.estimate_mib = estimate;
                    q.basis = Basis::Measured;
                }
            }
        }
        changed
    }

    /// Queues the jobs submitted by now. Returns whether any arrived.
    fn arrive(&mut self) -> bool {
        let (t, trace, config) = (self.t, self.trace, self.config);
        let mut changed = false;
        while let Some(&j) = self.arrivals.front() {
            if trace[j].submit_s > t + EPS {
                break;
            }
            self.arrivals.pop_front();
            changed = true;
            let declared = trace[j]
                .declared
                .then(|| (trace[j].mem_mib as f64 * config.estimate_scale).ceil() as u64);
            let estimate = if self.learned || declared.is_some() {
                (self.families).estimate(
                    &family_of(trace, j),
                    declared,
                    config.default_estimate_mib,
                )
            } else {
                Families::new().estimate("", None, config.default_estimate_mib)
            };
            self.queue.push_back(Queued {
                job: j,
                declared_mib: declared,
                estimate_mib: estimate.mib,
                basis: estimate.basis,
                exclusive: false,
                crashes: 0,
            });
        }
        changed
    }

    /// Telemetry, when a tick is due. Returns whether one was.
    fn sample(&mut self) -> bool {
        let ticked = self.t + EPS >= self.next_tick;
        if ticked {
            for (g, w) in self.windows.iter_mut().enumerate() {
                if let Ok(sample) = self.sim.sample(g) {
                    w.push(sample);
                }
            }
            self.ticks = self.ticks.saturating_add(1);
            self.next_tick = self.tick_at(self.ticks);
        }
        ticked
    }

    /// The GPUs as admission sees them now: telemetry, settle locks, the running jobs.
    fn gpu_states(&self) -> Vec<GpuState> {
        let mut states: Vec<GpuState> = (self.sim.gpus().iter())
            .zip(&self.windows)
            .zip(&self.locked_until)
            .map(|((info, w), &locked_until)| GpuState {
                locked_until,
                window_full: windows_full(w),
                ..GpuState::observed(info, w)
            })
            .collect();
        for r in &self.running {
            for &g in &r.gpus {
                let s = &mut states[g];
                s.jobs += 1;
                s.reserved_mib = s
                    .reserved_mib
                    .saturating_add(r.reservation_mib(self.learned));
                s.exclusive_job |= r.exclusive;
                s.unmeasured_jobs += u32::from(r.until_measured && r.measured_mib.is_none());
                if let Some(feed) = &self.trace[r.queued.job].feed {
                    s.feeds.push(feed.clone());
                }
            }
        }
        states
    }

    /// One admission round over the queue; starts what it places. Returns whether it
    /// placed anything.
    fn admit(&mut self) -> bool {
        let (t, trace, config) = (self.t, self.trace, self.config);
        let mut states = self.gpu_states();
        if self.learned {
            // A declaration is checked against what measured jobs showed, as of now.
            for q in self.queue.iter_mut().filter(|q| q.basis == Basis::Declared) {
                if let Some(declared) = q.declared_mib {
                    q.estimate_mib = self.families.checked_declared(declared);
                }
            }
        }
        let mut offered: Vec<&Queued> = self.queue.iter().collect();
        if let Some(rank) = &config.queue_order {
            // Stable: equal ranks keep the queue's (arrival) order.
            offered.sort_by_key(|q| rank[q.job]);
        }
        let pending: Vec<Pending> = offered
            .into_iter()
            .map(|q| Pending {
                id: q.job as u64,
                estimate_mib: q.estimate_mib,
                basis: q.basis,
                family: family_of(trace, q.job),
                gpus: trace[q.job].gpus,
                exclusive: q.exclusive,
                feed: trace[q.job].feed.clone(),
                only: None,
            })
            .collect();
        let placements = self.engine.admit(t, &pending, &mut states);
        for (g, s) in states.iter().enumerate() {
            self.locked_until[g] = s.locked_until;
        }
        let changed = !placements.is_empty();
        for placement in placements {
            self.start_job(placement);
        }
        changed
    }

    /// Starts a placed job on its GPUs; it will crash out of memory if it exceeds its limit
    /// or its GPUs' memory.
    fn start_job(&mut self, placement: Placement) {
        let Placement {
            job,
            gpus,
            exclusive,
            until_measured,
            mem_limit_mib,
        } = placement;
        let (t, config) = (self.t, self.config);
        let job = job as usize;
        let Some(at) = self.queue.iter().position(|q| q.job == job) else {
            return;
        };
        let Some(queued) = self.queue.remove(at) else {
            return;
        };
        let spec = &self.trace[job];
        let load = SimLoad {
            mem_mib: spec.mem_mib,
            sm: spec.sm_activity,
        };
        for &g in &gpus {
            self.sim.place(g, job as u64, load);
        }
        let over_limit = mem_limit_mib.is_some_and(|l| spec.mem_mib > l);
        let over_gpu = (gpus.iter()).any(|&g| self.sim.memory_mib(g) > config.gpu_mem_mib);
        let crash_at =
            (over_limit || over_gpu).then(|| t + config.oom_after_s.min(spec.duration_s));
        self.outcomes[job].start_s = Some(t);
        self.outcomes[job].gpus.clone_from(&gpus);
        self.running.push(Running {
            queued,
            gpus,
            remaining: spec.duration_s,
            crash_at,
            limit_mib: mem_limit_mib,
            measure_at: t + self.measure_s,
            measured_mib: None,
            exclusive,
            until_measured,
        });
    }

    /// The report, the jobs' outcomes and the steps taken.
    fn report(mut self) -> (SimReport, Vec<JobOutcome>, u64) {
        let (trace, config) = (self.trace, self.config);
        let completed: Vec<f64> = (self.finished_at.iter())
            .zip(trace)
            .filter_map(|(f, j)| f.map(|f| f - j.submit_s))
            .collect();
        let makespan_s = self.end - self.start;
        for (o, f) in self.outcomes.iter_mut().zip(&self.finished_at) {
            o.finish_s = *f;
        }
        let report = SimReport {
            makespan_s,
            mean_jct_s: if completed.is_empty() {
                0.0
            } else {
                completed.iter().sum::<f64>() / completed.len() as f64
            },
            mean_gpu_util: if makespan_s > 0.0 {
                self.busy_integral / (makespan_s * config.gpus as f64)
            } else {
                0.0
            },
            oom_crashes: self.oom_crashes,
            energy_kwh: self.energy_j / 3.6e6,
            failed_jobs: self.failed_jobs,
            jobs: trace.len(),
            lower_bound_s: LowerBound::of(trace, config).bound_s(),
        };
        (report, self.outcomes, self.steps)
    }
}
