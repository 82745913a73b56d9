//! `ladle sweep` end to end (issue 14): the runs of a grid go through the scheduler as
//! consumers of one feed, and stopping the sweep leaves nothing behind.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::time::Duration;

use ladle_tests::{
    Fixture, ladle_bin, spawn_endless_sim_sweep, wait_for_listener, wait_for_log_line, wait_until,
};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(300);

/// Processes whose environment names `socket` as their feed.
fn processes_of(socket: &Path) -> Vec<u32> {
    let needle = format!("LADLE_SOCKET={}", socket.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|&b| b == 0)
            .any(|var| var == needle.as_bytes())
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_sweep_runs_its_grid_through_the_scheduler_as_consumers_of_one_feed() {
    let mut fx = Fixture::new();
    let data = fx.dataset(600, 80, 60);
    let out = fx.path().join("sweep");
    let ladle = ladle_bin().to_str().unwrap();
    let done = fx.run(
        &[
            "sweep",
            "--dataset",
            data.to_str().unwrap(),
            "--image-size",
            "64",
            "--ring-mib",
            "2",
            // The three runs go at three paces (160, 320 and 640 samples/s): in lockstep they
            // read one stream, which the count of decoded samples below checks; with
            // skimming (the default) each goes its own pace and more is decoded.
            "--pacing",
            "lockstep",
            "--gpu",
            "sim",
            "--sim-gpus",
            "2",
            "--settle-s",
            "0",
            // Nothing declared: each run is a guess that runs alone until measured; a
            // 100 ms tick fills the windows in 3 s and a run is measured after 1 s seen.
            "--tick-ms",
            "100",
            "--measure-s",
            "1",
            "--private-scheduler",
            "--out",
            out.to_str().unwrap(),
            "--json",
            "--",
            ladle,
            "consume",
            "--batch-size",
            "{32,64,128}",
            "--epochs",
            "2",
            // Steps of 200 ms: the batch-32 run lasts about 8 s, so the third run, which
            // waits for a GPU's full windows and a measured run (about 3.5 s), overlaps it.
            "--step-ms",
            "200",
            "--json",
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    let report: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{report}");
    let mut consumed = 0;
    for (run, batch) in runs.iter().zip(["32", "64", "128"]) {
        assert_eq!(run["exit_code"], 0, "{run}");
        assert!(
            run["args"].as_array().unwrap().iter().any(|a| a == batch),
            "{run}"
        );
        let (epochs, log) = ladle_tests::sweep_run_epochs(run);
        assert_eq!(epochs.len(), 2, "{log}");
        for e in &epochs {
            assert_eq!(e["exact_coverage"], true, "{e}");
            consumed += e["samples"].as_u64().unwrap();
        }
    }
    assert_eq!(consumed, 3 * 2 * 600);
    // The first two runs start together and read one stream (1200 decoded for 2400
    // consumed); the third declared nothing, so it starts once a run of its family is
    // measured and joins that stream late (at most 1200 more). Private pipelines would
    // decode 3600.
    let published = report["feed"]["samples_published"].as_u64().unwrap();
    assert!(
        published * 6 < consumed * 5,
        "decoded once for all: {published} published for {consumed} consumed"
    );
    assert!(
        report["cost"]["private_pipelines_cpu_seconds"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let socket = Path::new(report["feed"]["socket"].as_str().unwrap()).to_owned();
    assert!(!socket.exists(), "the feed's socket is left behind");
    assert!(processes_of(&socket).is_empty(), "a run is still running");
}

#[test]
fn sigterm_mid_sweep_cancels_every_run_and_leaves_nothing_behind() {
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 80, 60);
    let out = fx.path().join("sweep");
    let sweep = spawn_endless_sim_sweep(&mut fx, &data, &out);
    let socket = out.join("feed.sock");
    wait_until("both runs started", Duration::from_secs(60), || {
        let runs = processes_of(&socket);
        if runs.len() >= 2 {
            Ok(Some(()))
        } else {
            Err(format!("processes of the feed: {runs:?}"))
        }
    });
    fx.signal(sweep, 15);
    let done = fx.wait(sweep, Duration::from_secs(120));
    assert!(!done.status.success(), "a cancelled sweep reports failure");
    assert!(done.stderr.contains("cancel"), "{}", done.stderr);
    assert!(processes_of(&socket).is_empty(), "runs outlived the sweep");
    assert!(!socket.exists(), "the feed's socket is left behind");
    assert!(
        !out.join("scheduler").join("scheduler.sock").exists(),
        "the private scheduler's socket is left behind"
    );
}

#[test]
fn a_sweep_reuses_a_live_feed_of_the_same_dataset_and_transform() {
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 80, 60);
    let dir = fx.path().join("sched");
    let dir = dir.to_str().unwrap();
    let daemon = fx.spawn(&["scheduler", "--dir", dir, "--gpu", "sim", "--settle-s", "0"]);
    let feed = [
        "--dataset",
        data.to_str().unwrap(),
        "--image-size",
        "32",
        "--ring-mib",
        "2",
    ];
    let socket = fx.socket();
    let socket = socket.to_str().unwrap();
    // Registering fails (and `serve` exits) until the daemon listens.
    wait_for_listener(
        &Path::new(dir).join("scheduler.sock"),
        GUARD,
        "ladle scheduler coming up",
    );
    let serve = fx.spawn(
        &[
            &[
                "serve", "--socket", socket, "--name", "shared", "--dir", dir,
            ][..],
            &feed,
        ]
        .concat(),
    );
    wait_until("the feed registered", GUARD, || {
        let queue = fx.run(&["queue", "--dir", dir], GUARD);
        if queue.stdout.contains("feed \"shared\"") {
            Ok(Some(()))
        } else {
            Err(format!("{}{}", queue.stdout, queue.stderr))
        }
    });
    let out = fx.path().join("sweep");
    let ladle = ladle_bin().to_str().unwrap();
    let done = fx.run(
        &[
            &[
                "sweep",
                "--scheduler-dir",
                dir,
                "--out",
                out.to_str().unwrap(),
                "--json",
            ][..],
            &feed,
            &["--", ladle, "consume", "--batch-size", "{16,32}", "--json"],
        ]
        .concat(),
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    let report: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    assert_eq!(report["feed"]["reused"], true, "{report}");
    assert_eq!(
        report["feed"]["socket"],
        Path::new(socket).canonicalize().unwrap().to_str().unwrap()
    );
    for run in report["runs"].as_array().unwrap() {
        assert_eq!(run["exit_code"], 0, "{run}");
        // The shared scheduler reaped it, not the sweep: its CPU still reaches the report.
        assert!(run["cpu_seconds"].as_f64().unwrap() > 0.0, "{run}");
    }
    assert!(report["cpu_seconds"].as_f64().unwrap() > 0.0, "{report}");
    fx.signal(serve, 15);
    fx.signal(daemon, 15);
}

#[test]
fn a_feed_with_a_keep_alive_stops_once_its_last_consumer_is_gone() {
    let mut fx = Fixture::new();
    let data = fx.dataset(50, 80, 60);
    let serve = fx.serve(
        &data,
        &["--image-size", "32", "--ring-mib", "2", "--keep-alive", "1"],
    );
    let consumer = fx.consume(16, 1, &[]);
    assert!(fx.wait(consumer, GUARD).status.success());
    let stopped = fx.wait(serve, Duration::from_secs(30));
    assert!(stopped.status.success(), "{}", stopped.stderr);
    assert!(stopped.stderr.contains("keep-alive"), "{}", stopped.stderr);
    assert!(!fx.socket().exists(), "the socket is removed");
}

#[test]
fn a_sweep_that_needs_a_new_feed_waits_while_the_cores_are_taken() {
    let mut fx = Fixture::new();
    let data = fx.dataset(50, 80, 60);
    let dir = fx.path().join("sched");
    let dir = dir.to_str().unwrap();
    let release = fx.path().join("release");
    let daemon = fx.spawn(&[
        "scheduler",
        "--dir",
        dir,
        "--gpu",
        "sim",
        "--settle-s",
        "0",
        "--cpu-cores",
        "2",
    ]);
    // A job that decodes for itself on both cores.
    let hold = format!("while [ ! -e {} ]; do sleep 0.05; done", release.display());
    wait_for_listener(
        &Path::new(dir).join("scheduler.sock"),
        GUARD,
        "ladle scheduler coming up",
    );
    let submitted = fx.run(
        &[
            "submit", "--dir", dir, "--cpus", "2", "--", "sh", "-c", &hold,
        ],
        GUARD,
    );
    assert!(submitted.status.success(), "{}", submitted.stderr);
    let out = fx.path().join("sweep");
    let ladle = ladle_bin().to_str().unwrap();
    // Its stderr goes to a file, so that the test can see it say it waits.
    let log = fx.path().join("sweep.log");
    let sweep_args = [
        ladle,
        "sweep",
        "--scheduler-dir",
        dir,
        "--dataset",
        data.to_str().unwrap(),
        "--image-size",
        "32",
        "--ring-mib",
        "2",
        "--threads",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--json",
        "--",
        ladle,
        "consume",
        "--batch-size",
        "16",
    ];
    let sweep = fx.spawn_logged(&sweep_args, &log);
    // The sweep says it waits before it would start the feed.
    wait_for_log_line(&log, "waiting for cores", GUARD);
    assert!(
        !out.join("feed.sock").exists(),
        "the feed started although both cores were taken"
    );
    std::fs::write(&release, "").unwrap();
    let done = fx.wait(sweep, GUARD);
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(done.status.success(), "{stderr}");
    fx.signal(daemon, 15);
}

#[test]
fn shards_run_by_hand_split_the_grid_and_merge_into_one_report() {
    let mut fx = Fixture::new();
    let data = fx.dataset(60, 48, 40);
    let ladle = ladle_bin().to_str().unwrap().to_owned();
    let mut dirs = Vec::new();
    for shard in ["0/2", "1/2"] {
        let out = fx.path().join(format!("shard-{}", &shard[..1]));
        let mut args = ladle_tests::sim_sweep(&data, &out);
        args.extend(
            [
                "--shard",
                shard,
                "--gpu-mem",
                "1GiB",
                "--json",
                "--",
                &ladle,
                "consume",
                "--batch-size",
                "{8,16,32}",
                "--epochs",
                "1",
                "--json",
            ]
            .map(String::from),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let done = fx.run(&args, GUARD);
        assert!(done.status.success(), "{}", done.stderr);
        let report: Value = serde_json::from_str(done.stdout.trim()).unwrap();
        let names: Vec<&str> = report["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        // Interleaved, named over the whole grid.
        let want: &[&str] = if shard == "0/2" {
            &["run-00", "run-02"]
        } else {
            &["run-01"]
        };
        assert_eq!(names, want, "{report}");
        dirs.push(out.to_str().unwrap().to_owned());
    }
    let mut args = vec!["report", "--merge"];
    args.extend(dirs.iter().map(String::as_str));
    args.push("--json");
    let merged = fx.run(&args, GUARD);
    assert!(merged.status.success(), "{}", merged.stderr);
    let report: Value = serde_json::from_str(merged.stdout.trim()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let got: Vec<(&str, &str)> = runs
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["node"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("run-00", "shard-0"),
            ("run-01", "shard-1"),
            ("run-02", "shard-0")
        ]
    );
    assert!(runs.iter().all(|r| r["exit_code"] == 0), "{report}");
    assert_eq!(report["nodes"].as_array().unwrap().len(), 2, "{report}");
    let consumed = report["feed"]["samples_consumed"].as_u64().unwrap();
    assert_eq!(consumed, 3 * 60, "{report}");
}

#[test]
fn a_sweep_of_multi_gpu_runs_gives_each_run_the_gpus_it_asks_for() {
    // A `torchrun --nproc_per_node 2` run needs two GPUs at once: each run here gets both
    // simulated GPUs (sharing them, as their declared memory allows).
    let mut fx = Fixture::new();
    let data = fx.dataset(60, 32, 32);
    let out = fx.path().join("sweep");
    let seen = fx.path().join("seen");
    std::fs::create_dir_all(&seen).unwrap();
    let script = format!(
        "echo \"$CUDA_VISIBLE_DEVICES\" > {}/$LADLE_RUN; exec \"$0\" \"$@\"",
        seen.display()
    );
    let done = fx.run(
        &[
            "sweep",
            "--dataset",
            data.to_str().unwrap(),
            "--image-size",
            "32",
            "--ring-mib",
            "2",
            "--gpu",
            "sim",
            "--sim-gpus",
            "2",
            "--gpus-per-run",
            "2",
            "--gpu-mem",
            "1GiB",
            "--settle-s",
            "0",
            "--tick-ms",
            "100",
            "--private-scheduler",
            "--out",
            out.to_str().unwrap(),
            "--json",
            "--",
            "sh",
            "-c",
            &script,
            ladle_bin().to_str().unwrap(),
            "consume",
            "--batch-size",
            "{4,8}",
            "--epochs",
            "1",
            "--json",
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    let report: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    for run in report["runs"].as_array().unwrap() {
        assert_eq!(run["exit_code"], 0, "{run}");
        let name = run["name"].as_str().unwrap();
        let cvd = std::fs::read_to_string(seen.join(name)).unwrap();
        assert_eq!(cvd.trim().split(',').count(), 2, "{name}: {cvd}");
    }
    // A run cannot ask for no GPU.
    let refused = fx.run(
        &[
            "sweep",
            "--dataset",
            data.to_str().unwrap(),
            "--gpus-per-run",
            "0",
            "--",
            "true",
        ],
        GUARD,
    );
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("--gpus-per-run"),
        "{}",
        refused.stderr
    );
}
