//! `ladle cost REC --instances SHAPES.csv` on a real recorded sweep (issue 30): every shape
//! priced with ladle and with private pipelines, the cheapest named, bad shapes refused
//! naming the line.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use ladle_tests::{Fixture, recorded_sim_sweep};

const GUARD: Duration = Duration::from_secs(300);

#[test]
fn a_recorded_sweep_is_priced_on_every_shape_and_bad_shapes_name_their_line() {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 40, 30);
    let out = fx.path().join("sweep");
    let rec = fx.path().join("rec");
    recorded_sim_sweep(&mut fx, &data, &out, &rec);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rec.join("report.json")).unwrap()).unwrap();
    // The feed's CPU is its decode threads' (less than the sweep process's, which also ran
    // the scheduler and the recorder), and private pipelines never finish sooner.
    let feed_cpu = report["feed"]["cpu_seconds"].as_f64().unwrap();
    assert!(
        feed_cpu > 0.0 && feed_cpu < report["cpu_seconds"].as_f64().unwrap(),
        "{report}"
    );
    let wall = report["wall_seconds"].as_f64().unwrap();
    let private_wall = report["cost"]["private_pipelines_wall_seconds"]
        .as_f64()
        .unwrap();
    assert!(private_wall >= wall, "{report}");
    // Each run's own CPU, as the scheduler measured it, is in the report and the workload.
    for run in report["runs"].as_array().unwrap() {
        assert!(run["cpu_seconds"].as_f64().unwrap() > 0.0, "{run}");
    }
    let shapes = fx.path().join("shapes.csv");
    std::fs::write(
        &shapes,
        "# example prices\nname,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour\n\
         one,4,1,L4,24,1.0\ntwo,8,2,L4,24,1.5\ntiny,4,1,T,1,0.1\n",
    )
    .unwrap();
    let rec_arg = rec.to_str().unwrap();
    let shapes_arg = shapes.to_str().unwrap();
    let priced = fx.run(
        &["cost", rec_arg, "--instances", shapes_arg, "--json"],
        GUARD,
    );
    assert!(priced.status.success(), "{}", priced.stderr);
    let v: serde_json::Value = serde_json::from_str(priced.stdout.trim()).unwrap();
    assert_eq!(v["workload"]["runs"].as_array().unwrap().len(), 2, "{v}");
    assert!(
        v["workload"]["run_cpu_per_sample"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    let listed = v["shapes"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "tiny cannot hold a 2 GiB run: {v}");
    assert!(v["skipped"][0].as_str().unwrap().contains("tiny"), "{v}");
    for shape in listed {
        for way in ["ladle", "private"] {
            let plan = &shape[way];
            for key in ["samples_per_s", "wall_seconds", "usd", "usd_per_run"] {
                assert!(plan[key].as_f64().unwrap() > 0.0, "{way} {key}: {shape}");
            }
            assert!(plan["min_vcpus_per_gpu"].as_u64().unwrap() >= 1, "{shape}");
        }
        // Private pipelines cost at least the feed's decode per sample: never less. Where
        // both are GPU-bound they are equal, to the bit: the fluid model gives a run its share
        // feeds its exact GPU-bound rate however it is fed (observe's unit test
        // `a_gpu_bound_sweep_takes_the_same_time_to_the_bit_shared_or_private`; a rate
        // computed as `rate * cpu / cpu` once made private pipelines 4e-19 USD cheaper).
        assert!(
            shape["ladle"]["usd"].as_f64().unwrap() <= shape["private"]["usd"].as_f64().unwrap(),
            "{shape}"
        );
    }
    assert!(listed.iter().any(|s| s["name"] == v["cheapest"]), "{v}");
    // The table names the cheapest; a given private cost is stated as given.
    let table = fx.run(
        &[
            "cost",
            rec_arg,
            "--instances",
            shapes_arg,
            "--private-cpu-ms",
            "5",
        ],
        GUARD,
    );
    assert!(table.status.success(), "{}", table.stderr);
    assert!(table.stdout.contains("(cheapest)"), "{}", table.stdout);
    assert!(table.stdout.contains("(given)"), "{}", table.stdout);
    // The plot: a PNG file.
    let png = fx.path().join("cost.png");
    let plotted = fx.run(
        &[
            "cost",
            rec_arg,
            "--instances",
            shapes_arg,
            "--plot",
            png.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(plotted.status.success(), "{}", plotted.stderr);
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG"),
        "not a PNG: {} bytes",
        bytes.len()
    );

    // Not a sweep's recording: said so, naming the directory.
    let empty = fx.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let refused = fx.run(
        &["cost", empty.to_str().unwrap(), "--instances", shapes_arg],
        GUARD,
    );
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("empty"), "{}", refused.stderr);
    std::fs::write(
        &shapes,
        "name,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour\nok,4,1,L4,24,1\nbad,four,1,L4,24,1\n",
    )
    .unwrap();
    let refused = fx.run(&["cost", rec_arg, "--instances", shapes_arg], GUARD);
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("shapes.csv")
            && refused.stderr.contains("line 3")
            && refused.stderr.contains("vcpus"),
        "{}",
        refused.stderr
    );
}

