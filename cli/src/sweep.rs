//! `ladle sweep`: one command runs a hyper-parameter sweep as consumers of one feed, each run
//! admitted by the scheduler.
//!
//! The sweep expands its command into runs (every argument holding `{a,b,c}` is a grid axis;
//! `--grid FILE` adds one run per line), starts one feed (an in-process producer on a socket
//! in the sweep's directory), uses the scheduler daemon of `--scheduler-dir` or starts a
//! private one in-process, submits every run with `LADLE_SOCKET` (the feed) and `LADLE_RUN`
//! (its name) in its environment, reports the runs as they start and end, and at the end
//! prints a report with the cost. Ctrl-C or SIGTERM cancels every run, stops the feed and the
//! private daemon; a second one kills the runs' process groups at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use ladle_observe::report::{Cost, FeedReport, RunReport, SweepReport as Report};
use ladle_producer::{ConsumerStats, Producer};
use ladle_scheduler::daemon;
use ladle_scheduler::job::{JobId, JobSpec, JobState};
use ladle_scheduler::protocol::{self, Request, Response};

use crate::scheduler::DaemonOptions;
use crate::serve::FeedOptions;

/// Most runs one sweep may expand to.
const MAX_RUNS: usize = 1000;

/// How often the sweep asks the scheduler how its runs stand.
const POLL: Duration = Duration::from_millis(500);

/// How long a client waits for the daemon's answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Queue requests that may fail in a row before the sweep gives up (and cancels its runs).
const QUEUE_TRIES: u32 = 5;

/// How long cancelled runs get to end before the sweep kills their process groups.
const CANCEL_GRACE: Duration = Duration::from_secs(15);

#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    feed: FeedOptions,
    #[command(flatten)]
    daemon: DaemonOptions,
    #[command(flatten)]
    observe: crate::observe::ObserveArgs,
    /// Use the running scheduler daemon of this state directory (default: the one `ladle
    /// scheduler` uses, if it is running; else the sweep starts a private one).
    #[arg(long, value_name = "DIR")]
    scheduler_dir: Option<PathBuf>,
    /// Start a private scheduler for the sweep even if one is running.
    #[arg(long, conflicts_with = "scheduler_dir")]
    private_scheduler: bool,
    /// The sweep's directory: the feed's socket, the private scheduler's state and the runs'
    /// logs (default: `./ladle-sweep-UNIXTIME`).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The name the feed registers under with the scheduler (default: sweep-PID).
    #[arg(long, value_name = "NAME")]
    feed_name: Option<String>,
    /// Device memory each run needs per GPU (as `ladle submit --gpu-mem`). Without it the
    /// first run is measured and the others are packed by its peak.
    #[arg(long)]
    gpu_mem: Option<String>,
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
    json: bool,
    /// Price of one CPU core-hour, for the cost in the report.
    #[arg(long, value_name = "USD")]
    price_cpu_hour: Option<f64>,
    /// Price of one GPU-hour, for the cost in the report.
    #[arg(long, value_name = "USD")]
    price_gpu_hour: Option<f64>,
    /// The command of every run, after `--`; an argument holding `{a,b,c}` makes one run per
    /// value (all such arguments: their cartesian product). Quote it from the shell:
    /// `ladle sweep --dataset D -- python train.py --lr '{0.1,0.01}' --bs '{32,64}'`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The alternatives of one argument: `{a,b}` groups expanded, left to right.
fn expand_arg(arg: &str) -> Vec<String> {
    let Some(open) = arg.find('{') else {
        return vec![arg.to_owned()];
    };
    let Some(close) = arg[open..].find('}').map(|i| open + i) else {
        return vec![arg.to_owned()];
    };
    let inner = &arg[open + 1..close];
    let head = &arg[..open];
    let tails = expand_arg(&arg[close + 1..]);
    if !inner.contains(',') {
        // `{x}` is not a grid: keep it (e.g. a format string) and expand what follows.
        let keep = &arg[..=close];
        return tails.iter().map(|t| format!("{keep}{t}")).collect();
    }
    inner
        .split(',')
        .flat_map(|alt| tails.iter().map(move |t| format!("{head}{alt}{t}")))
        .collect()
}

