//! The consumer's settings, and the environment a run of a feed is started with.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::ConnectError;
use crate::plan::GroupSpec;

/// The environment variable that holds a feed's control socket: `ladle sweep` sets it for
/// every run (as does the scheduler for a job of a feed).
/// [`Consumer::connect_from_env`](crate::Consumer::connect_from_env) connects to it, and
/// `ladle consume` and the Python `ladle.Consumer` use it when given no socket.
pub const SOCKET_ENV: &str = "LADLE_SOCKET";

/// The environment variable that holds a run's name: `ladle sweep` sets it for every run.
/// When it is set and not empty, [`ConsumerConfig::default`] takes it as the consumer's
/// [`name`](ConsumerConfig::name), so the producer's logs say which run is which.
pub const RUN_ENV: &str = "LADLE_RUN";

/// The environment variable that makes a consumer wait for its feed's socket to appear:
/// seconds (e.g. `60`). `ladle sweep` sets it for its runs, whose feed may still be starting
/// (a node of a Slurm sweep). When it is set, [`ConsumerConfig::default`] takes it as the
/// [`connect_timeout`](ConsumerConfig::connect_timeout); unset, empty or not a number of
/// seconds (a warning says so), a missing socket stays an immediate error.
pub const CONNECT_TIMEOUT_ENV: &str = "LADLE_CONNECT_TIMEOUT";

/// The default [`ConsumerConfig::group_timeout`].
pub const DEFAULT_GROUP_TIMEOUT: Duration = Duration::from_secs(600);

/// How a consumer reads: its batch size, whether it drops the partial last batch, and how
/// many batches it may hold at once. `Default` gives batches of 32, the partial batch kept,
/// and the name `$LADLE_RUN` ([`RUN_ENV`]) or else `consumer-<pid>`.
///
/// ```
/// use ladle_consumer::ConsumerConfig;
/// let config = ConsumerConfig { batch_size: 128, drop_last: true, ..ConsumerConfig::default() };
/// assert_eq!(config.max_batches_held, 8);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Samples per batch, `1..=capacity/2` of the producer's ring.
    pub batch_size: u32,
    /// Skip the last, partial batch of each epoch.
    pub drop_last: bool,
    /// A name for the producer's logs (default `$LADLE_RUN` when set and not empty, else
    /// `consumer-<pid>`).
    pub name: String,
    /// The most batches this consumer may hold at once; asking for one more is
    /// [`ConsumerError::TooManyBatchesHeld`](crate::ConsumerError::TooManyBatchesHeld).
    pub max_batches_held: usize,
    /// How long connecting, saying `Hello` and receiving the producer's `Welcome` may take in
    /// all, once the socket exists (default 10 s): one deadline, however slowly the answer
    /// trickles in. It also bounds the reading of any later frame that has begun to arrive.
    pub handshake_timeout: Duration,
    /// How long [`Consumer::connect`](crate::Consumer::connect) waits for a socket that
    /// does not exist yet (default: `$LADLE_CONNECT_TIMEOUT` seconds, see
    /// [`CONNECT_TIMEOUT_ENV`], else zero: a missing socket is an immediate error). A socket
    /// that exists with no producer behind it is always an immediate error.
    pub connect_timeout: Duration,
    /// The DDP job this consumer is one rank of (default: none, whole epochs). The ranks
    /// of a group split each epoch: every rank gets the same number of samples, disjoint
    /// apart from [`Even::Pad`](crate::plan::Even)'s repeats, together the whole epoch
    /// (`crate::plan`). [`Consumer::connect`](crate::Consumer::connect) returns once every
    /// rank has joined.
    pub group: Option<GroupSpec>,
    /// How many ranks of [`ConsumerConfig::group`] run on this node, and so join this node's
    /// feed, which waits for them only (protocol 15). `None` (the default): the launcher's
    /// variables, `$LOCAL_WORLD_SIZE` (torchrun) then Slurm's tasks on this node, else the
    /// world size (every rank on one feed); see [`crate::launch`].
    pub local_world_size: Option<u32>,
    /// How long a rank of a group waits at connect for the others (default 10 minutes, at
    /// most an hour): then [`ConnectError::GroupIncomplete`](crate::ConnectError) names the
    /// missing ranks.
    pub group_timeout: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            batch_size: 32,
            drop_last: false,
            name: default_name(std::env::var_os(RUN_ENV).as_deref()),
            max_batches_held: 8,
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: connect_timeout(std::env::var_os(CONNECT_TIMEOUT_ENV).as_deref()),
            group: None,
            local_world_size: None,
            group_timeout: DEFAULT_GROUP_TIMEOUT,
        }
    }
}

