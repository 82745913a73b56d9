//! What a node's sweep leaves in its directory as it goes, and the merge of several nodes'
//! directories into one report.
//!
//! | file | written | holds |
//! |---|---|---|
//! | [`NODE`] | at start (a stale [`REPORT`] is removed then) | [`NodeStart`]: the node, its shard, its job, the runs it was given |
//! | [`RUNS`] | one line as each run ends, appended, flushed | a [`RunReport`] |
//! | [`REPORT`] | at the end | the node's [`SweepReport`] |
//!
//! A node that has a [`NODE`] and no [`REPORT`] did not reach its end: it was lost (a node
//! that failed, a sweep killed). Its runs that ended are still known from [`RUNS`]; the
//! others are reported `lost`. A run that succeeded in any attempt (a requeued job, a
//! resumed sweep) counts as succeeded: [`succeeded`] is what a node skips.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use ladle_observe::report::{Cost, FeedReport, NodeReport, RunAttempt, RunReport, SweepReport};
use serde::{Deserialize, Serialize};

use crate::SweepError;
use crate::grid::{PlannedRun, Shard};

/// The node's start record.
pub const NODE: &str = "node.json";
/// The node's ended runs, one JSON line each.
pub const RUNS: &str = "runs.jsonl";
/// The node's end report.
pub const REPORT: &str = "report.json";

/// What a node's sweep was given, written when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStart {
    /// The node (`None`: a sweep on one machine).
    pub node: Option<String>,
    /// Its shard of the grid.
    pub shard: Shard,
    /// The Slurm job it ran in.
    pub job_id: Option<String>,
    /// The runs it runs.
    pub runs: Vec<String>,
    /// Runs of its shard it skipped: they had succeeded before.
    pub skipped: Vec<String>,
}

/// A node's directory being written.
#[derive(Debug)]
pub(crate) struct Ledger {
    dir: PathBuf,
    runs: std::fs::File,
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SweepError {
    let path = path.to_owned();
    move |source| SweepError::Io { what, path, source }
}

impl Ledger {
    /// Writes `start` into `dir` and opens the run log for appending.
    pub(crate) fn start(dir: &Path, start: &NodeStart) -> Result<Self, SweepError> {
        let report = dir.join(REPORT);
        match std::fs::remove_file(&report) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing the last attempt's report", &report)(e)),
        }
        // Whole or not at all: the other nodes of a requeued job read this file (to skip the
        // runs that succeeded) while this node starts again and rewrites it.
        let node = dir.join(NODE);
        let text = serde_json::to_string_pretty(start).unwrap_or_default() + "\n";
        write_whole(&node, &text).map_err(io("writing", &node))?;
        let path = dir.join(RUNS);
        let runs = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io("opening", &path))?;
        Ok(Self {
            dir: dir.to_owned(),
            runs,
        })
    }

    /// Records a run that ended (a failure to write is logged: the report still holds it).
    pub(crate) fn append(&mut self, run: &RunReport) {
        let line = serde_json::to_string(run).unwrap_or_default() + "\n";
        if let Err(e) = self
            .runs
            .write_all(line.as_bytes())
            .and_then(|()| self.runs.sync_data())
        {
            tracing::error!(
                "cannot record {} in {}: {e}",
                run.name,
                self.dir.join(RUNS).display()
            );
        }
    }

    /// Writes the node's end report.
    pub(crate) fn finish(&self, report: &SweepReport) {
        write_report(&self.dir.join(REPORT), report);
    }
}

/// A sweep's directory when `--out` is not given: `CWD/ladle-sweep-UNIXSECONDS`.
pub fn default_out(cwd: &Path) -> PathBuf {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    cwd.join(format!("ladle-sweep-{now}"))
}

/// Writes `report` to `path` as pretty JSON, whole or not at all; a failure is logged.
pub fn write_report(path: &Path, report: &SweepReport) {
    let text = serde_json::to_string_pretty(report).unwrap_or_default() + "\n";
    if let Err(e) = write_whole(path, &text) {
        tracing::error!("cannot write the report {}: {e}", path.display());
    }
}

