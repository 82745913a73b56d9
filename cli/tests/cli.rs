//! The `ladle` binary end to end: real processes on real files.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::{Command, Output};

fn ladle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ladle"))
        .args(args)
        .output()
        .expect("run ladle")
}

fn ok_json(args: &[&str]) -> serde_json::Value {
    let out = ladle(args);
    assert!(
        out.status.success(),
        "ladle {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// Runs ladle, asserts that it failed with nothing on stdout, and returns its stderr.
fn failing(args: &[&str]) -> String {
    let out = ladle(args);
    assert!(!out.status.success(), "ladle {args:?} succeeded");
    assert!(out.stdout.is_empty(), "ladle {args:?} printed to stdout");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn generate(format: &str, count: u32, out: &Path) {
    let out = out.to_str().unwrap();
    let c = count.to_string();
    let args = [
        "dataset", "generate", "--format", format, "--count", &c, "--out", out, "--width", "80",
    ];
    let status = ladle(&[&args[..], &["--height", "60", "--json"]].concat());
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

#[test]
fn generate_then_inspect_works_for_all_three_formats() {
    for format in ["imagefolder", "cifar10", "wds"] {
        let dir = tempfile::tempdir().unwrap();
        generate(format, 30, dir.path());
        let report = ok_json(&["dataset", "inspect", dir.path().to_str().unwrap(), "--json"]);
        assert_eq!(report["format"], format);
        assert_eq!(report["samples"], 30);
        assert_eq!(report["classes"], 10);
        assert_eq!(report["bad_files"], serde_json::json!([]));
    }
}

#[test]
fn inspect_lists_planted_bad_files_by_path_and_still_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    generate("imagefolder", 20, dir.path());
    let bad_jpg = dir.path().join("amber/broken.jpg");
    std::fs::write(&bad_jpg, b"\xff\xd8\xff\xe0 not really a jpeg").unwrap();
    let bad_png = dir.path().join("gold/empty.png");
    std::fs::write(&bad_png, b"").unwrap();
    let report = ok_json(&["dataset", "inspect", dir.path().to_str().unwrap(), "--json"]);
    assert_eq!(report["samples"], 22);
    let bad: Vec<&str> = report["bad_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(bad, [bad_jpg.to_str().unwrap(), bad_png.to_str().unwrap()]);

    // The human-readable report names them too.
    let out = ladle(&["dataset", "inspect", dir.path().to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("broken.jpg") && text.contains("empty.png"),
        "{text}"
    );
}

#[test]
fn inspect_says_how_many_files_it_left_out_by_extension_and_warns_about_hidden_classes() {
    let dir = tempfile::tempdir().unwrap();
    generate("imagefolder", 20, dir.path());
    let root = dir.path();
    std::fs::write(root.join("amber/notes.txt"), b"not an image").unwrap();
    std::fs::write(root.join("gold/README.TXT"), b"not an image").unwrap();
    std::fs::write(root.join("gold/Makefile"), b"all:").unwrap();
    std::fs::create_dir(root.join(".ipynb_checkpoints")).unwrap();
    let some_jpg = std::fs::read_dir(root.join("amber"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jpg"))
        .unwrap();
    std::fs::copy(&some_jpg, root.join(".ipynb_checkpoints/copy.JPG")).unwrap();

    let report = ok_json(&["dataset", "inspect", root.to_str().unwrap(), "--json"]);
    // The hidden folder is a class, as torchvision takes it, and its image is a sample.
    assert_eq!(report["samples"], 21);
    assert_eq!(report["classes"], 11);
    assert_eq!(
        report["left_out"],
        serde_json::json!([{"extension": "", "files": 1}, {"extension": ".txt", "files": 2}])
    );
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].as_str().unwrap().contains(".ipynb_checkpoints"),
        "{warnings:?}"
    );

    let out = ladle(&["dataset", "inspect", root.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l == "left out  3 files not read as images (1 (no extension), 2 .txt)"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("warning   hidden folder \".ipynb_checkpoints\"")),
        "{text}"
    );
}

#[test]
fn inspect_of_an_unreadable_dataset_fails_with_a_message_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dataset");
    let err = failing(&["dataset", "inspect", missing.to_str().unwrap(), "--json"]);
    assert!(err.contains("no-such-dataset"), "{err}");

    let batch = dir.path().join("data_batch_1.bin");
    std::fs::write(&batch, vec![0u8; 3073 + 5]).unwrap();
    let err = failing(&["dataset", "inspect", dir.path().to_str().unwrap()]);
    assert!(
        err.contains("data_batch_1.bin") && err.contains("3073"),
        "{err}"
    );
}

#[test]
fn generate_refuses_a_non_empty_directory_without_force() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep.txt"), "mine").unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let args = [
        "dataset", "generate", "--format", "cifar10", "--count", "5", "--out", out_dir,
    ];
    assert!(failing(&args).contains("--force"));
    let keep = std::fs::read_to_string(dir.path().join("keep.txt")).unwrap();
    assert_eq!(keep, "mine");
    assert!(ladle(&[&args[..], &["--force"]].concat()).status.success());
    assert!(dir.path().join("data_batch_1.bin").is_file());
}

#[test]
fn help_teaches_the_formats_and_options() {
    let out = ladle(&["dataset", "generate", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for word in ["imagefolder", "cifar10", "wds", "--count", "--seed"] {
        assert!(text.contains(word), "generate --help lacks {word}: {text}");
    }
    let out = ladle(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("dataset") && text.contains("demo"), "{text}");
}

#[test]
fn demo_runs_on_a_small_cached_dataset() {
    let cache = tempfile::tempdir().unwrap();
    let args = [
        "demo",
        "--seconds",
        "0.5",
        "--samples",
        "20",
        "--image-size",
        "64",
    ];
    let dir = cache.path().to_str().unwrap();
    let out = ladle(&[&args[..], &["--cache-dir", dir]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("samples/s"), "{text}");
    // Second run reuses the cache: it does not announce generation again.
    let out = ladle(&[&args[..], &["--cache-dir", dir]].concat());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("generating"));
}

#[test]
fn bench_fanout_json_reports_both_modes_with_cpu_time_from_the_os() {
    let dir = tempfile::tempdir().unwrap();
    generate("imagefolder", 40, dir.path());
    let data = dir.path().to_str().unwrap();
    let report = ok_json(&[
        "bench",
        "fanout",
        "--dataset",
        data,
        "--consumers",
        "8,16",
        "--seconds",
        "1.5",
        "--image-size",
        "32",
        "--json",
    ]);
    for mode in ["shared", "independent"] {
        let m = &report["modes"][mode];
        assert!(
            m["aggregate_samples_per_s"].as_f64().unwrap() > 0.0,
            "{mode}: {m}"
        );
        assert!(m["cpu_seconds"].as_f64().unwrap() > 0.0, "{mode}: {m}");
        assert!(
            m["samples_per_cpu_second"].as_f64().unwrap() > 0.0,
            "{mode}: {m}"
        );
        let consumers = m["consumers"].as_array().unwrap();
        let sizes: Vec<u64> = consumers
            .iter()
            .map(|c| c["batch_size"].as_u64().unwrap())
            .collect();
        assert_eq!(sizes, [8, 16]);
        assert!(
            consumers
                .iter()
                .all(|c| c["samples_per_s"].as_f64().unwrap() > 0.0)
        );
    }
    for c in report["modes"]["shared"]["consumers"].as_array().unwrap() {
        assert_ne!(c["exact_coverage"], false, "{c}");
    }
    let shared = report["modes"]["shared"]["aggregate_samples_per_s"]
        .as_f64()
        .unwrap();
    let independent = report["modes"]["independent"]["aggregate_samples_per_s"]
        .as_f64()
        .unwrap();
    let speedup = report["speedup"].as_f64().unwrap();
    assert!((speedup - shared / independent).abs() < 1e-6 * speedup);
    assert!(report["cpu_efficiency_gain"].as_f64().unwrap() > 0.0);
}

#[test]
fn version_names_the_commit_and_features_it_was_built_from() {
    let out = ladle(&["--version"]);
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // Built from this checkout: the commit git names (or `unknown` outside git).
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".to_owned(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        );
    assert_eq!(
        line,
        format!(
            "ladle {} (commit {head}, features: none)",
            env!("CARGO_PKG_VERSION")
        )
    );
    // Every subcommand says the same.
    let sub = ladle(&["sweep", "--version"]);
    assert!(String::from_utf8_lossy(&sub.stdout).contains(&format!("(commit {head}, ")));
}

#[test]
fn serve_of_a_python_dataset_names_what_is_missing_and_the_options_it_does_not_take() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("feed.sock");
    let socket = socket.to_str().unwrap();
    let serve = |python: &str, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ladle"))
            .args([&["serve", "mydata:make", "--socket", socket], extra].concat())
            .env("LADLE_PYTHON", python)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // An option of the image pipeline: refused by name, before any Python runs.
    let err = serve("/nonexistent/python", &["--transform", "CenterCrop(8)"]);
    assert!(
        err.contains("--transform applies to image datasets (--dataset)"),
        "{err}"
    );
    // An option the Python producer does not have: refused by name, saying what it takes.
    let err = serve("/nonexistent/python", &["--pacing", "lockstep"]);
    assert!(
        err.contains("--pacing is not supported with a Python dataset")
            && err.contains("--stall-timeout"),
        "{err}"
    );
    // No such Python.
    let err = serve("/nonexistent/python", &[]);
    assert!(err.contains("cannot run /nonexistent/python"), "{err}");
    assert!(err.contains("$LADLE_PYTHON"), "{err}");
    // A program that runs but cannot import ladle (here: one that always fails).
    let err = serve("false", &[]);
    assert!(
        err.contains("false cannot import the ladle package") && err.contains("pip install"),
        "{err}"
    );
    // Both kinds of dataset at once, or neither.
    assert!(
        failing(&["serve", "m:f", "--dataset", "/d", "--socket", socket])
            .contains("cannot be used with")
    );
    assert!(failing(&["serve", "--socket", socket]).contains("nothing to serve"));
    assert!(!Path::new(socket).exists(), "a refused serve left a socket");
}

#[test]
fn inspect_keeps_names_that_are_not_utf8_apart_in_json_and_in_text() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    let dir = tempfile::tempdir().unwrap();
    let made = dir.path().join("made");
    generate("imagefolder", 20, &made);
    // Two classes whose names differ only in a byte that is not UTF-8, under such a root.
    let root = dir.path().join(OsStr::from_bytes(b"ds\xff"));
    std::fs::rename(&made, &root).unwrap();
    let mut classes: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    classes.sort();
    std::fs::rename(&classes[0], root.join(OsStr::from_bytes(b"cl\xfe"))).unwrap();
    std::fs::rename(&classes[1], root.join(OsStr::from_bytes(b"cl\xff"))).unwrap();
    let inspect = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ladle"));
        command.args(["dataset", "inspect"]).arg(&root);
        if json {
            command.arg("--json");
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("the report is UTF-8")
    };
    let report: serde_json::Value = serde_json::from_str(&inspect(true)).unwrap();
    assert!(
        report["path"].as_str().unwrap().ends_with("/ds\\xff"),
        "{report}"
    );
    let names: Vec<&str> = (report["class_names"].as_array().unwrap().iter())
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"cl\\xfe") && names.contains(&"cl\\xff"),
        "{names:?}"
    );
    let text = inspect(false);
    assert!(
        text.contains("cl\\xfe") && text.contains("cl\\xff") && text.contains("ds\\xff"),
        "{text}"
    );
}

