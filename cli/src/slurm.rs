//! `ladle sweep --slurm`: writes the batch script (`ladle_sweep::slurm::script`), submits
//! it, follows the job (its output file's lines, per node and per run) and prints the merged
//! report when it ends; `--resume DIR` submits only the runs that did not succeed.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ladle_sweep::slurm::{self, GpuRequest, Manifest, ScriptSpec};
use ladle_sweep::submit;

use crate::sweep::SweepArgs;

/// Options of `ladle sweep` that only the submitting side uses (with whether they take a
/// value): left out of the nodes' command line.
const SUBMIT_ONLY: [(&str, bool); 10] = [
    ("--slurm", false),
    ("--nodes", true),
    ("--gpus-per-node", true),
    ("--gres", true),
    ("--slurm-arg", true),
    ("--slurm-dry-run", false),
    ("--cancel-on-exit", false),
    ("--resume", true),
    ("--out", true),
    ("--json", false),
];

/// The node sweep's options: this invocation's options after `sweep`, less those of the
/// submitting side, up to `--`.
fn node_args(argv: &[String]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut args = argv.iter().skip_while(|a| *a != "sweep").skip(1);
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        let name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
        match SUBMIT_ONLY.iter().find(|(n, _)| *n == name) {
            Some((_, true)) if !arg.contains('=') => {
                args.next();
            }
            Some(_) => {}
            None => kept.push(arg.clone()),
        }
    }
    kept
}

