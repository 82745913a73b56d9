//! Typed errors of the consumer SDK: one enum per operation. Every variant that concerns the
//! producer names its control socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::plan::PlanError;
use crate::position::PositionError;
use ladle_ring::{LayoutError, ProtocolError, ShmError};

/// [`Consumer::connect`](crate::Consumer::connect) or
/// [`Consumer::connect_from_env`](crate::Consumer::connect_from_env) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// [`Consumer::connect_from_env`](crate::Consumer::connect_from_env) found no socket: the
    /// variable ([`SOCKET_ENV`](crate::SOCKET_ENV), `LADLE_SOCKET`) is unset or empty, so
    /// this process was not started as a run of a feed (`ladle sweep` sets it for every run).
    #[error(
        "{variable} is not set (or is empty), so there is no producer socket to join: give the \
         socket explicitly, or set {variable} (`ladle sweep` sets it for every run)"
    )]
    NoSocket {
        /// The environment variable that was read.
        variable: &'static str,
    },
    /// The configured batch size is zero; checked before connecting.
    #[error("{}: batch size 0 requested; a batch holds at least one sample", socket.display())]
    ZeroBatchSize {
        /// The control socket that was to be used.
        socket: PathBuf,
    },
    /// `max_batches_held` is zero, so no batch could ever be handed out; checked before
    /// connecting.
    #[error("{}: max_batches_held is 0; a consumer must be allowed to hold at least one batch", socket.display())]
    ZeroMaxBatchesHeld {
        /// The control socket that was to be used.
        socket: PathBuf,
    },
    /// No file exists at the socket path (no producer was ever started there).
    #[error("{}: no such socket (is the producer running, and is this its --socket path?)", socket.display())]
    SocketMissing {
        /// The control socket.
        socket: PathBuf,
    },
    /// No socket appeared at the path within the connect timeout
    /// ([`ConsumerConfig::connect_timeout`](crate::ConsumerConfig::connect_timeout), e.g.
    /// from `LADLE_CONNECT_TIMEOUT`).
    #[error("{}: no such socket after waiting {:.1} s for it (LADLE_CONNECT_TIMEOUT); did the feed start, and is this its socket?", socket.display(), waited.as_secs_f64())]
    SocketNeverAppeared {
        /// The control socket.
        socket: PathBuf,
        /// How long the consumer waited.
        waited: std::time::Duration,
    },
    /// The socket file exists but nobody accepts connections on it (`ECONNREFUSED`): the
    /// producer exited or crashed and left its socket file behind, or the path is not a
    /// socket.
    #[error("{}: no producer is listening (connection refused); the socket may be stale", socket.display())]
    NoProducer {
        /// The control socket.
        socket: PathBuf,
    },
    /// Connecting to or configuring the socket failed otherwise (permissions, say).
    #[error("{}: cannot connect: {source}", socket.display())]
    Connect {
        /// The control socket.
        socket: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The process behind the socket runs as another user (`SO_PEERCRED`); refused.
    #[error("{}: the producer runs as uid {peer}, not as our uid {ours}; refusing it", socket.display())]
    ForeignPeer {
        /// The control socket.
        socket: PathBuf,
        /// The producer's uid.
        peer: u32,
        /// Our effective uid.
        ours: u32,
    },
    /// The producer refused this consumer (or announced its end before admitting it).
    #[error("{}: the producer rejected this consumer: {reason}", socket.display())]
    Rejected {
        /// The control socket.
        socket: PathBuf,
        /// The producer's reason.
        reason: String,
    },
    /// This consumer's group did not become whole in time: the ranks named never joined.
    /// On a group over several nodes (a local world size under the world size) the feed
    /// waited for this node's ranks only, and says which came.
    #[error("{}: {}", socket.display(), incomplete(group, missing, *world_size, local, *waited))]
    GroupIncomplete {
        /// The control socket.
        socket: PathBuf,
        /// The group's name.
        group: String,
        /// Ranks that never said `Hello` (empty on a group over several nodes).
        missing: Vec<u32>,
        /// Ranks in the group.
        world_size: u32,
        /// The ranks this node's feed waited for, and those that came.
        local: Box<LocalRanks>,
        /// How long this rank waited.
        waited: Duration,
    },
    /// The launcher's environment says something unusable about this rank's group (a
    /// variable that is not a number).
    #[error("{}: group {group:?}: {source}", socket.display())]
    Launch {
        /// The control socket.
        socket: PathBuf,
        /// The group's name.
        group: String,
        /// The variable and its value.
        #[source]
        source: crate::launch::EnvError,
    },
    /// The group settings cannot work: a rank outside `0..world_size`, or a dataset with
    /// fewer samples than ranks.
    #[error("{}: {source}", socket.display())]
    Group {
        /// The control socket.
        socket: PathBuf,
        /// What is wrong.
        #[source]
        source: PlanError,
    },
    /// The producer speaks another protocol version.
    #[error("{}: protocol version mismatch: this consumer speaks {ours}, the producer {theirs}", socket.display())]
    Version {
        /// The control socket.
        socket: PathBuf,
        /// [`ladle_ring::PROTOCOL_VERSION`].
        ours: u32,
        /// The producer's version.
        theirs: u32,
    },
    /// The batch size exceeds the ring's limit (half its capacity), so the producer could not
    /// fill the next batch while this consumer holds one.
    #[error("{}: batch size {batch_size} exceeds this ring's limit of {max} samples (half its capacity)", socket.display())]
    BatchTooLarge {
        /// The control socket.
        socket: PathBuf,
        /// The configured batch size.
        batch_size: u32,
        /// [`RingLayout::max_batch`](ladle_ring::RingLayout::max_batch).
        max: u64,
    },
    /// Connecting, saying `Hello` and receiving all of `Welcome` took longer than the handshake
    /// timeout ([`ConsumerConfig::handshake_timeout`](crate::ConsumerConfig::handshake_timeout)),
    /// however slowly the answer trickled in.
    #[error("{}: the producer did not answer within {timeout:?}", socket.display())]
    HandshakeTimeout {
        /// The control socket.
        socket: PathBuf,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// The control protocol failed during the handshake (the producer closed the connection,
    /// sent garbage, an oversize frame…).
    #[error("{}: handshake failed: {source}", socket.display())]
    Protocol {
        /// The control socket.
        socket: PathBuf,
        /// What went wrong.
        #[source]
        source: ProtocolError,
    },
    /// `Welcome` came without the ring and cursor-page file descriptors.
    #[error("{}: the producer's welcome carried {got} file descriptors, expected 2 (ring, cursor page)", socket.display())]
    MissingFds {
        /// The control socket.
        socket: PathBuf,
        /// How many arrived.
        got: usize,
    },
    /// `Welcome` described a ring shape that cannot exist.
    #[error("{}: the producer sent an invalid ring layout: {source}", socket.display())]
    Layout {
        /// The control socket.
        socket: PathBuf,
        /// Why the layout is invalid.
        #[source]
        source: LayoutError,
    },
    /// The producer announced a dataset longer than this consumer can keep a record of (over
    /// [`MAX_DATASET_LEN`](crate::MAX_DATASET_LEN), or more than memory holds).
    #[error("{}: the producer's dataset of {len} samples is too large to track", socket.display())]
    DatasetTooLarge {
        /// The control socket.
        socket: PathBuf,
        /// The length announced.
        len: u64,
    },
    /// The producer announced a dataset of zero samples: there are no epochs to read.
    #[error("{}: the producer's dataset is empty", socket.display())]
    EmptyDataset {
        /// The control socket.
        socket: PathBuf,
    },
    /// The producer handed over a ring or cursor page whose size is not sealed
    /// (`F_SEAL_SHRINK` and `F_SEAL_GROW`, checked with `F_GET_SEALS`): it could shrink the
    /// file under this process's mapping and kill it with `SIGBUS`. Refused before mapping.
    #[error(
        "{}: the producer's {file} is not size-sealed (F_SEAL_SHRINK and F_SEAL_GROW); refusing \
         to map memory it could shrink under this process (SIGBUS)",
        socket.display()
    )]
    UnsealedMemory {
        /// The control socket.
        socket: PathBuf,
        /// Which file: `"ring"` or `"cursor page"`.
        file: &'static str,
    },
    /// The producer's start sequence leaves no room for a whole epoch before sequence 2^64.
    #[error(
        "{}: the producer starts this consumer at sequence {start_seq}, and an epoch of {len} \
         samples from there runs past 2^64",
        socket.display()
    )]
    SequenceOverflow {
        /// The control socket.
        socket: PathBuf,
        /// The start sequence in `Welcome`.
        start_seq: u64,
        /// The dataset length (samples per epoch).
        len: u64,
    },
    /// Mapping the ring or the cursor page failed.
    #[error("{}: cannot map the producer's shared memory: {source}", socket.display())]
    Shm {
        /// The control socket.
        socket: PathBuf,
        /// What went wrong.
        #[source]
        source: ShmError,
    },
}

