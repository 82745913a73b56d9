//! What a person sees of a running feed, scheduler or sweep.
//!
//! In the picture of `docs/ARCHITECTURE.md` this crate sits beside the CLI, above the two
//! halves it watches: it reads a producer's [`FeedStats`](ladle_ring::protocol::FeedStats)
//! (in process, or with a `Stats` request on the feed's own socket) and the scheduler's
//! `Queue` overview (on its socket: running, queued and the latest finished jobs, and the
//! totals over every job), and nothing else. It never writes to a feed or a
//! scheduler.
//!
//! ```text
//!  Source (feed stats, scheduler queue) ─► Snapshot ─► Rates ─► Rows ─┬─► Latest ─► Prometheus text (--metrics)
//!        once a second, on an Observer thread                      ├─► recorder CSVs (--record)
//!                                                                  └─► ladle top (its own loop)
//! ```
//!
//! One conversion ([`Rates`]) turns counters into rates for every view, so the live view,
//! the metrics and the recorded series agree.
//!
//! Modules: [`series`] (snapshots to rows), [`prometheus`] (rows as OpenMetrics text; its doc
//! lists every metric), [`http`] (the `--metrics` endpoint serving them), [`record`] (the
//! `--record` CSV files) and [`report`] (reading a recording back and summarising it for
//! `ladle report`).
//!
//! ```
//! use std::time::Duration;
//! use ladle_observe::{Latest, Observer, Snapshot, series::unix_now};
//!
//! let latest = Latest::default();
//! // A source is anything that can look: here, a scheduler-less, feed-less one.
//! let source = || Snapshot { time: unix_now(), ..Snapshot::default() };
//! let observer = Observer::start(source, Duration::from_millis(10), vec![Box::new(latest.clone())]).unwrap();
//! while latest.get().is_none() {
//!     std::thread::sleep(Duration::from_millis(5));
//! }
//! observer.stop();
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub mod cost;
pub mod http;
pub mod prometheus;
pub mod record;
pub mod report;
pub mod series;

pub use series::{Rates, Rows, SchedulerView, Snapshot};

use ladle_scheduler_protocol::{self as sched, Request, Response};

/// How long a look waits for a feed's or the scheduler's answer.
pub const LOOK_TIMEOUT: Duration = Duration::from_secs(2);

/// Something that can take a [`Snapshot`]: the in-process producer, or sockets.
pub trait Source: Send {
    /// One look, now.
    fn look(&mut self) -> Snapshot;
}

impl<F: FnMut() -> Snapshot + Send> Source for F {
    fn look(&mut self) -> Snapshot {
        self()
    }
}

/// Where the rows of each look go (the metrics' latest value, a recorder's files).
pub trait Sink: Send {
    /// The rows of one look.
    fn tick(&mut self, rows: &Rows);
    /// The observer stops: flush and close.
    fn finish(&mut self) {}
}

/// The latest rows, shared (what a metrics endpoint serves).
#[derive(Debug, Clone, Default)]
pub struct Latest(Arc<Mutex<Option<Rows>>>);

impl Latest {
    /// The rows of the latest look, if there was one.
    pub fn get(&self) -> Option<Rows> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Sink for Latest {
    fn tick(&mut self, rows: &Rows) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(rows.clone());
    }
}

/// Feeds and a scheduler reached over their sockets: what `ladle top` and a recording of a
/// scheduler or a sweep look at.
#[derive(Debug, Clone, Default)]
pub struct Sockets {
    /// Feeds by name and control socket.
    pub feeds: Vec<(String, PathBuf)>,
    /// The scheduler's socket, if one is watched.
    pub scheduler: Option<PathBuf>,
    /// Also watch every feed registered with the scheduler.
    pub scheduler_feeds: bool,
}

