//! # ladle-benches: benchmarks
//!
//! In `DESIGN.md`'s picture this package measures the producer's per-core ceiling (decode and
//! augment, see `benches/decode_augment.rs` and `benches/pipeline.rs`). Method and results:
//! `benches/README.md`.
