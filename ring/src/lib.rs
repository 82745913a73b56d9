//! # ladle-ring: the shared-memory sample ring and the control protocol
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate is the box in the middle: the one contract both
//! the producer and every consumer share, and the only crate the consumer SDK needs.
//!
//! - [`schema`]: what a sample is, named fields of fixed dtype and shape (an image feed is
//!   `image: u8[H,W,3], label: i64`); it travels in `Welcome`.
//! - [`layout`]: where each field (`[C, ...shape]`), the dataset indices (`u64`) and the
//!   per-sample flags (`u64`, bit 0: bad) live in one `memfd`, each region mapped twice back
//!   to back so that any window of up to `C` samples is one contiguous slice of every field.
//! - [`shm`]: the producer's read-write view ([`ProducerRing`]: create, pre-fault, seal, write
//!   slots, publish the head) and a consumer's read-only view ([`ConsumerRing`]); the
//!   per-consumer [`CursorPage`]. Waiting uses futexes in the cursor page, both ways: the
//!   producer sleeps on the slowest consumer's cursor until it releases; a consumer sleeps on
//!   its page's wake word, which the producer bumps only once the head reaches the end of the
//!   batch the consumer waits for (one wake-up per batch, not one per published sample;
//!   protocol version 2).
//! - [`writer`]: the producer's only way to write a slot, a [`WriteLoan`] granted once per
//!   sequence, in order, when every attached reader's cursor allows it (each cursor read once
//!   and range-checked; a cursor out of range is a [`Violation`] of that reader only); the
//!   soundness argument for the writes is written there, once.
//! - [`protocol_core`]: the head/cursor protocol and its memory orderings, model-checked with
//!   loom (`RUSTFLAGS="--cfg loom" cargo test -p ladle-ring --test loom --release`), and the
//!   lease word a consumer delivers batches through and the producer lets a stalled consumer
//!   go through (one compare-and-swap each, so exactly one wins).
//! - [`wake_core`]: the publish/wake handshake (the waiter count, the wake target, the wake
//!   word), generic over the futex and model-checked with loom in the same test file: no
//!   wake-up is lost, with one waiting thread or several.
//! - [`protocol`]: the typed, versioned, length-prefixed control messages, with fd passing.
//!
//! The ring file is sealed (`F_SEAL_FUTURE_WRITE`, `SHRINK`, `GROW`) once the producer has
//! mapped it: a consumer holding the fd can only ever map it read-only and cannot resize it
//! under the producer. There is no named segment: the memory lives exactly as long as some
//! process holds the fd or a mapping, so a crash leaves nothing behind in `/dev/shm`.

pub mod error;
pub mod layout;
pub mod protocol;
pub mod protocol_core;
pub mod schema;
#[cfg(not(loom))]
pub mod shm;
mod sync;
pub mod sys;
pub mod wake_core;
#[cfg(not(loom))]
pub mod writer;

pub use error::{LayoutError, ProtocolError, ShmError};
pub use layout::{FLAG_BAD, FLAG_HOLE, RingLayout};
pub use protocol::PROTOCOL_VERSION;
pub use schema::{DType, Field, Schema, SchemaError};
#[cfg(not(loom))]
pub use shm::{ConsumerRing, CursorPage, LetGo, ProducerRing, ReadLoan, SlotMut};
#[cfg(not(loom))]
pub use writer::{AttachError, Gate, Readers, Violation, WriteLoan};
