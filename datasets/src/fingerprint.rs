//! What a dataset's samples are, independent of where it lies: the identity a saved position
//! is checked against, so that the same data resumes from any path (`a/` or `a`, a symbolic
//! link, a copy a requeued job staged under `$TMPDIR`) and changed data is refused, naming
//! what changed.
//!
//! A [`Fingerprint`] is two digests over the samples in index order:
//!
//! - `files`: each sample's name relative to the dataset's root (ImageFolder: `class/…/file`;
//!   WebDataset: `shard.tar:member`; CIFAR: `batch.bin#record`), so a file renamed, added,
//!   removed or moved to another class changes it;
//! - `sizes`: each sample's size in bytes, so a file rewritten with other contents nearly
//!   always changes it.
//!
//! Modification times are left out on purpose: a staging copy changes them and nothing else.
//! Contents of equal size are not read (that would cost a pass over the data at every start):
//! a file rewritten in place to exactly the same size is the one change it cannot see.
//!
//! Cost: one `stat` per ImageFolder file (WebDataset members and CIFAR records have their
//! sizes from the index already), spread over threads; measured on a large folder in
//! `benches/README.md`, "Dataset fingerprint".

/// Digests of a dataset's sample names and sizes, in index order: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fingerprint {
    /// FNV-1a 64 of each sample's relative name and a NUL, 16 hex digits.
    pub files: String,
    /// FNV-1a 64 of each sample's size (`u64`, little-endian), 16 hex digits.
    pub sizes: String,
}

/// FNV-1a, 64 bits: the hash positions already use (stable across builds and platforms).
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Adds `bytes`.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The digest, 16 hex digits.
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

/// The fingerprint of samples given as `(relative name, size)` in index order.
pub fn of<'a>(samples: impl IntoIterator<Item = (&'a [u8], u64)>) -> Fingerprint {
    let (mut files, mut sizes) = (Fnv::default(), Fnv::default());
    for (name, size) in samples {
        files.write(name);
        files.write(&[0]);
        sizes.write(&size.to_le_bytes());
    }
    Fingerprint {
        files: files.hex(),
        sizes: sizes.hex(),
    }
}

/// The sizes of `paths` (following links; `u64::MAX` for one that cannot be stat'ed), with
/// the `stat` calls spread over up to 8 threads: on a network file system each is a round
/// trip.
pub(crate) fn sizes_of(paths: &[&std::path::Path]) -> Vec<u64> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let chunk = paths.len().div_ceil(threads).max(4096);
    let mut sizes = vec![0u64; paths.len()];
    std::thread::scope(|scope| {
        for (paths, sizes) in paths.chunks(chunk).zip(sizes.chunks_mut(chunk)) {
            scope.spawn(move || {
                for (path, size) in paths.iter().zip(sizes) {
                    *size = std::fs::metadata(path).map_or(u64::MAX, |m| m.len());
                }
            });
        }
    });
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sizes_are_digested_apart_and_in_order() {
        let a = of([(&b"c/x.jpg"[..], 10), (&b"c/y.jpg"[..], 20)]);
        assert_eq!(a, of([(&b"c/x.jpg"[..], 10), (&b"c/y.jpg"[..], 20)]));
        let renamed = of([(&b"c/x.jpg"[..], 10), (&b"c/z.jpg"[..], 20)]);
        assert_ne!(a.files, renamed.files);
        assert_eq!(a.sizes, renamed.sizes);
        let rewritten = of([(&b"c/x.jpg"[..], 10), (&b"c/y.jpg"[..], 21)]);
        assert_eq!(a.files, rewritten.files);
        assert_ne!(a.sizes, rewritten.sizes);
        // The NUL keeps `ab` + `c` apart from `a` + `bc`.
        assert_ne!(
            of([(&b"ab"[..], 1), (&b"c"[..], 1)]).files,
            of([(&b"a"[..], 1), (&b"bc"[..], 1)]).files
        );
    }

    #[test]
    fn sizes_follow_links_and_mark_what_cannot_be_stated() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let missing = dir.path().join("missing");
        let paths = [file.as_path(), link.as_path(), missing.as_path()];
        assert_eq!(sizes_of(&paths), vec![5, 5, u64::MAX]);
    }
}
