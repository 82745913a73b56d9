//! # ladle-consumer: the SDK a training process links
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate is each consumer box (A, B, C on the right): what
//! a training process links to read the producer's sample ring. It connects to the producer's
//! control socket (Unix, peer uid checked), says `Hello` with its own batch size, maps the ring it
//! receives **read-only**, and yields zero-copy [`Batch`]es. A sample is a record of named
//! fields (the feed's [`Schema`], [`Consumer::schema`]); each field of a batch is one
//! contiguous `[B, ...shape]` slice of shared memory: [`BatchOf::field`] views it typed (its
//! dtype checked, [`FieldError`] otherwise), [`BatchOf::field_view`] untyped (f16, bf16, bool).
//! An image feed's images ([`BatchOf::images`]) are `[B, H, W, 3]` u8, its labels `[B]` i64;
//! the dataset indices are `[B]` u64. It depends only on [`ladle_ring`], never on the producer
//! or the datasets crate, so that it stays small.
//!
//! ```no_run
//! # use ladle_consumer::prelude::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A feed of `wave: f32[16000], label: i64` (served by `ladle.serve` in Python, say).
//! let consumer = Consumer::connect("/tmp/waves.sock", ConsumerConfig::default())?;
//! for batch in consumer.epoch() {
//!     let batch = batch?;
//!     let waves: &[f32] = batch.field("wave")?; // [B × 16000], zero copy
//!     assert_eq!(waves.len(), batch.len() * 16000);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ```no_run
//! use ladle_consumer::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = ConsumerConfig { batch_size: 64, ..ConsumerConfig::default() };
//! let consumer = Consumer::connect("/run/user/1000/ladle.sock", config)?;
//! for _ in 0..3 {
//!     let epoch = consumer.epoch();
//!     let number = epoch.number();
//!     for batch in epoch {
//!         let batch = batch?;
//!         let [b, h, w, c] = batch.shape();
//!         let images: &[u8] = batch.images(); // b·h·w·c bytes, zero copy
//!         let labels: &[i64] = batch.labels();
//!         assert_eq!(images.len(), b * h * w * c);
//!         assert_eq!(labels.len(), b);
//!         // ... copy to the device, train a step; dropping `batch` releases its samples
//!     }
//!     println!("epoch {number} done");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## Runs of a feed: `LADLE_SOCKET` and `LADLE_RUN`
//! `ladle sweep` starts every run of a sweep with the feed's control socket in `LADLE_SOCKET`
//! ([`SOCKET_ENV`]) and the run's name in `LADLE_RUN` ([`RUN_ENV`]). A training script joins
//! its feed with [`Consumer::connect_from_env`] instead of taking a socket flag; it fails with
//! [`ConnectError::NoSocket`], naming the variable, when `LADLE_SOCKET` is unset or empty.
//! [`ConsumerConfig::default`] names the consumer `$LADLE_RUN` when that is set and not empty
//! (else `consumer-<pid>`), so the producer's logs say which run is which. `ladle consume`
//! (no `--socket`) and the Python `ladle.Consumer` (no `socket`) read the same variables.
//!
//! ```no_run
//! use ladle_consumer::prelude::*;
//!
//! # fn main() -> Result<(), ConnectError> {
//! // Started by `ladle sweep ... -- my-trainer`: LADLE_SOCKET and LADLE_RUN are set.
//! let consumer = Consumer::connect_from_env(ConsumerConfig::default())?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Epochs
//! The producer gives each consumer a start sequence number `S` when it joins. The consumer's
//! epoch `k` is the `N` (dataset length) consecutive samples `[S + k·N, S + (k+1)·N)`; the
//! producer arranges its shuffles so that each holds every dataset index exactly once, however
//! late the consumer joined. Batches are consecutive windows of the batch size inside that
//! range, the last one partial (or skipped with [`ConsumerConfig::drop_last`]). Abandoning an
//! epoch early (dropping its iterator) skips the rest of it: the next [`Consumer::epoch`]
//! starts at the next boundary.
//!
//! ## Holding batches
//! [`Batch`]es borrow the [`Consumer`] immutably, so several can be held at once (a
//! prefetching training loop). From an `Arc<Consumer>`, [`Consumer::shared_epoch`] gives
//! [`SharedBatch`]es that hold a reference instead: they can be stored, sent to another thread
//! or owned by Python objects (the `ladle` Python package is built on them). A dropped batch releases its samples: the consumer's cursor
//! moves to the start of the oldest batch still held, or to the first sample not handed out.
//! The producer overwrites nothing at or above the cursor of a consumer it has not let go
//! (see Pauses), so it waits for the slowest consumer; asking for more than
//! [`ConsumerConfig::max_batches_held`] batches, or for more than the ring holds beside the
//! batches held, is [`ConsumerError::TooManyBatchesHeld`] instead of a deadlock.
//!
//! ## Pauses
//! A consumer that takes no batch for the producer's stall timeout (10 s by default) while
//! holding the feed back is let go: the feed goes on without it. Handing out a batch is an
//! atomic step on the cursor page's lease word that fails once the producer has let the
//! consumer go, so a let-go consumer never hands out a batch from an overwritten slot; it
//! rejoins by itself (`Rejoin`, [`Consumer::rejoins`] counts them) and finishes the epoch in
//! progress from the feed's next `N` samples, delivering only indices it has not seen this
//! epoch, copied into owned batches ([`BatchOf::is_copy`]). The epoch stays exact. Batches held
//! across such a pause may have been overwritten: [`BatchOf::is_intact`] says so (check it
//! after reading a batch held across a long pause).
//!
//! ## Waiting and failure
//! Waiting for samples sleeps on a futex in this consumer's cursor page, which the producer
//! bumps once the head reaches the end of the batch waited for (one wake-up per batch, not
//! per sample), at most 100 ms at a time, and checks the control socket at every wake-up: a
//! producer that exits or is killed is [`ConsumerError::ProducerGone`] within about 100 ms, never a hang; an `End` or `Detached`
//! from the producer is [`ConsumerError::ProducerEnded`] or [`ConsumerError::Detached`]
//! (a consumer that broke the protocol, its cursor out of range, say).
//! Samples already published are still delivered first. Dropping the [`Consumer`] sends
//! `Leave` and closes the socket.
//!
//! ## To the GPU
//! Images stay u8 HWC in the ring; [`convert_cpu`] turns a batch into normalised f32 NCHW (or
//! channels-last) on the CPU, and is the reference of the GPU kernel. With the cargo feature
//! `cuda`, the `cuda` module pins this consumer's ring mapping (`cuMemHostRegister`, per
//! process), copies batches to the device asynchronously (a batch stays held until its copy's
//! event completes) and converts them with one fused kernel. CUDA is loaded at run time: no
//! driver or no GPU is an error value and the CPU path keeps working. Not yet run on a GPU.
//!
//! ## Logging
//! `tracing` events: `info` when the consumer joins; `warn` when the producer goes away, ends
//! or detaches this consumer (also returned as errors) or lets it go (it rejoins); `debug` for
//! a failed best-effort `Leave`; `error` only for a broken internal invariant.

