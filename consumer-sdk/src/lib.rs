//! # ladle-consumer: the SDK a training process links
//!
//! In `DESIGN.md`'s picture this crate is what each consumer (a training process) links:
//! it connects to the producer's control socket, maps the sample ring read-only and yields
//! zero-copy batches of its own batch size. It depends only on [`ladle_ring`], never on the
//! producer or the datasets crate, so that it stays small.
//!
//! **Status:** not built yet. The ring issue fills this crate.

pub use ladle_ring::PROTOCOL_VERSION;
