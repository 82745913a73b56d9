//! A feed's `Stats` answer (what `ladle top`, `--metrics` and `--record` read), against the
//! real `ladle serve` and `ladle consume` processes: who is connected, who holds the feed back
//! and for how long, let-gos and rejoins, joins and leaves; and that asking for stats is no
//! way in for a joined consumer.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::os::unix::net::UnixStream;
use std::time::Duration;

use ladle_ring::protocol::{
    self, ClientMessage, FeedStats, Hello, PROTOCOL_VERSION, ServerMessage,
};
use ladle_tests::{Fixture, wait_for_stats};

/// Deadlock guard; never a speed assertion.
const GUARD: Duration = Duration::from_secs(120);

fn stats(fx: &Fixture) -> FeedStats {
    protocol::feed_stats(&fx.socket(), Duration::from_secs(10)).unwrap()
}

/// Asks until `ok` holds (a hang guard, not a timing assertion).
fn until(fx: &Fixture, what: &str, ok: impl Fn(&FeedStats) -> bool) -> FeedStats {
    wait_for_stats(&fx.socket(), GUARD, what, ok)
}

#[test]
fn stats_name_who_holds_the_feed_back_and_count_let_gos_rejoins_joins_and_leaves() {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 24, 24);
    let serve = fx.serve(
        &data,
        &[
            "--image-size",
            "16",
            "--ring-mib",
            "1",
            "--threads",
            "2",
            "--stall-timeout",
            "2",
        ],
    );
    let empty = stats(&fx);
    assert_eq!(
        (empty.joins, empty.leaves, empty.consumers.len()),
        (0, 0, 0)
    );
    assert_eq!(empty.dataset_len, 200);
    // A steady consumer, and one that will stop while holding the feed back.
    // (Both paced by a per-batch step, so that they are still there when looked at; the
    // steady one is killed at the end.)
    let steady = fx.consume(16, 100_000, &["--name", "steady", "--step-ms", "2"]);
    let stopped = fx.consume(16, 30, &["--name", "paused", "--step-ms", "2"]);
    let both = until(&fx, "both consumers", |s| {
        s.consumers.len() == 2 && s.consumers.iter().all(|c| c.released > 0)
    });
    // Listed in id order (the two processes may connect in either order), by logged name.
    assert!(both.consumers[0].id < both.consumers[1].id);
    let by_name = |s: &FeedStats, name: &str| {
        s.consumers
            .iter()
            .find(|c| c.name == format!("{name:?}"))
            .cloned()
            .unwrap_or_else(|| panic!("no consumer {name:?} in {s:#?}"))
    };
    assert_eq!(by_name(&both, "steady").batch_size, 16);
    assert_eq!(by_name(&both, "paused").pid, fx.pid(stopped));
    assert_eq!(by_name(&both, "steady").pid, fx.pid(steady));
    assert!(both.occupancy <= both.capacity, "{both:?}");
    fx.signal(stopped, 19); // SIGSTOP
    let held = until(&fx, "the paused consumer holding the feed back", |s| {
        s.consumers
            .iter()
            .any(|c| c.name == "\"paused\"" && c.holding_back_s.is_some_and(|h| h > 0.5))
    });
    assert!(
        held.consumers
            .iter()
            .all(|c| c.name == "\"paused\"" || c.holding_back_s.is_none()),
        "only the paused consumer holds the feed back: {held:#?}"
    );
    let let_go = until(&fx, "a let-go after the 2 s stall timeout", |s| {
        s.let_gos == 1
    });
    let paused = by_name(&let_go, "paused");
    assert!(!paused.attached && paused.lag == 0, "{paused:?}");
    assert!(
        paused.held_back_s >= 1.5,
        "held back until let go: {paused:?}"
    );
    fx.signal(stopped, 18); // SIGCONT: it rejoins and finishes its 30 epochs
    let done = fx.wait(stopped, GUARD);
    done.assert_exact(30, "the paused consumer");
    let after = until(&fx, "the paused consumer gone", |s| s.leaves == 1);
    assert_eq!(after.joins, 2);
    assert_eq!(after.consumers.len(), 1);
    assert!(after.consumers[0].released > by_name(&both, "steady").released);
    let rejoined = done.json_lines();
    assert!(
        rejoined.iter().any(|v| v["rejoins"] == 1),
        "the paused consumer says it rejoined once: {rejoined:?}"
    );
    fx.signal(steady, 9);
    until(&fx, "the steady consumer gone", |s| {
        s.leaves == 2 && s.consumers.is_empty()
    });
    fx.signal(serve, 15);
    fx.wait(serve, GUARD);
}

