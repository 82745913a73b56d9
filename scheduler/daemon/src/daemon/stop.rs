//! Stopping with the jobs ([`DaemonConfig::stop_jobs`](super::DaemonConfig::stop_jobs)):
//! SIGTERM to every running job's process group, a grace to end, then SIGKILL, reaping
//! all the while with the lock released between rounds so the socket still answers.

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use crate::job::JobId;
use crate::sys;

use super::{Daemon, Shared};

/// How long SIGKILLed jobs may take to be reaped before the daemon stops without them (a
/// process in uninterruptible sleep, e.g. on a hung file system, ends only when it wakes).
const KILL_WAIT: Duration = Duration::from_secs(30);

/// [`DaemonConfig::stop_jobs`](super::DaemonConfig::stop_jobs): SIGTERM to every running
/// job's group, up to `grace` for them to end (reaped and journaled as usual), then SIGKILL
/// to every group with a live process left, and up to [`KILL_WAIT`] for those. The lock is
/// released while waiting, so the socket still answers.
pub(super) fn stop_jobs<'a>(
    shared: &'a Shared,
    mut state: MutexGuard<'a, Daemon>,
    grace: Duration,
) -> MutexGuard<'a, Daemon> {
    let groups = state.signal_running(sys::Signal::TERM, true);
    if state.jobs.running().next().is_none() {
        return state;
    }
    tracing::info!(
        jobs = groups.len(),
        grace_s = grace.as_secs_f64(),
        "stopping: SIGTERM sent to every running job"
    );
    state = wait_for(shared, state, Instant::now() + grace, |_| true);
    let left: Vec<sys::ProcessId> = groups
        .iter()
        .copied()
        .filter(|g| sys::group_alive(g.pid))
        .collect();
    if !left.is_empty() {
        let pids: Vec<u32> = left.iter().map(|g| g.pid).collect();
        tracing::warn!(groups = ?pids, "still running after the grace: SIGKILL");
        for g in &left {
            if let Err(e) = g.signal_group(sys::Signal::KILL) {
                tracing::debug!(group = g.pid, "SIGKILL: {e}");
            }
        }
    }
    state = wait_for(shared, state, Instant::now() + KILL_WAIT, |_| {
        !left.iter().any(|g| sys::group_alive(g.pid))
    });
    let running: Vec<JobId> = state.jobs.running().map(|(j, _)| j.id).collect();
    if !running.is_empty() {
        tracing::warn!(
            jobs = ?running,
            "jobs still running after SIGKILL; the next daemon on this directory adopts them"
        );
    }
    state
}

/// Reaps until no job runs and `done` holds, or until `deadline`, releasing the lock in
/// between.
fn wait_for<'a>(
    shared: &'a Shared,
    mut state: MutexGuard<'a, Daemon>,
    deadline: Instant,
    done: impl Fn(&Daemon) -> bool,
) -> MutexGuard<'a, Daemon> {
    loop {
        state.reap();
        let now = Instant::now();
        if (state.jobs.running().next().is_none() && done(&state)) || now >= deadline {
            return state;
        }
        let wait = deadline
            .saturating_duration_since(now)
            .min(Duration::from_millis(20));
        state = shared
            .wake
            .wait_timeout(state, wait)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}
