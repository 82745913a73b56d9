use std::collections::{BTreeSet, HashSet};

use proptest::prelude::*;

use super::*;

fn spec(name: &str, rank: u32, world_size: u32, even: Even) -> GroupSpec {
    GroupSpec {
        name: name.to_owned(),
        rank,
        world_size,
        even,
    }
}

/// The shares of all ranks of a group.
fn shares(n: u64, world_size: u32, even: Even, epoch: u64) -> Vec<Vec<u64>> {
    (0..world_size)
        .map(|rank| deal(n, &spec("job", rank, world_size, even), epoch).unwrap())
        .collect()
}

const SIZES: fn(u64) -> [u64; 6] = |w| [w, w + 1, 7, 50, 101, 1000];

#[test]
fn every_rank_gets_the_same_count() {
    for w in 1..=5u32 {
        for n in SIZES(u64::from(w)) {
            for epoch in 0..3 {
                for (even, per) in [
                    (Even::Pad, n.div_ceil(u64::from(w))),
                    (Even::Drop, n / u64::from(w)),
                ] {
                    for share in shares(n, w, even, epoch) {
                        assert_eq!(share.len() as u64, per, "n {n} w {w} {even}");
                    }
                }
            }
        }
    }
}

#[test]
fn padded_shares_cover_the_dataset_and_overlap_only_in_the_pads() {
    for w in 1..=5u32 {
        for n in SIZES(u64::from(w)) {
            for epoch in 0..3 {
                let all: Vec<u64> = shares(n, w, Even::Pad, epoch).concat();
                let union: BTreeSet<u64> = all.iter().copied().collect();
                assert_eq!(union, (0..n).collect(), "n {n} w {w}");
                let pad = n.div_ceil(u64::from(w)) * u64::from(w) - n;
                assert_eq!(all.len() as u64, n + pad);
            }
        }
    }
}

#[test]
fn dropped_shares_are_disjoint_and_miss_only_the_remainder() {
    for w in 1..=5u32 {
        for n in SIZES(u64::from(w)) {
            for epoch in 0..3 {
                let all: Vec<u64> = shares(n, w, Even::Drop, epoch).concat();
                let union: HashSet<u64> = all.iter().copied().collect();
                assert_eq!(union.len(), all.len(), "n {n} w {w}: shares overlap");
                assert_eq!(union.len() as u64, n - n % u64::from(w));
                assert!(union.iter().all(|&i| i < n));
            }
        }
    }
}

#[test]
fn no_rank_gets_an_index_twice() {
    for w in 1..=5u32 {
        for n in SIZES(u64::from(w)) {
            for epoch in 0..3 {
                for even in [Even::Pad, Even::Drop] {
                    for share in shares(n, w, even, epoch) {
                        let set: HashSet<u64> = share.iter().copied().collect();
                        assert_eq!(set.len(), share.len(), "n {n} w {w} {even}");
                    }
                }
            }
        }
    }
}

#[test]
fn shares_are_the_strided_positions_of_sigma_padded_with_its_first_elements() {
    for w in 1..=5u32 {
        for n in SIZES(u64::from(w)) {
            for epoch in 0..3 {
                let sigma: Vec<u64> = permutation::<u64>(n, seed("job", epoch)).unwrap();
                let mut sorted = sigma.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "σ is a permutation");
                for even in [Even::Pad, Even::Drop] {
                    let total = share_len(n, &spec("job", 0, w, even)) * u64::from(w);
                    let mut list: Vec<u64> = sigma.iter().copied().take(total as usize).collect();
                    // The pads are σ's first elements.
                    list.extend(sigma.iter().take(total.saturating_sub(n) as usize));
                    for (rank, share) in shares(n, w, even, epoch).iter().enumerate() {
                        let expected: Vec<u64> = list
                            .iter()
                            .skip(rank)
                            .step_by(w as usize)
                            .copied()
                            .collect();
                        assert_eq!(share, &expected, "n {n} w {w} {even} rank {rank}");
                    }
                }
            }
        }
    }
}

