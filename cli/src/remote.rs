//! Datasets given by URL (`--dataset http://host/path/shard-{000..127}.tar`, or a shard
//! index `…/index.json`, streamed): the options of the node's shard cache, and opening such a
//! dataset through it (`ladle_fetch`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

/// The shard cache's options: shared by `ladle serve`, `ladle sweep` and `ladle dataset
/// inspect`.
#[derive(Debug, Args, Clone)]
pub(crate) struct RemoteArgs {
    /// Where the shards of a dataset given by URL are kept on this node, shared by every
    /// feed of it (default: $XDG_CACHE_HOME/ladle/shards, else ~/.cache/ladle/shards).
    #[arg(long, value_name = "DIR")]
    shard_cache: Option<PathBuf>,
    /// The shard cache's budget in GiB: after a fetch, whole datasets no feed is using are
    /// removed, least recently used first, until the cache fits.
    #[arg(long, value_name = "GIB", default_value_t = 100.0)]
    shard_cache_gib: f64,
    /// Shards fetched at once.
    #[arg(long, value_name = "N", default_value_t = 16)]
    fetch_concurrency: usize,
    /// For a dataset given by shard index (a .json URL, streamed): how many shards each
    /// epoch shuffles together. More is more random and needs more disk (two windows of
    /// shards); fewer if the shard cache's budget holds less.
    #[arg(long, value_name = "N", default_value_t = 16)]
    shuffle_shards: usize,
}

/// Folders of remote datasets this process reads: held in use for its whole life, so that
/// another feed's fetch does not remove them from the shard cache.
static IN_USE: Mutex<Vec<ladle_fetch::InUse>> = Mutex::new(Vec::new());

impl RemoteArgs {
    fn options(&self) -> anyhow::Result<ladle_fetch::FetchOptions> {
        if !(self.shard_cache_gib.is_finite() && self.shard_cache_gib > 0.0) {
            anyhow::bail!(
                "--shard-cache-gib {} is not a positive number of GiB",
                self.shard_cache_gib
            );
        }
        Ok(ladle_fetch::FetchOptions {
            cache: ladle_fetch::ShardCache {
                dir: self
                    .shard_cache
                    .clone()
                    .unwrap_or_else(ladle_fetch::ShardCache::default_dir),
                budget: (self.shard_cache_gib * (1u64 << 30) as f64) as u64,
            },
            concurrency: self.fetch_concurrency.max(1),
            retry: ladle_fetch::http::Retry::default(),
            wait: Duration::from_secs(24 * 3600),
            s3: ladle_fetch::S3Env::from_process(),
        })
    }

    /// Opens the dataset at `path`: a local one as it is, one given by URL through the shard
    /// cache (fetching what it lacks, with progress on stderr).
    pub(crate) fn open(&self, path: &Path) -> anyhow::Result<Box<dyn ladle_datasets::Dataset>> {
        let local = match path.to_str().filter(|p| ladle_fetch::is_remote(p)) {
            None => path.to_path_buf(),
            Some(url) => {
                let spec = ladle_fetch::RemoteSpec::parse(url)?;
                if spec.is_index() {
                    let streamed = ladle_fetch::StreamedDataset::open(
                        &spec,
                        &self.options()?,
                        self.shuffle_shards,
                    )
                    .with_context(|| format!("cannot stream dataset {url}"))?;
                    eprintln!(
                        "{url}: {} samples in shards streamed into {}",
                        ladle_datasets::Dataset::len(&streamed),
                        streamed.folder().display()
                    );
                    return Ok(Box::new(streamed));
                }
                let folder = self.fetch(url)?;
                let opened = ladle_datasets::open(&folder)
                    .with_context(|| format!("cannot read dataset {url}"))?;
                return Ok(Box::new(ladle_fetch::Named::new(opened, url)));
            }
        };
        ladle_datasets::open(&local)
            .with_context(|| format!("cannot read dataset {}", path.display()))
    }

    fn fetch(&self, url: &str) -> anyhow::Result<PathBuf> {
        let spec = ladle_fetch::RemoteSpec::parse(url)?;
        let options = self.options()?;
        let bar = crate::progress::bar(0, "fetch");
        let (fetched, in_use) = ladle_fetch::fetch(&spec, &options, &|done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
        .with_context(|| format!("cannot fetch dataset {url}"))?;
        bar.finish_and_clear();
        tracing::info!(
            dataset = url,
            folder = %fetched.dir.display(),
            fetched = fetched.fetched,
            reused = fetched.reused,
            bytes = fetched.bytes,
            retried = fetched.retried,
            evicted = fetched.evicted,
            "shards ready"
        );
        eprintln!(
            "{url}: {} shards fetched ({:.1} MiB, {} retries), {} already in the shard cache {}",
            fetched.fetched,
            fetched.bytes as f64 / f64::from(1u32 << 20),
            fetched.retried,
            fetched.reused,
            fetched.dir.display()
        );
        if let Ok(mut held) = IN_USE.lock() {
            held.push(in_use);
        }
        Ok(fetched.dir)
    }
}
