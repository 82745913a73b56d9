//! The scheduler as real processes: `ladle scheduler` on simulated GPUs, jobs that are real
//! shell commands (they print, sleep, fail, or exit like a CUDA out-of-memory crash), the
//! clients `ladle submit/queue/cancel/logs`, SIGKILL of the daemon, and `ladle sim`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ladle_tests::scheduler::*;
use ladle_tests::{Fixture, wait_until};
use serde_json::Value;

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
fn a_second_cancel_shortens_the_grace_of_the_first_and_never_stretches_it() {
    // A sweep's second Ctrl-C asks the scheduler to kill its runs now (`grace_s` 0) instead
    // of signalling them itself; before protocol version 8 the first grace stood.
    let mut s = Scheduler::start(1, &[]);
    let dir = s.dir_arg();
    let (ready, term, done) = (s.file("ready"), s.file("term"), s.file("done"));
    let script = format!(
        "trap 'touch {term}; sleep 600; touch {done}; exit 0' TERM; touch {ready}; \
         while :; do sleep 0.1; done"
    );
    let id = s.submit(&[], &script);
    wait_until("the job is ready", GUARD, || {
        Ok(Path::new(&ready).exists().then_some(()))
    });
    let cancel = |s: &mut Scheduler, grace: &str| {
        let done = s.fx.run(
            &["cancel", "--dir", &dir, &id.to_string(), "--grace", grace],
            GUARD,
        );
        assert!(done.status.success(), "{}", done.stderr);
    };
    cancel(&mut s, "600");
    wait_until("the job got SIGTERM", GUARD, || {
        Ok(Path::new(&term).exists().then_some(()))
    });
    cancel(&mut s, "0");
    s.wait_for(id, &["cancelled"]);
    assert!(
        !Path::new(&done).exists(),
        "the job finished its 600 s checkpoint: the second cancel did not shorten the grace"
    );
}

#[test]
fn a_file_that_is_not_a_socket_at_the_schedulers_socket_path_is_refused_and_left_alone() {
    // One stale-socket policy for every ladle server (`ladle_os::net::bind_private`): the
    // scheduler used to remove whatever was at its socket path.
    let mut fx = Fixture::new();
    let dir = fx.path().join("sched");
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("scheduler.sock");
    std::fs::write(&socket, "my notes").unwrap();
    let dir_arg = dir.to_str().unwrap();
    let done = fx.run(
        &[
            "scheduler",
            "--dir",
            dir_arg,
            "--gpu",
            "sim",
            "--settle-s",
            "0",
        ],
        GUARD,
    );
    assert!(!done.status.success(), "{}", done.stderr);
    assert!(done.stderr.contains("not a socket"), "{}", done.stderr);
    assert!(done.stderr.contains("scheduler.sock"), "{}", done.stderr);
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "my notes");
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
fn a_job_stating_host_memory_waits_while_rings_and_the_cache_budget_leave_too_little() {
    // 1 GiB shared: a feed's 64 MiB ring and its decoded-sample cache's 512 MiB budget
    // leave 448 MiB: one job of 300 MiB fits, a second waits, a consumer stating none runs.
    let mut s = Scheduler::start(2, &["--host-mem", "1GiB"]);
    let dir = s.dir_arg();
    let wider = s.fx.run(
        &["submit", "--dir", &dir, "--host-mem", "2GiB", "--", "true"],
        GUARD,
    );
    assert!(
        !wider.status.success(),
        "a job larger than the machine would wait forever"
    );
    assert!(wider.stderr.contains("host memory"), "{}", wider.stderr);
    let data = s.fx.dataset(20, 40, 36);
    let socket = s.fx.socket();
    s.fx.spawn(&[
        "serve",
        "--dataset",
        data.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
        "--image-size",
        "32",
        "--ring-mib",
        "64",
        "--threads",
        "1",
        "--cache-gib",
        "0.5",
        "--name",
        "photos",
        "--dir",
        &dir,
    ]);
    let queue = wait_until("the feed and its cache counted", GUARD, || {
        let queue = s.fx.run(&["queue", "--dir", &dir], GUARD);
        if queue.stdout.contains("decoded-sample cache 512MiB")
            && queue.stdout.contains("feed \"photos\"")
        {
            Ok(Some(queue.stdout))
        } else {
            Err(queue.stdout)
        }
    });
    assert!(queue.contains("host memory: 576MiB of 1GiB"), "{queue}");
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let a = s.submit(&["--host-mem", "300MiB", "--gpu-mem", "1GiB"], &hold);
    s.wait_for(a, &["running"]);
    let b = s.submit(&["--host-mem", "300MiB", "--gpu-mem", "1GiB"], &hold);
    let c = s.submit(&["--feed", "photos", "--gpu-mem", "1GiB"], &hold);
    // `c`, submitted after `b`, running is the daemon's word that a round passed `b` over.
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
        "no room for a second job: {queue}"
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

#[test]
fn a_feed_started_on_demand_is_in_the_schedulers_feed_list_and_a_job_can_name_it() {
    let mut s = Scheduler::start(1, &[]);
    let data = s.fx.dataset(20, 40, 36);
    let dir = s.dir_arg();
    let started = s.fx.run(
        &[
            "feeds",
            "start",
            "--dataset",
            data.to_str().unwrap(),
            "--image-size",
            "32",
            "--ring-mib",
            "2",
            "--threads",
            "1",
            "--idle-timeout",
            "1",
            "--orphan-timeout",
            "60",
        ],
        GUARD,
    );
    assert!(started.status.success(), "{}", started.stderr);
    let entry: Value = serde_json::from_str(started.stdout.trim()).unwrap();
    let key = entry["key"].as_str().unwrap().to_owned();
    let name = format!("auto-{}", &key[..8]);
    // The scheduler reads the user's registry: no registration.
    wait_until("the scheduler listing the feed", GUARD, || {
        let queue = s.fx.run(&["queue", "--dir", &dir], GUARD);
        if queue.stdout.contains(&format!("feed {name:?}")) {
            Ok(Some(()))
        } else {
            Err(queue.stdout)
        }
    });
    let out = s.file("socket-seen");
    let id = s.submit(
        &["--feed", &name],
        &format!("echo \"$LADLE_SOCKET\" > {out}"),
    );
    assert_eq!(
        s.wait_for(id, &["succeeded", "failed"])["state"],
        "succeeded"
    );
    let seen = std::fs::read_to_string(&out).unwrap();
    assert_eq!(seen.trim(), entry["socket"].as_str().unwrap());
    // Stopped, it is gone from the scheduler too.
    let stopped = s.fx.run(&["feeds", "stop", &key], GUARD);
    assert!(stopped.status.success(), "{}", stopped.stderr);
    let live = s.fx.registry().join(format!("{key}.live"));
    wait_until("the feed to exit", GUARD, || {
        Ok((!ladle_os::process::is_locked(&live).unwrap()).then_some(()))
    });
    let refused = s.fx.run(
        &["submit", "--dir", &dir, "--feed", &name, "--", "true"],
        GUARD,
    );
    assert!(
        refused.stderr.contains("no live feed"),
        "{}",
        refused.stderr
    );
}
