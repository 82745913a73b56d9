//! Data-plane trust (issue 11), against the real `ladle serve` and `ladle consume` processes:
//! legal settings that used to hang, a stopped consumer that used to freeze everyone, hostile
//! consumers, connection floods, a socket path that is not a socket, a removed socket file.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use ladle_ring::CursorPage;
use ladle_ring::protocol::{self, ClientMessage, Hello, PROTOCOL_VERSION, ServerMessage};
use ladle_tests::{Finished, Fixture, wait_for_log_line, wait_until};
use serde_json::Value;

/// Deadlock guard for one run; never a speed assertion.
const GUARD: Duration = Duration::from_secs(300);

/// 32×32 samples in a 2 MiB ring: 512 slots, so batches of up to 256 (C/2).
const SMALL_RING: &[&str] = &["--image-size", "32", "--ring-mib", "2", "--threads", "2"];
const CAPACITY: u32 = 512;

fn summary(done: &Finished) -> Value {
    done.json_lines()
        .into_iter()
        .find(|v| v.get("rejoins").is_some())
        .unwrap_or_else(|| panic!("no summary line: {}", done.stdout))
}

fn assert_exact(done: &Finished, expected_epochs: usize, what: &str) {
    if let Some(summary) = done
        .json_lines()
        .into_iter()
        .find(|v| v.get("rejoins").is_some())
    {
        // With `--check-held`: nothing changed under a batch while it was held.
        assert_eq!(summary["corrupted_batches"], 0, "{what}: {summary}");
    }
    for e in done.assert_exact(expected_epochs, what) {
        assert_eq!(e["bad_samples"], 0, "{what}: {e}");
    }
}

#[test]
fn hold_previous_loops_up_to_half_the_ring_finish_on_lengths_not_a_multiple_of_8() {
    // Defect 2: a loop holding the previous batch waits for exactly cursor + C, which the
    // producer could never publish while up to 7 samples sat in a half-filled chunk.
    for (len, batch) in [
        (301u32, CAPACITY / 2),
        (1500, CAPACITY / 2),
        (301, 255),
        (77, 200),
    ] {
        let mut fx = Fixture::new();
        let data = fx.dataset(len, 40, 36);
        fx.serve(&data, SMALL_RING);
        let first = fx.consume(batch, 3, &["--hold-previous", "--check-held"]);
        // A late joiner at an unaligned start, also holding the previous batch: it joins once
        // the producer says the first one has and samples have been published.
        fx.wait_for_stats("the first consumer joined and samples published", |s| {
            s.joins == 1 && s.published > 0
        });
        let late = fx.consume(
            batch,
            2,
            &["--hold-previous", "--step-ms", "1", "--check-held"],
        );
        let what = format!("length {len}, batch {batch}");
        assert_exact(&fx.wait(first, GUARD), 3, &what);
        assert_exact(&fx.wait(late, GUARD), 2, &format!("late joiner, {what}"));
    }
}

