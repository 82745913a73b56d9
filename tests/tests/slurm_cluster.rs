//! Smoke tests of the Slurm harness (`ladle_tests::slurm`): a real two-node cluster on this
//! machine, and the Slurm behaviour `ladle sweep --slurm` builds on. Every test skips (saying
//! why) where the cluster cannot run: no Slurm packages, not root.
//!
//! What these tests pin down (Debian 12's Slurm 22.05.8, the harness's configuration):
//!
//! | where | `CUDA_VISIBLE_DEVICES` | `SLURM_JOB_GPUS` | `SLURM_STEP_GPUS` |
//! |---|---|---|---|
//! | `srun -N2 -n2 --ntasks-per-node=1 --gres=gpu:2` (its own allocation), each task | `0,1` | unset | `0,1` |
//! | batch script of `sbatch --nodes=2 --gres=gpu:2` (on `n1`) | `0,1` | `0,1` | unset |
//! | its step `srun -n "$SLURM_NNODES" --ntasks-per-node=1`, each task | `0,1` | `0,1` | `0,1` |
//!
//! - Too many nodes (`EnforcePartLimits=ALL`): `sbatch --nodes=3` exits 1 with `sbatch: error:
//!   Batch job submission failed: Node count specification invalid`; `srun -N3` with `srun:
//!   error: Unable to allocate resources: Node count specification invalid`. Nothing is queued.
//! - A node set down (`scontrol update nodename=n2 state=down reason=test`) stays down until
//!   `state=resume`; a 2-node job pends meanwhile with reason
//!   `ReqNodeNotAvail,_UnavailableNodes:n2` (as `scontrol show job -o` prints it), and `srun
//!   -N2` blocks (the bounded runner stops it).
//! - n2 taken down under a running 2-node job whose step has a task on each node:
//!   - with `--no-kill`: Slurm kills the **whole step**, the task on n1 as well (`srun: error:
//!     Node failure on n2`, `srun: error: n1: task 0: Killed`; `srun: error: n2: task 1:
//!     Killed` only some of the time, but n2's task is gone either way); `srun` exits
//!     **137**; the **batch script goes on**, its job shrunk to n1
//!     (`NodeList=n1 NumNodes=1`); a later `srun -n 1` runs on n1 and the job ends
//!     `COMPLETED`;
//!   - without it (the default): the **whole job** is killed, batch script included (`***
//!     JOB N ON n1 CANCELLED AT ... DUE TO NODE FAILURE ...`), and **requeued**: `PENDING`,
//!     reason `BeginTime`, `Restarts=1`;
//!   - with `--no-requeue`: killed the same way and ends `NODE_FAIL`, reason `NodeDown`.
//! - A test binary that fails (exit 101) has, by the time it has exited, stopped its cluster,
//!   its jobs (a step's `sleep` on each node and a process double-forked out of the batch
//!   step) and removed its directory; one killed with SIGKILL has all of that done by its
//!   watchdog shortly after.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use ladle_os::{Proc, Signal};
use ladle_tests::slurm::{COMMAND_TIMEOUT, Cluster, JobId, SlurmError, processes_of};
use ladle_tests::wait_until;

/// Deadlock guard for one job or one child process; never a speed assertion.
const GUARD: Duration = Duration::from_secs(120);

/// Prints, on one line, the node, and the GPU variables Slurm set (or `unset`).
const SHOW_GPU_VARS: &str = r#"echo "$1 $SLURMD_NODENAME node_id=${SLURM_NODEID-unset} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} SLURM_JOB_GPUS=${SLURM_JOB_GPUS-unset} SLURM_STEP_GPUS=${SLURM_STEP_GPUS-unset}"
"#;

/// Writes [`SHOW_GPU_VARS`] to the submit directory; returns its path.
fn show_gpu_vars(cluster: &Cluster) -> PathBuf {
    let path = cluster.submit_dir().join("show-gpu-vars.sh");
    std::fs::write(&path, SHOW_GPU_VARS).unwrap();
    path
}

