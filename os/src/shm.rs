//! Shared memory: anonymous files (memfd), their seals, and shared mappings of them (a
//! region mapped twice back to back, so that any window of it is contiguous). What is read
//! and written through a mapping, and when, is the ring's business (`ladle-ring`'s `shm`).

use std::ffi::c_void;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::io;

/// The page size the ring's regions are aligned to.
pub const PAGE: usize = 4096;

/// A new anonymous shared-memory file of `len` bytes, close-on-exec, sealable.
pub fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len)?;
    Ok(fd)
}

/// Seals `fd` so that nobody can resize it, map it writable or `write(2)` it from now on,
/// through any fd of the file, a re-open through `/proc` included; mappings that are already
/// writable (the producer's) stay writable. Needs Linux 5.1.
pub fn seal_against_writers(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::fs::fcntl_add_seals(
        fd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
    )?)
}

/// Seals `fd`'s size for good: nobody can shrink or grow it, and no seal can be added or
/// removed. Writable mappings stay possible (a cursor page is written by its consumer). A
/// shrink under the producer's mapping would kill the producer with `SIGBUS` on its next
/// access.
pub fn seal_size(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::fs::fcntl_add_seals(
        fd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?)
}

/// The size of the file behind `fd`.
pub fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_size as u64)
}

/// A shared mapping of part of a file, unmapped on drop. When `double` is set, the same
/// `len` bytes are mapped twice, back to back, so that `ptr[i] == ptr[i + len]` and any
/// window of up to `len` bytes starting in the first copy is contiguous.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    total: usize,
}

// SAFETY: a mapping is plain memory shared by design; all access goes through atomics or
// through the ring's publication protocol, which the types above this module enforce.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out raw pointers and reads.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `[offset, offset + len)` of `fd`, read-only or read-write, once or twice.
    pub fn new(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        writable: bool,
        double: bool,
    ) -> io::Result<Self> {
        if len == 0 || len % PAGE != 0 || offset % PAGE as u64 != 0 {
            return Err(rustix::io::Errno::INVAL.into());
        }
        let total = if double { len * 2 } else { len };
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: reserve fresh address space; nothing else refers to it.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                total,
                ProtFlags::empty(),
                MapFlags::PRIVATE,
            )?
        };
        let unmap = |base: *mut c_void| {
            // SAFETY: `base..base+total` is our own reservation from above.
            let _ = unsafe { rustix::mm::munmap(base, total) };
        };
        for copy in 0..if double { 2 } else { 1 } {
            // SAFETY: MAP_FIXED over our own reservation (`copy * len < total`), so no other
            // mapping is replaced; the file range was checked by the caller's layout.
            let at = unsafe { base.cast::<u8>().add(copy * len).cast::<c_void>() };
            // SAFETY: see above.
            let mapped = unsafe {
                rustix::mm::mmap(
                    at,
                    len,
                    prot,
                    MapFlags::SHARED | MapFlags::FIXED,
                    fd,
                    offset,
                )
            };
            if let Err(e) = mapped {
                unmap(base);
                return Err(e.into());
            }
        }
        let ptr = NonNull::new(base.cast::<u8>()).ok_or(rustix::io::Errno::NOMEM)?;
        Ok(Self { ptr, len, total })
    }

    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes of one copy.
    pub fn copy_len(&self) -> usize {
        self.len
    }

    /// Pre-faults every page of the first copy (the second maps the same pages): first touch
    /// of fresh shared memory costs a page fault per 4 KiB, ~10x slower than a faulted page,
    /// so pay it at start, not on the hot path. `writable` mappings are populated for writing.
    pub fn prefault(&self, writable: bool) -> io::Result<()> {
        let advice = if writable {
            rustix::mm::Advice::LinuxPopulateWrite
        } else {
            rustix::mm::Advice::LinuxPopulateRead
        };
        // SAFETY: our own mapping; MADV_POPULATE_* only faults pages in.
        let advised = unsafe { rustix::mm::madvise(self.ptr.as_ptr().cast(), self.len, advice) };
        if advised.is_err() {
            // Kernels before 5.14: touch every page (reads only, so read-only mappings work).
            let mut sum = 0u8;
            for page in (0..self.len).step_by(PAGE) {
                // SAFETY: `page < len`, inside our mapping.
                sum = sum.wrapping_add(unsafe { self.ptr.as_ptr().add(page).read_volatile() });
            }
            std::hint::black_box(sum);
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the whole reservation is ours, and nothing borrows from a `Mapping` past
        // its life (borrowers hold `&Mapping`).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.total) } {
            tracing::error!("munmap of the ring failed: {e}");
        }
    }
}

/// Whether the size of the file behind `fd` is sealed for good: `F_SEAL_SHRINK` and
/// `F_SEAL_GROW` are set (seals are never removed). Only such a file may be mapped from
/// another process: one that shrinks under a mapping kills the process at its next access
/// with `SIGBUS`. False for a file that cannot carry seals (not a memfd).
pub fn size_sealed(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fcntl_get_seals(fd)
        .is_ok_and(|seals| seals.contains(SealFlags::SHRINK | SealFlags::GROW))
}

/// Whether the file behind `fd` is sealed against every writer ([`seal_against_writers`]'s
/// seals): nobody can resize it, map it writable or `write(2)` it any more, except through a
/// writable mapping made before the seal. What a process that lends a memfd to others checks.
pub fn sealed_against_writers(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fcntl_get_seals(fd).is_ok_and(|seals| {
        seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE)
    })
}