#[test]
fn a_stopped_consumer_is_let_go_the_others_go_on_and_on_resuming_it_still_reads_exact_epochs() {
    // Defect 6: one SIGSTOPped consumer froze the feed for everyone, forever, silently.
    // Second case: stopped while holding two batches of C/2, it resumes after the others
    // have left, wanting samples the producer (with nobody attached) will never write.
    for (len, stopped_args) in [
        (300u32, &["--batch-size", "32", "--step-ms", "50"][..]),
        (
            1500,
            &["--batch-size", "256", "--step-ms", "50", "--hold-previous"][..],
        ),
    ] {
        let mut fx = Fixture::new();
        let data = fx.dataset(len, 40, 36);
        let serve = fx.serve(&data, &[SMALL_RING, &["--stall-timeout", "1"]].concat());
        let socket = fx.socket();
        let consume = [
            "consume",
            "--socket",
            socket.to_str().unwrap(),
            "--epochs",
            "3",
            "--json",
            "--check-held",
        ];
        let stopped = fx.spawn(&[&consume[..], stopped_args].concat());
        // Stopped once the producer says it has joined and released samples: it is reading,
        // mid-epoch (3 epochs at 50 ms a batch), holding a batch.
        let pid = fx.pid(stopped);
        fx.wait_for_stats("the consumer to stop reading", |s| {
            s.consumers.iter().any(|c| c.pid == pid && c.released > 0)
        });
        fx.signal(stopped, 19); // SIGSTOP, mid-epoch, holding a batch
        let later = fx.consume(64, 2, &["--hold-previous", "--check-held"]);
        assert_exact(
            &fx.wait(later, GUARD),
            2,
            "consumer that joined after the stopped one",
        );
        fx.signal(stopped, 18); // SIGCONT
        let resumed = fx.wait(stopped, GUARD);
        assert_exact(
            &resumed,
            3,
            &format!("the stopped consumer {stopped_args:?}"),
        );
        assert!(
            summary(&resumed)["rejoins"].as_u64().unwrap() >= 1,
            "{}",
            resumed.stdout
        );
        fx.signal(serve, 15);
        let producer = fx.wait(serve, Duration::from_secs(60));
        assert!(producer.stderr.contains("let go"), "{}", producer.stderr);
        assert!(producer.stderr.contains("held back"), "{}", producer.stderr);
    }
}

/// Connects and says `Hello` as a consumer of batch `batch` would; returns the socket and
/// the cursor page the producer handed over.
fn raw_consumer(
    socket: &std::path::Path,
    batch: u32,
) -> (UnixStream, CursorPage, u64, std::os::fd::OwnedFd) {
    let sock = UnixStream::connect(socket).unwrap();
    let hello = ClientMessage::Hello(Hello {
        version: PROTOCOL_VERSION,
        batch_size: batch,
        drop_last: false,
        name: "hostile\nINFO forged log line".into(),
        pid: std::process::id(),
        group: None,
    });
    protocol::send(&sock, &hello, &[]).unwrap();
    let (message, mut fds) = protocol::recv::<ServerMessage>(&sock).unwrap();
    let ServerMessage::Welcome(welcome) = message else {
        panic!("not welcomed: {message:?}");
    };
    let page = CursorPage::map(fds[1].as_fd()).unwrap();
    (sock, page, welcome.start_seq, fds.swap_remove(1))
}

/// Waits (at most 30 s) for the producer to say `Detached` on `sock`.
fn detached_reason(sock: &UnixStream) -> String {
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    loop {
        match protocol::recv::<ServerMessage>(sock) {
            Ok((ServerMessage::Detached { reason }, _)) => return reason,
            Ok(_) => continue,
            Err(e) => panic!("no Detached: {e}"),
        }
    }
}

#[test]
fn consumers_that_move_their_cursor_out_of_range_are_detached_and_nobody_else_notices() {
    // Defect 3: the producer trusted whatever a cursor said (and read it twice).
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 40, 36);
    let serve = fx.serve(&data, SMALL_RING);
    let honest = fx.consume(50, 4, &["--hold-previous", "--check-held"]);
    fx.wait_for_stats("the honest consumer joined", |s| s.joins == 1);
    // Ahead of anything published: would let the producer overwrite what others hold.
    let (ahead, page, _, _) = raw_consumer(&fx.socket(), 16);
    page.release(u64::MAX / 2);
    let reason = detached_reason(&ahead);
    assert!(reason.contains("cursor"), "{reason}");
    // Truncating its cursor page (which would kill the producer with SIGBUS) is refused.
    let (_sock, _page, _, page_fd) = raw_consumer(&fx.socket(), 16);
    let file = std::fs::File::from(page_fd);
    assert!(
        file.set_len(0).is_err(),
        "a consumer truncated its cursor page"
    );
    // Oscillating: forwards, then back below where it started.
    let (oscillating, page, start, _) = raw_consumer(&fx.socket(), 16);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wobble = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                page.release(if k % 2 == 0 {
                    start + 3
                } else {
                    start.saturating_sub(1)
                });
                k += 1;
                // The hostile consumer's pace (its behaviour, not a wait for anything).
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    if start > 0 {
        let reason = detached_reason(&oscillating);
        assert!(reason.contains("cursor"), "{reason}");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    wobble.join().unwrap();
    assert_exact(
        &fx.wait(honest, GUARD),
        4,
        "honest consumer beside hostile ones",
    );
    fx.signal(serve, 15);
    let producer = fx.wait(serve, Duration::from_secs(60));
    assert!(producer.status.success(), "{}", producer.stderr);
    // The forged name is logged escaped, on the line of its consumer.
    assert!(
        !producer
            .stderr
            .lines()
            .any(|l| l.starts_with("INFO forged")),
        "{}",
        producer.stderr
    );
}

