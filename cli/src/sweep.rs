//! `ladle sweep`: a hyper-parameter sweep as consumers of one feed, each run admitted by a
//! scheduler; `--shard K/N` runs one part of the grid; `--slurm` runs the grid over a Slurm
//! allocation (one feed and one scheduler per node, see `crate::slurm`).
//!
//! A shell over `ladle_sweep`: it parses the options, turns them into an
//! [`engine::SweepConfig`], handles signals and prints the report. The first Ctrl-C or
//! SIGTERM cancels every run and stops the feed and the private scheduler; a second kills the
//! runs' process groups at once.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use ladle_observe::report::SweepReport;
use ladle_sweep::engine::{self, FeedSource, Prices, SchedulerChoice, StopFlags, SweepConfig};
use ladle_sweep::grid::{self, PlannedRun, Shard};
use ladle_sweep::slurm::{self, NodeEnv};

use crate::scheduler::DaemonOptions;
use crate::serve::FeedOptions;

#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    pub(crate) feed: FeedOptions,
    #[command(flatten)]
    pub(crate) daemon: DaemonOptions,
    #[command(flatten)]
    pub(crate) observe: crate::observe::ObserveArgs,
    /// Use the running scheduler daemon of this state directory (default: the one `ladle
    /// scheduler` uses, if it is running; else the sweep starts a private one).
    #[arg(long, value_name = "DIR")]
    scheduler_dir: Option<PathBuf>,
    /// Start a private scheduler for the sweep even if one is running.
    #[arg(long, conflicts_with = "scheduler_dir")]
    private_scheduler: bool,
    /// The sweep's directory: the runs' logs, each run's record as it ends (`runs.jsonl`),
    /// the report (`report.json`), and on one machine the feed's socket and the private
    /// scheduler's state (default: `./ladle-sweep-UNIXTIME`). Under `--slurm` it must be on
    /// a file system every node sees.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// The name the feed registers under with the scheduler (default: sweep-PID).
    #[arg(long, value_name = "NAME")]
    feed_name: Option<String>,
    /// Device memory each run needs per GPU (as `ladle submit --gpu-mem`). Without it the
    /// first run is measured and the others are packed by its peak.
    #[arg(long)]
    gpu_mem: Option<String>,
    /// GPUs each run needs at once, all under the same admission and MPS rules (a `torchrun
    /// --nproc_per_node 2` run: 2). The run gets their UUIDs in CUDA_VISIBLE_DEVICES.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) gpus_per_run: u32,
    /// The family the runs' measured memory is shared under (as `ladle submit --family`;
    /// default: the command with its arguments' values left out).
    #[arg(long, value_name = "NAME")]
    family: Option<String>,
    /// More runs: one per non-empty line, its whitespace-separated words appended to the
    /// command (`#` starts a comment line).
    #[arg(long, value_name = "FILE")]
    grid: Option<PathBuf>,
    /// Print the end report as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Price of one CPU core-hour, for the cost in the report.
    #[arg(long, value_name = "USD")]
    price_cpu_hour: Option<f64>,
    /// Price of one GPU-hour, for the cost in the report.
    #[arg(long, value_name = "USD")]
    price_gpu_hour: Option<f64>,
    /// Run only shard K of N of the grid (`0/4` … `3/4`): runs K, K+N, K+2N, … (interleaved,
    /// so every shard gets a similar mix), keeping their names (`run-05` stays `run-05`).
    /// `ladle report --merge DIR…` merges the shards' directories into one report.
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    shard: Option<Shard>,
    /// Run only these runs of the grid (comma-separated names, `run-01,run-04`), before
    /// sharding: what `--resume` passes.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// Seconds cancelled runs get (SIGTERM: time to checkpoint) before their process groups
    /// are killed (default: 15; 10 under Slurm, inside its default KillWait of 30 s; at most
    /// 3600). Under Slurm keep it under the site's KillWait (`scontrol show config`), after
    /// which Slurm kills the runs itself.
    #[arg(long, value_name = "S", value_parser = parse_stop_grace)]
    stop_grace: Option<f64>,
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
    /// The command of every run, after `--`; an argument holding `{a,b,c}` makes one run per
    /// value (all such arguments: their cartesian product). Quote it from the shell:
    /// `ladle sweep --dataset D -- python train.py --lr '{0.1,0.01}' --bs '{32,64}'`.
    #[arg(last = true, required_unless_present = "resume")]
    pub(crate) command: Vec<String>,
}

