//! `ladle cache`: the decoded-sample cache's keeper (`keep`, started by feeds with
//! `--cache-gib`), what it holds (`ls`) and letting it go (`drop`). The cache itself is
//! `ladle_cache`; the options a feed takes are [`CacheArgs`].

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

/// The cache options of a feed (`ladle serve`, `ladle sweep`).
#[derive(Debug, Args, Clone)]
pub(crate) struct CacheArgs {
    /// Keep decoded images (before any augmentation) in a cache shared by every feed of the
    /// dataset on this node, whatever its transform, seed or image size: later epochs,
    /// other feeds (a sweep over seeds) and restarted feeds decode nothing it holds, and
    /// samples stay bit-identical. Its budget in GiB of host memory, or `auto` (a quarter of
    /// the memory free now, off below 1 GiB); what does not fit is decoded every time, and
    /// nothing in it is evicted to admit more. ImageFolder datasets only. Default 0: off.
    #[arg(
        long,
        value_name = "GIB|auto",
        env = "LADLE_CACHE_GIB",
        default_value = "0"
    )]
    cache_gib: CacheBudget,
    /// Seconds the cache keeps a dataset no feed uses (a sweep's next run, a restarted
    /// feed, a resumed run find it); `ladle cache drop` lets it go sooner.
    #[arg(long, value_name = "S", default_value_t = 600.0)]
    cache_idle_timeout: f64,
}

/// `--cache-gib`: GiB, or a share of the memory free.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CacheBudget {
    /// This many GiB.
    Gib(f64),
    /// A quarter of the memory free when the feed starts.
    Auto,
}

impl std::str::FromStr for CacheBudget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            n => match n.parse::<f64>() {
                Ok(g) if g.is_finite() && g >= 0.0 => Ok(Self::Gib(g)),
                _ => Err(format!("{n:?}: give a number of GiB (0 for off) or `auto`")),
            },
        }
    }
}

impl CacheBudget {
    /// Bytes, given the memory free now (`auto`: a quarter of it, whole GiB, 0 below one).
    pub(crate) fn bytes(self, free: Option<u64>) -> u64 {
        match self {
            Self::Gib(g) => (g * (1u64 << 30) as f64) as u64 / 4096 * 4096,
            Self::Auto => free.map_or(0, |f| ((f / 4) >> 30) << 30),
        }
    }
}

impl CacheArgs {
    /// How a feed reaches (or starts) the keeper; `None` when the cache is off.
    pub(crate) fn start(&self) -> anyhow::Result<Option<ladle_cache::KeeperStart>> {
        let budget = self.cache_gib.bytes(ladle_os::mem::available());
        if budget == 0 {
            if self.cache_gib == CacheBudget::Auto {
                tracing::warn!(
                    "--cache-gib auto: less than 4 GiB of memory is free, so the cache is off"
                );
            }
            return Ok(None);
        }
        let idle_timeout =
            Duration::try_from_secs_f64(self.cache_idle_timeout).with_context(|| {
                format!(
                    "--cache-idle-timeout {} is not a number of seconds",
                    self.cache_idle_timeout
                )
            })?;
        let registry = ladle_feeds::Registry::open()?;
        Ok(Some(ladle_cache::KeeperStart {
            dir: registry.dir().to_path_buf(),
            program: crate::self_exe()
                .context("finding the ladle command to start the cache's keeper with")?,
            args: Vec::new(),
            budget,
            idle_timeout,
            timeout: Duration::from_secs(30),
        }))
    }
}

