//! Epochs and batches: the iterator a training loop reads, zero-copy batches that release
//! on drop, and the owned batches of gathered epochs.

use super::*;

/// Samples copied out of the ring: a batch gathered after a rejoin.
#[derive(Debug)]
pub(super) struct Owned {
    /// The sequence number of the first sample copied.
    pub(super) first_seq: u64,
    /// One buffer per schema field, `len × ` its bytes per sample.
    pub(super) fields: Vec<AlignedBytes>,
    pub(super) indices: Vec<u64>,
    pub(super) flags: Vec<u64>,
}

impl Owned {
    pub(super) fn with_capacity(samples: usize, schema: &Schema) -> Self {
        Self {
            first_seq: 0,
            fields: schema
                .fields()
                .iter()
                .map(|f| AlignedBytes::with_capacity(samples * f.bytes()))
                .collect(),
            indices: Vec::with_capacity(samples),
            flags: Vec::with_capacity(samples),
        }
    }

    /// Copies sample `k` of the ring window `(fields, index, flags)` that starts at `seq`.
    pub(super) fn push(
        &mut self,
        seq: u64,
        k: usize,
        fields: &[(&[u8], usize)],
        index: u64,
        flags: u64,
    ) {
        if self.is_empty() {
            self.first_seq = seq;
        }
        for (owned, &(window, bytes)) in self.fields.iter_mut().zip(fields) {
            owned.extend(&window[k * bytes..(k + 1) * bytes]);
        }
        self.indices.push(index);
        self.flags.push(flags);
    }

    pub(super) fn len(&self) -> usize {
        self.indices.len()
    }

    /// Appends `other`'s samples from `from` on, the first of them sequence `first_seq`.
    pub(super) fn append_tail(
        &mut self,
        other: &Owned,
        from: usize,
        first_seq: u64,
        schema: &Schema,
    ) {
        if from >= other.len() {
            return;
        }
        if self.is_empty() {
            self.first_seq = first_seq;
        }
        for ((mine, theirs), field) in self
            .fields
            .iter_mut()
            .zip(&other.fields)
            .zip(schema.fields())
        {
            mine.extend(&theirs.as_bytes()[from * field.bytes()..]);
        }
        self.indices.extend_from_slice(&other.indices[from..]);
        self.flags.extend_from_slice(&other.flags[from..]);
    }