/// A 1-bit grey PNG of `side × side` zeros: a few KB declaring `side²` pixels.
fn png_bomb(side: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, side, side);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::One);
    let mut writer = encoder.write_header().unwrap();
    let mut stream = writer.stream_writer().unwrap();
    let row = vec![0u8; side.div_ceil(8) as usize];
    for _ in 0..side {
        std::io::Write::write_all(&mut stream, &row).unwrap();
    }
    stream.finish().unwrap();
    writer.finish().unwrap();
    out
}

#[test]
fn hostile_files_named_like_images_are_bad_files_that_cost_nothing_and_say_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    generate("imagefolder", 20, dir.path());
    let class = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let fifo = class.join("zz.jpg");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo {}", fifo.display());
    std::os::unix::fs::symlink("/dev/zero", class.join("zy.jpg")).unwrap();
    // 2 GiB that use no disk, and 268 megapixels in 33 KB: each was read or decoded whole.
    let sparse = std::fs::File::create(class.join("zx.jpg")).unwrap();
    sparse.set_len(2 << 30).unwrap();
    drop(sparse);
    std::fs::write(class.join("zw.png"), png_bomb(16_384)).unwrap();
    // Once, a FIFO hung inspect (and every consumer) for ever, and /dev/zero grew it to all
    // the memory it could have: run it with a deadline.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ladle"))
        .args(["dataset", "inspect", "--json"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("ladle dataset inspect hung on a FIFO or /dev/zero (a hang guard)");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["samples"], 24, "{report}");
    let errors: Vec<String> = (report["errors"].as_array().unwrap().iter())
        .map(|e| e["error"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(
        errors.iter().any(
            |e| e.contains("zx.jpg is 2147483648 bytes, above the limit of")
                && e.contains("--max-file-mib")
        ),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("zw.png")
            && e.contains("16384x16384, above the limit of 178956970 pixels")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("zz.jpg is a FIFO")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("zy.jpg is a character device")),
        "{errors:?}"
    );
}

#[test]
fn the_limits_on_a_sample_are_options_that_inspect_applies_as_a_feed_would() {
    let dir = tempfile::tempdir().unwrap();
    generate("imagefolder", 6, dir.path());
    let inspect = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ladle"))
            .args(["dataset", "inspect", "--json"])
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let report = inspect(&[]);
    assert_eq!(report["decoded"], 6, "{report}");
    assert_eq!(report["limits"]["max_pixels"], 178_956_970, "{report}");
    assert_eq!(report["limits"]["max_file_bytes"], 512 << 20, "{report}");
    // Every generated image is 80x60, and its file far under 1 MiB: the pixel limit alone
    // refuses them.
    let report = inspect(&["--max-pixels", "100", "--max-file-mib", "1"]);
    assert_eq!(report["decoded"], 0, "{report}");
    let errors = report["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 6, "{report}");
    assert!(
        errors.iter().all(|e| e["error"]
            .as_str()
            .unwrap()
            .contains("above the limit of 100 pixels")),
        "{report}"
    );
    let refused = Command::new(env!("CARGO_BIN_EXE_ladle"))
        .args(["dataset", "inspect", "--max-pixels", "0"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--max-pixels"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
