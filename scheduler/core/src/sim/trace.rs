//! Trace files: one job per CSV row. Here the text ([`parse`], [`format`](fn@format)) and
//! the errors that name a file ([`TraceError`]); the file is read and written by
//! `ladle_scheduler::sim::trace::{read, write}` (the daemon's crate keeps the file I/O).
//!
//! ```text
//! job_id,submit_s,duration_s,mem_mib,sm_activity,gpus[,feed][,declared][,family]
//! j001,0.0,42.5,900,0.12,1
//! ```
//! - `submit_s`: arrival, seconds from the trace's start;
//! - `duration_s`: run time when the job has its GPUs to itself;
//! - `mem_mib`: peak device memory **per GPU**, MiB (the honest estimate);
//! - `sm_activity`: SM demand when alone, 0 – 1;
//! - `gpus`: GPUs it needs at once;
//! - `feed` (optional column): the producer feed it consumes;
//! - `declared` (optional column, `true`/`false`, default `true`): whether the job declares
//!   its memory (`mem_mib × estimate_scale`, see [`super::SimConfig::estimate_scale`]). An
//!   undeclared job gets the scheduler's default guess
//!   ([`super::SimConfig::default_estimate_mib`], 4096 MiB as the daemon's), or, under a
//!   policy with learned estimates, its family's measured peak;
//! - `family` (optional column): its family (the runs of one sweep share one; see
//!   [`crate::estimate`]); empty or absent: a family of its own.
//!
//! The optional columns may come in any order after the six required ones; a trace
//! without them reads as before (everything declared, no families).
//!
//! ## Bounds
//! Every value must be finite and in range, or the trace is refused with an error naming
//! the line and the job ([`TraceJob::validate`], which the simulator applies too):
//!
//! | field         | range                                            |
//! |---------------|--------------------------------------------------|
//! | `submit_s`    | 0 – [`MAX_SUBMIT_S`] (10⁹ s, about 32 years)     |
//! | `duration_s`  | above 0, at most [`MAX_DURATION_S`] (10⁹ s)      |
//! | `mem_mib`     | 0 – [`MAX_MIB`] (16 TiB)                         |
//! | `sm_activity` | 0 – 1                                            |
//! | `gpus`        | at least 1 (and at most the simulated machine's) |
//!
//! The simulator's clock is an `f64` of seconds. Bounded inputs keep it where a one-second
//! telemetry tick and a job's last fraction of a second are still resolved (below 10¹² s its
//! resolution is finer than a millisecond); `submit_s = 1e300` would leave a clock that
//! cannot move by one second, and a simulation that never ends.

use std::path::{Path, PathBuf};

use ladle_scheduler_protocol::units::MAX_MIB;

/// Latest arrival a trace may state, seconds from its start (about 32 years).
pub const MAX_SUBMIT_S: f64 = 1e9;

/// Longest run time a trace may state, seconds (about 32 years).
pub const MAX_DURATION_S: f64 = 1e9;

/// One job of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    /// Name from the trace.
    pub id: String,
    /// Arrival, seconds.
    pub submit_s: f64,
    /// Run time alone, seconds.
    pub duration_s: f64,
    /// Peak memory per GPU, MiB.
    pub mem_mib: u64,
    /// SM demand alone, 0 – 1.
    pub sm_activity: f64,
    /// GPUs needed.
    pub gpus: u32,
    /// Feed consumed, if any.
    pub feed: Option<String>,
    /// Whether it declares its memory (default `true`).
    pub declared: bool,
    /// Its family, if it shares one.
    pub family: Option<String>,
}

impl Default for TraceJob {
    /// A declared one-GPU job named `j`, arriving at 0, of one second, no memory or load.
    fn default() -> Self {
        Self {
            id: "j".to_owned(),
            submit_s: 0.0,
            duration_s: 1.0,
            mem_mib: 0,
            sm_activity: 0.0,
            gpus: 1,
            feed: None,
            declared: true,
            family: None,
        }
    }
}

