//! The ring's shared memory: the producer's read-write view and a consumer's read-only view,
//! and the per-consumer cursor page.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::ShmError;
use crate::layout::RingLayout;
use crate::protocol_core;
use crate::sys::{self, Mapping, PAGE};
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
    /// How many of the consumer's threads sleep on the head (so the producer knows to wake
    /// them). With more than one, the producer wakes them on every publish (each re-checks
    /// its own target), so that no thread's wake-up is lost to another's `wake_at`.
    waiting: AtomicU32,
    /// While one thread waits: the head it waits for (the end of its next batch).
    wake_at: AtomicU64,
    /// The futex word the consumer sleeps on; the producer bumps it to wake the consumer once
    /// the head reaches `wake_at`, so a batch of B samples costs one wake-up, not B.
    wake_word: AtomicU32,
    /// The lease word ([`protocol_core::deliver`]): what the consumer has delivered, a count
    /// that changes on every delivery, and the let-go bit the producer sets on a consumer
    /// that held the feed back for the stall timeout without taking a batch.
    lease: AtomicU64,
}

/// The three double-mapped sample regions.
#[derive(Debug)]
struct Regions {
    images: Mapping,
    labels: Mapping,
    indices: Mapping,
}

impl Regions {
    fn map(fd: BorrowedFd<'_>, layout: &RingLayout, writable: bool) -> Result<Self, ShmError> {
        let map = |(off, len): (u64, usize)| {
            Mapping::new(fd, off, len, writable, true)
                .map_err(ShmError::os("mapping a ring region"))
        };
        Ok(Self {
            images: map(layout.images())?,
            labels: map(layout.labels())?,
            indices: map(layout.indices())?,
        })
    }
}

/// The producer's view: creates the ring file, writes samples, publishes the head.
#[derive(Debug)]
pub struct ProducerRing {
    layout: RingLayout,
    fd: OwnedFd,
    header: Mapping,
    regions: Regions,
    id: u64,
    publisher: PublisherLock,
    readers_taken: TakenFlag,
}

