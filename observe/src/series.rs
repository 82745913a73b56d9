//! Snapshots in, rows out: the one place that turns what a feed and a scheduler report
//! (counters and positions) into the series people look at (rates, states), at one instant.
//!
//! [`Rates`] remembers the previous snapshot of each feed so that a decode rate or a
//! consumer's samples/s is the difference of two counters over the producer's own clock
//! (`uptime_s`), never an estimate. `ladle top`, `--metrics` and `--record` all read these
//! rows, so they always agree.

use std::collections::BTreeMap;

use ladle_ring::protocol::FeedStats;
use ladle_scheduler_protocol::job::JobState;
use ladle_scheduler_protocol::{GpuView, JobTotals, JobView};
use serde::{Deserialize, Serialize};

/// What one look at a feed and/or a scheduler saw.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Unix time of the look, seconds.
    pub time: f64,
    /// Each feed by name, with its stats, or why it could not be read.
    pub feeds: Vec<(String, Result<FeedStats, String>)>,
    /// The scheduler's queue, when one is watched: policy, jobs, GPUs; or why it could not
    /// be read.
    pub scheduler: Option<Result<SchedulerView, String>>,
}

/// The scheduler's answer to a `Queue` request.
#[derive(Debug, Clone, Default)]
pub struct SchedulerView {
    /// Admission policy.
    pub policy: String,
    /// Running and queued jobs and the latest finished ones, oldest first.
    pub jobs: Vec<JobView>,
    /// Every GPU.
    pub gpus: Vec<GpuView>,
    /// Every job the scheduler knows, counted by state (what the counters report).
    pub totals: JobTotals,
    /// Why the scheduler schedules these GPUs (`CUDA_VISIBLE_DEVICES=2,3`); `None`: every
    /// GPU of the machine.
    pub gpus_from: Option<String>,
}

/// One feed at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedRow {
    /// Unix time, seconds.
    pub time: f64,
    /// The feed's name (the scheduler's, or `serve`'s socket file name).
    pub feed: String,
    /// Samples published since the start, bad ones included.
    pub published: u64,
    /// Bad samples since the start.
    pub bad: u64,
    /// Samples published per second since the previous look (0 on the first).
    pub decode_rate: f64,
    /// Published samples the slowest attached consumer has not released.
    pub occupancy: u64,
    /// Ring slots.
    pub capacity: u64,
    /// Live consumers.
    pub consumers: u32,
    /// Consumers admitted, gone, let go since the start.
    pub joins: u64,
    /// See `joins`.
    pub leaves: u64,
    /// See `joins`.
    pub let_gos: u64,
    /// The producer process's CPU seconds since it started.
    pub cpu_s: f64,
    /// Its CPU use since the previous look, in cores (0 on the first).
    pub cpu_cores: f64,
    /// Samples per epoch.
    pub dataset_len: u64,
    /// Decode threads.
    pub threads: u32,
    /// Samples augmented from the decoded-sample cache since the start: decodes saved (0
    /// without a cache).
    #[serde(default)]
    pub cache_hits: u64,
    /// Samples that found no entry in the cache and were decoded.
    #[serde(default)]
    pub cache_misses: u64,
    /// Cache entries this feed filled.
    #[serde(default)]
    pub cache_fills: u64,
}

impl FeedRow {
    /// The cache's hit rate since the start, `None` without a cache (or before a lookup).
    pub fn cache_hit_rate(&self) -> Option<f64> {
        let lookups = self.cache_hits + self.cache_misses;
        (lookups > 0).then(|| self.cache_hits as f64 / lookups as f64)
    }
}

/// One consumer of one feed at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerRow {
    /// Unix time, seconds.
    pub time: f64,
    /// Its feed's name.
    pub feed: String,
    /// Its id in the producer's logs.
    pub id: u64,
    /// Its name without the log quoting (`run-00`).
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Its batch size.
    pub batch_size: u32,
    /// Samples it has released since it joined.
    pub released: u64,
    /// Epochs completed (`released / dataset_len`, fractional).
    pub epochs: f64,
    /// Samples per second since the previous look (0 on its first).
    pub samples_per_s: f64,
    /// Published samples it has not released.
    pub lag: u64,
    /// Whether its cursor gates the producer.
    pub attached: bool,
    /// Seconds it has held the feed back in all.
    pub held_back_s: f64,
    /// Seconds it has waited for data in all (its own count).
    #[serde(default)]
    pub waited_s: f64,
    /// Whether it holds the feed back right now.
    pub holding_back: bool,
    /// Times it was let go and rejoined.
    pub rejoins: u32,
    /// Whether it skims: it stopped gating the feed (it held the others back) and copies
    /// what its epoch still needs as the samples pass.
    #[serde(default)]
    pub skimming: bool,
}

