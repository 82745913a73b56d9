//! The pinned ring and asynchronous copies of batches to the device.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtrMut};

use super::driver::{self, HostRegistration};
use super::{Converter, CudaError};
use crate::convert::{Layout, Normalize};
use crate::{BatchOf, Consumer, RingLayout};

// Copies are made on one thread and polled or dropped on another (a prefetching loop).
const _: fn() = || {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<PinnedRing>();
    send_and_sync::<DeviceBatch>();
    send_and_sync::<InFlight<Arc<Consumer>>>();
};

/// One consumer's ring mapping registered with CUDA (`cuMemHostRegister`, read-only and
/// portable): the images region and the labels region, both halves of each double mapping,
/// so that any batch, wrapped or not, is one contiguous range of pinned memory that the copy
/// engine reads at the interconnect's full speed without a staging copy.
///
/// Registration is per process: every consumer process pins its own mapping. Cloning is cheap
/// (one registration, shared); the last clone, and the last [`InFlight`] copy, unregister.
#[derive(Clone)]
pub struct PinnedRing {
    inner: Arc<Pinned>,
}

/// Field order is drop order: the registrations go before the consumer that owns the
/// mappings.
struct Pinned {
    images: HostRegistration,
    labels: HostRegistration,
    ctx: Arc<CudaContext>,
    converter: OnceLock<Converter>,
    consumer: Arc<Consumer>,
}

impl fmt::Debug for PinnedRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedRing")
            .field("consumer_id", &self.inner.consumer.consumer_id())
            .field("device", &self.inner.ctx.ordinal())
            .field("images", &self.inner.images)
            .field("labels", &self.inner.labels)
            .finish_non_exhaustive()
    }
}

impl PinnedRing {
    /// Registers `consumer`'s images and labels mappings in `ctx` (usable from every context
    /// of the process: the registration is portable).
    ///
    /// Fails with [`CudaError::Registration`] when the driver refuses (`ulimit -l` too low for
    /// the ring, or no read-only registration on this platform). A mapping another library
    /// already registered in this process (PyTorch's `cudaHostRegister`, say) is used as it
    /// is and left to that library to unregister.
    pub fn new(consumer: &Arc<Consumer>, ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        let (Some((images_at, images_len)), Some((labels_at, labels_len))) =
            (consumer.images_region(), consumer.labels_region())
        else {
            return Err(CudaError::NotAnImageFeed {
                schema: consumer.schema().to_string(),
            });
        };
        // SAFETY: both are mappings of `consumer`'s ring, which lives (and stays mapped, never
        // remapped) as long as `Pinned::consumer`, dropped after both registrations.
        let images = unsafe { HostRegistration::new(ctx, "images", images_at, images_len) }?;
        // SAFETY: as above.
        let labels = unsafe { HostRegistration::new(ctx, "labels", labels_at, labels_len) }?;
        Ok(Self {
            inner: Arc::new(Pinned {
                images,
                labels,
                ctx: Arc::clone(ctx),
                converter: OnceLock::new(),
                consumer: Arc::clone(consumer),
            }),
        })
    }

    /// The consumer whose ring is pinned.
    pub fn consumer(&self) -> &Arc<Consumer> {
        &self.inner.consumer
    }

    /// The context the ring was registered in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// A device buffer for one batch of this consumer (its configured batch size), to pass to
    /// [`PinnedRing::copy`] and reuse batch after batch.
    pub fn alloc_batch(&self, stream: &Arc<CudaStream>) -> Result<DeviceBatch, CudaError> {
        let capacity = self.inner.consumer.config().batch_size as usize;
        DeviceBatch::alloc(stream, self.inner.consumer.layout(), capacity)
    }

