//! What a sweep costs on a cloud instance shape, with ladle and with private pipelines, from
//! its measured rates: pure arithmetic (a [`Workload`] and [`Shape`]s in, [`Estimate`]s out),
//! apart from reading recordings (`ladle cost`) and the sweep's end report.
//!
//! The model. A sweep is `R` runs, run `i` consuming `sᵢ` samples. Each run, while it did not
//! wait for data, went at its *GPU-bound rate* `gᵢ` (samples/s, measured where it ran, beside
//! whatever runs shared its GPU: interference between collocated runs is in the measurement,
//! not modelled). On a shape with `G` GPUs of `M` MiB, `⌊M / peak⌋` runs fit on a GPU (their
//! measured memory peaks), so `min(R, G·fit)` run at once, starting in the sweep's order as
//! places free up. The vCPUs are shared out as `cost/fluid.rs` describes: with ladle, one stream that
//! the feed decodes at `c_f` CPU-seconds a sample, no faster than the fastest running run
//! wants it, each run taking it at `min(gᵢ, stream)` (a slower run skims: `producer`'s pacing,
//! so the slowest run does not set the others' pace); with private pipelines, each run
//! decoding for itself at `c_p` a sample, the vCPUs shared fairly. Every consumed sample also
//! costs its run's own process `r`. The sweep ends with its last run and costs its hours at
//! the shape's price. What it does not know (start-up, the scheduler's admission delay, the
//! waits pacing gives a skimming run, another GPU's speed) `benches/README.md` ("Cost")
//! measures.

mod fluid;

use fluid::Loading;
use serde::{Deserialize, Serialize};

/// One run as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRate {
    /// Its name.
    pub name: String,
    /// Samples it consumed between its first and last look (its rate's numerator).
    pub samples: u64,
    /// Seconds it ran between those looks, less the time it waited for data.
    pub busy_seconds: f64,
    /// Samples it consumed in all (0: unknown, taken as `samples`).
    #[serde(default)]
    pub consumed: u64,
    /// Its highest GPU memory, MiB, when measured.
    pub gpu_peak_mib: Option<u64>,
}

impl RunRate {
    /// Seconds it takes on GPUs alone (never waiting for data).
    pub fn gpu_seconds(&self) -> f64 {
        let rate = self.gpu_bound_rate();
        let all = if self.consumed > 0 {
            self.consumed
        } else {
            self.samples
        };
        if rate > 0.0 { all as f64 / rate } else { 0.0 }
    }

    /// Samples per second while it did not wait for data (0 when it never was busy).
    pub fn gpu_bound_rate(&self) -> f64 {
        if self.busy_seconds > 0.0 {
            self.samples as f64 / self.busy_seconds
        } else {
            0.0
        }
    }
}

/// Where the private pipelines' cost per sample comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Measured (`ladle bench baseline`: the user's transform in a DataLoader).
    Measured,
    /// The feed's own decode cost per sample: private pipelines cost at least this.
    LowerBound,
    /// A figure the user gave.
    Given,
}

/// What `ladle bench baseline` measured: a private pipeline (torchvision's transform in a
/// PyTorch DataLoader) over the sweep's dataset, written beside a recording as
/// [`crate::record::BASELINE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// The dataset it read.
    pub dataset: String,
    /// Samples it delivered.
    pub samples: u64,
    /// Seconds it ran.
    pub seconds: f64,
    /// CPU seconds of the loading process and its workers.
    pub cpu_seconds: f64,
    /// DataLoader workers.
    pub workers: u32,
    /// Samples per batch.
    pub batch_size: u32,
    /// Side of the crops.
    pub image_size: u32,
    /// The Python that ran it, and its torch and torchvision versions.
    pub python: String,
    /// torch's version.
    pub torch: String,
    /// torchvision's version.
    pub torchvision: String,
}

impl Baseline {
    /// CPU seconds per sample delivered (0 when it delivered none).
    pub fn cpu_per_sample(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.cpu_seconds / self.samples as f64
        }
    }
}

/// A measured sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Its runs, each measured between its first and last look.
    pub runs: Vec<RunRate>,
    /// Samples the runs consumed in all (the sweep's work; 0: the sum of the runs').
    #[serde(default)]
    pub samples_consumed: u64,
    /// CPU-seconds per sample the feed decoded.
    pub feed_cpu_per_sample: f64,
    /// Samples consumed over samples decoded: how many runs each decoded sample served.
    pub sharing: f64,
    /// CPU-seconds of the runs' own processes per sample they consumed (0 when unknown).
    pub run_cpu_per_sample: f64,
    /// CPU-seconds per sample of a private pipeline.
    pub private_cpu_per_sample: f64,
    /// Where that figure comes from.
    pub private_basis: Basis,
    /// The GPU the runs' rates were measured on (the recording's `gpus.csv`), when known.
    #[serde(default)]
    pub gpu_name: Option<String>,
}

