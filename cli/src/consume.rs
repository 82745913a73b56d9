//! `ladle consume`: a consumer that reads epochs from a running producer and reports, per
//! epoch, throughput and whether every dataset index arrived exactly once. Use it to try a
//! producer out, or to stand in for a training job (`--step-ms` emulates its step time). It
//! exits non-zero when an epoch's coverage is not exact (an index twice, one missing, one
//! outside the dataset, or an epoch that ended short), after reporting every epoch; an epoch
//! cut short by `--seconds` is incomplete, not inexact.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use ladle_consumer::prelude::*;
use ladle_consumer::{Even, GroupSpec, SavedPosition};

use crate::records::{ConsumeSummary, EpochRecord, Record};

#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// The producer's control socket (default: $LADLE_SOCKET, which `ladle sweep` sets for
    /// every run; or --dataset).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    #[command(flatten)]
    ask: crate::feeds::AskArgs,
    /// Samples per batch (at most half the producer's ring).
    #[arg(long, value_name = "B", default_value_t = 32)]
    batch_size: u32,
    /// Epochs to read (default: 1, or unlimited with --seconds).
    #[arg(long, value_name = "E")]
    epochs: Option<u64>,
    /// Stop after this many seconds (at the next batch boundary); an unfinished epoch is
    /// reported with "complete": false.
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// Skip each epoch's last, partial batch.
    #[arg(long)]
    drop_last: bool,
    /// Print one JSON object per line: one per epoch, then a summary.
    #[arg(long)]
    json: bool,
    /// A name for the producer's logs (default: $LADLE_RUN, which `ladle sweep` sets for
    /// every run, else `consumer-<pid>`).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Milliseconds to sleep per batch while holding it, to emulate a training step.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    step_ms: u64,
    /// Keep the previous batch until the next one arrives, as a Python loop that keeps
    /// `prev = batch` does (two batches held at a time).
    #[arg(long)]
    hold_previous: bool,
    /// Keep each epoch's first batch until the epoch ends, as a loop that keeps an example
    /// batch for logging does. It stops gating the feed once this consumer skims; if the feed
    /// then overwrites it, it counts in `overwritten_batches` (and `--check-held` checks that
    /// it said so).
    #[arg(long)]
    keep_first: bool,
    /// Hash every batch when it arrives and again just before it is dropped, and count
    /// batches whose contents changed while held although the producer had not let this
    /// consumer go (`corrupted_batches` in the summary; must be 0). Costs a pass over each
    /// batch.
    #[arg(long)]
    check_held: bool,
    /// Read as one rank of a group (a DDP job): the group's ranks split each epoch, each
    /// getting the same number of samples; `ladle consume` returns once this node's ranks
    /// have joined.
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// This consumer's rank in --group, 0..W [default: $RANK, else $SLURM_PROCID].
    #[arg(long, value_name = "R", requires = "group")]
    rank: Option<u32>,
    /// Ranks in --group [default: $WORLD_SIZE, else $SLURM_NTASKS].
    #[arg(long, value_name = "W", requires = "group")]
    world_size: Option<u32>,
    /// Ranks of --group on this node, which this node's feed serves and waits for (a job
    /// over several nodes runs a feed per node, each decoding its ranks' shares only)
    /// [default: $LOCAL_WORLD_SIZE, else Slurm's tasks on this node, else W].
    #[arg(long, value_name = "L", requires = "group", value_parser = clap::value_parser!(u32).range(1..))]
    local_world_size: Option<u32>,
    /// How a group evens out N samples over W ranks: `pad` gives each ceil(N/W), repeating
    /// the epoch's first samples (torch's DistributedSampler), `drop` gives each floor(N/W).
    #[arg(long, value_name = "HOW", default_value = "pad", requires = "group")]
    even: Even,
    /// Seconds a rank waits for the others of its group before it gives up, naming them.
    #[arg(long, value_name = "S", default_value_t = 600.0, requires = "group")]
    group_timeout: f64,
    /// Continue from a position saved with --save-position: the epoch in progress delivers
    /// exactly the samples it had not delivered.
    #[arg(long, value_name = "FILE")]
    resume: Option<PathBuf>,
    /// Save this consumer's position to FILE after every batch (written to a temporary file
    /// and renamed over FILE, so a killed process leaves the last whole one).
    #[arg(long, value_name = "FILE")]
    save_position: Option<PathBuf>,
    /// Append one JSON line per epoch to FILE, `{"epoch": K, "indices": [...]}` in delivery
    /// order (to check what a group's ranks read together, say).
    #[arg(long, value_name = "FILE")]
    record_indices: Option<PathBuf>,
}

