//! NVIDIA MPS: start or adopt `nvidia-cuda-mps-control -d` with private pipe and log
//! directories, build each job's environment, and quit cleanly.
//!
//! The control daemon is started **without** `CUDA_VISIBLE_DEVICES` so that it sees every
//! GPU and clients can name theirs by UUID (NVIDIA's advice: indices are remapped when the
//! daemon itself has a restricted view). Each job gets
//! - `CUDA_VISIBLE_DEVICES=GPU-uuid[,GPU-uuid…]`,
//! - `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY` of this daemon,
//! - `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=6144M[,1=6144M…]` (per device ordinal as the
//!   client sees them, i.e. 0, 1, … in `CUDA_VISIBLE_DEVICES` order) when the policy sets a
//!   limit (format: NVIDIA's MPS documentation, "Appendix: Environment Variables",
//!   <https://docs.nvidia.com/deploy/mps/latest/appendix-environment-variables.html>). Checked
//!   on an H100 with driver 580 (`benches/gpu/scheduler_check.py`): a client under `0=2048M`
//!   allocates 1 GiB and fails with CUDA out of memory at 4 GiB more while its unlimited
//!   neighbour allocates 4 GiB; `0=2G` and `GPU-<uuid>=2048M` limit the same way. The limit
//!   covers the client's CUDA context too (torch saw 1534 MiB free under `0=2048M`), and
//! - `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` when the submission asks for it.
//!
//! ladle never changes compute mode, clocks, persistence mode or MIG; unsuitable settings
//! are reported by the telemetry backend (`GpuInfo::unsuitable`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The control program's name.
pub const CONTROL: &str = "nvidia-cuda-mps-control";

/// MPS could not be started, adopted or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MpsError {
    /// `nvidia-cuda-mps-control` is not on `PATH`.
    #[error(
        "{CONTROL} is not on PATH (install the NVIDIA driver utilities, or run with --mps off)"
    )]
    NotFound,
    /// A directory or the program could not be used.
    #[error("MPS {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The control program ran and failed.
    #[error("`{CONTROL} {args}` failed with {status}: {stderr}")]
    Failed {
        /// Its arguments or the command sent.
        args: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed.
        stderr: String,
    },
}

/// A running MPS control daemon this scheduler uses.
#[derive(Debug)]
pub struct Mps {
    control: PathBuf,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    started_here: bool,
}

/// Finds an executable named `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

impl Mps {
    /// Adopts the control daemon whose pipe directory is `state_dir/mps/pipe`, or starts
    /// one there.
    ///
    /// # Errors
    /// [`MpsError::NotFound`] without the program, [`MpsError::Io`] or [`MpsError::Failed`]
    /// when it cannot be started.
    pub fn start_or_adopt(state_dir: &Path) -> Result<Self, MpsError> {
        Self::start_or_adopt_program(CONTROL, state_dir)
    }

    /// [`Mps::start_or_adopt`] with the control program found on `PATH` under `program`.
    ///
    /// # Errors
    /// As [`Mps::start_or_adopt`].
    pub fn start_or_adopt_program(program: &str, state_dir: &Path) -> Result<Self, MpsError> {
        let control = which(program).ok_or(MpsError::NotFound)?;
        let pipe_dir = state_dir.join("mps").join("pipe");
        let log_dir = state_dir.join("mps").join("log");
        for dir in [&pipe_dir, &log_dir] {
            std::fs::create_dir_all(dir).map_err(|source| MpsError::Io {
                what: format!("creating {}", dir.display()),
                source,
            })?;
        }
        let mut mps = Self {
            control,
            pipe_dir,
            log_dir,
            started_here: false,
        };
        if mps.pipe_dir.join("control").exists() && mps.send("get_server_list").is_ok() {
            tracing::info!(pipe = %mps.pipe_dir.display(), "adopted a running MPS control daemon");
            return Ok(mps);
        }
        let out = Command::new(&mps.control)
            .arg("-d")
            .envs(mps.env())
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .output()
            .map_err(|source| MpsError::Io {
                what: format!("starting {CONTROL}"),
                source,
            })?;
        if !out.status.success() {
            return Err(MpsError::Failed {
                args: "-d".to_owned(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        mps.started_here = true;
        tracing::info!(pipe = %mps.pipe_dir.display(), "started the MPS control daemon");
        Ok(mps)
    }

    /// The pipe and log directory variables every client needs.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_owned(),
                self.pipe_dir.display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".to_owned(),
                self.log_dir.display().to_string(),
            ),
        ]
    }

    /// Whether this scheduler started the control daemon (rather than adopting it).
    pub fn started_here(&self) -> bool {
        self.started_here
    }

    /// Sends one command to the control daemon and returns what it printed.
    ///
    /// # Errors
    /// [`MpsError::Io`] or [`MpsError::Failed`].
    pub fn send(&self, command: &str) -> Result<String, MpsError> {
        let mut child = Command::new(&self.control)
            .envs(self.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| MpsError::Io {
                what: format!("running {CONTROL}"),
                source,
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = writeln!(stdin, "{command}");
        }
        let out = child.wait_with_output().map_err(|source| MpsError::Io {
            what: format!("waiting for {CONTROL}"),
            source,
        })?;
        if !out.status.success() {
            return Err(MpsError::Failed {
                args: command.to_owned(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Asks the control daemon to quit (it stops its servers once their clients are done).
    ///
    /// # Errors
    /// As [`Mps::send`].
    pub fn quit(self) -> Result<(), MpsError> {
        self.send("quit").map(|_| ())
    }
}

/// The environment a job gets for its GPUs: their UUIDs in `CUDA_VISIBLE_DEVICES`, the MPS
/// pinned-memory limit per visible device when `limit_mib` is set, and the active thread
/// percentage when asked.
pub fn job_env(
    uuids: &[&str],
    limit_mib: Option<u64>,
    thread_percentage: Option<u32>,
) -> Vec<(String, String)> {
    let mut env = vec![("CUDA_VISIBLE_DEVICES".to_owned(), uuids.join(","))];
    if let Some(limit) = limit_mib {
        let per_device: Vec<String> = (0..uuids.len()).map(|i| format!("{i}={limit}M")).collect();
        env.push((
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
            per_device.join(","),
        ));
    }
    if let Some(pct) = thread_percentage {
        env.push((
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_owned(),
            pct.clamp(1, 100).to_string(),
        ));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_sees_its_gpus_by_uuid_with_a_limit_per_visible_device() {
        let env = job_env(&["GPU-aaa", "GPU-bbb"], Some(6144), Some(50));
        assert_eq!(
            env,
            vec![
                (
                    "CUDA_VISIBLE_DEVICES".to_owned(),
                    "GPU-aaa,GPU-bbb".to_owned()
                ),
                (
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
                    "0=6144M,1=6144M".to_owned()
                ),
                (
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_owned(),
                    "50".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn without_a_limit_only_the_gpus_are_set() {
        let env = job_env(&["GPU-aaa"], None, None);
        assert_eq!(env.len(), 1);
    }

    #[test]
    fn a_missing_control_program_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Mps::start_or_adopt_program("ladle-test-no-such-mps-control", dir.path()),
            Err(MpsError::NotFound)
        ));
    }
}