/// A job's output once it has finished (state `expected`).
fn finished_output(cluster: &Cluster, job: JobId, expected: &str) -> String {
    let state = cluster.wait_job_end(job, GUARD).unwrap();
    let out = std::fs::read_to_string(cluster.default_output(job)).unwrap_or_default();
    assert_eq!(state, expected, "job {job}; output:\n{out}");
    out
}

/// Its lines, sorted.
fn sorted_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}

/// Waits until `path` exists.
fn wait_for_file(path: &Path, what: &str) {
    let what = format!("{what}: {} appearing", path.display());
    wait_until(&what, GUARD, || {
        Ok::<_, String>(path.exists().then_some(()))
    });
}

#[test]
fn both_nodes_come_up_idle_with_two_gpus_each() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let states = cluster.node_states().unwrap();
    assert_eq!(
        states.into_iter().collect::<Vec<_>>(),
        [("n1".into(), "idle".into()), ("n2".into(), "idle".into())]
    );
    let gres = cluster
        .run_ok("sinfo", &["-h", "-N", "-o", "%N %G"], COMMAND_TIMEOUT)
        .unwrap();
    assert_eq!(sorted_lines(&gres), ["n1 gpu:2", "n2 gpu:2"]);
    assert_eq!(cluster.node_names(), ["n1", "n2"]);
}

#[test]
fn srun_on_both_nodes_gives_each_task_its_node_and_both_of_its_gpus() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let show = show_gpu_vars(cluster);
    let out = cluster
        .run_ok(
            "srun",
            &[
                "-N2",
                "-n2",
                "--ntasks-per-node=1",
                "--gres=gpu:2",
                "sh",
                show.to_str().unwrap(),
                "srun",
            ],
            GUARD,
        )
        .unwrap();
    eprintln!("{out}");
    assert_eq!(
        sorted_lines(&out),
        [
            "srun n1 node_id=0 CUDA_VISIBLE_DEVICES=0,1 SLURM_JOB_GPUS=unset SLURM_STEP_GPUS=0,1",
            "srun n2 node_id=1 CUDA_VISIBLE_DEVICES=0,1 SLURM_JOB_GPUS=unset SLURM_STEP_GPUS=0,1",
        ]
    );
}

#[test]
fn a_batch_script_sees_its_gpus_in_two_variables_and_its_srun_step_in_three() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let show = show_gpu_vars(cluster);
    let show = show.display();
    let script =
        format!("sh {show} batch\nsrun -n \"$SLURM_NNODES\" --ntasks-per-node=1 sh {show} step\n");
    let job = cluster
        .sbatch(&["--nodes=2", "--gres=gpu:2"], &script)
        .unwrap();
    let out = finished_output(cluster, job, "COMPLETED");
    eprintln!("{out}");
    assert_eq!(
        sorted_lines(&out),
        [
            "batch n1 node_id=0 CUDA_VISIBLE_DEVICES=0,1 SLURM_JOB_GPUS=0,1 SLURM_STEP_GPUS=unset",
            "step n1 node_id=0 CUDA_VISIBLE_DEVICES=0,1 SLURM_JOB_GPUS=0,1 SLURM_STEP_GPUS=0,1",
            "step n2 node_id=1 CUDA_VISIBLE_DEVICES=0,1 SLURM_JOB_GPUS=0,1 SLURM_STEP_GPUS=0,1",
        ]
    );
}

#[test]
fn asking_for_more_nodes_than_the_cluster_has_is_refused_at_submission() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    match cluster.sbatch(&["--nodes=3"], "true") {
        Err(SlurmError::Failed { stderr, .. }) => assert_eq!(
            stderr.trim(),
            "sbatch: error: Batch job submission failed: Node count specification invalid"
        ),
        other => panic!("sbatch --nodes=3: {other:?}"),
    }
    let srun = cluster.run("srun", &["-N3", "true"], GUARD).unwrap();
    assert!(!srun.status.success());
    assert_eq!(
        srun.stderr.trim(),
        "srun: error: Unable to allocate resources: Node count specification invalid"
    );
    assert_eq!(cluster.active_jobs().unwrap(), []);
}

