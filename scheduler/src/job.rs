//! Jobs: what a user submits, the states a job goes through, and how a finished job's
//! exit is read (success, failure, or out of memory).

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
    /// without NUL ([`crate::protocol::Request::validate`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// CPU cores the job keeps busy itself (a run with its own DataLoader workers, say): it
    /// is held while registered feeds' decode threads and running jobs' cores leave fewer
    /// free. A consumer of a feed states none: its decoding is the feed's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// The family whose measured peak this job shares (`--family`); without it, the
    /// command up to its arguments' values ([`crate::estimate::family_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
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
    /// Its process vanished while the scheduler was down, with no exit status recorded: it
    /// ran (at least partly) and is not run again.
    Interrupted {
        /// What is known.
        reason: String,
    },
}

impl JobState {
    /// Whether the job will not run again.
    pub fn is_final(&self) -> bool {
        !matches!(self, Self::Queued | Self::Running { .. })
    }
}

/// Text in a job's stderr that marks a CUDA out-of-memory failure.
pub const OOM_MARKERS: [&str; 5] = [
    "CUDA out of memory",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "OutOfMemoryError",
    "CUBLAS_STATUS_ALLOC_FAILED",
];

/// Whether a job that exited with `code` and wrote `stderr` ran out of GPU memory: a
/// non-zero exit and one of [`OOM_MARKERS`] in its stderr.
pub fn is_out_of_memory(code: Option<i32>, stderr: &str) -> bool {
    code != Some(0) && OOM_MARKERS.iter().any(|m| stderr.contains(m))
}

/// The estimate for a retry after an out-of-memory exit: 1.5 × the old estimate, or
/// 1.1 × the observed peak if that is more, capped at `cap_mib`.
pub fn raised_estimate(estimate_mib: u64, peak_mib: Option<u64>, cap_mib: u64) -> u64 {
    let by_factor = estimate_mib.saturating_mul(3).div_ceil(2);
    let by_peak = peak_mib.map_or(0, |p| p.saturating_mul(11).div_ceil(10));
    by_factor.max(by_peak).min(cap_mib).max(1)
}

/// The estimate learned from an observed peak: 1.1 × the peak.
pub fn learned_estimate(peak_mib: u64) -> u64 {
    peak_mib.saturating_mul(11).div_ceil(10).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_needs_both_a_failure_and_the_text() {
        let torch = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert!(is_out_of_memory(Some(1), torch));
        assert!(is_out_of_memory(None, "CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(!is_out_of_memory(Some(0), torch));
        assert!(!is_out_of_memory(Some(1), "Segmentation fault"));
    }

    #[test]
    fn retries_raise_the_estimate_by_half_or_to_the_peak() {
        assert_eq!(raised_estimate(4000, None, 40_960), 6000);
        assert_eq!(raised_estimate(4000, Some(10_000), 40_960), 11_000);
        assert_eq!(raised_estimate(40_000, None, 40_960), 40_960);
    }

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
