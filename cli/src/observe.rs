//! `--metrics ADDR` and `--record DIR` of `ladle serve`, `ladle scheduler` and `ladle sweep`:
//! one observer thread (crate `ladle-observe`) looks once a second and hands its rows to a
//! Prometheus endpoint and/or a recorder.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ladle_observe::http::MetricsServer;
use ladle_observe::{Latest, Observer, Sink, Source};

/// How often the observer looks.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ObserveArgs {
    /// Serve Prometheus metrics (OpenMetrics text) at http://ADDR/metrics, on a loopback
    /// address only: there is no authentication (e.g. 127.0.0.1:9464; port 0 picks a free one,
    /// printed on stderr). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Record the same series once a second as CSV files in DIR (pandas and polars read
    /// them directly); `ladle report DIR` plots them.
    #[arg(long, value_name = "DIR")]
    pub(crate) record: Option<PathBuf>,
}

impl ObserveArgs {
    /// Starts the observer on `source` when `--metrics` or `--record` asks for one.
    pub(crate) fn start(&self, source: impl Source + 'static) -> anyhow::Result<Option<Observer>> {
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        if let Some(addr) = self.metrics {
            sinks.push(metrics_sink(addr)?);
        }
        if let Some(dir) = &self.record {
            sinks.push(record_sink(dir)?);
        }
        if sinks.is_empty() {
            return Ok(None);
        }
        Ok(Some(Observer::start(source, INTERVAL, sinks)?))
    }
}

/// The Prometheus endpoint on `addr`, serving the latest rows: the sink owns the server, so
/// it serves as long as the observer runs.
fn metrics_sink(addr: std::net::SocketAddr) -> anyhow::Result<Box<dyn Sink>> {
    let server = MetricsServer::start(addr, Latest::default())?;
    // Tests (and people using port 0) read the port from this line.
    eprintln!("metrics on http://{}/metrics", server.local_addr());
    Ok(Box::new(server))
}

/// A recorder writing the rows into `dir`.
fn record_sink(dir: &Path) -> anyhow::Result<Box<dyn Sink>> {
    let recorder = ladle_observe::record::Recorder::create(dir)
        .with_context(|| format!("--record {}", dir.display()))?;
    tracing::info!("recording once a second into {}", dir.display());
    Ok(Box::new(recorder))
}
