//! Memory estimates and where they come from: measure, then pack.
//!
//! A job's device-memory estimate has a [`Basis`]:
//! - [`Basis::Declared`]: the user stated it (`--gpu-mem`); trusted, and a per-job MPS limit
//!   may be derived from it;
//! - [`Basis::Measured`]: a member of the job's **family** ran and its peak was seen on the
//!   GPU; the estimate is [`crate::job::learned_estimate`] of the largest such peak;
//! - [`Basis::Guess`]: nothing is known; the number is the scheduler's default and is used
//!   for reservations only. **No memory limit is ever derived from a guess**: a guess that
//!   is too small must not kill the job that did not declare.
//!
//! A family is the same command up to its arguments' values ([`family_key`]) or what the
//! user names with `--family`: the runs of one sweep (`train.py --lr {0.1,0.01}`) share one,
//! so the first run measured packs the rest. Estimates are learned per family
//! ([`Families`]), not per exact command line.
//!
//! Declared estimates are trusted, and checked: every measured job that declared shows how
//! its peak compares with what it declared, and [`Families::declared_factor`] (the largest
//! `peak ÷ declared` of the last [`DECLARED_HISTORY`] such jobs, between 1 and
//! [`MAX_DECLARED_FACTOR`]) scales what the next jobs declare, for admission's memory screen
//! and reservations. Users who declare honestly see a factor of 1; users who declare half of
//! what they use see 2 after their first measured job, and their later jobs are packed where
//! they really fit instead of crashing out of memory. No memory limit is derived from the
//! factor.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::job::learned_estimate;

pub use ladle_scheduler_protocol::job::Basis;

/// An estimate and its basis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Estimate {
    /// Device memory per GPU, MiB.
    pub mib: u64,
    /// Where the number comes from.
    pub basis: Basis,
}

/// The family of a command: the same program and flags, with every argument *value*
/// replaced by `*`. A value is a token that follows a flag (`--lr 0.1`), the part after `=`
/// of a flag (`--lr=0.1`), or a token that reads as a number (`0.1`, `-3`, `1e-4`). The
/// program, flags and other words (script names, subcommands) are kept, and so is a token
/// holding whitespace (a script, as in `sh -c 'python train.py'`: code, not a value), so
/// `python train.py --lr 0.1 --batch-size 64` and `python train.py --lr 0.01 --batch-size
/// 128` share the family `python train.py --lr * --batch-size *`.
pub fn family_key(command: &[String]) -> String {
    let mut out: Vec<String> = Vec::with_capacity(command.len());
    let mut after_flag = false;
    for (i, token) in command.iter().enumerate() {
        let number = token.parse::<f64>().is_ok();
        let flag = i > 0 && token.starts_with('-') && !number;
        if flag {
            match token.split_once('=') {
                Some((name, _)) => {
                    out.push(format!("{name}=*"));
                    after_flag = false;
                }
                None => {
                    out.push(token.clone());
                    after_flag = true;
                }
            }
        } else if i > 0 && (after_flag || number) && !token.contains(char::is_whitespace) {
            out.push("*".to_owned());
            after_flag = false;
        } else {
            out.push(token.clone());
            after_flag = false;
        }
    }
    out.join(" ")
}

/// How many recent `peak ÷ declared` ratios [`Families::declared_factor`] looks at.
pub const DECLARED_HISTORY: usize = 20;

/// The largest factor declared estimates are scaled by.
pub const MAX_DECLARED_FACTOR: f64 = 4.0;

/// Peaks learned per family, and how declared estimates compare with measured peaks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Families {
    peaks: BTreeMap<String, u64>,
    #[serde(default)]
    declared_ratios: VecDeque<f64>,
}

impl Families {
    /// No family measured yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that a member of `family` peaked at `peak_mib` per GPU; the family keeps the
    /// largest peak seen (its members differ in arguments, and the largest is the safe one).
    pub fn observe(&mut self, family: &str, peak_mib: u64) {
        let peak = self.peaks.entry(family.to_owned()).or_insert(0);
        *peak = (*peak).max(peak_mib);
    }

    /// Records that a job that declared `declared_mib` per GPU peaked at `peak_mib` once
    /// measured (or when it ran out of memory).
    pub fn observe_declared(&mut self, declared_mib: u64, peak_mib: u64) {
        if declared_mib == 0 {
            return;
        }
        let ratio = peak_mib as f64 / declared_mib as f64;
        if self.declared_ratios.len() == DECLARED_HISTORY {
            self.declared_ratios.pop_front();
        }
        self.declared_ratios.push_back(ratio);
    }

