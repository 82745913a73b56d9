//! The jobs as the journal knows them: a pure fold of [`Record`]s.
//!
//! Nothing here touches a process, a file or a GPU, so what a journal means is testable
//! without any of them: [`Jobs::fold`] of a journal's records is the queue a restarted
//! daemon starts from (before its recovery, in `ladle-scheduler`, settles the attempts left
//! open), and the running daemon changes its jobs only by journaling a record and applying
//! the same record ([`Jobs::apply`]). A running attempt's process id lives in one place, its
//! [`Attempt`]; [`Job::state`] derives the protocol's [`JobState`] from it.
//!
//! ## Damaged lines: hold, never guess
//! [`Jobs::replay`] folds a journal read back with its damaged lines in place. A damaged
//! line names the job it was about when its start is readable; otherwise it may be about
//! any job submitted before it. Of those jobs, every one that the records after the line do
//! not settle (a `starting`, `finished`, `requeued`, `cancelled` or `released` of it) and
//! that the fold leaves queued is **held**: the line may have been its cancel or the start
//! of an attempt that ran, so running it could run it twice. A job named only by a
//! damaged line or by records after one, or whose id is missing from the ids the journal
//! handed out, lost its submission: it is held too, with its command unknown (it can only
//! be cancelled). A job the fold leaves running is settled by recovery as always, from its
//! claim and status files, which do not depend on the journal. A held job keeps its place
//! out of the queue until `ladle release` (journaled `released`) or `ladle cancel`.

use std::collections::{BTreeMap, VecDeque};

use crate::estimate::{Basis, Estimate, Families, family_key};
use crate::job::{JobId, JobSpec, JobState};
use crate::journal::{Damage, Entry, JobSnapshot, Outcome, Record, SnapshotHeader, SnapshotStage};

/// One attempt of a job, as journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Attempt number, from 1.
    pub number: u32,
    /// GPU indices.
    pub gpus: Vec<usize>,
    /// Its process (group leader), once `started` is journaled or recovery read its claim.
    pub pid: Option<u32>,
    /// MPS pinned-memory limit per GPU, MiB.
    pub limit_mib: Option<u64>,
    /// The estimate it was placed with, MiB.
    pub estimate_mib: u64,
    /// Nobody joins it for as long as it runs.
    pub exclusive: bool,
    /// Nobody joins it until it is measured.
    pub until_measured: bool,
}

/// Where a job stands in the fold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// In the queue.
    Queued,
    /// An attempt is open (starting or running).
    Running(Attempt),
    /// It will not run again (a final [`JobState`]).
    Ended(JobState),
}

/// One job.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// What was asked.
    pub spec: JobSpec,
    /// Its family: `--family`, else [`family_key`] of its command.
    pub family: String,
    /// Its memory estimate per GPU and where it comes from.
    pub estimate: Estimate,
    /// It must run alone (an out-of-memory retry not yet measured).
    pub exclusive: bool,
    /// Attempts begun.
    pub attempts: u32,
    /// Out-of-memory requeues.
    pub oom_retries: u32,
    /// Where it stands.
    pub stage: Stage,
    /// Unix time of the submission.
    pub submitted_at: f64,
    /// Largest peak journaled for it (measured while running, or at an attempt's end).
    pub peak_mib: Option<u64>,
    /// Its current attempt's peak has been measured (journaled `measured`).
    pub measured: bool,
    /// CPU seconds of its ended attempts, where measured (journaled with each end).
    pub cpu_s: Option<f64>,
    /// Held (out of the queue, not started) and why: see the module docs.
    pub held: Option<String>,
}

impl Job {
    /// Its open attempt.
    pub fn attempt(&self) -> Option<&Attempt> {
        match &self.stage {
            Stage::Running(a) => Some(a),
            _ => None,
        }
    }

