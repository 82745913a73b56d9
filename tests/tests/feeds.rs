//! Feeds that come when called (issue 42): a consumer that names its data joins the node's
//! feed of it or starts one, one feed per identity however many ask at once; the feed stops
//! by itself (idle, orphan), not while a driver holds it; a dead feed's entry is replaced; a
//! registry open to others is refused. Real `ladle` processes, each test with a registry of
//! its own (`LADLE_REGISTRY_DIR`); nothing of ladle is left running afterwards.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ladle_tests::{Finished, Fixture, ladle_bin, wait_until};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(300);

/// A fixture with a registry of its own and a small dataset.
struct World {
    fx: Fixture,
    registry: PathBuf,
    data: PathBuf,
}

impl World {
    fn new(samples: u32) -> Self {
        let mut fx = Fixture::new();
        let data = fx.dataset(samples, 48, 40);
        let registry = fx.path().join("reg");
        Self { fx, registry, data }
    }

    /// `ladle ARGS` with this world's registry, started.
    fn spawn<S: AsRef<std::ffi::OsStr>>(&mut self, args: &[S]) -> usize {
        let mut command = Command::new(ladle_bin());
        command
            .args(args)
            .env("LADLE_REGISTRY_DIR", &self.registry)
            .env("LADLE_BIN", ladle_bin())
            .env_remove("LADLE_SOCKET");
        self.fx.start(&mut command)
    }

    fn run<S: AsRef<std::ffi::OsStr>>(&mut self, args: &[S]) -> Finished {
        let i = self.spawn(args);
        self.fx.wait(i, GUARD)
    }

    /// `ladle consume --dataset D` args for a 32-pixel feed, with `extra`.
    fn consume_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "consume",
            "--dataset",
            self.data.to_str().unwrap(),
            "--image-size",
            "32",
            "--ring-mib",
            "4",
            "--threads",
            "1",
            "--json",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect()
    }

    /// `ladle feeds start` for the 32-pixel feed, with `extra`; its entry.
    fn start_feed(&mut self, extra: &[&str]) -> Value {
        let data = self.data.to_str().unwrap().to_owned();
        let mut args = vec![
            "feeds",
            "start",
            "--dataset",
            &data,
            "--image-size",
            "32",
            "--ring-mib",
            "4",
            "--threads",
            "1",
        ];
        args.extend_from_slice(extra);
        let done = self.run(&args);
        assert!(done.status.success(), "{}", done.stderr);
        serde_json::from_str(done.stdout.trim()).unwrap()
    }

    fn file(&self, key: &str, ext: &str) -> PathBuf {
        self.registry.join(format!("{key}.{ext}"))
    }

    /// Waits until the feed `key` has exited (its life lock free); returns how long that took.
    fn wait_gone(&self, key: &str) -> Duration {
        let started = Instant::now();
        let live = self.file(key, "live");
        wait_until(
            "the feed to exit",
            GUARD,
            || match ladle_os::process::is_locked(&live) {
                Ok(false) => Ok(Some(())),
                Ok(true) => Err("still alive".to_owned()),
                Err(e) => Err(e.to_string()),
            },
        );
        started.elapsed()
    }

    fn log(&self, key: &str) -> String {
        std::fs::read_to_string(self.file(key, "log")).unwrap_or_default()
    }
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &Path) -> Vec<(u32, String)> {
    let needle = needle.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id())
        .map(|pid| (pid, ladle_os::process::cmdline(pid)))
        .filter(|(_, cmd)| cmd.contains(&needle))
        .collect()
}

impl Drop for World {
    /// Nothing of ladle is left: every feed of this registry has exited (a failing test's
    /// feeds are killed, so that they do not outlive it).
    fn drop(&mut self) {
        for (pid, _) in processes_mentioning(&self.registry) {
            if let Some(p) = ladle_os::process::ProcessId::of(pid) {
                let _ = p.signal(ladle_os::Signal::KILL);
            }
        }
    }
}

/// Asserts that no process mentions the registry (every feed is gone).
fn assert_nothing_left(world: &World) {
    let left = processes_mentioning(&world.registry);
    assert!(left.is_empty(), "left running: {left:?}");
}

/// The pid in a consumer's "started feed K (pid N)" or "found feed K (pid N)" line.
fn feed_of(stderr: &str) -> (bool, String, u32) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("started feed") || l.starts_with("found feed"))
        .unwrap_or_else(|| panic!("no feed line in {stderr}"));
    let words: Vec<&str> = line.split(' ').collect();
    let pid = words[4].trim_end_matches(')').parse().unwrap();
    (words[0] == "started", words[2].to_owned(), pid)
}

