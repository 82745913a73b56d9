//! `ladle report`'s charts of a recording: runs, GPUs, feed, cost. Each returns `Ok(None)`
//! after drawing, or `Ok(Some(why))` when its data is not in the recording (nothing drawn).

use std::path::Path;

use ladle_observe::report::Recording;

use plotters::style::RGBColor;

use super::{Bar, Line, PRIVATE, SHARED, bars, canvas, colour, lines, present};

/// A limit drawn for every GPU at once.
const GREY: RGBColor = RGBColor(110, 110, 110);

/// Why a chart was not drawn.
pub(crate) type Skipped = Option<String>;

/// The time axis: seconds (or minutes, for a long recording) since the recording's start.
struct Clock {
    start: f64,
    scale: f64,
    desc: &'static str,
    end: f64,
}

impl Clock {
    fn of(recording: &Recording) -> Self {
        let start = recording.start_time();
        let span = (recording.end_time() - start).max(1.0);
        let (scale, desc) = if span > 600.0 {
            (60.0, "minutes since the start")
        } else {
            (1.0, "seconds since the start")
        };
        Self {
            start,
            scale,
            desc,
            end: span / scale,
        }
    }

    fn x(&self, time: f64) -> f64 {
        (time - self.start) / self.scale
    }

    fn axis(&self) -> (&'static str, std::ops::Range<f64>) {
        (self.desc, 0.0..self.end)
    }
}

fn missing(recording: &Recording, file: &str) -> Skipped {
    Some(format!("no {file} in {}", recording.dir.display()))
}

/// `runs.png`: each consumer's samples/s over time, one line per name, and its epochs.
pub(crate) fn runs(recording: &Recording, path: &Path) -> anyhow::Result<Skipped> {
    let by_name = recording.consumers_by_name();
    if by_name.is_empty() {
        return Ok(missing(recording, "consumer row (consumers.csv)"));
    }
    let clock = Clock::of(recording);
    let series: Vec<Line> = by_name
        .iter()
        .enumerate()
        .map(|(i, (name, rows))| Line {
            label: Some((*name).to_owned()),
            // A consumer's first look has no rate yet (0): leave it out rather than dip.
            points: rows
                .iter()
                .enumerate()
                .filter(|(k, r)| *k > 0 || r.samples_per_s > 0.0)
                .map(|(_, r)| (clock.x(r.time), r.samples_per_s))
                .collect(),
            colour: colour(i),
            dashed: false,
        })
        .collect();
    // Lines on top of each other (runs gated by the same feed) part in their progress.
    let progress: Vec<Line> = by_name
        .values()
        .enumerate()
        .map(|(i, rows)| Line {
            label: None,
            points: rows.iter().map(|r| (clock.x(r.time), r.epochs)).collect(),
            colour: colour(i),
            dashed: false,
        })
        .collect();
    let root = canvas(path, (1100, 800), "ladle: the runs")?;
    let (top, bottom) = root.split_vertically(400);
    lines(
        &top,
        "samples/s of each run",
        clock.axis(),
        "samples/s",
        1.0,
        &series,
    )?;
    lines(
        &bottom,
        "epochs done",
        clock.axis(),
        "epochs",
        1.0,
        &progress,
    )?;
    present(&root, path)?;
    Ok(None)
}

