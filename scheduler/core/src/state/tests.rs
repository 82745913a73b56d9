use super::*;

fn spec(lr: &str, declared: Option<u64>) -> JobSpec {
    JobSpec {
        gpu_mem_mib: declared,
        ..JobSpec::new(
            ["python", "train.py", "--lr", lr]
                .map(str::to_owned)
                .to_vec(),
            "/".into(),
        )
    }
}

fn submitted(id: JobId, spec: JobSpec, estimate_mib: u64) -> Record {
    Record::Submitted {
        id,
        basis: Basis::Guess,
        spec,
        estimate_mib,
        at: 0.0,
    }
}

fn starting(id: JobId, attempt: u32) -> Record {
    Record::Starting {
        id,
        attempt,
        gpus: vec![0],
        limit_mib: None,
        estimate_mib: Some(4096),
        exclusive: false,
        until_measured: true,
    }
}

fn measured(id: JobId, attempt: u32, peak_mib: u64) -> Record {
    Record::Measured {
        id,
        attempt,
        peak_mib,
    }
}

#[test]
fn a_running_jobs_pid_is_its_attempts_and_its_state_is_derived_from_it() {
    let jobs = Jobs::fold(
        true,
        [
            submitted(1, spec("0.1", Some(1024)), 1024),
            starting(1, 1),
            Record::Started {
                id: 1,
                attempt: 1,
                pid: 4242,
                start_ticks: 7,
            },
        ],
    );
    let job = &jobs.jobs[&1];
    assert_eq!(job.attempt().unwrap().pid, Some(4242));
    assert_eq!(
        job.state(),
        JobState::Running {
            gpus: vec![0],
            pid: Some(4242),
            attempt: 1
        }
    );
    assert_eq!(job.estimate.basis, Basis::Declared);
    assert!(jobs.queue.is_empty());
    assert_eq!(jobs.next_id, 2);
}

#[test]
fn a_started_record_of_an_older_attempt_does_not_give_the_new_one_its_pid() {
    let jobs = Jobs::fold(
        true,
        [
            submitted(1, spec("0.1", None), 4096),
            starting(1, 2),
            Record::Started {
                id: 1,
                attempt: 1,
                pid: 99,
                start_ticks: 1,
            },
        ],
    );
    assert_eq!(jobs.jobs[&1].attempt().unwrap().pid, None);
}

#[test]
fn the_family_measured_once_gives_its_queued_guesses_the_measured_peak() {
    let jobs = Jobs::fold(
        true,
        [
            submitted(1, spec("0.1", None), 4096),
            submitted(2, spec("0.01", None), 4096),
            submitted(3, spec("0.001", Some(2000)), 2000),
            starting(1, 1),
            measured(1, 1, 12_000),
        ],
    );
    assert!(jobs.jobs[&1].measured);
    let second = jobs.current_estimate(&jobs.jobs[&2], 4096);
    assert_eq!(second.basis, Basis::Measured);
    assert_eq!(second.mib, 13_200, "1.1 × the measured peak");
    assert_eq!(
        jobs.current_estimate(&jobs.jobs[&3], 4096),
        Estimate {
            mib: 2000,
            basis: Basis::Declared
        },
        "a declared estimate is trusted (no declaration measured yet)"
    );
    // Without learned estimates the guess stays a guess.
    let unlearned = Jobs::fold(
        false,
        [
            submitted(1, spec("0.1", None), 4096),
            submitted(2, spec("0.01", None), 4096),
            starting(1, 1),
            measured(1, 1, 12_000),
        ],
    );
    assert_eq!(
        unlearned.current_estimate(&unlearned.jobs[&2], 4096).basis,
        Basis::Guess
    );
}