/// The scheduler at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerRow {
    /// Unix time, seconds.
    pub time: f64,
    /// Admission policy.
    pub policy: String,
    /// Jobs waiting for admission.
    pub queued: u32,
    /// Jobs running.
    pub running: u32,
    /// Jobs that succeeded.
    pub succeeded: u32,
    /// Jobs that failed, were cancelled or interrupted.
    pub failed: u32,
    /// Attempts started since the scheduler started (each is one admission).
    pub admissions: u64,
    /// Out-of-memory retries since the scheduler started.
    pub oom_retries: u64,
}

/// One GPU at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRow {
    /// Unix time, seconds.
    pub time: f64,
    /// NVML index.
    pub gpu: u32,
    /// Product name.
    pub name: String,
    /// Device memory in use, MiB.
    pub memory_used_mib: u64,
    /// Device memory in all, MiB.
    pub memory_total_mib: u64,
    /// NVML utilisation, 0 – 1.
    pub utilization: f64,
    /// SM activity, 0 – 1; empty where the GPU does not expose it.
    pub sm_activity: Option<f64>,
    /// The scheduler's SM activity risk score (0 – 1).
    pub sm_activity_risk: f64,
    /// The scheduler's jobs on it.
    pub jobs: u32,
}

/// One job at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    /// Unix time, seconds.
    pub time: f64,
    /// Job id.
    pub id: u64,
    /// Its run name (`LADLE_RUN`, as a sweep names it), else its command's first word.
    pub name: String,
    /// `queued`, `running`, `succeeded`, `failed`, `cancelled` or `interrupted`.
    pub state: String,
    /// GPU indices it runs on, `+`-separated (`0+1`); empty unless running.
    pub gpus: String,
    /// Its feed, if it names one.
    pub feed: String,
    /// Memory estimate per GPU, MiB.
    pub estimate_mib: u64,
    /// Highest device memory observed per GPU, MiB.
    pub peak_mib: Option<u64>,
    /// Attempts started.
    pub attempts: u32,
    /// Out-of-memory retries.
    pub oom_retries: u32,
}

/// Everything one look produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    /// Unix time of the look, seconds.
    pub time: f64,
    /// One per feed that answered.
    pub feeds: Vec<FeedRow>,
    /// One per consumer of those feeds.
    pub consumers: Vec<ConsumerRow>,
    /// The scheduler, if watched and it answered.
    pub scheduler: Option<SchedulerRow>,
    /// One per GPU.
    pub gpus: Vec<GpuRow>,
    /// Why the scheduler schedules these GPUs ([`SchedulerView::gpus_from`]).
    pub gpus_from: Option<String>,
    /// One per job.
    pub jobs: Vec<JobRow>,
    /// What could not be read this time (a feed or the scheduler not answering), in words.
    pub errors: Vec<String>,
}

/// Turns snapshots into [`Rows`], remembering what the rates need.
#[derive(Debug, Default)]
pub struct Rates {
    /// Per feed: its last stats.
    last: BTreeMap<String, FeedStats>,
}

