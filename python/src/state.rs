//! Groups and saved positions, as Python sees them.
//!
//! - `ladle.Consumer(group=..., rank=..., world_size=..., even=...)` makes the consumer one
//!   rank of a DDP job ([`GroupSpec`]): [`group_spec`] checks the arguments and, as torchrun
//!   sets them, takes a missing rank and world size from `$RANK` and `$WORLD_SIZE`, else
//!   Slurm's (`ladle_consumer::launch`).
//! - `consumer.state_dict()` and `consumer.load_state_dict(state)` follow torchdata's
//!   `StatefulDataLoader`: the state is a plain dict (picklable, `torch.save`-able) whose
//!   `"ladle_position"` holds [`SavedPosition::encode`]'s bytes, the only key read back; the
//!   others ([`state_dict`] lists them) are for people reading checkpoints.
//!
//! Nothing is decided here: positions are `ladle_consumer::position`'s, the split of an
//! epoch is `ladle_consumer::plan`'s. This module converts arguments, dicts and errors.

use std::path::PathBuf;
use std::sync::mpsc;

use ladle_consumer::plan::PlanError;
use ladle_consumer::position::PositionError;
use ladle_consumer::{Consumer, ConsumerConfig, Even, GroupSpec, ResumeError, SavedPosition};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyTuple};

use ladle_consumer::launch::{RANK_ENV, WORLD_SIZE_ENV};

/// The key of a state dict that holds the encoded position.
pub(crate) const POSITION_KEY: &str = "ladle_position";

/// The version of the state dict's layout (its keys), not of the position's bytes (those
/// carry their own).
pub(crate) const STATE_VERSION: u32 = 1;

/// The consumer's group from the constructor's arguments: `None` without `group`; with it,
/// `rank` and `world_size` default to `$RANK` and `$WORLD_SIZE`, else Slurm's `$SLURM_PROCID`
/// and `$SLURM_NTASKS` (`ladle_consumer::launch`). Bad or missing values are a `ValueError`
/// naming the argument or the variable.
pub(crate) fn group_spec(
    group: Option<String>,
    rank: Option<i64>,
    world_size: Option<i64>,
    even: &str,
) -> PyResult<Option<GroupSpec>> {
    let even: Even = even
        .parse()
        .map_err(|e: PlanError| PyValueError::new_err(format!("even: {e}")))?;
    let Some(name) = group else {
        if rank.is_some() || world_size.is_some() {
            return Err(PyValueError::new_err(
                "rank and world_size are given with group (the DDP job's name, the same on \
                 every rank); without group the consumer reads whole epochs",
            ));
        }
        return Ok(None);
    };
    if name.is_empty() {
        return Err(PyValueError::new_err(
            "group must be a name (the DDP job's, the same on every rank), not empty",
        ));
    }
    let env = ladle_consumer::launch::process_env;
    let rank = number("rank", rank)?;
    let world_size = number("world_size", world_size)?;
    let rank = ladle_consumer::launch::rank(rank, env).map_err(env_error("rank"))?;
    let world_size =
        ladle_consumer::launch::world_size(world_size, env).map_err(env_error("world_size"))?;
    let (Some((rank, _)), Some((world_size, _))) = (rank.clone(), world_size.clone()) else {
        let missing: Vec<String> = [
            (rank.is_none(), "rank", RANK_ENV),
            (world_size.is_none(), "world_size", WORLD_SIZE_ENV),
        ]
        .iter()
        .filter(|(missing, ..)| *missing)
        .map(|(_, arg, var)| format!("{arg}= (or ${var})"))
        .collect();
        return Err(PyValueError::new_err(format!(
            "group {name:?}: {} neither given nor in the environment; pass {} (in PyTorch \
             Lightning, whose launcher sets no ${RANK_ENV}: rank=self.global_rank, \
             world_size=self.trainer.world_size), or start the ranks with torchrun, which \
             sets {RANK_ENV} and {WORLD_SIZE_ENV}, or as tasks of srun, which sets \
             SLURM_PROCID and SLURM_NTASKS",
            missing.join(" and "),
            if missing.len() == 1 { "it" } else { "them" },
        )));
    };
    if world_size == 0 {
        return Err(PyValueError::new_err(format!(
            "group {name:?}: world_size must be at least 1, got 0"
        )));
    }
    if rank >= world_size {
        return Err(PyValueError::new_err(format!(
            "group {name:?}: rank {rank} is out of range for world_size {world_size} (ranks \
             are 0..{world_size})"
        )));
    }
    Ok(Some(GroupSpec {
        name,
        rank,
        world_size,
        even,
    }))
}

/// `arg`'s value as a `u32`, if given.
pub(crate) fn number(arg: &str, given: Option<i64>) -> PyResult<Option<u32>> {
    given
        .map(|value| {
            u32::try_from(value).map_err(|_| {
                PyValueError::new_err(format!("{arg} must be a non-negative int, got {value}"))
            })
        })
        .transpose()
}

