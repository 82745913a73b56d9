//! The submitting side of a Slurm sweep, apart from the terminal: which runs a `--resume`
//! submits again, the batch script written and submitted with the manifest kept up to date,
//! the job's output file followed a whole line at a time, and the merge of a sweep
//! directory's nodes into one report. `ladle sweep --slurm` (`cli/src/slurm.rs`) maps its
//! options onto these and prints; `ladle report --merge` calls [`merge_dirs`].

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use ladle_observe::report::SweepReport;

use crate::SweepError;
use crate::ledger;
use crate::slurm::{self, MANIFEST, Manifest};

impl Manifest {
    /// Narrows the script to the runs of the sweep directory `sweep` that have not
    /// succeeded (lost with a node, failed, cancelled, never started) and returns their
    /// names; empty when every run succeeded.
    ///
    /// # Errors
    /// A node's files under `sweep` that cannot be read ([`ledger::succeeded`]).
    pub fn resume(&mut self, sweep: &Path) -> Result<Vec<String>, SweepError> {
        let done = ledger::succeeded(&[sweep.to_owned()])?;
        let left: Vec<String> = self
            .runs
            .iter()
            .filter(|r| !done.contains(&r.name))
            .map(|r| r.name.clone())
            .collect();
        self.script.only.clone_from(&left);
        Ok(left)
    }

    /// Runs the next job submitted for it will run.
    pub fn runs_to_submit(&self) -> usize {
        match self.script.only.len() {
            0 => self.runs.len(),
            only => only,
        }
    }
}

/// The batch script of `manifest`, written into its sweep directory with the manifest
/// beside it; returns the script's path and text. The first job's script is `sweep.sbatch`;
/// a resumed sweep's (`script.only` narrowed, or jobs already submitted) is the first
/// `resume-N.sbatch` not written yet, N from the jobs submitted so far, so that a script the
/// user edited and submitted by hand is never overwritten.
///
/// # Errors
/// [`SweepError::Io`] naming the file; [`SweepError::Edited`] when `sweep.sbatch` exists
/// with other contents (edited since ladle wrote it) and this is not a resume.
pub fn write_script(manifest: &Manifest) -> Result<(PathBuf, String), SweepError> {
    let sweep = &manifest.script.sweep;
    let text = slurm::script(&manifest.script);
    let resume = !manifest.jobs.is_empty() || !manifest.script.only.is_empty();
    let path = if resume {
        (manifest.jobs.len().max(1)..)
            .map(|n| sweep.join(format!("resume-{n}.sbatch")))
            .find(|p| !p.exists())
            .unwrap_or_else(|| sweep.join("resume.sbatch"))
    } else {
        let path = sweep.join(slurm::SCRIPT);
        match std::fs::read_to_string(&path) {
            Ok(old) if old != text => {
                return Err(SweepError::Edited {
                    path,
                    detail: "differs from the script this sweep would write (edited?), and ladle \
                             does not overwrite it: submit it with `sbatch` (then follow it with \
                             `ladle sweep --resume` once it ends), or remove it, or choose \
                             another --out"
                        .into(),
                });
            }
            _ => path,
        }
    };
    std::fs::write(&path, &text).map_err(|source| SweepError::Io {
        what: "writing the batch script",
        path: path.clone(),
        source,
    })?;
    manifest.write(sweep)?;
    Ok((path, text))
}

/// Submits `script` (from [`write_script`]) and records the job in the manifest; returns
/// the job id.
///
/// # Errors
/// What `sbatch` said ([`SweepError::Slurm`]), or [`SweepError::Io`] writing the manifest.
pub fn submit(manifest: &mut Manifest, script: &Path) -> Result<String, SweepError> {
    let id = slurm::submit(script, &[])?;
    manifest.jobs.push(id.clone());
    manifest.write(&manifest.script.sweep)?;
    Ok(id)
}

/// A file another process appends to (the job's output), read a whole line at a time.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
}

impl Tail {
    /// Follows `path` from its start (it need not exist yet).
    pub fn new(path: PathBuf) -> Self {
        Self { path, offset: 0 }
    }

    /// The whole lines added since the last call (newlines included); a line still being
    /// written waits for its newline. Nothing while the file cannot be read.
    pub fn new_lines(&mut self) -> String {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return String::new();
        };
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return String::new();
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return String::new();
        }
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return String::new();
        };
        self.offset += end as u64 + 1;
        String::from_utf8_lossy(&bytes[..=end]).into_owned()
    }
}

