//! Joining a feed by naming its data: [`join`] is the Rust SDK's `ladle.Consumer(dataset=...)`.

use std::time::Instant;

use ladle_consumer::{ConnectError, Consumer, ConsumerConfig};

use crate::ensure::{EnsureError, Joined, Starter, ensure};
use crate::registry::Registry;
use crate::request::{FeedRequest, StartOptions};

/// Why a consumer could not join the feed of its request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// No feed could be found or started.
    #[error(transparent)]
    Ensure(#[from] EnsureError),
    /// The feed would not take this consumer.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The feed at a given socket serves something other than what was asked.
    #[error("{}: the feed there serves {name} {served:?}, but {asked:?} was asked for", socket.display())]
    Mismatch {
        /// The socket.
        socket: std::path::PathBuf,
        /// What differs: `dataset`, `transform` or `seed`.
        name: &'static str,
        /// What was asked.
        asked: String,
        /// What the feed serves.
        served: String,
    },
}

/// Whether a connect failed because the feed was going away as it was joined (its idle
/// timeout passed in between): then it is started again.
fn feed_was_going(error: &ConnectError) -> bool {
    match error {
        ConnectError::SocketMissing { .. } | ConnectError::NoProducer { .. } => true,
        ConnectError::Rejected { reason, .. } => reason == ladle_ring::protocol::STOPPING,
        // Its listener closed with this connection still in the queue.
        ConnectError::Protocol { source, .. } => match source {
            ladle_ring::ProtocolError::Closed => true,
            ladle_ring::ProtocolError::Io(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        },
        _ => false,
    }
}

/// Joins the live feed of `request` for this user on this node, starting it (with
/// `options`, by `starter`) if none runs; a feed that stops as it is joined is started again.
///
/// ```no_run
/// use ladle_feeds::{FeedRequest, Registry, StartOptions, Starter, join};
/// use ladle_consumer::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let request = FeedRequest::new("data/cifar10".as_ref(), "RandomCrop(32, padding=4), RandomHorizontalFlip()".into(), 0)?;
/// let config = ConsumerConfig { batch_size: 128, ..ConsumerConfig::default() };
/// let (consumer, _feed) = join(&Registry::open()?, &request, &StartOptions::default(), &Starter::find(None)?, config)?;
/// for batch in consumer.epoch() {
///     let _images = batch?.images();
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`JoinError`]: the registry, the start or the connect, each naming its file or socket.
pub fn join(
    registry: &Registry,
    request: &FeedRequest,
    options: &StartOptions,
    starter: &Starter,
    config: ConsumerConfig,
) -> Result<(Consumer, Joined), JoinError> {
    let deadline = Instant::now() + options.start_timeout;
    loop {
        let joined = ensure(registry, request, options, starter)?;
        match Consumer::connect(&joined.entry.socket, config.clone()) {
            Ok(consumer) => {
                check(&consumer, request)?;
                return Ok((consumer, joined));
            }
            Err(error) if feed_was_going(&error) && Instant::now() < deadline => {
                tracing::info!(socket = %joined.entry.socket.display(), "the feed stopped as it was joined: starting it again");
                // Wait for it to be gone: its life lock is free the moment it exits.
                let live = registry.files(&joined.entry.key).live;
                let free = ladle_os::process::lock_file_wait(&live, deadline)
                    .map_err(|source| EnsureError::Io { path: live, source })?;
                drop(free);
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Checks that `consumer`'s feed serves `request` (for a consumer given both a socket and a
/// dataset).
///
/// # Errors
/// [`JoinError::Mismatch`], naming the first difference.
pub fn check(consumer: &Consumer, request: &FeedRequest) -> Result<(), JoinError> {
    match request.difference(consumer.identity()) {
        None => Ok(()),
        Some((name, asked, served)) => Err(JoinError::Mismatch {
            socket: consumer.socket().to_path_buf(),
            name,
            asked,
            served,
        }),
    }
}
