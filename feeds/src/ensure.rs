//! Finding the live feed of a request, or starting it: one feed per identity, however many
//! processes ask at once.
//!
//! An asker takes `K.lock`, then looks at `K.live` and `K.json`: a feed that holds its life
//! lock and serves the request is joined; a stale entry is removed; else the feed is started
//! with `ladle serve --registry --detach`, which returns once the feed has bound its socket
//! and published its entry, and the lock is let go. The feed itself runs in a session of its
//! own, reparented away from its starter: a job launcher that kills its worker's children or
//! process group (Ray, joblib, Slurm steps) does not take the feed with it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::registry::{Entry, FeedFiles, Registry};
use crate::request::{FeedRequest, StartOptions, serve_args};

/// How to run `ladle` to start a feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Starter {
    /// The program.
    pub program: PathBuf,
    /// Arguments before `serve` (`-m ladle` when the program is a Python interpreter).
    pub args: Vec<OsString>,
}

/// The variable that names the `ladle` binary feeds are started with.
pub const BIN_ENV: &str = "LADLE_BIN";

impl Starter {
    /// `program` with no arguments of its own.
    pub fn program(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
        }
    }

    /// The `ladle` to start feeds with: `$LADLE_BIN`, else `fallback` (the running binary, or
    /// the Python package's command), else `ladle` on `PATH`.
    ///
    /// # Errors
    /// [`EnsureError::NoLadle`] when none of them is there.
    pub fn find(fallback: Option<Starter>) -> Result<Self, EnsureError> {
        if let Some(bin) = std::env::var_os(BIN_ENV).filter(|b| !b.is_empty()) {
            return Ok(Self::program(bin));
        }
        if let Some(fallback) = fallback {
            return Ok(fallback);
        }
        let on_path = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("ladle"))
                .find(|p| p.is_file())
        });
        on_path.map(Self::program).ok_or(EnsureError::NoLadle)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command
    }

    fn describe(&self, args: &[OsString]) -> String {
        std::iter::once(self.program.as_os_str())
            .chain(self.args.iter().map(OsString::as_os_str))
            .chain(args.iter().map(OsString::as_os_str))
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Why no feed could be found or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnsureError {
    /// The registry cannot be used.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    /// A registry file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another asker held the start lock for the whole start timeout.
    #[error("{}: another process has been starting this feed for {:.0} s; see its log {}", lock.display(), waited.as_secs_f64(), log.display())]
    Busy {
        /// The start lock.
        lock: PathBuf,
        /// The feed's log.
        log: PathBuf,
        /// How long this asker waited.
        waited: Duration,
    },
    /// No `ladle` to start a feed with.
    #[error(
        "no `ladle` command to start the feed with: set {BIN_ENV} to the ladle binary, or install the ladle package (pip install ladle) or put `ladle` on PATH"
    )]
    NoLadle,
    /// The starter could not be run.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: ladle_os::ProcError,
    },
    /// The feed did not come up.
    #[error("`{command}` failed ({status}): {stderr}")]
    StartFailed {
        /// The command line.
        command: String,
        /// How it ended.
        status: String,
        /// What it said (the end of the feed's log).
        stderr: String,
    },
    /// The starter's answer was not an entry.
    #[error("`{command}` answered something that is not a feed entry: {answer:?}")]
    BadAnswer {
        /// The command line.
        command: String,
        /// What it printed.
        answer: String,
    },
    /// A live feed of another request holds this request's key (a hash collision, or a
    /// registry written by another build).
    #[error("{}: the live feed under this key serves {other:?}, not {asked:?}", entry.display())]
    KeyCollision {
        /// The entry.
        entry: PathBuf,
        /// What was asked.
        asked: Box<FeedRequest>,
        /// What the feed serves.
        other: Box<FeedRequest>,
    },
}

/// A feed found or started.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    /// Its registry entry (its socket, pid, options).
    pub entry: Entry,
    /// Whether this call started it.
    pub started: bool,
}

/// How often an asker looks again while a feed it found alive has not published its entry.
const LOOK: Duration = Duration::from_millis(10);

