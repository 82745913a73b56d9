//! A sweep as a fluid: the model behind [`super::Workload::estimate`]. Runs are streams of
//! samples, each at most as fast as its GPU-bound rate; the vCPUs are shared out among what
//! needs them; time advances from one run's end to the next. Pure arithmetic.
//!
//! - **Shared (ladle)**: one feed decodes one stream at rate `f`, never faster than the
//!   fastest run wants it; each run takes `min(g, f)` (a slower run skims the stream at its
//!   own pace, a faster one waits for it). The feed's CPU is `c_f · f`, the runs'
//!   `r · Σ min(g, f)`: `f` is the fastest the vCPUs allow. So a CPU-bound feed serves every
//!   run each decoded sample, and a GPU-bound one decodes as fast as its fastest run.
//! - **Private**: each run decodes for itself at `c_p + r` CPU-seconds a sample; the vCPUs are
//!   shared fairly (a run that needs less than its share leaves the rest to the others).

/// One run: the samples it consumes and its GPU-bound rate (samples/s, > 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Run {
    pub samples: f64,
    pub rate: f64,
}

/// How the runs get their data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Loading {
    /// One feed, `feed_cpu` CPU-seconds per sample decoded.
    Shared { feed_cpu: f64 },
    /// A pipeline per run, `cpu` CPU-seconds per sample.
    Private { cpu: f64 },
}

/// What the sweep did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outcome {
    /// Seconds from the first run's start to the last run's end.
    pub wall: f64,
    /// Of them, seconds when the vCPUs held some run below its GPU-bound rate.
    pub cpu_bound: f64,
    /// Samples decoded (by the feed, or by every pipeline).
    pub decoded: f64,
}

/// Runs `runs` in their order, `places` at once, on `vcpus` (may be infinite), each consumed
/// sample also costing its run `run_cpu` CPU-seconds.
pub(crate) fn simulate(
    runs: &[Run],
    places: usize,
    vcpus: f64,
    run_cpu: f64,
    loading: Loading,
) -> Outcome {
    let mut left: Vec<f64> = runs.iter().map(|r| r.samples.max(0.0)).collect();
    let mut active: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut out = Outcome {
        wall: 0.0,
        cpu_bound: 0.0,
        decoded: 0.0,
    };
    let places = places.max(1);
    loop {
        // Ended runs leave their places to the next in order (a run of no samples ends at
        // once).
        active.retain(|&i| left[i] > 0.0);
        while active.len() < places && next < runs.len() {
            if left[next] > 0.0 {
                active.push(next);
            }
            next += 1;
        }
        if active.is_empty() {
            return out;
        }
        let (rates, stream, limited) = rates(runs, &active, vcpus, run_cpu, loading);
        // Until the first active run ends.
        let dt = (active.iter().zip(&rates))
            .filter(|(_, x)| **x > 0.0)
            .map(|(&i, x)| left[i] / x)
            .fold(f64::INFINITY, f64::min);
        if !dt.is_finite() {
            // No vCPU time at all: the sweep never ends.
            out.wall = f64::INFINITY;
            return out;
        }
        for (&i, x) in active.iter().zip(&rates) {
            left[i] -= x * dt;
            // The run that set dt ends exactly, not a rounding error short.
            if left[i] <= runs[i].samples * 1e-12 {
                left[i] = 0.0;
            }
        }
        out.wall += dt;
        out.decoded += stream * dt;
        if limited {
            out.cpu_bound += dt;
        }
    }
}

