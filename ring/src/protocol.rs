//! The control protocol: typed, versioned, length-prefixed messages on a Unix stream socket.
//!
//! A frame is a little-endian `u32` length followed by that many bytes of JSON (one
//! [`ClientMessage`] or [`ServerMessage`]). Frames above [`MAX_FRAME`] bytes, bytes that are
//! not a message, and a `Hello` of another [`PROTOCOL_VERSION`] close that one connection.
//! The producer's `Welcome` carries two file descriptors (`SCM_RIGHTS`): the ring file and
//! the consumer's cursor page.
//!
//! ```text
//! consumer                         producer
//!   Hello{version, batch_size, …} ─►
//!                                 ◄─ Welcome{layout, dataset, start_seq} + [ring fd, cursor fd]
//!                                 ◄─ End{reason} | Detached{reason}   (any time)
//!   Rejoin                        ─►  (after the producer let it go: see below)
//!                                 ◄─ Rejoined{start_seq}
//!   Leave                         ─►  (or just close: EOF is a leave)
//!
//!   Stats                         ─►  (instead of Hello: `ladle top`, `--record`)
//!                                 ◄─ Stats{FeedStats}, then the producer closes
//! ```
//!
//! A consumer that takes no batch for the producer's stall timeout while holding the feed back
//! is *let go*: its cursor stops gating the producer, and the let-go bit in its cursor page's
//! lease word makes its next delivery fail (`CursorPage::deliver`), so it never hands out a
//! batch from slots the producer may have overwritten. It then sends `Rejoin` and is attached
//! again at the producer's next sequence, like a late joiner (protocol version 3).
//!
//! Version 4: the layout in `Welcome` carries the feed's [`Schema`](crate::Schema) (named
//! fields of any dtype and shape, one ring region each) and the ring has a flags region; a
//! consumer of another version is refused with a `Reject` that names both versions.
//!
//! Version 5: a consumer's cursor page keeps the count of its threads that sleep on the head
//! and the target of the last to register in one word (`wake_core`), so that the producer
//! never pairs a count with another moment's target (a lost wake-up, found by loom).
//!
//! Version 6: consumer groups and resumable positions. A `Hello` may name a [`GroupHello`]
//! (the ranks of one DDP job): the producer answers `GroupWaiting` while ranks are missing,
//! holds the `Welcome` of every rank until all `world_size` have said `Hello`, or answers
//! `GroupIncomplete` naming the missing ranks at the group's deadline; once the group runs, a
//! rank that goes without `Leave` gives every other rank `GroupBroken`. `Welcome` carries the
//! feed's [`FeedIdentity`], which a saved consumer position is checked against.
//!
//! ```text
//!   Hello{…, group: {name, rank, world_size, timeout_ms}} ─►
//!                                 ◄─ GroupWaiting{joined, world_size}   (while ranks miss)
//!                                 ◄─ Welcome{…} | GroupIncomplete{missing}
//!                                 ◄─ GroupBroken{rank, reason}          (any time after)
//! ```
//!
//! Version 7: a consumer's cursor page holds its *demand* (the end of the last span it
//! reserved), and the producer decodes at most its read-ahead beyond its consumers' largest
//! demand instead of as far as the ring allows.
//!
//! Version 8: a consumer's cursor page counts the time it waited for data, and `Stats`
//! reports it (`ConsumerInfo::waited_s`) beside the time it held the feed back.
//!
//! Version 9: *skimming*. A consumer that keeps holding the feed back while others wait for
//! data is asked to skim (a word in its cursor page): once it holds no batch of the ring, it
//! says `Skim`, the producer stops gating on its cursor, and it copies the samples its epoch
//! still needs as they pass, checking each copy against the ring's `lent` word (a seqlock:
//! `protocol_core::lend`). It attaches again with `Rejoin` when the feed no longer outruns
//! it. `Stats` says which consumers skim (`ConsumerInfo::skimming`).
//!
//! ```text
//!   (cursor page: asked to skim)
//!   Skim                          ─►  (no answer: its cursor no longer gates the producer)
//!   Rejoin                        ─►  (when the feed no longer outruns it)
//!                                 ◄─ Rejoined{start_seq}
//! ```
//!
//! Version 10: class names that do not fit the `Welcome`'s frame (more than about 5 400 of
//! them: ImageNet-21k has 21 841) come before it, in `ClassNames` frames of at most
//! [`MAX_FRAME`] each, and the `Welcome` carries none ([`ClassNameFrames`],
//! [`ClassNamesReceiver`]). A feed whose `Welcome` would not fit a frame even without its
//! class names (a path or transform of tens of KB) refuses to start instead of refusing
//! every consumer.
//!
//! ```text
//!   Hello{…}                      ─►
//!                                 ◄─ ClassNames{total, names} …   (only if they do not fit)
//!                                 ◄─ [GroupWaiting …] Welcome{…, dataset.class_names: []}
//! ```
//!
//! Version 11: the `Welcome`'s [`FeedIdentity`] carries digests of the data (the samples'
//! relative names and sizes, `files` and `sizes`), and a saved position is checked against
//! them instead of the source path: the same data under another path resumes, other data
//! under the same path is refused naming what changed.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;
use crate::layout::RingLayout;
use crate::sys;

