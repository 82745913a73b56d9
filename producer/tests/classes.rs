//! A dataset of 25 000 classes (ImageNet-21k has 21 841): every consumer joins and gets every
//! class name, a rank of a group too; a group too large for its messages is refused. Their names once went in the `Welcome`'s one frame of at
//! most 64 KiB, and with more than about 5 400 classes the producer started and then refused
//! every consumer ("frame of 240538 bytes exceeds the 65536-byte limit").

use std::sync::Arc;

use ladle_consumer::{Consumer, ConsumerConfig, Even, GroupSpec};
use ladle_datasets::transforms::Transforms;
use ladle_producer::{Producer, ProducerConfig};

const CLASSES: usize = 25_000;

#[test]
fn a_dataset_of_25000_classes_welcomes_every_consumer_with_every_class_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut jpeg = Vec::new();
    ladle_datasets::synth::encode(
        &[90u8; 8 * 8 * 3],
        8,
        8,
        ladle_datasets::synth::Encoding::Baseline420,
        90,
        &mut jpeg,
    )
    .unwrap();
    let root = dir.path().join("data");
    let first = root.join("first.jpg");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(&first, &jpeg).unwrap();
    for class in 0..CLASSES {
        // Names of 20 bytes and more, as WordNet ids with a word are.
        let folder = root.join(format!("n{class:08}_class_{class}"));
        std::fs::create_dir(&folder).unwrap();
        std::fs::hard_link(&first, folder.join("a.jpg")).unwrap();
    }
    std::fs::remove_file(&first).unwrap();
    let dataset: Arc<dyn ladle_datasets::Dataset> = ladle_datasets::open(&root).unwrap().into();
    assert_eq!(dataset.class_names().len(), CLASSES);
    let names = dataset.class_names().to_vec();
    let socket = dir.path().join("feed.sock");
    let config = ProducerConfig {
        socket: socket.clone(),
        ring_bytes: 8 << 20,
        augment: Transforms::train(8),
        threads: 2,
        ..ProducerConfig::default()
    };
    let producer = Producer::start(dataset, config).unwrap();
    let plain = Consumer::connect(
        &socket,
        ConsumerConfig {
            batch_size: 50,
            ..ConsumerConfig::default()
        },
    )
    .unwrap();
    assert_eq!(plain.dataset().class_names, names);
    let rank = Consumer::connect(
        &socket,
        ConsumerConfig {
            batch_size: 50,
            group: Some(GroupSpec {
                name: "job".into(),
                rank: 0,
                world_size: 1,
                even: Even::Pad,
            }),
            ..ConsumerConfig::default()
        },
    )
    .unwrap();
    assert_eq!(rank.dataset().class_names, names);
    // A group too large for its GroupWaiting to fit a frame is refused, saying so.
    let huge = Consumer::connect(
        &socket,
        ConsumerConfig {
            batch_size: 50,
            group: Some(GroupSpec {
                name: "huge".into(),
                rank: 0,
                world_size: ladle_ring::protocol::MAX_WORLD_SIZE + 1,
                even: Even::Pad,
            }),
            ..ConsumerConfig::default()
        },
    );
    let err = match huge {
        Ok(_) => panic!("a group of 8193 ranks is refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("8193 ranks are more than a feed takes (8192)"),
        "{err}"
    );
    // And the feed serves them: a batch whose labels name classes.
    let batch = plain.epoch().next().unwrap().unwrap();
    assert_eq!(batch.len(), 50);
    assert!(
        batch
            .labels()
            .iter()
            .all(|&l| (0..CLASSES as i64).contains(&l))
    );
    drop(batch);
    drop((plain, rank));
    producer.stop();
}
