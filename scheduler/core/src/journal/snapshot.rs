//! What a compacted journal starts with: a [`SnapshotHeader`] line, then one [`JobSnapshot`]
//! line per job it keeps, then the records appended since.

use serde::{Deserialize, Serialize};

use crate::estimate::{Basis, Families};
use crate::job::{JobId, JobSpec, JobState};

/// The first line of a compacted journal: what is not per job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// The next job id (ids are never reused, also past the jobs a compaction dropped).
    pub next_id: JobId,
    /// The queue, head first.
    pub queue: Vec<JobId>,
    /// The peaks learned per family (also from jobs the compaction dropped).
    pub families: Families,
    /// How many job lines follow.
    pub jobs: usize,
    /// Unix time of the compaction, s.
    pub at: f64,
}

/// One job as a compaction keeps it: everything its records had told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSnapshot {
    /// Job id.
    pub id: JobId,
    /// What was asked.
    pub spec: JobSpec,
    /// Its memory estimate per GPU, MiB.
    pub estimate_mib: u64,
    /// Where the estimate comes from.
    pub basis: Basis,
    /// It must run alone (an out-of-memory retry not yet measured).
    pub exclusive: bool,
    /// Attempts begun.
    pub attempts: u32,
    /// Out-of-memory requeues.
    pub oom_retries: u32,
    /// Where it stands.
    pub stage: SnapshotStage,
    /// Unix time of the submission.
    pub submitted_at: f64,
    /// Largest peak journaled for it, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_mib: Option<u64>,
    /// Its current attempt's peak has been measured.
    #[serde(default)]
    pub measured: bool,
    /// CPU seconds of its ended attempts (the scheduler's `wait4`), when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<f64>,
    /// Held, and why: it is neither started nor settled until `ladle release` (or
    /// `ladle cancel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

/// Where a kept job stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SnapshotStage {
    /// In the queue (or held).
    Queued,
    /// An attempt is open.
    Running {
        /// Attempt number, from 1.
        attempt: u32,
        /// GPU indices.
        gpus: Vec<u32>,
        /// Its process (group leader), once known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        /// MPS memory limit per GPU, MiB.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit_mib: Option<u64>,
        /// The estimate it was placed with, MiB.
        estimate_mib: u64,
        /// Nobody joins it for as long as it runs.
        exclusive: bool,
        /// Nobody joins it until it is measured.
        until_measured: bool,
    },
    /// It will not run again.
    Ended {
        /// How it ended.
        state: JobState,
    },
}
