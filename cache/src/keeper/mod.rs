//! The keeper: one process per user and node (`ladle cache keep`), the holder of the cache's
//! memory between feeds. It makes each dataset's index (and alone writes it), holds the
//! arenas feeds fill (their memfds, handed over sealed), lends both read-only to the lanes of
//! the same user, and publishes an entry only once its filler says it is complete and the
//! record checks out. Its decisions are its ledger's (`keeper/ledger.rs`).
//!
//! It lives while it holds a dataset or a connection, and [`KeeperConfig::idle_timeout`]
//! past the last; a dataset no lane has used for that long is dropped. It exits at once
//! when its socket file no longer names its socket (its registry was removed).

mod ledger;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ladle_ring::ProtocolError;
use ladle_ring::protocol;

use crate::layout::{INDEX_MAGIC, IndexHeader, Location, index_file_len};
use crate::table::{ArenaView, IndexView};
use crate::wire::{Answer, Ask, ClaimOutcome, DatasetKey, KEEPER_VERSION, KeeperEntry, Listing};
use crate::{CacheError, KeeperFiles};
use ledger::{Claim, Lane, Ledger};

/// How the keeper runs.
#[derive(Debug, Clone)]
pub struct KeeperConfig {
    /// The registry directory it lives in ([`KeeperFiles`]).
    pub dir: PathBuf,
    /// Bytes it may hold.
    pub budget: u64,
    /// A dataset no lane used this long is dropped; the keeper exits this long after it
    /// holds nothing and nobody is connected.
    pub idle_timeout: Duration,
}

/// How long a claim of a sample another lane is filling waits for that fill.
const CLAIM_WAIT: Duration = Duration::from_secs(1);
/// How often the keeper looks at its socket file and its idle datasets.
const TICK: Duration = Duration::from_millis(100);

struct Dataset {
    index: IndexView,
    index_fd: OwnedFd,
    arenas: Vec<Option<(OwnedFd, ArenaView)>>,
}

struct Held {
    ledger: Ledger,
    tables: BTreeMap<String, Dataset>,
    next_lane: Lane,
}

struct Keeper {
    held: Mutex<Held>,
    changed: Condvar,
    connections: AtomicUsize,
    config: KeeperConfig,
}

