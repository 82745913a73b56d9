//! A feed's side of the cache: [`CacheClient`] is the `DecodedCache` the producer hands its
//! decode threads.
//!
//! A lookup reads the dataset's index (mapped read-only) with one `Acquire` load and, on an
//! entry, checks its record's header (index, bounds, stamp) in the arena (mapped read-only,
//! its descriptor asked of the keeper the first time). A miss asks the keeper for a claim,
//! so two feeds never decode one image at once; a fill writes the record into this feed's
//! own arena (a memfd it made, sealed against everyone else, handed to the keeper) and asks
//! the keeper to publish it. The asks travel on *lanes*, connections to the keeper one decode
//! thread uses at a time.
//!
//! The cache is never in a feed's way: a keeper that cannot be started or that dies, a
//! dataset dropped (`ladle cache drop`), any unexpected answer, and the feed decodes as it
//! would without a cache, tries again [`RETRY`] later, and says so once in its log.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use ladle_datasets::cache::{CachedImage, DecodedCache, Lookup, Stamp};
use ladle_datasets::decode::RgbImage;
use ladle_ring::protocol::{self, CacheStats};

use crate::layout::{IndexHeader, Location, RecordHeader, page_up};
use crate::table::{ArenaView, IndexView};
use crate::wire::{Answer, Ask, ClaimOutcome, DatasetKey, KEEPER_VERSION};
use crate::{KeeperStart, ensure};

/// How long after a failure the client tries the keeper again.
pub const RETRY: Duration = Duration::from_secs(10);
/// How long one ask of the keeper may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    fills: AtomicU64,
    stale: AtomicU64,
    bytes_filled: AtomicU64,
}

/// A feed's decoded-sample cache (see the module docs).
#[derive(Debug)]
pub struct CacheClient {
    start: KeeperStart,
    dataset: DatasetKey,
    /// Lanes opened at attach: one per decode thread, each uses one at a time.
    lanes: usize,
    attached: RwLock<Option<Arc<Attached>>>,
    /// When the keeper may be tried again; serialises attaching.
    retry_at: Mutex<Option<Instant>>,
    counters: Counters,
}

#[derive(Debug)]
struct Attached {
    socket: PathBuf,
    dataset: DatasetKey,
    index: IndexView,
    lanes: Mutex<Vec<Lane>>,
    arenas: RwLock<Vec<Option<Arc<ArenaView>>>>,
    /// The arena size the keeper said to ask for.
    arena_bytes: u64,
    broken: AtomicBool,
}

#[derive(Debug)]
struct Lane {
    conn: UnixStream,
    own: Option<Own>,
}

/// The arena a lane fills.
#[derive(Debug)]
struct Own {
    id: u32,
    view: Arc<ArenaView>,
    cursor: u64,
}

/// A hit's pixels: a slice of an arena, which stays mapped while they are used.
struct Pixels {
    view: Arc<ArenaView>,
    offset: u64,
    header: RecordHeader,
}

impl AsRef<[u8]> for Pixels {
    fn as_ref(&self) -> &[u8] {
        self.view.pixels(self.offset, &self.header)
    }
}

impl CacheClient {
    /// A client of `dataset`'s entries for `threads` decode threads, starting the keeper with
    /// `start` when none runs. It attaches at its first lookup, or at
    /// [`CacheClient::attach_now`], with a lane per thread (so that the feed's descriptors do
    /// not grow as it runs; more are opened only if more threads ask at once).
    pub fn new(start: KeeperStart, dataset: DatasetKey, threads: usize) -> Self {
        Self {
            start,
            dataset,
            lanes: threads.max(1),
            attached: RwLock::new(None),
            retry_at: Mutex::new(None),
            counters: Counters::default(),
        }
    }

    /// Attaches now (a feed does at its start, so that its log says at once whether the
    /// cache is on). `Err` says why not; the client tries again later by itself.
    ///
    /// # Errors
    /// Why the keeper could not be reached, in words.
    pub fn attach_now(&self) -> Result<(), String> {
        self.attached().map(|_| ()).ok_or_else(|| {
            format!(
                "no cache keeper in {}; see its log {}",
                self.start.dir.display(),
                crate::KeeperFiles::in_dir(&self.start.dir).log.display()
            )
        })
    }

