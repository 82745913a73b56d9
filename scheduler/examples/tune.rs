use ladle_scheduler::policy::Policy;
use ladle_scheduler::sim::generate::{GenerateConfig, generate};
use ladle_scheduler::sim::{SimConfig, simulate};

fn main() {
    let scale: f64 = std::env::var("SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let config = SimConfig { estimate_scale: scale, ..SimConfig::default() };
    let variants: Vec<(String, Policy)> = variants();
    let traces: Vec<_> = (1..=10).map(|seed| generate(&GenerateConfig { jobs: 60, seed, mean_gap_s: 60.0 })).collect();
    let carma: Vec<(f64, f64, u32)> = traces.iter().map(|t| {
        ["carma-most-free","carma-least-util","carma-first-fit","carma-best-fit"].iter().map(|n| {
            let r = simulate(t, Policy::named(n).unwrap(), &config).unwrap();
            (r.makespan_s, r.mean_jct_s, r.oom_crashes)
        }).fold((f64::INFINITY, 0.0, 0), |a, b| if b.0 < a.0 { b } else { a })
    }).collect();
    for (name, p) in variants {
        let mut ms = Vec::new(); let mut js = Vec::new(); let mut ooms = 0; let mut cooms = 0;
        for (t, c) in traces.iter().zip(&carma) {
            let r = simulate(t, p.clone(), &config).unwrap();
            ms.push(r.makespan_s / c.0); js.push(r.mean_jct_s / c.1); ooms += r.oom_crashes; cooms += c.2;
        }
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        let max = ms.iter().cloned().fold(0.0, f64::max);
        let jmax = js.iter().cloned().fold(0.0, f64::max);
        println!("{name:<40} mean {mean:.3} max {max:.3} jctmax {jmax:.3} ooms {ooms}/{cooms}  {}", ms.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(" "));
    }
}

fn variants() -> Vec<(String, Policy)> {
    use ladle_scheduler::policy::{ComputeScreen, GpuOrdering};
    let mut v = Vec::new();
    let base = Policy::ladle();
    v.push(("ladle".to_owned(), base.clone()));
    let mut p = base.clone(); p.sticky_hold = false; v.push(("not sticky".into(), p));
    for o in [GpuOrdering::MostFreeMemory, GpuOrdering::FirstFit, GpuOrdering::BestFit] {
        let mut p = base.clone(); p.ordering = o; v.push((format!("{o:?}"), p));
    }
    v
}
