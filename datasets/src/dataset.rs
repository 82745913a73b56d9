//! The [`Dataset`] trait, the formats ladle reads, and [`open`], which detects the format.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cifar::CifarDataset;
use crate::error::{OpenError, SampleError};
use crate::imagefolder::ImageFolder;
use crate::wds::WebDataset;

/// The on-disk formats ladle reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Format {
    /// One sub-folder per class of JPEG/PNG files (torchvision's `ImageFolder`, ImageNet's
    /// layout).
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
    /// An encoded image file (JPEG or PNG).
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
    /// calls so that reading does not allocate once it has grown.
    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
    ) -> Result<RecordData<'a>, SampleError>;

    /// Problems found while indexing (e.g. a tar member without a label): those samples are
    /// left out of `0..len` and reported here.
    fn problems(&self) -> &[SampleError];
}

/// Opens the dataset at `path`, detecting its format:
///
/// - a `.tar` file, or a directory holding `.tar` files: WebDataset shards;
/// - a `.bin` file, or a directory holding `data_batch_*.bin` / `test_batch.bin` (CIFAR-10)
///   or `train.bin` / `test.bin` (CIFAR-100): CIFAR binary;
/// - a directory of sub-directories: ImageFolder.
pub fn open(path: impl AsRef<Path>) -> Result<Box<dyn Dataset>, OpenError> {
    let path = path.as_ref();
    Ok(match detect(path)? {
        Format::ImageFolder => Box::new(ImageFolder::open(path)?),
        Format::Cifar10 | Format::Cifar100 => Box::new(CifarDataset::open(path)?),
        Format::WebDataset => Box::new(WebDataset::open(path)?),
    })
}

/// Detects the format of the dataset at `path` without indexing it.
pub fn detect(path: &Path) -> Result<Format, OpenError> {
    let meta = std::fs::metadata(path).map_err(|source| OpenError::Io {
        path: path.into(),
        source,
    })?;
    if meta.is_file() {
        return match path.extension().and_then(|e| e.to_str()) {
            Some("tar") => Ok(Format::WebDataset),
            Some("bin") => Ok(crate::cifar::variant_of_file(path)),
            _ => Err(OpenError::UnknownFormat { path: path.into() }),
        };
    }
    let entries = list_dir(path)?;
    let names: Vec<&str> = entries
        .iter()
        .filter_map(|p| p.file_name()?.to_str())
        .collect();
    if names.iter().any(|n| n.ends_with(".tar")) {
        return Ok(Format::WebDataset);
    }
    if let Some(variant) = crate::cifar::variant_of_dir(&names) {
        return Ok(variant);
    }
    if entries.iter().any(|p| p.is_dir()) {
        return Ok(Format::ImageFolder);
    }
    Err(OpenError::UnknownFormat { path: path.into() })
}

/// The entries of a directory, sorted by name, hidden ones (`.name`) left out.
pub(crate) fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, OpenError> {
    let unreadable = |source| OpenError::UnreadableDir {
        path: dir.into(),
        source,
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        entries.push(entry.path());
    }
    entries.sort();
    Ok(entries)
}

/// Reads a class-name file: one name per non-empty line.
pub(crate) fn read_class_names(path: &Path) -> Result<Vec<String>, OpenError> {
    let text = std::fs::read_to_string(path).map_err(|source| OpenError::ClassNames {
        path: path.into(),
        source,
    })?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
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
