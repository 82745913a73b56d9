//! The scheduler as real processes: `ladle scheduler` on simulated GPUs, jobs that are real
//! shell commands (they print, sleep, fail, or exit like a CUDA out-of-memory crash), the
//! clients `ladle submit/queue/cancel/logs`, SIGKILL of the daemon, and `ladle sim`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ladle_tests::{Fixture, wait_for_listener, wait_until};
use serde_json::Value;

/// Deadlock guard for anything we wait on; never a speed assertion.
const GUARD: Duration = Duration::from_secs(120);

struct Scheduler {
    fx: Fixture,
    daemon: usize,
}

impl Scheduler {
    /// A daemon on `gpus` simulated GPUs of 40 GiB, no settle lock (so tests do not wait).
    /// Returns once every GPU's telemetry window is full (no GPU takes a collocated job
    /// before), 3 s at the tests' 100 ms tick.
    fn start(gpus: u32, extra: &[&str]) -> Self {
        let mut s = Self::start_unchecked(gpus, extra);
        wait_until("every GPU's telemetry window full", GUARD, || {
            let q = s.queue();
            let gpus = q["gpus"].as_array().unwrap();
            if gpus.iter().all(|g| g["window_full"] == true) {
                Ok(Some(()))
            } else {
                Err(q.to_string())
            }
        });
        s
    }

    /// A daemon as [`Scheduler::start`] without waiting for its windows.
    fn start_unchecked(gpus: u32, extra: &[&str]) -> Self {
        let mut fx = Fixture::new();
        let daemon = spawn_daemon(&mut fx, gpus, extra);
        Self { fx, daemon }
    }

    fn dir(&self) -> PathBuf {
        self.fx.path().join("sched")
    }

    fn dir_arg(&self) -> String {
        self.dir().to_str().unwrap().to_owned()
    }

    fn file(&self, name: &str) -> String {
        self.fx.path().join(name).to_str().unwrap().to_owned()
    }

    /// `ladle submit ARGS -- sh -c SCRIPT`; returns the job id.
    fn submit(&mut self, args: &[&str], script: &str) -> u64 {
        let dir = self.dir_arg();
        let mut all = vec!["submit", "--dir", &dir, "--json"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "sh", "-c", script]);
        let done = self.fx.run(&all, GUARD);
        assert!(done.status.success(), "submit failed: {}", done.stderr);
        let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
        v["id"].as_u64().unwrap()
    }

    fn queue(&mut self) -> Value {
        let dir = self.dir_arg();
        let done = self.fx.run(&["queue", "--dir", &dir, "--json"], GUARD);
        assert!(done.status.success(), "queue failed: {}", done.stderr);
        serde_json::from_str(done.stdout.trim()).unwrap()
    }

    fn job(&mut self, id: u64) -> Value {
        let q = self.queue();
        q["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no job {id} in {q}"))
    }

    /// Waits until job `id` is in one of `states`; returns it.
    fn wait_for(&mut self, id: u64, states: &[&str]) -> Value {
        wait_until(&format!("job {id} in {states:?}"), GUARD, || {
            let job = self.job(id);
            if states.iter().any(|s| job["state"] == *s) {
                Ok(Some(job))
            } else {
                Err(job.to_string())
            }
        })
    }
}

fn spawn_daemon(fx: &mut Fixture, gpus: u32, extra: &[&str]) -> usize {
    let dir = fx.path().join("sched");
    let socket = dir.join("scheduler.sock");
    let _ = std::fs::remove_file(&socket);
    let gpus = gpus.to_string();
    let dir_s = dir.to_str().unwrap().to_owned();
    let mut args = vec![
        "scheduler",
        "--dir",
        &dir_s,
        "--gpu",
        "sim",
        "--sim-gpus",
        &gpus,
        "--sim-gpu-mem",
        "40GiB",
    ];
    if !extra.contains(&"--settle-s") {
        args.extend_from_slice(&["--settle-s", "0"]);
    }
    // Telemetry windows (30 samples) fill in 3 s instead of 30.
    if !extra.contains(&"--tick-ms") {
        args.extend_from_slice(&["--tick-ms", "100"]);
    }
    args.extend_from_slice(extra);
    let i = fx.spawn(&args);
    wait_for_listener(&socket, GUARD, "ladle scheduler coming up");
    i
}

