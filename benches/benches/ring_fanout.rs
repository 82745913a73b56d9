//! Fan-out without slowdown: with 4 consumers (batch 32, 64, 128, 256) on one producer, each
//! consumer's samples/s against the producer's rate with a single consumer, measured side by
//! side in one invocation.
//!
//! Method: real processes (`ladle serve`, `ladle consume --json`) on the embedded synthetic
//! dataset (500×375 JPEGs, RandomResizedCrop(224) + flip, 2 decode threads). Each round runs
//! one consumer alone, then four together, each reading 3 epochs of 600 samples; the rate is
//! what `ladle consume` reports over its whole run. 3 rounds; medians.
//!
//! Run: `cargo bench -p ladle-benches --bench ring_fanout`

use std::time::Duration;

use ladle_tests::Fixture;

const EPOCHS: u32 = 3;
const GUARD: Duration = Duration::from_secs(600);

fn rate(fx: &mut Fixture, consumer: usize) -> f64 {
    let done = fx.wait(consumer, GUARD);
    assert!(done.status.success(), "consumer failed: {}", done.stderr);
    let lines = done.json_lines();
    assert!(
        lines
            .iter()
            .filter(|l| l.get("epoch").is_some())
            .all(|l| l["exact_coverage"] == true),
        "coverage broken: {}",
        done.stdout
    );
    let last = lines.last().expect("a summary line");
    last["samples_per_s"].as_f64().expect("samples_per_s")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut fx = Fixture::new();
    let data = fx.path().join("data");
    ladle_benches::dataset(&data, ladle_datasets::Format::ImageFolder, 600);
    let serve = ["--threads", "2", "--ring-mib", "256"];
    let mut single = Vec::new();
    let mut ratios: [Vec<f64>; 4] = Default::default();
    for round in 0..3 {
        fx.serve(&data, &serve);
        let alone = fx.consume(32, EPOCHS, &[]);
        let alone = rate(&mut fx, alone);
        let four: Vec<usize> = [32, 64, 128, 256]
            .iter()
            .map(|&b| fx.consume(b, EPOCHS, &[]))
            .collect();
        let rates: Vec<f64> = four.into_iter().map(|c| rate(&mut fx, c)).collect();
        println!(
            "round {round}: alone {alone:.0} samples/s; four: {}",
            rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        single.push(alone);
        for (k, r) in rates.iter().enumerate() {
            ratios[k].push(r / alone);
        }
        fx.kill_all();
    }
    println!(
        "single consumer (batch 32): median {:.0} samples/s",
        median(single)
    );
    for (k, b) in [32, 64, 128, 256].iter().enumerate() {
        println!(
            "four consumers, batch {b:>3}: median {:.2} of the single-consumer rate",
            median(ratios[k].clone())
        );
    }
}
