//! Tests of the worker pool, with fake workers on threads.

use std::os::fd::AsFd;

use ladle_datasets::SampleError;
use ladle_datasets::pipeline::{SampleMaker, WorkItem};
use ladle_ring::protocol::{self, DatasetInfo};

use super::handshake::{Refusal, WorkerHello, WorkerWelcome, same_token};
use super::maker::{Reply, Request};
use super::*;
use crate::CustomSource;

const SCHEMA: &str = "x: f32[4], label: i64";

/// A fake worker on a thread: says hello, maps its staging buffer, and answers requests
/// with `answer(request, staging)`; `None` closes the connection (a death).
fn fake_worker(
    path: &Path,
    token: &str,
    answer: impl Fn(&Request, &mut [u8]) -> Option<Reply> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let conn = UnixStream::connect(path).unwrap();
    let hello = WorkerHello {
        token: token.into(),
        pid: 4242,
    };
    protocol::send(&conn, &hello, &[]).unwrap();
    std::thread::spawn(move || {
        let Ok((welcome, fds)) = protocol::recv::<WorkerWelcome>(&conn) else {
            return;
        };
        assert_eq!(fds.len(), 1, "the staging buffer comes with the welcome");
        let len = usize::try_from(welcome.len).unwrap();
        let staging = Mapping::new(fds[0].as_fd(), 0, len, true, false).unwrap();
        while let Ok((request, _)) = protocol::recv::<Request>(&conn) {
            // SAFETY: the whole mapping, which only this thread writes, and only while
            // the maker waits for the answer.
            let bytes = unsafe { std::slice::from_raw_parts_mut(staging.as_ptr(), len) };
            match answer(&request, bytes) {
                Some(reply) => protocol::send(&conn, &reply, &[]).unwrap(),
                None => return,
            }
        }
    })
}

fn ok() -> Reply {
    Reply {
        ok: true,
        error: None,
    }
}

fn pool_with(config: WorkerPoolConfig) -> (tempfile::TempDir, Arc<WorkerPool>) {
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let path = dir.path().join("w.sock");
    let pool = WorkerPool::bind(&path, SCHEMA.parse().unwrap(), config, stop).unwrap();
    (dir, pool)
}

fn pool() -> (tempfile::TempDir, Arc<WorkerPool>) {
    pool_with(WorkerPoolConfig::new("t0k"))
}

fn source(pool: &Arc<WorkerPool>, name: &str) -> WorkerSource {
    let info = DatasetInfo {
        len: 10,
        class_names: vec![],
        source: name.into(),
    };
    WorkerSource::new(info, Arc::clone(pool))
}

fn item(index: u64) -> WorkItem {
    WorkItem {
        seq: index,
        index,
        epoch: 0,
    }
}

/// Makes `index` into fresh buffers the size of the schema's fields.
fn make(maker: &mut dyn SampleMaker, index: u64) -> Result<(Vec<u8>, Vec<u8>), SampleError> {
    let (mut x, mut label) = (vec![0u8; 16], vec![0u8; 8]);
    maker.make(&item(index), &mut [&mut x, &mut label])?;
    Ok((x, label))
}

/// Waits, with a deadline that only catches a hang, until `ready`.
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_made_sample_is_copied_from_the_workers_staging_buffer_into_the_slot() {
    let (_dir, pool) = pool();
    let plan: Vec<(u64, usize)> = pool.plan.fields.clone();
    let worker = fake_worker(pool.path(), "t0k", move |r, staging| {
        let (x, label) = (plan[0], plan[1]);
        let value = (r.index as f32).to_ne_bytes().repeat(4);
        staging[x.0 as usize..][..x.1].copy_from_slice(&value);
        staging[label.0 as usize..][..label.1].copy_from_slice(&(r.index as i64).to_ne_bytes());
        Some(ok())
    });
    let source = source(&pool, "test");
    let mut maker = source.maker();
    for index in [3, 7] {
        let (x, label) = make(&mut maker, index).unwrap();
        assert_eq!(x, (index as f32).to_ne_bytes().repeat(4));
        assert_eq!(label, (index as i64).to_ne_bytes());
    }
    drop(maker);
    worker.join().unwrap();
}

#[test]
fn a_dead_worker_is_counted_and_its_sample_made_by_the_next_one() {
    let (_dir, pool) = pool();
    let dies_on_3 = fake_worker(pool.path(), "t0k", move |r, _| (r.index != 3).then(ok));
    let source = source(&pool, "test");
    let mut maker = source.maker();
    make(&mut maker, 1).unwrap();
    let spare = fake_worker(pool.path(), "t0k", move |_, _| Some(ok()));
    make(&mut maker, 3).unwrap();
    assert_eq!(
        pool.counts(),
        WorkerCounts {
            connected: 2,
            died: 1,
            failed: 0,
            refused: 0,
        }
    );
    dies_on_3.join().unwrap();
    drop(maker);
    spare.join().unwrap();
}