#[test]
fn a_joined_consumer_that_asks_for_stats_is_let_go_of_and_the_feed_goes_on() {
    let mut fx = Fixture::new();
    let data = fx.dataset(64, 24, 24);
    let serve = fx.serve(&data, &["--image-size", "16", "--ring-mib", "1"]);
    let conn = UnixStream::connect(fx.socket()).unwrap();
    let hello = ClientMessage::Hello(Hello {
        version: PROTOCOL_VERSION,
        batch_size: 8,
        drop_last: false,
        name: "nosy".into(),
        pid: std::process::id(),
        group: None,
    });
    protocol::send(&conn, &hello, &[]).unwrap();
    let (welcome, _fds) = protocol::recv::<ServerMessage>(&conn).unwrap();
    assert!(matches!(welcome, ServerMessage::Welcome(_)));
    until(&fx, "the nosy consumer joined", |s| s.consumers.len() == 1);
    // Stats on a joined connection would interleave with End/Detached frames: refused by
    // closing that connection.
    protocol::send(&conn, &ClientMessage::Stats, &[]).unwrap();
    until(&fx, "the nosy consumer gone", |s| s.leaves == 1);
    // An honest consumer still reads exact epochs.
    let honest = fx.consume(8, 2, &[]);
    fx.wait(honest, GUARD).assert_exact(2, "honest consumer");
    fx.signal(serve, 15);
    fx.wait(serve, GUARD);
}

#[test]
fn stats_of_many_consumers_with_the_longest_hostile_names_still_come_back_in_one_frame() {
    let mut fx = Fixture::new();
    let data = fx.dataset(64, 24, 24);
    let serve = fx.serve(&data, &["--image-size", "16", "--ring-mib", "1"]);
    // 128 control characters, each logged as a 6-byte escape: 80 such names are far more
    // than one 64 KiB frame holds.
    let name = "\u{1}".repeat(128);
    let mut joined = Vec::new();
    for _ in 0..80 {
        let conn = UnixStream::connect(fx.socket()).unwrap();
        let hello = ClientMessage::Hello(Hello {
            version: PROTOCOL_VERSION,
            batch_size: 8,
            drop_last: false,
            name: name.clone(),
            pid: std::process::id(),
            group: None,
        });
        protocol::send(&conn, &hello, &[]).unwrap();
        let (welcome, _fds) = protocol::recv::<ServerMessage>(&conn).unwrap();
        assert!(matches!(welcome, ServerMessage::Welcome(_)));
        joined.push(conn); // the fds go; the connection (the membership) stays
    }
    let s = until(&fx, "all 80 counted", |s| s.joins == 80);
    assert!(
        s.consumers_omitted > 0,
        "the list must have been cut: {}",
        s.consumers.len()
    );
    assert_eq!(s.consumers.len() + s.consumers_omitted as usize, 80);
    assert!(
        s.consumers.iter().all(|c| c.name.len() > 128),
        "names kept whole"
    );
    drop(joined);
    until(&fx, "all 80 gone", |s| {
        s.leaves == 80 && s.consumers.is_empty()
    });
    fx.signal(serve, 15);
    fx.wait(serve, GUARD);
}
