//! # ladle: the command-line front of ladle
//!
//! In `docs/ARCHITECTURE.md`'s picture this is the `cli/` box: thin subcommands over the library
//! crates and nothing else. Every subcommand's logic lives in a crate; this crate parses
//! arguments, draws progress bars and prints reports. It is a library with one entry point,
//! [`run`], so that the same code is the `ladle` binary (`src/main.rs`) and the `ladle` command
//! of the Python package (its native module calls [`run`] behind a console script).

mod baseline;
mod bench;
mod cache;
mod consume;
mod cost;
mod dataset;
mod demo;
mod detach;
mod embedded;
mod fanout;
mod feeds;
mod observe;
mod plot;
mod progress;
mod records;
mod remote;
mod report;
mod scheduler;
mod serve;
mod serve_python;
mod sim;
mod slurm;
mod sweep;
mod top;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// What `--version` prints after the name: the version, the commit and the enabled features
/// it was built from (`ladle-build-info`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("LADLE_COMMIT"),
    ", features: ",
    env!("LADLE_FEATURES"),
    ")"
);

/// ladle: decode and augment a dataset once, share it with every training process on the
/// machine.
#[derive(Debug, Parser)]
#[command(name = "ladle", version = VERSION, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate, check and describe datasets.
    #[command(subcommand)]
    Dataset(dataset::DatasetCommand),
    /// Show what sharing buys: one producer feeding four consumers against four private
    /// pipelines, on the embedded synthetic dataset (generated once, then cached).
    Demo(demo::DemoArgs),
    /// Decode and augment a dataset once into shared memory and serve it to consumers on a
    /// Unix socket, until Ctrl-C or SIGTERM.
    Serve(serve::ServeArgs),
    /// Benchmarks: shared loading against private pipelines.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// A reference consumer: read epochs from a producer and check that each one holds every
    /// sample exactly once.
    Consume(consume::ConsumeArgs),
    /// Replay a job trace on simulated GPUs and compare admission policies (makespan, job
    /// completion time, utilisation, out-of-memory crashes, energy); `sim generate` writes a
    /// CARMA-like trace.
    Sim(sim::SimArgs),
    /// Run the GPU admission scheduler: a daemon on a Unix socket that starts submitted jobs
    /// on the GPUs (under MPS) when memory and compute headroom allow, until SIGTERM.
    Scheduler(scheduler::SchedulerArgs),
    /// Queue a job with the scheduler: `ladle submit --gpu-mem 6GiB -- python train.py`.
    Submit(scheduler::SubmitArgs),
    /// Show the scheduler's jobs and GPUs.
    Queue(scheduler::QueueArgs),
    /// Cancel a queued, held or running job.
    Cancel(scheduler::CancelArgs),
    /// Queue jobs the scheduler holds because a damaged journal line may concern them
    /// (`ladle queue` shows them as held, with why).
    Release(scheduler::ReleaseArgs),
    /// Print a job's stdout and stderr (every attempt).
    Logs(scheduler::LogsArgs),
    /// Run a hyper-parameter sweep as consumers of one feed, each run admitted by the
    /// scheduler: `ladle sweep --dataset D -- python train.py --lr '{0.1,0.01}'`; `--shard
    /// K/N` runs a part of the grid, `--slurm --nodes N` the whole grid over a Slurm
    /// allocation (one feed and one scheduler per node).
    Sweep(Box<sweep::SweepArgs>),
    /// Plot a recorded run: `ladle report DIR` writes PNGs and prints a summary; `ladle
    /// report --merge DIR…` merges the reports of a sweep's nodes or shards.
    Report(report::ReportArgs),
    /// What a recorded sweep would cost on each cloud instance shape, with ladle and with
    /// private pipelines, from its measured rates: `ladle cost REC --instances SHAPES.csv`.
    Cost(cost::CostArgs),
    /// Watch the scheduler's GPUs and jobs and every feed's consumers, live: `ladle top`.
    Top(top::TopArgs),
    /// The live feeds of this user on this node, started on demand by consumers that name
    /// their data (`ladle consume --dataset`, Python's `ladle.Consumer(dataset=...)`): list
    /// them, start one (`ladle feeds start --dataset D`), stop them.
    Feeds(feeds::FeedsArgs),
    /// The decoded-sample cache that feeds started with --cache-gib share: what it holds
    /// (`ladle cache ls`), letting it go (`ladle cache drop KEY|--all`).
    Cache(cache::CacheCommandArgs),
}