#[test]
fn serve_refuses_to_replace_a_file_that_is_not_a_socket() {
    // Defect 7: `serve --socket` deleted a regular file at that path.
    let mut fx = Fixture::new();
    let data = fx.dataset(20, 40, 36);
    let path = fx.path().join("precious.txt");
    std::fs::write(&path, "my notes").unwrap();
    let args = [
        "serve",
        "--dataset",
        data.to_str().unwrap(),
        "--socket",
        path.to_str().unwrap(),
    ];
    let done = fx.run(&[&args[..], SMALL_RING].concat(), GUARD);
    assert!(!done.status.success());
    assert!(done.stderr.contains("not a socket"), "{}", done.stderr);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "my notes");
}

#[test]
fn sigterm_stops_a_producer_whose_socket_file_was_removed() {
    // Defect 8: shutdown unblocked `accept` by connecting to the socket file.
    let mut fx = Fixture::new();
    let data = fx.dataset(50, 40, 36);
    let serve = fx.serve(&data, SMALL_RING);
    let c = fx.consume(16, 1000, &[]);
    fx.wait_for_stats("the consumer joined", |s| s.consumers.len() == 1);
    std::fs::remove_file(fx.socket()).unwrap();
    fx.signal(serve, 15);
    let producer = fx.wait(serve, Duration::from_secs(20));
    assert!(producer.status.success(), "{}", producer.stderr);
    let consumer = fx.wait(c, Duration::from_secs(30));
    assert!(!consumer.status.success());
}

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// Threads of process `pid` that serve one consumer connection (named `ladle-consumer-conn`,
/// which the kernel cuts to 15 bytes).
fn connection_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == "ladle-consumer-")
        .count()
}

/// CPU seconds process `pid` has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[test]
fn a_connection_flood_is_capped_and_refused_with_a_reason_and_a_slow_hello_is_cut_off() {
    // Defect 5: one thread per connection without a cap, and a byte every 4 s held a
    // connection forever.
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 40, 36);
    let serve = fx.serve(&data, &[SMALL_RING, &["--max-connections", "8"]].concat());
    let pid = fx.pid(serve);
    // main, control, feeder and its 2 decode threads (`--threads 2`), then one per connection.
    let own = 5;
    let mut flood: Vec<UnixStream> = (0..40)
        .map(|_| UnixStream::connect(fx.socket()).unwrap())
        .collect();
    // The last ones were refused with a reason. The producer accepts in order, so once the
    // last one has its answer, it has handled all 40.
    let refused = flood.last_mut().unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (message, _) = protocol::recv::<ServerMessage>(refused).unwrap();
    assert!(
        matches!(&message, ServerMessage::Reject { reason } if reason.contains("too many")),
        "{message:?}"
    );
    // A connection thread that has just let its slot go (the fixture's readiness probe's)
    // may still be exiting when the flood arrives: wait for the count to settle, but for
    // well under the 5 s Hello deadline, after which even uncapped threads would be gone.
    wait_until(
        "at most 8 connection threads and no other thread beyond the producer's own",
        Duration::from_secs(2),
        || {
            let (conns, all) = (connection_threads(pid), threads(pid));
            if conns <= 8 && all <= own + 8 {
                Ok(Some(()))
            } else {
                Err(format!(
                    "{conns} connection threads, {all} threads in all, for 40 idle connections (cap 8)"
                ))
            }
        },
    );
    // The first ones, which never say Hello, are cut off after the handshake deadline
    // even if they trickle bytes.
    let trickler = &mut flood[0];
    let _ = std::io::Write::write_all(trickler, &[200, 0, 0, 0]);
    let started = Instant::now();
    let mut buf = Vec::new();
    trickler
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    loop {
        let _ = std::io::Write::write_all(trickler, b" ");
        // A byte every 200 ms: the trickle is the behaviour under test.
        std::thread::sleep(Duration::from_millis(200));
        let mut byte = [0u8; 4096];
        trickler.set_nonblocking(true).unwrap();
        let read = trickler.read(&mut byte);
        trickler.set_nonblocking(false).unwrap();
        match read {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&byte[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "a trickling connection is still open"
        );
    }
    drop(flood);
    let good = fx.consume(32, 2, &[]);
    assert_exact(&fx.wait(good, GUARD), 2, "consumer after the flood");
}