/// A cloud instance shape (one row of `--instances`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    /// Its name (`p5.48xlarge`).
    pub name: String,
    /// vCPUs.
    pub vcpus: u32,
    /// GPUs.
    pub gpus: u32,
    /// The GPU's model, for the table.
    pub gpu_model: String,
    /// Memory per GPU, GiB.
    pub gpu_mem_gib: f64,
    /// Price per hour, dollars.
    pub usd_per_hour: f64,
}

/// The sweep on one shape, with one way of loading data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Samples per second the sweep goes at.
    pub samples_per_s: f64,
    /// What bounds it: `"gpu"` or `"cpu"`.
    pub bound: String,
    /// Seconds the sweep takes.
    pub wall_seconds: f64,
    /// Its price.
    pub usd: f64,
    /// Its price per run.
    pub usd_per_run: f64,
    /// Its price per 1000 samples.
    pub usd_per_1000_samples: f64,
    /// The fewest vCPUs per GPU that keep the GPUs fed (the sweep within 1% of its time
    /// with unlimited vCPUs).
    pub min_vcpus_per_gpu: u32,
    /// Samples decoded: by the feed (ladle), or by every pipeline (private).
    pub decoded: u64,
}

/// The sweep on one shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The shape's name.
    pub name: String,
    /// Runs that fit on one of its GPUs (measured peaks).
    pub runs_per_gpu: u32,
    /// Whether its GPU is the model the rates were measured on (`None`: the recording does
    /// not say). When not, the estimate assumes the runs go as fast per GPU as measured.
    pub gpu_as_measured: Option<bool>,
    /// With ladle.
    pub ladle: Plan,
    /// With private pipelines.
    pub private: Plan,
}

/// Why a shape cannot run the sweep.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CostError {
    /// A run's memory peak is larger than the shape's GPU.
    #[error("{shape}: a run needs {peak_mib} MiB of GPU memory, its GPUs have {gpu_mib} MiB")]
    DoesNotFit {
        /// The shape.
        shape: String,
        /// The largest peak.
        peak_mib: u64,
        /// The GPU's memory.
        gpu_mib: u64,
    },
    /// The workload has no run that consumed anything while busy.
    #[error("no run consumed samples while busy: nothing to scale")]
    NoRate,
    /// The shape has no GPU or no vCPU.
    #[error("{0}: a shape needs at least one GPU and one vCPU")]
    Empty(String),
}

impl Workload {
    /// Samples the sweep consumes in all.
    pub fn samples(&self) -> u64 {
        if self.samples_consumed > 0 {
            self.samples_consumed
        } else {
            self.runs.iter().map(|r| r.samples).sum()
        }
    }

    /// The mean GPU-bound rate of its runs.
    pub fn mean_gpu_bound_rate(&self) -> f64 {
        let rates: Vec<f64> = (self.runs.iter())
            .map(RunRate::gpu_bound_rate)
            .filter(|&r| r > 0.0)
            .collect();
        if rates.is_empty() {
            0.0
        } else {
            rates.iter().sum::<f64>() / rates.len() as f64
        }
    }

    /// CPU-seconds per sample consumed with ladle.
    pub fn ladle_cpu_per_sample(&self) -> f64 {
        self.run_cpu_per_sample + self.feed_cpu_per_sample / self.sharing.max(1.0)
    }

    /// CPU-seconds per sample consumed with private pipelines.
    pub fn private_cpu_per_sample(&self) -> f64 {
        self.run_cpu_per_sample + self.private_cpu_per_sample
    }