/// The default connect timeout, given the value of [`CONNECT_TIMEOUT_ENV`]: that many
/// seconds when it is a non-negative number, else zero (with a warning unless unset or empty).
fn connect_timeout(value: Option<&OsStr>) -> Duration {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Duration::ZERO;
    };
    let text = value.to_string_lossy();
    match text
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
    {
        Some(timeout) => timeout,
        None => {
            tracing::warn!(
                "{CONNECT_TIMEOUT_ENV}={text:?} is not a number of seconds: not waiting for the socket"
            );
            Duration::ZERO
        }
    }
}

/// The default consumer name, given the value of [`RUN_ENV`]: that value when set and not
/// empty (a name that is not UTF-8 is converted lossily; it only labels logs), else
/// `consumer-<pid>`.
fn default_name(run: Option<&OsStr>) -> String {
    match run {
        Some(run) if !run.is_empty() => run.to_string_lossy().into_owned(),
        _ => format!("consumer-{}", std::process::id()),
    }
}

/// The socket named by the value of [`SOCKET_ENV`]; unset or empty is
/// [`ConnectError::NoSocket`].
pub(crate) fn socket_from_env(value: Option<&OsStr>) -> Result<PathBuf, ConnectError> {
    match value {
        Some(socket) if !socket.is_empty() => Ok(PathBuf::from(socket)),
        _ => Err(ConnectError::NoSocket {
            variable: SOCKET_ENV,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_name_is_the_run_name_when_one_is_set() {
        assert_eq!(default_name(Some(OsStr::new("lr-0.1"))), "lr-0.1");
        let fallback = format!("consumer-{}", std::process::id());
        assert_eq!(default_name(Some(OsStr::new(""))), fallback);
        assert_eq!(default_name(None), fallback);
    }

    #[test]
    fn the_connect_timeout_comes_from_the_variable_in_seconds_and_garbage_waits_not() {
        assert_eq!(connect_timeout(None), Duration::ZERO);
        assert_eq!(connect_timeout(Some(OsStr::new(""))), Duration::ZERO);
        assert_eq!(
            connect_timeout(Some(OsStr::new("60"))),
            Duration::from_secs(60)
        );
        assert_eq!(
            connect_timeout(Some(OsStr::new(" 0.5 "))),
            Duration::from_millis(500)
        );
        for bad in ["-1", "soon", "inf", "NaN"] {
            assert_eq!(
                connect_timeout(Some(OsStr::new(bad))),
                Duration::ZERO,
                "{bad}"
            );
        }
    }

    #[test]
    fn an_unset_or_empty_socket_variable_is_no_socket_naming_it() {
        assert_eq!(
            socket_from_env(Some(OsStr::new("/run/feed.sock"))).ok(),
            Some(PathBuf::from("/run/feed.sock"))
        );
        for value in [None, Some(OsStr::new(""))] {
            let error = socket_from_env(value).err();
            assert!(
                matches!(
                    error,
                    Some(ConnectError::NoSocket {
                        variable: "LADLE_SOCKET"
                    })
                ),
                "{error:?}"
            );
            assert!(error.is_some_and(|e| e.to_string().starts_with("LADLE_SOCKET is not set")));
        }
    }
}
