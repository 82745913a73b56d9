//! # ladle-scheduler-protocol: what a client and the scheduler say to each other
//!
//! In `docs/ARCHITECTURE.md`'s picture this crate is the scheduler line's socket: the one
//! contract between the daemon (`ladle-scheduler`) and its clients (`ladle submit`, `queue`,
//! `cancel`, `logs`, a sweep, `ladle top` and the metrics of `ladle-observe`), and all a
//! client needs. It holds the messages ([`Request`], [`Response`]), their frames
//! ([`read_frame`], [`write_frame`]) and the one-request client ([`request`]), and the types
//! they carry: jobs ([`job`]: [`JobSpec`], [`JobState`], [`Basis`]), GPUs ([`gpu`]:
//! [`GpuInfo`]) and memory sizes ([`units`]). What the scheduler does with them is
//! `ladle-scheduler-core`'s (admission, estimates, the journal's fold) and
//! `ladle-scheduler`'s (the daemon).
//!
//! ## The socket
//! One request per connection, each a single line of JSON (at most [`MAX_FRAME`] bytes)
//! carrying the protocol version, answered by one line of JSON. Anything else (garbage, a
//! wrong version, an oversize line, a slow client) gets an [`Response::Error`] and the
//! connection is closed; the daemon carries on.
//!
//! The daemon reads requests with [`read_request`], which also checks what a well-formed
//! request asks for ([`Request::validate`]): a submit stating more than
//! [`MAX_MIB`] (16 TiB) of device memory per GPU is refused with
//! [`RequestError::GpuMemoryOutOfRange`], so no absurd size reaches admission's arithmetic.
//!
//! ```text
//! → {"v":4,"op":"submit","command":["python","train.py"],"cwd":"/home/me","gpu_mem_mib":6144,"gpus":1,"feed":null,"thread_percentage":null}
//! ← {"v":4,"status":"submitted","id":7,"estimate_mib":6144}
//! ```
//!
//! **Every answer fits in a frame, by design.** No answer lists what only grows: `Queue` is
//! an overview (running and queued jobs, the latest [`QUEUE_FINISHED`] finished ones, every
//! GPU, and [`JobTotals`] over every job, with the count of jobs it leaves out); the rest is
//! read a page at a time with [`Request::Jobs`] (by id, by feed, or all), each page as many
//! jobs as fit. `Logs`, `Feeds` and `Error` answers are cut to fit the same way, and say
//! what they left out. Version 2 brought the bounded answers, 3 each job's CPU seconds,
//! 4 (this one) the count of admission rounds in `Queue`; a client of another version is
//! refused with an error naming both versions.
//!
//! ## Example: a request's frame, and reading it back as the daemon does
//! ```
//! use std::path::Path;
//! use ladle_scheduler_protocol::{Request, VERSION, read_request, write_frame};
//!
//! let mut line = Vec::new();
//! write_frame(&mut line, &Request::Queue, Path::new("scheduler.sock"))?;
//! assert_eq!(line, format!("{{\"v\":{VERSION},\"op\":\"queue\"}}\n").as_bytes());
//! assert_eq!(read_request(&line[..], Path::new("scheduler.sock"))?, Request::Queue);
//! # Ok::<(), ladle_scheduler_protocol::ProtocolError>(())
//! ```

pub mod gpu;
pub mod job;
pub mod units;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::gpu::GpuInfo;
use crate::job::{Basis, JobId, JobSpec, JobState};
use crate::units::MAX_MIB;

/// Protocol version; a request with another is refused.
pub const VERSION: u32 = 9;

/// The most a submitted job's environment may hold, bytes (names, values and a separator and
/// terminator each): 128 KiB, about Linux's own limit on one variable and far above a
/// shell's usual few KiB, well inside a frame and a journal line.
pub const MAX_ENV_BYTES: usize = 128 * 1024;

