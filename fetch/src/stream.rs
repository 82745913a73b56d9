//! A dataset by shard index, streamed: the feed serves while shards arrive, and keeps on disk
//! only what it needs soon, so a dataset larger than the node's disk can be read.
//!
//! - **What is known first**: the index ([`crate::index`]) gives each shard's samples and
//!   size, so sample `i` is the `k`-th image of shard `s` before any shard is read.
//! - **The order**: the feed shuffles a window of shards at a time
//!   ([`ladle_datasets::sampler::Grouping`]) and tells this dataset each epoch's order
//!   ([`Streamed::schedule`]) and how far its decoders are ([`Streamed::reached`]: the
//!   ring's head, before which everything is decoded).
//! - **Fetching**: a thread of its own runs a tokio runtime. It walks the order from where
//!   the decoders are and fetches the next shards not on disk, at most `concurrency` at once
//!   and no further ahead than a window's worth of shards (shards in flight together share
//!   the link), while what is on disk and in flight fits the shard cache's budget; a decoder
//!   that asks for a shard not there goes first. Each shard goes to a `.part` file and is renamed when
//!   whole, as [`crate::fetch`] does; another feed of the dataset on the node waits on the
//!   shard's lock and finds it there (one GET per shard per node while it stays).
//! - **Eviction**: to make room, the shard needed last by the known order (or not at all) is
//!   removed if that is later than the one fetched (Belady's rule); never one a decoder is
//!   reading, nor one another feed of the node is fetching or opening (its lock). A dataset
//!   that fits the budget is fetched once; one that does not is fetched again each epoch.
//! - **Failure**: a shard that cannot be fetched (after the retries) makes its samples bad
//!   samples naming its URL, for 30 s; then it is tried again.

use std::collections::{BTreeSet, VecDeque};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ladle_datasets::sampler::Grouping;
use ladle_datasets::wds::TarSample;
use ladle_datasets::{Dataset, Format, RecordData, Streamed};
use ladle_datasets::{Fingerprint, SampleError, SampleLimits};

use crate::http::{self, Counters};
use crate::index::ShardIndex;
use crate::{FetchError, FetchOptions, InUse, RemoteSpec, S3Env};

mod fetcher;

/// The most positions walked ahead when deciding what to fetch.
const WALK: usize = 1 << 20;

/// How long a shard that failed makes its samples bad before it is tried again.
const FAILED_FOR: Duration = Duration::from_secs(30);

/// How to fetch one shard: a URL as it is, or an S3 object signed when fetched.
#[derive(Debug, Clone)]
enum Source {
    Url(String),
    S3 { bucket: String, key: String },
}

#[derive(Debug)]
struct ShardInfo {
    /// For logs and errors (never a signed URL).
    name: String,
    from: Source,
    file: PathBuf,
    nsamples: u64,
    filesize: u64,
}

/// A shard on disk, indexed.
#[derive(Debug)]
struct Local {
    file: std::fs::File,
    samples: Vec<TarSample>,
}

#[derive(Debug)]
enum Slot {
    /// Not indexed; on disk or not (`State::counted`).
    Absent,
    /// Being fetched (or found on disk and indexed): `reserved` bytes counted in flight.
    Fetching {
        reserved: u64,
    },
    Here {
        local: Arc<Local>,
        used: u64,
    },
    Failed {
        why: String,
        at: Instant,
    },
}

#[derive(Debug)]
struct State {
    slots: Vec<Slot>,
    schedules: VecDeque<(u64, Arc<[u64]>)>,
    urgent: BTreeSet<usize>,
    /// Shards whose lock another feed held when this one went to remove them (this plan).
    adopting: BTreeSet<usize>,
    tick: u64,
    /// Bytes of each shard's file counted in `on_disk` (a file found there when the dataset
    /// was opened counts before it is indexed).
    counted: Vec<u64>,
    on_disk: u64,
    in_flight: u64,
}

