//! ImageFolder: `root/<class>/**/<file>`, torchvision's layout, indexed exactly as
//! `torchvision.datasets.ImageFolder(root)` indexes it: sample `i` and its label are
//! `ImageFolder(root).samples[i]`.
//!
//! The rules, from torchvision's `datasets/folder.py` (`find_classes`, `make_dataset`,
//! `IMG_EXTENSIONS`):
//!
//! 1. **Classes** are the entries of `root` that are directories, symbolic links to
//!    directories included, hidden ones included (`sorted(entry.name for entry in
//!    os.scandir(root) if entry.is_dir())`); the label is the position in that sorted list.
//! 2. **Directories below a class** are visited in the order of `sorted(os.walk(class_dir,
//!    followlinks=True))`: sorted by their *whole path as a string*, so a directory's own files
//!    come before any of its sub-directories', and `a/b` comes after `a b`, `a-b` and `a.b`
//!    (`/` is U+002F, after space, `-` and `.`), not right after `a` as a depth-first walk
//!    would have it.
//! 3. **Files** of one directory follow in `sorted(fnames)` order; every non-directory entry
//!    counts, hidden files and broken links too.
//! 4. A file is a sample when its name, lower-cased, ends with one of [`IMAGE_EXTENSIONS`]
//!    (`path.lower().endswith(IMG_EXTENSIONS)`): `.jpg`, `.jpeg`, `.png`, `.ppm`, `.bmp`,
//!    `.pgm`, `.tif`, `.tiff`, `.webp`. Other files are left out and counted by extension
//!    ([`Dataset::left_out`], shown by `ladle dataset inspect`). A listed file that no decoder
//!    reads is a bad sample, named and counted like any other, at the same index.
//!
//! "Sorted" is Python's `str` order, by Unicode code point. Names are compared as bytes: for
//! valid UTF-8, byte order *is* code-point order. A name that is not valid UTF-8 is compared
//! as Python sees it on Linux (UTF-8 with `surrogateescape`: each undecodable byte `b` is the
//! code point `U+DC00 + b`), which byte order would not give.
//!
//! # Where ladle deliberately differs
//!
//! - A class folder with no image file is kept (its label stays taken, as in torchvision's
//!   `class_to_idx`) and warned about; torchvision refuses to open the dataset
//!   (`FileNotFoundError: Found no valid file for the classes …`). Indices are unchanged.
//! - A hidden class folder (`.ipynb_checkpoints`, `.DS_Store` is a file and does not count) is
//!   a class, as in torchvision, so that labels stay torchvision's; ladle warns, because it
//!   shifts every other label by one and is almost never meant. Remove it, or point ladle
//!   and torchvision at a root without it. (Skipping it would make ladle's labels differ from
//!   the training script's whenever torchvision is used beside it, e.g. for evaluation.)
//! - A directory that cannot be listed, or a symbolic-link loop (more than 32 levels below a
//!   class), is an [`OpenError`]; `os.walk` silently skips the first and follows the second
//!   until the path is too long.
//!
//! [`Dataset::left_out`]: crate::Dataset::left_out

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::dataset::{Dataset, Format, LeftOut, RecordData, check_index};
use crate::error::{OpenError, SampleError};
use crate::fingerprint::Fingerprint;
use crate::limits::SampleLimits;

/// torchvision's `IMG_EXTENSIONS`, without the dot: a file whose name ends with `.` and one of
/// these, in any case, is a sample.
pub const IMAGE_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

/// An opened ImageFolder dataset.
#[derive(Debug)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    files: Vec<(PathBuf, i64)>,
    problems: Vec<SampleError>,
    left_out: Vec<LeftOut>,
    warnings: Vec<String>,
}

