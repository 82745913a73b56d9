//! `ladle sweep --slurm` on a real two-node Slurm cluster (issue 25): the grid split over the
//! nodes, one feed and one scheduler per node, the merged report, a dry-run script Slurm
//! accepts, `scancel` leaving nothing behind, a node lost mid-sweep and the resume, and a
//! request Slurm cannot meet. Each test skips, saying so, when Slurm is not installed
//! (`scripts/check` installs it) or the cluster cannot come up.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ladle_os::Proc;
use ladle_tests::slurm::Cluster;
use ladle_tests::{Fixture, ladle_bin, wait_until};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(300);

/// A `ladle` command for this cluster: `SLURM_CONF` set, node-local state under the
/// cluster's directory (`TMPDIR`, exported to the job by sbatch).
fn ladle(cluster: &Cluster) -> Command {
    let mut command = cluster.command(ladle_bin());
    let tmp = cluster.local_root();
    std::fs::create_dir_all(&tmp).unwrap();
    command.env("TMPDIR", tmp);
    command
}

/// The sweep options every test uses: simulated GPUs, a small feed, fast admission.
fn sweep_args<'a>(data: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "sweep",
        "--slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--out",
        out,
        "--dataset",
        data,
        "--image-size",
        "32",
        "--ring-mib",
        "2",
        "--threads",
        "1",
        "--gpu",
        "sim",
        "--settle-s",
        "0",
        "--tick-ms",
        "100",
        "--gpu-mem",
        "1GiB",
        "--stop-grace",
        "2",
    ]
}

/// Runs `command` to its end, bounded.
fn finish(command: &mut Command, what: &str) -> ladle_os::Output {
    let mut proc = Proc::spawn(what, command).unwrap();
    proc.wait_timeout(GUARD)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    proc.output().unwrap()
}

/// The report's runs by name.
fn runs(report: &Value) -> Vec<Value> {
    report["runs"].as_array().unwrap().clone()
}

/// Nothing of ladle is left running on the cluster, and no node-local directory.
fn assert_nothing_left(cluster: &Cluster) {
    wait_until("every ladle process gone", Duration::from_secs(60), || {
        Ok::<_, String>(cluster.job_processes().is_empty().then_some(()))
    });
    let left: Vec<PathBuf> = std::fs::read_dir(cluster.local_root())
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ladle-")
        })
        .collect();
    assert!(left.is_empty(), "node-local state left behind: {left:?}");
}

/// The run's first stdout line: `NODE SOCKET GPUS` (what the wrapper in the grid prints).
fn where_it_ran(run: &Value) -> (String, String, String) {
    let log = std::fs::read_to_string(run["log"].as_str().unwrap()).unwrap();
    let first = log.lines().next().unwrap_or_default();
    let mut words = first.split(' ').map(str::to_owned);
    let mut next = || words.next().unwrap_or_default();
    (next(), next(), next())
}

