//! The consumer's settings.

use std::time::Duration;

/// How a consumer reads: its batch size, whether it drops the partial last batch, and how
/// many batches it may hold at once. `Default` gives batches of 32, the partial batch kept.
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
    /// A name for the producer's logs (default `consumer-<pid>`).
    pub name: String,
    /// The most batches this consumer may hold at once; asking for one more is
    /// [`ConsumerError::TooManyBatchesHeld`](crate::ConsumerError::TooManyBatchesHeld).
    pub max_batches_held: usize,
    /// How long the producer may take to answer `Hello` (default 10 s).
    pub handshake_timeout: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            batch_size: 32,
            drop_last: false,
            name: format!("consumer-{}", std::process::id()),
            max_batches_held: 8,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}
