//! The decoded-sample cache (`ladle serve --cache-gib`) against real `ladle serve` processes
//! and the real keeper they start: samples bit-identical with and without it, decodes saved
//! across epochs and across feeds, crashes of a feed or of the keeper, files changed under
//! it, a budget that does not hold the dataset, and nobody else writing its memory.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ladle_consumer::{Consumer, ConsumerConfig};
use ladle_ring::protocol::{CacheStats, FeedStats};
use ladle_tests::{Fixture, wait_for_listener, wait_until};

const GUARD: Duration = Duration::from_secs(120);
/// A random transform: a cached image is augmented anew every epoch and for every seed.
const FEED: &[&str] = &["--ring-mib", "8", "--threads", "2"];

/// Starts a feed of `data` on `name`.sock in the fixture with `extra` options; its socket.
fn serve(fx: &mut Fixture, data: &Path, name: &str, extra: &[&str]) -> (usize, PathBuf) {
    let socket = fx.path().join(format!("{name}.sock"));
    let size: &[&str] = if extra.contains(&"--image-size") {
        &[]
    } else {
        &["--image-size", "24"]
    };
    let args = [
        &["serve", "--dataset", data.to_str().unwrap()][..],
        &["--socket", socket.to_str().unwrap()],
        FEED,
        size,
        extra,
    ]
    .concat();
    let i = fx.spawn(&args);
    wait_for_listener(&socket, GUARD, "ladle serve");
    (i, socket)
}

/// Each epoch's samples in delivery order: (index, digest of its image).
type Epochs = Vec<Vec<(u64, u64)>>;

fn read(socket: &Path, epochs: usize, batches: Option<usize>) -> Epochs {
    read_from(&connect(socket, 6), epochs, batches)
}

fn connect(socket: &Path, batch_size: u32) -> Consumer {
    let config = ConsumerConfig {
        batch_size,
        ..ConsumerConfig::default()
    };
    Consumer::connect(socket, config).unwrap()
}

fn read_from(consumer: &Consumer, epochs: usize, batches: Option<usize>) -> Epochs {
    read_until(consumer, epochs, batches, |_, _| {})
}

/// [`read_from`] whole epochs, calling `at(epoch, batch)` before each batch.
fn read_with(consumer: &Consumer, epochs: usize, at: impl FnMut(usize, usize)) -> Epochs {
    read_until(consumer, epochs, None, at)
}

fn read_until(
    consumer: &Consumer,
    epochs: usize,
    batches: Option<usize>,
    mut at: impl FnMut(usize, usize),
) -> Epochs {
    let mut out = Vec::new();
    for e in 0..epochs {
        let mut epoch = Vec::new();
        for (b, batch) in consumer.epoch().enumerate() {
            if batches.is_some_and(|n| b >= n) {
                break;
            }
            at(e, b);
            let batch = batch.unwrap();
            let per = batch.images().len() / batch.len();
            for (k, &index) in batch.indices().iter().enumerate() {
                let mut h = DefaultHasher::new();
                batch.images()[k * per..(k + 1) * per].hash(&mut h);
                epoch.push((index, h.finish()));
            }
        }
        out.push(epoch);
    }
    out
}

fn assert_exact(epochs: &Epochs, n: u64) {
    for (e, epoch) in epochs.iter().enumerate() {
        let mut indices: Vec<u64> = epoch.iter().map(|s| s.0).collect();
        indices.sort_unstable();
        assert_eq!(
            indices,
            (0..n).collect::<Vec<_>>(),
            "epoch {e} is not exact"
        );
    }
}

fn stats(socket: &Path) -> FeedStats {
    ladle_ring::protocol::feed_stats(socket, GUARD).unwrap()
}

fn cache_of(socket: &Path) -> CacheStats {
    stats(socket)
        .cache
        .expect("a feed with --cache-gib reports its cache")
}

