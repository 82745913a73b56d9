//! `--record DIR`: the rows of every look, as CSV files that pandas and polars read directly.
//!
//! A recording is a directory holding:
//!
//! | file            | one row per            | row type                          |
//! |-----------------|------------------------|-----------------------------------|
//! | `meta.json`     | (the recording)        | [`Meta`]                          |
//! | `feed.csv`      | feed and look          | [`FeedRow`](crate::series::FeedRow)           |
//! | `consumers.csv` | consumer and look      | [`ConsumerRow`](crate::series::ConsumerRow)   |
//! | `scheduler.csv` | look                   | [`SchedulerRow`](crate::series::SchedulerRow) |
//! | `gpus.csv`      | GPU and look           | [`GpuRow`](crate::series::GpuRow)             |
//! | `jobs.csv`      | job and look           | [`JobRow`](crate::series::JobRow)             |
//! | `report.json`   | (a sweep's end report) | [`SweepReport`](crate::report::SweepReport)   |
//!
//! Each CSV has one header line (the row type's field names), then rows; `time` is Unix
//! seconds; an absent value (`sm_activity` of a GPU that does not expose it) is an empty
//! cell. A CSV file is created at the first row of its kind, so a `serve` recording has no
//! `gpus.csv`. Every file is flushed after every look: a killed process loses at most the
//! look it was writing.
//!
//! **Never appends.** [`Recorder::create`] refuses a directory that already holds any of the
//! files above ([`RecordError::Exists`] names it); a directory that is missing, empty or holds
//! only other files is fine. Record each run into its own directory.
//!
//! ```
//! use ladle_observe::{Rows, Sink, record::Recorder, series::FeedRow};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let mut recorder = Recorder::create(dir.path()).unwrap();
//! recorder.tick(&Rows { time: 1.0, ..Rows::default() });
//! recorder.finish();
//! assert!(dir.path().join("meta.json").exists());
//! // No feed row yet: no feed.csv.
//! assert!(!dir.path().join("feed.csv").exists());
//! ```

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Sink;
use crate::series::{Rows, unix_now};

/// The recording's description file.
pub const META: &str = "meta.json";
/// One row per feed and look.
pub const FEED: &str = "feed.csv";
/// One row per consumer and look.
pub const CONSUMERS: &str = "consumers.csv";
/// One row per look at the scheduler.
pub const SCHEDULER: &str = "scheduler.csv";
/// One row per GPU and look.
pub const GPUS: &str = "gpus.csv";
/// One row per job and look.
pub const JOBS: &str = "jobs.csv";
/// A sweep's end report, written by `ladle sweep --record` when the sweep ends.
pub const REPORT: &str = "report.json";

/// A private pipeline's measured cost beside a recording (`ladle bench baseline --record`),
/// read by `ladle cost`.
pub const BASELINE: &str = "baseline.json";

/// Every file a recording may hold: a directory holding any of them holds a recording.
pub const FILES: [&str; 7] = [META, FEED, CONSUMERS, SCHEDULER, GPUS, JOBS, REPORT];

/// What was recorded (`meta.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The recording process's command line.
    pub command: Vec<String>,
    /// Unix time the recording started, seconds.
    pub start_time: f64,
    /// The ladle version that recorded it.
    pub version: String,
}