impl Rates {
    /// The rows for `snapshot`; rates against the previous snapshot of the same feed (and
    /// the same producer: a restarted one starts over).
    pub fn rows(&mut self, snapshot: &Snapshot) -> Rows {
        let time = snapshot.time;
        let mut rows = Rows {
            time,
            ..Rows::default()
        };
        for (feed, stats) in &snapshot.feeds {
            let stats = match stats {
                Ok(stats) => stats,
                Err(e) => {
                    rows.errors.push(format!("feed {feed:?}: {e}"));
                    continue;
                }
            };
            let prev = self
                .last
                .get(feed)
                .filter(|p| p.pid == stats.pid && p.uptime_s < stats.uptime_s);
            let seconds = prev.map_or(0.0, |p| stats.uptime_s - p.uptime_s);
            let per_second = |now: f64, before: f64| {
                if seconds > 0.0 {
                    ((now - before) / seconds).max(0.0)
                } else {
                    0.0
                }
            };
            rows.feeds.push(FeedRow {
                time,
                feed: feed.clone(),
                published: stats.published,
                bad: stats.bad,
                decode_rate: per_second(
                    stats.published as f64,
                    prev.map_or(0.0, |p| p.published as f64),
                ),
                occupancy: stats.occupancy,
                capacity: stats.capacity,
                consumers: u32::try_from(stats.consumers.len())
                    .unwrap_or(u32::MAX)
                    .saturating_add(stats.consumers_omitted),
                joins: stats.joins,
                leaves: stats.leaves,
                let_gos: stats.let_gos,
                cpu_s: stats.cpu_s,
                cpu_cores: per_second(stats.cpu_s, prev.map_or(0.0, |p| p.cpu_s)),
                dataset_len: stats.dataset_len,
                threads: stats.threads,
                cache_hits: stats.cache.map_or(0, |c| c.hits),
                cache_misses: stats.cache.map_or(0, |c| c.misses),
                cache_fills: stats.cache.map_or(0, |c| c.fills),
            });
            for c in &stats.consumers {
                let before = prev.and_then(|p| p.consumers.iter().find(|b| b.id == c.id));
                rows.consumers.push(ConsumerRow {
                    time,
                    feed: feed.clone(),
                    id: c.id,
                    name: unquote(&c.name),
                    pid: c.pid,
                    batch_size: c.batch_size,
                    released: c.released,
                    epochs: c.released as f64 / stats.dataset_len.max(1) as f64,
                    samples_per_s: before
                        .map_or(0.0, |b| per_second(c.released as f64, b.released as f64)),
                    lag: c.lag,
                    attached: c.attached,
                    held_back_s: c.held_back_s,
                    waited_s: c.waited_s,
                    holding_back: c.holding_back_s.is_some(),
                    rejoins: c.rejoins,
                    skimming: c.skimming,
                });
            }
            self.last.insert(feed.clone(), stats.clone());
        }
        match &snapshot.scheduler {
            None => {}
            Some(Err(e)) => rows.errors.push(format!("scheduler: {e}")),
            Some(Ok(view)) => scheduler_rows(time, view, &mut rows),
        }
        rows
    }
}

fn scheduler_rows(time: f64, view: &SchedulerView, rows: &mut Rows) {
    rows.gpus_from.clone_from(&view.gpus_from);
    // The counters are the scheduler's totals over every job; `jobs` lists only some.
    let t = &view.totals;
    let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let row = SchedulerRow {
        time,
        policy: view.policy.clone(),
        queued: count(t.queued),
        running: count(t.running),
        succeeded: count(t.succeeded),
        failed: count(t.failed + t.cancelled + t.interrupted),
        admissions: t.admissions,
        oom_retries: t.oom_retries,
    };
    for job in &view.jobs {
        rows.jobs.push(JobRow {
            time,
            id: job.id,
            name: job_name(job),
            state: state_name(&job.state).to_owned(),
            gpus: match &job.state {
                JobState::Running { gpus, .. } => gpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join("+"),
                _ => String::new(),
            },
            feed: job.spec.feed.clone().unwrap_or_default(),
            estimate_mib: job.estimate_mib,
            peak_mib: job.peak_mib,
            attempts: job.attempts,
            oom_retries: job.oom_retries,
        });
    }
    rows.scheduler = Some(row);
    for g in &view.gpus {
        rows.gpus.push(GpuRow {
            time,
            gpu: g.info.index,
            name: g.info.name.clone(),
            memory_used_mib: g.memory_used_mib,
            memory_total_mib: g.info.memory_total_mib,
            utilization: g.utilization,
            sm_activity: g.sm_activity,
            sm_activity_risk: g.sm_activity_risk,
            jobs: g.jobs,
        });
    }
}

