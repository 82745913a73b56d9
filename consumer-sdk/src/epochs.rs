//! A consumer's epochs as a pure state machine: which window of the feed each epoch covers,
//! what it delivers, and what a rejoin or a loaded position changes. No sockets, no ring, no
//! threads: the consumer (`consumer/`) feeds it events (an epoch begins, an index is
//! delivered, the producer let it go and attached it again at a sequence, a position is
//! loaded) and acts on its decisions (where to read, whether to gather, when the epoch is
//! over). `producer`'s feed model test drives this same machine with the real feed's
//! permutations through random joins, let-gos, kills and resumes.
//!
//! The one rule behind it: every window of `N` consecutive sequences that starts at one of
//! the consumer's cut points holds every dataset index once (the feed keeps it so). So an
//! epoch is a window plus an [`EpochPlan`] (what it wants, what it delivered): read the
//! window, deliver what the plan still wants, and the epoch is exact. A late joiner, a
//! rejoin after a let-go, a resumed position and a rank of a group differ only in their plan
//! and in where their window starts.
//!
//! A *skimming* consumer (one that held the others back, moved off the feed's pace: see
//! [`Epochs::skim`]) has no windows: each epoch gathers what it still wants from whatever
//! passes, for as long as that takes (every producer-epoch holds every index, so it always
//! completes), and the next epoch begins where it ended. Attached again, it is a consumer
//! that rejoined ([`Epochs::rejoined`]).

use crate::plan::{Bitmap, EpochPlan, GroupSpec, PlanError};

/// The epochs of one consumer of a feed of `N` samples.
#[derive(Debug, Clone)]
pub struct Epochs {
    n: u64,
    group: Option<GroupSpec>,
    batch: u64,
    drop_last: bool,
    /// Where epoch `base_epoch` starts: epoch `k` is `[base + (k − base_epoch)·N, …)`, `N`
    /// sequences; epochs before `base_epoch` have no window. Both move on a rejoin.
    base: u64,
    /// The epoch whose window starts at `base`: 0, the epoch of a loaded position, or the
    /// epoch a rejoin continued.
    base_epoch: u64,
    /// The number the next epoch to begin gets.
    next_epoch: u64,
    /// The epoch begun last; older epochs yield nothing more.
    current: Option<u64>,
    /// What the current epoch wants and has delivered.
    plan: EpochPlan,
    /// A loaded position's delivered set, for the next epoch to begin, and what that epoch
    /// wants when the position said it explicitly (a remainder dealt anew, elastic resume).
    resume: Option<(Bitmap, Option<Bitmap>)>,
    /// The current epoch's plan wants an explicit set (a loaded remainder), not a share
    /// dealt from the group's permutation: a saved position must carry it.
    explicit: bool,
    /// What the current epoch delivers in all, fixed when it began.
    samples: u64,
    /// The current epoch is gathered: only what its plan still wants is delivered, copied
    /// out of its window (after a rejoin mid-epoch, a resume, and always for a rank).
    gathered: bool,
    /// Skimming: every epoch is gathered from whatever passes, with no window.
    skimming: bool,
}

/// An epoch that began: its number and the first sequence of its window (`None`: past
/// sequence 2^64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begun {
    /// The epoch's number.
    pub number: u64,
    /// Where its window starts.
    pub start: Option<u64>,
}

/// A position cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// An epoch has begun already.
    #[error("epoch {epoch} has begun")]
    AlreadyStarted {
        /// The epoch begun.
        epoch: u64,
    },
    /// The delivered set does not fit the saved epoch's plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
}

impl Epochs {
    /// A consumer attached at sequence `start`, reading batches of `batch` (`drop_last`: the
    /// partial last batch is skipped), whole epochs or as `group`'s rank. Refuses a group
    /// that cannot split `n` samples, and a length whose bits cannot be had.
    pub fn new(
        n: u64,
        start: u64,
        group: Option<GroupSpec>,
        batch: u32,
        drop_last: bool,
    ) -> Result<Self, PlanError> {
        if let Some(group) = &group {
            group.validate(n)?;
        }
        Ok(Self {
            n,
            group,
            batch: u64::from(batch.max(1)),
            drop_last,
            base: start,
            base_epoch: 0,
            next_epoch: 0,
            current: None,
            plan: EpochPlan::try_whole(n)?,
            resume: None,
            explicit: false,
            samples: 0,
            gathered: false,
            skimming: false,
        })
    }

