//! Attempts as processes: starting one under the wrapper (see the module docs of
//! [`super`]), reaping it, and deciding what follows its end (done, failed, an
//! out-of-memory retry, or the final failure after the last retry).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::estimate::Basis;
use crate::job::{self, JobId};
use crate::journal::{Outcome, Record};
use crate::mps;
use crate::policy::Placement;
use crate::sys;
use crate::telemetry::SimLoad;

use super::{Daemon, SIM_DEFAULT_SM};

/// The shell wrapper around every attempt (see the module docs). `$0` names the attempt,
/// `$1` is the claim file, `$2` the status file, the rest the command.
const WRAPPER: &str = r#"set -C
{ echo $$ > "$1"; } 2>/dev/null || exit 86
set +C
status=$2
shift 2
trap : TERM INT HUP
"$@"
code=$?
echo $code >| "$status.tmp" && mv -f "$status.tmp" "$status"
exit $code
"#;

/// What only the running daemon knows of an open attempt (the journaled part, pid
/// included, is the attempt in [`super::state`]).
#[derive(Debug)]
pub(super) struct Live {
    /// The process, when this daemon started it (an adopted one is watched by pid).
    pub child: Option<Child>,
    /// When `ladle cancel` sent SIGTERM, and the grace it gave before SIGKILL.
    pub cancel_at: Option<(Instant, Duration)>,
    /// The daemon is stopping and took the job down with it
    /// ([`super::DaemonConfig::stop_jobs`]).
    pub stopping: bool,
    /// What the job holds on simulated GPUs.
    pub sim_load: SimLoad,
    /// Bytes of its stdout already read for sim markers.
    pub stdout_read: u64,
    /// Its process (the group leader) with its start time, once started or adopted: what
    /// every signal to the job goes through.
    pub process: Option<sys::ProcessId>,
    /// Largest memory seen for its process group on one GPU, MiB (on simulated GPUs: what
    /// it holds, its estimate until it reports its memory, then the most it reported).
    pub peak_mib: Option<u64>,
    /// Simulated GPUs: it has reported its memory (`ladle-sim: mem_mib=…`).
    pub reported: bool,
    /// When (daemon clock) this daemon started or adopted it.
    pub since: f64,
    /// When (daemon clock) its process was first seen on its GPUs.
    pub seen_at: Option<f64>,
}

/// How an attempt ended, as reaping found it.
pub(super) struct Ended {
    pub id: JobId,
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// It ended while the scheduler was down and left no status.
    pub vanished: bool,
    /// Its CPU time, when the scheduler reaped it.
    pub cpu: Option<Duration>,
}

impl Live {
    pub(super) fn new(estimate_mib: u64, since: f64) -> Self {
        Self {
            child: None,
            cancel_at: None,
            stopping: false,
            sim_load: SimLoad {
                mem_mib: estimate_mib,
                sm: SIM_DEFAULT_SM,
            },
            stdout_read: 0,
            process: None,
            peak_mib: None,
            reported: false,
            since,
            seen_at: None,
        }
    }
}

/// The estimate of an out-of-memory retry: 1.1 × the most the crashed attempt was seen
/// using, at most `cap_mib` (the largest GPU). Nothing seen: the old estimate (the retry
/// runs alone, unlimited, and is measured there). A guess is never multiplied into a
/// bigger guess.
pub(super) fn retry_estimate(estimate_mib: u64, peak_mib: Option<u64>, cap_mib: u64) -> u64 {
    peak_mib
        .map_or(estimate_mib, job::learned_estimate)
        .min(cap_mib)
        .max(1)
}

/// Where each attempt's files are: the claim and status files in the state directory
/// (`DIR/jobs/ID/ATTEMPT.claim`, `.status`: they decide exactly-once launches, so they stay
/// node-local), stdout and stderr beside them or, with a log directory, in
/// `LOG_DIR/ID/ATTEMPT.out`, `.err`. Everything that writes or reads an attempt's files
/// (launch, reaping, recovery, sim markers, out-of-memory evidence, `Logs`) asks here.
#[derive(Debug, Clone)]
pub(super) struct JobFiles {
    state_dir: PathBuf,
    log_dir: Option<PathBuf>,
}

impl JobFiles {
    pub(super) fn new(state_dir: PathBuf, log_dir: Option<PathBuf>) -> Self {
        Self { state_dir, log_dir }
    }

    fn in_dir(dir: &Path, id: JobId, attempt: u32, ext: &str) -> PathBuf {
        dir.join(id.to_string()).join(format!("{attempt}.{ext}"))
    }

