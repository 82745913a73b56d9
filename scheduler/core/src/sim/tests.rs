use super::generate::{GenerateConfig, generate};
use super::*;
use crate::window::WINDOW;

fn job(id: &str, submit_s: f64, duration_s: f64, mem_mib: u64, sm: f64) -> TraceJob {
    TraceJob {
        id: id.to_owned(),
        submit_s,
        duration_s,
        mem_mib,
        sm_activity: sm,
        gpus: 1,
        ..TraceJob::default()
    }
}

fn run(name: &str, trace: &[TraceJob], config: &SimConfig) -> SimReport {
    simulate(trace, Policy::named(name).unwrap(), config).unwrap()
}

#[test]
fn a_lone_job_takes_its_solo_duration_at_its_power() {
    let config = SimConfig {
        gpus: 1,
        ..SimConfig::default()
    };
    let r = run("exclusive", &[job("a", 5.0, 100.0, 1000, 0.5)], &config);
    assert!((r.makespan_s - 100.0).abs() < 1e-6);
    assert!((r.mean_jct_s - 100.0).abs() < 1e-6);
    assert!((r.mean_gpu_util - 0.5).abs() < 1e-6);
    let watts = 60.0 + 340.0 * 0.5;
    assert!((r.energy_kwh - watts * 100.0 / 3.6e6).abs() < 1e-9);
}

