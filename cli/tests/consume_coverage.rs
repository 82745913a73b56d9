//! `ladle consume` against the consumer SDK's fake producer: its exit status says whether
//! every epoch covered the dataset exactly, so that scripts and CI cannot miss a broken feed.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

#[path = "../../consumer-sdk/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use support::{Behaviour, TestProducer};

fn consume(producer: &TestProducer) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ladle"))
        .arg("consume")
        .arg("--socket")
        .arg(producer.socket())
        .args(["--batch-size", "10", "--epochs", "2", "--json"])
        .output()
        .unwrap()
}

fn epochs(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|record| record.get("epoch").is_some())
        .collect()
}

#[test]
fn consume_exits_non_zero_when_an_epoch_covers_the_dataset_inexactly() {
    // Every even index twice, no odd one: 100 samples per epoch, none of them missing.
    let producer = TestProducer::start(Behaviour::Duplicates { len: 100 });
    let out = consume(&producer);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exited 0; stderr: {stderr}");
    // Every epoch is still reported, each saying what was wrong.
    let epochs = epochs(&out);
    assert_eq!(epochs.len(), 2, "{stderr}");
    for epoch in &epochs {
        assert_eq!(epoch["complete"], true, "{epoch}");
        assert_eq!(epoch["exact_coverage"], false, "{epoch}");
    }
    assert!(stderr.contains("not exact"), "{stderr}");
    assert!(
        stderr.contains(&producer.socket().display().to_string()),
        "{stderr}"
    );
}

#[test]
fn consume_exits_zero_when_every_epoch_covers_the_dataset_exactly() {
    let producer = TestProducer::start(Behaviour::serve(100, 0));
    let out = consume(&producer);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let epochs = epochs(&out);
    assert_eq!(epochs.len(), 2, "{stderr}");
    assert!(
        epochs.iter().all(|e| e["exact_coverage"] == true),
        "{epochs:?}"
    );
}
