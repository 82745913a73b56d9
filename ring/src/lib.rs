//! # ladle-ring: the shared-memory sample ring and the control protocol
//!
//! In `DESIGN.md`'s picture this crate is the box in the middle: the one contract both the
//! producer and every consumer share. It will hold the struct-of-arrays sample regions
//! (images `[C,H,W,3]` u8, labels `i64`, dataset indices `u64`) mapped twice back to back,
//! the producer's head and the per-consumer cursors, and the typed, versioned,
//! length-prefixed control messages.
//!
//! **Status:** not built yet. The ring issue fills this crate; until then it exposes only
//! the protocol version so that dependants can build.

/// Version of the control protocol spoken over the producer's Unix socket.
pub const PROTOCOL_VERSION: u32 = 1;
