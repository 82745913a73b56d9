//! Pacing: a feed decodes what its consumers will read, a bounded read-ahead beyond what they
//! asked for, not as far as the ring allows (`ladle serve --read-ahead`); a consumer that
//! holds the others back skims, and paces the feed again when the feed no longer outruns it
//! (`ladle serve --pacing`).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use ladle_ring::protocol::ConsumerInfo;
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
    // Lockstep: the slow one is not moved to skimming, so it keeps holding the fast one back.
    small_ring_feed(&mut fx, "lockstep", &[]);
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

/// The consumer named `name` in `stats`, if listed.
fn named(stats: &ladle_ring::protocol::FeedStats, name: &str) -> Option<ConsumerInfo> {
    let logged = format!("{name:?}");
    stats.consumers.iter().find(|c| c.name == logged).cloned()
}

/// A 200-image feed whose ring holds about 80 samples of 64 px, with `pacing`.
fn small_ring_feed(fx: &mut Fixture, pacing: &str, extra: &[&str]) -> usize {
    let data = fx.dataset(200, 24, 20);
    let args = [
        &[
            "--image-size",
            "64",
            "--ring-mib",
            "1",
            "--threads",
            "2",
            "--pacing",
            pacing,
        ][..],
        extra,
    ]
    .concat();
    fx.serve(&data, &args)
}

/// Epochs a killed `ladle consume --json` completed, each asserted exact.
fn exact_epochs_so_far(done: &ladle_tests::Finished, what: &str) -> usize {
    let epochs: Vec<_> = (done.stdout.lines())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("epoch").is_some())
        .collect();
    for e in &epochs {
        assert_eq!(e["exact_coverage"], true, "{what}: {e}");
    }
    epochs.len()
}

/// A slow consumer (batches of 4, 100 ms a batch: 40 samples/s) reads two epochs of 200 beside
/// a fast one that reads as fast as the feed decodes. Returns what each released from when both
/// were reading until the slow one neared its end (their `Stats`), and the slow one's summary;
/// both read exact epochs.
fn fast_beside_slow(pacing: &str) -> (u64, u64, serde_json::Value) {
    let mut fx = Fixture::new();
    small_ring_feed(&mut fx, pacing, &[]);
    let slow = fx.consume(4, 2, &["--name", "slow", "--step-ms", "100"]);
    let fast = fx.consume(8, 100_000, &["--name", "fast"]);
    // Either may join first and read alone for a moment: count from when both read.
    let both = fx.wait_for_stats("both consumers read", |s| {
        named(s, "slow").is_some_and(|c| c.released > 0)
            && named(s, "fast").is_some_and(|c| c.released > 0)
    });
    if pacing == "skim" {
        let stats = fx.wait_for_stats("the slow consumer skims", |s| {
            named(s, "slow").is_some_and(|c| c.skimming && !c.attached)
        });
        let fast_info = named(&stats, "fast").unwrap();
        assert!(fast_info.attached && !fast_info.skimming, "{fast_info:?}");
    }
    let near_end = fx.wait_for_stats("the slow consumer nears its end", |s| {
        named(s, "slow").is_some_and(|c| c.released >= 360)
    });
    let released =
        |name| named(&near_end, name).unwrap().released - named(&both, name).unwrap().released;
    let (slow_released, fast_released) = (released("slow"), released("fast"));
    let done = fx.wait(slow, GUARD);
    done.assert_exact(2, "the slow consumer");
    let summary = done.json_lines().pop().unwrap();
    fx.signal(fast, 9);
    let fast_done = fx.wait(fast, GUARD);
    exact_epochs_so_far(&fast_done, "the fast consumer");
    (slow_released, fast_released, summary)
}

#[test]
fn a_slow_consumer_skims_the_fast_one_goes_its_own_pace_and_both_read_exact_epochs() {
    let (slow_released, fast_released, slow) = fast_beside_slow("skim");
    assert!(slow["skims"].as_u64().unwrap() >= 1, "{slow}");
    // Lockstep holds it within a ring (about 80 samples) of the slow one.
    assert!(
        fast_released >= 1000,
        "the fast consumer read {fast_released} samples while the slow one read {slow_released}"
    );
    // The same pair in lockstep fails the check above: the fast one is held back by the slow
    // one. (Mostly within a ring of it; about one run in three it gets twice as far, 728 and
    // 808 against 356, which is lockstep's own matter, not this check's.)
    let (slow_released, fast_released, slow) = fast_beside_slow("lockstep");
    assert_eq!(slow["skims"].as_u64().unwrap(), 0, "{slow}");
    assert!(
        fast_released < 1000,
        "in lockstep the fast consumer read {fast_released} samples, the slow one \
         {slow_released}: {slow}"
    );
}