fn parse_stop_grace(s: &str) -> Result<f64, String> {
    let max = ladle_scheduler::protocol::MAX_CANCEL_GRACE_S;
    match s.parse::<f64>() {
        Ok(v) if (0.0..=max).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds from 0 to {max}")),
    }
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    s.parse()
        .map_err(|e: ladle_sweep::SweepError| e.to_string())
}

/// The grid's runs, named, after `--only` and `--shard`.
pub(crate) fn planned(args: &SweepArgs, shard: Shard) -> anyhow::Result<Vec<PlannedRun>> {
    let all = all_runs(args)?;
    let chosen = grid::select(all, &args.only)?;
    Ok(shard.take(&chosen))
}

/// Every run of the grid, named.
pub(crate) fn all_runs(args: &SweepArgs) -> anyhow::Result<Vec<PlannedRun>> {
    let grid = args
        .grid
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("--grid {}", p.display())))
        .transpose()?;
    Ok(grid::expand(&args.command, grid.as_deref())?)
}

/// The signals: the first asks for a clean stop, a second for an immediate one.
pub(crate) fn stop_flags() -> anyhow::Result<StopFlags> {
    let flags = StopFlags::default();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let (stop, hurry) = (flags.stop.clone(), flags.hurry.clone());
    std::thread::Builder::new()
        .name("ladle-sweep-signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                if stop.swap(true, Ordering::SeqCst) {
                    hurry.store(true, Ordering::SeqCst);
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(flags)
}

fn seconds(arg: Option<f64>, default: f64, name: &str) -> anyhow::Result<Duration> {
    let s = arg.unwrap_or(default);
    Duration::try_from_secs_f64(s).with_context(|| format!("{name} {s} is not a number of seconds"))
}

#[derive(Debug, Args)]
pub(crate) struct SlurmArgs {
    /// Run the sweep over a Slurm allocation: one feed and one scheduler per node, the grid
    /// split over the nodes. Writes a batch script into the sweep's directory (--out, which
    /// every node must see), submits it with sbatch, follows the job and prints the merged
    /// report. Ctrl-C asks whether to scancel the job.
    #[arg(long)]
    pub(crate) slurm: bool,
    /// Nodes of the allocation (--slurm).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "slurm")]
    pub(crate) nodes: u32,
    /// GPUs per node (--slurm): `--gres=gpu:G`.
    #[arg(long, value_name = "G", conflicts_with = "gres", requires = "slurm")]
    pub(crate) gpus_per_node: Option<u32>,
    /// The nodes' generic resources as sbatch takes them (--slurm), e.g. `gpu:a100:4`.
    #[arg(long, value_name = "SPEC", requires = "slurm")]
    pub(crate) gres: Option<String>,
    /// One more sbatch option, as is (repeatable): `--slurm-arg=--partition=gpu
    /// --slurm-arg=--time=2:00:00`; account, qos, `--requeue`, …
    #[arg(
        long,
        value_name = "ARG",
        allow_hyphen_values = true,
        requires = "slurm"
    )]
    pub(crate) slurm_arg: Vec<String>,
    /// Print the batch script (also written into the sweep directory) and exit: edit it and
    /// submit it with sbatch yourself if you like.
    #[arg(long, requires = "slurm")]
    pub(crate) slurm_dry_run: bool,
    /// On Ctrl-C or SIGTERM, cancel the job (scancel) without asking.
    #[arg(long)]
    pub(crate) cancel_on_exit: bool,
    /// Submit again the runs of a `--slurm` sweep directory that did not succeed (lost with
    /// a node, failed, cancelled), into the same directory.
    #[arg(long, value_name = "DIR", conflicts_with = "command")]
    pub(crate) resume: Option<PathBuf>,
    /// What the batch script runs on each node: the node's shard of the grid, from Slurm's
    /// environment (SLURM_NODEID, SLURM_NNODES, SLURMD_NODENAME, the allocated GPUs), with
    /// its own scheduler; node-local state under ${TMPDIR:-/tmp}/ladle-JOBID-NODE.
    #[arg(long, conflicts_with = "slurm")]
    pub(crate) slurm_node: bool,
}