/// Appends epoch `epoch`'s indices to `path` as one JSON line.
fn record_indices(path: &Path, epoch: u64, indices: &[u64]) -> anyhow::Result<()> {
    use std::io::Write;
    let line = serde_json::json!({ "epoch": epoch, "indices": indices });
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    writeln!(file, "{line}").with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `position` to `path` atomically: a temporary file beside it, renamed over it.
fn save_position(consumer: &Consumer, path: &Path) -> anyhow::Result<()> {
    let bytes = consumer.position().encode();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// A digest of a batch's fields and indices.
fn digest(batch: &Batch<'_>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for field in batch.fields() {
        field.bytes.hash(&mut hasher);
    }
    batch.indices().hash(&mut hasher);
    hasher.finish()
}

/// Which dataset indices one epoch delivered.
struct Coverage {
    /// One bit per dataset index.
    seen: Vec<u64>,
    len: u64,
    delivered: u64,
    /// An index delivered twice, or outside `0..len`.
    broken: bool,
}

impl Coverage {
    fn new(len: u64) -> anyhow::Result<Self> {
        let words = usize::try_from(len.div_ceil(64)).context("dataset too large to track")?;
        Ok(Self {
            seen: vec![0; words],
            len,
            delivered: 0,
            broken: false,
        })
    }

    fn add(&mut self, indices: &[u64]) {
        self.delivered += indices.len() as u64;
        for &index in indices {
            if index >= self.len {
                self.broken = true;
                continue;
            }
            let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
            if self.seen[word] & bit != 0 {
                self.broken = true;
            }
            self.seen[word] |= bit;
        }
    }

    /// No duplicates, nothing out of range, and `expected` delivered (so, without drop_last,
    /// every index exactly once).
    fn exact(&self, expected: u64) -> bool {
        !self.broken && self.delivered == expected
    }
}

fn per_second(samples: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        samples as f64 / seconds
    } else {
        0.0
    }
}

/// Joins the feed `args` names (or `$LADLE_SOCKET` names) as a consumer configured by
/// `args`, resumed from `--resume` if given, and says so unless `--json`.
fn join(args: &ConsumeArgs) -> anyhow::Result<Consumer> {
    let mut config = ConsumerConfig {
        batch_size: args.batch_size,
        drop_last: args.drop_last,
        ..ConsumerConfig::default()
    };
    if let Some(name) = args.name.clone() {
        config.name = name;
    }
    if let Some(name) = args.group.clone() {
        use ladle_consumer::launch;
        let env = launch::process_env;
        let rank = launch::rank(args.rank, env)?;
        let world_size = launch::world_size(args.world_size, env)?;
        let (Some((rank, _)), Some((world_size, _))) = (rank, world_size) else {
            anyhow::bail!(
                "--group {name}: pass --rank and --world-size, or start the ranks with torchrun \
                 (it sets $RANK and $WORLD_SIZE) or as srun tasks ($SLURM_PROCID, $SLURM_NTASKS)"
            );
        };
        config.group = Some(GroupSpec {
            name,
            rank,
            world_size,
            even: args.even,
        });
        config.local_world_size = args.local_world_size;
        config.group_timeout = Duration::try_from_secs_f64(args.group_timeout)
            .context("--group-timeout must be a non-negative number of seconds")?;
    }
    // Connection errors name the socket and say what to check. Without --socket, the run's
    // environment names it (`ladle sweep` sets LADLE_SOCKET and LADLE_RUN).
    let request = args.ask.request()?;
    let from_env = std::env::var_os(ladle_consumer::SOCKET_ENV).filter(|s| !s.is_empty());
    let consumer = match (&args.socket, request) {
        // Named by its data, with no socket given: the registry's feed, started if need be.
        (None, Some(request)) if from_env.is_none() => {
            let registry = ladle_feeds::Registry::open()?;
            let options = args.ask.start_options()?;
            let (consumer, joined) = ladle_feeds::join(
                &registry,
                &request,
                &options,
                &crate::feeds::starter()?,
                config,
            )?;
            {
                eprintln!(
                    "{} feed {} (pid {}) of {}",
                    if joined.started { "started" } else { "found" },
                    joined.entry.key,
                    joined.entry.pid,
                    request.dataset.display()
                );
            }
            consumer
        }
        // A socket and the data: that socket, if it serves that data.
        (socket, Some(request)) => {
            let socket = socket
                .clone()
                .or_else(|| from_env.map(PathBuf::from))
                .context("a socket")?;
            let consumer = Consumer::connect(&socket, config)?;
            ladle_feeds::check(&consumer, &request)?;
            consumer
        }
        (Some(socket), None) => Consumer::connect(socket, config)?,
        (None, None) => Consumer::connect_from_env(config).map_err(|e| match e {
            ConnectError::NoSocket { variable } => anyhow::anyhow!(
                "no producer socket: pass --dataset PATH (the node's feed of it, started if \
                 none runs), --socket PATH, or set {variable} (`ladle sweep` sets it for every run)"
            ),
            other => other.into(),
        })?,
    };
    if let Some(path) = &args.resume {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let position = SavedPosition::decode_for(&bytes, consumer.dataset().len)
            .with_context(|| format!("reading {}", path.display()))?;
        consumer
            .load_position(&position)
            .with_context(|| format!("resuming from {}", path.display()))?;
    }
    if !args.json {
        eprintln!(
            "joined {} as consumer {} ({}): {} samples of `{}` from {}, batches of {}",
            consumer.socket().display(),
            consumer.consumer_id(),
            consumer.config().name,
            consumer.dataset().len,
            consumer.schema(),
            consumer.dataset().source,
            args.batch_size,
        );
    }
    Ok(consumer)
}