#[path = "protocol_class_names.rs"]
mod class_names;
#[path = "protocol_needs.rs"]
mod needs;
pub use class_names::{ClassNameFrames, ClassNamesReceiver, MAX_CLASS_NAME_BYTES};
pub use needs::{Declared, NeedsFrame, NeedsReceiver, OPEN, WORDS_PER_FRAME};

/// Version of this protocol; both sides must speak the same.
pub const PROTOCOL_VERSION: u32 = 17;

/// The largest frame either side accepts.
pub const MAX_FRAME: usize = 64 * 1024;

/// The reason a producer that has begun to stop (its idle timeout passed, say) gives a
/// `Hello`: an asker that started it on demand starts it again.
pub const STOPPING: &str = "the producer is stopping";

/// A consumer's request to join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the consumer.
    pub version: u32,
    /// Samples per batch, `1..=capacity/2`.
    pub batch_size: u32,
    /// Drop the last, partial batch of each epoch.
    pub drop_last: bool,
    /// A name for logs (e.g. the run's name).
    pub name: String,
    /// The consumer's process id, for logs.
    pub pid: u32,
    /// The DDP job this consumer is one rank of, if any.
    pub group: Option<GroupHello>,
}

/// The most ranks a group may have: its `GroupWaiting` and `GroupIncomplete` list ranks, and
/// must fit one frame (8 192 ranks of a node's feed is far beyond any node's GPUs).
pub const MAX_WORLD_SIZE: u32 = 8192;

/// A consumer's place in a group: one rank of a DDP job. The group's ranks split each epoch
/// among themselves (the split is the consumers' business); the producer only holds their
/// `Welcome`s until all have joined and tells the others when one goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupHello {
    /// The group's name, unique among the feed's live groups (e.g. the job's name).
    pub name: String,
    /// This consumer's rank, `0..world_size`.
    pub rank: u32,
    /// Ranks in the group.
    pub world_size: u32,
    /// Ranks of the group on this node, which this node's feed serves and waits for
    /// (protocol version 15); 0 (an older client) means `world_size`: every rank here.
    #[serde(default)]
    pub local_world_size: u32,
    /// How long this rank waits, from its `Hello`, for the others to join (milliseconds).
    pub timeout_ms: u64,
}

impl GroupHello {
    /// The ranks this feed waits for: [`GroupHello::local_world_size`], or the world size.
    pub fn local(&self) -> u32 {
        if self.local_world_size == 0 {
            self.world_size
        } else {
            self.local_world_size
        }
    }
}