    /// Begins the next epoch: its plan (a rank's share is dealt anew each epoch; a loaded
    /// position's delivered set is restored), whether it is gathered, what it delivers in
    /// all. Fails when a rank's plan cannot be had (memory); the epoch is current anyway.
    pub fn begin(&mut self) -> Result<Begun, PlanError> {
        let number = self.next_epoch;
        self.next_epoch = number.saturating_add(1);
        self.current = Some(number);
        let resume = self.resume.take();
        self.explicit = false;
        match (
            &self.group,
            resume.as_ref().and_then(|(_, wanted)| wanted.clone()),
        ) {
            (_, Some(wanted)) => {
                self.plan = EpochPlan::with_wanted(wanted)?;
                self.explicit = true;
            }
            (None, None) => self.plan.reset(),
            (Some(group), None) => self.plan = EpochPlan::for_rank(self.n, group, number)?,
        }
        if let Some((delivered, _)) = resume {
            self.plan.restore(&delivered)?;
        }
        self.gathered = self.skimming || self.group.is_some() || self.plan.delivered() > 0;
        let remaining = self.plan.remaining();
        self.samples = if self.drop_last {
            remaining - remaining % self.batch
        } else {
            remaining
        };
        Ok(Begun {
            number,
            start: self.start(number),
        })
    }

    /// The consumer skims from now on (it holds the feed back no more): the epoch in
    /// progress and every later one gather what they want from whatever passes, with no
    /// window, until complete ([`Epochs::rejoined`] ends it).
    pub fn skim(&mut self) {
        self.skimming = true;
        if self.current.is_some() && !self.plan.is_complete() {
            self.gathered = true;
        }
    }

    /// Whether the consumer skims.
    pub fn skimming(&self) -> bool {
        self.skimming
    }

    /// The epoch begun last.
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// The number the next epoch to begin gets.
    pub fn next_number(&self) -> u64 {
        self.next_epoch
    }

    /// Where epoch `number`'s window starts, `None` before the first epoch or past 2^64.
    pub fn start(&self, number: u64) -> Option<u64> {
        number
            .checked_sub(self.base_epoch)
            .and_then(|k| k.checked_mul(self.n))
            .and_then(|offset| self.base.checked_add(offset))
    }

    /// Where epoch `number`'s window ends (exclusive), `None` past 2^64.
    pub fn end(&self, number: u64) -> Option<u64> {
        number.checked_add(1).and_then(|next| self.start(next))
    }

    /// Whether the current epoch has delivered everything it wants.
    pub fn is_complete(&self) -> bool {
        self.plan.is_complete()
    }

    /// Whether an epoch has begun and is not complete: a rank dropped now has not taken its
    /// share, so its group cannot go on.
    pub fn mid_epoch(&self) -> bool {
        self.current.is_some() && !self.plan.is_complete()
    }

    /// Whether the current epoch is gathered (copied out of its window).
    pub fn gathered(&self) -> bool {
        self.gathered
    }

    /// The current epoch's window ended: nothing more to gather (the epoch is complete,
    /// unless the feed broke its rule).
    pub fn stop_gathering(&mut self) {
        self.gathered = false;
    }

    /// Index `index` passes in the current epoch's window: records it delivered if the plan
    /// wants it; returns whether it is delivered (a gathered epoch copies it then).
    pub fn deliver(&mut self, index: u64) -> bool {
        self.plan.mark(index)
    }

    /// Takes back a [`Epochs::deliver`] of `index` (its copy may be torn).
    pub fn undeliver(&mut self, index: u64) {
        self.plan.unmark(index);
    }

    /// How many the current epoch has delivered.
    pub fn delivered(&self) -> u64 {
        self.plan.delivered()
    }

