//! # ladle-datasets: read, decode and augment training images, fast
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate is the left-hand box: *dataset files → sampler →
//! decode+augment threads*. The producer drives it to fill the shared sample ring; the
//! benchmarks drive it to measure the per-core ceiling of the whole service; the consumer SDK
//! never links it.
//!
//! - [`Dataset`]: a labelled image collection; readers for [`ImageFolder`](imagefolder),
//!   [CIFAR-10/100 binary](cifar) and [WebDataset shards](wds); [`open`] detects which.
//!   An ImageFolder's sample `i` and label are torchvision's `ImageFolder(root).samples[i]`:
//!   the same classes, files, order and extensions (see [`imagefolder`] for the rules and
//!   the few deliberate differences, each warned about).
//! - [`Decoder`](decode::Decoder): JPEG (baseline, progressive, any subsampling, grayscale,
//!   CMYK) and PNG into RGB u8, in reused buffers, by their own fast decoders; WebP, BMP, TIFF
//!   and PPM/PGM, the rest of torchvision's `IMG_EXTENSIONS`, through the `image` crate, into
//!   the RGB PIL's `convert("RGB")` gives. Formats are sniffed from the bytes, as PIL does.
//! - [`Transformer`](transforms::Transformer): torchvision-named transform pipelines
//!   ([`Transforms`](transforms::Transforms)), with RandomResizedCrop + flip as the default.
//! - [`EpochSampler`](sampler::EpochSampler): a seeded permutation per epoch.
//! - [`Pipeline`](pipeline::Pipeline): `T` threads writing samples into a [`SampleSink`](pipeline::SampleSink)
//!   (the ring, later), with a [`BadSamplePolicy`].
//! - [`synth`]: a generator of photo-like datasets in all three formats; the embedded
//!   default of the demo, tests and benchmarks.
//!
//! ```
//! use ladle_datasets::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let config = SynthConfig { count: 8, width: 96, height: 64, ..SynthConfig::default() };
//! ladle_datasets::synth::generate(&config, dir.path(), &|_| {})?;
//!
//! let dataset = ladle_datasets::open(dir.path())?;
//! let transforms = Transforms::parse("RandomResizedCrop(32), RandomHorizontalFlip()")?;
//! let sink = SlotBuffer::new(8, transforms.output_len());
//! let pipeline = PipelineConfig { threads: 2, augment: transforms, ..Default::default() }
//!     .build()?;
//! let order = EpochSampler::new(dataset.len(), 7).order(0);
//! let items = order.iter().enumerate().map(|(seq, &index)| WorkItem { seq: seq as u64, index, epoch: 0 });
//! let stats = pipeline.run(dataset.as_ref(), items, &sink)?;
//! assert_eq!(stats.written, 8);
//! let (pixels, label) = sink.get(0).expect("sample 0 was written");
//! assert_eq!(pixels.len(), 32 * 32 * 3);
//! assert_eq!(label, dataset.label(order[0])?);
//! # Ok(()) }
//! ```
//!
//! # Decoder choice
//!
//! JPEG decoding uses [`zune_jpeg`] (pure Rust, SIMD), chosen over libjpeg-turbo (the
//! `turbojpeg` crate built from source with cmake + nasm) by measurement on this project's
//! 2-core development machine, single thread, 500×375 JPEGs of the synthetic set (~100 KB),
//! decoding to RGB into a reused buffer (µs per image, criterion medians):
//!
//! | encoding | zune-jpeg 0.5 | libjpeg-turbo | libjpeg-turbo, DCT 1/2 scale | zune / turbo |
//! |---|---|---|---|---|
//! | baseline 4:2:0 | 1131 | 967 | 856 | 1.17 |
//! | progressive 4:2:0 | 2344 | 2570 | 2402 | 0.91 |
//! | baseline 4:4:4 | 1889 | 1646 | 1483 | 1.15 |
//!
//! Reproduce with `cargo bench -p ladle-benches --features turbojpeg --bench decoders`
//! (needs cmake and nasm). libjpeg-turbo is 15% faster on baseline files and 9% slower on
//! progressive ones; DCT-domain downscaling saves only 6–12% here because entropy decoding
//! dominates, and it would cost resolution on the large crops RandomResizedCrop takes. With
//! zune-jpeg, decode + RandomResizedCrop(224) + flip of a baseline file costs 1.29 ms, inside
//! the 1.5 ms per-core budget, so ladle keeps a memory-safe decoder for untrusted files, needs
//! no C toolchain on users' or CI machines, and gets CMYK → RGB conversion that turbojpeg
//! refuses ("Unsupported color conversion request"). Per-image allocations happen inside the
//! dependencies (zune-jpeg ~14, fast_image_resize ~450 small coefficient vectors per resize;
//! measured by `benches/decode_augment.rs`), costing well under 1% of the sample time; ladle's
//! own buffers are reused.
//!
//! # Errors
//!
//! Opening a dataset fails with an [`OpenError`] (missing path, unreadable directory, a CIFAR
//! file of the wrong size, an unparsable tar). A single bad sample (corrupt, truncated or
//! non-image file, a tar member without a label) is a [`SampleError`] naming the file; the
//! pipeline skips and counts it or stops, as its [`BadSamplePolicy`] says. Nothing here
//! panics on input from outside; `fuzz/` fuzzes the decoders and readers.
//!
//! # Logging
//!
//! `tracing`: `warn` for a skipped bad sample (one line naming the file) and, when an
//! ImageFolder is opened, for a hidden class folder or a class without images; `info` for the
//! files an ImageFolder leaves out, counted by extension. Nothing is logged on the per-sample
//! hot path otherwise.

pub mod cache;
mod dataset;
pub mod decode;
mod error;
pub mod fingerprint;
pub mod formats;
pub mod inspect;
pub mod limits;
pub mod names;
pub mod pipeline;
pub mod rng;
pub mod sampler;
pub mod synth;
pub mod transforms;

pub use dataset::{Dataset, Format, LeftOut, RecordData, Streamed};
pub use error::{AugmentError, DecodeError, GenerateError, OpenError, PipelineError, SampleError};
pub use fingerprint::Fingerprint;
pub use formats::{cifar, detect, imagefolder, open, wds};
pub use limits::SampleLimits;
pub use pipeline::BadSamplePolicy;

/// The common case: open or generate a dataset and run the pipeline over it.
pub mod prelude {
    pub use crate::decode::Decoder;
    pub use crate::pipeline::{
        BadSamplePolicy, Pipeline, PipelineConfig, SampleSink, SlotBuffer, WorkItem,
    };
    pub use crate::sampler::EpochSampler;
    pub use crate::synth::SynthConfig;
    pub use crate::transforms::{Transformer, Transforms};
    pub use crate::{Dataset, Format, open};
}
