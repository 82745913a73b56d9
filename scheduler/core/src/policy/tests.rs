use super::*;

const GIB: u64 = 1024;

fn gpus(n: usize) -> Vec<GpuState> {
    vec![
        GpuState {
            total_mib: 40 * GIB,
            ..GpuState::default()
        };
        n
    ]
}

/// A one-GPU job that declares `gib`.
fn job(id: u64, gib: u64) -> Pending {
    Pending {
        id,
        estimate_mib: gib * GIB,
        basis: Basis::Declared,
        gpus: 1,
        ..Pending::default()
    }
}

fn busy(g: &mut GpuState, used_gib: u64, smact: f64) {
    g.jobs += 1;
    g.used_mib += used_gib * GIB;
    g.reserved_mib += used_gib * GIB;
    g.risk = Risk {
        utilization: smact,
        sm_activity: smact,
        sm_occupancy: Some(smact * 0.5),
        dram_bandwidth: Some(smact * 0.45),
    };
}

fn admit(name: &str, queue: &[Pending], gpus: &mut [GpuState]) -> Vec<Placement> {
    Admission::new(Policy::named(name).unwrap()).admit(100.0, queue, gpus)
}

#[test]
fn every_named_policy_exists_and_unknown_names_are_errors() {
    for name in Policy::NAMES {
        assert_eq!(Policy::named(name).unwrap().name, name);
    }
    assert!(matches!(
        Policy::named("fastest"),
        Err(PolicyError::Unknown { .. })
    ));
}

#[test]
fn the_exclusive_baseline_runs_one_job_per_gpu_in_fifo_order() {
    let mut g = gpus(2);
    let queue = [job(1, 1), job(2, 1), job(3, 1)];
    let placed = admit("exclusive", &queue, &mut g);
    assert_eq!(placed.len(), 2);
    assert_eq!((placed[0].job, &placed[0].gpus), (1, &vec![0]));
    assert_eq!((placed[1].job, &placed[1].gpus), (2, &vec![1]));
    assert!(admit("exclusive", &queue[2..], &mut g).is_empty());
}

#[test]
fn carma_takes_an_idle_gpu_before_collocating() {
    let mut g = gpus(2);
    busy(&mut g[0], 4, 0.3);
    let placed = admit("carma-most-free", &[job(1, 1)], &mut g);
    assert_eq!(placed[0].gpus, vec![1]);
    assert!(!placed[0].exclusive);
}

#[test]
fn the_memory_screen_keeps_reserve_and_margin() {
    // 40 GiB − 20 GiB used = 20 GiB free; minus 0.5 GiB reserve = 19.5 GiB.
    for (estimate_mib, fits) in [(17 * GIB + 512, true), (17 * GIB + 513, false)] {
        let mut g = gpus(1);
        busy(&mut g[0], 20, 0.2);
        let queue = [Pending {
            estimate_mib,
            ..job(1, 0)
        }];
        assert_eq!(!admit("carma-first-fit", &queue, &mut g).is_empty(), fits);
    }
}

#[test]
fn the_compute_screen_rejects_a_saturated_gpu() {
    let mut g = gpus(1);
    busy(&mut g[0], 1, 0.95);
    assert!(admit("carma-most-free", &[job(1, 1)], &mut g).is_empty());
    let mut g = gpus(1);
    busy(&mut g[0], 1, 0.85); // smocc 0.425, dram 0.38: below both
    assert_eq!(admit("carma-most-free", &[job(1, 1)], &mut g).len(), 1);
}

#[test]
fn unknown_occupancy_counts_as_high_on_gpus_without_gpm() {
    let risk = Risk {
        sm_activity: 0.85,
        ..Risk::default()
    };
    assert!(!ComputeScreen::CARMA.passes(&risk));
    let risk = Risk {
        sm_activity: 0.5,
        ..Risk::default()
    };
    assert!(ComputeScreen::CARMA.passes(&risk));
}

#[test]
fn orderings_pick_different_gpus() {
    let mut base = gpus(3);
    busy(&mut base[0], 10, 0.5);
    busy(&mut base[1], 30, 0.1);
    busy(&mut base[2], 20, 0.3);
    let pick = |name: &str| admit(name, &[job(1, 1)], &mut base.clone())[0].gpus[0];
    assert_eq!(pick("carma-most-free"), 0);
    assert_eq!(pick("carma-least-util"), 1);
    assert_eq!(pick("carma-first-fit"), 0);
    assert_eq!(pick("carma-best-fit"), 1);
}

