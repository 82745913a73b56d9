//! Files: opening one without blocking (a FIFO named like a data file would otherwise wait
//! for a writer for ever), and telling an error that says "out of a resource for a moment"
//! from one that says something about the file.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` for reading with `O_NONBLOCK`: the open of a FIFO returns at once instead of
/// waiting for a writer. Reads of a regular file are unaffected by the flag.
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// Whether `error` may go away if the call is tried again: the process or system ran out of
/// file descriptors or memory for a moment, or the call was interrupted or would block.
pub fn is_transient(error: &io::Error) -> bool {
    const TRANSIENT: [i32; 6] = [
        libc::EMFILE,
        libc::ENFILE,
        libc::ENOMEM,
        libc::ENOBUFS,
        libc::EAGAIN,
        libc::EINTR,
    ];
    error.raw_os_error().is_some_and(|e| TRANSIENT.contains(&e))
        || matches!(
            error.kind(),
            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        )
}

/// Whether `error` says the disk (or the user's quota on it) is full: `ENOSPC`, `EDQUOT`.
pub fn is_disk_full(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The error "too many open files" (`EMFILE`), as the OS reports it: for tests of the paths
/// that must treat it as transient.
pub fn too_many_open_files() -> io::Error {
    io::Error::from_raw_os_error(libc::EMFILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_is_transient_and_a_missing_file_is_not() {
        assert!(is_transient(&too_many_open_files()));
        assert!(is_transient(&io::Error::from_raw_os_error(libc::EINTR)));
        assert!(!is_transient(&io::Error::from_raw_os_error(libc::ENOENT)));
        assert!(!is_transient(&io::ErrorKind::InvalidData.into()));
        assert!(is_disk_full(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_disk_full(&io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_disk_full(&too_many_open_files()));
    }

    #[test]
    fn a_fifo_opens_at_once_without_a_writer() {
        use std::os::unix::fs::FileTypeExt;
        let dir = std::env::temp_dir().join(format!("ladle-os-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("zz.jpg");
        let _ = std::fs::remove_file(&fifo);
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let file = open_nonblocking(&fifo).unwrap();
        assert!(file.metadata().unwrap().file_type().is_fifo());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