    /// The protocol's view of where it stands.
    pub fn state(&self) -> JobState {
        match &self.stage {
            Stage::Queued if self.held.is_some() => JobState::Held {
                reason: self.held.clone().unwrap_or_default(),
            },
            Stage::Queued => JobState::Queued,
            Stage::Running(a) => JobState::Running {
                gpus: a
                    .gpus
                    .iter()
                    .map(|&g| u32::try_from(g).unwrap_or(u32::MAX))
                    .collect(),
                pid: a.pid,
                attempt: a.number,
            },
            Stage::Ended(state) => state.clone(),
        }
    }
}

/// The jobs, the queue (head first) and the peaks learned per family.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Jobs {
    /// Every job kept, by id.
    pub jobs: BTreeMap<JobId, Job>,
    /// The queued jobs' ids, head first (held jobs are not in it).
    pub queue: VecDeque<JobId>,
    /// The peaks learned per family.
    pub families: Families,
    /// The next id to hand out.
    pub next_id: JobId,
    /// Queued jobs whose estimate is a guess take their family's measured peak as soon as
    /// one is journaled (the policy's learned estimates).
    learn: bool,
    /// The first id handed out after the journal's snapshot (1 without one): ids from here
    /// to `next_id` all had a `submitted` record.
    pub first_tail_id: JobId,
}

impl Jobs {
    /// No jobs; `learn`: whether queued guesses take their family's measured peak.
    pub fn new(learn: bool) -> Self {
        Self {
            next_id: 1,
            first_tail_id: 1,
            learn,
            ..Self::default()
        }
    }

    /// The jobs `records` describe, in order.
    pub fn fold(learn: bool, records: impl IntoIterator<Item = Record>) -> Self {
        let mut jobs = Self::new(learn);
        for record in records {
            jobs.apply(record);
        }
        jobs
    }

    /// Jobs with an open attempt.
    pub fn running(&self) -> impl Iterator<Item = (&Job, &Attempt)> {
        self.jobs
            .values()
            .filter_map(|j| j.attempt().map(|a| (j, a)))
    }

    /// The estimate a new job of `spec` gets: what it declares, else (when learning) its
    /// family's measured peak, else `guess_mib`.
    pub fn estimate_for(&self, spec: &JobSpec, guess_mib: u64) -> Estimate {
        let family = family_of(spec);
        if self.learn {
            self.families.estimate(&family, spec.gpu_mem_mib, guess_mib)
        } else {
            Families::new().estimate(&family, spec.gpu_mem_mib, guess_mib)
        }
    }

