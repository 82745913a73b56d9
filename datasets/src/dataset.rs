//! The [`Dataset`] trait and the names of the formats ladle reads: a leaf that the readers
//! in [`crate::formats`] implement and the pipeline consumes.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::error::SampleError;
use crate::fingerprint::Fingerprint;
use crate::limits::SampleLimits;

/// The on-disk formats ladle reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Format {
    /// One sub-folder per class of image files, JPEG, PNG, WebP, BMP, TIFF or PPM/PGM
    /// (torchvision's `ImageFolder`, ImageNet's layout).
    ImageFolder,
    /// CIFAR-10 binary batches: records of 1 label byte + 3072 bytes of 32×32 planar RGB.
    Cifar10,
    /// CIFAR-100 binary: records of a coarse and a fine label byte + 3072 image bytes.
    Cifar100,
    /// WebDataset tar shards: `KEY.jpg`/`KEY.png` beside `KEY.cls`.
    #[serde(rename = "wds")]
    WebDataset,
}

impl Format {
    /// The short name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::ImageFolder => "imagefolder",
            Self::Cifar10 => "cifar10",
            Self::Cifar100 => "cifar100",
            Self::WebDataset => "wds",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A sample's bytes as stored.
#[derive(Debug, Clone, Copy)]
pub enum RecordData<'a> {
    /// An encoded image file (JPEG, PNG, WebP, BMP, TIFF, PPM/PGM).
    Encoded(&'a [u8]),
    /// Raw planar RGB (CHW), as CIFAR stores it.
    Planar {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// `3 × height × width` bytes: all red, then all green, then all blue.
        bytes: &'a [u8],
    },
}

/// A dataset of labelled images, indexed `0..len`.
///
/// Implementations index their files once when opened; [`Dataset::read`] then costs one read
/// of the sample's bytes, into a scratch buffer the caller reuses.
pub trait Dataset: Send + Sync + fmt::Debug {
    /// The on-disk format.
    fn format(&self) -> Format;

    /// The path the dataset was opened from.
    fn root(&self) -> &Path;

    /// Number of samples.
    fn len(&self) -> u64;

    /// Whether there are no samples (never true for an opened dataset).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Class names; labels are indices into this list.
    fn class_names(&self) -> &[String];

    /// The label of sample `index`.
    fn label(&self, index: u64) -> Result<i64, SampleError>;

    /// Where sample `index` lives, for messages: a path, `shard.tar:member` or
    /// `batch.bin#record`.
    fn location(&self, index: u64) -> String;

    /// The stored bytes of sample `index`. `scratch` is a buffer the caller keeps between
    /// calls so that reading does not allocate once it has grown. A file (or tar member)
    /// above `limits.max_file_bytes` is refused from its size, before a byte is read
    /// ([`SampleError::FileTooLarge`]).
    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
        limits: &SampleLimits,
    ) -> Result<RecordData<'a>, SampleError>;

    /// The size and modification time of sample `index`'s file, for a decoded-sample cache
    /// to tell a rewritten file from the one it decoded ([`crate::cache`]); `None` (the
    /// default) for a sample no cache keeps.
    fn stamp(&self, index: u64) -> Result<Option<crate::cache::Stamp>, SampleError> {
        let _ = index;
        Ok(None)
    }

    /// What the samples are, independent of where the dataset lies: digests of their
    /// relative names and of their sizes, in index order ([`crate::fingerprint`]). Costs a
    /// `stat` per file for an ImageFolder; computed on each call.
    fn fingerprint(&self) -> Fingerprint;

    /// Problems found while indexing (e.g. a tar member without a label): those samples are
    /// left out of `0..len` and reported here.
    fn problems(&self) -> &[SampleError];

    /// Files in the dataset's folders that are not samples because of their extension (the
    /// reference reader, torchvision's `ImageFolder`, leaves out the same files), counted by
    /// extension. Empty for formats without such files.
    fn left_out(&self) -> &[LeftOut] {
        &[]
    }

    /// What is worth a look but is no error: where ladle reads this dataset differently from
    /// torchvision, or a layout that is likely a mistake (a hidden folder taken as a class).
    /// Each was logged at `warn` when the dataset was opened.
    fn warnings(&self) -> &[String] {
        &[]
    }

    /// For a dataset whose shards arrive while it is read (a dataset by shard index,
    /// `ladle-fetch`): how its samples are grouped, and where to say what will be read next.
    /// `None` (the default) for a dataset that is all there when opened.
    fn streamed(&self) -> Option<std::sync::Arc<dyn Streamed>> {
        None
    }
}

/// A dataset read while its shards arrive: the feed shuffles it a window of shards at a
/// time ([`crate::sampler::Grouping`]) and tells it the order it will read, so that it
/// fetches ahead of the decoders and keeps only what is needed soon on disk.
pub trait Streamed: Send + Sync + fmt::Debug {
    /// How the samples lie in shards, and how many shards an epoch shuffles together.
    fn grouping(&self) -> crate::sampler::Grouping;

    /// The feed's order from its sequence `first` on: `order[k]` is read at `first + k`
    /// (called for each producer-epoch as its order is built).
    fn schedule(&self, first: u64, order: std::sync::Arc<[u64]>);

    /// Every sequence before `done` is decoded (or passed as a hole): the shards needed
    /// from here on are those of the order from `done`.
    fn reached(&self, done: u64);
}

/// Files left out of a dataset for their extension: `files` of them end in `extension`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    /// The extension, lower-cased, with its dot (`.txt`), or `""` for names without one.
    pub extension: String,
    /// How many files.
    pub files: u64,
}

/// `index` as a position in a table of `len` entries, or [`SampleError::OutOfRange`].
pub(crate) fn check_index(index: u64, len: usize) -> Result<usize, SampleError> {
    usize::try_from(index)
        .ok()
        .filter(|&i| i < len)
        .ok_or(SampleError::OutOfRange {
            index,
            len: len as u64,
        })
}