/// Every run's command: the cartesian product of the arguments' alternatives, then one run
/// per line of the grid file.
pub(crate) fn expand_runs(
    command: &[String],
    grid: Option<&str>,
) -> anyhow::Result<Vec<Vec<String>>> {
    let mut runs: Vec<Vec<String>> = vec![Vec::new()];
    for arg in command {
        let alternatives = expand_arg(arg);
        if runs.len().saturating_mul(alternatives.len()) > MAX_RUNS {
            bail!("the grid expands to more than {MAX_RUNS} runs");
        }
        runs = runs
            .iter()
            .flat_map(|run| {
                alternatives.iter().map(move |alt| {
                    let mut next = run.clone();
                    next.push(alt.clone());
                    next
                })
            })
            .collect();
    }
    if let Some(grid) = grid {
        let base = runs;
        runs = Vec::new();
        for line in grid.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            for run in &base {
                let mut next = run.clone();
                next.extend(line.split_whitespace().map(str::to_owned));
                runs.push(next);
            }
            if runs.len() > MAX_RUNS {
                bail!("the grid expands to more than {MAX_RUNS} runs");
            }
        }
        if runs.is_empty() {
            bail!("the grid file holds no run");
        }
    }
    Ok(runs)
}

/// One run as the sweep follows it.
#[derive(Debug)]
struct Run {
    name: String,
    args: Vec<String>,
    id: JobId,
    started: Option<Instant>,
    ended: Option<Instant>,
    gpus: Vec<u32>,
    pid: Option<u32>,
    state: &'static str,
    reason: Option<String>,
    peak_mib: Option<u64>,
    /// Samples it has read (released to the feed) and its epochs, when the feed is ours.
    released: Option<u64>,
    epochs: Option<f64>,
    /// Samples per second since the last look.
    rate: Option<f64>,
}

/// The live table on a terminal: one row per run and the feed, redrawn in place.
#[derive(Debug, Default)]
struct LiveView {
    /// Lines drawn last time (to move the cursor back over them).
    drawn: usize,
}

impl LiveView {
    fn draw(&mut self, runs: &[Run], feed: &str) {
        eprint!("{}", self.render(runs, feed, Instant::now()));
    }

