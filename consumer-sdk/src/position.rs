//! A saved consumer position: where an epoch stood, to resume it after a restart, in a small,
//! versioned, checksummed binary form.
//!
//! ## What a resume keeps exact, and what it does not
//! A [`SavedPosition`] records the epoch in progress and the set of dataset indices it has
//! delivered. Resumed on a feed of the same [`FeedIdentity`] ([`SavedPosition::check_feed`]),
//! the epoch delivers exactly the indices it had not delivered yet (for a group rank: those
//! of its share, [`crate::plan`]), each once, and the epochs after it are the same sets as
//! without the restart. The *set* of indices is exact. What is not: the order within the
//! rest of the epoch (it follows the feed), and each sample's augmentation (random crops,
//! flips), which follows the producer epoch the sample is decoded in, as for any consumer that
//! joins late. The batch size and `drop_last` are recorded for the caller to compare; they
//! change the batches, not the set.
//!
//! ## Format, version 3
//! Little-endian; a string is a `u32` byte length and that many bytes of UTF-8. Version 2 is
//! the same without the wanted flag (read as no wanted set), version 1 also without the
//! identity's `files` and `sizes` (read as empty: such a position is checked against the
//! feed's source path, as it was when saved).
//!
//! | field                 | bytes                                                           |
//! |-----------------------|-----------------------------------------------------------------|
//! | magic                 | `LADLEPOS` (8)                                                  |
//! | format version        | `u32` ([`FORMAT_VERSION`])                                       |
//! | feed identity         | source (str), len (`u64`), classes (str), seed (`u64`), transform (str), schema (str), files (str), sizes (str) |
//! | epoch                 | `u64`                                                           |
//! | batch size, drop_last | `u32`, `u8` (0 or 1)                                            |
//! | group                 | `u8` 0 (none) or 1, then name (str), rank `u32`, world size `u32`, even `u8` (0 pad, 1 drop) |
//! | delivered set         | length `N` (`u64`, = the identity's len), encoding `u8`, payload |
//! | wanted set            | `u8` 0 (the rank's dealt share, or a whole epoch) or 1, then encoding `u8`, payload: what the epoch wants when a group resumed with another world size dealt its remainder anew ([`crate::Consumer::load_group_positions`]) |
//! | checksum              | `u64`: FNV-1a 64 of every byte before it                        |
//!
//! Each set takes the smallest of three encodings ([`SavedPosition::encode`] picks):
//!
//! | tag | encoding                | payload                                                   |
//! |-----|-------------------------|-----------------------------------------------------------|
//! | 0   | bitmap                  | `⌈N/8⌉` bytes, index `i` in bit `i % 8` of byte `i / 8`  |
//! | 1   | delivered indices       | count, then the ascending indices as deltas (the first from 0), all LEB128 |
//! | 2   | indices not delivered   | as tag 1, of the complement                               |
//!
//! A single changed byte always changes the checksum (each FNV-1a step is a bijection of its
//! state), so it is caught.
//!
//! Sizes: the fixed fields take 84 bytes, the identity's strings their length, a group 13
//! bytes and its name; then the payload (an empty list: its count, 1 byte). For ImageNet (`N` =
//! 1 281 167), with 84 bytes of identity strings (the two data digests 32 of them) and no
//! group (the test `imagenet_positions_are_small` prints them):
//!
//! | delivered           | encoding       | bytes   |
//! |---------------------|----------------|---------|
//! | none (epoch start)  | delivered list | 169     |
//! | 40%, at random      | bitmap         | 160 314 (`⌈N/8⌉` = 160 146 + 168) |
//! | all (epoch end)     | missing list   | 169     |
//!
//! A list costs about a byte per index while the gaps stay under 128, so it wins below about
//! 1/8 (or above 7/8) of `N` delivered, and the bitmap between.
//!
//! [`SavedPosition::decode`] never panics and never allocates more than its input justifies
//! before the checksum has been checked: a bitmap must be present in full, a list's count
//! is at most the bytes left, strings are at most the bytes left. Only a checksummed position
//! of a long dataset gets its `N` bits allocated, and failing that is
//! [`PositionError::OutOfMemory`]. A consumer loads through [`SavedPosition::decode_for`],
//! which refuses a position of another length than its feed's before allocating anything:
//! a well-formed 260-byte position claiming 2^33 samples once cost 1 GiB.

