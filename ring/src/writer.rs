//! The producer's only way to write a slot: a [`WriteLoan`] from [`ProducerRing::try_loan`],
//! granted only when every attached reader's cursor allows it (iceoryx2's
//! `loan_uninit → write → send`). The soundness argument for the writes lives here, in one
//! place:
//!
//! - sequences are lent once each, in order (`next`, under the publisher's lock), so no two
//!   loans share a slot while both live: a loan for `s` is granted only when `s < m + C` for
//!   `m` the smaller of the slowest cursor and the head, and the head stops at the oldest
//!   uncommitted loan (a reader attached at `next` may show a cursor above the head: the
//!   head bound is what keeps `s − C` committed then);
//! - the slot of `s` last held `s − C`, which every attached reader has released (`s − C < m`);
//! - `s` is at or above the head until the loan commits, so no reader reads it meanwhile;
//! - a reader attaches only at or above `next` ([`Readers::attach`]): no loan already granted
//!   lies in its range;
//! - each cursor is read **once** per decision and must lie in `[floor, max(head, floor)]`;
//!   a cursor outside is reported as a [`Violation`] and decides nothing, so a hostile or
//!   broken consumer can only get itself detached.
//!
//! A reader that is *let go* (detached from the gate while its process still holds the
//! mapping) may see its slots overwritten; [`CursorPage::deliver`] makes sure it never hands
//! out a batch after that.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::protocol_core;
use crate::shm::{CursorPage, ProducerRing, SlotMut};

/// Identifies a ring within this process, so that a [`Readers`] set is used only with its own.
static NEXT_RING: AtomicU64 = AtomicU64::new(1);

pub(crate) fn new_ring_id() -> u64 {
    NEXT_RING.fetch_add(1, Ordering::Relaxed)
}

/// What the publisher tracks: the next sequence to lend, the head, which lent slots are done.
#[derive(Debug)]
pub(crate) struct Publisher {
    next: u64,
    head: u64,
    done: Vec<bool>,
}

impl Publisher {
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            next: 0,
            head: 0,
            done: vec![false; capacity as usize],
        }
    }
}

/// The cursors that gate the producer's writes: one per attached consumer. Made once per ring
/// by [`ProducerRing::readers`].
#[derive(Debug)]
pub struct Readers {
    ring: u64,
    list: Vec<Reader>,
}

#[derive(Debug)]
struct Reader {
    id: u64,
    page: Arc<CursorPage>,
    floor: u64,
}

/// A reader's cursor outside `[floor, max(head, floor)]`: a protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Violation {
    /// The reader's id.
    pub id: u64,
    /// The cursor it showed.
    pub cursor: u64,
    /// The lowest cursor it may show (where it was attached).
    pub floor: u64,
    /// The head when it was read.
    pub head: u64,
}

/// What [`ProducerRing::try_loan`] decided.
#[derive(Debug)]
#[must_use]
pub enum Gate<'r> {
    /// Write this loan's slot.
    Loan(WriteLoan<'r>),
    /// No reader is attached: there is nobody to write for.
    Idle,
    /// The ring is full: reader `id`, at `cursor`, holds the oldest slot that is needed.
    Full {
        /// The slowest reader.
        id: u64,
        /// Its cursor.
        cursor: u64,
        /// Its page, to sleep on until it releases.
        page: Arc<CursorPage>,
    },
    /// These readers broke the protocol: detach them (nothing was decided).
    Violations(Vec<Violation>),
    /// The next sequence lies `read_ahead` or more beyond what any reader has asked for
    /// ([`ProducerRing::try_loan_within`]): decoding it now could be wasted. Sleep on the
    /// page of the reader that asked for the most until its demand word moves from `word`.
    Ahead {
        /// That reader's page.
        page: Arc<CursorPage>,
        /// Its demand word as read before the decision.
        word: u32,
    },
}

/// [`Readers::attach`] refused: the start lies below sequences already lent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot attach a reader at {at}: sequences up to {next} are already lent")]
pub struct AttachError {
    /// The start asked for.
    pub at: u64,
    /// The next sequence to lend.
    pub next: u64,
}

impl Readers {
    pub(crate) fn new(ring: u64) -> Self {
        Self {
            ring,
            list: Vec::new(),
        }
    }

