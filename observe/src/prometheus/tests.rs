#![allow(clippy::unwrap_used)] // tests fail loudly by design

use super::*;
use crate::series::{ConsumerRow, FeedRow, GpuRow, JobRow, SchedulerRow};

fn rows() -> Rows {
    Rows {
        gpus_from: None,
        time: 1_700_000_000.5,
        feeds: vec![FeedRow {
            time: 1.0,
            feed: "cifar".into(),
            published: 1234,
            bad: 2,
            decode_rate: 512.5,
            occupancy: 128,
            capacity: 512,
            consumers: 1,
            joins: 3,
            leaves: 2,
            let_gos: 1,
            cpu_s: 4.25,
            cpu_cores: 1.5,
            dataset_len: 1000,
            threads: 4,
            cache_hits: 900,
            cache_misses: 100,
            cache_fills: 100,
        }],
        consumers: vec![ConsumerRow {
            time: 1.0,
            feed: "cifar".into(),
            id: 7,
            name: "run \"a\"\nb\\c".into(),
            pid: 99,
            batch_size: 32,
            released: 1100,
            epochs: 1.1,
            samples_per_s: 480.0,
            lag: 134,
            attached: true,
            held_back_s: 0.75,
            waited_s: 2.5,
            holding_back: false,
            rejoins: 1,
            skimming: true,
        }],
        scheduler: Some(SchedulerRow {
            time: 1.0,
            policy: "most-free-memory".into(),
            queued: 1,
            running: 1,
            succeeded: 0,
            failed: 0,
            admissions: 2,
            oom_retries: 1,
        }),
        gpus: vec![
            GpuRow {
                time: 1.0,
                gpu: 0,
                name: "Sim GPU".into(),
                memory_used_mib: 2048,
                memory_total_mib: 40960,
                utilization: 0.5,
                sm_activity: Some(0.25),
                sm_activity_risk: 0.3,
                jobs: 1,
            },
            GpuRow {
                time: 1.0,
                gpu: 1,
                name: "Sim GPU".into(),
                memory_used_mib: 0,
                memory_total_mib: 40960,
                utilization: 0.0,
                sm_activity: None,
                sm_activity_risk: 0.0,
                jobs: 0,
            },
        ],
        jobs: vec![JobRow {
            time: 1.0,
            id: 5,
            name: "run-00".into(),
            state: "running".into(),
            gpus: "0".into(),
            feed: "cifar".into(),
            estimate_mib: 6144,
            peak_mib: Some(5000),
            attempts: 2,
            oom_retries: 1,
        }],
        errors: vec!["feed \"other\": connection refused".into()],
    }
}

/// One parsed sample line: name, labels in order, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses the sample lines of the text (a small OpenMetrics reader for the tests: label
/// values unescaped).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, rest) = match line.find('{') {
            Some(i) => (&line[..i], &line[i..]),
            None => line.split_at(line.find(' ').unwrap()),
        };
        let mut labels = Vec::new();
        let mut rest = rest;
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices();
            let mut key = String::new();
            loop {
                let (i, ch) = chars.next().unwrap();
                match ch {
                    '}' => {
                        rest = &body[i + 1..];
                        break;
                    }
                    ',' => {}
                    '=' => {
                        assert_eq!(chars.next().unwrap().1, '"', "{line}");
                        let mut value = String::new();
                        loop {
                            match chars.next().unwrap().1 {
                                '"' => break,
                                '\\' => match chars.next().unwrap().1 {
                                    'n' => value.push('\n'),
                                    other => value.push(other),
                                },
                                other => value.push(other),
                            }
                        }
                        labels.push((std::mem::take(&mut key), value));
                    }
                    other => key.push(other),
                }
            }
        }
        let value: f64 = rest
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        out.push((name.to_owned(), labels, value));
    }
    out
}

fn value(all: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    all.iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| s.2)
}

