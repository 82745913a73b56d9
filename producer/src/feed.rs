//! The producer's feed: which dataset index goes into which sequence number.
//!
//! Producer-epoch `e` covers sequences `[e·N, (e+1)·N)` in the order `π_e`. `π_0` is a seeded
//! shuffle; `π_{e+1}` shuffles `π_e` inside each segment between consecutive *cut points*, the
//! offsets `p = start mod N` of the live consumers that joined mid-epoch. That keeps the set
//! `π[0..p)` the same in every later epoch, so a consumer whose epochs are windows of `N` sequences
//! starting at offset `p` sees every index exactly once per epoch (`docs/epochs-and-groups.md`,
//! "Epochs"). With no cut point the next epoch is a full reshuffle.

use std::collections::BTreeMap;
use std::sync::Arc;

use ladle_datasets::Streamed;
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
    /// A dataset whose shards arrive while it is read: told each epoch's order.
    stream: Option<Arc<dyn Streamed>>,
}

impl Feed {
    #[cfg(test)]
    pub(crate) fn new(len: u64, seed: u64) -> Self {
        Self::over(len, seed, None)
    }

    /// A feed over a dataset that may be streamed: then its epochs are shuffled a window of
    /// shards at a time, and it is told each order as it is built.
    pub(crate) fn over(len: u64, seed: u64, stream: Option<Arc<dyn Streamed>>) -> Self {
        let sampler = match &stream {
            Some(stream) => EpochSampler::grouped(len, seed, stream.grouping()),
            None => EpochSampler::new(len, seed),
        };
        let order = sampler.order(0);
        let feed = Self {
            sampler,
            epoch: 0,
            order,
            stream,
        };
        feed.tell();
        feed
    }

    fn tell(&self) {
        if let Some(stream) = &self.stream {
            stream.schedule(self.epoch * self.len(), self.order.clone().into());
        }
    }

