//! Jobs: what a user submits and the states a job goes through (the protocol's types,
//! re-exported), and how a finished job's exit is read (success, failure, or out of memory).

use serde::{Deserialize, Serialize};

pub use ladle_scheduler_protocol::job::{JobId, JobSpec, JobState};

/// Text in a job's stderr that marks a GPU out-of-memory failure, whatever the line around it
/// (the lines with a framework's wording that needs context are in [`out_of_memory_evidence`]).
/// Each is verbatim from the framework or library that prints it:
/// - `CUDA out of memory`: PyTorch's caching allocator (`torch.OutOfMemoryError: CUDA out of
///   memory. Tried to allocate 2.00 GiB …`);
/// - `CUDA error: out of memory`: PyTorch's check of a CUDA runtime call outside its allocator
///   (`RuntimeError: CUDA error: out of memory`);
/// - `torch.OutOfMemoryError`, `torch.cuda.OutOfMemoryError`: PyTorch's exception (2.5+ and
///   older names). The bare `OutOfMemoryError` is not a marker: Java's
///   `java.lang.OutOfMemoryError` is a host heap;
/// - `CUDA_ERROR_OUT_OF_MEMORY`: the CUDA driver API's status, as TensorFlow, XLA and JAX log
///   it (`failed to alloc … bytes unified memory; result: CUDA_ERROR_OUT_OF_MEMORY: out of
///   memory`);
/// - `cudaErrorMemoryAllocation`: the CUDA runtime API's status name;
/// - `CUBLAS_STATUS_ALLOC_FAILED`, `CUDNN_STATUS_ALLOC_FAILED`, `CUSOLVER_STATUS_ALLOC_FAILED`,
///   `CUSPARSE_STATUS_ALLOC_FAILED`, `CUFFT_ALLOC_FAILED`: the CUDA libraries' allocation
///   failures (PyTorch: ``CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling
///   `cublasCreate(handle)` ``, `cuDNN error: CUDNN_STATUS_ALLOC_FAILED`).
///
/// A line that names host memory ([`HOST_MEMORY_MARKERS`]) never counts.
pub const OOM_MARKERS: [&str; 11] = [
    "CUDA out of memory",
    "CUDA error: out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
];

/// Text that puts a line's out-of-memory report in host memory, not the GPU's: TensorFlow's
/// CPU device and allocator (`… on /job:localhost/replica:0/task:0/device:CPU:0 by allocator
/// cpu`), pinned host buffers (`failed to alloc 4294967296 bytes on host:
/// CUDA_ERROR_OUT_OF_MEMORY`, `could not allocate pinned host memory`), PyTorch's CPU
/// allocator (`DefaultCPUAllocator: not enough memory`) and NumPy's `MemoryError: Unable to
/// allocate` / `_ArrayMemoryError`.
pub const HOST_MEMORY_MARKERS: [&str; 7] = [
    "device:CPU",
    "allocator cpu",
    "bytes on host",
    "pinned host memory",
    "DefaultCPUAllocator",
    "MemoryError: Unable to allocate",
    "_ArrayMemoryError",
];

/// Which software reported a GPU out-of-memory failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OomSource {
    /// PyTorch (`CUDA out of memory`, `torch.OutOfMemoryError`, `CUDA error: out of memory`).
    PyTorch,
    /// TensorFlow (`ResourceExhaustedError`, `OOM when allocating tensor`).
    TensorFlow,
    /// XLA, as JAX reports it (`XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while
    /// trying to allocate …`).
    Xla,
    /// The CUDA driver or runtime API (`CUDA_ERROR_OUT_OF_MEMORY`,
    /// `cudaErrorMemoryAllocation`).
    Cuda,
    /// A CUDA library: cuBLAS, cuDNN, cuSOLVER, cuSPARSE, cuFFT (`…_ALLOC_FAILED`).
    CudaLibrary,
}

/// Why a job's exit was read as a GPU out-of-memory failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomEvidence {
    /// Who reported it.
    pub source: OomSource,
    /// The stderr line that says so (trimmed).
    pub line: String,
}

