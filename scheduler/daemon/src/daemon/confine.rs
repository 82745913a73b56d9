//! A job's own GPUs: the submitter's `CUDA_VISIBLE_DEVICES` (or Slurm allocation) confines
//! the job to those of the scheduler's GPUs, and one that names a GPU outside them is
//! refused with both sets named.
//!
//! What the job's environment names is read by the same rules as the scheduler's own
//! ([`crate::allocation::given_gpus`]): `CUDA_VISIBLE_DEVICES` UUIDs, else Slurm's GPU
//! variables, else a numeric `CUDA_VISIBLE_DEVICES` in CUDA's order (with the job's
//! `CUDA_DEVICE_ORDER`). Only the environment the job gets counts: with `--export NONE`
//! nothing confines it. A Slurm job whose GPUs nothing names confines nothing (the
//! scheduler's own set already came from somewhere).

use std::collections::BTreeSet;

use crate::allocation::{AllocationError, given_gpus};
use crate::job::{JobId, JobSpec};
use crate::journal::Record;

use super::Daemon;
use super::state::Stage;

impl Daemon {
    /// The positions of the scheduler's GPUs that `spec`'s environment confines it to;
    /// `None`: all of them.
    ///
    /// # Errors
    /// The refusal, naming the job's GPUs and the scheduler's.
    pub(super) fn confinement(&self, spec: &JobSpec) -> Result<Option<BTreeSet<usize>>, String> {
        let get = |name: &str| {
            (spec.env.iter().rev())
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let (selectors, from) = match given_gpus(get) {
            Ok(Some(given)) => given,
            Ok(None) | Err(AllocationError::NoSlurmGpus { .. }) => return Ok(None),
            Err(e) => return Err(format!("the job's environment: {e}")),
        };
        let uuids = (self.telemetry.machine_uuids(&selectors))
            .map_err(|e| format!("the job's {from}: {e}"))?;
        let mut only = BTreeSet::new();
        let mut outside = Vec::new();
        for uuid in &uuids {
            match self.gpus.iter().position(|g| &g.uuid == uuid) {
                Some(at) => {
                    only.insert(at);
                }
                None => outside.push(uuid.as_str()),
            }
        }
        if !outside.is_empty() {
            let ours: Vec<String> = (self.gpus.iter())
                .map(|g| format!("GPU {} ({})", g.index, g.uuid))
                .collect();
            let why = self.gpus_from.as_deref().map_or_else(
                || "every GPU of this machine".to_owned(),
                |f| format!("given by {f}"),
            );
            return Err(format!(
                "the job's {from} names {}, which this scheduler does not schedule: it has {} \
                 ({why}). Submit from a shell given those GPUs, or with `--export NONE`",
                outside.join(", "),
                ours.join(", ")
            ));
        }
        if spec.gpus as usize > only.len() {
            return Err(format!(
                "the job asks for {} GPUs; its {from} gives it {}",
                spec.gpus,
                only.len()
            ));
        }
        Ok((only.len() < self.gpus.len()).then_some(only))
    }

    /// Confinements of the queued jobs, computed once per job: at submission, or here for
    /// jobs recovered from the journal. A recovered job whose environment no longer fits
    /// this scheduler's GPUs (it restarted with others) is cancelled, saying why.
    pub(super) fn confine_queued(&mut self) {
        let queued: BTreeSet<JobId> = self.jobs.queue.iter().copied().collect();
        self.confined.retain(|id, _| queued.contains(id));
        for id in queued {
            if self.confined.contains_key(&id) {
                continue;
            }
            let Some(job) = self.jobs.jobs.get(&id) else {
                continue;
            };
            if !matches!(job.stage, Stage::Queued) {
                continue;
            }
            match self.confinement(&job.spec) {
                Ok(only) => {
                    self.confined.insert(id, only);
                }
                Err(why) => {
                    tracing::warn!(job = id, "cancelled: {why}");
                    if let Err(e) = self.commit(Record::Cancelled { id }) {
                        tracing::error!(job = id, "could not cancel: {e}");
                        self.confined.insert(id, Some(BTreeSet::new()));
                    }
                }
            }
        }
    }
}
