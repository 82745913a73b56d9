//! The bottom layer: run-time presence checks, the context, and the raw driver calls cudarc's
//! safe layer does not wrap (`cuMemHostRegister`/`cuMemHostUnregister`, `cuMemcpyHtoDAsync`
//! from a raw address). Every `unsafe` block of the GPU path that touches the driver is here.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use super::CudaError;

/// The oldest driver API version this build accepts: the CUDA headers cudarc was built
/// against (`cuda-12000`). An older driver could lack an entry point, and cudarc panics on a
/// missing symbol; refusing it up front keeps that an error value.
pub const MIN_DRIVER_VERSION: i32 = 12000;

/// Whether `libcuda` can be loaded (checked once per process). Every path into cudarc's
/// driver API checks this first: cudarc panics when the library is missing.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to `dlopen` the candidate library names; loading
    // the NVIDIA driver library runs no initialisers that could break this process's state.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Whether `libnvrtc` can be loaded (checked once per process): needed only to compile the
/// conversion kernel.
pub fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as in `driver_present`, a `dlopen` of NVRTC's candidate names.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// The driver's API version (`12040` for CUDA 12.4), after checking that the driver is there.
pub fn driver_version() -> Result<i32, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    let mut version = 0;
    // SAFETY: the library is present (checked above); `cuDriverGetVersion` writes one int
    // through a valid pointer and needs no `cuInit`.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(CudaError::driver("cuDriverGetVersion"))?;
    Ok(version)
}

/// The primary context of device `ordinal`, bound to this thread: the entry point of the GPU
/// path. Checks, in order and before any other CUDA call, that the driver loads
/// ([`CudaError::NoDriver`]), that it is recent enough, and that the device exists
/// ([`CudaError::NoDevice`]).
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    let version = driver_version()?;
    if version < MIN_DRIVER_VERSION {
        return Err(CudaError::DriverTooOld {
            version,
            min: MIN_DRIVER_VERSION,
        });
    }
    let count = match CudaContext::device_count() {
        Ok(count) => usize::try_from(count).unwrap_or(0),
        // cuInit says so when the driver is installed but no GPU is visible
        // (CUDA_VISIBLE_DEVICES="", no device node, ...).
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => 0,
        Err(source) => {
            return Err(CudaError::Driver {
                op: "cuInit / cuDeviceGetCount",
                source,
            });
        }
    };
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count });
    }
    CudaContext::new(ordinal).map_err(CudaError::driver("retaining the device's primary context"))
}

/// A host range registered with `cuMemHostRegister` (page-locked and mapped for the device),
/// read-only and portable (pinned for every context of the process). Unregistered on drop;
/// a failure there is logged and recorded in the context (see
/// [`CudaContext::check_err`]), never a panic.
#[derive(Debug)]
pub(crate) struct HostRegistration {
    ctx: Arc<CudaContext>,
    region: &'static str,
    addr: usize,
    len: usize,
    /// False when the range was already registered by someone else in this process (say,
    /// PyTorch's `cudaHostRegister`): then it is theirs to unregister.
    owned: bool,
}

impl HostRegistration {
    /// Registers `addr..addr + len`, named `region` in errors.
    ///
    /// # Safety
    /// The range must be one mapping of this process that stays mapped (and is not remapped)
    /// until the returned value is dropped.
    pub(crate) unsafe fn new(
        ctx: &Arc<CudaContext>,
        region: &'static str,
        addr: *const u8,
        len: usize,
    ) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(CudaError::driver(
            "cuCtxSetCurrent before cuMemHostRegister",
        ))?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: the range is a live mapping of this process for as long as the registration
        // (the caller's contract); read-only registration never makes the device write to it.
        let result = unsafe { sys::cuMemHostRegister_v2(addr as *mut c_void, len, flags) };
        let owned = match result.result() {
            Ok(()) => true,
            Err(DriverError(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)) => {
                tracing::debug!(
                    region,
                    len,
                    "the ring's {region} mapping is already registered in this process; using \
                     that registration"
                );
                false
            }
            Err(source) => {
                return Err(CudaError::Registration {
                    region,
                    addr: addr as usize,
                    len,
                    source,
                });
            }
        };
        Ok(Self {
            ctx: Arc::clone(ctx),
            region,
            addr: addr as usize,
            len,
            owned,
        })
    }

    /// Whether `start..start + len` lies inside the registered range.
    pub(crate) fn contains(&self, start: *const u8, len: usize) -> bool {
        let start = start as usize;
        start >= self.addr
            && start
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let result = self.ctx.bind_to_thread().and_then(|()| {
            // SAFETY: `addr` was registered by `new` and not unregistered since; every copy
            // reading it has completed (in-flight copies hold this registration alive).
            unsafe { sys::cuMemHostUnregister(self.addr as *mut c_void) }.result()
        });
        if let Err(e) = result {
            tracing::warn!(
                region = self.region,
                len = self.len,
                "cuMemHostUnregister of the ring's {} mapping failed: {e}",
                self.region
            );
            self.ctx.record_err(Err::<(), _>(e));
        }
    }
}

/// Enqueues a copy of `src` (host) to `dst` (device) on `stream`; returns before it runs.
///
/// # Safety
/// `dst` must point to at least `size_of_val(src)` bytes of device memory valid until the copy
/// completes, and the memory behind `src` must stay valid and unwritten until the copy
/// completes (an event recorded on `stream` after this call says when), although the borrow
/// ends when this returns.
pub(crate) unsafe fn memcpy_htod_async<T>(
    dst: sys::CUdeviceptr,
    src: &[T],
    stream: &CudaStream,
) -> Result<(), DriverError> {
    stream.context().bind_to_thread()?;
    // SAFETY: the caller's contract above; `stream` is a live stream of the bound context.
    unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, stream.cu_stream()) }
}
