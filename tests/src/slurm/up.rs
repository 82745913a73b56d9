//! Bringing a throw-away cluster up (config, munge, slurmctld, two slurmd), the watchdog that
//! takes it down when the test process dies, and the lock that keeps one cluster per instance.

use super::*;

/// Writes the configuration, starts munged, slurmctld and the two slurmds, and waits until
/// both nodes are idle.
pub(super) fn bring_up(
    running: &mut Running,
    [ctld_port, n1_port, n2_port]: [u16; 3],
    munge_uid: u32,
    munge_gid: u32,
) -> Result<(), SlurmError> {
    let dir = running.dir.clone();
    let conf = running.conf.clone();
    let host = short_hostname()?;
    // Daemons running as munge need to reach their files under the directory.
    set_mode(&dir, 0o755)?;
    for sub in ["logs", "ctld/state", "submit", "local/n1", "local/n2"] {
        create_dir(&dir.join(sub))?;
    }
    // munge: its directory and key owned by munge, the key 0400.
    let munge = dir.join("munge");
    create_dir(&munge)?;
    let key = munge.join("munge.key");
    let mut bytes = vec![0; 1024];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| setup(format!("cannot read /dev/urandom for the munge key: {e}")))?;
    write_file(&key, &bytes, 0o400)?;
    for path in [&munge, &key] {
        std::os::unix::fs::chown(path, Some(munge_uid), Some(munge_gid))
            .map_err(|e| setup(format!("cannot chown {} to munge: {e}", path.display())))?;
    }
    // Fake GPUs: character devices (a regular file is rejected).
    for node in NODES {
        let node_dir = dir.join(node);
        create_dir(&node_dir.join("spool"))?;
        for gpu in 0..GPUS_PER_NODE {
            let dev = node_dir.join(format!("nvidia{gpu}"));
            let dev = dev.display().to_string();
            let mut mknod = Command::new("mknod");
            mknod.args([dev.as_str(), "c", "1", "3"]);
            let done = run_bounded(&mut mknod, COMMAND_TIMEOUT)?;
            if !done.status.success() {
                return Err(setup(format!("mknod {dev} c 1 3 failed: {}", done.stderr)));
            }
        }
    }
    let d = dir.display();
    let socket = munge.join("munge.socket");
    let slurm_conf = format!(
        "# A throw-away two-node test cluster (ladle-tests, tests/src/slurm.rs).
ClusterName=ladletest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=1
EnforcePartLimits=ALL
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
SchedulerParameters=sched_interval=2,bf_interval=2
StateSaveLocation={d}/ctld/state
SlurmctldPidFile={d}/ctld/slurmctld.pid
SlurmctldLogFile={d}/ctld/slurmctld.log
SlurmdSpoolDir={d}/%n/spool
SlurmdPidFile={d}/%n/slurmd.pid
SlurmdLogFile={d}/%n/slurmd.log
GresTypes=gpu
NodeName=n1 NodeHostname={host}-n1 NodeAddr=127.0.0.1 Port={n1_port} CPUs={CPUS_PER_NODE} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN
NodeName=n2 NodeHostname={host}-n2 NodeAddr=127.0.0.1 Port={n2_port} CPUs={CPUS_PER_NODE} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN
PartitionName={PARTITION} Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
",
        socket = socket.display(),
    );
    write_file(&conf, slurm_conf.as_bytes(), 0o644)?;
    let last_gpu = GPUS_PER_NODE - 1;
    let gres_conf = format!(
        "AutoDetect=off
NodeName=n1 Name=gpu File={d}/n1/nvidia[0-{last_gpu}]
NodeName=n2 Name=gpu File={d}/n2/nvidia[0-{last_gpu}]
"
    );
    write_file(&dir.join("gres.conf"), gres_conf.as_bytes(), 0o644)?;

    let munge_s = |name: &str| munge.join(name).display().to_string();
    let mut munged = Command::new("munged");
    munged
        .arg("--foreground")
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--key-file={}", key.display()))
        .arg(format!("--pid-file={}", munge_s("munged.pid")))
        .arg(format!("--log-file={}", munge_s("munged.log")))
        .arg(format!("--seed-file={}", munge_s("munged.seed")))
        .uid(munge_uid)
        .gid(munge_gid);
    running.spawn_daemon("munged", munged)?;
    running.wait_for("munged's socket", Duration::from_secs(20), || {
        Ok(socket.exists())
    })?;
    let conf_s = conf.display().to_string();
    let mut slurmctld = Command::new("slurmctld");
    slurmctld.args(["-D", "-f", &conf_s]);
    running.spawn_daemon("slurmctld", slurmctld)?;
    for node in NODES {
        let mut slurmd = Command::new("slurmd");
        slurmd.args(["-D", "-f", &conf_s, "-N", node]);
        running.spawn_daemon(&format!("slurmd-{node}"), slurmd)?;
    }
    let submit = dir.join("submit");
    running.wait_for("both nodes idle", UP_TIMEOUT, || {
        let states = node_states(&conf, &submit)?;
        Ok(states.len() == NODES.len() && states.values().all(|s| s == "idle"))
    })
}

