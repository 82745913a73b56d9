//! µs per image for decode, for augment (RandomResizedCrop(224) + flip), and for both, on the
//! embedded synthetic dataset (500×375 JPEGs of ~100 KB in mixed encodings), single thread.
//! Also prints how many heap allocations each step makes per image.
//!
//! Run: `cargo bench -p ladle-benches --bench decode_augment`

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use ladle_benches::{CountingAlloc, dataset};
use ladle_datasets::decode::{Decoder, RgbImage};
use ladle_datasets::synth::Encoding;
use ladle_datasets::transforms::{Transformer, Transforms};
use ladle_datasets::{Format, RecordData};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const IMAGES: u64 = 120;

struct Sample {
    encoded: Vec<u8>,
    encoding: Encoding,
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

fn load() -> Vec<Sample> {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = dataset(dir.path(), Format::WebDataset, IMAGES);
    let mut decoder = Decoder::new();
    (0..ds.len())
        .map(|i| {
            let mut scratch = Vec::new();
            let RecordData::Encoded(bytes) =
                ds.read(i, &mut scratch, &Default::default()).expect("read")
            else {
                unreachable!("WebDataset records are encoded files")
            };
            let encoded = bytes.to_vec();
            let img = decoder.decode(&encoded).expect("decode");
            Sample {
                encoding: Encoding::of(1, i),
                width: img.width,
                height: img.height,
                rgb: img.pixels.to_vec(),
                encoded,
            }
        })
        .collect()
}

fn view(s: &Sample) -> RgbImage<'_> {
    RgbImage {
        width: s.width,
        height: s.height,
        pixels: &s.rgb,
    }
}

fn benches(c: &mut Criterion) {
    let samples = load();
    let mean_kb =
        samples.iter().map(|s| s.encoded.len()).sum::<usize>() as f64 / samples.len() as f64 / 1e3;
    let jpegs: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.encoding != Encoding::Png)
        .collect();
    let jpeg_kb =
        jpegs.iter().map(|s| s.encoded.len()).sum::<usize>() as f64 / jpegs.len() as f64 / 1e3;
    println!(
        "{} images, {mean_kb:.0} KB mean encoded size ({} JPEGs: {jpeg_kb:.0} KB mean)",
        samples.len(),
        jpegs.len()
    );
    let augment = Transforms::train(224);
    let mut out = vec![0u8; augment.output_len()];

    // Allocations per image, after one warm-up pass so reused buffers have grown.
    let mut decoder = Decoder::new();
    let mut augmenter = Transformer::new(augment.clone());
    for pass in 0..2 {
        let before = CountingAlloc::count();
        for (i, s) in samples.iter().enumerate() {
            let img = decoder.decode(&s.encoded).expect("decode");
            augmenter
                .apply(img, 0, 0, i as u64, &mut out)
                .expect("augment");
        }
        let decode_and_augment = CountingAlloc::count() - before;
        let before = CountingAlloc::count();
        for (i, s) in samples.iter().enumerate() {
            augmenter
                .apply(view(s), 0, 0, i as u64, &mut out)
                .expect("augment");
        }
        let augment_only = CountingAlloc::count() - before;
        if pass == 1 {
            let n = samples.len() as f64;
            println!(
                "allocations per image: decode+augment {:.1}, augment alone {:.1}",
                decode_and_augment as f64 / n,
                augment_only as f64 / n
            );
        }
    }

    let mut group = c.benchmark_group("per_image");
    group.throughput(Throughput::Elements(1));
    cycle(&mut group, "decode/mix", &samples, |_, s| {
        decoder.decode(&s.encoded).expect("decode").pixels[0]
    });
    for kind in [
        Encoding::Baseline420,
        Encoding::Progressive420,
        Encoding::Baseline444,
    ] {
        let subset: Vec<&Sample> = samples.iter().filter(|s| s.encoding == kind).collect();
        cycle(&mut group, &format!("decode/{kind:?}"), &subset, |_, s| {
            decoder.decode(&s.encoded).expect("decode").pixels[0]
        });
    }
    cycle(&mut group, "augment/rrc224_flip", &samples, |i, s| {
        augmenter
            .apply(view(s), 0, 0, i, &mut out)
            .expect("augment");
        out[0]
    });
    // The target's case is a baseline 4:2:0 500x375 JPEG of ~100 KB.
    let baseline: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.encoding == Encoding::Baseline420)
        .collect();
    let all: Vec<&Sample> = samples.iter().collect();
    for (name, set, augment) in [
        ("decode+augment/rrc224_flip", &all, augment.clone()),
        (
            "decode+augment/rrc224_flip/Baseline420",
            &baseline,
            augment.clone(),
        ),
        ("decode+augment/eval224", &all, Transforms::eval(224)),
    ] {
        let mut augmenter = Transformer::new(augment);
        cycle(&mut group, name, set, |i, s| {
            let img = decoder.decode(&s.encoded).expect("decode");
            augmenter.apply(img, 0, 0, i, &mut out).expect("augment");
            out[0]
        });
    }
    group.finish();
}

/// Benchmarks `f` on `items` round-robin, one item per iteration.
fn cycle<T>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    items: &[T],
    mut f: impl FnMut(u64, &T) -> u8,
) {
    if items.is_empty() {
        return;
    }
    let mut i = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            i = (i + 1) % items.len();
            black_box(f(i as u64, &items[i]))
        })
    });
}

criterion_group!(name = per_image; config = Criterion::default().sample_size(30); targets = benches);
criterion_main!(per_image);
