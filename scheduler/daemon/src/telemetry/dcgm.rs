//! DCGM profiling metrics for GPUs without GPM (A100, L40, …): SM activity (field 1002,
//! `DCGM_FI_PROF_SM_ACTIVE`), SM occupancy (1003, `DCGM_FI_PROF_SM_OCCUPANCY`) and DRAM
//! activity (1005, `DCGM_FI_PROF_DRAM_ACTIVE`), streamed by a `dcgmi dmon -e 1002,1003,1005
//! -d 1000` child process and parsed line by line on a reader thread.
//!
//! `dcgmi dmon` prints a header, a units line, then one row per GPU per interval (format from
//! DCGM's `dcgmi/DeviceMonitor.cpp`; the header comes again every 14 intervals):
//!
//! ```text
//! #Entity   SMACT         SMOCC         DRAMA
//! ID
//! GPU 0     0.812         0.503         0.421
//! GPU 1     N/A           N/A           N/A
//! ```
//!
//! Values are fractions with three decimals; `N/A` is a blank value. The parser takes the
//! columns by the header's short names (`SMACT`, `SMOCC`, `DRAMA`), ignores lines it does
//! not understand (error messages, MIG rows `GPU-I`/`GPU-CI`, a stray byte), and never
//! panics. A `dcgmi` that exits (no host engine, profiling unsupported, killed) makes every
//! later [`DcgmMonitor::reading`] a [`DcgmError::Exited`] with what it wrote to stderr, and
//! a row older than the staleness limit is [`DcgmError::Stale`]: the GPU's compute screen is
//! then degraded for that sample, never stalled on old values.
//!
//! DCGM numbers GPUs by its own GPU id, which is NVML's index on the machines DCGM documents;
//! that they agree is one of the checks that need a real GPU ([`super`]).

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The DCGM field ids read: SM active, SM occupancy, DRAM active.
pub const FIELDS: &str = "1002,1003,1005";

/// Longest line kept; a longer one is cut (and then not understood).
const MAX_LINE: usize = 4096;
/// Lines of `dcgmi`'s stderr kept for the error message.
const STDERR_LINES: usize = 8;

/// How to run `dcgmi`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmConfig {
    /// The `dcgmi` program (a path; tests give a fake one).
    pub program: PathBuf,
    /// The sampling interval passed as `-d`.
    pub interval: Duration,
    /// How long [`DcgmMonitor::spawn`] waits for the first row.
    pub startup_timeout: Duration,
    /// A GPU's latest row older than this is stale.
    pub stale_after: Duration,
}

impl DcgmConfig {
    /// `program` sampled every second, 10 s to start, stale after 5 s.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            interval: Duration::from_secs(1),
            startup_timeout: Duration::from_secs(10),
            stale_after: Duration::from_secs(5),
        }
    }
}

/// One GPU's latest DCGM reading, as fractions 0 – 1; `None` where DCGM printed `N/A`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DcgmReading {
    /// SM activity (field 1002).
    pub sm_activity: Option<f64>,
    /// SM occupancy (field 1003).
    pub sm_occupancy: Option<f64>,
    /// DRAM activity (field 1005).
    pub dram_active: Option<f64>,
}

/// DCGM could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DcgmError {
    /// The program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `dcgmi dmon` exited (no host engine, profiling not supported, killed).
    #[error("{program} dmon exited ({status}): {stderr}")]
    Exited {
        /// The program.
        program: PathBuf,
        /// Its exit status, in words.
        status: String,
        /// The last lines it wrote to stderr (or stdout lines it did not understand).
        stderr: String,
    },
    /// No row came within the startup timeout.
    #[error("{program} dmon printed no GPU row within {waited_ms} ms")]
    Startup {
        /// The program.
        program: PathBuf,
        /// How long it waited.
        waited_ms: u64,
    },
    /// `dcgmi` has printed no row for this GPU.
    #[error("DCGM has reported nothing for GPU {gpu}")]
    NoData {
        /// The GPU (DCGM id = NVML index).
        gpu: u32,
    },
    /// The GPU's latest row is too old.
    #[error("DCGM's latest row for GPU {gpu} is {age_ms} ms old")]
    Stale {
        /// The GPU.
        gpu: u32,
        /// Its age.
        age_ms: u64,
    },
}

/// The entity a `dcgmi dmon` row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmonEntity {
    /// A whole GPU, by DCGM id.
    Gpu(u32),
    /// Anything else (`GPU-I`, `GPU-CI`, `vGPU`, `Switch`).
    Other,
}