#[test]
fn a_six_run_grid_over_two_nodes_runs_each_run_once_on_one_feed_per_node() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(120, 48, 40);
    let out = cluster.submit_dir().join("six");
    let record = cluster.submit_dir().join("six-rec");
    let (data_s, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let mut args = sweep_args(data_s, out_s);
    args.extend([
        // Ignored under Slurm: a node simulates as many GPUs as Slurm gave it (2).
        "--sim-gpus",
        "4",
        "--record",
        record.to_str().unwrap(),
        "--json",
        "--",
        "sh",
        "-c",
        r#"echo "$SLURMD_NODENAME $LADLE_SOCKET $CUDA_VISIBLE_DEVICES"; exec "$0" "$@""#,
        ladle_bin().to_str().unwrap(),
        "consume",
        "--batch-size",
        "{8,16,32}",
        "--epochs",
        "{1,2}",
        "--json",
    ]);
    let done = finish(ladle(cluster).args(&args), "ladle sweep --slurm");
    assert!(
        done.status.success(),
        "{}\n{}\n{}",
        done.stderr,
        done.stdout,
        cluster.logs()
    );
    assert!(
        done.stderr.contains("submitted Slurm job"),
        "{}",
        done.stderr
    );
    assert!(done.stderr.contains("scancel"), "{}", done.stderr);
    let report: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    let all = runs(&report);
    assert_eq!(all.len(), 6, "{report}");
    let mut per_node = std::collections::BTreeMap::<String, u32>::new();
    for (k, run) in all.iter().enumerate() {
        assert_eq!(run["name"], format!("run-{k:02}"), "{run}");
        assert_eq!(run["exit_code"], 0, "{run}");
        let node = run["node"].as_str().unwrap().to_owned();
        // The run ran on its node, with that node's feed.
        let (ran_on, socket, gpus) = where_it_ran(run);
        assert_eq!(ran_on, node, "{run}");
        assert!(
            socket.contains(&format!("-{node}/")) && socket.ends_with("feed.sock"),
            "{node}: {socket}"
        );
        *per_node.entry(node.clone()).or_default() += 1;
        // Only a GPU Slurm allocated (SLURM_STEP_GPUS=0,1), by its UUID.
        assert!(
            ["GPU-simulated-dev-nvidia0", "GPU-simulated-dev-nvidia1"].contains(&gpus.as_str()),
            "{node}: CUDA_VISIBLE_DEVICES={gpus}"
        );
        // Exact epochs.
        let (epochs, log) = ladle_tests::sweep_run_epochs(run);
        let want = if k % 2 == 0 { 1 } else { 2 };
        assert_eq!(epochs.len(), want, "{log}");
        assert!(epochs.iter().all(|e| e["exact_coverage"] == true), "{log}");
    }
    // Interleaved shards: three runs per node.
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), [3, 3]);
    // Exactly one feed per node, each decoding for its own runs.
    let nodes = report["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{report}");
    let mut sockets = Vec::new();
    for node in nodes {
        let feed = &node["feed"];
        assert_eq!(feed["reused"], false, "{node}");
        assert!(feed["samples_published"].as_u64().unwrap() > 0, "{node}");
        assert_eq!(node["runs"].as_array().unwrap().len(), 3, "{node}");
        sockets.push(feed["socket"].as_str().unwrap().to_owned());
    }
    assert_ne!(sockets[0], sockets[1]);
    // The merged report is in the sweep directory too, and the script beside it.
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(runs(&written).len(), 6);
    assert!(out.join("sweep.sbatch").exists());
    // The submitting side showed each node's lines, and each run's start on its node.
    for node in ["n1", "n2"] {
        assert!(
            done.stderr
                .contains(&format!("ladle sweep [{node}]: recording into")),
            "{}",
            done.stderr
        );
    }
    for (k, run) in all.iter().enumerate() {
        let node = run["node"].as_str().unwrap();
        let line = format!("ladle sweep [{node}]: run-{k:02}");
        assert!(
            done.stderr.contains(&line),
            "no {line:?} in\n{}",
            done.stderr
        );
    }
    // `--record`: one recording per node, which `ladle report` reports in turn.
    for node in ["n1", "n2"] {
        let mine = record.join(format!("node-{node}"));
        assert!(mine.join("meta.json").exists(), "{}", mine.display());
        // The node's own report, beside its series: its three runs.
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(mine.join("report.json")).unwrap())
                .unwrap();
        assert_eq!(runs(&report).len(), 3, "{node}: {report}");
    }
    let reported = finish(
        Command::new(ladle_bin()).args(["report", record.to_str().unwrap()]),
        "ladle report",
    );
    assert!(reported.status.success(), "{}", reported.stderr);
    assert!(
        reported.stdout.contains("# node-n1") && reported.stdout.contains("# node-n2"),
        "{}",
        reported.stdout
    );
    assert!(record.join("node-n2").join("summary.md").exists());
    assert_nothing_left(cluster);
}

