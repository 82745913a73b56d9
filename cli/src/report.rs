//! `ladle report DIR`: plots a recording (`--record DIR` of `serve`, `scheduler` or `sweep`)
//! as PNGs and prints its summary (also written as `summary.md`). Reading and summarising
//! live in `ladle_observe::report`; the charts in `crate::plot::recorded`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use ladle_observe::report::{Recording, Summary};

use crate::plot::recorded;

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The recording's directory (what `--record DIR` wrote).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
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

pub(crate) fn run(args: ReportArgs) -> anyhow::Result<()> {
    let recording = Recording::read(&args.dir)?;
    let out = args.out.as_ref().unwrap_or(&args.dir);
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
