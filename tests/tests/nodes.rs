//! A DDP group over several nodes (protocol 15): each node's feed serves its own ranks,
//! waits for them only, and decodes only their shares; and a group resumed on another number
//! of ranks (a job requeued on fewer nodes). Two `ladle serve` processes of the same
//! data stand for two nodes' feeds (`slurm_cluster.rs` runs it on a real two-node Slurm
//! cluster); the ranks run in this process through the Rust SDK.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use ladle_consumer::{ConnectError, Consumer, ConsumerConfig, Even, GroupSpec, SavedPosition};
use ladle_tests::{Fixture, read_epochs};

const SERVE: &[&str] = &[
    "--transform",
    "Resize(16), CenterCrop(16)",
    "--ring-mib",
    "8",
    "--threads",
    "2",
    "--seed",
    "7",
    "--read-ahead",
    "16",
];
const READ_AHEAD: u64 = 16;
const GUARD: Duration = Duration::from_secs(120);

/// Rank `rank` of `world_size`, `local` of them on its node.
fn rank_config(name: &str, rank: u32, world_size: u32, local: u32) -> ConsumerConfig {
    ConsumerConfig {
        batch_size: 10,
        group: Some(GroupSpec {
            name: name.into(),
            rank,
            world_size,
            even: Even::Pad,
        }),
        local_world_size: Some(local),
        group_timeout: GUARD,
        ..ConsumerConfig::default()
    }
}

fn stats(socket: &Path) -> ladle_ring::protocol::FeedStats {
    ladle_ring::protocol::feed_stats(socket, GUARD).unwrap()
}

#[test]
fn a_group_over_two_nodes_starts_on_each_nodes_ranks_and_each_feed_decodes_its_ranks_shares() {
    let (mut node1, mut node2) = (Fixture::new(), Fixture::new());
    let n = 400u64;
    let data = node1.dataset(n as u32, 24, 20);
    node1.serve(&data, SERVE);
    node2.serve(&data, SERVE);
    let sockets = [node1.socket(), node2.socket()];
    let epochs = 2;
    // Ranks 0 and 1 on the first node, 2 and 3 on the second: no rank waits for another
    // node's (before protocol 15 each waited for all four and failed at the group timeout).
    let shares: Vec<Vec<Vec<u64>>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..4u32)
            .map(|r| {
                let socket = &sockets[(r / 2) as usize];
                s.spawn(move || {
                    let consumer =
                        Consumer::connect(socket, rank_config("two-nodes", r, 4, 2)).unwrap();
                    read_epochs(&consumer, epochs)
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for epoch in 0..epochs {
        let mut all: Vec<u64> = shares.iter().flat_map(|r| r[epoch].clone()).collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..n).collect::<Vec<_>>(),
            "epoch {epoch}: the four shares together are the epoch, each index once"
        );
    }
    let epochs = epochs as u64;
    for (node, socket) in sockets.iter().enumerate() {
        let stats = stats(socket);
        println!(
            "node {node}: {} decoded, {} holes, for {epochs} epochs of {n}",
            stats.published, stats.holes
        );
        // Its two ranks' half of each epoch, the read-ahead past the end, and a quarter epoch
        // for ranks welcomed apart (a rank that starts later reads the next epoch's share of
        // the other further into the feed; on an idle machine they start together).
        assert!(
            stats.published <= epochs * n / 2 + n / 4 + READ_AHEAD,
            "node {node}: {} decoded for {epochs} epochs of {n} shared by 2 of 4 ranks",
            stats.published
        );
        assert!(stats.holes > 0, "node {node}: nothing let pass");
    }
}

#[test]
fn a_rank_given_twice_on_a_node_fails_at_once_naming_local_rank_and_the_one_left_says_who_came() {
    let mut fx = Fixture::new();
    let data = fx.dataset(40, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    // Two processes of this node both say rank 0 of 4, two ranks here (LOCAL_RANK passed
    // as the rank): the one that comes second is refused at once, naming the cause; the
    // first waits for the node's other rank.
    let (done, results) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        for _ in 0..2 {
            let (socket, done) = (&socket, done.clone());
            s.spawn(move || {
                let mut config = rank_config("twice", 0, 4, 2);
                config.group_timeout = Duration::from_secs(10);
                done.send(Consumer::connect(socket, config).unwrap_err())
                    .unwrap();
            });
        }
        let refused = results.recv_timeout(GUARD).unwrap();
        let text = refused.to_string();
        assert!(
            text.contains("already waiting") && text.contains("$LOCAL_RANK"),
            "{text}"
        );
        // While the first waits: more ranks than the node runs, and another world size from
        // the same node, are refused at once too, naming both sides.
        let err = Consumer::connect(&socket, rank_config("twice", 1, 4, 5)).unwrap_err();
        assert!(
            err.to_string().contains("more than the world size 4"),
            "{err}"
        );
        let err = Consumer::connect(&socket, rank_config("twice", 1, 8, 2)).unwrap_err();
        assert!(err.to_string().contains("said world size 4"), "{err}");
        // The first gives up at its timeout, saying which of this node's ranks came.
        match results.recv_timeout(GUARD).unwrap() {
            error @ ConnectError::GroupIncomplete { .. } => {
                let text = error.to_string();
                assert!(
                    text.contains("1 of this node's 2 ranks joined") && text.contains("rank 0;"),
                    "{text}"
                );
                assert!(text.contains("local world size 2 from given"), "{text}");
            }
            other => panic!("expected GroupIncomplete, got {other}"),
        }
    });
}