impl ImageFolder {
    /// Indexes the ImageFolder at `root` (see the module docs for the order).
    pub fn open(root: &Path) -> Result<Self, OpenError> {
        let mut class_dirs: Vec<OsString> = read_dir(root)?
            .into_iter()
            .filter(|(_, is_dir)| *is_dir)
            .map(|(name, _)| name)
            .collect();
        class_dirs.sort_by(|a, b| py_str_cmp(a.as_bytes(), b.as_bytes()));
        let mut classes = Vec::with_capacity(class_dirs.len());
        let mut files = Vec::new();
        let mut left_out = BTreeMap::new();
        let mut warnings = Vec::new();
        for (label, name) in class_dirs.iter().enumerate() {
            // Lossless: two folders whose names are not UTF-8 stay two names.
            let class = crate::names::escape(name);
            let before = files.len();
            walk_class(&root.join(name), label as i64, &mut files, &mut left_out)?;
            if name.as_bytes().starts_with(b".") {
                warnings.push(format!(
                    "hidden folder {class:?} is class {label}, as torchvision takes it, and \
                     shifts the labels of the classes after it; remove it if it is not a class"
                ));
            }
            if files.len() == before {
                warnings.push(format!(
                    "class {label} ({class:?}) has no image file; torchvision refuses such a \
                     folder (\"Found no valid file for the classes\"), ladle keeps the label"
                ));
            }
            classes.push(class);
        }
        if files.is_empty() {
            return Err(OpenError::Empty { path: root.into() });
        }
        for warning in &warnings {
            tracing::warn!(root = %root.display(), "{warning}");
        }
        let left_out: Vec<LeftOut> = left_out
            .into_iter()
            .map(|(extension, files)| LeftOut { extension, files })
            .collect();
        if !left_out.is_empty() {
            tracing::info!(
                root = %root.display(),
                "left out files whose extension torchvision's ImageFolder does not read: {}",
                left_out
                    .iter()
                    .map(|l| format!("{} {}", l.files, display_extension(&l.extension)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(Self {
            root: root.into(),
            classes,
            files,
            problems: Vec::new(),
            left_out,
            warnings,
        })
    }
}

impl ImageFolder {
    /// The file of sample `index` (its [`Dataset::location`] is this path for display, lossy
    /// where the name is not UTF-8).
    pub fn path(&self, index: u64) -> Result<&Path, SampleError> {
        Ok(&self.files[check_index(index, self.files.len())?].0)
    }
}

/// `.txt` as is, the empty extension as `(no extension)`: for messages.
pub fn display_extension(extension: &str) -> &str {
    if extension.is_empty() {
        "(no extension)"
    } else {
        extension
    }
}

/// Directory levels below a class folder that are searched; deeper nesting is almost surely a
/// symbolic-link loop, and is an error rather than a stack overflow.
const MAX_DEPTH: usize = 32;

/// One directory below a class: its path relative to the class folder (`/`-joined names,
/// empty for the class folder itself; the order key) and its non-directory entries.
struct Dir {
    relative: Vec<u8>,
    path: PathBuf,
    files: Vec<OsString>,
}

/// Appends the samples of one class folder in torchvision's order, counting left-out files.
fn walk_class(
    class_dir: &Path,
    label: i64,
    files: &mut Vec<(PathBuf, i64)>,
    left_out: &mut BTreeMap<String, u64>,
) -> Result<(), OpenError> {
    let mut dirs = Vec::new();
    let mut pending = vec![(Vec::new(), class_dir.to_path_buf(), 0usize)];
    while let Some((relative, path, depth)) = pending.pop() {
        if depth > MAX_DEPTH {
            return Err(OpenError::UnreadableDir {
                path,
                source: std::io::Error::other(format!(
                    "more than {MAX_DEPTH} levels below the class folder (a symbolic-link loop?)"
                )),
            });
        }
        let mut dir = Dir {
            relative,
            path,
            files: Vec::new(),
        };
        for (name, is_dir) in read_dir(&dir.path)? {
            if is_dir {
                let mut relative = dir.relative.clone();
                if !relative.is_empty() {
                    relative.push(b'/');
                }
                relative.extend_from_slice(name.as_bytes());
                pending.push((relative, dir.path.join(&name), depth + 1));
            } else {
                dir.files.push(name);
            }
        }
        dirs.push(dir);
    }
    // `sorted(os.walk(...))`: by the whole path string. Every path starts with the class
    // folder's, so comparing what follows it is the same; the class folder itself (empty)
    // comes first.
    dirs.sort_by(|a, b| py_str_cmp(&a.relative, &b.relative));
    for mut dir in dirs {
        dir.files
            .sort_by(|a, b| py_str_cmp(a.as_bytes(), b.as_bytes()));
        for name in dir.files {
            if is_image_file(&name) {
                files.push((dir.path.join(name), label));
            } else {
                *left_out.entry(extension_of(&name)).or_default() += 1;
            }
        }
    }
    Ok(())
}

/// The entries of `dir`, hidden ones included, each with whether it is a directory after
/// following symbolic links (`os.DirEntry.is_dir()`: a broken link is not a directory).
fn read_dir(dir: &Path) -> Result<Vec<(OsString, bool)>, OpenError> {
    let unreadable = |source| OpenError::UnreadableDir {
        path: dir.into(),
        source,
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let is_dir = match entry.file_type() {
            Ok(t) if t.is_symlink() => std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()),
            Ok(t) => t.is_dir(),
            Err(_) => std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()),
        };
        entries.push((entry.file_name(), is_dir));
    }
    Ok(entries)
}

/// `name.lower().endswith(IMG_EXTENSIONS)`. ASCII case folding is exact here: the only
/// non-ASCII characters that Python lower-cases to ASCII are `İ` (to `i` + U+0307, which no
/// extension ends with) and the Kelvin sign (to `k`, in no extension).
pub fn is_image_file(name: &OsStr) -> bool {
    let name = name.as_bytes();
    IMAGE_EXTENSIONS.iter().any(|ext| {
        let n = ext.len() + 1;
        name.len() >= n && {
            let tail = &name[name.len() - n..];
            tail[0] == b'.' && tail[1..].eq_ignore_ascii_case(ext.as_bytes())
        }
    })
}

/// The lower-cased extension of a left-out file, with its dot; `""` for none (a leading dot
/// alone, as in `.DS_Store`, is no extension).
fn extension_of(name: &OsStr) -> String {
    Path::new(name)
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy().to_lowercase()))
        .unwrap_or_default()
}