    /// The sweep on `shape`.
    pub fn estimate(&self, shape: &Shape) -> Result<Estimate, CostError> {
        if shape.gpus == 0 || shape.vcpus == 0 {
            return Err(CostError::Empty(shape.name.clone()));
        }
        let rate = self.mean_gpu_bound_rate();
        if rate <= 0.0 {
            return Err(CostError::NoRate);
        }
        let gpu_mib = (shape.gpu_mem_gib * 1024.0) as u64;
        let peak = self.runs.iter().filter_map(|r| r.gpu_peak_mib).max();
        let runs_per_gpu = match peak {
            Some(0) | None => u32::MAX,
            Some(peak) if peak > gpu_mib => {
                return Err(CostError::DoesNotFit {
                    shape: shape.name.clone(),
                    peak_mib: peak,
                    gpu_mib,
                });
            }
            Some(peak) => u32::try_from(gpu_mib / peak).unwrap_or(u32::MAX),
        };
        let runs = u64::try_from(self.runs.len()).unwrap_or(u64::MAX).max(1);
        let at_once = runs.min(u64::from(shape.gpus) * u64::from(runs_per_gpu));
        let places = usize::try_from(at_once).unwrap_or(usize::MAX);
        let shared = Loading::Shared {
            feed_cpu: self.feed_cpu_per_sample,
        };
        let private = Loading::Private {
            cpu: self.private_cpu_per_sample,
        };
        Ok(Estimate {
            name: shape.name.clone(),
            runs_per_gpu: runs_per_gpu.min(u32::try_from(runs).unwrap_or(u32::MAX)),
            gpu_as_measured: self
                .gpu_name
                .as_deref()
                .map(|m| same_gpu(m, &shape.gpu_model)),
            ladle: self.plan(shape, places, shared),
            private: self.plan(shape, places, private),
        })
    }

    /// The runs as the fluid model takes them: a run measured without a rate goes at the
    /// mean rate.
    fn fluid_runs(&self) -> Vec<fluid::Run> {
        let mean = self.mean_gpu_bound_rate();
        (self.runs.iter())
            .map(|r| fluid::Run {
                samples: (if r.consumed > 0 {
                    r.consumed
                } else {
                    r.samples
                }) as f64,
                rate: Some(r.gpu_bound_rate())
                    .filter(|&g| g > 0.0)
                    .unwrap_or(mean),
            })
            .collect()
    }

    /// Seconds the runs take on GPUs alone (vCPUs without limit) with `places` of them at
    /// once: each starts, in the sweep's order, in the place that frees up first.
    pub fn gpu_seconds(&self, places: usize) -> f64 {
        let runs = self.fluid_runs();
        let free = Loading::Private { cpu: 0.0 };
        fluid::simulate(&runs, places, f64::INFINITY, 0.0, free).wall
    }

    fn plan(&self, shape: &Shape, places: usize, loading: Loading) -> Plan {
        let runs = self.fluid_runs();
        let on =
            |vcpus: f64| fluid::simulate(&runs, places, vcpus, self.run_cpu_per_sample, loading);
        let o = on(f64::from(shape.vcpus));
        let wall_seconds = o.wall;
        let samples: f64 = runs.iter().map(|r| r.samples).sum();
        let usd = wall_seconds / 3600.0 * shape.usd_per_hour;
        // The fewest vCPUs per GPU within 1% of the GPUs' own time (wall time only falls as
        // vCPUs are added, so a doubling search and a bisection find it).
        let gpus = f64::from(shape.gpus);
        let target = on(f64::INFINITY).wall * 1.01;
        let fed = |k: u32| on(f64::from(k) * gpus).wall <= target;
        // `hi` is fed, `lo` is not (0: not tried); none fed by 2^20 vCPUs a GPU: u32::MAX.
        let mut hi = 1u32;
        while !fed(hi) {
            if hi >= 1 << 20 {
                hi = u32::MAX;
                break;
            }
            hi *= 2;
        }
        let mut lo = if hi == u32::MAX { hi } else { hi / 2 };
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fed(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let min_vcpus_per_gpu = hi;
        Plan {
            samples_per_s: samples / wall_seconds.max(f64::MIN_POSITIVE),
            bound: if o.cpu_bound > 0.5 * o.wall {
                "cpu"
            } else {
                "gpu"
            }
            .to_owned(),
            wall_seconds,
            usd,
            usd_per_run: usd / self.runs.len().max(1) as f64,
            usd_per_1000_samples: usd / samples.max(1.0) * 1000.0,
            min_vcpus_per_gpu,
            decoded: o.decoded.round() as u64,
        }
    }
}

/// A sweep's wall time when all it knows is its GPUs' time and its CPU work (the sweep's end
/// report, the measured wall standing for the GPUs' time): the longer of that time and the
/// CPU work over `vcpus`, and which of the two it is (`"gpu"` or `"cpu"`). The fluid model
/// of [`Workload::estimate`] is never shorter.
pub fn wall_seconds(gpu_seconds: f64, cpu_seconds: f64, vcpus: f64) -> (f64, &'static str) {
    let cpu_wall = cpu_seconds / vcpus.max(f64::MIN_POSITIVE);
    if cpu_wall > gpu_seconds {
        (cpu_wall, "cpu")
    } else {
        (gpu_seconds, "gpu")
    }
}

/// Whether GPU `model` (`L4`, `H100`) names the GPU `measured` (NVML's name, `NVIDIA H100
/// 80GB HBM3`): one of the name's words, whole (so `L4` is not an `L40S`, nor `A10` an
/// `A100-SXM4-80GB`), case aside.
fn same_gpu(measured: &str, model: &str) -> bool {
    let model = model.trim();
    !model.is_empty()
        && (measured.split(|c: char| !c.is_ascii_alphanumeric()))
            .any(|word| word.eq_ignore_ascii_case(model))
}

/// Seconds between a recording's looks: what a run's last look can miss.
const LOOK_SECONDS: f64 = 1.0;

/// What a recording lacks to make a [`Workload`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    /// No `report.json`: not a sweep's recording.
    #[error(
        "{0} holds no sweep report (report.json): record a sweep with `ladle sweep --record DIR`"
    )]
    NoReport(String),
    /// No `consumers.csv`, or no row of a run.
    #[error("{0} has no consumer rows (consumers.csv): the runs' rates are unknown")]
    NoConsumers(String),
    /// The feed decoded nothing (a sweep of a feed that was already serving).
    #[error("the sweep's feed decoded nothing it can count (a feed that was already serving?)")]
    NoFeed,
}

