//! The JSON records one `ladle` process prints and another reads: `ladle consume --json` (an
//! [`EpochRecord`] per epoch, then a [`ConsumeSummary`]), `ladle serve`'s final
//! [`ServeSummary`], and `ladle bench private --json`'s [`PrivateRecord`].
//!
//! The writers print these types and the fan-out harness ([`crate::fanout`], behind `bench
//! fanout` and `demo`) reads them back into the same types: a renamed field is a compile error,
//! and a key missing from a line is an error naming the key and the line, never a silent zero.
//!
//! The field names are a format others read too (the integration tests, the Python tests,
//! `benches/python`, the soak script): keep them. Fields are declared in alphabetical order,
//! the order the untyped `json!` maps printed them in, so the lines are byte for byte what they
//! were before they were typed.

use anyhow::Context;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Writes `line` and a newline to stdout, flushed. A reader that went away (`EPIPE`, e.g.
/// `| head`) is a clean end, never a panic (`println!` panics there); any other failure is
/// an error.
pub(crate) fn print_line(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    quiet_on_broken_pipe(writeln!(out, "{line}").and_then(|()| out.flush()))
}

/// The outcome of printing to stdout: a reader that went away (`EPIPE`, e.g. `| head`) is a
/// clean end, not an error and never a panic; any other failure is an error.
pub(crate) fn quiet_on_broken_pipe(printed: std::io::Result<()>) -> anyhow::Result<()> {
    match printed {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// A record printed as one line of JSON on stdout.
pub(crate) trait Record: Serialize + DeserializeOwned {
    /// The command that prints it, for error messages.
    const PRINTED_BY: &'static str;

    /// Prints the record as one line on stdout (a reader that went away ends nothing).
    fn print(&self) -> anyhow::Result<()> {
        print_line(&serde_json::to_string(self)?)
    }

    /// Reads the record from one line.
    fn from_line(line: &str) -> anyhow::Result<Self> {
        serde_json::from_str(line)
            .with_context(|| format!("{} printed an unexpected line {line:?}", Self::PRINTED_BY))
    }

    /// Reads the record from the last line of `stdout`.
    fn from_last_line(stdout: &str) -> anyhow::Result<Self> {
        let line = stdout
            .lines()
            .last()
            .with_context(|| format!("{} printed nothing on stdout", Self::PRINTED_BY))?;
        Self::from_line(line)
    }
}

/// One epoch of `ladle consume --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EpochRecord {
    /// Samples delivered as bad (zero image, label -1).
    pub(crate) bad_samples: u64,
    /// Batches read.
    pub(crate) batches: u64,
    /// The epoch delivered all of its samples (false when `--seconds` cut it short).
    pub(crate) complete: bool,
    /// The producer's id for this consumer.
    pub(crate) consumer_id: u64,
    /// The consumer's epoch number.
    pub(crate) epoch: u64,
    /// Complete, and every dataset index arrived exactly once.
    pub(crate) exact_coverage: bool,
    /// Samples delivered.
    pub(crate) samples: u64,
    /// Samples per second over the epoch.
    pub(crate) samples_per_s: f64,
    /// Wall-clock seconds of the epoch.
    pub(crate) seconds: f64,
    /// The sequence number the consumer joined at (its cut point).
    pub(crate) start_seq: u64,
}

impl Record for EpochRecord {
    const PRINTED_BY: &'static str = "ladle consume --json";
}

/// The last line of `ladle consume --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConsumeSummary {
    /// Samples delivered as bad, over all epochs.
    pub(crate) bad_samples: u64,
    /// Batches whose contents changed while held without a let-go (`--check-held`; must be 0).
    pub(crate) corrupted_batches: u64,
    /// Complete epochs read.
    pub(crate) epochs: u64,
    /// Batches the producer overwrote while held, after letting this consumer go.
    pub(crate) overwritten_batches: u64,
    /// Times the producer let this consumer go and it rejoined.
    pub(crate) rejoins: u64,
    /// Samples delivered, over all epochs.
    pub(crate) samples: u64,
    /// Samples per second over the whole run.
    pub(crate) samples_per_s: f64,
    /// Wall-clock seconds of the whole run.
    pub(crate) seconds: f64,
    /// Seconds spent waiting for data (batches not yet decoded when asked for).
    #[serde(default)]
    pub(crate) waited_s: f64,
    /// Times the producer asked it to skim (it held the others back).
    #[serde(default)]
    pub(crate) skims: u64,
}

impl Record for ConsumeSummary {
    const PRINTED_BY: &'static str = "ladle consume --json";
}

/// Everything `ladle consume --json` prints: one record per epoch, then the summary.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConsumeOutput {
    /// One per epoch, complete or not, in order.
    pub(crate) epochs: Vec<EpochRecord>,
    /// The last line.
    pub(crate) summary: ConsumeSummary,
}