impl TraceJob {
    /// Checks the job's values against the bounds of the module docs.
    ///
    /// # Errors
    /// [`JobError`] naming the job and the value out of range.
    pub fn validate(&self) -> Result<(), JobError> {
        let job = || self.id.clone();
        if !(self.submit_s.is_finite() && (0.0..=MAX_SUBMIT_S).contains(&self.submit_s)) {
            return Err(JobError::SubmitOutOfRange {
                job: job(),
                value: self.submit_s,
            });
        }
        if !(self.duration_s.is_finite()
            && self.duration_s > 0.0
            && self.duration_s <= MAX_DURATION_S)
        {
            return Err(JobError::DurationOutOfRange {
                job: job(),
                value: self.duration_s,
            });
        }
        if self.mem_mib > MAX_MIB {
            return Err(JobError::MemoryOutOfRange {
                job: job(),
                value: self.mem_mib,
            });
        }
        if !(0.0..=1.0).contains(&self.sm_activity) {
            return Err(JobError::SmActivityOutOfRange {
                job: job(),
                value: self.sm_activity,
            });
        }
        if self.gpus == 0 {
            return Err(JobError::NoGpus { job: job() });
        }
        Ok(())
    }
}

/// A trace job with a value out of range (see the module docs' bounds).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// `submit_s` is not finite or outside 0 – [`MAX_SUBMIT_S`].
    #[error("job {job:?}: submit_s {value:?} is out of range (0 to {MAX_SUBMIT_S:e} s)")]
    SubmitOutOfRange {
        /// The job's name.
        job: String,
        /// The value given.
        value: f64,
    },
    /// `duration_s` is not finite, not positive, or above [`MAX_DURATION_S`].
    #[error(
        "job {job:?}: duration_s {value:?} is out of range (above 0, at most {MAX_DURATION_S:e} s)"
    )]
    DurationOutOfRange {
        /// The job's name.
        job: String,
        /// The value given.
        value: f64,
    },
    /// `mem_mib` is above [`MAX_MIB`].
    #[error("job {job:?}: mem_mib {value} is out of range (at most {MAX_MIB}, 16 TiB)")]
    MemoryOutOfRange {
        /// The job's name.
        job: String,
        /// The value given.
        value: u64,
    },
    /// `sm_activity` is not within 0 – 1.
    #[error("job {job:?}: sm_activity {value:?} is out of range (0 to 1)")]
    SmActivityOutOfRange {
        /// The job's name.
        job: String,
        /// The value given.
        value: f64,
    },
    /// `gpus` is 0.
    #[error("job {job:?}: gpus must be at least 1")]
    NoGpus {
        /// The job's name.
        job: String,
    },
}

/// A trace that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be read or written.
    #[error("cannot access trace {path}: {source}")]
    Io {
        /// The trace file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The header row is not the expected one.
    #[error(
        "trace {path}: the header must be `{expected}` (then optionally `feed`, `declared`, `family`, each once), found `{found}`"
    )]
    Header {
        /// The trace file.
        path: PathBuf,
        /// The header expected.
        expected: &'static str,
        /// The header found.
        found: String,
    },
    /// A row is malformed.
    #[error("trace {path} line {line}: {reason}")]
    Row {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The trace has no jobs.
    #[error("trace {path} has no jobs")]
    Empty {
        /// The trace file.
        path: PathBuf,
    },
}

/// The header row.
pub const HEADER: &str = "job_id,submit_s,duration_s,mem_mib,sm_activity,gpus";

/// Why a trace text did not parse (the file-free half of [`TraceError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// Wrong header (the header found).
    Header(String),
    /// A bad row (1-based line, reason).
    Row(usize, String),
    /// No rows.
    Empty,
}

impl ParseError {
    /// This error as the trace file at `path` has it, naming the file.
    pub fn in_file(self, path: &Path) -> TraceError {
        match self {
            Self::Header(found) => TraceError::Header {
                path: path.to_owned(),
                expected: HEADER,
                found,
            },
            Self::Row(line, reason) => TraceError::Row {
                path: path.to_owned(),
                line,
                reason,
            },
            Self::Empty => TraceError::Empty {
                path: path.to_owned(),
            },
        }
    }
}

