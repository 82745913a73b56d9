//! The registry: one private directory per user and node, with a few files per live feed,
//! named by the feed's key `K`:
//!
//! | file | who writes it | what it says |
//! |---|---|---|
//! | `K.lock` | an asker, while it looks and starts | one start at a time (`flock`) |
//! | `K.live` | the feed, for its whole life | the feed is alive (`flock`; the kernel drops it when the feed dies, however it dies) |
//! | `K.json` | the feed, once its socket is bound | the [`Entry`]: socket, pid, request |
//! | `K.sock` | the feed | its control socket |
//! | `K.hold` | drivers (`ladle.feed(...)`) | held shared: keep the feed while a driver owns it |
//! | `K.log` | the feed | its log (stderr) |
//!
//! An entry whose `K.live` nobody holds is stale and is replaced by the next asker: no pid is
//! guessed at.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::request::{FeedKey, FeedRequest};

/// Sets the registry's directory (tests, or a node whose `/tmp` is shared).
pub const REGISTRY_ENV: &str = "LADLE_REGISTRY_DIR";

/// Where the registry lives, from the environment: `$LADLE_REGISTRY_DIR`; else
/// `$XDG_RUNTIME_DIR/ladle` when `XDG_RUNTIME_DIR` is an absolute directory of ours
/// (`ours(dir)`); else `/tmp/ladle-$UID`. Under Slurm (`$SLURMD_NODENAME` set) a `node-NAME`
/// folder is added below the last two: nodes may share `/tmp`, and a job's environment may
/// carry another node's `XDG_RUNTIME_DIR`.
pub fn locate(
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
    uid: u32,
    ours: impl Fn(&Path) -> bool,
) -> PathBuf {
    if let Some(dir) = env(REGISTRY_ENV).filter(|d| !d.is_empty()) {
        return dir.into();
    }
    let base = env("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && ours(d))
        .map_or_else(
            || PathBuf::from(format!("/tmp/ladle-{uid}")),
            |d| d.join("ladle"),
        );
    match env("SLURMD_NODENAME").filter(|n| !n.is_empty()) {
        Some(node) => {
            let mut name = std::ffi::OsString::from("node-");
            name.push(node);
            base.join(name)
        }
        None => base,
    }
}

/// [`locate`] from this process's environment, uid and file system.
fn located() -> PathBuf {
    let uid = ladle_os::process::my_uid();
    locate(
        |k| std::env::var_os(k),
        uid,
        |d| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid)
        },
    )
}

/// Why the registry cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A directory of it is not private to this user (or cannot be made).
    #[error("the feed registry {0}; set {REGISTRY_ENV} to a directory of your own to use another")]
    Dir(#[from] ladle_os::fs::PrivateDirError),
    /// A feed's socket there would be longer than a Unix socket's path may be.
    #[error(
        "the feed registry {}: a socket under it would be {len} bytes, over the limit of {max}; set {REGISTRY_ENV} to a shorter path",
        dir.display()
    )]
    TooLong {
        /// The registry.
        dir: PathBuf,
        /// The socket path's length.
        len: usize,
        /// The longest a socket path may be.
        max: usize,
    },
}

/// The longest path a Unix socket may be bound at (`sun_path` less its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The registry of this user's live feeds on this node.
#[derive(Debug, Clone)]
pub struct Registry {
    dir: PathBuf,
}

/// The files of one feed in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedFiles {
    /// Askers' start lock.
    pub lock: PathBuf,
    /// The feed's life lock.
    pub live: PathBuf,
    /// Drivers' holds.
    pub hold: PathBuf,
    /// The entry.
    pub entry: PathBuf,
    /// The control socket.
    pub socket: PathBuf,
    /// The feed's log.
    pub log: PathBuf,
}

impl Registry {
    /// The registry where the environment says ([`locate`]), made private to this user if it
    /// does not exist yet, checked if it does.
    ///
    /// # Errors
    /// [`RegistryError`] naming the directory and what is wrong with it.
    pub fn open() -> Result<Self, RegistryError> {
        let dir = located();
        Self::open_at(dir)
    }

    /// The registry where the environment says, if it exists (checked as by
    /// [`Registry::open`]); `Ok(None)` when nothing made it yet. For readers that must not
    /// create it (the scheduler).
    ///
    /// # Errors
    /// As [`Registry::open`], for a directory that exists.
    pub fn existing() -> Result<Option<Self>, RegistryError> {
        let dir = located();
        if std::fs::symlink_metadata(&dir).is_err() {
            return Ok(None);
        }
        Self::open_at(dir).map(Some)
    }

    /// The registry in `dir` (made or checked as by [`Registry::open`]; its parent is made
    /// private too when it is one this registry made, the `/tmp/ladle-$UID` of a Slurm
    /// node's folder).
    ///
    /// # Errors
    /// As [`Registry::open`].
    pub fn open_at(dir: PathBuf) -> Result<Self, RegistryError> {
        if let Some(parent) = dir.parent()
            && dir
                .file_name()
                .is_some_and(|n| n.as_encoded_bytes().starts_with(b"node-"))
        {
            ladle_os::fs::private_dir(parent)?;
        }
        ladle_os::fs::private_dir(&dir)?;
        let registry = Self { dir };
        let len = registry
            .files(&FeedKey("0".repeat(16)))
            .socket
            .as_os_str()
            .len();
        if len > MAX_SOCKET_PATH {
            return Err(RegistryError::TooLong {
                dir: registry.dir,
                len,
                max: MAX_SOCKET_PATH,
            });
        }
        Ok(registry)
    }

