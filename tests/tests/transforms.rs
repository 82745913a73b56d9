//! `ladle serve --transform`: a torchvision-style pipeline served to a real consumer, and the
//! command line's errors for a bad or conflicting spec.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use ladle_tests::Fixture;

/// Deadlock guard for one run; never a speed assertion.
const GUARD: Duration = Duration::from_secs(300);

/// Generates a CIFAR-10 binary dataset of `count` 32×32 images; returns its path.
fn cifar10(fx: &mut Fixture, count: u32) -> std::path::PathBuf {
    let out = fx.path().join("cifar");
    let count = count.to_string();
    let done = fx.run(
        &[
            "dataset",
            "generate",
            "--format",
            "cifar10",
            "--count",
            &count,
            "--out",
            out.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(done.status.success(), "generate failed: {}", done.stderr);
    out
}

#[test]
fn serving_cifar10_with_random_crop_and_flip_gives_32x32_images_with_exact_coverage() {
    let mut fx = Fixture::new();
    let data = cifar10(&mut fx, 500);
    let serve = fx.serve(
        &data,
        &[
            "--transform",
            "RandomCrop(32, padding=4), RandomHorizontalFlip()",
            "--ring-mib",
            "2",
            "--threads",
            "2",
        ],
    );
    let consumer = fx.consume(64, 2, &[]);
    let epochs = fx.wait(consumer, GUARD).assert_exact(2, "consumer");
    assert_eq!(epochs[0]["samples"], 500);
    fx.signal(serve, 15);
    let served = fx.wait(serve, GUARD);
    assert!(
        served
            .stderr
            .contains("samples of `image: u8[32, 32, 3], label: i64`"),
        "the ring holds 32x32 images: {}",
        served.stderr
    );
}

#[test]
fn a_bad_spec_names_the_transform_and_the_argument_and_eval_conflicts_with_transform() {
    let mut fx = Fixture::new();
    let data = cifar10(&mut fx, 10);
    let socket = fx.socket();
    let base = [
        "serve",
        "--dataset",
        data.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ];
    let bad = fx.run(
        &[&base[..], &["--transform", "RandomCrop(32, padding=-4)"]].concat(),
        GUARD,
    );
    assert!(!bad.status.success());
    assert!(
        bad.stderr.contains("RandomCrop: padding must be ≥ 0"),
        "{}",
        bad.stderr
    );
    let unknown = fx.run(
        &[&base[..], &["--transform", "RandomCrap(32)"]].concat(),
        GUARD,
    );
    assert!(!unknown.status.success());
    assert!(
        unknown.stderr.contains("unknown transform \"RandomCrap\""),
        "{}",
        unknown.stderr
    );
    let both = fx.run(
        &[&base[..], &["--transform", "CenterCrop(32)", "--eval"]].concat(),
        GUARD,
    );
    assert!(!both.status.success());
    assert!(
        both.stderr.contains("cannot be used with"),
        "{}",
        both.stderr
    );
}
