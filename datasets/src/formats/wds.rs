//! WebDataset tar shards, read in place.
//!
//! A shard is a plain tar whose members are grouped by key: `KEY.jpg` (or `.jpeg`, `.png`)
//! beside `KEY.cls` (the label as decimal text), where the key is the member's path up to the
//! first dot of its file name. Opening walks every shard's headers once (seeking over the
//! data) and keeps `(shard, offset, length)` per image; reading a sample is then one
//! positioned read from the shard, no extraction. Class names come from a `classes.txt` beside
//! the shards when present, else they are the label numbers.
//!
//! An image without a `.cls` member, or a label that is not an integer in range, leaves that
//! sample out and is reported by [`Dataset::problems`].
//!
//! **An ImageFolder stored as tar shards** is read too: shards with no `.cls` member at all,
//! whose images are `CLASS/…/NAME.jpg` (a leading `./` ignored: what `tar -cf shard.tar -C
//! ROOT .` writes of an ImageFolder `ROOT`), are labelled by their first folder, the classes
//! sorted by name and the samples ordered by class, then path, over all shards: the classes,
//! labels and order torchvision's `ImageFolder(ROOT)` gives the unpacked folder.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{list_dir, read_class_names};

/// Member extensions (lower-case) read as images: JPEG and PNG, as before ImageFolder learnt
/// the rest of torchvision's list (a shard's other members are metadata to WebDataset).
const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png"];
use crate::dataset::{Dataset, Format, RecordData, check_index};
use crate::error::{OpenError, SampleError};
use crate::fingerprint::Fingerprint;
use crate::limits::SampleLimits;

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    file: std::fs::File,
}

#[derive(Debug)]
struct Member {
    shard: usize,
    name: String,
    offset: u64,
    len: u64,
    label: i64,
}

/// An opened set of WebDataset shards.
#[derive(Debug)]
pub struct WebDataset {
    root: PathBuf,
    shards: Vec<Shard>,
    members: Vec<Member>,
    classes: Vec<String>,
    problems: Vec<SampleError>,
}

/// A key's members while a shard is being indexed.
#[derive(Default)]
struct Pending {
    image: Option<(String, u64, u64)>,
    label: Option<Result<i64, String>>,
}

/// Splits `dir/name.ext.more` into the key `dir/name` and the extension `ext.more`.
fn split_key(path: &str) -> (&str, &str) {
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    match path[base_start..].find('.') {
        Some(dot) => (&path[..base_start + dot], &path[base_start + dot + 1..]),
        None => (path, ""),
    }
}

impl WebDataset {
    /// Indexes one `.tar` shard or a directory of them.
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        let (dir, shard_paths) = shard_paths(path)?;
        let named_classes = named_classes(dir)?;

        let mut shards = Vec::new();
        let mut members = Vec::new();
        let mut unlabelled = Vec::new();
        let mut problems = Vec::new();
        for (shard_no, shard_path) in shard_paths.into_iter().enumerate() {
            let (file, _) = super::open_index_file(&shard_path)?;
            let found = index_shard(shard_no, &shard_path, &file, &mut problems)?;
            members.extend(found.labelled);
            unlabelled.extend(found.unlabelled);
            shards.push(Shard {
                path: shard_path,
                file,
            });
        }

        let folder_classes = if members.is_empty() {
            folder_layout(&mut unlabelled)
        } else {
            None
        };
        let classes = match (folder_classes, named_classes) {
            (Some(folders), _) => {
                // Every image lacked a `.cls` because none was meant: not problems.
                members = std::mem::take(&mut unlabelled);
                problems.retain(|p| !matches!(p, SampleError::MissingLabel { .. }));
                folders
            }
            (None, Some(names)) => names,
            (None, None) => {
                let max = members.iter().map(|m| m.label).max().unwrap_or(-1);
                (0..=max).map(|l| l.to_string()).collect()
            }
        };
        // Labels outside the class list are reported and left out.
        let n_classes = classes.len() as i64;
        members.retain(|m| {
            let ok = (0..n_classes).contains(&m.label);
            if !ok {
                problems.push(SampleError::BadLabel {
                    location: format!("{}:{}", shards[m.shard].path.display(), m.name),
                    label: m.label.to_string(),
                });
            }
            ok
        });
        if members.is_empty() {
            return Err(OpenError::Empty { path: path.into() });
        }
        Ok(Self {
            root: path.into(),
            shards,
            members,
            classes,
            problems,
        })
    }
}

