//! The GPU path's typed error.

use cudarc::driver::DriverError;
use cudarc::nvrtc::CompileError;

use crate::convert::ConvertError;

/// Something on the GPU path failed. No GPU, no driver and no NVRTC are errors like any
/// other: the CPU path keeps working.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so`) cannot be loaded: no NVIDIA driver on this
    /// machine, or not on the library path. Checked before any other CUDA call (cudarc panics
    /// when the library is missing).
    #[error(
        "no CUDA driver: libcuda could not be loaded (no NVIDIA driver here, or it is not on \
         the library path); the CPU path still works"
    )]
    NoDriver,
    /// The GPU path copies and converts image feeds (`image: u8[H, W, 3], label: i64`);
    /// other feeds are read on the CPU (`batch.field`).
    #[error(
        "the CUDA path needs an image feed (image: u8[H, W, 3], label: i64); this feed's samples are `{schema}`"
    )]
    NotAnImageFeed {
        /// The feed's schema.
        schema: String,
    },
    /// The driver is there but the device asked for is not (or there is no GPU at all).
    #[error("CUDA device {ordinal} does not exist: this machine has {count} CUDA device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// The driver is older than the CUDA version this build's headers describe: an entry
    /// point could be missing (which cudarc would turn into a panic), so it is refused.
    #[error("the CUDA driver supports CUDA {}.{}, older than the {}.{} this build needs; update the NVIDIA driver", version / 1000, version % 1000 / 10, min / 1000, min % 1000 / 10)]
    DriverTooOld {
        /// `cuDriverGetVersion`'s answer (`12040` for 12.4).
        version: i32,
        /// [`MIN_DRIVER_VERSION`](crate::cuda::MIN_DRIVER_VERSION).
        min: i32,
    },
    /// NVRTC (`libnvrtc.so`), which compiles the conversion kernel at first use, cannot be
    /// loaded. Copies work without it; the on-device conversion does not.
    #[error(
        "NVRTC (libnvrtc) could not be loaded, so the conversion kernel cannot be compiled; \
         install the CUDA runtime compiler library or put it on the library path"
    )]
    NoNvrtc,
    /// A CUDA driver call failed.
    #[error("{op}: {source}")]
    Driver {
        /// What was being done (the driver entry point and its purpose).
        op: &'static str,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// NVRTC rejected the conversion kernel (a bug in this crate, or an NVRTC too old).
    #[error("compiling the conversion kernel with NVRTC failed: {source}")]
    Nvrtc {
        /// NVRTC's error, with its log.
        #[source]
        source: CompileError,
    },
    /// `cuMemHostRegister` of a ring region failed (a kernel that cannot pin this much memory
    /// (`ulimit -l`), or a driver without read-only registration).
    #[error("cuMemHostRegister of the ring's {region} ({len} bytes at {addr:#x}) failed: {source}")]
    Registration {
        /// `"images"` or `"labels"`.
        region: &'static str,
        /// Start of the mapping.
        addr: usize,
        /// Its length (both halves of the double mapping).
        len: usize,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// The batch comes from another consumer than the one this [`PinnedRing`] pinned: its
    /// memory is not registered.
    ///
    /// [`PinnedRing`]: crate::cuda::PinnedRing
    #[error(
        "the batch belongs to another consumer than the pinned one (consumer id {batch} vs {pinned})"
    )]
    ForeignBatch {
        /// The batch's consumer id.
        batch: u64,
        /// The pinned consumer's id.
        pinned: u64,
    },
    /// A device buffer is smaller than what is to be written into it.
    #[error("device buffer for {what} holds {capacity} elements, {needed} needed")]
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Elements needed.
        needed: usize,
        /// Elements it holds.
        capacity: usize,
    },
    /// The shape or normalisation given to the conversion is invalid.
    #[error(transparent)]
    Convert(#[from] ConvertError),
}

impl CudaError {
    /// A closure wrapping a [`DriverError`] with what was being done.
    pub(crate) fn driver(op: &'static str) -> impl FnOnce(DriverError) -> Self {
        move |source| Self::Driver { op, source }
    }
}
