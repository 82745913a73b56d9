//! `ladle dataset generate|inspect|index`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use ladle_datasets::Format;
use ladle_datasets::imagefolder::display_extension;
use ladle_datasets::inspect::InspectReport;
use ladle_datasets::pipeline::default_threads;
use ladle_datasets::synth::{GenerateSummary, SynthConfig};

use crate::progress;

#[derive(Debug, Subcommand)]
pub(crate) enum DatasetCommand {
    /// Write a synthetic dataset of photo-like images as real files.
    ///
    /// ImageFolder and WebDataset images are 500x375 JPEGs of about 100 KB by default, in
    /// mixed encodings (baseline, progressive, 4:4:4, 4:2:2, grayscale, CMYK) plus a few
    /// PNGs; CIFAR images are 32x32.
    Generate(GenerateArgs),
    /// Detect a dataset's format, count samples and classes, decode every sample once and
    /// name the bad files.
    ///
    /// Exits 0 when the dataset could be read, even with bad files (they are listed);
    /// non-zero when it cannot be read at all.
    Inspect(InspectArgs),
    /// Write the shard index of a folder of WebDataset shards, to upload beside them: a
    /// feed given the index's URL serves while the shards arrive, and can read a dataset
    /// larger than its disk (docs/remote-data.md, "Streaming").
    ///
    /// The index is WebDataset's own (wids' `wids-shard-index-v1`, as `widsindex create`
    /// writes): each shard's file name, images and bytes, plus the class names (from a
    /// classes.txt beside the shards, else the label numbers). It goes to stdout, or --out.
    Index(IndexArgs),
}

