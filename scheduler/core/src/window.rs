//! The telemetry window and CARMA's risk score.
//!
//! Telemetry arrives at 1 Hz; each metric of each GPU keeps its last [`WINDOW`] samples. The
//! scheduler never judges a GPU by one sample: it uses the window's **risk score**, CARMA's
//! weighted blend that leans towards recent peaks,
//!
//! `risk = 0.2·mean + 0.2·median + 0.3·p95 + 0.1·p50 + 0.2·EMA`
//!
//! (median and p50 are the same statistic; CARMA's formula names both, so p50 weighs 0.3 in
//! all). The EMA uses `α = 2 / (WINDOW + 1)` over the window, oldest first. Percentiles are
//! nearest-rank.

use std::collections::VecDeque;

/// Samples kept per metric: 30 seconds at 1 Hz.
pub const WINDOW: usize = 30;

/// The last [`WINDOW`] samples of one metric.
#[derive(Debug, Clone, Default)]
pub struct Window {
    samples: VecDeque<f64>,
}

impl Window {
    /// An empty window.
    pub fn new() -> Self {
        Self {
            samples: VecDeque::with_capacity(WINDOW),
        }
    }

    /// Adds a sample, dropping the oldest once the window is full. Non-finite samples are
    /// ignored (a broken reading must not poison thirty seconds of decisions).
    pub fn push(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
    }

    /// Samples held (at most [`WINDOW`]).
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample has arrived yet.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The latest sample.
    pub fn last(&self) -> Option<f64> {
        self.samples.back().copied()
    }

    /// CARMA's risk score of the window; `None` when it is empty.
    pub fn risk(&self) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        let n = self.samples.len();
        let mean = self.samples.iter().sum::<f64>() / n as f64;
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let p50 = percentile(&sorted, 0.50);
        let p95 = percentile(&sorted, 0.95);
        let alpha = 2.0 / (WINDOW as f64 + 1.0);
        let mut samples = self.samples.iter();
        let first = samples.next().copied().unwrap_or(0.0);
        let ema = samples.fold(first, |ema, &x| alpha * x + (1.0 - alpha) * ema);
        Some(0.2 * mean + 0.2 * median + 0.3 * p95 + 0.1 * p50 + 0.2 * ema)
    }
}

/// Nearest-rank percentile of sorted, non-empty samples.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_signal_has_itself_as_risk() {
        let mut w = Window::new();
        for _ in 0..50 {
            w.push(0.4);
        }
        assert_eq!(w.len(), WINDOW);
        assert!((w.risk().unwrap() - 0.4).abs() < 1e-12);
    }

    #[test]
    fn an_empty_window_has_no_risk() {
        assert_eq!(Window::new().risk(), None);
    }

    #[test]
    fn a_recent_spike_raises_risk_above_the_mean() {
        let mut w = Window::new();
        for _ in 0..27 {
            w.push(0.1);
        }
        for _ in 0..3 {
            w.push(0.9);
        }
        let mean = (27.0 * 0.1 + 3.0 * 0.9) / 30.0;
        // p95 sees the spike, the EMA leans towards it.
        assert!(w.risk().unwrap() > mean);
    }

    #[test]
    fn the_risk_score_matches_carmas_formula_on_a_ramp() {
        let mut w = Window::new();
        for i in 1..=30 {
            w.push(f64::from(i) / 30.0);
        }
        let mean = 15.5 / 30.0;
        let median = 15.5 / 30.0;
        let p50 = 15.0 / 30.0;
        let p95 = 29.0 / 30.0;
        let alpha = 2.0 / 31.0;
        let mut ema = 1.0 / 30.0;
        for i in 2..=30 {
            ema = alpha * (f64::from(i) / 30.0) + (1.0 - alpha) * ema;
        }
        let expected = 0.2 * mean + 0.2 * median + 0.3 * p95 + 0.1 * p50 + 0.2 * ema;
        assert!((w.risk().unwrap() - expected).abs() < 1e-12);
    }

    #[test]
    fn non_finite_samples_are_ignored() {
        let mut w = Window::new();
        w.push(f64::NAN);
        w.push(f64::INFINITY);
        assert!(w.is_empty());
        w.push(0.5);
        assert_eq!(w.last(), Some(0.5));
    }
}
