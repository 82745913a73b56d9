//! Arbitrary bytes as a CIFAR-10 batch `data_batch_1.bin` → `ladle_datasets::open`, then
//! read, label and process every record (at most 64). Errors are fine; panics are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch_dir("cifar_batch").join("data_batch_1.bin");
    std::fs::write(&path, data).expect("write the batch");
    if let Ok(dataset) = ladle_datasets::open(&path) {
        common::exercise(dataset.as_ref());
    }
});
