//! Consumer-side cost per batch: the time `Epoch::next` + dropping the batch take when the
//! samples are already in the ring (the producer is ahead), for batch sizes 1 to 256 of
//! 224×224 images. Zero copy means this must not grow with the batch size.
//!
//! Method: an in-process producer over a small generated dataset fills a 256 MiB ring and
//! blocks (backpressure); the consumer then takes half a ring's worth of batches, in rounds
//! (up to 20, at most 500 batches) with the ring refilled before each, timing each `next()` and the batch's drop (the release), and, outside the
//! timed part, reading one byte per image so that the views are real. Reported: median and
//! mean µs per batch of the consumer thread's CPU time (its own cost) and of wall time (which
//! also holds the moments the OS runs the producer's threads instead, on this 2-core machine).
//!
//! Run: `cargo bench -p ladle-benches --bench consumer_overhead`

use std::sync::Arc;
use std::time::{Duration, Instant};

use ladle_consumer::prelude::*;
use ladle_datasets::Format;
use ladle_producer::{Producer, ProducerConfig};

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let dataset = ladle_benches::dataset(&data, Format::ImageFolder, 2000);
    let socket = dir.path().join("bench.sock");
    let config = ProducerConfig {
        socket: socket.clone(),
        threads: 2,
        ..ProducerConfig::default()
    };
    let producer = Producer::start(Arc::from(dataset), config).expect("start the producer");
    let capacity = producer.layout().capacity;
    println!("ring: {capacity} samples of 224x224x3");
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
        let consumer = Consumer::connect(&socket, cfg).expect("connect");
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
            let (handed_out, handed_out_cpu) = (t.elapsed(), thread_cpu() - c);
            let batch = batch.expect("no error");
            taken += 1;
            next_seq = batch.first_seq() + batch.len() as u64;
            // Outside the timed part: check the views are real (one byte per image).
            let bytes = batch.images();
            let per = bytes.len() / batch.len();
            checksum += (0..batch.len())
                .map(|i| u64::from(bytes[i * per]))
                .sum::<u64>();
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
    producer.stop();
    producer.wait().expect("producer stopped cleanly");
}

/// CPU time this thread has used: the consumer's own cost, without the time the OS gave the
/// producer's threads on the same two cores.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
