//! Jobs as the protocol carries them: what a user submits ([`JobSpec`]), the states a job
//! goes through ([`JobState`]), and where its memory estimate comes from ([`Basis`]). What the
//! scheduler does with them (estimates per family, reading an exit) is `ladle-scheduler-core`'s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A job's number, unique for the life of a scheduler directory.
pub type JobId = u64;

/// What `ladle submit` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Program and arguments (run directly, not through a shell).
    pub command: Vec<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Device memory per GPU, MiB, if the user states it.
    pub gpu_mem_mib: Option<u64>,
    /// GPUs needed.
    pub gpus: u32,
    /// The producer feed this job consumes.
    pub feed: Option<String>,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for the job, if asked.
    pub thread_percentage: Option<u32>,
    /// Extra environment variables for the job's process (`ladle sweep` gives each run
    /// `LADLE_SOCKET` and `LADLE_RUN`). Names are non-empty without `=` or NUL; values
    /// without NUL ([`crate::Request::validate`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// `env` is the submitter's whole environment (`ladle submit --export ALL`, the default,
    /// as `sbatch --export=ALL`): the job gets it and nothing of the scheduler's own. `false`:
    /// the scheduler's environment plus `env` (`--export NONE` or a list of names). Journaled
    /// with the job, so a job started after a scheduler restart gets it too. Ladle's own
    /// variables (the GPUs', MPS's, `LADLE_JOB_*`) are set on top either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_env: bool,
    /// CPU cores the job keeps busy itself (a run with its own DataLoader workers, say): it
    /// is held while registered feeds' decode threads and running jobs' cores leave fewer
    /// free. A consumer of a feed states none: its decoding is the feed's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Host memory the job needs, MiB (`--host-mem`): it is held while live feeds' rings,
    /// the decoded-sample cache's budget and running jobs' host memory leave less free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_mem_mib: Option<u64>,
    /// The family whose measured peak this job shares (`--family`); without it, the
    /// command up to its arguments' values (`ladle_scheduler_core::estimate::family_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
}

impl JobSpec {
    /// `command` run in `cwd` on one GPU, nothing else stated (no memory, feed, cores or
    /// family; the scheduler's environment only).
    pub fn new(command: Vec<String>, cwd: PathBuf) -> Self {
        Self {
            command,
            cwd,
            gpu_mem_mib: None,
            gpus: 1,
            feed: None,
            thread_percentage: None,
            env: Vec::new(),
            whole_env: false,
            cpus: None,
            host_mem_mib: None,
            family: None,
        }
    }
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobState {
    /// Waiting for admission.
    Queued,
    /// Running (or being started) on these GPUs.
    Running {
        /// GPU indices.
        gpus: Vec<u32>,
        /// Process id of the job's process group leader, once known.
        pid: Option<u32>,
        /// The attempt number (1 for the first run).
        attempt: u32,
    },
    /// Exited with status 0.
    Succeeded,
    /// Exited otherwise, and is not retried.
    Failed {
        /// Why.
        reason: String,
    },
    /// Cancelled by `ladle cancel`.
    Cancelled,
    /// Its process vanished while the scheduler was down, with no exit status recorded, or
    /// the scheduler stopped it when it stopped itself (`DaemonConfig::stop_jobs`): it ran
    /// (at least partly) and is not run again.
    Interrupted {
        /// What is known.
        reason: String,
    },
    /// Held: a damaged journal line may concern it, so the scheduler neither starts it nor
    /// guesses; `ladle release` queues it, `ladle cancel` drops it.
    Held {
        /// Why, and the commands to look at it and release it.
        reason: String,
    },
}

impl JobState {
    /// Whether the job will not run again.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Self::Queued | Self::Running { .. } | Self::Held { .. }
        )
    }
}

/// Where an estimate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Stated by the user.
    Declared,
    /// Learned from a peak seen on the GPU (this job's family).
    Measured,
    /// The scheduler's default: nothing is known.
    #[default]
    Guess,
}

impl Basis {
    /// Whether a memory limit may be derived from an estimate of this basis (declared or
    /// measured, never a guess).
    pub fn may_cap(self) -> bool {
        !matches!(self, Self::Guess)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_states_are_final() {
        assert!(!JobState::Queued.is_final());
        assert!(JobState::Succeeded.is_final());
        assert!(
            JobState::Interrupted {
                reason: String::new()
            }
            .is_final()
        );
    }
}
