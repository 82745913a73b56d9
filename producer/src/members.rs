//! The consumers a producer serves, as the feeder and the control server share them
//! ([`Shared`], [`State`]): membership, leaving, detaching, letting go after a stall, skimming,
//! and the feed's [`FeedStats`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ladle_ring::protocol::{
    ClassNameFrames, ConsumerInfo, DatasetInfo, FeedIdentity, FeedStats, ServerMessage,
};
use ladle_ring::{CursorPage, ProducerRing, Readers};

use crate::feed::CutPoints;
pub(crate) use crate::pacing::Pacing;
use crate::source::Source;
use crate::{ReadAhead, groups, pacing};

/// How long a consumer has held the feed back, as the feeder watches it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch {
    pub(crate) lease: u64,
    pub(crate) cursor: u64,
    pub(crate) since: Instant,
    pub(crate) logged: bool,
}

/// One admitted consumer, as the producer tracks it.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) id: u64,
    /// For logs: quoted and escaped, at most [`server::MAX_NAME`] characters.
    pub(crate) name: String,
    /// Where its current attachment started (its cut point is `start mod N`).
    pub(crate) start: u64,
    pub(crate) page: Arc<CursorPage>,
    /// A handle to its socket, to tell it `End`, `Detached` or `Rejoined`.
    pub(crate) socket: std::os::unix::net::UnixStream,
    /// Whether its cursor gates the producer (false once let go, until it rejoins).
    pub(crate) attached: bool,
    pub(crate) watch: Option<Watch>,
    /// Its process id and batch size, as it said in `Hello`.
    pub(crate) pid: u32,
    pub(crate) batch_size: u32,
    /// When it joined.
    pub(crate) joined: Instant,
    /// Time it held the feed back in watches that have ended.
    pub(crate) held_back: Duration,
    /// Times it rejoined after a let-go.
    pub(crate) rejoins: u32,
    /// Asked to skim (its cursor page says so) and not attached again since.
    pub(crate) skim_asked: bool,
    /// Skimming: it said `Skim`, its cursor no longer gates the feed.
    pub(crate) skimming: bool,
    /// Times it was moved to skimming.
    pub(crate) skims: u32,
    /// What it still needs, as it declared (protocol version 13).
    pub(crate) needs: crate::needs::Needs,
}

impl Member {
    /// A member just admitted (see [`server`]).
    pub(crate) fn new(
        id: u64,
        name: String,
        start: u64,
        page: Arc<CursorPage>,
        socket: std::os::unix::net::UnixStream,
        hello: (u32, u32),
    ) -> Self {
        Self {
            id,
            name,
            start,
            page,
            socket,
            attached: true,
            watch: None,
            pid: hello.0,
            batch_size: hello.1,
            joined: Instant::now(),
            held_back: Duration::ZERO,
            rejoins: 0,
            skim_asked: false,
            skimming: false,
            skims: 0,
            needs: crate::needs::Needs::default(),
        }
    }

    /// Ends its watch, if any, adding how long it ran to the time it held the feed back.
    pub(crate) fn end_watch(&mut self, now: Instant) {
        if let Some(w) = self.watch.take() {
            self.held_back += now.saturating_duration_since(w.since);
        }
    }

    /// What it has delivered, over all its attachments and while skimming, as its page
    /// says: at most what was published (`head`), whatever a hostile consumer writes there
    /// (a figure for reports, never for a decision).
    pub(crate) fn released(&self, head: u64) -> u64 {
        self.page.delivered().min(head)
    }
}

/// One consumer as [`Producer::consumer_stats`](crate::Producer::consumer_stats) shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Its id in the producer's logs.
    pub id: u64,
    /// Its name as logged: quoted and escaped (`"run-00"`).
    pub name: String,
    /// Samples it has released so far (read and dropped), over all its attachments.
    pub released: u64,
    /// Whether its cursor gates the producer (false while let go).
    pub attached: bool,
    /// How long it has been holding the feed back without taking a batch, if it is.
    pub holding_back: Option<Duration>,
}

