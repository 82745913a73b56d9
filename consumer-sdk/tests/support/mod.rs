//! A small producer for tests, built on `ladle-ring` directly: a real Unix socket in its own
//! temporary directory, a real shared-memory ring, one consumer. Cleans up in `Drop`, and a
//! watchdog aborts the test binary if a test deadlocks. Some behaviours are hostile (an
//! unsealed ring it can shrink, a `Welcome` trickled a byte at a time, duplicate indices):
//! what a buggy or malicious producer could do to its consumers.

// Each test file uses a different part; a fake (and sometimes hostile) producer binds its
// socket raw, not by ladle-os's policy.
#![allow(dead_code, clippy::disallowed_methods)]

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ladle_ring::protocol::{
    self, ClientMessage, DatasetInfo, FeedIdentity, PROTOCOL_VERSION, ServerMessage, Welcome,
};
use ladle_ring::{CursorPage, Gate, ProducerRing, RingLayout};

/// Ring capacity of the test producer (8×8 images).
pub(crate) const CAPACITY: u64 = 512;

/// Aborts the process when not dropped within its limit: a deadlock fails loudly.
pub(crate) struct Watchdog {
    _done: mpsc::Sender<()>,
}

impl Watchdog {
    pub(crate) fn new(what: &str, limit: Duration) -> Self {
        let (done, wait) = mpsc::channel::<()>();
        let what = what.to_owned();
        std::thread::spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                eprintln!("watchdog: {what} still running after {limit:?}; deadlock? aborting");
                std::process::abort();
            }
        });
        Self { _done: done }
    }
}

/// What the producer does once it has published every sample below `stop_at`.
#[derive(Debug, Clone)]
pub(crate) enum AtStop {
    /// Keep the connection open and publish nothing more.
    Hold,
    /// Close the control socket (as a crashed producer's kernel would).
    HangUp,
    /// Send `End{reason}`, then mark the ring ended.
    End(String),
}

/// How the test producer answers `Hello`.
#[derive(Debug, Clone)]
pub(crate) enum Behaviour {
    /// Welcome, then publish samples `seq` with dataset index `seq % len` and label = index.
    Serve {
        len: u64,
        start_seq: u64,
        stop_at: Option<u64>,
        at_stop: AtStop,
    },
    /// Answer `Reject{reason}`.
    Reject(String),
    /// Read the Hello and never answer.
    Silent,
    /// Welcome with the next protocol version.
    WrongVersion,
    /// Serve as `serve(len, 0)`, but once the ring has been full for 200 ms with the
    /// consumer delivering nothing, let it go and publish nothing more until it rejoins
    /// (then attach it at the next sequence and go on).
    LetGoWhenFull { len: u64 },
    /// Hostile: Welcome with this file unsealed (a copy of a real ring's header, or a fresh
    /// cursor page), which [`TestProducer::shrink_unsealed`] then shrinks to nothing; publish
    /// nothing.
    Unsealed(Unsealed),
    /// Hostile: answer `Hello` with the length of a large frame, then one byte of it every
    /// 10 ms, until the consumer hangs up.
    TrickleWelcome,
    /// Hostile: serve as `serve(len, 0)`, but give sample `seq` the dataset index
    /// `seq % len / 2 * 2` (every even index twice, no odd one): no epoch covers the dataset.
    Duplicates { len: u64 },
}

/// Which file [`Behaviour::Unsealed`] leaves unsealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsealed {
    /// The ring.
    Ring,
    /// The consumer's cursor page.
    CursorPage,
}

impl Unsealed {
    /// The file's name in [`ConnectError::UnsealedMemory`](ladle_consumer::ConnectError).
    pub(crate) fn file(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::CursorPage => "cursor page",
        }
    }
}

impl Behaviour {
    /// Serves forever.
    pub(crate) fn serve(len: u64, start_seq: u64) -> Self {
        Self::Serve {
            len,
            start_seq,
            stop_at: None,
            at_stop: AtStop::Hold,
        }
    }
}

/// The byte every pixel of dataset index `index` holds.
pub(crate) fn pixel(index: u64) -> u8 {
    (index % 251) as u8
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    saw_leave: AtomicBool,
    saw_eof: AtomicBool,
    cursor: Mutex<Option<Arc<CursorPage>>>,
    /// The unsealed file of [`Behaviour::Unsealed`], once sent.
    unsealed: Mutex<Option<File>>,
}

