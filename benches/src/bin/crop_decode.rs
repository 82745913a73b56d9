//! Crop-aware decode against whole-image decode, per step, on a directory of JPEGs; single
//! thread, files in memory, RandomResizedCrop(224) + RandomHorizontalFlip into a reused
//! buffer. `benches/python/crop_decode.py` runs it beside Pillow in one invocation.
//!
//! ```text
//! crop_decode DIR [--rounds 3] [--passes 20]
//! ```
//!
//! Checks first that both paths give byte-identical samples; then, each round, times every
//! step over `passes` passes of the files, and prints one JSON object per round with the
//! µs per sample of each step (thread CPU time).

use std::error::Error;
use std::path::PathBuf;

use ladle_datasets::decode::Decoder;
use ladle_datasets::transforms::{Transformer, Transforms};

/// This thread's CPU time in seconds.
fn cpu_s() -> f64 {
    ladle_os::clock::thread_cpu().as_secs_f64()
}

/// µs of CPU per file for `passes` passes of `step` over `files`.
fn time(files: &[Vec<u8>], passes: u64, mut step: impl FnMut(u64, &[u8])) -> f64 {
    let start = cpu_s();
    for pass in 0..passes {
        for (i, f) in files.iter().enumerate() {
            step(pass * files.len() as u64 + i as u64, f);
        }
    }
    (cpu_s() - start) * 1e6 / (passes * files.len() as u64) as f64
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let (mut rounds, mut passes) = (3u64, 20u64);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().ok_or("--rounds N")?.parse()?,
            "--passes" => passes = args.next().ok_or("--passes N")?.parse()?,
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let dir = dir.ok_or("usage: crop_decode DIR [--rounds N] [--passes N]")?;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jpg" || e == "jpeg"))
        .collect();
    paths.sort();
    let files: Vec<Vec<u8>> = paths.iter().map(std::fs::read).collect::<Result<_, _>>()?;
    if files.is_empty() {
        return Err(format!("no .jpg files in {}", dir.display()).into());
    }
    let transforms = Transforms::train(224);
    let mut out = vec![0u8; transforms.output_len()];
    let mut check = vec![0u8; transforms.output_len()];
    let mut decoder = Decoder::new();
    let mut t = Transformer::new(transforms);
    let seed = 0;

    // Correctness first: the two paths give the same bytes, and how many rows were decoded.
    let (mut rows, mut full_rows) = (0u64, 0u64);
    for pass in 0..passes.min(5) {
        for (i, f) in files.iter().enumerate() {
            let index = pass * files.len() as u64 + i as u64;
            let img = decoder.decode(f)?;
            t.apply(img, seed, 0, index, &mut check)?;
            let part = decoder.decode_rows(f, |w, h| t.rows_needed(w, h, seed, 0, index))?;
            rows += u64::from(part.image.height);
            full_rows += u64::from(part.full_height);
            t.apply_rows(part, seed, 0, index, &mut out)?;
            if out != check {
                return Err(format!("{}: the paths differ", paths[i].display()).into());
            }
        }
    }
    eprintln!(
        "{} files, identical outputs; crop-aware decode decodes {:.1}% of the rows",
        files.len(),
        100.0 * rows as f64 / full_rows as f64
    );

    for round in 0..rounds {
        let decode_whole = time(&files, passes, |_, f| {
            std::hint::black_box(decoder.decode(f).map(|i| i.pixels[0]).ok());
        });
        let decode_rows = time(&files, passes, |i, f| {
            let part = decoder.decode_rows(f, |w, h| t.rows_needed(w, h, seed, 0, i));
            std::hint::black_box(part.map(|p| p.image.pixels[0]).ok());
        });
        let whole = time(&files, passes, |i, f| {
            let img = decoder.decode(f).expect("decode");
            t.apply(img, seed, 0, i, &mut out).expect("augment");
        });
        let crop_aware = time(&files, passes, |i, f| {
            let part = decoder
                .decode_rows(f, |w, h| t.rows_needed(w, h, seed, 0, i))
                .expect("decode");
            t.apply_rows(part, seed, 0, i, &mut out).expect("augment");
        });
        println!(
            "{}",
            serde_json::json!({
                "round": round,
                "files": files.len(),
                "us_decode_whole": decode_whole,
                "us_decode_rows": decode_rows,
                "us_whole_rrc_flip": whole,
                "us_crop_aware_rrc_flip": crop_aware,
            })
        );
    }
    Ok(())
}
