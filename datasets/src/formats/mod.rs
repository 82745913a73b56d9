//! The dataset formats ladle reads, each a [`Dataset`] reader, and [`open`], which
//! detects the format of a path and opens it:
//!
//! - [`imagefolder`]: ImageFolder (a directory per class of image files);
//! - [`cifar`]: CIFAR-10 and CIFAR-100 binary batches;
//! - [`wds`]: WebDataset tar shards.
//!
//! The [`Dataset`] trait itself lives in `dataset.rs`, which imports none of them.

use std::path::{Path, PathBuf};

use crate::dataset::{Dataset, Format};
use crate::error::OpenError;

pub mod cifar;
pub mod imagefolder;
pub mod wds;

use self::cifar::CifarDataset;
use self::imagefolder::ImageFolder;
use self::wds::WebDataset;

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
            Some("bin") => Ok(cifar::variant_of_file(path)),
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
    if let Some(variant) = cifar::variant_of_dir(&names) {
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

/// Opens `path` for reading without blocking (a FIFO would wait for a writer for ever) and
/// only if `fstat` says it is a regular file; otherwise `Ok(Err(kind))` says what it is (`a
/// FIFO`, `a character device`, ...). Every file a dataset reads is opened here.
pub(crate) fn open_regular(
    path: &Path,
) -> std::io::Result<Result<(std::fs::File, std::fs::Metadata), &'static str>> {
    let file = ladle_os::fs::open_nonblocking(path)?;
    let meta = file.metadata()?;
    Ok(if meta.file_type().is_file() {
        Ok((file, meta))
    } else {
        Err(kind_of(meta.file_type()))
    })
}

/// What a file that is not a regular file is, for messages.
fn kind_of(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Opens a file an index is built from (a shard, a batch file): a regular file, or
/// [`OpenError::NotAFile`].
pub(crate) fn open_index_file(
    path: &Path,
) -> Result<(std::fs::File, std::fs::Metadata), OpenError> {
    match open_regular(path) {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(kind)) => Err(OpenError::NotAFile {
            path: path.into(),
            kind,
        }),
        Err(source) => Err(OpenError::Io {
            path: path.into(),
            source,
        }),
    }
}

/// The most bytes of class names read from a class-name file (ImageNet-21k's are 0.5 MB).
const MAX_CLASS_NAMES_FILE: u64 = 64 << 20;

/// Reads a class-name file: one name per non-empty line. A file that is not a regular file
/// (a FIFO, `/dev/zero`) or larger than 64 MiB is refused before it is read.
pub(crate) fn read_class_names(path: &Path) -> Result<Vec<String>, OpenError> {
    let (file, meta) = open_index_file(path)?;
    let refused = |why: String| OpenError::ClassNames {
        path: path.into(),
        source: std::io::Error::other(why),
    };
    if meta.len() > MAX_CLASS_NAMES_FILE {
        return Err(refused(format!(
            "{} bytes, more than the {MAX_CLASS_NAMES_FILE} a class-name file may have",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_CLASS_NAMES_FILE),
        &mut text,
    )
    .map_err(|source| OpenError::ClassNames {
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
