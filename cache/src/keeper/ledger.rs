//! The keeper's books, apart from its memory and sockets: which datasets it holds, the
//! arenas granted against the budget, who claimed which miss, and when a dataset went idle.
//! Every decision the keeper makes is made here, and tested here without a process.
//!
//! The budget's rule is CoorDL's: what is in stays; a grant that does not fit is refused and
//! nothing is evicted to admit it. Bytes counted: each index, each arena granted to a lane
//! still connected, and of an arena whose lane went only what it published (rounded to
//! pages: the rest was never touched, so it never took memory).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::layout::{ALIGN, MAX_ARENAS, index_file_len, page_up};
use crate::wire::{DatasetKey, DatasetView};

/// A lane: one connection of a feed.
pub(crate) type Lane = u64;

/// What a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This lane fills it.
    Fill,
    /// Another lane is filling it.
    Wait,
    /// The budget is spent.
    Skip,
}

#[derive(Debug)]
struct ArenaBook {
    bytes: u64,
    /// The lane that fills it, while it is connected.
    owner: Option<Lane>,
    /// Its memfd arrived.
    adopted: bool,
    /// The end of its last published record.
    published_end: u64,
}

impl ArenaBook {
    fn charge(&self) -> u64 {
        if self.owner.is_some() {
            self.bytes
        } else {
            page_up(self.published_end)
        }
    }
}

#[derive(Debug)]
struct DatasetBook {
    root: String,
    len: u64,
    arenas: Vec<ArenaBook>,
    claims: HashMap<u64, Lane>,
    lanes: BTreeSet<Lane>,
    idle_since: Option<Instant>,
    entries: u64,
    fills: u64,
    duplicates: u64,
    stale: u64,
}

impl DatasetBook {
    fn charge(&self) -> u64 {
        index_file_len(self.len) + self.arenas.iter().map(ArenaBook::charge).sum::<u64>()
    }
}

/// The books (see the module docs).
#[derive(Debug)]
pub(crate) struct Ledger {
    budget: u64,
    datasets: BTreeMap<String, DatasetBook>,
    /// A grant was refused and no room returned since.
    full: bool,
}

impl Ledger {
    pub(crate) fn new(budget: u64) -> Self {
        Self {
            budget,
            datasets: BTreeMap::new(),
            full: false,
        }
    }

    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// The arena size lanes are told to ask for: it grows with the budget (a 1 TiB cache is
    /// 256 memfds, not 16 384), from 64 MiB up to 4 GiB.
    pub(crate) fn arena_unit(&self) -> u64 {
        (self.budget / 256 / crate::layout::PAGE * crate::layout::PAGE).clamp(64 << 20, 4 << 30)
    }

    /// Bytes counted against the budget.
    pub(crate) fn used(&self) -> u64 {
        self.datasets.values().map(DatasetBook::charge).sum()
    }

    pub(crate) fn full(&self) -> bool {
        self.full
    }

    pub(crate) fn holds(&self, key: &str) -> bool {
        self.datasets.contains_key(key)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.datasets.is_empty()
    }

    /// Lane `lane` serves `dataset`. `Ok(true)` when the dataset is new here (its index is
    /// to be made). An index that does not fit the budget is refused.
    pub(crate) fn attach(&mut self, dataset: &DatasetKey, lane: Lane) -> Result<bool, String> {
        if let Some(book) = self.datasets.get_mut(&dataset.key) {
            if book.len != dataset.len {
                return Err(format!(
                    "dataset {}: {} samples asked, {} held under its key",
                    dataset.key, dataset.len, book.len
                ));
            }
            book.lanes.insert(lane);
            book.idle_since = None;
            return Ok(false);
        }
        let index = index_file_len(dataset.len);
        if self.used().saturating_add(index) > self.budget {
            self.full = true;
            return Err(format!(
                "dataset {}: its index ({index} bytes) does not fit the cache's budget ({} of {} bytes used)",
                dataset.key,
                self.used(),
                self.budget
            ));
        }
        self.datasets.insert(
            dataset.key.clone(),
            DatasetBook {
                root: dataset.root.clone(),
                len: dataset.len,
                arenas: Vec::new(),
                claims: HashMap::new(),
                lanes: BTreeSet::from([lane]),
                idle_since: None,
                entries: 0,
                fills: 0,
                duplicates: 0,
                stale: 0,
            },
        );
        Ok(true)
    }

