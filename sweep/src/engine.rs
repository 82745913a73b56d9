//! One node's sweep: its runs as consumers of one feed, each admitted by a scheduler.
//!
//! [`run`] starts (or reuses) the feed, uses the running scheduler or starts a private one
//! in-process, submits every run with `LADLE_SOCKET` (the feed), `LADLE_RUN` (its name) and
//! `LADLE_CONNECT_TIMEOUT` in its environment, follows the runs as they start and end, and
//! returns the report with the cost. Raising `stop` cancels every run (each gets SIGTERM from
//! the scheduler, then its process group SIGKILL after the stop grace); raising `hurry` kills
//! them at once. Under the sweep's directory (`out`) it writes, as it goes:
//! [`crate::ledger::NODE`] at start, one line of [`crate::ledger::RUNS`] per run that ends,
//! and [`crate::ledger::REPORT`] at the end: what `ladle report --merge` and a requeued or
//! resumed Slurm sweep read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ladle_observe::Observer;
use ladle_observe::report::{Cost, FeedReport, RunReport, SweepReport};
use ladle_producer::{Producer, ProducerConfig, Served};
use ladle_scheduler::daemon::{self, DaemonConfig};
use ladle_scheduler::job::{JobId, JobSpec};
use ladle_scheduler::protocol::{self, FeedSpec, JobQuery, JobView, Request, Response};

use crate::SweepError;
use crate::grid::{PlannedRun, Shard};
use crate::ledger::{Ledger, NodeStart};
use crate::view::{Progress, Run, ShowProgress, follow_consumers, table};

mod feed;
mod follow;
mod link;
mod report;

use feed::open_feed;
use follow::{Following, RunShape, follow, run_report, submit_runs};
use link::{Scheduler, kill_runs};
use report::sweep_report;

/// How often the sweep asks the scheduler how its runs stand.
const POLL: Duration = Duration::from_millis(500);

/// How long a client waits for the daemon's answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Jobs requests that may fail in a row before the sweep gives up (and cancels its runs).
const QUEUE_TRIES: u32 = 5;

/// How long a run waits for its feed's socket to appear (`LADLE_CONNECT_TIMEOUT`).
pub const RUN_CONNECT_TIMEOUT_S: u32 = 60;

/// Which scheduler admits the runs.
#[derive(Debug)]
pub enum SchedulerChoice {
    /// The daemon answering on this state directory's socket, if it runs; else a private one.
    PreferRunning {
        /// The running daemon's state directory.
        dir: PathBuf,
        /// The private daemon to start otherwise.
        private: Box<DaemonConfig>,
    },
    /// The daemon of this state directory, which must be running.
    Running(PathBuf),
    /// A private daemon, in-process, for this sweep only (always so under Slurm).
    Private(Box<DaemonConfig>),
}

/// The feed a sweep serves its runs from.
pub struct FeedSource {
    /// The dataset's path, as given (for the lines and the feed's key).
    pub path: PathBuf,
    /// The dataset, opened.
    pub dataset: Box<dyn ladle_datasets::Dataset>,
    /// The producer's configuration; its socket is where the feed listens.
    pub config: ProducerConfig,
}

impl std::fmt::Debug for FeedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedSource")
            .field("path", &self.path)
            .field("socket", &self.config.socket)
            .finish_non_exhaustive()
    }
}

/// Prices for the report's dollars (none given: no dollars).
#[derive(Debug, Clone, Copy, Default)]
pub struct Prices {
    /// One CPU core-hour, USD.
    pub cpu_hour: Option<f64>,
    /// One GPU-hour, USD.
    pub gpu_hour: Option<f64>,
}

/// Starts `--metrics`/`--record` once the feed and scheduler sockets are known.
pub type StartObserver =
    Box<dyn FnOnce(ladle_observe::Sockets) -> Result<Option<Observer>, String>>;

