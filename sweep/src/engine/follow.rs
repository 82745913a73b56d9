//! The sweep's runs: submitted as consumers of its feed, then followed through the scheduler
//! until each ends, each ended one recorded in the ledger.

use super::*;

/// What every run of a sweep shares: its feed, working directory and GPU needs.
pub(super) struct RunShape<'a> {
    pub(super) socket: &'a Path,
    pub(super) feed_name: &'a str,
    pub(super) cwd: &'a Path,
    pub(super) gpu_mem_mib: Option<u64>,
    pub(super) gpus_per_run: u32,
    pub(super) family: Option<&'a String>,
}

/// Submits each of `todo` to `scheduler` as a consumer of the sweep's feed, with the sweep's
/// environment; a refused submission cancels the ones before it (nothing of a sweep that
/// cannot be submitted whole is left to run).
pub(super) fn submit_runs(
    scheduler: &Scheduler,
    todo: Vec<PlannedRun>,
    shape: &RunShape<'_>,
    node: Option<&str>,
) -> Result<Vec<Run>, SweepError> {
    // Each run gets the sweep's own environment (its venv, PYTHONPATH, keys), whichever
    // scheduler starts it: a scheduler started earlier from another shell would otherwise
    // give it that shell's. (A variable that is not UTF-8 cannot cross the socket.)
    let sweep_env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(n, v)| Some((n.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let mut runs = Vec::new();
    for planned in todo {
        let mut env = sweep_env.clone();
        env.extend([
            ("LADLE_SOCKET".into(), shape.socket.display().to_string()),
            ("LADLE_RUN".into(), planned.name.clone()),
            (
                "LADLE_CONNECT_TIMEOUT".into(),
                RUN_CONNECT_TIMEOUT_S.to_string(),
            ),
        ]);
        let spec = JobSpec {
            command: planned.args.clone(),
            cwd: shape.cwd.to_owned(),
            gpu_mem_mib: shape.gpu_mem_mib,
            gpus: shape.gpus_per_run,
            feed: Some(shape.feed_name.to_owned()),
            thread_percentage: None,
            env,
            whole_env: true,
            cpus: None,
            host_mem_mib: None,
            family: shape.family.cloned(),
        };
        let id = match scheduler.request(
            &Request::Submit(spec),
            &format!("submitting {}", planned.name),
        ) {
            Ok(Response::Submitted { id, .. }) => id,
            failed => {
                // Nothing of a sweep that cannot be submitted whole is left to run.
                kill_runs(scheduler, &runs);
                return Err(failed.err().unwrap_or_else(|| SweepError::Scheduler {
                    socket: scheduler.socket.clone(),
                    what: format!("submitting {}", planned.name),
                    detail: "unexpected answer".into(),
                }));
            }
        };
        say(
            node,
            &format!("{}: job {id}: {}", planned.name, planned.args.join(" ")),
        );
        runs.push(Run::queued(planned.name, planned.args, id));
    }
    Ok(runs)
}

/// What [`follow`] follows the runs with.
pub(super) struct Following<'a> {
    pub(super) scheduler: &'a Scheduler,
    pub(super) ledger: &'a mut Ledger,
    pub(super) producer: Option<&'a Producer>,
    pub(super) feed_name: &'a str,
    pub(super) node: Option<&'a str>,
    pub(super) stop: &'a AtomicBool,
    pub(super) hurry: &'a AtomicBool,
    pub(super) stop_grace: Duration,
}

/// Follows `runs` through the scheduler until every one has ended (or, after a stop, until
/// their grace and the kill are over): each look records ended runs in the ledger, shows the
/// live table or a line per change, and on a stop cancels every run. Returns the ids whose
/// report the ledger has.
pub(super) fn follow(
    following: Following<'_>,
    runs: &mut [Run],
    mut live: Option<ShowProgress>,
) -> Result<BTreeSet<JobId>, SweepError> {
    let Following {
        scheduler,
        ledger,
        producer,
        feed_name,
        node,
        stop,
        hurry,
        stop_grace,
    } = following;
    let node_ref = node;
    let mut recorded = BTreeSet::new();
    let mut next_feed_line = Instant::now() + Duration::from_secs(10);
    let mut last_published = 0u64;
    let mut last_look = Instant::now();
    let mut queue_failures = 0u32;
    let mut cancelled_at: Option<Instant> = None;
    loop {
        let pending: Vec<JobId> = runs
            .iter()
            .filter(|r| r.ended.is_none())
            .map(|r| r.id)
            .collect();
        let jobs = match scheduler.jobs(&pending, "following the runs") {
            Ok(jobs) => {
                queue_failures = 0;
                jobs
            }
            failed => {
                // A scheduler that stops answering: a few more tries, then give up and leave
                // nothing running behind.
                queue_failures += 1;
                if queue_failures < QUEUE_TRIES {
                    std::thread::sleep(POLL);
                    continue;
                }
                kill_runs(scheduler, runs);
                return Err(failed.err().unwrap_or_else(|| SweepError::Scheduler {
                    socket: scheduler.socket.clone(),
                    what: "following the runs".into(),
                    detail: "unexpected answer to a jobs request".into(),
                }));
            }
        };
        let by_id: BTreeMap<JobId, _> = jobs.iter().map(|j| (j.id, j)).collect();
        for run in runs.iter_mut() {
            let Some(job) = by_id.get(&run.id) else {
                continue;
            };
            run.peak_mib = job.peak_mib;
            run.cpu_s = job.cpu_s;
            if let Some(line) = run.follow(&job.state)
                && live.is_none()
            {
                say(node_ref, &line);
            }
            if run.ended.is_some() && recorded.insert(run.id) {
                ledger.append(&run_report(scheduler, run, node_ref));
            }
        }
        if let Some(ShowProgress(show)) = &mut live {
            let seconds = last_look.elapsed().as_secs_f64().max(1e-3);
            last_look = Instant::now();
            let feed = match producer {
                Some(p) => {
                    let published = p.published();
                    let rate = published.saturating_sub(last_published) as f64 / seconds;
                    last_published = published;
                    let stats = p.consumer_stats();
                    let held = follow_consumers(runs, &stats, p.dataset_len(), seconds);
                    format!(
                        "feed {feed_name:?}: {published} samples decoded ({rate:.0}/s), {} bad{held}",
                        p.bad_samples()
                    )
                }
                None => format!("feed {feed_name:?} (reused)"),
            };
            show(&Progress {
                table: table(runs, Instant::now()),
                feed,
            });
        }
        if runs.iter().all(|r| r.ended.is_some()) {
            break;
        }
        if stop.load(Ordering::SeqCst) && cancelled_at.is_none() {
            say(node_ref, "stopping: cancelling every run");
            // The scheduler gives each run the sweep's grace before its SIGKILL (before
            // protocol version 5 its own 10 s cut a longer `--stop-grace` short).
            let grace_s = Some(stop_grace.as_secs_f64());
            for run in runs.iter().filter(|r| r.ended.is_none()) {
                let cancel = Request::Cancel {
                    id: run.id,
                    grace_s,
                };
                let _ = scheduler.request(&cancel, "cancelling");
            }
            cancelled_at = Some(Instant::now());
        }
        let overdue = cancelled_at.is_some_and(|at| at.elapsed() > stop_grace);
        if hurry.load(Ordering::SeqCst) || overdue {
            kill_runs(scheduler, runs);
            if cancelled_at.is_some_and(|at| at.elapsed() > stop_grace * 2 + POLL * 4) {
                break; // the scheduler does not see them end; give up waiting
            }
        }
        if live.is_none() && Instant::now() >= next_feed_line {
            next_feed_line += Duration::from_secs(10);
            let live = runs.iter().filter(|r| r.state == "running").count();
            say(
                node_ref,
                &match producer {
                    Some(p) => format!(
                        "feed: {} samples published, {} bad; {live} runs running",
                        p.published(),
                        p.bad_samples()
                    ),
                    None => format!("{live} runs running"),
                },
            );
        }
        std::thread::sleep(POLL);
    }
    Ok(recorded)
}

/// A run's line of the report, with its logs from the scheduler.
pub(super) fn run_report(scheduler: &Scheduler, run: &Run, node: Option<&str>) -> RunReport {
    let attempts = match scheduler.request(&Request::Logs { id: run.id }, "reading logs") {
        Ok(Response::Logs { attempts, .. }) => attempts,
        _ => Vec::new(),
    };
    let last = attempts.last();
    let exit_code = match run.state {
        "succeeded" => Some(0),
        _ => run
            .reason
            .as_deref()
            .and_then(|r| r.strip_prefix("exit code "))
            .and_then(|c| c.parse().ok()),
    };
    let last_lines = match last {
        Some(a) if exit_code != Some(0) => {
            let lines: Vec<&str> = a.stderr.lines().collect();
            lines[lines.len().saturating_sub(5)..]
                .iter()
                .map(|l| (*l).to_owned())
                .collect()
        }
        _ => Vec::new(),
    };
    RunReport {
        name: run.name.clone(),
        args: run.args.clone(),
        state: run.state.to_owned(),
        exit_code,
        reason: run.reason.clone(),
        log: last.map(|a| a.stdout_path.clone()),
        stderr_log: last.map(|a| a.stderr_path.clone()),
        seconds: run
            .started
            .zip(run.ended)
            .map(|(s, e)| e.duration_since(s).as_secs_f64()),
        gpu: run.gpus.clone(),
        last_lines,
        node: node.map(str::to_owned),
        cpu_seconds: run.cpu_s,
        attempts: Vec::new(),
    }
}