#[test]
fn shares_are_reshuffled_every_epoch() {
    for w in 1..=5u32 {
        for n in [50, 101, 1000] {
            for even in [Even::Pad, Even::Drop] {
                let epochs: Vec<_> = (0..3).map(|e| shares(n, w, even, e)).collect();
                for (rank, ((a, b), c)) in
                    epochs[0].iter().zip(&epochs[1]).zip(&epochs[2]).enumerate()
                {
                    assert_ne!(a, b, "n {n} w {w} rank {rank}");
                    assert_ne!(b, c, "n {n} w {w} rank {rank}");
                }
            }
        }
    }
}

#[test]
fn two_groups_split_the_same_epoch_differently() {
    let a = deal(1000, &spec("job-a", 0, 4, Even::Pad), 0).unwrap();
    let b = deal(1000, &spec("job-b", 0, 4, Even::Pad), 0).unwrap();
    assert_ne!(a, b);
}

/// Positions saved by one version of ladle must mean the same in the next: a change of the
/// permutation (or of the deal) fails here, on purpose.
#[test]
fn the_deal_is_pinned() {
    let sigma = deal(10, &spec("job", 0, 1, Even::Pad), 0).unwrap();
    assert_eq!(sigma, [2, 0, 5, 6, 1, 4, 9, 3, 7, 8]);
    // Positions 1, 4, 7 and the pad 10 (σ[0]) of σ padded to 12.
    assert_eq!(
        deal(10, &spec("job", 1, 3, Even::Pad), 0).unwrap(),
        [0, 1, 3, 2]
    );
    assert_eq!(
        deal(10, &spec("job", 2, 3, Even::Drop), 7).unwrap(),
        [9, 8, 0]
    );
    let share = deal(1000, &spec("imagenet-ddp", 5, 8, Even::Pad), 41).unwrap();
    assert_eq!(
        share[..12],
        [929, 163, 598, 505, 819, 125, 418, 547, 451, 269, 614, 853]
    );
}

#[test]
fn the_permutation_is_the_same_in_u32_and_u64() {
    for n in [1, 2, 7, 1000, 4097] {
        let narrow: Vec<u64> = permutation::<u32>(n, seed("x", 3))
            .unwrap()
            .into_iter()
            .map(u64::from)
            .collect();
        assert_eq!(narrow, permutation::<u64>(n, seed("x", 3)).unwrap());
    }
}

#[test]
fn bad_specs_are_refused_with_what_is_wrong() {
    assert!(matches!(
        spec("g", 0, 0, Even::Pad).validate(10),
        Err(PlanError::ZeroWorld { .. })
    ));
    let err = spec("g", 4, 4, Even::Pad).validate(10).unwrap_err();
    assert_eq!(
        err,
        PlanError::RankOutOfRange {
            group: "g".into(),
            rank: 4,
            world_size: 4
        }
    );
    assert!(err.to_string().contains("rank 4"), "{err}");
    assert!(matches!(
        spec("g", 0, 4, Even::Pad).validate(3),
        Err(PlanError::DatasetSmallerThanWorld {
            len: 3,
            world_size: 4,
            ..
        })
    ));
    assert!(matches!(
        EpochPlan::for_rank(3, &spec("g", 0, 4, Even::Pad), 0),
        Err(PlanError::DatasetSmallerThanWorld { .. })
    ));
    assert!(deal(10, &spec("g", 5, 4, Even::Drop), 0).is_err());
    assert!(matches!(
        spec("g", 0, 1, Even::Pad).validate(MAX_DATASET_LEN + 1),
        Err(PlanError::DatasetTooLong { .. })
    ));
    assert!(spec("g", 3, 4, Even::Drop).validate(4).is_ok());
}

#[test]
fn even_reads_and_writes_pad_and_drop() {
    assert_eq!(Even::default(), Even::Pad);
    for even in [Even::Pad, Even::Drop] {
        assert_eq!(even.to_string().parse::<Even>().unwrap(), even);
    }
    let err = "Pad ".parse::<Even>().unwrap_err();
    assert!(err.to_string().contains("\"pad\""), "{err}");
}

