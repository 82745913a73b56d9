//! Keeping the history bounded: compacting the journal into a snapshot of the jobs (the
//! finished ones beyond the newest [`Retention::keep_finished`] dropped), and removing the
//! files of finished jobs beyond [`Retention::keep_logs`] or older than
//! [`Retention::keep_logs_for`].
//!
//! Compaction runs in the daemon's loop once the journal holds more records since the last
//! one than [`Retention::compact_after`] and than there are jobs kept, so start-up reads at
//! most about twice the jobs kept plus `compact_after` lines, and rewriting costs at most
//! one line per record appended. See [`crate::journal`] for why a crash at any point of
//! it loses nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::job::JobId;

use super::state::Stage;
use super::{Daemon, now_unix};

/// How much history the daemon keeps (see the module docs).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Retention {
    /// Finished jobs kept in memory, in the snapshot and in `ladle queue` (the newest by
    /// id); the others are forgotten at the next compaction.
    pub keep_finished: usize,
    /// Finished jobs whose log, claim and status files are kept (the newest by id).
    pub keep_logs: usize,
    /// Older finished jobs' files (by their directory's modification time, which is the
    /// end of the last attempt) are removed whatever `keep_logs` says; `None`: no limit.
    pub keep_logs_for: Option<Duration>,
    /// Records appended before the journal is compacted (or more, when more jobs are kept).
    pub compact_after: usize,
}

impl Default for Retention {
    /// 1000 finished jobs, their files for 1000 jobs and at most 30 days, compaction every
    /// 10 000 records.
    fn default() -> Self {
        Self {
            keep_finished: 1000,
            keep_logs: 1000,
            keep_logs_for: Some(Duration::from_secs(30 * 24 * 3600)),
            compact_after: 10_000,
        }
    }
}

/// How often files are pruned when no compaction does it.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// After a failed compaction, how long before the next try.
const RETRY_COMPACTION: Duration = Duration::from_secs(60);

/// When the daemon last compacted or pruned.
#[derive(Debug)]
pub(super) struct Housekeeping {
    pub retention: Retention,
    last_prune: Instant,
    failed_at: Option<Instant>,
    /// The thread removing files, while it runs.
    pruning: Option<std::thread::JoinHandle<()>>,
}

impl Housekeeping {
    pub(super) fn new(retention: Retention) -> Self {
        Self {
            retention,
            last_prune: Instant::now(),
            failed_at: None,
            pruning: None,
        }
    }
}

impl Daemon {
    /// Compacts the journal when it is due (see the module docs), and prunes files hourly.
    pub(super) fn housekeeping(&mut self) {
        let due = self
            .housekeeping
            .retention
            .compact_after
            .max(self.jobs.jobs.len());
        let retry = self
            .housekeeping
            .failed_at
            .is_none_or(|at| at.elapsed() >= RETRY_COMPACTION);
        if self.journal.tail() >= due && retry {
            self.compact();
        } else if self.housekeeping.last_prune.elapsed() >= PRUNE_EVERY {
            self.prune_files();
        }
    }

    /// Forgets finished jobs beyond those kept, replaces the journal by a snapshot of the
    /// rest, and prunes finished jobs' files.
    pub(super) fn compact(&mut self) {
        let started = Instant::now();
        let tail = self.journal.tail();
        let forgotten = self
            .jobs
            .forget_finished(self.housekeeping.retention.keep_finished);
        let records = self.jobs.snapshot(now_unix());
        match self.journal.compact(&records) {
            Ok(()) => {
                self.housekeeping.failed_at = None;
                tracing::info!(
                    journal = %self.journal.path().display(),
                    records = tail,
                    jobs = self.jobs.jobs.len(),
                    forgotten,
                    ms = started.elapsed().as_millis(),
                    "compacted the journal"
                );
            }
            Err(e) => {
                self.housekeeping.failed_at = Some(Instant::now());
                tracing::error!(
                    "compacting: {e}; the journal stays as it was, retried in a minute"
                );
            }
        }
        self.prune_files();
    }

