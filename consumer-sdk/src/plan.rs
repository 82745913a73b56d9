//! Which dataset indices one consumer's epoch delivers: the whole dataset, or one rank's share
//! of it when the consumer is a rank of a DDP job (a *group*).
//!
//! A consumer's epoch `k` is a window of the feed that holds every dataset index of `0..N`
//! exactly once (see the crate docs, *Epochs*). An [`EpochPlan`] says which of those indices
//! the consumer wants this epoch and records which it has delivered; the consumer delivers the
//! indices it wants, in feed order, and skips the others. Pure bookkeeping: no I/O.
//!
//! ## The deal: one rank's share, as torch's `DistributedSampler`
//! The `W` ranks of a group split each epoch as `DistributedSampler(shuffle=True)` does, so
//! that a job moved from `torch.utils.data` to ladle keeps its semantics:
//!
//! 1. `σ` is a permutation of `0..N` seeded by the group's name and the epoch number
//!    ([`deal`] documents the exact generator; it is part of the format of saved positions,
//!    and a test pins it).
//! 2. The list is `σ` padded to `total` entries: `total = W·⌈N/W⌉` with [`Even::Pad`] (the
//!    positions `p ≥ N` repeat `σ[p − N]`, the epoch's first samples) or `total = W·⌊N/W⌋`
//!    with [`Even::Drop`] (the tail is cut).
//! 3. Rank `r` gets the list's positions `r, r + W, r + 2W, … < total`.
//!
//! | property                    | [`Even::Pad`]                    | [`Even::Drop`]              |
//! |-----------------------------|----------------------------------|-----------------------------|
//! | indices per rank            | `⌈N/W⌉`                          | `⌊N/W⌋`                     |
//! | union of all ranks' shares  | all of `0..N`                    | `N − (N mod W)` indices     |
//! | shares disjoint             | apart from the `(−N) mod W` pads | yes                         |
//! | one rank gets an index twice| never                            | never                       |
//!
//! Every rank delivers the same count, so DDP's collective steps stay in lock step.
//!
//! ## Memory
//! An [`EpochPlan`] keeps one bit per dataset index for the delivered set and, for a rank, one
//! more for the wanted set: about 320 KB for ImageNet's 1 281 167 images. Building a rank's
//! plan shuffles `0..N` once (`O(N)` time, a transient `Vec<u32>`, or `Vec<u64>` past
//! `u32::MAX` indices) and keeps only the wanted bits.

use std::collections::TryReserveError;
use std::fmt;
use std::str::FromStr;

/// The longest dataset a consumer accepts (2^40 samples; its per-epoch record is then 128 GiB
/// of bits, so the real limit is memory).
pub const MAX_DATASET_LEN: u64 = 1 << 40;

/// What a group does with the `N mod W` indices left over when `W` ranks split `N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Even {
    /// Pad the epoch with its first samples (in shuffled order) so that every rank gets
    /// `⌈N/W⌉` indices and every index is delivered: `DistributedSampler(drop_last=False)`.
    #[default]
    Pad,
    /// Drop the tail so that every rank gets `⌊N/W⌋` indices and none twice across ranks:
    /// `DistributedSampler(drop_last=True)`.
    Drop,
}

impl fmt::Display for Even {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Even::Pad => "pad",
            Even::Drop => "drop",
        })
    }
}

impl FromStr for Even {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pad" => Ok(Even::Pad),
            "drop" => Ok(Even::Drop),
            _ => Err(PlanError::UnknownEven {
                value: s.to_owned(),
            }),
        }
    }
}

/// One consumer's place in a group: rank `rank` of the `world_size` ranks of the DDP job
/// `name`. The name seeds each epoch's shuffle, so every rank of a job must give the same one
/// (and two jobs on one feed get different splits).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    /// The group's name (e.g. the job's name); seeds the shuffle.
    pub name: String,
    /// This consumer's rank, `0..world_size`.
    pub rank: u32,
    /// Ranks in the group, at least 1.
    pub world_size: u32,
    /// What to do with the `N mod world_size` indices left over.
    pub even: Even,
}

