//! Typed errors of the ring crate: one per operation.

use std::path::PathBuf;

/// A ring shape that cannot be laid out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The capacity is not a positive multiple of the page-alignment granule.
    #[error("ring capacity {capacity} is not a positive multiple of {granule} samples")]
    Capacity {
        /// Requested capacity.
        capacity: u64,
        /// The granule for this schema.
        granule: u64,
    },
    /// Zero or absurd image sides.
    #[error("image size {height}x{width} is outside 1..=8192")]
    ImageSize {
        /// Height.
        height: u32,
        /// Width.
        width: u32,
    },
    /// A schema that cannot be laid out.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
    /// The ring would exceed 1 TiB.
    #[error("a ring of {capacity} samples is too large")]
    TooLarge {
        /// Requested capacity.
        capacity: u64,
    },
}

/// Creating or mapping the ring's shared memory failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file handed over is not the size the layout says.
    #[error("the ring file is {actual} bytes, the layout needs {expected}")]
    SizeMismatch {
        /// Bytes the layout needs.
        expected: u64,
        /// Bytes the file has.
        actual: u64,
    },
    /// The header does not carry the ring's magic number.
    #[error("the shared memory is not a ladle ring (bad magic)")]
    BadMagic,
}

impl ShmError {
    #[cfg_attr(loom, allow(dead_code))] // the shared-memory module is not built under loom
    pub(crate) fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |e| Self::Os { what, source: e }
    }
}

/// The control protocol failed on one connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The socket failed.
    #[error("control socket I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
    /// A frame longer than [`crate::protocol::MAX_FRAME`].
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    Oversize {
        /// Announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A frame that is not a message of this protocol.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: this side speaks {ours}, the peer {theirs}")]
    Version {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// Welcome arrived without the file descriptors it must carry.
    #[error("expected {expected} file descriptors with the message, got {got}")]
    MissingFds {
        /// Expected count.
        expected: usize,
        /// Received count.
        got: usize,
    },
    /// The socket belongs to another user.
    #[error("{path}: the peer runs as uid {peer}, not {ours}; refusing it")]
    ForeignPeer {
        /// The socket path.
        path: PathBuf,
        /// The peer's uid.
        peer: u32,
        /// Our uid.
        ours: u32,
    },
}