/// The folder and the `.tar` shards of `path` (one `.tar` file, or a folder of them, in name
/// order).
pub fn shard_paths(path: &Path) -> Result<(&Path, Vec<PathBuf>), OpenError> {
    if path.is_file() {
        return Ok((path.parent().unwrap_or(Path::new(".")), vec![path.into()]));
    }
    let shards = list_dir(path)?
        .into_iter()
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "tar"))
        .collect();
    Ok((path, shards))
}

/// The class names of a `classes.txt` in `dir`, if there is one.
pub fn named_classes(dir: &Path) -> Result<Option<Vec<String>>, OpenError> {
    let classes_file = dir.join("classes.txt");
    if classes_file.is_file() {
        Ok(Some(read_class_names(&classes_file)?))
    } else {
        Ok(None)
    }
}

/// One image of a shard indexed on its own ([`index_one`]).
#[derive(Debug)]
pub struct TarSample {
    /// The member's name.
    pub name: String,
    /// Where its bytes start in the shard.
    pub offset: u64,
    /// Its size.
    pub len: u64,
    /// Its label; `None` for an image without a `.cls` member.
    pub label: Option<i64>,
}

/// Indexes one shard on its own, for a dataset whose shards arrive one by one (a dataset by
/// shard index): its images in the shard's order, each with its label or why it has none,
/// and the file.
pub fn index_one(path: &Path) -> Result<(std::fs::File, Vec<TarSample>), OpenError> {
    let (file, _) = super::open_index_file(path)?;
    let mut problems = Vec::new();
    let found = index_shard(0, path, &file, &mut problems)?;
    let sample = |m: Member, label| TarSample {
        name: m.name,
        offset: m.offset,
        len: m.len,
        label,
    };
    let mut order: Vec<TarSample> = Vec::new();
    order.extend(found.labelled.into_iter().map(|m| {
        let label = Some(m.label);
        sample(m, label)
    }));
    order.extend(found.unlabelled.into_iter().map(|m| sample(m, None)));
    // A bad label or a member cut off by the end of the file leaves its image out (the
    // samples after it move up; the reader reports the shortfall at the shard's end).
    for problem in problems {
        if !matches!(problem, SampleError::MissingLabel { .. }) {
            tracing::warn!("{problem}");
        }
    }
    order.sort_by_key(|s| s.offset);
    Ok((file, order))
}

/// The class of an image stored as `CLASS/…/NAME.ext` (a leading `./` ignored).
fn folder_class(name: &str) -> Option<&str> {
    let name = name.strip_prefix("./").unwrap_or(name);
    let (class, rest) = name.split_once('/')?;
    (!class.is_empty() && !rest.is_empty()).then_some(class)
}

/// If every image lies in a class folder, labels them as torchvision's ImageFolder would
/// (classes sorted by name; samples by class, then path) and returns the classes.
fn folder_layout(images: &mut [Member]) -> Option<Vec<String>> {
    if images.is_empty() || images.iter().any(|m| folder_class(&m.name).is_none()) {
        return None;
    }
    let mut classes: Vec<String> = images
        .iter()
        .filter_map(|m| folder_class(&m.name))
        .map(str::to_owned)
        .collect();
    classes.sort();
    classes.dedup();
    for m in images.iter_mut() {
        let class = folder_class(&m.name).unwrap_or_default();
        m.label = classes.binary_search_by(|c| c.as_str().cmp(class)).ok()? as i64;
    }
    images.sort_by(|a, b| {
        let path = |m: &Member| m.name.strip_prefix("./").unwrap_or(&m.name).to_owned();
        (a.label, path(a)).cmp(&(b.label, path(b)))
    });
    Some(classes)
}

/// A shard's images: those with a `.cls` label, and those without one (an ImageFolder's, or
/// missing their label: reported as such until [`folder_layout`] says otherwise), whose
/// `label` is -1 until it does.
struct Indexed {
    labelled: Vec<Member>,
    unlabelled: Vec<Member>,
}