    /// Attaches `page` as reader `id`, its cursor set to `at` (default: the next sequence to
    /// be lent, where a joining consumer starts). Returns the start.
    pub fn attach(
        &mut self,
        ring: &ProducerRing,
        id: u64,
        page: Arc<CursorPage>,
        at: Option<u64>,
    ) -> Result<u64, AttachError> {
        assert_eq!(self.ring, ring.id(), "a reader set used with another ring");
        let publisher = ring.publisher();
        let at = at.unwrap_or(publisher.next);
        if at < publisher.next {
            return Err(AttachError {
                at,
                next: publisher.next,
            });
        }
        page.reattach(at);
        self.list.retain(|r| r.id != id);
        self.list.push(Reader {
            id,
            page,
            floor: at,
        });
        Ok(at)
    }

    /// Stops `id`'s cursor from gating writes. Returns whether it was attached.
    pub fn detach(&mut self, id: u64) -> bool {
        let before = self.list.len();
        self.list.retain(|r| r.id != id);
        self.list.len() != before
    }

    /// Whether `id` is attached.
    pub fn contains(&self, id: u64) -> bool {
        self.list.iter().any(|r| r.id == id)
    }

    /// Attached readers.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether none is attached.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

impl ProducerRing {
    /// The reader set of this ring; `None` after the first call (there is only one).
    pub fn readers(&self) -> Option<Readers> {
        (!self.readers_taken().swap(true, Ordering::SeqCst)).then(|| Readers::new(self.id()))
    }

    /// The next sequence a loan would be for: where a consumer joining now starts.
    pub fn next_seq(&self) -> u64 {
        self.publisher().next
    }

    /// Moves an idle ring's first sequence forward to `seq` (its head too), as for a feed that
    /// resumes numbering where another left off. Only with no reader attached and no loan
    /// outstanding, and never backwards.
    pub fn start_at(&self, readers: &Readers, seq: u64) -> Result<(), AttachError> {
        assert_eq!(
            readers.ring,
            self.id(),
            "a reader set used with another ring"
        );
        let mut publisher = self.publisher();
        if !readers.is_empty() || publisher.head != publisher.next || seq < publisher.next {
            return Err(AttachError {
                at: seq,
                next: publisher.next,
            });
        }
        publisher.next = seq;
        publisher.head = seq;
        self.publish(seq);
        Ok(())
    }

    /// Lends the next sequence's slot if every attached reader allows it; see the module docs.
    /// No read-ahead limit: the producer may decode as far as the ring allows.
    pub fn try_loan(&self, readers: &Readers) -> Gate<'_> {
        self.try_loan_within(readers, u64::MAX)
    }

