//! # ladle-scheduler: collocation-aware GPU admission
//!
//! In `DESIGN.md`'s picture this crate is the scheduler at the bottom: NVML telemetry, MPS
//! control and admission policies (CARMA's rules and ours) that decide when a training
//! process may start on a GPU. It knows producers' feeds by name only.
//!
//! **Status:** not built yet. The scheduler issue fills this crate.
