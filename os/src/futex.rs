//! Futexes on words in shared memory: a wait with a timeout and a wake of every waiter, in
//! every process that maps the word (not `FUTEX_PRIVATE`).

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Waits until `word` is woken or no longer holds `expected`, at most `timeout`.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // Shared (not PRIVATE): the word lives in memory mapped by several processes. Errors are
    // EAGAIN (value already changed), ETIMEDOUT and EINTR: all mean "look again".
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::empty(),
        expected,
        Some(&ts),
    );
}

/// Wakes every waiter on `word` in every process.
pub fn futex_wake_all(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}
