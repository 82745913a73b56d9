//! The fan-out harness behind `ladle bench fanout` and `ladle demo`: shared loading (one
//! `ladle serve`, N `ladle consume` processes) against N `ladle bench private` processes that
//! each run their own pipeline, on the same cores, side by side.
//!
//! Every process is a child of this one, started as a [`Proc`] (its own process group, its
//! output read as it comes, killed with its group if the harness stops early: an error, or
//! Ctrl-C through the [`stop_flag`]). Their results are read back as the typed
//! [`records`](crate::records) they print. The CPU time of a mode is read from the OS:
//! `getrusage(RUSAGE_CHILDREN)` after all of the mode's processes have been waited for, minus
//! the value before.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use ladle_datasets::pipeline::default_threads;
use ladle_os::{Proc, Signal};
use serde::Serialize;

use crate::embedded::{DEMO_SAMPLES, embedded_dataset};
use crate::progress;
use crate::records::{ConsumeOutput, PrivateRecord, Record, ServeSummary};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// One producer, N consumer processes.
    Shared,
    /// N processes with a private pipeline each.
    Independent,
    /// Both, shared first.
    Both,
}

/// What to compare (the options of `ladle bench fanout`; `ladle demo` fills them in).
#[derive(Debug, Args)]
pub(crate) struct FanoutConfig {
    /// The dataset (default: the embedded synthetic dataset, generated once and cached).
    #[arg(long)]
    pub(crate) dataset: Option<PathBuf>,
    /// One consumer per batch size.
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,256")]
    pub(crate) consumers: Vec<u32>,
    /// Seconds each mode runs.
    #[arg(long, default_value_t = 15.0)]
    pub(crate) seconds: f64,
    /// Which modes to run.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    pub(crate) mode: Mode,
    /// Decode threads in total: the producer's in shared mode, split evenly (at least one
    /// each) among the processes in independent mode (default: all cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Side of the square training crops.
    #[arg(long, default_value_t = 224)]
    pub(crate) image_size: u32,
    /// Start the last consumer this many seconds after the others (shared mode).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) late_join: f64,
}

// The report's structs declare their fields in alphabetical order, the order the report
// printed them in when modes were untyped JSON maps: `--json` output is unchanged.

/// One consumer's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConsumerResult {
    pub(crate) batch_size: u32,
    /// Complete epochs read (shared mode).
    pub(crate) epochs: u64,
    /// Every complete epoch held each sample exactly once (shared mode; `null` otherwise).
    pub(crate) exact_coverage: Option<bool>,
    pub(crate) samples: u64,
    pub(crate) samples_per_s: f64,
}

/// One mode's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModeResult {
    pub(crate) aggregate_samples_per_s: f64,
    pub(crate) consumers: Vec<ConsumerResult>,
    pub(crate) cpu_seconds: f64,
    /// The producer's own rate (shared mode).
    pub(crate) producer_samples_per_s: Option<f64>,
    pub(crate) samples_per_cpu_second: f64,
    pub(crate) wall_seconds: f64,
}

/// The modes that ran.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Modes {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) independent: Option<ModeResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shared: Option<ModeResult>,
}

impl Modes {
    /// The modes that ran, in the order they ran (shared first).
    pub(crate) fn ran(&self) -> impl Iterator<Item = (Mode, &ModeResult)> {
        [
            (Mode::Shared, self.shared.as_ref()),
            (Mode::Independent, self.independent.as_ref()),
        ]
        .into_iter()
        .filter_map(|(mode, result)| Some((mode, result?)))
    }
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FanoutReport {
    pub(crate) dataset: PathBuf,
    pub(crate) threads: usize,
    pub(crate) seconds: f64,
    pub(crate) modes: Modes,
    pub(crate) speedup: Option<f64>,
    pub(crate) cpu_efficiency_gain: Option<f64>,
}

/// Sets the returned flag on SIGINT and SIGTERM: the harness then stops, killing every child.
pub(crate) fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// CPU time (user + system) of all waited-for children so far.
fn children_cpu() -> Duration {
    ladle_os::cpu_time(ladle_os::Usage::Children)
}

/// The `ladle` binary running this.
fn ladle() -> anyhow::Result<Command> {
    Ok(Command::new(
        crate::self_exe().context("locating the ladle binary")?,
    ))
}

/// Waits for `p`, watching `stop`; returns its stdout, or fails with its stderr if it failed.
fn finish(p: &mut Proc, stop: &AtomicBool) -> anyhow::Result<String> {
    p.wait_until(None, Some(stop))?;
    let out = p.output()?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            p.name(),
            out.status,
            out.stderr.trim()
        );
    }
    Ok(out.stdout)
}

