//! Model-checks the head/cursor protocol of `ladle_ring::protocol_core` with loom: one
//! producer and one consumer over a 2-slot ring; loom explores every interleaving and
//! reports a data race if a slot could be written while the consumer reads it.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ladle-ring --test loom --release`
#![cfg(loom)]

use ladle_ring::protocol_core::{
    cursor, deliver, head, lease, lease_word, let_go, may_write, publish, release,
};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::AtomicU64;

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
                    // SAFETY (model): loom checks this write races with no read.
                    ring.slots[(seq % CAPACITY) as usize].with_mut(|p| unsafe { *p = seq });
                    publish(&ring.head, seq + 1);
                }
            })
        };
        for seq in 0..SAMPLES {
            while head(&ring.head) <= seq {
                loom::thread::yield_now();
            }
            let value = ring.slots[(seq % CAPACITY) as usize].with(|p| unsafe { *p });
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
                    // SAFETY (model): loom checks this write races with no read.
                    slot.with_mut(|p| unsafe { *p = 1 });
                }
            })
        };
        for position in [4, 8] {
            if deliver(&word, position).is_ok() {
                let value = slot.with(|p| unsafe { *p });
                assert_eq!(
                    value, 0,
                    "read a slot the producer overwrote after a let-go"
                );
            }
        }
        producer.join().unwrap();
    });
}
