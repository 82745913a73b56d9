//! `ladle serve`: run a producer until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::Args;
use ladle_datasets::BadSamplePolicy;
use ladle_datasets::pipeline::default_threads;
use ladle_datasets::transforms::Transforms;
use ladle_producer::{Producer, ProducerConfig};

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// A Python dataset to serve instead of --dataset: `module:factory` names a module on the
    /// path and a callable in it that returns the dataset (an object with __len__ and
    /// __getitem__ returning a dict of arrays), or the dataset object itself. It is served by
    /// the Python package's producer (`python -m ladle serve`, worker processes) in the Python
    /// of $LADLE_PYTHON, else the one hosting this command (the package's `ladle`), else
    /// `python3`. With it: --socket, --ring-mib, --seed, --threads (worker processes),
    /// --keep-alive, --stall-timeout, --fail-on-bad-sample and --timeout.
    #[arg(value_name = "MODULE:FACTORY", conflicts_with = "dataset")]
    pub(crate) python: Option<String>,
    /// The control socket consumers connect to (created with mode 0600); or --registry.
    #[arg(long, required_unless_present = "registry")]
    pub(crate) socket: Option<PathBuf>,
    /// Serve as the feed of this dataset, transform and seed in the user's registry of live
    /// feeds ($LADLE_REGISTRY_DIR, else $XDG_RUNTIME_DIR/ladle, else /tmp/ladle-$UID), where
    /// `ladle consume --dataset` and Python's `ladle.Consumer(dataset=...)` find it: its
    /// socket is the registry's, one feed per identity (a second is refused). This is how a
    /// consumer that names its data starts a feed; it stops --idle-timeout seconds (default
    /// 30) after its last consumer left and --orphan-timeout seconds (default 60) after its
    /// start if none came. `ladle feeds` lists them.
    #[arg(long, conflicts_with_all = ["socket", "python", "name"])]
    pub(crate) registry: bool,
    /// With --registry: start the feed as a process of its own (a new session, its log in
    /// the registry), print its entry (JSON) once it serves, and return.
    #[arg(long, requires = "registry")]
    pub(crate) detach: bool,
    /// Register the feed under this name with the running scheduler (see --dir): jobs
    /// submitted with `ladle submit --feed NAME` get its socket in LADLE_SOCKET.
    #[arg(long)]
    name: Option<String>,
    /// The scheduler to register with (with --name); default as for `ladle submit`.
    #[command(flatten)]
    scheduler: crate::scheduler::DirArg,
    #[command(flatten)]
    pub(crate) feed: FeedOptions,
    #[command(flatten)]
    observe: crate::observe::ObserveArgs,
    /// With MODULE:FACTORY: a worker taking over S seconds on one sample is killed and
    /// replaced, the sample made again by another (default: no limit).
    #[arg(long, value_name = "S", requires = "python")]
    pub(crate) timeout: Option<f64>,
}