#[test]
fn a_dispatched_gpu_settles_before_taking_another_job() {
    let mut g = gpus(1);
    busy(&mut g[0], 1, 0.1);
    let mut engine = Admission::new(Policy::named("carma-first-fit").unwrap());
    assert_eq!(engine.admit(0.0, &[job(1, 1), job(2, 1)], &mut g).len(), 1);
    assert!(
        engine
            .admit(Policy::SETTLE_S - 1.0, &[job(2, 1)], &mut g)
            .is_empty()
    );
    assert_eq!(
        engine.admit(Policy::SETTLE_S, &[job(2, 1)], &mut g).len(),
        1
    );
}

#[test]
fn no_gpu_takes_more_than_48_clients() {
    let mut g = gpus(1);
    busy(&mut g[0], 0, 0.0);
    g[0].jobs = MAX_MPS_CLIENTS;
    assert!(admit("ladle", &[job(1, 0)], &mut g).is_empty());
    g[0].jobs = MAX_MPS_CLIENTS - 1;
    assert_eq!(admit("ladle", &[job(1, 0)], &mut g).len(), 1);
}

#[test]
fn carma_does_not_pass_a_blocked_head_but_ladle_backfills_elsewhere() {
    // GPU 0 is nearly full, GPU 1 half full; a 25 GiB head fits nowhere yet.
    let mut base = gpus(2);
    busy(&mut base[0], 30, 0.2);
    busy(&mut base[1], 20, 0.2);
    let queue = [job(1, 25), job(2, 2)];
    assert!(admit("carma-most-free", &queue, &mut base.clone()).is_empty());
    let placed = admit("ladle", &queue, &mut base.clone());
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].job, 2);
    // Not on GPU 1, which has the most free memory: the head is waiting for it.
    assert_eq!(placed[0].gpus, vec![0]);
}

#[test]
fn backfill_stops_after_the_bypass_limit() {
    let mut g = gpus(2);
    busy(&mut g[0], 1, 0.1);
    busy(&mut g[1], 1, 0.1);
    let mut policy = Policy::named("ladle").unwrap();
    policy.settle_s = 0.0;
    policy.max_bypass = 2;
    let mut engine = Admission::new(policy);
    let head = Pending {
        gpus: 2,
        exclusive: true,
        ..job(1, 1)
    };
    let queue = [head, job(2, 0), job(3, 0), job(4, 0)];
    let placed = engine.admit(0.0, &queue, &mut g);
    assert!(placed.is_empty());
    // An exclusive two-GPU head holds both GPUs: nothing may pass it here.
    let mut g = gpus(3);
    for gpu in &mut g {
        busy(gpu, 1, 0.1);
    }
    let head = Pending {
        exclusive: true,
        ..job(1, 1)
    };
    let queue = [head, job(2, 0), job(3, 0), job(4, 0)];
    let placed = engine.admit(0.0, &queue, &mut g);
    assert_eq!(placed.iter().map(|p| p.job).collect::<Vec<_>>(), vec![2, 3]);
    let placed = engine.admit(
        1.0,
        &queue[..1]
            .iter()
            .chain(&queue[3..])
            .cloned()
            .collect::<Vec<_>>(),
        &mut g,
    );
    assert!(placed.is_empty(), "third bypass refused");
}

#[test]
fn reservations_count_jobs_that_have_not_allocated_yet() {
    let mut g = gpus(1);
    g[0].jobs = 1;
    g[0].reserved_mib = 30 * GIB; // admitted, telemetry still shows nothing
    let queue = [job(1, 10)];
    assert_eq!(admit("carma-most-free", &queue, &mut g.clone()).len(), 1);
    assert!(admit("ladle", &queue, &mut g).is_empty());
}

#[test]
fn ladle_caps_a_declared_job_at_the_room_its_gpu_had_for_it() {
    // Alone on a GPU: all of it but the reserve.
    let placed = admit("ladle", &[job(1, 6)], &mut gpus(1));
    assert_eq!(placed[0].mem_limit_mib, Some(40 * GIB - 512));
    // Beside a job using 10 GiB that reserved 12: what neither the use nor the
    // reservation of the neighbour takes, less the reserve.
    let mut g = gpus(1);
    busy(&mut g[0], 10, 0.2);
    g[0].reserved_mib = 12 * GIB;
    let placed = admit("ladle", &[job(2, 6)], &mut g);
    assert_eq!(placed[0].mem_limit_mib, Some(28 * GIB - 512));
    let placed = admit("carma-most-free", &[job(1, 6)], &mut gpus(1));
    assert_eq!(placed[0].mem_limit_mib, None);
}

