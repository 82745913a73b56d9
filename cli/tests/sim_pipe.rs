//! `ladle sim` writing into a pipe whose reader has gone (`ladle sim … --json | head -c 10`):
//! a real process, a real pipe.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Output, Stdio};

/// The write end of a pipe whose read end is already closed: any write to it fails with
/// `EPIPE`, as when `head` has read its fill and exited.
fn widowed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: `fds` is an array of two `c_int`s for `pipe2` to fill; nothing else reads it.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: `pipe2` succeeded, so both are open descriptors that nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

fn ladle(args: &[&str], stdout: Stdio) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ladle"))
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .expect("run ladle")
}

#[test]
fn sim_into_a_closed_pipe_exits_quietly_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let trace = trace.to_str().unwrap();
    let generate = [
        "sim", "generate", "--jobs", "20", "--seed", "1", "--out", trace,
    ];
    let out = ladle(&generate, Stdio::null());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for json in [true, false] {
        let args = ["sim", "--trace", trace, "--json"];
        let args = if json { &args[..] } else { &args[..3] };
        let out = ladle(args, Stdio::from(widowed_pipe()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "ladle {args:?} into a closed pipe: {}, stderr: {stderr}",
            out.status
        );
        assert!(stderr.is_empty(), "ladle {args:?}: {stderr}");
    }
}

#[test]
fn json_into_a_closed_pipe_exits_quietly_for_the_other_commands_too() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let generate = [
        "dataset",
        "generate",
        "--format",
        "imagefolder",
        "--count",
        "4",
        "--width",
        "16",
        "--height",
        "16",
        "--out",
        data,
        "--json",
    ];
    let inspect = ["dataset", "inspect", data, "--json"];
    for args in [&generate[..], &inspect[..]] {
        let out = ladle(args, Stdio::from(widowed_pipe()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "ladle {args:?} into a closed pipe: {}, stderr: {stderr}",
            out.status
        );
    }
}