impl ProducerRing {
    /// Creates, maps (read-write), pre-faults and seals a ring of `layout`.
    pub fn create(layout: RingLayout) -> Result<Self, ShmError> {
        let fd =
            sys::memfd("ladle-ring", layout.file_len()).map_err(ShmError::os("memfd_create"))?;
        let header = Mapping::new(fd.as_fd(), 0, PAGE, true, false)
            .map_err(ShmError::os("mapping the ring header"))?;
        let regions = Regions::map(fd.as_fd(), &layout, true)?;
        for m in [&regions.images, &regions.labels, &regions.indices] {
            m.prefault(true)
                .map_err(ShmError::os("pre-faulting the ring"))?;
        }
        // From here on nobody can map the file writable or resize it: consumers get it
        // read-only whatever they try.
        sys::seal_against_writers(fd.as_fd()).map_err(ShmError::os("sealing the ring"))?;
        let ring = Self {
            layout,
            fd,
            header,
            regions,
            id: writer::new_ring_id(),
            publisher: PublisherLock::new(Publisher::new(layout.capacity)),
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

    pub(crate) fn publisher_lock(&self) -> &PublisherLock {
        &self.publisher
    }

    pub(crate) fn readers_taken(&self) -> &TakenFlag {
        &self.readers_taken
    }

    /// The writable buffers of sequence `seq`: its image, label and dataset index. Reached
    /// only through a [`WriteLoan`](crate::writer::WriteLoan) outside tests.
    ///
    /// # Safety
    /// The caller must be the only one touching `seq`'s slot until it is published, and
    /// the slot must be free: `protocol_core::may_write(seq, min_cursor, capacity)` held for
    /// the cursors of all live consumers, and `seq` is at or above the head.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slot_mut(&self, seq: u64) -> (&mut [u8], &mut i64, &mut u64) {
        let slot = (seq % self.layout.capacity) as usize;
        let bytes = self.layout.sample_bytes();
        // SAFETY: `slot < capacity`, so each pointer stays inside its region's first copy;
        // exclusivity is the caller's contract above.
        unsafe {
            (
                std::slice::from_raw_parts_mut(
                    self.regions.images.as_ptr().add(slot * bytes),
                    bytes,
                ),
                &mut *self.regions.labels.as_ptr().cast::<i64>().add(slot),
                &mut *self.regions.indices.as_ptr().cast::<u64>().add(slot),
            )
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
    /// Maps the ring file received from the producer, read-only.
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
        for m in [&regions.images, &regions.labels, &regions.indices] {
            m.prefault(false)
                .map_err(ShmError::os("pre-faulting the ring"))?;
        }
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

    /// Sleeps until the head reaches `target`, the stream ends, or `timeout` passes (or
    /// spuriously: callers re-check). The producer wakes this consumer through its cursor
    /// page only once the head reaches `target`.
    pub fn wait_for_head(&self, cursor: &CursorPage, target: u64, timeout: std::time::Duration) {
        let words = cursor.words();
        words.wake_at.store(target, Ordering::SeqCst);
        words.waiting.fetch_add(1, Ordering::SeqCst);
        // Read the wake word before the head: a producer that publishes after this read
        // either sees `waiting` and bumps the word (so the futex wait returns at once), or
        // published before it, and then the head read below sees it. All SeqCst.
        let word = words.wake_word.load(Ordering::SeqCst);
        if self.head() < target && !self.ended() {
            sys::futex_wait(&words.wake_word, word, timeout);
        }
        if words.waiting.fetch_sub(1, Ordering::SeqCst) > 1 {
            // Others still wait, and `wake_at` may be this thread's target: ask for a wake-up
            // at the next publish, when each of them re-registers its own.
            words.wake_at.store(0, Ordering::SeqCst);
        }
    }

    /// `count` images from sequence `start`, as one contiguous `[count, H, W, 3]` slice.
    ///
    /// # Safety
    /// `start..start + count` must be published (below the head) and not released by this
    /// consumer (at or above its cursor), so the producer cannot be writing them; and
    /// `count <= capacity`.
    pub unsafe fn images(&self, start: u64, count: usize) -> &[u8] {
        let bytes = self.layout.sample_bytes();
        let slot = (start % self.layout.capacity) as usize;
        // SAFETY: slot + count <= 2 × capacity, inside the double mapping; no concurrent
        // writer by the caller's contract.
        unsafe {
            std::slice::from_raw_parts(
                self.regions.images.as_ptr().add(slot * bytes),
                count * bytes,
            )
        }
    }

    /// `count` labels from sequence `start`.
    ///
    /// # Safety
    /// As for [`ConsumerRing::images`].
    pub unsafe fn labels(&self, start: u64, count: usize) -> &[i64] {
        let slot = (start % self.layout.capacity) as usize;
        // SAFETY: as in `images`; the region is 8-byte aligned (page-aligned).
        unsafe {
            std::slice::from_raw_parts(self.regions.labels.as_ptr().cast::<i64>().add(slot), count)
        }
    }

    /// `count` dataset indices from sequence `start`.
    ///
    /// # Safety
    /// As for [`ConsumerRing::images`].
    pub unsafe fn indices(&self, start: u64, count: usize) -> &[u64] {
        let slot = (start % self.layout.capacity) as usize;
        // SAFETY: as in `labels`.
        unsafe {
            std::slice::from_raw_parts(self.regions.indices.as_ptr().cast::<u64>().add(slot), count)
        }
    }

    /// The start of the images mapping (for registering it with CUDA, say).
    pub fn images_mapping(&self) -> (*const u8, usize) {
        (
            self.regions.images.as_ptr(),
            self.regions.images.copy_len() * 2,
        )
    }

    /// The start and length of the labels mapping (both halves of the double mapping), for
    /// registering it with CUDA as [`ConsumerRing::images_mapping`]. Page-aligned, read-only.
    pub fn labels_mapping(&self) -> (*const u8, usize) {
        (
            self.regions.labels.as_ptr(),
            self.regions.labels.copy_len() * 2,
        )
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

    /// Consumer side: maps the page received from the producer.
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
        self.words().waiting.load(Ordering::SeqCst) != 0
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

    /// Producer: puts the cursor at `at` and clears the lease, for a consumer (re)attached
    /// at `at`. Only while the consumer does not use the page (before `Welcome`, or while it
    /// waits for `Rejoined`).
    pub(crate) fn reattach(&self, at: u64) {
        let words = self.words();
        words.cursor.store(at, Ordering::SeqCst);
        words.cursor_word.store(at as u32, Ordering::SeqCst);
        words
            .lease
            .store(protocol_core::lease_word(at, 0), Ordering::SeqCst);
    }

    /// Producer, after publishing up to `head`: wakes this consumer if one of its threads
    /// sleeps waiting for a head at or below `head` (or several sleep). Returns whether it did.
    pub fn wake_if_due(&self, head: u64) -> bool {
        let words = self.words();
        let waiting = words.waiting.load(Ordering::SeqCst);
        if waiting > 1 || (waiting == 1 && head >= words.wake_at.load(Ordering::SeqCst)) {
            self.wake();
            true
        } else {
            false
        }
    }

    /// Producer: wakes this consumer whatever it waits for (the stream ended, say).
    pub fn wake(&self) {
        let words = self.words();
        words.wake_word.fetch_add(1, Ordering::SeqCst);
        sys::futex_wake_all(&words.wake_word);
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

/// The producer let this consumer go: it took no batch for the stall timeout while holding
/// the feed back. What it held may have been overwritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LetGo;

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> ProducerRing {
        ProducerRing::create(RingLayout::new(512, 8, 8).unwrap()).unwrap()
    }

    /// A ring with samples `cap − 2 .. cap + 3` written and published (they straddle the
    /// wrap), and a consumer's view of it.
    fn published_across_the_wrap() -> (ProducerRing, ConsumerRing, u64) {
        let producer = ring();
        let cap = producer.layout().capacity;
        for seq in cap - 2..cap + 3 {
            write(&producer, seq);
        }
        producer.publish(cap + 3);
        let consumer = ConsumerRing::map(producer.fd(), *producer.layout()).unwrap();
        (producer, consumer, cap)
    }

    fn write(ring: &ProducerRing, seq: u64) {
        // SAFETY: single-threaded test, no consumer has released anything yet.
        let (img, label, index) = unsafe { ring.slot_mut(seq) };
        img.fill(seq as u8);
        *label = seq as i64 * 10;
        *index = seq + 1000;
    }

    #[test]
    fn a_consumer_sees_published_samples_contiguously_across_the_wrap() {
        let (producer, consumer, cap) = published_across_the_wrap();
        assert_eq!(consumer.head(), cap + 3);
        // SAFETY: published, and nothing else writes in this test.
        let (images, labels, indices) = unsafe {
            (
                consumer.images(cap - 2, 5),
                consumer.labels(cap - 2, 5),
                consumer.indices(cap - 2, 5),
            )
        };
        let bytes = producer.layout().sample_bytes();
        for (k, seq) in (cap - 2..cap + 3).enumerate() {
            assert!(
                images[k * bytes..(k + 1) * bytes]
                    .iter()
                    .all(|&b| b == seq as u8)
            );
            assert_eq!(labels[k], seq as i64 * 10);
            assert_eq!(indices[k], seq + 1000);
        }
    }

    #[test]
    fn the_image_and_label_mappings_are_page_aligned_and_hold_every_batch_across_the_wrap() {
        let (producer, consumer, cap) = published_across_the_wrap();
        let (images_at, images_len) = consumer.images_mapping();
        let (labels_at, labels_len) = consumer.labels_mapping();
        assert_eq!(images_len, 2 * producer.layout().images().1);
        assert_eq!(labels_len, 2 * producer.layout().labels().1);
        for (at, len) in [(images_at, images_len), (labels_at, labels_len)] {
            assert_eq!(at as usize % PAGE, 0);
            assert_eq!(len % PAGE, 0);
        }
        // SAFETY: published, and nothing else writes in this test.
        let (images, labels) =
            unsafe { (consumer.images(cap - 2, 5), consumer.labels(cap - 2, 5)) };
        let inside = |slice_at: usize, slice_len: usize, at: *const u8, len: usize| {
            slice_at >= at as usize && slice_at + slice_len <= at as usize + len
        };
        assert!(inside(
            images.as_ptr() as usize,
            images.len(),
            images_at,
            images_len
        ));
        let label_bytes = std::mem::size_of_val(labels);
        assert!(inside(
            labels.as_ptr() as usize,
            label_bytes,
            labels_at,
            labels_len
        ));
        // The window crosses the wrap: it starts in the first copy and ends in the second.
        assert!((labels.as_ptr() as usize) < labels_at as usize + labels_len / 2);
        assert!(labels.as_ptr() as usize + label_bytes > labels_at as usize + labels_len / 2);
    }

    #[test]
    fn the_sealed_ring_cannot_be_mapped_or_made_writable_by_a_consumer() {
        let producer = ring();
        let (off, len) = producer.layout().images();
        let err = Mapping::new(producer.fd(), off, len, true, false).unwrap_err();
        assert_eq!(err, rustix::io::Errno::PERM);
        let consumer = ConsumerRing::map(producer.fd(), *producer.layout()).unwrap();
        let (ptr, len) = consumer.images_mapping();
        // SAFETY: asking for write access on our own read-only mapping; the call must fail.
        let made_writable = unsafe {
            rustix::mm::mprotect(
                ptr as *mut _,
                len,
                rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE,
            )
        };
        assert!(made_writable.is_err());
        assert!(
            rustix::fs::ftruncate(producer.fd(), 0).is_err(),
            "the ring can be shrunk"
        );
    }

    #[test]
    fn cursor_pages_carry_releases_between_mappings() {
        let page = CursorPage::create(7).unwrap();
        let other = CursorPage::map(page.fd().unwrap()).unwrap();
        assert_eq!(other.cursor(), 7);
        other.release(42);
        assert_eq!(page.cursor(), 42);
        page.wait_for_release(41, std::time::Duration::from_millis(1));
    }

    #[test]
    fn a_consumer_cannot_resize_its_cursor_page_under_the_producer() {
        let page = CursorPage::create(7).unwrap();
        let fd = page.fd().unwrap();
        // What a hostile consumer holding the fd would try: shrink (SIGBUS for the producer at
        // its next read), grow, or lift the seals.
        assert!(
            rustix::fs::ftruncate(fd, 0).is_err(),
            "the page can be shrunk"
        );
        assert!(
            rustix::fs::ftruncate(fd, 2 * PAGE as u64).is_err(),
            "the page can be grown"
        );
        assert!(
            rustix::fs::fcntl_add_seals(fd, rustix::fs::SealFlags::WRITE).is_err(),
            "seals can still be changed"
        );
        // Still usable by both sides.
        let consumer = CursorPage::map(fd).unwrap();
        consumer.release(9);
        assert_eq!(page.cursor(), 9);
    }

    #[test]
    fn two_threads_waiting_on_one_consumer_are_both_woken_at_their_own_heads() {
        use std::time::{Duration, Instant};
        let producer = ring();
        let page = CursorPage::create(0).unwrap();
        let consumer =
            std::sync::Arc::new(ConsumerRing::map(producer.fd(), *producer.layout()).unwrap());
        let mine = std::sync::Arc::new(CursorPage::map(page.fd().unwrap()).unwrap());
        let waiter = |target: u64| {
            let (consumer, mine) = (consumer.clone(), mine.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                while consumer.head() < target {
                    consumer.wait_for_head(&mine, target, Duration::from_secs(5));
                }
                started.elapsed()
            })
        };
        let near = waiter(10);
        std::thread::sleep(Duration::from_millis(100));
        // The second thread's target replaces the first's in `wake_at`.
        let far = waiter(20);
        std::thread::sleep(Duration::from_millis(100));
        producer.publish(10);
        page.wake_if_due(10);
        let took = near.join().unwrap();
        assert!(
            took < Duration::from_secs(3),
            "the first waiter's wake-up was lost ({took:?})"
        );
        producer.publish(20);
        page.wake_if_due(20);
        assert!(far.join().unwrap() < Duration::from_secs(3));
    }

    #[test]
    fn a_waiter_that_gives_up_does_not_take_the_other_waiters_wake_up_with_it() {
        use std::time::{Duration, Instant};
        let producer = ring();
        let page = CursorPage::create(0).unwrap();
        let consumer = ConsumerRing::map(producer.fd(), *producer.layout()).unwrap();
        let mine = CursorPage::map(page.fd().unwrap()).unwrap();
        std::thread::scope(|scope| {
            let near = scope.spawn(|| {
                let started = Instant::now();
                while consumer.head() < 10 {
                    consumer.wait_for_head(&mine, 10, Duration::from_secs(5));
                }
                started.elapsed()
            });
            std::thread::sleep(Duration::from_millis(100));
            // A second thread waits for 20 (its target replaces 10), then gives up.
            consumer.wait_for_head(&mine, 20, Duration::from_millis(100));
            producer.publish(10);
            page.wake_if_due(10);
            let took = near.join().unwrap();
            assert!(
                took < Duration::from_secs(3),
                "the near waiter slept on ({took:?})"
            );
        });
    }

    #[test]
    fn a_wrong_sized_file_is_refused() {
        let producer = ring();
        let bigger = RingLayout::new(1024, 8, 8).unwrap();
        assert!(matches!(
            ConsumerRing::map(producer.fd(), bigger),
            Err(ShmError::SizeMismatch { .. })
        ));
    }
}