#[test]
fn a_queue_order_decides_who_starts_first_and_must_rank_every_job() {
    // One GPU, exclusive: a (arrives first) and then b queue behind a running job.
    let trace = [
        job("busy", 0.0, 100.0, 1000, 0.5),
        job("a", 10.0, 50.0, 1000, 0.5),
        job("b", 20.0, 30.0, 1000, 0.5),
    ];
    let config = SimConfig {
        gpus: 1,
        ..SimConfig::default()
    };
    let started = |config: &SimConfig| {
        let (_, jobs) = simulate_jobs(&trace, Policy::exclusive(), config).unwrap();
        jobs.iter().map(|j| j.start_s.unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(started(&config), vec![0.0, 100.0, 150.0]);
    let reordered = SimConfig {
        queue_order: Some(vec![0, 2, 1]),
        ..config.clone()
    };
    assert_eq!(started(&reordered), vec![0.0, 130.0, 100.0]);
    let short = SimConfig {
        queue_order: Some(vec![0, 1]),
        ..config
    };
    assert_eq!(
        simulate(&trace, Policy::exclusive(), &short),
        Err(SimError::BadOrder { ranked: 2, jobs: 3 })
    );
}

#[test]
fn two_light_jobs_collocate_under_carma_and_queue_under_exclusive() {
    let config = SimConfig {
        gpus: 1,
        ..SimConfig::default()
    };
    let trace = [
        job("a", 0.0, 100.0, 1000, 0.3),
        job("b", 0.0, 100.0, 1000, 0.3),
    ];
    let exclusive = run("exclusive", &trace, &config);
    assert!((exclusive.makespan_s - 200.0).abs() < 1e-6);
    let carma = run("carma-most-free", &trace, &config);
    // b joins after the 20 s settle lock; both run at 1/1.05 speed while together.
    assert!(carma.makespan_s < 150.0, "{carma:?}");
    assert_eq!(carma.oom_crashes, 0);
}

#[test]
fn oversubscribed_sms_slow_every_job_down() {
    let config = SimConfig {
        gpus: 1,
        contention: 0.0,
        ..SimConfig::default()
    };
    let mut policy = Policy::named("carma-first-fit").unwrap();
    policy.settle_s = 0.0;
    policy.compute = None;
    let trace = [
        job("a", 0.0, 100.0, 1000, 0.8),
        job("b", 0.0, 100.0, 1000, 0.8),
    ];
    let r = simulate(&trace, policy, &config).unwrap();
    // a runs alone until the telemetry windows are full (30 samples, at 29 s: no
    // collocation before), then both share 1.6 of demand: a's last 71 s take 113.6 s,
    // then b's last 29 s run alone: 29 + 113.6 + 29 = 171.6 s.
    assert!((r.makespan_s - 171.6).abs() < 1.0, "{r:?}");
}

#[test]
fn underestimates_crash_out_of_memory_and_recover_exclusively() {
    let config = SimConfig {
        gpus: 1,
        estimate_scale: 0.25,
        ..SimConfig::default()
    };
    let trace = [
        job("big", 0.0, 1000.0, 30 * 1024, 0.3),
        job("late", 30.0, 1000.0, 20 * 1024, 0.3),
    ];
    // carma: late looks like 5 GiB, joins big, and the 50 GiB sum crashes it.
    let carma = run("carma-most-free", &trace, &config);
    assert!(carma.oom_crashes >= 1, "{carma:?}");
    assert_eq!(carma.failed_jobs, 0);
    // Both finish: the crashed one reruns alone after big.
    assert!(carma.makespan_s >= 2000.0);
    // ladle: big is measured at 30 s and shows 4 × what it declared, so late's
    // declaration is scaled by 4 too (20 GiB): it waits for big instead of crashing.
    let ladle = run("ladle", &trace, &config);
    assert_eq!((ladle.oom_crashes, ladle.failed_jobs), (0, 0), "{ladle:?}");
    assert!(
        ladle.makespan_s <= carma.makespan_s,
        "{ladle:?} vs {carma:?}"
    );
}

fn undeclared(id: &str, submit_s: f64, duration_s: f64, mem_mib: u64, sm: f64) -> TraceJob {
    TraceJob {
        declared: false,
        family: Some("sweep".to_owned()),
        ..job(id, submit_s, duration_s, mem_mib, sm)
    }
}

#[test]
fn a_job_without_a_declared_estimate_is_never_oom_killed_by_a_limit_from_the_default_guess() {
    // Needs 12 GiB, gets the 4 GiB guess: alone until measured, never capped by it.
    let config = SimConfig {
        gpus: 1,
        ..SimConfig::default()
    };
    let trace = [undeclared("a", 0.0, 600.0, 12 * 1024, 0.3)];
    let (r, jobs) = simulate_jobs(&trace, Policy::named("ladle").unwrap(), &config).unwrap();
    assert_eq!((r.oom_crashes, jobs[0].oom_crashes), (0, 0), "{r:?}");
    assert!((r.makespan_s - 600.0).abs() < 1e-6);
}

#[test]
fn the_familys_second_member_packs_after_the_first_is_measured() {
    let config = SimConfig {
        gpus: 1,
        gpu_mem_mib: 80 * 1024,
        ..SimConfig::default()
    };
    let trace = [
        undeclared("first", 0.0, 1800.0, 12 * 1024, 0.3),
        undeclared("second", 1.0, 1800.0, 12 * 1024, 0.3),
    ];
    let policy = Policy::named("ladle").unwrap();
    let measure_s = policy.measure_s;
    let (r, jobs) = simulate_jobs(&trace, policy, &config).unwrap();
    let (first, second) = (jobs[0].start_s.unwrap(), jobs[1].start_s.unwrap());
    assert!(second >= first + measure_s, "{jobs:?}");
    assert!(
        second < jobs[0].finish_s.unwrap(),
        "packed, not queued: {jobs:?}"
    );
    assert_eq!(r.oom_crashes, 0);
}

#[test]
fn an_oom_retry_asks_for_its_observed_peak_and_others_join_it_once_measured() {
    let config = SimConfig {
        gpus: 1,
        ..SimConfig::default()
    };
    // a declares nothing and is measured at 20 GiB (reserving 22). liar declares 5 GiB
    // and needs 25: beside a its limit (the 17.5 GiB of room) stops it at 17.5 GiB. Its
    // retry asks for 1.1 × 17.5 GiB, runs alone and uncapped after a, is measured at
    // 25 GiB, and only then c joins it.
    let trace = [
        TraceJob {
            declared: false,
            ..job("a", 0.0, 200.0, 20 * 1024, 0.3)
        },
        job("liar", 100.0, 1000.0, 25 * 1024, 0.3),
        job("c", 150.0, 300.0, 2 * 1024, 0.1),
    ];
    let mut config_liar = config.clone();
    config_liar.estimate_scale = 0.2; // 25 GiB declared as 5
    let (r, jobs) = simulate_jobs(&trace, Policy::named("ladle").unwrap(), &config_liar).unwrap();
    assert_eq!(jobs[1].oom_crashes, 1, "{jobs:?}");
    assert_eq!(r.failed_jobs, 0);
    let retry_start = jobs[1].start_s.unwrap();
    assert!(retry_start >= jobs[0].finish_s.unwrap(), "alone: {jobs:?}");
    let c_start = jobs[2].start_s.unwrap();
    assert!(c_start >= retry_start + Policy::MEASURE_S, "{jobs:?}");
    assert!(c_start < jobs[1].finish_s.unwrap(), "joined it: {jobs:?}");
}

#[test]
fn out_of_memory_retries_are_capped_with_a_final_failed_state() {
    // 50 GiB on a 40 GiB GPU crashes every time.
    let config = SimConfig {
        gpus: 1,
        ..SimConfig::default()
    };
    let trace = [job("huge", 0.0, 100.0, 50 * 1024, 0.3)];
    for name in ["carma-most-free", "ladle"] {
        let (r, jobs) = simulate_jobs(&trace, Policy::named(name).unwrap(), &config).unwrap();
        assert_eq!(r.oom_crashes, config.max_oom_retries + 1, "{name}");
        assert_eq!(r.failed_jobs, 1, "{name}");
        assert!(
            jobs[0].failed && jobs[0].finish_s.is_none(),
            "{name}: {jobs:?}"
        );
    }
}

#[test]
fn no_policy_beats_the_lower_bound() {
    for seed in 1..=3 {
        let trace = generate(&GenerateConfig {
            seed,
            ..GenerateConfig::default()
        });
        let config = SimConfig::default();
        let bound = LowerBound::of(&trace, &config);
        assert!(bound.bound_s() >= bound.latest_s.max(bound.sm_work_s));
        for name in Policy::NAMES {
            let r = run(name, &trace, &config);
            assert_eq!(r.lower_bound_s, bound.bound_s());
            assert!(r.makespan_s >= r.lower_bound_s - 1e-6, "{name}: {r:?}");
        }
    }
}

#[test]
fn honest_estimates_never_crash_out_of_memory() {
    let trace = generate(&GenerateConfig::default());
    for name in Policy::NAMES {
        let r = run(name, &trace, &SimConfig::default());
        assert_eq!(r.oom_crashes, 0, "{name}");
        assert_eq!(r.failed_jobs, 0, "{name}");
    }
}

#[test]
fn every_job_of_a_trace_completes_once_on_the_gpus_it_asked_for() {
    let trace = generate(&GenerateConfig::default());
    for name in Policy::NAMES {
        let (report, jobs) =
            simulate_jobs(&trace, Policy::named(name).unwrap(), &SimConfig::default()).unwrap();
        assert_eq!(jobs.len(), trace.len());
        for (o, j) in jobs.iter().zip(&trace) {
            let (start, finish) = (o.start_s.unwrap(), o.finish_s.unwrap());
            assert!(
                start >= j.submit_s && finish >= start + j.duration_s - 1e-6,
                "{o:?}"
            );
            assert_eq!(o.gpus.len(), j.gpus as usize);
        }
        let last = jobs.iter().filter_map(|o| o.finish_s).fold(0.0, f64::max);
        assert!((report.makespan_s - (last - trace[0].submit_s)).abs() < 1e-6);
    }
}

/// CARMA reports about 35 % shorter makespans than exclusive placement on its trace.
/// On this generated trace (seed 1, 60 jobs, 3 × 40 GiB) our model gives ladle 36 %;
/// seeds 1–10 give 19–41 % (see `benches/README.md`). This pins the seed-1 result.
#[test]
fn on_the_seed_1_trace_ladle_cuts_the_exclusive_makespan_by_over_a_third() {
    let trace = generate(&GenerateConfig::default());
    let config = SimConfig::default();
    let exclusive = run("exclusive", &trace, &config);
    let ladle = run("ladle", &trace, &config);
    let carma = run("carma-most-free", &trace, &config);
    assert!(
        ladle.makespan_s <= 0.65 * exclusive.makespan_s,
        "{ladle:?} vs {exclusive:?}"
    );
    assert!(
        ladle.mean_jct_s < carma.mean_jct_s,
        "{ladle:?} vs {carma:?}"
    );
    assert!(ladle.mean_gpu_util > exclusive.mean_gpu_util);
    assert_eq!(ladle.oom_crashes, 0);
}

#[test]
fn the_simulation_is_deterministic() {
    let trace = generate(&GenerateConfig::default());
    let a = run("ladle", &trace, &SimConfig::default());
    let b = run("ladle", &trace, &SimConfig::default());
    assert_eq!(a, b);
}

#[test]
fn too_wide_jobs_are_errors() {
    let mut wide = job("w", 0.0, 10.0, 10, 0.1);
    wide.gpus = 4;
    assert!(matches!(
        simulate(
            &[wide],
            Policy::named("ladle").unwrap(),
            &SimConfig::default()
        ),
        Err(SimError::TooWide { .. })
    ));
}

/// Runs `f` on a thread and fails the test if it has not returned within two minutes:
/// a watchdog for an event loop that spins, not a measure of speed.
fn unless_it_spins<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(x) => x,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the simulation did not end in two minutes: its event loop spins")
        }
        Err(e) => panic!("the simulation panicked: {e}"),
    }
}

