//! [`Rows`] as Prometheus metrics, in the OpenMetrics text format (what `--metrics` serves),
//! written by the Prometheus org's own Rust client, `prometheus-client`.
//!
//! Each scrape renders the latest rows afresh: the values are the feed's and the scheduler's
//! own counters, never counted twice, and a consumer or job that is gone is gone from the
//! next scrape. Counters end in `_total`, sizes in `_bytes`, times in `_seconds`, ratios are
//! 0 – 1 (`_ratio`). Labels: `feed`, `consumer` (its name), `consumer_id` (its id in the
//! producer's logs; names may repeat), `gpu` (NVML index), `job_id` (the scheduler's job id; not
//! `job`, which Prometheus sets to the scrape job's name and would rename ours to
//! `exported_job`), `run` (the job's run name), `state`.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `ladle_feed_published_total` | feed | samples decoded and published since the producer started, bad ones included |
//! | `ladle_feed_bad_total` | feed | of them, bad samples (delivered marked, never silently) |
//! | `ladle_feed_decode_samples_per_second` | feed | samples published per second over the last look |
//! | `ladle_feed_ring_occupancy_samples` | feed | published samples the slowest attached consumer has not released |
//! | `ladle_feed_ring_capacity_samples` | feed | ring slots |
//! | `ladle_feed_ring_occupancy_ratio` | feed | occupancy / capacity |
//! | `ladle_feed_consumers` | feed | live consumers |
//! | `ladle_feed_joins_total` | feed | consumers admitted |
//! | `ladle_feed_leaves_total` | feed | consumers gone (left, died, detached) |
//! | `ladle_feed_let_gos_total` | feed | consumers let go for holding the feed back past the stall timeout |
//! | `ladle_feed_producer_cpu_seconds_total` | feed | CPU seconds of the producer process, all threads |
//! | `ladle_feed_dataset_samples` | feed | samples per epoch |
//! | `ladle_feed_decode_threads` | feed | decode threads |
//! | `ladle_feed_cache_hits_total` | feed | samples augmented from the decoded-sample cache (decodes saved); only for a feed with a cache |
//! | `ladle_feed_cache_misses_total` | feed | samples that found no cache entry and were decoded |
//! | `ladle_feed_cache_fills_total` | feed | cache entries this feed filled |
//! | `ladle_consumer_lag_samples` | feed, consumer, consumer_id | published samples it has not released |
//! | `ladle_consumer_samples_per_second` | feed, consumer, consumer_id | samples it released per second over the last look |
//! | `ladle_consumer_released_total` | feed, consumer, consumer_id | samples it released since it joined |
//! | `ladle_consumer_epochs` | feed, consumer, consumer_id | epochs completed (fractional) |
//! | `ladle_consumer_batch_size` | feed, consumer, consumer_id | its batch size |
//! | `ladle_consumer_held_back_seconds_total` | feed, consumer, consumer_id | time the producer waited on it alone |
//! | `ladle_consumer_waited_seconds_total` | feed, consumer, consumer_id | time it waited for data (its own count) |
//! | `ladle_consumer_holding_back` | feed, consumer, consumer_id | 1 while it holds the feed back |
//! | `ladle_consumer_attached` | feed, consumer, consumer_id | 1 while its cursor gates the producer (0 while let go) |
//! | `ladle_consumer_rejoins_total` | feed, consumer, consumer_id | times it was let go and rejoined |
//! | `ladle_consumer_skimming` | feed, consumer, consumer_id | 1 while it skims: it held the others back, gates the feed no more and copies what its epoch needs as the samples pass |
//! | `ladle_scheduler_info` | policy | 1; the admission policy |
//! | `ladle_scheduler_jobs` | state | jobs by state: `queued` (the queue's length), `running`, `succeeded`, `failed` (failed, cancelled or interrupted) |
//! | `ladle_scheduler_admissions_total` | | attempts started (each one an admission) |
//! | `ladle_scheduler_oom_retries_total` | | out-of-memory retries |
//! | `ladle_scheduler_gpu_info` | gpu, name | 1; the GPU's product name |
//! | `ladle_scheduler_gpu_memory_used_bytes` | gpu | device memory in use (everyone's) |
//! | `ladle_scheduler_gpu_memory_total_bytes` | gpu | device memory in all |
//! | `ladle_scheduler_gpu_utilization_ratio` | gpu | NVML utilisation |
//! | `ladle_scheduler_gpu_sm_activity_ratio` | gpu | SM activity; absent where the GPU does not expose it |
//! | `ladle_scheduler_gpu_sm_activity_risk` | gpu | the scheduler's SM activity risk score, 0 – 1 |
//! | `ladle_scheduler_gpu_jobs` | gpu | the scheduler's jobs on it |
//! | `ladle_scheduler_job_state` | job_id, run, state | 1 for the job's current state, 0 for the others (a state set) |
//! | `ladle_scheduler_job_memory_estimate_bytes` | job_id, run | memory estimate per GPU |
//! | `ladle_scheduler_job_memory_peak_bytes` | job_id, run | highest device memory observed per GPU; absent until observed |
//! | `ladle_scheduler_job_attempts_total` | job_id, run | attempts started |
//! | `ladle_scheduler_job_oom_retries_total` | job_id, run | out-of-memory retries |
//! | `ladle_observer_errors` | | feeds or scheduler that did not answer at the last look (their series are absent) |
//! | `ladle_observer_look_timestamp_seconds` | | Unix time of the last look |
//!
//! ```
//! use ladle_observe::Rows;
//! use ladle_observe::prometheus::render;
//!
//! let text = render(Some(&Rows::default())).unwrap();
//! assert!(text.contains("ladle_observer_errors 0.0"));
//! assert!(text.ends_with("# EOF\n"));
//! ```

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::Rows;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bytes in a MiB (the rows count memory in MiB; Prometheus wants bytes).
const MIB: f64 = 1024.0 * 1024.0;

