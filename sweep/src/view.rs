//! What a person sees of a sweep as it goes: a run followed through the scheduler's answers
//! and its feed's consumer stats, and the table of runs it reports ([`Progress`]) for its
//! caller to draw.

use std::time::{Duration, Instant};

use ladle_producer::ConsumerStats;
use ladle_scheduler::job::{JobId, JobState};

/// One run as the sweep follows it.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) name: String,
    pub(crate) args: Vec<String>,
    pub(crate) id: JobId,
    pub(crate) started: Option<Instant>,
    pub(crate) ended: Option<Instant>,
    pub(crate) gpus: Vec<u32>,
    pub(crate) pid: Option<u32>,
    pub(crate) state: &'static str,
    pub(crate) reason: Option<String>,
    pub(crate) peak_mib: Option<u64>,
    /// CPU seconds of its ended attempts, as its scheduler measured.
    pub(crate) cpu_s: Option<f64>,
    /// Samples it has read (released to the feed) and its epochs, when the feed is ours.
    pub(crate) released: Option<u64>,
    pub(crate) epochs: Option<f64>,
    /// Samples per second since the last look.
    pub(crate) rate: Option<f64>,
}

impl Run {
    /// A run just submitted as job `id`.
    pub(crate) fn queued(name: String, args: Vec<String>, id: JobId) -> Self {
        Self {
            name,
            args,
            id,
            started: None,
            ended: None,
            gpus: Vec::new(),
            pid: None,
            state: "queued",
            reason: None,
            peak_mib: None,
            cpu_s: None,
            released: None,
            epochs: None,
            rate: None,
        }
    }

    /// Updates the run from the scheduler's view of its job; returns the line that says
    /// what changed, if anything did.
    pub(crate) fn follow(&mut self, state: &JobState) -> Option<String> {
        let now = Instant::now();
        let (name, terminal) = match state {
            JobState::Queued => ("queued", false),
            JobState::Running { gpus, pid, .. } => {
                if self.started.is_none() {
                    self.started = Some(now);
                    self.gpus.clone_from(gpus);
                }
                self.pid = *pid;
                ("running", false)
            }
            JobState::Succeeded => ("succeeded", true),
            JobState::Failed { reason } => {
                self.reason = Some(reason.clone());
                ("failed", true)
            }
            JobState::Cancelled => ("cancelled", true),
            JobState::Interrupted { reason } => {
                self.reason = Some(reason.clone());
                ("interrupted", true)
            }
            _ => ("unknown", false),
        };
        if terminal && self.ended.is_none() {
            self.ended = Some(now);
        }
        if name == self.state {
            return None;
        }
        self.state = name;
        let detail = match (name, &self.reason) {
            ("running", _) => format!(" on GPU {:?}", self.gpus),
            (_, Some(reason)) if terminal => format!(": {reason}"),
            _ => String::new(),
        };
        let took = match (self.started, self.ended) {
            (Some(s), Some(e)) => format!(" after {:.1} s", e.duration_since(s).as_secs_f64()),
            _ => String::new(),
        };
        Some(format!("{} {name}{detail}{took}", self.name))
    }
}

/// What a sweep shows of itself at one look: the table of its runs and its feed's line. The
/// library reports it ([`crate::engine::SweepConfig::progress`]); the caller draws it (`ladle
/// sweep` redraws it in place on a terminal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// A header line, then one line per run: state, GPUs, epoch, samples/s, elapsed time,
    /// peak GPU memory and the command.
    pub table: Vec<String>,
    /// The feed: what it decoded, at what rate, and who holds it back.
    pub feed: String,
}

/// Where [`Progress`] goes at each look (about twice a second).
pub struct ShowProgress(pub Box<dyn FnMut(&Progress) + Send>);

impl std::fmt::Debug for ShowProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShowProgress(..)")
    }
}

