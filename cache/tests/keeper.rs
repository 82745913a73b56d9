//! The keeper against hostile and broken lanes, over its real socket: records that are not
//! complete or not the sample named, arenas not sealed, lanes that go before they publish,
//! garbage and other versions, and operators dropping what feeds still read.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ladle_cache::layout::{
    HEADER_LEN, INDEX_HEADER_LEN, IndexHeader, Location, RecordHeader, index_file_len,
};
use ladle_cache::wire::{Answer, Ask, ClaimOutcome, DatasetKey, KEEPER_VERSION};
use ladle_datasets::cache::Stamp;
use ladle_os::shm::Mapping;
use ladle_ring::protocol;

const LEN: u64 = 10;

/// A keeper in a thread of this process, serving in a temporary directory; it exits when
/// the directory goes.
struct Keeper {
    dir: tempfile::TempDir,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    fn start(budget: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = ladle_cache::keeper::KeeperConfig {
            dir: dir.path().to_path_buf(),
            budget,
            idle_timeout: Duration::from_secs(60),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            ladle_cache::keeper::run(config, |_| tx.send(()).unwrap()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(60)).unwrap();
        Self {
            dir,
            thread: Some(thread),
        }
    }

    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("cache.sock")
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn dataset() -> DatasetKey {
    DatasetKey {
        key: "k".into(),
        root: "/data".into(),
        len: LEN,
    }
}

fn ask(conn: &UnixStream, what: &Ask, fd: Option<&OwnedFd>) -> (Answer, Vec<OwnedFd>) {
    let fds: Vec<_> = fd.iter().map(|f| f.as_fd()).collect();
    protocol::send(conn, what, &fds).unwrap();
    protocol::recv_by::<Answer>(conn, Instant::now() + Duration::from_secs(60)).unwrap()
}

/// A lane and the index its Welcome lent, mapped read-only.
fn lane(socket: &Path) -> (UnixStream, Mapping) {
    let conn = UnixStream::connect(socket).unwrap();
    let hello = Ask::Hello {
        version: KEEPER_VERSION,
        dataset: Some(dataset()),
        pid: std::process::id(),
    };
    let (answer, mut fds) = ask(&conn, &hello, None);
    assert!(matches!(answer, Answer::Welcome { .. }), "{answer:?}");
    let fd = fds.pop().unwrap();
    let index = Mapping::new(fd.as_fd(), 0, index_file_len(LEN) as usize, false, false).unwrap();
    (conn, index)
}

fn word(index: &Mapping, i: u64) -> u64 {
    // SAFETY: inside the index mapping (i < LEN), 8-aligned; the keeper writes it atomically.
    let at = unsafe {
        &*index
            .as_ptr()
            .add(INDEX_HEADER_LEN as usize + 8 * i as usize)
            .cast::<AtomicU64>()
    };
    at.load(Ordering::Acquire)
}

fn header_word(index: &Mapping, which: IndexHeader) -> u64 {
    // SAFETY: the header page, 8-aligned.
    let at = unsafe { &*index.as_ptr().cast::<AtomicU64>().add(which as usize) };
    at.load(Ordering::Acquire)
}

/// A granted, adopted arena of 64 KiB, mapped writable: (id, fd, mapping).
fn arena(conn: &UnixStream, seal: bool) -> (u32, OwnedFd, Mapping, Answer) {
    let (answer, _) = ask(
        conn,
        &Ask::Grant {
            bytes: 65536,
            at_least: 4096,
        },
        None,
    );
    let Answer::Granted { id, bytes } = answer else {
        panic!("{answer:?}")
    };
    let fd = ladle_os::shm::memfd("ladle-cache-arena", bytes).unwrap();
    let map = Mapping::new(fd.as_fd(), 0, bytes as usize, true, false).unwrap();
    if seal {
        ladle_os::shm::seal_against_writers(fd.as_fd()).unwrap();
    }
    let (adopted, _) = ask(conn, &Ask::Adopt { id }, Some(&fd));
    (id, fd, map, adopted)
}

fn write_record(map: &Mapping, offset: usize, index: u64) {
    let header = RecordHeader {
        width: 2,
        height: 2,
        index,
        stamp: Stamp {
            size: 5,
            mtime_ns: 6,
        },
    };
    // SAFETY: our own writable mapping of 64 KiB; the record is 64 + 12 bytes at `offset`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            header.encode().as_ptr(),
            map.as_ptr().add(offset),
            HEADER_LEN,
        );
        std::ptr::write_bytes(map.as_ptr().add(offset + HEADER_LEN), 7, 12);
    }
}

