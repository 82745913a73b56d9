//! # A throw-away two-node Slurm cluster on this machine, for tests
//!
//! [`Cluster::shared`] starts, on first use, one real Slurm 22.05+ cluster per test binary:
//! a private `munged`, a `slurmctld` and two `slurmd`s (nodes `n1` and `n2`, 2 CPUs and 2 fake
//! GPUs each, one default partition `main` holding both), all configured under a fresh
//! temporary directory and all stopped when the test binary exits. Tests that submit jobs
//! take [`Cluster::lock`] first: it serialises them and hands each an idle cluster with an
//! empty queue. When Slurm is not installed (`scripts/check` installs Debian's `slurmctld
//! slurmd slurm-client munge`), the process is not root, or the cluster does not come up,
//! `shared` says why on stderr and returns `None`: the caller skips. Set
//! `LADLE_REQUIRE_SLURM=1` to make that a panic instead (CI where Slurm must be tested).
//!
//! ## The configuration, and the pitfalls it avoids
//! - **No cgroups, no accounting** (`proctrack/linuxproc`, `task/none`, `*/none` elsewhere):
//!   runs in a container without systemd. `sacct` does not work: job states come from
//!   `scontrol show job` ([`Cluster::job_state`]), which keeps a finished job for
//!   `MinJobAge` (300 s).
//! - **Two nodes on one host**: each `NodeName` has its own `Port`, `NodeAddr=127.0.0.1`, a
//!   distinct `NodeHostname`, and `%n` in its spool, pid and log paths; `slurmd -N n1`.
//!   `SlurmdParameters=config_overrides` lets each declare `CPUs=2` whatever the machine has.
//!   Both nodes share `/tmp`, `/dev/shm`, the CPUs and the host name (`hostname` and `%N` in
//!   `--output` give the host's name on both): node-local paths must include
//!   `$SLURMD_NODENAME` ([`Cluster::local_dir`]).
//! - **Fake GPUs**: `Gres=gpu:2` per node, `gres.conf` with `AutoDetect=off` and
//!   `File=DIR/nX/nvidia[0-1]`. The files are character devices (`mknod F c 1 3`): Slurm
//!   rejects regular files, and jobs then silently get no `CUDA_VISIBLE_DEVICES`.
//! - **`SlurmctldHost=$(hostname -s)(127.0.0.1)`**, fixed ports away from the defaults
//!   (6817/6818): 46817 for `slurmctld`, 46818 and 46819 for the nodes (`LADLE_SLURM_INSTANCE=N`
//!   adds `10 × N`, for a second harness on the same machine). Absolute paths everywhere: a
//!   relative config path kills `slurmctld` once it has changed to `/`.
//! - **`ReturnToService=1`, not 2**: with 2, a node set down by `scontrol update
//!   state=down` is back in service within a second (as soon as its `slurmd` answers a
//!   ping); with 1 it stays down until `state=resume`, as on a real site.
//! - **`EnforcePartLimits=ALL`**: a job asking for more nodes, CPUs or GPUs than the partition
//!   has is refused by `sbatch`/`srun` at submission ("Node count specification invalid"), as
//!   most sites configure it. With Slurm's default (`NO`) such a job is accepted and pends for
//!   ever with reason `PartitionNodeLimit`.
//! - **Short timeouts** (`SlurmdTimeout=30`, `MessageTimeout=10`, `KillWait=5`, scheduling
//!   every 2 s), and every command this module runs is bounded ([`Cluster::run`]): `srun`
//!   blocks for ever when the nodes it needs are down.
//! - **A private munge**: its own key (0400, owner `munge`), socket, pid and seed files under
//!   the cluster's directory (`AuthInfo=socket=...`), started as the `munge` user; a system
//!   `munged` is neither needed nor disturbed.
//! - Commands run with every inherited `SLURM_*` variable removed and `SLURM_CONF` set
//!   ([`Cluster::command`]): a test binary that itself runs inside a Slurm job does not leak
//!   its job into this cluster. Jobs run as root, in the shared submit directory
//!   ([`Cluster::submit_dir`]); under `sbatch`, `$0` is Slurm's spool copy of the script: use
//!   `$SLURM_SUBMIT_DIR`. `srun` inside a batch script inherits `SLURM_NTASKS`: pass
//!   `-n "$SLURM_NNODES"` explicitly.
//!
//! ## Nothing left behind
//! Every daemon runs in the foreground as a child of the test process, in its own process
//! group, with `SLURM_CONF=DIR/slurm.conf` in its environment; Slurm passes that variable on to
//! `slurmstepd` and to every process of every job (even with `--export=NONE`). A process "of
//! the cluster" is one with that variable or with the cluster's directory on its command line
//! ([`processes_of`]). Three mechanisms stop them:
//! 1. at normal exit of the test binary, also after a failed test (libtest calls `exit`), an
//!    `atexit` handler cancels the queued jobs (bounded), then has the watchdog below kill every
//!    process of the cluster and remove the directory, and waits for it: when the binary has
//!    exited, nothing is left;
//! 2. a watchdog, a small `sh` in its own process group that ignores SIGHUP/SIGINT/SIGTERM,
//!    blocks reading a pipe whose only writer is the test process: when the test process dies
//!    in any way (SIGKILL, Ctrl-C), the read returns and the watchdog does the same cleanup;
//! 3. the next harness of the same instance (serialised by `flock` on
//!    `/tmp/ladle-slurm-harness-N.lock`, which the kernel releases with its holder) first cleans
//!    up after the directory named in `/tmp/ladle-slurm-harness-N.state`, if a previous binary
//!    left it.
//!
//! A process that clears its environment and double-forks away from its step escapes all
//! three (and `proctrack/linuxproc` too, unlike a real site's `proctrack/cgroup`): tests check
//! that ladle leaves nothing with [`Cluster::job_processes`].
//!
//! ## Example
//! ```no_run
//! use std::time::Duration;
//!
//! use ladle_tests::slurm::Cluster;
//!
//! let Some(cluster) = Cluster::shared() else { return Ok(()) }; // said why on stderr
//! let _serial = cluster.lock();
//! let job = cluster.sbatch(&["--nodes=2", "--gres=gpu:2"], "srun -n 2 hostname")?;
//! assert_eq!(cluster.wait_job_end(job, Duration::from_secs(60))?, "COMPLETED");
//! # Ok::<(), ladle_tests::slurm::SlurmError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use ladle_os::{Proc, ProcError, Signal};