#[test]
fn a_job_without_a_declared_estimate_is_never_given_a_limit_from_the_default_guess() {
    let guess = Pending {
        basis: Basis::Guess,
        ..job(1, 4)
    };
    let mut g = gpus(2);
    busy(&mut g[0], 4, 0.1);
    let placed = admit("ladle", std::slice::from_ref(&guess), &mut g);
    assert_eq!(placed[0].gpus, vec![1], "alone, on the idle GPU");
    assert_eq!(placed[0].mem_limit_mib, None);
    assert!(placed[0].until_measured && !placed[0].exclusive);
    // With no idle GPU it waits rather than share a GPU on a guess.
    busy(&mut g[1], 4, 0.1);
    assert!(admit("ladle", &[guess], &mut g).is_empty());
    // Measured, the same job packs, and may be capped.
    let measured = Pending {
        basis: Basis::Measured,
        ..job(1, 4)
    };
    let placed = admit("ladle", &[measured], &mut g);
    assert!(placed[0].mem_limit_mib.is_some());
}

#[test]
fn the_idle_path_screens_memory() {
    // No job of ours on the GPU, but telemetry shows 30 GiB in use (a job that just
    // ended, still freeing): a 20 GiB job does not go there, a 5 GiB job does.
    for name in Policy::NAMES {
        let mut g = gpus(1);
        g[0].used_mib = 30 * GIB;
        assert!(
            admit(name, &[job(1, 20)], &mut g.clone()).is_empty(),
            "{name}"
        );
        assert_eq!(admit(name, &[job(2, 5)], &mut g).len(), 1, "{name}");
    }
    // An estimate beyond the GPU still fits an empty one (it may use all of it).
    let huge = Pending {
        estimate_mib: 100 * GIB,
        ..job(3, 0)
    };
    assert_eq!(admit("ladle", &[huge], &mut gpus(1)).len(), 1);
}

#[test]
fn a_foreign_process_makes_a_gpu_not_idle() {
    let mut g = gpus(2);
    g[0].foreign_processes = 1;
    g[0].foreign_mib = 30 * GIB;
    g[0].used_mib = 30 * GIB;
    g[1].foreign_processes = 1;
    g[1].foreign_mib = 2 * GIB;
    g[1].used_mib = 2 * GIB;
    // Not idle: a retry (which needs an idle GPU) goes nowhere.
    let retry = Pending {
        exclusive: true,
        ..job(1, 1)
    };
    assert!(admit("ladle", &[retry], &mut g.clone()).is_empty());
    // A job goes through the screens, with the other user's memory counted.
    let placed = admit("ladle", &[job(2, 9)], &mut g.clone());
    assert_eq!(placed[0].gpus, vec![1]);
    assert!(admit("ladle", &[job(3, 9)], &mut g[..1].to_vec()).is_empty());
    // Reservations do not hide it: 2 GiB foreign + 30 GiB reserved leaves 8 GiB.
    g[1].reserved_mib = 30 * GIB;
    g[1].jobs = 1;
    assert!(admit("ladle", &[job(4, 7)], &mut g[1..].to_vec()).is_empty());
    assert_eq!(admit("ladle", &[job(5, 6)], &mut g[1..].to_vec()).len(), 1);
}

#[test]
fn a_job_confined_to_some_gpus_runs_only_there_and_waits_for_them() {
    let only = |set: &[usize]| Some(set.iter().copied().collect::<BTreeSet<usize>>());
    // GPUs 0 and 1 idle, 2 busy: a job confined to 2 and 3 goes to the idle 3.
    let mut g = gpus(4);
    busy(&mut g[2], 10, 0.3);
    let confined = Pending {
        only: only(&[2, 3]),
        ..job(1, 4)
    };
    assert_eq!(admit("ladle", &[confined], &mut g.clone())[0].gpus, vec![3]);
    // A two-GPU job confined to 1 and 3 gets exactly those.
    let pair = Pending {
        only: only(&[1, 3]),
        ..wide(2, 4)
    };
    assert_eq!(admit("ladle", &[pair], &mut g.clone())[0].gpus, vec![1, 3]);
    // Its only GPU unusable, it waits while every other GPU is idle.
    g[3].unusable = true;
    for policy in Policy::NAMES {
        let waiting = Pending {
            only: only(&[3]),
            ..job(3, 4)
        };
        assert!(
            admit(policy, &[waiting], &mut g.clone()).is_empty(),
            "{policy}"
        );
    }
    // Blocked at the head, it holds only GPUs it may use: backfill keeps the others.
    let head = Pending {
        only: only(&[3]),
        ..job(4, 4)
    };
    let placed = admit("ladle", &[head, job(5, 4)], &mut g.clone());
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].job, 5);
}