/// One node's sweep.
#[derive(Debug)]
pub struct SweepConfig {
    /// The runs this node runs (a shard of the grid, named over the whole grid).
    pub runs: Vec<PlannedRun>,
    /// Runs of `runs` that already succeeded (a requeued or resumed sweep): not run again.
    pub done: BTreeSet<String>,
    /// Which shard of the grid `runs` is, for the record.
    pub shard: Shard,
    /// The node's name in lines and reports (`None` on one machine without shards).
    pub node: Option<String>,
    /// The Slurm job, when there is one, for the record.
    pub job_id: Option<String>,
    /// Where the runs' logs, the ledger and the report go (shared under Slurm).
    pub out: PathBuf,
    /// The runs' working directory.
    pub cwd: PathBuf,
    /// The feed.
    pub feed: FeedSource,
    /// The feed's name with the scheduler (default: `sweep-PID`).
    pub feed_name: Option<String>,
    /// The scheduler.
    pub scheduler: SchedulerChoice,
    /// Device memory each run needs per GPU, MiB (none: measured, then packed).
    pub gpu_mem_mib: Option<u64>,
    /// GPUs each run needs at once (a `torchrun --nproc_per_node N` run: N).
    pub gpus_per_run: u32,
    /// The family the runs' measured memory is shared under.
    pub family: Option<String>,
    /// Prices for the report.
    pub prices: Prices,
    /// After `stop`, how long cancelled runs get to end before their process groups are
    /// killed.
    pub stop_grace: Duration,
    /// Where the live table goes at each look (`ladle sweep` draws it on a terminal);
    /// `None`: a plain line per change on stderr instead.
    pub progress: Option<ShowProgress>,
    /// Where `--record` records: the report is written there too, for `ladle report`.
    pub record: Option<PathBuf>,
}

/// Raised by the caller's signal handling: `stop` for a clean stop, `hurry` for an
/// immediate one.
#[derive(Debug, Clone, Default)]
pub struct StopFlags {
    /// Cancel every run, stop the feed and the private scheduler.
    pub stop: Arc<AtomicBool>,
    /// Kill the runs' process groups now.
    pub hurry: Arc<AtomicBool>,
}

/// A progress line: on stderr, so that stdout holds only the report.
fn say(node: Option<&str>, line: &str) {
    match node {
        Some(node) => eprintln!("ladle sweep [{node}]: {line}"),
        None => eprintln!("ladle sweep: {line}"),
    }
}

/// A dataset as feeds are matched: its canonical path.
pub fn dataset_key(dataset: &std::path::Path) -> String {
    dataset
        .canonicalize()
        .unwrap_or_else(|_| dataset.to_owned())
        .display()
        .to_string()
}

/// A feed's transform as feeds are matched: the whole pipeline in canonical form (equal for
/// equal pipelines, whichever way they were written), the seed, the ring and the policy.
pub fn transform_key(config: &ProducerConfig) -> String {
    format!(
        "{} seed {} ring {} policy {:?}",
        config.augment, config.seed, config.ring_bytes, config.policy
    )
}

