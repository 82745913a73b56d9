use super::*;

#[test]
fn a_process_in_both_nvml_lists_is_merged_once_by_pid() {
    let compute = [
        RawProcess {
            pid: 7,
            used_mib: Some(1000),
        },
        RawProcess {
            pid: 3,
            used_mib: None,
        },
    ];
    let mps = [
        RawProcess {
            pid: 7,
            used_mib: Some(1200),
        },
        RawProcess {
            pid: 9,
            used_mib: Some(500),
        },
    ];
    let merged = merge_processes(&compute, &mps);
    let pids: Vec<u32> = merged.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [3, 7, 9]);
    assert_eq!(merged[0].used_mib, None, "unknown memory stays unknown");
    assert!(merged[1].compute && merged[1].mps);
    assert_eq!(merged[1].used_mib, Some(1200));
    assert!(!merged[2].compute && merged[2].mps);
}

fn process(pid: u32, used_mib: Option<u64>, name: Option<&str>) -> GpuProcess {
    GpuProcess {
        pid,
        used_mib,
        compute: true,
        mps: false,
        name: name.map(str::to_owned),
        other_user: false,
    }
}

#[test]
fn another_users_mps_server_is_foreign_and_ours_is_infrastructure() {
    let theirs = GpuProcess {
        other_user: true,
        ..process(50, Some(400), Some("nvidia-cuda-mps"))
    };
    assert!(theirs.is_other_users_mps_server());
    let sample = GpuSample {
        gpu_processes: Some(vec![
            process(40, Some(300), Some("nvidia-cuda-mps")),
            theirs,
        ]),
        ..GpuSample::default()
    };
    let foreign = sample.foreign(|_| false).unwrap();
    let pids: Vec<u32> = foreign.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [50]);
    assert_eq!(foreign.memory_mib, 400);
}

#[test]
fn foreign_use_counts_other_users_processes_and_leaves_out_ours_and_the_mps_server() {
    let sample = GpuSample {
        gpu_processes: Some(vec![
            process(10, Some(4000), Some("python")),
            process(20, Some(3000), Some("python")),
            process(30, None, Some("java")),
            process(40, Some(300), Some("nvidia-cuda-mps")),
        ]),
        ..GpuSample::default()
    };
    let foreign = sample.foreign(|pid| pid == 10).unwrap();
    let pids: Vec<u32> = foreign.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [20, 30]);
    assert_eq!(foreign.memory_mib, 3000);
    assert_eq!(foreign.memory_unknown, 1);
}

#[test]
fn unknown_processes_are_not_read_as_no_other_users() {
    let sample = GpuSample {
        gpu_processes: None,
        gaps: vec![SampleGap {
            call: "running_compute_processes".to_owned(),
            error: "Unknown Error".to_owned(),
        }],
        ..GpuSample::default()
    };
    assert!(!sample.processes_known());
    assert!(!sample.is_complete());
    assert_eq!(sample.foreign(|_| false), None);
    let none = GpuSample {
        gpu_processes: Some(Vec::new()),
        ..GpuSample::default()
    };
    assert_eq!(none.foreign(|_| false), Some(ForeignUse::default()));
}

#[test]
fn exclusive_process_needs_mps_to_collocate() {
    let without = collocation_note(Some(ComputeMode::ExclusiveProcess), false);
    assert!(!without.collocation);
    assert_eq!(without.max_jobs, Some(1));
    assert_eq!(without.level, NoteLevel::Warning);
    assert!(without.note.contains("without MPS"), "{}", without.note);
    let with = collocation_note(Some(ComputeMode::ExclusiveProcess), true);
    assert!(with.collocation);
    assert_eq!(with.max_jobs, None);
    assert_eq!(with.level, NoteLevel::Info);
}

#[test]
fn prohibited_and_exclusive_thread_take_no_jobs_with_or_without_mps() {
    for mode in [ComputeMode::Prohibited, ComputeMode::ExclusiveThread] {
        for mps in [false, true] {
            let note = collocation_note(Some(mode), mps);
            assert!(!note.collocation);
            assert_eq!(note.max_jobs, Some(0), "{mode} mps={mps}");
            assert!(note.note.contains(&mode.to_string()), "{}", note.note);
        }
    }
}

#[test]
fn default_mode_collocates_and_warns_without_mps() {
    let note = collocation_note(Some(ComputeMode::Default), false);
    assert!(note.collocation);
    assert_eq!(note.level, NoteLevel::Warning);
    assert_eq!(
        collocation_note(Some(ComputeMode::Default), true).level,
        NoteLevel::Info
    );
    let unknown = collocation_note(None, false);
    assert_eq!(unknown.level, NoteLevel::Warning);
    assert!(unknown.note.contains("unknown"), "{}", unknown.note);
}

#[test]
fn a_sample_without_occupancy_empties_the_window_so_the_risk_is_unknown() {
    let mut w = GpuWindows::default();
    for _ in 0..5 {
        w.push(GpuSample {
            utilization: 0.5,
            sm_activity: Some(0.5),
            sm_occupancy: Some(0.2),
            dram_bandwidth: Some(0.1),
            compute_source: ComputeSource::Dcgm,
            ..GpuSample::default()
        });
    }
    assert!(w.risk().sm_occupancy.is_some());
    w.push(GpuSample {
        utilization: 0.5,
        compute_source: ComputeSource::UtilizationOnly,
        ..GpuSample::default()
    });
    let risk = w.risk();
    assert_eq!(risk.sm_occupancy, None);
    assert_eq!(risk.dram_bandwidth, None);
}

#[test]
fn gpu_info_and_samples_from_an_older_daemon_still_parse() {
    let info: GpuInfo = serde_json::from_str(
        r#"{"index":0,"uuid":"GPU-x","name":"A100","memory_total_mib":40960,"unsuitable":[]}"#,
    )
    .unwrap();
    assert_eq!(info.compute_mode, None);
    assert_eq!(info.compute_source, ComputeSource::UtilizationOnly);
    let sample: GpuSample = serde_json::from_str(
        r#"{"memory_used_mib":1,"memory_total_mib":2,"utilization":0.1,"sm_activity":null,
               "sm_occupancy":null,"dram_bandwidth":null,"processes":[]}"#,
    )
    .unwrap();
    assert_eq!(sample.gpu_processes, None);
}

#[test]
fn gpus_without_gpm_judge_sm_activity_by_utilisation() {
    let mut w = GpuWindows::default();
    w.push(GpuSample {
        utilization: 0.7,
        ..GpuSample::default()
    });
    let risk = w.risk();
    assert!((risk.sm_activity - 0.7).abs() < 1e-12);
    assert_eq!(risk.sm_occupancy, None);
}
