//! Processes of the machine: identity from `/proc` (a pid and its start time, so that a
//! recycled pid is never taken for the process it named), process groups, owners, signals,
//! and exclusive lock files. Every signal a ladle process sends to a process it did not just
//! start goes through a [`ProcessId`].

use std::fs::File;
use std::io;
use std::path::Path;

pub use rustix::process::Signal;

/// The fields of `/proc/PID/stat` ladle reads; `None` when the process does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// Field 3: `R`, `S`, `Z`, ...
    state: char,
    /// Field 5.
    group: u32,
    /// Field 22: clock ticks since boot.
    start_ticks: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses `/proc/PID/stat`. The command name (field 2) is in parentheses and may hold spaces
/// and parentheses of its own: the fields after it start after its *last* `)`.
fn parse_stat(stat: &str) -> Option<Stat> {
    let mut after = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = after.next()?.chars().next()?; // field 3
    let group = after.nth(1)?.parse().ok()?; // field 5
    let start_ticks = after.nth(16)?.parse().ok()?; // field 22
    Some(Stat {
        state,
        group,
        start_ticks,
    })
}

/// One process for the machine's uptime: its pid and the start time (clock ticks since boot)
/// `/proc` gave for it. A pid is recycled once its process is reaped; the pair is not, so a
/// signal through a `ProcessId` never reaches a process that took the pid since.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The pid.
    pub pid: u32,
    /// Its start time in clock ticks since boot (field 22 of `/proc/PID/stat`).
    pub start_ticks: u64,
}

impl ProcessId {
    /// The process `pid` is now; `None` when there is none.
    pub fn of(pid: u32) -> Option<Self> {
        Some(Self {
            pid,
            start_ticks: stat(pid)?.start_ticks,
        })
    }

    /// The pair as recorded earlier (a journal, a report).
    pub fn new(pid: u32, start_ticks: u64) -> Self {
        Self { pid, start_ticks }
    }

    /// Whether this process still exists (it may be a zombie): its pid names the same start.
    pub fn exists(&self) -> bool {
        start_ticks(self.pid) == Some(self.start_ticks)
    }

    /// Whether it exists and is not a zombie.
    pub fn is_alive(&self) -> bool {
        stat(self.pid).is_some_and(|s| s.start_ticks == self.start_ticks && !is_dead(s.state))
    }

    /// Sends `signal` to this process, if it is still this process; never to the calling
    /// process. `Ok(false)`: it is gone (or its pid is another process's now), nothing sent.
    pub fn signal(&self, signal: Signal) -> io::Result<bool> {
        if self.pid == std::process::id() || !self.exists() {
            return Ok(false);
        }
        // The pid could be recycled between the look and the kill only if the process were
        // reaped in between: a parent that reaps it is the one that knows not to signal it.
        kill_raw(self.pid, signal)
    }

    /// Sends `signal` to the process group this process leads (its id is the leader's pid):
    /// while the leader is still this process, or once no process holds its pid and the group
    /// still has a live member (the leader was reaped, its children run on: no other group
    /// can have that id while no process has that pid). `Ok(false)`: nothing sent (the pid is
    /// another process's now, or the group is gone).
    pub fn signal_group(&self, signal: Signal) -> io::Result<bool> {
        match stat(self.pid) {
            Some(s) if s.start_ticks == self.start_ticks => {}
            Some(_) => return Ok(false),
            None if group_alive(self.pid) => {}
            None => return Ok(false),
        }
        match rustix::process::kill_process_group(pid_of(self.pid)?, signal) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::SRCH) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

fn is_dead(state: char) -> bool {
    matches!(state, 'Z' | 'X')
}

fn kill_raw(pid: u32, signal: Signal) -> io::Result<bool> {
    let pid = pid_of(pid)?;
    match rustix::process::kill_process(pid, signal) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn pid_of(pid: u32) -> io::Result<rustix::process::Pid> {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The start time of process `pid` in clock ticks since boot (field 22 of `/proc/PID/stat`),
/// `None` when the process does not exist.
pub fn start_ticks(pid: u32) -> Option<u64> {
    Some(stat(pid)?.start_ticks)
}

/// The process group of `pid`, `None` when it does not exist.
pub fn process_group(pid: u32) -> Option<u32> {
    Some(stat(pid)?.group)
}

/// Whether `pid` is alive and not a zombie.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| !is_dead(s.state))
}

/// `/proc/PID/cmdline` with NULs as spaces, empty when unreadable.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Whether process group `pgid` has a member that is alive and not a zombie. A zombie left by
/// a killed job's orphaned child is its new parent's to reap (init's, or a container's first
/// process, which may never do it), so it does not count.
pub fn group_alive(pgid: u32) -> bool {
    let Ok(pid) = pid_of(pgid) else {
        return false;
    };
    if rustix::process::test_kill_process_group(pid) == Err(rustix::io::Errno::SRCH) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // Cannot look: the group answered a signal, so take it for alive.
        return true;
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| stat(pid).is_some_and(|s| s.group == pgid && !is_dead(s.state)))
}

/// Process `pid`'s owner (the uid of `/proc/PID`), `None` when it does not exist.
pub fn owner(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// One process of the machine as [`processes_named`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// Its pid.
    pub pid: u32,
    /// Its owner.
    pub uid: u32,
    /// Its program (the file name of `argv[0]`).
    pub program: String,
}

/// Every process this pid namespace shows whose program (the file name of `argv[0]`, which
/// `/proc/PID/cmdline` gives for every user's process unless `/proc` is mounted with
/// `hidepid`) starts with `prefix`.
pub fn processes_named(prefix: &str) -> Vec<Owned> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let argv0 = cmdline.split(|&b| b == 0).next()?;
            let program = String::from_utf8_lossy(argv0);
            let program = program.rsplit('/').next()?.to_owned();
            if !program.starts_with(prefix) {
                return None;
            }
            Some(Owned {
                pid,
                uid: owner(pid)?,
                program,
            })
        })
        .collect()
}