/// The running test producer; stops and removes its socket when dropped.
pub(crate) struct TestProducer {
    dir: tempfile::TempDir,
    socket: PathBuf,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    _watchdog: Watchdog,
}

impl TestProducer {
    pub(crate) fn start(behaviour: Behaviour) -> Self {
        let watchdog = Watchdog::new("a consumer test", Duration::from_secs(60));
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("producer.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = shared.clone();
            std::thread::spawn(move || accept_one(listener, behaviour, &shared))
        };
        Self {
            dir,
            socket,
            shared,
            thread: Some(thread),
            _watchdog: watchdog,
        }
    }

    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The consumer's cursor as the producer sees it.
    pub(crate) fn cursor(&self) -> u64 {
        let page = self.shared.cursor.lock().unwrap();
        page.as_ref().expect("no consumer joined").cursor()
    }

    /// Whether the consumer said `Leave`.
    pub(crate) fn saw_leave(&self) -> bool {
        self.shared.saw_leave.load(Ordering::SeqCst)
    }

    /// Whether the consumer's connection reached EOF.
    pub(crate) fn saw_eof(&self) -> bool {
        self.shared.saw_eof.load(Ordering::SeqCst)
    }

    /// [`Behaviour::Unsealed`]: shrinks the unsealed file to nothing, under any mapping of it.
    pub(crate) fn shrink_unsealed(&self) {
        let file = self.shared.unsealed.lock().unwrap();
        file.as_ref()
            .expect("no unsealed file sent")
            .set_len(0)
            .unwrap();
    }
}

impl Drop for TestProducer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn stopped(shared: &Shared) -> bool {
    shared.stop.load(Ordering::SeqCst)
}

