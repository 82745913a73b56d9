//! Trace files: `ladle-scheduler-core`'s [`trace`](ladle_scheduler_core::sim::trace) (the
//! format, its bounds, [`parse`] and [`format`](fn@format), [`TraceError`]), re-exported,
//! with the file read and written here ([`read`](fn@read), [`write`](fn@write)).

use std::path::Path;

pub use ladle_scheduler_core::sim::trace::*;

/// Reads a trace file.
///
/// # Errors
/// [`TraceError`] naming the file and line.
pub fn read(path: &Path) -> Result<Vec<TraceJob>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text).map_err(|e| e.in_file(path))
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
    fn a_submit_time_of_1e300_is_refused_naming_the_file_line_and_job() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("far.csv");
        std::fs::write(
            &path,
            format!("{HEADER}\nj1,0,10,100,0.5,1\nfar,1e300,10,100,0.5,1\n"),
        )
        .unwrap();
        let e = read(&path).unwrap_err();
        assert!(matches!(e, TraceError::Row { line: 3, .. }), "{e:?}");
        let message = e.to_string();
        for needle in [
            "far.csv",
            "line 3",
            "\"far\"",
            "submit_s 1e300",
            "(0 to 1e9 s)",
        ] {
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
    }
}
