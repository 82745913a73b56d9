//! Recovery: settling every attempt the journal left open when this daemon starts (see
//! the module docs of [`super`] for what each case means).

use std::fs::OpenOptions;
use std::path::Path;
use std::time::Duration;

use crate::job::JobId;
use crate::journal::Record;
use crate::sys;

use super::launch::{Live, read_status};
use super::{Daemon, DaemonError};

impl Daemon {
    /// Settles every attempt the journal left open: adopted, finished, interrupted, or
    /// requeued at the head when it never began.
    pub(super) fn recover(&mut self) -> Result<(), DaemonError> {
        let open: Vec<(JobId, u32, Option<u32>)> = self
            .jobs
            .running()
            .map(|(j, a)| (j.id, a.number, a.pid))
            .collect();
        for (id, attempt, journaled_pid) in open {
            let claim = self.files.claim(id, attempt);
            let pid = match journaled_pid {
                Some(pid) => Some(pid),
                None => {
                    if let Some(parent) = claim.parent() {
                        std::fs::create_dir_all(parent).map_err(|source| DaemonError::Dir {
                            path: parent.to_owned(),
                            source,
                        })?;
                    }
                    match OpenOptions::new().write(true).create_new(true).open(&claim) {
                        Ok(_) => {
                            tracing::warn!(
                                job = id,
                                attempt,
                                "the daemon died before this attempt began; requeued at the head"
                            );
                            let (estimate_mib, exclusive) = self
                                .jobs
                                .jobs
                                .get(&id)
                                .map_or((0, false), |j| (j.estimate.mib, j.exclusive));
                            // A fact once the claim is taken (the attempt can never run):
                            // applied even if the journal fails.
                            self.note(Record::Requeued {
                                id,
                                estimate_mib,
                                basis: None,
                                exclusive,
                                out_of_memory: false,
                            });
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            read_claim(&claim)
                        }
                        Err(source) => {
                            return Err(DaemonError::Dir {
                                path: claim,
                                source,
                            });
                        }
                    }
                }
            };
            let estimate_mib = self.jobs.jobs.get(&id).map_or(0, |j| j.estimate.mib);
            let now = self.now();
            self.live.insert(id, Live::new(estimate_mib, now));
            let marker = format!("ladle-job-{id}.{attempt}");
            let live = pid.filter(|&p| sys::alive(p) && sys::cmdline(p).contains(&marker));
            if let Some(pid) = live {
                tracing::warn!(
                    job = id,
                    attempt,
                    pid,
                    "adopting a job that outlived the previous daemon"
                );
                if journaled_pid.is_none() {
                    self.note_started(id, attempt, pid);
                } else if let Some(l) = self.live.get_mut(&id) {
                    l.process = sys::ProcessId::of(pid);
                }
                let now = self.now();
                if let Some(l) = self.live.get_mut(&id)
                    && let Some(sim) = self.telemetry.simulated()
                    && let Some(gpus) = self
                        .jobs
                        .jobs
                        .get(&id)
                        .and_then(|j| j.attempt())
                        .map(|a| a.gpus.clone())
                {
                    l.seen_at = Some(now);
                    l.peak_mib = Some(l.sim_load.mem_mib);
                    for g in gpus {
                        sim.place(g, id, l.sim_load);
                    }
                }
            } else {
                let code = read_status(&self.files.status(id, attempt));
                self.finish(super::launch::Ended {
                    id,
                    code,
                    signal: None,
                    vanished: code.is_none(),
                    cpu: None,
                });
            }
        }
        Ok(())
    }
}

/// The pid a wrapper wrote into its claim file; `None` if it never finished writing it.
pub(super) fn read_claim(path: &Path) -> Option<u32> {
    for _ in 0..20 {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}
