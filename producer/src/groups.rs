//! Consumer groups, as the producer sees them: the ranks of one DDP job.
//!
//! The producer does not split epochs (each rank takes its share of every epoch by itself,
//! `ladle_consumer::plan`); it only makes a group start whole and end loudly:
//!
//! - a rank's `Welcome` waits until the group's ranks on this node (its `local_world_size`,
//!   protocol 15; all `world_size` ranks when the group runs on one node) have said `Hello`
//!   (each rank waits at most its own deadline, then gets `GroupIncomplete` naming the
//!   missing ranks, or on a group over several nodes the ranks that came). Nothing waits for
//!   a rank on another node: each node's feed serves its own ranks, and each rank takes its
//!   share of the global split by itself;
//! - what cannot work is refused at once, naming the likely cause: a rank more than the local
//!   world size, ranks of one node that disagree on the world or local size, and a global
//!   rank seen twice (a launcher's local rank passed as the rank);
//! - once the group runs, a rank that leaves, dies or is detached gives every other rank
//!   `GroupBroken`, and the group's name is free again for the job's next incarnation.
//!
//! This module is the bookkeeping alone, without sockets or waiting: the control server
//! (`server.rs`) calls it under the producer's state lock.

use std::collections::{BTreeMap, HashMap};

/// A rank's ticket while it waits: unique per `Hello` for the producer's lifetime.
pub(crate) type Ticket = u64;

/// The live groups, by name.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    by_name: HashMap<String, Group>,
    next_ticket: Ticket,
}

#[derive(Debug)]
struct Group {
    world_size: u32,
    /// Its ranks on this node: the ones this feed waits for.
    local: u32,
    /// Ranks that said `Hello` and wait for the others.
    waiting: BTreeMap<u32, Ticket>,
    /// Tickets let through when the group became whole, not yet welcomed.
    released: Vec<Ticket>,
    /// The ranks running, by consumer id.
    live: BTreeMap<u32, u64>,
    /// Every rank that said `Hello` since the group last became whole (or was made), even
    /// if it gave up since: a rank missing is one not in here.
    arrived: std::collections::BTreeSet<u32>,
    /// Bumped whenever `waiting` changes, so that waiting ranks can tell the news.
    version: u64,
}

/// What became of a rank that said `Hello`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// The group is whole: this rank and every waiting one may be welcomed.
    Whole(Ticket),
    /// Waiting for the others; the ranks that have said `Hello` so far.
    Waiting(Ticket, Vec<u32>),
}

/// Where a waiting ticket stands.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Still waiting; the ranks joined so far and the group's version of that list.
    Waiting { joined: Vec<u32>, version: u64 },
    /// Let through: to be welcomed.
    Released,
    /// No longer known (the producer never gave it out, or it gave up).
    Unknown,
}

/// What a rank that gave up waiting is told.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Incomplete {
    /// Ranks that never came (only on a group on one node).
    pub(crate) missing: Vec<u32>,
    /// Ranks that came, on this node.
    pub(crate) arrived: Vec<u32>,
    /// The ranks waited for.
    pub(crate) local: u32,
}

/// `[1, 2, 3]` as `1, 2, 3`.
fn list(ranks: &[u32]) -> String {
    let names: Vec<String> = ranks.iter().map(u32::to_string).collect();
    names.join(", ")
}

/// Members of a group that must hear that it broke: `(consumer id, rank that went)`.
pub(crate) type Broken = (Vec<u64>, u32);

