//! A recording read back (`ladle report DIR`), summarised, and the sweep's end report that
//! `ladle sweep` prints and writes into its recording.
//!
//! [`Recording::read`] reads each file of a recording (see [`crate::record`]) that is
//! there: a missing file is `None` (its plot is skipped), a malformed one is a
//! [`ReportError::Malformed`] naming the file and the line, except a last row cut short (a
//! recorder killed mid-write: the file does not end with a newline), which is left out.
//! [`Summary::of`] is what
//! `ladle report` prints and writes as `summary.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::record::{self, Meta};
use crate::series::{ConsumerRow, FeedRow, GpuRow, JobRow, SchedulerRow};

/// `ladle sweep`'s end report: what it prints (`--json`) and writes as `report.json` into
/// its recording (`--record`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// Every run, in the sweep's order.
    pub runs: Vec<RunReport>,
    /// The sweep's feed.
    pub feed: FeedReport,
    /// Seconds from the sweep's start to its end.
    pub wall_seconds: f64,
    /// CPU core-seconds of the sweep process and its runs.
    pub cpu_seconds: f64,
    /// What the sweep cost, and what private pipelines would have.
    pub cost: Cost,
    /// The nodes of a sweep run over several nodes (`ladle sweep --slurm`, or shards merged
    /// by `ladle report --merge`), each with its own feed; empty for a sweep on one machine.
    /// `feed` then sums the nodes' feeds (its `socket` is empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeReport>,
}

/// One node of a sweep over several nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The node's name (`SLURMD_NODENAME` under Slurm; `shard-K` for a shard run by hand).
    pub name: String,
    /// Its feed, as a one-machine sweep reports it; `None` when the node never reported
    /// (lost before its end: see `lost`).
    pub feed: Option<FeedReport>,
    /// The runs it was given, by name.
    pub runs: Vec<String>,
    /// Why the node's part did not end: it was lost mid-sweep (`None` when it reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
    /// The Slurm job it ran in: a resumed sweep lists each job's part of a node apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

/// One run of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// `run-00`, … (its `LADLE_RUN`).
    pub name: String,
    /// Its command.
    pub args: Vec<String>,
    /// Its job's last state.
    pub state: String,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Why it failed or was interrupted.
    pub reason: Option<String>,
    /// Its stdout log.
    pub log: Option<PathBuf>,
    /// Its stderr log.
    pub stderr_log: Option<PathBuf>,
    /// Seconds it ran.
    pub seconds: Option<f64>,
    /// The GPUs it ran on.
    pub gpu: Vec<u32>,
    /// The last lines of a failed run's stderr.
    pub last_lines: Vec<String>,
    /// The node it ran on, in a sweep over several nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// CPU seconds its process and the children it waited for used, as the scheduler that
    /// reaped it measured (none from a scheduler restarted while it ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Its earlier attempts, oldest first, when it ran in more than one Slurm job (a resumed
    /// sweep): each with its own logs. The fields above are the attempt that stands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<RunAttempt>,
}

/// One earlier attempt of a run (see [`RunReport::attempts`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunAttempt {
    /// The Slurm job it ran in.
    pub job: Option<String>,
    /// The node it ran on.
    pub node: Option<String>,
    /// How it ended (`failed`, `lost`, ...).
    pub state: String,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Why it failed or was interrupted.
    pub reason: Option<String>,
    /// Its stdout log.
    pub log: Option<PathBuf>,
    /// Its stderr log.
    pub stderr_log: Option<PathBuf>,
    /// Seconds it ran.
    pub seconds: Option<f64>,
}

/// A sweep's feed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedReport {
    /// Its socket.
    pub socket: PathBuf,
    /// The sweep used a feed that was already serving (its counts are then not the sweep's:
    /// 0 here).
    pub reused: bool,
    /// Samples decoded.
    pub samples_published: u64,
    /// Samples the runs released, summed over runs: what private pipelines would have decoded.
    pub samples_consumed: u64,
    /// Samples that could not be decoded.
    pub bad_samples: u64,
    /// CPU time of the feed's decode threads (before protocol version 9: of the whole sweep
    /// process, its private scheduler included).
    pub cpu_seconds: f64,
}