/// The longest grace a [`Request::Cancel`] may ask for, seconds (an hour).
pub const MAX_CANCEL_GRACE_S: f64 = 3600.0;

/// Longest request or response line, bytes.
pub const MAX_FRAME: usize = 1 << 20;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
// Not `#[non_exhaustive]`: the daemon, in another crate, matches every request, so a new
// one does not compile until the daemon answers it.
pub enum Request {
    /// Queue a job.
    Submit(JobSpec),
    /// An overview of jobs and GPUs that always fits in a frame: see [`Response::Queue`].
    Queue,
    /// Jobs by id, by feed, or all of them, a page at a time ([`Response::Jobs`]): what
    /// `ladle queue --all` and a sweep following its runs ask.
    Jobs(JobQuery),
    /// Cancel a queued, held or running job.
    Cancel {
        /// Job id.
        id: JobId,
        /// Seconds a running job gets between SIGTERM and SIGKILL (time to checkpoint);
        /// `None`: `ladle_scheduler::daemon::CANCEL_GRACE`. At most [`MAX_CANCEL_GRACE_S`]. Since
        /// protocol version 5 (a sweep's `--stop-grace` was cut to 10 s before).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_s: Option<f64>,
    },
    /// Queue a held job (one a damaged journal line may concern: `JobState::Held`).
    Release {
        /// Job id.
        id: JobId,
    },
    /// Where a job's logs are, and their tails.
    Logs {
        /// Job id.
        id: JobId,
    },
    /// A producer feed announces itself (`ladle serve --name`, `ladle sweep`): jobs submitted
    /// with its name get its socket in `LADLE_SOCKET`.
    RegisterFeed(FeedSpec),
    /// The live feeds.
    Feeds,
}

/// A producer feed, as it registers with the scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedSpec {
    /// Its name (what `ladle submit --feed` names).
    pub name: String,
    /// Its control socket.
    pub socket: std::path::PathBuf,
    /// What it serves (the dataset's path), for `ladle queue` and for a sweep looking for a
    /// feed to reuse.
    pub dataset: String,
    /// How it transforms the samples (a description that is equal for equal transforms).
    #[serde(default)]
    pub transform: String,
    /// Its decode threads.
    pub threads: u32,
    /// The process serving it: the feed lives as long as that process.
    pub pid: u32,
    /// Bytes of shared memory its ring holds (host memory admission counts them).
    #[serde(default)]
    pub ring_bytes: u64,
}

/// Host memory as admission counts it, MiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMem {
    /// What admission shares (`ladle scheduler --host-mem`, default 90% of this machine's or
    /// its cgroup's limit).
    pub total_mib: u64,
    /// Live feeds' rings.
    pub rings_mib: u64,
    /// The decoded-sample cache's budget, while its keeper runs.
    pub cache_mib: u64,
    /// Running jobs that state `host_mem_mib`.
    pub jobs_mib: u64,
}

impl HostMem {
    /// What rings, the cache and jobs take together.
    pub fn busy_mib(&self) -> u64 {
        self.rings_mib
            .saturating_add(self.cache_mib)
            .saturating_add(self.jobs_mib)
    }

    /// What is left.
    pub fn free_mib(&self) -> u64 {
        self.total_mib.saturating_sub(self.busy_mib())
    }
}

/// Longest feed name.
pub const MAX_FEED_NAME: usize = 128;

/// Which jobs a [`Request::Jobs`] asks for: those that match every filter given, by id
/// ascending, from after `after`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobQuery {
    /// Only these jobs (at most [`MAX_QUERY_IDS`]); empty: any job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<JobId>,
    /// Only jobs submitted with this feed (`submit --feed`; a sweep's runs carry its feed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feed: Option<String>,
    /// Only jobs with a greater id: the previous page's [`Response::Jobs`] `next`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<JobId>,
}

/// Most ids one [`JobQuery`] names (so that the ids an answer reports unknown fit too).
pub const MAX_QUERY_IDS: usize = 4096;

