//! What the scheduler's control socket costs the process it runs in, under a flood: its
//! threads (read from `/proc/self/task`) and its file descriptors (a low `RLIMIT_NOFILE`).
//! A test binary of its own, one test at a time, so that no other test's threads or
//! descriptors are counted.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{Daemon, GUARD, answer_on, wait_until};
use ladle_scheduler::daemon::{HANDLER_THREADS, MAX_CONNECTIONS};
use ladle_scheduler::protocol::{Request, Response};

/// One test at a time: both count what the whole process holds.
static ALONE: Mutex<()> = Mutex::new(());

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn five_hundred_trickling_clients_leave_the_daemon_with_a_bounded_number_of_threads() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let daemon = Daemon::start(&[]);
    assert!(matches!(
        daemon.served(&Request::Queue),
        Response::Queue { .. }
    ));
    let before = threads();
    let mut clients: Vec<UnixStream> = (0..500).map(|_| daemon.connect()).collect();
    // Every client past the cap is told so: the daemon has seen all 500.
    let mut refused = 0;
    for conn in &mut clients[MAX_CONNECTIONS..] {
        let Response::Error { message } = answer_on(conn) else {
            panic!("a client past the cap was answered otherwise");
        };
        assert!(message.contains("too many connections"), "{message}");
        refused += 1;
    }
    assert_eq!(refused, 500 - MAX_CONNECTIONS);
    // The rest trickle a byte each, a few rounds, while the threads are counted.
    let mut most = 0;
    for _ in 0..4 {
        for conn in &mut clients[..MAX_CONNECTIONS] {
            let _ = std::io::Write::write_all(conn, b" ");
        }
        most = most.max(threads());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        most <= before + HANDLER_THREADS + 1,
        "{most} threads with 500 trickling clients, {before} before"
    );
}

#[test]
fn a_daemon_out_of_file_descriptors_backs_off_and_serves_again_once_some_are_freed() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let daemon = Daemon::start(&[]);
    assert!(matches!(
        daemon.served(&Request::Queue),
        Response::Queue { .. }
    ));
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let low = rustix::process::Rlimit {
        current: Some(open + 40),
        maximum: limit.maximum,
    };
    rustix::process::setrlimit(rustix::process::Resource::Nofile, low).unwrap();
    // Connect until this process (client and daemon alike) is out of descriptors: the
    // daemon's accepts fail with EMFILE from then on.
    let mut clients = Vec::new();
    let deadline = Instant::now() + GUARD;
    loop {
        assert!(Instant::now() < deadline, "never ran out of descriptors");
        match UnixStream::connect(daemon.socket()) {
            Ok(conn) => clients.push(conn),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error()) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // The last few may wait in the listen queue, unaccepted; free every descriptor.
    drop(clients);
    rustix::process::setrlimit(rustix::process::Resource::Nofile, limit).unwrap();
    assert!(matches!(
        daemon.served(&Request::Queue),
        Response::Queue { .. }
    ));
    // Now exactly that state: the process at its limit (descriptors of /dev/null) and one
    // connection queued that the daemon cannot accept, every try failing with EMFILE. It must
    // back off, not spin: a spinning accept loop burns a core.
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(open + 40),
            maximum: limit.maximum,
        },
    )
    .unwrap();
    let mut fillers = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => fillers.push(file),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error()) => break,
            Err(e) => panic!("{e}"),
        }
    }
    fillers.pop(); // the one free descriptor: the client's socket takes it
    // (The daemon's own tick may hold it for a moment: look again until it is ours.)
    let mut pending = wait_until(
        "the freed descriptor back",
        GUARD,
        || match UnixStream::connect(daemon.socket()) {
            Ok(conn) => Ok(Some(conn)),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error()) => {
                Err(e.to_string())
            }
            Err(e) => panic!("{e}"),
        },
    );
    let at_limit = || {
        let opened = std::fs::File::open("/dev/null");
        assert!(
            matches!(&opened, Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error())),
            "not at the descriptor limit ({opened:?}): the daemon could accept, nothing is tested"
        );
    };
    at_limit();
    let before = cpu_seconds();
    // The window measured: the behaviour under test, not a wait for something to happen.
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_seconds() - before;
    at_limit();
    drop(fillers);
    rustix::process::setrlimit(rustix::process::Resource::Nofile, limit).unwrap();
    assert!(
        used < 0.5,
        "{used:.2} CPU-s in 2 s with a connection it could not accept: the accept loop spins"
    );
    // Once descriptors are back, the queued connection is served.
    let mut frame = Vec::new();
    ladle_scheduler::protocol::write_frame(&mut frame, &Request::Queue, std::path::Path::new("x"))
        .unwrap();
    pending.set_read_timeout(Some(GUARD)).unwrap();
    std::io::Write::write_all(&mut pending, &frame).unwrap();
    assert!(matches!(answer_on(&mut pending), Response::Queue { .. }));
}

/// CPU seconds this process has used (user + system): `getrusage`, which needs no
/// descriptor.
fn cpu_seconds() -> f64 {
    ladle_os::cpu_time(ladle_os::Usage::Myself).as_secs_f64()
}
