//! The sweep's report and its cost beside private pipelines: pure, from what was measured.

use super::*;

/// The sweep's report from its runs' `reports` and what its feed `served` (`None`: a reused
/// feed), with the cost beside private pipelines: `wall` seconds, this process's `own_cpu`
/// seconds, on `cores` cores, at `prices`. Pure: the caller measures.
pub(super) fn sweep_report(
    reports: Vec<RunReport>,
    served: Option<&Served>,
    socket: &Path,
    wall: f64,
    own_cpu: f64,
    cores: f64,
    prices: &Prices,
) -> SweepReport {
    let (published, consumed, bad) =
        served.map_or((0, 0, 0), |s| (s.published, s.consumed, s.bad_samples));
    let decode_cpu = served.map_or(0.0, |s| s.decode_cpu.as_secs_f64());
    // As the scheduler measured each run (wait4), whichever scheduler ran it: the sweep's
    // own, or a shared one whose runs are not this process's children.
    let runs_cpu: f64 = reports.iter().filter_map(|r| r.cpu_seconds).sum();
    let gpu_hours: f64 = reports
        .iter()
        .map(|r| r.seconds.unwrap_or(0.0) * r.gpu.len().max(1) as f64 / 3600.0)
        .sum();
    let per_sample = decode_cpu / published.max(1) as f64;
    let private_cpu = runs_cpu + per_sample * consumed as f64;
    // Private pipelines on the same cores (the CPU bound of `ladle cost`'s model, the measured
    // wall standing for the GPUs' time): the runs' CPU and their decoding must fit in the
    // cores' time, else the sweep takes longer and its runs hold their GPUs longer. A run
    // whose CPU its scheduler did not measure (adopted after a restart) counts none.
    let (private_wall, _) = ladle_observe::cost::wall_seconds(wall, private_cpu, cores);
    let private_gpu_hours = gpu_hours * private_wall / wall.max(f64::MIN_POSITIVE);
    SweepReport {
        runs: reports,
        feed: FeedReport {
            socket: socket.to_owned(),
            reused: served.is_none(),
            samples_published: published,
            samples_consumed: consumed,
            bad_samples: bad,
            cpu_seconds: decode_cpu,
        },
        wall_seconds: wall,
        cpu_seconds: own_cpu + runs_cpu,
        cost: Cost {
            cpu_seconds: own_cpu + runs_cpu,
            gpu_hours,
            dollars: prices.price(own_cpu + runs_cpu, gpu_hours),
            private_pipelines_cpu_seconds: private_cpu,
            private_pipelines_dollars: prices.price(private_cpu, private_gpu_hours),
            private_pipelines_wall_seconds: Some(private_wall),
            private_pipelines_gpu_hours: Some(private_gpu_hours),
        },
        nodes: Vec::new(),
    }
}

impl Prices {
    /// The price of `cpu_s` core-seconds and `gpu_hours`, when any price was given.
    pub fn price(&self, cpu_s: f64, gpu_hours: f64) -> Option<f64> {
        match (self.cpu_hour, self.gpu_hour) {
            (None, None) => None,
            (cpu, gpu) => {
                Some(cpu.unwrap_or(0.0) * cpu_s / 3600.0 + gpu.unwrap_or(0.0) * gpu_hours)
            }
        }
    }
}