impl Workload {
    /// The workload a sweep's recording measured. Each run's samples, time and wait come
    /// from its consumer's rows (the feed names a consumer after its run), its memory peak
    /// from its job's rows; the feed's CPU per sample from the report. `private`: CPU-seconds
    /// per sample of a private pipeline, measured or given, else the feed's own decode cost
    /// (a lower bound).
    pub fn from_recording(
        recording: &crate::report::Recording,
        private: Option<(f64, Basis)>,
    ) -> Result<Self, WorkloadError> {
        let dir = recording.dir.display().to_string();
        let report =
            (recording.report.as_ref()).ok_or_else(|| WorkloadError::NoReport(dir.clone()))?;
        let rows = (recording.consumers.as_ref())
            .ok_or_else(|| WorkloadError::NoConsumers(dir.clone()))?;
        let mut runs = Vec::new();
        // Each run's rate between its looks, and its CPU when measured.
        let mut seen_rate = Vec::new();
        let mut cpu = Vec::new();
        for run in &report.runs {
            let mine: Vec<_> = rows.iter().filter(|r| r.name == run.name).collect();
            let (Some(first), Some(last)) = (mine.first(), mine.last()) else {
                continue;
            };
            // Between its first look and its last (the recording looks once a second, so a
            // run's first and last partial seconds are left out of its rate, not biased).
            let samples = last.released.saturating_sub(first.released);
            let waited = (last.waited_s - first.waited_s).max(0.0);
            let seconds = last.time - first.time;
            if samples == 0 || seconds <= 0.0 {
                continue;
            }
            let peak = (recording.jobs.iter().flatten())
                .filter(|j| j.name == run.name)
                .filter_map(|j| j.peak_mib)
                .max();
            runs.push(RunRate {
                name: run.name.clone(),
                samples,
                busy_seconds: (seconds - waited).max(0.0),
                consumed: last.released,
                gpu_peak_mib: peak,
            });
            seen_rate.push(samples as f64 / seconds);
            cpu.push(run.cpu_seconds);
        }
        if runs.is_empty() {
            return Err(WorkloadError::NoConsumers(dir));
        }
        let feed = &report.feed;
        if feed.samples_published == 0 {
            return Err(WorkloadError::NoFeed);
        }
        // The recording looks once a second, so each run's last look misses up to a second
        // of its samples; the feed counted them all. Spread what the looks missed over the
        // runs by what each was seen to consume, at most a look's worth each (the rest is
        // other consumers', runs without looks, or a retried run's earlier attempt).
        let seen: u64 = runs.iter().map(|r| r.consumed).sum();
        if feed.samples_consumed > seen && seen > 0 {
            let missed = (feed.samples_consumed - seen) as f64;
            for (run, rate) in runs.iter_mut().zip(&seen_rate) {
                let share = missed * run.consumed as f64 / seen as f64;
                run.consumed += share.min(rate * LOOK_SECONDS).round() as u64;
            }
        }
        let feed_cpu_per_sample = feed.cpu_seconds / feed.samples_published as f64;
        let consumed = feed.samples_consumed.max(1) as f64;
        // The runs' own CPU, as their scheduler measured each; a report from before runs
        // carried it: the private-pipeline CPU less the feed's cost of what they consumed.
        // Per sample, over the runs whose CPU was measured (not one a restarted scheduler
        // adopted).
        let measured: Vec<(f64, u64)> = (cpu.iter().zip(&runs))
            .filter_map(|(c, r)| c.map(|c| (c, r.consumed)))
            .collect();
        let run_cpu_per_sample = if measured.is_empty() {
            (report.cost.private_pipelines_cpu_seconds
                - feed_cpu_per_sample * feed.samples_consumed as f64)
                .max(0.0)
                / consumed
        } else {
            let (cpu, samples) =
                (measured.iter()).fold((0.0, 0), |(c, n), (mc, mn)| (c + mc, n + mn));
            cpu / samples.max(1) as f64
        };
        let (private_cpu_per_sample, private_basis) =
            private.unwrap_or((feed_cpu_per_sample, Basis::LowerBound));
        Ok(Self {
            runs,
            samples_consumed: feed.samples_consumed,
            feed_cpu_per_sample,
            sharing: consumed / feed.samples_published as f64,
            run_cpu_per_sample,
            private_cpu_per_sample,
            private_basis,
            gpu_name: (recording.gpus.iter().flatten())
                .map(|g| g.name.clone())
                .find(|n| !n.is_empty()),
        })
    }
}

