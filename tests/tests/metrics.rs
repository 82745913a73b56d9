//! `--metrics` end to end (issue 16): a real Prometheus server scrapes `ladle serve` (with a
//! consumer reading) and `ladle scheduler --gpu sim` (with a job running), and its HTTP API
//! gives the values back.
//!
//! Prometheus is Debian's `prometheus` package; `scripts/check` installs it when absent. Where
//! it is not installed the scrape test says "skipped: ..." and passes.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::net::TcpListener;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ladle_tests::{Fixture, wait_for_listener, wait_until};
use serde_json::Value;

/// Deadlock guard for anything we wait on; never a speed assertion.
const GUARD: Duration = Duration::from_secs(120);

/// A port nobody listens on right now (the OS's pick, released for the child to bind).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `prometheus` binary, from PATH or Debian's place.
fn prometheus_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("prometheus"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let debian = Path::new("/usr/bin/prometheus");
        debian.is_file().then(|| debian.to_owned())
    })
}

/// GET `url` with `query`; the JSON answer, or `None` while Prometheus is not up yet.
fn api(url: &str, query: &[(&str, &str)]) -> Option<Value> {
    let mut request = ureq::get(url);
    for (k, v) in query {
        request = request.query(*k, *v);
    }
    let mut response = request.call().ok()?;
    let body = response.body_mut().read_to_string().ok()?;
    serde_json::from_str(&body).ok()
}

/// The first value of the instant query `promql`, if it has one.
fn instant(api_base: &str, promql: &str) -> Option<f64> {
    let answer = api(&format!("{api_base}/api/v1/query"), &[("query", promql)])?;
    answer["data"]["result"].as_array()?.first()?["value"][1]
        .as_str()?
        .parse()
        .ok()
}

