//! The GPUs as the daemon sees them: telemetry sampled at 1 Hz into windows, each job's
//! memory read from the GPUs' process lists (its process group's, so a data-loader child
//! counts), a job's peak **measured** once it has been seen on its GPUs for the policy's
//! `measure_s` with their telemetry windows full (journaled as `measured`: its family
//! learns it, and a job placed alone until measured may take neighbours), and the
//! [`GpuState`]s admission decides on (the fields and their meaning: the module docs of
//! [`crate::policy`], "What the caller fills").
//!
//! A job that is never seen on its GPU (it has not created its CUDA context, or never
//! will) is never measured: if it was placed alone until measured, its GPUs take no other
//! job while it runs. That is the safe reading of a job nothing is known about.
//!
//! ## Settle on the process seen
//! After a dispatch a GPU takes no further job until the new job's process is seen on it
//! plus [`SEEN_GRACE_S`] (its allocations show), and never longer than the policy's
//! `settle_s` after the dispatch (a job that never touches its GPU does not hold it). On
//! simulated GPUs a job is seen the moment it starts.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use crate::job::learned_estimate;
use crate::journal::Record;
use crate::policy::{GpuState, Pending, windows_full};
use crate::sys;
use crate::telemetry::ProcessMemory;

use super::{Daemon, SIM_MARKER};

/// Seconds a GPU stays settling after a new job's process is first seen on it.
pub const SEEN_GRACE_S: f64 = 5.0;