impl Groups {
    /// Rank `rank` of `world_size` says `Hello` for group `name`, of which `local` ranks
    /// run on this node. Refused (with the reason for the consumer) when the rank is out of
    /// range, the group has another size, or the rank is already waiting or running, or this
    /// node has all its ranks already.
    pub(crate) fn arrive(
        &mut self,
        name: &str,
        rank: u32,
        world_size: u32,
        local: u32,
    ) -> Result<Arrival, String> {
        if world_size == 0 || rank >= world_size {
            return Err(format!(
                "group {name:?}: rank {rank} is outside 0..{world_size}"
            ));
        }
        if local == 0 || local > world_size {
            return Err(format!(
                "group {name:?}: {local} ranks on this node is outside 1..={world_size} (the \
                 world size)"
            ));
        }
        let group = self
            .by_name
            .entry(name.to_owned())
            .or_insert_with(|| Group {
                world_size,
                local,
                waiting: BTreeMap::new(),
                released: Vec::new(),
                live: BTreeMap::new(),
                arrived: std::collections::BTreeSet::new(),
                version: 0,
            });
        if (group.world_size, group.local) != (world_size, local) {
            let here: Vec<u32> = group
                .waiting
                .keys()
                .chain(group.live.keys())
                .copied()
                .collect();
            return Err(format!(
                "group {name:?}: ranks on this node disagree: rank {rank} says world size \
                 {world_size} with {local} ranks on this node, rank{} {} said world size {} with \
                 {} on this node; start every rank with the same world size and local world \
                 size ($WORLD_SIZE, $LOCAL_WORLD_SIZE)",
                if here.len() == 1 { "" } else { "s" },
                list(&here),
                group.world_size,
                group.local
            ));
        }
        let spans_nodes = local < world_size;
        let hint = if spans_nodes {
            "; two processes on one node gave the same rank: pass the global rank ($RANK), \
             not the node's local rank ($LOCAL_RANK)"
        } else {
            ""
        };
        if let Some(id) = group.live.get(&rank) {
            return Err(format!(
                "group {name:?}: rank {rank} is already running (consumer {id}){hint}"
            ));
        }
        if group.waiting.contains_key(&rank) {
            return Err(format!(
                "group {name:?}: rank {rank} is already waiting for the others{hint}"
            ));
        }
        let here = group.waiting.len() + group.released.len() + group.live.len();
        if here >= local as usize {
            let ranks: Vec<u32> = group
                .waiting
                .keys()
                .chain(group.live.keys())
                .copied()
                .collect();
            return Err(format!(
                "group {name:?}: rank {rank} is one more than the {local} ranks this node \
                 serves (rank{} {} here); set $LOCAL_WORLD_SIZE (or local_world_size=) to the \
                 ranks each node runs",
                if ranks.len() == 1 { "" } else { "s" },
                list(&ranks)
            ));
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        group.waiting.insert(rank, ticket);
        group.arrived.insert(rank);
        group.version += 1;
        let whole = group.waiting.len() + group.live.len() == local as usize;
        if whole {
            // A group starts whole: running ranks of an earlier incarnation were dropped
            // from `live` when it broke, so `live` is empty here.
            group.released.extend(group.waiting.values().copied());
            group.waiting.clear();
            group.arrived.clear();
            Ok(Arrival::Whole(ticket))
        } else {
            Ok(Arrival::Waiting(
                ticket,
                group.waiting.keys().copied().collect(),
            ))
        }
    }

    /// The consumer ids of group `name`'s running ranks.
    pub(crate) fn running_ids(&self, name: &str) -> Vec<u64> {
        self.by_name
            .get(name)
            .map(|g| g.live.values().copied().collect())
            .unwrap_or_default()
    }

    /// Where `ticket` of group `name` stands.
    pub(crate) fn standing(&self, name: &str, ticket: Ticket) -> Standing {
        let Some(group) = self.by_name.get(name) else {
            return Standing::Unknown;
        };
        if group.released.contains(&ticket) {
            Standing::Released
        } else if group.waiting.values().any(|&t| t == ticket) {
            Standing::Waiting {
                joined: group.waiting.keys().copied().collect(),
                version: group.version,
            }
        } else {
            Standing::Unknown
        }
    }

    /// A waiting rank gives up (deadline, or its connection closed). Returns what its
    /// `GroupIncomplete` says: the ranks that never said `Hello` while it waited (one that
    /// came and gave up is not missing), and the ranks that did. On a group over several
    /// nodes no rank is named missing: this feed cannot tell which of the others are this
    /// node's.
    pub(crate) fn give_up(&mut self, name: &str, ticket: Ticket) -> Incomplete {
        let Some(group) = self.by_name.get_mut(name) else {
            return Incomplete::default();
        };
        group.waiting.retain(|_, t| *t != ticket);
        group.version += 1;
        let came = |r: &u32| group.arrived.contains(r) || group.live.contains_key(r);
        let incomplete = Incomplete {
            missing: if group.local == group.world_size {
                (0..group.world_size).filter(|r| !came(r)).collect()
            } else {
                Vec::new()
            },
            arrived: (group.arrived.iter().chain(group.live.keys()))
                .copied()
                .collect::<std::collections::BTreeSet<u32>>()
                .into_iter()
                .collect(),
            local: group.local,
        };
        self.forget_if_empty(name);
        incomplete
    }

    /// A released rank was welcomed as consumer `id`. Returns `false` when the group broke
    /// meanwhile (another released rank could not be welcomed): the consumer must be told.
    #[must_use]
    pub(crate) fn running(&mut self, name: &str, ticket: Ticket, rank: u32, id: u64) -> bool {
        let Some(group) = self.by_name.get_mut(name) else {
            return false;
        };
        let before = group.released.len();
        group.released.retain(|t| *t != ticket);
        if group.released.len() == before {
            return false;
        }
        group.live.insert(rank, id);
        true
    }

    /// A released rank could not be welcomed (its connection failed): the group cannot
    /// run whole. Returns the running ranks to tell.
    pub(crate) fn not_welcomed(&mut self, name: &str, ticket: Ticket, rank: u32) -> Option<Broken> {
        let group = self.by_name.get_mut(name)?;
        group.released.retain(|t| *t != ticket);
        // The released ranks that are still to be welcomed will find the group broken too:
        // make them unknown, so they are refused.
        group.released.clear();
        let ids: Vec<u64> = std::mem::take(&mut group.live).into_values().collect();
        self.forget_if_empty(name);
        Some((ids, rank))
    }

    /// Consumer `id` said `Leave`: it is done (a training job's ranks end one after the
    /// other), so the others are not told; it no longer counts as running.
    pub(crate) fn left(&mut self, id: u64) {
        let found = self.by_name.iter_mut().find_map(|(name, g)| {
            let rank = g
                .live
                .iter()
                .find(|(_, member)| **member == id)
                .map(|(r, _)| *r)?;
            g.live.remove(&rank);
            Some(name.clone())
        });
        if let Some(name) = found {
            self.forget_if_empty(&name);
        }
    }

    /// Consumer `id` went otherwise (died, closed its connection without `Leave`, was
    /// detached). If it ran in a group, the group is broken:
    /// returns the other running ranks to tell, and frees the name.
    pub(crate) fn gone(&mut self, id: u64) -> Option<(String, Broken)> {
        let (name, rank) = self.by_name.iter().find_map(|(name, g)| {
            g.live
                .iter()
                .find(|(_, member)| **member == id)
                .map(|(&rank, _)| (name.clone(), rank))
        })?;
        let group = self.by_name.get_mut(&name)?;
        group.live.remove(&rank);
        group.released.clear();
        let others: Vec<u64> = std::mem::take(&mut group.live).into_values().collect();
        self.forget_if_empty(&name);
        Some((name, (others, rank)))
    }

    fn forget_if_empty(&mut self, name: &str) {
        if self
            .by_name
            .get(name)
            .is_some_and(|g| g.waiting.is_empty() && g.released.is_empty() && g.live.is_empty())
        {
            self.by_name.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_released_whole_and_a_rank_that_goes_breaks_it_for_the_others() {
        let mut g = Groups::default();
        let Ok(Arrival::Waiting(t2, joined)) = g.arrive("job", 2, 3, 3) else {
            panic!("rank 2 waits");
        };
        assert_eq!(joined, [2]);
        let Ok(Arrival::Waiting(t0, joined)) = g.arrive("job", 0, 3, 3) else {
            panic!("rank 0 waits");
        };
        assert_eq!(joined, [0, 2]);
        assert!(matches!(g.standing("job", t2), Standing::Waiting { .. }));
        let Ok(Arrival::Whole(t1)) = g.arrive("job", 1, 3, 3) else {
            panic!("rank 1 completes the group");
        };
        for t in [t0, t1, t2] {
            assert_eq!(g.standing("job", t), Standing::Released);
        }
        assert!(g.running("job", t0, 0, 10));
        assert!(g.running("job", t1, 1, 11));
        assert!(g.running("job", t2, 2, 12));
        // A fourth rank 1 is refused while rank 1 runs.
        assert!(
            g.arrive("job", 1, 3, 3)
                .unwrap_err()
                .contains("already running")
        );
        let (name, (mut others, rank)) = g.gone(11).unwrap();
        others.sort_unstable();
        assert_eq!((name.as_str(), others, rank), ("job", vec![10, 12], 1));
        // A rank that says Leave (done) tells nobody either.
        let mut h = Groups::default();
        let Ok(Arrival::Waiting(a, _)) = h.arrive("j", 0, 2, 2) else {
            panic!()
        };
        let Ok(Arrival::Whole(b)) = h.arrive("j", 1, 2, 2) else {
            panic!()
        };
        assert!(h.running("j", a, 0, 1) && h.running("j", b, 1, 2));
        h.left(2);
        assert!(h.gone(2).is_none());
        assert_eq!(h.gone(1).map(|(_, (others, _))| others), Some(vec![]));
        // The others going later tells nobody, and the name is free for a new incarnation.
        assert!(g.gone(10).is_none());
        assert!(g.gone(12).is_none());
        assert!(matches!(g.arrive("job", 1, 3, 3), Ok(Arrival::Waiting(..))));
    }

    #[test]
    fn wrong_sizes_ranks_and_duplicates_are_refused_with_reasons() {
        let mut g = Groups::default();
        assert!(g.arrive("a", 2, 2, 2).unwrap_err().contains("outside 0..2"));
        assert!(g.arrive("a", 0, 0, 0).is_err());
        assert!(g.arrive("a", 0, 2, 2).is_ok());
        assert!(
            g.arrive("a", 1, 3, 3)
                .unwrap_err()
                .contains("said world size 2")
        );
        assert!(
            g.arrive("a", 0, 2, 2)
                .unwrap_err()
                .contains("already waiting")
        );
        // Groups are apart by name.
        assert!(matches!(g.arrive("b", 0, 1, 1), Ok(Arrival::Whole(_))));
    }

    #[test]
    fn a_rank_that_gives_up_is_named_missing_and_no_longer_counts() {
        let mut g = Groups::default();
        let Ok(Arrival::Waiting(t0, _)) = g.arrive("job", 0, 3, 3) else {
            panic!()
        };
        let Ok(Arrival::Waiting(t1, _)) = g.arrive("job", 1, 3, 3) else {
            panic!()
        };
        assert_eq!(g.give_up("job", t0).missing, [2]);
        assert_eq!(g.standing("job", t0), Standing::Unknown);
        // Rank 2 arriving now does not complete the group: rank 0 left.
        let Ok(Arrival::Waiting(t2, _)) = g.arrive("job", 2, 3, 3) else {
            panic!()
        };
        assert!(matches!(g.standing("job", t1), Standing::Waiting { .. }));
        // Rank 0 came and went: not missing for rank 2 (it is the one that gave up).
        assert_eq!(g.give_up("job", t2).missing, Vec::<u32>::new());
        let Ok(Arrival::Waiting(..)) = g.arrive("job", 2, 3, 3) else {
            panic!()
        };
        assert!(matches!(g.arrive("job", 0, 3, 3), Ok(Arrival::Whole(_))));
    }

    #[test]
    fn a_released_rank_that_cannot_be_welcomed_breaks_the_group() {
        let mut g = Groups::default();
        let Ok(Arrival::Waiting(t0, _)) = g.arrive("job", 0, 3, 3) else {
            panic!()
        };
        let Ok(Arrival::Waiting(t1, _)) = g.arrive("job", 1, 3, 3) else {
            panic!()
        };
        let Ok(Arrival::Whole(t2)) = g.arrive("job", 2, 3, 3) else {
            panic!()
        };
        assert!(g.running("job", t0, 0, 5));
        let (ids, rank) = g.not_welcomed("job", t1, 1).unwrap();
        assert_eq!((ids, rank), (vec![5], 1));
        assert!(g.gone(5).is_none(), "already told");
        // Rank 2, released but welcomed only now, learns that the group broke.
        assert!(!g.running("job", t2, 2, 7));
    }

    #[test]
    fn a_local_group_is_whole_when_its_local_ranks_have_arrived() {
        // Ranks 2 and 3 of 4 on this node; 0 and 1 run on another node's feed.
        let mut g = Groups::default();
        let Ok(Arrival::Waiting(t3, joined)) = g.arrive("job", 3, 4, 2) else {
            panic!("rank 3 waits for the other rank of its node")
        };
        assert_eq!(joined, [3]);
        let Ok(Arrival::Whole(t2)) = g.arrive("job", 2, 4, 2) else {
            panic!("two of two local ranks: whole")
        };
        assert!(g.running("job", t2, 2, 20) && g.running("job", t3, 3, 30));
        // It breaks as a group on one node does.
        let (_, (others, rank)) = g.gone(30).unwrap();
        assert_eq!((others, rank), (vec![20], 3));
    }

    #[test]
    fn ranks_of_one_node_that_disagree_on_the_world_or_local_size_are_refused_at_once_naming_both()
    {
        let mut g = Groups::default();
        assert!(g.arrive("job", 0, 4, 2).is_ok());
        let e = g.arrive("job", 1, 8, 2).unwrap_err();
        assert!(
            e.contains("world size 8") && e.contains("said world size 4"),
            "{e}"
        );
        assert!(e.contains("rank 0 said"), "{e}");
        let e = g.arrive("job", 1, 4, 4).unwrap_err();
        assert!(
            e.contains("with 4 ranks on this node") && e.contains("with 2 on this node"),
            "{e}"
        );
        assert!(
            g.arrive("job", 1, 4, 5)
                .unwrap_err()
                .contains("outside 1..=4")
        );
        assert!(g.arrive("job", 1, 4, 0).is_err());
    }

    #[test]
    fn a_global_rank_seen_twice_on_one_node_is_refused_naming_local_rank_as_the_likely_cause() {
        let mut g = Groups::default();
        assert!(g.arrive("job", 0, 4, 2).is_ok());
        let e = g.arrive("job", 0, 4, 2).unwrap_err();
        assert!(
            e.contains("already waiting") && e.contains("$LOCAL_RANK"),
            "{e}"
        );
        // On one node the hint would be wrong: not given.
        let mut h = Groups::default();
        assert!(h.arrive("job", 0, 2, 2).is_ok());
        assert!(!h.arrive("job", 0, 2, 2).unwrap_err().contains("LOCAL_RANK"));
    }

    #[test]
    fn one_rank_more_than_the_local_world_size_is_refused_at_once() {
        let mut g = Groups::default();
        let Ok(Arrival::Waiting(t0, _)) = g.arrive("job", 0, 4, 2) else {
            panic!()
        };
        let Ok(Arrival::Whole(t1)) = g.arrive("job", 1, 4, 2) else {
            panic!()
        };
        // Released, not yet welcomed: they count.
        let e = g.arrive("job", 2, 4, 2).unwrap_err();
        assert!(
            e.contains("one more than the 2 ranks this node serves"),
            "{e}"
        );
        assert!(e.contains("LOCAL_WORLD_SIZE"), "{e}");
        assert!(g.running("job", t0, 0, 1) && g.running("job", t1, 1, 2));
        assert!(g.arrive("job", 3, 4, 2).unwrap_err().contains("one more"));
    }

    #[test]
    fn a_local_group_that_times_out_says_which_of_its_ranks_came_and_names_none_missing() {
        let mut g = Groups::default();
        let Ok(Arrival::Waiting(t, _)) = g.arrive("job", 5, 8, 4) else {
            panic!()
        };
        let Ok(Arrival::Waiting(_, _)) = g.arrive("job", 6, 8, 4) else {
            panic!()
        };
        let incomplete = g.give_up("job", t);
        assert_eq!(
            incomplete,
            Incomplete {
                missing: vec![],
                arrived: vec![5, 6],
                local: 4
            }
        );
    }
}