#[test]
fn a_publish_of_no_record_or_of_another_samples_record_is_refused_and_publishes_nothing() {
    let keeper = Keeper::start(1 << 30);
    // Nothing written where it says.
    let (conn, index) = lane(&keeper.socket());
    let (id, _fd, _map, adopted) = arena(&conn, true);
    assert_eq!(adopted, Answer::Done);
    assert!(matches!(
        ask(&conn, &Ask::Claim { index: 3 }, None).0,
        Answer::Claimed {
            outcome: ClaimOutcome::Fill
        }
    ));
    let (answer, _) = ask(
        &conn,
        &Ask::Publish {
            index: 3,
            arena: id,
            offset: 0,
        },
        None,
    );
    assert!(
        matches!(&answer, Answer::Refused { reason } if reason.contains("no complete record")),
        "{answer:?}"
    );
    assert_eq!(word(&index, 3), 0);
    // The refused lane was closed; its claim went with it.
    assert!(protocol::recv_by::<Answer>(&conn, Instant::now() + Duration::from_secs(60)).is_err());
    // Sample 4's record published as sample 3.
    let (conn, index) = lane(&keeper.socket());
    assert!(matches!(
        ask(&conn, &Ask::Claim { index: 3 }, None).0,
        Answer::Claimed {
            outcome: ClaimOutcome::Fill
        }
    ));
    let (id, _fd, map, _) = arena(&conn, true);
    write_record(&map, 0, 4);
    let (answer, _) = ask(
        &conn,
        &Ask::Publish {
            index: 3,
            arena: id,
            offset: 0,
        },
        None,
    );
    assert!(
        matches!(&answer, Answer::Refused { reason } if reason.contains("not 3")),
        "{answer:?}"
    );
    assert_eq!(word(&index, 3), 0);
    // A complete record of the sample named: published, where it lies.
    let (conn, index) = lane(&keeper.socket());
    let (id, _fd, map, _) = arena(&conn, true);
    write_record(&map, 64, 3);
    assert_eq!(
        ask(
            &conn,
            &Ask::Publish {
                index: 3,
                arena: id,
                offset: 64
            },
            None
        )
        .0,
        Answer::Done
    );
    assert_eq!(
        Location::of_word(word(&index, 3)),
        Some(Location {
            arena: id,
            offset: 64
        })
    );
}

#[test]
fn an_arena_that_others_could_still_write_is_refused() {
    let keeper = Keeper::start(1 << 30);
    let (conn, _) = lane(&keeper.socket());
    let (_, _, _, adopted) = arena(&conn, false);
    assert!(
        matches!(&adopted, Answer::Refused { reason } if reason.contains("not sealed")),
        "{adopted:?}"
    );
}

#[test]
fn a_lane_that_goes_before_it_publishes_leaves_no_entry_and_frees_its_claim() {
    let keeper = Keeper::start(1 << 30);
    let (conn, index) = lane(&keeper.socket());
    assert!(matches!(
        ask(&conn, &Ask::Claim { index: 5 }, None).0,
        Answer::Claimed {
            outcome: ClaimOutcome::Fill
        }
    ));
    let (_, _fd, map, _) = arena(&conn, true);
    write_record(&map, 0, 5);
    let (other, _) = lane(&keeper.socket());
    drop(conn); // killed before its Publish
    // The other lane's claim waits for the first to fill, then gets it when the first goes.
    assert_eq!(
        ask(&other, &Ask::Claim { index: 5 }, None).0,
        Answer::Claimed {
            outcome: ClaimOutcome::Fill
        }
    );
    assert_eq!(
        word(&index, 5),
        0,
        "a complete record never published is no entry"
    );
}

#[test]
fn garbage_and_other_versions_on_the_keepers_socket_are_refused_and_it_goes_on_serving() {
    use std::io::Write;
    let keeper = Keeper::start(1 << 30);
    let mut garbage = UnixStream::connect(keeper.socket()).unwrap();
    garbage.write_all(&[0xff; 64]).unwrap();
    let old = UnixStream::connect(keeper.socket()).unwrap();
    let hello = Ask::Hello {
        version: KEEPER_VERSION + 1,
        dataset: Some(dataset()),
        pid: 1,
    };
    let (answer, fds) = ask(&old, &hello, None);
    assert!(fds.is_empty(), "no descriptor to another version");
    let want = format!(
        "the keeper speaks {KEEPER_VERSION}, the asker {}",
        KEEPER_VERSION + 1
    );
    assert!(
        matches!(&answer, Answer::Refused { reason } if reason.contains(&want)),
        "{answer:?}"
    );
    let (conn, _) = lane(&keeper.socket());
    assert!(matches!(
        ask(&conn, &Ask::Claim { index: 0 }, None).0,
        Answer::Claimed { .. }
    ));
    // An operator may not fill; a lane may not drop.
    let (answer, _) = ask(&conn, &Ask::Drop { key: None }, None);
    assert!(matches!(answer, Answer::Refused { .. }), "{answer:?}");
}

#[test]
fn a_dropped_dataset_is_marked_for_its_readers_and_refuses_their_asks() {
    let keeper = Keeper::start(1 << 30);
    let (conn, index) = lane(&keeper.socket());
    let operator = ladle_cache::operator(keeper.dir.path()).unwrap().unwrap();
    let listing = operator.list().unwrap();
    assert_eq!(listing.datasets.len(), 1);
    assert!(
        operator.drop_datasets(Some("nope")).is_err(),
        "an unknown key is an error"
    );
    operator.drop_datasets(Some("k")).unwrap();
    assert_eq!(header_word(&index, IndexHeader::Dropped), 1);
    let (answer, _) = ask(&conn, &Ask::Claim { index: 0 }, None);
    assert!(
        matches!(&answer, Answer::Refused { reason } if reason.contains("dropped")),
        "{answer:?}"
    );
    assert!(operator.list().unwrap().datasets.is_empty());
}