#[test]
fn the_dry_run_script_is_one_slurm_accepts() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(20, 32, 32);
    let out = cluster.submit_dir().join("dry");
    let (data_s, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let mut args = sweep_args(data_s, out_s);
    args.extend([
        "--slurm-dry-run",
        "--slurm-arg=--time=10",
        "--",
        "train",
        "--lr",
        "{0.1,0.01}",
    ]);
    let done = finish(ladle(cluster).args(&args), "ladle sweep --slurm-dry-run");
    assert!(done.status.success(), "{}", done.stderr);
    let script = done.stdout;
    assert!(script.starts_with("#!/bin/bash"), "{script}");
    assert!(script.contains("#SBATCH --time=10"), "{script}");
    assert!(script.contains("'{0.1,0.01}'"), "{script}");
    assert_eq!(
        std::fs::read_to_string(out.join("sweep.sbatch")).unwrap(),
        script
    );
    let test = cluster
        .run(
            "sbatch",
            &["--test-only", out.join("sweep.sbatch").to_str().unwrap()],
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(test.status.success(), "{}", test.stderr);
    assert!(test.stderr.contains("to start at"), "{}", test.stderr);
    assert!(
        cluster.active_jobs().unwrap().is_empty(),
        "a dry run submitted"
    );
}

#[test]
fn a_job_asking_for_more_nodes_than_exist_is_an_error_with_slurms_reason() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(20, 32, 32);
    let out = cluster.submit_dir().join("three");
    let (data_s, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let mut args = sweep_args(data_s, out_s);
    args[3] = "3";
    args.extend(["--", "true"]);
    let done = finish(ladle(cluster).args(&args), "ladle sweep --nodes 3");
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("sbatch") && done.stderr.contains("Node count specification invalid"),
        "{}",
        done.stderr
    );
    assert!(cluster.active_jobs().unwrap().is_empty());
}

/// Starts an endless Slurm sweep in the background (runs that read until killed) and waits
/// until all four of its runs are running; returns the sweep and its job id.
fn start_endless(
    cluster: &Cluster,
    data: &Path,
    out: &Path,
    runs: &str,
    extra: &[&str],
) -> (Proc, u32) {
    let (data_s, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let mut args = sweep_args(data_s, out_s);
    args.extend(extra);
    args.extend([
        "--",
        ladle_bin().to_str().unwrap(),
        "consume",
        "--batch-size",
        runs,
        "--epochs",
        "100000",
        "--step-ms",
        "50",
    ]);
    // A job cancelled just before may still be listed: this sweep's job is a new one.
    let earlier: Vec<u32> = cluster.active_jobs().unwrap().iter().map(|j| j.0).collect();
    let sweep = Proc::spawn("ladle sweep --slurm (endless)", ladle(cluster).args(&args)).unwrap();
    let mut job = None;
    wait_until("the job's runs running", Duration::from_secs(120), || {
        job = job.or_else(|| {
            cluster
                .active_jobs()
                .unwrap()
                .iter()
                .map(|j| j.0)
                .find(|id| !earlier.contains(id))
        });
        let consumers = cluster
            .job_processes()
            .iter()
            .filter(|(_, cmd)| cmd.contains("consume") && cmd.contains("--step-ms"))
            .count();
        Ok::<_, String>((consumers >= 4).then_some(()))
    });
    (sweep, job.unwrap())
}

#[test]
fn scancel_mid_sweep_stops_every_ladle_process_on_every_node() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(60, 32, 32);
    let out = cluster.submit_dir().join("cancel");
    let (mut sweep, job) = start_endless(cluster, &data, &out, "{4,8,16,32}", &[]);
    cluster
        .run("scancel", &[&job.to_string()], Duration::from_secs(30))
        .unwrap();
    sweep.wait_timeout(GUARD).unwrap();
    let done = sweep.output().unwrap();
    assert!(!done.status.success(), "a cancelled sweep reports failure");
    assert!(done.stderr.contains("CANCELLED"), "{}", done.stderr);
    assert_nothing_left(cluster);
}

