//! `ladle bench fanout` (shared loading against private pipelines, side by side) and
//! `ladle bench private` (one training job's private pipeline, the baseline's worker).
//!
//! Every process of a mode is a child of this one, so the CPU time of a mode is read from the
//! OS: `getrusage(RUSAGE_CHILDREN)` after all of the mode's processes have been waited for,
//! minus the value before.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use ladle_datasets::pipeline::default_threads;
use ladle_datasets::prelude::*;
use serde::Serialize;
use serde_json::Value;

use crate::progress;

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Shared loading (one producer, N consumer processes) against N processes that each run
    /// their own pipeline, in one invocation; reports samples/s, CPU-seconds and the ratios.
    Fanout(FanoutArgs),
    /// One process running its own decode + augment pipeline for a while, as a training job
    /// without ladle would (the worker of `fanout`'s independent mode).
    Private(PrivateArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// One producer, N consumer processes.
    Shared,
    /// N processes with a private pipeline each.
    Independent,
    /// Both, shared first.
    Both,
}

#[derive(Debug, Args)]
pub(crate) struct FanoutArgs {
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
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write a PNG bar chart comparing the modes.
    #[arg(long, value_name = "FILE.png")]
    pub(crate) plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct PrivateArgs {
    /// The dataset.
    #[arg(long)]
    dataset: PathBuf,
    /// Samples per batch (batches are formed and counted, as a training loop would take them).
    #[arg(long, default_value_t = 32)]
    batch_size: u32,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Decode threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Side of the square training crops.
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    /// Seed of the permutation and augmentation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Fanout(args) => {
            let report = fanout(&args, &*crate::demo::stop_flag()?)?;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print_report(&report);
            }
            if let Some(path) = &args.plot {
                crate::plot::fanout(&report, path)?;
                if !args.json {
                    println!("chart written to {}", path.display());
                }
            }
            Ok(())
        }
        BenchCommand::Private(args) => private(&args),
    }
}

/// What a private pipeline did.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct PipelineRun {
    /// Samples written.
    pub(crate) samples: u64,
    /// Samples skipped as bad.
    pub(crate) skipped: u64,
    /// Wall-clock seconds.
    pub(crate) seconds: f64,
}

