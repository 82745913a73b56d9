//! # ladle-feeds: feeds that come when called
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate sits beside the consumer SDK, between a
//! training process and the producer it needs: a process names its data (a [`FeedRequest`]:
//! dataset, transform, seed) and [`join`](fn@join)s the live feed of that identity for this user on
//! this node, or starts one if none runs (`ladle serve --registry`, a process of its own that
//! outlives its starter). The [`Registry`] of live feeds is a directory private to the user
//! (`$XDG_RUNTIME_DIR/ladle`, else `/tmp/ladle-$UID`); `ladle feeds`, the Python package
//! (`ladle.Consumer(dataset=...)`, `ladle.feed(...)`) and the scheduler read it.
//!
//! - [`request`]: the identity, its key, the options a feed is started with (pure).
//! - [`registry`]: where the registry is, its files per feed, the [`Entry`] a feed publishes.
//! - [`ensure`](mod@ensure): one feed per identity however many ask at once (a lock, not a
//!   race), a dead feed's entry replaced.
//! - [`join`](mod@join): ensure, then connect; a feed that stops as it is joined is started
//!   again.
//!
//! A feed started this way stops [`request::DEFAULT_IDLE_TIMEOUT`] after its last consumer
//! left, and [`request::DEFAULT_ORPHAN_TIMEOUT`] after its start if no consumer ever
//! joined; a driver that owns it holds it with `K.hold`. It depends on [`ladle_os`],
//! [`ladle_ring`]'s protocol types and [`ladle_consumer`], never on the producer or the
//! decoders: the transform's canonical spelling is the caller's (the CLI and the Python
//! package make it with `ladle_datasets`).
//!
//! ```no_run
//! use ladle_feeds::{Registry, FeedRequest, StartOptions, Starter, ensure};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let request = FeedRequest::new("data/cifar10".as_ref(), "CenterCrop(32)".into(), 0)?;
//! let feed = ensure(&Registry::open()?, &request, &StartOptions::default(), &Starter::find(None)?)?;
//! println!("{} serves on {}", feed.entry.pid, feed.entry.socket.display());
//! # Ok(())
//! # }
//! ```

pub mod ensure;
pub mod join;
pub mod registry;
pub mod request;

pub use ensure::{EnsureError, Joined, Starter, ensure};
pub use join::{JoinError, check, join};
pub use registry::{Entry, FeedFiles, Registry, RegistryError};
pub use request::{FeedKey, FeedRequest, StartOptions};