/// One line of `dcgmi dmon` output.
#[derive(Debug, Clone, PartialEq)]
pub enum DmonLine {
    /// `#Entity SMACT SMOCC DRAMA`: the columns' short names.
    Header(Vec<String>),
    /// `ID` and the units.
    Units,
    /// A row: the entity and its values (`None` for `N/A` or an impossible value).
    Row {
        /// The entity.
        entity: DmonEntity,
        /// One value per column.
        values: Vec<Option<f64>>,
    },
    /// Anything else.
    Other,
}

/// Parses one line of `dcgmi dmon` output. Never panics.
pub fn parse_dmon_line(line: &str) -> DmonLine {
    let mut tokens = line.split_whitespace();
    let Some(first) = tokens.next() else {
        return DmonLine::Other;
    };
    if first == "#Entity" || (first == "#" && line.contains("Entity")) {
        let names = tokens.filter(|t| *t != "Entity").map(str::to_owned);
        return DmonLine::Header(names.collect());
    }
    if first == "ID" {
        return DmonLine::Units;
    }
    let entity = match first {
        "GPU" => DmonEntity::Gpu(0),
        "GPU-I" | "GPU-CI" | "vGPU" | "Switch" => DmonEntity::Other,
        _ => return DmonLine::Other,
    };
    let Some(id) = tokens.next().and_then(|t| t.parse::<u32>().ok()) else {
        return DmonLine::Other;
    };
    let entity = match entity {
        DmonEntity::Gpu(_) => DmonEntity::Gpu(id),
        other => other,
    };
    let mut values = Vec::new();
    for token in tokens {
        if token == "N/A" {
            values.push(None);
            continue;
        }
        match token.parse::<f64>() {
            Ok(x) if x.is_finite() && (0.0..=1.0 + 1e-9).contains(&x) => {
                values.push(Some(x.min(1.0)));
            }
            // A profiling ratio outside 0 – 1 is not a reading.
            Ok(_) => values.push(None),
            Err(_) => return DmonLine::Other,
        }
    }
    if values.is_empty() {
        return DmonLine::Other;
    }
    DmonLine::Row { entity, values }
}

/// Reads the three metrics from a row by the header's column names (`SMACT`, `SMOCC`,
/// `DRAMA`), or by the order of [`FIELDS`] before any header; `None` when the row does not
/// fit the header.
fn reading_from(header: Option<&[String]>, values: &[Option<f64>]) -> Option<DcgmReading> {
    let column = |name: &str, position: usize| -> Option<usize> {
        match header {
            Some(h) => h.iter().position(|c| c == name),
            None => Some(position),
        }
    };
    if let Some(h) = header
        && h.len() != values.len()
    {
        return None;
    }
    let value = |name, position| column(name, position).and_then(|i| values.get(i).copied()?);
    Some(DcgmReading {
        sm_activity: value("SMACT", 0),
        sm_occupancy: value("SMOCC", 1),
        dram_active: value("DRAMA", 2),
    })
}

#[derive(Debug, Default)]
struct Shared {
    latest: BTreeMap<u32, (DcgmReading, Instant)>,
    /// Lines of stdout that were not understood, latest last (for the error message).
    not_understood: VecDeque<String>,
    stderr: VecDeque<String>,
    rows: u64,
}

fn remember(lines: &mut VecDeque<String>, line: &str) {
    if lines.len() == STDERR_LINES {
        lines.pop_front();
    }
    lines.push_back(line.trim().to_owned());
}

/// Reads lines of at most [`MAX_LINE`] bytes (lossy UTF-8) from `reader`, calling `each`.
fn for_each_line(reader: impl Read, mut each: impl FnMut(&str)) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut cut = false;
        loop {
            let buf = match reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if buf.is_empty() {
                if !line.is_empty() {
                    each(&String::from_utf8_lossy(&line));
                }
                return;
            }
            let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            let room = MAX_LINE.saturating_sub(line.len());
            cut |= chunk.len() > room;
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let consumed = done.unwrap_or(buf.len());
            reader.consume(consumed);
            if done.is_some() {
                break;
            }
        }
        if cut {
            each("");
        } else {
            each(&String::from_utf8_lossy(&line));
        }
    }
}

/// A running `dcgmi dmon`, its rows parsed on a reader thread.
#[derive(Debug)]
pub struct DcgmMonitor {
    program: PathBuf,
    child: Child,
    shared: Arc<Mutex<Shared>>,
    stale_after: Duration,
    exited: Option<String>,
}