impl GroupSpec {
    /// Checks that this spec can split a dataset of `n` indices: `world_size ≥ 1`,
    /// `rank < world_size`, `world_size ≤ n ≤ MAX_DATASET_LEN`.
    pub fn validate(&self, n: u64) -> Result<(), PlanError> {
        if self.world_size == 0 {
            return Err(PlanError::ZeroWorld {
                group: self.name.clone(),
            });
        }
        if self.rank >= self.world_size {
            return Err(PlanError::RankOutOfRange {
                group: self.name.clone(),
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        if n < u64::from(self.world_size) {
            return Err(PlanError::DatasetSmallerThanWorld {
                group: self.name.clone(),
                len: n,
                world_size: self.world_size,
            });
        }
        if n > MAX_DATASET_LEN {
            return Err(PlanError::DatasetTooLong {
                len: n,
                max: MAX_DATASET_LEN,
            });
        }
        Ok(())
    }
}

/// Building or restoring an [`EpochPlan`] failed, or a [`GroupSpec`] is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The group has no ranks.
    #[error("group {group:?}: world size 0; a group has at least one rank")]
    ZeroWorld {
        /// The group's name.
        group: String,
    },
    /// The rank is not one of the group's `0..world_size`.
    #[error(
        "group {group:?}: rank {rank} is out of range for world size {world_size} (ranks are 0..{world_size})"
    )]
    RankOutOfRange {
        /// The group's name.
        group: String,
        /// The rank given.
        rank: u32,
        /// The group's size.
        world_size: u32,
    },
    /// Fewer indices than ranks: some rank would get nothing to deliver.
    #[error(
        "group {group:?}: the dataset has {len} samples, fewer than the {world_size} ranks that would split it"
    )]
    DatasetSmallerThanWorld {
        /// The group's name.
        group: String,
        /// The dataset's length.
        len: u64,
        /// The group's size.
        world_size: u32,
    },
    /// The dataset is longer than a consumer accepts.
    #[error("a dataset of {len} samples is longer than a consumer accepts ({max})")]
    DatasetTooLong {
        /// The dataset's length.
        len: u64,
        /// [`MAX_DATASET_LEN`].
        max: u64,
    },
    /// The memory for the plan (its bits, or the transient shuffle) could not be had.
    #[error("not enough memory for the epoch plan of a dataset of {len} samples")]
    OutOfMemory {
        /// The dataset's length.
        len: u64,
    },
    /// [`EpochPlan::restore`] was given a delivered set of another dataset length.
    #[error("the saved delivered set is for a dataset of {saved} samples, this plan's has {plan}")]
    LengthMismatch {
        /// The plan's dataset length.
        plan: u64,
        /// The saved set's length.
        saved: u64,
    },
    /// [`EpochPlan::restore`] was given a delivered set holding an index this plan never
    /// wants (a position saved by another rank, group or epoch).
    #[error(
        "the saved delivered set holds index {index}, which this epoch's plan does not deliver (a position of another rank, group or epoch?)"
    )]
    NotWanted {
        /// The first such index.
        index: u64,
    },
    /// [`Even::from_str`] was given something other than `pad` or `drop`.
    #[error("{value:?} is not a way to even out a group's shares; use \"pad\" or \"drop\"")]
    UnknownEven {
        /// What was given.
        value: String,
    },
}

/// [`Bitmap::from_words`] or [`Bitmap::try_new`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BitmapError {
    /// The words are not `⌈len/64⌉`.
    #[error("a bitmap of {len} bits has {expected} words, not {got}")]
    WordCount {
        /// The bitmap's length in bits.
        len: u64,
        /// `⌈len/64⌉`.
        expected: u64,
        /// The words given.
        got: u64,
    },
    /// A bit at or past `len` is set.
    #[error("bit {index} is set in a bitmap of {len} bits")]
    BitPastEnd {
        /// The bitmap's length in bits.
        len: u64,
        /// The first bit set past the end.
        index: u64,
    },
    /// The memory for the bits could not be had.
    #[error("not enough memory for a bitmap of {len} bits")]
    OutOfMemory {
        /// The bitmap's length in bits.
        len: u64,
    },
}

