//! The feed's decoded-sample cache (`ladle-cache`): which datasets it takes, and its key.

use std::sync::Arc;

use ladle_cache::{CacheClient, KeeperStart, wire::DatasetKey};
use ladle_datasets::{Dataset, Fingerprint};

/// The cache client of `dataset`, attached at once so that the log says whether the cache is
/// on; `None` for a dataset whose files carry no stamp (only ImageFolder's do: CIFAR's
/// records are raw pixels, a WebDataset's members are not files).
pub(crate) fn client(
    dataset: &dyn Dataset,
    data: &Fingerprint,
    start: &KeeperStart,
    threads: usize,
) -> Option<Arc<CacheClient>> {
    if dataset.is_empty() || !matches!(dataset.stamp(0), Ok(Some(_))) {
        tracing::info!(
            "the decoded-sample cache takes ImageFolder datasets only; {} is decoded every time",
            dataset.root().display()
        );
        return None;
    }
    let key = DatasetKey {
        key: ladle_cache::dataset_key(
            &format!("{:?}", dataset.format()),
            dataset.root(),
            (&data.files, &data.sizes),
            dataset.len(),
        ),
        root: dataset.root().display().to_string(),
        len: dataset.len(),
    };
    let client = Arc::new(CacheClient::new(start.clone(), key, threads));
    if let Err(e) = client.attach_now() {
        tracing::warn!("{e}");
    }
    Some(client)
}
