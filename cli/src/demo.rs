//! `ladle demo`: what sharing buys, in one command, on the embedded synthetic dataset.
//!
//! It generates the dataset once (cached), then runs `ladle bench fanout`'s comparison with
//! four consumers (batch 32, 64, 128, 256; the last joins late): first one producer feeding
//! four consumer processes, then four processes each running a private pipeline on the same
//! cores, and prints both tables and the ratios. Ctrl-C stops it and its children.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::Args;
use ladle_datasets::synth::SynthConfig;

use crate::bench::{FanoutArgs, Mode, fanout, print_report};
use crate::dataset::generate;

/// Version of the embedded dataset's recipe: bump to regenerate caches.
const DEMO_DATASET_VERSION: u32 = 2;
/// Samples in the embedded dataset.
pub(crate) const DEMO_SAMPLES: u64 = 1000;

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

/// The cache directory for generated datasets.
pub(crate) fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("LADLE_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("ladle")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("ladle")))
        .unwrap_or_else(|| std::env::temp_dir().join("ladle-cache"))
}

/// The embedded default dataset (ImageFolder of `samples` 500x375 JPEGs), generated on first
/// use; a marker file written last tells a complete cache from an interrupted one.
pub(crate) fn embedded_dataset(cache: Option<PathBuf>, samples: u64) -> anyhow::Result<PathBuf> {
    let dir = cache.unwrap_or_else(cache_dir).join(format!(
        "demo-imagefolder-v{DEMO_DATASET_VERSION}-{samples}"
    ));
    let marker = dir.join(".ladle-complete");
    if marker.is_file() {
        return Ok(dir);
    }
    eprintln!(
        "generating the embedded dataset ({samples} images) in {} ...",
        dir.display()
    );
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the incomplete cache {}", dir.display()))?;
    }
    let config = SynthConfig {
        count: samples,
        ..SynthConfig::default()
    };
    generate(&config, &dir)?;
    std::fs::write(&marker, b"").with_context(|| format!("writing {}", marker.display()))?;
    Ok(dir)
}

/// Sets the returned flag on SIGINT and SIGTERM.
pub(crate) fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let dataset = embedded_dataset(args.cache_dir, args.samples)?;
    let fanout_args = FanoutArgs {
        dataset: Some(dataset.clone()),
        consumers: vec![32, 64, 128, 256],
        seconds: args.seconds,
        mode: Mode::Both,
        threads: args.threads,
        image_size: args.image_size,
        late_join: (args.seconds / 5.0).min(3.0),
        json: false,
        plot: None,
    };
    println!(
        "ladle demo: {} ({} samples), RandomResizedCrop({}) + flip, four consumers with batch \
         sizes 32, 64, 128, 256 (the last joins {:.0} s late), {:.0} s per mode",
        dataset.display(),
        args.samples,
        args.image_size,
        fanout_args.late_join,
        args.seconds
    );
    let stop = stop_flag()?;
    let report = fanout(&fanout_args, &stop)?;
    print_report(&report);
    Ok(())
}