/// A fixed-length set of `0..len`, one bit per element (bit `i` is bit `i % 64` of word
/// `i / 64`), with its count of ones kept.
#[derive(Clone, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u64,
    ones: u64,
}

impl fmt::Debug for Bitmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bitmap")
            .field("len", &self.len)
            .field("ones", &self.ones)
            .finish_non_exhaustive()
    }
}

impl Bitmap {
    /// The empty set of `0..len`.
    ///
    /// # Panics
    /// Aborts as any allocation does when `⌈len/8⌉` bytes cannot be had; [`Bitmap::try_new`]
    /// returns an error instead (for a length from another process).
    pub fn new(len: u64) -> Self {
        Self {
            words: vec![0; words_for(len)],
            len,
            ones: 0,
        }
    }

    /// The empty set of `0..len`, or [`BitmapError::OutOfMemory`] when its bits cannot be had.
    pub fn try_new(len: u64) -> Result<Self, BitmapError> {
        let words = usize::try_from(len.div_ceil(64))
            .ok()
            .and_then(|count| try_zeroed(count).ok())
            .ok_or(BitmapError::OutOfMemory { len })?;
        Ok(Self {
            words,
            len,
            ones: 0,
        })
    }

    /// The set whose words are `words` (bit `i` is bit `i % 64` of word `i / 64`); refuses
    /// a word count other than `⌈len/64⌉` and bits set at or past `len`.
    pub fn from_words(len: u64, words: Vec<u64>) -> Result<Self, BitmapError> {
        let expected = len.div_ceil(64);
        if words.len() as u64 != expected {
            return Err(BitmapError::WordCount {
                len,
                expected,
                got: words.len() as u64,
            });
        }
        if let Some(&last) = words.last() {
            let used = len - (expected - 1) * 64; // 1..=64 bits of the last word
            let past = if used == 64 { 0 } else { last >> used };
            if past != 0 {
                return Err(BitmapError::BitPastEnd {
                    len,
                    index: len + u64::from(past.trailing_zeros()),
                });
            }
        }
        let ones = words.iter().map(|w| u64::from(w.count_ones())).sum();
        Ok(Self { words, len, ones })
    }

    /// The number of elements of the universe `0..len` (not of the set: [`Bitmap::count`]).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the universe is empty (`len == 0`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many elements are in the set.
    pub fn count(&self) -> u64 {
        self.ones
    }

    /// The words, `⌈len/64⌉` of them; bits past `len` are 0.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Whether `index` is in the set (false for `index ≥ len`).
    pub fn get(&self, index: u64) -> bool {
        index < self.len && self.words[(index / 64) as usize] & (1 << (index % 64)) != 0
    }

    /// Adds `index`; true if it was not in the set. An index `≥ len` is never added.
    pub fn set(&mut self, index: u64) -> bool {
        if index >= self.len {
            return false;
        }
        let word = &mut self.words[(index / 64) as usize];
        let bit = 1 << (index % 64);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        self.ones += 1;
        true
    }

    /// Removes `index`; true if it was in the set.
    pub fn clear(&mut self, index: u64) -> bool {
        if index >= self.len {
            return false;
        }
        let word = &mut self.words[(index / 64) as usize];
        let bit = 1 << (index % 64);
        if *word & bit == 0 {
            return false;
        }
        *word &= !bit;
        self.ones -= 1;
        true
    }

    /// Empties the set.
    pub fn clear_all(&mut self) {
        self.words.fill(0);
        self.ones = 0;
    }