/// This process's effective uid.
pub fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Takes an exclusive, non-blocking `flock` on `path` (created if missing); held until the
/// returned file is dropped. `Ok(None)` when another process holds it.
pub fn lock_file(path: &Path) -> io::Result<Option<File>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Waits for the exclusive lock of [`lock_file`] until `deadline`, trying every few
/// milliseconds; `Ok(None)` when another process still holds it then.
pub fn lock_file_wait(path: &Path, deadline: std::time::Instant) -> io::Result<Option<File>> {
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        if let Some(file) = lock_file(path)? {
            return Ok(Some(file));
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(std::time::Duration::from_millis(20));
    }
}

/// Whether some process holds a `flock` on `path` that excludes a shared one (the exclusive
/// lock of [`lock_file`]): a shared lock is tried and dropped at once. A missing file is not
/// locked. This is how a process that holds a lock for its whole life is seen to be alive:
/// the kernel drops the lock when the process dies, however it dies.
pub fn is_locked(path: &Path) -> io::Result<bool> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => Ok(false),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Takes a shared `flock` on `path` (created if missing), waiting for it if an exclusive one
/// is held; held until the returned file is dropped (or the process dies). Any number of
/// processes may hold it at once; [`is_held_shared`] sees whether any does.
pub fn hold_shared(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)?;
    Ok(file)
}

/// Whether any process holds a shared (or exclusive) `flock` on `path`: an exclusive lock is
/// tried and dropped at once. A missing file is not held.
pub fn is_held_shared(path: &Path) -> io::Result<bool> {
    let file = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(false),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis_of_the_name() {
        let line = "4242 (a (weird) name) S 1 4240 4240 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    98765 1000 10 18446744073709551615";
        let stat = parse_stat(line).unwrap();
        assert_eq!(
            (stat.state, stat.group, stat.start_ticks),
            ('S', 4240, 98765)
        );
        assert_eq!(parse_stat("4242 (x) S 1"), None, "cut short");
    }

    #[test]
    fn a_lock_is_seen_held_while_its_file_is_open_and_free_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.live");
        assert!(!is_locked(&path).unwrap(), "a missing file is not locked");
        let held = lock_file(&path).unwrap().unwrap();
        assert!(is_locked(&path).unwrap());
        assert!(
            lock_file(&path).unwrap().is_none(),
            "flock is per open file"
        );
        let soon = std::time::Instant::now() + std::time::Duration::from_millis(30);
        assert!(lock_file_wait(&path, soon).unwrap().is_none());
        drop(held);
        assert!(!is_locked(&path).unwrap());
        let again = lock_file_wait(&path, std::time::Instant::now()).unwrap();
        assert!(again.is_some());
    }

    #[test]
    fn shared_holds_are_seen_until_the_last_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.hold");
        assert!(!is_held_shared(&path).unwrap());
        let (a, b) = (hold_shared(&path).unwrap(), hold_shared(&path).unwrap());
        assert!(is_held_shared(&path).unwrap());
        drop(a);
        assert!(is_held_shared(&path).unwrap());
        drop(b);
        assert!(!is_held_shared(&path).unwrap());
    }

    #[test]
    fn this_process_has_a_start_time_and_a_group() {
        let me = std::process::id();
        assert!(start_ticks(me).is_some());
        assert!(process_group(me).is_some());
        assert!(alive(me));
        assert!(!cmdline(me).is_empty());
        assert!(ProcessId::of(me).unwrap().is_alive());
    }

    #[test]
    fn a_process_id_of_a_reaped_child_signals_nothing_even_when_its_pid_comes_back() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessId::of(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!alive(id.pid) && !id.exists());
        assert!(!id.signal(Signal::KILL).unwrap());
        // The same pid with another start time (what a recycled pid looks like) is not it.
        let me = ProcessId::of(std::process::id()).unwrap();
        let other = ProcessId::new(me.pid, me.start_ticks + 1);
        assert!(!other.exists());
        assert!(!other.signal(Signal::KILL).unwrap());
        assert!(
            !me.signal(Signal::KILL).unwrap(),
            "never the calling process"
        );
    }

    #[test]
    fn a_group_is_alive_while_a_member_runs_and_not_once_it_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .unwrap();
        let leader = ProcessId::of(child.id()).unwrap();
        assert!(group_alive(leader.pid));
        assert!(leader.signal_group(Signal::KILL).unwrap());
        child.wait().unwrap();
        assert!(!group_alive(leader.pid));
        assert!(
            !leader.signal_group(Signal::KILL).unwrap(),
            "reaped: nothing sent"
        );
    }

    #[test]
    fn a_group_whose_leader_was_reaped_is_still_signalled_while_its_children_run() {
        // The leader starts a child in its group and exits; the child runs on.
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 600 >/dev/null & echo $!"])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let id = ProcessId::of(leader.id()).unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(leader.stdout.as_mut().unwrap(), &mut out).unwrap();
        leader.wait().unwrap();
        let child: u32 = out.trim().parse().unwrap();
        assert!(alive(child) && !id.exists() && group_alive(id.pid));
        assert!(
            id.signal_group(Signal::KILL).unwrap(),
            "the orphaned group is signalled"
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while group_alive(id.pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child outlived SIGKILL"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn a_second_lock_on_the_same_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("ladle-os-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock");
        let held = lock_file(&path).unwrap();
        assert!(held.is_some());
        assert!(lock_file(&path).unwrap().is_none());
        drop(held);
        assert!(lock_file(&path).unwrap().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
