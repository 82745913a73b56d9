//! The feeder: the pipeline's work source ([`FeedSource`]: a write loan per next sequence,
//! paced by the consumers, with the feed's lifetime) and the thread that runs the pipeline.

use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};

use ladle_datasets::pipeline::{WorkItem, WorkSource};
use ladle_ring::{Gate, WriteLoan};

use crate::ProducerError;
use crate::feed::Feed;
use crate::members::Shared;
pub(crate) use crate::pacing::Pacing;
use crate::pacing::{Pacer, PacingRule};
use crate::sink::RingSink;
use crate::source::Source;

/// How long the feeder sleeps before re-checking stop flags, joins, leaves and stalls.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// The longest the feeder sleeps on one consumer's demand while it is far enough ahead: the
/// consumer that asked for the most wakes it sooner, another that overtakes it within this.
pub(crate) const AHEAD_POLL: Duration = Duration::from_millis(10);

/// The pipeline's work: a write loan for each next sequence, with its dataset index.
pub(crate) struct FeedSource<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) feed: Feed,
    /// Since when no consumer, handshake or holder has been there, for the feed's lifetime.
    pub(crate) alone_since: Option<Instant>,
    /// Whether a consumer or a holder ever came.
    pub(crate) came: bool,
    /// Who holds the others back (`None` under [`Pacing::Lockstep`]).
    pub(crate) pacer: Option<Pacer>,
    /// Positions let pass as holes at or beyond the furthest demand, in order: they do not
    /// count against the read-ahead.
    pub(crate) holes: std::collections::VecDeque<u64>,
}

/// Holes committed in a row before the feeder lets go of the members' lock for a moment.
const HOLES_PER_LOCK: u32 = 256;