    /// [`ProducerRing::try_loan`] that also keeps the next sequence below the furthest any
    /// reader has asked for (its *demand*, the end of the batch it reserved last) plus
    /// `read_ahead`: the feed decodes what will be read, a bounded amount ahead, not a
    /// ring's worth. A reader waiting for a batch has asked for its end, so it always gets
    /// it: the limit never stalls a reader, only decoding nobody asked for yet.
    pub fn try_loan_within(&self, readers: &Readers, read_ahead: u64) -> Gate<'_> {
        self.try_loan_counted(readers, read_ahead, |_| 0)
    }

    /// [`ProducerRing::try_loan_within`] where positions that were not decoded (holes, from
    /// [`WriteLoan::commit_hole`]) do not count against the read-ahead: `holes_from(demand)`
    /// says how many holes lie at or after the furthest demand, and the limit moves up by as
    /// many. The read-ahead then bounds decoding, not positions.
    pub fn try_loan_counted(
        &self,
        readers: &Readers,
        read_ahead: u64,
        holes_from: impl Fn(u64) -> u64,
    ) -> Gate<'_> {
        assert_eq!(
            readers.ring,
            self.id(),
            "a reader set used with another ring"
        );
        let capacity = self.layout().capacity;
        let mut publisher = self.publisher();
        let (seq, head) = (publisher.next, publisher.head);
        let mut slowest: Option<(&Reader, u64)> = None;
        // The reader that asked for the most, with its demand word read before its demand
        // (a later change makes the word differ, so a sleep on it cannot miss the change).
        // A reader asks from its first reservation on: one whose demand is still where it was
        // attached (`floor`) has asked for nothing yet and lets nothing be decoded, so that
        // a connect costs no decode before the consumer says what it needs (protocol 13's
        // `Needs`). With none that asked, the producer sleeps on the first reader's page.
        let mut furthest: Option<(&Reader, u32, u64)> = None;
        let mut first: Option<(&Reader, u32)> = None;
        let mut violations = Vec::new();
        for reader in &readers.list {
            let word = reader.page.demand_word();
            let demand = reader.page.demand();
            first.get_or_insert((reader, word));
            if demand > reader.floor && furthest.is_none_or(|(_, _, d)| demand > d) {
                furthest = Some((reader, word, demand));
            }
            // Read once: every decision below uses this value.
            let cursor = reader.page.cursor();
            if cursor < reader.floor || cursor > head.max(reader.floor) {
                violations.push(Violation {
                    id: reader.id,
                    cursor,
                    floor: reader.floor,
                    head,
                });
            } else if slowest.is_none_or(|(_, c)| cursor < c) {
                slowest = Some((reader, cursor));
            }
        }
        if !violations.is_empty() {
            return Gate::Violations(violations);
        }
        let Some((reader, cursor)) = slowest else {
            return Gate::Idle;
        };
        // The head too: a reader attached at `next` shows a cursor above the head, and `seq`'s
        // slot must not still be lent to `seq − C`.
        if !protocol_core::may_write(seq, cursor.min(head), capacity) {
            return Gate::Full {
                id: reader.id,
                cursor,
                page: reader.page.clone(),
            };
        }
        let ahead = match furthest {
            _ if read_ahead == u64::MAX => None, // no limit (`try_loan`)
            Some((reader, word, demand)) => (seq
                >= demand
                    .saturating_add(read_ahead)
                    .saturating_add(holes_from(demand)))
            .then_some((reader, word)),
            None => first,
        };
        if let Some((reader, word)) = ahead {
            return Gate::Ahead {
                page: reader.page.clone(),
                word,
            };
        }
        publisher.next += 1;
        // Before the slot is written (`WriteLoan::slot` fences again in the writing thread): a
        // skimming consumer that copies `seq − C` must learn it may be torn.
        self.lend(seq + 1);
        Gate::Loan(WriteLoan {
            ring: self,
            seq,
            committed: false,
        })
    }

    /// Marks `seq` done and publishes the run of done slots from the head; returns the new
    /// head when it moved.
    fn complete(&self, seq: u64) -> Option<u64> {
        let capacity = self.layout().capacity;
        let mut publisher = self.publisher();
        let Publisher { head, done, .. } = &mut *publisher;
        done[(seq % capacity) as usize] = true;
        let old = *head;
        while done[(*head % capacity) as usize] {
            done[(*head % capacity) as usize] = false;
            *head += 1;
        }
        (*head != old).then(|| {
            self.publish(*head);
            *head
        })
    }

    fn publisher(&self) -> MutexGuard<'_, Publisher> {
        self.publisher_lock()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// The right to write one sequence's slot, from [`ProducerRing::try_loan`]. Commit it with
/// [`WriteLoan::commit`]; dropping it uncommitted publishes the slot as a bad sample (every
/// field zero, an `i64` label −1, the bad flag), so that the head never stalls and nothing
/// garbage is delivered silently.
#[derive(Debug)]
pub struct WriteLoan<'r> {
    ring: &'r ProducerRing,
    seq: u64,
    committed: bool,
}

