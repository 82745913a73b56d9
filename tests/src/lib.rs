//! # ladle-tests: cross-crate, multi-process integration tests
//!
//! In `docs/ARCHITECTURE.md`'s picture this package tests the whole: it runs the real `ladle`
//! binary as real processes (a producer, several consumers) over real Unix sockets and real shared
//! memory, on real files. This library is the fixture the tests in `tests/` share: every test gets
//! its own temporary directory (so its own socket and dataset names, and tests run in parallel),
//! every child process leads its own process group (a `ladle_os::Proc`) and is killed with
//! that group when the fixture drops, and every wait has a deadline that turns a hang into a
//! test failure (a watchdog, not a speed assertion).
//!
//! A test never sleeps a fixed time to let another process get going: it waits, with a
//! deadline, for what the system reports. The waits for that are here, shared by every test:
//! [`wait_for_stats`] (a producer's `Stats` answer: N consumers joined, one holding the feed
//! back), [`wait_for_listener`] (a socket that accepts connections), [`wait_for_log_line`] (a
//! line in a log file, e.g. a child's stderr from [`Fixture::spawn_logged`]) and
//! [`wait_until`] for anything else a test can look at.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // a test fixture fails loudly

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ladle_os::{Output, Proc, Signal};
use ladle_ring::protocol::FeedStats;

pub mod scheduler;
pub mod slurm;
pub mod web;

/// The `ladle` binary of this build, built on first use with the same profile as the tests.
pub fn ladle_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "-p",
            "ladle",
            "--bin",
            "ladle",
            "--message-format=json",
        ]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .expect("run cargo build");
        assert!(out.status.success(), "cargo build -p ladle failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "ladle")
            .find_map(|v| v["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported no ladle executable")
    })
}

/// A finished child process.
#[derive(Debug)]
pub struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything it wrote on stdout.
    pub stdout: String,
    /// Everything it wrote on stderr.
    pub stderr: String,
}

impl From<Output> for Finished {
    fn from(
        Output {
            status,
            stdout,
            stderr,
        }: Output,
    ) -> Self {
        Self {
            status,
            stdout,
            stderr,
        }
    }
}

impl Finished {
    /// Stdout parsed as one JSON object per line.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect()
    }

    /// The per-epoch lines of a `ladle consume --json` that succeeded.
    pub fn epochs(&self) -> Vec<serde_json::Value> {
        assert!(self.status.success(), "consumer failed: {}", self.stderr);
        self.json_lines()
            .into_iter()
            .filter(|v| v.get("epoch").is_some())
            .collect()
    }

    /// Asserts that a `ladle consume --json` read `expected_epochs` epochs, each with exact
    /// coverage; returns them.
    pub fn assert_exact(&self, expected_epochs: usize, what: &str) -> Vec<serde_json::Value> {
        let epochs = self.epochs();
        assert_eq!(epochs.len(), expected_epochs, "{what}: {}", self.stdout);
        for e in &epochs {
            assert_eq!(e["exact_coverage"], true, "{what}: {e}");
        }
        epochs
    }
}

/// The per-epoch lines a sweep run's `ladle consume --json` wrote into its log (the run's
/// `log` in a sweep report), with the log's text for messages.
pub fn sweep_run_epochs(run: &serde_json::Value) -> (Vec<serde_json::Value>, String) {
    let path = run["log"]
        .as_str()
        .unwrap_or_else(|| panic!("no log: {run}"));
    let log = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let epochs = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("epoch").is_some())
        .collect();
    (epochs, log)
}

