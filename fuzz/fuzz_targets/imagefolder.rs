//! Arbitrary bytes as the one image `root/class/sample.jpg` of an ImageFolder →
//! `ladle_datasets::open(root)`, then read, label and process it. Errors are fine; panics
//! are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let root = common::scratch_dir("imagefolder").join("root");
    let class = root.join("class");
    std::fs::create_dir_all(&class).expect("create the class directory");
    std::fs::write(class.join("sample.jpg"), data).expect("write the image");
    if let Ok(dataset) = ladle_datasets::open(&root) {
        common::exercise(dataset.as_ref());
    }
});