/// What a feed serves and how: shared by `ladle serve` and `ladle sweep`.
#[derive(Debug, Args)]
pub(crate) struct FeedOptions {
    /// The dataset (ImageFolder directory, CIFAR batches, WebDataset shards, or WebDataset
    /// shards by URL: `http://host/path/shard-{000..127}.tar`, fetched once per node into the
    /// shard cache, see --shard-cache); required (`ladle sweep --resume` takes it from the
    /// sweep it resumes).
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// Shared memory for the sample ring, in MiB; the largest batch a consumer may ask for
    /// is half the samples it holds.
    #[arg(long, default_value_t = 256)]
    pub(crate) ring_mib: u64,
    /// Side of the square output images, in pixels (with --transform, the spec's output size).
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    /// Decode threads (default: all cores); for a Python dataset (`ladle serve
    /// MODULE:FACTORY`), worker processes.
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Seed of the epoch permutations and the augmentation.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Use the evaluation transform, `Resize(SIZE*256/224), CenterCrop(SIZE)`, instead of the
    /// default `RandomResizedCrop(SIZE), RandomHorizontalFlip()`.
    #[arg(long)]
    eval: bool,
    /// The transform pipeline, with torchvision's names, arguments and defaults, e.g.
    /// 'RandomCrop(32, padding=4), RandomHorizontalFlip()' or the JSON list
    /// '[{"name":"RandomCrop","size":32,"padding":4},{"name":"RandomHorizontalFlip"}]'.
    /// Supported: RandomResizedCrop, RandomCrop (padding_mode constant|edge|reflect|symmetric),
    /// Resize, CenterCrop, RandomHorizontalFlip, RandomVerticalFlip, ColorJitter,
    /// RandomGrayscale, TrivialAugmentWide. It must end in a fixed square size, which sets the image size.
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["eval", "image_size"])]
    transform: Option<String>,
    /// Stop at the first undecodable sample instead of delivering it as a zero image with
    /// label -1.
    #[arg(long)]
    pub(crate) fail_on_bad_sample: bool,
    /// Seconds a consumer may hold the feed back without taking a batch (paused, evaluating,
    /// stopped) before the feed goes on without it; it rejoins when it resumes and still
    /// gets every sample of its epoch exactly once.
    #[arg(long, value_name = "S", default_value_t = ladle_producer::DEFAULT_STALL_TIMEOUT.as_secs_f64())]
    pub(crate) stall_timeout: f64,
    /// Connections served at once; more are refused with a clear reason.
    #[arg(long, value_name = "N", default_value_t = ladle_producer::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Stop once the last consumer has been gone this many seconds (after one joined).
    /// Default: never, or 30 with --registry.
    #[arg(long, value_name = "S", visible_alias = "keep-alive")]
    pub(crate) idle_timeout: Option<f64>,
    /// Stop this many seconds after the start if no consumer ever joined (whoever started
    /// the feed died before using it). Default: never, or 60 with --registry.
    #[arg(long, value_name = "S")]
    pub(crate) orphan_timeout: Option<f64>,
    /// How far ahead of its consumers the feed decodes, in samples beyond the furthest any
    /// of them has asked for: `auto` (four batches of the largest batch size, at least 16
    /// samples per decode thread), a number, or `ring` (as far as the ring allows, decoding
    /// samples nobody may read).
    #[arg(long, value_name = "N|auto|ring", default_value = "auto")]
    read_ahead: ladle_producer::ReadAhead,
    /// How consumers of different paces share the feed: `skim` (a consumer that keeps the
    /// others waiting for data, a quarter of a 2 s window or more, stops gating the feed and
    /// copies what its epoch still needs as the samples pass; it paces the feed again when the
    /// feed no longer outruns it) or `lockstep` (every run goes at the slowest one's pace).
    #[arg(long, value_name = "skim|lockstep", default_value = "skim")]
    pacing: ladle_producer::Pacing,
    #[command(flatten)]
    pub(crate) limits: LimitArgs,
    #[command(flatten)]
    pub(crate) cache: crate::cache::CacheArgs,
    #[command(flatten)]
    pub(crate) remote: crate::remote::RemoteArgs,
}

/// What one sample may cost: shared by `ladle serve`, `ladle sweep` and `ladle dataset
/// inspect`, so that inspect finds the same bad samples a feed would.
#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// The largest sample file (or WebDataset tar member) read, in MiB; a larger one is a bad
    /// sample, refused from its size before a byte is read. The default, 512 MiB, is the
    /// pixel budget's worth of uncompressed 8-bit RGB.
    #[arg(long, value_name = "MIB", default_value_t = ladle_datasets::limits::DEFAULT_MAX_FILE_BYTES >> 20)]
    max_file_mib: u64,
    /// The most pixels (width × height, read from the header) an image may have, in every
    /// format; a larger one is a bad sample, refused before it is decoded. The default is
    /// where torchvision's loader (PIL) refuses an image as a decompression bomb.
    #[arg(long, value_name = "N", default_value_t = ladle_datasets::limits::DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
}

impl LimitArgs {
    /// The limits these options give.
    pub(crate) fn limits(&self) -> anyhow::Result<ladle_datasets::SampleLimits> {
        if self.max_file_mib == 0 || self.max_pixels == 0 {
            anyhow::bail!("--max-file-mib and --max-pixels must be at least 1");
        }
        Ok(ladle_datasets::SampleLimits {
            max_file_bytes: self.max_file_mib.saturating_mul(1 << 20),
            max_pixels: self.max_pixels,
        })
    }
}