/// `ladle cache ls --json` in the fixture's registry.
fn listing(fx: &mut Fixture) -> serde_json::Value {
    let done = fx.run(&["cache", "ls", "--json"], GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    serde_json::from_str(done.stdout.trim()).unwrap()
}

fn keeper_pid(fx: &Fixture) -> u32 {
    let entry = std::fs::read_to_string(fx.registry().join("cache.json")).unwrap();
    let entry: serde_json::Value = serde_json::from_str(&entry).unwrap();
    entry["pid"].as_u64().unwrap() as u32
}

#[test]
fn samples_are_identical_with_and_without_the_cache_and_epochs_after_the_first_are_hits() {
    let mut fx = Fixture::new();
    let n = 60;
    let data = fx.dataset(n as u32, 64, 48);
    let (_, plain) = serve(&mut fx, &data, "plain", &["--seed", "3"]);
    let (_, cached) = serve(
        &mut fx,
        &data,
        "cached",
        &["--seed", "3", "--cache-gib", "1"],
    );
    let want = read(&plain, 3, None);
    let got = read(&cached, 3, None);
    assert_exact(&got, n);
    assert_eq!(got, want, "samples differ with the cache");
    // Augmentation still changes every epoch: the cache holds pixels before it.
    let first: std::collections::HashMap<u64, u64> = got[0].iter().copied().collect();
    let changed = got[1].iter().filter(|(i, h)| first[i] != *h).count();
    assert!(
        changed > n as usize / 2,
        "only {changed} of {n} changed between epochs"
    );
    // Once the samples in flight when the consumer left are published (a hit is counted at
    // its lookup, a sample when it is written).
    let feed = ladle_tests::wait_for_stats(&cached, GUARD, "every lookup published", |s| {
        s.cache.is_some_and(|c| c.hits + c.misses == s.published)
    });
    let cache = feed.cache.unwrap();
    assert!(cache.attached);
    assert_eq!(
        (cache.fills, cache.misses, cache.stale),
        (n, n, 0),
        "{cache:?}"
    );
    assert_eq!(
        cache.hits,
        feed.published - n,
        "every decode after the first epoch is a hit"
    );
    assert!(cache.hits >= 2 * n);
    assert!(stats(&plain).cache.is_none());
}

#[test]
fn feeds_of_one_dataset_with_other_seeds_and_sizes_decode_each_image_once_between_them() {
    let mut fx = Fixture::new();
    let n = 90;
    let data = fx.dataset(n as u32, 64, 48);
    // Seeds 1 and 2: other orders. Seed 1 at another size: the same order as the first, in
    // lockstep with it, so the two would decode each image at once without the claims.
    let sockets: Vec<PathBuf> = [
        &["--seed", "1"][..],
        &["--seed", "2"],
        &["--seed", "1", "--image-size", "16"],
    ]
    .iter()
    .enumerate()
    .map(|(k, extra)| {
        let extra = [*extra, &["--cache-gib", "1"]].concat();
        serve(&mut fx, &data, &format!("f{k}"), &extra).1
    })
    .collect();
    std::thread::scope(|scope| {
        for socket in &sockets {
            scope.spawn(move || assert_exact(&read(socket, 2, None), n));
        }
    });
    let caches: Vec<CacheStats> = sockets.iter().map(|s| cache_of(s)).collect();
    let fills: u64 = caches.iter().map(|c| c.fills).sum();
    let misses: u64 = caches.iter().map(|c| c.misses).sum();
    assert_eq!((fills, misses), (n, n), "{caches:?}");
    let listing = listing(&mut fx);
    let datasets = listing["datasets"].as_array().unwrap();
    assert_eq!(datasets.len(), 1, "{listing}");
    assert_eq!(datasets[0]["entries"], n);
    assert_eq!(datasets[0]["duplicates"], 0);
}

#[test]
fn a_file_changed_since_it_was_cached_is_decoded_again_not_served_stale() {
    let mut fx = Fixture::new();
    let n = 30;
    let data = fx.dataset(n as u32, 64, 48);
    // A short read-ahead: the epoch after the change is decoded after it (but for its
    // first few samples), and the one after that wholly.
    let (_, socket) = serve(
        &mut fx,
        &data,
        "f",
        &["--cache-gib", "1", "--read-ahead", "5"],
    );
    let consumer = connect(&socket, 5);
    assert_exact(&read_from(&consumer, 1, None), n);
    assert_eq!(cache_of(&socket).fills, n);
    // A new modification time on one file (what a rewrite gives it).
    let file = first_image(&data);
    let f = std::fs::File::options().write(true).open(&file).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
        .unwrap();
    drop(f);
    assert_exact(&read_from(&consumer, 2, None), n);
    let cache = cache_of(&socket);
    assert!(cache.stale >= 1, "{cache:?}");
    assert!(
        cache.fills > n,
        "the changed file was filled again: {cache:?}"
    );
}

fn first_image(data: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data)
        .unwrap()
        .flat_map(|class| std::fs::read_dir(class.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    files.remove(0)
}

#[test]
fn a_feed_killed_mid_epoch_leaves_the_next_feed_only_complete_entries() {
    let mut fx = Fixture::new();
    let n = 120;
    let data = fx.dataset(n as u32, 160, 120);
    let (_, plain) = serve(&mut fx, &data, "plain", &["--seed", "5"]);
    let want = read(&plain, 2, None);
    let (killed, socket) = serve(
        &mut fx,
        &data,
        "killed",
        &["--seed", "5", "--cache-gib", "1"],
    );
    let consumer = connect(&socket, 6);
    drop(read_from(&consumer, 1, Some(4)));
    // Killed while its decode threads fill the cache.
    fx.signal(killed, libc::SIGKILL);
    drop(consumer);
    let (_, next) = serve(&mut fx, &data, "next", &["--seed", "5", "--cache-gib", "1"]);
    let got = read(&next, 2, None);
    assert_eq!(got, want, "a sample of the next feed differs from a decode");
    let cache = cache_of(&next);
    assert!(
        cache.hits > 0,
        "the next feed used what the killed one left: {cache:?}"
    );
    assert!(cache.fills < n, "{cache:?}");
}

#[test]
fn a_keeper_killed_mid_epoch_costs_its_feed_the_cache_not_a_sample() {
    let mut fx = Fixture::new();
    let n = 120;
    let data = fx.dataset(n as u32, 160, 120);
    let (_, plain) = serve(&mut fx, &data, "plain", &["--seed", "9"]);
    let want = read(&plain, 3, None);
    let (_, socket) = serve(
        &mut fx,
        &data,
        "cached",
        &["--seed", "9", "--cache-gib", "1"],
    );
    let pid = keeper_pid(&fx);
    let consumer = connect(&socket, 6);
    // Two batches in, while the feed (its read-ahead bounded by what was asked) is still
    // filling the first epoch's entries: the keeper dies.
    let mut kill = Some(pid);
    let got = read_with(&consumer, 3, |epoch, batch| {
        if (epoch, batch) == (0, 2)
            && let Some(pid) = kill.take()
        {
            let keeper = ladle_os::process::ProcessId::of(pid).expect("the keeper runs");
            assert!(keeper.signal(ladle_os::process::Signal::KILL).unwrap());
        }
    });
    assert_eq!(got, want);
    let cache = cache_of(&socket);
    if cache.attached {
        // The feed tries again `RETRY` (10 s) after it let the dead keeper go, and starts a
        // new one: on a loaded machine the three epochs can outlast that. Attached, then,
        // to a keeper that is not the dead one.
        assert_ne!(
            keeper_pid(&fx),
            pid,
            "the feed still counts the dead keeper as attached: {cache:?}"
        );
    } else {
        assert!(
            cache.fills < n,
            "the keeper was killed before every fill: {cache:?}"
        );
    }
}

#[test]
fn with_half_the_dataset_in_budget_what_went_in_stays_and_nothing_is_evicted() {
    let mut fx = Fixture::new();
    let n = 60u64;
    let data = fx.dataset(n as u32, 64, 48);
    // A record is 64 + 64·48·3 = 9 280 bytes; the index of 60 samples is 2 pages.
    let budget = 8192 + (n / 2) * 9280;
    let gib = format!("{}", budget as f64 / (1u64 << 30) as f64);
    let (_, plain) = serve(&mut fx, &data, "plain", &[]);
    let want = read(&plain, 3, None);
    let (_, socket) = serve(&mut fx, &data, "half", &["--cache-gib", &gib]);
    let consumer = connect(&socket, 6);
    let mut got = read_from(&consumer, 1, None);
    let entries = |fx: &mut Fixture| listing(fx)["datasets"][0]["entries"].as_u64().unwrap();
    let after_one = entries(&mut fx);
    assert!(after_one > 0 && after_one < n, "{after_one} entries");
    got.extend(read_from(&consumer, 2, None));
    assert_eq!(got, want);
    assert_eq!(
        entries(&mut fx),
        after_one,
        "nothing evicted, nothing more admitted"
    );
    let cache = cache_of(&socket);
    assert_eq!(cache.fills, after_one);
    assert!(cache.hits >= 2 * after_one, "{cache:?}");
    let listing = listing(&mut fx);
    assert!(listing["used"].as_u64().unwrap() <= budget, "{listing}");
}

#[test]
fn no_consumer_or_other_process_can_write_the_cache_even_through_proc() {
    use std::io::Write;
    let mut fx = Fixture::new();
    let data = fx.dataset(30, 64, 48);
    let (feed, socket) = serve(&mut fx, &data, "f", &["--cache-gib", "1"]);
    assert_exact(&read(&socket, 1, None), 30);
    let mut tried = Vec::new();
    for pid in [fx.pid(feed), keeper_pid(&fx)] {
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
            let path = fd.unwrap().path();
            let target = std::fs::read_link(&path).unwrap_or_default();
            let target = target.to_string_lossy().into_owned();
            if !target.contains("memfd:ladle-cache") {
                continue;
            }
            // Re-opened for writing through /proc: the open may succeed, a write may not,
            // nor a writable shared mapping.
            if let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(&path) {
                let wrote = file.write(b"x");
                assert!(wrote.is_err(), "{target} of {pid} took a write");
                // SAFETY: a fresh mapping request of our own; failure is what is asserted.
                let map = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        std::os::fd::AsRawFd::as_raw_fd(&file),
                        0,
                    )
                };
                assert_eq!(map, libc::MAP_FAILED, "{target} of {pid} mapped writable");
            }
            tried.push(target);
        }
    }
    assert!(tried.iter().any(|t| t.contains("arena")), "{tried:?}");
    assert!(tried.iter().any(|t| t.contains("index")), "{tried:?}");
}

