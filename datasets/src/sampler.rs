//! The per-epoch seeded permutation sampler.
//!
//! Epoch `e`'s order is a Fisher–Yates shuffle of `0..len` driven by
//! [`SampleRng`] seeded from `(seed, e)`: the same seed gives the same
//! order on every machine. The producer (`docs/epochs-and-groups.md`, "Epochs") builds later epochs
//! by shuffling inside segments with [`EpochSampler::shuffle_segment`].
//!
//! **Streamed datasets** ([`Grouping`]: shards that arrive over the network, samples stored
//! in runs) are shuffled in windows instead of whole: a segment's samples are gathered by
//! shard, the shards put in a seeded random order, and the samples of each run of
//! `window` consecutive shards in that order shuffled together (MosaicML streaming's
//! block shuffle, over shards). A window's shards are all a feed needs on disk at once, so it
//! serves while later shards arrive. Each epoch is still an exact permutation, and cut
//! points keep their sets; only how far a sample may move is bounded: it lands anywhere in
//! its window, which is uniform over the window's positions (against WebDataset's shard
//! shuffle plus a buffer, where a sample can only move a buffer's length and early samples
//! of a shard tend to come out early).

use std::sync::Arc;

use crate::rng::{SampleRng, Stream};

/// How a streamed dataset's samples are stored: `ends[k]` is one past the last index of
/// shard `k` (shards hold consecutive indices, in order), and a window is `window` shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouping {
    /// One past the last sample index of each shard, ascending; the last is the length.
    pub ends: Arc<[u64]>,
    /// Shards shuffled together (at least 1).
    pub window: usize,
}

impl Grouping {
    /// The shard holding sample `index`.
    pub fn shard_of(&self, index: u64) -> usize {
        self.ends.partition_point(|&end| end <= index)
    }
}

/// Seeded permutations of `0..len`, one per epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochSampler {
    len: u64,
    seed: u64,
    grouping: Option<Grouping>,
}

impl EpochSampler {
    /// A sampler over `len` samples.
    pub fn new(len: u64, seed: u64) -> Self {
        Self {
            len,
            seed,
            grouping: None,
        }
    }

    /// A sampler over a streamed dataset's samples, shuffled a window of shards at a time.
    pub fn grouped(len: u64, seed: u64, grouping: Grouping) -> Self {
        Self {
            len,
            seed,
            grouping: Some(grouping),
        }
    }

    /// Number of samples in each epoch.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the dataset is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The order of epoch `epoch`: a permutation of `0..len`.
    pub fn order(&self, epoch: u64) -> Vec<u64> {
        let mut order: Vec<u64> = (0..self.len).collect();
        self.shuffle_segment(&mut order, epoch, 0);
        order
    }

    /// Shuffles `segment` in place with the stream of `(seed, epoch, segment_id)`.
    ///
    /// Shuffling each segment between cut points of the previous epoch's order keeps the
    /// set of samples before every cut point unchanged, which is what gives late joiners
    /// exact coverage (`docs/epochs-and-groups.md`, "Epochs").
    ///
    /// With a [`Grouping`], the segment's samples are first gathered by shard, the shards
    /// put in a random order, and each window of shards shuffled on its own.
    pub fn shuffle_segment(&self, segment: &mut [u64], epoch: u64, segment_id: u64) {
        let mut rng = SampleRng::new(Stream::Shuffle, self.seed, epoch, segment_id);
        let Some(grouping) = &self.grouping else {
            fisher_yates(segment, &mut rng);
            return;
        };
        let mut by_shard: std::collections::BTreeMap<usize, Vec<u64>> = Default::default();
        for &index in segment.iter() {
            by_shard
                .entry(grouping.shard_of(index))
                .or_default()
                .push(index);
        }
        let mut shards: Vec<Vec<u64>> = by_shard.into_values().collect();
        for i in (1..shards.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            shards.swap(i, j);
        }
        let mut at = 0;
        for window in shards.chunks(grouping.window.max(1)) {
            let start = at;
            for samples in window {
                segment[at..at + samples.len()].copy_from_slice(samples);
                at += samples.len();
            }
            fisher_yates(&mut segment[start..at], &mut rng);
        }
    }
}