/// One test's world: a temporary directory and the processes started in it, each in its own
/// process group (a [`Proc`]: output collected as it comes, so a chatty child never blocks on
/// a full pipe; the group killed when the fixture drops).
#[derive(Debug)]
pub struct Fixture {
    dir: tempfile::TempDir,
    children: Vec<Proc>,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    /// A fresh, empty world.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            children: Vec::new(),
        }
    }

    /// The fixture's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The producer's socket path.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("ladle.sock")
    }

    /// Runs `ladle ARGS` to completion (deadline `timeout`).
    pub fn run(&mut self, args: &[&str], timeout: Duration) -> Finished {
        let i = self.spawn(args);
        self.wait(i, timeout)
    }

    /// Generates a small ImageFolder dataset of `count` `width × height` images; returns its
    /// path.
    pub fn dataset(&mut self, count: u32, width: u32, height: u32) -> PathBuf {
        let out = self.dir.path().join("data");
        let (count, w, h) = (count.to_string(), width.to_string(), height.to_string());
        let args = [
            "dataset",
            "generate",
            "--format",
            "imagefolder",
            "--count",
            &count,
        ];
        let path = out.to_str().unwrap();
        let done = self.run(
            &[&args[..], &["--width", &w, "--height", &h, "--out", path]].concat(),
            Duration::from_secs(120),
        );
        assert!(done.status.success(), "generate failed: {}", done.stderr);
        out
    }

    /// Starts `ladle ARGS` with piped output; returns its handle. Its registry of feeds
    /// started on demand is the fixture's own (`LADLE_REGISTRY_DIR` = [`Fixture::registry`]),
    /// never the user's.
    pub fn spawn(&mut self, args: &[&str]) -> usize {
        let registry = self.registry();
        self.start(
            Command::new(ladle_bin())
                .args(args)
                .env("LADLE_REGISTRY_DIR", registry),
        )
    }

    /// The registry of feeds started on demand that the fixture's `ladle` processes use.
    pub fn registry(&self) -> PathBuf {
        self.dir.path().join("reg")
    }

    /// Starts `PROGRAM ARGS` (`argv`) with piped output, e.g. `ladle` under `prlimit`.
    pub fn spawn_program(&mut self, argv: &[&str]) -> usize {
        self.start(Command::new(argv[0]).args(&argv[1..]))
    }

    /// Starts `PROGRAM ARGS` (`argv`) with its stderr written to `log` (created or
    /// truncated) instead of collected, so that a test can wait for a line in it while the
    /// child runs ([`wait_for_log_line`]); its [`Finished::stderr`] is then empty: read
    /// `log`. (`Proc` hands a child's output out only once it has exited.)
    pub fn spawn_logged(&mut self, argv: &[&str], log: &Path) -> usize {
        // `sh` opens the file and `exec`s the program in its place: same pid, same group.
        self.start(
            Command::new("sh")
                .arg("-c")
                .arg("exec \"$0\" \"$@\" 2>\"$LADLE_TEST_STDERR\"")
                .args(argv)
                .env("LADLE_TEST_STDERR", log),
        )
    }

    /// Starts `command` with piped output (its environment as set); returns its handle.
    pub fn start(&mut self, command: &mut Command) -> usize {
        let name = command.get_program().to_string_lossy().into_owned();
        self.children
            .push(Proc::spawn(name, command).expect("spawn ladle"));
        self.children.len() - 1
    }

    /// Starts `ladle serve` on the fixture's socket and waits until it accepts connections.
    pub fn serve(&mut self, dataset: &Path, extra: &[&str]) -> usize {
        let socket = self.socket();
        let args = [
            "serve",
            "--dataset",
            dataset.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
        ];
        let i = self.spawn(&[&args[..], extra].concat());
        self.wait_for_socket(i);
        i
    }

    /// Waits until child `i` (a producer) accepts connections on the fixture's socket.
    pub fn wait_for_socket(&mut self, i: usize) {
        let socket = self.socket();
        let child = &mut self.children[i];
        wait_until(
            "ladle serve accepting connections",
            Duration::from_secs(60),
            || match std::os::unix::net::UnixStream::connect(&socket) {
                Ok(_) => Ok(Some(())),
                Err(e) => match child.try_wait().unwrap() {
                    Some(status) => panic!(
                        "ladle serve exited with {status}: {}",
                        child.output().unwrap().stderr
                    ),
                    None => Err(format!("{}: {e}", socket.display())),
                },
            },
        );
    }

    /// Asks the producer on the fixture's socket for its `Stats` until `ok` holds
    /// ([`wait_for_stats`] with [`REPORT_GUARD`]); returns those stats.
    pub fn wait_for_stats(&self, what: &str, ok: impl FnMut(&FeedStats) -> bool) -> FeedStats {
        wait_for_stats(&self.socket(), REPORT_GUARD, what, ok)
    }

    /// Starts `ladle consume --json` on the fixture's socket.
    pub fn consume(&mut self, batch_size: u32, epochs: u32, extra: &[&str]) -> usize {
        let socket = self.socket();
        let (b, e) = (batch_size.to_string(), epochs.to_string());
        let args = [
            "consume",
            "--socket",
            socket.to_str().unwrap(),
            "--batch-size",
            &b,
            "--epochs",
            &e,
            "--json",
        ];
        self.spawn(&[&args[..], extra].concat())
    }

    /// The OS process id of child `i`.
    pub fn pid(&self, i: usize) -> u32 {
        self.children[i].pid()
    }

    /// Sends `signal` (e.g. `libc`'s 9 for SIGKILL, 15 for SIGTERM) to child `i` (not to its
    /// group).
    pub fn signal(&self, i: usize, signal: i32) {
        let signal = Signal::from_named_raw(signal)
            .unwrap_or_else(|| panic!("{signal} is not a named signal"));
        self.children[i].signal(signal).unwrap();
    }

    /// Waits for child `i` to exit; kills its group and fails the test if it takes longer
    /// than `timeout` (a deadlock guard).
    pub fn wait(&mut self, i: usize, timeout: Duration) -> Finished {
        let child = &mut self.children[i];
        if let Err(e) = child.wait_timeout(timeout) {
            child.kill();
            let pid = child.pid();
            panic!(
                "ladle (pid {pid}) did not finish within {timeout:?} ({e}): stderr {}",
                child.output().map(|o| o.stderr).unwrap_or_default()
            );
        }
        child.output().unwrap().into()
    }

    /// Kills every process this fixture started, with its process group (the socket file
    /// may be left behind; `ladle serve` replaces a stale one).
    pub fn kill_all(&mut self) {
        for child in &mut self.children {
            child.kill();
        }
    }
}

