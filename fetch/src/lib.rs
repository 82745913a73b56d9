//! # ladle-fetch: datasets where users keep them
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate sits in front of `ladle-datasets`: a feed
//! given a dataset by URL (`ladle serve --dataset http://host/path/shard-{000..127}.tar`,
//! WebDataset's brace notation, [`spec`]; or `s3://bucket/prefix/`, [`s3`]) fetches its shards into a node-local **shard
//! cache** on disk ([`ShardCache`], `$XDG_CACHE_HOME/ladle/shards` by default) and opens them
//! there as the WebDataset they are. Each shard is fetched once per node while it stays in
//! the cache: a second epoch, a second feed of the dataset, a restarted producer and the
//! other runs of a sweep read the local copy. Fetching runs on a tokio runtime of its own
//! thread, many shards at once ([`http`]); decoding stays on the decode threads.
//!
//! What it promises:
//! - **a shard is whole or absent**: written to a `.part` file, its length checked against
//!   the server's, renamed into place; a fetch killed midway leaves no shard a feed reads.
//! - **one fetch per node**: a dataset's folder has a fetch lock; the second asker waits for
//!   the first and finds the shards there.
//! - **nothing transient loses a sample**: 5xx, 429, resets, cut or stalled bodies are
//!   retried with backoff, and counted; what is not transient (403, 404) is an error naming
//!   the URL.
//! - **the cache keeps its budget**: after a fetch, whole datasets no feed is using are
//!   removed, least recently used first, until the cache fits `--shard-cache-gib`.

pub mod http;
pub mod index;
pub mod named;
pub mod s3;
pub mod spec;
pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub use named::Named;
pub use s3::S3Env;
pub use spec::{RemoteSpec, Shards, SpecError, is_remote};
pub use stream::{StreamStats, StreamedDataset};

/// Why a remote dataset could not be made local.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The dataset string is not one ladle fetches.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A shard's URL does not parse.
    #[error("{url}: not a URL: {why}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The server answered with an error that retrying does not cure.
    #[error("{url}: the server answered HTTP {status}{}", hint(*status))]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The server's certificate is not one the system's roots vouch for (or TLS failed in
    /// another way retrying does not cure).
    #[error(
        "{url}: TLS failed: {why} (the roots trusted are the system's, or SSL_CERT_FILE / SSL_CERT_DIR)"
    )]
    Tls {
        /// The URL.
        url: String,
        /// What rustls said.
        why: String,
    },
    /// A transient error went on past every try.
    #[error("{url}: gave up after {tries} tries; the last: {last}")]
    GaveUp {
        /// The URL.
        url: String,
        /// Tries made.
        tries: u32,
        /// The last failure.
        last: String,
    },
    /// A file of the shard cache could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The fetcher's runtime failed.
    #[error("the fetcher: {0}")]
    Runtime(String),
    /// The dataset alone is larger than the shard cache's budget.
    #[error(
        "{spec}: its shards take {bytes} bytes, more than the shard cache's budget of {budget} bytes (--shard-cache-gib)"
    )]
    OverBudget {
        /// The dataset.
        spec: String,
        /// Its bytes.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
}

fn hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (not allowed: check the URL and your access to it)",
        404 => " (no such shard: check the URL and the braces' range)",
        _ => "",
    }
}

/// The node-local shard cache: one folder per remote dataset, named by a digest of its spec.
#[derive(Debug, Clone)]
pub struct ShardCache {
    /// Its folder.
    pub dir: PathBuf,
    /// Bytes it may hold.
    pub budget: u64,
}

impl ShardCache {
    /// The default folder: `$XDG_CACHE_HOME/ladle/shards`, else `~/.cache/ladle/shards`.
    pub fn default_dir() -> PathBuf {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| {
                std::env::temp_dir().join(format!("ladle-{}-cache", ladle_os::process::my_uid()))
            });
        base.join("ladle").join("shards")
    }

    /// The folder of `spec`'s shards.
    pub fn folder(&self, spec: &RemoteSpec) -> PathBuf {
        let mut fnv = ladle_datasets::fingerprint::Fnv::default();
        fnv.write(spec.spec.as_bytes());
        self.dir.join(fnv.hex())
    }
}