/// Parses a [`SIM_MARKER`] line.
pub(super) fn parse_sim_marker(line: &str) -> Option<(Option<u64>, Option<f64>)> {
    let rest = line.trim().strip_prefix(SIM_MARKER)?;
    let (mut mem, mut sm) = (None, None);
    for field in rest.split_whitespace() {
        if let Some(v) = field.strip_prefix("mem_mib=") {
            mem = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("sm=") {
            sm = v.parse::<f64>().ok().filter(|x| (0.0..=1.0).contains(x));
        }
    }
    Some((mem, sm))
}

/// Each process group's device memory on its busiest GPU, MiB, from the GPUs' process
/// lists: a job's processes on one GPU add up, and a job's peak is per GPU, like its
/// estimate. `group_of` maps a pid to its process group (`None`: gone).
fn memory_by_group(
    per_gpu: &[Vec<ProcessMemory>],
    group_of: impl Fn(u32) -> Option<u32>,
) -> HashMap<u32, u64> {
    let mut by_group: HashMap<u32, u64> = HashMap::new();
    for processes in per_gpu {
        let mut on_gpu: HashMap<u32, u64> = HashMap::new();
        for p in processes {
            if let Some(pgid) = group_of(p.pid) {
                let sum = on_gpu.entry(pgid).or_default();
                *sum = sum.saturating_add(p.used_mib);
            }
        }
        for (pgid, mib) in on_gpu {
            let e = by_group.entry(pgid).or_default();
            *e = (*e).max(mib);
        }
    }
    by_group
}

/// Ends each GPU's settle lock [`SEEN_GRACE_S`] after the *newest* job on it (the one the
/// lock is for) was seen; `running` is each job's GPUs, when it was started and when it was
/// first seen. An older job seen long ago ends nothing: the lock waits for the new one.
fn settle_on_seen(locked_until: &mut [f64], running: &[(&[usize], f64, Option<f64>)]) {
    for (g, lock) in locked_until.iter_mut().enumerate() {
        let newest = running
            .iter()
            .filter(|(gpus, _, _)| gpus.contains(&g))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some(&(_, _, Some(seen))) = newest {
            *lock = lock.min(seen + SEEN_GRACE_S);
        }
    }
}

impl Daemon {
    /// Samples every GPU once, updates the running jobs' peaks and when they were first
    /// seen, and journals the measurements that became due.
    pub(super) fn sample(&mut self) {
        if self.telemetry.simulated().is_some() {
            self.read_sim_markers();
        }
        let mut processes = Vec::with_capacity(self.gpus.len());
        for g in 0..self.gpus.len() {
            match self.telemetry.sample(g) {
                Ok(sample) => {
                    for gap in &sample.gaps {
                        tracing::debug!(gpu = g, call = %gap.call, "telemetry gap: {}", gap.error);
                    }
                    processes.push(sample.processes.clone());
                    let theirs = (sample.gpu_processes.iter().flatten())
                        .find(|p| p.is_other_users_mps_server())
                        .map(|p| p.pid);
                    if theirs.is_some() != self.others_mps[g] && !self.mps_env.is_empty() {
                        match theirs {
                            Some(pid) => tracing::warn!(
                                gpu = g,
                                pid,
                                "another user's MPS server runs on this GPU: it takes no job \
                                 under this scheduler's MPS until that server is gone (MPS \
                                 serves one user per GPU at a time)"
                            ),
                            None => tracing::info!(gpu = g, "the other user's MPS server is gone"),
                        }
                    }
                    self.others_mps[g] = theirs.is_some();
                    self.windows[g].push(sample);
                    self.stale[g] = false;
                }
                Err(e) => {
                    if !self.stale[g] {
                        tracing::warn!(
                            gpu = g,
                            "telemetry: {e}; the GPU takes no job until it answers"
                        );
                    }
                    self.stale[g] = true;
                }
            }
        }
        let now = self.now();
        if self.telemetry.simulated().is_none() {
            let by_group = memory_by_group(&processes, sys::process_group);
            for (job, attempt) in self.jobs.running() {
                let (Some(live), Some(pid)) = (self.live.get_mut(&job.id), attempt.pid) else {
                    continue;
                };
                if let Some(&mib) = by_group.get(&pid) {
                    live.peak_mib = live.peak_mib.max(Some(mib));
                    live.seen_at.get_or_insert(now);
                }
            }
        }
        self.settle_seen();
        self.measure(now);
    }

    /// Ends the settle lock of GPUs whose newest job has been seen (plus the grace).
    fn settle_seen(&mut self) {
        let running: Vec<(&[usize], f64, Option<f64>)> = self
            .jobs
            .running()
            .filter_map(|(job, attempt)| {
                let live = self.live.get(&job.id)?;
                Some((&attempt.gpus[..], live.since, live.seen_at))
            })
            .collect();
        settle_on_seen(&mut self.locked_until, &running);
    }

    /// Journals the peak of every running attempt seen for the policy's `measure_s` with
    /// its GPUs' windows full, and not yet measured.
    fn measure(&mut self, now: f64) {
        let measure_s = self.engine.policy().measure_s;
        let due: Vec<Record> = self
            .jobs
            .running()
            .filter(|(job, attempt)| {
                !job.measured
                    && attempt
                        .gpus
                        .iter()
                        .all(|&g| self.windows.get(g).is_some_and(windows_full))
            })
            .filter_map(|(job, attempt)| {
                let live = self.live.get(&job.id)?;
                let seen = live.seen_at?;
                (now - seen >= measure_s).then_some(Record::Measured {
                    id: job.id,
                    attempt: attempt.number,
                    peak_mib: live.peak_mib?,
                })
            })
            .collect();
        for record in due {
            if let Record::Measured { id, peak_mib, .. } = &record {
                tracing::info!(job = id, peak_mib, "measured");
            }
            self.note(record);
        }
    }

    /// Sim mode: read what jobs printed about their memory and SM demand.
    pub(super) fn read_sim_markers(&mut self) {
        let files = self.files.clone();
        let mut updates = Vec::new();
        for (job, attempt) in self.jobs.running() {
            let Some(run) = self.live.get_mut(&job.id) else {
                continue;
            };
            let path = files.stdout(job.id, attempt.number);
            let Ok(mut f) = File::open(&path) else {
                continue;
            };
            if f.seek(SeekFrom::Start(run.stdout_read)).is_err() {
                continue;
            }
            let mut bytes = Vec::new();
            let _ = (&mut f).take(1 << 20).read_to_end(&mut bytes);
            let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            run.stdout_read += complete as u64;
            let text = String::from_utf8_lossy(&bytes[..complete]);
            let mut changed = false;
            for (mem, sm) in text.lines().filter_map(parse_sim_marker) {
                if let Some(mem) = mem {
                    run.sim_load.mem_mib = mem;
                    // Its first report replaces the estimate it held until then.
                    run.peak_mib = if run.reported {
                        run.peak_mib.max(Some(mem))
                    } else {
                        Some(mem)
                    };
                    run.reported = true;
                }
                if let Some(sm) = sm {
                    run.sim_load.sm = sm;
                }
                changed = true;
            }
            if changed {
                updates.push((job.id, attempt.gpus.clone(), run.sim_load));
            }
        }
        if let Some(sim) = self.telemetry.simulated() {
            for (id, gpus, load) in updates {
                for g in gpus {
                    sim.place(g, id, load);
                }
            }
        }
    }

    /// Whether `pid`, a process on a GPU, is one of the scheduler's jobs (a member of a
    /// running attempt's process group; on simulated GPUs a job shows as its id).
    fn is_ours(&self, pid: u32) -> bool {
        if self.simulated {
            return self.jobs.running().any(|(job, _)| u64::from(pid) == job.id);
        }
        let Some(group) = sys::process_group(pid) else {
            return false;
        };
        self.jobs.running().any(|(_, a)| a.pid == Some(group))
    }

    /// The GPUs as admission sees them: telemetry (windows, other users' processes, a
    /// failed sample), then the scheduler's own jobs.
    fn gpu_states(&self) -> Vec<GpuState> {
        let mut states: Vec<GpuState> = Vec::with_capacity(self.gpus.len());
        for (g, (info, windows)) in self.gpus.iter().zip(&self.windows).enumerate() {
            let mut state = GpuState::observed(info, windows);
            state.locked_until = self.locked_until[g];
            state.window_full = windows_full(windows);
            state.unusable |= self.stale[g];
            // Under this scheduler's MPS, a GPU another user's MPS server holds is theirs.
            state.unusable |= self.others_mps[g] && !self.mps_env.is_empty();
            state.count_foreign(windows, |pid| self.is_ours(pid));
            states.push(state);
        }
        for (job, attempt) in self.jobs.running() {
            let measured_peak = job
                .measured
                .then_some(job.peak_mib)
                .flatten()
                .map_or(0, learned_estimate);
            for &g in &attempt.gpus {
                if let Some(s) = states.get_mut(g) {
                    s.jobs += 1;
                    // Saturating: a journal from before sizes were bounded may hold any u64.
                    s.reserved_mib = s
                        .reserved_mib
                        .saturating_add(attempt.estimate_mib.max(measured_peak));
                    s.exclusive_job |= attempt.exclusive;
                    s.unmeasured_jobs += u32::from(attempt.until_measured && !job.measured);
                    s.feeds.extend(job.spec.feed.clone());
                }
            }
        }
        // A GPU in EXCLUSIVE_PROCESS mode without MPS runs one process: one job.
        for (s, max_jobs) in states.iter_mut().zip(&self.max_jobs) {
            if max_jobs.is_some_and(|m| s.jobs as usize >= m) {
                s.exclusive_job = true;
            }
        }
        states
    }

    /// Starts what admission places now.
    pub(super) fn admit(&mut self) {
        if self.jobs.queue.is_empty() {
            return;
        }
        self.admission_rounds += 1;
        self.confine_queued();
        let now = self.now();
        let mut states = self.gpu_states();
        // Data-aware: feeds' decode threads and jobs that decode for themselves share the
        // cores; a consumer of a feed costs none.
        let mut free_cpus = self.cpu_cores.saturating_sub(self.cpus_busy());
        // Host memory likewise: feeds' rings, the cache's budget and jobs that state theirs.
        let mut free_mem = self.host_mem().free_mib();
        let pending: Vec<Pending> = self
            .jobs
            .queue
            .iter()
            .filter_map(|id| self.jobs.jobs.get(id))
            .filter(|j| {
                let cpus = j.spec.cpus.unwrap_or(0);
                let mem = j.spec.host_mem_mib.unwrap_or(0);
                // Held until cores and memory free up.
                let fits = cpus <= free_cpus && mem <= free_mem;
                if fits {
                    free_cpus -= cpus;
                    free_mem -= mem;
                }
                fits
            })
            .map(|j| {
                let estimate = self.jobs.current_estimate(j, self.default_estimate_mib);
                Pending {
                    id: j.id,
                    estimate_mib: estimate.mib,
                    basis: estimate.basis,
                    family: j.family.clone(),
                    gpus: j.spec.gpus,
                    exclusive: j.exclusive,
                    feed: j.spec.feed.clone(),
                    only: self.confined.get(&j.id).cloned().flatten(),
                }
            })
            .collect();
        let placements = self.engine.admit(now, &pending, &mut states);
        for (i, s) in states.iter().enumerate() {
            self.locked_until[i] = s.locked_until;
        }
        for p in placements {
            let estimate_mib = pending
                .iter()
                .find(|q| q.id == p.job)
                .map_or(self.default_estimate_mib, |q| q.estimate_mib);
            self.launch(&p, estimate_mib);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settle_lock_waits_for_the_newest_job_not_an_older_one_seen_long_ago() {
        // GPU 0: a job seen at 10 s, and one started at 100 s not seen yet (lock to 120 s).
        let mut locks = vec![120.0, 120.0];
        let (g0, g1): (&[usize], &[usize]) = (&[0], &[1]);
        settle_on_seen(&mut locks, &[(g0, 5.0, Some(10.0)), (g0, 100.0, None)]);
        assert_eq!(locks[0], 120.0, "the older job's sighting ends nothing");
        // Once the new one is seen at 101 s, the lock ends 5 s later.
        settle_on_seen(
            &mut locks,
            &[(g0, 5.0, Some(10.0)), (g0, 100.0, Some(101.0))],
        );
        assert_eq!(locks[0], 101.0 + SEEN_GRACE_S);
        // Never later than the lock the dispatch set.
        settle_on_seen(&mut locks, &[(g1, 100.0, Some(200.0))]);
        assert_eq!(locks[1], 120.0);
    }

    #[test]
    fn sim_markers_are_read_from_job_output() {
        assert_eq!(
            parse_sim_marker("ladle-sim: mem_mib=3000 sm=0.4"),
            Some((Some(3000), Some(0.4)))
        );
        assert_eq!(parse_sim_marker("ladle-sim: sm=7"), Some((None, None)));
        assert_eq!(parse_sim_marker("epoch 1 loss 0.3"), None);
    }

    #[test]
    fn a_jobs_memory_sums_its_processes_per_gpu_and_peaks_over_gpus() {
        let p = |pid, used_mib| ProcessMemory { pid, used_mib };
        // Group 100 = pids 1, 2 (a job and its data-loader child); group 200 = pid 3.
        let group = |pid: u32| match pid {
            1 | 2 => Some(100),
            3 => Some(200),
            _ => None,
        };
        let per_gpu = vec![
            vec![p(1, 3000), p(2, 500), p(3, 700), p(9, 9999)],
            vec![p(1, 4000), p(3, 100)],
        ];
        let by_group = memory_by_group(&per_gpu, group);
        assert_eq!(by_group.get(&100), Some(&4000));
        assert_eq!(by_group.get(&200), Some(&700));
        assert_eq!(by_group.len(), 2, "processes that are gone are ignored");
    }
}