#[derive(Debug)]
struct Inner {
    shards: Vec<ShardInfo>,
    grouping: Grouping,
    budget: u64,
    concurrency: usize,
    retry: http::Retry,
    s3: S3Env,
    state: Mutex<State>,
    arrived: Condvar,
    wake: tokio::sync::Notify,
    reached: AtomicU64,
    stop: AtomicBool,
    /// Whether the fetcher thread runs (a reader waiting for a shard gives up when not).
    running: AtomicBool,
    counters: Arc<Counters>,
    evicted: AtomicU64,
    peak: AtomicU64,
}

/// What a streamed dataset did, for its closing log line and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStats {
    /// Shards fetched.
    pub fetched: u64,
    /// Bytes fetched.
    pub bytes: u64,
    /// Tries repeated after a transient failure.
    pub retried: u64,
    /// Shards removed from disk to keep the budget.
    pub evicted: u64,
    /// The most bytes on disk and in flight at once.
    pub peak_bytes: u64,
}

/// A WebDataset read by shard index while its shards arrive.
#[derive(Debug)]
pub struct StreamedDataset {
    inner: Arc<Inner>,
    /// The URL as written (the feed's source); the shards lie in `folder`.
    root: PathBuf,
    folder: PathBuf,
    starts: Vec<u64>,
    len: u64,
    classes: Vec<String>,
    fetcher: Option<std::thread::JoinHandle<()>>,
    _in_use: InUse,
}

impl StreamedDataset {
    /// Fetches the index `spec` names, and starts the fetcher (which waits for the feed's
    /// order, or a reader, before fetching a shard).
    ///
    /// # Errors
    /// [`FetchError`] naming the index's URL or the cache's folder.
    pub fn open(
        spec: &RemoteSpec,
        options: &FetchOptions,
        window: usize,
    ) -> Result<Self, FetchError> {
        let (dir, in_use) = crate::prepare(spec, options)?;
        let (index_url, signed) = match &spec.shards {
            crate::Shards::Http(urls) => (urls[0].clone(), urls[0].clone()),
            crate::Shards::S3Keys { bucket, keys } => (
                format!("s3://{bucket}/{}", keys[0]),
                options.s3.get_url(bucket, &keys[0])?,
            ),
            crate::Shards::S3Prefix { .. } => {
                return Err(FetchError::Url {
                    url: spec.spec.clone(),
                    why: "a prefix is not a shard index (name the .json object)".into(),
                });
            }
        };
        let text = crate::get_text(&signed, &index_url, options, &dir)?;
        let index = ShardIndex::parse(&index_url, &text).map_err(|e| FetchError::Url {
            url: e.url,
            why: e.why,
        })?;
        let urls = index.resolve(&index_url);
        let mut shards = Vec::with_capacity(urls.len());
        for (i, (url, entry)) in urls.iter().zip(&index.shardlist).enumerate() {
            let from = match url.strip_prefix("s3://") {
                Some(rest) => {
                    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                    Source::S3 {
                        bucket: bucket.to_owned(),
                        key: key.to_owned(),
                    }
                }
                None => Source::Url(url.clone()),
            };
            shards.push(ShardInfo {
                name: url.clone(),
                from,
                file: crate::shard_file(&dir, i, urls.len(), url),
                nsamples: entry.nsamples,
                filesize: entry.filesize,
            });
        }
        let mut starts = Vec::with_capacity(shards.len());
        let mut ends = Vec::with_capacity(shards.len());
        let mut at = 0u64;
        for shard in &shards {
            starts.push(at);
            at += shard.nsamples;
            ends.push(at);
        }
        let classes = index.classes.clone().unwrap_or_default();
        let n = shards.len();
        // Shards left by an earlier feed of this dataset (a restarted producer): read where
        // they are, and counted against the budget from the start.
        let counted: Vec<u64> = (shards.iter())
            .map(|s| std::fs::metadata(&s.file).map_or(0, |m| m.len()))
            .collect();
        let on_disk = counted.iter().sum();
        // A window and the next one's first shards must fit the budget together, or the
        // decoders would wait on shards evicted for each other.
        let largest = shards.iter().map(|s| s.filesize).max().unwrap_or(1).max(1);
        let fits = usize::try_from(options.cache.budget / largest).unwrap_or(usize::MAX);
        if fits == 0 {
            return Err(FetchError::OverBudget {
                spec: format!("{} (its largest shard)", spec.spec),
                bytes: largest,
                budget: options.cache.budget,
            });
        }
        let window = if window > fits / 2 {
            let fewer = (fits / 2).max(1);
            tracing::warn!(
                "shuffling {fewer} shards at a time, not {window}: the shard cache's budget holds {fits} of the largest shards, two windows' worth are needed"
            );
            fewer
        } else {
            window
        };
        let inner = Arc::new(Inner {
            grouping: Grouping {
                ends: ends.into(),
                window: window.clamp(1, n),
            },
            shards,
            budget: options.cache.budget,
            concurrency: options.concurrency.max(1),
            retry: options.retry,
            s3: options.s3.clone(),
            state: Mutex::new(State {
                slots: (0..n).map(|_| Slot::Absent).collect(),
                schedules: VecDeque::new(),
                urgent: BTreeSet::new(),
                adopting: BTreeSet::new(),
                tick: 0,
                counted,
                on_disk,
                in_flight: 0,
            }),
            arrived: Condvar::new(),
            wake: tokio::sync::Notify::new(),
            reached: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            running: AtomicBool::new(true),
            counters: Arc::new(Counters::default()),
            evicted: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        });
        let runner = inner.clone();
        let fetcher = std::thread::Builder::new()
            .name("ladle-stream".into())
            .spawn(move || runner.run())
            .map_err(|e| FetchError::Runtime(e.to_string()))?;
        tracing::info!(
            dataset = %spec.spec,
            shards = n,
            samples = at,
            window = inner.grouping.window,
            budget = inner.budget,
            "streaming a dataset by shard index"
        );
        Ok(Self {
            inner,
            root: PathBuf::from(&spec.spec),
            folder: dir,
            starts,
            len: at,
            classes,
            fetcher: Some(fetcher),
            _in_use: in_use,
        })
    }