/// Parses trace text (see the module docs for the format). Blank lines and lines starting
/// with `#` are skipped.
///
/// # Errors
/// [`ParseError`] for a wrong header, a bad row or no rows.
pub fn parse(text: &str) -> Result<Vec<TraceJob>, ParseError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let header = lines.next().map(|(_, l)| l).unwrap_or_default();
    let Some(extra) = header.strip_prefix(HEADER) else {
        return Err(ParseError::Header(header.to_owned()));
    };
    let extra: Vec<&str> = match extra {
        "" => Vec::new(),
        rest => match rest.strip_prefix(',') {
            Some(rest) => rest.split(',').map(str::trim).collect(),
            None => return Err(ParseError::Header(header.to_owned())),
        },
    };
    let column = |name: &str| extra.iter().position(|c| *c == name).map(|i| 6 + i);
    let known = extra
        .iter()
        .all(|c| matches!(*c, "feed" | "declared" | "family"));
    let unique = (1..extra.len()).all(|i| !extra[..i].contains(&extra[i]));
    if !(known && unique) {
        return Err(ParseError::Header(header.to_owned()));
    }
    let (feed_at, declared_at, family_at) = (column("feed"), column("declared"), column("family"));
    let mut jobs = Vec::new();
    for (line, row) in lines {
        let bad = |reason: String| ParseError::Row(line, reason);
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        let want = 6 + extra.len();
        if fields.len() != want {
            return Err(bad(format!(
                "expected {want} fields, found {}",
                fields.len()
            )));
        }
        let number = |i: usize, name: &str| -> Result<f64, ParseError> {
            match fields[i].parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
                _ => Err(bad(format!("{name} {:?} is not a number ≥ 0", fields[i]))),
            }
        };
        let text = |at: Option<usize>| {
            at.map(|i| fields[i].to_owned())
                .filter(|f: &String| !f.is_empty())
        };
        let declared = match declared_at.map(|i| fields[i]) {
            None | Some("" | "true" | "1" | "yes") => true,
            Some("false" | "0" | "no") => false,
            Some(other) => return Err(bad(format!("declared {other:?} is not true or false"))),
        };
        let job =
            TraceJob {
                id: fields[0].to_owned(),
                submit_s: number(1, "submit_s")?,
                duration_s: number(2, "duration_s")?,
                mem_mib: fields[3]
                    .parse()
                    .map_err(|_| bad(format!("mem_mib {:?} is not a whole number", fields[3])))?,
                sm_activity: number(4, "sm_activity")?,
                gpus: fields[5].parse().ok().filter(|&g| g >= 1).ok_or_else(|| {
                    bad(format!("gpus {:?} is not a whole number ≥ 1", fields[5]))
                })?,
                feed: text(feed_at),
                declared,
                family: text(family_at),
            };
        job.validate().map_err(|e| bad(e.to_string()))?;
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(ParseError::Empty);
    }
    Ok(jobs)
}

