//! # ladle-producer: the pipeline that fills the sample ring
//!
//! In `DESIGN.md`'s picture this crate is the producer: sampler → decode+augment threads
//! (from [`ladle_datasets`]) → slots of the sample ring (from [`ladle_ring`]), plus the
//! control server on a Unix socket that admits and drops consumers.
//!
//! **Status:** not built yet. The ring issue fills this crate. The decode/augment pipeline
//! it will drive already exists: [`ladle_datasets::pipeline::Pipeline`].

pub use ladle_datasets as datasets;
pub use ladle_ring as ring;