    /// The claim file its wrapper creates exclusively, holding its pid.
    pub(super) fn claim(&self, id: JobId, attempt: u32) -> PathBuf {
        Self::in_dir(&self.state_dir.join("jobs"), id, attempt, "claim")
    }

    /// The file its wrapper writes the exit code to.
    pub(super) fn status(&self, id: JobId, attempt: u32) -> PathBuf {
        Self::in_dir(&self.state_dir.join("jobs"), id, attempt, "status")
    }

    fn log(&self, id: JobId, attempt: u32, ext: &str) -> PathBuf {
        match &self.log_dir {
            Some(logs) => Self::in_dir(logs, id, attempt, ext),
            None => Self::in_dir(&self.state_dir.join("jobs"), id, attempt, ext),
        }
    }

    /// Its standard output.
    pub(super) fn stdout(&self, id: JobId, attempt: u32) -> PathBuf {
        self.log(id, attempt, "out")
    }

    /// Its standard error.
    pub(super) fn stderr(&self, id: JobId, attempt: u32) -> PathBuf {
        self.log(id, attempt, "err")
    }

    /// The directories that hold one `ID/` directory per job: the state directory's
    /// `jobs/`, and the log directory when there is one.
    pub(super) fn job_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.state_dir.join("jobs")];
        dirs.extend(self.log_dir.clone());
        dirs
    }
}

