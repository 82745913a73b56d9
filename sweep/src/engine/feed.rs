//! The sweep's feed: a live one of the same dataset and transform, reused, or a new producer
//! started once the scheduler has the cores for it.

use super::*;

/// The sweep's feed: a live feed of the same dataset and transform that `scheduler` knows
/// (reused), or a new producer of `dataset` (once the scheduler has the cores for its
/// threads, when there are `runs_to_start`) registered with it. Returns the producer (none
/// for a reused feed), the feed's socket and its name.
#[allow(clippy::too_many_arguments)] // the pieces of the sweep's config the feed is made of
pub(super) fn open_feed(
    scheduler: &Scheduler,
    dataset_path: &Path,
    dataset: Box<dyn ladle_datasets::Dataset>,
    producer_config: ProducerConfig,
    feed_name: Option<String>,
    runs_to_start: bool,
    (stop, feed_stop): (&AtomicBool, &Arc<AtomicBool>),
    node: Option<&str>,
) -> Result<(Option<Producer>, PathBuf, String), SweepError> {
    let (dataset_key, transform) = (dataset_key(dataset_path), transform_key(&producer_config));
    // A live feed of the same dataset and transform serves this sweep as well as its own.
    let reuse = match scheduler.request(&Request::Feeds, "listing feeds")? {
        Response::Feeds { feeds, .. } => feeds
            .into_iter()
            .find(|f| f.dataset == dataset_key && f.transform == transform),
        _ => None,
    };
    if reuse.is_none() && runs_to_start {
        wait_for_cores(scheduler, producer_config.threads, stop, node)?;
    }
    Ok(if let Some(feed) = reuse {
        say(
            node,
            &format!(
                "reusing the live feed {:?} on {}",
                feed.name,
                feed.socket.display()
            ),
        );
        (None, feed.socket, feed.name)
    } else {
        let socket = producer_config.socket.clone();
        let threads = u32::try_from(producer_config.threads).unwrap_or(u32::MAX);
        let producer =
            Producer::start_with_stop(Arc::from(dataset), producer_config, feed_stop.clone())
                .map_err(|e| SweepError::Feed {
                    socket: socket.clone(),
                    detail: format!("cannot start: {e}"),
                })?;
        let feed_name = feed_name.unwrap_or_else(|| format!("sweep-{}", std::process::id()));
        scheduler.request(
            &Request::RegisterFeed(FeedSpec {
                name: feed_name.clone(),
                socket: socket.clone(),
                dataset: dataset_key,
                transform,
                threads,
                pid: std::process::id(),
                ring_bytes: producer.layout().file_len(),
            }),
            &format!("registering the feed {feed_name:?}"),
        )?;
        (Some(producer), socket, feed_name)
    })
}

/// A new feed needs `threads` cores: waits while the scheduler's feeds and jobs that state
/// `cpus` leave fewer free (a sweep of an existing feed never waits here). A feed wider than
/// the machine starts once nothing else holds cores.
pub(super) fn wait_for_cores(
    scheduler: &Scheduler,
    threads: usize,
    stop: &AtomicBool,
    node: Option<&str>,
) -> Result<(), SweepError> {
    let threads = u32::try_from(threads).unwrap_or(u32::MAX);
    let mut said = false;
    loop {
        let Response::Feeds {
            cpu_cores,
            cpus_busy,
            ..
        } = scheduler.request(&Request::Feeds, "listing feeds")?
        else {
            return Ok(());
        };
        if cpus_busy == 0 || cpus_busy.saturating_add(threads) <= cpu_cores {
            return Ok(());
        }
        if !said {
            say(
                node,
                &format!(
                    "waiting for cores: the new feed needs {threads}, {cpus_busy} of {cpu_cores} \
                     are taken by feeds and jobs"
                ),
            );
            said = true;
        }
        if stop.load(Ordering::SeqCst) {
            return Err(SweepError::Stopped("while waiting for cores for the feed"));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
