//! What can go wrong in a sweep, each variant naming the file, socket or command.

use std::path::PathBuf;

/// A sweep could not be planned, started, followed or merged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// The grid, a shard or a run selection is not usable.
    #[error("{0}")]
    Grid(String),
    /// A file or directory could not be used.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file ladle wrote holds something else.
    #[error("{} is not what ladle writes there: {detail}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The scheduler could not be reached, or refused.
    #[error("scheduler on {}: {what}: {detail}", socket.display())]
    Scheduler {
        /// Its socket.
        socket: PathBuf,
        /// What was asked.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The feed could not start or failed.
    #[error("the feed on {}: {detail}", socket.display())]
    Feed {
        /// Its socket.
        socket: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// `--metrics` or `--record` could not start.
    #[error("observer: {0}")]
    Observe(String),
    /// The sweep was stopped (Ctrl-C, SIGTERM, `scancel`) before it could begin.
    #[error("stopped {0}")]
    Stopped(&'static str),
    /// Where this node's state lives is not usable (a socket path past the kernel's limit).
    #[error("{0}")]
    Place(String),
    /// A Slurm command failed or said something unexpected.
    #[error("{command}: {detail}")]
    Slurm {
        /// The command, as run.
        command: String,
        /// What it said (its stderr), or why it could not run.
        detail: String,
    },
    /// A file the user may have edited is in the way: ladle never overwrites it.
    #[error("{} {detail}", path.display())]
    Edited {
        /// The file.
        path: std::path::PathBuf,
        /// What to do about it.
        detail: String,
    },
    /// Running under Slurm needs a variable that Slurm did not set.
    #[error(
        "${0} is not set: `ladle sweep --slurm-node` runs inside a Slurm allocation, started by the script `ladle sweep --slurm` writes"
    )]
    NotInSlurm(&'static str),
}