/// A sweep's cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// CPU core-seconds of the feed and every run (the runs' only with a private scheduler,
    /// whose children they are).
    pub cpu_seconds: f64,
    /// GPU-hours of the runs.
    pub gpu_hours: f64,
    /// The price of `cpu_seconds` and `gpu_hours`, when prices were given.
    pub dollars: Option<f64>,
    /// The same runs each with a private pipeline: the runs' own CPU time plus the feed's
    /// measured decode cost per sample times the samples they consumed.
    pub private_pipelines_cpu_seconds: f64,
    /// Its price, when prices were given: the private pipelines' CPU, and the GPU-hours of
    /// runs that would have taken `private_pipelines_wall_seconds`.
    pub private_pipelines_dollars: Option<f64>,
    /// How long the sweep would have taken with private pipelines on the same cores: its
    /// measured wall time, or longer when the runs' own CPU and their private decoding need
    /// more than the cores give in that time (the cost model's CPU side:
    /// `ladle_observe::cost`).
    #[serde(default)]
    pub private_pipelines_wall_seconds: Option<f64>,
    /// The runs' GPU-hours at that wall time.
    #[serde(default)]
    pub private_pipelines_gpu_hours: Option<f64>,
}

/// Why a recording cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The directory holds no recording (no `meta.json` and no CSV file).
    #[error("{} holds no recording (no meta.json, no CSV file): record one with --record DIR", .0.display())]
    NoRecording(PathBuf),
    /// A file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not what ladle writes there.
    #[error("{}:{line}: {message}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Its line, 1-based (0 where not known).
        line: u64,
        /// What is wrong.
        message: String,
    },
}

/// A recording read back; a file that is not there is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    /// Its directory.
    pub dir: PathBuf,
    /// `meta.json`.
    pub meta: Option<Meta>,
    /// `feed.csv`.
    pub feed: Option<Vec<FeedRow>>,
    /// `consumers.csv`.
    pub consumers: Option<Vec<ConsumerRow>>,
    /// `scheduler.csv`.
    pub scheduler: Option<Vec<SchedulerRow>>,
    /// `gpus.csv`.
    pub gpus: Option<Vec<GpuRow>>,
    /// `jobs.csv`.
    pub jobs: Option<Vec<JobRow>>,
    /// `report.json` (a sweep's).
    pub report: Option<SweepReport>,
}

/// Reads one CSV file into rows; `None` when it is not there.
fn read_csv<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<Vec<T>>, ReportError> {
    let path = dir.join(name);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ReportError::Io { path, source }),
    };
    // The recorder ends every row with a newline: a file that does not end with one was cut
    // short (a recorder killed mid-write, a full disk), and its last row is dropped rather
    // than failing the whole report or reading a cut number.
    let cut_short = !ends_with_newline(&file).map_err(|source| ReportError::Io {
        path: path.clone(),
        source,
    })?;
    let mut rows = Vec::new();
    let mut records = csv::Reader::from_reader(std::io::BufReader::new(file))
        .into_deserialize()
        .peekable();
    while let Some(row) = records.next() {
        if cut_short && records.peek().is_none() {
            tracing::warn!(
                "{}: the last row was cut short (a recorder killed while writing?); left out",
                path.display()
            );
            break;
        }
        rows.push(row.map_err(|e| malformed(&path, &e))?);
    }
    Ok(Some(rows))
}

/// Whether `file` is empty or its last byte is a newline.
fn ends_with_newline(mut file: &std::fs::File) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    if file.metadata()?.len() == 0 {
        return Ok(true);
    }
    file.seek(SeekFrom::End(-1))?;
    let mut last = [0_u8];
    file.read_exact(&mut last)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(last[0] == b'\n')
}

