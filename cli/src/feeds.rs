//! Feeds by name: `ladle serve --registry` (a feed in the user's registry of live feeds, and
//! `--detach` to start one as a process of its own), `ladle consume --dataset`, and `ladle
//! feeds` (list, start, stop). The registry itself is `ladle_feeds`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use ladle_datasets::transforms::Transforms;
use ladle_feeds::{Entry, FeedRequest, Registry, StartOptions, Starter};

/// The canonical spelling of the transform a feed serves: `spec` (torchvision's names), else
/// the evaluation transform at `image_size` when `eval`, else the training one. It is what a
/// feed's identity shows and what its registry key is made of.
///
/// # Errors
/// When `spec` is not a usable pipeline.
pub fn transform_spelling(
    image_size: u32,
    spec: Option<&str>,
    eval: bool,
) -> anyhow::Result<String> {
    Ok(transforms(image_size, spec, eval)?.to_string())
}

/// The transform a feed serves: `spec`, else the evaluation or training transform at
/// `image_size` (`ladle serve`'s choice, shared with [`transform_spelling`]).
pub(crate) fn transforms(
    image_size: u32,
    spec: Option<&str>,
    eval: bool,
) -> anyhow::Result<Transforms> {
    Ok(match spec {
        Some(spec) => Transforms::parse(spec)
            .with_context(|| format!("--transform {spec:?} is not a usable pipeline"))?,
        None if eval => Transforms::eval(image_size),
        None => Transforms::train(image_size),
    })
}

/// A feed named by its data: what `ladle consume --dataset` and `ladle feeds start` take.
#[derive(Debug, Args, Clone)]
pub(crate) struct AskArgs {
    /// Join the live feed of this dataset (with --image-size or --transform, --eval and
    /// --seed: `ladle serve`'s defaults) for this user on this node, or start one if none
    /// runs. With --socket (or $LADLE_SOCKET), join that socket if it serves this, else fail
    /// naming the difference.
    #[arg(long, value_name = "PATH")]
    pub(crate) dataset: Option<PathBuf>,
    /// Side of the square output images (with --dataset).
    #[arg(long, value_name = "PX", default_value_t = 224, requires = "dataset")]
    image_size: u32,
    /// The transform pipeline, as `ladle serve --transform` takes it (with --dataset).
    #[arg(long, value_name = "SPEC", requires = "dataset", conflicts_with_all = ["eval", "image_size"])]
    transform: Option<String>,
    /// The evaluation transform instead of the training one (with --dataset).
    #[arg(long, requires = "dataset")]
    eval: bool,
    /// Seed of the feed's permutations and augmentation (with --dataset): one feed per seed.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "dataset")]
    seed: u64,
    /// If this starts the feed: it stops this many seconds after its last consumer left.
    #[arg(long, value_name = "S", default_value_t = ladle_feeds::request::DEFAULT_IDLE_TIMEOUT.as_secs_f64(), requires = "dataset")]
    idle_timeout: f64,
    /// If this starts the feed: it stops this many seconds after its start if no consumer
    /// ever joined.
    #[arg(long, value_name = "S", default_value_t = ladle_feeds::request::DEFAULT_ORPHAN_TIMEOUT.as_secs_f64(), requires = "dataset")]
    orphan_timeout: f64,
    /// If this starts the feed: its ring's shared memory, in MiB.
    #[arg(long, value_name = "MIB", requires = "dataset")]
    ring_mib: Option<u64>,
    /// If this starts the feed: its decode threads (default: all cores).
    #[arg(long, value_name = "N", requires = "dataset")]
    threads: Option<usize>,
}

impl AskArgs {
    /// The request these options make, if --dataset was given.
    pub(crate) fn request(&self) -> anyhow::Result<Option<FeedRequest>> {
        let Some(dataset) = &self.dataset else {
            return Ok(None);
        };
        let transform = transform_spelling(self.image_size, self.transform.as_deref(), self.eval)?;
        Ok(Some(FeedRequest::new(dataset, transform, self.seed)?))
    }