impl ConsumeOutput {
    /// Reads `ladle consume --json`'s stdout.
    pub(crate) fn parse(stdout: &str) -> anyhow::Result<Self> {
        let summary = ConsumeSummary::from_last_line(stdout)?;
        let lines: Vec<&str> = stdout.lines().collect();
        let epochs = lines[..lines.len() - 1]
            .iter()
            .map(|line| EpochRecord::from_line(line))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { epochs, summary })
    }
}

/// The one line `ladle serve` prints on stdout when it stops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServeSummary {
    /// Samples published as bad (zero image, label -1).
    pub(crate) bad_samples: u64,
    /// Samples published.
    pub(crate) published: u64,
    /// Samples its consumers released (read), all of them, the gone ones included: against
    /// `published`, what sharing saved.
    #[serde(default)]
    pub(crate) consumed: u64,
    /// Samples published per second.
    pub(crate) samples_per_s: f64,
    /// Wall-clock seconds it served.
    pub(crate) seconds: f64,
}

impl Record for ServeSummary {
    const PRINTED_BY: &'static str = "ladle serve";
}

/// The one line `ladle bench private --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PrivateRecord {
    /// Whole batches formed.
    pub(crate) batches: u64,
    /// Samples decoded and augmented.
    pub(crate) samples: u64,
    /// Samples per second.
    pub(crate) samples_per_s: f64,
    /// Wall-clock seconds.
    pub(crate) seconds: f64,
    /// Samples skipped as bad.
    pub(crate) skipped: u64,
}

impl Record for PrivateRecord {
    const PRINTED_BY: &'static str = "ladle bench private --json";
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as the commands printed them before their records were typed.
    const EPOCH: &str = r#"{"bad_samples":0,"batches":4,"complete":true,"consumer_id":1,"epoch":0,"exact_coverage":true,"samples":100,"samples_per_s":1234.5,"seconds":0.081,"start_seq":0}"#;
    const SUMMARY: &str = r#"{"bad_samples":0,"corrupted_batches":0,"epochs":1,"overwritten_batches":0,"rejoins":0,"samples":100,"samples_per_s":1200.25,"seconds":0.0833,"waited_s":0.5,"skims":1}"#;
    const SERVE: &str = r#"{"bad_samples":2,"published":4096,"consumed":12288,"samples_per_s":950.0,"seconds":4.3115}"#;
    const PRIVATE: &str =
        r#"{"batches":31,"samples":1000,"samples_per_s":98.76,"seconds":10.125,"skipped":0}"#;

    fn round_trip<R: Record>(line: &str) {
        let record = R::from_line(line).unwrap();
        assert_eq!(serde_json::to_string(&record).unwrap(), line);
    }

    #[test]
    fn every_record_reads_and_prints_the_lines_as_they_were_before_it_was_typed() {
        round_trip::<EpochRecord>(EPOCH);
        round_trip::<ConsumeSummary>(SUMMARY);
        // A summary printed before `waited_s` (or `skims`) existed still reads (as 0).
        let before = SUMMARY.replace(r#","waited_s":0.5,"skims":1"#, "");
        let old = ConsumeSummary::from_line(&before).unwrap();
        assert_eq!((old.waited_s, old.skims), (0.0, 0));
        round_trip::<ServeSummary>(SERVE);
        // A serve summary printed before `consumed` existed still reads (as 0).
        let before = ServeSummary::from_line(&SERVE.replace(r#""consumed":12288,"#, "")).unwrap();
        assert_eq!((before.published, before.consumed), (4096, 0));
        round_trip::<PrivateRecord>(PRIVATE);
    }

    #[test]
    fn a_line_missing_a_key_is_an_error_naming_the_key() {
        let line = SERVE.replace(r#""samples_per_s":950.0,"#, "");
        let err = format!("{:#}", ServeSummary::from_line(&line).unwrap_err());
        assert!(err.contains("ladle serve"), "{err}");
        assert!(err.contains("missing field `samples_per_s`"), "{err}");
    }

    #[test]
    fn consume_output_is_its_epochs_then_its_summary() {
        let stdout = format!("{EPOCH}\n{EPOCH}\n{SUMMARY}\n");
        let out = ConsumeOutput::parse(&stdout).unwrap();
        assert_eq!(out.epochs.len(), 2);
        assert_eq!(out.summary.epochs, 1);
        assert!(out.epochs.iter().all(|e| e.exact_coverage));

        // No summary last (the consumer died mid-epoch), or nothing at all: errors.
        assert!(ConsumeOutput::parse(&format!("{EPOCH}\n")).is_err());
        assert!(ConsumeOutput::parse("").is_err());
    }
}
