//! The consumer against a real producer socket and a real shared-memory ring.

#![allow(clippy::unwrap_used)]
// tests fail loudly by design
// Hostile and fake peers bind their sockets raw, not by ladle-os's policy.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use ladle_consumer::prelude::*;
use support::{AtStop, Behaviour, CAPACITY, TestProducer, pixel};

fn config(batch_size: u32) -> ConsumerConfig {
    ConsumerConfig {
        batch_size,
        name: "test".into(),
        ..ConsumerConfig::default()
    }
}

/// Checks that a batch's labels, indices and pixels agree with the test producer's mapping
/// (`index = seq % len`, label = index, every pixel = `pixel(index)`).
fn assert_consistent(batch: &Batch<'_>, len: u64) {
    let [b, h, w, c] = batch.shape();
    assert_eq!(b, batch.len());
    assert_eq!((h, w, c), (8, 8, 3));
    let images = batch.images();
    assert_eq!(images.len(), b * h * w * c);
    for (k, (&index, &label)) in batch.indices().iter().zip(batch.labels()).enumerate() {
        assert_eq!(
            index,
            (batch.first_seq() + k as u64) % len,
            "{batch:?} sample {k}"
        );
        assert_eq!(label, index as i64);
        let sample = &images[k * h * w * c..(k + 1) * h * w * c];
        assert!(
            sample.iter().all(|&p| p == pixel(index)),
            "{batch:?} sample {k}"
        );
    }
}

#[test]
fn every_epoch_covers_each_index_exactly_once_for_batch_sizes_1_7_and_32() {
    const LEN: u64 = 100;
    const START: u64 = 37;
    for batch_size in [1u32, 7, 32] {
        let producer = TestProducer::start(Behaviour::serve(LEN, START));
        let consumer = Consumer::connect(producer.socket(), config(batch_size)).unwrap();
        assert_eq!(consumer.dataset().len, LEN);
        assert_eq!(consumer.layout().capacity, CAPACITY);
        let bs = u64::from(batch_size);
        assert_eq!(consumer.batches_per_epoch(), LEN.div_ceil(bs));
        // Six epochs of 100 run past the 512-sample ring: batches straddle the wrap.
        for k in 0..6 {
            assert_eq!(consumer.epoch_number(), k);
            let epoch = consumer.epoch();
            assert_eq!(epoch.number(), k);
            let mut seen = vec![0u32; LEN as usize];
            let mut batches = 0;
            for (i, batch) in epoch.enumerate() {
                let batch = batch.unwrap();
                let first = START + k * LEN + i as u64 * bs;
                assert_eq!(batch.first_seq(), first);
                assert_eq!(batch.epoch(), k);
                assert_eq!(batch.len() as u64, bs.min(START + (k + 1) * LEN - first));
                assert_consistent(&batch, LEN);
                for &index in batch.indices() {
                    seen[index as usize] += 1;
                }
                batches += 1;
            }
            assert_eq!(
                batches,
                consumer.batches_per_epoch(),
                "batch size {batch_size}"
            );
            assert!(
                seen.iter().all(|&n| n == 1),
                "batch size {batch_size}, epoch {k}"
            );
        }
    }
}

#[test]
fn drop_last_skips_the_partial_batch_and_the_next_epoch_starts_on_its_boundary() {
    const LEN: u64 = 100;
    let producer = TestProducer::start(Behaviour::serve(LEN, 5));
    let config = ConsumerConfig {
        drop_last: true,
        ..config(32)
    };
    let consumer = Consumer::connect(producer.socket(), config).unwrap();
    assert_eq!(consumer.batches_per_epoch(), 3);
    assert_eq!(consumer.samples_per_epoch(), 96);
    for k in 0..3 {
        let mut seen = vec![0u32; LEN as usize];
        let batches: Vec<(u64, usize)> = consumer
            .epoch()
            .map(|batch| {
                let batch = batch.unwrap();
                assert_consistent(&batch, LEN);
                for &index in batch.indices() {
                    seen[index as usize] += 1;
                }
                (batch.first_seq(), batch.len())
            })
            .collect();
        let base = 5 + k * LEN;
        assert_eq!(batches, [(base, 32), (base + 32, 32), (base + 64, 32)]);
        assert!(seen.iter().all(|&n| n <= 1));
        assert_eq!(seen.iter().sum::<u32>(), 96);
    }
}

