//! The native half of `ladle.Producer` / `ladle.serve` (the Python producer): the ring, the
//! feed, the control server and the workers' socket are `ladle-producer`'s
//! ([`WorkerSource`], [`WorkerPool`]); the pure-Python half (`ladle/_producer.py`) infers the
//! schema, starts and replaces the worker processes, and runs `ladle/_worker.py` in them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use ladle_datasets::BadSamplePolicy;
use ladle_producer::workers::{WorkerPool, WorkerPoolConfig, WorkerSource};
use ladle_producer::{Producer, ProducerConfig};
use ladle_ring::Schema;
use ladle_ring::protocol::DatasetInfo;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::LadleError;

/// Logs of the producer (joins, leaves, bad samples, dead workers) go to stderr; the level
/// is `LADLE_LOG` (default `info`).
fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("LADLE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .try_init();
    });
}

/// A running feed whose samples worker processes make (see `ladle.Producer`).
#[pyclass(name = "_Producer", module = "ladle", frozen)]
pub(crate) struct PyProducer {
    producer: Mutex<Option<Producer>>,
    pool: Arc<WorkerPool>,
    stop: Arc<AtomicBool>,
    token: String,
    schema: String,
    capacity: u64,
}

#[pymethods]
impl PyProducer {
    #[new]
    #[pyo3(signature = (schema, len, socket, *, class_names, source, workers, ring_bytes, seed, stall_timeout, skip_bad, keep_alive, token, sample_timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        schema: &str,
        len: u64,
        socket: PathBuf,
        class_names: Vec<String>,
        source: String,
        workers: usize,
        ring_bytes: u64,
        seed: u64,
        stall_timeout: f64,
        skip_bad: bool,
        keep_alive: Option<f64>,
        token: String,
        sample_timeout: Option<f64>,
    ) -> PyResult<Self> {
        init_logging();
        let schema: Schema = schema
            .parse()
            .map_err(|e| PyValueError::new_err(format!("schema: {e}")))?;
        let seconds = |s: f64, what: &str| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                PyValueError::new_err(format!("{what} must be a number of seconds ≥ 0, not {s}"))
            })
        };
        let stall_timeout = seconds(stall_timeout, "stall_timeout")?;
        let keep_alive = keep_alive.map(|s| seconds(s, "keep_alive")).transpose()?;
        let sample_timeout = sample_timeout.map(|s| seconds(s, "timeout")).transpose()?;
        if len == 0 {
            return Err(PyValueError::new_err("the dataset is empty (len() is 0)"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut worker_socket = socket.clone().into_os_string();
        worker_socket.push(".workers");
        let mut pool_config = WorkerPoolConfig::new(token.clone());
        pool_config.sample_timeout = sample_timeout;
        let text = schema.to_string();
        let pool = WorkerPool::bind(
            &PathBuf::from(worker_socket),
            schema,
            pool_config,
            stop.clone(),
        )
        .map_err(|e| LadleError::new_err(e.to_string()))?;
        let info = DatasetInfo {
            len,
            class_names,
            source,
        };
        let config = ProducerConfig {
            socket,
            ring_bytes,
            threads: workers,
            seed,
            policy: if skip_bad {
                BadSamplePolicy::Skip
            } else {
                BadSamplePolicy::Fail
            },
            stall_timeout,
            lifetime: ladle_producer::Lifetime {
                idle: keep_alive,
                ..ladle_producer::Lifetime::default()
            },
            ..ProducerConfig::default()
        };
        let source = Arc::new(WorkerSource::new(info, Arc::clone(&pool)));
        let producer = py
            .detach(|| Producer::start_custom(source, config, stop.clone()))
            .map_err(|e| LadleError::new_err(e.to_string()))?;
        let capacity = producer.layout().capacity;
        Ok(Self {
            producer: Mutex::new(Some(producer)),
            pool,
            stop,
            token,
            schema: text,
            capacity,
        })
    }

    /// The workers' socket.
    #[getter]
    fn worker_socket(&self) -> PathBuf {
        self.pool.path().to_path_buf()
    }

    /// What a worker presents.
    #[getter]
    fn token(&self) -> &str {
        &self.token
    }

    /// The schema in ladle's text form.
    #[getter]
    fn schema(&self) -> &str {
        &self.schema
    }

    /// Slots in the ring.
    #[getter]
    fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Asks the feed to stop (consumers get `End`).
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether the feed has stopped (asked to, or its keep-alive ran out).
    #[getter]
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits for the feed's threads once it is stopping; raises what ended it badly (a bad
    /// sample under `on_error="raise"`). Returns what it served.
    fn join(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        let producer = self
            .producer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(producer) = producer else {
            return Ok((0, 0, 0));
        };
        self.stop.store(true, Ordering::SeqCst);
        let served = py
            .detach(|| {
                let served = producer.wait();
                self.pool.join();
                served
            })
            .map_err(|e| LadleError::new_err(e.to_string()))?;
        Ok((served.published, served.consumed, served.bad_samples))
    }

    /// Counters: samples published, bad, consumers now, consumed; workers connected, died,
    /// failed samples; connections to the workers' socket refused (too many saying hello).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if let Some(p) = self
            .producer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            d.set_item("published", p.published())?;
            d.set_item("bad_samples", p.bad_samples())?;
            d.set_item("consumers", p.consumers())?;
            d.set_item("consumed", p.consumed())?;
        }
        let counts = self.pool.counts();
        d.set_item("workers_connected", counts.connected)?;
        d.set_item("workers_died", counts.died)?;
        d.set_item("samples_failed", counts.failed)?;
        d.set_item("workers_refused", counts.refused)?;
        Ok(d)
    }
}

impl Drop for PyProducer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
