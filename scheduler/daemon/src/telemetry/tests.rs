//! The behaviour every telemetry backend shows, written once over `dyn Telemetry` and run on
//! each: the simulated one (`ladle-scheduler-core`) and NVML (this crate).

use super::*;

/// Behaviour every backend shows, written once over `dyn Telemetry` and run on each backend.
fn conforms(backend: &mut dyn Telemetry) {
    let gpus = backend.gpus().to_vec();
    assert!(!gpus.is_empty());
    let mut uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), gpus.len(), "UUIDs are unique");
    for (i, info) in gpus.iter().enumerate() {
        assert!(info.uuid.starts_with("GPU-"), "{}", info.uuid);
        let s = backend.sample(i).unwrap();
        assert_eq!(s.memory_total_mib, info.memory_total_mib);
        assert!(s.memory_used_mib <= s.memory_total_mib);
        assert!((0.0..=1.0).contains(&s.utilization));
        if s.is_complete() {
            assert!(s.processes_known(), "a complete sample knows its processes");
        }
        assert_eq!(
            s.compute_source == ComputeSource::UtilizationOnly,
            s.sm_occupancy.is_none() || s.dram_bandwidth.is_none(),
            "the source says whether the compute metrics are there"
        );
        for x in [s.sm_activity, s.sm_occupancy, s.dram_bandwidth]
            .into_iter()
            .flatten()
        {
            assert!((0.0..=1.0).contains(&x));
        }
        let mut windows = GpuWindows::default();
        for _ in 0..3 {
            windows.push(backend.sample(i).unwrap());
        }
        assert_eq!(windows.sm_activity.len(), 3);
    }
    assert!(matches!(
        backend.sample(gpus.len()),
        Err(TelemetryError::NoSuchGpu { .. })
    ));
}

#[test]
fn the_simulated_backend_conforms() {
    let mut sim = SimGpus::new(2, 40 * 1024);
    sim.place(
        0,
        1,
        SimLoad {
            mem_mib: 1000,
            sm: 0.3,
        },
    );
    conforms(&mut sim);
}

#[test]
fn the_simulated_backend_conforms_with_foreign_processes_and_no_gpm() {
    let mut sim = SimGpus::new(2, 40 * 1024);
    let scenario = SimScenario::from_json(
        r#"{"gpus": [{"gpu": 1, "compute_source": "utilization_only",
                 "compute_mode": "exclusive_process",
                 "foreign": [{"pid": 4242, "mem_mib": 8000, "mps_only": true}]}]}"#,
    )
    .unwrap();
    sim.apply(&scenario).unwrap();
    conforms(&mut sim);
}

#[test]
fn the_nvml_backend_conforms_or_reports_a_typed_error_without_a_gpu() {
    match NvmlTelemetry::open() {
        Ok(mut nvml) => conforms(&mut nvml),
        Err(e) => assert!(
            matches!(
                e,
                TelemetryError::NvmlUnavailable { .. } | TelemetryError::NoGpus
            ),
            "{e}"
        ),
    }
}
