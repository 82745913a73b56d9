//! The multi-threaded decode + augment pipeline.
//!
//! A caller hands [`Pipeline::run`] a stream of [`WorkItem`]s `(seq, index, epoch)` and a
//! [`SampleSink`] that owns the output memory (a ring slot per `seq` in the producer, a plain
//! buffer in benchmarks). `T` worker threads each keep one [`SampleProcessor`] (reader scratch,
//! decoder buffers, resizer) and write every sample straight into the sink's slot for its
//! `seq`: no intermediate copy and, once the buffers have grown, no allocation of ours per
//! sample. Samples complete out of order; the sink sees each `seq` once, with its label or
//! the error.
//!
//! A sample that cannot be read or decoded is handled by the [`BadSamplePolicy`]: skipped and
//! counted with a warning (the default), or the run stops with [`PipelineError::Sample`].

use std::ops::ControlFlow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

use crate::augment::{Augment, Augmenter};
use crate::dataset::{Dataset, RecordData};
use crate::decode::{Decoder, RgbImage};
use crate::error::{PipelineError, SampleError};

/// What to do with a sample that cannot be read or decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BadSamplePolicy {
    /// Log a warning naming the file, count it, go on.
    #[default]
    Skip,
    /// Stop the run with the error.
    Fail,
}

/// One unit of work: write dataset sample `index`, augmented as in `epoch`, into `seq`'s slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkItem {
    /// The output sequence number (the ring's global sample number).
    pub seq: u64,
    /// The dataset index.
    pub index: u64,
    /// The epoch, which seeds the augmentation together with the index.
    pub epoch: u64,
}

/// Where the pipeline writes: one output buffer per `seq`.
pub trait SampleSink: Sync {
    /// Runs `fill` on the output buffer of `seq` ([`Augment::output_len`] bytes). Called once
    /// per `seq`, from any worker thread, possibly concurrently for different `seq`s.
    fn write<R>(&self, seq: u64, fill: impl FnOnce(&mut [u8]) -> R) -> R;

    /// `item` is finished: `Ok(label)` when its slot holds the sample, or the error that
    /// left the slot unwritten.
    fn complete(&self, item: WorkItem, outcome: Result<i64, &SampleError>);
}

/// A plain in-memory sink: `slots` buffers reused round-robin by `seq`. For benchmarks, tests
/// and tools that want augmented samples without a ring.
#[derive(Debug)]
pub struct SlotBuffer {
    slots: Vec<Mutex<(Vec<u8>, Option<i64>)>>,
}

impl SlotBuffer {
    /// `slots` buffers of `sample_len` bytes each.
    pub fn new(slots: usize, sample_len: usize) -> Self {
        Self {
            slots: (0..slots.max(1))
                .map(|_| Mutex::new((vec![0; sample_len], None)))
                .collect(),
        }
    }

    /// A copy of the sample and label last written for `seq` (`None` if it failed).
    pub fn get(&self, seq: u64) -> Option<(Vec<u8>, i64)> {
        let slot = self.slot(seq).lock().unwrap_or_else(|p| p.into_inner());
        slot.1.map(|label| (slot.0.clone(), label))
    }

    fn slot(&self, seq: u64) -> &Mutex<(Vec<u8>, Option<i64>)> {
        &self.slots[(seq % self.slots.len() as u64) as usize]
    }
}

impl SampleSink for SlotBuffer {
    fn write<R>(&self, seq: u64, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut slot = self.slot(seq).lock().unwrap_or_else(|p| p.into_inner());
        slot.1 = None;
        fill(&mut slot.0)
    }

    fn complete(&self, item: WorkItem, outcome: Result<i64, &SampleError>) {
        let mut slot = self
            .slot(item.seq)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        slot.1 = outcome.ok();
    }
}