#[test]
fn a_sample_that_kills_two_workers_or_raises_is_an_error_naming_it() {
    let (_dir, pool) = pool();
    let source = source(&pool, "MyDataset");
    let raises = |r: &Request, _: &mut [u8]| {
        Some(Reply {
            ok: false,
            error: Some(format!("ValueError: bad {}", r.index)),
        })
    };
    let first = fake_worker(pool.path(), "t0k", |_, _| None);
    let second = fake_worker(pool.path(), "t0k", |_, _| None);
    let mut maker = source.maker();
    let err = make(&mut maker, 5).unwrap_err().to_string();
    assert!(err.contains("index 5 of MyDataset"), "{err}");
    // The pid logged is the kernel's for the socket (this test process), not the 4242
    // the hello claimed.
    let me = std::process::id();
    let twice = format!("worker process {me} died on it, then worker process {me} died on it");
    assert!(err.contains(&format!("{twice}; not tried again")), "{err}");
    let third = fake_worker(pool.path(), "t0k", raises);
    let err = make(&mut maker, 6).unwrap_err().to_string();
    assert_eq!(err, "sample index 6 of MyDataset: ValueError: bad 6");
    assert_eq!(
        pool.counts(),
        WorkerCounts {
            connected: 3,
            died: 2,
            failed: 1,
            refused: 0,
        }
    );
    drop(maker);
    for t in [first, second, third] {
        t.join().unwrap();
    }
}

#[test]
fn a_worker_with_a_wrong_token_gets_nothing() {
    let (_dir, pool) = pool();
    let conn = UnixStream::connect(pool.path()).unwrap();
    let hello = WorkerHello {
        token: "guess".into(),
        pid: 1,
    };
    protocol::send(&conn, &hello, &[]).unwrap();
    let got = protocol::recv::<WorkerWelcome>(&conn);
    assert!(got.is_err(), "a wrong token was welcomed");
    assert_eq!(pool.counts().connected, 0);
    assert!(same_token("t0k", "t0k") && !same_token("t0k", "t0K") && !same_token("t0k", "t0"));
}

#[test]
fn ten_idle_connections_do_not_keep_a_worker_out_and_samples_flow() {
    // Idle connections get two minutes to say hello: were handshakes one at a time, the
    // worker behind them would wait twenty.
    let mut config = WorkerPoolConfig::new("t0k");
    config.hello_timeout = Duration::from_secs(120);
    let (_dir, pool) = pool_with(config);
    let idle: Vec<UnixStream> = (0..10)
        .map(|_| UnixStream::connect(pool.path()).unwrap())
        .collect();
    wait_until("ten handshakes under way", || {
        pool.handshakes.load(Ordering::SeqCst) == 10
    });
    let worker = fake_worker(pool.path(), "t0k", |_, _| Some(ok()));
    wait_until("the worker admitted", || pool.counts().connected == 1);
    let source = source(&pool, "test");
    let mut maker = source.maker();
    for index in 0..5 {
        make(&mut maker, index).unwrap();
    }
    assert_eq!(
        pool.handshakes.load(Ordering::SeqCst),
        10,
        "the idle connections are still waiting, none was refused"
    );
    drop(maker);
    worker.join().unwrap();
    drop(idle);
}

#[test]
fn connections_over_the_handshake_cap_are_refused_with_a_reason() {
    let mut config = WorkerPoolConfig::new("t0k");
    config.hello_timeout = Duration::from_secs(120);
    config.max_handshakes = 3;
    let (_dir, pool) = pool_with(config);
    let idle: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect(pool.path()).unwrap())
        .collect();
    wait_until("three handshakes under way", || {
        pool.handshakes.load(Ordering::SeqCst) == 3
    });
    let over = UnixStream::connect(pool.path()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (refusal, fds) = protocol::recv_by::<Refusal>(&over, deadline).unwrap();
    assert!(fds.is_empty());
    assert!(
        refusal
            .error
            .starts_with("3 connections are already saying hello on "),
        "{}",
        refusal.error
    );
    assert_eq!(pool.counts().refused, 1);
    drop(idle);
    wait_until("the idle connections' handshakes over", || {
        pool.handshakes.load(Ordering::SeqCst) == 0
    });
    // Once they have hung up, a worker is admitted again.
    let worker = fake_worker(pool.path(), "t0k", |_, _| Some(ok()));
    wait_until("the worker admitted", || pool.counts().connected == 1);
    let source = source(&pool, "test");
    make(&mut source.maker(), 1).unwrap();
    worker.join().unwrap();
}

#[test]
fn stopping_the_feed_ends_a_sample_that_a_worker_never_answers() {
    let (_dir, pool) = pool();
    let (started_tx, started) = crossbeam_channel::bounded(1);
    let (release_tx, release) = crossbeam_channel::bounded::<()>(0);
    let stuck = fake_worker(pool.path(), "t0k", move |_, _| {
        started_tx.send(()).unwrap();
        let _ = release.recv(); // until the test ends: a __getitem__ that never returns
        None
    });
    let (done_tx, done) = crossbeam_channel::bounded(1);
    let maker_thread = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let source = source(&pool, "Stuck");
            let made = make(&mut source.maker(), 9).map(|_| ());
            done_tx.send(made.map_err(|e| e.to_string())).unwrap();
        })
    };
    started.recv_timeout(Duration::from_secs(30)).unwrap();
    pool.stop.store(true, Ordering::SeqCst);
    let made = done
        .recv_timeout(Duration::from_secs(30))
        .expect("the maker still waits on a worker after the stop");
    let err = made.unwrap_err();
    let me = std::process::id();
    assert_eq!(
        err,
        format!("sample index 9 of Stuck: the feed stopped before worker process {me} made it")
    );
    assert_eq!(pool.counts().died, 0, "a stop is not a death");
    maker_thread.join().unwrap();
    drop(release_tx);
    stuck.join().unwrap();
}