    /// Tells a streamed dataset that every sequence before `done` is decoded.
    pub(crate) fn reached(&self, done: u64) {
        if let Some(stream) = &self.stream {
            stream.reached(done);
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
        self.tell();
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

    /// A streamed dataset of 10 shards of 7 samples that records what it is told.
    #[derive(Debug, Default)]
    struct Told {
        schedules: std::sync::Mutex<Vec<(u64, Arc<[u64]>)>>,
        reached: std::sync::atomic::AtomicU64,
    }

    impl Streamed for Told {
        fn grouping(&self) -> ladle_datasets::sampler::Grouping {
            ladle_datasets::sampler::Grouping {
                ends: (1..=10).map(|k| k * 7).collect(),
                window: 3,
            }
        }
        fn schedule(&self, first: u64, order: Arc<[u64]>) {
            self.schedules.lock().unwrap().push((first, order));
        }
        fn reached(&self, done: u64) {
            self.reached
                .fetch_max(done, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn a_streamed_feed_keeps_exact_coverage_for_late_joiners_and_tells_each_epochs_order() {
        let n = 70u64;
        for join in [0u64, 5, 33, 69, 101] {
            let told = Arc::new(Told::default());
            let mut feed = Feed::over(n, 4, Some(told.clone()));
            let mut cuts = CutPoints::default();
            let mut served = Vec::new();
            for seq in 0..join {
                served.push(feed.index_of(seq, &cuts).0);
            }
            cuts.add(join % n);
            for k in 0..3 {
                let epoch: Vec<u64> = (join + k * n..join + (k + 1) * n)
                    .map(|s| feed.index_of(s, &cuts).0)
                    .collect();
                let distinct: HashSet<u64> = epoch.iter().copied().collect();
                assert_eq!(distinct.len() as u64, n, "join {join}, own epoch {k}");
                served.extend(epoch);
            }
            // Every producer-epoch's order was told, from its first sequence, as served.
            let schedules = told.schedules.lock().unwrap();
            for (seq, &index) in served.iter().enumerate() {
                let (first, order) = &schedules[seq / n as usize];
                assert_eq!(*first, (seq as u64 / n) * n);
                assert_eq!(order[seq % n as usize], index, "join {join}, seq {seq}");
            }
            assert!(schedules.len() as u64 >= (join + 3 * n).div_ceil(n));
        }
        // Without a cut point, the first epoch's windows hold whole shards: its first 21
        // positions are the samples of 3 shards.
        let told = Arc::new(Told::default());
        let mut feed = Feed::over(n, 9, Some(told));
        let cuts = CutPoints::default();
        let first: HashSet<u64> = (0..21).map(|s| feed.index_of(s, &cuts).0 / 7).collect();
        assert_eq!(first.len(), 3, "{first:?}");
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
        /// What the producer knows it needs (its declarations, once they arrived).
        needs: crate::needs::Needs,
        /// Declarations sent and not arrived yet: `(arrives at, from, to, words)`.
        pending: Vec<(u64, u64, u64, Vec<u64>)>,
        /// How many positions a declaration takes to arrive.
        lag: u64,
    }

    impl Reader {
        fn join(
            n: u64,
            seq: u64,
            group: Option<GroupSpec>,
            resume: Option<(u64, Bitmap)>,
            lag: u64,
        ) -> Self {
            let mut epochs = Epochs::new(n, seq, group.clone(), 4, false).unwrap();
            if let Some((epoch, delivered)) = resume {
                epochs.load(epoch, &delivered).unwrap();
            }
            let begun = epochs.begin().unwrap();
            let mut reader = Self {
                epochs,
                group,
                start: seq,
                next_seq: begun.start.unwrap(),
                epochs_done: 0,
                skim: None,
                needs: crate::needs::Needs::default(),
                pending: Vec::new(),
                lag,
            };
            reader.declare(seq);
            reader
        }

        /// Sends what the SDK says its epoch needs (if gathered), and a rank's next epoch,
        /// arriving `lag` later, as the SDK's `Consumer::declare` does.
        fn declare(&mut self, seq: u64) {
            if let Some((from, to, words)) = self.epochs.declaration() {
                self.pending.push((seq + self.lag, from, to, words));
                if let Some((from, to, words)) = self.epochs.next_declaration() {
                    self.pending.push((seq + self.lag, from, to, words));
                }
            }
        }

        /// Declarations that arrived by `seq` are installed, as the server does.
        fn arrive(&mut self, seq: u64) {
            let (now, later): (Vec<_>, Vec<_>) =
                self.pending.drain(..).partition(|(at, ..)| *at <= seq);
            self.pending = later;
            for (_, from, to, words) in now {
                self.needs.declare(self.start, from, to, words).unwrap();
            }
        }

        /// Whether the producer thinks it needs `index` at `seq` (a skimmer too: it declares
        /// an open window, protocol 16).
        fn needs(&self, seq: u64, index: u64) -> bool {
            self.needs.needs(seq, index)
        }

        /// Sequence `seq` passes as a hole: nothing to deliver, but a window may end (a
        /// skimmer has none: it waits for its indices to pass again, decoded).
        fn pass_hole(&mut self, seq: u64) {
            if seq < self.next_seq {
                return;
            }
            self.next_seq = seq + 1;
            if self.skim.is_none() {
                self.window_may_end(seq);
            }
        }

        /// After sequence `seq`: an epoch whose window ends must be complete, and one that
        /// completes early (a gathered one) hands over to the next.
        fn window_may_end(&mut self, seq: u64) {
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
                self.declare(seq);
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
                    self.declare(seq);
                }
                return;
            }
            self.epochs.deliver(index);
            self.window_may_end(seq);
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

    /// Runs `readers` over the feed for `len` positions; returns how many were decoded.
    fn run(n: u64, readers: &mut [Reader], len: u64) -> u64 {
        let mut feed = Feed::new(n, 7);
        let mut cuts = CutPoints::default();
        for r in readers.iter() {
            cuts.add(r.start % n);
        }
        let mut decoded = 0;
        for seq in 0..len {
            let (index, _) = feed.index_of(seq, &cuts);
            for r in readers.iter_mut() {
                r.arrive(seq);
            }
            if readers.iter().any(|r| r.needs(seq, index)) {
                decoded += 1;
                for r in readers.iter_mut() {
                    r.pass(seq, index);
                }
            } else {
                for r in readers.iter_mut() {
                    r.pass_hole(seq);
                }
            }
        }
        decoded
    }

    /// A position saved with all but `left` of epoch 0's indices delivered.
    fn saved(n: u64, left: u64) -> (u64, Bitmap) {
        let mut delivered = Bitmap::new(n);
        for i in left..n {
            delivered.set(i);
        }
        (0, delivered)
    }

    #[test]
    fn a_consumer_alone_resumed_with_a_fraction_left_decodes_only_its_remainder_then_whole_epochs()
    {
        let n = 100;
        for left in [10, 50] {
            let mut readers = [Reader::join(n, 0, None, Some(saved(n, left)), 0)];
            // Its resumed epoch's window: only what it had left is decoded.
            assert_eq!(run(n, &mut readers, n), left);
            assert_eq!(readers[0].epochs_done, 1);
            // Then whole epochs: every position.
            let mut readers = [Reader::join(n, 0, None, Some(saved(n, left)), 0)];
            assert_eq!(run(n, &mut readers, 3 * n), left + 2 * n);
            assert_eq!(readers[0].epochs_done, 3);
        }
    }

    #[test]
    fn two_consumers_resumed_together_share_each_decode_of_their_overlap() {
        let n = 100;
        // One lacks 0..30, the other 20..60: the union, 0..60, is decoded once.
        let mut other = Bitmap::new(n);
        for i in (0..20).chain(60..n) {
            other.set(i);
        }
        let mut readers = [
            Reader::join(n, 0, None, Some(saved(n, 30)), 0),
            Reader::join(n, 0, None, Some((0, other)), 0),
        ];
        assert_eq!(run(n, &mut readers, n), 60);
        assert!(readers.iter().all(|r| r.epochs_done == 1));
    }

    #[test]
    fn the_local_ranks_of_a_group_decode_only_the_union_of_their_shares() {
        // Ranks 2 and 3 of a group of 4 on this node's feed (0 and 1 read another node's):
        // each epoch decodes their two quarters, not the epoch. Their declarations arrive 50
        // positions late; each rank declared its next epoch an epoch ahead, so no epoch
        // boundary decodes anything more.
        let n = 100;
        let rank = |rank| {
            Some(GroupSpec {
                name: "job".into(),
                rank,
                world_size: 4,
                even: Even::Pad,
            })
        };
        let mut readers = [
            Reader::join(n, 0, rank(2), None, 0),
            Reader::join(n, 0, rank(3), None, 0),
        ];
        for r in &mut readers {
            r.lag = 50;
        }
        assert_eq!(run(n, &mut readers, 3 * n), 3 * n / 2);
        assert!(readers.iter().all(|r| r.epochs_done == 3));
        // Without the next epoch's declaration each boundary would decode what the late
        // declaration had not said yet: the check has teeth.
        let mut late = [Reader::join(n, 0, rank(2), None, 0)];
        late[0].pending.truncate(1); // its current epoch only: the positions after 100
        late[0].lag = 50; //             until its next declaration arrives are decoded
        let decoded = run(n, &mut late, 2 * n);
        assert!(decoded >= 2 * n / 4 + 10, "{decoded}");
    }

    #[test]
    fn a_skimmer_needs_only_what_its_epoch_lacks_wherever_it_passes() {
        // A rank of 2 (half of each epoch) beside a resumed consumer with 10 samples left that
        // skims, slowly (it takes one passing sample in 1000, so its 10 stay wanted): before
        // protocol 16 the skimmer needed everything and the feed decoded every position.
        let n = 100;
        let rank = Some(GroupSpec {
            name: "job".into(),
            rank: 0,
            world_size: 2,
            even: Even::Pad,
        });
        let mut readers = [
            Reader::join(n, 0, rank, None, 0),
            Reader::join(n, 0, None, Some(saved(n, 10)), 0),
        ];
        readers[1].epochs.skim();
        readers[1].skim = Some(1000);
        readers[1].pending.clear();
        readers[1].declare(0);
        let decoded = run(n, &mut readers, n);
        assert!(decoded <= n / 2 + 10, "{decoded} decoded");
        assert_eq!(readers[1].epochs_done, 0, "the skimmer still lacks samples");
        assert_eq!(readers[0].epochs_done, 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn every_epoch_stays_exact_through_joins_let_gos_kills_resumes_and_skims(
            n in 3u64..60,
            seed in any::<u64>(),
            events in prop::collection::vec((0u64..150, event()), 1..12),
            even_drop in any::<bool>(),
            lag in 0u64..120,
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
                            readers.push(Reader::join(n, seq, group, None, lag));
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
                            // What it declared before is processed first (one connection,
                            // in order), then forgotten with the old attachment.
                            r.arrive(u64::MAX);
                            r.needs.forget();
                            r.start = seq;
                            // The epoch in progress goes on from the rejoin point.
                            r.next_seq = r.epochs.rejoined(seq);
                            r.declare(seq);
                        }
                        Event::KillAndResume { which } if !readers.is_empty() => {
                            let i = which % readers.len();
                            let dead = readers.swap_remove(i);
                            if dead.skim.is_none() {
                                cuts.remove(dead.start % n);
                            }
                            let saved = dead.epochs.saved();
                            cuts.add(seq % n);
                            readers.push(Reader::join(n, seq, dead.group, Some(saved), lag));
                        }
                        Event::Skim { which, slower } if !readers.is_empty() => {
                            let len = readers.len();
                            let r = &mut readers[which % len];
                            if r.skim.is_none() {
                                cuts.remove(r.start % n);
                                r.epochs.skim();
                                r.skim = Some(1 + slower);
                                r.declare(seq);
                            }
                        }
                        _ => {}
                    }
                }
                let (index, _) = feed.index_of(seq, &cuts);
                for r in &mut readers {
                    r.arrive(seq);
                }
                // Decoded if some consumer needs it, else a hole (protocol version 13).
                if readers.iter().any(|r| r.needs(seq, index)) {
                    for r in &mut readers {
                        r.pass(seq, index);
                    }
                } else {
                    for r in &mut readers {
                        r.pass_hole(seq);
                    }
                }
            }
            // Every consumer finished at least two epochs after the last event, each exact.
            for r in &readers {
                prop_assert!(r.epochs_done >= 2, "a consumer finished {} epochs", r.epochs_done);
            }
        }
    }
}
