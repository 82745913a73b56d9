//! A sweep over a Slurm allocation: the batch script, what a node's sweep reads from the
//! allocation, and the calls to `sbatch`, `scontrol` and `scancel`.
//!
//! Pilot per node: one Slurm job holds N whole nodes; its batch script starts one task per
//! node with `srun` (`-n $SLURM_NNODES --ntasks-per-node=1` explicitly: `srun` inside a
//! batch script inherits `SLURM_NTASKS`), each a `ladle sweep --slurm-node` that runs shard
//! `SLURM_NODEID/SLURM_NNODES` of the grid with one feed and one private scheduler over the
//! node's allocated GPUs; then the script merges the nodes' reports. Node-local state
//! (sockets, the scheduler's journal, MPS pipes) lives under [`NodeEnv::local_dir`], never on
//! the shared file system (a Unix socket on NFS does not work); logs and reports go to the
//! sweep directory under the submit directory, one folder per node ([`node_dir`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::SweepError;
use crate::grid::{PlannedRun, Shard};

/// The sweep directory's manifest: what `--slurm` submitted, for `--resume` and the merge.
pub const MANIFEST: &str = "sweep.json";
/// The batch script's file in the sweep directory.
pub const SCRIPT: &str = "sweep.sbatch";

/// Longest path a Unix socket may have (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The longest socket path under a node's local directory: the private scheduler's MPS
/// control pipe (`scheduler/mps/pipe/control`); the feed's and scheduler's are shorter.
const LONGEST_SOCKET_SUFFIX: &str = "scheduler/mps/pipe/control";

/// A node's directory under the sweep directory.
pub fn node_dir(sweep: &Path, node: &str) -> PathBuf {
    sweep.join(format!("node-{node}"))
}

/// The directory node `node` of Slurm job `job_id` writes under the sweep directory: its
/// ledger, report and the runs' logs. `node-NODE` for the sweep's first job (and for the same
/// job requeued); a later job (`--resume`, or a script submitted again by hand) writes beside
/// it, in `node-NODE.2`, `.3`, ..., so that nothing an earlier job wrote is overwritten or
/// appended to: each job's scheduler numbers its runs from 1 again.
pub fn node_job_dir(sweep: &Path, node: &str, job_id: &str) -> PathBuf {
    let first = node_dir(sweep, node);
    let free = |dir: &Path| {
        let path = dir.join(crate::ledger::NODE);
        match std::fs::read_to_string(&path) {
            Err(_) => true,
            Ok(text) => serde_json::from_str::<crate::ledger::NodeStart>(&text)
                .is_ok_and(|start| start.job_id.as_deref() == Some(job_id)),
        }
    };
    std::iter::once(first)
        .chain((2u32..10_000).map(|k| sweep.join(format!("node-{node}.{k}"))))
        .find(|dir| free(dir))
        .unwrap_or_else(|| sweep.join(format!("node-{node}.job-{job_id}")))
}

/// Where a node of a Slurm sweep records (`--record DIR`): its own recording,
/// `DIR/node-NODE`, since each node has its own feed, scheduler, GPUs and clock; a requeued
/// or resumed job's node records beside the earlier one, in `DIR/node-NODE.2`, `.3`, ...
pub fn node_record_dir(record: &Path, node: &str) -> PathBuf {
    let first = node_dir(record, node);
    let taken = |dir: &Path| dir.join(ladle_observe::record::META).exists();
    if !taken(&first) {
        return first;
    }
    (2u32..)
        .map(|k| record.join(format!("node-{node}.{k}")))
        .find(|dir| !taken(dir))
        .unwrap_or(first)
}

/// The per-node recordings ([`node_record_dir`]'s `node-NAME[.K]` holding a recording) of a
/// Slurm sweep's `--record DIR`, by name; empty when `dir` is itself a recording.
pub fn node_recordings(dir: &Path) -> Vec<(String, PathBuf)> {
    if dir.join(ladle_observe::record::META).exists() {
        return Vec::new();
    }
    let mut nodes: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            (name.starts_with("node-") && path.join(ladle_observe::record::META).exists())
                .then_some((name, path))
        })
        .collect();
    nodes.sort();
    nodes
}

