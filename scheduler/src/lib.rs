//! # ladle-scheduler: collocation-aware GPU admission
//!
//! (crate docs: see the end of the work)

pub mod policy;
pub mod telemetry;
pub mod units;
pub mod window;
pub mod sim;
