//! The daemon's settings for running inside a Slurm allocation, with real processes: job
//! logs apart from the state directory, only the allocated GPUs, and jobs taken down with
//! the daemon when it stops. Every wait is on what the daemon reports (its queue, a job's
//! log), bounded by a deadline that only catches a hang.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Daemon, wait_until};
use ladle_scheduler::allocation::GpuSelector;
use ladle_scheduler::daemon::{self, DaemonConfig, GpuBackend, MpsMode};
use ladle_scheduler::job::{JobSpec, JobState};
use ladle_scheduler::journal::{Journal, Outcome, Record};
use ladle_scheduler::protocol::{self, AttemptLogs, GpuView, JobView, Request, Response};
use ladle_scheduler::sys;
use ladle_scheduler::telemetry::{NvmlOptions, NvmlTelemetry, Telemetry, TelemetryError};

/// How long any wait may take before the test counts as hung.
const HANG: Duration = Duration::from_secs(60);

/// The common daemon on a private state directory, with its job logs' directory beside it.
struct TestDaemon {
    daemon: Daemon,
    dir: PathBuf,
    logs: PathBuf,
}

impl TestDaemon {
    /// Simulated GPUs, no MPS, a 50 ms tick; `configure` changes the rest.
    fn start(configure: impl FnOnce(&mut DaemonConfig, &Path)) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let logs = tmp.path().join("shared/logs");
        let mut config = common::sim_config(&dir);
        config.mps = MpsMode::Off;
        config.tick = Duration::from_millis(50);
        configure(&mut config, &logs);
        Self {
            daemon: Daemon::run(config, Some(tmp)),
            dir,
            logs,
        }
    }

    fn request(&self, request: &Request) -> Response {
        protocol::request(&daemon::socket_path(&self.dir), request, HANG).unwrap()
    }

    fn submit(&self, script: &str) -> u64 {
        let spec = JobSpec {
            gpu_mem_mib: Some(1024),
            ..JobSpec::new(
                vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()],
                "/".into(),
            )
        };
        match self.request(&Request::Submit(spec)) {
            Response::Submitted { id, .. } => id,
            other => panic!("{other:?}"),
        }
    }

    fn queue(&self) -> (Vec<JobView>, Vec<GpuView>) {
        match self.request(&Request::Queue) {
            Response::Queue { jobs, gpus, .. } => (jobs, gpus),
            other => panic!("{other:?}"),
        }
    }

    fn logs(&self, id: u64) -> Vec<AttemptLogs> {
        match self.request(&Request::Logs { id }) {
            Response::Logs { attempts, .. } => attempts,
            other => panic!("{other:?}"),
        }
    }

    /// Waits until job `id`'s state satisfies `done`, and returns it.
    fn wait_job(&self, id: u64, what: &str, done: impl Fn(&JobState) -> bool) -> JobState {
        wait_until(&format!("job {id} {what}"), HANG, || {
            let (jobs, _) = self.queue();
            let job = jobs.iter().find(|j| j.id == id).unwrap();
            if done(&job.state) {
                Ok(Some(job.state.clone()))
            } else {
                Err(format!("{job:?}"))
            }
        })
    }

    /// Waits until job `id` runs and its stdout holds `line`; returns its process group.
    fn wait_running_and_printed(&self, id: u64, line: &str) -> u32 {
        let state = self.wait_job(id, "ran", |s| {
            matches!(s, JobState::Running { pid: Some(_), .. })
        });
        let JobState::Running { pid: Some(pid), .. } = state else {
            unreachable!()
        };
        wait_until(&format!("job {id} printing {line:?}"), HANG, || {
            let printed = self
                .logs(id)
                .last()
                .is_some_and(|a| a.stdout.lines().any(|l| l == line));
            Ok::<_, String>(printed.then_some(()))
        });
        pid
    }

    /// Sets the stop flag and waits for `run` to return.
    fn stop(&mut self) {
        self.daemon.stop();
    }

    /// The journaled end of job `id`'s last attempt.
    fn journaled_end(&self, id: u64) -> (Outcome, String) {
        let (_, records) = Journal::open(&self.dir.join("journal.jsonl")).unwrap();
        records
            .into_iter()
            .rev()
            .find_map(|r| match r {
                Record::Finished {
                    id: i,
                    outcome,
                    reason,
                    ..
                } if i == id => Some((outcome, reason)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no end journaled for job {id}"))
    }
}

#[test]
fn a_daemon_with_a_log_dir_writes_job_output_there_and_logs_answers_those_paths() {
    let d = TestDaemon::start(|c, logs| c.log_dir = Some(logs.to_owned()));
    let id = d.submit("echo to-stdout; echo to-stderr >&2");
    d.wait_job(id, "succeeded", |s| *s == JobState::Succeeded);
    let attempts = d.logs(id);
    let [attempt] = &attempts[..] else {
        panic!("{attempts:?}")
    };
    assert_eq!(attempt.stdout_path, d.logs.join(format!("{id}/1.out")));
    assert_eq!(attempt.stderr_path, d.logs.join(format!("{id}/1.err")));
    assert_eq!(attempt.stdout, "to-stdout\n");
    assert_eq!(attempt.stderr, "to-stderr\n");
    assert_eq!(
        std::fs::read_to_string(&attempt.stdout_path).unwrap(),
        "to-stdout\n"
    );
    // The claim and status files stay in the (node-local) state directory, the logs do not.
    let jobs = d.dir.join(format!("jobs/{id}"));
    assert!(jobs.join("1.claim").is_file());
    assert_eq!(
        std::fs::read_to_string(jobs.join("1.status")).unwrap(),
        "0\n"
    );
    assert!(!jobs.join("1.out").exists() && !jobs.join("1.err").exists());
}

#[test]
fn without_a_log_dir_job_output_stays_in_the_state_directory() {
    let d = TestDaemon::start(|_, _| {});
    let id = d.submit("echo here");
    d.wait_job(id, "succeeded", |s| *s == JobState::Succeeded);
    let attempts = d.logs(id);
    assert_eq!(
        attempts[0].stdout_path,
        d.dir.join(format!("jobs/{id}/1.out"))
    );
    assert_eq!(attempts[0].stdout, "here\n");
    assert!(!d.logs.exists());
}

#[test]
fn an_allocation_of_simulated_gpus_schedules_one_gpu_per_allocated_gpu() {
    let d = TestDaemon::start(|c, _| {
        c.gpu = GpuBackend::Sim {
            gpus: 8,
            memory_mib: 40 * 1024,
        };
        c.allocated = Some(vec![
            GpuSelector::Index(2),
            GpuSelector::Uuid("GPU-8932f937".to_owned()),
        ]);
    });
    let (_, gpus) = d.queue();
    let uuids: Vec<&str> = gpus.iter().map(|g| g.info.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        ["GPU-simulated-dev-nvidia2", "GPU-simulated-GPU-8932f937"]
    );
    // A job gets its simulated GPU by that UUID, as it would a real one.
    let id = d.submit("echo \"$CUDA_VISIBLE_DEVICES\"");
    d.wait_job(id, "succeeded", |s| *s == JobState::Succeeded);
    let seen = d.logs(id)[0].stdout.trim().to_owned();
    assert!(uuids.contains(&seen.as_str()), "{seen}");
}

#[test]
#[allow(clippy::disallowed_methods)] // probes the group raw: is any process left in it?
fn a_stopping_daemon_sends_its_jobs_sigterm_and_waits_for_them_to_end() {
    let mut d = TestDaemon::start(|c, _| c.stop_jobs = Some(HANG));
    let id =
        d.submit(r#"trap "echo got-term; exit 0" TERM; echo ready; while :; do sleep 0.1; done"#);
    let pgid = d.wait_running_and_printed(id, "ready");
    let stdout = d.logs(id)[0].stdout_path.clone();
    d.stop();
    // Every process of the group ended and was reaped by its parent: the group is gone.
    let pid = rustix::process::Pid::from_raw(pgid as i32).unwrap();
    assert_eq!(
        rustix::process::test_kill_process_group(pid),
        Err(rustix::io::Errno::SRCH)
    );
    assert!(
        std::fs::read_to_string(&stdout)
            .unwrap()
            .contains("got-term")
    );
    let (outcome, reason) = d.journaled_end(id);
    assert_eq!(outcome, Outcome::Interrupted);
    assert!(
        reason.contains("stopped with the scheduler") && reason.contains("exit code 0"),
        "{reason}"
    );
}

#[test]
fn a_job_that_ignores_sigterm_is_killed_when_the_grace_runs_out() {
    let mut d = TestDaemon::start(|c, _| c.stop_jobs = Some(Duration::from_millis(500)));
    let id = d.submit(r#"trap "" TERM; echo ready; while :; do sleep 0.1; done"#);
    let pgid = d.wait_running_and_printed(id, "ready");
    d.stop();
    // No process of the group is left alive (a killed shell's orphaned `sleep` may stay a
    // zombie until init reaps it, which some containers' first process never does).
    assert!(!sys::group_alive(pgid));
    let (outcome, reason) = d.journaled_end(id);
    assert_eq!(outcome, Outcome::Interrupted);
    assert!(
        reason.contains("stopped with the scheduler") && reason.contains("signal 9"),
        "{reason}"
    );
}

#[test]
fn without_stop_jobs_a_stopping_daemon_leaves_its_jobs_running() {
    let mut d = TestDaemon::start(|_, _| {});
    let id = d.submit("echo ready; while :; do sleep 0.1; done");
    let pgid = d.wait_running_and_printed(id, "ready");
    d.stop();
    assert!(sys::group_alive(pgid), "the job should outlive the daemon");
    let leader = sys::ProcessId::of(pgid).expect("the job's leader runs");
    assert!(leader.signal_group(sys::Signal::KILL).unwrap());
}

/// NVML when this machine has a driver: the GPUs an allocation names by device file or UUID
/// are kept, and a GPU it does not have is a typed error naming it. Without a driver the
/// backend must fail with [`TelemetryError::NvmlUnavailable`].
#[test]
fn an_nvml_allocation_keeps_the_named_gpus_and_refuses_one_that_is_not_there() {
    let all = match NvmlTelemetry::open() {
        Ok(nvml) => nvml.gpus().to_vec(),
        Err(TelemetryError::NvmlUnavailable { .. }) => return,
        Err(e) => panic!("{e}"),
    };
    let first = &all[0];
    let by_uuid = NvmlTelemetry::open_with(&NvmlOptions {
        allocated: Some(vec![GpuSelector::Uuid(first.uuid.clone())]),
        ..NvmlOptions::default()
    })
    .unwrap();
    let kept = by_uuid.gpus();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].uuid, first.uuid);
    assert_eq!(kept[0].index, first.index, "NVML's index is kept");
    // By device file: the first /dev/nvidiaN there is names one GPU NVML sees.
    let minor = (0..64).find(|n| Path::new(&format!("/dev/nvidia{n}")).exists());
    if let Some(n) = minor {
        let by_file = NvmlTelemetry::open_with(&NvmlOptions {
            allocated: Some(vec![GpuSelector::Index(n)]),
            ..NvmlOptions::default()
        })
        .unwrap();
        assert_eq!(by_file.gpus().len(), 1);
    }
    let missing = NvmlTelemetry::open_with(&NvmlOptions {
        allocated: Some(vec![GpuSelector::Index(1000)]),
        ..NvmlOptions::default()
    });
    match missing {
        Err(e @ TelemetryError::NotAllocated { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("/dev/nvidia1000") && text.contains(&first.uuid),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
}
