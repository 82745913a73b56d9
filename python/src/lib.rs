//! # ladle-python: the native module of the `ladle` Python package
//!
//! In `docs/ARCHITECTURE.md`'s picture this is the Python face of each consumer box, and of the
//! producer box for datasets only Python can read: a thin PyO3 shell over [`ladle_consumer`]
//! (and, in its `producer` module, over `ladle-producer`'s worker source), built by maturin into
//! `ladle._native` and re-exported by the small pure-Python package `ladle` beside it
//! (`python/ladle/`), which adds `to_torch`, `ladle.serve` / `ladle.Producer` (schema inference,
//! the worker processes) and `python -m ladle serve`. Nothing here decides anything: connecting,
//! epochs, holding and releasing samples are `ladle-consumer`'s, the feed `ladle-producer`'s;
//! this crate converts types and errors and releases the GIL.
//!
//! - `Consumer` holds an `Arc<ladle_consumer::Consumer>`; `for batch in consumer` runs one
//!   epoch through a [`SharedEpoch`].
//! - `Batch` holds its [`SharedBatch`] in an `Arc`. `batch["name"]` (any field of the schema,
//!   any dtype), `batch.images` / `labels` (an image feed's fields) and `batch.indices` are
//!   `ArrayView`s that keep that `Arc` too and export the ring's memory, read-only and
//!   without a copy, through the buffer protocol (`numpy.asarray`) and DLPack
//!   (`torch.from_dlpack`, `numpy.from_dlpack`). The samples are released to the producer when
//!   the batch and every view, array and tensor made from it are gone.
//! - A consumer with `group=` is one rank of a DDP job; `state_dict()` / `load_state_dict()`
//!   save and resume its position: the `state` module converts those arguments and dicts.
//! - Connecting (for a rank of a group, waiting for the other ranks) and waiting for data
//!   release the GIL, in slices of 100 ms between which Ctrl-C is honoured.
//! - Errors become the exception classes of `ladle` (`LadleError` and its subclasses), or
//!   `ValueError` for bad arguments, in one place each: `connect_error` and `consumer_error`
//!   here, `state::resume_error` for a position that cannot be loaded.

