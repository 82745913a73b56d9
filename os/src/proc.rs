//! Child processes in their own process group. A [`Proc`] is a child that
//!
//! - runs in its own process group (`setpgid(0, 0)` before `exec`, through
//!   [`CommandExt::process_group`]), so that killing it kills whatever it started too, and a
//!   Ctrl-C on the terminal reaches only the parent, which decides what to stop;
//! - has its stdout and stderr read on two threads as they come, so a chatty child never
//!   stalls on a full pipe; [`Proc::output`] returns both once it has exited;
//! - is waited for with a deadline, a stop flag, or both ([`Proc::wait_until`]), so a hang is
//!   an error, never a hung parent;
//! - is killed with its whole group (`SIGKILL`) and reaped when dropped before it was waited
//!   for: an early return, a panicking test or a Ctrl-C leaves nothing running.
//!
//! A group whose leader has already been waited for is never signalled: its id may belong to
//! another process by then.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::process::Signal;

/// How often a wait looks whether the child has exited.
const POLL: Duration = Duration::from_millis(20);

/// Why starting, waiting for or signalling a child failed. Each variant names the child (the
/// name given to [`Proc::spawn`]) and, once it runs, its pid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcError {
    /// The program could not be started (not found, not executable, out of processes).
    #[error("cannot start {name}: {source}")]
    Spawn {
        /// The child's name.
        name: String,
        /// What `spawn` said.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for the child or signalling it failed.
    #[error("cannot {action} {name} (pid {pid}): {source}")]
    Os {
        /// The child's name.
        name: String,
        /// Its pid.
        pid: u32,
        /// What was tried: "wait for", "signal".
        action: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The deadline passed before the child exited; it is still running.
    #[error("{name} (pid {pid}) did not exit in time")]
    Deadline {
        /// The child's name.
        name: String,
        /// Its pid.
        pid: u32,
    },
    /// The stop flag was set before the child exited; it is still running.
    #[error("interrupted while waiting for {name} (pid {pid})")]
    Stopped {
        /// The child's name.
        name: String,
        /// Its pid.
        pid: u32,
    },
}

/// How a child ended and everything it wrote.
#[derive(Debug)]
pub struct Output {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it wrote on stdout (invalid UTF-8 replaced).
    pub stdout: String,
    /// Everything it wrote on stderr (invalid UTF-8 replaced).
    pub stderr: String,
}

/// A child process leading its own process group, its output collected on threads; the
/// group is killed when this is dropped before the child was waited for.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    /// Set once the child has been reaped; from then on its pid is not ours to signal.
    status: Option<ExitStatus>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

/// Reads `pipe` to its end on a thread.
fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        // A read error ends the output early; what was read is kept.
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

impl Proc {
    /// Starts `command` in a new process group with stdin from `/dev/null` and stdout and
    /// stderr piped to this process, read as they come. `name` is how errors refer to it.
    ///
    /// # Errors
    /// [`ProcError::Spawn`] when the program cannot be started.
    pub fn spawn(name: impl Into<String>, command: &mut Command) -> Result<Self, ProcError> {
        let name = name.into();
        let spawned = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(source) => return Err(ProcError::Spawn { name, source }),
        };
        let stdout = child.stdout.take().map(collect);
        let stderr = child.stderr.take().map(collect);
        Ok(Self {
            name,
            child,
            status: None,
            stdout,
            stderr,
        })
    }

    /// The name given to [`Proc::spawn`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's pid, which is also its process group's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn os_error(&self, action: &'static str, source: std::io::Error) -> ProcError {
        ProcError::Os {
            name: self.name.clone(),
            pid: self.pid(),
            action,
            source,
        }
    }

    /// The exit status if the child has exited (reaping it), without blocking.
    ///
    /// # Errors
    /// [`ProcError::Os`] when `waitpid` fails.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, ProcError> {
        if self.status.is_none() {
            self.status = self
                .child
                .try_wait()
                .map_err(|e| self.os_error("wait for", e))?;
        }
        Ok(self.status)
    }

    /// Waits for the child to exit, looking every 20 ms, until `deadline` passes or `stop` is
    /// set (e.g. by a signal handler), whichever comes first; `None` for either means no
    /// limit of that kind. The child keeps running when the wait gives up.
    ///
    /// # Errors
    /// [`ProcError::Deadline`] or [`ProcError::Stopped`] when the wait gave up,
    /// [`ProcError::Os`] when `waitpid` fails.
    pub fn wait_until(
        &mut self,
        deadline: Option<Instant>,
        stop: Option<&AtomicBool>,
    ) -> Result<ExitStatus, ProcError> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            let (name, pid) = (self.name.clone(), self.pid());
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Err(ProcError::Stopped { name, pid });
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(ProcError::Deadline { name, pid });
            }
            std::thread::sleep(POLL);
        }
    }

    /// [`Proc::wait_until`] `timeout` from now, with no stop flag.
    ///
    /// # Errors
    /// As [`Proc::wait_until`].
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<ExitStatus, ProcError> {
        self.wait_until(Some(Instant::now() + timeout), None)
    }

    /// Waits for the child to exit (without a limit: bound it with [`Proc::wait_until`]
    /// first) and for its output to end, and returns both. The output is handed out once: a
    /// second call returns the status with empty output.
    ///
    /// # Errors
    /// [`ProcError::Os`] when `waitpid` fails.
    pub fn output(&mut self) -> Result<Output, ProcError> {
        let status = match self.status {
            Some(status) => status,
            None => {
                let status = self
                    .child
                    .wait()
                    .map_err(|e| self.os_error("wait for", e))?;
                *self.status.insert(status)
            }
        };
        let join = |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok());
        Ok(Output {
            status,
            stdout: join(self.stdout.take()).unwrap_or_default(),
            stderr: join(self.stderr.take()).unwrap_or_default(),
        })
    }

    /// Sends `signal` to the child alone (e.g. SIGTERM, to let it shut down and report);
    /// nothing once it has been waited for.
    ///
    /// # Errors
    /// [`ProcError::Os`] when `kill` fails.
    pub fn signal(&self, signal: Signal) -> Result<(), ProcError> {
        if self.status.is_some() {
            return Ok(());
        }
        rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), signal)
            .map_err(|e| self.os_error("signal", e.into()))
    }

    /// Sends `signal` to every process in the child's group; nothing once the child has been
    /// waited for.
    ///
    /// # Errors
    /// [`ProcError::Os`] when `kill` fails.
    pub fn signal_group(&self, signal: Signal) -> Result<(), ProcError> {
        if self.status.is_some() {
            return Ok(());
        }
        let group = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process_group(group, signal)
            .map_err(|e| self.os_error("signal", e.into()))
    }

    /// Kills the child's whole group with SIGKILL and reaps the child, unless it has already
    /// been waited for. Best effort, never fails: what cannot be killed is left.
    pub fn kill(&mut self) {
        if self.status.is_some() {
            return;
        }
        if self.signal_group(Signal::KILL).is_err() {
            let _ = self.child.kill();
        }
        self.status = self.child.wait().ok();
    }
}

