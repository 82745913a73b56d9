//! The pipeline thread's side of the workers: [`WorkerSource`] and its makers, which send a
//! worker one sample to make, wait for its answer (the sample timeout, the stop grace),
//! kill an overrunning worker, try a dead worker's sample once more, and copy a made sample
//! from the worker's staging buffer into the slot.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ladle_datasets::SampleError;
use ladle_datasets::pipeline::{SampleMaker, WorkItem};
use ladle_ring::ProtocolError;
use ladle_ring::Schema;
use ladle_ring::protocol::{self, DatasetInfo};
use serde::{Deserialize, Serialize};

use super::{ANSWER_TIMEOUT, POLL, STOP_GRACE, Worker, WorkerPool};
use crate::CustomSource;

/// One sample to make.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Request {
    pub(super) index: u64,
    pub(super) epoch: u64,
}

/// A worker's answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Reply {
    #[serde(default)]
    pub(super) ok: bool,
    #[serde(default)]
    pub(super) error: Option<String>,
}

/// `SIGKILL` to a worker, the process the kernel gave for its socket at admission (its pid
/// and start time), if it is still that process; never to this process (a worker that is a
/// thread of it, in tests).
fn kill(worker: Option<ladle_os::process::ProcessId>) {
    if let Some(process) = worker {
        let _ = process.signal(ladle_os::Signal::KILL);
    }
}

/// Samples of the pool's schema made by the workers of a [`WorkerPool`].
#[derive(Debug)]
pub struct WorkerSource {
    info: DatasetInfo,
    pool: Arc<WorkerPool>,
}

impl WorkerSource {
    /// A source of `info.len` samples of the pool's schema, made by `pool`'s workers.
    pub fn new(info: DatasetInfo, pool: Arc<WorkerPool>) -> Self {
        Self { info, pool }
    }
}

impl CustomSource for WorkerSource {
    fn schema(&self) -> &Schema {
        self.pool.schema()
    }

    fn info(&self) -> DatasetInfo {
        self.info.clone()
    }

    fn maker(&self) -> Box<dyn SampleMaker + '_> {
        Box::new(WorkerMaker {
            pool: &self.pool,
            source: &self.info.source,
            worker: None,
        })
    }
}

/// How one request to a worker ended.
enum Outcome {
    /// The sample is in the worker's staging buffer.
    Made,
    /// The user's code failed on it (an exception, a value that does not fit the schema).
    Failed(String),
    /// The worker died or was killed for overrunning: another may try.
    Died(String),
    /// No worker came, or the feed is stopping: nobody tries again.
    GaveUp(String),
}

/// How waiting for a worker's answer ended.
enum Waited {
    Answer(Reply),
    Closed(ProtocolError),
    /// The sample timeout passed, or a begun answer was not finished in [`ANSWER_TIMEOUT`].
    Overran(Duration),
    Stopped,
}

/// One pipeline thread's worker.
struct WorkerMaker<'a> {
    pool: &'a WorkerPool,
    source: &'a str,
    worker: Option<Worker>,
}