use crate::Finished;

mod commands;
mod files;
mod up;

pub use commands::processes_of;
use commands::*;
use files::*;
use up::*;

/// The nodes' names, in order.
pub const NODES: [&str; 2] = ["n1", "n2"];
/// Fake GPUs per node (`Gres=gpu:2`).
pub const GPUS_PER_NODE: u32 = 2;
/// CPUs each node declares.
pub const CPUS_PER_NODE: u32 = 2;
/// The partition holding both nodes (the default one).
pub const PARTITION: &str = "main";
/// A bound for one quick Slurm command (`sbatch`, `scontrol`, `squeue`): a deadlock guard.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// `slurmctld`'s port for instance 0; the nodes use the next two.
const BASE_PORT: u16 = 46817;
/// How long the daemons get to bring both nodes to `idle`.
const UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long to wait for another test binary's cluster of the same instance to stop.
const INSTANCE_LOCK_TIMEOUT: Duration = Duration::from_secs(900);
/// How often waits look again.
const POLL: Duration = Duration::from_millis(100);
/// What a finished job's `JobState` can be.
const FINAL_STATES: [&str; 9] = [
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
];

/// Why a Slurm command or the cluster's set-up failed. Each variant names the command line
/// and carries what it printed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SlurmError {
    /// The program could not be started.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: ProcError,
    },
    /// The command ran past its bound; it was stopped (SIGTERM to its process group, then
    /// SIGKILL).
    #[error(
        "`{command}` did not finish within {timeout:?} and was stopped; stdout: {stdout:?}; stderr: {stderr:?}"
    )]
    Timeout {
        /// The command line.
        command: String,
        /// The bound it had.
        timeout: Duration,
        /// What it printed on stdout before it was stopped.
        stdout: String,
        /// What it printed on stderr before it was stopped.
        stderr: String,
    },
    /// The command exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// Its stdout.
        stdout: String,
        /// Its stderr.
        stderr: String,
    },
    /// The command succeeded but printed something this module cannot read.
    #[error("`{command}` printed something unexpected: {stdout:?}")]
    Unexpected {
        /// The command line.
        command: String,
        /// What it printed.
        stdout: String,
    },
    /// Something awaited did not happen in time.
    #[error("{what} did not happen within {timeout:?}: {detail}")]
    Deadline {
        /// What was awaited.
        what: String,
        /// The bound.
        timeout: Duration,
        /// The last state seen.
        detail: String,
    },
    /// The cluster cannot be set up: Slurm or munge missing, not root, a port taken, a file
    /// that cannot be written, a daemon that died at start (with its log).
    #[error("{0}")]
    Setup(String),
}