impl Drop for Fixture {
    /// Kills the processes before the directory they work in goes.
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Deadline of a wait on what the system reports ([`wait_until`] and the waits built on it):
/// a hang guard, never a speed assertion.
pub const REPORT_GUARD: Duration = Duration::from_secs(120);

/// How often a wait looks again (the poll interval of a deadline loop, not a wait for
/// something to happen).
const POLL: Duration = Duration::from_millis(20);

/// Calls `look` until it returns `Some`, looking every 20 ms at first and every 200 ms at
/// most, and returns what it found; fails
/// the test naming `what` (and `look`'s last `Err`, if it had one) after `timeout`.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut look: impl FnMut() -> Result<Option<T>, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    // Quick at first, then backing off to a fifth of a second: many looks spawn a process
    // (`ladle queue`, `squeue`, `tmux`), which on a two-core machine is load of its own.
    let mut poll = POLL;
    loop {
        match look() {
            Ok(Some(found)) => return found,
            Ok(None) => {}
            Err(e) => last = e,
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen within {timeout:?} (a hang guard){}",
            if last.is_empty() {
                String::new()
            } else {
                format!("; last: {last}")
            }
        );
        std::thread::sleep(poll);
        poll = (poll * 2).min(Duration::from_millis(200));
    }
}

/// Asks the producer on `socket` for its `Stats` until `ok` holds (e.g.
/// `|s| s.consumers.len() == 2`: both consumers joined), and returns those stats; fails the
/// test naming `what` and the last stats after `timeout`. A look that fails (the producer busy
/// or not up yet) is retried.
pub fn wait_for_stats(
    socket: &Path,
    timeout: Duration,
    what: &str,
    mut ok: impl FnMut(&FeedStats) -> bool,
) -> FeedStats {
    wait_until(what, timeout, || {
        match ladle_ring::protocol::feed_stats(socket, Duration::from_secs(10)) {
            Ok(stats) if ok(&stats) => Ok(Some(stats)),
            Ok(stats) => Err(format!("{stats:#?}")),
            Err(e) => Err(format!("no stats from {}: {e}", socket.display())),
        }
    })
}

