//! `ladle report DIR`: plots a recording (`--record DIR` of `serve`, `scheduler` or `sweep`)
//! as PNGs and prints its summary (also written as `summary.md`). Reading and summarising
//! live in `ladle_observe::report`; the charts in `crate::plot::recorded`.
//! `ladle report --merge DIR…` merges sweep directories instead (`crate::slurm::merge`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use ladle_observe::report::{Recording, Summary};

use crate::plot::recorded;

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The recording's directory (what `--record DIR` wrote; for a `--slurm` sweep, the
    /// folder of the nodes' recordings, each reported in turn); with --merge, sweep
    /// directories.
    #[arg(value_name = "DIR", required = true)]
    dirs: Vec<PathBuf>,
    /// Merge sweep directories into one report instead: a `ladle sweep --slurm` directory
    /// (its nodes' folders, lost nodes' runs included; written as DIR/report.json), or the
    /// `--out` directories of `ladle sweep --shard K/N` runs.
    #[arg(long, conflicts_with = "out")]
    pub(crate) merge: bool,
    /// With --merge: print the merged report as one JSON object.
    #[arg(long, requires = "merge")]
    pub(crate) json: bool,
    /// Write the PNGs and summary.md here instead of into DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// A chart: its file name and how it is drawn.
type Chart = (
    &'static str,
    fn(&Recording, &Path) -> anyhow::Result<recorded::Skipped>,
);

const CHARTS: [Chart; 4] = [
    ("runs.png", recorded::runs),
    ("gpus.png", recorded::gpus),
    ("feed.png", recorded::feed),
    ("cost.png", recorded::cost),
];

pub(crate) fn run(args: ReportArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.merge {
        return crate::slurm::merge(&args.dirs, args.json);
    }
    let [dir] = args.dirs.as_slice() else {
        anyhow::bail!("one recording at a time (or --merge for sweep directories)");
    };
    let nodes = ladle_sweep::slurm::node_recordings(dir);
    if nodes.is_empty() {
        report(dir, args.out.as_deref().unwrap_or(dir))?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    // A Slurm sweep's `--record DIR`: one recording per node (its own feed, scheduler, GPUs
    // and clock), each reported in its own folder.
    for (name, node) in &nodes {
        println!("# {name}\n");
        let out = args
            .out
            .as_ref()
            .map_or_else(|| node.clone(), |o| o.join(name));
        report(node, &out)?;
        println!();
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Plots one recording `dir` into `out` and prints its summary.
fn report(dir: &Path, out: &Path) -> anyhow::Result<()> {
    let recording = Recording::read(dir)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (file, draw) in CHARTS {
        let path = out.join(file);
        match draw(&recording, &path).with_context(|| format!("drawing {}", path.display()))? {
            None => eprintln!("ladle report: wrote {}", path.display()),
            Some(why) => eprintln!("ladle report: skipped {file}: {why}"),
        }
    }
    let summary = Summary::of(&recording).markdown(&recording);
    let path = out.join("summary.md");
    std::fs::write(&path, &summary).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("ladle report: wrote {}", path.display());
    print!("{summary}");
    Ok(())
}