#[test]
fn an_out_of_memory_retry_goes_to_the_head_alone_and_may_take_neighbours_once_measured() {
    let mut jobs = Jobs::fold(
        true,
        [
            submitted(1, spec("0.1", None), 4096),
            submitted(2, spec("0.2", None), 4096),
            starting(1, 1),
            Record::Finished {
                id: 1,
                attempt: 1,
                outcome: Outcome::OutOfMemory,
                code: Some(1),
                peak_mib: Some(3900),
                reason: "oom".to_owned(),
                cpu_s: None,
            },
            Record::Requeued {
                id: 1,
                estimate_mib: 4290,
                basis: Some(Basis::Guess),
                exclusive: true,
                out_of_memory: true,
            },
        ],
    );
    assert_eq!(jobs.queue, [1, 2]);
    let job = &jobs.jobs[&1];
    assert!(job.exclusive);
    assert_eq!(job.oom_retries, 1);
    assert_eq!(
        jobs.current_estimate(&jobs.jobs[&2], 4096).basis,
        Basis::Guess,
        "a crashed attempt's peak teaches the family nothing"
    );
    assert_eq!(
        jobs.current_estimate(&jobs.jobs[&1], 4096).mib,
        4290,
        "a retry keeps its own estimate"
    );
    jobs.apply(starting(1, 2));
    jobs.apply(measured(1, 2, 9000));
    assert!(!jobs.jobs[&1].exclusive);
    assert_eq!(jobs.current_estimate(&jobs.jobs[&2], 4096).mib, 9900);
}

#[test]
fn records_about_unknown_jobs_or_other_attempts_change_nothing() {
    let before = Jobs::fold(true, [submitted(1, spec("0.1", None), 4096)]);
    let mut after = before.clone();
    after.apply(measured(1, 1, 5));
    after.apply(Record::Started {
        id: 7,
        attempt: 1,
        pid: 1,
        start_ticks: 1,
    });
    after.apply(Record::Cancelled { id: 9 });
    assert_eq!(before, after);
}

#[test]
fn a_finished_job_is_final_and_a_cancelled_queued_one_leaves_the_queue() {
    let jobs = Jobs::fold(
        true,
        [
            submitted(1, spec("0.1", None), 4096),
            submitted(2, spec("0.2", None), 4096),
            starting(1, 1),
            Record::Finished {
                id: 1,
                attempt: 1,
                outcome: Outcome::Succeeded,
                code: Some(0),
                peak_mib: Some(7000),
                reason: String::new(),
                cpu_s: None,
            },
            Record::Cancelled { id: 2 },
        ],
    );
    assert_eq!(jobs.jobs[&1].state(), JobState::Succeeded);
    assert_eq!(jobs.jobs[&2].state(), JobState::Cancelled);
    assert!(jobs.queue.is_empty());
    assert_eq!(jobs.families.peak("python train.py --lr *"), Some(7000));
}

#[test]
fn a_measured_job_that_declared_too_little_raises_what_later_declarations_count_for() {
    let jobs = Jobs::fold(
        true,
        [
            submitted(1, spec("0.1", Some(5000)), 5000),
            submitted(2, spec("0.2", Some(5000)), 5000),
            starting(1, 1),
            measured(1, 1, 10_000),
        ],
    );
    let second = jobs.current_estimate(&jobs.jobs[&2], 4096);
    assert_eq!(second.basis, Basis::Declared);
    assert_eq!(
        second.mib, 10_000,
        "declared 5000, and declarations run 2× short"
    );
}

#[test]
fn a_journal_from_before_placements_were_journaled_keeps_a_retry_alone() {
    let jobs = Jobs::fold(
        true,
        [
            submitted(1, spec("0.1", None), 4096),
            Record::Requeued {
                id: 1,
                estimate_mib: 6144,
                basis: None,
                exclusive: true,
                out_of_memory: true,
            },
            Record::Starting {
                id: 1,
                attempt: 2,
                gpus: vec![0],
                limit_mib: None,
                estimate_mib: None,
                exclusive: false,
                until_measured: false,
            },
        ],
    );
    let attempt = jobs.jobs[&1].attempt().unwrap();
    assert!(attempt.exclusive);
    assert_eq!(attempt.estimate_mib, 6144);
}
