//! The journal when the disk misbehaves: full (a real, size-limited tmpfs filled to
//! ENOSPC), or damaged in the middle. Each test that needs a mount skips, saying so on
//! stderr, where mounting is not permitted; the mount goes in `Drop`. Every wait is on
//! what the daemon reports, bounded by a deadline that only catches a hang.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Daemon, wait_until};
use ladle_scheduler::daemon::{self, MpsMode};
use ladle_scheduler::estimate::Basis;
use ladle_scheduler::job::{JobSpec, JobState};
use ladle_scheduler::journal::{Journal, JournalError, Record};
use ladle_scheduler::protocol::{self, JobView, Request, Response};

/// How long any wait may take before the test counts as hung.
const HANG: Duration = Duration::from_secs(60);

/// A size-limited tmpfs mounted on a private directory, unmounted on drop.
struct SmallDisk {
    path: PathBuf,
    filler: PathBuf,
    _tmp: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it); `None`, said on stderr,
    /// where that is not permitted.
    fn mount(size: &str) -> Option<Self> {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("ladle-test")
            .arg(&path)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Self {
                filler: path.join("filler"),
                path,
                _tmp: tmp,
            }),
            Ok(out) => {
                eprintln!(
                    "skipped: cannot mount a tmpfs here ({}); this test needs root where mount \
                     is permitted",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount ({e})");
                None
            }
        }
    }

    /// Writes a file until the disk is full.
    fn fill(&self) {
        let mut f = std::fs::File::create(&self.filler).unwrap();
        let block = vec![0xa5u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", self.filler.display()),
            }
        }
        // Whatever is left is smaller than a block: take it a byte at a time.
        while f.write(&block[..1]).is_ok_and(|n| n == 1) {}
    }

    /// Gives the space back.
    fn free(&self) {
        std::fs::remove_file(&self.filler).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.path).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            // Busy (a test failed with something still open): detach it lazily.
            let lazy = Command::new("umount").arg("-l").arg(&self.path).status();
            if !lazy.is_ok_and(|s| s.success()) {
                eprintln!("could not unmount {}", self.path.display());
            }
        }
    }
}

fn submitted(id: u64) -> Record {
    Record::Submitted {
        id,
        spec: JobSpec::new(
            vec![
                "python".into(),
                "train.py".into(),
                format!("--run=a-long-enough-argument-{id:0>200}"),
            ],
            "/".into(),
        ),
        estimate_mib: 1024,
        basis: Basis::Declared,
        at: 0.0,
    }
}

#[test]
fn an_append_on_a_full_disk_leaves_no_fragment_and_the_journal_reads_back_once_space_returns() {
    let Some(disk) = SmallDisk::mount("256k") else {
        return;
    };
    let path = disk.path.join("journal.jsonl");
    let (mut journal, _) = Journal::open(&path).unwrap();
    journal.append(&submitted(1)).unwrap();
    disk.fill();
    // The journal's last page has room for a few records; the one that does not fit is
    // written in part before the disk says it is full.
    let mut next = 2;
    let error = loop {
        match journal.append(&submitted(next)) {
            Ok(()) => next += 1,
            Err(e) => break e,
        }
        assert!(next < 1000, "the disk never filled");
    };
    assert!(matches!(error, JournalError::DiskFull { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&path.display().to_string()) && message.contains("disk is full"),
        "{message}"
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.last(), Some(&b'\n'), "a fragment was left behind");
    disk.free();
    journal.append(&submitted(next)).unwrap();
    drop(journal);
    let (_, records) = Journal::open(&path).unwrap();
    let expected: Vec<Record> = (1..=next).map(submitted).collect();
    assert_eq!(records, expected);
}

/// The common daemon on a state directory of the test's; stopped on drop.
struct TestDaemon(Daemon);

impl TestDaemon {
    /// Simulated GPUs, no MPS, a 50 ms tick, on `dir`.
    fn start(dir: &Path) -> Self {
        let mut config = common::sim_config(dir);
        config.mps = MpsMode::Off;
        config.tick = Duration::from_millis(50);
        Self(Daemon::run(config, None))
    }

    fn request(&self, request: &Request) -> Response {
        protocol::request(&daemon::socket_path(&self.0.dir), request, HANG).unwrap()
    }

    fn submit(&self, script: &str) -> Response {
        let spec = JobSpec {
            gpu_mem_mib: Some(1024),
            ..JobSpec::new(
                vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()],
                "/".into(),
            )
        };
        self.request(&Request::Submit(spec))
    }

    fn jobs(&self) -> Vec<JobView> {
        match self.request(&Request::Queue) {
            Response::Queue { jobs, .. } => jobs,
            other => panic!("{other:?}"),
        }
    }

    fn wait_job(&self, id: u64, what: &str, done: impl Fn(&JobState) -> bool) -> JobState {
        wait_until(&format!("job {id} {what}"), HANG, || {
            let jobs = self.jobs();
            match jobs.iter().find(|j| j.id == id) {
                Some(job) if done(&job.state) => Ok(Some(job.state.clone())),
                _ => Err(format!("{jobs:?}")),
            }
        })
    }

    fn stop(mut self) {
        self.0.stop();
    }
}