#[test]
fn a_node_set_down_stays_down_holding_back_two_node_jobs_until_it_is_resumed() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    cluster.set_node_state("n2", "down", "test").unwrap();
    let job = cluster.sbatch(&["--nodes=2"], "true").unwrap();
    let reason = wait_until(&format!("job {job} getting a reason"), GUARD, || {
        let fields = cluster.job_fields(job).unwrap().unwrap();
        if fields["Reason"] == "None" {
            return Err(format!("{fields:?}"));
        }
        assert_eq!(fields["JobState"], "PENDING");
        Ok(Some(fields["Reason"].clone()))
    });
    assert_eq!(reason, "ReqNodeNotAvail,_UnavailableNodes:n2");
    // srun waits for ever for a down node: the bounded runner stops it.
    let blocked = cluster.run("srun", &["-N2", "true"], Duration::from_secs(3));
    assert!(
        matches!(blocked, Err(SlurmError::Timeout { .. })),
        "{blocked:?}"
    );
    // Still down (ReturnToService=1: with 2 it would be back by now).
    assert_eq!(cluster.node_states().unwrap()["n2"], "down");
    cluster.set_node_state("n2", "resume", "").unwrap();
    finished_output(cluster, job, "COMPLETED");
    cluster
        .wait_nodes("both nodes idle", GUARD, |_, s| s == "idle")
        .unwrap();
}

/// Submits, on both nodes, a job whose step sleeps for ten minutes on each, and waits until
/// both tasks run; the script then reports what srun did and runs a second step. Returns the
/// job and the pids of the two tasks (`sleep`s).
fn start_two_node_step(cluster: &Cluster, extra: &[&str]) -> (JobId, [u32; 2]) {
    let script = r#"echo "batch on $SLURMD_NODENAME"
srun -n "$SLURM_NNODES" --ntasks-per-node=1 sh -c 'echo "task $SLURM_PROCID on $SLURMD_NODENAME started"; f="$SLURM_SUBMIT_DIR/step-$SLURM_JOB_ID-$SLURMD_NODENAME"; echo $$ > "$f.tmp"; mv "$f.tmp" "$f"; exec sleep 600'
echo "srun exited $?"
echo "job nodes now $(squeue -h -j "$SLURM_JOB_ID" -o %N)"
srun -n 1 sh -c 'echo "second step on $SLURMD_NODENAME"'
echo "second srun exited $?"
"#;
    let args = [extra, &["--nodes=2", "--gres=gpu:2"]].concat();
    let job = cluster.sbatch(&args, script).unwrap();
    let pids = ["n1", "n2"].map(|node| {
        let marker = cluster.submit_dir().join(format!("step-{job}-{node}"));
        wait_for_file(&marker, &format!("job {job}'s task on {node}"));
        std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    });
    (job, pids)
}

/// Waits until the tasks `pids` are gone (they would sleep for ten minutes) and no other
/// process of the cluster's jobs is left.
fn wait_for_tasks_gone(cluster: &Cluster, pids: [u32; 2]) {
    let running = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rfind(')')
                .is_some_and(|i| !s[i + 1..].trim_start().starts_with('Z'))
        })
    };
    wait_until(
        &format!("tasks {pids:?} and every other job process gone"),
        GUARD,
        || {
            let left = cluster.job_processes();
            if pids.iter().any(|p| running(*p)) || !left.is_empty() {
                Err(format!(
                    "tasks {pids:?} or other job processes left: {left:?}"
                ))
            } else {
                Ok(Some(()))
            }
        },
    );
}

/// Asserts that `out` has every line of `expected` and none containing `absent`.
fn assert_lines(out: &str, expected: &[&str], absent: &[&str]) {
    for line in expected {
        assert!(
            out.lines().any(|l| l == *line),
            "no line {line:?} in:\n{out}"
        );
    }
    for text in absent {
        assert!(!out.contains(text), "{text:?} in:\n{out}");
    }
}

