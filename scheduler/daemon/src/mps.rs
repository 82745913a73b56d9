//! NVIDIA MPS: start or adopt `nvidia-cuda-mps-control -d` with private pipe and log
//! directories, build each job's environment, and quit cleanly.
//!
//! The control daemon is started **without** `CUDA_VISIBLE_DEVICES` so that it sees every
//! GPU and clients can name theirs by UUID (NVIDIA's advice: indices are remapped when the
//! daemon itself has a restricted view).
//!
//! Under an allocation ([`crate::allocation`]: a Slurm job holding some of the node's GPUs)
//! it is started **with** `CUDA_VISIBLE_DEVICES` set to the allocated GPUs' UUIDs,
//! comma-joined ([`Mps::control_env`]), so that its servers never touch the node's other
//! GPUs, which other jobs hold. UUIDs keep the clients' view unambiguous: NVIDIA's MPS
//! documentation ("Appendix: Environment Variables", `CUDA_VISIBLE_DEVICES`,
//! <https://docs.nvidia.com/deploy/mps/latest/appendix-environment-variables.html>) says a
//! daemon started with `0,2` remaps them to 0 and 1 for its clients, and recommends UUIDs
//! for the daemon and the clients alike, which is what both get here. A daemon adopted from
//! an earlier ladle on the same state directory keeps the view it was started with: the
//! pipe directory is the state directory's, which is node-local and per allocation.
//!
//! Each job gets
//! - `CUDA_VISIBLE_DEVICES=GPU-uuid[,GPU-uuid…]`,
//! - `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY` of this daemon,
//! - `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-<uuid>=6144M[,GPU-<uuid>=6144M…]` when the policy
//!   sets a limit: one entry per GPU of the job, keyed by the GPU's UUID (see [`pinned_mem_limit`]
//!   for the format and NVIDIA's documentation of it). Checked on an H100 with driver 580
//!   (`benches/gpu/scheduler_check.py`): a client under `0=2048M` allocates 1 GiB and fails
//!   with CUDA out of memory at 4 GiB more while its unlimited neighbour allocates 4 GiB;
//!   `0=2G` and `GPU-<uuid>=2048M` limit the same way. The limit covers the client's CUDA
//!   context too (torch saw 1534 MiB free under `0=2048M`), and
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
    /// Another user's MPS control daemon or server runs on this machine.
    #[error(
        "another user's MPS runs on this machine ({program}, pid {pid}, uid {uid}): NVIDIA \
         supports one MPS control daemon per node, whose servers serve one user at a time, so \
         a second user's daemon would fight it over the GPUs. Ask its owner, or the machine's \
         administrator (who can run one daemon for every user), or run with --mps off (jobs \
         then time-share the GPUs)"
    )]
    OtherUser {
        /// Its program, `nvidia-cuda-mps-control` or `nvidia-cuda-mps-server`.
        program: String,
        /// Its pid.
        pid: u32,
        /// Its owner.
        uid: u32,
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

/// The first of `processes` (the machine's `nvidia-cuda-mps*` processes) that belongs to a
/// user other than `me`, as [`MpsError::OtherUser`]: MPS must not be started or adopted
/// beside it. NVIDIA's MPS documentation ("Appendix: Common Tasks", "On a Multi-user
/// System") says only one control daemon should run per node; the control daemon starts one
/// server per user and serves a second user only once the first one's server has no clients
/// left (`nvidia-cuda-mps-control(1)`). One daemon per user, each with its own pipe
/// directory, is therefore not supported; ladle refuses it by name instead of failing later
/// inside the users' jobs.
///
/// # Errors
/// [`MpsError::OtherUser`] naming the first such process.
pub fn check_no_other_user(processes: &[crate::sys::Owned], me: u32) -> Result<(), MpsError> {
    match processes.iter().find(|p| p.uid != me) {
        Some(p) => Err(MpsError::OtherUser {
            program: p.program.clone(),
            pid: p.pid,
            uid: p.uid,
        }),
        None => Ok(()),
    }
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
    ///
    /// `allocated`: the UUIDs of the GPUs this scheduler may use, when it may not use them all
    /// (see the module docs); a daemon started here sees only those.
    pub fn start_or_adopt(
        state_dir: &Path,
        allocated: Option<&[String]>,
    ) -> Result<Self, MpsError> {
        Self::start_or_adopt_program(CONTROL, state_dir, allocated)
    }

    /// [`Mps::start_or_adopt`] with the control program found on `PATH` under `program`.
    ///
    /// # Errors
    /// As [`Mps::start_or_adopt`].
    pub fn start_or_adopt_program(
        program: &str,
        state_dir: &Path,
        allocated: Option<&[String]>,
    ) -> Result<Self, MpsError> {
        let control = which(program).ok_or(MpsError::NotFound)?;
        check_no_other_user(
            &crate::sys::processes_named("nvidia-cuda-mps"),
            crate::sys::my_uid(),
        )?;
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
        let out = mps
            .start_command(allocated)
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
        tracing::info!(pipe = %mps.pipe_dir.display(), gpus = ?allocated, "started the MPS control daemon");
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

    /// The environment the control daemon is started with: [`Mps::env`], plus
    /// `CUDA_VISIBLE_DEVICES` = the allocated GPUs' UUIDs, comma-joined, under an allocation
    /// (without one, the daemon starts with `CUDA_VISIBLE_DEVICES` removed: every GPU).
    pub fn control_env(&self, allocated: Option<&[String]>) -> Vec<(String, String)> {
        let mut env = self.env();
        if let Some(uuids) = allocated {
            env.push(("CUDA_VISIBLE_DEVICES".to_owned(), uuids.join(",")));
        }
        env
    }

    /// `nvidia-cuda-mps-control -d` with [`Mps::control_env`] and never the caller's
    /// `CUDA_VISIBLE_DEVICES`.
    fn start_command(&self, allocated: Option<&[String]>) -> Command {
        let mut command = Command::new(&self.control);
        command
            .arg("-d")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .envs(self.control_env(allocated))
            .stdin(Stdio::null());
        command
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

/// The value of `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` that limits a client to `limit_mib` MiB on
/// each GPU in `uuids`: `GPU-<uuid>=<limit>M`, comma-separated.
///
/// The format is NVIDIA's, from the MPS documentation, "Appendix: Environment Variables",
/// section `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
/// (<https://docs.nvidia.com/deploy/mps/latest/appendix-environment-variables.html>): the
/// variable "will have the same semantics as `CUDA_VISIBLE_DEVICES` i.e. the value string can
/// contain comma-separated device ordinals and/or device UUIDs with per device memory limit
/// separated by an equals", example `0=1G,1=512MB`. The unit suffix follows the control
/// daemon's `set_default_device_pinned_mem_limit` in the same guide ("Legacy MPS v2
/// Interface", <https://docs.nvidia.com/deploy/mps/latest/mpsv2-interface.html>): "an integer
/// followed by a qualifier, either "G" or "M" that specifies the value in Gigabyte or Megabyte
/// respectively".
///
/// Keyed by UUID rather than ordinal: an ordinal is ambiguous between the client's view
/// (0, 1, … in `CUDA_VISIBLE_DEVICES` order, what ladle wrote before) and the MPS server's
/// enumeration (every GPU, as the control daemon starts without `CUDA_VISIBLE_DEVICES`), and
/// the documentation does not say which; a UUID names one GPU in both. Both forms limited the
/// same way on a one-GPU H100, which cannot tell the two ordinal readings apart.
pub fn pinned_mem_limit(uuids: &[&str], limit_mib: u64) -> String {
    uuids
        .iter()
        .map(|uuid| format!("{uuid}={limit_mib}M"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether ladle sets variable `name` for a job itself (`CUDA_VISIBLE_DEVICES`, `CUDA_MPS_*`):
/// a submitter's value of it never reaches the job, which runs on its GPUs under its limits.
pub fn sets(name: &str) -> bool {
    name == "CUDA_VISIBLE_DEVICES" || name.starts_with("CUDA_MPS_")
}

/// The environment a job gets for its GPUs: their UUIDs in `CUDA_VISIBLE_DEVICES`, the MPS
/// pinned-memory limit per GPU ([`pinned_mem_limit`]) when `limit_mib` is set, and the active
/// thread percentage when asked.
pub fn job_env(
    uuids: &[&str],
    limit_mib: Option<u64>,
    thread_percentage: Option<u32>,
) -> Vec<(String, String)> {
    let mut env = vec![("CUDA_VISIBLE_DEVICES".to_owned(), uuids.join(","))];
    if let Some(limit) = limit_mib {
        env.push((
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
            pinned_mem_limit(uuids, limit),
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
    fn a_job_sees_its_gpus_by_uuid_with_a_limit_per_gpu_keyed_by_uuid() {
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
                    "GPU-aaa=6144M,GPU-bbb=6144M".to_owned()
                ),
                (
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_owned(),
                    "50".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn the_pinned_limit_has_one_uuid_entry_with_a_megabyte_suffix_per_gpu() {
        let uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";
        assert_eq!(pinned_mem_limit(&[uuid], 2048), format!("{uuid}=2048M"));
        let two = pinned_mem_limit(&["GPU-a", "GPU-b"], 512);
        assert_eq!(two, "GPU-a=512M,GPU-b=512M");
        for entry in two.split(',') {
            let (device, limit) = entry.split_once('=').unwrap();
            assert!(device.starts_with("GPU-"), "{entry}");
            let digits = limit.strip_suffix('M').unwrap();
            assert!(digits.parse::<u64>().is_ok(), "{entry}");
        }
    }

    #[test]
    fn without_a_limit_only_the_gpus_are_set() {
        let env = job_env(&["GPU-aaa"], None, None);
        assert_eq!(env.len(), 1);
    }

    #[test]
    fn another_users_mps_process_is_refused_by_name_and_our_own_is_not() {
        let owned = |pid, uid, program: &str| crate::sys::Owned {
            pid,
            uid,
            program: program.to_owned(),
        };
        let ours = [owned(10, 1000, "nvidia-cuda-mps-control")];
        assert!(check_no_other_user(&ours, 1000).is_ok());
        let both = [ours[0].clone(), owned(20, 1001, "nvidia-cuda-mps-server")];
        let err = check_no_other_user(&both, 1000).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("pid 20")
                && text.contains("uid 1001")
                && text.contains("nvidia-cuda-mps-server")
                && text.contains("--mps off"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_control_program_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Mps::start_or_adopt_program("ladle-test-no-such-mps-control", dir.path(), None),
            Err(MpsError::NotFound)
        ));
    }

    fn mps(dir: &Path) -> Mps {
        Mps {
            control: dir.join(CONTROL),
            pipe_dir: dir.join("mps/pipe"),
            log_dir: dir.join("mps/log"),
            started_here: false,
        }
    }

    #[test]
    fn under_an_allocation_the_control_daemon_sees_only_the_allocated_gpus_by_uuid() {
        let mps = mps(Path::new("/state"));
        let uuids = ["GPU-aaa".to_owned(), "GPU-bbb".to_owned()];
        let env = mps.control_env(Some(&uuids));
        assert_eq!(
            env,
            vec![
                (
                    "CUDA_MPS_PIPE_DIRECTORY".to_owned(),
                    "/state/mps/pipe".to_owned()
                ),
                (
                    "CUDA_MPS_LOG_DIRECTORY".to_owned(),
                    "/state/mps/log".to_owned()
                ),
                (
                    "CUDA_VISIBLE_DEVICES".to_owned(),
                    "GPU-aaa,GPU-bbb".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn without_an_allocation_the_control_daemon_gets_no_visible_devices() {
        let env = mps(Path::new("/state")).control_env(None);
        assert!(
            env.iter().all(|(k, _)| k != "CUDA_VISIBLE_DEVICES"),
            "{env:?}"
        );
    }

    #[test]
    fn the_control_daemon_is_started_with_the_allocation_and_not_the_callers_view() {
        // A fake control program that records its CUDA_VISIBLE_DEVICES and exits 0.
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let seen = dir.path().join("seen");
        let program = bin.join("ladle-test-fake-mps-control");
        let script = format!(
            "#!/bin/sh\necho \"${{CUDA_VISIBLE_DEVICES-unset}}\" >> {}\n",
            seen.display()
        );
        // Written by a child process, so no fork of this (threaded) test binary can hold
        // it open for writing when it is run (ETXTBSY).
        let written = Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"printf '%s' "$1" > "$2" && chmod 755 "$2""#)
            .arg("sh")
            .arg(&script)
            .arg(&program)
            .status()
            .unwrap();
        assert!(written.success());
        let mps = Mps {
            control: program,
            ..mps(dir.path())
        };
        let run = |allocated: Option<&[String]>| {
            // Whatever this process's CUDA_VISIBLE_DEVICES is, the daemon gets the
            // allocation's or none.
            let status = mps.start_command(allocated).status().unwrap();
            assert!(status.success());
        };
        run(Some(&["GPU-aaa".to_owned()]));
        run(None);
        assert_eq!(std::fs::read_to_string(&seen).unwrap(), "GPU-aaa\nunset\n");
    }
}
