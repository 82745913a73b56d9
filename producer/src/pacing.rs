//! Who sets the feed's pace: the rule that moves a consumer holding the others back to
//! *skimming*, as pure logic (events in, decisions out; the feeder does the I/O).
//!
//! The feed goes at the pace of its attached consumers: a write waits until the slowest has
//! released the slot. That is right while they keep up with one another, and wrong when one
//! is slower for good (a bigger model, a smaller batch): every other run then goes at its
//! pace. The feeder reports each time the ring is full on one consumer's cursor ([`Pacing::
//! held`]): how long, and whether another attached consumer was waiting for data meanwhile
//! (it had asked for samples the feed had not published). Once a consumer has held others
//! back for [`PacingRule::share`] of a window, it is asked to skim: it stops gating the feed
//! and copies what its epoch still needs as the samples pass (`ladle_consumer`'s skim mode),
//! so the fast runs go at their own pace and nothing extra is decoded. A consumer that holds
//! the feed back while nobody waits (the others are busy training too) is not moved: it
//! costs nobody anything.
//!
//! Measured, and why skimming rather than a second decode lane: a consumer at a quarter of
//! the feed's rate beside two at a half finds its unseen samples among those passing at the
//! rate it reads them (`benches/README.md`, "Pacing"), so it loses little, and the feed
//! decodes only the fast stream.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How consumers that go at different paces share the feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pacing {
    /// A consumer that keeps holding the others back is asked to skim (the default).
    #[default]
    Skim,
    /// Every attached consumer gates the feed: the sweep goes at its slowest run's pace
    /// (before protocol version 9).
    Lockstep,
}

impl std::str::FromStr for Pacing {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "skim" => Ok(Self::Skim),
            "lockstep" => Ok(Self::Lockstep),
            other => Err(format!(
                "unknown pacing {other:?}: `skim` (a consumer that holds the others back \
                 skims; the default) or `lockstep` (everyone goes at the slowest pace)"
            )),
        }
    }
}

/// The rule's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PacingRule {
    /// The window the share is measured over.
    pub(crate) window: Duration,
    /// The share of the window a consumer must hold others back to be asked to skim.
    pub(crate) share: f64,
    /// A consumer that took no batch for this long is not a candidate (it is stopped, not
    /// slow).
    pub(crate) recent: Duration,
}

impl Default for PacingRule {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(2),
            share: 0.25,
            recent: Duration::from_millis(500),
        }
    }
}

/// A decision of the rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AskToSkim {
    /// The consumer.
    pub(crate) id: u64,
    /// How long it held others back in the window.
    pub(crate) held: Duration,
    /// The window.
    pub(crate) window: Duration,
}

/// The rule's state: per consumer, the time it held others back in the current window.
#[derive(Debug)]
pub(crate) struct Pacer {
    rule: PacingRule,
    window_start: Instant,
    held: HashMap<u64, Duration>,
}

impl Pacer {
    pub(crate) fn rule(&self) -> &PacingRule {
        &self.rule
    }

    pub(crate) fn new(rule: PacingRule, now: Instant) -> Self {
        Self {
            rule,
            window_start: now,
            held: HashMap::new(),
        }
    }

    /// The ring was full on consumer `id`'s cursor for `dt`; `others_waiting`: another
    /// attached consumer had asked for samples not yet published meanwhile.
    pub(crate) fn held(&mut self, id: u64, dt: Duration, others_waiting: bool) {
        if others_waiting {
            *self.held.entry(id).or_default() += dt;
        }
    }

    /// At `now`, with `candidates` the attached consumers that took a batch lately (one that
    /// takes none is stopped or paused, not slow: the stall timeout's business): once the
    /// window is over, the candidate that held others back longest, if that was at least the
    /// rule's share of the window (a window starts afresh either way).
    pub(crate) fn tick(&mut self, now: Instant, candidates: &[u64]) -> Option<AskToSkim> {
        let window = now.saturating_duration_since(self.window_start);
        if window < self.rule.window {
            return None;
        }
        self.window_start = now;
        let held = std::mem::take(&mut self.held);
        let (id, most) = held
            .into_iter()
            .filter(|(id, _)| candidates.contains(id))
            .max_by_key(|&(id, d)| (d, std::cmp::Reverse(id)))?;
        (most.as_secs_f64() >= self.rule.share * window.as_secs_f64()).then_some(AskToSkim {
            id,
            held: most,
            window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_consumer_holding_others_back_for_the_share_of_a_window_is_asked_to_skim() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacingRule::default(), t0);
        for _ in 0..12 {
            p.held(2, ms(50), true);
        }
        assert_eq!(
            p.tick(t0 + ms(1000), &[1, 2]),
            None,
            "the window is not over"
        );
        let ask = p.tick(t0 + ms(2000), &[1, 2]).unwrap();
        assert_eq!((ask.id, ask.held), (2, ms(600)));
        assert_eq!(
            p.tick(t0 + ms(4000), &[1, 2]),
            None,
            "a new window starts afresh"
        );
    }

    #[test]
    fn holding_back_nobody_waiting_a_stopped_consumer_or_a_small_share_moves_nobody() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacingRule::default(), t0);
        p.held(2, ms(1900), false);
        assert_eq!(p.tick(t0 + ms(2000), &[1, 2]), None, "nobody waited");
        p.held(2, ms(1900), true);
        assert_eq!(p.tick(t0 + ms(4000), &[1]), None, "2 took no batch lately");
        p.held(2, ms(400), true);
        assert_eq!(p.tick(t0 + ms(6000), &[1, 2]), None, "under a quarter");
        p.held(3, ms(1900), true);
        assert_eq!(p.tick(t0 + ms(8000), &[1, 2]), None, "gone since");
    }

    #[test]
    fn the_longest_holder_is_moved_one_per_window() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacingRule::default(), t0);
        p.held(3, ms(700), true);
        p.held(4, ms(900), true);
        p.held(5, ms(900), true);
        let ask = p.tick(t0 + ms(2000), &[1, 3, 4, 5]).unwrap();
        assert_eq!(ask.id, 4, "the longest, the lowest id on a tie");
    }

    #[test]
    fn pacing_parses_and_names_the_choices_in_its_error() {
        assert_eq!("skim".parse::<Pacing>(), Ok(Pacing::Skim));
        assert_eq!("lockstep".parse::<Pacing>(), Ok(Pacing::Lockstep));
        let e = "lanes".parse::<Pacing>().unwrap_err();
        assert!(e.contains("skim") && e.contains("lockstep"), "{e}");
    }
}