    /// Enqueues the copy of `batch` (its images and labels) into `dst` on `stream` with
    /// `cuMemcpyHtoDAsync` and records an event after it; returns before the copy runs.
    ///
    /// The returned [`InFlight`] owns the host batch, so its ring slots stay held until the
    /// copy has completed, not merely until this call returns. Kernels enqueued later on
    /// `stream` see the copied data (use [`InFlight::device`]); poll [`InFlight::is_done`] to
    /// let the host batch go as soon as possible, or [`InFlight::wait`].
    ///
    /// Fails with [`CudaError::ForeignBatch`] for a batch of another consumer and
    /// [`CudaError::BufferTooSmall`] when `dst` cannot hold the batch (both before any copy).
    pub fn copy<C>(
        &self,
        batch: BatchOf<C>,
        dst: DeviceBatch,
        stream: &Arc<CudaStream>,
    ) -> Result<InFlight<C>, CudaError>
    where
        C: Deref<Target = Consumer>,
    {
        let pinned = &self.inner;
        if !std::ptr::eq(batch.consumer(), &*pinned.consumer) {
            return Err(CudaError::ForeignBatch {
                batch: batch.consumer().consumer_id(),
                pinned: pinned.consumer.consumer_id(),
            });
        }
        let images_len = batch.images().len();
        if dst.sample_bytes != image_bytes(pinned.consumer.layout()) {
            return Err(CudaError::BufferTooSmall {
                what: "batch images (u8), allocated for another image size (bytes per sample)",
                needed: image_bytes(pinned.consumer.layout()),
                capacity: dst.sample_bytes,
            });
        }
        if images_len > dst.images.len() {
            return Err(CudaError::BufferTooSmall {
                what: "batch images (u8)",
                needed: images_len,
                capacity: dst.images.len(),
            });
        }
        if batch.len() > dst.labels.len() {
            return Err(CudaError::BufferTooSmall {
                what: "batch labels (i64)",
                needed: batch.len(),
                capacity: dst.labels.len(),
            });
        }
        let (images, labels) = (batch.images(), batch.labels());
        // A batch gathered after a rejoin is a copy in ordinary memory: the driver stages it.
        if !batch.is_copy() && !pinned.images.contains(images.as_ptr(), images.len())
            || !pinned
                .labels
                .contains(labels.as_ptr().cast(), size_of_val(labels))
        {
            // Still correct (the driver stages pageable memory), only slower.
            tracing::error!(
                "broken invariant: a batch of the pinned consumer lies outside its registered \
                 mapping"
            );
        }
        let mut flight = InFlight {
            device: Some(dst),
            batch: None,
            event: None,
            stream: Arc::clone(stream),
            _pinned: Arc::clone(&self.inner),
        };
        let (len, first_seq, epoch, shape) =
            (batch.len(), batch.first_seq(), batch.epoch(), batch.shape());
        // Held by the flight from before the first enqueue: if an enqueue fails, dropping
        // `flight` synchronizes the stream before it lets the batch go.
        let batch = flight.batch.insert(batch);
        let Some(device) = flight.device.as_mut() else {
            unreachable!("set above")
        };
        {
            let (dst_images, _guard) = device.images.device_ptr_mut(stream);
            // SAFETY: `dst_images` holds at least `images.len()` bytes (checked above) and
            // lives in `flight` until the copy completes; the ring slots behind `images` stay
            // held (so unwritten by the producer) and mapped until `flight` has seen the event
            // recorded below complete.
            unsafe { driver::memcpy_htod_async(dst_images, batch.images(), stream) }
                .map_err(CudaError::driver("cuMemcpyHtoDAsync of a batch's images"))?;
        }
        {
            let (dst_labels, _guard) = device.labels.device_ptr_mut(stream);
            // SAFETY: as for the images; `dst_labels` holds at least `batch.len()` i64.
            unsafe { driver::memcpy_htod_async(dst_labels, batch.labels(), stream) }
                .map_err(CudaError::driver("cuMemcpyHtoDAsync of a batch's labels"))?;
        }
        device.len = len;
        device.first_seq = first_seq;
        device.epoch = epoch;
        device.height = shape[1];
        device.width = shape[2];
        flight.event = Some(
            stream
                .record_event(None)
                .map_err(CudaError::driver("cuEventRecord after a batch's copy"))?,
        );
        Ok(flight)
    }

