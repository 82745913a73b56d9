//! The producer's feed: which dataset index goes into which sequence number.
//!
//! Producer-epoch `e` covers sequences `[e·N, (e+1)·N)` in the order `π_e`. `π_0` is a seeded
//! shuffle; `π_{e+1}` shuffles `π_e` inside each segment between consecutive *cut points*, the
//! offsets `p = start mod N` of the live consumers that joined mid-epoch. That keeps the set
//! `π[0..p)` the same in every later epoch, so a consumer whose epochs are windows of `N` sequences
//! starting at offset `p` sees every index exactly once per epoch (`docs/ARCHITECTURE.md`, "Late
//! joiners"). With no cut point the next epoch is a full reshuffle.

use std::collections::BTreeMap;

use ladle_datasets::sampler::EpochSampler;

/// Live cut points (offsets into the epoch), counted: two consumers may share one.
#[derive(Debug, Default, Clone)]
pub(crate) struct CutPoints(BTreeMap<u64, usize>);

impl CutPoints {
    pub(crate) fn add(&mut self, offset: u64) {
        if offset != 0 {
            *self.0.entry(offset).or_default() += 1;
        }
    }

    pub(crate) fn remove(&mut self, offset: u64) {
        if let Some(n) = self.0.get_mut(&offset) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&offset);
            }
        }
    }

    fn offsets(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.keys().copied()
    }
}

/// The permutation of the current producer-epoch and how to build the next.
#[derive(Debug)]
pub(crate) struct Feed {
    sampler: EpochSampler,
    epoch: u64,
    order: Vec<u64>,
}

impl Feed {
    pub(crate) fn new(len: u64, seed: u64) -> Self {
        let sampler = EpochSampler::new(len, seed);
        Self {
            sampler,
            epoch: 0,
            order: sampler.order(0),
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.sampler.len()
    }

    /// The dataset index and producer-epoch of sequence `seq`. Sequences must be asked for
    /// in order; crossing into a new epoch builds its permutation from the cut points.
    pub(crate) fn index_of(&mut self, seq: u64, cuts: &CutPoints) -> (u64, u64) {
        let n = self.len();
        let epoch = seq / n;
        while self.epoch < epoch {
            self.advance(cuts);
        }
        (self.order[(seq % n) as usize], epoch)
    }

    fn advance(&mut self, cuts: &CutPoints) {
        self.epoch += 1;
        let n = self.len();
        let mut start = 0u64;
        for (segment, end) in cuts.offsets().chain([n]).enumerate() {
            let range = start as usize..end as usize;
            self.sampler
                .shuffle_segment(&mut self.order[range], self.epoch, segment as u64);
            start = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_consumer_joining_at_any_offset_sees_each_index_once_per_own_epoch() {
        let n = 50u64;
        for join in [0u64, 1, 17, 49, 50, 73, 120] {
            let mut feed = Feed::new(n, 3);
            let mut cuts = CutPoints::default();
            // Sequences before the join were produced with no cut points yet.
            for seq in 0..join {
                feed.index_of(seq, &cuts);
            }
            cuts.add(join % n);
            for k in 0..4 {
                let epoch: Vec<u64> = (join + k * n..join + (k + 1) * n)
                    .map(|s| feed.index_of(s, &cuts).0)
                    .collect();
                let distinct: HashSet<u64> = epoch.iter().copied().collect();
                assert_eq!(distinct.len() as u64, n, "join {join}, own epoch {k}");
            }
        }
    }

    #[test]
    fn epochs_are_reshuffled_even_with_cut_points() {
        let mut feed = Feed::new(100, 1);
        let mut cuts = CutPoints::default();
        cuts.add(30);
        cuts.add(70);
        let e0: Vec<u64> = (0..100).map(|s| feed.index_of(s, &cuts).0).collect();
        let e1: Vec<u64> = (100..200).map(|s| feed.index_of(s, &cuts).0).collect();
        assert_ne!(e0, e1);
        for (lo, hi) in [(0, 30), (30, 70), (70, 100)] {
            let a: HashSet<_> = e0[lo..hi].iter().collect();
            let b: HashSet<_> = e1[lo..hi].iter().collect();
            assert_eq!(a, b, "segment {lo}..{hi} must keep its set");
        }
        cuts.remove(30);
        cuts.remove(70);
        assert_eq!(cuts.offsets().count(), 0);
    }
}