impl FeedOptions {
    /// The transform this feed serves (--transform, else --eval's or the training one at
    /// --image-size).
    pub(crate) fn transforms(&self) -> anyhow::Result<Transforms> {
        crate::feeds::transforms(self.image_size, self.transform.as_deref(), self.eval)
    }

    /// The registry request of this feed (`ladle serve --registry`).
    fn request(&self) -> anyhow::Result<ladle_feeds::FeedRequest> {
        Ok(ladle_feeds::FeedRequest::new(
            self.dataset()?,
            self.transforms()?.to_string(),
            self.seed,
        )?)
    }

    /// The dataset's path (`--dataset`).
    pub(crate) fn dataset(&self) -> anyhow::Result<&std::path::Path> {
        self.dataset
            .as_deref()
            .context("--dataset is required: the dataset to serve")
    }

    /// Opens the dataset and makes the producer's configuration for a feed on `socket`.
    pub(crate) fn open(
        &self,
        socket: PathBuf,
    ) -> anyhow::Result<(Box<dyn ladle_datasets::Dataset>, ProducerConfig)> {
        let path = self.dataset()?;
        let dataset = self.remote.open(path)?;
        let augment = self.transforms()?;
        let stall_timeout = std::time::Duration::try_from_secs_f64(self.stall_timeout)
            .ok()
            .filter(|t| *t >= std::time::Duration::from_millis(100))
            .with_context(|| {
                format!(
                    "--stall-timeout {} is not a number of seconds of at least 0.1",
                    self.stall_timeout
                )
            })?;
        let config = ProducerConfig {
            socket,
            ring_bytes: self.ring_mib << 20,
            augment,
            threads: self.threads.unwrap_or_else(default_threads),
            seed: self.seed,
            policy: if self.fail_on_bad_sample {
                BadSamplePolicy::Fail
            } else {
                BadSamplePolicy::Skip
            },
            stall_timeout,
            max_connections: self.max_connections,
            lifetime: ladle_producer::Lifetime {
                idle: seconds("--idle-timeout", self.idle_timeout)?,
                orphan: seconds("--orphan-timeout", self.orphan_timeout)?,
                hold: None,
            },
            read_ahead: self.read_ahead,
            pacing: self.pacing,
            limits: self.limits.limits()?,
            cache: self.cache.start()?,
        };
        Ok((dataset, config))
    }
}

/// `--flag S` as a duration.
fn seconds(flag: &str, value: Option<f64>) -> anyhow::Result<Option<std::time::Duration>> {
    value
        .map(|s| {
            std::time::Duration::try_from_secs_f64(s)
                .with_context(|| format!("{flag} {s} is not a number of seconds"))
        })
        .transpose()
}

/// The feed's name in metrics and records: its `--name`, else its socket's file name.
fn feed_label(args: &ServeArgs, socket: &std::path::Path) -> String {
    args.name.clone().unwrap_or_else(|| {
        socket
            .file_name()
            .map_or_else(|| "feed".to_owned(), |f| f.to_string_lossy().into_owned())
    })
}

