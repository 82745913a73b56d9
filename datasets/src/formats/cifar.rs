//! CIFAR-10 and CIFAR-100 in their original binary layout.
//!
//! - CIFAR-10 (`cifar-10-batches-bin/`): `data_batch_1.bin` … `data_batch_5.bin` and
//!   `test_batch.bin`, each record 1 label byte + 3072 image bytes; class names in
//!   `batches.meta.txt`.
//! - CIFAR-100 (`cifar-100-binary/`): `train.bin`, `test.bin`, each record a coarse-label
//!   byte, a fine-label byte + 3072 image bytes; ladle uses the fine label; names in
//!   `fine_label_names.txt`.
//!
//! The image bytes are 32×32 planar: 1024 red, 1024 green, 1024 blue. A directory opens its
//! training split (`data_batch_*` or `train.bin`); name a `.bin` file to open just that file.
//! Records are read with positioned reads (`pread`) into the caller's scratch: 3 KB each, so a
//! memory map would save nothing measurable and would turn a file truncated underneath us into
//! `SIGBUS` instead of an error.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{list_dir, read_class_names};
use crate::dataset::{Dataset, Format, RecordData, check_index};
use crate::error::{OpenError, SampleError};
use crate::fingerprint::Fingerprint;
use crate::limits::SampleLimits;

/// Side of a CIFAR image.
pub const SIDE: u32 = 32;
/// Bytes of image data per record.
pub const IMAGE_BYTES: usize = 3 * 32 * 32;

/// The ten CIFAR-10 classes, used when `batches.meta.txt` is absent.
pub const CIFAR10_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// Bytes before the image in each record.
fn label_bytes(format: Format) -> usize {
    if format == Format::Cifar100 { 2 } else { 1 }
}

/// The record size of a variant: 3073 (CIFAR-10) or 3074 (CIFAR-100).
pub fn record_size(format: Format) -> usize {
    label_bytes(format) + IMAGE_BYTES
}

/// CIFAR-100 files are `train.bin` and `test.bin`; anything else is read as CIFAR-10.
pub(crate) fn variant_of_file(path: &Path) -> Format {
    match path.file_name().and_then(|n| n.to_str()) {
        Some("train.bin" | "test.bin") => Format::Cifar100,
        _ => Format::Cifar10,
    }
}

pub(crate) fn variant_of_dir(names: &[&str]) -> Option<Format> {
    if names
        .iter()
        .any(|n| n.starts_with("data_batch_") && n.ends_with(".bin"))
        || names.contains(&"test_batch.bin")
    {
        Some(Format::Cifar10)
    } else if names.contains(&"train.bin") || names.contains(&"test.bin") {
        Some(Format::Cifar100)
    } else {
        None
    }
}

#[derive(Debug)]
struct BatchFile {
    path: PathBuf,
    file: std::fs::File,
    /// Index of this file's first record in the dataset.
    first: u64,
    records: u64,
}

/// An opened CIFAR-10 or CIFAR-100 binary dataset.
#[derive(Debug)]
pub struct CifarDataset {
    root: PathBuf,
    format: Format,
    classes: Vec<String>,
    files: Vec<BatchFile>,
    len: u64,
}