use std::ffi::{CStr, c_int, c_void};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dlpark::ffi::{DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::python::{DlpackExporter, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use ladle_consumer::{
    ConnectError as RustConnectError, Consumer, ConsumerConfig, ConsumerError, DType, SharedBatch,
    SharedEpoch,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyException, PyKeyError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod array;
mod feeds;
mod producer;
mod state;

use array::{Part, PyArrayView};

create_exception!(
    ladle,
    LadleError,
    PyException,
    "Base class of every error ladle raises (bad arguments raise ValueError)."
);
create_exception!(
    ladle,
    ConnectError,
    LadleError,
    "No producer could be joined: no socket (none given and LADLE_SOCKET unset), nobody \
     listening, a foreign or rejecting peer, a version mismatch, or no answer in time. The \
     message names the socket, or the variable."
);
create_exception!(
    ladle,
    ProducerGone,
    LadleError,
    "The producer exited or was killed; batches already handed out stay readable."
);
create_exception!(
    ladle,
    ProducerEnded,
    LadleError,
    "The producer ended the stream (Ctrl-C or SIGTERM on `ladle serve`)."
);
create_exception!(
    ladle,
    Detached,
    LadleError,
    "The producer detached this consumer for good: it broke the control protocol (for \
     example its cursor moved outside what it may show)."
);
create_exception!(
    ladle,
    GroupIncomplete,
    ConnectError,
    "A rank of a group gave up waiting for the others (group_timeout): the message names the \
     ranks that never joined."
);
create_exception!(
    ladle,
    GroupBroken,
    LadleError,
    "Another rank of this consumer's group left or died, so this rank stops too: restart the \
     whole job from its checkpoints (state_dict)."
);
create_exception!(
    ladle,
    TooManyBatchesHeld,
    LadleError,
    "More batches are held at once than max_batches_held allows (or than the ring holds), or \
     one batch was kept while a whole ring of later ones was read: drop (del) older batches \
     and the arrays made from them (copy what you keep), or raise max_batches_held."
);

/// How long one GIL-free wait lasts before signals (Ctrl-C) are checked.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// The Python exception for a failed connect.
fn connect_error(error: RustConnectError) -> PyErr {
    match error {
        RustConnectError::ZeroBatchSize { .. }
        | RustConnectError::ZeroMaxBatchesHeld { .. }
        | RustConnectError::BatchTooLarge { .. }
        | RustConnectError::Group { .. } => PyValueError::new_err(error.to_string()),
        RustConnectError::GroupIncomplete { .. } => GroupIncomplete::new_err(error.to_string()),
        other => ConnectError::new_err(other.to_string()),
    }
}

/// The Python exception for a failure while reading.
fn consumer_error(error: ConsumerError) -> PyErr {
    let message = error.to_string();
    match error {
        ConsumerError::ProducerGone { .. } => ProducerGone::new_err(message),
        ConsumerError::ProducerEnded { .. } => ProducerEnded::new_err(message),
        ConsumerError::Detached { .. } => Detached::new_err(message),
        ConsumerError::TooManyBatchesHeld { .. } | ConsumerError::OldBatchHeld { .. } => {
            TooManyBatchesHeld::new_err(message)
        }
        ConsumerError::GroupBroken { .. } => GroupBroken::new_err(message),
        _ => LadleError::new_err(message),
    }
}

/// A connection to a `ladle serve` producer. `for batch in consumer:` reads one epoch; the
/// next `for` reads the next one. Without a socket it joins the feed named by
/// `$LADLE_SOCKET` (set by `ladle sweep` for every run); the name defaults to `$LADLE_RUN`.
/// With `group` it is rank `rank` of the `world_size` ranks of a DDP job (default: `$RANK`,
/// `$WORLD_SIZE`, else Slurm's) and reads its share of each epoch, as `DistributedSampler`
/// deals it; connecting waits for the `local_world_size` ranks on this node (default:
/// `$LOCAL_WORLD_SIZE`, else Slurm's tasks on this node, else every rank). `state=` resumes from a `state_dict()`.
#[pyclass(name = "Consumer", module = "ladle", frozen)]
struct PyConsumer {
    inner: Arc<Consumer>,
}

#[pymethods]
impl PyConsumer {
    #[new]
    #[pyo3(signature = (
        socket = None, batch_size = 32, drop_last = false, *, max_batches_held = 8, name = None,
        timeout = 10.0, group = None, rank = None, world_size = None, even = "pad",
        local_world_size = None, group_timeout = 600.0, state = None, dataset = None, image_size = 224, transform = None,
        eval = false, seed = 0, idle_timeout = 30.0, orphan_timeout = 60.0, ring_mib = None,
        threads = None,
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        socket: Option<PathBuf>,
        batch_size: i64,
        drop_last: bool,
        max_batches_held: i64,
        name: Option<String>,
        timeout: f64,
        group: Option<String>,
        rank: Option<i64>,
        world_size: Option<i64>,
        even: &str,
        local_world_size: Option<i64>,
        group_timeout: f64,
        state: Option<Bound<'_, PyAny>>,
        dataset: Option<PathBuf>,
        image_size: u32,
        transform: Option<String>,
        eval: bool,
        seed: u64,
        idle_timeout: f64,
        orphan_timeout: f64,
        ring_mib: Option<u64>,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let batch_size = u32::try_from(batch_size)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                PyValueError::new_err(format!("batch_size must be positive, got {batch_size}"))
            })?;
        let max_batches_held = usize::try_from(max_batches_held)
            .ok()
            .filter(|&m| m > 0)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "max_batches_held must be positive, got {max_batches_held}"
                ))
            })?;
        let seconds = |arg: &str, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(Duration::from_secs_f64(value.min(1e9)))
            } else {
                Err(PyValueError::new_err(format!(
                    "{arg} must be a positive number of seconds, got {value}"
                )))
            }
        };
        let mut config = ConsumerConfig {
            batch_size,
            drop_last,
            max_batches_held,
            handshake_timeout: seconds("timeout", timeout)?,
            group: state::group_spec(group, rank, world_size, even)?,
            local_world_size: match state::number("local_world_size", local_world_size)? {
                Some(0) => {
                    return Err(PyValueError::new_err(
                        "local_world_size must be at least 1 (the ranks on this node), got 0",
                    ));
                }
                other => other,
            },
            group_timeout: seconds("group_timeout", group_timeout)?,
            ..ConsumerConfig::default()
        };
        if let Some(name) = name {
            config.name = name;
        }
        // A state that is no position fails here, before this rank keeps the others waiting.
        let position = state.as_ref().map(state::saved).transpose()?;
        let ask = dataset
            .map(|dataset| {
                feeds::Ask::new(
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
                )
            })
            .transpose()?;
        let consumer = state::connect(py, socket, ask, config)?;
        if let Some(saved) = position {
            state::load_saved(py, &consumer, &saved)?;
        }
        Ok(Self {
            inner: Arc::new(consumer),
        })
    }

    /// Where this consumer stands, to resume from after a restart: a plain dict to save with
    /// the checkpoint. Only its "ladle_position" bytes are read back; "epoch", "delivered",
    /// "group", "rank", "world_size" and "version" are for people reading checkpoints.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        state::state_dict(py, &self.inner)
    }

    /// Resumes from `state_dict()`'s dict (or its "ladle_position" bytes) before the first
    /// epoch begins: that epoch delivers exactly the samples it had not, then whole epochs
    /// follow. A rank of a group may be given every rank's state (a list, as rank 0 gathers
    /// them): with another world size than they were saved with, the rest of their epoch is
    /// dealt over this group's ranks, each sample once. ValueError for a corrupt state or one
    /// of another feed, group or rank (or a group's with a rank missing); RuntimeError once an
    /// epoch has begun.
    fn load_state_dict(&self, py: Python<'_>, state: Bound<'_, PyAny>) -> PyResult<()> {
        state::load_saved(py, &self.inner, &state::saved(&state)?)
    }

    /// Leaves the feed now, as done: a rank's group is not broken by it, whatever its epoch.
    /// A consumer that is only dropped (garbage-collected, or the interpreter exits) leaves
    /// too, except a rank in the middle of an epoch (an exception, `sys.exit`, Ctrl-C): that
    /// breaks its group, and the other ranks get `GroupBroken`.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block closes the consumer, unless a rank of a group leaves it by an
    /// exception: that rank does not close, so that its group breaks (the other ranks get
    /// `GroupBroken`) rather than wait for it. A consumer of no group closes either way, so
    /// that a trial stopped mid-epoch (an Optuna `TrialPruned`, say) lets the feed go on at
    /// once.
    #[pyo3(signature = (exc_type, _exc_value, _traceback))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc_value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> bool {
        if exc_type.is_none() || self.inner.config().group.is_none() {
            self.close(py);
        }
        false
    }

    /// Starts the next epoch (abandoning an unfinished one) and returns its iterator.
    fn __iter__(&self) -> PyEpoch {
        PyEpoch {
            epoch: self.inner.shared_epoch(),
        }
    }

    /// Batches per whole epoch: ceil(S / batch_size), or floor with drop_last, where S is N,
    /// or a rank's share of N (a resumed epoch has fewer).
    fn __len__(&self) -> usize {
        usize::try_from(self.inner.batches_per_epoch()).unwrap_or(usize::MAX)
    }

    /// The number of the epoch the latest `for` loop started (0 before the first).
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.epoch_number().saturating_sub(1)
    }

    #[getter]
    fn batch_size(&self) -> u32 {
        self.inner.config().batch_size
    }

    #[getter]
    fn drop_last(&self) -> bool {
        self.inner.config().drop_last
    }

    #[getter]
    fn max_batches_held(&self) -> usize {
        self.inner.config().max_batches_held
    }

    /// The name the producer's logs show: `name=`, else `$LADLE_RUN`, else `consumer-<pid>`.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.config().name
    }

    /// Batches handed out and still alive (with any array made from them).
    #[getter]
    fn held_batches(&self) -> usize {
        self.inner.held_batches()
    }

    /// Samples in the producer's dataset: one epoch.
    #[getter]
    fn dataset_len(&self) -> u64 {
        self.inner.dataset().len
    }

    /// The class names of the producer's dataset, in label order.
    #[getter]
    fn class_names(&self) -> Vec<String> {
        self.inner.dataset().class_names.clone()
    }

    /// (H, W, 3): the shape of one image; None for a feed without images.
    #[getter]
    fn image_shape(&self) -> Option<(u32, u32, u32)> {
        let (h, w) = self.inner.schema().image_size()?;
        Some((h, w, 3))
    }

    /// What a sample is, in ladle's text form: `"image: u8[224, 224, 3], label: i64"`.
    #[getter]
    fn schema(&self) -> String {
        self.inner.schema().to_string()
    }

    /// The sample's fields, in order: `[(name, numpy dtype name, shape per sample), ...]`.
    #[getter]
    fn fields(&self) -> Vec<(String, &'static str, Vec<u64>)> {
        (self.inner.schema().fields().iter())
            .map(|f| (f.name.clone(), f.dtype.numpy_name(), f.shape.clone()))
            .collect()
    }

    /// The DDP job this consumer is a rank of; None for a consumer of whole epochs.
    #[getter]
    fn group(&self) -> Option<&str> {
        self.inner.config().group.as_ref().map(|g| g.name.as_str())
    }

    /// This consumer's rank in its group; None without a group.
    #[getter]
    fn rank(&self) -> Option<u32> {
        self.inner.config().group.as_ref().map(|g| g.rank)
    }

    /// Ranks in this consumer's group; None without a group.
    #[getter]
    fn world_size(&self) -> Option<u32> {
        self.inner.config().group.as_ref().map(|g| g.world_size)
    }

    /// "pad" or "drop": how the group evens out its shares; None without a group.
    #[getter]
    fn even(&self) -> Option<String> {
        self.inner
            .config()
            .group
            .as_ref()
            .map(|g| g.even.to_string())
    }

    #[getter]
    fn consumer_id(&self) -> u64 {
        self.inner.consumer_id()
    }

    /// The sequence number this consumer's epoch 0 starts at (late joiners start mid-stream).
    #[getter]
    fn start_seq(&self) -> u64 {
        self.inner.start_seq()
    }

    /// How often the producer let this consumer go (it paused for longer than the
    /// producer's stall timeout while holding the feed back) and it rejoined; each time
    /// the epoch in progress still delivered every sample exactly once.
    #[getter]
    fn rejoins(&self) -> u64 {
        self.inner.rejoins()
    }

    /// Seconds this consumer has waited for data in all: time its batches were not yet
    /// decoded when it asked (the rest is the training loop's own).
    #[getter]
    fn waited_seconds(&self) -> f64 {
        self.inner.waited().as_secs_f64()
    }

    /// Whether this consumer skims: it held the others back, so it no longer sets the feed's
    /// pace and copies what its epoch still needs as the samples pass (still exact).
    #[getter]
    fn skimming(&self) -> bool {
        self.inner.skimming()
    }

    /// Times the producer asked this consumer to skim.
    #[getter]
    fn skims(&self) -> u64 {
        self.inner.skims()
    }

    #[getter]
    fn socket(&self) -> PathBuf {
        self.inner.socket().to_path_buf()
    }

    /// (address, length) of this process's read-only mapping of the image region, for
    /// registering it as pinned memory with CUDA (`cudaHostRegister`, read-only flag).
    fn _images_region(&self) -> PyResult<(usize, usize)> {
        let (address, len) = self
            .inner
            .images_region()
            .ok_or_else(|| no_images(&self.inner))?;
        Ok((address as usize, len))
    }

    fn __repr__(&self) -> String {
        let group = (self.inner.config().group.as_ref()).map_or_else(String::new, |g| {
            format!(
                ", group={:?}, rank={}, world_size={}, even={:?}",
                g.name,
                g.rank,
                g.world_size,
                g.even.to_string()
            )
        });
        format!(
            "ladle.Consumer(socket={:?}, batch_size={}, drop_last={}, dataset_len={}, \
             schema={:?}, consumer_id={}{group})",
            self.inner.socket(),
            self.inner.config().batch_size,
            self.inner.config().drop_last,
            self.inner.dataset().len,
            self.inner.schema().to_string(),
            self.inner.consumer_id(),
        )
    }
}