impl DcgmMonitor {
    /// Starts `program dmon -e 1002,1003,1005 -d <interval ms>` and waits until it prints a
    /// GPU row.
    ///
    /// # Errors
    /// [`DcgmError::Spawn`] when it cannot run, [`DcgmError::Exited`] when it exits first
    /// (no host engine, profiling unsupported), [`DcgmError::Startup`] when no row comes in
    /// time (the child is killed).
    pub fn spawn(config: &DcgmConfig) -> Result<Self, DcgmError> {
        let interval_ms = config.interval.as_millis().clamp(1, u128::from(u32::MAX));
        let mut command = Command::new(&config.program);
        command
            .args(["dmon", "-e", FIELDS, "-d", &interval_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_retrying(&mut command).map_err(|source| DcgmError::Spawn {
            program: config.program.clone(),
            source,
        })?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        if let Some(stdout) = child.stdout.take() {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("ladle-dcgmi-out".to_owned())
                .spawn(move || {
                    let mut header: Option<Vec<String>> = None;
                    for_each_line(stdout, |line| {
                        let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                        match parse_dmon_line(line) {
                            DmonLine::Header(names) => header = Some(names),
                            DmonLine::Units => {}
                            DmonLine::Row {
                                entity: DmonEntity::Gpu(gpu),
                                values,
                            } => match reading_from(header.as_deref(), &values) {
                                Some(reading) => {
                                    s.latest.insert(gpu, (reading, Instant::now()));
                                    s.rows += 1;
                                }
                                None => remember(&mut s.not_understood, line),
                            },
                            DmonLine::Row { .. } => {}
                            DmonLine::Other => {
                                if !line.trim().is_empty() {
                                    remember(&mut s.not_understood, line);
                                }
                            }
                        }
                    });
                })
                .map_err(|source| DcgmError::Spawn {
                    program: config.program.clone(),
                    source,
                })?;
        }
        if let Some(stderr) = child.stderr.take() {
            let shared = Arc::clone(&shared);
            // If this thread cannot start, stderr is simply not reported.
            let _ = std::thread::Builder::new()
                .name("ladle-dcgmi-err".to_owned())
                .spawn(move || {
                    for_each_line(stderr, |line| {
                        if !line.trim().is_empty() {
                            let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                            remember(&mut s.stderr, line);
                        }
                    });
                });
        }
        let mut monitor = Self {
            program: config.program.clone(),
            child,
            shared,
            stale_after: config.stale_after,
            exited: None,
        };
        let started = Instant::now();
        loop {
            if monitor.lock().rows > 0 {
                return Ok(monitor);
            }
            if let Some(e) = monitor.exit_error() {
                return Err(e);
            }
            if started.elapsed() >= config.startup_timeout {
                return Err(DcgmError::Startup {
                    program: config.program.clone(),
                    waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The program this monitor runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`DcgmError::Exited`] once the child has exited (remembered from then on).
    fn exit_error(&mut self) -> Option<DcgmError> {
        if self.exited.is_none() {
            match self.child.try_wait() {
                Ok(Some(status)) => self.exited = Some(status.to_string()),
                Ok(None) => return None,
                Err(e) => self.exited = Some(format!("cannot wait for it: {e}")),
            }
            // Give the reader threads a moment to take the last lines.
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = self.exited.clone()?;
        let s = self.lock();
        let said: Vec<&str> = if s.stderr.is_empty() {
            s.not_understood.iter().map(String::as_str).collect()
        } else {
            s.stderr.iter().map(String::as_str).collect()
        };
        let stderr = if said.is_empty() {
            "(nothing on stderr)".to_owned()
        } else {
            said.join(" | ")
        };
        Some(DcgmError::Exited {
            program: self.program.clone(),
            status,
            stderr,
        })
    }

    /// GPU `gpu`'s latest reading.
    ///
    /// # Errors
    /// [`DcgmError::Exited`] once `dcgmi` has exited, [`DcgmError::NoData`] when it has
    /// printed no row for the GPU, [`DcgmError::Stale`] when the latest is too old.
    pub fn reading(&mut self, gpu: u32) -> Result<DcgmReading, DcgmError> {
        if let Some(e) = self.exit_error() {
            return Err(e);
        }
        let (reading, at) = *self
            .lock()
            .latest
            .get(&gpu)
            .ok_or(DcgmError::NoData { gpu })?;
        let age = at.elapsed();
        if age > self.stale_after {
            return Err(DcgmError::Stale {
                gpu,
                age_ms: u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
            });
        }
        Ok(reading)
    }

    /// The GPUs `dcgmi` has printed rows for.
    pub fn gpus(&self) -> Vec<u32> {
        self.lock().latest.keys().copied().collect()
    }
}

impl Drop for DcgmMonitor {
    fn drop(&mut self) {
        // Never panic in Drop: a child that is already gone is fine.
        if self.exited.is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Spawns `command`, retrying a few times on `ETXTBSY` (an executable another thread of this
/// process had open for writing while it forked: a fresh script in tests).
fn spawn_retrying(command: &mut Command) -> std::io::Result<Child> {
    const ETXTBSY: i32 = 26;
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real `dcgmi dmon -e 1002,1003,1005` output (format of DCGM's DeviceMonitor.cpp: the
    /// entity column 10 wide, each field its width + 6, padded by 2).
    const HEADER: &str = "#Entity   SMACT         SMOCC         DRAMA         ";
    const UNITS: &str = "ID                                                  ";

    #[test]
    fn the_header_units_and_gpu_rows_of_dmon_are_parsed() {
        assert_eq!(
            parse_dmon_line(HEADER),
            DmonLine::Header(vec!["SMACT".into(), "SMOCC".into(), "DRAMA".into()])
        );
        assert_eq!(parse_dmon_line(UNITS), DmonLine::Units);
        assert_eq!(
            parse_dmon_line("GPU 0     0.812         0.503         0.421         "),
            DmonLine::Row {
                entity: DmonEntity::Gpu(0),
                values: vec![Some(0.812), Some(0.503), Some(0.421)],
            }
        );
        assert_eq!(
            parse_dmon_line("GPU 3     N/A           N/A           N/A           "),
            DmonLine::Row {
                entity: DmonEntity::Gpu(3),
                values: vec![None, None, None],
            }
        );
    }

    #[test]
    fn garbage_and_error_lines_are_not_rows() {
        for line in [
            "",
            "   ",
            "Error setting watches. Result: -6: The third-party Profiling module returned an unrecoverable error",
            "Error: unable to establish a connection to the specified host: localhost",
            "dmon was stopped do to receiving a signal",
            "GPU",
            "GPU x 0.1",
            "GPU 0 0.5 banana",
            "GPU 0",
            "\u{fffd}\u{fffd}GPU 0 0.1",
        ] {
            assert_eq!(parse_dmon_line(line), DmonLine::Other, "{line:?}");
        }
        assert!(matches!(
            parse_dmon_line("GPU-I 1   0.100         0.100         0.100"),
            DmonLine::Row {
                entity: DmonEntity::Other,
                ..
            }
        ));
    }

    #[test]
    fn values_outside_zero_to_one_are_not_readings() {
        assert_eq!(
            parse_dmon_line("GPU 0 1.5 -0.1 0.2"),
            DmonLine::Row {
                entity: DmonEntity::Gpu(0),
                values: vec![None, None, Some(0.2)],
            }
        );
    }

    #[test]
    fn columns_are_taken_by_the_headers_names() {
        let header = vec!["DRAMA".to_owned(), "SMACT".to_owned(), "SMOCC".to_owned()];
        let reading = reading_from(Some(&header), &[Some(0.3), Some(0.9), None]).unwrap();
        assert_eq!(reading.sm_activity, Some(0.9));
        assert_eq!(reading.sm_occupancy, None);
        assert_eq!(reading.dram_active, Some(0.3));
        assert_eq!(reading_from(Some(&header), &[Some(0.3)]), None);
        let by_order = reading_from(None, &[Some(0.1), Some(0.2), Some(0.3)]).unwrap();
        assert_eq!(by_order.dram_active, Some(0.3));
    }

    #[test]
    fn long_lines_are_cut_and_invalid_utf8_is_read_lossily() {
        let mut input = vec![b'x'; MAX_LINE * 3];
        input.extend_from_slice(b"\nGPU 0 \xff\xfe 0.1\nGPU 1 0.5 0.5 0.5");
        let mut lines = Vec::new();
        for_each_line(&input[..], |l| lines.push(l.to_owned()));
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "");
        assert_eq!(parse_dmon_line(&lines[1]), DmonLine::Other);
        assert!(matches!(parse_dmon_line(&lines[2]), DmonLine::Row { .. }));
    }

    /// A fake `dcgmi` that prints `body` (a shell script fragment) as `dmon` would.
    fn fake_dcgmi(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("dcgmi");
        let script = format!(
            "#!/bin/sh\n[ \"$1\" = dmon ] || {{ echo \"usage: dcgmi dmon\" >&2; exit 2; }}\n{body}\n"
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// The body of a healthy fake: header, units, two GPUs every 50 ms.
    const HEALTHY: &str = "printf '#Entity   SMACT         SMOCC         DRAMA         \\n'
printf 'ID                                                  \\n'
while :; do
  printf 'GPU 0     0.812         0.503         0.421         \\n'
  printf 'GPU 1     N/A           N/A           N/A           \\n'
  printf 'garbage \\377 line\\n'
  sleep 0.05
done";

    fn quick(program: PathBuf) -> DcgmConfig {
        DcgmConfig {
            startup_timeout: Duration::from_secs(20),
            ..DcgmConfig::new(program)
        }
    }

    #[test]
    fn a_running_dcgmi_gives_each_gpus_latest_reading() {
        let dir = tempfile::tempdir().unwrap();
        let mut monitor = DcgmMonitor::spawn(&quick(fake_dcgmi(dir.path(), HEALTHY))).unwrap();
        let mut reading = monitor.reading(0);
        for _ in 0..100 {
            if reading.is_ok() && monitor.reading(1).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            reading = monitor.reading(0);
        }
        let reading = reading.unwrap();
        assert_eq!(reading.sm_activity, Some(0.812));
        assert_eq!(reading.sm_occupancy, Some(0.503));
        assert_eq!(reading.dram_active, Some(0.421));
        assert_eq!(monitor.reading(1).unwrap(), DcgmReading::default());
        assert!(matches!(
            monitor.reading(7),
            Err(DcgmError::NoData { gpu: 7 })
        ));
    }

    #[test]
    fn a_dcgmi_that_dies_is_a_typed_error_with_its_message() {
        let dir = tempfile::tempdir().unwrap();
        let body = "printf '#Entity   SMACT         SMOCC         DRAMA\\nID\\nGPU 0     0.5   0.5   0.5\\n'
sleep 0.3
echo 'Error: Lost connection to the host engine' >&2
exit 3";
        let mut monitor = DcgmMonitor::spawn(&quick(fake_dcgmi(dir.path(), body))).unwrap();
        let mut result = monitor.reading(0);
        for _ in 0..500 {
            if result.is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            result = monitor.reading(0);
        }
        match result {
            Err(DcgmError::Exited { status, stderr, .. }) => {
                assert!(status.contains('3'), "{status}");
                assert!(stderr.contains("Lost connection"), "{stderr}");
            }
            other => panic!("expected Exited, got {other:?}"),
        }
        // It stays dead.
        assert!(matches!(monitor.reading(0), Err(DcgmError::Exited { .. })));
    }

    #[test]
    fn a_dcgmi_without_a_host_engine_fails_to_start_with_its_message() {
        let dir = tempfile::tempdir().unwrap();
        let body =
            "echo 'Error: unable to establish a connection to the specified host: localhost' 
echo 'Error: Unable to connect to host engine. Host engine connection invalid/disconnected.' >&2
exit 1";
        match DcgmMonitor::spawn(&quick(fake_dcgmi(dir.path(), body))) {
            Err(DcgmError::Exited { stderr, .. }) => {
                assert!(stderr.contains("Unable to connect"), "{stderr}");
            }
            other => panic!("expected Exited, got {other:?}"),
        }
    }

    #[test]
    fn a_dcgmi_that_prints_only_garbage_times_out_at_startup() {
        let dir = tempfile::tempdir().unwrap();
        let body = "while :; do echo 'not a row'; sleep 0.05; done";
        let config = DcgmConfig {
            startup_timeout: Duration::from_millis(300),
            ..DcgmConfig::new(fake_dcgmi(dir.path(), body))
        };
        assert!(matches!(
            DcgmMonitor::spawn(&config),
            Err(DcgmError::Startup { .. })
        ));
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let config = DcgmConfig::new("/nonexistent/ladle-test/dcgmi");
        assert!(matches!(
            DcgmMonitor::spawn(&config),
            Err(DcgmError::Spawn { .. })
        ));
    }

    #[test]
    fn a_reading_goes_stale_when_rows_stop() {
        let dir = tempfile::tempdir().unwrap();
        let body = "printf '#Entity   SMACT         SMOCC         DRAMA\\nID\\nGPU 0     0.5   0.5   0.5\\n'
exec sleep 30";
        let config = DcgmConfig {
            stale_after: Duration::from_millis(100),
            ..quick(fake_dcgmi(dir.path(), body))
        };
        let mut monitor = DcgmMonitor::spawn(&config).unwrap();
        std::thread::sleep(Duration::from_millis(250));
        assert!(matches!(
            monitor.reading(0),
            Err(DcgmError::Stale { gpu: 0, .. })
        ));
    }
}