#[test]
fn the_keeper_outlives_its_feed_for_its_idle_timeout_then_drops_the_dataset_and_exits() {
    let mut fx = Fixture::new();
    let data = fx.dataset(30, 64, 48);
    let cache = ["--cache-gib", "1", "--cache-idle-timeout", "3"];
    let (feed, socket) = serve(&mut fx, &data, "f", &cache);
    assert_exact(&read(&socket, 1, None), 30);
    fx.signal(feed, libc::SIGTERM);
    fx.wait(feed, GUARD);
    // The feed went; its entries stay for the next one.
    let listing = listing(&mut fx);
    assert_eq!(listing["datasets"][0]["entries"], 30, "{listing}");
    let (second, next) = serve(&mut fx, &data, "next", &cache);
    assert_exact(&read(&next, 1, None), 30);
    let cache = cache_of(&next);
    assert_eq!((cache.fills, cache.misses), (0, 0), "{cache:?}");
    fx.signal(second, libc::SIGTERM);
    let live = fx.registry().join("cache.live");
    wait_until("the keeper's exit after its idle timeout", GUARD, || {
        match ladle_os::process::is_locked(&live) {
            Ok(false) => Ok(Some(())),
            Ok(true) => Err("the keeper still holds its life lock".into()),
            Err(e) => Err(e.to_string()),
        }
    });
    assert!(!fx.registry().join("cache.sock").exists());
}