    /// The shard cache's folder its shards are fetched into.
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// What it has done so far.
    pub fn stats(&self) -> StreamStats {
        self.inner.stats()
    }

    fn place(&self, index: u64) -> Result<(usize, usize), SampleError> {
        if index >= self.len {
            return Err(SampleError::OutOfRange {
                index,
                len: self.len,
            });
        }
        let shard = self.inner.grouping.shard_of(index);
        Ok((shard, (index - self.starts[shard]) as usize))
    }

    /// The shard of `index`, on disk: waits for it (asking the fetcher to put it first).
    fn local(&self, index: u64) -> Result<(Arc<Local>, usize, usize), SampleError> {
        let (shard, k) = self.place(index)?;
        let inner = &self.inner;
        let mut state = inner.lock();
        loop {
            let failed = match &state.slots[shard] {
                Slot::Here { local, .. } => {
                    let local = local.clone();
                    state.tick += 1;
                    let tick = state.tick;
                    if let Slot::Here { used, .. } = &mut state.slots[shard] {
                        *used = tick;
                    }
                    return Ok((local, shard, k));
                }
                Slot::Failed { why, at } if at.elapsed() < FAILED_FOR => Some(why.clone()),
                Slot::Failed { .. } => {
                    state.slots[shard] = Slot::Absent;
                    None
                }
                Slot::Absent | Slot::Fetching { .. } => None,
            };
            let failed = failed.or_else(|| {
                (!inner.running.load(Ordering::SeqCst))
                    .then(|| "the dataset's fetcher has stopped".to_owned())
            });
            if let Some(why) = failed {
                return Err(SampleError::Io {
                    location: format!("{}#{k}", inner.shards[shard].name),
                    source: std::io::Error::other(why),
                });
            }
            state.urgent.insert(shard);
            inner.wake.notify_one();
            state = inner
                .arrived
                .wait_timeout(state, Duration::from_millis(200))
                .map_or_else(|p| p.into_inner().0, |r| r.0);
        }
    }

