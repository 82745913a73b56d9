//! The fetcher of a streamed dataset: its thread, what it fetches next (Belady's rule over the
//! feed's order, no more than a window of shards missing at once), and one shard's fetch.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use super::{FAILED_FOR, Inner, Local, Slot, Source, State, StreamStats, WALK};
use crate::FetchError;
use crate::http::{self, Counters, Job};

/// A fetch's end: the shard, and the indexed file or why not.
type Done = (usize, Result<Local, String>);

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn stats(&self) -> StreamStats {
        StreamStats {
            fetched: self.counters.fetched.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            retried: self.counters.retried.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            peak_bytes: self.peak.load(Ordering::Relaxed),
        }
    }

    /// The fetcher thread.
    pub(super) fn run(self: Arc<Self>) {
        self.fetch_until_stopped();
        self.running.store(false, Ordering::SeqCst);
        self.arrived.notify_all();
    }

    fn fetch_until_stopped(self: &Arc<Self>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!("the streamed dataset's fetcher cannot start: {e}");
                return;
            }
        };
        let client = http::http_client();
        runtime.block_on(async {
            let mut tasks: tokio::task::JoinSet<Done> = tokio::task::JoinSet::new();
            // Planning walks the order ahead: only when a fetch ended, someone woke the
            // fetcher (a new order, a decoder waiting) or the decoders moved on.
            let mut planned_at = None;
            let mut changed = true;
            while !self.stop.load(Ordering::SeqCst) {
                let reached = self.reached.load(Ordering::Relaxed);
                let jobs = if changed || planned_at != Some(reached) {
                    planned_at = Some(reached);
                    self.plan(reached)
                } else {
                    Vec::new()
                };
                for (shard, job) in jobs {
                    let (client, counters, retry) =
                        (client.clone(), self.counters.clone(), self.retry);
                    let info_file = self.shards[shard].file.clone();
                    tasks.spawn(async move {
                        let got = fetch_shard(&client, job, &info_file, retry, &counters).await;
                        (shard, got)
                    });
                }
                changed = tokio::select! {
                    Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                        if let Ok(done) = done {
                            self.arrive(done);
                        }
                        true
                    }
                    () = self.wake.notified() => true,
                    () = tokio::time::sleep(Duration::from_millis(20)) => false,
                };
            }
            tasks.abort_all();
        });
    }

    /// A fetch ended: the shard is here, or failed.
    fn arrive(&self, (shard, got): Done) {
        let mut state = self.lock();
        let info = &self.shards[shard];
        if let Slot::Fetching { reserved } = state.slots[shard] {
            state.in_flight = state.in_flight.saturating_sub(reserved);
        }
        state.slots[shard] = match got {
            Ok(local) => {
                let bytes = local.file.metadata().map_or(info.filesize, |m| m.len());
                state.on_disk = (state.on_disk + bytes).saturating_sub(state.counted[shard]);
                state.counted[shard] = bytes;
                state.tick += 1;
                Slot::Here {
                    local: Arc::new(local),
                    used: state.tick,
                }
            }
            Err(why) => {
                tracing::error!(shard = %info.name, "a shard could not be fetched: {why}");
                Slot::Failed {
                    why,
                    at: Instant::now(),
                }
            }
        };
        state.urgent.remove(&shard);
        drop(state);
        self.arrived.notify_all();
    }

    /// The fetches to start now, marking their shards as fetching and evicting what makes
    /// room for them: Belady's rule over the feed's order, a shard needed sooner displacing
    /// one needed later (or not at all); a shard a decoder waits for displaces any shard no
    /// decoder is reading.
    fn plan(&self, reached: u64) -> Vec<(usize, Job)> {
        let mut state = self.lock();
        state.adopting.clear();
        let upcoming = self.upcoming(&state, reached);
        // `upcoming` holds each shard once: its place is when it is needed.
        let rank: HashMap<usize, usize> = (upcoming.iter().enumerate())
            .map(|(r, &shard)| (shard, r + 1))
            .collect();
        let urgent: Vec<usize> = state.urgent.iter().copied().collect();
        let rank_of = |shard: usize| {
            if urgent.contains(&shard) {
                0
            } else {
                rank.get(&shard).copied().unwrap_or(usize::MAX)
            }
        };
        let fetching = (state.slots.iter())
            .filter(|s| matches!(s, Slot::Fetching { .. }))
            .count();
        let mut room = self.concurrency.saturating_sub(fetching);
        let mut jobs = Vec::new();
        // Shards needed before this one that are not on disk yet: no more than a window of
        // them are fetched at once (shards fetched together share the link, so those needed
        // first would arrive later), and the next window's come once the current one's are
        // here, while it is decoded.
        let mut not_here = 0;
        let mut seen = HashSet::new();
        for shard in urgent.iter().chain(&upcoming).copied() {
            if room == 0 {
                break;
            }
            if !seen.insert(shard) {
                continue;
            }
            let needed_at = rank_of(shard);
            if !matches!(state.slots[shard], Slot::Here { .. }) {
                if not_here >= self.grouping.window && needed_at != 0 {
                    break;
                }
                not_here += 1;
            }
            match &state.slots[shard] {
                Slot::Absent => {}
                Slot::Failed { at, .. } if at.elapsed() >= FAILED_FOR => {}
                _ => continue,
            }
            // What it adds: none of a file already on disk.
            let size = self.shards[shard]
                .filesize
                .saturating_sub(state.counted[shard]);
            while state.on_disk + state.in_flight + size > self.budget {
                if !self.evict_one(&mut state, needed_at, &rank_of) {
                    break;
                }
            }
            let nothing_else = state.on_disk + state.in_flight == 0;
            if state.on_disk + state.in_flight + size > self.budget && !nothing_else {
                break; // no room until a shard is read to its end
            }
            let info = &self.shards[shard];
            let url = match &info.from {
                Source::Url(url) => url.clone(),
                Source::S3 { bucket, key } => match self.s3.get_url(bucket, key) {
                    Ok(url) => url,
                    Err(e) => {
                        state.slots[shard] = Slot::Failed {
                            why: e.to_string(),
                            at: Instant::now(),
                        };
                        self.arrived.notify_all();
                        continue;
                    }
                },
            };
            state.slots[shard] = Slot::Fetching { reserved: size };
            state.in_flight += size;
            let peak = state.on_disk + state.in_flight;
            self.peak.fetch_max(peak, Ordering::Relaxed);
            room -= 1;
            jobs.push((
                shard,
                Job {
                    url,
                    name: info.name.clone(),
                    to: info.file.clone(),
                },
            ));
        }
        jobs
    }

    /// The shards the feed's order needs from the first sequence not decoded yet on, in the
    /// order they are first needed, as far as twice the budget reaches.
    fn upcoming(&self, state: &State, reached: u64) -> Vec<usize> {
        let mut upcoming = Vec::new();
        let mut seen: HashSet<usize> = HashSet::new();
        let mut bytes = 0u64;
        let mut walked = 0usize;
        'walk: for (first, order) in &state.schedules {
            let end = first + order.len() as u64;
            if end <= reached {
                continue;
            }
            let start = reached.saturating_sub(*first) as usize;
            for &index in &order[start..] {
                walked += 1;
                if walked > WALK {
                    break 'walk;
                }
                let shard = self.grouping.shard_of(index);
                if seen.insert(shard) {
                    upcoming.push(shard);
                    bytes += self.shards[shard].filesize;
                    if bytes > self.budget.saturating_mul(2) || seen.len() == self.shards.len() {
                        break 'walk;
                    }
                }
            }
        }
        upcoming
    }

    /// Removes the shard on disk that no decoder is reading and is needed last (not at all
    /// first; then the least recently read), if that is later than `needed_at`; whether one
    /// went.
    fn evict_one(
        &self,
        state: &mut State,
        needed_at: usize,
        rank_of: &dyn Fn(usize) -> usize,
    ) -> bool {
        // A shard another feed of the node is fetching or opening holds its lock: not that
        // one (removing it between that feed's look and its open would cost it the shard).
        let victim = (state.slots.iter().enumerate())
            .filter(|(i, _)| !state.adopting.contains(i))
            .filter_map(|(i, slot)| match slot {
                Slot::Here { local, used } if Arc::strong_count(local) == 1 => {
                    Some((rank_of(i), std::cmp::Reverse(*used), i))
                }
                // On disk from before, not indexed: the oldest of all.
                Slot::Absent | Slot::Failed { .. } if state.counted[i] > 0 => {
                    Some((rank_of(i), std::cmp::Reverse(0), i))
                }
                _ => None,
            })
            .max();
        let Some((rank, _, shard)) = victim else {
            return false;
        };
        if rank <= needed_at {
            return false;
        }
        let info = &self.shards[shard];
        match ladle_os::process::lock_file(&lock_path(&info.file)) {
            Ok(Some(_held)) => {
                let _ = std::fs::remove_file(&info.file);
            }
            _ => {
                // Another feed holds it now: try another shard the next time round.
                state.adopting.insert(shard);
                return true;
            }
        }
        state.on_disk = state.on_disk.saturating_sub(state.counted[shard]);
        state.counted[shard] = 0;
        state.slots[shard] = Slot::Absent;
        self.evicted.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(shard = %info.name, "removed a shard from disk to keep the budget");
        true
    }
}