/// The state of job `id` in a `ladle queue --json` answer (null if it is not there).
fn state_in(queue: &Value, id: u64) -> Value {
    queue["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id)
        .map_or(Value::Null, |j| j["state"].clone())
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn submitted_jobs_run_as_child_processes_with_their_own_logs() {
    let mut s = Scheduler::start(2, &[]);
    let id = s.submit(&["--gpu-mem", "6GiB"], "echo out-line; echo err-line >&2; echo \"$CUDA_VISIBLE_DEVICES $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\"");
    let job = s.wait_for(id, &["succeeded"]);
    assert_eq!(job["estimate_mib"], 6144);
    let dir = s.dir_arg();
    let logs = s.fx.run(&["logs", "--dir", &dir, &id.to_string()], GUARD);
    assert!(logs.status.success(), "{}", logs.stderr);
    assert!(logs.stdout.contains("out-line"), "{}", logs.stdout);
    assert!(logs.stdout.contains("err-line"), "{}", logs.stdout);
    // The job saw its GPU by UUID, and its MPS memory limit keyed by the same UUID: the
    // room its GPU had for it (40 GiB less the 512 MiB reserve; it was alone).
    assert!(
        logs.stdout.contains(
            "GPU-00000000-0000-4000-8000-000000000000 GPU-00000000-0000-4000-8000-000000000000=40448M"
        ),
        "{}",
        logs.stdout
    );
}

#[test]
fn a_job_that_declares_no_memory_runs_alone_unlimited_until_measured_then_is_packed_with() {
    let mut s = Scheduler::start(1, &["--measure-s", "1"]);
    let release = s.file("release");
    let guessed = s.submit(
        &[],
        &format!(
            "echo \"limit=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\"; while [ ! -e {release} ]; do sleep 0.05; done"
        ),
    );
    let job = s.wait_for(guessed, &["running"]);
    assert_eq!(job["basis"], "guess", "{job}");
    assert_eq!(job["estimate_mib"], 4096, "the default guess");
    // A declared job waits until the guess is measured (seen 1 s with full windows), then
    // joins it on the one GPU.
    let declared = s.submit(
        &["--gpu-mem", "1GiB"],
        "echo \"limit=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\"",
    );
    s.wait_for(declared, &["succeeded"]);
    let job = s.job(guessed);
    assert_eq!(job["state"], "running", "they overlapped: {job}");
    assert_eq!(job["measured"], true, "{job}");
    let out = |s: &mut Scheduler, id: u64| {
        let dir = s.dir_arg();
        let logs = s.fx.run(&["logs", "--dir", &dir, &id.to_string()], GUARD);
        assert!(logs.status.success(), "{}", logs.stderr);
        logs.stdout
    };
    let guessed_out = out(&mut s, guessed);
    assert!(
        guessed_out.contains("limit=\n"),
        "a guess gives no MPS memory limit: {guessed_out}"
    );
    // The declared job's limit is the room it had: 40 GiB less the measured job's
    // reservation (1.1 × its 4 GiB) and the 512 MiB reserve.
    let declared_out = out(&mut s, declared);
    assert!(
        declared_out.contains("=35942M"),
        "a declared estimate gives one: {declared_out}"
    );
    std::fs::write(&release, "").unwrap();
    s.wait_for(guessed, &["succeeded"]);
}

#[test]
fn the_settle_lock_ends_once_the_new_job_is_seen_on_its_gpu_not_after_a_fixed_time() {
    // A settle lock of 10 minutes: the second job can only start while the first still
    // runs if the lock ended when the first was seen (simulated GPUs show a job at once).
    let mut s = Scheduler::start(1, &["--settle-s", "600"]);
    let first = s.submit(&["--gpu-mem", "1GiB"], "sleep 120");
    s.wait_for(first, &["running"]);
    let second = s.submit(&["--gpu-mem", "1GiB"], "echo ran");
    s.wait_for(second, &["succeeded"]);
    assert_eq!(s.job(first)["state"], "running", "they overlapped");
    let dir = s.dir_arg();
    let cancel =
        s.fx.run(&["cancel", "--dir", &dir, &first.to_string()], GUARD);
    assert!(cancel.status.success(), "{}", cancel.stderr);
    s.wait_for(first, &["cancelled"]);
}

#[test]
fn an_out_of_memory_exit_is_retried_alone_with_a_raised_estimate() {
    let mut s = Scheduler::start(2, &[]);
    let flag = s.file("crashed-once");
    let script = format!(
        "if [ -e {flag} ]; then echo fine; else touch {flag}; echo 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1; fi"
    );
    let id = s.submit(&["--gpu-mem", "4GiB"], &script);
    let job = s.wait_for(id, &["succeeded", "failed"]);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempts"], 2);
    assert_eq!(job["oom_retries"], 1);
    assert_eq!(job["exclusive"], true);
    // The retry is estimated from what the attempt was seen holding (on a simulated GPU,
    // its 4 GiB estimate): 1.1 × 4096, not 1.5 × an estimate.
    assert_eq!(job["estimate_mib"], 4506, "1.1 × the 4 GiB it held");
}

#[test]
fn out_of_memory_retries_are_bounded_and_other_failures_are_not_retried() {
    let mut s = Scheduler::start(1, &["--max-oom-retries", "2"]);
    let oom = s.submit(&[], "echo CUDA_ERROR_OUT_OF_MEMORY >&2; exit 1");
    let plain = s.submit(&[], "echo something else broke >&2; exit 3");
    let job = s.wait_for(oom, &["failed"]);
    assert_eq!(job["attempts"], 3, "{job}");
    assert!(
        job["reason"].as_str().unwrap().contains("out of memory"),
        "{job}"
    );
    let job = s.wait_for(plain, &["failed"]);
    assert_eq!(job["attempts"], 1, "{job}");
    assert_eq!(job["reason"], "exit code 3");
}

#[test]
fn an_observed_peak_becomes_the_next_estimate_for_the_same_command() {
    let mut s = Scheduler::start(1, &[]);
    // The job runs until the daemon says it has seen its peak (the second, same command ends
    // at once).
    let release = s.file("release");
    let script = format!(
        "echo 'ladle-sim: mem_mib=3000 sm=0.2'; while [ ! -e {release} ]; do sleep 0.05; done"
    );
    let first = s.submit(&[], &script);
    wait_until("the daemon seeing the job's peak", GUARD, || {
        let job = s.job(first);
        if job["peak_mib"] == 3000 {
            Ok(Some(()))
        } else {
            Err(job.to_string())
        }
    });
    std::fs::write(&release, "").unwrap();
    let job = s.wait_for(first, &["succeeded"]);
    assert_eq!(job["estimate_mib"], 4096, "the default estimate");
    assert_eq!(job["peak_mib"], 3000);
    let second = s.submit(&[], &script);
    assert_eq!(
        s.job(second)["estimate_mib"],
        3300,
        "1.1 × the observed peak"
    );
}

#[test]
fn cancel_drops_a_queued_job_and_stops_a_running_one() {
    let mut s = Scheduler::start(1, &["--policy", "exclusive"]);
    let running = s.submit(&[], "sleep 60");
    let queued = s.submit(&[], "echo should-not-run");
    s.wait_for(running, &["running"]);
    let dir = s.dir_arg();
    for id in [queued, running] {
        let done = s.fx.run(&["cancel", "--dir", &dir, &id.to_string()], GUARD);
        assert!(done.status.success(), "{}", done.stderr);
    }
    s.wait_for(running, &["cancelled"]);
    assert_eq!(s.job(queued)["state"], "cancelled");
    assert_eq!(s.job(queued)["attempts"], 0);
    let again =
        s.fx.run(&["cancel", "--dir", &dir, &queued.to_string()], GUARD);
    assert!(!again.status.success(), "cancelling twice is an error");
}

#[test]
fn a_cancel_gives_a_running_job_the_grace_it_asks_for_then_sigkill() {
    // `ladle sweep --stop-grace 15` once got 10 s: the scheduler's own grace cut it short.
    let mut s = Scheduler::start(2, &[]);
    let dir = s.dir_arg();
    let job = |s: &mut Scheduler, name: &str, checkpoint_s: u32| {
        let (ready, term, done) = (
            s.file(&format!("{name}-ready")),
            s.file(&format!("{name}-term")),
            s.file(&format!("{name}-done")),
        );
        let script = format!(
            "trap 'touch {term}; sleep {checkpoint_s}; touch {done}; exit 0' TERM; touch {ready}; \
             while :; do sleep 0.1; done"
        );
        let id = s.submit(&[], &script);
        wait_until(&format!("{name} ready"), GUARD, || {
            Ok(Path::new(&ready).exists().then_some(()))
        });
        (id, term, done)
    };
    // Longer than the default 10 s, inside the 30 s asked for.
    let (slow, slow_term, slow_done) = job(&mut s, "slow", 11);
    // Far longer than the half second asked for.
    let (killed, killed_term, killed_done) = job(&mut s, "killed", 60);
    for (id, grace) in [(slow, "30"), (killed, "0.5")] {
        let done = s.fx.run(
            &["cancel", "--dir", &dir, &id.to_string(), "--grace", grace],
            GUARD,
        );
        assert!(done.status.success(), "{}", done.stderr);
    }
    for id in [slow, killed] {
        s.wait_for(id, &["cancelled"]);
    }
    assert!(Path::new(&slow_term).exists() && Path::new(&killed_term).exists());
    assert!(
        Path::new(&slow_done).exists(),
        "the slow job was killed in its grace"
    );
    assert!(
        !Path::new(&killed_done).exists(),
        "the killed job was not killed"
    );
    // A grace that is no number of seconds is refused, naming the limit.
    let bad = s.fx.run(
        &["cancel", "--dir", &dir, &slow.to_string(), "--grace", "1e9"],
        GUARD,
    );
    assert!(!bad.status.success());
    assert!(bad.stderr.contains("3600"), "{}", bad.stderr);
}

#[test]
fn the_socket_is_private_and_garbage_on_it_gets_an_error_not_a_crash() {
    let mut s = Scheduler::start(1, &[]);
    let socket = s.dir().join("scheduler.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    for garbage in [
        &b"\x00\xff\x13garbage\n"[..],
        b"{\"v\":99,\"op\":\"queue\"}\n",
        b"{\"v\":1,\"op\":\"submit\"}\n",
    ] {
        let mut conn = UnixStream::connect(&socket).unwrap();
        conn.set_read_timeout(Some(GUARD)).unwrap();
        conn.write_all(garbage).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        let v: Value = serde_json::from_str(answer.trim()).unwrap();
        assert_eq!(v["status"], "error", "{answer}");
    }
    // A client that connects and says nothing, and one that hangs up mid-line.
    drop(UnixStream::connect(&socket).unwrap());
    let mut half = UnixStream::connect(&socket).unwrap();
    half.write_all(b"{\"v\":1,").unwrap();
    drop(half);
    let id = s.submit(&[], "true");
    s.wait_for(id, &["succeeded"]);
}

#[test]
fn jobs_needing_more_gpus_than_exist_are_refused() {
    let mut s = Scheduler::start(2, &[]);
    let dir = s.dir_arg();
    let done = s.fx.run(
        &["submit", "--dir", &dir, "--gpus-per-job", "3", "--", "true"],
        GUARD,
    );
    assert!(!done.status.success());
    assert!(done.stderr.contains("3 GPUs"), "{}", done.stderr);
}

#[test]
fn the_old_gpus_option_is_refused_naming_what_replaced_it() {
    let mut s = Scheduler::start(1, &[]);
    let dir = s.dir_arg();
    let done = s.fx.run(
        &["submit", "--dir", &dir, "--gpus", "2", "--", "true"],
        GUARD,
    );
    assert!(!done.status.success());
    assert!(done.stderr.contains("--gpus-per-job 2"), "{}", done.stderr);
    let other = s.fx.path().join("other");
    let done = s.fx.run(
        &[
            "scheduler",
            "--dir",
            other.to_str().unwrap(),
            "--gpu",
            "sim",
            "--gpus",
            "0",
        ],
        GUARD,
    );
    assert!(!done.status.success());
    assert!(done.stderr.contains("--only-gpus 0"), "{}", done.stderr);
}

#[test]
fn a_second_daemon_on_the_same_directory_is_refused() {
    let mut s = Scheduler::start(1, &[]);
    let dir = s.dir_arg();
    let done =
        s.fx.run(&["scheduler", "--dir", &dir, "--gpu", "sim"], GUARD);
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("another ladle scheduler"),
        "{}",
        done.stderr
    );
}

#[test]
fn without_a_gpu_driver_the_default_refuses_to_start_and_names_gpu_sim() {
    // The default `--gpu auto` once fell back to simulated GPUs: runs then trained on the CPU
    // while the scheduler showed GPUs. This is about machines without a driver.
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has an NVIDIA driver (/dev/nvidiactl)");
        return;
    }
    let mut fx = Fixture::new();
    let dir = fx.path().join("state");
    let dir = dir.to_str().unwrap();
    for gpu in [&[][..], &["--gpu", "auto"], &["--gpu", "nvml"]] {
        let mut args = vec!["scheduler", "--dir", dir];
        args.extend(gpu);
        let done = fx.run(&args, GUARD);
        assert!(!done.status.success(), "{gpu:?} started: {}", done.stderr);
        assert!(
            done.stderr.contains("NVML") && done.stderr.contains("--gpu sim"),
            "{gpu:?}: {}",
            done.stderr
        );
    }
}