impl Source for Sockets {
    fn look(&mut self) -> Snapshot {
        let mut snapshot = Snapshot {
            time: series::unix_now(),
            ..Snapshot::default()
        };
        let mut feeds = self.feeds.clone();
        if let Some(socket) = &self.scheduler {
            let queue = match sched::request(socket, &Request::Queue, LOOK_TIMEOUT) {
                Ok(Response::Queue {
                    policy,
                    jobs,
                    gpus,
                    totals,
                    gpus_from,
                    ..
                }) => Ok(SchedulerView {
                    policy,
                    jobs,
                    gpus,
                    totals,
                    gpus_from,
                }),
                Ok(other) => Err(format!("unexpected answer {other:?}")),
                Err(e) => Err(e.to_string()),
            };
            let reachable = queue.is_ok();
            snapshot.scheduler = Some(queue);
            if self.scheduler_feeds && reachable {
                if let Ok(Response::Feeds { feeds: known, .. }) =
                    sched::request(socket, &Request::Feeds, LOOK_TIMEOUT)
                {
                    // (A feed also given by socket is dropped by `distinct` below.)
                    feeds.extend(known.into_iter().map(|f| (f.name, f.socket)));
                }
            }
        }
        let feeds = distinct(feeds);
        // Every feed at once: a look takes one LOOK_TIMEOUT however many feeds do not
        // answer (a stopped producer's socket accepts and never answers), not one each.
        snapshot.feeds = std::thread::scope(|scope| {
            let asked: Vec<_> = feeds
                .into_iter()
                .map(|(name, socket)| {
                    let answer = scope.spawn(move || {
                        ladle_ring::protocol::feed_stats(&socket, LOOK_TIMEOUT)
                            .map_err(|e| format!("{}: {e}", socket.display()))
                    });
                    (name, answer)
                })
                .collect();
            asked
                .into_iter()
                .map(|(name, answer)| {
                    let stats = answer
                        .join()
                        .unwrap_or_else(|_| Err("the look at it panicked".to_owned()));
                    (name, stats)
                })
                .collect()
        });
        snapshot
    }
}

/// `feeds` with each socket once and each name once: a socket's second name is dropped, and
/// a name already taken by another socket becomes that socket's path. Rates, metrics'
/// label sets and a recording's rows are keyed by name; two feeds of one name would mix.
fn distinct(feeds: Vec<(String, PathBuf)>) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = Vec::with_capacity(feeds.len());
    for (name, socket) in feeds {
        if out.iter().any(|(_, s)| *s == socket) {
            continue;
        }
        let name = if out.iter().any(|(n, _)| *n == name) {
            socket.display().to_string()
        } else {
            name
        };
        out.push((name, socket));
    }
    out
}