mod config;
mod consumer;
mod convert;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod epochs;
mod error;
mod fields;
pub mod launch;
pub mod plan;
pub mod position;
pub mod skim;

pub use config::{CONNECT_TIMEOUT_ENV, ConsumerConfig, DEFAULT_GROUP_TIMEOUT, RUN_ENV, SOCKET_ENV};
pub use consumer::{
    Batch, BatchOf, Consumer, Epoch, EpochOf, MAX_DATASET_LEN, SharedBatch, SharedEpoch,
};
pub use convert::{ConvertError, Layout, Normalize, convert_cpu};
pub use error::{ConnectError, ConsumerError, FieldError, LocalRanks, ResumeError};
pub use fields::{Element, FieldView};
pub use ladle_ring::PROTOCOL_VERSION;
pub use ladle_ring::RingLayout;
pub use ladle_ring::protocol::{DatasetInfo, FeedIdentity};
pub use ladle_ring::{DType, Field, Schema, schema};
pub use plan::{Even, GroupSpec};
pub use position::SavedPosition;

/// The types a training loop needs: `use ladle_consumer::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Batch, ConnectError, Consumer, ConsumerConfig, ConsumerError, DatasetInfo, Epoch, Layout,
        Normalize, RingLayout, SharedBatch, SharedEpoch,
    };
}