/// `ladle scheduler --gpu sim --sim-gpus 3 EXTRA` in the environment `env` (and nothing of
/// the test's own GPU or Slurm variables), as a [`Scheduler`].
fn scheduler_given(env: &[&str], extra: &[&str]) -> Scheduler {
    let mut fx = Fixture::new();
    let daemon = spawn_given(&mut fx, env, extra);
    Scheduler { fx, daemon }
}

/// [`scheduler_given`]'s daemon, in `fx`'s directory (a restart finds its journal there).
fn spawn_given(fx: &mut Fixture, env: &[&str], extra: &[&str]) -> usize {
    let dir = fx.path().join("sched");
    let _ = std::fs::remove_file(dir.join("scheduler.sock"));
    let dir_s = dir.to_str().unwrap().to_owned();
    let mut argv = vec![
        "env",
        "-u",
        "CUDA_VISIBLE_DEVICES",
        "-u",
        "CUDA_DEVICE_ORDER",
        "-u",
        "SLURM_JOB_ID",
        "-u",
        "SLURM_JOB_GPUS",
        "-u",
        "SLURM_STEP_GPUS",
    ];
    argv.extend(env);
    argv.extend([
        ladle_tests::ladle_bin().to_str().unwrap(),
        "scheduler",
        "--dir",
        &dir_s,
        "--gpu",
        "sim",
        "--sim-gpus",
        "3",
        "--settle-s",
        "0",
        "--tick-ms",
        "100",
    ]);
    argv.extend(extra);
    let daemon = fx.spawn_program(&argv);
    wait_for_listener(
        &dir.join("scheduler.sock"),
        GUARD,
        "ladle scheduler coming up",
    );
    daemon
}

