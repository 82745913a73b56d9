//! Skimming: a consumer that held the others back stops gating the feed and copies what its
//! epoch still wants as the samples pass (the producer asks; `crate::skim` decides when it
//! paces the feed again; `crate::epochs` keeps every epoch exact).
//!
//! Holding no cursor, it may be overtaken: the producer can overwrite a slot while it copies.
//! Each copy is checked afterwards against the ring's `lent` word (a seqlock, model-checked
//! in `ring/tests/loom.rs`); a copy that may be torn is dropped and the samples it held stay
//! wanted, to be taken when they pass again (every producer-epoch holds every index).

use super::gather::Step;
use super::*;
use crate::skim::{Attach, SkimPace, SkimRule};

/// Where a consumer stands with skimming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Skimming {
    /// It paces the feed (or is let go).
    #[default]
    Off,
    /// Asked to skim: it copies, and still holds batches handed out before (its cursor
    /// gates the feed until they are dropped and it says `Skim`).
    Asked,
    /// It said `Skim`: its cursor gates nothing.
    On,
}

/// Samples a skimming consumer waits for at most before it copies what came.
const SKIM_SPAN: u64 = 16;

impl Consumer {
    /// Under the state lock, before each batch: follows the producer's request to skim, and
    /// says `Skim` once no batch of the ring is held.
    pub(super) fn check_skim(&self, state: &mut State) -> Result<(), ConsumerError> {
        if state.skimming == Skimming::Off && self.cursor.asked_to_skim() {
            state.epochs.skim();
            state.skimming = Skimming::Asked;
            state.skims += 1;
            state.pace = Some(SkimPace::new(SkimRule::default(), Instant::now()));
            tracing::info!(
                consumer_id = self.consumer_id,
                "the producer asks this consumer to skim (it held the others back): it \
                 copies what its epoch still needs as the samples pass"
            );
        }
        if state.skimming == Skimming::Asked && state.held.is_empty() {
            let sent = {
                let sock = self.sock.lock().unwrap_or_else(PoisonError::into_inner);
                protocol::send(&sock, &ClientMessage::Skim, &[])
            };
            if let Err(source) = sent {
                let error = ConsumerError::Protocol {
                    socket: self.socket.clone(),
                    source: Arc::new(source),
                };
                return Err(self.fail(state, error));
            }
            state.skimming = Skimming::On;
        }
        Ok(())
    }

    /// Whether this consumer skims (it held the others back; see [`crate::skim`]).
    pub fn skimming(&self) -> bool {
        self.state().skimming != Skimming::Off
    }

    /// One span of a skimmed epoch: waits for samples to pass (at most the rule's idle time),
    /// copies those the epoch wants, and keeps the copies only if none may be torn.
    pub(super) fn skim_step(&self, number: u64, owned: &mut Owned) -> Result<Step, ConsumerError> {
        let batch_size = u64::from(self.config.batch_size);
        let schema = &self.ring.layout().schema;
        let capacity = self.ring.layout().capacity;
        let mut state = self.state();
        if state.epochs.current() != Some(number) {
            return Ok(Step::Superseded);
        }
        if owned.len() as u64 >= batch_size || state.epochs.is_complete() {
            return Ok(Step::Done);
        }
        if let Some(error) = state.fatal.clone() {
            return Err(error);
        }
        if let Some(why) = state.pace.as_mut().and_then(|p| p.tick(Instant::now())) {
            self.attach_again(&mut state, why)?;
            return Ok(Step::More);
        }
        // Overtaken: what is older than this may be overwritten (it stays wanted).
        let first = state.next_seq.max(self.ring.intact_from());
        state.next_seq = first;
        let head = self.ring.head();
        if head <= first {
            let need = (batch_size - owned.len() as u64).clamp(1, SKIM_SPAN);
            let idle = state.pace.as_ref().map_or(POLL, |p| p.rule().idle);
            drop(state);
            let started = Instant::now();
            self.wait_for_head(first + need, Some(started + idle))?;
            let waited = started.elapsed();
            self.cursor.add_waited(waited);
            let mut state = self.state();
            let nothing_passed = self.ring.head() == head;
            let why = (state.pace.as_mut()).and_then(|p| p.waited(waited, nothing_passed));
            if let Some(why) = why {
                self.attach_again(&mut state, why)?;
            }
            return Ok(Step::More);
        }
        let count = (head - first).min(capacity / 2);
        // SAFETY: `first..first + count` is below the head (written once), inside the double
        // mapping (`count <= capacity`). This consumer holds no cursor on it, so the producer
        // may be overwriting its oldest part meanwhile: the bytes are plain data (every
        // pattern is a value), each index word is read once, and the whole copy is checked
        // against `intact_from` below and dropped if it may be torn.
        let (indices, flags, fields) = unsafe { self.window(first, count) };
        let before = owned.len();
        let mut stop = first + count;
        for k in 0..count as usize {
            // SAFETY: a valid, aligned word of the mapping; volatile: read exactly once.
            let index = unsafe { std::ptr::read_volatile(&indices[k]) };
            if state.epochs.deliver(index) {
                owned.push(first + k as u64, k, &fields, index, flags[k]);
                if owned.len() as u64 == batch_size || state.epochs.is_complete() {
                    stop = first + k as u64 + 1;
                    break;
                }
            }
        }
        let intact = self.ring.intact_from();
        if intact > first {
            // A slot of the span was lent for writing while it was copied.
            for &index in &owned.indices[before..] {
                state.epochs.undeliver(index);
            }
            owned.truncate(before, schema);
            state.next_seq = intact;
            return Ok(Step::More);
        }
        let taken = (owned.len() - before) as u64;
        if let Some(pace) = state.pace.as_mut() {
            pace.scanned(stop - first, taken);
        }
        state.next_seq = stop;
        // Asked but still holding batches: its cursor still gates the feed.
        self.release_locked(&mut state);
        if owned.len() as u64 == batch_size || state.epochs.is_complete() {
            return Ok(Step::Done);
        }
        Ok(Step::More)
    }

    /// A skimming consumer paces the feed again (`why`): asks to be attached.
    fn attach_again(&self, state: &mut State, why: Attach) -> Result<(), ConsumerError> {
        match why {
            Attach::Outpaced {
                waited,
                window,
                taken,
                scanned,
            } => tracing::info!(
                consumer_id = self.consumer_id,
                "the feed no longer outruns this consumer (it waited {:.1} s of {:.1} s and \
                 took {taken} of the {scanned} samples that passed): it paces the feed again",
                waited.as_secs_f64(),
                window.as_secs_f64()
            ),
            Attach::Idle(dt) => tracing::info!(
                consumer_id = self.consumer_id,
                "nothing passed for {:.1} s while this consumer skimmed: it paces the feed again",
                dt.as_secs_f64()
            ),
        }
        self.rejoin(state)
    }
}