fn index_shard(
    shard_no: usize,
    shard_path: &Path,
    file: &std::fs::File,
    problems: &mut Vec<SampleError>,
) -> Result<Indexed, OpenError> {
    let mut found = Indexed {
        labelled: Vec::new(),
        unlabelled: Vec::new(),
    };
    let tar_err = |source| OpenError::Tar {
        path: shard_path.into(),
        source,
    };
    let file_len = file.metadata().map_err(tar_err)?.len();
    let mut archive = tar::Archive::new(BufReader::new(file));
    let mut keys: Vec<String> = Vec::new();
    let mut pending: HashMap<String, Pending> = HashMap::new();
    for entry in archive.entries_with_seek().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry
            .path()
            .map_err(tar_err)?
            .to_string_lossy()
            .into_owned();
        let (key, ext) = split_key(&name);
        let ext = ext.to_ascii_lowercase();
        let (key, offset, len) = (key.to_owned(), entry.raw_file_position(), entry.size());
        let slot = pending.entry(key.clone()).or_insert_with(|| {
            keys.push(key.clone());
            Pending::default()
        });
        if IMAGE_EXTENSIONS.contains(&ext.as_str()) {
            slot.image = Some((name, offset, len));
        } else if ext == "cls" {
            let mut text = String::new();
            let parsed = match entry.by_ref().take(64).read_to_string(&mut text) {
                Ok(_) => text
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| text.trim().to_owned()),
                Err(_) => Err("<not UTF-8 text>".to_owned()),
            };
            slot.label = Some(parsed);
        }
    }
    let location = |name: &str| format!("{}:{name}", shard_path.display());
    for key in keys {
        let Some(Pending {
            image: Some((name, offset, len)),
            label,
        }) = pending.remove(&key)
        else {
            continue; // a key with no image (metadata only): nothing to train on
        };
        let member = |name, label| Member {
            shard: shard_no,
            name,
            offset,
            len,
            label,
        };
        match label {
            Some(Err(text)) => problems.push(SampleError::BadLabel {
                location: location(&name),
                label: text,
            }),
            _ if offset + len > file_len => problems.push(SampleError::Io {
                location: location(&name),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "member runs past the end of the shard (truncated tar)",
                ),
            }),
            None => {
                // Reported in the shard's order; taken back if the shards are an ImageFolder.
                problems.push(SampleError::MissingLabel {
                    location: location(&name),
                });
                found.unlabelled.push(member(name, -1));
            }
            Some(Ok(label)) => found.labelled.push(member(name, label)),
        }
    }
    Ok(found)
}