#[test]
fn ctrl_c_on_the_submitting_side_leaves_the_job_running_or_with_cancel_on_exit_cancels_it() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(60, 32, 32);
    let interrupt = |sweep: &mut Proc| {
        sweep.signal(ladle_os::Signal::INT).unwrap();
        sweep.wait_timeout(GUARD).unwrap();
        sweep.output().unwrap()
    };
    // No terminal to ask on and no --cancel-on-exit: the submitter stops following and says
    // how to cancel; the job goes on.
    let out = cluster.submit_dir().join("ctrl-c");
    let (mut sweep, job) = start_endless(cluster, &data, &out, "{4,8,16,32}", &[]);
    let done = interrupt(&mut sweep);
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("not a terminal, so not cancelling")
            && done.stderr.contains(&format!("`scancel {job}` cancels it")),
        "{}",
        done.stderr
    );
    assert!(
        cluster.active_jobs().unwrap().iter().any(|j| j.0 == job),
        "job {job} should still be running"
    );
    cluster
        .run("scancel", &[&job.to_string()], Duration::from_secs(30))
        .unwrap();
    assert_nothing_left(cluster);
    // With --cancel-on-exit: Ctrl-C cancels the job, follows it to its end, and nothing of
    // ladle is left on either node.
    let out = cluster.submit_dir().join("ctrl-c-cancel");
    let (mut sweep, job) =
        start_endless(cluster, &data, &out, "{4,8,16,32}", &["--cancel-on-exit"]);
    let done = interrupt(&mut sweep);
    assert!(!done.status.success(), "a cancelled sweep reports failure");
    assert!(
        done.stderr.contains(&format!("cancelled job {job}")) && done.stderr.contains("CANCELLED"),
        "{}",
        done.stderr
    );
    assert!(!cluster.active_jobs().unwrap().iter().any(|j| j.0 == job));
    assert_nothing_left(cluster);
}

