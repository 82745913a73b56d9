//! Admission behaviour written once over `dyn Telemetry` and run on every backend: the
//! simulated GPUs always, NVML when this machine has a driver (otherwise the backend must
//! fail with a typed error, which is checked instead).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use ladle_scheduler::estimate::Basis;
use ladle_scheduler::policy::{Admission, GpuState, Pending, Policy};
use ladle_scheduler::telemetry::{
    GpuWindows, NvmlTelemetry, SimGpus, SimLoad, Telemetry, TelemetryError,
};
use ladle_scheduler::window::WINDOW;

/// Samples every GPU a full window's worth of times (admission collocates nothing on a
/// GPU whose window is not full) and returns admission's view of them.
fn observe(backend: &mut dyn Telemetry) -> Vec<GpuState> {
    let infos = backend.gpus().to_vec();
    let mut windows = vec![GpuWindows::default(); infos.len()];
    for _ in 0..WINDOW {
        for (g, w) in windows.iter_mut().enumerate() {
            w.push(backend.sample(g).unwrap());
        }
    }
    infos
        .iter()
        .zip(&windows)
        .map(|(i, w)| GpuState::observed(i, w))
        .collect()
}

/// A one-GPU job that declares `estimate_mib`.
fn job(id: u64, estimate_mib: u64) -> Pending {
    Pending {
        id,
        estimate_mib,
        basis: Basis::Declared,
        gpus: 1,
        ..Pending::default()
    }
}

fn admission_behaves(backend: &mut dyn Telemetry) {
    let states = observe(backend);
    let usable: Vec<usize> = (0..states.len()).filter(|&i| !states[i].unusable).collect();

    // The baseline: one job per usable GPU, in FIFO order, never on an unusable GPU.
    let queue: Vec<Pending> = (1..=states.len() as u64 + 1).map(|i| job(i, 100)).collect();
    let placed =
        Admission::new(Policy::named("exclusive").unwrap()).admit(0.0, &queue, &mut states.clone());
    assert_eq!(placed.len(), usable.len());
    for (p, q) in placed.iter().zip(&queue) {
        assert_eq!(p.job, q.id, "FIFO");
        assert!(usable.contains(&p.gpus[0]));
    }

    // ladle: a small job lands on a usable GPU with an MPS limit of the room the GPU had
    // for it...
    let mut busy = states.clone();
    for s in &mut busy {
        s.jobs = 1; // every GPU already runs one of our jobs: no idle-GPU shortcut
        s.reserved_mib = s.used_mib;
    }
    let mut engine = Admission::new(Policy::named("ladle").unwrap());
    let small = engine.admit(0.0, &[job(1, 64)], &mut busy.clone());
    let margin = Policy::ladle().margin_mib;
    let room = |s: &GpuState| s.total_mib.saturating_sub(s.used_mib) >= 64 + margin + 512;
    if busy
        .iter()
        .any(|s| !s.unusable && room(s) && s.risk.sm_activity < 0.8)
    {
        assert_eq!(small.len(), 1);
        let g = small[0].gpus[0];
        assert!(usable.contains(&g));
        let free = busy[g].total_mib - busy[g].used_mib;
        assert_eq!(
            small[0].mem_limit_mib,
            Some(free - 512),
            "free less the reserve"
        );
    }
    // ...and a job larger than any GPU is never collocated.
    let largest = busy.iter().map(|s| s.total_mib).max().unwrap();
    assert!(engine.admit(0.0, &[job(2, largest)], &mut busy).is_empty());
}

#[test]
fn admission_behaves_on_simulated_gpus() {
    let mut sim = SimGpus::new(3, 40 * 1024);
    sim.place(
        0,
        1,
        SimLoad {
            mem_mib: 30 * 1024,
            sm: 0.9,
        },
    );
    sim.place(
        1,
        2,
        SimLoad {
            mem_mib: 2 * 1024,
            sm: 0.2,
        },
    );
    admission_behaves(&mut sim);
}

#[test]
fn admission_behaves_on_nvml_or_nvml_reports_a_typed_error() {
    match NvmlTelemetry::open() {
        Ok(mut nvml) => admission_behaves(&mut nvml),
        Err(e) => assert!(
            matches!(
                e,
                TelemetryError::NvmlUnavailable { .. } | TelemetryError::NoGpus
            ),
            "{e}"
        ),
    }
}
