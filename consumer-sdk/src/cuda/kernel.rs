//! The fused conversion kernel: u8 `[B, H, W, 3]` to normalised f32 `[B, 3, H, W]` or
//! `[B, H, W, 3]`, compiled with NVRTC at first use.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::{CudaError, driver};
use crate::convert::{self, Layout, Normalize};

/// The kernel's entry point in [`KERNEL_SOURCE`].
pub const KERNEL_NAME: &str = "ladle_hwc_u8_to_f32";

/// CUDA C source of the conversion: one thread per pixel (3 bytes in, 3 floats out), each
/// channel one `fmaf(x, scale[c], shift[c])`, the same single rounding as
/// [`convert_cpu`](crate::convert_cpu). The x dimension of the grid strides over the pixels of
/// an image, y over the images, so no thread divides; per warp the loads are 96 contiguous
/// bytes and, in NCHW, each of the three stores 128 contiguous bytes.
pub const KERNEL_SOURCE: &str = r#"
extern "C" __global__ void ladle_hwc_u8_to_f32(
    const unsigned char* __restrict__ src,
    float* __restrict__ dst,
    unsigned long long images,
    unsigned long long plane,
    int channels_last,
    float s0, float s1, float s2,
    float t0, float t1, float t2)
{
    for (unsigned long long n = blockIdx.y; n < images; n += gridDim.y) {
        const unsigned char* in = src + n * plane * 3ull;
        float* out = dst + n * plane * 3ull;
        for (unsigned long long p = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
             p < plane;
             p += (unsigned long long)blockDim.x * gridDim.x) {
            const unsigned char* px = in + 3ull * p;
            float r = fmaf((float)px[0], s0, t0);
            float g = fmaf((float)px[1], s1, t1);
            float b = fmaf((float)px[2], s2, t2);
            if (channels_last) {
                out[3ull * p] = r;
                out[3ull * p + 1ull] = g;
                out[3ull * p + 2ull] = b;
            } else {
                out[p] = r;
                out[plane + p] = g;
                out[2ull * plane + p] = b;
            }
        }
    }
}
"#;

/// Threads per block.
const BLOCK: u32 = 256;
/// Most blocks along x (pixels of one image; the loop strides beyond).
const MAX_GRID_X: u64 = 4096;
/// Most blocks along y (images; the loop strides beyond). CUDA's limit is 65535.
const MAX_GRID_Y: u64 = 65535;

/// The kernel compiled to PTX with NVRTC, once per process (PTX is device-independent; each
/// context loads it itself).
pub fn compile_kernel() -> Result<Ptx, CudaError> {
    static PTX: Mutex<Option<Ptx>> = Mutex::new(None);
    let mut cached = PTX.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(ptx) = cached.as_ref() {
        return Ok(ptx.clone());
    }
    if !driver::nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let ptx =
        cudarc::nvrtc::compile_ptx(KERNEL_SOURCE).map_err(|source| CudaError::Nvrtc { source })?;
    *cached = Some(ptx.clone());
    Ok(ptx)
}

/// The conversion kernel loaded into one context: make one per context (a
/// [`PinnedRing`](super::PinnedRing) keeps one) and launch it on any stream of that context.
#[derive(Debug, Clone)]
pub struct Converter {
    ctx: Arc<CudaContext>,
    function: CudaFunction,
}

impl Converter {
    /// Compiles the kernel (at the first call in the process) and loads it into `ctx`.
    /// [`CudaError::NoNvrtc`] without NVRTC.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        let ptx = compile_kernel()?;
        let module = ctx.load_module(ptx).map_err(CudaError::driver(
            "cuModuleLoadData of the conversion kernel",
        ))?;
        let function = module
            .load_function(KERNEL_NAME)
            .map_err(CudaError::driver(
                "cuModuleGetFunction of the conversion kernel",
            ))?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            function,
        })
    }

    /// The context the kernel is loaded in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Enqueues the conversion of `images` (u8 `[B, H, W, 3]`, `shape`) into `out` (f32, at
    /// least `B·H·W·3` elements, in `layout` order) on `stream`, normalised per channel by
    /// `normalize`. Returns before the kernel runs; work later on `stream` sees its result.
    ///
    /// Fails without launching when the lengths do not match the shape
    /// ([`CudaError::Convert`], [`CudaError::BufferTooSmall`]) or the normalisation is
    /// invalid.
    pub fn launch<Src, Dst>(
        &self,
        stream: &CudaStream,
        images: &Src,
        shape: [usize; 4],
        normalize: &Normalize,
        layout: Layout,
        out: &mut Dst,
    ) -> Result<(), CudaError>
    where
        Src: DevicePtr<u8>,
        Dst: DevicePtrMut<f32>,
    {
        let launch = plan(images.len(), out.len(), shape, normalize, layout)?;
        let Some(launch) = launch else {
            return Ok(()); // nothing to convert
        };
        let (src, _src_guard) = images.device_ptr(stream);
        let (dst, _dst_guard) = out.device_ptr_mut(stream);
        let mut builder = stream.launch_builder(&self.function);
        builder
            .arg(&src)
            .arg(&dst)
            .arg(&launch.images)
            .arg(&launch.plane)
            .arg(&launch.channels_last)
            .arg(&launch.scale[0])
            .arg(&launch.scale[1])
            .arg(&launch.scale[2])
            .arg(&launch.shift[0])
            .arg(&launch.shift[1])
            .arg(&launch.shift[2]);
        // SAFETY: the arguments match the kernel's signature one for one (two device
        // pointers, two u64, one i32, six f32); `src` holds `B·H·W·3` bytes and `dst` at least
        // as many f32 (checked by `plan`), and the guards order the launch after earlier work
        // on both buffers and keep them alive until it is enqueued.
        unsafe { builder.launch(launch.config) }
            .map_err(CudaError::driver("cuLaunchKernel of the conversion kernel"))?;
        Ok(())
    }
}