impl Running {
    /// Starts a daemon in the foreground, in its own process group, with `SLURM_CONF` set
    /// and no other `SLURM_*` variable, its output in `logs/NAME.out`.
    pub(super) fn spawn_daemon(
        &mut self,
        name: &str,
        mut command: Command,
    ) -> Result<(), SlurmError> {
        let log_path = self.dir.join("logs").join(format!("{name}.out"));
        let log = fs::File::create(&log_path)
            .map_err(|e| setup(format!("cannot create {}: {e}", log_path.display())))?;
        let err = log
            .try_clone()
            .map_err(|e| setup(format!("cannot clone {}: {e}", log_path.display())))?;
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SLURM_") {
                command.env_remove(key);
            }
        }
        let child = command
            .env("SLURM_CONF", &self.conf)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| setup(format!("cannot start {name}: {e}")))?;
        self.daemons.push((name.to_owned(), child));
        Ok(())
    }

    /// Waits until `ready` says yes, failing early when a daemon exits.
    pub(super) fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        ready: impl Fn() -> Result<bool, SlurmError>,
    ) -> Result<(), SlurmError> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            for (name, child) in &mut self.daemons {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(setup(format!("{name} exited ({status}) at start")));
                }
            }
            match ready() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(SlurmError::Deadline {
                    what: what.to_owned(),
                    timeout,
                    detail: last,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Cancels the jobs (bounded), has the watchdog kill every process of the cluster and
    /// remove its directory, waits for it, and reaps the daemons. Best effort, never panics.
    pub(super) fn stop(&mut self) {
        let submit = self.dir.join("submit");
        let ctld_alive = self
            .daemons
            .iter_mut()
            .any(|(name, c)| name == "slurmctld" && matches!(c.try_wait(), Ok(None)));
        if ctld_alive {
            if let Err(e) = cancel_all(&self.conf, &submit, Duration::from_secs(15)) {
                eprintln!("ladle-tests: Slurm jobs not cancelled at exit ({e}); killing them");
            }
        }
        // SIGTERM first, so that slurmctld reaps its slurmscriptd; then SIGKILL. The daemons
        // are still our unreaped children: their pids cannot have been reused.
        for (_, child) in &self.daemons {
            if let Some(daemon) = ladle_os::process::ProcessId::of(child.id()) {
                let _ = daemon.signal(Signal::TERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && self
                .daemons
                .iter_mut()
                .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
        {
            std::thread::sleep(POLL);
        }
        for (_, child) in &mut self.daemons {
            let _ = child.kill();
        }
        if let Some((mut watchdog, pipe)) = self.watchdog.take() {
            drop(pipe); // the watchdog's read returns: it sweeps
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(watchdog.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
            if matches!(watchdog.try_wait(), Ok(None)) {
                eprintln!("ladle-tests: the Slurm watchdog did not finish; sweeping here");
                let _ = watchdog.kill();
                let _ = watchdog.wait();
                let _ = sweep(&self.dir, &self.state_file);
            }
        }
        for (_, child) in &mut self.daemons {
            let _ = child.wait();
        }
        self.daemons.clear();
    }
}

/// The watchdog's script: `sh -c SCRIPT ladle-slurm-watchdog DIR STATE_FILE`. It waits for
/// the end of its stdin (the test process has exited, or closed the pipe to stop the
/// cluster), then kills with SIGKILL every process with `SLURM_CONF=DIR/slurm.conf` in its
/// environment or `DIR/` on its command line, again until none is left (killed daemons no
/// longer start new ones), removes DIR, and the state file if it still names DIR. With stdin
/// from `/dev/null` it sweeps at once.
pub(super) const WATCHDOG: &str = r#"trap '' HUP INT TERM PIPE
read -r _ || :
dir=$1 state=$2 conf=$1/slurm.conf me=$$
round=0
while [ "$round" -lt 100 ]; do
  found=
  pids=$( { grep -lsxzF "SLURM_CONF=$conf" /proc/[0-9]*/environ
            grep -lsF "$dir/" /proc/[0-9]*/cmdline; } | cut -d/ -f3 | sort -u)
  for p in $pids; do
    if [ "$p" != "$me" ] && kill -9 "$p" 2>/dev/null; then found=1; fi
  done
  [ -n "$found" ] || break
  round=$((round + 1))
  sleep 0.1
done
rm -rf "$dir"
if [ "$(cat "$state" 2>/dev/null)" = "$dir" ]; then rm -f "$state"; fi
"#;

/// Starts the watchdog for `dir`: its stdin is a pipe whose only writer is this process (the
/// write end is close-on-exec, so no child holds it).
pub(super) fn spawn_watchdog(
    dir: &Path,
    state_file: &Path,
) -> Result<(Child, ChildStdin), SlurmError> {
    let mut child = watchdog_command(dir, state_file)
        .stdin(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| setup(format!("cannot start the watchdog (sh): {e}")))?;
    let pipe = child
        .stdin
        .take()
        .ok_or_else(|| setup("the watchdog has no stdin pipe"))?;
    Ok((child, pipe))
}

pub(super) fn watchdog_command(dir: &Path, state_file: &Path) -> Command {
    let mut command = Command::new("sh");
    command
        .args(["-c", WATCHDOG, "ladle-slurm-watchdog"])
        .arg(dir)
        .arg(state_file)
        .env_remove("SLURM_CONF")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Kills every process of the cluster under `dir` and removes `dir` now (the watchdog's
/// script with an empty stdin), bounded.
pub(super) fn sweep(dir: &Path, state_file: &Path) -> Result<(), SlurmError> {
    let mut command = watchdog_command(dir, state_file);
    let done = run_bounded(&mut command, Duration::from_secs(60))?;
    if done.status.success() {
        Ok(())
    } else {
        Err(setup(format!(
            "cleaning up the old Slurm test cluster in {} failed ({})",
            dir.display(),
            done.status
        )))
    }
}

pub(super) fn register_stop_at_exit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `stop_at_exit` is a plain `extern "C" fn()` that catches every panic and
        // uses only statics, which live until the process ends; `atexit` may be called from
        // any thread.
        let rc = unsafe { libc::atexit(stop_at_exit) };
        if rc != 0 {
            eprintln!("ladle-tests: atexit failed; the Slurm watchdog will clean up at exit");
        }
    });
}

/// Holds, for the rest of this process's life, the lock of harness instance `instance`,
/// waiting (bounded) for another process that holds it.
pub(super) fn hold_instance_lock(instance: u16) -> Result<(), SlurmError> {
    static LOCK: OnceLock<fs::File> = OnceLock::new();
    let path = format!("/tmp/ladle-slurm-harness-{instance}.lock");
    let deadline = Instant::now() + INSTANCE_LOCK_TIMEOUT;
    let mut said = false;
    let file = loop {
        match ladle_os::process::lock_file(Path::new(&path)) {
            Ok(Some(file)) => break file,
            Ok(None) if Instant::now() < deadline => {
                if !said {
                    eprintln!(
                        "ladle-tests: waiting for another test binary's Slurm cluster to stop \
                         (it holds {path}; LADLE_SLURM_INSTANCE=N runs a second one)"
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            Ok(None) => {
                return Err(setup(format!(
                    "cannot lock {path}: another test binary's Slurm cluster is running"
                )));
            }
            Err(e) => return Err(setup(format!("cannot lock {path}: {e}"))),
        }
    };
    let _ = LOCK.set(file);
    Ok(())
}

/// The harness instance, from `LADLE_SLURM_INSTANCE` (0 when unset).
pub(super) fn instance() -> Result<u16, SlurmError> {
    match std::env::var("LADLE_SLURM_INSTANCE") {
        Err(_) => Ok(0),
        Ok(s) => s
            .parse()
            .ok()
            .filter(|n| *n < 100)
            .ok_or_else(|| setup(format!("LADLE_SLURM_INSTANCE={s:?} is not 0..=99"))),
    }
}