/// The first stderr line that reports a GPU out-of-memory failure, and who wrote it; `None`
/// when no line does. Lines naming host memory ([`HOST_MEMORY_MARKERS`]) are skipped. Besides
/// [`OOM_MARKERS`] it reads, on one line:
/// - TensorFlow: `OOM when allocating tensor`, or `ResourceExhaustedError` / `Resource
///   exhausted` with `OOM` or `memory` (`tensorflow.python.framework.errors_impl.
///   ResourceExhaustedError: OOM when allocating tensor with shape[…] and type float on
///   /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc`);
/// - XLA/JAX: `RESOURCE_EXHAUSTED` with `memory` (`jaxlib.xla_extension.XlaRuntimeError:
///   RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7406166528 bytes.`).
///
/// `RESOURCE_EXHAUSTED` alone is gRPC's status for quotas and oversized messages
/// (`StatusCode.RESOURCE_EXHAUSTED`, `Received message larger than max`), so it needs the word
/// `memory` on its line. False-positive risk that remains: a job that logs one of these lines
/// (a warning it survived, a retried allocation, a gRPC service's own "memory quota" message)
/// and then fails for another reason is read as out of memory and re-queued with a larger
/// estimate once more; a JAX job on the CPU backend that runs out of host memory prints the
/// same `RESOURCE_EXHAUSTED: Out of memory` as on a GPU.
pub fn out_of_memory_evidence(stderr: &str) -> Option<OomEvidence> {
    stderr.lines().find_map(|line| {
        if HOST_MEMORY_MARKERS.iter().any(|m| line.contains(m)) {
            return None;
        }
        let source = oom_source(line)?;
        Some(OomEvidence {
            source,
            line: line.trim().to_owned(),
        })
    })
}

/// Who reports a GPU out-of-memory failure on `line` (already known not to name host memory).
fn oom_source(line: &str) -> Option<OomSource> {
    let has = |m: &str| line.contains(m);
    let lower = line.to_ascii_lowercase();
    if has("CUDA out of memory")
        || has("CUDA error: out of memory")
        || has("torch.OutOfMemoryError")
        || has("torch.cuda.OutOfMemoryError")
    {
        Some(OomSource::PyTorch)
    } else if [
        "CUBLAS_STATUS_ALLOC_FAILED",
        "CUDNN_STATUS_ALLOC_FAILED",
        "CUSOLVER_STATUS_ALLOC_FAILED",
        "CUSPARSE_STATUS_ALLOC_FAILED",
        "CUFFT_ALLOC_FAILED",
    ]
    .iter()
    .any(|m| has(m))
    {
        Some(OomSource::CudaLibrary)
    } else if has("OOM when allocating tensor")
        || ((has("ResourceExhaustedError") || has("Resource exhausted"))
            && (has("OOM") || lower.contains("memory")))
    {
        Some(OomSource::TensorFlow)
    } else if has("RESOURCE_EXHAUSTED") && lower.contains("memory") {
        Some(OomSource::Xla)
    } else if has("CUDA_ERROR_OUT_OF_MEMORY") || has("cudaErrorMemoryAllocation") {
        Some(OomSource::Cuda)
    } else {
        None
    }
}

/// Whether a job that exited with `code` and wrote `stderr` ran out of GPU memory: a
/// non-zero exit (or a signal) and a line of [`out_of_memory_evidence`] in its stderr.
pub fn is_out_of_memory(code: Option<i32>, stderr: &str) -> bool {
    code != Some(0) && out_of_memory_evidence(stderr).is_some()
}