/// Every state a job can be in, as [`crate::series::state_name`] words them.
const JOB_STATES: [&str; 6] = [
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "interrupted",
];

/// A series' labels, in order.
type Labels = Vec<(&'static str, String)>;
type GaugeF = Family<Labels, Gauge<f64, AtomicU64>>;
type CounterF = Family<Labels, Counter<f64, AtomicU64>>;

/// A registry under `ladle_` that hands out families to fill.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>) -> GaugeF {
        let family = GaugeF::default();
        match unit {
            Some(unit) => self
                .registry
                .register_with_unit(name, help, unit, family.clone()),
            None => self.registry.register(name, help, family.clone()),
        }
        family
    }

    /// A counter; its name gets `_total` (after the unit's suffix).
    fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>) -> CounterF {
        let family = CounterF::default();
        match unit {
            Some(unit) => self
                .registry
                .register_with_unit(name, help, unit, family.clone()),
            None => self.registry.register(name, help, family.clone()),
        }
        family
    }
}

/// A series without labels.
fn single(registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>, value: f64) {
    let gauge = Gauge::<f64, AtomicU64>::default();
    gauge.set(value);
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, gauge),
        None => registry.register(name, help, gauge),
    }
}

/// A counter without labels.
fn single_count(registry: &mut Registry, name: &str, help: &str, value: f64) {
    let counter = Counter::<f64, AtomicU64>::default();
    counter.inc_by(value);
    registry.register(name, help, counter);
}

fn set(family: &GaugeF, labels: &Labels, value: f64) {
    family.get_or_create(labels).set(value);
}