    /// The conversion kernel loaded in this ring's context, compiled at the first call
    /// ([`CudaError::NoNvrtc`] without NVRTC).
    pub fn converter(&self) -> Result<&Converter, CudaError> {
        if let Some(converter) = self.inner.converter.get() {
            return Ok(converter);
        }
        let converter = Converter::new(&self.inner.ctx)?;
        Ok(self.inner.converter.get_or_init(|| converter))
    }

    /// Enqueues the conversion of `batch`'s images to normalised f32 in `out` (at least
    /// `B·H·W·3` elements, in `layout` order) on `stream`: see [`Converter::launch`].
    pub fn convert(
        &self,
        batch: &DeviceBatch,
        stream: &CudaStream,
        normalize: &Normalize,
        layout: Layout,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let images = batch.images();
        self.converter()?
            .launch(stream, &images, batch.shape(), normalize, layout, out)
    }
}

/// A batch's images and labels in device memory, reused from batch to batch: allocate once
/// ([`PinnedRing::alloc_batch`] or [`DeviceBatch::alloc`]), pass to [`PinnedRing::copy`], get
/// it back from [`InFlight::wait`].
pub struct DeviceBatch {
    images: CudaSlice<u8>,
    labels: CudaSlice<i64>,
    sample_bytes: usize,
    len: usize,
    height: usize,
    width: usize,
    first_seq: u64,
    epoch: u64,
}

impl fmt::Debug for DeviceBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBatch")
            .field("shape", &self.shape())
            .field("capacity", &self.capacity())
            .field("first_seq", &self.first_seq)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl DeviceBatch {
    /// Zeroed device memory for up to `capacity` samples of `layout` (images and labels),
    /// allocated on `stream`.
    pub fn alloc(
        stream: &Arc<CudaStream>,
        layout: &RingLayout,
        capacity: usize,
    ) -> Result<Self, CudaError> {
        let (height, width) = layout
            .image_size()
            .ok_or_else(|| CudaError::NotAnImageFeed {
                schema: layout.schema.to_string(),
            })?;
        let sample_bytes = image_bytes(layout);
        let bytes = capacity
            .checked_mul(sample_bytes)
            .ok_or(CudaError::BufferTooSmall {
                what: "batch images (u8): capacity overflows",
                needed: usize::MAX,
                capacity,
            })?;
        let images = stream.alloc_zeros::<u8>(bytes).map_err(CudaError::driver(
            "allocating device memory for batch images",
        ))?;
        let labels = stream
            .alloc_zeros::<i64>(capacity)
            .map_err(CudaError::driver(
                "allocating device memory for batch labels",
            ))?;
        Ok(Self {
            images,
            labels,
            sample_bytes,
            len: 0,
            height: height as usize,
            width: width as usize,
            first_seq: 0,
            epoch: 0,
        })
    }

    /// The images of the last batch copied in, `[B, H, W, 3]` u8 on the device.
    pub fn images(&self) -> CudaView<'_, u8> {
        self.images.slice(..self.len * self.sample_bytes)
    }

    /// The labels of the last batch copied in, `[B]` i64 on the device.
    pub fn labels(&self) -> CudaView<'_, i64> {
        self.labels.slice(..self.len)
    }

    /// `[B, H, W, 3]` of the last batch copied in (`B` = 0 before the first).
    pub fn shape(&self) -> [usize; 4] {
        [self.len, self.height, self.width, 3]
    }

    /// Samples of the last batch copied in.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no batch was copied in yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most samples this buffer holds.
    pub fn capacity(&self) -> usize {
        self.labels.len()
    }

    /// The sequence number of the first sample copied in.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// The consumer's epoch of the batch copied in.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// A copy to the device that may still be running: it owns the host batch (whose ring slots
