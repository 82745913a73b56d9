//! Two users on one machine, each with a scheduler, a job and a feed: neither can see,
//! cancel or join the other's, not even once the other has opened its files to everyone, and
//! a second user's MPS is refused by name.
//!
//! The users are made in the test: two unprivileged uids nobody else uses, switched to with
//! `setpriv` (util-linux). That needs root; elsewhere the test says it skips.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ladle_tests::{Finished, Fixture, ladle_bin, wait_for_listener, wait_until};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(120);
const ALICE: u32 = 47_101;
const BOB: u32 = 47_102;

/// `setpriv` to become `uid` (and its own group, no others), or why the test cannot.
fn setpriv() -> Result<PathBuf, &'static str> {
    if rustix::process::geteuid().as_raw() != 0 {
        return Err("not root: cannot make two users");
    }
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or("no setpriv (util-linux) to switch users with")
}

struct Users {
    fx: Fixture,
    setpriv: String,
    ladle: String,
}

impl Users {
    /// A fixture for two users, or `None` (having said why the test skips) where they cannot
    /// be made.
    fn new() -> Option<Self> {
        match setpriv() {
            Ok(setpriv) => Some(Self {
                fx: Fixture::new(),
                setpriv: setpriv.to_str().unwrap().to_owned(),
                ladle: ladle_bin().to_str().unwrap().to_owned(),
            }),
            Err(why) => {
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    /// A home (mode 0700) for `uid` in the fixture's directory.
    fn home(&self, uid: u32) -> PathBuf {
        let home = self.fx.path().join(uid.to_string());
        if !home.exists() {
            std::fs::create_dir(&home).unwrap();
            std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        home
    }

    /// `argv` run as `uid`, with `HOME` its home and nothing of the test's ladle variables.
    fn argv(&self, uid: u32, argv: &[&str]) -> Vec<String> {
        let home = format!("HOME={}", self.home(uid).display());
        let uid = uid.to_string();
        let mut all: Vec<String> = [
            self.setpriv.as_str(),
            "--reuid",
            &uid,
            "--regid",
            &uid,
            "--clear-groups",
            "env",
            "-u",
            "LADLE_SCHEDULER_DIR",
            "-u",
            "XDG_STATE_HOME",
            "-u",
            "CUDA_VISIBLE_DEVICES",
            "-u",
            "SLURM_JOB_ID",
            &home,
        ]
        .map(str::to_owned)
        .to_vec();
        all.extend(argv.iter().map(|s| (*s).to_owned()));
        all
    }

    /// Starts `ladle ARGS` as `uid`.
    fn spawn(&mut self, uid: u32, args: &[&str]) -> usize {
        let mut argv = vec![self.ladle.clone()];
        argv.extend(args.iter().map(|s| (*s).to_owned()));
        let argv = self.argv(uid, &argv.iter().map(String::as_str).collect::<Vec<_>>());
        self.fx
            .spawn_program(&argv.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Runs `ladle ARGS` as `uid` to its end.
    fn run(&mut self, uid: u32, args: &[&str]) -> Finished {
        let i = self.spawn(uid, args);
        self.fx.wait(i, GUARD)
    }

    /// `uid`'s scheduler directory, the default one under its home.
    fn sched(&self, uid: u32) -> PathBuf {
        self.home(uid).join(".local/state/ladle/scheduler")
    }

    /// `ladle queue --json` as `uid` (its own default scheduler).
    fn queue(&mut self, uid: u32) -> Value {
        let done = self.run(uid, &["queue", "--json"]);
        assert!(done.status.success(), "{uid}: {}", done.stderr);
        serde_json::from_str(done.stdout.trim()).unwrap()
    }
}

/// Opens `path` and every folder above it up to the fixture to everyone, as a careless user
/// might: from then on only ladle's own peer check stands between the users.
fn open_to_everyone(fx: &Path, path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    let mut dir = path.parent();
    while let Some(d) = dir.filter(|d| d.starts_with(fx) && *d != fx) {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir = d.parent();
    }
}

#[test]
fn two_users_cannot_see_cancel_or_join_each_others_jobs_and_feeds() {
    let Some(mut u) = Users::new() else {
        return;
    };
    // Others may pass through the test's folder (to their homes and the dataset), no more.
    std::fs::set_permissions(u.fx.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let data = u.fx.dataset(20, 40, 36);
    let data = data.to_str().unwrap().to_owned();
    // Each user: a scheduler in its default place, a job, a feed.
    let mut job = [0; 2];
    for (k, uid) in [ALICE, BOB].into_iter().enumerate() {
        let sched = ["scheduler", "--gpu", "sim", "--sim-gpus", "1"];
        u.spawn(
            uid,
            &[&sched[..], &["--settle-s", "0", "--tick-ms", "100"]].concat(),
        );
        wait_for_listener(&u.sched(uid).join("scheduler.sock"), GUARD, "a scheduler");
        let done = u.run(uid, &["submit", "--json", "--", "sleep", "600"]);
        assert!(done.status.success(), "{uid}: {}", done.stderr);
        let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
        job[k] = v["id"].as_u64().unwrap();
        let socket = u.home(uid).join("feed.sock");
        let socket = socket.to_str().unwrap().to_owned();
        let feed = [
            "serve",
            "--dataset",
            &data,
            "--socket",
            &socket,
            "--image-size",
            "32",
            "--ring-mib",
            "2",
            "--threads",
            "1",
        ];
        u.spawn(uid, &feed);
        wait_for_listener(Path::new(&socket), GUARD, "a feed");
    }
    // Each sees its own job only, running under its own uid.
    for (k, uid) in [ALICE, BOB].into_iter().enumerate() {
        let id = job[k];
        let q = wait_until("the job running", GUARD, || {
            let q = u.queue(uid);
            let running = (q["jobs"].as_array().unwrap().iter())
                .any(|j| j["id"] == id && j["state"] == "running");
            Ok::<_, String>(running.then_some(q))
        });
        assert_eq!(q["jobs"].as_array().unwrap().len(), 1, "{uid}: {q}");
    }
    let alice_sched = u.sched(ALICE);
    let alice_dir = alice_sched.to_str().unwrap().to_owned();
    let alice_feed = u.home(ALICE).join("feed.sock");
    let attempts = |u: &mut Users| -> Vec<(&'static str, Finished)> {
        let id = job[0].to_string();
        let feed = alice_feed.to_str().unwrap().to_owned();
        vec![
            ("queue", u.run(BOB, &["queue", "--dir", &alice_dir])),
            ("cancel", u.run(BOB, &["cancel", "--dir", &alice_dir, &id])),
            (
                "submit",
                u.run(BOB, &["submit", "--dir", &alice_dir, "--", "true"]),
            ),
            (
                "consume",
                u.run(
                    BOB,
                    &[
                        "consume",
                        "--socket",
                        &feed,
                        "--batch-size",
                        "4",
                        "--epochs",
                        "1",
                    ],
                ),
            ),
        ]
    };
    // Bob cannot even reach Alice's sockets: her home is hers.
    for (what, done) in attempts(&mut u) {
        assert!(
            !done.status.success(),
            "Bob's {what} worked: {}",
            done.stdout
        );
        assert!(
            done.stderr.contains("ermission denied") && done.stderr.contains(&ALICE.to_string()),
            "Bob's {what}: {}",
            done.stderr
        );
    }
    // Alice opens everything to everyone: ladle's peer check still refuses Bob, by uid.
    open_to_everyone(u.fx.path(), &alice_sched.join("scheduler.sock"), 0o777);
    open_to_everyone(u.fx.path(), &alice_feed, 0o777);
    for (what, done) in attempts(&mut u) {
        assert!(
            !done.status.success(),
            "Bob's {what} worked: {}",
            done.stdout
        );
        assert!(
            done.stderr.contains(&BOB.to_string()),
            "Bob's {what} was not refused by uid: {}",
            done.stderr
        );
    }
    // Nothing of Alice's changed: her job still runs, her feed served nobody.
    let q = u.queue(ALICE);
    let jobs = q["jobs"].as_array().unwrap();
    assert!(jobs.len() == 1 && jobs[0]["state"] == "running", "{q}");
    let mine = u.run(
        ALICE,
        &[
            "consume",
            "--socket",
            alice_feed.to_str().unwrap(),
            "--batch-size",
            "4",
            "--epochs",
            "1",
            "--json",
        ],
    );
    assert!(
        mine.status.success(),
        "Alice's own consumer: {}",
        mine.stderr
    );
    // Jobs outlive their scheduler (the next one adopts them): each user cancels their own.
    for (k, uid) in [ALICE, BOB].into_iter().enumerate() {
        let done = u.run(uid, &["cancel", &job[k].to_string()]);
        assert!(done.status.success(), "{uid}: {}", done.stderr);
    }
}

#[test]
fn a_second_users_mps_is_refused_naming_the_first_ones_daemon() {
    let Some(mut u) = Users::new() else {
        return;
    };
    std::fs::set_permissions(u.fx.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    // Alice's MPS control daemon: a program of that name that only waits.
    let bin = u.fx.path().join("alice-bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = bin.join("nvidia-cuda-mps-control");
    std::fs::copy("/bin/sleep", &daemon).unwrap();
    let argv = u.argv(ALICE, &[daemon.to_str().unwrap(), "600"]);
    let alice =
        u.fx.spawn_program(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    let alice_pid = u.fx.pid(alice);
    // setpriv execs env, which execs the daemon: same pid, once it is there.
    wait_until("Alice's MPS daemon", GUARD, || {
        let cmdline = std::fs::read(format!("/proc/{alice_pid}/cmdline")).unwrap_or_default();
        let started = String::from_utf8_lossy(&cmdline).starts_with(daemon.to_str().unwrap());
        Ok::<_, String>(started.then_some(()))
    });
    // Bob's MPS control program, which must never run: it would leave this file.
    let bob_bin = u.home(BOB).join("bin");
    let ran = u.home(BOB).join("control-ran");
    let argv = u.argv(BOB, &["mkdir", bob_bin.to_str().unwrap()]);
    let i =
        u.fx.spawn_program(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(u.fx.wait(i, GUARD).status.success());
    let control = bob_bin.join("nvidia-cuda-mps-control");
    std::fs::write(
        &control,
        format!("#!/bin/sh\necho \"$@\" >> {}\n", ran.display()),
    )
    .unwrap();
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "PATH={}:{}",
        bob_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = u.home(BOB).join("sched");
    let argv = u.argv(
        BOB,
        &[
            &path,
            &u.ladle.clone(),
            "scheduler",
            "--dir",
            dir.to_str().unwrap(),
            "--gpu",
            "sim",
            "--mps",
            "on",
        ],
    );
    let i =
        u.fx.spawn_program(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    let done = u.fx.wait(i, GUARD);
    assert!(
        !done.status.success(),
        "Bob's scheduler started beside Alice's MPS"
    );
    assert!(
        done.stderr.contains(&format!("pid {alice_pid}"))
            && done.stderr.contains(&format!("uid {ALICE}"))
            && done.stderr.contains("--mps off"),
        "{}",
        done.stderr
    );
    assert!(!ran.exists(), "Bob's MPS control program ran");
}
