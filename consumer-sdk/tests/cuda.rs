//! The GPU path (feature `cuda`) against a real producer socket and ring.
//!
//! Without a GPU (CI) the tests not marked `#[ignore]` check the error paths: no driver is an
//! error value, never a panic, and the CPU path keeps working. The `#[ignore]`d ones need a
//! GPU: `cargo test -p ladle-consumer --features cuda --release -- --ignored`.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod support;

use std::sync::Arc;

#[path = "support/random.rs"]
mod random;
use random::random_bytes;

use ladle_consumer::cuda::{self, Converter, CudaError};
use ladle_consumer::prelude::*;
use ladle_consumer::{ConvertError, convert_cpu};
use support::{Behaviour, TestProducer, pixel};

fn connect(producer: &TestProducer, batch_size: u32) -> Arc<Consumer> {
    let config = ConsumerConfig {
        batch_size,
        name: "cuda-test".into(),
        ..ConsumerConfig::default()
    };
    Arc::new(Consumer::connect(producer.socket(), config).unwrap())
}

#[test]
fn without_a_driver_opening_a_device_is_the_no_driver_error() {
    if cuda::driver_present() {
        eprintln!("skipped: a CUDA driver is present here; the GPU tests cover this machine");
        return;
    }
    assert!(matches!(cuda::context(0), Err(CudaError::NoDriver)));
    assert!(matches!(cuda::driver_version(), Err(CudaError::NoDriver)));
    // Asked again: still an error, still no panic (the presence check is cached).
    let err = cuda::context(3).unwrap_err();
    assert!(matches!(err, CudaError::NoDriver));
    assert!(err.to_string().contains("CPU path"), "{err}");
}

#[test]
fn pinning_without_a_gpu_is_an_error_and_the_consumer_keeps_reading_on_the_cpu() {
    const LEN: u64 = 40;
    let producer = TestProducer::start(Behaviour::serve(LEN, 0));
    let consumer = connect(&producer, 16);
    match consumer.pin(0) {
        Err(CudaError::NoDriver) => assert!(!cuda::driver_present()),
        Err(CudaError::NoDevice {
            ordinal: 0,
            count: 0,
        }) => assert!(cuda::driver_present()),
        Ok(pinned) => assert!(Arc::ptr_eq(pinned.consumer(), &consumer)),
        Err(other) => panic!("unexpected error pinning device 0: {other}"),
    }
    // The CPU path: every batch reads and converts (unit normalisation: pixel / 255).
    let mut samples = 0;
    for batch in consumer.shared_epoch() {
        let batch = batch.unwrap();
        let mut out = vec![f32::NAN; batch.images().len()];
        convert_cpu(
            batch.images(),
            batch.shape(),
            &Normalize::UNIT,
            Layout::Nchw,
            &mut out,
        )
        .unwrap();
        let per_sample = out.len() / batch.len();
        for (k, &index) in batch.indices().iter().enumerate() {
            let want = f32::from(pixel(index)) / 255.0;
            let sample = &out[k * per_sample..(k + 1) * per_sample];
            assert!(
                sample.iter().all(|&v| (v - want).abs() < 1e-6),
                "sample {k}"
            );
        }
        samples += batch.len();
    }
    assert_eq!(samples as u64, LEN);
    assert_eq!(consumer.held_batches(), 0);
}

#[test]
fn converting_a_batch_with_the_wrong_output_length_is_an_error() {
    let producer = TestProducer::start(Behaviour::serve(10, 0));
    let consumer = connect(&producer, 4);
    let batch = consumer.epoch().next().unwrap().unwrap();
    let mut out = vec![0.0; batch.images().len() - 1];
    let err = convert_cpu(
        batch.images(),
        batch.shape(),
        &Normalize::IMAGENET,
        Layout::Nhwc,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(err, ConvertError::OutputLength { .. }), "{err}");
}

