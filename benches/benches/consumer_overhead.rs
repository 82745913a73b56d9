//! Consumer-side cost per batch: the time `Epoch::next` + dropping the batch take when the
//! samples are already in the ring (the producer is ahead), for batch sizes 1 to 256, on two
//! feeds: 224×224 images (`image`, `label`) and a multi-field feed (`wave: f32[16000],
//! length: i32, label: i64, mask: bool[3]`, an audio clip with its length) whose every field
//! is looked up by name and viewed typed inside the timed part. Zero copy means this must
//! not grow with the batch size.
//!
//! Method: an in-process producer fills its ring and blocks (backpressure); the consumer
//! then takes half a ring's worth of batches, in rounds (up to 20, at most 500 batches) with
//! the ring refilled before each, timing each `next()` and the batch's drop (the release),
//! and, outside the timed part, reading one byte per sample of each field so that the views
//! are real. Reported: median and mean µs per batch of the consumer thread's CPU time (its
//! own cost) and of wall time (which also holds the moments the OS runs the producer's
//! threads instead, on this 2-core machine).
//!
//! Run: `cargo bench -p ladle-benches --bench consumer_overhead`

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use ladle_benches::thread_cpu;
use ladle_consumer::DatasetInfo as Info;
use ladle_consumer::Schema;
use ladle_consumer::prelude::*;
use ladle_datasets::pipeline::{SampleMaker, WorkItem};
use ladle_datasets::{Format, SampleError};
use ladle_producer::{CustomSource, Producer, ProducerConfig, ReadAhead};

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let dataset = ladle_benches::dataset(&data, Format::ImageFolder, 2000);
    let socket = dir.path().join("bench.sock");
    let config = ProducerConfig {
        socket: socket.clone(),
        threads: 2,
        // The ring filled ahead of the consumer, so that no timed call waits for a sample
        // (since protocol 7 the default read-ahead decodes only four batches ahead).
        read_ahead: ReadAhead::Ring,
        ..ProducerConfig::default()
    };
    let producer = Producer::start(Arc::from(dataset), config).expect("start the producer");
    measure(&producer, &socket, |batch, read| {
        let bytes = batch.images();
        if !read {
            return bytes.as_ptr() as u64;
        }
        let per = bytes.len() / batch.len();
        (0..batch.len()).map(|i| u64::from(bytes[i * per])).sum()
    });
    producer.stop();
    producer.wait().expect("producer stopped cleanly");

    let socket = dir.path().join("fields.sock");
    let config = ProducerConfig {
        socket: socket.clone(),
        threads: 2,
        // The ring filled ahead of the consumer, so that no timed call waits for a sample
        // (since protocol 7 the default read-ahead decodes only four batches ahead).
        read_ahead: ReadAhead::Ring,
        ..ProducerConfig::default()
    };
    let source = Arc::new(Clips {
        schema: "wave: f32[16000], length: i32, label: i64, mask: bool[3]"
            .parse()
            .expect("schema"),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let producer = Producer::start_custom(source, config, stop).expect("start the producer");
    measure(&producer, &socket, |batch, read| {
        // Every field by name, typed.
        let wave = batch.field::<f32>("wave").expect("wave");
        let length = batch.field::<i32>("length").expect("length");
        let label = batch.field::<i64>("label").expect("label");
        let mask = batch.field_view("mask").expect("mask");
        if !read {
            let ptrs = [
                wave.as_ptr() as u64,
                length.as_ptr() as u64,
                label.as_ptr() as u64,
            ];
            return ptrs.iter().sum::<u64>() + mask.bytes.as_ptr() as u64;
        }
        let per = wave.len() / batch.len();
        (0..batch.len())
            .map(|i| {
                wave[i * per] as u64
                    + length[i] as u64
                    + label[i] as u64
                    + u64::from(mask.bytes[i * 3])
            })
            .sum()
    });
    producer.stop();
    producer.wait().expect("producer stopped cleanly");
}

/// An audio-like feed made in memory: the cost measured is the consumer's, not the source's.
#[derive(Debug)]
struct Clips {
    schema: Schema,
}

impl CustomSource for Clips {
    fn schema(&self) -> &Schema {
        &self.schema
    }
    fn info(&self) -> Info {
        Info {
            len: 20_000,
            class_names: vec![],
            source: "clips".into(),
        }
    }
    fn maker(&self) -> Box<dyn SampleMaker + '_> {
        Box::new(ClipMaker)
    }
}

struct ClipMaker;

impl SampleMaker for ClipMaker {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        for (k, field) in fields.iter_mut().enumerate() {
            field.fill((item.index as usize + k) as u8);
        }
        Ok(())
    }
}

/// Times `next()`, `touch(batch, false)` (looking the fields up) and the drop over batch
/// sizes 1..=256 on `producer`'s feed; `touch(batch, true)`, outside the timed part, reads a
/// byte of every sample of every field it views and returns a checksum.
fn measure(producer: &Producer, socket: &Path, touch: impl Fn(&Batch<'_>, bool) -> u64) {
    let capacity = producer.layout().capacity;
    println!("ring: {capacity} samples of `{}`", producer.layout().schema);
    println!(
        "{:>6} {:>8} {:>13} {:>11} {:>13} {:>11}   (µs per batch)",
        "batch", "batches", "cpu median", "cpu mean", "wall median", "wall mean"
    );
    for batch_size in [1u32, 32, 64, 128, 256] {
        let cfg = ConsumerConfig {
            batch_size,
            max_batches_held: 2,
            ..ConsumerConfig::default()
        };
        let consumer = Consumer::connect(socket, cfg).expect("connect");
        let start = consumer.start_seq();
        let per_round = ((capacity / 2) / u64::from(batch_size)).max(1);
        let n = 500.min((per_round * 20) as usize);
        let mut times = Vec::with_capacity(n);
        let mut cpu = Vec::with_capacity(n);
        let mut epoch = consumer.epoch();
        let mut checksum = 0u64;
        let mut taken = 0u64;
        let mut next_seq = start;
        while times.len() < n {
            if taken % per_round == 0 {
                // Let the producer fill the ring ahead of us and stop (backpressure), so that
                // nothing below is waiting for samples.
                let cursor = next_seq; // nothing is held, so the cursor is here
                let deadline = Instant::now() + Duration::from_secs(300);
                while producer.published() < cursor + capacity {
                    assert!(
                        Instant::now() < deadline,
                        "the producer never filled the ring"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let (t, c) = (Instant::now(), thread_cpu());
            let Some(batch) = epoch.next() else {
                epoch = consumer.epoch(); // the dataset's epoch ended: go on with the next
                continue;
            };
            let batch = batch.expect("no error");
            checksum = checksum.wrapping_add(std::hint::black_box(touch(&batch, false)));
            let (handed_out, handed_out_cpu) = (t.elapsed(), thread_cpu() - c);
            checksum = checksum.wrapping_add(touch(&batch, true));
            taken += 1;
            next_seq = batch.first_seq() + batch.len() as u64;
            let (t, c) = (Instant::now(), thread_cpu());
            drop(batch);
            times.push(handed_out + t.elapsed());
            cpu.push(handed_out_cpu + (thread_cpu() - c));
        }
        times.sort();
        cpu.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let mean = |v: &[Duration]| v.iter().sum::<Duration>() / v.len() as u32;
        println!(
            "{batch_size:>6} {n:>8} {:>13.2} {:>11.2} {:>13.2} {:>11.2}   (checksum {checksum})",
            us(cpu[n / 2]),
            us(mean(&cpu)),
            us(times[n / 2]),
            us(mean(&times)),
        );
    }
}