/// A launcher's variable that is not a number, as the `ValueError` that names it.
fn env_error(arg: &'static str) -> impl Fn(ladle_consumer::launch::EnvError) -> PyErr {
    move |e| {
        PyValueError::new_err(format!(
            "${} is {:?}, not {} (pass {arg}= instead)",
            e.var, e.value, e.what
        ))
    }
}

/// Connects without the GIL (a rank of a group waits for all the others, up to
/// `group_timeout`), on a thread of its own so that Ctrl-C is honoured every
/// [`WAIT_SLICE`](crate::WAIT_SLICE). A consumer connected after an interrupt is dropped: it
/// leaves the producer (and breaks its group, whose job is going away).
pub(crate) fn connect(
    py: Python<'_>,
    socket: Option<PathBuf>,
    ask: Option<crate::feeds::Ask>,
    config: ConsumerConfig,
) -> PyResult<Consumer> {
    let from_env = std::env::var_os(ladle_consumer::SOCKET_ENV).filter(|s| !s.is_empty());
    let socket = socket.or_else(|| ask.as_ref().and(from_env.map(PathBuf::from)));
    off_the_gil(py, move || match (socket, ask) {
        // Named by its data: the registry's feed, started if none runs.
        (None, Some(ask)) => {
            let registry = crate::feeds::registry()?;
            ladle_feeds::join(&registry, &ask.request, &ask.options, &ask.starter, config)
                .map(|(consumer, _)| consumer)
                .map_err(join_error)
        }
        // A socket and the data: that socket, if it serves that data.
        (Some(socket), Some(ask)) => {
            let consumer = Consumer::connect(socket, config).map_err(crate::connect_error)?;
            ladle_feeds::check(&consumer, &ask.request).map_err(join_error)?;
            Ok(consumer)
        }
        (Some(socket), None) => Consumer::connect(socket, config).map_err(crate::connect_error),
        // No socket: the run's environment names it (`ladle sweep` sets LADLE_SOCKET); unset
        // is a ConnectError naming the variable.
        (None, None) => Consumer::connect_from_env(config).map_err(crate::connect_error),
    })
}

/// The Python exception for a failed join by name.
fn join_error(error: ladle_feeds::JoinError) -> PyErr {
    match error {
        ladle_feeds::JoinError::Connect(e) => crate::connect_error(e),
        other => crate::ConnectError::new_err(other.to_string()),
    }
}

/// Runs `work` on a thread of its own and waits for it without the GIL, looking at Python's
/// signals every [`crate::WAIT_SLICE`], so that Ctrl-C interrupts a wait (for a feed to
/// start, for a group's ranks). After an interrupt the thread finishes alone and what it
/// made is dropped.
pub(crate) fn off_the_gil<T: Send + 'static>(
    py: Python<'_>,
    work: impl FnOnce() -> PyResult<T> + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("ladle-connect".into())
        .spawn(move || {
            // After an interrupt nobody receives: what was made is dropped with the error.
            let _ = tx.send(work());
        })
        .map_err(|e| crate::LadleError::new_err(format!("cannot start a waiting thread: {e}")))?;
    let mut rx = rx;
    loop {
        // The receiver goes into the GIL-free closure and comes back (it is not `Sync`).
        let (received, back) = py.detach(move || (rx.recv_timeout(crate::WAIT_SLICE), rx));
        rx = back;
        match received {
            Ok(done) => return done,
            Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(crate::LadleError::new_err("the waiting thread panicked"));
            }
        }
    }
}

/// `consumer.state_dict()`: where the consumer stands (see [`Consumer::position`]) as a plain
/// dict:
///
/// | key                | value                                                  |
/// |--------------------|--------------------------------------------------------|
/// | `"ladle_position"` | `bytes`: [`SavedPosition::encode`], all that is loaded  |
/// | `"version"`        | 1, this dict's layout                                  |
/// | `"epoch"`          | the epoch to resume                                    |
/// | `"delivered"`      | samples of it delivered already                        |
/// | `"group"`, `"rank"`, `"world_size"` | the group's, or `None`                |
pub(crate) fn state_dict<'py>(
    py: Python<'py>,
    consumer: &Consumer,
) -> PyResult<Bound<'py, PyDict>> {
    // The consumer's lock may be held by a thread waiting for data: wait without the GIL.
    let (position, bytes) = py.detach(|| {
        let position = consumer.position();
        let bytes = position.encode();
        (position, bytes)
    });
    let group = position.group.as_ref();
    let state = PyDict::new(py);
    state.set_item(POSITION_KEY, PyBytes::new(py, &bytes))?;
    state.set_item("version", STATE_VERSION)?;
    state.set_item("epoch", position.epoch)?;
    state.set_item("delivered", position.delivered.count())?;
    state.set_item("group", group.map(|g| g.name.as_str()))?;
    state.set_item("rank", group.map(|g| g.rank))?;
    state.set_item("world_size", group.map(|g| g.world_size))?;
    Ok(state)
}