/// Reading batches failed. Every variant except [`ConsumerError::TooManyBatchesHeld`] is
/// final: the producer is gone for this consumer, and every later wait reports the same error.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// Another rank of this consumer's group left or died: the group's split of the epoch is
    /// no longer whole, so this rank stops too (restart the job, from its checkpoints).
    #[error("{}: group {group:?} is broken: rank {rank} went ({reason})", socket.display())]
    GroupBroken {
        /// The control socket.
        socket: PathBuf,
        /// The group's name.
        group: String,
        /// The rank that went.
        rank: u32,
        /// Why, as the producer saw it.
        reason: String,
    },
    /// The epoch's plan could not be made (its bits could not be had).
    #[error("{}: cannot plan the epoch: {source}", socket.display())]
    Plan {
        /// The control socket.
        socket: PathBuf,
        /// What went wrong.
        #[source]
        source: PlanError,
    },
    /// The producer closed the control socket (it exited, crashed or was killed) and the ring
    /// holds no more of this consumer's samples.
    #[error("{}: the producer is gone (control socket closed)", socket.display())]
    ProducerGone {
        /// The control socket.
        socket: PathBuf,
    },
    /// The producer ended the stream (`End`, or the ring's end flag) and the ring holds no
    /// more of this consumer's samples.
    #[error("{}: the producer ended the stream: {reason}", socket.display())]
    ProducerEnded {
        /// The control socket.
        socket: PathBuf,
        /// The producer's reason.
        reason: String,
    },
    /// The producer detached this consumer for good: it broke the control protocol (e.g. its
    /// cursor lies outside what it may show). A consumer that only lags is let go, not detached.
    #[error("{}: the producer detached this consumer: {reason}", socket.display())]
    Detached {
        /// The control socket.
        socket: PathBuf,
        /// The producer's reason.
        reason: String,
    },
    /// Handing out the next batch would exceed `max_batches_held`, or would need more of the
    /// ring than the held batches leave free (which would deadlock). Not final: drop some
    /// batches and ask again.
    #[error(
        "{held} batches are held and at most {max} can be held at once \
         (max_batches_held, or what fits the ring); drop a batch before asking for the next"
    )]
    TooManyBatchesHeld {
        /// Batches held now.
        held: usize,
        /// The most that can be held: `max_batches_held`, or fewer when the ring holds no
        /// more of them.
        max: usize,
    },
    /// A batch kept while later ones were read (an example kept for logging, say) is as far
    /// behind the next batch as the ring is long: the producer can write no further until it
    /// is dropped, so the next batch would never come. Not final: drop the old batch (or keep
    /// a copy of what it is kept for) and ask again.
    #[error(
        "the batch held since sample {oldest} is a whole ring ({capacity} samples) behind the \
         next batch, which ends at sample {next}: the producer cannot write it until that batch \
         is dropped; drop it (keep a copy of what you keep it for) before asking for the next"
    )]
    OldBatchHeld {
        /// The sequence number of the oldest batch held.
        oldest: u64,
        /// Where the next batch would end.
        next: u64,
        /// The ring's capacity in samples.
        capacity: u64,
    },
    /// Epoch `epoch` would run past sequence number 2^64: the feed cannot carry it whole, so
    /// it is an error rather than a short epoch.
    #[error(
        "{}: epoch {epoch} would run past sequence number 2^64; the feed cannot carry it whole",
        socket.display()
    )]
    SequenceOverflow {
        /// The control socket.
        socket: PathBuf,
        /// The consumer's epoch.
        epoch: u64,
    },
    /// The control protocol failed after the handshake (garbage or an oversize frame).
    #[error("{}: control protocol failed: {source}", socket.display())]
    Protocol {
        /// The control socket.
        socket: PathBuf,
        /// What went wrong (shared, so that the error can be reported again).
        #[source]
        source: Arc<ProtocolError>,
    },
}