/// One epoch's batches, from `iter(consumer)`.
#[pyclass(name = "Epoch", module = "ladle")]
struct PyEpoch {
    epoch: SharedEpoch,
}

#[pymethods]
impl PyEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyBatch>> {
        // Wait in slices with the GIL released, honouring Ctrl-C between them.
        loop {
            let epoch = &self.epoch;
            let ready = py.detach(|| epoch.wait_ready(WAIT_SLICE));
            match ready {
                Ok(true) => break,
                Ok(false) => py.check_signals()?,
                Err(error) => return Err(consumer_error(error)),
            }
        }
        let epoch = &mut self.epoch;
        match py.detach(|| epoch.next()) {
            None => Ok(None),
            Some(Ok(batch)) => Ok(Some(PyBatch {
                batch: Arc::new(batch),
            })),
            Some(Err(error)) => Err(consumer_error(error)),
        }
    }

    /// This epoch's number.
    #[getter]
    fn number(&self) -> u64 {
        self.epoch.number()
    }
}

/// A batch of consecutive samples of the ring, read in place.
#[pyclass(name = "Batch", module = "ladle", frozen)]
struct PyBatch {
    batch: Arc<SharedBatch>,
}

/// The error for asking a feed without images for images.
fn no_images(consumer: &Consumer) -> PyErr {
    PyAttributeError::new_err(format!(
        "this feed has no images (image: u8[H, W, 3]): its samples are `{}`; read its fields \
         with batch[name]",
        consumer.schema()
    ))
}