/// What a node's sweep reads from Slurm's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEnv {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// `SLURMD_NODENAME`: the node's name as Slurm knows it (never `hostname`, which two
    /// nodes may share).
    pub node: String,
    /// `SLURM_NODEID` of `SLURM_NNODES`: this node's shard.
    pub shard: Shard,
    /// `TMPDIR`, else `/tmp`: where node-local state goes.
    pub tmpdir: PathBuf,
}

impl NodeEnv {
    /// Reads the node's environment through `get` (`std::env::var` in the binary).
    ///
    /// # Errors
    /// [`SweepError::NotInSlurm`] naming the missing variable; [`SweepError::Grid`] for a
    /// node id that is not below the node count.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, SweepError> {
        let need = |name: &'static str| {
            get(name)
                .filter(|v| !v.trim().is_empty())
                .ok_or(SweepError::NotInSlurm(name))
        };
        let number = |name: &'static str| -> Result<u32, SweepError> {
            let value = need(name)?;
            value
                .trim()
                .parse()
                .map_err(|_| SweepError::Grid(format!("${name}={value:?} is not a node number")))
        };
        Ok(Self {
            job_id: need("SLURM_JOB_ID")?,
            node: need("SLURMD_NODENAME")?,
            shard: Shard::new(number("SLURM_NODEID")?, number("SLURM_NNODES")?)?,
            tmpdir: get("TMPDIR")
                .filter(|t| !t.is_empty())
                .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from),
        })
    }

    /// The node-local directory of this job on this node: `$TMPDIR/ladle-JOBID-NODE` (two
    /// nodes of one machine share `TMPDIR`, so the node's name is in it).
    ///
    /// # Errors
    /// [`SweepError::Place`] when a socket under it would pass [`MAX_SOCKET_PATH`].
    pub fn local_dir(&self) -> Result<PathBuf, SweepError> {
        let dir = self
            .tmpdir
            .join(format!("ladle-{}-{}", self.job_id, self.node));
        check_socket_dir(&dir)?;
        Ok(dir)
    }
}

impl NodeEnv {
    /// Removes what earlier jobs' sweeps left on this node (`$TMPDIR/ladle-*-NODE`, other
    /// than this job's): a node that failed or a sweep killed with SIGKILL cannot clean up
    /// after itself. A directory counts as left only when its scheduler's lock file exists
    /// and no process holds it (a live sweep's private scheduler holds it while it runs).
    /// Returns the directories removed; one that cannot be removed is logged.
    pub fn remove_stale_local_dirs(&self) -> Vec<PathBuf> {
        let suffix = format!("-{}", self.node);
        let ours = format!("ladle-{}-{}", self.job_id, self.node);
        let Ok(entries) = std::fs::read_dir(&self.tmpdir) else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("ladle-") || !name.ends_with(&suffix) || name == ours {
                continue;
            }
            let dir = entry.path();
            let lock = dir.join("scheduler").join("lock");
            if !lock.exists() {
                continue;
            }
            match ladle_scheduler::sys::lock_file(&lock) {
                Ok(Some(_held)) => match std::fs::remove_dir_all(&dir) {
                    Ok(()) => removed.push(dir),
                    Err(e) => tracing::warn!("cannot remove {}: {e}", dir.display()),
                },
                Ok(None) => {} // a live sweep's
                Err(e) => tracing::warn!("cannot check {}: {e}", lock.display()),
            }
        }
        removed
    }
}

/// Checks that every socket ladle makes under `dir` fits a Unix socket's path.
///
/// # Errors
/// [`SweepError::Place`] naming the longest socket path and the limit.
pub fn check_socket_dir(dir: &Path) -> Result<(), SweepError> {
    let longest = dir.join(LONGEST_SOCKET_SUFFIX);
    let len = longest.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(SweepError::Place(format!(
            "{} would be {len} bytes long, past the {MAX_SOCKET_PATH} a Unix socket's path may \
             have: set TMPDIR to a shorter node-local directory",
            longest.display()
        )));
    }
    Ok(())
}

/// How each node asks for GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuRequest {
    /// `--gres=gpu:G`: G GPUs on every node.
    PerNode(u32),
    /// `--gres=SPEC` as given (e.g. `gpu:a100:4`).
    Gres(String),
    /// No GPU request: for `--gpu sim` sweeps, whose nodes simulate their own. A sweep on
    /// real GPUs needs them granted (`--gpus-per-node`/`--gres`): its nodes use only what
    /// Slurm gave them and refuse to start, naming the job, when it gave none.
    None,
}

