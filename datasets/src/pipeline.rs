//! The multi-threaded decode + augment pipeline.
//!
//! A caller hands [`Pipeline::run`] a stream of [`WorkItem`]s `(seq, index, epoch)` and a
//! [`SampleSink`] that owns the output memory (a ring slot per `seq` in the producer, a plain
//! buffer in benchmarks): one byte slice per field of the sample (an image feed's `image`
//! and `label`). `T` worker threads each keep one [`SampleMaker`] and write every sample
//! straight into the sink's slot for its `seq`: no intermediate copy and, once the buffers
//! have grown, no allocation of ours per sample. The image maker ([`SampleProcessor`]:
//! reader scratch, decoder buffers, transforms) is the native path; [`Pipeline::run_with`]
//! takes any other (the Python producer's, which hands each sample to a worker process).
//! Samples complete out of order; the sink sees each `seq` once, with the outcome.
//!
//! A sample that cannot be read or decoded is handled by the [`BadSamplePolicy`]: skipped and
//! counted with a warning (the default), or the run stops with [`PipelineError::Sample`].

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cache::{DecodedCache, Lookup, Stamp};
use crate::dataset::{Dataset, RecordData};
use crate::decode::{Decoder, RgbImage};
use crate::error::{PipelineError, SampleError};
use crate::limits::SampleLimits;
use crate::transforms::{Transformer, Transforms};

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
    /// What travels with each item from the source to the worker: the producer's write loan
    /// for the item's ring slot; `()` for sinks that need none.
    type Ticket: Send;

    /// Runs `fill` on the output buffers of `item`, one per field of the sample (for an
    /// image feed: [`Transforms::output_len`] bytes of image, then 8 of label). Called once
    /// per item, from any worker thread, possibly concurrently for different items.
    fn write<R>(
        &self,
        ticket: &mut Self::Ticket,
        item: &WorkItem,
        fill: impl FnOnce(&mut [&mut [u8]]) -> R,
    ) -> R;

    /// `item` is finished: `Ok` when its slot holds the sample, or the error that left the
    /// slot unwritten.
    fn complete(&self, ticket: Self::Ticket, item: WorkItem, outcome: Result<(), &SampleError>);
}

/// Makes samples into a sink's buffers; each worker thread has its own.
pub trait SampleMaker {
    /// Writes sample `item.index` (as in `item.epoch`) into `fields`, one byte slice per
    /// field of the feed's schema, in order.
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError>;
}

impl<M: SampleMaker + ?Sized> SampleMaker for Box<M> {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        (**self).make(item, fields)
    }
}

/// The native image maker: reads, decodes and transforms `image` and writes the `label`.
struct ImageMaker<'d> {
    processor: SampleProcessor,
    dataset: &'d dyn Dataset,
}

impl SampleMaker for ImageMaker<'_> {
    fn make(&mut self, item: &WorkItem, fields: &mut [&mut [u8]]) -> Result<(), SampleError> {
        let [image, label, ..] = fields else {
            panic!("an image sink gives an image and a label buffer");
        };
        let value = self
            .processor
            .process(self.dataset, item.index, item.epoch, image)?;
        label.copy_from_slice(&value.to_ne_bytes());
        Ok(())
    }
}

/// Where the pipeline's work comes from: an iterator, or a source that may have to wait
/// (the producer's, for room in the ring).
pub trait WorkSource: Send {
    /// One unit of work.
    type Item: Send;

    /// The next item, or `Ready(None)` at the end. With `wait` false a source that would
    /// block returns `Pending` instead, and the pipeline hands the items it has gathered to
    /// the workers first: so no item waits in a half-filled chunk while the source blocks
    /// (which would hang a producer whose consumers need those items to release the ring).
    /// With `wait` true it blocks.
    fn next(&mut self, wait: bool) -> Poll<Option<Self::Item>>;
}

impl<I: Iterator + Send> WorkSource for I
where
    I::Item: Send,
{
    type Item = I::Item;

    fn next(&mut self, _wait: bool) -> Poll<Option<I::Item>> {
        Poll::Ready(Iterator::next(self))
    }
}

/// A plain in-memory sink of image samples: `slots` buffers reused round-robin by `seq`. For
/// benchmarks, tests and tools that want augmented samples without a ring.
#[derive(Debug)]
pub struct SlotBuffer {
    slots: Vec<Mutex<Slot>>,
}