impl Keeper {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs the keeper until it has nothing to keep (see the module docs). `ready` is called
/// once it serves, with its entry (`ladle cache keep --detach` prints it).
///
/// # Errors
/// [`CacheError`] when it cannot serve: another keeper lives, or its files cannot be made.
pub fn run(config: KeeperConfig, ready: impl FnOnce(&KeeperEntry)) -> Result<(), CacheError> {
    let files = KeeperFiles::in_dir(&config.dir);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CacheError::Io { path, source }
    };
    let Some(_live) = ladle_os::process::lock_file(&files.live).map_err(io(&files.live))? else {
        return Err(CacheError::KeeperLives { live: files.live });
    };
    let listener = ladle_os::net::bind_private(&files.socket).map_err(|e| CacheError::Bind {
        socket: files.socket.clone(),
        reason: e.to_string(),
    })?;
    let ours = socket_identity(&files.socket);
    let entry = KeeperEntry {
        version: KEEPER_VERSION,
        pid: std::process::id(),
        socket: files.socket.clone(),
        budget: config.budget,
        idle_timeout_s: config.idle_timeout.as_secs_f64(),
    };
    let tmp = files.entry.with_extension("json.tmp");
    let json = serde_json::to_vec(&entry).unwrap_or_default();
    std::fs::write(&tmp, json).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &files.entry).map_err(io(&files.entry))?;
    tracing::info!(
        socket = %files.socket.display(),
        budget = config.budget,
        idle_timeout_s = config.idle_timeout.as_secs_f64(),
        "the cache keeper serves"
    );
    ready(&entry);
    let keeper = Arc::new(Keeper {
        held: Mutex::new(Held {
            ledger: Ledger::new(config.budget),
            tables: BTreeMap::new(),
            next_lane: 0,
        }),
        changed: Condvar::new(),
        connections: AtomicUsize::new(0),
        config,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let accepting = {
        let (keeper, stop) = (keeper.clone(), stop.clone());
        std::thread::Builder::new()
            .name("ladle-cache-accept".into())
            .spawn(move || {
                ladle_os::net::accept_loop(&listener, &stop, TICK, "the cache keeper", |conn| {
                    let keeper = keeper.clone();
                    keeper.connections.fetch_add(1, Ordering::SeqCst);
                    let spawned = std::thread::Builder::new()
                        .name("ladle-cache-conn".into())
                        .spawn({
                            let keeper = keeper.clone();
                            move || {
                                serve(&keeper, &conn);
                                keeper.connections.fetch_sub(1, Ordering::SeqCst);
                            }
                        });
                    if spawned.is_err() {
                        keeper.connections.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            })
            .map_err(|e| CacheError::Io {
                path: files.socket.clone(),
                source: e,
            })?
    };
    let mut quiet_since = Instant::now();
    let why = loop {
        std::thread::sleep(TICK);
        if socket_identity(&files.socket) != ours {
            break "its socket file was removed or replaced";
        }
        let now = Instant::now();
        let timeout = keeper.config.idle_timeout;
        let mut held = keeper.lock();
        for key in held.ledger.expired(now, timeout) {
            tracing::info!(dataset = %key, "dropping a dataset no feed used for {:.0} s", timeout.as_secs_f64());
            drop_dataset(&mut held, &key);
        }
        if !held.ledger.is_empty() || keeper.connections.load(Ordering::SeqCst) > 0 {
            quiet_since = now;
        } else if now.duration_since(quiet_since) >= timeout {
            break "it held nothing and nobody was connected for the idle timeout";
        }
    };
    tracing::info!("the cache keeper exits: {why}");
    stop.store(true, Ordering::SeqCst);
    let _ = accepting.join();
    if socket_identity(&files.socket) == ours {
        let _ = std::fs::remove_file(&files.entry);
        let _ = std::fs::remove_file(&files.socket);
    }
    Ok(())
}

/// The socket file's device and inode: another keeper's socket at the path is not ours.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn drop_dataset(held: &mut Held, key: &str) {
    held.ledger.drop_dataset(key);
    if let Some(table) = held.tables.remove(key) {
        table
            .index
            .header(IndexHeader::Dropped)
            .store(1, Ordering::Release);
    }
}

/// Serves one connection: its `Hello`, then its asks until it closes.
fn serve(keeper: &Keeper, conn: &UnixStream) {
    let me = ladle_os::process::my_uid();
    match ladle_os::net::peer_uid(conn) {
        Ok(uid) if uid == me => {}
        Ok(uid) => {
            tracing::warn!(uid, "refused a connection of another user");
            return;
        }
        Err(e) => {
            tracing::debug!("no peer credentials: {e}");
            return;
        }
    }
    let hello = protocol::recv_by::<Ask>(conn, Instant::now() + Duration::from_secs(5));
    let _ = conn.set_read_timeout(None);
    let (dataset, pid) = match hello {
        Ok((
            Ask::Hello {
                version,
                dataset,
                pid,
            },
            _,
        )) if version == KEEPER_VERSION => (dataset, pid),
        Ok((Ask::Hello { version, .. }, _)) => {
            let reason = format!(
                "keeper protocol version mismatch: the keeper speaks {KEEPER_VERSION}, the asker {version}"
            );
            let _ = protocol::send(conn, &Answer::Refused { reason }, &[]);
            return;
        }
        Ok((other, _)) => {
            let reason = format!("the first ask must be Hello, not {other:?}");
            let _ = protocol::send(conn, &Answer::Refused { reason }, &[]);
            return;
        }
        Err(e) => {
            tracing::debug!("a connection went before its Hello: {e}");
            return;
        }
    };
    match dataset {
        Some(dataset) => serve_lane(keeper, conn, &dataset, pid),
        None => serve_operator(keeper, conn),
    }
}

fn refuse(conn: &UnixStream, reason: String) {
    tracing::warn!("refused: {reason}");
    let _ = protocol::send(conn, &Answer::Refused { reason }, &[]);
}

fn serve_lane(keeper: &Keeper, conn: &UnixStream, dataset: &DatasetKey, pid: u32) {
    let lane = {
        let mut held = keeper.lock();
        let lane = held.next_lane;
        held.next_lane += 1;
        match attach(&mut held, dataset, lane) {
            Ok(fd) => {
                let welcome = Answer::Welcome {
                    version: KEEPER_VERSION,
                    lane,
                    arena_bytes: held.ledger.arena_unit(),
                };
                if protocol::send(conn, &welcome, &[fd.as_fd()]).is_err() {
                    held.ledger.lane_gone(lane, Instant::now());
                    return;
                }
                tracing::debug!(lane, pid, dataset = %dataset.key, "a lane attached");
                lane
            }
            Err(reason) => {
                held.ledger.lane_gone(lane, Instant::now());
                drop(held);
                refuse(conn, reason);
                return;
            }
        }
    };
    loop {
        let (ask, fds) = match protocol::recv::<Ask>(conn) {
            Ok(got) => got,
            Err(ProtocolError::Closed) => break,
            Err(e) => {
                tracing::debug!(lane, "a lane's connection failed: {e}");
                break;
            }
        };
        let answered = match answer_lane(keeper, &dataset.key, lane, ask, fds) {
            Ok((answer, fd)) => {
                let fds: Vec<_> = fd.iter().map(AsFd::as_fd).collect();
                protocol::send(conn, &answer, &fds).is_ok()
            }
            Err(reason) => {
                refuse(conn, reason);
                false
            }
        };
        if !answered {
            break;
        }
    }
    keeper.lock().ledger.lane_gone(lane, Instant::now());
    keeper.changed.notify_all();
}

/// The dataset's index descriptor for a new lane (made when the dataset is new).
fn attach(held: &mut Held, dataset: &DatasetKey, lane: Lane) -> Result<OwnedFd, String> {
    let new = held.ledger.attach(dataset, lane)?;
    if new {
        let made = make_index(dataset.len).map_err(|e| format!("cannot make the index: {e}"));
        match made {
            Ok(table) => {
                held.tables.insert(dataset.key.clone(), table);
            }
            Err(e) => {
                held.ledger.drop_dataset(&dataset.key);
                return Err(e);
            }
        }
    }
    let table = (held.tables.get(&dataset.key)).ok_or("the dataset has no index")?;
    table
        .index_fd
        .try_clone()
        .map_err(|e| format!("cannot lend the index: {e}"))
}

fn make_index(len: u64) -> std::io::Result<Dataset> {
    let fd = ladle_os::shm::memfd("ladle-cache-index", index_file_len(len))?;
    let index = IndexView::map(fd.as_fd(), len, true)?;
    index
        .header(IndexHeader::Magic)
        .store(INDEX_MAGIC, Ordering::Relaxed);
    index.header(IndexHeader::Len).store(len, Ordering::Relaxed);
    // From here only this mapping writes it: feeds map it read-only.
    ladle_os::shm::seal_against_writers(fd.as_fd())?;
    Ok(Dataset {
        index,
        index_fd: fd,
        arenas: Vec::new(),
    })
}

type Answered = Result<(Answer, Option<OwnedFd>), String>;

fn answer_lane(
    keeper: &Keeper,
    key: &str,
    lane: Lane,
    ask: Ask,
    mut fds: Vec<OwnedFd>,
) -> Answered {
    let mut held = keeper.lock();
    if !held.ledger.holds(key) {
        return Err(format!("dataset {key} was dropped"));
    }
    let done = Ok((Answer::Done, None));
    match ask {
        Ask::Arena { id } => {
            let bytes = (held.ledger.arena_bytes(key, id)).ok_or(format!("no arena {id}"))?;
            let table = held.tables.get(key).ok_or("no index")?;
            let (fd, _) = (table.arenas.get(id as usize))
                .and_then(Option::as_ref)
                .ok_or(format!("arena {id} ({bytes} bytes) is not held"))?;
            let fd = fd
                .try_clone()
                .map_err(|e| format!("cannot lend arena {id}: {e}"))?;
            Ok((Answer::ArenaFd { id }, Some(fd)))
        }
        Ask::Claim { index } => {
            let deadline = Instant::now() + CLAIM_WAIT;
            loop {
                let table = held.tables.get(key).ok_or("no index")?;
                let published = table
                    .index
                    .word(index)
                    .is_some_and(|w| w.load(Ordering::Acquire) != 0);
                if published {
                    break Ok((claimed(ClaimOutcome::Ready), None));
                }
                match held.ledger.claim(key, index, lane)? {
                    Claim::Fill => break Ok((claimed(ClaimOutcome::Fill), None)),
                    Claim::Skip => break Ok((claimed(ClaimOutcome::Skip), None)),
                    Claim::Wait => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break Ok((claimed(ClaimOutcome::Skip), None));
                        }
                        held = (keeper.changed.wait_timeout(held, left))
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                        if !held.ledger.holds(key) {
                            break Err(format!("dataset {key} was dropped"));
                        }
                    }
                }
            }
        }
        Ask::Release { index } => {
            held.ledger.release(key, index, lane)?;
            drop(held);
            keeper.changed.notify_all();
            done
        }
        Ask::Stale { index, word } => {
            let table = held.tables.get(key).ok_or("no index")?;
            let at = table
                .index
                .word(index)
                .ok_or(format!("no sample {index}"))?;
            if word != 0
                && at
                    .compare_exchange(word, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                held.ledger.stale(key)?;
            }
            done
        }
        Ask::Grant { bytes, at_least } => {
            let answer = match held.ledger.grant(key, lane, (bytes, at_least))? {
                Some((id, bytes)) => Answer::Granted { id, bytes },
                None => Answer::Full,
            };
            sync_full(&held);
            Ok((answer, None))
        }
        Ask::Adopt { id } => {
            let fd = fds
                .pop()
                .ok_or("Adopt came without the arena's descriptor")?;
            if !ladle_os::shm::sealed_against_writers(fd.as_fd()) {
                return Err(format!("arena {id} is not sealed against writers"));
            }
            let bytes = held.ledger.adopt(key, lane, id)?;
            let view =
                ArenaView::map(fd.as_fd(), bytes, false).map_err(|e| format!("arena {id}: {e}"))?;
            let table = held.tables.get_mut(key).ok_or("no index")?;
            if table.arenas.len() <= id as usize {
                table.arenas.resize_with(id as usize + 1, || None);
            }
            table.arenas[id as usize] = Some((fd, view));
            done
        }
        Ask::Publish {
            index,
            arena,
            offset,
        } => {
            let table = held.tables.get(key).ok_or("no index")?;
            let (_, view) = (table.arenas.get(arena as usize))
                .and_then(Option::as_ref)
                .ok_or(format!("arena {arena} is not held"))?;
            let header = view
                .header(offset)
                .ok_or(format!("no complete record at {offset} of arena {arena}"))?;
            if header.index != index {
                return Err(format!(
                    "the record at {offset} of arena {arena} is of sample {}, not {index}",
                    header.index
                ));
            }
            let word = Location { arena, offset }
                .word()
                .ok_or("a location out of range")?;
            let at = table
                .index
                .word(index)
                .ok_or(format!("no sample {index}"))?;
            let had = at.load(Ordering::Acquire) != 0;
            held.ledger
                .publish(key, lane, index, (arena, offset, header.record_len()), had)?;
            if !had {
                let table = held.tables.get(key).ok_or("no index")?;
                if let Some(at) = table.index.word(index) {
                    at.store(word, Ordering::Release);
                }
            }
            drop(held);
            keeper.changed.notify_all();
            done
        }
        other => Err(format!("a lane cannot ask {other:?}")),
    }
}

fn claimed(outcome: ClaimOutcome) -> Answer {
    Answer::Claimed { outcome }
}

/// Every index's `full` word says what the ledger says.
fn sync_full(held: &Held) {
    let full = u64::from(held.ledger.full());
    for table in held.tables.values() {
        table
            .index
            .header(IndexHeader::Full)
            .store(full, Ordering::Release);
    }
}

fn serve_operator(keeper: &Keeper, conn: &UnixStream) {
    if protocol::send(
        conn,
        &Answer::Operator {
            version: KEEPER_VERSION,
        },
        &[],
    )
    .is_err()
    {
        return;
    }
    while let Ok((ask, _)) = protocol::recv::<Ask>(conn) {
        let answer = match ask {
            Ask::List => Answer::Listing(listing(keeper)),
            Ask::Drop { key } => {
                let mut held = keeper.lock();
                let keys = match key {
                    Some(key) if held.ledger.holds(&key) => vec![key],
                    Some(key) => {
                        drop(held);
                        refuse(conn, format!("no dataset {key} in the cache"));
                        continue;
                    }
                    None => held.ledger.keys(),
                };
                for key in keys {
                    tracing::info!(dataset = %key, "dropped on request");
                    drop_dataset(&mut held, &key);
                }
                sync_full(&held);
                drop(held);
                keeper.changed.notify_all();
                Answer::Done
            }
            other => Answer::Refused {
                reason: format!("an operator cannot ask {other:?}"),
            },
        };
        if protocol::send(conn, &answer, &[]).is_err() {
            break;
        }
    }
}

fn listing(keeper: &Keeper) -> Listing {
    let held = keeper.lock();
    Listing {
        pid: std::process::id(),
        budget: held.ledger.budget(),
        used: held.ledger.used(),
        idle_timeout_s: keeper.config.idle_timeout.as_secs_f64(),
        cpu_s: ladle_os::cpu_time(ladle_os::Usage::Myself).as_secs_f64(),
        datasets: held.ledger.views(Instant::now()),
    }
}
