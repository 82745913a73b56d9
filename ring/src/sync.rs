//! The atomics the ring protocol uses, swapped for loom's under `cfg(loom)` so that
//! `tests/loom.rs` can model-check the head/cursor protocol.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
