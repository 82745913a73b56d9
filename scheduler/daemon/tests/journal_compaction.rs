//! A `kill -9` at any point of a compaction loses nothing: a child process (this test
//! binary again) appends records and compacts the journal over and over, saying on stdout
//! which records were acknowledged; the test kills it at points spread over its work and
//! reads the journal back each time. Every wait is on the child's output.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use ladle_scheduler::journal::{Journal, Record};

const CHILD_ENV: &str = "LADLE_TEST_COMPACTION_CHILD";
const TEST_NAME: &str = "a_kill_9_at_any_point_of_a_compaction_loses_no_acknowledged_record";

/// The records the child writes, in order: the journal must always hold 1..=n of them.
fn record(n: u64) -> Record {
    Record::Cancelled { id: n }
}

/// The child: goes on from the journal at `path`, appending and compacting until killed.
fn child(path: &Path) {
    let (mut journal, records) = Journal::open(path).unwrap();
    let mut all = records;
    let mut out = std::io::stdout().lock();
    let mut n = all.len() as u64;
    loop {
        n += 1;
        journal.append(&record(n)).unwrap();
        all.push(record(n));
        writeln!(out, "acked {n}").unwrap();
        if n % 5 == 0 {
            // The snapshot of this journal is its records: a compaction must leave them.
            journal.compact(&all).unwrap();
            writeln!(out, "compacted {n}").unwrap();
        }
        out.flush().unwrap();
    }
}

#[test]
fn a_kill_9_at_any_point_of_a_compaction_loses_no_acknowledged_record() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&path));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("journal.jsonl");
    let mut acked = 0u64;
    for round in 0..40u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Kill after a number of records that moves around the compaction every 5th one,
        // and at a point of the output that moves too (just acked, or just compacted).
        let target = acked + 20 + round % 7;
        let mut compactions = 0;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("acked ") {
                acked = n.parse().unwrap();
            } else if line.starts_with("compacted ") {
                compactions += 1;
            }
            if acked >= target && compactions > 0 {
                break;
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let (_, records) = Journal::open(&path).unwrap();
        let n = records.len() as u64;
        assert!(
            n >= acked,
            "round {round}: {acked} acknowledged, {n} in the journal"
        );
        let expected: Vec<Record> = (1..=n).map(record).collect();
        assert_eq!(
            records, expected,
            "round {round}: lost, repeated or reordered"
        );
        acked = n;
        assert!(
            !tmp.path().join("journal.jsonl.compact").exists(),
            "opening removes an unfinished compaction"
        );
    }
}

mod daemon_retention {
    use std::path::Path;
    use std::time::Duration;

    use ladle_scheduler::daemon::{self, MpsMode, Retention};
    use ladle_scheduler::job::{JobSpec, JobState};
    use ladle_scheduler::protocol::{self, JobView, Request, Response};

    use crate::common::{self, Daemon, wait_until};

    const HANG: Duration = Duration::from_secs(60);

    fn request(dir: &Path, request: &Request) -> Response {
        protocol::request(&daemon::socket_path(dir), request, HANG).unwrap()
    }

    fn jobs(dir: &Path) -> Vec<JobView> {
        match request(dir, &Request::Queue) {
            Response::Queue { jobs, .. } => jobs,
            other => panic!("{other:?}"),
        }
    }

    /// Runs a daemon on `dir` (2 finished jobs kept, files of 3, compaction after 8
    /// records) until `body` returns.
    fn with_daemon<T>(dir: &Path, body: impl FnOnce() -> T) -> T {
        let mut config = common::sim_config(dir);
        config.mps = MpsMode::Off;
        config.tick = Duration::from_millis(20);
        let mut retention = Retention::default();
        retention.keep_finished = 2;
        retention.keep_logs = 3;
        retention.compact_after = 8;
        config.retention = retention;
        let mut daemon = Daemon::run(config, None);
        let out = body();
        daemon.stop();
        out
    }

    fn submit(dir: &Path) -> u64 {
        let spec = JobSpec {
            gpu_mem_mib: Some(1024),
            ..JobSpec::new(vec!["true".into()], "/".into())
        };
        match request(dir, &Request::Submit(spec)) {
            Response::Submitted { id, .. } => id,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_restart_keeps_only_the_newest_finished_jobs_and_their_files_and_hands_out_new_ids() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        with_daemon(&dir, || {
            for _ in 0..6 {
                submit(&dir);
            }
            // Finished jobs may be forgotten by a compaction meanwhile: wait until none
            // is left to run.
            wait_until("every job succeeded", HANG, || {
                let jobs = jobs(&dir);
                if jobs.iter().all(|j| j.state == JobState::Succeeded) {
                    Ok(Some(()))
                } else {
                    Err(format!("{jobs:?}"))
                }
            });
        });
        let (kept, next) = with_daemon(&dir, || (jobs(&dir), submit(&dir)));
        let ids: Vec<u64> = kept.iter().map(|j| j.id).collect();
        assert_eq!(ids, [5, 6]);
        assert!(kept.iter().all(|j| j.state == JobState::Succeeded));
        assert_eq!(next, 7, "ids of forgotten jobs are not handed out again");
        let mut with_files: Vec<u64> = std::fs::read_dir(dir.join("jobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
            .collect();
        with_files.sort_unstable();
        assert!(
            with_files.starts_with(&[4, 5, 6]) && with_files.len() <= 4,
            "{with_files:?}"
        );
    }
}