#[test]
fn processes_asking_at_once_for_one_dataset_share_one_feed_and_read_exact_epochs() {
    const ASKERS: usize = 6;
    let mut world = World::new(120);
    // They wait on a gate file and all go at once: the start lock, not luck, makes one feed.
    let gate = world.fx.path().join("go");
    let mut askers = Vec::new();
    for _ in 0..ASKERS {
        let consume = world
            // An idle timeout long enough that a consumer slow to start on a loaded machine
            // still finds the feed the others used.
            .consume_args(&["--epochs", "2", "--batch-size", "16", "--idle-timeout", "5"])
            .join(" ");
        let script = format!(
            "while [ ! -e {} ]; do sleep 0.005; done; exec {} {consume}",
            gate.display(),
            ladle_bin().display()
        );
        let mut command = Command::new("sh");
        command
            .args(["-c", &script])
            .env("LADLE_REGISTRY_DIR", &world.registry)
            .env("LADLE_BIN", ladle_bin());
        askers.push(world.fx.start(&mut command));
    }
    std::fs::write(&gate, b"").unwrap();
    let mut feeds = Vec::new();
    for i in askers {
        let done = world.fx.wait(i, GUARD);
        done.assert_exact(2, "a consumer that named its data");
        feeds.push(feed_of(&done.stderr));
    }
    let started = feeds.iter().filter(|(s, _, _)| *s).count();
    assert_eq!(started, 1, "exactly one asker started the feed: {feeds:?}");
    let (_, key, pid) = feeds[0].clone();
    assert!(
        feeds.iter().all(|(_, k, p)| *k == key && *p == pid),
        "all joined one feed: {feeds:?}"
    );
    world.wait_gone(&key);
    let log = world.log(&key);
    assert_eq!(log.matches("consumer joined").count(), ASKERS, "{log}");
    assert!(log.contains("idle timeout"), "{log}");
    assert!(
        !world.file(&key, "json").exists(),
        "the entry goes with the feed"
    );
    assert_nothing_left(&world);
}

#[test]
fn a_feed_killed_with_sigkill_fails_its_consumer_and_is_replaced_by_the_next_asker() {
    let mut world = World::new(60);
    let entry = world.start_feed(&["--idle-timeout", "30"]);
    let key = entry["key"].as_str().unwrap().to_owned();
    let socket = entry["socket"].as_str().unwrap().to_owned();
    // A consumer reading slowly for ever.
    let consumer = world.spawn(&world.consume_args(&["--epochs", "1000", "--step-ms", "20"]));
    let stats_socket = PathBuf::from(&socket);
    ladle_tests::wait_for_stats(&stats_socket, GUARD, "the consumer to join", |s| {
        s.consumers.len() == 1
    });
    let feed = ladle_os::process::ProcessId::new(
        u32::try_from(entry["pid"].as_u64().unwrap()).unwrap(),
        entry["start_ticks"].as_u64().unwrap(),
    );
    assert!(feed.signal(ladle_os::Signal::KILL).unwrap());
    world.wait_gone(&key);
    let failed = world.fx.wait(consumer, GUARD);
    assert!(!failed.status.success(), "{}", failed.stdout);
    assert!(
        failed.stderr.contains(&socket),
        "names the socket: {}",
        failed.stderr
    );
    assert!(
        world.file(&key, "json").exists(),
        "a killed feed leaves its entry"
    );

    let again = world.start_feed(&["--idle-timeout", "1"]);
    assert_eq!(again["key"], entry["key"]);
    assert_eq!(
        again["socket"], entry["socket"],
        "the same socket path, bound again"
    );
    assert_ne!(again["pid"], entry["pid"], "a new feed");
    let read = world.run(&world.consume_args(&["--epochs", "1"]));
    read.assert_exact(1, "a consumer of the new feed");
    assert_eq!(
        feed_of(&read.stderr).2,
        again["pid"].as_u64().unwrap() as u32
    );
    world.wait_gone(&key);
    assert_nothing_left(&world);
}

#[test]
fn a_feed_whose_starter_never_joined_stops_after_its_orphan_timeout() {
    let mut world = World::new(30);
    let asked = Instant::now();
    // `ladle feeds start` returns once the feed serves: a driver that dies right after.
    let entry = world.start_feed(&["--orphan-timeout", "1", "--idle-timeout", "600"]);
    let key = entry["key"].as_str().unwrap().to_owned();
    world.wait_gone(&key);
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "not before its timeout"
    );
    let log = world.log(&key);
    assert!(log.contains("orphan timeout"), "{log}");
    assert_eq!(log.matches("consumer joined").count(), 0, "{log}");
    assert_nothing_left(&world);
}