    /// Turns the set into its complement in `0..len`.
    pub fn complement(&mut self) {
        for w in &mut self.words {
            *w = !*w;
        }
        if self.len % 64 != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1 << (self.len % 64)) - 1;
            }
        }
        self.ones = self.len - self.ones;
    }

    /// The elements of the set, ascending.
    pub fn iter_ones(&self) -> impl Iterator<Item = u64> + '_ {
        bits_of(&self.words, |w| w)
    }

    /// The elements of `0..len` not in the set, ascending.
    pub(crate) fn iter_zeros(&self) -> impl Iterator<Item = u64> + '_ {
        let len = self.len;
        bits_of(&self.words, |w| !w).take_while(move |&i| i < len)
    }
}

/// The positions of the ones of `f(word)` over `words`, ascending.
fn bits_of(words: &[u64], f: fn(u64) -> u64) -> impl Iterator<Item = u64> + '_ {
    words.iter().enumerate().flat_map(move |(at, &word)| {
        let mut w = f(word);
        std::iter::from_fn(move || {
            (w != 0).then(|| {
                let bit = w.trailing_zeros();
                w &= w - 1;
                at as u64 * 64 + u64::from(bit)
            })
        })
    })
}

/// `⌈len/64⌉` as a `usize` (saturating: an impossible allocation then fails as one).
fn words_for(len: u64) -> usize {
    usize::try_from(len.div_ceil(64)).unwrap_or(usize::MAX)
}

/// `count` zeroed words, or the allocator's refusal.
pub(crate) fn try_zeroed(count: usize) -> Result<Vec<u64>, TryReserveError> {
    let mut words = Vec::new();
    words.try_reserve_exact(count)?;
    words.resize(count, 0);
    Ok(words)
}

/// Which dataset indices one consumer's epoch delivers, and which it has delivered.
///
/// [`EpochPlan::whole`] wants every index once; [`EpochPlan::for_rank`] wants one rank's
/// share ([`deal`]). The consumer asks [`EpochPlan::wants`] of each index of the epoch's
/// window in feed order, [`EpochPlan::mark`]s those it delivers, and is done when
/// [`EpochPlan::is_complete`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    /// The dataset's length `N`.
    n: u64,
    /// The indices wanted; `None` for all of `0..n`.
    wanted: Option<Bitmap>,
    /// How many indices are wanted.
    target: u64,
    /// The indices delivered so far, a subset of the wanted ones.
    delivered: Bitmap,
}

impl EpochPlan {
    /// The plan of a consumer on its own: every index of `0..n` once.
    ///
    /// # Panics
    /// Aborts as any allocation does when `⌈n/8⌉` bytes cannot be had; see
    /// [`EpochPlan::try_whole`].
    pub fn whole(n: u64) -> Self {
        Self {
            n,
            wanted: None,
            target: n,
            delivered: Bitmap::new(n),
        }
    }

    /// [`EpochPlan::whole`], or an error when `n` is over
    /// [`MAX_DATASET_LEN`] or its bits cannot be had (for a length
    /// from another process).
    pub fn try_whole(n: u64) -> Result<Self, PlanError> {
        if n > MAX_DATASET_LEN {
            return Err(PlanError::DatasetTooLong {
                len: n,
                max: MAX_DATASET_LEN,
            });
        }
        Ok(Self {
            n,
            wanted: None,
            target: n,
            delivered: Bitmap::try_new(n).map_err(|_| PlanError::OutOfMemory { len: n })?,
        })
    }

    /// The plan of rank `spec.rank` of its group in the group's epoch `epoch`: its share
    /// [`deal`]s it, nothing delivered yet.
    pub fn for_rank(n: u64, spec: &GroupSpec, epoch: u64) -> Result<Self, PlanError> {
        spec.validate(n)?;
        let oom = |_| PlanError::OutOfMemory { len: n };
        let mut wanted = Bitmap::try_new(n).map_err(oom)?;
        let delivered = Bitmap::try_new(n).map_err(oom)?;
        for_each_dealt(n, spec, epoch, |index| {
            wanted.set(index);
        })?;
        Ok(Self {
            n,
            target: wanted.count(),
            wanted: Some(wanted),
            delivered,
        })
    }

