//! How a rank of a group ends, against a real `ladle serve`: dropped in the middle of an
//! epoch (what an exception, `sys.exit` or Ctrl-C does to a Python training loop) it breaks
//! its group; dropped at an epoch's end, or after `close()`, it leaves cleanly; restarted at
//! once after its old incarnation went, it is admitted, never refused as "already running".

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use ladle_consumer::{Consumer, ConsumerConfig, ConsumerError, Even, GroupSpec};
use ladle_tests::Fixture;

const SERVE: &[&str] = &[
    "--transform",
    "Resize(16), CenterCrop(16)",
    "--ring-mib",
    "8",
    "--threads",
    "2",
];

const GUARD: Duration = Duration::from_secs(120);

fn rank(rank: u32, world_size: u32) -> ConsumerConfig {
    ConsumerConfig {
        batch_size: 5,
        group: Some(GroupSpec {
            name: "job".into(),
            rank,
            world_size,
            even: Even::Pad,
        }),
        group_timeout: GUARD,
        ..ConsumerConfig::default()
    }
}

/// Both ranks of a group of two, connected at once (each waits for the other).
fn pair(socket: &std::path::Path) -> (Consumer, Consumer) {
    let other = {
        let socket = socket.to_owned();
        std::thread::spawn(move || Consumer::connect(&socket, rank(1, 2)).unwrap())
    };
    let first = Consumer::connect(socket, rank(0, 2)).unwrap();
    (first, other.join().unwrap())
}

/// Reads the rest of `consumer`'s current epoch (or a new one); the first error, if any.
fn finish_epoch(consumer: &Consumer) -> Option<ConsumerError> {
    for batch in consumer.epoch() {
        if let Err(e) = batch {
            return Some(e);
        }
    }
    None
}

/// Waits until the producer has read the end of `leaves` consumers in all (it tells a
/// broken group's other ranks before it counts the leave).
fn wait_for_leaves(fx: &Fixture, leaves: u64) {
    fx.wait_for_stats("the rank's end read by the producer", |s| {
        s.leaves >= leaves
    });
}

#[test]
fn a_rank_dropped_mid_epoch_breaks_its_group_and_one_that_ends_or_closes_does_not() {
    let mut fx = Fixture::new();
    let data = fx.dataset(40, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();

    // Dropped mid-epoch, as an exception unwinding a training loop drops it.
    let (survivor, dropped) = pair(&socket);
    drop(dropped.epoch().next().unwrap().unwrap());
    drop(dropped);
    wait_for_leaves(&fx, 1);
    let error = (0..3).find_map(|_| finish_epoch(&survivor));
    match error {
        Some(ConsumerError::GroupBroken { rank: 1, group, .. }) => assert_eq!(group, "job"),
        other => panic!("expected GroupBroken from rank 1, got {other:?}"),
    }
    drop(survivor);
    wait_for_leaves(&fx, 2);

    // Dropped at the end of an epoch: done, not broken; the other reads on.
    let (survivor, ended) = pair(&socket);
    assert!(finish_epoch(&ended).is_none());
    drop(ended);
    wait_for_leaves(&fx, 3);
    for epoch in 0..2 {
        let error = finish_epoch(&survivor);
        assert!(error.is_none(), "epoch {epoch}: {error:?}");
    }
    drop(survivor);
    wait_for_leaves(&fx, 4);

    // Closed mid-epoch on purpose: done, not broken.
    let (survivor, closed) = pair(&socket);
    drop(closed.epoch().next().unwrap().unwrap());
    closed.close();
    drop(closed);
    wait_for_leaves(&fx, 5);
    for epoch in 0..2 {
        let error = finish_epoch(&survivor);
        assert!(error.is_none(), "epoch {epoch}: {error:?}");
    }
}

#[test]
fn a_rank_restarted_at_once_after_its_old_incarnation_went_is_admitted_every_time() {
    let mut fx = Fixture::new();
    let data = fx.dataset(400, 160, 120);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    // Each incarnation hangs up mid-epoch and the next says Hello at once, in eight jobs at
    // the same time beside a feed decoding flat out: the producer has often not read the old
    // one's end when the new one's Hello comes, and refused it as "already running" (1 in
    // 20 restarts with torchrun's `--max-restarts`).
    std::thread::scope(|scope| {
        for job in 0..8 {
            let socket = &socket;
            scope.spawn(move || {
                for incarnation in 0..20 {
                    let config = ConsumerConfig {
                        group: Some(GroupSpec {
                            name: format!("job{job}"),
                            rank: 0,
                            world_size: 1,
                            even: Even::Pad,
                        }),
                        ..rank(0, 1)
                    };
                    let consumer = Consumer::connect(socket, config)
                        .unwrap_or_else(|e| panic!("job {job}, incarnation {incarnation}: {e}"));
                    drop(consumer.epoch().next().unwrap().unwrap());
                }
            });
        }
    });
}