/// Merges sweep directories (a `--slurm` sweep's, with its manifest: lost nodes' runs
/// included and the report written as `DIR/report.json`; or the `--out` directories of
/// shards run by hand) into one report; returns it and whether every run exited 0.
///
/// # Errors
/// [`SweepError`] when a directory is not a sweep's or its manifest cannot be read.
pub fn merge_dirs(dirs: &[PathBuf]) -> Result<(SweepReport, bool), SweepError> {
    let manifest = match dirs {
        [one] if one.join(MANIFEST).exists() => Some(Manifest::read(one)?),
        _ => None,
    };
    let nodes = ledger::node_dirs(dirs)?;
    let report = ledger::merge(&nodes, manifest.as_ref().map(|m| m.runs.as_slice()));
    if let [one] = dirs
        && manifest.is_some()
    {
        ledger::write_report(&one.join(ledger::REPORT), &report);
    }
    let ok = report.runs.iter().all(|r| r.exit_code == Some(0));
    Ok((report, ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid;
    use crate::slurm::{GpuRequest, ScriptSpec};

    fn manifest(sweep: &Path, runs: usize) -> Manifest {
        let command: Vec<String> = ["train", "--lr", "{1,2,3,4}"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let mut runs_of = grid::expand(&command, None).unwrap();
        runs_of.truncate(runs);
        Manifest {
            runs: runs_of,
            script: ScriptSpec {
                ladle: "/bin/ladle".into(),
                sweep: sweep.to_owned(),
                cwd: "/".into(),
                nodes: 2,
                gpus: GpuRequest::None,
                slurm_args: Vec::new(),
                node_args: Vec::new(),
                command,
                only: Vec::new(),
            },
            jobs: Vec::new(),
        }
    }

    #[test]
    fn a_resume_submits_only_the_runs_no_node_reported_a_success_for() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = manifest(dir.path(), 4);
        assert_eq!(m.runs_to_submit(), 4);
        // n1 reported run-00 succeeded and run-02 failed; nothing of run-01 and run-03.
        let mut n1 = crate::ledger::tests::node(dir.path(), "n1", 0, &["run-00", "run-02"]);
        n1.append(&crate::ledger::tests::run("run-00", "succeeded"));
        n1.append(&crate::ledger::tests::run("run-02", "failed"));
        let left = m.resume(dir.path()).unwrap();
        assert_eq!(left, ["run-01", "run-02", "run-03"]);
        assert_eq!(m.script.only, left);
        assert_eq!(m.runs_to_submit(), 3);
    }

    #[test]
    fn scripts_are_named_for_the_jobs_already_submitted_and_the_manifest_kept_beside() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = manifest(dir.path(), 2);
        let (path, text) = write_script(&m).unwrap();
        assert_eq!(path, dir.path().join(slurm::SCRIPT));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert_eq!(Manifest::read(dir.path()).unwrap(), m);
        m.jobs.push("41".into());
        let (path, _) = write_script(&m).unwrap();
        assert_eq!(path, dir.path().join("resume-1.sbatch"));
        assert_eq!(Manifest::read(dir.path()).unwrap().jobs, ["41"]);
    }

    #[test]
    fn a_script_the_user_edited_is_never_overwritten_by_a_resume_or_a_second_submission() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest(dir.path(), 2);
        let (path, text) = write_script(&m).unwrap();
        // Written again unchanged: fine (a dry run, then the same sweep submitted).
        assert_eq!(write_script(&m).unwrap().0, path);
        // The user edits it (a partition, a time limit) and submits it by hand.
        let edited = text.replacen("#SBATCH", "#SBATCH --time=01:00:00\n#SBATCH", 1);
        std::fs::write(&path, &edited).unwrap();
        let err = write_script(&m).unwrap_err().to_string();
        assert!(
            err.contains("sweep.sbatch") && err.contains("does not overwrite"),
            "{err}"
        );
        // Its resume (no job recorded: it went through sbatch by hand) writes beside it.
        let mut resumed = m.clone();
        resumed.script.only = vec!["run-01".into()];
        let (first, _) = write_script(&resumed).unwrap();
        assert_eq!(first, dir.path().join("resume-1.sbatch"));
        let (second, _) = write_script(&resumed).unwrap();
        assert_eq!(second, dir.path().join("resume-2.sbatch"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), edited);
    }

    #[test]
    fn a_tail_gives_whole_lines_once_and_waits_for_a_partial_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slurm-1.out");
        let mut tail = Tail::new(path.clone());
        assert_eq!(tail.new_lines(), "", "no file yet");
        std::fs::write(&path, "one\ntw").unwrap();
        assert_eq!(tail.new_lines(), "one\n");
        assert_eq!(tail.new_lines(), "");
        std::fs::write(&path, "one\ntwo\nthr\u{e9}e\n").unwrap();
        assert_eq!(tail.new_lines(), "two\nthr\u{e9}e\n");
    }
}