/// Finished jobs the `Queue` overview lists, the latest first after every running and
/// queued one.
pub const QUEUE_FINISHED: usize = 100;

/// Longest error message an answer carries, bytes (longer ones are cut, saying so).
pub const MAX_MESSAGE: usize = 4096;

impl Request {
    /// Checks what a well-formed request asks for.
    ///
    /// # Errors
    /// [`RequestError::GpuMemoryOutOfRange`] for a submit stating more than
    /// [`MAX_MIB`] of device memory per GPU.
    pub fn validate(&self) -> Result<(), RequestError> {
        match self {
            Self::Submit(JobSpec {
                gpu_mem_mib: Some(mib),
                ..
            }) if *mib > MAX_MIB => Err(RequestError::GpuMemoryOutOfRange { mib: *mib }),
            Self::RegisterFeed(FeedSpec { name, .. }) => {
                if !is_plain_name(name) {
                    return Err(RequestError::BadFeedName { name: name.clone() });
                }
                Ok(())
            }
            Self::Submit(JobSpec {
                family: Some(name), ..
            }) if !is_plain_name(name) => Err(RequestError::BadFamily { name: name.clone() }),
            Self::Jobs(JobQuery { ids, .. }) if ids.len() > MAX_QUERY_IDS => {
                Err(RequestError::TooManyIds { ids: ids.len() })
            }
            Self::Submit(JobSpec { env, .. }) => {
                for (name, value) in env {
                    if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                        return Err(RequestError::BadEnvironment { name: name.clone() });
                    }
                }
                let bytes: usize = env.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
                if bytes > MAX_ENV_BYTES {
                    return Err(RequestError::EnvironmentTooLarge { bytes });
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// A feed or family name: 1 to [`MAX_FEED_NAME`] characters, none a control character.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name.chars().count() <= MAX_FEED_NAME && !name.chars().any(char::is_control)
}

/// A well-formed request that asks for something no scheduler can give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// A submit states more device memory per GPU than [`MAX_MIB`] (16 TiB).
    #[error(
        "gpu_mem_mib {mib} is out of range: a job may state at most {MAX_MIB} MiB (16 TiB) per GPU"
    )]
    GpuMemoryOutOfRange {
        /// The memory stated, MiB.
        mib: u64,
    },
    /// A `--family` that is empty, longer than [`MAX_FEED_NAME`] characters or holds a
    /// control character.
    #[error(
        "family {name:?}: a family is 1 to {MAX_FEED_NAME} characters, none a control character"
    )]
    BadFamily {
        /// The name given.
        name: String,
    },
    /// An environment variable whose name is empty or holds `=` or NUL, or whose value
    /// holds NUL: no process can be given it.
    #[error(
        "environment variable {name:?}: a name must be non-empty without '=' or NUL, a value without NUL"
    )]
    BadEnvironment {
        /// The variable's name.
        name: String,
    },
    /// A submit's environment is larger than [`MAX_ENV_BYTES`].
    #[error(
        "the job's environment is {bytes} bytes, more than the {MAX_ENV_BYTES} a job may carry: \
         submit with --export NONE or --export VAR,… (the names it needs)"
    )]
    EnvironmentTooLarge {
        /// Its size.
        bytes: usize,
    },
    /// A feed name that is empty, longer than [`MAX_FEED_NAME`] characters, or holds control
    /// characters.
    #[error("feed name {name:?}: 1 to 128 characters, no control characters")]
    BadFeedName {
        /// The name.
        name: String,
    },
    /// A [`JobQuery`] naming more than [`MAX_QUERY_IDS`] jobs.
    #[error("the query names {ids} jobs; ask for at most {MAX_QUERY_IDS} at a time")]
    TooManyIds {
        /// How many it names.
        ids: usize,
    },
}

