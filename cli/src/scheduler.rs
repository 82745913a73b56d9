//! `ladle scheduler` (the admission daemon) and its clients `ladle submit`, `ladle queue`,
//! `ladle cancel`, `ladle logs`. Thin shells over `ladle_scheduler::{daemon, protocol}`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use ladle_scheduler::allocation::{AllocationError, GpuSelector, given_gpus, parse_gpu_list};
use ladle_scheduler::daemon::{self, DaemonConfig, GpuBackend, MpsMode};
use ladle_scheduler::estimate::Basis;
use ladle_scheduler::job::{JobSpec, JobState};
use ladle_scheduler::policy::Policy;
use ladle_scheduler::protocol::{self, JobQuery, JobView, Request, Response};
use ladle_scheduler::telemetry::{ComputeSource, DcgmMode, SimScenario};
use ladle_scheduler::units::{format_mib, parse_mib};

/// How long a client waits for the daemon's answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Args)]
pub(crate) struct DirArg {
    /// The scheduler's state directory (socket `scheduler.sock`, journal, job logs unless
    /// --log-dir, MPS pipes). Default: $LADLE_SCHEDULER_DIR, else $XDG_STATE_HOME/ladle/scheduler, else
    /// ~/.local/state/ladle/scheduler.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

impl DirArg {
    pub(crate) fn resolve(&self) -> anyhow::Result<PathBuf> {
        if let Some(dir) = &self.dir {
            return Ok(dir.clone());
        }
        if let Some(dir) = std::env::var_os("LADLE_SCHEDULER_DIR") {
            return Ok(dir.into());
        }
        if let Some(state) = std::env::var_os("XDG_STATE_HOME") {
            return Ok(PathBuf::from(state).join("ladle").join("scheduler"));
        }
        let home = std::env::var_os("HOME").context("no --dir, $LADLE_SCHEDULER_DIR or $HOME")?;
        Ok(PathBuf::from(home).join(".local/state/ladle/scheduler"))
    }

