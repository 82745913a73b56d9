//! What each consumer still needs, and so what the feed decodes (protocol version 13).
//!
//! A consumer that reads only part of an epoch (resumed from a position, a group's rank)
//! declares, for a window of the feed's positions, the dataset indices it still wants
//! ([`ladle_ring::protocol::NeedsFrame`]). A position is decoded when some attached consumer
//! needs it; else it passes as a hole (`FLAG_HOLE`), costing no decode. Outside every window it
//! declared, a consumer needs everything, so a declaration that is late or never comes costs
//! decodes, never a sample; and since what is decoded is a union, a consumer's declaration can
//! only take away its own share. A skimming consumer declares an open window (protocol 16:
//! its set wherever the feed passes it), and needs everything until it has. Pure: the server
//! installs declarations, the feeder asks.

/// One consumer's declarations: at most [`MAX_WINDOWS`], the latest first out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    windows: Vec<Window>,
}

/// A window of positions and the indices needed in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    from: u64,
    to: u64,
    words: Vec<u64>,
}

/// Declarations a consumer keeps at once (this epoch's and the next's).
pub(crate) const MAX_WINDOWS: usize = 2;

impl Needs {
    /// Installs a declaration: in positions `from..to`, only the indices set in `words`. It
    /// replaces the windows it overlaps. Refused (the consumer broke the protocol) when it
    /// starts before the consumer's attachment `start`.
    pub(crate) fn declare(
        &mut self,
        start: u64,
        from: u64,
        to: u64,
        words: Vec<u64>,
    ) -> Result<(), String> {
        if from < start {
            return Err(format!(
                "it declared what it needs from position {from}, before its attachment at {start}"
            ));
        }
        self.windows.retain(|w| w.to <= from || w.from >= to);
        self.windows.push(Window { from, to, words });
        if self.windows.len() > MAX_WINDOWS {
            self.windows.remove(0);
        }
        Ok(())
    }

    /// Forgets every declaration (the consumer attached again, at another position).
    pub(crate) fn forget(&mut self) {
        self.windows.clear();
    }

    /// Whether the sample at position `seq`, dataset index `index`, is needed.
    pub(crate) fn needs(&self, seq: u64, index: u64) -> bool {
        match self.windows.iter().find(|w| (w.from..w.to).contains(&seq)) {
            None => true,
            Some(w) => usize::try_from(index / 64)
                .ok()
                .and_then(|k| w.words.get(k))
                .is_some_and(|word| word >> (index % 64) & 1 == 1),
        }
    }
}

/// Whether any consumer needs position `seq` (dataset index `index`): an attached or a
/// skimming one whose declarations say so (a skimmer declares an open window, protocol 16;
/// one that has not yet needs everything outside its old windows). A let-go consumer needs
/// nothing until it attaches again (it then starts at the producer's next position, with no
/// declaration).
pub(crate) fn needed<'a>(
    consumers: impl IntoIterator<Item = (bool, bool, &'a Needs)>,
    seq: u64,
    index: u64,
) -> bool {
    consumers
        .into_iter()
        .any(|(attached, skimming, needs)| (attached || skimming) && needs.needs(seq, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(indices: &[u64], n: u64) -> Vec<u64> {
        let mut words = vec![0; n.div_ceil(64) as usize];
        for &i in indices {
            words[(i / 64) as usize] |= 1 << (i % 64);
        }
        words
    }

    #[test]
    fn a_consumer_without_a_declaration_needs_every_sample() {
        let needs = Needs::default();
        assert!((0..200).all(|seq| needs.needs(seq, seq % 100)));
    }

    #[test]
    fn a_declared_window_needs_only_its_set_and_everything_after_it() {
        let mut needs = Needs::default();
        needs.declare(0, 100, 200, set(&[3, 70], 100)).unwrap();
        assert!(needs.needs(50, 5), "before the window: everything");
        assert!(needs.needs(150, 3) && needs.needs(160, 70));
        assert!(!needs.needs(150, 4) && !needs.needs(199, 99));
        assert!(needs.needs(200, 4), "after the window: everything");
        // A later declaration over the same window replaces it.
        needs.declare(0, 100, 200, set(&[4], 100)).unwrap();
        assert!(needs.needs(150, 4) && !needs.needs(150, 3));
        // Two windows at once; a third pushes the oldest out.
        needs.declare(0, 200, 300, set(&[9], 100)).unwrap();
        assert!(!needs.needs(250, 4) && needs.needs(250, 9) && needs.needs(150, 4));
        needs.declare(0, 300, 400, set(&[], 100)).unwrap();
        assert!(needs.needs(150, 3), "the oldest window is gone: everything");
        assert!(!needs.needs(350, 9));
    }

    #[test]
    fn a_sample_is_needed_if_any_attached_consumer_or_skimmer_needs_it_and_a_let_go_one_needs_nothing()
     {
        let mut a = Needs::default();
        a.declare(0, 0, 100, set(&[1], 100)).unwrap();
        let mut b = Needs::default();
        b.declare(0, 0, 100, set(&[2], 100)).unwrap();
        let none = Needs::default();
        let both = [(true, false, &a), (true, false, &b)];
        assert!(needed(both, 10, 1) && needed(both, 10, 2));
        assert!(!needed(both, 10, 3), "neither needs it: a hole");
        assert!(
            needed([(true, false, &a), (false, true, &none)], 10, 3),
            "a skimmer that has not declared needs all"
        );
        // A skimmer's open window (protocol 16): its set wherever the feed passes it.
        let mut skimmer = Needs::default();
        skimmer
            .declare(0, 40, ladle_ring::protocol::OPEN, set(&[7], 100))
            .unwrap();
        let with = [(true, false, &a), (false, true, &skimmer)];
        assert!(needed(with, 10, 3), "before its window: everything");
        assert!(
            !needed(with, 50, 3),
            "neither the rank's window nor the skimmer's"
        );
        let alone = [(false, true, &skimmer)];
        assert!(!needed(alone, u64::MAX - 1, 3) && needed(alone, 1 << 40, 7));
        assert!(needed(with, 50, 7));
        // A rank's window before it turned skimmer is replaced by the open one.
        b.declare(0, 60, ladle_ring::protocol::OPEN, set(&[9], 100))
            .unwrap();
        assert!(!needed([(false, true, &b)], 80, 2) && needed([(false, true, &b)], 80, 9));
        assert!(
            !needed([(true, false, &a), (false, false, &none)], 10, 3),
            "let go"
        );
        assert!(!needed(std::iter::empty(), 10, 3), "nobody");
    }

    #[test]
    fn a_declaration_before_the_consumers_attachment_is_refused_and_a_rejoin_forgets_all() {
        let mut needs = Needs::default();
        assert!(needs.declare(50, 10, 60, set(&[], 100)).is_err());
        needs.declare(50, 50, 150, set(&[], 100)).unwrap();
        assert!(!needs.needs(60, 0));
        needs.forget();
        assert!(needs.needs(60, 0));
    }
}
