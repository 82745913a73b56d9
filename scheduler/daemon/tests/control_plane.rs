//! The scheduler's control socket under clients that misbehave or a history that only
//! grows: a real daemon on a real Unix socket. Every answer fits in a frame, however many
//! jobs it has seen; more clients than the cap are told why; a client that trickles is cut
//! off at the request's deadline; garbage closes only its own connection.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use common::{Daemon, GUARD, answer_on, decoded};
use ladle_scheduler::daemon::{MAX_CONNECTIONS, REQUEST_TIMEOUT};
use ladle_scheduler::estimate::Basis;
use ladle_scheduler::job::{JobId, JobSpec};
use ladle_scheduler::journal::{Outcome, Record};
use ladle_scheduler::protocol::{
    FeedSpec, JobQuery, MAX_FRAME, MAX_QUERY_IDS, QUEUE_FINISHED, Request, Response, VERSION,
};

const JOBS: u64 = 5000;

/// A job as a sweep submits it, with a command and a run name of about a kilobyte.
fn long_spec(id: JobId) -> JobSpec {
    let mut spec = JobSpec::new(
        vec![
            "python".into(),
            "train.py".into(),
            "--name".into(),
            format!("{}-{id}", "very-long-experiment-name-".repeat(24)),
        ],
        "/".into(),
    );
    spec.gpu_mem_mib = Some(1024);
    spec.feed = Some("sweep-1".into());
    spec.env = vec![("LADLE_RUN".into(), format!("{}{id}", "r".repeat(300)))];
    spec
}

fn submitted(id: JobId) -> Record {
    Record::Submitted {
        id,
        spec: long_spec(id),
        estimate_mib: 1024,
        basis: Basis::Declared,
        at: 0.0,
    }
}

/// Attempt `attempt` of job `id` ran (as a process long gone) and ended with `outcome`.
fn attempt(id: JobId, attempt: u32, outcome: Outcome, reason: &str) -> Vec<Record> {
    vec![
        Record::Starting {
            id,
            attempt,
            gpus: vec![0],
            limit_mib: None,
            estimate_mib: Some(1024),
            exclusive: false,
            until_measured: false,
        },
        Record::Started {
            id,
            attempt,
            pid: u32::MAX - 1,
            start_ticks: 1,
        },
        Record::Finished {
            id,
            attempt,
            outcome,
            code: Some(1),
            peak_mib: None,
            reason: reason.to_owned(),
            cpu_s: None,
        },
    ]
}

/// 5000 finished jobs with long commands: most cancelled while queued, every tenth failed
/// with a long reason, and job 1 run twice (an out-of-memory retry).
fn history() -> Vec<Record> {
    let mut records = Vec::new();
    for id in 1..=JOBS {
        records.push(submitted(id));
        if id == 1 {
            records.extend(attempt(1, 1, Outcome::OutOfMemory, "out of memory"));
            records.push(Record::Requeued {
                id: 1,
                estimate_mib: 2048,
                basis: None,
                exclusive: true,
                out_of_memory: true,
            });
            records.extend(attempt(1, 2, Outcome::Failed, "exit code 1"));
        } else if id % 10 == 0 {
            let reason = format!("exit code 1: {}", "Traceback line ".repeat(200));
            records.extend(attempt(id, 1, Outcome::Failed, &reason));
        } else {
            records.push(Record::Cancelled { id });
        }
    }
    records
}

/// Writes `bytes` of control characters (each escapes to six bytes of JSON) as every log
/// of job 1.
fn binary_logs(daemon: &Daemon, bytes: usize) {
    let logs = daemon.dir.join("jobs").join("1");
    std::fs::create_dir_all(&logs).unwrap();
    for attempt in 1..=2 {
        for ext in ["out", "err"] {
            std::fs::write(logs.join(format!("{attempt}.{ext}")), vec![1u8; bytes]).unwrap();
        }
    }
}

