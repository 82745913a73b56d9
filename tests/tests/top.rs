//! `ladle top` under tmux (issue 16): a real sweep on simulated GPUs, watched live over the
//! scheduler's and the feed's sockets, read back with `capture-pane`, quit with `q`.
//!
//! Skipped, with a message, where `tmux` is not installed (`scripts/check` installs it).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ladle_tests::{Fixture, ladle_bin, spawn_endless_sim_sweep, wait_until};

/// Deadlock guard for each wait (not a speed assertion).
const GUARD: Duration = Duration::from_secs(120);

/// A tmux server of its own (`tmux -L NAME`), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// `None` where tmux is not installed.
    fn new() -> Option<Self> {
        let found = Command::new("tmux").arg("-V").output();
        if !found.is_ok_and(|o| o.status.success()) {
            return None;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Some(Self {
            socket: format!("ladle-top-test-{}-{nanos}", std::process::id()),
        })
    }

    /// `tmux -L SOCKET -f /dev/null ARGS` (no user configuration).
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Single-quoted for `sh`.
fn quoted(path: &Path) -> String {
    format!("'{}'", path.to_str().unwrap().replace('\'', r"'\''"))
}

#[test]
fn ladle_top_shows_a_live_sweep_under_tmux_survives_its_end_and_quits_on_q() {
    let Some(tmux) = Tmux::new() else {
        eprintln!("skipped: tmux not installed (scripts/check installs it)");
        return;
    };
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 80, 60);
    let out = fx.path().join("sweep");
    let ladle = ladle_bin().to_str().unwrap();
    // Runs that go on until cancelled, stepping slowly enough to be watched.
    let sweep = spawn_endless_sim_sweep(&mut fx, &data, &out);
    let dir: PathBuf = out.join("scheduler");
    wait_until("the sweep's scheduler answering", GUARD, || {
        let answering = dir.join("scheduler.sock").exists()
            && Command::new(ladle)
                .args(["queue", "--dir", dir.to_str().unwrap()])
                .output()
                .is_ok_and(|o| o.status.success());
        if answering {
            Ok(Some(()))
        } else {
            Err(format!("no socket in {}", dir.display()))
        }
    });

    let status = fx.path().join("top-status");
    let command = format!(
        "{} top --dir {}; echo \"exit=$?\" > {}",
        quoted(ladle_bin()),
        quoted(&dir),
        quoted(&status)
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "200",
        "-y",
        "50",
        &command,
    ]);
    assert!(
        started.status.success(),
        "tmux new-session: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let capture = || {
        let pane = tmux.run(&["capture-pane", "-p", "-t", "top"]);
        String::from_utf8_lossy(&pane.stdout).into_owned()
    };
    // Both runs, a GPU row and the feed's line with a consumer that has read something.
    let shows_the_sweep = |screen: &str| {
        screen.contains("run-00")
            && screen.contains("run-01")
            && screen.contains("sim-gpu-0")
            && screen.contains("Feed sweep-")
            && screen.contains("running")
    };
    wait_until("ladle top showing the sweep", GUARD, || {
        let screen = capture();
        if shows_the_sweep(&screen) {
            Ok(Some(()))
        } else {
            Err(screen)
        }
    });
    // Live: a later frame shows more published samples than an earlier one.
    let published = |screen: &str| -> Option<u64> {
        let after = screen.split("published ").nth(1)?;
        after.split_whitespace().next()?.parse().ok()
    };
    let first = published(&capture()).unwrap_or_else(|| panic!("{}", capture()));
    wait_until("the view refreshing", GUARD, || {
        let screen = capture();
        if published(&screen).is_some_and(|n| n > first) {
            Ok(Some(()))
        } else {
            Err(screen)
        }
    });
    let screen = capture();
    println!("{screen}");
    assert!(screen.contains("ladle top"), "{screen}");
    assert!(screen.contains("policy ladle"), "{screen}");
    assert!(screen.contains("consumer"), "{screen}");
    let gpu_row = screen.lines().find(|l| l.contains("sim-gpu-0")).unwrap();
    assert!(
        gpu_row.contains('%'),
        "a GPU row has its memory share: {gpu_row}"
    );
    let run_row = screen
        .lines()
        .find(|l| l.contains("run-00") && l.contains("running"))
        .unwrap_or_else(|| panic!("no running run-00 job row in\n{screen}"));
    assert!(run_row.contains("sweep-"), "{run_row}");

    // The sweep ends under the view's eyes: its scheduler and feed stop answering, and the
    // view says so instead of crashing or freezing.
    fx.signal(sweep, 15);
    let done = fx.wait(sweep, GUARD);
    assert!(done.stderr.contains("cancel"), "{}", done.stderr);
    wait_until("ladle top reporting the scheduler gone", GUARD, || {
        let screen = capture();
        if screen.contains("not answering") && screen.contains("scheduler: ") {
            Ok(Some(()))
        } else {
            Err(screen)
        }
    });
    println!("{}", capture());

    let sent = tmux.run(&["send-keys", "-t", "top", "q"]);
    assert!(sent.status.success());
    wait_until("ladle top quitting on q", GUARD, || {
        if std::fs::read_to_string(&status).is_ok_and(|s| s.contains("exit=")) {
            Ok(Some(()))
        } else {
            Err(capture())
        }
    });
    assert_eq!(
        std::fs::read_to_string(&status).unwrap().trim(),
        "exit=0",
        "ladle top did not quit cleanly"
    );
    wait_until("the tmux session ending with its command", GUARD, || {
        if tmux.run(&["has-session", "-t", "top"]).status.success() {
            Err(capture())
        } else {
            Ok(Some(()))
        }
    });
}

#[test]
fn ladle_top_without_a_scheduler_or_feed_names_the_socket_it_tried() {
    let mut fx = Fixture::new();
    let dir = fx.path().join("no-scheduler");
    let done = fx.run(&["top", "--dir", dir.to_str().unwrap()], GUARD);
    assert!(!done.status.success());
    let socket = dir.join("scheduler.sock");
    assert!(
        done.stderr.contains(socket.to_str().unwrap()),
        "{}",
        done.stderr
    );
}