    /// The plan of rank `spec.rank` of a group resumed with `spec.world_size` ranks from a
    /// saved epoch `epoch` whose indices not delivered yet are `remainder` (elastic resume:
    /// the saved group may have had another world size). The remainder, in the order of the
    /// group's permutation of that epoch, is dealt as an epoch is ([`deal`]'s rule over its
    /// `m` indices: positions `r, r + W, …`, padded to `W·⌈m/W⌉` with its first indices, or
    /// cut to `W·⌊m/W⌋`), so the new ranks together deliver each index of it once (plus the
    /// padding's repeats, or less the cut).
    pub fn for_rank_of_remainder(
        n: u64,
        spec: &GroupSpec,
        epoch: u64,
        remainder: &Bitmap,
    ) -> Result<Self, PlanError> {
        if remainder.len() != n {
            return Err(PlanError::LengthMismatch {
                plan: n,
                saved: remainder.len(),
            });
        }
        spec.validate(n)?;
        let oom = |_| PlanError::OutOfMemory { len: n };
        let seed = seed(&spec.name, epoch);
        let mut sigma: Vec<u64> = Vec::new();
        sigma
            .try_reserve_exact(usize::try_from(remainder.count()).unwrap_or(usize::MAX))
            .map_err(|_| PlanError::OutOfMemory { len: n })?;
        let mut keep = |index: u64| {
            if remainder.get(index) {
                sigma.push(index);
            }
        };
        if n <= u64::from(u32::MAX) {
            permutation::<u32>(n, seed)
                .map_err(oom)?
                .iter()
                .for_each(|i| keep(i.get()));
        } else {
            permutation::<u64>(n, seed)
                .map_err(oom)?
                .iter()
                .for_each(|i| keep(i.get()));
        }
        // Deal's walk over the remainder's m indices; a remainder smaller than the group
        // gives each rank one index (the padding cycles), or none when cut.
        let mut wanted = Bitmap::try_new(n).map_err(|_| PlanError::OutOfMemory { len: n })?;
        let m = sigma.len() as u64;
        let w = u64::from(spec.world_size);
        let total = share_len(m, spec) * w;
        let mut p = u64::from(spec.rank);
        while p < total {
            wanted.set(sigma[(p % m) as usize]);
            p += w;
        }
        Self::with_wanted(wanted)
    }

    /// A plan that wants exactly `wanted` (over `0..N`, its length), nothing delivered: a
    /// rank's share saved explicitly ([`crate::SavedPosition::wanted`]).
    pub fn with_wanted(wanted: Bitmap) -> Result<Self, PlanError> {
        let n = wanted.len();
        Ok(Self {
            n,
            target: wanted.count(),
            wanted: Some(wanted),
            delivered: Bitmap::try_new(n).map_err(|_| PlanError::OutOfMemory { len: n })?,
        })
    }

    /// The indices this plan wants (`None`: all of `0..N`).
    pub fn wanted(&self) -> Option<&Bitmap> {
        self.wanted.as_ref()
    }

    /// The dataset's length `N`.
    pub fn dataset_len(&self) -> u64 {
        self.n
    }

    /// Whether this epoch still wants `index`: in the plan and not delivered yet (false for
    /// `index ≥ N`).
    pub fn wants(&self, index: u64) -> bool {
        index < self.n
            && self.wanted.as_ref().is_none_or(|w| w.get(index))
            && !self.delivered.get(index)
    }

    /// Records `index` delivered; true only if it was wanted and not delivered yet (the
    /// caller delivers it then, and skips it otherwise).
    pub fn mark(&mut self, index: u64) -> bool {
        self.wants(index) && self.delivered.set(index)
    }

    /// Takes back a [`EpochPlan::mark`] of `index` (a copy that turned out torn): it is
    /// wanted again.
    pub fn unmark(&mut self, index: u64) {
        self.delivered.clear(index);
    }