impl WriteLoan<'_> {
    /// The sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The slot's fields, dataset index and flags, writable.
    pub fn slot(&mut self) -> SlotMut<'_> {
        // The loan may have been taken on another thread (the pipeline hands loans to its
        // workers): the seqlock's `Release` fence must precede the slot's writes in the thread
        // that makes them (`protocol_core::lend`; the loan's hand-over orders the `lent` record
        // before it).
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: this loan is the only one for `seq` (lent once, in order), the slot's
        // previous sample is released by every attached reader, and `seq` is at or above
        // the head until `commit`; the module docs give the argument. `&mut self` keeps the
        // borrows unique within this process.
        unsafe { self.ring.slot_mut(self.seq) }
    }

    /// Publishes the slot (with every earlier one that is done) as a good sample of dataset
    /// index `index`; returns the new head when it moved, for waking consumers.
    pub fn commit(mut self, index: u64) -> Option<u64> {
        let slot = self.slot();
        *slot.index = index;
        *slot.flags = 0;
        self.publish()
    }

    /// Publishes the slot as a bad sample, with the given dataset index: every field zero,
    /// an `i64` `label` −1, the flags [`FLAG_BAD`](crate::layout::FLAG_BAD).
    pub fn commit_bad(mut self, index: u64) -> Option<u64> {
        let label = self.ring.layout().schema.label_field();
        let mut slot = self.slot();
        slot.clear_bad(label);
        *slot.index = index;
        self.publish()
    }

    /// Publishes the slot as a hole at dataset index `index`: nobody needed it, so nothing was
    /// decoded. Only the index and the flags [`FLAG_HOLE`](crate::layout::FLAG_HOLE) |
    /// [`FLAG_BAD`](crate::layout::FLAG_BAD) are written; the fields keep what they held.
    pub fn commit_hole(mut self, index: u64) -> Option<u64> {
        let slot = self.slot();
        *slot.index = index;
        *slot.flags = crate::layout::FLAG_HOLE | crate::layout::FLAG_BAD;
        self.publish()
    }

    fn publish(&mut self) -> Option<u64> {
        self.committed = true;
        self.ring.complete(self.seq)
    }
}

impl Drop for WriteLoan<'_> {
    fn drop(&mut self) {
        if !self.committed {
            let label = self.ring.layout().schema.label_field();
            self.slot().clear_bad(label);
            self.publish();
        }
    }
}