    /// What it did so far (a feed's `Stats` carry it).
    pub fn counters(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            fills: c.fills.load(Ordering::Relaxed),
            stale: c.stale.load(Ordering::Relaxed),
            bytes_filled: c.bytes_filled.load(Ordering::Relaxed),
            attached: self.live().is_some(),
        }
    }

    /// The attachment, if there is one that has not broken.
    fn live(&self) -> Option<Arc<Attached>> {
        let attached = self.attached.read().unwrap_or_else(PoisonError::into_inner);
        attached
            .as_ref()
            .filter(|a| !a.broken.load(Ordering::Relaxed))
            .cloned()
    }

    /// The attachment, attaching if it is time to try.
    fn attached(&self) -> Option<Arc<Attached>> {
        if let Some(a) = self.live() {
            return Some(a);
        }
        let mut retry_at = self.retry_at.lock().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have attached while this one waited for the lock.
        if let Some(a) = self.live() {
            return Some(a);
        }
        if retry_at.is_some_and(|at| Instant::now() < at) {
            return None;
        }
        match self.attach() {
            Ok(attached) => {
                let attached = Arc::new(attached);
                tracing::info!(
                    socket = %attached.socket.display(),
                    dataset = %self.dataset.key,
                    "the decoded-sample cache is on"
                );
                *self
                    .attached
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = Some(attached.clone());
                *retry_at = None;
                Some(attached)
            }
            Err(e) => {
                tracing::warn!(
                    "the decoded-sample cache is off for now (tried again in {} s): {e}",
                    RETRY.as_secs()
                );
                *retry_at = Some(Instant::now() + RETRY);
                None
            }
        }
    }

    fn attach(&self) -> Result<Attached, String> {
        let entry = ensure(&self.start).map_err(|e| e.to_string())?;
        let (lane, fd, arena_bytes) = open_lane(&entry.socket, &self.dataset)?;
        let fd = fd.ok_or("the keeper's Welcome came without the index")?;
        let index = IndexView::map(fd.as_fd(), self.dataset.len, false)
            .map_err(|e| format!("cannot map the cache's index: {e}"))?;
        let mut lanes = vec![lane];
        while lanes.len() < self.lanes {
            lanes.push(open_lane(&entry.socket, &self.dataset)?.0);
        }
        Ok(Attached {
            socket: entry.socket,
            dataset: self.dataset.clone(),
            index,
            lanes: Mutex::new(lanes),
            arenas: RwLock::new(Vec::new()),
            arena_bytes,
            broken: AtomicBool::new(false),
        })
    }

    /// The attachment failed: let it go, and try again after [`RETRY`].
    fn broke(&self, attached: &Attached, why: &str) {
        if attached.broken.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!(
            socket = %attached.socket.display(),
            "the decoded-sample cache is off for now (tried again in {} s): {why}",
            RETRY.as_secs()
        );
        *self.retry_at.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Instant::now() + RETRY);
    }

    fn try_lookup(&self, a: &Attached, index: u64, stamp: Stamp) -> Result<Lookup, String> {
        for _ in 0..2 {
            if a.index.header(IndexHeader::Dropped).load(Ordering::Acquire) != 0 {
                return Err("the keeper dropped this dataset".into());
            }
            let word = a
                .index
                .word(index)
                .ok_or(format!("no sample {index} in the index"))?;
            let word = word.load(Ordering::Acquire);
            if let Some(at) = Location::of_word(word) {
                let view = self.arena(a, at.arena)?;
                let header = (view.header(at.offset))
                    .filter(|h| h.index == index)
                    .ok_or(format!("no record of sample {index} where the index says"))?;
                if header.stamp == stamp {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Lookup::Hit(CachedImage {
                        width: header.width,
                        height: header.height,
                        pixels: Arc::new(Pixels {
                            view,
                            offset: at.offset,
                            header,
                        }),
                    }));
                }
                self.counters.stale.fetch_add(1, Ordering::Relaxed);
                expect_done(a.ask(&Ask::Stale { index, word }, None)?)?;
            }
            if a.index.header(IndexHeader::Full).load(Ordering::Acquire) != 0 {
                break;
            }
            match a.ask(&Ask::Claim { index }, None)?.0 {
                Answer::Claimed {
                    outcome: ClaimOutcome::Fill,
                } => {
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    return Ok(Lookup::Fill);
                }
                Answer::Claimed {
                    outcome: ClaimOutcome::Skip,
                } => break,
                Answer::Claimed {
                    outcome: ClaimOutcome::Ready,
                } => continue,
                other => return Err(format!("answered {other:?} to a claim")),
            }
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        Ok(Lookup::Skip)
    }

    /// Arena `id`, mapped read-only the first time it is met.
    fn arena(&self, a: &Attached, id: u32) -> Result<Arc<ArenaView>, String> {
        if let Some(Some(view)) = a
            .arenas
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id as usize)
        {
            return Ok(view.clone());
        }
        let (answer, fd) = a.ask(&Ask::Arena { id }, None)?;
        let (Answer::ArenaFd { id: got }, Some(fd)) = (answer, fd) else {
            return Err(format!("no descriptor of arena {id}"));
        };
        if got != id {
            return Err(format!("asked for arena {id}, got {got}"));
        }
        if !ladle_os::shm::sealed_against_writers(fd.as_fd()) {
            return Err(format!("arena {id} is not sealed against writers"));
        }
        let bytes = ladle_os::shm::file_len(fd.as_fd()).map_err(|e| e.to_string())?;
        let view = Arc::new(
            ArenaView::map(fd.as_fd(), bytes, false).map_err(|e| format!("arena {id}: {e}"))?,
        );
        let mut arenas = a.arenas.write().unwrap_or_else(PoisonError::into_inner);
        if arenas.len() <= id as usize {
            arenas.resize_with(id as usize + 1, || None);
        }
        Ok(arenas[id as usize].get_or_insert(view).clone())
    }

    fn try_fill(
        &self,
        a: &Attached,
        index: u64,
        stamp: Stamp,
        image: &RgbImage<'_>,
    ) -> Result<(), String> {
        let header = RecordHeader {
            width: image.width,
            height: image.height,
            index,
            stamp,
        };
        if header.pixels_len() != image.pixels.len() as u64 {
            return Err(format!(
                "an image of {} bytes for {}×{} pixels",
                image.pixels.len(),
                image.width,
                image.height
            ));
        }
        let len = header.record_len();
        let mut lane = a.take_lane()?;
        let has_room = |lane: &Lane| {
            lane.own
                .as_ref()
                .is_some_and(|o| o.cursor + len <= o.view.bytes())
        };
        let filled = (|| {
            if !has_room(&lane) && !self.new_arena(a, &mut lane, len)? {
                // No new arena: another lane of this feed with room takes the record, else
                // the budget is spent (nothing was evicted for it).
                let other = {
                    let mut pool = a.lanes.lock().unwrap_or_else(PoisonError::into_inner);
                    let at = pool.iter().position(has_room);
                    at.map(|at| pool.swap_remove(at))
                };
                match other {
                    Some(other) => a.give_back(std::mem::replace(&mut lane, other)),
                    None => {
                        expect_done(lane.ask(&Ask::Release { index }, None)?)?;
                        return Ok(());
                    }
                }
            }
            let own = lane.own.as_mut().ok_or("no arena")?;
            own.view.write(own.cursor, &header, image.pixels);
            let publish = Ask::Publish {
                index,
                arena: own.id,
                offset: own.cursor,
            };
            own.cursor += len;
            expect_done(lane.ask(&publish, None)?)?;
            self.counters.fills.fetch_add(1, Ordering::Relaxed);
            self.counters.bytes_filled.fetch_add(len, Ordering::Relaxed);
            Ok(())
        })();
        if filled.is_ok() {
            a.give_back(lane);
        }
        filled
    }

    /// A new arena for `lane`, room for a record of `len` at least. `Ok(false)`: the budget
    /// is spent.
    fn new_arena(&self, a: &Attached, lane: &mut Lane, len: u64) -> Result<bool, String> {
        let at_least = page_up(len);
        let grant = Ask::Grant {
            bytes: at_least.max(a.arena_bytes),
            at_least,
        };
        let (id, bytes) = match lane.ask(&grant, None)?.0 {
            Answer::Granted { id, bytes } if bytes >= at_least => (id, bytes),
            Answer::Full => return Ok(false),
            other => return Err(format!("answered {other:?} to a grant")),
        };
        let fd = ladle_os::shm::memfd("ladle-cache-arena", bytes)
            .map_err(|e| format!("cannot make an arena: {e}"))?;
        let view = Arc::new(
            ArenaView::map(fd.as_fd(), bytes, true)
                .map_err(|e| format!("cannot map an arena: {e}"))?,
        );
        // From here only this mapping writes it.
        ladle_os::shm::seal_against_writers(fd.as_fd())
            .map_err(|e| format!("cannot seal an arena: {e}"))?;
        expect_done(lane.ask(&Ask::Adopt { id }, Some(fd))?)?;
        let mut arenas = a.arenas.write().unwrap_or_else(PoisonError::into_inner);
        if arenas.len() <= id as usize {
            arenas.resize_with(id as usize + 1, || None);
        }
        arenas[id as usize] = Some(view.clone());
        lane.own = Some(Own {
            id,
            view,
            cursor: 0,
        });
        Ok(true)
    }
}

