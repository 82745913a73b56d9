//! # ladle-cache: decode once per dataset
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate sits beside the producer's decode threads:
//! a per-user, per-node **keeper** process ([`keeper`], `ladle cache keep`) holds decoded
//! images (pixels before any augmentation) in sealed shared memory between feeds, and a
//! feed's [`CacheClient`] reads and fills it through `ladle_datasets::cache::DecodedCache`,
//! the decode path's side. Every feed of a dataset (any transform, seed or image size) reads
//! the same entries, so a sweep over seeds, a second epoch, a restarted producer or a resumed
//! run decodes nothing the cache holds. Consumers never see it: nothing in the ring changes.
//!
//! What it promises, and where each is kept:
//! - **nothing half-written is read**: a filler writes a record into its own arena, then asks
//!   the keeper to publish it; the keeper checks the record and only then stores its
//!   location in the index with one release store ([`layout`], [`keeper`]). A filler killed
//!   mid-record published nothing.
//! - **only its filler writes an arena, only the keeper the index**: both are memfds sealed
//!   against every other writer (`F_SEAL_FUTURE_WRITE`), a re-open through `/proc` included;
//!   the keeper refuses an arena that is not sealed, and lends descriptors only to
//!   processes of its own user.
//! - **a changed file is not served stale**: a record carries its file's size and
//!   modification time (`Stamp`); a lookup of another stamp empties the entry and decodes.
//! - **the budget is kept, nothing is evicted to admit** (CoorDL's rule): `keeper`'s ledger.
//!
//! The keeper lives in the feeds' registry directory ([`KeeperFiles`]); [`ensure`] starts it
//! once per user and node, however many feeds ask at once.

pub mod client;
pub mod keeper;
pub mod layout;
mod table;
pub mod wire;

use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use client::CacheClient;
pub use wire::{DatasetView, KeeperEntry, Listing};

/// The keeper's files in a registry directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeeperFiles {
    /// Askers' start lock.
    pub lock: PathBuf,
    /// Held by the keeper for its whole life.
    pub live: PathBuf,
    /// Its socket.
    pub socket: PathBuf,
    /// Its entry ([`KeeperEntry`]).
    pub entry: PathBuf,
    /// Its log.
    pub log: PathBuf,
}

impl KeeperFiles {
    /// Whether a keeper holds its life lock now.
    ///
    /// # Errors
    /// [`CacheError::Io`] naming the lock file.
    pub fn keeper_lives(&self) -> Result<bool, CacheError> {
        ladle_os::process::is_locked(&self.live).map_err(|source| CacheError::Io {
            path: self.live.clone(),
            source,
        })
    }

    /// The keeper's files in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            lock: dir.join("cache.lock"),
            live: dir.join("cache.live"),
            socket: dir.join("cache.sock"),
            entry: dir.join("cache.json"),
            log: dir.join("cache.log"),
        }
    }
}

/// What went wrong with the cache. A feed that meets one goes on without the cache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// A file of the keeper's could not be used.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Another keeper holds the life lock.
    #[error("{}: another cache keeper is running", live.display())]
    KeeperLives {
        /// Its life lock.
        live: PathBuf,
    },
    /// The keeper's socket could not be bound.
    #[error("{}: {reason}", socket.display())]
    Bind {
        /// The socket.
        socket: PathBuf,
        /// Why.
        reason: String,
    },
    /// The keeper could not be started.
    #[error("cannot start the cache keeper (`{command}`): {reason}")]
    Start {
        /// The command line.
        command: String,
        /// Why (the end of its log).
        reason: String,
    },
    /// The keeper's socket failed or said something unexpected.
    #[error("the cache keeper at {}: {reason}", socket.display())]
    Keeper {
        /// Its socket.
        socket: PathBuf,
        /// What happened.
        reason: String,
    },
}

/// The cache's key of a dataset: a digest of its format, its root (canonical), its samples'
/// names and sizes in index order (`Fingerprint`) and its length. The root is in it, unlike
/// a feed's identity: two copies of one dataset have different modification times, so each
/// would find the other's entries stale.
pub fn dataset_key(format: &str, root: &Path, fingerprint: (&str, &str), len: u64) -> String {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut fnv = ladle_datasets::fingerprint::Fnv::default();
    for part in [
        format.as_bytes(),
        root.as_os_str().as_encoded_bytes(),
        fingerprint.0.as_bytes(),
        fingerprint.1.as_bytes(),
    ] {
        fnv.write(part);
        fnv.write(&[0]);
    }
    fnv.write(&len.to_le_bytes());
    fnv.hex()
}

/// How a feed starts the keeper when none runs: `program args… cache keep --detach …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeeperStart {
    /// The registry directory.
    pub dir: PathBuf,
    /// The `ladle` program.
    pub program: PathBuf,
    /// Arguments before `cache` (`-m ladle` for a Python interpreter).
    pub args: Vec<OsString>,
    /// The budget, bytes, for a keeper this start makes (a running keeper keeps its own).
    pub budget: u64,
    /// Its idle timeout.
    pub idle_timeout: Duration,
    /// How long to wait for it.
    pub timeout: Duration,
}

impl KeeperStart {
    fn command_args(&self) -> Vec<OsString> {
        let mut args = self.args.clone();
        args.extend(
            [
                "cache".to_owned(),
                "keep".to_owned(),
                "--dir".to_owned(),
                self.dir.display().to_string(),
                "--budget-bytes".to_owned(),
                self.budget.to_string(),
                "--idle-timeout".to_owned(),
                format!("{}", self.idle_timeout.as_secs_f64()),
                "--detach".to_owned(),
            ]
            .map(OsString::from),
        );
        args
    }
}