pub(crate) fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let consumer = join(&args)?;
    let dataset = consumer.dataset();
    let step = Duration::from_millis(args.step_ms);
    let started = Instant::now();
    let mut total_samples = 0u64;
    let mut total_bad = 0u64;
    // Batches the producer overwrote while this consumer held them (after a let-go, or kept
    // while it skims).
    let mut overwritten = 0u64;
    // Batches whose contents changed while held without a let-go: a broken ring.
    let mut corrupted = 0u64;
    let epochs = args
        .epochs
        .unwrap_or(if args.seconds.is_some() { u64::MAX } else { 1 });
    let deadline = args
        .seconds
        .map(|s| started + Duration::from_secs_f64(s.max(0.0)));
    let out_of_time = || deadline.is_some_and(|d| Instant::now() >= d);
    let mut finished_epochs = 0u64;
    // Epochs that ended (not cut short by --seconds) without exact coverage.
    let mut inexact = Vec::new();
    for _ in 0..epochs {
        if out_of_time() {
            break;
        }
        let epoch = consumer.epoch();
        let number = epoch.number();
        let expected = consumer.epoch_samples();
        let epoch_started = Instant::now();
        let mut coverage = Coverage::new(dataset.len)?;
        let mut batches = 0u64;
        let mut bad = 0u64;
        let mut previous: Option<(Batch<'_>, u64)> = None;
        let mut kept: Option<(Batch<'_>, u64)> = None;
        let mut cut_short = false;
        let mut delivered = Vec::new();
        let mut check = |batch: &Batch<'_>, received: u64| {
            if args.check_held && digest(batch) != received && batch.is_intact() {
                corrupted += 1;
            }
        };
        for batch in epoch {
            let batch = batch.with_context(|| format!("reading epoch {number}"))?;
            // Indices first, as soon as the batch is handed out: a batch is a view of the
            // ring, and a process stopped while it reads (hashing the images takes
            // milliseconds) past the stall timeout may find its slots overwritten after the
            // let-go (`is_intact` then says so). The SDK marks them seen at the same moment.
            coverage.add(batch.indices());
            if args.record_indices.is_some() {
                delivered.extend_from_slice(batch.indices());
            }
            if let Some(path) = &args.save_position {
                save_position(&consumer, path)?;
            }
            let received = if args.check_held { digest(&batch) } else { 0 };
            bad += batch.bad_count() as u64;
            batches += 1;
            if !step.is_zero() {
                std::thread::sleep(step);
            }
            let keep = args.keep_first && kept.is_none();
            if !batch.is_intact() && !keep {
                overwritten += 1;
            }
            if keep {
                kept = Some((batch, received));
            } else if args.hold_previous {
                if let Some((old, received)) = previous.replace((batch, received)) {
                    check(&old, received);
                }
            } else {
                check(&batch, received);
                drop(batch);
            }
            if out_of_time() {
                cut_short = true;
                break;
            }
        }
        if let Some((old, received)) = previous.take() {
            check(&old, received);
        }
        if let Some((first, received)) = kept.take() {
            check(&first, received);
            overwritten += u64::from(!first.is_intact());
        }
        total_bad += bad;
        if let Some(path) = &args.record_indices {
            record_indices(path, number, &delivered)?;
        }
        let elapsed = epoch_started.elapsed();
        let complete = coverage.delivered >= expected;
        finished_epochs += u64::from(complete);
        let samples = coverage.delivered;
        total_samples += samples;
        let exact = complete && coverage.exact(expected);
        if !exact && (complete || !cut_short) {
            inexact.push(number);
        }
        let rate = per_second(samples, elapsed);
        if args.json {
            EpochRecord {
                bad_samples: bad,
                batches,
                complete,
                consumer_id: consumer.consumer_id(),
                epoch: number,
                exact_coverage: exact,
                samples,
                samples_per_s: rate,
                seconds: elapsed.as_secs_f64(),
                start_seq: consumer.start_seq(),
            }
            .print()?;
        } else {
            println!(
                "epoch {number}: {samples} samples in {batches} batches, {:.3} s, {rate:.0} samples/s, coverage {}{}",
                elapsed.as_secs_f64(),
                if exact { "exact" } else { "NOT exact" },
                if bad > 0 {
                    format!(", {bad} bad samples (zero images, label -1)")
                } else {
                    String::new()
                },
            );
        }
    }
    // Done as asked (its epochs, or --seconds): a rank leaves without breaking its group. An
    // error above drops it instead, which breaks a rank's group mid-epoch.
    consumer.close();
    let rate = per_second(total_samples, started.elapsed());
    if args.json {
        ConsumeSummary {
            bad_samples: total_bad,
            corrupted_batches: corrupted,
            epochs: finished_epochs,
            overwritten_batches: overwritten,
            rejoins: consumer.rejoins(),
            samples: total_samples,
            samples_per_s: rate,
            seconds: started.elapsed().as_secs_f64(),
            waited_s: consumer.waited().as_secs_f64(),
            skims: consumer.skims(),
        }
        .print()?;
    } else {
        println!(
            "read {finished_epochs} epochs, {total_samples} samples, {rate:.0} samples/s overall"
        );
        if total_bad > 0 || consumer.rejoins() > 0 {
            println!(
                "{total_bad} bad samples; let go and rejoined {} times; {overwritten} batches \
                 overwritten while held",
                consumer.rejoins()
            );
        }
    }
    if !inexact.is_empty() {
        anyhow::bail!(
            "coverage was not exact in epoch(s) {inexact:?} from {}: some dataset index arrived \
             twice, not at all, or from outside the dataset",
            consumer.socket().display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_is_exact_only_for_each_index_once() {
        let mut full = Coverage::new(100).unwrap();
        full.add(&(0..60).collect::<Vec<_>>());
        full.add(&(60..100).rev().collect::<Vec<_>>());
        assert!(full.exact(100));

        let mut duplicate = Coverage::new(100).unwrap();
        duplicate.add(&(0..99).collect::<Vec<_>>());
        duplicate.add(&[5]);
        assert!(!duplicate.exact(100));

        let mut outside = Coverage::new(100).unwrap();
        outside.add(&(1..100).collect::<Vec<_>>());
        outside.add(&[100]);
        assert!(!outside.exact(100));

        // drop_last: 96 of 100 delivered, none twice.
        let mut dropped = Coverage::new(100).unwrap();
        dropped.add(&(4..100).collect::<Vec<_>>());
        assert!(dropped.exact(96));
        assert!(!dropped.exact(100));
    }
}