fn expect_done((answer, _): (Answer, Option<OwnedFd>)) -> Result<(), String> {
    match answer {
        Answer::Done => Ok(()),
        other => Err(format!("the keeper answered {other:?}")),
    }
}

/// A new lane of `dataset` at `socket`, and the index descriptor its Welcome brought.
fn open_lane(
    socket: &std::path::Path,
    dataset: &DatasetKey,
) -> Result<(Lane, Option<OwnedFd>, u64), String> {
    let conn = ladle_os::net::connect_by(socket, Instant::now() + ASK_TIMEOUT).map_err(|e| {
        format!(
            "cannot connect to the cache keeper at {}: {e}",
            socket.display()
        )
    })?;
    let lane = Lane { conn, own: None };
    let hello = Ask::Hello {
        version: KEEPER_VERSION,
        dataset: Some(dataset.clone()),
        pid: std::process::id(),
    };
    match lane.ask(&hello, None)? {
        (Answer::Welcome { arena_bytes, .. }, fd) => Ok((lane, fd, arena_bytes)),
        (other, _) => Err(format!(
            "the cache keeper at {} answered {other:?}",
            socket.display()
        )),
    }
}

impl Lane {
    fn ask(&self, ask: &Ask, fd: Option<OwnedFd>) -> Result<(Answer, Option<OwnedFd>), String> {
        let fds: Vec<_> = fd.iter().map(AsFd::as_fd).collect();
        protocol::send(&self.conn, ask, &fds).map_err(|e| format!("the cache keeper: {e}"))?;
        let (answer, mut fds) =
            protocol::recv_by::<Answer>(&self.conn, Instant::now() + ASK_TIMEOUT)
                .map_err(|e| format!("the cache keeper: {e}"))?;
        match answer {
            Answer::Refused { reason } => Err(format!("the cache keeper refused: {reason}")),
            answer => Ok((answer, fds.pop())),
        }
    }
}