/// The live keeper's entry in `start.dir`, starting one if none runs. Concurrent askers get
/// one keeper (a lock, not a race).
///
/// # Errors
/// [`CacheError`] naming the file or command at fault.
pub fn ensure(start: &KeeperStart) -> Result<KeeperEntry, CacheError> {
    let files = KeeperFiles::in_dir(&start.dir);
    let deadline = Instant::now() + start.timeout;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CacheError::Io { path, source }
    };
    let Some(_lock) =
        ladle_os::process::lock_file_wait(&files.lock, deadline).map_err(io(&files.lock))?
    else {
        return Err(CacheError::Start {
            command: "(another process is starting the keeper)".into(),
            reason: format!(
                "{} was held for {:.0} s",
                files.lock.display(),
                start.timeout.as_secs_f64()
            ),
        });
    };
    if let Some(entry) = live_entry(&files, deadline)? {
        if entry.budget != start.budget {
            tracing::info!(
                keeper_budget = entry.budget,
                asked = start.budget,
                "the running cache keeper keeps its own budget"
            );
        }
        return Ok(entry);
    }
    let args = start.command_args();
    let command = std::iter::once(start.program.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    tracing::info!(%command, "starting the cache keeper");
    let mut proc = ladle_os::Proc::spawn(
        "ladle cache keep --detach",
        std::process::Command::new(&start.program).args(&args),
    )
    .map_err(|e| CacheError::Start {
        command: command.clone(),
        reason: e.to_string(),
    })?;
    let status = proc.wait_until(Some(deadline), None).map_err(|_| {
        proc.kill();
        CacheError::Start {
            command: command.clone(),
            reason: format!("not ready within {:.0} s", start.timeout.as_secs_f64()),
        }
    })?;
    let out = proc.output().map_err(|e| CacheError::Start {
        command: command.clone(),
        reason: e.to_string(),
    })?;
    if !status.success() {
        return Err(CacheError::Start {
            command,
            reason: format!("{status}: {}", out.stderr.trim()),
        });
    }
    let line = out.stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|_| CacheError::Start {
        command,
        reason: format!("it answered {:?}, not its entry", out.stdout),
    })
}

/// The entry of the keeper that holds `files.live`, once it has published it.
fn live_entry(files: &KeeperFiles, deadline: Instant) -> Result<Option<KeeperEntry>, CacheError> {
    loop {
        if !files.keeper_lives()? {
            return Ok(None);
        }
        match KeeperEntry::read(&files.entry) {
            Ok(Some(entry)) => return Ok(Some(entry)),
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => return Ok(None),
        }
    }
}

/// An operator's connection to the keeper in `dir` (`ladle cache ls|drop`); `Ok(None)` when
/// no keeper runs there.
///
/// # Errors
/// [`CacheError::Keeper`] when it does not answer as a keeper.
pub fn operator(dir: &Path) -> Result<Option<Operator>, CacheError> {
    let files = KeeperFiles::in_dir(dir);
    if !files.keeper_lives()? {
        return Ok(None);
    }
    let socket = files.socket;
    let fail = |reason: String| CacheError::Keeper {
        socket: socket.clone(),
        reason,
    };
    let conn = UnixStream::connect(&socket).map_err(|e| fail(e.to_string()))?;
    let hello = wire::Ask::Hello {
        version: wire::KEEPER_VERSION,
        dataset: None,
        pid: std::process::id(),
    };
    let operator = Operator {
        conn,
        socket: socket.clone(),
    };
    match operator.ask(&hello)? {
        wire::Answer::Operator { .. } => Ok(Some(operator)),
        other => Err(fail(format!("answered {other:?} to an operator's Hello"))),
    }
}

/// A connection of `ladle cache ls|drop`.
#[derive(Debug)]
pub struct Operator {
    conn: UnixStream,
    socket: PathBuf,
}

impl Operator {
    fn ask(&self, ask: &wire::Ask) -> Result<wire::Answer, CacheError> {
        let fail = |reason: String| CacheError::Keeper {
            socket: self.socket.clone(),
            reason,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        ladle_ring::protocol::send(&self.conn, ask, &[]).map_err(|e| fail(e.to_string()))?;
        let (answer, _) = ladle_ring::protocol::recv_by::<wire::Answer>(&self.conn, deadline)
            .map_err(|e| fail(e.to_string()))?;
        match answer {
            wire::Answer::Refused { reason } => Err(fail(reason)),
            answer => Ok(answer),
        }
    }

    /// What the keeper holds.
    ///
    /// # Errors
    /// [`CacheError::Keeper`].
    pub fn list(&self) -> Result<Listing, CacheError> {
        match self.ask(&wire::Ask::List)? {
            wire::Answer::Listing(listing) => Ok(listing),
            other => Err(CacheError::Keeper {
                socket: self.socket.clone(),
                reason: format!("answered {other:?} to List"),
            }),
        }
    }

    /// Drops dataset `key` (or every dataset): its memory returns once its feeds let go.
    ///
    /// # Errors
    /// [`CacheError::Keeper`], naming a key it does not hold.
    pub fn drop_datasets(&self, key: Option<&str>) -> Result<(), CacheError> {
        self.ask(&wire::Ask::Drop {
            key: key.map(str::to_owned),
        })
        .map(|_| ())
    }
}