#[test]
fn a_daemon_on_a_full_disk_refuses_the_submit_naming_the_journal_keeps_serving_and_restarts() {
    let Some(disk) = SmallDisk::mount("1m") else {
        return;
    };
    let dir = disk.path.join("state");
    std::fs::create_dir(&dir).unwrap();
    let journal = dir.join("journal.jsonl");
    // A journal whose last page has 100 bytes of room: the next record is written in part
    // before the full disk stops it (a blank line is no record).
    let pad = 4096 - 100 - 1;
    std::fs::write(&journal, format!("{}\n", " ".repeat(pad))).unwrap();
    let d = TestDaemon::start(&dir);
    disk.fill();
    let Response::Error { message } = d.submit("true") else {
        panic!("a submit on a full disk was accepted");
    };
    assert!(
        message.contains(&journal.display().to_string()) && message.contains("disk is full"),
        "{message}"
    );
    assert!(d.jobs().is_empty(), "nothing half-recorded");
    let on_disk = std::fs::read(&journal).unwrap();
    assert_eq!(
        on_disk.len(),
        pad + 1,
        "the failed append left bytes behind"
    );
    disk.free();
    let Response::Submitted { id, .. } = d.submit("true") else {
        panic!("the daemon stopped serving");
    };
    assert_eq!(id, 1, "the refused submit took no id");
    d.wait_job(id, "succeeded", |s| *s == JobState::Succeeded);
    d.stop();
    let d = TestDaemon::start(&dir);
    let jobs = d.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].state, JobState::Succeeded);
    d.stop();
}

#[test]
fn a_damaged_middle_line_holds_the_job_it_names_until_released_and_the_daemon_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let ran = tmp.path().join("ran");
    let script = |n: u32| format!("echo {n} >> {}", ran.display());
    let spec = |n| JobSpec {
        gpu_mem_mib: Some(1024),
        ..JobSpec::new(vec!["sh".into(), "-c".into(), script(n)], "/".into())
    };
    let submit = |id: u64| Record::Submitted {
        id,
        spec: spec(id as u32),
        estimate_mib: 1024,
        basis: Basis::Declared,
        at: 0.0,
    };
    {
        let (mut journal, _) = Journal::open(&dir.join("journal.jsonl")).unwrap();
        for id in 1..=3 {
            journal.append(&submit(id)).unwrap();
        }
    }
    // A line about job 2 damaged on disk (it might have been its cancel), then more.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("journal.jsonl"))
        .unwrap();
    f.write_all(b"{\"event\":\"cancelled\",\"id\":2,\x00\x00\x00\n")
        .unwrap();
    drop(f);
    {
        let (mut journal, _) = Journal::replay(&dir.join("journal.jsonl")).unwrap();
        journal.append(&submit(4)).unwrap();
    }
    let d = TestDaemon::start(&dir);
    for id in [1, 3, 4] {
        d.wait_job(id, "succeeded", |s| *s == JobState::Succeeded);
    }
    let jobs = d.jobs();
    let held = jobs.iter().find(|j| j.id == 2).unwrap();
    let JobState::Held { reason } = &held.state else {
        panic!("{held:?}");
    };
    assert!(
        reason.contains("line 4")
            && reason.contains(&format!("ladle release --dir {} 2", dir.display())),
        "{reason}"
    );
    let Response::Released { id: 2 } = d.request(&Request::Release { id: 2 }) else {
        panic!("release refused");
    };
    d.wait_job(2, "succeeded", |s| *s == JobState::Succeeded);
    assert!(matches!(
        d.request(&Request::Release { id: 2 }),
        Response::Error { .. }
    ));
    d.stop();
    let order = std::fs::read_to_string(&ran).unwrap();
    assert_eq!(
        order, "1\n3\n4\n2\n",
        "each ran once, the held one after release"
    );
    // The release is journaled: a restart does not hold it again.
    let d = TestDaemon::start(&dir);
    assert!(d.jobs().iter().all(|j| j.state == JobState::Succeeded));
    d.stop();
}