#[test]
fn a_whole_plan_delivers_every_index_once() {
    let mut plan = EpochPlan::whole(100);
    assert_eq!(plan.target(), 100);
    assert!(!plan.wants(100));
    assert!(!plan.mark(100));
    for i in (0..100).rev() {
        assert!(plan.wants(i));
        assert!(plan.mark(i));
        assert!(!plan.mark(i));
    }
    assert!(plan.is_complete());
    plan.unmark(42);
    assert_eq!(plan.remaining(), 1);
    assert!(plan.wants(42));
    plan.reset();
    assert_eq!(plan.delivered(), 0);
    assert!(EpochPlan::try_whole(MAX_DATASET_LEN + 1).is_err());
    assert_eq!(EpochPlan::try_whole(100).unwrap(), EpochPlan::whole(100));
}

#[test]
fn a_rank_plan_wants_its_share_only() {
    let s = spec("job", 2, 3, Even::Pad);
    let share = deal(101, &s, 5).unwrap();
    let mut plan = EpochPlan::for_rank(101, &s, 5).unwrap();
    assert_eq!(plan.target(), share.len() as u64);
    let set: HashSet<u64> = share.iter().copied().collect();
    for i in 0..101 {
        assert_eq!(plan.wants(i), set.contains(&i));
        assert_eq!(plan.mark(i), set.contains(&i));
    }
    assert!(plan.is_complete());
}

#[test]
fn restoring_takes_a_subset_of_the_plan_and_names_a_stray_index() {
    let s = spec("job", 0, 2, Even::Drop);
    let share = deal(50, &s, 1).unwrap();
    let mut plan = EpochPlan::for_rank(50, &s, 1).unwrap();
    let mut saved = Bitmap::new(50);
    saved.set(share[0]);
    saved.set(share[3]);
    plan.restore(&saved).unwrap();
    assert_eq!(plan.delivered(), 2);
    assert!(!plan.wants(share[3]));
    assert!(plan.wants(share[1]));

    let stray = (0..50).find(|i| !share.contains(i)).unwrap();
    let mut bad = saved.clone();
    bad.set(stray);
    let err = plan.restore(&bad).unwrap_err();
    assert_eq!(err, PlanError::NotWanted { index: stray });
    assert!(err.to_string().contains(&stray.to_string()));
    assert_eq!(plan.delivered(), 2, "a refused restore changes nothing");

    assert_eq!(
        plan.restore(&Bitmap::new(51)),
        Err(PlanError::LengthMismatch {
            plan: 50,
            saved: 51
        })
    );
    let mut whole = EpochPlan::whole(50);
    whole.restore(&bad).unwrap();
    assert_eq!(whole.delivered(), 3);
}

#[test]
fn a_bitmap_refuses_words_past_its_length() {
    assert!(Bitmap::from_words(64, vec![u64::MAX]).is_ok());
    assert!(Bitmap::from_words(0, vec![]).is_ok());
    assert_eq!(
        Bitmap::from_words(65, vec![0, 0b110]),
        Err(BitmapError::BitPastEnd { len: 65, index: 65 })
    );
    assert_eq!(
        Bitmap::from_words(65, vec![0]),
        Err(BitmapError::WordCount {
            len: 65,
            expected: 2,
            got: 1
        })
    );
    let b = Bitmap::from_words(70, vec![0b1001, 0b100000]).unwrap();
    assert_eq!(b.count(), 3);
    assert_eq!(b.iter_ones().collect::<Vec<_>>(), [0, 3, 69]);
    assert_eq!(b.iter_zeros().count(), 67);
    assert!(!b.get(70));
    assert!(Bitmap::try_new(u64::MAX).is_err());
}