#[test]
fn a_feed_stays_while_a_driver_holds_it_and_stops_idle_seconds_after_the_hold_goes() {
    let mut world = World::new(30);
    let entry = world.start_feed(&["--orphan-timeout", "1", "--idle-timeout", "1"]);
    let key = entry["key"].as_str().unwrap().to_owned();
    let socket = PathBuf::from(entry["socket"].as_str().unwrap());
    let hold = ladle_os::process::hold_shared(&world.file(&key, "hold")).unwrap();
    let read = world.run(&world.consume_args(&["--epochs", "1"]));
    read.assert_exact(1, "a consumer");
    // Three idle timeouts pass, by the feed's own clock, with the feed held.
    let left = ladle_tests::wait_for_stats(&socket, GUARD, "the consumer to leave", |s| {
        s.consumers.is_empty()
    })
    .uptime_s;
    let later = ladle_tests::wait_for_stats(&socket, GUARD, "three idle timeouts", |s| {
        s.uptime_s >= left + 3.0
    });
    assert_eq!(later.joins, 1);
    assert!(ladle_os::process::is_locked(&world.file(&key, "live")).unwrap());
    assert!(!world.log(&key).contains("stopping"), "{}", world.log(&key));
    let let_go = Instant::now();
    drop(hold);
    world.wait_gone(&key);
    assert!(
        let_go.elapsed() >= Duration::from_secs(1),
        "not before its idle timeout"
    );
    assert!(
        world.log(&key).contains("idle timeout"),
        "{}",
        world.log(&key)
    );
    assert_nothing_left(&world);
}

#[test]
fn joins_racing_a_feed_that_stops_as_they_come_never_fail() {
    let mut world = World::new(20);
    // The feed stops 20 ms after each consumer leaves, about when the next one asks.
    let mut feeds = std::collections::BTreeSet::new();
    let mut key = String::new();
    for _ in 0..12 {
        let read = world.run(
            &world
                .consume_args(&[
                    "--epochs",
                    "1",
                    "--batch-size",
                    "8",
                    "--idle-timeout",
                    "0.02",
                ])
                .clone(),
        );
        read.assert_exact(1, "a join racing the idle stop");
        let (_, k, pid) = feed_of(&read.stderr);
        feeds.insert(pid);
        key = k;
    }
    assert!(
        feeds.len() > 1,
        "the feed did stop between joins: {feeds:?}"
    );
    world.wait_gone(&key);
    assert_nothing_left(&world);
}

#[test]
fn a_registry_open_to_others_or_a_link_is_refused_by_name_and_starts_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let mut world = World::new(10);
    std::fs::create_dir(&world.registry).unwrap();
    std::fs::set_permissions(&world.registry, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = world.run(&world.consume_args(&["--epochs", "1"]));
    assert!(!refused.status.success());
    let registry = world.registry.display().to_string();
    assert!(refused.stderr.contains(&registry), "{}", refused.stderr);
    assert!(refused.stderr.contains("0777"), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("LADLE_REGISTRY_DIR"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        std::fs::read_dir(&world.registry).unwrap().count(),
        0,
        "nothing written"
    );

    // A link to a private directory is not followed.
    let real = world.fx.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::remove_dir(&world.registry).unwrap();
    std::os::unix::fs::symlink(&real, &world.registry).unwrap();
    let refused = world.run(&world.consume_args(&["--epochs", "1"]));
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("symbolic link"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        std::fs::read_dir(&real).unwrap().count(),
        0,
        "nothing written"
    );
    assert_nothing_left(&world);
}

#[test]
fn a_file_that_is_not_a_socket_at_a_feeds_socket_path_is_an_error_naming_it() {
    let mut world = World::new(10);
    let entry = world.start_feed(&["--orphan-timeout", "0.1"]);
    let key = entry["key"].as_str().unwrap().to_owned();
    world.wait_gone(&key);
    let socket = world.file(&key, "sock");
    assert!(!socket.exists(), "a feed that stops removes its socket");
    std::fs::write(&socket, b"not a socket").unwrap();
    let refused = world.run(&world.consume_args(&["--epochs", "1"]));
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains(&socket.display().to_string()),
        "{}",
        refused.stderr
    );
    assert_eq!(
        std::fs::read(&socket).unwrap(),
        b"not a socket",
        "left alone"
    );
    assert_nothing_left(&world);
}