/// stay held), the device buffer, and the event recorded after the copy.
///
/// Dropping it before the copy has completed waits for the event first, then releases the
/// batch: a slot is never handed back to the producer while the copy engine may still read
/// it. A failure of that wait is logged and recorded in the context
/// ([`CudaContext::check_err`]), never a panic.
pub struct InFlight<C: Deref<Target = Consumer>> {
    device: Option<DeviceBatch>,
    batch: Option<BatchOf<C>>,
    event: Option<CudaEvent>,
    stream: Arc<CudaStream>,
    /// Keeps the registration (and so the mapping) alive while the copy may run.
    _pinned: Arc<Pinned>,
}

impl<C: Deref<Target = Consumer>> fmt::Debug for InFlight<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("device", &self.device)
            .field("host_held", &self.batch.is_some())
            .finish_non_exhaustive()
    }
}

impl<C: Deref<Target = Consumer>> InFlight<C> {
    /// The device buffer the copy writes: use it in work enqueued on the same stream (which
    /// runs after the copy), e.g. [`PinnedRing::convert`].
    pub fn device(&self) -> &DeviceBatch {
        match &self.device {
            Some(device) => device,
            None => unreachable!("the device batch is taken only by `wait`, which consumes self"),
        }
    }

    /// The host batch, while it is still held.
    pub fn host(&self) -> Option<&BatchOf<C>> {
        self.batch.as_ref()
    }

    /// The event recorded after the copy: make another stream wait on it
    /// (`CudaStream::wait`) to use the data there.
    pub fn event(&self) -> Option<&CudaEvent> {
        self.event.as_ref()
    }

    /// Whether the copy has completed, without blocking; once it has, the host batch is
    /// released at once.
    pub fn is_done(&mut self) -> Result<bool, CudaError> {
        if self.batch.is_none() {
            return Ok(true);
        }
        let done = match &self.event {
            Some(event) => event
                .try_is_complete()
                .map_err(CudaError::driver("cuEventQuery of a batch's copy"))?,
            None => false,
        };
        if done {
            self.batch = None;
        }
        Ok(done)
    }

    /// Blocks until the copy has completed, releases the host batch and returns the device
    /// buffer.
    pub fn wait(mut self) -> Result<DeviceBatch, CudaError> {
        self.settle()?;
        self.batch = None;
        match self.device.take() {
            Some(device) => Ok(device),
            None => unreachable!("the device batch is taken only here"),
        }
    }

    /// Waits for the copy: on the event once recorded, else (an enqueue failed half way) on
    /// the whole stream.
    fn settle(&self) -> Result<(), CudaError> {
        if self.batch.is_none() {
            return Ok(());
        }
        match &self.event {
            Some(event) => event
                .synchronize()
                .map_err(CudaError::driver("cuEventSynchronize of a batch's copy")),
            None => self
                .stream
                .synchronize()
                .map_err(CudaError::driver("cuStreamSynchronize after a failed copy")),
        }
    }
}

impl<C: Deref<Target = Consumer>> Drop for InFlight<C> {
    fn drop(&mut self) {
        if let Err(e) = self.settle() {
            // The context is broken (a sticky error): nothing runs on it any more, so the
            // slots are safe to release; say so and leave the code for `check_err`.
            tracing::error!("waiting for a batch's copy before releasing it failed: {e}");
            if let CudaError::Driver { source, .. } = e {
                self.stream.context().record_err(Err::<(), _>(source));
            }
        }
        self.batch = None;
    }
}

/// Bytes of one image of an image feed (0 for another feed).
fn image_bytes(layout: &RingLayout) -> usize {
    layout
        .image_size()
        .map_or(0, |(h, w)| h as usize * w as usize * 3)
}
