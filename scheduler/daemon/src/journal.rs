//! The queue's journal: append-only JSON lines, one `fsync` per record, replayed at start,
//! compacted now and then.
//!
//! Every change of a job is a [`Record`] written (and synced) before the daemon acts on it
//! or answers the client, so after a crash the journal holds everything a client was told.
//!
//! ## When the disk misbehaves
//! - An append that fails (a full disk: [`JournalError::DiskFull`]) leaves nothing behind:
//!   the file is cut back to the end of the last record that was written and synced, so the
//!   next append starts on a fresh line. Were the cut to fail too, it is tried again
//!   before the next append, which fails until it succeeds.
//! - A torn last line (the daemon died mid-write) is cut off when the journal is read back;
//!   [`Damage::what_was_lost`] says which job it was about and what that means.
//! - A damaged line anywhere else is no reason to stop: [`Journal::replay`] returns it as an
//!   [`Entry::Damaged`] in its place (with the job it names, when its start is readable),
//!   and the daemon holds the jobs it may concern rather than guess what it said. A whole
//!   record written after a fragment on the same line is kept. [`Journal::open`] is the
//!   strict reader: any damaged line is a [`JournalError::Corrupt`].
//!
//! ## Compaction
//! [`Journal::compact`] replaces the file by a snapshot ([`SnapshotHeader`] and one
//! [`JobSnapshot`] per job kept, as records), atomically: written to `PATH.compact`,
//! synced, renamed over the journal, and the directory synced. A crash (`kill -9`) at any
//! point leaves either the old journal or the new one, each whole, and both replay to the
//! same jobs. A leftover `PATH.compact` is removed when the journal is opened.
//!
//! The records and the reading of a journal's bytes are `ladle-scheduler-core`'s
//! [`journal`](ladle_scheduler_core::journal), re-exported here; this module is the file.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use ladle_scheduler_core::journal::*;

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
    /// The file system that holds the journal is full (or the quota is spent): nothing was
    /// recorded.
    #[error(
        "journal {path}: the disk is full ({source}); nothing was recorded: free space on the \
         file system that holds it"
    )]
    DiskFull {
        /// The journal file.
        path: PathBuf,
        /// The OS error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// A complete line in the middle of the journal does not parse ([`Journal::open`] only;
    /// [`Journal::replay`] returns it as an [`Entry::Damaged`]).
    #[error("journal {path} line {line} is damaged ({reason}); refusing to guess what it said")]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

impl JournalError {
    fn io(path: &Path, source: io::Error) -> Self {
        if ladle_os::fs::is_disk_full(&source) {
            Self::DiskFull {
                path: path.to_owned(),
                source,
            }
        } else {
            Self::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// What [`Journal::replay`] read back.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Replay {
    /// Every line, in order: records, and damaged lines in their place.
    pub entries: Vec<Entry>,
    /// A torn last line that was cut off.
    pub torn: Option<Damage>,
}

/// A step of [`Journal::compact`], for tests that stop it there as a crash would.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactStep {
    /// The snapshot is written to the temporary file, not synced.
    Written,
    /// The temporary file is synced.
    Synced,
    /// The temporary file is renamed over the journal; the directory not yet synced.
    Renamed,
}

/// An open journal.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
    /// Bytes written and synced: a failed append is cut back to here.
    len: u64,
    /// A failed append may have left bytes past `len` that could not be cut off yet.
    dirty: bool,
    /// Records since the last compaction (or in the file when it was opened).
    tail: usize,
}

impl Journal {
    /// Opens (or creates) the journal at `path` and returns it with the records it holds;
    /// strict: any damaged line is an error.
    ///
    /// # Errors
    /// [`JournalError`] when the file cannot be used or a line other than a torn last one is
    /// damaged.
    pub fn open(path: &Path) -> Result<(Self, Vec<Record>), JournalError> {
        let (journal, replay) = Self::read(path, true)?;
        let records = replay
            .entries
            .into_iter()
            .filter_map(|e| match e {
                Entry::Record(r) => Some(r),
                // `Entry::Damaged`: none here (strict), and `Entry` is the core's, not
                // exhaustive outside it.
                _ => None,
            })
            .collect();
        Ok((journal, records))
    }

    /// Opens (or creates) the journal at `path` and returns it with every line read back:
    /// damaged lines are [`Entry::Damaged`] in their place, and a torn last line is cut
    /// off and returned in [`Replay::torn`].
    ///
    /// # Errors
    /// [`JournalError`] when the file cannot be opened, read, cut or synced.
    pub fn replay(path: &Path) -> Result<(Self, Replay), JournalError> {
        Self::read(path, false)
    }

    fn read(path: &Path, strict: bool) -> Result<(Self, Replay), JournalError> {
        let io_err = |source| JournalError::io(path, source);
        match std::fs::remove_file(compact_path(path)) {
            Ok(()) => tracing::info!(
                journal = %path.display(),
                "removed an unfinished compaction (the journal itself is whole)"
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(JournalError::io(&compact_path(path), e)),
        }
        // 0600: the journal holds jobs' environments, keys and tokens included, and a sweep's
        // directory follows the umask.
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(io_err)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io_err)?;
        let bytes = std::fs::read(path).map_err(io_err)?;
        let parsed = parse(&bytes);
        if strict
            && let Some(Entry::Damaged(d)) = parsed
                .entries
                .iter()
                .find(|e| matches!(e, Entry::Damaged(_)))
        {
            return Err(JournalError::Corrupt {
                path: path.to_owned(),
                line: d.line,
                reason: format!("{} bytes that are not a record: {:?}", d.bytes, d.excerpt),
            });
        }
        if let Some(torn) = &parsed.torn {
            tracing::warn!(
                journal = %path.display(),
                line = torn.line,
                job = torn.id,
                "cut off a torn last line (a write that never finished); lost: {}",
                torn.what_was_lost()
            );
            file.set_len(parsed.good_len as u64).map_err(io_err)?;
            file.sync_all().map_err(io_err)?;
        }
        let tail = parsed.entries.len();
        Ok((
            Self {
                file,
                path: path.to_owned(),
                len: parsed.good_len as u64,
                dirty: false,
                tail,
            },
            Replay {
                entries: parsed.entries,
                torn: parsed.torn,
            },
        ))
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records appended since the last compaction (with those read when it was opened).
    pub fn tail(&self) -> usize {
        self.tail
    }

    /// Appends one record and syncs it to disk before returning. When that fails nothing
    /// of it stays in the file (see the module docs).
    ///
    /// # Errors
    /// [`JournalError::DiskFull`] when the file system is full, else [`JournalError::Io`].
    pub fn append(&mut self, record: &Record) -> Result<(), JournalError> {
        let mut line = serde_json::to_vec(record)
            .map_err(|e| JournalError::io(&self.path, io::Error::other(e)))?;
        line.push(b'\n');
        if self.dirty {
            self.cut_back()?;
        }
        let written = self
            .file
            .write_all(&line)
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.len += line.len() as u64;
                self.tail += 1;
                Ok(())
            }
            Err(source) => {
                self.dirty = true;
                if let Err(cut) = self.cut_back() {
                    tracing::error!("{cut}; the next append tries again");
                }
                Err(JournalError::io(&self.path, source))
            }
        }
    }

    /// Cuts the file back to the last record written and synced.
    fn cut_back(&mut self) -> Result<(), JournalError> {
        self.file
            .set_len(self.len)
            .and_then(|()| self.file.sync_data())
            .map_err(|source| JournalError::io(&self.path, source))?;
        self.dirty = false;
        Ok(())
    }

    /// Replaces the journal by `records` (a snapshot), atomically (see the module docs).
    /// On an error before the rename the old journal stays in use, whole; an error syncing
    /// the directory after it leaves the new one in use.
    ///
    /// # Errors
    /// [`JournalError`] when the temporary file cannot be written, synced or renamed.
    pub fn compact(&mut self, records: &[Record]) -> Result<(), JournalError> {
        self.compact_until(records, None)
    }

    /// [`Journal::compact`], stopping after `stop` as a crash there would (the journal
    /// must then be dropped and opened again).
    #[doc(hidden)]
    pub fn compact_until(
        &mut self,
        records: &[Record],
        stop: Option<CompactStep>,
    ) -> Result<(), JournalError> {
        let temp = compact_path(&self.path);
        let temp_err = |source| JournalError::io(&temp, source);
        let mut bytes = Vec::new();
        for record in records {
            serde_json::to_writer(&mut bytes, record)
                .map_err(|e| JournalError::io(&temp, io::Error::other(e)))?;
            bytes.push(b'\n');
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&temp)
            .map_err(temp_err)?;
        let written = file.write_all(&bytes);
        if stop == Some(CompactStep::Written) {
            return written.map_err(temp_err);
        }
        if let Err(e) = written.and_then(|()| file.sync_all()) {
            drop(file);
            let _ = std::fs::remove_file(&temp);
            return Err(temp_err(e));
        }
        if stop == Some(CompactStep::Synced) {
            return Ok(());
        }
        // Appends go on through this handle, which follows the file through the rename.
        let file = OpenOptions::new()
            .append(true)
            .open(&temp)
            .map_err(temp_err)?;
        if let Err(e) = std::fs::rename(&temp, &self.path) {
            let _ = std::fs::remove_file(&temp);
            return Err(temp_err(e));
        }
        self.file = file;
        self.len = bytes.len() as u64;
        self.dirty = false;
        self.tail = 0;
        if stop == Some(CompactStep::Renamed) {
            return Ok(());
        }
        let dir = self.path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = dir.unwrap_or_else(|| Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| JournalError::io(dir, source))
    }
}