/// One job as `ladle queue` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// Job id.
    pub id: JobId,
    /// What was asked.
    pub spec: JobSpec,
    /// Where it stands.
    #[serde(flatten)]
    pub state: JobState,
    /// Current memory estimate per GPU, MiB.
    pub estimate_mib: u64,
    /// Where the estimate comes from (declared, measured, or a guess that limits nothing).
    #[serde(default)]
    pub basis: Basis,
    /// The family its measured memory is learned under.
    #[serde(default)]
    pub family: String,
    /// Whether its current attempt's peak has been measured.
    #[serde(default)]
    pub measured: bool,
    /// Whether it must run alone (out-of-memory retry).
    pub exclusive: bool,
    /// Attempts started so far.
    pub attempts: u32,
    /// Out-of-memory retries so far.
    pub oom_retries: u32,
    /// Highest device memory observed per GPU, MiB.
    pub peak_mib: Option<u64>,
    /// CPU seconds of its ended attempts (user + system, with the children each waited
    /// for) that the scheduler reaped itself (not one that ended while it was down, nor a
    /// command its wrapper could not reap because the group was killed): a sweep's cost
    /// report reads its runs' CPU here.
    #[serde(default)]
    pub cpu_s: Option<f64>,
    /// Submission time, Unix seconds.
    pub submitted_at: f64,
}

/// One GPU as `ladle queue` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// The GPU.
    #[serde(flatten)]
    pub info: GpuInfo,
    /// Memory in use by the latest sample, MiB.
    pub memory_used_mib: u64,
    /// SM activity risk score.
    pub sm_activity_risk: f64,
    /// NVML utilisation by the latest sample (0 – 1).
    #[serde(default)]
    pub utilization: f64,
    /// SM activity by the latest sample (0 – 1), where the GPU exposes it (GPM).
    #[serde(default)]
    pub sm_activity: Option<f64>,
    /// The scheduler's jobs on it.
    pub jobs: u32,
    /// Its telemetry windows hold a full 30 samples: until then (after a start or restart)
    /// it takes no collocated job.
    #[serde(default)]
    pub window_full: bool,
}

/// One attempt's log files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptLogs {
    /// Attempt number.
    pub attempt: u32,
    /// Its stdout file.
    pub stdout_path: PathBuf,
    /// Its stderr file.
    pub stderr_path: PathBuf,
    /// The last [`LOG_TAIL`] bytes of stdout.
    pub stdout: String,
    /// The last [`LOG_TAIL`] bytes of stderr.
    pub stderr: String,
}

/// How much of each log `logs` returns, bytes.
pub const LOG_TAIL: usize = 64 * 1024;

/// Every job the daemon knows, counted by state: what the `Queue` overview says of the jobs
/// it does not list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTotals {
    /// Waiting (every job that is neither running nor final).
    pub queued: u64,
    /// Running or being started.
    pub running: u64,
    /// Ended with status 0.
    pub succeeded: u64,
    /// Ended otherwise (and any other final state).
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Interrupted (gone while the daemon was down, or stopped with it).
    pub interrupted: u64,
    /// Attempts started, over every job.
    pub admissions: u64,
    /// Out-of-memory retries, over every job.
    pub oom_retries: u64,
}