/// The estimate learned from an observed peak: 1.1 × the peak.
pub fn learned_estimate(peak_mib: u64) -> u64 {
    peak_mib.saturating_mul(11).div_ceil(10).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_needs_both_a_failure_and_the_text() {
        let torch = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert!(is_out_of_memory(Some(1), torch));
        assert!(is_out_of_memory(None, "CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(!is_out_of_memory(Some(0), torch));
        assert!(!is_out_of_memory(Some(1), "Segmentation fault"));
    }

    fn source_of(stderr: &str) -> Option<OomSource> {
        out_of_memory_evidence(stderr).map(|e| e.source)
    }

    #[test]
    fn pytorch_caching_allocator_out_of_memory_is_read() {
        let stderr = "Traceback (most recent call last):\n  File \"train.py\", line 12, in <module>\n\
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.10 GiB of which 1.06 GiB is free.";
        assert_eq!(source_of(stderr), Some(OomSource::PyTorch));
        let evidence = out_of_memory_evidence(stderr).unwrap();
        assert!(
            evidence.line.starts_with("torch.OutOfMemoryError"),
            "{}",
            evidence.line
        );
        assert_eq!(
            source_of(
                "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call"
            ),
            Some(OomSource::PyTorch)
        );
    }

    #[test]
    fn tensorflow_resource_exhausted_on_a_gpu_is_read() {
        let stderr = "2018-06-08 17:26:00.908130: W tensorflow/core/framework/op_kernel.cc:1202] \
OP_REQUIRES failed at tile_ops.cc:123 : Resource exhausted: OOM when allocating tensor with \
shape[16,1,892800,8,4,2,2] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by \
allocator GPU_0_bfc\n\
tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor \
with shape[1,5095,3729,3]";
        assert_eq!(source_of(stderr), Some(OomSource::TensorFlow));
        assert!(is_out_of_memory(Some(1), stderr));
        assert_eq!(
            source_of("ResourceExhaustedError: failed to allocate memory [Op:AddV2]"),
            Some(OomSource::TensorFlow)
        );
    }

    #[test]
    fn jax_xla_resource_exhausted_out_of_memory_is_read() {
        let stderr = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory \
while trying to allocate 7406166528 bytes.";
        assert_eq!(source_of(stderr), Some(OomSource::Xla));
        assert_eq!(
            source_of(
                "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 20029400304 bytes."
            ),
            Some(OomSource::Xla)
        );
    }

    #[test]
    fn cuda_driver_and_runtime_statuses_are_read() {
        let xla_log = "2021-10-15 15:01:44.577626: E external/org_tensorflow/tensorflow/\
stream_executor/cuda/cuda_driver.cc:764] failed to alloc 2740606464 bytes unified memory; \
result: CUDA_ERROR_OUT_OF_MEMORY: out of memory";
        assert_eq!(source_of(xla_log), Some(OomSource::Cuda));
        assert_eq!(
            source_of("cudaMalloc failed: cudaErrorMemoryAllocation"),
            Some(OomSource::Cuda)
        );
    }

    #[test]
    fn cublas_and_cudnn_allocation_failures_are_read() {
        let cublas = "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling \
`cublasCreate(handle)`";
        assert_eq!(source_of(cublas), Some(OomSource::CudaLibrary));
        let cudnn = "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED";
        assert_eq!(source_of(cudnn), Some(OomSource::CudaLibrary));
    }

    #[test]
    fn host_memory_errors_are_not_gpu_out_of_memory() {
        for stderr in [
            "MemoryError",
            "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 184. MiB for an array",
            "Resource exhausted: MemoryError: Unable to allocate 184. MiB for an array with \
shape (64, 26, 26, 3, 371) and data type float32",
            "OP_REQUIRES failed at cast_op.cc:109 : Resource exhausted: OOM when allocating \
tensor with shape[1,559,512,3] and type float on /job:localhost/replica:0/task:0/device:CPU:0 \
by allocator cpu",
            "E tensorflow/stream_executor/cuda/cuda_driver.cc:890] failed to alloc 8589934592 \
bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            "RuntimeError: DefaultCPUAllocator: not enough memory: you tried to allocate \
37984010240 bytes",
            "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
        ] {
            assert_eq!(out_of_memory_evidence(stderr), None, "{stderr}");
            assert!(!is_out_of_memory(Some(1), stderr), "{stderr}");
        }
    }

    #[test]
    fn grpc_resource_exhausted_without_memory_is_not_out_of_memory() {
        let grpc = "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated \
with:\n\tstatus = StatusCode.RESOURCE_EXHAUSTED\n\tdetails = \"Received message larger than max \
(17777780 vs. 4194304)\"";
        assert!(!is_out_of_memory(Some(1), grpc));
        assert!(!is_out_of_memory(
            Some(1),
            "Error: 8 RESOURCE_EXHAUSTED: Received message larger than max (2065853043 vs 67108864)"
        ));
    }
}