/// What makes a feed the same feed for a saved position: the same data (its length, class
/// names, and the digests of its samples' relative names and sizes), seed, transform and
/// sample schema. A position saved against one feed continues exactly on a feed of equal
/// identity (a restarted producer included), wherever the data lies: the source path is only
/// a hint when the data's digests are known (protocol version 11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedIdentity {
    /// Where the producer reads from (a path, or a custom source's name): compared only when
    /// either side has no data digests (a custom source, or a position from before them).
    pub source: String,
    /// Samples per epoch.
    pub len: u64,
    /// A hash (FNV-1a, hex) of the class names in order.
    pub classes: String,
    /// Seed of the permutations and augmentation.
    pub seed: u64,
    /// The transform pipeline, as `ladle serve --transform` spells it (empty for a custom
    /// source, whose transform is the user's code).
    pub transform: String,
    /// The sample schema, as its `Display` shows it.
    pub schema: String,
    /// A digest (FNV-1a, hex) of the samples' names relative to the dataset's root, in index
    /// order (`ladle_datasets::Fingerprint`); empty for a custom source.
    #[serde(default)]
    pub files: String,
    /// A digest of the samples' sizes in bytes, in index order; empty for a custom source.
    #[serde(default)]
    pub sizes: String,
}

impl FeedIdentity {
    /// The first field in which `self` (saved) and `feed` (now served) differ, as
    /// `(name, saved, served)`; `None` when they are the same feed. With the data's digests
    /// on both sides, the data is compared and its path is not: the same files under another
    /// path (`a/` for `a`, a link, a staged copy) are the same feed; other files under the
    /// same path are not.
    pub fn difference(&self, feed: &FeedIdentity) -> Option<(&'static str, String, String)> {
        let by_data = !self.files.is_empty() && !feed.files.is_empty();
        let source = ("source", self.source.clone(), feed.source.clone());
        let data = [
            ("sample files", self.files.clone(), feed.files.clone()),
            ("sample sizes", self.sizes.clone(), feed.sizes.clone()),
        ];
        let pairs = [
            ("length", self.len.to_string(), feed.len.to_string()),
            ("class names", self.classes.clone(), feed.classes.clone()),
        ];
        let rest = [
            ("seed", self.seed.to_string(), feed.seed.to_string()),
            ("transform", self.transform.clone(), feed.transform.clone()),
            ("schema", self.schema.clone(), feed.schema.clone()),
        ];
        let compared: Vec<_> = if by_data {
            pairs.into_iter().chain(data).chain(rest).collect()
        } else {
            std::iter::once(source).chain(pairs).chain(rest).collect()
        };
        compared.into_iter().find(|(_, a, b)| a != b)
    }

    /// FNV-1a (64-bit) of the class names, each followed by a NUL, as 16 hex digits.
    pub fn hash_classes(names: &[String]) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for name in names {
            for &b in name.as_bytes().iter().chain(&[0u8]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }
}

/// What the producer tells a consumer about the dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// Samples per epoch (`N`).
    pub len: u64,
    /// Class names; labels index into them.
    pub class_names: Vec<String>,
    /// Where the producer reads from, for logs.
    pub source: String,
}

/// The producer's acceptance of a consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// [`PROTOCOL_VERSION`] of the producer.
    pub version: u32,
    /// The consumer's id in the producer's logs.
    pub consumer_id: u64,
    /// The ring's shape.
    pub layout: RingLayout,
    /// The dataset.
    pub dataset: DatasetInfo,
    /// The consumer's first sample: its epochs are `[start + k·N, start + (k+1)·N)`.
    pub start_seq: u64,
    /// What a saved position is checked against.
    pub identity: FeedIdentity,
}

/// Consumer → producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ClientMessage {
    /// Join.
    Hello(Hello),
    /// Leave now (closing the socket does the same).
    Leave,
    /// Attach again after being let go or while skimming; answered with
    /// [`ServerMessage::Rejoined`].
    Rejoin,
    /// Asked to skim (its cursor page says so), this consumer holds no batch of the ring any
    /// more: stop gating the producer on its cursor. No answer.
    Skim,
    /// Instead of `Hello`: ask how the feed is doing; answered with [`ServerMessage::Stats`],
    /// then the producer closes the connection (what `ladle top` and `--record` read).
    Stats,
    /// One frame of what this consumer still needs in a window of positions (protocol
    /// version 13; [`NeedsFrame`]). The last frame of a declaration is answered with
    /// [`ServerMessage::Declared`] (version 14).
    Needs(NeedsFrame),
}