/// What the daemon answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Response {
    /// The job is queued (and journaled).
    Submitted {
        /// Its id.
        id: JobId,
        /// The estimate it will be admitted with, MiB.
        estimate_mib: u64,
    },
    /// An overview of jobs and GPUs, bounded: every running job, then every queued one,
    /// then the latest [`QUEUE_FINISHED`] finished ones (newest first), as many of them as
    /// fit in a frame.
    Queue {
        /// Admission policy.
        policy: String,
        /// Running, queued, then the latest finished jobs.
        jobs: Vec<JobView>,
        /// Every GPU.
        gpus: Vec<GpuView>,
        /// Every job, counted by state.
        #[serde(default)]
        totals: JobTotals,
        /// Jobs the daemon knows that `jobs` leaves out (older finished ones; running or
        /// queued ones only when more than fit): [`Request::Jobs`] pages through them.
        #[serde(default)]
        omitted: u64,
        /// Admission rounds run with jobs queued since the daemon started: a queued job
        /// was considered (and left queued) in each one since it was submitted. A client
        /// can wait for rounds to pass rather than for a time.
        #[serde(default)]
        admission_rounds: u64,
        /// Why the daemon schedules these GPUs and no others (`CUDA_VISIBLE_DEVICES=2,3`,
        /// `SLURM_JOB_GPUS=1`, `--only-gpus 0`); `None`: every GPU of the machine. Since protocol
        /// version 6.
        #[serde(default)]
        gpus_from: Option<String>,
    },
    /// A page of the jobs a [`JobQuery`] asks for, by id ascending, as many as fit.
    Jobs {
        /// The jobs.
        jobs: Vec<JobView>,
        /// Ids the query names that the daemon does not know.
        #[serde(default)]
        unknown: Vec<JobId>,
        /// More jobs match: ask again with `after` set to this.
        #[serde(default)]
        next: Option<JobId>,
    },
    /// The job is cancelled (queued) or being stopped (running).
    Cancelled {
        /// Job id.
        id: JobId,
    },
    /// The held job is queued again.
    Released {
        /// Job id.
        id: JobId,
    },
    /// A job's logs.
    Logs {
        /// Job id.
        id: JobId,
        /// One entry per attempt, the latest as many as fit (tails cut from the front
        /// to fit, the latest attempt's last).
        attempts: Vec<AttemptLogs>,
        /// Older attempts left out for lack of room.
        #[serde(default)]
        omitted: u32,
    },
    /// The feed is registered.
    FeedRegistered {
        /// Its name.
        name: String,
    },
    /// The live feeds, and the cores admission shares between them and jobs.
    Feeds {
        /// Every live feed, by name.
        feeds: Vec<FeedSpec>,
        /// The cores admission shares.
        #[serde(default)]
        cpu_cores: u32,
        /// Of them, taken by live feeds' decode threads and running jobs that state `cpus`.
        #[serde(default)]
        cpus_busy: u32,
        /// Host memory admission shares, MiB, and what takes it now.
        #[serde(default)]
        host_mem: HostMem,
        /// Live feeds left out for lack of room.
        #[serde(default)]
        omitted: u32,
    },
    /// The request failed.
    Error {
        /// Why.
        message: String,
    },
}

/// What to check after an OS error on the scheduler's socket.
fn io_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            " (the socket, or a folder above it, belongs to another user: each user runs their \
             own scheduler)"
        }
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            " (is `ladle scheduler` running?)"
        }
        _ => "",
    }
}

#[derive(Serialize, Deserialize)]
struct Frame<T> {
    v: u32,
    #[serde(flatten)]
    body: T,
}

/// A request or response that could not be exchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Connecting, reading or writing failed.
    #[error("scheduler socket {path}: {source}{}", io_hint(source))]
    Io {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The line is not a frame of this protocol.
    #[error("bad frame: {0}")]
    BadFrame(String),
    /// The line is longer than [`MAX_FRAME`].
    #[error("frame longer than {MAX_FRAME} bytes")]
    Oversize,
    /// The peer speaks another version.
    #[error(
        "protocol version {0}, expected {VERSION} (the client and the scheduler are different ladle releases)"
    )]
    Version(u32),
    /// The connection closed before a full line.
    #[error("connection closed before a complete frame")]
    Closed,
    /// The request is well formed but asks for something impossible.
    #[error("invalid request: {0}")]
    Invalid(#[from] RequestError),
}