    /// The registry's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The files of the feed `key`.
    pub fn files(&self, key: &FeedKey) -> FeedFiles {
        let file = |ext: &str| self.dir.join(format!("{key}.{ext}"));
        FeedFiles {
            lock: file("lock"),
            live: file("live"),
            hold: file("hold"),
            entry: file("json"),
            socket: file("sock"),
            log: file("log"),
        }
    }

    /// Every entry in the registry, with whether its feed is alive, by key.
    pub fn entries(&self) -> Vec<(Entry, bool)> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut found: Vec<(Entry, bool)> = dir
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| Entry::read(&e.path()).ok().flatten())
            .map(|entry| {
                let live =
                    ladle_os::process::is_locked(&self.files(&entry.key).live).unwrap_or(false);
                (entry, live)
            })
            .collect();
        found.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        found
    }

    /// The entries of live feeds.
    pub fn live(&self) -> Vec<Entry> {
        (self.entries().into_iter())
            .filter_map(|(e, live)| live.then_some(e))
            .collect()
    }
}

/// A live feed as the registry records it: written by the feed once its socket is bound,
/// read by askers, `ladle feeds`, the scheduler and Python.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// This record's format ([`ENTRY_VERSION`]).
    pub version: u32,
    /// The feed's key.
    pub key: FeedKey,
    /// What it serves.
    pub request: FeedRequest,
    /// Its control socket.
    pub socket: PathBuf,
    /// Its process.
    pub pid: u32,
    /// Its process's start time (clock ticks since boot), so that a reused pid is not taken
    /// for it.
    pub start_ticks: u64,
    /// When it started, seconds since the Unix epoch.
    pub started_unix: f64,
    /// Seconds it stays after its last consumer left.
    pub idle_timeout_s: f64,
    /// Seconds it stays after its start if no consumer ever joins.
    pub orphan_timeout_s: f64,
    /// Decode threads.
    pub threads: u32,
    /// Its ring's size in bytes.
    pub ring_bytes: u64,
    /// Its log.
    pub log: PathBuf,
    /// The ladle version that runs it.
    pub ladle_version: String,
}

/// [`Entry::version`] of this build.
pub const ENTRY_VERSION: u32 = 1;

impl Entry {
    /// Reads the entry at `path`; `Ok(None)` when there is none (or it is being replaced).
    ///
    /// # Errors
    /// When the file cannot be read or is not an entry.
    pub fn read(path: &Path) -> std::io::Result<Option<Self>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the entry at `path` whole: to a temporary file beside it, renamed over it, so a
    /// reader never sees half of one.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn publish(&self, path: &Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }

    /// The feed's process, if it still runs (its pid with the start time recorded).
    pub fn process(&self) -> ladle_os::process::ProcessId {
        ladle_os::process::ProcessId::new(self.pid, self.start_ticks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<std::ffi::OsString> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).into())
    }

    #[test]
    fn the_registry_is_xdg_runtime_only_when_it_is_ours_else_tmp_uid_and_per_slurm_node() {
        let yes = |_: &Path| true;
        let no = |_: &Path| false;
        let xdg = [("XDG_RUNTIME_DIR", "/run/user/7")];
        assert_eq!(
            locate(env(&xdg), 7, yes),
            PathBuf::from("/run/user/7/ladle")
        );
        assert_eq!(locate(env(&xdg), 7, no), PathBuf::from("/tmp/ladle-7"));
        assert_eq!(
            locate(env(&[("XDG_RUNTIME_DIR", "relative")]), 7, yes),
            PathBuf::from("/tmp/ladle-7")
        );
        assert_eq!(locate(env(&[]), 9, yes), PathBuf::from("/tmp/ladle-9"));
        let slurm = [
            ("XDG_RUNTIME_DIR", "/run/user/7"),
            ("SLURMD_NODENAME", "n2"),
        ];
        assert_eq!(
            locate(env(&slurm), 7, no),
            PathBuf::from("/tmp/ladle-7/node-n2")
        );
        let set = [(REGISTRY_ENV, "/x/reg"), ("SLURMD_NODENAME", "n2")];
        assert_eq!(locate(env(&set), 7, yes), PathBuf::from("/x/reg"));
    }

    #[test]
    fn an_entry_is_published_whole_and_read_back_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open_at(dir.path().join("reg")).unwrap();
        let key = FeedKey("0123456789abcdef".into());
        let files = registry.files(&key);
        assert_eq!(Entry::read(&files.entry).unwrap(), None);
        let entry = Entry {
            version: ENTRY_VERSION,
            key: key.clone(),
            request: FeedRequest {
                dataset: "/d".into(),
                transform: "CenterCrop(8)".into(),
                seed: 1,
            },
            socket: files.socket.clone(),
            pid: std::process::id(),
            start_ticks: 1,
            started_unix: 2.0,
            idle_timeout_s: 30.0,
            orphan_timeout_s: 60.0,
            threads: 2,
            ring_bytes: 1 << 20,
            log: files.log.clone(),
            ladle_version: "x".into(),
        };
        entry.publish(&files.entry).unwrap();
        assert_eq!(Entry::read(&files.entry).unwrap(), Some(entry.clone()));
        // Nobody holds its life lock: listed, not live.
        assert_eq!(registry.entries(), vec![(entry.clone(), false)]);
        let live = ladle_os::process::lock_file(&files.live).unwrap().unwrap();
        assert_eq!(registry.live(), vec![entry]);
        drop(live);
        assert!(registry.live().is_empty());
    }

    #[test]
    fn a_registry_path_too_long_for_a_socket_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let long = dir.path().join("r".repeat(100));
        let err = Registry::open_at(long).unwrap_err();
        assert!(matches!(err, RegistryError::TooLong { .. }), "{err}");
        assert!(err.to_string().contains(REGISTRY_ENV), "{err}");
    }
}
