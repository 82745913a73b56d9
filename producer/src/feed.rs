//! The producer's feed: which dataset index goes into which sequence number.
//!
//! Producer-epoch `e` covers sequences `[e·N, (e+1)·N)` in the order `π_e`. `π_0` is a seeded
//! shuffle; `π_{e+1}` shuffles `π_e` inside each segment between consecutive *cut points*, the
//! offsets `p = start mod N` of the live consumers that joined mid-epoch. That keeps the set
//! `π[0..p)` the same in every later epoch, so a consumer whose epochs are windows of `N` sequences
//! starting at offset `p` sees every index exactly once per epoch (`docs/epochs-and-groups.md`,
//! "Epochs"). With no cut point the next epoch is a full reshuffle.

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

/// The feed and the consumers' epoch plans together, as a model without processes: any
/// interleaving of joins, let-gos with rejoins, kills and resumes from saved positions, and
/// moves to skimming and back (a skimmer takes what passes when its pace lets it) keeps
/// every epoch of every consumer exact (a whole consumer's epoch: each index once; a rank's:
/// exactly its share).
#[cfg(test)]
mod model {
    use super::*;
    use ladle_consumer::epochs::Epochs;
    use ladle_consumer::plan::{Bitmap, Even, GroupSpec};
    use proptest::prelude::*;

    /// One consumer: the SDK's own epoch machine (`ladle_consumer::epochs`), its cut point,
    /// and where it reads next.
    struct Reader {
        epochs: Epochs,
        group: Option<GroupSpec>,
        /// Where its current attachment started (its cut point is this mod N).
        start: u64,
        /// The first sequence it has not read.
        next_seq: u64,
        epochs_done: u64,
        /// Skimming: it has no cut point, and takes a sample that passes only when its own
        /// pace lets it: with one chance in `skim` (the rest roll out of the ring unseen).
        skim: Option<u64>,
    }

    impl Reader {
        fn join(n: u64, seq: u64, group: Option<GroupSpec>, resume: Option<(u64, Bitmap)>) -> Self {
            let mut epochs = Epochs::new(n, seq, group.clone(), 4, false).unwrap();
            if let Some((epoch, delivered)) = resume {
                epochs.load(epoch, &delivered).unwrap();
            }
            let begun = epochs.begin().unwrap();
            Self {
                epochs,
                group,
                start: seq,
                next_seq: begun.start.unwrap(),
                epochs_done: 0,
                skim: None,
            }
        }