    /// Removes the files (logs, claim and status) of finished jobs beyond
    /// [`Retention::keep_logs`] or older than [`Retention::keep_logs_for`], in a thread of
    /// its own (the daemon never touches a finished job's files again, so it serves
    /// meanwhile). A job that is queued, held or running keeps its files, and so does any
    /// id this daemon has not handed out.
    pub(super) fn prune_files(&mut self) {
        if self
            .housekeeping
            .pruning
            .as_ref()
            .is_some_and(|t| !t.is_finished())
        {
            return;
        }
        self.housekeeping.last_prune = Instant::now();
        let live: BTreeSet<JobId> = self
            .jobs
            .jobs
            .values()
            .filter(|j| !matches!(j.stage, Stage::Ended(_)))
            .map(|j| j.id)
            .collect();
        let retention = self.housekeeping.retention.clone();
        let (dirs, next_id) = (self.files.job_dirs(), self.jobs.next_id);
        let spawned = std::thread::Builder::new()
            .name("ladle-scheduler-prune".to_owned())
            .spawn(move || {
                let removed: usize = dirs
                    .iter()
                    .map(|dir| prune_dir(dir, &live, next_id, &retention))
                    .sum();
                if removed > 0 {
                    tracing::info!(removed, "removed finished jobs' files");
                }
            });
        match spawned {
            Ok(thread) => self.housekeeping.pruning = Some(thread),
            Err(e) => tracing::warn!("cannot start removing finished jobs' files: {e}"),
        }
    }

    /// Waits for a running removal of files to end (tests, and a daemon that stops).
    pub(super) fn finish_pruning(&mut self) {
        if let Some(thread) = self.housekeeping.pruning.take()
            && thread.join().is_err()
        {
            tracing::warn!("removing finished jobs' files panicked");
        }
    }
}

/// Prunes one directory of per-job directories (`ID/`); returns how many it removed.
fn prune_dir(dir: &Path, live: &BTreeSet<JobId>, next_id: JobId, retention: &Retention) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut finished: Vec<(JobId, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let id: JobId = e.file_name().to_str()?.parse().ok()?;
            (id < next_id && !live.contains(&id) && e.file_type().ok()?.is_dir())
                .then(|| (id, e.path()))
        })
        .collect();
    finished.sort_unstable_by_key(|&(id, _)| std::cmp::Reverse(id));
    let now = SystemTime::now();
    let mut removed = 0;
    for (rank, (id, path)) in finished.iter().enumerate() {
        let too_old = retention.keep_logs_for.is_some_and(|limit| {
            std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > limit)
        });
        if rank < retention.keep_logs && !too_old {
            continue;
        }
        match std::fs::remove_dir_all(path) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(job = id, path = %path.display(), "removing its files: {e}"),
        }
    }
    removed
}

