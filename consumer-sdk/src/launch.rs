//! Where a rank of a DDP job learns its place from its launcher: its global rank, the world
//! size and how many ranks share its node (and so its node's feed), from what was passed,
//! else torchrun's variables, else Slurm's. Pure: the environment is a function, so every
//! rule is tested without touching the process's own.
//!
//! Precedence, first found wins:
//! - rank: given, `$RANK` (torchrun), `$SLURM_PROCID` (a task of `srun`);
//! - world size: given, `$WORLD_SIZE`, `$SLURM_NTASKS`;
//! - local world size (the ranks on this node, which its feed waits for): given,
//!   `$LOCAL_WORLD_SIZE` (torchrun), `$SLURM_NTASKS_PER_NODE`, this node's entry of
//!   `$SLURM_STEP_TASKS_PER_NODE`, then of `$SLURM_TASKS_PER_NODE` (entry `$SLURM_NODEID`, in
//!   Slurm's compressed form `2(x3),1`), else the world size (one node: the feed waits for
//!   every rank, as before). It is read from the environment even when rank and world size
//!   are passed: a launcher knows the node's layout better than a training script.

use std::fmt;

/// torchrun's global rank.
pub const RANK_ENV: &str = "RANK";
/// torchrun's number of ranks.
pub const WORLD_SIZE_ENV: &str = "WORLD_SIZE";
/// torchrun's number of ranks on this node.
pub const LOCAL_WORLD_SIZE_ENV: &str = "LOCAL_WORLD_SIZE";
/// Slurm's global task number (set by `srun` in every task).
pub const SLURM_PROCID_ENV: &str = "SLURM_PROCID";
/// Slurm's number of tasks (of the step, inside `srun`; of the job in a batch script).
pub const SLURM_NTASKS_ENV: &str = "SLURM_NTASKS";

/// Slurm's tasks per node, in the order they are looked at.
const SLURM_PER_NODE: [&str; 3] = [
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
];
/// Slurm's index of this node in the allocation, for the per-node lists.
const SLURM_NODEID_ENV: &str = "SLURM_NODEID";

/// Where a value came from, for messages that say what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Passed by the caller (`rank=`, `--rank`, a config field).
    Given,
    /// Read from this environment variable.
    Env(&'static str),
    /// No variable said: the world size (every rank on one node).
    WorldSize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Given => f.write_str("given"),
            Self::Env(var) => write!(f, "${var}"),
            Self::WorldSize => {
                f.write_str("the world size: no $LOCAL_WORLD_SIZE or Slurm tasks per node")
            }
        }
    }
}

/// A variable that is set but does not say a number this module can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("${var}={value:?} is not {what}")]
pub struct EnvError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What it should be.
    pub what: &'static str,
}

/// A value and where it came from.
pub type Found = (u32, Origin);

