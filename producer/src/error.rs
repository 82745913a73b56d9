//! What can stop a producer ([`ProducerError`]).

use std::path::PathBuf;

use ladle_datasets::PipelineError;
use ladle_ring::{LayoutError, ShmError};

/// The producer could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// The ring's shape is invalid for these images.
    #[error("ring layout: {0}")]
    Layout(#[from] LayoutError),
    /// Creating the shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] ShmError),
    /// The control socket could not be set up.
    #[error("control socket {path}: {reason}")]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The decode pipeline failed (a bad sample under the fail policy, a bad option).
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// An option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
}
