//! `ladle sim`: replay a trace under several admission policies and compare them;
//! `ladle sim generate`: write a CARMA-like trace; `ladle sim --generate-seeds 1-10`: replay
//! the generated traces of several seeds and print each seed's results and their mean.
//!
//! Every table gives `makespan ÷ lower bound`, the bound of
//! [`ladle_scheduler::sim::LowerBound`]: the largest of the latest arrival + duration, the
//! total SM work per GPU and the total memory-time per GPU memory.
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
use serde::Serialize;

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
    /// (seconds, MiB per GPU, SM demand 0–1, GPUs) and optional feed, declared (true/false:
    /// whether the job declares its memory) and family columns.
    #[arg(long, conflicts_with = "generate_seeds")]
    trace: Option<PathBuf>,
    /// Instead of --trace: replay the generated traces of these seeds (`1-10`, `3`,
    /// `1,4,7`) and print every seed's results and the mean.
    #[arg(long)]
    generate_seeds: Option<String>,
    /// Jobs per generated trace (with --generate-seeds).
    #[arg(long, default_value_t = 60)]
    jobs: usize,
    /// Mean gap between arrivals of a generated trace, seconds (with --generate-seeds).
    #[arg(long, default_value_t = 60.0)]
    mean_gap_s: f64,
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
    /// Replay with the queue in this fixed order instead of arrival order (with --trace):
    /// a file of job ids, earliest first, separated by spaces, commas or newlines; jobs it
    /// does not list follow in arrival order. Every policy of the run gets it. An
    /// instrument, not a policy: it asks what a better order could gain, with hindsight no
    /// online scheduler has (benches/sim/hindsight.py searches for one).
    #[arg(long, conflicts_with = "generate_seeds")]
    order: Option<PathBuf>,
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
        None if args.replay.generate_seeds.is_some() => seeds(args.replay),
        None => replay(args.replay),
    }
}

/// The simulated machine of the arguments.
fn machine(args: &ReplayArgs) -> anyhow::Result<SimConfig> {
    if !(args.estimate_scale.is_finite() && args.estimate_scale > 0.0) {
        bail!("--estimate-scale must be a positive number");
    }
    Ok(SimConfig {
        gpus: args.gpus,
        gpu_mem_mib: parse_mib(&args.gpu_mem).context("--gpu-mem")?,
        estimate_scale: args.estimate_scale,
        ..SimConfig::default()
    })
}

/// The policies of the arguments, with `--settle-s` applied.
fn policies(args: &ReplayArgs) -> anyhow::Result<Vec<Policy>> {
    let names: Vec<&str> = if args.policy == "all" {
        Policy::NAMES.to_vec()
    } else {
        args.policy.split(',').map(str::trim).collect()
    };
    names
        .into_iter()
        .map(|name| {
            let mut policy = Policy::named(name)?;
            if let Some(settle) = args.settle_s {
                if !(settle.is_finite() && settle >= 0.0) {
                    bail!("--settle-s must be a number ≥ 0");
                }
                if !policy.exclusive {
                    policy.settle_s = settle;
                }
            }
            Ok(policy)
        })
        .collect()
}

/// Each job's rank in the queue order `text` (job ids, earliest first, separated by
/// whitespace or commas); jobs it does not list rank after those it does.
fn queue_ranks(jobs: &[trace::TraceJob], text: &str) -> anyhow::Result<Vec<u32>> {
    let index: BTreeMap<&str, usize> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (j.id.as_str(), i))
        .collect();
    let listed: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .collect();
    let unlisted = u32::try_from(listed.len()).context("too many jobs listed")?;
    let mut ranks = vec![unlisted; jobs.len()];
    for (rank, id) in (0..unlisted).zip(listed) {
        let Some(&i) = index.get(id) else {
            bail!("job {id:?} is not in the trace");
        };
        if ranks[i] != unlisted {
            bail!("job {id:?} is listed twice");
        }
        ranks[i] = rank;
    }
    Ok(ranks)
}