    /// What declared estimates are scaled by: the largest `peak ÷ declared` of the last
    /// [`DECLARED_HISTORY`] measured jobs that declared, at least 1, at most
    /// [`MAX_DECLARED_FACTOR`] (1 before any is measured).
    pub fn declared_factor(&self) -> f64 {
        self.declared_ratios
            .iter()
            .copied()
            .fold(1.0, f64::max)
            .min(MAX_DECLARED_FACTOR)
    }

    /// A declared estimate scaled by [`Families::declared_factor`], MiB.
    pub fn checked_declared(&self, declared_mib: u64) -> u64 {
        let factor = self.declared_factor();
        if factor <= 1.0 {
            return declared_mib;
        }
        // Saturating float-to-int cast: a huge declaration stays huge.
        (declared_mib as f64 * factor).ceil() as u64
    }

    /// The largest peak seen for `family`, MiB.
    pub fn peak(&self, family: &str) -> Option<u64> {
        self.peaks.get(family).copied()
    }

    /// The estimate of a job of `family`: what it declares (scaled by
    /// [`Families::declared_factor`]), else the family's measured peak (×1.1), else
    /// `guess_mib` as a [`Basis::Guess`].
    pub fn estimate(&self, family: &str, declared_mib: Option<u64>, guess_mib: u64) -> Estimate {
        match (declared_mib, self.peak(family)) {
            (Some(mib), _) => Estimate {
                mib: self.checked_declared(mib),
                basis: Basis::Declared,
            },
            (None, Some(peak)) => Estimate {
                mib: learned_estimate(peak),
                basis: Basis::Measured,
            },
            (None, None) => Estimate {
                mib: guess_mib,
                basis: Basis::Guess,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn runs_of_one_sweep_share_a_family_and_other_programs_do_not() {
        let a = family_key(&cmd("python train.py --lr 0.1 --batch-size 64"));
        let b = family_key(&cmd("python train.py --lr 0.01 --batch-size 128"));
        assert_eq!(a, b);
        assert_eq!(a, "python train.py --lr * --batch-size *");
        assert_ne!(
            a,
            family_key(&cmd("python eval.py --lr 0.1 --batch-size 64"))
        );
        assert_eq!(
            family_key(&cmd("ladle consume --epochs=2 --step-ms 10")),
            family_key(&cmd("ladle consume --epochs=4 --step-ms 20"))
        );
        assert_eq!(family_key(&cmd("train -3 1e-4")), "train * *");
        let script = |s: &str| vec!["sh".to_owned(), "-c".to_owned(), s.to_owned()];
        assert_ne!(
            family_key(&script("python a.py")),
            family_key(&script("python b.py")),
            "a script is code, not a value"
        );
        // A flag that takes no value is kept as a flag; the word after it counts as its value.
        assert_eq!(family_key(&cmd("train --amp resnet")), "train --amp *");
    }

    #[test]
    fn a_declared_estimate_wins_then_the_family_peak_then_the_guess() {
        let mut f = Families::new();
        assert_eq!(f.estimate("x", None, 4096).basis, Basis::Guess);
        assert!(!f.estimate("x", None, 4096).basis.may_cap());
        f.observe("x", 10_000);
        f.observe("x", 9_000);
        let e = f.estimate("x", None, 4096);
        assert_eq!((e.mib, e.basis), (11_000, Basis::Measured));
        assert!(e.basis.may_cap());
        assert_eq!(f.estimate("x", Some(2048), 4096).basis, Basis::Declared);
        assert_eq!(f.estimate("y", None, 4096).mib, 4096);
    }

    #[test]
    fn declarations_are_scaled_by_how_far_measured_jobs_overshot_theirs() {
        let mut f = Families::new();
        assert_eq!(f.estimate("x", Some(1000), 4096).mib, 1000);
        f.observe_declared(1000, 900); // honest: never scaled down
        assert_eq!(f.declared_factor(), 1.0);
        f.observe_declared(1000, 2000);
        assert_eq!(f.estimate("x", Some(1000), 4096).mib, 2000);
        f.observe_declared(1, 1000);
        assert_eq!(f.declared_factor(), MAX_DECLARED_FACTOR);
        // The history is bounded: honest jobs bring the factor back to 1.
        for _ in 0..DECLARED_HISTORY {
            f.observe_declared(1000, 1000);
        }
        assert_eq!(f.declared_factor(), 1.0);
    }
}