    /// How many indices this epoch delivers in all.
    pub fn target(&self) -> u64 {
        self.target
    }

    /// How many it has delivered.
    pub fn delivered(&self) -> u64 {
        self.delivered.count()
    }

    /// How many it has still to deliver.
    pub fn remaining(&self) -> u64 {
        self.target - self.delivered.count()
    }

    /// What it has still to deliver, as bitmap words over `0..N` (bit `i` of word `w` is
    /// index `64·w + i`): wanted and not delivered yet. What a consumer declares it needs.
    pub fn remaining_words(&self) -> Vec<u64> {
        let delivered = self.delivered.words();
        let mut words: Vec<u64> = match &self.wanted {
            None => delivered.iter().map(|d| !d).collect(),
            Some(wanted) => (wanted.words().iter().zip(delivered))
                .map(|(w, d)| w & !d)
                .collect(),
        };
        let tail = self.n % 64;
        if tail != 0
            && let Some(last) = words.last_mut()
        {
            *last &= (1 << tail) - 1;
        }
        words
    }

    /// Whether every index wanted was delivered.
    pub fn is_complete(&self) -> bool {
        self.remaining() == 0
    }

    /// The set delivered so far (what a saved position records).
    pub fn delivered_set(&self) -> &Bitmap {
        &self.delivered
    }

    /// Forgets what was delivered: the same plan from its start (a whole plan's next epoch).
    pub fn reset(&mut self) {
        self.delivered.clear_all();
    }

    /// Sets the delivered set to `delivered`, from a saved position. Refuses a set of another
    /// length, and one holding an index this plan does not want (naming the first); the plan
    /// is unchanged then.
    pub fn restore(&mut self, delivered: &Bitmap) -> Result<(), PlanError> {
        if delivered.len() != self.n {
            return Err(PlanError::LengthMismatch {
                plan: self.n,
                saved: delivered.len(),
            });
        }
        if let Some(wanted) = &self.wanted {
            let stray = delivered
                .words()
                .iter()
                .zip(wanted.words())
                .enumerate()
                .find(|(_, (d, w))| **d & !**w != 0);
            if let Some((at, (d, w))) = stray {
                return Err(PlanError::NotWanted {
                    index: at as u64 * 64 + u64::from((d & !w).trailing_zeros()),
                });
            }
        }
        self.delivered.words.copy_from_slice(delivered.words());
        self.delivered.ones = delivered.count();
        Ok(())
    }
}

/// Rank `spec.rank`'s share of the group's epoch `epoch` of a dataset of `n` indices, in the
/// order `DistributedSampler(shuffle=True)` yields it (see the [module docs](self)).
///
/// The permutation `σ` is a contract (positions saved by one version of ladle mean the same in
/// the next; a test pins it):
///
/// - `h = FNV-1a-64(name bytes)`; the seed is `mix(h ^ mix(epoch + γ))`, where `mix` is
///   splitmix64's finaliser and `γ = 0x9e3779b97f4a7c15`;
/// - the stream is splitmix64 from that seed (`state += γ; mix(state)`);
/// - a draw in `0..b` is Lemire's multiply-shift with rejection (`(x·b) >> 64`, redrawing
///   while the low 64 bits are below `2^64 mod b`);
/// - `σ` starts as `0..n`, then for `i` from `n − 1` down to 1 swaps `σ[i]` with `σ[j]`,
///   `j` drawn in `0..=i` (Fisher–Yates).
///
/// Refuses a spec that [`GroupSpec::validate`] refuses, and [`PlanError::OutOfMemory`] when
/// the shuffle's `n` indices cannot be had.
pub fn deal(n: u64, spec: &GroupSpec, epoch: u64) -> Result<Vec<u64>, PlanError> {
    spec.validate(n)?;
    let mut share = Vec::new();
    share
        .try_reserve_exact(usize::try_from(share_len(n, spec)).unwrap_or(usize::MAX))
        .map_err(|_| PlanError::OutOfMemory { len: n })?;
    for_each_dealt(n, spec, epoch, |index| share.push(index))?;
    Ok(share)
}