#[test]
fn a_skimming_consumer_paces_the_feed_again_when_the_fast_one_leaves_and_stays_exact() {
    let mut fx = Fixture::new();
    small_ring_feed(&mut fx, "skim", &[]);
    // Five epochs at 40 samples/s: 25 s, time for a window or two on a loaded machine.
    let slow = fx.consume(4, 5, &["--name", "slow", "--step-ms", "100"]);
    let fast = fx.consume(8, 100_000, &["--name", "fast"]);
    fx.wait_for_stats("the slow consumer skims", |s| {
        named(s, "slow").is_some_and(|c| c.skimming)
    });
    fx.signal(fast, 9);
    // Nothing passes any more: it attaches again (within about a second) and reads on.
    let stats = fx.wait_for_stats("the slow consumer paces the feed again", |s| {
        named(s, "slow").is_some_and(|c| c.attached && !c.skimming) && named(s, "fast").is_none()
    });
    let slow_info = named(&stats, "slow").unwrap();
    assert!(
        slow_info.skims >= 1 && slow_info.rejoins == 0,
        "{slow_info:?}"
    );
    fx.wait(slow, GUARD).assert_exact(5, "the slow consumer");
}

#[test]
fn a_consumer_let_go_then_moved_to_skimming_and_a_skimmer_overtaken_while_stopped_stay_exact() {
    let mut fx = Fixture::new();
    small_ring_feed(&mut fx, "skim", &["--stall-timeout", "1"]);
    let slow = fx.consume(4, 3, &["--name", "slow", "--step-ms", "100"]);
    let slow_pid = fx.pid(slow);
    fx.wait_for_stats("the slow consumer reads", |s| {
        s.consumers
            .iter()
            .any(|c| c.pid == slow_pid && c.released >= 8)
    });
    // Stopped before anyone else came: let go once the fast one is held back for the stall
    // timeout, taking no batch (not asked to skim: it takes none).
    fx.signal(slow, 19); // SIGSTOP
    let fast = fx.consume(8, 100_000, &["--name", "fast"]);
    let stats = fx.wait_for_stats("the stopped consumer is let go", |s| s.let_gos >= 1);
    let stopped = named(&stats, "slow").unwrap();
    assert!(!stopped.skimming && stopped.skims == 0, "{stopped:?}");
    fx.signal(slow, 18); // SIGCONT: it rejoins, then holds the fast one back, and skims
    let stats = fx.wait_for_stats("the resumed consumer skims", |s| {
        named(s, "slow").is_some_and(|c| c.skimming && c.rejoins >= 1)
    });
    // Stopped while skimming: the feed runs on (no let-go: it gates nothing) and overwrites
    // the slots it was about to read; it must not take a torn or missing sample on resuming.
    let before = named(&stats, "fast").unwrap().released;
    fx.signal(slow, 19);
    let stats = fx.wait_for_stats(
        "the feed runs several rings past the stopped skimmer",
        |s| named(s, "fast").is_some_and(|c| c.released >= before + 5 * s.capacity),
    );
    assert_eq!(stats.let_gos, 1, "a skimmer is never let go");
    fx.signal(slow, 18);
    let done = fx.wait(slow, GUARD);
    done.assert_exact(3, "the consumer let go, then skimming, then overtaken");
    fx.signal(fast, 9);
    let fast_done = fx.wait(fast, GUARD);
    assert!(exact_epochs_so_far(&fast_done, "the fast consumer") >= 1);
}

#[test]
fn a_skimmer_that_speeds_up_paces_the_feed_again_and_every_epoch_stays_exact() {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let mut fx = Fixture::new();
    small_ring_feed(&mut fx, "skim", &[]);
    let fast = fx.consume(8, 100_000, &["--name", "fast"]);
    fx.wait_for_stats("the fast consumer reads", |s| {
        named(s, "fast").is_some_and(|c| c.released > 0)
    });
    let config = ladle_consumer::ConsumerConfig {
        batch_size: 4,
        name: "changing".into(),
        ..Default::default()
    };
    let consumer = ladle_consumer::Consumer::connect(fx.socket(), config).unwrap();
    // In this process: 100 ms a batch (40 samples/s) until told otherwise, then none.
    let step_ms = Arc::new(AtomicU64::new(100));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (step_ms, stop) = (step_ms.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut epochs = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let mut seen = Vec::new();
                for batch in consumer.epoch() {
                    seen.extend_from_slice(batch.unwrap().indices());
                    // The training step this test emulates (its pace, not a wait).
                    std::thread::sleep(Duration::from_millis(step_ms.load(Ordering::SeqCst)));
                }
                epochs.push(seen);
            }
            (epochs, consumer.skims(), consumer.skimming())
        })
    };
    fx.wait_for_stats("the slow consumer skims", |s| {
        named(s, "changing").is_some_and(|c| c.skimming)
    });
    step_ms.store(0, Ordering::SeqCst);
    fx.wait_for_stats(
        "the consumer, now as fast as the feed, paces it again",
        |s| named(s, "changing").is_some_and(|c| c.attached && !c.skimming),
    );
    stop.store(true, Ordering::SeqCst);
    let (epochs, skims, skimming) = reader.join().unwrap();
    assert!(
        skims >= 1 && !skimming,
        "skims {skims}, skimming {skimming}"
    );
    assert!(epochs.len() >= 2, "{} epochs", epochs.len());
    for (k, epoch) in epochs.iter().enumerate() {
        let distinct: HashSet<u64> = epoch.iter().copied().collect();
        assert_eq!(
            (epoch.len(), distinct.len()),
            (200, 200),
            "epoch {k} is not exact"
        );
    }
    fx.signal(fast, 9);
    fx.wait(fast, GUARD);
}

