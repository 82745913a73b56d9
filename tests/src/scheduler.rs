//! The scheduler's test fixture: `ladle scheduler` on simulated GPUs in a test's own
//! directory, and `ladle submit`/`queue` against it (`tests/tests/scheduler*.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::{Fixture, wait_for_listener, wait_until};

/// Deadlock guard for anything we wait on; never a speed assertion.
pub const GUARD: Duration = Duration::from_secs(120);

/// A `ladle scheduler` on simulated GPUs in its own fixture.
pub struct Scheduler {
    /// The test's world: its directory and processes.
    pub fx: Fixture,
    /// The daemon's handle in `fx`.
    pub daemon: usize,
}

impl Scheduler {
    /// A daemon on `gpus` simulated GPUs of 40 GiB, no settle lock (so tests do not wait).
    /// Returns once every GPU's telemetry window is full (no GPU takes a collocated job
    /// before), 3 s at the tests' 100 ms tick.
    pub fn start(gpus: u32, extra: &[&str]) -> Self {
        let mut s = Self::start_unchecked(gpus, extra);
        wait_until("every GPU's telemetry window full", GUARD, || {
            let q = s.queue();
            let gpus = q["gpus"].as_array().unwrap();
            if gpus.iter().all(|g| g["window_full"] == true) {
                Ok(Some(()))
            } else {
                Err(q.to_string())
            }
        });
        s
    }

    /// A daemon as [`Scheduler::start`] without waiting for its windows.
    pub fn start_unchecked(gpus: u32, extra: &[&str]) -> Self {
        let mut fx = Fixture::new();
        let daemon = spawn_daemon(&mut fx, gpus, extra);
        Self { fx, daemon }
    }

    /// The daemon's state directory.
    pub fn dir(&self) -> PathBuf {
        self.fx.path().join("sched")
    }

    /// [`Scheduler::dir`] as an argument.
    pub fn dir_arg(&self) -> String {
        self.dir().to_str().unwrap().to_owned()
    }

    /// A path `name` in the fixture's directory, as an argument.
    pub fn file(&self, name: &str) -> String {
        self.fx.path().join(name).to_str().unwrap().to_owned()
    }

    /// `ladle submit ARGS -- sh -c SCRIPT`; returns the job id.
    pub fn submit(&mut self, args: &[&str], script: &str) -> u64 {
        let dir = self.dir_arg();
        let mut all = vec!["submit", "--dir", &dir, "--json"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "sh", "-c", script]);
        let done = self.fx.run(&all, GUARD);
        assert!(done.status.success(), "submit failed: {}", done.stderr);
        let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
        v["id"].as_u64().unwrap()
    }

    /// `ladle queue --json`.
    pub fn queue(&mut self) -> Value {
        let dir = self.dir_arg();
        let done = self.fx.run(&["queue", "--dir", &dir, "--json"], GUARD);
        assert!(done.status.success(), "queue failed: {}", done.stderr);
        serde_json::from_str(done.stdout.trim()).unwrap()
    }

    /// Job `id` as `ladle queue --json` shows it.
    pub fn job(&mut self, id: u64) -> Value {
        let q = self.queue();
        q["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no job {id} in {q}"))
    }

    /// Waits until job `id` is in one of `states`; returns it.
    pub fn wait_for(&mut self, id: u64, states: &[&str]) -> Value {
        wait_until(&format!("job {id} in {states:?}"), GUARD, || {
            let job = self.job(id);
            if states.iter().any(|s| job["state"] == *s) {
                Ok(Some(job))
            } else {
                Err(job.to_string())
            }
        })
    }
}