#[test]
fn a_submit_time_of_1e300_is_refused_before_the_event_loop_starts() {
    let trace = vec![
        job("a", 0.0, 100.0, 1000, 0.5),
        job("far", 1e300, 100.0, 1000, 0.5),
    ];
    let result = unless_it_spins(move || {
        simulate(
            &trace,
            Policy::named("ladle").unwrap(),
            &SimConfig::default(),
        )
    });
    match result {
        Err(SimError::BadJob(JobError::SubmitOutOfRange { job, value })) => {
            assert_eq!((job.as_str(), value), ("far", 1e300));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_job_of_a_billion_seconds_takes_as_few_steps_as_a_job_of_a_hundred() {
    let steps = |duration_s: f64| {
        let trace = vec![
            job("long", 0.0, duration_s, 1000, 0.5),
            job("late", 50.0, 100.0, 39 * 1024, 0.5),
        ];
        unless_it_spins(move || {
            let config = SimConfig {
                gpus: 1,
                ..SimConfig::default()
            };
            let (report, outcomes, steps) = replay(
                &trace,
                Policy::named("ladle").unwrap(),
                &config,
                Quiet::Skip,
            )
            .unwrap();
            // `late` cannot join (39 GiB): it waits for `long` to end.
            assert_eq!(outcomes[1].start_s, outcomes[0].finish_s);
            assert!((report.makespan_s - (duration_s + 100.0)).abs() < 1e-3);
            steps
        })
    };
    let short = steps(100.0);
    for duration_s in [1e6, MAX_DURATION_S] {
        let long = steps(duration_s);
        assert!(
            long <= short + 2 * WINDOW as u64,
            "{duration_s} s: {long} steps, 100 s: {short} steps"
        );
    }
}

#[test]
fn skipping_quiet_stretches_gives_the_results_of_ticking_through_them() {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(1.0);
    let same_time = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => close(a, b),
        (a, b) => a == b,
    };
    for (seed, mean_gap_s, estimate_scale) in [(1, 60.0, 1.0), (2, 600.0, 0.5), (3, 5.0, 0.7)] {
        let trace = generate(&GenerateConfig {
            jobs: 40,
            seed,
            mean_gap_s,
        });
        let config = SimConfig {
            estimate_scale,
            ..SimConfig::default()
        };
        for name in Policy::NAMES {
            let policy = || Policy::named(name).unwrap();
            let (fast, fast_jobs, fast_steps) =
                replay(&trace, policy(), &config, Quiet::Skip).unwrap();
            let (slow, slow_jobs, slow_steps) =
                replay(&trace, policy(), &config, Quiet::TickThrough).unwrap();
            let what = format!("seed {seed}, {name}");
            assert!(
                fast_steps < slow_steps,
                "{what}: {fast_steps} vs {slow_steps}"
            );
            assert_eq!(
                (fast.oom_crashes, fast.failed_jobs),
                (slow.oom_crashes, slow.failed_jobs),
                "{what}"
            );
            for (a, b) in [
                (fast.makespan_s, slow.makespan_s),
                (fast.mean_jct_s, slow.mean_jct_s),
                (fast.mean_gpu_util, slow.mean_gpu_util),
                (fast.energy_kwh, slow.energy_kwh),
            ] {
                assert!(close(a, b), "{what}: {fast:?} vs {slow:?}");
            }
            for (a, b) in fast_jobs.iter().zip(&slow_jobs) {
                assert!(
                    same_time(a.start_s, b.start_s)
                        && same_time(a.finish_s, b.finish_s)
                        && (&a.gpus, a.oom_crashes) == (&b.gpus, b.oom_crashes),
                    "{what}: {a:?} vs {b:?}"
                );
            }
        }
    }
}

#[test]
fn a_queue_that_can_never_start_is_reported_not_ticked_on_forever() {
    let trace = vec![job("a", 0.0, 10.0, 100, 0.1)];
    let result = unless_it_spins(move || {
        let mut policy = Policy::named("ladle").unwrap();
        policy.max_clients = 0;
        simulate(&trace, policy, &SimConfig::default())
    });
    assert!(
        matches!(result, Err(SimError::Stalled { queued: 1, .. })),
        "{result:?}"
    );
}

#[test]
fn settings_that_would_stop_the_clock_are_refused() {
    let trace = vec![job("a", 0.0, 10.0, 100, 0.1)];
    let result = unless_it_spins(move || {
        let config = SimConfig {
            tick_s: 0.0,
            ..SimConfig::default()
        };
        simulate(&trace, Policy::named("ladle").unwrap(), &config)
    });
    assert!(
        matches!(result, Err(SimError::BadSetting { name: "tick_s", .. })),
        "{result:?}"
    );
    let mut policy = Policy::named("ladle").unwrap();
    policy.settle_s = f64::INFINITY;
    let result = simulate(
        &[job("a", 0.0, 10.0, 100, 0.1)],
        policy,
        &SimConfig::default(),
    );
    assert!(
        matches!(
            result,
            Err(SimError::BadSetting {
                name: "settle_s",
                ..
            })
        ),
        "{result:?}"
    );
}
