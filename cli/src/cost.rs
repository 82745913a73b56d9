//! `ladle cost REC --instances SHAPES.csv`: what a recorded sweep would cost on each instance
//! shape, with ladle and with private pipelines, from its measured rates. The model and the
//! reading of shapes live in `ladle_observe::cost` (pure); this is the command around them.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ladle_observe::cost::{Basis, Estimate, Shape, Workload, read_shapes};
use ladle_observe::report::Recording;
use serde::Serialize;

#[derive(Debug, Args)]
pub(crate) struct CostArgs {
    /// A sweep's recording (`ladle sweep --record DIR`).
    #[arg(value_name = "REC")]
    recording: PathBuf,
    /// Instance shapes, a CSV with the header `name,vcpus,gpus,gpu_model,gpu_mem_gib,
    /// usd_per_hour` (`examples/instances.csv` is one, its prices examples to edit).
    #[arg(long, value_name = "SHAPES.csv")]
    instances: PathBuf,
    /// CPU milliseconds per sample of your own private pipeline (measured by you). Without
    /// it: the figure `ladle bench baseline --record REC` wrote into the recording, else the
    /// feed's own decode cost (a lower bound of what private pipelines cost).
    #[arg(long, value_name = "MS")]
    private_cpu_ms: Option<f64>,
    /// Print one JSON object (`workload`, `shapes`, `cheapest`) instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw $ per run against vCPUs per GPU (1 to 32), one line per shape (solid: with
    /// ladle, dashed: private pipelines), as a PNG.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Output<'a> {
    workload: &'a Workload,
    shapes: &'a [Estimate],
    /// The shape whose sweep with ladle costs least, among those with the GPU the runs were
    /// measured on when any has it.
    cheapest: Option<&'a str>,
    /// Shapes that cannot run the sweep, and why.
    skipped: Vec<String>,
}

