//! Model-checks with loom the head/cursor protocol of `ladle_ring::protocol_core` (one
//! producer and one consumer over a 2-slot ring; loom explores every interleaving and reports
//! a data race if a slot could be written while the consumer reads it), its lease word, and
//! the publish/wake handshake of `ladle_ring::wake_core` (a lost wake-up is a deadlock loom
//! reports).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ladle-ring --test loom --release`
#![cfg(loom)]
#![allow(clippy::unwrap_used)] // a model fails loudly by design

use std::time::Duration;

use ladle_ring::protocol_core::{
    cursor, deliver, head, intact_from, lease, lease_word, lend, let_go, may_write, publish,
    release,
};
use ladle_ring::wake_core::{Futex, WakeWords, wait_for_head, wake_if_due};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};

const CAPACITY: u64 = 2;
const SAMPLES: u64 = 3;

struct Ring {
    head: AtomicU64,
    cursor: AtomicU64,
    slots: [UnsafeCell<u64>; CAPACITY as usize],
}

#[test]
fn the_consumer_never_reads_a_slot_while_the_producer_writes_it() {
    let mut model = loom::model::Builder::new();
    // Bounding preemptions keeps the search to seconds; races need only one or two.
    model.preemption_bound = Some(3);
    model.check(|| {
        let ring = Arc::new(Ring {
            head: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            slots: [UnsafeCell::new(u64::MAX), UnsafeCell::new(u64::MAX)],
        });
        let producer = {
            let ring = ring.clone();
            loom::thread::spawn(move || {
                for seq in 0..SAMPLES {
                    while !may_write(seq, cursor(&ring.cursor), CAPACITY) {
                        loom::thread::yield_now();
                    }
                    ring.slots[(seq % CAPACITY) as usize].with_mut(|p| {
                        // SAFETY: a valid cell; loom checks that this write races with no read.
                        unsafe { *p = seq }
                    });
                    publish(&ring.head, seq + 1);
                }
            })
        };
        for seq in 0..SAMPLES {
            while head(&ring.head) <= seq {
                loom::thread::yield_now();
            }
            let value = ring.slots[(seq % CAPACITY) as usize].with(|p| {
                // SAFETY: a valid cell; loom checks that this read races with no write.
                unsafe { *p }
            });
            assert_eq!(
                value, seq,
                "read a sample that was not (or no longer) published"
            );
            release(&ring.cursor, seq + 1);
        }
        producer.join().unwrap();
    });
}

/// The lease word: a consumer hands out a batch only if its delivery wins, and the producer
/// overwrites the batch's slot only if its let-go wins, against the word it saw before the
/// delivery (the stall timeout's premise). Loom explores every interleaving: never both.
#[test]
fn a_delivery_and_a_let_go_against_an_older_word_never_both_succeed() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let word = Arc::new(AtomicU64::new(lease_word(0, 0)));
        let slot = Arc::new(UnsafeCell::new(0u64));
        // What the producer saw when it started watching this consumer.
        let seen = lease(&word);
        let producer = {
            let (word, slot) = (word.clone(), slot.clone());
            loom::thread::spawn(move || {
                if let_go(&word, seen) {
                    slot.with_mut(|p| {
                        // SAFETY: a valid cell; loom checks that this write races with no read.
                        unsafe { *p = 1 }
                    });
                }
            })
        };
        for position in [4, 8] {
            if deliver(&word, position).is_ok() {
                let value = slot.with(|p| {
                    // SAFETY: a valid cell; loom checks that this read races with no write.
                    unsafe { *p }
                });
                assert_eq!(
                    value, 0,
                    "read a slot the producer overwrote after a let-go"
                );
            }
        }
        producer.join().unwrap();
    });
}

/// The skimming consumer's seqlock: it holds no cursor, copies a sample (two words, so a
/// copy can be torn) and then asks `intact_from`. Whatever word of the newer sample its copy
/// saw, the check must say the copy may be torn: a copy judged intact is the old sample whole.
/// As in the producer, the loan is taken on one thread (the feeder, `lend`) and handed to
/// another that writes the slot after its own `Release` fence (`WriteLoan::slot`).
#[test]
fn a_skimmed_copy_judged_intact_is_never_torn() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        // One slot holding sequence 0 (both words 0), every sequence below 1 lent.
        let lent = Arc::new(AtomicU64::new(1));
        let words = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let handed = Arc::new(AtomicU32::new(0));
        let feeder = {
            let (lent, handed) = (lent.clone(), handed.clone());
            loom::thread::spawn(move || {
                // Sequence 1 takes the slot of sequence 0; the loan goes to a worker.
                lend(&lent, 2);
                handed.store(1, Ordering::Release);
            })
        };
        let producer = {
            let (words, handed) = (words.clone(), handed.clone());
            loom::thread::spawn(move || {
                if handed.load(Ordering::Acquire) == 0 {
                    return; // not handed over in this interleaving: nothing written
                }
                loom::sync::atomic::fence(Ordering::Release);
                words[0].store(1, Ordering::Relaxed);
                words[1].store(1, Ordering::Relaxed);
            })
        };
        let copy = [
            words[0].load(Ordering::Relaxed),
            words[1].load(Ordering::Relaxed),
        ];
        if intact_from(&lent, 1) == 0 {
            assert_eq!(copy, [0, 0], "a copy judged intact held a newer sample");
        }
        feeder.join().unwrap();
        producer.join().unwrap();
    });
}

