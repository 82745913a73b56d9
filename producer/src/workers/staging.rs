//! Staging buffers: a worker writes its sample into a memfd of its own (its size sealed),
//! never into the sealed ring; [`StagingPlan`] says where each field lies in it.

use std::os::fd::{AsFd, OwnedFd};

use ladle_ring::Schema;
use ladle_ring::sys::{self, Mapping, PAGE};

/// Where each field of a sample lies in a worker's staging buffer.
#[derive(Debug)]
pub(super) struct StagingPlan {
    /// `(offset, length)` per schema field, each offset a multiple of 64.
    pub(super) fields: Vec<(u64, usize)>,
    /// The buffer's length: whole pages.
    pub(super) len: usize,
}

impl StagingPlan {
    pub(super) fn for_schema(schema: &Schema) -> Self {
        let mut at = 0usize;
        let fields = schema
            .fields()
            .iter()
            .map(|field| {
                let place = (at as u64, field.bytes());
                at = (at + field.bytes()).next_multiple_of(64);
                place
            })
            .collect();
        Self {
            fields,
            len: at.max(1).next_multiple_of(PAGE),
        }
    }

    /// A new staging buffer: the fd for the worker (read-write, its size sealed) and the
    /// producer's read-only mapping of it.
    pub(super) fn create(&self) -> Result<(OwnedFd, Mapping), String> {
        let fd = sys::memfd("ladle-staging", self.len as u64)
            .map_err(|e| format!("cannot make a staging buffer: {e}"))?;
        // A worker that shrank it would kill the producer with SIGBUS on its next copy.
        sys::seal_size(fd.as_fd()).map_err(|e| format!("cannot seal a staging buffer: {e}"))?;
        let map = Mapping::new(fd.as_fd(), 0, self.len, false, false)
            .map_err(|e| format!("cannot map a staging buffer: {e}"))?;
        map.prefault(false)
            .map_err(|e| format!("cannot pre-fault a staging buffer: {e}"))?;
        Ok((fd, map))
    }
}
