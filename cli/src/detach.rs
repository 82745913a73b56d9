//! Starting this command again as a process of its own (`--detach`): what `ladle serve
//! --registry --detach` and `ladle cache keep --detach` do, so that the process they start
//! outlives its starter.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;

/// Runs this command line again without `--detach`, in a session of its own, its stdin
/// closed and its stderr appended to `log`; returns the first line it prints on stdout
/// once `ready` accepts it (the process goes on, reparented when this one exits). A process
/// that exits or prints something else instead fails naming `what` and the end of `log`.
pub(crate) fn run_detached(
    what: &str,
    log: &Path,
    ready: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let argv: Vec<std::ffi::OsString> = crate::argv()
        .into_iter()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {what}'s log {}", log.display()))?;
    let exe = crate::self_exe()
        .with_context(|| format!("finding the ladle command to run {what} with"))?;
    let mut command = Command::new(&exe);
    command
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file);
    let mut child = ladle_os::proc::spawn_session(&mut command)
        .with_context(|| format!("starting {}", exe.display()))?;
    let stdout = child
        .stdout
        .take()
        .with_context(|| format!("{what}'s stdout"))?;
    let mut line = String::new();
    // It prints its line once it serves, or exits (EOF) if it cannot.
    let _ = std::io::BufReader::new(stdout).read_line(&mut line);
    if ready(line.trim()) {
        // Not waited for: it outlives this process, and is reparented when this one exits.
        drop(child);
        return Ok(line);
    }
    let status = child.wait().ok();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.trim_end().lines().collect();
    anyhow::bail!(
        "{what} did not start ({}); its log {} ends:\n{}",
        status.map_or_else(|| "still running".to_owned(), |s| s.to_string()),
        log.display(),
        tail[tail.len().saturating_sub(12)..].join("\n")
    )
}