/// The table of `runs` at `now`: a header, then one row per run.
pub(crate) fn table(runs: &[Run], now: Instant) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<8} {:<11} {:<6} {:>6} {:>9} {:>8} {:>9}  command",
        "run", "state", "gpu", "epoch", "samples/s", "elapsed", "gpu mem"
    )];
    for r in runs {
        let elapsed = r.started.map_or_else(
            || "-".to_owned(),
            |s| {
                format!(
                    "{:.0} s",
                    r.ended.unwrap_or(now).duration_since(s).as_secs_f64()
                )
            },
        );
        let gpus = if r.gpus.is_empty() {
            "-".to_owned()
        } else {
            r.gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let memory = r
            .peak_mib
            .map_or("-".to_owned(), ladle_scheduler::units::format_mib);
        let epoch = r.epochs.map_or("-".to_owned(), |e| format!("{e:.1}"));
        let rate = r.rate.map_or("-".to_owned(), |v| format!("{v:.0}"));
        let command: String = r.args.join(" ").chars().take(50).collect();
        lines.push(format!(
            "{:<8} {:<11} {:<6} {epoch:>6} {rate:>9} {elapsed:>8} {memory:>9}  {command}",
            r.name, r.state, gpus
        ));
    }
    lines
}

/// Updates each run's progress from the feed's view of its consumer (matched by the name the
/// run got in `LADLE_RUN`); returns who holds the feed back, as a suffix for the feed's line.
pub(crate) fn follow_consumers(
    runs: &mut [Run],
    stats: &[ConsumerStats],
    n: u64,
    seconds: f64,
) -> String {
    for run in runs.iter_mut() {
        let logged = format!("{:?}", run.name);
        let Some(c) = stats.iter().find(|c| c.name == logged) else {
            run.rate = None;
            continue;
        };
        let before = run.released.unwrap_or(c.released);
        run.rate = Some(c.released.saturating_sub(before) as f64 / seconds);
        run.released = Some(c.released);
        run.epochs = Some(c.released as f64 / n.max(1) as f64);
    }
    stats
        .iter()
        .filter_map(|c| c.holding_back.map(|d| (c, d)))
        .filter(|(_, d)| *d >= Duration::from_secs(1))
        .max_by_key(|(_, d)| *d)
        .map_or_else(String::new, |(c, d)| {
            format!("; held back by {} for {:.0} s", c.name, d.as_secs_f64())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_header_and_one_row_per_run() {
        let now = Instant::now();
        let run = |name: &str, state| Run {
            started: Some(now - Duration::from_secs(5)),
            gpus: vec![1],
            state,
            peak_mib: Some(2048),
            released: Some(150),
            epochs: Some(1.5),
            rate: Some(320.0),
            ..Run::queued(
                name.into(),
                vec!["train".into(), "--lr".into(), "0.1".into()],
                1,
            )
        };
        let runs = [run("run-00", "running"), run("run-01", "queued")];
        let lines = table(&runs, now);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].starts_with("run "), "{lines:?}");
        assert!(lines[1].contains("run-00   running     1"), "{lines:?}");
        assert!(
            lines[1].contains("5 s") && lines[1].contains("2GiB"),
            "{lines:?}"
        );
        assert!(
            lines.iter().all(|l| !l.contains('\x1b')),
            "the library draws nothing: {lines:?}"
        );
    }

    #[test]
    fn each_run_is_followed_through_the_consumer_named_after_it() {
        let mut runs = vec![Run {
            released: Some(100),
            ..Run::queued("run-00".into(), vec!["train".into()], 1)
        }];
        let stats = [
            ConsumerStats {
                id: 0,
                name: "\"run-00\"".into(),
                released: 300,
                attached: true,
                holding_back: None,
            },
            ConsumerStats {
                id: 1,
                name: "\"other\"".into(),
                released: 5,
                attached: true,
                holding_back: Some(Duration::from_secs(4)),
            },
        ];
        let held = follow_consumers(&mut runs, &stats, 200, 2.0);
        assert_eq!(runs[0].rate, Some(100.0));
        assert_eq!(runs[0].epochs, Some(1.5));
        assert_eq!(held, "; held back by \"other\" for 4 s");
    }

    #[test]
    fn a_run_says_each_change_of_state_once() {
        let mut run = Run::queued("run-03".into(), vec!["train".into()], 7);
        assert_eq!(run.follow(&JobState::Queued), None);
        let failed = JobState::Failed {
            reason: "exit code 3".into(),
        };
        let line = run.follow(&failed).unwrap();
        assert!(line.starts_with("run-03 failed: exit code 3"), "{line}");
        assert!(run.ended.is_some());
        assert_eq!(run.follow(&failed), None);
    }
}
