//! The atomics the ring protocol uses, swapped for loom's under `cfg(loom)` so that
//! `tests/loom.rs` can model-check the head/cursor protocol ([`crate::protocol_core`]) and the
//! publish/wake handshake ([`crate::wake_core`]).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