#[test]
fn every_row_becomes_named_labelled_series_with_units_in_their_names() {
    let text = render(Some(&rows())).unwrap();
    let all = samples(&text);
    let feed = [("feed", "cifar")];
    for (name, labels, expected) in [
        ("ladle_feed_published_total", &feed[..], 1234.0),
        ("ladle_feed_bad_total", &feed, 2.0),
        ("ladle_feed_decode_samples_per_second", &feed, 512.5),
        ("ladle_feed_ring_occupancy_samples", &feed, 128.0),
        ("ladle_feed_ring_capacity_samples", &feed, 512.0),
        ("ladle_feed_ring_occupancy_ratio", &feed, 0.25),
        ("ladle_feed_consumers", &feed, 1.0),
        ("ladle_feed_joins_total", &feed, 3.0),
        ("ladle_feed_leaves_total", &feed, 2.0),
        ("ladle_feed_let_gos_total", &feed, 1.0),
        ("ladle_feed_producer_cpu_seconds_total", &feed, 4.25),
        ("ladle_feed_dataset_samples", &feed, 1000.0),
        ("ladle_feed_decode_threads", &feed, 4.0),
        ("ladle_feed_cache_hits_total", &feed, 900.0),
        ("ladle_feed_cache_misses_total", &feed, 100.0),
        ("ladle_feed_cache_fills_total", &feed, 100.0),
        (
            "ladle_consumer_lag_samples",
            &[("feed", "cifar"), ("consumer_id", "7")],
            134.0,
        ),
        (
            "ladle_consumer_samples_per_second",
            &[("consumer_id", "7")],
            480.0,
        ),
        (
            "ladle_consumer_released_total",
            &[("consumer_id", "7")],
            1100.0,
        ),
        (
            "ladle_consumer_held_back_seconds_total",
            &[("consumer_id", "7")],
            0.75,
        ),
        (
            "ladle_consumer_waited_seconds_total",
            &[("consumer_id", "7")],
            2.5,
        ),
        ("ladle_consumer_holding_back", &[("consumer_id", "7")], 0.0),
        ("ladle_consumer_attached", &[("consumer_id", "7")], 1.0),
        ("ladle_consumer_skimming", &[("consumer_id", "7")], 1.0),
        ("ladle_consumer_rejoins_total", &[("consumer_id", "7")], 1.0),
        (
            "ladle_scheduler_info",
            &[("policy", "most-free-memory")],
            1.0,
        ),
        ("ladle_scheduler_jobs", &[("state", "queued")], 1.0),
        ("ladle_scheduler_jobs", &[("state", "running")], 1.0),
        ("ladle_scheduler_admissions_total", &[], 2.0),
        ("ladle_scheduler_oom_retries_total", &[], 1.0),
        (
            "ladle_scheduler_gpu_info",
            &[("gpu", "1"), ("name", "Sim GPU")],
            1.0,
        ),
        (
            "ladle_scheduler_gpu_memory_used_bytes",
            &[("gpu", "0")],
            2048.0 * MIB,
        ),
        (
            "ladle_scheduler_gpu_memory_total_bytes",
            &[("gpu", "1")],
            40960.0 * MIB,
        ),
        (
            "ladle_scheduler_gpu_utilization_ratio",
            &[("gpu", "0")],
            0.5,
        ),
        (
            "ladle_scheduler_gpu_sm_activity_ratio",
            &[("gpu", "0")],
            0.25,
        ),
        ("ladle_scheduler_gpu_sm_activity_risk", &[("gpu", "0")], 0.3),
        ("ladle_scheduler_gpu_jobs", &[("gpu", "0")], 1.0),
        (
            "ladle_scheduler_job_state",
            &[("job_id", "5"), ("run", "run-00"), ("state", "running")],
            1.0,
        ),
        (
            "ladle_scheduler_job_state",
            &[("job_id", "5"), ("state", "queued")],
            0.0,
        ),
        (
            "ladle_scheduler_job_memory_estimate_bytes",
            &[("job_id", "5")],
            6144.0 * MIB,
        ),
        (
            "ladle_scheduler_job_memory_peak_bytes",
            &[("job_id", "5")],
            5000.0 * MIB,
        ),
        (
            "ladle_scheduler_job_attempts_total",
            &[("job_id", "5")],
            2.0,
        ),
        (
            "ladle_scheduler_job_oom_retries_total",
            &[("job_id", "5")],
            1.0,
        ),
        ("ladle_observer_errors", &[], 1.0),
        (
            "ladle_observer_look_timestamp_seconds",
            &[],
            1_700_000_000.5,
        ),
    ] {
        assert_eq!(
            value(&all, name, labels),
            Some(expected),
            "{name} {labels:?} in\n{text}"
        );
    }
    assert!(
        text.contains("# TYPE ladle_feed_published counter"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn a_job_is_one_in_its_own_state_and_zero_in_every_other() {
    let all = samples(&render(Some(&rows())).unwrap());
    let states: Vec<_> = all
        .iter()
        .filter(|(n, _, _)| n == "ladle_scheduler_job_state")
        .collect();
    assert_eq!(states.len(), JOB_STATES.len());
    assert_eq!(states.iter().map(|s| s.2).sum::<f64>(), 1.0);
}

#[test]
fn sm_activity_and_a_peak_not_yet_seen_are_absent_not_zero() {
    let all = samples(&render(Some(&rows())).unwrap());
    assert_eq!(
        value(
            &all,
            "ladle_scheduler_gpu_sm_activity_ratio",
            &[("gpu", "1")]
        ),
        None
    );
    let mut unseen = rows();
    unseen.jobs[0].peak_mib = None;
    unseen.gpus[0].sm_activity = None;
    let text = render(Some(&unseen)).unwrap();
    assert!(!text.contains("ladle_scheduler_job_memory_peak"), "{text}");
    assert!(
        !text.contains("ladle_scheduler_gpu_sm_activity_ratio"),
        "{text}"
    );
}

#[test]
fn a_consumer_name_with_quotes_newlines_and_backslashes_is_escaped_and_reads_back() {
    let text = render(Some(&rows())).unwrap();
    assert!(
        text.contains(r#"consumer="run \"a\"\nb\\c""#),
        "not escaped:\n{text}"
    );
    // Every sample is still one line, and the name reads back as it was.
    let all = samples(&text);
    let lag = all
        .iter()
        .find(|(n, _, _)| n == "ladle_consumer_lag_samples")
        .unwrap();
    assert!(
        lag.1
            .contains(&("consumer".into(), "run \"a\"\nb\\c".into()))
    );
}

#[test]
fn before_the_first_look_only_the_observers_own_series_are_there() {
    let text = render(None).unwrap();
    let all = samples(&text);
    assert_eq!(all.len(), 1, "{text}");
    assert_eq!(value(&all, "ladle_observer_errors", &[]), Some(0.0));
}
