//! The queue's journal: append-only JSON lines, one `fsync` per record, replayed at start.
//!
//! Every change of a job is a [`Record`] written (and synced) before the daemon acts on it
//! or answers the client, so after a crash the journal holds everything a client was told.
//! A torn last line (the daemon died mid-write) is cut off at replay; a damaged line
//! anywhere else is an error, because skipping a `finished` record could run a job twice.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::estimate::Basis;
use crate::job::{JobId, JobSpec};

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
    /// Cancelled while queued.
    Cancelled {
        /// Job id.
        id: JobId,
    },
}

/// A journal that could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The file could not be opened, read, written or synced.
    #[error("journal {path}: {source}")]
    Io {
        /// The journal file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A complete line in the middle of the journal does not parse.
    #[error("journal {path} line {line} is damaged ({reason}); refusing to guess what it said")]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parser's complaint.
        reason: String,
    },
}

/// An open journal.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
}

impl Journal {
    /// Opens (or creates) the journal at `path` and returns it with the records it holds.
    ///
    /// # Errors
    /// [`JournalError`] when the file cannot be used or a line other than a torn last one is
    /// damaged.
    pub fn open(path: &Path) -> Result<(Self, Vec<Record>), JournalError> {
        let io_err = |source| JournalError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io_err)?;
        let bytes = std::fs::read(path).map_err(io_err)?;
        let mut records = Vec::new();
        let mut good_len = 0usize;
        let mut start = 0usize;
        let mut line_no = 0usize;
        while start < bytes.len() {
            line_no += 1;
            let end = bytes[start..].iter().position(|&b| b == b'\n');
            let (line, complete) = match end {
                Some(e) => (&bytes[start..start + e], true),
                None => (&bytes[start..], false),
            };
            match (serde_json::from_slice::<Record>(line), complete) {
                (_, false) => {
                    tracing::warn!(
                        journal = %path.display(),
                        line = line_no,
                        "cutting off a torn last line (the daemon died while writing it)"
                    );
                    break;
                }
                (Ok(record), true) => {
                    records.push(record);
                    good_len = start + line.len() + 1;
                }
                (Err(_), true) if line.iter().all(u8::is_ascii_whitespace) => {
                    good_len = start + line.len() + 1;
                }
                (Err(e), true) => {
                    return Err(JournalError::Corrupt {
                        path: path.to_owned(),
                        line: line_no,
                        reason: e.to_string(),
                    });
                }
            }
            start += line.len() + 1;
        }
        if good_len < bytes.len() {
            file.set_len(good_len as u64).map_err(io_err)?;
            file.sync_all().map_err(io_err)?;
        }
        file.flush().map_err(io_err)?;
        Ok((
            Self {
                file,
                path: path.to_owned(),
            },
            records,
        ))
    }

    /// Appends one record and syncs it to disk before returning.
    ///
    /// # Errors
    /// [`JournalError::Io`].
    pub fn append(&mut self, record: &Record) -> Result<(), JournalError> {
        let mut line = serde_json::to_vec(record).map_err(|e| JournalError::Io {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|()| self.file.sync_data())
            .map_err(|source| JournalError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            gpu_mem_mib: Some(100),
            ..JobSpec::new(vec!["true".to_owned()], "/".into())
        }
    }

    #[test]
    fn records_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let (mut j, old) = Journal::open(&path).unwrap();
        assert!(old.is_empty());
        let a = Record::Submitted {
            id: 1,
            spec: spec(),
            estimate_mib: 100,
            basis: Basis::Declared,
            at: 1.0,
        };
        let b = Record::Cancelled { id: 1 };
        j.append(&a).unwrap();
        j.append(&b).unwrap();
        drop(j);
        let (_, records) = Journal::open(&path).unwrap();
        assert_eq!(records, vec![a, b]);
    }

    #[test]
    fn a_journal_written_before_estimates_had_a_basis_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let old = r#"{"event":"submitted","id":3,"spec":{"command":["true"],"cwd":"/","gpu_mem_mib":null,"gpus":1,"feed":null,"thread_percentage":null},"estimate_mib":4096,"at":1.0}
{"event":"requeued","id":3,"estimate_mib":6144,"exclusive":true,"out_of_memory":true}
"#;
        std::fs::write(&path, old).unwrap();
        let (_, records) = Journal::open(&path).unwrap();
        assert!(matches!(
            &records[0],
            Record::Submitted { basis: Basis::Guess, spec, .. } if spec.family.is_none()
        ));
        assert!(matches!(records[1], Record::Requeued { basis: None, .. }));
    }

    #[test]
    fn a_torn_last_line_is_cut_off_and_writing_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        j.append(&Record::Cancelled { id: 1 }).unwrap();
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"event":"cancel"#).unwrap();
        drop(f);
        let (mut j, records) = Journal::open(&path).unwrap();
        assert_eq!(records.len(), 1);
        j.append(&Record::Cancelled { id: 2 }).unwrap();
        drop(j);
        let (_, records) = Journal::open(&path).unwrap();
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn a_damaged_middle_line_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::write(&path, "garbage\n{\"event\":\"cancelled\",\"id\":1}\n").unwrap();
        assert!(matches!(
            Journal::open(&path),
            Err(JournalError::Corrupt { line: 1, .. })
        ));
    }
}
