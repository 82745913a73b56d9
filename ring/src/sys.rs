//! The OS calls the ring is made of (memfd, seals, shared mappings, futexes, fd passing, peer
//! credentials), from `ladle-os`, the one layer of OS calls, re-exported under one name for
//! the ring's users. What the ring does with the mappings is in `shm.rs` (with `read_loan.rs`)
//! and `writer.rs`, each `unsafe` with its `SAFETY` comment.

pub use ladle_os::futex::{futex_wait, futex_wake_all};
pub use ladle_os::net::{
    connect_by, my_uid, peer_hung_up, peer_uid, pending, recv_with_fds, send_with_fds,
};
pub use ladle_os::shm::{Mapping, PAGE, file_len, memfd, seal_against_writers, seal_size};