/// The publisher behind its lock, and the flag that hands out the one reader set, as the ring holds them.
pub(crate) type PublisherLock = Mutex<Publisher>;
pub(crate) type TakenFlag = AtomicBool;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RingLayout;
    use crate::layout::{FLAG_BAD, FLAG_HOLE};
    use crate::shm::ConsumerRing;

    fn ring() -> (ProducerRing, Readers) {
        let ring = ProducerRing::create(RingLayout::image(512, 8, 8).unwrap()).unwrap();
        let readers = ring.readers().unwrap();
        (ring, readers)
    }

    #[test]
    fn nothing_is_lent_without_a_reader_and_the_reader_set_is_one_per_ring() {
        let (ring, readers) = ring();
        assert!(matches!(ring.try_loan(&readers), Gate::Idle));
        assert!(ring.readers().is_none(), "a second reader set");
    }

    #[test]
    fn a_hole_is_published_in_order_with_its_index_and_the_hole_flag_and_writes_no_field() {
        let (ring, mut readers) = ring();
        let page = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 1, page, None).unwrap();
        fn loan<'r>(ring: &'r ProducerRing, readers: &Readers) -> WriteLoan<'r> {
            match ring.try_loan(readers) {
                Gate::Loan(loan) => loan,
                other => panic!("{other:?}"),
            }
        }
        let mut good = loan(&ring, &readers);
        good.slot().field(0).fill(7);
        assert_eq!(good.commit(10), Some(1));
        let hole = loan(&ring, &readers);
        let late = loan(&ring, &readers);
        // Published in order: the hole at 1 waits for nothing, the good one at 2 for the hole.
        assert_eq!(late.commit(12), None);
        assert_eq!(hole.commit_hole(11), Some(3));
        let view = ConsumerRing::map(ring.fd(), ring.layout().clone()).unwrap();
        let loan = view.read_loan(0, 3).unwrap();
        assert_eq!(view.indices(&loan), &[10, 11, 12]);
        assert_eq!(view.flags(&loan), &[0, FLAG_HOLE | FLAG_BAD, 0]);
        let image = 8 * 8 * 3;
        let fields = view.field(&loan, 0);
        assert!(fields[..image].iter().all(|&b| b == 7));
        assert!(
            fields[image..2 * image].iter().all(|&b| b == 0),
            "a hole writes no field"
        );
    }

    #[test]
    fn holes_beyond_the_furthest_demand_do_not_count_against_the_read_ahead() {
        let (ring, mut readers) = ring();
        let page = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 1, page.clone(), None).unwrap();
        page.raise_demand(2);
        // Read-ahead 4 past demand 2: positions 0..6, plus one more per hole at or past 2.
        let mut taken = Vec::new();
        loop {
            let holes = taken.iter().filter(|&&(s, h)| h && s >= 2).count() as u64;
            match ring.try_loan_counted(&readers, 4, |demand| {
                assert_eq!(demand, 2);
                holes
            }) {
                Gate::Loan(loan) => {
                    let seq = loan.seq();
                    // Every other position is a hole.
                    let hole = seq % 2 == 1;
                    if hole {
                        loan.commit_hole(seq);
                    } else {
                        loan.commit(seq);
                    }
                    taken.push((seq, hole));
                }
                Gate::Ahead { .. } => break,
                other => panic!("{other:?}"),
            }
        }
        let decoded_past_demand = taken.iter().filter(|&&(s, h)| !h && s >= 2).count();
        assert_eq!(
            decoded_past_demand, 4,
            "the read-ahead counts decodes: {taken:?}"
        );
    }

    #[test]
    fn loans_stop_a_read_ahead_beyond_the_furthest_demand_and_a_raise_lets_them_go_on() {
        let (ring, mut readers) = ring();
        let slow = Arc::new(CursorPage::create(0).unwrap());
        let fast = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 1, slow.clone(), None).unwrap();
        readers.attach(&ring, 2, fast.clone(), None).unwrap();
        let take = |n: u64| {
            let mut seqs = Vec::new();
            loop {
                match ring.try_loan_within(&readers, 4) {
                    Gate::Loan(loan) => {
                        seqs.push(loan.seq());
                        loan.commit(0);
                    }
                    Gate::Ahead { page, word } => {
                        assert_eq!(word, page.demand() as u32);
                        return (seqs, Arc::ptr_eq(&page, &fast));
                    }
                    other => panic!("{other:?}"),
                }
                assert!(seqs.len() as u64 <= n, "past the read-ahead: {seqs:?}");
            }
        };
        // Attached at 0, nothing asked for: nothing decoded (until protocol 13 this was a
        // warm-up of the read-ahead; a resumed consumer's connect then decoded samples it
        // would declare unneeded).
        let (seqs, on_fast) = take(0);
        assert!(seqs.is_empty());
        assert!(
            !on_fast,
            "with none that asked, the producer sleeps on the first page"
        );
        // The first ask lets the read-ahead past it go.
        slow.raise_demand(1);
        assert_eq!(take(5).0, [0, 1, 2, 3, 4]);
        // The furthest demand counts (the slower reader's does not hold it back), and the
        // producer sleeps on the page of the reader that asked for the most.
        slow.raise_demand(2);
        fast.raise_demand(10);
        let (seqs, on_fast) = take(9);
        assert_eq!(seqs, (5..14).collect::<Vec<_>>());
        assert!(on_fast);
        // Demand only grows.
        fast.raise_demand(3);
        assert_eq!(fast.demand(), 10);
        assert!(take(0).0.is_empty());
        // Without a limit, as far as the ring allows.
        assert!(matches!(ring.try_loan(&readers), Gate::Loan(l) if l.seq() == 14));
    }

    #[test]
    fn loans_are_unique_in_order_and_stop_a_ring_ahead_of_the_slowest_cursor() {
        let (ring, mut readers) = ring();
        let page = Arc::new(CursorPage::create(0).unwrap());
        assert_eq!(readers.attach(&ring, 7, page.clone(), None).unwrap(), 0);
        let mut loans = Vec::new();
        for expected in 0..512 {
            match ring.try_loan(&readers) {
                Gate::Loan(loan) => {
                    assert_eq!(loan.seq(), expected);
                    loans.push(loan);
                }
                other => panic!("seq {expected}: {other:?}"),
            }
        }
        match ring.try_loan(&readers) {
            Gate::Full { id, cursor, .. } => assert_eq!((id, cursor), (7, 0)),
            other => panic!("a loan past the ring: {other:?}"),
        }
        // Committed out of order: the head moves only over a run of done slots.
        let second = loans.remove(1);
        assert_eq!(second.commit(1), None);
        assert_eq!(loans.remove(0).commit(0), Some(2));
        drop(loans); // dropped uncommitted: published as bad samples
        assert_eq!(ring.head(), 512);
        let view = ConsumerRing::map(ring.fd(), ring.layout().clone()).unwrap();
        let (tail, head) = (view.read_loan(2, 3).unwrap(), view.read_loan(0, 3).unwrap());
        let (images, labels, flags) = (
            view.field(&tail, 0),
            view.field(&tail, 1),
            view.flags(&head),
        );
        assert!(images.iter().all(|&b| b == 0));
        assert!(labels.chunks(8).all(|l| l == (-1i64).to_ne_bytes()));
        assert_eq!(flags, &[0, 0, FLAG_BAD], "committed, committed, dropped");
        page.release(5);
        assert!(matches!(ring.try_loan(&readers), Gate::Loan(l) if l.seq() == 512));
    }

    #[test]
    fn a_cursor_outside_its_range_is_a_violation_and_decides_nothing() {
        let (ring, mut readers) = ring();
        let honest = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 1, honest, None).unwrap();
        let hostile = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 2, hostile.clone(), None).unwrap();
        // Ahead of the head: it would let the producer overwrite what the honest one holds.
        hostile.release(1_000);
        match ring.try_loan(&readers) {
            Gate::Violations(v) => {
                assert_eq!(v.len(), 1);
                assert_eq!((v[0].id, v[0].cursor, v[0].head), (2, 1_000, 0));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(ring.next_seq(), 0, "a violation lent something");
        assert!(readers.detach(2));
        assert!(matches!(ring.try_loan(&readers), Gate::Loan(l) if l.seq() == 0));
        // Below where it was attached.
        let late = Arc::new(CursorPage::create(0).unwrap());
        assert_eq!(readers.attach(&ring, 3, late.clone(), None).unwrap(), 1);
        late.release(0);
        assert!(matches!(ring.try_loan(&readers), Gate::Violations(v) if v[0].id == 3));
    }

    #[test]
    fn a_reader_cannot_attach_below_what_was_already_lent() {
        let (ring, mut readers) = ring();
        let page = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 1, page.clone(), None).unwrap();
        for _ in 0..10 {
            let Gate::Loan(loan) = ring.try_loan(&readers) else {
                panic!("no loan")
            };
            loan.commit(0);
        }
        let other = Arc::new(CursorPage::create(0).unwrap());
        let err = readers
            .attach(&ring, 2, other.clone(), Some(5))
            .unwrap_err();
        assert_eq!((err.at, err.next), (5, 10));
        assert_eq!(readers.attach(&ring, 2, other, Some(12)).unwrap(), 12);
    }

    #[test]
    fn a_consumer_let_go_cannot_deliver_and_reattaching_clears_it() {
        let (ring, mut readers) = ring();
        let page = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 1, page.clone(), None).unwrap();
        let consumer = CursorPage::map(page.fd().unwrap()).unwrap();
        consumer.deliver(4).unwrap();
        let seen = page.lease();
        consumer.deliver(8).unwrap();
        assert!(!page.let_go(seen), "let go over a delivery it did not see");
        assert!(page.let_go(page.lease()));
        assert!(consumer.deliver(12).is_err());
        assert!(consumer.is_let_go());
        readers.detach(1);
        readers.attach(&ring, 1, page.clone(), None).unwrap();
        assert!(!consumer.is_let_go());
        consumer.deliver(3).unwrap();
    }

    #[test]
    fn a_slow_loan_is_never_lapped_even_by_a_reader_attached_above_the_head() {
        let (ring, mut readers) = ring();
        let first = Arc::new(CursorPage::create(0).unwrap());
        readers.attach(&ring, 1, first, None).unwrap();
        let Gate::Loan(slow) = ring.try_loan(&readers) else {
            panic!("no loan")
        };
        for _ in 1..10 {
            let Gate::Loan(loan) = ring.try_loan(&readers) else {
                panic!("no loan")
            };
            loan.commit(0);
        }
        // The only reader leaves; a new one attaches at 10 while loan 0 is still out.
        readers.detach(1);
        let late = Arc::new(CursorPage::create(0).unwrap());
        assert_eq!(readers.attach(&ring, 2, late, None).unwrap(), 10);
        let mut lent = Vec::new();
        loop {
            match ring.try_loan(&readers) {
                Gate::Loan(loan) => {
                    assert!(loan.seq() < slow.seq() + 512, "slot of loan 0 lent again");
                    lent.push(loan);
                }
                Gate::Full { .. } => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(lent.last().map(WriteLoan::seq), Some(511));
        drop(slow);
    }
}