#[test]
fn taking_a_node_down_under_a_no_kill_job_kills_its_whole_step_and_the_script_goes_on_on_the_other_node()
 {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let (job, tasks) = start_two_node_step(cluster, &["--no-kill"]);
    cluster.set_node_state("n2", "down", "test").unwrap();
    let out = finished_output(cluster, job, "COMPLETED");
    // Both tasks started (their marker files say so); their "started" lines are not asked
    // for: what a task printed on the node that failed may die with that node's slurmstepd
    // before srun forwards it (seen on CI: n2's line missing, n1's present).
    assert_lines(
        &out,
        &[
            "srun: error: Node failure on n2",
            "srun: error: n1: task 0: Killed",
            "srun exited 137",
            "job nodes now n1",
            "second step on n1",
            "second srun exited 0",
        ],
        &[],
    );
    let fields = cluster.job_fields(job).unwrap().unwrap();
    assert_eq!((&*fields["NodeList"], &*fields["NumNodes"]), ("n1", "1"));
    wait_for_tasks_gone(cluster, tasks);
}

#[test]
fn taking_a_node_down_under_an_ordinary_job_kills_all_of_it_and_requeues_it() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let (job, tasks) = start_two_node_step(cluster, &[]);
    cluster.set_node_state("n2", "down", "test").unwrap();
    wait_until(&format!("job {job} requeued"), GUARD, || {
        let f = cluster.job_fields(job).unwrap().unwrap();
        if f["JobState"] == "PENDING" && f["Restarts"] == "1" {
            assert_eq!(f["Reason"], "BeginTime");
            Ok(Some(()))
        } else {
            Err(format!("{f:?}"))
        }
    });
    wait_for_tasks_gone(cluster, tasks);
    let out = std::fs::read_to_string(cluster.default_output(job)).unwrap();
    assert_lines(&out, &["srun: error: Node failure on n2"], &["srun exited"]);
    assert!(
        out.contains(&format!("*** JOB {job} ON n1 CANCELLED AT ")),
        "{out}"
    );
    assert!(out.contains(" DUE TO NODE FAILURE"), "{out}");
}

#[test]
fn taking_a_node_down_under_a_no_requeue_job_ends_it_as_node_fail() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let (job, tasks) = start_two_node_step(cluster, &["--no-requeue"]);
    cluster.set_node_state("n2", "down", "test").unwrap();
    let out = finished_output(cluster, job, "NODE_FAIL");
    assert_lines(&out, &["srun: error: Node failure on n2"], &["srun exited"]);
    let fields = cluster.job_fields(job).unwrap().unwrap();
    assert_eq!(fields["Reason"], "NodeDown");
    wait_for_tasks_gone(cluster, tasks);
}

/// One child cluster at a time (they share the next harness instance).
static CHILD_CLUSTERS: Mutex<()> = Mutex::new(());

/// Environment of the child test binary of the cleanup tests: what to do, and where to say
/// that its cluster runs.
const CHILD_MODE: &str = "LADLE_SLURM_CLEANUP_CHILD";
const CHILD_REPORT: &str = "LADLE_SLURM_CLEANUP_REPORT";

/// Whether `cmdline` is `sleep SECS` (`srun` gives the full path).
fn is_sleep(cmdline: &str, secs: u32) -> bool {
    cmdline == format!("sleep {secs}") || cmdline == format!("/usr/bin/sleep {secs}")
}

/// Runs in a child test binary started by the two cleanup tests below (and does nothing when
/// run otherwise): starts its own cluster (the next harness instance, so its own ports and
/// lock), runs a job with a step sleeping on both nodes and a process that double-forks out
/// of its batch step, reports the cluster's directory, then panics or hangs.
#[test]
#[ignore = "a helper: the cleanup tests run it in a child process"]
fn cleanup_child_starts_a_cluster_with_a_job_then_panics_or_hangs() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let report = PathBuf::from(std::env::var(CHILD_REPORT).unwrap());
    let cluster = Cluster::shared().expect("the child's cluster starts");
    let _serial = cluster.lock();
    cluster
        .sbatch(
            &["--nodes=2"],
            "(sleep 601 &)\nsrun -n 2 --ntasks-per-node=1 sleep 600\n",
        )
        .unwrap();
    wait_until("the job running", GUARD, || {
        let procs = cluster.job_processes();
        let count = |secs| procs.iter().filter(|(_, l)| is_sleep(l, secs)).count();
        if count(600) == 2 && count(601) == 1 {
            Ok(Some(()))
        } else {
            Err(format!("{procs:?}"))
        }
    });
    let tmp = report.with_extension("tmp");
    std::fs::write(&tmp, cluster.dir().display().to_string()).unwrap();
    std::fs::rename(&tmp, &report).unwrap();
    if mode == "panic" {
        // Not before the parent has seen the job's processes: the panic's clean-up kills
        // them, and a parent that looked a moment later found the tasks already gone.
        let go = report.with_extension("go");
        wait_until("the parent's go-ahead", GUARD, || {
            Ok::<_, String>(go.exists().then_some(()))
        });
        panic!("a deliberate failure: the binary exits 101 and its cluster must go with it");
    }
    // The hang is the behaviour under test: the parent kills this binary while it waits here,
    // and its cluster must go with it. Not a wait for anything.
    std::thread::sleep(Duration::from_secs(600));
}

