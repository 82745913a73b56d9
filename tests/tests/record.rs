//! `--record DIR` and `ladle report DIR` end to end (issue 16): a recorded sweep leaves CSV
//! series that read back, and its report draws the four charts and a summary naming each run.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::time::Duration;

use ladle_tests::{Fixture, recorded_sim_sweep, wait_until};

const GUARD: Duration = Duration::from_secs(300);

/// A CSV file's header fields and its rows' fields (a plain split: ladle's names hold no
/// commas here).
fn table(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text
        .lines()
        .map(|l| l.split(',').map(str::to_owned).collect());
    let header: Vec<String> = lines.next().unwrap_or_default();
    (header, lines.collect())
}

fn column(header: &[String], name: &str) -> usize {
    header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
}

#[test]
fn a_recorded_sweep_writes_csv_series_that_ladle_report_plots() {
    let mut fx = Fixture::new();
    let data = fx.dataset(300, 80, 60);
    let out = fx.path().join("sweep");
    let rec = fx.path().join("rec");
    recorded_sim_sweep(&mut fx, &data, &out, &rec);

    for file in ["meta.json", "report.json"] {
        assert!(rec.join(file).exists(), "no {file}");
    }
    let (header, rows) = table(&rec.join("consumers.csv"));
    assert_eq!(header[0], "time");
    let name = column(&header, "name");
    for run in ["run-00", "run-01"] {
        assert!(
            rows.iter().filter(|r| r[name] == run).count() >= 2,
            "{run} is not in consumers.csv over two looks: {rows:?}"
        );
    }
    let (header, rows) = table(&rec.join("gpus.csv"));
    let gpu = column(&header, "gpu");
    for index in ["0", "1"] {
        assert!(
            rows.iter().any(|r| r[gpu] == index),
            "GPU {index}: {rows:?}"
        );
    }
    for file in ["feed.csv", "scheduler.csv", "jobs.csv", "gpus.csv"] {
        let (header, rows) = table(&rec.join(file));
        assert_eq!(header[0], "time", "{file}");
        assert!(rows.len() >= 2, "{file}: {rows:?}");
        let times: Vec<f64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]) && times[0] < times[times.len() - 1],
            "{file}: times do not increase: {times:?}"
        );
    }

    // A second recording into the same directory is refused, naming a file.
    let again = fx.run(
        &[
            "scheduler",
            "--dir",
            fx.path().join("sched").to_str().unwrap(),
            "--gpu",
            "sim",
            "--record",
            rec.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(!again.status.success());
    assert!(
        again.stderr.contains("already holds a recording"),
        "{}",
        again.stderr
    );

    let plots = fx.path().join("plots");
    let report = fx.run(
        &[
            "report",
            rec.to_str().unwrap(),
            "--out",
            plots.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(report.status.success(), "{}", report.stderr);
    for png in ["runs.png", "gpus.png", "feed.png", "cost.png"] {
        let bytes = std::fs::read(plots.join(png)).unwrap_or_else(|e| panic!("{png}: {e}"));
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{png} is no PNG");
        assert!(bytes.len() > 10_000, "{png} is {} bytes", bytes.len());
    }
    let summary = std::fs::read_to_string(plots.join("summary.md")).unwrap();
    for needle in [
        "run-00",
        "run-01",
        "samples decoded",
        "CPU-s saved",
        "sim-gpu-0",
    ] {
        assert!(summary.contains(needle), "{needle}: {summary}");
    }
    assert_eq!(report.stdout, summary, "prints what it writes");
}

#[test]
fn ladle_report_names_the_file_and_line_of_a_malformed_csv() {
    let mut fx = Fixture::new();
    let rec = fx.path().join("rec");
    std::fs::create_dir_all(&rec).unwrap();
    std::fs::write(
        rec.join("gpus.csv"),
        "time,gpu,name,memory_used_mib,memory_total_mib,utilization,sm_activity,\
         sm_activity_risk,jobs\n\
         1.0,0,sim,10,100,0.5,,0.1,1\n\
         2.0,0,sim,ten,100,0.5,,0.1,1\n",
    )
    .unwrap();
    let report = fx.run(&["report", rec.to_str().unwrap()], GUARD);
    assert!(!report.status.success());
    assert!(report.stderr.contains("gpus.csv:3"), "{}", report.stderr);
}

#[test]
fn a_serve_recording_has_the_feed_and_its_consumers_and_no_gpus() {
    let mut fx = Fixture::new();
    let data = fx.dataset(100, 80, 60);
    let rec = fx.path().join("rec");
    let serve = fx.serve(&data, &["--record", rec.to_str().unwrap()]);
    let consumer = fx.consume(16, 10, &["--step-ms", "30"]);
    let done = fx.wait(consumer, GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    // At least one look after the consumer joined.
    wait_until("a look recorded after the consumer joined", GUARD, || {
        let rows = table(&rec.join("feed.csv")).1.len();
        Ok::<_, String>((rows >= 2).then_some(()))
    });
    fx.signal(serve, 15);
    let stopped = fx.wait(serve, GUARD);
    assert!(stopped.status.success(), "{}", stopped.stderr);
    assert!(rec.join("consumers.csv").exists());
    assert!(!rec.join("gpus.csv").exists());
    let report = fx.run(&["report", rec.to_str().unwrap()], GUARD);
    assert!(report.status.success(), "{}", report.stderr);
    assert!(
        report.stderr.contains("skipped gpus.png"),
        "{}",
        report.stderr
    );
    assert!(
        report.stderr.contains("skipped cost.png"),
        "{}",
        report.stderr
    );
    assert!(rec.join("feed.png").exists() && rec.join("runs.png").exists());
}
