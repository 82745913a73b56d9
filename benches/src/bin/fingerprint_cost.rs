//! What a dataset's fingerprint (a `stat` per ImageFolder file, `datasets/src/fingerprint.rs`)
//! adds to a feed's start, against the walk that indexes the folder, side by side in one
//! invocation.
//!
//! ```text
//! fingerprint_cost [--files 200000] [--classes 1000] [--rounds 3] [--cold] [DIR]
//! ```
//!
//! Without `DIR`, builds an ImageFolder of `files` small JPEGs, each its own file, in
//! `classes` class folders under `$TMPDIR`. Each round times `ladle_datasets::open` (the walk: a `readdir` per folder, names
//! sorted) and then `Dataset::fingerprint` on the opened dataset; prints one JSON object per
//! round and the medians. With `--cold` (root), the page cache, dentries and inodes are
//! dropped before each round (`/proc/sys/vm/drop_caches`), as at a node's first start;
//! otherwise they are warm after the first round. On a network file system each `stat` is a
//! round trip, which the fingerprint spreads over up to 8 threads.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

fn arg(args: &[String], name: &str, default: u64) -> Result<u64, Box<dyn Error>> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or(format!("{name} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let files = arg(&args, "--files", 200_000)?;
    let classes = arg(&args, "--classes", 1000)?.max(1);
    let rounds = arg(&args, "--rounds", 3)?.max(1);
    let given = args
        .iter()
        .enumerate()
        .find(|(i, a)| {
            !a.starts_with("--")
                && (*i == 0 || !args[i - 1].starts_with("--") || args[i - 1] == "--cold")
        })
        .map(|(_, a)| PathBuf::from(a));
    let built = tempfile::tempdir()?;
    let root = match given {
        Some(dir) => dir,
        None => {
            let root = built.path().join("data");
            let mut jpeg = Vec::new();
            ladle_datasets::synth::encode(
                &[100u8; 32 * 32 * 3],
                32,
                32,
                ladle_datasets::synth::Encoding::Baseline420,
                90,
                &mut jpeg,
            )?;
            // Distinct files (a cold `stat` of a hard link to an inode already read costs
            // nothing, which would flatter the fingerprint).
            for c in 0..classes {
                std::fs::create_dir_all(root.join(format!("n{c:08}")))?;
            }
            for i in 0..files {
                let class = root.join(format!("n{:08}", i % classes));
                std::fs::write(class.join(format!("img_{i:08}.JPEG")), &jpeg)?;
            }
            root
        }
    };
    let (mut opens, mut prints) = (Vec::new(), Vec::new());
    let cold = args.iter().any(|a| a == "--cold");
    for round in 0..rounds {
        if cold {
            rustix::fs::sync();
            std::fs::write("/proc/sys/vm/drop_caches", "3")
                .map_err(|e| format!("--cold needs root (/proc/sys/vm/drop_caches): {e}"))?;
        }
        let started = Instant::now();
        let dataset = ladle_datasets::open(&root)?;
        let open_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let fingerprint = dataset.fingerprint();
        let print_s = started.elapsed().as_secs_f64();
        println!(
            "{{\"round\": {round}, \"samples\": {}, \"open_s\": {open_s:.4}, \"fingerprint_s\": {print_s:.4}, \"files\": \"{}\"}}",
            dataset.len(),
            fingerprint.files
        );
        opens.push(open_s);
        prints.push(print_s);
    }
    let (open, print) = (median(opens), median(prints));
    println!(
        "{{\"median_open_s\": {open:.4}, \"median_fingerprint_s\": {print:.4}, \"fingerprint_over_open\": {:.3}, \"threads\": {}, \"cold\": {cold}}}",
        print / open,
        std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
    );
    Ok(())
}