fn malformed(path: &Path, e: &csv::Error) -> ReportError {
    if let csv::ErrorKind::Io(io) = e.kind() {
        return ReportError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(io.kind(), io.to_string()),
        };
    }
    let message = match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(field) => format!("field {}: {}", field + 1, err.kind()),
            None => err.kind().to_string(),
        },
        _ => e.to_string(),
    };
    ReportError::Malformed {
        path: path.to_owned(),
        line: e.position().map_or(0, csv::Position::line),
        message,
    }
}

fn read_json<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, ReportError> {
    let path = dir.join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ReportError::Io { path, source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ReportError::Malformed {
            path,
            line: u64::try_from(e.line()).unwrap_or(0),
            message: e.to_string(),
        })
}

impl Recording {
    /// Reads every file of the recording in `dir` that is there.
    ///
    /// # Errors
    /// [`ReportError::NoRecording`] when `dir` holds none of its files; a file that cannot be
    /// read or is malformed ([`ReportError::Malformed`] names it and the line).
    pub fn read(dir: &Path) -> Result<Self, ReportError> {
        let recording = Self {
            dir: dir.to_owned(),
            meta: read_json(dir, record::META)?,
            feed: read_csv(dir, record::FEED)?,
            consumers: read_csv(dir, record::CONSUMERS)?,
            scheduler: read_csv(dir, record::SCHEDULER)?,
            gpus: read_csv(dir, record::GPUS)?,
            jobs: read_csv(dir, record::JOBS)?,
            report: read_json(dir, record::REPORT)?,
        };
        if recording.meta.is_none()
            && recording.feed.is_none()
            && recording.consumers.is_none()
            && recording.scheduler.is_none()
            && recording.gpus.is_none()
            && recording.jobs.is_none()
        {
            return Err(ReportError::NoRecording(dir.to_owned()));
        }
        Ok(recording)
    }

    /// Unix time of the recording's start: `meta.json`'s, else its first row's.
    pub fn start_time(&self) -> f64 {
        if let Some(meta) = &self.meta {
            return meta.start_time;
        }
        let first = self.times().fold(f64::INFINITY, f64::min);
        if first.is_finite() { first } else { 0.0 }
    }

    /// Unix time of its last row (its start when it has none).
    pub fn end_time(&self) -> f64 {
        self.times().fold(self.start_time(), f64::max)
    }

    fn times(&self) -> impl Iterator<Item = f64> + '_ {
        (self.feed.iter().flatten().map(|r| r.time))
            .chain(self.consumers.iter().flatten().map(|r| r.time))
            .chain(self.scheduler.iter().flatten().map(|r| r.time))
            .chain(self.gpus.iter().flatten().map(|r| r.time))
            .chain(self.jobs.iter().flatten().map(|r| r.time))
            // A time that is not a number or infinite (a hand-edited file) is no time.
            .filter(|t| t.is_finite())
    }

    /// Each consumer's rows by name (a run that rejoined is one), in time order.
    pub fn consumers_by_name(&self) -> BTreeMap<&str, Vec<&ConsumerRow>> {
        let mut by: BTreeMap<&str, Vec<&ConsumerRow>> = BTreeMap::new();
        for row in self.consumers.iter().flatten() {
            by.entry(row.name.as_str()).or_default().push(row);
        }
        by
    }

    /// Each GPU's rows by index, in time order.
    pub fn gpus_by_index(&self) -> BTreeMap<u32, Vec<&GpuRow>> {
        let mut by: BTreeMap<u32, Vec<&GpuRow>> = BTreeMap::new();
        for row in self.gpus.iter().flatten() {
            by.entry(row.gpu).or_default().push(row);
        }
        by
    }
}

/// One run (consumer name) of a recording.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    /// The consumer's name (a sweep's `run-00`).
    pub name: String,
    /// Samples it released over the seconds it was seen, per second.
    pub mean_samples_per_s: f64,
    /// The most epochs it was seen to have completed (a run that ends between two looks has
    /// done a little more).
    pub epochs: f64,
    /// The highest device memory its job was seen to use, MiB (from `jobs.csv`).
    pub peak_gpu_mib: Option<u64>,
    /// Its job's memory estimate per GPU, MiB (from `jobs.csv`): what was reserved where no
    /// peak was measured (simulated GPUs).
    pub estimate_mib: Option<u64>,
    /// Its job's last state: the sweep's report's when there is one, else the last seen.
    pub state: Option<String>,
}