/// Producer → consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ServerMessage {
    /// Joined; the ring and cursor fds come with this frame.
    Welcome(Welcome),
    /// Not admitted.
    Reject {
        /// Why, for the consumer's error message.
        reason: String,
    },
    /// The stream has ended (the producer is shutting down).
    End {
        /// Why.
        reason: String,
    },
    /// This consumer was detached for good (it broke the protocol).
    Detached {
        /// Why.
        reason: String,
    },
    /// Answer to [`ClientMessage::Rejoin`]: attached again, its cursor at `start_seq`.
    Rejoined {
        /// Where the consumer's cursor now stands: the producer's next sequence.
        start_seq: u64,
    },
    /// Answer to [`ClientMessage::Stats`].
    Stats(FeedStats),
    /// Some of the feed's class names, sent before the `Welcome` when they do not fit its
    /// frame (protocol version 10); the `Welcome` then carries none.
    ClassNames {
        /// How many class names the feed has in all.
        total: u64,
        /// The next names, in order.
        names: Vec<String>,
    },
    /// The consumer's group is not complete yet: its `Welcome` waits for the missing ranks.
    /// Sent after its `Hello` and again each time another rank joins.
    GroupWaiting {
        /// The ranks that have said `Hello`, sorted.
        joined: Vec<u32>,
        /// Ranks in the group.
        world_size: u32,
        /// Ranks the feed waits for: those of the group on this node (protocol version 15).
        #[serde(default)]
        local_world_size: u32,
    },
    /// The group's deadline passed with ranks missing; the producer closes the connection.
    GroupIncomplete {
        /// The ranks that never said `Hello`, sorted; empty when the group spans nodes (this
        /// feed cannot tell which of the others belong to this node).
        missing: Vec<u32>,
        /// Seconds this rank waited.
        waited_s: f64,
        /// The ranks that did say `Hello` here (protocol version 15).
        #[serde(default)]
        arrived: Vec<u32>,
        /// The ranks the feed waited for: the group's ranks on this node (version 15).
        #[serde(default)]
        local_world_size: u32,
    },
    /// Another rank of this consumer's group left or died: the group cannot go on (its
    /// split of the epoch is no longer whole). The consumer stays attached until it leaves.
    GroupBroken {
        /// The rank that went.
        rank: u32,
        /// Why, as the producer saw it.
        reason: String,
    },
    /// Answer to the last frame of a [`ClientMessage::Needs`] declaration: it is installed,
    /// and what the consumer asks for from now on is decoded as it declared (protocol
    /// version 14). A consumer raises its demand only after this answer, so that no position
    /// it declared unneeded is decoded because the declaration was still on its way.
    Declared {
        /// The declaration's [`NeedsFrame::id`].
        id: u64,
    },
}

/// How a feed is doing, at one instant: counters since the producer started, and each
/// consumer's position. Rates (decode rate, a consumer's samples/s) are differences of two
/// snapshots over their `uptime_s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedStats {
    /// Where the producer reads from.
    pub source: String,
    /// Samples per epoch (`N`).
    pub dataset_len: u64,
    /// Slots in the ring (`C`).
    pub capacity: u64,
    /// Decode threads.
    pub threads: u32,
    /// The producer's process id.
    pub pid: u32,
    /// Seconds since the producer started.
    pub uptime_s: f64,
    /// CPU seconds (user + system) the producer's process has used, all threads.
    pub cpu_s: f64,
    /// CPU seconds its decode threads have used: the feed's own cost, without what else its
    /// process runs (a sweep's scheduler, a recorder).
    #[serde(default)]
    pub decode_cpu_s: f64,
    /// Samples published (decoded, augmented and written), bad ones included: the head.
    pub published: u64,
    /// Of them, bad samples (zero image, label −1).
    pub bad: u64,
    /// Published samples the slowest attached consumer has not released yet (`0..=C`): how
    /// full the ring is.
    pub occupancy: u64,
    /// Consumers admitted since the start.
    pub joins: u64,
    /// Consumers gone since the start (left, died or detached).
    pub leaves: u64,
    /// Let-gos since the start (a consumer held the feed back past the stall timeout).
    pub let_gos: u64,
    /// Samples every consumer since the start has released (read), the gone ones included:
    /// against `published`, what sharing saved (protocol version 12).
    #[serde(default)]
    pub consumed: u64,
    /// Times a consumer was asked to skim, since the start (protocol version 12).
    #[serde(default)]
    pub skims: u64,
    /// Positions the feed let pass undecoded since the start, because no attached consumer
    /// needed them (holes, protocol version 13); `published` counts decoded samples only.
    #[serde(default)]
    pub holes: u64,
    /// The live consumers, by id.
    pub consumers: Vec<ConsumerInfo>,
    /// Live consumers left out of `consumers` to keep the answer within [`MAX_FRAME`].
    #[serde(default)]
    pub consumers_omitted: u32,
    /// What the decoded-sample cache did for this feed; `None` when the feed runs without
    /// one (protocol version 17).
    #[serde(default)]
    pub cache: Option<CacheStats>,
}

