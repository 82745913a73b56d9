//! The admission engine: each round, which queued jobs start where ([`Admission::admit`]),
//! with the state it keeps between rounds (a blocked head, how often backfill passed it).

use std::collections::BTreeSet;

use super::{GpuOrdering, GpuState, Pending, Placement, Policy};
use crate::estimate::Basis;

/// The head of the queue while it is blocked: how often backfill passed it, and since when
/// it waits.
#[derive(Debug, Clone, PartialEq)]
struct Head {
    id: u64,
    passed: u32,
    since: f64,
    /// The GPUs it waits for, chosen when it was first blocked and kept until it starts:
    /// chosen afresh each round, they would move, and backfill would fill them all.
    held: BTreeSet<usize>,
}

/// What backfill must respect while the head is blocked: the GPUs it waits for, and the
/// room it needs on each (estimate plus margin; `None` for a head that must run alone).
#[derive(Debug, Clone, PartialEq)]
struct Hold {
    gpus: BTreeSet<usize>,
    need_mib: Option<u64>,
}

/// The admission engine: a policy and the little state it keeps between rounds (how often
/// and since when the current head has been passed by backfill).
#[derive(Debug, Clone)]
pub struct Admission {
    policy: Policy,
    head: Option<Head>,
}

impl Admission {
    /// An engine for `policy`.
    pub fn new(policy: Policy) -> Self {
        Self { policy, head: None }
    }

    /// Its policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decides which jobs of `queue` (head first) start now, and updates `gpus` as if they
    /// had started (jobs, reservations, settle locks, feeds, exclusivity).
    pub fn admit(&mut self, now: f64, queue: &[Pending], gpus: &mut [GpuState]) -> Vec<Placement> {
        let mut placed = Vec::new();
        // Wide jobs now: each starts where the screens let it, before anyone else.
        // A wide job that jumps a blocked head counts as backfill past it, so the head's
        // bounds (`max_bypass`, `max_bypass_s`) hold against wide jobs too.
        if self.policy.wide_first {
            for job in queue.iter().filter(|job| job.gpus >= 2) {
                let jumps = self
                    .head
                    .as_ref()
                    .filter(|h| h.id != job.id && queue.iter().any(|q| q.id == h.id));
                if jumps.is_some_and(|h| !self.may_pass(now, h)) {
                    continue;
                }
                if let Some(placement) = self.place(now, job, gpus, None) {
                    self.apply(now, job, &placement, gpus);
                    placed.push(placement);
                    if let Some(head) = self.head.as_mut().filter(|h| h.id != job.id) {
                        head.passed += 1;
                    }
                }
            }
        }
        let mut offered: Vec<&Pending> = queue
            .iter()
            .filter(|job| placed.iter().all(|p: &Placement| p.job != job.id))
            .collect();
        if let Some(light) = self.policy.light_first_mib {
            // Stable: a head blocked in an earlier round keeps its place (light jobs pass
            // it as backfill, within its bounds), then light jobs, then the rest, each
            // group in queue order.
            let head = self
                .head
                .as_ref()
                .filter(|h| !self.may_pass(now, h))
                .map(|h| h.id);
            offered.sort_by_key(|job| (Some(job.id) != head, job.estimate_mib > light));
        }
        let mut blocked: Option<Hold> = None;
        for job in offered {
            if blocked.is_some() {
                let Some(head) = &self.head else { break };
                if !self.may_pass(now, head) {
                    break;
                }
            }
            let avoid = blocked.as_ref();
            match self.place(now, job, gpus, avoid) {
                Some(placement) => {
                    self.apply(now, job, &placement, gpus);
                    // Past the head: as backfill, or a light job ahead of an earlier
                    // round's head that is still queued.
                    let jumped = |h: &Head| {
                        blocked.is_some()
                            || (h.id != job.id
                                && self
                                    .policy
                                    .light_first_mib
                                    .is_some_and(|l| job.estimate_mib <= l)
                                && queue.iter().any(|q| q.id == h.id))
                    };
                    if let Some(head) = self.head.as_mut().filter(|h| jumped(h)) {
                        head.passed += 1;
                    }
                    placed.push(placement);
                }
                None if blocked.is_none() => {
                    let held = match &self.head {
                        Some(h) if h.id == job.id && self.policy.sticky_hold => h.held.clone(),
                        _ => self.held_for(now, job, gpus),
                    };
                    if self.head.as_ref().is_none_or(|h| h.id != job.id) {
                        self.head = Some(Head {
                            id: job.id,
                            passed: 0,
                            since: now,
                            held: held.clone(),
                        });
                    }
                    blocked = Some(Hold {
                        gpus: held,
                        need_mib: (!self.runs_alone(job))
                            .then(|| job.estimate_mib.saturating_add(self.policy.margin_mib)),
                    });
                }
                None => {}
            }
        }
        if blocked.is_none() {
            self.head = None;
        }
        placed
    }