/// Fetches one shard into `to` (or finds it there, put by another feed of the node, under
/// the shard's lock) and indexes it.
async fn fetch_shard(
    client: &http::HttpClient,
    job: Job,
    to: &Path,
    retry: http::Retry,
    counters: &Arc<Counters>,
) -> Result<Local, String> {
    let lock_path = lock_path(to);
    let locked = {
        let lock_path = lock_path.clone();
        tokio::task::spawn_blocking(move || {
            ladle_os::process::lock_file_wait(
                &lock_path,
                Instant::now() + Duration::from_secs(24 * 3600),
            )
        })
        .await
    };
    let _lock = match locked {
        Ok(Ok(Some(lock))) => lock,
        Ok(Ok(None)) => return Err("another feed held the shard's lock for a day".into()),
        Ok(Err(e)) => return Err(format!("{}: {e}", lock_path.display())),
        Err(e) => return Err(e.to_string()),
    };
    if !to.is_file() {
        http::fetch_one(client, &job, retry, counters)
            .await
            .map_err(|e: FetchError| e.to_string())?;
    }
    let to = to.to_path_buf();
    let indexed = tokio::task::spawn_blocking(move || ladle_datasets::wds::index_one(&to)).await;
    match indexed {
        Ok(Ok((file, samples))) => Ok(Local { file, samples }),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The lock a shard's fetch, adoption and removal hold (one process at a time on the node).
fn lock_path(to: &Path) -> PathBuf {
    let mut name = to.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    to.with_file_name(name)
}