/// What making a remote dataset local did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The folder of its shards (a WebDataset).
    pub dir: PathBuf,
    /// Shards fetched now.
    pub fetched: u64,
    /// Shards found in the cache.
    pub reused: u64,
    /// Bytes fetched now.
    pub bytes: u64,
    /// Tries repeated after a transient failure.
    pub retried: u64,
    /// Datasets removed from the cache to keep its budget.
    pub evicted: u64,
}

/// How to fetch.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The shard cache.
    pub cache: ShardCache,
    /// Shards in flight at once.
    pub concurrency: usize,
    /// Retries and stalls.
    pub retry: http::Retry,
    /// How long to wait for another process fetching the same dataset.
    pub wait: Duration,
    /// How S3 is reached (`s3://` datasets).
    pub s3: S3Env,
}

/// A dataset's folder held in use: the shard cache does not remove it while this lives.
#[derive(Debug)]
pub struct InUse {
    _file: std::fs::File,
}

/// Makes `spec`'s shards local (fetching those the cache lacks), and holds its folder in use
/// for as long as the returned [`InUse`] lives. `progress(done, total)` is called as shards
/// arrive.
///
/// # Errors
/// [`FetchError`] naming the URL or file at fault.
pub fn fetch(
    spec: &RemoteSpec,
    options: &FetchOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(Fetched, InUse), FetchError> {
    let (dir, in_use) = prepare(spec, options)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { path, source }
    };
    let lock_path = dir.join(".fetch");
    let deadline = Instant::now() + options.wait;
    let _lock = ladle_os::process::lock_file_wait(&lock_path, deadline)
        .map_err(io(&lock_path))?
        .ok_or_else(|| FetchError::Io {
            path: lock_path.clone(),
            source: std::io::Error::other(
                "another process has been fetching this dataset for too long",
            ),
        })?;
    let shards = resolve(spec, options, &dir)?;
    let mut jobs = Vec::new();
    let mut reused = 0;
    let mut wanted = std::collections::BTreeSet::new();
    for (i, (name, url)) in shards.iter().enumerate() {
        let to = shard_file(&dir, i, shards.len(), name);
        wanted.insert(
            to.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        );
        if to.is_file() {
            reused += 1;
        } else {
            jobs.push(http::Job {
                url: url.clone(),
                name: name.clone(),
                to,
            });
        }
    }
    // The folder holds this dataset's shards and no others (a listing that changed since
    // the last fetch numbers them anew).
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if file.ends_with(".tar") && !wanted.contains(&file) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let total = shards.len() as u64;
    let counters = Arc::new(http::Counters::default());
    let report = |fetched: u64| progress(reused + fetched, total);
    report(0);
    http::fetch_all(jobs, options.concurrency, options.retry, &counters, &report)?;
    let bytes_here = folder_bytes(&dir);
    if bytes_here > options.cache.budget {
        return Err(FetchError::OverBudget {
            spec: spec.spec.clone(),
            bytes: bytes_here,
            budget: options.cache.budget,
        });
    }
    let evicted = evict(&options.cache, &dir);
    Ok((
        Fetched {
            dir,
            fetched: counters.fetched.load(Ordering::Relaxed),
            reused,
            bytes: counters.bytes.load(Ordering::Relaxed),
            retried: counters.retried.load(Ordering::Relaxed),
            evicted,
        },
        in_use,
    ))
}