/// Writes `text` to `path` whole or not at all: into a temporary file beside it (named for
/// this process, so that two writers never share one), then renamed over it. A reader sees
/// the old file or the new one, never a part.
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}

/// One node's directory, read back.
#[derive(Debug, Clone)]
pub struct NodeDir {
    /// The directory.
    pub dir: PathBuf,
    /// Its start record.
    pub start: NodeStart,
    /// Its ended runs, in the order they ended (across attempts).
    pub ended: Vec<RunReport>,
    /// Its end report, when it reached its end.
    pub report: Option<SweepReport>,
}

impl NodeDir {
    /// The node's name: its Slurm node, else its shard, else its directory's name.
    pub fn name(&self) -> String {
        match &self.start.node {
            Some(node) => node.clone(),
            None if self.start.shard.count > 1 => format!("shard-{}", self.start.shard.index),
            None => self
                .dir
                .file_name()
                .map_or_else(|| "local".into(), |n| n.to_string_lossy().into_owned()),
        }
    }

    /// Reads a node's directory.
    ///
    /// # Errors
    /// [`SweepError::Io`] or [`SweepError::Malformed`] naming the file. A last line of the
    /// run log cut short (a node killed mid-write) is left out.
    pub fn read(dir: &Path) -> Result<Self, SweepError> {
        let start: NodeStart = read_json(&dir.join(NODE))?;
        let report_path = dir.join(REPORT);
        let report = if report_path.exists() {
            Some(read_json(&report_path)?)
        } else {
            None
        };
        let runs_path = dir.join(RUNS);
        let text = match std::fs::read_to_string(&runs_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io("reading", &runs_path)(e)),
        };
        let complete = text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        let mut ended = Vec::new();
        for (k, line) in lines.iter().enumerate() {
            match serde_json::from_str(line) {
                Ok(run) => ended.push(run),
                Err(_) if k + 1 == lines.len() && !complete => {} // torn last line
                Err(e) => {
                    return Err(SweepError::Malformed {
                        path: runs_path,
                        detail: format!("line {}: {e}", k + 1),
                    });
                }
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
            start,
            ended,
            report,
        })
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, SweepError> {
    let text = std::fs::read_to_string(path).map_err(io("reading", path))?;
    serde_json::from_str(&text).map_err(|e| SweepError::Malformed {
        path: path.to_owned(),
        detail: e.to_string(),
    })
}

/// The node directories under `dirs`: each one that holds a [`NODE`] itself, else its
/// subdirectories that do, by name.
///
/// # Errors
/// A directory that cannot be listed or holds none; a node file that cannot be read.
pub fn node_dirs(dirs: &[PathBuf]) -> Result<Vec<NodeDir>, SweepError> {
    let mut nodes = Vec::new();
    for dir in dirs {
        if dir.join(NODE).exists() {
            nodes.push(NodeDir::read(dir)?);
            continue;
        }
        let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io("listing", dir))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join(NODE).exists())
            .collect();
        subdirs.sort();
        if subdirs.is_empty() {
            return Err(SweepError::Malformed {
                path: dir.clone(),
                detail: format!("no sweep node in it (no {NODE} there or in a directory under it)"),
            });
        }
        for sub in subdirs {
            nodes.push(NodeDir::read(&sub)?);
        }
    }
    Ok(nodes)
}

/// The runs that succeeded in any node directory under `dirs` (none when there is none yet:
/// a directory that does not exist, or holds no node).
///
/// # Errors
/// A node's files that cannot be read or parsed: never taken for "nothing succeeded", which
/// would run finished runs again.
pub fn succeeded(dirs: &[PathBuf]) -> Result<BTreeSet<String>, SweepError> {
    let with_nodes: Vec<PathBuf> = (dirs.iter())
        .filter(|dir| {
            dir.join(NODE).exists()
                || std::fs::read_dir(dir)
                    .is_ok_and(|entries| entries.flatten().any(|e| e.path().join(NODE).exists()))
        })
        .cloned()
        .collect();
    let nodes = node_dirs(&with_nodes)?;
    Ok(nodes
        .iter()
        .flat_map(|n| {
            n.ended
                .iter()
                .chain(n.report.iter().flat_map(|r| &r.runs))
                .filter(|r| r.state == "succeeded")
                .map(|r| r.name.clone())
        })
        .collect())
}