#[pymethods]
impl PyBatch {
    /// Field `name` of every sample, `[B, ...shape]`, zero-copy and read-only.
    fn __getitem__(&self, name: &str) -> PyResult<PyArrayView> {
        let schema = self.batch.consumer().schema();
        let (k, _) = schema.field(name).ok_or_else(|| {
            PyKeyError::new_err(format!("no field {name:?}: the samples are `{schema}`"))
        })?;
        Ok(PyArrayView::new(&self.batch, Part::Field(k)))
    }

    fn __contains__(&self, name: &str) -> bool {
        self.batch.consumer().schema().field(name).is_some()
    }

    /// The field names, in schema order.
    fn keys(&self) -> Vec<String> {
        let fields = self.batch.consumer().schema().fields();
        fields.iter().map(|f| f.name.clone()).collect()
    }

    /// `[(name, view), ...]` for every field, in schema order.
    fn items(&self) -> Vec<(String, PyArrayView)> {
        let fields = self.batch.consumer().schema().fields();
        (fields.iter().enumerate())
            .map(|(k, f)| {
                (
                    f.name.clone(),
                    PyArrayView::new(&self.batch, Part::Field(k)),
                )
            })
            .collect()
    }

    /// [B, H, W, 3] uint8, zero-copy and read-only: the `image` field of an image feed.
    #[getter]
    fn images(&self) -> PyResult<PyArrayView> {
        let consumer = self.batch.consumer();
        consumer
            .schema()
            .image_size()
            .ok_or_else(|| no_images(consumer))?;
        self.__getitem__(ladle_consumer::schema::IMAGE)
    }