/// Starts `ladle scheduler` on `gpus` simulated GPUs of 40 GiB in `fx`'s directory (no settle
/// lock, a 100 ms tick unless `extra` says otherwise); returns once it listens.
pub fn spawn_daemon(fx: &mut Fixture, gpus: u32, extra: &[&str]) -> usize {
    let dir = fx.path().join("sched");
    let socket = dir.join("scheduler.sock");
    let _ = std::fs::remove_file(&socket);
    let gpus = gpus.to_string();
    let dir_s = dir.to_str().unwrap().to_owned();
    let mut args = vec![
        "scheduler",
        "--dir",
        &dir_s,
        "--gpu",
        "sim",
        "--sim-gpus",
        &gpus,
        "--sim-gpu-mem",
        "40GiB",
    ];
    if !extra.contains(&"--settle-s") {
        args.extend_from_slice(&["--settle-s", "0"]);
    }
    // Telemetry windows (30 samples) fill in 3 s instead of 30.
    if !extra.contains(&"--tick-ms") {
        args.extend_from_slice(&["--tick-ms", "100"]);
    }
    args.extend_from_slice(extra);
    let i = fx.spawn(&args);
    wait_for_listener(&socket, GUARD, "ladle scheduler coming up");
    i
}

/// The state of job `id` in a `ladle queue --json` answer (null if it is not there).
pub fn state_in(queue: &Value, id: u64) -> Value {
    queue["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id)
        .map_or(Value::Null, |j| j["state"].clone())
}

/// The lines of the file at `path` (none if it is missing).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `ladle scheduler --gpu sim --sim-gpus 3 EXTRA` in the environment `env` (and nothing of
/// the test's own GPU or Slurm variables), as a [`Scheduler`].
pub fn scheduler_given(env: &[&str], extra: &[&str]) -> Scheduler {
    let mut fx = Fixture::new();
    let daemon = spawn_given(&mut fx, env, extra);
    Scheduler { fx, daemon }
}

/// [`scheduler_given`]'s daemon, in `fx`'s directory (a restart finds its journal there).
pub fn spawn_given(fx: &mut Fixture, env: &[&str], extra: &[&str]) -> usize {
    let dir = fx.path().join("sched");
    let _ = std::fs::remove_file(dir.join("scheduler.sock"));
    let dir_s = dir.to_str().unwrap().to_owned();
    let mut argv = vec![
        "env",
        "-u",
        "CUDA_VISIBLE_DEVICES",
        "-u",
        "CUDA_DEVICE_ORDER",
        "-u",
        "SLURM_JOB_ID",
        "-u",
        "SLURM_JOB_GPUS",
        "-u",
        "SLURM_STEP_GPUS",
    ];
    argv.extend(env);
    argv.extend([
        crate::ladle_bin().to_str().unwrap(),
        "scheduler",
        "--dir",
        &dir_s,
        "--gpu",
        "sim",
        "--sim-gpus",
        "3",
        "--settle-s",
        "0",
        "--tick-ms",
        "100",
    ]);
    argv.extend(extra);
    let daemon = fx.spawn_program(&argv);
    wait_for_listener(
        &dir.join("scheduler.sock"),
        GUARD,
        "ladle scheduler coming up",
    );
    daemon
}

/// `ladle submit --json [ARGS] -- sh -c SCRIPT` in the test's environment plus `env`: the job's
/// id, or what `ladle submit` printed on stderr when it refused.
pub fn submit_in(
    s: &mut Scheduler,
    env: &[&str],
    args: &[&str],
    script: &str,
) -> Result<u64, String> {
    let dir = s.dir_arg();
    let ladle = crate::ladle_bin().to_str().unwrap().to_owned();
    let mut argv = vec!["env", "-u", "CUDA_VISIBLE_DEVICES", "-u", "SLURM_JOB_ID"];
    argv.extend(env);
    argv.extend([ladle.as_str(), "submit", "--dir", &dir, "--json"]);
    argv.extend(args);
    argv.extend(["--", "sh", "-c", script]);
    let i = s.fx.spawn_program(&argv);
    let done = s.fx.wait(i, GUARD);
    if !done.status.success() {
        return Err(done.stderr);
    }
    let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
    Ok(v["id"].as_u64().unwrap())
}

/// A scenario file (`--sim-scenario`) in a directory of its own, kept while the test runs.
pub fn scenario(json: &str) -> (Fixture, String) {
    let fx = Fixture::new();
    let path = fx.path().join("scenario.json");
    std::fs::write(&path, json).unwrap();
    let path = path.to_str().unwrap().to_owned();
    (fx, path)
}

/// The GPUs job `id` runs on, once it runs.
pub fn gpus_of(s: &mut Scheduler, id: u64) -> Value {
    s.wait_for(id, &["running", "succeeded"])["gpus"].clone()
}