#[derive(Debug, Args)]
pub(crate) struct IndexArgs {
    /// The folder of .tar shards (or one .tar file).
    path: PathBuf,
    /// Write the index here instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// The dataset's name in the index (default: the folder's name).
    #[arg(long)]
    name: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum FormatArg {
    /// One sub-folder per class of JPEG/PNG files.
    Imagefolder,
    /// CIFAR-10 binary batches (data_batch_N.bin).
    Cifar10,
    /// CIFAR-100 binary (train.bin).
    Cifar100,
    /// WebDataset tar shards (.jpg/.png + .cls members).
    Wds,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Imagefolder => Format::ImageFolder,
            FormatArg::Cifar10 => Format::Cifar10,
            FormatArg::Cifar100 => Format::Cifar100,
            FormatArg::Wds => Format::WebDataset,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    /// Dataset format to write.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// Number of samples.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Output directory (created; must be empty unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Seed of all generated content: the same seed writes the same files.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of classes.
    #[arg(long, default_value_t = 10)]
    classes: u32,
    /// Image width in pixels (ImageFolder, WebDataset).
    #[arg(long, default_value_t = 500)]
    width: u32,
    /// Image height in pixels (ImageFolder, WebDataset).
    #[arg(long, default_value_t = 375)]
    height: u32,
    /// JPEG quality, 1-100.
    #[arg(long, default_value_t = 90)]
    quality: u8,
    /// Samples per WebDataset shard.
    #[arg(long, default_value_t = ladle_datasets::synth::DEFAULT_SHARD_SAMPLES)]
    shard_size: u64,
    /// Threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Write into a non-empty directory, overwriting files of the same names.
    #[arg(long)]
    force: bool,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The dataset: an ImageFolder directory, a directory of CIFAR .bin batches or of
    /// WebDataset .tar shards, a single .bin or .tar file, or WebDataset shards by URL
    /// (`http://host/path/shard-{000..127}.tar`, fetched into the shard cache).
    path: PathBuf,
    /// Print one JSON object on stdout (keys include format, samples, classes, bad_files).
    #[arg(long)]
    json: bool,
    /// Decoding threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    limits: crate::serve::LimitArgs,
    #[command(flatten)]
    remote: crate::remote::RemoteArgs,
}

pub(crate) fn run(cmd: DatasetCommand) -> anyhow::Result<()> {
    match cmd {
        DatasetCommand::Generate(args) => generate_cmd(args),
        DatasetCommand::Inspect(args) => inspect_cmd(args),
        DatasetCommand::Index(args) => index_cmd(args),
    }
}

fn index_cmd(args: IndexArgs) -> anyhow::Result<()> {
    // The shards and class names a feed of the folder would read.
    let (folder, shards) = ladle_datasets::wds::shard_paths(&args.path)?;
    if shards.is_empty() {
        bail!("{}: no .tar shards there", args.path.display());
    }
    let bar = progress::bar(shards.len() as u64, "index");
    let mut shardlist = Vec::new();
    let mut max_label = -1i64;
    for shard in &shards {
        let (file, samples) = ladle_datasets::wds::index_one(shard)
            .with_context(|| format!("cannot index {}", shard.display()))?;
        if samples.is_empty() {
            bail!("{}: no images in this shard", shard.display());
        }
        for sample in &samples {
            if let Some(label) = sample.label {
                max_label = max_label.max(label);
            }
        }
        shardlist.push(ladle_fetch::index::IndexShard {
            url: shard
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            nsamples: samples.len() as u64,
            filesize: file.metadata()?.len(),
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let classes = ladle_datasets::wds::named_classes(folder)?
        .unwrap_or_else(|| (0..=max_label).map(|l| l.to_string()).collect());
    let index = ladle_fetch::index::ShardIndex {
        kind: ladle_fetch::index::KIND.to_owned(),
        name: args.name.or_else(|| {
            folder
                .canonicalize()
                .ok()?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        }),
        base_path: None,
        shardlist,
        classes: Some(classes),
    };
    let text = serde_json::to_string_pretty(&index)? + "\n";
    match &args.out {
        Some(out) => {
            std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!(
                "{}: {} shards, {} samples",
                out.display(),
                index.shardlist.len(),
                index.shardlist.iter().map(|s| s.nsamples).sum::<u64>()
            );
        }
        None => print!("{text}"),
    }
    Ok(())
}

fn generate_cmd(args: GenerateArgs) -> anyhow::Result<()> {
    if !args.force && is_non_empty_dir(&args.out) {
        bail!(
            "{} is not empty; pass --force to write into it anyway",
            args.out.display()
        );
    }
    let config = SynthConfig {
        format: args.format.into(),
        count: args.count,
        classes: args.classes,
        width: args.width,
        height: args.height,
        quality: args.quality,
        seed: args.seed,
        shard_samples: args.shard_size,
        threads: args.threads.unwrap_or_else(default_threads),
    };
    let summary = generate(&config, &args.out)?;
    if args.json {
        crate::records::print_line(&serde_json::to_string(&summary)?)?;
    } else {
        println!(
            "wrote {} {} samples to {} ({} files, {:.1} MB)",
            summary.samples,
            config.format,
            args.out.display(),
            summary.files,
            summary.bytes as f64 / 1e6
        );
    }
    Ok(())
}

/// Generates with a progress bar.
pub(crate) fn generate(config: &SynthConfig, out: &Path) -> anyhow::Result<GenerateSummary> {
    let bar = progress::bar(config.count, "generate");
    let summary =
        ladle_datasets::synth::generate(config, out, &|n| bar.inc(n)).with_context(|| {
            format!(
                "generating a {} dataset in {}",
                config.format,
                out.display()
            )
        })?;
    bar.finish_and_clear();
    Ok(summary)
}

fn is_non_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_some())
}

fn inspect_cmd(args: InspectArgs) -> anyhow::Result<()> {
    let dataset = args.remote.open(&args.path)?;
    let bar = progress::bar(dataset.len(), "decode");
    let threads = args.threads.unwrap_or_else(default_threads);
    let limits = args.limits.limits()?;
    let report =
        ladle_datasets::inspect::inspect(dataset.as_ref(), threads, limits, &|n| bar.inc(n))?;
    bar.finish_and_clear();
    if args.json {
        crate::records::print_line(&serde_json::to_string(&report)?)?;
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(r: &InspectReport) {
    println!("dataset   {}", ladle_datasets::names::escape_path(&r.path));
    println!("format    {}", r.format);
    println!("samples   {}", r.samples);
    let mut names = r
        .class_names
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if r.classes > 10 {
        names.push_str(", ...");
    }
    println!("classes   {} ({names})", r.classes);
    println!("decoded   {}", r.decoded);
    if let (Some(min), Some(max)) = (r.min_size, r.max_size) {
        println!("sizes     {}x{} .. {}x{}", min.0, min.1, max.0, max.1);
    }
    if !r.left_out.is_empty() {
        let total: u64 = r.left_out.iter().map(|l| l.files).sum();
        let by_extension = r
            .left_out
            .iter()
            .map(|l| format!("{} {}", l.files, display_extension(&l.extension)))
            .collect::<Vec<_>>()
            .join(", ");
        println!("left out  {total} files not read as images ({by_extension})");
    }
    for warning in &r.warnings {
        println!("warning   {warning}");
    }
    if r.errors.is_empty() {
        println!("bad files none");
    } else {
        println!("bad files {}", r.errors.len());
        for e in &r.errors {
            println!("  {}: {}", e.location, e.error);
        }
    }
}
