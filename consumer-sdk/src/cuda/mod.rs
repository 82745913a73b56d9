//! The GPU path (feature `cuda`): the ring pinned per consumer, asynchronous copies of
//! batches to the device, and the fused u8 → normalised f32 conversion kernel.
//!
//! In `docs/ARCHITECTURE.md`'s picture this is the last hop of each consumer arrow: from the
//! read-only ring mapping to the consumer's GPU. Layers, bottom up: [`driver`](self) (run-time
//! presence checks, the context, `cuMemHostRegister` and `cuMemcpyHtoDAsync`, every raw driver
//! call), then [`PinnedRing`], [`DeviceBatch`], [`InFlight`] and [`Converter`] on cudarc's safe
//! layer.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ladle_consumer::cuda::{CudaError, PinnedRing};
//! use ladle_consumer::{Consumer, ConsumerConfig, Layout, Normalize};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = Arc::new(Consumer::connect("/tmp/ladle.sock", ConsumerConfig::default())?);
//! let pinned = match consumer.pin(0) {
//!     Ok(pinned) => pinned,
//!     Err(CudaError::NoDriver | CudaError::NoDevice { .. }) => return Ok(()), // CPU path
//!     Err(e) => return Err(e.into()),
//! };
//! let stream = pinned.context().new_stream()?;
//! let mut spare = Some(pinned.alloc_batch(&stream)?);
//! let [b, h, w, c] = [consumer.config().batch_size as usize, 224, 224, 3];
//! let mut input = stream.alloc_zeros::<f32>(b * h * w * c)?;
//! for batch in consumer.shared_epoch() {
//!     let dst = spare.take().map_or_else(|| pinned.alloc_batch(&stream), Ok)?;
//!     let flight = pinned.copy(batch?, dst, &stream)?; // returns at once
//!     pinned.convert(flight.device(), &stream, &Normalize::IMAGENET, Layout::Nchw, &mut input)?;
//!     // ... enqueue the training step on `stream` ...
//!     spare = Some(flight.wait()?); // or keep it and poll `is_done` to overlap more
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## Run-time loading and failure
//! CUDA is loaded at run time (cudarc `dynamic-loading`): the crate builds and links without
//! a toolkit or driver. [`context`] checks that `libcuda` loads before any other CUDA call
//! (cudarc panics on a missing library) and that the driver is at least CUDA 12.0 (the headers
//! of this build; an older driver could miss an entry point): no driver, an old driver, no
//! device are [`CudaError`] values, and the CPU path keeps working. NVRTC is needed only for
//! the conversion kernel, compiled from [`KERNEL_SOURCE`] at first use (once per process, then
//! loaded once per context); without it copies still work and conversion is
//! [`CudaError::NoNvrtc`].
//!
//! ## Pinning and release rules
//! [`Consumer::pin`] (or [`PinnedRing::new`]) registers the consumer's images and labels
//! mappings, each region's two halves of the double mapping in one call, with
//! `cuMemHostRegister(READ_ONLY | PORTABLE)`; the labels region is registered rather than
//! staged because it is small and then every copy is one DMA from pinned memory with nothing
//! on the CPU. [`PinnedRing::copy`] enqueues `cuMemcpyHtoDAsync` of a batch's images and
//! labels, which are each one contiguous range even across the ring's wrap, records an event,
//! and returns an [`InFlight`] that owns the host batch: its slots are released only once the
//! event has completed ([`InFlight::is_done`], [`InFlight::wait`], or a drop that waits).
//! Unregistration happens when the last [`PinnedRing`] clone and the last [`InFlight`] are
//! gone, before the consumer's mapping is unmapped.
//!
//! ## What has run where
//! Everything here is built and its no-GPU paths tested in CI (no driver: [`CudaError::NoDriver`],
//! no NVRTC: [`CudaError::NoNvrtc`], host-side launch checks, the CPU reference). On a GPU
//! (an H100, driver 580, CUDA 13.0; `benches/gpu/run_all.sh`, figures in `benches/README.md`)
//! the `#[ignore]`d tests of `consumer-sdk/tests/cuda.rs` pass, the kernel equals the CPU
//! reference bit for bit and runs at 0.94 of a device-to-device copy's bandwidth, and copies
//! from the registered read-only double mapping run at 0.945 of `cuMemHostAlloc` memory's.
//! CI cannot run them (no GPU): they run again only where `run_all.sh` is run.
//!
//! ## Python
//! The `ladle` package's `Batch.to_torch(device="cuda:…")` follows the same rules with torch's
//! calls (`cudaHostRegister` read-only and portable, an asynchronous copy on torch's current
//! stream, the batch held until an event completes) and converts with one `torch.addcmul`
//! pass, the same memory traffic as this module's kernel; it does not use this module, so
//! that `pip install` needs no CUDA. Measured on the H100, the conversion is under 1% of a
//! ResNet-18 step at batch 256, so the kernel would buy nothing there.
//!
//! ## Shared device batches through CUDA IPC (design, not built)
//! TensorSocket's main mode: one process copies each batch to the GPU once and the consumers
//! on that GPU map it with `cuIpcOpenMemHandle` instead of each copying it. The plan:
//! - *Who copies*: the producer, when started with a device, using this module's
//!   [`PinnedRing`] path on its own (writable) mapping: a device ring of `K` batch-sized
//!   buffers per (GPU, batch size) in one `cuMemAlloc` allocation (IPC handles cover whole
//!   allocations), exported once with `cuIpcGetMemHandle`.
//! - *Handle exchange*: the 64-byte `CUipcMemHandle` and an IPC event handle
//!   (`cuIpcGetEventHandle`, events created `INTERPROCESS | DISABLE_TIMING`) travel in the
//!   `Welcome` over the control socket (new protocol version), with the device's UUID so a
//!   consumer on another GPU falls back to its own copies.
//! - *Release rules*: as on the host ring, a device slot is rewritten only when every
//!   consumer's cursor has passed it; a consumer releases a device batch only after its own
//!   work reading it completed (an event it records and synchronizes before advancing its
//!   cursor), and the producer waits on the copy event it records before publishing the
//!   device head, so consumers never read a half-copied slot.
//! - *Costs*: consumers must share a batch size with the producer's device ring (or the
//!   producer keeps one ring per batch size), and every consumer's model input stays in a
//!   foreign allocation.
//! - *Measured, and why it is not built*: on the H100 a 256-image batch copies from the
//!   registered ring in 0.74 ms (50.9 GB/s). Four collocated ResNet-18 runs of one feed
//!   trained 10957 images/s in all, so their per-consumer copies move 1.6 GB/s, 3% of the
//!   link, on copy engines that overlap compute; a shared device copy would save 2.4% of the
//!   link and no step time. For image training the per-consumer copy wins on simplicity;
//!   this design waits for a feed whose samples are large next to its step time.

mod driver;
mod error;
mod kernel;
mod pinned;

use std::sync::Arc;

pub use driver::{MIN_DRIVER_VERSION, context, driver_present, driver_version, nvrtc_present};
pub use error::CudaError;
pub use kernel::{Converter, KERNEL_NAME, KERNEL_SOURCE, compile_kernel};
pub use pinned::{DeviceBatch, InFlight, PinnedRing};

/// cudarc, re-exported: streams, contexts and device memory come from its safe layer.
pub use cudarc;

use crate::Consumer;

impl Consumer {
    /// Pins this consumer's ring mapping for copies to device `ordinal` (its primary
    /// context): [`context`] then [`PinnedRing::new`]. [`CudaError::NoDriver`] or
    /// [`CudaError::NoDevice`] without a GPU, and the consumer keeps working on the CPU.
    pub fn pin(self: &Arc<Self>, ordinal: usize) -> Result<PinnedRing, CudaError> {
        let ctx = context(ordinal)?;
        PinnedRing::new(self, &ctx)
    }
}
