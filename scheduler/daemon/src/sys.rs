//! The OS underneath the daemon: process identity from `/proc`, process groups, signals,
//! the socket peer's uid, an exclusive lock file. Small and safe (rustix does the calls).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/PID/stat`): with the pid it names one process for the machine's uptime, so a
/// recycled pid is not mistaken for a job. `None` when the process does not exist.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; start time is field 22, i.e. the 20th after the name.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The process group of `pid`, `None` when it does not exist.
pub fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(2)?.parse().ok()
}

/// Whether `pid` is alive and not a zombie.
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}

/// `/proc/PID/cmdline` with NULs as spaces, empty when unreadable.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Sends `signal` to process group `pgid`.
pub fn signal_group(pgid: u32, signal: rustix::process::Signal) -> io::Result<()> {
    let pid = rustix::process::Pid::from_raw(pgid as i32)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    rustix::process::kill_process_group(pid, signal)?;
    Ok(())
}

/// Whether process group `pgid` has a member that is alive and not a zombie. A zombie
/// left by a killed job's orphaned child is its new parent's to reap (init's, or a
/// container's first process, which may never do it), so it does not count.
pub fn group_alive(pgid: u32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pgid as i32) else {
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
        .any(|pid| process_group(pid) == Some(pgid) && alive(pid))
}

/// The uid of the process at the other end of a Unix socket.
pub fn peer_uid(sock: impl AsFd) -> io::Result<u32> {
    Ok(rustix::net::sockopt::socket_peercred(sock)?.uid.as_raw())
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

/// Takes an exclusive, non-blocking `flock` on `path` (created if missing); held until
/// the returned file is dropped. `Ok(None)` when another process holds it.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_group() {
        let me = std::process::id();
        assert!(start_ticks(me).is_some());
        assert!(process_group(me).is_some());
        assert!(alive(me));
        assert!(!cmdline(me).is_empty());
    }

    #[test]
    fn a_reaped_child_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!alive(pid));
        assert_eq!(start_ticks(pid), None);
    }

    #[test]
    fn a_group_is_alive_while_a_member_runs_and_not_once_it_is_reaped() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        assert!(group_alive(pgid));
        signal_group(pgid, rustix::process::Signal::KILL).unwrap();
        child.wait().unwrap();
        assert!(!group_alive(pgid));
    }

    #[test]
    fn a_second_lock_on_the_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = lock_file(&path).unwrap();
        assert!(held.is_some());
        assert!(lock_file(&path).unwrap().is_none());
        drop(held);
        assert!(lock_file(&path).unwrap().is_some());
    }
}
