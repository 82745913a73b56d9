//! What the cache's shared memory holds, byte for byte: pure encodings, no I/O.
//!
//! - **The index** of a dataset: one memfd the keeper writes and seals against every other
//!   writer. A header page of `u64` words ([`IndexHeader`]), then one `u64` word per sample:
//!   `0` for no entry, else the [`Location`] of its record. One word, so that a reader's one
//!   `Acquire` load can never see half a location.
//! - **Arenas**: memfds a feed creates, maps, seals against every other writer and hands to
//!   the keeper. Records are bump-allocated in them, 64-byte aligned: a 64-byte
//!   [`RecordHeader`] followed by `width × height × 3` bytes of RGB, row-major (what
//!   `ladle_datasets::decode::Decoder` gives). Nothing is evicted, so nothing is freed inside
//!   an arena: no fragmentation.

use ladle_datasets::cache::Stamp;

/// Records start at multiples of this.
pub const ALIGN: u64 = 64;
/// Bytes of a record's header.
pub const HEADER_LEN: usize = 64;
/// The first word of a record.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"LDC1");
/// The first word of an index.
pub const INDEX_MAGIC: u64 = u64::from_le_bytes(*b"LDCIDX01");
/// The index's header: one page.
pub const INDEX_HEADER_LEN: u64 = 4096;
/// The page size files and mappings are rounded to.
pub const PAGE: u64 = ladle_os::shm::PAGE as u64;
/// Arena ids fit in the location's top 24 bits (less one: 0 means "no entry").
pub const MAX_ARENAS: u32 = (1 << 24) - 1;
/// Offsets fit in 40 bits of 64-byte units: 64 TiB per arena.
const OFFSET_BITS: u32 = 40;

/// Word numbers of the index header.
#[derive(Debug, Clone, Copy)]
pub enum IndexHeader {
    /// [`INDEX_MAGIC`].
    Magic = 0,
    /// The number of samples.
    Len = 1,
    /// Non-zero while the budget is spent: a miss is not offered to fill.
    Full = 2,
    /// Non-zero once the keeper dropped this dataset: its readers let go of it.
    Dropped = 3,
}

/// `n` rounded up to a whole number of pages.
pub fn page_up(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

/// The size of the index file of `len` samples.
pub fn index_file_len(len: u64) -> u64 {
    page_up(INDEX_HEADER_LEN + len.saturating_mul(8))
}

/// Where a record lies: an arena and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The arena's id (its number in the dataset's list, from 0).
    pub arena: u32,
    /// The record's first byte, a multiple of [`ALIGN`].
    pub offset: u64,
}

impl Location {
    /// As an index word; `None` when it cannot be one (an id or offset out of range, an
    /// offset off the alignment).
    pub fn word(self) -> Option<u64> {
        if self.arena >= MAX_ARENAS
            || self.offset % ALIGN != 0
            || self.offset / ALIGN >= 1 << OFFSET_BITS
        {
            return None;
        }
        Some(((u64::from(self.arena) + 1) << OFFSET_BITS) | (self.offset / ALIGN))
    }

    /// The location an index word names; `None` for an empty word.
    pub fn of_word(word: u64) -> Option<Self> {
        let arena = word >> OFFSET_BITS;
        if arena == 0 {
            return None;
        }
        Some(Self {
            arena: u32::try_from(arena - 1).ok()?,
            offset: (word & ((1 << OFFSET_BITS) - 1)) * ALIGN,
        })
    }
}

/// A record's header: what it holds and what it was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The sample's index.
    pub index: u64,
    /// The file it was decoded from.
    pub stamp: Stamp,
}

impl RecordHeader {
    /// Bytes of pixels that follow the header.
    pub fn pixels_len(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height) * 3
    }

    /// Bytes the whole record takes in its arena, rounded up to [`ALIGN`].
    pub fn record_len(&self) -> u64 {
        (HEADER_LEN as u64 + self.pixels_len()).div_ceil(ALIGN) * ALIGN
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.width.to_le_bytes());
        out[8..12].copy_from_slice(&self.height.to_le_bytes());
        out[16..24].copy_from_slice(&self.index.to_le_bytes());
        out[24..32].copy_from_slice(&self.stamp.size.to_le_bytes());
        out[32..40].copy_from_slice(&self.stamp.mtime_ns.to_le_bytes());
        out
    }

    /// The header in `bytes`; `None` when they are not one (no magic, an empty image).
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Option<Self> {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        if u32_at(0) != RECORD_MAGIC {
            return None;
        }
        let header = Self {
            width: u32_at(4),
            height: u32_at(8),
            index: u64_at(16),
            stamp: Stamp {
                size: u64_at(24),
                mtime_ns: u64_at(32) as i64,
            },
        };
        (header.width > 0 && header.height > 0).then_some(header)
    }

    /// Whether a record with this header at `offset` lies wholly inside an arena of
    /// `arena_len` bytes.
    pub fn fits(&self, offset: u64, arena_len: u64) -> bool {
        offset
            .checked_add(self.record_len())
            .is_some_and(|end| end <= arena_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_round_trips_through_its_word_and_the_empty_word_is_none() {
        for (arena, offset) in [(0, 0), (5, 64 * 1000), (MAX_ARENAS - 1, (1u64 << 46) - 64)] {
            let at = Location { arena, offset };
            let word = at.word().unwrap();
            assert_ne!(word, 0);
            assert_eq!(Location::of_word(word), Some(at));
        }
        assert_eq!(Location::of_word(0), None);
        assert_eq!(
            Location {
                arena: 0,
                offset: 63
            }
            .word(),
            None
        );
        assert_eq!(
            Location {
                arena: MAX_ARENAS,
                offset: 0
            }
            .word(),
            None
        );
        assert_eq!(
            Location {
                arena: 0,
                offset: 1 << 46
            }
            .word(),
            None
        );
    }

    #[test]
    fn a_header_round_trips_and_garbage_is_not_a_header() {
        let header = RecordHeader {
            width: 500,
            height: 375,
            index: 1234,
            stamp: Stamp {
                size: 98_765,
                mtime_ns: -5,
            },
        };
        assert_eq!(RecordHeader::decode(&header.encode()), Some(header));
        assert_eq!(
            header.record_len(),
            (64 + 500 * 375 * 3u64).div_ceil(64) * 64
        );
        assert!(header.fits(0, header.record_len()));
        assert!(!header.fits(64, header.record_len()));
        assert!(!header.fits(u64::MAX - 10, u64::MAX));
        assert_eq!(RecordHeader::decode(&[0; HEADER_LEN]), None);
        let mut empty = header.encode();
        empty[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(RecordHeader::decode(&empty), None);
    }

    #[test]
    fn an_index_file_holds_its_header_page_and_a_word_per_sample() {
        assert_eq!(index_file_len(0), 4096);
        assert_eq!(index_file_len(512), 8192);
        assert_eq!(index_file_len(513), 12288);
    }
}