#[derive(Debug, Args)]
pub(crate) struct CacheCommandArgs {
    #[command(subcommand)]
    command: Option<CacheCommand>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// What the cache holds (the default): per dataset, its entries, bytes, feeds attached
    /// and how long it has been idle; the keeper's budget and CPU.
    Ls {
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Let go of a dataset's entries (by key, as `ladle cache ls` shows it) or of every
    /// dataset's: the memory returns once the feeds reading it let go; feeds go on decoding.
    Drop {
        /// The dataset's key.
        key: Option<String>,
        /// Every dataset.
        #[arg(long, conflicts_with = "key")]
        all: bool,
    },
    /// Run the keeper (feeds started with --cache-gib start it; you need not).
    Keep(KeepArgs),
}

#[derive(Debug, Args)]
struct KeepArgs {
    /// The registry directory it lives in (default: the feeds' registry).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Its budget, bytes.
    #[arg(long, value_name = "BYTES")]
    budget_bytes: u64,
    /// Seconds it keeps a dataset no feed uses, and lives on holding nothing.
    #[arg(long, value_name = "S", default_value_t = 600.0)]
    idle_timeout: f64,
    /// Start it as a process of its own (its own session, its log in the registry) and
    /// return once it serves, printing its entry.
    #[arg(long)]
    detach: bool,
}

fn registry_dir(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match dir {
        Some(dir) => Ok(dir),
        None => Ok(ladle_feeds::Registry::open()?.dir().to_path_buf()),
    }
}

pub(crate) fn run(args: CacheCommandArgs) -> anyhow::Result<()> {
    match args.command {
        None => list(args.json),
        Some(CacheCommand::Ls { json }) => list(json || args.json),
        Some(CacheCommand::Drop { key, all }) => {
            if key.is_none() && !all {
                anyhow::bail!(
                    "name the dataset to drop by key (`ladle cache ls` shows them), or give --all"
                );
            }
            let dir = registry_dir(None)?;
            let Some(operator) = ladle_cache::operator(&dir)? else {
                anyhow::bail!("no cache keeper runs in {}: nothing to drop", dir.display());
            };
            operator.drop_datasets(key.as_deref())?;
            eprintln!("dropped {}", key.as_deref().unwrap_or("every dataset"));
            Ok(())
        }
        Some(CacheCommand::Keep(keep)) => run_keeper(keep),
    }
}

fn list(json: bool) -> anyhow::Result<()> {
    let dir = registry_dir(None)?;
    let Some(operator) = ladle_cache::operator(&dir)? else {
        if json {
            println!("null");
        } else {
            println!(
                "no cache keeper runs in {} (feeds start one with --cache-gib)",
                dir.display()
            );
        }
        return Ok(());
    };
    let listing = operator.list()?;
    if json {
        println!("{}", serde_json::to_string(&listing)?);
        return Ok(());
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    println!(
        "keeper pid {}: {:.2} of {:.2} GiB used, datasets kept {:.0} s after their last feed, {:.1} s CPU",
        listing.pid,
        gib(listing.used),
        gib(listing.budget),
        listing.idle_timeout_s,
        listing.cpu_s
    );
    println!(
        "{:<16} {:>9} {:>9} {:>9} {:>6} {:>7}  dataset",
        "key", "entries", "samples", "GiB", "feeds", "idle s"
    );
    for d in &listing.datasets {
        println!(
            "{:<16} {:>9} {:>9} {:>9.2} {:>6} {:>7.0}  {}{}",
            d.key,
            d.entries,
            d.len,
            gib(d.bytes),
            d.lanes,
            d.idle_s,
            d.root,
            if d.full { " (budget spent)" } else { "" }
        );
    }
    Ok(())
}

fn run_keeper(keep: KeepArgs) -> anyhow::Result<()> {
    let dir = registry_dir(keep.dir.clone())?;
    let files = ladle_cache::KeeperFiles::in_dir(&dir);
    if keep.detach {
        let line = crate::detach::run_detached("the cache keeper", &files.log, |line| {
            serde_json::from_str::<ladle_cache::KeeperEntry>(line).is_ok()
        })?;
        print!("{line}");
        return Ok(());
    }
    let idle_timeout = Duration::try_from_secs_f64(keep.idle_timeout).with_context(|| {
        format!(
            "--idle-timeout {} is not a number of seconds",
            keep.idle_timeout
        )
    })?;
    let config = ladle_cache::keeper::KeeperConfig {
        dir,
        budget: keep.budget_bytes,
        idle_timeout,
    };
    ladle_cache::keeper::run(config, |entry| {
        let mut out = std::io::stdout().lock();
        if let Ok(line) = serde_json::to_string(entry) {
            let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        }
    })?;
    Ok(())
}