/// What the batch script runs: everything [`script`] needs, kept in the manifest so that
/// `--resume` can write it again for the runs left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptSpec {
    /// The `ladle` binary the nodes run (absolute: the script runs from Slurm's spool).
    pub ladle: PathBuf,
    /// The sweep directory, absolute, on the shared file system.
    pub sweep: PathBuf,
    /// The runs' working directory, absolute.
    pub cwd: PathBuf,
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus: GpuRequest,
    /// More `#SBATCH` lines, as given (`--partition=gpu`, `--time=2:00:00`, …).
    pub slurm_args: Vec<String>,
    /// The node sweep's options (feed, scheduler, observe) as given to `ladle sweep`.
    pub node_args: Vec<String>,
    /// The runs' command, with its `{a,b}` groups unexpanded.
    pub command: Vec<String>,
    /// Only these runs (`--resume`); empty: all.
    pub only: Vec<String>,
}

/// `arg` quoted for bash: as is when it holds only characters the shell leaves alone, else
/// in single quotes (braces too: bash would expand `{a,b}` itself).
pub fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./=:,+@%^".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn quote_path(path: &Path) -> String {
    quote(&path.display().to_string())
}

/// The batch script: readable, commented, and fit to be edited and submitted by hand.
pub fn script(spec: &ScriptSpec) -> String {
    let mut s = String::new();
    let sweep = quote_path(&spec.sweep);
    s.push_str("#!/bin/bash\n");
    s.push_str("# A ladle sweep over a Slurm allocation, written by `ladle sweep --slurm`.\n");
    s.push_str("# Submit it with `sbatch` (edit it first if you like): the #SBATCH lines are\n");
    s.push_str("# Slurm's; the rest runs on the allocation's first node.\n");
    s.push_str("#\n");
    s.push_str("# One `ladle sweep --slurm-node` per node decodes the dataset once for that\n");
    s.push_str("# node's runs (shard SLURM_NODEID/SLURM_NNODES of the grid) and packs them onto\n");
    s.push_str("# the GPUs Slurm gave that node, under its own scheduler. Sockets and scheduler\n");
    s.push_str("# state stay node-local (${TMPDIR:-/tmp}/ladle-JOBID-NODE); logs and reports go\n");
    s.push_str("# to the sweep directory (SWEEP below), one folder per node. Runs that already\n");
    s.push_str("# succeeded there are not run again (a requeued job, a resumed sweep).\n");
    s.push_str("#SBATCH --job-name=ladle-sweep\n");
    s.push_str(&format!("#SBATCH --nodes={}\n", spec.nodes));
    s.push_str("#SBATCH --ntasks-per-node=1\n");
    s.push_str("#SBATCH --exclusive\n");
    match &spec.gpus {
        GpuRequest::PerNode(g) => s.push_str(&format!("#SBATCH --gres=gpu:{g}\n")),
        GpuRequest::Gres(spec) => s.push_str(&format!("#SBATCH --gres={spec}\n")),
        GpuRequest::None => {}
    }
    s.push_str("# A node that fails does not end the job: the others go on, the lost runs are\n");
    s.push_str("# reported and `ladle sweep --slurm --resume SWEEP` runs them again.\n");
    s.push_str("#SBATCH --no-kill\n");
    s.push_str(&format!(
        "#SBATCH --output={}\n",
        quote_path(&spec.sweep.join("slurm-%j.out"))
    ));
    s.push_str(&format!("#SBATCH --chdir={}\n", quote_path(&spec.cwd)));
    for arg in &spec.slurm_args {
        s.push_str(&format!("#SBATCH {arg}\n"));
    }
    s.push('\n');
    s.push_str(&format!("LADLE={}\n", quote_path(&spec.ladle)));
    s.push_str(&format!("SWEEP={sweep}\n\n"));
    s.push_str(
        "# One task per node; -n and --ntasks-per-node are explicit because srun inherits\n",
    );
    s.push_str("# SLURM_NTASKS from the batch step.\n");
    s.push_str("srun -n \"$SLURM_NNODES\" --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 \\\n");
    s.push_str("    \"$LADLE\" sweep --slurm-node --out \"$SWEEP\"");
    let mut line = String::new();
    for arg in &spec.node_args {
        line.push(' ');
        line.push_str(&quote(arg));
    }
    if !spec.only.is_empty() {
        line.push_str(&format!(" --only {}", spec.only.join(",")));
    }
    if !line.is_empty() {
        s.push_str(" \\\n   ");
        s.push_str(&line);
    }
    s.push_str(" \\\n    --");
    for arg in &spec.command {
        s.push(' ');
        s.push_str(&quote(arg));
    }
    s.push_str("\nstatus=$?\n\n");
    s.push_str("# Merge the nodes' reports (a lost node's runs too) into $SWEEP/report.json.\n");
    s.push_str("\"$LADLE\" report --merge \"$SWEEP\" || status=1\n");
    s.push_str("exit $status\n");
    s
}

