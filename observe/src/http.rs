//! The `--metrics` endpoint: `GET /metrics` answers the [`Latest`] rows as
//! [OpenMetrics text](crate::prometheus), served by hyper on a current-thread tokio runtime
//! in a thread of its own.
//!
//! It has no authentication, so it binds loopback addresses only (scrape it from the same
//! machine, or put an authenticating proxy in front). It stays small and bounded: one request
//! per connection, at most [`MAX_CONNECTIONS`] at once, each given [`REQUEST_TIMEOUT`], and it
//! stops when the [`MetricsServer`] is dropped.
//!
//! ```
//! use ladle_observe::Latest;
//! use ladle_observe::http::MetricsServer;
//!
//! let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Latest::default()).unwrap();
//! println!("metrics on http://{}/metrics", server.local_addr());
//! // Not on a public address: there is no authentication.
//! assert!(MetricsServer::start("0.0.0.0:0".parse().unwrap(), Latest::default()).is_err());
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, oneshot};

use crate::{Latest, Rows, Sink};

/// How long one connection may take, from accept to the end of its answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 16;

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The address is not a loopback one.
    #[error(
        "--metrics {addr}: not a loopback address; the metrics endpoint has no authentication, \
         so bind 127.0.0.1 (or [::1]) and scrape it from this machine, or put an \
         authenticating proxy in front"
    )]
    NotLoopback {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Another process listens on the address already.
    #[error(
        "--metrics {addr}: the address is in use (another exporter or ladle?); pick another port, or port 0 for a free one"
    )]
    AddressInUse {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The address cannot be bound for another reason.
    #[error("--metrics {addr}: cannot listen there: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The runtime or its thread could not be started.
    #[error("--metrics {addr}: cannot start the endpoint's thread: {source}")]
    Start {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// A running metrics endpoint; stops when dropped. As a [`Sink`], it serves the rows it is
/// handed.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    latest: Latest,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (a loopback address; port 0 picks a free port, see
    /// [`local_addr`](Self::local_addr)) and serves `latest` at `/metrics`.
    ///
    /// # Errors
    /// [`MetricsError::NotLoopback`] for any other address; [`MetricsError::AddressInUse`]
    /// when the port is taken; [`MetricsError::Bind`] or [`MetricsError::Start`] when the
    /// socket, runtime or thread cannot be had.
    pub fn start(addr: SocketAddr, latest: Latest) -> Result<Self, MetricsError> {
        if !addr.ip().is_loopback() {
            return Err(MetricsError::NotLoopback { addr });
        }
        let bind_error = |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::AddrInUse {
                MetricsError::AddressInUse { addr, source }
            } else {
                MetricsError::Bind { addr, source }
            }
        };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let start_error = |source| MetricsError::Start { addr, source };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(start_error)?;
        let (stop, stopped) = oneshot::channel();
        let thread = {
            let latest = latest.clone();
            std::thread::Builder::new()
                .name("ladle-metrics".into())
                .spawn(move || {
                    runtime.block_on(async move {
                        match tokio::net::TcpListener::from_std(listener) {
                            Ok(listener) => serve(listener, latest, stopped).await,
                            Err(e) => tracing::error!("metrics on {local_addr}: {e}"),
                        }
                    });
                    // Dropping the runtime here cancels the connections still open.
                })
                .map_err(start_error)?
        };
        Ok(Self {
            local_addr,
            latest,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (the port chosen, where `addr` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Sink for MetricsServer {
    fn tick(&mut self, rows: &Rows) {
        self.latest.tick(rows);
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The thread may be gone already (it logged why); nothing else to do.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the metrics thread on {} panicked", self.local_addr);
        }
    }
}

/// Accepts connections until `stopped`.
async fn serve(
    listener: tokio::net::TcpListener,
    latest: Latest,
    mut stopped: oneshot::Receiver<()>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = &mut stopped => return,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: back off rather than spin.
                    tracing::warn!("metrics: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let latest = latest.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |request| {
                let answer = answer(&request, &latest);
                async move { Ok::<_, Infallible>(answer) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(REQUEST_TIMEOUT, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("metrics: connection: {e}"),
                Err(_) => tracing::debug!("metrics: a connection took over {REQUEST_TIMEOUT:?}"),
            }
        });
    }
}

/// The answer to one request.
fn answer<B>(request: &Request<B>, latest: &Latest) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    };
    const PLAIN: &str = "text/plain; charset=utf-8";
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET here\n".into(),
        );
    }
    match request.uri().path() {
        "/metrics" => match crate::prometheus::render(latest.get().as_ref()) {
            Ok(text) => reply(StatusCode::OK, crate::prometheus::CONTENT_TYPE, text),
            Err(e) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                PLAIN,
                format!("rendering failed: {e}\n"),
            ),
        },
        "/" => reply(
            StatusCode::OK,
            PLAIN,
            "ladle metrics: scrape /metrics (OpenMetrics text)\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found; the metrics are at /metrics\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;
    use std::io::{Read, Write};

    /// One plain HTTP/1.1 GET; the whole answer, head and body.
    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn metrics_serves_the_latest_rows_with_the_openmetrics_content_type() {
        let mut server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), Latest::default()).unwrap();
        assert_ne!(server.local_addr().port(), 0);
        let before = get(server.local_addr(), "/metrics");
        assert!(before.starts_with("HTTP/1.1 200"), "{before}");
        assert!(
            before
                .to_lowercase()
                .contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{before}"
        );
        assert!(!before.contains("ladle_scheduler"), "{before}");
        server.tick(&Rows {
            time: 2.0,
            errors: vec!["scheduler: down".into()],
            ..Rows::default()
        });
        let after = get(server.local_addr(), "/metrics");
        assert!(after.contains("ladle_observer_errors 1.0"), "{after}");
        assert!(get(server.local_addr(), "/").contains("/metrics"));
        assert!(get(server.local_addr(), "/nope").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_public_address_is_refused_with_the_reason() {
        for addr in ["0.0.0.0:0", "192.0.2.1:9464", "[::]:0"] {
            let err = MetricsServer::start(addr.parse().unwrap(), Latest::default()).unwrap_err();
            assert!(matches!(err, MetricsError::NotLoopback { .. }), "{err}");
            assert!(err.to_string().contains("no authentication"), "{err}");
        }
    }

    #[test]
    fn a_taken_port_is_an_error_naming_the_address() {
        let first =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), Latest::default()).unwrap();
        let err = MetricsServer::start(first.local_addr(), Latest::default()).unwrap_err();
        assert!(matches!(err, MetricsError::AddressInUse { .. }), "{err}");
        assert!(
            err.to_string().contains(&first.local_addr().to_string()),
            "{err}"
        );
    }

    #[test]
    fn a_dropped_server_stops_listening() {
        let server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), Latest::default()).unwrap();
        let addr = server.local_addr();
        drop(server);
        assert!(std::net::TcpStream::connect(addr).is_err());
    }

    #[test]
    fn a_client_that_sends_nothing_does_not_keep_others_out() {
        let server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), Latest::default()).unwrap();
        let _idle: Vec<_> = (0..MAX_CONNECTIONS - 1)
            .map(|_| std::net::TcpStream::connect(server.local_addr()).unwrap())
            .collect();
        assert!(get(server.local_addr(), "/metrics").starts_with("HTTP/1.1 200"));
    }
}