/// The futex, modelled: comparing the word and going to sleep happen under the lock a wake
/// takes, so a wake after the comparison finds the sleeper waiting. A sleep has no timeout
/// (a lost wake-up is then a deadlock loom reports), and never ends spuriously; a zero
/// timeout stands for a wait that timed out at once (a thread that gives up).
#[derive(Default)]
struct ModelFutex {
    lock: Mutex<()>,
    sleepers: Condvar,
}

impl Futex for ModelFutex {
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration) {
        let guard = self.lock.lock().unwrap();
        if !timeout.is_zero() && word.load(Ordering::SeqCst) == expected {
            drop(self.sleepers.wait(guard).unwrap());
        }
    }

    fn wake_all(&self, _word: &AtomicU32) {
        let _guard = self.lock.lock().unwrap();
        self.sleepers.notify_all();
    }
}

/// A ring's head and one consumer's wake words, as the header and the cursor page hold them.
#[derive(Default)]
struct Page {
    head: AtomicU64,
    waiters: AtomicU64,
    wake_word: AtomicU32,
    futex: ModelFutex,
}

impl Page {
    fn words(&self) -> WakeWords<'_> {
        WakeWords {
            waiters: &self.waiters,
            wake_word: &self.wake_word,
        }
    }

    /// A consumer thread: sleeps until the head reaches `target`, as `Consumer::wait_for` does.
    fn wait_for(&self, target: u64) {
        while head(&self.head) < target {
            let ready = || head(&self.head) >= target;
            wait_for_head(self.words(), &self.futex, target, ready, Duration::MAX);
        }
    }

    /// The producer: publishes up to `new_head`, then wakes the consumer if it is due.
    fn publish(&self, new_head: u64) {
        publish(&self.head, new_head);
        wake_if_due(self.words(), &self.futex, new_head);
    }
}

/// Two preemptions are enough for a store-buffering race; three keep each model to seconds.
fn wake_model() -> loom::model::Builder {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model
}

/// Publish then wake against a waiter: whatever the interleaving, the waiter either sees the
/// head or is woken. Without the fences in `wait_for_head` and `wake_if_due` (or with the
/// waiter reading the head before registering) loom finds the interleaving in which the
/// producer reads no waiter and the waiter reads the old head, then sleeps for ever: a
/// deadlock.
#[test]
fn a_published_batch_always_wakes_the_thread_waiting_for_it() {
    wake_model().check(|| {
        let page = Arc::new(Page::default());
        let producer = {
            let page = page.clone();
            loom::thread::spawn(move || {
                page.publish(1); // short of the batch: no wake-up is due
                page.publish(2);
            })
        };
        page.wait_for(2);
        producer.join().unwrap();
    });
}

/// Two threads of one consumer wait for two batches: the waiters word holds only the last
/// target, yet each is woken once its batch is published, before anything more is (as when
/// the ring is full). With the count and the target in two words, the target stored first
/// (protocol version 4), loom finds the near thread asleep on its batch.
#[test]
fn two_threads_waiting_for_different_batches_are_both_woken() {
    wake_model().check(|| {
        let page = Arc::new(Page::default());
        let near = {
            let page = page.clone();
            loom::thread::spawn(move || page.wait_for(1))
        };
        let far = {
            let page = page.clone();
            loom::thread::spawn(move || page.wait_for(2))
        };
        page.publish(1);
        // As with a full ring: nothing more is published until the near batch is taken.
        near.join().unwrap();
        page.publish(2);
        far.join().unwrap();
    });
}

/// A thread that gives up (its wait times out) beside one that stays: the one that stays is
/// still woken for its batch. With the count and the target in two words (protocol version
/// 4, even with a leaver that resets the target or wakes the others) loom finds the producer
/// judging the one that stays by the leaver's target after the leaver has gone; so does the
/// packed word without the any bit.
#[test]
fn a_thread_that_gives_up_does_not_take_another_threads_wake_up_with_it() {
    wake_model().check(|| {
        let page = Arc::new(Page::default());
        let stays = {
            let page = page.clone();
            loom::thread::spawn(move || page.wait_for(1))
        };
        let gives_up = {
            let page = page.clone();
            loom::thread::spawn(move || {
                let ready = || head(&page.head) >= 5;
                wait_for_head(page.words(), &page.futex, 5, ready, Duration::ZERO);
            })
        };
        page.publish(1);
        stays.join().unwrap();
        gives_up.join().unwrap();
    });
}