impl Attached {
    /// A lane of the pool, or a new one when every lane is in use.
    fn take_lane(&self) -> Result<Lane, String> {
        if let Some(lane) = self
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            return Ok(lane);
        }
        open_lane(&self.socket, &self.dataset).map(|(lane, ..)| lane)
    }

    fn give_back(&self, lane: Lane) {
        self.lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(lane);
    }

    /// One ask on a lane of the pool (a lane that fails is not given back).
    fn ask(&self, ask: &Ask, fd: Option<OwnedFd>) -> Result<(Answer, Option<OwnedFd>), String> {
        let lane = self.take_lane()?;
        let answer = lane.ask(ask, fd)?;
        self.give_back(lane);
        Ok(answer)
    }
}

impl DecodedCache for CacheClient {
    fn lookup(&self, index: u64, stamp: Stamp) -> Lookup {
        let Some(a) = self.attached() else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Lookup::Skip;
        };
        match self.try_lookup(&a, index, stamp) {
            Ok(lookup) => lookup,
            Err(e) => {
                self.broke(&a, &e);
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                Lookup::Skip
            }
        }
    }

    fn fill(&self, index: u64, stamp: Stamp, image: &RgbImage<'_>) {
        let Some(a) = self.attached() else { return };
        if let Err(e) = self.try_fill(&a, index, stamp, image) {
            self.broke(&a, &e);
        }
    }

    fn release(&self, index: u64) {
        let Some(a) = self.attached() else { return };
        if let Err(e) = a.ask(&Ask::Release { index }, None).and_then(expect_done) {
            self.broke(&a, &e);
        }
    }
}
