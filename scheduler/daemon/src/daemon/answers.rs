//! The answers that could grow without end, each built to fit in one frame ([`MAX_FRAME`]).
//!
//! Jobs are never forgotten, logs and feeds are outside input: no answer lists all of
//! anything. Each is filled under a [`Room`] (what is left of a frame once the answer's
//! fixed part is written, counted in JSON bytes), in order of what matters most, and says
//! what it left out:
//!
//! | answer | listed first | left out, said in |
//! |---|---|---|
//! | `Queue` | running, queued, then the latest [`QUEUE_FINISHED`] finished jobs | `omitted` (with [`JobTotals`] over every job) |
//! | `Jobs` | the matching jobs by id ascending, a page | `next`: the id to ask after |
//! | `Logs` | the latest attempt (tails cut from the front), then older ones | `omitted` |
//! | `Feeds` | live feeds by name | `omitted` |
//!
//! A job whose view alone is over [`MAX_JOB_VIEW`] (a command of megabytes) is shown cut,
//! so every page holds at least one job and paging always moves on.

use std::collections::BTreeSet;
use std::io::Write;
use std::ops::Bound;

use serde::Serialize;

use crate::job::{JobId, JobState};
use crate::policy::windows_full;
use crate::protocol::{
    AttemptLogs, GpuView, JobQuery, JobTotals, JobView, LOG_TAIL, MAX_FRAME, QUEUE_FINISHED,
    Response,
};

use super::Daemon;
use super::launch::tail;
use super::state::Job;

/// Largest job view an answer carries, JSON bytes; a larger one is shown cut
/// ([`fit_view`]).
pub(super) const MAX_JOB_VIEW: usize = 64 * 1024;

/// Counts what is written to it.
struct Counter(usize);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Length of `item` as JSON, bytes (as many as there are for something JSON cannot hold).
pub(super) fn json_len(item: &impl Serialize) -> usize {
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, item) {
        Ok(()) => counter.0,
        Err(_) => usize::MAX,
    }
}

/// What is left of a frame for an answer's list items.
struct Room(usize);

impl Room {
    /// The room `empty` leaves: the answer with empty lists and its counters at their
    /// widest, framed.
    fn after(empty: &Response) -> Self {
        let framed = crate::protocol::encode_frame(empty).map_or(usize::MAX, |l| l.len());
        Self(MAX_FRAME.saturating_sub(framed))
    }

    /// Whether `item` fits as one more element of a list (its comma included).
    fn fits(&self, item: &impl Serialize) -> bool {
        json_len(item).saturating_add(1) <= self.0
    }

    /// Takes the room for `item` if it fits.
    fn take(&mut self, item: &impl Serialize) -> bool {
        let n = json_len(item).saturating_add(1);
        if n > self.0 {
            return false;
        }
        self.0 -= n;
        true
    }
}

/// `s` cut to at most `max` bytes (at a character boundary), with a mark that it was.
fn cut(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
}

/// `s` without its front, so that at most `max` bytes are left (at a character boundary).
fn cut_front(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s.drain(..start);
}

/// `view` as it is when it is at most [`MAX_JOB_VIEW`] bytes; else with its command,
/// environment, family and reason cut (and, if that is still not enough, replaced by a
/// note of their size).
/// Whether a variable's value is kept out of answers and logs: its name holds KEY, TOKEN,
/// SECRET or PASSWORD, in any case.
pub(crate) fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD"]
        .iter()
        .any(|word| name.contains(word))
}

pub(super) fn fit_view(mut view: JobView) -> JobView {
    if json_len(&view) <= MAX_JOB_VIEW {
        return view;
    }
    const ARGS: usize = 16;
    let args = view.spec.command.len();
    view.spec.command.truncate(ARGS);
    for arg in &mut view.spec.command {
        cut(arg, 256);
    }
    if args > ARGS {
        view.spec
            .command
            .push(format!("… {} more arguments", args - ARGS));
    }
    view.spec.env.truncate(ARGS);
    for (name, value) in &mut view.spec.env {
        cut(name, 64);
        cut(value, 256);
    }
    for name in [&mut view.spec.feed, &mut view.spec.family]
        .into_iter()
        .flatten()
    {
        cut(name, 256);
    }
    cut(&mut view.family, 256);
    if let JobState::Failed { reason } | JobState::Interrupted { reason } = &mut view.state {
        cut(reason, 1024);
    }
    if view.spec.cwd.as_os_str().len() > 1024 {
        view.spec.cwd = "…".into();
    }
    if json_len(&view) > MAX_JOB_VIEW {
        // Control characters escape to six bytes each: say what there was instead.
        let bytes = json_len(&view.spec);
        view.spec.command = vec![format!("(a command of {bytes} bytes, too long to show)")];
        view.spec.env.clear();
        view.spec.feed = None;
        view.spec.family = None;
        view.family.clear();
        if let JobState::Failed { reason } | JobState::Interrupted { reason } = &mut view.state {
            cut(reason, 64);
        }
    }
    view
}

