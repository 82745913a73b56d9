//! Samples/s of the multi-threaded decode + augment pipeline with 1 and 2 threads, reading the
//! embedded synthetic dataset from disk (ImageFolder, 500×375 JPEGs) and writing
//! RandomResizedCrop(224) + flip samples into an in-memory sink.
//!
//! After criterion's measurements it runs 1-thread and 2-thread passes interleaved (so both
//! see the same machine noise) and prints the median ratio.
//!
//! Run: `cargo bench -p ladle-benches --bench pipeline`

use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ladle_benches::dataset;
use ladle_datasets::prelude::*;

const IMAGES: u64 = 200;

fn run(pipeline: &Pipeline, ds: &dyn Dataset, sink: &SlotBuffer, epoch: u64) -> u64 {
    let items = EpochSampler::new(ds.len(), 0)
        .order(epoch)
        .into_iter()
        .enumerate()
        .map(|(seq, index)| WorkItem {
            seq: seq as u64,
            index,
            epoch,
        });
    let stats = pipeline.run(ds, items, sink).expect("pipeline run");
    assert_eq!(stats.written, ds.len(), "every sample must be written");
    stats.written
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = dataset(dir.path(), Format::ImageFolder, IMAGES);
    let augment = Transforms::train(224);
    let sink = SlotBuffer::new(64, augment.output_len());
    let pipelines: Vec<(usize, Pipeline)> = [1, 2]
        .into_iter()
        .map(|threads| {
            let p = PipelineConfig {
                threads,
                augment: augment.clone(),
                ..Default::default()
            }
            .build();
            (threads, p.expect("pipeline config"))
        })
        .collect();

    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(IMAGES));
    group.sample_size(10);
    for (threads, pipeline) in &pipelines {
        let mut epoch = 0;
        group.bench_function(format!("threads={threads}"), |b| {
            b.iter(|| {
                epoch += 1;
                run(pipeline, ds.as_ref(), &sink, epoch)
            })
        });
    }
    group.finish();

    // Interleaved passes: the ratio of rates, each pair measured back to back.
    let mut ratios = Vec::new();
    let mut rates = [Vec::new(), Vec::new()];
    for round in 0..7 {
        let mut pair = [0.0; 2];
        for (k, (_, pipeline)) in pipelines.iter().enumerate() {
            let start = Instant::now();
            let n = run(pipeline, ds.as_ref(), &sink, 100 + round);
            pair[k] = n as f64 / start.elapsed().as_secs_f64();
            rates[k].push(pair[k]);
        }
        ratios.push(pair[1] / pair[0]);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "interleaved, 7 rounds: 1 thread {:.0} samples/s, 2 threads {:.0} samples/s, \
         median ratio 2t/1t = {:.2}",
        median(&mut rates[0]),
        median(&mut rates[1]),
        median(&mut ratios)
    );
}

criterion_group!(pipeline, benches);
criterion_main!(pipeline);