#[test]
fn an_epoch_abandoned_early_resumes_at_the_next_boundary() {
    const LEN: u64 = 100;
    let producer = TestProducer::start(Behaviour::serve(LEN, 0));
    let consumer = Consumer::connect(producer.socket(), config(10)).unwrap();
    let mut first = consumer.epoch();
    let held = first.next().unwrap().unwrap();
    assert_eq!(held.first_seq(), 0);
    drop(first.next().unwrap().unwrap());

    // Starting epoch 1 ends epoch 0's iterator; the batch still held stays valid.
    let mut second = consumer.epoch();
    assert!(first.next().is_none());
    assert_eq!(consumer.epoch_number(), 2);
    let batch = second.next().unwrap().unwrap();
    assert_eq!((batch.first_seq(), batch.epoch()), (LEN, 1));
    assert_consistent(&held, LEN);
    drop(held);
    drop(batch);
    assert_eq!(second.count(), 9);

    // Dropping an epoch without reading it skips it whole.
    let _ = consumer.epoch();
    let batch = consumer.epoch().next().unwrap().unwrap();
    assert_eq!((batch.first_seq(), batch.epoch()), (3 * LEN, 3));
}

#[test]
fn a_consumer_let_go_while_holding_half_the_ring_rejoins_and_still_reads_its_epoch_exactly() {
    // Held: [0, 256) and [256, 512), the whole ring. Let go, the producer publishes nothing
    // more for it, so waiting for [512, 768) would never end; the consumer must notice, rejoin
    // and finish the epoch with the indices it has not seen.
    const LEN: u64 = 1000;
    let producer = TestProducer::start(Behaviour::LetGoWhenFull { len: LEN });
    let consumer = Consumer::connect(producer.socket(), config(256)).unwrap();
    let mut epoch = consumer.epoch();
    let a = epoch.next().unwrap().unwrap();
    let mut previous = epoch.next().unwrap().unwrap();
    let mut seen: Vec<u64> = a
        .indices()
        .iter()
        .chain(previous.indices())
        .copied()
        .collect();
    // The producer lets this consumer go while it holds `a` (the ring full for 200 ms with
    // nothing delivered), and `a` says so (its cursor page's let-go flag): wait for that, not
    // a fixed time. The support watchdog turns a producer that never does into a failure.
    while a.is_intact() {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(a);
    for batch in epoch {
        let batch = batch.unwrap();
        assert!(batch.is_copy(), "gathered after the rejoin");
        assert_consistent(&batch, LEN);
        seen.extend(batch.indices());
        previous = batch;
    }
    drop(previous);
    seen.sort_unstable();
    assert_eq!(seen, (0..LEN).collect::<Vec<_>>(), "the epoch is exact");
    assert_eq!(consumer.rejoins(), 1);
    // The next epoch starts where the rejoined window ends and is whole again.
    let next: Vec<u64> = consumer
        .epoch()
        .flat_map(|b| b.unwrap().indices().to_vec())
        .collect();
    assert_eq!(next.len() as u64, LEN);
}

#[test]
fn held_batches_pin_the_cursor_until_the_oldest_is_dropped() {
    const LEN: u64 = 1000;
    const START: u64 = 3;
    let producer = TestProducer::start(Behaviour::serve(LEN, START));
    let consumer = Consumer::connect(producer.socket(), config(8)).unwrap();
    let mut epoch = consumer.epoch();
    let a = epoch.next().unwrap().unwrap();
    let b = epoch.next().unwrap().unwrap();
    let c = epoch.next().unwrap().unwrap();
    assert_eq!(consumer.held_batches(), 3);
    assert_eq!(producer.cursor(), START);
    drop(b);
    assert_eq!(
        producer.cursor(),
        START,
        "released past the oldest held batch"
    );
    drop(a);
    assert_eq!(producer.cursor(), c.first_seq());

    // While `c` is held the producer cannot overwrite it, however far the consumer reads on.
    for _ in 0..(CAPACITY as usize - 16) / 8 {
        let batch = epoch.next().unwrap().unwrap();
        assert_consistent(&batch, LEN);
    }
    assert_eq!(producer.cursor(), c.first_seq());
    assert_consistent(&c, LEN);
    let next = c.first_seq() + 8 + (CAPACITY - 16);
    drop(c);
    assert_eq!(consumer.held_batches(), 0);
    assert_eq!(
        producer.cursor(),
        next,
        "with nothing held the cursor is what was handed out"
    );
}

#[test]
fn holding_more_than_max_batches_held_is_an_error_until_one_is_dropped() {
    let producer = TestProducer::start(Behaviour::serve(100, 0));
    let config = ConsumerConfig {
        max_batches_held: 2,
        ..config(4)
    };
    let consumer = Consumer::connect(producer.socket(), config).unwrap();
    let mut epoch = consumer.epoch();
    let a = epoch.next().unwrap().unwrap();
    let b = epoch.next().unwrap().unwrap();
    let err = epoch.next().unwrap().unwrap_err();
    assert!(
        matches!(err, ConsumerError::TooManyBatchesHeld { held: 2, max: 2 }),
        "{err}"
    );
    assert!(!err.is_final());
    drop(a);
    let c = epoch.next().unwrap().unwrap();
    assert_eq!(
        c.first_seq(),
        b.first_seq() + 4,
        "an error must not skip samples"
    );
}

#[test]
fn held_batches_that_fill_the_ring_are_an_error_not_a_deadlock() {
    let producer = TestProducer::start(Behaviour::serve(10_000, 0));
    let half = (CAPACITY / 2) as u32;
    let consumer = Consumer::connect(producer.socket(), config(half)).unwrap();
    let mut epoch = consumer.epoch();
    let a = epoch.next().unwrap().unwrap();
    let _b = epoch.next().unwrap().unwrap();
    let err = epoch.next().unwrap().unwrap_err();
    assert!(
        matches!(err, ConsumerError::TooManyBatchesHeld { held: 2, max: 2 }),
        "{err}"
    );
    drop(a);
    let c = epoch.next().unwrap().unwrap();
    assert_eq!(c.first_seq(), CAPACITY);
    assert_consistent(&c, 10_000);
}

#[test]
fn a_batch_kept_a_whole_ring_behind_is_an_error_that_names_it_not_a_deadlock() {
    let producer = TestProducer::start(Behaviour::serve(10_000, 0));
    let consumer = Consumer::connect(producer.socket(), config(8)).unwrap();
    let mut epoch = consumer.epoch();
    // An example batch kept for logging while the loop reads on, one batch at a time.
    let kept = epoch.next().unwrap().unwrap();
    let mut read = 8;
    let err = loop {
        match epoch.next().unwrap() {
            Ok(batch) => read += batch.len() as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(read, CAPACITY, "it read up to a ring past the kept batch");
    assert!(
        matches!(err, ConsumerError::OldBatchHeld { oldest: 0, next, capacity: CAPACITY } if next == CAPACITY + 8),
        "{err}"
    );
    assert!(!err.is_final());
    assert_eq!(
        consumer.held_batches(),
        1,
        "one batch held, not the two it said before"
    );
    assert!(err.to_string().contains("sample 0"), "{err}");
    drop(kept);
    let next = epoch.next().unwrap().unwrap();
    assert_eq!(next.first_seq(), CAPACITY, "an error must not skip samples");
    assert_consistent(&next, 10_000);
}

#[test]
fn a_producer_that_hangs_up_is_reported_as_gone_not_waited_for() {
    let producer = TestProducer::start(Behaviour::Serve {
        len: 100,
        start_seq: 0,
        stop_at: Some(64),
        at_stop: AtStop::HangUp,
    });
    let consumer = Consumer::connect(producer.socket(), config(32)).unwrap();
    let mut epoch = consumer.epoch();
    // What was published before the hang-up is still delivered.
    epoch.next().unwrap().unwrap();
    epoch.next().unwrap().unwrap();
    let err = epoch.next().unwrap().unwrap_err();
    match &err {
        ConsumerError::ProducerGone { socket } => assert_eq!(socket, producer.socket()),
        other => panic!("expected ProducerGone, got {other:?}"),
    }
    assert!(err.is_final());
    assert!(
        err.to_string()
            .contains(&*producer.socket().to_string_lossy())
    );
    assert!(epoch.next().is_none(), "the epoch ends after a final error");
    // Later epochs report the same error at once.
    let again = consumer.epoch().next().unwrap().unwrap_err();
    assert!(matches!(again, ConsumerError::ProducerGone { .. }));
}

#[test]
fn an_ended_stream_reports_the_producers_reason() {
    let producer = TestProducer::start(Behaviour::Serve {
        len: 100,
        start_seq: 0,
        stop_at: Some(40),
        at_stop: AtStop::End("shutting down".into()),
    });
    let consumer = Consumer::connect(producer.socket(), config(32)).unwrap();
    let mut epoch = consumer.epoch();
    epoch.next().unwrap().unwrap();
    match epoch.next().unwrap().unwrap_err() {
        ConsumerError::ProducerEnded { reason, .. } => assert_eq!(reason, "shutting down"),
        other => panic!("expected ProducerEnded, got {other:?}"),
    }
}

#[test]
fn a_rejected_hello_is_a_rejected_error_with_the_reason() {
    let producer = TestProducer::start(Behaviour::Reject("too many consumers".into()));
    match Consumer::connect(producer.socket(), config(32)).unwrap_err() {
        ConnectError::Rejected { socket, reason } => {
            assert_eq!(socket, producer.socket());
            assert_eq!(reason, "too many consumers");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

#[test]
fn a_missing_socket_is_a_typed_error_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nobody.sock");
    let err = Consumer::connect(&path, config(32)).unwrap_err();
    assert!(
        matches!(&err, ConnectError::SocketMissing { socket } if *socket == path),
        "{err:?}"
    );
    assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
}

#[test]
fn a_stale_socket_file_without_a_listener_is_no_producer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let err = Consumer::connect(&path, config(32)).unwrap_err();
    assert!(
        matches!(&err, ConnectError::NoProducer { socket } if *socket == path),
        "{err:?}"
    );
}

#[test]
fn with_a_connect_timeout_a_consumer_waits_for_a_socket_that_appears_later() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("later.sock");
    let (asked, asking) = std::sync::mpsc::channel();
    let connecting = {
        let path = path.clone();
        std::thread::spawn(move || {
            let config = ConsumerConfig {
                connect_timeout: Duration::from_secs(60),
                ..config(32)
            };
            asked.send(()).unwrap();
            Consumer::connect(&path, config)
        })
    };
    asking.recv().unwrap();
    // The feed starts only now (its own socket, then the one the consumer asked for).
    let producer = TestProducer::start(Behaviour::serve(100, 0));
    std::os::unix::fs::symlink(producer.socket(), &path).unwrap();
    let consumer = connecting.join().unwrap().unwrap();
    assert_eq!(consumer.dataset().len, 100);
}

#[test]
fn a_socket_that_never_appears_is_an_error_naming_it_and_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.sock");
    let config = ConsumerConfig {
        connect_timeout: Duration::from_millis(300),
        ..config(32)
    };
    let err = Consumer::connect(&path, config).unwrap_err();
    assert!(
        matches!(&err, ConnectError::SocketNeverAppeared { socket, waited }
            if *socket == path && *waited >= Duration::from_millis(300)),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&*path.to_string_lossy()) && text.contains("LADLE_CONNECT_TIMEOUT"),
        "{text}"
    );
}

#[test]
fn a_stale_socket_is_no_producer_at_once_even_with_a_connect_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let config = ConsumerConfig {
        // A consumer that retried a refused connection would hang here for an hour.
        connect_timeout: Duration::from_secs(3600),
        ..config(32)
    };
    let err = Consumer::connect(&path, config).unwrap_err();
    assert!(
        matches!(&err, ConnectError::NoProducer { socket } if *socket == path),
        "{err:?}"
    );
}