fn accept_one(listener: UnixListener, behaviour: Behaviour, shared: &Shared) {
    let sock = loop {
        if stopped(shared) {
            return;
        }
        match listener.accept() {
            Ok((sock, _)) => break sock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (hello, _) = protocol::recv::<ClientMessage>(&sock).unwrap();
    let ClientMessage::Hello(hello) = hello else {
        panic!("expected Hello, got {hello:?}")
    };
    assert_eq!(hello.version, PROTOCOL_VERSION);
    match behaviour {
        Behaviour::Reject(reason) => {
            protocol::send(&sock, &ServerMessage::Reject { reason }, &[]).unwrap();
            hold(&sock, shared);
        }
        Behaviour::Silent => hold(&sock, shared),
        Behaviour::WrongVersion => {
            let ring = ring();
            let page = CursorPage::create(0).unwrap();
            let mut welcome = welcome(&ring, 10, 0);
            welcome.version = PROTOCOL_VERSION + 1;
            protocol::send(
                &sock,
                &ServerMessage::Welcome(welcome),
                &[ring.fd(), page.fd().unwrap()],
            )
            .unwrap();
            hold(&sock, shared);
        }
        Behaviour::Serve {
            len,
            start_seq,
            stop_at,
            at_stop,
        } => serve(sock, len, start_seq, stop_at, at_stop, shared),
        Behaviour::LetGoWhenFull { len } => serve_letting_go(&sock, len, shared),
        Behaviour::Unsealed(which) => {
            let ring = ring();
            let page = CursorPage::create(0).unwrap();
            let (unsealed, fds) = match which {
                Unsealed::Ring => {
                    let copy = unsealed_copy(ring.fd(), ring.layout().file_len());
                    let fds = [copy.as_fd(), page.fd().unwrap()].map(|fd| fd.try_clone_to_owned());
                    (copy, fds)
                }
                Unsealed::CursorPage => {
                    let copy = unsealed_copy(page.fd().unwrap(), 4096);
                    let fds = [ring.fd(), copy.as_fd()].map(|fd| fd.try_clone_to_owned());
                    (copy, fds)
                }
            };
            let fds = fds.map(Result::unwrap);
            *shared.unsealed.lock().unwrap() = Some(unsealed);
            protocol::send(
                &sock,
                &ServerMessage::Welcome(welcome(&ring, 10, 0)),
                &[fds[0].as_fd(), fds[1].as_fd()],
            )
            .unwrap();
            hold(&sock, shared);
        }
        Behaviour::TrickleWelcome => trickle(sock, shared),
        Behaviour::Duplicates { len } => {
            serve_indices(sock, len, 0, None, AtStop::Hold, shared, &|seq| {
                seq % len / 2 * 2
            })
        }
    }
}

/// A memfd that can be resized, holding the first `len` bytes of `fd` (the ring's header
/// page with its magic and head, or a fresh cursor page).
fn unsealed_copy(fd: BorrowedFd<'_>, len: u64) -> File {
    let source = File::from(fd.try_clone_to_owned().unwrap());
    let copy = File::from(ladle_ring::sys::memfd("ladle-unsealed", len).unwrap());
    let mut page = vec![0u8; 4096];
    source.read_exact_at(&mut page, 0).unwrap();
    copy.write_all_at(&page, 0).unwrap();
    copy
}

/// Sends the length of a large frame, then one byte of it every 10 ms until the consumer
/// hangs up or the test ends.
fn trickle(mut sock: UnixStream, shared: &Shared) {
    let len = (ladle_ring::protocol::MAX_FRAME as u32 - 1).to_le_bytes();
    if sock.write_all(&len).is_err() {
        return;
    }
    while !stopped(shared) {
        if sock.write_all(b" ").is_err() {
            shared.saw_eof.store(true, Ordering::SeqCst);
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn serve_letting_go(sock: &UnixStream, len: u64, shared: &Shared) {
    let ring = ring();
    let mut readers = ring.readers().unwrap();
    let page = Arc::new(CursorPage::create(0).unwrap());
    readers.attach(&ring, 1, page.clone(), None).unwrap();
    *shared.cursor.lock().unwrap() = Some(page.clone());
    protocol::send(
        sock,
        &ServerMessage::Welcome(welcome(&ring, len, 0)),
        &[ring.fd(), page.fd().unwrap()],
    )
    .unwrap();
    let mut full_since: Option<(std::time::Instant, u64)> = None;
    while !stopped(shared) {
        match protocol::poll::<ClientMessage>(sock) {
            Ok(None) => {}
            Ok(Some(ClientMessage::Rejoin)) => {
                let start = readers.attach(&ring, 1, page.clone(), None).unwrap();
                protocol::send(sock, &ServerMessage::Rejoined { start_seq: start }, &[]).unwrap();
            }
            Ok(Some(ClientMessage::Leave)) => shared.saw_leave.store(true, Ordering::SeqCst),
            // What a gathered epoch still needs (protocol 13): this producer decodes every
            // position anyway, which a consumer must take (a declaration only saves decodes).
            Ok(Some(ClientMessage::Needs(frame))) => declared(sock, &frame),
            Ok(Some(other)) => panic!("unexpected {other:?}"),
            Err(_) => {
                shared.saw_eof.store(true, Ordering::SeqCst);
                return;
            }
        }
        match ring.try_loan(&readers) {
            Gate::Loan(mut loan) => {
                let seq = loan.seq();
                write_image(&mut loan.slot(), seq % len);
                if let Some(head) = loan.commit(seq % len) {
                    page.wake_if_due(head);
                }
                full_since = None;
            }
            Gate::Full { .. } => {
                let lease = page.lease();
                match full_since {
                    Some((since, seen)) if seen == lease => {
                        if since.elapsed() > Duration::from_millis(200) && page.let_go(lease) {
                            readers.detach(1);
                            full_since = None;
                        }
                    }
                    _ => full_since = Some((std::time::Instant::now(), lease)),
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Gate::Idle | Gate::Violations(_) | Gate::Ahead { .. } => {
                std::thread::sleep(Duration::from_millis(2))
            }
        }
    }
}

fn ring() -> ProducerRing {
    ProducerRing::create(RingLayout::image(CAPACITY, 8, 8).unwrap()).unwrap()
}

fn welcome(ring: &ProducerRing, len: u64, start_seq: u64) -> Welcome {
    Welcome {
        version: PROTOCOL_VERSION,
        consumer_id: 1,
        layout: ring.layout().clone(),
        dataset: DatasetInfo {
            len,
            class_names: vec!["a".into(), "b".into()],
            source: "test".into(),
        },
        start_seq,
        identity: FeedIdentity {
            source: "test".into(),
            len,
            classes: FeedIdentity::hash_classes(&["a".into(), "b".into()]),
            seed: 0,
            transform: String::new(),
            schema: ring.layout().schema.to_string(),
            files: String::new(),
            sizes: String::new(),
        },
    }
}

/// Keeps the connection open until the test ends or the consumer leaves.
fn hold(sock: &UnixStream, shared: &Shared) {
    while !stopped(shared) {
        if watch(sock, shared) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Answers a declaration's last frame (protocol 14); this producer skips nothing.
fn declared(sock: &UnixStream, frame: &protocol::NeedsFrame) {
    let words = frame.words.len() as u64 / 16;
    if frame.offset + words >= frame.len.div_ceil(64) {
        let _ = protocol::send(sock, &ServerMessage::Declared { id: frame.id }, &[]);
    }
}

/// Whether the consumer has left (Leave or EOF).
fn watch(sock: &UnixStream, shared: &Shared) -> bool {
    match protocol::poll::<ClientMessage>(sock) {
        Ok(None) => false,
        Ok(Some(ClientMessage::Leave)) => {
            shared.saw_leave.store(true, Ordering::SeqCst);
            false
        }
        Ok(Some(ClientMessage::Needs(frame))) => {
            declared(sock, &frame);
            false
        }
        Ok(Some(other)) => panic!("unexpected {other:?}"),
        Err(_) => {
            shared.saw_eof.store(true, Ordering::SeqCst);
            true
        }
    }
}

fn serve(
    sock: UnixStream,
    len: u64,
    start_seq: u64,
    stop_at: Option<u64>,
    at_stop: AtStop,
    shared: &Shared,
) {
    serve_indices(sock, len, start_seq, stop_at, at_stop, shared, &|seq| {
        seq % len
    });
}

/// [`serve`], sample `seq` holding dataset index `index(seq)`.
fn serve_indices(
    sock: UnixStream,
    len: u64,
    start_seq: u64,
    stop_at: Option<u64>,
    mut at_stop: AtStop,
    shared: &Shared,
    index: &dyn Fn(u64) -> u64,
) {
    let ring = ring();
    let mut readers = ring.readers().unwrap();
    ring.start_at(&readers, start_seq).unwrap();
    let page = Arc::new(CursorPage::create(start_seq).unwrap());
    readers.attach(&ring, 1, page.clone(), None).unwrap();
    *shared.cursor.lock().unwrap() = Some(page.clone());
    protocol::send(
        &sock,
        &ServerMessage::Welcome(welcome(&ring, len, start_seq)),
        &[ring.fd(), page.fd().unwrap()],
    )
    .unwrap();
    let limit = stop_at.unwrap_or(u64::MAX);
    let mut seq = start_seq;
    while !stopped(shared) {
        if watch(&sock, shared) {
            return;
        }
        let cursor = page.cursor();
        // Publish in small chunks so that consumers really wait now and then.
        let mut wrote = 0;
        let mut head = None;
        while wrote < 16 && seq < limit {
            let Gate::Loan(mut loan) = ring.try_loan(&readers) else {
                break;
            };
            write_image(&mut loan.slot(), index(seq));
            head = loan.commit(index(seq)).or(head);
            seq += 1;
            wrote += 1;
        }
        if let Some(head) = head {
            page.wake_if_due(head);
        } else if seq >= limit {
            match std::mem::replace(&mut at_stop, AtStop::Hold) {
                AtStop::Hold => std::thread::sleep(Duration::from_millis(5)),
                AtStop::HangUp => return,
                AtStop::End(reason) => {
                    // The message first, then the flag: a consumer that sees the flag finds
                    // the reason waiting on its socket.
                    protocol::send(&sock, &ServerMessage::End { reason }, &[]).unwrap();
                    ring.end();
                    page.wake();
                }
            }
        } else {
            page.wait_for_release(cursor, Duration::from_millis(10));
        }
    }
}

/// Writes dataset sample `index` into an image slot: every pixel `pixel(index)`, label
/// `index` (its commit sets the index).
fn write_image(slot: &mut ladle_ring::SlotMut<'_>, index: u64) {
    slot.field(0).fill(pixel(index));
    slot.field(1).copy_from_slice(&(index as i64).to_ne_bytes());
}