/// The live feed of `request` in `registry`, started with `starter` and `options` if none
/// runs. Concurrent askers of one request get one feed.
///
/// # Errors
/// [`EnsureError`], naming the file, lock or command at fault.
pub fn ensure(
    registry: &Registry,
    request: &FeedRequest,
    options: &StartOptions,
    starter: &Starter,
) -> Result<Joined, EnsureError> {
    let key = request.key();
    let files = registry.files(&key);
    let asked = Instant::now();
    let deadline = asked + options.start_timeout;
    let io = |path: &PathBuf| {
        let path = path.clone();
        move |source| EnsureError::Io { path, source }
    };
    let Some(_lock) =
        ladle_os::process::lock_file_wait(&files.lock, deadline).map_err(io(&files.lock))?
    else {
        return Err(EnsureError::Busy {
            lock: files.lock,
            log: files.log,
            waited: asked.elapsed(),
        });
    };
    if let Some(entry) = live_entry(&files, request, deadline)? {
        return Ok(Joined {
            entry,
            started: false,
        });
    }
    if Entry::read(&files.entry).ok().flatten().is_some() {
        tracing::info!(entry = %files.entry.display(), "removing the entry of a feed that is gone");
        std::fs::remove_file(&files.entry).map_err(io(&files.entry))?;
    }
    let entry = start(&files, request, options, starter, deadline)?;
    Ok(Joined {
        entry,
        started: true,
    })
}

/// The entry of the live feed at `files`, if one serves `request`; waits (until `deadline`)
/// for a live feed that has not published its entry yet (one being started by hand).
fn live_entry(
    files: &FeedFiles,
    request: &FeedRequest,
    deadline: Instant,
) -> Result<Option<Entry>, EnsureError> {
    loop {
        let live = ladle_os::process::is_locked(&files.live).map_err(|source| EnsureError::Io {
            path: files.live.clone(),
            source,
        })?;
        if !live {
            return Ok(None);
        }
        match Entry::read(&files.entry) {
            Ok(Some(entry)) if entry.request == *request => return Ok(Some(entry)),
            Ok(Some(entry)) => {
                return Err(EnsureError::KeyCollision {
                    entry: files.entry.clone(),
                    asked: Box::new(request.clone()),
                    other: Box::new(entry.request),
                });
            }
            // Alive, entry not written yet (or being removed as it stops): look again.
            Ok(None) | Err(_) if Instant::now() < deadline => std::thread::sleep(LOOK),
            Ok(None) | Err(_) => return Ok(None),
        }
    }
}

/// Starts the feed and returns its entry.
fn start(
    files: &FeedFiles,
    request: &FeedRequest,
    options: &StartOptions,
    starter: &Starter,
    deadline: Instant,
) -> Result<Entry, EnsureError> {
    let mut args = serve_args(request, options);
    args.push("--detach".into());
    let command = starter.describe(&args);
    tracing::info!(%command, "starting a feed");
    let mut proc = ladle_os::Proc::spawn("ladle serve --detach", starter.command().args(&args))
        .map_err(|source| EnsureError::Spawn {
            command: command.clone(),
            source,
        })?;
    let status = match proc.wait_until(Some(deadline), None) {
        Ok(status) => status,
        Err(_) => {
            proc.kill();
            let log = std::fs::read_to_string(&files.log).unwrap_or_default();
            return Err(EnsureError::StartFailed {
                command,
                status: format!(
                    "not ready within {:.0} s",
                    options.start_timeout.as_secs_f64()
                ),
                stderr: tail(&log),
            });
        }
    };
    let out = proc.output().map_err(|source| EnsureError::Spawn {
        command: command.clone(),
        source,
    })?;
    if !status.success() {
        return Err(EnsureError::StartFailed {
            command,
            status: status.to_string(),
            stderr: tail(&out.stderr),
        });
    }
    let line = out.stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|_| EnsureError::BadAnswer {
        command,
        answer: out.stdout.clone(),
    })
}

/// The last lines of a log, for an error message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.trim_end().lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}