/// One [`SlotBuffer`] slot: image bytes, label bytes, and whether the last write succeeded.
type Slot = (Vec<u8>, [u8; 8], bool);

impl SlotBuffer {
    /// `slots` buffers of `sample_len` image bytes each.
    pub fn new(slots: usize, sample_len: usize) -> Self {
        Self {
            slots: (0..slots.max(1))
                .map(|_| Mutex::new((vec![0; sample_len], [0; 8], false)))
                .collect(),
        }
    }

    /// A copy of the image and label last written for `seq` (`None` if it failed).
    pub fn get(&self, seq: u64) -> Option<(Vec<u8>, i64)> {
        let slot = self.slot(seq).lock().unwrap_or_else(|p| p.into_inner());
        slot.2.then(|| (slot.0.clone(), i64::from_ne_bytes(slot.1)))
    }

    fn slot(&self, seq: u64) -> &Mutex<Slot> {
        &self.slots[(seq % self.slots.len() as u64) as usize]
    }
}

impl SampleSink for SlotBuffer {
    type Ticket = ();

    fn write<R>(&self, _: &mut (), item: &WorkItem, fill: impl FnOnce(&mut [&mut [u8]]) -> R) -> R {
        let mut slot = self
            .slot(item.seq)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (image, label, done) = &mut *slot;
        *done = false;
        fill(&mut [image.as_mut_slice(), label.as_mut_slice()])
    }

    fn complete(&self, _: (), item: WorkItem, outcome: Result<(), &SampleError>) {
        let mut slot = self
            .slot(item.seq)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        slot.2 = outcome.is_ok();
    }
}

/// Reads, decodes and augments single samples with reused buffers. One per thread.
#[derive(Debug)]
pub struct SampleProcessor {
    scratch: Vec<u8>,
    decoder: Decoder,
    transformer: Transformer,
    seed: u64,
    crop_aware: bool,
    limits: SampleLimits,
    /// Decoded images shared across epochs (and feeds): [`crate::cache`].
    cache: Option<Arc<dyn DecodedCache>>,
}

impl SampleProcessor {
    /// A processor applying `transforms` with randomness from `seed`, under the default
    /// [`SampleLimits`].
    pub fn new(transforms: Transforms, seed: u64) -> Self {
        Self::with_limits(transforms, seed, SampleLimits::default())
    }

    /// A processor refusing files and images above `limits`.
    pub fn with_limits(transforms: Transforms, seed: u64, limits: SampleLimits) -> Self {
        Self {
            scratch: Vec::new(),
            decoder: Decoder::with_limits(&limits),
            transformer: Transformer::new(transforms),
            seed,
            crop_aware: true,
            limits,
            cache: None,
        }
    }

    /// Reads decoded images from `cache` and fills it (see [`crate::cache`]); the samples are
    /// bit-identical with and without it.
    pub fn set_cache(&mut self, cache: Arc<dyn DecodedCache>) {
        self.cache = Some(cache);
    }

    /// Whether a JPEG is decoded only down to the last row its `RandomResizedCrop` reads
    /// (on by default; see [`Decoder::decode_rows`]). The output is bit-identical either
    /// way; off decodes every image whole, the path before crop-aware decoding.
    pub fn set_crop_aware_decode(&mut self, on: bool) {
        self.crop_aware = on;
    }

    /// Bytes held by the reused buffers (the file's, the decoder's, the augmenter's).
    #[cfg(test)]
    fn buffer_bytes(&self) -> usize {
        self.scratch.capacity() + self.decoder.buffer_bytes() + self.transformer.buffer_bytes()
    }