    /// Whether a job may still start past the blocked `head`: backfill is on and the
    /// head's bounds are not used up.
    fn may_pass(&self, now: f64, head: &Head) -> bool {
        self.policy.backfill
            && head.passed < self.policy.max_bypass
            && now - head.since < self.policy.max_bypass_s
    }

    /// Free memory admission believes GPU `g` has, MiB: what telemetry shows free, and with
    /// reservations at most what other users and the scheduler's reservations leave.
    fn free_mib(&self, g: &GpuState) -> u64 {
        let observed = g.total_mib.saturating_sub(g.used_mib);
        if self.policy.reservations {
            observed.min(
                g.total_mib
                    .saturating_sub(g.foreign_mib)
                    .saturating_sub(g.reserved_mib),
            )
        } else {
            observed
        }
    }

    /// Whether GPU `g` is idle: no job of the scheduler and no process of anyone else.
    fn idle(g: &GpuState) -> bool {
        g.jobs == 0 && g.foreign_processes == 0
    }

    /// Whether `job` must run alone (on idle GPUs): always under `exclusive`, for an
    /// out-of-memory retry, and under measure-then-pack for a job on a guess.
    fn runs_alone(&self, job: &Pending) -> bool {
        self.policy.exclusive
            || job.exclusive
            || (self.policy.measure_then_pack && job.basis == Basis::Guess)
    }

    /// The GPUs a blocked head is waiting for, which backfill must leave alone.
    fn held_for(&self, now: f64, job: &Pending, gpus: &[GpuState]) -> BTreeSet<usize> {
        let mut order: Vec<usize> = (0..gpus.len())
            .filter(|&i| !gpus[i].unusable && job.may_use(i))
            .collect();
        if self.runs_alone(job) {
            order.sort_by_key(|&i| {
                let g = &gpus[i];
                (!Self::idle(g), g.jobs, std::cmp::Reverse(self.free_mib(g)))
            });
        } else {
            // The GPUs it is closest to getting: those whose screens it passes now (it
            // waits for its other GPUs, or for a settle lock), then the least utilised
            // (compute frees up as jobs end), then the most free memory.
            order.sort_by(|&a, &b| {
                let (ga, gb) = (&gpus[a], &gpus[b]);
                self.screens_pass(now, job, gb)
                    .cmp(&self.screens_pass(now, job, ga))
                    .then(ga.risk.sm_activity.total_cmp(&gb.risk.sm_activity))
                    .then(self.free_mib(gb).cmp(&self.free_mib(ga)))
            });
        }
        order.into_iter().take(job.gpus as usize).collect()
    }

    fn place(
        &self,
        now: f64,
        job: &Pending,
        gpus: &[GpuState],
        avoid: Option<&Hold>,
    ) -> Option<Placement> {
        let want = job.gpus.max(1) as usize;
        let open = |i: usize| {
            let g = &gpus[i];
            job.may_use(i)
                && !g.unusable
                && !g.exclusive_job
                && g.unmeasured_jobs == 0
                && g.jobs < self.policy.max_clients
                && avoid.is_none_or(|hold| {
                    !hold.gpus.contains(&i) || self.leaves_room_for_head(job, g, hold)
                })
        };
        // The idle-GPU path screens memory too: a job goes to an idle GPU only if its
        // estimate (at most all of the GPU but the reserve) fits what the GPU shows free.
        let mut idle: Vec<usize> = (0..gpus.len())
            .filter(|&i| open(i) && Self::idle(&gpus[i]) && self.fits_idle(job, &gpus[i]))
            .collect();
        self.rank(job, gpus, &mut idle);
        let alone = self.runs_alone(job);
        let mut chosen: Vec<usize> = Vec::new();
        // Feed affinity comes before the idle-GPU rule: a consumer joins its feed's GPUs
        // when they pass the screens, even if another GPU is idle.
        if let (true, false, Some(feed)) = (self.policy.feed_affinity, alone, &job.feed) {
            let mut mates: Vec<usize> = (0..gpus.len())
                .filter(|&i| {
                    open(i)
                        && !Self::idle(&gpus[i])
                        && gpus[i].feeds.iter().any(|f| f == feed)
                        && self.screens_pass(now, job, &gpus[i])
                })
                .collect();
            self.rank(job, gpus, &mut mates);
            chosen.extend(mates.into_iter().take(want));
        }
        let missing = want - chosen.len();
        chosen.extend(
            idle.into_iter()
                .filter(|i| !chosen.contains(i))
                .take(missing)
                .collect::<Vec<_>>(),
        );
        if chosen.len() < want && !alone {
            let mut shared: Vec<usize> = (0..gpus.len())
                .filter(|&i| {
                    open(i) && !Self::idle(&gpus[i]) && self.screens_pass(now, job, &gpus[i])
                })
                .collect();
            self.rank(job, gpus, &mut shared);
            shared.retain(|i| !chosen.contains(i));
            chosen.extend(shared.into_iter().take(want - chosen.len()));
        }
        if chosen.len() < want {
            return None;
        }
        chosen.sort_unstable();
        let exclusive = self.policy.exclusive || (job.exclusive && !self.policy.measure_then_pack);
        // A job alone on its GPUs may use all of them: that is how a guess or an
        // out-of-memory retry shows its true peak. Nothing is capped from a guess.
        let capped = self.policy.mps_limits && !alone && job.basis.may_cap();
        let mem_limit_mib = capped.then(|| {
            chosen
                .iter()
                .map(|&i| self.room_mib(job, &gpus[i]))
                .min()
                .unwrap_or(job.estimate_mib)
        });
        Some(Placement {
            job: job.id,
            gpus: chosen,
            exclusive,
            until_measured: alone && !exclusive,
            mem_limit_mib,
        })
    }