/// Lines of a node's run ledger in the sweep directory.
/// The ended runs node `node` recorded, in every job of the sweep (`node-NODE`, and beside it
/// `node-NODE.2`, ... for a resumed sweep's later jobs).
fn ledger_lines(out: &Path, node: &str) -> Vec<Value> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name == format!("node-{node}") || name.starts_with(&format!("node-{node}."))
        })
        .collect();
    dirs.sort();
    dirs.iter()
        .flat_map(|dir| {
            std::fs::read_to_string(dir.join("runs.jsonl"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect::<Vec<Value>>()
        })
        .collect()
}

/// Starts a `--json` Slurm sweep in the background whose four runs (`run-00` … `run-03`,
/// batch sizes 4 to 32: n1 runs 0 and 2, n2 runs 1 and 3) each run `sh -c SCRIPT` before
/// `ladle consume`; SCRIPT ends with `exec "$0" "$@"` and may wait at a gate file.
fn gated_sweep(
    cluster: &Cluster,
    data: &Path,
    out: &Path,
    extra: &[&str],
    script: &str,
    consume: &[&str],
) -> Proc {
    let (data_s, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let mut args = sweep_args(data_s, out_s);
    args.extend(extra);
    args.extend([
        "--json",
        "--",
        "sh",
        "-c",
        script,
        ladle_bin().to_str().unwrap(),
        "consume",
        "--batch-size",
        "{4,8,16,32}",
        "--json",
    ]);
    args.extend(consume);
    Proc::spawn("ladle sweep --slurm (gated)", ladle(cluster).args(&args)).unwrap()
}

#[test]
fn a_node_lost_mid_sweep_is_reported_and_the_resume_runs_only_its_runs() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(60, 32, 32);
    let out = cluster.submit_dir().join("lost");
    // Each run reads as many epochs as its node's file says (n1's runs end, n2's do not),
    // once its node's gate file exists: n1's runs are running, waiting at the gate, while
    // n2 is lost.
    let files = fx.path().to_owned();
    std::fs::write(files.join("epochs-n1"), "1").unwrap();
    std::fs::write(files.join("epochs-n2"), "100000").unwrap();
    std::fs::write(files.join("go-n2"), "").unwrap();
    let wrapper = format!(
        r#"while [ ! -e {0}/go-$SLURMD_NODENAME ]; do sleep 0.1; done; exec "$0" "$@" --epochs "$(cat {0}/epochs-$SLURMD_NODENAME)""#,
        files.display()
    );
    let mut sweep = gated_sweep(cluster, &data, &out, &[], &wrapper, &["--step-ms", "50"]);
    let out_s = out.to_str().unwrap();
    let reading = |procs: &[(u32, String)]| {
        procs
            .iter()
            .filter(|(_, cmd)| cmd.contains("consume") && !cmd.contains("while"))
            .count()
    };
    wait_until(
        "n1's runs at their gate and n2's reading",
        Duration::from_secs(120),
        || {
            let procs = cluster.job_processes();
            let waiting = procs
                .iter()
                .filter(|(_, cmd)| cmd.starts_with("sh") && cmd.contains("while"))
                .count();
            Ok::<_, String>((reading(&procs) >= 2 && waiting >= 2).then_some(()))
        },
    );
    cluster
        .set_node_state("n2", "down", "lost-in-test")
        .unwrap();
    // n2's runs die with it; then n1's, which were running all along, go past their gate.
    wait_until("n2's runs gone", Duration::from_secs(60), || {
        Ok::<_, String>((reading(&cluster.job_processes()) == 0).then_some(()))
    });
    std::fs::write(files.join("go-n1"), "").unwrap();
    sweep.wait_timeout(GUARD).unwrap();
    let done = sweep.output().unwrap();
    assert!(
        !done.status.success(),
        "a sweep with lost runs reports failure"
    );
    let report: Value = serde_json::from_str(done.stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {}\n{}\n{}", done.stdout, done.stderr, cluster.logs()));
    let all = runs(&report);
    let states: Vec<&str> = all.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states[0], "succeeded", "{report}");
    assert_eq!(states[2], "succeeded", "{report}");
    for lost in [&all[1], &all[3]] {
        assert_eq!(lost["node"], "n2", "{lost}");
        assert_ne!(lost["state"], "succeeded", "{lost}");
        let reason = lost["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("n2"), "the reason names the node: {lost}");
    }
    // Slurm killed n2's processes; its node-local directory stays behind, as a failed node's
    // would, until ladle next runs there.
    wait_until("every ladle process gone", Duration::from_secs(60), || {
        Ok::<_, String>(cluster.job_processes().is_empty().then_some(()))
    });
    assert!(
        std::fs::read_dir(cluster.local_root())
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with("-n2")),
        "the lost node's state is gone: was it really lost?"
    );

    // The node comes back; the resume runs only the two lost runs, which now end. The user
    // had edited the batch script meanwhile: the resume writes its own beside it.
    cluster.set_node_state("n2", "resume", "").unwrap();
    std::fs::write(files.join("epochs-n2"), "1").unwrap();
    let script = out.join("sweep.sbatch");
    let edited = std::fs::read_to_string(&script).unwrap() + "# edited by hand\n";
    std::fs::write(&script, &edited).unwrap();
    let resumed = finish(
        ladle(cluster).args(["sweep", "--resume", out_s, "--json"]),
        "ladle sweep --resume",
    );
    assert!(
        resumed.status.success(),
        "{}\n{}",
        resumed.stderr,
        cluster.logs()
    );
    assert!(
        resumed
            .stderr
            .contains("resuming 2 of 4 runs: run-01 run-03"),
        "{}",
        resumed.stderr
    );
    let report: Value = serde_json::from_str(resumed.stdout.trim()).unwrap();
    assert!(
        runs(&report).iter().all(|r| r["state"] == "succeeded"),
        "{report}"
    );
    assert_eq!(std::fs::read_to_string(&script).unwrap(), edited);
    assert!(out.join("resume-1.sbatch").exists());
    // Each run's log is its own: the resumed job's scheduler numbered its runs from 1 again,
    // and once wrote run-01's output into run-00's log. A resumed run lists its earlier
    // attempt, with that attempt's log; the merged report covers both jobs' nodes.
    let all = runs(&report);
    let logs: Vec<&str> = all.iter().map(|r| r["log"].as_str().unwrap()).collect();
    let mut distinct = logs.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{logs:?}");
    for (run, log) in all.iter().zip(&logs) {
        let text = std::fs::read_to_string(log).unwrap();
        let summaries = text
            .lines()
            .filter(|l| l.contains("\"samples_per_s\"") && l.contains("\"epochs\""))
            .count();
        assert_eq!(
            summaries, 1,
            "{}: {log} holds {summaries} runs' summaries",
            run["name"]
        );
    }
    for resumed_run in [&all[1], &all[3]] {
        let attempts = resumed_run["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{resumed_run}");
        assert_ne!(attempts[0]["state"], "succeeded", "{resumed_run}");
        assert_ne!(attempts[0]["job"], Value::Null, "{resumed_run}");
    }
    let jobs: std::collections::BTreeSet<String> = (report["nodes"].as_array().unwrap().iter())
        .map(|n| n["job"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(jobs.len(), 2, "{report}");
    // run-00 and run-02 ran once, in the first job.
    let ran: Vec<String> = ["n1", "n2"]
        .iter()
        .flat_map(|n| ledger_lines(&out, n))
        .filter(|r| r["state"] == "succeeded")
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    let mut sorted = ran.clone();
    sorted.sort();
    assert_eq!(sorted, ["run-00", "run-01", "run-02", "run-03"], "{ran:?}");
    assert_nothing_left(cluster);
}

/// Seconds since midnight UTC of a tracing timestamp (`2026-11-24T08:56:32.493277Z`).
fn seconds_of_day(stamp: &str) -> Option<f64> {
    let time = stamp.split_once('T')?.1.strip_suffix('Z')?;
    let mut parts = time.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

fn now_of_day() -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    now % 86_400.0
}

/// The benchmark of `benches/README.md` ("Slurm: one sweep over two nodes"): the same
/// six-run grid as a local sweep (one node, four simulated GPUs) and as a two-node Slurm
/// sweep (two simulated GPUs each), side by side. Run it with
/// `cargo test --release -p ladle-tests --test slurm_sweep -- --ignored --nocapture`.
#[test]
#[ignore = "a benchmark: prints its measurements"]
fn bench_local_against_two_node_slurm_sweep() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(1000, 160, 120);
    let data_s = data.to_str().unwrap();
    let ladle_s = ladle_bin().to_str().unwrap();
    let command = [
        "--",
        ladle_s,
        "consume",
        "--batch-size",
        "{32,64,128}",
        "--epochs",
        "{2,3}",
        "--step-ms",
        "20",
        "--json",
    ];
    let common = [
        "--dataset",
        data_s,
        "--image-size",
        "64",
        "--ring-mib",
        "8",
        "--gpu",
        "sim",
        "--settle-s",
        "0",
        "--tick-ms",
        "100",
        "--gpu-mem",
        "1GiB",
    ];
    // Local: one node with four simulated GPUs.
    let local_out = cluster.submit_dir().join("bench-local");
    let local_s = local_out.to_str().unwrap();
    let mut args = vec![
        "sweep",
        "--private-scheduler",
        "--sim-gpus",
        "4",
        "--out",
        local_s,
    ];
    args.extend(common);
    args.extend(command);
    let started = now_of_day();
    let local = finish(cluster.command(ladle_bin()).args(&args), "local sweep");
    let local_wall = now_of_day() - started;
    assert!(local.status.success(), "{}", local.stderr);
    let first_local = local
        .stderr
        .lines()
        .find(|l| l.contains("started job="))
        .and_then(|l| l.split_whitespace().next())
        .and_then(seconds_of_day)
        .map(|t| t - started);
    println!("{}", local.stdout);

    // Slurm: two nodes with two simulated GPUs each.
    let out = cluster.submit_dir().join("bench-slurm");
    let out_s = out.to_str().unwrap();
    let mut args = vec![
        "sweep",
        "--slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--out",
        out_s,
    ];
    args.extend(common);
    args.extend(command);
    let started = now_of_day();
    let slurm = finish(ladle(cluster).args(&args), "slurm sweep");
    let slurm_wall = now_of_day() - started;
    assert!(slurm.status.success(), "{}", slurm.stderr);
    let first_slurm = slurm
        .stderr
        .lines()
        .filter(|l| l.contains("started job="))
        .filter_map(|l| l.split_whitespace().next().and_then(seconds_of_day))
        .reduce(f64::min)
        .map(|t| t - started);
    eprintln!("{}", slurm.stderr);
    println!("{}", slurm.stdout);
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let local_report: Value =
        serde_json::from_str(&std::fs::read_to_string(local_out.join("report.json")).unwrap())
            .unwrap();
    println!(
        "local: wall {local_wall:.1} s, first run started after {:.1} s, {:.1} CPU-s, {} samples decoded",
        first_local.unwrap_or(f64::NAN),
        local_report["cpu_seconds"].as_f64().unwrap(),
        local_report["feed"]["samples_published"]
    );
    println!(
        "slurm: wall {slurm_wall:.1} s, first run started {:.1} s after sbatch, {:.1} CPU-s, decoded per node: {}",
        first_slurm.unwrap_or(f64::NAN),
        report["cpu_seconds"].as_f64().unwrap(),
        report["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| format!("{} {}", n["name"], n["feed"]["samples_published"]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_nothing_left(cluster);
}

#[test]
fn a_requeued_job_gives_its_runs_sigterm_and_does_not_rerun_the_finished_ones() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let mut fx = Fixture::new();
    let data = fx.dataset(60, 32, 32);
    let out = cluster.submit_dir().join("requeue");
    // n1's runs end at once; n2's wait at their gate, noting a SIGTERM when one comes.
    let files = fx.path().to_owned();
    std::fs::write(files.join("go-n1"), "").unwrap();
    let wrapper = format!(
        r#"trap 'echo term >> {0}/term-$LADLE_RUN; exit 143' TERM; while [ ! -e {0}/go-$SLURMD_NODENAME ]; do sleep 0.1; done; exec "$0" "$@""#,
        files.display()
    );
    let mut sweep = gated_sweep(
        cluster,
        &data,
        &out,
        &["--slurm-arg=--requeue"],
        &wrapper,
        &["--epochs", "1"],
    );
    let mut job = None;
    wait_until(
        "n1's runs ended and n2's at their gate",
        Duration::from_secs(120),
        || {
            job = job.or_else(|| cluster.active_jobs().unwrap().first().copied());
            let waiting = cluster
                .job_processes()
                .iter()
                .filter(|(_, cmd)| cmd.starts_with("sh") && cmd.contains("while"))
                .count();
            Ok::<_, String>((ledger_lines(&out, "n1").len() == 2 && waiting >= 2).then_some(()))
        },
    );
    let job = job.unwrap();
    cluster
        .run_ok(
            "scontrol",
            &["requeue", &job.to_string()],
            Duration::from_secs(30),
        )
        .unwrap();
    // The preempted runs get SIGTERM (time to checkpoint) while still at their gate, and the
    // gate opens only once both have noted it. (Opening it when the job left RUNNING raced:
    // the job leaves RUNNING as soon as slurmctld takes the requeue, before slurmd has
    // signalled anything, and a run let through its gate has exec'd `ladle consume` and no
    // trap left to note the signal with.)
    let term =
        |run: &str| std::fs::read_to_string(files.join(format!("term-{run}"))).unwrap_or_default();
    wait_until(
        "n2's runs (run-01, run-03) noted their SIGTERM",
        Duration::from_secs(60),
        || {
            let noted = ["run-01", "run-03"]
                .iter()
                .all(|r| term(r).contains("term"));
            Ok::<_, String>(noted.then_some(()))
        },
    );
    std::fs::write(files.join("go-n2"), "").unwrap();
    sweep.wait_timeout(GUARD).unwrap();
    let done = sweep.output().unwrap();
    assert!(done.status.success(), "{}\n{}", done.stderr, done.stdout);
    let report: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    assert!(
        runs(&report).iter().all(|r| r["state"] == "succeeded"),
        "{report}"
    );
    // n1's finished runs ran once; n2's preempted ones twice (the second through the open
    // gate).
    let n1 = ledger_lines(&out, "n1");
    assert_eq!(n1.len(), 2, "n1's finished runs ran again: {n1:?}");
    let node: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("node-n1").join("node.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        node["skipped"],
        serde_json::json!(["run-00", "run-02"]),
        "{node}"
    );
    assert_nothing_left(cluster);
}