    /// Reads and decodes sample `index` into RGB.
    pub fn decode<'a>(
        &'a mut self,
        dataset: &'a dyn Dataset,
        index: u64,
    ) -> Result<RgbImage<'a>, SampleError> {
        Self::decode_with(
            &mut self.scratch,
            &mut self.decoder,
            dataset,
            index,
            &self.limits,
        )
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
        if let Some(cache) = self.cache.clone()
            && let Some(stamp) = dataset.stamp(index)?
            && self.process_cached(&*cache, stamp, dataset, index, epoch, out)?
        {
            return Ok(label);
        }
        let seed = self.seed;
        let augment_err = |source| SampleError::Augment {
            location: dataset.location(index),
            source,
        };
        let decode_err = |source| SampleError::Decode {
            location: dataset.location(index),
            source,
        };
        match dataset.read(index, &mut self.scratch, &self.limits)? {
            RecordData::Encoded(bytes) if self.crop_aware => {
                let transformer = &self.transformer;
                let rows = self
                    .decoder
                    .decode_rows(bytes, |w, h| {
                        transformer.rows_needed(w, h, seed, epoch, index)
                    })
                    .map_err(decode_err)?;
                self.transformer
                    .apply_rows(rows, seed, epoch, index, out)
                    .map_err(augment_err)?;
            }
            RecordData::Encoded(bytes) => {
                let image = self.decoder.decode(bytes).map_err(decode_err)?;
                self.transformer
                    .apply(image, seed, epoch, index, out)
                    .map_err(augment_err)?;
            }
            RecordData::Planar {
                width,
                height,
                bytes,
            } => {
                let image = self
                    .decoder
                    .from_planar(bytes, width, height)
                    .map_err(decode_err)?;
                self.transformer
                    .apply(image, seed, epoch, index, out)
                    .map_err(augment_err)?;
            }
        }
        Ok(label)
    }

    /// Sample `index` through `cache`: a hit augmented from the cached image, or a miss the
    /// cache takes decoded whole and filled. `Ok(false)`: the cache took no part (it takes
    /// none now, the record is not encoded, or the whole decode failed), the caller decodes
    /// as without a cache.
    fn process_cached(
        &mut self,
        cache: &dyn DecodedCache,
        stamp: Stamp,
        dataset: &dyn Dataset,
        index: u64,
        epoch: u64,
        out: &mut [u8],
    ) -> Result<bool, SampleError> {
        let augment_err = |source| SampleError::Augment {
            location: dataset.location(index),
            source,
        };
        match cache.lookup(index, stamp) {
            Lookup::Skip => Ok(false),
            Lookup::Hit(image) => {
                // This feed's limits, as a decode would apply them.
                self.limits
                    .check_file(|| dataset.location(index), stamp.size)?;
                self.limits
                    .check_pixels(u64::from(image.width), u64::from(image.height))
                    .map_err(|source| SampleError::Decode {
                        location: dataset.location(index),
                        source,
                    })?;
                let pixels = (*image.pixels).as_ref();
                let rgb = RgbImage {
                    width: image.width,
                    height: image.height,
                    pixels,
                };
                self.transformer
                    .apply(rgb, self.seed, epoch, index, out)
                    .map_err(augment_err)?;
                Ok(true)
            }
            Lookup::Fill => {
                let decoded = match dataset.read(index, &mut self.scratch, &self.limits) {
                    Ok(RecordData::Encoded(bytes)) => self.decoder.decode(bytes).ok(),
                    Ok(RecordData::Planar { .. }) => None,
                    Err(e) => {
                        cache.release(index);
                        return Err(e);
                    }
                };
                let Some(image) = decoded else {
                    // Not cached; a file only crop-aware decoding reads decodes as before.
                    cache.release(index);
                    return Ok(false);
                };
                cache.fill(index, stamp, &image);
                self.transformer
                    .apply(image, self.seed, epoch, index, out)
                    .map_err(augment_err)?;
                Ok(true)
            }
        }
    }

    /// [`Self::decode`] over split borrows, so that the augmenter stays usable.
    fn decode_with<'a>(
        scratch: &'a mut Vec<u8>,
        decoder: &'a mut Decoder,
        dataset: &'a dyn Dataset,
        index: u64,
        limits: &SampleLimits,
    ) -> Result<RgbImage<'a>, SampleError> {
        let decode_err = |source| SampleError::Decode {
            location: dataset.location(index),
            source,
        };
        match dataset.read(index, scratch, limits)? {
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
    /// The transform pipeline (default: [`Transforms::train`] at 224,
    /// `RandomResizedCrop(224), RandomHorizontalFlip()`).
    pub augment: Transforms,
    /// Seed of the augmentation's randomness.
    pub seed: u64,
    /// What to do with bad samples.
    pub policy: BadSamplePolicy,
    /// What one sample may cost: its file's bytes and its pixels (default:
    /// [`SampleLimits::default`]); a sample above either is a bad sample.
    pub limits: SampleLimits,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            threads: default_threads(),
            augment: Transforms::train(224),
            seed: 0,
            policy: BadSamplePolicy::Skip,
            limits: SampleLimits::default(),
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
        Ok(Pipeline {
            config: self,
            cache: None,
        })
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
    /// Decoded images shared across epochs and feeds: [`crate::cache`].
    cache: Option<Arc<dyn DecodedCache>>,
}

