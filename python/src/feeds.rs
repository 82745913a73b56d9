//! Feeds by name from Python (`ladle_feeds` underneath): the request a `dataset=` makes, the
//! starter (`$LADLE_BIN`, else the package's `ladle` command), a driver's handle that holds a
//! feed (`ladle.feed(...)`), and a feed's stats as JSON.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use ladle_feeds::{FeedRequest, Registry, StartOptions, Starter};
use pyo3::exceptions::{PyLookupError, PyValueError};
use pyo3::prelude::*;

use crate::{ConnectError, LadleError};

/// What `dataset=`, `image_size=`, `transform=`, `eval=`, `seed=` and the start options
/// name, checked.
pub(crate) struct Ask {
    pub(crate) request: FeedRequest,
    pub(crate) options: StartOptions,
    pub(crate) starter: Starter,
}

/// `seconds` as a duration, or a ValueError naming `arg`.
fn seconds(arg: &str, value: f64) -> PyResult<Duration> {
    if value.is_finite() && value >= 0.0 {
        Ok(Duration::from_secs_f64(value.min(1e9)))
    } else {
        Err(PyValueError::new_err(format!(
            "{arg} must be a non-negative number of seconds, got {value}"
        )))
    }
}

impl Ask {
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    pub(crate) fn new(
        py: Python<'_>,
        dataset: PathBuf,
        image_size: u32,
        transform: Option<&str>,
        eval: bool,
        seed: u64,
        idle_timeout: f64,
        orphan_timeout: f64,
        ring_mib: Option<u64>,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let spelling = ladle_cli::transform_spelling(image_size, transform, eval)
            .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
        let request = FeedRequest::new(&dataset, spelling, seed)
            .map_err(|e| ConnectError::new_err(e.to_string()))?;
        let options = StartOptions {
            idle_timeout: seconds("idle_timeout", idle_timeout)?,
            orphan_timeout: seconds("orphan_timeout", orphan_timeout)?,
            ring_mib,
            threads,
            ..StartOptions::default()
        };
        Ok(Self {
            request,
            options,
            starter: starter(py)?,
        })
    }
}

/// The `ladle` that starts feeds: `$LADLE_BIN`, else the package's console script beside this
/// interpreter, else this interpreter running the package's command line.
fn starter(py: Python<'_>) -> PyResult<Starter> {
    let scripts: PathBuf = py
        .import("sysconfig")?
        .call_method1("get_path", ("scripts",))?
        .extract()?;
    let script = scripts.join("ladle");
    let fallback = if script.is_file() {
        Starter::program(script)
    } else {
        let python: PathBuf = py.import("sys")?.getattr("executable")?.extract()?;
        Starter {
            program: python,
            args: vec!["-c".into(), "from ladle._cli import main; main()".into()],
        }
    };
    Starter::find(Some(fallback)).map_err(|e| ConnectError::new_err(e.to_string()))
}

/// The registry, or a ConnectError naming what is wrong with it.
pub(crate) fn registry() -> PyResult<Registry> {
    Registry::open().map_err(|e| ConnectError::new_err(e.to_string()))
}

/// A driver's hold on a feed: made by `ladle.feed(...)`, it keeps the feed from stopping
/// while held, and can stop the feed it started.
#[pyclass(name = "FeedHandle", module = "ladle._native", frozen)]
pub(crate) struct PyFeedHandle {
    hold: Mutex<Option<std::fs::File>>,
    /// The feed's entry, as JSON.
    #[pyo3(get)]
    entry: String,
    /// Whether this handle started the feed.
    #[pyo3(get)]
    started: bool,
    process: ladle_os::process::ProcessId,
}

#[pymethods]
impl PyFeedHandle {
    /// Lets go of the hold; the feed then stops after its idle timeout once no consumer is
    /// left. Idempotent.
    fn release(&self) {
        if let Ok(mut hold) = self.hold.lock() {
            hold.take();
        }
    }