    /// Applies one record. Records about unknown jobs change nothing (a journal is only
    /// ever appended by one daemon, so that would be a bug, not an input to act on).
    // Long (~165 lines) on purpose: one arm per kind of journal record, so that the fold reads
    // as the journal's grammar; each arm is a few lines of state change.
    pub fn apply(&mut self, record: Record) {
        match record {
            Record::Submitted {
                id,
                spec,
                estimate_mib,
                basis,
                at,
            } => {
                self.next_id = self.next_id.max(id.saturating_add(1));
                let basis = if spec.gpu_mem_mib.is_some() {
                    Basis::Declared
                } else {
                    basis
                };
                let family = family_of(&spec);
                self.jobs.insert(
                    id,
                    Job {
                        id,
                        spec,
                        family,
                        estimate: Estimate {
                            mib: estimate_mib,
                            basis,
                        },
                        exclusive: false,
                        attempts: 0,
                        oom_retries: 0,
                        stage: Stage::Queued,
                        submitted_at: at,
                        peak_mib: None,
                        measured: false,
                        cpu_s: None,
                        held: None,
                    },
                );
                self.queue.push_back(id);
            }
            Record::Starting {
                id,
                attempt,
                gpus,
                limit_mib,
                estimate_mib,
                exclusive,
                until_measured,
            } => {
                self.queue.retain(|&q| q != id);
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.attempts = job.attempts.max(attempt);
                    job.measured = false;
                    job.stage = Stage::Running(Attempt {
                        number: attempt,
                        gpus: gpus.iter().map(|&g| g as usize).collect(),
                        pid: None,
                        limit_mib,
                        estimate_mib: estimate_mib.unwrap_or(job.estimate.mib),
                        // Journals from before placements were journaled: a retry ran alone.
                        exclusive: exclusive || (estimate_mib.is_none() && job.exclusive),
                        until_measured,
                    });
                }
            }
            Record::Started {
                id, attempt, pid, ..
            } => {
                if let Some(Stage::Running(a)) = self.jobs.get_mut(&id).map(|j| &mut j.stage)
                    && a.number == attempt
                {
                    a.pid = Some(pid);
                }
            }
            Record::Measured {
                id,
                attempt,
                peak_mib,
            } => {
                let Some(job) = self.jobs.get_mut(&id) else {
                    return;
                };
                if job.attempt().is_none_or(|a| a.number != attempt) {
                    return;
                }
                job.measured = true;
                job.peak_mib = job.peak_mib.max(Some(peak_mib));
                // Measured alone, an out-of-memory retry may now take neighbours.
                job.exclusive = false;
                self.families.observe(&job.family, peak_mib);
                if let Some(declared) = job.spec.gpu_mem_mib {
                    self.families.observe_declared(declared, peak_mib);
                }
            }
            Record::Finished {
                id,
                outcome,
                peak_mib,
                reason,
                cpu_s,
                ..
            } => {
                let Some(job) = self.jobs.get_mut(&id) else {
                    return;
                };
                job.peak_mib = job.peak_mib.max(peak_mib);
                if let Some(cpu) = cpu_s {
                    job.cpu_s = Some(job.cpu_s.unwrap_or(0.0) + cpu);
                }
                job.stage = Stage::Ended(match outcome {
                    Outcome::Succeeded => JobState::Succeeded,
                    Outcome::Cancelled => JobState::Cancelled,
                    Outcome::Interrupted => JobState::Interrupted { reason },
                    Outcome::Failed | Outcome::OutOfMemory => JobState::Failed { reason },
                });
                // A run that ended well saw its whole peak.
                if let (Outcome::Succeeded, Some(peak)) = (outcome, peak_mib) {
                    self.families.observe(&job.family, peak);
                }
            }
            Record::Requeued {
                id,
                estimate_mib,
                basis,
                exclusive,
                out_of_memory,
            } => {
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.stage = Stage::Queued;
                    job.estimate.mib = estimate_mib;
                    if let Some(basis) = basis {
                        job.estimate.basis = basis;
                    }
                    job.exclusive = exclusive;
                    job.oom_retries += u32::from(out_of_memory);
                    self.queue.retain(|&q| q != id);
                    self.queue.push_front(id);
                }
            }
            Record::Cancelled { id } => {
                self.queue.retain(|&q| q != id);
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.stage = Stage::Ended(JobState::Cancelled);
                    job.held = None;
                }
            }
            Record::Released { id } => {
                if let Some(job) = self.jobs.get_mut(&id)
                    && job.held.take().is_some()
                    && job.stage == Stage::Queued
                {
                    self.queue.retain(|&q| q != id);
                    self.queue.push_back(id);
                }
            }
            Record::Snapshot(header) => {
                self.next_id = self.next_id.max(header.next_id);
                self.first_tail_id = header.next_id;
                self.families = header.families;
                self.queue = header.queue.into();
            }
            Record::Job(snapshot) => {
                let job = Job::from_snapshot(*snapshot);
                self.next_id = self.next_id.max(job.id.saturating_add(1));
                self.jobs.insert(job.id, job);
            }
        }
    }

    /// Folds a journal read back with its damaged lines in place, holding the jobs they
    /// may concern (see the module docs); `dir_arg` (e.g. ` --dir /state`) goes into the
    /// commands the hold reasons give. Returns the jobs and those held.
    pub fn replay(
        learn: bool,
        entries: impl IntoIterator<Item = Entry>,
        dir_arg: &str,
    ) -> (Self, Vec<JobId>) {
        let mut jobs = Self::new(learn);
        // Jobs a damaged line may concern, and the first such line.
        let mut marks: BTreeMap<JobId, usize> = BTreeMap::new();
        // Ids named by records (or damaged lines) while no job had them.
        let mut orphans: BTreeMap<JobId, usize> = BTreeMap::new();
        let mut damaged: Option<Damage> = None;
        for entry in entries {
            match entry {
                Entry::Record(record) => {
                    if let Some(id) = record.job_id() {
                        let settles = matches!(
                            record,
                            Record::Starting { .. }
                                | Record::Finished { .. }
                                | Record::Requeued { .. }
                                | Record::Cancelled { .. }
                                | Record::Released { .. }
                        );
                        let names_new_job =
                            matches!(record, Record::Submitted { .. } | Record::Job(_));
                        if settles {
                            marks.remove(&id);
                        }
                        if damaged.is_some() && !names_new_job && !jobs.jobs.contains_key(&id) {
                            orphans.entry(id).or_insert(0);
                        }
                    }
                    jobs.apply(record);
                }
                Entry::Damaged(d) => {
                    match d.id {
                        Some(id) if jobs.jobs.contains_key(&id) => {
                            marks.entry(id).or_insert(d.line);
                        }
                        Some(id) => {
                            orphans.entry(id).or_insert(d.line);
                        }
                        None => {
                            for &id in jobs.jobs.keys() {
                                marks.entry(id).or_insert(d.line);
                            }
                        }
                    }
                    damaged.get_or_insert(d);
                }
            }
        }
        let mut held = Vec::new();
        let Some(first) = damaged else {
            return (jobs, held);
        };
        // A submission lost with its id unreadable leaves a gap in the ids handed out.
        for id in jobs.first_tail_id..jobs.next_id {
            if !jobs.jobs.contains_key(&id) {
                orphans.entry(id).or_insert(0);
            }
        }
        for (id, line) in orphans {
            if jobs.jobs.contains_key(&id) {
                continue;
            }
            let line = if line == 0 { first.line } else { line };
            let reason = format!(
                "its submission is lost to damaged journal line {line}: what it runs is unknown; \
                 submit it again if needed, and `ladle cancel{dir_arg} {id}` to drop this entry"
            );
            jobs.next_id = jobs.next_id.max(id.saturating_add(1));
            jobs.jobs.insert(id, placeholder(id, reason));
            held.push(id);
        }
        for (id, line) in marks {
            let Some(job) = jobs.jobs.get_mut(&id) else {
                continue;
            };
            if job.stage != Stage::Queued || job.held.is_some() {
                continue;
            }
            job.held = Some(format!(
                "journal line {line} is damaged and may be about it (its cancel, or the start \
                 of an attempt that ran): see `ladle logs{dir_arg} {id}`, then `ladle \
                 release{dir_arg} {id}` to run it or `ladle cancel{dir_arg} {id}` to drop it"
            ));
            held.push(id);
        }
        held.sort_unstable();
        let all = &jobs.jobs;
        jobs.queue.retain(|id| {
            all.get(id)
                .is_some_and(|j| j.stage == Stage::Queued && j.held.is_none())
        });
        (jobs, held)
    }

    /// The estimate admission uses for queued `job` now: an out-of-memory retry's own
    /// (from what its crashed attempt reached); otherwise, as for a new job, its declaration
    /// (checked against measured peaks), else its family's measured peak, else `guess_mib`.
    pub fn current_estimate(&self, job: &Job, guess_mib: u64) -> Estimate {
        if job.oom_retries > 0 {
            job.estimate
        } else {
            self.estimate_for(&job.spec, guess_mib)
        }
    }
}