/// Where [`Journal::compact`] writes the snapshot before renaming it over `journal`.
fn compact_path(journal: &Path) -> PathBuf {
    let mut name = journal.as_os_str().to_owned();
    name.push(".compact");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::Basis;
    use crate::job::JobSpec;

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

    #[test]
    fn replay_returns_a_damaged_middle_line_in_its_place_and_reads_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::write(
            &path,
            "{\"event\":\"cancelled\",\"id\":1}\n{\"event\":\"cancelled\",\"id\":4x\n\
             {\"event\":\"released\",\"id\":2}\n",
        )
        .unwrap();
        let (_, replay) = Journal::replay(&path).unwrap();
        assert_eq!(replay.entries.len(), 3);
        assert!(matches!(
            &replay.entries[1],
            Entry::Damaged(Damage { line: 2, id: Some(4), event: Some(e), .. }) if e == "cancelled"
        ));
        assert_eq!(replay.entries[2], Entry::Record(Record::Released { id: 2 }));
    }

    #[test]
    fn a_torn_last_line_is_returned_with_the_job_it_was_about() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::write(
            &path,
            "{\"event\":\"cancelled\",\"id\":1}\n{\"event\":\"submitted\",\"id\":2,\"spec\":{",
        )
        .unwrap();
        let (_, replay) = Journal::replay(&path).unwrap();
        let torn = replay.torn.unwrap();
        assert_eq!((torn.line, torn.id), (2, Some(2)));
        assert!(torn.what_was_lost().contains("submission of job 2"));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"event\":\"cancelled\",\"id\":1}\n"
        );
    }

    #[test]
    fn a_compaction_stopped_at_any_step_leaves_the_old_journal_or_the_new_one_whole() {
        let old: Vec<Record> = (1..=5).map(|id| Record::Cancelled { id }).collect();
        let new = vec![Record::Released { id: 9 }];
        for step in [
            Some(CompactStep::Written),
            Some(CompactStep::Synced),
            Some(CompactStep::Renamed),
            None,
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("journal");
            let (mut j, _) = Journal::open(&path).unwrap();
            for r in &old {
                j.append(r).unwrap();
            }
            j.compact_until(&new, step).unwrap();
            if step.is_none() {
                j.append(&Record::Cancelled { id: 10 }).unwrap();
                assert_eq!(j.tail(), 1);
            }
            drop(j);
            let (_, records) = Journal::open(&path).unwrap();
            match step {
                Some(CompactStep::Written | CompactStep::Synced) => assert_eq!(records, old),
                Some(CompactStep::Renamed) => assert_eq!(records, new),
                None => assert_eq!(records, [new[0].clone(), Record::Cancelled { id: 10 }]),
            }
            assert!(
                !compact_path(&path).exists(),
                "opening removes an unfinished compaction"
            );
        }
    }
}