/// A dataset's folder in the shard cache, made and held in use (the cache's budget does not
/// remove it while the [`InUse`] lives), and its spec written beside its shards.
fn prepare(spec: &RemoteSpec, options: &FetchOptions) -> Result<(PathBuf, InUse), FetchError> {
    let dir = options.cache.folder(spec);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { path, source }
    };
    // `~/.cache/ladle` may not exist on a fresh machine: its folders are made as usual, the
    // shard cache itself private.
    if let Some(parent) = options.cache.dir.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    ladle_os::fs::private_dir(&options.cache.dir).map_err(|e| FetchError::Io {
        path: options.cache.dir.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    std::fs::write(dir.join(".spec"), &spec.spec).map_err(io(&dir))?;
    let held = ladle_os::process::hold_shared(&dir.join(".use")).map_err(io(&dir))?;
    // The cache's least-recently-used order is that of these files' times.
    let _ = held.set_modified(std::time::SystemTime::now());
    Ok((dir, InUse { _file: held }))
}

/// Shard `i` of `count`'s file in `dir`: its number, zero-padded, then [`file_name_of`] its
/// name.
fn shard_file(dir: &Path, i: usize, count: usize, name: &str) -> PathBuf {
    let width = count.to_string().len().max(6);
    dir.join(format!("{i:0width$}-{}", file_name_of(name)))
}

/// A shard's file name in the cache (after its number): the last part of its name, with
/// anything but letters, digits, `.`, `_` and `-` made `_`, ending in `.tar`.
fn file_name_of(name: &str) -> String {
    let name = name.split(['?', '#']).next().unwrap_or(name);
    let base = name.rsplit('/').next().unwrap_or("shard.tar");
    let base: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if base.ends_with(".tar") {
        base
    } else {
        format!("{base}.tar")
    }
}

/// Each shard's name (for logs and errors) and the URL it is fetched from, in order; an
/// `s3://` prefix is listed first.
fn resolve(
    spec: &RemoteSpec,
    options: &FetchOptions,
    dir: &Path,
) -> Result<Vec<(String, String)>, FetchError> {
    let signed = |bucket: &str, keys: &[String]| -> Result<Vec<(String, String)>, FetchError> {
        keys.iter()
            .map(|k| Ok((format!("s3://{bucket}/{k}"), options.s3.get_url(bucket, k)?)))
            .collect()
    };
    match &spec.shards {
        Shards::Http(urls) => Ok(urls.iter().map(|u| (u.clone(), u.clone())).collect()),
        Shards::S3Keys { bucket, keys } => signed(bucket, keys),
        Shards::S3Prefix { bucket, prefix } => {
            let get = |url: &str, name: &str| get_text(url, name, options, dir);
            let keys = options.s3.list_tars(bucket, prefix, &get)?;
            if keys.is_empty() {
                return Err(FetchError::Url {
                    url: spec.spec.clone(),
                    why: "no .tar objects under this prefix".into(),
                });
            }
            signed(bucket, &keys)
        }
    }
}

/// A small answer (a listing, an index) fetched with the shards' retries, through a file in
/// `dir` of this process's own (feeds of one dataset share `dir`, and a streamed one reads
/// its index without the fetch lock).
fn get_text(
    url: &str,
    name: &str,
    options: &FetchOptions,
    dir: &Path,
) -> Result<String, FetchError> {
    let to = dir.join(format!(".answer-{}", std::process::id()));
    let job = http::Job {
        url: url.to_owned(),
        name: name.to_owned(),
        to: to.clone(),
    };
    let counters = Arc::new(http::Counters::default());
    http::fetch_all(vec![job], 1, options.retry, &counters, &|_| {})?;
    let text = std::fs::read_to_string(&to).map_err(|source| FetchError::Io {
        path: to.clone(),
        source,
    })?;
    let _ = std::fs::remove_file(&to);
    Ok(text)
}

/// Bytes of the files in `dir`.
fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Removes whole datasets nobody uses, least recently used first, until the cache fits its
/// budget; never `keep`. Returns how many went.
fn evict(cache: &ShardCache, keep: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(&cache.dir) else {
        return 0;
    };
    let mut folders: Vec<(std::time::SystemTime, PathBuf, u64)> = entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            let used = std::fs::metadata(path.join(".use"))
                .and_then(|m| m.modified())
                .ok()?;
            let bytes = folder_bytes(&path);
            Some((used, path, bytes))
        })
        .collect();
    let mut total: u64 = folders.iter().map(|f| f.2).sum();
    folders.sort();
    let mut evicted = 0;
    for (_, path, bytes) in folders {
        if total <= cache.budget {
            break;
        }
        if path == keep || ladle_os::process::is_held_shared(&path.join(".use")).unwrap_or(true) {
            continue;
        }
        tracing::info!(folder = %path.display(), bytes, "removing a dataset's shards from the shard cache to keep its budget");
        if std::fs::remove_dir_all(&path).is_ok() {
            total = total.saturating_sub(bytes);
            evicted += 1;
        }
    }
    evicted
}