/// Merges node directories into one report: every run of `planned` (or, without a plan,
/// every run a node knows) once, with its node; a `nodes` list; the feeds' counts, CPU and
/// cost summed, the wall time the longest node's.
///
/// Which record stands for a run: one where it succeeded (any attempt); else its node's end
/// report; else, if a node that did not reach its end was given it, `lost` with a reason
/// naming that node; else the last record of it that ended; else `not started`.
pub fn merge(nodes: &[NodeDir], planned: Option<&[PlannedRun]>) -> SweepReport {
    // The best record of each run, and, per node directory (one Slurm job's part of a node),
    // that directory's best record of it: the attempts.
    fn keep_better(slot: &mut Option<(u8, RunReport)>, rank: u8, run: &RunReport) {
        if slot.as_ref().is_none_or(|(have, _)| *have <= rank) {
            *slot = Some((rank, run.clone()));
        }
    }
    type Best = BTreeMap<String, (u8, RunReport)>;
    type PerDir = BTreeMap<String, BTreeMap<usize, (u8, RunReport)>>;
    fn offer(
        (best, per_dir): (&mut Best, &mut PerDir),
        at: usize,
        rank: u8,
        run: &RunReport,
        node: &str,
    ) {
        let mut run = run.clone();
        run.node.get_or_insert_with(|| node.to_owned());
        let rank = if run.state == "succeeded" { 3 } else { rank };
        let mut slot = best.remove(&run.name);
        keep_better(&mut slot, rank, &run);
        best.extend(slot.map(|s| (run.name.clone(), s)));
        let dirs = per_dir.entry(run.name.clone()).or_default();
        let mut slot = dirs.remove(&at);
        keep_better(&mut slot, rank, &run);
        dirs.extend(slot.map(|s| (at, s)));
    }
    let mut best = Best::new();
    let mut per_dir = PerDir::new();
    for (at, node) in nodes.iter().enumerate() {
        let name = node.name();
        for run in &node.ended {
            offer((&mut best, &mut per_dir), at, 0, run, &name);
        }
    }
    for (at, node) in nodes.iter().enumerate() {
        let name = node.name();
        match &node.report {
            Some(report) => report
                .runs
                .iter()
                .for_each(|r| offer((&mut best, &mut per_dir), at, 2, r, &name)),
            None => {
                for run in &node.start.runs {
                    // Offered even when another job's attempt succeeded: it stands, and this
                    // one is listed among its attempts.
                    let ended_here = node.ended.iter().any(|r| &r.name == run);
                    if !ended_here {
                        let lost = RunReport {
                            name: run.clone(),
                            args: args_of(planned, run),
                            state: "lost".into(),
                            exit_code: None,
                            reason: Some(format!(
                                "node {name} stopped before the run ended (lost node, or its sweep was killed): \
                                 resume the sweep to run it again"
                            )),
                            log: None,
                            stderr_log: None,
                            seconds: None,
                            gpu: Vec::new(),
                            last_lines: Vec::new(),
                            node: Some(name.clone()),
                            cpu_seconds: None,
                            attempts: Vec::new(),
                        };
                        offer((&mut best, &mut per_dir), at, 1, &lost, &name);
                    }
                }
            }
        }
    }
    let order: Vec<String> = match planned {
        Some(planned) => planned.iter().map(|r| r.name.clone()).collect(),
        None => best.keys().cloned().collect(),
    };
    // A run's attempts in the order of their jobs (Slurm's job ids grow), the one that
    // stands left out.
    let job_of = |at: usize| nodes[at].start.job_id.clone();
    let job_order = |at: &usize| {
        let job = job_of(*at);
        (job.as_deref().and_then(|j| j.parse::<u64>().ok()), job, *at)
    };
    let mut attempts_of = |name: &str, standing: &RunReport| -> Vec<RunAttempt> {
        let mut records: Vec<(usize, RunReport)> = per_dir
            .remove(name)
            .into_iter()
            .flatten()
            .map(|(at, (_, run))| (at, run))
            .collect();
        if records.len() < 2 {
            return Vec::new();
        }
        records.sort_by_key(|(at, _)| job_order(at));
        (records.into_iter())
            .filter(|(_, run)| run != standing)
            .map(|(at, run)| RunAttempt {
                job: job_of(at),
                node: run.node,
                state: run.state,
                exit_code: run.exit_code,
                reason: run.reason,
                log: run.log,
                stderr_log: run.stderr_log,
                seconds: run.seconds,
            })
            .collect()
    };
    let runs: Vec<RunReport> = order
        .iter()
        .map(|name| match best.remove(name) {
            Some((_, mut run)) => {
                run.attempts = attempts_of(name, &run);
                run
            }
            None => RunReport {
                name: name.clone(),
                args: args_of(planned, name),
                state: "not started".into(),
                exit_code: None,
                reason: Some("no node started it (its node was lost before it began)".into()),
                log: None,
                stderr_log: None,
                seconds: None,
                gpu: Vec::new(),
                last_lines: Vec::new(),
                node: None,
                cpu_seconds: None,
                attempts: Vec::new(),
            },
        })
        .collect();

    let reports: Vec<&SweepReport> = nodes.iter().filter_map(|n| n.report.as_ref()).collect();
    let sum = |f: &dyn Fn(&SweepReport) -> f64| reports.iter().map(|r| f(r)).sum::<f64>();
    let dollars = |f: &dyn Fn(&Cost) -> Option<f64>| {
        let all: Vec<f64> = reports.iter().filter_map(|r| f(&r.cost)).collect();
        (!all.is_empty()).then(|| all.iter().sum())
    };
    let count = |f: &dyn Fn(&FeedReport) -> u64| reports.iter().map(|r| f(&r.feed)).sum::<u64>();
    SweepReport {
        runs,
        feed: FeedReport {
            socket: PathBuf::new(),
            reused: !reports.is_empty() && reports.iter().all(|r| r.feed.reused),
            samples_published: count(&|f| f.samples_published),
            samples_consumed: count(&|f| f.samples_consumed),
            bad_samples: count(&|f| f.bad_samples),
            cpu_seconds: sum(&|r| r.feed.cpu_seconds),
        },
        // The nodes of one job run side by side; the jobs of a resumed sweep one after
        // another.
        wall_seconds: {
            let mut per_job: BTreeMap<Option<String>, f64> = BTreeMap::new();
            for node in nodes {
                if let Some(report) = &node.report {
                    let wall = per_job.entry(node.start.job_id.clone()).or_insert(0.0);
                    *wall = wall.max(report.wall_seconds);
                }
            }
            per_job.values().sum()
        },
        cpu_seconds: sum(&|r| r.cpu_seconds),
        cost: Cost {
            cpu_seconds: sum(&|r| r.cost.cpu_seconds),
            gpu_hours: sum(&|r| r.cost.gpu_hours),
            dollars: dollars(&|c| c.dollars),
            private_pipelines_cpu_seconds: sum(&|r| r.cost.private_pipelines_cpu_seconds),
            private_pipelines_dollars: dollars(&|c| c.private_pipelines_dollars),
            private_pipelines_wall_seconds: (reports.iter())
                .filter_map(|r| r.cost.private_pipelines_wall_seconds)
                .reduce(f64::max),
            private_pipelines_gpu_hours: (reports.iter())
                .filter_map(|r| r.cost.private_pipelines_gpu_hours)
                .reduce(|a, b| a + b),
        },
        nodes: nodes
            .iter()
            .map(|n| NodeReport {
                name: n.name(),
                feed: n.report.as_ref().map(|r| r.feed.clone()),
                runs: n.start.runs.clone(),
                lost: n.report.is_none().then(|| {
                    format!(
                        "no end report in {}: the node was lost or its sweep killed",
                        n.dir.display()
                    )
                }),
                job: n.start.job_id.clone(),
            })
            .collect(),
    }
}

