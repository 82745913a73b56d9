//! Trace files: one job per CSV row.
//!
//! ```text
//! job_id,submit_s,duration_s,mem_mib,sm_activity,gpus[,feed]
//! j001,0.0,42.5,900,0.12,1
//! ```
//! - `submit_s`: arrival, seconds from the trace's start;
//! - `duration_s`: run time when the job has its GPUs to itself;
//! - `mem_mib`: peak device memory **per GPU**, MiB (the honest estimate);
//! - `sm_activity`: SM demand when alone, 0 – 1;
//! - `gpus`: GPUs it needs at once;
//! - `feed` (optional column): the producer feed it consumes.

use std::path::{Path, PathBuf};

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
    #[error("trace {path}: the header must be `{expected}` (optionally `,feed`), found `{found}`")]
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

/// Reads a trace file.
///
/// # Errors
/// [`TraceError`] naming the file and line.
pub fn read(path: &Path) -> Result<Vec<TraceJob>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text).map_err(|e| match e {
        ParseError::Header(found) => TraceError::Header {
            path: path.to_owned(),
            expected: HEADER,
            found,
        },
        ParseError::Row(line, reason) => TraceError::Row {
            path: path.to_owned(),
            line,
            reason,
        },
        ParseError::Empty => TraceError::Empty {
            path: path.to_owned(),
        },
    })
}

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
    let with_feed = match header {
        h if h == HEADER => false,
        h if h.strip_suffix(",feed") == Some(HEADER) => true,
        other => return Err(ParseError::Header(other.to_owned())),
    };
    let mut jobs = Vec::new();
    for (line, row) in lines {
        let bad = |reason: String| ParseError::Row(line, reason);
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        let want = if with_feed { 7 } else { 6 };
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
                feed: with_feed
                    .then(|| fields[6].to_owned())
                    .filter(|f| !f.is_empty()),
            };
        if job.sm_activity > 1.0 {
            return Err(bad(format!("sm_activity {} is above 1", job.sm_activity)));
        }
        if job.duration_s <= 0.0 {
            return Err(bad("duration_s must be positive".to_owned()));
        }
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(ParseError::Empty);
    }
    Ok(jobs)
}

/// Formats jobs as trace text (with the `feed` column only when some job has a feed).
pub fn format(jobs: &[TraceJob]) -> String {
    let with_feed = jobs.iter().any(|j| j.feed.is_some());
    let mut out = String::from(HEADER);
    out.push_str(if with_feed { ",feed\n" } else { "\n" });
    for j in jobs {
        out.push_str(&format!(
            "{},{:.1},{:.1},{},{:.3},{}",
            j.id, j.submit_s, j.duration_s, j.mem_mib, j.sm_activity, j.gpus
        ));
        if with_feed {
            out.push(',');
            out.push_str(j.feed.as_deref().unwrap_or(""));
        }
        out.push('\n');
    }
    out
}

/// Writes jobs to a trace file.
///
/// # Errors
/// [`TraceError::Io`].
pub fn write(path: &Path, jobs: &[TraceJob]) -> Result<(), TraceError> {
    std::fs::write(path, format(jobs)).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })
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
        }];
        assert_eq!(parse(&format(&jobs)).unwrap(), jobs);
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
}