impl Meta {
    /// This process, now.
    pub fn now() -> Self {
        Self {
            command: std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            start_time: unix_now(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// Why a recording cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The directory already holds a recording; a recording never appends to another.
    #[error("{} already holds a recording: record into a new or empty directory", .0.display())]
    Exists(PathBuf),
    /// The directory or `meta.json` cannot be made.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One CSV file, created at its first row.
#[derive(Debug)]
struct Table {
    path: PathBuf,
    writer: Option<csv::Writer<BufWriter<File>>>,
}

impl Table {
    fn new(dir: &Path, name: &str) -> Self {
        Self {
            path: dir.join(name),
            writer: None,
        }
    }

    /// Appends `rows` (the header first, in a new file).
    fn write<T: Serialize>(&mut self, rows: &[T]) -> Result<(), String> {
        if rows.is_empty() {
            return Ok(());
        }
        let writer = match &mut self.writer {
            Some(w) => w,
            None => {
                let file = File::options()
                    .write(true)
                    .create_new(true)
                    .open(&self.path)
                    .map_err(|e| format!("{}: {e}", self.path.display()))?;
                self.writer
                    .insert(csv::Writer::from_writer(BufWriter::new(file)))
            }
        };
        for row in rows {
            writer
                .serialize(row)
                .map_err(|e| format!("{}: {e}", self.path.display()))?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        match &mut self.writer {
            Some(w) => w
                .flush()
                .map_err(|e| format!("{}: {e}", self.path.display())),
            None => Ok(()),
        }
    }
}

/// A [`Sink`] writing every look into a recording directory (see the module docs).
#[derive(Debug)]
pub struct Recorder {
    dir: PathBuf,
    feed: Table,
    consumers: Table,
    scheduler: Table,
    gpus: Table,
    jobs: Table,
    /// Writes that failed since the start (each logged, the first with a warning).
    failures: u64,
}

impl Recorder {
    /// Starts a recording in `dir` (made if missing): checks that it holds none, writes
    /// `meta.json` with [`Meta::now`].
    ///
    /// # Errors
    /// [`RecordError::Exists`] when `dir` holds a recording's file; [`RecordError::Io`] when
    /// the directory or `meta.json` cannot be written.
    pub fn create(dir: &Path) -> Result<Self, RecordError> {
        Self::create_with(dir, &Meta::now())
    }

    /// As [`Recorder::create`], with the given description.
    ///
    /// # Errors
    /// As [`Recorder::create`].
    pub fn create_with(dir: &Path, meta: &Meta) -> Result<Self, RecordError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| RecordError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        if let Some(file) = FILES.iter().map(|f| dir.join(f)).find(|p| p.exists()) {
            return Err(RecordError::Exists(file));
        }
        let path = dir.join(META);
        let text = serde_json::to_string_pretty(meta).map_err(|e| RecordError::Io {
            path: path.clone(),
            source: e.into(),
        })?;
        let mut file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path))?;
        std::io::Write::write_all(&mut file, format!("{text}\n").as_bytes()).map_err(io(&path))?;
        Ok(Self {
            dir: dir.to_owned(),
            feed: Table::new(dir, FEED),
            consumers: Table::new(dir, CONSUMERS),
            scheduler: Table::new(dir, SCHEDULER),
            gpus: Table::new(dir, GPUS),
            jobs: Table::new(dir, JOBS),
            failures: 0,
        })
    }

    /// The recording's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes that failed since the start.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    fn failed(&mut self, error: &str) {
        self.failures += 1;
        if self.failures == 1 {
            tracing::warn!(
                "recording {}: {error} (further failures are counted, not logged)",
                self.dir.display()
            );
        } else {
            tracing::debug!("recording {}: {error}", self.dir.display());
        }
    }
}

impl Sink for Recorder {
    fn tick(&mut self, rows: &Rows) {
        let results = [
            self.feed.write(&rows.feeds),
            self.consumers.write(&rows.consumers),
            self.scheduler.write(rows.scheduler.as_slice()),
            self.gpus.write(&rows.gpus),
            self.jobs.write(&rows.jobs),
            self.feed.flush(),
            self.consumers.flush(),
            self.scheduler.flush(),
            self.gpus.flush(),
            self.jobs.flush(),
        ];
        for result in results {
            if let Err(e) = result {
                self.failed(&e);
            }
        }
    }