impl Dataset for WebDataset {
    fn format(&self) -> Format {
        Format::WebDataset
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn len(&self) -> u64 {
        self.members.len() as u64
    }

    fn class_names(&self) -> &[String] {
        &self.classes
    }

    fn label(&self, index: u64) -> Result<i64, SampleError> {
        Ok(self.members[check_index(index, self.members.len())?].label)
    }

    fn location(&self, index: u64) -> String {
        match check_index(index, self.members.len()) {
            Ok(i) => {
                let m = &self.members[i];
                format!("{}:{}", self.shards[m.shard].path.display(), m.name)
            }
            Err(_) => format!("{}#{index}", self.root.display()),
        }
    }

    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
        limits: &SampleLimits,
    ) -> Result<RecordData<'a>, SampleError> {
        let m = &self.members[check_index(index, self.members.len())?];
        // The member's size from its tar header, checked before a byte is read.
        limits.check_file(|| self.location(index), m.len)?;
        let len = usize::try_from(m.len).map_err(|_| SampleError::Io {
            location: self.location(index),
            source: std::io::Error::other("member too large for this platform"),
        })?;
        self.shards[m.shard]
            .file
            .read_exact_at(crate::limits::fit(scratch, len), m.offset)
            .map_err(|source| SampleError::Io {
                location: self.location(index),
                source,
            })?;
        Ok(RecordData::Encoded(&scratch[..len]))
    }

    fn fingerprint(&self) -> Fingerprint {
        // A shard's file name and the member's name: the shards' folder is where the data
        // lies, not what it is.
        let names: Vec<Vec<u8>> = (self.members.iter())
            .map(|m| {
                let shard = &self.shards[m.shard].path;
                let mut name = shard
                    .file_name()
                    .unwrap_or(shard.as_os_str())
                    .as_bytes()
                    .to_vec();
                name.push(b':');
                name.extend_from_slice(m.name.as_bytes());
                name
            })
            .collect();
        crate::fingerprint::of(
            names
                .iter()
                .zip(&self.members)
                .map(|(name, m)| (name.as_slice(), m.len)),
        )
    }

    fn problems(&self) -> &[SampleError] {
        &self.problems
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::split_key;
    use crate::dataset::Dataset;

    /// Writes a tar of `(name, bytes)` members.
    fn shard(path: &std::path::Path, members: &[(&str, &[u8])]) {
        let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (name, data) in members {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, name, *data).unwrap();
        }
        tar.finish().unwrap();
    }

    #[test]
    fn one_shard_indexed_alone_lists_its_images_in_tar_order_with_labels_or_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        shard(
            &path,
            &[
                ("b.jpg", b"JPG1"),
                ("b.cls", b"3"),
                ("a.jpg", b"JPG22"),
                ("meta.json", b"{}"),
                ("c.png", b"PNG"),
                ("c.cls", b"0"),
            ],
        );
        let (_, samples) = super::index_one(&path).unwrap();
        let names: Vec<&str> = samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["b.jpg", "a.jpg", "c.png"]);
        let labels: Vec<Option<i64>> = samples.iter().map(|s| s.label).collect();
        assert_eq!(labels, [Some(3), None, Some(0)]);
        assert_eq!((samples[1].len, samples[2].len), (5, 3));
    }

    #[test]
    fn an_imagefolder_in_tar_shards_has_torchvisions_classes_labels_and_order() {
        let dir = tempfile::tempdir().unwrap();
        shard(
            &dir.path().join("a.tar"),
            &[("./dog/1.jpg", b"d1"), ("./cat/2.jpg", b"c2")],
        );
        shard(
            &dir.path().join("b.tar"),
            &[
                ("cat/1.jpg", b"c1"),
                ("bird/deep/x.png", b"bx"),
                ("notes.txt", b"-"),
            ],
        );
        let ds = super::WebDataset::open(dir.path()).unwrap();
        assert_eq!(ds.class_names(), ["bird", "cat", "dog"]);
        let got: Vec<(i64, String)> = (0..ds.len())
            .map(|i| {
                let mut scratch = Vec::new();
                let limits = crate::limits::SampleLimits::default();
                let bytes = match ds.read(i, &mut scratch, &limits).unwrap() {
                    crate::dataset::RecordData::Encoded(b) => b.to_vec(),
                    _ => panic!("a WebDataset sample is encoded bytes"),
                };
                (ds.label(i).unwrap(), String::from_utf8(bytes).unwrap())
            })
            .collect();
        let want = [(0, "bx"), (1, "c1"), (1, "c2"), (2, "d1")];
        assert_eq!(
            got,
            want.map(|(l, b)| (l, b.to_owned())),
            "by class, then path, over both shards"
        );
        assert!(ds.problems().is_empty(), "{:?}", ds.problems());
    }

    #[test]
    fn labelled_shards_with_an_image_missing_its_label_still_report_it() {
        let dir = tempfile::tempdir().unwrap();
        shard(
            &dir.path().join("a.tar"),
            &[("k/1.jpg", b"x"), ("k/1.cls", b"0"), ("cat/2.jpg", b"y")],
        );
        let ds = super::WebDataset::open(dir.path()).unwrap();
        assert_eq!(ds.len(), 1);
        assert_eq!(ds.problems().len(), 1);
        assert!(
            ds.problems()[0].to_string().contains("cat/2.jpg"),
            "{}",
            ds.problems()[0]
        );
    }

    #[test]
    fn images_outside_any_folder_are_not_an_imagefolder() {
        let dir = tempfile::tempdir().unwrap();
        shard(
            &dir.path().join("a.tar"),
            &[("1.jpg", b"x"), ("c/2.jpg", b"y")],
        );
        assert!(super::WebDataset::open(dir.path()).is_err());
    }

    #[test]
    fn keys_split_at_the_first_dot_of_the_file_name() {
        assert_eq!(
            split_key("a/b.c/sample01.seg.png"),
            ("a/b.c/sample01", "seg.png")
        );
        assert_eq!(split_key("x.jpg"), ("x", "jpg"));
        assert_eq!(split_key("noext"), ("noext", ""));
    }
}
