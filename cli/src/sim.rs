//! `ladle sim`: replay a trace under several admission policies and compare them;
//! `ladle sim generate`: write a CARMA-like trace.
//!
//! The report goes to stdout through [`print_report`]; a reader that goes away early
//! (`ladle sim … --json | head -c 10`) ends the command quietly, with success, as a closed
//! pipe ends `cat` ([`quiet_on_broken_pipe`]).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use ladle_scheduler::policy::Policy;
use ladle_scheduler::sim::generate::{GenerateConfig, generate};
use ladle_scheduler::sim::{SimConfig, SimReport, simulate_jobs, trace};
use ladle_scheduler::units::parse_mib;

use crate::records::quiet_on_broken_pipe;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct SimArgs {
    #[command(subcommand)]
    command: Option<SimCommand>,
    #[command(flatten)]
    replay: ReplayArgs,
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Write a CARMA-like synthetic trace: 30% light jobs (≤ 1 GiB, ≤ 1 min), 60%
    /// medium/heavy (1–30 GiB, 1–90 min), 10% heavy two-GPU jobs; Poisson arrivals.
    Generate(GenerateArgs),
}

#[derive(Debug, Args)]
struct GenerateArgs {
    /// Number of jobs.
    #[arg(long, default_value_t = 60)]
    jobs: usize,
    /// Seed: the same seed writes the same trace on every machine.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Mean gap between arrivals, seconds (exponentially distributed).
    #[arg(long, default_value_t = 60.0)]
    mean_gap_s: f64,
    /// The CSV file to write (columns job_id,submit_s,duration_s,mem_mib,sm_activity,gpus).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// The trace: CSV with columns job_id,submit_s,duration_s,mem_mib,sm_activity,gpus
    /// (seconds, MiB per GPU, SM demand 0–1, GPUs) and an optional feed column.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Simulated GPUs.
    #[arg(long, default_value_t = 3)]
    gpus: usize,
    /// Memory per GPU (e.g. 40GiB, 80GiB, 24576MiB; a bare number is MiB).
    #[arg(long, default_value = "40GiB")]
    gpu_mem: String,
    /// Comma-separated policies to compare: exclusive, carma-most-free, carma-least-util,
    /// carma-first-fit, carma-best-fit, ladle; or `all`.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Scale every job's memory estimate (1.0: honest estimates; 0.5: jobs need twice what
    /// they declare, to exercise out-of-memory recovery).
    #[arg(long, default_value_t = 1.0)]
    estimate_scale: f64,
    /// Settle lock after each dispatch, seconds (default: 20, the policies' own).
    #[arg(long)]
    settle_s: Option<f64>,
    /// Print one JSON object {"policies": {NAME: {...}}} instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write every job's schedule to this CSV file (policy, job_id, submit_s, start_s,
    /// finish_s, gpus, oom_crashes; start and finish of the last attempt, empty if it failed).
    #[arg(long)]
    per_job: Option<PathBuf>,
}

pub(crate) fn run(args: SimArgs) -> anyhow::Result<()> {
    match args.command {
        Some(SimCommand::Generate(g)) => {
            if g.jobs == 0 || g.mean_gap_s.is_nan() || g.mean_gap_s < 0.0 {
                bail!("--jobs must be at least 1 and --mean-gap-s at least 0");
            }
            let jobs = generate(&GenerateConfig {
                jobs: g.jobs,
                seed: g.seed,
                mean_gap_s: g.mean_gap_s,
            });
            trace::write(&g.out, &jobs)?;
            eprintln!("wrote {} jobs to {}", jobs.len(), g.out.display());
            Ok(())
        }
        None => replay(args.replay),
    }
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let Some(path) = args.trace else {
        bail!("--trace FILE.csv is required (or use `ladle sim generate` to write one)");
    };
    let jobs = trace::read(&path)?;
    if !(args.estimate_scale.is_finite() && args.estimate_scale > 0.0) {
        bail!("--estimate-scale must be a positive number");
    }
    let config = SimConfig {
        gpus: args.gpus,
        gpu_mem_mib: parse_mib(&args.gpu_mem).context("--gpu-mem")?,
        estimate_scale: args.estimate_scale,
        ..SimConfig::default()
    };
    let names: Vec<&str> = if args.policy == "all" {
        Policy::NAMES.to_vec()
    } else {
        args.policy.split(',').map(str::trim).collect()
    };
    let mut reports: BTreeMap<String, SimReport> = BTreeMap::new();
    let mut order = Vec::new();
    let mut per_job = String::from("policy,job_id,submit_s,start_s,finish_s,gpus,oom_crashes\n");
    for name in names {
        let mut policy = Policy::named(name)?;
        if let Some(settle) = args.settle_s {
            if !(settle.is_finite() && settle >= 0.0) {
                bail!("--settle-s must be a number ≥ 0");
            }
            if !policy.exclusive {
                policy.settle_s = settle;
            }
        }
        let (report, outcomes) = simulate_jobs(&jobs, policy, &config)
            .with_context(|| format!("simulating {}", path.display()))?;
        let time = |t: Option<f64>| t.map_or(String::new(), |t| format!("{t:.1}"));
        for o in outcomes {
            let gpus: Vec<String> = o.gpus.iter().map(usize::to_string).collect();
            per_job.push_str(&format!(
                "{name},{},{:.1},{},{},{},{}\n",
                o.id,
                o.submit_s,
                time(o.start_s),
                time(o.finish_s),
                gpus.join(" "),
                o.oom_crashes
            ));
        }
        order.push(name.to_owned());
        reports.insert(name.to_owned(), report);
    }
    if let Some(out) = &args.per_job {
        std::fs::write(out, per_job).with_context(|| format!("writing {}", out.display()))?;
    }
    let heading = format!(
        "{} jobs on {} GPUs of {}, estimates x{}",
        jobs.len(),
        config.gpus,
        args.gpu_mem,
        args.estimate_scale
    );
    let mut stdout = io::stdout().lock();
    let printed = print_report(&mut stdout, args.json, &heading, &order, &reports)
        .and_then(|()| stdout.flush());
    quiet_on_broken_pipe(printed)
}

