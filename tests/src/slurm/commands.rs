//! Running Slurm's commands against the test cluster, bounded in time, and reading their
//! answers.

use super::*;

/// Cancels every job and waits until none is left (not even completing).
pub(super) fn cancel_all(conf: &Path, submit: &Path, timeout: Duration) -> Result<(), SlurmError> {
    let squeue = || -> Result<Vec<String>, SlurmError> {
        let done = run_bounded(
            slurm_command("squeue", conf, submit).args(["-h", "-o", "%i"]),
            COMMAND_TIMEOUT,
        )?;
        check("squeue -h -o %i", &done)?;
        Ok(done.stdout.split_whitespace().map(str::to_owned).collect())
    };
    let jobs = squeue()?;
    if jobs.is_empty() {
        return Ok(());
    }
    let done = run_bounded(
        slurm_command("scancel", conf, submit).args(&jobs),
        COMMAND_TIMEOUT,
    )?;
    // A job that ended meanwhile makes scancel complain: only the queue below counts.
    drop(done);
    let deadline = Instant::now() + timeout;
    loop {
        let left = squeue()?;
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SlurmError::Deadline {
                what: "the cancelled jobs leaving the queue".to_owned(),
                timeout,
                detail: format!("jobs {left:?} are still there"),
            });
        }
        std::thread::sleep(POLL);
    }
}

pub(super) fn node_states(
    conf: &Path,
    submit: &Path,
) -> Result<BTreeMap<String, String>, SlurmError> {
    let args = ["-h", "-N", "-o", "%N %t"];
    let done = run_bounded(
        slurm_command("sinfo", conf, submit).args(args),
        COMMAND_TIMEOUT,
    )?;
    check(&command_line("sinfo", &args), &done)?;
    done.stdout
        .lines()
        .map(|l| {
            l.split_once(' ')
                .map(|(n, s)| (n.to_owned(), s.trim().to_owned()))
                .ok_or_else(|| SlurmError::Unexpected {
                    command: command_line("sinfo", &args),
                    stdout: done.stdout.clone(),
                })
        })
        .collect()
}

pub(super) fn slurm_command(program: &str, conf: &Path, submit: &Path) -> Command {
    let mut command = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SLURM_") {
            command.env_remove(key);
        }
    }
    command.env("SLURM_CONF", conf).current_dir(submit);
    command
}

pub(super) fn check(command: &str, done: &Finished) -> Result<(), SlurmError> {
    if done.status.success() {
        Ok(())
    } else {
        Err(SlurmError::Failed {
            command: command.to_owned(),
            status: done.status,
            stdout: done.stdout.clone(),
            stderr: done.stderr.clone(),
        })
    }
}

/// Runs `command` in its own process group with its output collected; after `timeout`
/// sends SIGTERM to the group (an `srun` then gives its allocation back), waits 5 s, then
/// SIGKILL.
pub(super) fn run_bounded(
    command: &mut Command,
    timeout: Duration,
) -> Result<Finished, SlurmError> {
    let line = {
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        command_line(&command.get_program().to_string_lossy(), &args)
    };
    let mut proc = Proc::spawn(line.clone(), command).map_err(|source| SlurmError::Spawn {
        command: line.clone(),
        source,
    })?;
    if proc.wait_timeout(timeout).is_err() {
        let _ = proc.signal_group(Signal::TERM);
        if proc.wait_timeout(Duration::from_secs(5)).is_err() {
            proc.kill();
        }
        let out = proc.output().map_err(|source| SlurmError::Spawn {
            command: line.clone(),
            source,
        })?;
        return Err(SlurmError::Timeout {
            command: line,
            timeout,
            stdout: out.stdout,
            stderr: out.stderr,
        });
    }
    let out = proc.output().map_err(|source| SlurmError::Spawn {
        command: line,
        source,
    })?;
    Ok(out.into())
}

/// `program` and its arguments as one line, arguments with spaces quoted.
pub(super) fn command_line(program: &str, args: &[&str]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        line.push(' ');
        if arg.contains(char::is_whitespace) || arg.is_empty() {
            line.push_str(&format!("'{arg}'"));
        } else {
            line.push_str(arg);
        }
    }
    line
}

/// `scontrol show ... -o` output as a map: a word `Key=value` starts a field, a word without
/// `=` continues the previous value (values may hold spaces).
pub(super) fn parse_fields(line: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut last: Option<String> = None;
    for word in line.split(' ') {
        let key_value = word.split_once('=').filter(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '/' | '_' | '.'))
        });
        match (key_value, &last) {
            (Some((k, v)), _) => {
                fields.insert(k.to_owned(), v.to_owned());
                last = Some(k.to_owned());
            }
            (None, Some(k)) => {
                if let Some(value) = fields.get_mut(k) {
                    value.push(' ');
                    value.push_str(word);
                }
            }
            (None, None) => {}
        }
    }
    fields
}

/// Every live (not zombie) process, other than this one, with `SLURM_CONF=DIR/slurm.conf`
/// in its environment or `DIR/` on its command line: the processes of the cluster under
/// `dir`, with their command lines. Works after the cluster is gone (to check that nothing
/// of it is left).
pub fn processes_of(dir: &Path) -> Vec<(u32, String)> {
    let conf = format!("SLURM_CONF={}/slurm.conf", dir.display());
    let needle = format!("{}/", dir.display());
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let proc_dir = entry.path();
        let Ok(stat) = fs::read_to_string(proc_dir.join("stat")) else {
            continue;
        };
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        if matches!(state, Some("Z" | "X") | None) {
            continue;
        }
        let environ = fs::read(proc_dir.join("environ")).unwrap_or_default();
        let cmdline = fs::read(proc_dir.join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .trim()
            .to_owned();
        if environ.split(|b| *b == 0).any(|v| v == conf.as_bytes()) || cmdline.contains(&needle) {
            found.push((pid, cmdline));
        }
    }
    found.sort();
    found
}

/// The last lines of each daemon's log under `dir`.
pub(super) fn daemon_logs(dir: &Path) -> String {
    let mut text = String::new();
    let mut logs = vec![dir.join("ctld/slurmctld.log"), dir.join("munge/munged.log")];
    logs.extend(NODES.map(|n| dir.join(n).join("slurmd.log")));
    if let Ok(entries) = fs::read_dir(dir.join("logs")) {
        logs.extend(entries.flatten().map(|e| e.path()));
    }
    for log in logs {
        let Ok(content) = fs::read_to_string(&log) else {
            continue;
        };
        let lines: Vec<&str> = content.lines().collect();
        let tail = &lines[lines.len().saturating_sub(20)..];
        text.push_str(&format!("--- {} (last lines)\n", log.display()));
        for l in tail {
            text.push_str(l);
            text.push('\n');
        }
    }
    text
}