pub(crate) fn submit(args: SweepArgs) -> anyhow::Result<std::process::ExitCode> {
    let flags = crate::sweep::stop_flags()?;
    let (sweep, manifest) = match &args.slurm.resume {
        Some(dir) => {
            let sweep = dir
                .canonicalize()
                .with_context(|| format!("--resume {}", dir.display()))?;
            let mut manifest = Manifest::read(&sweep)?;
            let left = manifest.resume(&sweep)?;
            if left.is_empty() {
                eprintln!(
                    "ladle sweep: every run of {} has succeeded: nothing to resume",
                    sweep.display()
                );
                return finish(&sweep, args.json);
            }
            eprintln!(
                "ladle sweep: resuming {} of {} runs: {}",
                left.len(),
                manifest.runs.len(),
                left.join(" ")
            );
            (sweep, manifest)
        }
        None => {
            let dataset = args.feed.dataset()?;
            if !dataset.exists() {
                bail!("--dataset {}: no such file or directory", dataset.display());
            }
            let runs = crate::sweep::all_runs(&args)?;
            let runs = ladle_sweep::grid::select(runs, &args.only)?;
            let cwd = std::env::current_dir().context("current directory")?;
            let out = args
                .out
                .clone()
                .unwrap_or_else(|| ladle_sweep::ledger::default_out(&cwd));
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let sweep = out.canonicalize().unwrap_or(out);
            let gpus = match (args.slurm.gpus_per_node, &args.slurm.gres) {
                (Some(g), _) => GpuRequest::PerNode(g),
                (None, Some(spec)) => GpuRequest::Gres(spec.clone()),
                (None, None) => GpuRequest::None,
            };
            if args.slurm.nodes == 0 {
                bail!("--nodes must be at least 1");
            }
            let argv: Vec<String> = std::env::args().collect();
            let script = ScriptSpec {
                ladle: crate::self_exe().context("finding the ladle binary")?,
                sweep: sweep.clone(),
                cwd,
                nodes: args.slurm.nodes,
                gpus,
                slurm_args: args.slurm.slurm_arg.clone(),
                node_args: node_args(&argv),
                command: args.command.clone(),
                only: Vec::new(),
            };
            (
                sweep,
                Manifest {
                    runs,
                    script,
                    jobs: Vec::new(),
                },
            )
        }
    };
    let (script_path, text) = submit::write_script(&manifest)?;
    if args.slurm.slurm_dry_run {
        print!("{text}");
        eprintln!(
            "ladle sweep: wrote {} (submit it with `sbatch {}`)",
            script_path.display(),
            script_path.display()
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let submitted = Instant::now();
    let mut manifest = manifest;
    let id = submit::submit(&mut manifest, &script_path)?;
    let count = manifest.runs_to_submit();
    eprintln!(
        "ladle sweep: submitted Slurm job {id} ({count} runs on {} nodes); cancel it with `scancel {id}`",
        manifest.script.nodes
    );
    follow(&id, &sweep, &args, &flags, submitted)?;
    finish(&sweep, args.json)
}

/// Follows job `id` until it ends: its output file's new lines on stderr, its state when it
/// changes; a stop signal cancels it (--cancel-on-exit), asks (a terminal), or leaves it.
fn follow(
    id: &str,
    sweep: &Path,
    args: &SweepArgs,
    flags: &ladle_sweep::engine::StopFlags,
    submitted: Instant,
) -> anyhow::Result<()> {
    let mut output = submit::Tail::new(sweep.join(format!("slurm-{id}.out")));
    let mut last_state = String::new();
    let mut cancelled: Option<Instant> = None;
    loop {
        let view = slurm::job_view(id)?;
        eprint!("{}", output.new_lines());
        let Some(view) = view else {
            eprintln!("ladle sweep: Slurm no longer knows job {id}");
            return Ok(());
        };
        if view.state != last_state {
            let reason = if view.reason.is_empty() || view.reason == "None" {
                String::new()
            } else {
                format!(" ({})", view.reason)
            };
            eprintln!(
                "ladle sweep: job {id} {} on {}{reason} after {:.1} s",
                view.state,
                if view.nodes.is_empty() {
                    "-"
                } else {
                    &view.nodes
                },
                submitted.elapsed().as_secs_f64()
            );
            last_state.clone_from(&view.state);
        }
        if view.ended() {
            eprint!("{}", output.new_lines());
            return Ok(());
        }
        if flags.stop.load(Ordering::SeqCst) && cancelled.is_none() {
            if args.slurm.cancel_on_exit || ask(&format!("cancel Slurm job {id} (scancel)?")) {
                slurm::cancel(id)?;
                eprintln!("ladle sweep: cancelled job {id}; waiting for it to end");
                cancelled = Some(Instant::now());
                flags.stop.store(false, Ordering::SeqCst);
            } else {
                eprintln!(
                    "ladle sweep: job {id} goes on; `scancel {id}` cancels it, \
                     `ladle report --merge {}` prints its report once it ends",
                    sweep.display()
                );
                bail!("stopped following job {id}");
            }
        }
        if cancelled.is_some_and(|at| at.elapsed() > Duration::from_secs(120)) {
            bail!("job {id} was cancelled but has not ended after 120 s");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Asks a yes/no question on the terminal; no terminal is a no.
fn ask(question: &str) -> bool {
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!("ladle sweep: not a terminal, so not cancelling (pass --cancel-on-exit)");
        return false;
    }
    eprint!("\n{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// Merges the sweep directory's nodes, writes its report and prints it.
fn finish(sweep: &Path, json: bool) -> anyhow::Result<std::process::ExitCode> {
    merge(std::slice::from_ref(&sweep.to_owned()), json).with_context(|| {
        format!(
            "no node of the sweep reported: see {}",
            sweep.join("slurm-JOBID.out").display()
        )
    })
}

/// `ladle report --merge DIR…`: merges sweep directories (a `--slurm` sweep's, or the
/// `--out` of shards run by hand) into one report, written as DIR/report.json when one
/// directory is given.
pub(crate) fn merge(dirs: &[PathBuf], json: bool) -> anyhow::Result<std::process::ExitCode> {
    let (report, ok) = submit::merge_dirs(dirs)?;
    crate::sweep::print_report(&report, json)?;
    Ok(if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_nodes_get_every_option_but_the_submitting_sides() {
        let argv = strings(&[
            "/bin/ladle",
            "sweep",
            "--slurm",
            "--nodes",
            "2",
            "--gpus-per-node=2",
            "--slurm-arg",
            "--partition=gpu",
            "--dataset",
            "/data",
            "--out",
            "/shared/s",
            "--json",
            "--gpu",
            "sim",
            "--",
            "train",
            "--out",
            "x",
        ]);
        assert_eq!(
            node_args(&argv),
            strings(&["--dataset", "/data", "--gpu", "sim"])
        );
    }
}