    fn book(&mut self, key: &str) -> Result<&mut DatasetBook, String> {
        self.datasets
            .get_mut(key)
            .ok_or_else(|| format!("dataset {key} was dropped"))
    }

    /// A miss of `index` (no entry): may `lane` fill it?
    pub(crate) fn claim(&mut self, key: &str, index: u64, lane: Lane) -> Result<Claim, String> {
        let full = self.full;
        let book = self.book(key)?;
        if index >= book.len {
            return Err(format!("sample {index} of {} claimed", book.len));
        }
        if full {
            return Ok(Claim::Skip);
        }
        // Claimed already, by any lane: a feed's threads share its lanes, so the lane that
        // claimed may be asking again for another epoch's visit of the same sample.
        if book.claims.contains_key(&index) {
            return Ok(Claim::Wait);
        }
        book.claims.insert(index, lane);
        Ok(Claim::Fill)
    }

    /// `lane` will not fill `index` after all.
    pub(crate) fn release(&mut self, key: &str, index: u64, lane: Lane) -> Result<(), String> {
        let book = self.book(key)?;
        if book.claims.get(&index) == Some(&lane) {
            book.claims.remove(&index);
        }
        Ok(())
    }

    /// Room for an arena of `bytes` for `lane`, or of what the budget has left if that is at
    /// least `at_least`: its id and size, or `None` when not even `at_least` fits (then
    /// `full` until room returns).
    pub(crate) fn grant(
        &mut self,
        key: &str,
        lane: Lane,
        (bytes, at_least): (u64, u64),
    ) -> Result<Option<(u32, u64)>, String> {
        let page = crate::layout::PAGE;
        if at_least == 0 || at_least > bytes || bytes % page != 0 || at_least % page != 0 {
            return Err(format!(
                "an arena of {bytes} bytes, at least {at_least}, asked (whole pages only)"
            ));
        }
        let left = self.budget.saturating_sub(self.used()) / page * page;
        // At most a quarter of what is left (but one record): as the budget runs out, arenas
        // shrink, so that the tails of the last ones, which only their own feed can fill,
        // waste little of it.
        let bytes = bytes.min((left / 4 / page * page).max(at_least)).min(left);
        let book = self.book(key)?;
        if !book.lanes.contains(&lane) {
            return Err(format!("lane {lane} does not serve dataset {key}"));
        }
        if bytes < at_least || book.arenas.len() >= MAX_ARENAS as usize {
            // Full only once no live arena of any dataset has room for such a record
            // either: until then, lanes that have room fill what this one cannot.
            let room_elsewhere = (self.datasets.values())
                .flat_map(|b| &b.arenas)
                .any(|a| a.owner.is_some() && a.bytes.saturating_sub(a.published_end) >= at_least);
            if !room_elsewhere {
                self.full = true;
            }
            return Ok(None);
        }
        book.arenas.push(ArenaBook {
            bytes,
            owner: Some(lane),
            adopted: false,
            published_end: 0,
        });
        Ok(Some(((book.arenas.len() - 1) as u32, bytes)))
    }

    /// The memfd of arena `id` came from `lane`: its size, to check the file against.
    pub(crate) fn adopt(&mut self, key: &str, lane: Lane, id: u32) -> Result<u64, String> {
        let book = self.book(key)?;
        let arena = (book.arenas.get_mut(id as usize))
            .ok_or_else(|| format!("arena {id} was never granted"))?;
        if arena.owner != Some(lane) || arena.adopted {
            return Err(format!("arena {id} is not this lane's to hand over"));
        }
        arena.adopted = true;
        Ok(arena.bytes)
    }

