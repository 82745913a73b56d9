//! What a feed serves: a native image dataset, or samples of any schema made by a
//! [`CustomSource`] (the Python producer).

use std::sync::Arc;

use ladle_datasets::Dataset;
use ladle_datasets::pipeline::SampleMaker;
use ladle_ring::Schema;
use ladle_ring::protocol::DatasetInfo;

/// Where a feed's samples come from when they are not images the native pipeline decodes:
/// samples of any [`Schema`], made by one [`SampleMaker`] per pipeline thread (the Python
/// producer's makers hand each sample to a worker process that writes it into the slot).
pub trait CustomSource: Send + Sync + std::fmt::Debug {
    /// What a sample is.
    fn schema(&self) -> &Schema;
    /// Samples per epoch, class names (may be empty) and a name for logs.
    fn info(&self) -> DatasetInfo;
    /// A maker for one pipeline thread; called once per thread when the feed starts. It
    /// writes each sample into the slot's buffers it is given, in this process: the ring is
    /// sealed against every other writer.
    fn maker(&self) -> Box<dyn SampleMaker + '_>;
}

/// What a producer serves: a native image dataset, or a [`CustomSource`].
#[derive(Debug, Clone)]
pub(crate) enum Source {
    Images(Arc<dyn Dataset>),
    Custom(Arc<dyn CustomSource>),
}