    /// [B] int64 class labels (−1 marks a sample the producer could not make): the `label`
    /// field.
    #[getter]
    fn labels(&self) -> PyResult<PyArrayView> {
        let schema = self.batch.consumer().schema();
        let k = schema.label_field().ok_or_else(|| {
            PyAttributeError::new_err(format!(
                "this feed has no label: i64 field: its samples are `{schema}`"
            ))
        })?;
        Ok(PyArrayView::new(&self.batch, Part::Field(k)))
    }

    /// [B] uint64 dataset indices.
    #[getter]
    fn indices(&self) -> PyArrayView {
        PyArrayView::new(&self.batch, Part::Indices)
    }

    /// The consumer's epoch this batch belongs to.
    #[getter]
    fn epoch(&self) -> u64 {
        self.batch.epoch()
    }

    /// The sequence number of the first sample.
    #[getter]
    fn first_seq(&self) -> u64 {
        self.batch.first_seq()
    }

    /// Samples the producer could not read, decode or make (every field zero, an image
    /// feed's label −1); usually 0.
    #[getter]
    fn bad_count(&self) -> usize {
        self.batch.bad_count()
    }

    /// False if the producer may have overwritten this batch: it let this consumer go after
    /// it held the feed back without taking a batch for the stall timeout (a long pause
    /// while holding the batch), or the consumer skims (it held the others back) and the feed
    /// has since gone a ring past this batch. Check it after reading a batch held across a
    /// long pause, or kept while later batches were read.
    #[getter]
    fn intact(&self) -> bool {
        self.batch.is_intact()
    }

    /// True for a batch gathered after a rejoin (copied, not a view of the ring).
    #[getter]
    fn is_copy(&self) -> bool {
        self.batch.is_copy()
    }