/// Reads instance shapes from CSV text with the header
/// `name,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour` (lines starting with `#` are
/// comments); errors name the line.
pub fn read_shapes(text: &str) -> Result<Vec<Shape>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let expected = [
        "name",
        "vcpus",
        "gpus",
        "gpu_model",
        "gpu_mem_gib",
        "usd_per_hour",
    ];
    let header = reader.headers().map_err(|e| e.to_string())?.clone();
    if header.iter().collect::<Vec<_>>() != expected {
        return Err(format!(
            "the header must be `{}`, not `{}`",
            expected.join(","),
            header.iter().collect::<Vec<_>>().join(",")
        ));
    }
    let mut shapes = Vec::new();
    for row in reader.deserialize::<Shape>() {
        let shape = row.map_err(|e| {
            let line = e.position().map_or(0, csv::Position::line);
            match e.kind() {
                csv::ErrorKind::Deserialize { err, .. } => {
                    let field = err.field().and_then(|k| expected.get(k as usize));
                    format!(
                        "line {line}: {}: {}",
                        field.unwrap_or(&"a field"),
                        err.kind()
                    )
                }
                _ => format!("line {line}: {e}"),
            }
        })?;
        shapes.push(shape);
    }
    if shapes.is_empty() {
        return Err("no shape listed".into());
    }
    Ok(shapes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn workload() -> Workload {
        // Four runs of 10 000 samples, each 100 samples/s while busy, 4 GiB peaks; the feed
        // costs 1 ms of CPU per sample decoded and served all four; a private pipeline 1 ms.
        Workload {
            runs: (0..4)
                .map(|k| RunRate {
                    name: format!("run-{k:02}"),
                    samples: 10_000,
                    busy_seconds: 100.0,
                    consumed: 0,
                    gpu_peak_mib: Some(4096),
                })
                .collect(),
            samples_consumed: 0,
            feed_cpu_per_sample: 0.001,
            sharing: 4.0,
            run_cpu_per_sample: 0.0,
            private_cpu_per_sample: 0.001,
            private_basis: Basis::LowerBound,
            gpu_name: Some("NVIDIA H100 80GB HBM3".into()),
        }
    }

    fn shape(vcpus: u32, gpus: u32, gib: f64, usd: f64) -> Shape {
        Shape {
            name: format!("{vcpus}c{gpus}g"),
            vcpus,
            gpus,
            gpu_model: "H100".into(),
            gpu_mem_gib: gib,
            usd_per_hour: usd,
        }
    }

    #[test]
    fn the_gpus_bound_a_sweep_with_cores_to_spare_and_the_cores_one_without() {
        let w = workload();
        // One GPU of 16 GiB: all four fit, 400 samples/s; 1 vCPU feeds 1000 with private
        // pipelines, 4000 with ladle: both GPU-bound, the same price.
        let e = w.estimate(&shape(1, 1, 16.0, 3.6)).unwrap();
        assert_eq!(e.runs_per_gpu, 4);
        assert_eq!(e.gpu_as_measured, Some(true));
        let l4 = Shape {
            gpu_model: "L4".into(),
            ..shape(1, 1, 16.0, 3.6)
        };
        assert_eq!(w.estimate(&l4).unwrap().gpu_as_measured, Some(false));
        // Whole words of NVML's name, case aside.
        assert!(same_gpu("NVIDIA A100-SXM4-80GB", "a100"));
        assert!(!same_gpu("NVIDIA A100-SXM4-80GB", "A10"));
        assert!(!same_gpu("NVIDIA L40S", "L4"));
        assert!(!same_gpu("NVIDIA L40S", " "));
        for plan in [&e.ladle, &e.private] {
            assert_eq!(plan.bound, "gpu");
            assert!((plan.samples_per_s - 400.0).abs() < 1e-9);
            assert!((plan.wall_seconds - 100.0).abs() < 1e-9);
            assert!((plan.usd - 0.1).abs() < 1e-9);
        }
        // GPUs ten times faster: one vCPU no longer feeds them privately.
        let mut fast = w.clone();
        for r in &mut fast.runs {
            r.busy_seconds = 10.0;
        }
        let e = fast.estimate(&shape(1, 1, 16.0, 3.6)).unwrap();
        assert_eq!(e.private.bound, "cpu");
        assert!((e.private.samples_per_s - 1000.0).abs() < 1e-9);
        assert!((e.ladle.samples_per_s - 4000.0).abs() < 1e-9);
        assert!(e.private.usd > 3.9 * e.ladle.usd, "{e:?}");
        // Keeping 4000 samples/s fed: 4 vCPUs privately, 1 with ladle.
        assert_eq!(
            (e.private.min_vcpus_per_gpu, e.ladle.min_vcpus_per_gpu),
            (4, 1)
        );
    }

    #[test]
    fn runs_that_do_not_all_fit_on_the_gpus_run_in_turns() {
        let w = workload();
        // 10 GiB: two runs of 4 GiB per GPU, one GPU: 200 samples/s, twice as long.
        let e = w.estimate(&shape(64, 1, 10.0, 3.6)).unwrap();
        assert_eq!(e.runs_per_gpu, 2);
        assert!((e.ladle.wall_seconds - 200.0).abs() < 1e-9);
        assert!((e.ladle.usd_per_run - 0.05).abs() < 1e-9);
        let err = w.estimate(&shape(64, 1, 2.0, 3.6)).unwrap_err();
        assert!(
            matches!(err, CostError::DoesNotFit { peak_mib: 4096, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_slowest_run_ends_a_sweep_on_gpus_and_runs_fill_places_as_they_free_up() {
        let mut w = workload();
        // Run 0 is twice as slow: 200 s alone on the GPUs, the others 100 s.
        w.runs[0].busy_seconds = 200.0;
        let e = w.estimate(&shape(64, 1, 16.0, 3.6)).unwrap();
        assert_eq!(e.ladle.bound, "gpu");
        assert!((e.ladle.wall_seconds - 200.0).abs() < 1e-9, "{e:?}");
        assert!((e.ladle.samples_per_s - 200.0).abs() < 1e-9, "{e:?}");
        // Two places: runs 0 (200 s) and 1 (100 s) start; run 2 takes run 1's place at 100 s
        // and ends at 200 s with run 0; run 3 starts then and ends at 300 s.
        assert!(
            (w.gpu_seconds(2) - 300.0).abs() < 1e-9,
            "{}",
            w.gpu_seconds(2)
        );
        // The whole count consumed, not only the measured window, sets a run's time.
        w.runs[1].consumed = 40_000;
        assert!((w.gpu_seconds(4) - 400.0).abs() < 1e-9);
    }

    #[test]
    fn shapes_are_read_with_their_header_and_errors_name_the_line() {
        let text = "# prices are examples\nname,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour\n\
                    small, 8, 1, L4, 24, 0.8\nbig,192,8,H100,80,98.32\n";
        let shapes = read_shapes(text).unwrap();
        assert_eq!(shapes.len(), 2);
        let big = Shape {
            name: "big".into(),
            ..shape(192, 8, 80.0, 98.32)
        };
        assert_eq!(shapes[1], big);
        let bad = "name,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour\nx,many,1,L4,24,1\n";
        let e = read_shapes(bad).unwrap_err();
        assert!(e.contains("line 2") && e.contains("vcpus"), "{e}");
        assert!(
            read_shapes("name,cpus\nx,1\n")
                .unwrap_err()
                .contains("header")
        );
    }
}