/// A held job whose submission was lost: its command is unknown (empty).
fn placeholder(id: JobId, reason: String) -> Job {
    Job {
        id,
        spec: JobSpec::new(Vec::new(), "/".into()),
        family: String::new(),
        estimate: Estimate {
            mib: 0,
            basis: Basis::Guess,
        },
        exclusive: false,
        attempts: 0,
        oom_retries: 0,
        stage: Stage::Queued,
        submitted_at: 0.0,
        peak_mib: None,
        measured: false,
        cpu_s: None,
        held: Some(reason),
    }
}

/// A job's family: `--family`, else [`family_key`] of its command.
fn family_of(spec: &JobSpec) -> String {
    spec.family
        .clone()
        .unwrap_or_else(|| family_key(&spec.command))
}

/// Snapshot lines: the pure half of compaction (the daemon's compaction writes and reads them).
impl Job {
    /// A kept job as its snapshot line rebuilds it.
    pub(crate) fn from_snapshot(s: JobSnapshot) -> Job {
        let stage = match s.stage {
            SnapshotStage::Running {
                attempt,
                gpus,
                pid,
                limit_mib,
                estimate_mib,
                exclusive,
                until_measured,
            } => Stage::Running(Attempt {
                number: attempt,
                gpus: gpus.iter().map(|&g| g as usize).collect(),
                pid,
                limit_mib,
                estimate_mib,
                exclusive,
                until_measured,
            }),
            SnapshotStage::Ended { state } => Stage::Ended(state),
            _ => Stage::Queued,
        };
        Job {
            id: s.id,
            family: family_of(&s.spec),
            spec: s.spec,
            estimate: Estimate {
                mib: s.estimate_mib,
                basis: s.basis,
            },
            exclusive: s.exclusive,
            attempts: s.attempts,
            oom_retries: s.oom_retries,
            stage,
            submitted_at: s.submitted_at,
            peak_mib: s.peak_mib,
            measured: s.measured,
            cpu_s: s.cpu_s,
            held: s.held,
        }
    }