/// Starts the child test binary in `mode`; returns it and its cluster's directory once its
/// job runs.
fn start_cleanup_child(mode: &str, scratch: &Path) -> (Proc, PathBuf) {
    let instance: u16 = std::env::var("LADLE_SLURM_INSTANCE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let report = scratch.join("cluster-dir");
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "cleanup_child_starts_a_cluster_with_a_job_then_panics_or_hangs",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("LADLE_SLURM_INSTANCE", (instance + 1).to_string())
        .env(CHILD_MODE, mode)
        .env(CHILD_REPORT, &report);
    let mut child = Proc::spawn("child test binary", &mut command).unwrap();
    let waited = std::panic::catch_unwind(AssertUnwindSafe(|| {
        wait_until("the child's cluster running its job", GUARD, || {
            if report.exists() {
                return Ok(Some(()));
            }
            if child.try_wait().unwrap().is_some() {
                let out = child.output().unwrap();
                panic!("the child exited early: {}\n{}", out.stdout, out.stderr);
            }
            Ok::<_, String>(None)
        });
    }));
    if let Err(failed) = waited {
        // Killed before its output is read (a child that exited early has handed it out).
        child.kill();
        let out = child.output().unwrap();
        panic!(
            "{}\n{}\n{}",
            failed.downcast_ref::<String>().map_or("", String::as_str),
            out.stdout,
            out.stderr
        );
    }
    let dir = PathBuf::from(std::fs::read_to_string(&report).unwrap());
    let procs = processes_of(&dir);
    assert!(
        procs.iter().any(|(_, l)| is_sleep(l, 600))
            && procs.iter().any(|(_, l)| l.starts_with("slurmctld")),
        "{procs:?}"
    );
    // Seen: the child may go on (a "panic" child waits for this).
    std::fs::write(report.with_extension("go"), b"").unwrap();
    (child, dir)
}

#[test]
fn a_test_binary_that_fails_has_stopped_its_cluster_and_its_jobs_when_it_exits() {
    let Some(_) = Cluster::shared() else { return };
    let _one = CHILD_CLUSTERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let scratch = tempfile::tempdir().unwrap();
    let (mut child, dir) = start_cleanup_child("panic", scratch.path());
    let status = child.wait_timeout(GUARD).unwrap();
    let out = child.output().unwrap();
    assert_eq!(status.code(), Some(101), "{}\n{}", out.stdout, out.stderr);
    // At once: the atexit handler finished before the process was gone.
    assert_eq!(processes_of(&dir), [], "left behind");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn a_test_binary_killed_with_sigkill_has_its_cluster_and_jobs_killed_by_the_watchdog() {
    let Some(_) = Cluster::shared() else { return };
    let _one = CHILD_CLUSTERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let scratch = tempfile::tempdir().unwrap();
    let (mut child, dir) = start_cleanup_child("hang", scratch.path());
    child.signal(Signal::KILL).unwrap();
    child.wait_timeout(GUARD).unwrap();
    wait_until("every process and the directory gone", GUARD, || {
        let left = processes_of(&dir);
        if left.is_empty() && !dir.exists() {
            Ok(Some(()))
        } else {
            Err(format!(
                "left behind: {left:?}, directory there: {}",
                dir.exists()
            ))
        }
    });
}
