//! The producer and consumers as real processes: coverage for every batch size and join
//! time, crashes on either side, and hostile connections.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ladle_tests::{Fixture, wait_until};
use serde_json::Value;

/// Deadlock guard for one consumer run; never a speed assertion.
const GUARD: Duration = Duration::from_secs(300);

/// Small samples and a small ring so that the ring wraps many times per test.
const SERVE: &[&str] = &["--image-size", "32", "--ring-mib", "8", "--threads", "2"];

#[test]
fn four_consumers_with_batch_sizes_1_32_100_256_each_see_every_sample_once_per_epoch() {
    let mut fx = Fixture::new();
    let data = fx.dataset(300, 48, 40);
    fx.serve(&data, SERVE);
    let consumers: Vec<(u32, usize)> = [1, 32, 100, 256]
        .into_iter()
        .map(|b| (b, fx.consume(b, 3, &[])))
        .collect();
    for (batch, c) in consumers {
        let done = fx.wait(c, GUARD);
        done.assert_exact(3, &format!("batch {batch}"));
        let first = &done.epochs()[0];
        assert_eq!(first["samples"], 300);
        assert_eq!(first["batches"], 300u64.div_ceil(u64::from(batch)));
    }
}

#[test]
fn a_consumer_joining_mid_epoch_gets_exact_coverage_without_waiting_for_the_next_epoch() {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 48, 40);
    fx.serve(&data, SERVE);
    // A slow first consumer keeps the producer mid-epoch when the second joins, which it does
    // once the producer says the first has joined and samples have been published.
    let early = fx.consume(16, 2, &["--step-ms", "5"]);
    fx.wait_for_stats("the early consumer joined and samples published", |s| {
        s.joins == 1 && s.published > 0
    });
    let late = fx.consume(64, 2, &[]);
    let late = fx.wait(late, GUARD);
    late.assert_exact(2, "late joiner");
    let start = late
        .json_lines()
        .iter()
        .find_map(|v| v.get("start_seq").and_then(Value::as_u64));
    let start = start.expect("consume --json reports its start_seq");
    assert_ne!(
        start % 200,
        0,
        "the late consumer was meant to join mid-epoch (start {start})"
    );
    fx.wait(early, GUARD).assert_exact(2, "early consumer");
}

fn count_fds_and_cursor_maps(pid: u32) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    (
        fds,
        maps.lines().filter(|l| l.contains("ladle-cursor")).count(),
    )
}

#[test]
fn a_consumer_killed_mid_epoch_releases_its_hold_and_the_others_finish_exactly() {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 48, 40);
    // A 512-sample ring, smaller than the 1000 samples a and b read: they can only finish
    // if the producer reuses the slots the victim held.
    let small_ring = ["--image-size", "32", "--ring-mib", "2", "--threads", "2"];
    let serve = fx.serve(&data, &small_ring);
    let producer = fx.pid(serve);
    let baseline = count_fds_and_cursor_maps(producer);
    // The victim is slow: while it lives, backpressure holds everyone to its pace.
    let victim = fx.consume(32, 1000, &["--step-ms", "200"]);
    let a = fx.consume(32, 5, &[]);
    let b = fx.consume(64, 5, &[]);
    // Each consumer's cursor page is mapped before the producer lists it as a consumer.
    fx.wait_for_stats("the three consumers joined", |s| s.consumers.len() == 3);
    let (_, live_maps) = count_fds_and_cursor_maps(producer);
    assert_eq!(live_maps, 3, "one cursor page mapped per live consumer");
    fx.signal(victim, 9);
    fx.wait(a, GUARD).assert_exact(5, "batch 32");
    fx.wait(b, GUARD).assert_exact(5, "batch 64");
    let victim = fx.wait(victim, GUARD);
    assert!(!victim.status.success());
    // Every consumer is gone: the producer holds no cursor mapping and no more fds than it
    // had before any joined (the readiness probe's connection may have closed since).
    wait_until(
        "no cursor map and no fd beyond the baseline",
        Duration::from_secs(30),
        || {
            let (fds, maps) = count_fds_and_cursor_maps(producer);
            if maps == 0 && fds <= baseline.0 {
                Ok(Some(()))
            } else {
                Err(format!("leak: {fds} fds, {maps} cursor maps"))
            }
        },
    );
    let shm: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().contains("ladle"))
                .collect()
        })
        .unwrap_or_default();
    assert!(shm.is_empty(), "named shared memory left behind: {shm:?}");
}

#[test]
fn a_killed_producer_makes_every_consumer_fail_promptly_instead_of_hanging() {
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 48, 40);
    let serve = fx.serve(&data, SERVE);
    let consumers: Vec<usize> = [8, 64]
        .into_iter()
        .map(|b| fx.consume(b, 1000, &[]))
        .collect();
    fx.wait_for_stats("both consumers joined", |s| s.consumers.len() == 2);
    fx.signal(serve, 9);
    for c in consumers {
        let done = fx.wait(c, Duration::from_secs(30));
        assert!(!done.status.success());
        assert!(
            done.stderr.contains("ladle.sock"),
            "the error names the socket: {}",
            done.stderr
        );
    }
}

#[test]
fn sigterm_ends_the_stream_cleanly_and_tells_the_consumers() {
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 48, 40);
    let serve = fx.serve(&data, SERVE);
    let c = fx.consume(16, 1000, &[]);
    fx.wait_for_stats("the consumer joined", |s| s.consumers.len() == 1);
    fx.signal(serve, 15);
    let producer = fx.wait(serve, Duration::from_secs(60));
    assert!(producer.status.success(), "{}", producer.stderr);
    assert!(!fx.socket().exists(), "the socket file is removed");
    let consumer = fx.wait(c, Duration::from_secs(30));
    assert!(!consumer.status.success());
    assert!(consumer.stderr.contains("end"), "{}", consumer.stderr);
}

#[test]
fn garbage_wrong_versions_and_oversize_frames_drop_only_that_connection() {
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 48, 40);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    let mut hostile = Vec::new();
    for payload in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        [&(u32::MAX).to_le_bytes()[..], b"xx"].concat(),
        {
            let hello = br#"{"type":"Hello","version":999,"batch_size":8,"drop_last":false,"name":"x","pid":1}"#;
            [&(hello.len() as u32).to_le_bytes()[..], hello].concat()
        },
        {
            let hello = br#"{"type":"Hello","version":1,"batch_size":100000,"drop_last":false,"name":"x","pid":1}"#;
            [&(hello.len() as u32).to_le_bytes()[..], hello].concat()
        },
    ] {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(&payload).unwrap();
        hostile.push(s);
    }
    // A silent connection that never says Hello does not block anyone either.
    hostile.push(UnixStream::connect(&socket).unwrap());
    let good = fx.consume(32, 2, &[]);
    fx.wait(good, GUARD)
        .assert_exact(2, "consumer beside hostile connections");
}
