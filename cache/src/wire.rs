//! The keeper's protocol: JSON frames on its Unix socket (`ladle_ring::protocol`'s framing,
//! file descriptors passed with a frame), one answer to each ask, in order.
//!
//! A connection opens with [`Ask::Hello`]: a *lane* of a feed names the dataset it serves;
//! an operator (`ladle cache ls|drop`) names none. Descriptors travel only to lanes of the
//! keeper's own user (`SO_PEERCRED`), and only read-only ones: the index (sealed by the
//! keeper) and arenas (sealed by the feed that fills each one).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The keeper protocol's version: a `Hello` of another is refused, naming both.
pub const KEEPER_VERSION: u32 = 1;

/// A dataset as the cache knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetKey {
    /// A digest of what the samples are and where they lie ([`crate::dataset_key`]).
    pub key: String,
    /// Where it lies (for people: `ladle cache ls`).
    pub root: String,
    /// Its samples.
    pub len: u64,
}

/// What a connection asks the keeper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case")]
pub enum Ask {
    /// The first frame. `dataset`: a feed's lane of that dataset (answered `Welcome` with the
    /// index's descriptor); `None`: an operator.
    Hello {
        /// [`KEEPER_VERSION`].
        version: u32,
        /// The dataset of a lane.
        dataset: Option<DatasetKey>,
        /// The asker's pid (for the keeper's log).
        pid: u32,
    },
    /// The descriptor of arena `id` (answered `ArenaFd`).
    Arena {
        /// The arena.
        id: u32,
    },
    /// A miss: may this lane fill sample `index`? (answered `Claimed`).
    Claim {
        /// The sample.
        index: u64,
    },
    /// A claim of `index` that will not be filled.
    Release {
        /// The sample.
        index: u64,
    },
    /// The entry of `index` was decoded from a file that changed since: empty it, if its
    /// word is still `word` (another lane may have filled it afresh meanwhile).
    Stale {
        /// The sample.
        index: u64,
        /// The index word the lane read.
        word: u64,
    },
    /// Room for a new arena of `bytes`, or of what the budget has left if that is at least
    /// `at_least` (answered `Granted` or `Full`).
    Grant {
        /// The size wanted, whole pages.
        bytes: u64,
        /// The least that will do (one record), whole pages.
        at_least: u64,
    },
    /// The sealed memfd of granted arena `id` comes with this frame.
    Adopt {
        /// The arena.
        id: u32,
    },
    /// The record of `index` at `offset` of arena `arena` is complete: publish it.
    Publish {
        /// The sample.
        index: u64,
        /// The arena.
        arena: u32,
        /// The record's first byte.
        offset: u64,
    },
    /// What the keeper holds (operators).
    List,
    /// Drop one dataset's entries (`Some(key)`), or all (operators).
    Drop {
        /// The dataset's key, or every dataset.
        key: Option<String>,
    },
}

/// A claim's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimOutcome {
    /// Decode the whole image and fill it.
    Fill,
    /// Another lane published it meanwhile: read the index again.
    Ready,
    /// Not now (the budget is spent, or another lane is still filling it): decode as
    /// without a cache.
    Skip,
}

/// The keeper's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// To a lane's `Hello`; the index's descriptor comes with it.
    Welcome {
        /// [`KEEPER_VERSION`].
        version: u32,
        /// This lane's number.
        lane: u64,
        /// The size of arena to ask for (it grows with the budget).
        arena_bytes: u64,
    },
    /// To an operator's `Hello`.
    Operator {
        /// [`KEEPER_VERSION`].
        version: u32,
    },
    /// Arena `id`'s descriptor comes with it.
    ArenaFd {
        /// The arena.
        id: u32,
    },
    /// To a `Claim`.
    Claimed {
        /// What to do.
        outcome: ClaimOutcome,
    },
    /// To a `Grant`: create arena `id` of `bytes` (at most what was asked) and `Adopt` it.
    Granted {
        /// The new arena's id.
        id: u32,
        /// Its size.
        bytes: u64,
    },
    /// To a `Grant`: the budget is spent; nothing in the cache was evicted for it.
    Full,
    /// Done.
    Done,
    /// To `List`.
    Listing(Listing),
    /// The ask was refused (a bad record, an arena not this lane's, another version); the
    /// keeper closes a lane's connection after it.
    Refused {
        /// Why, in words.
        reason: String,
    },
}

/// What the keeper holds: `ladle cache ls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Listing {
    /// The keeper's pid.
    pub pid: u32,
    /// Its budget, bytes.
    pub budget: u64,
    /// Bytes counted against it.
    pub used: u64,
    /// A dataset unused this long is dropped, seconds.
    pub idle_timeout_s: f64,
    /// The keeper's CPU time so far, seconds.
    pub cpu_s: f64,
    /// Per dataset.
    pub datasets: Vec<DatasetView>,
}

/// One dataset of a [`Listing`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetView {
    /// Its key.
    pub key: String,
    /// Where it lies.
    pub root: String,
    /// Its samples.
    pub len: u64,
    /// Samples with an entry.
    pub entries: u64,
    /// Bytes counted against the budget (index, arenas).
    pub bytes: u64,
    /// Entries published.
    pub fills: u64,
    /// Publishes of an index that had an entry already (two feeds filled it).
    pub duplicates: u64,
    /// Entries emptied because their file changed.
    pub stale: u64,
    /// Lanes (feed connections) attached now.
    pub lanes: u64,
    /// Seconds since its last lane went (0 while one is attached).
    pub idle_s: f64,
    /// Whether a grant was refused and no room has returned since.
    pub full: bool,
}

/// The keeper's entry in the registry (`cache.json`), published once it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeeperEntry {
    /// [`KEEPER_VERSION`].
    pub version: u32,
    /// Its pid.
    pub pid: u32,
    /// Its socket.
    pub socket: PathBuf,
    /// Its budget, bytes: what the scheduler counts against host memory.
    pub budget: u64,
    /// A dataset unused this long is dropped, seconds.
    pub idle_timeout_s: f64,
}

impl KeeperEntry {
    /// The entry at `path`; `Ok(None)` when there is none.
    ///
    /// # Errors
    /// The file could not be read, or is not an entry.
    pub fn read(path: &std::path::Path) -> std::io::Result<Option<Self>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}