#[test]
fn a_consumer_that_keeps_a_batch_skims_past_it_and_the_fast_one_is_not_held_back() {
    let mut fx = Fixture::new();
    // A stall timeout longer than the test: only skimming can free the feed.
    small_ring_feed(&mut fx, "skim", &["--stall-timeout", "600"]);
    // Keeps each epoch's first batch (an example for logging) while it reads on at 20
    // samples/s (ten seconds an epoch), and checks that no batch changed while it said it was
    // intact.
    let holder = fx.consume(
        4,
        2,
        &[
            "--name",
            "holder",
            "--step-ms",
            "200",
            "--keep-first",
            "--check-held",
        ],
    );
    // Its first batch is a view of the ring, kept before anyone else reads.
    fx.wait_for_stats("the holder took its first batch", |s| {
        named(s, "holder").is_some_and(|c| c.released > 0)
    });
    let fast = fx.consume(8, 100_000, &["--name", "fast"]);
    let stats = fx.wait_for_stats("the holder skims, keeping its batch", |s| {
        named(s, "holder").is_some_and(|c| c.skimming && !c.attached)
    });
    let before = named(&stats, "fast").map_or(0, |c| c.released);
    // Past the batch the holder keeps, several times round the ring.
    let stats = fx.wait_for_stats("the fast consumer reads five rings on", |s| {
        named(s, "fast").is_some_and(|c| c.released >= before + 5 * s.capacity)
    });
    assert_eq!(stats.let_gos, 0, "freed by skimming, not by a let-go");
    // ... while the holder still keeps its first epoch's batch: it had not read that epoch.
    let kept_for = named(&stats, "holder").unwrap().released;
    assert!(kept_for < 200, "the holder had read {kept_for} samples");
    let done = fx.wait(holder, GUARD);
    done.assert_exact(2, "the holder");
    let summary = done.json_lines().pop().unwrap();
    assert_eq!(
        summary["corrupted_batches"], 0,
        "changed while said intact: {summary}"
    );
    assert!(
        summary["overwritten_batches"].as_u64().unwrap() >= 1,
        "the kept batch was overwritten and said so: {summary}"
    );
    assert_eq!(summary["rejoins"], 0, "{summary}");
    fx.signal(fast, 9);
    let fast_done = fx.wait(fast, GUARD);
    exact_epochs_so_far(&fast_done, "the fast consumer");
}

#[test]
fn a_skimmer_beside_a_rank_gets_its_gaps_decoded_and_only_those_and_both_stay_exact() {
    // The fast consumer is rank 0 of a group of 2 whose other rank reads elsewhere: it needs
    // half of each epoch. The slow one skims: since protocol 16 it declares what its epoch
    // still lacks, so positions neither needs pass as holes (before, a skimmer needed every
    // position and there were none), and its epochs still complete, exact.
    let mut fx = Fixture::new();
    small_ring_feed(&mut fx, "skim", &[]);
    let slow = fx.consume(4, 2, &["--name", "slow", "--step-ms", "100"]);
    let rank = fx.consume(
        8,
        100_000,
        &[
            "--name",
            "rank",
            "--group",
            "half",
            "--rank",
            "0",
            "--world-size",
            "2",
            "--local-world-size",
            "1",
        ],
    );
    // Holes from before it skims (the rank may read alone for a moment first) do not count.
    let skims = fx.wait_for_stats("the slow consumer skims", |s| {
        named(s, "slow").is_some_and(|c| c.skimming && !c.attached)
    });
    // Counted while it is still there (once it leaves, the rank alone lets half pass).
    let stats = fx.wait_for_stats("the skimmer in its second epoch", |s| {
        named(s, "slow").is_some_and(|c| c.released >= 300)
    });
    let done = fx.wait(slow, GUARD);
    done.assert_exact(2, "the skimmer");
    assert!(
        stats.holes > skims.holes,
        "no position let pass while it skimmed: the skimmer needed everything ({} holes, {} \
         decoded)",
        stats.holes,
        stats.published
    );
    fx.signal(rank, 9);
    let rank_done = fx.wait(rank, GUARD);
    exact_epochs_so_far(&rank_done, "the rank");
}
