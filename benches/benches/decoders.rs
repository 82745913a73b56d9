//! The decoder decision: zune-jpeg (what ladle uses) against libjpeg-turbo through the
//! `turbojpeg` crate, full scale and with DCT-domain 1/2 downscaling, per JPEG encoding, on
//! the embedded synthetic dataset, single thread, decoding into a reused RGB buffer.
//!
//! Needs cmake, nasm and a C compiler (libjpeg-turbo is built from source):
//! `apt-get install -y cmake nasm && cargo bench -p ladle-benches --features turbojpeg --bench decoders`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ladle_benches::dataset;
use ladle_datasets::decode::Decoder;
use ladle_datasets::synth::Encoding;
use ladle_datasets::{Format, RecordData};
use turbojpeg::{Decompressor, Image, PixelFormat, ScalingFactor};

fn turbo(dec: &mut Decompressor, jpeg: &[u8], out: &mut Vec<u8>, scale: ScalingFactor) -> usize {
    dec.set_scaling_factor(scale).expect("scaling factor");
    let header = dec.read_header(jpeg).expect("header").scaled(scale);
    let len = header.width * header.height * 3;
    out.resize(len, 0);
    let image = Image {
        pixels: &mut out[..len],
        width: header.width,
        pitch: header.width * 3,
        height: header.height,
        format: PixelFormat::RGB,
    };
    dec.decompress(jpeg, image).expect("decompress");
    len
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = dataset(dir.path(), Format::WebDataset, 160);
    let files: Vec<(Encoding, Vec<u8>)> = (0..ds.len())
        .map(|i| {
            let mut scratch = Vec::new();
            let Ok(RecordData::Encoded(bytes)) = ds.read(i, &mut scratch, &Default::default())
            else {
                unreachable!("WebDataset records are encoded files")
            };
            (Encoding::of(1, i), bytes.to_vec())
        })
        .collect();
    let mut zune = Decoder::new();
    let mut tj = Decompressor::new().expect("turbojpeg");
    let mut out = Vec::new();
    let mut group = c.benchmark_group("decoders");
    group.throughput(Throughput::Elements(1));
    for kind in [
        Encoding::Baseline420,
        Encoding::Progressive420,
        Encoding::Baseline444,
    ] {
        let subset: Vec<&[u8]> = files
            .iter()
            .filter(|(e, _)| *e == kind)
            .map(|(_, b)| &b[..])
            .collect();
        let mut i = 0;
        group.bench_function(format!("zune/{kind:?}"), |b| {
            b.iter(|| {
                i = (i + 1) % subset.len();
                black_box(zune.decode(subset[i]).expect("decode").width)
            })
        });
        for (name, scale) in [
            ("turbo", ScalingFactor::ONE),
            ("turbo_half", ScalingFactor::ONE_HALF),
        ] {
            let mut i = 0;
            group.bench_function(format!("{name}/{kind:?}"), |b| {
                b.iter(|| {
                    i = (i + 1) % subset.len();
                    black_box(turbo(&mut tj, subset[i], &mut out, scale))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(name = decoders; config = Criterion::default().sample_size(30); targets = benches);
criterion_main!(decoders);