/// Starts `command` as the leader of a new session (`setsid`), with the stdio it was given:
/// no terminal, no process group of its starter, so that a signal to the starter's group (a
/// Ctrl-C, a job launcher killing a worker's group) does not reach it. It is not killed when
/// the returned child is dropped: this is how a process that must outlive its starter (a feed
/// started on demand) is started. Reap it, or let it be reparented when the starter exits.
///
/// # Errors
/// The spawn's error (the program missing, say).
pub fn spawn_session(command: &mut Command) -> std::io::Result<std::process::Child> {
    // SAFETY: the closure runs in the child between fork and exec and calls only setsid(2),
    // which is async-signal-safe, allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    command.spawn()
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Proc {
        Proc::spawn("sh", Command::new("sh").args(["-c", script])).unwrap()
    }

    /// Whether `pid` is running (not gone, not a zombie).
    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("State:") && !l.contains("zombie"))
        })
    }

    #[test]
    fn a_session_child_leads_its_own_session_and_group() {
        let child = spawn_session(
            Command::new("sh")
                .args(["-c", "exec cat /proc/self/stat"])
                .stdout(Stdio::piped()),
        )
        .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let stat = String::from_utf8(out.stdout).unwrap();
        // After the name's last ')': state, ppid, pgrp, session.
        let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        assert_eq!(rest[2], pid.to_string(), "its own group: {stat}");
        assert_eq!(rest[3], pid.to_string(), "its own session: {stat}");
    }

    #[test]
    fn wait4_reports_the_cpu_of_a_child_and_its_waited_for_children() {
        // The busy loop runs in a grandchild the child waits for: its CPU counts too.
        let mut child = Command::new("sh")
            .args([
                "-c",
                "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; exit 3",
            ])
            .spawn()
            .unwrap();
        let (status, cpu) = loop {
            if let Some(done) = try_wait_with_cpu(child.id()).unwrap() {
                break done;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(3));
        assert!(cpu > Duration::from_millis(20), "{cpu:?}");
        // Reaped: a second look, or std's own wait, finds no child.
        let again = try_wait_with_cpu(child.id()).unwrap_err();
        assert_eq!(again.raw_os_error(), Some(libc::ECHILD));
        assert!(child.try_wait().is_err());
        // Not our child at all.
        assert_eq!(
            try_wait_with_cpu(1).unwrap_err().raw_os_error(),
            Some(libc::ECHILD)
        );
    }

    #[test]
    fn a_child_writing_more_than_a_pipe_holds_finishes_and_all_its_output_is_kept() {
        // 1 MiB on each stream: far more than a 64 KiB pipe.
        let mut p = sh("head -c 1048576 /dev/zero | tr '\\0' a; head -c 1048576 /dev/zero >&2");
        p.wait_timeout(Duration::from_secs(60)).unwrap();
        let out = p.output().unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), 1 << 20);
        assert!(out.stdout.bytes().all(|b| b == b'a'));
        assert_eq!(out.stderr.len(), 1 << 20);
    }

    #[test]
    fn a_child_leads_its_own_process_group() {
        let p = sh("sleep 600");
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap();
        // Field 5, the process group, is the third after the parenthesised command name.
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        let group: u32 = after.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert_eq!(group, p.pid());
        assert_ne!(group, std::process::id());
    }

    #[test]
    fn dropping_a_proc_kills_what_its_child_started_too() {
        let dir = std::env::temp_dir().join(format!("ladle-os-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("grandchild.pid");
        let script = format!(
            "sleep 600 & echo $! > {}.tmp; mv {0}.tmp {0}; wait",
            file.display()
        );
        let p = sh(&script);
        let deadline = Instant::now() + Duration::from_secs(60);
        let grandchild: u32 = loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                break text.trim().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the shell never started sleep");
            std::thread::sleep(POLL);
        };
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(running(grandchild));
        drop(p);
        // The grandchild is reparented and reaped by init: wait for it to go (a deadline
        // against a hang, not a speed check).
        let deadline = Instant::now() + Duration::from_secs(60);
        while running(grandchild) {
            assert!(
                Instant::now() < deadline,
                "sleep {grandchild} outlived the drop"
            );
            std::thread::sleep(POLL);
        }
    }

    #[test]
    fn a_wait_gives_up_at_its_deadline_or_stop_flag_and_leaves_the_child_running() {
        let mut p = sh("sleep 600");
        let err = p.wait_timeout(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, ProcError::Deadline { .. }), "{err}");
        let stop = AtomicBool::new(true);
        let err = p.wait_until(None, Some(&stop)).unwrap_err();
        assert!(matches!(err, ProcError::Stopped { .. }), "{err}");
        assert!(err.to_string().contains("sh (pid "), "{err}");
        assert!(p.try_wait().unwrap().is_none());
        p.kill();
        assert!(p.try_wait().unwrap().is_some());
    }

    #[test]
    fn a_signal_reaches_the_child_and_is_seen_in_its_status() {
        use std::os::unix::process::ExitStatusExt;
        let mut p = sh("sleep 600");
        p.signal(Signal::TERM).unwrap();
        let status = p.wait_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(status.signal(), Some(15));
        // Once waited for, signals are not sent (the pid may be reused).
        p.signal(Signal::KILL).unwrap();
    }

    #[test]
    fn a_program_that_does_not_exist_is_an_error_naming_it() {
        let err =
            Proc::spawn("nonesuch", &mut Command::new("/nonexistent/ladle-nonesuch")).unwrap_err();
        assert!(
            err.to_string().starts_with("cannot start nonesuch"),
            "{err}"
        );
    }
}

