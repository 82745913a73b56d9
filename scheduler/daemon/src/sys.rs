//! The OS underneath the daemon, from `ladle-os` (the one layer of OS calls): process identity
//! from `/proc` (a pid with its start time, [`ProcessId`], that every signal the daemon sends
//! goes through), process groups, the socket peer's uid, an exclusive lock file.

pub use ladle_os::net::peer_uid;
pub use ladle_os::process::{
    Owned, ProcessId, Signal, alive, cmdline, group_alive, lock_file, my_uid, owner, process_group,
    processes_named, start_ticks,
};
