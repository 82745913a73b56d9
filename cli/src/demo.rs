//! `ladle demo`: what sharing buys, in one command, on the embedded synthetic dataset.
//!
//! It generates the dataset once (cached), then runs `ladle bench fanout`'s comparison (the
//! harness in [`crate::fanout`]) with four consumers (batch 32, 64, 128, 256; the last joins
//! late): first one producer feeding four consumer processes, then four processes each running
//! a private pipeline on the same cores, and prints both tables and the ratios. Ctrl-C stops it
//! and its children.

use std::path::PathBuf;

use clap::Args;

use crate::embedded::{DEMO_SAMPLES, embedded_dataset};
use crate::fanout::{self, FanoutConfig, Mode};

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Seconds each of the two modes runs.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    /// Samples in the embedded dataset.
    #[arg(long, default_value_t = DEMO_SAMPLES)]
    samples: u64,
    /// Where the embedded dataset is cached (default: $LADLE_CACHE_DIR, else
    /// $XDG_CACHE_HOME/ladle, else ~/.cache/ladle).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Output image side in pixels.
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    /// Decode threads in total (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let dataset = embedded_dataset(args.cache_dir, args.samples)?;
    let config = FanoutConfig {
        dataset: Some(dataset.clone()),
        consumers: vec![32, 64, 128, 256],
        seconds: args.seconds,
        mode: Mode::Both,
        threads: args.threads,
        image_size: args.image_size,
        late_join: (args.seconds / 5.0).min(3.0),
    };
    println!(
        "ladle demo: {} ({} samples), RandomResizedCrop({}) + flip, four consumers with batch \
         sizes 32, 64, 128, 256 (the last joins {:.0} s late), {:.0} s per mode",
        dataset.display(),
        args.samples,
        args.image_size,
        config.late_join,
        args.seconds
    );
    let stop = fanout::stop_flag()?;
    let report = fanout::run(&config, &stop)?;
    fanout::print_report(&report);
    Ok(())
}