impl Pipeline {
    /// Its image samples read decoded images from `cache` and fill it ([`crate::cache`]).
    pub fn set_cache(&mut self, cache: Arc<dyn DecodedCache>) {
        self.cache = Some(cache);
    }

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// Processes every item on the worker threads, writing into `sink`; returns when all are
    /// done, or at the first bad sample under [`BadSamplePolicy::Fail`].
    pub fn run<S: SampleSink<Ticket = ()>>(
        &self,
        dataset: &dyn Dataset,
        items: impl IntoIterator<Item = WorkItem, IntoIter: Send>,
        sink: &S,
    ) -> Result<RunStats, PipelineError> {
        self.run_from(dataset, items.into_iter().map(|item| (item, ())), sink)
    }

    /// [`Pipeline::run`] over a [`WorkSource`] whose items carry the sink's tickets (the
    /// producer's write loans).
    pub fn run_from<S: SampleSink>(
        &self,
        dataset: &dyn Dataset,
        items: impl WorkSource<Item = (WorkItem, S::Ticket)>,
        sink: &S,
    ) -> Result<RunStats, PipelineError> {
        let (augment, seed, limits) = (&self.config.augment, self.config.seed, self.config.limits);
        let make = || {
            let mut processor = SampleProcessor::with_limits(augment.clone(), seed, limits);
            if let Some(cache) = &self.cache {
                processor.set_cache(cache.clone());
            }
            ImageMaker { processor, dataset }
        };
        self.run_with(make, items, sink)
    }

    /// Runs the items on the worker threads with a maker of their own each (from `make`), not
    /// the image pipeline: the threads, the chunked hand-off, the retries of transient
    /// errors and the bad-sample policy are the same.
    pub fn run_with<S: SampleSink, M: SampleMaker>(
        &self,
        make: impl Fn() -> M + Sync,
        items: impl WorkSource<Item = (WorkItem, S::Ticket)>,
        sink: &S,
    ) -> Result<RunStats, PipelineError> {
        let written = AtomicU64::new(0);
        let skipped = AtomicU64::new(0);
        let failure = Mutex::new(None);
        let policy = self.config.policy;
        for_each_parallel(
            items,
            self.config.threads,
            make,
            |maker, (item, mut ticket): (WorkItem, S::Ticket)| {
                let outcome = sink.write(&mut ticket, &item, |fields| {
                    with_retries(&item, || maker.make(&item, fields))
                });
                sink.complete(ticket, item, outcome.as_ref().map(|_| ()));
                match outcome {
                    Ok(()) => {
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

/// How long a transient read error ([`SampleError::is_transient`]: no file descriptors or
/// memory for a moment) is retried before the sample counts as bad.
pub const TRANSIENT_RETRY_FOR: Duration = Duration::from_secs(30);

/// Runs `attempt` until it succeeds, fails for good, or has failed transiently for
/// [`TRANSIENT_RETRY_FOR`], backing off from 5 ms to 1 s between tries.
fn with_retries<T>(
    item: &WorkItem,
    mut attempt: impl FnMut() -> Result<T, SampleError>,
) -> Result<T, SampleError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match attempt() {
            Err(error) if error.is_transient() && start.elapsed() < TRANSIENT_RETRY_FOR => {
                if pause == Duration::from_millis(5) {
                    tracing::warn!(
                        index = item.index,
                        "retrying after a transient error: {error}"
                    );
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            outcome => return outcome,
        }
    }
}

/// Items handed to a worker at a time: amortises channel costs over several samples.
const CHUNK: usize = 8;

/// Runs `work` over `items` on `threads` threads, each with its own state from `make_state`.
/// The calling thread feeds a bounded queue in chunks, handing over a partial chunk whenever
/// the source would block; any worker returning `Break` stops the run.
pub(crate) fn for_each_parallel<I, St, F>(
    mut items: I,
    threads: usize,
    make_state: impl Fn() -> St + Sync,
    work: F,
) -> Result<(), PipelineError>
where
    I: WorkSource,
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
        while !stop.load(Ordering::Relaxed) {
            let send = match items.next(chunk.is_empty()) {
                Poll::Ready(Some(item)) => {
                    chunk.push(item);
                    chunk.len() == CHUNK
                }
                Poll::Ready(None) => break,
                // Hand what is gathered to the workers before the source blocks.
                Poll::Pending => !chunk.is_empty(),
            };
            if send {
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

#[cfg(test)]
mod tests;
