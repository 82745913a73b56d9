//! ImageFolder: `root/<class>/**/<file>.{jpg,jpeg,png}`, torchvision's layout.
//!
//! Classes are the sub-directories of the root in sorted order (label = position); files
//! are found recursively below each class and sorted, so indices are stable. Files with
//! other extensions are ignored, as torchvision does.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::list_dir;
use crate::dataset::{Dataset, Format, RecordData, check_index};
use crate::error::{OpenError, SampleError};

/// Extensions (lower-case) read as images.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png"];

/// An opened ImageFolder dataset.
#[derive(Debug)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    files: Vec<(PathBuf, i64)>,
    problems: Vec<SampleError>,
}

impl ImageFolder {
    /// Indexes the ImageFolder at `root`.
    pub fn open(root: &Path) -> Result<Self, OpenError> {
        let mut classes = Vec::new();
        let mut files = Vec::new();
        for class_dir in list_dir(root)?.into_iter().filter(|p| p.is_dir()) {
            let label = classes.len() as i64;
            classes.push(
                class_dir
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
            );
            walk(&class_dir, label, 0, &mut files)?;
        }
        if files.is_empty() {
            return Err(OpenError::Empty { path: root.into() });
        }
        Ok(Self {
            root: root.into(),
            classes,
            files,
            problems: Vec::new(),
        })
    }
}

/// Directory levels below a class folder that are searched; deeper nesting is almost surely a
/// symbolic-link loop, and is an error rather than a stack overflow.
const MAX_DEPTH: usize = 32;

fn walk(
    dir: &Path,
    label: i64,
    depth: usize,
    files: &mut Vec<(PathBuf, i64)>,
) -> Result<(), OpenError> {
    if depth > MAX_DEPTH {
        return Err(OpenError::UnreadableDir {
            path: dir.into(),
            source: std::io::Error::other(format!(
                "more than {MAX_DEPTH} levels below the class folder (a symbolic-link loop?)"
            )),
        });
    }
    for path in list_dir(dir)? {
        if path.is_dir() {
            walk(&path, label, depth + 1, files)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        {
            files.push((path, label));
        }
    }
    Ok(())
}

impl Dataset for ImageFolder {
    fn format(&self) -> Format {
        Format::ImageFolder
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn len(&self) -> u64 {
        self.files.len() as u64
    }

    fn class_names(&self) -> &[String] {
        &self.classes
    }

    fn label(&self, index: u64) -> Result<i64, SampleError> {
        Ok(self.files[check_index(index, self.files.len())?].1)
    }

    fn location(&self, index: u64) -> String {
        match check_index(index, self.files.len()) {
            Ok(i) => self.files[i].0.display().to_string(),
            Err(_) => format!("{}#{index}", self.root.display()),
        }
    }

    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
    ) -> Result<RecordData<'a>, SampleError> {
        let path = &self.files[check_index(index, self.files.len())?].0;
        let io = |source| SampleError::Io {
            location: path.display().to_string(),
            source,
        };
        scratch.clear();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(scratch))
            .map_err(io)?;
        Ok(RecordData::Encoded(scratch))
    }

    fn problems(&self) -> &[SampleError] {
        &self.problems
    }
}