/// The Python that `ladle bench baseline` is measured with here: `LADLE_TEST_PYTHON`, else
/// `python3`, when it imports torch and torchvision (optional, as the torch tests are).
fn torch_python() -> Option<String> {
    let python = std::env::var("LADLE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import torch, torchvision"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

#[test]
fn a_baseline_measured_into_a_recording_prices_private_pipelines_as_measured() {
    let mut fx = Fixture::new();
    let data = fx.dataset(200, 96, 72);
    let rec = fx.path().join("rec");
    let data_arg = data.to_str().unwrap();
    // Into a directory that holds no sweep's report: refused before measuring.
    std::fs::create_dir_all(&rec).unwrap();
    let refused = fx.run(
        &[
            "bench",
            "baseline",
            "--dataset",
            data_arg,
            "--record",
            rec.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("report.json"), "{}", refused.stderr);
    // A Python without torch (no site-packages): a clear error naming it and the ways out.
    let bare = fx.path().join("bare-python");
    std::fs::write(&bare, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
    std::fs::set_permissions(&bare, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bare_arg = bare.to_str().unwrap();
    let refused = fx.run(
        &[
            "bench",
            "baseline",
            "--dataset",
            data_arg,
            "--python",
            bare_arg,
            "--seconds",
            "1",
        ],
        GUARD,
    );
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains(bare_arg)
            && refused.stderr.contains("torch")
            && refused.stderr.contains("--private-cpu-ms"),
        "{}",
        refused.stderr
    );
    // Not an ImageFolder: said so, naming the format.
    let cifar = fx.path().join("cifar");
    let generated = fx.run(
        &[
            "dataset",
            "generate",
            "--format",
            "cifar10",
            "--count",
            "20",
            "--out",
            cifar.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(generated.status.success(), "{}", generated.stderr);
    let refused = fx.run(
        &["bench", "baseline", "--dataset", cifar.to_str().unwrap()],
        GUARD,
    );
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("cifar10"), "{}", refused.stderr);

    let Some(python) = torch_python() else {
        eprintln!(
            "skipping the measurement itself: no Python with torch and torchvision \
             (set LADLE_TEST_PYTHON)"
        );
        return;
    };
    let out = fx.path().join("sweep");
    std::fs::remove_dir_all(&rec).unwrap();
    recorded_sim_sweep(&mut fx, &data, &out, &rec);
    let measured = fx.run(
        &[
            "bench",
            "baseline",
            "--dataset",
            data_arg,
            "--python",
            &python,
            "--seconds",
            "2",
            "--workers",
            "1",
            "--record",
            rec.to_str().unwrap(),
            "--json",
        ],
        GUARD,
    );
    assert!(measured.status.success(), "{}", measured.stderr);
    let line: serde_json::Value = serde_json::from_str(measured.stdout.trim()).unwrap();
    let ms = line["cpu_ms_per_sample"].as_f64().unwrap();
    assert!(ms > 0.0 && line["samples"].as_u64().unwrap() > 0, "{line}");
    let shapes = fx.path().join("shapes.csv");
    std::fs::write(
        &shapes,
        "name,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour\none,4,1,L4,24,1.0\n",
    )
    .unwrap();
    let priced = fx.run(
        &[
            "cost",
            rec.to_str().unwrap(),
            "--instances",
            shapes.to_str().unwrap(),
            "--json",
        ],
        GUARD,
    );
    assert!(priced.status.success(), "{}", priced.stderr);
    let v: serde_json::Value = serde_json::from_str(priced.stdout.trim()).unwrap();
    assert_eq!(v["workload"]["private_basis"], "measured", "{v}");
    let per_sample = v["workload"]["private_cpu_per_sample"].as_f64().unwrap();
    assert!(
        (per_sample * 1e3 - ms).abs() < 1e-6 * ms.max(1.0),
        "{v} against {line}"
    );
}