/// A feed's use of the decoded-sample cache (`ladle-cache`), counted since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Samples augmented from a cached image: decodes saved.
    pub hits: u64,
    /// Samples with no entry (decoded).
    pub misses: u64,
    /// Entries this feed filled.
    pub fills: u64,
    /// Entries found stale (their file changed since) and decoded again.
    pub stale: u64,
    /// Bytes of records this feed filled.
    pub bytes_filled: u64,
    /// Whether the feed is attached to the cache's keeper now.
    pub attached: bool,
}

impl CacheStats {
    /// Hits over lookups, `0..=1` (0 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        let lookups = self.hits + self.misses;
        if lookups == 0 {
            0.0
        } else {
            self.hits as f64 / lookups as f64
        }
    }
}

impl FeedStats {
    /// Leaves consumers out (the least lagging first, counted in `consumers_omitted`) until
    /// the answer fits in one frame: names are up to 128 characters, escaped, so a full
    /// producer's list may not.
    pub fn fit_frame(&mut self) {
        // The message's tag adds a few bytes to the stats' own.
        let fits = |s: &Self| serde_json::to_vec(s).is_ok_and(|b| b.len() + 64 <= MAX_FRAME);
        if fits(self) {
            return;
        }
        self.consumers.sort_by_key(|c| std::cmp::Reverse(c.lag));
        while !fits(self) && self.consumers.pop().is_some() {
            self.consumers_omitted += 1;
        }
        self.consumers.sort_by_key(|c| c.id);
    }
}

/// One live consumer in [`FeedStats`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerInfo {
    /// Its id in the producer's logs.
    pub id: u64,
    /// Its name as logged: quoted and escaped (`"run-00"`).
    pub name: String,
    /// Its process id, as it said in `Hello`.
    pub pid: u32,
    /// Its batch size.
    pub batch_size: u32,
    /// Seconds since it joined.
    pub connected_s: f64,
    /// Samples it has been handed, over all its attachments and while skimming, as it counts
    /// them in its cursor page (protocol version 9; before, the sequences its cursor passed).
    pub released: u64,
    /// Published samples it has not released yet (0 while let go).
    pub lag: u64,
    /// Whether its cursor gates the producer (false while let go).
    pub attached: bool,
    /// How long it has been holding the feed back without taking a batch, if it is, seconds.
    pub holding_back_s: Option<f64>,
    /// Seconds it has held the feed back in all (the producer waiting on it alone).
    pub held_back_s: f64,
    /// Seconds it has waited for data in all (a batch not yet published when it asked), as
    /// it counts them itself.
    #[serde(default)]
    pub waited_s: f64,
    /// Times it was let go and rejoined.
    pub rejoins: u32,
    /// Whether it skims: it holds the feed back no more and copies what its epoch still
    /// needs as the feed passes (it held the others back; protocol version 9).
    #[serde(default)]
    pub skimming: bool,
    /// Times it was moved to skimming.
    #[serde(default)]
    pub skims: u32,
}

