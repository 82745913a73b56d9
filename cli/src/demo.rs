//! `ladle demo`: the embedded synthetic dataset, generated once and cached, pushed through the
//! decode + augment pipeline.
//!
//! Today the demo measures the producer's pipeline (samples/s and CPU-seconds per thread
//! count); the shared-memory fan-out to several consumers joins it when the ring lands.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use ladle_datasets::prelude::*;
use ladle_datasets::synth::SynthConfig;

use crate::dataset::generate;

/// Version of the embedded dataset's recipe: bump to regenerate caches.
const DEMO_DATASET_VERSION: u32 = 2;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Seconds to run each pipeline configuration.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Samples in the embedded dataset.
    #[arg(long, default_value_t = 1000)]
    samples: u64,
    /// Where the embedded dataset is cached (default: $LADLE_CACHE_DIR, else
    /// $XDG_CACHE_HOME/ladle, else ~/.cache/ladle).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Output image side in pixels.
    #[arg(long, default_value_t = 224)]
    image_size: u32,
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

/// CPU time (user + system) this process has used so far, all threads.
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into the pointer it is given, which points at
    // writable memory of that type; RUSAGE_SELF is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage returned 0, so it initialised the struct (and it was zeroed anyway).
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let dir = embedded_dataset(args.cache_dir, args.samples)?;
    let dataset = ladle_datasets::open(&dir)?;
    let augment = Augment::train(args.image_size);
    let cores = ladle_datasets::pipeline::default_threads();
    println!(
        "dataset {}: {} samples, {} classes; RandomResizedCrop({}) + flip",
        dir.display(),
        dataset.len(),
        dataset.class_names().len(),
        args.image_size
    );
    println!(
        "{:>8} {:>12} {:>14} {:>10}",
        "threads", "samples/s", "CPU-s/1000", "skipped"
    );
    let mut rates = Vec::new();
    let mut thread_counts = vec![1];
    if cores > 1 {
        thread_counts.push(cores);
    }
    for threads in thread_counts {
        let pipeline = PipelineConfig {
            threads,
            augment,
            seed: 0,
            ..Default::default()
        }
        .build()?;
        let sink = SlotBuffer::new(threads * 16, augment.output_len());
        let sampler = EpochSampler::new(dataset.len(), 0);
        let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
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
        let (start, cpu0) = (Instant::now(), cpu_time());
        let stats = pipeline.run(dataset.as_ref(), items, &sink)?;
        let (wall, cpu) = (
            start.elapsed().as_secs_f64(),
            (cpu_time() - cpu0).as_secs_f64(),
        );
        let rate = stats.written as f64 / wall;
        rates.push(rate);
        println!(
            "{threads:>8} {rate:>12.1} {:>14.2} {:>10}",
            cpu / stats.written.max(1) as f64 * 1000.0,
            stats.skipped
        );
    }
    if let [one, many] = rates[..] {
        println!("scaling {cores} threads / 1 thread: {:.2}x", many / one);
    }
    println!(
        "(this demo shows the producer's decode+augment pipeline; the shared-memory fan-out \
         to many consumers is not built yet)"
    );
    Ok(())
}