/// A job's name for people: its `LADLE_RUN` (what a sweep calls it), else its command's
/// first word's file name.
pub fn job_name(job: &JobView) -> String {
    if let Some((_, run)) = job.spec.env.iter().find(|(k, _)| k == "LADLE_RUN") {
        return run.clone();
    }
    job.spec
        .command
        .first()
        .map(|c| {
            std::path::Path::new(c)
                .file_name()
                .map_or_else(|| c.clone(), |f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
}

/// A job state's one word.
pub fn state_name(state: &JobState) -> &'static str {
    match state {
        JobState::Queued => "queued",
        JobState::Running { .. } => "running",
        JobState::Succeeded => "succeeded",
        JobState::Failed { .. } => "failed",
        JobState::Cancelled => "cancelled",
        JobState::Interrupted { .. } => "interrupted",
        _ => "other",
    }
}

/// A consumer name as the producer logs it (`"run-00"`, quoted and escaped) back to the name;
/// a name that does not parse as a quoted string is kept as it is.
fn unquote(logged: &str) -> String {
    serde_json::from_str::<String>(logged).unwrap_or_else(|_| logged.to_owned())
}

/// Unix time now, seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ladle_ring::protocol::ConsumerInfo;

    fn stats(uptime_s: f64, published: u64, released: u64) -> FeedStats {
        FeedStats {
            source: "d".into(),
            dataset_len: 100,
            capacity: 64,
            threads: 2,
            pid: 7,
            uptime_s,
            cpu_s: uptime_s / 2.0,
            decode_cpu_s: uptime_s / 3.0,
            published,
            bad: 0,
            occupancy: 10,
            joins: 1,
            leaves: 0,
            let_gos: 0,
            consumed: 0,
            skims: 0,
            holes: 0,
            consumers: vec![ConsumerInfo {
                id: 3,
                name: "\"run-00\"".into(),
                pid: 9,
                batch_size: 8,
                connected_s: uptime_s,
                released,
                lag: 10,
                attached: true,
                holding_back_s: None,
                held_back_s: 0.5,
                waited_s: 0.25,
                rejoins: 0,
                skimming: false,
                skims: 0,
            }],
            consumers_omitted: 0,
            cache: Some(ladle_ring::protocol::CacheStats {
                hits: published / 2,
                misses: published - published / 2,
                fills: 3,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn rates_are_counter_differences_over_the_producers_own_clock() {
        let mut rates = Rates::default();
        let look = |s: FeedStats| Snapshot {
            time: 1.0,
            feeds: vec![("f".into(), Ok(s))],
            scheduler: None,
        };
        let first = rates.rows(&look(stats(10.0, 1000, 500)));
        assert_eq!(first.feeds[0].decode_rate, 0.0, "no rate from one look");
        assert_eq!(first.consumers[0].name, "run-00");
        assert_eq!(first.consumers[0].epochs, 5.0);
        let second = rates.rows(&look(stats(12.0, 1400, 700)));
        assert_eq!(second.feeds[0].decode_rate, 200.0);
        assert_eq!(second.feeds[0].cpu_cores, 0.5);
        assert_eq!(second.consumers[0].samples_per_s, 100.0);
        // A restarted producer (another pid, or its clock went back) starts over.
        let mut restarted = stats(1.0, 10, 5);
        restarted.pid = 8;
        let third = rates.rows(&look(restarted));
        assert_eq!(third.feeds[0].decode_rate, 0.0);
        assert_eq!(third.consumers[0].samples_per_s, 0.0);
    }

    #[test]
    fn counts_from_a_garbled_answer_saturate_rather_than_overflow() {
        let mut garbled = stats(1.0, 10, 5);
        garbled.consumers_omitted = u32::MAX;
        let rows = Rates::default().rows(&Snapshot {
            time: 1.0,
            feeds: vec![("f".into(), Ok(garbled))],
            scheduler: None,
        });
        assert_eq!(rows.feeds[0].consumers, u32::MAX);
    }

    #[test]
    fn a_feed_or_scheduler_that_does_not_answer_is_an_error_row_not_a_zero() {
        let mut rates = Rates::default();
        let rows = rates.rows(&Snapshot {
            time: 1.0,
            feeds: vec![("f".into(), Err("connection refused".into()))],
            scheduler: Some(Err("no socket".into())),
        });
        assert!(rows.feeds.is_empty() && rows.scheduler.is_none());
        assert_eq!(rows.errors.len(), 2, "{:?}", rows.errors);
        assert!(rows.errors[0].contains("connection refused"));
    }
}