/// What `--slurm` submitted, kept in the sweep directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The whole grid, named.
    pub runs: Vec<PlannedRun>,
    /// The script's inputs.
    pub script: ScriptSpec,
    /// The Slurm jobs submitted for this sweep, oldest first.
    pub jobs: Vec<String>,
}

impl Manifest {
    /// Reads `SWEEP/sweep.json`.
    ///
    /// # Errors
    /// [`SweepError::Io`] or [`SweepError::Malformed`] naming the file.
    pub fn read(sweep: &Path) -> Result<Self, SweepError> {
        let path = sweep.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|source| SweepError::Io {
            what: "reading the sweep's manifest (is this a `ladle sweep --slurm` directory?)",
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| SweepError::Malformed {
            path,
            detail: e.to_string(),
        })
    }

    /// Writes `SWEEP/sweep.json`.
    ///
    /// # Errors
    /// [`SweepError::Io`] naming the file.
    pub fn write(&self, sweep: &Path) -> Result<(), SweepError> {
        let path = sweep.join(MANIFEST);
        let text = serde_json::to_string_pretty(self).unwrap_or_default() + "\n";
        std::fs::write(&path, text).map_err(|source| SweepError::Io {
            what: "writing",
            path,
            source,
        })
    }
}

/// Runs a Slurm command with a deadline (an `srun` or `sbatch` can block for ever on nodes
/// that are down); returns its stdout.
///
/// # Errors
/// [`SweepError::Slurm`] with the command and what it said, or that it was not found or
/// timed out.
pub fn run_command(command: &mut Command, timeout: Duration) -> Result<String, SweepError> {
    let shown = format!("{command:?}").replace('"', "");
    let fail = |detail: String| SweepError::Slurm {
        command: shown.clone(),
        detail,
    };
    let program = command.get_program().to_string_lossy().into_owned();
    let mut proc = ladle_os::Proc::spawn(program.clone(), command).map_err(|e| {
        fail(format!(
            "cannot run {program} ({e}): is Slurm's client (slurm-client) installed and on PATH?"
        ))
    })?;
    let status = proc
        .wait_timeout(timeout)
        .map_err(|e| fail(format!("no answer in {} s: {e}", timeout.as_secs())))?;
    let out = proc.output().map_err(|e| fail(e.to_string()))?;
    if !status.success() {
        let said = out.stderr.trim();
        return Err(fail(if said.is_empty() {
            format!("failed with {status}")
        } else {
            said.to_owned()
        }));
    }
    Ok(out.stdout)
}

/// How long a Slurm client command may take.
pub const SLURM_TIMEOUT: Duration = Duration::from_secs(60);

/// Submits `script` with `sbatch --parsable`; returns the job id.
///
/// # Errors
/// [`SweepError::Slurm`] with what `sbatch` said (e.g. a node count no partition has).
pub fn submit(script: &Path, extra: &[&str]) -> Result<String, SweepError> {
    let out = run_command(
        Command::new("sbatch")
            .arg("--parsable")
            .args(extra)
            .arg(script),
        SLURM_TIMEOUT,
    )?;
    let id = out.trim().split(';').next().unwrap_or("").trim().to_owned();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return Err(SweepError::Slurm {
            command: format!("sbatch --parsable {}", script.display()),
            detail: format!("answered {out:?}, not a job id"),
        });
    }
    Ok(id)
}

/// A job as `scontrol show job` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobView {
    /// `JobState` (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, NODE_FAIL, …).
    pub state: String,
    /// `Reason` (why pending, or why it ended).
    pub reason: String,
    /// `NodeList`.
    pub nodes: String,
}

