//! Consumer groups (the ranks of a DDP job split each epoch) and resumed positions, against
//! real `ladle serve` processes: ranks and resumed consumers run in this process through the
//! Rust SDK, or as `ladle consume` children where one must be killed.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use ladle_consumer::{
    ConnectError, Consumer, ConsumerConfig, ConsumerError, Even, GroupSpec, ResumeError,
    SavedPosition,
};
use ladle_tests::{Fixture, read_epochs};

/// A deterministic transform: the image of an index is the same in every producer epoch and
/// every producer, so a resumed consumer's samples can be checked against a reference.
const SERVE: &[&str] = &[
    "--transform",
    "Resize(16), CenterCrop(16)",
    "--ring-mib",
    "8",
    "--threads",
    "2",
    "--seed",
    "7",
];

const GUARD: Duration = Duration::from_secs(120);

fn config(batch_size: u32, group: Option<GroupSpec>) -> ConsumerConfig {
    ConsumerConfig {
        batch_size,
        group,
        group_timeout: GUARD,
        ..ConsumerConfig::default()
    }
}

fn rank(name: &str, rank: u32, world_size: u32, even: Even) -> Option<GroupSpec> {
    Some(GroupSpec {
        name: name.into(),
        rank,
        world_size,
        even,
    })
}

/// Every sample's image and label, by index, as a whole-epoch consumer reads them.
fn reference(socket: &Path) -> HashMap<u64, (Vec<u8>, i64)> {
    let consumer = Consumer::connect(socket, config(25, None)).unwrap();
    let mut samples = HashMap::new();
    for batch in consumer.epoch() {
        let batch = batch.unwrap();
        let per = batch.images().len() / batch.len();
        for (k, &index) in batch.indices().iter().enumerate() {
            let image = batch.images()[k * per..(k + 1) * per].to_vec();
            samples.insert(index, (image, batch.labels()[k]));
        }
    }
    samples
}

/// Checks that `consumer`'s next epoch delivers exactly `expected` (a set of indices, each
/// once), every sample as `reference` has it.
fn assert_epoch_is(
    consumer: &Consumer,
    expected: &[u64],
    reference: &HashMap<u64, (Vec<u8>, i64)>,
    what: &str,
) {
    let mut got = Vec::new();
    for batch in consumer.epoch() {
        let batch = batch.unwrap();
        let per = batch.images().len() / batch.len();
        for (k, &index) in batch.indices().iter().enumerate() {
            let (image, label) = &reference[&index];
            assert_eq!(batch.labels()[k], *label, "{what}: label of index {index}");
            assert!(
                batch.images()[k * per..(k + 1) * per] == image[..],
                "{what}: image of index {index} differs from the reference"
            );
            got.push(index);
        }
    }
    got.sort_unstable();
    let mut want = expected.to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "{what}");
}