    fn sample<'a>(
        &self,
        local: &'a Local,
        shard: usize,
        k: usize,
    ) -> Result<&'a TarSample, SampleError> {
        let info = &self.inner.shards[shard];
        local.samples.get(k).ok_or_else(|| SampleError::Io {
            location: format!("{}#{k}", info.name),
            source: std::io::Error::other(format!(
                "the index says the shard holds {} samples; it holds {} images",
                info.nsamples,
                local.samples.len()
            )),
        })
    }
}

impl Drop for StreamedDataset {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
        if let Some(fetcher) = self.fetcher.take() {
            let _ = fetcher.join();
        }
        let s = self.inner.stats();
        tracing::info!(
            fetched = s.fetched,
            bytes = s.bytes,
            retried = s.retried,
            evicted = s.evicted,
            peak_bytes = s.peak_bytes,
            "the streamed dataset's fetcher stopped"
        );
    }
}

impl Dataset for StreamedDataset {
    fn format(&self) -> Format {
        Format::WebDataset
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn class_names(&self) -> &[String] {
        &self.classes
    }

    fn label(&self, index: u64) -> Result<i64, SampleError> {
        let (local, shard, k) = self.local(index)?;
        let sample = self.sample(&local, shard, k)?;
        sample.label.ok_or_else(|| SampleError::MissingLabel {
            location: format!("{}:{}", self.inner.shards[shard].name, sample.name),
        })
    }

    fn location(&self, index: u64) -> String {
        match self.place(index) {
            Ok((shard, k)) => {
                let state = self.inner.lock();
                match &state.slots[shard] {
                    Slot::Here { local, .. } if k < local.samples.len() => {
                        format!(
                            "{}:{}",
                            self.inner.shards[shard].name, local.samples[k].name
                        )
                    }
                    _ => format!("{}#{k}", self.inner.shards[shard].name),
                }
            }
            Err(_) => format!("{}#{index}", self.root.display()),
        }
    }

    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
        limits: &SampleLimits,
    ) -> Result<RecordData<'a>, SampleError> {
        let (local, shard, k) = self.local(index)?;
        let sample = self.sample(&local, shard, k)?;
        let location = || format!("{}:{}", self.inner.shards[shard].name, sample.name);
        limits.check_file(location, sample.len)?;
        let len = usize::try_from(sample.len).map_err(|_| SampleError::Io {
            location: location(),
            source: std::io::Error::other("member too large for this platform"),
        })?;
        local
            .file
            .read_exact_at(ladle_datasets::limits::fit(scratch, len), sample.offset)
            .map_err(|source| SampleError::Io {
                location: location(),
                source,
            })?;
        Ok(RecordData::Encoded(&scratch[..len]))
    }

    fn fingerprint(&self) -> Fingerprint {
        // The shards' names, sample counts and sizes: all that is known before they arrive.
        let names: Vec<Vec<u8>> = (self.inner.shards.iter())
            .map(|s| format!("{}#{}", crate::file_name_of(&s.name), s.nsamples).into_bytes())
            .collect();
        ladle_datasets::fingerprint::of(
            names
                .iter()
                .zip(&self.inner.shards)
                .map(|(name, s)| (name.as_slice(), s.filesize)),
        )
    }

    fn problems(&self) -> &[SampleError] {
        &[]
    }

    fn streamed(&self) -> Option<Arc<dyn Streamed>> {
        Some(self.inner.clone())
    }
}

impl Streamed for Inner {
    fn grouping(&self) -> Grouping {
        self.grouping.clone()
    }

    fn schedule(&self, first: u64, order: Arc<[u64]>) {
        let mut state = self.lock();
        state.schedules.push_back((first, order));
        // The epoch being decoded and the next: the feed builds an epoch's order when it
        // hands out its first sequence, while the decoders finish the one before.
        while state.schedules.len() > 2 {
            state.schedules.pop_front();
        }
        drop(state);
        self.wake.notify_one();
    }

    fn reached(&self, done: u64) {
        self.reached.fetch_max(done, Ordering::Relaxed);
    }
}