/// How often a named feed registers again with the scheduler.
const REREGISTER: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) fn run(args: ServeArgs, given: &clap::ArgMatches) -> anyhow::Result<()> {
    if let Some(spec) = &args.python {
        return crate::serve_python::exec(spec, &args, given);
    }
    args.feed.dataset().map_err(|_| {
        anyhow::anyhow!(
            "nothing to serve: give --dataset DIR (images: ImageFolder, CIFAR batches, \
             WebDataset shards) or a Python dataset as MODULE:FACTORY"
        )
    })?;
    let registered = if args.registry {
        let request = args.feed.request()?;
        if args.detach {
            return crate::feeds::detach(&request);
        }
        Some(crate::feeds::RegistryFeed::claim(request)?)
    } else {
        None
    };
    let socket = match (&registered, &args.socket) {
        (Some(feed), _) => feed.files.socket.clone(),
        (None, Some(socket)) => socket.clone(),
        (None, None) => anyhow::bail!("give --socket PATH, or --registry"),
    };
    let (dataset, mut config) = args.feed.open(socket.clone())?;
    if let Some(feed) = &registered {
        let lifetime = &mut config.lifetime;
        lifetime
            .idle
            .get_or_insert(ladle_feeds::request::DEFAULT_IDLE_TIMEOUT);
        lifetime
            .orphan
            .get_or_insert(ladle_feeds::request::DEFAULT_ORPHAN_TIMEOUT);
        lifetime.hold = Some(feed.files.hold.clone());
    }
    let settings = config.clone();
    let producer_threads = config.threads;
    let transform = ladle_sweep::engine::transform_key(&config);
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    let producer = Producer::start_with_stop(Arc::from(dataset), config, stop.clone())
        .with_context(|| format!("cannot start serving on {}", socket.display()))?;
    let layout = producer.layout();
    eprintln!(
        "serving {} on {} (ring: {} samples of `{}`, batch sizes up to {}); Ctrl-C to stop",
        args.feed.dataset()?.display(),
        socket.display(),
        layout.capacity,
        layout.schema,
        layout.max_batch()
    );
    if let Some(feed) = &registered {
        // The entry is the readiness signal: `--detach` (and anyone reading stdout) returns
        // on this line.
        let entry = match feed.publish(&settings) {
            Ok(entry) => entry,
            Err(e) => {
                producer.stop();
                let _ = producer.wait();
                return Err(e);
            }
        };
        let line = serde_json::to_string(&entry)?;
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        // A starter that has gone (EPIPE) does not stop the feed.
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        eprintln!(
            "registered in {} as feed {} (stops {:.0} s after its last consumer leaves, {:.0} s after its start if none comes)",
            feed.files.entry.display(),
            entry.key,
            entry.idle_timeout_s,
            entry.orphan_timeout_s
        );
    }
    if let Some(name) = &args.name {
        let socket = socket.canonicalize().unwrap_or_else(|_| socket.clone());
        let spec = ladle_scheduler::protocol::FeedSpec {
            name: name.clone(),
            socket,
            dataset: ladle_sweep::engine::dataset_key(args.feed.dataset()?),
            transform,
            threads: u32::try_from(producer_threads).unwrap_or(u32::MAX),
            pid: std::process::id(),
            ring_bytes: layout.file_len(),
        };
        let request = ladle_scheduler::protocol::Request::RegisterFeed(spec);
        if let Err(e) = args.scheduler.request(&request) {
            producer.stop();
            let _ = producer.wait();
            return Err(e.context(format!("cannot register the feed {name:?}")));
        }
        eprintln!("registered as feed {name:?}: `ladle submit --feed {name}` jobs get its socket");
        // Feeds are not journaled: registering again now and then makes a restarted
        // scheduler know this feed within REREGISTER.
        let (scheduler, stop) = (args.scheduler.clone(), stop.clone());
        std::thread::Builder::new()
            .name("ladle-feed-register".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(REREGISTER);
                    if let Err(e) = scheduler.request(&request) {
                        tracing::debug!("registering the feed again failed: {e:#}");
                    }
                }
            })
            .context("starting the feed's registration thread")?;
    }
    let observer = {
        let (stats, feed) = (producer.stats_source(), feed_label(&args, &socket));
        args.observe.start(move || ladle_observe::Snapshot {
            time: ladle_observe::series::unix_now(),
            feeds: vec![(feed.clone(), Ok(stats.stats()))],
            scheduler: None,
        })
    };
    let observer = match observer {
        Ok(observer) => observer,
        Err(e) => {
            producer.stop();
            let _ = producer.wait();
            return Err(e);
        }
    };
    let started = std::time::Instant::now();
    let served = producer.wait().context("the producer failed");
    if let Some(feed) = &registered {
        feed.withdraw();
    }
    if let Some(observer) = observer {
        observer.stop();
    }
    let served = served?;
    let (published, bad) = (served.published, served.bad_samples);
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "stopped after publishing {published} samples ({bad} bad); consumers were told the stream ended"
    );
    // One machine-readable summary on stdout (read back by `ladle bench` and `ladle demo`).
    let summary = crate::records::ServeSummary {
        bad_samples: bad,
        published,
        consumed: served.consumed,
        samples_per_s: published as f64 / seconds.max(f64::EPSILON),
        seconds,
    };
    if registered.is_some() {
        // Its starter read stdout only up to the entry, and is gone: the log keeps it.
        eprintln!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    crate::records::Record::print(&summary)
}
