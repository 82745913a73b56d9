//! The raw OS layer: memfd, seals, (double) shared mappings, futexes, fd passing and peer
//! credentials, behind small safe types. The crate's other `unsafe` is in `shm.rs` (the
//! reads and writes of the shared mappings these calls make, each with its `SAFETY`
//! comment) and `writer.rs` (a write loan's slices).

use std::ffi::c_void;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

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
    rustix::fs::fcntl_add_seals(
        fd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
    )
}

/// Seals `fd`'s size for good: nobody can shrink or grow it, and no seal can be added or
/// removed. Writable mappings stay possible (a cursor page is written by its consumer). A
/// shrink under the producer's mapping would kill the producer with `SIGBUS` on its next
/// access.
pub fn seal_size(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::fcntl_add_seals(fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
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
            return Err(io::Errno::INVAL);
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
                return Err(e);
            }
        }
        let ptr = NonNull::new(base.cast::<u8>()).ok_or(io::Errno::NOMEM)?;
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

/// Waits until `word` is woken or no longer holds `expected`, at most `timeout`.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // Shared (not PRIVATE): the word lives in memory mapped by several processes. Errors are
    // EAGAIN (value already changed), ETIMEDOUT and EINTR: all mean "look again".
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::empty(),
        expected,
        Some(&ts),
    );
}

/// Wakes every waiter on `word` in every process.
pub fn futex_wake_all(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}

/// Sends `bytes` on a connected stream socket with `fds` attached (`SCM_RIGHTS`).
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Errno::NOBUFS);
    }
    let mut sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    while sent < bytes.len() {
        sent += rustix::net::send(sock, &bytes[sent..], SendFlags::NOSIGNAL)?;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and any fds attached to them.
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok((msg.bytes, fds))
}

/// Connects to the Unix stream socket at `path`, giving up with `TimedOut` at `deadline`. A
/// blocking `connect` waits as long as the listener's queue is full, which is for ever when the
/// process behind it is stopped (SIGSTOP, a debugger): this one connects without blocking and
/// tries again until the deadline. The stream it returns is blocking.
pub fn connect_by(
    path: &std::path::Path,
    deadline: std::time::Instant,
) -> std::io::Result<std::os::unix::net::UnixStream> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let addr = SocketAddrUnix::new(path)?;
    loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => {
                let stream = std::os::unix::net::UnixStream::from(fd);
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            // The listener's queue is full (a Unix socket's connect never says EINPROGRESS).
            Err(io::Errno::AGAIN | io::Errno::INTR) => {
                if std::time::Instant::now() >= deadline {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether the other end of a connected socket has closed (or the socket failed), without
/// reading or blocking: what a producer asks of a rank's old connection before it refuses its
/// restarted incarnation as "already running".
pub fn peer_hung_up(sock: impl AsFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &sock,
        rustix::event::PollFlags::RDHUP,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|_| {
        fds[0].revents().intersects(
            rustix::event::PollFlags::RDHUP
                | rustix::event::PollFlags::HUP
                | rustix::event::PollFlags::ERR,
        )
    })
}

/// The uid of the process at the other end of a Unix socket (`SO_PEERCRED`).
pub fn peer_uid(sock: impl AsFd) -> io::Result<u32> {
    Ok(rustix::net::sockopt::socket_peercred(sock)?.uid.as_raw())
}

/// This process's effective uid.
pub fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}
