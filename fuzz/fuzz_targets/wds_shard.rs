//! Arbitrary bytes as a WebDataset shard `x.tar` → `ladle_datasets::open`, then read, label
//! and process every sample (at most 64). Errors are fine; panics are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch_dir("wds_shard").join("x.tar");
    std::fs::write(&path, data).expect("write the shard");
    if let Ok(dataset) = ladle_datasets::open(&path) {
        common::exercise(dataset.as_ref());
    }
});