    /// Its snapshot line, what compaction writes.
    pub(crate) fn snapshot(&self) -> JobSnapshot {
        let stage = match &self.stage {
            Stage::Queued => SnapshotStage::Queued,
            Stage::Running(a) => SnapshotStage::Running {
                attempt: a.number,
                gpus: a
                    .gpus
                    .iter()
                    .map(|&g| u32::try_from(g).unwrap_or(u32::MAX))
                    .collect(),
                pid: a.pid,
                limit_mib: a.limit_mib,
                estimate_mib: a.estimate_mib,
                exclusive: a.exclusive,
                until_measured: a.until_measured,
            },
            Stage::Ended(state) => SnapshotStage::Ended {
                state: state.clone(),
            },
        };
        JobSnapshot {
            id: self.id,
            spec: self.spec.clone(),
            estimate_mib: self.estimate.mib,
            basis: self.estimate.basis,
            exclusive: self.exclusive,
            attempts: self.attempts,
            oom_retries: self.oom_retries,
            stage,
            submitted_at: self.submitted_at,
            peak_mib: self.peak_mib,
            measured: self.measured,
            cpu_s: self.cpu_s,
            held: self.held.clone(),
        }
    }
}

impl Jobs {
    /// Forgets the finished jobs beyond the newest `keep` (by id); returns how many.
    pub fn forget_finished(&mut self, keep: usize) -> usize {
        let ended: Vec<JobId> = self
            .jobs
            .values()
            .rev()
            .filter(|j| matches!(j.stage, Stage::Ended(_)))
            .map(|j| j.id)
            .skip(keep)
            .collect();
        for id in &ended {
            self.jobs.remove(id);
        }
        ended.len()
    }

    /// The records a compacted journal starts with: they fold back to these jobs.
    pub fn snapshot(&self, at: f64) -> Vec<Record> {
        let mut records = Vec::with_capacity(self.jobs.len() + 1);
        records.push(Record::Snapshot(SnapshotHeader {
            next_id: self.next_id,
            queue: self.queue.iter().copied().collect(),
            families: self.families.clone(),
            jobs: self.jobs.len(),
            at,
        }));
        records.extend(
            self.jobs
                .values()
                .map(|j| Record::Job(Box::new(j.snapshot()))),
        );
        records
    }
}

#[cfg(test)]
mod tests;
