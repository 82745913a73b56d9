//! The ring's shared memory: the producer's read-write view and a consumer's read-only view,
//! and the per-consumer cursor page.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::ShmError;
use crate::layout::RingLayout;
use crate::protocol_core;
use crate::schema::MAX_FIELDS;
use crate::sys::{self, Mapping, PAGE};
use crate::wake_core::{self, Futex, WakeWords};
use crate::writer::{self, Publisher, PublisherLock, TakenFlag};

/// "ladlerng" in ASCII.
const MAGIC: u64 = 0x676e_7272_656c_6461;

/// The header page at the start of the ring file: written by the producer only.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// All samples below this sequence number are written.
    head: AtomicU64,
    /// Low 32 bits of `head`. Consumers sleep on their own cursor page's `wake_word` (so that
    /// a publish wakes only those whose batch is complete); this word is kept for tools.
    head_word: AtomicU32,
    /// Non-zero once the producer has ended the stream.
    ended: AtomicU32,
    /// Every sequence below this is lent to a writer ([`protocol_core::lend`]): a skimming
    /// consumer's copy of a sequence below `lent − C` may be torn (protocol version 9).
    lent: AtomicU64,
}

/// A consumer's cursor page, a separate one-page memfd shared by that consumer and the
/// producer only: all samples below `cursor` are released.
///
/// # Safety contract (shared memory)
/// `#[repr(C)]`, only atomics, no pointers: valid at any bit pattern in any process.
#[repr(C)]
struct CursorWords {
    cursor: AtomicU64,
    /// Low 32 bits of `cursor`, the futex word the producer sleeps on.
    cursor_word: AtomicU32,
    /// Who sleeps on the head, in one word: how many of the consumer's threads, and the head
    /// the last of them to register waits for (the end of its next batch). With more than
    /// one, the producer wakes them on every publish (each re-checks its own target). The
    /// handshake on this word and the next is [`wake_core`]'s, model-checked with loom
    /// (protocol version 5; version 4 kept the count and the target in two words).
    waiters: AtomicU64,
    /// The futex word the consumer sleeps on; the producer bumps it to wake the consumer once
    /// the head reaches the target, so a batch of B samples costs one wake-up, not B.
    wake_word: AtomicU32,
    /// The lease word ([`protocol_core::deliver`]): what the consumer has delivered, a count
    /// that changes on every delivery, and the let-go bit the producer sets on a consumer
    /// that held the feed back for the stall timeout without taking a batch.
    lease: AtomicU64,
    /// What the consumer has asked for: the end of the last span it reserved (it only
    /// grows). The producer decodes at most its read-ahead beyond the largest demand of its
    /// consumers (protocol version 7).
    demand: AtomicU64,
    /// Low 32 bits of `demand`, the futex word the producer sleeps on while it is that far
    /// ahead.
    demand_word: AtomicU32,
    /// Nanoseconds the consumer has waited for data in all (a batch not yet published when
    /// it asked): the other side of the producer's "held back" (protocol version 8).
    waited_ns: AtomicU64,
    /// The producer's word: non-zero asks the consumer to *skim* (it held the others back:
    /// it should stop gating the feed and copy what it still needs as it passes, then say
    /// `Skim`). Cleared when the producer attaches it again (protocol version 9).
    skim: AtomicU32,
    /// The consumer's word: samples it has delivered in all, over every attachment and while
    /// skimming (what the producer reports as consumed by a consumer that holds no cursor).
    delivered: AtomicU64,
}

/// The double-mapped sample regions: one per schema field, then the indices and the flags.
#[derive(Debug)]
struct Regions {
    fields: Vec<Mapping>,
    indices: Mapping,
    flags: Mapping,
}