/// Each active run's rate, the samples decoded per second, and whether the vCPUs held any
/// run below its GPU-bound rate.
fn rates(
    runs: &[Run],
    active: &[usize],
    vcpus: f64,
    run_cpu: f64,
    loading: Loading,
) -> (Vec<f64>, f64, bool) {
    let wants: Vec<f64> = active.iter().map(|&i| runs[i].rate.max(0.0)).collect();
    match loading {
        Loading::Shared { feed_cpu } => {
            let cpu = |f: f64| feed_cpu * f + run_cpu * wants.iter().map(|g| g.min(f)).sum::<f64>();
            let fastest = wants.iter().copied().fold(0.0, f64::max);
            let (f, limited) = if cpu(fastest) <= vcpus {
                (fastest, false)
            } else {
                // cpu(f) grows with f: the fastest stream the vCPUs allow.
                let (mut lo, mut hi) = (0.0, fastest);
                for _ in 0..60 {
                    let mid = 0.5 * (lo + hi);
                    if cpu(mid) <= vcpus {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                (lo, true)
            };
            (wants.iter().map(|g| g.min(f)).collect(), f, limited)
        }
        Loading::Private { cpu } => {
            let per_sample = cpu + run_cpu;
            if per_sample <= 0.0 {
                let decoded = wants.iter().sum();
                return (wants, decoded, false);
            }
            // Fair shares, the smallest needs first.
            let mut order: Vec<usize> = (0..wants.len()).collect();
            order.sort_by(|&a, &b| wants[a].total_cmp(&wants[b]));
            let mut spare = vcpus;
            let mut given = vec![0.0; wants.len()];
            let mut rates = vec![0.0; wants.len()];
            let mut limited = false;
            for (k, &j) in order.iter().enumerate() {
                let share = spare / (order.len() - k) as f64;
                let need = wants[j] * per_sample;
                given[j] = need.min(share);
                limited |= need > share;
                spare -= given[j];
                // A run its share feeds goes at exactly its GPU-bound rate: not `need /
                // per_sample`, which rounds, so that a GPU-bound sweep takes the same time,
                // to the bit, however it is fed.
                rates[j] = if need <= share {
                    wants[j]
                } else {
                    share / per_sample
                };
            }
            let decoded = rates.iter().sum();
            (rates, decoded, limited)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOUR: [Run; 4] = [
        Run {
            samples: 3200.0,
            rate: 3200.0,
        },
        Run {
            samples: 3200.0,
            rate: 1600.0,
        },
        Run {
            samples: 3200.0,
            rate: 6400.0,
        },
        Run {
            samples: 3200.0,
            rate: 3200.0,
        },
    ];

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn with_cpu_to_spare_runs_go_at_their_own_rates_and_the_feed_at_the_fastests() {
        let o = simulate(
            &FOUR,
            4,
            f64::INFINITY,
            0.0,
            Loading::Shared { feed_cpu: 1e-3 },
        );
        assert!(close(o.wall, 2.0), "{o:?}");
        assert!(close(o.cpu_bound, 0.0));
        // 6400/s for 0.5 s, 3200/s to 1 s, 1600/s to 2 s.
        assert!(close(o.decoded, 3200.0 + 1600.0 + 1600.0), "{o:?}");
    }

    #[test]
    fn a_cpu_bound_feed_serves_every_run_each_sample_it_decodes() {
        // One vCPU decodes 1000 samples/s: every run goes at 1000/s, each sample decoded once.
        let o = simulate(&FOUR, 4, 1.0, 0.0, Loading::Shared { feed_cpu: 1e-3 });
        assert!(close(o.wall, 3.2), "{o:?}");
        assert!(close(o.cpu_bound, 3.2));
        assert!(close(o.decoded, 3200.0), "{o:?}");
        // The runs' own CPU slows the stream: 1 = 1e-3 f + 4 · 1e-4 f.
        let o = simulate(&FOUR, 4, 1.0, 1e-4, Loading::Shared { feed_cpu: 1e-3 });
        assert!(close(o.wall, 3200.0 / (1.0 / 1.4e-3)), "{o:?}");
    }

    #[test]
    fn private_pipelines_share_the_vcpus_fairly_and_decode_every_sample_again() {
        // Two vCPUs at 1 ms a sample: 500/s each for four runs, all CPU-bound.
        let o = simulate(&FOUR, 4, 2.0, 0.0, Loading::Private { cpu: 1e-3 });
        assert!(close(o.wall, 6.4), "{o:?}");
        assert!(close(o.decoded, 4.0 * 3200.0));
        // Eight vCPUs: the 1600/s run needs 1.6 and gets it; the others share 6.4, 2.13 each
        // (2133/s): they end at 1.5 s, then the slow one runs alone to 2 s.
        let o = simulate(&FOUR, 4, 8.0, 0.0, Loading::Private { cpu: 1e-3 });
        assert!(close(o.wall, 2.0), "{o:?}");
        assert!(close(o.cpu_bound, 1.5), "{o:?}");
    }

    #[test]
    fn a_gpu_bound_sweep_takes_the_same_time_to_the_bit_shared_or_private() {
        // Rates and costs that do not divide evenly: `rate * cpu / cpu` rounds for some.
        let runs: Vec<Run> = (1..=40)
            .map(|k| Run {
                samples: 1000.0 + f64::from(k) / 3.0,
                rate: 100.0 * f64::from(k) / 7.0 + 0.1,
            })
            .collect();
        let mut rounded = 0;
        for cpu in [1e-3 / 3.0, 7.3e-4, 0.1 / 9.0] {
            for run_cpu in [0.0, 1e-4 / 7.0] {
                let shared = simulate(&runs, 3, 1e9, run_cpu, Loading::Shared { feed_cpu: cpu });
                let private = simulate(&runs, 3, 1e9, run_cpu, Loading::Private { cpu });
                assert_eq!(shared.wall, private.wall, "cpu {cpu}, run cpu {run_cpu}");
                assert_eq!(private.cpu_bound, 0.0);
                let per_sample = cpu + run_cpu;
                rounded += (runs.iter())
                    .filter(|r| r.rate * per_sample / per_sample != r.rate)
                    .count();
            }
        }
        // The case the test is for happens in it.
        assert!(rounded > 0);
    }

    #[test]
    fn runs_wait_for_a_place_and_no_vcpu_never_ends() {
        let o = simulate(
            &FOUR[..2],
            1,
            f64::INFINITY,
            0.0,
            Loading::Private { cpu: 1e-3 },
        );
        assert!(close(o.wall, 1.0 + 2.0), "{o:?}");
        let o = simulate(&FOUR, 4, 0.0, 0.0, Loading::Shared { feed_cpu: 1e-3 });
        assert!(o.wall.is_infinite());
        let o = simulate(&[], 4, 1.0, 0.0, Loading::Shared { feed_cpu: 1e-3 });
        assert!(close(o.wall, 0.0));
    }
}