#[test]
fn a_job_started_after_a_scheduler_restart_still_gets_its_submitters_environment() {
    // One GPU, one job at a time: the job waits behind another while the scheduler is
    // killed and a scheduler with another environment takes over.
    let one = ["--policy", "exclusive", "--only-gpus", "GPU-aa"];
    let mut s = scheduler_given(&["FOO=first-scheduler"], &one);
    let blocker = s.submit(&[], "sleep 600");
    s.wait_for(blocker, &["running"]);
    let out = s.file("foo");
    let dir = s.dir_arg();
    let ladle = ladle_tests::ladle_bin().to_str().unwrap().to_owned();
    let script = format!("echo \"$FOO\" > {out}");
    let i = s.fx.spawn_program(&[
        "env",
        "FOO=submitter",
        &ladle,
        "submit",
        "--dir",
        &dir,
        "--json",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let done = s.fx.wait(i, GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    let id = serde_json::from_str::<Value>(done.stdout.trim()).unwrap()["id"]
        .as_u64()
        .unwrap();
    assert_eq!(s.job(id)["state"], "queued");
    s.fx.signal(s.daemon, 9);
    s.fx.wait(s.daemon, GUARD);
    s.daemon = spawn_given(&mut s.fx, &["FOO=second-scheduler"], &one);
    let cancel =
        s.fx.run(&["cancel", "--dir", &dir, &blocker.to_string()], GUARD);
    assert!(cancel.status.success(), "{}", cancel.stderr);
    s.wait_for(id, &["succeeded"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "submitter");
}

#[test]
fn a_scheduler_takes_only_the_gpus_its_process_was_given_and_says_why() {
    // Simulated GPU i stands for CUDA device i; a UUID in a job's CUDA_VISIBLE_DEVICES says
    // which it got.
    let uuid = |i: u32| format!("GPU-00000000-0000-4000-8000-{i:012x}");
    // (environment, options, the GPUs' UUIDs, why)
    type Case<'a> = (&'a [&'a str], &'a [&'a str], Vec<String>, &'a str);
    let cases: [Case<'_>; 4] = [
        (&[], &[], (0..3).map(uuid).collect(), "every GPU"),
        (
            &["CUDA_VISIBLE_DEVICES=2,1"],
            &[],
            vec![uuid(2), uuid(1)],
            "CUDA_VISIBLE_DEVICES=2,1 (CUDA's order)",
        ),
        // --only-gpus chooses whatever the environment says.
        (
            &["CUDA_VISIBLE_DEVICES=2,1"],
            &["--only-gpus", "GPU-feed"],
            vec!["GPU-simulated-GPU-feed".to_owned()],
            "--only-gpus GPU-feed",
        ),
        // Inside a Slurm job, Slurm's devices (not CUDA's renumbered ones).
        (
            &[
                "SLURM_JOB_ID=9",
                "SLURM_JOB_GPUS=7",
                "CUDA_VISIBLE_DEVICES=0",
            ],
            &[],
            vec!["GPU-simulated-dev-nvidia7".to_owned()],
            "SLURM_JOB_GPUS=7",
        ),
    ];
    for (env, extra, uuids, why) in cases {
        let mut s = scheduler_given(env, extra);
        let q = s.queue();
        let got: Vec<&str> = (q["gpus"].as_array().unwrap().iter())
            .map(|g| g["uuid"].as_str().unwrap())
            .collect();
        assert_eq!(got, uuids, "{env:?} {extra:?}: {q}");
        match q["gpus_from"].as_str() {
            Some(from) => assert_eq!(from, why, "{env:?}"),
            None => assert_eq!(why, "every GPU", "{env:?}: {q}"),
        }
        let dir = s.dir_arg();
        let text = s.fx.run(&["queue", "--dir", &dir], GUARD);
        assert!(text.stdout.contains(why), "{env:?}: {}", text.stdout);
        // Every job runs on the given GPUs only.
        let out = s.file("cvd");
        let id = s.submit(&[], &format!("echo $CUDA_VISIBLE_DEVICES > {out}"));
        s.wait_for(id, &["succeeded"]);
        let seen = std::fs::read_to_string(&out).unwrap();
        assert!(uuids.iter().any(|u| seen.trim() == u), "{env:?}: {seen}");
        s.fx.signal(s.daemon, 15);
        s.fx.wait(s.daemon, GUARD);
    }
}

#[test]
fn a_job_gets_its_submitters_environment_not_the_schedulers_and_no_secret_is_shown() {
    let mut s = scheduler_given(&["FOO=scheduler", "ONLY_SCHEDULER=1"], &[]);
    let dir = s.dir_arg();
    let ladle = ladle_tests::ladle_bin().to_str().unwrap().to_owned();
    let submit = |s: &mut Scheduler, export: &str, out: &str| -> u64 {
        let script = format!(
            "echo \"$FOO|$BAR|$ONLY_SCHEDULER|$CUDA_VISIBLE_DEVICES|$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\" > {out}"
        );
        let i = s.fx.spawn_program(&[
            "env",
            "FOO=submitter",
            "BAR=bar",
            "WANDB_API_KEY=s3cret-value",
            // Inside the scheduler's GPUs (a GPU outside them is refused: the next test).
            "CUDA_VISIBLE_DEVICES=1",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M",
            &ladle,
            "submit",
            "--dir",
            &dir,
            "--json",
            "--export",
            export,
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let done = s.fx.wait(i, GUARD);
        assert!(done.status.success(), "{}", done.stderr);
        let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
        v["id"].as_u64().unwrap()
    };
    let gpu = "GPU-00000000-0000-4000-8000-";
    for (export, want) in [
        // As sbatch --export=ALL: the submitter's, nothing of the scheduler's.
        ("ALL", "submitter|bar||"),
        // Today's: the scheduler's.
        ("NONE", "scheduler||1|"),
        ("BAR", "scheduler|bar|1|"),
    ] {
        let out = s.file(&format!("env-{export}"));
        let id = submit(&mut s, export, &out);
        s.wait_for(id, &["succeeded"]);
        let seen = std::fs::read_to_string(&out).unwrap();
        // Whatever the submitter had, the job runs on its own GPU, under no limit of theirs.
        assert!(
            seen.starts_with(want) && seen.contains(gpu) && seen.trim_end().ends_with('|'),
            "--export {export}: {seen:?}"
        );
    }
    // No answer and no log of the scheduler shows a secret (nor the rest of a submitter's
    // environment).
    let dir_arg = s.dir_arg();
    for args in [
        vec!["queue", "--dir", &dir_arg, "--json"],
        vec!["queue", "--dir", &dir_arg, "--json", "--all"],
        vec!["queue", "--dir", &dir_arg],
    ] {
        let q = s.fx.run(&args, GUARD);
        assert!(q.status.success(), "{}", q.stderr);
        assert!(!q.stdout.contains("s3cret"), "{}", q.stdout);
    }
    // A named variable that is not set is refused, naming it.
    let i = s.fx.spawn_program(&[
        &ladle,
        "submit",
        "--dir",
        &dir,
        "--export",
        "NOT_SET_ANYWHERE",
        "--",
        "true",
    ]);
    let done = s.fx.wait(i, GUARD);
    assert!(!done.status.success());
    assert!(done.stderr.contains("NOT_SET_ANYWHERE"), "{}", done.stderr);
    // The journal keeps the environments, for jobs started after a restart: its owner's only.
    let journal = std::fs::metadata(s.dir().join("journal.jsonl")).unwrap();
    assert_eq!(journal.permissions().mode() & 0o777, 0o600);
    s.fx.signal(s.daemon, 15);
    let stopped = s.fx.wait(s.daemon, GUARD);
    assert!(!stopped.stderr.contains("s3cret"), "{}", stopped.stderr);
}

/// `ladle submit --json [ARGS] -- sh -c SCRIPT` in the test's environment plus `env`: the job's
/// id, or what `ladle submit` printed on stderr when it refused.
fn submit_in(s: &mut Scheduler, env: &[&str], args: &[&str], script: &str) -> Result<u64, String> {
    let dir = s.dir_arg();
    let ladle = ladle_tests::ladle_bin().to_str().unwrap().to_owned();
    let mut argv = vec!["env", "-u", "CUDA_VISIBLE_DEVICES", "-u", "SLURM_JOB_ID"];
    argv.extend(env);
    argv.extend([ladle.as_str(), "submit", "--dir", &dir, "--json"]);
    argv.extend(args);
    argv.extend(["--", "sh", "-c", script]);
    let i = s.fx.spawn_program(&argv);
    let done = s.fx.wait(i, GUARD);
    if !done.status.success() {
        return Err(done.stderr);
    }
    let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    Ok(v["id"].as_u64().unwrap())
}

#[test]
fn a_job_runs_only_on_the_gpus_its_submitter_was_given_and_one_given_others_is_refused() {
    // The scheduler has CUDA devices 2 and 1 of a simulated machine of 3 (its GPUs 0 and 1,
    // in that order); simulated GPU i stands for CUDA device i.
    let uuid = |i: u32| format!("GPU-00000000-0000-4000-8000-{i:012x}");
    let mut s = scheduler_given(&["CUDA_VISIBLE_DEVICES=2,1"], &[]);
    // (submitter's environment, options, the GPUs the job must see)
    let u1 = format!("CUDA_VISIBLE_DEVICES={}", uuid(1));
    let cases: [(&[&str], &[&str], &str); 4] = [
        // Left to itself the scheduler would take its first GPU, CUDA device 2.
        (&["CUDA_VISIBLE_DEVICES=1"], &[], &uuid(1)),
        (&[&u1], &[], &uuid(1)),
        (
            &["CUDA_VISIBLE_DEVICES=1,2"],
            &["--gpus-per-job", "2"],
            &format!("{},{}", uuid(2), uuid(1)),
        ),
        // --export NONE: the submitter's GPUs do not come with the job, nor confine it.
        (&["CUDA_VISIBLE_DEVICES=0"], &["--export", "NONE"], &uuid(2)),
    ];
    for (env, args, want) in cases {
        let out = s.file("cvd");
        let id = submit_in(
            &mut s,
            env,
            args,
            &format!("echo $CUDA_VISIBLE_DEVICES > {out}"),
        )
        .unwrap_or_else(|e| panic!("{env:?} {args:?} refused: {e}"));
        s.wait_for(id, &["succeeded"]);
        let seen = std::fs::read_to_string(&out).unwrap();
        assert_eq!(seen.trim(), want, "{env:?} {args:?}");
    }
    // A GPU of the machine the scheduler does not have: refused, naming both sets.
    let err = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=0"], &[], "true").unwrap_err();
    assert!(
        err.contains("CUDA_VISIBLE_DEVICES=0")
            && err.contains(&uuid(0))
            && err.contains(&uuid(1))
            && err.contains(&uuid(2))
            && err.contains("given by CUDA_VISIBLE_DEVICES=2,1"),
        "{err}"
    );
    // More GPUs than the submitter was given, and a device the machine lacks.
    let err = submit_in(
        &mut s,
        &["CUDA_VISIBLE_DEVICES=1"],
        &["--gpus-per-job", "2"],
        "true",
    )
    .unwrap_err();
    assert!(
        err.contains("asks for 2 GPUs") && err.contains("gives it 1"),
        "{err}"
    );
    let err = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=5"], &[], "true").unwrap_err();
    assert!(
        err.contains("CUDA device 5") && err.contains("3 GPUs"),
        "{err}"
    );
    // Nothing refused was queued: the four jobs above are all the scheduler knows.
    let q = s.queue();
    assert_eq!(q["jobs"].as_array().map_or(0, Vec::len), 4, "{q}");
}

#[test]
fn a_queued_job_whose_gpus_a_restarted_scheduler_lacks_is_cancelled_not_run_elsewhere() {
    // CUDA devices 2 and 1, one job at a time: a job given device 1 waits behind a blocker.
    let one_at_a_time = ["--policy", "exclusive"];
    let mut s = scheduler_given(&["CUDA_VISIBLE_DEVICES=2,1"], &one_at_a_time);
    let blocker = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=1"], &[], "sleep 600").unwrap();
    s.wait_for(blocker, &["running"]);
    let waiting = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=1"], &[], "true").unwrap();
    assert_eq!(s.job(waiting)["state"], "queued");
    // The scheduler comes back with device 2 only: the waiting job's GPU is not there.
    s.fx.signal(s.daemon, 9);
    s.fx.wait(s.daemon, GUARD);
    s.daemon = spawn_given(&mut s.fx, &["CUDA_VISIBLE_DEVICES=2"], &one_at_a_time);
    let job = s.wait_for(waiting, &["cancelled", "succeeded", "running"]);
    assert_eq!(job["state"], "cancelled", "{job}");
}

#[test]
fn a_cuda_device_the_machine_lacks_is_refused_naming_it() {
    let mut fx = Fixture::new();
    let dir = fx.path().join("sched");
    let i = fx.spawn_program(&[
        "env",
        "-u",
        "SLURM_JOB_ID",
        "CUDA_VISIBLE_DEVICES=0,5",
        ladle_tests::ladle_bin().to_str().unwrap(),
        "scheduler",
        "--dir",
        dir.to_str().unwrap(),
        "--gpu",
        "sim",
        "--sim-gpus",
        "2",
    ]);
    let done = fx.wait(i, GUARD);
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("CUDA device 5") && done.stderr.contains("2 GPUs"),
        "{}",
        done.stderr
    );
}

#[test]
fn a_sigkilled_daemon_restarts_and_no_job_is_lost_or_run_twice() {
    // One simulated GPU and the exclusive policy: jobs run one at a time, so at each kill
    // some have finished, one is running and the rest are queued.
    let mut fx = Fixture::new();
    let daemon = spawn_daemon(&mut fx, 1, &["--policy", "exclusive"]);
    let mut s = Scheduler { fx, daemon };
    let runs = s.file("runs.txt");
    let ids: Vec<u64> = (0..6)
        .map(|_| s.submit(&[], &format!("echo $LADLE_JOB_ID >> {runs}; sleep 0.7")))
        .collect();
    for round in 0..3 {
        // Let a job or two run, then kill the daemon outright and start it again.
        wait_until(&format!("progress before kill {round}"), GUARD, || {
            let ran = lines(Path::new(&runs)).len();
            Ok::<_, String>((ran > 2 * round).then_some(()))
        });
        s.fx.signal(s.daemon, 9);
        s.fx.wait(s.daemon, GUARD);
        s.daemon = spawn_daemon(&mut s.fx, 1, &["--policy", "exclusive"]);
    }
    for &id in &ids {
        let job = s.wait_for(id, &["succeeded", "failed", "interrupted", "cancelled"]);
        assert_eq!(job["state"], "succeeded", "{job}");
    }
    let mut ran: Vec<u64> = lines(Path::new(&runs))
        .iter()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    ran.sort_unstable();
    assert_eq!(ran, ids, "every job ran exactly once");
}

#[test]
fn a_jobs_cpu_time_is_measured_with_its_childrens_and_survives_a_restart() {
    let mut s = Scheduler::start(1, &[]);
    // The busy loop runs in a child of the job's shell: it counts as the job's.
    let busy = s.submit(
        &["--gpu-mem", "1GiB"],
        "sh -c 'i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done'",
    );
    let idle = s.submit(&["--gpu-mem", "1GiB"], "sleep 0.5");
    let busy_job = s.wait_for(busy, &["succeeded", "failed"]);
    let idle_job = s.wait_for(idle, &["succeeded", "failed"]);
    assert_eq!(busy_job["state"], "succeeded", "{busy_job}");
    let (busy_cpu, idle_cpu) = (
        busy_job["cpu_s"].as_f64().expect("busy job's cpu_s"),
        idle_job["cpu_s"].as_f64().expect("idle job's cpu_s"),
    );
    assert!(busy_cpu > 0.1, "{busy_job}");
    assert!(idle_cpu < busy_cpu / 4.0, "{idle_job} against {busy_job}");
    // Journaled with the attempt's end: a restarted daemon reports the same figure.
    s.fx.signal(s.daemon, 15);
    s.fx.wait(s.daemon, GUARD);
    s.daemon = spawn_daemon(&mut s.fx, 1, &[]);
    assert_eq!(s.job(busy)["cpu_s"].as_f64(), Some(busy_cpu));
}

#[test]
fn a_stopped_daemon_leaves_its_jobs_running_and_the_next_one_adopts_them() {
    let mut s = Scheduler::start(1, &[]);
    let (started, release, runs) = (s.file("started"), s.file("release"), s.file("runs.txt"));
    let script = format!(
        "echo $LADLE_JOB_ID >> {runs}; touch {started}; while [ ! -e {release} ]; do sleep 0.05; done"
    );
    let id = s.submit(&[], &script);
    s.wait_for(id, &["running"]);
    wait_until("the job starting", GUARD, || {
        Ok(Path::new(&started).exists().then_some(()))
    });
    s.fx.signal(s.daemon, 15);
    let stopped = s.fx.wait(s.daemon, GUARD);
    assert!(
        stopped.status.success(),
        "SIGTERM is a clean stop: {}",
        stopped.stderr
    );
    assert!(
        !s.dir().join("scheduler.sock").exists(),
        "the socket is removed"
    );
    s.daemon = spawn_daemon(&mut s.fx, 1, &[]);
    assert_eq!(s.job(id)["state"], "running", "adopted, not restarted");
    std::fs::write(&release, "").unwrap();
    let job = s.wait_for(id, &["succeeded", "failed", "interrupted"]);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempts"], 1);
    // Not the new daemon's child: its CPU time is unknown, not zero.
    assert!(job["cpu_s"].is_null(), "{job}");
    assert_eq!(lines(Path::new(&runs)), vec![id.to_string()]);
}

/// Starts `ladle serve --name NAME` registered with `s`'s daemon; returns its handle.
fn serve_feed(s: &mut Scheduler, name: &str) -> (usize, PathBuf) {
    let data = s.fx.dataset(20, 40, 36);
    let socket = s.fx.socket();
    let dir = s.dir_arg();
    let serve = s.fx.spawn(&[
        "serve",
        "--dataset",
        data.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
        "--image-size",
        "32",
        "--ring-mib",
        "2",
        "--threads",
        "1",
        "--name",
        name,
        "--dir",
        &dir,
    ]);
    wait_until(&format!("the feed {name:?} registered"), GUARD, || {
        let dir = s.dir_arg();
        let queue = s.fx.run(&["queue", "--dir", &dir], GUARD);
        if queue.stdout.contains(&format!("feed {name:?}")) {
            Ok(Some(()))
        } else {
            Err(queue.stdout)
        }
    });
    (serve, socket)
}

#[test]
fn a_job_of_a_live_feed_gets_its_socket_and_a_feed_nobody_serves_is_refused() {
    let mut s = Scheduler::start(1, &[]);
    let dir = s.dir_arg();
    let refused = s.fx.run(
        &["submit", "--dir", &dir, "--feed", "nosuch", "--", "true"],
        GUARD,
    );
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("no live feed"),
        "{}",
        refused.stderr
    );
    let (serve, socket) = serve_feed(&mut s, "cifar");
    let out = s.file("socket-seen");
    let id = s.submit(
        &["--feed", "cifar"],
        &format!("echo \"$LADLE_SOCKET\" > {out}"),
    );
    assert_eq!(
        s.wait_for(id, &["succeeded", "failed"])["state"],
        "succeeded"
    );
    let seen = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        Path::new(seen.trim()),
        socket.canonicalize().unwrap(),
        "the job got the feed's socket"
    );
    // Once its producer is gone, the feed is too.
    s.fx.signal(serve, 15);
    s.fx.wait(serve, GUARD);
    let refused = s.fx.run(
        &["submit", "--dir", &dir, "--feed", "cifar", "--", "true"],
        GUARD,
    );
    assert!(
        refused.stderr.contains("no live feed"),
        "{}",
        refused.stderr
    );
}

#[test]
fn consumers_of_one_feed_share_a_gpu_while_other_jobs_spread_out() {
    let mut s = Scheduler::start(2, &[]);
    serve_feed(&mut s, "imagenet");
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let a = s.submit(&["--feed", "imagenet", "--gpu-mem", "2GiB"], &hold);
    let first = s.wait_for(a, &["running"]);
    let b = s.submit(&["--feed", "imagenet", "--gpu-mem", "2GiB"], &hold);
    let second = s.wait_for(b, &["running"]);
    assert_eq!(
        first["gpus"], second["gpus"],
        "one feed, one GPU: {first} {second}"
    );
    let c = s.submit(&["--gpu-mem", "2GiB"], &hold);
    let other = s.wait_for(c, &["running"]);
    assert_ne!(other["gpus"], first["gpus"], "no feed: the idle GPU first");
    std::fs::write(&release, "").unwrap();
    for id in [a, b, c] {
        assert_eq!(
            s.wait_for(id, &["succeeded", "failed"])["state"],
            "succeeded"
        );
    }
}

#[test]
fn ladle_sim_compares_policies_on_a_generated_trace() {
    let mut fx = Fixture::new();
    let trace = fx.path().join("trace.csv");
    let trace = trace.to_str().unwrap();
    let done = fx.run(
        &[
            "sim", "generate", "--jobs", "60", "--seed", "1", "--out", trace,
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    let header = std::fs::read_to_string(trace).unwrap();
    assert!(header.starts_with("job_id,submit_s,duration_s,mem_mib,sm_activity,gpus\n"));
    let args = ["sim", "--trace", trace, "--gpus", "3", "--gpu-mem", "40GiB"];
    let done = fx.run(
        &[
            &args[..],
            &["--policy", "exclusive,carma-most-free,ladle", "--json"],
        ]
        .concat(),
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    let policies = v["policies"].as_object().unwrap();
    assert_eq!(policies.len(), 3);
    for (name, r) in policies {
        for key in [
            "makespan_s",
            "mean_jct_s",
            "mean_gpu_util",
            "oom_crashes",
            "energy_kwh",
        ] {
            assert!(r[key].is_number(), "{name} lacks {key}: {r}");
        }
        assert_eq!(r["oom_crashes"], 0, "{name}: honest estimates never crash");
    }
    let exclusive = policies["exclusive"]["makespan_s"].as_f64().unwrap();
    let ladle = policies["ladle"]["makespan_s"].as_f64().unwrap();
    assert!(
        ladle < exclusive,
        "collocation shortens the makespan: {ladle} vs {exclusive}"
    );
    // The table form names every policy; --per-job writes every job's schedule.
    let per_job = fx.path().join("jobs.csv");
    let table = fx.run(
        &[&args[..], &["--per-job", per_job.to_str().unwrap()]].concat(),
        GUARD,
    );
    assert!(table.status.success(), "{}", table.stderr);
    for name in [
        "exclusive",
        "carma-most-free",
        "carma-least-util",
        "carma-first-fit",
        "carma-best-fit",
        "ladle",
    ] {
        assert!(table.stdout.contains(name), "{}", table.stdout);
    }
    let rows = std::fs::read_to_string(&per_job).unwrap();
    assert_eq!(
        rows.lines().count(),
        1 + 6 * 60,
        "a header and one row per policy and job"
    );
}

#[test]
fn feeds_and_jobs_that_decode_for_themselves_share_the_cores_and_feed_consumers_cost_none() {
    // 2 cores: the feed's one decode thread, and one job with its own workers fit; a second
    // such job waits, a consumer of the feed does not.
    let mut s = Scheduler::start(2, &["--cpu-cores", "2"]);
    let dir = s.dir_arg();
    let wider = s.fx.run(
        &["submit", "--dir", &dir, "--cpus", "3", "--", "true"],
        GUARD,
    );
    assert!(
        !wider.status.success(),
        "a job wider than the machine would wait forever"
    );
    assert!(wider.stderr.contains("CPU cores"), "{}", wider.stderr);
    serve_feed(&mut s, "imagenet");
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let a = s.submit(&["--cpus", "1", "--gpu-mem", "1GiB"], &hold);
    s.wait_for(a, &["running"]);
    let b = s.submit(&["--cpus", "1", "--gpu-mem", "1GiB"], &hold);
    let c = s.submit(&["--feed", "imagenet", "--gpu-mem", "1GiB"], &hold);
    // `c`, submitted after `b`, starting is the daemon's word that an admission round has
    // looked at `b` (queued before it) and passed it over: in that same look, `b` is queued.
    let queue = wait_until("the feed's consumer running", GUARD, || {
        let q = s.queue();
        if state_in(&q, c) == "running" {
            Ok(Some(q))
        } else {
            Err(q.to_string())
        }
    });
    assert_eq!(
        state_in(&queue, b),
        "queued",
        "no core is free for a second DataLoader job: {queue}"
    );
    std::fs::write(&release, "").unwrap();
    for id in [a, b, c] {
        assert_eq!(
            s.wait_for(id, &["succeeded", "failed"])["state"],
            "succeeded"
        );
    }
}

#[test]
fn a_restarted_scheduler_learns_a_running_feed_again() {
    let mut s = Scheduler::start(1, &[]);
    serve_feed(&mut s, "cifar");
    s.fx.signal(s.daemon, 15);
    s.fx.wait(s.daemon, GUARD);
    s.daemon = spawn_daemon(&mut s.fx, 1, &[]);
    // Feeds are not journaled: the serving process registers again every few seconds.
    let dir = s.dir_arg();
    wait_until(
        "the restarted scheduler seeing the feed",
        Duration::from_secs(30),
        || {
            let queue = s.fx.run(&["queue", "--dir", &dir], GUARD);
            if queue.stdout.contains("feed \"cifar\"") {
                Ok(Some(()))
            } else {
                Err(queue.stdout)
            }
        },
    );
    let id = s.submit(&["--feed", "cifar"], "true");
    assert_eq!(
        s.wait_for(id, &["succeeded", "failed"])["state"],
        "succeeded"
    );
}

/// A scenario file (`--sim-scenario`) in a directory of its own, kept while the test runs.
fn scenario(json: &str) -> (Fixture, String) {
    let fx = Fixture::new();
    let path = fx.path().join("scenario.json");
    std::fs::write(&path, json).unwrap();
    let path = path.to_str().unwrap().to_owned();
    (fx, path)
}

/// The GPUs job `id` runs on, once it runs.
fn gpus_of(s: &mut Scheduler, id: u64) -> Value {
    s.wait_for(id, &["running", "succeeded"])["gpus"].clone()
}

#[test]
fn a_gpu_with_another_users_process_is_not_idle_and_its_memory_counts() {
    // GPU 0 holds 30 GiB of an MPS client of someone else's, seen only through NVML's MPS
    // process call: a 20 GiB job does not fit there, though the scheduler runs nothing on it.
    let (_keep, path) = scenario(
        r#"{"gpus": [{"gpu": 0, "foreign": [{"pid": 999999, "mem_mib": 30720, "mps_only": true}]}]}"#,
    );
    let mut s = Scheduler::start(2, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let big = s.submit(&["--gpu-mem", "20GiB"], &hold);
    assert_eq!(gpus_of(&mut s, big), serde_json::json!([1]));
    std::fs::write(&release, "").unwrap();
    s.wait_for(big, &["succeeded"]);
}

#[test]
fn a_gpu_whose_process_query_fails_is_not_taken_for_idle() {
    // NVML's MPS process call fails on GPU 0: its process list is unknown, not empty, so an
    // idle-looking GPU 0 is not where a job that must run alone goes.
    let (_keep, path) = scenario(r#"{"gpus": [{"gpu": 0, "failing": ["mps_processes"]}]}"#);
    let mut s = Scheduler::start(2, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let guess = s.submit(&[], &hold);
    assert_eq!(gpus_of(&mut s, guess), serde_json::json!([1]));
    std::fs::write(&release, "").unwrap();
    s.wait_for(guess, &["succeeded"]);
}

#[test]
fn a_gpu_whose_sample_fails_takes_no_job_until_it_answers() {
    // Every memory query of GPU 0 fails: its last sample is stale, so it takes nothing.
    let (_keep, path) = scenario(r#"{"gpus": [{"gpu": 0, "failing": ["memory_info"]}]}"#);
    let mut s = Scheduler::start_unchecked(2, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let a = s.submit(&["--gpu-mem", "1GiB"], &hold);
    assert_eq!(gpus_of(&mut s, a), serde_json::json!([1]));
    std::fs::write(&release, "").unwrap();
    s.wait_for(a, &["succeeded"]);
}

#[test]
fn a_gpu_in_exclusive_process_mode_without_mps_runs_one_job_at_a_time() {
    let (_keep, path) = scenario(r#"{"gpus": [{"gpu": 0, "compute_mode": "exclusive_process"}]}"#);
    let mut s = Scheduler::start(1, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let first = s.submit(&["--gpu-mem", "1GiB"], &hold);
    s.wait_for(first, &["running"]);
    let second = s.submit(&["--gpu-mem", "1GiB"], "true");
    // Twenty admission rounds with the second job queued: in the default mode a 1 GiB job
    // joins a GPU in the first round whose sample is fresh. The daemon counts its rounds,
    // so the test waits for them, not for a time.
    let after_submit = s.queue()["admission_rounds"].as_u64().unwrap();
    wait_until("twenty admission rounds", GUARD, || {
        let q = s.queue();
        let job = q["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == second)
            .unwrap();
        assert_eq!(job["state"], "queued", "{q}");
        if q["admission_rounds"].as_u64().unwrap() >= after_submit + 20 {
            Ok(Some(()))
        } else {
            Err(format!("no admission rounds: {q}"))
        }
    });
    std::fs::write(&release, "").unwrap();
    s.wait_for(second, &["succeeded"]);
}

#[test]
fn under_its_mps_a_scheduler_leaves_a_gpu_to_another_users_mps_server() {
    // Every GPU shows another user's MPS server (NVIDIA's MPS serves one user per GPU at a
    // time). Under this scheduler's own MPS (a stand-in control program) a job waits; without
    // MPS it shares the GPU as with any other user's process.
    let server = r#"{"pid": 999998, "mem_mib": 300, "other_users_mps_server": true}"#;
    let gpus: Vec<String> = (0..3)
        .map(|g| format!(r#"{{"gpu": {g}, "foreign": [{server}]}}"#))
        .collect();
    let (keep, path) = scenario(&format!(r#"{{"gpus": [{}]}}"#, gpus.join(", ")));
    let bin = keep.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let control = bin.join("nvidia-cuda-mps-control");
    std::fs::write(&control, "#!/bin/sh\n[ \"$1\" = -d ] || cat >/dev/null\n").unwrap();
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();
    let with_path = format!(
        "PATH={}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut s = scheduler_given(&[&with_path], &["--sim-scenario", &path, "--mps", "on"]);
    let id = s.submit(&["--gpu-mem", "1GiB"], "true");
    // A GPU someone else uses takes a job only once its telemetry window is full: from then
    // on, twenty admission rounds.
    let after_full = wait_until("full telemetry windows", GUARD, || {
        let q = s.queue();
        let full = (q["gpus"].as_array().unwrap().iter()).all(|g| g["window_full"] == true);
        Ok::<_, String>(full.then(|| q["admission_rounds"].as_u64().unwrap()))
    });
    wait_until("twenty admission rounds", GUARD, || {
        let q = s.queue();
        let job = (q["jobs"].as_array().unwrap().iter()).find(|j| j["id"] == id);
        assert_eq!(job.unwrap()["state"], "queued", "{q}");
        let rounds = q["admission_rounds"].as_u64().unwrap();
        Ok::<_, String>((rounds >= after_full + 20).then_some(()))
    });
    let dir = s.dir_arg();
    let cancel = s.fx.run(&["cancel", "--dir", &dir, &id.to_string()], GUARD);
    assert!(cancel.status.success(), "{}", cancel.stderr);
    s.fx.signal(s.daemon, 15);
    s.fx.wait(s.daemon, GUARD);
    let mut s = scheduler_given(&[], &["--sim-scenario", &path]);
    let id = s.submit(&["--gpu-mem", "1GiB"], "true");
    s.wait_for(id, &["succeeded"]);
}