/// Waits until something accepts connections on the Unix socket `socket` (a producer's, a
/// scheduler's); fails the test naming `what` after `timeout`.
pub fn wait_for_listener(socket: &Path, timeout: Duration, what: &str) {
    wait_until(
        what,
        timeout,
        || match std::os::unix::net::UnixStream::connect(socket) {
            Ok(_) => Ok(Some(())),
            Err(e) => Err(format!("{}: {e}", socket.display())),
        },
    );
}

/// Waits until the file `log` (a child's stderr from [`Fixture::spawn_logged`], a log the
/// child writes) has a line containing `needle`, and returns that line; fails the test with
/// the log's text after `timeout`.
pub fn wait_for_log_line(log: &Path, needle: &str, timeout: Duration) -> String {
    let what = format!("a line with {needle:?} in {}", log.display());
    wait_until(&what, timeout, || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        match text.lines().find(|l| l.contains(needle)) {
            Some(line) => Ok(Some(line.to_owned())),
            None => Err(format!("the log so far:\n{text}")),
        }
    })
}

/// Spawns a [`sim_sweep`] of two runs of `ladle consume` (batch sizes 16 and 32, 10 ms a
/// step) that go on until they are cancelled; returns the sweep's process index.
pub fn spawn_endless_sim_sweep(fx: &mut Fixture, data: &Path, out: &Path) -> usize {
    let ladle = ladle_bin().to_str().unwrap().to_owned();
    let mut args = sim_sweep(data, out);
    args.extend(
        [
            "--",
            &ladle,
            "consume",
            "--batch-size",
            "{16,32}",
            "--epochs",
            "100000",
            "--step-ms",
            "10",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fx.spawn(&args)
}

/// `ladle sweep` of 32×32 crops of `data` in a 2 MiB ring, on 2 simulated GPUs, with a
/// private scheduler under `out`, no settle time, a 100 ms telemetry tick (windows full in
/// 3 s) and runs measured after 1 s: what the tests that watch a sweep share.
/// Append the test's own options, then `--` and the run command.
pub fn sim_sweep(data: &Path, out: &Path) -> Vec<String> {
    let (data, out) = (data.to_str().unwrap(), out.to_str().unwrap());
    [
        "sweep",
        "--dataset",
        data,
        "--image-size",
        "32",
        "--ring-mib",
        "2",
        "--gpu",
        "sim",
        "--sim-gpus",
        "2",
        "--settle-s",
        "0",
        "--tick-ms",
        "100",
        "--measure-s",
        "1",
        "--private-scheduler",
        "--out",
        out,
    ]
    .map(String::from)
    .to_vec()
}

/// Runs a [`sim_sweep`] of `data` recorded into `rec` (`--record`, `--json`): two runs of
/// `ladle consume` (batch sizes 16 and 32, 3 epochs, 100 ms a step so that the 1 Hz
/// recording looks a few times), declaring 2 GiB each. Fails the test if the sweep fails.
pub fn recorded_sim_sweep(fx: &mut Fixture, data: &Path, out: &Path, rec: &Path) -> Finished {
    let ladle = ladle_bin().to_str().unwrap();
    let sweep = sim_sweep(data, out);
    let done = fx.run(
        &[
            &sweep.iter().map(String::as_str).collect::<Vec<_>>()[..],
            &[
                "--gpu-mem",
                "2GiB",
                "--record",
                rec.to_str().unwrap(),
                "--json",
                "--",
            ],
            &[ladle, "consume", "--batch-size", "{16,32}", "--epochs", "3"],
            &["--step-ms", "100"],
        ]
        .concat(),
        Duration::from_secs(300),
    );
    assert!(done.status.success(), "{}", done.stderr);
    done
}

/// Reads `epochs` epochs of `consumer`; returns each epoch's indices in delivery order.
pub fn read_epochs(consumer: &ladle_consumer::Consumer, epochs: usize) -> Vec<Vec<u64>> {
    (0..epochs)
        .map(|_| {
            let mut indices = Vec::new();
            for batch in consumer.epoch() {
                indices.extend_from_slice(batch.unwrap().indices());
            }
            indices
        })
        .collect()
}