#[test]
fn count_foreign_counts_the_processes_that_are_not_ours_and_unknown_lists_as_foreign() {
    use crate::telemetry::{GpuProcess, GpuSample};
    let process = |pid, used_mib, name: &str| GpuProcess {
        pid,
        used_mib,
        compute: true,
        mps: false,
        name: Some(name.to_owned()),
        other_user: false,
    };
    let mut windows = GpuWindows::default();
    windows.push(GpuSample {
        memory_used_mib: 3000,
        memory_total_mib: 40 * GIB,
        gpu_processes: Some(vec![
            process(10, Some(1000), "python"),
            process(20, Some(2000), "python"),
            process(30, None, "other"),
            process(40, Some(500), "nvidia-cuda-mps"),
        ]),
        ..GpuSample::default()
    });
    let mut g = GpuState::default();
    g.count_foreign(&windows, |pid| pid == 10);
    assert_eq!((g.foreign_processes, g.foreign_mib), (2, 2000));
    // A failed process query: not known to be empty, so not idle.
    windows.push(GpuSample {
        memory_used_mib: 0,
        memory_total_mib: 40 * GIB,
        gpu_processes: None,
        ..GpuSample::default()
    });
    let mut g = GpuState::default();
    g.count_foreign(&windows, |_| false);
    assert_eq!(g.foreign_processes, 1);
    let mut g = GpuState::default();
    g.count_foreign(&GpuWindows::default(), |_| false);
    assert_eq!(g.foreign_processes, 1, "no sample yet");
}

#[test]
fn a_gpu_whose_window_is_not_full_takes_no_collocation() {
    let mut g = gpus(2);
    busy(&mut g[0], 1, 0.1);
    g[0].window_full = false;
    g[1].window_full = false;
    for name in Policy::NAMES {
        // The idle GPU may still take a job; the busy one takes none.
        let placed = admit(name, &[job(1, 1), job(2, 1)], &mut g.clone());
        assert_eq!(placed.len(), 1, "{name}");
        assert_eq!(placed[0].gpus, vec![1], "{name}");
    }
    let mut full = g.clone();
    full[0].window_full = true;
    assert_eq!(admit("ladle", &[job(1, 1), job(2, 1)], &mut full).len(), 2);
    // windows_full says whether the windows hold 30 samples.
    let mut windows = GpuWindows::default();
    let sample = crate::telemetry::GpuSample {
        memory_used_mib: 0,
        memory_total_mib: 40 * GIB,
        utilization: 0.0,
        sm_activity: Some(0.0),
        sm_occupancy: None,
        dram_bandwidth: None,
        processes: Vec::new(),
        ..crate::telemetry::GpuSample::default()
    };
    for i in 0..WINDOW {
        assert!(!windows_full(&windows), "{i} samples");
        windows.push(sample.clone());
    }
    assert!(windows_full(&windows));
}

#[test]
fn a_blocked_heads_gpus_stay_held_until_it_starts() {
    // A 25 GiB head fits nowhere; it waits for GPU 1 (most free memory). Later GPU 0
    // frees more memory than GPU 1, but backfill still stays off GPU 1 and uses GPU 0.
    let mut g = gpus(2);
    busy(&mut g[0], 30, 0.2);
    busy(&mut g[1], 20, 0.2);
    let mut engine = Admission::new(Policy::named("ladle").unwrap());
    let queue = [job(1, 25), job(2, 1)];
    let placed = engine.admit(100.0, &queue, &mut g.clone());
    assert_eq!((placed[0].job, &placed[0].gpus), (2, &vec![0]));
    let mut later = gpus(2);
    busy(&mut later[0], 14, 0.2);
    busy(&mut later[1], 20, 0.2);
    let placed = engine.admit(200.0, &queue, &mut later);
    assert_eq!(placed[0].job, 2);
    assert_eq!(placed[0].gpus, vec![0], "GPU 1 stays held for the head");
}