use ladle_ring::protocol::FeedIdentity;

use crate::plan::{
    Bitmap, BitmapError, Even, GroupSpec, MAX_DATASET_LEN, PlanError, fnv1a64, try_zeroed,
};

/// The first bytes of every saved position.
pub const MAGIC: [u8; 8] = *b"LADLEPOS";

/// The format version [`SavedPosition::encode`] writes.
pub const FORMAT_VERSION: u32 = 3;

/// The format versions [`SavedPosition::decode`] reads.
pub const READABLE_VERSIONS: &[u32] = &[1, 2, 3];

/// Delivered-set encodings (the tag byte).
const BITMAP: u8 = 0;
const DELIVERED_LIST: u8 = 1;
const MISSING_LIST: u8 = 2;

/// Where a consumer's epoch stood, to resume it exactly (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedPosition {
    /// The feed this position belongs to; a resume checks it ([`SavedPosition::check_feed`]).
    pub identity: FeedIdentity,
    /// The epoch in progress, by this consumer's count (a group's: the group's).
    pub epoch: u64,
    /// The indices that epoch has delivered; its length is the dataset's, `identity.len`
    /// ([`SavedPosition::decode`] refuses another).
    pub delivered: Bitmap,
    /// What that epoch wants, when it is not what the group's permutation deals: a
    /// remainder dealt anew over another world size ([`crate::Consumer::load_group_positions`],
    /// format version 3). `None`: a whole epoch, or the rank's dealt share.
    pub wanted: Option<Bitmap>,
    /// The group this consumer is a rank of, if any: the plan's group name, rank, world size
    /// and evening.
    pub group: Option<GroupSpec>,
    /// The consumer's batch size when it saved (for the caller to compare).
    pub batch_size: u32,
    /// The consumer's `drop_last` when it saved (for the caller to compare).
    pub drop_last: bool,
}

/// A saved position could not be read, or does not belong to the feed served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PositionError {
    /// The bytes do not start with [`MAGIC`].
    #[error("not a ladle consumer position (it does not start with \"LADLEPOS\")")]
    NotAPosition,
    /// A format version this build does not read (written by a newer ladle, say).
    #[error(
        "consumer position format version {version} is not one this build reads (it reads {})",
        versions(supported)
    )]
    UnknownVersion {
        /// The version found.
        version: u32,
        /// The versions this build reads, [`READABLE_VERSIONS`].
        supported: &'static [u32],
    },
    /// The bytes end before a field does.
    #[error(
        "consumer position truncated or corrupt: {field} needs {needed} bytes at offset {offset}, {left} are left"
    )]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Where it starts.
        offset: u64,
        /// The bytes it needs.
        needed: u64,
        /// The bytes left.
        left: u64,
    },
    /// Bytes follow the checksum.
    #[error("consumer position corrupt: {extra} bytes after its end")]
    TrailingBytes {
        /// How many.
        extra: u64,
    },
    /// The checksum does not match the bytes.
    #[error("consumer position corrupt: checksum {stored:016x} stored, {computed:016x} computed")]
    BadChecksum {
        /// The checksum in the position.
        stored: u64,
        /// The checksum of its bytes.
        computed: u64,
    },
    /// A delivered (or missing) index is not below the dataset's length.
    #[error("consumer position corrupt: index {index} out of range for a dataset of {len} samples")]
    IndexOutOfRange {
        /// The index.
        index: u64,
        /// The dataset's length.
        len: u64,
    },
    /// An index list is not strictly ascending (a delta of 0: a duplicate).
    #[error(
        "consumer position corrupt: index {index} repeats in a list that must be strictly ascending"
    )]
    NotAscending {
        /// The index repeated.
        index: u64,
    },
    /// A list holds more indices than the dataset.
    #[error("consumer position corrupt: a list of {count} indices for a dataset of {len} samples")]
    ListTooLong {
        /// The list's count.
        count: u64,
        /// The dataset's length.
        len: u64,
    },
    /// The dataset is longer than a consumer accepts.
    #[error(
        "consumer position for a dataset of {len} samples, longer than a consumer accepts ({max})"
    )]
    TooLong {
        /// The length found.
        len: u64,
        /// [`MAX_DATASET_LEN`].
        max: u64,
    },
    /// The delivered set's length is not the identity's dataset length.
    #[error(
        "consumer position corrupt: its delivered set is of {delivered} samples, its feed has {feed}"
    )]
    LengthMismatch {
        /// The identity's length.
        feed: u64,
        /// The delivered set's length.
        delivered: u64,
    },
    /// A string is not UTF-8.
    #[error("consumer position corrupt: {field} is not UTF-8")]
    BadUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A LEB128 number runs past 64 bits.
    #[error("consumer position corrupt: {field} at offset {offset} is not a 64-bit LEB128 number")]
    BadVarint {
        /// The field.
        field: &'static str,
        /// Where it starts.
        offset: u64,
    },
    /// A flag or tag byte has a value it cannot have.
    #[error("consumer position corrupt: {field} is {value}, which it cannot be")]
    BadTag {
        /// The field.
        field: &'static str,
        /// The byte found.
        value: u8,
    },
    /// A bitmap has a bit set past the dataset's length.
    #[error(
        "consumer position corrupt: delivered bit {index} is set, past the dataset's {len} samples"
    )]
    BitPastEnd {
        /// The dataset's length.
        len: u64,
        /// The bit.
        index: u64,
    },
    /// The group recorded cannot split the dataset (its rank past its world size, say).
    #[error("consumer position corrupt: {0}")]
    BadGroup(#[source] PlanError),
    /// The delivered set's bits could not be had.
    #[error("not enough memory to read a consumer position of a dataset of {len} samples")]
    OutOfMemory {
        /// The dataset's length.
        len: u64,
    },
    /// The position was saved against another feed.
    #[error(
        "the position was saved against another feed: its {field} was {saved:?}, the feed served has {served:?}{}",
        other_feed_hint(field)
    )]
    OtherFeed {
        /// The first field of [`FeedIdentity`] that differs ("source", "length", "class
        /// names", "sample files", "sample sizes", "seed", "transform", "schema").
        field: &'static str,
        /// Its value in the position.
        saved: String,
        /// Its value in the feed served.
        served: String,
    },
}