        /// Whether a skimmer at one chance in `skim` takes sequence `seq` (a fixed hash: its
        /// pace, not the sample, decides).
        fn takes(skim: u64, seq: u64) -> bool {
            (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % skim == 0
        }

        /// Sequence `seq` holding `index` passes: the epoch delivers it if its plan wants
        /// it; an epoch whose window ends must be complete, and one that completes early (a
        /// gathered one) hands over to the next, which starts where its window ends.
        fn pass(&mut self, seq: u64, index: u64) {
            if seq < self.next_seq {
                return;
            }
            self.next_seq = seq + 1;
            if let Some(skim) = self.skim {
                // No window: whatever passes, until complete; the next epoch begins here.
                if Self::takes(skim, seq) {
                    self.epochs.deliver(index);
                }
                if self.epochs.is_complete() {
                    self.epochs_done += 1;
                    self.epochs.begin().unwrap();
                }
                return;
            }
            self.epochs.deliver(index);
            let number = self.epochs.current().unwrap();
            let end = self.epochs.end(number).unwrap();
            if self.epochs.is_complete() || seq + 1 == end {
                assert!(
                    self.epochs.is_complete(),
                    "epoch {number} (window ending at {end}) ended with {} of {} delivered",
                    self.epochs.delivered(),
                    self.epochs.samples()
                );
                self.epochs_done += 1;
                let begun = self.epochs.begin().unwrap();
                self.next_seq = self.next_seq.max(begun.start.unwrap());
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// A consumer joins: whole, or rank `rank` of a group of `world`.
        Join { rank: Option<(u32, u32)> },
        /// Consumer `which` is let go and rejoins at the producer's next sequence: its epoch
        /// goes on in the window from there.
        LetGoAndRejoin { which: usize },
        /// Consumer `which` dies; one that saved its position resumes it at the next sequence.
        KillAndResume { which: usize },
        /// Consumer `which` is asked to skim (it held the others back): its cut point
        /// dissolves, and it takes one passing sample in `1 + slower`.
        Skim { which: usize, slower: u64 },
        /// Consumer `which`, skimming, paces the feed again: attached at the next sequence.
        AttachAgain { which: usize },
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            prop::option::of((0u32..3, 1u32..4)).prop_map(|rank| Event::Join {
                rank: rank.map(|(r, w)| (r % w, w))
            }),
            (0usize..8).prop_map(|which| Event::LetGoAndRejoin { which }),
            (0usize..8).prop_map(|which| Event::KillAndResume { which }),
            ((0usize..8), (0u64..3)).prop_map(|(which, slower)| Event::Skim { which, slower }),
            (0usize..8).prop_map(|which| Event::AttachAgain { which }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn every_epoch_stays_exact_through_joins_let_gos_kills_resumes_and_skims(
            n in 3u64..60,
            seed in any::<u64>(),
            events in prop::collection::vec((0u64..150, event()), 1..12),
            even_drop in any::<bool>(),
        ) {
            let mut feed = Feed::new(n, seed);
            let mut cuts = CutPoints::default();
            let mut readers: Vec<Reader> = Vec::new();
            let mut events = events;
            events.sort_by_key(|(at, _)| *at);
            // A skimmer at one chance in 3 may need many passes for its last samples.
            let end = events.last().map_or(0, |(at, _)| *at) + 60 * n;
            let even = if even_drop { Even::Drop } else { Even::Pad };
            let mut next_event = events.into_iter().peekable();
            for seq in 0..end {
                // Events take effect before sequence `seq` is produced.
                while next_event.peek().is_some_and(|(at, _)| *at <= seq) {
                    let (_, e) = next_event.next().unwrap();
                    match e {
                        Event::Join { rank } => {
                            let group = rank.filter(|&(_, w)| u64::from(w) <= n).map(|(rank, world_size)| GroupSpec {
                                name: "job".into(), rank, world_size, even,
                            });
                            cuts.add(seq % n);
                            readers.push(Reader::join(n, seq, group, None));
                        }
                        Event::LetGoAndRejoin { which } | Event::AttachAgain { which }
                            if !readers.is_empty() =>
                        {
                            // A skimmer is never let go; it attaches again the same way.
                            let len = readers.len();
                            let r = &mut readers[which % len];
                            if r.skim.take().is_none() {
                                cuts.remove(r.start % n);
                            }
                            cuts.add(seq % n);
                            r.start = seq;
                            // The epoch in progress goes on from the rejoin point.
                            r.next_seq = r.epochs.rejoined(seq);
                        }
                        Event::KillAndResume { which } if !readers.is_empty() => {
                            let i = which % readers.len();
                            let dead = readers.swap_remove(i);
                            if dead.skim.is_none() {
                                cuts.remove(dead.start % n);
                            }
                            let saved = dead.epochs.saved();
                            cuts.add(seq % n);
                            readers.push(Reader::join(n, seq, dead.group, Some(saved)));
                        }
                        Event::Skim { which, slower } if !readers.is_empty() => {
                            let len = readers.len();
                            let r = &mut readers[which % len];
                            if r.skim.is_none() {
                                cuts.remove(r.start % n);
                                r.epochs.skim();
                                r.skim = Some(1 + slower);
                            }
                        }
                        _ => {}
                    }
                }
                let (index, _) = feed.index_of(seq, &cuts);
                for r in &mut readers {
                    r.pass(seq, index);
                }
            }
            // Every consumer finished at least two epochs after the last event, each exact.
            for r in &readers {
                prop_assert!(r.epochs_done >= 2, "a consumer finished {} epochs", r.epochs_done);
            }
        }
    }
}
