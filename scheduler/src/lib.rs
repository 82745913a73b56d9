//! # ladle-scheduler: collocation-aware GPU admission
//!
//! (crate docs: see the end of the work)

pub mod daemon;
pub mod job;
pub mod journal;
pub mod mps;
pub mod policy;
pub mod protocol;
pub mod sim;
pub mod sys;
pub mod telemetry;
pub mod units;
pub mod window;
