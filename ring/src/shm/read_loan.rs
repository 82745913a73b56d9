//! The read side's loan: the mirror of [`WriteLoan`](crate::WriteLoan). A consumer reads
//! published samples only through a [`ReadLoan`], granted by
//! [`ConsumerRing::read_loan`] for a span below the head, and viewed through the ring that
//! granted it. This is the one place where a consumer's bytes come out of shared memory, so
//! the rule for what those bytes promise is written here, once.
//!
//! # What a view promises
//! A view is plain data of a read-only mapping that lives as long as the ring: every bit
//! pattern is a value of its type (`u8`, `u64`), the region is page-aligned, and a span of
//! at most the capacity lies inside the double mapping. What no type can promise is that the
//! producer, another process, does not write those slots while they are viewed. The protocol
//! promises it while the consumer's cursor protects the span: the producer lends a slot for
//! writing only once every attached consumer's cursor has passed it. That protection ends
//! when the consumer no longer gates the feed: the producer let it go (a stall timeout), or it
//! skims (it held the others back). From then on the producer may lend the span's slots again
//! and rewrite them under a view. [`ConsumerRing::is_intact`] says whether it has (the
//! producer records every loan in the ring's `lent` word before writing: a seqlock,
//! model-checked in `tests/loom.rs`): check it *after* reading a span that may have lost its
//! protection, and treat what was read as torn when it says `false`. A reader that must not
//! see a torn value while it reads copies the span first (as a skimming consumer does) or
//! reads each word once ([`ConsumerRing::index_once`]).

use super::ConsumerRing;
use crate::sys::Mapping;

/// The right to read the published samples `start..start + len` of one consumer's ring
/// (`len` at most its capacity), from [`ConsumerRing::read_loan`]. A loan is a position, not a
/// borrow: a batch keeps it for as long as it lives, and views it through its ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLoan {
    start: u64,
    len: usize,
}

impl ReadLoan {
    /// The sequence number of its first sample.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Samples it covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no sample.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl ConsumerRing {
    /// A loan of `start..start + len`, if those samples are published (below the head) and
    /// fit the ring (`len <= capacity`); `None` otherwise.
    pub fn read_loan(&self, start: u64, len: usize) -> Option<ReadLoan> {
        let end = start.checked_add(len as u64)?;
        (len as u64 <= self.layout.capacity && end <= self.head())
            .then_some(ReadLoan { start, len })
    }

    /// Whether every sample of `loan` still holds what was published there: the producer has
    /// lent none of its slots for writing since. Read first, then check (see the module's
    /// rule): `true` means that what was read before this call is whole.
    pub fn is_intact(&self, loan: &ReadLoan) -> bool {
        loan.start >= self.intact_from()
    }

    /// Field `k` of `loan`'s samples, as one contiguous `[len, ...shape]` byte slice.
    ///
    /// # Panics
    /// If `k` is not a field of the schema.
    pub fn field(&self, loan: &ReadLoan, k: usize) -> &[u8] {
        let bytes = self.layout.schema.fields()[k].bytes();
        let (slot, len) = self.span(loan);
        // SAFETY: `slot < capacity` and `len <= capacity` (`span`), so `slot + len` samples
        // lie inside the double mapping of `capacity × bytes` twice; the mapping lives as long
        // as `self`; bytes are valid at any pattern. Writes by the producer: the module's rule.
        unsafe {
            std::slice::from_raw_parts(
                self.regions.fields[k].as_ptr().add(slot * bytes),
                len * bytes,
            )
        }
    }

    /// The dataset index of each of `loan`'s samples.
    pub fn indices(&self, loan: &ReadLoan) -> &[u64] {
        self.words(&self.regions.indices, loan)
    }

    /// The flags word of each of `loan`'s samples ([`FLAG_BAD`](crate::layout::FLAG_BAD)).
    pub fn flags(&self, loan: &ReadLoan) -> &[u64] {
        self.words(&self.regions.flags, loan)
    }

    /// The dataset index of `loan`'s sample `k`, read exactly once: what a reader of a span
    /// the producer may be rewriting decides on (the value it read is the one it keeps, even
    /// if the slot changes meanwhile). `None` when `k` is not a sample of the loan.
    pub fn index_once(&self, loan: &ReadLoan, k: usize) -> Option<u64> {
        let word = self.indices(loan).get(k)?;
        // SAFETY: a valid, aligned `u64` of the mapping (a reference to it); volatile: the
        // compiler reads it once, here, and never again in its place.
        Some(unsafe { std::ptr::read_volatile(word) })
    }

    /// `loan`'s first slot and its length, within the double mapping whatever the loan (a
    /// loan of another, larger ring is cut to this one's capacity).
    fn span(&self, loan: &ReadLoan) -> (usize, usize) {
        let capacity = self.layout.capacity;
        let slot = (loan.start % capacity) as usize;
        (slot, loan.len.min(capacity as usize))
    }

    fn words(&self, map: &Mapping, loan: &ReadLoan) -> &[u64] {
        let (slot, len) = self.span(loan);
        // SAFETY: as in `field`, for a region of one `u64` per sample; the region is
        // page-aligned, so 8-byte aligned; any pattern is a `u64`.
        unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<u64>().add(slot), len) }
    }
}
