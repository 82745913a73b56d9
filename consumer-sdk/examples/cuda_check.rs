//! GPU checks of the `cuda` feature, for a machine with a GPU (see `benches/gpu/README.md`).
//!
//! ```sh
//! cargo run -p ladle-consumer --features cuda --release --example cuda_check
//! # with a producer running, also host-to-device bandwidth from the registered ring:
//! cargo run -p ladle-consumer --features cuda --release --example cuda_check -- --socket /tmp/ladle.sock
//! ```
//!
//! 1. The conversion kernel against the CPU reference on random data (bit for bit), then its
//!    bandwidth (bytes read + written per second) against a device-to-device copy's (also
//!    read + written), both timed with CUDA events in the same run. Target: ≥ 0.70.
//! 2. With `--socket`: each batch's copy from the registered ring (`PinnedRing::copy`)
//!    against copies of the same size from `cuMemHostAlloc` memory (what `cudaMallocHost`
//!    gives) and from pageable memory, timed with events, and the copied bytes checked
//!    against the ring. Target: ring ≥ 0.90 × `cuMemHostAlloc`.
//!
//! Prints one JSON object. Exits non-zero when a correctness check fails or there is no GPU.

#![allow(clippy::unwrap_used)] // a check script: fail loudly

use std::sync::Arc;

#[path = "../tests/support/random.rs"]
mod random;
use random::random_bytes;

use ladle_consumer::cuda::cudarc::driver::sys::CUevent_flags;
use ladle_consumer::cuda::cudarc::driver::{CudaStream, DriverError};
use ladle_consumer::cuda::{self, Converter};
use ladle_consumer::{Consumer, ConsumerConfig, Layout, Normalize, convert_cpu};

const REPEATS: usize = 20;