impl<'a> WorkSource for FeedSource<'a> {
    type Item = (WorkItem, WriteLoan<'a>);

    fn next(&mut self, wait: bool) -> Poll<Option<Self::Item>> {
        let shared = self.shared;
        let mut state = shared.lock();
        let mut holes_in_a_row = 0u32;
        loop {
            if shared.stop.load(Ordering::SeqCst) {
                return Poll::Ready(None);
            }
            let largest_batch = state
                .members
                .iter()
                .filter(|m| m.attached)
                .map(|m| u64::from(m.batch_size))
                .max()
                .unwrap_or(1);
            let read_ahead = shared
                .read_ahead
                .samples(largest_batch, u64::from(shared.threads));
            // Holes below the furthest demand no longer count against the read-ahead.
            let furthest = (state.members.iter())
                .filter(|m| m.attached)
                .map(|m| m.page.demand())
                .max()
                .unwrap_or(0);
            while self.holes.front().is_some_and(|&s| s < furthest) {
                self.holes.pop_front();
            }
            let holes = &self.holes;
            let gate = shared
                .ring
                .try_loan_counted(&state.readers, read_ahead, |demand| {
                    (holes.len() - holes.partition_point(|&s| s < demand)) as u64
                });
            match gate {
                Gate::Loan(loan) => {
                    let seq = loan.seq();
                    let (index, epoch) = self.feed.index_of(seq, &state.cuts);
                    self.feed.reached(shared.ring.head());
                    let wanted = crate::needs::needed(
                        (state.members.iter()).map(|m| (m.attached, m.skimming, &m.needs)),
                        seq,
                        index,
                    );
                    if !wanted {
                        // Nobody needs it: a hole, published here, never decoded.
                        if let Some(head) = loan.commit_hole(index) {
                            shared.published.fetch_max(head, Ordering::Relaxed);
                            for m in &state.members {
                                m.page.wake_if_due(head);
                            }
                        }
                        shared.holes.fetch_add(1, Ordering::Relaxed);
                        self.holes.push_back(seq);
                        holes_in_a_row += 1;
                        if holes_in_a_row >= HOLES_PER_LOCK {
                            holes_in_a_row = 0;
                            drop(state);
                            state = shared.lock();
                        }
                        continue;
                    }
                    Shared::clear_watches(&mut state);
                    return Poll::Ready(Some((WorkItem { seq, index, epoch }, loan)));
                }
                Gate::Violations(violations) => {
                    for v in violations {
                        let reason = format!(
                            "its cursor {} lies outside {}..={} (where it started .. the head)",
                            v.cursor,
                            v.floor,
                            v.head.max(v.floor)
                        );
                        shared.detach(&mut state, v.id, &reason);
                    }
                }
                Gate::Idle => {
                    let lifetime = &shared.lifetime;
                    if lifetime.idle.is_some() || lifetime.orphan.is_some() {
                        // Decided under the members' lock: a `Hello` admitted before this
                        // counts; one after it is refused as the feed is stopping.
                        let held = lifetime.held();
                        self.came |= held || state.next_id > 0;
                        let quiet = state.members.is_empty()
                            && shared.connections.load(Ordering::SeqCst) == 0
                            && !held;
                        if quiet {
                            let since = *self.alone_since.get_or_insert_with(Instant::now);
                            if let Some(why) = lifetime.expired(since.elapsed(), self.came) {
                                tracing::info!("{why}");
                                shared.stop.store(true, Ordering::SeqCst);
                                return Poll::Ready(None);
                            }
                        } else {
                            self.alone_since = None;
                        }
                    }
                    if !wait {
                        return Poll::Pending;
                    }
                    // Nobody to produce for: sleep until someone joins.
                    state = shared
                        .changed
                        .wait_timeout(state, POLL)
                        .map_or_else(|p| p.into_inner().0, |r| r.0);
                }
                Gate::Ahead { page, word } => {
                    if !wait {
                        return Poll::Pending;
                    }
                    // Far enough ahead of what consumers asked for: sleep until the consumer
                    // that asked for the most asks for more (it wakes us), at most
                    // AHEAD_POLL (another consumer may overtake it).
                    drop(state);
                    page.wait_for_demand(word, AHEAD_POLL);
                    state = shared.lock();
                }
                Gate::Full { id, cursor, page } => {
                    if shared.check_stall(&mut state, id, cursor) {
                        continue;
                    }
                    if !wait {
                        return Poll::Pending;
                    }
                    // Does it hold anyone back: another attached consumer asked for samples
                    // not published yet?
                    let head = shared.ring.head();
                    let others_waiting = state
                        .members
                        .iter()
                        .any(|m| m.attached && m.id != id && m.page.demand() > head);
                    // Ring full: sleep on the slowest consumer's cursor (it wakes us on
                    // release), at most POLL, so that stalls and stops are seen.
                    drop(state);
                    let asleep = Instant::now();
                    page.wait_for_release(cursor, POLL);
                    if page.cursor() == cursor && asleep.elapsed() < Duration::from_millis(1) {
                        // Its futex word disagrees with its cursor (a broken or hostile
                        // consumer): bound the rate instead of spinning.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    state = shared.lock();
                    if let Some(pacer) = &mut self.pacer {
                        pacer.held(id, asleep.elapsed(), others_waiting);
                        let now = Instant::now();
                        let recent = pacer.rule().recent;
                        // Attached and taking batches (a watch runs from its last one).
                        let candidates: Vec<u64> = (state.members.iter())
                            .filter(|m| m.attached)
                            .filter(|m| m.watch.is_none_or(|w| now - w.since < recent))
                            .map(|m| m.id)
                            .collect();
                        if let Some(ask) = pacer.tick(now, &candidates) {
                            shared.ask_to_skim(&mut state, ask);
                        }
                    }
                }
            }
        }
    }
}

/// Runs the pipeline over the feed until the producer stops.
pub(crate) fn run_feeder(
    shared: &Shared,
    pipeline: &ladle_datasets::pipeline::Pipeline,
    seed: u64,
) -> Result<(), ProducerError> {
    let source = FeedSource {
        shared,
        feed: Feed::over(
            shared.info.len,
            seed,
            match &shared.source {
                Source::Images(dataset) => dataset.streamed(),
                Source::Custom(_) => None,
            },
        ),
        alone_since: Some(Instant::now()),
        came: false,
        pacer: (shared.pacing == Pacing::Skim)
            .then(|| Pacer::new(PacingRule::default(), Instant::now())),
        holes: std::collections::VecDeque::new(),
    };
    let sink = RingSink { shared };
    let run = match &shared.source {
        Source::Images(dataset) => pipeline.run_from(dataset.as_ref(), source, &sink),
        Source::Custom(custom) => pipeline.run_with(|| custom.maker(), source, &sink),
    };
    if let Err(error) = run {
        if shared.stop.load(Ordering::SeqCst) {
            // Asked to stop: a sample cut short by the stop (the Python producer kills a
            // worker still making one) is not a failure of the feed.
            tracing::debug!("the feed stopped with a sample unmade: {error}");
            return Ok(());
        }
        // A bad sample under the fail policy ends the whole feed, not just the pipeline:
        // whoever waits on the stop flag (a signal loop, the Python producer) sees it.
        tracing::error!("the feed stops: {error}");
        shared.stop.store(true, Ordering::SeqCst);
        return Err(error.into());
    }
    Ok(())
}
