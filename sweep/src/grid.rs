//! A sweep's runs: the grid expanded from a command (`{a,b}` groups and a grid file), their
//! names, and the deterministic split of the runs over the nodes of a sharded sweep.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SweepError;

/// Most runs one sweep may expand to.
pub const MAX_RUNS: usize = 1000;

/// One run of a sweep: its name (`run-00`, …, its `LADLE_RUN`) and its command.
///
/// Names are given over the whole grid, before any shard is taken, so that a run keeps its
/// name on whichever node runs it and the nodes' reports merge by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedRun {
    /// `run-00`, `run-01`, … in grid order.
    pub name: String,
    /// Its command.
    pub args: Vec<String>,
}

/// The alternatives of one argument: `{a,b}` groups expanded, left to right.
fn expand_arg(arg: &str) -> Vec<String> {
    let Some(open) = arg.find('{') else {
        return vec![arg.to_owned()];
    };
    let Some(close) = arg[open..].find('}').map(|i| open + i) else {
        return vec![arg.to_owned()];
    };
    let inner = &arg[open + 1..close];
    let head = &arg[..open];
    let tails = expand_arg(&arg[close + 1..]);
    if !inner.contains(',') {
        // `{x}` is not a grid: keep it (e.g. a format string) and expand what follows.
        let keep = &arg[..=close];
        return tails.iter().map(|t| format!("{keep}{t}")).collect();
    }
    inner
        .split(',')
        .flat_map(|alt| tails.iter().map(move |t| format!("{head}{alt}{t}")))
        .collect()
}

fn too_many() -> SweepError {
    SweepError::Grid(format!("the grid expands to more than {MAX_RUNS} runs"))
}

/// Every run of a grid, named in order: the cartesian product of the command's arguments'
/// alternatives (an argument holding `{a,b,c}` is an axis), then one run per line of the
/// grid file's text (its whitespace-separated words appended; `#` starts a comment line).
///
/// # Errors
/// [`SweepError::Grid`] past [`MAX_RUNS`] runs or for a grid file that holds no run.
pub fn expand(command: &[String], grid: Option<&str>) -> Result<Vec<PlannedRun>, SweepError> {
    let mut runs: Vec<Vec<String>> = vec![Vec::new()];
    for arg in command {
        let alternatives = expand_arg(arg);
        if runs.len().saturating_mul(alternatives.len()) > MAX_RUNS {
            return Err(too_many());
        }
        runs = runs
            .iter()
            .flat_map(|run| {
                alternatives.iter().map(move |alt| {
                    let mut next = run.clone();
                    next.push(alt.clone());
                    next
                })
            })
            .collect();
    }
    if let Some(grid) = grid {
        let base = runs;
        runs = Vec::new();
        for line in grid.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            for run in &base {
                let mut next = run.clone();
                next.extend(line.split_whitespace().map(str::to_owned));
                runs.push(next);
            }
            if runs.len() > MAX_RUNS {
                return Err(too_many());
            }
        }
        if runs.is_empty() {
            return Err(SweepError::Grid("the grid file holds no run".into()));
        }
    }
    Ok(runs
        .into_iter()
        .enumerate()
        .map(|(k, args)| PlannedRun {
            name: format!("run-{k:02}"),
            args,
        })
        .collect())
}

/// Shard `index` of `count` (`K/N`, `0 ≤ K < N`): which part of a grid one node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This node's shard, from 0.
    pub index: u32,
    /// How many shards the grid is split into.
    pub count: u32,
}

impl Shard {
    /// The whole grid.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`.
    ///
    /// # Errors
    /// [`SweepError::Grid`] unless `index < count`.
    pub fn new(index: u32, count: u32) -> Result<Self, SweepError> {
        if index >= count {
            return Err(SweepError::Grid(format!(
                "shard {index}/{count}: the shard must be below the count (0/{count} … {}/{count})",
                count.saturating_sub(1)
            )));
        }
        Ok(Self { index, count })
    }