#[test]
fn an_idle_held_gpu_takes_a_backfill_that_leaves_room_for_the_head() {
    // A two-GPU job uses 17 GiB on GPUs 0 and 2; GPU 1 is idle. A two-GPU 26 GiB head
    // fits beside it nowhere: it holds GPU 1 (most free) and GPU 0.
    let mut g = gpus(3);
    busy(&mut g[0], 17, 0.6);
    busy(&mut g[2], 17, 0.6);
    // 10 GiB + 1 + 26 GiB + 1 ≤ 40 GiB − 0.5: the idle held GPU takes it.
    let queue = [wide(1, 26), job(2, 10), job(3, 10)];
    let mut engine = Admission::new(Policy::named("ladle").unwrap());
    let placed = engine.admit(100.0, &queue, &mut g);
    assert_eq!((placed[0].job, &placed[0].gpus), (2, &vec![1]));
    // No longer idle: the next one goes to the GPU that is not held.
    assert_eq!((placed[1].job, &placed[1].gpus), (3, &vec![2]));
    // 13 GiB would leave the head too little: not on the held GPU.
    let mut g = gpus(3);
    busy(&mut g[0], 17, 0.6);
    busy(&mut g[2], 17, 0.6);
    let placed = admit("ladle", &[wide(1, 26), job(2, 13)], &mut g);
    assert_eq!(placed[0].gpus, vec![2]);
    // A head that must run alone needs its GPUs idle: nothing goes there.
    let mut g = gpus(3);
    busy(&mut g[0], 17, 0.6);
    busy(&mut g[2], 17, 0.6);
    let retry = Pending {
        exclusive: true,
        ..wide(1, 4)
    };
    let placed = admit("ladle", &[retry, job(2, 2)], &mut g);
    assert_eq!(placed[0].gpus, vec![2]);
    // Without the rule (or under CARMA's rules, which do not backfill) it stays empty.
    let mut policy = Policy::named("ladle").unwrap();
    policy.backfill_idle_held = false;
    let mut g = gpus(3);
    busy(&mut g[0], 17, 0.6);
    busy(&mut g[2], 17, 0.6);
    let placed = Admission::new(policy).admit(100.0, &[wide(1, 26), job(2, 10)], &mut g);
    assert_eq!(placed[0].gpus, vec![2]);
}

fn wide(id: u64, gib: u64) -> Pending {
    Pending {
        gpus: 2,
        ..job(id, gib)
    }
}

#[test]
fn a_two_gpu_job_starts_ahead_of_the_queue_when_its_gpus_can_take_it() {
    // Two idle GPUs; a one-GPU job came first. In queue order it takes an idle GPU
    // (which then settles) and the two-GPU job waits; ladle starts the two-GPU job.
    let queue = [job(1, 8), wide(2, 8)];
    let placed = admit("ladle", &queue, &mut gpus(2));
    assert_eq!(placed.len(), 1);
    assert_eq!((placed[0].job, &placed[0].gpus), (2, &vec![0, 1]));
    let placed = admit("carma-least-util", &queue, &mut gpus(2));
    assert_eq!(placed.len(), 1);
    assert_eq!((placed[0].job, &placed[0].gpus), (1, &vec![0]));
}

#[test]
fn two_gpu_jobs_jump_a_blocked_head_only_within_its_bounds() {
    let mut policy = Policy::named("ladle").unwrap();
    policy.max_bypass = 1;
    let mut engine = Admission::new(policy);
    // 20 GiB used everywhere: the 30 GiB head fits nowhere; 4 GiB two-GPU jobs do.
    let mut g = gpus(3);
    for gpu in &mut g {
        busy(gpu, 20, 0.2);
    }
    let head = job(1, 30);
    let round = |engine: &mut Admission, g: &mut [GpuState], t: f64, id: u64| {
        let placed = engine.admit(t, &[head.clone(), wide(id, 4)], g);
        placed.iter().map(|p| p.job).collect::<Vec<_>>()
    };
    // Before the head is known to be blocked, and then once (max_bypass = 1).
    assert_eq!(round(&mut engine, &mut g, 100.0, 2), vec![2]);
    assert_eq!(round(&mut engine, &mut g, 200.0, 3), vec![3]);
    assert_eq!(round(&mut engine, &mut g, 300.0, 4), Vec::<u64>::new());
}

