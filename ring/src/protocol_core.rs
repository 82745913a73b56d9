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

use crate::sync::{AtomicU64, Ordering, fence};

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

/// Producer, before writing the slot of sequence `end − 1`: records that every sequence below
/// `end` is lent (so the samples `end − 1 − C` and older may be overwritten from now on). The
/// `Release` fence orders the record before the slot writes that follow: a reader that sees
/// any of them sees the record ([`intact_from`]). The seqlock that lets a *skimming* consumer
/// (one that holds no cursor, protocol version 9) copy samples and then check that none was
/// overwritten meanwhile.
pub fn lend(lent: &AtomicU64, end: u64) {
    lent.fetch_max(end, Ordering::Relaxed);
    fence(Ordering::Release);
}

/// Consumer, after copying samples out of a ring of `capacity` slots: the lowest sequence
/// whose copy is intact. A copy of sequence `s` made before this call holds sample `s` if
/// `s >= intact_from(..)`; older copies may be torn. The `Acquire` fence pairs with
/// [`lend`]'s: a copy that read any byte of a newer sample makes this load see its loan.
pub fn intact_from(lent: &AtomicU64, capacity: u64) -> u64 {
    fence(Ordering::Acquire);
    lent.load(Ordering::Relaxed).saturating_sub(capacity)
}

/// The let-go bit of a consumer's lease word (see [`deliver`]).
pub const LET_GO: u64 = 1;
/// Bits 1..16 of the lease word count deliveries (wrapping): a consumer that delivers a batch
/// always changes its word, even when its position does not move.
const COUNT_MASK: u64 = 0x7fff << 1;
/// Bits 16..64 hold the low 48 bits of the delivered position.
const POSITION_SHIFT: u32 = 16;

/// A lease word for `position`, delivery count `count`, not let go.
pub fn lease_word(position: u64, count: u64) -> u64 {
    (position << POSITION_SHIFT) | ((count << 1) & COUNT_MASK)
}

/// The full position a lease word holds, given any sequence number `near` it at most 2^47
/// after or before (the head): the word keeps only the low 48 bits.
pub fn lease_position(word: u64, near: u64) -> u64 {
    let low = word >> POSITION_SHIFT;
    let modulus = 1u64 << (64 - POSITION_SHIFT);
    let below = near.wrapping_sub(low) & (modulus - 1);
    if below <= modulus / 2 {
        near.wrapping_sub(below)
    } else {
        near.wrapping_add(modulus - below)
    }
}

/// Consumer: hands a batch to its user, recording that every sample below `position` is
/// delivered (or skipped). Fails, changing nothing, once the producer has let this consumer
/// go ([`let_go`]): then the batch must not be handed out, and the word (returned) says
/// where the producer took the consumer to be.
pub fn deliver(lease: &AtomicU64, position: u64) -> Result<(), u64> {
    let mut current = lease.load(Ordering::Acquire);
    loop {
        if current & LET_GO != 0 {
            return Err(current);
        }
        let count = ((current & COUNT_MASK) >> 1).wrapping_add(1);
        let next = lease_word(position, count);
        match lease.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(now) => current = now,
        }
    }
}

/// Producer: lets a consumer go if its lease word is still `seen` (it delivered nothing
/// since the producer read `seen`). Returns whether it did. A consumer let go never gets a
/// batch from slots the producer may now overwrite: its next [`deliver`] fails.
pub fn let_go(lease: &AtomicU64, seen: u64) -> bool {
    seen & LET_GO == 0
        && lease
            .compare_exchange(seen, seen | LET_GO, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}

/// Anyone: the lease word.
pub fn lease(lease: &AtomicU64) -> u64 {
    lease.load(Ordering::Acquire)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_always_changes_the_word_and_a_let_go_stops_the_next() {
        let word = AtomicU64::new(lease_word(5, 0));
        let seen = lease(&word);
        deliver(&word, 5).unwrap();
        assert_ne!(
            lease(&word),
            seen,
            "a delivery at the same position went unseen"
        );
        assert!(!let_go(&word, seen), "let go over a newer delivery");
        let seen = lease(&word);
        assert!(let_go(&word, seen));
        let err = deliver(&word, 9).unwrap_err();
        assert_eq!(lease_position(err, 7), 5);
        assert!(!let_go(&word, lease(&word)), "let go twice");
    }

    #[test]
    fn positions_survive_the_48_bit_word_near_the_head() {
        for position in [
            0u64,
            1,
            (1 << 48) - 1,
            1 << 48,
            (1 << 50) + 12345,
            u64::MAX / 2,
        ] {
            let word = lease_word(position, 3);
            for near in [position, position + 4096, position.saturating_sub(4096)] {
                assert_eq!(lease_position(word, near), position, "near {near}");
            }
        }
    }
}