#[test]
fn a_group_on_one_feed_with_no_local_size_waits_for_every_rank_and_says_how_to_span_nodes() {
    let mut fx = Fixture::new();
    let data = fx.dataset(40, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    // No local world size given, none in this test's environment: every rank on this feed.
    let mut config = rank_config("alone", 1, 2, 2);
    config.local_world_size = None;
    config.group_timeout = Duration::from_secs(1);
    let error = Consumer::connect(&socket, config).unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(&error, ConnectError::GroupIncomplete { missing, .. } if missing == &[0]),
        "{text}"
    );
    assert!(
        text.contains("rank 0 never joined") && text.contains("$LOCAL_WORLD_SIZE"),
        "{text}"
    );
}

/// Reads batches of `consumer`'s epoch until `at_least` samples; returns them and the
/// position after them.
fn read_part(consumer: &Consumer, at_least: usize) -> (Vec<u64>, SavedPosition) {
    let mut got = Vec::new();
    for batch in consumer.epoch() {
        got.extend_from_slice(batch.unwrap().indices());
        if got.len() >= at_least {
            break;
        }
    }
    (got, consumer.position())
}

#[test]
fn a_group_resumed_with_another_world_size_deals_the_rest_of_its_epoch_once() {
    let mut fx = Fixture::new();
    let n = 200u64;
    let data = fx.dataset(n as u32, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    // Four ranks (one node) read part of epoch 0, at different paces, and save.
    let config = |rank, world| {
        let mut c = rank_config("elastic", rank, world, world);
        c.group_timeout = GUARD;
        c
    };
    let saved: Vec<(Vec<u64>, SavedPosition)> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..4u32)
            .map(|r| {
                let socket = &socket;
                s.spawn(move || {
                    let consumer = Consumer::connect(socket, config(r, 4)).unwrap();
                    let part = read_part(&consumer, 10 * (r as usize + 1));
                    consumer.close();
                    part
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let before: BTreeSet<u64> = saved.iter().flat_map(|(got, _)| got.clone()).collect();
    let positions: Vec<SavedPosition> = saved.into_iter().map(|(_, p)| p).collect();
    // Requeued with two ranks: together they deliver every index not delivered yet, once.
    let resume = |world: u32, positions: &[SavedPosition], part: Option<usize>| {
        std::thread::scope(|s| {
            let ranks: Vec<_> = (0..world)
                .map(|r| {
                    let socket = &socket;
                    s.spawn(move || {
                        let consumer = Consumer::connect(socket, config(r, world)).unwrap();
                        consumer.load_group_positions(positions).unwrap();
                        match part {
                            Some(part) => {
                                let (got, position) = read_part(&consumer, part);
                                consumer.close();
                                (got, Some(position), Vec::new())
                            }
                            None => {
                                let rest: Vec<u64> = consumer
                                    .epoch()
                                    .flat_map(|b| b.unwrap().indices().to_vec())
                                    .collect();
                                let next: Vec<u64> = consumer
                                    .epoch()
                                    .flat_map(|b| b.unwrap().indices().to_vec())
                                    .collect();
                                consumer.close();
                                (rest, None, next)
                            }
                        }
                    })
                })
                .collect();
            ranks
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        })
    };
    // First two ranks read part of the rest and are preempted again; then three finish it.
    let two = resume(2, &positions, Some(20));
    let mut delivered: Vec<u64> = before.iter().copied().collect();
    delivered.extend(two.iter().flat_map(|(got, ..)| got.clone()));
    let positions: Vec<SavedPosition> = two.into_iter().map(|(_, p, _)| p.unwrap()).collect();
    assert!(
        positions.iter().all(|p| p.wanted.is_some()),
        "a dealt remainder is saved"
    );
    let three = resume(3, &positions, None);
    delivered.extend(three.iter().flat_map(|(rest, ..)| rest.clone()));
    let distinct: BTreeSet<u64> = delivered.iter().copied().collect();
    assert_eq!(
        distinct.len() as u64,
        n,
        "every index of the epoch delivered"
    );
    // No index twice, except `pad`'s repeats that even the counts (at most a rank's worth
    // per deal: 4 ranks, then 2, then 3).
    assert!(
        delivered.len() as u64 <= n + 3 + 1 + 2,
        "{} delivered for an epoch of {n}",
        delivered.len()
    );
    let counts: Vec<usize> = three.iter().map(|(rest, ..)| rest.len()).collect();
    assert!(
        counts.windows(2).all(|w| w[0] == w[1]),
        "equal shares: {counts:?}"
    );
    // The epoch after is the three ranks' deal: each index once over them (n = 200 is not a
    // multiple of 3: pad repeats one).
    let mut next: Vec<u64> = three.iter().flat_map(|(.., next)| next.clone()).collect();
    next.sort_unstable();
    next.dedup();
    assert_eq!(next, (0..n).collect::<Vec<_>>());
}