#[test]
fn light_jobs_go_first_within_a_blocked_heads_bounds() {
    let light = |id| Pending {
        estimate_mib: 512,
        ..job(id, 0)
    };
    // One idle GPU: the light job takes it ahead of the 8 GiB job that came first.
    let queue = [job(1, 8), light(2)];
    assert_eq!(admit("ladle", &queue, &mut gpus(1))[0].job, 2);
    assert_eq!(admit("carma-first-fit", &queue, &mut gpus(1))[0].job, 1);
    // Light jobs ahead of a head blocked in an earlier round count against its bounds;
    // once they are used up the head is first again, and nothing passes it.
    let mut policy = Policy::named("ladle").unwrap();
    policy.max_bypass = 1;
    let mut engine = Admission::new(policy);
    let mut g = gpus(1);
    busy(&mut g[0], 20, 0.2);
    let head = job(1, 30);
    let mut round = |t: f64, id: u64| {
        let placed = engine.admit(t, &[head.clone(), light(id)], &mut g);
        placed.iter().map(|p| p.job).collect::<Vec<_>>()
    };
    assert_eq!(round(100.0, 2), vec![2]);
    assert_eq!(round(200.0, 3), vec![3]);
    assert_eq!(round(300.0, 4), Vec::<u64>::new());
}

#[test]
fn a_blocked_head_holds_the_gpu_it_already_passes_before_those_with_more_memory() {
    // GPU 0 passes every screen for the two-GPU head; GPUs 1 and 2 have more free
    // memory but are saturated. The head waits for one of them, and holds GPU 0: a
    // one-GPU job may not take it (it would load the GPU the head already has).
    let mut g = gpus(3);
    busy(&mut g[0], 25, 0.3);
    busy(&mut g[1], 10, 0.95);
    busy(&mut g[2], 10, 0.95);
    let placed = admit("ladle", &[wide(1, 8), job(2, 4)], &mut g);
    assert!(placed.is_empty(), "{placed:?}");
    // Once a saturated GPU calms down, the head starts there beside GPU 0.
    g[2].risk.sm_activity = 0.3;
    g[2].risk.sm_occupancy = Some(0.15);
    let placed = admit("ladle", &[wide(1, 8), job(2, 4)], &mut g);
    assert_eq!((placed[0].job, &placed[0].gpus), (1, &vec![0, 2]));
}

#[test]
fn consumers_of_one_feed_are_placed_together() {
    let mut g = gpus(2);
    busy(&mut g[0], 10, 0.1);
    busy(&mut g[1], 5, 0.1);
    g[0].feeds.push("imagenet".to_owned());
    let queue = [Pending {
        feed: Some("imagenet".to_owned()),
        ..job(1, 1)
    }];
    assert_eq!(admit("ladle", &queue, &mut g.clone())[0].gpus, vec![0]);
    assert_eq!(admit("carma-most-free", &queue, &mut g)[0].gpus, vec![1]);
}

#[test]
fn a_consumer_joins_its_feed_rather_than_an_idle_gpu_while_the_screens_allow() {
    let mut g = gpus(2);
    busy(&mut g[0], 10, 0.3);
    g[0].feeds.push("imagenet".to_owned());
    let consumer = Pending {
        feed: Some("imagenet".to_owned()),
        ..job(1, 1)
    };
    assert_eq!(
        admit("ladle", std::slice::from_ref(&consumer), &mut g.clone())[0].gpus,
        vec![0]
    );
    // Without affinity the idle GPU goes first.
    assert_eq!(
        admit(
            "carma-least-util",
            std::slice::from_ref(&consumer),
            &mut g.clone()
        )[0]
        .gpus,
        vec![1]
    );
    // A saturated feed GPU fails the compute screen: the idle GPU is taken instead.
    busy(&mut g[0], 0, 0.95);
    assert_eq!(admit("ladle", &[consumer], &mut g)[0].gpus, vec![1]);
}

