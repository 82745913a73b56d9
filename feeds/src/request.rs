//! What a process asks for when it names its data: the feed's identity (dataset, transform,
//! seed), its key in the registry, and the options the feed is started with if none runs.
//! Pure: no file is touched here but the dataset path's canonical form.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ladle_ring::protocol::{FeedIdentity, PROTOCOL_VERSION};
use serde::{Deserialize, Serialize};

/// A feed's identity as a consumer names it: every consumer that asks for equal requests on
/// one node, as one user, reads the same feed. The image size is part of the transform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedRequest {
    /// The dataset, as a canonical absolute path (links resolved), or a URL as written, so
    /// that `data/`, `./data`
    /// and a link to it name one feed.
    pub dataset: PathBuf,
    /// The transform pipeline in its canonical spelling (as `ladle serve --transform` takes
    /// it and a feed's identity shows it).
    pub transform: String,
    /// Seed of the epoch permutations and the augmentation.
    pub seed: u64,
}

/// Why a request cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The dataset path does not resolve (missing, or a component unreadable).
    #[error("dataset {}: {source}", path.display())]
    Dataset {
        /// The path as given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A feed's name in the registry: 16 hex digits of FNV-1a 64 over its request and the
/// control protocol's version (installs that cannot talk to each other get separate feeds).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FeedKey(pub String);

impl std::fmt::Display for FeedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl FeedRequest {
    /// The request for `dataset` (made canonical here), `transform` (already canonical: the
    /// caller spells it through `ladle_datasets::transforms::Transforms`'s `Display`) and
    /// `seed`.
    ///
    /// # Errors
    /// [`RequestError::Dataset`] when the path does not resolve.
    pub fn new(dataset: &Path, transform: String, seed: u64) -> Result<Self, RequestError> {
        // A dataset by URL is named as written (its feed's shard cache folder is too).
        let url = dataset.to_str().filter(|d| ladle_os::fs::is_url(d));
        let dataset = match url {
            Some(_) => dataset.to_path_buf(),
            None => dataset
                .canonicalize()
                .map_err(|source| RequestError::Dataset {
                    path: dataset.into(),
                    source,
                })?,
        };
        Ok(Self {
            dataset,
            transform,
            seed,
        })
    }

    /// This request's key in the registry.
    pub fn key(&self) -> FeedKey {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes.iter().chain(&[0u8]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        eat(&PROTOCOL_VERSION.to_le_bytes());
        eat(self.dataset.as_os_str().as_encoded_bytes());
        eat(self.transform.as_bytes());
        eat(&self.seed.to_le_bytes());
        FeedKey(format!("{h:016x}"))
    }

    /// The first field in which the feed of `identity` differs from this request, as
    /// `(name, asked, served)`; `None` when it serves what was asked. The dataset is compared
    /// by canonical path.
    pub fn difference(&self, identity: &FeedIdentity) -> Option<(&'static str, String, String)> {
        let served = Path::new(&identity.source);
        let served = served.canonicalize().unwrap_or_else(|_| served.into());
        [
            (
                "dataset",
                self.dataset.display().to_string(),
                served.display().to_string(),
            ),
            (
                "transform",
                self.transform.clone(),
                identity.transform.clone(),
            ),
            ("seed", self.seed.to_string(), identity.seed.to_string()),
        ]
        .into_iter()
        .find(|(_, asked, served)| asked != served)
    }
}

/// How a feed started on demand runs: the first asker's options win, later askers join
/// whatever runs.
#[derive(Debug, Clone, PartialEq)]
pub struct StartOptions {
    /// The feed stops this long after its last consumer (or holder) left.
    pub idle_timeout: Duration,
    /// The feed stops this long after its start if no consumer ever joined (its starter died
    /// before connecting, say).
    pub orphan_timeout: Duration,
    /// Shared memory for its ring, in MiB (`None`: `ladle serve`'s default).
    pub ring_mib: Option<u64>,
    /// Decode threads (`None`: all cores).
    pub threads: Option<usize>,
    /// How long an asker waits for a feed to start (a large dataset is listed and
    /// fingerprinted first) or for another asker's start.
    pub start_timeout: Duration,
}

/// [`StartOptions::idle_timeout`]'s default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// [`StartOptions::orphan_timeout`]'s default.
pub const DEFAULT_ORPHAN_TIMEOUT: Duration = Duration::from_secs(60);
/// [`StartOptions::start_timeout`]'s default.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(300);

impl Default for StartOptions {
    fn default() -> Self {
        Self {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            orphan_timeout: DEFAULT_ORPHAN_TIMEOUT,
            ring_mib: None,
            threads: None,
            start_timeout: DEFAULT_START_TIMEOUT,
        }
    }
}

/// The `ladle serve` arguments that start the feed of `request` in the registry (without
/// `--detach`, which the starter adds).
pub fn serve_args(request: &FeedRequest, options: &StartOptions) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "serve".into(),
        "--registry".into(),
        "--dataset".into(),
        request.dataset.clone().into(),
        "--transform".into(),
        request.transform.clone().into(),
        "--seed".into(),
        request.seed.to_string().into(),
        "--idle-timeout".into(),
        options.idle_timeout.as_secs_f64().to_string().into(),
        "--orphan-timeout".into(),
        options.orphan_timeout.as_secs_f64().to_string().into(),
    ];
    if let Some(mib) = options.ring_mib {
        args.extend(["--ring-mib".into(), mib.to_string().into()]);
    }
    if let Some(threads) = options.threads {
        args.extend(["--threads".into(), threads.to_string().into()]);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_by_url_is_named_as_written_and_matches_a_feed_serving_that_url() {
        let url = "https://data.example/train/index.json";
        let request = FeedRequest::new(Path::new(url), "t".into(), 1).unwrap();
        assert_eq!(request.dataset, Path::new(url));
        assert_eq!(request.difference(&identity(url, "t", 1)), None);
        let other = FeedRequest::new(Path::new("s3://b/train/index.json"), "t".into(), 1);
        assert_ne!(other.unwrap().key(), request.key());
        // A path that merely contains "://" later is still a path (and must exist).
        assert!(FeedRequest::new(Path::new("./no/such:/x://y"), "t".into(), 1).is_err());
    }

    fn identity(source: &str, transform: &str, seed: u64) -> FeedIdentity {
        FeedIdentity {
            source: source.into(),
            len: 10,
            classes: String::new(),
            seed,
            transform: transform.into(),
            schema: String::new(),
            files: String::new(),
            sizes: String::new(),
        }
    }

    #[test]
    fn one_dataset_however_spelled_has_one_key_and_a_seed_or_transform_changes_it() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::os::unix::fs::symlink(&data, dir.path().join("link")).unwrap();
        let t = "RandomCrop(32), RandomHorizontalFlip()".to_owned();
        let a = FeedRequest::new(&data, t.clone(), 0).unwrap();
        let b = FeedRequest::new(&dir.path().join("link/"), t.clone(), 0).unwrap();
        let c = FeedRequest::new(&dir.path().join("data/../data"), t.clone(), 0).unwrap();
        assert_eq!(a.key(), b.key());
        assert_eq!(a.key(), c.key());
        assert_eq!(a.key().0.len(), 16);
        assert_ne!(
            a.key(),
            FeedRequest::new(&data, t.clone(), 1).unwrap().key()
        );
        assert_ne!(
            a.key(),
            FeedRequest::new(&data, "CenterCrop(32)".into(), 0)
                .unwrap()
                .key()
        );
        let missing = FeedRequest::new(&dir.path().join("nope"), t, 0).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
    }

    #[test]
    fn a_request_names_its_first_difference_from_a_feed() {
        let dir = tempfile::tempdir().unwrap();
        let t = "CenterCrop(32)";
        let asked = FeedRequest::new(dir.path(), t.into(), 3).unwrap();
        let source = dir.path().display().to_string();
        assert_eq!(asked.difference(&identity(&source, t, 3)), None);
        assert_eq!(
            asked.difference(&identity(&source, t, 0)),
            Some(("seed", "3".into(), "0".into()))
        );
        let other = asked.difference(&identity("/elsewhere", t, 3)).unwrap();
        assert_eq!(other.0, "dataset");
        assert_eq!(
            asked
                .difference(&identity(&source, "CenterCrop(64)", 3))
                .unwrap()
                .0,
            "transform"
        );
    }

    #[test]
    fn the_serve_command_carries_the_identity_and_the_lifetimes() {
        let request = FeedRequest {
            dataset: "/d".into(),
            transform: "CenterCrop(8)".into(),
            seed: 7,
        };
        let options = StartOptions {
            idle_timeout: Duration::from_millis(1500),
            ring_mib: Some(64),
            ..StartOptions::default()
        };
        let args: Vec<String> = serve_args(&request, &options)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let joined = args.join(" ");
        assert!(
            joined.starts_with("serve --registry --dataset /d --transform CenterCrop(8) --seed 7 --idle-timeout 1.5 --orphan-timeout 60"),
            "{joined}"
        );
        assert!(joined.ends_with("--ring-mib 64"), "{joined}");
    }
}