    fn finish(&mut self) {
        if self.failures > 0 {
            tracing::warn!(
                "recording {}: {} writes failed; the recording is incomplete",
                self.dir.display(),
                self.failures
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::series::{ConsumerRow, FeedRow, GpuRow, JobRow, SchedulerRow};

    fn rows(time: f64) -> Rows {
        Rows {
            gpus_from: None,
            time,
            feeds: vec![FeedRow {
                time,
                feed: "f, with a comma".into(),
                published: 100,
                bad: 1,
                decode_rate: 12.5,
                occupancy: 3,
                capacity: 64,
                consumers: 1,
                joins: 1,
                leaves: 0,
                let_gos: 0,
                cpu_s: 1.25,
                cpu_cores: 0.5,
                dataset_len: 50,
                threads: 2,
                cache_hits: 0,
                cache_misses: 0,
                cache_fills: 0,
            }],
            consumers: vec![ConsumerRow {
                time,
                feed: "f, with a comma".into(),
                id: 1,
                name: "run \"00\"".into(),
                pid: 9,
                batch_size: 8,
                released: 90,
                epochs: 1.8,
                samples_per_s: 10.0,
                lag: 3,
                attached: true,
                held_back_s: 0.0,
                waited_s: 0.0,
                holding_back: false,
                rejoins: 0,
                skimming: false,
            }],
            scheduler: Some(SchedulerRow {
                time,
                policy: "fifo".into(),
                queued: 0,
                running: 1,
                succeeded: 0,
                failed: 0,
                admissions: 1,
                oom_retries: 0,
            }),
            gpus: vec![
                GpuRow {
                    time,
                    gpu: 0,
                    name: "sim".into(),
                    memory_used_mib: 100,
                    memory_total_mib: 1000,
                    utilization: 0.5,
                    sm_activity: None,
                    sm_activity_risk: 0.1,
                    jobs: 1,
                },
                GpuRow {
                    time,
                    gpu: 1,
                    name: "sim".into(),
                    memory_used_mib: 0,
                    memory_total_mib: 1000,
                    utilization: 0.0,
                    sm_activity: Some(0.25),
                    sm_activity_risk: 0.0,
                    jobs: 0,
                },
            ],
            jobs: vec![JobRow {
                time,
                id: 1,
                name: "run-00".into(),
                state: "running".into(),
                gpus: "0+1".into(),
                feed: "f".into(),
                estimate_mib: 100,
                peak_mib: None,
                attempts: 1,
                oom_retries: 0,
            }],
            errors: Vec::new(),
        }
    }

    fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
        csv::Reader::from_path(path)
            .unwrap()
            .deserialize()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn every_look_reads_back_as_the_same_rows_with_one_header_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut recorder = Recorder::create(dir.path()).unwrap();
        let (first, second) = (rows(1.5), rows(2.5));
        recorder.tick(&first);
        // Flushed at every look, before the recorder finishes.
        let feed: Vec<FeedRow> = read(&dir.path().join(FEED));
        assert_eq!(feed, first.feeds);
        recorder.tick(&second);
        recorder.finish();
        assert_eq!(recorder.failures(), 0);

        let feed: Vec<FeedRow> = read(&dir.path().join(FEED));
        assert_eq!(feed, [first.feeds.clone(), second.feeds.clone()].concat());
        let consumers: Vec<ConsumerRow> = read(&dir.path().join(CONSUMERS));
        assert_eq!(
            consumers,
            [first.consumers.clone(), second.consumers.clone()].concat()
        );
        let scheduler: Vec<SchedulerRow> = read(&dir.path().join(SCHEDULER));
        assert_eq!(scheduler.len(), 2);
        let gpus: Vec<GpuRow> = read(&dir.path().join(GPUS));
        assert_eq!(gpus, [first.gpus.clone(), second.gpus.clone()].concat());
        let jobs: Vec<JobRow> = read(&dir.path().join(JOBS));
        assert_eq!(jobs, [first.jobs.clone(), second.jobs.clone()].concat());

        let text = std::fs::read_to_string(dir.path().join(GPUS)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(
            lines[0].starts_with("time,gpu,name,memory_used_mib"),
            "{text}"
        );
        assert_eq!(text.matches("time,").count(), 1, "one header: {text}");
        assert!(
            lines[1].contains(",0.1,1"),
            "None is an empty cell: {}",
            lines[1]
        );
        assert!(
            lines[1].contains(",0.5,,0.1,"),
            "None is an empty cell: {}",
            lines[1]
        );

        let meta: Meta =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(META)).unwrap()).unwrap();
        assert_eq!(meta.version, env!("CARGO_PKG_VERSION"));
        assert!(meta.start_time > 0.0 && !meta.command.is_empty());
    }

    #[test]
    fn a_directory_holding_a_recording_is_refused_and_named() {
        let dir = tempfile::tempdir().unwrap();
        drop(Recorder::create(dir.path()).unwrap());
        let err = Recorder::create(dir.path()).unwrap_err();
        assert!(
            matches!(&err, RecordError::Exists(p) if p.ends_with(META)),
            "{err}"
        );
        assert!(err.to_string().contains("meta.json"), "{err}");

        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join(GPUS), "time\n").unwrap();
        let err = Recorder::create(other.path()).unwrap_err();
        assert!(err.to_string().contains("gpus.csv"), "{err}");

        // Other files are no recording.
        let busy = tempfile::tempdir().unwrap();
        std::fs::write(busy.path().join("notes.txt"), "x").unwrap();
        Recorder::create(busy.path()).unwrap();
        Recorder::create(&busy.path().join("new/nested")).unwrap();
    }

    #[test]
    fn a_write_that_fails_is_counted_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let mut recorder = Recorder::create(dir.path()).unwrap();
        // Someone else's file where feed.csv would go: create_new fails.
        std::fs::write(dir.path().join(FEED), "not ours\n").unwrap();
        recorder.tick(&rows(1.0));
        recorder.tick(&rows(2.0));
        assert_eq!(recorder.failures(), 2);
        recorder.finish();
        // The other files were written.
        let gpus: Vec<GpuRow> = read(&dir.path().join(GPUS));
        assert_eq!(gpus.len(), 4);
    }
}
