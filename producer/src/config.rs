//! A producer's settings ([`ProducerConfig`]) and their defaults.

use std::path::PathBuf;
use std::time::Duration;

use ladle_datasets::pipeline::default_threads;
use ladle_datasets::transforms::Transforms;
use ladle_datasets::{BadSamplePolicy, SampleLimits};

pub(crate) use crate::pacing::Pacing;

/// The default [`ProducerConfig::stall_timeout`].
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`ProducerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Producer settings; `Default` gives a 256 MiB ring of 224×224 training samples.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// The control socket's path.
    pub socket: PathBuf,
    /// Bytes of shared memory for the ring.
    pub ring_bytes: u64,
    /// The transform pipeline of an image feed; its output size is the ring's image size.
    /// Unused by a [`CustomSource`](crate::CustomSource).
    pub augment: Transforms,
    /// Decode threads (for a [`CustomSource`](crate::CustomSource): its makers, one per thread).
    pub threads: usize,
    /// Seed of the permutations and the augmentation.
    pub seed: u64,
    /// What to do with samples that cannot be decoded.
    pub policy: BadSamplePolicy,
    /// How long a consumer may hold the feed back without taking a batch before the feed
    /// goes on without it (it rejoins when it resumes).
    pub stall_timeout: Duration,
    /// Connections served at once (admitted consumers and handshakes in progress); more are
    /// refused with a clear reason.
    pub max_connections: usize,
    /// When the feed stops by itself (after its last consumer left, or when none ever
    /// came); `Default`: never, it serves until stopped.
    pub lifetime: crate::Lifetime,
    /// How far ahead of its consumers the feed decodes.
    pub read_ahead: ReadAhead,
    /// Whether a consumer that keeps holding the others back is asked to skim.
    pub pacing: Pacing,
    /// What one sample of an image feed may cost (its file's bytes, its pixels); a sample
    /// above either is a bad sample. Unused by a [`CustomSource`](crate::CustomSource).
    pub limits: SampleLimits,
    /// The decoded-sample cache shared by every feed of the dataset (`ladle-cache`): how to
    /// reach its keeper, or start one. `None` (the default): no cache, every sample decoded.
    /// Only datasets whose files carry a stamp are cached (ImageFolder).
    pub cache: Option<ladle_cache::KeeperStart>,
}

/// How far ahead of what its consumers asked for a feed decodes: samples decoded beyond that
/// would wait in the ring, and be wasted if nobody reads them (the runs of a sweep end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAhead {
    /// Four batches of the largest batch size among the attached consumers, and at least
    /// [`READ_AHEAD_PER_THREAD`] samples per decode thread (so that every thread has work).
    #[default]
    Auto,
    /// This many samples beyond the furthest any consumer has asked for.
    Samples(u64),
    /// As far as the ring allows: every consumer's unread samples, up to the ring's
    /// capacity (what feeds did before protocol version 7).
    Ring,
}

/// [`ReadAhead::Auto`]'s floor per decode thread.
pub const READ_AHEAD_PER_THREAD: u64 = 16;

impl ReadAhead {
    /// The read-ahead in samples for consumers whose largest batch is `largest_batch`, on
    /// `threads` decode threads (`u64::MAX` for [`ReadAhead::Ring`]).
    pub fn samples(self, largest_batch: u64, threads: u64) -> u64 {
        match self {
            Self::Auto => (4 * largest_batch).max(READ_AHEAD_PER_THREAD * threads.max(1)),
            Self::Samples(n) => n.max(1),
            Self::Ring => u64::MAX,
        }
    }
}

impl std::str::FromStr for ReadAhead {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "ring" => Ok(Self::Ring),
            n => match n.parse::<u64>() {
                Ok(0) | Err(_) => Err(format!(
                    "read-ahead {n:?}: give a number of samples (at least 1), `auto` or `ring`"
                )),
                Ok(n) => Ok(Self::Samples(n)),
            },
        }
    }
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("ladle.sock"),
            ring_bytes: 256 << 20,
            augment: Transforms::train(224),
            threads: default_threads(),
            seed: 0,
            policy: BadSamplePolicy::Skip,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            lifetime: crate::Lifetime::default(),
            read_ahead: ReadAhead::Auto,
            pacing: Pacing::Skim,
            limits: SampleLimits::default(),
            cache: None,
        }
    }
}