/// Runs one node's sweep to its end (or until `flags.stop`), and returns its report.
///
/// # Errors
/// A scheduler that cannot be reached or refuses a run, a feed that cannot start or fails,
/// files of `out` that cannot be written. A sweep whose runs fail is not an error: the
/// report says so.
// About 160 lines of orchestration, in order (directory and ledger, scheduler, feed,
// observers, runs, the report); each phase is a function of `engine/`.
pub fn run(
    config: SweepConfig,
    observe: StartObserver,
    flags: &StopFlags,
) -> Result<SweepReport, SweepError> {
    let SweepConfig {
        runs: planned,
        done,
        shard,
        node,
        job_id,
        out,
        cwd,
        feed,
        feed_name,
        scheduler,
        gpu_mem_mib,
        gpus_per_run,
        family,
        prices,
        stop_grace,
        progress,
        record,
    } = config;
    let node_ref = node.as_deref();
    let (stop, hurry) = (&*flags.stop, &*flags.hurry);
    std::fs::create_dir_all(&out).map_err(|source| SweepError::Io {
        what: "creating the sweep's directory",
        path: out.clone(),
        source,
    })?;
    let (todo, skipped): (Vec<_>, Vec<_>) =
        planned.into_iter().partition(|r| !done.contains(&r.name));
    let mut ledger = Ledger::start(
        &out,
        &NodeStart {
            node: node.clone(),
            shard,
            job_id: job_id.clone(),
            runs: todo.iter().map(|r| r.name.clone()).collect(),
            skipped: skipped.iter().map(|r| r.name.clone()).collect(),
        },
    )?;
    if !skipped.is_empty() {
        say(
            node_ref,
            &format!(
                "{} runs already succeeded, not run again: {}",
                skipped.len(),
                skipped
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        );
    }

    let started = Instant::now();
    let mut scheduler = Scheduler::start(scheduler)?;
    let FeedSource {
        path: dataset_path,
        dataset,
        config: producer_config,
    } = feed;
    let feed_stop = Arc::new(AtomicBool::new(false));
    let (producer, socket, feed_name) = open_feed(
        &scheduler,
        &dataset_path,
        dataset,
        producer_config,
        feed_name,
        !todo.is_empty(),
        (stop, &feed_stop),
        node_ref,
    )?;
    say(
        node_ref,
        &format!(
            "sweep of {} runs: feed {feed_name:?} of {} on {}, scheduler {}",
            todo.len(),
            dataset_path.display(),
            socket.display(),
            scheduler.socket.display()
        ),
    );

    // --metrics / --record: the feed and the scheduler, over their sockets.
    let observer = observe(ladle_observe::Sockets {
        feeds: vec![(feed_name.clone(), socket.clone())],
        scheduler: Some(scheduler.socket.clone()),
        scheduler_feeds: false,
    })
    .map_err(SweepError::Observe)?;
    let mut runs = submit_runs(
        &scheduler,
        todo,
        &RunShape {
            socket: &socket,
            feed_name: &feed_name,
            cwd: &cwd,
            gpu_mem_mib,
            gpus_per_run,
            family: family.as_ref(),
        },
        node_ref,
    )?;

    let mut recorded = follow(
        Following {
            scheduler: &scheduler,
            ledger: &mut ledger,
            producer: producer.as_ref(),
            feed_name: &feed_name,
            node: node_ref,
            stop,
            hurry,
            stop_grace,
        },
        &mut runs,
        progress,
    )?;

    if let Some(observer) = observer {
        observer.stop();
    }
    // Logs before the scheduler goes away.
    let mut reports = Vec::new();
    for run in &runs {
        let report = run_report(&scheduler, run, node_ref);
        if recorded.insert(run.id) {
            ledger.append(&report);
        }
        reports.push(report);
    }
    scheduler.stop();
    feed_stop.store(true, Ordering::SeqCst);
    let served = match producer {
        Some(producer) => {
            producer.stop();
            Some(producer.wait().map_err(|e| SweepError::Feed {
                socket: socket.clone(),
                detail: format!("failed: {e}"),
            })?)
        }
        None => None,
    };
    let report = sweep_report(
        reports,
        served.as_ref(),
        &socket,
        started.elapsed().as_secs_f64(),
        ladle_os::cpu_time(ladle_os::Usage::Myself).as_secs_f64(),
        std::thread::available_parallelism().map_or(1, usize::from) as f64,
        &prices,
    );
    ledger.finish(&report);
    if let Some(dir) = &record {
        // Beside the recorded series, for `ladle report`'s cost plot.
        crate::ledger::write_report(&dir.join(ladle_observe::record::REPORT), &report);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use ladle_datasets::transforms::Transforms;

    fn key(spec: &str) -> String {
        transform_key(&ProducerConfig {
            augment: Transforms::parse(spec).unwrap(),
            ..ProducerConfig::default()
        })
    }

    #[test]
    fn the_transform_key_is_equal_for_equal_pipelines_however_written_and_differs_otherwise() {
        let calls = key("RandomCrop(32, padding=4), RandomHorizontalFlip()");
        assert_eq!(
            calls,
            key(r#"[{"name":"RandomCrop","size":32,"padding":4},{"name":"RandomHorizontalFlip"}]"#)
        );
        assert_eq!(
            calls,
            key("RandomCrop(size=(32, 32), padding=(4, 4, 4, 4)), RandomHorizontalFlip(p=0.5)")
        );
        assert!(
            calls.contains("RandomCrop(size=(32, 32), padding=(4, 4, 4, 4)"),
            "{calls}"
        );
        assert!(calls.contains("RandomHorizontalFlip(p=0.5)"), "{calls}");
        assert_ne!(
            calls,
            key("RandomCrop(32, padding=4), RandomHorizontalFlip(0.4)")
        );
        assert_ne!(calls, key("RandomCrop(32, padding=4)"));
        assert_eq!(
            key("RandomResizedCrop(224), RandomHorizontalFlip()"),
            transform_key(&ProducerConfig::default())
        );
    }
}