#[test]
fn an_out_of_memory_retry_waits_for_an_idle_gpu() {
    let mut g = gpus(2);
    busy(&mut g[0], 1, 0.1);
    let retry = Pending {
        exclusive: true,
        ..job(1, 4)
    };
    // CARMA: exclusive for its whole run. ladle: alone until measured.
    let placed = admit(
        "carma-most-free",
        std::slice::from_ref(&retry),
        &mut g.clone(),
    );
    assert!(placed[0].exclusive && !placed[0].until_measured);
    let placed = admit("ladle", &[retry.clone(), job(2, 2)], &mut g);
    assert_eq!(placed[0].gpus, vec![1]);
    assert!(placed[0].until_measured && !placed[0].exclusive);
    assert_eq!(placed[0].mem_limit_mib, None, "alone: uncapped");
    assert_eq!(g[1].unmeasured_jobs, 1);
    // Nobody joins it, even with room to spare.
    assert_eq!(placed[1].gpus, vec![0]);
    busy(&mut g[1], 0, 0.0);
    assert!(admit("ladle", &[retry], &mut g).is_empty());
}

#[test]
fn an_oom_retry_asks_for_its_observed_peak_and_others_join_it_once_measured() {
    // The retry of a job that peaked at 9 GiB asks for 1.1 × 9 GiB, measured.
    let retry = Pending {
        estimate_mib: crate::job::learned_estimate(9 * GIB),
        basis: Basis::Measured,
        exclusive: true,
        ..job(1, 0)
    };
    let mut g = gpus(1);
    let mut engine = Admission::new(Policy::named("ladle").unwrap());
    let placed = engine.admit(0.0, &[retry], &mut g);
    assert!(placed[0].until_measured);
    assert_eq!(g[0].reserved_mib, 9 * GIB + 922);
    g[0].used_mib = 9 * GIB;
    g[0].risk.sm_activity = 0.3;
    // Not yet measured: nobody joins.
    assert!(engine.admit(100.0, &[job(2, 4)], &mut g.clone()).is_empty());
    // Measured (the caller stops counting it as unmeasured): others join.
    g[0].unmeasured_jobs = 0;
    assert_eq!(engine.admit(100.0, &[job(2, 4)], &mut g).len(), 1);
}

#[test]
fn a_two_gpu_job_needs_two_gpus() {
    let mut g = gpus(2);
    busy(&mut g[0], 39, 0.1);
    let wide = Pending {
        gpus: 2,
        ..job(1, 4)
    };
    assert!(admit("carma-most-free", std::slice::from_ref(&wide), &mut g).is_empty());
    let placed = admit("carma-most-free", &[wide], &mut gpus(2));
    assert_eq!(placed[0].gpus, vec![0, 1]);
}

#[test]
fn a_job_estimating_u64_max_mib_is_never_placed_on_a_busy_gpu_by_any_policy() {
    let absurd = Pending {
        estimate_mib: u64::MAX,
        ..job(9, 0)
    };
    for name in Policy::NAMES {
        let mut g = gpus(2);
        busy(&mut g[0], 4, 0.1);
        busy(&mut g[1], 8, 0.1);
        let before = g.clone();
        let placed = admit(name, std::slice::from_ref(&absurd), &mut g);
        assert!(placed.is_empty(), "{name}: {placed:?}");
        assert_eq!(g, before, "{name}: nothing was reserved");
    }
}

#[test]
fn reservations_saturate_instead_of_wrapping() {
    // Alone on an idle GPU a job may use all of it, whatever it estimated; its
    // reservation then fills the GPU and nobody joins it.
    let mut g = gpus(1);
    let absurd = Pending {
        estimate_mib: u64::MAX,
        ..job(1, 0)
    };
    let mut engine = Admission::new(Policy::named("ladle").unwrap());
    assert_eq!(
        engine
            .admit(0.0, std::slice::from_ref(&absurd), &mut g)
            .len(),
        1
    );
    assert_eq!(g[0].reserved_mib, u64::MAX);
    assert!(engine.admit(1000.0, &[job(2, 1)], &mut g).is_empty());
    // A second huge reservation on the same GPU stays at the ceiling.
    let mut g = gpus(1);
    g[0].reserved_mib = u64::MAX - 1;
    engine.apply(0.0, &absurd, &placement(1, 0), &mut g);
    assert_eq!(g[0].reserved_mib, u64::MAX);
}

fn placement(job: u64, gpu: usize) -> Placement {
    Placement {
        job,
        gpus: vec![gpu],
        exclusive: false,
        until_measured: false,
        mem_limit_mib: None,
    }
}

#[test]
fn unusable_gpus_take_no_jobs() {
    let mut g = gpus(1);
    g[0].unusable = true;
    assert!(admit("exclusive", &[job(1, 1)], &mut g).is_empty());
}
