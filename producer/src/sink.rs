//! Where decoded samples go: published in order into the ring ([`RingSink`]), with each
//! decode thread's CPU time counted.

use std::sync::atomic::Ordering;

use crate::members::Shared;
use ladle_datasets::SampleError;
use ladle_datasets::pipeline::{SampleSink, WorkItem};
use ladle_ring::WriteLoan;

/// Publishes completed samples in order (the ring's loans) and wakes consumers whose next
/// batch is complete.
pub(crate) struct RingSink<'a> {
    pub(crate) shared: &'a Shared,
}

impl<'a> SampleSink for RingSink<'a> {
    type Ticket = WriteLoan<'a>;

    fn write<R>(
        &self,
        loan: &mut WriteLoan<'a>,
        _: &WorkItem,
        fill: impl FnOnce(&mut [&mut [u8]]) -> R,
    ) -> R {
        fill(loan.slot().fields())
    }

    fn complete(&self, loan: WriteLoan<'a>, item: WorkItem, outcome: Result<(), &SampleError>) {
        self.count_cpu();
        let head = match outcome {
            Ok(()) => loan.commit(item.index),
            Err(_) => {
                self.shared.bad.fetch_add(1, Ordering::Relaxed);
                loan.commit_bad(item.index)
            }
        };
        if let Some(head) = head {
            // The feeder publishes holes too: the head only moves forward.
            self.shared.published.fetch_max(head, Ordering::Relaxed);
            // Wake only consumers whose next batch is now complete: one wake-up per batch.
            for m in &self.shared.lock().members {
                m.page.wake_if_due(head);
            }
        }
    }
}

thread_local! {
    /// This decode thread's CPU time when it last counted it, nanoseconds.
    static COUNTED_CPU_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl RingSink<'_> {
    /// Adds the CPU time this decode thread used since it last counted to the feed's decode
    /// CPU (a `clock_gettime` per sample: well under a microsecond beside a decode).
    pub(crate) fn count_cpu(&self) {
        let now = u64::try_from(ladle_os::clock::thread_cpu().as_nanos()).unwrap_or(u64::MAX);
        let last = COUNTED_CPU_NS.with(|c| c.replace(now));
        // A thread's clock starts at its creation: its first count holds its start-up too.
        (self.shared.decode_cpu_ns).fetch_add(now.saturating_sub(last), Ordering::Relaxed);
    }
}