/// Writes the comparison: one JSON object `{"policies": {NAME: {...}}}` when `json`, else
/// `heading` and a table in `order`.
fn print_report(
    out: &mut impl Write,
    json: bool,
    heading: &str,
    order: &[String],
    reports: &BTreeMap<String, SimReport>,
) -> io::Result<()> {
    if json {
        return writeln!(out, "{}", serde_json::json!({ "policies": reports }));
    }
    writeln!(out, "{heading}")?;
    let baseline = reports.get("exclusive").map(|r| r.makespan_s);
    writeln!(
        out,
        "{:<18} {:>11} {:>9} {:>11} {:>9} {:>5} {:>10} {:>6}",
        "policy", "makespan_s", "vs excl", "mean_jct_s", "gpu_util", "ooms", "energy_kwh", "failed"
    )?;
    for (name, r) in order.iter().filter_map(|n| Some((n, reports.get(n)?))) {
        let versus = baseline.map_or("-".to_owned(), |b| {
            format!("{:+.1}%", 100.0 * (r.makespan_s - b) / b)
        });
        writeln!(
            out,
            "{:<18} {:>11.0} {:>9} {:>11.0} {:>9.3} {:>5} {:>10.2} {:>6}",
            name,
            r.makespan_s,
            versus,
            r.mean_jct_s,
            r.mean_gpu_util,
            r.oom_crashes,
            r.energy_kwh,
            r.failed_jobs
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe whose reader is gone.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
    }

    fn reports() -> (Vec<String>, BTreeMap<String, SimReport>) {
        let trace = generate(&GenerateConfig {
            jobs: 4,
            seed: 1,
            mean_gap_s: 10.0,
        });
        let policy = Policy::named("ladle").unwrap();
        let (report, _) = simulate_jobs(&trace, policy, &SimConfig::default()).unwrap();
        let order = vec!["ladle".to_owned()];
        (order, BTreeMap::from([("ladle".to_owned(), report)]))
    }

    #[test]
    fn a_closed_pipe_ends_the_report_quietly_in_json_and_as_a_table() {
        let (order, reports) = reports();
        for json in [true, false] {
            let printed = print_report(&mut ClosedPipe, json, "heading", &order, &reports);
            assert_eq!(
                printed.as_ref().map_err(io::Error::kind),
                Err(io::ErrorKind::BrokenPipe)
            );
            assert!(quiet_on_broken_pipe(printed).is_ok());
        }
    }

    #[test]
    fn other_write_errors_are_still_errors() {
        let full = Err(io::Error::from(io::ErrorKind::StorageFull));
        let e = quiet_on_broken_pipe(full).unwrap_err();
        assert!(e.to_string().contains("stdout"), "{e}");
    }

    #[test]
    fn the_json_report_is_one_line_with_every_policy() {
        let (order, reports) = reports();
        let mut out = Vec::new();
        print_report(&mut out, true, "heading", &order, &reports).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(value["policies"]["ladle"]["makespan_s"].is_number());
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    }
}