/// Parses `1-10`, `3` or `1,4,7`.
fn parse_seeds(text: &str) -> anyhow::Result<Vec<u64>> {
    let mut seeds = Vec::new();
    for part in text.split(',').map(str::trim) {
        let number = |s: &str| {
            s.trim()
                .parse::<u64>()
                .with_context(|| format!("--generate-seeds: {s:?} is not a seed"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b || b - a >= 10_000 {
                    bail!("--generate-seeds: {part:?} is not a range of at most 10000 seeds");
                }
                seeds.extend(a..=b);
            }
            None => seeds.push(number(part)?),
        }
    }
    Ok(seeds)
}

/// One seed's results.
#[derive(Debug, Serialize)]
struct SeedResult {
    seed: u64,
    lower_bound_s: f64,
    policies: BTreeMap<String, SimReport>,
}

/// The mean over seeds of one policy's results.
#[derive(Debug, Default, Serialize)]
struct MeanResult {
    makespan_s: f64,
    makespan_over_bound: f64,
    mean_jct_s: f64,
    mean_gpu_util: f64,
    oom_crashes: f64,
    failed_jobs: f64,
}

fn seeds(args: ReplayArgs) -> anyhow::Result<()> {
    let seeds = parse_seeds(args.generate_seeds.as_deref().unwrap_or_default())?;
    if args.jobs == 0 || !(args.mean_gap_s.is_finite() && args.mean_gap_s >= 0.0) {
        bail!("--jobs must be at least 1 and --mean-gap-s at least 0");
    }
    let config = machine(&args)?;
    let policies = policies(&args)?;
    let order: Vec<String> = policies.iter().map(|p| p.name.clone()).collect();
    let mut results = Vec::new();
    for &seed in &seeds {
        let jobs = generate(&GenerateConfig {
            jobs: args.jobs,
            seed,
            mean_gap_s: args.mean_gap_s,
        });
        let mut reports = BTreeMap::new();
        for policy in &policies {
            let (report, _) = simulate_jobs(&jobs, policy.clone(), &config)
                .with_context(|| format!("simulating seed {seed} under {}", policy.name))?;
            reports.insert(policy.name.clone(), report);
        }
        let lower_bound_s = reports.values().next().map_or(0.0, |r| r.lower_bound_s);
        results.push(SeedResult {
            seed,
            lower_bound_s,
            policies: reports,
        });
    }
    let n = results.len().max(1) as f64;
    let means: BTreeMap<String, MeanResult> = order
        .iter()
        .map(|name| {
            let mut m = MeanResult::default();
            for r in results.iter().filter_map(|s| s.policies.get(name)) {
                m.makespan_s += r.makespan_s / n;
                m.makespan_over_bound += r.makespan_s / r.lower_bound_s.max(f64::MIN_POSITIVE) / n;
                m.mean_jct_s += r.mean_jct_s / n;
                m.mean_gpu_util += r.mean_gpu_util / n;
                m.oom_crashes += f64::from(r.oom_crashes) / n;
                m.failed_jobs += f64::from(r.failed_jobs) / n;
            }
            (name.clone(), m)
        })
        .collect();
    let heading = format!(
        "generated traces of {} jobs (mean gap {} s), seeds {}, on {} GPUs of {}, estimates x{}",
        args.jobs,
        args.mean_gap_s,
        args.generate_seeds.as_deref().unwrap_or_default(),
        config.gpus,
        args.gpu_mem,
        args.estimate_scale
    );
    let mut stdout = io::stdout().lock();
    let printed = if args.json {
        writeln!(
            stdout,
            "{}",
            serde_json::json!({ "seeds": results, "mean": means })
        )
    } else {
        print_seeds(&mut stdout, &heading, &order, &results, &means)
    }
    .and_then(|()| stdout.flush());
    quiet_on_broken_pipe(printed)
}

/// Writes the per-seed tables: makespan ÷ lower bound, mean JCT, OOM crashes; then, when
/// `ladle` and CARMA rules are both there, ladle against the best CARMA rule of each seed.
fn print_seeds(
    out: &mut impl Write,
    heading: &str,
    order: &[String],
    results: &[SeedResult],
    means: &BTreeMap<String, MeanResult>,
) -> io::Result<()> {
    writeln!(out, "{heading}")?;
    type Cell = fn(&SimReport) -> String;
    type Mean = fn(&MeanResult) -> String;
    let tables: [(&str, Cell, Mean); 4] = [
        (
            "makespan / lower bound",
            |r| {
                format!(
                    "{:.3}",
                    r.makespan_s / r.lower_bound_s.max(f64::MIN_POSITIVE)
                )
            },
            |m| format!("{:.3}", m.makespan_over_bound),
        ),
        (
            "makespan_s",
            |r| format!("{:.0}", r.makespan_s),
            |m| format!("{:.0}", m.makespan_s),
        ),
        (
            "mean_jct_s",
            |r| format!("{:.0}", r.mean_jct_s),
            |m| format!("{:.0}", m.mean_jct_s),
        ),
        (
            "oom_crashes (failed jobs)",
            |r| format!("{} ({})", r.oom_crashes, r.failed_jobs),
            |m| format!("{:.1} ({:.1})", m.oom_crashes, m.failed_jobs),
        ),
    ];
    for (title, cell, mean) in tables {
        writeln!(out, "\n{title}")?;
        write!(out, "{:>6} {:>9}", "seed", "bound_s")?;
        for name in order {
            write!(out, " {name:>16}")?;
        }
        writeln!(out)?;
        for s in results {
            write!(out, "{:>6} {:>9.0}", s.seed, s.lower_bound_s)?;
            for name in order {
                let text = s.policies.get(name).map_or_else(|| "-".to_owned(), cell);
                write!(out, " {text:>16}")?;
            }
            writeln!(out)?;
        }
        write!(out, "{:>6} {:>9}", "mean", "")?;
        for name in order {
            let text = means.get(name).map_or_else(|| "-".to_owned(), mean);
            write!(out, " {text:>16}")?;
        }
        writeln!(out)?;
    }
    let carma: Vec<&String> = order.iter().filter(|n| n.starts_with("carma-")).collect();
    if carma.is_empty() || !order.iter().any(|n| n == "ladle") {
        return Ok(());
    }
    writeln!(
        out,
        "\nladle against the best CARMA rule of each seed (by makespan; ratio < 1: ladle is ahead)"
    )?;
    writeln!(
        out,
        "{:>6} {:>18} {:>14} {:>14} {:>12} {:>12}",
        "seed", "best carma", "makespan ratio", "mean_jct ratio", "ladle ooms", "carma ooms"
    )?;
    let (mut makespan_sum, mut jct_sum) = (0.0, 0.0);
    for s in results {
        let Some(ladle) = s.policies.get("ladle") else {
            continue;
        };
        let Some((best, b)) = carma
            .iter()
            .filter_map(|n| Some((*n, s.policies.get(*n)?)))
            .min_by(|a, b| a.1.makespan_s.total_cmp(&b.1.makespan_s))
        else {
            continue;
        };
        let (m, j) = (
            ladle.makespan_s / b.makespan_s,
            ladle.mean_jct_s / b.mean_jct_s,
        );
        makespan_sum += m;
        jct_sum += j;
        writeln!(
            out,
            "{:>6} {:>18} {:>14.3} {:>14.3} {:>12} {:>12}",
            s.seed, best, m, j, ladle.oom_crashes, b.oom_crashes
        )?;
    }
    let n = results.len().max(1) as f64;
    writeln!(
        out,
        "{:>6} {:>18} {:>14.3} {:>14.3}",
        "mean",
        "",
        makespan_sum / n,
        jct_sum / n
    )
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let Some(path) = args.trace.clone() else {
        bail!(
            "--trace FILE.csv or --generate-seeds 1-10 is required (or use `ladle sim generate` to write a trace)"
        );
    };
    let jobs = trace::read(&path)?;
    let mut config = machine(&args)?;
    if let Some(order) = &args.order {
        let text = std::fs::read_to_string(order)
            .with_context(|| format!("reading {}", order.display()))?;
        config.queue_order = Some(
            queue_ranks(&jobs, &text).with_context(|| format!("--order {}", order.display()))?,
        );
    }
    let mut reports: BTreeMap<String, SimReport> = BTreeMap::new();
    let mut order = Vec::new();
    let mut per_job = String::from("policy,job_id,submit_s,start_s,finish_s,gpus,oom_crashes\n");
    for policy in policies(&args)? {
        let name = policy.name.clone();
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
        order.push(name.clone());
        reports.insert(name, report);
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
        "{:<18} {:>11} {:>9} {:>9} {:>11} {:>9} {:>5} {:>10} {:>6}",
        "policy",
        "makespan_s",
        "vs excl",
        "/ bound",
        "mean_jct_s",
        "gpu_util",
        "ooms",
        "energy_kwh",
        "failed"
    )?;
    for (name, r) in order.iter().filter_map(|n| Some((n, reports.get(n)?))) {
        let versus = baseline.map_or("-".to_owned(), |b| {
            format!("{:+.1}%", 100.0 * (r.makespan_s - b) / b)
        });
        writeln!(
            out,
            "{:<18} {:>11.0} {:>9} {:>9.3} {:>11.0} {:>9.3} {:>5} {:>10.2} {:>6}",
            name,
            r.makespan_s,
            versus,
            r.makespan_s / r.lower_bound_s.max(f64::MIN_POSITIVE),
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

    #[test]
    fn a_queue_order_ranks_listed_jobs_first_and_refuses_unknown_or_repeated_ids() {
        let jobs: Vec<trace::TraceJob> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| trace::TraceJob {
                id: (*id).to_owned(),
                ..trace::TraceJob::default()
            })
            .collect();
        assert_eq!(queue_ranks(&jobs, "c, a\n").unwrap(), vec![1, 2, 0, 2]);
        assert_eq!(queue_ranks(&jobs, "").unwrap(), vec![0; 4]);
        let unknown = queue_ranks(&jobs, "a x").unwrap_err().to_string();
        assert!(unknown.contains("\"x\" is not in the trace"), "{unknown}");
        let twice = queue_ranks(&jobs, "b a b").unwrap_err().to_string();
        assert!(twice.contains("\"b\" is listed twice"), "{twice}");
    }

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
    fn seeds_are_ranges_lists_or_single_numbers() {
        assert_eq!(parse_seeds("1-3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seeds("7").unwrap(), vec![7]);
        assert_eq!(parse_seeds("1,4, 5-6").unwrap(), vec![1, 4, 5, 6]);
        for bad in ["", "3-1", "a", "1-100000"] {
            assert!(parse_seeds(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_seed_tables_give_every_seed_and_the_mean_against_the_lower_bound() {
        let trace = generate(&GenerateConfig {
            jobs: 6,
            seed: 1,
            mean_gap_s: 10.0,
        });
        let names = ["carma-most-free", "ladle"];
        let mut policies = BTreeMap::new();
        for name in names {
            let policy = Policy::named(name).unwrap();
            let (report, _) = simulate_jobs(&trace, policy, &SimConfig::default()).unwrap();
            policies.insert(name.to_owned(), report);
        }
        let results = vec![SeedResult {
            seed: 1,
            lower_bound_s: policies["ladle"].lower_bound_s,
            policies,
        }];
        let order: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let means = order
            .iter()
            .map(|n| (n.clone(), MeanResult::default()))
            .collect();
        let mut out = Vec::new();
        print_seeds(&mut out, "heading", &order, &results, &means).unwrap();
        let text = String::from_utf8(out).unwrap();
        for needle in [
            "makespan / lower bound",
            "mean_jct_s",
            "oom_crashes (failed jobs)",
            "best CARMA rule",
            "0 (0)",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
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