pub(crate) fn run(args: CostArgs) -> anyhow::Result<std::process::ExitCode> {
    let nodes = ladle_sweep::slurm::node_recordings(&args.recording);
    if !nodes.is_empty() {
        let names: Vec<&str> = nodes.iter().map(|(name, _)| name.as_str()).collect();
        anyhow::bail!(
            "{} holds one recording per node of a Slurm sweep ({}): each node is a machine, \
             so price one node's workload, e.g. `ladle cost {}`",
            args.recording.display(),
            names.join(", "),
            nodes[0].1.display()
        );
    }
    let text = std::fs::read_to_string(&args.instances)
        .with_context(|| format!("reading {}", args.instances.display()))?;
    let shapes =
        read_shapes(&text).map_err(|e| anyhow::anyhow!("{}: {e}", args.instances.display()))?;
    let private = match args.private_cpu_ms {
        Some(ms) if ms.is_finite() && ms > 0.0 => Some((ms / 1000.0, Basis::Given)),
        Some(ms) => anyhow::bail!("--private-cpu-ms {ms}: a positive number of milliseconds"),
        None => crate::baseline::read(&args.recording)?
            .map(|b| (b.cpu_per_sample(), Basis::Measured))
            .filter(|(c, _)| *c > 0.0),
    };
    let recording = Recording::read(&args.recording)?;
    let workload = Workload::from_recording(&recording, private)?;
    let mut estimates = Vec::new();
    let mut skipped = Vec::new();
    for shape in &shapes {
        match workload.estimate(shape) {
            Ok(e) => estimates.push(e),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    if let Some(path) = &args.plot {
        plot(&workload, &shapes, path).with_context(|| format!("drawing {}", path.display()))?;
        eprintln!("ladle cost: wrote {}", path.display());
    }
    // Among the shapes with the GPU the runs were measured on, when any has it: another
    // GPU's price rests on an assumed speed.
    let measured_gpu = |e: &&Estimate| e.gpu_as_measured != Some(false);
    let pool: Vec<&Estimate> = if estimates.iter().any(|e| measured_gpu(&e)) {
        estimates.iter().filter(measured_gpu).collect()
    } else {
        estimates.iter().collect()
    };
    let cheapest = (pool.into_iter())
        .min_by(|a, b| a.ladle.usd.total_cmp(&b.ladle.usd))
        .map(|e| e.name.as_str());
    if args.json {
        let out = Output {
            workload: &workload,
            shapes: &estimates,
            cheapest,
            skipped,
        };
        println!("{}", serde_json::to_string(&out)?);
        return Ok(std::process::ExitCode::SUCCESS);
    }
    print!("{}", table(&workload, &estimates, cheapest));
    for why in skipped {
        eprintln!("ladle cost: skipped {why}");
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The most vCPUs per GPU the plot shows.
const PLOT_VCPUS_PER_GPU: u32 = 32;

/// $ per run against vCPUs per GPU for every shape that can run the sweep: how many vCPUs
/// keep its GPUs fed, with ladle and with private pipelines (each shape at its own price).
fn plot(w: &Workload, shapes: &[Shape], path: &std::path::Path) -> anyhow::Result<()> {
    use crate::plot::{Line, canvas, colour, lines, present};
    let title = "ladle cost: $ per run against vCPUs per GPU (solid: ladle, dashed: private)";
    let root = canvas(path, (1100, 600), title)?;
    let mut drawn = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let (mut ladle, mut private) = (Vec::new(), Vec::new());
        for per_gpu in 1..=PLOT_VCPUS_PER_GPU {
            let with = Shape {
                vcpus: per_gpu.saturating_mul(shape.gpus),
                ..shape.clone()
            };
            if let Ok(e) = w.estimate(&with) {
                ladle.push((f64::from(per_gpu), e.ladle.usd_per_run));
                private.push((f64::from(per_gpu), e.private.usd_per_run));
            }
        }
        let colour = colour(i);
        drawn.push(Line {
            label: Some(shape.name.clone()),
            points: ladle,
            colour,
            dashed: false,
        });
        drawn.push(Line {
            label: None,
            points: private,
            colour,
            dashed: true,
        });
    }
    let x = ("vCPUs per GPU", 1.0..f64::from(PLOT_VCPUS_PER_GPU));
    lines(&root, "", x, "$ per run", 0.0, &drawn)?;
    present(&root, path)
}

/// The markdown table, the workload it rests on first.
fn table(w: &Workload, estimates: &[Estimate], cheapest: Option<&str>) -> String {
    let basis = match w.private_basis {
        Basis::Measured => "measured",
        Basis::LowerBound => "the feed's own decode cost: a lower bound",
        Basis::Given => "given",
    };
    let mut out = format!(
        "{} runs, {} samples; GPU-bound rate {:.0} samples/s per run (measured beside the \
         runs that shared its GPU); CPU per sample consumed: {:.3} ms with ladle (each \
         decoded sample served {:.2} runs), {:.3} ms with private pipelines ({basis})\n\n",
        w.runs.len(),
        w.samples(),
        w.mean_gpu_bound_rate(),
        1e3 * w.ladle_cpu_per_sample(),
        w.sharing,
        1e3 * w.private_cpu_per_sample(),
    );
    out.push_str(
        "| shape | runs/GPU | ladle samples/s | ladle $ | ladle $/run | ladle min vCPU/GPU \
         | private samples/s | private $ | private $/run | private min vCPU/GPU |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    let mut other_gpu = false;
    for e in estimates {
        let mut name = if Some(e.name.as_str()) == cheapest {
            format!("**{}** (cheapest)", e.name)
        } else {
            e.name.clone()
        };
        if e.gpu_as_measured == Some(false) {
            name.push_str(" †");
            other_gpu = true;
        }
        let (l, p) = (&e.ladle, &e.private);
        out.push_str(&format!(
            "| {name} | {} | {:.0} ({}) | {:.4} | {:.4} | {} | {:.0} ({}) | {:.4} | {:.4} | {} |\n",
            e.runs_per_gpu,
            l.samples_per_s,
            l.bound,
            l.usd,
            l.usd_per_run,
            l.min_vcpus_per_gpu,
            p.samples_per_s,
            p.bound,
            p.usd,
            p.usd_per_run,
            p.min_vcpus_per_gpu,
        ));
    }
    if other_gpu {
        out.push_str(&format!(
            "\n† not the GPU the runs were measured on ({}): its estimate assumes they go as fast \
             per GPU there; record a run on it to know\n",
            w.gpu_name.as_deref().unwrap_or("unknown"),
        ));
    }
    out
}