    /// The size of arena `id`, once adopted (what may be lent).
    pub(crate) fn arena_bytes(&self, key: &str, id: u32) -> Option<u64> {
        let arena = self.datasets.get(key)?.arenas.get(id as usize)?;
        arena.adopted.then_some(arena.bytes)
    }

    /// `lane` says the record of `index` (`record_len` bytes, as its header says) at
    /// `offset` of arena `arena` is complete. Checked: the arena is this lane's and the
    /// record lies in it. `had_entry`: the index has an entry already (two lanes filled it;
    /// the first stays).
    pub(crate) fn publish(
        &mut self,
        key: &str,
        lane: Lane,
        index: u64,
        (arena, offset, record_len): (u32, u64, u64),
        had_entry: bool,
    ) -> Result<(), String> {
        let book = self.book(key)?;
        if index >= book.len {
            return Err(format!("sample {index} of {} published", book.len));
        }
        let Some(a) = book.arenas.get_mut(arena as usize) else {
            return Err(format!("arena {arena} was never granted"));
        };
        if a.owner != Some(lane) || !a.adopted {
            return Err(format!("arena {arena} is not this lane's"));
        }
        let end = offset.checked_add(record_len);
        if offset % ALIGN != 0 || end.is_none_or(|end| end > a.bytes) {
            return Err(format!(
                "a record of {record_len} bytes at {offset} does not lie in arena {arena} ({} bytes)",
                a.bytes
            ));
        }
        a.published_end = a.published_end.max(end.unwrap_or(0));
        book.claims.remove(&index);
        if had_entry {
            book.duplicates += 1;
        } else {
            book.fills += 1;
            book.entries += 1;
        }
        Ok(())
    }

    /// The entry of `index` was emptied (its file changed).
    pub(crate) fn stale(&mut self, key: &str) -> Result<(), String> {
        let book = self.book(key)?;
        book.stale += 1;
        book.entries = book.entries.saturating_sub(1);
        Ok(())
    }

    /// `lane` went: its claims are let go, its arenas keep what they published, the rest of
    /// them returns to the budget (and `full` clears when anything did).
    pub(crate) fn lane_gone(&mut self, lane: Lane, now: Instant) {
        let before = self.used();
        for book in self.datasets.values_mut() {
            if !book.lanes.remove(&lane) {
                continue;
            }
            book.claims.retain(|_, l| *l != lane);
            for arena in &mut book.arenas {
                if arena.owner == Some(lane) {
                    arena.owner = None;
                }
            }
            if book.lanes.is_empty() {
                book.idle_since = Some(now);
            }
        }
        if self.used() < before {
            self.full = false;
        }
    }

    /// The datasets no lane has used for `timeout`.
    pub(crate) fn expired(&self, now: Instant, timeout: Duration) -> Vec<String> {
        (self.datasets.iter())
            .filter(|(_, b)| {
                b.idle_since
                    .is_some_and(|t| now.duration_since(t) >= timeout)
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Forgets dataset `key` (its memory returns once its readers let go).
    pub(crate) fn drop_dataset(&mut self, key: &str) -> bool {
        let dropped = self.datasets.remove(key).is_some();
        if dropped {
            self.full = false;
        }
        dropped
    }

    /// The keys held.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.datasets.keys().cloned().collect()
    }

    /// What `ladle cache ls` shows of each dataset.
    pub(crate) fn views(&self, now: Instant) -> Vec<DatasetView> {
        (self.datasets.iter())
            .map(|(key, b)| DatasetView {
                key: key.clone(),
                root: b.root.clone(),
                len: b.len,
                entries: b.entries,
                bytes: b.charge(),
                fills: b.fills,
                duplicates: b.duplicates,
                stale: b.stale,
                lanes: b.lanes.len() as u64,
                idle_s: b
                    .idle_since
                    .map_or(0.0, |t| now.duration_since(t).as_secs_f64()),
                full: self.full,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