    /// What the current epoch delivers in all, fixed when it began (0 before the first).
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Samples of a whole epoch before batching: `N`, or a rank's share.
    pub fn share(&self) -> u64 {
        match &self.group {
            None => self.n,
            Some(g) => {
                let w = u64::from(g.world_size.max(1));
                match g.even {
                    crate::plan::Even::Pad => self.n.div_ceil(w),
                    crate::plan::Even::Drop => self.n / w,
                }
            }
        }
    }

    /// The producer let this consumer go (or it skimmed) and attached it again at sequence `start`. The
    /// epoch in progress goes on in the window `[start, start + N)` (gathered: only what it
    /// has not delivered) when it has delivered part of its plan; an epoch that delivered
    /// nothing starts over at `start`; otherwise the next epoch will start there. Returns the
    /// sequence to read from: `start`. (The windows are rebased on that epoch: however many
    /// epochs a skimming consumer began, or a consumer abandoned, its next window is here.)
    pub fn rejoined(&mut self, start: u64) -> u64 {
        self.skimming = false;
        let gathered = self.group.is_some();
        let (number, gathered) = match self.current {
            Some(k) if self.plan.delivered() > 0 && !self.plan.is_complete() => (k, true),
            Some(k) if self.plan.delivered() == 0 => (k, gathered),
            _ => (self.next_epoch, gathered),
        };
        self.base = start;
        self.base_epoch = number;
        self.gathered = gathered;
        start
    }

    /// What this consumer still needs of the feed, to declare to the producer (protocol
    /// version 13): for a gathered epoch (a resumed one, a rank's, one continued after a
    /// rejoin), its window and the indices it has still to deliver, as bitmap words; while
    /// skimming, the same in an open window from its last attachment on (protocol 16: it
    /// takes its indices wherever they pass); `None` for a whole epoch (it needs every
    /// position of its window).
    pub fn declaration(&self) -> Option<(u64, u64, Vec<u64>)> {
        let k = self.current?;
        if self.skimming {
            // No window: its set wherever the feed passes it, from its last attachment on
            // (protocol 16's open window).
            return Some((
                self.base,
                ladle_ring::protocol::OPEN,
                self.plan.remaining_words(),
            ));
        }
        if !self.gathered {
            return None;
        }
        let (from, to) = (self.start(k)?, self.end(k)?);
        Some((from, to, self.plan.remaining_words()))
    }

    /// A rank's next epoch, declared ahead (its window follows the current one's, and its
    /// share is known from the group's split): without it, the feed's read-ahead past the
    /// current window would decode samples of the whole next epoch that this node's ranks do
    /// not take. `None` for a consumer not in a group, while skimming, and before the first
    /// epoch.
    pub fn next_declaration(&self) -> Option<(u64, u64, Vec<u64>)> {
        let group = self.group.as_ref()?;
        if self.skimming {
            return None;
        }
        let k = self.current?;
        let next = k.checked_add(1)?;
        let (from, to) = (self.start(next)?, self.end(next)?);
        let plan = EpochPlan::for_rank(self.n, group, next).ok()?;
        Some((from, to, plan.remaining_words()))
    }

    /// Loads a saved position (its epoch and what that epoch had delivered) before the first
    /// epoch begins: that epoch is the next to begin, and delivers only the rest.
    pub fn load(&mut self, epoch: u64, delivered: &Bitmap) -> Result<(), LoadError> {
        self.load_wanted(epoch, None, delivered)
    }

    /// [`Epochs::load`] of an epoch that wants `wanted` when given (a remainder dealt anew
    /// over another world size, [`EpochPlan::for_rank_of_remainder`], or a position that
    /// saved it), instead of the share the group's permutation deals.
    pub fn load_wanted(
        &mut self,
        epoch: u64,
        wanted: Option<&Bitmap>,
        delivered: &Bitmap,
    ) -> Result<(), LoadError> {
        if let Some(epoch) = self.current {
            return Err(LoadError::AlreadyStarted { epoch });
        }
        let mut plan = match (&self.group, wanted) {
            (_, Some(wanted)) => EpochPlan::with_wanted(wanted.clone())?,
            (None, None) => EpochPlan::try_whole(self.n)?,
            (Some(group), None) => EpochPlan::for_rank(self.n, group, epoch)?,
        };
        if plan.dataset_len() != self.n {
            return Err(LoadError::Plan(PlanError::LengthMismatch {
                plan: self.n,
                saved: plan.dataset_len(),
            }));
        }
        plan.restore(delivered)?;
        self.next_epoch = epoch;
        self.base_epoch = epoch;
        self.resume = Some((delivered.clone(), wanted.cloned()));
        Ok(())
    }