    /// The escape sequences and rows that replace the last table with this one.
    fn render(&mut self, runs: &[Run], feed: &str, now: Instant) -> String {
        let mut lines = vec![format!(
            "{:<8} {:<11} {:<6} {:>6} {:>9} {:>8} {:>9}  command",
            "run", "state", "gpu", "epoch", "samples/s", "elapsed", "gpu mem"
        )];
        for r in runs {
            let elapsed = r.started.map_or_else(
                || "-".to_owned(),
                |s| {
                    format!(
                        "{:.0} s",
                        r.ended.unwrap_or(now).duration_since(s).as_secs_f64()
                    )
                },
            );
            let gpus = if r.gpus.is_empty() {
                "-".to_owned()
            } else {
                r.gpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let memory = r
                .peak_mib
                .map_or("-".to_owned(), ladle_scheduler::units::format_mib);
            let epoch = r.epochs.map_or("-".to_owned(), |e| format!("{e:.1}"));
            let rate = r.rate.map_or("-".to_owned(), |v| format!("{v:.0}"));
            let command: String = r.args.join(" ").chars().take(50).collect();
            lines.push(format!(
                "{:<8} {:<11} {:<6} {epoch:>6} {rate:>9} {elapsed:>8} {memory:>9}  {command}",
                r.name, r.state, gpus
            ));
        }
        lines.push(feed.to_owned());
        let mut out = String::new();
        if self.drawn > 0 {
            // Up over the last table, and clear to the end of the screen.
            out.push_str(&format!("\x1b[{}A\x1b[J", self.drawn));
        }
        for line in &lines {
            out.push_str(line);
            out.push('\n');
        }
        self.drawn = lines.len();
        out
    }
}

/// Where the sweep talks to its scheduler.
struct Scheduler {
    socket: PathBuf,
    private: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Scheduler {
    fn request(&self, request: &Request) -> anyhow::Result<Response> {
        match protocol::request(&self.socket, request, CLIENT_TIMEOUT)? {
            Response::Error { message } => bail!("scheduler: {message}"),
            other => Ok(other),
        }
    }

    fn stop(&mut self) {
        if let Some((stop, thread)) = self.private.take() {
            stop.store(true, Ordering::SeqCst);
            let _ = thread.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start_scheduler(args: &SweepArgs, out: &Path) -> anyhow::Result<Scheduler> {
    if args.scheduler_dir.is_none() && !args.private_scheduler {
        let default = crate::scheduler::DirArg { dir: None }.resolve().ok();
        if let Some(socket) = default.map(|dir| daemon::socket_path(&dir)) {
            let answer = protocol::request(&socket, &Request::Queue, Duration::from_secs(2));
            if answer.is_ok() {
                return Ok(Scheduler {
                    socket,
                    private: None,
                });
            }
        }
    }
    if let Some(dir) = &args.scheduler_dir {
        let socket = daemon::socket_path(dir);
        protocol::request(&socket, &Request::Queue, CLIENT_TIMEOUT).with_context(|| {
            format!(
                "no scheduler answers on {} (--scheduler-dir)",
                socket.display()
            )
        })?;
        return Ok(Scheduler {
            socket,
            private: None,
        });
    }
    let dir = out.join("scheduler");
    let config = args.daemon.config(dir.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("ladle-sweep-scheduler".into())
            .spawn(move || {
                if let Err(e) = daemon::run(config, stop) {
                    tracing::error!("the sweep's scheduler stopped: {e}");
                }
            })
            .context("starting the sweep's scheduler")?
    };
    let scheduler = Scheduler {
        socket: daemon::socket_path(&dir),
        private: Some((stop, thread)),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while protocol::request(&scheduler.socket, &Request::Queue, CLIENT_TIMEOUT).is_err() {
        if Instant::now() > deadline {
            bail!("the sweep's scheduler did not come up in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(scheduler)
}

pub(crate) fn run(args: SweepArgs) -> anyhow::Result<std::process::ExitCode> {
    let grid = args
        .grid
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("--grid {}", p.display())))
        .transpose()?;
    let commands = expand_runs(&args.command, grid.as_deref())?;
    let gpu_mem_mib = crate::scheduler::parse_gpu_mem(args.gpu_mem.as_deref())?;
    let cwd = std::env::current_dir().context("current directory")?;
    let out = match &args.out {
        Some(out) => out.clone(),
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            cwd.join(format!("ladle-sweep-{now}"))
        }
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize().unwrap_or(out);

    // Signals: the first asks for a clean stop, a second for an immediate one.
    let stop = Arc::new(AtomicBool::new(false));
    let hurry = Arc::new(AtomicBool::new(false));
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    {
        let (stop, hurry) = (stop.clone(), hurry.clone());
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
    }

    let started = Instant::now();
    let mut scheduler = start_scheduler(&args, &out)?;
    let (dataset, config) = args.feed.open(out.join("feed.sock"))?;
    let (dataset_key, transform) = (
        crate::serve::dataset_key(&args.feed.dataset),
        crate::serve::transform_key(&config),
    );
    // A live feed of the same dataset and transform serves this sweep as well as its own.
    let reuse = match scheduler.request(&Request::Feeds)? {
        Response::Feeds { feeds, .. } => feeds
            .into_iter()
            .find(|f| f.dataset == dataset_key && f.transform == transform),
        _ => None,
    };
    if reuse.is_none() {
        wait_for_cores(&scheduler, config.threads, &stop, args.json)?;
    }
    let feed_stop = Arc::new(AtomicBool::new(false));
    let (producer, socket, feed_name) = if let Some(feed) = reuse {
        say(
            args.json,
            &format!(
                "reusing the live feed {:?} on {}",
                feed.name,
                feed.socket.display()
            ),
        );
        (None, feed.socket, feed.name)
    } else {
        let socket = config.socket.clone();
        let threads = u32::try_from(config.threads).unwrap_or(u32::MAX);
        let producer = Producer::start_with_stop(Arc::from(dataset), config, feed_stop.clone())
            .with_context(|| format!("cannot start the feed on {}", socket.display()))?;
        let feed_name = args
            .feed_name
            .clone()
            .unwrap_or_else(|| format!("sweep-{}", std::process::id()));
        scheduler
            .request(&Request::RegisterFeed(protocol::FeedSpec {
                name: feed_name.clone(),
                socket: socket.clone(),
                dataset: dataset_key,
                transform,
                threads,
                pid: std::process::id(),
            }))
            .with_context(|| format!("registering the feed {feed_name:?} with the scheduler"))?;
        (Some(producer), socket, feed_name)
    };
    say(
        args.json,
        &format!(
            "sweep of {} runs: feed {feed_name:?} of {} on {}, scheduler {}",
            commands.len(),
            args.feed.dataset.display(),
            socket.display(),
            scheduler.socket.display()
        ),
    );

    // --metrics / --record: the feed and the scheduler, over their sockets.
    let observer = args.observe.start(ladle_observe::Sockets {
        feeds: vec![(feed_name.clone(), socket.clone())],
        scheduler: Some(scheduler.socket.clone()),
        scheduler_feeds: false,
    })?;
    let mut runs = Vec::new();
    for (k, command) in commands.into_iter().enumerate() {
        let name = format!("run-{k:02}");
        let spec = JobSpec {
            command: command.clone(),
            cwd: cwd.clone(),
            gpu_mem_mib,
            gpus: 1,
            feed: Some(feed_name.clone()),
            thread_percentage: None,
            env: vec![
                ("LADLE_SOCKET".into(), socket.display().to_string()),
                ("LADLE_RUN".into(), name.clone()),
            ],
            cpus: None,
            family: args.family.clone(),
        };
        let id = match scheduler.request(&Request::Submit(spec)) {
            Ok(Response::Submitted { id, .. }) => id,
            failed => {
                // Nothing of a sweep that cannot be submitted whole is left to run.
                cancel_all(&scheduler, &runs);
                match failed {
                    Err(e) => return Err(e.context(format!("submitting {name}"))),
                    Ok(other) => bail!("unexpected answer to a submit: {other:?}"),
                }
            }
        };
        say(
            args.json,
            &format!("{name}: job {id}: {}", command.join(" ")),
        );
        runs.push(Run {
            name,
            args: command,
            id,
            started: None,
            ended: None,
            gpus: Vec::new(),
            pid: None,
            state: "queued",
            reason: None,
            peak_mib: None,
            released: None,
            epochs: None,
            rate: None,
        });
    }

    let mut next_feed_line = Instant::now() + Duration::from_secs(10);
    // On a terminal (and without --json) a live table; plain lines otherwise.
    let mut live = (!args.json && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(LiveView::default);
    let mut last_published = 0u64;
    let mut last_look = Instant::now();
    let mut queue_failures = 0u32;
    let mut cancelled_at: Option<Instant> = None;
    loop {
        let jobs = match scheduler.request(&Request::Queue) {
            Ok(Response::Queue { jobs, .. }) => {
                queue_failures = 0;
                jobs
            }
            failed => {
                // A scheduler that stops answering: a few more tries, then give up and leave
                // nothing running behind.
                queue_failures += 1;
                if queue_failures < QUEUE_TRIES {
                    std::thread::sleep(POLL);
                    continue;
                }
                cancel_all(&scheduler, &runs);
                match failed {
                    Err(e) => return Err(e.context("the scheduler stopped answering")),
                    Ok(other) => bail!("unexpected answer to a queue request: {other:?}"),
                }
            }
        };
        let by_id: BTreeMap<JobId, _> = jobs.iter().map(|j| (j.id, j)).collect();
        for run in &mut runs {
            let Some(job) = by_id.get(&run.id) else {
                continue;
            };
            run.peak_mib = job.peak_mib;
            follow(run, &job.state, live.is_some());
        }
        if let Some(view) = &mut live {
            let seconds = last_look.elapsed().as_secs_f64().max(1e-3);
            last_look = Instant::now();
            let feed = match &producer {
                Some(p) => {
                    let published = p.published();
                    let rate = published.saturating_sub(last_published) as f64 / seconds;
                    last_published = published;
                    let stats = p.consumer_stats();
                    let held = follow_consumers(&mut runs, &stats, p.dataset_len(), seconds);
                    format!(
                        "feed {feed_name:?}: {published} samples decoded ({rate:.0}/s), {} bad{held}",
                        p.bad_samples()
                    )
                }
                None => format!("feed {feed_name:?} (reused)"),
            };
            view.draw(&runs, &feed);
        }
        if runs.iter().all(|r| r.ended.is_some()) {
            break;
        }
        if stop.load(Ordering::SeqCst) && cancelled_at.is_none() {
            say(args.json, "stopping: cancelling every run");
            for run in runs.iter().filter(|r| r.ended.is_none()) {
                let _ = scheduler.request(&Request::Cancel { id: run.id });
            }
            cancelled_at = Some(Instant::now());
        }
        let overdue = cancelled_at.is_some_and(|at| at.elapsed() > CANCEL_GRACE);
        if hurry.load(Ordering::SeqCst) || overdue {
            kill_runs(&runs);
            if cancelled_at.is_some_and(|at| at.elapsed() > CANCEL_GRACE * 2) {
                break; // the scheduler does not see them end; give up waiting
            }
        }
        if live.is_none() && Instant::now() >= next_feed_line {
            next_feed_line += Duration::from_secs(10);
            let live = runs.iter().filter(|r| r.state == "running").count();
            say(
                args.json,
                &match &producer {
                    Some(p) => format!(
                        "feed: {} samples published, {} bad; {live} runs running",
                        p.published(),
                        p.bad_samples()
                    ),
                    None => format!("{live} runs running"),
                },
            );
        }
        std::thread::sleep(POLL);
    }

    if let Some(observer) = observer {
        observer.stop();
    }
    // Logs before the scheduler goes away.
    let mut reports = Vec::new();
    for run in &runs {
        reports.push(run_report(&scheduler, run));
    }
    scheduler.stop();
    feed_stop.store(true, Ordering::SeqCst);
    let served = match producer {
        Some(producer) => {
            producer.stop();
            Some(producer.wait().context("the feed failed")?)
        }
        None => None,
    };
    let (published, consumed, bad) =
        served.map_or((0, 0, 0), |s| (s.published, s.consumed, s.bad_samples));
    let wall = started.elapsed().as_secs_f64();
    let own_cpu = crate::usage::cpu_time(libc::RUSAGE_SELF).as_secs_f64();
    let runs_cpu = crate::usage::cpu_time(libc::RUSAGE_CHILDREN).as_secs_f64();
    let gpu_hours: f64 = reports
        .iter()
        .map(|r| r.seconds.unwrap_or(0.0) * r.gpu.len().max(1) as f64 / 3600.0)
        .sum();
    let per_sample = own_cpu / published.max(1) as f64;
    let private_cpu = runs_cpu + per_sample * consumed as f64;
    let price = |cpu_s: f64| match (args.price_cpu_hour, args.price_gpu_hour) {
        (None, None) => None,
        (cpu, gpu) => Some(cpu.unwrap_or(0.0) * cpu_s / 3600.0 + gpu.unwrap_or(0.0) * gpu_hours),
    };
    let report = Report {
        runs: reports,
        feed: FeedReport {
            socket: socket.clone(),
            reused: served.is_none(),
            samples_published: published,
            samples_consumed: consumed,
            bad_samples: bad,
            cpu_seconds: own_cpu,
        },
        wall_seconds: wall,
        cpu_seconds: own_cpu + runs_cpu,
        cost: Cost {
            cpu_seconds: own_cpu + runs_cpu,
            gpu_hours,
            dollars: price(own_cpu + runs_cpu),
            private_pipelines_cpu_seconds: private_cpu,
            private_pipelines_dollars: price(private_cpu),
        },
    };
    if let Some(dir) = &args.observe.record {
        // Beside the recorded series, for `ladle report`'s cost plot.
        let path = dir.join(ladle_observe::record::REPORT);
        if let Err(e) = std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n") {
            tracing::error!("cannot write the report into {}: {e}", path.display());
        }
    }
    print_report(&report, args.json)?;
    let all_ok = report.runs.iter().all(|r| r.exit_code == Some(0));
    Ok(if all_ok && !stop.load(Ordering::SeqCst) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// A progress line: on stderr, so that stdout holds only the report.
fn say(_json: bool, line: &str) {
    eprintln!("ladle sweep: {line}");
}

/// Updates `run` from the scheduler's view of its job and says what changed (unless a live
/// table shows it).
fn follow(run: &mut Run, state: &JobState, quiet: bool) {
    let now = Instant::now();
    let (name, terminal) = match state {
        JobState::Queued => ("queued", false),
        JobState::Running { gpus, pid, .. } => {
            if run.started.is_none() {
                run.started = Some(now);
                run.gpus.clone_from(gpus);
            }
            run.pid = *pid;
            ("running", false)
        }
        JobState::Succeeded => ("succeeded", true),
        JobState::Failed { reason } => {
            run.reason = Some(reason.clone());
            ("failed", true)
        }
        JobState::Cancelled => ("cancelled", true),
        JobState::Interrupted { reason } => {
            run.reason = Some(reason.clone());
            ("interrupted", true)
        }
        _ => ("unknown", false),
    };
    if terminal && run.ended.is_none() {
        run.ended = Some(now);
    }
    if name != run.state {
        run.state = name;
        let detail = match (name, &run.reason) {
            ("running", _) => format!(" on GPU {:?}", run.gpus),
            (_, Some(reason)) if terminal => format!(": {reason}"),
            _ => String::new(),
        };
        let took = match (run.started, run.ended) {
            (Some(s), Some(e)) => format!(" after {:.1} s", e.duration_since(s).as_secs_f64()),
            _ => String::new(),
        };
        if !quiet {
            say(false, &format!("{} {name}{detail}{took}", run.name));
        }
    }
}

/// A new feed needs `threads` cores: waits while the scheduler's feeds and jobs that state
/// `cpus` leave fewer free (a sweep of an existing feed never waits here). A feed wider than
/// the machine starts once nothing else holds cores.
fn wait_for_cores(
    scheduler: &Scheduler,
    threads: usize,
    stop: &AtomicBool,
    json: bool,
) -> anyhow::Result<()> {
    let threads = u32::try_from(threads).unwrap_or(u32::MAX);
    let mut said = false;
    loop {
        let Response::Feeds {
            cpu_cores,
            cpus_busy,
            ..
        } = scheduler.request(&Request::Feeds)?
        else {
            return Ok(());
        };
        if cpus_busy == 0 || cpus_busy.saturating_add(threads) <= cpu_cores {
            return Ok(());
        }
        if !said {
            say(
                json,
                &format!(
                    "waiting for cores: the new feed needs {threads}, {cpus_busy} of {cpu_cores} \
                     are taken by feeds and jobs"
                ),
            );
            said = true;
        }
        if stop.load(Ordering::SeqCst) {
            bail!("stopped while waiting for cores for the feed");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Updates each run's progress from the feed's view of its consumer (matched by the name the
/// run got in `LADLE_RUN`); returns who holds the feed back, as a suffix for the feed's line.
fn follow_consumers(runs: &mut [Run], stats: &[ConsumerStats], n: u64, seconds: f64) -> String {
    for run in runs.iter_mut() {
        let logged = format!("{:?}", run.name);
        let Some(c) = stats.iter().find(|c| c.name == logged) else {
            run.rate = None;
            continue;
        };
        let before = run.released.unwrap_or(c.released);
        run.rate = Some(c.released.saturating_sub(before) as f64 / seconds);
        run.released = Some(c.released);
        run.epochs = Some(c.released as f64 / n.max(1) as f64);
    }
    stats
        .iter()
        .filter_map(|c| c.holding_back.map(|d| (c, d)))
        .filter(|(_, d)| *d >= Duration::from_secs(1))
        .max_by_key(|(_, d)| *d)
        .map_or_else(String::new, |(c, d)| {
            format!("; held back by {} for {:.0} s", c.name, d.as_secs_f64())
        })
}

/// Cancels every run not ended (best effort: on a path that ends the sweep with an error) and
/// kills the process groups of those it knows to be running.
fn cancel_all(scheduler: &Scheduler, runs: &[Run]) {
    for run in runs.iter().filter(|r| r.ended.is_none()) {
        let _ = scheduler.request(&Request::Cancel { id: run.id });
    }
    kill_runs(runs);
}

/// Kills the process group of every run still running (the second Ctrl-C).
fn kill_runs(runs: &[Run]) {
    for run in runs.iter().filter(|r| r.ended.is_none()) {
        if let Some(pid) = run.pid {
            let _ = ladle_scheduler::sys::signal_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A run's line of the report, with its logs from the scheduler.
fn run_report(scheduler: &Scheduler, run: &Run) -> RunReport {
    let attempts = match scheduler.request(&Request::Logs { id: run.id }) {
        Ok(Response::Logs { attempts, .. }) => attempts,
        _ => Vec::new(),
    };
    let last = attempts.last();
    let exit_code = match run.state {
        "succeeded" => Some(0),
        _ => run
            .reason
            .as_deref()
            .and_then(|r| r.strip_prefix("exit code "))
            .and_then(|c| c.parse().ok()),
    };
    let last_lines = match last {
        Some(a) if exit_code != Some(0) => {
            let lines: Vec<&str> = a.stderr.lines().collect();
            lines[lines.len().saturating_sub(5)..]
                .iter()
                .map(|l| (*l).to_owned())
                .collect()
        }
        _ => Vec::new(),
    };
    RunReport {
        name: run.name.clone(),
        args: run.args.clone(),
        state: run.state.to_owned(),
        exit_code,
        reason: run.reason.clone(),
        log: last.map(|a| a.stdout_path.clone()),
        stderr_log: last.map(|a| a.stderr_path.clone()),
        seconds: run
            .started
            .zip(run.ended)
            .map(|(s, e)| e.duration_since(s).as_secs_f64()),
        gpu: run.gpus.clone(),
        last_lines,
    }
}

fn print_report(report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        crate::records::print_line(&serde_json::to_string(report)?)?;
        return Ok(());
    }
    println!(
        "{:<8} {:<10} {:>5} {:>9} {:<6} command",
        "run", "state", "exit", "seconds", "gpu"
    );
    for r in &report.runs {
        println!(
            "{:<8} {:<10} {:>5} {:>9} {:<6} {}",
            r.name,
            r.state,
            r.exit_code.map_or("-".to_owned(), |c| c.to_string()),
            r.seconds.map_or("-".to_owned(), |s| format!("{s:.1}")),
            format!("{:?}", r.gpu),
            r.args.join(" ")
        );
        if let Some(log) = &r.log {
            println!("{:<8} log {}", "", log.display());
        }
        for line in &r.last_lines {
            println!("{:<8} | {line}", "");
        }
    }
    let f = &report.feed;
    println!(
        "feed: {} samples decoded once, {} consumed by the runs ({:.1}x), {} bad, {:.1} CPU-s",
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
    if let (Some(d), Some(p)) = (c.dollars, c.private_pipelines_dollars) {
        println!("dollars: {d:.4} (private pipelines: about {p:.4})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn braces_expand_into_the_cartesian_product_in_order() {
        let runs = expand_runs(
            &strings(&["train", "--lr={0.1,0.01}", "--bs", "{32,64}"]),
            None,
        )
        .unwrap();
        assert_eq!(
            runs,
            vec![
                strings(&["train", "--lr=0.1", "--bs", "32"]),
                strings(&["train", "--lr=0.1", "--bs", "64"]),
                strings(&["train", "--lr=0.01", "--bs", "32"]),
                strings(&["train", "--lr=0.01", "--bs", "64"]),
            ]
        );
    }

    #[test]
    fn two_groups_in_one_argument_and_a_group_without_a_comma() {
        assert_eq!(expand_arg("{a,b}-{1,2}"), ["a-1", "a-2", "b-1", "b-2"]);
        assert_eq!(expand_arg("{x}-{1,2}"), ["{x}-1", "{x}-2"]);
        assert_eq!(expand_arg("open{"), ["open{"]);
    }

    #[test]
    fn a_grid_file_adds_one_run_per_line_and_limits_hold() {
        let runs = expand_runs(
            &strings(&["train"]),
            Some("# comment\n--lr 0.1\n\n--lr 0.2 --wd 1e-4\n"),
        )
        .unwrap();
        assert_eq!(
            runs,
            vec![
                strings(&["train", "--lr", "0.1"]),
                strings(&["train", "--lr", "0.2", "--wd", "1e-4"])
            ]
        );
        assert!(expand_runs(&strings(&["x"]), Some("# nothing\n")).is_err());
        let huge = "{1,2,3,4,5,6,7,8,9,10}";
        assert!(expand_runs(&strings(&[huge, huge, huge, huge]), None).is_err());
    }

    #[test]
    fn the_live_table_redraws_over_itself_one_row_per_run() {
        let now = Instant::now();
        let run = |name: &str, state| Run {
            name: name.into(),
            args: vec!["train".into(), "--lr".into(), "0.1".into()],
            id: 1,
            started: Some(now - Duration::from_secs(5)),
            ended: None,
            gpus: vec![1],
            pid: None,
            state,
            reason: None,
            peak_mib: Some(2048),
            released: Some(150),
            epochs: Some(1.5),
            rate: Some(320.0),
        };
        let runs = [run("run-00", "running"), run("run-01", "queued")];
        let mut view = LiveView::default();
        let first = view.render(&runs, "feed", now);
        assert!(
            !first.starts_with('\x1b'),
            "nothing to move over the first time"
        );
        assert_eq!(first.lines().count(), 4, "{first}");
        assert!(first.contains("run-00   running     1"), "{first}");
        assert!(first.contains("5 s") && first.contains("2GiB"), "{first}");
        let second = view.render(&runs, "feed", now);
        assert!(second.starts_with("\x1b[4A\x1b[J"), "{second:?}");
    }

    #[test]
    fn each_run_is_followed_through_the_consumer_named_after_it() {
        let now = Instant::now();
        let mut runs = vec![Run {
            name: "run-00".into(),
            args: vec!["train".into()],
            id: 1,
            started: Some(now),
            ended: None,
            gpus: vec![0],
            pid: None,
            state: "running",
            reason: None,
            peak_mib: None,
            released: Some(100),
            epochs: None,
            rate: None,
        }];
        let stats = [
            ConsumerStats {
                id: 0,
                name: "\"run-00\"".into(),
                released: 300,
                attached: true,
                holding_back: None,
            },
            ConsumerStats {
                id: 1,
                name: "\"other\"".into(),
                released: 5,
                attached: true,
                holding_back: Some(Duration::from_secs(4)),
            },
        ];
        let held = follow_consumers(&mut runs, &stats, 200, 2.0);
        assert_eq!(runs[0].rate, Some(100.0));
        assert_eq!(runs[0].epochs, Some(1.5));
        assert_eq!(held, "; held back by \"other\" for 4 s");
    }
}