/// What the feeder and the control server share.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) readers: Readers,
    pub(crate) cuts: CutPoints,
    pub(crate) members: Vec<Member>,
    pub(crate) next_id: u64,
    /// Consumer groups: ranks waiting for the others, and the ranks running.
    pub(crate) groups: groups::Groups,
    /// Whether some member has a watch (so that a loan, once per sample, need not look).
    pub(crate) watching: bool,
}

/// Everything the producer's threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The decoded-sample cache its decode threads use, if any.
    pub(crate) cache: Option<Arc<ladle_cache::CacheClient>>,
    pub(crate) ring: ProducerRing,
    pub(crate) source: Source,
    pub(crate) info: DatasetInfo,
    /// What a consumer's saved position is checked against.
    pub(crate) identity: FeedIdentity,
    /// How the class names travel to a consumer: in its `Welcome`, or before it.
    pub(crate) class_names: ClassNameFrames,
    pub(crate) state: Mutex<State>,
    /// Signalled when a consumer joins or leaves.
    pub(crate) changed: Condvar,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) published: AtomicU64,
    pub(crate) bad: AtomicU64,
    /// Samples released by consumers that have left or been let go (see
    /// [`Producer::consumed`]).
    pub(crate) consumed: AtomicU64,
    pub(crate) stall_timeout: Duration,
    pub(crate) read_ahead: ReadAhead,
    pub(crate) pacing: Pacing,
    pub(crate) lifetime: crate::Lifetime,
    pub(crate) max_connections: usize,
    /// Connection threads alive.
    pub(crate) connections: AtomicUsize,
    /// When the producer started, and its decode threads (for [`FeedStats`]).
    pub(crate) started: Instant,
    pub(crate) threads: u32,
    /// Consumers admitted, gone and let go since the start.
    pub(crate) joins: AtomicU64,
    pub(crate) leaves: AtomicU64,
    pub(crate) let_gos: AtomicU64,
    /// Consumers moved to skimming since the start.
    pub(crate) skims: AtomicU64,
    /// Positions let pass undecoded (holes: nobody needed them).
    pub(crate) holes: AtomicU64,
    /// CPU nanoseconds the decode threads used (counted as each completes a sample).
    pub(crate) decode_cpu_ns: AtomicU64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops consumer `id` (it left or died); its cut point dissolves.
    pub(crate) fn remove(&self, id: u64, why: &str) {
        let mut state = self.lock();
        if let Some(m) = self.forget(&mut state, id, why) {
            tracing::info!(consumer = m.id, name = %m.name, "consumer left ({why})");
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Takes consumer `id` out of every record: members, readers, cut points, its group
    /// (whose other ranks are told it broke, and why: `why`).
    pub(crate) fn forget(&self, state: &mut State, id: u64, why: &str) -> Option<Member> {
        let at = state.members.iter().position(|m| m.id == id)?;
        let m = state.members.swap_remove(at);
        if let Some((group, (others, rank))) = state.groups.gone(id) {
            if !others.is_empty() {
                self.tell_broken(state, &group, &others, rank, why);
            }
        }
        self.leaves.fetch_add(1, Ordering::Relaxed);
        state.readers.detach(id);
        if m.attached {
            state.cuts.remove(m.start % self.info.len);
        }
        let released = m.released(self.ring.head());
        self.consumed.fetch_add(released, Ordering::Relaxed);
        Some(m)
    }

    /// Tells the consumers `others` of group `group` that rank `rank` went (`why`): their
    /// group cannot go on. They stay attached until they leave.
    pub(crate) fn tell_broken(
        &self,
        state: &State,
        group: &str,
        others: &[u64],
        rank: u32,
        why: &str,
    ) {
        tracing::warn!(
            group,
            rank,
            "a rank of a consumer group went ({why}); the group is broken"
        );
        let message = ServerMessage::GroupBroken {
            rank,
            reason: why.to_owned(),
        };
        for m in state.members.iter().filter(|m| others.contains(&m.id)) {
            // The write timeout set at admission bounds a stalled peer.
            if let Err(e) = ladle_ring::protocol::send(&m.socket, &message, &[]) {
                tracing::debug!(consumer = m.id, "cannot tell it that its group broke: {e}");
            }
        }
    }

    /// Detaches consumer `id` for good (it broke the protocol): tells it why and closes its
    /// connection; nobody else is affected.
    pub(crate) fn detach(&self, state: &mut State, id: u64, reason: &str) {
        if let Some(m) = self.forget(state, id, reason) {
            tracing::warn!(consumer = m.id, name = %m.name, "consumer detached: {reason}");
            let reason = reason.to_owned();
            let _ = ladle_ring::protocol::send(&m.socket, &ServerMessage::Detached { reason }, &[]);
            let _ = m.socket.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Called while consumer `id`, at `cursor`, holds the feed back: lets it go once it has
    /// taken no batch for the stall timeout. Returns whether it did.
    pub(crate) fn check_stall(&self, state: &mut State, id: u64, cursor: u64) -> bool {
        let now = Instant::now();
        state.watching = true;
        // Only the consumer the gate waits on now holds the feed back: a watch left on
        // another (it was the slowest a moment ago) ends here, or its held-back time would
        // grow while it reads, and a later watch would start from its old instant.
        for other in state.members.iter_mut().filter(|m| m.id != id) {
            other.end_watch(now);
        }
        let Some(m) = state.members.iter_mut().find(|m| m.id == id) else {
            return false;
        };
        let lease = m.page.lease();
        let watch = match &mut m.watch {
            Some(w) if w.lease == lease && w.cursor == cursor => w,
            _ => {
                m.end_watch(now);
                m.watch = Some(Watch {
                    lease,
                    cursor,
                    since: now,
                    logged: false,
                });
                return false;
            }
        };
        let held = now.duration_since(watch.since);
        // Letting the only attached consumer go would help nobody (and cost it a rejoin): a
        // consumer that joins later is held back at most one poll, since the watch has run.
        let alone = state.readers.len() <= 1;
        if held < self.stall_timeout || alone {
            let worth_a_line = Duration::from_secs(1).min(self.stall_timeout / 2);
            if held >= worth_a_line && !watch.logged && !alone {
                watch.logged = true;
                tracing::info!(
                    consumer = m.id,
                    name = %m.name,
                    "the feed is held back by this consumer: no batch taken for {:.1} s",
                    held.as_secs_f64()
                );
            }
            return false;
        }
        if !m.page.let_go(lease) {
            m.end_watch(now); // it delivered a batch just now
            return false;
        }
        m.end_watch(now);
        self.let_gos.fetch_add(1, Ordering::Relaxed);
        m.attached = false;
        let (mid, start) = (m.id, m.start);
        tracing::warn!(
            consumer = mid,
            name = %m.name,
            "consumer let go: it held the feed back for {:.1} s without taking a batch \
             (stall timeout); the feed goes on, and it rejoins when it resumes",
            held.as_secs_f64()
        );
        state.readers.detach(mid);
        state.cuts.remove(start % self.info.len);
        true
    }

    /// How the feed is doing (see [`FeedStats`]); every consumer listed (the control server
    /// cuts the list to fit a frame).
    pub(crate) fn stats(&self) -> FeedStats {
        let now = Instant::now();
        let head = self.published.load(Ordering::Relaxed);
        let holes = self.holes.load(Ordering::Relaxed);
        let state = self.lock();
        let mut consumers: Vec<ConsumerInfo> = state
            .members
            .iter()
            .map(|m| {
                let lag = if m.attached {
                    head.saturating_sub(m.page.cursor())
                } else {
                    0
                };
                let holding = m.watch.map(|w| now.saturating_duration_since(w.since));
                ConsumerInfo {
                    id: m.id,
                    name: m.name.clone(),
                    pid: m.pid,
                    batch_size: m.batch_size,
                    connected_s: now.saturating_duration_since(m.joined).as_secs_f64(),
                    released: m.released(head),
                    lag,
                    attached: m.attached,
                    holding_back_s: holding.map(|d| d.as_secs_f64()),
                    held_back_s: (m.held_back + holding.unwrap_or_default()).as_secs_f64(),
                    waited_s: m.page.waited().as_secs_f64(),
                    rejoins: m.rejoins,
                    skimming: m.skimming,
                    skims: m.skims,
                }
            })
            .collect();
        drop(state);
        consumers.sort_by_key(|c| c.id);
        let capacity = self.ring.layout().capacity;
        let occupancy = consumers
            .iter()
            .filter(|c| c.attached)
            .map(|c| c.lag)
            .max()
            .unwrap_or(0)
            .min(capacity);
        let cpu = ladle_os::clock::process_cpu();
        FeedStats {
            source: self.info.source.clone(),
            dataset_len: self.info.len,
            capacity,
            threads: self.threads,
            pid: std::process::id(),
            uptime_s: now.saturating_duration_since(self.started).as_secs_f64(),
            cpu_s: cpu.as_secs_f64(),
            decode_cpu_s: self.decode_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            published: head.saturating_sub(holes),
            bad: self.bad.load(Ordering::Relaxed),
            occupancy,
            joins: self.joins.load(Ordering::Relaxed),
            leaves: self.leaves.load(Ordering::Relaxed),
            let_gos: self.let_gos.load(Ordering::Relaxed),
            consumed: (consumers.iter().map(|c| c.released))
                .fold(self.consumed.load(Ordering::Relaxed), u64::saturating_add),
            skims: self.skims.load(Ordering::Relaxed),
            holes,
            consumers,
            consumers_omitted: 0,
            cache: self.cache.as_ref().map(|c| c.counters()),
        }
    }

    /// Asks a consumer that held the others back to skim (the pacing rule decided it).
    pub(crate) fn ask_to_skim(&self, state: &mut State, ask: pacing::AskToSkim) {
        let Some(m) = state.members.iter_mut().find(|m| m.id == ask.id) else {
            return;
        };
        if !m.attached || m.skim_asked {
            return;
        }
        m.skim_asked = true;
        m.page.ask_to_skim();
        tracing::info!(
            consumer = m.id,
            name = %m.name,
            "asking the consumer to skim: it held the others back {:.1} s of the last {:.1} s \
             while they waited for data",
            ask.held.as_secs_f64(),
            ask.window.as_secs_f64()
        );
    }

    /// Consumer `id`, asked to skim, said `Skim`: its cursor stops gating the feed (and its
    /// cut point dissolves), it copies what it needs as it passes. Batches of the ring it
    /// still holds stop gating too: the feed may overwrite them (they say so).
    pub(crate) fn skim(&self, id: u64) -> Result<(), String> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let m = (state.members.iter_mut())
            .find(|m| m.id == id)
            .ok_or("Skim from an unknown consumer")?;
        if !m.skim_asked {
            return Err("sent Skim without being asked to skim".into());
        }
        if m.skimming {
            return Err("sent Skim twice".into());
        }
        m.skimming = true;
        m.skims += 1;
        self.skims.fetch_add(1, Ordering::Relaxed);
        if !m.attached {
            // Let go (a stall) since it was asked: nothing gates on it already.
            return Ok(());
        }
        m.end_watch(Instant::now());
        m.attached = false;
        let (mid, start) = (m.id, m.start);
        tracing::info!(
            consumer = mid,
            name = %m.name,
            "consumer skims: the feed goes on at the others' pace, and it copies what its \
             epoch still needs as the samples pass"
        );
        state.readers.detach(mid);
        state.cuts.remove(start % self.info.len);
        drop(guard);
        self.changed.notify_all();
        Ok(())
    }

    /// Forgets every watch: the feed is not held back.
    pub(crate) fn clear_watches(state: &mut State) {
        if std::mem::take(&mut state.watching) {
            let now = Instant::now();
            for m in &mut state.members {
                m.end_watch(now);
            }
        }
    }
}