/// Reads, decodes and augments single samples with reused buffers. One per thread.
#[derive(Debug)]
pub struct SampleProcessor {
    scratch: Vec<u8>,
    decoder: Decoder,
    augmenter: Augmenter,
    seed: u64,
}

impl SampleProcessor {
    /// A processor applying `augment` with randomness from `seed`.
    pub fn new(augment: Augment, seed: u64) -> Self {
        Self {
            scratch: Vec::new(),
            decoder: Decoder::new(),
            augmenter: Augmenter::new(augment),
            seed,
        }
    }

    /// Reads and decodes sample `index` into RGB.
    pub fn decode<'a>(
        &'a mut self,
        dataset: &'a dyn Dataset,
        index: u64,
    ) -> Result<RgbImage<'a>, SampleError> {
        Self::decode_with(&mut self.scratch, &mut self.decoder, dataset, index)
    }

    /// Reads, decodes and augments sample `index` (as in `epoch`) into `out`; returns its label.
    pub fn process(
        &mut self,
        dataset: &dyn Dataset,
        index: u64,
        epoch: u64,
        out: &mut [u8],
    ) -> Result<i64, SampleError> {
        let label = dataset.label(index)?;
        let seed = self.seed;
        let image = Self::decode_with(&mut self.scratch, &mut self.decoder, dataset, index)?;
        self.augmenter
            .apply(image, seed, epoch, index, out)
            .map_err(|source| SampleError::Augment {
                location: dataset.location(index),
                source,
            })?;
        Ok(label)
    }

    /// [`Self::decode`] over split borrows, so that the augmenter stays usable.
    fn decode_with<'a>(
        scratch: &'a mut Vec<u8>,
        decoder: &'a mut Decoder,
        dataset: &'a dyn Dataset,
        index: u64,
    ) -> Result<RgbImage<'a>, SampleError> {
        let decode_err = |source| SampleError::Decode {
            location: dataset.location(index),
            source,
        };
        match dataset.read(index, scratch)? {
            RecordData::Encoded(bytes) => decoder.decode(bytes).map_err(decode_err),
            RecordData::Planar {
                width,
                height,
                bytes,
            } => decoder
                .from_planar(bytes, width, height)
                .map_err(decode_err),
        }
    }
}

/// Configuration of a [`Pipeline`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineConfig {
    /// Worker threads (default: the machine's cores).
    pub threads: usize,
    /// The augmentation (default: training augmentation at 224).
    pub augment: Augment,
    /// Seed of the augmentation's randomness.
    pub seed: u64,
    /// What to do with bad samples.
    pub policy: BadSamplePolicy,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            threads: default_threads(),
            augment: Augment::train(224),
            seed: 0,
            policy: BadSamplePolicy::Skip,
        }
    }
}

/// The number of cores available to this process.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl PipelineConfig {
    /// Validates the configuration and returns the pipeline.
    pub fn build(self) -> Result<Pipeline, PipelineError> {
        if self.threads == 0 || self.threads > 1024 {
            return Err(PipelineError::InvalidOption(format!(
                "threads must be 1..=1024, not {}",
                self.threads
            )));
        }
        if !(1..=4096).contains(&self.augment.size()) {
            return Err(PipelineError::InvalidOption(format!(
                "image size must be 1..=4096, not {}",
                self.augment.size()
            )));
        }
        if let Augment::Train {
            scale,
            ratio,
            flip_p,
            ..
        } = self.augment
        {
            let ok = scale.0 > 0.0
                && scale.0 <= scale.1
                && scale.1 <= 1.0
                && ratio.0 > 0.0
                && ratio.0 <= ratio.1
                && (0.0..=1.0).contains(&flip_p);
            if !ok {
                return Err(PipelineError::InvalidOption(format!(
                    "need 0 < scale.0 <= scale.1 <= 1, 0 < ratio.0 <= ratio.1, 0 <= flip_p <= 1; \
                     got scale {scale:?}, ratio {ratio:?}, flip_p {flip_p}"
                )));
            }
        }
        Ok(Pipeline { config: self })
    }
}