/// The environment variable naming the command that runs this CLI again, when the user
/// sets it; else the host's ([`Host::exe`]), else the running executable.
pub const SELF_ENV: &str = "LADLE_EXE";

/// What a process hosting this CLI other than the `ladle` binary says of itself: the Python
/// package's console script passes its own path and interpreter ([`run_hosted`]). Kept in
/// this process only, never in the environment, so that nothing it starts inherits it.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// The command that runs this CLI again (the console script), for what it starts
    /// (a Slurm batch script, benchmark workers).
    pub exe: Option<std::path::PathBuf>,
    /// The interpreter hosting it: `ladle serve MODULE:FACTORY` serves there.
    pub python: Option<std::path::PathBuf>,
}

static HOST: std::sync::Mutex<Option<Host>> = std::sync::Mutex::new(None);

/// This process's [`Host`], if one said so.
pub(crate) fn host() -> Host {
    HOST.lock()
        .map(|h| h.clone().unwrap_or_default())
        .unwrap_or_default()
}

/// The program that runs this CLI again: `$LADLE_EXE` when set, else the host's command,
/// else this executable.
pub(crate) fn self_exe() -> std::io::Result<std::path::PathBuf> {
    match (std::env::var_os(SELF_ENV), host().exe) {
        (Some(path), _) if !path.is_empty() => Ok(path.into()),
        (_, Some(exe)) => Ok(exe),
        _ => std::env::current_exe(),
    }
}

/// [`run`] in a process that is not the `ladle` binary (the Python package's console
/// script), which says what it is.
pub fn run_hosted<I, T>(args: I, host: Host) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    if let Ok(mut slot) = HOST.lock() {
        *slot = Some(host);
    }
    run(args)
}

pub use feeds::transform_spelling;

static ARGV: std::sync::Mutex<Vec<std::ffi::OsString>> = std::sync::Mutex::new(Vec::new());

/// The command line [`run`] was given (the program's name first): `ladle serve --registry
/// --detach` runs it again without `--detach`.
pub(crate) fn argv() -> Vec<std::ffi::OsString> {
    ARGV.lock().map(|a| a.clone()).unwrap_or_default()
}

/// Runs the `ladle` command line: `args` as `std::env::args_os()` gives them (the program's
/// name first). Returns the process's exit code; `--help`, `--version` and argument errors
/// print and return as clap does.
pub fn run<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    if let Ok(mut slot) = ARGV.lock() {
        slot.clone_from(&args);
    }
    // The matches are kept: `ladle serve MODULE:FACTORY` tells the options given from defaults.
    let parsed = Cli::command()
        .try_get_matches_from(args)
        .and_then(|matches| {
            Cli::from_arg_matches(&matches)
                .map_err(|e| e.format(&mut Cli::command()))
                .map(|cli| (cli, matches))
        });
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A sweep on a terminal draws a live table: its scheduler's and feed's info lines would
    // break it (they stay available with LADLE_LOG=info).
    let default_filter = if matches!(cli.command, Command::Sweep(_)) && terminal {
        "warn"
    } else {
        "warn,ladle_producer=info,ladle_scheduler=info,ladle_cache=info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LADLE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(terminal)
        // A host (the Python package) may have set one already: keep it.
        .try_init()
        .ok();
    let result = match cli.command {
        Command::Dataset(cmd) => dataset::run(cmd),
        Command::Demo(args) => demo::run(args),
        Command::Serve(args) => match matches.subcommand_matches("serve") {
            Some(given) => serve::run(args, given),
            None => unreachable!("clap parsed a serve command without its matches"),
        },
        Command::Consume(args) => consume::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Sim(args) => sim::run(args),
        Command::Scheduler(args) => scheduler::run_daemon(args),
        Command::Submit(args) => scheduler::submit(args),
        Command::Queue(args) => scheduler::queue(args),
        Command::Cancel(args) => scheduler::cancel(args),
        Command::Release(args) => scheduler::release(args),
        Command::Logs(args) => scheduler::logs(args),
        Command::Report(args) => match report::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Cost(args) => match cost::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Sweep(args) if args.slurm.submits() => match slurm::submit(*args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Sweep(args) => match sweep::run(*args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Top(args) => top::run(args),
        Command::Feeds(args) => feeds::run(args),
        Command::Cache(args) => cache::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