/// What one launch needs, checked on the host.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch {
    pub(crate) config: LaunchConfig,
    pub(crate) images: u64,
    pub(crate) plane: u64,
    pub(crate) channels_last: i32,
    pub(crate) scale: [f32; 3],
    pub(crate) shift: [f32; 3],
}

/// Validates a conversion of `shape` from `src_len` bytes into `dst_len` floats and computes
/// the launch; `None` when there is nothing to convert.
pub(crate) fn plan(
    src_len: usize,
    dst_len: usize,
    shape: [usize; 4],
    normalize: &Normalize,
    layout: Layout,
) -> Result<Option<Launch>, CudaError> {
    let elements = convert::elements(shape)?;
    if src_len != elements {
        return Err(convert::ConvertError::InputLength {
            shape,
            expected: elements,
            actual: src_len,
        }
        .into());
    }
    if dst_len < elements {
        return Err(CudaError::BufferTooSmall {
            what: "converted images (f32)",
            needed: elements,
            capacity: dst_len,
        });
    }
    let (scale, shift) = normalize.scale_shift()?;
    if elements == 0 {
        return Ok(None);
    }
    let images = shape[0] as u64;
    let plane = (shape[1] * shape[2]) as u64;
    let grid_x = plane.div_ceil(u64::from(BLOCK)).min(MAX_GRID_X) as u32;
    let grid_y = images.min(MAX_GRID_Y) as u32;
    Ok(Some(Launch {
        config: LaunchConfig {
            grid_dim: (grid_x, grid_y, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        },
        images,
        plane,
        channels_last: i32::from(layout == Layout::Nhwc),
        scale,
        shift,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_source_declares_the_entry_point_that_is_loaded() {
        let declaration = format!("extern \"C\" __global__ void {KERNEL_NAME}(");
        assert!(KERNEL_SOURCE.contains(&declaration));
        // Eleven parameters, as `Converter::launch` pushes them.
        let start = KERNEL_SOURCE.find(&declaration).unwrap() + declaration.len();
        let params = &KERNEL_SOURCE[start..start + KERNEL_SOURCE[start..].find(')').unwrap()];
        assert_eq!(params.split(',').count(), 11, "{params}");
        assert_eq!(
            KERNEL_SOURCE.matches('{').count(),
            KERNEL_SOURCE.matches('}').count()
        );
    }

    #[test]
    fn a_launch_covers_every_pixel_and_image_within_cuda_grid_limits() {
        let launch = plan(
            224 * 224 * 3 * 256,
            224 * 224 * 3 * 256,
            [256, 224, 224, 3],
            &Normalize::IMAGENET,
            Layout::Nchw,
        )
        .unwrap()
        .unwrap();
        let (gx, gy, gz) = launch.config.grid_dim;
        assert_eq!((gy, gz), (256, 1));
        assert_eq!(
            u64::from(gx) * u64::from(BLOCK),
            (224 * 224_u64).div_ceil(256) * 256
        );
        assert_eq!(
            (launch.images, launch.plane, launch.channels_last),
            (256, 224 * 224, 0)
        );
        assert_eq!(
            (launch.scale, launch.shift),
            Normalize::IMAGENET.scale_shift().unwrap()
        );
        // huge batches and images stay inside the grid limits; the loops stride beyond
        let big = plan(
            70_000 * 4096 * 4096 * 3,
            usize::MAX,
            [70_000, 4096, 4096, 3],
            &Normalize::UNIT,
            Layout::Nhwc,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            big.config.grid_dim,
            (MAX_GRID_X as u32, MAX_GRID_Y as u32, 1)
        );
        assert_eq!(big.channels_last, 1);
    }

    #[test]
    fn a_launch_with_wrong_lengths_is_refused_on_the_host() {
        assert!(matches!(
            plan(11, 12, [1, 2, 2, 3], &Normalize::UNIT, Layout::Nchw),
            Err(CudaError::Convert(convert::ConvertError::InputLength {
                expected: 12,
                actual: 11,
                ..
            }))
        ));
        assert!(matches!(
            plan(12, 11, [1, 2, 2, 3], &Normalize::UNIT, Layout::Nchw),
            Err(CudaError::BufferTooSmall {
                needed: 12,
                capacity: 11,
                ..
            })
        ));
        assert!(
            plan(0, 0, [0, 2, 2, 3], &Normalize::UNIT, Layout::Nchw)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn without_nvrtc_compiling_the_kernel_is_the_no_nvrtc_error() {
        if driver::nvrtc_present() {
            eprintln!("skipped: NVRTC is present on this machine");
            return;
        }
        assert!(matches!(compile_kernel(), Err(CudaError::NoNvrtc)));
    }
}