/// One GPU of a recording.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSummary {
    /// NVML index.
    pub gpu: u32,
    /// Product name.
    pub name: String,
    /// Highest device memory in use, MiB.
    pub peak_memory_mib: u64,
    /// Its memory in all, MiB.
    pub memory_total_mib: u64,
    /// Mean SM activity (else utilisation), 0 – 1.
    pub mean_activity: f64,
}

/// What `ladle report` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Seconds from the recording's start to its last row.
    pub duration_s: f64,
    /// Samples the feeds decoded while recorded (last count less first, over feeds).
    pub samples_decoded: u64,
    /// `samples_decoded` over the seconds the feeds were seen.
    pub mean_decode_rate: f64,
    /// Every consumer, by name.
    pub runs: Vec<RunSummary>,
    /// Every GPU.
    pub gpus: Vec<GpuSummary>,
    /// A sweep's CPU-seconds, and those private pipelines would have needed.
    pub cpu_seconds: Option<(f64, f64)>,
    /// A sweep's dollars, and private pipelines', when priced.
    pub dollars: Option<(f64, f64)>,
}

impl Summary {
    /// Summarises `recording`.
    pub fn of(recording: &Recording) -> Self {
        let mut samples_decoded = 0;
        let mut feed_seconds = 0.0_f64;
        let mut feeds: BTreeMap<&str, Vec<&FeedRow>> = BTreeMap::new();
        for row in recording.feed.iter().flatten() {
            feeds.entry(row.feed.as_str()).or_default().push(row);
        }
        for rows in feeds.values() {
            if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
                samples_decoded += last.published.saturating_sub(first.published);
                feed_seconds = feed_seconds.max(last.time - first.time);
            }
        }
        let mut last_job: BTreeMap<&str, &JobRow> = BTreeMap::new();
        let mut peak_job: BTreeMap<&str, u64> = BTreeMap::new();
        for job in recording.jobs.iter().flatten() {
            last_job.insert(job.name.as_str(), job);
            if let Some(peak) = job.peak_mib {
                let p = peak_job.entry(job.name.as_str()).or_default();
                *p = (*p).max(peak);
            }
        }
        // A run that ended between two looks was last seen running: the report knows.
        let ended: BTreeMap<&str, &str> = recording
            .report
            .iter()
            .flat_map(|r| &r.runs)
            .map(|r| (r.name.as_str(), r.state.as_str()))
            .collect();
        let runs = recording
            .consumers_by_name()
            .into_iter()
            .map(|(name, rows)| {
                // Per consumer id (a rejoin is a new id): released over the seconds seen.
                let mut by_id: BTreeMap<u64, (f64, u64, f64, u64)> = BTreeMap::new();
                for r in &rows {
                    let e = by_id
                        .entry(r.id)
                        .or_insert((r.time, r.released, r.time, r.released));
                    (e.2, e.3) = (r.time, r.released);
                }
                let (seconds, released) = by_id.values().fold((0.0, 0), |(s, n), e| {
                    (s + (e.2 - e.0), n + e.3.saturating_sub(e.1))
                });
                RunSummary {
                    name: name.to_owned(),
                    mean_samples_per_s: if seconds > 0.0 {
                        released as f64 / seconds
                    } else {
                        0.0
                    },
                    epochs: rows.iter().map(|r| r.epochs).fold(0.0, f64::max),
                    peak_gpu_mib: peak_job.get(name).copied(),
                    estimate_mib: last_job.get(name).map(|j| j.estimate_mib),
                    state: ended
                        .get(name)
                        .map(|s| (*s).to_owned())
                        .or_else(|| last_job.get(name).map(|j| j.state.clone())),
                }
            })
            .collect();
        let gpus = recording
            .gpus_by_index()
            .into_iter()
            .filter_map(|(gpu, rows)| {
                let last = rows.last()?;
                let activity: f64 = rows
                    .iter()
                    .map(|r| r.sm_activity.unwrap_or(r.utilization))
                    .sum();
                Some(GpuSummary {
                    gpu,
                    name: last.name.clone(),
                    peak_memory_mib: rows.iter().map(|r| r.memory_used_mib).max().unwrap_or(0),
                    memory_total_mib: last.memory_total_mib,
                    mean_activity: activity / rows.len() as f64,
                })
            })
            .collect();
        let cost = recording.report.as_ref().map(|r| &r.cost);
        Self {
            duration_s: recording.end_time() - recording.start_time(),
            samples_decoded,
            mean_decode_rate: if feed_seconds > 0.0 {
                samples_decoded as f64 / feed_seconds
            } else {
                0.0
            },
            runs,
            gpus,
            cpu_seconds: cost.map(|c| (c.cpu_seconds, c.private_pipelines_cpu_seconds)),
            dollars: cost.and_then(|c| c.dollars.zip(c.private_pipelines_dollars)),
        }
    }

    /// The summary as Markdown (`summary.md`; also what `ladle report` prints).
    pub fn markdown(&self, recording: &Recording) -> String {
        /// Text for one table cell: a `|` or a line break in a name would end the cell or
        /// the row.
        fn cell(text: &str) -> String {
            text.replace('|', "\\|").replace(['\n', '\r'], " ")
        }
        let mut out = String::from("# ladle recording\n\n");
        out.push_str(&format!("- directory: `{}`\n", recording.dir.display()));
        if let Some(meta) = &recording.meta {
            out.push_str(&format!(
                "- recorded by: `{}` (ladle {})\n",
                meta.command.join(" "),
                meta.version
            ));
        }
        out.push_str(&format!("- duration: {:.1} s\n", self.duration_s));
        out.push_str(&format!(
            "- samples decoded: {} (mean {:.0} samples/s)\n",
            self.samples_decoded, self.mean_decode_rate
        ));
        if let Some((sweep, private)) = self.cpu_seconds {
            out.push_str(&format!(
                "- CPU: {sweep:.1} CPU-s for the sweep, about {private:.1} CPU-s with private \
                 pipelines: {:.1} CPU-s saved\n",
                private - sweep
            ));
        }
        if let Some((sweep, private)) = self.dollars {
            out.push_str(&format!(
                "- dollars: {sweep:.4} (private pipelines: about {private:.4})\n"
            ));
        }
        if !self.runs.is_empty() {
            // Epochs as the last look saw them: a run that ends between two looks shows a
            // little less than it read (its own log has the exact count).
            out.push_str(
                "\n| run | mean samples/s | epochs (last look) | peak GPU memory | state |\n",
            );
            out.push_str("|---|---:|---:|---:|---|\n");
            for r in &self.runs {
                out.push_str(&format!(
                    "| {} | {:.0} | {:.2} | {} | {} |\n",
                    cell(&r.name),
                    r.mean_samples_per_s,
                    r.epochs,
                    match (r.peak_gpu_mib, r.estimate_mib) {
                        (Some(m), _) => format!("{m} MiB"),
                        (None, Some(e)) => format!("- (estimate {e} MiB)"),
                        (None, None) => "-".to_owned(),
                    },
                    cell(r.state.as_deref().unwrap_or("-"))
                ));
            }
        }
        if !self.gpus.is_empty() {
            out.push_str("\n| GPU | name | peak memory | of | mean SM activity |\n");
            out.push_str("|---:|---|---:|---:|---:|\n");
            for g in &self.gpus {
                out.push_str(&format!(
                    "| {} | {} | {} MiB | {} MiB | {:.0} % |\n",
                    g.gpu,
                    cell(&g.name),
                    g.peak_memory_mib,
                    g.memory_total_mib,
                    g.mean_activity * 100.0
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const HEADER: &str = "time,gpu,name,memory_used_mib,memory_total_mib,utilization,\
                          sm_activity,sm_activity_risk,jobs\n";

    #[test]
    fn a_malformed_csv_is_an_error_naming_the_file_and_the_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("gpus.csv"),
            format!("{HEADER}1.0,0,sim,10,100,0.5,,0.1,1\n2.0,0,sim,lots,100,0.5,,0.1,1\n"),
        )
        .unwrap();
        let err = Recording::read(dir.path()).unwrap_err();
        let ReportError::Malformed { path, line, .. } = &err else {
            panic!("{err}");
        };
        assert!(path.ends_with("gpus.csv"));
        assert_eq!(*line, 3, "{err}");
        let text = err.to_string();
        assert!(text.contains("gpus.csv:3:"), "{text}");
    }

    #[test]
    fn a_last_row_cut_short_by_a_killed_recorder_is_left_out_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let whole = "1.0,0,sim,10,100,0.5,,0.1,1\n";
        // Cut inside a number (it would parse, wrongly, as 10), and cut with fields missing.
        for cut in ["2.0,0,sim,10", "2.0,0,s"] {
            std::fs::write(dir.path().join("gpus.csv"), format!("{HEADER}{whole}{cut}")).unwrap();
            let recording = Recording::read(dir.path()).unwrap();
            let gpus = recording.gpus.unwrap();
            assert_eq!(gpus.len(), 1, "{cut}");
            assert_eq!(gpus[0].time, 1.0);
        }
        // Cut in the header, or empty: no rows, no error.
        for text in ["time,gpu,na", ""] {
            std::fs::write(dir.path().join("gpus.csv"), text).unwrap();
            let recording = Recording::read(dir.path()).unwrap();
            assert_eq!(recording.gpus, Some(Vec::new()), "{text:?}");
        }
        // A complete file keeps its last row.
        std::fs::write(dir.path().join("gpus.csv"), format!("{HEADER}{whole}")).unwrap();
        assert_eq!(Recording::read(dir.path()).unwrap().gpus.unwrap().len(), 1);
    }

    #[test]
    fn a_name_with_a_bar_or_a_line_break_stays_in_its_table_cell() {
        let summary = Summary {
            duration_s: 1.0,
            samples_decoded: 1,
            mean_decode_rate: 1.0,
            runs: vec![RunSummary {
                name: "run|x\n| evil | row |".into(),
                mean_samples_per_s: 1.0,
                epochs: 1.0,
                peak_gpu_mib: None,
                estimate_mib: None,
                state: Some("failed|\r\n".into()),
            }],
            gpus: Vec::new(),
            cpu_seconds: None,
            dollars: None,
        };
        let text = summary.markdown(&Recording::default());
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| run")).collect();
        assert_eq!(rows.len(), 2, "{text}"); // the header and the one run
        // Unescaped bars: 6 per row of 5 cells.
        let bars = rows[1].replace("\\|", "").matches('|').count();
        assert_eq!(bars, 6, "{}", rows[1]);
    }

    #[test]
    fn a_missing_file_is_none_and_an_empty_directory_no_recording() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Recording::read(dir.path()),
            Err(ReportError::NoRecording(_))
        ));
        std::fs::write(
            dir.path().join("gpus.csv"),
            format!("{HEADER}1.0,0,sim,10,100,0.5,,0.1,1\n3.0,0,sim,30,100,0.5,0.25,0.1,1\n"),
        )
        .unwrap();
        let recording = Recording::read(dir.path()).unwrap();
        assert!(recording.feed.is_none() && recording.report.is_none());
        let summary = Summary::of(&recording);
        assert_eq!(summary.duration_s, 2.0);
        assert_eq!(summary.gpus[0].peak_memory_mib, 30);
        assert_eq!(summary.gpus[0].mean_activity, 0.375);
        assert!(
            summary
                .markdown(&recording)
                .contains("| 0 | sim | 30 MiB |")
        );
    }
}
