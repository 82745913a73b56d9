//! A decoded-sample cache as the decode path sees it (issue 44, first step): decoded pixels
//! before any augmentation, keyed by the sample's index and its file's [`Stamp`], so that a
//! feed decodes an image once and augments it anew every epoch and for every seed.
//!
//! [`SampleProcessor::set_cache`](crate::pipeline::SampleProcessor::set_cache) hands a
//! processor a [`DecodedCache`]; without one (the default everywhere today) the decode path is
//! unchanged. With one, for a sample stored encoded whose file has a [`Stamp`]:
//! - **hit** (an entry of the same stamp): the entry is checked against *this* feed's limits
//!   (a file over `max_file_bytes`, an image over `max_pixels`: the error a decode gives) and
//!   augmented from the whole image, which is exactly the whole-image decode path, so the
//!   pixels are bit-identical to a decode (crop-aware or not: `pipeline.rs`' tests);
//! - **miss the cache will take** ([`Lookup::Fill`]): the whole image is decoded, given to the
//!   cache, and augmented. A file the whole decoder refuses (one corrupt only below a crop)
//!   is released and takes today's crop-aware path: it decodes as it did, and nothing is
//!   cached;
//! - **miss it will not take** (over its budget, another feed filling it): today's path.
//!
//! An entry of another stamp is stale (the file was rewritten since it was cached): never
//! served. The stamp is the file's size and modification time in nanoseconds, taken before
//! it is read, so a file rewritten between the two is cached under its old stamp and refilled
//! at the next lookup, never served as fresh. It is freshness, not identity: the dataset's
//! identity leaves modification times out ([`crate::fingerprint`]) so that a staged copy
//! resumes; a cache of one copy is not a cache of another. What a stamp cannot see: a file
//! rewritten to its old size within one modification-time tick.
//!
//! [`HeapCache`] is the in-process cache (tests, benchmarks, one feed); the shared-memory cache
//! every feed of a dataset reads implements the same trait.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::decode::RgbImage;

/// A sample file's size and modification time: what an entry was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// The file's size in bytes.
    pub size: u64,
    /// Its modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
}

/// A cached image: `height × width × 3` bytes of RGB, row-major, as [`crate::decode::Decoder`]
/// gives them.
#[derive(Clone)]
pub struct CachedImage {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The pixels (a heap buffer, or a shared mapping).
    pub pixels: Arc<dyn AsRef<[u8]> + Send + Sync>,
}

impl fmt::Debug for CachedImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedImage")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("bytes", &(*self.pixels).as_ref().len())
            .finish()
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// An entry of this stamp.
    Hit(CachedImage),
    /// None, and the cache takes one: decode the whole image and [`DecodedCache::fill`] it
    /// (or [`DecodedCache::release`] it when that fails).
    Fill,
    /// None, and the cache takes none now (over its budget, or another is filling it).
    Skip,
}

/// A cache of decoded images by sample index (see the [module docs](self)).
pub trait DecodedCache: Send + Sync + fmt::Debug {
    /// The entry of sample `index` if it was decoded from a file of `stamp`. An entry of
    /// another stamp is stale and never returned.
    fn lookup(&self, index: u64, stamp: Stamp) -> Lookup;

    /// The whole decoded image of sample `index`, after a [`Lookup::Fill`]. Published whole
    /// or not at all; an image that does not fit the budget is not taken, and nothing in
    /// the cache is evicted for it.
    fn fill(&self, index: u64, stamp: Stamp, image: &RgbImage<'_>);

    /// A [`Lookup::Fill`] that will not be filled (the whole decode failed).
    fn release(&self, index: u64);
}

/// The in-process cache: entries on the heap, at most `budget` bytes of pixels, kept once in
/// (CoorDL's rule: nothing is evicted to admit another); a stale entry is dropped when met.
#[derive(Debug)]
pub struct HeapCache {
    budget: u64,
    state: Mutex<HeapState>,
}

#[derive(Debug, Default)]
struct HeapState {
    entries: HashMap<u64, (Stamp, CachedImage)>,
    /// Samples a processor was told to fill and has not yet.
    filling: std::collections::HashSet<u64>,
    used: u64,
    /// A fill did not fit: no more are asked for until room returns.
    full: bool,
    hits: u64,
    fills: u64,
}

/// What a [`HeapCache`] holds and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapCacheStats {
    /// Entries held.
    pub entries: u64,
    /// Bytes of pixels held.
    pub bytes: u64,
    /// Lookups answered with an entry.
    pub hits: u64,
    /// Entries filled.
    pub fills: u64,
}

impl HeapCache {
    /// An empty cache of at most `budget` bytes of pixels.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            state: Mutex::default(),
        }
    }

    /// What it holds and did so far.
    pub fn stats(&self) -> HeapCacheStats {
        let state = self.state();
        HeapCacheStats {
            entries: state.entries.len() as u64,
            bytes: state.used,
            hits: state.hits,
            fills: state.fills,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HeapState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DecodedCache for HeapCache {
    fn lookup(&self, index: u64, stamp: Stamp) -> Lookup {
        let mut state = self.state();
        match state.entries.get(&index) {
            Some((s, image)) if *s == stamp => {
                let image = image.clone();
                state.hits += 1;
                return Lookup::Hit(image);
            }
            Some(_) => {
                // Stale: the file changed since. Its room returns.
                if let Some((_, old)) = state.entries.remove(&index) {
                    state.used -= (*old.pixels).as_ref().len() as u64;
                    state.full = false;
                }
            }
            None => {}
        }
        if state.full || !state.filling.insert(index) {
            Lookup::Skip
        } else {
            Lookup::Fill
        }
    }

    fn fill(&self, index: u64, stamp: Stamp, image: &RgbImage<'_>) {
        let mut state = self.state();
        state.filling.remove(&index);
        let len = image.pixels.len() as u64;
        if state.entries.contains_key(&index) {
            return;
        }
        if state.used.saturating_add(len) > self.budget {
            state.full = true;
            return;
        }
        let pixels: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(image.pixels.to_vec());
        let entry = CachedImage {
            width: image.width,
            height: image.height,
            pixels,
        };
        state.entries.insert(index, (stamp, entry));
        state.used += len;
        state.fills += 1;
    }

    fn release(&self, index: u64) {
        self.state().filling.remove(&index);
    }
}

#[cfg(test)]
mod tests;