impl CifarDataset {
    /// Opens a CIFAR batch file or a directory of them.
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        let (format, dir, paths) = if path.is_file() {
            (
                variant_of_file(path),
                path.parent().unwrap_or(Path::new(".")),
                vec![path.into()],
            )
        } else {
            let entries = list_dir(path)?;
            let names: Vec<&str> = entries
                .iter()
                .filter_map(|p| p.file_name()?.to_str())
                .collect();
            let format = variant_of_dir(&names)
                .ok_or_else(|| OpenError::UnknownFormat { path: path.into() })?;
            let wanted = |name: &str| match format {
                Format::Cifar100 => name == "train.bin",
                _ => name.starts_with("data_batch_") && name.ends_with(".bin"),
            };
            let mut train: Vec<PathBuf> = entries
                .iter()
                .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(wanted))
                .cloned()
                .collect();
            if train.is_empty() {
                // Only the test split is present: read that.
                train = entries
                    .iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "bin"))
                    .cloned()
                    .collect();
            }
            (format, path, train)
        };
        let size = record_size(format) as u64;
        let mut files = Vec::new();
        let mut len = 0;
        for path in paths {
            let (file, meta) = super::open_index_file(&path)?;
            let bytes = meta.len();
            if bytes % size != 0 {
                return Err(OpenError::CifarSize {
                    path,
                    len: bytes,
                    record_size: size as usize,
                });
            }
            files.push(BatchFile {
                path,
                file,
                first: len,
                records: bytes / size,
            });
            len += bytes / size;
        }
        if len == 0 {
            return Err(OpenError::Empty { path: path.into() });
        }
        let names_file = dir.join(if format == Format::Cifar100 {
            "fine_label_names.txt"
        } else {
            "batches.meta.txt"
        });
        let classes = if names_file.is_file() {
            read_class_names(&names_file)?
        } else if format == Format::Cifar100 {
            (0..100).map(|i| i.to_string()).collect()
        } else {
            CIFAR10_CLASSES.iter().map(|s| (*s).to_owned()).collect()
        };
        Ok(Self {
            root: path.into(),
            format,
            classes,
            files,
            len,
        })
    }

    /// The file holding `index` and the record's position in it.
    fn locate(&self, index: u64) -> Result<(&BatchFile, u64), SampleError> {
        check_index(index, usize::try_from(self.len).unwrap_or(usize::MAX))?;
        let at = self.files.partition_point(|f| f.first + f.records <= index);
        let file = &self.files[at];
        Ok((file, index - file.first))
    }

    fn read_record(&self, index: u64, into: &mut [u8]) -> Result<(), SampleError> {
        let (file, record) = self.locate(index)?;
        let offset = record * record_size(self.format) as u64;
        file.file
            .read_exact_at(into, offset)
            .map_err(|source| SampleError::Io {
                location: self.location(index),
                source,
            })
    }
}

impl Dataset for CifarDataset {
    fn format(&self) -> Format {
        self.format
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn class_names(&self) -> &[String] {
        &self.classes
    }

    fn label(&self, index: u64) -> Result<i64, SampleError> {
        let mut head = [0u8; 2];
        let n = label_bytes(self.format);
        self.read_record(index, &mut head[..n])?;
        let label = head[n - 1];
        if usize::from(label) >= self.classes.len() {
            return Err(SampleError::BadLabel {
                location: self.location(index),
                label: label.to_string(),
            });
        }
        Ok(i64::from(label))
    }

    fn location(&self, index: u64) -> String {
        match self.locate(index) {
            Ok((file, record)) => format!("{}#record{record}", file.path.display()),
            Err(_) => format!("{}#{index}", self.root.display()),
        }
    }

    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
        _limits: &SampleLimits,
    ) -> Result<RecordData<'a>, SampleError> {
        // A record is 3 073 or 3 074 bytes, far under any limit.
        let size = record_size(self.format);
        scratch.resize(size, 0);
        self.read_record(index, scratch)?;
        Ok(RecordData::Planar {
            width: SIDE,
            height: SIDE,
            bytes: &scratch[label_bytes(self.format)..size],
        })
    }

    fn fingerprint(&self) -> Fingerprint {
        let size = record_size(self.format) as u64;
        let names: Vec<Vec<u8>> = (self.files.iter())
            .flat_map(|file| {
                let name = file.path.file_name().unwrap_or(file.path.as_os_str());
                (0..file.records).map(move |record| {
                    let mut n = name.as_bytes().to_vec();
                    n.extend_from_slice(format!("#record{record}").as_bytes());
                    n
                })
            })
            .collect();
        crate::fingerprint::of(names.iter().map(|n| (n.as_slice(), size)))
    }

    fn problems(&self) -> &[SampleError] {
        &[]
    }
}