impl JobView {
    /// Whether the job has ended for good (a requeued job is pending again, not ended).
    pub fn ended(&self) -> bool {
        matches!(
            self.state.as_str(),
            "COMPLETED"
                | "CANCELLED"
                | "FAILED"
                | "TIMEOUT"
                | "NODE_FAIL"
                | "PREEMPTED"
                | "OUT_OF_MEMORY"
                | "BOOT_FAIL"
                | "DEADLINE"
        )
    }

    /// Parses one job of `scontrol -o show job ID`.
    pub fn parse(text: &str) -> Option<Self> {
        let field = |key: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_owned)
        };
        Some(Self {
            state: field("JobState=")?,
            reason: field("Reason=").unwrap_or_default(),
            nodes: field("NodeList=").unwrap_or_default(),
        })
    }
}

/// The job's state; `None` once Slurm has forgotten it (`Invalid job id`).
///
/// # Errors
/// [`SweepError::Slurm`] when `scontrol` cannot be asked.
pub fn job_view(id: &str) -> Result<Option<JobView>, SweepError> {
    match run_command(
        Command::new("scontrol").args(["-o", "show", "job", id]),
        SLURM_TIMEOUT,
    ) {
        Ok(out) => Ok(JobView::parse(&out)),
        Err(SweepError::Slurm { detail, .. }) if detail.contains("Invalid job id") => Ok(None),
        Err(e) => Err(e),
    }
}