    pub(crate) fn request(&self, request: &Request) -> anyhow::Result<Response> {
        let socket = daemon::socket_path(&self.resolve()?);
        match protocol::request(&socket, request, CLIENT_TIMEOUT)? {
            Response::Error { message } => bail!("scheduler: {message}"),
            other => Ok(other),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GpuChoice {
    /// Real GPUs through NVML (the same as `nvml`); no driver is an error naming `--gpu sim`,
    /// never a silent fall-back to simulated GPUs.
    Auto,
    /// Real GPUs through NVML; no driver is an error.
    Nvml,
    /// Simulated GPUs (--sim-gpus, --sim-gpu-mem): for tests and trying ladle out.
    Sim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MpsChoice {
    /// Start or adopt MPS when nvidia-cuda-mps-control exists (never on simulated GPUs).
    Auto,
    /// Require MPS.
    On,
    /// Run jobs without MPS.
    Off,
}

#[derive(Debug, Args)]
pub(crate) struct SchedulerArgs {
    #[command(flatten)]
    dir: DirArg,
    #[command(flatten)]
    options: DaemonOptions,
    #[command(flatten)]
    observe: crate::observe::ObserveArgs,
}

/// How a scheduler daemon admits jobs: shared by `ladle scheduler` and `ladle sweep` (which
/// starts a private one when none is running).
#[derive(Debug, Args)]
pub(crate) struct DaemonOptions {
    /// Admission policy: exclusive, carma-most-free, carma-least-util, carma-first-fit,
    /// carma-best-fit, or ladle (CARMA's rules plus backfill, reservations, per-job MPS
    /// memory limits, learned estimates and feed affinity).
    #[arg(long, default_value = "ladle")]
    policy: String,
    /// Which GPUs to schedule.
    #[arg(long, value_enum, default_value_t = GpuChoice::Auto)]
    gpu: GpuChoice,
    /// Simulated GPUs (with --gpu sim).
    #[arg(long, default_value_t = 2)]
    sim_gpus: usize,
    /// Memory of each simulated GPU (e.g. 40GiB; a bare number is MiB).
    #[arg(long, default_value = "40GiB")]
    sim_gpu_mem: String,
    /// Whether jobs run under NVIDIA MPS.
    #[arg(long, value_enum, default_value_t = MpsChoice::Auto)]
    mps: MpsChoice,
    /// Memory estimate for a job submitted without --gpu-mem and never seen before.
    #[arg(long, default_value = "4GiB")]
    default_gpu_mem: String,
    /// Times a job that fails with CUDA out of memory is retried (alone, with a raised
    /// estimate) before it counts as failed.
    #[arg(long, default_value_t = 3)]
    max_oom_retries: u32,
    /// Seconds a GPU takes no further job after a dispatch (default: the policy's, 20 s;
    /// 0 for the exclusive baseline).
    #[arg(long)]
    settle_s: Option<f64>,
    /// CPU cores shared by registered feeds' decode threads and jobs submitted with --cpus
    /// (default: this machine's).
    #[arg(long)]
    cpu_cores: Option<u32>,
    /// Host memory shared by live feeds' rings, the decoded-sample cache's budget and jobs
    /// submitted with --host-mem (e.g. 200GiB; default: 90% of this machine's memory, or of
    /// its cgroup's limit).
    #[arg(long, value_name = "SIZE")]
    host_mem: Option<String>,
    /// Simulated GPUs only: a JSON file of what they show beside the scheduler's jobs, e.g.
    /// `{"gpus": [{"gpu": 0, "foreign": [{"pid": 4242, "mem_mib": 8000}], "failing":
    /// ["mps_processes"], "compute_mode": "exclusive_process"}]}` (other users' processes,
    /// failing NVML calls, compute modes: the real-GPU paths, without a GPU).
    #[arg(long, value_name = "FILE")]
    sim_scenario: Option<PathBuf>,
    /// DCGM profiling metrics for GPUs without GPM (A100, L40): `auto` runs `dcgmi dmon` from
    /// PATH when one is there, `off` never (the compute screen then reads utilisation only),
    /// or the path of a `dcgmi` to run.
    #[arg(long, default_value = "auto", value_name = "auto|off|PATH")]
    dcgm: String,
    /// Seconds a job must be seen on its GPUs, with their telemetry windows full, before its
    /// peak memory counts as measured (default: the policy's, 30 s). A job placed alone
    /// until measured (one that declared no memory, or an out-of-memory retry) takes
    /// neighbours only then, and its family packs by the peak.
    #[arg(long, value_name = "S")]
    measure_s: Option<f64>,
    /// Telemetry and admission period, milliseconds (a 30-sample window spans 30 periods).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    tick_ms: u64,
    /// Schedule only these GPUs of the machine: comma-separated device indices, N of
    /// /dev/nvidiaN as Slurm's SLURM_JOB_GPUS names them (not CUDA's numbering), or UUIDs
    /// (GPU-…), e.g. `2,3` or `GPU-8932f937-…`. Default: the GPUs this process was given (a
    /// Slurm allocation, else CUDA_VISIBLE_DEVICES in CUDA's numbering), else every GPU. An
    /// MPS control daemon started by the scheduler then sees only these; with simulated GPUs,
    /// one is simulated per GPU listed. A GPU the machine does not have is an error.
    #[arg(long, value_name = "LIST")]
    only_gpus: Option<String>,
    /// Gone: `--only-gpus LIST` (named apart from a job's or a run's GPU count).
    #[arg(long = "gpus", hide = true, value_name = "LIST")]
    old_gpus: Option<String>,
    /// Write jobs' stdout and stderr to DIR/ID/ATTEMPT.out and .err instead of the state
    /// directory (e.g. a shared submit directory; the claim and status files that keep
    /// launches exactly-once stay in the state directory). `ladle logs` reads them there.
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Finished jobs the scheduler keeps (in `ladle queue` and its journal's snapshot), the
    /// newest; older ones are forgotten when the journal is compacted.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    keep_finished: usize,
    /// Finished jobs whose log (and claim and status) files are kept, the newest; the
    /// others' are removed.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    keep_logs: usize,
    /// Days a finished job's files are kept at most, whatever --keep-logs says (0: no
    /// limit).
    #[arg(long, default_value_t = 30.0, value_name = "DAYS")]
    keep_days: f64,
}

impl DaemonOptions {
    /// The GPUs to schedule and where they came from: `--only-gpus`, else those this process was
    /// given (a Slurm allocation, `CUDA_VISIBLE_DEVICES`: [`given_gpus`]), else every GPU.
    fn given_gpus(
        &self,
        get: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<(Option<Vec<GpuSelector>>, Option<String>)> {
        if let Some(list) = &self.old_gpus {
            bail!(
                "--gpus is now --only-gpus (the GPUs to schedule): --only-gpus {list}; the GPUs \
                 each run or job needs at once are --gpus-per-run N (ladle sweep) and \
                 --gpus-per-job N (ladle submit)"
            );
        }
        if let Some(list) = &self.only_gpus {
            return Ok((
                Some(parse_gpu_list("--only-gpus", list)?),
                Some(format!("--only-gpus {list}")),
            ));
        }
        match given_gpus(get) {
            Ok(Some((gpus, from))) => Ok((Some(gpus), Some(from))),
            Ok(None) => Ok((None, None)),
            // Simulated GPUs need no grant from Slurm.
            Err(AllocationError::NoSlurmGpus { .. }) if self.simulated() => Ok((None, None)),
            Err(e) => Err(e).context(
                "reading the GPUs this process was given (pass --only-gpus LIST to choose them)",
            ),
        }
    }

    /// Whether the GPUs are simulated (`--gpu sim`).
    pub(crate) fn simulated(&self) -> bool {
        self.gpu == GpuChoice::Sim
    }

    /// The daemon's configuration for state directory `dir`.
    pub(crate) fn config(&self, dir: PathBuf) -> anyhow::Result<DaemonConfig> {
        let mut config = DaemonConfig::new(dir);
        config.policy = Policy::named(&self.policy)?;
        if let Some(settle) = self.settle_s {
            if !(settle.is_finite() && settle >= 0.0) {
                bail!("--settle-s must be a number ≥ 0");
            }
            config.policy.settle_s = settle;
        }
        let sim_memory_mib = parse_mib(&self.sim_gpu_mem).context("--sim-gpu-mem")?;
        if self.sim_gpus == 0 || sim_memory_mib == 0 {
            bail!("--sim-gpus and --sim-gpu-mem must be positive");
        }
        config.gpu = match self.gpu {
            GpuChoice::Auto | GpuChoice::Nvml => GpuBackend::Nvml,
            GpuChoice::Sim => GpuBackend::Sim {
                gpus: self.sim_gpus,
                memory_mib: sim_memory_mib,
            },
        };
        config.mps = match self.mps {
            MpsChoice::Auto => MpsMode::Auto,
            MpsChoice::On => MpsMode::On,
            MpsChoice::Off => MpsMode::Off,
        };
        config.default_estimate_mib =
            parse_mib(&self.default_gpu_mem).context("--default-gpu-mem")?;
        config.max_oom_retries = self.max_oom_retries;
        if let Some(mem) = &self.host_mem {
            config.host_mem_mib = parse_mib(mem).context("--host-mem")?;
        }
        if let Some(cores) = self.cpu_cores {
            config.cpu_cores = cores;
        }
        if let Some(path) = &self.sim_scenario {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--sim-scenario {}", path.display()))?;
            config.sim_scenario = Some(
                SimScenario::from_json(&text)
                    .with_context(|| format!("--sim-scenario {}", path.display()))?,
            );
        }
        config.dcgm = match self.dcgm.as_str() {
            "auto" => DcgmMode::Auto,
            "off" => DcgmMode::Off,
            path => DcgmMode::Program(path.into()),
        };
        if let Some(measure) = self.measure_s {
            if !(measure.is_finite() && measure >= 0.0) {
                bail!("--measure-s must be a number ≥ 0");
            }
            config.policy.measure_s = measure;
        }
        if self.tick_ms == 0 {
            bail!("--tick-ms must be at least 1");
        }
        config.tick = std::time::Duration::from_millis(self.tick_ms);
        (config.allocated, config.gpus_from) = self.given_gpus(|k| std::env::var(k).ok())?;
        config.log_dir = self.log_dir.clone();
        if !(self.keep_days.is_finite() && self.keep_days >= 0.0) {
            bail!("--keep-days must be a number ≥ 0");
        }
        config.retention.keep_finished = self.keep_finished;
        config.retention.keep_logs = self.keep_logs;
        config.retention.keep_logs_for = if self.keep_days > 0.0 {
            Some(
                std::time::Duration::try_from_secs_f64(self.keep_days * 86_400.0)
                    .context("--keep-days is too large")?,
            )
        } else {
            None
        };
        Ok(config)
    }
}

pub(crate) fn run_daemon(args: SchedulerArgs) -> anyhow::Result<()> {
    let dir = args.dir.resolve()?;
    let config = args.options.config(dir.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    eprintln!(
        "ladle scheduler on {} (policy {}); Ctrl-C or SIGTERM stops it, running jobs continue",
        daemon::socket_path(&dir).display(),
        config.policy.name
    );
    // The observer asks the daemon over its socket, like any client; until the daemon is up
    // its looks record that it does not answer.
    let observer = args.observe.start(ladle_observe::Sockets {
        scheduler: Some(daemon::socket_path(&dir)),
        ..ladle_observe::Sockets::default()
    })?;
    let ran = daemon::run(config, stop).with_context(|| format!("scheduler on {}", dir.display()));
    if let Some(observer) = observer {
        observer.stop();
    }
    ran
}

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Device memory the job needs per GPU (e.g. 6GiB, 512MiB); trusted, and under MPS the
    /// job's memory limit is derived from it. Default: under the `ladle` policy 1.1 × the
    /// largest peak measured for the job's family (see --family); for a family never
    /// measured, the scheduler's --default-gpu-mem as a guess, which only reserves memory
    /// and never limits the job: it runs alone or with ample room until its peak is measured.
    #[arg(long)]
    gpu_mem: Option<String>,
    /// The family whose measured memory this job shares (runs of one sweep, say). Default:
    /// the command with its arguments' values left out (`train.py --lr 0.1` and `train.py
    /// --lr 0.01` are one family).
    #[arg(long, value_name = "NAME")]
    family: Option<String>,
    /// GPUs the job needs at once (a `torchrun --nproc_per_node 2` job: 2).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    gpus_per_job: u32,
    /// Gone: `--gpus-per-job N` (named apart from a scheduler's `--only-gpus LIST`).
    #[arg(long = "gpus", hide = true, value_name = "N")]
    old_gpus: Option<String>,
    /// The producer feed the job consumes (`ladle serve --name NAME`, registered with this
    /// scheduler): the job gets its socket in LADLE_SOCKET, and consumers of one feed are
    /// placed together. A name no live feed has is refused.
    #[arg(long)]
    feed: Option<String>,
    /// CPU cores the job keeps busy itself (e.g. its DataLoader workers): it waits while
    /// feeds' decode threads and other such jobs leave fewer free. A job of a feed needs none.
    #[arg(long)]
    cpus: Option<u32>,
    /// Host memory the job needs (e.g. 8GiB): it waits while live feeds' rings, the
    /// decoded-sample cache's budget and other such jobs leave less free.
    #[arg(long, value_name = "SIZE")]
    host_mem: Option<String>,
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for the job, 1–100 (default: unset, all SMs).
    #[arg(long)]
    thread_percentage: Option<u32>,
    /// The environment the job gets, as sbatch's --export: `ALL` (default) this shell's
    /// whole environment (its venv, PYTHONPATH, HF_HOME, keys) and nothing of the
    /// scheduler's; `NONE` the scheduler's own environment; `VAR,…` the scheduler's plus
    /// these variables of this shell. ladle's variables (LADLE_JOB_ID, CUDA_VISIBLE_DEVICES,
    /// MPS's) are set on top either way. At most 128 KiB. GPUs named in the environment
    /// the job gets (CUDA_VISIBLE_DEVICES, a Slurm allocation) confine it to those of the
    /// scheduler's GPUs; naming others is refused.
    #[arg(long, value_name = "ALL|NONE|VAR,…", default_value = "ALL")]
    export: String,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    /// The command, after `--`: run directly (not through a shell) in the current directory,
    /// with the environment --export says plus LADLE_JOB_ID, CUDA_VISIBLE_DEVICES (GPU UUIDs)
    /// and, under MPS, the MPS variables; stdout and stderr go to per-attempt log files.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The environment `--export` (`ALL`, `NONE` or `VAR,…`) gives a job out of `vars` (this
/// process's), and whether it is the whole of it ([`JobSpec::whole_env`]). Variables whose
/// name or value is not UTF-8 cannot cross the socket: left out with `ALL` (said on stderr),
/// an error when named.
pub(crate) fn export(
    how: &str,
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> anyhow::Result<(Vec<(String, String)>, bool)> {
    let vars: Vec<(std::ffi::OsString, std::ffi::OsString)> = vars.collect();
    let utf8 = |(n, v): &(std::ffi::OsString, std::ffi::OsString)| {
        Some((n.to_str()?.to_owned(), v.to_str()?.to_owned()))
    };
    match how {
        "ALL" => {
            let mut env = Vec::with_capacity(vars.len());
            for var in &vars {
                match utf8(var) {
                    Some(pair) => env.push(pair),
                    None => eprintln!(
                        "ladle: {} is not UTF-8 and is left out of the job's environment",
                        var.0.to_string_lossy()
                    ),
                }
            }
            Ok((env, true))
        }
        "NONE" => Ok((Vec::new(), false)),
        names => {
            let mut env = Vec::new();
            for name in names.split(',').map(str::trim) {
                let Some(var) = vars.iter().find(|(n, _)| n == name) else {
                    bail!("--export {names}: {name} is not set in this environment");
                };
                env.push(utf8(var).with_context(|| format!("--export: {name} is not UTF-8"))?);
            }
            Ok((env, false))
        }
    }
}

/// A job's `--gpu-mem` (as `ladle submit` and `ladle sweep` take it), in MiB.
pub(crate) fn parse_gpu_mem(arg: Option<&str>) -> anyhow::Result<Option<u64>> {
    arg.map(parse_mib).transpose().context("--gpu-mem")
}

pub(crate) fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    if let Some(n) = &args.old_gpus {
        bail!(
            "--gpus is now --gpus-per-job (GPUs this job needs at once): --gpus-per-job {n}; \
             a scheduler's GPUs to schedule are --only-gpus LIST"
        );
    }
    let gpu_mem_mib = parse_gpu_mem(args.gpu_mem.as_deref())?;
    let (env, whole_env) = export(&args.export, std::env::vars_os())?;
    let spec = JobSpec {
        command: args.command,
        cwd: std::env::current_dir().context("current directory")?,
        gpu_mem_mib,
        gpus: args.gpus_per_job,
        feed: args.feed,
        thread_percentage: args.thread_percentage,
        env,
        whole_env,
        cpus: args.cpus,
        host_mem_mib: args
            .host_mem
            .as_deref()
            .map(parse_mib)
            .transpose()
            .context("--host-mem")?,
        family: args.family,
    };
    let response = args.dir.request(&Request::Submit(spec))?;
    let Response::Submitted { id, estimate_mib } = response else {
        bail!("unexpected answer: {response:?}");
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({"id": id, "estimate_mib": estimate_mib})
        );
    } else {
        println!("submitted job {id} (estimate {})", format_mib(estimate_mib));
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct QueueArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Print one JSON object {"policy", "jobs": [...], "gpus": [...], "totals", "omitted"}.
    #[arg(long)]
    json: bool,
    /// Every job the scheduler knows, oldest first, read a page at a time (without it:
    /// running and queued jobs and the latest finished ones).
    #[arg(long)]
    all: bool,
    /// Only this job (repeatable).
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<u64>,
    /// Only jobs submitted with this feed (a sweep's runs carry its feed).
    #[arg(long, value_name = "NAME")]
    feed: Option<String>,
}

pub(crate) fn queue(args: QueueArgs) -> anyhow::Result<()> {
    let response = args.dir.request(&Request::Queue)?;
    let Response::Queue {
        policy,
        jobs,
        gpus,
        totals,
        omitted,
        admission_rounds,
        gpus_from,
    } = response
    else {
        bail!("unexpected answer: {response:?}");
    };
    let paged = args.all || !args.ids.is_empty() || args.feed.is_some();
    if args.json {
        let (jobs, omitted) = if paged {
            let mut all = Vec::new();
            query_jobs(&args, |page| all.extend_from_slice(page))?;
            let known = totals.queued
                + totals.running
                + totals.succeeded
                + totals.failed
                + totals.cancelled
                + totals.interrupted;
            let omitted = known.saturating_sub(all.len() as u64);
            (all, omitted)
        } else {
            (jobs, omitted)
        };
        let answer = Response::Queue {
            policy,
            jobs,
            gpus,
            totals,
            omitted,
            admission_rounds,
            gpus_from,
        };
        crate::records::print_line(&serde_json::to_string(&answer)?)?;
        return Ok(());
    }
    println!("policy {policy}");
    match &gpus_from {
        Some(from) => println!(
            "GPUs: the {} this scheduler was given, by {from}",
            gpus.len()
        ),
        None => println!("GPUs: every GPU of this machine ({})", gpus.len()),
    }
    // Jobs name GPUs by the scheduler's numbering, 0..k; under --only-gpus NVML's may differ.
    for (number, g) in gpus.iter().enumerate() {
        let note = if g.info.unsuitable.is_empty() {
            String::new()
        } else {
            format!("  UNSUITABLE: {}", g.info.unsuitable.join("; "))
        };
        let metrics = match g.info.compute_source {
            ComputeSource::Gpm => "GPM",
            ComputeSource::Dcgm => "DCGM",
            _ => "utilisation only (compute screen degraded)",
        };
        let nvml = if g.info.index as usize == number {
            String::new()
        } else {
            format!(" (NVML {})", g.info.index)
        };
        println!(
            "gpu {number}{nvml} {} {}: {} / {} used, SM risk {:.2}, {} jobs, metrics {metrics}{note}",
            g.info.name,
            g.info.uuid,
            format_mib(g.memory_used_mib),
            format_mib(g.info.memory_total_mib),
            g.sm_activity_risk,
            g.jobs
        );
    }
    if let Response::Feeds {
        feeds,
        omitted,
        host_mem,
        ..
    } = args.dir.request(&Request::Feeds)?
    {
        if host_mem.total_mib > 0 {
            println!(
                "host memory: {} of {} (feeds' rings {}, decoded-sample cache {}, jobs {})",
                format_mib(host_mem.busy_mib()),
                format_mib(host_mem.total_mib),
                format_mib(host_mem.rings_mib),
                format_mib(host_mem.cache_mib),
                format_mib(host_mem.jobs_mib)
            );
        }
        for f in &feeds {
            println!(
                "feed {:?} on {} ({}, {} decode threads, pid {})",
                f.name,
                f.socket.display(),
                f.dataset,
                f.threads,
                f.pid
            );
        }
        if omitted > 0 {
            println!("… and {omitted} more feeds");
        }
    }
    println!(
        "jobs: {} queued, {} running, {} succeeded, {} failed, {} cancelled, {} interrupted",
        totals.queued,
        totals.running,
        totals.succeeded,
        totals.failed,
        totals.cancelled,
        totals.interrupted
    );
    println!(
        "{:>5}  {:<12} {:<6} {:>11} {:>9} {:>4}  command",
        "id", "state", "gpus", "estimate", "peak", "runs"
    );
    let mut guessed = false;
    if paged {
        query_jobs(&args, |page| {
            guessed |= page.iter().any(|j| j.basis != Basis::Declared);
            print_jobs(page);
        })?;
    } else {
        guessed = jobs.iter().any(|j| j.basis != Basis::Declared);
        print_jobs(&jobs);
        if omitted > 0 {
            println!(
                "… {omitted} older finished jobs not listed (`ladle queue --all` lists every job)"
            );
        }
    }
    if guessed {
        println!(
            "estimate: m = measured for its family, ? = a guess (reserves memory, limits nothing)"
        );
    }
    Ok(())
}

/// Pages through the jobs `--all`, `--id` and `--feed` ask for, handing each page to `page`
/// as it comes; ids the scheduler does not know are an error, after the rest.
fn query_jobs(args: &QueueArgs, mut page: impl FnMut(&[JobView])) -> anyhow::Result<()> {
    let mut unknown = Vec::new();
    // A query names at most MAX_QUERY_IDS jobs: more are asked in turn.
    let chunks: Vec<Vec<u64>> = if args.ids.is_empty() {
        vec![Vec::new()]
    } else {
        args.ids
            .chunks(protocol::MAX_QUERY_IDS)
            .map(<[u64]>::to_vec)
            .collect()
    };
    for ids in chunks {
        let mut query = JobQuery {
            ids,
            feed: args.feed.clone(),
            after: None,
        };
        loop {
            let response = args.dir.request(&Request::Jobs(query.clone()))?;
            let Response::Jobs {
                jobs,
                unknown: missing,
                next,
            } = response
            else {
                bail!("unexpected answer: {response:?}");
            };
            page(&jobs);
            if query.after.is_none() {
                unknown.extend(missing);
            }
            match next {
                Some(after) if query.after != Some(after) => query.after = Some(after),
                _ => break,
            }
        }
    }
    if !unknown.is_empty() {
        let ids: Vec<String> = unknown.iter().map(u64::to_string).collect();
        bail!("the scheduler has no job {}", ids.join(", "));
    }
    Ok(())
}

fn print_jobs(jobs: &[JobView]) {
    for j in jobs {
        let (state, gpus) = match &j.state {
            JobState::Queued => ("queued".to_owned(), "-".to_owned()),
            JobState::Running { gpus, .. } => (
                "running".to_owned(),
                gpus.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            JobState::Succeeded => ("succeeded".to_owned(), "-".to_owned()),
            JobState::Failed { .. } => ("failed".to_owned(), "-".to_owned()),
            JobState::Cancelled => ("cancelled".to_owned(), "-".to_owned()),
            JobState::Interrupted { .. } => ("interrupted".to_owned(), "-".to_owned()),
            JobState::Held { .. } => ("held".to_owned(), "-".to_owned()),
            _ => ("?".to_owned(), "-".to_owned()),
        };
        println!(
            "{:>5}  {:<12} {:<6} {:>11} {:>9} {:>4}  {}",
            j.id,
            state,
            gpus,
            format!(
                "{}{}",
                format_mib(j.estimate_mib),
                match j.basis {
                    Basis::Declared => "",
                    Basis::Measured => " m",
                    _ => " ?",
                }
            ),
            j.peak_mib.map_or("-".to_owned(), format_mib),
            j.attempts,
            j.spec.command.join(" ")
        );
        if let JobState::Failed { reason }
        | JobState::Interrupted { reason }
        | JobState::Held { reason } = &j.state
        {
            println!("{:>5}  └ {reason}", "");
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The job id (from `ladle submit` or `ladle queue`).
    id: u64,
    /// Seconds a running job gets between SIGTERM and SIGKILL, to checkpoint (default: 10;
    /// at most 3600).
    #[arg(long, value_name = "S")]
    grace: Option<f64>,
}

#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The held jobs to queue again (`ladle queue` shows them as held, with why).
    #[arg(required = true)]
    ids: Vec<u64>,
}

/// `ladle release`: queues held jobs (jobs a damaged journal line may concern).
pub(crate) fn release(args: ReleaseArgs) -> anyhow::Result<()> {
    for &id in &args.ids {
        args.dir.request(&Request::Release { id })?;
        println!("released job {id}: queued");
    }
    Ok(())
}

pub(crate) fn cancel(args: CancelArgs) -> anyhow::Result<()> {
    args.dir.request(&Request::Cancel {
        id: args.id,
        grace_s: args.grace,
    })?;
    println!("cancelled job {}", args.id);
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The job id.
    id: u64,
    /// Print the log file paths only.
    #[arg(long)]
    paths: bool,
}

pub(crate) fn logs(args: LogsArgs) -> anyhow::Result<()> {
    let response = args.dir.request(&Request::Logs { id: args.id })?;
    let Response::Logs {
        attempts, omitted, ..
    } = response
    else {
        bail!("unexpected answer: {response:?}");
    };
    if omitted > 0 {
        eprintln!("({omitted} older attempts left out: their logs are in the same directory)");
    }
    if attempts.is_empty() {
        eprintln!("job {} has not started yet", args.id);
    }
    for a in attempts {
        if args.paths {
            println!("{}\n{}", a.stdout_path.display(), a.stderr_path.display());
            continue;
        }
        println!(
            "== attempt {} stdout ({})",
            a.attempt,
            a.stdout_path.display()
        );
        print!("{}", a.stdout);
        println!(
            "== attempt {} stderr ({})",
            a.attempt,
            a.stderr_path.display()
        );
        print!("{}", a.stderr);
    }
    Ok(())
}