/// Whose CPU time [`cpu_time`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// This process, all its threads.
    Myself,
    /// Every child waited for so far (and theirs).
    Children,
}

/// Reaps child `pid` if it has exited, without blocking, and returns its exit status and its
/// CPU time (user + system, its own and that of every descendant it waited for), from
/// `wait4`. `None` while it runs. For a child spawned by [`std::process::Command`]: once this
/// has reaped it, do not wait on the `Child` again.
///
/// # Errors
/// The `wait4` error (`ECHILD` when `pid` is not a child of this process or was reaped).
pub fn try_wait_with_cpu(pid: u32) -> std::io::Result<Option<(ExitStatus, Duration)>> {
    use std::os::unix::process::ExitStatusExt;
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: wait4 writes an int and a `rusage` into memory of those types; WNOHANG makes it
    // return at once.
    let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, usage.as_mut_ptr()) };
    match rc {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(None),
        _ => {
            // SAFETY: wait4 reaped a child, so it filled the struct (zeroed anyway).
            let usage = unsafe { usage.assume_init() };
            Ok(Some((ExitStatus::from_raw(status), usage_cpu(&usage))))
        }
    }
}

fn usage_cpu(usage: &libc::rusage) -> Duration {
    let tv = |t: libc::timeval| {
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_usec).unwrap_or(0).saturating_mul(1000),
        )
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time (user + system) of `who`, from `getrusage`. Zero if the call fails.
pub fn cpu_time(who: Usage) -> Duration {
    let who = match who {
        Usage::Myself => libc::RUSAGE_SELF,
        Usage::Children => libc::RUSAGE_CHILDREN,
    };
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into memory of that type; `who` is one of the two
    // documented values.
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    if rc != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded, so the struct is initialised (it was zeroed anyway).
    usage_cpu(&unsafe { usage.assume_init() })
}