    /// Asks the feed to stop now (SIGTERM: its consumers are told the stream ended); False if
    /// it was gone already.
    fn stop(&self) -> PyResult<bool> {
        self.process
            .signal(ladle_os::Signal::TERM)
            .map_err(|e| LadleError::new_err(format!("cannot stop the feed: {e}")))
    }

    /// Whether the feed's process is still running.
    fn alive(&self) -> bool {
        self.process.is_alive()
    }
}

/// Finds the live feed of the request, or starts it, holding it first (so it cannot stop
/// between its start and the hold); the handle holds it until released.
#[pyfunction]
#[pyo3(signature = (dataset, *, image_size, transform, eval, seed, idle_timeout, orphan_timeout, ring_mib, threads))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments
pub(crate) fn open_feed(
    py: Python<'_>,
    dataset: PathBuf,
    image_size: u32,
    transform: Option<String>,
    eval: bool,
    seed: u64,
    idle_timeout: f64,
    orphan_timeout: f64,
    ring_mib: Option<u64>,
    threads: Option<usize>,
) -> PyResult<PyFeedHandle> {
    let ask = Ask::new(
        py,
        dataset,
        image_size,
        transform.as_deref(),
        eval,
        seed,
        idle_timeout,
        orphan_timeout,
        ring_mib,
        threads,
    )?;
    let registry = registry()?;
    let files = registry.files(&ask.request.key());
    let (hold, joined) = crate::state::off_the_gil(py, move || {
        let hold = ladle_os::process::hold_shared(&files.hold).map_err(|e| {
            ConnectError::new_err(format!("cannot hold {}: {e}", files.hold.display()))
        })?;
        let joined = ladle_feeds::ensure(&registry, &ask.request, &ask.options, &ask.starter)
            .map_err(|e| ConnectError::new_err(e.to_string()))?;
        Ok((hold, joined))
    })?;
    let entry =
        serde_json::to_string(&joined.entry).map_err(|e| LadleError::new_err(e.to_string()))?;
    Ok(PyFeedHandle {
        hold: Mutex::new(Some(hold)),
        entry,
        started: joined.started,
        process: joined.entry.process(),
    })
}

/// The entry (JSON) of the live feed of the request, or LookupError: never starts one.
#[pyfunction]
#[pyo3(signature = (dataset, *, image_size, transform, eval, seed))]
pub(crate) fn find_feed(
    py: Python<'_>,
    dataset: PathBuf,
    image_size: u32,
    transform: Option<String>,
    eval: bool,
    seed: u64,
) -> PyResult<String> {
    let ask = Ask::new(
        py,
        dataset,
        image_size,
        transform.as_deref(),
        eval,
        seed,
        0.0,
        0.0,
        None,
        None,
    )?;
    let registry = registry()?;
    let key = ask.request.key();
    let entry = (registry.live().into_iter())
        .find(|e| e.key == key)
        .ok_or_else(|| {
            PyLookupError::new_err(format!(
                "no live feed of {} ({}, seed {}) in {}",
                ask.request.dataset.display(),
                ask.request.transform,
                ask.request.seed,
                registry.dir().display()
            ))
        })?;
    serde_json::to_string(&entry).map_err(|e| LadleError::new_err(e.to_string()))
}

/// The `Stats` answer of the feed on `socket`, as JSON (`ladle_ring::protocol::FeedStats`).
#[pyfunction]
#[pyo3(signature = (socket, timeout = 10.0))]
pub(crate) fn feed_stats(py: Python<'_>, socket: PathBuf, timeout: f64) -> PyResult<String> {
    let timeout = seconds("timeout", timeout)?;
    let stats = crate::state::off_the_gil(py, move || {
        ladle_ring::protocol::feed_stats(&socket, timeout)
            .map_err(|e| ConnectError::new_err(format!("{}: no stats: {e}", socket.display())))
    })?;
    serde_json::to_string(&stats).map_err(|e| LadleError::new_err(e.to_string()))
}

/// Where the registry of this user's live feeds is (made private if missing).
#[pyfunction]
pub(crate) fn registry_dir() -> PyResult<PathBuf> {
    Ok(registry()?.dir().to_path_buf())
}