impl ConsumerError {
    /// Whether this error is final: the consumer will deliver no more batches.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Self::TooManyBatchesHeld { .. } | Self::OldBatchHeld { .. }
        )
    }
}

/// A field of a batch that cannot be viewed as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// The feed's schema has no field of that name.
    #[error("the feed has no field {name:?}; its samples are `{schema}`")]
    Missing {
        /// The name asked for.
        name: String,
        /// The feed's schema, in its text form.
        schema: String,
    },
    /// The field is of another dtype than the one asked for.
    #[error("field {name:?} is {dtype}, not {asked}")]
    DType {
        /// The field.
        name: String,
        /// Its dtype.
        dtype: ladle_ring::DType,
        /// The dtype asked for.
        asked: ladle_ring::DType,
    },
}

/// A saved position cannot be loaded into this consumer
/// ([`Consumer::load_position`](crate::Consumer::load_position)); the consumer is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The position was saved against another feed (or is not a position at all).
    #[error(transparent)]
    Position(#[from] PositionError),
    /// The position is of another group, rank, world size or evening than this consumer's
    /// configuration (or of a group where this consumer has none, or the reverse).
    #[error("the position was saved by {saved}, this consumer is {configured}")]
    OtherGroup {
        /// The position's group, in words.
        saved: String,
        /// This consumer's, in words.
        configured: String,
    },
    /// An epoch has begun: a position is loaded before the first.
    #[error(
        "a position is loaded before the first epoch begins; this consumer has begun epoch {epoch}"
    )]
    AlreadyStarted {
        /// The epoch begun.
        epoch: u64,
    },
    /// The position's delivered set does not fit the epoch's plan (an index this rank's
    /// share does not hold).
    #[error("the position does not fit its epoch: {0}")]
    Plan(#[source] PlanError),
    /// The saved state of a group cannot be split over this group's ranks: ranks missing or
    /// given twice, positions of different epochs, groups or feeds.
    #[error("the saved state of group {group:?} {reason}")]
    GroupState {
        /// The group's name, as saved.
        group: String,
        /// What is wrong, in words.
        reason: String,
    },
}