fn count(family: &CounterF, labels: &Labels, value: f64) {
    // A fresh registry per render: the counter starts at 0, so this sets it.
    family.get_or_create(labels).inc_by(value);
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

fn ratio() -> Option<Unit> {
    Some(Unit::Other("ratio".into()))
}

/// The OpenMetrics text of `rows` (`None`: no look yet, only the observer's own series).
///
/// # Errors
/// Only if writing into a `String` fails, which it does not.
pub fn render(rows: Option<&Rows>) -> Result<String, std::fmt::Error> {
    let mut b = Builder {
        registry: Registry::with_prefix("ladle"),
    };
    let empty = Rows::default();
    let rows = rows.unwrap_or(&empty);

    single(
        &mut b.registry,
        "observer_errors",
        "Feeds or scheduler that did not answer at the last look (their series are absent)",
        None,
        rows.errors.len() as f64,
    );
    if rows.time > 0.0 {
        single(
            &mut b.registry,
            "observer_look_timestamp",
            "Unix time of the last look",
            Some(Unit::Seconds),
            rows.time,
        );
    }

    feeds(&mut b, rows);
    consumers(&mut b, rows);
    scheduler(&mut b, rows);

    let mut text = String::new();
    encode(&mut text, &b.registry)?;
    Ok(text)
}

fn feeds(b: &mut Builder, rows: &Rows) {
    if rows.feeds.is_empty() {
        return;
    }
    let published = b.counter(
        "feed_published",
        "Samples decoded and published since the producer started, bad ones included",
        None,
    );
    let bad = b.counter("feed_bad", "Bad samples published (marked)", None);
    let rate = b.gauge(
        "feed_decode_samples_per_second",
        "Samples published per second over the last look",
        None,
    );
    let occupancy = b.gauge(
        "feed_ring_occupancy",
        "Published samples the slowest attached consumer has not released",
        Some(Unit::Other("samples".into())),
    );
    let capacity = b.gauge(
        "feed_ring_capacity",
        "Ring slots",
        Some(Unit::Other("samples".into())),
    );
    let occupancy_ratio = b.gauge("feed_ring_occupancy", "Occupancy / capacity", ratio());
    let consumers = b.gauge("feed_consumers", "Live consumers", None);
    let joins = b.counter("feed_joins", "Consumers admitted", None);
    let leaves = b.counter(
        "feed_leaves",
        "Consumers gone (left, died or detached)",
        None,
    );
    let let_gos = b.counter(
        "feed_let_gos",
        "Consumers let go for holding the feed back past the stall timeout",
        None,
    );
    let cpu = b.counter(
        "feed_producer_cpu",
        "CPU seconds of the producer process, all threads",
        Some(Unit::Seconds),
    );
    let dataset = b.gauge(
        "feed_dataset",
        "Samples per epoch",
        Some(Unit::Other("samples".into())),
    );
    let threads = b.gauge("feed_decode_threads", "Decode threads", None);
    let cache_hits = b.counter(
        "feed_cache_hits",
        "Samples augmented from the decoded-sample cache: decodes saved",
        None,
    );
    let cache_misses = b.counter(
        "feed_cache_misses",
        "Samples that found no entry in the decoded-sample cache and were decoded",
        None,
    );
    let cache_fills = b.counter("feed_cache_fills", "Cache entries this feed filled", None);
    for f in &rows.feeds {
        let l: Labels = vec![("feed", f.feed.clone())];
        count(&published, &l, f.published as f64);
        count(&bad, &l, f.bad as f64);
        set(&rate, &l, f.decode_rate);
        set(&occupancy, &l, f.occupancy as f64);
        set(&capacity, &l, f.capacity as f64);
        if f.capacity > 0 {
            set(&occupancy_ratio, &l, f.occupancy as f64 / f.capacity as f64);
        }
        set(&consumers, &l, f64::from(f.consumers));
        count(&joins, &l, f.joins as f64);
        count(&leaves, &l, f.leaves as f64);
        count(&let_gos, &l, f.let_gos as f64);
        count(&cpu, &l, f.cpu_s);
        set(&dataset, &l, f.dataset_len as f64);
        set(&threads, &l, f64::from(f.threads));
        if f.cache_hits + f.cache_misses > 0 {
            count(&cache_hits, &l, f.cache_hits as f64);
            count(&cache_misses, &l, f.cache_misses as f64);
            count(&cache_fills, &l, f.cache_fills as f64);
        }
    }
}

fn consumers(b: &mut Builder, rows: &Rows) {
    if rows.consumers.is_empty() {
        return;
    }
    let lag = b.gauge(
        "consumer_lag",
        "Published samples the consumer has not released",
        Some(Unit::Other("samples".into())),
    );
    let speed = b.gauge(
        "consumer_samples_per_second",
        "Samples the consumer released per second over the last look",
        None,
    );
    let released = b.counter(
        "consumer_released",
        "Samples the consumer released since it joined",
        None,
    );
    let epochs = b.gauge(
        "consumer_epochs",
        "Epochs the consumer completed (fractional)",
        None,
    );
    let batch = b.gauge("consumer_batch_size", "The consumer's batch size", None);
    let held = b.counter(
        "consumer_held_back",
        "Time the producer waited on this consumer alone",
        Some(Unit::Seconds),
    );
    let waited = b.counter(
        "consumer_waited",
        "Time this consumer waited for data (its own count)",
        Some(Unit::Seconds),
    );
    let holding = b.gauge(
        "consumer_holding_back",
        "1 while the consumer holds the feed back",
        None,
    );
    let attached = b.gauge(
        "consumer_attached",
        "1 while the consumer's cursor gates the producer (0 while let go)",
        None,
    );
    let rejoins = b.counter(
        "consumer_rejoins",
        "Times the consumer was let go and rejoined",
        None,
    );
    let skimming = b.gauge(
        "consumer_skimming",
        "1 while the consumer skims: it held the others back, gates the feed no more and copies what its epoch needs as the samples pass",
        None,
    );
    for c in &rows.consumers {
        let l: Labels = vec![
            ("feed", c.feed.clone()),
            ("consumer", c.name.clone()),
            ("consumer_id", c.id.to_string()),
        ];
        set(&lag, &l, c.lag as f64);
        set(&speed, &l, c.samples_per_s);
        count(&released, &l, c.released as f64);
        set(&epochs, &l, c.epochs);
        set(&batch, &l, f64::from(c.batch_size));
        count(&held, &l, c.held_back_s);
        count(&waited, &l, c.waited_s);
        set(&holding, &l, flag(c.holding_back));
        set(&attached, &l, flag(c.attached));
        count(&rejoins, &l, f64::from(c.rejoins));
        set(&skimming, &l, flag(c.skimming));
    }
}

fn scheduler(b: &mut Builder, rows: &Rows) {
    let Some(s) = &rows.scheduler else {
        return;
    };
    let info = b.gauge("scheduler_info", "1; the admission policy", None);
    set(&info, &vec![("policy", s.policy.clone())], 1.0);
    let jobs = b.gauge(
        "scheduler_jobs",
        "Jobs by state: queued (the queue's length), running, succeeded, failed (failed, cancelled or interrupted)",
        None,
    );
    for (state, n) in [
        ("queued", s.queued),
        ("running", s.running),
        ("succeeded", s.succeeded),
        ("failed", s.failed),
    ] {
        set(&jobs, &vec![("state", state.to_owned())], f64::from(n));
    }
    single_count(
        &mut b.registry,
        "scheduler_admissions",
        "Attempts started (each one an admission)",
        s.admissions as f64,
    );
    single_count(
        &mut b.registry,
        "scheduler_oom_retries",
        "Out-of-memory retries",
        s.oom_retries as f64,
    );
    gpus(b, rows);
    job_rows(b, rows);
}

fn gpus(b: &mut Builder, rows: &Rows) {
    if rows.gpus.is_empty() {
        return;
    }
    let info = b.gauge("scheduler_gpu_info", "1; the GPU's product name", None);
    let used = b.gauge(
        "scheduler_gpu_memory_used",
        "Device memory in use (everyone's)",
        Some(Unit::Bytes),
    );
    let total = b.gauge(
        "scheduler_gpu_memory_total",
        "Device memory in all",
        Some(Unit::Bytes),
    );
    let utilization = b.gauge("scheduler_gpu_utilization", "NVML utilisation", ratio());
    let mut sm_activity = None;
    let risk = b.gauge(
        "scheduler_gpu_sm_activity_risk",
        "The scheduler's SM activity risk score, 0 to 1",
        None,
    );
    let jobs = b.gauge(
        "scheduler_gpu_jobs",
        "The scheduler's jobs on the GPU",
        None,
    );
    for g in &rows.gpus {
        let l: Labels = vec![("gpu", g.gpu.to_string())];
        set(
            &info,
            &vec![("gpu", g.gpu.to_string()), ("name", g.name.clone())],
            1.0,
        );
        set(&used, &l, g.memory_used_mib as f64 * MIB);
        set(&total, &l, g.memory_total_mib as f64 * MIB);
        set(&utilization, &l, g.utilization);
        if let Some(activity) = g.sm_activity {
            let family = sm_activity.get_or_insert_with(|| {
                b.gauge(
                    "scheduler_gpu_sm_activity",
                    "SM activity; absent where the GPU does not expose it",
                    ratio(),
                )
            });
            set(family, &l, activity);
        }
        set(&risk, &l, g.sm_activity_risk);
        set(&jobs, &l, f64::from(g.jobs));
    }
}

fn job_rows(b: &mut Builder, rows: &Rows) {
    if rows.jobs.is_empty() {
        return;
    }
    let state = b.gauge(
        "scheduler_job_state",
        "1 for the job's current state, 0 for the others",
        None,
    );
    let estimate = b.gauge(
        "scheduler_job_memory_estimate",
        "Memory estimate per GPU",
        Some(Unit::Bytes),
    );
    let mut peak = None;
    let attempts = b.counter("scheduler_job_attempts", "Attempts started", None);
    let ooms = b.counter("scheduler_job_oom_retries", "Out-of-memory retries", None);
    for j in &rows.jobs {
        let l: Labels = vec![("job_id", j.id.to_string()), ("run", j.name.clone())];
        let known = JOB_STATES.contains(&j.state.as_str());
        let states = JOB_STATES
            .iter()
            .copied()
            .chain((!known).then_some(j.state.as_str()));
        for s in states {
            let mut with_state = l.clone();
            with_state.push(("state", s.to_owned()));
            set(&state, &with_state, flag(s == j.state));
        }
        set(&estimate, &l, j.estimate_mib as f64 * MIB);
        if let Some(p) = j.peak_mib {
            let family = peak.get_or_insert_with(|| {
                b.gauge(
                    "scheduler_job_memory_peak",
                    "Highest device memory observed per GPU; absent until observed",
                    Some(Unit::Bytes),
                )
            });
            set(family, &l, p as f64 * MIB);
        }
        count(&attempts, &l, f64::from(j.attempts));
        count(&ooms, &l, f64::from(j.oom_retries));
    }
}

#[cfg(test)]
mod tests;