    /// (B, H, W, 3) of an image feed's images.
    #[getter]
    fn shape(&self) -> PyResult<(usize, usize, usize, usize)> {
        let consumer = self.batch.consumer();
        consumer
            .schema()
            .image_size()
            .ok_or_else(|| no_images(consumer))?;
        let [b, h, w, c] = self.batch.shape();
        Ok((b, h, w, c))
    }

    fn __len__(&self) -> usize {
        self.batch.len()
    }

    /// (address, length) of the consumer's image mapping this batch lies in.
    fn _images_region(&self) -> PyResult<(usize, usize)> {
        let consumer = self.batch.consumer();
        let (address, len) = consumer
            .images_region()
            .ok_or_else(|| no_images(consumer))?;
        Ok((address as usize, len))
    }

    /// `NCHW` float32 tensors on `device`, normalised: see `ladle.to_torch`.
    #[pyo3(signature = (device = None, normalize = None, *, channels_last = false, non_blocking = true))]
    fn to_torch<'py>(
        slf: &Bound<'py, Self>,
        device: Option<Bound<'py, PyAny>>,
        normalize: Option<Bound<'py, PyAny>>,
        channels_last: bool,
        non_blocking: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("ladle._torch")?.getattr("to_torch")?.call1((
            slf,
            device,
            normalize,
            channels_last,
            non_blocking,
        ))
    }

    fn __repr__(&self) -> String {
        let fields: Vec<String> = (self.batch.fields())
            .map(|v| format!("{}: {}{:?}", v.name(), v.dtype(), v.shape()))
            .collect();
        format!(
            "ladle.Batch(epoch={}, first_seq={}, len={}, fields=[{}])",
            self.batch.epoch(),
            self.batch.first_seq(),
            self.batch.len(),
            fields.join(", ")
        )
    }
}

/// The native module `ladle._native`.
/// Runs the `ladle` command line in this process with `argv` (the program's name first), the
/// interpreter's lock released, and returns its exit code: the package's `ladle` console
/// script exits with it. `exe` is the console script (what the CLI runs to run itself
/// again), `python` this interpreter (where `ladle serve MODULE:FACTORY` serves).
#[pyfunction]
#[pyo3(signature = (argv, exe=None, python=None))]
fn cli_main(
    py: Python<'_>,
    argv: Vec<std::ffi::OsString>,
    exe: Option<std::path::PathBuf>,
    python: Option<std::path::PathBuf>,
) -> u8 {
    let host = ladle_cli::Host { exe, python };
    let code = py.detach(|| ladle_cli::run_hosted(argv, host));
    // `ExitCode` does not give its number back (before `exit_process`): find it.
    (0..=u8::MAX)
        .find(|&n| std::process::ExitCode::from(n) == code)
        .unwrap_or(1)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(feeds::open_feed, m)?)?;
    m.add_function(wrap_pyfunction!(feeds::find_feed, m)?)?;
    m.add_function(wrap_pyfunction!(feeds::feed_stats, m)?)?;
    m.add_function(wrap_pyfunction!(feeds::registry_dir, m)?)?;
    m.add_class::<feeds::PyFeedHandle>()?;
    m.add_class::<PyConsumer>()?;
    m.add_class::<PyEpoch>()?;
    m.add_class::<PyBatch>()?;
    m.add_class::<PyArrayView>()?;
    m.add_class::<producer::PyProducer>()?;
    m.add("LadleError", py.get_type::<LadleError>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("ProducerGone", py.get_type::<ProducerGone>())?;
    m.add("ProducerEnded", py.get_type::<ProducerEnded>())?;
    m.add("Detached", py.get_type::<Detached>())?;
    m.add("TooManyBatchesHeld", py.get_type::<TooManyBatchesHeld>())?;
    m.add("GroupIncomplete", py.get_type::<GroupIncomplete>())?;
    m.add("GroupBroken", py.get_type::<GroupBroken>())?;
    m.add("PROTOCOL_VERSION", ladle_consumer::PROTOCOL_VERSION)?;
    // What the module was built from (`ladle-build-info`), for `python -m ladle --version`.
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add("COMMIT", env!("LADLE_COMMIT"))?;
    m.add("FEATURES", env!("LADLE_FEATURES"))?;
    Ok(())
}
