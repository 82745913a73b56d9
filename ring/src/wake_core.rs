//! The publish/wake handshake, in one place, generic over the futex so that loom can check it.
//!
//! A consumer's threads sleep on the wake word of its cursor page until the head reaches the
//! end of the batch each waits for; the producer, after publishing, wakes them only when one
//! of them is due, so a batch of `B` samples costs one wake-up, not `B`. A lost wake-up is a
//! consumer asleep on a published batch: with the ring full of what it holds, the producer
//! publishes nothing more, and only the wait's timeout (the SDK's 100 ms poll) ends it. Two
//! words, both in the cursor page:
//!
//! - the *waiters* word: how many of the consumer's threads are registered to sleep (bits
//!   0..15), the *any* bit (15: wake at the next publish whatever the head), and the low 48
//!   bits of the target of the thread that registered last (bits 16..64, read back near the
//!   head as the lease word's position is);
//! - the *wake* word, the futex word, bumped by every wake-up.
//!
//! The steps, and why no wake-up is lost:
//!
//! 1. A waiter ([`wait_for_head`]) registers, adding one to the count and putting its target
//!    in one step, then issues a `SeqCst` fence, reads the wake word, and only then reads the
//!    head (and the end flag): it sleeps only on that wake word, and only if its batch is not
//!    published.
//! 2. The producer ([`wake_if_due`]) publishes the head, issues a `SeqCst` fence, reads the
//!    waiters word, and wakes ([`wake`]: bump the word, wake every sleeper) when more than
//!    one thread waits, or the one that waits is due (its target is at or below the head, or
//!    the any bit is set).
//! 3. The two fences forbid the store-buffering outcome: either the producer sees the
//!    waiter's registration or the waiter sees the new head. A waiter that reads the wake word
//!    after a wake's bump sees everything published before it (the bump releases, the read
//!    acquires); one that reads it before sleeps on a stale value, so the futex returns at
//!    once or the wake finds it asleep.
//! 4. The target belongs to the last thread to register, so one word holds both, and the
//!    producer never pairs a count with another moment's target. A thread that leaves while
//!    others still wait sets the any bit in the same step as its decrement: the target may be
//!    its own, and the one left is woken at the next publish to register its own again.
//!
//! `tests/loom.rs` model-checks exactly these functions, the futex modelled by a mutex and a
//! condition variable (a wait with no timeout, so a lost wake-up is a deadlock loom reports):
//! publish then wake, two waiters, and a waiter that gives up beside one that stays. The
//! models fail when a step is missing: without either fence loom finds the first deadlock;
//! with the count and the target in two words (protocol version 4, fences added, a leaver
//! resetting the target or waking the others) the second and third; without the any bit
//! the third.

use std::time::Duration;

use crate::protocol_core::lease_position;
use crate::sync::{AtomicU32, AtomicU64, Ordering, fence};

/// Bits 0..15 of the waiters word: how many threads are registered.
const COUNT: u64 = 0x7fff;
/// Bit 15 of the waiters word: a thread left while others still wait; the one due is unknown.
const ANY: u64 = 1 << 15;
/// Bits 16..64 of the waiters word hold the low 48 bits of the last registered target.
const TARGET_SHIFT: u32 = 16;

/// Sleeping on a 32-bit word, as Linux futexes do: the real one in `shm`, a mutex and a
/// condition variable under loom.
pub trait Futex {
    /// Sleeps while `word` holds `expected`, until [`Futex::wake_all`] on it, `timeout`
    /// passes, or spuriously. Comparing the word and going to sleep are one step with respect
    /// to [`Futex::wake_all`]: a wake after the comparison finds the caller asleep.
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration);
    /// Wakes every thread sleeping on `word`.
    fn wake_all(&self, word: &AtomicU32);
}

/// The two words of the handshake, wherever they live (a cursor page, a loom model).
#[derive(Debug, Clone, Copy)]
pub struct WakeWords<'a> {
    /// Who sleeps on the head: the count, the any bit and the last target (module docs).
    pub waiters: &'a AtomicU64,
    /// The futex word; every wake-up bumps it.
    pub wake_word: &'a AtomicU32,
}

/// How many threads the waiters word `word` counts.
pub fn waiting(word: u64) -> u64 {
    word & COUNT
}

/// Whether a producer that has published up to `head` must wake the threads the waiters word
/// `word` counts.
pub fn due(word: u64, head: u64) -> bool {
    match waiting(word) {
        0 => false,
        1 => word & ANY != 0 || lease_position(word, head) <= head,
        _ => true,
    }
}

/// Consumer: sleeps until the producer wakes it for a head at or above `target`, until
/// `timeout` passes, or spuriously; does not sleep when `ready()` (the head is at `target`
/// or the stream ended) already holds after registering. Callers loop, re-checking.
pub fn wait_for_head<F: Futex + ?Sized>(
    words: WakeWords<'_>,
    futex: &F,
    target: u64,
    ready: impl FnOnce() -> bool,
    timeout: Duration,
) {
    let registered = words
        .waiters
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
            let count = waiting(word);
            (count < COUNT).then(|| (target << TARGET_SHIFT) | (count + 1))
        })
        .is_ok();
    if !registered {
        // 32767 threads already wait on this consumer: do not sleep (the caller re-checks).
        return;
    }
    // Pairs with the producer's fence in `wake_if_due` (module docs, step 3).
    fence(Ordering::SeqCst);
    let word = words.wake_word.load(Ordering::SeqCst);
    if !ready() {
        futex.wait(words.wake_word, word, timeout);
    }
    let _ = words
        .waiters
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
            let left = waiting(word) - 1;
            // Others still wait, and the target may be this thread's (step 4).
            let any = if left > 0 { ANY } else { 0 };
            Some((word & !COUNT) | any | left)
        });
}

/// Producer, after publishing up to `head`: wakes the consumer's sleepers if one of them waits
/// for a head at or below `head`, or several wait. Returns whether it woke them.
pub fn wake_if_due<F: Futex + ?Sized>(words: WakeWords<'_>, futex: &F, head: u64) -> bool {
    // Orders the head's publication before the read below (module docs, step 3).
    fence(Ordering::SeqCst);
    if due(words.waiters.load(Ordering::SeqCst), head) {
        wake(words, futex);
        true
    } else {
        false
    }
}

/// Anyone: wakes every sleeper, whatever it waits for.
pub fn wake<F: Futex + ?Sized>(words: WakeWords<'_>, futex: &F) {
    words.wake_word.fetch_add(1, Ordering::SeqCst);
    futex.wake_all(words.wake_word);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_waiter_is_due_at_its_target_and_several_or_a_left_one_at_any_head() {
        let word = |count: u64, any: bool, target: u64| {
            (target << TARGET_SHIFT) | if any { ANY } else { 0 } | count
        };
        assert!(!due(word(0, false, 5), 100));
        assert!(!due(word(1, false, 5), 4));
        assert!(due(word(1, false, 5), 5));
        assert!(due(word(1, true, 5), 4));
        assert!(due(word(2, false, 5), 0));
        // Targets far past 2^48 are read back near the head.
        let far = (1u64 << 50) + 17;
        assert!(!due(word(1, false, far), far - 1));
        assert!(due(word(1, false, far), far));
    }
}
