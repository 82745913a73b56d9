//! # ladle-sweep: the sweep engine
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate sits beside the scheduler box, under
//! `cli/`: it is what `ladle sweep` runs, in every form.
//!
//! - [`grid`]: the runs of a command's grid (`{a,b}` groups, a grid file), named over the
//!   whole grid, and the interleaved shard `K/N` a node runs.
//! - [`engine`]: one node's sweep: one feed (decoded once for the node's runs), one
//!   scheduler (the running one, or a private one in-process), the runs submitted as its
//!   jobs and followed to their end, the report with the cost.
//! - [`ledger`]: what a node's sweep leaves in its directory as it goes (its start, each run
//!   as it ends, its report), and the merge of several nodes' directories into one report:
//!   what `ladle report --merge` prints and a requeued or resumed sweep reads.
//! - [`slurm`]: a sweep over a Slurm allocation: the batch script (one node sweep per node,
//!   then the merge), the node's view of its allocation, `sbatch`/`scontrol`/`scancel`.
//! - [`submit`]: the submitting side apart from the terminal: what a `--resume` submits,
//!   the script written and submitted with its manifest, the job's output followed, the
//!   merge of a sweep directory.
//!
//! A local sweep, a shard run by hand (`ladle sweep --shard K/N`) and a node of a Slurm
//! sweep are the same [`engine::run`] with different [`engine::SweepConfig`]s.
//!
//! ```
//! use ladle_sweep::grid::{self, Shard};
//!
//! let command: Vec<String> = ["train", "--lr", "{0.1,0.01}", "--bs", "{32,64}"]
//!     .iter().map(|s| s.to_string()).collect();
//! let runs = grid::expand(&command, None)?;
//! assert_eq!(runs.len(), 4);
//! let second = Shard::new(1, 2)?.take(&runs);
//! assert_eq!(second[0].name, "run-01");
//! assert_eq!(second[1].args, ["train", "--lr", "0.01", "--bs", "64"]);
//! # Ok::<(), ladle_sweep::SweepError>(())
//! ```

pub mod engine;
mod error;
pub mod grid;
pub mod ledger;
pub mod slurm;
pub mod submit;
mod view;

pub use error::SweepError;
pub use view::{Progress, ShowProgress};
