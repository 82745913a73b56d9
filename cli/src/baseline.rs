//! `ladle bench baseline`: what a private pipeline costs, measured the way a training job
//! without ladle loads its data: torchvision's ImageFolder with the feed's default transform
//! in a PyTorch DataLoader, run by the user's own Python (`baseline.py`). `ladle cost` reads
//! the figure from a recording it was written into, so its private-pipeline prices rest on a
//! measurement rather than on the feed's decode cost (a lower bound).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;
use ladle_datasets::Format;
use ladle_observe::cost::Baseline;

/// The measurement, run with `python -c`.
const SCRIPT: &str = include_str!("baseline.py");

#[derive(Debug, Args)]
pub(crate) struct BaselineArgs {
    /// The dataset: an ImageFolder (one sub-folder per class), the layout torchvision reads.
    #[arg(long)]
    dataset: PathBuf,
    /// The Python to measure with: the one you train with, with torch and torchvision.
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// DataLoader worker processes.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: u32,
    /// Side of the RandomResizedCrop (the feed's `--image-size`).
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    /// Seconds to load for (whole epochs and a part, reshuffled each epoch).
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// A sweep's recording (`ladle sweep --record DIR`) to write the figure into, as
    /// `baseline.json`: `ladle cost DIR` then prices private pipelines with it.
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Print one JSON object instead of the sentence.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &BaselineArgs) -> anyhow::Result<()> {
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        bail!("--seconds {}: a positive number of seconds", args.seconds);
    }
    if args.batch_size == 0 {
        bail!("--batch-size 0: a batch holds at least one sample");
    }
    let format = ladle_datasets::formats::detect(&args.dataset)
        .with_context(|| format!("cannot read dataset {}", args.dataset.display()))?;
    if format != Format::ImageFolder {
        bail!(
            "{} is a {} dataset: `ladle bench baseline` measures torchvision's ImageFolder; \
             measure your own pipeline and give the figure with `ladle cost --private-cpu-ms MS`",
            args.dataset.display(),
            format.name()
        );
    }
    if let Some(dir) = &args.record
        && !dir.join(ladle_observe::record::REPORT).is_file()
    {
        bail!(
            "{} holds no sweep report ({}): record a sweep with `ladle sweep --record DIR` first",
            dir.display(),
            ladle_observe::record::REPORT
        );
    }
    if !args.json {
        eprintln!(
            "ladle bench baseline: loading {} for {} s with {} ({} workers, batch {}, {} px)...",
            args.dataset.display(),
            args.seconds,
            args.python.display(),
            args.workers,
            args.batch_size,
            args.image_size,
        );
    }
    let baseline = measure(args)?;
    let per_sample_ms = 1e3 * baseline.cpu_per_sample();
    if let Some(dir) = &args.record {
        let path = dir.join(ladle_observe::record::BASELINE);
        std::fs::write(&path, serde_json::to_string_pretty(&baseline)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        if !args.json {
            eprintln!(
                "ladle bench baseline: wrote {}; `ladle cost {}` prices private pipelines with it",
                path.display(),
                dir.display()
            );
        }
    }
    if args.json {
        let mut v = serde_json::to_value(&baseline)?;
        v["cpu_ms_per_sample"] = per_sample_ms.into();
        crate::records::print_line(&v.to_string())?;
    } else {
        println!(
            "torchvision DataLoader: {} samples in {:.1} s ({:.0} samples/s), {per_sample_ms:.2} ms \
             CPU per sample (torch {}, {} workers)",
            baseline.samples,
            baseline.seconds,
            baseline.samples as f64 / baseline.seconds.max(f64::EPSILON),
            baseline.torch,
            baseline.workers,
        );
    }
    Ok(())
}

/// Runs the script with the user's Python and reads its line.
fn measure(args: &BaselineArgs) -> anyhow::Result<Baseline> {
    let python = args.python.display().to_string();
    let out = Command::new(&args.python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(&args.dataset)
        .args([
            args.image_size.to_string(),
            args.batch_size.to_string(),
            args.workers.to_string(),
            args.seconds.to_string(),
        ])
        .output()
        .with_context(|| format!("cannot start {python} (give another with --python)"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    let parsed: Option<serde_json::Value> = line.and_then(|l| serde_json::from_str(l).ok());
    if let Some(error) = parsed.as_ref().and_then(|v| v["error"].as_str()) {
        bail!(
            "{python}: {error}. Install them in the Python you train with (or name it with \
             --python); without a measurement `ladle cost` prices private pipelines at the \
             feed's own decode cost (a lower bound), or at your figure (--private-cpu-ms)"
        );
    }
    let Some(v) = parsed.filter(|_| out.status.success()) else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "{python} measuring {} failed ({}):\n{}",
            args.dataset.display(),
            out.status,
            tail.join("\n")
        );
    };
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    let baseline = Baseline {
        dataset: args.dataset.display().to_string(),
        samples: v["samples"].as_u64().unwrap_or(0),
        seconds: v["seconds"].as_f64().unwrap_or(0.0),
        cpu_seconds: v["cpu_seconds"].as_f64().unwrap_or(0.0),
        workers: args.workers,
        batch_size: args.batch_size,
        image_size: args.image_size,
        python: text("python"),
        torch: text("torch"),
        torchvision: text("torchvision"),
    };
    if baseline.samples == 0 || baseline.cpu_seconds <= 0.0 {
        bail!(
            "{python} loaded {} samples using {} CPU seconds in {:.1} s: nothing to measure \
             (a longer --seconds?)",
            baseline.samples,
            baseline.cpu_seconds,
            baseline.seconds
        );
    }
    Ok(baseline)
}

/// The baseline written into recording `dir`, if any.
pub(crate) fn read(dir: &Path) -> anyhow::Result<Option<Baseline>> {
    let path = dir.join(ladle_observe::record::BASELINE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}
