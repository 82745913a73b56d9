//! The trace simulator: `ladle-scheduler-core`'s [`sim`](ladle_scheduler_core::sim) (trace
//! replay on simulated GPUs with the daemon's admission engine, and the CARMA-like trace
//! generator), re-exported whole, with [`trace`] files read and written here.

pub use ladle_scheduler_core::sim::*;

pub mod trace;