    /// Keeps the first `samples` samples.
    pub(super) fn truncate(&mut self, samples: usize, schema: &Schema) {
        for (owned, field) in self.fields.iter_mut().zip(schema.fields()) {
            owned.truncate(samples * field.bytes());
        }
        self.indices.truncate(samples);
        self.flags.truncate(samples);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// One epoch of a [`Consumer`]: an iterator of its batches, made by [`Consumer::epoch`]
/// (`Epoch<'_>`, borrowing) or [`Consumer::shared_epoch`] ([`SharedEpoch`], owning an
/// `Arc`). `C` is how the epoch and its batches reach the consumer.
///
/// Yields `Err` when the producer is gone (then nothing more), or
/// [`ConsumerError::TooManyBatchesHeld`] when the caller holds too many batches (drop some and
/// call `next` again).
pub struct EpochOf<C> {
    pub(super) consumer: C,
    pub(super) number: u64,
    pub(super) done: bool,
}

/// An epoch whose batches borrow the consumer: [`Consumer::epoch`].
pub type Epoch<'a> = EpochOf<&'a Consumer>;
/// An epoch whose batches each hold an `Arc` of the consumer: [`Consumer::shared_epoch`].
pub type SharedEpoch = EpochOf<Arc<Consumer>>;

impl<C: Deref<Target = Consumer>> EpochOf<C> {
    /// This epoch's number (0 for the first).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Waits at most `timeout` for the epoch's next batch to be published, without taking it:
    /// `Ok(true)` when the next `next()` will not block (the batch is there, or the epoch is
    /// over), `Ok(false)` when the time ran out first. Bindings call it in short slices so
    /// that a waiting training loop still answers Ctrl-C.
    pub fn wait_ready(&self, timeout: Duration) -> Result<bool, ConsumerError> {
        let consumer = &*self.consumer;
        if self.done {
            return Ok(true);
        }
        let span = {
            let mut state = consumer.state();
            match consumer.next_span(&state, self.number) {
                Ok(span) => span,
                Err(e) => return Err(consumer.fail(&mut state, e)),
            }
        };
        match span {
            None => Ok(true),
            Some((next, count)) => {
                consumer.wait_until(next + count, Some(Instant::now() + timeout))
            }
        }
    }
}

impl<C> fmt::Debug for EpochOf<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Epoch")
            .field("number", &self.number)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<C: Deref<Target = Consumer> + Clone> Iterator for EpochOf<C> {
    type Item = Result<BatchOf<C>, ConsumerError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let consumer = &*self.consumer;
        loop {
            let (first, count, generation) = match consumer.reserve(self.number) {
                Ok(Reserve::Done) => {
                    self.done = true;
                    return None;
                }
                Ok(Reserve::Batch {
                    first,
                    count,
                    generation,
                    skims,
                }) => (first, count, (generation, skims)),
                Ok(Reserve::CatchUp) => match consumer.next_catch_up(self.number) {
                    Ok(Some(owned)) => {
                        return Some(Ok(BatchOf {
                            consumer: self.consumer.clone(),
                            first_seq: owned.first_seq,
                            len: owned.len(),
                            epoch: self.number,
                            generation: 0,
                            samples: Samples::Copy(Box::new(owned)),
                        }));
                    }
                    // The catch-up is over; the plain path says what comes next.
                    Ok(None) => continue,
                    Err(e) => {
                        self.done = e.is_final();
                        return Some(Err(e));
                    }
                },
                Err(e) => {
                    self.done = e.is_final();
                    return Some(Err(e));
                }
            };
            if let Err(e) = consumer.wait_for(first + count) {
                consumer.unhold(first);
                self.done = true;
                return Some(Err(e));
            }
            match consumer.deliver(first, count, generation, self.number) {
                Ok(Delivery::Delivered(loan)) => {
                    return Some(Ok(BatchOf {
                        consumer: self.consumer.clone(),
                        first_seq: first,
                        // `count <= batch_size <= capacity / 2`, checked at connect.
                        len: count as usize,
                        epoch: self.number,
                        generation: generation.0,
                        samples: Samples::Ring(loan),
                    }));
                }
                Ok(Delivery::Void) => continue,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl<C: Deref<Target = Consumer> + Clone> FusedIterator for EpochOf<C> {}

/// A batch: `len` consecutive samples of the ring, read in place (zero copy). Each field of
/// the feed's schema is one contiguous `[B, ...shape]` array ([`BatchOf::field`],
/// [`BatchOf::fields`]); an image feed's images are `[B, H, W, 3]` u8 ([`BatchOf::images`])
/// and its labels `[B]` i64; the dataset indices are `[B]` u64. Dropping it releases its
/// samples to the producer. `C` is how it reaches its consumer: see [`Batch`] and
/// [`SharedBatch`].
pub struct BatchOf<C: Deref<Target = Consumer>> {
    consumer: C,
    first_seq: u64,
    len: usize,
    epoch: u64,
    /// The consumer's rejoin count when the batch was handed out.
    generation: u64,
    samples: Samples,
}

/// Where a batch's samples are.
#[derive(Debug)]
enum Samples {
    /// In the ring, read in place through this loan.
    Ring(ReadLoan),
    /// Copied: a batch gathered after a rejoin, or skimmed.
    Copy(Box<Owned>),
}

/// A batch borrowing its consumer, from an [`Epoch`].
pub type Batch<'a> = BatchOf<&'a Consumer>;
/// A batch holding an `Arc` of its consumer, from a [`SharedEpoch`].
pub type SharedBatch = BatchOf<Arc<Consumer>>;

impl<C: Deref<Target = Consumer>> BatchOf<C> {
    /// The bytes of field `k`, `B × ` its bytes per sample.
    fn field_bytes(&self, k: usize) -> &[u8] {
        match &self.samples {
            Samples::Copy(owned) => owned.fields[k].as_bytes(),
            // What a view of the ring promises, and when it stops: `ladle_ring::ReadLoan`.
            Samples::Ring(loan) => self.consumer.ring.field(loan, k),
        }
    }

    /// Every field of the batch, in schema order.
    pub fn fields(&self) -> impl Iterator<Item = FieldView<'_>> {
        let schema = &self.consumer.ring.layout().schema;
        (schema.fields().iter().enumerate()).map(|(k, field)| FieldView {
            field,
            len: self.len,
            bytes: self.field_bytes(k),
        })
    }

    /// Field `name`, untyped (any dtype, `f16`, `bf16` and `bool` included); `None`: the
    /// feed has no such field.
    pub fn field_view(&self, name: &str) -> Option<FieldView<'_>> {
        let (k, field) = self.consumer.ring.layout().schema.field(name)?;
        Some(FieldView {
            field,
            len: self.len,
            bytes: self.field_bytes(k),
        })
    }

    /// Field `name` as a flat `[B × ...shape]` slice of `T`, zero copy; an error when the
    /// feed has no such field or `T` is not its dtype.
    pub fn field<T: Element>(&self, name: &str) -> Result<&[T], FieldError> {
        let schema = &self.consumer.ring.layout().schema;
        let view = self.field_view(name).ok_or_else(|| FieldError::Missing {
            name: name.to_owned(),
            schema: schema.to_string(),
        })?;
        view.as_slice().ok_or_else(|| FieldError::DType {
            name: name.to_owned(),
            dtype: view.dtype(),
            asked: T::DTYPE,
        })
    }

    /// An image feed's images, `[B, H, W, 3]` u8 (HWC), one contiguous slice of the shared
    /// ring; empty for a feed without an `image: u8[H, W, 3]` field.
    pub fn images(&self) -> &[u8] {
        match self.consumer.schema().image_size() {
            Some(_) => self.field::<u8>(ladle_ring::schema::IMAGE).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The labels, `[B]` i64; empty for a feed without a `label: i64` field.
    pub fn labels(&self) -> &[i64] {
        match self.consumer.schema().label_field() {
            Some(k) => cast(self.field_bytes(k)).unwrap_or(&[]),
            None => &[],
        }
    }

    /// The dataset index of each sample, `[B]`.
    pub fn indices(&self) -> &[u64] {
        match &self.samples {
            Samples::Copy(owned) => &owned.indices,
            Samples::Ring(loan) => self.consumer.ring.indices(loan),
        }
    }

    /// Each sample's flags word, `[B]` ([`ladle_ring::FLAG_BAD`]: the producer could not
    /// make it).
    pub fn flags(&self) -> &[u64] {
        match &self.samples {
            Samples::Copy(owned) => &owned.flags,
            Samples::Ring(loan) => self.consumer.ring.flags(loan),
        }
    }

    /// Samples in this batch (the batch size, or fewer for an epoch's last batch).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Samples in this batch that the producer could not read, decode or make: each has
    /// every field zero (an image feed's label is −1) and the bad flag, so the epoch keeps
    /// its length and its coverage. Usually 0; the producer logs each such sample.
    pub fn bad_count(&self) -> usize {
        let bad = |&&f: &&u64| f & ladle_ring::FLAG_BAD != 0;
        self.flags().iter().filter(bad).count()
    }

    /// Whether the batch still holds what it was handed out with. A batch is a view of the
    /// shared ring, and the producer never overwrites it while this consumer paces the feed.
    /// Two things end that, and the batches held then may be overwritten: the consumer held
    /// the feed back for the stall timeout without taking a batch (a paused or stopped run:
    /// the producer lets it go), or it held the others back and now skims (it reads on from
    /// the batch after those it holds, which no longer gate the feed). Check this *after*
    /// reading a batch held across a long pause or kept while later batches were read:
    /// `false` means the data read may be mixed with later samples. Conservative: once let
    /// go or rejoined it says `false` whether or not the slots were written again. Copies
    /// (batches gathered after a rejoin, or skimmed) are always intact.
    pub fn is_intact(&self) -> bool {
        match &self.samples {
            Samples::Copy(_) => true,
            Samples::Ring(loan) => {
                self.generation == self.consumer.state().generation
                    && !self.consumer.cursor.is_let_go()
                    && self.consumer.ring.is_intact(loan)
            }
        }
    }

    /// Whether the batch is a copy (gathered after a rejoin, or skimmed) rather than a view
    /// of the ring.
    pub fn is_copy(&self) -> bool {
        matches!(self.samples, Samples::Copy(_))
    }

    /// Always false: a batch holds at least one sample.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `[B, H, W, 3]`, the shape of [`BatchOf::images`] (`[B, 0, 0, 3]` for a feed without
    /// images).
    pub fn shape(&self) -> [usize; 4] {
        let (h, w) = self.consumer.schema().image_size().unwrap_or((0, 0));
        [self.len, h as usize, w as usize, 3]
    }

    /// The consumer's epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sequence number of the batch's first sample.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// The consumer this batch came from.
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }
}

impl<C: Deref<Target = Consumer>> fmt::Debug for BatchOf<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("epoch", &self.epoch)
            .field("first_seq", &self.first_seq)
            .field("shape", &self.shape())
            .finish()
    }
}

impl<C: Deref<Target = Consumer>> Drop for BatchOf<C> {
    fn drop(&mut self) {
        if let Samples::Ring(_) = self.samples {
            self.consumer.unhold(self.first_seq);
        }
    }
}
