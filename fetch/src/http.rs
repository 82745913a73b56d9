//! Fetching shards over HTTP: many at once on a tokio runtime of the fetcher's own thread
//! (hyper's client), each written to a `.part` file and renamed into place only once whole
//! (its `Content-Length` checked), retried with backoff on what is transient (5xx, 429, a
//! reset, a cut or slow body), and a typed error naming the URL for what is not (403, 404,
//! a certificate the system's roots do not trust).
//!
//! `https://` is rustls (on ring) trusting the system's root certificates, as curl and the
//! AWS SDKs do: `SSL_CERT_FILE` and `SSL_CERT_DIR` when set, else the distribution's bundle.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::FetchError;

/// How a fetch retries.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Tries per shard, the first included.
    pub tries: u32,
    /// The first backoff; it doubles, up to `max_backoff`.
    pub backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
    /// The longest a response may take to start, or its body to deliver the next bytes.
    pub stall: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            tries: 8,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            stall: Duration::from_secs(30),
        }
    }
}

/// What one run of fetches did.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) bytes: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) fetched: AtomicU64,
}

/// One shard to fetch: its URL, its name in logs and errors (a signed URL's secrets are
/// never printed), and where it goes.
pub(crate) struct Job {
    pub(crate) url: String,
    pub(crate) name: String,
    pub(crate) to: PathBuf,
}

/// Fetches every job, at most `concurrency` at once; the first error that is not transient
/// (or a transient one past its tries) is returned once the fetches in flight are done.
pub(crate) fn fetch_all(
    jobs: Vec<Job>,
    concurrency: usize,
    retry: Retry,
    counters: &Arc<Counters>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), FetchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| FetchError::Runtime(e.to_string()))?;
    let client = http_client();
    runtime.block_on(async {
        let permits = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        for job in jobs {
            let (client, permits, counters) = (client.clone(), permits.clone(), counters.clone());
            set.spawn(async move {
                let _permit = permits.acquire_owned().await;
                fetch_one(&client, &job, retry, &counters).await
            });
        }
        let mut first = None;
        while let Some(done) = set.join_next().await {
            match done {
                Ok(Ok(())) => progress(counters.fetched.load(Ordering::Relaxed)),
                Ok(Err(e)) => {
                    first.get_or_insert(e);
                    set.abort_all();
                }
                Err(e) if e.is_cancelled() => {}
                Err(e) => {
                    first.get_or_insert(FetchError::Runtime(e.to_string()));
                }
            }
        }
        first.map_or(Ok(()), Err)
    })
}

/// The client of every fetch: plain HTTP, and HTTPS through rustls.
pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A client for `http://` and `https://`. With no trusted roots on the machine (a container
/// without `ca-certificates`), `http://` still works and an `https://` shard fails naming
/// its URL and the certificate rustls could not verify.
pub(crate) fn http_client() -> HttpClient {
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match builder.with_native_roots() {
        Ok(builder) => builder,
        Err(e) => {
            tracing::warn!(
                "no trusted root certificates found ({e}): https:// shards will fail; \
                 install ca-certificates or set SSL_CERT_FILE"
            );
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
        }
    };
    let connector = builder.https_or_http().enable_http1().build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The TLS error under a failed request, if that is what failed: retrying does not cure it.
fn tls_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // An io::Error's `source` skips the error it wraps (hyper-rustls wraps tokio-rustls's
        // io::Error, which wraps rustls's, in another): look inside each.
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(found) = tls_error(inner) {
                return Some(found);
            }
        }
        next = e.source();
    }
    None
}

/// What one try found.
enum Tried {
    Done,
    /// Try again: why.
    Transient(String),
}

pub(crate) async fn fetch_one(
    client: &HttpClient,
    job: &Job,
    retry: Retry,
    counters: &Counters,
) -> Result<(), FetchError> {
    let mut backoff = retry.backoff;
    let mut last = String::new();
    for attempt in 0..retry.tries.max(1) {
        if attempt > 0 {
            counters.retried.fetch_add(1, Ordering::Relaxed);
            tracing::info!(shard = %job.name, attempt, "retrying a shard in {:.1} s: {last}", backoff.as_secs_f64());
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(retry.max_backoff);
        }
        match try_once(client, job, retry.stall, counters).await? {
            Tried::Done => {
                counters.fetched.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Tried::Transient(why) => last = why,
        }
    }
    Err(FetchError::GaveUp {
        url: job.name.clone(),
        tries: retry.tries,
        last,
    })
}

async fn try_once(
    client: &HttpClient,
    job: &Job,
    stall: Duration,
    counters: &Counters,
) -> Result<Tried, FetchError> {
    let uri: hyper::Uri = job.url.parse().map_err(|e| FetchError::Url {
        url: job.name.clone(),
        why: format!("{e}"),
    })?;
    let response = match tokio::time::timeout(stall, client.get(uri)).await {
        Err(_) => {
            return Ok(Tried::Transient(format!(
                "no answer within {:.0} s",
                stall.as_secs_f64()
            )));
        }
        Ok(Err(e)) => {
            if let Some(why) = tls_error(&e) {
                return Err(FetchError::Tls {
                    url: job.name.clone(),
                    why,
                });
            }
            return Ok(Tried::Transient(describe(&e)));
        }
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if status.is_server_error() || status == hyper::StatusCode::TOO_MANY_REQUESTS {
        return Ok(Tried::Transient(format!("HTTP {status}")));
    }
    if !status.is_success() {
        return Err(FetchError::Status {
            url: job.name.clone(),
            status: status.as_u16(),
        });
    }
    let expected: Option<u64> = response
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let part = part_path(&job.to);
    let io = |source| FetchError::Io {
        path: part.clone(),
        source,
    };
    let mut file = std::fs::File::create(&part).map_err(io)?;
    let mut body = response.into_body();
    let mut got = 0u64;
    loop {
        let frame = match tokio::time::timeout(stall, body.frame()).await {
            Err(_) => {
                return Ok(Tried::Transient(format!(
                    "the body stalled for {:.0} s after {got} bytes",
                    stall.as_secs_f64()
                )));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Ok(Tried::Transient(format!(
                    "the body broke after {got} bytes: {e}"
                )));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            std::io::Write::write_all(&mut file, &data).map_err(io)?;
            got += data.len() as u64;
            counters
                .bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
        }
    }
    if expected.is_some_and(|n| n != got) {
        return Ok(Tried::Transient(format!(
            "{got} bytes of the {} announced",
            expected.unwrap_or_default()
        )));
    }
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&part, &job.to).map_err(|source| FetchError::Io {
        path: job.to.clone(),
        source,
    })?;
    Ok(Tried::Done)
}

/// An error and its causes, as one line (hyper's own `Display` says only "client error
/// (Connect)").
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// Where a shard is written until it is whole.
pub(crate) fn part_path(to: &Path) -> PathBuf {
    let mut name = to.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    to.with_file_name(name)
}
