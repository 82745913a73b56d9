//! # ladle-tests: cross-crate, multi-process integration tests
//!
//! In `DESIGN.md`'s picture this package tests the whole: it runs the real `ladle` binary
//! (built by cargo for the tests in `tests/`) on real files, with real processes. Shared
//! fixtures live here; the tests themselves are in `tests/tests/`.