fn fisher_yates(items: &mut [u64], rng: &mut SampleRng) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_is_a_permutation_and_epochs_differ() {
        let s = EpochSampler::new(1000, 5);
        let a = s.order(0);
        let b = s.order(1);
        for order in [&a, &b] {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        }
        assert_ne!(a, b);
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn the_same_seed_gives_the_same_order_and_another_seed_does_not() {
        assert_eq!(
            EpochSampler::new(500, 9).order(3),
            EpochSampler::new(500, 9).order(3)
        );
        assert_ne!(
            EpochSampler::new(500, 9).order(3),
            EpochSampler::new(500, 10).order(3)
        );
    }

    #[test]
    fn the_order_is_pinned_across_versions() {
        // A fixed expectation: if this changes, every user's epoch order changes with it.
        assert_eq!(EpochSampler::new(8, 0).order(0), PINNED_ORDER);
    }

    const PINNED_ORDER: [u64; 8] = [7, 1, 4, 3, 2, 6, 0, 5];

    #[test]
    fn a_grouped_epoch_is_a_permutation_whose_windows_each_hold_whole_shards() {
        // 10 shards of uneven sizes, windows of 3 shards.
        let sizes = [7u64, 3, 12, 5, 9, 1, 8, 4, 6, 10];
        let ends: Vec<u64> = sizes
            .iter()
            .scan(0, |acc, s| {
                *acc += s;
                Some(*acc)
            })
            .collect();
        let len = *ends.last().unwrap();
        let grouping = Grouping {
            ends: ends.into(),
            window: 3,
        };
        let s = EpochSampler::grouped(len, 5, grouping.clone());
        let a = s.order(0);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..len).collect::<Vec<_>>());
        assert_ne!(a, s.order(1));
        // Walk the order: each window's positions hold exactly the samples of its shards
        // (3, the last window 1), each shard whole within one window.
        let mut at = 0usize;
        let mut seen_shards = std::collections::HashSet::new();
        for window in [3usize, 3, 3, 1] {
            let mut shards = std::collections::HashSet::new();
            let mut need = 0u64;
            let mut end = at;
            while shards.len() < window || ((end - at) as u64) < need {
                let shard = grouping.shard_of(a[end]);
                if shards.insert(shard) {
                    need += sizes[shard];
                    assert!(seen_shards.insert(shard), "shard {shard} in two windows");
                }
                end += 1;
            }
            assert_eq!((end - at) as u64, need, "a window holds its shards whole");
            let mut shuffled = a[at..end].to_vec();
            shuffled.sort_unstable();
            assert_ne!(a[at..end], shuffled, "a window is shuffled");
            at = end;
        }
        assert_eq!(at, a.len());
    }

    #[test]
    fn a_grouped_segment_keeps_its_set_and_an_ungrouped_order_is_unchanged() {
        let grouping = Grouping {
            ends: vec![10u64, 20, 30, 40].into(),
            window: 1,
        };
        let s = EpochSampler::grouped(40, 2, grouping);
        let mut segment: Vec<u64> = vec![3, 15, 4, 39, 22, 11, 0];
        let before: std::collections::BTreeSet<u64> = segment.iter().copied().collect();
        s.shuffle_segment(&mut segment, 1, 4);
        let after: std::collections::BTreeSet<u64> = segment.iter().copied().collect();
        assert_eq!(before, after);
        // Window 1: each shard's samples are consecutive.
        let shards: Vec<u64> = segment.iter().map(|i| i / 10).collect();
        let mut runs = shards.clone();
        runs.dedup();
        let mut distinct = runs.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(runs.len(), distinct.len(), "{segment:?}");
        assert_eq!(EpochSampler::new(8, 0).order(0), PINNED_ORDER);
    }

    #[test]
    fn empty_and_single_sample_datasets_work() {
        assert!(EpochSampler::new(0, 1).order(0).is_empty());
        assert_eq!(EpochSampler::new(1, 1).order(4), vec![0]);
    }
}