/// Reads one frame (a line) of at most [`MAX_FRAME`] bytes.
///
/// # Errors
/// [`ProtocolError`] for I/O failures, oversize or malformed frames and wrong versions.
pub fn read_frame<T: for<'de> Deserialize<'de>>(
    reader: impl Read,
    path: &Path,
) -> Result<T, ProtocolError> {
    let mut line = Vec::new();
    BufReader::new(reader.take(MAX_FRAME as u64 + 1))
        .read_until(b'\n', &mut line)
        .map_err(|source| ProtocolError::Io {
            path: path.to_owned(),
            source,
        })?;
    decode_frame(&line)
}

/// Decodes one frame: `line` as read, at most [`MAX_FRAME`] bytes ending in a newline.
///
/// # Errors
/// [`ProtocolError`] for oversize, incomplete or malformed frames and wrong versions.
pub fn decode_frame<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, ProtocolError> {
    if line.len() > MAX_FRAME {
        return Err(ProtocolError::Oversize);
    }
    if line.last() != Some(&b'\n') {
        return Err(ProtocolError::Closed);
    }
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| ProtocolError::BadFrame(e.to_string()))?;
    match value.get("v").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(VERSION) => {}
        Some(v) => return Err(ProtocolError::Version(v.min(u64::from(u32::MAX)) as u32)),
        None => return Err(ProtocolError::BadFrame("no version field `v`".to_owned())),
    }
    let frame: Frame<T> =
        serde_json::from_value(value).map_err(|e| ProtocolError::BadFrame(e.to_string()))?;
    Ok(frame.body)
}

/// Reads one request frame ([`read_frame`]) and checks it ([`Request::validate`]): what the
/// daemon does with every connection.
///
/// # Errors
/// [`ProtocolError`] as [`read_frame`], and [`ProtocolError::Invalid`] for a request that
/// fails [`Request::validate`].
pub fn read_request(reader: impl Read, path: &Path) -> Result<Request, ProtocolError> {
    let request: Request = read_frame(reader, path)?;
    request.validate()?;
    Ok(request)
}

/// [`decode_frame`] of a request, checked ([`Request::validate`]).
///
/// # Errors
/// As [`read_request`].
pub fn decode_request(line: &[u8]) -> Result<Request, ProtocolError> {
    let request: Request = decode_frame(line)?;
    request.validate()?;
    Ok(request)
}

/// One frame, its newline included: what [`write_frame`] writes.
///
/// # Errors
/// [`ProtocolError::BadFrame`] for a body JSON cannot hold.
pub fn encode_frame<T: Serialize>(body: &T) -> Result<Vec<u8>, ProtocolError> {
    let mut line = serde_json::to_vec(&Frame { v: VERSION, body })
        .map_err(|e| ProtocolError::BadFrame(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

/// Writes one frame.
///
/// # Errors
/// [`ProtocolError::Io`].
pub fn write_frame<T: Serialize>(
    mut writer: impl Write,
    body: &T,
    path: &Path,
) -> Result<(), ProtocolError> {
    let line = encode_frame(body)?;
    writer
        .write_all(&line)
        .and_then(|()| writer.flush())
        .map_err(|source| ProtocolError::Io {
            path: path.to_owned(),
            source,
        })
}

/// Sends one request to the daemon at `socket` and waits (at most `timeout`) for its answer.
///
/// # Errors
/// [`ProtocolError`] when the daemon cannot be reached or answers nonsense.
pub fn request(
    socket: &Path,
    request: &Request,
    timeout: Duration,
) -> Result<Response, ProtocolError> {
    let io = |source| ProtocolError::Io {
        path: socket.to_owned(),
        source,
    };
    let stream = UnixStream::connect(socket).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    // A daemon with too many connections answers why and closes without reading: the
    // answer is there to read even when the request could not be written.
    let wrote = write_frame(&stream, request, socket);
    match (read_frame(&stream, socket), wrote) {
        (Ok(answer), _) => Ok(answer),
        (Err(_), Err(e)) | (Err(e), Ok(())) => Err(e),
    }
}

#[cfg(test)]
mod tests;
