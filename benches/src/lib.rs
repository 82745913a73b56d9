//! # ladle-benches: benchmarks
//!
//! In `docs/ARCHITECTURE.md`'s picture this package measures the producer's per-core ceiling:
//! decode and augment per image (`benches/decode_augment.rs`) and the multi-threaded pipeline
//! (`benches/pipeline.rs`). Method and results: `benches/README.md`.
//!
//! This library holds what the benchmarks share: generating the embedded synthetic dataset
//! once into a temporary directory, and an allocation counter.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ladle_datasets::synth::{SynthConfig, generate};

/// Generates the benchmarks' dataset: `count` images of the default 500×375 recipe in
/// `format` under `dir`. Panics on failure (benchmarks have no one to report to).
pub fn dataset(
    dir: &Path,
    format: ladle_datasets::Format,
    count: u64,
) -> Box<dyn ladle_datasets::Dataset> {
    let config = SynthConfig {
        format,
        count,
        seed: 1,
        ..SynthConfig::default()
    };
    generate(&config, dir, &|_| {}).expect("generate the benchmark dataset");
    ladle_datasets::open(dir).expect("open the benchmark dataset")
}

/// A global allocator that counts allocations, to show what a hot path allocates.
#[derive(Debug)]
pub struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

impl CountingAlloc {
    /// Allocations made so far by the whole process.
    pub fn count() -> u64 {
        ALLOCATIONS.load(Ordering::Relaxed)
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; counting
// does not touch the memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this `layout`, per the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// CPU time the calling thread has used: a consumer's own cost, without the time the OS
/// gave the producer's threads on the same cores.
pub fn thread_cpu() -> std::time::Duration {
    ladle_os::clock::thread_cpu()
}
