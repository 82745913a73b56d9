use super::*;

fn ring() -> ProducerRing {
    ProducerRing::create(RingLayout::image(512, 8, 8).unwrap()).unwrap()
}

/// A ring of `schema` with samples `cap − 2 .. cap + 3` written and published (they
/// straddle the wrap): every byte of field `k` of sample `seq` is `seq + k`.
fn published_across_the_wrap(schema: &str) -> (ProducerRing, ConsumerRing, u64) {
    let layout = RingLayout::for_budget(1 << 20, schema.parse().unwrap()).unwrap();
    let producer = ProducerRing::create(layout).unwrap();
    let cap = producer.layout().capacity;
    for seq in cap - 2..cap + 3 {
        // SAFETY: single-threaded test, no consumer has released anything yet.
        let mut slot = unsafe { producer.slot_mut(seq) };
        for (k, field) in slot.fields().iter_mut().enumerate() {
            field.fill((seq as usize + k) as u8);
        }
        *slot.index = seq + 1000;
        *slot.flags = seq % 2;
    }
    producer.publish(cap + 3);
    let consumer = ConsumerRing::map(producer.fd(), producer.layout().clone()).unwrap();
    (producer, consumer, cap)
}

#[test]
fn a_consumer_sees_every_field_contiguously_across_the_wrap() {
    for schema in [
        "image: u8[8, 8, 3], label: i64",
        "wave: f32[1001], length: i32, label: i64, mask: bool[3], h: bf16[2, 3]",
    ] {
        let (producer, consumer, cap) = published_across_the_wrap(schema);
        assert_eq!(consumer.head(), cap + 3);
        let fields = producer.layout().schema.fields();
        let loan = consumer.read_loan(cap - 2, 5).unwrap();
        for (k, field) in fields.iter().enumerate() {
            let bytes = consumer.field(&loan, k);
            assert_eq!(bytes.len(), 5 * field.bytes(), "{schema}");
            for (n, seq) in (cap - 2..cap + 3).enumerate() {
                let sample = &bytes[n * field.bytes()..(n + 1) * field.bytes()];
                assert!(sample.iter().all(|&b| b == (seq as usize + k) as u8));
            }
            // The window crosses the wrap: it starts in the first copy and ends in the
            // second, inside the one mapping.
            let (at, len) = consumer.field_mapping(k);
            assert_eq!((at as usize % PAGE, len % PAGE), (0, 0));
            let (begin, end) = (
                bytes.as_ptr() as usize,
                bytes.as_ptr() as usize + bytes.len(),
            );
            assert!(begin >= at as usize && end <= at as usize + len);
            assert!(begin < at as usize + len / 2 && end > at as usize + len / 2);
        }
        let (indices, flags) = (consumer.indices(&loan), consumer.flags(&loan));
        for (n, seq) in (cap - 2..cap + 3).enumerate() {
            assert_eq!((indices[n], flags[n]), (seq + 1000, seq % 2));
        }
    }
}

#[test]
fn a_read_loan_is_granted_only_for_published_samples_that_fit_the_ring_and_says_when_it_was_lent_again()
 {
    let (producer, consumer, cap) = published_across_the_wrap("image: u8[8, 8, 3], label: i64");
    assert!(consumer.read_loan(cap, 4).is_none(), "past the head");
    assert!(consumer.read_loan(u64::MAX - 1, 4).is_none(), "past 2^64");
    assert!(
        consumer.read_loan(0, cap as usize + 1).is_none(),
        "more than the ring"
    );
    assert!(
        consumer.read_loan(3, cap as usize).is_some(),
        "the whole ring, below the head"
    );
    let loan = consumer.read_loan(cap - 2, 5).unwrap();
    assert_eq!((loan.start(), loan.len()), (cap - 2, 5));
    assert_eq!(consumer.index_once(&loan, 4), Some(cap + 2 + 1000));
    assert_eq!(consumer.index_once(&loan, 5), None);
    assert!(consumer.is_intact(&loan));
    // Lending the slot of `cap − 2` again (sequence `2·cap − 2`) may rewrite the loan's first
    // sample: it is no longer intact, and a loan that starts after it still is.
    producer.lend(2 * cap - 2);
    assert!(
        consumer.is_intact(&loan),
        "the slot of cap − 2 is not lent yet"
    );
    producer.lend(2 * cap - 1);
    assert!(!consumer.is_intact(&loan));
    assert!(consumer.is_intact(&consumer.read_loan(cap - 1, 4).unwrap()));
}

/// A consumer's mapping of field 0 cannot be made writable.
fn assert_cannot_make_writable(consumer: &ConsumerRing) {
    let (ptr, len) = consumer.field_mapping(0);
    // SAFETY: asking for write access on our own read-only mapping; the call must fail.
    let made_writable = unsafe {
        rustix::mm::mprotect(
            ptr as *mut _,
            len,
            rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE,
        )
    };
    assert!(made_writable.is_err());
}

#[test]
fn the_sealed_ring_cannot_be_mapped_or_made_writable_by_a_consumer() {
    let producer = ring();
    let (off, len) = producer.layout().field(0);
    let err = Mapping::new(producer.fd(), off, len, true, false).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(rustix::io::Errno::PERM.raw_os_error())
    );
    let consumer = ConsumerRing::map(producer.fd(), producer.layout().clone()).unwrap();
    assert_cannot_make_writable(&consumer);
    assert!(
        rustix::fs::ftruncate(producer.fd(), 0).is_err(),
        "the ring can be shrunk"
    );
}