impl Daemon {
    /// At start, after recovery: compacts when due or when more finished jobs were read
    /// than are kept (start-up memory follows the live jobs), else prunes files.
    pub(super) fn start_housekeeping(&mut self) {
        let retention = &self.housekeeping.retention;
        let due = retention.compact_after.max(self.jobs.jobs.len());
        let finished = self
            .jobs
            .jobs
            .values()
            .filter(|j| matches!(j.stage, Stage::Ended(_)))
            .count();
        if self.journal.tail() >= due || finished > retention.keep_finished {
            self.compact();
        } else {
            self.prune_files();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::Basis;
    use crate::job::{JobSpec, JobState};
    use crate::journal::{CompactStep, Damage, Entry, Journal, Outcome, Record};
    use ladle_scheduler_core::state::Jobs;

    fn submitted(id: JobId) -> Record {
        Record::Submitted {
            id,
            spec: JobSpec::new(
                vec!["python".into(), "train.py".into(), format!("--seed={id}")],
                "/".into(),
            ),
            estimate_mib: 4096,
            basis: Basis::Guess,
            at: id as f64,
        }
    }

    fn starting(id: JobId, attempt: u32) -> Record {
        Record::Starting {
            id,
            attempt,
            gpus: vec![0],
            limit_mib: Some(8000),
            estimate_mib: Some(4096),
            exclusive: false,
            until_measured: true,
        }
    }

    fn finished(id: JobId, attempt: u32, outcome: Outcome) -> Record {
        Record::Finished {
            id,
            attempt,
            outcome,
            code: Some(1),
            peak_mib: Some(5000),
            reason: "oom".into(),
            cpu_s: None,
        }
    }

    fn damage(line: usize, id: Option<JobId>) -> Entry {
        Entry::Damaged(Damage {
            line,
            event: id.map(|_| "cancelled".to_owned()),
            id,
            bytes: 20,
            excerpt: String::new(),
        })
    }

    fn records(entries: &[Record]) -> Vec<Entry> {
        entries.iter().cloned().map(Entry::Record).collect()
    }

    /// A history with every stage: 1 succeeded, 2 an out-of-memory retry queued at the
    /// head, 3 running with a pid and measured, 4 queued, 5 cancelled.
    fn history() -> Vec<Record> {
        vec![
            submitted(1),
            submitted(2),
            submitted(3),
            submitted(4),
            submitted(5),
            starting(1, 1),
            finished(1, 1, Outcome::Succeeded),
            starting(2, 1),
            finished(2, 1, Outcome::OutOfMemory),
            Record::Requeued {
                id: 2,
                estimate_mib: 5500,
                basis: Some(Basis::Guess),
                exclusive: true,
                out_of_memory: true,
            },
            starting(3, 1),
            Record::Started {
                id: 3,
                attempt: 1,
                pid: 77,
                start_ticks: 9,
            },
            Record::Measured {
                id: 3,
                attempt: 1,
                peak_mib: 6000,
            },
            Record::Cancelled { id: 5 },
        ]
    }

    #[test]
    fn a_snapshot_folds_back_to_the_same_jobs_queue_and_families() {
        let jobs = Jobs::fold(true, history());
        let back = Jobs::fold(true, jobs.snapshot(1.0));
        assert_eq!(back.jobs, jobs.jobs);
        assert_eq!(back.queue, jobs.queue);
        assert_eq!(back.queue, [2, 4]);
        assert_eq!(back.families, jobs.families);
        assert_eq!(back.next_id, 6);
        // Records after the snapshot go on as they would have.
        let mut after = back.clone();
        after.apply(submitted(6));
        assert_eq!(after.queue, [2, 4, 6]);
    }

    #[test]
    fn forgetting_keeps_the_newest_finished_jobs_every_live_one_and_what_families_learned() {
        let mut jobs = Jobs::fold(true, history());
        let families = jobs.families.clone();
        assert_eq!(jobs.forget_finished(1), 1, "of 1 and 5, 1 goes");
        assert_eq!(jobs.jobs.keys().copied().collect::<Vec<_>>(), [2, 3, 4, 5]);
        let back = Jobs::fold(true, jobs.snapshot(1.0));
        assert_eq!(back.families, families);
        assert_eq!(back.next_id, 6, "ids are never handed out twice");
        assert_eq!(back.first_tail_id, 6);
    }

    #[test]
    fn a_compaction_stopped_at_any_step_replays_to_the_same_jobs() {
        for step in [
            Some(CompactStep::Written),
            Some(CompactStep::Synced),
            Some(CompactStep::Renamed),
            None,
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("journal.jsonl");
            let (mut journal, _) = Journal::open(&path).unwrap();
            for r in history() {
                journal.append(&r).unwrap();
            }
            let jobs = Jobs::fold(true, history());
            journal.compact_until(&jobs.snapshot(1.0), step).unwrap();
            drop(journal);
            let (_, replay) = Journal::replay(&path).unwrap();
            let (back, held) = Jobs::replay(true, replay.entries, "");
            assert!(held.is_empty());
            assert_eq!(back.jobs, jobs.jobs, "{step:?}");
            assert_eq!(back.queue, jobs.queue, "{step:?}");
            assert_eq!(back.next_id, jobs.next_id, "{step:?}");
        }
    }

    #[test]
    fn a_damaged_line_naming_a_queued_job_holds_it_until_released() {
        let mut entries = records(&[submitted(1), submitted(2)]);
        entries.push(damage(3, Some(1)));
        let (mut jobs, held) = Jobs::replay(true, entries, " --dir /s");
        assert_eq!(held, [1]);
        assert_eq!(jobs.queue, [2], "a held job is not admitted");
        let JobState::Held { reason } = jobs.jobs[&1].state() else {
            panic!("{:?}", jobs.jobs[&1].state());
        };
        assert!(
            reason.contains("line 3") && reason.contains("ladle release --dir /s 1"),
            "{reason}"
        );
        // Survives a compaction.
        let mut back = Jobs::fold(true, jobs.snapshot(1.0));
        assert!(back.jobs[&1].held.is_some());
        for j in [&mut jobs, &mut back] {
            j.apply(Record::Released { id: 1 });
            assert_eq!(j.queue, [2, 1]);
            assert_eq!(j.jobs[&1].state(), JobState::Queued);
        }
    }

    #[test]
    fn a_damaged_line_of_unknown_job_holds_the_queued_jobs_before_it_that_nothing_settles() {
        let mut entries = records(&[submitted(1), submitted(2), submitted(3), submitted(4)]);
        entries.push(damage(5, None));
        // 1 starts after the damage: its stage is settled by that record.
        entries.extend(records(&[starting(1, 1), submitted(5)]));
        let (jobs, held) = Jobs::replay(true, entries, "");
        assert_eq!(held, [2, 3, 4]);
        assert_eq!(
            jobs.queue,
            [5],
            "a job submitted after the damage is not held"
        );
        assert!(matches!(jobs.jobs[&1].state(), JobState::Running { .. }));
    }

    #[test]
    fn a_lost_submission_is_held_with_its_command_unknown() {
        // The submission of 2 is damaged beyond reading; 3 names an id no record submitted.
        let mut entries = records(&[submitted(1)]);
        entries.push(damage(2, None));
        entries.extend(records(&[submitted(3), starting(4, 1)]));
        let (jobs, held) = Jobs::replay(true, entries, "");
        assert_eq!(held, [1, 2, 4]);
        assert!(jobs.jobs[&2].spec.command.is_empty());
        assert!(matches!(jobs.jobs[&4].state(), JobState::Held { .. }));
        assert_eq!(jobs.queue, [3]);
        assert_eq!(jobs.next_id, 5);
    }

    #[test]
    fn a_journal_without_damage_holds_nothing() {
        let (jobs, held) = Jobs::replay(true, records(&history()), "");
        assert!(held.is_empty());
        assert_eq!(jobs, Jobs::fold(true, history()));
    }
}

#[cfg(test)]
mod prune_tests {
    use super::*;

    /// Sets `dir`'s modification time `age` ago.
    fn age(dir: &Path, age: Duration) {
        let when = SystemTime::now() - age;
        std::fs::File::open(dir)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }

    #[test]
    fn files_older_than_keep_logs_for_go_whatever_keep_logs_says_except_live_and_unknown_ids() {
        let dir = tempfile::tempdir().unwrap();
        for id in 1..=7 {
            std::fs::create_dir(dir.path().join(id.to_string())).unwrap();
            std::fs::write(dir.path().join(id.to_string()).join("log"), "x").unwrap();
        }
        let day = Duration::from_secs(24 * 3600);
        // 1, 2 and 4 ended 40 days ago; 4 is running again (live); 7 is an id this daemon
        // has not handed out (next_id 7); 3, 5, 6 are recent.
        for id in [1, 2, 4, 7] {
            age(&dir.path().join(id.to_string()), 40 * day);
        }
        let retention = Retention {
            keep_logs: 100,
            keep_logs_for: Some(30 * day),
            ..Retention::default()
        };
        let live: BTreeSet<JobId> = [4].into();
        assert_eq!(prune_dir(dir.path(), &live, 7, &retention), 2);
        let left: BTreeSet<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["3", "4", "5", "6", "7"].map(String::from).into());
        // No age limit: only the count; the newest 2 finished of 3, 5, 6 are kept.
        let retention = Retention {
            keep_logs: 2,
            keep_logs_for: None,
            ..Retention::default()
        };
        assert_eq!(prune_dir(dir.path(), &live, 7, &retention), 1);
        assert!(!dir.path().join("3").exists() && dir.path().join("5").exists());
    }
}
