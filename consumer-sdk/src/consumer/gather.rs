//! Gathered epochs: copying the samples an epoch's plan still wants out of its window of
//! the feed (after a rejoin, a resume, and always for a rank of a group), or out of whatever
//! passes while the consumer skims (`skim.rs`).

use super::*;

/// What one step of a gathered batch came to.
pub(super) enum Step {
    /// Go on: more to copy.
    More,
    /// The batch is full, or the epoch complete, or its window ended.
    Done,
    /// A newer epoch began: the old one yields nothing more.
    Superseded,
}

impl Consumer {
    /// Gathers the next batch of epoch `number` after a rejoin: walks the epoch's window of
    /// the feed span by span (a skimming consumer: whatever passes), copying each sample
    /// whose index this epoch has not delivered yet into an owned batch, until it holds a
    /// batch or the epoch is over. `None` when the epoch is over.
    pub(super) fn next_catch_up(&self, number: u64) -> Result<Option<Owned>, ConsumerError> {
        let _one_at_a_time = self
            .catching_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.config.group.is_some() {
            // A rank hears promptly that another went, even while data keeps coming.
            self.check_socket();
            if let Some(error @ ConsumerError::GroupBroken { .. }) = self.fatal() {
                return Err(error);
            }
        }
        let batch_size = u64::from(self.config.batch_size);
        let schema = &self.ring.layout().schema;
        let mut owned = Owned::with_capacity(batch_size as usize, schema);
        loop {
            let skimming = self.state().epochs.skimming();
            let step = if skimming {
                self.skim_step(number, &mut owned)?
            } else {
                self.window_step(number, &mut owned)?
            };
            match step {
                Step::More => {}
                Step::Done => break,
                Step::Superseded => return Ok(None),
            }
        }
        let partial_dropped = self.config.drop_last && (owned.len() as u64) < batch_size;
        let handed_out = !owned.is_empty() && !partial_dropped;
        if handed_out {
            self.cursor.add_delivered(owned.len() as u64);
        }
        Ok(handed_out.then_some(owned))
    }

    /// One span of a gathered epoch's window.
    fn window_step(&self, number: u64, owned: &mut Owned) -> Result<Step, ConsumerError> {
        let batch_size = u64::from(self.config.batch_size);
        let schema = &self.ring.layout().schema;
        let (first, count, generation) = {
            let mut state = self.state();
            if state.epochs.current() != Some(number) {
                return Ok(Step::Superseded); // the old epoch yields nothing more
            }
            if !state.epochs.gathered() {
                return Ok(Step::Done);
            }
            let end = match self.epoch_end(&state, number) {
                Ok(end) => end,
                Err(e) => return Err(self.fail(&mut state, e)),
            };
            let first = state.next_seq;
            if first >= end {
                state.epochs.stop_gathering();
                return Ok(Step::Done);
            }
            let count = (end - first).min(batch_size);
            self.check_room(&state, first, count)?;
            state.next_seq = first + count;
            state.held.insert(first);
            self.cursor.raise_demand(first + count);
            (first, count, state.generation)
        };
        if let Err(e) = self.wait_for(first + count) {
            self.unhold(first);
            return Err(e);
        }
        let mut state = self.state();
        let loan = match self.deliver_locked(&mut state, (first, count), generation, number)? {
            Delivery::Delivered(loan) => loan,
            Delivery::Void => return Ok(Step::More),
        };
        // As in `deliver`: published, held, and delivered just now.
        let (indices, flags, fields) = self.window(&loan);
        let mut stop = first + count;
        let before = owned.len();
        for (k, &index) in indices.iter().enumerate() {
            // A hole: nobody needed it when the feed passed it (this consumer included).
            if flags[k] & FLAG_HOLE != 0 {
                continue;
            }
            if state.epochs.deliver(index) {
                owned.push(first + k as u64, k, &fields, index, flags[k]);
                if owned.len() as u64 == batch_size || state.epochs.is_complete() {
                    stop = first + k as u64 + 1;
                    break;
                }
            }
        }
        state.held.remove(&first);
        if self.cursor.is_let_go() {
            // Let go while copying (a stall timeout passed since the delivery): the copy
            // may be torn. Forget it and gather the span again after the rejoin.
            for &index in &owned.indices[before..] {
                state.epochs.undeliver(index);
            }
            owned.truncate(before, schema);
            self.rejoin(&mut state)?;
            return Ok(Step::More);
        }
        // The rest of the span is gathered next time (it stays unreleased).
        state.next_seq = stop;
        self.release_locked(&mut state);
        if owned.len() as u64 == batch_size || state.epochs.is_complete() {
            return Ok(Step::Done);
        }
        Ok(Step::More)
    }

    /// The samples of `loan`: their indices, flags, and each field's bytes with its size per
    /// sample. A skimming consumer, whose loans no cursor protects, checks every copy made
    /// from it against [`ConsumerRing::is_intact`] and drops one that may be torn.
    pub(super) fn window(&self, loan: &ReadLoan) -> Window<'_> {
        let schema = &self.ring.layout().schema;
        let fields = (schema.fields().iter().enumerate())
            .map(|(k, f)| (self.ring.field(loan, k), f.bytes()))
            .collect();
        (self.ring.indices(loan), self.ring.flags(loan), fields)
    }
}

/// What [`Consumer::window`] returns: indices, flags, and each field's bytes with its size
/// per sample.
pub(super) type Window<'a> = (&'a [u64], &'a [u64], Vec<(&'a [u8], usize)>);