/// The last `max` bytes of a file, lossily as text; empty when unreadable.
pub(super) fn tail(path: &Path, max: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max as u64)));
    let mut bytes = Vec::new();
    let _ = f.take(max as u64).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(super) fn read_status(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Daemon {
    /// The largest GPU's memory, MiB: no estimate is raised past it.
    fn cap_mib(&self) -> u64 {
        self.gpus
            .iter()
            .map(|g| g.memory_total_mib)
            .max()
            .unwrap_or(u64::MAX)
    }

    /// Journals that attempt `attempt` of job `id` runs as process (group) `pid`, with the
    /// process's start time so that a recycled pid is never taken for it.
    pub(super) fn note_started(&mut self, id: JobId, attempt: u32, pid: u32) {
        let process = sys::ProcessId::of(pid);
        if let Some(live) = self.live.get_mut(&id) {
            live.process = process;
        }
        let start_ticks = process.map_or(0, |p| p.start_ticks);
        self.note(Record::Started {
            id,
            attempt,
            pid,
            start_ticks,
        });
    }

    /// Journals and starts the next attempt of the job `placement` places, with the
    /// estimate admission placed it by.
    pub(super) fn launch(&mut self, placement: &Placement, estimate_mib: u64) {
        let (id, gpus, limit_mib) = (placement.job, &placement.gpus[..], placement.mem_limit_mib);
        let Some(job) = self.jobs.jobs.get(&id) else {
            return;
        };
        let attempt = job.attempts + 1;
        let starting = Record::Starting {
            id,
            attempt,
            gpus: gpus.iter().map(|&g| g as u32).collect(),
            limit_mib,
            estimate_mib: Some(estimate_mib),
            exclusive: placement.exclusive,
            until_measured: placement.until_measured,
        };
        if self.commit(starting).is_err() {
            return;
        }
        let now = self.now();
        self.live.insert(id, Live::new(estimate_mib, now));
        match self.spawn(id, attempt, gpus, limit_mib) {
            Ok(child) => {
                let pid = child.id();
                self.note_started(id, attempt, pid);
                tracing::info!(
                    job = id,
                    attempt,
                    pid,
                    ?gpus,
                    ?limit_mib,
                    until_measured = placement.until_measured,
                    "started"
                );
                let now = self.now();
                let simulated = self.telemetry.simulated().is_some();
                let mut load = None;
                if let Some(live) = self.live.get_mut(&id) {
                    live.child = Some(child);
                    if simulated {
                        // A simulated GPU shows the job at once, holding its estimate until
                        // it reports its memory.
                        live.seen_at = Some(now);
                        live.peak_mib = Some(live.sim_load.mem_mib);
                        load = Some(live.sim_load);
                    }
                }
                if let (Some(sim), Some(load)) = (self.telemetry.simulated(), load) {
                    for &g in gpus {
                        sim.place(g, id, load);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(job = id, "cannot start: {e}");
                self.live.remove(&id);
                self.note(Record::Finished {
                    id,
                    attempt,
                    outcome: Outcome::Failed,
                    code: None,
                    peak_mib: None,
                    reason: format!("cannot start: {e}"),
                    cpu_s: None,
                });
            }
        }
    }

    fn spawn(
        &self,
        id: JobId,
        attempt: u32,
        gpus: &[usize],
        limit_mib: Option<u64>,
    ) -> std::io::Result<Child> {
        let job = self
            .jobs
            .jobs
            .get(&id)
            .ok_or_else(|| std::io::Error::other("job vanished"))?;
        let (claim, status) = (
            self.files.claim(id, attempt),
            self.files.status(id, attempt),
        );
        let (out_path, err_path) = (
            self.files.stdout(id, attempt),
            self.files.stderr(id, attempt),
        );
        for path in [&claim, &out_path] {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
        }
        let open = |path: &Path| OpenOptions::new().create(true).append(true).open(path);
        let (out, err) = (open(&out_path)?, open(&err_path)?);
        let uuids: Vec<&str> = gpus
            .iter()
            .filter_map(|&g| self.gpus.get(g).map(|i| i.uuid.as_str()))
            .collect();
        let mut command = Command::new("/bin/sh");
        if job.spec.whole_env {
            // The submitter's environment, not the scheduler's.
            command.env_clear();
        }
        // The job's own variables first: ladle's (its GPUs, MPS, its id) always win, so no
        // environment can put a job on GPUs it was not given.
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg(format!("ladle-job-{id}.{attempt}"))
            .arg(claim)
            .arg(status)
            .args(&job.spec.command)
            .current_dir(&job.spec.cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .envs(
                (job.spec.env.iter())
                    .filter(|(name, _)| !mps::sets(name))
                    .cloned(),
            )
            .envs(self.mps_env.iter().cloned())
            .envs(mps::job_env(&uuids, limit_mib, job.spec.thread_percentage))
            .env("LADLE_JOB_ID", id.to_string())
            .env("LADLE_JOB_ATTEMPT", attempt.to_string())
            .spawn()
    }

    /// Finds attempts that ended and escalates cancels past their grace.
    pub(super) fn reap(&mut self) {
        let mut ended = Vec::new();
        for (job, attempt) in self.jobs.running() {
            let Some(live) = self.live.get_mut(&job.id) else {
                continue;
            };
            if let Some(child) = live.child.as_ref() {
                // wait4, not the Child's own wait: it also reads the attempt's CPU time.
                match ladle_os::try_wait_with_cpu(child.id()) {
                    Ok(Some((status, cpu))) => ended.push(Ended {
                        id: job.id,
                        code: status.code(),
                        signal: status.signal(),
                        vanished: false,
                        cpu: Some(cpu),
                    }),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(job = job.id, "waiting for the job: {e}"),
                }
            } else if let Some(pid) = attempt.pid
                && !sys::alive(pid)
            {
                // Adopted after a restart: not our child, so its CPU time is not ours to read.
                let code = read_status(&self.files.status(job.id, attempt.number));
                ended.push(Ended {
                    id: job.id,
                    code,
                    signal: None,
                    vanished: code.is_none(),
                    cpu: None,
                });
            }
            if let (Some((at, grace)), Some(process)) = (live.cancel_at, live.process)
                && at.elapsed() > grace
            {
                let _ = process.signal_group(sys::Signal::KILL);
            }
        }
        for end in ended {
            self.finish(end);
        }
    }

    /// Sends `signal` to the process group of every running attempt; with `stopping`, marks
    /// them as taken down with the daemon (their ends are journaled as interrupted).
    /// Returns the groups signalled (their leaders).
    pub(super) fn signal_running(
        &mut self,
        signal: sys::Signal,
        stopping: bool,
    ) -> Vec<sys::ProcessId> {
        let running: Vec<JobId> = self.jobs.running().map(|(j, _)| j.id).collect();
        let mut groups = Vec::new();
        for id in running {
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            if stopping {
                live.stopping = true;
            }
            let Some(process) = live.process else {
                continue;
            };
            match process.signal_group(signal) {
                Ok(true) => groups.push(process),
                // Already gone: reaping will see it.
                Ok(false) => {}
                Err(e) => tracing::warn!(job = id, pid = process.pid, "{signal:?}: {e}"),
            }
        }
        groups
    }

    /// Records the end of a job's current attempt and decides what follows.
    pub(super) fn finish(&mut self, end: Ended) {
        let Ended {
            id,
            code,
            signal,
            vanished,
            cpu,
        } = end;
        if self.telemetry.simulated().is_some() {
            self.read_sim_markers();
        }
        let cap = self.cap_mib();
        let max_retries = self.max_oom_retries;
        let Some(job) = self.jobs.jobs.get(&id) else {
            return;
        };
        let Some(attempt) = job.attempt() else { return };
        let number = attempt.number;
        let limit_mib = attempt.limit_mib;
        let live = self.live.remove(&id);
        let peak_mib = live.as_ref().and_then(|l| l.peak_mib);
        let cancelled = live.as_ref().is_some_and(|l| l.cancel_at.is_some());
        let stopping = live.as_ref().is_some_and(|l| l.stopping);
        let how = match (code, signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            (None, None) => "ended without an exit status".to_owned(),
        };
        let stderr = tail(&self.files.stderr(id, number), 1 << 20);
        let mut requeue = None;
        let (outcome, reason) = if cancelled {
            (Outcome::Cancelled, "cancelled".to_owned())
        } else if stopping {
            (
                Outcome::Interrupted,
                format!("stopped with the scheduler ({how}); not run again"),
            )
        } else if vanished {
            (
                Outcome::Interrupted,
                "the process ended while the scheduler was down and left no exit status; not run again"
                    .to_owned(),
            )
        } else if code == Some(0) {
            (Outcome::Succeeded, "exit code 0".to_owned())
        } else if let Some(evidence) =
            job::out_of_memory_evidence(&stderr).filter(|_| code != Some(0))
        {
            tracing::info!(job = id, source = ?evidence.source, line = %evidence.line, "out of memory on the GPU");
            let seen = match (peak_mib, limit_mib) {
                (Some(p), Some(l)) => format!("{p} MiB seen, limit {l} MiB"),
                (Some(p), None) => format!("{p} MiB seen"),
                (None, Some(l)) => format!("limit {l} MiB"),
                (None, None) => "no memory seen".to_owned(),
            };
            if job.oom_retries < max_retries {
                requeue = Some(retry_estimate(job.estimate.mib, peak_mib, cap));
                (
                    Outcome::OutOfMemory,
                    format!(
                        "out of memory on the GPU ({seen}); retry {} of {max_retries}, alone until measured",
                        job.oom_retries + 1
                    ),
                )
            } else {
                (
                    Outcome::OutOfMemory,
                    format!(
                        "out of memory on the GPU ({seen}) after {max_retries} retries; not retried again"
                    ),
                )
            }
        } else {
            (Outcome::Failed, how)
        };
        tracing::info!(job = id, attempt = number, ?outcome, "{reason}");
        if let Some(sim) = self.telemetry.simulated() {
            sim.remove(id);
        }
        self.note(Record::Finished {
            id,
            attempt: number,
            outcome,
            code,
            peak_mib,
            reason,
            cpu_s: cpu.map(|c| c.as_secs_f64()),
        });
        if let Some(estimate_mib) = requeue {
            self.note(Record::Requeued {
                id,
                estimate_mib,
                // Not a measurement: the attempt crashed before its peak. It runs alone,
                // unlimited, until measured.
                basis: Some(Basis::Guess),
                exclusive: true,
                out_of_memory: true,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_runs_a_command_once_and_records_its_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let claim = dir.path().join("claim");
        let status = dir.path().join("status");
        let run = || {
            Command::new("/bin/sh")
                .arg("-c")
                .arg(WRAPPER)
                .arg("ladle-job-1.1")
                .arg(&claim)
                .arg(&status)
                .args(["sh", "-c", "echo ran >> \"$0\"; exit 3"])
                .arg(dir.path().join("ran"))
                .status()
                .unwrap()
        };
        assert_eq!(run().code(), Some(3));
        assert_eq!(read_status(&status), Some(3));
        assert!(super::super::recover::read_claim(&claim).is_some());
        // A second launch of the same attempt refuses to run the command.
        assert_eq!(run().code(), Some(86));
        let ran = std::fs::read_to_string(dir.path().join("ran")).unwrap();
        assert_eq!(ran, "ran\n");
    }

    #[test]
    fn an_out_of_memory_retry_is_estimated_from_what_was_seen_never_from_a_multiplied_guess() {
        // Seen 9000 MiB before the crash: 1.1 × that.
        assert_eq!(retry_estimate(4096, Some(9000), 40_960), 9900);
        // Nothing seen: the old number, not 1.5 × a guess.
        assert_eq!(retry_estimate(4096, None, 40_960), 4096);
        // Never past the largest GPU.
        assert_eq!(retry_estimate(4096, Some(80_000), 40_960), 40_960);
    }
}