/// The ranks of a group on this node, as [`ConnectError::GroupIncomplete`] says them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRanks {
    /// Ranks that said `Hello` to this node's feed (protocol 15; empty from older feeds).
    pub arrived: Vec<u32>,
    /// The group's ranks on this node, which the feed waited for.
    pub local_world_size: u32,
    /// Where the local world size came from ([`crate::launch::Origin`], as text).
    pub local_from: String,
}

/// [`ConnectError::GroupIncomplete`]'s message: who never came, or on a group over several
/// nodes who came here, and what to check.
fn incomplete(
    group: &str,
    missing: &[u32],
    world_size: u32,
    local: &LocalRanks,
    waited: Duration,
) -> String {
    let LocalRanks {
        arrived,
        local_world_size: local,
        local_from,
    } = local;
    let local = *local;
    if local < world_size {
        format!(
            "group {group:?}: {} of this node's {local} ranks joined its feed within {waited:?} \
             (rank{} {}; world size {world_size}, local world size {local} from {local_from}); \
             start {local} ranks on every node with the same group name, or set \
             $LOCAL_WORLD_SIZE (or local_world_size=) to the ranks each node runs",
            arrived.len(),
            if arrived.len() == 1 { "" } else { "s" },
            list(arrived),
        )
    } else {
        format!(
            "group {group:?}: rank{} {} never joined within {waited:?} (world size \
             {world_size}, every rank on this node's feed: local world size from {local_from}); \
             start every rank with the same group name and world size, and on several nodes \
             set $LOCAL_WORLD_SIZE (torchrun does) or local_world_size= so that each node's \
             feed waits for its own ranks",
            if missing.len() == 1 { "" } else { "s" },
            list(missing),
        )
    }
}

/// `[1, 2, 5]` as `1, 2 and 5`.
fn list(ranks: &[u32]) -> String {
    match ranks {
        [] => "none".into(),
        [one] => one.to_string(),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(u32::to_string).collect();
            format!("{} and {last}", rest.join(", "))
        }
    }
}