/// The encoded position in a state from `state_dict()` (the dict, or its
/// `"ladle_position"` bytes), its header checked: a `ValueError` when it is no position, a
/// `TypeError` for another type. Nothing is allocated for its delivered set yet.
pub(crate) fn position_bytes(state: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let bytes = encoded(state)?;
    SavedPosition::identity_of(&bytes).map_err(position_error)?;
    Ok(bytes)
}

/// What `load_state_dict` was given: one consumer's state, or every rank's of a group (a
/// list or tuple, as a DDP job's rank 0 gathers them), each's header checked.
pub(crate) enum Saved {
    One(Vec<u8>),
    Group(Vec<Vec<u8>>),
}

/// [`position_bytes`] of one state, or of each state of a list or tuple of them.
pub(crate) fn saved(state: &Bound<'_, PyAny>) -> PyResult<Saved> {
    let items: Option<Vec<Bound<'_, PyAny>>> = if let Ok(list) = state.cast::<PyList>() {
        Some(list.iter().collect())
    } else if let Ok(tuple) = state.cast::<PyTuple>() {
        Some(tuple.iter().collect())
    } else {
        None
    };
    match items {
        None => position_bytes(state).map(Saved::One),
        Some(items) => items
            .iter()
            .map(position_bytes)
            .collect::<PyResult<_>>()
            .map(Saved::Group),
    }
}

/// Loads `saved` into `consumer`: its own position, or a group's (whatever the world size it
/// was saved with: the rest of its epoch is dealt over this group's ranks).
pub(crate) fn load_saved(py: Python<'_>, consumer: &Consumer, saved: &Saved) -> PyResult<()> {
    match saved {
        Saved::One(bytes) => load(py, consumer, &position_for(consumer, bytes)?),
        Saved::Group(all) => {
            let positions = all
                .iter()
                .map(|bytes| position_for(consumer, bytes))
                .collect::<PyResult<Vec<_>>>()?;
            py.detach(|| consumer.load_group_positions(&positions))
                .map_err(resume_error)
        }
    }
}

/// The position `bytes` ([`position_bytes`]) for `consumer`'s feed, decoded: one of another
/// length is a `ValueError` before anything is allocated for it.
pub(crate) fn position_for(consumer: &Consumer, bytes: &[u8]) -> PyResult<SavedPosition> {
    SavedPosition::decode_for(bytes, consumer.dataset().len).map_err(position_error)
}

/// The encoded position in `state`, copied (a `bytearray` may change under us).
fn encoded(state: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = state.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    if let Ok(bytes) = state.cast::<PyByteArray>() {
        return Ok(bytes.to_vec());
    }
    if let Ok(dict) = state.cast::<PyDict>() {
        let Some(value) = dict.get_item(POSITION_KEY)? else {
            let keys: Vec<String> = (dict.keys().iter())
                .map(|k| k.repr().map_or_else(|_| "?".into(), |r| r.to_string()))
                .collect();
            return Err(PyValueError::new_err(format!(
                "not a ladle consumer state: no {POSITION_KEY:?} key (its keys: {}); pass \
                 what consumer.state_dict() returned",
                keys.join(", ")
            )));
        };
        if value.cast::<PyDict>().is_ok() {
            return Err(PyTypeError::new_err(format!(
                "state[{POSITION_KEY:?}] must be bytes, got a dict"
            )));
        }
        return encoded(&value);
    }
    Err(PyTypeError::new_err(format!(
        "a consumer state is the dict consumer.state_dict() returned (or its \
         {POSITION_KEY:?} bytes), not {}",
        state.get_type().name()?
    )))
}

/// `consumer.load_state_dict(...)`: loads `position` into `consumer` (which must not have
/// begun an epoch), or the Python exception for why not.
pub(crate) fn load(py: Python<'_>, consumer: &Consumer, position: &SavedPosition) -> PyResult<()> {
    // A rank's check shuffles the epoch's indices (milliseconds for ImageNet): without the GIL.
    py.detach(|| consumer.load_position(position))
        .map_err(resume_error)
}

/// The Python exception for a position that cannot be loaded: `RuntimeError` once an epoch
/// has begun, `MemoryError` when its bits cannot be had, else `ValueError` (corrupt, another
/// feed, another group or rank). The message is the Rust error's.
fn resume_error(error: ResumeError) -> PyErr {
    match error {
        ResumeError::Position(error) => position_error(error),
        ResumeError::AlreadyStarted { .. } => PyRuntimeError::new_err(error.to_string()),
        ResumeError::Plan(PlanError::OutOfMemory { .. }) => {
            PyMemoryError::new_err(error.to_string())
        }
        _ => PyValueError::new_err(error.to_string()),
    }
}

/// The Python exception for bytes that are not a position of this feed.
fn position_error(error: PositionError) -> PyErr {
    match error {
        PositionError::OutOfMemory { .. } => PyMemoryError::new_err(error.to_string()),
        _ => PyValueError::new_err(error.to_string()),
    }
}
