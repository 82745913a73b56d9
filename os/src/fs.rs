//! Files: opening one without blocking (a FIFO named like a data file would otherwise wait
//! for a writer for ever), and telling an error that says "out of a resource for a moment"
//! from one that says something about the file.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Whether a dataset string names a URL (`scheme://…`: `http`, `https`, `s3`, …), which is
/// fetched, not a path, which is opened: the one test every layer that takes a dataset
/// string uses.
pub fn is_url(dataset: &str) -> bool {
    dataset.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
    })
}

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

/// Why a directory cannot be used as a private one ([`private_dir`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrivateDirError {
    /// It could not be created or looked at.
    #[error("{}: {source}", path.display())]
    Io {
        /// The directory.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Something other than a directory is there (a symbolic link included: it is not
    /// followed).
    #[error("{}: not a directory (a {what}); refusing to use it", path.display())]
    NotADirectory {
        /// The path.
        path: std::path::PathBuf,
        /// What is there instead.
        what: &'static str,
    },
    /// The directory belongs to another user.
    #[error("{}: owned by uid {owner}, not by this user (uid {ours}); refusing to use it", path.display())]
    Foreign {
        /// The directory.
        path: std::path::PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        ours: u32,
    },
    /// Other users may read, enter or write it.
    #[error("{}: mode {mode:04o} lets other users in; it must be 0700 (chmod 700 it, or remove it)", path.display())]
    Open {
        /// The directory.
        path: std::path::PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Makes sure `path` is a directory only this user can use: created with mode 0700 if
/// missing (its parent must exist), else checked without following a link: a directory,
/// owned by this process's effective uid, with no permission for group or others. Nothing
/// is changed on a directory that fails the check.
pub fn private_dir(path: &Path) -> Result<(), PrivateDirError> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
    let io = |source| PrivateDirError::Io {
        path: path.into(),
        source,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let meta = std::fs::symlink_metadata(path).map_err(io)?;
    let kind = meta.file_type();
    if !kind.is_dir() {
        let what = if kind.is_symlink() {
            "symbolic link"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_fifo() {
            "FIFO"
        } else {
            "file"
        };
        return Err(PrivateDirError::NotADirectory {
            path: path.into(),
            what,
        });
    }
    let ours = crate::process::my_uid();
    if meta.uid() != ours {
        return Err(PrivateDirError::Foreign {
            path: path.into(),
            owner: meta.uid(),
            ours,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PrivateDirError::Open {
            path: path.into(),
            mode,
        });
    }
    Ok(())
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

    #[test]
    fn a_private_dir_is_made_0700_and_an_open_linked_or_foreign_one_is_refused_untouched() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("reg");
        private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        private_dir(&dir).unwrap();

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir(&dir).unwrap_err();
        assert!(
            matches!(err, PrivateDirError::Open { mode: 0o777, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("0777"), "{err}");
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o777, "left as it was");

        let link = root.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = private_dir(&link).unwrap_err();
        assert!(
            matches!(
                err,
                PrivateDirError::NotADirectory {
                    what: "symbolic link",
                    ..
                }
            ),
            "{err}"
        );

        if crate::process::my_uid() == 0 {
            let foreign = root.path().join("foreign");
            std::fs::create_dir(&foreign).unwrap();
            std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
            let err = private_dir(&foreign).unwrap_err();
            assert!(
                matches!(err, PrivateDirError::Foreign { owner: 65534, .. }),
                "{err}"
            );
        }
    }
}
