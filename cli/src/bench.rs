//! `ladle bench fanout` (shared loading against private pipelines, side by side: the
//! harness in [`crate::fanout`]) and `ladle bench private` (one training job's private
//! pipeline, the baseline's worker); `ladle bench baseline` lives in [`crate::baseline`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use ladle_datasets::prelude::*;

use crate::fanout::{self, FanoutConfig};
use crate::records::{PrivateRecord, Record};

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Shared loading (one producer, N consumer processes) against N processes that each run
    /// their own pipeline, in one invocation; reports samples/s, CPU-seconds and the ratios.
    Fanout(FanoutArgs),
    /// One process running its own decode + augment pipeline for a while, as a training job
    /// without ladle would (the worker of `fanout`'s independent mode).
    Private(PrivateArgs),
    /// What your own private pipeline costs: torchvision's RandomResizedCrop + flip in a
    /// PyTorch DataLoader over an ImageFolder, run by your Python, in CPU ms per sample.
    /// `--record REC` writes it into a sweep's recording for `ladle cost REC`.
    Baseline(crate::baseline::BaselineArgs),
}

#[derive(Debug, Args)]
pub(crate) struct FanoutArgs {
    #[command(flatten)]
    config: FanoutConfig,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Write a PNG bar chart comparing the modes.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
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
            let report = fanout::run(&args.config, &*fanout::stop_flag()?)?;
            if args.json {
                crate::records::print_line(&serde_json::to_string(&report)?)?;
            } else {
                fanout::print_report(&report);
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
        BenchCommand::Baseline(args) => crate::baseline::run(&args),
    }
}

/// What a private pipeline did.
#[derive(Debug, Clone, Copy)]
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
    let augment = Transforms::train(args.image_size);
    let output_len = augment.output_len();
    let pipeline = PipelineConfig {
        threads: args.threads,
        augment,
        seed: args.seed,
        ..Default::default()
    }
    .build()?;
    // A batch's worth of output buffers, reused: what a DataLoader's batch would hold.
    let sink = SlotBuffer::new(args.batch_size.max(1) as usize, output_len);
    let run = run_for(dataset.as_ref(), &pipeline, &sink, args.seed, args.seconds)?;
    let rate = run.samples as f64 / run.seconds.max(f64::EPSILON);
    if args.json {
        PrivateRecord {
            batches: run.samples / u64::from(args.batch_size.max(1)),
            samples: run.samples,
            samples_per_s: rate,
            seconds: run.seconds,
            skipped: run.skipped,
        }
        .print()?;
    } else {
        println!(
            "{} samples in {:.1} s: {rate:.0} samples/s",
            run.samples, run.seconds
        );
    }
    Ok(())
}