impl Regions {
    fn map(fd: BorrowedFd<'_>, layout: &RingLayout, writable: bool) -> Result<Self, ShmError> {
        let mut maps = layout
            .regions()
            .into_iter()
            .map(|(off, len)| {
                Mapping::new(fd, off, len, writable, true)
                    .map_err(ShmError::os("mapping a ring region"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let flags = maps.pop().expect("a layout has a flags region");
        let indices = maps.pop().expect("a layout has an indices region");
        Ok(Self {
            fields: maps,
            indices,
            flags,
        })
    }

    fn all(&self) -> impl Iterator<Item = &Mapping> {
        self.fields.iter().chain([&self.indices, &self.flags])
    }

    fn prefault(&self, writable: bool) -> Result<(), ShmError> {
        for m in self.all() {
            m.prefault(writable)
                .map_err(ShmError::os("pre-faulting the ring"))?;
        }
        Ok(())
    }
}

/// One slot's writable buffers, from [`WriteLoan::slot`](crate::writer::WriteLoan::slot): a
/// byte slice per schema field (in schema order), the dataset index and the flags word.
#[derive(Debug)]
pub struct SlotMut<'a> {
    fields: [&'a mut [u8]; MAX_FIELDS],
    count: usize,
    /// The sample's dataset index.
    pub index: &'a mut u64,
    /// The sample's flags ([`FLAG_BAD`](crate::layout::FLAG_BAD)); a commit sets them.
    pub(crate) flags: &'a mut u64,
}

impl<'a> SlotMut<'a> {
    /// Every field's bytes, in schema order.
    pub fn fields(&mut self) -> &mut [&'a mut [u8]] {
        &mut self.fields[..self.count]
    }

    /// Field `k`'s bytes.
    ///
    /// # Panics
    /// If `k` is not a field of the schema.
    pub fn field(&mut self, k: usize) -> &mut [u8] {
        self.fields()[k]
    }

    /// Zeroes every field and sets an `i64` `label` (when the schema has one) to −1: what
    /// a bad sample holds.
    pub(crate) fn clear_bad(&mut self, label: Option<usize>) {
        for field in self.fields() {
            field.fill(0);
        }
        if let Some(k) = label {
            self.field(k).copy_from_slice(&(-1i64).to_ne_bytes());
        }
        *self.flags = crate::layout::FLAG_BAD;
    }
}

/// The producer's view: creates the ring file, writes samples, publishes the head.
#[derive(Debug)]
pub struct ProducerRing {
    layout: RingLayout,
    /// What consumers get: the sealed file.
    fd: OwnedFd,
    header: Mapping,
    regions: Regions,
    id: u64,
    publisher: PublisherLock,
    readers_taken: TakenFlag,
}

impl ProducerRing {
    /// Creates, maps (read-write), pre-faults and seals a ring of `layout`. Only this
    /// process's mapping is writable, for good: every source, the Python producer's worker
    /// processes included, has its samples written through it (the workers into staging
    /// buffers of their own, copied into the slot here).
    pub fn create(layout: RingLayout) -> Result<Self, ShmError> {
        let fd =
            sys::memfd("ladle-ring", layout.file_len()).map_err(ShmError::os("memfd_create"))?;
        let header = Mapping::new(fd.as_fd(), 0, PAGE, true, false)
            .map_err(ShmError::os("mapping the ring header"))?;
        let regions = Regions::map(fd.as_fd(), &layout, true)?;
        regions.prefault(true)?;
        // From here on nobody can map the file writable, write(2) it or resize it: consumers
        // get it read-only whatever they try, a re-open through /proc included.
        sys::seal_against_writers(fd.as_fd()).map_err(ShmError::os("sealing the ring"))?;
        let capacity = layout.capacity;
        let ring = Self {
            layout,
            fd,
            header,
            regions,
            id: writer::new_ring_id(),
            publisher: PublisherLock::new(Publisher::new(capacity)),
            readers_taken: TakenFlag::new(false),
        };
        ring.header().magic.store(MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// The layout.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// The ring file, to hand to consumers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn header(&self) -> &Header {
        // SAFETY: the header page is mapped for the life of `self`, page-aligned, and holds
        // only atomics, valid at any bit pattern.
        unsafe { &*self.header.as_ptr().cast::<Header>() }
    }

    /// The head: every sample below it is published.
    pub fn head(&self) -> u64 {
        self.header().head.load(Ordering::Acquire)
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Records every sequence below `end` lent, before the writer of `end − 1` touches its
    /// slot ([`protocol_core::lend`]).
    pub(crate) fn lend(&self, end: u64) {
        protocol_core::lend(&self.header().lent, end);
    }

    pub(crate) fn publisher_lock(&self) -> &PublisherLock {
        &self.publisher
    }

    pub(crate) fn readers_taken(&self) -> &TakenFlag {
        &self.readers_taken
    }

    /// The writable buffers of sequence `seq`: its fields, dataset index and flags. Reached
    /// only through a [`WriteLoan`](crate::writer::WriteLoan) outside tests.
    ///
    /// # Safety
    /// The caller must be the only one touching `seq`'s slot until it is published, and
    /// the slot must be free: `protocol_core::may_write(seq, min_cursor, capacity)` held for
    /// the cursors of all live consumers, and `seq` is at or above the head.
    pub(crate) unsafe fn slot_mut(&self, seq: u64) -> SlotMut<'_> {
        let slot = (seq % self.layout.capacity) as usize;
        let mut fields: [&mut [u8]; MAX_FIELDS] = std::array::from_fn(|_| Default::default());
        let schema = self.layout.schema.fields();
        for ((out, map), field) in fields.iter_mut().zip(&self.regions.fields).zip(schema) {
            let bytes = field.bytes();
            // SAFETY: `slot < capacity`, so the slice stays inside the region's first copy;
            // exclusivity is the caller's contract above.
            *out = unsafe { std::slice::from_raw_parts_mut(map.as_ptr().add(slot * bytes), bytes) };
        }
        // SAFETY: as above; both word regions are page-aligned, so 8-byte aligned.
        unsafe {
            SlotMut {
                fields,
                count: schema.len(),
                index: &mut *self.regions.indices.as_ptr().cast::<u64>().add(slot),
                flags: &mut *self.regions.flags.as_ptr().cast::<u64>().add(slot),
            }
        }
    }

    /// Publishes every sample below `new_head`. Then call [`CursorPage::wake_if_due`] on each
    /// consumer's page: a consumer sleeps until the head reaches the end of its next batch.
    pub(crate) fn publish(&self, new_head: u64) {
        let header = self.header();
        protocol_core::publish(&header.head, new_head);
        header.head_word.store(new_head as u32, Ordering::SeqCst);
    }

    /// Marks the stream ended. Then call [`CursorPage::wake`] on each consumer's page (a
    /// consumer also notices within its wait's timeout).
    pub fn end(&self) {
        self.header().ended.store(1, Ordering::SeqCst);
    }
}

/// A consumer's read-only view of the ring.
#[derive(Debug)]
pub struct ConsumerRing {
    layout: RingLayout,
    header: Mapping,
    regions: Regions,
}

impl ConsumerRing {
    /// Maps the ring file received from the producer, read-only. A file from another process
    /// must be checked with [`size_sealed`] first (the consumer SDK does): one that the
    /// producer shrinks later would kill this process with `SIGBUS`.
    pub fn map(fd: BorrowedFd<'_>, layout: RingLayout) -> Result<Self, ShmError> {
        let actual = sys::file_len(fd).map_err(ShmError::os("fstat of the ring"))?;
        if actual != layout.file_len() {
            return Err(ShmError::SizeMismatch {
                expected: layout.file_len(),
                actual,
            });
        }
        let header = Mapping::new(fd, 0, PAGE, false, false)
            .map_err(ShmError::os("mapping the ring header"))?;
        let regions = Regions::map(fd, &layout, false)?;
        regions.prefault(false)?;
        let ring = Self {
            layout,
            header,
            regions,
        };
        if ring.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(ShmError::BadMagic);
        }
        Ok(ring)
    }

    fn header(&self) -> &Header {
        // SAFETY: as in `ProducerRing::header`; atomics are read through a read-only mapping,
        // which loads (and FUTEX_WAIT) permit.
        unsafe { &*self.header.as_ptr().cast::<Header>() }
    }

    /// The layout.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// Every sample below this is readable.
    pub fn head(&self) -> u64 {
        protocol_core::head(&self.header().head)
    }

    /// Whether the producer has ended the stream.
    pub fn ended(&self) -> bool {
        self.header().ended.load(Ordering::SeqCst) != 0
    }

    /// The lowest sequence whose copy, made before this call, is intact: the producer may
    /// have lent every slot of an older one for writing ([`protocol_core::intact_from`]).
    /// What a skimming consumer, which holds no cursor, checks after each copy.
    pub fn intact_from(&self) -> u64 {
        protocol_core::intact_from(&self.header().lent, self.layout.capacity)
    }

    /// Sleeps until the head reaches `target`, the stream ends, or `timeout` passes (or
    /// spuriously: callers re-check). The producer wakes this consumer through its cursor
    /// page only once the head reaches `target`.
    pub fn wait_for_head(&self, cursor: &CursorPage, target: u64, timeout: std::time::Duration) {
        let ready = || self.head() >= target || self.ended();
        wake_core::wait_for_head(cursor.wake_words(), &OsFutex, target, ready, timeout);
    }

    /// The start and length of field `k`'s mapping (both halves of the double mapping), for
    /// registering it with CUDA, say. Page-aligned, read-only.
    ///
    /// # Panics
    /// If `k` is not a field of the schema.
    pub fn field_mapping(&self, k: usize) -> (*const u8, usize) {
        let map = &self.regions.fields[k];
        (map.as_ptr(), map.copy_len() * 2)
    }
}

/// A one-page memfd holding one consumer's cursor, mapped by that consumer and the producer.
#[derive(Debug)]
pub struct CursorPage {
    fd: Option<OwnedFd>,
    map: Mapping,
}

impl CursorPage {
    /// Producer side: a fresh page with the cursor at `start`.
    pub fn create(start: u64) -> Result<Self, ShmError> {
        let fd = sys::memfd("ladle-cursor", PAGE as u64).map_err(ShmError::os("memfd_create"))?;
        // Sealed before the consumer ever sees it: a consumer that truncated its page would
        // otherwise kill the producer with SIGBUS at its next read of the cursor.
        sys::seal_size(fd.as_fd()).map_err(ShmError::os("sealing a cursor page"))?;
        let page = Self::map(fd.as_fd())?;
        page.reattach(start);
        Ok(Self {
            fd: Some(fd),
            map: page.map,
        })
    }

    /// Consumer side: maps the page received from the producer (after [`size_sealed`], as for
    /// [`ConsumerRing::map`]).
    pub fn map(fd: BorrowedFd<'_>) -> Result<Self, ShmError> {
        let actual = sys::file_len(fd).map_err(ShmError::os("fstat of the cursor page"))?;
        if actual != PAGE as u64 {
            return Err(ShmError::SizeMismatch {
                expected: PAGE as u64,
                actual,
            });
        }
        let map = Mapping::new(fd, 0, PAGE, true, false)
            .map_err(ShmError::os("mapping a cursor page"))?;
        Ok(Self { fd: None, map })
    }

    /// The page's file, to hand to its consumer (producer side only).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    fn words(&self) -> &CursorWords {
        // SAFETY: the page is mapped for the life of `self`, page-aligned, and holds only
        // atomics, valid at any bit pattern.
        unsafe { &*self.map.as_ptr().cast::<CursorWords>() }
    }

    fn wake_words(&self) -> WakeWords<'_> {
        let words = self.words();
        WakeWords {
            waiters: &words.waiters,
            wake_word: &words.wake_word,
        }
    }

    /// Everything below this is released.
    pub fn cursor(&self) -> u64 {
        protocol_core::cursor(&self.words().cursor)
    }

    /// Consumer: releases everything below `upto` and wakes a producer waiting for room.
    pub fn release(&self, upto: u64) {
        let words = self.words();
        protocol_core::release(&words.cursor, upto);
        words.cursor_word.store(upto as u32, Ordering::SeqCst);
        sys::futex_wake_all(&words.cursor_word);
    }

    /// Producer: whether this consumer sleeps on the head.
    pub fn is_waiting(&self) -> bool {
        wake_core::waiting(self.words().waiters.load(Ordering::SeqCst)) != 0
    }

    /// Consumer: records that everything below `position` is delivered, as one atomic step
    /// that fails once the producer has let this consumer go (then the batch must not be
    /// handed out). See [`protocol_core::deliver`].
    pub fn deliver(&self, position: u64) -> Result<(), LetGo> {
        protocol_core::deliver(&self.words().lease, position).map_err(|_| LetGo)
    }

    /// Whether the producer has let this consumer go (and not re-attached it since).
    pub fn is_let_go(&self) -> bool {
        protocol_core::lease(&self.words().lease) & protocol_core::LET_GO != 0
    }

    /// Producer: the lease word, to compare with a later one (a consumer that delivers a
    /// batch always changes it).
    pub fn lease(&self) -> u64 {
        protocol_core::lease(&self.words().lease)
    }

    /// Producer: lets this consumer go if its lease word is still `seen`; returns whether it
    /// did. From then on the producer may overwrite what it holds, and its next delivery
    /// fails instead of handing out a batch.
    pub fn let_go(&self, seen: u64) -> bool {
        protocol_core::let_go(&self.words().lease, seen)
    }

    /// Consumer: asks for everything below `end` (the end of a span it reserved or waits
    /// for); the demand only grows. Wakes a producer sleeping because it was far enough
    /// ahead of the old demand.
    pub fn raise_demand(&self, end: u64) {
        let words = self.words();
        if words.demand.fetch_max(end, Ordering::SeqCst) < end {
            words.demand_word.store(end as u32, Ordering::SeqCst);
            sys::futex_wake_all(&words.demand_word);
        }
    }

    /// Producer: asks this consumer to skim (it holds the others back).
    pub fn ask_to_skim(&self) {
        self.words().skim.store(1, Ordering::SeqCst);
    }

    /// Whether the producer asks this consumer to skim.
    pub fn asked_to_skim(&self) -> bool {
        self.words().skim.load(Ordering::SeqCst) != 0
    }

    /// Consumer: counts `samples` more delivered.
    pub fn add_delivered(&self, samples: u64) {
        self.words().delivered.fetch_add(samples, Ordering::Relaxed);
    }

    /// Samples delivered in all, as the consumer counts them (a figure for reports).
    pub fn delivered(&self) -> u64 {
        self.words().delivered.load(Ordering::Relaxed)
    }

    /// Consumer: counts `waited` more time spent waiting for data.
    pub fn add_waited(&self, waited: std::time::Duration) {
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.words().waited_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// How long this consumer has waited for data in all, as it says (a consumer's own
    /// count: a figure for reports, never for a decision that must hold against it).
    pub fn waited(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.words().waited_ns.load(Ordering::Relaxed))
    }

    /// What this consumer has asked for ([`CursorPage::raise_demand`]).
    pub fn demand(&self) -> u64 {
        self.words().demand.load(Ordering::SeqCst)
    }

    /// Producer: the demand's futex word; read it before [`CursorPage::demand`] and sleep
    /// with it ([`CursorPage::wait_for_demand`]).
    pub fn demand_word(&self) -> u32 {
        self.words().demand_word.load(Ordering::SeqCst)
    }

    /// Producer: sleeps until this consumer's demand word moves from `seen` or `timeout`
    /// passes (a word already moved returns at once).
    pub fn wait_for_demand(&self, seen: u32, timeout: std::time::Duration) {
        sys::futex_wait(&self.words().demand_word, seen, timeout);
    }

    /// Producer: puts the cursor and the demand at `at` and clears the lease, for a consumer
    /// (re)attached at `at`. Only while the consumer does not use the page (before
    /// `Welcome`, or while it waits for `Rejoined`).
    pub(crate) fn reattach(&self, at: u64) {
        let words = self.words();
        words.cursor.store(at, Ordering::SeqCst);
        words.cursor_word.store(at as u32, Ordering::SeqCst);
        words.demand.store(at, Ordering::SeqCst);
        words.demand_word.store(at as u32, Ordering::SeqCst);
        words
            .lease
            .store(protocol_core::lease_word(at, 0), Ordering::SeqCst);
        words.skim.store(0, Ordering::SeqCst);
    }

    /// Producer, after publishing up to `head`: wakes this consumer if one of its threads
    /// sleeps waiting for a head at or below `head` (or several sleep). Returns whether it did.
    pub fn wake_if_due(&self, head: u64) -> bool {
        wake_core::wake_if_due(self.wake_words(), &OsFutex, head)
    }

    /// Producer: wakes this consumer whatever it waits for (the stream ended, say).
    pub fn wake(&self) {
        wake_core::wake(self.wake_words(), &OsFutex);
    }

    /// Producer: sleeps until this consumer's cursor moves past `seen` or `timeout` passes.
    /// The futex word is the consumer's to write: one that disagrees with the cursor ends
    /// the sleep at once, so a caller that loops must bound its own rate (the producer's
    /// feeder does).
    pub fn wait_for_release(&self, seen: u64, timeout: std::time::Duration) {
        if self.cursor() == seen {
            sys::futex_wait(&self.words().cursor_word, seen as u32, timeout);
        }
    }
}

/// The real futex, shared between processes, for [`wake_core`]'s handshake.
struct OsFutex;

impl Futex for OsFutex {
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
        sys::futex_wait(word, expected, timeout);
    }

    fn wake_all(&self, word: &AtomicU32) {
        sys::futex_wake_all(word);
    }
}

pub use ladle_os::shm::size_sealed;

/// The producer let this consumer go: it took no batch for the stall timeout while holding
/// the feed back. What it held may have been overwritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LetGo;

mod read_loan;
pub use read_loan::ReadLoan;

#[cfg(test)]
mod tests;
