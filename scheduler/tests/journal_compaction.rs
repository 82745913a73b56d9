//! A `kill -9` at any point of a compaction loses nothing: a child process (this test
//! binary again) appends records and compacts the journal over and over, saying on stdout
//! which records were acknowledged; the test kills it at points spread over its work and
//! reads the journal back each time. Every wait is on the child's output.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

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
    use std::os::unix::net::UnixStream;
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use ladle_scheduler::daemon::{self, DaemonConfig, GpuBackend, MpsMode, Retention};
    use ladle_scheduler::job::{JobSpec, JobState};
    use ladle_scheduler::policy::Policy;
    use ladle_scheduler::protocol::{self, JobView, Request, Response};

    const HANG: Duration = Duration::from_secs(60);
    const POLL: Duration = Duration::from_millis(20);

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
        let mut config = DaemonConfig::new(dir.to_owned());
        config.gpu = GpuBackend::Sim {
            gpus: 1,
            memory_mib: 40 * 1024,
        };
        config.mps = MpsMode::Off;
        config.policy = Policy::named("exclusive").unwrap();
        config.tick = Duration::from_millis(20);
        let mut retention = Retention::default();
        retention.keep_finished = 2;
        retention.keep_logs = 3;
        retention.compact_after = 8;
        config.retention = retention;
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::spawn(move || daemon::run(config, stop))
        };
        let deadline = Instant::now() + HANG;
        while UnixStream::connect(daemon::socket_path(dir)).is_err() {
            assert!(!handle.is_finished(), "{:?}", handle.join().unwrap());
            assert!(Instant::now() < deadline, "daemon did not come up");
            std::thread::sleep(POLL);
        }
        let out = body();
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap().unwrap();
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
            let deadline = Instant::now() + HANG;
            // Finished jobs may be forgotten by a compaction meanwhile: wait until none
            // is left to run.
            while jobs(&dir).iter().any(|j| j.state != JobState::Succeeded) {
                assert!(Instant::now() < deadline, "{:?}", jobs(&dir));
                std::thread::sleep(POLL);
            }
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