impl WorkerMaker<'_> {
    fn error(&self, item: &WorkItem, message: String) -> SampleError {
        SampleError::Source {
            location: format!("index {} of {}", item.index, self.source),
            message,
        }
    }

    /// Waits for `worker`'s answer, looking at the sample timeout and the stop flag every
    /// [`POLL`]: once the feed stops, the worker has [`STOP_GRACE`] to answer.
    fn wait_for_answer(&self, worker: &Worker) -> Waited {
        let limit = self.pool.config.sample_timeout;
        let deadline = limit.map(|limit| Instant::now() + limit);
        let mut stopping_since = None;
        loop {
            let now = Instant::now();
            let wait = match deadline {
                Some(deadline) if now >= deadline => {
                    return Waited::Overran(limit.unwrap_or_default());
                }
                Some(deadline) => POLL.min(deadline - now),
                None => POLL,
            };
            match ladle_os::net::wait_readable(&worker.conn, wait) {
                Ok(false) => {}
                // Readable, closed or failed: the read below says which.
                Ok(true) => break,
                Err(e) => return Waited::Closed(ProtocolError::Io(e)),
            }
            if self.pool.stop.load(Ordering::SeqCst) {
                let since = *stopping_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= STOP_GRACE {
                    return Waited::Stopped;
                }
            }
        }
        match protocol::recv_by::<Reply>(&worker.conn, Instant::now() + ANSWER_TIMEOUT) {
            Ok((reply, _)) => Waited::Answer(reply),
            Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                Waited::Overran(limit.unwrap_or(ANSWER_TIMEOUT))
            }
            Err(e) => Waited::Closed(e),
        }
    }

    /// One try on this thread's worker (or an idle one when it has none).
    fn attempt(&mut self, item: &WorkItem) -> Outcome {
        let worker = match self.worker.take() {
            Some(worker) => worker,
            None => match self.pool.take() {
                Ok(worker) => worker,
                Err(why) => return Outcome::GaveUp(format!("no worker: {why}")),
            },
        };
        let request = Request {
            index: item.index,
            epoch: item.epoch,
        };
        let waited = match protocol::send(&worker.conn, &request, &[]) {
            Ok(()) => self.wait_for_answer(&worker),
            Err(e) => Waited::Closed(e),
        };
        let (pid, process) = (worker.pid, worker.process);
        match waited {
            Waited::Answer(reply) => {
                self.worker = Some(worker);
                match (reply.ok, reply.error) {
                    (true, _) => Outcome::Made,
                    (false, Some(error)) => Outcome::Failed(error),
                    (false, None) => {
                        Outcome::Failed("the worker answered neither ok nor an error".into())
                    }
                }
            }
            Waited::Overran(limit) => {
                self.pool.died.fetch_add(1, Ordering::Relaxed);
                let limit = limit.as_secs_f64();
                tracing::warn!(
                    pid,
                    index = item.index,
                    "worker process {pid} took over {limit} s on sample {} (seq {}, epoch {}): killing it",
                    item.index,
                    item.seq,
                    item.epoch
                );
                kill(process);
                Outcome::Died(format!(
                    "worker process {pid} took over {limit} s on it and was killed"
                ))
            }
            Waited::Stopped => {
                tracing::info!(
                    pid,
                    index = item.index,
                    "the feed stopped while worker process {pid} made sample {}: killing it",
                    item.index
                );
                kill(process);
                Outcome::GaveUp(format!(
                    "the feed stopped before worker process {pid} made it"
                ))
            }
            Waited::Closed(e) => {
                self.pool.died.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    pid,
                    index = item.index,
                    "worker process {pid} died while making sample {} ({e})",
                    item.index
                );
                Outcome::Died(format!("worker process {pid} died on it"))
            }
        }
    }

    /// Copies the sample the worker left in its staging buffer into the slot.
    fn copy_out(&self, fields: &mut [&mut [u8]]) -> Result<(), String> {
        let worker = self
            .worker
            .as_ref()
            .ok_or("no worker after a made sample")?;
        let plan = &self.pool.plan.fields;
        if fields.len() != plan.len() {
            return Err(format!(
                "the slot has {} fields, the staging buffer {}",
                fields.len(),
                plan.len()
            ));
        }
        for (field, &(offset, len)) in fields.iter_mut().zip(plan) {
            if field.len() != len {
                return Err(format!(
                    "a field of {} bytes in the slot, {len} in the staging buffer",
                    field.len()
                ));
            }
            // SAFETY: `offset + len <= plan.len`, the mapping's length (`StagingPlan`), and
            // the mapping lives as long as `worker`; the slot is another file, so the two do
            // not overlap. The bytes are plain `u8`, valid at any value. The worker answered
            // before this copy and writes its buffer again only for its next request; one
            // that broke that rule would garble only the sample it was asked for.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    worker.staging.as_ptr().add(offset as usize),
                    field.as_mut_ptr(),
                    len,
                );
            }
        }
        Ok(())
    }
}

impl SampleMaker for WorkerMaker<'_> {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        let mut deaths = Vec::new();
        while deaths.len() < 2 {
            match self.attempt(item) {
                Outcome::Made => {
                    return self
                        .copy_out(fields)
                        .map_err(|message| self.error(item, message));
                }
                Outcome::Failed(message) => {
                    self.pool.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(self.error(item, message));
                }
                Outcome::GaveUp(message) => return Err(self.error(item, message)),
                Outcome::Died(death) => deaths.push(death),
            }
        }
        Err(self.error(item, format!("{}; not tried again", deaths.join(", then "))))
    }
}