    /// How a feed started for this request runs.
    pub(crate) fn start_options(&self) -> anyhow::Result<StartOptions> {
        let secs = |flag: &str, s: f64| {
            Duration::try_from_secs_f64(s)
                .with_context(|| format!("{flag} {s} is not a number of seconds"))
        };
        Ok(StartOptions {
            idle_timeout: secs("--idle-timeout", self.idle_timeout)?,
            orphan_timeout: secs("--orphan-timeout", self.orphan_timeout)?,
            ring_mib: self.ring_mib,
            threads: self.threads,
            ..StartOptions::default()
        })
    }
}

/// The `ladle` that starts feeds from this process: `$LADLE_BIN`, else this command.
pub(crate) fn starter() -> anyhow::Result<Starter> {
    let own = crate::self_exe().ok().map(Starter::program);
    Ok(Starter::find(own)?)
}

/// `ladle feeds`: the user's live feeds on this node.
#[derive(Debug, Args)]
pub(crate) struct FeedsArgs {
    #[command(subcommand)]
    command: Option<FeedsCommand>,
    /// Print one JSON entry per line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum FeedsCommand {
    /// List the live feeds (the default): key, pid, consumers, samples published, dataset.
    Ls {
        /// One JSON entry per line.
        #[arg(long)]
        json: bool,
    },
    /// Find the live feed of a dataset, or start it, and print its entry (JSON): a driver's
    /// way to own a feed from a shell.
    Start(AskArgs),
    /// Stop feeds (SIGTERM: consumers are told the stream ended): by key, or --all.
    Stop {
        /// Keys, as `ladle feeds` lists them.
        keys: Vec<String>,
        /// Every live feed of this user on this node.
        #[arg(long, conflicts_with = "keys")]
        all: bool,
    },
}

pub(crate) fn run(args: FeedsArgs) -> anyhow::Result<()> {
    let registry = Registry::open()?;
    match args.command {
        None => list(&registry, args.json),
        Some(FeedsCommand::Ls { json }) => list(&registry, json || args.json),
        Some(FeedsCommand::Start(ask)) => {
            let request = ask
                .request()?
                .context("give the feed's data: --dataset PATH")?;
            let joined =
                ladle_feeds::ensure(&registry, &request, &ask.start_options()?, &starter()?)?;
            println!("{}", serde_json::to_string(&joined.entry)?);
            Ok(())
        }
        Some(FeedsCommand::Stop { keys, all }) => {
            let live = registry.live();
            let chosen: Vec<&Entry> = if all {
                live.iter().collect()
            } else {
                if keys.is_empty() {
                    anyhow::bail!(
                        "name the feeds to stop by key (`ladle feeds` lists them), or give --all"
                    );
                }
                keys.iter()
                    .map(|k| {
                        live.iter().find(|e| e.key.0 == *k).with_context(|| {
                            format!("no live feed {k} in {}", registry.dir().display())
                        })
                    })
                    .collect::<anyhow::Result<_>>()?
            };
            for entry in chosen {
                let sent = entry
                    .process()
                    .signal(ladle_os::Signal::TERM)
                    .with_context(|| {
                        format!("signalling feed {} (pid {})", entry.key, entry.pid)
                    })?;
                eprintln!(
                    "feed {} (pid {}): {}",
                    entry.key,
                    entry.pid,
                    if sent {
                        "asked to stop"
                    } else {
                        "already gone"
                    }
                );
            }
            Ok(())
        }
    }
}

fn list(registry: &Registry, json: bool) -> anyhow::Result<()> {
    let live = registry.live();
    if json {
        for entry in &live {
            println!("{}", serde_json::to_string(entry)?);
        }
        return Ok(());
    }
    if live.is_empty() {
        eprintln!("no live feeds in {}", registry.dir().display());
        return Ok(());
    }
    println!(
        "{:<16} {:>8} {:>9} {:>12}  {:<6} dataset, transform",
        "key", "pid", "consumers", "published", "seed"
    );
    for entry in &live {
        let stats = ladle_ring::protocol::feed_stats(&entry.socket, Duration::from_secs(2));
        let (consumers, published) = match &stats {
            Ok(s) => (s.consumers.len().to_string(), s.published.to_string()),
            Err(_) => ("?".into(), "?".into()),
        };
        println!(
            "{:<16} {:>8} {:>9} {:>12}  {:<6} {}, {}",
            entry.key,
            entry.pid,
            consumers,
            published,
            entry.request.seed,
            entry.request.dataset.display(),
            entry.request.transform
        );
    }
    Ok(())
}