    /// Where this consumer stands, for a saved position: the epoch in progress and what it
    /// delivered; a loaded position not begun yet; or the next epoch, nothing delivered.
    pub fn saved(&self) -> (u64, Bitmap) {
        match (self.current, &self.resume) {
            (None, Some((delivered, _))) => (self.next_epoch, delivered.clone()),
            (Some(k), _) if !self.plan.is_complete() => (k, self.plan.delivered_set().clone()),
            _ => (self.next_epoch, Bitmap::new(self.n)),
        }
    }

    /// What the epoch [`Epochs::saved`] names wants, when that is not what the group's
    /// permutation deals (a remainder dealt anew): a saved position must carry it.
    pub fn saved_wanted(&self) -> Option<Bitmap> {
        match (self.current, &self.resume) {
            (None, Some((_, wanted))) => wanted.clone(),
            (Some(_), _) if self.explicit && !self.plan.is_complete() => {
                self.plan.wanted().cloned()
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::plan::Even;

    #[test]
    fn windows_follow_one_another_from_the_join_and_from_a_loaded_epoch() {
        let mut e = Epochs::new(10, 7, None, 4, false).unwrap();
        assert_eq!(
            e.begin().unwrap(),
            Begun {
                number: 0,
                start: Some(7)
            }
        );
        assert_eq!(e.end(0), Some(17));
        assert_eq!(e.samples(), 10);
        let mut resumed = Epochs::new(10, 100, None, 4, true).unwrap();
        let mut half = Bitmap::new(10);
        for i in 0..5 {
            half.set(i);
        }
        resumed.load(3, &half).unwrap();
        assert_eq!(resumed.saved().0, 3, "a loaded position saves as itself");
        let begun = resumed.begin().unwrap();
        assert_eq!(
            begun,
            Begun {
                number: 3,
                start: Some(100)
            }
        );
        assert!(resumed.gathered());
        assert_eq!(resumed.samples(), 4, "5 left, drop_last with batches of 4");
        assert!(!resumed.deliver(2), "delivered before the save");
        assert!(resumed.deliver(7));
        assert_eq!(resumed.end(3), Some(110));
        assert!(matches!(
            resumed.load(0, &half),
            Err(LoadError::AlreadyStarted { epoch: 3 })
        ));
    }

    #[test]
    fn a_rejoin_mid_epoch_goes_on_gathering_and_one_before_any_delivery_starts_over() {
        let mut e = Epochs::new(10, 0, None, 4, false).unwrap();
        e.begin().unwrap();
        assert_eq!(
            e.rejoined(25),
            25,
            "nothing delivered: the epoch starts at 25"
        );
        assert!(!e.gathered());
        assert_eq!((e.start(0), e.end(0)), (Some(25), Some(35)));
        for i in 0..3 {
            e.deliver(i);
        }
        assert_eq!(e.rejoined(40), 40);
        assert!(e.gathered(), "part delivered: the rest is gathered");
        assert_eq!(e.end(0), Some(50));
        assert_eq!(e.saved().1.count(), 3);
        // Completed: the next epoch starts at the rejoin point.
        for i in 0..10 {
            e.deliver(i);
        }
        assert!(e.is_complete());
        assert_eq!(e.rejoined(61), 61);
        assert_eq!(
            e.begin().unwrap(),
            Begun {
                number: 1,
                start: Some(61)
            }
        );
    }

    #[test]
    fn a_skimming_consumer_gathers_every_epoch_and_a_rejoin_brings_its_windows_back() {
        let mut e = Epochs::new(10, 0, None, 4, false).unwrap();
        e.skim();
        assert!(e.skimming() && !e.gathered(), "no epoch begun yet");
        e.begin().unwrap();
        assert!(e.gathered(), "a skimmed epoch is gathered");
        for i in 0..4 {
            assert!(e.deliver(i));
        }
        assert!(!e.deliver(2), "once per epoch");
        assert_eq!(e.rejoined(50), 50);
        assert!(
            !e.skimming() && e.gathered(),
            "the rest in the window from 50"
        );
        assert_eq!(e.end(0), Some(60));
        for i in 4..10 {
            e.deliver(i);
        }
        assert!(e.is_complete());
        e.skim();
        assert!(!e.deliver(3), "a complete epoch takes nothing");
        e.begin().unwrap();
        assert!(
            e.gathered() && e.deliver(3),
            "the next epoch wants everything again"
        );
        // Epochs begun (and abandoned) while skimming do not push the next window far away.
        for _ in 0..50 {
            e.begin().unwrap();
        }
        let number = e.current().unwrap();
        assert_eq!(e.rejoined(1000), 1000);
        assert_eq!(
            e.start(number),
            Some(1000),
            "rebased on the epoch in progress"
        );
        assert_eq!(e.end(number), Some(1010));
    }

    #[test]
    fn a_rank_gathers_every_epoch_and_its_plan_is_dealt_anew() {
        let group = GroupSpec {
            name: "g".into(),
            rank: 1,
            world_size: 3,
            even: Even::Pad,
        };
        let mut e = Epochs::new(10, 0, Some(group), 2, false).unwrap();
        assert_eq!(e.share(), 4);
        e.begin().unwrap();
        assert!(e.gathered());
        assert_eq!(e.samples(), 4);
        let bad = GroupSpec {
            name: "g".into(),
            rank: 0,
            world_size: 11,
            even: Even::Pad,
        };
        assert!(Epochs::new(10, 0, Some(bad), 2, false).is_err());
    }

    #[test]
    fn an_epoch_past_two_to_the_sixty_four_is_none_not_a_wrap() {
        let mut e = Epochs::new(10, u64::MAX - 15, None, 4, false).unwrap();
        e.begin().unwrap();
        assert_eq!(e.end(0), Some(u64::MAX - 5));
        assert_eq!(e.end(1), None);
        let mut far = Epochs::new(10, 0, None, 4, false).unwrap();
        far.load(u64::MAX, &Bitmap::new(10)).unwrap();
        assert_eq!(
            far.begin().unwrap(),
            Begun {
                number: u64::MAX,
                start: Some(0)
            }
        );
        assert_eq!(
            far.end(u64::MAX),
            None,
            "the epoch after the last has no start"
        );
    }

    #[test]
    fn a_loaded_remainder_is_the_epoch_then_the_groups_deal_goes_on_and_a_save_carries_it() {
        let group = GroupSpec {
            name: "job".into(),
            rank: 1,
            world_size: 2,
            even: crate::plan::Even::Pad,
        };
        let mut e = Epochs::new(20, 0, Some(group.clone()), 4, false).unwrap();
        let mut wanted = Bitmap::new(20);
        for i in [3, 5, 8] {
            wanted.set(i);
        }
        e.load_wanted(7, Some(&wanted), &Bitmap::new(20)).unwrap();
        assert_eq!(
            e.saved_wanted(),
            Some(wanted.clone()),
            "not begun: saves as loaded"
        );
        e.begin().unwrap();
        assert!(e.gathered());
        assert_eq!(e.samples(), 3);
        assert!(!e.deliver(4), "not in the remainder it was dealt");
        assert!(e.deliver(5));
        assert_eq!(e.saved().0, 7);
        assert_eq!(
            e.saved_wanted(),
            Some(wanted),
            "mid-epoch: the save carries it"
        );
        // Its declaration is what is left of it.
        let (_, _, words) = e.declaration().unwrap();
        assert_eq!(words[0], (1 << 3) | (1 << 8));
        assert!(e.deliver(3) && e.deliver(8) && e.is_complete());
        // The next epoch is the group's deal, with nothing to carry.
        e.begin().unwrap();
        assert_eq!(e.saved_wanted(), None);
        let dealt = crate::plan::deal(20, &group, 8).unwrap();
        assert_eq!(e.samples(), dealt.len() as u64);
    }
}