/// What a difference in `field` means, for [`PositionError::OtherFeed`]'s message.
fn other_feed_hint(field: &str) -> &'static str {
    match field {
        "sample files" => {
            " (a sample file was added, removed or renamed, or moved to another class, since the \
             position was saved)"
        }
        "sample sizes" => " (a sample file was rewritten since the position was saved)",
        "source" => " (a position saved before ladle compared the data is checked by its path)",
        _ => "",
    }
}

/// `1, 2, 3`.
fn versions(supported: &[u32]) -> String {
    supported
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl SavedPosition {
    /// Whether this position belongs to the feed `served`; otherwise
    /// [`PositionError::OtherFeed`] names the first field that differs.
    pub fn check_feed(&self, served: &FeedIdentity) -> Result<(), PositionError> {
        match self.identity.difference(served) {
            None => Ok(()),
            Some((field, saved, served)) => Err(PositionError::OtherFeed {
                field,
                saved,
                served,
            }),
        }
    }

    /// The position in format [`FORMAT_VERSION`], its delivered set in the smallest encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        let id = &self.identity;
        put_str(&mut out, &id.source);
        out.extend_from_slice(&id.len.to_le_bytes());
        put_str(&mut out, &id.classes);
        out.extend_from_slice(&id.seed.to_le_bytes());
        put_str(&mut out, &id.transform);
        put_str(&mut out, &id.schema);
        put_str(&mut out, &id.files);
        put_str(&mut out, &id.sizes);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.batch_size.to_le_bytes());
        out.push(u8::from(self.drop_last));
        match &self.group {
            None => out.push(0),
            Some(group) => {
                out.push(1);
                put_str(&mut out, &group.name);
                out.extend_from_slice(&group.rank.to_le_bytes());
                out.extend_from_slice(&group.world_size.to_le_bytes());
                out.push(match group.even {
                    Even::Pad => 0,
                    Even::Drop => 1,
                });
            }
        }
        out.extend_from_slice(&self.delivered.len().to_le_bytes());
        put_set(&mut out, &self.delivered);
        match &self.wanted {
            None => out.push(0),
            Some(wanted) => {
                out.push(1);
                put_set(&mut out, wanted);
            }
        }
        let checksum = fnv1a64(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Reads a position [`SavedPosition::encode`] wrote (any of [`READABLE_VERSIONS`]).
    /// Never panics; refuses, with what is wrong, anything else. Loading into a consumer,
    /// prefer [`SavedPosition::decode_for`] (the feed's length bounds what is allocated).
    pub fn decode(bytes: &[u8]) -> Result<Self, PositionError> {
        Self::decode_checked(bytes, None)
    }

    /// [`SavedPosition::decode`] for a feed of `feed_len` samples: a position of another
    /// length is refused ([`PositionError::OtherFeed`], field `length`) before anything is
    /// allocated for its delivered set, so a crafted position claiming 2^40 samples costs
    /// nothing.
    pub fn decode_for(bytes: &[u8], feed_len: u64) -> Result<Self, PositionError> {
        Self::decode_checked(bytes, Some(feed_len))
    }

    /// The feed identity a position was saved against, read from its header without
    /// allocating for its delivered set: a cheap first check (is it a position at all?).
    pub fn identity_of(bytes: &[u8]) -> Result<FeedIdentity, PositionError> {
        let (mut r, version) = Self::header(bytes)?;
        Self::read_identity(&mut r, version)
    }

    fn header(bytes: &[u8]) -> Result<(Reader<'_>, u32), PositionError> {
        if !bytes.starts_with(&MAGIC) {
            return Err(if MAGIC.starts_with(bytes) && !bytes.is_empty() {
                truncated("magic", 0, MAGIC.len() as u64, bytes.len())
            } else {
                PositionError::NotAPosition
            });
        }
        let mut r = Reader {
            bytes,
            at: MAGIC.len(),
        };
        let version = r.u32("format version")?;
        if !READABLE_VERSIONS.contains(&version) {
            return Err(PositionError::UnknownVersion {
                version,
                supported: READABLE_VERSIONS,
            });
        }
        Ok((r, version))
    }

    fn read_identity(r: &mut Reader<'_>, version: u32) -> Result<FeedIdentity, PositionError> {
        let source = r.str("feed source")?;
        let len = r.u64("feed length")?;
        let classes = r.str("feed class names")?;
        let seed = r.u64("feed seed")?;
        let transform = r.str("feed transform")?;
        let schema = r.str("feed schema")?;
        let (files, sizes) = if version >= 2 {
            (r.str("feed sample files")?, r.str("feed sample sizes")?)
        } else {
            (String::new(), String::new())
        };
        Ok(FeedIdentity {
            source,
            len,
            classes,
            seed,
            transform,
            schema,
            files,
            sizes,
        })
    }

    // Long (~170 lines) on purpose: it reads the format's fields in their byte order, each
    // checked where it is read, so that the layout is in one place to compare with `encode`.
    fn decode_checked(bytes: &[u8], feed_len: Option<u64>) -> Result<Self, PositionError> {
        let (mut r, version) = Self::header(bytes)?;
        let identity = Self::read_identity(&mut r, version)?;
        if let Some(feed_len) = feed_len
            && identity.len != feed_len
        {
            return Err(PositionError::OtherFeed {
                field: "length",
                saved: identity.len.to_string(),
                served: feed_len.to_string(),
            });
        }
        let epoch = r.u64("epoch")?;
        let batch_size = r.u32("batch size")?;
        let drop_last = match r.u8("drop_last")? {
            0 => false,
            1 => true,
            value => {
                return Err(PositionError::BadTag {
                    field: "drop_last",
                    value,
                });
            }
        };
        let group = match r.u8("group flag")? {
            0 => None,
            1 => {
                let name = r.str("group name")?;
                let rank = r.u32("group rank")?;
                let world_size = r.u32("group world size")?;
                let even = match r.u8("group even")? {
                    0 => Even::Pad,
                    1 => Even::Drop,
                    value => {
                        return Err(PositionError::BadTag {
                            field: "group even",
                            value,
                        });
                    }
                };
                Some(GroupSpec {
                    name,
                    rank,
                    world_size,
                    even,
                })
            }
            value => {
                return Err(PositionError::BadTag {
                    field: "group flag",
                    value,
                });
            }
        };
        let n = r.u64("delivered length")?;
        if n > MAX_DATASET_LEN {
            return Err(PositionError::TooLong {
                len: n,
                max: MAX_DATASET_LEN,
            });
        }
        if n != identity.len {
            return Err(PositionError::LengthMismatch {
                feed: identity.len,
                delivered: n,
            });
        }
        if let Some(group) = &group {
            group.validate(n).map_err(PositionError::BadGroup)?;
        }
        // Find the payloads' extents and check them without allocating, then the checksum,
        // and only then allocate the N bits.
        let delivered = scan_set(&mut r, n, ("delivered encoding", "delivered bitmap"))?;
        let wanted = if version >= 3 {
            match r.u8("wanted flag")? {
                0 => None,
                1 => Some(scan_set(&mut r, n, ("wanted encoding", "wanted bitmap"))?),
                value => {
                    return Err(PositionError::BadTag {
                        field: "wanted flag",
                        value,
                    });
                }
            }
        } else {
            None
        };
        let body_end = r.at;
        let stored = r.u64("checksum")?;
        if r.left() > 0 {
            return Err(PositionError::TrailingBytes { extra: r.left() });
        }
        let computed = fnv1a64(&bytes[..body_end]);
        if stored != computed {
            return Err(PositionError::BadChecksum { stored, computed });
        }

        let delivered = delivered.read(&bytes[..body_end], n)?;
        let wanted = match wanted {
            Some(set) => Some(set.read(&bytes[..body_end], n)?),
            None => None,
        };
        if let Some(wanted) = &wanted
            && let Some(index) = delivered.iter_ones().find(|&i| !wanted.get(i))
        {
            return Err(PositionError::BadGroup(PlanError::NotWanted { index }));
        }
        Ok(Self {
            identity,
            epoch,
            delivered,
            wanted,
            group,
            batch_size,
            drop_last,
        })
    }
}

/// Reads `count` ascending indices below `n` as deltas, calling `f` with each.
fn scan_list(
    r: &mut Reader<'_>,
    count: u64,
    n: u64,
    mut f: impl FnMut(u64),
) -> Result<(), PositionError> {
    let mut previous: Option<u64> = None;
    for _ in 0..count {
        let delta = r.varint("index delta")?;
        let index = match previous {
            None => delta,
            Some(p) if delta == 0 => return Err(PositionError::NotAscending { index: p }),
            // Past u64::MAX is past any N, so saturating is out of range all the same.
            Some(p) => p.saturating_add(delta),
        };
        if index >= n {
            return Err(PositionError::IndexOutOfRange { index, len: n });
        }
        f(index);
        previous = Some(index);
    }
    Ok(())
}

/// The tag of the smallest encoding of `set` (the bitmap on a tie).
fn smallest_encoding(set: &Bitmap) -> u8 {
    let bitmap = set.len().div_ceil(8);
    let ones = list_size(set.count(), set.iter_ones(), bitmap);
    let zeros = list_size(set.len() - set.count(), set.iter_zeros(), bitmap);
    match (ones, zeros) {
        (Some(a), Some(b)) if b < a => MISSING_LIST,
        (Some(_), _) => DELIVERED_LIST,
        (None, Some(_)) => MISSING_LIST,
        (None, None) => BITMAP,
    }
}

/// The bytes of a list of `count` ascending `indices`, or `None` once it is not below
/// `limit` (so that a dense set is not walked to its end).
fn list_size(count: u64, indices: impl Iterator<Item = u64>, limit: u64) -> Option<u64> {
    let mut size = varint_len(count);
    let mut previous = 0;
    for (k, index) in indices.enumerate() {
        if size >= limit {
            return None;
        }
        size += varint_len(if k == 0 { index } else { index - previous });
        previous = index;
    }
    (size < limit).then_some(size)
}

fn varint_len(v: u64) -> u64 {
    u64::from((64 - v.leading_zeros()).max(1).div_ceil(7))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_list(out: &mut Vec<u8>, count: u64, indices: impl Iterator<Item = u64>) {
    put_varint(out, count);
    let mut previous = None;
    for index in indices {
        put_varint(out, previous.map_or(index, |p| index - p));
        previous = Some(index);
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // A string over 4 GiB is not an identity field; cut rather than wrap the length.
    let bytes = &s.as_bytes()[..s.len().min(u32::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn truncated(field: &'static str, offset: u64, needed: u64, left: usize) -> PositionError {
    PositionError::Truncated {
        field,
        offset,
        needed,
        left: left as u64,
    }
}

/// A cursor over the input that refuses to read past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left_usize(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn left(&self) -> u64 {
        self.left_usize() as u64
    }

    fn take(&mut self, field: &'static str, needed: u64) -> Result<&'a [u8], PositionError> {
        if needed > self.left() {
            return Err(truncated(field, self.at as u64, needed, self.left_usize()));
        }
        let start = self.at;
        self.at += needed as usize;
        Ok(&self.bytes[start..self.at])
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], PositionError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(field, N as u64)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, PositionError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, PositionError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, PositionError> {
        self.array(field).map(u64::from_le_bytes)
    }

    fn str(&mut self, field: &'static str) -> Result<String, PositionError> {
        let len = self.u32(field)?;
        let bytes = self.take(field, u64::from(len))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| PositionError::BadUtf8 { field })
    }

    fn varint(&mut self, field: &'static str) -> Result<u64, PositionError> {
        let offset = self.at as u64;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8(field)?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(PositionError::BadVarint { field, offset });
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(PositionError::BadVarint { field, offset })
    }
}

/// Writes `set` in its smallest encoding: the tag, then the payload.
fn put_set(out: &mut Vec<u8>, set: &Bitmap) {
    match smallest_encoding(set) {
        BITMAP => {
            out.push(BITMAP);
            let bytes = set.len().div_ceil(8) as usize;
            out.extend(set.words().iter().flat_map(|w| w.to_le_bytes()).take(bytes));
        }
        DELIVERED_LIST => {
            out.push(DELIVERED_LIST);
            put_list(out, set.count(), set.iter_ones());
        }
        _ => {
            out.push(MISSING_LIST);
            put_list(out, set.len() - set.count(), set.iter_zeros());
        }
    }
}

/// Where a set's payload lies, found and checked without allocating.
struct ScannedSet {
    tag: u8,
    at: usize,
    count: Option<u64>,
}

/// Scans a set of `n` bits at `r` (its tag and payload): the payload's extent, every list
/// entry in range, nothing allocated.
fn scan_set(
    r: &mut Reader<'_>,
    n: u64,
    (encoding, bitmap): (&'static str, &'static str),
) -> Result<ScannedSet, PositionError> {
    let tag = r.u8(encoding)?;
    let at = r.at;
    let count = match tag {
        BITMAP => {
            r.take(bitmap, n.div_ceil(8))?;
            None
        }
        DELIVERED_LIST | MISSING_LIST => {
            let count = r.varint("list count")?;
            if count > n {
                return Err(PositionError::ListTooLong { count, len: n });
            }
            if count > r.left() {
                // Every entry takes at least a byte.
                return Err(truncated("index list", r.at as u64, count, r.left_usize()));
            }
            scan_list(r, count, n, |_| ())?;
            Some(count)
        }
        value => {
            return Err(PositionError::BadTag {
                field: encoding,
                value,
            });
        }
    };
    Ok(ScannedSet { tag, at, count })
}

impl ScannedSet {
    /// The set's `n` bits, from the checksummed `body`.
    fn read(&self, body: &[u8], n: u64) -> Result<Bitmap, PositionError> {
        let oom = |_| PositionError::OutOfMemory { len: n };
        match self.count {
            None => {
                let end = self.at + usize::try_from(n.div_ceil(8)).unwrap_or(usize::MAX);
                let payload = &body[self.at..end];
                let words = usize::try_from(n.div_ceil(64)).unwrap_or(usize::MAX);
                let mut words =
                    try_zeroed(words).map_err(|_| PositionError::OutOfMemory { len: n })?;
                for (word, chunk) in words.iter_mut().zip(payload.chunks(8)) {
                    let mut le = [0u8; 8];
                    le[..chunk.len()].copy_from_slice(chunk);
                    *word = u64::from_le_bytes(le);
                }
                Bitmap::from_words(n, words).map_err(|e| match e {
                    BitmapError::BitPastEnd { len, index } => {
                        PositionError::BitPastEnd { len, index }
                    }
                    // The words are ⌈n/64⌉, so the only other refusal cannot happen.
                    _ => PositionError::OutOfMemory { len: n },
                })
            }
            Some(count) => {
                let mut set = Bitmap::try_new(n).map_err(oom)?;
                let mut r = Reader {
                    bytes: body,
                    at: self.at,
                };
                r.varint("list count")?;
                scan_list(&mut r, count, n, |index| {
                    set.set(index);
                })?;
                if self.tag == MISSING_LIST {
                    set.complement();
                }
                Ok(set)
            }
        }
    }
}

mod group;
pub use group::{group_state, remainder};

#[cfg(test)]
mod tests;
