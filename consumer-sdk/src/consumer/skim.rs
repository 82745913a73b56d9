//! Skimming: a consumer that held the others back stops gating the feed and copies what its
//! epoch still wants as the samples pass (the producer asks; `crate::skim` decides when it
//! paces the feed again; `crate::epochs` keeps every epoch exact).
//!
//! Holding no cursor, it may be overtaken: the producer can overwrite a slot while it copies.
//! Each copy is checked afterwards against the ring's `lent` word (a seqlock, model-checked
//! in `ring/tests/loom.rs`); a copy that may be torn is dropped and the samples it held stay
//! wanted, to be taken when they pass again (every producer-epoch holds every index).
//!
//! A consumer asked to skim while it holds batches of the ring (a training loop that keeps
//! the previous batch, or an example batch for logging) skims at once, from the batch after
//! those it holds: they stop gating the feed, and each says whether the producer has since
//! overwritten it ([`BatchOf::is_intact`]). Waiting for them to be dropped would hold the
//! others back until the stall timeout, or for ever for a batch kept for good.

use super::gather::Step;
use super::*;
use crate::skim::{Attach, SkimPace, SkimRule};

/// Where a consumer stands with skimming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Skimming {
    /// It paces the feed (or is let go).
    #[default]
    Off,
    /// Asked to skim, and not said `Skim` yet (it says so before its next batch).
    Asked,
    /// It said `Skim`: its cursor gates nothing.
    On,
}

/// Samples a skimming consumer waits for at most before it copies what came.
const SKIM_SPAN: u64 = 16;

impl Consumer {
    /// Under the state lock, before each batch: follows the producer's request to skim, and
    /// says `Skim` at once, whatever batches of the ring it holds (they stop gating the feed).
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
        if state.skimming == Skimming::Asked {
            if !state.held.is_empty() {
                tracing::info!(
                    consumer_id = self.consumer_id,
                    held = state.held.len(),
                    "skimming while batches of the ring are held: they no longer hold the feed \
                     back, and each says whether it was overwritten (is_intact)"
                );
            }
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
            // What it still needs, wherever it passes (protocol 16): the feed decodes no
            // more for it than its epoch lacks.
            self.declare(state);
        }
        Ok(())
    }

    /// Whether this consumer skims (it held the others back; see [`crate::skim`]).
    pub fn skimming(&self) -> bool {
        self.state().skimming != Skimming::Off
    }

    /// One span of a skimmed epoch: waits for samples to pass (at most the rule's idle time),
    /// copies those the epoch wants, and keeps the copies no loan may have overwritten.
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
        // Asked: say `Skim` before copying.
        self.check_skim(&mut state)?;
        let on = state.skimming == Skimming::On;
        if on && let Some(why) = state.pace.as_mut().and_then(|p| p.tick(Instant::now())) {
            self.attach_again(&mut state, why)?;
            return Ok(Step::More);
        }
        let head = self.ring.head();
        let intact = self.ring.intact_from();
        if state.next_seq < intact {
            // Overtaken: what is older may be overwritten (it stays wanted). Start an eighth
            // of the ring past the oldest intact slot, or the next copy is overtaken at once.
            state.next_seq = intact.saturating_add(capacity / 8).min(head.max(intact));
        }
        let first = state.next_seq;
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
            if let (true, Some(why)) = (state.skimming == Skimming::On, why) {
                self.attach_again(&mut state, why)?;
            }
            return Ok(Step::More);
        }
        let count = (head - first).min(capacity / 2);
        // Below the head: a loan no cursor protects, so the producer may be overwriting its
        // oldest part meanwhile. Each index is read once, and every copy is checked against
        // `intact_from` below and dropped if it may be torn.
        let Some(loan) = self.ring.read_loan(first, count as usize) else {
            return Ok(Step::More); // the head moved back: a hostile producer; look again
        };
        let (_, flags, fields) = self.window(&loan);
        let mut span =
            Owned::with_capacity((batch_size as usize).saturating_sub(owned.len()), schema);
        let mut seqs = Vec::new();
        let mut stop = first + count;
        for (k, &flag) in flags.iter().enumerate() {
            // `k` is a sample of the loan: `index_once` has it.
            let Some(index) = self.ring.index_once(&loan, k) else {
                break;
            };
            // A hole carries no sample; the index passes again, decoded, while a skimmer
            // needs it.
            if flag & FLAG_HOLE != 0 {
                continue;
            }
            if state.epochs.deliver(index) {
                let seq = first + k as u64;
                span.push(seq, k, &fields, index, flag);
                seqs.push(seq);
                if (owned.len() + span.len()) as u64 == batch_size || state.epochs.is_complete() {
                    stop = seq + 1;
                    break;
                }
            }
        }
        // Copies of sequences below this may be torn (a slot lent meanwhile): in sequence
        // order, so a prefix. Their indices stay wanted; the rest are kept.
        let intact = self.ring.intact_from();
        let torn = seqs.partition_point(|&seq| seq < intact);
        for &index in &span.indices[..torn] {
            state.epochs.undeliver(index);
        }
        if torn > 0 {
            // Wanted again: the feed must decode them where they pass next.
            self.declare(&mut state);
        }
        if let Some(&first_kept) = seqs.get(torn) {
            owned.append_tail(&span, torn, first_kept, schema);
        }
        if let Some(pace) = state.pace.as_mut() {
            pace.scanned(stop - first, (seqs.len() - torn) as u64);
        }
        state.next_seq = stop.max(intact);
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