/// `gpus.png`: device memory in use per GPU (its total dashed), and SM activity (or
/// utilisation where the GPU does not expose SM activity).
pub(crate) fn gpus(recording: &Recording, path: &Path) -> anyhow::Result<Skipped> {
    let by_gpu = recording.gpus_by_index();
    if by_gpu.is_empty() {
        return Ok(missing(recording, "gpus.csv"));
    }
    let clock = Clock::of(recording);
    let gib = |mib: u64| mib as f64 / 1024.0;
    let mut memory = Vec::new();
    let mut activity = Vec::new();
    let mut sm = true;
    // One grey total when every GPU has the same (the usual case), else one per GPU.
    let totals: Vec<u64> = by_gpu
        .values()
        .flat_map(|rows| rows.iter().map(|r| r.memory_total_mib))
        .collect();
    let same_total = totals.windows(2).all(|w| w[0] == w[1]);
    if let (true, Some(rows)) = (same_total, by_gpu.values().next()) {
        memory.push(Line {
            label: Some(
                if by_gpu.len() > 1 {
                    "total (each)"
                } else {
                    "total"
                }
                .to_owned(),
            ),
            points: rows
                .iter()
                .map(|r| (clock.x(r.time), gib(r.memory_total_mib)))
                .collect(),
            colour: GREY,
            dashed: true,
        });
    }
    for (i, (gpu, rows)) in by_gpu.iter().enumerate() {
        let name = format!("GPU {gpu}");
        memory.push(Line {
            label: Some(format!("{name} used")),
            points: rows
                .iter()
                .map(|r| (clock.x(r.time), gib(r.memory_used_mib)))
                .collect(),
            colour: colour(i),
            dashed: false,
        });
        if !same_total {
            memory.push(Line {
                label: Some(format!("{name} total")),
                points: rows
                    .iter()
                    .map(|r| (clock.x(r.time), gib(r.memory_total_mib)))
                    .collect(),
                colour: colour(i),
                dashed: true,
            });
        }
        sm &= rows.iter().any(|r| r.sm_activity.is_some());
        activity.push((name, i, rows));
    }
    let (what, caption) = if sm {
        ("SM activity, %", "SM activity")
    } else {
        (
            "utilisation, %",
            "utilisation (no SM activity from these GPUs)",
        )
    };
    let activity: Vec<Line> = activity
        .into_iter()
        .map(|(name, i, rows)| Line {
            label: Some(name),
            points: rows
                .iter()
                .map(|r| {
                    let v = if sm {
                        r.sm_activity.unwrap_or(0.0)
                    } else {
                        r.utilization
                    };
                    (clock.x(r.time), v * 100.0)
                })
                .collect(),
            colour: colour(i),
            dashed: false,
        })
        .collect();
    let root = canvas(path, (1100, 800), "ladle: GPUs")?;
    let (top, bottom) = root.split_vertically(400);
    lines(&top, "device memory", clock.axis(), "GiB", 0.5, &memory)?;
    lines(&bottom, caption, clock.axis(), what, 100.0, &activity)?;
    present(&root, path)?;
    Ok(None)
}

/// `feed.png`: each feed's decode rate, and its ring occupancy (capacity dashed).
pub(crate) fn feed(recording: &Recording, path: &Path) -> anyhow::Result<Skipped> {
    let rows = match &recording.feed {
        Some(rows) if !rows.is_empty() => rows,
        _ => return Ok(missing(recording, "feed.csv")),
    };
    let clock = Clock::of(recording);
    let mut names: Vec<&str> = rows.iter().map(|r| r.feed.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let labelled = names.len() > 1;
    // With one feed, its name on every legend entry is noise.
    let prefix = |name: &str, what: &str| {
        if labelled {
            format!("{name}: {what}")
        } else {
            what.to_owned()
        }
    };
    let mut rate = Vec::new();
    let mut occupancy = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let of: Vec<_> = rows.iter().filter(|r| r.feed == *name).collect();
        rate.push(Line {
            label: labelled.then(|| (*name).to_owned()),
            points: of
                .iter()
                .enumerate()
                .filter(|(k, r)| *k > 0 || r.decode_rate > 0.0)
                .map(|(_, r)| (clock.x(r.time), r.decode_rate))
                .collect(),
            colour: colour(i),
            dashed: false,
        });
        occupancy.push(Line {
            label: Some(prefix(name, "occupied slots")),
            points: of
                .iter()
                .map(|r| (clock.x(r.time), r.occupancy as f64))
                .collect(),
            colour: colour(i),
            dashed: false,
        });
        occupancy.push(Line {
            label: Some(prefix(name, "capacity")),
            points: of
                .iter()
                .map(|r| (clock.x(r.time), r.capacity as f64))
                .collect(),
            colour: GREY,
            dashed: true,
        });
    }
    let root = canvas(path, (1100, 800), "ladle: the feed")?;
    let (top, bottom) = root.split_vertically(400);
    lines(&top, "decode rate", clock.axis(), "samples/s", 1.0, &rate)?;
    lines(
        &bottom,
        "ring occupancy (published, not yet released by the slowest consumer)",
        clock.axis(),
        "slots",
        1.0,
        &occupancy,
    )?;
    present(&root, path)?;
    Ok(None)
}