/// Runs `world` ranks (threads) of group `name` with `batch` beside a whole-epoch consumer,
/// `epochs` epochs each; checks the split of every epoch.
fn check_group(socket: &Path, n: u64, world: u32, batch: u32, even: Even, name: &str) {
    let epochs = 3;
    let whole = std::thread::scope(|s| {
        let whole = s.spawn(|| {
            read_epochs(
                &Consumer::connect(socket, config(32, None)).unwrap(),
                epochs,
            )
        });
        let ranks: Vec<_> = (0..world)
            .map(|r| {
                s.spawn(move || {
                    let consumer =
                        Consumer::connect(socket, config(batch, rank(name, r, world, even)))
                            .unwrap();
                    read_epochs(&consumer, epochs)
                })
            })
            .collect();
        let ranks: Vec<Vec<Vec<u64>>> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        for epoch in 0..epochs {
            let share = match even {
                Even::Pad => n.div_ceil(u64::from(world)),
                Even::Drop => n / u64::from(world),
            };
            let mut count: BTreeMap<u64, u64> = BTreeMap::new();
            for (r, rank) in ranks.iter().enumerate() {
                let indices = &rank[epoch];
                assert_eq!(
                    indices.len() as u64,
                    share,
                    "rank {r} epoch {epoch}: its share"
                );
                let mut own = indices.clone();
                own.sort_unstable();
                own.dedup();
                assert_eq!(
                    own.len(),
                    indices.len(),
                    "rank {r} epoch {epoch}: an index twice"
                );
                for &i in indices {
                    *count.entry(i).or_default() += 1;
                }
            }
            let total = share * u64::from(world);
            match even {
                Even::Pad => {
                    assert_eq!(
                        count.len() as u64,
                        n,
                        "epoch {epoch}: the union is the epoch"
                    );
                    let repeats: u64 = count.values().map(|c| c - 1).sum();
                    assert_eq!(
                        repeats,
                        total - n,
                        "epoch {epoch}: repeats beyond the padding"
                    );
                }
                Even::Drop => {
                    assert!(
                        count.values().all(|&c| c == 1),
                        "epoch {epoch}: shares overlap"
                    );
                    assert_eq!(count.len() as u64, total);
                    assert!(count.keys().all(|&i| i < n));
                }
            }
            // The shares are reshuffled from one epoch to the next.
            if epoch > 0 {
                assert_ne!(
                    ranks[0][epoch - 1],
                    ranks[0][epoch],
                    "rank 0 got the same share twice"
                );
            }
        }
        whole.join().unwrap()
    });
    for (epoch, indices) in whole.iter().enumerate() {
        let mut sorted = indices.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..n).collect::<Vec<_>>(),
            "whole consumer, epoch {epoch}"
        );
    }
}