/// Asks the producer on `socket` for its [`FeedStats`], giving up after `timeout`.
///
/// # Errors
/// [`ProtocolError::Io`] when nobody answers on `socket` in time; [`ProtocolError::Malformed`]
/// when the answer is not stats (a refusal's reason is in the message).
pub fn feed_stats(
    socket: &std::path::Path,
    timeout: std::time::Duration,
) -> Result<FeedStats, ProtocolError> {
    // One deadline for all of it: a stopped producer (its listen queue full) must not hold a
    // look longer than `timeout`, even at connect.
    let deadline = Instant::now() + timeout;
    let sock = sys::connect_by(socket, deadline).map_err(ProtocolError::Io)?;
    sock.set_write_timeout(Some(timeout))
        .map_err(ProtocolError::Io)?;
    send(&sock, &ClientMessage::Stats, &[])?;
    match recv_by::<ServerMessage>(&sock, deadline)? {
        (ServerMessage::Stats(stats), _) => Ok(stats),
        (ServerMessage::Reject { reason }, _) => Err(ProtocolError::Malformed(format!(
            "the producer refused the stats request: {reason}"
        ))),
        (other, _) => Err(ProtocolError::Malformed(format!(
            "expected Stats, got {other:?}"
        ))),
    }
}

/// Writes one message, with `fds` attached.
pub fn send<M: Serialize>(
    sock: &UnixStream,
    message: &M,
    fds: &[BorrowedFd<'_>],
) -> Result<(), ProtocolError> {
    let body = serde_json::to_vec(message).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(ProtocolError::Oversize {
            len: body.len() as u64,
            max: MAX_FRAME,
        });
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    sys::send_with_fds(sock.as_fd(), &frame, fds).map_err(ProtocolError::Io)
}

/// Reads exactly `buf.len()` bytes, collecting any fds that arrive with them; with a
/// `deadline`, gives up with `TimedOut` once it passes, however the bytes trickle in.
fn read_exact_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: Option<Instant>,
) -> Result<(), ProtocolError> {
    let mut have = 0;
    while have < buf.len() {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ProtocolError::Io(std::io::ErrorKind::TimedOut.into()));
            }
            sock.set_read_timeout(Some(left))
                .map_err(ProtocolError::Io)?;
        }
        match sys::recv_with_fds(sock.as_fd(), &mut buf[have..]) {
            Ok((0, _)) => return Err(ProtocolError::Closed),
            Ok((n, received)) => {
                have += n;
                fds.extend(received);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // SO_RCVTIMEO ran out: say so in words, not as EAGAIN.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && deadline.is_some() => {
                return Err(ProtocolError::Io(std::io::ErrorKind::TimedOut.into()));
            }
            Err(e) => return Err(ProtocolError::Io(e)),
        }
    }
    Ok(())
}

/// Reads one message and the fds that came with it.
pub fn recv<M: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
) -> Result<(M, Vec<OwnedFd>), ProtocolError> {
    recv_frame(sock, None)
}

/// [`recv`] that fails with `TimedOut` once `deadline` passes, even against a peer that
/// sends one byte at a time (a per-read timeout would let it hold the connection forever).
/// Leaves the socket's read timeout set; callers that go on reading set their own.
pub fn recv_by<M: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
    deadline: Instant,
) -> Result<(M, Vec<OwnedFd>), ProtocolError> {
    recv_frame(sock, Some(deadline))
}

fn recv_frame<M: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
    deadline: Option<Instant>,
) -> Result<(M, Vec<OwnedFd>), ProtocolError> {
    let mut fds = Vec::new();
    let mut len = [0u8; 4];
    read_exact_with_fds(sock, &mut len, &mut fds, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::Oversize {
            len: len as u64,
            max: MAX_FRAME,
        });
    }
    let mut body = vec![0u8; len];
    read_exact_with_fds(sock, &mut body, &mut fds, deadline)?;
    let message =
        serde_json::from_slice(&body).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    Ok((message, fds))
}