#[test]
fn every_answer_of_a_daemon_holding_5000_finished_jobs_with_long_commands_fits_in_a_frame() {
    let daemon = Daemon::start(&history());
    binary_logs(&daemon, 64 * 1024);

    // The overview: bounded, and saying what it leaves out.
    let Response::Queue {
        jobs,
        totals,
        omitted,
        ..
    } = decoded(&daemon.raw(&Request::Queue))
    else {
        panic!("not a queue answer");
    };
    assert!(
        !jobs.is_empty() && jobs.len() <= QUEUE_FINISHED,
        "{}",
        jobs.len()
    );
    assert_eq!(omitted, JOBS - jobs.len() as u64);
    assert_eq!(
        jobs.last().unwrap().id,
        JOBS,
        "the latest finished job is listed"
    );
    assert!(jobs.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
    assert_eq!(totals.cancelled + totals.failed, JOBS);
    assert_eq!(totals.failed, JOBS / 10 + 1);
    assert_eq!(totals.admissions, JOBS / 10 + 2);
    assert_eq!(totals.oom_retries, 1);

    // Every job, a page at a time: each job once, in order.
    let mut seen = Vec::new();
    let mut query = JobQuery::default();
    let mut pages = 0;
    loop {
        let Response::Jobs { jobs, next, .. } = decoded(&daemon.raw(&Request::Jobs(query.clone())))
        else {
            panic!("not a jobs answer");
        };
        pages += 1;
        seen.extend(jobs.iter().map(|j| j.id));
        match next {
            Some(after) => query.after = Some(after),
            None => break,
        }
    }
    assert!(pages > 1, "5000 long jobs take more than one page");
    assert_eq!(seen, (1..=JOBS).collect::<Vec<_>>());

    // By id, as many as a query may name, one of them unknown.
    let mut ids: Vec<JobId> = (1..MAX_QUERY_IDS as u64).collect();
    ids.push(JOBS + 7);
    let mut query = JobQuery {
        ids,
        ..JobQuery::default()
    };
    let (mut found, mut unknown) = (0, Vec::new());
    loop {
        let Response::Jobs {
            jobs,
            next,
            unknown: missing,
        } = decoded(&daemon.raw(&Request::Jobs(query.clone())))
        else {
            panic!("not a jobs answer");
        };
        found += jobs.len();
        unknown.extend(missing);
        match next {
            Some(after) => query.after = Some(after),
            None => break,
        }
    }
    assert_eq!(found, MAX_QUERY_IDS - 1);
    assert!(unknown.iter().all(|&id| id == JOBS + 7) && !unknown.is_empty());

    // By feed: every job carries the sweep's feed; another feed has none.
    let by_feed = |feed: &str| {
        decoded(&daemon.raw(&Request::Jobs(JobQuery {
            feed: Some(feed.into()),
            ..JobQuery::default()
        })))
    };
    assert!(
        matches!(by_feed("sweep-1"), Response::Jobs { jobs, next: Some(_), .. } if !jobs.is_empty())
    );
    assert!(matches!(by_feed("other"), Response::Jobs { jobs, next: None, .. } if jobs.is_empty()));

    // Logs of two attempts whose tails are all control characters.
    let Response::Logs {
        attempts, omitted, ..
    } = decoded(&daemon.raw(&Request::Logs { id: 1 }))
    else {
        panic!("not a logs answer");
    };
    assert_eq!(
        attempts.last().unwrap().attempt,
        2,
        "the latest attempt comes first"
    );
    assert_eq!(attempts.len() as u32 + omitted, 2);

    // Many feeds with long descriptions.
    for n in 0..40 {
        let feed = FeedSpec {
            name: format!("feed-{n}"),
            socket: "/tmp/nowhere.sock".into(),
            dataset: "\u{1}".repeat(32 * 1024),
            transform: String::new(),
            threads: 0,
            pid: std::process::id(),
            ring_bytes: u64::MAX,
        };
        let answer = decoded(&daemon.raw(&Request::RegisterFeed(feed)));
        assert!(
            matches!(answer, Response::FeedRegistered { .. }),
            "{answer:?}"
        );
    }
    let Response::Feeds { feeds, omitted, .. } = decoded(&daemon.raw(&Request::Feeds)) else {
        panic!("not a feeds answer");
    };
    assert_eq!(feeds.len() as u32 + omitted, 40);

    // An error that quotes a long request.
    let mut spec = long_spec(0);
    spec.feed = Some("\"".repeat(400 * 1024));
    let answer = decoded(&daemon.raw(&Request::Submit(spec)));
    assert!(
        matches!(&answer, Response::Error { message } if message.contains("no live feed")),
        "{answer:?}"
    );
}

#[test]
fn more_clients_than_the_cap_are_refused_with_the_reason_while_a_connected_client_is_served() {
    let daemon = Daemon::start(&[]);
    let idle: Vec<_> = (0..MAX_CONNECTIONS - 1).map(|_| daemon.connect()).collect();
    let mut patient = daemon.connect();
    // The listener takes connections in order: these come after the cap is full.
    for _ in 0..5 {
        let mut extra = daemon.connect();
        let Response::Error { message } = answer_on(&mut extra) else {
            panic!("a connection over the cap was not refused");
        };
        assert!(
            message.contains("too many connections")
                && message.contains(&MAX_CONNECTIONS.to_string()),
            "{message}"
        );
    }
    // The client inside the cap is served.
    protocol_write(&mut patient, &Request::Queue);
    assert!(matches!(answer_on(&mut patient), Response::Queue { .. }));
    // Once the idle clients go, everyone is served again.
    drop(idle);
    assert!(matches!(
        daemon.served(&Request::Queue),
        Response::Queue { .. }
    ));
}

fn protocol_write(conn: &mut std::os::unix::net::UnixStream, request: &Request) {
    let mut frame = Vec::new();
    ladle_scheduler::protocol::write_frame(&mut frame, request, std::path::Path::new("x")).unwrap();
    conn.write_all(&frame).unwrap();
}

#[test]
fn a_client_trickling_a_byte_at_a_time_is_cut_off_at_the_request_deadline() {
    let daemon = Daemon::start(&[]);
    let mut conn = daemon.connect();
    conn.set_read_timeout(Some(Duration::from_millis(250)))
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // Leading spaces are valid JSON: a request that never ends, a byte every 250 ms.
    loop {
        assert!(
            started.elapsed() < GUARD,
            "the trickling client was never cut off"
        );
        if conn.write_all(b" ").is_err() {
            break; // closed under us
        }
        let mut buf = [0u8; 4096];
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    assert!(started.elapsed() >= REQUEST_TIMEOUT);
    let Response::Error { message } = decoded(&answer) else {
        panic!("no error answer");
    };
    assert!(message.contains("no complete request within"), "{message}");
    // The daemon is as it was.
    assert!(matches!(
        daemon.served(&Request::Queue),
        Response::Queue { .. }
    ));
}

#[test]
fn garbage_and_oversize_frames_close_only_their_own_connection() {
    let daemon = Daemon::start(&[]);
    let mut patient = daemon.connect();
    let old = VERSION - 1;
    for garbage in [
        b"\x00\xff\x13garbage\n".to_vec(),
        format!("{{\"v\":{VERSION},\"op\":\"explode\"}}\n").into_bytes(),
        format!("{{\"v\":{old},\"op\":\"queue\"}}\n").into_bytes(),
    ] {
        let mut conn = daemon.connect();
        conn.write_all(&garbage).unwrap();
        let answer = answer_on(&mut conn);
        assert!(matches!(answer, Response::Error { .. }), "{answer:?}");
    }
    // A client of the previous version is told which versions differ.
    let mut previous = daemon.connect();
    (previous.write_all(format!("{{\"v\":{old},\"op\":\"queue\"}}\n").as_bytes())).unwrap();
    let Response::Error { message } = answer_on(&mut previous) else {
        panic!("a version-{old} request was not refused");
    };
    assert!(
        message.contains(&format!("protocol version {old}, expected {VERSION}")),
        "{message}"
    );
    // A line longer than a frame: the daemon stops reading at the limit and says so.
    let mut big = daemon.connect();
    let writer = {
        let mut big = big.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = big.write_all(&vec![b' '; MAX_FRAME + 4096]);
        })
    };
    let Response::Error { message } = answer_on(&mut big) else {
        panic!("an oversize frame was not refused");
    };
    assert!(message.contains("longer than"), "{message}");
    drop(big);
    writer.join().unwrap();
    // The connection opened before all that is still served.
    protocol_write(&mut patient, &Request::Queue);
    assert!(matches!(answer_on(&mut patient), Response::Queue { .. }));
}