#[test]
fn two_and_three_ranks_split_every_epoch_beside_a_whole_consumer_that_stays_exact() {
    let mut fx = Fixture::new();
    let n = 101;
    let data = fx.dataset(n as u32, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    check_group(&socket, n, 2, 32, Even::Pad, "job-2");
    check_group(&socket, n, 3, 50, Even::Pad, "job-3");
    check_group(&socket, n, 3, 16, Even::Drop, "job-3-drop");
}

#[test]
fn a_group_missing_a_rank_fails_at_its_deadline_naming_the_rank() {
    let mut fx = Fixture::new();
    let data = fx.dataset(20, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    let errors: Vec<ConnectError> = std::thread::scope(|s| {
        let handles: Vec<_> = [0u32, 2]
            .into_iter()
            .map(|r| {
                let socket = &socket;
                s.spawn(move || {
                    let mut config = config(4, rank("short", r, 3, Even::Pad));
                    config.group_timeout = Duration::from_secs(1);
                    Consumer::connect(socket, config).unwrap_err()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for error in errors {
        match &error {
            ConnectError::GroupIncomplete { missing, group, .. } => {
                assert_eq!((missing.as_slice(), group.as_str()), (&[1][..], "short"));
            }
            other => panic!("expected GroupIncomplete, got {other}"),
        }
        let text = error.to_string();
        assert!(text.contains("rank 1 never joined"), "{text}");
    }
    // A rank out of range, and more ranks than samples, are refused at once with reasons.
    let err = Consumer::connect(&socket, config(4, rank("bad", 3, 3, Even::Pad))).unwrap_err();
    assert!(err.to_string().contains("rank 3"), "{err}");
    let err = Consumer::connect(&socket, config(4, rank("wide", 0, 21, Even::Pad))).unwrap_err();
    assert!(
        err.to_string()
            .contains("21 ranks cannot split a dataset of 20 samples"),
        "{err}"
    );
    // Two rank 0s at once: whichever comes second is refused while the first waits; the
    // first is welcomed once rank 1 joins.
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let (tx, socket) = (tx.clone(), &socket);
            s.spawn(move || {
                let result = Consumer::connect(socket, config(4, rank("dup", 0, 2, Even::Pad)));
                tx.send(result.map(drop)).unwrap();
            });
        }
        match rx.recv().unwrap() {
            Err(ConnectError::Rejected { reason, .. }) => {
                assert!(
                    reason.contains("\"dup\": rank 0 is already waiting"),
                    "{reason}"
                );
            }
            other => panic!("expected the second rank 0 refused, got {other:?}"),
        }
        let _one = Consumer::connect(&socket, config(4, rank("dup", 1, 2, Even::Pad))).unwrap();
        rx.recv().unwrap().unwrap();
    });
}

#[test]
fn a_rank_killed_gives_the_other_ranks_group_broken_promptly() {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    let killed = fx.consume(
        8,
        1000,
        &[
            "--group",
            "ddp",
            "--rank",
            "1",
            "--world-size",
            "3",
            "--step-ms",
            "20",
        ],
    );
    let (survivor, elapsed) = std::thread::scope(|s| {
        let other = s.spawn(|| {
            let c = Consumer::connect(&socket, config(8, rank("ddp", 2, 3, Even::Pad))).unwrap();
            read_until_broken(&c)
        });
        let me = Consumer::connect(&socket, config(8, rank("ddp", 0, 3, Even::Pad))).unwrap();
        // Read a few batches, then kill rank 1 and time how long until this rank hears.
        let mut read = 0;
        'epochs: loop {
            for batch in me.epoch() {
                batch.unwrap();
                read += 1;
                if read == 5 {
                    break 'epochs;
                }
            }
        }
        // All three ranks are welcomed (a rank killed while another is still being
        // welcomed breaks the group before it starts, for that one).
        fx.wait_for_stats("all three ranks joined", |s| s.consumers.len() == 3);
        fx.signal(killed, 9);
        let killed_at = Instant::now();
        let (error, at) = read_until_broken(&me);
        (other.join().unwrap(), (error, at - killed_at))
    });
    let (error, waited) = elapsed;
    for error in [&survivor.0, &error] {
        match error {
            ConsumerError::GroupBroken { group, rank, .. } => {
                assert_eq!((group.as_str(), rank), ("ddp", &1));
            }
            other => panic!("expected GroupBroken, got {other}"),
        }
    }
    eprintln!("rank 0 heard that rank 1 was killed after {waited:?}");
    assert!(
        waited < Duration::from_secs(10),
        "GroupBroken took {waited:?}"
    );
}

/// Reads (batch after batch, epoch after epoch) until an error, which it returns with the
/// time it came.
fn read_until_broken(consumer: &Consumer) -> (ConsumerError, Instant) {
    let deadline = Instant::now() + GUARD;
    loop {
        for batch in consumer.epoch() {
            match batch {
                Ok(b) => drop(b),
                Err(e) => return (e, Instant::now()),
            }
            assert!(Instant::now() < deadline, "no GroupBroken within {GUARD:?}");
        }
    }
}

/// Reads `batches` batches of `consumer`'s first epoch; returns their indices and the
/// consumer's position, encoded, taken right after.
fn read_part(consumer: &Consumer, batches: usize) -> (Vec<u64>, Vec<u8>) {
    let mut indices = Vec::new();
    let mut epoch = consumer.epoch();
    for _ in 0..batches {
        indices.extend_from_slice(epoch.next().unwrap().unwrap().indices());
    }
    (indices, consumer.position().encode())
}

#[test]
fn a_resumed_consumer_delivers_exactly_the_rest_of_its_epoch_then_whole_epochs() {
    let mut fx = Fixture::new();
    let n = 100u64;
    let data = fx.dataset(n as u32, 24, 20);
    let serve = fx.serve(&data, SERVE);
    let socket = fx.socket();
    let reference = reference(&socket);
    let all: Vec<u64> = (0..n).collect();

    // 40% of an epoch, then the process's consumer goes (its position saved as bytes).
    let (first, saved) = read_part(&Consumer::connect(&socket, config(10, None)).unwrap(), 4);
    assert_eq!(first.len(), 40);
    let rest: Vec<u64> = all.iter().copied().filter(|i| !first.contains(i)).collect();
    let position = SavedPosition::decode(&saved).unwrap();
    assert_eq!((position.epoch, position.delivered.count()), (0, 40));

    // Against the same producer.
    let resumed = Consumer::connect(&socket, config(10, None)).unwrap();
    resumed.load_position(&position).unwrap();
    assert_epoch_is(&resumed, &rest, &reference, "resumed epoch, same producer");
    assert_epoch_is(&resumed, &all, &reference, "the epoch after");
    assert_eq!(resumed.epoch_number(), 2);
    drop(resumed);

    // Against a restarted producer of the same feed.
    fx.signal(serve, 15);
    fx.wait(serve, GUARD);
    let serve = fx.serve(&data, SERVE);
    let resumed = Consumer::connect(&socket, config(7, None)).unwrap();
    resumed.load_position(&position).unwrap();
    assert_epoch_is(
        &resumed,
        &rest,
        &reference,
        "resumed epoch, restarted producer",
    );
    assert_epoch_is(
        &resumed,
        &all,
        &reference,
        "the epoch after, restarted producer",
    );
    // Once an epoch has begun, a position is refused.
    assert!(matches!(
        resumed.load_position(&position),
        Err(ResumeError::AlreadyStarted { .. })
    ));
    drop(resumed);

    // Against a producer of another seed: refused, naming the seed.
    fx.signal(serve, 15);
    fx.wait(serve, GUARD);
    let other: Vec<&str> = SERVE
        .iter()
        .map(|a| if *a == "7" { "8" } else { a })
        .collect();
    fx.serve(&data, &other);
    let consumer = Consumer::connect(&socket, config(10, None)).unwrap();
    let err = consumer.load_position(&position).unwrap_err();
    assert!(err.to_string().contains("seed"), "{err}");
    // A rank's position is refused by a consumer of whole epochs.
    let err = consumer
        .load_position(&SavedPosition {
            group: rank("job", 0, 2, Even::Pad),
            ..consumer.position()
        })
        .unwrap_err();
    assert!(matches!(err, ResumeError::OtherGroup { .. }), "{err}");
}

#[test]
fn a_group_restarted_as_a_whole_from_its_ranks_positions_finishes_the_epoch_exactly() {
    let mut fx = Fixture::new();
    let n = 61u64;
    let data = fx.dataset(n as u32, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    let world = 2;
    // First incarnation: each rank reads 2 batches of 8 (16 of its 31), saves, and the job
    // goes as a whole (a preemption): dropped mid-epoch, a rank breaks its group, so no rank
    // goes before every rank has saved.
    let saved = std::sync::Barrier::new(world as usize);
    let first: Vec<(Vec<u64>, Vec<u8>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (socket, saved) = (&socket, &saved);
                s.spawn(move || {
                    let c = Consumer::connect(socket, config(8, rank("job", r, world, Even::Pad)))
                        .unwrap();
                    let part = read_part(&c, 2);
                    saved.wait();
                    part
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The producer has seen the first incarnation go (its ranks' numbers are free again: a
    // rank still running refuses a second of the same number).
    fx.wait_for_stats("the first incarnation left", |s| s.consumers.is_empty());
    // Second incarnation: each rank loads its own position and finishes the epoch.
    let second: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (socket, saved) = (&socket, &first[r as usize].1);
                s.spawn(move || {
                    let c = Consumer::connect(socket, config(8, rank("job", r, world, Even::Pad)))
                        .unwrap();
                    c.load_position(&SavedPosition::decode(saved).unwrap())
                        .unwrap();
                    read_epochs(&c, 1).remove(0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let share = n.div_ceil(u64::from(world));
    let mut count: BTreeMap<u64, u64> = BTreeMap::new();
    for r in 0..world as usize {
        let mine: Vec<u64> = first[r].0.iter().chain(&second[r]).copied().collect();
        assert_eq!(
            mine.len() as u64,
            share,
            "rank {r}: its share over both incarnations"
        );
        let mut sorted = mine.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), mine.len(), "rank {r}: an index twice");
        for i in mine {
            *count.entry(i).or_default() += 1;
        }
    }
    assert_eq!(count.len() as u64, n, "the union is the epoch");
    let repeats: u64 = count.values().map(|c| c - 1).sum();
    assert_eq!(
        repeats,
        share * u64::from(world) - n,
        "repeats beyond the padding"
    );
}

#[test]
fn a_consumer_killed_mid_epoch_resumes_from_the_position_it_saved_and_finishes_the_epoch() {
    let mut fx = Fixture::new();
    let n = 100u64;
    let data = fx.dataset(n as u32, 24, 20);
    fx.serve(&data, SERVE);
    let saved = fx.path().join("position.bin");
    let saved_arg = saved.to_str().unwrap().to_owned();
    let first = fx.consume(10, 1, &["--step-ms", "100", "--save-position", &saved_arg]);
    // Wait until the saved position holds at least 40 samples, then kill the process.
    let delivered = ladle_tests::wait_until("a position with 40 samples delivered", GUARD, || {
        Ok(std::fs::read(&saved)
            .ok()
            .and_then(|bytes| SavedPosition::decode(&bytes).ok())
            .filter(|p| p.delivered.count() >= 40)
            .map(|p| p.delivered.count()))
    });
    fx.signal(first, 9);
    fx.wait(first, GUARD);
    // The file is whole (written beside and renamed), whatever moment the kill came.
    let position = SavedPosition::decode(&std::fs::read(&saved).unwrap()).unwrap();
    assert!(position.delivered.count() >= delivered && position.delivered.count() < n);
    let resumed = fx.consume(10, 2, &["--resume", &saved_arg]);
    let epochs = fx
        .wait(resumed, GUARD)
        .assert_exact(2, "the resumed consumer");
    assert_eq!(
        epochs[0]["samples"],
        n - position.delivered.count(),
        "the rest of the epoch"
    );
    assert_eq!(epochs[1]["samples"], n, "then a whole epoch");
}

#[test]
fn a_position_resumes_on_the_same_data_anywhere_and_is_refused_on_other_data_at_its_path() {
    let mut fx = Fixture::new();
    let n = 60u64;
    let data = fx.dataset(n as u32, 24, 20);
    let serve = fx.serve(&data, SERVE);
    let socket = fx.socket();
    let reference = reference(&socket);
    let all: Vec<u64> = (0..n).collect();
    let (first, saved) = read_part(&Consumer::connect(&socket, config(10, None)).unwrap(), 3);
    let rest: Vec<u64> = all.iter().copied().filter(|i| !first.contains(i)).collect();
    let position = SavedPosition::decode(&saved).unwrap();
    fx.signal(serve, 15);
    fx.wait(serve, GUARD);
    let restart = |fx: &mut Fixture, path: &Path, serve: usize| {
        fx.signal(serve, 15);
        fx.wait(serve, GUARD);
        fx.serve(path, SERVE)
    };

    // A copy staged elsewhere, as a requeued job stages its data under $TMPDIR, named with a
    // trailing slash: the same data, so the same feed. It used to be refused for its path.
    let staged = fx.path().join("staged");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&data)
        .arg(&staged)
        .status()
        .unwrap();
    assert!(copied.success());
    let mut spelled = staged.into_os_string();
    spelled.push("/");
    let serve = fx.serve(Path::new(&spelled), SERVE);
    let resumed = Consumer::connect(&socket, config(10, None)).unwrap();
    resumed.load_position(&position).unwrap();
    assert_epoch_is(&resumed, &rest, &reference, "resumed on a staged copy");
    drop(resumed);

    // Through a symbolic link to it.
    let link = fx.path().join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let serve = restart(&mut fx, &link, serve);
    let resumed = Consumer::connect(&socket, config(10, None)).unwrap();
    resumed.load_position(&position).unwrap();
    drop(resumed);

    // One file renamed within its class: its index moves and every index after it with it.
    // It used to resume, delivering some files twice and others never.
    let class = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .min()
        .unwrap();
    let file = std::fs::read_dir(&class)
        .unwrap()
        .map(|e| e.unwrap().path())
        .min()
        .unwrap();
    let renamed = class.join("zzz-renamed.jpg");
    std::fs::rename(&file, &renamed).unwrap();
    let serve = restart(&mut fx, &data, serve);
    let consumer = Consumer::connect(&socket, config(10, None)).unwrap();
    let err = consumer.load_position(&position).unwrap_err().to_string();
    assert!(
        err.contains("sample files") && err.contains("renamed"),
        "{err}"
    );
    drop(consumer);
    std::fs::rename(&renamed, &file).unwrap();

    // Other data of the same names and count moved into the saved path: refused, naming the
    // sizes. It used to be accepted, being at the same path.
    let out = data.to_str().unwrap();
    let generated = fx.run(
        &[
            "dataset",
            "generate",
            "--format",
            "imagefolder",
            "--count",
            "60",
            "--width",
            "30",
            "--height",
            "22",
            "--out",
            out,
            "--force",
        ],
        GUARD,
    );
    assert!(generated.status.success(), "{}", generated.stderr);
    restart(&mut fx, &data, serve);
    let consumer = Consumer::connect(&socket, config(10, None)).unwrap();
    let err = consumer.load_position(&position).unwrap_err().to_string();
    assert!(
        err.contains("sample sizes") && err.contains("rewritten"),
        "{err}"
    );
}

// How a rank of a group ends: dropped in the middle of an epoch (what an exception,
// `sys.exit` or Ctrl-C does to a Python training loop) it breaks its group; dropped at an
// epoch's end, or after `close()`, it leaves cleanly; restarted at once after its old
// incarnation went, it is admitted, never refused as "already running".

/// Both ranks of a group of two, connected at once (each waits for the other).
fn pair(socket: &std::path::Path) -> (Consumer, Consumer) {
    let ranked = |r| config(5, rank("job", r, 2, Even::Pad));
    let other = {
        let (socket, config) = (socket.to_owned(), ranked(1));
        std::thread::spawn(move || Consumer::connect(&socket, config).unwrap())
    };
    let first = Consumer::connect(socket, ranked(0)).unwrap();
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
                    let config = config(5, rank(&format!("job{job}"), 0, 1, Even::Pad));
                    let consumer = Consumer::connect(socket, config)
                        .unwrap_or_else(|e| panic!("job {job}, incarnation {incarnation}: {e}"));
                    drop(consumer.epoch().next().unwrap().unwrap());
                }
            });
        }
    });
}

#[test]
fn a_rank_restarted_while_a_forked_child_holds_its_old_descriptor_is_admitted_at_once() {
    // The cause of the test above's rare failure in CI: another test's thread forked a
    // child, which held a copy of every descriptor of this process (the old incarnation's
    // socket too) until its `exec`, so closing the socket did not hang up. Here the child
    // waits before its `exec` until the new incarnation has been answered.
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    let old = Consumer::connect(&socket, config(5, rank("job", 0, 1, Even::Pad))).unwrap();
    drop(old.epoch().next().unwrap().unwrap());
    let (mut forked, ready) = UnixStream::pair().unwrap();
    let (mut go, wait) = UnixStream::pair().unwrap();
    let mut command = std::process::Command::new("true");
    // SAFETY: the closure only writes and reads a socket (plain system calls) in the child.
    unsafe {
        command.pre_exec(move || {
            (&ready).write_all(b"f")?;
            (&wait).read_exact(&mut [0])?;
            Ok(())
        });
    }
    // `spawn` returns once the child has called `exec`: from another thread.
    let holder = std::thread::spawn(move || command.spawn().unwrap().wait().unwrap());
    forked.read_exact(&mut [0]).unwrap();
    drop(old); // mid-epoch: hangs up without `Leave`, while the child holds its descriptor
    let new = Consumer::connect(&socket, config(5, rank("job", 0, 1, Even::Pad)));
    go.write_all(b"g").unwrap();
    assert!(holder.join().unwrap().success());
    let new = new.unwrap_or_else(|e| panic!("the new incarnation was refused: {e}"));
    drop(new.epoch().next().unwrap().unwrap());
}

/// The feed's samples decoded so far (its `Stats`: holes are not counted).
fn decoded(socket: &Path) -> ladle_ring::protocol::FeedStats {
    ladle_ring::protocol::feed_stats(socket, GUARD).unwrap()
}

#[test]
fn a_consumer_resumed_alone_decodes_its_remainder_not_an_epoch() {
    let mut fx = Fixture::new();
    let n = 400u64;
    let data = fx.dataset(n as u32, 24, 20);
    let read_ahead: u64 = 16;
    let serve_args: Vec<&str> = SERVE
        .iter()
        .copied()
        .chain(["--read-ahead", "16"])
        .collect();
    let mut serving = fx.serve(&data, &serve_args);
    let socket = fx.socket();
    let reference = reference(&socket);
    let all: Vec<u64> = (0..n).collect();
    for (batches, what) in [(36usize, "a tenth left"), (20, "half left")] {
        // Read part of an epoch, then the consumer goes with its position.
        let (first, saved) = read_part(
            &Consumer::connect(&socket, config(10, None)).unwrap(),
            batches,
        );
        let position = SavedPosition::decode(&saved).unwrap();
        let left = n - first.len() as u64;
        let rest: Vec<u64> = all.iter().copied().filter(|i| !first.contains(i)).collect();
        // A fresh producer of the same feed, so that its counters are the resume's alone.
        fx.signal(serving, 15);
        fx.wait(serving, GUARD);
        serving = fx.serve(&data, &serve_args);
        let resumed = Consumer::connect(&socket, config(10, None)).unwrap();
        resumed.load_position(&position).unwrap();
        assert_epoch_is(&resumed, &rest, &reference, what);
        let stats = decoded(&socket);
        // What it had left, and at most the read-ahead past its window's end: nothing is
        // decoded before its first ask, which comes after its declaration was answered.
        assert!(
            stats.published <= left + read_ahead,
            "{what}: {} decoded for {left} left ({} holes)",
            stats.published,
            stats.holes
        );
        assert!(stats.holes > 0, "{what}: no position was let pass");
        // Then whole epochs, every sample decoded and delivered.
        assert_epoch_is(&resumed, &all, &reference, "the epoch after");
    }
}

#[test]
fn a_resumed_consumer_beside_a_whole_one_costs_no_extra_decode_and_both_stay_exact() {
    let mut fx = Fixture::new();
    let n = 200u64;
    let data = fx.dataset(n as u32, 24, 20);
    fx.serve(&data, SERVE);
    let socket = fx.socket();
    let reference = reference(&socket);
    let all: Vec<u64> = (0..n).collect();
    let (first, saved) = read_part(&Consumer::connect(&socket, config(10, None)).unwrap(), 5);
    let rest: Vec<u64> = all.iter().copied().filter(|i| !first.contains(i)).collect();
    let position = SavedPosition::decode(&saved).unwrap();
    let whole = Consumer::connect(&socket, config(8, None)).unwrap();
    let resumed = Consumer::connect(&socket, config(10, None)).unwrap();
    resumed.load_position(&position).unwrap();
    let before = decoded(&socket).published;
    std::thread::scope(|s| {
        s.spawn(|| assert_epoch_is(&whole, &all, &reference, "the whole consumer"));
        assert_epoch_is(&resumed, &rest, &reference, "the resumed one");
    });
    // The whole one needed every position of its window: no hole in it, N decoded for both.
    let after = decoded(&socket);
    assert!(
        after.published - before <= n + 64,
        "{} decoded",
        after.published - before
    );
}