fn args_of(planned: Option<&[PlannedRun]>, name: &str) -> Vec<String> {
    planned
        .and_then(|p| p.iter().find(|r| r.name == name))
        .map(|r| r.args.clone())
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    pub(crate) fn run(name: &str, state: &str) -> RunReport {
        RunReport {
            name: name.into(),
            args: vec!["train".into()],
            state: state.into(),
            exit_code: (state == "succeeded").then_some(0),
            reason: None,
            log: None,
            stderr_log: None,
            seconds: Some(1.0),
            gpu: vec![0],
            last_lines: Vec::new(),
            node: None,
            cpu_seconds: None,
            attempts: Vec::new(),
        }
    }

    fn report(runs: Vec<RunReport>, published: u64) -> SweepReport {
        SweepReport {
            runs,
            feed: FeedReport {
                socket: "/tmp/x/feed.sock".into(),
                reused: false,
                samples_published: published,
                samples_consumed: 2 * published,
                bad_samples: 0,
                cpu_seconds: 1.5,
            },
            wall_seconds: published as f64,
            cpu_seconds: 2.0,
            cost: Cost {
                cpu_seconds: 2.0,
                gpu_hours: 0.5,
                dollars: None,
                private_pipelines_cpu_seconds: 3.0,
                private_pipelines_dollars: None,
                private_pipelines_wall_seconds: None,
                private_pipelines_gpu_hours: None,
            },
            nodes: Vec::new(),
        }
    }

    pub(crate) fn node(dir: &Path, name: &str, index: u32, runs: &[&str]) -> Ledger {
        let dir = dir.join(format!("node-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        Ledger::start(
            &dir,
            &NodeStart {
                node: Some(name.into()),
                shard: Shard::new(index, 2).unwrap(),
                job_id: Some("7".into()),
                runs: runs.iter().map(|r| (*r).to_owned()).collect(),
                skipped: Vec::new(),
            },
        )
        .unwrap()
    }

    /// Node `n2` of Slurm job `job` starting `runs`, in the directory that job writes.
    fn job_node(sweep: &Path, job: &str, runs: &[&str]) -> (PathBuf, Ledger) {
        let at = crate::slurm::node_job_dir(sweep, "n2", job);
        std::fs::create_dir_all(&at).unwrap();
        let start = NodeStart {
            node: Some("n2".into()),
            shard: Shard::new(0, 1).unwrap(),
            job_id: Some(job.into()),
            runs: runs.iter().map(|r| (*r).to_owned()).collect(),
            skipped: Vec::new(),
        };
        (at.clone(), Ledger::start(&at, &start).unwrap())
    }

    fn planned(n: usize) -> Vec<PlannedRun> {
        (0..n)
            .map(|k| PlannedRun {
                name: format!("run-{k:02}"),
                args: vec!["train".into(), k.to_string()],
            })
            .collect()
    }

    #[test]
    fn a_node_starting_again_never_shows_another_node_a_torn_start_file() {
        // A requeued job's nodes start again together: each reads the others' files to skip
        // the runs that succeeded while they rewrite their own. A torn node.json once read as
        // "nothing succeeded", and n1 ran its finished runs again.
        let dir = tempfile::tempdir().unwrap();
        let mut n1 = node(dir.path(), "n1", 0, &["run-00"]);
        n1.append(&run("run-00", "succeeded"));
        let _n2 = node(dir.path(), "n2", 1, &["run-01"]);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..3000 {
                    drop(node(dir.path(), "n2", 1, &["run-01"]));
                }
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
                let done = succeeded(&[dir.path().to_owned()])
                    .map(|d| d.into_iter().collect::<Vec<_>>())
                    .map_err(|e| e.to_string());
                assert_eq!(done, Ok(vec!["run-00".to_owned()]), "read {reads}");
                reads += 1;
            }
        });
        // No temporary file is left beside.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("node-n2"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn an_unreadable_node_is_an_error_not_nothing_succeeded() {
        let dir = tempfile::tempdir().unwrap();
        // No directory, or one without a node: nothing has succeeded yet.
        assert_eq!(succeeded(&[dir.path().join("none")]).unwrap().len(), 0);
        assert_eq!(succeeded(&[dir.path().to_owned()]).unwrap().len(), 0);
        let mut n1 = node(dir.path(), "n1", 0, &["run-00"]);
        n1.append(&run("run-00", "succeeded"));
        let bad = dir.path().join("node-n2");
        std::fs::create_dir_all(&bad).unwrap();
        std::fs::write(bad.join(NODE), "{\"node\": ").unwrap();
        let err = succeeded(&[dir.path().to_owned()]).unwrap_err();
        assert!(err.to_string().contains("node-n2"), "{err}");
    }

    #[test]
    fn two_nodes_merge_into_one_report_with_each_run_once_and_its_node() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = node(dir.path(), "n1", 0, &["run-00", "run-02"]);
        let mut b = node(dir.path(), "n2", 1, &["run-01"]);
        let (r0, r1, r2) = (
            run("run-00", "succeeded"),
            run("run-01", "succeeded"),
            run("run-02", "failed"),
        );
        a.append(&r0);
        a.append(&r2);
        b.append(&r1);
        a.finish(&report(vec![r0, r2], 100));
        b.finish(&report(vec![r1], 50));
        let nodes = node_dirs(&[dir.path().to_owned()]).unwrap();
        let merged = merge(&nodes, Some(&planned(3)));
        let names: Vec<_> = merged.runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["run-00", "run-01", "run-02"]);
        let on: Vec<_> = merged.runs.iter().map(|r| r.node.as_deref()).collect();
        assert_eq!(on, [Some("n1"), Some("n2"), Some("n1")]);
        assert_eq!(merged.runs[2].state, "failed");
        assert_eq!(merged.feed.samples_published, 150);
        assert_eq!(merged.wall_seconds, 100.0);
        assert_eq!(merged.cost.gpu_hours, 1.0);
        assert_eq!(merged.nodes.len(), 2);
        assert_eq!(merged.nodes[1].runs, ["run-01"]);
        assert!(
            merged
                .nodes
                .iter()
                .all(|n| n.lost.is_none() && n.feed.is_some())
        );
        let json = serde_json::to_value(&merged).unwrap();
        assert_eq!(json["runs"][1]["node"], "n2");
        assert_eq!(json["nodes"][0]["feed"]["samples_published"], 100);
    }

    #[test]
    fn a_lost_node_keeps_the_runs_it_ended_and_its_others_are_lost_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = node(dir.path(), "n1", 0, &["run-00", "run-02"]);
        let mut b = node(dir.path(), "n2", 1, &["run-01", "run-03"]);
        let r0 = run("run-00", "succeeded");
        let r2 = run("run-02", "succeeded");
        a.append(&r0);
        a.append(&r2);
        a.finish(&report(vec![r0, r2], 100));
        b.append(&run("run-01", "succeeded"));
        // n2 dies here: a torn last line and no report.
        drop(b);
        let runs = dir.path().join("node-n2").join(RUNS);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&runs)
            .unwrap();
        f.write_all(b"{\"name\":\"run-0").unwrap();
        let nodes = node_dirs(&[dir.path().to_owned()]).unwrap();
        let merged = merge(&nodes, Some(&planned(5)));
        let states: Vec<_> = merged.runs.iter().map(|r| r.state.as_str()).collect();
        assert_eq!(
            states,
            ["succeeded", "succeeded", "succeeded", "lost", "not started"]
        );
        let reason = merged.runs[3].reason.as_deref().unwrap();
        assert!(reason.contains("node n2"), "{reason}");
        assert_eq!(merged.runs[3].args, ["train", "3"]);
        assert!(merged.nodes[1].lost.is_some() && merged.nodes[1].feed.is_none());
        let done = succeeded(&[dir.path().to_owned()]).unwrap();
        assert_eq!(
            done.into_iter().collect::<Vec<_>>(),
            ["run-00", "run-01", "run-02"]
        );
    }

    #[test]
    fn a_success_in_an_earlier_attempt_outranks_a_later_loss_and_a_new_start_clears_the_old_report()
    {
        let dir = tempfile::tempdir().unwrap();
        let mut first = node(dir.path(), "n1", 0, &["run-00"]);
        first.append(&run("run-00", "succeeded"));
        first.finish(&report(vec![run("run-00", "succeeded")], 10));
        // The requeued job starts n1 again with another run, and dies.
        let again = node(dir.path(), "n1", 0, &["run-01"]);
        drop(again);
        assert!(!dir.path().join("node-n1").join(REPORT).exists());
        let nodes = node_dirs(&[dir.path().to_owned()]).unwrap();
        let merged = merge(&nodes, Some(&planned(2)));
        assert_eq!(merged.runs[0].state, "succeeded");
        assert_eq!(merged.runs[1].state, "lost");
    }

    #[test]
    fn a_resumed_jobs_node_writes_beside_the_first_and_the_merge_lists_each_runs_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let start = |job: &str, runs: &[&str]| job_node(dir.path(), job, runs);
        let logged = |name: &str, state: &str, log: &str| RunReport {
            log: Some(log.into()),
            ..run(name, state)
        };
        let (first_dir, mut first) = start("7", &["run-00", "run-01"]);
        assert_eq!(first_dir, dir.path().join("node-n2"));
        let (r0, r1) = (
            logged("run-00", "succeeded", "/job7/logs/1/0.out"),
            logged("run-01", "failed", "/job7/logs/2/0.out"),
        );
        first.append(&r0);
        first.append(&r1);
        first.finish(&report(vec![r0, r1], 100));
        // The same job requeued keeps its directory; a resumed job (another id) writes beside.
        assert_eq!(crate::slurm::node_job_dir(dir.path(), "n2", "7"), first_dir);
        let (second_dir, mut second) = start("9", &["run-01"]);
        assert_eq!(second_dir, dir.path().join("node-n2.2"));
        // Its scheduler numbers runs from 1 again: its own logs directory keeps them apart.
        let r1 = logged("run-01", "succeeded", "/job9/logs/1/0.out");
        second.append(&r1);
        second.finish(&report(vec![r1], 50));
        // The first job's end report is still there.
        assert!(first_dir.join(REPORT).exists());
        let nodes = node_dirs(&[dir.path().to_owned()]).unwrap();
        let merged = merge(&nodes, Some(&planned(2)));
        assert_eq!(merged.runs[0].state, "succeeded");
        assert!(merged.runs[0].attempts.is_empty(), "run-00 ran once");
        let again = &merged.runs[1];
        assert_eq!(again.state, "succeeded");
        assert_eq!(again.log.as_deref(), Some(Path::new("/job9/logs/1/0.out")));
        assert_eq!(again.attempts.len(), 1, "{again:?}");
        let earlier = &again.attempts[0];
        assert_eq!(
            (earlier.job.as_deref(), earlier.state.as_str()),
            (Some("7"), "failed")
        );
        assert_eq!(
            earlier.log.as_deref(),
            Some(Path::new("/job7/logs/2/0.out"))
        );
        // Both jobs' nodes, counts and times: one job after the other.
        let jobs: Vec<_> = merged.nodes.iter().map(|n| n.job.as_deref()).collect();
        assert_eq!(jobs, [Some("7"), Some("9")]);
        assert_eq!(merged.feed.samples_published, 150);
        assert_eq!(merged.wall_seconds, 150.0);
    }

    #[test]
    fn a_run_lost_with_its_node_and_resumed_lists_the_lost_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let start = |job: &str| job_node(dir.path(), job, &["run-00"]).1;
        drop(start("7")); // lost: no run ended, no report
        let mut second = start("9");
        second.append(&run("run-00", "succeeded"));
        second.finish(&report(vec![run("run-00", "succeeded")], 5));
        let merged = merge(
            &node_dirs(&[dir.path().to_owned()]).unwrap(),
            Some(&planned(1)),
        );
        let run = &merged.runs[0];
        assert_eq!(run.state, "succeeded");
        assert_eq!(run.attempts.len(), 1, "{run:?}");
        assert_eq!(run.attempts[0].state, "lost");
        assert_eq!(run.attempts[0].job.as_deref(), Some("7"));
    }

    #[test]
    fn a_directory_without_a_node_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = node_dirs(&[dir.path().to_owned()]).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        std::fs::write(dir.path().join(NODE), "{not json").unwrap();
        let err = node_dirs(&[dir.path().to_owned()]).unwrap_err().to_string();
        assert!(err.contains(NODE), "{err}");
    }
}