    /// Whether backfilling `job` onto GPU `g`, held for a blocked head, costs the head
    /// nothing it could wait for: the GPU is idle (its SM time is going unused while the head
    /// waits for its other GPUs, or for memory elsewhere), and after `job` (estimate plus
    /// margin) it still has room for the head (estimate plus margin). Never for a head that
    /// must run alone: it needs the GPU idle.
    fn leaves_room_for_head(&self, job: &Pending, g: &GpuState, hold: &Hold) -> bool {
        let Some(need_mib) = hold.need_mib else {
            return false;
        };
        self.policy.backfill_idle_held
            && Self::idle(g)
            && self.free_mib(g).saturating_sub(self.policy.reserve_mib)
                >= job
                    .estimate_mib
                    .saturating_add(self.policy.margin_mib)
                    .saturating_add(need_mib)
    }

    /// The MPS limit of `job` on GPU `g`, MiB: the room the GPU has for it without touching
    /// what telemetry shows used, other users' memory or the other jobs' reservations,
    /// less the reserve (at least the estimate, at most the GPU).
    fn room_mib(&self, job: &Pending, g: &GpuState) -> u64 {
        self.free_mib(g)
            .saturating_sub(self.policy.reserve_mib)
            .max(job.estimate_mib)
            .min(g.total_mib)
    }

    /// The idle-GPU memory screen: the estimate, at most the GPU less the reserve, fits
    /// what the GPU shows free.
    fn fits_idle(&self, job: &Pending, g: &GpuState) -> bool {
        let needed = job
            .estimate_mib
            .min(g.total_mib.saturating_sub(self.policy.reserve_mib));
        self.free_mib(g) >= needed
    }

    fn screens_pass(&self, now: f64, job: &Pending, g: &GpuState) -> bool {
        if now < g.locked_until || !g.window_full {
            return false;
        }
        // Saturating: an estimate near u64::MAX must fail the screen, not wrap past it.
        let needed = job.estimate_mib.saturating_add(self.policy.margin_mib);
        if self.free_mib(g).saturating_sub(self.policy.reserve_mib) < needed {
            return false;
        }
        self.policy
            .compute
            .is_none_or(|screen| screen.passes(&g.risk))
    }

    /// Orders candidate GPUs: feed affinity first (when on), then the policy's ordering,
    /// then index.
    fn rank(&self, job: &Pending, gpus: &[GpuState], candidates: &mut [usize]) {
        let affinity = |i: usize| match (&job.feed, self.policy.feed_affinity) {
            (Some(feed), true) => !gpus[i].feeds.iter().any(|f| f == feed),
            _ => false,
        };
        let key = |i: usize| -> f64 {
            let g = &gpus[i];
            let free = self.free_mib(g) as f64;
            match self.policy.ordering {
                GpuOrdering::MostFreeMemory => -free,
                GpuOrdering::LeastUtilized => g.risk.sm_activity,
                GpuOrdering::FirstFit => 0.0,
                GpuOrdering::BestFit => free,
            }
        };
        candidates.sort_by(|&a, &b| {
            affinity(a)
                .cmp(&affinity(b))
                .then(key(a).total_cmp(&key(b)))
                .then(a.cmp(&b))
        });
    }

    pub(super) fn apply(
        &self,
        now: f64,
        job: &Pending,
        placement: &Placement,
        gpus: &mut [GpuState],
    ) {
        for &i in &placement.gpus {
            let g = &mut gpus[i];
            g.jobs += 1;
            g.reserved_mib = g.reserved_mib.saturating_add(job.estimate_mib);
            g.exclusive_job |= placement.exclusive;
            g.unmeasured_jobs += u32::from(placement.until_measured);
            g.locked_until = g.locked_until.max(now + self.policy.settle_s);
            if let Some(feed) = &job.feed {
                g.feeds.push(feed.clone());
            }
        }
    }
}