/// `cost.png`: the sweep's CPU-seconds against the private-pipelines estimate, and dollars
/// when priced.
pub(crate) fn cost(recording: &Recording, path: &Path) -> anyhow::Result<Skipped> {
    let Some(report) = &recording.report else {
        return Ok(missing(
            recording,
            "report.json (only `ladle sweep --record` writes one)",
        ));
    };
    let c = &report.cost;
    let pair = |sweep: f64, private: f64| {
        [
            Bar {
                label: "this sweep (shared feed)".to_owned(),
                value: sweep,
                colour: SHARED,
            },
            Bar {
                label: "private pipelines (estimate)".to_owned(),
                value: private,
                colour: PRIVATE,
            },
        ]
    };
    let title = format!(
        "ladle: cost of {} runs in {:.0} s",
        report.runs.len(),
        report.wall_seconds
    );
    let priced = c.dollars.zip(c.private_pipelines_dollars);
    let root = canvas(
        path,
        (if priced.is_some() { 1100 } else { 650 }, 450),
        &title,
    )?;
    let cpu = pair(c.cpu_seconds, c.private_pipelines_cpu_seconds);
    if let Some((sweep, private)) = priced {
        let (left, right) = root.split_horizontally(550);
        bars(&left, "CPU core-seconds", &cpu, |v| format!("{v:.1}"))?;
        bars(&right, "dollars", &pair(sweep, private), |v| {
            format!("${v:.4}")
        })?;
    } else {
        bars(&root, "CPU core-seconds", &cpu, |v| format!("{v:.1}"))?;
    }
    present(&root, path)?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use ladle_observe::series::{ConsumerRow, FeedRow, GpuRow};

    use super::*;

    fn feed_row(time: f64, value: f64) -> FeedRow {
        FeedRow {
            time,
            feed: "f".into(),
            published: 0,
            bad: 0,
            decode_rate: value,
            occupancy: 0,
            capacity: 0,
            consumers: 0,
            joins: 0,
            leaves: 0,
            let_gos: 0,
            cpu_s: value,
            cpu_cores: value,
            dataset_len: 0,
            threads: 0,
            cache_hits: 0,
            cache_misses: 0,
            cache_fills: 0,
        }
    }

    fn consumer(time: f64, value: f64) -> ConsumerRow {
        ConsumerRow {
            time,
            feed: "f".into(),
            id: 1,
            name: "run".into(),
            pid: 1,
            batch_size: 1,
            released: 0,
            epochs: value,
            samples_per_s: value,
            lag: 0,
            attached: true,
            held_back_s: value,
            waited_s: value,
            holding_back: false,
            rejoins: 0,
            skimming: false,
        }
    }

    fn gpu(time: f64, value: f64) -> GpuRow {
        GpuRow {
            time,
            gpu: 0,
            name: "sim".into(),
            memory_used_mib: 0,
            memory_total_mib: 0,
            utilization: value,
            sm_activity: Some(value),
            sm_activity_risk: value,
            jobs: 0,
        }
    }

    #[test]
    fn degenerate_recordings_draw_or_skip_without_panicking() {
        let out = tempfile::tempdir().unwrap();
        let mut cases = vec![Recording::default()];
        for times in [vec![], vec![5.0], vec![5.0, 5.0], vec![5.0, 6.0]] {
            for value in [0.0, f64::NAN, f64::INFINITY, -1.0, 1e300, f64::MAX] {
                cases.push(Recording {
                    feed: Some(times.iter().map(|&t| feed_row(t, value)).collect()),
                    consumers: Some(times.iter().map(|&t| consumer(t, value)).collect()),
                    gpus: Some(times.iter().map(|&t| gpu(t, value)).collect()),
                    ..Recording::default()
                });
            }
        }
        // Rows from a clock that jumped: times not a number, infinite, before the start.
        for time in [f64::NAN, f64::INFINITY, -1e12] {
            cases.push(Recording {
                feed: Some(vec![feed_row(1.0, 1.0), feed_row(time, 1.0)]),
                consumers: Some(vec![consumer(1.0, 1.0), consumer(time, 1.0)]),
                gpus: Some(vec![gpu(1.0, 0.5), gpu(time, 0.5)]),
                ..Recording::default()
            });
        }
        for (k, recording) in cases.iter().enumerate() {
            for (name, chart) in [
                (
                    "runs",
                    runs as fn(&Recording, &Path) -> anyhow::Result<Skipped>,
                ),
                ("gpus", gpus),
                ("feed", feed),
            ] {
                let path = out.path().join(format!("{k}-{name}.png"));
                // Drawn, skipped, or an error: never a panic or a hang.
                let _ = chart(recording, &path);
            }
        }
    }
}
