//! # ladle-tests: cross-crate, multi-process integration tests
//!
//! In `docs/ARCHITECTURE.md`'s picture this package tests the whole: it runs the real `ladle`
//! binary as real processes (a producer, several consumers) over real Unix sockets and real shared
//! memory, on real files. This library is the fixture the tests in `tests/` share: every test gets
//! its own temporary directory (so its own socket and dataset names, and tests run in parallel),
//! every child process is killed when the fixture drops, and every wait has a deadline that turns a
//! hang into a test failure (a watchdog, not a speed assertion).

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // a test fixture fails loudly

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

impl Finished {
    /// Stdout parsed as one JSON object per line.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect()
    }
}

/// A reader thread collecting one pipe of a child as it comes, so a chatty child never
/// blocks on a full pipe.
type Collector = std::thread::JoinHandle<String>;

fn collect(pipe: Option<impl Read + Send + 'static>) -> Collector {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            pipe.read_to_string(&mut text).ok();
        }
        text
    })
}

/// One test's world: a temporary directory and the processes started in it.
#[derive(Debug)]
pub struct Fixture {
    dir: tempfile::TempDir,
    children: Vec<Child>,
    output: Vec<Option<(Collector, Collector)>>,
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
            output: Vec::new(),
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

    /// Starts `ladle ARGS` with piped output; returns its handle.
    pub fn spawn(&mut self, args: &[&str]) -> usize {
        self.start(Command::new(ladle_bin()).args(args))
    }

    /// Starts `PROGRAM ARGS` (`argv`) with piped output, e.g. `ladle` under `prlimit`.
    pub fn spawn_program(&mut self, argv: &[&str]) -> usize {
        self.start(Command::new(argv[0]).args(&argv[1..]))
    }

    fn start(&mut self, command: &mut Command) -> usize {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ladle");
        self.output.push(Some((
            collect(child.stdout.take()),
            collect(child.stderr.take()),
        )));
        self.children.push(child);
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
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if let Some(status) = self.children[i].try_wait().unwrap() {
                panic!("ladle serve exited with {status}: {}", self.drain(i).1);
            }
            assert!(Instant::now() < deadline, "ladle serve did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
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
        self.children[i].id()
    }

    /// Sends `signal` (e.g. `libc`'s 9 for SIGKILL, 15 for SIGTERM) to child `i`.
    pub fn signal(&self, i: usize, signal: i32) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.pid(i).to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Everything child `i` wrote, once it has exited.
    fn drain(&mut self, i: usize) -> (String, String) {
        match self.output[i].take() {
            Some((out, err)) => (
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            ),
            None => (String::new(), String::new()),
        }
    }

    /// Waits for child `i` to exit; kills it and fails the test if it takes longer than
    /// `timeout` (a deadlock guard).
    pub fn wait(&mut self, i: usize, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.children[i].try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.children[i].kill();
                let _ = self.children[i].wait();
                let pid = self.pid(i);
                panic!(
                    "ladle (pid {pid}) did not finish within {timeout:?}: stderr {}",
                    self.drain(i).1
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (stdout, stderr) = self.drain(i);
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

impl Fixture {
    /// Kills every process this fixture started (the socket file may be left behind;
    /// `ladle serve` replaces a stale one).
    pub fn kill_all(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.kill_all();
    }
}
