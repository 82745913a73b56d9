//! When a skimming consumer attaches again: pure logic (what it scanned, took and waited in,
//! a decision out), apart from the consumer's I/O.
//!
//! The producer asks a consumer that keeps holding the others back to *skim*: it stops gating
//! the feed and copies what its epoch still wants as samples pass (`consumer/skim.rs`). It
//! should pace the feed again once the feed no longer outruns it: when, over a window, it
//! waited for data for most of the time although it took most of what passed (it is not in
//! the thin tail of an epoch, where few unseen samples pass: waiting there is expected and
//! ends with the epoch), or when nothing passes at all (the consumers that set the pace left
//! or paused: without it attached nothing would be decoded).

use std::time::{Duration, Instant};

/// The rule's settings.
#[derive(Debug, Clone, Copy)]
pub struct SkimRule {
    /// The window shares are measured over.
    pub window: Duration,
    /// The share of the window spent waiting for data that, with
    /// [`SkimRule::taken_share`], says the feed no longer outruns the consumer.
    pub waited_share: f64,
    /// The share of the samples that passed that it took (dense: not an epoch's tail).
    pub taken_share: f64,
    /// How long nothing may pass while it waits before it attaches again.
    pub idle: Duration,
}

impl Default for SkimRule {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(2),
            waited_share: 0.5,
            taken_share: 0.25,
            idle: Duration::from_secs(1),
        }
    }
}

/// Why a skimming consumer attaches again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attach {
    /// It waited `waited` of `window` while it took `taken` of the `scanned` samples that
    /// passed: the feed no longer outruns it.
    Outpaced {
        /// Time it waited for data in the window.
        waited: Duration,
        /// The window.
        window: Duration,
        /// Samples it took.
        taken: u64,
        /// Samples that passed.
        scanned: u64,
    },
    /// Nothing passed for this long while it waited.
    Idle(Duration),
}

/// A skimming consumer's window.
#[derive(Debug, Clone)]
pub struct SkimPace {
    rule: SkimRule,
    start: Instant,
    waited: Duration,
    scanned: u64,
    taken: u64,
}

impl SkimPace {
    /// A window starting at `now`.
    pub fn new(rule: SkimRule, now: Instant) -> Self {
        Self {
            rule,
            start: now,
            waited: Duration::ZERO,
            scanned: 0,
            taken: 0,
        }
    }

    /// The rule.
    pub fn rule(&self) -> &SkimRule {
        &self.rule
    }

    /// `scanned` samples passed, of which it took `taken`.
    pub fn scanned(&mut self, scanned: u64, taken: u64) {
        self.scanned += scanned;
        self.taken += taken;
    }

    /// It waited `dt` for data; `idle`: nothing passed meanwhile for the rule's idle time.
    /// Returns `Some` when it should attach again at once.
    pub fn waited(&mut self, dt: Duration, idle: bool) -> Option<Attach> {
        self.waited += dt;
        idle.then_some(Attach::Idle(dt))
    }

    /// At `now`: once the window is over, whether it should attach again (a new window starts
    /// either way).
    pub fn tick(&mut self, now: Instant) -> Option<Attach> {
        let window = now.saturating_duration_since(self.start);
        if window < self.rule.window {
            return None;
        }
        let (waited, scanned, taken) = (self.waited, self.scanned, self.taken);
        *self = Self::new(self.rule, now);
        let outpaced = waited.as_secs_f64() >= self.rule.waited_share * window.as_secs_f64()
            && scanned > 0
            && taken as f64 >= self.rule.taken_share * scanned as f64;
        outpaced.then_some(Attach::Outpaced {
            waited,
            window,
            taken,
            scanned,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn waiting_while_taking_most_of_what_passes_attaches_again_after_a_window() {
        let t0 = Instant::now();
        let mut p = SkimPace::new(SkimRule::default(), t0);
        p.scanned(100, 90);
        assert_eq!(p.waited(ms(1200), false), None);
        assert_eq!(p.tick(t0 + ms(1500)), None, "the window is not over");
        let Some(Attach::Outpaced { taken, scanned, .. }) = p.tick(t0 + ms(2000)) else {
            panic!("should attach");
        };
        assert_eq!((taken, scanned), (90, 100));
        assert_eq!(p.tick(t0 + ms(4000)), None, "a new window starts afresh");
    }

    #[test]
    fn waiting_in_an_epochs_thin_tail_or_reading_at_its_own_pace_keeps_it_skimming() {
        let t0 = Instant::now();
        let mut p = SkimPace::new(SkimRule::default(), t0);
        p.scanned(1000, 100);
        p.waited(ms(1800), false);
        assert_eq!(
            p.tick(t0 + ms(2000)),
            None,
            "took a tenth: an epoch's thin tail"
        );
        p.scanned(1000, 900);
        p.waited(ms(300), false);
        assert_eq!(
            p.tick(t0 + ms(4000)),
            None,
            "rarely waited: the feed outruns it"
        );
        p.waited(ms(1900), false);
        assert_eq!(p.tick(t0 + ms(6000)), None, "nothing scanned: no evidence");
    }

    #[test]
    fn nothing_passing_while_it_waits_attaches_it_at_once() {
        let mut p = SkimPace::new(SkimRule::default(), Instant::now());
        assert_eq!(p.waited(ms(1000), true), Some(Attach::Idle(ms(1000))));
    }
}