impl Daemon {
    /// How `ladle queue` shows `job`.
    fn job_view(&self, j: &Job) -> JobView {
        // Of the environment, only ladle's variables (`LADLE_RUN` names a sweep's run): a
        // submitter's whole environment is large and holds secrets.
        let mut spec = j.spec.clone();
        spec.env
            .retain(|(name, _)| name.starts_with("LADLE_") && !is_secret(name));
        fit_view(JobView {
            id: j.id,
            spec,
            state: j.state(),
            estimate_mib: j.estimate.mib,
            basis: j.estimate.basis,
            family: j.family.clone(),
            measured: j.measured,
            exclusive: j.exclusive,
            attempts: j.attempts,
            oom_retries: j.oom_retries,
            peak_mib: j
                .peak_mib
                .max(self.live.get(&j.id).and_then(|l| l.peak_mib)),
            cpu_s: j.cpu_s,
            submitted_at: j.submitted_at,
        })
    }

    fn gpu_views(&self) -> Vec<GpuView> {
        let mut counts = vec![0u32; self.gpus.len()];
        for (_, attempt) in self.jobs.running() {
            for &g in &attempt.gpus {
                if let Some(c) = counts.get_mut(g) {
                    *c += 1;
                }
            }
        }
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, info)| {
                let last = self.windows[i].last.as_ref();
                GpuView {
                    info: info.clone(),
                    memory_used_mib: last.map_or(0, |s| s.memory_used_mib),
                    sm_activity_risk: self.windows[i].risk().sm_activity,
                    utilization: last.map_or(0.0, |s| s.utilization),
                    sm_activity: last.and_then(|s| s.sm_activity),
                    jobs: counts[i],
                    window_full: windows_full(&self.windows[i]),
                }
            })
            .collect()
    }

    fn totals(&self) -> JobTotals {
        let mut t = JobTotals::default();
        for j in self.jobs.jobs.values() {
            match j.state() {
                JobState::Running { .. } => t.running += 1,
                JobState::Succeeded => t.succeeded += 1,
                JobState::Cancelled => t.cancelled += 1,
                JobState::Interrupted { .. } => t.interrupted += 1,
                s if !s.is_final() => t.queued += 1,
                _ => t.failed += 1,
            }
            t.admissions += u64::from(j.attempts);
            t.oom_retries += u64::from(j.oom_retries);
        }
        t
    }

    /// The `Queue` overview: every running job, every queued one, the latest
    /// [`QUEUE_FINISHED`] finished ones, as many as fit, listed oldest first.
    pub(super) fn queue_view(&self) -> Response {
        let mut answer = Response::Queue {
            policy: self.engine.policy().name.clone(),
            jobs: Vec::new(),
            gpus: self.gpu_views(),
            totals: self.totals(),
            omitted: u64::MAX,
            admission_rounds: u64::MAX,
            gpus_from: self.gpus_from.clone(),
        };
        let mut room = Room::after(&answer);
        let all = self.jobs.jobs.values();
        let running = all.clone().filter(|j| j.attempt().is_some());
        let waiting = all
            .clone()
            .filter(|j| j.attempt().is_none() && !j.state().is_final());
        let finished = all
            .rev()
            .filter(|j| j.state().is_final())
            .take(QUEUE_FINISHED);
        let mut listed = Vec::new();
        for job in running.chain(waiting).chain(finished) {
            let view = self.job_view(job);
            if !room.take(&view) {
                break;
            }
            listed.push(view);
        }
        listed.sort_by_key(|j| j.id);
        if let Response::Queue {
            jobs,
            omitted,
            admission_rounds,
            ..
        } = &mut answer
        {
            *omitted = (self.jobs.jobs.len() - listed.len()) as u64;
            *admission_rounds = self.admission_rounds;
            *jobs = listed;
        }
        answer
    }

    /// A page of the jobs `query` asks for.
    pub(super) fn jobs_page(&self, query: &JobQuery) -> Response {
        let named: BTreeSet<JobId> = query.ids.iter().copied().collect();
        let unknown: Vec<JobId> = named
            .iter()
            .copied()
            .filter(|id| !self.jobs.jobs.contains_key(id))
            .collect();
        let from = query.after.map_or(Bound::Unbounded, Bound::Excluded);
        let candidates: Box<dyn Iterator<Item = &Job>> = if named.is_empty() {
            Box::new(
                self.jobs
                    .jobs
                    .range((from, Bound::Unbounded))
                    .map(|(_, j)| j),
            )
        } else {
            Box::new(
                named
                    .range((from, Bound::Unbounded))
                    .filter_map(|id| self.jobs.jobs.get(id)),
            )
        };
        let mut room = Room::after(&Response::Jobs {
            jobs: Vec::new(),
            unknown: unknown.clone(),
            next: Some(JobId::MAX),
        });
        let mut jobs = Vec::new();
        let mut next = None;
        for job in candidates.filter(|j| {
            query
                .feed
                .as_ref()
                .is_none_or(|f| j.spec.feed.as_ref() == Some(f))
        }) {
            let view = self.job_view(job);
            if !room.take(&view) {
                next = jobs.last().map(|j: &JobView| j.id).or(query.after);
                break;
            }
            jobs.push(view);
        }
        Response::Jobs {
            jobs,
            unknown,
            next,
        }
    }

    /// A job's logs: the latest attempt's tails (cut from the front to fit), then older
    /// attempts while they fit.
    pub(super) fn logs(&self, id: JobId) -> Response {
        let Some(job) = self.jobs.jobs.get(&id) else {
            return Response::Error {
                message: format!("no job {id}"),
            };
        };
        let mut room = Room::after(&Response::Logs {
            id,
            attempts: Vec::new(),
            omitted: u32::MAX,
        });
        let mut attempts = Vec::new();
        for attempt in (1..=job.attempts).rev() {
            let stdout_path = self.files.stdout(id, attempt);
            let stderr_path = self.files.stderr(id, attempt);
            let mut logs = AttemptLogs {
                attempt,
                stdout: tail(&stdout_path, LOG_TAIL),
                stderr: tail(&stderr_path, LOG_TAIL),
                stdout_path,
                stderr_path,
            };
            // Binary output escapes to up to six bytes a byte: halve the longer tail
            // until the attempt fits, or both are empty.
            let emptied = |l: &AttemptLogs| l.stdout.is_empty() && l.stderr.is_empty();
            while !room.fits(&logs) && !emptied(&logs) {
                let longer = if logs.stdout.len() >= logs.stderr.len() {
                    &mut logs.stdout
                } else {
                    &mut logs.stderr
                };
                let half = longer.len() / 2;
                cut_front(longer, half);
            }
            if !room.take(&logs) {
                break;
            }
            attempts.push(logs);
        }
        let omitted = job.attempts - attempts.len() as u32;
        attempts.reverse();
        Response::Logs {
            id,
            attempts,
            omitted,
        }
    }

    /// The live feeds, as many as fit.
    pub(super) fn feeds(&mut self) -> Response {
        let (cpu_cores, cpus_busy, host_mem) = (self.cpu_cores, self.cpus_busy(), self.host_mem());
        let mut room = Room::after(&Response::Feeds {
            feeds: Vec::new(),
            cpu_cores,
            cpus_busy,
            host_mem,
            omitted: u32::MAX,
        });
        let (mut feeds, mut omitted) = (Vec::new(), 0u32);
        for feed in self.live_feeds() {
            if omitted == 0 && room.take(&feed.spec) {
                feeds.push(feed.spec.clone());
            } else {
                omitted += 1;
            }
        }
        Response::Feeds {
            feeds,
            cpu_cores,
            cpus_busy,
            host_mem,
            omitted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobSpec;

    fn view(command: Vec<String>) -> JobView {
        JobView {
            id: 1,
            spec: JobSpec::new(command, "/".into()),
            state: JobState::Failed {
                reason: "\u{1}".repeat(1 << 20),
            },
            estimate_mib: 0,
            basis: crate::estimate::Basis::Declared,
            family: "x".repeat(1 << 20),
            measured: false,
            exclusive: false,
            attempts: 1,
            oom_retries: 0,
            peak_mib: None,
            cpu_s: None,
            submitted_at: 0.0,
        }
    }

    #[test]
    fn a_job_view_of_megabytes_is_cut_to_the_largest_an_answer_carries() {
        for command in [
            vec!["x".repeat(1 << 20)],
            vec!["\u{0}".repeat(200); 10_000],
            vec!["é".repeat(3000); 20],
        ] {
            let fitted = fit_view(view(command));
            assert!(json_len(&fitted) <= MAX_JOB_VIEW, "{}", json_len(&fitted));
        }
        let small = view(vec!["true".into()]);
        let small = JobView {
            family: "true".into(),
            state: JobState::Succeeded,
            ..small
        };
        assert_eq!(fit_view(small.clone()), small);
    }

    #[test]
    fn cutting_keeps_character_boundaries() {
        let mut s = "ééé".to_owned();
        cut(&mut s, 3);
        assert_eq!(s, "é…");
        let mut s = "ééé".to_owned();
        cut_front(&mut s, 3);
        assert_eq!(s, "é");
    }
}