/// Milliseconds `work` takes on `stream`, by timing events around it.
fn timed(stream: &Arc<CudaStream>, work: impl FnOnce()) -> Result<f64, DriverError> {
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    work();
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    Ok(f64::from(start.elapsed_ms(&end)?))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let socket = args
        .iter()
        .position(|a| a == "--socket")
        .and_then(|i| args.get(i + 1).cloned());
    let ctx = match cuda::context(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("cuda_check: {e}");
            std::process::exit(2);
        }
    };
    let stream = ctx.new_stream().unwrap();
    let device = ctx.name().unwrap_or_default();

    // 1. The conversion kernel: correctness, then bandwidth against a device copy.
    let converter = Converter::new(&ctx).unwrap();
    let shape = [256, 224, 224, 3];
    let n: usize = shape.iter().product();
    let host = random_bytes(n, 7);
    let images = stream.clone_htod(&host).unwrap();
    let mut out = stream.alloc_zeros::<f32>(n).unwrap();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let mut want = vec![0.0f32; n];
        convert_cpu(&host, shape, &Normalize::IMAGENET, layout, &mut want).unwrap();
        converter
            .launch(
                &stream,
                &images,
                shape,
                &Normalize::IMAGENET,
                layout,
                &mut out,
            )
            .unwrap();
        let got = stream.clone_dtoh(&out).unwrap();
        let bad = got
            .iter()
            .zip(&want)
            .filter(|(g, w)| g.to_bits() != w.to_bits())
            .count();
        if bad != 0 {
            eprintln!(
                "cuda_check: kernel ({layout:?}) differs from the CPU reference in {bad} of {n} elements"
            );
            std::process::exit(1);
        }
    }
    let mut kernel_ms = f64::MAX;
    let mut copy_ms = f64::MAX;
    let mut copy_dst = stream.alloc_zeros::<f32>(n).unwrap();
    for _ in 0..REPEATS {
        let ms = timed(&stream, || {
            converter
                .launch(
                    &stream,
                    &images,
                    shape,
                    &Normalize::IMAGENET,
                    Layout::Nchw,
                    &mut out,
                )
                .unwrap();
        })
        .unwrap();
        kernel_ms = kernel_ms.min(ms);
        let ms = timed(&stream, || stream.memcpy_dtod(&out, &mut copy_dst).unwrap()).unwrap();
        copy_ms = copy_ms.min(ms);
    }
    // Bytes moved: the kernel reads n and writes 4n; the copy reads 4n and writes 4n.
    let kernel_gbps = (5 * n) as f64 / (kernel_ms * 1e6);
    let copy_gbps = (8 * n) as f64 / (copy_ms * 1e6);

    // 2. Host-to-device from the registered ring against cuMemHostAlloc and pageable memory.
    let mut h2d = String::from("null");
    if let Some(socket) = socket {
        let config = ConsumerConfig {
            batch_size: 256,
            name: "cuda_check".into(),
            ..ConsumerConfig::default()
        };
        let consumer = Arc::new(Consumer::connect(&socket, config).unwrap());
        let pinned = consumer.pin(0).unwrap();
        let mut dst = Some(pinned.alloc_batch(&stream).unwrap());
        let (mut ring_ms, mut ring_bytes) = (0.0, 0usize);
        let mut batches = 0;
        let mut epoch = consumer.shared_epoch();
        while batches < REPEATS {
            let batch = match epoch.next() {
                Some(batch) => batch.unwrap(),
                None => {
                    epoch = consumer.shared_epoch();
                    continue;
                }
            };
            let bytes = batch.images().len();
            let expect: Vec<u8> = batch.images().to_vec();
            let mut flight = None;
            let ms = timed(&stream, || {
                flight = Some(pinned.copy(batch, dst.take().unwrap(), &stream).unwrap());
            })
            .unwrap();
            let device = flight.unwrap().wait().unwrap();
            if stream.clone_dtoh(&device.images()).unwrap() != expect {
                eprintln!("cuda_check: a batch copied from the ring differs from the ring");
                std::process::exit(1);
            }
            dst = Some(device);
            if batches > 0 {
                // the first copy warms up
                ring_ms += ms;
                ring_bytes += bytes;
            }
            batches += 1;
        }
        let bytes = ring_bytes / (REPEATS - 1);
        // SAFETY: the buffer is written below before anything reads it.
        let mut host_pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.unwrap();
        host_pinned.as_mut_slice().unwrap().fill(1);
        let pageable = vec![1u8; bytes];
        let mut dev = stream.alloc_zeros::<u8>(bytes).unwrap();
        let (mut pinned_ms, mut pageable_ms) = (0.0, 0.0);
        for _ in 0..REPEATS - 1 {
            pinned_ms += timed(&stream, || {
                stream.memcpy_htod(&host_pinned, &mut dev).unwrap()
            })
            .unwrap();
            pageable_ms +=
                timed(&stream, || stream.memcpy_htod(&pageable, &mut dev).unwrap()).unwrap();
        }
        let gbps = |ms: f64| ring_bytes as f64 / (ms * 1e6);
        let (ring, pinned, pageable) = (gbps(ring_ms), gbps(pinned_ms), gbps(pageable_ms));
        h2d = format!(
            "{{\"batch_bytes\": {bytes}, \"ring_gbps\": {ring:.2}, \"malloc_host_gbps\": {pinned:.2}, \
             \"pageable_gbps\": {pageable:.2}, \"ring_over_malloc_host\": {:.3}, \"target\": 0.90}}",
            ring / pinned
        );
    }
    println!(
        "{{\"device\": {device:?}, \"kernel\": {{\"shape\": {shape:?}, \"matches_cpu_reference\": true, \
         \"kernel_gbps\": {kernel_gbps:.2}, \"dtod_copy_gbps\": {copy_gbps:.2}, \
         \"kernel_over_copy\": {:.3}, \"target\": 0.70}}, \"h2d\": {h2d}}}",
        kernel_gbps / copy_gbps
    );
    ctx.check_err().unwrap();
}