/// How many indices each rank of `spec`'s group gets of `n`.
fn share_len(n: u64, spec: &GroupSpec) -> u64 {
    let w = u64::from(spec.world_size.max(1));
    match spec.even {
        Even::Pad => n.div_ceil(w),
        Even::Drop => n / w,
    }
}

/// Calls `f` with each index of rank `spec.rank`'s share, in order. `spec` is valid for `n`.
fn for_each_dealt(
    n: u64,
    spec: &GroupSpec,
    epoch: u64,
    f: impl FnMut(u64),
) -> Result<(), PlanError> {
    let seed = seed(&spec.name, epoch);
    let oom = |_| PlanError::OutOfMemory { len: n };
    if n <= u64::from(u32::MAX) {
        walk(&permutation::<u32>(n, seed).map_err(oom)?, spec, f);
    } else {
        walk(&permutation::<u64>(n, seed).map_err(oom)?, spec, f);
    }
    Ok(())
}

/// Rank `spec.rank`'s positions `r, r + W, … < total` of `sigma` padded to `total`.
///
/// No index twice: `σ` is a permutation, so a repeat within one rank would be a position
/// `q < N` and a pad `p ≥ N` with `σ[q] = σ[p − N]`, i.e. `q = p − N`. Both are the rank's,
/// so `p ≡ q (mod W)` and `W | N`; but then `total = N` and there is no pad. (Two pads of a
/// rank repeat two distinct `σ[p − N]`; and `pad = total − N < W ≤ N`, so `p − N < N` is in
/// range.)
fn walk<T: Slot>(sigma: &[T], spec: &GroupSpec, mut f: impl FnMut(u64)) {
    let n = sigma.len() as u64;
    let w = u64::from(spec.world_size);
    let total = share_len(n, spec) * w;
    let mut p = u64::from(spec.rank);
    while p < total {
        let q = if p < n { p } else { p - n };
        f(sigma[q as usize].get());
        p += w;
    }
}

/// An element of the transient permutation: `u32` while `N` fits, so that ImageNet's shuffle
/// takes 5 MB, not 10.
trait Slot: Copy {
    fn new(index: u64) -> Self;
    fn get(self) -> u64;
}

impl Slot for u32 {
    fn new(index: u64) -> Self {
        index as u32
    }
    fn get(self) -> u64 {
        u64::from(self)
    }
}

impl Slot for u64 {
    fn new(index: u64) -> Self {
        index
    }
    fn get(self) -> u64 {
        self
    }
}

/// splitmix64's increment, `⌊2^64/φ⌋`.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a, 64 bits.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The shuffle's seed for a group's epoch.
fn seed(name: &str, epoch: u64) -> u64 {
    mix(fnv1a64(name.as_bytes()) ^ mix(epoch.wrapping_add(GAMMA)))
}

/// The splitmix64 stream.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// Uniform in `0..bound` (`bound ≥ 1`), without bias (Lemire 2019).
    fn below(&mut self, bound: u64) -> u64 {
        let mut m = u128::from(self.next()) * u128::from(bound);
        if (m as u64) < bound {
            let threshold = bound.wrapping_neg() % bound;
            while (m as u64) < threshold {
                m = u128::from(self.next()) * u128::from(bound);
            }
        }
        (m >> 64) as u64
    }
}

/// `σ`, the permutation of `0..n` of `seed` (see [`deal`]).
fn permutation<T: Slot>(n: u64, seed: u64) -> Result<Vec<T>, TryReserveError> {
    let mut sigma = Vec::new();
    sigma.try_reserve_exact(usize::try_from(n).unwrap_or(usize::MAX))?;
    sigma.extend((0..n).map(T::new));
    let mut rng = SplitMix(seed);
    for i in (1..sigma.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        sigma.swap(i, j);
    }
    Ok(sigma)
}

#[cfg(test)]
mod tests;