// ---- on a GPU -------------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU: run with --ignored on a GPU machine"]
fn an_unknown_device_ordinal_is_the_no_device_error() {
    let ctx = cuda::context(0).unwrap();
    assert_eq!(ctx.ordinal(), 0);
    let err = cuda::context(1000).unwrap_err();
    assert!(
        matches!(err, CudaError::NoDevice { ordinal: 1000, count } if count >= 1),
        "{err}"
    );
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a GPU machine"]
fn batches_copied_to_the_device_equal_the_ring_and_stay_held_until_the_copy_completes() {
    // 300 samples, ring of 512: the second epoch's batches wrap around the ring.
    const LEN: u64 = 300;
    let producer = TestProducer::start(Behaviour::serve(LEN, 0));
    let consumer = connect(&producer, 64);
    let pinned = consumer.pin(0).unwrap();
    let stream = pinned.context().new_stream().unwrap();
    let mut spare = Some(pinned.alloc_batch(&stream).unwrap());
    for _ in 0..2 {
        for batch in consumer.shared_epoch() {
            let batch = batch.unwrap();
            let (first, len) = (batch.first_seq(), batch.len());
            let mut flight = pinned.copy(batch, spare.take().unwrap(), &stream).unwrap();
            // Held until the event says the copy is done, not until `copy` returned.
            if !flight.is_done().unwrap() {
                assert_eq!(consumer.held_batches(), 1);
            }
            let device = flight.wait().unwrap();
            assert_eq!(consumer.held_batches(), 0);
            assert_eq!((device.first_seq(), device.len()), (first, len));
            let images = stream.clone_dtoh(&device.images()).unwrap();
            let labels = stream.clone_dtoh(&device.labels()).unwrap();
            let per_sample = images.len() / len;
            for k in 0..len {
                let index = (first + k as u64) % LEN;
                assert_eq!(labels[k], index as i64, "seq {}", first + k as u64);
                let sample = &images[k * per_sample..(k + 1) * per_sample];
                assert!(
                    sample.iter().all(|&p| p == pixel(index)),
                    "seq {}",
                    first + k as u64
                );
            }
            spare = Some(device);
        }
    }
    pinned.context().check_err().unwrap();
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a GPU machine"]
fn a_copy_dropped_before_it_completes_releases_its_batch_only_after_waiting() {
    let producer = TestProducer::start(Behaviour::serve(100, 0));
    let consumer = connect(&producer, 32);
    let pinned = consumer.pin(0).unwrap();
    let stream = pinned.context().new_stream().unwrap();
    let mut epoch = consumer.shared_epoch();
    for _ in 0..3 {
        let dst = pinned.alloc_batch(&stream).unwrap();
        let flight = pinned
            .copy(epoch.next().unwrap().unwrap(), dst, &stream)
            .unwrap();
        drop(flight);
        assert_eq!(consumer.held_batches(), 0);
    }
    pinned.context().check_err().unwrap();
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a GPU machine"]
fn a_batch_of_another_consumer_is_refused_before_any_copy() {
    let producer_a = TestProducer::start(Behaviour::serve(50, 0));
    let producer_b = TestProducer::start(Behaviour::serve(50, 0));
    let (a, b) = (connect(&producer_a, 8), connect(&producer_b, 8));
    let pinned = a.pin(0).unwrap();
    let stream = pinned.context().new_stream().unwrap();
    let dst = pinned.alloc_batch(&stream).unwrap();
    let foreign = b.shared_epoch().next().unwrap().unwrap();
    let err = pinned.copy(foreign, dst, &stream).unwrap_err();
    assert!(matches!(err, CudaError::ForeignBatch { .. }), "{err}");
    assert_eq!(b.held_batches(), 0);
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a GPU machine"]
fn the_conversion_kernel_matches_the_cpu_reference_bit_for_bit_on_random_data() {
    let ctx = cuda::context(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let converter = Converter::new(&ctx).unwrap();
    // Odd sizes: partial blocks, several images.
    for (shape, seed) in [
        ([3, 37, 53, 3], 1),
        ([1, 224, 224, 3], 2),
        ([17, 5, 300, 3], 3),
    ] {
        let n = shape.iter().product::<usize>();
        let host = random_bytes(n, seed);
        let images = stream.clone_htod(&host).unwrap();
        for normalize in [Normalize::UNIT, Normalize::IMAGENET] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let mut want = vec![0.0; n];
                convert_cpu(&host, shape, &normalize, layout, &mut want).unwrap();
                let mut out = stream.alloc_zeros::<f32>(n).unwrap();
                converter
                    .launch(&stream, &images, shape, &normalize, layout, &mut out)
                    .unwrap();
                let got = stream.clone_dtoh(&out).unwrap();
                let mismatches = got
                    .iter()
                    .zip(&want)
                    .filter(|(g, w)| g.to_bits() != w.to_bits())
                    .count();
                assert_eq!(mismatches, 0, "{shape:?} {normalize:?} {layout:?}");
            }
        }
    }
}
