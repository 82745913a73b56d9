//! Typed errors of this crate, one per operation: opening a dataset, reading or decoding one
//! sample, augmenting, generating. Every variant names the file (or the tar member, or the
//! CIFAR record) it is about.

use std::io;
use std::path::PathBuf;

/// A dataset could not be opened at all (as opposed to one bad sample inside it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The path does not exist or cannot be stat'ed.
    #[error("cannot open dataset {path}: {source}")]
    Io {
        /// The path given by the caller or found while walking it.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// A directory that had to be listed could not be read (permissions, I/O error).
    #[error("cannot read directory {path}: {source}")]
    UnreadableDir {
        /// The directory.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// Nothing at the path looks like ImageFolder, CIFAR binary or WebDataset.
    #[error(
        "{path}: not a dataset ladle knows (expected an ImageFolder directory of class \
         sub-folders, CIFAR-10/100 binary batches, or WebDataset .tar shards)"
    )]
    UnknownFormat {
        /// The path given by the caller.
        path: PathBuf,
    },
    /// The dataset was recognised but holds no samples.
    #[error("{path}: the dataset holds no samples")]
    Empty {
        /// The dataset's root.
        path: PathBuf,
    },
    /// A CIFAR binary file whose size is not a whole number of records.
    #[error(
        "{path}: {len} bytes is not a whole number of {record_size}-byte CIFAR records \
         (truncated or not a CIFAR batch)"
    )]
    CifarSize {
        /// The batch file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
        /// The record size of the detected variant (3073 for CIFAR-10, 3074 for CIFAR-100).
        record_size: usize,
    },
    /// A tar shard whose headers cannot be parsed.
    #[error("{path}: not a readable tar shard: {source}")]
    Tar {
        /// The shard.
        path: PathBuf,
        /// The reason from the tar reader.
        #[source]
        source: io::Error,
    },
    /// A file the index is built from (a WebDataset shard, a CIFAR batch, a class-name file)
    /// is not a regular file (a FIFO, a device, a socket): not opened for reading, as a FIFO
    /// would block for ever and `/dev/zero` never ends.
    #[error("{path} is {kind}, not a regular file: not read")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A file that lists class names could not be read.
    #[error("cannot read class names from {path}: {source}")]
    ClassNames {
        /// The class-name file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
}

/// One sample could not be read, labelled or decoded. The pipeline's [`crate::BadSamplePolicy`]
/// decides whether this skips the sample or stops the run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SampleError {
    /// The sample's file could not be read.
    #[error("cannot read {location}: {source}")]
    Io {
        /// The file (or shard) that failed.
        location: String,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// The sample's path is not a regular file (a FIFO, a device, a socket, a directory, or a
    /// link to one): never read, as a FIFO would block and `/dev/zero` never ends.
    #[error("{location} is {kind}, not a regular file: not read")]
    NotAFile {
        /// The path.
        location: String,
        /// What it is: `a FIFO`, `a character device`, ….
        kind: &'static str,
    },
    /// The sample's file (or tar member) is larger than [`crate::limits::SampleLimits`]
    /// allows: not read.
    #[error(
        "{location} is {bytes} bytes, above the limit of {max} bytes on a sample's file: not \
         read (raise it with --max-file-mib)"
    )]
    FileTooLarge {
        /// The file or `shard.tar:member`.
        location: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The sample's bytes are not a decodable image.
    #[error("cannot decode {location}: {source}")]
    Decode {
        /// The file, `shard.tar:member`, or `batch.bin#record`.
        location: String,
        /// What the decoder said.
        #[source]
        source: DecodeError,
    },
    /// A WebDataset sample whose image member has no `.cls` label member.
    #[error("{location}: tar member has no label (no .cls member with the same key)")]
    MissingLabel {
        /// `shard.tar:member`.
        location: String,
    },
    /// A label that is not an integer, or outside the dataset's classes.
    #[error("{location}: bad label {label:?}")]
    BadLabel {
        /// Where the label was read.
        location: String,
        /// The label text as found.
        label: String,
    },
    /// The index is past the end of the dataset.
    #[error("sample index {index} is out of range (dataset has {len} samples)")]
    OutOfRange {
        /// The index asked for.
        index: u64,
        /// The dataset's length.
        len: u64,
    },
    /// A sample source other than the image pipeline could not make the sample: the user's
    /// `__getitem__` raised, returned what does not fit the schema, or its worker died.
    #[error("sample {location}: {message}")]
    Source {
        /// Which sample (`index 12`, with the dataset's name).
        location: String,
        /// What went wrong, as the source said it.
        message: String,
    },
    /// The image decoded but could not be augmented (e.g. the output buffer is too small).
    #[error("cannot augment {location}: {source}")]
    Augment {
        /// Where the sample came from.
        location: String,
        /// Why.
        #[source]
        source: AugmentError,
    },
}

impl SampleError {
    /// Whether the error may go away if the read is tried again: the process or system ran
    /// out of file descriptors or memory for a moment, or the call was interrupted. Such an
    /// error says nothing about the sample; [`Pipeline`](crate::pipeline::Pipeline) retries it.
    pub fn is_transient(&self) -> bool {
        let Self::Io { source, .. } = self else {
            return false;
        };
        ladle_os::fs::is_transient(source)
    }

