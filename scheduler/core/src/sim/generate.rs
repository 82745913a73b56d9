//! A CARMA-like synthetic trace.
//!
//! The mix follows the job classes CARMA describes for its trace:
//! - 30 % **light**: 256 MiB – 1 GiB, 20 – 60 s, SM demand 0.05 – 0.25, one GPU;
//! - 60 % **medium/heavy**: 1 – 30 GiB (log-uniform), 1 min – 90 min (log-uniform),
//!   SM demand 0.15 – 0.75, one GPU;
//! - 10 % **heavy 2-GPU**: 10 – 30 GiB per GPU, 30 – 120 min, SM demand 0.5 – 0.9.
//!
//! Arrivals are a Poisson process (exponential gaps, mean [`GenerateConfig::mean_gap_s`]).
//! The generator is a SplitMix64 stream seeded by [`GenerateConfig::seed`], so a seed names
//! one trace on every machine.

use super::trace::TraceJob;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    /// Number of jobs.
    pub jobs: usize,
    /// Seed.
    pub seed: u64,
    /// Mean gap between arrivals, seconds.
    pub mean_gap_s: f64,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            jobs: 60,
            seed: 1,
            mean_gap_s: 60.0,
        }
    }
}

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.unit()).exp()
    }
}

/// Generates a trace.
pub fn generate(config: &GenerateConfig) -> Vec<TraceJob> {
    let mut rng = Rng(config.seed);
    let mut t = 0.0;
    (0..config.jobs)
        .map(|i| {
            if i > 0 {
                t += -(1.0 - rng.unit()).ln() * config.mean_gap_s;
            }
            let class = rng.unit();
            let (mem_mib, duration_s, sm_activity, gpus) = if class < 0.3 {
                (
                    rng.uniform(256.0, 1024.0),
                    rng.uniform(20.0, 60.0),
                    rng.uniform(0.05, 0.25),
                    1,
                )
            } else if class < 0.9 {
                (
                    rng.log_uniform(1024.0, 30.0 * 1024.0),
                    rng.log_uniform(60.0, 5400.0),
                    rng.uniform(0.15, 0.75),
                    1,
                )
            } else {
                (
                    rng.uniform(10.0 * 1024.0, 30.0 * 1024.0),
                    rng.uniform(1800.0, 7200.0),
                    rng.uniform(0.5, 0.9),
                    2,
                )
            };
            TraceJob {
                id: format!("j{i:03}"),
                submit_s: (t * 10.0_f64).round() / 10.0,
                duration_s: (duration_s * 10.0).round() / 10.0,
                mem_mib: mem_mib.round() as u64,
                sm_activity: (sm_activity * 1000.0).round() / 1000.0,
                gpus,
                ..TraceJob::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_one_trace() {
        let a = generate(&GenerateConfig::default());
        let b = generate(&GenerateConfig::default());
        assert_eq!(a, b);
        let c = generate(&GenerateConfig {
            seed: 2,
            ..GenerateConfig::default()
        });
        assert_ne!(a, c);
    }

    #[test]
    fn the_mix_is_carma_like() {
        let jobs = generate(&GenerateConfig {
            jobs: 2000,
            ..GenerateConfig::default()
        });
        let light = jobs
            .iter()
            .filter(|j| j.mem_mib <= 1024 && j.duration_s <= 60.0)
            .count();
        let wide = jobs.iter().filter(|j| j.gpus == 2).count();
        assert!((500..700).contains(&light), "light {light}");
        assert!((150..250).contains(&wide), "two-GPU {wide}");
        assert!(jobs.windows(2).all(|w| w[0].submit_s <= w[1].submit_s));
        let mean_gap = jobs[jobs.len() - 1].submit_s / (jobs.len() - 1) as f64;
        assert!((50.0..70.0).contains(&mean_gap), "mean gap {mean_gap}");
        assert!(
            jobs.iter()
                .all(|j| j.mem_mib <= 30 * 1024 && j.sm_activity <= 1.0)
        );
    }
}
