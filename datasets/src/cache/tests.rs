use std::sync::Arc;

use super::*;
use crate::pipeline::SampleProcessor;
use crate::transforms::Transforms;

/// An ImageFolder of `count` photo-like JPEGs of 200×150 (the generator's mix of encodings).
fn images(count: u64) -> (tempfile::TempDir, Box<dyn crate::Dataset>) {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::synth::SynthConfig {
        count,
        width: 200,
        height: 150,
        ..Default::default()
    };
    crate::synth::generate(&config, dir.path(), &|_| {}).unwrap();
    let dataset = crate::open(dir.path()).unwrap();
    (dir, dataset)
}

const SPECS: [&str; 5] = [
    "RandomResizedCrop(64), RandomHorizontalFlip()",
    "RandomResizedCrop(48, scale=(0.01, 0.1))",
    "Resize(80), CenterCrop(64)",
    "RandomResizedCrop(56), TrivialAugmentWide()",
    "RandomCrop(64, padding=4, padding_mode='reflect'), ColorJitter(0.4, 0.4, 0.4, 0.1)",
];

#[test]
fn a_cached_sample_is_bit_identical_to_a_decoded_one_for_every_transform_and_epoch() {
    let (_dir, dataset) = images(30);
    for spec in SPECS {
        let transforms = Transforms::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        // Two feeds of one dataset, another seed each: both read the one cache.
        let cache = Arc::new(HeapCache::new(u64::MAX));
        for seed in [3, 4] {
            let mut plain = SampleProcessor::new(transforms.clone(), seed);
            let mut cached = SampleProcessor::new(transforms.clone(), seed);
            cached.set_cache(cache.clone());
            let (mut a, mut b) = (
                vec![0; transforms.output_len()],
                vec![0; transforms.output_len()],
            );
            for epoch in 0..3 {
                for index in 0..dataset.len() {
                    let la = plain
                        .process(dataset.as_ref(), index, epoch, &mut a)
                        .unwrap();
                    let lb = cached
                        .process(dataset.as_ref(), index, epoch, &mut b)
                        .unwrap();
                    assert_eq!(la, lb);
                    assert!(
                        a == b,
                        "{spec}, seed {seed}: sample {index} of epoch {epoch} differs"
                    );
                }
            }
        }
        // Each image was decoded once for both feeds' three epochs.
        let stats = cache.stats();
        assert_eq!((stats.fills, stats.entries), (30, 30), "{spec}");
        assert_eq!(stats.hits, 30 * 3 * 2 - 30, "{spec}");
    }
}

#[test]
fn a_file_rewritten_since_it_was_cached_is_decoded_again_not_served_stale() {
    let (dir, dataset) = images(4);
    let transforms = Transforms::parse("Resize(32), CenterCrop(32)").unwrap();
    let cache = Arc::new(HeapCache::new(u64::MAX));
    let mut cached = SampleProcessor::new(transforms.clone(), 1);
    cached.set_cache(cache.clone());
    let mut out = vec![0; transforms.output_len()];
    cached.process(dataset.as_ref(), 0, 0, &mut out).unwrap();
    let before = out.clone();
    // Sample 0's file becomes sample 1's picture (another size, another time).
    // The generator's names are plain: a location is the path.
    let (zero, one) = (
        std::path::PathBuf::from(dataset.location(0)),
        std::path::PathBuf::from(dataset.location(1)),
    );
    assert!(zero.starts_with(dir.path()));
    std::fs::copy(&one, &zero).unwrap();
    let expected = {
        let mut plain = SampleProcessor::new(transforms.clone(), 1);
        let mut o = vec![0; transforms.output_len()];
        plain.process(dataset.as_ref(), 0, 0, &mut o).unwrap();
        o
    };
    assert_ne!(expected, before, "the rewrite changed the picture");
    cached.process(dataset.as_ref(), 0, 0, &mut out).unwrap();
    assert!(out == expected, "served the stale entry");
    assert_eq!(cache.stats().fills, 2);
}

