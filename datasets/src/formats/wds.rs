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
        let (dir, shard_paths): (&Path, Vec<PathBuf>) = if path.is_file() {
            (path.parent().unwrap_or(Path::new(".")), vec![path.into()])
        } else {
            let shards = list_dir(path)?
                .into_iter()
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "tar"))
                .collect();
            (path, shards)
        };
        let classes_file = dir.join("classes.txt");
        let named_classes = if classes_file.is_file() {
            Some(read_class_names(&classes_file)?)
        } else {
            None
        };

        let mut shards = Vec::new();
        let mut members = Vec::new();
        let mut problems = Vec::new();
        for (shard_no, shard_path) in shard_paths.into_iter().enumerate() {
            let (file, _) = super::open_index_file(&shard_path)?;
            index_shard(shard_no, &shard_path, &file, &mut members, &mut problems)?;
            shards.push(Shard {
                path: shard_path,
                file,
            });
        }

        let classes = match named_classes {
            Some(names) => names,
            None => {
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

fn index_shard(
    shard_no: usize,
    shard_path: &Path,
    file: &std::fs::File,
    members: &mut Vec<Member>,
    problems: &mut Vec<SampleError>,
) -> Result<(), OpenError> {
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
        match label {
            None => problems.push(SampleError::MissingLabel {
                location: location(&name),
            }),
            Some(Err(text)) => problems.push(SampleError::BadLabel {
                location: location(&name),
                label: text,
            }),
            Some(Ok(_)) if offset + len > file_len => problems.push(SampleError::Io {
                location: location(&name),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "member runs past the end of the shard (truncated tar)",
                ),
            }),
            Some(Ok(label)) => members.push(Member {
                shard: shard_no,
                name,
                offset,
                len,
                label,
            }),
        }
    }
    Ok(())
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
    use super::split_key;

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
