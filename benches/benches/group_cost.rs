//! What a rank of a consumer group and a resumed consumer cost per batch, against a plain
//! consumer of the same feed, side by side in one invocation.
//!
//! A plain consumer's batches are views of the ring (zero copy). A rank of a group takes
//! only its share of each epoch, so its batches are gathered: it walks W times as many
//! sequences and copies its samples into an owned batch; a resumed consumer does the same
//! for the epoch it resumes (only the samples not delivered yet). This measures that copy.
//!
//! Method: an in-process producer serves a feed made in memory (`image: u8[224, 224, 3],
//! label: i64`, so the producer is never what is measured), 2 threads. For each batch size,
//! in turn: a plain consumer; rank 0 of a group of 2 (rank 1 reads beside it on another
//! thread); a consumer resumed from a position with half of the epoch delivered. Each takes
//! 200 batches; reported is the consumer thread's CPU time per batch (median and mean, µs):
//! its own cost, waits excluded. Three rounds, alternating the modes.
//!
//! Run: `cargo bench -p ladle-benches --bench group_cost`

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use ladle_benches::thread_cpu;
use ladle_consumer::plan::Bitmap;
use ladle_consumer::prelude::*;
use ladle_consumer::{DatasetInfo as Info, Even, GroupSpec, Schema};
use ladle_datasets::SampleError;
use ladle_datasets::pipeline::{SampleMaker, WorkItem};
use ladle_producer::{CustomSource, Producer, ProducerConfig};

/// Long enough that 200 batches of 128 stay inside the resumed half-epoch and a rank's share.
const LEN: u64 = 60_000;
const BATCHES: usize = 200;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("bench.sock");
    let config = ProducerConfig {
        socket: socket.clone(),
        threads: 2,
        ring_bytes: 512 << 20,
        ..ProducerConfig::default()
    };
    let source = Arc::new(Images {
        schema: "image: u8[224, 224, 3], label: i64"
            .parse()
            .expect("schema"),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let producer = Producer::start_custom(source, config, stop).expect("start the producer");
    println!(
        "{:>6} {:>6} {:>22} {:>22} {:>22}   (consumer thread CPU µs per batch: median / mean)",
        "round", "batch", "plain (zero copy)", "rank 0 of 2 (gathered)", "resumed, half done"
    );
    for round in 0..3 {
        for batch_size in [32u32, 64, 128] {
            let plain = plain(&socket, batch_size);
            let rank = rank(&socket, batch_size, round);
            let resumed = resumed(&socket, batch_size);
            let show = |v: &(f64, f64)| format!("{:.1} / {:.1}", v.0, v.1);
            println!(
                "{round:>6} {batch_size:>6} {:>22} {:>22} {:>22}   rank/plain {:.2}, resumed/plain {:.2}",
                show(&plain),
                show(&rank),
                show(&resumed),
                rank.0 / plain.0,
                resumed.0 / plain.0,
            );
        }
    }
    producer.stop();
    producer.wait().expect("producer stopped cleanly");
}

fn config(batch_size: u32, group: Option<GroupSpec>) -> ConsumerConfig {
    ConsumerConfig {
        batch_size,
        group,
        ..ConsumerConfig::default()
    }
}

fn plain(socket: &Path, batch_size: u32) -> (f64, f64) {
    take(&Consumer::connect(socket, config(batch_size, None)).expect("connect"))
}

fn rank(socket: &Path, batch_size: u32, round: usize) -> (f64, f64) {
    let group = |rank| {
        Some(GroupSpec {
            name: format!("bench-{round}-{batch_size}"),
            rank,
            world_size: 2,
            even: Even::Pad,
        })
    };
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            let c = Consumer::connect(socket, config(batch_size, group(1))).expect("rank 1");
            // Reads beside rank 0 until rank 0 is done (then rank 0 leaves: not a break).
            let mut read = 0;
            while read < BATCHES {
                for batch in c.epoch() {
                    if batch.is_err() {
                        return;
                    }
                    read += 1;
                    if read == BATCHES {
                        break;
                    }
                }
            }
        });
        let c = Consumer::connect(socket, config(batch_size, group(0))).expect("rank 0");
        let cost = take(&c);
        drop(c);
        other.join().expect("rank 1");
        cost
    })
}

fn resumed(socket: &Path, batch_size: u32) -> (f64, f64) {
    let c = Consumer::connect(socket, config(batch_size, None)).expect("connect");
    let mut position = c.position();
    let mut half = Bitmap::new(LEN);
    for i in (0..LEN).step_by(2) {
        half.set(i);
    }
    position.delivered = half;
    c.load_position(&position).expect("load");
    take(&c)
}

/// Takes [`BATCHES`] batches; returns the median and mean of this thread's CPU time per
/// batch (`next()` and the drop), in µs.
fn take(consumer: &Consumer) -> (f64, f64) {
    let mut cpu = Vec::with_capacity(BATCHES);
    let mut epoch = consumer.epoch();
    while cpu.len() < BATCHES {
        let c = thread_cpu();
        let Some(batch) = epoch.next() else {
            epoch = consumer.epoch();
            continue;
        };
        let batch = batch.expect("no error");
        std::hint::black_box(batch.images()[0]);
        drop(batch);
        cpu.push(thread_cpu() - c);
    }
    cpu.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = cpu.iter().sum::<Duration>() / cpu.len() as u32;
    (us(cpu[cpu.len() / 2]), us(mean))
}

/// Images made in memory: the producer's cost is a fill, not a decode.
#[derive(Debug)]
struct Images {
    schema: Schema,
}

impl CustomSource for Images {
    fn schema(&self) -> &Schema {
        &self.schema
    }
    fn info(&self) -> Info {
        Info {
            len: LEN,
            class_names: vec![],
            source: "images in memory".into(),
        }
    }
    fn maker(&self) -> Box<dyn SampleMaker + '_> {
        Box::new(Filler)
    }
}

struct Filler;

impl SampleMaker for Filler {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        for field in fields.iter_mut() {
            field.fill(item.index as u8);
        }
        Ok(())
    }
}