#[test]
fn a_miss_with_no_room_decodes_as_without_a_cache_and_caches_nothing() {
    let (_dir, dataset) = images(6);
    let transforms = Transforms::parse("RandomResizedCrop(40)").unwrap();
    // Room for two 200×150 images: the third and later are decoded crop-aware each time,
    // and the two stay (nothing is evicted to admit another).
    let cache = Arc::new(HeapCache::new(2 * 200 * 150 * 3));
    let mut plain = SampleProcessor::new(transforms.clone(), 9);
    let mut cached = SampleProcessor::new(transforms.clone(), 9);
    cached.set_cache(cache.clone());
    let (mut a, mut b) = (
        vec![0; transforms.output_len()],
        vec![0; transforms.output_len()],
    );
    for epoch in 0..2 {
        for index in 0..dataset.len() {
            plain
                .process(dataset.as_ref(), index, epoch, &mut a)
                .unwrap();
            cached
                .process(dataset.as_ref(), index, epoch, &mut b)
                .unwrap();
            assert!(a == b, "sample {index} of epoch {epoch} differs");
        }
    }
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.fills), (2, 2));
    assert_eq!(stats.hits, 2, "the two kept, read again in epoch 1");
}

#[test]
fn a_hit_refuses_an_image_over_this_feeds_pixel_or_file_limit_with_the_error_a_decode_gives() {
    let (_dir, dataset) = images(2);
    let transforms = Transforms::parse("Resize(32), CenterCrop(32)").unwrap();
    let cache = Arc::new(HeapCache::new(u64::MAX));
    let mut filler = SampleProcessor::new(transforms.clone(), 1);
    filler.set_cache(cache.clone());
    let mut out = vec![0; transforms.output_len()];
    filler.process(dataset.as_ref(), 0, 0, &mut out).unwrap();
    for (limits, what) in [
        (
            crate::SampleLimits {
                max_pixels: 100 * 100,
                ..Default::default()
            },
            "pixels",
        ),
        (
            crate::SampleLimits {
                max_file_bytes: 10,
                ..Default::default()
            },
            "bytes",
        ),
    ] {
        let mut strict = SampleProcessor::with_limits(transforms.clone(), 1, limits);
        let decoded = strict
            .process(dataset.as_ref(), 0, 0, &mut out)
            .unwrap_err();
        strict.set_cache(cache.clone());
        let hit = strict
            .process(dataset.as_ref(), 0, 0, &mut out)
            .unwrap_err();
        assert_eq!(hit.to_string(), decoded.to_string(), "{what}");
    }
    assert_eq!(cache.stats().hits, 2, "both were hits, refused");
}

#[test]
fn cifar_records_are_never_cached() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::synth::SynthConfig {
        count: 5,
        format: crate::Format::Cifar10,
        ..Default::default()
    };
    crate::synth::generate(&config, dir.path(), &|_| {}).unwrap();
    let dataset = crate::open(dir.path()).unwrap();
    assert_eq!(dataset.stamp(0).unwrap(), None);
    let transforms = Transforms::parse("RandomCrop(32, padding=4)").unwrap();
    let cache = Arc::new(HeapCache::new(u64::MAX));
    let mut cached = SampleProcessor::new(transforms.clone(), 1);
    cached.set_cache(cache.clone());
    let mut buf = vec![0; transforms.output_len()];
    for index in 0..5 {
        cached
            .process(dataset.as_ref(), index, 0, &mut buf)
            .unwrap();
    }
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn a_stamp_is_the_size_and_mtime_of_the_file() {
    let (dir, dataset) = images(1);
    let stamp = dataset.stamp(0).unwrap().unwrap();
    let file = walk(dir.path()).into_iter().next().unwrap();
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(stamp.size, meta.len());
    let mtime = meta
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    assert_eq!(stamp.mtime_ns, i64::try_from(mtime.as_nanos()).unwrap());
}

/// The files under `dir`, depth first.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