/// A Slurm job id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u32);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The running cluster (see the module docs). Obtain it with [`Cluster::shared`].
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    submit: PathBuf,
    daemon_pids: Vec<u32>,
    serial: Mutex<()>,
    scripts: AtomicU32,
}

/// What must be stopped at exit: the daemons (children of this process) and the watchdog.
struct Running {
    dir: PathBuf,
    conf: PathBuf,
    state_file: PathBuf,
    daemons: Vec<(String, Child)>,
    watchdog: Option<(Child, ChildStdin)>,
}

/// The cluster of this process, once started: taken by the `atexit` handler.
static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

impl Cluster {
    /// The test binary's cluster, started on first use (about a second) and stopped when the
    /// process exits; `None`, after saying why on stderr, when it cannot run here (the
    /// caller skips). With `LADLE_REQUIRE_SLURM=1` that is a panic instead.
    pub fn shared() -> Option<&'static Cluster> {
        static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
        match SHARED.get_or_init(|| Cluster::start().map_err(|e| e.to_string())) {
            Ok(cluster) => Some(cluster),
            Err(why) => {
                assert!(
                    std::env::var_os("LADLE_REQUIRE_SLURM").is_none_or(|v| v != "1"),
                    "LADLE_REQUIRE_SLURM=1 but the Slurm cluster is unavailable: {why}"
                );
                eprintln!("skipping the Slurm tests: {why}");
                None
            }
        }
    }

    /// Serialises the tests that use the cluster, and gives the caller an idle cluster:
    /// jobs left by an earlier test are cancelled and gone, and nodes left down or drained are
    /// resumed. Hold the guard for the whole test. A test that panicked while holding it
    /// does not block the others.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        let guard = self.serial.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = self.reset() {
            panic!(
                "cannot bring the Slurm cluster back to idle: {e}\n{}",
                self.logs()
            );
        }
        guard
    }

    /// The cluster's directory (configuration, logs, spool, submit and node-local dirs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `slurm.conf` every command and daemon uses (`SLURM_CONF`).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The submit directory, shared by both nodes (as a site's network file system would
    /// be): commands from [`Cluster::command`] run in it, and jobs see it as
    /// `SLURM_SUBMIT_DIR`.
    pub fn submit_dir(&self) -> &Path {
        &self.submit
    }

    /// The root of the node-local directories: `local_root()/$SLURMD_NODENAME` is a job's
    /// node-local directory.
    pub fn local_root(&self) -> PathBuf {
        self.dir.join("local")
    }

    /// Node `node`'s local directory (exists for both nodes).
    pub fn local_dir(&self, node: &str) -> PathBuf {
        self.local_root().join(node)
    }

    /// The nodes' names: `n1`, `n2`.
    pub fn node_names(&self) -> Vec<String> {
        NODES.iter().map(|n| (*n).to_owned()).collect()
    }

    /// The environment a Slurm client needs for this cluster: `SLURM_CONF`. (Inherited
    /// `SLURM_*` variables should go too: [`Cluster::command`] removes them.)
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("SLURM_CONF".to_owned(), self.conf.display().to_string())]
    }

    /// `program` set up for this cluster: `SLURM_CONF` set, every other inherited `SLURM_*`
    /// variable removed, run in the submit directory. Bound what it does: see
    /// [`Cluster::run`].
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SLURM_") {
                command.env_remove(key);
            }
        }
        command
            .env("SLURM_CONF", &self.conf)
            .current_dir(&self.submit);
        command
    }

    /// Runs `program ARGS` (from [`Cluster::command`]) to its end, whatever its exit status;
    /// stopped after `timeout`.
    ///
    /// # Errors
    /// [`SlurmError::Spawn`], [`SlurmError::Timeout`].
    pub fn run(
        &self,
        program: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<Finished, SlurmError> {
        let mut command = self.command(program);
        command.args(args);
        run_bounded(&mut command, timeout)
    }

    /// [`Cluster::run`] that must succeed; returns its stdout.
    ///
    /// # Errors
    /// As [`Cluster::run`], and [`SlurmError::Failed`] on a non-zero exit.
    pub fn run_ok(
        &self,
        program: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<String, SlurmError> {
        let done = self.run(program, args, timeout)?;
        if done.status.success() {
            Ok(done.stdout)
        } else {
            Err(SlurmError::Failed {
                command: command_line(program, args),
                status: done.status,
                stdout: done.stdout,
                stderr: done.stderr,
            })
        }
    }

    /// Submits `script` with `sbatch ARGS` from the submit directory; `#!/bin/sh` is put in
    /// front of a script that has no `#!` line. The default output file is
    /// [`Cluster::default_output`].
    ///
    /// # Errors
    /// As [`Cluster::run_ok`] (with Slurm's refusal in [`SlurmError::Failed`]'s `stderr`),
    /// [`SlurmError::Setup`] when the script cannot be written, [`SlurmError::Unexpected`]
    /// when `sbatch` does not print "Submitted batch job N".
    pub fn sbatch(&self, args: &[&str], script: &str) -> Result<JobId, SlurmError> {
        let n = self.scripts.fetch_add(1, Ordering::Relaxed);
        let path = self.submit.join(format!("job-{n}.sh"));
        let text = if script.starts_with("#!") {
            script.to_owned()
        } else {
            format!("#!/bin/sh\n{script}\n")
        };
        write_file(&path, text.as_bytes(), 0o755)?;
        let path = path.display().to_string();
        let args = [args, &[path.as_str()]].concat();
        let stdout = self.run_ok("sbatch", &args, COMMAND_TIMEOUT)?;
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("Submitted batch job "))
            .and_then(|id| id.trim().parse().ok())
            .map(JobId)
            .ok_or_else(|| SlurmError::Unexpected {
                command: command_line("sbatch", &args),
                stdout,
            })
    }

    /// Where `sbatch` writes a job's output when not told otherwise: `slurm-ID.out` in the
    /// submit directory.
    pub fn default_output(&self, job: JobId) -> PathBuf {
        self.submit.join(format!("slurm-{job}.out"))
    }

    /// The fields of `scontrol show job -o ID` (`JobState`, `NodeList`, `NumNodes`,
    /// `ExitCode`, `Reason`, ...); `None` once Slurm has forgotten the job (or never knew
    /// it).
    ///
    /// # Errors
    /// As [`Cluster::run_ok`].
    pub fn job_fields(&self, job: JobId) -> Result<Option<BTreeMap<String, String>>, SlurmError> {
        let id = job.to_string();
        let args = ["show", "job", "-o", id.as_str()];
        let done = self.run("scontrol", &args, COMMAND_TIMEOUT)?;
        if !done.status.success() {
            if done.stderr.contains("Invalid job id") {
                return Ok(None);
            }
            return Err(SlurmError::Failed {
                command: command_line("scontrol", &args),
                status: done.status,
                stdout: done.stdout,
                stderr: done.stderr,
            });
        }
        Ok(Some(parse_fields(done.stdout.trim())))
    }

    /// A job's `JobState` (`PENDING`, `RUNNING`, `COMPLETING`, `COMPLETED`, `CANCELLED`,
    /// `NODE_FAIL`, ...); `None` once Slurm has forgotten it.
    ///
    /// # Errors
    /// As [`Cluster::run_ok`].
    pub fn job_state(&self, job: JobId) -> Result<Option<String>, SlurmError> {
        Ok(self.job_fields(job)?.and_then(|mut f| f.remove("JobState")))
    }

    /// Waits until a job has reached a final state and returns it (`COMPLETED`, `FAILED`,
    /// `CANCELLED`, `NODE_FAIL`, `TIMEOUT`, ...).
    ///
    /// # Errors
    /// [`SlurmError::Deadline`] after `timeout`, [`SlurmError::Unexpected`] when Slurm forgot
    /// the job before it was seen finished, and as [`Cluster::run_ok`].
    pub fn wait_job_end(&self, job: JobId, timeout: Duration) -> Result<String, SlurmError> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.job_state(job)?.ok_or_else(|| SlurmError::Unexpected {
                command: format!("scontrol show job -o {job}"),
                stdout: format!("job {job} is unknown"),
            })?;
            if FINAL_STATES.contains(&state.as_str()) {
                return Ok(state);
            }
            if Instant::now() >= deadline {
                return Err(SlurmError::Deadline {
                    what: format!("the end of job {job}"),
                    timeout,
                    detail: format!("it is {state}"),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until `job` is `RUNNING` (or already over); returns its state then.
    ///
    /// # Errors
    /// As [`Cluster::wait_job_end`].
    pub fn wait_job_start(&self, job: JobId, timeout: Duration) -> Result<String, SlurmError> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.job_state(job)?.unwrap_or_default();
            if state == "RUNNING" || FINAL_STATES.contains(&state.as_str()) {
                return Ok(state);
            }
            if Instant::now() >= deadline {
                return Err(SlurmError::Deadline {
                    what: format!("the start of job {job}"),
                    timeout,
                    detail: format!("it is {state:?}"),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// The ids of every job Slurm knows that has not finished (pending, running,
    /// completing).
    ///
    /// # Errors
    /// As [`Cluster::run_ok`].
    pub fn active_jobs(&self) -> Result<Vec<JobId>, SlurmError> {
        let out = self.run_ok("squeue", &["-h", "-o", "%i"], COMMAND_TIMEOUT)?;
        Ok(out
            .split_whitespace()
            .filter_map(|id| id.parse().ok())
            .map(JobId)
            .collect())
    }

    /// Each node's short state as `sinfo -N -o %t` prints it: `idle`, `alloc`, `mix`,
    /// `comp`, `down`, `drain`; a trailing `*` means not responding.
    ///
    /// # Errors
    /// As [`Cluster::run_ok`], [`SlurmError::Unexpected`] for a line it cannot read.
    pub fn node_states(&self) -> Result<BTreeMap<String, String>, SlurmError> {
        node_states(&self.conf, &self.submit)
    }

    /// `scontrol update nodename=NODE state=STATE [reason=REASON]` (`down` and `drain` need
    /// a reason; `resume` takes none: pass "").
    ///
    /// # Errors
    /// As [`Cluster::run_ok`].
    pub fn set_node_state(&self, node: &str, state: &str, reason: &str) -> Result<(), SlurmError> {
        let mut args = vec![
            "update".to_owned(),
            format!("nodename={node}"),
            format!("state={state}"),
        ];
        if !reason.is_empty() {
            args.push(format!("reason={reason}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_ok("scontrol", &args, COMMAND_TIMEOUT).map(drop)
    }

    /// Waits until every node's state satisfies `ok`; returns the states then.
    ///
    /// # Errors
    /// [`SlurmError::Deadline`] after `timeout`, and as [`Cluster::node_states`].
    pub fn wait_nodes(
        &self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&str, &str) -> bool,
    ) -> Result<BTreeMap<String, String>, SlurmError> {
        let deadline = Instant::now() + timeout;
        loop {
            let states = self.node_states()?;
            if states.len() == NODES.len() && states.iter().all(|(n, s)| ok(n, s)) {
                return Ok(states);
            }
            if Instant::now() >= deadline {
                return Err(SlurmError::Deadline {
                    what: what.to_owned(),
                    timeout,
                    detail: format!("nodes are {states:?}"),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Every live process of this cluster's jobs: those [`processes_of`] finds, less the
    /// daemons (`munged`, `slurmctld` and its `slurmscriptd`, the `slurmd`s). `slurmstepd`s
    /// count: they belong to jobs. `(pid, command line)`.
    pub fn job_processes(&self) -> Vec<(u32, String)> {
        processes_of(&self.dir)
            .into_iter()
            .filter(|(pid, cmdline)| {
                !self.daemon_pids.contains(pid) && !cmdline.contains("slurmscriptd")
            })
            .collect()
    }

    /// The last lines of the daemons' logs, to explain a failure.
    pub fn logs(&self) -> String {
        daemon_logs(&self.dir)
    }

    /// Cancels every job, waits for the queue to empty, resumes down or drained nodes and
    /// waits for all to be idle.
    fn reset(&self) -> Result<(), SlurmError> {
        cancel_all(&self.conf, &self.submit, Duration::from_secs(60))?;
        for (node, state) in self.node_states()? {
            let state = state.trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-']);
            if ["down", "drain", "drng", "drained", "fail", "failg"].contains(&state) {
                self.set_node_state(&node, "resume", "")?;
            }
        }
        self.wait_nodes("both nodes idle", UP_TIMEOUT, |_, s| s == "idle")
            .map(drop)
    }

    /// Sets up and starts the cluster (see the module docs).
    fn start() -> Result<Cluster, SlurmError> {
        if !rustix::process::geteuid().is_root() {
            return Err(setup(
                "the Slurm tests need root (slurmd runs jobs as root here, munged as munge)",
            ));
        }
        for program in [
            "slurmctld",
            "slurmd",
            "sinfo",
            "squeue",
            "sbatch",
            "srun",
            "scontrol",
            "scancel",
            "munged",
            "mknod",
        ] {
            if find_program(program).is_none() {
                return Err(setup(format!(
                    "{program} not installed (scripts/check installs Debian's slurmctld slurmd \
                     slurm-client munge)"
                )));
            }
        }
        let (munge_uid, munge_gid) = munge_ids()?;
        let instance = instance()?;
        hold_instance_lock(instance)?;
        let state_file = PathBuf::from(format!("/tmp/ladle-slurm-harness-{instance}.state"));
        // A previous binary of this instance that died without cleaning up (its watchdog
        // normally has, but it may have been killed too).
        if let Ok(old) = fs::read_to_string(&state_file) {
            let old = old.trim();
            if !old.is_empty() {
                sweep(Path::new(old), &state_file)?;
            }
        }
        let ports = [0, 1, 2].map(|i| BASE_PORT + 10 * instance + i);
        for port in ports {
            if std::net::TcpListener::bind(("0.0.0.0", port)).is_err() {
                return Err(setup(format!(
                    "port {port} is taken (another Slurm on this machine? \
                     LADLE_SLURM_INSTANCE=N moves the harness to ports {BASE_PORT}+10N...)"
                )));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("ladle-slurm-{instance}-"))
            .tempdir()
            .map_err(|e| setup(format!("cannot create a temporary directory: {e}")))?
            .keep();
        write_file(&state_file, dir.display().to_string().as_bytes(), 0o644)?;
        let conf = dir.join("slurm.conf");
        let watchdog = spawn_watchdog(&dir, &state_file)?;
        register_stop_at_exit();
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        *running = Some(Running {
            dir: dir.clone(),
            conf: conf.clone(),
            state_file,
            daemons: Vec::new(),
            watchdog: Some(watchdog),
        });
        let Some(started) = running.as_mut() else {
            unreachable!("set just above")
        };
        let up = bring_up(started, ports, munge_uid, munge_gid);
        let daemon_pids = started.daemons.iter().map(|(_, c)| c.id()).collect();
        if let Err(e) = up {
            let logs = daemon_logs(&started.dir);
            started.stop();
            *running = None;
            return Err(setup(format!(
                "the Slurm cluster did not come up: {e}\n{logs}"
            )));
        }
        Ok(Cluster {
            submit: dir.join("submit"),
            dir,
            conf,
            daemon_pids,
            serial: Mutex::new(()),
            scripts: AtomicU32::new(0),
        })
    }
}

/// Stops the cluster when the process exits (registered once, with `atexit`).
extern "C" fn stop_at_exit() {
    // A panic must not unwind out of an `extern "C"` function.
    let _ = std::panic::catch_unwind(|| {
        let mut running = match RUNNING.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            // Exiting in the middle of start-up: the watchdog cleans up once we are gone.
            Err(TryLockError::WouldBlock) => return,
        };
        if let Some(mut cluster) = running.take() {
            cluster.stop();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scontrol_one_line_output_is_read_into_fields_including_values_with_spaces() {
        let f = parse_fields(
            "JobId=5 JobName=my job UserId=root(0) JobState=RUNNING Reason=None \
             ReqB:S:C:T=0:0:*:* NodeList=n[1-2] Command=/tmp/x/job-0.sh",
        );
        assert_eq!(f["JobId"], "5");
        assert_eq!(f["JobName"], "my job");
        assert_eq!(f["JobState"], "RUNNING");
        assert_eq!(f["ReqB:S:C:T"], "0:0:*:*");
        assert_eq!(f["NodeList"], "n[1-2]");
        assert_eq!(f["Command"], "/tmp/x/job-0.sh");
    }

    #[test]
    fn a_command_line_quotes_arguments_with_spaces() {
        assert_eq!(
            command_line("srun", &["-N2", "sh", "-c", "echo a b"]),
            "srun -N2 sh -c 'echo a b'"
        );
    }
}