/// `scancel ID`.
///
/// # Errors
/// [`SweepError::Slurm`] with what `scancel` said.
pub fn cancel(id: &str) -> Result<(), SweepError> {
    run_command(Command::new("scancel").arg(id), SLURM_TIMEOUT).map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_node_records_in_its_own_folder_and_a_requeued_one_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = node_record_dir(dir.path(), "n1");
        assert_eq!(first, dir.path().join("node-n1"));
        assert_eq!(
            node_record_dir(dir.path(), "n2"),
            dir.path().join("node-n2")
        );
        std::fs::create_dir_all(&first).unwrap();
        // A folder without a recording in it (the node failed before recording) is reused.
        assert_eq!(node_record_dir(dir.path(), "n1"), first);
        std::fs::write(first.join(ladle_observe::record::META), "{}").unwrap();
        let second = node_record_dir(dir.path(), "n1");
        assert_eq!(second, dir.path().join("node-n1.2"));
        std::fs::create_dir_all(&second).unwrap();
        std::fs::write(second.join(ladle_observe::record::META), "{}").unwrap();
        assert_eq!(
            node_record_dir(dir.path(), "n1"),
            dir.path().join("node-n1.3")
        );
        // What `ladle report DIR` finds: the folders holding a recording, by name.
        let found: Vec<String> = node_recordings(dir.path())
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(found, ["node-n1", "node-n1.2"]);
        assert!(
            node_recordings(&first).is_empty(),
            "a recording has no nodes"
        );
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_node_reads_its_job_name_and_shard_from_slurm_and_its_local_dir_holds_both() {
        let vars = [
            ("SLURM_JOB_ID", "41"),
            ("SLURMD_NODENAME", "n2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NNODES", "2"),
        ];
        let node = NodeEnv::from_env(env(&vars)).unwrap();
        assert_eq!(node.shard, Shard::new(1, 2).unwrap());
        assert_eq!(node.local_dir().unwrap(), Path::new("/tmp/ladle-41-n2"));
        let missing = NodeEnv::from_env(env(&vars[..3])).unwrap_err().to_string();
        assert!(missing.contains("SLURM_NNODES"), "{missing}");
        let bad = [
            ("SLURM_JOB_ID", "41"),
            ("SLURMD_NODENAME", "n2"),
            ("SLURM_NODEID", "2"),
            ("SLURM_NNODES", "2"),
        ];
        assert!(NodeEnv::from_env(env(&bad)).is_err());
    }

    #[test]
    fn a_local_dir_too_long_for_a_socket_is_an_error_naming_the_path_and_tmpdir() {
        let long = "x".repeat(90);
        let vars = [
            ("SLURM_JOB_ID", "41"),
            ("SLURMD_NODENAME", "n2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_NNODES", "1"),
            ("TMPDIR", long.as_str()),
        ];
        let err = NodeEnv::from_env(env(&vars))
            .unwrap()
            .local_dir()
            .unwrap_err()
            .to_string();
        assert!(err.contains("TMPDIR") && err.contains("107"), "{err}");
    }

    #[test]
    fn only_a_left_local_dir_of_this_node_whose_scheduler_is_gone_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let tmpdir = tmp.path().display().to_string();
        let vars = [
            ("SLURM_JOB_ID", "9"),
            ("SLURMD_NODENAME", "n1"),
            ("SLURM_NODEID", "0"),
            ("SLURM_NNODES", "2"),
            ("TMPDIR", tmpdir.as_str()),
        ];
        let node = NodeEnv::from_env(env(&vars)).unwrap();
        let make = |name: &str, lock: bool| {
            let dir = tmp.path().join(name).join("scheduler");
            std::fs::create_dir_all(&dir).unwrap();
            if lock {
                std::fs::write(dir.join("lock"), "").unwrap();
            }
            tmp.path().join(name)
        };
        let left = make("ladle-7-n1", true);
        let live = make("ladle-8-n1", true);
        let other_node = make("ladle-7-n2", true);
        let ours = make("ladle-9-n1", true);
        let unlocked = make("ladle-6-n1", false);
        let _held = ladle_scheduler::sys::lock_file(&live.join("scheduler/lock"))
            .unwrap()
            .unwrap();
        assert_eq!(node.remove_stale_local_dirs(), vec![left.clone()]);
        assert!(!left.exists());
        for kept in [live, other_node, ours, unlocked] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

    #[test]
    fn quoting_keeps_plain_words_and_protects_braces_spaces_and_quotes() {
        assert_eq!(quote("--lr=0.1"), "--lr=0.1");
        assert_eq!(quote("{0.1,0.01}"), "'{0.1,0.01}'");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }

    fn spec() -> ScriptSpec {
        ScriptSpec {
            ladle: "/opt/ladle/bin/ladle".into(),
            sweep: "/home/u/sweep 1".into(),
            cwd: "/home/u".into(),
            nodes: 2,
            gpus: GpuRequest::PerNode(4),
            slurm_args: vec!["--partition=gpu".into(), "--time=1:00:00".into()],
            node_args: vec!["--dataset".into(), "/data/imagenet".into()],
            command: vec![
                "python".into(),
                "train.py".into(),
                "--lr".into(),
                "{0.1,0.01}".into(),
            ],
            only: Vec::new(),
        }
    }

    #[test]
    fn the_script_asks_for_whole_nodes_and_starts_one_node_sweep_per_node() {
        let text = script(&spec());
        for line in [
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --exclusive",
            "#SBATCH --gres=gpu:4",
            "#SBATCH --no-kill",
            "#SBATCH --partition=gpu",
            "#SBATCH --time=1:00:00",
            "#SBATCH --output='/home/u/sweep 1/slurm-%j.out'",
            "SWEEP='/home/u/sweep 1'",
            "srun -n \"$SLURM_NNODES\" --ntasks-per-node=1",
            "--dataset /data/imagenet",
            "-- python train.py --lr '{0.1,0.01}'",
            "\"$LADLE\" report --merge \"$SWEEP\"",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        assert!(text.starts_with("#!/bin/bash\n"));
        let only = script(&ScriptSpec {
            only: vec!["run-01".into(), "run-03".into()],
            ..spec()
        });
        assert!(only.contains("--only run-01,run-03"), "{only}");
    }

    #[test]
    fn scontrol_lines_parse_and_only_final_states_end_a_job() {
        let line = "JobId=7 JobName=ladle-sweep UserId=root(0) JobState=RUNNING Reason=None \
                    Dependency=(null) NodeList=n[1-2] BatchHost=n1";
        let view = JobView::parse(line).unwrap();
        assert_eq!(view.state, "RUNNING");
        assert_eq!(view.nodes, "n[1-2]");
        assert!(!view.ended());
        for state in ["COMPLETED", "CANCELLED", "NODE_FAIL", "FAILED", "TIMEOUT"] {
            let view = JobView {
                state: state.into(),
                ..view.clone()
            };
            assert!(view.ended(), "{state}");
        }
        assert!(JobView::parse("nothing here").is_none());
    }
}