/// Looks at a [`Source`] every `interval` on its own thread and hands the rows to sinks.
#[derive(Debug)]
pub struct Observer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Observer {
    /// Starts looking now, then every `interval`.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn start(
        mut source: impl Source + 'static,
        interval: Duration,
        mut sinks: Vec<Box<dyn Sink>>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("ladle-observer".into())
                .spawn(move || {
                    let mut rates = Rates::default();
                    let mut next = Instant::now();
                    loop {
                        let rows = rates.rows(&source.look());
                        for sink in &mut sinks {
                            sink.tick(&rows);
                        }
                        next += interval;
                        // Sleep in short steps so that stopping is prompt; checked after
                        // every look too, so that looks slower than the interval (a feed
                        // taking its LOOK_TIMEOUT to not answer) never keep it from stopping.
                        loop {
                            if stop.load(Ordering::SeqCst) {
                                for sink in &mut sinks {
                                    sink.finish();
                                }
                                return;
                            }
                            let left = next.saturating_duration_since(Instant::now());
                            if left.is_zero() {
                                break;
                            }
                            std::thread::sleep(left.min(Duration::from_millis(50)));
                        }
                        // A look that took longer than the interval does not make the next
                        // ones bunch up.
                        next = next.max(Instant::now());
                    }
                })?
        };
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops looking; the sinks are finished before this returns.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the observer thread panicked");
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.shut();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    #[test]
    fn feeds_are_watched_once_per_socket_under_distinct_names() {
        let feeds = distinct(vec![
            ("feed.sock".into(), "/a/feed.sock".into()),
            ("feed.sock".into(), "/b/feed.sock".into()),
            ("again".into(), "/a/feed.sock".into()),
            ("c".into(), "/c.sock".into()),
        ]);
        assert_eq!(
            feeds,
            [
                ("feed.sock".into(), "/a/feed.sock".into()),
                ("/b/feed.sock".into(), "/b/feed.sock".into()),
                ("c".into(), "/c.sock".into()),
            ]
        );
    }

    /// Stats as a producer would answer them.
    fn feed_stats() -> ladle_ring::protocol::FeedStats {
        ladle_ring::protocol::FeedStats {
            source: "d".into(),
            dataset_len: 100,
            capacity: 64,
            threads: 2,
            pid: 7,
            uptime_s: 1.0,
            cpu_s: 0.5,
            decode_cpu_s: 0.25,
            published: 10,
            bad: 0,
            occupancy: 0,
            joins: 0,
            leaves: 0,
            let_gos: 0,
            consumed: 0,
            skims: 0,
            holes: 0,
            consumers: Vec::new(),
            consumers_omitted: 0,
            cache: None,
        }
    }

    #[test]
    fn every_feed_is_asked_at_once_so_slow_ones_do_not_add_up() {
        // Feeds that answer only once every one of them has been asked: a look that asks
        // one after another times out on the first and never sees an answer.
        const FEEDS: usize = 4;
        let dir = tempfile::tempdir().unwrap();
        let asked = Arc::new(std::sync::Barrier::new(FEEDS));
        let mut sockets = Sockets::default();
        let mut producers = Vec::new();
        for k in 0..FEEDS {
            let path = dir.path().join(format!("f{k}.sock"));
            #[allow(clippy::disallowed_methods)] // a fake feed, in a fresh directory
            let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
            sockets.feeds.push((format!("f{k}"), path));
            let asked = asked.clone();
            producers.push(std::thread::spawn(move || {
                let (stream, _) = listener.accept().unwrap();
                // Read the request first, as a producer does: answering and closing before
                // the request is written would break the asker's pipe.
                let (request, _) =
                    ladle_ring::protocol::recv::<ladle_ring::protocol::ClientMessage>(&stream)
                        .unwrap();
                assert!(matches!(
                    request,
                    ladle_ring::protocol::ClientMessage::Stats
                ));
                asked.wait();
                let answer = ladle_ring::protocol::ServerMessage::Stats(feed_stats());
                ladle_ring::protocol::send(&stream, &answer, &[]).unwrap();
            }));
        }
        let snapshot = sockets.look();
        assert_eq!(snapshot.feeds.len(), FEEDS);
        for (name, stats) in &snapshot.feeds {
            assert!(stats.is_ok(), "{name}: {stats:?}");
        }
        for p in producers {
            p.join().unwrap();
        }
    }

    #[test]
    fn an_observer_whose_looks_take_longer_than_its_interval_still_stops() {
        let looks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let source = {
            let looks = looks.clone();
            move || {
                // A feed that takes its time to not answer.
                std::thread::sleep(Duration::from_millis(30));
                looks.fetch_add(1, Ordering::SeqCst);
                Snapshot::default()
            }
        };
        let observer = Observer::start(source, Duration::from_millis(1), Vec::new()).unwrap();
        while looks.load(Ordering::SeqCst) < 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (done, stopped) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            observer.stop();
            let _ = done.send(());
        });
        // A watchdog, not a speed limit: without the fix, stop() never returns.
        stopped
            .recv_timeout(Duration::from_secs(60))
            .expect("the observer did not stop");
    }
}
