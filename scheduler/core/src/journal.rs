//! The journal's records: what each line of the daemon's append-only journal says
//! ([`Record`]), what a compacted journal starts with ([`SnapshotHeader`], [`JobSnapshot`]),
//! and reading a journal's bytes back ([`parse`]): every line a record, or a [`Damage`] in
//! its place, and a torn last line cut off. What the records mean for the jobs is the fold in
//! [`crate::state`].
//!
//! Every change of a job is a [`Record`] written (and synced) before the daemon acts on it
//! or answers the client, so after a crash the journal holds everything a client was told.
//! The file itself (appending with one `fsync` per record, cutting back a failed append,
//! compacting atomically) is `ladle_scheduler::journal::Journal`, in the daemon's crate.

mod replay;
mod snapshot;

use serde::{Deserialize, Serialize};

use crate::estimate::Basis;
use crate::job::{JobId, JobSpec};

pub use self::replay::{Damage, Entry, Parsed, parse};
pub use self::snapshot::{JobSnapshot, SnapshotHeader, SnapshotStage};

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// Exit status 0.
    Succeeded,
    /// Any other exit.
    Failed,
    /// A CUDA out-of-memory exit.
    OutOfMemory,
    /// Ended by `ladle cancel`.
    Cancelled,
    /// The process vanished while the daemon was down, exit status unknown; or the daemon
    /// took it down when it stopped (`DaemonConfig::stop_jobs`). Not run again.
    Interrupted,
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Record {
    /// A job entered the queue.
    Submitted {
        /// Job id.
        id: JobId,
        /// What was asked.
        spec: JobSpec,
        /// Its memory estimate per GPU, MiB.
        estimate_mib: u64,
        /// Where the estimate comes from (journals from before bases read as a guess
        /// unless the spec declares memory).
        #[serde(default)]
        basis: Basis,
        /// Unix time, s.
        at: f64,
    },
    /// The daemon is about to start an attempt (written before the process exists).
    Starting {
        /// Job id.
        id: JobId,
        /// Attempt number, from 1.
        attempt: u32,
        /// GPU indices.
        gpus: Vec<u32>,
        /// MPS memory limit per GPU, MiB.
        limit_mib: Option<u64>,
        /// The estimate it was placed with (reserved for it until it is measured), MiB.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        estimate_mib: Option<u64>,
        /// Nobody joins it on these GPUs for as long as it runs.
        #[serde(default)]
        exclusive: bool,
        /// Nobody joins it on these GPUs until it is measured.
        #[serde(default)]
        until_measured: bool,
    },
    /// The attempt's process exists.
    Started {
        /// Job id.
        id: JobId,
        /// Attempt number.
        attempt: u32,
        /// Process id (and process group id) of the attempt.
        pid: u32,
        /// Its start time in clock ticks since boot, to tell it from a recycled pid.
        start_ticks: u64,
    },
    /// A running attempt's peak memory was measured (it ran long enough on its GPUs for
    /// the peak to count; see the policy's `measure_s`).
    Measured {
        /// Job id.
        id: JobId,
        /// Attempt number.
        attempt: u32,
        /// Peak device memory per GPU, MiB.
        peak_mib: u64,
    },
    /// An attempt ended.
    Finished {
        /// Job id.
        id: JobId,
        /// Attempt number.
        attempt: u32,
        /// How.
        outcome: Outcome,
        /// Exit code, when there was one.
        code: Option<i32>,
        /// Observed peak device memory per GPU, MiB.
        peak_mib: Option<u64>,
        /// What happened, for people.
        reason: String,
        /// CPU seconds of the attempt, its own and its waited-for children's (`wait4`),
        /// when the scheduler reaped it (not for one that ended while the scheduler was
        /// down).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_s: Option<f64>,
    },
    /// The job goes back to the head of the queue.
    Requeued {
        /// Job id.
        id: JobId,
        /// New estimate, MiB.
        estimate_mib: u64,
        /// Its new basis (`None`: unchanged).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        basis: Option<Basis>,
        /// Whether it must run alone (out-of-memory retries).
        exclusive: bool,
        /// Whether this requeue follows an out-of-memory exit (it counts against the retry
        /// limit).
        out_of_memory: bool,
    },
    /// Cancelled while queued (or held).
    Cancelled {
        /// Job id.
        id: JobId,
    },
    /// A held job goes back to the queue (`ladle release`).
    Released {
        /// Job id.
        id: JobId,
    },
    /// The first line of a compacted journal.
    Snapshot(SnapshotHeader),
    /// One job a compaction kept (after the [`Record::Snapshot`] line).
    Job(Box<JobSnapshot>),
}

impl Record {
    /// The job the record is about (every record but the snapshot header names one).
    pub fn job_id(&self) -> Option<JobId> {
        match self {
            Self::Submitted { id, .. }
            | Self::Starting { id, .. }
            | Self::Started { id, .. }
            | Self::Measured { id, .. }
            | Self::Finished { id, .. }
            | Self::Requeued { id, .. }
            | Self::Cancelled { id }
            | Self::Released { id } => Some(*id),
            Self::Job(job) => Some(job.id),
            Self::Snapshot(_) => None,
        }
    }
}
