//! The consumer against a producer that is buggy or hostile (or of a future version): it must
//! not be able to crash its consumers with `SIGBUS`, hang them in the handshake, or hand them
//! a silently wrong epoch. Each test failed before its fix: the unsealed-file tests killed the
//! test binary with `SIGBUS`, the trickle test hung until the watchdog aborted it, the
//! sequence tests got a short epoch (or a connection) instead of an error.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use ladle_consumer::prelude::*;
use support::{Behaviour, TestProducer, Unsealed};

fn config(batch_size: u32) -> ConsumerConfig {
    ConsumerConfig {
        batch_size,
        name: "hostile-test".into(),
        ..ConsumerConfig::default()
    }
}

#[test]
fn a_ring_or_cursor_page_whose_size_is_not_sealed_is_refused_before_it_is_mapped() {
    for which in [Unsealed::Ring, Unsealed::CursorPage] {
        let producer = TestProducer::start(Behaviour::Unsealed(which));
        let connected = Consumer::connect(producer.socket(), config(4));
        if let Ok(consumer) = &connected {
            // What the seal check prevents: the producer shrinks the file under the mapping,
            // and the consumer's next look at it (the head, its cursor) dies with SIGBUS.
            producer.shrink_unsealed();
            let _ = consumer.epoch().next();
        }
        match connected {
            Err(ConnectError::UnsealedMemory { socket, file }) => {
                assert_eq!(socket, producer.socket());
                assert_eq!(file, which.file());
            }
            other => panic!("{which:?}: expected UnsealedMemory, got {other:?}"),
        }
    }
}

#[test]
fn a_welcome_trickled_a_byte_at_a_time_cannot_hold_the_consumer_past_the_handshake_timeout() {
    let producer = TestProducer::start(Behaviour::TrickleWelcome);
    let config = ConsumerConfig {
        // Each byte arrives well within this; the whole frame never does.
        handshake_timeout: Duration::from_millis(300),
        ..config(4)
    };
    let error = Consumer::connect(producer.socket(), config).err();
    match error {
        Some(ConnectError::HandshakeTimeout { socket, timeout }) => {
            assert_eq!(socket, producer.socket());
            assert_eq!(timeout, Duration::from_millis(300));
        }
        other => panic!("expected a handshake timeout, got {other:?}"),
    }
}

#[test]
fn a_start_sequence_whose_first_epoch_runs_past_2_pow_64_is_refused() {
    let start = u64::MAX - 50;
    let producer = TestProducer::start(Behaviour::serve(100, start));
    match Consumer::connect(producer.socket(), config(10)) {
        Err(ConnectError::SequenceOverflow {
            socket,
            start_seq,
            len,
        }) => {
            assert_eq!(socket, producer.socket());
            assert_eq!((start_seq, len), (start, 100));
        }
        Err(other) => panic!("expected SequenceOverflow, got {other}"),
        Ok(consumer) => {
            let delivered: usize = consumer.epoch().map(|b| b.unwrap().len()).sum();
            panic!("connected, and epoch 0 delivered {delivered} of 100 samples");
        }
    }
}

#[test]
fn an_epoch_that_would_run_past_2_pow_64_is_an_error_not_a_short_epoch() {
    const LEN: u64 = 100;
    let producer = TestProducer::start(Behaviour::serve(LEN, u64::MAX - 150));
    let consumer = Consumer::connect(producer.socket(), config(10)).unwrap();
    // Epoch 0, [2^64 − 151, 2^64 − 51), fits and covers the dataset exactly.
    let mut seen = vec![0u32; LEN as usize];
    for batch in consumer.epoch() {
        for &index in batch.unwrap().indices() {
            seen[index as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    // Epoch 1 would end at 2^64 + 49: an error, then nothing more.
    let mut epoch = consumer.epoch();
    match epoch.next() {
        Some(Err(ConsumerError::SequenceOverflow { socket, epoch: 1 })) => {
            assert_eq!(socket, producer.socket());
        }
        Some(Ok(batch)) => panic!("epoch 1 handed out {batch:?}"),
        other => panic!("expected SequenceOverflow, got {other:?}"),
    }
    assert!(epoch.next().is_none(), "the error is final");
}