/// Formats jobs as trace text, with each optional column (`feed`, `declared`, `family`)
/// only when some job needs it.
pub fn format(jobs: &[TraceJob]) -> String {
    let with_feed = jobs.iter().any(|j| j.feed.is_some());
    let with_declared = jobs.iter().any(|j| !j.declared);
    let with_family = jobs.iter().any(|j| j.family.is_some());
    let mut out = String::from(HEADER);
    for (on, name) in [
        (with_feed, ",feed"),
        (with_declared, ",declared"),
        (with_family, ",family"),
    ] {
        if on {
            out.push_str(name);
        }
    }
    out.push('\n');
    for j in jobs {
        out.push_str(&format!(
            "{},{:.1},{:.1},{},{:.3},{}",
            j.id, j.submit_s, j.duration_s, j.mem_mib, j.sm_activity, j.gpus
        ));
        if with_feed {
            out.push(',');
            out.push_str(j.feed.as_deref().unwrap_or(""));
        }
        if with_declared {
            out.push_str(if j.declared { ",true" } else { ",false" });
        }
        if with_family {
            out.push(',');
            out.push_str(j.family.as_deref().unwrap_or(""));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_round_trips_through_text() {
        let jobs = vec![TraceJob {
            id: "a".to_owned(),
            submit_s: 1.5,
            duration_s: 60.0,
            mem_mib: 2048,
            sm_activity: 0.25,
            gpus: 2,
            feed: Some("imagenet".to_owned()),
            ..TraceJob::default()
        }];
        assert_eq!(parse(&format(&jobs)).unwrap(), jobs);
        let sweep = vec![
            TraceJob {
                declared: false,
                family: Some("sweep".to_owned()),
                ..jobs[0].clone()
            },
            TraceJob {
                id: "b".to_owned(),
                ..jobs[0].clone()
            },
        ];
        let text = format(&sweep);
        assert!(text.starts_with(&format!("{HEADER},feed,declared,family\n")));
        assert_eq!(parse(&text).unwrap(), sweep);
    }

    #[test]
    fn optional_columns_come_in_any_order_and_default_to_declared_without_a_family() {
        let text =
            format!("{HEADER},family,declared\na,0,10,100,0.5,1,f,false\nb,0,10,100,0.5,1,,\n");
        let jobs = parse(&text).unwrap();
        assert_eq!(
            (jobs[0].declared, jobs[0].family.as_deref()),
            (false, Some("f"))
        );
        assert_eq!((jobs[1].declared, jobs[1].family.as_deref()), (true, None));
        assert!(matches!(
            parse(&format!(
                "{HEADER},declared,declared\na,0,10,100,0.5,1,true,true\n"
            )),
            Err(ParseError::Header(_))
        ));
        assert!(matches!(
            parse(&format!("{HEADER},owner\na,0,10,100,0.5,1,me\n")),
            Err(ParseError::Header(_))
        ));
        assert!(matches!(
            parse(&format!("{HEADER},declared\na,0,10,100,0.5,1,maybe\n")),
            Err(ParseError::Row(2, _))
        ));
    }

    #[test]
    fn bad_rows_name_their_line() {
        let text = format!("{HEADER}\n# comment\nj1,0,10,100,0.5,1\nj2,0,10,lots,0.5,1\n");
        assert!(matches!(parse(&text), Err(ParseError::Row(4, _))));
        let text = format!("{HEADER}\nj1,0,10,100,1.5,1\n");
        assert!(matches!(parse(&text), Err(ParseError::Row(2, _))));
        let text = format!("{HEADER}\nj1,0,10,100,0.5,0\n");
        assert!(matches!(parse(&text), Err(ParseError::Row(2, _))));
        let text = format!("{HEADER}\nj1,0,NaN,100,0.5,1\n");
        assert!(matches!(parse(&text), Err(ParseError::Row(2, _))));
        assert!(matches!(parse("a,b\n"), Err(ParseError::Header(_))));
        assert_eq!(parse(&format!("{HEADER}\n")), Err(ParseError::Empty));
    }

    #[test]
    fn values_beyond_the_bounds_are_refused_and_the_bounds_themselves_accepted() {
        let row = |submit: &str, duration: &str, mem: &str| {
            parse(&format!("{HEADER}\nj,{submit},{duration},{mem},0.5,1\n"))
        };
        let max_mib = MAX_MIB.to_string();
        assert!(row("1000000000", "1000000000", &max_mib).is_ok());
        for (submit, duration, mem, what) in [
            ("1e300", "10", "100", "submit_s"),
            ("1000000001", "10", "100", "submit_s"),
            ("0", "1e300", "100", "duration_s"),
            ("0", "0", "100", "duration_s"),
            ("0", "10", "18446744073709551615", "mem_mib"),
        ] {
            match row(submit, duration, mem) {
                Err(ParseError::Row(2, reason)) => assert!(reason.contains(what), "{reason}"),
                other => panic!("{submit},{duration},{mem}: {other:?}"),
            }
        }
    }
}
