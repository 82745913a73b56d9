//! A DDP group over the two nodes of a real Slurm cluster (`ladle_tests::slurm`): ranks
//! started by `srun` learn their place from Slurm's variables, each joins its node's feed of
//! the data by name, each node's feed waits for its own ranks and decodes their shares only.
//! Skips (saying why) where the cluster cannot run.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ladle_tests::ladle_bin;
use ladle_tests::slurm::Cluster;
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(300);

/// Samples in the dataset, epochs each consumer reads.
const N: u64 = 400;
const EPOCHS: u64 = 4;

/// The feed's identity and its size when a consumer starts it (every consumer says the same,
/// so that all of a node's consumers join one feed).
const FEED: &str = "--image-size 16 --ring-mib 8 --threads 1 --idle-timeout 600";

/// Indices an epoch delivered, from `--record-indices` files: `[rank][epoch]`.
fn recorded(path: &Path) -> BTreeMap<u64, Vec<u64>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            let indices = v["indices"].as_array().unwrap();
            (
                v["epoch"].as_u64().unwrap(),
                indices.iter().map(|i| i.as_u64().unwrap()).collect(),
            )
        })
        .collect()
}

/// `ladle feeds ARGS` against node `node`'s registry.
fn feeds(registry: &Path, node: &str, args: &[&str]) -> String {
    let out = Command::new(ladle_bin())
        .args(["feeds"])
        .args(args)
        .env("LADLE_REGISTRY_DIR", registry.join(format!("node-{node}")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn two_nodes_of_two_ranks_decode_their_shares_beside_a_whole_consumer() {
    let Some(cluster) = Cluster::shared() else {
        return;
    };
    let _serial = cluster.lock();
    let work = cluster.submit_dir().join("ddp");
    std::fs::create_dir_all(&work).unwrap();
    let data = work.join("data");
    let done = Command::new(ladle_bin())
        .args(["dataset", "generate", "--format", "imagefolder", "--count"])
        .arg(N.to_string())
        .args(["--width", "24", "--height", "20", "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    // Each node's registry under this runtime directory (`node-n1`, `node-n2`: the fake nodes
    // share /tmp, as nodes of a site may).
    let runtime = cluster.dir().join("ddp-runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let ladle = ladle_bin().display().to_string();
    let data = data.display().to_string();
    let out = work.display().to_string();
    // Two tasks per node, their ranks, world size and local world size from Slurm's variables
    // only; beside them, on n1, a consumer of whole epochs of the same feed.
    let runtime_dir = runtime.display().to_string();
    let script = format!(
        "#!/bin/sh\n\
         export XDG_RUNTIME_DIR={runtime_dir}\n\
         unset LADLE_REGISTRY_DIR\n\
         srun --overlap -N1 -n1 -w n1 {ladle} consume --dataset {data} {FEED} --batch-size 16 \
             --epochs {EPOCHS} --json > {out}/whole.json &\n\
         srun --overlap -n 4 --ntasks-per-node=2 sh -c 'exec {ladle} consume --dataset {data} \
             {FEED} --group ddp --batch-size 10 --epochs {EPOCHS} --json \
             --record-indices {out}/rank.$SLURM_PROCID > {out}/rank.$SLURM_PROCID.json'\n\
         ranks=$?\n\
         wait $!\n\
         whole=$?\n\
         echo \"ranks $ranks whole $whole\"\n"
    );
    let output = work.join("job.out").display().to_string();
    let job = cluster
        .sbatch(
            &["-N2", "--ntasks-per-node=2", "--output", &output],
            &script,
        )
        .unwrap();
    let state = cluster.wait_job_end(job, GUARD).unwrap();
    let log = std::fs::read_to_string(&output).unwrap_or_default();
    assert_eq!(state, "COMPLETED", "{log}");
    assert!(log.contains("ranks 0 whole 0"), "{log}");
    let registry = runtime.join("ladle");
    // Each epoch, the four ranks' shares together are the epoch, each index once.
    let ranks: Vec<BTreeMap<u64, Vec<u64>>> = (0..4)
        .map(|r| recorded(&work.join(format!("rank.{r}"))))
        .collect();
    for epoch in 0..EPOCHS {
        let mut all: Vec<u64> = ranks.iter().flat_map(|r| r[&epoch].clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..N).collect::<Vec<_>>(), "epoch {epoch}");
    }
    // The whole consumer's epochs are exact.
    let whole = std::fs::read_to_string(work.join("whole.json")).unwrap();
    let epochs: Vec<Value> = whole
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("epoch").is_some())
        .collect();
    assert_eq!(epochs.len() as u64, EPOCHS, "{whole}");
    assert!(
        epochs.iter().all(|e| e["exact_coverage"] == true),
        "{whole}"
    );
    // n2's feed served ranks 2 and 3 only: about half of each epoch (the feed's counters).
    let listed = feeds(&registry, "n2", &["ls", "--json"]);
    let feed: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    let socket = feed["socket"].as_str().unwrap();
    let stats = ladle_ring::protocol::feed_stats(Path::new(socket), GUARD).unwrap();
    eprintln!(
        "n2's feed: {} decoded, {} holes, for {EPOCHS} epochs of {N}",
        stats.published, stats.holes
    );
    assert!(
        stats.published * 100 <= 55 * N * EPOCHS,
        "n2 decoded {} for {EPOCHS} epochs of {N}",
        stats.published
    );
    for node in ["n1", "n2"] {
        feeds(&registry, node, &["stop", "--all"]);
    }
}