#[test]
fn batch_sizes_of_zero_or_above_half_the_ring_are_refused() {
    let producer = TestProducer::start(Behaviour::serve(100, 0));
    let too_big = (CAPACITY / 2) as u32 + 1;
    match Consumer::connect(producer.socket(), config(too_big)).unwrap_err() {
        ConnectError::BatchTooLarge {
            batch_size, max, ..
        } => assert_eq!((batch_size, max), (too_big, CAPACITY / 2)),
        other => panic!("expected BatchTooLarge, got {other:?}"),
    }
    // Zero is refused before any connection is made.
    let err = Consumer::connect(producer.dir().join("none.sock"), config(0)).unwrap_err();
    assert!(matches!(err, ConnectError::ZeroBatchSize { .. }), "{err:?}");
}

#[test]
fn a_silent_producer_is_a_handshake_timeout_not_a_hang() {
    let producer = TestProducer::start(Behaviour::Silent);
    let config = ConsumerConfig {
        handshake_timeout: Duration::from_millis(200),
        ..config(32)
    };
    let err = Consumer::connect(producer.socket(), config).unwrap_err();
    assert!(
        matches!(err, ConnectError::HandshakeTimeout { .. }),
        "{err:?}"
    );
}

#[test]
fn a_producer_of_another_protocol_version_is_refused() {
    let producer = TestProducer::start(Behaviour::WrongVersion);
    let err = Consumer::connect(producer.socket(), config(32)).unwrap_err();
    assert!(
        matches!(err, ConnectError::Version { ours, theirs, .. } if theirs == ours + 1),
        "{err:?}"
    );
}