    /// The file, tar member or CIFAR record this error is about, if any.
    pub fn location(&self) -> Option<&str> {
        match self {
            Self::Io { location, .. }
            | Self::NotAFile { location, .. }
            | Self::FileTooLarge { location, .. }
            | Self::Decode { location, .. }
            | Self::MissingLabel { location }
            | Self::BadLabel { location, .. }
            | Self::Source { location, .. }
            | Self::Augment { location, .. } => Some(location),
            Self::OutOfRange { .. } => None,
        }
    }
}

/// Bytes that are not a decodable image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// No signature of a format ladle decodes (JPEG, PNG, WebP, BMP, TIFF, PPM/PGM).
    #[error(
        "not an image ladle decodes (JPEG, PNG, WebP, BMP, TIFF, PPM/PGM): starts with \
         {magic:02x?}"
    )]
    UnknownFormat {
        /// The first bytes of the record.
        magic: Vec<u8>,
    },
    /// The JPEG decoder rejected the data (corrupt, truncated, unsupported).
    #[error("bad JPEG: {0}")]
    Jpeg(String),
    /// The PNG decoder rejected the data.
    #[error("bad PNG: {0}")]
    Png(String),
    /// The `image` crate's decoder rejected a WebP, BMP, TIFF or PPM/PGM file (corrupt,
    /// truncated, or a variant it does not read).
    #[error("bad {format}: {reason}")]
    Image {
        /// The format sniffed from the bytes: `WebP`, `BMP`, `TIFF` or `PPM/PGM`.
        format: &'static str,
        /// What the decoder said.
        reason: String,
    },
    /// Larger than the decoder's limit: a guard against decompression bombs.
    #[error("image is {width}x{height}, above the {max}x{max} limit")]
    TooLarge {
        /// Width from the header.
        width: u64,
        /// Height from the header.
        height: u64,
        /// The limit on each side.
        max: u32,
    },
    /// More pixels than [`crate::limits::SampleLimits`] allows, read from the header before
    /// decoding: a guard against decompression bombs.
    #[error(
        "image is {width}x{height}, above the limit of {max} pixels (raise it with \
         --max-pixels)"
    )]
    TooManyPixels {
        /// Width from the header.
        width: u64,
        /// Height from the header.
        height: u64,
        /// The limit on width × height.
        max: u64,
    },
    /// A raw record whose length does not match its declared shape.
    #[error("raw record is {len} bytes, expected {expected}")]
    RawSize {
        /// Bytes found.
        len: usize,
        /// Bytes expected from width × height × channels.
        expected: usize,
    },
    /// The underlying decoder panicked; caught and turned into an error.
    #[error("decoder failed unexpectedly: {0}")]
    Panicked(String),
}

/// An augmentation could not be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AugmentError {
    /// The caller's output buffer does not hold `size × size × 3` bytes.
    #[error("output buffer holds {len} bytes, the augmentation writes {expected}")]
    OutputSize {
        /// Bytes in the buffer.
        len: usize,
        /// Bytes needed.
        expected: usize,
    },
    /// A zero-sized input image or output size.
    #[error("cannot resize a {width}x{height} image to {size}x{size}")]
    Degenerate {
        /// Input width.
        width: u32,
        /// Input height.
        height: u32,
        /// Output side.
        size: u32,
    },
    /// The resizer rejected its arguments.
    #[error("resize failed: {0}")]
    Resize(String),
    /// A crop is larger than the (padded) image, as torchvision's `RandomCrop` refuses.
    #[error(
        "{transform}: crop {crop_height}x{crop_width} is larger than the {height}x{width} \
         image (pad it, or use pad_if_needed=True)"
    )]
    CropTooLarge {
        /// The transform.
        transform: &'static str,
        /// Crop height.
        crop_height: u32,
        /// Crop width.
        crop_width: u32,
        /// Image height (after padding).
        height: u64,
        /// Image width (after padding).
        width: u64,
    },
    /// An intermediate image of the transform pipeline would be unreasonably large.
    #[error("{transform}: a {height}x{width} intermediate image is too large")]
    TooLarge {
        /// The transform.
        transform: &'static str,
        /// Height.
        height: u64,
        /// Width.
        width: u64,
    },
}

/// The synthetic generator could not write its files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// Writing a file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// Encoding an image failed.
    #[error("cannot encode {path}: {reason}")]
    Encode {
        /// The file being written.
        path: PathBuf,
        /// The encoder's message.
        reason: String,
    },
    /// A parameter is out of range.
    #[error("invalid generator option: {0}")]
    InvalidOption(String),
}

/// Building a [`crate::pipeline::Pipeline`] or running it failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// A configuration value is out of range.
    #[error("invalid pipeline option: {0}")]
    InvalidOption(String),
    /// A sample failed under [`crate::BadSamplePolicy::Fail`].
    #[error("stopped at sample {index}: {source}")]
    Sample {
        /// The dataset index.
        index: u64,
        /// What went wrong.
        #[source]
        source: SampleError,
    },
    /// A worker thread panicked (a bug in ladle: please report it).
    #[error("a pipeline worker panicked: {0}")]
    WorkerPanicked(String),
}