/// Sleeps `seconds` in steps of 0.1 s, ticking `bar` once per step, returning early on `stop`.
fn sleep_ticking(seconds: f64, bar: &indicatif::ProgressBar, stop: &AtomicBool) {
    let end = Instant::now() + Duration::from_secs_f64(seconds.max(0.0));
    while Instant::now() < end && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        bar.inc(1);
    }
}

fn shared_mode(
    config: &FanoutConfig,
    dataset: &Path,
    threads: usize,
    stop: &AtomicBool,
) -> anyhow::Result<ModeResult> {
    let dir = tempfile::tempdir().context("creating a directory for the socket")?;
    let socket = dir.path().join("ladle.sock");
    let cpu0 = children_cpu();
    let start = Instant::now();
    let mut serve = Proc::spawn(
        "ladle serve",
        ladle()?
            .args(["serve", "--threads", &threads.to_string(), "--image-size"])
            .arg(config.image_size.to_string())
            .arg("--dataset")
            .arg(dataset)
            .arg("--socket")
            .arg(&socket),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if serve.try_wait()?.is_some() {
            finish(&mut serve, stop)?;
            bail!("ladle serve exited before accepting connections");
        }
        if Instant::now() > deadline || stop.load(Ordering::SeqCst) {
            bail!("ladle serve did not come up");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let bar = progress::bar((config.seconds * 10.0) as u64, "shared");
    let mut consumers = Vec::new();
    let n = config.consumers.len();
    for (k, &batch) in config.consumers.iter().enumerate() {
        let late = k + 1 == n && n > 1 && config.late_join > 0.0;
        let seconds = if late {
            (config.seconds - config.late_join).max(1.0)
        } else {
            config.seconds
        };
        if late {
            sleep_ticking(config.late_join, &bar, stop);
        }
        let consumer = Proc::spawn(
            format!("ladle consume --batch-size {batch}"),
            ladle()?
                .args([
                    "consume",
                    "--json",
                    "--batch-size",
                    &batch.to_string(),
                    "--seconds",
                ])
                .arg(seconds.to_string())
                .arg("--socket")
                .arg(&socket),
        )?;
        consumers.push((batch, consumer));
    }
    sleep_ticking(config.seconds - config.late_join.max(0.0), &bar, stop);
    let mut results = Vec::new();
    for (batch, mut consumer) in consumers {
        let out = ConsumeOutput::parse(&finish(&mut consumer, stop)?)
            .with_context(|| format!("reading what {} printed", consumer.name()))?;
        let complete: Vec<_> = out.epochs.iter().filter(|e| e.complete).collect();
        results.push(ConsumerResult {
            batch_size: batch,
            samples_per_s: out.summary.samples_per_s,
            samples: out.summary.samples,
            epochs: complete.len() as u64,
            exact_coverage: Some(complete.iter().all(|e| e.exact_coverage)),
        });
    }
    // Stop the producer as Ctrl-C would, so that it reports what it published.
    serve.signal(Signal::TERM)?;
    let producer = ServeSummary::from_last_line(&finish(&mut serve, stop)?)?;
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let cpu = (children_cpu() - cpu0).as_secs_f64();
    Ok(mode_result(
        results,
        cpu,
        wall,
        Some(producer.samples_per_s),
    ))
}

fn independent_mode(
    config: &FanoutConfig,
    dataset: &Path,
    threads: usize,
    stop: &AtomicBool,
) -> anyhow::Result<ModeResult> {
    let each = (threads / config.consumers.len().max(1)).max(1);
    let cpu0 = children_cpu();
    let start = Instant::now();
    let bar = progress::bar((config.seconds * 10.0) as u64, "private");
    let mut workers = Vec::new();
    for &batch in &config.consumers {
        let worker = Proc::spawn(
            format!("ladle bench private --batch-size {batch}"),
            ladle()?
                .args([
                    "bench",
                    "private",
                    "--json",
                    "--batch-size",
                    &batch.to_string(),
                ])
                .args([
                    "--threads",
                    &each.to_string(),
                    "--image-size",
                    &config.image_size.to_string(),
                ])
                .arg("--seconds")
                .arg(config.seconds.to_string())
                .arg("--dataset")
                .arg(dataset),
        )?;
        workers.push((batch, worker));
    }
    sleep_ticking(config.seconds, &bar, stop);
    let mut results = Vec::new();
    for (batch, mut worker) in workers {
        let record = PrivateRecord::from_last_line(&finish(&mut worker, stop)?)?;
        results.push(ConsumerResult {
            batch_size: batch,
            samples_per_s: record.samples_per_s,
            samples: record.samples,
            epochs: 0,
            exact_coverage: None,
        });
    }
    bar.finish_and_clear();
    let wall = start.elapsed().as_secs_f64();
    let cpu = (children_cpu() - cpu0).as_secs_f64();
    Ok(mode_result(results, cpu, wall, None))
}

fn mode_result(
    consumers: Vec<ConsumerResult>,
    cpu_seconds: f64,
    wall_seconds: f64,
    producer_samples_per_s: Option<f64>,
) -> ModeResult {
    let aggregate: f64 = consumers.iter().map(|c| c.samples_per_s).sum();
    let samples: u64 = consumers.iter().map(|c| c.samples).sum();
    ModeResult {
        aggregate_samples_per_s: aggregate,
        cpu_seconds,
        samples_per_cpu_second: samples as f64 / cpu_seconds.max(f64::EPSILON),
        wall_seconds,
        consumers,
        producer_samples_per_s,
    }
}

/// Runs the comparison; `stop` (e.g. set by Ctrl-C, see [`stop_flag`]) ends it early,
/// killing every child.
pub(crate) fn run(config: &FanoutConfig, stop: &AtomicBool) -> anyhow::Result<FanoutReport> {
    if config.consumers.is_empty() || config.consumers.contains(&0) {
        bail!("--consumers needs at least one batch size, each at least 1");
    }
    if !config.seconds.is_finite() || config.seconds <= 0.0 {
        bail!("--seconds must be positive");
    }
    let dataset = match &config.dataset {
        Some(path) => path.clone(),
        None => embedded_dataset(None, DEMO_SAMPLES)?,
    };
    let threads = config.threads.unwrap_or_else(default_threads);
    let mut modes = Modes::default();
    if matches!(config.mode, Mode::Shared | Mode::Both) {
        modes.shared = Some(shared_mode(config, &dataset, threads, stop)?);
    }
    if matches!(config.mode, Mode::Independent | Mode::Both) {
        modes.independent = Some(independent_mode(config, &dataset, threads, stop)?);
    }
    let (speedup, gain) = match (&modes.shared, &modes.independent) {
        (Some(s), Some(i)) => (
            Some(s.aggregate_samples_per_s / i.aggregate_samples_per_s.max(f64::EPSILON)),
            Some(s.samples_per_cpu_second / i.samples_per_cpu_second.max(f64::EPSILON)),
        ),
        _ => (None, None),
    };
    Ok(FanoutReport {
        dataset,
        threads,
        seconds: config.seconds,
        modes,
        speedup,
        cpu_efficiency_gain: gain,
    })
}

/// The human-readable tables.
pub(crate) fn print_report(r: &FanoutReport) {
    for (mode, m) in r.modes.ran() {
        let title = match mode {
            Mode::Shared => "shared: one ladle producer, each consumer its own process",
            _ => "independent: each consumer runs its own private pipeline",
        };
        println!("\n{title}");
        println!(
            "{:>8} {:>12} {:>8} {:>15}",
            "batch", "samples/s", "epochs", "exact coverage"
        );
        for c in &m.consumers {
            let exact = c.exact_coverage.map_or("-".to_owned(), |e| e.to_string());
            let epochs = if mode == Mode::Shared {
                c.epochs.to_string()
            } else {
                "-".into()
            };
            println!(
                "{:>8} {:>12.1} {:>8} {:>15}",
                c.batch_size, c.samples_per_s, epochs, exact
            );
        }
        if let Some(p) = m.producer_samples_per_s {
            println!("producer: {p:.1} samples/s decoded and augmented once");
        }
        println!(
            "aggregate {:.1} samples/s, {:.1} CPU-seconds, {:.1} samples per CPU-second",
            m.aggregate_samples_per_s, m.cpu_seconds, m.samples_per_cpu_second
        );
    }
    if let (Some(s), Some(g)) = (r.speedup, r.cpu_efficiency_gain) {
        println!(
            "\nshared / independent: {s:.2}x the samples/s, {g:.2}x the samples per CPU-second"
        );
    }
}