// Long on purpose: one scripted scenario (a feed, a scheduler, a job, a real Prometheus
// scraping both) whose steps depend on each other.
#[test]
fn a_real_prometheus_scrapes_the_feed_and_the_scheduler_and_reads_their_metrics_back() {
    let Some(prometheus) = prometheus_binary() else {
        eprintln!(
            "skipped: no `prometheus` binary in PATH or /usr/bin (scripts/check installs \
             Debian's `prometheus` package; `apt-get install -y prometheus` does it by hand)"
        );
        return;
    };
    let mut fx = Fixture::new();
    let (serve_port, scheduler_port, web_port) = (free_port(), free_port(), free_port());
    let serve_metrics = format!("127.0.0.1:{serve_port}");
    let scheduler_metrics = format!("127.0.0.1:{scheduler_port}");

    // A feed with a consumer reading from it.
    let data = fx.dataset(300, 32, 32);
    let serve = fx.serve(
        &data,
        &[
            "--image-size",
            "32",
            "--ring-mib",
            "2",
            "--threads",
            "2",
            "--metrics",
            &serve_metrics,
        ],
    );
    let consumer = fx.consume(16, 100_000, &["--step-ms", "5"]);

    // A scheduler on a simulated GPU, with a job running (a bounded sleep: jobs outlive the
    // scheduler, and a failed test does not leave it behind for long).
    let dir = fx.path().join("sched");
    let dir_s = dir.to_str().unwrap().to_owned();
    let scheduler = fx.spawn(&[
        "scheduler",
        "--dir",
        &dir_s,
        "--gpu",
        "sim",
        "--sim-gpus",
        "1",
        "--sim-gpu-mem",
        "40GiB",
        "--settle-s",
        "0",
        "--metrics",
        &scheduler_metrics,
    ]);
    let socket = dir.join("scheduler.sock");
    wait_for_listener(&socket, GUARD, "ladle scheduler coming up");
    let submitted = fx.run(
        &[
            "submit",
            "--dir",
            &dir_s,
            "--json",
            "--gpu-mem",
            "2GiB",
            "--",
            "sleep",
            "600",
        ],
        GUARD,
    );
    assert!(submitted.status.success(), "{}", submitted.stderr);
    let job: Value = serde_json::from_str(submitted.stdout.trim()).unwrap();
    let job = job["id"].as_u64().unwrap().to_string();

    // Our own Prometheus: own port, own storage, scraping both every second.
    let config = fx.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             \x20 - job_name: ladle-serve\n    static_configs:\n      - targets: ['{serve_metrics}']\n\
             \x20 - job_name: ladle-scheduler\n    static_configs:\n      - targets: ['{scheduler_metrics}']\n"
        ),
    )
    .unwrap();
    let tsdb = fx.path().join("tsdb");
    let web = format!("127.0.0.1:{web_port}");
    let prom = fx.spawn_program(&[
        prometheus.to_str().unwrap(),
        &format!("--config.file={}", config.display()),
        &format!("--storage.tsdb.path={}", tsdb.display()),
        &format!("--web.listen-address={web}"),
    ]);
    let base = format!("http://{web}");

    // Both targets up, then each metric back through the query API.
    let wanted = [
        ("ladle_feed_published_total".to_owned(), "a feed counter"),
        (
            "ladle_consumer_released_total".to_owned(),
            "a consumer counter",
        ),
        (
            "ladle_scheduler_gpu_memory_total_bytes{gpu=\"0\"}".to_owned(),
            "a GPU gauge",
        ),
        (
            format!("ladle_scheduler_job_state{{job_id=\"{job}\",state=\"running\"}}"),
            "the job's state",
        ),
        (
            "ladle_scheduler_admissions_total".to_owned(),
            "a scheduler counter",
        ),
    ];
    let seen = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut targets = Value::Null;
        wait_until("both targets up and every metric back", GUARD, || {
            if let Some(answer) = api(&format!("{base}/api/v1/targets"), &[]) {
                targets = answer;
            }
            let up = targets["data"]["activeTargets"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter(|t| t["health"] == "up")
                        .filter_map(|t| t["labels"]["job"].as_str())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            let all_up = up.contains(&"ladle-serve") && up.contains(&"ladle-scheduler");
            let missing: Vec<_> = wanted
                .iter()
                .filter(|(q, _)| !instant(&base, q).is_some_and(|v| v > 0.0))
                .collect();
            if all_up && missing.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!(
                    "not up or not back from Prometheus: {missing:?}; targets {targets}"
                ))
            }
        });
    }));
    if let Err(hang) = seen {
        // The job outlives the scheduler's process group: stop it first.
        let _ = fx.run(&["cancel", "--dir", &dir_s, &job], GUARD);
        fx.kill_all();
        panic!(
            "{}\nprometheus: {}\nserve: {}\nscheduler: {}",
            hang.downcast_ref::<String>().map_or("", String::as_str),
            fx.wait(prom, GUARD).stderr,
            fx.wait(serve, GUARD).stderr,
            fx.wait(scheduler, GUARD).stderr,
        );
    }
    // The labels came through too.
    let answer = api(
        &format!("{base}/api/v1/query"),
        &[("query", "ladle_consumer_lag_samples")],
    )
    .unwrap();
    let series = &answer["data"]["result"][0]["metric"];
    assert!(series["feed"].is_string(), "{answer}");
    assert!(series["consumer_id"].is_string(), "{answer}");

    // Clean up: the job, the consumer; serve says where its metrics were.
    let cancelled = fx.run(&["cancel", "--dir", &dir_s, &job], GUARD);
    assert!(cancelled.status.success(), "{}", cancelled.stderr);
    fx.signal(consumer, 9);
    fx.signal(serve, 15);
    let served = fx.wait(serve, GUARD);
    assert!(
        served
            .stderr
            .contains(&format!("metrics on http://{serve_metrics}/metrics")),
        "{}",
        served.stderr
    );
}

#[test]
fn metrics_on_a_public_address_are_refused_and_say_why() {
    let mut fx = Fixture::new();
    let dir = fx.path().join("sched");
    let done = fx.run(
        &[
            "scheduler",
            "--dir",
            dir.to_str().unwrap(),
            "--gpu",
            "sim",
            "--metrics",
            "0.0.0.0:0",
        ],
        GUARD,
    );
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("not a loopback address") && done.stderr.contains("authentication"),
        "{}",
        done.stderr
    );
}
