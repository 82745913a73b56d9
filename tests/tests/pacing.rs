//! Pacing: a feed decodes what its consumers will read, a bounded read-ahead beyond what they
//! asked for, not as far as the ring allows (`ladle serve --read-ahead`).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use ladle_tests::Fixture;

const GUARD: Duration = Duration::from_secs(120);
const BATCH: u64 = 8;

/// Serves a 200-image set with `read_ahead`, runs a slow consumer (batches of 8, 50 ms per
/// batch) and returns the largest lag (published samples it has not released) seen over 30
/// `Stats` answers once it has read three batches, and the samples published in all when it
/// finished its epoch.
fn slow_consumer_lag(read_ahead: &str) -> (u64, u64) {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 24, 20);
    fx.serve(
        &data,
        &[
            "--read-ahead",
            read_ahead,
            "--image-size",
            "16",
            "--ring-mib",
            "8",
            "--threads",
            "2",
        ],
    );
    let consumer = fx.consume(BATCH as u32, 1, &["--step-ms", "50"]);
    fx.wait_for_stats("the consumer read three batches", |s| {
        s.consumers.first().is_some_and(|c| c.released >= 3 * BATCH)
    });
    let mut worst = 0;
    for _ in 0..30 {
        let stats = fx.wait_for_stats("stats", |_| true);
        if let Some(c) = stats.consumers.first() {
            worst = worst.max(c.lag);
        }
    }
    fx.wait(consumer, GUARD)
        .assert_exact(1, "the slow consumer");
    let published = fx.wait_for_stats("stats", |_| true).published;
    (worst, published)
}

#[test]
fn a_feed_decodes_at_most_its_read_ahead_beyond_what_a_slow_consumer_asked_for() {
    let read_ahead = 24;
    let (lag, published) = slow_consumer_lag(&read_ahead.to_string());
    // The consumer asks for one batch past its cursor (it holds one at a time), so the head
    // stays within a batch and the read-ahead of it.
    assert!(
        lag <= BATCH + read_ahead,
        "lag {lag} past a batch and the read-ahead"
    );
    assert!(
        published <= 200 + BATCH + read_ahead,
        "decoded {published} for an epoch of 200"
    );
    // The same consumer with the old behaviour: the feed runs a ring ahead.
    let (lag, published) = slow_consumer_lag("ring");
    assert!(lag > 200, "lag {lag} with the ring as the read-ahead");
    assert!(
        published > 1000,
        "decoded {published} with the ring as the read-ahead"
    );
}

#[test]
fn a_bad_read_ahead_is_refused_naming_the_option() {
    let mut fx = Fixture::new();
    let data = fx.dataset(10, 24, 20);
    for bad in ["0", "many", "-3"] {
        let arg = format!("--read-ahead={bad}");
        let done = fx.run(&["serve", "--dataset", data.to_str().unwrap(), &arg], GUARD);
        assert!(!done.status.success());
        assert!(done.stderr.contains("read-ahead"), "{}", done.stderr);
    }
}

#[test]
fn stats_show_the_slow_consumer_holding_the_feed_back_and_the_fast_one_waiting_for_data() {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 24, 20);
    // A ring of about 80 samples of 64 px: the fast consumer cannot run far ahead.
    fx.serve(
        &data,
        &["--image-size", "64", "--ring-mib", "1", "--threads", "2"],
    );
    fx.consume(8, 1000, &["--name", "slow", "--step-ms", "40"]);
    fx.consume(8, 1000, &["--name", "fast"]);
    let by_name = |s: &ladle_ring::protocol::FeedStats, name: &str| {
        s.consumers
            .iter()
            .find(|c| c.name == format!("{name:?}"))
            .cloned()
    };
    let stats = fx.wait_for_stats("the fast consumer waited a second for data", |s| {
        by_name(s, "fast").is_some_and(|c| c.waited_s >= 1.0)
            && by_name(s, "slow").is_some_and(|c| c.held_back_s >= 0.5)
    });
    let (slow, fast) = (
        by_name(&stats, "slow").unwrap(),
        by_name(&stats, "fast").unwrap(),
    );
    // The slow one spends its time in its step, not waiting; the fast one waits on it.
    assert!(
        slow.waited_s < fast.waited_s / 2.0,
        "slow waited {} s, fast {} s",
        slow.waited_s,
        fast.waited_s
    );
}