impl SlurmArgs {
    /// Whether this `ladle sweep` submits to Slurm (`--slurm`, `--resume`): `crate::slurm`'s
    /// work, not a sweep of this machine's.
    pub(crate) fn submits(&self) -> bool {
        self.slurm || self.resume.is_some()
    }
}

/// Under Slurm: the node's scheduler sees only the GPUs Slurm gave the node.
pub(crate) fn allocate_gpus(
    options: &crate::scheduler::DaemonOptions,
    config: &mut ladle_scheduler::daemon::DaemonConfig,
) -> anyhow::Result<()> {
    allocate_gpus_from(options.simulated(), config, |k| std::env::var(k).ok())
}

/// [`allocate_gpus`] with the environment read through `get`.
fn allocate_gpus_from(
    simulated: bool,
    config: &mut ladle_scheduler::daemon::DaemonConfig,
    get: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<()> {
    let allocation = ladle_scheduler::allocation::allocation_from_env(get);
    match allocation {
        Ok(Some(gpus)) => config.allocated = Some(gpus),
        // Simulated GPUs need no grant from Slurm: the node simulates --sim-gpus of them.
        Ok(None) | Err(ladle_scheduler::allocation::AllocationError::NoSlurmGpus { .. })
            if simulated => {}
        Err(e) => {
            return Err(e).context("reading the GPUs Slurm allocated to this node");
        }
        Ok(None) => bail!(
            "Slurm allocated no GPU to this node (no SLURM_JOB_GPUS or GPU UUIDs in \
             CUDA_VISIBLE_DEVICES): submit with --gpus-per-node G or --gres gpu:G"
        ),
    }
    Ok(())
}

pub(crate) fn run(args: SweepArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.slurm.submits() {
        bail!("--slurm and --resume go to `crate::slurm::submit`, not here");
    }
    if args.slurm.cancel_on_exit {
        bail!("--cancel-on-exit cancels a Slurm job: it goes with --slurm or --resume DIR");
    }
    let cwd = std::env::current_dir().context("current directory")?;
    let node = if args.slurm.slurm_node {
        if args.scheduler_dir.is_some() {
            bail!("--scheduler-dir: a node of a Slurm sweep always runs its own scheduler");
        }
        let node = NodeEnv::from_env(|k| std::env::var(k).ok())?;
        for dir in node.remove_stale_local_dirs() {
            eprintln!(
                "ladle sweep [{}]: removed {}, left by an earlier job's sweep on this node",
                node.node,
                dir.display()
            );
        }
        Some(node)
    } else {
        None
    };
    let shard = match (&node, args.shard) {
        (Some(node), _) => node.shard,
        (None, shard) => shard.unwrap_or(Shard::WHOLE),
    };
    let runs = planned(&args, shard)?;
    let base = args
        .out
        .clone()
        .unwrap_or_else(|| ladle_sweep::ledger::default_out(&cwd));
    let (out, state) = match &node {
        Some(node) => (
            slurm::node_job_dir(&base, &node.node, &node.job_id),
            node.local_dir().map_err(anyhow::Error::from)?,
        ),
        None => (base.clone(), base.clone()),
    };
    for dir in [&out, &state] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let out = out.canonicalize().unwrap_or(out);
    let state = state.canonicalize().unwrap_or(state);
    let flags = stop_flags()?;

    let mut daemon = args.daemon.config(state.join("scheduler"))?;
    let scheduler = match (&node, &args.scheduler_dir) {
        (Some(_), _) => {
            // Under Slurm: the node's own scheduler over the GPUs Slurm gave it, job logs on
            // the shared file system, and runs killed when the node's sweep stops.
            daemon.log_dir = Some(out.join("logs"));
            daemon.stop_jobs = Some(Duration::from_secs(2));
            allocate_gpus(&args.daemon, &mut daemon)?;
            SchedulerChoice::Private(Box::new(daemon))
        }
        (None, Some(dir)) => SchedulerChoice::Running(dir.clone()),
        (None, None) if args.private_scheduler => SchedulerChoice::Private(Box::new(daemon)),
        (None, None) => match (crate::scheduler::DirArg { dir: None }).resolve() {
            Ok(dir) => SchedulerChoice::PreferRunning {
                dir,
                private: Box::new(daemon),
            },
            Err(_) => SchedulerChoice::Private(Box::new(daemon)),
        },
    };
    let mut args = args;
    if let (Some(node), Some(record)) = (&node, &args.observe.record) {
        // Each node records on its own (its feed, scheduler, GPUs and clock).
        let mine = slurm::node_record_dir(record, &node.node);
        eprintln!(
            "ladle sweep [{}]: recording into {}",
            node.node,
            mine.display()
        );
        args.observe.record = Some(mine);
    }
    let done = match &node {
        Some(_) => ladle_sweep::ledger::succeeded(std::slice::from_ref(&base))
            .context("reading which runs of this sweep already succeeded")?,
        None => Default::default(),
    };
    let (dataset, producer) = args.feed.open(state.join("feed.sock"))?;
    let config = SweepConfig {
        runs,
        done,
        shard,
        node: node.as_ref().map(|n| n.node.clone()),
        job_id: node.as_ref().map(|n| n.job_id.clone()),
        out: out.clone(),
        cwd,
        feed: FeedSource {
            path: args.feed.dataset()?.to_owned(),
            dataset,
            config: producer,
        },
        feed_name: args.feed_name.clone(),
        scheduler,
        gpu_mem_mib: crate::scheduler::parse_gpu_mem(args.gpu_mem.as_deref())?,
        gpus_per_run: args.gpus_per_run,
        family: args.family.clone(),
        prices: Prices {
            cpu_hour: args.price_cpu_hour,
            gpu_hour: args.price_gpu_hour,
        },
        stop_grace: seconds(
            args.stop_grace,
            if node.is_some() { 10.0 } else { 15.0 },
            "--stop-grace",
        )?,
        progress: (node.is_none()
            && !args.json
            && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| {
            let mut table = crate::progress::LiveTable::new();
            ladle_sweep::ShowProgress(Box::new(move |p| table.show(p)))
        }),
        record: args.observe.record.clone(),
    };
    let observe = args.observe.clone();
    let report = engine::run(
        config,
        Box::new(move |sockets| observe.start(sockets).map_err(|e| format!("{e:#}"))),
        &flags,
    );
    if node.is_some() {
        // Nothing node-local outlives the node's sweep (its sockets are gone already).
        if let Err(e) = std::fs::remove_dir_all(&state) {
            tracing::warn!("cannot remove {}: {e}", state.display());
        }
    }
    let report = report?;
    match &node {
        Some(node) => eprintln!(
            "ladle sweep [{}]: done: {} runs, report in {}",
            node.node,
            report.runs.len(),
            out.join(ladle_sweep::ledger::REPORT).display()
        ),
        None => print_report(&report, args.json)?,
    }
    let all_ok = report.runs.iter().all(|r| r.exit_code == Some(0));
    Ok(if all_ok && !flags.stop.load(Ordering::SeqCst) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// Prints the end report: one JSON object with `--json`, else a table.
pub(crate) fn print_report(report: &SweepReport, json: bool) -> anyhow::Result<()> {
    if json {
        crate::records::print_line(&serde_json::to_string(report)?)?;
        return Ok(());
    }
    let nodes = !report.nodes.is_empty();
    let node_col = |n: Option<&str>| {
        if nodes {
            format!(" {:<8}", n.unwrap_or("-"))
        } else {
            String::new()
        }
    };
    println!(
        "{:<8}{} {:<11} {:>5} {:>9} {:<6} command",
        "run",
        node_col(Some("node")),
        "state",
        "exit",
        "seconds",
        "gpu"
    );
    for r in &report.runs {
        println!(
            "{:<8}{} {:<11} {:>5} {:>9} {:<6} {}",
            r.name,
            node_col(r.node.as_deref()),
            r.state,
            r.exit_code.map_or("-".to_owned(), |c| c.to_string()),
            r.seconds.map_or("-".to_owned(), |s| format!("{s:.1}")),
            format!("{:?}", r.gpu),
            r.args.join(" ")
        );
        if let Some(log) = &r.log {
            println!("{:<8} log {}", "", log.display());
        }
        if r.exit_code != Some(0)
            && let Some(reason) = &r.reason
        {
            println!("{:<8} {reason}", "");
        }
        for line in &r.last_lines {
            println!("{:<8} | {line}", "");
        }
    }
    for n in &report.nodes {
        match (&n.feed, &n.lost) {
            (Some(f), _) => println!(
                "node {}: {} runs; feed: {} samples decoded once, {} consumed ({:.1}x), {:.1} CPU-s",
                n.name,
                n.runs.len(),
                f.samples_published,
                f.samples_consumed,
                f.samples_consumed as f64 / f.samples_published.max(1) as f64,
                f.cpu_seconds
            ),
            (None, lost) => println!(
                "node {}: {} runs; LOST: {}",
                n.name,
                n.runs.len(),
                lost.as_deref().unwrap_or("no report")
            ),
        }
    }
    let f = &report.feed;
    println!(
        "feed{}: {} samples decoded once, {} consumed by the runs ({:.1}x), {} bad, {:.1} CPU-s",
        if nodes { "s (all nodes)" } else { "" },
        f.samples_published,
        f.samples_consumed,
        f.samples_consumed as f64 / f.samples_published.max(1) as f64,
        f.bad_samples,
        f.cpu_seconds
    );
    let c = &report.cost;
    println!(
        "cost: {:.1} CPU-s and {:.4} GPU-hours in {:.1} s; each run with a private pipeline: \
         about {:.1} CPU-s",
        c.cpu_seconds, c.gpu_hours, report.wall_seconds, c.private_pipelines_cpu_seconds
    );
    if let (Some(wall), Some(gpu_hours)) = (
        c.private_pipelines_wall_seconds,
        c.private_pipelines_gpu_hours,
    ) {
        println!(
            "with private pipelines on these cores: at least {wall:.1} s and {gpu_hours:.4} \
             GPU-hours (`ladle cost` prices other instance shapes)"
        );
    }
    if let (Some(d), Some(p)) = (c.dollars, c.private_pipelines_dollars) {
        println!("dollars: {d:.4} (private pipelines: about {p:.4})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_of_a_sim_sweep_needs_no_gpu_from_slurm_and_a_real_one_does() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let in_job = env(&[("SLURM_JOB_ID", "7")]);
        let mut config = ladle_scheduler::daemon::DaemonConfig::new("/d".into());
        allocate_gpus_from(true, &mut config, in_job).unwrap();
        assert_eq!(
            config.allocated, None,
            "simulated: the node's own --sim-gpus"
        );
        let err = allocate_gpus_from(false, &mut config, in_job).unwrap_err();
        assert!(format!("{err:#}").contains("7"), "{err:#}");
        let granted = env(&[("SLURM_JOB_ID", "7"), ("SLURM_JOB_GPUS", "0,1")]);
        allocate_gpus_from(true, &mut config, granted).unwrap();
        assert_eq!(
            config.allocated.map(|g| g.len()),
            Some(2),
            "a grant is kept, sim or not"
        );
    }
}