#[test]
fn dropping_the_consumer_says_leave_and_closes_the_socket() {
    let producer = TestProducer::start(Behaviour::serve(100, 0));
    let consumer = Consumer::connect(producer.socket(), config(32)).unwrap();
    drop(consumer.epoch().next().unwrap().unwrap());
    drop(consumer);
    // The watchdog catches a producer that never notices.
    while !producer.saw_eof() {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(producer.saw_leave());
}

#[test]
fn shared_epochs_hand_distinct_batches_to_threads_and_release_them_from_any_thread() {
    const LEN: u64 = 300;
    let producer = TestProducer::start(Behaviour::serve(LEN, 0));
    let consumer = std::sync::Arc::new(Consumer::connect(producer.socket(), config(10)).unwrap());
    let epoch = std::sync::Mutex::new(consumer.shared_epoch());
    // At most 3 (senders) + 1 (queued) + 1 (receiver) held: under `max_batches_held`.
    let (tx, rx) = std::sync::mpsc::sync_channel::<SharedBatch>(1);
    let mut seen = vec![0u32; LEN as usize];
    std::thread::scope(|scope| {
        for _ in 0..3 {
            let (epoch, tx) = (&epoch, tx.clone());
            scope.spawn(move || {
                loop {
                    let next = epoch.lock().unwrap().next();
                    match next {
                        // Dropped on the receiving thread, not this one.
                        Some(batch) => tx.send(batch.unwrap()).unwrap(),
                        None => break,
                    }
                }
            });
        }
        drop(tx);
        for batch in rx {
            for &index in batch.indices() {
                seen[index as usize] += 1;
            }
            assert_eq!(batch.labels().len(), batch.len());
        }
    });
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    assert_eq!(consumer.held_batches(), 0);
}

#[test]
fn wait_ready_times_out_without_taking_a_batch_until_one_is_published() {
    // 15 samples published, then nothing: the first batch of 10 is ready, the second is not.
    let producer = TestProducer::start(Behaviour::Serve {
        len: 50,
        start_seq: 0,
        stop_at: Some(15),
        at_stop: AtStop::Hold,
    });
    let consumer = std::sync::Arc::new(Consumer::connect(producer.socket(), config(10)).unwrap());
    let mut epoch = consumer.shared_epoch();
    let mut ready = false;
    for _ in 0..200 {
        ready = epoch.wait_ready(Duration::from_millis(50)).unwrap();
        if ready {
            break;
        }
    }
    assert!(ready, "the test producer publishes 15 samples within 10 s");
    assert_eq!(consumer.held_batches(), 0, "waiting takes nothing");
    let first = epoch.next().unwrap().unwrap();
    assert_eq!((first.first_seq(), first.len()), (0, 10));
    assert!(!epoch.wait_ready(Duration::from_millis(200)).unwrap());
    assert_eq!(
        consumer.held_batches(),
        1,
        "a wait that timed out takes nothing"
    );
}