/// Whether the peer has closed the socket or sent something, without blocking: `Ok(None)`
/// when nothing is pending, `Ok(Some(msg))` for a waiting message, an error on EOF.
pub fn poll<M: for<'de> Deserialize<'de>>(sock: &UnixStream) -> Result<Option<M>, ProtocolError> {
    match sys::pending(sock) {
        Ok(Some(0)) => Err(ProtocolError::Closed),
        Ok(Some(_)) => recv::<M>(sock).map(|(m, _)| Some(m)),
        Ok(None) => Ok(None),
        Err(e) => Err(ProtocolError::Io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn hello() -> ClientMessage {
        ClientMessage::Hello(Hello {
            version: PROTOCOL_VERSION,
            batch_size: 32,
            drop_last: false,
            name: "t".into(),
            pid: 1,
            group: None,
        })
    }

    #[test]
    fn messages_round_trip_with_their_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let memfd = sys::memfd("t", 4096).unwrap();
        send(&a, &hello(), &[memfd.as_fd()]).unwrap();
        let (msg, fds): (ClientMessage, _) = recv(&b).unwrap();
        assert_eq!(msg, hello());
        assert_eq!(fds.len(), 1);
        assert_eq!(sys::file_len(fds[0].as_fd()).unwrap(), 4096);
    }

    #[test]
    fn oversize_garbage_and_eof_are_typed_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&(MAX_FRAME as u32 + 1).to_le_bytes()).unwrap();
        assert!(matches!(
            recv::<ClientMessage>(&b),
            Err(ProtocolError::Oversize { .. })
        ));
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&5u32.to_le_bytes()).unwrap();
        a.write_all(b"\x00garb").unwrap();
        assert!(matches!(
            recv::<ClientMessage>(&b),
            Err(ProtocolError::Malformed(_))
        ));
        drop(a);
        assert!(matches!(
            recv::<ClientMessage>(&b),
            Err(ProtocolError::Closed)
        ));
    }

    #[test]
    fn a_peer_trickling_one_byte_at_a_time_cannot_outlast_the_deadline() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let trickle = std::thread::spawn(move || {
            // A valid length prefix, then a byte every 50 ms: each read succeeds in time.
            let _ = a.write_all(&100u32.to_le_bytes());
            for _ in 0..40 {
                if a.write_all(b" ").is_err() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        let deadline = started + std::time::Duration::from_millis(300);
        let err = recv_by::<ClientMessage>(&b, deadline).unwrap_err();
        assert!(
            matches!(&err, ProtocolError::Io(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)),
            "{err:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        drop(b);
        trickle.join().unwrap();
    }

    #[test]
    fn stats_of_a_full_producer_with_the_longest_names_still_fit_one_frame() {
        let worst_name = format!("{:?}", "\u{1}\"".repeat(64)); // every char escaped
        let consumer = |id: u64| ConsumerInfo {
            id,
            name: worst_name.clone(),
            pid: u32::MAX,
            batch_size: u32::MAX,
            connected_s: 1e9,
            released: u64::MAX,
            lag: id,
            attached: true,
            holding_back_s: Some(1e9),
            held_back_s: 1e9,
            waited_s: 1e9,
            rejoins: u32::MAX,
            skimming: true,
            skims: u32::MAX,
        };
        let mut stats = FeedStats {
            source: "/data".repeat(200),
            dataset_len: u64::MAX,
            capacity: u64::MAX,
            threads: 64,
            pid: 1,
            uptime_s: 1e9,
            cpu_s: 1e9,
            decode_cpu_s: 1e9,
            published: u64::MAX,
            bad: u64::MAX,
            occupancy: u64::MAX,
            joins: u64::MAX,
            leaves: u64::MAX,
            let_gos: u64::MAX,
            consumed: u64::MAX,
            skims: u64::MAX,
            holes: u64::MAX,
            consumers: (0..256).map(consumer).collect(),
            consumers_omitted: 0,
            cache: Some(CacheStats {
                hits: u64::MAX,
                misses: u64::MAX,
                fills: u64::MAX,
                stale: u64::MAX,
                bytes_filled: u64::MAX,
                attached: true,
            }),
        };
        stats.fit_frame();
        assert!(
            stats.consumers_omitted > 0,
            "the test must overflow a frame"
        );
        assert_eq!(
            stats.consumers.len() + stats.consumers_omitted as usize,
            256
        );
        // The most lagging stay, in id order.
        assert_eq!(stats.consumers.last().map(|c| c.id), Some(255));
        assert!(stats.consumers.windows(2).all(|w| w[0].id < w[1].id));
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, &ServerMessage::Stats(stats.clone()), &[]).unwrap();
        let (back, _): (ServerMessage, _) = recv(&b).unwrap();
        assert_eq!(back, ServerMessage::Stats(stats));
    }

    #[test]
    fn stats_from_a_stopped_producer_whose_queue_is_full_give_up_at_the_deadline() {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stopped.sock");
        // A listener that never accepts, with the shortest queue: what a SIGSTOPped
        // producer looks like once a few peers have knocked.
        let listener = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        rustix::net::bind(&listener, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        rustix::net::listen(&listener, 0).unwrap();
        let mut queued = Vec::new();
        loop {
            let fd = rustix::net::socket_with(
                AddressFamily::UNIX,
                SocketType::STREAM,
                SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
                None,
            )
            .unwrap();
            match rustix::net::connect(&fd, &SocketAddrUnix::new(&path).unwrap()) {
                Ok(()) => queued.push(fd),
                Err(rustix::io::Errno::AGAIN) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(queued.len() < 10_000, "the queue never filled");
        }
        // (A blocking connect here would wait for ever; the deadline is a hang guard for
        // the test, not a timing assertion.)
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(feed_stats(&path, std::time::Duration::from_millis(200)));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("feed_stats hung on a full queue");
        assert!(
            matches!(&got, Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut),
            "{got:?}"
        );
        drop(listener);
    }

    #[test]
    fn a_feed_is_the_same_by_its_data_wherever_it_lies_and_by_its_path_without_digests() {
        let saved = FeedIdentity {
            source: "/data/a".into(),
            len: 10,
            classes: "c".into(),
            seed: 1,
            transform: "t".into(),
            schema: "s".into(),
            files: "f".into(),
            sizes: "z".into(),
        };
        let moved = FeedIdentity {
            source: "/tmp/job/a/".into(),
            ..saved.clone()
        };
        assert_eq!(saved.difference(&moved), None);
        let renamed = FeedIdentity {
            files: "g".into(),
            ..saved.clone()
        };
        assert_eq!(saved.difference(&renamed).unwrap().0, "sample files");
        let rewritten = FeedIdentity {
            sizes: "y".into(),
            ..saved.clone()
        };
        assert_eq!(saved.difference(&rewritten).unwrap().0, "sample sizes");
        // A position from before the digests (or a custom source): the path decides.
        let old = FeedIdentity {
            files: String::new(),
            sizes: String::new(),
            ..saved.clone()
        };
        assert_eq!(old.difference(&saved), None);
        assert_eq!(old.difference(&moved).unwrap().0, "source");
        // A Welcome of a producer without them reads as empty digests.
        let json = r#"{"source":"x","len":1,"classes":"c","seed":0,"transform":"","schema":"s"}"#;
        let parsed: FeedIdentity = serde_json::from_str(json).unwrap();
        assert!(parsed.files.is_empty() && parsed.sizes.is_empty());
    }

    #[test]
    fn the_messages_that_grow_with_a_group_fit_a_frame_at_the_largest_group() {
        let ranks: Vec<u32> = (0..MAX_WORLD_SIZE).collect();
        for message in [
            ServerMessage::GroupWaiting {
                joined: ranks.clone(),
                world_size: u32::MAX,
                local_world_size: MAX_WORLD_SIZE,
            },
            // A rank either came or is missing: the two lists share the ranks.
            ServerMessage::GroupIncomplete {
                missing: ranks.iter().copied().filter(|r| r % 2 == 0).collect(),
                waited_s: f64::MAX,
                arrived: ranks.iter().copied().filter(|r| r % 2 == 1).collect(),
                local_world_size: MAX_WORLD_SIZE,
            },
            ServerMessage::GroupIncomplete {
                missing: Vec::new(),
                waited_s: f64::MAX,
                arrived: ranks,
                local_world_size: MAX_WORLD_SIZE,
            },
        ] {
            let body = serde_json::to_vec(&message).unwrap();
            assert!(body.len() <= MAX_FRAME, "{} bytes", body.len());
        }
    }

    #[test]
    fn poll_sees_nothing_then_a_message_then_eof() {
        let (a, b) = UnixStream::pair().unwrap();
        assert!(poll::<ServerMessage>(&b).unwrap().is_none());
        send(
            &a,
            &ServerMessage::End {
                reason: "bye".into(),
            },
            &[],
        )
        .unwrap();
        assert!(matches!(
            poll::<ServerMessage>(&b).unwrap(),
            Some(ServerMessage::End { .. })
        ));
        drop(a);
        assert!(matches!(
            poll::<ServerMessage>(&b),
            Err(ProtocolError::Closed)
        ));
    }
}