#[test]
fn a_consumer_that_reopens_the_sealed_ring_for_writing_can_neither_write_nor_map_it() {
    use std::os::fd::AsRawFd;
    let producer = ring();
    // What a consumer holding the fd can do: open the file again through /proc, read-write.
    let path = format!("/proc/self/fd/{}", producer.fd().as_raw_fd());
    let reopened = rustix::fs::open(
        path.as_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .expect("the file itself may be opened read-write; the seal is what refuses writes");
    let (off, len) = producer.layout().field(0);
    let err = Mapping::new(reopened.as_fd(), off, len, true, false).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(rustix::io::Errno::PERM.raw_os_error()),
        "mapped writable"
    );
    let err = rustix::io::pwrite(&reopened, &[1u8; 8], off).unwrap_err();
    assert_eq!(err, rustix::io::Errno::PERM, "written with pwrite(2)");
    assert!(rustix::fs::ftruncate(&reopened, 0).is_err(), "shrunk");
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

/// How many of a consumer's threads its page says are asleep on the head.
fn sleepers(page: &CursorPage) -> u64 {
    wake_core::waiting(page.words().waiters.load(Ordering::SeqCst))
}

/// Polls (inside a generous deadline that only catches a hang) until `page` counts `n`
/// sleepers: a test waits for what the page reports, not for a fixed time.
fn until_sleepers(page: &CursorPage, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while sleepers(page) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} sleepers never showed"
        );
        std::thread::yield_now();
    }
}

/// Waits for the head to reach `target` in one sleep of `WAKE_GUARD`, and says whether it
/// was woken (a lost wake-up sleeps the whole guard, which only a hang could take).
fn woken_at(consumer: &ConsumerRing, mine: &CursorPage, target: u64) -> bool {
    use std::time::Instant;
    let started = Instant::now();
    while consumer.head() < target {
        if started.elapsed() >= WAKE_GUARD {
            return false;
        }
        consumer.wait_for_head(mine, target, WAKE_GUARD);
    }
    true
}

const WAKE_GUARD: std::time::Duration = std::time::Duration::from_secs(120);

#[test]
fn two_threads_waiting_on_one_consumer_are_both_woken_at_their_own_heads() {
    let producer = ring();
    let page = CursorPage::create(0).unwrap();
    let consumer =
        std::sync::Arc::new(ConsumerRing::map(producer.fd(), producer.layout().clone()).unwrap());
    let mine = std::sync::Arc::new(CursorPage::map(page.fd().unwrap()).unwrap());
    let waiter = |target: u64| {
        let (consumer, mine) = (consumer.clone(), mine.clone());
        std::thread::spawn(move || woken_at(&consumer, &mine, target))
    };
    let near = waiter(10);
    until_sleepers(&page, 1);
    // The second thread's target replaces the first's in the wake word.
    let far = waiter(20);
    until_sleepers(&page, 2);
    producer.publish(10);
    page.wake_if_due(10);
    assert!(near.join().unwrap(), "the first waiter's wake-up was lost");
    producer.publish(20);
    page.wake_if_due(20);
    assert!(far.join().unwrap(), "the second waiter's wake-up was lost");
}

#[test]
fn a_waiter_that_gives_up_does_not_take_the_other_waiters_wake_up_with_it() {
    use std::time::Duration;
    let producer = ring();
    let page = CursorPage::create(0).unwrap();
    let consumer = ConsumerRing::map(producer.fd(), producer.layout().clone()).unwrap();
    let mine = CursorPage::map(page.fd().unwrap()).unwrap();
    std::thread::scope(|scope| {
        let near = scope.spawn(|| woken_at(&consumer, &mine, 10));
        until_sleepers(&page, 1);
        // A second thread waits for 20 (its target replaces 10), then gives up: its short
        // timeout is the behaviour under test, not a wait for another thread.
        consumer.wait_for_head(&mine, 20, Duration::from_millis(100));
        producer.publish(10);
        page.wake_if_due(10);
        assert!(near.join().unwrap(), "the near waiter slept on");
    });
}

#[test]
fn rings_and_cursor_pages_have_their_size_sealed_and_other_files_do_not() {
    let sealed = ring();
    assert!(size_sealed(sealed.fd()));
    let page = CursorPage::create(0).unwrap();
    assert!(size_sealed(page.fd().unwrap()));
    let unsealed = sys::memfd("t", PAGE as u64).unwrap();
    assert!(!size_sealed(unsealed.as_fd()));
    rustix::fs::fcntl_add_seals(&unsealed, rustix::fs::SealFlags::SHRINK).unwrap();
    assert!(!size_sealed(unsealed.as_fd()), "only half sealed");
    let file = tempfile::tempfile().unwrap();
    assert!(!size_sealed(file.as_fd()), "not a memfd");
}

#[test]
fn a_wrong_sized_file_is_refused() {
    let producer = ring();
    let bigger = RingLayout::image(1024, 8, 8).unwrap();
    assert!(matches!(
        ConsumerRing::map(producer.fd(), bigger),
        Err(ShmError::SizeMismatch { .. })
    ));
}
