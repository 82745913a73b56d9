//! # ladle-os: the one layer of operating-system calls
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate is the floor under every other box: the only
//! crate that calls `libc` or `rustix` (a test over `cargo metadata` keeps it so, and
//! `clippy.toml` lists the raw calls it wraps under `disallowed-methods`; test and bench
//! crates may still attack with raw calls). Each module is small, safe to call, and says what
//! it promises:
//!
//! - [`shm`]: anonymous shared-memory files (memfd), their seals, and shared mappings of them
//!   (a region mapped twice back to back so that any window is contiguous): the ring's memory.
//! - [`futex`]: waits and wakes on words in shared memory, across processes.
//! - [`net`]: Unix sockets: file descriptors passed with a message, a connect that gives up at
//!   a deadline, whether the peer hung up or sent something, and who the peer is.
//! - [`proc`]: child processes in their own process group, output read on threads, waited for
//!   with a deadline, the group killed when dropped ([`Proc`]); CPU time from `getrusage` and
//!   a reaped child's `wait4`.
//! - [`process`]: processes of the machine: a pid with its start time ([`process::ProcessId`],
//!   what every signal to a process ladle did not just start goes through), process groups,
//!   owners, and exclusive lock files.
//! - [`clock`]: this process's and this thread's CPU time.
//! - [`mem`]: how much host memory is free for this process (meminfo and its cgroup's limit).
//! - [`fs`]: opening a file without blocking on a FIFO, and the errors that mean "out of a
//!   resource, try later" rather than "this file is bad".
//!
//! ## Example
//! ```
//! use std::process::Command;
//! use std::time::Duration;
//!
//! use ladle_os::Proc;
//!
//! let mut echo = Proc::spawn("echo", Command::new("echo").arg("hello"))?;
//! echo.wait_timeout(Duration::from_secs(60))?;
//! let out = echo.output()?;
//! assert!(out.status.success());
//! assert_eq!(out.stdout, "hello\n");
//! # Ok::<(), ladle_os::ProcError>(())
//! ```

// This crate is where the raw calls that `clippy.toml` keeps out of the others are made.
#![allow(clippy::disallowed_methods)]

pub mod clock;
pub mod fs;
pub mod futex;
pub mod mem;
pub mod net;
pub mod proc;
pub mod process;
pub mod shm;

pub use proc::{Output, Proc, ProcError, Signal, Usage, cpu_time, try_wait_with_cpu};