/// The rank: `given`, else `$RANK`, else `$SLURM_PROCID`; `None` when none says.
pub fn rank(
    given: Option<u32>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Found>, EnvError> {
    first(given, &[RANK_ENV, SLURM_PROCID_ENV], &env)
}

/// The world size: `given`, else `$WORLD_SIZE`, else `$SLURM_NTASKS`; `None` when none says.
pub fn world_size(
    given: Option<u32>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Found>, EnvError> {
    first(given, &[WORLD_SIZE_ENV, SLURM_NTASKS_ENV], &env)
}

/// The ranks on this node: `given`, else the launcher's variables (module docs), else
/// `world_size`.
pub fn local_world_size(
    given: Option<u32>,
    world_size: u32,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Found, EnvError> {
    if let Some(found) = first(given, &[LOCAL_WORLD_SIZE_ENV, SLURM_PER_NODE[0]], &env)? {
        return Ok(found);
    }
    for var in &SLURM_PER_NODE[1..] {
        let Some(list) = set(var, &env) else {
            continue;
        };
        let node = match set(SLURM_NODEID_ENV, &env) {
            Some(id) => id.trim().parse::<usize>().map_err(|_| EnvError {
                var: SLURM_NODEID_ENV,
                value: id.clone(),
                what: "a node index",
            })?,
            None => 0,
        };
        return tasks_on_node(&list, node)
            .map(|n| (n, Origin::Env(var)))
            .ok_or(EnvError {
                var,
                value: list,
                what: "Slurm's tasks per node (such as 2(x3),1) with an entry for $SLURM_NODEID",
            });
    }
    Ok((world_size, Origin::WorldSize))
}

/// Entry `node` of Slurm's compressed tasks-per-node list (`"2(x3),1"` is 2, 2, 2, 1).
pub fn tasks_on_node(list: &str, node: usize) -> Option<u32> {
    let mut seen = 0usize;
    for part in list.trim().split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count = count.trim().parse::<u32>().ok()?;
        seen = seen.checked_add(repeat)?;
        if node < seen {
            return Some(count);
        }
    }
    None
}

fn set(var: &str, env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    env(var).filter(|v| !v.trim().is_empty())
}

fn first(
    given: Option<u32>,
    vars: &[&'static str],
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<Found>, EnvError> {
    if let Some(value) = given {
        return Ok(Some((value, Origin::Given)));
    }
    for &var in vars {
        if let Some(value) = set(var, env) {
            let n = value.trim().parse::<u32>().map_err(|_| EnvError {
                var,
                value: value.clone(),
                what: "a non-negative number",
            })?;
            return Ok(Some((n, Origin::Env(var))));
        }
    }
    Ok(None)
}

/// The process's own environment, for the functions above.
pub fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |var| pairs.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
    }

    #[test]
    fn rank_and_world_come_from_torchrun_then_slurm() {
        let both = env(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "4"),
        ]);
        assert_eq!(rank(None, &both).unwrap(), Some((5, Origin::Env("RANK"))));
        assert_eq!(
            world_size(None, &both).unwrap(),
            Some((8, Origin::Env("WORLD_SIZE")))
        );
        assert_eq!(rank(Some(2), &both).unwrap(), Some((2, Origin::Given)));
        let slurm = env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4")]);
        assert_eq!(
            rank(None, &slurm).unwrap(),
            Some((1, Origin::Env("SLURM_PROCID")))
        );
        assert_eq!(
            world_size(None, &slurm).unwrap(),
            Some((4, Origin::Env("SLURM_NTASKS")))
        );
        assert_eq!(
            rank(None, env(&[("RANK", " ")])).unwrap(),
            None,
            "empty is unset"
        );
    }

    #[test]
    fn local_world_size_comes_from_torchrun_then_slurm_then_the_world_size_even_when_rank_is_given()
    {
        let all = env(&[
            ("LOCAL_WORLD_SIZE", "4"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "3(x2)"),
        ]);
        assert_eq!(
            local_world_size(None, 8, &all).unwrap(),
            (4, Origin::Env("LOCAL_WORLD_SIZE"))
        );
        assert_eq!(
            local_world_size(Some(1), 8, &all).unwrap(),
            (1, Origin::Given)
        );
        let slurm = env(&[
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "3"),
        ]);
        assert_eq!(
            local_world_size(None, 8, &slurm).unwrap(),
            (2, Origin::Env("SLURM_NTASKS_PER_NODE"))
        );
        let step = env(&[
            ("SLURM_STEP_TASKS_PER_NODE", "3,1"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_NODEID", "1"),
        ]);
        assert_eq!(
            local_world_size(None, 4, &step).unwrap(),
            (1, Origin::Env("SLURM_STEP_TASKS_PER_NODE"))
        );
        let job = env(&[("SLURM_TASKS_PER_NODE", "2(x2)"), ("SLURM_NODEID", "1")]);
        assert_eq!(
            local_world_size(None, 4, &job).unwrap(),
            (2, Origin::Env("SLURM_TASKS_PER_NODE"))
        );
        assert_eq!(
            local_world_size(None, 6, env(&[])).unwrap(),
            (6, Origin::WorldSize)
        );
    }

    #[test]
    fn slurm_tasks_per_node_with_repeats_gives_this_nodes_count() {
        assert_eq!(tasks_on_node("2(x3),1", 0), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 4), None);
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("2(x", 0), None);
        assert_eq!(tasks_on_node("x,1", 1), None);
    }

    #[test]
    fn a_bad_variable_is_an_error_naming_it() {
        let e = rank(None, env(&[("RANK", "two")])).unwrap_err();
        assert_eq!(e.var, "RANK");
        assert!(e.to_string().contains("$RANK=\"two\""), "{e}");
        let e = world_size(None, env(&[("SLURM_NTASKS", "-1")])).unwrap_err();
        assert_eq!(e.var, "SLURM_NTASKS");
        let e = local_world_size(
            None,
            4,
            env(&[("SLURM_TASKS_PER_NODE", "2"), ("SLURM_NODEID", "3")]),
        )
        .unwrap_err();
        assert_eq!(e.var, "SLURM_TASKS_PER_NODE");
        assert!(e.to_string().contains("SLURM_NODEID"), "{e}");
        let e = local_world_size(
            None,
            4,
            env(&[("SLURM_TASKS_PER_NODE", "2"), ("SLURM_NODEID", "n1")]),
        )
        .unwrap_err();
        assert_eq!(e.var, "SLURM_NODEID");
    }
}