/// The feed this `ladle serve --registry` serves: its request, its registry files, and its
/// life lock, held until the process ends.
pub(crate) struct RegistryFeed {
    pub(crate) request: FeedRequest,
    pub(crate) files: ladle_feeds::FeedFiles,
    _live: std::fs::File,
}

/// How long a `ladle serve --registry` waits for the life lock of a feed that is stopping.
const LIVE_WAIT: Duration = Duration::from_secs(10);

impl RegistryFeed {
    /// Takes the registry's place of `request`; fails if a live feed holds it.
    pub(crate) fn claim(request: FeedRequest) -> anyhow::Result<Self> {
        let registry = Registry::open()?;
        let files = registry.files(&request.key());
        let live = ladle_os::process::lock_file_wait(&files.live, Instant::now() + LIVE_WAIT)
            .with_context(|| format!("taking {}", files.live.display()))?;
        let Some(live) = live else {
            let pid = Entry::read(&files.entry)
                .ok()
                .flatten()
                .map_or_else(|| "?".to_owned(), |e| e.pid.to_string());
            anyhow::bail!(
                "a feed of this dataset, transform and seed already runs (pid {pid}, socket {}): join it, or stop it with `ladle feeds stop {}`",
                files.socket.display(),
                request.key()
            );
        };
        Ok(Self {
            request,
            files,
            _live: live,
        })
    }

    /// Publishes the entry of the feed now serving on its socket.
    pub(crate) fn publish(&self, config: &ladle_producer::ProducerConfig) -> anyhow::Result<Entry> {
        let pid = std::process::id();
        let entry = Entry {
            version: ladle_feeds::registry::ENTRY_VERSION,
            key: self.request.key(),
            request: self.request.clone(),
            socket: self.files.socket.clone(),
            pid,
            start_ticks: ladle_os::process::start_ticks(pid).unwrap_or(0),
            started_unix: ladle_observe::series::unix_now(),
            idle_timeout_s: config
                .lifetime
                .idle
                .map_or(f64::INFINITY, |d| d.as_secs_f64()),
            orphan_timeout_s: config
                .lifetime
                .orphan
                .map_or(f64::INFINITY, |d| d.as_secs_f64()),
            threads: u32::try_from(config.threads).unwrap_or(u32::MAX),
            ring_bytes: config.ring_bytes,
            log: self.files.log.clone(),
            ladle_version: crate::VERSION.to_owned(),
        };
        entry
            .publish(&self.files.entry)
            .with_context(|| format!("writing {}", self.files.entry.display()))?;
        Ok(entry)
    }

    /// Removes the entry if it is still this process's (before the life lock goes).
    pub(crate) fn withdraw(&self) {
        let ours = Entry::read(&self.files.entry)
            .ok()
            .flatten()
            .is_some_and(|e| e.pid == std::process::id());
        if ours && let Err(e) = std::fs::remove_file(&self.files.entry) {
            tracing::warn!(entry = %self.files.entry.display(), "cannot remove the feed's entry: {e}");
        }
    }
}

/// `ladle serve --registry --detach`: runs this same command without `--detach` in a session
/// of its own, its stdin from /dev/null, its stderr into the feed's log, and waits for the
/// entry it prints on stdout once it serves; prints that and returns. If the feed exits
/// first, its log's end is the error.
pub(crate) fn detach(request: &FeedRequest) -> anyhow::Result<()> {
    let registry = Registry::open()?;
    let files = registry.files(&request.key());
    // Appended to: the log keeps what every feed of this identity said, their summaries
    // (samples published) included.
    let line = crate::detach::run_detached("the feed", &files.log, |line| {
        serde_json::from_str::<Entry>(line).is_ok()
    })?;
    print!("{line}");
    Ok(())
}
