//! A feed of a custom schema, end to end in one process: a `CustomSource` whose makers write
//! four fields (one of a length that is not a multiple of 8), two real consumers of batch 32
//! and 100 over two epochs, typed views checked against their dtype, and a bad sample.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ladle_consumer::{Consumer, ConsumerConfig, DType, FieldError};
use ladle_datasets::SampleError;
use ladle_datasets::pipeline::{SampleMaker, WorkItem};
use ladle_producer::{CustomSource, Producer, ProducerConfig};
use ladle_ring::Schema;
use ladle_ring::protocol::DatasetInfo;

const LEN: u64 = 700;
const WAVE: usize = 1001;
const BAD: u64 = 9;

fn wave(index: u64, k: usize) -> f32 {
    index as f32 * 0.5 + k as f32
}

#[derive(Debug)]
struct Waves {
    schema: Schema,
}

struct Maker;

impl SampleMaker for Maker {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        if item.index == BAD {
            return Err(SampleError::Source {
                location: format!("index {}", item.index),
                message: "corrupt".into(),
            });
        }
        let [wave_out, length, label, mask] = fields else {
            panic!("four fields")
        };
        for (k, out) in wave_out.chunks_exact_mut(4).enumerate() {
            out.copy_from_slice(&wave(item.index, k).to_ne_bytes());
        }
        length.copy_from_slice(&(item.index as i32 * 3).to_ne_bytes());
        label.copy_from_slice(&(item.index as i64).to_ne_bytes());
        mask.copy_from_slice(&[1, (item.index % 2) as u8, 0]);
        Ok(())
    }
}

impl CustomSource for Waves {
    fn schema(&self) -> &Schema {
        &self.schema
    }
    fn info(&self) -> DatasetInfo {
        DatasetInfo {
            len: LEN,
            class_names: vec![],
            source: "waves".into(),
        }
    }
    fn maker(&self) -> Box<dyn SampleMaker + '_> {
        Box::new(Maker)
    }
}

#[test]
fn two_consumers_read_every_field_of_a_custom_schema_exactly_over_two_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("waves.sock");
    let schema: Schema = format!("wave: f32[{WAVE}], length: i32, label: i64, mask: bool[3]")
        .parse()
        .unwrap();
    let source = Arc::new(Waves { schema });
    let config = ProducerConfig {
        socket: socket.clone(),
        ring_bytes: 16 << 20,
        threads: 2,
        ..ProducerConfig::default()
    };
    let producer =
        Producer::start_custom(source, config, Arc::new(AtomicBool::new(false))).unwrap();
    let read = |batch_size: u32| {
        let socket = socket.clone();
        std::thread::spawn(move || {
            let config = ConsumerConfig {
                batch_size,
                ..ConsumerConfig::default()
            };
            let consumer = Consumer::connect(&socket, config).unwrap();
            assert_eq!(
                consumer.schema().to_string(),
                format!("wave: f32[{WAVE}], length: i32, label: i64, mask: bool[3]")
            );
            let mut epochs = Vec::new();
            for _ in 0..2 {
                let mut seen = Vec::new();
                for batch in consumer.epoch() {
                    let batch = batch.unwrap();
                    let waves = batch.field::<f32>("wave").unwrap();
                    let lengths = batch.field::<i32>("length").unwrap();
                    let mask = batch.field_view("mask").unwrap();
                    assert_eq!(mask.dtype(), DType::Bool);
                    assert_eq!(mask.shape(), vec![batch.len(), 3]);
                    assert_eq!(waves.len(), batch.len() * WAVE);
                    assert!(batch.images().is_empty(), "no image field");
                    assert_eq!(
                        batch.field::<i64>("wave").unwrap_err(),
                        FieldError::DType {
                            name: "wave".into(),
                            dtype: DType::F32,
                            asked: DType::I64
                        }
                    );
                    assert!(matches!(
                        batch.field::<f32>("nope"),
                        Err(FieldError::Missing { .. })
                    ));
                    let bad = batch.indices().iter().filter(|&&i| i == BAD).count();
                    assert_eq!(batch.bad_count(), bad);
                    for (n, &index) in batch.indices().iter().enumerate() {
                        let wave_n = &waves[n * WAVE..(n + 1) * WAVE];
                        if index == BAD {
                            assert!(wave_n.iter().all(|&v| v == 0.0));
                            assert_eq!((lengths[n], batch.labels()[n]), (0, -1));
                            assert_eq!(&mask.bytes[n * 3..n * 3 + 3], &[0, 0, 0]);
                            continue;
                        }
                        assert!(wave_n.iter().enumerate().all(|(k, &v)| v == wave(index, k)));
                        assert_eq!(lengths[n], index as i32 * 3);
                        assert_eq!(batch.labels()[n], index as i64);
                        assert_eq!(&mask.bytes[n * 3..n * 3 + 3], &[1, (index % 2) as u8, 0]);
                    }
                    seen.extend_from_slice(batch.indices());
                }
                seen.sort_unstable();
                epochs.push(seen);
            }
            epochs
        })
    };
    let (small, large) = (read(32), read(100));
    for reader in [small, large] {
        for epoch in reader.join().unwrap() {
            assert_eq!(epoch, (0..LEN).collect::<Vec<_>>());
        }
    }
    producer.stop();
    let served = producer.wait().unwrap();
    assert!(served.bad_samples >= 2, "{served:?}");
}