/// Runs `pipeline` over epochs of `dataset` for `seconds`, into `sink`.
pub(crate) fn run_for(
    dataset: &dyn Dataset,
    pipeline: &Pipeline,
    sink: &SlotBuffer,
    seed: u64,
    seconds: f64,
) -> anyhow::Result<PipelineRun> {
    let sampler = EpochSampler::new(dataset.len(), seed);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let items = (0u64..)
        .flat_map(|epoch| {
            sampler
                .order(epoch)
                .into_iter()
                .map(move |index| (epoch, index))
        })
        .enumerate()
        .map(|(seq, (epoch, index))| WorkItem {
            seq: seq as u64,
            index,
            epoch,
        })
        .take_while(|_| Instant::now() < deadline);
    let stats = pipeline.run(dataset, items, sink)?;
    Ok(PipelineRun {
        samples: stats.written,
        skipped: stats.skipped,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn private(args: &PrivateArgs) -> anyhow::Result<()> {
    let dataset = ladle_datasets::open(&args.dataset)
        .with_context(|| format!("cannot read dataset {}", args.dataset.display()))?;
    let augment = Augment::train(args.image_size);
    let pipeline = PipelineConfig {
        threads: args.threads,
        augment,
        seed: args.seed,
        ..Default::default()
    }
    .build()?;
    // A batch's worth of output buffers, reused: what a DataLoader's batch would hold.
    let sink = SlotBuffer::new(args.batch_size.max(1) as usize, augment.output_len());
    let run = run_for(dataset.as_ref(), &pipeline, &sink, args.seed, args.seconds)?;
    let rate = run.samples as f64 / run.seconds.max(f64::EPSILON);
    if args.json {
        let line = serde_json::json!({
            "samples": run.samples,
            "skipped": run.skipped,
            "seconds": run.seconds,
            "samples_per_s": rate,
            "batches": run.samples / u64::from(args.batch_size.max(1)),
        });
        println!("{line}");
    } else {
        println!(
            "{} samples in {:.1} s: {rate:.0} samples/s",
            run.samples, run.seconds
        );
    }
    Ok(())
}

/// One consumer's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConsumerResult {
    pub(crate) batch_size: u32,
    pub(crate) samples_per_s: f64,
    pub(crate) samples: u64,
    /// Complete epochs read (shared mode).
    pub(crate) epochs: u64,
    /// Every complete epoch held each sample exactly once (shared mode; `null` otherwise).
    pub(crate) exact_coverage: Option<bool>,
}

/// One mode's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModeResult {
    pub(crate) aggregate_samples_per_s: f64,
    pub(crate) cpu_seconds: f64,
    pub(crate) samples_per_cpu_second: f64,
    pub(crate) wall_seconds: f64,
    pub(crate) consumers: Vec<ConsumerResult>,
    /// The producer's own rate (shared mode).
    pub(crate) producer_samples_per_s: Option<f64>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FanoutReport {
    pub(crate) dataset: PathBuf,
    pub(crate) threads: usize,
    pub(crate) seconds: f64,
    pub(crate) modes: serde_json::Map<String, Value>,
    pub(crate) speedup: Option<f64>,
    pub(crate) cpu_efficiency_gain: Option<f64>,
    #[serde(skip)]
    pub(crate) results: Vec<(Mode, ModeResult)>,
}

/// CPU time (user + system) of all waited-for children so far.
fn children_cpu() -> Duration {
    crate::usage::cpu_time(libc::RUSAGE_CHILDREN)
}

/// A child process whose output is read on threads as it comes (a full pipe would stall it).
struct Proc {
    name: String,
    child: Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

/// Children of one mode, killed if dropped before they were waited for (an error, Ctrl-C).
struct Procs(Vec<Option<Proc>>);

impl Drop for Procs {
    fn drop(&mut self) {
        for p in self.0.iter_mut().flatten() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

fn ladle() -> anyhow::Result<Command> {
    Ok(Command::new(
        std::env::current_exe().context("locating the ladle binary")?,
    ))
}

fn read_all(pipe: Option<impl std::io::Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

fn spawn(procs: &mut Procs, name: String, cmd: &mut Command) -> anyhow::Result<usize> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let (stdout, stderr) = (read_all(child.stdout.take()), read_all(child.stderr.take()));
    procs.0.push(Some(Proc {
        name,
        child,
        stdout,
        stderr,
    }));
    Ok(procs.0.len() - 1)
}

/// Whether child `i` has exited.
fn exited(procs: &mut Procs, i: usize) -> anyhow::Result<bool> {
    match procs.0[i].as_mut() {
        Some(p) => Ok(p.child.try_wait()?.is_some()),
        None => Ok(true),
    }
}

/// Waits for child `i`, watching `stop`; returns its stdout's JSON lines.
fn finish(procs: &mut Procs, i: usize, stop: &AtomicBool) -> anyhow::Result<Vec<Value>> {
    while !exited(procs, i)? {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut p = procs.0[i].take().context("waited for twice")?;
    let status = p.child.wait()?;
    let stdout = p.stdout.join().unwrap_or_default();
    let stderr = p.stderr.join().unwrap_or_default();
    if !status.success() {
        bail!("{} failed ({status}): {}", p.name, stderr.trim());
    }
    Ok(stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
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
    args: &FanoutArgs,
    dataset: &Path,
    threads: usize,
    stop: &AtomicBool,
) -> anyhow::Result<ModeResult> {
    let dir = tempfile::tempdir().context("creating a directory for the socket")?;
    let socket = dir.path().join("ladle.sock");
    let cpu0 = children_cpu();
    let start = Instant::now();
    let mut procs = Procs(Vec::new());
    let serve = spawn(
        &mut procs,
        "ladle serve".into(),
        ladle()?
            .args(["serve", "--threads", &threads.to_string(), "--image-size"])
            .arg(args.image_size.to_string())
            .arg("--dataset")
            .arg(dataset)
            .arg("--socket")
            .arg(&socket),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if exited(&mut procs, serve)? {
            finish(&mut procs, serve, stop)?;
            bail!("ladle serve exited before accepting connections");
        }
        if Instant::now() > deadline || stop.load(Ordering::SeqCst) {
            bail!("ladle serve did not come up");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let bar = progress::bar((args.seconds * 10.0) as u64, "shared");
    let mut consumers = Vec::new();
    let n = args.consumers.len();
    for (k, &batch) in args.consumers.iter().enumerate() {
        let late = k + 1 == n && n > 1 && args.late_join > 0.0;
        let seconds = if late {
            (args.seconds - args.late_join).max(1.0)
        } else {
            args.seconds
        };
        if late {
            sleep_ticking(args.late_join, &bar, stop);
        }
        let i = spawn(
            &mut procs,
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
        consumers.push((batch, i));
    }
    sleep_ticking(args.seconds - args.late_join.max(0.0), &bar, stop);
    let mut results = Vec::new();
    for (batch, i) in consumers {
        let lines = finish(&mut procs, i, stop)?;
        let summary = lines
            .iter()
            .find(|l| l.get("epochs").is_some() && l.get("epoch").is_none());
        let summary = summary.context("a consumer printed no summary")?;
        let epochs: Vec<&Value> = lines.iter().filter(|l| l["complete"] == true).collect();
        results.push(ConsumerResult {
            batch_size: batch,
            samples_per_s: summary["samples_per_s"].as_f64().unwrap_or(0.0),
            samples: summary["samples"].as_u64().unwrap_or(0),
            epochs: epochs.len() as u64,
            exact_coverage: Some(epochs.iter().all(|e| e["exact_coverage"] == true)),
        });
    }
    // Stop the producer as Ctrl-C would, so that it reports what it published.
    if let Some(p) = procs.0[serve].as_ref() {
        // SAFETY: kill(2) on a child we spawned and have not waited for, so the pid is ours.
        unsafe { libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let producer = finish(&mut procs, serve, stop)?;
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let cpu = (children_cpu() - cpu0).as_secs_f64();
    let producer_rate = producer.first().and_then(|v| v["samples_per_s"].as_f64());
    Ok(mode_result(results, cpu, wall, producer_rate))
}

fn independent_mode(
    args: &FanoutArgs,
    dataset: &Path,
    threads: usize,
    stop: &AtomicBool,
) -> anyhow::Result<ModeResult> {
    let each = (threads / args.consumers.len().max(1)).max(1);
    let cpu0 = children_cpu();
    let start = Instant::now();
    let bar = progress::bar((args.seconds * 10.0) as u64, "private");
    let mut procs = Procs(Vec::new());
    let mut workers = Vec::new();
    for &batch in &args.consumers {
        let i = spawn(
            &mut procs,
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
                    &args.image_size.to_string(),
                ])
                .arg("--seconds")
                .arg(args.seconds.to_string())
                .arg("--dataset")
                .arg(dataset),
        )?;
        workers.push((batch, i));
    }
    sleep_ticking(args.seconds, &bar, stop);
    let mut results = Vec::new();
    for (batch, i) in workers {
        let lines = finish(&mut procs, i, stop)?;
        let line = lines
            .first()
            .context("a private pipeline printed no result")?;
        results.push(ConsumerResult {
            batch_size: batch,
            samples_per_s: line["samples_per_s"].as_f64().unwrap_or(0.0),
            samples: line["samples"].as_u64().unwrap_or(0),
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

/// Runs the comparison; `stop` (e.g. set by Ctrl-C) ends it early, killing every child.
pub(crate) fn fanout(args: &FanoutArgs, stop: &AtomicBool) -> anyhow::Result<FanoutReport> {
    if args.consumers.is_empty() || args.consumers.contains(&0) {
        bail!("--consumers needs at least one batch size, each at least 1");
    }
    if !args.seconds.is_finite() || args.seconds <= 0.0 {
        bail!("--seconds must be positive");
    }
    let dataset = match &args.dataset {
        Some(path) => path.clone(),
        None => crate::demo::embedded_dataset(None, crate::demo::DEMO_SAMPLES)?,
    };
    let threads = args.threads.unwrap_or_else(default_threads);
    let mut results = Vec::new();
    if matches!(args.mode, Mode::Shared | Mode::Both) {
        results.push((Mode::Shared, shared_mode(args, &dataset, threads, stop)?));
    }
    if matches!(args.mode, Mode::Independent | Mode::Both) {
        results.push((
            Mode::Independent,
            independent_mode(args, &dataset, threads, stop)?,
        ));
    }
    let mut modes = serde_json::Map::new();
    for (mode, result) in &results {
        let name = if *mode == Mode::Shared {
            "shared"
        } else {
            "independent"
        };
        modes.insert(name.into(), serde_json::to_value(result)?);
    }
    let (speedup, gain) = match &results[..] {
        [(_, s), (_, i)] => (
            Some(s.aggregate_samples_per_s / i.aggregate_samples_per_s.max(f64::EPSILON)),
            Some(s.samples_per_cpu_second / i.samples_per_cpu_second.max(f64::EPSILON)),
        ),
        _ => (None, None),
    };
    Ok(FanoutReport {
        dataset,
        threads,
        seconds: args.seconds,
        modes,
        speedup,
        cpu_efficiency_gain: gain,
        results,
    })
}

/// The human-readable tables.
pub(crate) fn print_report(r: &FanoutReport) {
    for (mode, m) in &r.results {
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
            let epochs = if *mode == Mode::Shared {
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