/// Python's `str` order of two names as Python decodes them from the file system (UTF-8 with
/// `surrogateescape`). For valid UTF-8 this is byte order.
pub fn py_str_cmp(a: &[u8], b: &[u8]) -> Ordering {
    if std::str::from_utf8(a).is_ok() && std::str::from_utf8(b).is_ok() {
        return a.cmp(b);
    }
    fn code_points(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
        bytes.utf8_chunks().flat_map(|chunk| {
            let valid = chunk.valid().chars().map(u32::from);
            let escaped = chunk.invalid().iter().map(|&b| 0xDC00 + u32::from(b));
            valid.chain(escaped)
        })
    }
    code_points(a).cmp(code_points(b))
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
            Ok(i) => crate::names::escape_path(&self.files[i].0),
            Err(_) => format!("{}#{index}", crate::names::escape_path(&self.root)),
        }
    }

    fn stamp(&self, index: u64) -> Result<Option<crate::cache::Stamp>, SampleError> {
        use std::os::unix::fs::MetadataExt;
        let path = &self.files[check_index(index, self.files.len())?].0;
        let meta = std::fs::metadata(path).map_err(|source| SampleError::Io {
            location: crate::names::escape_path(path),
            source,
        })?;
        Ok(Some(crate::cache::Stamp {
            size: meta.len(),
            mtime_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
        }))
    }

    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
        limits: &SampleLimits,
    ) -> Result<RecordData<'a>, SampleError> {
        let path = &self.files[check_index(index, self.files.len())?].0;
        let io = |source| SampleError::Io {
            location: crate::names::escape_path(path),
            source,
        };
        // Opened without blocking (a FIFO would wait for a writer for ever), then read only
        // if it is a regular file: a FIFO, a device (a link to /dev/zero never ends) or a
        // socket named like an image is a bad sample that says what it is.
        let (mut file, meta) = match super::open_regular(path).map_err(io)? {
            Ok(opened) => opened,
            Err(kind) => {
                return Err(SampleError::NotAFile {
                    location: crate::names::escape_path(path),
                    kind,
                });
            }
        };
        // The size before a byte is read: a 2 GiB sparse file costs nothing to refuse. The
        // read is bounded too, for a file that grows while it is read.
        limits.check_file(|| crate::names::escape_path(path), meta.len())?;
        let size = usize::try_from(meta.len()).unwrap_or(usize::MAX);
        crate::limits::give_back(scratch, size);
        scratch.clear();
        scratch.resize(size, 0);
        file.read_exact(scratch).map_err(io)?;
        // At its end as `fstat` said, unless it grew meanwhile: then read on, bounded.
        let mut probe = [0u8; 1];
        if file.read(&mut probe).map_err(io)? == 1 {
            scratch.push(probe[0]);
            let left = limits.max_file_bytes.saturating_sub(scratch.len() as u64);
            (&mut file)
                .take(left.saturating_add(1))
                .read_to_end(scratch)
                .map_err(io)?;
            limits.check_file(|| crate::names::escape_path(path), scratch.len() as u64)?;
        }
        Ok(RecordData::Encoded(scratch))
    }

    fn fingerprint(&self) -> Fingerprint {
        let paths: Vec<&Path> = self.files.iter().map(|(p, _)| p.as_path()).collect();
        let sizes = crate::fingerprint::sizes_of(&paths);
        crate::fingerprint::of(paths.iter().zip(sizes).map(|(path, size)| {
            let relative = path.strip_prefix(&self.root).unwrap_or(path);
            (relative.as_os_str().as_bytes(), size)
        }))
    }

    fn problems(&self) -> &[SampleError] {
        &self.problems
    }

    fn left_out(&self) -> &[LeftOut] {
        &self.left_out
    }

    fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_match_at_the_end_of_the_name_in_any_case() {
        for yes in ["a.jpg", "A.JPG", "b.TiFf", ".jpg", "x.tar.webp", "c.PGM"] {
            assert!(is_image_file(OsStr::new(yes)), "{yes}");
        }
        for no in [
            "jpg",
            "a.jpg.txt",
            "a.gif",
            "ajpg",
            "a.jp",
            ".DS_Store",
            "a.tif~",
        ] {
            assert!(!is_image_file(OsStr::new(no)), "{no}");
        }
    }

    #[test]
    fn names_that_are_not_utf8_sort_as_python_surrogate_escapes_them() {
        // U+E000 is "\xee\x80\x80" in UTF-8; Python decodes the lone byte 0xFF to U+DCFF,
        // which sorts *before* U+E000 although 0xFF > 0xEE as bytes.
        let private_use = "\u{e000}".as_bytes();
        assert_eq!(py_str_cmp(b"\xff", private_use), Ordering::Less);
        assert_eq!(b"\xff".as_slice().cmp(private_use), Ordering::Greater);
        assert_eq!(py_str_cmp(b"a", b"\xff"), Ordering::Less);
        assert_eq!(py_str_cmp(b"a/b", b"a.b"), Ordering::Greater);
    }

    #[test]
    fn left_out_extensions_are_lower_cased_with_their_dot() {
        assert_eq!(extension_of(OsStr::new("notes.TXT")), ".txt");
        assert_eq!(extension_of(OsStr::new(".DS_Store")), "");
        assert_eq!(extension_of(OsStr::new("README")), "");
    }
}