proptest! {
    #[test]
    fn marks_and_unmarks_keep_the_books_consistent(
        n in 1u64..3000,
        w in 1u32..8,
        rank_seed: u32,
        drop: bool,
        epoch in 0u64..1000,
        ops in proptest::collection::vec((any::<bool>(), any::<u64>()), 0..400),
    ) {
        let w = w.min(n as u32);
        let s = spec("prop", rank_seed % w, w, if drop { Even::Drop } else { Even::Pad });
        let wanted: HashSet<u64> = deal(n, &s, epoch).unwrap().into_iter().collect();
        let mut plan = EpochPlan::for_rank(n, &s, epoch).unwrap();
        prop_assert_eq!(plan.target(), wanted.len() as u64);
        let mut model = HashSet::new();
        for (mark, raw) in ops {
            // Mostly in range, some just past the end.
            let index = raw % (n + 10);
            if mark {
                let new = wanted.contains(&index) && !model.contains(&index);
                prop_assert_eq!(plan.mark(index), new);
                if new {
                    model.insert(index);
                }
            } else {
                plan.unmark(index);
                model.remove(&index);
            }
            prop_assert_eq!(plan.delivered(), model.len() as u64);
            prop_assert_eq!(plan.remaining() + plan.delivered(), plan.target());
            prop_assert_eq!(plan.is_complete(), model.len() == wanted.len());
        }
        let delivered: HashSet<u64> = plan.delivered_set().iter_ones().collect();
        prop_assert!(delivered.is_subset(&wanted));
        prop_assert_eq!(&delivered, &model);
        for i in 0..n + 3 {
            prop_assert_eq!(plan.wants(i), wanted.contains(&i) && !model.contains(&i));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Elastic resume: a remainder of any size, dealt over any new world size, is covered
    /// exactly (pad: every index, repeats only to even the counts; drop: only the cut is
    /// missing), every rank gets the same count, and no rank an index twice.
    #[test]
    fn a_remainder_is_dealt_over_a_new_world_size_exactly(
        n in 1u64..300,
        density in 0.0f64..1.0,
        seed in any::<u64>(),
        world_size in 1u32..7,
        drop in any::<bool>(),
    ) {
        prop_assume!(u64::from(world_size) <= n);
        let even = if drop { Even::Drop } else { Even::Pad };
        let mut remainder = Bitmap::new(n);
        let mut state = seed;
        for i in 0..n {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if ((state >> 33) as f64 / (1u64 << 31) as f64) < density {
                remainder.set(i);
            }
        }
        let m = remainder.count();
        let w = u64::from(world_size);
        let per = if drop { m / w } else { m.div_ceil(w) };
        let mut seen: Vec<u64> = Vec::new();
        for rank in 0..world_size {
            let plan = EpochPlan::for_rank_of_remainder(n, &spec("job", rank, world_size, even), 4, &remainder).unwrap();
            let wanted = plan.wanted().unwrap();
            prop_assert!(wanted.iter_ones().all(|i| remainder.get(i)), "an index outside the remainder");
            // A rank's share is a set: its count is what it delivers, without repeats.
            prop_assert!(wanted.count() == per || (!drop && m < w && wanted.count() == 1.min(m)),
                "rank {rank}: {} of {per}", wanted.count());
            seen.extend(wanted.iter_ones());
        }
        let distinct: BTreeSet<u64> = seen.iter().copied().collect();
        if drop {
            prop_assert_eq!(distinct.len() as u64, per * w, "drop: the ranks' shares are disjoint");
            prop_assert_eq!(seen.len() as u64, per * w);
        } else {
            prop_assert_eq!(distinct.len() as u64, m, "pad: the remainder is covered");
            prop_assert!(seen.len() as u64 <= per * w);
        }
        // The same on every rank's machine: the deal is a function of its inputs.
        let again = EpochPlan::for_rank_of_remainder(n, &spec("job", 0, world_size, even), 4, &remainder).unwrap();
        let first = EpochPlan::for_rank_of_remainder(n, &spec("job", 0, world_size, even), 4, &remainder).unwrap();
        prop_assert_eq!(again.wanted(), first.wanted());
    }
}

#[test]
fn a_remainder_of_another_length_is_refused() {
    let err =
        EpochPlan::for_rank_of_remainder(10, &spec("job", 0, 2, Even::Pad), 0, &Bitmap::new(9))
            .unwrap_err();
    assert!(
        matches!(err, PlanError::LengthMismatch { plan: 10, saved: 9 }),
        "{err}"
    );
}