#[test]
fn out_of_file_descriptors_the_producer_backs_off_and_delivers_no_corrupt_sample() {
    // Defect 5: EMFILE made the accept loop spin at 100% CPU and turned thousands of
    // samples into zero images with label -1.
    let mut fx = Fixture::new();
    let data = fx.dataset(300, 40, 36);
    let socket = fx.socket();
    // `ulimit` is a builtin of every POSIX shell: no util-linux needed.
    let args = [
        "sh",
        "-c",
        "ulimit -n 64 && exec \"$0\" \"$@\"",
        ladle_tests::ladle_bin().to_str().unwrap(),
        "serve",
        "--dataset",
        data.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ];
    // Its stderr goes to a file, so that the test can see it run out of fds.
    let log = fx.path().join("serve.log");
    let serve = fx.spawn_logged(&[&args[..], SMALL_RING].concat(), &log);
    fx.wait_for_socket(serve);
    let pid = fx.pid(serve);
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.split_whitespace().nth(3) == Some("64")),
        "the producer does not run under the low limit: {limits}"
    );
    let good = fx.consume(32, 3, &["--step-ms", "2"]);
    fx.wait_for_stats("the consumer joined", |s| s.joins == 1);
    // Take every descriptor the producer has left, and then some.
    let flood: Vec<UnixStream> = (0..120)
        .filter_map(|_| UnixStream::connect(&socket).ok())
        .collect();
    wait_for_log_line(&log, "cannot accept a connection", GUARD);
    let cpu_before = cpu_seconds(pid);
    // The CPU it uses over 2 s while out of fds is what is measured: the interval is the
    // behaviour under test, not a wait for something to happen.
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_seconds(pid) - cpu_before;
    assert!(
        spent < 1.0,
        "the producer used {spent:.2} CPU-s in 2 s while out of fds"
    );
    drop(flood);
    let done = fx.wait(good, GUARD);
    assert_exact(&done, 3, "consumer while the producer ran out of fds");
    assert_eq!(summary(&done)["bad_samples"], 0);
}

#[test]
fn a_consumer_whose_futex_word_disagrees_with_its_cursor_does_not_make_the_producer_spin() {
    // Defect 10: the feeder slept on the futex word, which the consumer writes; a word that
    // disagrees with the cursor made every sleep return at once.
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 40, 36);
    let serve = fx.serve(&data, &[SMALL_RING, &["--stall-timeout", "60"]].concat());
    let pid = fx.pid(serve);
    let (_sock, _page, start, fd) = raw_consumer(&fx.socket(), 16);
    let words =
        ladle_ring::sys::Mapping::new(fd.as_fd(), 0, ladle_ring::sys::PAGE, true, false).unwrap();
    // SAFETY: offset 8 is the cursor page's `cursor_word` (an AtomicU32): the futex word.
    let word = unsafe { &*words.as_ptr().add(8).cast::<std::sync::atomic::AtomicU32>() };
    word.store((start as u32) ^ 0xdead, std::sync::atomic::Ordering::SeqCst);
    // Another consumer reads, so the ring fills up to this one's cursor and the producer waits.
    let other = fx.consume(16, 1000, &[]);
    let me = std::process::id();
    fx.wait_for_stats("the raw consumer holding the feed back", |s| {
        s.consumers
            .iter()
            .any(|c| c.pid == me && c.holding_back_s.is_some())
    });
    let before = cpu_seconds(pid);
    // The CPU it uses over 2 s while it waits is what is measured: the interval is the
    // behaviour under test, not a wait for something to happen.
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_seconds(pid) - before;
    assert!(
        spent < 0.5,
        "the producer used {spent:.2} CPU-s in 2 s while waiting"
    );
    fx.signal(other, 9);
}