    /// The runs of this shard, interleaved: runs `index`, `index + count`, `index + 2·count`,
    /// … of `runs`, so that every node gets a similar mix of a grid whose first axis varies
    /// slowest (e.g. model size), and shard sizes differ by at most one.
    pub fn take<T: Clone>(&self, runs: &[T]) -> Vec<T> {
        runs.iter()
            .skip(self.index as usize)
            .step_by(self.count as usize)
            .cloned()
            .collect()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = SweepError;

    fn from_str(s: &str) -> Result<Self, SweepError> {
        let bad = || SweepError::Grid(format!("shard {s:?} is not K/N (e.g. 0/4)"));
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let k = k.trim().parse().map_err(|_| bad())?;
        let n = n.trim().parse().map_err(|_| bad())?;
        Shard::new(k, n)
    }
}

/// The runs named in `only` (all when it is empty), in grid order.
///
/// # Errors
/// [`SweepError::Grid`] for a name that is not a run of the grid.
pub fn select(runs: Vec<PlannedRun>, only: &[String]) -> Result<Vec<PlannedRun>, SweepError> {
    if only.is_empty() {
        return Ok(runs);
    }
    if let Some(unknown) = only.iter().find(|n| !runs.iter().any(|r| &r.name == *n)) {
        return Err(SweepError::Grid(format!(
            "{unknown:?} is not a run of this grid (it has run-00 … run-{:02})",
            runs.len().saturating_sub(1)
        )));
    }
    Ok(runs
        .into_iter()
        .filter(|r| only.contains(&r.name))
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn args(runs: &[PlannedRun]) -> Vec<Vec<String>> {
        runs.iter().map(|r| r.args.clone()).collect()
    }

    #[test]
    fn braces_expand_into_the_cartesian_product_in_order() {
        let runs = expand(
            &strings(&["train", "--lr={0.1,0.01}", "--bs", "{32,64}"]),
            None,
        )
        .unwrap();
        assert_eq!(
            args(&runs),
            vec![
                strings(&["train", "--lr=0.1", "--bs", "32"]),
                strings(&["train", "--lr=0.1", "--bs", "64"]),
                strings(&["train", "--lr=0.01", "--bs", "32"]),
                strings(&["train", "--lr=0.01", "--bs", "64"]),
            ]
        );
        let names: Vec<_> = runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["run-00", "run-01", "run-02", "run-03"]);
    }

    #[test]
    fn two_groups_in_one_argument_and_a_group_without_a_comma() {
        assert_eq!(expand_arg("{a,b}-{1,2}"), ["a-1", "a-2", "b-1", "b-2"]);
        assert_eq!(expand_arg("{x}-{1,2}"), ["{x}-1", "{x}-2"]);
        assert_eq!(expand_arg("open{"), ["open{"]);
    }

    #[test]
    fn a_grid_file_adds_one_run_per_line_and_limits_hold() {
        let runs = expand(
            &strings(&["train"]),
            Some("# comment\n--lr 0.1\n\n--lr 0.2 --wd 1e-4\n"),
        )
        .unwrap();
        assert_eq!(
            args(&runs),
            vec![
                strings(&["train", "--lr", "0.1"]),
                strings(&["train", "--lr", "0.2", "--wd", "1e-4"])
            ]
        );
        assert!(expand(&strings(&["x"]), Some("# nothing\n")).is_err());
        let huge = "{1,2,3,4,5,6,7,8,9,10}";
        assert!(expand(&strings(&[huge, huge, huge, huge]), None).is_err());
    }

    #[test]
    fn shards_interleave_cover_every_run_once_and_differ_by_at_most_one() {
        let runs: Vec<u32> = (0..11).collect();
        for count in 1..=12 {
            let mut seen = Vec::new();
            let mut sizes = Vec::new();
            for index in 0..count {
                let part = Shard::new(index, count).unwrap().take(&runs);
                sizes.push(part.len());
                seen.extend(part);
            }
            seen.sort_unstable();
            assert_eq!(seen, runs, "{count} shards");
            let (min, max) = (sizes.iter().min(), sizes.iter().max());
            assert!(max.unwrap() - min.unwrap() <= 1, "{sizes:?}");
        }
        assert_eq!(Shard::new(1, 3).unwrap().take(&runs), [1, 4, 7, 10]);
    }

    #[test]
    fn a_shard_parses_from_k_slash_n_and_rejects_the_rest() {
        assert_eq!("1/4".parse::<Shard>().unwrap(), Shard::new(1, 4).unwrap());
        for bad in ["4/4", "1", "a/2", "1/0", "-1/2", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        assert_eq!(Shard::new(2, 5).unwrap().to_string(), "2/5");
    }

    #[test]
    fn only_keeps_the_named_runs_in_grid_order_and_names_an_unknown_one() {
        let runs = expand(&strings(&["t", "{a,b,c,d}"]), None).unwrap();
        let kept = select(runs.clone(), &strings(&["run-03", "run-01"])).unwrap();
        assert_eq!(kept, vec![runs[1].clone(), runs[3].clone()]);
        let err = select(runs, &strings(&["run-09"])).unwrap_err().to_string();
        assert!(err.contains("run-09") && err.contains("run-03"), "{err}");
    }
}
