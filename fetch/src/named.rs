//! A dataset by URL named by its URL: the fetched shards' folder opened as a WebDataset, with
//! the URL as written for its [`Dataset::root`], which is what the feed reports as its source
//! (its identity's `source`, the feeds registry's key, messages). Everything else is the
//! folder's dataset's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ladle_datasets::{
    Dataset, Fingerprint, Format, LeftOut, RecordData, SampleError, SampleLimits, Streamed,
};

/// `inner`, named `url`.
#[derive(Debug)]
pub struct Named {
    inner: Box<dyn Dataset>,
    url: PathBuf,
}

impl Named {
    /// `inner` (opened from the shard cache), named `url`.
    pub fn new(inner: Box<dyn Dataset>, url: &str) -> Self {
        Self {
            inner,
            url: PathBuf::from(url),
        }
    }
}

impl Dataset for Named {
    fn format(&self) -> Format {
        self.inner.format()
    }
    fn root(&self) -> &Path {
        &self.url
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn class_names(&self) -> &[String] {
        self.inner.class_names()
    }
    fn label(&self, index: u64) -> Result<i64, SampleError> {
        self.inner.label(index)
    }
    fn location(&self, index: u64) -> String {
        self.inner.location(index)
    }
    fn read<'a>(
        &'a self,
        index: u64,
        scratch: &'a mut Vec<u8>,
        limits: &SampleLimits,
    ) -> Result<RecordData<'a>, SampleError> {
        self.inner.read(index, scratch, limits)
    }
    fn stamp(&self, index: u64) -> Result<Option<ladle_datasets::cache::Stamp>, SampleError> {
        self.inner.stamp(index)
    }
    fn fingerprint(&self) -> Fingerprint {
        self.inner.fingerprint()
    }
    fn problems(&self) -> &[SampleError] {
        self.inner.problems()
    }
    fn left_out(&self) -> &[LeftOut] {
        self.inner.left_out()
    }
    fn warnings(&self) -> &[String] {
        self.inner.warnings()
    }
    fn streamed(&self) -> Option<Arc<dyn Streamed>> {
        self.inner.streamed()
    }
}