/// Counts from one [`Pipeline::run`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RunStats {
    /// Samples written to the sink.
    pub written: u64,
    /// Samples skipped as bad.
    pub skipped: u64,
}

/// A validated decode + augment pipeline; see the module docs.
#[derive(Debug, Clone)]
pub struct Pipeline {
    config: PipelineConfig,
}

impl Pipeline {
    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// Processes every item on the worker threads, writing into `sink`; returns when all are
    /// done, or at the first bad sample under [`BadSamplePolicy::Fail`].
    pub fn run<S: SampleSink>(
        &self,
        dataset: &dyn Dataset,
        items: impl IntoIterator<Item = WorkItem> + Send,
        sink: &S,
    ) -> Result<RunStats, PipelineError> {
        let written = AtomicU64::new(0);
        let skipped = AtomicU64::new(0);
        let failure = Mutex::new(None);
        let (augment, seed, policy) = (self.config.augment, self.config.seed, self.config.policy);
        for_each_parallel(
            items,
            self.config.threads,
            || SampleProcessor::new(augment, seed),
            |processor, item: WorkItem| {
                let outcome = sink.write(item.seq, |out| {
                    processor.process(dataset, item.index, item.epoch, out)
                });
                sink.complete(item, outcome.as_ref().copied());
                match outcome {
                    Ok(_) => {
                        written.fetch_add(1, Ordering::Relaxed);
                        ControlFlow::Continue(())
                    }
                    Err(error) if policy == BadSamplePolicy::Skip => {
                        tracing::warn!(index = item.index, "skipping bad sample: {error}");
                        skipped.fetch_add(1, Ordering::Relaxed);
                        ControlFlow::Continue(())
                    }
                    Err(error) => {
                        let mut first = failure.lock().unwrap_or_else(|p| p.into_inner());
                        first.get_or_insert(PipelineError::Sample {
                            index: item.index,
                            source: error,
                        });
                        ControlFlow::Break(())
                    }
                }
            },
        )?;
        if let Some(error) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(error);
        }
        Ok(RunStats {
            written: written.into_inner(),
            skipped: skipped.into_inner(),
        })
    }
}

/// Items handed to a worker at a time: amortises channel costs over several samples.
const CHUNK: usize = 8;

/// Runs `work` over `items` on `threads` threads, each with its own state from `make_state`.
/// The calling thread feeds a bounded queue; any worker returning `Break` stops the run.
pub(crate) fn for_each_parallel<I, St, F>(
    items: I,
    threads: usize,
    make_state: impl Fn() -> St + Sync,
    work: F,
) -> Result<(), PipelineError>
where
    I: IntoIterator + Send,
    I::Item: Send,
    F: Fn(&mut St, I::Item) -> ControlFlow<()> + Sync,
{
    let stop = AtomicBool::new(false);
    let (tx, rx) = crossbeam_channel::bounded::<Vec<I::Item>>(threads.max(1) * 2);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let rx = rx.clone();
                let (stop, work, make_state) = (&stop, &work, &make_state);
                scope.spawn(move || {
                    let mut state = make_state();
                    for chunk in rx {
                        for item in chunk {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            if work(&mut state, item).is_break() {
                                stop.store(true, Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        drop(rx);
        let mut chunk = Vec::with_capacity(CHUNK);
        for item in items {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            chunk.push(item);
            if chunk.len() == CHUNK {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                if tx.send(full).is_err() {
                    break; // every worker has stopped
                }
            }
        }
        if !chunk.is_empty() {
            let _ = tx.send(chunk);
        }
        drop(tx);
        let mut panicked = None;
        for worker in workers {
            if let Err(panic) = worker.join() {
                panicked = Some(crate::decode::panic_message(&panic));
            }
        }
        panicked.map_or(Ok(()), |m| Err(PipelineError::WorkerPanicked(m)))
    })
}
