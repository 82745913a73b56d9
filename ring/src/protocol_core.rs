//! The head/cursor protocol, in one place, with the orderings that make it correct.
//!
//! - The producer writes sample `s` into slot `s mod C` only while `s < min_cursor + C`
//!   ([`may_write`]), having read every live cursor with `Acquire` ([`cursor`]): so every
//!   consumer's reads of the slot's previous sample happen before the overwrite.
//! - It then publishes with a `Release` store of the head ([`publish`]): every write of every
//!   sample below the head happens before a consumer's `Acquire` load of it ([`head`]).
//! - A consumer reads samples below the head, then releases them with a `Release` store of
//!   its cursor ([`release`]).
//!
//! `tests/loom.rs` model-checks exactly these functions.

use crate::sync::{AtomicU64, Ordering};

/// Whether the producer may write sequence `seq` into a ring of `capacity` slots whose
/// slowest live consumer has released everything below `min_cursor`.
pub fn may_write(seq: u64, min_cursor: u64, capacity: u64) -> bool {
    seq < min_cursor.saturating_add(capacity)
}

/// Producer: every sample below `new_head` is written.
pub fn publish(head: &AtomicU64, new_head: u64) {
    head.store(new_head, Ordering::Release);
}

/// Consumer: every sample below the returned value is readable.
pub fn head(head: &AtomicU64) -> u64 {
    head.load(Ordering::Acquire)
}

/// Consumer: done with every sample below `upto`.
pub fn release(cursor: &AtomicU64, upto: u64) {
    cursor.store(upto, Ordering::Release);
}

/// Producer: what a consumer has released.
pub fn cursor(cursor: &AtomicU64) -> u64 {
    cursor.load(Ordering::Acquire)
}