#[test]
fn a_sample_that_really_is_bad_is_counted_where_the_consumer_sees_it() {
    // Defect 5: bad samples must be visible (per batch, and in `consume --json`), never silent.
    let mut fx = Fixture::new();
    let data = fx.dataset(40, 40, 36);
    let class = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let image = std::fs::read_dir(&class)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    std::fs::write(&image, b"not an image at all").unwrap();
    fx.serve(&data, SMALL_RING);
    let consumer = fx.consume(8, 2, &[]);
    let done = fx.wait(consumer, GUARD);
    let epochs = done.assert_exact(2, "epochs with a corrupt file");
    for e in &epochs {
        assert_eq!(e["bad_samples"], 1, "one bad file, once per epoch: {e}");
    }
    assert_eq!(summary(&done)["bad_samples"], 2, "{}", done.stdout);
}

#[test]
fn a_consumer_of_the_previous_protocol_version_is_refused_with_both_versions_named() {
    // Version 4 put the schema in `Welcome`: a version-3 consumer would read the ring wrong.
    let mut fx = Fixture::new();
    let data = fx.dataset(60, 40, 36);
    let serve = fx.serve(&data, SMALL_RING);
    let old = UnixStream::connect(fx.socket()).unwrap();
    let hello = ClientMessage::Hello(Hello {
        version: PROTOCOL_VERSION - 1,
        batch_size: 8,
        drop_last: false,
        name: "old".into(),
        pid: std::process::id(),
        group: None,
    });
    protocol::send(&old, &hello, &[]).unwrap();
    old.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let (message, fds) = protocol::recv::<ServerMessage>(&old).unwrap();
    let ServerMessage::Reject { reason } = message else {
        panic!("an old consumer was not refused: {message:?}");
    };
    assert!(
        fds.is_empty(),
        "the ring went to a consumer that cannot read it"
    );
    let (ours, theirs) = (PROTOCOL_VERSION, PROTOCOL_VERSION - 1);
    assert!(
        reason.contains(&format!("speaks {ours}")) && reason.contains(&format!("speaks {theirs}")),
        "{reason}"
    );
    // Nobody else notices.
    let honest = fx.consume(16, 1, &[]);
    assert_exact(
        &fx.wait(honest, GUARD),
        1,
        "a consumer after the refused one",
    );
    fx.signal(serve, 15);
    fx.wait(serve, Duration::from_secs(60));
}

#[test]
fn a_consumer_that_says_skim_unasked_is_detached_and_nobody_else_notices() {
    // Protocol version 9: `Skim` takes a consumer's cursor off the gate. Said unasked, it
    // would let a consumer escape the pace without the producer's decision.
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 40, 36);
    let serve = fx.serve(&data, SMALL_RING);
    let honest = fx.consume(50, 4, &["--hold-previous", "--check-held"]);
    fx.wait_for_stats("the honest consumer joined", |s| s.joins == 1);
    let (unasked, page, _, _) = raw_consumer(&fx.socket(), 16);
    assert!(!page.asked_to_skim(), "asked to skim on joining");
    protocol::send(&unasked, &ClientMessage::Skim, &[]).unwrap();
    let reason = detached_reason(&unasked);
    assert!(reason.contains("Skim without being asked"), "{reason}");
    assert_exact(&fx.wait(honest, GUARD), 4, "honest consumer beside it");
    fx.signal(serve, 15);
    let producer = fx.wait(serve, Duration::from_secs(60));
    assert!(producer.status.success(), "{}", producer.stderr);
}
